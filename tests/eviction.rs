//! The byte budget and the overflow policies: wait (back-pressure), evict the oldest
//! fully-ready samples (never leased or unfinished ones), or reject.

mod common;

use common::{assert_invariants, ids};
use rollout_buffer::{
    BufferConfig, Error, ExitReason, FreedSink, Overflow, Patch, RpcDef, Sample, SequenceBuffer,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Records the ids of evicted samples.
#[derive(Debug, Default, Clone)]
struct Evicted(Arc<Mutex<Vec<String>>>);

impl FreedSink for Evicted {
    fn consumed(&self, _samples: Vec<Arc<Sample>>, _read_by: &[String]) {}

    fn dropped(&self, samples: Vec<Arc<Sample>>, reason: ExitReason) {
        assert_eq!(reason, ExitReason::Evicted);
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.extend(samples.iter().map(|s| s.id().to_string()));
    }
}

impl Evicted {
    fn ids(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A sample of 8 i32 tokens: 32 bytes.
fn rollout(id: &str) -> Sample {
    Sample::new(id).with("tokens", vec![0i32; 8])
}

fn trainer(
    capacity: usize,
    max_bytes: Option<u64>,
    overflow: Overflow,
) -> (SequenceBuffer, Evicted) {
    let sink = Evicted::default();
    let mut config = BufferConfig::new(capacity)
        .rpc(RpcDef::new("train", 1).inputs(["tokens"]))
        .overflow(overflow)
        .freed_sink(sink.clone());
    if let Some(max) = max_bytes {
        config = config.max_bytes(max);
    }
    (SequenceBuffer::with_config(config).expect("config"), sink)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_budget_puts_wait_until_bytes_are_freed() {
    let (buf, _) = trainer(16, Some(96), Overflow::Wait);
    buf.put_batch(vec![rollout("a"), rollout("b"), rollout("c")])
        .await
        .expect("put");
    assert_eq!(buf.stats().bytes, 96);
    // Slots are free, bytes are not.
    let err = buf
        .put_batch_timeout(vec![rollout("d")], Duration::from_millis(50))
        .await
        .expect_err("over budget");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    let buf2 = buf.clone();
    let putter = tokio::spawn(async move { buf2.put_batch(vec![rollout("d")]).await });
    common::commit_next(&buf, "train").await;
    putter.await.expect("join").expect("put after a free");
    assert_eq!((buf.len(), buf.stats().bytes), (3, 96));
    // A batch larger than the whole budget can never fit.
    let big: Vec<Sample> = (0..4).map(|i| rollout(&format!("big{i}"))).collect();
    let rejected = buf.stats().rejected;
    let err = buf.put_batch(big).await.expect_err("too big");
    assert_eq!(
        buf.stats().rejected,
        rejected + 4,
        "each sample refused counted"
    );
    assert!(
        matches!(
            err,
            Error::OverBudget {
                bytes: 128,
                max: 96
            }
        ),
        "{err}"
    );
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_oldest_skips_leased_samples() {
    let (buf, sink) = trainer(16, Some(96), Overflow::EvictOldest);
    buf.put_batch(vec![rollout("a"), rollout("b"), rollout("c")])
        .await
        .expect("put");
    let held = buf.get_batch_for_rpc("train").await.expect("get");
    assert_eq!(ids(&held), ["a"]);
    buf.put_batch(vec![rollout("d"), rollout("e")])
        .await
        .expect("put with eviction");
    // a is leased: b and c, the oldest others, made room.
    assert_eq!(sink.ids(), ["b", "c"]);
    let stats = buf.stats();
    assert_eq!((stats.evicted, stats.bytes, buf.len()), (2, 96, 3));
    held.commit().await.expect("the leased sample was kept");
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_never_takes_unfinished_samples_and_never_evicts_in_vain() {
    // A sample still waiting for gen's output is not fully ready: not evictable.
    let sink = Evicted::default();
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(3)
            .rpc(RpcDef::new("gen", 1).inputs(["prompt"]).outputs(["tokens"]))
            .rpc(RpcDef::new("train", 1).inputs(["tokens"]))
            .overflow(Overflow::EvictOldest)
            .freed_sink(sink.clone()),
    )
    .expect("config");
    let prompt = |id: &str| Sample::new(id).with("prompt", vec![1i32]);
    buf.put_batch(vec![prompt("p1"), prompt("p2"), prompt("p3")])
        .await
        .expect("put");
    // Finish gen on p1: it is now fully ready, the others are not.
    let gen = buf.get_batch_for_rpc("gen").await.expect("gen");
    gen.complete(vec![Patch::new().with("tokens", vec![5i32])])
        .await
        .expect("complete");
    // Two slots needed, one evictable: nothing is evicted, the put waits.
    let err = buf
        .put_batch_timeout(vec![prompt("q1"), prompt("q2")], Duration::from_millis(50))
        .await
        .expect_err("cannot fit");
    assert!(matches!(err, Error::Timeout { .. }));
    assert!(sink.ids().is_empty(), "evicted in vain: {:?}", sink.ids());
    // One slot: p1 goes.
    buf.put_batch(vec![prompt("q1")]).await.expect("put");
    assert_eq!(sink.ids(), ["p1"]);
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_fails_at_once_and_amends_may_overshoot() {
    let (buf, _) = trainer(4, Some(64), Overflow::Reject);
    let handles = buf
        .put_batch(vec![rollout("a"), rollout("b")])
        .await
        .expect("put");
    let err = buf.put_batch(vec![rollout("c")]).await.expect_err("full");
    assert!(matches!(err, Error::Full { .. }), "{err}");
    assert_eq!(buf.stats().rejected, 1);
    // An amend never waits: it grows a sample past the budget.
    buf.amend_batch(
        &handles[..1],
        vec![Patch::new().with("extra", vec![0f64; 16])],
    )
    .await
    .expect("amend");
    assert_eq!(buf.stats().bytes, 64 + 128);
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_oldest_also_applies_to_the_slot_count() {
    let (buf, sink) = trainer(2, None, Overflow::EvictOldest);
    buf.put_batch(vec![rollout("a"), rollout("b")])
        .await
        .expect("put");
    buf.put_batch(vec![rollout("c")]).await.expect("put");
    assert_eq!(sink.ids(), ["a"]);
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    assert_eq!(ids(&batch), ["b"]);
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_fails_at_once_when_slots_run_out() {
    // No byte budget: two slots, both taken, so the third put is refused at once.
    let (buf, _) = trainer(2, None, Overflow::Reject);
    buf.put_batch(vec![rollout("a"), rollout("b")])
        .await
        .expect("put");
    let refused = tokio::time::timeout(Duration::from_secs(30), buf.put_batch(vec![rollout("c")]))
        .await
        .expect("refused at once, not left waiting");
    assert!(
        matches!(
            refused,
            Err(Error::Full {
                requested: 1,
                free: 0,
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!((buf.len(), buf.stats().rejected), (2, 1));
    assert_invariants(&buf);
}

/// A put of an id already stored fails at once on a full buffer: it neither waits for room
/// nor evicts samples to make room it could not use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_of_a_stored_id_into_a_full_buffer_fails_at_once() {
    for overflow in [Overflow::Wait, Overflow::EvictOldest] {
        let (buf, evicted) = trainer(2, None, overflow);
        buf.put_batch(vec![rollout("a"), rollout("b")])
            .await
            .expect("put");
        let put = buf.put_batch(vec![rollout("c"), rollout("a")]);
        let err = tokio::time::timeout(Duration::from_secs(10), put)
            .await
            .expect("no wait for room")
            .expect_err("a is stored");
        assert!(
            matches!(&err, Error::DuplicateId { id, index: 1, .. } if id == "a"),
            "{overflow:?}: {err:?}"
        );
        assert_eq!(buf.len(), 2, "{overflow:?}");
        assert_eq!(evicted.ids(), Vec::<String>::new(), "{overflow:?}");
        assert_invariants(&buf);
    }
}
