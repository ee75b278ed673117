//! `Batch`: the samples leased to one RPC call, and how the lease ends.
//!
//! `complete(outputs)` merges the RPC's outputs into the stored samples and uses one read of
//! each, in one step under the lock, so no other RPC ever sees the read without the outputs.
//! `commit()` uses the read with no outputs. Dropping the batch without either releases the
//! lease: the samples become eligible again for this RPC (a redelivery) and nothing else
//! changes. A lease past its RPC's lease timeout is released by the buffer, and a late
//! `complete` / `commit` fails with [`Error::LeaseExpired`] with nothing applied.

use super::{now, SequenceBuffer, Shared, SlotHandle};
use crate::error::{Error, Result};
use crate::rpc_defs::KeySet;
use crate::sample::{Patch, Sample};
use crate::state::{LeaseEnd, LeaseGone, LeaseId, Wake};
use crate::sync::Arc;
use std::fmt;
use std::time::Instant;

/// Samples leased to one RPC. Finish it with [`Batch::complete`] or [`Batch::commit`];
/// dropping it releases the samples for redelivery.
#[must_use = "dropping a Batch releases its samples for redelivery"]
pub struct Batch {
    shared: Arc<Shared>,
    rpc: usize,
    lease: LeaseId,
    handles: Vec<SlotHandle>,
    samples: Vec<Sample>,
    deadline: Option<Instant>,
    /// Set once the lease was ended (so `Drop` has nothing to release).
    done: bool,
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("rpc", &self.rpc_name())
            .field("lease", &self.lease.number())
            .field("handles", &self.handles)
            .field(
                "ids",
                &self.samples.iter().map(Sample::id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Batch {
    pub(super) fn new(
        shared: Arc<Shared>,
        rpc: usize,
        lease: LeaseId,
        slots: &[u32],
        generations: Vec<u32>,
        samples: Vec<Sample>,
        deadline: Option<Instant>,
    ) -> Self {
        let handles = slots
            .iter()
            .zip(generations)
            .map(|(&slot, generation)| SlotHandle { slot, generation })
            .collect();
        Self {
            shared,
            rpc,
            lease,
            handles,
            samples,
            deadline,
            done: false,
        }
    }

    /// The samples, in selection order, carrying only the RPC's input keys.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// One handle per sample, in the same order (usable with `amend_batch`).
    pub fn handles(&self) -> &[SlotHandle] {
        &self.handles
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True for an empty batch (never returned by the buffer).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The RPC the batch was leased to.
    pub fn rpc_name(&self) -> &str {
        self.shared
            .graph
            .rpcs()
            .get(self.rpc)
            .map_or("?", |r| &r.name)
    }

    /// When the buffer will release this lease, if the RPC has a lease timeout.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Merges `outputs[i]` into sample `i` and uses one read of every sample, atomically.
    ///
    /// Every key in `outputs` must be one of the RPC's declared outputs
    /// ([`Error::UndeclaredOutput`] otherwise) and there must be one patch per sample
    /// ([`Error::LengthMismatch`]); on such an error nothing is applied and the lease is
    /// released (the samples are redelivered).
    pub async fn complete(mut self, outputs: Vec<Patch>) -> Result<()> {
        let added = self.check_outputs(&outputs)?;
        self.finish(Some((&outputs, &added)))
    }

    /// Uses one read of every sample without writing anything.
    pub async fn commit(mut self) -> Result<()> {
        self.finish(None)
    }

    fn check_outputs(&self, outputs: &[Patch]) -> Result<Vec<KeySet>> {
        if outputs.len() != self.samples.len() {
            return Err(Error::LengthMismatch {
                what: "Batch::complete",
                expected: self.samples.len(),
                got: outputs.len(),
            });
        }
        let graph = &self.shared.graph;
        let declared = graph
            .rpcs()
            .get(self.rpc)
            .map_or(KeySet::EMPTY, |r| r.outputs);
        let mut added = Vec::with_capacity(outputs.len());
        for (patch, sample) in outputs.iter().zip(&self.samples) {
            let mut keys = KeySet::EMPTY;
            for key in patch.keys() {
                match graph.key_id(key) {
                    Some(id) if declared.contains(id) => keys = keys.with(id),
                    _ => {
                        return Err(Error::UndeclaredOutput {
                            rpc: self.rpc_name().to_owned(),
                            key: key.to_owned(),
                            id: sample.id.to_string(),
                        })
                    }
                }
            }
            added.push(keys);
        }
        Ok(added)
    }

    fn finish(&mut self, outputs: Option<(&[Patch], &[KeySet])>) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        let mut freed = Vec::new();
        let now = self.deadline.map(|_| now());
        let (wake, dropped, result) = {
            let mut inner = shared.lock();
            match inner.table.lease(self.lease, now) {
                Ok(_) => {
                    let mut added: &[KeySet] = &[];
                    if let Some((patches, keys)) = outputs {
                        for (h, patch) in self.handles.iter().zip(patches) {
                            if let Some(Some(sample)) = inner.samples.get_mut(h.slot as usize) {
                                Arc::make_mut(sample).apply(patch);
                            }
                        }
                        added = keys;
                    }
                    let wake =
                        inner
                            .table
                            .finish_lease(self.lease, LeaseEnd::Used, added, &mut freed);
                    (wake, inner.take_freed(&freed), Ok(()))
                }
                Err(LeaseGone::Expired) => {
                    // Reclaim it now if no waiting getter has yet.
                    let wake =
                        now.map_or(Wake::default(), |t| inner.table.expire_due(t, &mut freed));
                    let timeout = inner.table.rpcs[self.rpc].lease_timeout.unwrap_or_default();
                    let err = Error::LeaseExpired {
                        rpc: self.rpc_name().to_owned(),
                        lease: self.lease.number(),
                        timeout,
                    };
                    (wake, inner.take_freed(&freed), Err(err))
                }
            }
        };
        self.done = true;
        shared.notify(wake);
        drop(dropped);
        result
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut freed = Vec::new();
        let (wake, dropped) = {
            let mut inner = self.shared.lock();
            let wake = inner
                .table
                .finish_lease(self.lease, LeaseEnd::Released, &[], &mut freed);
            (wake, inner.take_freed(&freed))
        };
        if wake.rpcs != 0 {
            tracing::trace!(
                rpc = self.rpc_name(),
                n = self.samples.len(),
                "batch dropped; redelivering"
            );
        }
        self.shared.notify(wake);
        drop(dropped);
    }
}

impl SequenceBuffer {
    /// Number of live leases (batches handed out and not yet finished or released).
    pub fn live_leases(&self) -> usize {
        self.shared.lock().table.leases.live()
    }
}
