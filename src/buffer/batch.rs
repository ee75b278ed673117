//! `Batch`: the samples leased to one RPC call, and how the lease ends.
//!
//! `complete(outputs)` merges the RPC's outputs into the stored samples and uses one read of
//! each, in one step under the lock, so no other RPC ever sees the read without the outputs.
//! `commit()` uses the read with no outputs. Dropping the batch without either releases the
//! lease: the samples become eligible again for this RPC (a redelivery) and nothing else
//! changes. A lease past its RPC's lease timeout is released by the buffer, and a late
//! `complete` / `commit` fails with [`Error::LeaseExpired`] with nothing applied.

use super::spill::{use_loaded, LoadedFields};
use super::steps::step_done;
use super::{now, AuxWrite, Durable, Inner, Record, SequenceBuffer, Shared, SlotHandle};
use crate::error::{Error, Result};
use crate::rpc_defs::KeySet;
use crate::sample::{MetaValue, Patch, Sample, SampleId};
use crate::state::{LeaseEnd, LeaseGone, LeaseId, Wake};
use crate::sync::{oneshot, Arc, MutexGuard};
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

/// Metadata key of the reason a consumer gave for discarding a sample.
pub const DISCARD_REASON: &str = "discard_reason";

/// Samples leased to one RPC. Finish it with [`Batch::complete`] or [`Batch::commit`];
/// dropping it releases the samples for redelivery.
#[must_use = "dropping a Batch releases its samples for redelivery"]
pub struct Batch {
    shared: Arc<Shared>,
    rpc: usize,
    lease: LeaseId,
    handles: Vec<SlotHandle>,
    /// Snapshots of the stored samples (fields are shared, never copied); only the RPC's
    /// input keys are visible through [`SampleView`].
    samples: Vec<Arc<Sample>>,
    deadline: Option<Instant>,
    /// Set once the lease was ended (so `Drop` has nothing to release).
    done: bool,
    /// The training step this batch is, if it was asked for by step.
    step: Option<u64>,
    /// Spilled fields loaded for the samples (kept only when freed samples go to a sink):
    /// samples the lease's end frees reach the sink with them, without a read back.
    loaded: Vec<LoadedFields>,
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("rpc", &self.rpc_name())
            .field("lease", &self.lease.number())
            .field("handles", &self.handles)
            .field(
                "ids",
                &self.samples.iter().map(|s| s.id()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Batch {
    pub(super) fn new(
        shared: Arc<Shared>,
        rpc: usize,
        lease: LeaseId,
        handles: Vec<SlotHandle>,
        samples: Vec<Arc<Sample>>,
        deadline: Option<Instant>,
        step: Option<u64>,
    ) -> Self {
        Self {
            shared,
            rpc,
            lease,
            handles,
            samples,
            deadline,
            done: false,
            step,
            loaded: Vec::new(),
        }
    }

    /// Keeps fields loaded for one of the samples, for the sink (see `loaded`).
    pub(super) fn keep_loaded(&mut self, loaded: LoadedFields) {
        self.loaded.push(loaded);
    }

    /// Puts the fields loaded back from a spill segment into sample `i` (whose snapshot is
    /// the spilled sample's stub; its own fields are newer and win).
    pub(super) fn fill(&mut self, i: usize, loaded: crate::sample::Fields) {
        if let Some(sample) = self.samples.get_mut(i) {
            *sample = Arc::new(super::spill::merge(sample, loaded));
        }
    }

    /// The training step, for a batch from `get_batch_for_step`.
    pub fn step(&self) -> Option<u64> {
        self.step
    }

    /// The samples, in selection order, showing only the RPC's input keys.
    pub fn samples(&self) -> impl ExactSizeIterator<Item = SampleView<'_>> + '_ {
        self.samples.iter().map(|s| self.view(s))
    }

    /// Sample `i` of the batch.
    pub fn sample(&self, i: usize) -> Option<SampleView<'_>> {
        self.samples.get(i).map(|s| self.view(s))
    }

    /// The ids, in batch order.
    pub fn ids(&self) -> impl ExactSizeIterator<Item = &SampleId> + '_ {
        self.samples.iter().map(|s| s.id())
    }

    /// The batch as an Arrow record batch, one row per sample with the RPC's input fields
    /// (layout as in [`crate::arrow`]).
    ///
    /// # Errors
    ///
    /// [`Error::Arrow`] as [`crate::arrow::to_record_batch`] fails: a name holding tensors
    /// of different element types, dimensions or raggedness (or metadata of different
    /// types, but for integers among floats, which are floats) in different samples, or
    /// used both as a field and a metadata key.
    #[cfg(feature = "arrow")]
    pub fn to_record_batch(&self) -> Result<arrow_array::RecordBatch> {
        let samples: Vec<Sample> = self.samples().map(|s| s.to_sample()).collect();
        crate::arrow::to_record_batch(&samples)
    }

    fn view<'a>(&'a self, sample: &'a Sample) -> SampleView<'a> {
        SampleView {
            sample,
            inputs: self
                .shared
                .input_names
                .get(self.rpc)
                .map_or(&[], Vec::as_slice),
        }
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

    /// The keys the RPC declares as outputs: the only keys `complete` accepts.
    pub fn output_keys(&self) -> Vec<&str> {
        let graph = &self.shared.graph;
        graph
            .rpcs()
            .get(self.rpc)
            .map(|r| r.outputs.ids().map(|id| graph.key_name(id)).collect())
            .unwrap_or_default()
    }

    /// When the buffer will release this lease, if the RPC has a lease timeout.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Merges `outputs[i]` into sample `i` and uses one read of every sample, atomically.
    /// Every key in `outputs` must be one of the RPC's declared outputs, and every declared
    /// output that another RPC reads must be given unless the sample already holds it.
    ///
    /// # Errors
    ///
    /// Nothing is applied on any error.
    ///
    /// * [`Error::LengthMismatch`] unless there is one patch per sample,
    ///   [`Error::UndeclaredOutput`] for a key the RPC does not declare as an output, and
    ///   [`Error::MissingOutput`] for a missing output another RPC reads. The lease is
    ///   released (the samples are redelivered to this RPC).
    /// * [`Error::LeaseExpired`] when the lease ran past the RPC's lease timeout (the
    ///   buffer released it).
    /// * With a sync journal, [`Error::Storage`] when the completion's record fails to be
    ///   written, and [`Error::Closed`] when the journal's writer stopped before it was
    ///   durable (the error that stopped it, if one did); the lease is released.
    ///
    /// # Cancel safety
    ///
    /// A future dropped before its first poll drops the batch, which releases the lease.
    /// At its first poll the completion is applied (without a sync journal) or handed to
    /// the journal, whose callback applies it once its record is durable (or releases the
    /// lease if the write fails), whatever happened to the future.
    pub async fn complete(mut self, outputs: Vec<Patch>) -> Result<()> {
        let added = self.check_outputs(Some(&outputs))?;
        self.finish(Some((outputs, added))).await
    }

    /// Whether [`Batch::complete`] would take `outputs`: the same checks (one patch per
    /// sample, declared outputs only, every output another RPC reads), with the batch
    /// kept, so a caller can correct its outputs and complete the lease after all.
    ///
    /// # Errors
    ///
    /// [`Error::LengthMismatch`], [`Error::UndeclaredOutput`] or [`Error::MissingOutput`],
    /// as `complete` would return them.
    pub fn check_outputs_for_complete(&self, outputs: &[Patch]) -> Result<()> {
        self.check_outputs(Some(outputs)).map(drop)
    }

    /// Whether [`Batch::commit`] would be taken: not when the RPC owes outputs another RPC
    /// reads. The batch is kept, so a caller told so can complete it with outputs.
    ///
    /// # Errors
    ///
    /// [`Error::MissingOutput`], as `commit` would return it.
    pub fn check_commit(&self) -> Result<()> {
        self.check_outputs(None).map(drop)
    }

    /// Uses one read of every sample without writing anything.
    ///
    /// # Errors
    ///
    /// As [`Batch::complete`]: [`Error::MissingOutput`] (lease released) if the RPC owes
    /// outputs another RPC reads, [`Error::LeaseExpired`], and with a sync journal
    /// [`Error::Storage`] or [`Error::Closed`]. Nothing is applied on any error.
    ///
    /// # Cancel safety
    ///
    /// As [`Batch::complete`].
    pub async fn commit(mut self) -> Result<()> {
        self.check_outputs(None)?;
        self.finish(None).await
    }

    /// Ends the lease by dropping its samples from the buffer, whatever reads they have
    /// left (a trainer's group hook rejected them, say): each leaves as soon as no other
    /// lease or amend holds it, goes to the freed-sample sink as
    /// [`ExitReason::Filtered`](crate::ExitReason::Filtered) (archived with
    /// `reason = filtered`) and is counted in `stats().filtered`.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseExpired`] (nothing dropped) if the lease ran past the RPC's lease
    /// timeout.
    pub fn discard(self) -> Result<()> {
        self.discard_because(None)
    }

    /// [`Self::discard`], recording `reason` as the samples' `discard_reason` metadata
    /// (so the archive row says why).
    ///
    /// # Errors
    ///
    /// As [`Self::discard`]: [`Error::LeaseExpired`], with nothing dropped or recorded.
    pub fn discard_with_reason(self, reason: &str) -> Result<()> {
        self.discard_because(Some(reason))
    }

    /// Ends the lease sample by sample: the samples where `discard[i]` holds are dropped
    /// as [`Self::discard_with_reason`] drops them (`reason` recorded), and the others are
    /// given back unused, as dropping the batch gives them back. For a consumer that found
    /// some of its samples unusable (data that cannot be converted, say): handing the whole
    /// batch back would serve the same samples again, and fail again, at the next get.
    ///
    /// # Errors
    ///
    /// * [`Error::LengthMismatch`] unless `discard` has one entry per sample (the batch is
    ///   then given back whole, nothing dropped).
    /// * [`Error::LeaseExpired`] (nothing dropped) as [`Self::discard`].
    pub fn discard_samples(self, discard: &[bool], reason: &str) -> Result<()> {
        if discard.len() != self.handles.len() {
            return Err(Error::LengthMismatch {
                what: "Batch::discard_samples",
                expected: self.handles.len(),
                got: discard.len(),
            });
        }
        self.end_discarding(Some(discard), Some(reason))
    }

    fn discard_because(self, reason: Option<&str>) -> Result<()> {
        self.end_discarding(None, reason)
    }

    /// Discards the samples `which` selects (all with `None`), releasing the others.
    fn end_discarding(mut self, which: Option<&[bool]>, reason: Option<&str>) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        self.samples.clear();
        let now = self.deadline.map(|_| now());
        let mut freed = Vec::new();
        let mut inner = shared.lock();
        let expired = inner.table.lease(self.lease, now).is_err();
        let wake = if expired {
            now.map_or(Wake::default(), |t| inner.expire_due(t, &mut freed))
        } else {
            let dropped = |i: usize| which.is_none_or(|w| w.get(i).copied().unwrap_or(false));
            if let Some(reason) = reason {
                let patch = Patch::new().meta(DISCARD_REASON, reason);
                for (i, h) in self.handles.iter().enumerate() {
                    if dropped(i) {
                        inner.patch(h.slot(), &patch);
                    }
                }
            }
            match which {
                None => inner
                    .table
                    .finish_lease(self.lease, LeaseEnd::Discarded, &[], &mut freed),
                Some(which) => {
                    let kept = self
                        .handles
                        .iter()
                        .enumerate()
                        .filter(|&(i, _)| !dropped(i));
                    let kept: Vec<u32> = kept.map(|(_, h)| h.slot()).collect();
                    if !kept.is_empty() {
                        log_release(&mut inner, self.rpc, kept.into_iter());
                    }
                    inner
                        .table
                        .finish_lease_discarding(self.lease, which, &mut freed)
                }
            }
        };
        let mut dropped = inner.take_freed(&freed);
        drop(inner);
        use_loaded(&mut dropped.spilled, std::mem::take(&mut self.loaded));
        self.done = true;
        shared.settle((wake, dropped));
        if expired {
            return Err(Error::LeaseExpired {
                rpc: self.rpc_name().to_owned(),
                lease: self.lease.number(),
                timeout: shared.graph.rpcs()[self.rpc]
                    .lease_timeout
                    .unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// Checks the outputs (or, for `None`, their absence) and returns each patch's graph
    /// keys.
    fn check_outputs(&self, outputs: Option<&[Patch]>) -> Result<Vec<KeySet>> {
        let n = self.samples.len();
        if let Some(outputs) = outputs {
            if outputs.len() != n {
                return Err(Error::LengthMismatch {
                    what: "Batch::complete",
                    expected: n,
                    got: outputs.len(),
                });
            }
        }
        let graph = &self.shared.graph;
        let Some(info) = graph.rpcs().get(self.rpc) else {
            return Ok(vec![KeySet::EMPTY; n]);
        };
        let mut added = Vec::with_capacity(n);
        for (i, sample) in self.samples.iter().enumerate() {
            let mut keys = KeySet::EMPTY;
            for key in outputs
                .and_then(|o| o.get(i))
                .into_iter()
                .flat_map(Patch::keys)
            {
                match graph.key_id(key) {
                    Some(id) if info.outputs.contains(id) => keys = keys.with(id),
                    _ => {
                        return Err(Error::UndeclaredOutput {
                            rpc: info.name.to_string(),
                            key: key.to_owned(),
                            id: sample.id.to_string(),
                        })
                    }
                }
            }
            // Usually the patch itself carries every needed output; only otherwise look at
            // what the sample already holds.
            if !keys.contains_all(info.needed_outputs) {
                let have = graph.key_set(sample.keys()).union(keys);
                if let Some(missing) = info.needed_outputs.ids().find(|&k| !have.contains(k)) {
                    return Err(Error::MissingOutput {
                        rpc: info.name.to_string(),
                        key: graph.key_name(missing).to_owned(),
                        id: sample.id.to_string(),
                    });
                }
            }
            added.push(keys);
        }
        Ok(added)
    }

    /// Uses the lease's reads (with `outputs`), now or, with a sync journal, once the
    /// completion is durable.
    async fn finish(&mut self, outputs: Option<Outputs>) -> Result<()> {
        match self.end_lease(outputs)? {
            Some(durable) => self.shared.verdict(durable).await,
            None => Ok(()),
        }
    }

    /// The synchronous part of [`Self::finish`]: ends the lease now, or hands the
    /// completion to the sync journal and returns where its verdict will arrive.
    fn end_lease(
        &mut self,
        outputs: Option<Outputs>,
    ) -> Result<Option<oneshot::Receiver<Result<()>>>> {
        let shared = Arc::clone(&self.shared);
        // Drop the snapshots first, so the stored samples are unshared again and the outputs
        // are added in place instead of copying each sample.
        self.samples.clear();
        let now = self.deadline.map(|_| now());
        let mut inner = shared.lock();
        if let Err(LeaseGone::Expired) = inner.table.lease(self.lease, now) {
            // Reclaim it now if no waiting getter has yet.
            let mut freed = Vec::new();
            let wake = now.map_or(Wake::default(), |t| inner.expire_due(t, &mut freed));
            let dropped = inner.take_freed(&freed);
            drop(inner);
            self.done = true;
            shared.notify(wake);
            shared.dispose(dropped);
            let timeout = shared.graph.rpcs()[self.rpc]
                .lease_timeout
                .unwrap_or_default();
            return Err(Error::LeaseExpired {
                rpc: self.rpc_name().to_owned(),
                lease: self.lease.number(),
                timeout,
            });
        }
        self.done = true;
        let loaded = std::mem::take(&mut self.loaded);
        let slots = self.handles.iter().map(SlotHandle::slot);
        // A step's batch, once used, is logged as done: asking for the step again fails.
        let step_done: Vec<AuxWrite> = self
            .step
            .map(|step| step_done(&inner.rpc_names[self.rpc], step))
            .into_iter()
            .collect();
        // Without a sync journal the reads are used now, in this critical section.
        let use_now = |mut inner: MutexGuard<'_, Inner>,
                       outputs: Option<(&[Patch], &[KeySet])>,
                       loaded: Vec<LoadedFields>| {
            let (wake, mut freed) = use_reads(&mut inner, self.lease, slots.clone(), outputs);
            inner.aux_apply(&step_done);
            drop(inner);
            use_loaded(&mut freed.spilled, loaded);
            shared.settle((wake, freed));
        };
        let Some(journal) = inner.journal.clone() else {
            use_now(
                inner,
                outputs.as_ref().map(|(p, k)| (&p[..], &k[..])),
                loaded,
            );
            return Ok(None);
        };
        // Logged: the record and (with a sync journal) the deferred completion share the
        // outputs.
        let outputs: Option<SharedOutputs> = outputs.map(|(p, k)| (p.into(), k));
        let record = Record::Complete {
            rpc: Arc::clone(&inner.rpc_names[self.rpc]),
            ids: inner.ids_of(slots.clone()),
            outputs: outputs.as_ref().map(|(p, _)| Arc::clone(p)),
        };
        let mut records = vec![record];
        if !step_done.is_empty() {
            records.push(Record::Aux(step_done.clone()));
        }
        if !shared.sync_journal {
            // Only a callback is ever handed back.
            let _ = journal.append(records, None);
            use_now(
                inner,
                outputs.as_ref().map(|(p, k)| (&p[..], &k[..])),
                loaded,
            );
            return Ok(None);
        }
        // The lease must not expire while its completion is on its way to storage.
        inner.table.pin_lease(self.lease);
        let mut finishing = Finishing {
            shared: Arc::clone(&shared),
            rpc: self.rpc,
            lease: self.lease,
            slots: slots.collect(),
            outputs,
            loaded,
            pending: true,
        };
        let (tx, rx) = oneshot::channel();
        let then: Durable = Box::new(move |verdict| {
            // Use the reads, or release the lease, before the caller hears of it.
            if verdict.is_ok() {
                finishing.pending = false;
                let shared = Arc::clone(&finishing.shared);
                let outputs = finishing.outputs.as_ref().map(|(p, k)| (&p[..], &k[..]));
                let mut inner = shared.lock();
                let (wake, mut freed) = use_reads(
                    &mut inner,
                    finishing.lease,
                    finishing.slots.iter().copied(),
                    outputs,
                );
                inner.aux_apply(&step_done);
                drop(inner);
                use_loaded(&mut freed.spilled, std::mem::take(&mut finishing.loaded));
                shared.settle((wake, freed));
            }
            drop(finishing);
            let _ = tx.send(verdict);
        });
        let refused = journal.append(records, Some(then));
        drop(inner);
        drop(refused);
        Ok(Some(rx))
    }
}

/// A completion's outputs and their graph keys.
type Outputs = (Vec<Patch>, Vec<KeySet>);
/// The same, shared between a log record and a completion waiting for it.
type SharedOutputs = (Arc<[Patch]>, Vec<KeySet>);

/// Applies `outputs` to the samples in `slots` and uses one read of each for `lease`,
/// under the lock `inner`; returns who to wake and the payloads freed.
fn use_reads(
    inner: &mut Inner,
    lease: LeaseId,
    slots: impl Iterator<Item = u32>,
    outputs: Option<(&[Patch], &[KeySet])>,
) -> (Wake, super::Freed) {
    let mut added: &[KeySet] = &[];
    if let Some((patches, keys)) = outputs {
        for (slot, patch) in slots.zip(patches) {
            inner.patch(slot, patch);
        }
        added = keys;
    }
    let mut freed = Vec::new();
    let wake = inner
        .table
        .finish_lease(lease, LeaseEnd::Used, added, &mut freed);
    (wake, inner.take_freed(&freed))
}

/// A completion waiting for its record to be durable. Dropped still pending (a failed
/// write, or a journal that shut down) it releases the lease, so the samples are
/// redelivered.
struct Finishing {
    shared: Arc<Shared>,
    rpc: usize,
    lease: LeaseId,
    slots: Vec<u32>,
    outputs: Option<SharedOutputs>,
    /// The batch's loaded fields, for the samples the completion frees.
    loaded: Vec<LoadedFields>,
    pending: bool,
}

impl Drop for Finishing {
    fn drop(&mut self) {
        if self.pending {
            release(
                &self.shared,
                self.rpc,
                self.lease,
                self.slots.iter().copied(),
            );
        }
    }
}

/// Logs that RPC `rpc` gave `slots` back unused.
fn log_release(inner: &mut Inner, rpc: usize, slots: impl Iterator<Item = u32>) {
    inner.log(|| Record::Release {
        rpc: Arc::clone(&inner.rpc_names[rpc]),
        ids: inner.ids_of(slots),
        expired: false,
    });
}

/// Releases a lease unused (logging the release) and notifies.
fn release(shared: &Arc<Shared>, rpc: usize, lease: LeaseId, slots: impl Iterator<Item = u32>) {
    let mut freed = Vec::new();
    let (wake, dropped) = {
        let mut inner = shared.lock();
        log_release(&mut inner, rpc, slots);
        let wake = inner
            .table
            .finish_lease(lease, LeaseEnd::Released, &[], &mut freed);
        (wake, inner.take_freed(&freed))
    };
    if !wake.rpcs.is_empty() {
        tracing::trace!(rpc, "lease released; redelivering");
    }
    shared.notify(wake);
    shared.dispose(dropped);
}

impl Drop for Batch {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let slots = self.handles.iter().map(SlotHandle::slot);
        release(&self.shared, self.rpc, self.lease, slots);
    }
}

impl SequenceBuffer {
    /// Number of live leases (batches handed out and not yet finished or released).
    pub fn live_leases(&self) -> usize {
        self.shared.lock().table.leases.live()
    }
}

/// One sample of a [`Batch`], showing only the input keys of the batch's RPC.
#[derive(Debug, Clone, Copy)]
pub struct SampleView<'a> {
    sample: &'a Sample,
    inputs: &'a [Arc<str>],
}

impl<'a> SampleView<'a> {
    fn visible(&self, key: &str) -> bool {
        self.inputs.iter().any(|k| &**k == key)
    }

    /// The id.
    pub fn id(&self) -> &'a SampleId {
        &self.sample.id
    }

    /// The birth assigned at put (or given explicitly).
    pub fn birth(&self) -> u64 {
        self.sample.birth.unwrap_or(0)
    }

    /// A field, if it is one of the RPC's input keys.
    pub fn get(&self, key: &str) -> Option<&'a Tensor> {
        if self.visible(key) {
            self.sample.fields.get(key)
        } else {
            None
        }
    }

    /// The RPC's input fields, in the order they were added to the sample.
    pub fn fields(&self) -> impl Iterator<Item = (&'a str, &'a Tensor)> + 'a {
        let inputs = self.inputs;
        self.sample
            .fields()
            .filter(move |(k, _)| inputs.iter().any(|i| &**i == *k))
    }

    /// The names of the RPC's input fields.
    pub fn keys(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.fields().map(|(k, _)| k)
    }

    /// A metadata entry (metadata is always visible).
    pub fn get_meta(&self, key: &str) -> Option<&'a MetaValue> {
        self.sample.get_meta(key)
    }

    /// All metadata.
    pub fn metadata(&self) -> &'a BTreeMap<String, MetaValue> {
        self.sample.metadata()
    }

    /// A copy of the sample holding only the visible fields (tensors are shared, not
    /// copied), e.g. to keep after the batch is finished.
    pub fn to_sample(&self) -> Sample {
        Sample {
            id: self.sample.id.clone(),
            birth: self.sample.birth,
            fields: self.sample.fields.filtered(|k| self.visible(k)),
            meta: self.sample.meta.clone(),
        }
    }
}
