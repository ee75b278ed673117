//! Fault injection: a store whose writes fail or tear. Errors reach the caller with the
//! store and path, nothing half-written is taken for data, and everything works again once
//! the store does.
#![cfg(feature = "persist")]

mod common;
use bytes::Bytes;
use common::faulty::{Fault, FaultyStore};
use object_store::memory::InMemory;
use rollout_buffer::persist::{ArchiveOptions, ArchiveWriter, ArchivedSample, Archiver, Store};
use rollout_buffer::ExitReason;
use rollout_buffer::{BufferConfig, Error, RpcDef, Sample, SequenceBuffer, StorageKind};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A buffer with one RPC, "train" (`n_seqs`, input `tokens`), whose consumed samples go
/// to an archiver on `store` with the given batching.
fn archived_trainer(
    store: &Store,
    capacity: usize,
    n_seqs: usize,
    max_rows: usize,
    max_delay: Duration,
) -> (Archiver, SequenceBuffer) {
    let options = ArchiveOptions {
        max_rows,
        max_delay,
        ..ArchiveOptions::default()
    };
    let archiver = Archiver::start(ArchiveWriter::new(store.clone()), options).expect("start");
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(capacity)
            .rpc(RpcDef::new("train", n_seqs).inputs(["tokens"]))
            .freed_sink(archiver.clone()),
    )
    .expect("buffer");
    (archiver, buf)
}

fn faulty() -> (Arc<FaultyStore>, Store) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let store = Store::from_object_store(Arc::clone(&faulty) as _, "run");
    (faulty, store)
}

#[tokio::test]
async fn failed_writes_name_store_and_path_then_recover() {
    let (faults, store) = faulty();
    faults.set(Fault::Fail);
    match store.put("a/b", Bytes::from_static(b"x")).await {
        Err(Error::Storage {
            url,
            path,
            kind,
            detail,
            source,
        }) => {
            assert_eq!(path, "a/b");
            assert!(url.contains("run"), "{url}");
            assert!(detail.contains("injected"), "{detail}");
            // The store's own error is kept, so a caller can inspect it.
            assert_eq!(kind, StorageKind::Other);
            let source = source.expect("the store's error is the source");
            assert!(
                source.get().downcast_ref::<object_store::Error>().is_some(),
                "{source:?}"
            );
        }
        other => panic!("expected a storage error, got {other:?}"),
    }
    assert!(matches!(
        store.put_if_absent("m", Bytes::new()).await,
        Err(Error::Storage { .. })
    ));
    assert_eq!(store.get("a/b").await.expect("reads still work"), None);
    faults.set(Fault::None);
    store
        .put("a/b", Bytes::from_static(b"x"))
        .await
        .expect("works again");
    assert!(store
        .put_if_absent("m", Bytes::new())
        .await
        .expect("create"));
}

fn rows(n: usize) -> Vec<ArchivedSample> {
    (0..n)
        .map(|i| ArchivedSample {
            sample: Sample::new(format!("s{i}")).with("tokens", vec![i as i32; 3]),
            read_by: vec!["train".into()],
            reason: ExitReason::Consumed,
        })
        .collect()
}

#[tokio::test]
async fn a_torn_archive_file_is_reported_by_path() {
    let (faults, store) = faulty();
    let writer = ArchiveWriter::new(store.clone());
    // The archive's schema file goes through; the data file is torn.
    faults.set_after(Fault::Tear, 1);
    assert!(matches!(
        writer.write(&rows(20)).await,
        Err(Error::Storage { .. })
    ));
    faults.set(Fault::None);
    match writer.read_all().await {
        Err(Error::Storage { path, .. }) => assert!(path.starts_with("archive/"), "{path}"),
        other => panic!("a torn file must not read as data: {other:?}"),
    }
    // The retry writes the same rows under the same name, replacing the torn file.
    let paths = writer.write(&rows(20)).await.expect("retry");
    assert_eq!(writer.read_all().await.expect("read").len(), 20);

    // A torn schema file: a new writer rebuilds it from the files, so its files keep the
    // columns and order of those before.
    faults.set(Fault::Tear);
    let wider: Vec<ArchivedSample> = rows(2)
        .into_iter()
        .map(|mut r| {
            r.sample = r.sample.with("advantage", 0.5f64);
            r
        })
        .collect();
    assert!(ArchiveWriter::new(store.clone())
        .write(&wider)
        .await
        .is_err());
    faults.set(Fault::None);
    let fresh = ArchiveWriter::new(store.clone());
    let more = fresh.write(&rows(3)).await.expect("write");
    let columns = |path: String| {
        let store = store.clone();
        async move {
            let bytes = store.get(&path).await.expect("get").expect("file");
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
                .expect("parquet")
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        columns(more[0].clone()).await,
        columns(paths[0].clone()).await
    );
    assert_eq!(fresh.read_all().await.expect("read").len(), 23);
}

/// The archiver keeps consumed samples while the store fails, reports the failure on
/// flush, and writes them all once the store is back; the buffer is never blocked by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archiver_retries_after_the_store_recovers() {
    let (faults, store) = faulty();
    let (archiver, buf) = archived_trainer(&store, 16, 4, 8, Duration::from_millis(5));
    faults.set(Fault::Fail);
    for chunk in 0..10 {
        let samples = (0..4)
            .map(|i| Sample::new(format!("c{chunk}-{i}")).with("tokens", vec![1i32]))
            .collect();
        buf.put_batch(samples).await.expect("put");
        common::commit_next(&buf, "train").await;
    }
    assert!(
        matches!(archiver.flush().await, Err(Error::Storage { .. })),
        "the failure is reported"
    );
    assert!(faults.injected.load(Ordering::SeqCst) > 0);
    faults.set(Fault::None);
    archiver
        .flush()
        .await
        .expect("written once the store is back");
    let archived = ArchiveWriter::new(store).read_all().await.expect("read");
    assert_eq!(archived.len(), 40, "every consumed sample, once");
    assert!(buf.is_empty());
}

/// `max_delay` is a deadline for the oldest pending sample, not an idle timeout: a steady
/// trickle of consumed samples (one every 5 ms against a 20 ms delay) is written without any
/// flush.
#[tokio::test(start_paused = true)]
async fn archiver_writes_a_steady_trickle_within_max_delay() {
    let store = Store::open("memory://").expect("store");
    let (archiver, buf) = archived_trainer(&store, 4, 1, 10_000, Duration::from_millis(20));
    for i in 0..40 {
        buf.put_batch(vec![Sample::new(format!("t{i}")).with("tokens", vec![1i32])])
            .await
            .expect("put");
        common::commit_next(&buf, "train").await;
        tokio::time::advance(Duration::from_millis(5)).await;
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }
    let written = ArchiveWriter::new(store)
        .read_all()
        .await
        .expect("read")
        .len();
    assert!(
        written >= 30,
        "only {written} of 40 rows written before any flush"
    );
    archiver.flush().await.expect("flush");
}

/// A write that fails after some of its partitions were stored is retried as the very same
/// batch, so the stored partitions are rewritten under the same names: no duplicate rows,
/// even with new samples consumed in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_written_batch_is_retried_without_duplicates() {
    let (faults, store) = faulty();
    let (archiver, buf) = archived_trainer(&store, 64, 8, 100_000, Duration::from_secs(3600));
    let consume = |tag: &'static str| {
        let buf = buf.clone();
        async move {
            let samples = (0..8)
                .map(|i| {
                    let env = if i % 2 == 0 { "math" } else { "code" };
                    Sample::new(format!("{tag}-{i}"))
                        .with("tokens", vec![1i32])
                        .meta("environment", env)
                })
                .collect();
            buf.put_batch(samples).await.expect("put");
            common::commit_next(&buf, "train").await;
        }
    };
    consume("first").await;
    faults.set_after(Fault::Fail, 1); // one partition gets written, the other fails
    assert!(archiver.flush().await.is_err());
    consume("second").await; // more rows arrive while the failed batch waits
    faults.set(Fault::None);
    archiver.flush().await.expect("retry and new rows");
    let rows = ArchiveWriter::new(store).read_all().await.expect("read");
    let mut ids: Vec<String> = rows.iter().map(|r| r.sample.id().to_string()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!((rows.len(), ids.len()), (16, 16), "every row once");
}
