//! Cost of one put of 64 plus one get of 64 (data ready) and its commit, n_seqs 64.
//!
//! Two series: the same 512 samples in flight at capacities 1,024 and 1,048,576 (the cost
//! must not depend on the capacity), and a buffer kept half full (512 and 32,768 samples in
//! flight at 1,024 and 65,536), where a FIFO reaches back to samples put long ago: that
//! shows what a large working set costs in cache misses.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use rollout_buffer::{RpcDef, Sample, SequenceBuffer};

const N: usize = 64;

fn buffer(capacity: usize) -> SequenceBuffer {
    SequenceBuffer::new(capacity, [RpcDef::new("train", N).inputs(["x"])]).expect("valid")
}

fn batch(start: u64) -> Vec<Sample> {
    (start..start + N as u64)
        .map(|i| Sample::new(i).with("x", 0i32))
        .collect()
}

fn bench_cycle(c: &mut Criterion, group: &str, cases: &[(usize, usize)]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group(group);
    for &(capacity, in_flight) in cases {
        let buf = buffer(capacity);
        let mut next = 0u64;
        rt.block_on(async {
            for _ in 0..in_flight / N {
                buf.put_batch(batch(next)).await.expect("fill");
                next += N as u64;
            }
        });
        let id = BenchmarkId::new(format!("in_flight_{in_flight}"), capacity);
        g.bench_function(id, |b| {
            b.iter_batched(
                || {
                    next += N as u64;
                    batch(next)
                },
                |samples| {
                    rt.block_on(async {
                        buf.put_batch(samples).await.expect("put");
                        let got = buf.get_batch_for_rpc("train").await.expect("get");
                        got.commit().await.expect("commit");
                    })
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn ops(c: &mut Criterion) {
    bench_cycle(c, "put64_get64_commit", &[(1_024, 512), (1_048_576, 512)]);
    bench_cycle(
        c,
        "put64_get64_commit_half_full",
        &[(1_024, 512), (65_536, 32_768)],
    );
}

criterion_group!(benches, ops);
criterion_main!(benches);
