//! Why a getter of an RPC would wait: every stored sample sorted by the first reason it is
//! not eligible for the RPC. A scan of the whole table, for a debugging call; no transition
//! uses it.

use super::SlotTable;
use crate::state::rate::RateLimiter;

/// Stored samples of one RPC's view, each counted once, under the first reason that
/// applies (in field order). `eligible` equals [`SlotTable::eligible`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Blockers {
    /// Samples a batch of this RPC holds now.
    pub(crate) leased: usize,
    /// Samples with no reads left for this RPC (served as often as configured).
    pub(crate) used_up: usize,
    /// Samples too old for this RPC (policy version or age).
    pub(crate) stale: usize,
    /// Samples a consumer discarded, waiting for their other holders to finish.
    pub(crate) discarded: usize,
    /// Samples with an amend in flight.
    pub(crate) amending: usize,
    /// Samples lacking at least one of the RPC's input keys.
    pub(crate) incomplete: usize,
    /// Per key id: incomplete samples lacking that key (a sample may lack several).
    pub(crate) missing: Vec<usize>,
    /// Samples the RPC could take now.
    pub(crate) eligible: usize,
}

impl SlotTable {
    /// Sorts every stored slot by why it is or is not eligible for RPC `r` (see
    /// [`Blockers`]); `n_keys` sizes `missing`.
    pub(crate) fn blockers(&self, r: usize, n_keys: usize) -> Blockers {
        let n_rpcs = self.rpcs.len();
        let inputs = self.rpcs[r].inputs;
        let mut b = Blockers {
            missing: vec![0; n_keys],
            ..Blockers::default()
        };
        for s in (0..self.capacity).filter(|&s| self.is_stored(s)) {
            let slot = &self.slots[s];
            if slot.lease_bits.contains(r) {
                b.leased += 1;
            } else if self.reads_left[s * n_rpcs + r] == 0 {
                b.used_up += 1;
            } else if slot.stale.contains(r) {
                b.stale += 1;
            } else if self.discarded.get(s) {
                b.discarded += 1;
            } else if slot.amenders > 0 {
                b.amending += 1;
            } else if !slot.keys.contains_all(inputs) {
                b.incomplete += 1;
                for k in inputs.ids().filter(|&k| !slot.keys.contains(k)) {
                    if let Some(count) = b.missing.get_mut(k) {
                        *count += 1;
                    }
                }
            } else {
                b.eligible += 1;
            }
        }
        b
    }
}

impl SlotTable {
    /// RPC `r`'s rate limiter, if it has one, and whether it lets a batch be leased and a
    /// single sample be put now.
    pub(crate) fn rate_state(&self, r: usize) -> Option<(RateLimiter, bool, bool)> {
        let limiter = *self.rate.get(r)?.as_ref()?;
        let size = self.len();
        let can_sample = limiter.can_sample(self.rpcs[r].n_seqs, size);
        Some((limiter, can_sample, limiter.can_insert(1, size)))
    }
}
