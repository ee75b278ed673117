//! `DurableState`: the buffer's contents as the durable log describes them.
//!
//! Recovery builds one from the newest manifest's segments and replays the log after it;
//! the log writer keeps one up to date as groups become durable, and compaction writes it
//! out as the next segments. It knows nothing of slots or leases: a sample, the reads each
//! RPC (by name) has used, and its put order. Whether a sample still has reads left is
//! decided when it is restored, against the RPC definitions of the buffer being opened.

use crate::buffer::{Record, Restored};
use crate::sample::{Sample, SampleId};
use crate::sync::Arc;
use std::collections::{BTreeMap, HashMap};

/// One stored sample.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Put order (ties between equal births are served in this order).
    pub(crate) seq: u64,
    pub(crate) sample: Arc<Sample>,
    /// Reads used, per RPC name.
    pub(crate) used: BTreeMap<Arc<str>, u16>,
}

/// Running totals per RPC name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RpcTotals {
    pub(crate) reads: u64,
    pub(crate) redelivered: u64,
    pub(crate) expired_leases: u64,
}

/// The contents and totals the log describes.
#[derive(Debug, Clone, Default)]
pub(crate) struct DurableState {
    pub(crate) samples: HashMap<SampleId, Entry>,
    pub(crate) next_seq: u64,
    pub(crate) put: u64,
    pub(crate) freed: u64,
    pub(crate) rpcs: BTreeMap<Arc<str>, RpcTotals>,
    /// Records that named a sample the state does not hold (only after a damaged log was
    /// skipped under lenient recovery).
    pub(crate) unmatched: u64,
}

impl DurableState {
    /// Applies one record, as the buffer applied it.
    pub(crate) fn apply(&mut self, record: &Record) {
        match record {
            Record::Put(samples) => {
                for s in samples {
                    let entry = Entry {
                        seq: self.next_seq,
                        sample: Arc::clone(s),
                        used: BTreeMap::new(),
                    };
                    self.next_seq += 1;
                    self.put += 1;
                    self.samples.insert(s.id.clone(), entry);
                }
            }
            Record::Amend { ids, patches } => {
                for (id, patch) in ids.iter().zip(patches.iter()) {
                    match self.samples.get_mut(id) {
                        Some(e) => Arc::make_mut(&mut e.sample).apply(patch),
                        None => self.unmatched += 1,
                    }
                }
            }
            Record::Complete { rpc, ids, outputs } => {
                for (i, id) in ids.iter().enumerate() {
                    let Some(e) = self.samples.get_mut(id) else {
                        self.unmatched += 1;
                        continue;
                    };
                    if let Some(patch) = outputs.as_ref().and_then(|o| o.get(i)) {
                        Arc::make_mut(&mut e.sample).apply(patch);
                    }
                    let used = e.used.entry(Arc::clone(rpc)).or_default();
                    *used = used.saturating_add(1);
                }
                self.rpcs.entry(Arc::clone(rpc)).or_default().reads += ids.len() as u64;
            }
            Record::Release { rpc, ids, expired } => {
                let totals = self.rpcs.entry(Arc::clone(rpc)).or_default();
                totals.redelivered += ids.len() as u64;
                totals.expired_leases += u64::from(*expired);
            }
            Record::Free { ids, .. } => {
                for id in ids {
                    if self.samples.remove(id).is_some() {
                        self.freed += 1;
                    } else {
                        self.unmatched += 1;
                    }
                }
            }
        }
    }

    /// The entries in put order.
    pub(crate) fn ordered(&self) -> Vec<&Entry> {
        let mut entries: Vec<&Entry> = self.samples.values().collect();
        entries.sort_unstable_by_key(|e| e.seq);
        entries
    }

    /// The contents for a buffer whose RPCs are `rpcs` (name, reads per sample). A sample
    /// with no read left for any of them was consumed before the crash (its free was not
    /// yet logged): it is dropped from the state and counted as freed.
    pub(crate) fn restored(&mut self, rpcs: &[(Arc<str>, u16)]) -> Restored {
        let left_of = |e: &Entry| -> Vec<u16> {
            rpcs.iter()
                .map(|(name, reads)| reads.saturating_sub(e.used.get(name).copied().unwrap_or(0)))
                .collect()
        };
        let before = self.samples.len();
        self.samples
            .retain(|_, e| left_of(e).iter().any(|&l| l > 0));
        self.freed += (before - self.samples.len()) as u64;
        let mut out = Restored {
            put: self.put,
            freed: self.freed,
            ..Restored::default()
        };
        for e in self.ordered() {
            out.samples.push((Arc::clone(&e.sample), left_of(e)));
        }
        for (name, _) in rpcs {
            let t = self.rpcs.get(name).copied().unwrap_or_default();
            out.reads.push(t.reads);
            out.redelivered.push(t.redelivered);
            out.expired_leases.push(t.expired_leases);
        }
        out
    }

    /// The largest birth of any stored sample.
    pub(crate) fn max_birth(&self) -> u64 {
        self.samples
            .values()
            .filter_map(|e| e.sample.birth)
            .max()
            .unwrap_or(0)
    }
}
