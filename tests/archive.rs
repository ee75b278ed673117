//! The Parquet archive: hive layout, exact read-back, idempotent retries, corrupt files
//! reported by path; run on memory, a local directory and (when configured) S3.
#![cfg(feature = "persist")]

mod common;
use bytes::Bytes;
use common::{s3_url, TempDir};
use rollout_buffer::persist::{ArchiveWriter, ArchivedSample, ExitReason, Store};
use rollout_buffer::{Error, Sample, Tensor};
use std::collections::BTreeMap;

/// A rollout as RL pipelines produce it.
fn rollout(i: usize) -> Sample {
    let n = 4 + i % 3;
    let s = Sample::new(format!("rollout-{i}"))
        .birth(1 + i as u64)
        .with("tokens", (0..n as i32).collect::<Vec<_>>())
        .with("logprobs", vec![-0.5f32; n])
        .with("reward", i as f64 * 0.5)
        .meta("worker", (i % 2) as i64);
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

type Canonical = (
    String,
    Option<u64>,
    BTreeMap<String, Tensor>,
    String,
    Vec<String>,
    &'static str,
);

fn canonical(a: &ArchivedSample) -> Canonical {
    let s = &a.sample;
    (
        s.id().to_string(),
        s.birth_value(),
        s.fields()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        format!("{:?}", s.metadata()),
        a.read_by.clone(),
        a.reason.as_str(),
    )
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

    let mut want: Vec<Canonical> = rows.iter().map(canonical).collect();
    let mut got: Vec<Canonical> = writer
        .read_all()
        .await
        .expect("read")
        .iter()
        .map(canonical)
        .collect();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, want);

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
