//! `RolloutRecord`: one generated rollout as an environment replica reports it.
//!
//! Fields follow what async-RL trainers need (Marin's per-rollout metadata, the replay
//! spec's provenance fields): where and when it was generated (environment, example,
//! replica, policy version, time), the tokens and the behaviour policy's logprobs for
//! off-policy correction, optional per-token versions for rollouts resumed across a weight
//! update, optional reference logprobs, the reward once verified and its components, and
//! the continuity fields of segmented (partial) rollouts.
//!
//! A record converts to and from a one-rollout [`Sample`]; that is how pending rollouts
//! are made durable through the buffer's log.

// The loom build leaves out group ingestion, the user of most of this.
#![cfg_attr(rollout_buffer_loom, allow(dead_code))]

use crate::error::{Error, Result};
use crate::sample::{MetaValue, Sample};
use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// One rollout (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutRecord {
    /// The environment (task family) that produced it.
    pub environment: String,
    /// The example (prompt) within the environment.
    pub example_id: String,
    /// Version of the policy that generated it (for a resumed rollout, the first one).
    pub policy_version: u64,
    /// The replica or worker that generated it.
    pub replica_id: String,
    /// Unique id of this rollout: duplicates (retries, at-least-once delivery) share it.
    pub rollout_uid: String,
    /// Creation time, Unix seconds.
    pub created_ts: f64,
    /// The prompt.
    pub prompt_tokens: Vec<i32>,
    /// The generated tokens.
    pub output_tokens: Vec<i32>,
    /// Per output token: the behaviour policy's logprob.
    pub logprobs: Vec<f32>,
    /// Per output token: the policy version that produced it (partial rollouts resumed
    /// after a weight update).
    pub token_versions: Option<Vec<u64>>,
    /// Per output token: the reference policy's logprob.
    pub ref_logprobs: Option<Vec<f32>>,
    /// The reward, once verified.
    pub reward: Option<f64>,
    /// Named reward components.
    pub reward_components: BTreeMap<String, f64>,
    /// Whether generation stopped at the length limit.
    pub truncated: bool,
    /// Free metadata.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Segment number of a segmented rollout (0 for a whole one).
    pub segment_idx: u32,
    /// Whether this is the last (or only) segment.
    pub is_last_segment: bool,
    /// The `rollout_uid` of the segment this one continues.
    pub continuation_of: Option<String>,
    /// A hash of the prefix tokens, to check continuity.
    pub prefix_hash: Option<String>,
}

/// A field a rollout may leave out (`None`), which its group's sample then lacks (every
/// member must have it for the group's column to exist): a store whose RPCs read it and
/// none outputs it (a dataset key) refuses such a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OptionalField {
    Reward,
    RefLogprobs,
}

impl OptionalField {
    pub(crate) const ALL: [Self; 2] = [Self::Reward, Self::RefLogprobs];

    /// Its key in a group's sample.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::Reward => "reward",
            Self::RefLogprobs => "ref_logprobs",
        }
    }

    /// Whether `record` has it.
    pub(crate) fn is_in(self, record: &RolloutRecord) -> bool {
        match self {
            Self::Reward => record.reward.is_some(),
            Self::RefLogprobs => record.ref_logprobs.is_some(),
        }
    }
}

impl RolloutRecord {
    /// A whole (single-segment) rollout with no tokens, reward or metadata yet.
    pub fn new(
        environment: impl Into<String>,
        example_id: impl Into<String>,
        policy_version: u64,
        rollout_uid: impl Into<String>,
    ) -> Self {
        Self {
            environment: environment.into(),
            example_id: example_id.into(),
            policy_version,
            replica_id: String::new(),
            rollout_uid: rollout_uid.into(),
            created_ts: 0.0,
            prompt_tokens: Vec::new(),
            output_tokens: Vec::new(),
            logprobs: Vec::new(),
            token_versions: None,
            ref_logprobs: None,
            reward: None,
            reward_components: BTreeMap::new(),
            truncated: false,
            metadata: BTreeMap::new(),
            segment_idx: 0,
            is_last_segment: true,
            continuation_of: None,
            prefix_hash: None,
        }
    }

    /// Checks the per-token arrays against the output length; names the rollout.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRollout`] for an empty `rollout_uid`, `logprobs`, `token_versions`
    /// or `ref_logprobs` of another length than `output_tokens`, a `policy_version` or
    /// token version past `i64::MAX`, or a reward or reward component that is NaN or
    /// infinite.
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: String| Error::InvalidRollout {
            uid: self.rollout_uid.clone(),
            detail,
        };
        if self.rollout_uid.is_empty() {
            return Err(bad("empty rollout_uid".into()));
        }
        let n = self.output_tokens.len();
        if self.logprobs.len() != n {
            return Err(bad(format!(
                "{} logprobs for {n} output tokens",
                self.logprobs.len()
            )));
        }
        if let Some(v) = &self.token_versions {
            if v.len() != n {
                return Err(bad(format!(
                    "{} token versions for {n} output tokens",
                    v.len()
                )));
            }
            if v.iter().any(|&t| t > i64::MAX as u64) {
                return Err(bad("a token version exceeds i64::MAX".into()));
            }
        }
        if let Some(r) = &self.ref_logprobs {
            if r.len() != n {
                return Err(bad(format!(
                    "{} ref logprobs for {n} output tokens",
                    r.len()
                )));
            }
        }
        if self.policy_version > i64::MAX as u64 {
            return Err(bad("policy_version exceeds i64::MAX".into()));
        }
        // A NaN or infinite reward would make every advantage of its group meaningless
        // (a group's mean and spread), silently.
        if let Some(r) = self.reward.filter(|r| !r.is_finite()) {
            return Err(bad(format!("reward {r} is not a finite number")));
        }
        if let Some((name, v)) = self.reward_components.iter().find(|(_, v)| !v.is_finite()) {
            return Err(bad(format!(
                "reward component `{name}` {v} is not a finite number"
            )));
        }
        Ok(())
    }

    /// The newest policy version any of its tokens came from.
    pub fn newest_version(&self) -> u64 {
        self.token_versions
            .as_ref()
            .and_then(|v| v.iter().max().copied())
            .map_or(self.policy_version, |m| m.max(self.policy_version))
    }

    /// This record as a one-rollout sample named `id` (the form pending rollouts are
    /// logged in).
    pub(crate) fn to_sample(&self, id: String) -> Sample {
        let mut s = Sample::new(id)
            .with("prompt_tokens", self.prompt_tokens.clone())
            .with("output_tokens", self.output_tokens.clone())
            .with("logprobs", self.logprobs.clone())
            .with("truncated", Tensor::scalar(self.truncated))
            .with("created_ts", Tensor::scalar(self.created_ts))
            .with("segment_idx", Tensor::scalar(i64::from(self.segment_idx)))
            .with("is_last_segment", Tensor::scalar(self.is_last_segment))
            .meta("environment", self.environment.as_str())
            .meta("example_id", self.example_id.as_str())
            .meta("policy_version", self.policy_version as i64)
            .meta("replica_id", self.replica_id.as_str())
            .meta("rollout_uid", self.rollout_uid.as_str());
        if let Some(v) = &self.token_versions {
            s = s.with(
                "token_versions",
                v.iter().map(|&t| t as i64).collect::<Vec<i64>>(),
            );
        }
        if let Some(r) = &self.ref_logprobs {
            s = s.with("ref_logprobs", r.clone());
        }
        if let Some(r) = self.reward {
            s = s.with("reward", Tensor::scalar(r));
        }
        for (name, v) in &self.reward_components {
            s = s.with(format!("reward/{name}"), Tensor::scalar(*v));
        }
        if let Some(c) = &self.continuation_of {
            s = s.meta("continuation_of", c.as_str());
        }
        if let Some(h) = &self.prefix_hash {
            s = s.meta("prefix_hash", h.as_str());
        }
        for (k, v) in &self.metadata {
            s = s.meta(&format!("meta/{k}"), v.clone());
        }
        s
    }

    /// The record [`Self::to_sample`] made; `None` if the sample is not one.
    pub(crate) fn from_sample(s: &Sample) -> Option<Self> {
        let text = |k: &str| match s.get_meta(k) {
            Some(MetaValue::Str(v)) => Some(v.clone()),
            _ => None,
        };
        let int = |k: &str| match s.get_meta(k) {
            Some(MetaValue::Int(v)) => Some(*v),
            _ => None,
        };
        let ints = |k: &str| {
            s.get(k)
                .and_then(|t| t.array::<i32>())
                .map(|a| a.iter().copied().collect())
        };
        let floats = |k: &str| {
            s.get(k)
                .and_then(|t| t.array::<f32>())
                .map(|a| a.iter().copied().collect())
        };
        let mut r = Self::new(
            text("environment")?,
            text("example_id")?,
            u64::try_from(int("policy_version")?).ok()?,
            text("rollout_uid")?,
        );
        r.replica_id = text("replica_id")?;
        r.prompt_tokens = ints("prompt_tokens")?;
        r.output_tokens = ints("output_tokens")?;
        r.logprobs = floats("logprobs")?;
        r.truncated = s.get("truncated")?.scalar_value::<bool>()?;
        r.created_ts = s.get("created_ts")?.scalar_value::<f64>()?;
        r.segment_idx = u32::try_from(s.get("segment_idx")?.scalar_value::<i64>()?).ok()?;
        r.is_last_segment = s.get("is_last_segment")?.scalar_value::<bool>()?;
        r.token_versions = s
            .get("token_versions")
            .and_then(|t| t.array::<i64>())
            .map(|a| a.iter().map(|&v| v.max(0) as u64).collect());
        r.ref_logprobs = floats("ref_logprobs");
        r.reward = s.get("reward").and_then(|t| t.scalar_value::<f64>());
        for (k, t) in s.fields() {
            if let (Some(name), Some(v)) = (k.strip_prefix("reward/"), t.scalar_value::<f64>()) {
                r.reward_components.insert(name.to_owned(), v);
            }
        }
        r.continuation_of = text("continuation_of");
        r.prefix_hash = text("prefix_hash");
        for (k, v) in s.metadata() {
            if let Some(name) = k.strip_prefix("meta/") {
                r.metadata.insert(name.to_owned(), v.clone());
            }
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_up_to_i64_max_are_valid() {
        let mut r = RolloutRecord::new("math", "e", 0, "u");
        r.output_tokens = vec![1, 2];
        r.logprobs = vec![-0.5; 2];
        r.token_versions = Some(vec![0, i64::MAX as u64]);
        assert!(r.validate().is_ok(), "i64::MAX is a version");
        r.token_versions = Some(vec![0, i64::MAX as u64 + 1]);
        assert!(r.validate().is_err(), "one past it is not");
        r.token_versions = None;
        r.policy_version = i64::MAX as u64;
        assert!(r.validate().is_ok(), "i64::MAX is a policy version");
        for past in [i64::MAX as u64 + 1, u64::MAX] {
            r.policy_version = past;
            assert!(r.validate().is_err(), "{past} is not");
        }
    }

    #[test]
    fn the_newest_version_is_the_newest_of_its_tokens_or_the_record() {
        let mut r = RolloutRecord::new("math", "ex-1", 3, "u-1");
        assert_eq!(r.newest_version(), 3, "no token versions: the record's");
        r.token_versions = Some(vec![2, 5, 4]);
        assert_eq!(r.newest_version(), 5);
        r.token_versions = Some(vec![1, 2]);
        assert_eq!(r.newest_version(), 3, "never older than the record's");
    }

    #[test]
    fn a_record_survives_its_sample_form() -> crate::error::Result<()> {
        let mut r = RolloutRecord::new("math", "ex-1", 3, "u-1");
        r.replica_id = "rep-2".into();
        r.created_ts = 1.5e9;
        r.prompt_tokens = vec![1, 2, 3];
        r.output_tokens = vec![4, 5];
        r.logprobs = vec![-0.5, -1.0];
        r.token_versions = Some(vec![3, 4]);
        r.ref_logprobs = Some(vec![-0.4, -0.9]);
        r.reward = Some(1.0);
        r.reward_components.insert("format".into(), 0.5);
        r.truncated = true;
        r.metadata
            .insert("temperature".into(), MetaValue::Float(0.7));
        r.segment_idx = 1;
        r.is_last_segment = false;
        r.continuation_of = Some("u-0".into());
        r.prefix_hash = Some("abc".into());
        r.validate()?;
        let back = RolloutRecord::from_sample(&r.to_sample("x".into()));
        assert_eq!(back, Some(r));
        Ok(())
    }

    #[test]
    fn rewards_that_are_not_finite_numbers_are_rejected() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut r = RolloutRecord::new("math", "ex", 0, "u-8");
            r.reward = Some(bad);
            let err = r.validate().expect_err("not finite");
            assert!(err.to_string().contains("reward"), "{err}");
            r.reward = Some(1.0);
            assert!(r.validate().is_ok());
            r.reward_components.insert("format".into(), bad);
            let err = r.validate().expect_err("a component not finite");
            assert!(err.to_string().contains("`format`"), "{err}");
        }
    }

    #[test]
    fn mismatched_per_token_arrays_are_rejected_by_uid() {
        let mut r = RolloutRecord::new("math", "ex", 0, "u-7");
        r.output_tokens = vec![1, 2, 3];
        r.logprobs = vec![0.0; 2];
        let err = r.validate().expect_err("2 logprobs for 3 tokens");
        assert!(
            matches!(&err, Error::InvalidRollout { uid, .. } if uid == "u-7"),
            "{err}"
        );
    }
}
