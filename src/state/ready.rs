//! `ReadyIndex`: per RPC, the slots eligible for it, ordered by (birth, put order).
//!
//! A get takes the first (`Fifo`) or last (`Lifo`) `n_seqs` entries, so its cost depends on
//! `n_seqs` and the logarithm of the number of eligible samples, never on the capacity. With
//! births that mostly increase, inserts land at the right edge and `Fifo` takes from the
//! left edge of the B-tree, both paths hot in cache.

use std::collections::BTreeMap;

/// Sort key of a slot: birth in the high 64 bits, put sequence number in the low 64, so
/// equal births fall back to put order and every key is unique.
pub(crate) type OrderKey = u128;

pub(crate) fn order_key(birth: u64, seq: u64) -> OrderKey {
    (u128::from(birth) << 64) | u128::from(seq)
}

/// Eligible slots of one RPC in selection order.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReadyIndex {
    by_order: BTreeMap<OrderKey, u32>,
    lifo: bool,
}

impl ReadyIndex {
    pub(crate) fn new(lifo: bool) -> Self {
        Self {
            by_order: BTreeMap::new(),
            lifo,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.by_order.len()
    }

    pub(crate) fn insert(&mut self, key: OrderKey, slot: u32) {
        let previous = self.by_order.insert(key, slot);
        debug_assert!(previous.is_none(), "order keys are unique");
    }

    pub(crate) fn remove(&mut self, key: OrderKey) {
        self.by_order.remove(&key);
    }

    /// Removes and returns the first `n` slots in selection order (fewer if fewer exist).
    pub(crate) fn take(&mut self, n: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let next = if self.lifo {
                self.by_order.pop_last()
            } else {
                self.by_order.pop_first()
            };
            match next {
                Some((_, slot)) => out.push(slot),
                None => break,
            }
        }
        out
    }

    /// Whether `slot` is indexed under `key`.
    pub(crate) fn contains(&self, key: OrderKey, slot: u32) -> bool {
        self.by_order.get(&key) == Some(&slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_lifo_order_with_ties_by_put_order() {
        for lifo in [false, true] {
            let mut ix = ReadyIndex::new(lifo);
            // births [5,5,5,1,5,5] in put order 0..6 on slots 10..16
            for (seq, birth) in [5u64, 5, 5, 1, 5, 5].into_iter().enumerate() {
                ix.insert(order_key(birth, seq as u64), 10 + seq as u32);
            }
            let got = ix.take(3);
            if lifo {
                assert_eq!(got, vec![15, 14, 12]);
            } else {
                assert_eq!(got, vec![13, 10, 11]);
            }
            assert_eq!(ix.len(), 3);
        }
        assert!(order_key(1, u64::MAX) < order_key(2, 0));
    }
}
