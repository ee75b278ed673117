//! Filling a new buffer with recovered samples (persistence only).
//!
//! Restoring happens before the buffer is shared with anyone and before its journal is
//! attached, so nothing restored is logged again and no waiter exists to notify.

use super::freshness::{freshness_of, recovered_version};
use super::SpillPart;
use super::{now, Journal, SequenceBuffer};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::sync::Arc;

/// A recovered buffer's contents, ready to be restored.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    /// Samples in their original put order, each with its reads left per RPC (in the
    /// buffer's RPC order).
    /// A spilled sample's entry is its stub, with the parts that say where the rest is.
    pub(crate) samples: Vec<(Arc<Sample>, Vec<u16>, Vec<SpillPart>)>,
    /// Running totals: samples put and freed.
    pub(crate) put: u64,
    pub(crate) freed: u64,
    /// Per RPC (buffer order): reads used, samples redelivered, leases expired.
    pub(crate) reads: Vec<u64>,
    pub(crate) redelivered: Vec<u64>,
    pub(crate) expired_leases: Vec<u64>,
    /// Auxiliary entries.
    pub(crate) aux: Vec<(Arc<str>, Arc<Sample>)>,
}

impl SequenceBuffer {
    /// Puts `restored` into the new buffer `self`, then attaches `journal`.
    pub(crate) fn restore(
        &self,
        restored: Restored,
        journal: Option<Arc<dyn Journal>>,
    ) -> Result<()> {
        let shared = &self.shared;
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
        inner.aux = restored.aux.into_iter().collect();
        // The version first, so restored samples are judged against it.
        if let Some(version) = recovered_version(&inner.aux) {
            let mut none = Vec::new();
            let _ = inner.table.set_policy_version(version, &mut none);
        }
        let mut doomed = Vec::new();
        for (sample, reads_left, parts) in restored.samples {
            let spilled_keys = parts
                .iter()
                .flat_map(|p| p.fields.iter().map(|(k, _)| &**k));
            let keys = shared.graph.key_set(sample.keys().chain(spilled_keys));
            let spilled: u64 = parts
                .iter()
                .flat_map(|p| p.fields.iter().map(|(_, b)| *b))
                .sum();
            // Enough slots were checked above; the budgets do not apply to recovery.
            let Some(slot) = inner.table.claim_restore() else {
                return Err(Error::Incompatible {
                    detail: format!("no free slot for recovered sample `{}`", sample.id),
                });
            };
            // Metadata was checked when the sample was first put; a value that no longer
            // parses only loses its freshness rules.
            let fresh = freshness_of(&sample, shared.ages)
                .ok()
                .flatten()
                .map(|f| (f, now()));
            inner.ids.insert(sample.id.clone(), slot);
            // A recovered buffer may start over its byte budget; puts wait until it is not.
            let bytes = if shared.max_bytes.is_some() {
                sample.payload_bytes() + spilled
            } else {
                0
            };
            inner.table.reserve_bytes(&[slot], &[bytes]);
            if shared.memory_budget.is_some() {
                // Over the memory budget, the spiller (started below) writes the excess out.
                inner
                    .table
                    .reserve_resident(&[slot], &[super::spill::spillable_bytes(&sample)]);
            }
            inner
                .table
                .restore_put(slot, sample.birth.unwrap_or(1), keys, &reads_left, fresh);
            inner.samples[slot as usize] = Some(sample);
            inner.refresh_priorities(slot, None);
            if let Some(spill) = inner.spill.as_mut() {
                spill.restore(slot, parts);
            } else if !parts.is_empty() {
                return Err(Error::Incompatible {
                    detail: "spilled samples recovered into a buffer without a spill store".into(),
                });
            }
            if inner.table.is_doomed(slot as usize) {
                doomed.push(slot);
            }
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
        // Samples that aged out while the buffer was down leave now, logged as stale.
        let mut freed = Vec::new();
        for slot in doomed {
            let _ = inner.table.settle(slot as usize, &mut freed);
        }
        let dropped = inner.take_freed(&freed);
        let over = inner.table.residency.over();
        self.shared.start_spiller(&mut inner);
        drop(inner);
        shared.dispose(dropped);
        if over {
            shared.spill_wake.notify_waiters();
        }
        Ok(())
    }
}
