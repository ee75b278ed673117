//! Tests of the ranked index against an ordered map, and of its draws' distributions.

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
    /// Inserts a key past every key (a birth above any `Insert`'s): the ready index's usual
    /// put, which splits the last block at [`APPEND_SPLIT`].
    Append(u8),
    Remove(usize),
    Reweight(usize, u8),
    Take(usize, u64),
    /// Takes the entries at distinct age ranks (picked by these numbers).
    TakeRanks(Vec<usize>),
    /// Puts back a removed or taken key (a released lease), with a new weight.
    Reinsert(usize, u8),
}

proptest! {
    // Each case is some 1,500 operations on up to a dozen blocks.
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The index, weighted or not, matches an ordered map entry for entry, rank for
    /// rank, and in its weighted counts, across inserts, removals, reweighting, weighted takes and takes
    /// by rank big enough to split and merge blocks, and removed keys put back (revived
    /// from their tombstones, or inserted anew once compacted away).
    #[test]
    fn matches_an_ordered_map(
        weighted in any::<bool>(),
        // Inserted first, so the ops below run on an index of many blocks.
        fill in prop::collection::vec((0u64..1000, 0u8..4), 0..1200),
        ops in prop::collection::vec(prop_oneof![
            6 => (0u64..1000, 0u8..4).prop_map(|(b, w)| Op::Insert(b, w)),
            3 => (0u8..4).prop_map(Op::Append),
            3 => any::<usize>().prop_map(Op::Remove),
            1 => (any::<usize>(), 0u8..4).prop_map(|(i, w)| Op::Reweight(i, w)),
            1 => (1usize..40, any::<u64>()).prop_map(|(n, s)| Op::Take(n, s)),
            1 => prop::collection::vec(any::<usize>(), 1..70).prop_map(Op::TakeRanks),
            3 => (any::<usize>(), 0u8..4).prop_map(|(i, w)| Op::Reinsert(i, w)),
        ], 1..1500),
    ) {
        let mut ix = RankedIndex::new(weighted);
        let mut model: BTreeMap<Key, (u32, f64)> = BTreeMap::new();
        // An unweighted index keeps no weights: every entry weighs nothing.
        let weight = |w: u8| if weighted { f64::from(w) } else { 0.0 };
        // Keys out of the index, with their slots, for `Reinsert`.
        let mut out: Vec<(Key, u32)> = Vec::new();
        let fill = fill.into_iter().map(|(birth, w)| Op::Insert(birth, w));
        for (seq, op) in fill.chain(ops).enumerate() {
            // Births of `Insert` are below 1,000: this one is past them all.
            let op = match op {
                Op::Append(w) => Op::Insert(1000 + seq as u64, w),
                op => op,
            };
            match op {
                Op::Insert(birth, w) => {
                    let key = key(birth, seq as u64);
                    ix.insert(key, seq as u32, f64::from(w));
                    model.insert(key, (seq as u32, weight(w)));
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
                    model.insert(key, (slot, weight(w)));
                }
                Op::Reweight(pick, w) if !model.is_empty() => {
                    let key = *model.keys().nth(pick % model.len()).unwrap_or(&(0, 0));
                    ix.set_weight(key, f64::from(w));
                    if let Some(e) = model.get_mut(&key) { e.1 = weight(w); }
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
                Op::TakeRanks(picks) if !model.is_empty() => {
                    // Distinct ranks in the order picked; each names the entry at that
                    // rank before the first removal.
                    let mut ranks: Vec<usize> = Vec::new();
                    for pick in picks {
                        let rank = pick % model.len();
                        if !ranks.contains(&rank) {
                            ranks.push(rank);
                        }
                    }
                    let by_rank: Vec<(Key, u32)> = model.iter().map(|(k, e)| (*k, e.0)).collect();
                    let taken = ix.take_ranks(&ranks);
                    let expected: Vec<u32> = ranks.iter().map(|&r| by_rank[r].1).collect();
                    prop_assert_eq!(&taken, &expected);
                    for &r in &ranks {
                        let (key, slot) = by_rank[r];
                        model.remove(&key);
                        out.push((key, slot));
                    }
                }
                _ => {}
            }
            prop_assert_eq!(ix.len(), model.len());
            prop_assert_eq!(ix.weighted_len(), model.values().filter(|e| e.1 > 0.0).count());
            assert_well_formed(&ix);
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
            prop_assert_eq!(ix.weight(*key), weighted.then_some(*w));
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
fn the_nth_set_bit_is_found_in_any_word() {
    let mut rng = Rng::new(11);
    for case in 0..2000 {
        // Dense, sparse and one-sided words.
        let bits = match case % 4 {
            0 => u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()),
            1 => u128::from(rng.next_u64() & rng.next_u64() & rng.next_u64()),
            2 => u128::from(rng.next_u64()) << 64,
            _ => u128::MAX >> (case % 128),
        };
        let set: Vec<usize> = (0..128).filter(|&i| bits >> i & 1 == 1).collect();
        for (k, &at) in set.iter().enumerate() {
            assert_eq!(nth_set_bit(bits, k as u32), at, "{bits:#x}, k = {k}");
        }
    }
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
    // And the batch's draws in their blocks land on the entries single draws find.
    let drawn: Vec<(usize, Option<usize>)> = (0..200)
        .filter_map(|i| ix.weight_position(f64::from(i) / 200.0))
        .map(|(b, at)| (b, Some(at)))
        .collect();
    assert_eq!(drawn.len(), 200);
    assert_eq!(ix.draw_positions(&singles), drawn);
}

#[test]
fn a_weighted_batch_comes_out_as_successive_draws_without_replacement() {
    // Weights 1, 2, 3, 4 in different blocks among weightless entries. Batches of 2 and of
    // 3 (where repeats are common and the draws fall back to one at a time): the
    // counts of each ordered outcome against the successive-draw probabilities.
    let heavy = [(0u64, 1.0), (120, 2.0), (240, 3.0), (330, 4.0)];
    let mut ix = RankedIndex::new(true);
    for i in 0..340u64 {
        let w = heavy.iter().find(|h| h.0 == i).map_or(0.0, |h| h.1);
        ix.insert(key(i, i), i as u32, w);
    }
    assert!(ix.blocks.len() >= 3);
    let weight = |slot: u32| {
        heavy
            .iter()
            .find(|h| h.0 == u64::from(slot))
            .map_or(0.0, |h| h.1)
    };
    for (n, quantile) in [(2usize, 31.3), (3, 49.7)] {
        let mut counts: BTreeMap<Vec<u32>, u64> = BTreeMap::new();
        for seed in 0..60_000u64 {
            let mut copy = ix.clone();
            let taken = copy.take_weighted(n, &mut Rng::new(seed));
            assert_eq!((taken.len(), copy.len()), (n, ix.len() - n));
            *counts.entry(taken).or_default() += 1;
        }
        let (mut observed, mut expected) = (Vec::new(), Vec::new());
        for (order, &count) in &counts {
            let mut left = 10.0;
            let mut p = 1.0;
            for &slot in order {
                p *= weight(slot) / left;
                left -= weight(slot);
            }
            assert!(p > 0.0, "a weightless entry drawn: {order:?}");
            observed.push(count);
            expected.push(p);
        }
        let outcomes = if n == 2 { 12 } else { 24 };
        assert_eq!(counts.len(), outcomes, "{counts:?}");
        let chi = chi_square(&observed, &expected);
        assert!(chi < quantile, "batch of {n}: chi-square {chi:.1}");
    }
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

/// Blocks stay between the bounds (thin ones merge, full ones split), and the directory of
/// first keys still sends each key to its block: increasing, each at most its block's first
/// entry and above every entry of the block before.
fn assert_well_formed(ix: &RankedIndex<Key>) {
    assert_eq!(ix.firsts.len(), ix.blocks.len());
    if let Err(e) = ix.tree.check(&ix.blocks) {
        panic!("tree out of step with the blocks: {e}");
    }
    for (b, block) in ix.blocks.iter().enumerate() {
        assert!(block.entries.len() <= MAX_BLOCK, "block {b} overfull");
        assert!(
            ix.blocks.len() == 1 || block.live_len() >= MIN_BLOCK,
            "block {b} too thin"
        );
        let first = ix.firsts[b];
        assert!(
            block.entries.first().is_some_and(|e| first <= e.0),
            "first of block {b}"
        );
        if b > 0 {
            assert!(
                ix.firsts[b - 1] < first,
                "directory out of order at block {b}"
            );
            let before = ix.blocks[b - 1].entries.last();
            assert!(
                before.is_some_and(|e| e.0 < first),
                "block {b} overlaps the one before"
            );
        }
    }
}

/// An unweighted index of keys `(i, i)` in slot `i`, for `i` in `0..n`, inserted in
/// order: each block fills to [`FILLED`] entries before the next starts (the last up to
/// `MAX_BLOCK`).
fn in_order(n: u64) -> RankedIndex<Key> {
    let mut ix = RankedIndex::new(false);
    for i in 0..n {
        ix.insert(key(i, i), i as u32, 0.0);
    }
    ix
}

/// Entries of a block that in-order inserts filled, once the next block started.
const FILLED: u64 = APPEND_SPLIT as u64;
/// Live entries of a block about to merge into a neighbour.
const THIN: u64 = MIN_BLOCK as u64 - 1;

/// Blocks `0..FILLED` and `FILLED..2 * FILLED` in order, then `extra` keys `(i, 0)` in
/// slots `1000 + i` for `i` from `FILLED + 1` (each just before key `(i, i)`, so in the
/// second block). Weighted, entry `(i, _)` weighs `i + 1`.
fn with_a_neighbour_of(weighted: bool, extra: u64) -> RankedIndex<Key> {
    let mut ix = RankedIndex::new(weighted);
    for i in 0..2 * FILLED {
        ix.insert(key(i, i), i as u32, (i + 1) as f64);
    }
    for i in FILLED + 1..FILLED + 1 + extra {
        ix.insert(key(i, 0), 1000 + i as u32, (i + 1) as f64);
    }
    let lens: Vec<usize> = ix.blocks.iter().map(|b| b.entries.len()).collect();
    assert_eq!(lens, [FILLED, FILLED + extra].map(|n| n as usize));
    ix
}

/// The slots of [`with_a_neighbour_of`] with `extra` keys, in key order, from key
/// `(from, _)`.
fn neighbour_slots(extra: u64, from: u64) -> Vec<u32> {
    let added = |i: u64| {
        (FILLED + 1..FILLED + 1 + extra)
            .contains(&i)
            .then_some(1000 + i as u32)
    };
    (from..2 * FILLED)
        .flat_map(|i| added(i).into_iter().chain([i as u32]))
        .collect()
}

/// Entries held, live or tombstones.
fn physical_len(ix: &RankedIndex<Key>) -> usize {
    ix.blocks.iter().map(|b| b.entries.len()).sum()
}

#[test]
fn a_returned_key_revives_its_tombstone_even_when_its_hint_is_stale() {
    // Three blocks (in-order inserts): 0..97, 97..194, 194..300.
    let mut ix = in_order(300);
    assert_eq!(ix.blocks.len(), 3);
    // A tombstone in the last block, then the first block merged away: the last
    // block's index moves down one, and the tombstone's hint points past the end.
    assert_eq!(ix.remove(key(250, 250)), Some(250));
    assert_eq!(ix.remove(key(251, 251)), Some(251));
    for i in 0..FILLED {
        assert_eq!(ix.remove(key(i, i)), Some(i as u32));
    }
    assert_eq!(ix.blocks.len(), 2);
    let held = physical_len(&ix);
    ix.insert(key(250, 250), 250, 0.0);
    assert_eq!(
        physical_len(&ix),
        held,
        "revived in place, not inserted again"
    );
    let len = 300 - FILLED as usize - 2 + 1;
    assert_eq!((ix.len(), ix.remove(key(250, 250))), (len, Some(250)));
    assert!(ix
        .iter()
        .map(|e| e.1)
        .eq((FILLED as u32..300).filter(|&s| s != 250 && s != 251)));
}

#[test]
fn slots_sharing_a_place_in_the_hints_still_come_back_in_place() {
    // Slots `MAX_HINTS` apart share one place in the hints, so the last removed keeps
    // it; the others' returns find their tombstones by search. All revive in place.
    let mut ix = in_order(200);
    let far = MAX_HINTS as u32;
    let slots = [7, 7 + far, 7 + 2 * far];
    for (i, &slot) in slots.iter().enumerate() {
        ix.insert(key(1000 + i as u64, 0), slot, 0.0);
    }
    for i in 0..3u64 {
        ix.remove(key(1000 + i, 0));
    }
    assert_eq!(ix.hints.get(slots[0]), None, "its place taken");
    assert!(ix.hints.get(slots[2]).is_some());
    let held = physical_len(&ix);
    for (i, &slot) in slots.iter().enumerate() {
        ix.insert(key(1000 + i as u64, 0), slot, 0.0);
    }
    assert_eq!(
        physical_len(&ix),
        held,
        "revived in place, not inserted again"
    );
    assert_well_formed(&ix);
    assert!(ix.iter().map(|e| e.1).skip(200).eq(slots));
}

#[test]
fn the_hints_keep_what_they_remember_as_they_grow() {
    let mut ix = in_order(10);
    ix.remove(key(3, 3));
    // A removal of a higher slot grows the table; slot 3's hint survives it.
    ix.insert(key(20, 20), 5000, 0.0);
    ix.remove(key(20, 20));
    assert_eq!(ix.hints.places.len(), 8192);
    assert!(ix.hints.get(3).is_some() && ix.hints.get(5000).is_some());
    assert_eq!(ix.hints.get(4), None, "never removed");
}

#[test]
fn the_hints_remember_every_slot_below_their_length() {
    // Slots 4 and 0 share a place only in a table of 4 or fewer; the table made for
    // slot 4 has room for both. A later removal of a lower slot keeps the table's
    // length, so slots 100 and 4 (apart by a multiple of 8) both stay too.
    let mut ix = in_order(200);
    ix.remove(key(4, 4));
    ix.remove(key(0, 0));
    assert!(ix.hints.get(4).is_some() && ix.hints.get(0).is_some());
    let mut ix = in_order(200);
    ix.remove(key(100, 100));
    ix.remove(key(4, 4));
    assert_eq!(ix.hints.places.len(), 128);
    assert!(ix.hints.get(100).is_some() && ix.hints.get(4).is_some());
}

#[test]
fn a_block_merges_when_its_live_entries_fall_below_the_minimum() {
    let mut ix = in_order(300);
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
fn blocks_filled_in_order_are_dense_and_their_new_block_does_not_merge_back_at_once() {
    let ix = in_order(1000);
    let n = ix.blocks.len();
    // 97 entries per block, the last holding the rest (up to 128).
    assert_eq!(n, 1000 / FILLED as usize);
    for block in &ix.blocks[..n - 1] {
        assert_eq!(block.entries.len(), FILLED as usize);
        // The capacity doubled on the put that split it is given back.
        assert!(
            block.entries.capacity() <= MAX_BLOCK,
            "{}",
            block.entries.capacity()
        );
    }
    assert!(ix.blocks[n - 1].entries.len() <= MAX_BLOCK);
    // The block a split starts holds 2 * MIN_BLOCK: taking the newest sample back out
    // and putting a newer one in (a Recency or Lifo run) neither merges nor splits.
    let mut ix = in_order(MAX_BLOCK as u64 + 1);
    assert_eq!(ix.blocks.len(), 2);
    assert_eq!(ix.blocks[1].live_len(), 2 * MIN_BLOCK);
    for i in 0..MIN_BLOCK as u64 {
        let newest = MAX_BLOCK as u64 + i;
        assert_eq!(ix.remove(key(newest, newest)), Some(newest as u32));
        // Not merged back into the block before (which would then split at the put).
        let held = (ix.blocks.len(), ix.blocks[0].entries.len());
        assert_eq!(held, (2, FILLED as usize));
        ix.insert(key(newest + 1, newest + 1), newest as u32 + 1, 0.0);
        assert_eq!((ix.blocks.len(), ix.blocks[0].entries.len()), held);
        assert_well_formed(&ix);
    }
}

#[test]
fn a_merge_too_large_for_one_block_splits_again() {
    // The second block filled (128); removals from the first leave it 15 live.
    let full = MAX_BLOCK as u64 - FILLED;
    let mut ix = with_a_neighbour_of(false, full);
    for i in 0..FILLED - THIN {
        ix.remove(key(i, i));
    }
    // 15 live merged into 128: split again, each half within bounds.
    assert_eq!(ix.blocks.len(), 2);
    assert_well_formed(&ix);
    let want = neighbour_slots(full, FILLED - THIN);
    assert!(ix.iter().map(|e| e.1).eq(want.iter().copied()));
    assert_eq!(ix.at_rank(100).map(|e| e.1), Some(want[100]));
    // Keys land in the block the directory names, on both sides of the split.
    ix.insert(key(60, 1), 2000, 0.0);
    ix.insert(key(180, 1), 2001, 0.0);
    assert_well_formed(&ix);
    assert!(ix.contains(key(60, 1), 2000) && ix.contains(key(180, 1), 2001));
    assert_ne!(ix.locate(key(60, 1)), ix.locate(key(180, 1)));
}

#[test]
fn a_weighted_merge_too_large_for_one_block_splits_again() {
    // As above, with weights (entry `(i, _)` weighs `i + 1`): for a moment the merged
    // block holds 143 weights, more than its group sums have room for.
    let full = MAX_BLOCK as u64 - FILLED;
    let mut ix = with_a_neighbour_of(true, full);
    for i in 0..FILLED - THIN {
        ix.remove(key(i, i));
    }
    assert_eq!(ix.blocks.len(), 2);
    assert_well_formed(&ix);
    assert!(ix
        .iter()
        .map(|e| e.1)
        .eq(neighbour_slots(full, FILLED - THIN).into_iter()));
    assert_eq!(ix.weighted_len(), MAX_BLOCK + THIN as usize);
    let want: f64 = (FILLED - THIN + 1..=2 * FILLED)
        .chain(FILLED + 2..=FILLED + 1 + full)
        .map(|w| w as f64)
        .sum();
    assert_eq!(ix.tree.total_weight(), want);
    for block in &ix.blocks {
        assert_eq!(block.weights.len(), block.entries.len());
    }
}

#[test]
fn a_merge_that_exactly_fills_a_block_stays_one_block() {
    // The second block holds 113; removals from the first leave it 15 live.
    let extra = MAX_BLOCK as u64 - THIN - FILLED;
    let mut ix = with_a_neighbour_of(false, extra);
    for i in 0..FILLED - THIN {
        ix.remove(key(i, i));
    }
    // 15 live merged into 113: 128 entries, a full block, not two half ones.
    assert_eq!(ix.blocks.len(), 1);
    assert_eq!(physical_len(&ix), MAX_BLOCK);
    assert_well_formed(&ix);
    assert!(ix
        .iter()
        .map(|e| e.1)
        .eq(neighbour_slots(extra, FILLED - THIN).into_iter()));
}

#[test]
fn a_batch_comes_out_whole_when_one_entry_holds_nearly_all_the_weight() {
    // One entry weighs e^600 (the cap), 299 others 1: once the heavy one is drawn, nearly
    // every draw repeats it. The repeats must end the drawing with replacement, and the
    // rest come one at a time from the index without it.
    let mut ix = RankedIndex::new(true);
    for i in 0..300u64 {
        let weight = if i == 150 {
            weight_of(MAX_LN_WEIGHT)
        } else {
            1.0
        };
        ix.insert(key(i, i), i as u32, weight);
    }
    let taken = ix.take_weighted(20, &mut Rng::new(3));
    let distinct: std::collections::BTreeSet<u32> = taken.iter().copied().collect();
    assert_eq!((taken.len(), distinct.len()), (20, 20), "{taken:?}");
    assert_eq!(taken.first(), Some(&150));
    assert_eq!(ix.len(), 280);
    assert_well_formed(&ix);
}

#[test]
fn a_weighted_batch_without_repeats_is_its_first_draws_against_the_index_as_it_was() {
    // The batch draws with replacement against the index before any removal, together:
    // when its first draws are distinct, they are the batch, in order.
    let mut ix = RankedIndex::new(true);
    for i in 0..5000u64 {
        ix.insert(key(i, i), i as u32, 1.0 + (i % 17) as f64);
    }
    let mut rng = Rng::new(21);
    let first: Vec<u32> = (0..16)
        .filter_map(|_| ix.at_weight(rng.unit()).map(|e| e.1))
        .collect();
    let distinct: std::collections::BTreeSet<u32> = first.iter().copied().collect();
    assert_eq!(distinct.len(), 16, "the fixture's draws repeat: {first:?}");
    assert_eq!(ix.take_weighted(16, &mut Rng::new(21)), first);
}
