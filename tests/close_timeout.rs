//! close() fails every waiting and later call; timeouts fail without leasing or storing.

mod common;
use common::*;
use rollout_buffer::{Error, Patch, Unstored};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_wakes_every_waiter_with_closed() {
    let buf = ppo(2, 1);
    buf.put_batch(prompts("fill", 2)).await.expect("fill");
    let mut waiters = Vec::new();
    for rpc in ["reward", "train", "reward"] {
        let buf = buf.clone();
        waiters.push(tokio::spawn(async move {
            buf.get_batch_for_rpc(rpc).await.map(|_| ())
        }));
    }
    let putter = tokio::spawn({
        let buf = buf.clone();
        async move { buf.put_batch(prompts("more", 1)).await.map(|_| ()) }
    });
    wait_until(|| {
        let st = buf.stats();
        st.waiting_putters == 1 && st.rpcs[1].waiting == 2 && st.rpcs[2].waiting == 1
    })
    .await;
    buf.close();
    for w in waiters {
        let r = tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("woken")
            .expect("join");
        assert_eq!(r, Err(Error::Closed));
    }
    let r = tokio::time::timeout(Duration::from_secs(10), putter)
        .await
        .expect("woken")
        .expect("join");
    assert_eq!(r, Err(Error::Closed));
    let st = buf.stats();
    assert_eq!(st.waiting_putters, 0);
    assert!(st.rpcs.iter().all(|r| r.waiting == 0), "{st:?}");
    assert_invariants(&buf);
}

#[tokio::test]
async fn later_calls_fail_closed_but_held_leases_can_finish() {
    let buf = ppo(4, 1);
    let h = buf.put_batch(prompts("s", 2)).await.expect("put");
    let held = buf.get_batch_for_rpc("gen").await.expect("gen");
    assert!(!buf.is_closed(), "open until closed");
    buf.close();
    assert!(buf.is_closed());
    assert_eq!(
        buf.put_batch(vec![]).await.err(),
        Some(Error::Closed),
        "even an empty put"
    );
    assert_eq!(
        buf.amend_batch(&[], vec![]).await.err(),
        Some(Error::Closed)
    );
    assert_eq!(
        buf.put_batch(prompts("x", 1)).await.err(),
        Some(Error::Closed)
    );
    assert_eq!(
        buf.try_put_batch(prompts("x", 1)).await.err(),
        Some(Error::Closed)
    );
    assert_eq!(
        buf.get_batch_for_rpc("gen").await.err(),
        Some(Error::Closed)
    );
    assert_eq!(
        buf.amend_batch(&h[1..], vec![Patch::new().with("tokens", vec![1i32])])
            .await
            .err(),
        Some(Error::Closed)
    );
    let out = vec![Patch::new().with("tokens", vec![1i32])];
    held.complete(out)
        .await
        .expect("in-flight work is not lost");
    assert_eq!(buf.stats().rpcs[0].reads, 1);
    assert_invariants(&buf);
}

#[tokio::test(start_paused = true)]
async fn timeouts_lease_and_store_nothing() {
    let buf = ppo(2, 2);
    buf.put_batch(prompts("one", 1)).await.expect("put");
    let r = buf
        .get_batch_for_rpc_timeout("gen", Duration::from_secs(3))
        .await;
    assert_eq!(
        r.err(),
        Some(Error::Timeout {
            op: "get_batch_for_rpc(gen)".into(),
            after: Duration::from_secs(3),
            samples: Unstored::default(),
        })
    );
    let st = buf.stats();
    assert_eq!((st.live_leases, st.rpcs[0].eligible), (0, 1));
    buf.put_batch(prompts("two", 1)).await.expect("put");
    let r = buf
        .put_batch_timeout(prompts("three", 1), Duration::from_secs(3))
        .await;
    match r {
        // Nothing was claimed: the caller gets the sample back to put again.
        Err(Error::Timeout { samples, .. }) => {
            let back = samples.into_samples();
            assert_eq!(back.len(), 1);
            assert!(
                back[0].id().as_str().starts_with("three"),
                "{:?}",
                back[0].id()
            );
        }
        other => panic!("expected a timeout handing the sample back, got {other:?}"),
    }
    let st = buf.stats();
    assert_eq!(
        (st.put, st.waiting_putters, st.putting, buf.len()),
        (2, 0, 0, 2)
    );
    let b = buf.get_batch_for_rpc("gen").await.expect("both ready now");
    assert_eq!(b.len(), 2);
    assert_invariants(&buf);
}

/// Durations past the clock's range are no deadline, not a panic: a put whose timeout is
/// `Duration::MAX` waits for room as one without a timeout does, and a getter whose wait
/// warning is `Duration::MAX` waits without ever warning (adding either to now overflowed,
/// and the runtime thread panicked).
#[tokio::test(start_paused = true)]
async fn a_timeout_or_wait_warning_past_the_clocks_range_waits_without_end() {
    let one = || {
        rollout_buffer::BufferConfig::new(1)
            .rpc(rollout_buffer::RpcDef::new("gen", 1).inputs(["prompt"]))
    };
    let buf = rollout_buffer::SequenceBuffer::with_config(one()).expect("buffer");
    buf.put_batch(prompts("one", 1)).await.expect("put");
    let put = buf.put_batch_timeout(prompts("two", 1), Duration::MAX);
    tokio::pin!(put);
    assert!(
        tokio::time::timeout(Duration::from_secs(3600), &mut put)
            .await
            .is_err(),
        "the put waits for room"
    );
    let b = buf.get_batch_for_rpc("gen").await.expect("get");
    b.commit().await.expect("commit");
    let handles = put.await.expect("room now: the put goes in");
    assert_eq!(handles.len(), 1);

    let quiet = rollout_buffer::SequenceBuffer::with_config(one().wait_warning(Duration::MAX))
        .expect("buffer");
    let r = quiet
        .get_batch_for_rpc_timeout("gen", Duration::from_secs(3600))
        .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert_eq!(quiet.stats().rpcs[0].wait_warnings, 0);
}
