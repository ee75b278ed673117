//! Metrics per environment: the struct from a buffer and its ingestion, batch usage, and
//! the same values through the `metrics` facade.

mod common;

use metrics::{
    Counter, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use rollout_buffer::rollout::{
    Advantage, Batcher, BatcherConfig, GroupConfig, GroupIngest, MetricsTracker, Packer,
    RolloutRecord, Shortfall, SlimeHooks, Source, GROUP_INPUTS,
};
use rollout_buffer::{
    BufferConfig, Overflow, RpcDef, Sample, Selection, SequenceBuffer, POLICY_VERSION,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn rollout(example: usize, k: usize, version: u64) -> RolloutRecord {
    let mut r = RolloutRecord::new(
        "math",
        format!("ex{example}"),
        version,
        format!("{example}-{k}"),
    );
    r.prompt_tokens = vec![1; 4];
    r.output_tokens = vec![2; 6];
    r.logprobs = vec![-0.1; 6];
    r.reward = Some(k as f64); // 0 and 1
    r.truncated = k == 1 && example == 0;
    r.reward_components.insert("format".into(), 0.5);
    r
}

/// Groups whose token fields and rollout uids are spilled are counted as when in memory:
/// rollouts from the group's in-memory fields, tokens from the spilled fields' sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_groups_count_their_rollouts_and_tokens() {
    const GROUPS: usize = 6;
    const K: usize = 4;
    let snapshot = |budget: Option<u64>| async move {
        let mut config = BufferConfig::new(16).rpc(RpcDef::new("train", 1).inputs(GROUP_INPUTS));
        if let Some(bytes) = budget {
            config = config.memory_budget(bytes);
        }
        let buf = SequenceBuffer::with_config(config).expect("config");
        let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(K))
            .await
            .expect("start");
        for example in 0..GROUPS {
            for k in 0..K {
                let mut r = rollout(example, k, 0);
                // Over 1 KiB per group: spilled with the tokens.
                r.rollout_uid = format!("{example}-{k}-{}", "u".repeat(400));
                r.prompt_tokens = vec![1; 300 + example];
                r.output_tokens = vec![2; 500 + k];
                r.logprobs = vec![-0.1; 500 + k];
                ingest.add(r).await.expect("add");
            }
        }
        if budget.is_some() {
            // Every group but the last put is spilled.
            common::wait_until(|| buf.stats().spill.spilled_now as usize >= GROUPS - 1).await;
            let contents = buf.contents();
            let spilled = contents.iter().filter(|s| !s.spilled.is_empty()).count();
            assert!(spilled >= GROUPS - 1, "{spilled} groups spilled");
            let first = &contents[0];
            for key in ["prompt_tokens", "output_tokens", "rollout_uid"] {
                assert!(first.spilled.contains_key(key), "{key} not spilled");
                assert!(first.sample.get(key).is_none(), "{key} in memory");
            }
        }
        let m = MetricsTracker::new("math").snapshot(&buf, Some(&ingest));
        (m.groups_in_buffer, m.rollouts_in_buffer, m.tokens_in_buffer)
    };
    let tokens: usize = (0..GROUPS)
        .map(|e| K * (300 + e) + (0..K).map(|k| 500 + k).sum::<usize>())
        .sum();
    let expected = (GROUPS as u64, (GROUPS * K) as u64, tokens as u64);
    assert_eq!(snapshot(None).await, expected);
    assert_eq!(snapshot(Some(16 << 10)).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_describes_the_buffer_and_what_came_in() {
    let buf = SequenceBuffer::new(
        16,
        [RpcDef::new("train", 1)
            .inputs(GROUP_INPUTS)
            .selection(Selection::Fifo)],
    )
    .expect("config");
    buf.set_policy_version(3).expect("version");
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(2))
        .await
        .expect("start");
    for (example, version) in [(0, 3), (1, 2), (2, 3)] {
        for k in 0..2 {
            ingest.add(rollout(example, k, version)).await.expect("add");
        }
    }
    ingest.add(rollout(2, 0, 3)).await.expect("a duplicate");
    let mut tracker = MetricsTracker::new("math");
    let m = tracker.snapshot(&buf, Some(&ingest));
    assert_eq!(
        (m.groups_in_buffer, m.rollouts_in_buffer, m.tokens_in_buffer),
        (3, 6, 60)
    );
    assert_eq!(
        (m.new_rollouts, m.new_tokens, m.new_generated_tokens),
        (6, 60, 36)
    );
    assert!((m.reward_mean - 0.5).abs() < 1e-12 && (m.reward_std - 0.5).abs() < 1e-12);
    assert!((m.frac_truncated - 1.0 / 6.0).abs() < 1e-12);
    assert!((m.frac_on_policy - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(m.reward_components.get("format"), Some(&(0.5, 0.0)));
    assert_eq!(m.policy_lag_histogram, BTreeMap::from([(0, 2), (1, 1)]));
    assert_eq!(m.ready_by_policy_version, BTreeMap::from([(2, 1), (3, 2)]));
    assert_eq!(m.duplicates, 1);
    assert!(m.seal_time_ms_p99 >= m.seal_time_ms_p50);
    // A batch taking all three groups (60 tokens in 2 x 32 cells) is counted once.
    let batcher = Batcher::new(
        vec![Source {
            name: "math".into(),
            buffer: buf.clone(),
            rpc: "train".into(),
            fraction: 1.0,
        }],
        BatcherConfig {
            packer: Packer::new(32, 2),
            hooks: Arc::new(SlimeHooks { group_size: 2 }),
            advantage: Advantage::Rloo,
            dynamic: None,
            wait: Duration::from_millis(10),
            shortfall: Shortfall::ReturnShort,
        },
    )
    .expect("batcher");
    let batch = batcher.next_batch().await.expect("batch");
    tracker.record_batch(&batch, 0);
    batch.complete().await.expect("complete");
    let m = tracker.snapshot(&buf, Some(&ingest));
    assert_eq!(
        (m.new_rollouts, m.batch_rollouts_used, m.batch_tokens_used),
        (0, 6, 60)
    );
    assert_eq!(
        (m.new_tokens, m.new_generated_tokens),
        (0, 0),
        "counted since the previous snapshot"
    );
    assert!((m.batch_frac_used - 60.0 / 64.0).abs() < 1e-12);
    assert!((m.frac_used_in_batch - 1.0).abs() < 1e-12);
    assert_eq!(m.rollouts_in_buffer, 0);
    let m = tracker.snapshot(&buf, Some(&ingest));
    assert_eq!(
        m.batch_rollouts_used, 0,
        "counted since the previous snapshot"
    );
}

/// The buffer's drops (stale, evicted and filtered samples) are the environment's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_counts_stale_and_evicted_samples() {
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(3)
            .rpc(RpcDef::new("train", 1).inputs(["tokens"]).max_staleness(1))
            .overflow(Overflow::EvictOldest),
    )
    .expect("config");
    buf.set_policy_version(5).expect("version");
    let sample = |id: &str, version: i64| {
        Sample::new(id)
            .with("tokens", vec![1i32, 2])
            .meta(POLICY_VERSION, version)
    };
    // One too old (dropped at once), then four in three slots: the oldest is evicted.
    buf.put_batch(vec![sample("old", 3), sample("a", 5), sample("b", 5)])
        .await
        .expect("put");
    buf.put_batch(vec![sample("c", 5), sample("d", 5)])
        .await
        .expect("put");
    // And one discarded by its reader.
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    batch.discard().expect("discard");
    let m = MetricsTracker::new("math").snapshot(&buf, None);
    assert_eq!((m.stale, m.evicted, m.filtered), (1, 1, 1));
    let stats = buf.stats();
    assert_eq!(
        (m.stale, m.evicted, m.filtered),
        (stats.stale, stats.evicted, stats.filtered)
    );
}

/// Captures every gauge set through the facade.
#[derive(Debug, Default, Clone)]
struct Capture(Arc<Mutex<BTreeMap<String, f64>>>);

#[derive(Debug)]
struct Slot(Arc<Mutex<BTreeMap<String, f64>>>, String);

impl GaugeFn for Slot {
    fn increment(&self, value: f64) {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(self.1.clone())
            .or_default() += value;
    }
    fn decrement(&self, value: f64) {
        self.increment(-value);
    }
    fn set(&self, value: f64) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.1.clone(), value);
    }
}

impl Recorder for Capture {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Gauge::from_arc(Arc::new(Slot(Arc::clone(&self.0), name)))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_metrics_reach_the_installed_recorder() {
    let buf =
        SequenceBuffer::new(8, [RpcDef::new("train", 1).inputs(GROUP_INPUTS)]).expect("config");
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(2))
        .await
        .expect("start");
    for k in 0..2 {
        ingest.add(rollout(5, k, 0)).await.expect("add");
    }
    let m = MetricsTracker::new("math").snapshot(&buf, Some(&ingest));
    let capture = Capture::default();
    metrics::with_local_recorder(&capture, || m.publish());
    let got = capture.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(
        got.get("rollout_buffer_rollouts_in_buffer{environment=math}"),
        Some(&2.0)
    );
    assert_eq!(
        got.get("rollout_buffer_tokens_in_buffer{environment=math}"),
        Some(&20.0)
    );
    assert_eq!(
        got.get("rollout_buffer_reward_mean{environment=math}"),
        Some(&0.5)
    );
    assert_eq!(
        got.get("rollout_buffer_reward_component_mean{environment=math,component=format}"),
        Some(&0.5)
    );
}

/// Seal times are reported in milliseconds: a group whose second rollout came 250 ms
/// after its first was sealed 250 ms after it began, at the median and the 99th
/// percentile alike.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn seal_times_are_reported_in_milliseconds() {
    let buf =
        SequenceBuffer::new(4, [RpcDef::new("train", 1).inputs(GROUP_INPUTS)]).expect("config");
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(2))
        .await
        .expect("start");
    ingest.add(rollout(0, 0, 0)).await.expect("pending");
    tokio::time::advance(Duration::from_millis(250)).await;
    ingest.add(rollout(0, 1, 0)).await.expect("sealed");
    let m = MetricsTracker::new("math").snapshot(&buf, Some(&ingest));
    assert_eq!((m.seal_time_ms_p50, m.seal_time_ms_p99), (250.0, 250.0));
}
