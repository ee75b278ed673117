//! The memory budget's transitions of [`SlotTable`]: resident bytes per slot, the spill
//! index, and picking what to spill next. The bookkeeping they act on is in
//! `state/residency.rs`.

use super::SlotTable;

impl SlotTable {
    /// Records `bytes` as the resident size of stored or claimed slot `s`.
    pub(crate) fn set_resident(&mut self, s: usize, bytes: u64) {
        let r = &mut self.residency;
        if let Some(old) = r.per_slot.get_mut(s) {
            r.resident = r.resident - *old + bytes;
            *old = bytes;
            self.sync_spillable(s);
        }
    }

    /// Records `bytes[i]` as the resident size of claimed slot `slots[i]`.
    pub(crate) fn reserve_resident(&mut self, slots: &[u32], bytes: &[u64]) {
        if self.residency.max.is_none() {
            return;
        }
        for (&s, &b) in slots.iter().zip(bytes) {
            self.set_resident(s as usize, b);
        }
    }

    /// Keeps slot `s`'s entry in the spill index in step with its state.
    pub(crate) fn sync_spillable(&mut self, s: usize) {
        if self.residency.max.is_none() {
            return;
        }
        let meta = &self.slots[s];
        let spillable = self.is_stored(s)
            && meta.amenders == 0
            && meta.lease_bits.is_empty()
            && self.residency.per_slot.get(s).is_some_and(|&b| b > 0)
            && !self.residency.spilling.get(s);
        if spillable {
            self.residency.spillable.insert(meta.order, s as u32);
        } else {
            self.residency.spillable.remove(&meta.order);
        }
    }

    /// Takes spillable samples, from the end the consumers reach last, until their resident
    /// bytes cover `bytes` (or none is left); marks them as being spilled.
    pub(crate) fn pick_spill(&mut self, bytes: u64) -> Vec<u32> {
        let r = &mut self.residency;
        let mut picked = Vec::new();
        let mut covered = 0u64;
        let mut take = |s: u32| {
            if covered >= bytes {
                return false;
            }
            covered += r.per_slot.get(s as usize).copied().unwrap_or(0);
            picked.push(s);
            true
        };
        if r.newest_first {
            for &s in r.spillable.values().rev() {
                if !take(s) {
                    break;
                }
            }
        } else {
            for &s in r.spillable.values() {
                if !take(s) {
                    break;
                }
            }
        }
        for &s in &picked {
            let s = s as usize;
            self.residency.spilling.set(s);
            self.residency.spillable.remove(&self.slots[s].order);
        }
        picked
    }

    /// Ends the spill of slot `s`: it now holds `resident` bytes in memory (unchanged when
    /// the spill was given up).
    pub(crate) fn end_spill(&mut self, s: usize, resident: u64) {
        if self.residency.spilling.get(s) {
            self.residency.spilling.clear(s);
        }
        if self.is_stored(s) {
            self.set_resident(s, resident);
        }
    }

    /// Gives back the resident bytes of a slot being freed.
    pub(crate) fn unreserve_resident(&mut self, s: usize) {
        if self.residency.max.is_none() {
            return;
        }
        self.residency.spillable.remove(&self.slots[s].order);
        if self.residency.spilling.get(s) {
            self.residency.spilling.clear(s);
        }
        if let Some(old) = self.residency.per_slot.get_mut(s) {
            self.residency.resident -= *old;
            *old = 0;
        }
    }

    /// Audits invariant 9 (see `table.rs`).
    pub(crate) fn check_residency(&self) -> Result<(), String> {
        let r = &self.residency;
        if r.max.is_none() {
            return Ok(());
        }
        let sum: u64 = r.per_slot.iter().sum();
        if sum != r.resident {
            return Err(format!(
                "resident bytes {} != per-slot sum {sum}",
                r.resident
            ));
        }
        let mut indexed = 0usize;
        for s in 0..self.capacity {
            let held = self.is_stored(s) || self.putting.get(s);
            if !held && (r.per_slot[s] != 0 || r.spilling.get(s)) {
                return Err(format!("slot {s}: empty but resident or spilling"));
            }
            let meta = &self.slots[s];
            let want = self.is_stored(s)
                && meta.amenders == 0
                && meta.lease_bits.is_empty()
                && r.per_slot[s] > 0
                && !r.spilling.get(s);
            let have = r.spillable.get(&meta.order) == Some(&(s as u32));
            if want != have {
                return Err(format!(
                    "slot {s}: in the spill index {have}, spillable {want}"
                ));
            }
            indexed += usize::from(have);
        }
        if indexed != r.spillable.len() {
            return Err(format!(
                "spill index has {} entries, {indexed} belong to slots",
                r.spillable.len()
            ));
        }
        Ok(())
    }
}
