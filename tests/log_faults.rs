//! Fault injection under the write-ahead log: a store that fails, tears or stalls writes.
//! The caller of the failing operation gets the error and nothing of it is applied; the
//! buffer keeps serving what it holds; once the store works again so does the buffer, and
//! a reopen recovers exactly what the buffer acknowledged.
#![cfg(feature = "persist")]

mod common;

use common::faulty::{Fault, FaultyStore};
use common::wait_until;
use object_store::memory::InMemory;
use rollout_buffer::persist::{Durability, PersistOptions, Store};
use rollout_buffer::{BufferConfig, Error, Patch, RpcDef, Sample, SequenceBuffer, StoredSample};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

fn config() -> BufferConfig {
    BufferConfig::new(16)
        .rpc(RpcDef::new("gen", 1).inputs(["prompt"]).outputs(["tokens"]))
        .rpc(RpcDef::new("train", 1).inputs(["tokens", "score"]))
        .external_keys(["score"])
}

async fn open(store: &Store, durability: Durability) -> SequenceBuffer {
    open_with(store, config(), durability).await
}

async fn open_with(store: &Store, config: BufferConfig, durability: Durability) -> SequenceBuffer {
    let options = PersistOptions::new().durability(durability).archive(None);
    SequenceBuffer::open_in(store.clone(), config, options)
        .await
        .expect("opens")
}

fn faulty() -> (Arc<FaultyStore>, Store) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let store = Store::from_object_store(Arc::clone(&faulty) as _, "run");
    (faulty, store)
}

fn prompt(id: &str) -> Sample {
    Sample::new(id).with("prompt", vec![1i32, 2])
}

fn sorted(mut c: Vec<StoredSample>) -> Vec<StoredSample> {
    c.sort_by(|a, b| a.sample.id().as_str().cmp(b.sample.id().as_str()));
    c
}

fn is_storage(e: &Error) -> bool {
    matches!(e, Error::Storage { path, .. } if path.starts_with("wal/"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_failures_reach_their_callers_and_undo_nothing_else() {
    let (faults, store) = faulty();
    let buf = open(&store, Durability::Sync).await;
    let handles = buf.put_batch(vec![prompt("a")]).await.expect("put a");

    faults.set(Fault::Fail);
    let err = buf
        .put_batch(vec![prompt("b")])
        .await
        .expect_err("put b fails");
    assert!(is_storage(&err), "{err}");
    assert_eq!(buf.len(), 1, "nothing of the failed put is stored");
    let err = buf
        .amend_batch(&handles, vec![Patch::new().with("score", 1.0f64)])
        .await
        .expect_err("amend fails");
    assert!(is_storage(&err), "{err}");
    // Getting is not logged: the buffer keeps serving. Completing is, and fails: the
    // lease is released, not lost.
    let batch = buf
        .get_batch_for_rpc("gen")
        .await
        .expect("get while failing");
    let out = vec![Patch::new().with("tokens", vec![7i32])];
    let err = batch.complete(out).await.expect_err("complete fails");
    assert!(is_storage(&err), "{err}");
    let stats = buf.stats();
    assert_eq!((stats.rpcs[0].eligible, stats.rpcs[0].reads), (1, 0));
    let a = &buf.contents()[0];
    assert!(a.sample.get("score").is_none() && a.sample.get("tokens").is_none());
    common::assert_invariants(&buf);

    faults.set(Fault::None);
    buf.put_batch(vec![prompt("b")]).await.expect("put b again");
    buf.amend_batch(&handles, vec![Patch::new().with("score", 2.0f64)])
        .await
        .expect("amend");
    let batch = buf.get_batch_for_rpc("gen").await.expect("get");
    let out = vec![Patch::new().with("tokens", vec![8i32])];
    batch.complete(out).await.expect("complete");
    let live = sorted(buf.contents());
    assert_eq!(live.len(), 2);

    let again = open(&store, Durability::Sync).await;
    assert_eq!(sorted(again.contents()), live);
}

/// A buffer that stored `a`, then saw its put of `torn` torn (half a log group written,
/// and an error).
async fn torn_after_a() -> (Arc<FaultyStore>, Store, SequenceBuffer) {
    let (faults, store) = faulty();
    let buf = open(&store, Durability::Sync).await;
    buf.put_batch(vec![prompt("a")]).await.expect("put a");
    faults.set(Fault::Tear);
    let err = buf.put_batch(vec![prompt("torn")]).await.expect_err("torn");
    assert!(is_storage(&err), "{err}");
    assert_eq!(faults.injected.load(Ordering::SeqCst), 1);
    faults.set(Fault::None);
    (faults, store, buf)
}

async fn stored_ids(buf: &SequenceBuffer) -> Vec<String> {
    let mut ids: Vec<String> = buf
        .contents()
        .iter()
        .map(|s| s.sample.id().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_group_is_skipped_after_a_crash() {
    let (_faults, store, buf) = torn_after_a().await;
    std::mem::forget(buf); // crash: nothing more is written
    let again = open(&store, Durability::Sync).await;
    assert_eq!(stored_ids(&again).await, ["a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_group_is_abandoned_by_the_next_one() {
    let (_faults, store, buf) = torn_after_a().await;
    buf.put_batch(vec![prompt("b")]).await.expect("put b");
    std::mem::forget(buf);
    let again = open(&store, Durability::Sync).await;
    assert_eq!(stored_ids(&again).await, ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interval_mode_retries_until_the_store_is_back() {
    // A torn first attempt leaves half the group behind: the retry replaces it.
    for fault in [Fault::Fail, Fault::Tear] {
        let (faults, store) = faulty();
        let buf = open(&store, Durability::Interval(Duration::from_millis(2))).await;
        faults.set(fault);
        buf.put_batch(vec![prompt("a"), prompt("b")])
            .await
            .expect("applies at once");
        assert_eq!(buf.len(), 2);
        let err = buf.flush().await.expect_err("not durable yet");
        assert!(is_storage(&err), "{fault:?}: {err}");
        faults.set(Fault::None);
        buf.flush().await.expect("durable now");
        buf.put_batch(vec![prompt("c")]).await.expect("put c");
        buf.flush().await.expect("durable");
        let again = open(&store, Durability::Sync).await;
        assert_eq!(again.len(), 3, "{fault:?}");
        assert_eq!(
            sorted(again.contents()),
            sorted(buf.contents()),
            "{fault:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_buffer_on_the_same_store_stops_the_first_from_overwriting_it() {
    let store = Store::open("memory://").expect("memory store");
    let first = open(&store, Durability::Sync).await;
    first.put_batch(vec![prompt("a1")]).await.expect("a1");
    // A restarted job opens the store while the old one still runs.
    let second = open(&store, Durability::Sync).await;
    second.put_batch(vec![prompt("b1")]).await.expect("b1");
    let err = first
        .put_batch(vec![prompt("a2")])
        .await
        .expect_err("the first buffer no longer owns the store");
    assert!(err.to_string().contains("another buffer"), "{err}");
    // Every later change, and a flush, says why too (a bare `Closed` said nothing).
    let again = first
        .put_batch(vec![prompt("a3")])
        .await
        .expect_err("stopped");
    assert!(again.to_string().contains("another buffer"), "{again}");
    let flushed = first.flush().await.expect_err("stopped");
    assert!(flushed.to_string().contains("another buffer"), "{flushed}");
    drop((first, second));
    let third = open(&store, Durability::Sync).await;
    assert_eq!(stored_ids(&third).await, ["a1", "b1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_store_holds_up_only_the_calls_that_write() {
    let (faults, store) = faulty();
    let buf = open(&store, Durability::Sync).await;
    buf.put_batch(vec![prompt("a")]).await.expect("put a");
    faults.set(Fault::Stall);
    let putter = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.put_batch(vec![prompt("b")]).await })
    };
    wait_until(|| faults.stalled.load(Ordering::SeqCst) > 0).await;
    // Reads of what is stored go on while the write hangs; the pending put is not visible.
    let batch = buf.get_batch_for_rpc("gen").await.expect("get");
    assert_eq!(batch.ids().next().map(|id| id.as_str()), Some("a"));
    drop(batch);
    assert_eq!(buf.len(), 1);
    assert_eq!(buf.stats().putting, 1);
    faults.set(Fault::None);
    putter.await.expect("joins").expect("put b lands");
    assert_eq!(buf.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_stops_waiting_changes_nothing_about_the_outcome() {
    let (faults, store) = faulty();
    let buf = open(&store, Durability::Sync).await;
    faults.set(Fault::Stall);
    let put = tokio::time::timeout(
        Duration::from_millis(20),
        buf.put_batch(vec![prompt("gone")]),
    )
    .await;
    assert!(put.is_err(), "the put was still waiting for storage");
    faults.set(Fault::None);
    // The record reaches storage, so the put lands even though nobody waits for it.
    buf.flush().await.expect("flush");
    wait_until(|| buf.len() == 1).await;
    let again = open(&store, Durability::Sync).await;
    assert_eq!(again.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_falls_behind_holds_puts_back_instead_of_growing_memory() {
    let (faults, store) = faulty();
    let options = PersistOptions::new()
        .durability(Durability::Interval(Duration::from_millis(1)))
        .archive(None)
        .max_backlog(1); // a single unwritten put is the limit
    let buf = SequenceBuffer::open_in(store.clone(), config(), options)
        .await
        .expect("opens");
    faults.set(Fault::Stall);
    buf.put_batch(vec![prompt("a")])
        .await
        .expect("under the limit");
    wait_until(|| faults.stalled.load(Ordering::SeqCst) > 0).await;
    let err = buf
        .put_batch_timeout(vec![prompt("b")], Duration::from_millis(50))
        .await
        .expect_err("waits for the log");
    assert!(
        matches!(&err, Error::Timeout { samples, .. } if samples.len() == 1),
        "a put that waited for the log hands its sample back: {err:?}"
    );
    let refused = buf.stats().rejected;
    let err = buf
        .try_put_batch(vec![prompt("b")])
        .await
        .expect_err("no room in the log");
    assert_eq!(buf.stats().rejected, refused + 1, "counted as refused");
    // A slow log is reported as what it is, not as a full buffer (slots are free).
    match err {
        Error::Backlog {
            requested: 1,
            samples,
        } => assert_eq!(samples.into_samples()[0].id().as_str(), "b"),
        other => panic!("expected a backlog, got {other:?}"),
    }
    assert_eq!(buf.len(), 1, "nothing of the held-back puts is stored");
    let waiting = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.put_batch(vec![prompt("b")]).await })
    };
    faults.set(Fault::None);
    waiting
        .await
        .expect("joins")
        .expect("put b once the log caught up");
    assert_eq!(buf.len(), 2);
    buf.flush().await.expect("flush");
    let again = open(&store, Durability::Sync).await;
    assert_eq!(stored_ids(&again).await, ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_failed_but_landed_never_comes_back() {
    for checkpoint_every_group in [false, true] {
        let (faults, store) = faulty();
        let mut options = PersistOptions::new().archive(None);
        if checkpoint_every_group {
            options = options.checkpoint_bytes(1);
        }
        let buf = SequenceBuffer::open_in(store.clone(), config(), options)
            .await
            .expect("opens");
        buf.put_batch(vec![prompt("a")]).await.expect("put a");
        faults.set(Fault::Ghost);
        let err = buf
            .put_batch(vec![prompt("ghost")])
            .await
            .expect_err("reported failed");
        assert!(is_storage(&err), "{err}");
        faults.set(Fault::None);
        if checkpoint_every_group {
            buf.put_batch(vec![prompt("c")]).await.expect("put c");
            buf.flush().await.expect("flush");
        }
        std::mem::forget(buf); // crash
        let again = open(&store, Durability::Sync).await;
        let want: &[&str] = if checkpoint_every_group {
            &["a", "c"]
        } else {
            &["a"]
        };
        assert_eq!(stored_ids(&again).await, want);
    }
}

/// The lease of a completion whose log record is still being written is pinned: its
/// deadline passing then must not release the samples to another getter (they would be
/// served twice once the completion lands).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lease_being_completed_does_not_expire_while_its_record_is_written() {
    let (faults, store) = faulty();
    let config = BufferConfig::new(8).rpc(
        RpcDef::new("train", 1)
            .inputs(["prompt"])
            .lease_timeout(Duration::from_millis(50)),
    );
    let buf = open_with(&store, config, Durability::Sync).await;
    buf.put_batch(vec![prompt("a")]).await.expect("put");
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    faults.set(Fault::Stall);
    let commit = tokio::spawn(batch.commit());
    wait_until(|| faults.stalled.load(Ordering::SeqCst) > 0).await;
    // Paused time runs well past the lease's deadline while the record waits.
    let again = buf
        .get_batch_for_rpc_timeout("train", Duration::from_millis(500))
        .await;
    assert!(
        matches!(again, Err(Error::Timeout { .. })),
        "a lease being completed expired and its sample was served again: {:?}",
        again.map(|b| b.len())
    );
    assert_eq!(buf.stats().rpcs[0].expired_leases, 0);
    faults.set(Fault::None);
    commit.await.expect("joins").expect("the completion lands");
    assert_eq!(buf.len(), 0);
    assert_eq!(buf.stats().redelivered, 0);
}

/// A rollout waiting for its group is logged as the buffer's own writes are: with a sync
/// log its `add` answers once the entry is on storage, so a failed write reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_rollout_whose_sync_write_fails_reports_it() {
    use rollout_buffer::rollout::{GroupConfig, GroupIngest, RolloutRecord};
    let (faults, store) = faulty();
    let config = BufferConfig::new(16).rpc(RpcDef::new("train", 1).inputs(["output_tokens"]));
    let buf = open_with(&store, config, Durability::Sync).await;
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(4))
        .await
        .expect("start");
    let rollout = |uid: &str| {
        let mut r = RolloutRecord::new("math", "ex-0", 0, uid);
        r.output_tokens = vec![1, 2];
        r.logprobs = vec![-0.5; 2];
        r.reward = Some(1.0);
        r
    };
    ingest.add(rollout("u-0")).await.expect("stored");
    faults.set(Fault::Fail);
    let err = ingest
        .add(rollout("u-1"))
        .await
        .expect_err("its log write failed");
    assert!(is_storage(&err), "{err}");
}

/// A step's batch is handed out only once the step's choice is on storage: with a sync log
/// whose write fails, the get fails and the samples go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_sync_log_write_fails_hands_out_nothing() {
    let (faults, store) = faulty();
    let buf = open(&store, Durability::Sync).await;
    buf.put_batch(vec![prompt("a")]).await.expect("put");
    faults.set(Fault::Fail);
    let err = buf
        .get_batch_for_step("gen", 0)
        .await
        .expect_err("the step's choice was not stored");
    assert!(is_storage(&err), "{err}");
    assert_eq!(buf.stats().rpcs[0].eligible, 1, "the sample went back");
    faults.set(Fault::None);
    let batch = buf.get_batch_for_step("gen", 0).await.expect("get");
    assert_eq!(batch.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_fails_after_claiming_slots_lets_a_waiting_putter_in() {
    let (faults, store) = faulty();
    let buf = open_with(
        &store,
        BufferConfig::new(2).rpc(RpcDef::new("gen", 1).inputs(["prompt"])),
        Durability::Sync,
    )
    .await;
    buf.put_batch(vec![prompt("a")]).await.expect("put a");
    faults.set(Fault::Stall);
    // `b` claims the last slot and hangs in its log write.
    let failing = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.put_batch(vec![prompt("b")]).await })
    };
    wait_until(|| faults.stalled.load(Ordering::SeqCst) > 0).await;
    // `c` finds no room and waits for some.
    let waiting = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.put_batch(vec![prompt("c")]).await })
    };
    wait_until(|| buf.stats().waiting_putters == 1).await;
    assert_eq!((buf.len(), buf.stats().putting), (1, 1));
    faults.set(Fault::Fail);
    let err = failing
        .await
        .expect("joins")
        .expect_err("b's log write fails");
    assert!(is_storage(&err), "{err}");
    // The slot `b` gave back is room for `c`: it must not wait for the next free. Its own
    // write meets the same fault or goes through; either way it returns.
    let outcome = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiting putter was woken by the failed put's slot")
        .expect("joins");
    match outcome {
        Ok(handles) => assert_eq!((handles.len(), buf.len()), (1, 2)),
        Err(err) => assert!(is_storage(&err), "{err}"),
    }
    assert_eq!(buf.stats().waiting_putters, 0);
}
