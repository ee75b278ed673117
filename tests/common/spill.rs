//! Buffers spilled to a store, and checks of what comes back from them.

use super::faulty::FaultyStore;
use super::payload::{self, rollout, SAMPLE_BYTES};
use super::TempDir;
use rollout_buffer::persist::Store;
use rollout_buffer::{BufferConfig, RpcDef, Selection, SequenceBuffer};
use std::sync::Arc;

/// A sample's number, after checking every field of it (spilled ones too).
pub fn check(view: &rollout_buffer::SampleView<'_>) -> u64 {
    payload::check(view.id().as_str(), |k| view.get(k))
}

/// Leases one batch of the RPC `train`, checks every sample's data and commits; returns
/// the samples' numbers in batch order.
pub async fn train_one(buf: &SequenceBuffer) -> Vec<u64> {
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    let trained = batch.samples().map(|v| check(&v)).collect();
    batch.commit().await.expect("commit");
    trained
}

/// [`spilled_buffer`] of `n` samples on a [`FaultyStore`] over a new local directory
/// (kept alive by the returned guard), with one RPC `train` of batch size `batch`.
pub async fn faulty_spilled_buffer(
    name: &str,
    n: u64,
    batch: usize,
) -> (TempDir, Arc<FaultyStore>, SequenceBuffer) {
    let dir = TempDir::new(name);
    let faulty = FaultyStore::on_local_dir(dir.path());
    let store = Store::from_object_store(Arc::clone(&faulty) as _, "");
    let rpcs = vec![RpcDef::new("train", batch).inputs(["tokens", "logp"])];
    let (buf, _) = spilled_buffer(store, n, rpcs).await;
    (dir, faulty, buf)
}

/// Puts `n` samples and waits until all but the last are spilled; returns their handles
/// too.
pub async fn spilled_buffer(
    store: Store,
    n: u64,
    rpcs: Vec<RpcDef>,
) -> (SequenceBuffer, Vec<rollout_buffer::SlotHandle>) {
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(64)
            .rpcs(rpcs)
            .external_keys(["reward"])
            .memory_budget(SAMPLE_BYTES)
            .spill_to(store),
    )
    .expect("buffer");
    let mut handles = Vec::new();
    for i in 0..n {
        handles.extend(buf.put_batch(vec![rollout(i)]).await.expect("put"));
    }
    // Each put but the first waits for the spiller to write the sample before it out. The
    // last stays in memory: it fits the budget, and only being over the budget spills.
    super::wait_until(|| buf.stats().spill.spilled_now >= n - 1).await;
    (buf, handles)
}

/// A buffer whose RPC `train` leases one sample at a time in `selection` order, holding 16
/// samples spilled as one segment of 16 rows.
pub async fn one_spilled_segment(store: Store, selection: Selection) -> SequenceBuffer {
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(64)
            .rpc(
                RpcDef::new("train", 1)
                    .inputs(["tokens", "logp"])
                    .selection(selection),
            )
            .memory_budget(SAMPLE_BYTES)
            .spill_to(store),
    )
    .expect("buffer");
    // One oversized put (it fits an empty buffer), spilled as one segment.
    buf.put_batch((0..16).map(rollout).collect())
        .await
        .expect("put");
    super::wait_until(|| buf.stats().spill.spilled_now == 16).await;
    let spill = buf.stats().spill;
    assert_eq!(spill.segments_written, 1);
    assert!(spill.spilled_bytes > 0, "{spill:?}");
    buf
}
