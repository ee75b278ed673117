//! Writes a small archive of rollouts to a directory, for readers outside Rust (the Python
//! test reads it with pyarrow and DuckDB and checks it against the same formulas):
//!
//! * `n` rollouts `rollout-<i>`, birth `i + 1`, `tokens` = `0..4 + i % 3` (int32),
//!   `logprobs` = `-0.5` per token (float32), `reward` = `i * 0.5` (float64);
//! * partitions: `i % 4` = 0 -> math / v3, 1 -> code/python / v4, 2 -> math / v4,
//!   3 -> no environment or version.
//!
//! Usage: `cargo run --example write_archive -- <dir> [n]`.

use rollout_buffer::persist::{ArchiveWriter, ArchivedSample, ExitReason, Store};
use rollout_buffer::Sample;

fn rollout(i: usize) -> Sample {
    let n = 4 + i % 3;
    let s = Sample::new(format!("rollout-{i}"))
        .birth(1 + i as u64)
        .with("tokens", (0..n as i32).collect::<Vec<_>>())
        .with("logprobs", vec![-0.5f32; n])
        .with("reward", i as f64 * 0.5);
    match i % 4 {
        0 => s.meta("environment", "math").meta("policy_version", 3i64),
        1 => s
            .meta("environment", "code/python")
            .meta("policy_version", 4i64),
        2 => s.meta("environment", "math").meta("policy_version", 4i64),
        _ => s,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), rollout_buffer::Error> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "archive-demo".to_string());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    let writer = ArchiveWriter::new(Store::open(&dir)?);
    let rows: Vec<ArchivedSample> = (0..n)
        .map(|i| ArchivedSample {
            sample: rollout(i),
            read_by: vec!["gen".into(), "reward".into(), "train".into()],
            reason: ExitReason::Consumed,
        })
        .collect();
    // Two writes, as a buffer flushing twice would.
    let half = rows.len() / 2;
    let mut files = writer.write(&rows[..half]).await?;
    files.extend(writer.write(&rows[half..]).await?);
    println!(
        "wrote {} rollouts in {} files under {dir}",
        rows.len(),
        files.len()
    );
    Ok(())
}
