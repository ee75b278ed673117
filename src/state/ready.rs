//! `ReadyIndex`: per RPC, the slots eligible for it, ordered by (birth, put order).
//!
//! A get takes the first (`Fifo`) or last (`Lifo`) `n_seqs` entries, so its cost depends on
//! `n_seqs`, never on the capacity.
//!
//! Births mostly arrive in increasing order (default births are a counter; rollout start
//! times grow), so the index keeps two parts:
//!
//! * `run`: a ring buffer of entries in increasing order; every insert larger than its last
//!   key is appended there. Taking from either end reads contiguous memory, which the
//!   hardware prefetches even when a million-entry index is cold in cache.
//! * `rest`: a B-tree for the few inserts that arrive out of order (explicit older births,
//!   slots coming back after an amend or a released lease).
//!
//! A take merges the two. Removing an entry from the middle of `run` (an amend starting)
//! finds it by binary search and leaves a tombstone, skipped when reached; the run is
//! compacted when tombstones outnumber live entries.
//!
//! An RPC with randomised selection needs entries by age rank, or by weight, anywhere in
//! the order; its index is a [`RankedIndex`] instead (`ranked/`), where those cost
//! O(log n) rather than a walk.

use super::ranked::RankedIndex;
use super::select::Rng;
use std::collections::{BTreeMap, VecDeque};

/// Sort key of a slot: birth, then put sequence number, so equal births fall back to put
/// order and every key is unique.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct OrderKey {
    birth: u64,
    seq: u64,
}

pub(crate) fn order_key(birth: u64, seq: u64) -> OrderKey {
    OrderKey { birth, seq }
}

/// Marks a removed entry of `run`.
const TOMBSTONE: u32 = u32::MAX;

/// Eligible slots of one RPC in selection order.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReadyIndex {
    run: VecDeque<(OrderKey, u32)>,
    rest: BTreeMap<OrderKey, u32>,
    /// Tombstones in `run`.
    dead: usize,
    lifo: bool,
    /// Set for randomised selection: then the only part used.
    ranked: Option<RankedIndex<OrderKey>>,
}

impl ReadyIndex {
    pub(crate) fn new(lifo: bool) -> Self {
        Self {
            lifo,
            ..Self::default()
        }
    }

    /// An index for randomised selection (`weighted`: `Prioritized`).
    pub(crate) fn ranked(weighted: bool) -> Self {
        Self {
            ranked: Some(RankedIndex::new(weighted)),
            ..Self::default()
        }
    }

    /// Number of live entries.
    pub(crate) fn len(&self) -> usize {
        match &self.ranked {
            Some(ranked) => ranked.len(),
            None => self.run.len() - self.dead + self.rest.len(),
        }
    }

    /// Adds `slot` under `key` (unique) with `weight` (used only by a weighted index).
    pub(crate) fn insert(&mut self, key: OrderKey, slot: u32, weight: f64) {
        if let Some(ranked) = &mut self.ranked {
            ranked.insert(key, slot, weight);
            return;
        }
        match self.run.back() {
            Some(&(last, _)) if key <= last => {
                let previous = self.rest.insert(key, slot);
                debug_assert!(previous.is_none(), "order keys are unique");
            }
            _ => self.run.push_back((key, slot)),
        }
    }

    pub(crate) fn remove(&mut self, key: OrderKey) {
        if let Some(ranked) = &mut self.ranked {
            ranked.remove(key);
            return;
        }
        if self.rest.remove(&key).is_some() {
            return;
        }
        if let Ok(i) = self.run.binary_search_by_key(&key, |&(k, _)| k) {
            if let Some(entry) = self.run.get_mut(i) {
                if entry.1 != TOMBSTONE {
                    entry.1 = TOMBSTONE;
                    self.dead += 1;
                }
            }
            self.trim();
            if self.dead > 64 && self.dead * 2 > self.run.len() {
                self.run.retain(|&(_, s)| s != TOMBSTONE);
                self.dead = 0;
            }
        }
    }

    /// Drops tombstones from both ends of `run`, so its ends are live entries.
    fn trim(&mut self) {
        while self.run.front().is_some_and(|&(_, s)| s == TOMBSTONE) {
            self.run.pop_front();
            self.dead -= 1;
        }
        while self.run.back().is_some_and(|&(_, s)| s == TOMBSTONE) {
            self.run.pop_back();
            self.dead -= 1;
        }
    }

    /// The weight of the entry under `key` (`None`: absent, or not a weighted index).
    pub(crate) fn weight(&self, key: OrderKey) -> Option<f64> {
        self.ranked.as_ref()?.weight(key)
    }

    /// Sets the weight of the entry under `key`, if indexed (weighted indexes only).
    pub(crate) fn set_weight(&mut self, key: OrderKey, weight: f64) {
        if let Some(ranked) = &mut self.ranked {
            ranked.set_weight(key, weight);
        }
    }

    /// Takes `n` entries by successive weighted draws (see [`RankedIndex::take_weighted`]);
    /// `None` for an index that is not ranked.
    pub(crate) fn take_weighted(&mut self, n: usize, rng: &mut Rng) -> Option<Vec<u32>> {
        Some(self.ranked.as_mut()?.take_weighted(n, rng))
    }

    /// Prefetches what putting `slots` back will read (see
    /// [`RankedIndex::prefetch_returns`]); nothing for an index that is not ranked.
    pub(crate) fn prefetch_returns(&self, slots: &[u32]) {
        if let Some(ranked) = &self.ranked {
            ranked.prefetch_returns(slots);
        }
    }

    /// Removes the slots at age ranks `ranks` (distinct, each below `len()`) and returns
    /// them in the order given; `None` for an index that is not ranked.
    pub(crate) fn take_ranks(&mut self, ranks: &[usize]) -> Option<Vec<u32>> {
        Some(self.ranked.as_mut()?.take_ranks(ranks))
    }

    /// Removes and returns the first `n` slots in selection order (fewer if fewer exist).
    pub(crate) fn take(&mut self, n: usize) -> Vec<u32> {
        if let Some(ranked) = &mut self.ranked {
            let mut out = Vec::with_capacity(n.min(ranked.len()));
            while out.len() < n && ranked.len() > 0 {
                let rank = if self.lifo { ranked.len() - 1 } else { 0 };
                let Some((key, slot)) = ranked.at_rank(rank) else {
                    break;
                };
                ranked.remove(key);
                out.push(slot);
            }
            return out;
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let next = if self.lifo {
                self.take_last()
            } else {
                self.take_first()
            };
            match next {
                Some(slot) => out.push(slot),
                None => break,
            }
        }
        out
    }

    fn take_first(&mut self) -> Option<u32> {
        let from_run = match (self.run.front(), self.rest.first_key_value()) {
            (Some(&(a, _)), Some((b, _))) => a < *b,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let slot = if from_run {
            self.run.pop_front().map(|(_, s)| s)
        } else {
            self.rest.pop_first().map(|(_, s)| s)
        };
        self.trim();
        slot
    }

    fn take_last(&mut self) -> Option<u32> {
        let from_run = match (self.run.back(), self.rest.last_key_value()) {
            (Some(&(a, _)), Some((b, _))) => a > *b,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let slot = if from_run {
            self.run.pop_back().map(|(_, s)| s)
        } else {
            self.rest.pop_last().map(|(_, s)| s)
        };
        self.trim();
        slot
    }

    /// Every live slot in ascending (birth, put order), whatever the index's direction.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let ranked = self.ranked.iter().flat_map(|r| r.iter().map(|(_, s)| s));
        let plain = self.ranked.is_none().then(|| self.plain_iter());
        ranked.chain(plain.into_iter().flatten())
    }

    fn plain_iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut run = self
            .run
            .iter()
            .filter(|&&(_, s)| s != TOMBSTONE)
            .copied()
            .peekable();
        let mut rest = self.rest.iter().map(|(&k, &s)| (k, s)).peekable();
        std::iter::from_fn(move || {
            let take_run = match (run.peek(), rest.peek()) {
                (Some(a), Some(b)) => a.0 < b.0,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if take_run { run.next() } else { rest.next() }.map(|(_, s)| s)
        })
    }

    /// Whether `slot` is indexed (live) under `key`.
    pub(crate) fn contains(&self, key: OrderKey, slot: u32) -> bool {
        if let Some(ranked) = &self.ranked {
            return ranked.contains(key, slot);
        }
        if self.rest.get(&key) == Some(&slot) {
            return true;
        }
        self.run
            .binary_search_by_key(&key, |&(k, _)| k)
            .ok()
            .and_then(|i| self.run.get(i))
            .is_some_and(|&(_, s)| s == slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fifo_and_lifo_order_with_ties_by_put_order() {
        for lifo in [false, true] {
            let mut ix = ReadyIndex::new(lifo);
            // births [5,5,5,1,5,5] in put order 0..6 on slots 10..16
            for (seq, birth) in [5u64, 5, 5, 1, 5, 5].into_iter().enumerate() {
                ix.insert(order_key(birth, seq as u64), 10 + seq as u32, 0.0);
            }
            let got = ix.take(3);
            if lifo {
                assert_eq!(got, vec![15, 14, 12]);
            } else {
                assert_eq!(got, vec![13, 10, 11]);
            }
            assert_eq!(ix.len(), 3);
        }
    }

    /// An index of keys `(i, i)` in slot `i`, for `i` in `0..n`, put in order.
    fn in_order(n: u64) -> ReadyIndex {
        let mut ix = ReadyIndex::new(false);
        for i in 0..n {
            ix.insert(order_key(i, i), i as u32, 0.0);
        }
        ix
    }

    #[test]
    fn inserts_in_order_append_to_the_run_and_older_ones_go_to_the_tree() {
        let mut ix = in_order(10);
        assert_eq!((ix.run.len(), ix.rest.len()), (10, 0));
        ix.insert(order_key(3, 10), 10, 0.0);
        assert_eq!((ix.run.len(), ix.rest.len()), (10, 1));
        assert!(ix.iter().eq([0, 1, 2, 3, 10, 4, 5, 6, 7, 8, 9]));
    }

    #[test]
    fn the_run_is_compacted_once_tombstones_pass_64_and_half_of_it() {
        // Removals from the middle leave tombstones (the live ends stay, so none is
        // trimmed): past 64 of them, and past half the run, the run drops them all.
        for (n, last_kept) in [(100u64, 64u64), (300, 150)] {
            let mut ix = in_order(n);
            for i in 1..=last_kept {
                ix.remove(order_key(i, i));
            }
            assert_eq!(
                (ix.run.len(), ix.dead),
                (n as usize, last_kept as usize),
                "n = {n}"
            );
            ix.remove(order_key(last_kept + 1, last_kept + 1));
            let live: Vec<u32> = (0..n as u32)
                .filter(|&i| i == 0 || i > last_kept as u32 + 1)
                .collect();
            assert_eq!((ix.run.len(), ix.dead), (live.len(), 0), "n = {n}");
            assert!(ix.iter().eq(live.iter().copied()));
            assert!(ix.take(n as usize).eq(&live));
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Remove(usize),
        Take(usize),
    }

    proptest! {
        /// The two-part index, and the ranked one, behave exactly like one ordered map.
        #[test]
        fn matches_an_ordered_map(
            lifo in any::<bool>(),
            ranked in any::<bool>(),
            ops in prop::collection::vec(prop_oneof![
                4 => (0u64..40).prop_map(Op::Insert),
                2 => any::<usize>().prop_map(Op::Remove),
                2 => (1usize..5).prop_map(Op::Take),
            ], 1..200),
        ) {
            let mut ix = if ranked {
                ReadyIndex { lifo, ..ReadyIndex::ranked(false) }
            } else {
                ReadyIndex::new(lifo)
            };
            let mut model: BTreeMap<OrderKey, u32> = BTreeMap::new();
            let mut seq = 0u64;
            for op in ops {
                match op {
                    Op::Insert(birth) => {
                        // mostly increasing births, sometimes older ones
                        let key = order_key(if birth < 30 { seq } else { birth - 30 }, seq);
                        let slot = seq as u32;
                        seq += 1;
                        ix.insert(key, slot, 1.0);
                        model.insert(key, slot);
                    }
                    Op::Remove(pick) => {
                        if model.is_empty() { continue; }
                        let key = *model.keys().nth(pick % model.len()).unwrap_or(&OrderKey::default());
                        let slot = model.remove(&key).unwrap_or(0);
                        prop_assert!(ix.contains(key, slot));
                        ix.remove(key);
                        prop_assert!(!ix.contains(key, slot));
                    }
                    Op::Take(n) => {
                        let got = ix.take(n);
                        let mut want = Vec::new();
                        while want.len() < n {
                            let e = if lifo { model.pop_last() } else { model.pop_first() };
                            match e { Some((_, s)) => want.push(s), None => break }
                        }
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(ix.len(), model.len());
                prop_assert!(ix.iter().eq(model.values().copied()));
            }
        }
    }
}
