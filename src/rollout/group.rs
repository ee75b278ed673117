//! Groups: the key rollouts are grouped under, the stable group id, and a sealed group's
//! form as one buffer sample (one slot = one group of K rollouts).
//!
//! A sealed group becomes a sample whose id is the group id. Per-rollout arrays are
//! stacked: ragged tensors (K sequences) for `prompt_tokens`, `output_tokens`, `logprobs`,
//! `token_versions` and `ref_logprobs`; `[K]` vectors for `rollout_version`,
//! `rollout_created_ts`, `truncated`, `segment_idx`, `is_last_segment`, `rollout_uid`,
//! `replica_id`, `reward`, `reward/<component>` and `meta/<key>`. Its metadata says what the buffer and the archive need
//! (`environment`, `policy_version` = the oldest member's, so staleness and partitions
//! follow the oldest rollout; `created_ts` = the oldest creation time, so the age bound
//! does too) and what a trainer wants to see (every version held, the group id, K).
//!
//! The reward is a group field only once every member has one: until then the sample
//! lacks the `reward` key and a verifier amends it in (an external key in the graph).

use super::record::{OptionalField, RolloutRecord};
use crate::error::Result;
use crate::sample::{MetaValue, Sample};
use crate::tensor::Tensor;
use std::collections::{BTreeMap, BTreeSet};

/// How rollouts are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GroupMode {
    /// By (environment, example id, policy version): a group is on one policy.
    #[default]
    Strict,
    /// By (environment, example id): a group may mix versions, and records each.
    Mixed,
}

/// What rollouts are grouped under.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    /// The environment.
    pub environment: String,
    /// The example.
    pub example_id: String,
    /// The policy version, in strict mode; `None` in mixed mode.
    pub policy_version: Option<u64>,
}

impl GroupKey {
    /// The key `record` falls under in `mode`.
    pub fn of(record: &RolloutRecord, mode: GroupMode) -> Self {
        Self {
            environment: record.environment.clone(),
            example_id: record.example_id.clone(),
            policy_version: match mode {
                GroupMode::Strict => Some(record.policy_version),
                GroupMode::Mixed => None,
            },
        }
    }
}

/// The stable id of the group of `uids` under `key`: `g-` and 32 hex digits of a 128-bit
/// hash of the key and the sorted uids. The same rollouts always give the same id, in any
/// process and on any platform.
pub fn group_id<'a>(key: &GroupKey, uids: impl IntoIterator<Item = &'a str>) -> String {
    let mut uids: Vec<&str> = uids.into_iter().collect();
    uids.sort_unstable();
    let mut h = key_hash(key);
    for uid in uids {
        h.field(uid.as_bytes());
    }
    let (a, b) = h.finish();
    format!("g-{a:016x}{b:016x}")
}

/// A stable 64-bit tag of `key` (a hash of its fields, as [`group_id`] takes them): the same
/// in any process and on any platform, so a tag written to the log names the same key
/// after a restart.
pub fn key_tag(key: &GroupKey) -> u64 {
    key_hash(key).finish().0
}

/// The hash of `key`'s fields, which [`group_id`] and [`key_tag`] both start from (the
/// ids and tags in logs depend on this order: it never changes).
fn key_hash(key: &GroupKey) -> Hash128 {
    let mut h = Hash128::default();
    h.field(key.environment.as_bytes());
    h.field(key.example_id.as_bytes());
    match key.policy_version {
        Some(v) => h.field(&v.to_le_bytes()),
        None => h.field(b"mixed"),
    }
    h
}

/// Two FNV-1a lanes with different offsets, each fed every byte, finished with a
/// SplitMix64 mix. Every field is length-prefixed, so ("ab", "c") and ("a", "bc") differ.
struct Hash128(u64, u64);

impl Default for Hash128 {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325, 0x6c62_272e_07bb_0142)
    }
}

impl Hash128 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn byte(&mut self, b: u8) {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        self.1 = (self.1 ^ u64::from(b).rotate_left(3)).wrapping_mul(Self::PRIME);
    }

    fn field(&mut self, bytes: &[u8]) {
        for b in (bytes.len() as u64).to_le_bytes() {
            self.byte(b);
        }
        for &b in bytes {
            self.byte(b);
        }
    }

    fn finish(&self) -> (u64, u64) {
        fn mix(mut z: u64) -> u64 {
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        (mix(self.0 ^ self.1.rotate_left(17)), mix(self.1 ^ self.0))
    }
}

/// Why a group was sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealReason {
    /// It reached the target size.
    Full,
    /// Its seal timeout passed with at least the minimum size.
    Timeout,
}

/// A sealed group: its id, key and rollouts (sorted by uid).
#[derive(Debug, Clone, PartialEq)]
pub struct SealedGroup {
    /// The stable group id (the sample id it is stored under).
    pub id: String,
    /// The key.
    pub key: GroupKey,
    /// The rollouts, sorted by uid.
    pub rollouts: Vec<RolloutRecord>,
    /// Why it was sealed.
    pub reason: SealReason,
}

impl SealedGroup {
    /// Seals `rollouts` under `key`.
    pub fn new(key: GroupKey, mut rollouts: Vec<RolloutRecord>, reason: SealReason) -> Self {
        rollouts.sort_by(|a, b| a.rollout_uid.cmp(&b.rollout_uid));
        let id = group_id(&key, rollouts.iter().map(|r| r.rollout_uid.as_str()));
        Self {
            id,
            key,
            rollouts,
            reason,
        }
    }

    /// The oldest policy version of any member (what staleness counts).
    pub fn oldest_version(&self) -> u64 {
        self.rollouts
            .iter()
            .map(|r| r.policy_version)
            .min()
            .unwrap_or(0)
    }

    /// The group as one buffer sample (see the module docs for the layout).
    ///
    /// # Errors
    ///
    /// [`Error::RaggedLengths`](crate::Error::RaggedLengths) when the members'
    /// `token_versions` hold, in total, another number of entries than their output tokens
    /// (records [`RolloutRecord::validate`] refuses; the assembler seals only validated
    /// ones).
    pub fn to_sample(&self) -> Result<Sample> {
        let rs = &self.rollouts;
        let out_lengths: Vec<usize> = rs.iter().map(|r| r.output_tokens.len()).collect();
        let token_versions: Vec<i64> = rs
            .iter()
            .flat_map(|r| match &r.token_versions {
                Some(v) => v.iter().map(|&t| t as i64).collect::<Vec<_>>(),
                None => vec![r.policy_version as i64; r.output_tokens.len()],
            })
            .collect();
        let mut s = Sample::new(self.id.clone())
            .with("prompt_tokens", stack(rs, |r| &r.prompt_tokens)?)
            .with("output_tokens", stack(rs, |r| &r.output_tokens)?)
            .with("logprobs", stack(rs, |r| &r.logprobs)?)
            .with(
                "token_versions",
                Tensor::ragged(token_versions, out_lengths.clone())?,
            )
            .with(
                "rollout_version",
                rs.iter()
                    .map(|r| r.policy_version as i64)
                    .collect::<Vec<i64>>(),
            )
            .with(
                "rollout_created_ts",
                rs.iter().map(|r| r.created_ts).collect::<Vec<f64>>(),
            )
            .with(
                "truncated",
                rs.iter().map(|r| r.truncated).collect::<Vec<bool>>(),
            )
            .with(
                "segment_idx",
                rs.iter()
                    .map(|r| i64::from(r.segment_idx))
                    .collect::<Vec<i64>>(),
            )
            .with(
                "is_last_segment",
                rs.iter().map(|r| r.is_last_segment).collect::<Vec<bool>>(),
            )
            .with(
                "rollout_uid",
                rs.iter()
                    .map(|r| r.rollout_uid.clone())
                    .collect::<Vec<String>>(),
            )
            .with(
                "replica_id",
                rs.iter()
                    .map(|r| r.replica_id.clone())
                    .collect::<Vec<String>>(),
            );
        // The fields a group holds only when every member has them: the ones a group
        // ingestion checks each rollout for when its buffer reads them.
        if rs.iter().all(|r| OptionalField::RefLogprobs.is_in(r)) {
            let refs = stack(rs, |r| r.ref_logprobs.as_deref().unwrap_or_default())?;
            s = s.with(OptionalField::RefLogprobs.key(), refs);
        }
        if rs.iter().all(|r| OptionalField::Reward.is_in(r)) {
            s = s.with(
                OptionalField::Reward.key(),
                rs.iter()
                    .map(|r| r.reward.unwrap_or(f64::NAN))
                    .collect::<Vec<f64>>(),
            );
        }
        let components: BTreeSet<&String> =
            rs.iter().flat_map(|r| r.reward_components.keys()).collect();
        for c in components {
            let v: Vec<f64> = rs
                .iter()
                .map(|r| r.reward_components.get(c).copied().unwrap_or(f64::NAN))
                .collect();
            s = s.with(format!("reward/{c}"), v);
        }
        if rs.iter().any(|r| r.continuation_of.is_some()) {
            let v: Vec<String> = rs
                .iter()
                .map(|r| r.continuation_of.clone().unwrap_or_default())
                .collect();
            s = s.with("continuation_of", v);
        }
        if rs.iter().any(|r| r.prefix_hash.is_some()) {
            let v: Vec<String> = rs
                .iter()
                .map(|r| r.prefix_hash.clone().unwrap_or_default())
                .collect();
            s = s.with("prefix_hash", v);
        }
        for (key, column) in stacked_metadata(rs) {
            s = s.with(format!("meta/{key}"), column);
        }
        let versions: BTreeSet<u64> = rs.iter().map(|r| r.policy_version).collect();
        let versions: Vec<String> = versions.iter().map(u64::to_string).collect();
        let oldest_created = rs
            .iter()
            .map(|r| r.created_ts)
            .fold(f64::INFINITY, f64::min);
        s = s
            .meta("environment", self.key.environment.as_str())
            .meta("example_id", self.key.example_id.as_str())
            .meta("policy_version", self.oldest_version() as i64)
            .meta("policy_versions", versions.join(","))
            .meta("group_id", self.id.as_str())
            .meta("num_rollouts", rs.len() as i64);
        if oldest_created.is_finite() && oldest_created > 0.0 {
            s = s.meta(crate::buffer::CREATED_TS, oldest_created);
        }
        Ok(s)
    }
}

/// One ragged tensor of every rollout's `values` (K sequences).
fn stack<T>(rs: &[RolloutRecord], values: impl Fn(&RolloutRecord) -> &[T]) -> Result<Tensor>
where
    T: Copy,
    Vec<T>: Into<Tensor>,
{
    let lengths = rs.iter().map(|r| values(r).len()).collect();
    let flat: Vec<T> = rs.iter().flat_map(|r| values(r).iter().copied()).collect();
    Tensor::ragged(flat, lengths)
}

/// Per-rollout metadata stacked into `[K]` columns: one per key, typed by its values
/// (integers, floats, booleans or strings; a key whose values mix types becomes strings).
/// A rollout without the key gets 0, NaN, false or "".
fn stacked_metadata(rs: &[RolloutRecord]) -> BTreeMap<String, Tensor> {
    let keys: BTreeSet<&String> = rs.iter().flat_map(|r| r.metadata.keys()).collect();
    let mut out = BTreeMap::new();
    for key in keys {
        let values: Vec<Option<&MetaValue>> = rs.iter().map(|r| r.metadata.get(key)).collect();
        let all = |f: fn(&MetaValue) -> bool| values.iter().flatten().all(|v| f(v));
        let column: Tensor = if all(|v| matches!(v, MetaValue::Int(_))) {
            let v: Vec<i64> = values
                .iter()
                .map(|v| match v {
                    Some(MetaValue::Int(i)) => *i,
                    _ => 0,
                })
                .collect();
            v.into()
        } else if all(|v| matches!(v, MetaValue::Float(_))) {
            let v: Vec<f64> = values
                .iter()
                .map(|v| match v {
                    Some(MetaValue::Float(f)) => *f,
                    _ => f64::NAN,
                })
                .collect();
            v.into()
        } else if all(|v| matches!(v, MetaValue::Bool(_))) {
            let v: Vec<bool> = values
                .iter()
                .map(|v| matches!(v, Some(MetaValue::Bool(true))))
                .collect();
            v.into()
        } else {
            let v: Vec<String> = values
                .iter()
                .map(|v| v.map(meta_text).unwrap_or_default())
                .collect();
            v.into()
        };
        out.insert(key.clone(), column);
    }
    out
}

fn meta_text(v: &MetaValue) -> String {
    match v {
        MetaValue::Int(i) => i.to_string(),
        MetaValue::Float(f) => f.to_string(),
        MetaValue::Str(s) => s.clone(),
        MetaValue::Bool(b) => b.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(uid: &str, version: u64, reward: Option<f64>) -> RolloutRecord {
        let mut r = RolloutRecord::new("math", "ex-1", version, uid);
        r.prompt_tokens = vec![1, 2];
        r.output_tokens = vec![3, 4, 5];
        r.logprobs = vec![-0.1, -0.2, -0.3];
        r.reward = reward;
        r.created_ts = 100.0 + version as f64;
        r
    }

    #[test]
    fn rollout_metadata_becomes_one_typed_column_per_key() -> Result<()> {
        // Sorted by uid: a, b, c. Each key typed by its values; a missing value is 0, NaN,
        // false or ""; mixed types become text.
        let with = |uid: &str, meta: &[(&str, MetaValue)]| {
            let mut r = record(uid, 1, None);
            for (k, v) in meta {
                r.metadata.insert((*k).to_owned(), v.clone());
            }
            r
        };
        let rs = vec![
            with(
                "b",
                &[
                    ("turns", MetaValue::Int(2)),
                    ("temp", MetaValue::Float(0.5)),
                    ("ok", MetaValue::Bool(true)),
                    ("tool", MetaValue::Str("calc".into())),
                    ("mixed", MetaValue::Int(7)),
                ],
            ),
            with(
                "a",
                &[
                    ("turns", MetaValue::Int(3)),
                    ("mixed", MetaValue::Str("x".into())),
                ],
            ),
            with(
                "c",
                &[
                    ("temp", MetaValue::Float(1.5)),
                    ("ok", MetaValue::Bool(false)),
                ],
            ),
        ];
        let key = GroupKey::of(&rs[0], GroupMode::Strict);
        let s = SealedGroup::new(key, rs, SealReason::Full).to_sample()?;
        fn column<T: crate::tensor::Element>(s: &Sample, key: &str) -> Option<Vec<T>> {
            Some(s.get(key)?.array::<T>()?.iter().cloned().collect())
        }
        let ints = |k: &str| column::<i64>(&s, k);
        let floats = |k: &str| column::<f64>(&s, k);
        let texts = |k: &str| column::<String>(&s, k);
        assert_eq!(ints("meta/turns"), Some(vec![3, 2, 0]));
        let temp = floats("meta/temp").unwrap_or_default();
        assert!(temp[0].is_nan() && temp[1..] == [0.5, 1.5], "{temp:?}");
        let ok = column::<bool>(&s, "meta/ok");
        assert_eq!(ok, Some(vec![false, true, false]));
        let text = |v: &[&str]| Some(v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(texts("meta/tool"), text(&["", "calc", ""]));
        assert_eq!(texts("meta/mixed"), text(&["x", "7", ""]));
        Ok(())
    }

    #[test]
    fn the_id_depends_on_the_key_and_the_set_of_uids_only() {
        let key = GroupKey::of(&record("a", 3, None), GroupMode::Strict);
        let id = group_id(&key, ["b", "a", "c"]);
        assert_eq!(id, group_id(&key, ["c", "b", "a"]));
        assert_ne!(id, group_id(&key, ["a", "b"]));
        assert_ne!(id, group_id(&key, ["ab", "c"]));
        let mixed = GroupKey::of(&record("a", 3, None), GroupMode::Mixed);
        assert_ne!(id, group_id(&mixed, ["a", "b", "c"]));
        assert_eq!(id.len(), 34);
        // Pinned: the id must never change across versions of this crate.
        assert_eq!(group_id(&key, ["a"]), "g-fd13eb609caec97bac5290fd7c73a7da");
    }

    #[test]
    fn a_key_tag_never_changes() {
        // Pinned, as the id is: sealed markers in a log keep the tag of their group's key.
        let r = RolloutRecord::new("math", "a", 3, "u");
        let strict = GroupKey::of(&r, GroupMode::Strict);
        let mixed = GroupKey::of(&r, GroupMode::Mixed);
        assert_eq!(key_tag(&strict), 0x7027_d133_88bb_b511);
        assert_eq!(key_tag(&mixed), 0xad94_bfd7_82c0_12b1);
    }

    #[test]
    fn a_creation_time_left_at_zero_is_not_a_creation_time() -> Result<()> {
        // `created_ts` 0.0 is `RolloutRecord::new`'s "unknown": the group then carries no
        // creation time (the buffer's put time stands), rather than one in 1970 that
        // `max_age` would find stale at once.
        let mut r = record("a", 1, None);
        r.created_ts = 0.0;
        let key = GroupKey::of(&r, GroupMode::Mixed);
        let s = SealedGroup::new(key, vec![r], SealReason::Full).to_sample()?;
        assert_eq!(s.get_meta(crate::buffer::CREATED_TS), None);
        Ok(())
    }

    #[test]
    fn a_group_stacks_its_rollouts_and_carries_the_oldest_version() -> Result<()> {
        let key = GroupKey::of(&record("a", 3, None), GroupMode::Mixed);
        let g = SealedGroup::new(
            key,
            vec![record("b", 4, Some(1.0)), record("a", 3, Some(0.0))],
            SealReason::Full,
        );
        let s = g.to_sample()?;
        assert_eq!(s.id().as_str(), g.id);
        assert_eq!(s.get_meta("policy_version"), Some(&MetaValue::Int(3)));
        assert_eq!(
            s.get_meta("policy_versions"),
            Some(&MetaValue::Str("3,4".into()))
        );
        assert_eq!(
            s.get_meta(crate::buffer::CREATED_TS),
            Some(&MetaValue::Float(103.0))
        );
        let out = s.get("output_tokens").and_then(|t| t.lengths());
        assert_eq!(out, Some(&[3usize, 3][..]));
        let reward = s.get("reward").and_then(|t| t.array::<f64>());
        assert_eq!(
            reward
                .map(|r| r.iter().copied().collect::<Vec<f64>>())
                .unwrap_or_default(),
            vec![0.0, 1.0],
            "sorted by uid: a then b"
        );
        // Without every reward, no reward field: a verifier amends it in.
        let g = SealedGroup::new(
            GroupKey::of(&record("a", 3, None), GroupMode::Strict),
            vec![record("a", 3, Some(1.0)), record("b", 3, None)],
            SealReason::Timeout,
        );
        assert!(g.to_sample()?.get("reward").is_none());
        Ok(())
    }
}
