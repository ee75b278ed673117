//! One pipeline step, put 64 samples + lease 64 + commit, in memory and with each
//! durability mode on a local temp directory: what the log adds to a step.
//!
//! * `memory`: no persistence (the baseline);
//! * `interval_10ms`: `Durability::Interval(10ms)`, the log written in the background;
//! * `sync`: `Durability::Sync`, the put and the commit each wait for their group commit
//!   (two file writes per step: the figure is storage latency, reported as is).
//!
//! Target (issue): Interval put throughput >= 50% of in memory (the `durability` example
//! measures it at a million samples; this bench shows the per-step cost).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rollout_buffer::persist::{Durability, PersistOptions};
use rollout_buffer::{RpcDef, Sample, SequenceBuffer};
use std::time::Duration;

const BATCH: usize = 64;

fn rpcs() -> Vec<RpcDef> {
    vec![RpcDef::new("train", BATCH).inputs(["prompt"])]
}

fn step(rt: &tokio::runtime::Runtime, buf: &SequenceBuffer, next: &mut u64) {
    let samples: Vec<Sample> = (0..BATCH as u64)
        .map(|i| Sample::new(*next + i).with("prompt", vec![i as i32; 16]))
        .collect();
    *next += BATCH as u64;
    rt.block_on(async {
        buf.put_batch(samples).await.expect("put");
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        batch.commit().await.expect("commit");
    });
}

fn durability(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("rollout-buffer-bench-{}", std::process::id()));
    let mut group = c.benchmark_group("durability_step_64");
    group.throughput(Throughput::Elements(BATCH as u64));
    let modes = [
        ("memory", None),
        (
            "interval_10ms",
            Some(Durability::Interval(Duration::from_millis(10))),
        ),
        ("sync", Some(Durability::Sync)),
    ];
    for (name, mode) in modes {
        let buf = match mode {
            None => SequenceBuffer::new(4096, rpcs()).expect("buffer"),
            Some(d) => {
                let url = dir.join(name).to_string_lossy().into_owned();
                let options = PersistOptions::new().durability(d).archive(None);
                rt.block_on(SequenceBuffer::open(&url, 4096, rpcs(), options))
                    .expect("open")
            }
        };
        let mut next = 0u64;
        group.bench_function(name, |b| b.iter(|| step(&rt, &buf, &mut next)));
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, durability);
criterion_main!(benches);
