//! Group ingestion over a store that fails: a rollout is acknowledged only once it is
//! durable, and nothing acknowledged is lost or answered as a duplicate while it lives only
//! in memory. A pending rollout whose log write failed is taken back out; a group whose
//! store failed goes back to pending with its durable members, and seals again when the
//! rest are resent (or at its timeout); a resend while the outcome is undecided waits for
//! it.
#![cfg(feature = "persist")]

mod common;

use common::faulty::{Fault, FaultyStore};
use common::wait_until;
use object_store::memory::InMemory;
use rollout_buffer::persist::{Durability, PersistOptions, Store};
use rollout_buffer::rollout::{Added, GroupConfig, GroupIngest, RolloutRecord, RETRY_AFTER};
use rollout_buffer::{BufferConfig, Error, Overflow, RpcDef, SequenceBuffer};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

fn faulty() -> (Arc<FaultyStore>, Store) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let store = Store::from_object_store(Arc::clone(&faulty) as _, "run");
    (faulty, store)
}

async fn open(store: &Store) -> SequenceBuffer {
    open_with(store, BufferConfig::new(16)).await
}

async fn open_with(store: &Store, config: BufferConfig) -> SequenceBuffer {
    let config = config.rpc(RpcDef::new("train", 1).inputs(["output_tokens"]));
    let options = PersistOptions::new()
        .durability(Durability::Sync)
        .archive(None);
    SequenceBuffer::open_in(store.clone(), config, options)
        .await
        .expect("opens")
}

/// Groups of 3 that seal only when full (or, for `seal_due` tests, after an hour with 2).
async fn start_ingest(buf: &SequenceBuffer) -> GroupIngest {
    GroupIngest::start(buf.clone(), GroupConfig::new(3).seal_after(HOUR, 2))
        .await
        .expect("start")
}

fn rollout(example: &str, uid: &str) -> RolloutRecord {
    let mut r = RolloutRecord::new("math", example, 0, uid);
    r.output_tokens = vec![1, 2];
    r.logprobs = vec![-0.5; 2];
    r.reward = Some(1.0);
    r
}

/// The three rollouts of example `e`'s group, uids `{e}-0` to `{e}-2`.
fn whole(e: &str) -> Vec<RolloutRecord> {
    (0..3).map(|k| rollout(e, &format!("{e}-{k}"))).collect()
}

/// Trains (leases and commits) `n` samples, one at a time.
async fn train(buf: &SequenceBuffer, n: usize) {
    for _ in 0..n {
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        batch.commit().await.expect("commit");
    }
    assert_eq!(buf.len(), 0, "only their markers know them now");
}

/// What resending `groups` (whole, in one call) did: (stored, duplicates).
async fn resend(ingest: &GroupIngest, groups: &[&str]) -> (u64, u64) {
    let before = ingest.counters();
    let answers = ingest
        .add_many(groups.iter().flat_map(|e| whole(e)).collect())
        .await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let c = ingest.counters();
    (
        c.stored_groups - before.stored_groups,
        c.duplicate_groups - before.duplicate_groups,
    )
}

fn is_storage(e: &Error) -> bool {
    matches!(e, Error::Storage { .. })
}

fn pending_rollouts(ingest: &GroupIngest) -> u64 {
    ingest.assembler_counters().pending_rollouts
}

/// A crash: the buffer and the ingest stop without a word, and a new pair starts on the
/// same store.
async fn crash_and_restart(
    store: &Store,
    buf: SequenceBuffer,
    ingest: GroupIngest,
) -> (SequenceBuffer, GroupIngest) {
    std::mem::forget(ingest);
    std::mem::forget(buf);
    let buf = open(store).await;
    let ingest = start_ingest(&buf).await;
    (buf, ingest)
}

/// Adds `uid` of example `e` while the store fails: the add must end with the storage
/// error. The store works again afterwards.
async fn add_failing(ingest: &GroupIngest, faults: &FaultyStore, uid: &str) {
    faults.set(Fault::Fail);
    let err = ingest
        .add(rollout("e", uid))
        .await
        .expect_err("the store fails");
    assert!(is_storage(&err), "{err}");
    faults.set(Fault::None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_rollout_whose_write_failed_is_taken_as_new_when_resent() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    ingest.add(rollout("e", "u-0")).await.expect("pending");
    add_failing(&ingest, &faults, "u-1").await;
    assert_eq!(pending_rollouts(&ingest), 1, "u-1 was taken back out");
    // The resend is a new rollout, logged as such, not a duplicate of one in memory only.
    assert!(matches!(
        ingest.add(rollout("e", "u-1")).await,
        Ok(Added::Pending { size: 2, .. })
    ));
    let (_buf, ingest) = crash_and_restart(&store, buf, ingest).await;
    assert_eq!(ingest.counters().recovered_rollouts, 2, "both acknowledged");
    assert!(matches!(
        ingest.add(rollout("e", "u-2")).await,
        Ok(Added::Sealed(g)) if g.rollouts.len() == 3
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_store_failed_seals_again_when_its_last_rollout_is_resent() {
    // `Ghost`: the put reached the store but was reported failed; the buffer abandons it,
    // so it is as absent after a restart as a put that failed outright.
    for fault in [Fault::Fail, Fault::Ghost] {
        let (faults, store) = faulty();
        let buf = open(&store).await;
        let ingest = start_ingest(&buf).await;
        ingest.add(rollout("e", "u-0")).await.expect("pending");
        ingest.add(rollout("e", "u-1")).await.expect("pending");
        faults.set(fault);
        let err = ingest
            .add(rollout("e", "u-2"))
            .await
            .expect_err("the group's put failed");
        assert!(is_storage(&err), "{fault:?}: {err}");
        faults.set(Fault::None);
        assert_eq!(buf.len(), 0, "{fault:?}");
        assert_eq!(ingest.counters().reopened_groups, 1, "{fault:?}");
        assert_eq!(
            pending_rollouts(&ingest),
            2,
            "{fault:?}: the acknowledged two"
        );
        assert_eq!(
            ingest.add(rollout("e", "u-0")).await.ok(),
            Some(Added::Duplicate),
            "{fault:?}: u-0 is still pending"
        );
        let Ok(Added::Sealed(group)) = ingest.add(rollout("e", "u-2")).await else {
            panic!("{fault:?}: the resend completes the group");
        };
        assert_eq!(group.rollouts.len(), 3, "{fault:?}");
        assert!(buf.contains(&group.id), "{fault:?}");
        assert_eq!(ingest.counters().stored_groups, 1, "{fault:?}");

        let (again, _ingest) = crash_and_restart(&store, buf, ingest).await;
        assert_eq!(again.len(), 1, "{fault:?}: stored once");
        assert!(again.contains(&group.id), "{fault:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_store_keeps_its_acknowledged_rollouts_across_a_crash() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    ingest.add(rollout("e", "u-0")).await.expect("pending");
    ingest.add(rollout("e", "u-1")).await.expect("pending");
    faults.set(Fault::Fail);
    ingest
        .add(rollout("e", "u-2"))
        .await
        .expect_err("the group's put failed");
    faults.set(Fault::None);
    let (buf, ingest) = crash_and_restart(&store, buf, ingest).await;
    assert_eq!(pending_rollouts(&ingest), 2);
    assert!(matches!(
        ingest.add(rollout("e", "u-2")).await,
        Ok(Added::Sealed(_))
    ));
    assert_eq!(buf.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_writes_failed_is_taken_whole_when_resent() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    faults.set(Fault::Fail);
    // A whole group (its put fails) and a pending rollout of another (its entry fails).
    let batch = || {
        vec![
            rollout("a", "a-0"),
            rollout("a", "a-1"),
            rollout("b", "b-0"),
            rollout("a", "a-2"),
        ]
    };
    let answers = ingest.add_many(batch()).await;
    assert!(
        answers.iter().all(|a| matches!(a, Err(e) if is_storage(e))),
        "{answers:?}"
    );
    assert_eq!(
        pending_rollouts(&ingest),
        0,
        "nothing of the batch was kept"
    );
    assert_eq!(buf.len(), 0);
    faults.set(Fault::None);
    let answers = ingest.add_many(batch()).await;
    assert!(matches!(answers[3], Ok(Added::Sealed(_))), "{answers:?}");
    assert!(
        matches!(answers[2], Ok(Added::Pending { size: 1, .. })),
        "{answers:?}"
    );
    assert_eq!(buf.len(), 1);
    let (_buf, ingest) = crash_and_restart(&store, buf, ingest).await;
    assert_eq!(ingest.counters().recovered_rollouts, 1, "b-0 is durable");
}

/// The groups an `add_many` completes are stored in one log write (one put with their
/// markers): with a single write let through, batches of two and of three groups are stored
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_one_batch_completes_are_stored_in_one_write() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    for groups in [2, 3] {
        let batch = (0..groups)
            .flat_map(|g| {
                let example = format!("g{groups}-{g}");
                (0..3).map(move |k| rollout(&example, &format!("{example}-{k}")))
            })
            .collect();
        faults.set_after(Fault::Fail, 1);
        let answers = ingest.add_many(batch).await;
        faults.set(Fault::None);
        let sealed = answers
            .iter()
            .filter(|a| matches!(a, Ok(Added::Sealed(_))))
            .count();
        assert_eq!(sealed, groups, "{answers:?}");
        assert_eq!(
            faults.injected.load(Ordering::SeqCst),
            0,
            "one write was enough"
        );
    }
    assert_eq!(buf.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_sealed_at_its_timeout_whose_store_failed_seals_again_at_the_next() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    // `x` reaches the minimum of 2, `y` does not (dropped at the timeout).
    for (example, uid) in [("x", "x-0"), ("x", "x-1"), ("y", "y-0")] {
        ingest.add(rollout(example, uid)).await.expect("pending");
    }
    faults.set(Fault::Fail);
    let later = Instant::now() + 2 * HOUR;
    let err = ingest
        .seal_due(later)
        .await
        .expect_err("forgetting y and storing x failed");
    assert!(is_storage(&err), "{err}");
    // Forgetting `y` failed, and `x` was tried all the same: it is pending again.
    assert_eq!(ingest.counters().reopened_groups, 1);
    assert_eq!(pending_rollouts(&ingest), 2);
    faults.set(Fault::None);
    ingest.seal_due(later + 2 * HOUR).await.expect("stored");
    assert_eq!(buf.len(), 1);
    assert_eq!(ingest.counters().stored_groups, 1);
}

/// Adds `uid` of example `e` in a task of its own.
fn spawn_add(ingest: &GroupIngest, uid: &str) -> tokio::task::JoinHandle<Result<Added, Error>> {
    let (ingest, record) = (ingest.clone(), rollout("e", uid));
    tokio::spawn(async move { ingest.add(record).await })
}

/// Waits until a write is held in the store's stall.
async fn a_write_stalls(faults: &FaultyStore) {
    wait_until(|| faults.stalled.load(Ordering::SeqCst) >= 1).await;
}

/// Asserts that a spawned add ended with a storage error.
async fn fails_on_storage(task: tokio::task::JoinHandle<Result<Added, Error>>) {
    let answer = task.await.expect("joins");
    assert!(matches!(&answer, Err(e) if is_storage(e)), "{answer:?}");
}

/// Adds `uid` while the store stalls, resends it once the first write (or put) is held,
/// then makes the store fail: both must end with the storage error (the resend waited
/// for the first's outcome, and was then a new rollout whose own write failed too).
async fn add_and_resend_while_stalled_then_fail(
    ingest: &GroupIngest,
    faults: &FaultyStore,
    uid: &str,
) {
    faults.set(Fault::Stall);
    let first = spawn_add(ingest, uid);
    a_write_stalls(faults).await;
    // The sender gives up waiting and resends: not answered `Duplicate` while the
    // outcome may yet be a failure.
    let resend = spawn_add(ingest, uid);
    faults.set(Fault::Fail);
    fails_on_storage(first).await;
    fails_on_storage(resend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_while_the_write_is_undecided_waits_for_its_outcome() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    ingest.add(rollout("e", "u-0")).await.expect("pending");
    add_and_resend_while_stalled_then_fail(&ingest, &faults, "u-1").await;
    faults.set(Fault::None);
    assert!(matches!(
        ingest.add(rollout("e", "u-1")).await,
        Ok(Added::Pending { size: 2, .. })
    ));
}

/// A resend waits for an undecided outcome on a wake-up: on one thread, asking again in a
/// loop would keep the stalled write it waits for from ever being released. The runtime
/// has a thread of its own, so such a loop fails the test instead of hanging it.
#[test]
fn a_resend_waits_for_the_outcome_without_holding_its_thread() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let (faults, store) = faulty();
            let buf = open(&store).await;
            let ingest = start_ingest(&buf).await;
            ingest.add(rollout("e", "u-0")).await.expect("pending");
            faults.set(Fault::Stall);
            let first = spawn_add(&ingest, "u-1");
            a_write_stalls(&faults).await;
            let resend = spawn_add(&ingest, "u-1");
            // The resend runs until it waits for the first's outcome.
            tokio::task::yield_now().await;
            faults.set(Fault::Fail);
            fails_on_storage(first).await;
            fails_on_storage(resend).await;
        });
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the resend held the runtime's only thread")
        }
        Err(e) => panic!("the test's runtime thread failed (its panic is above): {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_while_its_group_is_being_stored_waits_for_the_outcome() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    for uid in ["u-0", "u-1"] {
        ingest.add(rollout("e", uid)).await.expect("pending");
    }
    add_and_resend_while_stalled_then_fail(&ingest, &faults, "u-2").await;
    assert_eq!(pending_rollouts(&ingest), 2);
    faults.set(Fault::None);
    assert!(matches!(
        ingest.add(rollout("e", "u-2")).await,
        Ok(Added::Sealed(g)) if g.rollouts.len() == 3
    ));
    assert_eq!(buf.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_is_reopened_without_a_member_whose_own_write_failed() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    ingest.add(rollout("e", "u-0")).await.expect("pending");
    faults.set(Fault::Stall);
    // u-1's write is held; u-2 completes the group (with u-1) meanwhile.
    let pending = spawn_add(&ingest, "u-1");
    a_write_stalls(&faults).await;
    let completing = spawn_add(&ingest, "u-2");
    wait_until(|| ingest.assembler_counters().sealed_full == 1).await;
    faults.set(Fault::Fail);
    fails_on_storage(pending).await;
    fails_on_storage(completing).await;
    // Only u-0 is durable, so only u-0 is pending again.
    assert_eq!(pending_rollouts(&ingest), 1);
    faults.set(Fault::None);
    assert!(matches!(
        ingest.add(rollout("e", "u-1")).await,
        Ok(Added::Pending { size: 2, .. })
    ));
    let (buf, ingest) = crash_and_restart(&store, buf, ingest).await;
    assert_eq!(ingest.counters().recovered_rollouts, 2);
    assert!(matches!(
        ingest.add(rollout("e", "u-2")).await,
        Ok(Added::Sealed(g)) if g.rollouts.len() == 3
    ));
    assert_eq!(buf.len(), 1);
}

/// A rollout whose write failed is not taken for one still being written when its resend
/// completes a group whose store fails: only the durable members are pending again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_earlier_write_failed_is_not_kept_when_its_group_fails() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    ingest.add(rollout("e", "u-0")).await.expect("pending");
    add_failing(&ingest, &faults, "u-1").await; // its own write fails
    ingest.add(rollout("e", "u-2")).await.expect("pending");
    add_failing(&ingest, &faults, "u-1").await; // its group's put fails
    assert_eq!(
        pending_rollouts(&ingest),
        2,
        "u-0 and u-2, the durable ones"
    );
    let Ok(Added::Sealed(group)) = ingest.add(rollout("e", "u-1")).await else {
        panic!("u-1's resend is new and completes the group");
    };
    assert_eq!(group.rollouts.len(), 3);
    assert_eq!(buf.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_refused_at_once_keeps_a_member_whose_write_is_still_in_flight() {
    // A full buffer under `Overflow::Reject` refuses a put before it reaches the log, so
    // the group fails while a member's own write is still being made durable.
    let (faults, store) = faulty();
    let buf = open_with(&store, BufferConfig::new(1).overflow(Overflow::Reject)).await;
    let ingest = start_ingest(&buf).await;
    for uid in ["f-0", "f-1", "f-2"] {
        ingest.add(rollout("f", uid)).await.expect("added");
    }
    assert_eq!(buf.len(), 1, "full");
    ingest.add(rollout("e", "u-0")).await.expect("pending");
    faults.set(Fault::Stall);
    let writing = spawn_add(&ingest, "u-1");
    a_write_stalls(&faults).await;
    let refused = ingest
        .add(rollout("e", "u-2"))
        .await
        .expect_err("the buffer is full");
    assert!(matches!(refused, Error::Full { .. }), "{refused}");
    faults.set(Fault::None);
    assert!(matches!(
        writing.await.expect("joins"),
        Ok(Added::Pending { .. })
    ));
    assert_eq!(
        pending_rollouts(&ingest),
        2,
        "u-0 and u-1, whose write landed"
    );
    // Room again: the resend of u-2 completes the group with both.
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    batch.commit().await.expect("commit");
    assert!(matches!(
        ingest.add(rollout("e", "u-2")).await,
        Ok(Added::Sealed(g)) if g.rollouts.len() == 3
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_sent_twice_in_a_batch_shares_its_first_copys_failure() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = start_ingest(&buf).await;
    faults.set(Fault::Fail);
    let answers = ingest
        .add_many(vec![rollout("e", "u-0"), rollout("e", "u-0")])
        .await;
    assert!(
        answers.iter().all(|a| matches!(a, Err(e) if is_storage(e))),
        "{answers:?}"
    );
    faults.set(Fault::None);
    let answers = ingest
        .add_many(vec![rollout("e", "u-0"), rollout("e", "u-0")])
        .await;
    assert!(
        matches!(answers[0], Ok(Added::Pending { size: 1, .. })),
        "{answers:?}"
    );
    assert_eq!(answers[1].as_ref().ok(), Some(&Added::Duplicate));
}

/// A group the buffer refuses for what it is (from a newer policy than the trainer's) is
/// dropped with its members, not reopened: the sender that completed it gets the refusal,
/// and a restart finds nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_the_buffer_refuses_is_dropped_not_reopened() {
    let (_faults, store) = faulty();
    let buf = open(&store).await;
    buf.set_policy_version(0).expect("version");
    let ingest = start_ingest(&buf).await;
    let future = |uid: &str| {
        let mut r = rollout("f", uid);
        r.policy_version = 1;
        r
    };
    for uid in ["f-0", "f-1"] {
        ingest.add(future(uid)).await.expect("pending");
    }
    let err = ingest.add(future("f-2")).await.expect_err("refused");
    assert!(matches!(err, Error::FutureVersion { .. }), "{err}");
    let c = ingest.counters();
    assert_eq!((c.refused_groups, c.reopened_groups), (1, 0));
    assert_eq!(pending_rollouts(&ingest), 0);
    assert_eq!(buf.len(), 0);
    let (_buf, ingest) = crash_and_restart(&store, buf, ingest).await;
    assert_eq!(
        ingest.counters().recovered_rollouts,
        0,
        "its pending entries are gone"
    );
}

/// A group reopened while the timer task has nothing to wait for wakes it: its deadline
/// passed while its put was held, so the timer found nothing due and parked; the reopened
/// group is then sealed at its new deadline with no other traffic.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_group_reopened_while_the_timer_is_idle_is_sealed_at_its_new_deadline() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let config = GroupConfig::new(3).seal_after(Duration::from_secs(10), 2);
    let ingest = GroupIngest::start(buf.clone(), config)
        .await
        .expect("start");
    for uid in ["e-0", "e-1"] {
        ingest.add(rollout("e", uid)).await.expect("pending");
    }
    faults.set(Fault::Stall);
    let last = spawn_add(&ingest, "e-2");
    a_write_stalls(&faults).await;
    tokio::time::sleep(Duration::from_secs(11)).await;
    faults.set(Fault::Fail);
    fails_on_storage(last).await;
    faults.set(Fault::None);
    assert_eq!(
        pending_rollouts(&ingest),
        2,
        "reopened with its durable members"
    );
    assert_eq!(buf.len(), 0);
    tokio::time::sleep(RETRY_AFTER + Duration::from_secs(10)).await;
    assert_eq!(buf.len(), 1, "sealed by the timer, 2 of 3");
    assert_eq!(ingest.assembler_counters().sealed_timeout, 1);
}

/// An ingest that remembers the last two groups stored, after storing `g0` and `g1`.
async fn remembering_two_after_g0_and_g1(buf: &SequenceBuffer) -> GroupIngest {
    let mut config = GroupConfig::new(3).seal_after(HOUR, 2);
    config.remember = 2;
    let ingest = GroupIngest::start(buf.clone(), config)
        .await
        .expect("start");
    for e in ["g0", "g1"] {
        assert!(ingest.add_many(whole(e)).await.iter().all(Result::is_ok));
    }
    ingest
}

/// A reopened group leaves the window of remembered groups until it is stored, so the
/// window stays the last `remember` groups stored, in the order they were stored: once
/// every group is trained, the newer two are duplicates, and the older one is stored
/// again (resent last, as storing it lets the oldest marker go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_group_keeps_the_remembered_window_in_store_order() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = remembering_two_after_g0_and_g1(&buf).await;
    for uid in ["g2-0", "g2-1"] {
        ingest.add(rollout("g2", uid)).await.expect("pending");
    }
    faults.set(Fault::Fail);
    let err = ingest.add(rollout("g2", "g2-2")).await.expect_err("fails");
    assert!(is_storage(&err), "{err}");
    faults.set(Fault::None);
    let resent = ingest.add(rollout("g2", "g2-2")).await.expect("stored");
    assert!(matches!(resent, Added::Sealed(_)), "{resent:?}");
    assert!(ingest.add_many(whole("g3")).await.iter().all(Result::is_ok));
    train(&buf, 4).await;
    assert_eq!(resend(&ingest, &["g2", "g3"]).await, (0, 2));
    assert_eq!(resend(&ingest, &["g1"]).await, (1, 0));
}

/// A group the buffer refuses leaves the window of remembered groups too (it was never
/// stored), and the markers the window let go of for it leave the log: with `remember`
/// 2, the two groups stored around it are the ones known. If writing those removals
/// fails, the window keeps the markers, and the next store removes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_group_leaves_the_remembered_window() {
    for fault in [Fault::None, Fault::Fail] {
        let (faults, store) = faulty();
        let buf = open(&store).await;
        buf.set_policy_version(0).expect("version");
        let ingest = remembering_two_after_g0_and_g1(&buf).await;
        let mut future = whole("f");
        for r in &mut future {
            r.policy_version = 1;
        }
        faults.set(fault);
        let answers = ingest.add_many(future).await;
        faults.set(Fault::None);
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Err(Error::FutureVersion { .. }))),
            "{answers:?}"
        );
        assert!(ingest.add_many(whole("g3")).await.iter().all(Result::is_ok));
        train(&buf, 3).await;
        assert_eq!(resend(&ingest, &["g1", "g3"]).await, (0, 2), "{fault:?}");
        assert_eq!(resend(&ingest, &["g0"]).await, (1, 0), "{fault:?}");
    }
}

/// A store that fails lets go of no remembered group: the markers its put would have
/// removed are still in the log, so the window keeps them, and the next store removes
/// them. None is left behind: with `remember` 2, g0 goes when g2 is stored at last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_store_leaves_no_marker_behind() {
    let (faults, store) = faulty();
    let buf = open(&store).await;
    let ingest = remembering_two_after_g0_and_g1(&buf).await;
    faults.set(Fault::Fail);
    let answers = ingest.add_many(whole("g2")).await;
    assert!(
        answers.iter().all(|a| a.as_ref().is_err_and(is_storage)),
        "{answers:?}"
    );
    faults.set(Fault::None);
    assert_eq!(resend(&ingest, &["g2"]).await, (1, 0));
    train(&buf, 3).await;
    assert_eq!(resend(&ingest, &["g1", "g2"]).await, (0, 2));
    assert_eq!(resend(&ingest, &["g0"]).await, (1, 0), "g0 was let go");
}

/// The same when the put of a batch of groups fails: with room for one more group, the
/// batch of `a` and `b` is refused, `a` is then stored alone and `b` reopened. The window
/// is the last two stored, g1 and a, and g0's marker went with a's store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batched_store_leaves_no_marker_behind() {
    let (_faults, store) = faulty();
    let buf = open_with(&store, BufferConfig::new(3).overflow(Overflow::Reject)).await;
    let ingest = remembering_two_after_g0_and_g1(&buf).await;
    let answers = ingest.add_many([whole("a"), whole("b")].concat()).await;
    let stored: Vec<_> = answers
        .iter()
        .filter_map(|a| match a {
            Ok(Added::Sealed(g)) => Some(g.id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(stored.len(), 1, "{answers:?}");
    assert!(
        answers.iter().any(|a| matches!(a, Err(Error::Full { .. }))),
        "{answers:?}"
    );
    train(&buf, 3).await;
    assert_eq!(resend(&ingest, &["g1"]).await, (0, 1));
    assert_eq!(resend(&ingest, &["a"]).await, (0, 1));
    assert_eq!(resend(&ingest, &["g0"]).await, (1, 0), "g0 was let go");
}
