//! Rollouts and the trainer's buffer of the group-ingestion tests.

use rollout_buffer::persist::PersistOptions;
use rollout_buffer::rollout::RolloutRecord;
use rollout_buffer::{RpcDef, SequenceBuffer};

/// Rollout `k` of example `example` (uid `u-<example>-<k>`, reward `k`) from replica
/// `replica`.
pub fn rollout(example: usize, k: usize, replica: usize) -> RolloutRecord {
    let mut r = RolloutRecord::new(
        "math",
        format!("ex-{example}"),
        0,
        format!("u-{example}-{k}"),
    );
    r.replica_id = format!("replica-{replica}");
    r.prompt_tokens = vec![example as i32; 3];
    r.output_tokens = vec![k as i32; 4];
    r.logprobs = vec![-0.5; 4];
    r.reward = Some(k as f64);
    r
}

/// The trainer's RPC: it reads each group's output tokens and rewards.
fn train_rpc() -> RpcDef {
    RpcDef::new("train", 1).inputs(["output_tokens", "reward"])
}

/// A trainer's buffer of `capacity` groups, in memory.
pub fn trainer(capacity: usize) -> SequenceBuffer {
    SequenceBuffer::new(capacity, [train_rpc()]).expect("config")
}

/// Opens (or recovers) a trainer's buffer of 16 groups at `dir` with `options`.
pub async fn open_trainer(dir: &str, options: PersistOptions) -> SequenceBuffer {
    SequenceBuffer::open(dir, 16, [train_rpc()], options)
        .await
        .expect("open")
}
