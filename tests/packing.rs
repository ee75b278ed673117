//! Packing invariants on random groups (proptest): no token lost or duplicated, masks and
//! segments consistent, rows within `S`, whole groups only.

use proptest::prelude::*;
use rollout_buffer::rollout::{Overlong, Packer, Rows, TrainGroup, TrainItem};
use std::collections::BTreeMap;

fn item(g: usize, i: usize, prompt: usize, output: usize, refs: bool) -> TrainItem {
    let base = (g * 1000 + i * 100) as i32;
    TrainItem {
        rollout_uid: format!("g{g}-u{i}"),
        prompt_tokens: (0..prompt as i32).map(|t| base + t).collect(),
        output_tokens: (0..output as i32).map(|t| -(base + t) - 1).collect(),
        logprobs: (0..output).map(|t| -(t as f32) / 10.0).collect(),
        ref_logprobs: refs.then(|| vec![-0.5; output]),
        // The second item of a group built by hand knows the versions of only half its
        // tokens: the rest are packed as unknown (-1).
        token_versions: vec![g as i64; if i == 1 { output / 2 } else { output }],
        raw_reward: 0.0,
        reward: 0.0,
        advantage: (g as f64) - (i as f64) / 2.0,
        truncated: false,
        copy_of: None,
    }
}

fn groups() -> impl Strategy<Value = Vec<TrainGroup>> {
    prop::collection::vec(prop::collection::vec((0usize..20, 0usize..30), 1..5), 0..7)
        .prop_flat_map(|shape| (Just(shape), any::<bool>()))
        .prop_map(|(shape, refs)| {
            shape
                .into_iter()
                .enumerate()
                .map(|(g, items)| TrainGroup {
                    id: format!("g{g}"),
                    environment: "e".into(),
                    policy_version: 0,
                    items: items
                        .into_iter()
                        .enumerate()
                        .map(|(i, (p, o))| item(g, i, p, o, refs))
                        .collect(),
                })
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn packing_loses_and_duplicates_nothing(
        groups in groups(),
        seq_len in 4usize..64,
        rows in prop_oneof![(1usize..6).prop_map(Rows::Fixed), (1usize..300).prop_map(Rows::TokenBudget)],
        reject in any::<bool>(),
        multiple in prop::option::of(0usize..16),
    ) {
        let packer = Packer {
            seq_len,
            rows,
            pad_id: 7777,
            pad_to_multiple: multiple,
            overlong: if reject { Overlong::Reject } else { Overlong::Truncate },
        };
        let packed = packer.pack(&groups).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let b = &packed.batch;
        let (n_rows, width) = b.input_ids.dim();
        prop_assert!(width <= seq_len);
        if let Rows::Fixed(want) = rows { prop_assert_eq!(n_rows, want); }
        if let Rows::TokenBudget(budget) = rows { prop_assert!(b.real_tokens <= budget); }
        // Every group is packed, left over, or rejected: exactly one of them.
        let mut fate: BTreeMap<usize, &str> = BTreeMap::new();
        for id in &b.group_ids { fate.insert(id[1..].parse().unwrap_or(usize::MAX), "packed"); }
        for &g in &packed.leftover { prop_assert!(fate.insert(g, "leftover").is_none()); }
        for &g in &packed.rejected { prop_assert!(fate.insert(g, "rejected").is_none()); }
        prop_assert_eq!(fate.len(), groups.len());
        // Only `Reject` rejects, and only groups with an item over `S` (one of exactly
        // `S` fits).
        for &g in &packed.rejected {
            prop_assert!(reject && groups[g].items.iter().any(|it| it.len() > seq_len), "group {}", g);
        }
        // Each packed group's items appear exactly once, intact (or truncated to S).
        let mut seen: BTreeMap<(String, usize), usize> = BTreeMap::new();
        let mut real = 0;
        for (row, segments) in b.rows.iter().enumerate() {
            let mut covered = vec![0i32; width];
            for (k, seg) in segments.iter().enumerate() {
                *seen.entry((seg.group_id.clone(), seg.item)).or_default() += 1;
                let g: usize = seg.group_id[1..].parse().unwrap_or(usize::MAX);
                let it = &groups[g].items[seg.item];
                let tokens: Vec<i32> = it.prompt_tokens.iter().chain(&it.output_tokens).copied().collect();
                prop_assert_eq!(seg.len, tokens.len().min(seq_len));
                prop_assert_eq!(seg.truncated, tokens.len() > seq_len);
                prop_assert!(seg.start + seg.len <= width);
                real += seg.len;
                for (p, &token) in tokens.iter().enumerate().take(seg.len) {
                    let c = seg.start + p;
                    covered[c] += 1;
                    prop_assert_eq!(b.input_ids[[row, c]], token);
                    prop_assert_eq!(b.position_ids[[row, c]], p as i32);
                    prop_assert_eq!(b.segment_ids[[row, c]], k as i32 + 1);
                    let output = p >= it.prompt_tokens.len();
                    prop_assert_eq!(b.loss_mask[[row, c]], output);
                    let adv = if output { it.advantage as f32 } else { 0.0 };
                    prop_assert_eq!(b.advantages[[row, c]], adv);
                    if output {
                        let o = p - it.prompt_tokens.len();
                        prop_assert_eq!(b.behavior_logprobs[[row, c]], it.logprobs[o]);
                        let version = it.token_versions.get(o).copied().unwrap_or(-1);
                        prop_assert_eq!(b.policy_versions[[row, c]], version);
                    } else {
                        prop_assert_eq!(b.policy_versions[[row, c]], -1);
                    }
                }
            }
            for (c, &n) in covered.iter().enumerate() {
                prop_assert!(n <= 1, "row {} column {} written twice", row, c);
                if n == 0 {
                    prop_assert_eq!(b.input_ids[[row, c]], 7777);
                    prop_assert_eq!(b.segment_ids[[row, c]], 0);
                    prop_assert!(!b.loss_mask[[row, c]]);
                }
            }
        }
        prop_assert_eq!(real, b.real_tokens);
        // Width: `S`, or the longest row rounded up to the multiple (at most `S`).
        let longest = b.rows.iter().map(|r| r.iter().map(|seg| seg.len).sum::<usize>()).max().unwrap_or(0);
        match multiple {
            Some(m) if m > 0 => prop_assert_eq!(width, longest.max(1).div_ceil(m).saturating_mul(m).min(seq_len)),
            _ => prop_assert_eq!(width, seq_len), // unset, or 0
        }
        // Reference log-probs when every packed item has them.
        let packed_items: Vec<&TrainItem> = b.rows.iter().flatten().map(|seg| {
            let g: usize = seg.group_id[1..].parse().unwrap_or(usize::MAX);
            &groups[g].items[seg.item]
        }).collect();
        let with_refs = !packed_items.is_empty() && packed_items.iter().all(|it| it.ref_logprobs.is_some());
        prop_assert_eq!(b.ref_logprobs.is_some(), with_refs);
        for id in &b.group_ids {
            let g: usize = id[1..].parse().unwrap_or(usize::MAX);
            for i in 0..groups[g].items.len() {
                prop_assert_eq!(seen.get(&(id.clone(), i)).copied(), Some(1), "{} item {}", id, i);
            }
            if reject {
                prop_assert!(groups[g].items.iter().all(|it| it.len() <= seq_len));
            }
        }
        prop_assert_eq!(seen.values().sum::<usize>(), b.rows.iter().map(Vec::len).sum::<usize>());
    }
}

#[test]
fn first_fit_decreasing_fills_rows_and_reports_efficiency() {
    // Sequences of 6, 5, 3, 2 (two groups) into rows of 8: [6, 2] and [5, 3].
    let g0 = TrainGroup {
        id: "g0".into(),
        environment: "e".into(),
        policy_version: 0,
        items: vec![item(0, 0, 2, 4, false), item(0, 1, 1, 1, false)],
    };
    let g1 = TrainGroup {
        id: "g1".into(),
        environment: "e".into(),
        policy_version: 0,
        items: vec![item(1, 0, 2, 3, false), item(1, 1, 1, 2, false)],
    };
    let groups = [g0, g1];
    let packed = Packer::new(8, 2).pack(&groups).expect("pack");
    assert!(packed.leftover.is_empty());
    assert_eq!(packed.batch.real_tokens, 16);
    assert_eq!(packed.batch.efficiency(), 1.0);
    assert!(packed.batch.ref_logprobs.is_none());
    // The same 16 tokens in three rows of 8: a third of the cells are padding.
    let padded = Packer::new(8, 3).pack(&groups).expect("pack");
    assert_eq!(padded.batch.input_ids.len(), 24);
    assert_eq!(padded.batch.efficiency(), 16.0 / 24.0);
}

#[test]
fn a_token_budget_takes_groups_that_fill_it_exactly() {
    // Groups of 8 and 8 tokens under a budget of 16: both, with nothing left over; a
    // third of 1 token no longer fits.
    let group = |g: usize, tokens: usize| TrainGroup {
        id: format!("g{g}"),
        environment: "e".into(),
        policy_version: 0,
        items: vec![item(g, 0, 1, tokens - 1, false)],
    };
    let packer = Packer {
        rows: Rows::TokenBudget(16),
        ..Packer::new(8, 1)
    };
    let packed = packer
        .pack(&[group(0, 8), group(1, 8), group(2, 1)])
        .expect("pack");
    assert_eq!(packed.batch.real_tokens, 16);
    assert_eq!(packed.leftover, [2]);
}

/// Rows and a sequence length whose arrays no process can hold are an error, not a panic
/// (a shape past `isize::MAX` cells) or an abort (a failed allocation): more cells, or
/// bytes, than a `usize` counts.
#[test]
fn a_batch_too_large_to_allocate_is_an_error() {
    let g = TrainGroup {
        id: "g".into(),
        environment: "e".into(),
        policy_version: 0,
        items: vec![item(0, 0, 2, 4, false)],
    };
    for (seq_len, rows) in [(1usize << 32, 1usize << 32), (1 << 58, 1)] {
        let err = Packer::new(seq_len, rows)
            .pack(std::slice::from_ref(&g))
            .err();
        assert!(
            matches!(&err, Some(rollout_buffer::Error::InvalidPacking { detail }) if detail.contains("more memory")),
            "{seq_len} x {rows}: {err:?}"
        );
    }
}

#[test]
fn a_group_left_over_gives_back_the_room_it_took() {
    // Rows of 10, two of them. g0 (6 + 6) takes a row each; g1 (4 + 4 + 3) puts a 4 in
    // each row and finds no room for its 3, so it is left over, and the rows are as g0
    // left them: g2's 3 goes into the first, after g0's 6.
    let group = |g: usize, lens: &[usize]| TrainGroup {
        id: format!("g{g}"),
        environment: "e".into(),
        policy_version: 0,
        items: lens
            .iter()
            .enumerate()
            .map(|(i, &len)| item(g, i, 1, len - 1, false))
            .collect(),
    };
    let packed = Packer::new(10, 2)
        .pack(&[group(0, &[6, 6]), group(1, &[4, 4, 3]), group(2, &[3])])
        .expect("pack");
    assert_eq!(packed.batch.group_ids, ["g0", "g2"]);
    assert_eq!(packed.leftover, [1]);
    let placed: Vec<Vec<(&str, usize, usize)>> = packed
        .batch
        .rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|seg| (seg.group_id.as_str(), seg.start, seg.len))
                .collect()
        })
        .collect();
    assert_eq!(
        placed,
        [vec![("g0", 0, 6), ("g2", 6, 3)], vec![("g0", 0, 6)]]
    );
}
