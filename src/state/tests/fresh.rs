//! Property test: staleness and randomised selection in the slot table against a plain
//! reference model (policy versions, a staleness bound per RPC, drops of samples that can
//! never be freed, and batches that never repeat or leave the eligible set).

use crate::rpc_defs::{KeySet, Selection};
use crate::state::{Age, Freshness, LeaseEnd, LeaseId, RpcSpec, SlotTable, NO_VERSION};
use proptest::prelude::*;
use std::time::{Duration, Instant};

const K0: usize = 0;
const K1: usize = 1;

fn ks(ids: &[usize]) -> KeySet {
    ids.iter().fold(KeySet::EMPTY, |s, &k| s.with(k))
}

#[derive(Debug, Clone)]
struct MSample {
    slot: u32,
    version: u64,
    keys: KeySet,
    reads_left: Vec<u16>,
    leased: Vec<bool>,
}

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<Option<u64>>),
    Raise(u64),
    Lease(usize),
    Finish { pick: usize, used: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::vec(prop::option::of(0u64..8), 1..4).prop_map(Op::Put),
        1 => (0u64..3).prop_map(Op::Raise),
        3 => (0usize..2).prop_map(Op::Lease),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, used)| Op::Finish { pick, used }),
    ]
}

/// gen (K0 -> K1) and train (K1), each with an optional staleness bound and a selection.
fn specs() -> impl Strategy<Value = Vec<RpcSpec>> {
    prop::collection::vec(
        (
            prop::option::of(0u64..3),
            1u16..3,
            1usize..3,
            prop_oneof![
                Just(Selection::Fifo),
                Just(Selection::Lifo),
                (0u64..4).prop_map(|seed| Selection::Uniform { seed }),
                (0u64..4).prop_map(|seed| Selection::Recency { alpha: 2.0, seed }),
            ],
        ),
        2,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(r, (bound, reads, n_seqs, selection))| RpcSpec {
                inputs: if r == 0 { ks(&[K0]) } else { ks(&[K1]) },
                reads,
                n_seqs,
                selection,
                lease_timeout: None,
                max_staleness: bound,
                max_age: None,
                rate_limit: None,
            })
            .collect()
    })
}

struct Model {
    samples: Vec<Option<MSample>>,
    leases: Vec<(LeaseId, usize, Vec<usize>)>,
    current: Option<u64>,
    stale: u64,
}

impl Model {
    fn is_stale(&self, specs: &[RpcSpec], s: &MSample, r: usize) -> bool {
        match (specs[r].max_staleness, self.current) {
            (Some(bound), Some(current)) => {
                s.version != NO_VERSION && s.version < current.saturating_sub(bound)
            }
            _ => false,
        }
    }

    fn eligible(&self, specs: &[RpcSpec], r: usize) -> Vec<usize> {
        (0..self.samples.len())
            .filter(|&i| {
                self.samples[i].as_ref().is_some_and(|s| {
                    s.keys.contains_all(specs[r].inputs)
                        && s.reads_left[r] > 0
                        && !s.leased[r]
                        && !self.is_stale(specs, s, r)
                })
            })
            .collect()
    }

    /// Drops (stale) or frees (consumed) every sample nothing holds that must leave;
    /// returns the slots.
    fn settle(&mut self, specs: &[RpcSpec]) -> Vec<u32> {
        let mut out = Vec::new();
        for i in 0..self.samples.len() {
            let Some(s) = self.samples[i].as_ref() else {
                continue;
            };
            if s.leased.iter().any(|&l| l) {
                continue;
            }
            let consumed = s.reads_left.iter().all(|&x| x == 0);
            let doomed =
                (0..specs.len()).any(|r| s.reads_left[r] > 0 && self.is_stale(specs, s, r));
            if consumed || doomed {
                if !consumed {
                    self.stale += 1;
                }
                out.push(s.slot);
                self.samples[i] = None;
            }
        }
        out.sort_unstable();
        out
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn staleness_and_selection_match_the_model(
        capacity in 1usize..8,
        specs in specs(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let specs: Vec<RpcSpec> = specs
            .into_iter()
            .map(|mut s| { s.n_seqs = s.n_seqs.min(capacity); s })
            .collect();
        let mut t = SlotTable::new(capacity, specs.clone());
        let mut m = Model { samples: Vec::new(), leases: Vec::new(), current: None, stale: 0 };
        let mut slot_of: Vec<Option<usize>> = vec![None; capacity];
        for op in ops {
            let mut freed = Vec::new();
            match op {
                Op::Put(versions) => {
                    let Some((slots, _)) = t.claim_put(versions.len(), None) else { continue };
                    // Increasing births: the model's order is its insertion order.
                    let births: Vec<u64> = (0..slots.len() as u64).map(|i| m.samples.len() as u64 + i + 1).collect();
                    let keys = vec![ks(&[K0]); slots.len()];
                    let fresh: Vec<Freshness> = versions
                        .iter()
                        .map(|v| Freshness { version: v.unwrap_or(NO_VERSION), age: None })
                        .collect();
                    let _ = t.publish_put_fresh(&slots, &births, &keys, &fresh, None, &mut freed);
                    for (&slot, v) in slots.iter().zip(&versions) {
                        slot_of[slot as usize] = Some(m.samples.len());
                        m.samples.push(Some(MSample {
                            slot,
                            version: v.unwrap_or(NO_VERSION),
                            keys: ks(&[K0]),
                            reads_left: specs.iter().map(|s| s.reads).collect(),
                            leased: vec![false; specs.len()],
                        }));
                    }
                }
                Op::Raise(by) => {
                    let v = m.current.unwrap_or(0) + by;
                    prop_assert!(t.set_policy_version(v, &mut freed).is_ok());
                    m.current = Some(v);
                }
                Op::Lease(r) => {
                    let want = m.eligible(&specs, r);
                    let got = t.try_lease(r, None);
                    prop_assert_eq!(got.is_some(), want.len() >= specs[r].n_seqs);
                    if let Some(id) = got {
                        let slots = t.lease(id, None).map(|l| l.slots.clone()).unwrap_or_default();
                        let mut members = Vec::new();
                        for &slot in &slots {
                            let i = slot_of[slot as usize].unwrap_or(usize::MAX);
                            prop_assert!(want.contains(&i), "slot {} was not eligible", slot);
                            prop_assert!(!members.contains(&i), "slot {} twice in a batch", slot);
                            members.push(i);
                        }
                        prop_assert_eq!(members.len(), specs[r].n_seqs);
                        if specs[r].selection == Selection::Fifo {
                            prop_assert_eq!(&members[..], &want[..specs[r].n_seqs]);
                        }
                        for &i in &members {
                            if let Some(s) = m.samples[i].as_mut() { s.leased[r] = true; }
                        }
                        m.leases.push((id, r, members));
                    }
                }
                Op::Finish { pick, used } => {
                    if m.leases.is_empty() { continue; }
                    let (id, r, members) = m.leases.remove(pick % m.leases.len());
                    let end = if used { LeaseEnd::Used } else { LeaseEnd::Released };
                    let added = if used && r == 0 { ks(&[K1]) } else { KeySet::EMPTY };
                    let _ = t.finish_lease(id, end, &vec![added; members.len()], &mut freed);
                    for &i in &members {
                        if let Some(s) = m.samples[i].as_mut() {
                            s.leased[r] = false;
                            if used {
                                s.reads_left[r] -= 1;
                                s.keys = s.keys.union(added);
                            }
                        }
                    }
                }
            }
            let expect = m.settle(&specs);
            freed.sort_unstable();
            for &s in &freed { slot_of[s as usize] = None; }
            prop_assert_eq!(freed, expect);
            if let Err(e) = t.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
            for r in 0..specs.len() {
                prop_assert_eq!(t.eligible(r), m.eligible(&specs, r).len(), "rpc {} eligible", r);
            }
            prop_assert_eq!(t.totals.stale, m.stale);
        }
    }
}

/// One RPC reading K0 once, with an age bound.
fn aged(capacity: usize, max_age: Duration) -> SlotTable {
    let rpc = RpcSpec {
        inputs: ks(&[K0]),
        reads: 1,
        n_seqs: 1,
        selection: Selection::Fifo,
        lease_timeout: None,
        max_staleness: None,
        max_age: Some(max_age),
        rate_limit: None,
    };
    SlotTable::new(capacity, vec![rpc])
}

/// Puts one sample born `birth`, `age` old at `at`, at instant `now`; returns its slot and
/// the slots the put freed.
fn put_aged(
    t: &mut SlotTable,
    birth: u64,
    age: Duration,
    at: Instant,
    now: Instant,
) -> (u32, Vec<u32>) {
    let Some((slots, _)) = t.claim_put(1, None) else {
        panic!("room for a sample");
    };
    let fresh = [Freshness {
        version: NO_VERSION,
        age: Some(Age { at, age }),
    }];
    let mut freed = Vec::new();
    let _ = t.publish_put_fresh(
        &slots,
        &[birth],
        &[ks(&[K0])],
        &fresh,
        Some(now),
        &mut freed,
    );
    (slots[0], freed)
}

fn ok(t: &SlotTable) {
    if let Err(e) = t.check_invariants() {
        panic!("invariant: {e}");
    }
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn a_sample_ages_out_exactly_at_its_deadline() {
    let start = Instant::now();
    let mut t = aged(2, 10 * SECOND);
    let (s, _) = put_aged(&mut t, 1, 4 * SECOND, start, start);
    let deadline = start + 6 * SECOND;
    let mut freed = Vec::new();
    let _ = t.age_out(deadline - Duration::from_nanos(1), &mut freed);
    assert_eq!(t.eligible(0), 1, "not yet stale");
    let _ = t.age_out(deadline, &mut freed);
    assert_eq!(t.eligible(0), 0, "stale at its deadline");
    assert_eq!(
        freed,
        [s],
        "nothing holds it and it can never be served: dropped"
    );
    ok(&t);
}

#[test]
fn a_sample_put_past_its_deadline_is_stale_at_once() {
    let start = Instant::now();
    let mut t = aged(2, 10 * SECOND);
    // 4 s old at `start`, put 7 s later: its deadline was 1 s ago.
    let (s, freed) = put_aged(&mut t, 1, 4 * SECOND, start, start + 7 * SECOND);
    assert_eq!(freed, [s]);
    assert_eq!(t.eligible(0), 0);
    ok(&t);
}

#[test]
fn an_age_bound_too_far_ahead_to_represent_never_ages() {
    let start = Instant::now();
    let mut t = aged(2, Duration::MAX);
    let (_, freed) = put_aged(&mut t, 1, SECOND, start, start);
    assert!(freed.is_empty());
    assert_eq!(t.eligible(0), 1);
    ok(&t);
}

#[test]
fn the_deadline_of_a_freed_sample_spares_the_next_in_its_slot() {
    let start = Instant::now();
    let mut t = aged(1, 10 * SECOND);
    let (s, _) = put_aged(&mut t, 1, Duration::ZERO, start, start);
    let Some(id) = t.try_lease(0, Some(start)) else {
        panic!("the sample is eligible");
    };
    let mut freed = Vec::new();
    let _ = t.finish_lease(id, LeaseEnd::Used, &[KeySet::EMPTY], &mut freed);
    assert_eq!(freed, [s], "served and freed before its deadline");
    // The next sample in the slot is new at the first one's deadline.
    let later = start + 5 * SECOND;
    assert_eq!(put_aged(&mut t, 2, Duration::ZERO, later, later).0, s);
    let _ = t.age_out(start + 10 * SECOND, &mut freed);
    assert_eq!(
        t.eligible(0),
        1,
        "the first sample's deadline must spare the second"
    );
    ok(&t);
}
