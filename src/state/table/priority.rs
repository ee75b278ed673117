//! Priorities of [`SlotTable`]: the `ln`-weight of each stored sample for every RPC with
//! `Prioritized` selection, kept beside the slot so a weighted draw never reads a payload.
//!
//! The buffer computes a sample's priority from its fields (it owns the payloads) and sets
//! it here when the sample is put, restored, or patched in the priority's key; a slot that
//! is ready for the RPC has its weight in the ready index updated at once (O(log n)).

use super::SlotTable;
use crate::state::ranked::weight_of;

impl SlotTable {
    /// Sets slot `s`'s `ln`-weight for RPC `r` (ignored for an RPC without priorities).
    pub(crate) fn set_ln_priority(&mut self, s: usize, r: usize, ln_weight: f64) {
        let Some(cell) = self.ln_priority.get_mut(r).and_then(|v| v.get_mut(s)) else {
            return;
        };
        *cell = ln_weight;
        if self.slots[s].in_ready.contains(r) {
            self.ready[r].set_weight(self.slots[s].order, weight_of(ln_weight));
        }
    }

    /// Slot `s`'s `ln`-weight for RPC `r` (`-inf`: none, or the RPC has no priorities).
    pub(crate) fn ln_priority(&self, s: usize, r: usize) -> f64 {
        self.ln_priority
            .get(r)
            .and_then(|v| v.get(s))
            .copied()
            .unwrap_or(f64::NEG_INFINITY)
    }

    /// Slot `s`'s weight in RPC `r`'s ready index.
    pub(crate) fn weight(&self, s: usize, r: usize) -> f64 {
        weight_of(self.ln_priority(s, r))
    }
}
