//! Rollouts and groups the buffer under a group ingestion refuses: a rollout without a
//! field the buffer reads is refused alone, before it joins its group (also one added
//! back at a restart); a group refused when it seals can be resent fixed.

mod common;

use common::rollouts::{open_trainer, rollout, trainer};
use common::TempDir;
use rollout_buffer::persist::PersistOptions;
use rollout_buffer::rollout::{Added, GroupConfig, GroupIngest};
use rollout_buffer::{Error, MetaValue, RpcDef, SequenceBuffer};

/// A group the buffer refuses for good (its sample lacks a key the trainer reads) is
/// answered with the error, and the rollouts resent fixed under the same uids are
/// taken as new: the group is stored, not lost to a window of "already seen" uids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollouts_of_a_refused_group_resent_fixed_are_stored() {
    // The trainer reads each group's `difficulty`, which no rollout of the first group
    // has (a group has a metadata column when any member has the key): its sample lacks
    // it, and the buffer refuses it when it seals.
    let buf = SequenceBuffer::new(
        8,
        [RpcDef::new("train", 1).inputs(["output_tokens", "meta/difficulty"])],
    )
    .expect("config");
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(3))
        .await
        .expect("start");
    for k in 0..2 {
        ingest.add(rollout(0, k, 0)).await.expect("pending");
    }
    assert!(
        ingest.add(rollout(0, 2, 0)).await.is_err(),
        "the group is refused"
    );
    assert_eq!((buf.len(), ingest.counters().refused_groups), (0, 1));
    let mut answers = Vec::new();
    for k in 0..3 {
        let mut rated = rollout(0, k, 0);
        rated
            .metadata
            .insert("difficulty".into(), MetaValue::Int(3));
        answers.push(ingest.add(rated).await.expect("add"));
    }
    assert!(
        matches!(
            answers.as_slice(),
            [
                Added::Pending { .. },
                Added::Pending { .. },
                Added::Sealed(_)
            ]
        ),
        "{answers:?}"
    );
    assert_eq!(buf.len(), 1);
}

/// A rollout without a field its buffer reads (a trainer reading `reward`, a rollout sent
/// with none) was answered pending, and its whole group refused when it sealed: the
/// rollouts before it lost with it, and, sealed by the timer, with no error to anyone.
/// It is refused on its own now, naming its uid and the field, and its group stays as it
/// was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_without_a_field_the_buffer_reads_is_refused_before_it_joins_its_group() {
    let buf = trainer(8);
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(2))
        .await
        .expect("start");
    ingest.add(rollout(0, 0, 0)).await.expect("pending");
    let mut unrewarded = rollout(0, 1, 0);
    unrewarded.reward = None;
    let err = ingest.add(unrewarded.clone()).await.expect_err("no reward");
    assert!(
        matches!(&err, Error::InvalidRollout { uid, detail }
            if uid == "u-0-1" && detail.contains("no `reward`")),
        "{err:?}"
    );
    assert_eq!(ingest.assembler_counters().pending_rollouts, 1);
    // A resend of a rollout taken before is a duplicate, whatever it holds.
    let mut resent = rollout(0, 0, 0);
    resent.reward = None;
    let added = ingest.add(resent).await;
    assert!(matches!(added, Ok(Added::Duplicate)), "{added:?}");
    let received = ingest.assembler_counters().received;
    // In one call: refused alone, then taken when sent fixed (its answer its own, not the
    // refused copy's), beside a rollout of another group.
    let answers = ingest
        .add_many(vec![unrewarded, rollout(0, 1, 0), rollout(1, 0, 0)])
        .await;
    assert!(
        matches!(
            answers.as_slice(),
            [
                Err(Error::InvalidRollout { .. }),
                Ok(Added::Sealed(_)),
                Ok(Added::Pending { .. })
            ]
        ),
        "{answers:?}"
    );
    assert_eq!(ingest.assembler_counters().received, received + 2);
    assert_eq!((buf.len(), ingest.counters().refused_groups), (1, 0));
    // A buffer that does not read rewards takes rollouts without one.
    let tokens_only = SequenceBuffer::new(8, [RpcDef::new("train", 1).inputs(["output_tokens"])])
        .expect("config");
    let ingest = GroupIngest::start(tokens_only.clone(), GroupConfig::new(1))
        .await
        .expect("start");
    let mut r = rollout(2, 0, 0);
    r.reward = None;
    let added = ingest.add(r).await;
    assert!(matches!(added, Ok(Added::Sealed(_))), "{added:?}");
    assert_eq!(tokens_only.len(), 1);
}

/// A pending rollout without a field the buffer reads since the restart (accepted by a
/// buffer that did not read rewards) was added back unchecked: its group was refused when
/// it sealed, every rollout of it lost, and a fixed resend of it was a duplicate of the
/// copy its group held. It is left out now (warned of, and kept in the log until a resend
/// replaces it), and its group is stored once it is resent fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_rollout_without_a_field_read_since_the_restart_is_left_out_of_its_group() {
    let dir = TempDir::new("groups-unrewarded-at-start");
    {
        let buf = SequenceBuffer::open(
            dir.path(),
            16,
            [RpcDef::new("train", 1).inputs(["output_tokens"])],
            PersistOptions::default(),
        )
        .await
        .expect("open");
        let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(3))
            .await
            .expect("start");
        let mut unrewarded = rollout(0, 1, 0);
        unrewarded.reward = None;
        for r in [rollout(0, 0, 0), unrewarded] {
            let added = ingest.add(r).await.expect("add");
            assert!(matches!(added, Added::Pending { .. }), "{added:?}");
        }
        buf.flush().await.expect("flush");
    }
    // The trainer reads rewards now.
    let buf = open_trainer(dir.path(), PersistOptions::default()).await;
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(3))
        .await
        .expect("start");
    assert_eq!(ingest.assembler_counters().pending_rollouts, 1);
    let mut answers = Vec::new();
    for k in [1, 2] {
        answers.push(ingest.add(rollout(0, k, 0)).await.expect("add"));
    }
    assert!(
        matches!(
            answers.as_slice(),
            [Added::Pending { size: 2, .. }, Added::Sealed(_)]
        ),
        "{answers:?}"
    );
    assert_eq!((buf.len(), ingest.counters().refused_groups), (1, 0));
}

/// A closed buffer's ingest took a rollout as pending and refused it only once its group
/// sealed. It refuses at once now, holding nothing, through `add` and `add_many` alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_buffers_ingest_refuses_a_rollout_at_once() {
    let buf = trainer(8);
    let ingest = GroupIngest::start(buf.clone(), GroupConfig::new(2))
        .await
        .expect("start");
    buf.close();
    let added = ingest.add(rollout(0, 0, 0)).await;
    assert!(matches!(added, Err(Error::Closed)), "{added:?}");
    let answers = ingest
        .add_many(vec![rollout(1, 0, 0), rollout(1, 1, 0)])
        .await;
    assert!(
        matches!(answers.as_slice(), [Err(Error::Closed), Err(Error::Closed)]),
        "{answers:?}"
    );
    let counters = ingest.assembler_counters();
    assert_eq!((counters.received, counters.pending_rollouts), (0, 0));
}
