//! Spilling: under a memory budget, the payloads of idle samples move to spill segments
//! and come back when a batch selects them.
//!
//! # What stays in memory
//!
//! A spilled sample keeps its slot, id, birth, metadata and key set, so readiness,
//! selection, staleness, admission and stats never wait on I/O. Its entry in
//! `Inner::samples` becomes a *stub*: the same sample without the spilled fields. Fields
//! an amend or a completion adds later live in the stub, beside the spilled ones (a patch
//! never reloads the sample); a patched key is struck from the spilled list, so the stub's
//! value wins. `SpillState::parts[slot]` says where each spilled field is: a segment, a
//! row, and the field names and sizes.
//!
//! # Who does what
//!
//! * The *spiller* (one task per buffer, started by the first put) wakes when a
//!   transition leaves more bytes resident than the budget allows (`Wake::spill`), takes
//!   spillable samples from the table (`pick_spill`), writes their fields as one segment
//!   outside the lock, then, under the lock, swaps in the stubs of the samples that did not
//!   change meanwhile (the `Arc` is still the one it wrote) and wakes waiting putters.
//! * A get that leases samples whose input fields are spilled registers a *load* per
//!   sample in `SpillState::loading` in the same critical section as the lease, and a task
//!   reads them (only the RPC's input columns, only the rows needed) outside the lock. The
//!   batch is handed out once they are in. A get that needs a sample already being loaded
//!   with those fields waits for that load instead of reading it again; a `Fifo` get also
//!   registers loads for the next samples in its order (read-ahead). Loaded fields go to
//!   the batch, not back into the buffer: the buffer's resident count stays under the
//!   budget, and a batch holds at most one batch of payload.
//! * When a spilled sample is freed, its rows die; a segment with no live row is deleted.
//!
//! # Locking
//!
//! `SpillState` lives in `Inner`, under the buffer's lock. Segment writes, reads and
//! deletes run outside it; a load's result is published through its [`LoadCell`]
//! (its own small mutex and `Notify`, taken without the buffer's lock held).

use super::{Batch, Inner, Shared};
use crate::error::{Error, Result};
use crate::sample::{FieldKey, Fields, Sample};
use crate::state::Wake;
use crate::sync::{Arc, Mutex, Notify};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Weak;
use std::time::Duration;

/// The future a [`SpillStore`] operation returns.
pub(crate) type SpillFuture<T> = Pin<Box<dyn Future<Output = Result<T>> + Send>>;

/// A written spill segment.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Unique among the segments of one store.
    pub(crate) id: u64,
    /// Its path inside the store.
    pub(crate) path: String,
    /// Rows written.
    pub(crate) rows: u32,
}

/// Where spilled fields go (the Parquet spill store implements it).
pub(crate) trait SpillStore: Send + Sync + fmt::Debug {
    /// Writes one segment holding `rows` (row `i` = `rows[i]`'s fields).
    fn write(&self, rows: Vec<Fields>) -> SpillFuture<Arc<Segment>>;
    /// Reads the fields `keys` of `rows` of `segment`, in the order asked; a row lacking
    /// one of them has no entry for it.
    fn read(
        &self,
        segment: Arc<Segment>,
        rows: Vec<u32>,
        keys: Vec<FieldKey>,
    ) -> SpillFuture<Vec<Fields>>;
    /// Deletes a segment no live sample needs.
    fn delete(&self, segment: Arc<Segment>) -> SpillFuture<()>;
}

/// Spilled fields of one sample that share a segment row.
#[derive(Debug, Clone)]
pub(crate) struct SpillPart {
    pub(crate) segment: u64,
    pub(crate) row: u32,
    /// Field names and tensor bytes.
    pub(crate) fields: Vec<(FieldKey, u64)>,
}

/// Freed samples whose spilled fields are being read back for the sink.
#[derive(Debug, Default)]
pub(crate) struct HandOver {
    pending: Mutex<usize>,
    done: Notify,
}

/// Where some spilled fields of a freed sample are.
#[derive(Debug, Clone)]
pub(crate) struct SpilledRow {
    segment: Arc<Segment>,
    row: u32,
    keys: Vec<FieldKey>,
}

/// A segment and how many of its rows a stored sample still needs.
#[derive(Debug)]
struct LiveSegment {
    segment: Arc<Segment>,
    live: u32,
}

/// One load of a sample's spilled fields, shared by every get that needs them.
#[derive(Debug)]
pub(crate) struct LoadCell {
    result: Mutex<Option<Result<Fields>>>,
    done: Notify,
}

impl LoadCell {
    /// Waits for the load's outcome.
    pub(crate) async fn wait(&self) -> Result<Fields> {
        loop {
            let mut notified = pin!(self.done.notified());
            notified.as_mut().enable();
            if let Some(result) = self.result.lock().clone() {
                return result;
            }
            notified.await;
        }
    }

    fn new() -> Self {
        Self {
            result: Mutex::new(None),
            done: Notify::new(),
        }
    }

    fn finish(&self, result: Result<Fields>) {
        *self.result.lock() = Some(result);
        self.done.notify_waiters();
    }
}

/// A load in flight (or done and not yet taken) for the sample in one slot.
#[derive(Debug, Clone)]
struct Loading {
    generation: u32,
    keys: Vec<FieldKey>,
    cell: Arc<LoadCell>,
}

/// What one read asks a segment for.
#[derive(Debug)]
struct Request {
    slot: u32,
    segment: Arc<Segment>,
    row: u32,
    keys: Vec<FieldKey>,
}

/// A batch's sample `index` (in `slot`) waits for `cell`.
#[derive(Debug)]
pub(crate) struct BatchLoad {
    pub(crate) index: usize,
    pub(crate) slot: u32,
    pub(crate) cell: Arc<LoadCell>,
}

/// Loads registered under the lock, to be started once it is dropped.
#[derive(Debug, Default)]
#[must_use = "registered loads must be started"]
pub(crate) struct LoadPlan {
    /// Per sample to load: its cell and its reads, one per part.
    loads: Vec<(Arc<LoadCell>, Vec<Request>)>,
}

impl LoadPlan {
    pub(crate) fn is_empty(&self) -> bool {
        self.loads.is_empty()
    }
}

/// Counters of spill activity (see `Stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SpillCounters {
    pub(crate) spilled_samples: u64,
    pub(crate) spilled_bytes: u64,
    pub(crate) segments_written: u64,
    pub(crate) segments_deleted: u64,
    pub(crate) loaded_samples: u64,
    /// Leased samples whose load was already in flight (read ahead, or for another RPC).
    pub(crate) shared_loads: u64,
    pub(crate) failures: u64,
}

/// Spill bookkeeping, under the buffer's lock.
#[derive(Debug)]
pub(crate) struct SpillState {
    pub(crate) store: Arc<dyn SpillStore>,
    /// Per slot: the spilled parts of its sample (empty while it is all in memory).
    parts: Vec<Vec<SpillPart>>,
    segments: HashMap<u64, LiveSegment>,
    loading: HashMap<u32, Loading>,
    /// The last failed segment write, until a write succeeds: putters waiting for room
    /// get it instead of waiting on a store that keeps failing.
    pub(crate) failure: Option<Error>,
    started: bool,
    /// Segments left without a live row by a patch, deleted with the next freed samples.
    pub(crate) dead: Vec<Arc<Segment>>,
    /// Stored samples with at least one spilled part.
    spilled_now: u64,
    pub(crate) counters: SpillCounters,
}

/// Most bytes one spill round writes into one segment.
const SEGMENT_BYTES: u64 = 64 << 20;

impl SpillState {
    pub(crate) fn new(store: Arc<dyn SpillStore>, capacity: usize) -> Self {
        Self {
            store,
            parts: (0..capacity).map(|_| Vec::new()).collect(),
            segments: HashMap::new(),
            loading: HashMap::new(),
            failure: None,
            started: false,
            dead: Vec::new(),
            spilled_now: 0,
            counters: SpillCounters::default(),
        }
    }

    /// The spilled parts of the sample in `slot`.
    pub(crate) fn parts(&self, slot: u32) -> &[SpillPart] {
        self.parts.get(slot as usize).map_or(&[], Vec::as_slice)
    }

    /// Tensor bytes of the sample in `slot` that are spilled.
    pub(crate) fn spilled_bytes(&self, slot: u32) -> u64 {
        self.parts(slot)
            .iter()
            .flat_map(|p| p.fields.iter().map(|(_, b)| *b))
            .sum()
    }

    /// Strikes the keys a patch sets from the sample's spilled list (the stub's new value
    /// wins); a part left with no field is released.
    pub(crate) fn strike(&mut self, slot: u32, keys: &[&str]) {
        let Some(parts) = self.parts.get_mut(slot as usize) else {
            return;
        };
        let had = !parts.is_empty();
        let mut emptied = Vec::new();
        parts.retain_mut(|p| {
            p.fields.retain(|(k, _)| !keys.contains(&k.as_str()));
            if p.fields.is_empty() {
                emptied.push(p.segment);
                false
            } else {
                true
            }
        });
        if had && parts.is_empty() {
            self.spilled_now -= 1;
        }
        for segment in emptied {
            if let Some(dead) = self.release_row(segment) {
                self.dead.push(dead);
            }
        }
    }

    /// Forgets the spill state of a freed slot; returns where its spilled fields are (for
    /// a sink that wants the whole sample) and the segments left without a live row.
    pub(crate) fn forget(&mut self, slot: u32) -> (Vec<SpilledRow>, Vec<Arc<Segment>>) {
        self.loading.remove(&slot);
        let parts = self
            .parts
            .get_mut(slot as usize)
            .map(std::mem::take)
            .unwrap_or_default();
        if !parts.is_empty() {
            self.spilled_now -= 1;
        }
        let mut rows = Vec::with_capacity(parts.len());
        let mut dead = Vec::new();
        for part in parts {
            if let Some(live) = self.segments.get(&part.segment) {
                rows.push(SpilledRow {
                    segment: Arc::clone(&live.segment),
                    row: part.row,
                    keys: part.fields.into_iter().map(|(k, _)| k).collect(),
                });
            }
            dead.extend(self.release_row(part.segment));
        }
        (rows, dead)
    }

    /// One row of `segment` is no longer needed; returns the segment if none is.
    pub(crate) fn release_row(&mut self, segment: u64) -> Option<Arc<Segment>> {
        let live = self.segments.get_mut(&segment)?;
        live.live = live.live.saturating_sub(1);
        if live.live > 0 {
            return None;
        }
        self.counters.segments_deleted += 1;
        self.segments.remove(&segment).map(|l| l.segment)
    }

    /// The figures `Stats::spill` reports.
    pub(crate) fn stats(&self) -> super::SpillStats {
        let c = &self.counters;
        super::SpillStats {
            spilled_now: self.spilled_now,
            live_segments: self.segments.len() as u64,
            spilled_samples: c.spilled_samples,
            spilled_bytes: c.spilled_bytes,
            segments_written: c.segments_written,
            segments_deleted: c.segments_deleted,
            loads: c.loaded_samples,
            shared_loads: c.shared_loads,
            failures: c.failures,
        }
    }

    /// Registers loads of the fields `keys` of `slots`' samples (each `(slot,
    /// generation)`), reusing loads in flight that cover them. Returns per slot the cell
    /// to wait on (`None`: nothing of `keys` is spilled), and the loads to start.
    pub(crate) fn register(
        &mut self,
        slots: impl IntoIterator<Item = (u32, u32)>,
        keys: &[std::sync::Arc<str>],
        ahead: bool,
        plan: &mut LoadPlan,
    ) -> Vec<Option<Arc<LoadCell>>> {
        let mut cells = Vec::new();
        for (slot, generation) in slots {
            let wanted: Vec<FieldKey> = self
                .parts(slot)
                .iter()
                .flat_map(|p| p.fields.iter().map(|(k, _)| k))
                .filter(|k| keys.iter().any(|w| **w == *k.as_str()))
                .cloned()
                .collect();
            if wanted.is_empty() {
                cells.push(None);
                continue;
            }
            if let Some(l) = self.loading.get(&slot) {
                let covers = wanted.iter().all(|k| l.keys.contains(k));
                if l.generation == generation && covers {
                    if !ahead {
                        self.counters.shared_loads += 1;
                    }
                    cells.push(Some(Arc::clone(&l.cell)));
                    continue;
                }
            }
            let cell = Arc::new(LoadCell::new());
            let mut requests = Vec::new();
            for part in self.parts(slot) {
                let keys: Vec<FieldKey> = part
                    .fields
                    .iter()
                    .map(|(k, _)| k)
                    .filter(|k| wanted.contains(k))
                    .cloned()
                    .collect();
                let segment = self.segments.get(&part.segment).map(|l| &l.segment);
                if let (false, Some(segment)) = (keys.is_empty(), segment) {
                    requests.push(Request {
                        slot,
                        segment: Arc::clone(segment),
                        row: part.row,
                        keys,
                    });
                }
            }
            self.loading.insert(
                slot,
                Loading {
                    generation,
                    keys: wanted,
                    cell: Arc::clone(&cell),
                },
            );
            self.counters.loaded_samples += 1;
            plan.loads.push((Arc::clone(&cell), requests));
            cells.push(Some(cell));
        }
        cells
    }

    /// A get has taken the load of `slot` (the sample is leased; a later load reads it
    /// again, with whatever patches came since).
    pub(crate) fn taken(&mut self, slot: u32, cell: &Arc<LoadCell>) {
        if self
            .loading
            .get(&slot)
            .is_some_and(|l| Arc::ptr_eq(&l.cell, cell))
        {
            self.loading.remove(&slot);
        }
    }

    /// Drops a failed load's registration, so the next get reads again.
    fn failed(&mut self, slot: u32, cell: &Arc<LoadCell>) {
        self.taken(slot, cell);
    }
}

/// The sample a batch gets: the loaded fields, overlaid with those the stub holds (added
/// since the spill, so newer).
pub(crate) fn merge(stub: &Sample, loaded: Fields) -> Sample {
    let mut fields = loaded;
    for (k, t) in stub.fields.iter() {
        fields.set(k.clone(), t.clone());
    }
    Sample {
        id: stub.id.clone(),
        birth: stub.birth,
        fields,
        meta: stub.meta.clone(),
    }
}

impl Shared {
    /// Starts the spiller task if the buffer spills and it is not running yet. Called by
    /// puts, which run inside a tokio runtime.
    pub(crate) fn start_spiller(self: &Arc<Self>, inner: &mut Inner) {
        let Some(spill) = inner.spill.as_mut() else {
            return;
        };
        if spill.started {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        spill.started = true;
        let weak = Arc::downgrade(self);
        let wake = Arc::clone(&self.spill_wake);
        runtime.spawn(run_spiller(weak, wake));
    }

    /// Starts `plan`'s loads in a task (so they finish even if every get that waits for
    /// them is dropped). Call after dropping the lock.
    pub(crate) fn start_loads(self: &Arc<Self>, plan: LoadPlan, store: Arc<dyn SpillStore>) {
        if plan.is_empty() {
            return;
        }
        let weak = Arc::downgrade(self);
        let task = run_loads(weak, store, plan);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(task);
            }
            Err(_) => tracing::warn!("spilled samples selected outside a tokio runtime"),
        }
    }

    /// One spill round: writes spillable samples until the resident bytes are back under
    /// the budget's low mark (at most one segment's worth). Returns whether it wrote.
    async fn spill_round(self: &Arc<Self>) -> Round {
        let (store, picked) = {
            let mut inner = self.lock();
            let excess = inner.table.residency.excess();
            let Some(spill) = inner.spill.as_ref() else {
                return Round::Idle;
            };
            let store = Arc::clone(&spill.store);
            if excess == 0 {
                return Round::Idle;
            }
            let slots = inner.table.pick_spill(excess.min(SEGMENT_BYTES));
            let picked: Vec<(u32, u32, Arc<Sample>)> = slots
                .iter()
                .filter_map(|&s| {
                    let generation = inner.table.stored_generation(s as usize)?;
                    let sample = inner.samples.get(s as usize)?.as_ref()?;
                    Some((s, generation, Arc::clone(sample)))
                })
                .collect();
            if picked.len() != slots.len() {
                // Cannot happen (spillable slots are stored); give every slot back.
                for &s in &slots {
                    let resident = inner.table.residency.per_slot[s as usize];
                    inner.table.end_spill(s as usize, resident);
                }
                return Round::Idle;
            }
            if picked.is_empty() {
                return Round::Idle;
            }
            (store, picked)
        };
        let rows = picked.iter().map(|(_, _, s)| s.fields.clone()).collect();
        let written = store.write(rows).await;
        let mut inner = self.lock();
        let result = match written {
            Ok(segment) => {
                adopt(&mut inner, &segment, &picked);
                Round::Wrote
            }
            Err(e) => {
                tracing::warn!(error = %e, samples = picked.len(), "spill write failed");
                for (s, _, _) in &picked {
                    let resident = inner.table.residency.per_slot[*s as usize];
                    inner.table.end_spill(*s as usize, resident);
                }
                if let Some(spill) = inner.spill.as_mut() {
                    spill.counters.failures += 1;
                    spill.failure = Some(e);
                }
                Round::Failed
            }
        };
        drop(inner);
        self.notify(Wake {
            rpcs: 0,
            space: true,
            spill: false,
        });
        result
    }

    /// Reads back the spilled fields of freed samples, hands the whole samples to the sink
    /// and deletes the segments left without a live row, in a task; returns `freed` when
    /// there is nothing to read (the caller hands it over at once).
    pub(crate) fn hand_over_spilled(&self, mut freed: super::Freed) -> Option<super::Freed> {
        let dead = std::mem::take(&mut freed.dead_segments);
        let store = self.lock().spill.as_ref().map(|s| Arc::clone(&s.store))?;
        let runtime = tokio::runtime::Handle::try_current().ok();
        if freed.spilled.is_empty() || runtime.is_none() {
            if !freed.spilled.is_empty() {
                tracing::warn!("freed spilled samples outside a tokio runtime: handed over without their spilled fields");
            }
            freed.spilled.clear();
            self.delete_segments(&store, dead);
            return Some(freed);
        }
        let Some(sink) = self.freed_sink.clone() else {
            freed.spilled.clear();
            self.delete_segments(&store, dead);
            return Some(freed);
        };
        let read_by = self.read_by.clone();
        let handover = Arc::clone(&self.handover);
        *handover.pending.lock() += 1;
        let task = async move {
            let spilled = std::mem::take(&mut freed.spilled);
            let mut by_id: HashMap<crate::sample::SampleId, Fields> = HashMap::new();
            for (id, rows) in spilled {
                let mut fields = Fields::default();
                for r in rows {
                    match store
                        .read(Arc::clone(&r.segment), vec![r.row], r.keys)
                        .await
                    {
                        Ok(mut got) => {
                            for (k, t) in got.pop().unwrap_or_default().iter() {
                                fields.set(k.clone(), t.clone());
                            }
                        }
                        Err(e) => tracing::warn!(
                            error = %e, id = %id,
                            "spilled fields of a freed sample could not be read back"
                        ),
                    }
                }
                by_id.insert(id, fields);
            }
            for list in [
                &mut freed.consumed,
                &mut freed.stale,
                &mut freed.evicted,
                &mut freed.filtered,
            ] {
                for sample in list.iter_mut() {
                    if let Some(fields) = by_id.remove(&sample.id) {
                        *sample = Arc::new(merge(sample, fields));
                    }
                }
            }
            super::freed::hand_to_sink(&*sink, &read_by, freed);
            delete_all(&*store, dead).await;
            *handover.pending.lock() -= 1;
            handover.done.notify_waiters();
        };
        if let Some(runtime) = runtime {
            runtime.spawn(task);
        }
        None
    }

    /// Waits until every freed spilled sample was handed to the sink.
    pub(crate) async fn handed_over(&self) {
        loop {
            let mut notified = pin!(self.handover.done.notified());
            notified.as_mut().enable();
            if *self.handover.pending.lock() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Waits for the loads of a batch's spilled inputs and puts the loaded fields in.
    pub(crate) async fn fill_batch(&self, batch: &mut Batch, loads: Vec<BatchLoad>) -> Result<()> {
        let mut results = Vec::with_capacity(loads.len());
        for load in &loads {
            results.push(load.cell.wait().await);
        }
        self.put_loaded(batch, loads, results)
    }

    /// [`Self::fill_batch`] without waiting: `false` (and the batch released) unless every
    /// load is done.
    pub(crate) fn fill_batch_now(&self, batch: &mut Batch, loads: Vec<BatchLoad>) -> Result<bool> {
        let mut results = Vec::with_capacity(loads.len());
        for load in &loads {
            match load.cell.result.lock().clone() {
                Some(result) => results.push(result),
                None => return Ok(false),
            }
        }
        self.put_loaded(batch, loads, results).map(|()| true)
    }

    fn put_loaded(
        &self,
        batch: &mut Batch,
        loads: Vec<BatchLoad>,
        results: Vec<Result<Fields>>,
    ) -> Result<()> {
        {
            let mut inner = self.lock();
            if let Some(spill) = inner.spill.as_mut() {
                for load in &loads {
                    spill.taken(load.slot, &load.cell);
                }
            }
        }
        for (load, result) in loads.iter().zip(results) {
            batch.fill(load.index, result?);
        }
        Ok(())
    }

    /// Deletes segments no sample needs any more (in the background).
    /// `flush` waits for the deletes.
    pub(crate) fn delete_segments(&self, store: &Arc<dyn SpillStore>, dead: Vec<Arc<Segment>>) {
        if dead.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                segments = dead.len(),
                "spill segments left: no runtime to delete them"
            );
            return;
        };
        let store = Arc::clone(store);
        let handover = Arc::clone(&self.handover);
        *handover.pending.lock() += 1;
        runtime.spawn(async move {
            delete_all(&*store, dead).await;
            *handover.pending.lock() -= 1;
            handover.done.notify_waiters();
        });
    }
}

/// Deletes segments, logging the ones that would not go.
async fn delete_all(store: &dyn SpillStore, dead: Vec<Arc<Segment>>) {
    for segment in dead {
        if let Err(e) = store.delete(Arc::clone(&segment)).await {
            tracing::warn!(error = %e, path = %segment.path, "spill segment not deleted");
        }
    }
}

/// Under the lock, after a segment write: swaps in the stub of every written sample that is
/// still the one written, and ends every spill.
fn adopt(inner: &mut Inner, segment: &Arc<Segment>, picked: &[(u32, u32, Arc<Sample>)]) {
    let mut live = 0u32;
    let mut bytes = 0u64;
    for (row, (s, generation, written)) in picked.iter().enumerate() {
        let slot = *s as usize;
        let current = inner.samples.get(slot).and_then(Option::as_ref);
        let unchanged = inner.table.stored_generation(slot) == Some(*generation)
            && current.is_some_and(|c| Arc::ptr_eq(c, written));
        if !unchanged {
            // Amended or freed meanwhile: the row is dead on arrival.
            let resident = inner.table.residency.per_slot[slot];
            inner.table.end_spill(slot, resident);
            continue;
        }
        let fields: Vec<(FieldKey, u64)> = written
            .fields
            .iter()
            .map(|(k, t)| (k.clone(), t.nbytes() as u64))
            .collect();
        bytes += fields.iter().map(|(_, b)| b).sum::<u64>();
        let stub = Sample {
            id: written.id.clone(),
            birth: written.birth,
            fields: Fields::default(),
            meta: written.meta.clone(),
        };
        if let Some(entry) = inner.samples.get_mut(slot) {
            *entry = Some(Arc::new(stub));
        }
        if let Some(spill) = inner.spill.as_mut() {
            if let Some(parts) = spill.parts.get_mut(slot) {
                if parts.is_empty() {
                    spill.spilled_now += 1;
                }
                parts.push(SpillPart {
                    segment: segment.id,
                    row: row as u32,
                    fields,
                });
            }
        }
        inner.table.end_spill(slot, 0);
        live += 1;
    }
    let Some(spill) = inner.spill.as_mut() else {
        return;
    };
    spill.counters.segments_written += 1;
    spill.counters.spilled_samples += u64::from(live);
    spill.counters.spilled_bytes += bytes;
    spill.failure = None;
    if live > 0 {
        spill.segments.insert(
            segment.id,
            LiveSegment {
                segment: Arc::clone(segment),
                live,
            },
        );
    } else {
        // Every written sample changed meanwhile: delete with the next freed samples.
        spill.counters.segments_deleted += 1;
        spill.dead.push(Arc::clone(segment));
    }
}

enum Round {
    Idle,
    Wrote,
    Failed,
}

/// The spiller: spills while the buffer is over its budget, sleeps on `wake` otherwise;
/// ends when the buffer is dropped.
async fn run_spiller(weak: Weak<Shared>, wake: Arc<Notify>) {
    let mut backoff = Duration::from_millis(20);
    loop {
        let mut notified = pin!(wake.notified());
        notified.as_mut().enable();
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let round = shared.spill_round().await;
        drop(shared);
        match round {
            Round::Wrote => backoff = Duration::from_millis(20),
            Round::Idle => notified.await,
            Round::Failed => {
                // Retry: the store may come back. Waiting putters have the error already.
                let _ = tokio::time::timeout(backoff, notified).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Reads every registered load, segment by segment, and publishes each sample's fields.
async fn run_loads(weak: Weak<Shared>, store: Arc<dyn SpillStore>, plan: LoadPlan) {
    // Group the reads by segment: one read per segment, rows in order.
    let mut by_segment: HashMap<u64, (Arc<Segment>, Vec<(usize, usize)>)> = HashMap::new();
    for (i, (_, requests)) in plan.loads.iter().enumerate() {
        for (j, r) in requests.iter().enumerate() {
            by_segment
                .entry(r.segment.id)
                .or_insert_with(|| (Arc::clone(&r.segment), Vec::new()))
                .1
                .push((i, j));
        }
    }
    let mut loaded: Vec<Result<Fields>> =
        plan.loads.iter().map(|_| Ok(Fields::default())).collect();
    let mut segments: Vec<_> = by_segment.into_values().collect();
    segments.sort_by_key(|(s, _)| s.id);
    for (segment, wants) in segments {
        let mut keys: Vec<FieldKey> = Vec::new();
        let mut rows = Vec::with_capacity(wants.len());
        for &(i, j) in &wants {
            let r = &plan.loads[i].1[j];
            rows.push(r.row);
            for k in &r.keys {
                if !keys.contains(k) {
                    keys.push(k.clone());
                }
            }
        }
        match store.read(Arc::clone(&segment), rows, keys).await {
            Ok(fields) => {
                for (&(i, j), got) in wants.iter().zip(fields) {
                    let want = &plan.loads[i].1[j].keys;
                    if let Some(Ok(acc)) = loaded.get_mut(i) {
                        for (k, t) in got.iter() {
                            if want.contains(k) {
                                acc.set(k.clone(), t.clone());
                            }
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %segment.path, "spill read failed");
                for &(i, _) in &wants {
                    if let Some(slot) = loaded.get_mut(i) {
                        *slot = Err(e.clone());
                    }
                }
            }
        }
    }
    // Failed loads leave the registry first, so a retry reads again.
    if let Some(shared) = weak.upgrade() {
        let mut inner = shared.lock();
        if let Some(spill) = inner.spill.as_mut() {
            for ((cell, requests), result) in plan.loads.iter().zip(&loaded) {
                if let (Err(_), Some(r)) = (result, requests.first()) {
                    spill.failed(r.slot, cell);
                }
            }
        }
    }
    for ((cell, _), result) in plan.loads.iter().zip(loaded) {
        cell.finish(result);
    }
}
