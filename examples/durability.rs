//! What durability costs: put throughput in memory, with `Durability::Interval(10ms)` and
//! with `Durability::Sync`, on a local directory; and how long recovering a million small
//! samples takes (replaying the log, then from the checkpoint that replay wrote).
//!
//! Usage: `cargo run --release --example durability -- [dir] [samples]` (default: a fresh
//! directory under the system temp dir, 1,000,000 samples).
//!
//! Samples are small rollouts: an id, 16 prompt tokens (int32). Puts go in batches of 64
//! from one task into an empty buffer large enough for all of them; "calls" is the rate the
//! put calls return at, "durable" includes waiting for the log to be on storage
//! (`flush`). Each figure is the median of five runs (min and max beside it where they
//! differ much: a checkpoint starting during a run competes for the same two cores).
//! Between runs it waits for the dropped buffer's background tasks to end.

use rollout_buffer::persist::{Durability, PersistOptions};
use rollout_buffer::{RpcDef, Sample, SequenceBuffer};
use std::time::{Duration, Instant};

const BATCH: usize = 64;

fn rpcs() -> Vec<RpcDef> {
    vec![RpcDef::new("train", BATCH).inputs(["prompt"])]
}

fn batches(run: usize, n: usize) -> Vec<Vec<Sample>> {
    (0..n / BATCH)
        .map(|b| {
            (0..BATCH)
                .map(|i| {
                    let k = b * BATCH + i;
                    Sample::new(format!("r{run}-{k}")).with("prompt", vec![k as i32; 16])
                })
                .collect()
        })
        .collect()
}

/// Puts every batch from one task; returns (calls done, everything durable).
async fn put_all(buf: &SequenceBuffer, batches: Vec<Vec<Sample>>) -> (Duration, Duration) {
    let start = Instant::now();
    for batch in batches {
        buf.put_batch(batch).await.expect("put");
    }
    let calls = start.elapsed();
    buf.flush().await.expect("flush");
    (calls, start.elapsed())
}

/// Puts with `tasks` concurrent putters (Sync mode commits their records together).
async fn put_concurrently(
    buf: &SequenceBuffer,
    batches: Vec<Vec<Sample>>,
    tasks: usize,
) -> Duration {
    let start = Instant::now();
    let mut chunks: Vec<Vec<Vec<Sample>>> = (0..tasks).map(|_| Vec::new()).collect();
    for (i, b) in batches.into_iter().enumerate() {
        chunks[i % tasks].push(b);
    }
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            let buf = buf.clone();
            tokio::spawn(async move {
                for b in chunk {
                    buf.put_batch(b).await.expect("put");
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("putter");
    }
    start.elapsed()
}

/// Waits until the dropped buffers' background tasks (the log writer, the checkpoint task
/// holding an image of the log, which frees the samples last) have ended, so that a run
/// does not pay for the previous one's teardown; gives up after a minute.
async fn settle() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let deadline = Instant::now() + Duration::from_secs(60);
    while metrics.num_alive_tasks() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn m(x: f64) -> String {
    format!("{:.2} M/s", x / 1e6)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), rollout_buffer::Error> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| {
        let d =
            std::env::temp_dir().join(format!("rollout-buffer-durability-{}", std::process::id()));
        d.to_string_lossy().into_owned()
    });
    let n: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let n = n / BATCH * BATCH;
    let checkpoint: u64 = std::env::var("CHECKPOINT_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64 << 20);
    let opts = |d: Durability| {
        PersistOptions::new()
            .durability(d)
            .archive(None)
            .checkpoint_bytes(checkpoint)
    };
    if std::env::args().nth(3).as_deref() == Some("recover") {
        // Profiling aid: only the recovery of an existing run's store.
        let start = Instant::now();
        let url = format!("{dir}/interval-0");
        let buf = SequenceBuffer::open(&url, n, rpcs(), opts(Durability::None)).await?;
        println!(
            "recovered {} samples in {:.2} s",
            buf.len(),
            start.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    println!("{n} samples of 16 int32 tokens, batches of {BATCH}, one putter; median of 5");

    // In memory: the baseline.
    let mut mem = Vec::new();
    for run in 0..5 {
        let buf = SequenceBuffer::new(n, rpcs())?;
        let (calls, _) = put_all(&buf, batches(run, n)).await;
        mem.push(rate(n, calls));
    }
    let mem = median(mem);
    println!("in memory:          calls {}", m(mem));

    let mut calls = Vec::new();
    let mut durable = Vec::new();
    for run in 0..5 {
        let url = format!("{dir}/interval-{run}");
        let buf = SequenceBuffer::open(
            &url,
            n,
            rpcs(),
            opts(Durability::Interval(Duration::from_millis(10))),
        )
        .await?;
        let (c, d) = put_all(&buf, batches(run, n)).await;
        calls.push(rate(n, c));
        durable.push(rate(n, d));
        drop(buf);
        settle().await;
    }
    let pct = |v: &[f64]| {
        let mut v: Vec<f64> = v.iter().map(|x| 100.0 * x / mem).collect();
        v.sort_by(f64::total_cmp);
        format!(
            "{:.0}% of in memory; min {:.0}%, max {:.0}%",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1]
        )
    };
    println!(
        "Interval(10ms):     calls {} ({})",
        m(median(calls.clone())),
        pct(&calls)
    );
    println!(
        "                    durable {} ({})",
        m(median(durable.clone())),
        pct(&durable)
    );

    // Sync: every call waits for its group commit, so use fewer samples.
    let sync_n = (n / 8).max(BATCH) / BATCH * BATCH;
    for tasks in [1usize, 8] {
        let mut rates = Vec::new();
        for run in 0..5 {
            let url = format!("{dir}/sync-{tasks}-{run}");
            let buf = SequenceBuffer::open(&url, sync_n, rpcs(), opts(Durability::Sync)).await?;
            let d = put_concurrently(&buf, batches(run, sync_n), tasks).await;
            rates.push(rate(sync_n, d));
            drop(buf);
            settle().await;
        }
        let r = median(rates);
        println!(
            "Sync, {tasks} putter(s):  {} ({:.0} batches of {BATCH}/s, {:.0} us per batch per putter)",
            m(r),
            r / BATCH as f64,
            1e6 * BATCH as f64 * tasks as f64 / r
        );
    }

    // Recovery of the Interval runs' store (n samples, all in the log).
    let url = format!("{dir}/interval-0");
    let start = Instant::now();
    let buf = SequenceBuffer::open(&url, n, rpcs(), opts(Durability::Sync)).await?;
    let replay = start.elapsed();
    assert_eq!(buf.len(), n);
    drop(buf);
    settle().await;
    let start = Instant::now();
    let buf = SequenceBuffer::open(&url, n, rpcs(), opts(Durability::Sync)).await?;
    let from_checkpoint = start.elapsed();
    assert_eq!(buf.len(), n);
    println!(
        "recovery of {n} samples: {:.2} s replaying the log (and writing a checkpoint), {:.2} s from the checkpoint",
        replay.as_secs_f64(),
        from_checkpoint.as_secs_f64()
    );
    drop(buf);
    if std::env::args().nth(1).is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
