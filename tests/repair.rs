//! Salvage: a store that strict recovery refuses is repaired into one it opens, holding
//! everything before the damage; the damaged files and everything that depended on them
//! are moved aside (never deleted), and the report names what was lost.
#![cfg(feature = "persist")]

mod common;

use common::groups::{checkpointed, four_groups, open, rewrite};
use rollout_buffer::persist::{repair, RecoveryMode, Store};
use rollout_buffer::{Sample, SequenceBuffer};

fn ids(buf: &SequenceBuffer) -> Vec<String> {
    buf.contents()
        .iter()
        .map(|s| s.sample.id().to_string())
        .collect()
}

async fn flip_middle_byte(store: &Store, path: &str) -> Vec<u8> {
    rewrite(store, path, |b| {
        let mid = b.len() / 2;
        b[mid] ^= 0x5a;
    })
    .await
}

#[tokio::test]
async fn a_damaged_middle_group_is_salvaged_with_everything_before_it() {
    let (store, wal) = four_groups().await;
    let damaged = flip_middle_byte(&store, &wal[1]).await;
    let later = store.get(&wal[3]).await.expect("get").expect("exists");
    assert!(open(&store, RecoveryMode::Strict).await.is_err());

    let report = repair(&store).await.expect("repair");
    let moved: Vec<&str> = report.moved.iter().map(|m| m.from.as_str()).collect();
    assert_eq!(moved, [&wal[1], &wal[2], &wal[3]]);
    assert!(
        report.moved[0].why.contains("checksum"),
        "{:?}",
        report.moved[0]
    );
    assert_eq!(report.folder.as_deref(), Some("damaged/0"));
    assert_eq!(report.unreadable_groups, [1]);
    assert_eq!(report.samples_lost, ["s2", "s3"]);
    assert_eq!((report.records_lost, report.groups_kept), (2, 1));
    // Moved, not deleted: the bytes are where the report says, as they were.
    let aside = |i: usize| format!("damaged/0/{}", wal[i]);
    assert_eq!(
        store.get(&aside(1)).await.expect("get").as_deref(),
        Some(&damaged[..])
    );
    assert_eq!(store.get(&aside(3)).await.expect("get"), Some(later));
    let json = store
        .get("damaged/0/report.json")
        .await
        .expect("get")
        .expect("report");
    let json: serde_json::Value = serde_json::from_slice(&json).expect("json");
    assert_eq!(json["samples_lost"], serde_json::json!(["s2", "s3"]));

    // Strict recovery opens it now, the log goes on, and a second repair finds nothing.
    let buf = open(&store, RecoveryMode::Strict).await.expect("strict");
    assert_eq!(ids(&buf), ["s0"]);
    buf.put_batch(vec![Sample::new("s9").with("tokens", vec![9])])
        .await
        .expect("put after repair");
    drop(buf);
    let buf = open(&store, RecoveryMode::Strict).await.expect("reopen");
    assert_eq!(ids(&buf), ["s0", "s9"]);
    drop(buf);
    assert!(repair(&store).await.expect("again").is_clean());
}

#[tokio::test]
async fn a_missing_group_keeps_the_groups_before_it() {
    let (store, wal) = four_groups().await;
    store.delete(&wal[2]).await.expect("delete");
    let report = repair(&store).await.expect("repair");
    let moved: Vec<&str> = report.moved.iter().map(|m| m.from.as_str()).collect();
    assert_eq!(moved, [&wal[3]]);
    assert_eq!(report.samples_lost, ["s3"]);
    assert!(report.unreadable_groups.is_empty());
    let buf = open(&store, RecoveryMode::Strict).await.expect("strict");
    assert_eq!(ids(&buf), ["s0", "s1"]);
}

#[tokio::test]
async fn salvage_mode_repairs_then_opens_and_a_clean_store_is_left_alone() {
    let (store, wal) = four_groups().await;
    let before = store.list("").await.expect("list");
    assert!(repair(&store).await.expect("clean").is_clean());
    assert_eq!(store.list("").await.expect("list"), before);

    flip_middle_byte(&store, &wal[2]).await;
    let buf = open(&store, RecoveryMode::Salvage).await.expect("salvage");
    assert_eq!(ids(&buf), ["s0", "s1"]);
    drop(buf);
    let buf = open(&store, RecoveryMode::Strict)
        .await
        .expect("strict after");
    assert_eq!(ids(&buf), ["s0", "s1"]);
}

#[tokio::test]
async fn a_damaged_checkpoint_is_moved_aside_with_its_segments() {
    let (store, segment, manifest) = checkpointed().await;
    flip_middle_byte(&store, &segment).await;
    assert!(open(&store, RecoveryMode::Strict).await.is_err());

    let report = repair(&store).await.expect("repair");
    let moved: Vec<&str> = report.moved.iter().map(|m| m.from.as_str()).collect();
    assert_eq!(moved, [&manifest, &segment]);
    assert_eq!(report.checkpoint, None);
    assert_eq!(report.unreadable_segments, std::slice::from_ref(&segment));
    let aside = format!("damaged/0/{segment}");
    assert!(store.get(&aside).await.expect("get").is_some());
    let buf = open(&store, RecoveryMode::Strict).await.expect("strict");
    assert!(
        ids(&buf).is_empty(),
        "nothing before the damaged checkpoint survives"
    );
}

/// A damaged manifest takes its checkpoint's segments with it, and the log before that
/// checkpoint is gone: the report names the samples they held (it said nothing was lost).
#[tokio::test]
async fn a_damaged_manifest_reports_the_samples_its_segments_held() {
    let (store, segment, manifest) = checkpointed().await;
    rewrite(&store, &manifest, |b| b.truncate(b.len() / 2)).await;
    let report = repair(&store).await.expect("repair");
    let moved: Vec<&str> = report.moved.iter().map(|m| m.from.as_str()).collect();
    assert_eq!(moved, [&manifest, &segment]);
    assert_eq!(report.samples_lost, ["s0", "s1", "s2", "s3"]);
    assert!(report.unreadable_segments.is_empty() && report.aux_lost.is_empty());
    assert_eq!(
        report.to_json()["samples_lost"].as_array().map(Vec::len),
        Some(4)
    );
}

/// An ingest's pending rollouts live in a checkpoint's auxiliary segment: a damaged
/// manifest loses them, and the report names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_manifest_reports_the_pending_rollouts_it_held() {
    use common::rollouts::{open_trainer, rollout};
    use rollout_buffer::persist::PersistOptions;
    use rollout_buffer::rollout::{GroupConfig, GroupIngest};
    let dir = common::TempDir::new("repair-aux");
    let path = dir.path().to_owned();
    {
        let buf = open_trainer(&path, PersistOptions::new().archive(None)).await;
        let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(4))
            .await
            .expect("start");
        ingest.add(rollout(1, 0, 0)).await.expect("add");
        ingest.add(rollout(1, 1, 0)).await.expect("add");
        buf.flush().await.expect("flush");
    }
    // Reopened, the buffer folds the log into a checkpoint (its aux segment holds them).
    drop(open_trainer(&path, PersistOptions::new().archive(None)).await);
    let store = Store::open(&path).expect("store");
    let manifests = store.list("manifest").await.expect("list");
    let newest = manifests.last().expect("a manifest").clone();
    rewrite(&store, &newest, |b| b.truncate(b.len() / 2)).await;
    let report = repair(&store).await.expect("repair");
    assert_eq!(report.aux_lost.len(), 2, "{report:?}");
    assert!(
        report.aux_lost.iter().all(|id| id.contains("u-1-")),
        "{:?}",
        report.aux_lost
    );
}

/// A damaged manifest whose log is still all there (a crash after the checkpoint landed,
/// before it deleted the log it folded): the log brings everything back, a sample trained
/// and freed after the checkpoint included, so nothing is reported lost.
#[tokio::test]
async fn a_damaged_manifest_over_a_whole_log_loses_nothing() {
    let (store, wal) = four_groups().await;
    let mut logs = Vec::new();
    for path in &wal {
        logs.push(store.get(path).await.expect("get").expect("a log group"));
    }
    let buf = open(&store, RecoveryMode::Strict)
        .await
        .expect("checkpoints");
    // After the checkpoint: s0 trained and freed, in log groups of their own.
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    batch.commit().await.expect("commit");
    drop(buf);
    let manifest = store.list("manifest").await.expect("list")[0].clone();
    for (path, bytes) in wal.iter().zip(logs) {
        store.put(path, bytes).await.expect("put back");
    }
    rewrite(&store, &manifest, |b| b.truncate(b.len() / 2)).await;
    let report = repair(&store).await.expect("repair");
    assert!(report.groups_kept > 4, "{report:?}");
    assert!(
        report.samples_lost.is_empty(),
        "s0 left as the log says: {report:?}"
    );
    assert!(report.aux_lost.is_empty() && report.unarchived_lost.is_empty());
    let buf = open(&store, RecoveryMode::Strict).await.expect("strict");
    assert_eq!(ids(&buf), ["s1", "s2", "s3"]);
}

/// An id put again after it left is another sample: a moved checkpoint holding the new one
/// reports it lost, though the kept log saw the old one put and freed.
#[tokio::test]
async fn a_sample_put_again_under_a_freed_id_is_reported_lost() {
    let (store, wal) = four_groups().await;
    let mut logs = Vec::new();
    for path in wal {
        logs.push((path.clone(), store.get(&path).await.expect("get")));
    }
    let buf = open(&store, RecoveryMode::Strict).await.expect("opens");
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    batch.commit().await.expect("commit"); // s0 trained and freed
    for path in store.list("wal").await.expect("list") {
        logs.push((path.clone(), store.get(&path).await.expect("get")));
    }
    buf.put_batch(vec![Sample::new("s0").with("tokens", vec![9])])
        .await
        .expect("s0 again");
    drop(buf);
    // A checkpoint holds the new s0 and deletes the log; every group but the re-put's
    // comes back, and the checkpoint's manifest is damaged.
    drop(
        open(&store, RecoveryMode::Strict)
            .await
            .expect("checkpoints"),
    );
    for (path, bytes) in logs {
        store
            .put(&path, bytes.expect("a log group"))
            .await
            .expect("put back");
    }
    let manifests = store.list("manifest").await.expect("list");
    let newest = manifests.last().expect("a manifest").clone();
    rewrite(&store, &newest, |b| b.truncate(b.len() / 2)).await;
    let report = repair(&store).await.expect("repair");
    assert_eq!(report.samples_lost, ["s0"], "{report:?}");
}
