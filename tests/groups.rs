//! Group ingestion through a real buffer: many replicas, duplicates and late rollouts,
//! timer-driven sealing, and groups never stored twice across restarts.

mod common;

use common::rollouts::{open_trainer, rollout, trainer};
use common::{wait_until, TempDir};
use rollout_buffer::persist::{Durability, PersistOptions};
use rollout_buffer::rollout::{
    group_id, Added, GroupConfig, GroupIngest, GroupKey, GroupMode, RolloutRecord,
};
use rollout_buffer::{RpcDef, Sample, SequenceBuffer};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A small deterministic shuffle (xorshift), so the test needs no randomness crate.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        items.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_replicas_200_groups_with_duplicates_and_late_rollouts() {
    const GROUPS: usize = 200;
    const K: usize = 8;
    let buf = trainer(GROUPS);
    let ingest = GroupIngest::start(
        buf.clone(),
        GroupConfig::new(K).seal_after(Duration::from_secs(3600), K),
    )
    .await
    .expect("start");
    // Replica j generates rollouts k = 2j, 2j+1 of every example, and resends every
    // fifth one (a retry after a lost acknowledgement).
    let mut tasks = Vec::new();
    let mut duplicates_sent = 0;
    for replica in 0..4 {
        let mut mine: Vec<RolloutRecord> = (0..GROUPS)
            .flat_map(|e| (2 * replica..2 * replica + 2).map(move |k| rollout(e, k, replica)))
            .collect();
        let resent: Vec<RolloutRecord> = mine.iter().step_by(5).cloned().collect();
        duplicates_sent += resent.len();
        mine.extend(resent);
        shuffle(&mut mine, 0x9E37 + replica as u64);
        let ingest = ingest.clone();
        tasks.push(tokio::spawn(async move {
            for r in mine {
                ingest.add(r).await.expect("add");
            }
        }));
    }
    for t in tasks {
        t.await.expect("replica task");
    }
    // Late rollouts: a ninth one per example for the first 50, after its group sealed.
    for e in 0..50 {
        let added = ingest.add(rollout(e, K, 0)).await.expect("late");
        assert!(matches!(added, Added::Pending { size: 1, .. }), "{added:?}");
    }
    // At their timeout the late ones are dropped (below min_size), never stored.
    ingest
        .seal_due(std::time::Instant::now() + Duration::from_secs(7200))
        .await
        .expect("seal due");

    assert_eq!(buf.len(), GROUPS);
    let counters = ingest.assembler_counters();
    assert_eq!(counters.sealed_full, GROUPS as u64);
    assert_eq!(counters.duplicates, duplicates_sent as u64);
    assert_eq!(counters.dropped_rollouts, 50);
    assert_eq!(counters.pending_rollouts, 0);
    assert_eq!(ingest.counters().stored_groups, GROUPS as u64);
    // Exactly the expected groups: each example's eight uids, under the stable id.
    let stored: BTreeMap<String, BTreeSet<String>> = buf
        .contents()
        .into_iter()
        .map(|s| {
            let uids = s
                .sample
                .get("rollout_uid")
                .and_then(|t| t.array::<String>());
            let uids = uids
                .map(|a| a.iter().cloned().collect())
                .unwrap_or_default();
            (s.sample.id().to_string(), uids)
        })
        .collect();
    for e in 0..GROUPS {
        let uids: Vec<String> = (0..K).map(|k| format!("u-{e}-{k}")).collect();
        let key = GroupKey {
            environment: "math".into(),
            example_id: format!("ex-{e}"),
            policy_version: Some(0),
        };
        let id = group_id(&key, uids.iter().map(String::as_str));
        let want: BTreeSet<String> = uids.into_iter().collect();
        assert_eq!(stored.get(&id), Some(&want), "group of example {e}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn groups_seal_at_their_timeout_without_new_traffic() {
    let buf = trainer(8);
    let ingest = GroupIngest::start(
        buf.clone(),
        GroupConfig::new(4).seal_after(Duration::from_secs(10), 2),
    )
    .await
    .expect("start");
    ingest.add(rollout(1, 0, 0)).await.expect("add");
    ingest.add(rollout(1, 1, 1)).await.expect("add");
    ingest.add(rollout(2, 0, 0)).await.expect("add");
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(buf.len(), 0, "not yet");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Example 1 sealed with 2 of 4; example 2 (1 < 2) was dropped.
    assert_eq!(buf.len(), 1);
    let c = ingest.assembler_counters();
    assert_eq!(
        (c.sealed_timeout, c.dropped_groups, c.pending_groups),
        (1, 1, 0)
    );
}

/// The first deadline wakes the timer task parked with none: a lone rollout's group is
/// sealed at its timeout with no other traffic at all, whether it came by `add` or by
/// `add_many`.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_first_deadline_wakes_the_idle_timer() {
    for by_many in [false, true] {
        let buf = trainer(8);
        let ingest = GroupIngest::start(
            buf.clone(),
            GroupConfig::new(4).seal_after(Duration::from_secs(10), 1),
        )
        .await
        .expect("start");
        // The timer task runs and parks with no deadline before the rollout comes.
        tokio::time::sleep(Duration::from_secs(1)).await;
        if by_many {
            let answers = ingest.add_many(vec![rollout(1, 0, 0)]).await;
            assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        } else {
            ingest.add(rollout(1, 0, 0)).await.expect("add");
        }
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(
            buf.len(),
            1,
            "sealed at its timeout, 1 of 4 (add_many: {by_many})"
        );
        assert_eq!(ingest.assembler_counters().sealed_timeout, 1);
    }
}

/// The ids of the last `remember` stored groups outlive the groups and a restart of the
/// ingest: a group resent within that window is a duplicate, an older one is stored again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_remembered_groups_are_known_after_they_are_trained() {
    let buf = trainer(8);
    let mut config = GroupConfig::new(2);
    config.remember = 2;
    let whole = |e: usize| (0..2).map(move |k| rollout(e, k, 0));
    {
        let ingest = GroupIngest::start(buf.clone(), config.clone())
            .await
            .expect("start");
        for e in 0..3 {
            for r in whole(e) {
                ingest.add(r).await.expect("add");
            }
        }
        assert_eq!(ingest.counters().stored_groups, 3);
    }
    for _ in 0..3 {
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        batch.commit().await.expect("commit");
    }
    assert_eq!(buf.len(), 0, "only their markers know them now");
    let ingest = GroupIngest::start(buf.clone(), config)
        .await
        .expect("start");
    let answers = ingest
        .add_many(whole(1).chain(whole(2)).chain(whole(0)).collect())
        .await;
    let c = ingest.counters();
    assert_eq!((c.duplicate_groups, c.stored_groups), (2, 1), "{answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_policy_groups_record_every_version() {
    let buf = trainer(8);
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(2).mode(GroupMode::Mixed))
        .await
        .expect("start");
    let mut a = rollout(1, 0, 0);
    a.policy_version = 3;
    let mut b = rollout(1, 1, 0);
    b.policy_version = 5;
    ingest.add(a).await.expect("add");
    let Added::Sealed(group) = ingest.add(b).await.expect("add") else {
        panic!("sealed at 2");
    };
    let stored = buf.contents();
    let sample = &stored[0].sample;
    assert_eq!(sample.id().as_str(), group.id);
    assert_eq!(
        sample.get_meta("policy_versions"),
        Some(&rollout_buffer::MetaValue::Str("3,5".into()))
    );
    assert_eq!(
        sample.get_meta("policy_version"),
        Some(&rollout_buffer::MetaValue::Int(3))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_rollouts_survive_a_restart_and_groups_are_never_stored_twice() {
    // From the log alone, and through a checkpoint after every log group.
    for checkpoint_bytes in [64 << 20, 1] {
        restart_round_trip(checkpoint_bytes).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_rollouts_rejoin_their_groups_whatever_a_new_configuration_accepts() {
    // Three rollouts pending, then a start that accepts policy version 0 only and one
    // rollout per replica and group. They were acknowledged, so all three come back (they
    // had been refused, and refused again at every start): the version-5 rollout and
    // replica 0's second in example 2 included. The new filters apply to new rollouts.
    let dir = TempDir::new("groups-accepted-at-start");
    let open = || open_trainer(dir.path(), PersistOptions::default());
    let strict = || {
        GroupConfig::new(3)
            .accept_policy_versions([0])
            .max_per_replica(1)
    };
    {
        let buf = open().await;
        let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(3))
            .await
            .expect("start");
        let mut newer = rollout(1, 0, 0);
        newer.policy_version = 5;
        for r in [newer, rollout(2, 0, 0), rollout(2, 1, 0)] {
            let added = ingest.add(r).await.expect("add");
            assert!(matches!(added, Added::Pending { .. }), "{added:?}");
        }
        buf.flush().await.expect("flush");
    }
    let buf = open().await;
    let ingest = GroupIngest::start(buf.clone(), strict())
        .await
        .expect("start");
    assert_eq!(ingest.counters().recovered_rollouts, 3);
    let counted = ingest.assembler_counters();
    assert_eq!((counted.version_rejected, counted.replica_capped), (0, 0));
    // New rollouts meet the new filters: replica 0 has its share of example 2's group.
    let added = ingest.add(rollout(2, 2, 0)).await.expect("add");
    assert!(matches!(added, Added::ReplicaCapped), "{added:?}");
    let added = ingest.add(rollout(2, 3, 1)).await.expect("add");
    assert!(matches!(added, Added::Sealed(_)), "{added:?}");
    assert_eq!(
        buf.len(),
        1,
        "example 2's group of 3, both of replica 0's rollouts in it"
    );
}

async fn restart_round_trip(checkpoint_bytes: u64) {
    let dir = TempDir::new("groups-restart");
    let open = || {
        open_trainer(
            dir.path(),
            PersistOptions::default().checkpoint_bytes(checkpoint_bytes),
        )
    };
    let config = GroupConfig::new(8);
    // Run 1: five of eight rollouts arrive, then the process goes away.
    {
        let buf = open().await;
        let ingest = GroupIngest::start(buf.clone(), config.clone())
            .await
            .expect("start");
        for k in 0..5 {
            ingest.add(rollout(1, k, 0)).await.expect("add");
        }
        buf.flush().await.expect("flush");
        if checkpoint_bytes == 1 {
            // The pending rollouts are in a checkpoint's auxiliary segment by now.
            let segments = std::fs::read_dir(format!("{}/segments", dir.path()))
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                })
                .map(|names| names.filter(|n| n.starts_with("aux-")).count())
                .unwrap_or(0);
            assert!(segments > 0, "no auxiliary segment was written");
        }
    }
    // Run 2: the five are pending again; the rest completes the group.
    {
        let buf = open().await;
        let ingest = GroupIngest::start(buf.clone(), config.clone())
            .await
            .expect("start");
        assert_eq!(ingest.counters().recovered_rollouts, 5);
        assert_eq!(ingest.assembler_counters().pending_rollouts, 5);
        for k in 5..8 {
            ingest.add(rollout(1, k, 1)).await.expect("add");
        }
        assert_eq!(buf.len(), 1);
        // The trainer consumes it: it leaves the buffer (and goes to the archive).
        common::commit_next(&buf, "train").await;
        assert_eq!(buf.len(), 0);
        buf.flush().await.expect("flush");
    }
    // Run 3: every replica resends everything; each rollout is recognised as stored (its
    // uid is in the group's marker), so none waits to form a group again.
    {
        let buf = open().await;
        let ingest = GroupIngest::start(buf.clone(), config.clone())
            .await
            .expect("start");
        assert_eq!(
            ingest.counters().recovered_rollouts,
            0,
            "nothing left pending"
        );
        for k in 0..8 {
            let added = ingest.add(rollout(1, k, 0)).await.expect("add");
            assert!(matches!(added, Added::Duplicate), "{k}: {added:?}");
        }
        assert_eq!(ingest.assembler_counters().pending_rollouts, 0);
        assert_eq!(buf.len(), 0);
        buf.flush().await.expect("flush");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_many_answers_each_rollout_and_stores_completed_groups_in_one_put() {
    let dir = TempDir::new("groups-many");
    let open = || open_trainer(dir.path(), PersistOptions::default());
    let config = GroupConfig::new(4);
    {
        let buf = open().await;
        let ingest = GroupIngest::start(buf.clone(), config.clone())
            .await
            .expect("start");
        // Three whole groups, two rollouts of a fourth, a resent rollout and a bad one.
        let mut batch: Vec<RolloutRecord> = (0..3)
            .flat_map(|e| (0..4).map(move |k| rollout(e, k, 0)))
            .collect();
        batch.extend([rollout(3, 0, 0), rollout(3, 1, 0), rollout(3, 1, 0)]);
        let mut bad = rollout(3, 2, 0);
        bad.logprobs.clear();
        batch.push(bad);
        let answers = ingest.add_many(batch).await;
        assert_eq!(answers.len(), 16);
        let sealed = answers
            .iter()
            .filter(|a| matches!(a, Ok(Added::Sealed(_))))
            .count();
        let pending = answers
            .iter()
            .filter(|a| matches!(a, Ok(Added::Pending { .. })))
            .count();
        assert_eq!((sealed, pending), (3, 11), "{answers:?}");
        assert!(
            matches!(answers[14], Ok(Added::Duplicate)),
            "{:?}",
            answers[14]
        );
        assert!(answers[15].is_err(), "the malformed one alone is refused");
        assert_eq!(buf.len(), 3);
        assert_eq!(ingest.counters().stored_groups, 3);
        buf.flush().await.expect("flush");
    }
    // After a restart the two pending rollouts come back; resending everything stores
    // nothing twice: each resent rollout is known from its group's marker.
    let buf = open().await;
    let ingest = GroupIngest::start(buf.clone(), config)
        .await
        .expect("start");
    assert_eq!(ingest.counters().recovered_rollouts, 2);
    let again: Vec<RolloutRecord> = (0..3)
        .flat_map(|e| (0..4).map(move |k| rollout(e, k, 0)))
        .collect();
    let answers = ingest.add_many(again).await;
    assert!(
        answers.iter().all(|a| matches!(a, Ok(Added::Duplicate))),
        "{answers:?}"
    );
    assert_eq!(buf.len(), 3);
    assert_eq!(ingest.assembler_counters().pending_rollouts, 2);
}

/// Bytes of the log files under a store.
fn log_bytes(dir: &str) -> u64 {
    std::fs::read_dir(format!("{dir}/wal"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_groups_in_one_call_are_logged_once() {
    let mut bytes = Vec::new();
    for together in [false, true] {
        let dir = TempDir::new("groups-log-once");
        let buf = SequenceBuffer::open(
            dir.path(),
            16,
            [RpcDef::new("train", 1).inputs(["output_tokens", "reward"])],
            PersistOptions::default(),
        )
        .await
        .expect("open");
        let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(4))
            .await
            .expect("start");
        let mut batch: Vec<RolloutRecord> = (0..4)
            .flat_map(|e| (0..4).map(move |k| rollout(e, k, 0)))
            .collect();
        for r in &mut batch {
            r.output_tokens = vec![7; 512];
            r.logprobs = vec![-0.5; 512];
        }
        if together {
            assert!(ingest.add_many(batch).await.iter().all(Result::is_ok));
        } else {
            for r in batch {
                ingest.add(r).await.expect("add");
            }
        }
        assert_eq!(buf.len(), 4);
        assert_eq!(ingest.assembler_counters().pending_rollouts, 0);
        buf.flush().await.expect("flush");
        bytes.push(log_bytes(dir.path()));
    }
    // One at a time, each rollout is logged pending and again in its group's put (whose
    // samples also carry per-token versions: about 2:1 against a pending entry).
    assert!(
        bytes[1] * 4 < bytes[0] * 3,
        "log bytes one at a time {} vs together {}",
        bytes[0],
        bytes[1]
    );
}

/// With an interval log a pending rollout is answered at once, as every other write is,
/// and is durable once the log is flushed: only a sync log makes the write wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_interval_log_pending_rollouts_are_answered_before_the_flush() {
    let dir = TempDir::new("groups-interval");
    let open = || {
        open_trainer(
            dir.path(),
            PersistOptions::default().durability(Durability::Interval(Duration::from_secs(3600))),
        )
    };
    {
        let buf = open().await;
        let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(8))
            .await
            .expect("start");
        for k in 0..3 {
            // The log's next write is an hour away.
            tokio::time::timeout(Duration::from_secs(10), ingest.add(rollout(1, k, 0)))
                .await
                .expect("answered before the log is written")
                .expect("add");
        }
        assert_eq!(ingest.assembler_counters().pending_rollouts, 3);
        buf.flush().await.expect("flush");
    }
    let buf = open().await;
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(8))
        .await
        .expect("start");
    assert_eq!(ingest.counters().recovered_rollouts, 3);
}

/// One session per list of examples, each a restart of the ingest: every example's group
/// of two is added, stored and trained on, so only its marker knows it afterwards.
async fn train_in_sessions(buf: &SequenceBuffer, config: &GroupConfig, sessions: &[&[usize]]) {
    for examples in sessions {
        let ingest = GroupIngest::start(buf.clone(), config.clone())
            .await
            .expect("start");
        for &e in *examples {
            for k in 0..2 {
                ingest.add(rollout(e, k, 0)).await.expect("add");
            }
            let batch = buf.get_batch_for_rpc("train").await.expect("get");
            batch.commit().await.expect("commit");
        }
    }
}

/// The seal number carries on across restarts, so the window of remembered groups keeps
/// its order: after two restarts, the newest `remember` groups are still the ones known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_groups_stay_in_seal_order_across_restarts() {
    let buf = trainer(8);
    let mut config = GroupConfig::new(2);
    config.remember = 2;
    let whole = |e: usize| (0..2).map(move |k| rollout(e, k, 0));
    train_in_sessions(&buf, &config, &[&[0, 1], &[2], &[3]]).await;
    let ingest = GroupIngest::start(buf.clone(), config)
        .await
        .expect("start");
    ingest
        .add_many(whole(2).chain(whole(3)).chain(whole(1)).collect())
        .await;
    let c = ingest.counters();
    assert_eq!(
        (c.duplicate_groups, c.stored_groups),
        (2, 1),
        "2 and 3 known, 1 forgotten"
    );
}

/// Groups sealed in one session keep their seal order across a restart, whatever their
/// ids: with a window of two, a session seals `first` then `second`; after a restart a
/// third group pushes `first` out, not `second`. Run with the two examples either way
/// round, so that one of the runs has the ids sort against the seal order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_sealed_in_one_session_keep_their_order_across_a_restart() {
    for (first, second) in [(0, 1), (1, 0)] {
        let buf = trainer(8);
        let mut config = GroupConfig::new(2);
        config.remember = 2;
        let whole = |e: usize| (0..2).map(move |k| rollout(e, k, 0));
        train_in_sessions(&buf, &config, &[&[first, second], &[2]]).await;
        let ingest = GroupIngest::start(buf.clone(), config.clone())
            .await
            .expect("start");
        let answers = ingest
            .add_many(whole(second).chain(whole(first)).collect())
            .await;
        let c = ingest.counters();
        assert_eq!(
            (c.duplicate_groups, c.stored_groups),
            (1, 1),
            "sealed {first} then {second}: {second} known, {first} forgotten: {answers:?}"
        );
        let stored: BTreeSet<_> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Added::Sealed(g)) => Some(g.key.example_id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            stored,
            BTreeSet::from([format!("ex-{first}")]),
            "{answers:?}"
        );
    }
}

/// A group whose id the buffer refuses (another writer put a sample under it while the
/// group's own put waited for room) is a duplicate group, answered and counted as one:
/// nothing is stored twice and no rollout gets an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_id_the_buffer_refuses_counts_as_a_duplicate_group() {
    let buf = trainer(2);
    let trainable = |id: &str| {
        Sample::new(id)
            .with("output_tokens", vec![1i32])
            .with("reward", 1.0f64)
    };
    buf.put_batch(vec![trainable("x1"), trainable("x2")])
        .await
        .expect("fill");
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(2))
        .await
        .expect("start");
    let records: Vec<RolloutRecord> = (0..2).map(|k| rollout(0, k, 0)).collect();
    let key = GroupKey::of(&records[0], GroupMode::Strict);
    let id = group_id(&key, records.iter().map(|r| r.rollout_uid.as_str()));
    // Another writer's put of the group's id waits for room first, then the group's own
    // put (the group is not in the buffer yet, so it is not known) waits behind it.
    let other = tokio::spawn({
        let (buf, sample) = (buf.clone(), trainable(&id));
        async move { buf.put_batch(vec![sample]).await }
    });
    wait_until(|| buf.stats().waiting_putters == 1).await;
    let adding = tokio::spawn({
        let ingest = ingest.clone();
        async move { ingest.add_many(records).await }
    });
    wait_until(|| buf.stats().waiting_putters == 2).await;
    // Two slots free up: the other writer's sample takes the first, and the group's put
    // then finds its id taken.
    for want in ["x1", "x2"] {
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        let got: Vec<String> = batch.ids().map(ToString::to_string).collect();
        assert_eq!(got, [want]);
        batch.commit().await.expect("commit");
    }
    other.await.expect("task").expect("the other writer's put");
    let answers = adding.await.expect("task");
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert!(
        matches!(answers.last(), Some(Ok(Added::DuplicateGroup { id: d })) if *d == id),
        "{answers:?}"
    );
    let c = ingest.counters();
    assert_eq!((c.duplicate_groups, c.stored_groups), (1, 0));
    assert_eq!(buf.len(), 1, "only the other writer's sample");
    assert_eq!(ingest.assembler_counters().pending_rollouts, 0);
}

/// Dropping the last clone of an ingest ends its timer task, also with no group pending
/// (when the task waits with no deadline).
#[tokio::test(flavor = "current_thread")]
async fn dropping_the_ingest_ends_its_timer_task() {
    let buf = trainer(4);
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(2))
        .await
        .expect("start");
    assert_eq!(tasks(), before + 1, "the timer task");
    assert_eq!(ingest.seal_time_quantiles(), None, "nothing sealed yet");
    for r in (0..2).map(|k| rollout(0, k, 0)) {
        ingest.add(r).await.expect("add");
    }
    assert!(ingest.seal_time_quantiles().is_some());
    // On this one-thread runtime a yield runs the timer task until it parks, waiting
    // with no deadline: only the drop can wake it.
    tokio::task::yield_now().await;
    drop(ingest);
    common::wait_until(|| tasks() == before).await;
}
