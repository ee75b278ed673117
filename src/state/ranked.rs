//! `RankedIndex`: the ready index of an RPC with randomised selection (`Uniform`,
//! `Recency`, `Prioritized`), where a batch needs the entries at given age ranks, or the
//! entries where a running total of weights crosses given values, without walking the
//! whole index.
//!
//! Entries `(order key, slot, weight)` live in sorted blocks of at most [`MAX_BLOCK`]. A
//! sum tree over the blocks holds each block's entry count, weight sum and number of
//! weighted entries. Finding the entry at age rank `k`, or the entry where the weights'
//! running total crosses `u`, walks the tree (O(log blocks)) and then one block; inserting
//! or removing finds the block by binary search over the blocks' first keys, edits it in
//! place and updates the block's path up the tree. So a batch of `k` costs O(k log n)
//! whatever the capacity. A block that outgrows `MAX_BLOCK` splits, one that shrinks below
//! [`MIN_BLOCK`] merges into a neighbour; those rebuild the tree, O(blocks), at most once
//! per `MIN_BLOCK` edits.
//!
//! Why blocks rather than a node per entry: a balanced tree over a million entries is some
//! twenty dependent cache misses per lookup. The tree over a few thousand blocks stays in
//! cache, so a lookup misses about twice (the block's keys, then its weights), and the
//! order is the index's own (birth, put order), never slot numbers, so a recovered buffer
//! whose samples sit in other slots draws the same batches.
//!
//! Weights are `exp` of the `ln`-weights the buffer computes, with the exponent capped at
//! [`MAX_LN_WEIGHT`] so a million of the heaviest still sum to a finite number; a weight
//! that underflows to zero weighs nothing. A block's sum is always recomputed from its
//! weights, never updated by subtraction, so removing a heavy entry cannot leave a
//! rounding residue that would make a weightless entry drawable.

use super::select::Rng;

/// Largest entries per block; a block past it splits in two.
const MAX_BLOCK: usize = 128;
/// A block below this merges into a neighbour.
const MIN_BLOCK: usize = 16;
/// `ln` of the largest weight: `e^600` (about `10^260`) times a million entries is still
/// finite.
pub(crate) const MAX_LN_WEIGHT: f64 = 600.0;

/// The weight of an entry whose `ln`-weight is `ln_weight` (`-inf` or NaN: none).
pub(crate) fn weight_of(ln_weight: f64) -> f64 {
    if ln_weight.is_nan() {
        0.0
    } else {
        ln_weight.min(MAX_LN_WEIGHT).exp()
    }
}

#[derive(Debug, Clone)]
struct Block<K> {
    keys: Vec<K>,
    slots: Vec<u32>,
    /// Per entry, `>= 0`; empty in an unweighted index.
    weights: Vec<f64>,
    sum: f64,
    /// Entries with a weight above zero.
    weighted: u32,
}

impl<K> Default for Block<K> {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            slots: Vec::new(),
            weights: Vec::new(),
            sum: 0.0,
            weighted: 0,
        }
    }
}

impl<K> Block<K> {
    /// Recomputes `sum` and `weighted` from the weights. Four running sums in a fixed
    /// order: the result is the same on every run, and the loop vectorises.
    fn recount(&mut self) {
        let mut acc = [0.0f64; 4];
        let chunks = self.weights.chunks_exact(4);
        let tail = chunks.remainder();
        for c in chunks {
            for (a, w) in acc.iter_mut().zip(c) {
                *a += w;
            }
        }
        self.sum = tail
            .iter()
            .fold((acc[0] + acc[1]) + (acc[2] + acc[3]), |s, w| s + w);
        self.weighted = self.weights.iter().filter(|&&w| w > 0.0).count() as u32;
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    /// Moves the entries from `at` on into a new block.
    fn split_off(&mut self, at: usize) -> Block<K> {
        let weights = if self.weights.is_empty() {
            Vec::new()
        } else {
            self.weights.split_off(at)
        };
        let mut tail = Block {
            keys: self.keys.split_off(at),
            slots: self.slots.split_off(at),
            weights,
            ..Block::default()
        };
        self.recount();
        tail.recount();
        tail
    }

    fn append(&mut self, other: &mut Block<K>) {
        self.keys.append(&mut other.keys);
        self.slots.append(&mut other.slots);
        self.weights.append(&mut other.weights);
        self.recount();
    }
}

/// Counts, weight sums and weighted counts over the blocks, as an implicit binary tree:
/// node 1 is the root, node `i` has children `2i` and `2i + 1`, and the block `b` is leaf
/// `leaves + b`. A parent is always recomputed from its children (no subtraction).
#[derive(Debug, Clone, Default)]
struct Tree {
    leaves: usize,
    count: Vec<u32>,
    sum: Vec<f64>,
    weighted: Vec<u32>,
}

impl Tree {
    fn rebuild<K>(&mut self, blocks: &[Block<K>]) {
        self.leaves = blocks.len().next_power_of_two().max(1);
        let nodes = 2 * self.leaves;
        self.count.clear();
        self.count.resize(nodes, 0);
        self.sum.clear();
        self.sum.resize(nodes, 0.0);
        self.weighted.clear();
        self.weighted.resize(nodes, 0);
        for (b, block) in blocks.iter().enumerate() {
            self.set_leaf(b, block);
        }
        for i in (1..self.leaves).rev() {
            self.combine(i);
        }
    }

    /// Refreshes the leaves of blocks `from..` after blocks were inserted or removed there
    /// (`old_len` blocks before), and their ancestors: O(blocks moved + log), so a split
    /// at the end, where in-order puts land, costs O(log blocks).
    fn refresh_from<K>(&mut self, from: usize, blocks: &[Block<K>], old_len: usize) {
        if blocks.len() > self.leaves {
            self.rebuild(blocks);
            return;
        }
        let end = blocks.len().max(old_len);
        if from >= end {
            return;
        }
        for b in from..end {
            match blocks.get(b) {
                Some(block) => self.set_leaf(b, block),
                None => {
                    let i = self.leaves + b;
                    self.count[i] = 0;
                    self.sum[i] = 0.0;
                    self.weighted[i] = 0;
                }
            }
        }
        let (mut lo, mut hi) = ((self.leaves + from) / 2, (self.leaves + end - 1) / 2);
        while lo >= 1 {
            for i in lo..=hi {
                self.combine(i);
            }
            lo /= 2;
            hi /= 2;
        }
    }

    fn set_leaf<K>(&mut self, b: usize, block: &Block<K>) {
        let i = self.leaves + b;
        self.count[i] = block.len() as u32;
        self.sum[i] = block.sum;
        self.weighted[i] = block.weighted;
    }

    fn combine(&mut self, i: usize) {
        let (l, r) = (2 * i, 2 * i + 1);
        self.count[i] = self.count[l] + self.count[r];
        self.sum[i] = self.sum[l] + self.sum[r];
        self.weighted[i] = self.weighted[l] + self.weighted[r];
    }

    fn update<K>(&mut self, b: usize, block: &Block<K>) {
        self.set_leaf(b, block);
        let mut i = (self.leaves + b) / 2;
        while i >= 1 {
            self.combine(i);
            i /= 2;
        }
    }

    fn total_weight(&self) -> f64 {
        self.sum.get(1).copied().unwrap_or(0.0)
    }

    fn weighted_entries(&self) -> u32 {
        self.weighted.get(1).copied().unwrap_or(0)
    }

    /// The block holding rank `k` (below the total count) and the rank within it.
    fn find_rank(&self, mut k: usize) -> (usize, usize) {
        let mut i = 1;
        while i < self.leaves {
            let left = 2 * i;
            let here = self.count[left] as usize;
            if k < here {
                i = left;
            } else {
                k -= here;
                i = left + 1;
            }
        }
        (i - self.leaves, k)
    }

    /// The block where the running weight total crosses `u` (in `[0, total)`), and what is
    /// left of `u` there. Only ever descends into a part holding a weighted entry, so
    /// rounding cannot land on a weightless block.
    fn find_weight(&self, mut u: f64) -> (usize, f64) {
        let mut i = 1;
        while i < self.leaves {
            let (left, right) = (2 * i, 2 * i + 1);
            let go_left =
                self.weighted[left] > 0 && (u < self.sum[left] || self.weighted[right] == 0);
            if go_left {
                i = left;
            } else {
                u -= self.sum[left];
                i = right;
            }
        }
        (i - self.leaves, u.max(0.0))
    }
}

/// Eligible slots of one RPC ordered by their keys `K` (unique; the ready index's (birth,
/// put order)), with optional weights (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct RankedIndex<K> {
    blocks: Vec<Block<K>>,
    /// The first key of each block, for the binary search that finds a key's block.
    firsts: Vec<K>,
    tree: Tree,
    weighted: bool,
    len: usize,
}

impl<K: Ord + Copy> RankedIndex<K> {
    /// An empty index; `weighted` keeps a weight per entry.
    pub(crate) fn new(weighted: bool) -> Self {
        Self {
            blocks: Vec::new(),
            firsts: Vec::new(),
            tree: Tree::default(),
            weighted,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Entries with a weight above zero.
    pub(crate) fn weighted_len(&self) -> usize {
        self.tree.weighted_entries() as usize
    }

    /// The block that holds `key`, or would: the last whose first key is not above it.
    fn locate(&self, key: K) -> usize {
        self.firsts.partition_point(|f| *f <= key).saturating_sub(1)
    }

    /// Adds `slot` under `key` (unique) with `weight` (ignored when unweighted).
    pub(crate) fn insert(&mut self, key: K, slot: u32, weight: f64) {
        if self.blocks.is_empty() {
            self.blocks.push(Block::default());
            self.firsts.push(key);
            self.tree.rebuild(&self.blocks);
        }
        let b = self.locate(key);
        let n_blocks = self.blocks.len();
        let block = &mut self.blocks[b];
        let at = block.keys.partition_point(|k| *k < key);
        block.keys.insert(at, key);
        block.slots.insert(at, slot);
        if self.weighted {
            block.weights.insert(at, weight.max(0.0));
        }
        block.recount();
        if at == 0 {
            self.firsts[b] = key;
        }
        self.len += 1;
        if self.blocks[b].len() > MAX_BLOCK {
            let tail = self.blocks[b].split_off(MAX_BLOCK / 2);
            self.firsts.insert(b + 1, tail.keys[0]);
            self.blocks.insert(b + 1, tail);
            self.tree.refresh_from(b, &self.blocks, n_blocks);
        } else {
            self.tree.update(b, &self.blocks[b]);
        }
    }

    /// The block and position of `key`, if indexed.
    fn find(&self, key: K) -> Option<(usize, usize)> {
        let b = self.locate(key);
        let at = self.blocks.get(b)?.keys.binary_search(&key).ok()?;
        Some((b, at))
    }

    /// Removes the entry under `key`; returns its slot.
    pub(crate) fn remove(&mut self, key: K) -> Option<u32> {
        let (b, at) = self.find(key)?;
        Some(self.remove_at(b, at))
    }

    /// Removes entry `at` of block `b` (both valid); returns its slot.
    fn remove_at(&mut self, b: usize, at: usize) -> u32 {
        let n_blocks = self.blocks.len();
        let block = &mut self.blocks[b];
        block.keys.remove(at);
        let slot = block.slots.remove(at);
        if self.weighted {
            block.weights.remove(at);
        }
        block.recount();
        self.len -= 1;
        if block.keys.is_empty() {
            self.blocks.remove(b);
            self.firsts.remove(b);
            self.tree.refresh_from(b, &self.blocks, n_blocks);
        } else if block.len() < MIN_BLOCK && n_blocks > 1 {
            // Merge into the next block (or the previous, for the last one), splitting
            // again if the two are too many for one.
            let first = if b + 1 < self.blocks.len() { b } else { b - 1 };
            let mut second = self.blocks.remove(first + 1);
            self.firsts.remove(first + 1);
            self.blocks[first].append(&mut second);
            self.firsts[first] = self.blocks[first].keys[0];
            if self.blocks[first].len() > MAX_BLOCK {
                let half = self.blocks[first].len() / 2;
                let tail = self.blocks[first].split_off(half);
                self.firsts.insert(first + 1, tail.keys[0]);
                self.blocks.insert(first + 1, tail);
            }
            self.tree.refresh_from(first, &self.blocks, n_blocks);
        } else {
            if at == 0 {
                self.firsts[b] = block.keys[0];
            }
            self.tree.update(b, &self.blocks[b]);
        }
        slot
    }

    /// Sets the weight of the entry under `key` (nothing when absent or unweighted).
    pub(crate) fn set_weight(&mut self, key: K, weight: f64) {
        if !self.weighted {
            return;
        }
        if let Some((b, at)) = self.find(key) {
            self.blocks[b].weights[at] = weight.max(0.0);
            self.blocks[b].recount();
            self.tree.update(b, &self.blocks[b]);
        }
    }

    /// The key and slot at age rank `k` (0 = oldest).
    pub(crate) fn at_rank(&self, k: usize) -> Option<(K, u32)> {
        let (b, at) = self.rank_position(k)?;
        Some((self.blocks[b].keys[at], self.blocks[b].slots[at]))
    }

    /// The block and position of age rank `k`.
    fn rank_position(&self, k: usize) -> Option<(usize, usize)> {
        if k >= self.len {
            return None;
        }
        let (b, at) = self.tree.find_rank(k);
        (at < self.blocks.get(b)?.len()).then_some((b, at))
    }

    /// Removes the entries at age ranks `ranks` (distinct, each below `len()`); returns
    /// their slots in the order given. Taken from the highest rank down, so each removal
    /// leaves the ranks still to take where they were.
    pub(crate) fn take_ranks(&mut self, ranks: &[usize]) -> Vec<u32> {
        let mut order: Vec<(usize, usize)> = ranks.iter().copied().zip(0..).collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = vec![0u32; ranks.len()];
        let mut taken = 0;
        for (rank, place) in order {
            if let Some((b, at)) = self.rank_position(rank) {
                out[place] = self.remove_at(b, at);
                taken += 1;
            }
        }
        debug_assert_eq!(taken, ranks.len(), "ranks beyond the index, or repeated");
        out.truncate(taken);
        out
    }

    /// The weighted entry where the running total of weights, oldest first, crosses
    /// `unit * total` (`unit` in `[0, 1)`): each weighted entry is found with probability
    /// its share of the total. `None` when no entry weighs anything.
    #[cfg(test)]
    pub(crate) fn at_weight(&self, unit: f64) -> Option<(K, u32)> {
        let (b, at) = self.weight_position(unit)?;
        Some((self.blocks[b].keys[at], self.blocks[b].slots[at]))
    }

    /// The block and position [`Self::at_weight`] finds.
    fn weight_position(&self, unit: f64) -> Option<(usize, usize)> {
        if self.weighted_len() == 0 {
            return None;
        }
        let (b, mut u) = self.tree.find_weight(unit * self.tree.total_weight());
        let block = self.blocks.get(b)?;
        // Past the last weighted entry (rounding), the last one is taken.
        let mut last = None;
        for (at, &w) in block.weights.iter().enumerate() {
            if w > 0.0 {
                last = Some(at);
                if u < w {
                    break;
                }
                u -= w;
            }
        }
        Some((b, last?))
    }

    /// Every entry, oldest first.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (K, u32)> + '_ {
        self.blocks
            .iter()
            .flat_map(|b| b.keys.iter().copied().zip(b.slots.iter().copied()))
    }

    /// Whether `slot` is indexed under `key`.
    pub(crate) fn contains(&self, key: K, slot: u32) -> bool {
        self.find(key)
            .is_some_and(|(b, at)| self.blocks[b].slots[at] == slot)
    }

    /// The weight of the entry under `key` (`None`: absent, or unweighted).
    pub(crate) fn weight(&self, key: K) -> Option<f64> {
        let (b, at) = self.find(key)?;
        self.blocks[b].weights.get(at).copied()
    }

    /// Takes `n` entries (fewer if fewer exist): while any weighs something, each by a
    /// weighted draw among those left; then uniformly among the weightless. This is
    /// successive sampling without replacement, the distribution the Gumbel-top-k pass
    /// gives, at O(log n) per entry.
    pub(crate) fn take_weighted(&mut self, n: usize, rng: &mut Rng) -> Vec<u32> {
        let mut out = Vec::with_capacity(n.min(self.len));
        while out.len() < n && self.len > 0 {
            let picked = match self.weight_position(rng.unit()) {
                Some(position) => Some(position),
                None => self.rank_position(rng.below(self.len)),
            };
            let Some((b, at)) = picked else { break };
            out.push(self.remove_at(b, at));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::select::Rng;
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    type Key = (u64, u64);

    fn key(birth: u64, seq: u64) -> Key {
        (birth, seq)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u8),
        Remove(usize),
        Reweight(usize, u8),
        Take(usize, u64),
    }

    proptest! {
        /// The index matches an ordered map entry for entry, rank for rank, and in its
        /// weighted counts, across inserts, removals, reweighting and weighted takes big
        /// enough to split and merge blocks.
        #[test]
        fn matches_an_ordered_map(
            ops in prop::collection::vec(prop_oneof![
                6 => (0u64..1000, 0u8..4).prop_map(|(b, w)| Op::Insert(b, w)),
                3 => any::<usize>().prop_map(Op::Remove),
                1 => (any::<usize>(), 0u8..4).prop_map(|(i, w)| Op::Reweight(i, w)),
                1 => (1usize..40, any::<u64>()).prop_map(|(n, s)| Op::Take(n, s)),
            ], 1..1500),
        ) {
            let mut ix = RankedIndex::new(true);
            let mut model: BTreeMap<Key, (u32, f64)> = BTreeMap::new();
            for (seq, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(birth, w) => {
                        let key = key(birth, seq as u64);
                        ix.insert(key, seq as u32, f64::from(w));
                        model.insert(key, (seq as u32, f64::from(w)));
                    }
                    Op::Remove(pick) if !model.is_empty() => {
                        let key = *model.keys().nth(pick % model.len()).unwrap_or(&(0, 0));
                        let (slot, _) = model.remove(&key).unwrap_or_default();
                        prop_assert_eq!(ix.remove(key), Some(slot));
                    }
                    Op::Reweight(pick, w) if !model.is_empty() => {
                        let key = *model.keys().nth(pick % model.len()).unwrap_or(&(0, 0));
                        ix.set_weight(key, f64::from(w));
                        if let Some(e) = model.get_mut(&key) { e.1 = f64::from(w); }
                    }
                    Op::Take(n, seed) => {
                        let weighted_before = model.values().filter(|e| e.1 > 0.0).count();
                        let taken = ix.take_weighted(n, &mut Rng::new(seed));
                        prop_assert_eq!(taken.len(), n.min(model.len()));
                        // Weighted entries go first: no weightless one while some weigh.
                        for (i, slot) in taken.iter().enumerate() {
                            let key = model.iter().find(|e| e.1.0 == *slot).map(|e| *e.0);
                            let Some(key) = key else { return Err(TestCaseError::fail("taken twice or unknown")) };
                            let (_, w) = model.remove(&key).unwrap_or_default();
                            prop_assert_eq!(w > 0.0, i < weighted_before);
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(ix.len(), model.len());
                prop_assert_eq!(ix.weighted_len(), model.values().filter(|e| e.1 > 0.0).count());
            }
            prop_assert!(ix.iter().map(|e| e.1).eq(model.values().map(|e| e.0)));
            for (k, (key, (slot, w))) in model.iter().enumerate() {
                prop_assert_eq!(ix.at_rank(k), Some((*key, *slot)));
                prop_assert!(ix.contains(*key, *slot));
                prop_assert_eq!(ix.weight(*key), Some(*w));
            }
            prop_assert_eq!(ix.at_rank(model.len()), None);
        }
    }

    /// Chi-square of `counts` against probabilities proportional to `weights`.
    fn chi_square(counts: &[u64], weights: &[f64]) -> f64 {
        let n: u64 = counts.iter().sum();
        let total: f64 = weights.iter().sum();
        counts
            .iter()
            .zip(weights)
            .map(|(&c, &w)| {
                let e = n as f64 * w / total;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    #[test]
    fn a_weighted_draw_follows_the_weights_across_many_blocks() {
        // 2,000 entries (many blocks), weights 1..=20 repeating, and a weightless tenth.
        let mut ix = RankedIndex::new(true);
        let weight = |i: u64| {
            if i % 10 == 9 {
                0.0
            } else {
                (i % 20 + 1) as f64
            }
        };
        for i in 0..2000u64 {
            ix.insert(key(i, i), i as u32, weight(i));
        }
        let mut rng = Rng::new(7);
        let mut counts = [0u64; 20];
        for _ in 0..200_000 {
            let Some((_, slot)) = ix.at_weight(rng.unit()) else {
                panic!("weighted entries exist");
            };
            assert!(
                weight(u64::from(slot)) > 0.0,
                "a weightless entry was drawn"
            );
            counts[(slot % 20) as usize] += 1;
        }
        let weights: Vec<f64> = (0..20u64)
            .map(|c| if c % 10 == 9 { 0.0 } else { (c + 1) as f64 })
            .collect();
        let (counts, weights): (Vec<u64>, Vec<f64>) = counts
            .iter()
            .zip(&weights)
            .filter(|(_, &w)| w > 0.0)
            .map(|(&c, &w)| (c, w))
            .unzip();
        // 17 degrees of freedom: 40.8 is the 0.999 quantile.
        let chi = chi_square(&counts, &weights);
        assert!(chi < 40.8, "chi-square {chi:.1} over 17 degrees of freedom");
    }

    #[test]
    fn removing_the_heavy_entries_leaves_no_residue() {
        let mut ix = RankedIndex::new(true);
        ix.insert(key(0, 0), 0, 1e250);
        ix.insert(key(1, 1), 1, 0.0);
        ix.insert(key(2, 2), 2, 1e-300);
        assert_eq!(ix.remove(key(0, 0)), Some(0));
        for i in 0..100 {
            let unit = f64::from(i) / 100.0;
            assert_eq!(ix.at_weight(unit).map(|e| e.1), Some(2));
        }
        ix.set_weight(key(2, 2), 0.0);
        assert_eq!(ix.at_weight(0.5), None);
        assert_eq!(weight_of(f64::NEG_INFINITY), 0.0);
        assert!(weight_of(1e9).is_finite());
    }
}
