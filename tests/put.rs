//! put is all-or-nothing, validated first, fills free slots in input order, applies
//! back-pressure and serves waiting putters in arrival order.

mod common;
use common::*;
use rollout_buffer::{Error, RpcDef, Sample, SequenceBuffer};
use std::time::Duration;

#[tokio::test]
async fn invalid_batches_are_rejected_whole() {
    let buf = ppo(4, 1);
    buf.put_batch(vec![prompt("kept")]).await.expect("put");
    let before = buf.stats();

    let dup_in_batch = vec![prompt("a"), prompt("b"), prompt("a")];
    match buf.put_batch(dup_in_batch).await {
        Err(Error::DuplicateId { id, index: 2, .. }) => assert_eq!(id, "a"),
        other => panic!("expected DuplicateId, got {other:?}"),
    }
    let dup_stored = vec![prompt("c"), prompt("kept")];
    match buf.put_batch(dup_stored).await {
        Err(Error::DuplicateId {
            id,
            index: 1,
            conflict,
        }) => {
            assert_eq!(id, "kept");
            assert!(conflict.contains("slot"), "{conflict}");
        }
        other => panic!("expected DuplicateId, got {other:?}"),
    }
    let birth0 = vec![prompt("d"), prompt("e").birth(0)];
    assert_eq!(
        buf.put_batch(birth0).await.err(),
        Some(Error::InvalidBirth {
            id: "e".into(),
            index: 1
        })
    );
    let missing = vec![prompt("f"), Sample::new("g").with("tokens", vec![1i32])];
    assert_eq!(
        buf.put_batch(missing).await.err(),
        Some(Error::MissingKey {
            id: "g".into(),
            index: 1,
            key: "prompt".into()
        })
    );
    // With two keys from the dataset, the error names the one missing.
    let two =
        SequenceBuffer::new(4, [RpcDef::new("gen", 1).inputs(["prompt", "image"])]).expect("valid");
    for (has, lacks) in [("prompt", "image"), ("image", "prompt")] {
        let sample = Sample::new("h").with(has, vec![1i32]);
        assert_eq!(
            two.put_batch(vec![sample]).await.err(),
            Some(Error::MissingKey {
                id: "h".into(),
                index: 0,
                key: lacks.into()
            })
        );
    }
    assert_eq!(
        buf.put_batch(prompts("big", 5)).await.err(),
        Some(Error::BatchTooLarge {
            len: 5,
            capacity: 4
        })
    );

    let after = buf.stats();
    assert_eq!(buf.len(), 1);
    assert_eq!(
        (after.empty, after.idle, after.put),
        (before.empty, before.idle, before.put)
    );
    assert_eq!(after.rejected, 3 + 2 + 2 + 2 + 5);
    assert_invariants(&buf);
    // The rejected ids were never reserved.
    buf.put_batch(vec![prompt("a"), prompt("c"), prompt("g")])
        .await
        .expect("ids are free");
}

#[tokio::test]
async fn handles_come_back_in_input_order() {
    let buf = ppo(8, 1);
    let h = buf.put_batch(prompts("x", 3)).await.expect("put");
    assert_eq!(
        h.iter().map(|h| h.slot()).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let h2 = buf.put_batch(prompts("y", 2)).await.expect("put");
    assert_eq!(h2.iter().map(|h| h.slot()).collect::<Vec<_>>(), vec![3, 4]);
    assert!(buf
        .put_batch(Vec::new())
        .await
        .expect("empty put")
        .is_empty());
    assert_eq!(buf.len(), 5);
    // Handle i names sample i: tag each sample through its handle, then read the tags back.
    let all: Vec<_> = h.iter().chain(&h2).copied().collect();
    let tags = (0..all.len())
        .map(|i| rollout_buffer::Patch::new().meta("tag", i as i64))
        .collect();
    buf.amend_batch(&all, tags).await.expect("amend");
    let expected = ["x-0", "x-1", "x-2", "y-0", "y-1"];
    for _ in 0..5 {
        let b = buf.get_batch_for_rpc("gen").await.expect("get");
        let s = b.sample(0).expect("sample");
        let Some(rollout_buffer::MetaValue::Int(tag)) = s.get_meta("tag") else {
            panic!("untagged sample {}", s.id());
        };
        assert_eq!(s.id().as_str(), expected[*tag as usize]);
    }
}

#[tokio::test]
async fn try_put_on_full_buffer_changes_nothing() {
    let buf = ppo(3, 1);
    buf.try_put_batch(prompts("a", 2)).await.expect("fits");
    let before = buf.stats();
    let batch = prompts("b", 2);
    let ids: Vec<String> = batch.iter().map(|s| s.id().to_string()).collect();
    match buf.try_put_batch(batch).await {
        Err(Error::Full {
            requested: 2,
            free: 1,
            samples,
        }) => {
            // The caller gets its samples back, in order, to retry with.
            let back: Vec<String> = samples
                .into_samples()
                .iter()
                .map(|s| s.id().to_string())
                .collect();
            assert_eq!(back, ids);
        }
        other => panic!("expected Full with the samples handed back, got {other:?}"),
    }
    let after = buf.stats();
    assert_eq!(
        (after.empty, after.put, buf.len()),
        (before.empty, before.put, 2)
    );
    assert_eq!(
        after.rejected,
        before.rejected + 2,
        "both counted as refused"
    );
    buf.try_put_batch(prompts("b", 1))
        .await
        .expect("one still fits");
    assert_invariants(&buf);
}

/// A one-RPC buffer whose single read frees the slot.
fn drain_buffer(capacity: usize) -> SequenceBuffer {
    SequenceBuffer::new(capacity, [RpcDef::new("take", 1).inputs(["prompt"])]).expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_waits_for_space_and_resumes_when_freed() {
    let buf = drain_buffer(2);
    buf.put_batch(prompts("a", 2)).await.expect("fill");
    let putter = tokio::spawn({
        let buf = buf.clone();
        async move { buf.put_batch(prompts("b", 2)).await }
    });
    // The putter registers in the queue; observe it through stats, not a sleep.
    wait_until(|| buf.stats().waiting_putters == 1).await;
    common::commit_next(&buf, "take").await;
    assert_eq!(
        buf.stats().waiting_putters,
        1,
        "one free slot is not enough for two"
    );
    common::commit_next(&buf, "take").await;
    let handles = tokio::time::timeout(Duration::from_secs(10), putter)
        .await
        .expect("putter woke")
        .expect("join")
        .expect("put");
    assert_eq!(handles.len(), 2);
    assert_eq!(buf.len(), 2);
    assert_invariants(&buf);
}

/// On a current-thread runtime every woken putter runs when the test task yields, so each
/// step below observes the settled state, without sleeps.
#[tokio::test(flavor = "current_thread")]
async fn waiting_putters_are_served_in_arrival_order() {
    let buf = drain_buffer(4);
    buf.put_batch(prompts("fill", 4)).await.expect("fill");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // big (3 slots) arrives first, then two small ones: small ones must not overtake it.
    for (i, n) in [(0usize, 3usize), (1, 1), (2, 1)] {
        let (b, tx) = (buf.clone(), tx.clone());
        tokio::spawn(async move {
            b.put_batch(prompts(&format!("p{i}"), n))
                .await
                .expect("put");
            tx.send(i).expect("send");
        });
        settle().await;
        assert_eq!(buf.stats().waiting_putters, i + 1);
    }
    let take = || async {
        common::commit_next(&buf, "take").await;
        settle().await;
    };
    take().await; // 1 free: p1 would fit, but big is ahead of it
    assert_eq!((buf.stats().waiting_putters, buf.len()), (3, 3));
    take().await;
    take().await; // 3 free: big goes
    assert_eq!((buf.stats().waiting_putters, buf.len()), (2, 4));
    take().await; // 1 free: p1 goes
    assert_eq!((buf.stats().waiting_putters, buf.len()), (1, 4));
    take().await; // p2 goes
    assert_eq!(buf.stats().waiting_putters, 0);
    let order: Vec<usize> = [rx.recv().await, rx.recv().await, rx.recv().await]
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(order, vec![0, 1, 2]);
    assert_invariants(&buf);
}

/// Lets every task woken so far run (current-thread runtime).
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// `contains` finds a sample from its put until it is freed, and never one not put.
#[tokio::test]
async fn contains_finds_a_sample_from_its_put_until_it_is_freed() {
    let buf = SequenceBuffer::new(4, [RpcDef::new("train", 1).inputs(["prompt"])]).expect("valid");
    assert!(!buf.contains("p-0"));
    buf.put_batch(prompts("p", 2)).await.expect("put");
    assert!(buf.contains("p-0") && buf.contains("p-1"));
    assert!(!buf.contains("p-2"));
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    let id = batch
        .samples()
        .next()
        .map(|v| v.id().as_str().to_owned())
        .expect("one");
    batch.commit().await.expect("commit");
    assert!(!buf.contains(&id), "freed after its last read");
}

#[tokio::test]
async fn a_timed_put_waits_for_room_within_its_timeout() {
    // One slot, taken: the second put waits, and a commit makes room well within its
    // timeout (a deadline counted from the wrong end fails it at once).
    let buf = SequenceBuffer::new(1, [RpcDef::new("train", 1).inputs(["prompt"])]).expect("config");
    buf.put_batch(vec![prompt("a")]).await.expect("put");
    let putter = {
        let buf = buf.clone();
        tokio::spawn(async move {
            buf.put_batch_timeout(vec![prompt("b")], Duration::from_secs(60))
                .await
        })
    };
    for _ in 0..10_000 {
        if buf.stats().waiting_putters == 1 || putter.is_finished() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(buf.stats().waiting_putters, 1, "the put waits for room");
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    batch.commit().await.expect("commit");
    let handles = putter.await.expect("task").expect("put within its timeout");
    assert_eq!((handles.len(), buf.len()), (1, 1));
    assert!(buf.contains("b"));
    assert_invariants(&buf);
}
