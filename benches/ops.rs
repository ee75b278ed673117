//! Cost of single buffer calls with n_seqs 64 at small and large capacity: a put of 64, and
//! a get of 64 with data ready plus its commit. Neither should grow with capacity.

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

fn ops(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("ops");
    for capacity in [1_024usize, 65_536] {
        let buf = buffer(capacity);
        // Keep the buffer half full so puts and gets both always succeed.
        let mut next = 0u64;
        rt.block_on(async {
            for _ in 0..capacity / 2 / N {
                buf.put_batch(batch(next)).await.expect("fill");
                next += N as u64;
            }
        });
        group.bench_function(BenchmarkId::new("put64_get64_commit", capacity), |b| {
            b.iter_batched(
                || {
                    next += N as u64;
                    batch(next)
                },
                |samples| {
                    rt.block_on(async {
                        buf.put_batch(samples).await.expect("put");
                        buf.get_batch_for_rpc("train")
                            .await
                            .expect("get")
                            .commit()
                            .await
                            .expect("commit");
                    })
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, ops);
criterion_main!(benches);
