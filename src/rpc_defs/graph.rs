//! Validation of a list of [`RpcDef`]s and the interned dataflow graph built from it.
//!
//! Keys that some RPC reads or writes, and the declared external keys, are interned into ids
//! `0..MAX_KEYS`, so a sample's set of present keys is one `u64` ([`KeySet`]) and "is this
//! sample ready for RPC r" is one `&` and compare. Keys no RPC reads or writes are payload
//! only: they never affect readiness and get no id.

use super::{RateLimit, RpcDef, Selection};
use crate::error::{Error, Result};
use crate::sync::Arc;
use std::time::Duration;

/// Most distinct graph keys (RPC inputs, outputs and external keys) in one buffer.
pub(crate) const MAX_KEYS: usize = 64;
/// Most RPCs in one buffer (a slot's lease bits are one `u64`).
pub(crate) const MAX_RPCS: usize = 64;

/// The indexes of the bits set in `bits`, lowest first: one step per set bit, never 64.
fn set_bits(mut bits: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if bits == 0 {
            return None;
        }
        let i = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        Some(i)
    })
}

/// A set of interned key ids, one bit per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub(crate) struct KeySet(pub(crate) u64);

impl KeySet {
    pub(crate) const EMPTY: KeySet = KeySet(0);

    pub(crate) fn with(self, id: usize) -> KeySet {
        KeySet(self.0 | (1u64 << id))
    }

    pub(crate) fn union(self, other: KeySet) -> KeySet {
        KeySet(self.0 | other.0)
    }

    pub(crate) fn contains_all(self, other: KeySet) -> bool {
        self.0 & other.0 == other.0
    }

    pub(crate) fn contains(self, id: usize) -> bool {
        id < MAX_KEYS && self.0 & (1u64 << id) != 0
    }

    pub(crate) fn ids(self) -> impl Iterator<Item = usize> {
        set_bits(self.0)
    }
}

/// A set of RPC indexes, one bit per RPC: bit `r` stands for the `r`-th RPC of the graph.
/// Slots keep which RPCs lease them, which ready indexes hold them and for which RPCs they
/// are stale in these; a transition reports the RPCs to wake in one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[repr(transparent)]
pub(crate) struct RpcSet(u64);

impl RpcSet {
    pub(crate) const EMPTY: RpcSet = RpcSet(0);

    /// The set holding RPC `r` alone (`r < MAX_RPCS`).
    pub(crate) const fn one(r: usize) -> RpcSet {
        RpcSet(1u64 << r)
    }

    pub(crate) fn contains(self, r: usize) -> bool {
        r < MAX_RPCS && self.0 & (1u64 << r) != 0
    }

    pub(crate) fn insert(&mut self, r: usize) {
        self.0 |= 1u64 << r;
    }

    pub(crate) fn remove(&mut self, r: usize) {
        self.0 &= !(1u64 << r);
    }

    pub(crate) fn union(self, other: RpcSet) -> RpcSet {
        RpcSet(self.0 | other.0)
    }

    /// The RPCs in `self` and not in `other`.
    pub(crate) fn difference(self, other: RpcSet) -> RpcSet {
        RpcSet(self.0 & !other.0)
    }

    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set as its bit word (bit `r` for RPC `r`), for tests that model it as one.
    #[cfg(test)]
    pub(crate) fn bits(self) -> u64 {
        self.0
    }

    /// The RPC indexes in the set, in increasing order.
    pub(crate) fn iter(self) -> impl Iterator<Item = usize> {
        set_bits(self.0)
    }
}

impl FromIterator<usize> for RpcSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut set = RpcSet::EMPTY;
        for r in iter {
            set.insert(r);
        }
        set
    }
}

/// One RPC after validation, with its keys interned.
#[derive(Debug, Clone)]
pub(crate) struct RpcInfo {
    pub(crate) name: Arc<str>,
    pub(crate) n_seqs: usize,
    pub(crate) inputs: KeySet,
    pub(crate) outputs: KeySet,
    /// Outputs some RPC reads: a completion must leave the sample holding them, or the
    /// readers downstream would wait for it forever.
    pub(crate) needed_outputs: KeySet,
    pub(crate) reads: u16,
    pub(crate) selection: Selection,
    pub(crate) lease_timeout: Option<Duration>,
    pub(crate) max_staleness: Option<u64>,
    pub(crate) max_age: Option<Duration>,
    pub(crate) rate_limit: Option<RateLimit>,
}

/// The validated RPC list and the key interning table.
#[derive(Debug, Clone)]
pub(crate) struct RpcGraph {
    rpcs: Vec<RpcInfo>,
    /// Interned key names; the index is the key id.
    keys: Vec<Arc<str>>,
    /// Keys some RPC reads that no RPC outputs and that are not external: every put must
    /// carry them.
    dataset_keys: KeySet,
}

impl RpcGraph {
    /// Validates `defs` for a buffer of `capacity` slots.
    pub(crate) fn new(capacity: usize, defs: &[RpcDef], external: &[String]) -> Result<Self> {
        if defs.is_empty() {
            return Err(Error::NoRpcs);
        }
        if defs.len() > MAX_RPCS {
            return Err(Error::TooMany {
                what: "RPCs",
                count: defs.len(),
                max: MAX_RPCS,
            });
        }
        let mut keys: Vec<Arc<str>> = Vec::new();
        let mut intern = |name: &str| -> usize {
            if let Some(i) = keys.iter().position(|k| &**k == name) {
                return i;
            }
            keys.push(name.into());
            keys.len() - 1
        };
        let mut rpcs: Vec<RpcInfo> = Vec::with_capacity(defs.len());
        // producer[key id] = index of the RPC that outputs it
        let mut producer: Vec<Option<usize>> = Vec::new();
        let mut external_set = KeySet::EMPTY;
        let mut interned: Vec<(usize, Vec<usize>, Vec<usize>)> = Vec::new();
        for (i, def) in defs.iter().enumerate() {
            if defs[..i].iter().any(|d| d.name == def.name) {
                return Err(Error::DuplicateRpc {
                    name: def.name.clone(),
                });
            }
            if def.n_seqs == 0 || def.n_seqs > capacity {
                return Err(Error::InvalidNSeqs {
                    rpc: def.name.clone(),
                    n_seqs: def.n_seqs,
                    capacity,
                });
            }
            if def.reads == 0 || def.reads > u32::from(u16::MAX) {
                return Err(Error::InvalidReads {
                    rpc: def.name.clone(),
                    reads: def.reads,
                    max: u32::from(u16::MAX),
                });
            }
            if let Some(detail) = selection_problem(&def.selection) {
                return Err(Error::InvalidSelection {
                    rpc: def.name.clone(),
                    detail,
                });
            }
            if let Some(detail) = def.rate_limit.and_then(|l| rate_problem(&l, def.n_seqs)) {
                return Err(Error::InvalidRateLimit {
                    rpc: def.name.clone(),
                    detail,
                });
            }
            let ins: Vec<usize> = def.inputs.iter().map(|k| intern(k)).collect();
            let outs: Vec<usize> = def.outputs.iter().map(|k| intern(k)).collect();
            interned.push((i, ins, outs));
        }
        let external_ids: Vec<usize> = external.iter().map(|k| intern(k)).collect();
        if keys.len() > MAX_KEYS {
            return Err(Error::TooMany {
                what: "keys",
                count: keys.len(),
                max: MAX_KEYS,
            });
        }
        for id in external_ids {
            external_set = external_set.with(id);
        }
        producer.resize(keys.len(), None);
        for (i, _, outs) in &interned {
            for &k in outs {
                if let Some(first) = producer[k] {
                    return Err(Error::DuplicateProducer {
                        key: keys[k].to_string(),
                        first: defs[first].name.clone(),
                        second: defs[*i].name.clone(),
                    });
                }
                if external_set.contains(k) {
                    return Err(Error::ExternalKeyProduced {
                        key: keys[k].to_string(),
                        rpc: defs[*i].name.clone(),
                    });
                }
                producer[k] = Some(*i);
            }
        }
        let mut dataset_keys = KeySet::EMPTY;
        for (i, ins, outs) in interned {
            let def = &defs[i];
            let inputs = ins.iter().fold(KeySet::EMPTY, |s, &k| s.with(k));
            for &k in &ins {
                if producer[k].is_none() && !external_set.contains(k) {
                    dataset_keys = dataset_keys.with(k);
                }
            }
            rpcs.push(RpcInfo {
                name: def.name.as_str().into(),
                n_seqs: def.n_seqs,
                inputs,
                outputs: outs.iter().fold(KeySet::EMPTY, |s, &k| s.with(k)),
                needed_outputs: KeySet::EMPTY,
                reads: u16::try_from(def.reads).unwrap_or(u16::MAX),
                selection: def.selection.clone(),
                max_staleness: def.max_staleness,
                max_age: def.max_age,
                rate_limit: def.rate_limit,
                lease_timeout: def.lease_timeout,
            });
        }
        let read = rpcs.iter().fold(KeySet::EMPTY, |s, r| s.union(r.inputs));
        for r in &mut rpcs {
            r.needed_outputs = KeySet(r.outputs.0 & read.0);
        }
        let graph = Self {
            rpcs,
            keys,
            dataset_keys,
        };
        graph.check_acyclic(&producer)?;
        Ok(graph)
    }

    /// Depth-first search over "RPC a outputs a key RPC b reads" edges; a back edge is a
    /// cycle, reported with the RPC it returns to and the key of that edge.
    fn check_acyclic(&self, producer: &[Option<usize>]) -> Result<()> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            OnPath,
            Done,
        }
        let n = self.rpcs.len();
        let mut mark = vec![Mark::New; n];
        // Iterative DFS over consumers: from RPC `a`, every RPC reading a key `a` outputs.
        for start in 0..n {
            if mark[start] != Mark::New {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            mark[start] = Mark::OnPath;
            while let Some(&mut (a, ref mut next)) = stack.last_mut() {
                if *next >= n {
                    mark[a] = Mark::Done;
                    stack.pop();
                    continue;
                }
                let b = *next;
                *next += 1;
                let shared = KeySet(self.rpcs[a].outputs.0 & self.rpcs[b].inputs.0);
                if shared == KeySet::EMPTY {
                    continue;
                }
                match mark[b] {
                    Mark::OnPath => {
                        let key = shared.ids().next().unwrap_or(0);
                        debug_assert_eq!(producer.get(key).copied().flatten(), Some(a));
                        return Err(Error::CyclicGraph {
                            rpc: self.rpcs[b].name.to_string(),
                            key: self.keys[key].to_string(),
                        });
                    }
                    Mark::New => {
                        mark[b] = Mark::OnPath;
                        stack.push((b, 0));
                    }
                    Mark::Done => {}
                }
            }
        }
        Ok(())
    }

    pub(crate) fn rpcs(&self) -> &[RpcInfo] {
        &self.rpcs
    }

    pub(crate) fn rpc_index(&self, name: &str) -> Option<usize> {
        self.rpcs.iter().position(|r| &*r.name == name)
    }

    /// The id of an interned key.
    pub(crate) fn key_id(&self, name: &str) -> Option<usize> {
        self.keys.iter().position(|k| &**k == name)
    }

    /// Every key the graph names (RPC inputs and outputs, external keys), in id order.
    pub(crate) fn key_names(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| &**k)
    }

    pub(crate) fn key_name(&self, id: usize) -> &str {
        self.keys.get(id).map_or("?", |k| k)
    }

    pub(crate) fn dataset_keys(&self) -> KeySet {
        self.dataset_keys
    }

    /// The graph keys among `names` (names that are not graph keys are ignored).
    pub(crate) fn key_set<'a>(&self, names: impl Iterator<Item = &'a str>) -> KeySet {
        names.fold(KeySet::EMPTY, |s, n| match self.key_id(n) {
            Some(id) => s.with(id),
            None => s,
        })
    }
}

/// What is wrong with a rate limit for batches of `n_seqs`, if anything.
fn rate_problem(limit: &RateLimit, n_seqs: usize) -> Option<String> {
    let RateLimit {
        samples_per_insert: spi,
        error_buffer: eb,
        ..
    } = *limit;
    if !(spi.is_finite() && spi > 0.0) {
        return Some(format!("samples_per_insert {spi} is not a positive number"));
    }
    if !(eb.is_finite() && eb >= 0.0) {
        return Some(format!("error_buffer {eb} is not a number >= 0"));
    }
    // Below this a putter and a getter can each wait for the other.
    let least = (n_seqs as f64 + spi) / 2.0;
    if eb < least {
        return Some(format!(
            "error_buffer {eb} is below (n_seqs + samples_per_insert) / 2 = {least}: \
             a getter and a putter could wait on each other"
        ));
    }
    None
}

/// What is wrong with a selection's parameters, if anything.
fn selection_problem(selection: &Selection) -> Option<String> {
    match selection {
        Selection::Recency { alpha, .. } if !alpha.is_finite() || *alpha < 0.0 => {
            Some(format!("Recency alpha {alpha} is not a finite number >= 0"))
        }
        Selection::Prioritized { exponent, .. } if !exponent.is_finite() || *exponent < 0.0 => {
            Some(format!(
                "Prioritized exponent {exponent} is not a finite number >= 0"
            ))
        }
        Selection::OnPolicyFraction { fraction, then } => {
            if !(0.0..=1.0).contains(fraction) {
                Some(format!(
                    "OnPolicyFraction fraction {fraction} is not in [0, 1]"
                ))
            } else if matches!(**then, Selection::OnPolicyFraction { .. }) {
                Some("OnPolicyFraction cannot nest another OnPolicyFraction".to_owned())
            } else {
                selection_problem(then)
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_sets_hold_exactly_their_members() {
        let a: RpcSet = [0, 5, 63].into_iter().collect();
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 5, 63]);
        assert!(a.contains(63) && !a.contains(1) && !a.contains(64));
        let b = RpcSet::one(5).union(RpcSet::one(7));
        assert_eq!(a.difference(b).iter().collect::<Vec<_>>(), vec![0, 63]);
        let mut c = a;
        c.remove(0);
        c.insert(2);
        assert_eq!(c.iter().collect::<Vec<_>>(), vec![2, 5, 63]);
        assert!(RpcSet::EMPTY.is_empty() && RpcSet::EMPTY.iter().next().is_none());
        assert_eq!(KeySet(0b1010).ids().collect::<Vec<_>>(), vec![1, 3]);
    }

    fn ppo() -> Vec<RpcDef> {
        vec![
            RpcDef::new("gen", 2).inputs(["prompt"]).outputs(["tokens"]),
            RpcDef::new("reward", 2)
                .inputs(["tokens"])
                .outputs(["reward"]),
            RpcDef::new("train", 2).inputs(["tokens", "reward", "score"]),
        ]
    }

    #[test]
    fn dataset_keys_are_inputs_nobody_produces() {
        let g = RpcGraph::new(8, &ppo(), &["score".to_string()]);
        let g = g.unwrap_or_else(|e| panic!("{e}"));
        let prompt = g.key_id("prompt").unwrap_or(99);
        assert_eq!(g.dataset_keys(), KeySet::EMPTY.with(prompt));
        assert_eq!(g.key_set(["tokens", "nope"].into_iter()).0.count_ones(), 1);
    }

    #[test]
    fn rejects_bad_graphs() {
        let cap = 8;
        let dup = vec![RpcDef::new("a", 1), RpcDef::new("a", 1)];
        assert!(matches!(
            RpcGraph::new(cap, &dup, &[]),
            Err(Error::DuplicateRpc { .. })
        ));
        let zero = vec![RpcDef::new("a", 0)];
        assert!(matches!(
            RpcGraph::new(cap, &zero, &[]),
            Err(Error::InvalidNSeqs { .. })
        ));
        let big = vec![RpcDef::new("a", 9)];
        assert!(matches!(
            RpcGraph::new(cap, &big, &[]),
            Err(Error::InvalidNSeqs { .. })
        ));
        let self_loop = vec![RpcDef::new("a", 1).inputs(["x"]).outputs(["x"])];
        assert_eq!(
            RpcGraph::new(cap, &self_loop, &[]).err(),
            Some(Error::CyclicGraph {
                rpc: "a".into(),
                key: "x".into()
            })
        );
        let cycle = vec![
            RpcDef::new("a", 1).inputs(["z"]).outputs(["x"]),
            RpcDef::new("b", 1).inputs(["x"]).outputs(["y"]),
            RpcDef::new("c", 1).inputs(["y"]).outputs(["z"]),
        ];
        assert!(matches!(
            RpcGraph::new(cap, &cycle, &[]),
            Err(Error::CyclicGraph { .. })
        ));
        let two = vec![
            RpcDef::new("a", 1).outputs(["x"]),
            RpcDef::new("b", 1).outputs(["x"]),
        ];
        assert!(matches!(
            RpcGraph::new(cap, &two, &[]),
            Err(Error::DuplicateProducer { .. })
        ));
        let ext = vec![RpcDef::new("a", 1).outputs(["x"])];
        assert!(matches!(
            RpcGraph::new(cap, &ext, &["x".into()]),
            Err(Error::ExternalKeyProduced { .. })
        ));
        let reads = vec![RpcDef::new("a", 1).reads(0)];
        assert!(matches!(
            RpcGraph::new(cap, &reads, &[]),
            Err(Error::InvalidReads { .. })
        ));
        assert_eq!(RpcGraph::new(cap, &[], &[]).err(), Some(Error::NoRpcs));
        let many: Vec<_> = (0..65).map(|i| RpcDef::new(format!("r{i}"), 1)).collect();
        assert!(matches!(
            RpcGraph::new(cap, &many, &[]),
            Err(Error::TooMany { .. })
        ));
        let keys: Vec<String> = (0..65).map(|i| format!("k{i}")).collect();
        let wide = vec![RpcDef::new("a", 1).inputs(keys)];
        assert!(matches!(
            RpcGraph::new(cap, &wide, &[]),
            Err(Error::TooMany { .. })
        ));
    }

    #[test]
    fn diamond_is_not_a_cycle() {
        let d = vec![
            RpcDef::new("gen", 1).inputs(["p"]).outputs(["x"]),
            RpcDef::new("ref", 1).inputs(["x"]).outputs(["r"]),
            RpcDef::new("rew", 1).inputs(["x"]).outputs(["w"]),
            RpcDef::new("train", 1).inputs(["x", "r", "w"]),
        ];
        assert!(RpcGraph::new(4, &d, &[]).is_ok());
    }
}
