//! Residency: which payload bytes are held in memory, under a memory budget, and which
//! samples to spill next.
//!
//! With a memory budget, every stored (or claimed) slot counts the payload bytes it holds
//! in memory; a spilled sample counts only the fields it holds beside its spilled ones
//! (fields an amend added since). A sample is *spillable* when it is stored, neither
//! amended nor leased, holds resident bytes, and is not being spilled already. Spillable
//! samples are indexed by order key, and the spiller takes them from the end that the
//! buffer's consumers reach last:
//!
//! * `newest_first` (the consumer takes the oldest first, `Fifo` and the randomised
//!   policies): the newest samples are the ones a `Fifo` trainer reaches last;
//! * otherwise (`Lifo`, `Recency`, `OnPolicyFraction`): the oldest are.
//!
//! A put claims its slots only when its bytes fit under the budget (or nothing is
//! resident, so one oversized batch still goes in); otherwise it waits for the spiller,
//! which `wanted` tells how much room the waiting putter needs. Amends and completions
//! never wait: they may take the count over the budget, and the spiller brings it back.
//! So the resident count never exceeds the budget by more than one put batch plus what
//! amends added.

use super::mask::Mask;
use super::ready::OrderKey;
use super::table::SlotTable;
use std::collections::BTreeMap;

/// Residency bookkeeping of a [`SlotTable`].
#[derive(Debug, Default)]
pub(crate) struct Residency {
    /// The memory budget, if any (nothing below is maintained without one).
    pub(crate) max: Option<u64>,
    /// Payload bytes held in memory by stored and claimed slots.
    pub(crate) resident: u64,
    /// Per slot: its share of `resident`.
    pub(crate) per_slot: Vec<u64>,
    /// Slots whose payload is being written out (excluded from `spillable`).
    pub(crate) spilling: Mask,
    /// Spillable samples by order key.
    pub(crate) spillable: BTreeMap<OrderKey, u32>,
    /// Take the newest spillable samples first (else the oldest).
    pub(crate) newest_first: bool,
    /// Bytes the putter at the head of the queue waits to fit (0 when none waits).
    pub(crate) wanted: u64,
}

impl Residency {
    pub(crate) fn new(capacity: usize, max: Option<u64>, newest_first: bool) -> Self {
        match max {
            Some(_) => Self {
                max,
                per_slot: super::table::filled(capacity, 0),
                spilling: Mask::new(capacity),
                newest_first,
                ..Self::default()
            },
            None => Self::default(),
        }
    }

    /// Whether a put of `bytes` may claim its slots now.
    pub(crate) fn fits(&self, bytes: u64) -> bool {
        match self.max {
            None => true,
            Some(max) => self.resident == 0 || self.resident.saturating_add(bytes) <= max,
        }
    }

    /// Bytes to spill so that the resident count drops to `target` below the budget
    /// (room for the waiting putter, and a margin so the spiller works in batches).
    pub(crate) fn excess(&self) -> u64 {
        let Some(max) = self.max else { return 0 };
        let low = max - max / 8;
        let target = low.min(max.saturating_sub(self.wanted));
        self.resident.saturating_sub(target)
    }

    /// Whether the resident count is over the budget (or a putter waits for room).
    pub(crate) fn over(&self) -> bool {
        match self.max {
            None => false,
            Some(max) => self.resident > max || self.wanted > 0,
        }
    }
}

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
            && meta.lease_bits == 0
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
                && meta.lease_bits == 0
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
