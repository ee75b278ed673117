//! The audit itself: every invariant `check_invariants` checks, broken on purpose in an
//! otherwise valid table, is reported by name. Without these, an audit that checked less
//! (or nothing) would pass every other test.

use super::{ks, ok, put, spec, K0};
use crate::rpc_defs::Selection;
use crate::state::leases::Lease;
use crate::state::ready::order_key;
use crate::state::{Freshness, SlotTable, NO_VERSION};
use std::time::{Duration, Instant};

/// Capacity 6, one RPC (2 reads, batches of 2, a lease timeout): slots 0-3 stored, 0 and 1
/// leased, 4 and 5 empty; a byte budget, with eviction when `evict`; `Prioritized`
/// selection when `weighted`.
fn fixture(evict: bool, weighted: bool) -> SlotTable {
    let mut rpc = spec(&[K0], 2, 2, false);
    rpc.lease_timeout = Some(Duration::from_secs(60));
    if weighted {
        rpc.selection = Selection::Prioritized {
            key: "p".into(),
            exponent: 1.0,
            seed: 1,
        };
    }
    let mut t = SlotTable::new(6, vec![rpc]).with_budget(Some(1_000), evict);
    put(&mut t, &[1, 2, 3, 4], ks(&[K0]));
    for s in 0..4 {
        t.set_ln_priority(s, 0, s as f64);
    }
    if weighted {
        // Weighted draws take any two; the checks below want 0 and 1 leased.
        assert!(t
            .try_lease_slots(0, &[0, 1], Some(Instant::now()))
            .is_some());
    } else {
        assert!(t.try_lease(0, Some(Instant::now())).is_some());
    }
    ok(&t);
    t
}

/// Breaks one invariant of a valid table.
type Break = fn(&mut SlotTable);

/// Breaks each case's invariant in a fresh table from `fixture` and checks the audit names
/// it.
fn expect_each(fixture: impl Fn() -> SlotTable, cases: &[(&str, Break)]) {
    for &(what, break_it) in cases {
        let mut t = fixture();
        break_it(&mut t);
        expect(&t, what);
    }
}

fn expect(t: &SlotTable, what: &str) {
    match t.check_invariants() {
        Ok(()) => panic!("the audit missed: {what}"),
        Err(e) => assert!(e.contains(what), "expected {what:?}, the audit said {e:?}"),
    }
}

#[test]
fn every_broken_invariant_is_reported() {
    let cases: &[(&str, bool, Break)] = &[
        // An empty slot (5) that carries state.
        ("both empty and putting", false, |t| t.putting.set(5)),
        ("empty/putting but amending/reading/idle", false, |t| {
            t.reading.set(5)
        }),
        ("marked discarded", false, |t| t.discarded.set(5)),
        ("amenders on a slot not stored", false, |t| {
            t.slots[5].amenders = 1
        }),
        ("lease bits on a slot not stored", false, |t| {
            t.slots[5].lease_bits.insert(0)
        }),
        ("ready entries on a slot not stored", false, |t| {
            t.slots[5].in_ready.insert(0)
        }),
        ("reads on a slot not stored", false, |t| {
            t.slots[5].reads_total = 1
        }),
        ("keys on a slot not stored", false, |t| {
            t.slots[5].keys = ks(&[K0])
        }),
        // A stored, unheld, eligible slot (2) whose state disagrees with itself.
        ("amending bit != (amenders > 0)", false, |t| {
            t.amending.set(2)
        }),
        ("reading bit != (lease bits != 0)", false, |t| {
            t.reading.set(2)
        }),
        ("idle bit wrong", false, |t| t.idle.clear(2)),
        ("reads_total 3 != sum 2", false, |t| {
            t.slots[2].reads_total = 3
        }),
        ("all reads used and nothing holds it", false, |t| {
            t.reads_left[2] = 0;
            t.slots[2].reads_total = 0;
        }),
        ("discarded and nothing holds it", false, |t| {
            t.discarded.set(2)
        }),
        ("stale for an RPC that owes it reads", false, |t| {
            t.slots[2].stale.insert(0)
        }),
        ("has 3 reads left, more than its 2", false, |t| {
            t.reads_left[2] = 3;
            t.slots[2].reads_total = 3;
        }),
        ("leased by rpc 0 with no reads left", false, |t| {
            t.reads_left[0] = 0;
            t.slots[0].reads_total = 0;
        }),
        ("in the eviction index false, evictable true", true, |t| {
            let key = t.slots[2].order;
            t.budget.evictable.remove(&key);
        }),
        ("eligible true but in_ready false", false, |t| {
            t.slots[2].in_ready.remove(0)
        }),
        ("eligible true but indexed false", false, |t| {
            let key = t.slots[2].order;
            t.ready[0].remove(key);
        }),
        ("ready index has 3 entries, 2 slots flagged", false, |t| {
            t.ready[0].insert(order_key(99, 99), 5, 0.0)
        }),
        // Free list, leases, putters and bytes.
        ("free list has 3 slots, 2 empty", false, |t| t.free.push(5)),
        ("free list holds slot 2, which is not empty", false, |t| {
            t.free[0] = 2
        }),
        ("twice", false, |t| t.free[0] = t.free[1]),
        ("names slot 99 out of range", false, |t| {
            t.leases.insert(Lease {
                rpc: 0,
                slots: vec![99],
                deadline: None,
            });
        }),
        ("slot 0: two live leases of rpc 0", false, |t| {
            t.leases.insert(Lease {
                rpc: 0,
                slots: vec![0],
                deadline: None,
            });
        }),
        ("lacks its deadline entry", false, |t| {
            let far = Instant::now() + Duration::from_secs(3600);
            assert!(t.leases.pop_due(far).is_some());
        }),
        ("slot 2: lease bits", false, |t| {
            // Leased by no live lease, everything else consistent with the lease bit.
            t.slots[2].lease_bits.insert(0);
            t.reading.set(2);
            t.idle.clear(2);
            t.slots[2].in_ready.remove(0);
            let key = t.slots[2].order;
            t.ready[0].remove(key);
        }),
        ("per-RPC leased counts drifted", false, |t| t.leased[0] += 1),
        ("bytes used 1 != sum over slots 0", false, |t| {
            t.budget.used += 1
        }),
        ("slot 5: empty but holds 7 bytes", false, |t| {
            t.budget.per_slot[5] = 7;
            t.budget.used += 7;
        }),
    ];
    for &(what, evict, break_it) in cases {
        let mut t = fixture(evict, false);
        break_it(&mut t);
        expect(&t, what);
    }
}

#[test]
fn a_wrong_weight_in_the_index_is_reported() {
    let mut t = fixture(false, true);
    let key = t.slots[2].order;
    t.ready[0].set_weight(key, 123.0);
    expect(
        &t,
        "slot 2: rpc 0 indexed with weight 123, its priority gives",
    );
}

/// Capacity 6, one RPC, a memory budget: slots 0-2 stored with 10 bytes each in memory,
/// slot 0 leased (so not spillable), 3-5 empty.
fn resident_fixture() -> SlotTable {
    let mut t =
        SlotTable::new(6, vec![spec(&[K0], 1, 1, false)]).with_residency(Some(1_000), false);
    for birth in 1..=3 {
        let Some((slots, _)) = t.claim_put_sized(1, 0, 10, None) else {
            panic!("room for a sample");
        };
        t.reserve_resident(&slots, &[10]);
        let _ = t.publish_put(&slots, &[birth], &[ks(&[K0])]);
    }
    assert!(t.try_lease(0, None).is_some());
    ok(&t);
    t
}

#[test]
fn every_broken_residency_invariant_is_reported() {
    let cases: &[(&str, Break)] = &[
        ("resident bytes 31 != per-slot sum 30", |t| {
            t.residency.resident += 1
        }),
        ("slot 5: empty but resident or spilling", |t| {
            t.residency.per_slot[5] = 7;
            t.residency.resident += 7;
        }),
        ("slot 4: empty but resident or spilling", |t| {
            t.residency.spilling.set(4)
        }),
        ("slot 1: in the spill index false, spillable true", |t| {
            let key = t.slots[1].order;
            t.residency.spillable.remove(&key);
        }),
        ("slot 0: in the spill index true, spillable false", |t| {
            let key = t.slots[0].order;
            t.residency.spillable.insert(key, 0);
        }),
        ("slot 2: in the spill index true, spillable false", |t| {
            // Being written out, so out of the index, though still listed there.
            t.residency.spilling.set(2)
        }),
        ("spill index has 3 entries, 2 belong to slots", |t| {
            t.residency.spillable.insert(order_key(99, 99), 5);
        }),
    ];
    expect_each(resident_fixture, cases);
}

/// Capacity 6, one RPC with a staleness bound: slots 0 and 1 stored with versions 1 and 2,
/// slot 2 stored without one.
fn versioned_fixture() -> SlotTable {
    let mut rpc = spec(&[K0], 1, 1, false);
    rpc.max_staleness = Some(10);
    let mut t = SlotTable::new(6, vec![rpc]);
    let Some((slots, _)) = t.claim_put(3, None) else {
        panic!("room for three samples");
    };
    let fresh: Vec<Freshness> = [1, 2, NO_VERSION]
        .map(|version| Freshness { version, age: None })
        .to_vec();
    let mut freed = Vec::new();
    let _ = t.publish_put_fresh(
        &slots,
        &[1, 2, 3],
        &[ks(&[K0]); 3],
        &fresh,
        None,
        &mut freed,
    );
    ok(&t);
    t
}

#[test]
fn every_broken_version_invariant_is_reported() {
    let cases: &[(&str, Break)] = &[
        ("slot 4: not stored but has version 3", |t| {
            t.freshness.versions[4] = 3
        }),
        ("slot 1: version 2 missing from the version index", |t| {
            t.freshness.by_version.remove(&(2, 1));
        }),
        (
            "3 entries in the version index, for 2 versioned stored slots",
            |t| {
                t.freshness.by_version.insert((7, 5));
            },
        ),
    ];
    expect_each(versioned_fixture, cases);
    // Without a staleness bound nothing is indexed by version.
    let mut t = fixture(false, false);
    t.freshness.by_version.insert((1, 0));
    expect(
        &t,
        "1 entries in the version index, for 0 versioned stored slots",
    );
}
