//! Metrics per environment, with the names of Marin's RL overview: what is in the buffer,
//! what came in since the last snapshot, rewards, and what batches used; plus the replay
//! spec's policy-lag histogram, groups ready by policy version, seal-time quantiles and the
//! dedupe, stale, eviction and filter counts.
//!
//! [`EnvMetrics`] is the plain struct; [`MetricsTracker::snapshot`] computes it (a pass
//! over the stored groups: for monitoring, not per step) and [`EnvMetrics::publish`]
//! sends it through the `metrics` facade as gauges labelled `environment`, so whatever
//! exporter the application installs (Prometheus, StatsD, ...) reports them.

use super::batcher::GroupBatch;
use super::ingest::GroupIngest;
use crate::sample::MetaValue;
use crate::SequenceBuffer;
use std::collections::BTreeMap;

/// One environment's metrics (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct EnvMetrics {
    /// The environment.
    pub environment: String,
    /// Groups stored.
    pub groups_in_buffer: u64,
    /// Rollouts in them.
    pub rollouts_in_buffer: u64,
    /// Their tokens (prompt and output). Spilled groups count from the sizes of their
    /// spilled token fields (int32 values, as `GroupIngest` stores them).
    pub tokens_in_buffer: u64,
    /// Share of stored groups at the current policy version.
    pub frac_on_policy: f64,
    /// Rollouts stored since the previous snapshot.
    pub new_rollouts: u64,
    /// Their tokens.
    pub new_tokens: u64,
    /// Their output tokens.
    pub new_generated_tokens: u64,
    /// Mean reward of the stored rollouts.
    pub reward_mean: f64,
    /// Population std of it.
    pub reward_std: f64,
    /// Share of stored rollouts that hit the length limit.
    pub frac_truncated: f64,
    /// Mean and std per reward component.
    pub reward_components: BTreeMap<String, (f64, f64)>,
    /// Rollouts used in batches / rollouts stored, since the tracker started.
    pub frac_used_in_batch: f64,
    /// Rollouts used in batches recorded since the previous snapshot.
    pub batch_rollouts_used: u64,
    /// Tokens used in them.
    pub batch_tokens_used: u64,
    /// Share of the batches' cells those tokens filled.
    pub batch_frac_used: f64,
    /// Stored groups by policy lag (current version - group version).
    pub policy_lag_histogram: BTreeMap<u64, u64>,
    /// Stored groups by policy version.
    pub ready_by_policy_version: BTreeMap<u64, u64>,
    /// Median time from a group's first rollout to its seal, ms.
    pub seal_time_ms_p50: f64,
    /// 99th percentile of it, ms.
    pub seal_time_ms_p99: f64,
    /// Duplicate rollouts dropped.
    pub duplicates: u64,
    /// Rollouts refused because another group's rollout holds their uid.
    pub uid_taken: u64,
    /// Samples dropped as stale.
    pub stale: u64,
    /// Samples evicted.
    pub evicted: u64,
    /// Groups discarded by the hooks.
    pub filtered: u64,
}

impl EnvMetrics {
    /// Sends the metrics through the `metrics` facade: gauges named
    /// `rollout_buffer_<field>` labelled `environment`, and for the histograms one gauge
    /// per bucket with a `lag` or `version` label.
    pub fn publish(&self) {
        let env = self.environment.clone();
        let gauge = |name: &'static str, value: f64| {
            metrics::gauge!(name, "environment" => env.clone()).set(value);
        };
        gauge(
            "rollout_buffer_groups_in_buffer",
            self.groups_in_buffer as f64,
        );
        gauge(
            "rollout_buffer_rollouts_in_buffer",
            self.rollouts_in_buffer as f64,
        );
        gauge(
            "rollout_buffer_tokens_in_buffer",
            self.tokens_in_buffer as f64,
        );
        gauge("rollout_buffer_frac_on_policy", self.frac_on_policy);
        gauge("rollout_buffer_new_rollouts", self.new_rollouts as f64);
        gauge("rollout_buffer_new_tokens", self.new_tokens as f64);
        gauge(
            "rollout_buffer_new_generated_tokens",
            self.new_generated_tokens as f64,
        );
        gauge("rollout_buffer_reward_mean", self.reward_mean);
        gauge("rollout_buffer_reward_std", self.reward_std);
        gauge("rollout_buffer_frac_truncated", self.frac_truncated);
        gauge("rollout_buffer_frac_used_in_batch", self.frac_used_in_batch);
        gauge(
            "rollout_buffer_batch_rollouts_used",
            self.batch_rollouts_used as f64,
        );
        gauge(
            "rollout_buffer_batch_tokens_used",
            self.batch_tokens_used as f64,
        );
        gauge("rollout_buffer_batch_frac_used", self.batch_frac_used);
        gauge("rollout_buffer_seal_time_ms_p50", self.seal_time_ms_p50);
        gauge("rollout_buffer_seal_time_ms_p99", self.seal_time_ms_p99);
        gauge("rollout_buffer_duplicates", self.duplicates as f64);
        gauge("rollout_buffer_uid_taken", self.uid_taken as f64);
        gauge("rollout_buffer_stale", self.stale as f64);
        gauge("rollout_buffer_evicted", self.evicted as f64);
        gauge("rollout_buffer_filtered", self.filtered as f64);
        for (name, (mean, std)) in &self.reward_components {
            let labels = [("environment", env.clone()), ("component", name.clone())];
            metrics::gauge!("rollout_buffer_reward_component_mean", &labels).set(*mean);
            metrics::gauge!("rollout_buffer_reward_component_std", &labels).set(*std);
        }
        for (lag, groups) in &self.policy_lag_histogram {
            let labels = [("environment", env.clone()), ("lag", lag.to_string())];
            metrics::gauge!("rollout_buffer_policy_lag_groups", &labels).set(*groups as f64);
        }
        for (version, groups) in &self.ready_by_policy_version {
            let labels = [
                ("environment", env.clone()),
                ("version", version.to_string()),
            ];
            metrics::gauge!("rollout_buffer_ready_by_policy_version", &labels).set(*groups as f64);
        }
    }
}

/// Computes [`EnvMetrics`] for one environment's buffer over time.
#[derive(Debug, Clone, Default)]
pub struct MetricsTracker {
    environment: String,
    /// Ingest totals at the previous snapshot: rollouts, tokens, generated tokens.
    seen: (u64, u64, u64),
    /// Batches recorded since the previous snapshot: rollouts, tokens, cells.
    batches: (u64, u64, u64),
    /// Rollouts used in batches since the tracker started.
    used_total: u64,
}

impl MetricsTracker {
    /// A tracker for `environment`.
    pub fn new(environment: impl Into<String>) -> Self {
        Self {
            environment: environment.into(),
            ..Self::default()
        }
    }

    /// Counts what batch `batch` used from source number `source` (its index in the
    /// batcher's sources).
    pub fn record_batch(&mut self, batch: &GroupBatch, source: usize) {
        let Some((name, _)) = batch.tokens_by_source.get(source) else {
            return;
        };
        let (mut rollouts, mut tokens) = (0u64, 0u64);
        for seg in batch.batch.rows.iter().flatten() {
            if batch.source_of(&seg.group_id) == Some(name.as_str()) {
                rollouts += 1;
                tokens += seg.len as u64;
            }
        }
        self.batches.0 += rollouts;
        self.batches.1 += tokens;
        self.batches.2 += batch.batch.input_ids.len() as u64;
        self.used_total += rollouts;
    }

    /// A snapshot of `buf` (the environment's buffer) and `ingest` (its group ingestion).
    pub fn snapshot(&mut self, buf: &SequenceBuffer, ingest: Option<&GroupIngest>) -> EnvMetrics {
        let stats = buf.stats();
        let current = stats.policy_version;
        let mut m = EnvMetrics {
            environment: self.environment.clone(),
            stale: stats.stale,
            evicted: stats.evicted,
            filtered: stats.filtered,
            ..EnvMetrics::default()
        };
        let mut rewards = Vec::new();
        let mut components: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut truncated = 0u64;
        let mut on_policy = 0u64;
        for stored in buf.contents() {
            let s = &stored.sample;
            m.groups_in_buffer += 1;
            let lengths = |key: &str| -> u64 {
                s.get(key)
                    .and_then(|t| t.lengths())
                    .map_or(0, |l| l.iter().sum::<usize>() as u64)
            };
            // A group's rollout count: `rollout_uid` holds one string per rollout, and
            // `truncated` one flag (K bytes: it stays in memory when the uids, over 1 KiB,
            // are spilled, for groups of up to 1,023 rollouts).
            let k = ["rollout_uid", "truncated", "rollout_version"]
                .iter()
                .find_map(|key| s.get(key).map(|t| t.shape().first().copied().unwrap_or(1)))
                .unwrap_or(0) as u64;
            m.rollouts_in_buffer += k;
            // Token fields are ragged i32 (K sequences: `GroupIngest` builds them from
            // `RolloutRecord`'s `Vec<i32>`); a spilled one is counted from its size, which
            // is 4 bytes per token plus 8 per sequence length.
            let tokens = |key: &str| -> u64 {
                match stored.spilled.get(key) {
                    Some(bytes) => bytes.saturating_sub(8 * k) / 4,
                    None => lengths(key),
                }
            };
            m.tokens_in_buffer += tokens("prompt_tokens") + tokens("output_tokens");
            if let Some(t) = s.get("truncated").and_then(|t| t.array::<bool>()) {
                truncated += t.iter().filter(|&&x| x).count() as u64;
            }
            if let Some(r) = s.get("reward").and_then(|t| t.array::<f64>()) {
                rewards.extend(r.iter().copied());
            }
            for (name, t) in s.fields() {
                if let (Some(c), Some(v)) = (name.strip_prefix("reward/"), t.array::<f64>()) {
                    let values = components.entry(c.to_owned()).or_default();
                    values.extend(v.iter().copied().filter(|x| x.is_finite()));
                }
            }
            if let Some(MetaValue::Int(v)) = s.get_meta(crate::buffer::POLICY_VERSION) {
                let v = u64::try_from(*v).unwrap_or(0);
                *m.ready_by_policy_version.entry(v).or_default() += 1;
                if let Some(current) = current {
                    *m.policy_lag_histogram
                        .entry(current.saturating_sub(v))
                        .or_default() += 1;
                    on_policy += u64::from(v == current);
                }
            }
        }
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        m.frac_on_policy = ratio(on_policy, m.groups_in_buffer);
        m.frac_truncated = ratio(truncated, m.rollouts_in_buffer);
        (m.reward_mean, m.reward_std) = super::advantage::mean_std(&rewards);
        m.reward_components = components
            .into_iter()
            .map(|(c, v)| (c, super::advantage::mean_std(&v)))
            .collect();
        if let Some(ingest) = ingest {
            let c = ingest.counters();
            let now = (
                c.stored_rollouts,
                c.stored_tokens,
                c.stored_generated_tokens,
            );
            m.new_rollouts = now.0 - self.seen.0.min(now.0);
            m.new_tokens = now.1 - self.seen.1.min(now.1);
            m.new_generated_tokens = now.2 - self.seen.2.min(now.2);
            m.frac_used_in_batch = ratio(self.used_total, now.0);
            self.seen = now;
            let assembled = ingest.assembler_counters();
            m.duplicates = assembled.duplicates;
            m.uid_taken = assembled.uid_taken;
            if let Some((p50, p99)) = ingest.seal_time_quantiles() {
                m.seal_time_ms_p50 = p50.as_secs_f64() * 1e3;
                m.seal_time_ms_p99 = p99.as_secs_f64() * 1e3;
            }
        }
        m.batch_rollouts_used = self.batches.0;
        m.batch_tokens_used = self.batches.1;
        m.batch_frac_used = ratio(self.batches.1, self.batches.2);
        self.batches = (0, 0, 0);
        m
    }
}
