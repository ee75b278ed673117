//! Leases: release on drop, lease timeouts, complete merges only declared outputs atomically.

mod common;
use common::*;
use rollout_buffer::{
    BufferConfig, Error, ExitReason, FreedSink, MetaValue, Patch, RpcDef, Sample, SequenceBuffer,
    DISCARD_REASON,
};
use std::time::Duration;

#[tokio::test]
async fn dropped_batch_is_redelivered_to_that_rpc_only() {
    let buf = SequenceBuffer::new(
        4,
        [
            RpcDef::new("a", 2).inputs(["x"]),
            RpcDef::new("b", 2).inputs(["x"]),
        ],
    )
    .expect("valid");
    let samples = (0..2)
        .map(|i| Sample::new(i.to_string()).with("x", 0i32))
        .collect();
    buf.put_batch(samples).await.expect("put");
    let b = buf.get_batch_for_rpc("b").await.expect("b");
    let a = buf.get_batch_for_rpc("a").await.expect("a");
    let first = ids(&a);
    drop(a);
    let st = buf.stats();
    assert_eq!((st.rpcs[0].redelivered, st.rpcs[0].eligible), (2, 2));
    assert_eq!(
        (st.rpcs[1].redelivered, st.rpcs[1].leased),
        (0, 2),
        "b's lease untouched"
    );
    let again = buf.get_batch_for_rpc("a").await.expect("redelivered");
    assert_eq!(ids(&again), first);
    again.commit().await.expect("commit");
    b.commit().await.expect("commit");
    assert!(buf.is_empty());
    assert_invariants(&buf);
}

fn timed(timeout: Duration) -> SequenceBuffer {
    SequenceBuffer::new(
        4,
        [
            RpcDef::new("gen", 1)
                .inputs(["prompt"])
                .outputs(["tokens"])
                .lease_timeout(timeout),
            RpcDef::new("train", 1).inputs(["tokens"]),
        ],
    )
    .expect("valid")
}

#[tokio::test(start_paused = true)]
async fn expired_lease_is_redelivered_and_late_complete_fails() {
    let buf = timed(Duration::from_secs(5));
    buf.put_batch(vec![prompt("s")]).await.expect("put");
    let slow = buf.get_batch_for_rpc("gen").await.expect("get");
    assert!(slow.deadline().is_some());
    // A second getter waits; it is woken by the expiry itself (paused clock auto-advances).
    let fresh = buf
        .get_batch_for_rpc("gen")
        .await
        .expect("redelivered after expiry");
    assert_eq!(ids(&fresh), ["s"]);
    let late = slow
        .complete(vec![Patch::new().with("tokens", vec![1i32])])
        .await;
    assert!(
        matches!(late, Err(Error::LeaseExpired { ref rpc, .. }) if rpc == "gen"),
        "{late:?}"
    );
    let st = buf.stats();
    assert_eq!((st.rpcs[0].expired_leases, st.rpcs[0].redelivered), (1, 1));
    assert_eq!(
        st.rpcs[1].eligible, 0,
        "nothing of the late complete was applied"
    );
    fresh
        .complete(vec![Patch::new().with("tokens", vec![2i32])])
        .await
        .expect("in time");
    let t = buf.get_batch_for_rpc("train").await.expect("train");
    let tokens = t
        .sample(0)
        .expect("sample")
        .get("tokens")
        .and_then(|t| t.array::<i32>())
        .map(|a| a.to_owned());
    assert_eq!(tokens.map(|a| a.into_raw_vec_and_offset().0), Some(vec![2]));
    assert_invariants(&buf);
}

#[tokio::test(start_paused = true)]
async fn late_complete_without_any_getter_fails_and_redelivers() {
    let buf = timed(Duration::from_secs(5));
    // The sample already holds the output, so gen may also just commit.
    buf.put_batch(vec![prompt("s").with("tokens", vec![0i32])])
        .await
        .expect("put");
    let b = buf.get_batch_for_rpc("gen").await.expect("get");
    tokio::time::advance(Duration::from_secs(6)).await;
    assert!(matches!(b.commit().await, Err(Error::LeaseExpired { .. })));
    assert_eq!(buf.stats().rpcs[0].eligible, 1);
    let b = buf.get_batch_for_rpc("gen").await.expect("again");
    tokio::time::advance(Duration::from_secs(4)).await;
    b.complete(vec![Patch::new().with("tokens", vec![1i32])])
        .await
        .expect("within the timeout");
    assert_invariants(&buf);
}

#[tokio::test(start_paused = true)]
async fn stats_reap_expired_leases() {
    let buf = timed(Duration::from_secs(1));
    buf.put_batch(vec![prompt("s")]).await.expect("put");
    let b = buf.get_batch_for_rpc("gen").await.expect("get");
    assert_eq!(buf.stats().rpcs[0].leased, 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    let st = buf.stats();
    assert_eq!(
        (st.rpcs[0].leased, st.rpcs[0].eligible, st.live_leases),
        (0, 1, 0)
    );
    drop(b); // dropping an expired batch changes nothing more
    assert_eq!(buf.stats().rpcs[0].redelivered, 1);
    assert_invariants(&buf);
}

#[tokio::test]
async fn complete_and_commit_must_give_outputs_others_read() {
    let buf = ppo(4, 1);
    buf.put_batch(vec![prompt("s")]).await.expect("put");
    let b = buf.get_batch_for_rpc("gen").await.expect("get");
    // Asked first, the batch is kept: a caller told so can still complete it.
    assert!(matches!(b.check_commit(), Err(Error::MissingOutput { .. })));
    assert_eq!(buf.stats().live_leases, 1, "checking changes nothing");
    assert_eq!(
        b.commit().await.err(),
        Some(Error::MissingOutput {
            rpc: "gen".into(),
            key: "tokens".into(),
            id: "s".into()
        })
    );
    let b = buf
        .get_batch_for_rpc("gen")
        .await
        .expect("released, so served again");
    let empty = vec![Patch::new().meta("note", "no tokens")];
    assert!(matches!(
        b.complete(empty).await,
        Err(Error::MissingOutput { .. })
    ));
    assert_eq!(buf.stats().read, 0, "nothing was applied");
    // A sample that already holds the output may be committed.
    let buf = ppo(4, 1);
    buf.put_batch(vec![prompt("t").with("tokens", vec![1i32])])
        .await
        .expect("put");
    let b = buf.get_batch_for_rpc("gen").await.expect("get");
    assert_eq!(b.check_commit(), Ok(()));
    drop(b);
    common::commit_next(&buf, "gen").await;
    assert_invariants(&buf);
}

#[tokio::test(start_paused = true)]
async fn huge_lease_timeout_means_no_deadline() {
    let buf = timed(Duration::MAX);
    buf.put_batch(vec![prompt("s")]).await.expect("put");
    let b = buf.get_batch_for_rpc("gen").await.expect("get");
    assert_eq!(b.deadline(), None);
    b.complete(vec![Patch::new().with("tokens", vec![1i32])])
        .await
        .expect("complete");
}

#[tokio::test]
async fn complete_rejects_undeclared_outputs_and_applies_nothing() {
    let buf = ppo(4, 1);
    buf.put_batch(vec![prompt("s")]).await.expect("put");
    let b = buf.get_batch_for_rpc("gen").await.expect("get");
    let bad = vec![Patch::new()
        .with("tokens", vec![1i32])
        .with("reward", 1.0f64)];
    match b.complete(bad).await {
        Err(Error::UndeclaredOutput { rpc, key, id }) => {
            assert_eq!(
                (rpc.as_str(), key.as_str(), id.as_str()),
                ("gen", "reward", "s")
            );
        }
        other => panic!("expected UndeclaredOutput, got {other:?}"),
    }
    let st = buf.stats();
    assert_eq!(
        (st.rpcs[0].eligible, st.rpcs[1].eligible, st.read),
        (1, 0, 0)
    );
    let b = buf
        .get_batch_for_rpc("gen")
        .await
        .expect("released, so served again");
    assert!(matches!(
        b.complete(vec![]).await,
        Err(Error::LengthMismatch { .. })
    ));
    assert_invariants(&buf);
}

/// A downstream getter must never see a sample whose upstream read is used but whose
/// outputs are missing: every batch "reward" gets already carries "tokens".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_is_atomic_with_the_read() {
    let buf = ppo(64, 1);
    let watcher = tokio::spawn({
        let buf = buf.clone();
        async move {
            for _ in 0..200 {
                let b = buf.get_batch_for_rpc("reward").await.expect("get");
                assert!(b.sample(0).expect("sample").get("tokens").is_some());
                let out = patches(&b, "reward");
                b.complete(out).await.expect("complete");
                // In one snapshot, every sample reward can see (eligible, leased or done)
                // comes from a gen read that already landed with its outputs.
                let st = buf.stats();
                let (gen, rew) = (&st.rpcs[0], &st.rpcs[1]);
                assert!(rew.eligible as u64 + rew.leased as u64 + rew.reads <= gen.reads);
            }
        }
    });
    for i in 0..200 {
        buf.put_batch(vec![prompt(i)]).await.expect("put");
        let g = buf.get_batch_for_rpc("gen").await.expect("gen");
        let out = g
            .samples()
            .map(|_| Patch::new().with("tokens", vec![1i32]))
            .collect();
        g.complete(out).await.expect("complete");
        let t = buf.get_batch_for_rpc("train").await.expect("train");
        t.commit().await.expect("commit");
    }
    watcher.await.expect("watcher");
    assert!(buf.is_empty());
    assert_invariants(&buf);
}

/// `live_leases` counts the batches handed out and not yet finished or released.
#[tokio::test]
async fn live_leases_counts_batches_until_they_end() {
    let buf = ppo(4, 1);
    buf.put_batch(prompts("s", 2)).await.expect("put");
    assert_eq!(buf.live_leases(), 0);
    let first = buf.get_batch_for_rpc("gen").await.expect("gen");
    let second = buf.get_batch_for_rpc("gen").await.expect("gen");
    assert_eq!(buf.live_leases(), 2);
    drop(first);
    assert_eq!(buf.live_leases(), 1, "released on drop");
    second
        .complete(vec![Patch::new().with("tokens", vec![1i32])])
        .await
        .expect("complete");
    assert_eq!(buf.live_leases(), 0);
}

/// Per sample dropped: its id, its exit and its `discard_reason`.
type Seen = Vec<(String, ExitReason, Option<MetaValue>)>;

/// Records the samples dropped, with why.
#[derive(Debug, Default, Clone)]
struct Dropped(std::sync::Arc<std::sync::Mutex<Seen>>);

impl FreedSink for Dropped {
    fn consumed(&self, _samples: Vec<std::sync::Arc<Sample>>, _read_by: &[String]) {}

    fn dropped(&self, samples: Vec<std::sync::Arc<Sample>>, reason: ExitReason) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.extend(samples.iter().map(|s| {
            let why = s.get_meta(DISCARD_REASON).cloned();
            (s.id().to_string(), reason, why)
        }));
    }
}

/// Four samples, read three at a time by `a` and all at once by `b`, with a sink of what
/// is dropped.
async fn two_readers() -> (SequenceBuffer, Dropped) {
    let sink = Dropped::default();
    let config = BufferConfig::new(4)
        .rpc(RpcDef::new("a", 3).inputs(["x"]))
        .rpc(RpcDef::new("b", 4).inputs(["x"]))
        .freed_sink(sink.clone());
    let buf = SequenceBuffer::with_config(config).expect("config");
    let samples = (0..4)
        .map(|i| Sample::new(i.to_string()).with("x", 0i32))
        .collect();
    buf.put_batch(samples).await.expect("put");
    (buf, sink)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_samples_drops_those_and_gives_the_rest_back() {
    let (buf, sink) = two_readers().await;
    let held = buf.get_batch_for_rpc("b").await.expect("b");
    let batch = buf.get_batch_for_rpc("a").await.expect("a");
    assert_eq!(ids(&batch), ["0", "1", "2"]);
    batch
        .discard_samples(&[false, true, false], "cannot convert x")
        .expect("discard");
    let st = buf.stats();
    assert_eq!((st.rpcs[0].redelivered, st.rpcs[0].eligible), (2, 3));
    // Sample 1 leaves once b's lease lets it go, as a discarded sample does.
    assert!(sink.0.lock().expect("sink").is_empty());
    held.commit().await.expect("b commits");
    assert_eq!(
        *sink.0.lock().expect("sink"),
        [(
            "1".to_owned(),
            ExitReason::Filtered,
            Some(MetaValue::Str("cannot convert x".into()))
        )]
    );
    assert_eq!(buf.stats().filtered, 1);
    let again = buf
        .get_batch_for_rpc_timeout("a", Duration::from_secs(10))
        .await
        .expect("the rest, again");
    assert_eq!(ids(&again), ["0", "2", "3"]);
    again.commit().await.expect("commit");
    assert!(buf.is_empty());
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_samples_with_a_mask_of_the_wrong_length_drops_nothing() {
    let (buf, sink) = two_readers().await;
    let batch = buf.get_batch_for_rpc("a").await.expect("a");
    let refused = batch
        .discard_samples(&[true], "bad")
        .expect_err("one flag for three");
    assert!(
        matches!(
            refused,
            Error::LengthMismatch {
                expected: 3,
                got: 1,
                ..
            }
        ),
        "{refused}"
    );
    assert!(sink.0.lock().expect("sink").is_empty());
    let again = buf.get_batch_for_rpc("a").await.expect("given back whole");
    assert_eq!(ids(&again), ["0", "1", "2"]);
    assert_eq!(buf.stats().filtered, 0);
    assert_invariants(&buf);
}
