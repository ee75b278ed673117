//! The byte budget's transitions of [`SlotTable`]: reserving and giving back bytes, keeping
//! the eviction index in step, and evicting the oldest fully-ready samples to make room.
//! The bookkeeping they act on, and the rules, are in `state/budget.rs`.

use super::SlotTable;
use crate::exit::ExitReason;
use crate::rpc_defs::RpcSet;

impl SlotTable {
    /// Records `bytes[i]` as the size of claimed slot `slots[i]`.
    pub(crate) fn reserve_bytes(&mut self, slots: &[u32], bytes: &[u64]) {
        if self.budget.max.is_none() {
            return;
        }
        for (&s, &b) in slots.iter().zip(bytes) {
            self.set_bytes(s as usize, b);
        }
    }

    /// Sets the size of stored or claimed slot `s` (after an amend, say).
    pub(crate) fn set_bytes(&mut self, s: usize, bytes: u64) {
        if let Some(old) = self.budget.per_slot.get_mut(s) {
            self.budget.used = self.budget.used - *old + bytes;
            *old = bytes;
        }
    }

    /// Gives back the bytes of a slot being freed.
    pub(crate) fn unreserve_bytes(&mut self, s: usize) {
        self.set_bytes(s, 0);
    }

    /// Keeps slot `s`'s entry in the eviction index in step with its state; `ready` is the
    /// set of RPCs it is eligible for.
    pub(crate) fn sync_evictable(&mut self, s: usize, ready: RpcSet) {
        if !self.budget.evict {
            return;
        }
        let n_rpcs = self.rpcs.len();
        let owing: RpcSet = (0..n_rpcs)
            .filter(|&r| self.reads_left[s * n_rpcs + r] > 0)
            .collect();
        let meta = &self.slots[s];
        let evictable = self.is_stored(s)
            && meta.amenders == 0
            && meta.lease_bits.is_empty()
            && !owing.is_empty()
            && ready == owing;
        if evictable {
            self.budget.evictable.insert(meta.order, s as u32);
        } else {
            self.budget.evictable.remove(&meta.order);
        }
    }

    /// Evicts the oldest evictable samples until `n` slots are free and `bytes` fit, if
    /// that is possible; otherwise evicts nothing. Returns whether the put fits now.
    pub(crate) fn make_room(&mut self, n: usize, bytes: u64, freed: &mut Vec<u32>) -> bool {
        let mut free = self.free.len();
        let mut over = match self.budget.max {
            Some(max) => self.budget.used.saturating_add(bytes).saturating_sub(max),
            None => 0,
        };
        let mut victims = Vec::new();
        for &s in self.budget.evictable.values() {
            if free >= n && over == 0 {
                break;
            }
            victims.push(s);
            free += 1;
            over = over.saturating_sub(self.budget.per_slot.get(s as usize).copied().unwrap_or(0));
        }
        if free < n || over > 0 {
            return false;
        }
        for s in victims {
            self.drop_slot(s as usize, ExitReason::Evicted, freed);
        }
        true
    }
}
