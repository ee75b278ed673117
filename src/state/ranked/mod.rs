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
//! A batch finds all its entries in the index as it is, then removes them together
//! (tombstones first, then each block it touched rebalanced, the last first), so its tree
//! walks go level by level side by side and its misses overlap rather than queue. Weighted
//! batches draw with replacement and draw a repeat again, which is exactly successive
//! sampling without replacement (see [`RankedIndex::take_weighted`]).
//!
//! Weights are `exp` of the `ln`-weights the buffer computes, with the exponent capped at
//! [`MAX_LN_WEIGHT`] so a million of the heaviest still sum to a finite number; a weight
//! that underflows to zero weighs nothing. A block's sum is always recomputed from its
//! weights, never updated by subtraction, so removing a heavy entry cannot leave a
//! rounding residue that would make a weightless entry drawable.

mod blocks;

use super::prefetch::prefetch;
use super::select::Rng;
use blocks::{low_bits, nth_set_bit, Block, Tree};

/// Largest entries per block, live or tombstones (the width of a block's live bits); a
/// block past it splits in two.
const MAX_BLOCK: usize = 128;
/// A block with fewer live entries merges into a neighbour.
const MIN_BLOCK: usize = 16;
/// Where a last block that a key past its end overflows splits (see
/// [`RankedIndex::insert`]): the entries before it stay, the `2 * MIN_BLOCK` from it on
/// start a new block.
const APPEND_SPLIT: usize = MAX_BLOCK + 1 - 2 * MIN_BLOCK;
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

/// Most positions [`Hints`] remembers: 64 KiB of them, which stay in the core's cache.
const MAX_HINTS: usize = 8192;

/// Where the entries of recently removed slots were, as packed hints: a direct-mapped
/// table of `(slot, hint)` indexed by the slot's low bits. Up to [`MAX_HINTS`] slots it
/// remembers every slot; beyond, a slot shares its place with the others of the same low
/// bits and the latest removal wins. That loses no hint a release needs unless more
/// than a few thousand samples are out on leases at once, and a lost hint costs only a
/// search. A table with a place per slot of a million-sample buffer (4 MiB) put one more
/// cold line per sample on every take and release.
#[derive(Debug, Clone, Default)]
struct Hints {
    /// `(slot, hint)`; `u32::MAX` as the slot: empty. A power of two in length.
    places: Vec<(u32, u32)>,
}

impl Hints {
    fn place(&self, slot: u32) -> Option<&(u32, u32)> {
        let mask = self.places.len().checked_sub(1)?;
        self.places.get(slot as usize & mask)
    }

    /// The hint last set for `slot`, if no other slot has taken its place since.
    fn get(&self, slot: u32) -> Option<u32> {
        self.place(slot)
            .and_then(|&(owner, hint)| (owner == slot).then_some(hint))
    }

    fn set(&mut self, slot: u32, hint: u32) {
        let s = slot as usize;
        if s >= self.places.len() && self.places.len() < MAX_HINTS {
            // Grow, keeping what is remembered (a slot's place only moves to a larger
            // index as the table doubles).
            let len = (s + 1).next_power_of_two().min(MAX_HINTS);
            let old = std::mem::replace(&mut self.places, vec![(u32::MAX, u32::MAX); len]);
            for (owner, hint) in old.into_iter().filter(|p| p.0 != u32::MAX) {
                self.places[owner as usize & (len - 1)] = (owner, hint);
            }
        }
        let mask = self.places.len() - 1;
        self.places[s & mask] = (slot, hint);
    }

    fn prefetch(&self, slot: u32) {
        if let Some(place) = self.place(slot) {
            prefetch(place);
        }
    }
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
    /// Where recently removed entries were: a released lease puts its samples back under
    /// the keys they left with, and this finds the tombstone without the binary search
    /// through a cold block (some six dependent cache misses in a large index). See
    /// [`Hints`].
    hints: Hints,
}

impl<K: Ord + Copy> RankedIndex<K> {
    /// An empty index; `weighted` keeps a weight per entry.
    pub(crate) fn new(weighted: bool) -> Self {
        Self {
            blocks: Vec::new(),
            firsts: Vec::new(),
            tree: Tree::new(weighted),
            weighted,
            len: 0,
            hints: Hints::default(),
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
            // A key past the last one (the ready index's usual put: the newest sample)
            // leaves the last block 3/4 full and starts a new one, so blocks filled in
            // order are denser than half: fewer headers, and entries over fewer pages, for
            // a draw in a large index. The new block starts with `2 * MIN_BLOCK`, so it
            // takes `MIN_BLOCK + 1` removals to merge it back (a block split right at
            // `MIN_BLOCK` merged again at the next removal, and split at the next put).
            let appended = b + 1 == n_blocks && at == MAX_BLOCK;
            let split_at = if appended {
                APPEND_SPLIT
            } else {
                MAX_BLOCK / 2
            };
            let tail = self.blocks[b].split_off(split_at);
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
        let (b, at) = unpack_hint(self.hints.get(slot)?);
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
        let slot = self.tombstone(b, at);
        self.rebalance(b);
        slot
    }

    /// Marks entry `at` of block `b` removed (live, or with only its live bit cleared),
    /// leaving the blocks as they are (the tree is not updated: see
    /// [`Self::rebalance`]); returns its slot. Positions in
    /// other blocks, and the other positions of this one, stay where they were.
    fn tombstone(&mut self, b: usize, at: usize) -> u32 {
        let block = &mut self.blocks[b];
        block.live &= !(1 << at);
        let slot = block.entries[at].1;
        block.reweigh(at, 0.0);
        self.hints.set(slot, pack_hint(b, at));
        self.len -= 1;
        slot
    }

    /// Brings block `b` back within bounds after removals from it, and the tree up to
    /// date: an empty block goes, a thin one merges into a neighbour. Blocks after `b` may
    /// move; blocks before it keep their places, except the one before the last block.
    fn rebalance(&mut self, b: usize) {
        let n_blocks = self.blocks.len();
        let Some(live) = self.blocks.get(b).map(Block::live_len) else {
            return;
        };
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
    }

    /// Removes the entries at `positions` (distinct, live) all at once: tombstones first,
    /// so no removal moves the positions still to take, then each block touched brought
    /// back within bounds, the last first. Returns the slots in the order given.
    fn take_positions(&mut self, positions: &[(usize, usize)]) -> Vec<u32> {
        // Each tombstone writes its slot's hint: those lines first, all at once.
        for &(b, at) in positions {
            if let Some(entry) = self.blocks[b].entries.get(at) {
                self.hints.prefetch(entry.1);
            }
        }
        let slots = positions
            .iter()
            .map(|&(b, at)| self.tombstone(b, at))
            .collect();
        let mut touched: Vec<usize> = positions.iter().map(|p| p.0).collect();
        touched.sort_unstable();
        touched.dedup();
        // Each block's rebalance also brings its path in the tree up to date, so the
        // last one done, the lowest, leaves every shared ancestor right.
        for &b in touched.iter().rev() {
            self.rebalance(b);
        }
        slots
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
    /// their slots in the order given. Every rank is found in the index as it is before
    /// the first removal.
    pub(crate) fn take_ranks(&mut self, ranks: &[usize]) -> Vec<u32> {
        // The walks of all ranks together, then what the removals read, all at once, so
        // the misses overlap: the tree is in cache, the blocks are not. First each
        // block's header (its live bits say where rank `k` is), then the entries.
        let found = self
            .tree
            .find_ranks(ranks.iter().copied().filter(|&rank| rank < self.len));
        for &(b, _) in &found {
            if let Some(block) = self.blocks.get(b) {
                block.prefetch_header();
            }
        }
        let positions: Vec<(usize, usize)> = found
            .iter()
            .filter_map(|&(b, k)| {
                let block = self.blocks.get(b).filter(|block| k < block.live_len())?;
                let at = nth_set_bit(block.live, k as u32);
                prefetch(block.entries.get(at)?);
                Some((b, at))
            })
            .collect();
        debug_assert_eq!(positions.len(), ranks.len(), "ranks beyond the index");
        debug_assert!(
            {
                let mut distinct = positions.clone();
                distinct.sort_unstable();
                distinct.windows(2).all(|w| w[0] != w[1])
            },
            "ranks repeated"
        );
        self.take_positions(&positions)
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

    /// The positions of the weighted draws that walked the tree to `found`, in passes so
    /// the misses of each overlap: the blocks' first lines and group sums, then the group
    /// of weights each draw scans; then, with the positions known, each drawn entry's
    /// line, which taking it reads. `None`: a block with no weight (not expected).
    fn draw_positions(&self, found: &[(usize, f64)]) -> Vec<(usize, Option<usize>)> {
        for &(b, _) in found {
            if let Some(block) = self.blocks.get(b) {
                block.prefetch_header();
                block.prefetch_sums();
            }
        }
        let groups: Vec<Option<(usize, f64)>> = found
            .iter()
            .map(|&(b, u)| {
                let block = self.blocks.get(b)?;
                let (g, u) = block.weighted_group(u)?;
                block.prefetch_group(g);
                Some((g, u))
            })
            .collect();
        // Consuming `groups` lets the collect reuse its allocation (same size and
        // alignment): one allocation less per batch.
        let drawn: Vec<(usize, Option<usize>)> = groups
            .into_iter()
            .zip(found)
            .map(|(group, &(b, _))| {
                let at = group.and_then(|(g, u)| self.blocks.get(b)?.position_in_group(g, u));
                (b, at)
            })
            .collect();
        for &(b, at) in &drawn {
            if let (Some(block), Some(at)) = (self.blocks.get(b), at) {
                block.prefetch_entry(at);
            }
        }
        drawn
    }

    /// Prefetches what putting back `slots` (a released lease) will read: their hints,
    /// then the entries the hints point at.
    pub(crate) fn prefetch_returns(&self, slots: &[u32]) {
        for &s in slots {
            self.hints.prefetch(s);
        }
        for &s in slots {
            let Some(hint) = self.hints.get(s) else {
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
    ///
    /// The weighted draws are made with replacement against the index as it is, a repeat
    /// drawn again: given the entries taken so far, the next distinct entry is each
    /// remaining one with its share of the remaining weight, as a draw without
    /// replacement would be, and draws against one tree can walk it together. When
    /// repeats pile up (a batch taking most of the weight), the rest are drawn one at a
    /// time from the index with the taken entries removed.
    pub(crate) fn take_weighted(&mut self, n: usize, rng: &mut Rng) -> Vec<u32> {
        let n = n.min(self.len);
        let want = n.min(self.weighted_len());
        let total = self.tree.total_weight();
        let mut positions: Vec<(usize, usize)> = Vec::with_capacity(n);
        let mut repeats = 0;
        while positions.len() < want && repeats <= want {
            let need = want - positions.len();
            let found = self
                .tree
                .find_weights((0..need).map(|_| rng.unit() * total));
            for (b, at) in self.draw_positions(&found) {
                // Taken ones are marked by their live bit alone until all are drawn: their
                // weights stay, so every draw is against the same weights. A draw of one
                // taken already is a repeat; so is one that found no entry (not expected:
                // a walk only ends in a block with weight), so the loop ends whatever the
                // draws find.
                match at.filter(|&at| self.blocks[b].is_live(at)) {
                    Some(at) => {
                        self.blocks[b].live &= !(1 << at);
                        positions.push((b, at));
                    }
                    None => repeats += 1,
                }
            }
        }
        // Each pass below takes one entry while `out` is short of `n <= len`: the index
        // is never empty there.
        let mut out = self.take_positions(&positions);
        while out.len() < n {
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
mod tests;
