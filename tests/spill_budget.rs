//! A spilling buffer's bookkeeping: the byte budget counts spilled fields, and a dropped
//! buffer's spiller task ends.

mod common;
use common::assert_invariants;
use common::payload::{rollout, SAMPLE_BYTES};
use rollout_buffer::persist::Store;
use rollout_buffer::{BufferConfig, Patch, RpcDef, SequenceBuffer, SlotHandle};

/// A spilling buffer dropped while its spiller is idle leaves no task behind: the drop
/// wakes the spiller, which finds the buffer gone and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_buffer_leaves_no_spiller_behind() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(64)
            .rpc(RpcDef::new("train", 4).inputs(["tokens", "logp"]))
            .memory_budget(4 * SAMPLE_BYTES)
            .spill_to(Store::open("memory://").expect("store")),
    )
    .expect("buffer");
    buf.put_batch((0..16).map(rollout).collect())
        .await
        .expect("put");
    common::wait_until(|| buf.stats().spill.spilled_samples > 0).await;
    // Caught up: the spiller is parked, waiting for more to spill.
    buf.flush().await.expect("flush");
    assert!(metrics.num_alive_tasks() > before, "the spiller runs");
    drop(buf);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while metrics.num_alive_tasks() > before {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "{} tasks left behind",
        metrics.num_alive_tasks() - before
    );
}

/// A buffer of `config` with a memory budget of one sample, spilling to memory, holding
/// four samples put one at a time, at least three of them spilled; with their handles.
async fn four_spilled(config: BufferConfig) -> (SequenceBuffer, Vec<SlotHandle>) {
    let buf = SequenceBuffer::with_config(
        config
            .memory_budget(SAMPLE_BYTES)
            .spill_to(Store::open("memory://").expect("store")),
    )
    .expect("buffer");
    let mut handles = Vec::new();
    for i in 0..4 {
        handles.extend(buf.put_batch(vec![rollout(i)]).await.expect("put"));
    }
    common::wait_until(|| buf.stats().spill.spilled_now >= 3).await;
    (buf, handles)
}

/// Under a byte budget a spilled sample counts whole, its spilled fields too, and an
/// amend adds the patch's bytes to that, whether the sample is spilled or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spilled_sample_counts_whole_against_the_byte_budget_after_an_amend() {
    let (buf, handles) = four_spilled(
        BufferConfig::new(64)
            .rpc(RpcDef::new("train", 4).inputs(["tokens", "logp", "reward"]))
            .external_keys(["reward"])
            .max_bytes(64 * SAMPLE_BYTES),
    )
    .await;
    let before = buf.stats().bytes;
    assert_eq!(before, 4 * SAMPLE_BYTES, "spilled fields count");
    let patches = (0..4)
        .map(|i| Patch::new().with("reward", i as f64))
        .collect();
    buf.amend_batch(&handles, patches).await.expect("amend");
    assert_eq!(buf.stats().bytes, before + 4 * 8, "each amend adds its f64");
    assert_invariants(&buf);
}

/// A patch that replaces every spilled field of a sample leaves nothing of it spilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_replacing_the_spilled_fields_leaves_the_sample_unspilled() {
    let (buf, handles) =
        four_spilled(BufferConfig::new(64).rpc(RpcDef::new("train", 4).inputs(["tokens", "logp"])))
            .await;
    // Small values, kept in memory whatever the budget.
    let patches = (0..4)
        .map(|_| {
            Patch::new()
                .with("tokens", vec![1i32])
                .with("logp", vec![0f32])
        })
        .collect();
    buf.amend_batch(&handles, patches).await.expect("amend");
    assert_eq!(buf.stats().spill.spilled_now, 0, "{:?}", buf.stats().spill);
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    assert!(batch.samples().all(|s| s
        .get("tokens")
        .and_then(|t| t.array::<i32>())
        .map(|a| a.len())
        == Some(1)));
    assert_invariants(&buf);
}
