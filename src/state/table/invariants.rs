//! `SlotTable::check_invariants`: a full O(capacity × RPCs) audit of the invariants listed in
//! `table.rs`. Tests and proptest runs call it after every step, loom models at their
//! checkpoints; it is never on a hot path.

use super::SlotTable;
use crate::rpc_defs::RpcSet;
use std::collections::HashSet;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

impl SlotTable {
    /// Checks every invariant; the error names the first violation found.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let n_rpcs = self.rpcs.len();
        let mut stored = 0usize;
        for s in 0..self.capacity {
            let (e, p) = (self.empty.get(s), self.putting.get(s));
            let (a, r, i) = (self.amending.get(s), self.reading.get(s), self.idle.get(s));
            ensure!(!(e && p), "slot {s}: both empty and putting");
            if e || p {
                // invariant 3
                ensure!(
                    !a && !r && !i,
                    "slot {s}: empty/putting but amending/reading/idle"
                );
                ensure!(
                    !self.discarded.get(s),
                    "slot {s}: empty/putting but marked discarded"
                );
                ensure!(
                    self.slots[s].amenders == 0,
                    "slot {s}: amenders on a slot not stored"
                );
                ensure!(
                    self.slots[s].lease_bits.is_empty(),
                    "slot {s}: lease bits on a slot not stored"
                );
                ensure!(
                    self.slots[s].in_ready.is_empty(),
                    "slot {s}: ready entries on a slot not stored"
                );
                ensure!(
                    self.slots[s].reads_total == 0,
                    "slot {s}: reads on a slot not stored"
                );
                ensure!(
                    self.slots[s].keys.0 == 0,
                    "slot {s}: keys on a slot not stored"
                );
                continue;
            }
            stored += 1;
            // invariant 1
            ensure!(
                a == (self.slots[s].amenders > 0),
                "slot {s}: amending bit != (amenders > 0)"
            );
            ensure!(
                r != self.slots[s].lease_bits.is_empty(),
                "slot {s}: reading bit != (lease bits != 0)"
            );
            ensure!(
                i == (!a && !r),
                "slot {s}: idle bit wrong (amending {a}, reading {r})"
            );
            // invariant 4
            let left = &self.reads_left[s * n_rpcs..(s + 1) * n_rpcs];
            let sum: u32 = left.iter().map(|&x| u32::from(x)).sum();
            ensure!(
                sum == self.slots[s].reads_total,
                "slot {s}: reads_total {} != sum {sum}",
                self.slots[s].reads_total
            );
            let held = self.slots[s].amenders > 0 || !self.slots[s].lease_bits.is_empty();
            ensure!(
                sum > 0 || held,
                "slot {s}: all reads used and nothing holds it, but it was not freed"
            );
            ensure!(
                !self.discarded.get(s) || held,
                "slot {s}: discarded and nothing holds it, but it was not dropped"
            );
            ensure!(
                !self.is_doomed(s) || held,
                "slot {s}: stale for an RPC that owes it reads and nothing holds it, but it \
                 was not dropped"
            );
            for (rpc, &l) in left.iter().enumerate() {
                ensure!(
                    l <= self.rpcs[rpc].reads,
                    "slot {s}: rpc {rpc} has {l} reads left, more than its {}",
                    self.rpcs[rpc].reads
                );
                if self.slots[s].lease_bits.contains(rpc) {
                    ensure!(l > 0, "slot {s}: leased by rpc {rpc} with no reads left");
                }
            }
            // invariant 8
            if self.budget.evict {
                let evictable =
                    self.budget.evictable.get(&self.slots[s].order) == Some(&(s as u32));
                let owing: RpcSet = (0..n_rpcs).filter(|&rpc| left[rpc] > 0).collect();
                let want = !held && !owing.is_empty() && self.slots[s].in_ready == owing;
                ensure!(
                    evictable == want,
                    "slot {s}: in the eviction index {evictable}, evictable {want}"
                );
            }
            // invariant 5
            for rpc in 0..n_rpcs {
                let eligible = self.is_eligible(s, rpc);
                let flagged = self.slots[s].in_ready.contains(rpc);
                let indexed = self.ready[rpc].contains(self.slots[s].order, s as u32);
                ensure!(
                    eligible == flagged,
                    "slot {s}: rpc {rpc} eligible {eligible} but in_ready {flagged}"
                );
                ensure!(
                    eligible == indexed,
                    "slot {s}: rpc {rpc} eligible {eligible} but indexed {indexed}"
                );
                if let Some(w) = self.ready[rpc].weight(self.slots[s].order) {
                    let want = self.weight(s, rpc);
                    ensure!(
                        w == want,
                        "slot {s}: rpc {rpc} indexed with weight {w}, its priority gives {want}"
                    );
                }
            }
        }
        ensure!(
            self.empty.count() == self.empty.recount(),
            "empty count drifted"
        );
        ensure!(
            self.putting.count() == self.putting.recount(),
            "putting count drifted"
        );
        ensure!(
            self.amending.count() == self.amending.recount(),
            "amending count drifted"
        );
        ensure!(
            self.reading.count() == self.reading.recount(),
            "reading count drifted"
        );
        ensure!(
            self.idle.count() == self.idle.recount(),
            "idle count drifted"
        );
        ensure!(
            self.empty.count() + self.putting.count() + stored == self.capacity,
            "states do not partition the slots"
        );
        // invariant 5, the other direction: no index holds entries beyond the eligible slots
        for rpc in 0..n_rpcs {
            let flagged = (0..self.capacity)
                .filter(|&s| self.slots[s].in_ready.contains(rpc))
                .count();
            ensure!(
                self.ready[rpc].len() == flagged,
                "rpc {rpc}: ready index has {} entries, {flagged} slots flagged",
                self.ready[rpc].len()
            );
        }
        // invariant 2
        ensure!(
            self.free.len() == self.empty.count(),
            "free list has {} slots, {} empty",
            self.free.len(),
            self.empty.count()
        );
        let mut seen = HashSet::with_capacity(self.free.len());
        for &s in &self.free {
            ensure!(
                self.empty.get(s as usize),
                "free list holds slot {s}, which is not empty"
            );
            ensure!(seen.insert(s), "free list holds slot {s} twice");
        }
        // invariant 6
        let mut bits_from_leases = vec![RpcSet::EMPTY; self.capacity];
        let mut leased = vec![0usize; n_rpcs];
        let mut with_deadline = 0;
        for (id, lease) in self.leases.iter() {
            for &s in &lease.slots {
                let s = s as usize;
                ensure!(
                    s < self.capacity,
                    "lease {} names slot {s} out of range",
                    id.number()
                );
                ensure!(
                    !bits_from_leases[s].contains(lease.rpc),
                    "slot {s}: two live leases of rpc {}",
                    lease.rpc
                );
                bits_from_leases[s].insert(lease.rpc);
            }
            leased[lease.rpc] += lease.slots.len();
            if let Some(d) = lease.deadline {
                with_deadline += 1;
                ensure!(
                    self.leases.has_deadline_entry(id, d),
                    "lease {} lacks its deadline entry",
                    id.number()
                );
            }
        }
        ensure!(
            with_deadline == self.leases.deadline_entries(),
            "stale deadline entries"
        );
        for (s, (&want, meta)) in bits_from_leases.iter().zip(&self.slots).enumerate() {
            ensure!(
                want == meta.lease_bits,
                "slot {s}: lease bits {:?}, live leases say {want:?}",
                meta.lease_bits
            );
        }
        ensure!(leased == self.leased, "per-RPC leased counts drifted");
        // invariant 7
        let tickets: HashSet<_> = self.putters.iter().map(|&(t, _)| t).collect();
        ensure!(
            tickets.len() == self.putters.len(),
            "duplicate putter tickets"
        );
        // invariant 8
        if self.budget.max.is_some() {
            let sum: u64 = self.budget.per_slot.iter().sum();
            ensure!(
                sum == self.budget.used,
                "bytes used {} != sum over slots {sum}",
                self.budget.used
            );
            for s in 0..self.capacity {
                ensure!(
                    !self.empty.get(s) || self.budget.per_slot[s] == 0,
                    "slot {s}: empty but holds {} bytes",
                    self.budget.per_slot[s]
                );
            }
        }
        ensure!(
            self.budget.evictable.len() <= self.capacity,
            "eviction index larger than the capacity"
        );
        // invariant 9
        self.check_residency()?;
        // invariant 10
        self.check_versions()
    }
}
