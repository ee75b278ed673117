//! Wake-up latency: from the start of a put to the moment a getter parked on the RPC runs.
//! Target (issue): p99 <= 50 us; `examples/areal_workload.rs` prints p50/p99 from individual
//! samples, this bench gives criterion's distribution of the mean.

use criterion::{criterion_group, criterion_main, Criterion};
use rollout_buffer::{RpcDef, Sample, SequenceBuffer};
use std::time::{Duration, Instant};

fn wakeup(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let buf = SequenceBuffer::new(16, [RpcDef::new("r", 1).inputs(["x"])]).expect("valid");
    let mut next = 0u64;
    c.bench_function("put_to_parked_getter", |b| {
        b.iter_custom(|iters| {
            let buf = buf.clone();
            let start = next;
            next += iters;
            // Measured from a task on a worker thread, where producers and consumers run.
            let measured = rt.spawn(async move {
                let mut next = start;
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let getter = tokio::spawn({
                        let buf = buf.clone();
                        async move {
                            let batch = buf.get_batch_for_rpc("r").await.expect("get");
                            let woke = Instant::now();
                            batch.commit().await.expect("commit");
                            let _ = tx.send(woke);
                        }
                    });
                    while buf.stats().rpcs[0].waiting == 0 {
                        tokio::task::yield_now().await;
                    }
                    next += 1;
                    let sample = Sample::new(next).with("x", 0i32);
                    let t0 = Instant::now();
                    buf.put_batch(vec![sample]).await.expect("put");
                    let woke = rx.await.expect("getter ran");
                    total += woke.duration_since(t0);
                    getter.await.expect("join");
                }
                total
            });
            rt.block_on(measured).expect("measurement task")
        })
    });
}

criterion_group!(benches, wakeup);
criterion_main!(benches);
