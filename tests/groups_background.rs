//! `GroupIngest::start_background`: the groups a restart completes (a smaller group size
//! over pending rollouts) are stored by a task, so the start returns before there is room
//! for them; a resend of one of their rollouts waits for its own group's outcome only,
//! and never waits on a task that will not run.

mod common;

use common::rollouts::rollout;
use common::TempDir;
use rollout_buffer::persist::PersistOptions;
use rollout_buffer::rollout::{Added, GroupConfig, GroupIngest};
use rollout_buffer::{RpcDef, SequenceBuffer};
use std::time::Duration;

/// A buffer on `dir` with room for one group.
async fn open_full(dir: &str) -> SequenceBuffer {
    let train = RpcDef::new("train", 1).inputs(["output_tokens", "reward"]);
    SequenceBuffer::open(dir, 1, [train], PersistOptions::default())
        .await
        .expect("open")
}

/// A first session with groups of 4: example 0's group fills the buffer, and examples 1
/// and 2 each leave two rollouts pending. Reopened with groups of 2, those complete two
/// groups that wait for room.
async fn two_groups_waiting_for_room(dir: &TempDir) {
    let buf = open_full(dir.path()).await;
    full_with_two_half_groups(&buf).await;
    buf.flush().await.expect("flush");
}

/// Groups of 4 on `buf`: example 0's group fills it, and examples 1 and 2 each leave two
/// rollouts pending.
async fn full_with_two_half_groups(buf: &SequenceBuffer) -> GroupIngest {
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(4))
        .await
        .expect("start");
    for k in 0..4 {
        ingest.add(rollout(0, k, 0)).await.expect("add");
    }
    for example in [1, 2] {
        for k in 0..2 {
            let added = ingest.add(rollout(example, k, 0)).await.expect("add");
            assert!(matches!(added, Added::Pending { .. }), "{added:?}");
        }
    }
    assert_eq!(buf.len(), 1);
    ingest
}

/// Reads (and trains on) the one group the buffer holds, making room for the next.
async fn train_one(buf: &SequenceBuffer) {
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    batch.commit().await.expect("commit");
}

/// The example of the one group the buffer holds (its prompt tokens are its number).
fn stored_example(buf: &SequenceBuffer) -> usize {
    let stored = buf.contents();
    assert_eq!(stored.len(), 1);
    let prompts = stored[0]
        .sample
        .get("prompt_tokens")
        .expect("prompt tokens");
    let first = prompts
        .array::<i32>()
        .expect("int32")
        .iter()
        .next()
        .copied();
    first.expect("a token") as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_waits_for_its_own_group_only() {
    let dir = TempDir::new("groups-background");
    two_groups_waiting_for_room(&dir).await;
    let buf = open_full(dir.path()).await;
    let (ingest, storing) = tokio::time::timeout(
        Duration::from_secs(30),
        GroupIngest::start_background(buf.clone(), GroupConfig::new(2)),
    )
    .await
    .expect("the start does not wait for room")
    .expect("start");
    assert_eq!(ingest.counters().recovered_rollouts, 4);
    // Both completed groups are on their way in, counted nowhere else.
    assert_eq!(ingest.storing_rollouts(), 4);
    assert_eq!(ingest.assembler_counters().pending_rollouts, 0);
    // Room for one: the first completed group lands, the second still waits.
    train_one(&buf).await;
    common::wait_until(|| ingest.counters().stored_groups == 1).await;
    common::wait_until(|| ingest.storing_rollouts() == 2).await;
    let first = stored_example(&buf);
    // A resend of the stored group's rollout is answered now, not once the other lands.
    let added = tokio::time::timeout(Duration::from_secs(30), ingest.add(rollout(first, 0, 0)))
        .await
        .expect("answered while the other group waits")
        .expect("add");
    assert!(matches!(added, Added::Duplicate), "{added:?}");
    assert!(!storing.is_finished());
    // The other group lands once there is room again, and the task ends well.
    train_one(&buf).await;
    storing.await.expect("the task").expect("stored");
    assert_eq!(ingest.counters().stored_groups, 2);
    assert_eq!(ingest.storing_rollouts(), 0);
    assert_eq!(stored_example(&buf), 3 - first);
}

/// A task dropped before it ran (its handle aborted) leaves no rollout in flight: a
/// resend is answered at once, as a duplicate of its sealed group (which stays pending in
/// the log for the next start), where it used to wait forever.
#[tokio::test(flavor = "current_thread")]
async fn an_aborted_task_leaves_nothing_in_flight() {
    let dir = TempDir::new("groups-background-abort");
    two_groups_waiting_for_room(&dir).await;
    let buf = open_full(dir.path()).await;
    let (ingest, storing) = GroupIngest::start_background(buf.clone(), GroupConfig::new(2))
        .await
        .expect("start");
    // One thread: the task has not run yet.
    storing.abort();
    let stopped = storing.await.expect_err("aborted");
    assert!(stopped.is_cancelled());
    assert_eq!(ingest.storing_rollouts(), 0);
    let added = tokio::time::timeout(Duration::from_secs(30), ingest.add(rollout(1, 0, 0)))
        .await
        .expect("answered")
        .expect("add");
    assert!(matches!(added, Added::Duplicate), "{added:?}");
}

/// A reconfiguration that completes two groups over a full buffer stores them one by one:
/// once the first is in the buffer, only the second is still counted as on its way in
/// (the first was counted in both until the call ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_stored_leaves_the_storing_count_before_the_next_lands() {
    let dir = TempDir::new("groups-reconfigure-storing");
    let buf = open_full(dir.path()).await;
    let ingest = full_with_two_half_groups(&buf).await;
    let regroup = {
        let ingest = ingest.clone();
        tokio::spawn(async move { ingest.reconfigure(GroupConfig::new(2)).await })
    };
    common::wait_until(|| ingest.storing_rollouts() == 4).await;
    assert_eq!(ingest.assembler_counters().pending_rollouts, 0);
    train_one(&buf).await;
    // Before, the count stayed at 4 until the second group landed too.
    common::wait_until(|| ingest.storing_rollouts() == 2).await;
    assert_eq!(ingest.counters().stored_groups, 2);
    assert!(!regroup.is_finished());
    train_one(&buf).await;
    let added = regroup.await.expect("the task").expect("reconfigure");
    assert_eq!(added.len(), 2);
    assert_eq!(ingest.storing_rollouts(), 0);
}
