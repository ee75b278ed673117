//! Spilling over a failing store: a failed load is an error with the samples kept, a batch
//! never waits for its read-ahead, a try-get never serves a sample still being read, and a
//! failed spill write fails the puts that need room until the store works again; a write
//! that landed despite its error is kept, a segment whose delete failed is deleted by a
//! later flush, and one whose rows all changed or went while it was written goes at once;
//! room asked for while a write is in flight is made after it.

mod common;

use common::assert_invariants;
use common::faulty::Fault;
use common::payload::rollout;
use common::spill::{check, faulty_spilled_buffer, one_spilled_segment, train_one};
use rollout_buffer::persist::Store;
use rollout_buffer::{Error, Selection};
use std::collections::HashSet;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_is_an_error_and_the_samples_stay_for_a_retry() {
    let (_dir, faulty, buf) = faulty_spilled_buffer("spill-faults", 8, 8).await;
    faulty.fail_reads(true);
    let err = buf
        .get_batch_for_rpc("train")
        .await
        .expect_err("reads fail");
    assert!(matches!(err, Error::Storage { .. }), "{err:?}");
    assert!(
        err.to_string().contains("spill/"),
        "names the segment: {err}"
    );
    let stats = buf.stats();
    assert_eq!(stats.rpcs[0].eligible, 8, "the samples are eligible again");
    assert_eq!(stats.rpcs[0].leased, 0);
    assert_invariants(&buf);
    faulty.fail_reads(false);
    let batch = buf.get_batch_for_rpc("train").await.expect("retry");
    let ids: HashSet<u64> = batch.samples().map(|v| check(&v)).collect();
    assert_eq!(ids, (0..8).collect());
    batch.commit().await.expect("commit");
    assert!(
        faulty
            .failed_reads
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
    );
}

/// A `Fifo` get's batch is handed out once its own samples are read, without waiting
/// for the two batches of read-ahead it starts: here those reads hang until released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_does_not_wait_for_its_read_ahead() {
    let (_dir, faulty, buf) = faulty_spilled_buffer("spill-urgent", 12, 4).await;
    // The budget holds one sample, so each spilled sample has a segment of its own: the
    // batch needs at most four reads.
    faulty.hold_reads_after(4);
    let batch = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        buf.get_batch_for_rpc("train"),
    )
    .await
    .expect("the batch waited for its read-ahead")
    .expect("get");
    let ids: HashSet<u64> = batch.samples().map(|v| check(&v)).collect();
    assert_eq!(ids, (0..4).collect());
    batch.commit().await.expect("commit");
    common::wait_until(|| faulty.held_reads.load(std::sync::atomic::Ordering::SeqCst) > 0).await;
    faulty.release_reads();
    let mut trained: HashSet<u64> = ids;
    while trained.len() < 12 {
        trained.extend(train_one(&buf).await);
    }
    assert_eq!(trained, (0..12).collect());
    assert_invariants(&buf);
}

/// A put over the memory budget while the spill store fails gets the spiller's error
/// (counted in the stats) instead of waiting for room that cannot come; nothing stored is
/// lost, and puts go on once the store works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_spill_store_fails_the_puts_that_need_room() {
    let (_dir, faulty, buf) = faulty_spilled_buffer("spill-write-fails", 1, 4).await;
    faulty.set(Fault::Fail);
    let put = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        buf.put_batch(vec![rollout(1)]),
    )
    .await
    .expect("the put did not wait for room that cannot come");
    assert!(matches!(put, Err(Error::Storage { .. })), "{put:?}");
    assert!(buf.stats().spill.failures >= 1);
    assert_eq!(buf.len(), 1);
    faulty.set(Fault::None);
    // Until the spiller's next round (woken by a put, or at its backoff of at most 2 s)
    // succeeds, a put that needs room still gets the last failure: the caller retries.
    let start = std::time::Instant::now();
    for i in 1..4 {
        loop {
            match buf.put_batch(vec![rollout(i)]).await {
                Ok(_) => break,
                Err(Error::Storage { .. }) if start.elapsed().as_secs() < 60 => {
                    tokio::task::yield_now().await;
                }
                Err(e) => panic!("put {i}: {e}"),
            }
        }
    }
    let trained: HashSet<u64> = train_one(&buf).await.into_iter().collect();
    assert_eq!(trained, (0..4).collect());
}

/// `try_get_batch_for_rpc` never hands out a batch whose spilled inputs are still being
/// read: while the reads are held it answers `None` (the samples stay eligible), and once
/// they land a later try gets every sample whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_get_waits_for_no_load_and_serves_only_whole_samples() {
    let (_dir, faulty, buf) = faulty_spilled_buffer("spill-try", 4, 4).await;
    faulty.hold_reads_after(0);
    assert!(buf.try_get_batch_for_rpc("train").expect("try").is_none());
    assert_eq!(buf.stats().rpcs[0].eligible, 4, "the samples went back");
    common::wait_until(|| faulty.held_reads.load(std::sync::atomic::Ordering::SeqCst) > 0).await;
    faulty.release_reads();
    let mut batch = None;
    common::wait_until(|| {
        batch = buf.try_get_batch_for_rpc("train").expect("try");
        batch.is_some()
    })
    .await;
    let batch = batch.expect("served");
    let ids: HashSet<u64> = batch.samples().map(|v| check(&v)).collect();
    assert_eq!(ids, (0..4).collect());
    batch.commit().await.expect("commit");
}

/// The spill files under a local store's directory.
fn spill_files(dir: &common::TempDir) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(std::path::Path::new(dir.path()).join("spill")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Segments whose delete fails are kept, counted, and deleted by a later `flush` once the
/// store works again; a `flush` while deletes still fail returns instead of retrying
/// forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_whose_delete_fails_is_deleted_by_a_later_flush() {
    let (dir, faulty, buf) = faulty_spilled_buffer("spill-undeleted", 8, 4).await;
    faulty.fail_deletes(true);
    let mut trained = HashSet::new();
    while trained.len() < 8 {
        trained.extend(train_one(&buf).await);
    }
    assert_eq!(trained, (0..8).collect());
    tokio::time::timeout(std::time::Duration::from_secs(30), buf.flush())
        .await
        .expect("a flush with failing deletes returned")
        .expect("flush");
    let spill = buf.stats().spill;
    assert_eq!(spill.live_segments, 0);
    assert!(spill.undeleted_segments > 0, "{spill:?}");
    assert_eq!(
        spill_files(&dir).len() as u64,
        spill.undeleted_segments,
        "every segment left is counted"
    );
    faulty.fail_deletes(false);
    buf.flush().await.expect("flush");
    assert_eq!(buf.stats().spill.undeleted_segments, 0);
    assert_eq!(spill_files(&dir), Vec::<String>::new());
    assert_invariants(&buf);
}

/// A segment write that lands but reports a failure (its reply lost) is this write's
/// segment: adopted, not a failure that leaves the file behind for no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spill_write_that_landed_despite_its_error_is_kept() {
    let (dir, faulty, buf) = faulty_spilled_buffer("spill-ghost", 1, 4).await;
    faulty.set(Fault::Ghost);
    for i in 1..4 {
        buf.put_batch(vec![rollout(i)]).await.expect("put");
    }
    common::wait_until(|| buf.stats().spill.spilled_now >= 3).await;
    faulty.set(Fault::None);
    assert!(faulty.injected.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    let spill = buf.stats().spill;
    assert_eq!(spill.failures, 0, "{spill:?}");
    let trained: HashSet<u64> = train_one(&buf).await.into_iter().collect();
    assert_eq!(trained, (0..4).collect());
    buf.flush().await.expect("flush");
    assert_eq!(spill_files(&dir), Vec::<String>::new());
    assert_invariants(&buf);
}

/// A sample leased while the spiller writes it keeps its fields, and the segment written
/// for it, whose only row is dead on arrival, is retired at once and counted as deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_whose_rows_all_changed_while_it_was_written_is_deleted() {
    use std::sync::atomic::Ordering::SeqCst;
    let (dir, faulty, buf) = faulty_spilled_buffer("spill-dead-on-arrival", 1, 1).await;
    faulty.set(Fault::Stall);
    // Sample 1 does not fit the budget: the spiller writes sample 0 out, and stalls.
    let putter = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.put_batch(vec![rollout(1)]).await })
    };
    common::wait_until(|| faulty.stalled.load(SeqCst) > 0).await;
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    faulty.set(Fault::None);
    common::wait_until(|| buf.stats().spill.segments_written >= 1).await;
    let spill = buf.stats().spill;
    assert_eq!(spill.spilled_now, 0, "{spill:?}");
    assert_eq!(spill.segments_deleted, spill.segments_written, "{spill:?}");
    assert_eq!(batch.samples().map(|v| check(&v)).collect::<Vec<_>>(), [0]);
    batch.commit().await.expect("commit");
    putter.await.expect("join").expect("put");
    assert_eq!(train_one(&buf).await, [1]);
    buf.flush().await.expect("flush");
    assert_eq!(spill_files(&dir), Vec::<String>::new());
    assert_invariants(&buf);
}

/// A rewrite of a sparse segment whose rows are all freed while the copy is being written:
/// the old segment goes with its last row, and the copy, with no row left to point at it,
/// goes as soon as it is written. Both count as deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_segment_whose_rows_all_went_meanwhile_is_deleted() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = common::TempDir::new("spill-rewrite-dead");
    let faulty = common::faulty::FaultyStore::on_local_dir(dir.path());
    let store = Store::from_object_store(Arc::clone(&faulty) as _, "");
    // `Lifo` reads no samples ahead, so the segment's last rows sit idle once it is sparse.
    let buf = one_spilled_segment(store, Selection::Lifo).await;
    for _ in 0..12 {
        train_one(&buf).await;
    }
    faulty.set(Fault::Stall);
    // 3 live rows of 16: the rewrite starts, and its write stalls.
    let mut trained = train_one(&buf).await;
    common::wait_until(|| faulty.stalled.load(SeqCst) > 0).await;
    for _ in 0..3 {
        trained.extend(train_one(&buf).await);
    }
    assert_eq!(trained, [3, 2, 1, 0]);
    let spill = buf.stats().spill;
    assert_eq!(
        (spill.segments_deleted, spill.live_segments),
        (1, 0),
        "{spill:?}"
    );
    faulty.set(Fault::None);
    common::wait_until(|| buf.stats().spill.segments_rewritten == 1).await;
    let spill = buf.stats().spill;
    assert_eq!(
        (
            spill.segments_written,
            spill.segments_deleted,
            spill.live_segments
        ),
        (2, 2, 0),
        "{spill:?}"
    );
    buf.flush().await.expect("flush");
    assert_eq!(spill_files(&dir), Vec::<String>::new());
    assert_invariants(&buf);
}

/// Room asked for while a spill write is in flight is made by the next round, not lost
/// when the write ends: that write was picked for an earlier, smaller request. So a
/// polling producer's retry gets in once the spiller is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_asked_while_a_spill_is_written_is_made_after_it() {
    use common::payload::SAMPLE_BYTES;
    use rollout_buffer::{BufferConfig, RpcDef, SequenceBuffer};
    use std::sync::atomic::Ordering::SeqCst;
    let dir = common::TempDir::new("spill-ask-during-write");
    let faulty = common::faulty::FaultyStore::on_local_dir(dir.path());
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(8)
            .rpc(RpcDef::new("train", 4).inputs(["tokens", "logp"]))
            .memory_budget(2 * SAMPLE_BYTES)
            .spill_to(Store::from_object_store(Arc::clone(&faulty) as _, "")),
    )
    .expect("buffer");
    buf.put_batch(vec![rollout(0), rollout(1)])
        .await
        .expect("at the budget");
    faulty.set(Fault::Stall);
    // Room for one: the spiller writes one sample out, and stalls.
    let refused = buf.try_put_batch(vec![rollout(2)]).await;
    assert!(matches!(refused, Err(Error::Full { .. })), "{refused:?}");
    common::wait_until(|| faulty.stalled.load(SeqCst) > 0).await;
    // Room for two, asked while that write is in flight.
    let refused = buf.try_put_batch(vec![rollout(2), rollout(3)]).await;
    assert!(matches!(refused, Err(Error::Full { .. })), "{refused:?}");
    faulty.set(Fault::None);
    buf.flush().await.expect("flush waits for the spiller");
    assert_eq!(buf.stats().spill.spilled_now, 2, "{:?}", buf.stats().spill);
    buf.try_put_batch(vec![rollout(2), rollout(3)])
        .await
        .expect("the room asked for was made");
    assert_eq!(buf.len(), 4);
    assert_invariants(&buf);
}
