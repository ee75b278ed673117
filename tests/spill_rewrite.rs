//! Sparse spill segments rewritten with their live rows: after commits, after evictions,
//! for samples spilled in two parts; spared when their last rows are read ahead; and the
//! read-ahead of a `Fifo` get. (The rest of spilling: `spill.rs`.)

mod common;

use common::payload::{self, rollout, SAMPLE_BYTES};
use common::spill::{check, one_spilled_segment, train_one};
use common::{assert_invariants, TempDir};
use rollout_buffer::persist::Store;
use rollout_buffer::{BufferConfig, Patch, RpcDef, Selection, SequenceBuffer};

fn local(dir: &TempDir) -> Store {
    Store::open(dir.path()).expect("store")
}

async fn spill_files(store: &Store) -> Vec<String> {
    store.list("spill").await.expect("list")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_segment_is_rewritten_and_every_segment_goes_once_freed() {
    let dir = TempDir::new("spill-gc");
    // `Lifo` reads no samples ahead, so the segment's last rows sit idle once it is sparse.
    let buf = one_spilled_segment(local(&dir), Selection::Lifo).await;
    let mut trained = Vec::new();
    for _ in 0..12 {
        trained.extend(train_one(&buf).await);
    }
    // 4 live rows of 16 is not below one in four: no rewrite (`flush` waits for one in
    // flight). At 3 the segment is rewritten with them.
    buf.flush().await.expect("flush");
    assert_eq!(buf.stats().spill.segments_rewritten, 0);
    let first = spill_files(&local(&dir)).await;
    assert_eq!(first.len(), 1);
    trained.extend(train_one(&buf).await);
    common::wait_until(|| buf.stats().spill.segments_rewritten == 1).await;
    buf.flush().await.expect("flush");
    let spill = buf.stats().spill;
    assert_eq!(spill.live_segments, 1, "{spill:?}");
    assert_eq!(spill.spilled_now, 3, "{spill:?}");
    assert_eq!(
        (spill.segments_written, spill.segments_deleted),
        (2, 1),
        "{spill:?}"
    );
    // The three rows now live in the new segment: the old one's file is gone.
    let second = spill_files(&local(&dir)).await;
    assert!(
        second.len() == 1 && second != first,
        "{first:?} then {second:?}"
    );
    assert_invariants(&buf);
    for _ in 0..3 {
        trained.extend(train_one(&buf).await);
    }
    assert_eq!(trained, (0..16).rev().collect::<Vec<_>>());
    buf.flush().await.expect("flush");
    assert_eq!(buf.stats().spill.live_segments, 0);
    assert_eq!(spill_files(&local(&dir)).await, Vec::<String>::new());
}

/// A `Fifo` drain leaves a segment's last rows read ahead when it becomes sparse: those
/// are about to be freed, so the segment is not rewritten, and goes once they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_segment_whose_rows_are_read_ahead_is_not_rewritten() {
    let dir = TempDir::new("spill-gc-ahead");
    let buf = one_spilled_segment(local(&dir), Selection::Fifo).await;
    let mut trained = Vec::new();
    for _ in 0..16 {
        trained.extend(train_one(&buf).await);
        // `flush` waits for a rewrite in flight, so one started by this commit is seen.
        buf.flush().await.expect("flush");
        assert_eq!(buf.stats().spill.segments_rewritten, 0);
    }
    assert_eq!(trained, (0..16).collect::<Vec<_>>());
    let spill = buf.stats().spill;
    assert_eq!(
        (spill.segments_written, spill.live_segments),
        (1, 0),
        "{spill:?}"
    );
    assert_eq!(spill_files(&local(&dir)).await, Vec::<String>::new());
}

/// A sample spilled in two parts (its rollout, then a large field amended in) keeps both
/// through the rewrites of the two segments, whose rows have the same numbers: each part
/// is moved by its segment and row, not by either alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_spilled_in_two_parts_keeps_both_through_rewrites() {
    let dir = TempDir::new("spill-two-parts");
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(64)
            .rpc(
                RpcDef::new("train", 1)
                    .inputs(["tokens", "logp", "values"])
                    .selection(Selection::Lifo),
            )
            .external_keys(["values"])
            .memory_budget(SAMPLE_BYTES)
            .spill_to(local(&dir)),
    )
    .expect("buffer");
    let handles = buf
        .put_batch((0..16).map(rollout).collect())
        .await
        .expect("put");
    common::wait_until(|| buf.stats().spill.spilled_now == 16).await;
    let values = |i: u64| vec![i as f32 + 0.5; payload::TOKENS];
    let patches = (0..16)
        .map(|i| Patch::new().with("values", values(i)))
        .collect();
    buf.amend_batch(&handles, patches).await.expect("amend");
    common::wait_until(|| buf.stats().spill.live_segments == 2).await;
    let mut trained = Vec::new();
    let train = || async {
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        let view = batch.samples().next().expect("one sample");
        let i = check(&view);
        let got = view.get("values").and_then(|t| t.array::<f32>());
        assert_eq!(
            got.map(|a| a.iter().copied().collect()),
            Some(values(i)),
            "sample {i}"
        );
        batch.commit().await.expect("commit");
        i
    };
    for _ in 0..13 {
        trained.push(train().await);
    }
    // 3 live rows of 16 in each segment: both are rewritten.
    common::wait_until(|| buf.stats().spill.segments_rewritten == 2).await;
    buf.flush().await.expect("flush");
    assert_eq!(buf.stats().spill.live_segments, 2);
    for _ in 0..3 {
        trained.push(train().await);
    }
    assert_eq!(trained, (0..16).rev().collect::<Vec<_>>());
    buf.flush().await.expect("flush");
    assert_eq!(spill_files(&local(&dir)).await, Vec::<String>::new());
    assert_invariants(&buf);
}

/// Evictions alone leave a spilled segment sparse: the put that evicts wakes the spiller to
/// rewrite it, and nothing else would (the put's own samples fit the budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_left_sparse_by_evictions_is_rewritten() {
    let dir = TempDir::new("spill-evicted");
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(16)
            .rpc(RpcDef::new("train", 1).inputs(["tokens", "logp"]))
            .overflow(rollout_buffer::Overflow::EvictOldest)
            .memory_budget(SAMPLE_BYTES)
            .spill_to(local(&dir)),
    )
    .expect("buffer");
    buf.put_batch((0..16).map(rollout).collect())
        .await
        .expect("put");
    common::wait_until(|| buf.stats().spill.spilled_now == 16).await;
    // 13 rollouts of one token evict the 13 oldest: 3 live rows of 16.
    let short = (100..113).map(|i| {
        rollout_buffer::Sample::new(i)
            .with("tokens", vec![1i32])
            .with("logp", vec![-1f32])
    });
    buf.put_batch(short.collect()).await.expect("evicting put");
    common::wait_until(|| buf.stats().spill.segments_rewritten == 1).await;
    buf.flush().await.expect("flush");
    let spill = buf.stats().spill;
    assert_eq!(
        (spill.live_segments, spill.spilled_now),
        (1, 3),
        "{spill:?}"
    );
    let mut trained = Vec::new();
    for _ in 0..3 {
        trained.extend(train_one(&buf).await);
    }
    // `Fifo`: the three left of the first put, oldest first.
    assert_eq!(trained, vec![13, 14, 15]);
    assert_invariants(&buf);
}

/// A `Fifo` get loads its own samples and reads ahead the next two batches' worth, each
/// once: the next get finds its sample loaded and reads ahead one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_get_reads_ahead_its_next_two_batches() {
    let dir = TempDir::new("spill-read-ahead");
    let buf = one_spilled_segment(local(&dir), Selection::Fifo).await;
    let first = buf.get_batch_for_rpc("train").await.expect("get");
    let spill = buf.stats().spill;
    assert_eq!((spill.loads, spill.shared_loads), (3, 0), "{spill:?}");
    assert_eq!(first.samples().map(|v| check(&v)).collect::<Vec<_>>(), [0]);
    first.commit().await.expect("commit");
    let second = buf.get_batch_for_rpc("train").await.expect("get");
    let spill = buf.stats().spill;
    assert_eq!((spill.loads, spill.shared_loads), (4, 1), "{spill:?}");
    assert_eq!(second.samples().map(|v| check(&v)).collect::<Vec<_>>(), [1]);
    second.commit().await.expect("commit");
    assert_invariants(&buf);
}
