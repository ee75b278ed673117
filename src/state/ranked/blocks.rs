//! The storage under [`RankedIndex`](super::RankedIndex): sorted blocks of entries with
//! their tombstone bits and weight sums, and the implicit sum tree over the blocks. Plain
//! data with no lock of its own; the index owns one of each and keeps them in step.

use super::MAX_BLOCK;
use crate::state::prefetch::prefetch;

/// The first `n` bits set (`n <= 128`).
pub(super) fn low_bits(n: usize) -> u128 {
    if n >= 128 {
        u128::MAX
    } else {
        (1u128 << n) - 1
    }
}

/// The position of the `k`-th set bit of `bits` (0-based; `k` below its count).
pub(super) fn nth_set_bit(bits: u128, mut k: u32) -> usize {
    let low = bits as u64;
    let (mut word, mut base) = if k < low.count_ones() {
        (low, 0)
    } else {
        k -= low.count_ones();
        ((bits >> 64) as u64, 64)
    };
    // A byte at a time to the byte holding it, then a bit at a time: at most 8 + 7
    // steps, where clearing the lowest bit `k` times took up to 63.
    for _ in 0..8 {
        let in_byte = (word & 0xFF).count_ones();
        if k < in_byte {
            break;
        }
        k -= in_byte;
        word >>= 8;
        base += 8;
    }
    for _ in 0..k {
        word &= word.wrapping_sub(1);
    }
    base + word.trailing_zeros() as usize
}

/// Keeps the items of `v` whose bit in `live` is set (an empty `v` stays empty).
fn retain_live<T>(v: &mut Vec<T>, live: u128) {
    let mut at = 0;
    v.retain(|_| {
        at += 1;
        live & (1 << (at - 1)) != 0
    });
}

/// Entries per group of a block's weights (one cache line of them).
const GROUP: usize = 8;
/// Groups per block.
const GROUPS: usize = MAX_BLOCK.div_ceil(GROUP);

/// The sum of a group's weights, in order.
fn group_sum(weights: &[f64]) -> f64 {
    weights.iter().fold(0.0, |s, w| s + w)
}

/// The sum of a block's group sums, pairwise in a fixed order.
fn sum_of_groups(groups: &[f64; GROUPS]) -> f64 {
    let mut acc = [0.0f64; 4];
    for quad in groups.chunks_exact(4) {
        for (a, s) in acc.iter_mut().zip(quad) {
            *a += s;
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// One block of entries. Laid out by hand, a line at a time, because a draw in a cold
/// index pays a cache miss per line it touches: the first line holds what every lookup
/// reads (the live bits and where the entries and weights are), the next two the group
/// sums a weighted draw walks, the last the block's totals, which only a weighted index
/// reads.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub(super) struct Block<K> {
    /// Bit `i`: entry `i` is live.
    pub(super) live: u128,
    /// Sorted by key; live entries and tombstones.
    pub(super) entries: Vec<(K, u32)>,
    /// Per entry, `>= 0`, zero for a tombstone; empty in an unweighted index.
    pub(super) weights: Vec<f64>,
    /// Per group of [`GROUP`] consecutive entries, the sum of their weights: a weight
    /// change recomputes its group and then the block's sum from the groups, and a
    /// weighted draw walks the groups before it scans one group's weights.
    groups: [f64; GROUPS],
    pub(super) sum: f64,
    /// Live entries with a weight above zero.
    pub(super) weighted: u32,
}

impl<K> Default for Block<K> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            weights: Vec::new(),
            live: 0,
            groups: [0.0; GROUPS],
            sum: 0.0,
            weighted: 0,
        }
    }
}

impl<K: Copy> Block<K> {
    /// Recomputes the group sums, `sum` and `weighted` from the weights (after entries
    /// moved). Every sum is added in a fixed order, so the result depends on the weights
    /// only, never on the edits that led to them.
    pub(super) fn recount(&mut self) {
        self.groups = [0.0; GROUPS];
        for (g, group) in self.weights.chunks(GROUP).enumerate() {
            self.groups[g] = group_sum(group);
        }
        self.sum = sum_of_groups(&self.groups);
        self.weighted = self.weights.iter().filter(|&&w| w > 0.0).count() as u32;
    }

    /// Sets entry `at`'s weight (`>= 0`) and the sums over it.
    pub(super) fn reweigh(&mut self, at: usize, weight: f64) {
        let Some(cell) = self.weights.get_mut(at) else {
            return;
        };
        let was = std::mem::replace(cell, weight);
        if (was > 0.0) != (weight > 0.0) {
            if weight > 0.0 {
                self.weighted += 1;
            } else {
                self.weighted -= 1;
            }
        }
        let g = at / GROUP;
        let end = (g * GROUP + GROUP).min(self.weights.len());
        self.groups[g] = group_sum(&self.weights[g * GROUP..end]);
        self.sum = sum_of_groups(&self.groups);
    }

    /// The weighted entry where the running total of weights crosses `u` (in
    /// `[0, sum)`): the group first, then the entry in it. Past the last weighted entry
    /// (rounding), the last one.
    pub(super) fn weighted_position(&self, u: f64) -> Option<usize> {
        let (g, u) = self.weighted_group(u)?;
        self.position_in_group(g, u)
    }

    /// The group of [`Self::weighted_position`], and what is left of `u` there.
    pub(super) fn weighted_group(&self, mut u: f64) -> Option<(usize, f64)> {
        let mut last_group = None;
        for (g, &s) in self.groups.iter().enumerate() {
            if s > 0.0 {
                last_group = Some((g, u));
                if u < s {
                    break;
                }
                u -= s;
            }
        }
        last_group
    }

    /// The weighted entry of group `g` where the running total of its weights crosses
    /// `u` (what [`Self::weighted_group`] left of it); past the last, the last one.
    pub(super) fn position_in_group(&self, g: usize, mut u: f64) -> Option<usize> {
        let start = g * GROUP;
        let group = self
            .weights
            .get(start..(start + GROUP).min(self.weights.len()))?;
        let mut last = None;
        for (at, &w) in group.iter().enumerate() {
            if w > 0.0 {
                last = Some(start + at);
                if u < w {
                    break;
                }
                u -= w;
            }
        }
        last
    }

    /// Prefetches the weights of group `g`.
    pub(super) fn prefetch_group(&self, g: usize) {
        if let Some(w) = self.weights.get(g * GROUP) {
            prefetch(w);
        }
    }

    /// Prefetches the line of entry `at`'s slot, which taking it reads.
    pub(super) fn prefetch_entry(&self, at: usize) {
        if let Some(entry) = self.entries.get(at) {
            prefetch(&entry.1);
        }
    }

    /// Prefetches the line every lookup in the block reads first: its live bits and
    /// where its entries and weights are.
    pub(super) fn prefetch_header(&self) {
        prefetch(&self.live);
    }

    /// Prefetches what a weighted draw reads next: the group sums it walks, and the
    /// block's totals its removal rewrites.
    pub(super) fn prefetch_sums(&self) {
        for quad in self.groups.chunks(GROUP) {
            prefetch(&quad[0]);
        }
        prefetch(&self.sum);
    }

    /// Live entries.
    pub(super) fn live_len(&self) -> usize {
        self.live.count_ones() as usize
    }

    pub(super) fn is_live(&self, at: usize) -> bool {
        at < MAX_BLOCK && self.live & (1 << at) != 0
    }

    /// Drops the tombstones.
    pub(super) fn compact(&mut self) {
        if self.live == low_bits(self.entries.len()) {
            return;
        }
        retain_live(&mut self.entries, self.live);
        retain_live(&mut self.weights, self.live);
        self.live = low_bits(self.entries.len());
    }

    /// Moves the entries from `at` on into a new block; both have no tombstones.
    pub(super) fn split_off(&mut self, at: usize) -> Block<K> {
        self.compact();
        let weights = if self.weights.is_empty() {
            Vec::new()
        } else {
            self.weights.split_off(at)
        };
        let mut tail = Block {
            entries: self.entries.split_off(at),
            weights,
            ..Block::default()
        };
        // The head grew past `MAX_BLOCK` to split: give back the doubled capacity, which
        // would leave its entries spread over twice the memory (and pages) they fill.
        self.entries.shrink_to(MAX_BLOCK);
        self.weights.shrink_to(MAX_BLOCK);
        self.live = low_bits(self.entries.len());
        tail.live = low_bits(tail.entries.len());
        self.recount();
        tail.recount();
        tail
    }

    /// Appends `other`'s live entries; leaves no tombstones. A block left over
    /// `MAX_BLOCK` entries must be split next ([`Self::split_off`] recounts both halves):
    /// its sums are not recounted here, as `groups` has room for `MAX_BLOCK` weights only.
    pub(super) fn append(&mut self, other: &mut Block<K>) {
        self.compact();
        other.compact();
        self.entries.append(&mut other.entries);
        self.weights.append(&mut other.weights);
        self.live = low_bits(self.entries.len().min(MAX_BLOCK));
        if self.entries.len() <= MAX_BLOCK {
            self.recount();
        }
    }
}

/// The sums over the blocks, as an implicit binary tree: node 1 is the root, node `i` has
/// children `2i` and `2i + 1`, and the block `b` is leaf `leaves + b`. Each node keeps its
/// count of live entries (`counts`, four bytes); a weighted index also keeps its weight sum
/// (`sums`, eight bytes, in an array of its own): a rank walk then reads only counts and a
/// weighted walk only sums, so each reads the fewest lines, and the lower levels of a
/// million-entry index (16K leaves) stay in the core's caches. A parent is always
/// recomputed from its children (no subtraction).
///
/// No node keeps a count of weighted entries: weights are `>= 0` and a part holds one
/// above zero exactly when its sum is above zero (a sum of non-negative numbers one of
/// which is positive is positive, rounding included), so a weighted walk turns on the
/// sums alone. The index's total count of weighted entries is kept beside the tree, from
/// each leaf's count.
#[derive(Debug, Clone, Default)]
pub(super) struct Tree {
    leaves: usize,
    /// Per node: live entries below it.
    counts: Vec<u32>,
    /// Per node of a weighted tree: the weight below it (empty when unweighted).
    sums: Vec<f64>,
    /// Per leaf of a weighted tree: its block's weighted entries (empty when unweighted).
    leaf_weighted: Vec<u32>,
    /// The sum of `leaf_weighted`.
    weighted_total: u32,
    weighted: bool,
}

impl Tree {
    pub(super) fn new(weighted: bool) -> Self {
        Self {
            weighted,
            ..Self::default()
        }
    }

    pub(super) fn rebuild<K: Copy>(&mut self, blocks: &[Block<K>]) {
        self.leaves = blocks.len().next_power_of_two().max(1);
        self.counts.clear();
        self.sums.clear();
        self.leaf_weighted.clear();
        self.weighted_total = 0;
        self.counts.resize(2 * self.leaves, 0);
        if self.weighted {
            self.sums.resize(2 * self.leaves, 0.0);
            self.leaf_weighted.resize(self.leaves, 0);
        }
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
    pub(super) fn refresh_from<K: Copy>(
        &mut self,
        from: usize,
        blocks: &[Block<K>],
        old_len: usize,
    ) {
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
                None => self.set_leaf_totals(b, 0, 0, 0.0),
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

    /// Sets leaf `b` to `count` live entries, `weighted` of them weighing `sum`.
    fn set_leaf_totals(&mut self, b: usize, count: u32, weighted: u32, sum: f64) {
        let i = self.leaves + b;
        if let Some(c) = self.counts.get_mut(i) {
            *c = count;
        }
        if let Some(s) = self.sums.get_mut(i) {
            *s = sum;
        }
        if let Some(w) = self.leaf_weighted.get_mut(b) {
            let was = std::mem::replace(w, weighted);
            self.weighted_total = self.weighted_total - was + weighted;
        }
    }

    fn set_leaf<K: Copy>(&mut self, b: usize, block: &Block<K>) {
        // An unweighted index reads only the live bits: the totals sit on another line
        // of the block, cold when a batch is taken from a large index.
        let count = block.live_len() as u32;
        if self.weighted {
            self.set_leaf_totals(b, count, block.weighted, block.sum);
        } else {
            self.set_leaf_totals(b, count, 0, 0.0);
        }
    }

    fn combine(&mut self, i: usize) {
        self.counts[i] = self.counts[2 * i] + self.counts[2 * i + 1];
        if self.weighted {
            self.sums[i] = self.sums[2 * i] + self.sums[2 * i + 1];
        }
    }

    /// Sets block `b`'s leaf and recomputes its ancestors. The new totals are carried up
    /// in registers and each level adds its sibling (`a + b == b + a` exactly, so this is
    /// the same sum [`Self::combine`] makes): the siblings' loads do not wait on each
    /// other, only the adds do, where reading each parent back after storing it made every
    /// level wait on the one below.
    pub(super) fn update<K: Copy>(&mut self, b: usize, block: &Block<K>) {
        let mut i = self.leaves + b;
        if i >= self.counts.len() {
            return;
        }
        self.set_leaf(b, block);
        let mut count = self.counts[i];
        if !self.weighted {
            while i > 1 {
                count += self.counts[i ^ 1];
                i /= 2;
                self.counts[i] = count;
            }
            return;
        }
        let mut sum = self.sums[i];
        while i > 1 {
            count += self.counts[i ^ 1];
            sum += self.sums[i ^ 1];
            i /= 2;
            self.counts[i] = count;
            self.sums[i] = sum;
        }
    }

    /// Where the tree disagrees with `blocks`: a leaf that is not its block's totals, a
    /// node that is not the sum of its children, or a total of weighted entries that is
    /// not the leaves'.
    #[cfg(test)]
    pub(super) fn check<K: Copy>(&self, blocks: &[Block<K>]) -> Result<(), String> {
        let node = |i: usize| {
            let sum = self.sums.get(i).copied().unwrap_or(0.0);
            self.counts.get(i).map(|&c| (c, sum))
        };
        let sums_len = if self.weighted { 2 * self.leaves } else { 0 };
        if self.counts.len() != 2 * self.leaves
            || self.sums.len() != sums_len
            || blocks.len() > self.leaves
        {
            return Err(format!(
                "{} nodes, {} sums for {} blocks",
                self.counts.len(),
                self.sums.len(),
                blocks.len()
            ));
        }
        // Node 0 is no node (the root is 1): nothing may write it.
        if node(0).is_some_and(|n| n != (0, 0.0)) {
            return Err("node 0 written".into());
        }
        let mut weighted = 0;
        for b in 0..self.leaves {
            let want = blocks.get(b).map_or((0, 0, 0.0), |block| {
                let (weighted, sum) = if self.weighted {
                    (block.weighted, block.sum)
                } else {
                    (0, 0.0)
                };
                (block.live_len() as u32, weighted, sum)
            });
            let leaf_weighted = self.leaf_weighted.get(b).copied().unwrap_or(0);
            if node(self.leaves + b) != Some((want.0, want.2)) || leaf_weighted != want.1 {
                return Err(format!("leaf of block {b}"));
            }
            weighted += want.1;
        }
        if self.weighted_total != weighted {
            return Err(format!(
                "{} weighted entries, not {weighted}",
                self.weighted_total
            ));
        }
        for i in 1..self.leaves {
            let (l, r) = (node(2 * i), node(2 * i + 1));
            let sum = l.zip(r).map(|(l, r)| (l.0 + r.0, l.1 + r.1));
            if node(i) != sum {
                return Err(format!("node {i}"));
            }
        }
        Ok(())
    }

    pub(super) fn total_weight(&self) -> f64 {
        self.sums.get(1).copied().unwrap_or(0.0)
    }

    pub(super) fn weighted_entries(&self) -> u32 {
        self.weighted_total
    }

    /// The block holding live rank `k` (below the total count) and the rank within it.
    pub(super) fn find_rank(&self, k: usize) -> (usize, usize) {
        let mut walk = [(1, k)];
        self.walk_ranks(&mut walk);
        walk[0]
    }

    /// Takes each walk `(node, rank)` from the root down to its block, level by level
    /// together. Each step is branch-free: which way a walk turns is a coin toss a branch
    /// predictor loses half the time, and without branches the walks of a batch's ranks
    /// overlap.
    fn walk_ranks(&self, walks: &mut [(usize, usize)]) {
        let mut level = 1;
        while level < self.leaves {
            for (i, k) in walks.iter_mut() {
                let here = self.counts[2 * *i] as usize;
                let right = usize::from(*k >= here);
                *k -= here * right;
                *i = 2 * *i + right;
            }
            level *= 2;
        }
        for (i, _) in walks.iter_mut() {
            *i -= self.leaves;
        }
    }

    /// One level of a walk to where the running weight crosses `u`, from node `i` (see
    /// [`Self::find_weight`]). A part holds a weighted entry exactly when its sum is above
    /// zero (see [`Tree`]). Branch-free, as [`Self::walk_ranks`]; the subtraction is a
    /// product, not a select, because LLVM turns a float select into a branch.
    #[inline(always)]
    fn weight_step(&self, i: &mut usize, u: &mut f64) {
        let (left, right) = (self.sums[2 * *i], self.sums[2 * *i + 1]);
        let go_left = (left > 0.0) & ((*u < left) | (right <= 0.0));
        *u -= left * f64::from(u8::from(!go_left));
        *i = 2 * *i + usize::from(!go_left);
    }

    /// [`Self::find_rank`] of each of `ranks`, the walks taken level by level together:
    /// one walk's loads each wait for the one before, but at one level the walks' loads
    /// are independent, so where the lower levels are out of cache their misses overlap.
    pub(super) fn find_ranks(&self, ranks: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
        let mut walks: Vec<(usize, usize)> = ranks.map(|k| (1, k)).collect();
        self.walk_ranks(&mut walks);
        walks
    }

    /// [`Self::find_weight`] of each of `targets`, level by level together (see
    /// [`Self::find_ranks`]).
    pub(super) fn find_weights(&self, targets: impl Iterator<Item = f64>) -> Vec<(usize, f64)> {
        let mut walks: Vec<(usize, f64)> = targets.map(|u| (1, u)).collect();
        let mut level = 1;
        while level < self.leaves {
            for (i, u) in &mut walks {
                self.weight_step(i, u);
            }
            level *= 2;
        }
        for (i, u) in &mut walks {
            *i -= self.leaves;
            *u = u.max(0.0);
        }
        walks
    }

    /// The block where the running weight total crosses `u` (in `[0, total)`), and what is
    /// left of `u` there. Only ever descends into a part holding a weighted entry, so
    /// rounding cannot land on a weightless block.
    pub(super) fn find_weight(&self, mut u: f64) -> (usize, f64) {
        let mut i = 1;
        while i < self.leaves {
            self.weight_step(&mut i, &mut u);
        }
        (i - self.leaves, u.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The layout [`Block`] documents: what every lookup reads on the first line, the group
    /// sums on the next two, the totals after them.
    #[test]
    fn a_block_keeps_what_a_lookup_reads_on_its_first_line() {
        type B = Block<(u64, u64)>;
        assert_eq!(align_of::<B>(), 64);
        assert_eq!(offset_of!(B, live), 0);
        assert!(offset_of!(B, entries) + size_of::<Vec<((u64, u64), u32)>>() <= 64);
        assert!(offset_of!(B, weights) + size_of::<Vec<f64>>() <= 64);
        assert_eq!(offset_of!(B, groups), 64);
        assert_eq!(offset_of!(B, sum), 64 + 8 * GROUPS);
    }

    /// A block whose entries weigh `weights`, all live.
    fn block_of(weights: &[f64]) -> Block<u64> {
        let mut block = Block {
            entries: (0..weights.len() as u64).map(|i| (i, i as u32)).collect(),
            weights: weights.to_vec(),
            live: low_bits(weights.len()),
            ..Block::default()
        };
        block.recount();
        block
    }

    #[test]
    fn each_weighted_entry_owns_a_half_open_stretch_and_past_the_end_is_the_last() {
        // Three groups of eight: entries 0 and 1 weigh 1 and 2, entry 9 (the second group)
        // weighs 1, the rest nothing. Entry `i` owns [total before it, total up to it).
        let mut weights = vec![0.0; 24];
        (weights[0], weights[1], weights[9]) = (1.0, 2.0, 1.0);
        let block = block_of(&weights);
        assert_eq!(block.sum, 4.0);
        let found: Vec<Option<usize>> = [0.0, 0.999, 1.0, 2.999, 3.0, 3.5]
            .into_iter()
            .map(|u| block.weighted_position(u))
            .collect();
        assert_eq!(
            found,
            [Some(0), Some(0), Some(1), Some(1), Some(9), Some(9)]
        );
        // Past the total (rounding): the last weighted entry, never a weightless entry or
        // group after it.
        assert_eq!(block.weighted_position(4.0), Some(9));
        assert_eq!(block.weighted_position(7.0), Some(9));
    }

    #[test]
    fn each_weighted_block_owns_a_half_open_stretch_and_past_the_end_is_the_last() {
        // Blocks weighing 1, 0, 2 and 0: block 0 owns [0, 1), block 2 [1, 3), and a draw
        // exactly on a boundary belongs to the block after it.
        let blocks: Vec<Block<u64>> = [1.0, 0.0, 2.0, 0.0]
            .into_iter()
            .map(|w| block_of(&[w]))
            .collect();
        let mut tree = Tree::new(true);
        tree.rebuild(&blocks);
        assert_eq!(tree.total_weight(), 3.0);
        let found: Vec<(usize, f64)> = [0.0, 0.5, 1.0, 2.5]
            .into_iter()
            .map(|u| tree.find_weight(u))
            .collect();
        assert_eq!(found, [(0, 0.0), (0, 0.5), (2, 0.0), (2, 1.5)]);
        // Past the total (rounding): the last weighted block, with what is left there,
        // never the weightless one after it.
        assert_eq!(tree.find_weight(3.0), (2, 2.0));
        assert_eq!(tree.find_weight(9.0), (2, 8.0));
        assert_eq!(tree.check(&blocks), Ok(()));
    }

    /// A part holds a weighted entry exactly when its sum is above zero, however small
    /// the weights: a walk never turns into a weightless part, and the count of weighted
    /// entries is the leaves'.
    #[test]
    fn the_smallest_weights_still_steer_a_walk() {
        let tiny = f64::from_bits(1); // the smallest subnormal
        let blocks: Vec<Block<u64>> = [0.0, tiny, 0.0, tiny, 0.0]
            .into_iter()
            .map(|w| block_of(&[w, 0.0]))
            .collect();
        let mut tree = Tree::new(true);
        tree.rebuild(&blocks);
        assert_eq!(tree.weighted_entries(), 2);
        assert_eq!(tree.total_weight(), 2.0 * tiny);
        assert_eq!(tree.find_weight(0.0).0, 1);
        assert_eq!(tree.find_weight(tiny).0, 3);
        assert_eq!(tree.find_weight(1.0).0, 3);
        assert_eq!(tree.check(&blocks), Ok(()));
    }

    #[test]
    fn no_position_beyond_a_blocks_width_is_live() {
        let block = block_of(&[1.0; MAX_BLOCK]);
        assert!(block.is_live(MAX_BLOCK - 1));
        assert!(!block.is_live(MAX_BLOCK));
        assert!(!block.is_live(usize::MAX));
    }
}
