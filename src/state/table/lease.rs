//! The lease transitions of [`SlotTable`]: taking batches out of the ready indexes in the
//! RPC's selection order, finishing, releasing and expiring leases, and counting parked
//! getters.

use super::SlotTable;
use crate::rpc_defs::{KeySet, Selection};
use crate::state::leases::{Lease, LeaseId};
use crate::state::prefetch::prefetch;
use crate::state::ready::ReadyIndex;
use crate::state::select::{choose, draw_seed, policy_seed, sample_ranks, Candidate, Rng};
use crate::state::slot::{LeaseEnd, LeaseGone, Wake};
use std::time::Instant;

impl SlotTable {
    // ----- leases ------------------------------------------------------------------

    /// Number of samples eligible for RPC `r` right now.
    pub(crate) fn eligible(&self, r: usize) -> usize {
        self.ready.get(r).map_or(0, ReadyIndex::len)
    }

    /// Leases exactly `n_seqs` eligible samples to RPC `r` in its selection order, or
    /// returns `None` (changing nothing) when fewer are eligible. `now` is needed only when
    /// the RPC has a lease timeout.
    #[cfg(test)]
    pub(crate) fn try_lease(&mut self, r: usize, now: Option<Instant>) -> Option<LeaseId> {
        self.try_lease_with(r, now, None)
    }

    /// [`Self::try_lease`] for batch number `step` (which seeds randomised selection; the
    /// RPC's count of leases when `None`).
    pub(crate) fn try_lease_with(
        &mut self,
        r: usize,
        now: Option<Instant>,
        step: Option<u64>,
    ) -> Option<LeaseId> {
        let spec = self.rpcs.get(r)?;
        let n = spec.n_seqs;
        // A timeout too large to represent as an instant means no deadline.
        let deadline = spec
            .lease_timeout
            .and_then(|t| crate::deadline::after(now?, t));
        if self.ready.get(r)?.len() < n {
            return None;
        }
        if self.rate[r].is_some() {
            self.admit_lease(r, n)?;
        }
        let draw = step.unwrap_or(self.draws[r]);
        self.draws[r] += 1;
        let slots = match &self.rpcs[r].selection {
            Selection::Fifo | Selection::Lifo => self.ready[r].take(n),
            // Weights that depend on the age rank only: draw ranks, then fetch those (each
            // O(log n) in the ranked index).
            selection @ (Selection::Uniform { .. } | Selection::Recency { .. }) => {
                let seed = draw_seed(policy_seed(selection), draw);
                let ranks = sample_ranks(selection, self.ready[r].len(), n, seed);
                // The index of these policies is always ranked (`Table::new`).
                match self.ready[r].take_ranks(&ranks) {
                    Some(slots) => slots,
                    None => self.ready[r].take(n),
                }
            }
            // Successive weighted draws in the ranked index, O(log n) each.
            selection @ Selection::Prioritized { .. } => {
                let mut rng = Rng::new(draw_seed(policy_seed(selection), draw));
                match self.ready[r].take_weighted(n, &mut rng) {
                    Some(slots) => slots,
                    None => self.ready[r].take(n),
                }
            }
            // `OnPolicyFraction` splits by version first: one pass over the eligible.
            selection => {
                let candidates: Vec<Candidate> = self.ready[r]
                    .iter()
                    .map(|s| Candidate {
                        slot: s,
                        version: self.freshness.versions[s as usize],
                        log_priority: self.ln_priority(s as usize, r),
                    })
                    .collect();
                let seed = draw_seed(policy_seed(selection), draw);
                let picks = choose(selection, &candidates, n, self.freshness.current, seed);
                let slots: Vec<u32> = picks.iter().map(|&i| candidates[i].slot).collect();
                for &s in &slots {
                    self.ready[r].remove(self.slots[s as usize].order);
                }
                slots
            }
        };
        Some(self.grant(r, slots, deadline))
    }

    /// Whether RPC `r`'s rate limiter lets a lease of `n` through now; counts it (a sample
    /// taken, or a getter held) either way.
    fn admit_lease(&mut self, r: usize, n: usize) -> Option<()> {
        let size = self.len();
        let limiter = self.rate.get_mut(r)?.as_mut()?;
        if !limiter.can_sample(n, size) {
            limiter.held_gets += 1;
            return None;
        }
        limiter.samples += n as u64;
        // Putters held by this limiter may fit now.
        self.deferred.space = true;
        Some(())
    }

    /// Leases exactly `slots` to RPC `r` if every one of them is eligible for it now (the
    /// replay of a logged batch); `None`, changing nothing, otherwise.
    pub(crate) fn try_lease_slots(
        &mut self,
        r: usize,
        slots: &[u32],
        now: Option<Instant>,
    ) -> Option<LeaseId> {
        let spec = self.rpcs.get(r)?;
        let deadline = spec
            .lease_timeout
            .and_then(|t| crate::deadline::after(now?, t));
        let mut distinct = slots.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let all_ready = distinct.len() == slots.len()
            && slots.iter().all(|&s| {
                self.slots
                    .get(s as usize)
                    .is_some_and(|m| m.in_ready.contains(r))
            });
        if !all_ready {
            return None;
        }
        for &s in slots {
            self.ready[r].remove(self.slots[s as usize].order);
        }
        Some(self.grant(r, slots.to_vec(), deadline))
    }

    /// Loads every slot's line first: in a large, cold table these misses then overlap
    /// instead of each waiting behind the previous slot's update.
    fn prefetch_slot_lines(&self, slots: &[u32]) {
        let warm = slots.iter().fold(0u32, |acc, &s| {
            acc ^ self.slots.get(s as usize).map_or(0, |m| m.reads_total)
        });
        std::hint::black_box(warm);
    }

    /// Marks `slots` (just taken out of RPC `r`'s ready index) leased by a new lease.
    fn grant(&mut self, r: usize, slots: Vec<u32>, deadline: Option<Instant>) -> LeaseId {
        self.prefetch_slot_lines(&slots);
        for &s in &slots {
            let s = s as usize;
            if self.budget.evict {
                self.budget.evictable.remove(&self.slots[s].order);
            }
            self.slots[s].in_ready.remove(r);
            if self.slots[s].lease_bits.is_empty() {
                self.reading.set(s);
                self.idle.clear(s);
            }
            self.slots[s].lease_bits.insert(r);
            self.sync_spillable(s);
        }
        self.leased[r] += slots.len();
        self.leases.insert(Lease {
            rpc: r,
            slots,
            deadline,
        })
    }

    /// The live lease `id`, or why it is gone. A lease whose deadline has passed at `now`
    /// counts as expired even before [`Self::expire_due`] reclaims it.
    pub(crate) fn lease(&self, id: LeaseId, now: Option<Instant>) -> Result<&Lease, LeaseGone> {
        let lease = self.leases.get(id).ok_or(LeaseGone::Expired)?;
        match (lease.deadline, now) {
            (Some(deadline), Some(now)) if now >= deadline => Err(LeaseGone::Expired),
            _ => Ok(lease),
        }
    }

    /// Ends a live lease. With [`LeaseEnd::Used`] one read of each sample is used and
    /// `added[i]` (the RPC's outputs) joins slot `i`'s keys in the same step, so no other RPC
    /// can see the read without the outputs. Freed slots are appended to `freed`.
    pub(crate) fn finish_lease(
        &mut self,
        id: LeaseId,
        end: LeaseEnd,
        added: &[KeySet],
        freed: &mut Vec<u32>,
    ) -> Wake {
        self.end_lease(id, |_| end, added, freed)
    }

    /// Ends a live lease sample by sample: the lease's `i`-th slot is discarded where
    /// `discard[i]` holds ([`LeaseEnd::Discarded`]) and released otherwise
    /// ([`LeaseEnd::Released`]), for a consumer that found some of its samples unusable.
    pub(crate) fn finish_lease_discarding(
        &mut self,
        id: LeaseId,
        discard: &[bool],
        freed: &mut Vec<u32>,
    ) -> Wake {
        let end = |i: usize| match discard.get(i) {
            Some(true) => LeaseEnd::Discarded,
            _ => LeaseEnd::Released,
        };
        self.end_lease(id, end, &[], freed)
    }

    /// [`Self::finish_lease`] with the lease's `i`-th slot ended as `end(i)` says.
    fn end_lease(
        &mut self,
        id: LeaseId,
        end: impl Fn(usize) -> LeaseEnd,
        added: &[KeySet],
        freed: &mut Vec<u32>,
    ) -> Wake {
        let Some(lease) = self.leases.remove(id) else {
            return Wake::default();
        };
        let r = lease.rpc;
        let n_rpcs = self.rpcs.len();
        let mut wake = Wake::default();
        self.prefetch_finish_lines(r, &lease.slots);
        for (i, &s) in lease.slots.iter().enumerate() {
            let s = s as usize;
            debug_assert!(self.slots[s].lease_bits.contains(r));
            self.slots[s].lease_bits.remove(r);
            if self.slots[s].lease_bits.is_empty() {
                self.reading.clear(s);
                if self.slots[s].amenders == 0 {
                    self.idle.set(s);
                }
            }
            match end(i) {
                LeaseEnd::Discarded => self.discarded.set(s),
                LeaseEnd::Used => {
                    self.reads_left[s * n_rpcs + r] -= 1;
                    self.slots[s].reads_total -= 1;
                    self.slots[s].keys = self.slots[s]
                        .keys
                        .union(added.get(i).copied().unwrap_or_default());
                    self.totals.reads[r] += 1;
                }
                LeaseEnd::Released => self.totals.redelivered[r] += 1,
            }
            wake.merge(self.settle(s, freed));
        }
        self.leased[r] -= lease.slots.len();
        self.deliverable(wake)
    }

    /// Requests at once every line [`Self::finish_lease`]'s loop touches per slot of a
    /// lease of RPC `r` (see [`Self::prefetch_slot_lines`]).
    fn prefetch_finish_lines(&self, r: usize, slots: &[u32]) {
        let n_rpcs = self.rpcs.len();
        for &s in slots {
            let s = s as usize;
            prefetch(&self.slots[s]);
            prefetch(&self.reads_left[s * n_rpcs + r]);
            if let Some(ln_weight) = self.ln_priority.get(r).and_then(|v| v.get(s)) {
                prefetch(ln_weight);
            }
        }
        self.ready[r].prefetch_returns(slots);
    }

    /// The earliest lease deadline or age deadline, if any.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match (self.leases.next_deadline(), self.freshness.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Releases every lease whose deadline is at or before `now`; each released lease's
    /// RPC and slots are appended to `expired` (for the log).
    pub(crate) fn expire_due(
        &mut self,
        now: Instant,
        freed: &mut Vec<u32>,
        expired: &mut Vec<(usize, Vec<u32>)>,
    ) -> Wake {
        let mut wake = Wake::default();
        while let Some(id) = self.leases.pop_due(now) {
            if let Some(lease) = self.leases.get(id) {
                let r = lease.rpc;
                self.totals.expired_leases[r] += 1;
                // Logged by whoever notifies, after the lock (see `Wake::expired_samples`).
                wake.expired_samples = wake
                    .expired_samples
                    .saturating_add(u32::try_from(lease.slots.len()).unwrap_or(u32::MAX));
                expired.push((r, lease.slots.clone()));
            }
            wake.merge(self.finish_lease(id, LeaseEnd::Released, &[], freed));
        }
        wake
    }

    /// Takes away a live lease's deadline, so it cannot expire while its completion is
    /// being made durable.
    pub(crate) fn pin_lease(&mut self, id: LeaseId) {
        self.leases.pin(id);
    }

    /// Counts a getter of RPC `r` as parked (it found too few eligible samples).
    pub(crate) fn park_getter(&mut self, r: usize) {
        if let Some(n) = self.waiting.get_mut(r) {
            *n += 1;
        }
    }

    /// Uncounts a parked getter of RPC `r` (it woke up, or its get was dropped).
    pub(crate) fn unpark_getter(&mut self, r: usize) {
        if let Some(n) = self.waiting.get_mut(r) {
            *n = n.saturating_sub(1);
        }
    }
}
