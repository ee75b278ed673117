//! Tests of the state machine: unit tests of single transitions, and proptest runs of random
//! operation sequences checked step by step against a plain reference model.

mod audit;
mod fresh;
mod residency;

use super::{Freshness, LeaseEnd, LeaseId, RpcSpec, SlotTable};
use crate::rpc_defs::{KeySet, Selection};
use proptest::prelude::*;
use std::time::{Duration, Instant};

const K0: usize = 0; // dataset key
const K1: usize = 1; // output of rpc 0
const K2: usize = 2; // output of rpc 1
const K3: usize = 3; // external key, amended in

fn ks(ids: &[usize]) -> KeySet {
    ids.iter().fold(KeySet::EMPTY, |s, &k| s.with(k))
}

fn spec(inputs: &[usize], reads: u16, n_seqs: usize, lifo: bool) -> RpcSpec {
    RpcSpec {
        inputs: ks(inputs),
        reads,
        n_seqs,
        selection: if lifo {
            Selection::Lifo
        } else {
            Selection::Fifo
        },
        lease_timeout: None,
        max_staleness: None,
        max_age: None,
        rate_limit: None,
    }
}

fn put(t: &mut SlotTable, births: &[u64], keys: KeySet) -> Vec<u32> {
    let Some((slots, _)) = t.claim_put(births.len(), None) else {
        panic!("no room for {} samples", births.len());
    };
    let keys = vec![keys; births.len()];
    let _ = t.publish_put(&slots, births, &keys);
    slots
}

fn ok(t: &SlotTable) {
    if let Err(e) = t.check_invariants() {
        panic!("invariant: {e}");
    }
}

#[test]
fn fresh_table_fills_lowest_slots_and_fifo_by_birth() {
    let mut t = SlotTable::new(4, vec![spec(&[K0], 1, 2, false)]);
    assert_eq!(put(&mut t, &[30, 20, 10], ks(&[K0])), vec![0, 1, 2]);
    assert!(t.claim_put(2, None).is_none(), "only one slot left");
    let Some(id) = t.try_lease(0, None) else {
        panic!("two samples are eligible");
    };
    assert_eq!(t.lease(id, None).map(|l| l.slots.clone()), Ok(vec![2, 1]));
    ok(&t);
}

#[test]
fn last_read_frees_and_bumps_generation() {
    let mut t = SlotTable::new(2, vec![spec(&[K0], 1, 1, false), spec(&[K0], 2, 1, false)]);
    let s = put(&mut t, &[1], ks(&[K0]))[0] as usize;
    let g = t.slots[s].generation;
    let mut freed = Vec::new();
    for (rpc, uses) in [(0, 1), (1, 2)] {
        for _ in 0..uses {
            assert!(freed.is_empty(), "freed before every read was used");
            let Some(id) = t.try_lease(rpc, None) else {
                panic!("rpc {rpc} should be served");
            };
            let _ = t.finish_lease(id, LeaseEnd::Used, &[], &mut freed);
            ok(&t);
        }
    }
    assert_eq!(freed, vec![s as u32]);
    assert_eq!(t.slots[s].generation, g.advance());
    assert_eq!(t.stored_generation(s), None);
}

#[test]
fn amend_hides_slot_and_defers_free() {
    let mut t = SlotTable::new(2, vec![spec(&[K0], 1, 1, false)]);
    let s = put(&mut t, &[1], ks(&[K0]));
    let Some(id) = t.try_lease(0, None) else {
        panic!("eligible");
    };
    t.begin_amend(&s);
    let mut freed = Vec::new();
    let _ = t.finish_lease(id, LeaseEnd::Used, &[], &mut freed);
    assert!(freed.is_empty(), "an amend in flight holds the slot");
    ok(&t);
    let _ = t.finish_amend(&s, &[ks(&[K3])], &mut freed);
    assert_eq!(freed, s);
    ok(&t);
}

#[test]
fn outputs_make_downstream_ready_in_the_same_step() {
    let mut t = SlotTable::new(2, vec![spec(&[K0], 1, 1, false), spec(&[K1], 1, 1, false)]);
    put(&mut t, &[1], ks(&[K0]));
    assert_eq!(t.eligible(1), 0);
    let Some(id) = t.try_lease(0, None) else {
        panic!("eligible");
    };
    let mut freed = Vec::new();
    t.park_getter(1);
    let wake = t.finish_lease(id, LeaseEnd::Used, &[ks(&[K1])], &mut freed);
    assert_eq!(wake.rpcs.bits(), 0b10);
    assert_eq!(t.eligible(1), 1);
    ok(&t);
}

#[test]
fn blockers_say_why_a_getter_would_wait() {
    let mut t = SlotTable::new(
        4,
        vec![spec(&[K0], 1, 2, false), spec(&[K0, K1, K3], 1, 1, false)],
    );
    put(&mut t, &[1, 2, 3], ks(&[K0]));
    let Some(id) = t.try_lease(0, None) else {
        panic!("eligible");
    };
    let b = t.blockers(0, 4);
    assert_eq!((b.leased, b.eligible, b.incomplete), (2, 1, 0));
    let b = t.blockers(1, 4);
    assert_eq!((b.incomplete, b.missing), (3, vec![0, 3, 0, 3]));
    let mut freed = Vec::new();
    let _ = t.finish_lease(id, LeaseEnd::Used, &[ks(&[K1]), ks(&[K1])], &mut freed);
    let b = t.blockers(0, 4);
    assert_eq!((b.leased, b.used_up, b.eligible), (0, 2, 1));
    let b = t.blockers(1, 4);
    assert_eq!((b.incomplete, b.missing), (3, vec![0, 1, 0, 3]));
    ok(&t);
}

#[test]
fn wakes_are_reported_only_for_parked_waiters() {
    let mut t = SlotTable::new(4, vec![spec(&[K0], 1, 1, false), spec(&[K0], 1, 1, false)]);
    let Some((slots, _)) = t.claim_put(1, None) else {
        panic!("room");
    };
    t.park_getter(1);
    let (_, wake) = t.publish_put(&slots, &[1], &[ks(&[K0])]);
    assert_eq!(wake.rpcs.bits(), 0b10, "rpc 0 has nobody parked");
    t.unpark_getter(1);
    let Some(id) = t.try_lease(0, None) else {
        panic!("eligible");
    };
    let mut freed = Vec::new();
    let wake = t.finish_lease(id, LeaseEnd::Released, &[], &mut freed);
    assert_eq!(wake, super::Wake::default());
    ok(&t);
}

#[test]
fn putter_queue_is_fifo() {
    let mut t = SlotTable::new(2, vec![spec(&[], 1, 1, false)]);
    put(&mut t, &[1, 2], KeySet::EMPTY);
    let a = t.enqueue_putter(2);
    let b = t.enqueue_putter(1);
    let mut freed = Vec::new();
    let Some(id) = t.try_lease(0, None) else {
        panic!("eligible");
    };
    let _ = t.finish_lease(id, LeaseEnd::Used, &[], &mut freed);
    assert!(t.claim_put(1, Some(b)).is_none(), "b is behind a");
    assert!(t.claim_put(1, None).is_none(), "newcomers queue too");
    assert!(t.claim_put(2, Some(a)).is_none(), "a needs two slots");
    let wake = t.dequeue_putter(a);
    assert!(wake.space, "b is now at the head");
    assert!(t.claim_put(1, Some(b)).is_some());
    ok(&t);
}

#[test]
fn expired_lease_is_released_once() {
    let mut rpc = spec(&[], 1, 1, false);
    rpc.lease_timeout = Some(Duration::from_secs(5));
    let mut t = SlotTable::new(1, vec![rpc]);
    put(&mut t, &[1], KeySet::EMPTY);
    let t0 = Instant::now();
    let Some(id) = t.try_lease(0, Some(t0)) else {
        panic!("eligible");
    };
    assert!(t.lease(id, Some(t0 + Duration::from_secs(4))).is_ok());
    assert!(t.lease(id, Some(t0 + Duration::from_secs(5))).is_err());
    let mut freed = Vec::new();
    t.park_getter(0);
    let wake = t.expire_due(t0 + Duration::from_secs(6), &mut freed, &mut Vec::new());
    assert_eq!(wake.rpcs.bits(), 1);
    assert_eq!(
        (t.totals.redelivered[0], t.totals.expired_leases[0]),
        (1, 1)
    );
    assert!(t.lease(id, None).is_err());
    ok(&t);
}

// ----- reference model -------------------------------------------------------------

/// One sample in the model.
#[derive(Debug, Clone)]
struct MSample {
    slot: u32,
    order: (u64, u64),
    keys: KeySet,
    reads_left: Vec<u16>,
    leased: Vec<bool>,
    amenders: u32,
}

#[derive(Debug, Clone)]
struct MLease {
    id: LeaseId,
    rpc: usize,
    /// Indexes into `Model::samples` (stable: freed samples are only marked).
    members: Vec<usize>,
    deadline: Option<Instant>,
}

#[derive(Debug, Default)]
struct Model {
    samples: Vec<Option<MSample>>,
    leases: Vec<MLease>,
    amends: Vec<(usize, KeySet)>,
    seq: u64,
}

impl Model {
    fn live(&self) -> impl Iterator<Item = (usize, &MSample)> {
        self.samples
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
    }

    fn eligible(&self, specs: &[RpcSpec], r: usize) -> Vec<usize> {
        let mut v: Vec<(usize, (u64, u64))> = self
            .live()
            .filter(|(_, s)| {
                s.amenders == 0
                    && s.keys.contains_all(specs[r].inputs)
                    && s.reads_left[r] > 0
                    && !s.leased[r]
            })
            .map(|(i, s)| (i, s.order))
            .collect();
        v.sort_by_key(|&(_, o)| o);
        if specs[r].selection == Selection::Lifo {
            v.reverse();
        }
        v.into_iter().map(|(i, _)| i).collect()
    }

    /// Frees sample `i` if nothing holds it and every read is used; returns its slot.
    fn settle(&mut self, i: usize) -> Option<u32> {
        let s = self.samples[i].as_ref()?;
        let done =
            s.reads_left.iter().all(|&x| x == 0) && s.amenders == 0 && !s.leased.iter().any(|&l| l);
        if done {
            let slot = s.slot;
            self.samples[i] = None;
            Some(slot)
        } else {
            None
        }
    }

    fn finish(&mut self, k: usize, used: bool, added: KeySet) -> Vec<u32> {
        let lease = self.leases.remove(k);
        let mut freed = Vec::new();
        for &i in &lease.members {
            if let Some(s) = self.samples[i].as_mut() {
                s.leased[lease.rpc] = false;
                if used {
                    s.reads_left[lease.rpc] -= 1;
                    s.keys = s.keys.union(added);
                }
            }
            freed.extend(self.settle(i));
        }
        freed
    }
}

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u64>),
    AbortPut(usize),
    Lease(usize),
    Finish { pick: usize, used: bool },
    BeginAmend(usize),
    EndAmend(usize),
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::vec(1u64..6, 1..4).prop_map(Op::Put),
        1 => (1usize..3).prop_map(Op::AbortPut),
        4 => (0usize..3).prop_map(Op::Lease),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(pick, used)| Op::Finish { pick, used }),
        1 => any::<usize>().prop_map(Op::BeginAmend),
        1 => any::<usize>().prop_map(Op::EndAmend),
        1 => (1u64..8).prop_map(Op::Tick),
    ]
}

fn specs() -> impl Strategy<Value = Vec<RpcSpec>> {
    (
        prop::collection::vec((1u16..3, 1usize..3, any::<bool>()), 3),
        any::<bool>(),
    )
        .prop_map(|(v, with_timeout)| {
            let inputs: [&[usize]; 3] = [&[K0], &[K1], &[K1, K2, K3]];
            v.into_iter()
                .zip(inputs)
                .enumerate()
                .map(|(r, ((reads, n, lifo), ins))| {
                    let mut s = spec(ins, reads, n, lifo);
                    if r == 1 && with_timeout {
                        s.lease_timeout = Some(Duration::from_secs(10));
                    }
                    s
                })
                .collect()
        })
}

/// Outputs each RPC writes when a lease is used.
fn outputs(r: usize) -> KeySet {
    match r {
        0 => ks(&[K1]),
        1 => ks(&[K2]),
        _ => KeySet::EMPTY,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn table_matches_reference_model(
        capacity in 1usize..7,
        specs in specs(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let specs: Vec<RpcSpec> = specs
            .into_iter()
            .map(|mut s| { s.n_seqs = s.n_seqs.min(capacity); s })
            .collect();
        let mut t = SlotTable::new(capacity, specs.clone());
        for r in 0..specs.len() {
            t.park_getter(r); // so that transitions report their wake-ups
        }
        let mut m = Model::default();
        let t0 = Instant::now();
        let mut now = t0;
        let mut slot_owner: Vec<Option<usize>> = vec![None; capacity];
        for op in ops {
            match op {
                Op::Put(births) => {
                    let free = m.live().count();
                    let fits = capacity - free >= births.len();
                    let claimed = t.claim_put(births.len(), None);
                    prop_assert_eq!(claimed.is_some(), fits);
                    if let Some((slots, _)) = claimed {
                        let keys = vec![ks(&[K0]); births.len()];
                        let (gens, wake) = t.publish_put(&slots, &births, &keys);
                        prop_assert_eq!(gens.len(), slots.len());
                        let mut woken = 0u64;
                        for (&slot, &birth) in slots.iter().zip(&births) {
                            prop_assert!(slot_owner[slot as usize].is_none(), "slot {} handed out twice", slot);
                            slot_owner[slot as usize] = Some(m.samples.len());
                            m.samples.push(Some(MSample {
                                slot,
                                order: (birth, m.seq),
                                keys: ks(&[K0]),
                                reads_left: specs.iter().map(|s| s.reads).collect(),
                                leased: vec![false; specs.len()],
                                amenders: 0,
                            }));
                            m.seq += 1;
                            for (r, s) in specs.iter().enumerate() {
                                if ks(&[K0]).contains_all(s.inputs) { woken |= 1 << r; }
                            }
                        }
                        prop_assert_eq!(wake.rpcs.bits(), woken);
                    }
                }
                Op::AbortPut(n) => {
                    if let Some((slots, _)) = t.claim_put(n, None) {
                        let wake = t.abort_put(&slots);
                        prop_assert!(!wake.space, "no putter is queued, so nobody to wake");
                    }
                }
                Op::Lease(r) => {
                    let want = m.eligible(&specs, r);
                    let n = specs[r].n_seqs;
                    let got = t.try_lease(r, Some(now));
                    prop_assert_eq!(got.is_some(), want.len() >= n, "rpc {} eligible {:?}", r, want);
                    if let Some(id) = got {
                        let slots = t.lease(id, None).map(|l| l.slots.clone()).unwrap_or_default();
                        let expect: Vec<u32> = want[..n]
                            .iter()
                            .filter_map(|&i| m.samples[i].as_ref().map(|s| s.slot))
                            .collect();
                        prop_assert_eq!(&slots, &expect, "rpc {} selection order", r);
                        for &i in &want[..n] {
                            if let Some(s) = m.samples[i].as_mut() { s.leased[r] = true; }
                        }
                        let deadline = specs[r].lease_timeout.map(|d| now + d);
                        m.leases.push(MLease { id, rpc: r, members: want[..n].to_vec(), deadline });
                    }
                }
                Op::Finish { pick, used } => {
                    if m.leases.is_empty() { continue; }
                    let k = pick % m.leases.len();
                    let lease = m.leases[k].clone();
                    let expired = lease.deadline.is_some_and(|d| now >= d);
                    prop_assert_eq!(t.lease(lease.id, Some(now)).is_err(), expired);
                    if expired { continue; }
                    let added = if used { outputs(lease.rpc) } else { KeySet::EMPTY };
                    let end = if used { LeaseEnd::Used } else { LeaseEnd::Released };
                    let mut freed = Vec::new();
                    let _ = t.finish_lease(lease.id, end, &vec![added; lease.members.len()], &mut freed);
                    let mut expect = m.finish(k, used, added);
                    freed.sort_unstable();
                    expect.sort_unstable();
                    for &s in &freed { slot_owner[s as usize] = None; }
                    prop_assert_eq!(freed, expect);
                }
                Op::BeginAmend(pick) => {
                    let live: Vec<usize> = m.live().map(|(i, _)| i).collect();
                    if live.is_empty() { continue; }
                    let i = live[pick % live.len()];
                    let slot = m.samples[i].as_ref().map_or(0, |s| s.slot);
                    prop_assert!(t.stored_generation(slot as usize).is_some());
                    t.begin_amend(&[slot]);
                    if let Some(s) = m.samples[i].as_mut() { s.amenders += 1; }
                    m.amends.push((i, ks(&[K3])));
                }
                Op::EndAmend(pick) => {
                    if m.amends.is_empty() { continue; }
                    let (i, added) = m.amends.remove(pick % m.amends.len());
                    let slot = m.samples[i].as_ref().map_or(0, |s| s.slot);
                    let mut freed = Vec::new();
                    let _ = t.finish_amend(&[slot], &[added], &mut freed);
                    if let Some(s) = m.samples[i].as_mut() {
                        s.amenders -= 1;
                        s.keys = s.keys.union(added);
                    }
                    let expect: Vec<u32> = m.settle(i).into_iter().collect();
                    for &s in &freed { slot_owner[s as usize] = None; }
                    prop_assert_eq!(freed, expect);
                }
                Op::Tick(secs) => {
                    now += Duration::from_secs(secs);
                    let mut freed = Vec::new();
                    let _ = t.expire_due(now, &mut freed, &mut Vec::new());
                    prop_assert!(freed.is_empty(), "expiry never frees");
                    let due: Vec<usize> = (0..m.leases.len())
                        .filter(|&k| m.leases[k].deadline.is_some_and(|d| d <= now))
                        .collect();
                    for k in due.into_iter().rev() {
                        let _ = m.finish(k, false, KeySet::EMPTY);
                    }
                }
            }
            if let Err(e) = t.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
            for r in 0..specs.len() {
                prop_assert_eq!(t.eligible(r), m.eligible(&specs, r).len(), "rpc {} eligible count", r);
                // The debugging report sorts every stored sample once, and agrees with the
                // ready index on what is eligible.
                let b = t.blockers(r, 4);
                let sorted = b.leased + b.used_up + b.stale + b.discarded + b.amending
                    + b.incomplete + b.eligible;
                prop_assert_eq!(sorted, t.len() - t.putting.count(), "rpc {} sorted", r);
                prop_assert_eq!(b.eligible, t.eligible(r), "rpc {} blockers", r);
                prop_assert!(b.missing.iter().all(|&k| k <= b.incomplete));
            }
            prop_assert_eq!(t.len(), m.live().count());
            prop_assert_eq!(t.leases.live(), m.leases.len());
        }
    }
}

#[test]
fn blockers_count_stale_and_discarded_samples() {
    // Three readers of K0; rpc 0 takes only samples of the current policy version.
    let mut current_only = spec(&[K0], 1, 1, false);
    current_only.max_staleness = Some(0);
    let others = spec(&[K0], 1, 1, false);
    let mut t = SlotTable::new(4, vec![current_only, others.clone(), others]);
    let Some((slots, _)) = t.claim_put(2, None) else {
        panic!("room for two samples");
    };
    let fresh: Vec<Freshness> = [1, 2]
        .map(|version| Freshness { version, age: None })
        .to_vec();
    let mut freed = Vec::new();
    let _ = t.publish_put_fresh(&slots, &[1, 2], &[ks(&[K0]); 2], &fresh, None, &mut freed);
    // Readers 1 and 2 each hold both samples, one batch each.
    let mut held = Vec::new();
    for r in [1, 2, 1, 2] {
        let Some(id) = t.try_lease(r, None) else {
            panic!("rpc {r} has a sample left");
        };
        held.push(id);
    }
    // Version 2 makes the first sample stale for rpc 0; its holders keep it stored.
    assert!(t.set_policy_version(2, &mut freed).is_ok());
    // Rpc 1 discards the second sample, which rpc 2 still holds.
    let _ = t.finish_lease(held[2], LeaseEnd::Discarded, &[KeySet::EMPTY], &mut freed);
    assert!(freed.is_empty(), "both samples are still held");
    let b = t.blockers(0, 4);
    assert_eq!((b.stale, b.discarded, b.leased, b.eligible), (1, 1, 0, 0));
    ok(&t);
}

#[test]
fn only_a_sample_ready_for_every_read_it_owes_is_evictable() {
    // gen reads K0 and adds K1, train reads K1. Of four samples only slot 3's gen has run,
    // so only slot 3 is ready for every read it still owes.
    let mut t = SlotTable::new(4, vec![spec(&[K0], 1, 1, false), spec(&[K1], 1, 1, false)])
        .with_budget(None, true);
    put(&mut t, &[1, 2, 3, 4], ks(&[K0]));
    let Some(id) = t.try_lease_slots(0, &[3], None) else {
        panic!("slot 3 is ready for gen");
    };
    let mut freed = Vec::new();
    let _ = t.finish_lease(id, LeaseEnd::Used, &[ks(&[K1])], &mut freed);
    assert!(freed.is_empty(), "train has yet to read slot 3");
    ok(&t);
    assert!(t.make_room(1, 0, &mut freed), "slot 3 can be evicted");
    assert_eq!(freed, [3]);
    ok(&t);
}

#[test]
fn eviction_frees_enough_bytes_or_evicts_nothing() {
    let mut t = SlotTable::new(4, vec![spec(&[K0], 1, 1, false)]).with_budget(Some(100), true);
    put(&mut t, &[1, 2], ks(&[K0]));
    t.set_bytes(0, 40);
    t.set_bytes(1, 40);
    let mut freed = Vec::new();
    // 200 more bytes fit nowhere: evicting both would leave 100 too many.
    assert!(!t.make_room(1, 200, &mut freed));
    assert!(freed.is_empty(), "evicted in vain: {freed:?}");
    assert_eq!(t.len(), 2);
    // 50 more fit once the oldest goes.
    assert!(t.make_room(1, 50, &mut freed));
    assert_eq!(freed, [0]);
    ok(&t);
}

#[test]
fn a_replayed_batch_is_leased_only_if_each_slot_is_eligible_and_named_once() {
    let mut t = SlotTable::new(4, vec![spec(&[K0], 1, 2, false)]);
    put(&mut t, &[1, 2], ks(&[K0]));
    put(&mut t, &[3], ks(&[K1]));
    assert!(
        t.try_lease_slots(0, &[0, 2], None).is_none(),
        "slot 2 lacks K0"
    );
    assert!(
        t.try_lease_slots(0, &[0, 0], None).is_none(),
        "slot 0 twice"
    );
    assert_eq!(t.eligible(0), 2, "a refused replay changes nothing");
    let Some(id) = t.try_lease_slots(0, &[1, 0], None) else {
        panic!("both are eligible");
    };
    assert_eq!(t.lease(id, None).map(|l| l.slots.clone()), Ok(vec![1, 0]));
    assert_eq!(t.eligible(0), 0);
    ok(&t);
}

#[test]
fn a_merged_wake_keeps_every_waiter_either_side_woke() {
    use crate::rpc_defs::RpcSet;
    let a = super::Wake {
        rpcs: RpcSet::one(0),
        space: true,
        spill: false,
        expired_samples: 2,
    };
    let b = super::Wake {
        rpcs: RpcSet::one(1),
        space: false,
        spill: true,
        expired_samples: 3,
    };
    for (mut into, other) in [(a, b), (b, a)] {
        into.merge(other);
        assert_eq!(
            into,
            super::Wake {
                rpcs: RpcSet::one(0).union(RpcSet::one(1)),
                space: true,
                spill: true,
                expired_samples: 5,
            }
        );
    }
}

#[test]
fn a_lease_ended_sample_by_sample_frees_the_discarded_and_redelivers_the_rest() {
    let mut t = SlotTable::new(4, vec![spec(&[K0], 1, 3, false)]);
    let slots = put(&mut t, &[1, 2, 3], ks(&[K0]));
    let Some(id) = t.try_lease(0, None) else {
        panic!("three samples are ready");
    };
    let mut freed = Vec::new();
    let wake = t.finish_lease_discarding(id, &[false, true, false], &mut freed);
    assert_eq!(freed, [slots[1]], "only the middle sample leaves");
    assert!(
        wake.rpcs.is_empty(),
        "two samples cannot make a batch of three"
    );
    assert_eq!(t.totals.redelivered[0], 2);
    assert_eq!(t.totals.reads[0], 0);
    ok(&t);
    let b = t.blockers(0, 4);
    assert_eq!((b.eligible, b.discarded, b.leased), (2, 0, 0));
}
