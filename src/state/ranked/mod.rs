//! `RankedIndex`: the ready index of an RPC with randomised selection (`Uniform`,
//! `Recency`, `Prioritized`), where a batch needs the entries at given age ranks, or the
//! entries where a running total of weights crosses given values, without walking the
//! whole index.
//!
//! Entries `(order key, slot, weight)` live in sorted blocks of at most [`MAX_BLOCK`]. A
//! sum tree over the blocks holds each block's count of live entries, weight sum and number
//! of weighted entries. Finding the entry at age rank `k`, or the entry where the weights'
//! running total crosses `u`, walks the tree (O(log blocks)) and then one block; inserting
//! or removing finds the block by binary search over the blocks' first keys, edits it in
//! place and updates the block's path up the tree. So a batch of `k` costs O(k log n)
//! whatever the capacity. A block that outgrows `MAX_BLOCK` splits, one whose live entries
//! fall below [`MIN_BLOCK`] merges into a neighbour; those rebuild the moved part of the
//! tree, at most once per `MIN_BLOCK` edits.
//!
//! Why blocks rather than a node per entry: a balanced tree over a million entries is some
//! twenty dependent cache misses per lookup. The tree over a few thousand blocks stays in
//! cache, so a lookup misses in one block only, and the order is the index's own (birth,
//! put order), never slot numbers, so a recovered buffer whose samples sit in other slots
//! draws the same batches.
//!
//! Removal leaves a tombstone: the entry stays where it is, marked absent in the block's
//! `live` bits (with no weight), and an insert of the same key revives it in place. A
//! leased sample goes back under the key it left with, so the take and release of a batch
//! shift no entries: in a cold index of a million samples, shifting half a block on every
//! take and release was most of a batch's cost. An insert of a new key compacts its block
//! first, so tombstones never outnumber what one block holds.
//!
//! Weights are `exp` of the `ln`-weights the buffer computes, with the exponent capped at
//! [`MAX_LN_WEIGHT`] so a million of the heaviest still sum to a finite number; a weight
//! that underflows to zero weighs nothing. A block's sum is always recomputed from its
//! weights, never updated by subtraction, so removing a heavy entry cannot leave a
//! rounding residue that would make a weightless entry drawable.

mod blocks;

use super::prefetch::prefetch;
use super::select::Rng;
use blocks::{low_bits, nth_set_bit, Block, Tree, GROUP};

/// Largest entries per block, live or tombstones (the width of a block's live bits); a
/// block past it splits in two.
const MAX_BLOCK: usize = 128;
/// A block with fewer live entries merges into a neighbour.
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

/// A position as a hint: block `<< 7 | position` (blocks beyond 2^25, four billion
/// entries, get none).
fn pack_hint(b: usize, at: usize) -> u32 {
    u32::try_from(b << 7 | at).unwrap_or(u32::MAX)
}

/// The position a hint names.
fn unpack_hint(hint: u32) -> (usize, usize) {
    ((hint >> 7) as usize, (hint & 127) as usize)
}

/// Eligible slots of one RPC ordered by their keys `K` (unique; the ready index's (birth,
/// put order)), with optional weights (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct RankedIndex<K> {
    blocks: Vec<Block<K>>,
    /// The first key of each block (live or not), for the binary search that finds a key's
    /// block.
    firsts: Vec<K>,
    tree: Tree,
    weighted: bool,
    /// Live entries.
    len: usize,
    /// Per slot, where its entry was when last removed (block `<< 7 | position`): a
    /// released lease puts its samples back under the keys they left with, and this finds
    /// the tombstone without the binary search through a cold block (some six dependent
    /// cache misses in a large index). Checked against the key before use, so a hint made
    /// stale by a split, merge or compaction only costs the search.
    hints: Vec<u32>,
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
            hints: Vec::new(),
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

    /// Adds `slot` under `key` (unique) with `weight` (ignored when unweighted). A key
    /// removed earlier whose tombstone is still in place comes back there.
    pub(crate) fn insert(&mut self, key: K, slot: u32, weight: f64) {
        if self.blocks.is_empty() {
            self.blocks.push(Block::default());
            self.firsts.push(key);
            self.tree.rebuild(&self.blocks);
        }
        let weight = if self.weighted { weight.max(0.0) } else { 0.0 };
        let (b, mut at) = match self.hinted(key, slot) {
            Some(position) => position,
            None => {
                let b = self.locate(key);
                (b, self.blocks[b].entries.partition_point(|e| e.0 < key))
            }
        };
        let block = &mut self.blocks[b];
        if block.entries.get(at).is_some_and(|e| e.0 == key) {
            // Revived in place (or, for a key already live, given the new slot and weight).
            if !block.is_live(at) {
                block.live |= 1 << at;
                self.len += 1;
            }
            block.entries[at].1 = slot;
            block.reweigh(at, weight);
            self.tree.update(b, &self.blocks[b]);
            return;
        }
        if block.live != low_bits(block.entries.len()) {
            block.compact();
            at = block.entries.partition_point(|e| e.0 < key);
        }
        block.entries.insert(at, (key, slot));
        if self.weighted {
            block.weights.insert(at, weight);
        }
        if at == 0 {
            self.firsts[b] = key;
        }
        self.len += 1;
        let n_blocks = self.blocks.len();
        if self.blocks[b].entries.len() > MAX_BLOCK {
            let tail = self.blocks[b].split_off(MAX_BLOCK / 2);
            self.firsts.insert(b + 1, tail.entries[0].0);
            self.blocks.insert(b + 1, tail);
            self.tree.refresh_from(b, &self.blocks, n_blocks);
        } else {
            let block = &mut self.blocks[b];
            block.live = low_bits(block.entries.len());
            block.recount();
            self.tree.update(b, &self.blocks[b]);
        }
    }

    /// Where `slot`'s entry under `key` was last removed, if it is still there.
    fn hinted(&self, key: K, slot: u32) -> Option<(usize, usize)> {
        let hint = *self.hints.get(slot as usize)?;
        let (b, at) = unpack_hint(hint);
        let entry = self.blocks.get(b)?.entries.get(at)?;
        (entry.0 == key).then_some((b, at))
    }

    /// The block and position of the live entry under `key`.
    fn find(&self, key: K) -> Option<(usize, usize)> {
        let b = self.locate(key);
        let block = self.blocks.get(b)?;
        let at = block.entries.binary_search_by(|e| e.0.cmp(&key)).ok()?;
        block.is_live(at).then_some((b, at))
    }

    /// Removes the entry under `key`; returns its slot.
    pub(crate) fn remove(&mut self, key: K) -> Option<u32> {
        let (b, at) = self.find(key)?;
        Some(self.remove_at(b, at))
    }

    /// Removes live entry `at` of block `b` (leaving a tombstone); returns its slot.
    fn remove_at(&mut self, b: usize, at: usize) -> u32 {
        let n_blocks = self.blocks.len();
        let block = &mut self.blocks[b];
        block.live &= !(1 << at);
        let slot = block.entries[at].1;
        block.reweigh(at, 0.0);
        let s = slot as usize;
        if s >= self.hints.len() {
            self.hints.resize(s + 1, u32::MAX);
        }
        self.hints[s] = pack_hint(b, at);
        self.len -= 1;
        let live = block.live_len();
        if live == 0 {
            self.blocks.remove(b);
            self.firsts.remove(b);
            self.tree.refresh_from(b, &self.blocks, n_blocks);
        } else if live < MIN_BLOCK && n_blocks > 1 {
            // Merge into the next block (or the previous, for the last one), splitting
            // again if the two are too many for one.
            let first = if b + 1 < self.blocks.len() { b } else { b - 1 };
            let mut second = self.blocks.remove(first + 1);
            self.firsts.remove(first + 1);
            self.blocks[first].append(&mut second);
            self.firsts[first] = self.blocks[first].entries[0].0;
            if self.blocks[first].entries.len() > MAX_BLOCK {
                let half = self.blocks[first].entries.len() / 2;
                let tail = self.blocks[first].split_off(half);
                self.firsts.insert(first + 1, tail.entries[0].0);
                self.blocks.insert(first + 1, tail);
            }
            self.tree.refresh_from(first, &self.blocks, n_blocks);
        } else {
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
            self.blocks[b].reweigh(at, weight.max(0.0));
            self.tree.update(b, &self.blocks[b]);
        }
    }

    /// The key and slot at age rank `k` (0 = oldest).
    pub(crate) fn at_rank(&self, k: usize) -> Option<(K, u32)> {
        let (b, at) = self.rank_position(k)?;
        self.blocks[b].entries.get(at).copied()
    }

    /// The block and position of age rank `k`.
    fn rank_position(&self, k: usize) -> Option<(usize, usize)> {
        if k >= self.len {
            return None;
        }
        let (b, k) = self.tree.find_rank(k);
        let block = self.blocks.get(b)?;
        (k < block.live_len()).then(|| (b, nth_set_bit(block.live, k as u32)))
    }

    /// Removes the entries at age ranks `ranks` (distinct, each below `len()`); returns
    /// their slots in the order given. Taken from the highest rank down, so each removal
    /// leaves the ranks still to take where they were.
    pub(crate) fn take_ranks(&mut self, ranks: &[usize]) -> Vec<u32> {
        // What the removals read, all at once, so the misses overlap: the tree is in cache,
        // the blocks are not. First each block's header (its live bits say where rank `k`
        // is), then the entries.
        let found = self
            .tree
            .find_ranks(ranks.iter().copied().filter(|&rank| rank < self.len));
        for &(b, _) in &found {
            if let Some(block) = self.blocks.get(b) {
                block.prefetch_header();
            }
        }
        for &(b, k) in &found {
            if let Some(block) = self.blocks.get(b).filter(|block| k < block.live_len()) {
                if let Some(entry) = block.entries.get(nth_set_bit(block.live, k as u32)) {
                    prefetch(entry);
                }
            }
        }
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
        self.blocks[b].entries.get(at).copied()
    }

    /// The block and position [`Self::at_weight`] finds (tombstones weigh nothing).
    fn weight_position(&self, unit: f64) -> Option<(usize, usize)> {
        if self.weighted_len() == 0 {
            return None;
        }
        let (b, u) = self.tree.find_weight(unit * self.tree.total_weight());
        Some((b, self.blocks.get(b)?.weighted_position(u)?))
    }

    /// Prefetches the weights and entries `n` weighted draws from `rng` would read. Each
    /// draw's removal changes the total by one weight, so the draws made against the
    /// index as it is now land, nearly always, in the blocks the real draws read.
    fn prefetch_draws(&self, n: usize, mut rng: Rng) {
        if self.weighted_len() == 0 {
            return;
        }
        let total = self.tree.total_weight();
        // Three passes, so the misses of each overlap: the blocks' headers and group
        // sums, then the group of weights each draw scans, then its entries.
        let found = self
            .tree
            .find_weights((0..n.min(self.len)).map(|_| rng.unit() * total));
        for &(b, _) in &found {
            if let Some(block) = self.blocks.get(b) {
                block.prefetch_header();
                block.prefetch_sums();
            }
        }
        let groups: Vec<(usize, usize)> = found
            .iter()
            .filter_map(|&(b, u)| Some((b, self.blocks.get(b)?.prefetch_weighted(u)?)))
            .collect();
        for (b, first) in groups {
            // The draw lands on one of the group's entries, which span a few lines.
            for entry in self.blocks[b].entries.iter().skip(first).take(GROUP) {
                prefetch(entry);
            }
        }
    }

    /// Prefetches what putting back `slots` (a released lease) will read: their hints,
    /// then the entries the hints point at.
    pub(crate) fn prefetch_returns(&self, slots: &[u32]) {
        for &s in slots {
            if let Some(hint) = self.hints.get(s as usize) {
                prefetch(hint);
            }
        }
        for &s in slots {
            let Some(&hint) = self.hints.get(s as usize) else {
                continue;
            };
            let (b, at) = unpack_hint(hint);
            if let Some(entry) = self.blocks.get(b).and_then(|block| block.entries.get(at)) {
                prefetch(entry);
            }
        }
    }

    /// Every live entry, oldest first.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (K, u32)> + '_ {
        self.blocks.iter().flat_map(|b| {
            b.entries
                .iter()
                .enumerate()
                .filter(|&(at, _)| b.is_live(at))
                .map(|(_, &e)| e)
        })
    }

    /// Whether `slot` is indexed under `key`.
    pub(crate) fn contains(&self, key: K, slot: u32) -> bool {
        self.find(key)
            .is_some_and(|(b, at)| self.blocks[b].entries[at].1 == slot)
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
        self.prefetch_draws(n, rng.clone());
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
        /// Puts back a removed or taken key (a released lease), with a new weight.
        Reinsert(usize, u8),
    }

    proptest! {
        // Each case is some 1,500 operations on up to a dozen blocks.
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// The index matches an ordered map entry for entry, rank for rank, and in its
        /// weighted counts, across inserts, removals, reweighting, weighted takes big
        /// enough to split and merge blocks, and removed keys put back (revived from their
        /// tombstones, or inserted anew once compacted away).
        #[test]
        fn matches_an_ordered_map(
            // Inserted first, so the ops below run on an index of many blocks.
            fill in prop::collection::vec((0u64..1000, 0u8..4), 0..1200),
            ops in prop::collection::vec(prop_oneof![
                6 => (0u64..1000, 0u8..4).prop_map(|(b, w)| Op::Insert(b, w)),
                3 => any::<usize>().prop_map(Op::Remove),
                1 => (any::<usize>(), 0u8..4).prop_map(|(i, w)| Op::Reweight(i, w)),
                1 => (1usize..40, any::<u64>()).prop_map(|(n, s)| Op::Take(n, s)),
                3 => (any::<usize>(), 0u8..4).prop_map(|(i, w)| Op::Reinsert(i, w)),
            ], 1..1500),
        ) {
            let mut ix = RankedIndex::new(true);
            let mut model: BTreeMap<Key, (u32, f64)> = BTreeMap::new();
            // Keys out of the index, with their slots, for `Reinsert`.
            let mut out: Vec<(Key, u32)> = Vec::new();
            let fill = fill.into_iter().map(|(birth, w)| Op::Insert(birth, w));
            for (seq, op) in fill.chain(ops).enumerate() {
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
                        prop_assert_eq!(ix.remove(key), None, "removed twice");
                        out.push((key, slot));
                    }
                    Op::Reinsert(pick, w) if !out.is_empty() => {
                        let (key, slot) = out.swap_remove(pick % out.len());
                        ix.insert(key, slot, f64::from(w));
                        model.insert(key, (slot, f64::from(w)));
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
                            out.push((key, *slot));
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(ix.len(), model.len());
                prop_assert_eq!(ix.weighted_len(), model.values().filter(|e| e.1 > 0.0).count());
                // Blocks stay between the bounds: thin ones merge, full ones split.
                for block in &ix.blocks {
                    prop_assert!(block.entries.len() <= MAX_BLOCK);
                    prop_assert!(ix.blocks.len() == 1 || block.live_len() >= MIN_BLOCK);
                }
            }
            prop_assert!(ix.iter().map(|e| e.1).eq(model.values().map(|e| e.0)));
            prop_assert!(ix.iter().rev().map(|e| e.1).eq(model.values().rev().map(|e| e.0)));
            for (key, slot) in &out {
                prop_assert!(!ix.contains(*key, *slot));
                prop_assert_eq!(ix.weight(*key), None);
            }
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
    fn the_walks_of_a_batch_land_where_single_walks_do() {
        // Many blocks, some thinned, weights uneven with weightless runs: the level-by-level
        // walks that prefetch a batch must find the blocks the draws themselves find.
        let mut ix = RankedIndex::new(true);
        for i in 0..5000u64 {
            ix.insert(
                key(i, i),
                i as u32,
                if i % 7 < 2 { 0.0 } else { (i % 13) as f64 },
            );
        }
        for i in (0..5000u64).step_by(3) {
            ix.remove(key(i, i));
        }
        let ranks: Vec<usize> = (0..ix.len()).step_by(37).collect();
        let singles: Vec<(usize, usize)> = ranks.iter().map(|&k| ix.tree.find_rank(k)).collect();
        assert_eq!(ix.tree.find_ranks(ranks.iter().copied()), singles);
        let total = ix.tree.total_weight();
        let targets: Vec<f64> = (0..200).map(|i| total * f64::from(i) / 200.0).collect();
        let singles: Vec<(usize, f64)> = targets.iter().map(|&u| ix.tree.find_weight(u)).collect();
        assert_eq!(ix.tree.find_weights(targets.iter().copied()), singles);
        assert!(singles.windows(2).all(|w| w[0].0 <= w[1].0), "{singles:?}");
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

    /// An unweighted index of keys `(i, i)` in slot `i`, for `i` in `0..n`, inserted in
    /// order (so blocks split at half: 64 entries each, the last up to 128).
    fn in_order(n: u64) -> RankedIndex<Key> {
        let mut ix = RankedIndex::new(false);
        for i in 0..n {
            ix.insert(key(i, i), i as u32, 0.0);
        }
        ix
    }

    /// Entries held, live or tombstones.
    fn physical_len(ix: &RankedIndex<Key>) -> usize {
        ix.blocks.iter().map(|b| b.entries.len()).sum()
    }

    #[test]
    fn a_returned_key_revives_its_tombstone_even_when_its_hint_is_stale() {
        // Three blocks (in-order inserts split at half): 0..64, 64..128, 128..200.
        let mut ix = in_order(200);
        assert_eq!(ix.blocks.len(), 3);
        // A tombstone in the last block, then the first block merged away: the last
        // block's index moves down one, and the tombstone's hint points past the end.
        assert_eq!(ix.remove(key(150, 150)), Some(150));
        assert_eq!(ix.remove(key(151, 151)), Some(151));
        for i in 0..64u64 {
            assert_eq!(ix.remove(key(i, i)), Some(i as u32));
        }
        assert_eq!(ix.blocks.len(), 2);
        let held = physical_len(&ix);
        ix.insert(key(150, 150), 150, 0.0);
        assert_eq!(
            physical_len(&ix),
            held,
            "revived in place, not inserted again"
        );
        assert_eq!((ix.len(), ix.remove(key(150, 150))), (135, Some(150)));
        assert!(ix
            .iter()
            .map(|e| e.1)
            .eq((64..200).filter(|&s| s != 150 && s != 151)));
    }

    #[test]
    fn a_block_merges_when_its_live_entries_fall_below_the_minimum() {
        let mut ix = in_order(200);
        assert_eq!(ix.blocks.len(), 3);
        let first_block = ix.blocks[0].entries.len() as u64;
        let keep = MIN_BLOCK as u64;
        for i in 0..first_block - keep {
            ix.remove(key(i, i));
        }
        assert_eq!((ix.blocks.len(), ix.blocks[0].live_len()), (3, MIN_BLOCK));
        ix.remove(key(first_block - keep, first_block - keep));
        assert_eq!(ix.blocks.len(), 2, "merged at {} live", MIN_BLOCK - 1);
        assert_eq!(physical_len(&ix), ix.len(), "merging compacts");
    }

    #[test]
    fn a_merge_too_large_for_one_block_splits_again() {
        // Blocks 0..64 and 64..192 (full).
        let mut ix = in_order(192);
        assert_eq!(
            ix.blocks
                .iter()
                .map(|b| b.entries.len())
                .collect::<Vec<_>>(),
            [64, 128]
        );
        for i in 0..49u64 {
            ix.remove(key(i, i));
        }
        // 15 live merged into 128: split again, each half within bounds.
        assert_eq!(ix.blocks.len(), 2);
        assert!(ix.blocks.iter().all(|b| b.entries.len() <= MAX_BLOCK));
        assert!(ix.iter().map(|e| e.1).eq(49..192));
        assert_eq!(ix.at_rank(100), Some((key(149, 149), 149)));
    }
}
