//! Soak: a 3-RPC pipeline (gen -> reward -> train), capacity 1024, 1-4 tasks per RPC on a
//! multi-thread runtime, 16x capacity samples under back-pressure: every sample is trained
//! exactly once, the buffer ends empty, and the invariants hold throughout.

mod common;
use common::*;
use rollout_buffer::{Error, Patch};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const CAPACITY: usize = 1024;
const TOTAL: usize = 16 * CAPACITY;

async fn run(tasks_per_rpc: [usize; 3], n_seqs: usize) {
    let buf = ppo(CAPACITY, n_seqs);
    let done = Arc::new(AtomicBool::new(false));
    let checker = tokio::spawn({
        let (buf, done) = (buf.clone(), Arc::clone(&done));
        async move {
            let mut checks = 0u64;
            while !done.load(Ordering::Acquire) {
                assert_invariants(&buf);
                checks += 1;
                tokio::task::yield_now().await;
            }
            checks
        }
    });
    let mut consumers = Vec::new();
    for (rpc, &count) in ["gen", "reward", "train"].iter().zip(&tasks_per_rpc) {
        for _ in 0..count {
            let buf = buf.clone();
            let rpc = *rpc;
            consumers.push(tokio::spawn(async move {
                let mut trained = Vec::new();
                loop {
                    let batch = match buf.get_batch_for_rpc(rpc).await {
                        Ok(b) => b,
                        Err(Error::Closed) => return trained,
                        Err(e) => panic!("{rpc}: {e}"),
                    };
                    match rpc {
                        "gen" => {
                            let out = batch
                                .samples()
                                .map(|s| {
                                    let n = s.get("prompt").map_or(0, |t| t.shape()[0]) as i32;
                                    Patch::new().with("tokens", vec![n; 4])
                                })
                                .collect();
                            batch.complete(out).await.expect("gen complete");
                        }
                        "reward" => {
                            let out = patches(&batch, "reward");
                            batch.complete(out).await.expect("reward complete");
                        }
                        _ => {
                            for s in batch.samples() {
                                assert!(s.get("tokens").is_some() && s.get("reward").is_some());
                            }
                            trained.extend(ids(&batch));
                            batch.commit().await.expect("train commit");
                        }
                    }
                }
            }));
        }
    }
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let buf = buf.clone();
            tokio::spawn(async move {
                for chunk in 0..TOTAL / 2 / 64 {
                    buf.put_batch(prompts(&format!("{p}-{chunk}"), 64))
                        .await
                        .expect("put");
                }
            })
        })
        .collect();
    for p in producers {
        p.await.expect("producer");
    }
    wait_until(|| buf.is_empty()).await;
    buf.close();
    let mut trained = Vec::new();
    for c in consumers {
        trained.extend(c.await.expect("consumer"));
    }
    done.store(true, Ordering::Release);
    assert!(checker.await.expect("checker") > 0);
    let unique: HashSet<_> = trained.iter().collect();
    assert_eq!(trained.len(), TOTAL, "every sample trained");
    assert_eq!(unique.len(), TOTAL, "no sample trained twice");
    let st = buf.stats();
    assert_eq!(
        (st.put, st.freed, st.empty),
        (TOTAL as u64, TOTAL as u64, CAPACITY)
    );
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_one_task_per_rpc() {
    run([1, 1, 1], 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_many_tasks_per_rpc() {
    run([4, 2, 3], 16).await;
}
