//! Runs rollouts through a persistent buffer on a local directory until every one is
//! consumed, so the archive under `<dir>/archive/` holds them all, for readers outside Rust
//! (the Python test reads it with pyarrow and DuckDB and checks it against the same
//! formulas):
//!
//! * `n` rollouts `rollout-<i>`, birth `i + 1`, put with a `prompt`;
//! * `gen` adds `tokens` = `0..4 + i % 3` (int32) and `logprobs` = `-0.5` per token
//!   (float32), `reward` adds `reward` = `i * 0.5` (float64), `train` reads them all;
//! * partitions: `i % 4` = 0 -> math / v3, 1 -> code/python / v4, 2 -> math / v4,
//!   3 -> no environment or version; math / v3 rollouts also carry `flagged` metadata
//!   (`i % 8 == 0`), the others none;
//! * the second half (`i >= n / 2`) also carries `judge` = `"v2"` metadata (a reward model
//!   switched on mid-run). The first half's archive is written before any of it is
//!   consumed, so the archive gains that column after files exist: they are rewritten with
//!   it (nulls), and every file keeps one schema.
//!
//! Usage: `cargo run --example write_archive -- <dir> [n]`.

use rollout_buffer::persist::{Durability, PersistOptions};
use rollout_buffer::{Patch, RpcDef, Sample, SequenceBuffer};
use std::time::Duration;

fn rollout(i: usize, n: usize) -> Sample {
    let s = Sample::new(format!("rollout-{i}"))
        .birth(1 + i as u64)
        .with("prompt", vec![i as i32]);
    let s = if i >= n / 2 { s.meta("judge", "v2") } else { s };
    match i % 4 {
        // Only this partition's rollouts carry `flagged`: the archive's files still share
        // one schema (the others hold nulls there).
        0 => s
            .meta("environment", "math")
            .meta("policy_version", 3i64)
            .meta("flagged", i.is_multiple_of(8)),
        1 => s
            .meta("environment", "code/python")
            .meta("policy_version", 4i64),
        2 => s.meta("environment", "math").meta("policy_version", 4i64),
        _ => s,
    }
}

/// The rollout number in an id `rollout-<i>`.
fn index(id: &str) -> usize {
    id.rsplit('-')
        .next()
        .and_then(|i| i.parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), rollout_buffer::Error> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "archive-demo".to_string());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    let rpcs = [
        RpcDef::new("gen", 1)
            .inputs(["prompt"])
            .outputs(["tokens", "logprobs"]),
        RpcDef::new("reward", 1)
            .inputs(["tokens"])
            .outputs(["reward"]),
        RpcDef::new("train", 1).inputs(["tokens", "logprobs", "reward"]),
    ];
    let options = PersistOptions::new().durability(Durability::Interval(Duration::from_millis(10)));
    let buf = SequenceBuffer::open(&dir, 64, rpcs, options).await?;
    let producer = {
        let buf = buf.clone();
        tokio::spawn(async move {
            for i in 0..n {
                buf.put_batch(vec![rollout(i, n)]).await?;
            }
            Ok::<_, rollout_buffer::Error>(())
        })
    };
    for i in 0..n {
        if i == n / 2 {
            // Everything archived so far lacks `judge`: write it before any row has one.
            buf.flush().await?;
        }
        let batch = buf.get_batch_for_rpc("gen").await?;
        let outputs = batch
            .ids()
            .map(|id| {
                let len = 4 + index(id.as_str()) % 3;
                Patch::new()
                    .with("tokens", (0..len as i32).collect::<Vec<_>>())
                    .with("logprobs", vec![-0.5f32; len])
            })
            .collect();
        batch.complete(outputs).await?;
        let batch = buf.get_batch_for_rpc("reward").await?;
        let outputs = batch
            .ids()
            .map(|id| Patch::new().with("reward", index(id.as_str()) as f64 * 0.5))
            .collect();
        batch.complete(outputs).await?;
        buf.get_batch_for_rpc("train").await?.commit().await?;
    }
    producer
        .await
        .map_err(|_| rollout_buffer::Error::Closed)??;
    // The log and the archive are written in the background: wait for both.
    buf.flush().await?;
    println!(
        "{n} rollouts consumed through a buffer at {dir}; {} left in it",
        buf.len()
    );
    Ok(())
}
