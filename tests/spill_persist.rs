//! Spilling in a persistent buffer: spill segments are the durable copy of what they hold
//! (checkpoints keep only the stubs), recovery restores spilled samples without reading
//! their fields, and orphan segments are cleared.

mod common;

use common::faulty::FaultyStore;
use common::payload::{self, rollout, SAMPLE_BYTES};
use common::TempDir;
use rollout_buffer::persist::{Durability, PersistOptions, Store};
use rollout_buffer::{BufferConfig, Patch, RpcDef, Sample, SequenceBuffer};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const N: u64 = 32;

fn check(sample: &Sample) -> u64 {
    let i = payload::check(sample.id().as_str(), |k| sample.get(k));
    let reward = sample.get("reward").and_then(|t| t.scalar_value::<f64>());
    assert_eq!(reward, Some(i as f64), "sample {i}: the amend");
    i
}

fn config(budget: Option<u64>) -> BufferConfig {
    let config = BufferConfig::new(64)
        .rpc(RpcDef::new("train", 4).inputs(["tokens", "logp", "reward"]))
        .external_keys(["reward"]);
    match budget {
        Some(b) => config.memory_budget(b),
        None => config,
    }
}

fn options(durability: Durability) -> PersistOptions {
    PersistOptions::new()
        .durability(durability)
        .archive(None)
        .checkpoint_bytes(64 << 10)
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Puts samples 0..N in fours, waits until all but the last two puts are spilled, then
/// amends every sample's reward (amends of spilled samples stay beside them, and are
/// logged as usual).
async fn put_spill_and_reward(buf: &SequenceBuffer) {
    let mut handles = Vec::new();
    for start in (0..N).step_by(4) {
        handles.extend(
            buf.put_batch((start..start + 4).map(rollout).collect())
                .await
                .expect("put"),
        );
    }
    common::wait_until(|| buf.stats().spill.spilled_now >= N - 8).await;
    let patches = (0..N)
        .map(|i| Patch::new().with("reward", i as f64))
        .collect();
    buf.amend_batch(&handles, patches).await.expect("amend");
}

async fn spilled_samples_survive_a_restart(durability: Durability, reopen_budget: Option<u64>) {
    let dir = TempDir::new("spill-persist");
    let store = || Store::open(dir.path()).expect("store");
    let budget = 4 * SAMPLE_BYTES;
    let buf = SequenceBuffer::open_in(store(), config(Some(budget)), options(durability))
        .await
        .expect("open");
    put_spill_and_reward(&buf).await;
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    let mut trained: HashSet<u64> = batch.samples().map(|v| check(&v.to_sample())).collect();
    batch.commit().await.expect("commit");
    buf.flush().await.expect("flush");
    drop(buf);

    let buf = SequenceBuffer::open_in(store(), config(reopen_budget), options(durability))
        .await
        .expect("reopen");
    // Everything spilled before the flush comes back spilled (the spiller may have moved
    // a few more since, whose records the flush did not wait for: they come back whole).
    let stats = buf.stats();
    let spilled_before = stats.spill.spilled_now;
    assert!(spilled_before >= N - 8 - 4, "{:?}", stats.spill);
    assert_eq!(stats.spill.loads, 0, "recovery read spilled fields");
    // The checkpoint written at open holds the stubs, not the spilled fields.
    let checkpoint = dir_bytes(&std::path::Path::new(dir.path()).join("segments"));
    assert!(
        checkpoint < spilled_before * SAMPLE_BYTES / 4,
        "checkpoint of {checkpoint} bytes for {spilled_before} spilled samples"
    );
    common::assert_invariants(&buf);
    let contents = buf.contents_loaded().await.expect("contents");
    assert_eq!(contents.len() as u64, N - 4);
    for stored in &contents {
        check(&stored.sample);
    }
    while (trained.len() as u64) < N {
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        for view in batch.samples() {
            assert!(trained.insert(check(&view.to_sample())), "trained twice");
        }
        batch.commit().await.expect("commit");
    }
    buf.flush().await.expect("flush");
    assert_eq!(buf.stats().spill.live_segments, 0);
    assert_eq!(
        store().list("spill").await.expect("list"),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_spilled_samples_survive_a_restart_without_being_read() {
    spilled_samples_survive_a_restart(Durability::Sync, Some(4 * SAMPLE_BYTES)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interval_spilled_samples_survive_a_restart_without_being_read() {
    let interval = Durability::Interval(std::time::Duration::from_millis(5));
    spilled_samples_survive_a_restart(interval, Some(4 * SAMPLE_BYTES)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_reopened_without_a_budget_still_reads_spilled_samples() {
    spilled_samples_survive_a_restart(Durability::Sync, None).await;
}

/// After a restart, the first load from a segment reads its footer with ranged reads from
/// the end of the file: reading every spilled sample back never gets a whole segment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_segment_is_never_fetched_whole_for_its_footer() {
    let dir = TempDir::new("spill-footer");
    let faulty = FaultyStore::on_local_dir(dir.path());
    let store = || Store::from_object_store(Arc::clone(&faulty) as _, "");
    let options = || options(Durability::Sync);
    let buf = SequenceBuffer::open_in(store(), config(Some(4 * SAMPLE_BYTES)), options())
        .await
        .expect("open");
    for start in (0..N).step_by(4) {
        buf.put_batch((start..start + 4).map(rollout).collect())
            .await
            .expect("put");
    }
    common::wait_until(|| buf.stats().spill.spilled_now >= N - 8).await;
    buf.flush().await.expect("flush");
    drop(buf);

    let buf = SequenceBuffer::open_in(store(), config(None), options())
        .await
        .expect("reopen");
    assert!(buf.stats().spill.spilled_now >= N - 8 - 4);
    let segments = store().list("spill").await.expect("list").len();
    let before = faulty.spill_gets.load(Ordering::SeqCst);
    let contents = buf.contents_loaded().await.expect("contents");
    assert_eq!(contents.len() as u64, N);
    for stored in &contents {
        payload::check(stored.sample.id().as_str(), |k| stored.sample.get(k));
    }
    assert_eq!(faulty.whole_spill_gets.load(Ordering::SeqCst), 0);
    // Per segment: its footer (the length at the end, then the metadata) and one read of
    // the rows, never one read per sample.
    let reads = faulty.spill_gets.load(Ordering::SeqCst) - before;
    assert!(
        reads <= 3 * segments,
        "{reads} reads of {segments} segments"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_segments_are_cleared_at_open() {
    let dir = TempDir::new("spill-orphans");
    let store = || Store::open(dir.path()).expect("store");
    store()
        .put(
            "spill/00000000000000000042.parquet",
            bytes::Bytes::from_static(b"junk"),
        )
        .await
        .expect("put");
    let buf = SequenceBuffer::open_in(
        store(),
        config(Some(SAMPLE_BYTES)),
        options(Durability::Sync),
    )
    .await
    .expect("open");
    assert_eq!(
        store().list("spill").await.expect("list"),
        Vec::<String>::new()
    );
    drop(buf);
}

/// Found by the crash test: recovery took slots through the put path, which refused them
/// once the restored samples filled the memory (or byte) budget, and the rest were dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_over_the_budgets_keeps_every_sample_then_spills() {
    let dir = TempDir::new("spill-over");
    let store = || Store::open(dir.path()).expect("store");
    let buf = SequenceBuffer::open_in(store(), config(None), options(Durability::Sync))
        .await
        .expect("open");
    let handles = buf
        .put_batch((0..N).map(rollout).collect())
        .await
        .expect("put");
    let patches = (0..N)
        .map(|i| Patch::new().with("reward", i as f64))
        .collect();
    buf.amend_batch(&handles, patches).await.expect("amend");
    buf.flush().await.expect("flush");
    drop(buf);
    for reopened in [
        config(Some(4 * SAMPLE_BYTES)),
        config(None).max_bytes(4 * SAMPLE_BYTES),
    ] {
        let buf = SequenceBuffer::open_in(store(), reopened, options(Durability::Sync))
            .await
            .expect("reopen");
        assert_eq!(buf.len() as u64, N, "every recovered sample is kept");
        let ids: HashSet<u64> = buf
            .contents_loaded()
            .await
            .expect("contents")
            .iter()
            .map(|s| check(&s.sample))
            .collect();
        assert_eq!(ids.len() as u64, N);
        common::assert_invariants(&buf);
        buf.flush().await.expect("flush");
    }
}

/// With a `Sync` log and the archive on, every trained spilled sample lands in the archive
/// whole (its loaded fields handed over once the completion is durable, the rest read
/// back: no read at all when the trainer loads every spilled field), and every segment
/// goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_spilled_buffer_archives_whole_samples() {
    use rollout_buffer::persist::ArchiveOptions;
    let spill_gets = |f: &FaultyStore| f.spill_gets.load(Ordering::SeqCst);
    for inputs in [&["tokens", "reward"][..], &["tokens", "logp", "reward"][..]] {
        let dir = TempDir::new("spill-archive");
        let faulty = FaultyStore::on_local_dir(dir.path());
        let store = Store::from_object_store(Arc::clone(&faulty) as _, "");
        let config = BufferConfig::new(64)
            .rpc(RpcDef::new("train", 4).inputs(inputs.iter().copied()))
            .external_keys(["reward"])
            .memory_budget(4 * SAMPLE_BYTES);
        let options = PersistOptions::new()
            .durability(Durability::Sync)
            .archive(Some(ArchiveOptions::default()));
        let buf = SequenceBuffer::open_in(store.clone(), config, options)
            .await
            .expect("open");
        put_spill_and_reward(&buf).await;
        let mut reads_back = 0;
        for _ in 0..N / 4 {
            let batch = buf.get_batch_for_rpc("train").await.expect("get");
            // Loads (the read-ahead too) are done after a flush: what the commit reads
            // is read back for the archive.
            buf.flush().await.expect("flush");
            let before = spill_gets(&faulty);
            batch.commit().await.expect("commit");
            buf.flush().await.expect("flush");
            reads_back += spill_gets(&faulty) - before;
        }
        if inputs.contains(&"logp") {
            assert_eq!(reads_back, 0, "reads back with every spilled field loaded");
        } else {
            assert!(reads_back > 0, "the logprobs are read back");
        }
        assert_eq!(
            archived(&store).await,
            (0..N).collect::<Vec<_>>(),
            "trained on {inputs:?}"
        );
        assert!(store.list("spill").await.expect("list").is_empty());
    }
}

/// A crash after spilled samples were trained but before the archive wrote them: the spill
/// segments they were read back from are kept for the archive, so the next open archives
/// them whole. The crashed buffer runs on a runtime of its own, shut down (every task
/// stopped where it was) before the store is opened again.
#[test]
fn spilled_samples_trained_before_a_crash_are_archived_whole_after_it() {
    use rollout_buffer::persist::ArchiveOptions;
    let dir = TempDir::new("spill-archive-crash");
    let store = Store::open(dir.path()).expect("store");
    let config = || {
        BufferConfig::new(64)
            .rpc(RpcDef::new("train", 4).inputs(["tokens", "reward"]))
            .external_keys(["reward"])
            .memory_budget(4 * SAMPLE_BYTES)
    };
    let options = |max_delay| {
        PersistOptions::new()
            .durability(Durability::Sync)
            .archive(Some(ArchiveOptions {
                max_rows: 4096,
                max_delay,
                ..ArchiveOptions::default()
            }))
    };
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let crashed = runtime();
    crashed.block_on(async {
        // An archive that only writes on flush: every row still waits when the run dies.
        let buf =
            SequenceBuffer::open_in(store.clone(), config(), options(Duration::from_secs(3600)))
                .await
                .expect("open");
        put_spill_and_reward(&buf).await;
        for _ in 0..N / 4 {
            let batch = buf.get_batch_for_rpc("train").await.expect("get");
            batch.commit().await.expect("commit");
        }
        common::wait_until(|| buf.stats().freed == N).await;
        std::mem::forget(buf); // the crash: no flush, no drop
    });
    crashed.shutdown_timeout(Duration::from_secs(10));
    runtime().block_on(async {
        let buf = SequenceBuffer::open_in(store.clone(), config(), options(Duration::from_secs(1)))
            .await
            .expect("recover");
        buf.flush().await.expect("flush");
        assert_eq!(archived(&store).await, (0..N).collect::<Vec<_>>());
    });
}

/// Segments whose trained rows wait for an archive that writes only on its schedule (an
/// hour here) do not hold a `flush` for that long: the flush makes the archive write now,
/// then the segments go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_does_not_wait_for_the_archives_schedule() {
    use rollout_buffer::persist::ArchiveOptions;
    let dir = TempDir::new("spill-archive-flush");
    let store = Store::open(dir.path()).expect("store");
    let config = BufferConfig::new(64)
        .rpc(RpcDef::new("train", 4).inputs(["tokens", "reward"]))
        .external_keys(["reward"])
        .memory_budget(4 * SAMPLE_BYTES);
    let options = PersistOptions::new()
        .durability(Durability::Sync)
        .archive(Some(ArchiveOptions {
            max_rows: 4096,
            max_delay: Duration::from_secs(3600),
            ..ArchiveOptions::default()
        }));
    let buf = SequenceBuffer::open_in(store.clone(), config, options)
        .await
        .expect("open");
    put_spill_and_reward(&buf).await;
    assert!(buf.stats().spill.spilled_now > 0);
    for _ in 0..N / 4 {
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        batch.commit().await.expect("commit");
    }
    tokio::time::timeout(Duration::from_secs(60), buf.flush())
        .await
        .expect("the flush did not wait an hour")
        .expect("flush");
    assert_eq!(archived(&store).await, (0..N).collect::<Vec<_>>());
}

/// The numbers of the samples in the store's archive, sorted; `check` asserts each row's
/// every field (the spilled logprobs too) and its reward.
async fn archived(store: &Store) -> Vec<u64> {
    let rows = rollout_buffer::persist::ArchiveWriter::new(store.clone())
        .read_all()
        .await
        .expect("read the archive");
    let mut archived: Vec<u64> = rows.iter().map(|r| check(&r.sample)).collect();
    archived.sort_unstable();
    archived
}

/// A spilled sample counts whole against the byte budget (stub plus spilled fields), and
/// still does once recovered: the buffer reopens holding the bytes it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_spilled_samples_count_whole_against_the_byte_budget() {
    let dir = TempDir::new("spill-bytes");
    let store = || Store::open(dir.path()).expect("store");
    let config = || config(Some(4 * SAMPLE_BYTES)).max_bytes(4 * N * SAMPLE_BYTES);
    let buf = SequenceBuffer::open_in(store(), config(), options(Durability::Sync))
        .await
        .expect("open");
    put_spill_and_reward(&buf).await;
    buf.flush().await.expect("flush");
    let held = buf.stats().bytes;
    assert!(held >= N * SAMPLE_BYTES, "{held} bytes for {N} samples");
    drop(buf);
    let buf = SequenceBuffer::open_in(store(), config(), options(Durability::Sync))
        .await
        .expect("reopen");
    let stats = buf.stats();
    assert!(stats.spill.spilled_now > 0, "{:?}", stats.spill);
    assert_eq!(stats.bytes, held);
    common::assert_invariants(&buf);
}
