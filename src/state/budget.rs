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
use std::collections::BTreeMap;

/// Budget bookkeeping of a `SlotTable`.
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
                super::mask::filled(capacity, 0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_up_to_the_limit_and_always_without_one() {
        let mut b = Budget::new(4, Some(100), false);
        b.used = 60;
        assert!(b.fits(40) && !b.fits(41));
        b.used = 100;
        assert!(b.fits(0) && !b.fits(1));
        let unlimited = Budget::new(4, None, false);
        assert!(unlimited.fits(u64::MAX));
    }
}
