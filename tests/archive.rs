//! The Parquet archive: hive layout, exact read-back, idempotent retries, corrupt files
//! reported by path; run on memory, a local directory and (when configured) S3.
#![cfg(feature = "persist")]

mod common;
use bytes::Bytes;
use common::{s3_url, TempDir};
use rollout_buffer::persist::{
    archive_tail, ArchiveOptions, ArchiveWriter, ArchivedSample, Archiver, Store,
};
use rollout_buffer::ExitReason;
use rollout_buffer::{Error, Sample, Tensor};

/// A rollout as RL pipelines produce it.
fn rollout(i: usize) -> Sample {
    let n = 4 + i % 3;
    let s = Sample::new(format!("rollout-{i}"))
        .birth(1 + i as u64)
        .with("tokens", (0..n as i32).collect::<Vec<_>>())
        .with("logprobs", vec![-0.5f32; n])
        .with("reward", i as f64 * 0.5)
        .meta("worker", (i % 2) as i64);
    // Some rollouts carry more: several answers (ragged) and a 2-d per-token tensor;
    // the rest leave those columns null.
    let s = if i.is_multiple_of(3) {
        s.with(
            "answers",
            Tensor::ragged(vec![1i32, 2, 3, 4], vec![1, 3]).expect("ragged"),
        )
        .with("top2", ndarray::Array2::from_elem((n, 2), 0.25f32))
    } else {
        s
    };
    match i % 4 {
        0 => s.meta("environment", "math").meta("policy_version", 3i64),
        1 => s
            .meta("environment", "code/python")
            .meta("policy_version", 4i64),
        2 => s.meta("environment", "math").meta("policy_version", 4i64),
        _ => s, // no partition metadata: the null partition
    }
}

fn archived(n: usize) -> Vec<ArchivedSample> {
    (0..n)
        .map(|i| ArchivedSample {
            sample: rollout(i),
            read_by: vec!["gen".into(), "train".into()],
            reason: if i % 5 == 0 {
                ExitReason::Stale
            } else {
                ExitReason::Consumed
            },
        })
        .collect()
}

fn by_id(mut rows: Vec<ArchivedSample>) -> Vec<ArchivedSample> {
    rows.sort_by(|a, b| a.sample.id().cmp(b.sample.id()));
    rows
}

/// The column names every file in `paths` has, checked to be the same for all of them.
async fn column_names(store: &Store, paths: &[String]) -> Vec<String> {
    let mut names: Option<Vec<String>> = None;
    for path in paths {
        let bytes = store.get(path).await.expect("get").expect("file");
        let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
            .expect("parquet");
        let these: Vec<String> = builder
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        if let Some(names) = &names {
            assert_eq!(names, &these, "{path} has other columns");
        }
        names = Some(these);
    }
    names.unwrap_or_default()
}

/// The data files of the archive in `store`.
async fn archive_files(store: &Store) -> Vec<String> {
    let listed = store.list("archive").await.expect("list");
    listed
        .into_iter()
        .filter(|p| p.ends_with(".parquet"))
        .collect()
}

/// Whether the mark of a widening not finished yet is in `store`.
async fn widening_marked(store: &Store) -> bool {
    let mark = store.get("archive_schema.widening").await.expect("get");
    mark.is_some()
}

async fn archive_suite(store: Store) {
    let writer = ArchiveWriter::new(store.clone());
    let rows = archived(40);
    let paths = writer.write(&rows).await.expect("write");
    assert_eq!(paths.len(), 4, "{paths:?}");
    assert!(paths
        .iter()
        .any(|p| p.starts_with("archive/environment=math/policy_version=3/part-")));
    assert!(paths
        .iter()
        .any(|p| p.starts_with("archive/environment=code%2Fpython/policy_version=4/")));
    assert!(paths.iter().any(|p| p.starts_with(
        "archive/environment=__HIVE_DEFAULT_PARTITION__/policy_version=__HIVE_DEFAULT_PARTITION__/"
    )));

    let got = by_id(writer.read_all().await.expect("read"));
    assert!(
        got == by_id(rows.clone()),
        "the archive reads back exactly what was written"
    );

    // A retried write lands on the same files: no duplicates.
    assert_eq!(writer.write(&rows).await.expect("retry"), paths);
    assert_eq!(writer.read_all().await.expect("read").len(), rows.len());

    // One schema for every file, though the rows differ in their fields.
    let first = column_names(&store, &paths).await;
    // A later write with a new field appends its column; a new writer keeps the order.
    let more: Vec<ArchivedSample> = archived(3)
        .into_iter()
        .map(|mut r| {
            r.sample = r.sample.with("advantage", 1.5f64);
            r
        })
        .collect();
    let later = ArchiveWriter::new(store.clone())
        .write(&more)
        .await
        .expect("write");
    let grown = column_names(&store, &later).await;
    assert_eq!(
        grown[..first.len()],
        first[..],
        "new columns are only appended"
    );
    assert_eq!(grown.last().map(String::as_str), Some("advantage"));
    // The files written before it are rewritten with it (nulls): every file of the dataset
    // has the same columns again, and its rows read back as they were.
    let files = archive_files(&store).await;
    assert_eq!(files.len(), paths.len() + later.len(), "{files:?}");
    assert_eq!(column_names(&store, &files).await, grown);
    assert!(
        !widening_marked(&store).await,
        "the widening mark is removed"
    );
    // (`more` reuses ids of `rows`: its rows are the ones with an advantage.)
    let ordered = |mut rows: Vec<ArchivedSample>| {
        rows.sort_by_key(|r| (r.sample.id().clone(), r.sample.get("advantage").is_some()));
        rows
    };
    let mut so_far = rows.clone();
    so_far.extend(more.clone());
    assert!(ordered(writer.read_all().await.expect("read")) == ordered(so_far));
    let plain = ArchiveWriter::new(store.clone())
        .write(&archived(2))
        .await
        .expect("write");
    assert_eq!(column_names(&store, &plain).await, grown);
    let mistyped: Vec<ArchivedSample> = archived(1)
        .into_iter()
        .map(|mut r| {
            r.sample = r.sample.with("reward", 3i64);
            r
        })
        .collect();
    match writer.write(&mistyped).await {
        Err(Error::Arrow { column, .. }) => assert_eq!(column, "reward"),
        other => panic!("a column changing type must be refused, got {other:?}"),
    }
    let mut all = rows.clone();
    all.extend(more);
    all.extend(archived(2));
    assert_eq!(writer.read_all().await.expect("read").len(), all.len());

    // A corrupt file is reported by its path.
    let bad = "archive/environment=math/policy_version=9/part-0000000000000000.parquet";
    store
        .put(bad, Bytes::from_static(b"not parquet"))
        .await
        .expect("put");
    match writer.read_all().await {
        Err(Error::Storage { path, .. }) => assert_eq!(path, bad),
        other => panic!("expected a storage error naming the file, got {other:?}"),
    }
}

#[tokio::test]
async fn archive_in_memory() {
    archive_suite(Store::open("memory://").expect("store")).await;
}

#[tokio::test]
async fn archive_in_a_directory() {
    let dir = TempDir::new("archive");
    archive_suite(Store::open(dir.path()).expect("store")).await;
}

#[tokio::test]
async fn archive_on_s3() {
    let Some(url) = s3_url("archive") else {
        return;
    };
    archive_suite(Store::open(&url).expect("store")).await;
}

#[tokio::test]
async fn reserved_names_and_mistyped_partitions_are_rejected() {
    let writer = ArchiveWriter::new(Store::open("memory://").expect("store"));
    let row = |s: Sample| ArchivedSample {
        sample: s,
        read_by: vec![],
        reason: ExitReason::Consumed,
    };
    for bad in [
        Sample::new("a").with("reason", 1i32),
        Sample::new("b").meta("read_by", "x"),
        Sample::new("c").with("environment", "math"),
        Sample::new("d").meta("policy_version", "v3"),
        Sample::new("e").meta("environment", 3i64),
    ] {
        let r = writer.write(&[row(bad.clone())]).await;
        assert!(matches!(r, Err(Error::Arrow { .. })), "{bad:?}: {r:?}");
    }
    assert!(
        writer.read_all().await.expect("read").is_empty(),
        "nothing was written"
    );
}

/// Damaged files come back as errors naming them (or, when the damage hits bytes that do
/// not matter, as data): never a panic.
#[tokio::test]
async fn damaged_files_never_panic() {
    let store = Store::open("memory://").expect("store");
    let writer = ArchiveWriter::new(store.clone());
    let paths = writer.write(&archived(8)[..1]).await.expect("write");
    let path = &paths[0];
    let good = store.get(path).await.expect("get").expect("file");
    let mut errors = 0;
    for at in (0..good.len()).step_by(7) {
        let mut bytes = good.to_vec();
        bytes[at] ^= 0x5a;
        store.put(path, Bytes::from(bytes)).await.expect("put");
        if let Err(e) = writer.read_all().await {
            assert!(
                matches!(&e, Error::Storage { path: p, .. } if p == path),
                "{e}"
            );
            errors += 1;
        }
    }
    assert!(errors > 0, "no corruption was detected at all");
    store
        .put(path, good.slice(..good.len() / 2))
        .await
        .expect("truncate");
    assert!(matches!(
        writer.read_all().await,
        Err(Error::Storage { .. })
    ));
}

/// A buffer with an archiver: every consumed sample lands in the archive, with the RPCs that
/// read it, once the archiver is flushed; samples still in the buffer are not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_archives_consumed_samples() {
    use rollout_buffer::{BufferConfig, Patch, RpcDef, SequenceBuffer};
    let store = Store::open("memory://").expect("store");
    let options = ArchiveOptions {
        max_rows: 50,
        max_delay: std::time::Duration::from_millis(20),
        ..ArchiveOptions::default()
    };
    let archiver = Archiver::start(ArchiveWriter::new(store.clone()), options).expect("start");
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(64)
            .rpc(RpcDef::new("gen", 8).inputs(["prompt"]).outputs(["tokens"]))
            .rpc(RpcDef::new("train", 8).inputs(["tokens"]).reads(2))
            .freed_sink(archiver.clone()),
    )
    .expect("buffer");
    for chunk in 0..25 {
        let samples = (0..8)
            .map(|i| {
                Sample::new(format!("p{chunk}-{i}"))
                    .with("prompt", vec![1i32, 2])
                    .meta("environment", "math")
                    .meta("policy_version", i64::from(chunk % 3))
            })
            .collect();
        buf.put_batch(samples).await.expect("put");
        let g = buf.get_batch_for_rpc("gen").await.expect("gen");
        let out = g
            .samples()
            .map(|_| Patch::new().with("tokens", vec![7i32]))
            .collect();
        g.complete(out).await.expect("complete");
        common::commit_next(&buf, "train").await;
        if chunk < 24 {
            // the last chunk keeps one read left: it stays in the buffer
            common::commit_next(&buf, "train").await;
        }
    }
    archiver.flush().await.expect("flush");
    let rows = ArchiveWriter::new(store).read_all().await.expect("read");
    assert_eq!(rows.len(), 24 * 8, "every consumed sample, and only those");
    for r in &rows {
        assert_eq!(r.read_by, ["gen", "train", "train"]);
        assert_eq!(r.reason, ExitReason::Consumed);
        assert!(r.sample.get("tokens").is_some() && r.sample.get("prompt").is_some());
        assert!(r.sample.id().as_str().starts_with('p'));
    }
    assert_eq!(buf.len(), 8);
}

#[test]
fn archiver_needs_a_runtime() {
    let writer = ArchiveWriter::new(Store::open("memory://").expect("store"));
    let r = rollout_buffer::persist::Archiver::start(writer, Default::default());
    assert!(matches!(r, Err(Error::NoRuntime { .. })));
}

/// An archiver over a store in memory, fed by a buffer of 8 slots whose `n` samples of
/// `len` tokens (i32) were put and each consumed once by its one RPC, "train"; the
/// buffer is returned so that it lives as long as the test.
async fn consumed_into_an_archive(
    options: ArchiveOptions,
    n: i32,
    len: usize,
) -> (Store, Archiver, rollout_buffer::SequenceBuffer) {
    use rollout_buffer::{BufferConfig, RpcDef, SequenceBuffer};
    let store = Store::open("memory://").expect("store");
    let archiver = Archiver::start(ArchiveWriter::new(store.clone()), options).expect("start");
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(8)
            .rpc(RpcDef::new("train", 1).inputs(["tokens"]))
            .freed_sink(archiver.clone()),
    )
    .expect("buffer");
    let samples = (0..n)
        .map(|i| Sample::new(format!("s{i}")).with("tokens", vec![i; len]))
        .collect();
    buf.put_batch(samples).await.expect("put");
    for _ in 0..n {
        common::commit_next(&buf, "train").await;
    }
    (store, archiver, buf)
}

/// `max_bytes` writes a batch once the pending samples' tensor bytes reach it, long before
/// `max_rows` or `max_delay` would: with large samples it is what bounds the archive's
/// memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archiver_writes_once_the_pending_bytes_reach_max_bytes() {
    let options = ArchiveOptions {
        max_rows: 1 << 20,
        max_bytes: 10_000,
        max_delay: std::time::Duration::from_secs(3600),
    };
    // 4,096 bytes each: the third pending sample crosses 10,000 bytes, so eight consumed
    // one at a time make two batches of three, and two wait.
    let (store, archiver, _buf) = consumed_into_an_archive(options, 8, 1024).await;
    let reader = ArchiveWriter::new(store);
    let start = std::time::Instant::now();
    loop {
        let written = reader.read_all().await.expect("read").len();
        assert!(written <= 6, "{written} rows written before the flush");
        if written == 6 {
            break;
        }
        assert!(
            start.elapsed().as_secs() < 60,
            "{written} rows written, not 6"
        );
        tokio::task::yield_now().await;
    }
    archiver.flush().await.expect("flush");
    assert_eq!(reader.read_all().await.expect("read").len(), 8);
}

/// A widening whose rewrite fails (the write that grew the schema returns the error) is
/// done by the next write, which gains no column: afterwards every file has the same
/// columns and the mark is gone.
#[tokio::test]
async fn a_failed_widening_is_done_by_the_next_write() {
    let faulty = common::faulty::FaultyStore::new(std::sync::Arc::new(
        object_store::memory::InMemory::new(),
    ));
    let store = Store::from_object_store(std::sync::Arc::clone(&faulty) as _, "");
    let writer = ArchiveWriter::new(store.clone());
    // Rollouts 0, 4, 8, ...: one partition (math, version 3), so one file a write.
    let rows = |from: usize, advantage: bool| -> Vec<ArchivedSample> {
        archived(from + 12)
            .into_iter()
            .skip(from)
            .step_by(4)
            .map(|mut r| {
                if advantage {
                    r.sample = r.sample.with("advantage", 1.5f64);
                }
                r
            })
            .collect()
    };
    let first = writer.write(&rows(0, false)).await.expect("write");
    // The mark, the grown schema and the new file go through; the rewrite fails.
    faulty.set_after(common::faulty::Fault::Fail, 3);
    assert!(writer.write(&rows(12, true)).await.is_err());
    faulty.set(common::faulty::Fault::None);
    let widened = column_names(&store, &first).await;
    assert!(
        !widened.contains(&"advantage".to_owned()),
        "not rewritten yet"
    );
    writer.write(&rows(24, false)).await.expect("write");
    let files = archive_files(&store).await;
    assert_eq!(files.len(), 3, "{files:?}");
    let names = column_names(&store, &files).await;
    assert_eq!(names.last().map(String::as_str), Some("advantage"));
    assert!(
        !widening_marked(&store).await,
        "the widening mark is removed"
    );
    assert_eq!(writer.read_all().await.expect("read").len(), 9);
}

/// `archive_tail` gives the latest puts whatever the files' modified times: one write
/// puts a file into each partition it spans, in no particular order, so the newest rows
/// can sit in the file modified first.
#[tokio::test]
async fn the_tail_is_the_latest_births_whatever_the_files_times() {
    let dir = TempDir::new("archive-tail");
    let writer = ArchiveWriter::new(Store::open(dir.path()).expect("store"));
    let rows = archived(16);
    // Two writes of 8 rows, each spanning all four partitions (2 rows per file).
    let mut paths = writer.write(&rows[..8]).await.expect("write");
    paths.extend(writer.write(&rows[8..]).await.expect("write"));
    assert_eq!(paths.len(), 8);
    // The files holding the newest rows get the oldest times, and the reverse.
    let mut by_newest: Vec<(u64, String)> = Vec::new();
    for path in &paths {
        let file = format!("{}/{path}", dir.path());
        let births: Vec<u64> = ArchiveWriter::new(Store::open(dir.path()).expect("store"))
            .read_file(path)
            .await
            .expect("read")
            .iter()
            .filter_map(|r| r.sample.birth_value())
            .collect();
        by_newest.push((births.into_iter().max().expect("rows"), file));
    }
    by_newest.sort();
    let start = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for (k, (_, file)) in by_newest.iter().enumerate() {
        let f = std::fs::File::options()
            .write(true)
            .open(file)
            .expect("open");
        f.set_modified(start - std::time::Duration::from_secs(60 * k as u64))
            .expect("set time");
    }
    for n in 0..=17 {
        let tail = archive_tail(dir.path(), n).await.expect("tail");
        let births: Vec<u64> = tail.iter().filter_map(|r| r.sample.birth_value()).collect();
        let want: Vec<u64> = (1..=16u64).skip(16usize.saturating_sub(n)).collect();
        assert_eq!(births, want, "--tail {n}");
    }
}

/// A `max_delay` past the clock's range is no delay, not a panic (adding it to now
/// overflowed in the archiver's task): rows wait for `max_rows`, `max_bytes` or a flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_delay_past_the_clocks_range_waits_for_the_flush() {
    let options = ArchiveOptions {
        max_delay: std::time::Duration::MAX,
        ..ArchiveOptions::default()
    };
    let (store, archiver, _buf) = consumed_into_an_archive(options, 3, 4).await;
    archiver.flush().await.expect("flush");
    let rows = ArchiveWriter::new(store).read_all().await.expect("read");
    assert_eq!(rows.len(), 3);
}

/// A buffer of one RPC, "train", consuming into an archiver over a store in memory, each
/// sample put, consumed and flushed on its own: one archive write each.
struct OneAtATime {
    store: Store,
    archiver: Archiver,
    buf: rollout_buffer::SequenceBuffer,
}

impl OneAtATime {
    fn new() -> Self {
        use rollout_buffer::{BufferConfig, RpcDef, SequenceBuffer};
        let store = Store::open("memory://").expect("store");
        let archiver =
            Archiver::start(ArchiveWriter::new(store.clone()), ArchiveOptions::default())
                .expect("start");
        let buf = SequenceBuffer::with_config(
            BufferConfig::new(8)
                .rpc(RpcDef::new("train", 1).inputs(["tokens"]))
                .freed_sink(archiver.clone()),
        )
        .expect("buffer");
        Self {
            store,
            archiver,
            buf,
        }
    }

    /// Puts `sample`, has "train" consume it, and flushes the archive (its result).
    async fn consume(&self, sample: Sample) -> Result<(), Error> {
        self.buf.put_batch(vec![sample]).await.expect("put");
        common::commit_next(&self.buf, "train").await;
        self.archiver.flush().await
    }
}

/// Metadata holding integers in some consumed samples and floats in later ones is archived
/// as floats, the files written before rewritten so every file has one type; a sample whose
/// field changed type since the archive's first rows cannot be archived beside them: it is
/// dropped (the flush reports it), and the samples consumed after it are archived. The
/// archiver had kept it with the rest and failed every write after, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retyped_metadata_widens_to_floats_and_a_retyped_field_never_stalls_the_archive() {
    use rollout_buffer::MetaValue;
    let one = OneAtATime::new();
    let (store, consume) = (one.store.clone(), |sample| one.consume(sample));
    let sample = |id: &str| Sample::new(id).with("tokens", vec![1i32, 2]);
    consume(sample("int").meta("score", 1i64))
        .await
        .expect("flush");
    consume(sample("float").meta("score", 0.5f64))
        .await
        .expect("ints then floats archive");
    let retyped = Sample::new("retyped").with("tokens", vec![1i64, 2]);
    match consume(retyped).await {
        Err(Error::Arrow { column, .. }) => assert_eq!(column, "tokens"),
        other => panic!("a retyped field is reported, got {other:?}"),
    }
    consume(sample("after").meta("score", 2i64))
        .await
        .expect("the samples after it are archived");

    let rows = by_id(
        ArchiveWriter::new(store.clone())
            .read_all()
            .await
            .expect("read"),
    );
    let got: Vec<(&str, Option<&MetaValue>)> = rows
        .iter()
        .map(|r| (r.sample.id().as_str(), r.sample.get_meta("score")))
        .collect();
    assert_eq!(
        got,
        [
            ("after", Some(&MetaValue::Float(2.0))),
            ("float", Some(&MetaValue::Float(0.5))),
            ("int", Some(&MetaValue::Float(1.0))),
        ]
    );
    // Every file holds the scores as floats, the first one rewritten.
    for path in archive_files(&store).await {
        let bytes = store.get(&path).await.expect("get").expect("file");
        let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
            .expect("parquet");
        let score = builder.schema().field_with_name("score").expect("score");
        assert_eq!(
            score.data_type(),
            &arrow_schema::DataType::Float64,
            "{path}"
        );
    }
    assert!(!widening_marked(&store).await);
}

/// Integers past 2^53 are never made floats: a metadata column archived with one stays
/// int64 (the samples bringing floats to it are dropped, reported by the flush), and one
/// bound for a column already float is dropped too. A name archived as metadata that a
/// later sample uses as a field cannot share its column either. The rows archived before
/// keep their exact values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integers_past_2_53_stay_integers_and_a_field_never_shares_a_metadata_column() {
    use rollout_buffer::MetaValue;
    let one = OneAtATime::new();
    let (store, consume) = (one.store.clone(), |sample| one.consume(sample));
    let sample = |id: &str| Sample::new(id).with("tokens", vec![1i32]);
    let big = (1i64 << 60) + 1;
    consume(sample("big").meta("ts", big)).await.expect("flush");
    consume(sample("small-score").meta("score", 2i64))
        .await
        .expect("flush");
    match consume(sample("float-ts").meta("ts", 0.5f64)).await {
        Err(Error::Arrow { column, .. }) => assert_eq!(column, "ts"),
        other => panic!("ts holds an integer past 2^53: floats refused, got {other:?}"),
    }
    consume(sample("big-score").meta("score", 0.5f64))
        .await
        .expect("small integers become floats");
    match consume(sample("huge-into-floats").meta("score", big)).await {
        Err(Error::Arrow { column, .. }) => assert_eq!(column, "score"),
        other => panic!("an integer past 2^53 for a float column is refused, got {other:?}"),
    }
    match consume(sample("field-now").with("note", 1.5f64)).await {
        Ok(()) => {}
        other => panic!("a new field archives, got {other:?}"),
    }
    let rows = by_id(
        ArchiveWriter::new(store.clone())
            .read_all()
            .await
            .expect("read"),
    );
    let ids: Vec<&str> = rows.iter().map(|r| r.sample.id().as_str()).collect();
    assert!(!ids.contains(&"huge-into-floats"), "{ids:?}");
    let by: std::collections::HashMap<&str, &ArchivedSample> =
        rows.iter().map(|r| (r.sample.id().as_str(), r)).collect();
    assert_eq!(by["big"].sample.get_meta("ts"), Some(&MetaValue::Int(big)));
    assert!(
        !by.contains_key("float-ts"),
        "ts stays int64: the float row is dropped"
    );
    assert_eq!(
        by["small-score"].sample.get_meta("score"),
        Some(&MetaValue::Float(2.0))
    );
    assert_eq!(
        by["big-score"].sample.get_meta("score"),
        Some(&MetaValue::Float(0.5))
    );
    match consume(sample("meta-note").meta("note", 2.5f64)).await {
        Err(Error::Arrow { column, .. }) => assert_eq!(column, "note"),
        other => panic!("a field's name used as metadata is refused, got {other:?}"),
    }
}
