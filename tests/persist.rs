//! Persistence through the public API: round trips through every backend and durability
//! mode, checkpoints, leases at a crash, and configuration changes across a reopen.
#![cfg(feature = "persist")]

mod common;

use common::{assert_invariants, TempDir};
use rollout_buffer::persist::{Durability, PersistOptions, Store};
use rollout_buffer::{
    BufferConfig, Error, Patch, RpcDef, Sample, SequenceBuffer, StoredSample, Tensor,
};
use std::time::Duration;

/// Where a test's buffer lives; `store()` opens it again as a new process would.
enum Backend {
    Memory(Store),
    Url(String),
}

impl Backend {
    fn store(&self) -> Store {
        match self {
            Backend::Memory(store) => store.clone(),
            Backend::Url(url) => Store::open(url).expect("store opens"),
        }
    }
}

/// Runs `test` against `memory://`, a temp dir, and S3 when the CI server is there.
async fn each_backend<F, Fut>(tag: &str, test: F)
where
    F: Fn(Backend) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    test(Backend::Memory(
        Store::open("memory://").expect("memory store"),
    ))
    .await;
    let dir = TempDir::new(tag);
    test(Backend::Url(dir.path().to_owned())).await;
    if let Some(url) = common::s3_url(tag) {
        test(Backend::Url(url)).await;
    }
}

/// gen -> reward -> train, `n` samples per batch, train reading each sample twice.
fn ppo_rpcs(n: usize) -> Vec<RpcDef> {
    vec![
        RpcDef::new("gen", n).inputs(["prompt"]).outputs(["tokens"]),
        RpcDef::new("reward", n)
            .inputs(["tokens"])
            .outputs(["reward"]),
        RpcDef::new("train", n)
            .inputs(["tokens", "reward"])
            .reads(2),
    ]
}

fn config(capacity: usize) -> BufferConfig {
    BufferConfig::new(capacity)
        .rpcs(ppo_rpcs(2))
        .external_keys(["score"])
}

async fn open(backend: &Backend, options: PersistOptions) -> SequenceBuffer {
    SequenceBuffer::open_in(backend.store(), config(64), options)
        .await
        .expect("opens")
}

fn sample(i: usize) -> Sample {
    Sample::new(format!("s{i}"))
        .with("prompt", Tensor::from(vec![i as i32, 1, 2]))
        .meta("environment", "math")
        .meta("policy_version", (i % 3) as i64)
}

/// A workload that leaves samples in every stage: some consumed and freed, some halfway
/// through the graph, some amended, some untouched.
async fn workload(buf: &SequenceBuffer) {
    let handles = buf
        .put_batch((0..10).map(sample).collect())
        .await
        .expect("put");
    buf.amend_batch(
        &handles[..3],
        (0..3)
            .map(|i| Patch::new().with("score", i as f64).meta("checked", true))
            .collect(),
    )
    .await
    .expect("amend");
    for _ in 0..3 {
        let batch = buf.get_batch_for_rpc("gen").await.expect("gen batch");
        let out = batch
            .samples()
            .map(|s| Patch::new().with("tokens", vec![s.id().as_str().len() as i32; 4]))
            .collect();
        batch.complete(out).await.expect("gen completes");
    }
    for _ in 0..2 {
        let batch = buf.get_batch_for_rpc("reward").await.expect("reward batch");
        let out = batch
            .samples()
            .map(|_| Patch::new().with("reward", 0.5f64))
            .collect();
        batch.complete(out).await.expect("reward completes");
    }
    // Train reads twice, oldest first: the first pair of samples is consumed and freed.
    for _ in 0..2 {
        common::commit_next(buf, "train").await;
    }
    // A released lease counts as a redelivery.
    drop(buf.get_batch_for_rpc("gen").await.expect("gen batch"));
}

fn by_id(mut contents: Vec<StoredSample>) -> Vec<StoredSample> {
    contents.sort_by(|a, b| a.sample.id().as_str().cmp(b.sample.id().as_str()));
    contents
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_gives_the_same_buffer_in_every_backend_and_mode() {
    each_backend("roundtrip", |backend| async move {
        for durability in [
            Durability::Sync,
            Durability::Interval(Duration::from_millis(5)),
        ] {
            // Each mode on a fresh prefix of the backend.
            let backend = match &backend {
                Backend::Memory(_) => Backend::Memory(Store::open("memory://").expect("mem")),
                Backend::Url(url) => Backend::Url(format!("{url}/{durability:?}")),
            };
            let options = || PersistOptions::new().durability(durability);
            let buf = open(&backend, options()).await;
            workload(&buf).await;
            buf.flush().await.expect("flush");
            let (contents, stats) = (buf.contents(), buf.stats());
            assert_eq!(stats.freed, 2, "{durability:?}");
            drop(buf);

            let again = open(&backend, options()).await;
            assert_invariants(&again);
            assert_eq!(
                by_id(again.contents()),
                by_id(contents.clone()),
                "{durability:?}"
            );
            assert_eq!(again.stats(), stats, "{durability:?}");
            // Birth order comes back too: FIFO serves the same samples first.
            let batch = again
                .get_batch_for_rpc("gen")
                .await
                .expect("gen after reopen");
            let first: Vec<String> = batch.ids().map(|id| id.to_string()).collect();
            assert_eq!(first, ["s6", "s7"], "{durability:?}");
            drop(batch);
            drop(again);

            // A third open replays nothing new and still agrees.
            let third = open(&backend, options()).await;
            assert_eq!(by_id(third.contents()), by_id(contents), "{durability:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_held_at_a_crash_come_back_released() {
    each_backend("leases", |backend| async move {
        let buf = open(&backend, PersistOptions::new()).await;
        buf.put_batch((0..4).map(sample).collect())
            .await
            .expect("put");
        let held = buf.get_batch_for_rpc("gen").await.expect("gen");
        let held_ids: Vec<String> = held.ids().map(|id| id.to_string()).collect();
        // The process dies holding the lease: nothing releases it.
        std::mem::forget(held);
        let again = open(&backend, PersistOptions::new()).await;
        assert_eq!(again.stats().rpcs[0].eligible, 4);
        let redelivered = again.get_batch_for_rpc("gen").await.expect("gen");
        let ids: Vec<String> = redelivered.ids().map(|id| id.to_string()).collect();
        assert_eq!(
            ids, held_ids,
            "the oldest samples, the ones that were leased"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_fold_the_log_and_recovery_starts_from_them() {
    let backend = Backend::Memory(Store::open("memory://").expect("mem"));
    // Checkpoint after every group.
    let options = || PersistOptions::new().checkpoint_bytes(1).archive(None);
    let buf = open(&backend, options()).await;
    for round in 0..20 {
        buf.put_batch(vec![sample(round)]).await.expect("put");
        let batch = buf
            .get_batch_for_rpc_timeout("gen", Duration::from_millis(1))
            .await;
        if let Ok(batch) = batch {
            let out = batch
                .samples()
                .map(|_| Patch::new().with("tokens", vec![1i32]))
                .collect();
            batch.complete(out).await.expect("complete");
        }
    }
    buf.flush().await.expect("flush");
    let contents = by_id(buf.contents());
    drop(buf);
    let store = backend.store();
    let again = open(&backend, options()).await;
    assert_eq!(by_id(again.contents()), contents);
    // Opening folded the rest of the log into a checkpoint: one manifest, its segments,
    // and no log file older than it.
    let manifests = store.list("manifest").await.expect("list");
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    assert!(store.list("wal").await.expect("list").is_empty());
    assert!(!store.list("segments").await.expect("list").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_segment_is_deleted_once_a_manifest_supersedes_it() {
    let backend = Backend::Memory(Store::open("memory://").expect("mem"));
    let buf = open(&backend, PersistOptions::new()).await;
    buf.put_batch(vec![sample(1)]).await.expect("put");
    drop(buf);
    let store = backend.store();
    // A checkpoint that died between its segment upload and its manifest.
    store
        .put("segments/seg-00000000deadbeef.parquet", "partial".into())
        .await
        .expect("orphan");
    let again = open(&backend, PersistOptions::new()).await;
    assert_eq!(again.len(), 1, "the orphan is not part of the state");
    let segments = store.list("segments").await.expect("list");
    assert!(
        !segments.iter().any(|p| p.contains("deadbeef")),
        "{segments:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_key_or_an_rpc_that_stored_samples_need_is_a_clear_error() {
    let backend = Backend::Memory(Store::open("memory://").expect("mem"));
    let buf = open(&backend, PersistOptions::new()).await;
    buf.put_batch(vec![sample(1), sample(2)])
        .await
        .expect("put");
    let batch = buf.get_batch_for_rpc("gen").await.expect("gen");
    let out = batch
        .samples()
        .map(|_| Patch::new().with("tokens", vec![1i32]))
        .collect();
    batch.complete(out).await.expect("gen");
    drop(buf);

    // `tokens` is gone from the graph, but the stored samples hold it.
    let no_tokens = BufferConfig::new(64).rpc(RpcDef::new("gen", 2).inputs(["prompt"]));
    let err = SequenceBuffer::open_in(backend.store(), no_tokens, PersistOptions::new())
        .await
        .expect_err("tokens removed");
    assert!(
        matches!(&err, Error::Incompatible { detail } if detail.contains("`tokens`")),
        "{err}"
    );

    // `train` is gone but the samples still owe it reads.
    let no_train = BufferConfig::new(64).rpcs(ppo_rpcs(2).into_iter().take(2));
    let err = SequenceBuffer::open_in(backend.store(), no_train, PersistOptions::new())
        .await
        .expect_err("train removed");
    assert!(
        matches!(&err, Error::Incompatible { detail } if detail.contains("`train`")),
        "{err}"
    );

    // Too few slots for what is stored.
    let one_slot = BufferConfig::new(1)
        .rpcs(ppo_rpcs(1))
        .external_keys(["score"]);
    let err = SequenceBuffer::open_in(backend.store(), one_slot, PersistOptions::new())
        .await
        .expect_err("capacity 1");
    assert!(matches!(err, Error::Incompatible { .. }), "{err}");

    // The failed opens changed nothing: the right configuration still recovers both.
    let again = open(&backend, PersistOptions::new()).await;
    assert_eq!(again.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_births_after_a_reopen_come_after_the_recovered_ones() {
    let backend = Backend::Memory(Store::open("memory://").expect("mem"));
    let buf = open(&backend, PersistOptions::new()).await;
    buf.put_batch(vec![Sample::new("old")
        .birth(u64::MAX / 2)
        .with("prompt", vec![1i32])])
        .await
        .expect("put");
    drop(buf);
    let again = open(&backend, PersistOptions::new()).await;
    again
        .put_batch(vec![Sample::new("new").with("prompt", vec![1i32])])
        .await
        .expect("put");
    let births: Vec<(String, u64)> = again
        .contents()
        .iter()
        .map(|s| {
            (
                s.sample.id().to_string(),
                s.sample.birth_value().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(births[0].0, "old", "{births:?}");
    assert!(births[1].1 > births[0].1, "{births:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_too_long_to_represent_means_writing_on_flush_only() {
    let backend = Backend::Memory(Store::open("memory://").expect("mem"));
    let options = || PersistOptions::new().durability(Durability::Interval(Duration::MAX));
    let buf = open(&backend, options()).await;
    buf.put_batch(vec![sample(1)]).await.expect("put");
    assert!(backend.store().list("wal").await.expect("list").is_empty());
    buf.flush().await.expect("flush writes it");
    assert_eq!(backend.store().list("wal").await.expect("list").len(), 1);
    drop(buf);
    assert_eq!(open(&backend, options()).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durability_none_starts_from_the_store_and_logs_nothing() {
    let backend = Backend::Memory(Store::open("memory://").expect("mem"));
    let buf = open(&backend, PersistOptions::new()).await;
    buf.put_batch(vec![sample(1)]).await.expect("put");
    buf.flush().await.expect("flush");
    drop(buf);
    let unlogged = open(&backend, PersistOptions::new().durability(Durability::None)).await;
    assert_eq!(unlogged.len(), 1, "recovered what was stored");
    unlogged.put_batch(vec![sample(2)]).await.expect("put");
    assert_eq!(unlogged.len(), 2);
    unlogged.flush().await.expect("nothing to flush");
    drop(unlogged);
    let again = open(&backend, PersistOptions::new()).await;
    let ids: Vec<String> = again
        .contents()
        .iter()
        .map(|s| s.sample.id().to_string())
        .collect();
    assert_eq!(ids, ["s1"], "the unlogged put is not in the store");
}

/// A checkpoint holding more than one segment's bytes (32 MiB) of live samples and of
/// freed ones waiting for the archive writes several segments of each, and both come back
/// whole: the live ones in the buffer, the freed ones as archive rows, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_larger_than_a_segment_splits_and_reloads_whole() {
    use rollout_buffer::persist::{ArchiveOptions, ArchiveWriter};
    let dir = TempDir::new("big-checkpoint");
    let store = || Store::open(dir.path()).expect("store");
    let config = || BufferConfig::new(64).rpc(RpcDef::new("train", 4).inputs(["prompt"]));
    // The archive holds its rows until a flush: freed samples stay in the durable state.
    let held = || {
        PersistOptions::new().archive(Some(ArchiveOptions {
            max_rows: 1 << 20,
            max_delay: Duration::from_secs(3600),
            ..ArchiveOptions::default()
        }))
    };
    let big = |i: usize| {
        Sample::new(format!("b{i}"))
            .with("prompt", vec![i as i32; 1 << 18]) // 1 MiB
            .meta("environment", "math")
            .meta("policy_version", 0i64)
    };
    // No checkpoint of its own: it is dropped unflushed, and one still running would race
    // the next open.
    let first = held().checkpoint_bytes(u64::MAX);
    let buf = SequenceBuffer::open_in(store(), config(), first)
        .await
        .expect("opens");
    buf.put_batch((0..40).map(big).collect())
        .await
        .expect("put");
    for _ in 0..10 {
        common::commit_next(&buf, "train").await;
    }
    buf.put_batch((40..80).map(big).collect())
        .await
        .expect("put");
    let live = by_id(buf.contents());
    drop(buf); // no flush: the archive never wrote
               // Opening folds the log into a checkpoint of 40 live and 40 freed samples.
    let again = SequenceBuffer::open_in(store(), config(), held())
        .await
        .expect("opens");
    drop(again);
    let segments = store().list("segments").await.expect("list");
    let count = |kind: &str| segments.iter().filter(|p| p.contains(kind)).count();
    assert!(count("/seg-") >= 2, "{segments:?}");
    assert!(count("/freed-") >= 2, "{segments:?}");
    let third = SequenceBuffer::open_in(store(), config(), held())
        .await
        .expect("opens");
    assert_eq!(by_id(third.contents()), live);
    third.flush().await.expect("flush");
    let rows = ArchiveWriter::new(store()).read_all().await.expect("read");
    let mut ids: Vec<String> = rows.iter().map(|r| r.sample.id().to_string()).collect();
    ids.sort();
    let mut want: Vec<String> = (0..40).map(|i| format!("b{i}")).collect();
    want.sort();
    assert_eq!(ids, want);
    for r in &rows {
        let i: i32 = r.sample.id().as_str()[1..].parse().expect("id");
        assert_eq!(
            r.sample.get("prompt"),
            Some(&Tensor::from(vec![i; 1 << 18]))
        );
    }
}

/// Under an interval durability a flush writes now, the archive's batches included: before
/// writing a batch the archive logs which samples it holds and waits until that is durable,
/// and a flush that left that wait to the next interval took as long as the interval (an
/// hour here; a server's graceful stop hung on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_under_a_long_interval_archives_without_waiting_for_it() {
    use rollout_buffer::persist::ArchiveWriter;
    let store = Store::open("memory://").expect("store");
    let hourly = PersistOptions::new().durability(Durability::Interval(Duration::from_secs(3600)));
    let config = BufferConfig::new(8).rpc(RpcDef::new("train", 2).inputs(["prompt"]));
    let buf = SequenceBuffer::open_in(store.clone(), config, hourly)
        .await
        .expect("opens");
    buf.put_batch(vec![sample(1), sample(2)])
        .await
        .expect("put");
    common::commit_next(&buf, "train").await;
    assert_eq!(buf.len(), 0);
    tokio::time::timeout(Duration::from_secs(30), buf.flush())
        .await
        .expect("the flush did not wait for the interval")
        .expect("flush");
    let rows = ArchiveWriter::new(store).read_all().await.expect("read");
    let mut ids: Vec<String> = rows.iter().map(|r| r.sample.id().to_string()).collect();
    ids.sort();
    assert_eq!(ids, ["s1", "s2"]);
}
