//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "persist")]
pub mod faulty;
#[cfg(feature = "persist")]
pub mod groups;
pub mod payload;
#[cfg(feature = "persist")]
pub mod rollouts;
#[cfg(feature = "persist")]
pub mod spill;

use rollout_buffer::{Batch, Patch, RpcDef, Sample, SequenceBuffer, Tensor};

/// AReaL's PPO graph: gen (prompt -> tokens), reward (tokens -> reward), train (tokens, reward).
pub fn ppo(capacity: usize, n: usize) -> SequenceBuffer {
    SequenceBuffer::new(
        capacity,
        [
            RpcDef::new("gen", n).inputs(["prompt"]).outputs(["tokens"]),
            RpcDef::new("reward", n)
                .inputs(["tokens"])
                .outputs(["reward"]),
            RpcDef::new("train", n).inputs(["tokens", "reward"]),
        ],
    )
    .expect("valid PPO graph")
}

/// A sample with a `prompt` field.
/// The model tests' graph in a buffer of 32: `gen` (2 per batch) turns `prompt` into
/// `tokens`, `reward` (1) turns `tokens` into `reward`, and `train` (2, two reads) reads
/// `train_inputs`; `score` comes from outside.
pub fn gen_reward_train(train_inputs: &[&str]) -> rollout_buffer::BufferConfig {
    rollout_buffer::BufferConfig::new(32)
        .rpc(RpcDef::new("gen", 2).inputs(["prompt"]).outputs(["tokens"]))
        .rpc(
            RpcDef::new("reward", 1)
                .inputs(["tokens"])
                .outputs(["reward"]),
        )
        .rpc(
            RpcDef::new("train", 2)
                .inputs(train_inputs.iter().copied())
                .reads(2),
        )
        .external_keys(["score"])
}

pub fn prompt(id: impl ToString) -> Sample {
    Sample::new(id.to_string()).with("prompt", Tensor::from(vec![1i32, 2, 3]))
}

/// Prompt samples with ids `prefix-0 ..`.
pub fn prompts(prefix: &str, n: usize) -> Vec<Sample> {
    (0..n).map(|i| prompt(format!("{prefix}-{i}"))).collect()
}

/// The ids of a batch, in order.
pub fn ids(batch: &Batch) -> Vec<String> {
    batch.ids().map(|id| id.to_string()).collect()
}

/// One patch per sample of `batch`, setting `key` to a scalar.
pub fn patches(batch: &Batch, key: &'static str) -> Vec<Patch> {
    batch
        .samples()
        .map(|_| Patch::new().with(key, 1.0f64))
        .collect()
}

/// Leases the next batch of `rpc` (waiting for one) and commits it.
pub async fn commit_next(buf: &SequenceBuffer, rpc: &str) {
    let batch = buf
        .get_batch_for_rpc(rpc)
        .await
        .unwrap_or_else(|e| panic!("get {rpc}: {e}"));
    batch
        .commit()
        .await
        .unwrap_or_else(|e| panic!("commit {rpc}: {e}"));
}

/// Panics with the violation if the buffer's invariants do not hold.
pub fn assert_invariants(buf: &SequenceBuffer) {
    if let Err(e) = buf.check_invariants() {
        panic!("{e}");
    }
}

/// Polls a condition, yielding to the runtime between looks (no sleeps); gives up after a
/// minute of wall time so a bug fails the test instead of hanging it.
pub async fn wait_until(mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed().as_secs() < 60,
            "condition never became true"
        );
        tokio::task::yield_now().await;
    }
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rollout-buffer-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }

    pub fn path(&self) -> &str {
        self.0
            .to_str()
            .unwrap_or_else(|| panic!("non-UTF-8 temp dir"))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh prefix on the S3-compatible server named by `ROLLOUT_BUFFER_S3_URL`, or `None`
/// outside CI when it is not set (under `CI` its absence fails the test instead).
pub fn s3_url(tag: &str) -> Option<String> {
    let Ok(url) = std::env::var("ROLLOUT_BUFFER_S3_URL") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must provide ROLLOUT_BUFFER_S3_URL"
        );
        eprintln!("ROLLOUT_BUFFER_S3_URL not set: the S3 run of `{tag}` is skipped here");
        return None;
    };
    Some(format!("{url}/{tag}-{}", std::process::id()))
}
