//! The byte budget: payload bytes held per slot and in total, and eviction of the oldest
//! fully-ready samples to make room for a put.
//!
//! Bytes are reserved when a put claims its slots (so a waiting putter's room cannot be
//! taken by a later one), adjusted when an amend or a completion changes a sample, and
//! given back when the slot is freed. Amends and completions never wait for room: they may
//! take the total over the budget, and puts then wait until it is back under.
//!
//! A sample is *evictable* when it is stored, neither amended nor leased, and ready for
//! every RPC that still owes it reads: its pipeline is done up to its last consumer, so
//! evicting it loses a finished sample rather than work in flight. With eviction on, the
//! evictable samples are indexed by order key, oldest first; a put that does not fit evicts
//! from the front, and only when that makes it fit (never a partial eviction).

use super::ready::OrderKey;
use super::table::{Exit, SlotTable};
use std::collections::BTreeMap;

/// Budget bookkeeping of a [`SlotTable`].
#[derive(Debug, Default)]
pub(crate) struct Budget {
    /// The limit, if any.
    pub(crate) max: Option<u64>,
    /// Bytes held by stored samples and reserved by claimed puts.
    pub(crate) used: u64,
    /// Per slot: its share of `used`.
    pub(crate) per_slot: Vec<u64>,
    /// Whether puts that do not fit evict (`evictable` is maintained only then).
    pub(crate) evict: bool,
    /// Evictable samples, oldest first.
    pub(crate) evictable: BTreeMap<OrderKey, u32>,
}

impl Budget {
    pub(crate) fn new(capacity: usize, max: Option<u64>, evict: bool) -> Self {
        Self {
            max,
            per_slot: if max.is_some() {
                super::table::filled(capacity, 0)
            } else {
                Vec::new()
            },
            evict,
            ..Self::default()
        }
    }

    /// Whether `bytes` more fit under the limit.
    pub(crate) fn fits(&self, bytes: u64) -> bool {
        self.max
            .is_none_or(|max| self.used.saturating_add(bytes) <= max)
    }
}

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
    pub(crate) fn sync_evictable(&mut self, s: usize, ready: u64) {
        if !self.budget.evict {
            return;
        }
        let n_rpcs = self.rpcs.len();
        let owing = (0..n_rpcs).fold(0u64, |acc, r| {
            if self.reads_left[s * n_rpcs + r] > 0 {
                acc | 1 << r
            } else {
                acc
            }
        });
        let meta = &self.slots[s];
        let evictable = self.is_stored(s)
            && meta.amenders == 0
            && meta.lease_bits == 0
            && owing != 0
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
            self.drop_slot(s as usize, Exit::Evicted, freed);
        }
        true
    }
}
