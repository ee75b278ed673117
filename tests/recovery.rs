//! Recovery from damaged files: a torn last log group is skipped with a warning; a damaged
//! or missing group before it, a damaged segment or manifest is an error naming the file,
//! or skipped under `RecoveryMode::Lenient`. Never a panic.
#![cfg(feature = "persist")]

mod common;

use common::groups::{checkpointed, four_groups, open, rewrite};
use rollout_buffer::persist::RecoveryMode;
use rollout_buffer::{Error, Sample, SequenceBuffer};

async fn ids(buf: &SequenceBuffer) -> Vec<String> {
    buf.contents()
        .iter()
        .map(|s| s.sample.id().to_string())
        .collect()
}

fn corrupt_path(err: &Error) -> &str {
    match err {
        Error::Corrupt { path, .. } => path,
        other => panic!("expected a corrupt-file error, got {other}"),
    }
}

#[tokio::test]
async fn a_torn_last_group_is_skipped_and_stays_skipped() {
    let (store, wal) = four_groups().await;
    rewrite(&store, &wal[3], |b| b.truncate(b.len() / 2)).await;
    let buf = open(&store, RecoveryMode::Strict).await.expect("recovers");
    assert_eq!(ids(&buf).await, ["s0", "s1", "s2"]);
    // New writes after the torn group land, and the torn group never comes back.
    buf.put_batch(vec![Sample::new("s4").with("tokens", vec![4])])
        .await
        .expect("put");
    drop(buf);
    let again = open(&store, RecoveryMode::Strict).await.expect("recovers");
    assert_eq!(ids(&again).await, ["s0", "s1", "s2", "s4"]);
}

#[tokio::test]
async fn a_damaged_group_before_the_last_is_an_error_naming_it_or_skipped_when_lenient() {
    let (store, wal) = four_groups().await;
    rewrite(&store, &wal[1], |b| {
        let mid = b.len() / 2;
        b[mid] ^= 0x5a;
    })
    .await;
    let err = open(&store, RecoveryMode::Strict)
        .await
        .expect_err("damaged group 1");
    assert_eq!(corrupt_path(&err), wal[1]);
    assert!(err.to_string().contains("checksum"), "{err}");
    let buf = open(&store, RecoveryMode::Lenient).await.expect("lenient");
    assert_eq!(ids(&buf).await, ["s0", "s2", "s3"]);
}

#[tokio::test]
async fn a_deleted_group_is_an_error_naming_it_or_skipped_when_lenient() {
    let (store, wal) = four_groups().await;
    store.delete(&wal[2]).await.expect("delete");
    let err = open(&store, RecoveryMode::Strict)
        .await
        .expect_err("missing group 2");
    assert_eq!(corrupt_path(&err), wal[2]);
    assert!(err.to_string().contains("missing"), "{err}");
    let buf = open(&store, RecoveryMode::Lenient).await.expect("lenient");
    assert_eq!(ids(&buf).await, ["s0", "s1", "s3"]);
}

#[tokio::test]
async fn garbage_in_every_byte_of_a_group_never_panics() {
    let (store, wal) = four_groups().await;
    let original = store.get(&wal[0]).await.expect("get").expect("exists");
    for i in (0..original.len()).step_by(7) {
        let mut bytes = original.to_vec();
        bytes[i] = bytes[i].wrapping_add(1);
        store.put(&wal[0], bytes.into()).await.expect("put");
        let err = open(&store, RecoveryMode::Strict)
            .await
            .expect_err("damaged first group");
        assert_eq!(corrupt_path(&err), wal[0], "byte {i}");
    }
}

#[tokio::test]
async fn a_damaged_segment_is_an_error_naming_it() {
    let (store, segment, _) = checkpointed().await;
    rewrite(&store, &segment, |b| {
        let n = b.len();
        for byte in &mut b[n / 4..n / 2] {
            *byte = !*byte;
        }
    })
    .await;
    let err = open(&store, RecoveryMode::Strict)
        .await
        .expect_err("damaged segment");
    assert_eq!(corrupt_path(&err), segment);
    // Lenient recovery gives up on the checkpoint and keeps going.
    assert!(open(&store, RecoveryMode::Lenient).await.is_ok());
}

#[tokio::test]
async fn a_missing_segment_or_a_truncated_manifest_is_an_error_naming_it() {
    let (store, segment, manifest) = checkpointed().await;
    rewrite(&store, &manifest, |b| b.truncate(b.len() / 3)).await;
    let err = open(&store, RecoveryMode::Strict)
        .await
        .expect_err("truncated manifest");
    assert_eq!(corrupt_path(&err), manifest);
    // Lenient recovery starts over without it, and its next checkpoint comes after it.
    let buf = open(&store, RecoveryMode::Lenient).await.expect("lenient");
    drop(buf);
    assert!(open(&store, RecoveryMode::Strict).await.is_ok());

    let (store, segment2, _) = checkpointed().await;
    assert_ne!(segment, manifest);
    store.delete(&segment2).await.expect("delete");
    let err = open(&store, RecoveryMode::Strict)
        .await
        .expect_err("missing segment");
    assert_eq!(corrupt_path(&err), segment2);
}

#[tokio::test]
async fn a_stray_group_far_past_the_log_is_reported_or_skipped_at_once() {
    let (store, wal) = four_groups().await;
    store
        .put("wal/00000000099999999999.log", "not a group".into())
        .await
        .expect("put");
    let err = open(&store, RecoveryMode::Strict)
        .await
        .expect_err("a gap before it");
    assert_eq!(
        corrupt_path(&err),
        "wal/00000000000000000004.log",
        "{wal:?}"
    );
    let buf = open(&store, RecoveryMode::Lenient).await.expect("lenient");
    assert_eq!(ids(&buf).await, ["s0", "s1", "s2", "s3"]);
}
