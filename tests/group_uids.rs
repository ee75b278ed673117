//! Rollout uids across groups, through a real buffer on a store: a uid names one rollout
//! of the run, so a second group's rollout under a pending uid is refused, and the group
//! holding it keeps it across a restart.

mod common;

use common::rollouts::{open_trainer, rollout};
use common::TempDir;
use rollout_buffer::persist::PersistOptions;
use rollout_buffer::rollout::{Added, GroupConfig, GroupIngest};
use std::collections::BTreeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_held_by_another_group_is_refused_and_its_holder_survives_a_restart() {
    // Rollouts are logged as pending under their uid. A second group's rollout under a
    // pending uid used to be taken, its log entry replacing the first group's: after a
    // restart that rollout had moved groups. It is refused now, in `add` and `add_many`,
    // and the first group gets its rollout back.
    let dir = TempDir::new("groups-uid-taken");
    let open = || open_trainer(dir.path(), PersistOptions::default());
    let config = GroupConfig::new(4);
    // The rollout of example 2 under a uid example 1's rollout holds.
    let intruder = || {
        let mut r = rollout(2, 0, 1);
        r.rollout_uid = rollout(1, 0, 0).rollout_uid;
        r
    };
    {
        let buf = open().await;
        let ingest = GroupIngest::start(buf.clone(), config.clone())
            .await
            .expect("start");
        ingest.add(rollout(1, 0, 0)).await.expect("add");
        let added = ingest.add(intruder()).await.expect("add");
        assert!(
            matches!(&added, Added::UidTaken { uid } if uid == "u-1-0"),
            "{added:?}"
        );
        let answers = ingest.add_many(vec![intruder(), rollout(2, 1, 1)]).await;
        assert!(
            matches!(answers[0], Ok(Added::UidTaken { .. })),
            "{answers:?}"
        );
        assert!(
            matches!(answers[1], Ok(Added::Pending { size: 1, .. })),
            "{answers:?}"
        );
        let counted = ingest.assembler_counters();
        assert_eq!((counted.uid_taken, counted.duplicates), (2, 0));
        buf.flush().await.expect("flush");
    }
    let buf = open().await;
    let ingest = GroupIngest::start(buf.clone(), config.clone())
        .await
        .expect("start");
    assert_eq!(ingest.counters().recovered_rollouts, 2);
    // Example 1's group completes with its own first rollout, example 2's without it.
    for k in 1..4 {
        ingest.add(rollout(1, k, 0)).await.expect("add");
    }
    assert_eq!(buf.len(), 1, "example 1's group of 4 is stored");
    let uids: Vec<BTreeSet<String>> = buf
        .contents()
        .into_iter()
        .map(|s| {
            s.sample
                .get("rollout_uid")
                .and_then(|t| t.array::<String>())
                .map(|a| a.iter().cloned().collect())
                .unwrap_or_default()
        })
        .collect();
    let want: BTreeSet<String> = (0..4).map(|k| format!("u-1-{k}")).collect();
    assert_eq!(uids, vec![want]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_groups_uid_is_still_taken_for_another_group_after_a_restart() {
    // A sender numbering rollouts per prompt: the second prompt's rollouts are refused as
    // taken before a restart and after it (the marker keeps its group key's tag), and the
    // first prompt's own resend is a duplicate.
    let dir = TempDir::new("groups-uid-taken-restart");
    let open = || open_trainer(dir.path(), PersistOptions::default());
    let config = GroupConfig::new(2);
    let numbered = |example: usize, n: usize| {
        let mut r = rollout(example, n, 0);
        r.rollout_uid = n.to_string();
        r
    };
    {
        let buf = open().await;
        let ingest = GroupIngest::start(buf.clone(), config.clone())
            .await
            .expect("start");
        for n in 0..2 {
            ingest.add(numbered(1, n)).await.expect("add");
        }
        assert_eq!(buf.len(), 1);
        let added = ingest.add(numbered(2, 0)).await.expect("add");
        assert!(matches!(added, Added::UidTaken { .. }), "{added:?}");
        buf.flush().await.expect("flush");
    }
    let buf = open().await;
    let ingest = GroupIngest::start(buf.clone(), config.clone())
        .await
        .expect("start");
    let added = ingest.add(numbered(2, 1)).await.expect("add");
    assert!(matches!(added, Added::UidTaken { .. }), "{added:?}");
    let added = ingest.add(numbered(1, 1)).await.expect("add");
    assert!(matches!(added, Added::Duplicate), "{added:?}");
    let counted = ingest.assembler_counters();
    assert_eq!((counted.uid_taken, counted.duplicates), (1, 1));
    assert_eq!(buf.len(), 1);
}
