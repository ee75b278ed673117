//! Filling a new buffer with recovered samples, and `contents()`, the inspection of what a
//! buffer stores (what recovery is checked against).
//!
//! Restoring happens before the buffer is shared with anyone and before its journal is
//! attached, so nothing restored is logged again and no waiter exists to notify.

use super::{Journal, SequenceBuffer};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::sync::Arc;
use std::collections::BTreeMap;

/// A stored sample and the reads each RPC has left of it (see
/// [`SequenceBuffer::contents`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StoredSample {
    /// The sample with every field it holds now.
    pub sample: Sample,
    /// Per RPC name: reads of the sample it has not used yet.
    pub reads_left: BTreeMap<String, u16>,
}

/// A recovered buffer's contents, ready to be restored.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    /// Samples in their original put order, each with its reads left per RPC (in the
    /// buffer's RPC order).
    pub(crate) samples: Vec<(Arc<Sample>, Vec<u16>)>,
    /// Running totals: samples put and freed.
    pub(crate) put: u64,
    pub(crate) freed: u64,
    /// Per RPC (buffer order): reads used, samples redelivered, leases expired.
    pub(crate) reads: Vec<u64>,
    pub(crate) redelivered: Vec<u64>,
    pub(crate) expired_leases: Vec<u64>,
}

impl SequenceBuffer {
    /// Puts `restored` into the new buffer `self`, then attaches `journal`.
    pub(crate) fn restore(
        &self,
        restored: Restored,
        journal: Option<Arc<dyn Journal>>,
    ) -> Result<()> {
        let shared = &*self.shared;
        let mut inner = shared.lock();
        let n = restored.samples.len();
        if n > inner.table.free.len() {
            return Err(Error::Incompatible {
                detail: format!(
                    "{n} samples were recovered but the buffer has {} slots",
                    shared.capacity
                ),
            });
        }
        for (sample, reads_left) in restored.samples {
            let keys = shared.graph.key_set(sample.keys());
            let Some((slots, _)) = inner.table.claim_put(1, None) else {
                break;
            };
            let slot = slots[0];
            inner.ids.insert(sample.id.clone(), slot);
            inner
                .table
                .restore_put(slot, sample.birth.unwrap_or(1), keys, &reads_left);
            inner.samples[slot as usize] = Some(sample);
        }
        let totals = &mut inner.table.totals;
        totals.put = restored.put;
        totals.freed = restored.freed;
        for (mine, theirs) in [
            (&mut totals.reads, &restored.reads),
            (&mut totals.redelivered, &restored.redelivered),
            (&mut totals.expired_leases, &restored.expired_leases),
        ] {
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m = *t;
            }
        }
        inner.journal = journal;
        Ok(())
    }

    /// Every stored sample (not those still being put), oldest birth first, with the reads
    /// each RPC has left. Copies only field handles, never tensor data; for inspection and
    /// tests, O(stored samples).
    pub fn contents(&self) -> Vec<StoredSample> {
        let shared = &*self.shared;
        let inner = shared.lock();
        let table = &inner.table;
        let n_rpcs = table.rpcs.len();
        let mut stored: Vec<(_, StoredSample)> = inner
            .samples
            .iter()
            .enumerate()
            .filter_map(|(s, sample)| {
                let sample = sample.as_ref()?;
                let reads_left = shared
                    .graph
                    .rpcs()
                    .iter()
                    .enumerate()
                    .map(|(r, info)| (info.name.to_string(), table.reads_left[s * n_rpcs + r]))
                    .collect();
                let entry = StoredSample {
                    sample: Sample::clone(sample),
                    reads_left,
                };
                Some((table.slots[s].order, entry))
            })
            .collect();
        stored.sort_by_key(|(order, _)| *order);
        stored.into_iter().map(|(_, s)| s).collect()
    }
}
