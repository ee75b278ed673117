//! Group hooks: what happens to groups taken for training, in slime's order: statistics
//! (meta info) -> `is_valid_group` -> `filter_item` -> `normalize` -> `pad`, then
//! advantages over the surviving members, and an optional DAPO-style dynamic-sampling
//! filter. [`GroupHooks`] has slime's defaults (`../shared/REFERENCES.md`); implement it to
//! replace any step.
//!
//! A group a hook rejects comes back in [`Processed::rejected`] with its [`Rejection`], so
//! the caller archives it with that reason instead of losing it.

use super::advantage::{mean_std, Advantage};
use super::train_group::{TrainGroup, TrainItem};
use std::fmt;

/// Statistics over the groups taken (slime's meta info), before any filtering.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct GroupStats {
    /// Groups.
    pub groups: usize,
    /// Rollouts in them.
    pub items: usize,
    /// Mean raw reward over all rollouts.
    pub reward_mean: f64,
    /// Population std of the raw rewards.
    pub reward_std: f64,
    /// Groups whose rewards are all equal.
    pub zero_variance_groups: usize,
}

/// What `is_valid_group` says of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// It may be trained on.
    pub valid: bool,
    /// It is complete (`valid` implies `finished`).
    pub finished: bool,
}

/// Why a group was not trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// `is_valid_group` said no (unfinished, or rewards all equal under the defaults).
    Invalid,
    /// Too few items survived `filter_item`.
    TooFewItems,
    /// `pad` could not reach the group size.
    CannotPad,
    /// Dropped by dynamic sampling (reward std <= its threshold).
    NoVariance,
    /// A sequence is longer than the packer's rows and the packer rejects such groups.
    TooLong,
}

impl Rejection {
    /// A short name (the archive's `reason` column says `filtered`; this is the detail).
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Invalid => "invalid",
            Rejection::TooFewItems => "too_few_items",
            Rejection::CannotPad => "cannot_pad",
            Rejection::NoVariance => "no_variance",
            Rejection::TooLong => "too_long",
        }
    }
}

/// The steps applied to groups taken for training; every method has slime's default.
pub trait GroupHooks: Send + Sync + fmt::Debug {
    /// The target group size (what `pad` pads to).
    fn group_size(&self) -> usize;

    /// Statistics over every group taken (step 1).
    fn meta_info(&self, groups: &[TrainGroup]) -> GroupStats {
        let rewards: Vec<f64> = groups
            .iter()
            .flat_map(|g| g.items.iter().map(|i| i.raw_reward))
            .collect();
        let (reward_mean, reward_std) = mean_std(&rewards);
        GroupStats {
            groups: groups.len(),
            items: rewards.len(),
            reward_mean,
            reward_std,
            zero_variance_groups: groups
                .iter()
                .filter(|g| all_equal(g.items.iter().map(|i| i.raw_reward)))
                .count(),
        }
    }

    /// Step 2. Default, slime's rule for a group the ingest stored (it sealed, so it is
    /// finished): one of `group_size` items is valid when its rewards are not all equal
    /// (nothing to learn from otherwise); one sealed short, by its seal timeout, skips
    /// that rule, as slime's timeout path does, and goes on to be padded. (Requiring
    /// `group_size` items had discarded every group sealed short.)
    fn is_valid_group(&self, group: &TrainGroup) -> Validity {
        let short = group.items.len() < self.group_size();
        Validity {
            valid: short || !all_equal(group.items.iter().map(|i| i.raw_reward)),
            finished: true,
        }
    }

    /// Step 3, per item. Default: the reward lies in `[0, 1]`.
    fn filter_item(&self, item: &TrainItem) -> bool {
        (0.0..=1.0).contains(&item.raw_reward)
    }

    /// The fewest items that must survive `filter_item`. Default: 70% of the group size,
    /// rounded down, at least 1 (slime's `int(group_size * min_valid_item_size_ratio)`, as
    /// the server's configurable ratio has it; rounding up had dropped groups slime keeps).
    fn min_items(&self) -> usize {
        ((self.group_size() as f64) * 0.7).floor().max(1.0) as usize
    }

    /// Step 4. Default: over the items, population std; an all-zero group is left as is;
    /// std < 1e-8 gives zeros; else `(r - mean) / (std + 1e-8)`. `raw_reward` is kept.
    fn normalize(&self, group: &mut TrainGroup) {
        let rewards: Vec<f64> = group.items.iter().map(|i| i.reward).collect();
        if rewards.iter().all(|&r| r == 0.0) {
            return;
        }
        let (mean, std) = mean_std(&rewards);
        for item in &mut group.items {
            item.reward = if std < 1e-8 {
                0.0
            } else {
                (item.reward - mean) / (std + 1e-8)
            };
        }
    }

    /// Step 5. Default (slime): with `n` items and group size `G`, needs `n >= G / 2`;
    /// multiplies every reward (and advantage) by `G / n`, appends copies of the first
    /// `G - n` items, and halves the reward (and advantage) of each copied item and its
    /// copy. Returns false when it cannot.
    fn pad(&self, group: &mut TrainGroup) -> bool {
        let g = self.group_size();
        let n = group.items.len();
        if n >= g {
            return true;
        }
        if n == 0 || 2 * n < g {
            return false;
        }
        let scale = g as f64 / n as f64;
        for item in &mut group.items {
            item.reward *= scale;
            item.advantage *= scale;
        }
        for i in 0..g - n {
            let item = &mut group.items[i];
            item.reward /= 2.0;
            item.advantage /= 2.0;
            let copy = TrainItem {
                copy_of: Some(i),
                ..item.clone()
            };
            group.items.push(copy);
        }
        true
    }
}

fn all_equal(mut values: impl Iterator<Item = f64>) -> bool {
    match values.next() {
        Some(first) => values.all(|v| v == first),
        None => true,
    }
}

/// slime's defaults for groups of `group_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlimeHooks {
    /// The target group size.
    pub group_size: usize,
}

impl GroupHooks for SlimeHooks {
    fn group_size(&self) -> usize {
        self.group_size
    }
}

/// DAPO's dynamic sampling: groups whose reward std is at or below `min_std` carry no
/// signal and are dropped, unless fewer than `keep_at_least` groups would remain, in which
/// case the first dropped ones are kept to fill up to it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamicSampling {
    /// The std at or below which a group is dropped (DAPO: 1e-6).
    pub min_std: f64,
    /// The fewest groups a batch keeps.
    pub keep_at_least: usize,
}

/// The outcome of processing groups.
#[derive(Debug, Default)]
pub struct Processed {
    /// Statistics over every group taken.
    pub stats: GroupStats,
    /// Groups to train on, in the order taken, with rewards, advantages and padding set.
    pub kept: Vec<TrainGroup>,
    /// Groups not trained on, and why (to archive with the reason).
    pub rejected: Vec<(TrainGroup, Rejection)>,
}

/// Runs the hooks over `groups` in order, then advantages (over each group's surviving
/// members, before padding copies them), then dynamic sampling.
pub fn process_groups(
    hooks: &dyn GroupHooks,
    advantage: &Advantage,
    dynamic: Option<DynamicSampling>,
    groups: Vec<TrainGroup>,
) -> Processed {
    let stats = hooks.meta_info(&groups);
    let mut out = Processed {
        stats,
        ..Processed::default()
    };
    let mut low_variance = Vec::new();
    for group in groups {
        match process_group(hooks, advantage, dynamic, group) {
            Outcome::Kept(group) => out.kept.push(group),
            Outcome::LowVariance(group) => low_variance.push(group),
            Outcome::Rejected(group, why) => out.rejected.push((group, why)),
        }
    }
    let keep = dynamic.map_or(0, |d| d.keep_at_least.saturating_sub(out.kept.len()));
    for (i, group) in low_variance.into_iter().enumerate() {
        if i < keep {
            out.kept.push(group);
        } else {
            out.rejected.push((group, Rejection::NoVariance));
        }
    }
    out
}

/// How many items `group` trains with once through [`process_groups`] without dynamic
/// sampling (padding copies included): 0 when the hooks reject it. For a reader that
/// takes groups until it has enough items, which must count what the hooks keep, not
/// what it leased.
pub fn items_kept(hooks: &dyn GroupHooks, group: &TrainGroup) -> usize {
    match process_group(hooks, &Advantage::None, None, group.clone()) {
        Outcome::Kept(group) => group.items.len(),
        Outcome::LowVariance(_) | Outcome::Rejected(..) => 0,
    }
}

/// What the hooks make of one group.
enum Outcome {
    Kept(TrainGroup),
    /// Kept, unless dynamic sampling has enough groups of more variance.
    LowVariance(TrainGroup),
    Rejected(TrainGroup, Rejection),
}

/// One group through the hooks, the advantage and dynamic sampling's variance test.
fn process_group(
    hooks: &dyn GroupHooks,
    advantage: &Advantage,
    dynamic: Option<DynamicSampling>,
    mut group: TrainGroup,
) -> Outcome {
    if !hooks.is_valid_group(&group).valid {
        return Outcome::Rejected(group, Rejection::Invalid);
    }
    let (kept, filtered): (Vec<TrainItem>, Vec<TrainItem>) =
        group.items.drain(..).partition(|i| hooks.filter_item(i));
    group.items = kept;
    if group.items.len() < hooks.min_items() {
        group.items.extend(filtered);
        return Outcome::Rejected(group, Rejection::TooFewItems);
    }
    // The estimator sees the survivors' raw rewards, as its formulas say. Fed the
    // normalized ones, RLOO came out as n/(n-1) times the z-score, and `None` and Dr.
    // GRPO as the z-score itself.
    let rewards: Vec<f64> = group.items.iter().map(|i| i.raw_reward).collect();
    hooks.normalize(&mut group);
    for (item, a) in group.items.iter_mut().zip(advantage.compute(&rewards)) {
        item.advantage = a;
    }
    if !hooks.pad(&mut group) {
        return Outcome::Rejected(group, Rejection::CannotPad);
    }
    if let Some(d) = dynamic {
        let raw: Vec<f64> = group.originals().map(|i| i.raw_reward).collect();
        if mean_std(&raw).1 <= d.min_std {
            return Outcome::LowVariance(group);
        }
    }
    Outcome::Kept(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(rewards: &[f64]) -> TrainGroup {
        TrainGroup {
            id: "g".into(),
            environment: "e".into(),
            policy_version: 0,
            items: rewards
                .iter()
                .enumerate()
                .map(|(i, &r)| TrainItem {
                    rollout_uid: format!("u{i}"),
                    prompt_tokens: vec![1],
                    output_tokens: vec![2, 3],
                    logprobs: vec![-0.1, -0.2],
                    ref_logprobs: None,
                    token_versions: vec![0, 0],
                    raw_reward: r,
                    reward: r,
                    advantage: 0.0,
                    truncated: false,
                    copy_of: None,
                })
                .collect(),
        }
    }

    fn rewards(g: &TrainGroup) -> Vec<f64> {
        g.items.iter().map(|i| i.reward).collect()
    }

    #[test]
    fn slime_padding_of_6_to_8_comes_out_exactly() {
        let hooks = SlimeHooks { group_size: 8 };
        let (a, b, c, d, e, f) = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6);
        let mut g = group(&[a, b, c, d, e, f]);
        assert!(hooks.pad(&mut g));
        let want = [
            a * 4.0 / 6.0,
            b * 4.0 / 6.0,
            c * 4.0 / 3.0,
            d * 4.0 / 3.0,
            e * 4.0 / 3.0,
            f * 4.0 / 3.0,
            a * 4.0 / 6.0,
            b * 4.0 / 6.0,
        ];
        let got = rewards(&g);
        assert!(
            got.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-12),
            "{got:?}"
        );
        assert_eq!(g.items[6].copy_of, Some(0));
        assert_eq!(g.items[7].rollout_uid, "u1");
        // Fewer than half cannot be padded.
        assert!(!hooks.pad(&mut group(&[0.5, 0.5, 0.5])));
    }

    #[test]
    fn slime_padding_scales_advantages_too_and_takes_exactly_half() {
        let hooks = SlimeHooks { group_size: 8 };
        let mut g = group(&[0.1, 0.2, 0.3, 0.4]);
        for item in &mut g.items {
            item.advantage = item.reward;
        }
        assert!(hooks.pad(&mut g), "4 of 8 is half: padded");
        let advantages: Vec<f64> = g.items.iter().map(|i| i.advantage).collect();
        assert!(
            advantages
                .iter()
                .zip(rewards(&g))
                .all(|(a, r)| (a - r).abs() < 1e-12),
            "advantages {advantages:?} scaled and halved as the rewards"
        );
        assert!((advantages[0] - 0.1 * 2.0 / 2.0).abs() < 1e-12);
        assert_eq!(g.items.len(), 8);
    }

    #[test]
    fn slime_normalize_validity_and_filter() {
        let hooks = SlimeHooks { group_size: 4 };
        // (r - mean) / (std + 1e-8), population std, raw reward kept.
        let mut g = group(&[1.0, 0.0, 0.0, 1.0]);
        hooks.normalize(&mut g);
        let n = 0.5 / (0.5 + 1e-8);
        assert!(rewards(&g)
            .iter()
            .zip([n, -n, -n, n])
            .all(|(x, y)| (x - y).abs() < 1e-9));
        assert_eq!(g.items[0].raw_reward, 1.0);
        // All zero: left as is. Equal non-zero: std < 1e-8 gives zeros.
        let mut g = group(&[0.0; 4]);
        hooks.normalize(&mut g);
        assert_eq!(rewards(&g), vec![0.0; 4]);
        let mut g = group(&[0.5; 4]);
        hooks.normalize(&mut g);
        assert_eq!(rewards(&g), vec![0.0; 4]);
        // Not quite equal (std 5e-10): zeros as well.
        let mut g = group(&[0.5, 0.5 + 1e-9, 0.5, 0.5 + 1e-9]);
        hooks.normalize(&mut g);
        assert_eq!(rewards(&g), vec![0.0; 4]);
        // A std of exactly 1e-8 (0 and 2e-8: the square root of a rounded square is
        // exact) is normalized, as slime's `std < epsilon` has it.
        let mut g = group(&[0.0, 2e-8]);
        hooks.normalize(&mut g);
        assert_eq!(rewards(&g), vec![-0.5, 0.5]);
        // A full group is valid when its rewards differ.
        assert!(hooks.is_valid_group(&group(&[1.0, 0.0, 1.0, 1.0])).valid);
        let v = hooks.is_valid_group(&group(&[1.0; 4]));
        assert_eq!((v.valid, v.finished), (false, true));
        // One sealed short (by its timeout) skips the rule, as in slime, and is padded.
        let v = hooks.is_valid_group(&group(&[1.0; 3]));
        assert_eq!((v.valid, v.finished), (true, true));
        let out = process_groups(
            &hooks,
            &Advantage::Rloo,
            None,
            vec![group(&[1.0, 0.0, 1.0])],
        );
        assert_eq!(out.kept.len(), 1);
        assert_eq!(out.kept[0].items.len(), 4);
        assert_eq!(out.kept[0].items[3].copy_of, Some(0));
        // Below `min_items` (2 of 4): refused, and says why.
        let out = process_groups(&hooks, &Advantage::Rloo, None, vec![group(&[1.0])]);
        assert_eq!(out.rejected[0].1, Rejection::TooFewItems);
        // Items: reward within [0, 1].
        let g = group(&[1.5, -0.1, 0.5]);
        let kept: Vec<bool> = g.items.iter().map(|i| hooks.filter_item(i)).collect();
        assert_eq!(kept, vec![false, false, true]);
    }

    #[test]
    fn processing_rejects_with_reasons_and_advantages_ignore_filtered_members() {
        let hooks = SlimeHooks { group_size: 4 };
        let groups = vec![
            group(&[1.0, 0.0, 1.0, 0.0]), // kept
            group(&[1.0, 1.0, 1.0, 1.0]), // invalid: no variance
            group(&[1.0, 5.0, 5.0, 6.0]), // 1 of 4 passes the filter: too few (2 needed)
            group(&[1.0, 0.0, 1.0, 7.0]), // 3 of 4 pass; padded back to 4
        ];
        let out = process_groups(&hooks, &Advantage::Rloo, None, groups);
        let reasons: Vec<Rejection> = out.rejected.iter().map(|r| r.1).collect();
        assert_eq!(reasons, vec![Rejection::Invalid, Rejection::TooFewItems]);
        assert_eq!(out.kept.len(), 2);
        // The filtered 7.0 never enters the baseline: the 3 survivors' RLOO advantages sum
        // to zero before padding.
        let last = &out.kept[1];
        assert_eq!(last.items.len(), 4);
        assert!(last.items.iter().all(|i| i.raw_reward != 7.0));
        // RLOO advantages sum to zero, and padding (scale, then halve a member and its
        // copy) keeps the sum.
        let sum: f64 = last.items.iter().map(|i| i.advantage).sum();
        assert!(sum.abs() < 1e-9, "{sum}");
        assert_eq!(last.items[3].copy_of, Some(0));
        assert_eq!(out.stats.groups, 4);
        assert_eq!(out.stats.zero_variance_groups, 1);
    }

    #[test]
    fn min_items_rounds_down_as_slime_does() {
        let min = |g| SlimeHooks { group_size: g }.min_items();
        assert_eq!((min(8), min(4), min(10), min(1)), (5, 2, 7, 1));
        // G = 4 with two rewards in [0, 1]: slime keeps the group (and pads it).
        let out = process_groups(
            &SlimeHooks { group_size: 4 },
            &Advantage::Rloo,
            None,
            vec![group(&[1.0, 0.0, 3.0, 4.0])],
        );
        assert!(out.rejected.is_empty(), "{:?}", out.rejected[0].1);
        assert_eq!(out.kept[0].items.len(), 4);
    }

    #[test]
    fn each_estimator_sees_the_raw_rewards_not_the_normalized_ones() {
        // One full group of 4 (no padding): each estimator's advantages are its formula
        // over the raw rewards, while `reward` carries slime's normalized value.
        let raw = [0.2, 0.5, 0.9, 0.3];
        let (mean, std) = mean_std(&raw);
        let cases: Vec<(Advantage, Vec<f64>)> = vec![
            (
                Advantage::Rloo,
                raw.iter()
                    .map(|r| r - (raw.iter().sum::<f64>() - r) / 3.0)
                    .collect(),
            ),
            (Advantage::None, raw.to_vec()),
            (
                Advantage::Grpo {
                    divide_by_std: false,
                },
                raw.iter().map(|r| r - mean).collect(),
            ),
            (
                Advantage::Grpo {
                    divide_by_std: true,
                },
                raw.iter().map(|r| (r - mean) / std).collect(),
            ),
        ];
        for (advantage, want) in cases {
            let out = process_groups(
                &SlimeHooks { group_size: 4 },
                &advantage,
                None,
                vec![group(&raw)],
            );
            let kept = &out.kept[0];
            let got: Vec<f64> = kept.items.iter().map(|i| i.advantage).collect();
            assert!(
                got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-12),
                "{advantage:?}: {got:?} != {want:?}"
            );
            let normalized: Vec<f64> = kept.items.iter().map(|i| i.reward).collect();
            let z: Vec<f64> = raw.iter().map(|r| (r - mean) / (std + 1e-8)).collect();
            assert!(normalized
                .iter()
                .zip(&z)
                .all(|(a, b)| (a - b).abs() < 1e-12));
        }
    }

    #[test]
    fn dynamic_sampling_drops_flat_groups_unless_the_batch_would_be_short() {
        #[derive(Debug)]
        struct Lenient;
        impl GroupHooks for Lenient {
            fn group_size(&self) -> usize {
                2
            }
            fn is_valid_group(&self, _: &TrainGroup) -> Validity {
                Validity {
                    valid: true,
                    finished: true,
                }
            }
        }
        let groups = || vec![group(&[1.0, 0.0]), group(&[1.0, 1.0]), group(&[0.0, 0.0])];
        let d = DynamicSampling {
            min_std: 1e-6,
            keep_at_least: 0,
        };
        let out = process_groups(&Lenient, &Advantage::Rloo, Some(d), groups());
        assert_eq!(out.kept.len(), 1);
        assert_eq!(
            out.rejected
                .iter()
                .filter(|r| r.1 == Rejection::NoVariance)
                .count(),
            2
        );
        let d = DynamicSampling {
            min_std: 1e-6,
            keep_at_least: 2,
        };
        let out = process_groups(&Lenient, &Advantage::Rloo, Some(d), groups());
        assert_eq!((out.kept.len(), out.rejected.len()), (2, 1));
    }
}
