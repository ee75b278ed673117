//! The Parquet archive: hive layout, exact read-back, idempotent retries, corrupt files
//! reported by path; run on memory, a local directory and (when configured) S3.
#![cfg(feature = "persist")]

mod common;
use bytes::Bytes;
use common::{s3_url, TempDir};
use rollout_buffer::persist::{ArchiveWriter, ArchivedSample, ExitReason, Store};
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
