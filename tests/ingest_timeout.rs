//! `GroupIngest::add_timeout`: a rollout that completes a group while the buffer is full
//! gives up waiting for room with `Error::Timeout`, and the group is pending again, not
//! lost: its resend completes it, and it is stored once.

use rollout_buffer::persist::{Durability, PersistOptions};
use rollout_buffer::rollout::{Added, GroupConfig, GroupIngest, RolloutRecord};
use rollout_buffer::{Error, RpcDef, SequenceBuffer};
use std::time::Duration;

mod common;

fn rollout(example: &str, uid: &str, reward: f64) -> RolloutRecord {
    let mut r = RolloutRecord::new("math", example, 0, uid);
    r.prompt_tokens = vec![1, 2];
    r.output_tokens = vec![3, 4];
    r.logprobs = vec![-0.5; 2];
    r.reward = Some(reward);
    r
}

fn trainer_of_one_group() -> Vec<RpcDef> {
    vec![RpcDef::new("train", 1).inputs(["output_tokens", "reward"])]
}

async fn timed_out_group_is_pending_again(buf: SequenceBuffer) {
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(2))
        .await
        .expect("start");
    // Group a fills the buffer (capacity 1); b waits for room.
    ingest.add(rollout("a", "a0", 0.0)).await.expect("a0");
    let a = ingest.add(rollout("a", "a1", 1.0)).await.expect("a1");
    assert!(matches!(a, Added::Sealed(_)), "{a:?}");
    ingest.add(rollout("b", "b0", 0.0)).await.expect("b0");
    let b1 = ingest
        .add_timeout(rollout("b", "b1", 1.0), Duration::from_millis(100))
        .await;
    // Named for the call made, and the group it could not store.
    assert!(
        matches!(&b1, Err(Error::Timeout { op, .. }) if op.starts_with("add_timeout (no room for group g-")),
        "{b1:?}"
    );
    let counters = ingest.counters();
    assert_eq!((counters.stored_groups, counters.reopened_groups), (1, 1));
    assert_eq!(
        ingest.assembler_counters().pending_rollouts,
        1,
        "b0 waits again"
    );
    assert_eq!(buf.len(), 1);

    // Room, then the resend of b1 completes b again: stored, once.
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    batch.commit().await.expect("commit");
    let again = ingest
        .add_timeout(rollout("b", "b1", 1.0), Duration::from_secs(30))
        .await
        .expect("b1 again");
    assert!(matches!(again, Added::Sealed(_)), "{again:?}");
    assert_eq!(buf.len(), 1);
    // b0's resend is now a duplicate of a stored rollout, and nothing more is stored.
    let b0 = ingest.add(rollout("b", "b0", 0.0)).await.expect("b0 again");
    assert!(matches!(b0, Added::Duplicate), "{b0:?}");
    assert_eq!(ingest.counters().stored_groups, 2);
    assert_eq!(buf.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    let buf = SequenceBuffer::new(1, trainer_of_one_group()).expect("config");
    timed_out_group_is_pending_again(buf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_sync_store() {
    let dir = common::TempDir::new("ingest-timeout");
    let buf = SequenceBuffer::open(
        dir.path(),
        1,
        trainer_of_one_group(),
        PersistOptions::default().durability(Durability::Sync),
    )
    .await
    .expect("open");
    timed_out_group_is_pending_again(buf).await;
}
