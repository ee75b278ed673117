//! Unit tests of the memory budget's bookkeeping (`state/residency.rs`, `state/table/spill.rs`).

// `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot fail
// (an in-memory store, a runtime, data the test built); library code has none
// (tests/layout.rs checks).

use crate::rpc_defs::{KeySet, Selection};
use crate::state::{RpcSpec, SlotTable};

fn table(newest_first: bool) -> SlotTable {
    let spec = RpcSpec {
        inputs: KeySet(1),
        reads: 1,
        n_seqs: 1,
        selection: Selection::Fifo,
        lease_timeout: None,
        max_staleness: None,
        max_age: None,
        rate_limit: None,
    };
    SlotTable::new(8, vec![spec]).with_residency(Some(100), newest_first)
}

fn put(t: &mut SlotTable, birth: u64, bytes: u64) -> u32 {
    let (slots, _) = t.claim_put_sized(1, 0, bytes, None).expect("room");
    t.reserve_resident(&slots, &[bytes]);
    let _ = t.publish_put(&slots, &[birth], &[KeySet(1)]);
    slots[0]
}

#[test]
fn puts_wait_for_room_unless_nothing_is_resident() {
    let mut t = table(true);
    assert!(
        t.residency.fits(1_000),
        "an oversized put fits an empty buffer"
    );
    put(&mut t, 1, 60);
    assert!(t.residency.fits(40));
    assert!(!t.residency.fits(41));
    assert!(t.claim_put_sized(1, 0, 41, None).is_none());
    t.check_invariants().expect("invariants");
}

#[test]
fn spills_newest_first_for_fifo_consumers_and_oldest_first_otherwise() {
    for newest_first in [true, false] {
        let mut t = table(newest_first);
        let a = put(&mut t, 1, 30);
        let b = put(&mut t, 2, 30);
        let c = put(&mut t, 3, 30);
        let picked = t.pick_spill(50);
        let want = if newest_first { vec![c, b] } else { vec![a, b] };
        assert_eq!(picked, want);
        // Being spilled: not picked twice.
        assert_eq!(t.pick_spill(100).len(), 1);
        t.check_invariants().expect("invariants");
        for s in picked {
            t.end_spill(s as usize, 0);
        }
        assert_eq!(t.residency.resident, 30);
        t.check_invariants().expect("invariants");
    }
}

#[test]
fn leased_and_amended_samples_are_not_spillable() {
    let mut t = table(true);
    let a = put(&mut t, 1, 30);
    let b = put(&mut t, 2, 30);
    t.begin_amend(&[b]);
    let lease = t.try_lease(0, None).expect("eligible");
    assert!(t.pick_spill(100).is_empty());
    let mut freed = Vec::new();
    let _ = t.finish_amend(&[b], &[KeySet(0)], &mut freed);
    assert_eq!(t.pick_spill(100), vec![b]);
    let _ = t.finish_lease(lease, crate::state::LeaseEnd::Used, &[], &mut freed);
    assert_eq!(freed, vec![a]);
    assert_eq!(
        t.residency.resident, 30,
        "a freed slot gives its bytes back"
    );
    t.check_invariants().expect("invariants");
}

#[test]
fn excess_leaves_room_for_the_waiting_putter() {
    let mut t = table(true);
    put(&mut t, 1, 90);
    assert_eq!(t.residency.excess(), 90 - 88);
    t.residency.wanted = 50;
    assert!(t.residency.over());
    assert_eq!(t.residency.excess(), 40);
}
