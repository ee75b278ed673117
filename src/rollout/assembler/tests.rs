//! Unit tests of the assembler: sealing, duplicates, timeouts, caps, and the undoing of
//! arrivals (`withdraw`, `reopen`).

// `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot fail
// (an in-memory store, a runtime, data the test built); library code has none
// (tests/layout.rs checks).

use super::*;

fn rollout(example: &str, version: u64, uid: &str, replica: &str) -> RolloutRecord {
    let mut r = RolloutRecord::new("math", example, version, uid);
    r.replica_id = replica.into();
    r
}

/// The strict group key of `rollout(example, version, ..)`.
fn key(example: &str, version: u64) -> GroupKey {
    GroupKey {
        environment: "math".into(),
        example_id: example.into(),
        policy_version: Some(version),
    }
}

#[test]
fn seals_at_target_size_and_dedupes_by_uid() -> Result<()> {
    let t0 = Instant::now();
    let mut a = GroupAssembler::new(GroupConfig::new(3));
    assert!(matches!(
        a.add(rollout("e", 1, "u1", "r"), t0)?,
        Added::Pending { size: 1, .. }
    ));
    assert_eq!(a.add(rollout("e", 1, "u1", "r"), t0)?, Added::Duplicate);
    assert!(matches!(
        a.add(rollout("e", 1, "u2", "r"), t0)?,
        Added::Pending { size: 2, .. }
    ));
    let Added::Sealed(g) = a.add(rollout("e", 1, "u3", "r"), t0)? else {
        panic!("full at 3");
    };
    assert_eq!(g.rollouts.len(), 3);
    assert_eq!(g.reason, SealReason::Full);
    // A late duplicate of a sealed rollout is still a duplicate.
    assert_eq!(a.add(rollout("e", 1, "u2", "r"), t0)?, Added::Duplicate);
    let c = a.counters();
    assert_eq!(
        (c.received, c.duplicates, c.sealed_full, c.pending_groups),
        (5, 2, 1, 0)
    );
    Ok(())
}

#[test]
fn seal_times_run_from_a_groups_first_rollout() -> Result<()> {
    // Groups of 2 sealing 1 s, 2 s, ... 100 s after their first rollout.
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut a = GroupAssembler::new(GroupConfig::new(2));
    assert_eq!(a.seal_time_quantiles(), None, "none before a seal");
    for g in 1..=100u32 {
        let example = format!("e{g}");
        a.add(rollout(&example, 0, &format!("{g}a"), "r"), t0)?;
        a.add(rollout(&example, 0, &format!("{g}b"), "r"), t0 + g * s)?;
    }
    // Median of 1..=100 s at rank round(99 * 0.5) = 50 (51 s), p99 at 98 (99 s).
    assert_eq!(a.seal_time_quantiles(), Some((51 * s, 99 * s)));
    Ok(())
}

#[test]
fn strict_keys_split_versions_and_mixed_keys_do_not() -> Result<()> {
    let t0 = Instant::now();
    let mut strict = GroupAssembler::new(GroupConfig::new(2));
    strict.add(rollout("e", 1, "a", "r"), t0)?;
    assert!(matches!(
        strict.add(rollout("e", 2, "b", "r"), t0)?,
        Added::Pending { .. }
    ));
    let mut mixed = GroupAssembler::new(GroupConfig::new(2).mode(GroupMode::Mixed));
    mixed.add(rollout("e", 1, "a", "r"), t0)?;
    let Added::Sealed(g) = mixed.add(rollout("e", 2, "b", "r"), t0)? else {
        panic!("mixed groups take both versions");
    };
    assert_eq!(g.oldest_version(), 1);
    Ok(())
}

#[test]
fn timeouts_seal_with_min_size_or_drop_or_keep_waiting() -> Result<()> {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let config = GroupConfig::new(4).seal_after(10 * s, 2);
    let mut a = GroupAssembler::new(config.clone());
    a.add(rollout("x", 0, "x1", "r"), t0)?;
    a.add(rollout("x", 0, "x2", "r"), t0 + s)?;
    a.add(rollout("y", 0, "y1", "r"), t0 + 2 * s)?;
    assert_eq!(
        a.next_deadline(),
        Some(t0 + 10 * s),
        "from the first rollout"
    );
    assert!(a.seal_due(t0 + 9 * s).sealed.is_empty());
    let due = a.seal_due(t0 + 12 * s);
    assert_eq!(due.sealed.len(), 1);
    assert_eq!(due.sealed[0].reason, SealReason::Timeout);
    assert_eq!(due.dropped.len(), 1, "y has 1 < 2");
    assert_eq!(a.counters().dropped_rollouts, 1);
    // Kept waiting instead: it seals on reaching min_size.
    let mut a = GroupAssembler::new(config.undersized(Undersized::KeepWaiting));
    a.add(rollout("y", 0, "y1", "r"), t0)?;
    assert!(a.seal_due(t0 + 11 * s).dropped.is_empty());
    let Added::Sealed(g) = a.add(rollout("y", 0, "y2", "r"), t0 + 20 * s)? else {
        panic!("overdue group reached min_size");
    };
    assert_eq!((g.rollouts.len(), g.reason), (2, SealReason::Timeout));
    Ok(())
}

#[test]
fn a_withdrawn_rollout_is_as_if_it_never_arrived() -> Result<()> {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut a = GroupAssembler::new(GroupConfig::new(3).max_per_replica(1));
    let Added::Pending { key, .. } = a.add(rollout("e", 1, "u1", "r1"), t0)? else {
        panic!("pending");
    };
    a.add(rollout("e", 1, "u2", "r2"), t0 + s)?;
    assert!(a.withdraw(&key, "u2"));
    assert!(!a.withdraw(&key, "u2"), "already out");
    assert_eq!(a.counters().pending_rollouts, 1);
    // Its uid and its replica's share are free again: the resend is taken.
    assert!(matches!(
        a.add(rollout("e", 1, "u2", "r2"), t0 + s)?,
        Added::Pending { size: 2, .. }
    ));
    // A group emptied by withdrawals goes, with its deadline.
    assert!(a.withdraw(&key, "u1") && a.withdraw(&key, "u2"));
    assert_eq!((a.counters().pending_groups, a.next_deadline()), (0, None));
    assert!(!a.withdraw(&key, "u1"), "no group");
    Ok(())
}

#[test]
fn a_reopened_group_is_pending_again_and_seals_on_its_completion() -> Result<()> {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut a = GroupAssembler::new(GroupConfig::new(3).seal_after(10 * s, 3));
    a.add(rollout("e", 1, "u1", "r"), t0)?;
    a.add(rollout("e", 1, "u2", "r"), t0)?;
    let Added::Sealed(g) = a.add(rollout("e", 1, "u3", "r"), t0)? else {
        panic!("full");
    };
    // Its store failed; u3's sender was told, so u3 is left out.
    let id = g.id.clone();
    a.reopen(g, |r| r.rollout_uid != "u3", t0 + 5 * s);
    let c = a.counters();
    assert_eq!((c.sealed_full, c.pending_rollouts), (0, 2));
    assert_eq!(a.next_deadline(), Some(t0 + 15 * s), "from the reopening");
    // A resend of a reopened member is a duplicate; u3's completes the same group.
    assert_eq!(
        a.add(rollout("e", 1, "u1", "r"), t0 + 6 * s)?,
        Added::Duplicate
    );
    let Added::Sealed(again) = a.add(rollout("e", 1, "u3", "r"), t0 + 6 * s)? else {
        panic!("complete again");
    };
    assert_eq!(again.id, id);
    assert_eq!(a.counters().sealed_full, 1);
    assert_eq!(a.next_deadline(), None);
    Ok(())
}

#[test]
fn a_reopened_group_merging_with_a_newer_one_is_due_when_complete() -> Result<()> {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut a = GroupAssembler::new(GroupConfig::new(3).seal_after(10 * s, 3));
    for uid in ["u1", "u2"] {
        a.add(rollout("e", 1, uid, "r"), t0)?;
    }
    let Added::Sealed(g) = a.add(rollout("e", 1, "u3", "r"), t0)? else {
        panic!("full");
    };
    // While it was being stored, u4 started a group of the same key.
    a.add(rollout("e", 1, "u4", "r"), t0 + s)?;
    a.reopen(g, |r| r.rollout_uid != "u3", t0 + 2 * s);
    assert_eq!(a.counters().pending_rollouts, 3);
    assert_eq!(a.next_deadline(), Some(t0 + 2 * s), "due at once");
    let due = a.seal_due(t0 + 2 * s);
    assert_eq!(due.sealed.len(), 1);
    assert_eq!(due.sealed[0].rollouts.len(), 3);
    assert_eq!(due.sealed[0].reason, SealReason::Full);
    // Below the seal condition the newer group's deadline stands; a reopen with
    // nothing kept only forgets the uids.
    for uid in ["v1", "v2"] {
        a.add(rollout("f", 1, uid, "r"), t0)?;
    }
    let Added::Sealed(g) = a.add(rollout("f", 1, "v3", "r"), t0)? else {
        panic!("full");
    };
    a.add(rollout("f", 1, "v4", "r"), t0 + 4 * s)?;
    a.reopen(g.clone(), |r| r.rollout_uid == "v1", t0 + 5 * s);
    assert_eq!(a.next_deadline(), Some(t0 + 14 * s), "v4's");
    assert_eq!(a.counters().pending_rollouts, 2);
    let received = a.counters().received;
    a.reopen(g, |_| false, t0 + 5 * s);
    assert_eq!(a.counters().received, received - 3, "as if never arrived");
    // v2 is new again: with v4 and v1 it completes the group.
    let Added::Sealed(g) = a.add(rollout("f", 1, "v2", "r"), t0 + 6 * s)? else {
        panic!("v1, v2, v4");
    };
    assert_eq!(g.rollouts.len(), 3);
    Ok(())
}

#[test]
fn a_reopened_group_is_retried_no_sooner_than_retry_after() -> Result<()> {
    let t0 = Instant::now();
    let mut a = GroupAssembler::new(GroupConfig::new(2).seal_after(Duration::ZERO, 1));
    a.add(rollout("e", 1, "u1", "r"), t0)?;
    let due = a.seal_due(t0);
    let [g] = <[SealedGroup; 1]>::try_from(due.sealed).expect("one group");
    a.reopen(g, |_| true, t0);
    assert_eq!(a.next_deadline(), Some(t0 + RETRY_AFTER));
    assert!(a.seal_due(t0 + RETRY_AFTER / 2).sealed.is_empty());
    assert_eq!(a.seal_due(t0 + RETRY_AFTER).sealed.len(), 1);
    Ok(())
}

#[test]
fn replica_caps_and_version_filters_are_counted() -> Result<()> {
    let t0 = Instant::now();
    let mut a = GroupAssembler::new(
        GroupConfig::new(4)
            .max_per_replica(2)
            .accept_policy_versions([1, 2]),
    );
    a.add(rollout("e", 1, "a", "r1"), t0)?;
    a.add(rollout("e", 1, "b", "r1"), t0)?;
    assert_eq!(a.add(rollout("e", 1, "c", "r1"), t0)?, Added::ReplicaCapped);
    assert_eq!(
        a.add(rollout("e", 3, "d", "r2"), t0)?,
        Added::VersionRejected
    );
    let c = a.counters();
    assert_eq!(
        (c.replica_capped, c.version_rejected, c.pending_rollouts),
        (1, 1, 2)
    );
    Ok(())
}

#[test]
fn a_timeout_too_long_to_represent_never_passes() -> Result<()> {
    let t0 = Instant::now();
    let year = Duration::from_secs(365 * 24 * 3600);
    let mut a = GroupAssembler::new(GroupConfig::new(2).seal_after(Duration::MAX, 1));
    a.add(rollout("e", 1, "u1", "r"), t0)?;
    assert!(a.next_deadline().is_some_and(|d| d > t0 + year));
    let Added::Sealed(g) = a.add(rollout("e", 1, "u2", "r"), t0)? else {
        panic!("full");
    };
    // So is a reopened group's.
    a.reopen(g, |_| true, t0);
    assert!(a.next_deadline().is_some_and(|d| d > t0 + year));
    Ok(())
}

#[test]
fn the_counts_of_timeouts_and_drops_and_the_remembered_window() -> Result<()> {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut config = GroupConfig::new(3).seal_after(s, 2);
    config.remember = 3;
    let mut a = GroupAssembler::new(config);
    for (example, uid) in [("x", "x1"), ("x", "x2"), ("y", "y1"), ("z", "z1")] {
        a.add(rollout(example, 1, uid, "r"), t0)?;
    }
    // x seals at its timeout; y and z are dropped.
    let due = a.seal_due(t0 + s);
    assert_eq!((due.sealed.len(), due.dropped.len()), (1, 2));
    let c = a.counters();
    assert_eq!(
        (c.sealed_timeout, c.dropped_groups, c.dropped_rollouts),
        (1, 2, 2)
    );
    // The last three uids that left are remembered: the oldest of the four is not.
    for uid in ["x2", "y1", "z1"] {
        let example = &uid[..1];
        assert_eq!(
            a.add(rollout(example, 1, uid, "r"), t0 + s)?,
            Added::Duplicate,
            "{uid}"
        );
    }
    assert!(matches!(
        a.add(rollout("x", 1, "x1", "r"), t0 + s)?,
        Added::Pending { .. }
    ));
    Ok(())
}

#[test]
fn a_reopen_counts_replica_shares_and_a_merge_below_the_seal_condition_waits() -> Result<()> {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let config = GroupConfig::new(4).seal_after(10 * s, 2).max_per_replica(2);
    let mut a = GroupAssembler::new(config);
    let mut sealed = None;
    for (uid, replica) in [("u1", "r"), ("u2", "r"), ("u3", "q"), ("u4", "q")] {
        if let Added::Sealed(g) = a.add(rollout("e", 1, uid, replica), t0)? {
            sealed = Some(g);
        }
    }
    let group = sealed.expect("full at 4");
    // While its store fails, u5 starts a newer group of the same key.
    a.add(rollout("e", 1, "u5", "q"), t0 + s)?;
    // The store failed: u1 and u2 (replica r) are kept, u3 and u4 left out.
    a.reopen(group, |r| r.rollout_uid.as_str() < "u3", t0 + 2 * s);
    // Three: above `min_size`, but neither full nor overdue, so u5's deadline stands.
    assert_eq!(a.counters().pending_rollouts, 3);
    assert_eq!(a.next_deadline(), Some(t0 + 11 * s));
    // Replica r's two reopened rollouts count against its cap.
    assert_eq!(
        a.add(rollout("e", 1, "u6", "r"), t0 + 3 * s)?,
        Added::ReplicaCapped
    );
    Ok(())
}

#[test]
fn a_withdrawal_gives_back_one_share_of_its_replicas_cap() -> Result<()> {
    let t0 = Instant::now();
    let mut a = GroupAssembler::new(GroupConfig::new(8).max_per_replica(2));
    let Added::Pending { key, .. } = a.add(rollout("e", 1, "u1", "r"), t0)? else {
        panic!("pending");
    };
    a.add(rollout("e", 1, "u2", "r"), t0)?;
    assert!(a.withdraw(&key, "u2"));
    // Replica r still holds u1: one more is taken, then it is at its cap again.
    assert!(matches!(
        a.add(rollout("e", 1, "u3", "r"), t0)?,
        Added::Pending { size: 2, .. }
    ));
    assert_eq!(a.add(rollout("e", 1, "u4", "r"), t0)?, Added::ReplicaCapped);
    Ok(())
}

#[test]
fn a_reopened_group_merging_with_an_overdue_one_is_due_at_once() -> Result<()> {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let config = GroupConfig::new(4).seal_after(10 * s, 2);
    let mut a = GroupAssembler::new(config.undersized(Undersized::KeepWaiting));
    for uid in ["u1", "u2", "u3"] {
        a.add(rollout("e", 1, uid, "r"), t0)?;
    }
    let Added::Sealed(g) = a.add(rollout("e", 1, "u4", "r"), t0)? else {
        panic!("full");
    };
    // While it was being stored, u5 started a group of the same key, which timed out
    // below `min_size` and waits.
    a.add(rollout("e", 1, "u5", "r"), t0)?;
    assert!(a.seal_due(t0 + 10 * s).sealed.is_empty());
    // The store failed; u1 is kept: with u5 the merged group reaches `min_size`, and it
    // is overdue, so it seals at once.
    a.reopen(g, |r| r.rollout_uid == "u1", t0 + 11 * s);
    assert_eq!(a.next_deadline(), Some(t0 + 11 * s), "due at once");
    let due = a.seal_due(t0 + 11 * s);
    assert_eq!(due.sealed.len(), 1);
    assert_eq!(
        (due.sealed[0].rollouts.len(), due.sealed[0].reason),
        (2, SealReason::Timeout)
    );
    Ok(())
}

#[test]
fn a_resealed_groups_uids_are_remembered_from_their_second_seal() -> Result<()> {
    let t0 = Instant::now();
    let mut config = GroupConfig::new(1);
    config.remember = 2;
    let mut a = GroupAssembler::new(config);
    let Added::Sealed(first) = a.add(rollout("e1", 1, "u1", "r"), t0)? else {
        panic!("a group of one");
    };
    a.add(rollout("e2", 1, "u2", "r"), t0)?;
    // u1's store failed: it seals again at its retry, and is then the newest uid
    // remembered.
    a.reopen(first, |_| true, t0);
    let retry = a.next_deadline().expect("a retry");
    assert_eq!(a.seal_due(retry).sealed.len(), 1);
    // A third uid pushes the oldest memory out, which is u2's, not u1's.
    a.add(rollout("e3", 1, "u3", "r"), retry)?;
    assert_eq!(a.add(rollout("e1", 1, "u1", "r"), retry)?, Added::Duplicate);
    assert!(matches!(
        a.add(rollout("e2", 1, "u2", "r"), retry)?,
        Added::Sealed(_)
    ));
    Ok(())
}

#[test]
fn a_reconfigured_assembler_regroups_its_pending_rollouts_under_the_new_settings() -> Result<()> {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut a = GroupAssembler::new(GroupConfig::new(4).seal_after(10 * s, 4));
    for uid in ["a1", "a2", "a3"] {
        a.add(rollout("a", 1, uid, "r"), t0)?;
    }
    a.add(rollout("b", 1, "b1", "r"), t0)?;
    // A change of mode is refused, and changes nothing.
    let mixed = GroupConfig::new(2).mode(GroupMode::Mixed);
    assert!(matches!(
        a.reconfigure(mixed, t0 + s),
        Err(crate::Error::InvalidConfig { .. })
    ));
    assert_eq!(a.config().target_size, 4);
    assert_eq!(a.counters().pending_rollouts, 4);
    // Groups of 2: a's first two seal, in arrival order; a3 and b1 wait, their timeouts
    // (now 5 s) counted from the reconfiguration.
    let sealed = a.reconfigure(GroupConfig::new(2).seal_after(5 * s, 1), t0 + s)?;
    let uids: Vec<Vec<&str>> = sealed
        .iter()
        .map(|g| g.rollouts.iter().map(|r| r.rollout_uid.as_str()).collect())
        .collect();
    assert_eq!(uids, [vec!["a1", "a2"]]);
    assert_eq!(sealed[0].reason, SealReason::Full);
    let c = a.counters();
    assert_eq!(
        (c.received, c.pending_rollouts, c.pending_groups),
        (4, 2, 2)
    );
    assert_eq!(a.next_deadline(), Some(t0 + 6 * s));
    // The sealed uids are remembered; the rest complete their groups as usual.
    assert_eq!(
        a.add(rollout("a", 1, "a2", "r"), t0 + 2 * s)?,
        Added::Duplicate
    );
    let Added::Sealed(g) = a.add(rollout("b", 1, "b2", "r"), t0 + 2 * s)? else {
        panic!("b is full at 2");
    };
    assert_eq!(g.rollouts.len(), 2);
    let due = a.seal_due(t0 + 6 * s);
    assert_eq!(
        due.sealed.len(),
        1,
        "a3 alone, at its new timeout with min size 1"
    );
    Ok(())
}

#[test]
fn a_uid_held_by_another_group_is_refused_apart_from_duplicates() -> Result<()> {
    let t0 = Instant::now();
    let mut a = GroupAssembler::new(GroupConfig::new(2));
    let taken = |uid: &str| Added::UidTaken { uid: uid.into() };
    // Pending in group e1: the same uid for e2 is refused, and e1 keeps its rollout.
    a.add(rollout("e1", 1, "u1", "r"), t0)?;
    assert_eq!(a.add(rollout("e2", 1, "u1", "r"), t0)?, taken("u1"));
    assert_eq!(a.pending_in(&key("e2", 1)).count(), 0, "e2 took nothing");
    // In its own group it is a plain duplicate.
    assert_eq!(a.add(rollout("e1", 1, "u1", "r"), t0)?, Added::Duplicate);
    // Once e1 seals, the uid stays its own: another group is still refused, e1's own
    // late copy is a duplicate.
    assert!(matches!(
        a.add(rollout("e1", 1, "u2", "r"), t0)?,
        Added::Sealed(_)
    ));
    assert_eq!(a.add(rollout("e3", 1, "u2", "r"), t0)?, taken("u2"));
    assert_eq!(a.add(rollout("e1", 1, "u1", "r"), t0)?, Added::Duplicate);
    // A strict group of another version is another group.
    assert_eq!(a.add(rollout("e1", 2, "u1", "r"), t0)?, taken("u1"));
    let c = a.counters();
    assert_eq!((c.duplicates, c.uid_taken, c.pending_rollouts), (2, 3, 0));
    Ok(())
}

#[test]
fn rollouts_numbered_per_prompt_are_refused_loudly_not_merged() -> Result<()> {
    // A sender numbering each prompt's samples 0..K: the second prompt's rollouts are
    // refused as taken (not counted as duplicates of the first's), so the counters say
    // what went wrong, and no rollout lands in another prompt's group.
    let t0 = Instant::now();
    let mut a = GroupAssembler::new(GroupConfig::new(2));
    for example in ["p1", "p2"] {
        for n in ["0", "1"] {
            a.add(rollout(example, 1, n, "r"), t0)?;
        }
    }
    let c = a.counters();
    assert_eq!((c.sealed_full, c.uid_taken, c.duplicates), (1, 2, 0));
    Ok(())
}

#[test]
fn a_withdrawn_uid_is_free_and_a_reopened_one_is_held_again() -> Result<()> {
    let t0 = Instant::now();
    let mut a = GroupAssembler::new(GroupConfig::new(2));
    a.add(rollout("e1", 1, "u1", "r"), t0)?;
    assert!(a.withdraw(&key("e1", 1), "u1"));
    // As if it never arrived: another group may have it.
    assert!(matches!(
        a.add(rollout("e2", 1, "u1", "r"), t0)?,
        Added::Pending { size: 1, .. }
    ));
    let Added::Sealed(group) = a.add(rollout("e2", 1, "u2", "r"), t0)? else {
        panic!("e2 full at 2");
    };
    // Its store failed: the group is pending again, and its uids are its own again.
    a.reopen(group, |_| true, t0);
    assert_eq!(
        a.add(rollout("e3", 1, "u2", "r"), t0)?,
        Added::UidTaken { uid: "u2".into() }
    );
    assert_eq!(a.add(rollout("e2", 1, "u2", "r"), t0)?, Added::Duplicate);
    // Uids remembered from an earlier process name no group: a plain duplicate anywhere.
    a.remember_gone(["old".to_owned()]);
    assert_eq!(a.add(rollout("e4", 1, "old", "r"), t0)?, Added::Duplicate);
    Ok(())
}

#[test]
fn uids_leave_with_their_group_and_stay_with_the_group_that_took_them() -> Result<()> {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut config = GroupConfig::new(2);
    config.min_size = 2;
    config.seal_timeout = s;
    let mut a = GroupAssembler::new(config);
    // A group dropped below min_size at its timeout: its uid is gone with it, still its.
    a.add(rollout("e1", 1, "u1", "r"), t0)?;
    assert!(a.seal_due(t0 + 2 * s).dropped.len() == 1);
    assert_eq!(
        a.add(rollout("e2", 1, "u1", "r"), t0 + 2 * s)?,
        Added::UidTaken { uid: "u1".into() }
    );
    // A reopened group does not take back a uid let go meanwhile and taken by another.
    let mut b = GroupAssembler::new(GroupConfig::new(2));
    b.add(rollout("e1", 1, "u1", "r"), t0)?;
    let Added::Sealed(group) = b.add(rollout("e1", 1, "u2", "r"), t0)? else {
        panic!("full at 2");
    };
    b.let_resend(["u2"]);
    b.add(rollout("e2", 1, "u2", "r"), t0)?;
    b.reopen(group, |_| true, t0);
    assert_eq!(b.pending_in(&key("e1", 1)).count(), 1, "only u1 came back");
    assert_eq!(b.pending_in(&key("e2", 1)).count(), 1, "u2 stays e2's");
    assert_eq!(
        b.add(rollout("e1", 1, "u2", "r"), t0)?,
        Added::UidTaken { uid: "u2".into() }
    );
    // Uids remembered from a tagged marker are taken for another group, duplicates for
    // their own, and remembering never frees a uid still pending.
    // A window of one remembered uid, so a remembered uid can be pushed out of it.
    let mut config = GroupConfig::new(3);
    config.remember = 1;
    let mut c = GroupAssembler::new(config);
    c.remember_gone_from(["old".to_owned()], key_tag(&key("e1", 1)));
    assert_eq!(c.add(rollout("e1", 1, "old", "r"), t0)?, Added::Duplicate);
    assert_eq!(
        c.add(rollout("e2", 1, "old", "r"), t0)?,
        Added::UidTaken { uid: "old".into() }
    );
    c.add(rollout("e3", 1, "p", "r"), t0)?;
    c.remember_gone(["p".to_owned()]);
    c.remember_gone(["x".to_owned()]);
    // `p` left the window, and is still e3's: pending there, taken for another group.
    c.add(rollout("e3", 1, "q", "r"), t0)?;
    assert_eq!(c.pending_in(&key("e3", 1)).count(), 2);
    assert_eq!(c.add(rollout("e3", 1, "p", "r"), t0)?, Added::Duplicate);
    assert_eq!(
        c.add(rollout("e4", 1, "p", "r"), t0)?,
        Added::UidTaken { uid: "p".into() }
    );
    Ok(())
}
