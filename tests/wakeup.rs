//! No lost wake-ups, and concurrent getters of one RPC never share a sample.

mod common;
use common::*;
use rollout_buffer::{RpcDef, Sample, SequenceBuffer};
use std::collections::HashSet;
use std::time::Duration;

/// AReaL's defect: 3 getters of one RPC (n_seqs 1), then a put of 3 -> only 1 returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_getters_one_put_of_three_all_return() {
    let buf = SequenceBuffer::new(16, [RpcDef::new("only", 1).inputs(["x"])]).expect("valid");
    let mut getters = Vec::new();
    for _ in 0..3 {
        let buf = buf.clone();
        getters.push(tokio::spawn(async move {
            let b = buf.get_batch_for_rpc("only").await.expect("get");
            let id = ids(&b).remove(0);
            b.commit().await.expect("commit");
            id
        }));
    }
    // All three must be parked before the put, or the test could pass by luck.
    wait_until(|| buf.stats().rpcs[0].waiting == 3).await;
    let samples = (0..3)
        .map(|i| Sample::new(i.to_string()).with("x", 0i32))
        .collect();
    buf.put_batch(samples).await.expect("put");
    let mut got = HashSet::new();
    for g in getters {
        let id = tokio::time::timeout(Duration::from_secs(10), g)
            .await
            .expect("a getter was never woken")
            .expect("join");
        got.insert(id);
    }
    assert_eq!(got.len(), 3);
    assert!(buf.is_empty());
}

/// Many getters of one RPC on a multi-thread runtime: each sample is served to exactly one
/// of them, and every sample is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_getters_of_one_rpc_get_disjoint_samples() {
    const N: usize = 4_000;
    let buf = SequenceBuffer::new(256, [RpcDef::new("r", 4).inputs(["x"])]).expect("valid");
    let mut getters = Vec::new();
    for _ in 0..8 {
        let buf = buf.clone();
        getters.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                match buf.get_batch_for_rpc("r").await {
                    Ok(b) => {
                        seen.extend(ids(&b));
                        b.commit().await.expect("commit");
                    }
                    Err(rollout_buffer::Error::Closed) => return seen,
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    for chunk in 0..N / 40 {
        let samples = (0..40)
            .map(|i| Sample::new(format!("{chunk}-{i}")).with("x", 0i32))
            .collect();
        buf.put_batch(samples).await.expect("put");
    }
    wait_until(|| buf.is_empty()).await;
    buf.close();
    let mut all = Vec::new();
    for g in getters {
        all.extend(g.await.expect("join"));
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), N, "every sample served once");
    assert_eq!(unique.len(), N, "no sample served twice");
    assert_invariants(&buf);
}

/// A getter parked on one RPC is woken by a completion of another RPC that makes samples
/// ready for it, and by a release of its own RPC's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_releases_wake_parked_getters() {
    let buf = ppo(8, 1);
    let reward = tokio::spawn({
        let buf = buf.clone();
        async move { ids(&buf.get_batch_for_rpc("reward").await.expect("reward")) }
    });
    wait_until(|| buf.stats().rpcs[1].waiting == 1).await;
    buf.put_batch(vec![prompt("s")]).await.expect("put");
    let g = buf.get_batch_for_rpc("gen").await.expect("gen");
    let second_gen = tokio::spawn({
        let buf = buf.clone();
        async move { ids(&buf.get_batch_for_rpc("gen").await.expect("gen again")) }
    });
    wait_until(|| buf.stats().rpcs[0].waiting == 1).await;
    drop(g); // release wakes the second gen getter
    let again = tokio::time::timeout(Duration::from_secs(10), second_gen)
        .await
        .expect("release woke the getter")
        .expect("join");
    assert_eq!(again, ["s"]);
    // the second getter dropped its batch on return: lease again and complete
    let g = buf.get_batch_for_rpc("gen").await.expect("gen");
    assert_eq!(
        buf.stats().rpcs[1].waiting,
        1,
        "reward still parked before the completion"
    );
    let out = vec![rollout_buffer::Patch::new().with("tokens", vec![1i32])];
    g.complete(out).await.expect("complete");
    let got = tokio::time::timeout(Duration::from_secs(10), reward)
        .await
        .expect("completion woke the reward getter")
        .expect("join");
    assert_eq!(got, ["s"]);
}
