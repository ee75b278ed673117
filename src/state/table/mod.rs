//! `SlotTable`: the synchronous slot state machine, and its invariants.
//!
//! Every method is a plain `fn` called with the buffer's lock held; none blocks, sleeps or
//! allocates more than the batch it handles. Each transition returns a [`Wake`] naming
//! which waiters may now make progress; the async layer notifies them after dropping the
//! lock.
//!
//! # Slot lifecycle
//!
//! ```text
//!   empty --claim_put--> putting --publish_put--> stored --(all reads used)--> empty
//!     ^                     |                    (idle / amending / reading)
//!     +-----abort_put-------+
//! ```
//!
//! A stored slot is `amending` while at least one amend is in flight, `reading` while at
//! least one RPC leases it, and `idle` when neither. Amends and leases may overlap: a batch
//! is a snapshot of `Arc`-shared fields, so an amend never changes what a lease already
//! holds. A slot's generation moves every time it returns to `empty`, so a handle to a freed
//! slot is recognised as stale.
//!
//! # Invariants (checked by [`SlotTable::check_invariants`])
//!
//! 1. Every slot is in exactly one of `empty`, `putting`, stored; a stored slot is `idle`
//!    iff it is neither `amending` nor `reading`. `amending` iff `amenders > 0`; `reading`
//!    iff its lease bits are non-zero. Mask counts equal their recounts.
//! 2. The free list holds exactly the empty slots, each once.
//! 3. An empty or putting slot has no keys, reads, lease bits, amenders or ready entries.
//! 4. A slot's `reads_total` is the sum of its `reads_left` over all RPCs; a stored slot
//!    with `reads_total == 0`, stale for an RPC it still owes reads, or discarded, still
//!    has an amend or a lease in flight (otherwise it was freed).
//! 5. Slot `s` is in RPC `r`'s ready index, under its order key, iff it is eligible for `r`:
//!    stored, not amending, not discarded, holds every input key of `r`, has reads left
//!    for `r`, is not stale for `r`, and `r` does not lease it. `in_ready[s]` mirrors these memberships bit
//!    for bit.
//! 6. Each lease bit `(s, r)` belongs to exactly one live lease of RPC `r`, and every live
//!    lease's slots carry its bit; a lease has a deadline entry iff it has a deadline.
//! 7. Waiting putters have distinct tickets.
//! 8. The bytes in use are the sum of the slots' bytes, and empty slots hold none. With
//!    eviction on, a slot is in the eviction index iff it is stored, neither amended nor
//!    leased, and eligible for exactly the RPCs that still owe it reads (at least one).
//! 9. With a memory budget, the resident bytes are the sum of the slots' resident bytes,
//!    and empty slots hold none and are not being spilled; a slot is in the spill index iff
//!    it is stored, neither amended nor leased, holds resident bytes and is not being
//!    spilled.
//! 10. Only a stored slot has a policy version. When some RPC has a staleness bound, the
//!     version index holds exactly `(version, slot)` of each stored slot with a version
//!     (so raising the version visits every such sample, and only those); otherwise it is
//!     empty.
//!
//! # Wake-ups
//!
//! A transition reports RPC `r` in its [`Wake`] only if it made new samples eligible for
//! `r` and a getter of `r` is parked (`waiting[r] > 0`), and reports space only if it freed
//! slots or changed the head of the putter queue while putters queue. Waiters park under the
//! same lock, after their last look at the state, so one that is not counted yet will see
//! the change when it takes the lock.
//!
//! # Files
//!
//! This file holds the table, puts, amends and the helpers every transition ends with
//! (`settle`, `drop_slot`); `lease.rs` the leases; `evict.rs`, `stale.rs` and `spill.rs`
//! the transitions of the byte budget, freshness and the memory budget, whose bookkeeping
//! lives one level down (`state/budget.rs`, `freshness.rs`, `residency.rs`);
//! `invariants.rs` the audit; `diagnose.rs` why a getter would wait.

mod diagnose;
mod evict;
mod invariants;
mod lease;
mod priority;
mod spill;
mod stale;

use super::budget::Budget;
use super::freshness::{Freshness, FreshnessIndex};
use super::leases::LeaseTable;
use super::mask::{filled, Mask};
use super::rate::RateLimiter;
use super::ready::ReadyIndex;
use super::residency::Residency;
use super::slot::{Generation, RpcSpec, SlotMeta, Ticket, Totals, Wake};
use crate::exit::ExitReason;
use crate::rpc_defs::{KeySet, RpcSet, Selection};
use std::collections::VecDeque;
use std::time::Instant;

/// The slot state machine. See the module docs for the lifecycle and invariants.
#[derive(Debug)]
pub(crate) struct SlotTable {
    pub(crate) rpcs: Vec<RpcSpec>,
    pub(crate) capacity: usize,
    // ----- per slot
    /// The per-slot fields a transition touches, together in one cache line.
    pub(crate) slots: Vec<SlotMeta>,
    /// `reads_left[s * n_rpcs + r]`.
    pub(crate) reads_left: Vec<u16>,
    // ----- state masks
    pub(crate) empty: Mask,
    /// Stored slots a consumer discarded, waiting for their other holders to finish.
    pub(crate) discarded: Mask,
    pub(crate) putting: Mask,
    pub(crate) amending: Mask,
    pub(crate) reading: Mask,
    pub(crate) idle: Mask,
    // ----- indexes
    /// Free slots; the top is taken first, so fresh buffers fill 0, 1, 2, ... and freed
    /// slots (still in cache) are reused first.
    pub(crate) free: Vec<u32>,
    pub(crate) ready: Vec<ReadyIndex>,
    pub(crate) leases: LeaseTable,
    /// Number of slots each RPC leases.
    pub(crate) leased: Vec<usize>,
    pub(crate) putters: VecDeque<(Ticket, usize)>,
    /// Per RPC: getters parked waiting for eligible samples. A transition only reports
    /// wake-ups for RPCs with parked getters (and for space only while putters queue): a
    /// getter that has not parked yet will see the new state when it takes the lock.
    pub(crate) waiting: Vec<usize>,
    next_ticket: Ticket,
    /// Put order, for ties between equal births.
    next_seq: u64,
    pub(crate) totals: Totals,
    /// Policy versions and age deadlines (see `freshness.rs`).
    pub(crate) freshness: FreshnessIndex,
    /// Per slot: why it was last freed.
    pub(crate) exits: Vec<ExitReason>,
    /// Per RPC: leases taken, the draw counter of randomised selection without a step.
    pub(crate) draws: Vec<u64>,
    /// Per RPC with `Prioritized` selection (alone or inside `OnPolicyFraction`): per slot,
    /// the `ln` of the stored sample's weight, which the buffer sets whenever the sample's
    /// fields change (see `priority.rs`). Empty for the other RPCs.
    pub(crate) ln_priority: Vec<Vec<f64>>,
    /// Per RPC: its rate limiter, if it has one (see `state/rate.rs`).
    pub(crate) rate: Vec<Option<RateLimiter>>,
    /// Wake-ups of transitions whose callers take no `Wake` (a lease of a rate-limited
    /// RPC lets putters in): the buffer takes them with [`Self::take_deferred`].
    deferred: Wake,
    /// The byte budget and the eviction index (see `budget.rs`).
    pub(crate) budget: Budget,
    /// The memory budget and the spill index (see `residency.rs`).
    pub(crate) residency: Residency,
}

impl SlotTable {
    pub(crate) fn new(capacity: usize, rpcs: Vec<RpcSpec>) -> Self {
        let n = rpcs.len();
        let ready = rpcs
            .iter()
            .map(|r| match &r.selection {
                Selection::Uniform { .. } | Selection::Recency { .. } => ReadyIndex::ranked(false),
                Selection::Prioritized { .. } => ReadyIndex::ranked(true),
                other => ReadyIndex::new(matches!(other, Selection::Lifo)),
            })
            .collect();
        let ln_priority = rpcs
            .iter()
            .map(|r| match r.selection.priority() {
                Some(_) => filled(capacity, f64::NEG_INFINITY),
                None => Vec::new(),
            })
            .collect();
        let track_versions = rpcs.iter().any(|r| r.max_staleness.is_some());
        Self {
            capacity,
            slots: filled(capacity, SlotMeta::default()),
            reads_left: filled(capacity * n, 0),
            empty: Mask::full(capacity),
            discarded: Mask::new(capacity),
            putting: Mask::new(capacity),
            amending: Mask::new(capacity),
            reading: Mask::new(capacity),
            idle: Mask::new(capacity),
            free: (0..capacity as u32).rev().collect(),
            ready,
            leases: LeaseTable::default(),
            leased: vec![0; n],
            putters: VecDeque::new(),
            waiting: vec![0; n],
            next_ticket: 0,
            next_seq: 0,
            totals: Totals {
                reads: vec![0; n],
                redelivered: vec![0; n],
                expired_leases: vec![0; n],
                ..Totals::default()
            },
            freshness: FreshnessIndex::new(capacity, n, track_versions),
            exits: filled(capacity, ExitReason::Consumed),
            draws: vec![0; n],
            ln_priority,
            rate: rpcs
                .iter()
                .map(|r| r.rate_limit.as_ref().map(RateLimiter::new))
                .collect(),
            deferred: Wake::default(),
            budget: Budget::default(),
            residency: Residency::default(),
            rpcs,
        }
    }

    /// Adds a byte budget of `max` bytes; `evict` makes puts that do not fit evict the
    /// oldest fully-ready samples.
    pub(crate) fn with_budget(mut self, max: Option<u64>, evict: bool) -> Self {
        self.budget = Budget::new(self.capacity, max, evict);
        self
    }

    /// Adds a memory budget of `max` resident payload bytes; `newest_first` says which
    /// end of the order the spiller takes first.
    pub(crate) fn with_residency(mut self, max: Option<u64>, newest_first: bool) -> Self {
        self.residency = Residency::new(self.capacity, max, newest_first);
        self
    }

    /// Slots holding a sample (stored or being put).
    pub(crate) fn len(&self) -> usize {
        self.capacity - self.empty.count()
    }

    pub(crate) fn is_stored(&self, slot: usize) -> bool {
        slot < self.capacity && !self.empty.get(slot) && !self.putting.get(slot)
    }

    // ----- put ---------------------------------------------------------------------

    /// Takes `n` free slots for a put, marking them `putting`. Only the putter at the head
    /// of the queue (or anyone, when nobody queues) may take slots, so waiting putters are
    /// served in arrival order. Returns `None` when this putter must wait.
    #[cfg(test)]
    pub(crate) fn claim_put(
        &mut self,
        n: usize,
        ticket: Option<Ticket>,
    ) -> Option<(Vec<u32>, Wake)> {
        self.claim_put_sized(n, 0, 0, ticket)
    }

    /// [`Self::claim_put`] for a put of `bytes` payload bytes, which must also fit the
    /// byte budget, and `resident` bytes, which must fit the memory budget (the caller
    /// then records each slot's shares with `reserve_bytes` and `reserve_resident`).
    pub(crate) fn claim_put_sized(
        &mut self,
        n: usize,
        bytes: u64,
        resident: u64,
        ticket: Option<Ticket>,
    ) -> Option<(Vec<u32>, Wake)> {
        let my_turn = self.is_turn_of(ticket);
        if !my_turn
            || self.free.len() < n
            || !self.budget.fits(bytes)
            || !self.residency.fits(resident)
            || self.rate_holds_put(n)
        {
            return None;
        }
        let mut wake = Wake::default();
        if ticket.is_some() {
            self.putters.pop_front();
            // The next putter is now at the head; it may fit in what is left.
            wake.space = !self.putters.is_empty();
        }
        let wake = self.deliverable(wake);
        let at = self.free.len() - n;
        let slots: Vec<u32> = self.free.drain(at..).rev().collect();
        for &s in &slots {
            let s = s as usize;
            self.empty.clear(s);
            self.putting.set(s);
        }
        Some((slots, wake))
    }

    /// Takes one free slot for a recovered sample, whatever the byte and memory budgets
    /// say (a recovered buffer may start over them; puts then wait until it is not).
    #[cfg(feature = "persist")]
    pub(crate) fn claim_restore(&mut self) -> Option<u32> {
        let s = self.free.pop()?;
        self.empty.clear(s as usize);
        self.putting.set(s as usize);
        Some(s)
    }

    /// Whether some RPC's rate limiter holds a put of `n` back (counting it if so).
    pub(crate) fn rate_holds_put(&mut self, n: usize) -> bool {
        let size = self.len();
        let mut held = false;
        for limiter in self.rate.iter_mut().flatten() {
            if !limiter.can_insert(n, size) {
                limiter.held_puts += 1;
                held = true;
            }
        }
        held
    }

    /// The wake-ups deferred by transitions that return none (see `deferred`).
    pub(crate) fn take_deferred(&mut self) -> Wake {
        let wake = std::mem::take(&mut self.deferred);
        self.deliverable(wake)
    }

    /// Whether the putter holding `ticket` (or a putter without one) may claim now.
    pub(crate) fn is_turn_of(&self, ticket: Option<Ticket>) -> bool {
        match (self.putters.front(), ticket) {
            (None, _) => true,
            (Some(&(head, _)), Some(t)) => head == t,
            (Some(_), None) => false,
        }
    }

    /// Joins the queue of putters waiting for `n` slots.
    pub(crate) fn enqueue_putter(&mut self, n: usize) -> Ticket {
        let t = self.next_ticket;
        self.next_ticket += 1;
        self.putters.push_back((t, n));
        t
    }

    /// Leaves the putter queue (a cancelled or failed put). If it was at the head, the next
    /// putter may now proceed.
    pub(crate) fn dequeue_putter(&mut self, ticket: Ticket) -> Wake {
        let was_head = self.putters.front().map(|&(t, _)| t) == Some(ticket);
        self.putters.retain(|&(t, _)| t != ticket);
        if self.putters.is_empty() {
            // No one waits for room any more: the spiller must not keep making it.
            self.residency.wanted = 0;
        }
        self.deliverable(Wake {
            rpcs: RpcSet::EMPTY,
            space: was_head,
            ..Wake::default()
        })
    }

    /// Stores claimed slots: they become idle with `keys` and `birth`, get their reads, and
    /// enter the ready index of every RPC whose inputs they hold. Returns each slot's
    /// generation (for handles).
    #[cfg(any(test, feature = "persist"))]
    pub(crate) fn publish_put(
        &mut self,
        slots: &[u32],
        births: &[u64],
        keys: &[KeySet],
    ) -> (Vec<Generation>, Wake) {
        let mut freed = Vec::new();
        self.publish_put_fresh(slots, births, keys, &[], None, &mut freed)
    }

    /// [`Self::publish_put`] with each sample's freshness (missing entries: no version, no
    /// age) at `now`. A sample already stale for an RPC it owes reads is dropped at once
    /// (appended to `freed`, exit `Stale`); its generation is still returned.
    pub(crate) fn publish_put_fresh(
        &mut self,
        slots: &[u32],
        births: &[u64],
        keys: &[KeySet],
        fresh: &[Freshness],
        now: Option<Instant>,
        freed: &mut Vec<u32>,
    ) -> (Vec<Generation>, Wake) {
        let n_rpcs = self.rpcs.len();
        let mut wake = Wake::default();
        let mut generations = Vec::with_capacity(slots.len());
        for (i, ((&s, &birth), &k)) in slots.iter().zip(births).zip(keys).enumerate() {
            let s = s as usize;
            debug_assert!(self.putting.get(s));
            self.putting.clear(s);
            self.idle.set(s);
            self.slots[s].keys = k;
            self.slots[s].order = super::ready::order_key(birth, self.next_seq);
            self.next_seq += 1;
            let mut total = 0u32;
            for (r, rpc) in self.rpcs.iter().enumerate() {
                self.reads_left[s * n_rpcs + r] = rpc.reads;
                total += u32::from(rpc.reads);
            }
            self.slots[s].reads_total = total;
            let f = fresh.get(i).copied().unwrap_or_default();
            if f != Freshness::default() {
                self.slots[s].stale = self.admit_fresh(s, f, now);
            }
            generations.push(self.slots[s].generation);
            wake.merge(self.settle(s, freed));
        }
        self.totals.put += slots.len() as u64;
        for (r, limiter) in self.rate.iter_mut().enumerate() {
            if let Some(limiter) = limiter {
                limiter.inserts += slots.len() as u64;
                // Its getters may have been held by the limiter alone.
                wake.rpcs.insert(r);
            }
        }
        (generations, self.deliverable(wake))
    }

    /// Stores a recovered sample in a claimed slot, like [`Self::publish_put`] but with
    /// `reads_left[r]` reads left for RPC `r` (at least one read must be left somewhere).
    /// Recovered samples are published in their original put order, which orders equal
    /// births as before.
    /// With `fresh` it may come back stale; a sample stale for an RPC it owes reads is
    /// left for the caller to drop with [`Self::settle`] (so the drop can be logged).
    #[cfg(feature = "persist")]
    pub(crate) fn restore_put(
        &mut self,
        slot: u32,
        birth: u64,
        keys: KeySet,
        reads_left: &[u16],
        fresh: Option<(Freshness, Instant)>,
    ) -> Generation {
        let (generations, _) = self.publish_put(&[slot], &[birth], &[keys]);
        let s = slot as usize;
        let n_rpcs = self.rpcs.len();
        let mut total = 0u32;
        for (r, &left) in reads_left.iter().enumerate().take(n_rpcs) {
            self.reads_left[s * n_rpcs + r] = left;
            total += u32::from(left);
        }
        self.slots[s].reads_total = total;
        if let Some((fresh, now)) = fresh {
            self.slots[s].stale = self.admit_fresh(s, fresh, Some(now));
        }
        self.sync_ready(s);
        generations.first().copied().unwrap_or_default()
    }

    /// Gives claimed slots back (a put that failed or was cancelled before publishing).
    pub(crate) fn abort_put(&mut self, slots: &[u32]) -> Wake {
        for &s in slots {
            let s = s as usize;
            debug_assert!(self.putting.get(s));
            self.putting.clear(s);
            self.release_slot(s);
        }
        self.deliverable(Wake {
            rpcs: RpcSet::EMPTY,
            space: !slots.is_empty(),
            spill: false,
            expired_samples: 0,
        })
    }

    // ----- amend -------------------------------------------------------------------

    /// The current generation of a stored slot, or `None` if the slot is out of range or
    /// not stored (being put or empty).
    pub(crate) fn stored_generation(&self, slot: usize) -> Option<Generation> {
        self.is_stored(slot).then(|| self.slots[slot].generation)
    }

    /// Marks stored slots as being amended: they leave every ready index until
    /// [`Self::finish_amend`]. The caller has checked their generations.
    pub(crate) fn begin_amend(&mut self, slots: &[u32]) {
        for &s in slots {
            let s = s as usize;
            debug_assert!(self.is_stored(s));
            self.slots[s].amenders = self.slots[s].amenders.saturating_add(1);
            if self.slots[s].amenders == 1 {
                self.amending.set(s);
                self.idle.clear(s);
                self.sync_ready(s);
            }
        }
    }

    /// Ends amends begun by [`Self::begin_amend`], adding `added[i]` to slot `i`'s keys
    /// (pass empty sets for an aborted amend). Slots whose reads are all used and that
    /// nothing else holds are freed and returned.
    pub(crate) fn finish_amend(
        &mut self,
        slots: &[u32],
        added: &[KeySet],
        freed: &mut Vec<u32>,
    ) -> Wake {
        let mut wake = Wake::default();
        for (i, &s) in slots.iter().enumerate() {
            let s = s as usize;
            debug_assert!(self.slots[s].amenders > 0);
            self.slots[s].keys = self.slots[s]
                .keys
                .union(added.get(i).copied().unwrap_or_default());
            self.slots[s].amenders -= 1;
            if self.slots[s].amenders == 0 {
                self.amending.clear(s);
                if self.slots[s].lease_bits.is_empty() {
                    self.idle.set(s);
                }
            }
            wake.merge(self.settle(s, freed));
        }
        self.deliverable(wake)
    }

    // ----- shared helpers ----------------------------------------------------------

    /// Keeps only the wake-ups someone is parked for.
    fn deliverable(&self, wake: Wake) -> Wake {
        let rpcs = wake
            .rpcs
            .iter()
            .filter(|&r| self.waiting.get(r).copied().unwrap_or(0) > 0)
            .collect();
        Wake {
            rpcs,
            space: wake.space && !self.putters.is_empty(),
            spill: self.residency.over(),
            expired_samples: wake.expired_samples,
        }
    }

    /// After a transition on stored slot `s`: frees it if every read is used and nothing
    /// holds it, otherwise brings its ready-index entries up to date.
    pub(crate) fn settle(&mut self, s: usize, freed: &mut Vec<u32>) -> Wake {
        let held = self.slots[s].amenders != 0 || !self.slots[s].lease_bits.is_empty();
        let exit = if held {
            None
        } else if self.discarded.get(s) {
            Some(ExitReason::Filtered)
        } else if self.slots[s].reads_total == 0 {
            Some(ExitReason::Consumed)
        } else if self.is_doomed(s) {
            Some(ExitReason::Stale)
        } else {
            None
        };
        if let Some(exit) = exit {
            self.drop_slot(s, exit, freed);
            Wake {
                rpcs: RpcSet::EMPTY,
                space: true,
                ..Wake::default()
            }
        } else {
            Wake {
                rpcs: self.sync_ready(s),
                ..Wake::default()
            }
        }
    }

    /// Whether stored slot `s` may still be served to RPC `r` some time: reads left for it
    /// and not stale for it (it may be leased or amended now).
    pub(crate) fn can_serve_again(&self, s: usize, r: usize) -> bool {
        let n_rpcs = self.rpcs.len();
        self.is_stored(s) && self.reads_left[s * n_rpcs + r] > 0 && !self.slots[s].stale.contains(r)
    }

    /// Whether stored slot `s` is eligible for RPC `r` (invariant 5).
    pub(crate) fn is_eligible(&self, s: usize, r: usize) -> bool {
        let n_rpcs = self.rpcs.len();
        self.is_stored(s)
            && self.slots[s].amenders == 0
            && !self.discarded.get(s)
            && self.slots[s].keys.contains_all(self.rpcs[r].inputs)
            && self.reads_left[s * n_rpcs + r] > 0
            && !self.slots[s]
                .lease_bits
                .union(self.slots[s].stale)
                .contains(r)
    }

    /// Makes slot `s`'s ready-index memberships match its eligibility; returns the RPCs it
    /// newly became eligible for.
    fn sync_ready(&mut self, s: usize) -> RpcSet {
        let want: RpcSet = (0..self.rpcs.len())
            .filter(|&r| self.is_eligible(s, r))
            .collect();
        let have = self.slots[s].in_ready;
        let (added, removed) = (want.difference(have), have.difference(want));
        for r in added.union(removed).iter() {
            if added.contains(r) {
                let weight = self.weight(s, r);
                self.ready[r].insert(self.slots[s].order, s as u32, weight);
            } else {
                self.ready[r].remove(self.slots[s].order);
            }
        }
        self.slots[s].in_ready = want;
        self.sync_evictable(s, want);
        self.sync_spillable(s);
        added
    }

    /// Frees stored, unheld slot `s` for `exit`.
    pub(crate) fn drop_slot(&mut self, s: usize, exit: ExitReason, freed: &mut Vec<u32>) {
        // Reads left are zeroed first so that no ready index keeps it.
        let n_rpcs = self.rpcs.len();
        self.reads_left[s * n_rpcs..(s + 1) * n_rpcs].fill(0);
        self.slots[s].reads_total = 0;
        self.sync_ready(s);
        self.idle.clear(s);
        self.release_slot(s);
        match exit {
            ExitReason::Consumed => self.totals.freed += 1,
            ExitReason::Stale => self.totals.stale += 1,
            ExitReason::Evicted => self.totals.evicted += 1,
            ExitReason::Filtered => self.totals.filtered += 1,
        }
        self.exits[s] = exit;
        freed.push(s as u32);
    }

    /// Returns an emptied slot to the free list with a new generation.
    fn release_slot(&mut self, s: usize) {
        let n_rpcs = self.rpcs.len();
        self.forget_fresh(s);
        self.unreserve_bytes(s);
        self.unreserve_resident(s);
        self.discarded.clear(s);
        self.slots[s].stale = RpcSet::EMPTY;
        self.empty.set(s);
        self.slots[s].generation = self.slots[s].generation.advance();
        self.slots[s].keys = KeySet::EMPTY;
        self.reads_left[s * n_rpcs..(s + 1) * n_rpcs].fill(0);
        self.slots[s].reads_total = 0;
        self.free.push(s as u32);
    }
}
