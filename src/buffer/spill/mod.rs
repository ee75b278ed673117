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
//! Files: `load.rs` (loads for gets and read-ahead), `spiller.rs` (the spill task),
//! `handover.rs` (freed spilled samples, segment deletes). This folder is the buffer's
//! side of spilling, over the [`SpillStore`] trait; the storage side (how a segment is laid
//! out, written and read back) is `persist/spill/`, and `docs/spill.md` is the design of
//! both with its measurements.
//!
//! # Locking
//!
//! `SpillState` lives in `Inner`, under the buffer's lock. Segment writes, reads and
//! deletes run outside it; a load's result is published through its [`LoadCell`]
//! (its own small mutex and `Notify`, taken without the buffer's lock held).

// Without `persist` no spill store exists; the buffer's side of spilling stays compiled.
#![cfg_attr(not(feature = "persist"), allow(dead_code))]

mod handover;
mod int_map;
mod load;
#[cfg(test)]
mod retired_tests;
mod spiller;
#[cfg(test)]
mod tests;

pub(crate) use handover::{use_loaded, FreedSpill, HandOver, LoadedFields};
use load::Loading;
pub(crate) use load::{read_back, BatchLoad, LoadCell, LoadPlan};

use crate::error::{Error, Result};
use crate::sample::{FieldKey, Fields, Sample};
use crate::state::Generation;
use crate::sync::Arc;
use int_map::IntMap;
use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

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
    /// The handle of segment `id` of `rows` rows, written earlier (by another process).
    fn segment(&self, id: u64, rows: u32) -> Arc<Segment>;
}

/// Spilled fields of one sample that share a segment row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SpillPart {
    pub(crate) segment: u64,
    /// Rows in the segment (what a restored buffer needs to name it).
    pub(crate) segment_rows: u32,
    pub(crate) row: u32,
    /// Field names and tensor bytes.
    pub(crate) fields: Vec<(FieldKey, u64)>,
}

/// Where some spilled fields of a sample are: what one read asks a segment for.
#[derive(Debug, Clone)]
pub(crate) struct SpilledRow {
    /// The sample's slot (when the row was found; a freed sample's slot may hold another
    /// sample by the time the row is read).
    pub(super) slot: u32,
    pub(super) segment: Arc<Segment>,
    pub(super) row: u32,
    /// The fields to read.
    pub(super) keys: Vec<FieldKey>,
}

/// A segment and how many of its rows a stored sample still needs.
#[derive(Debug)]
struct LiveSegment {
    pub(super) segment: Arc<Segment>,
    /// The slots whose samples have a part in it.
    pub(super) members: BTreeSet<u32>,
}

impl LiveSegment {
    /// Whether few enough of its rows are live that rewriting them saves space.
    fn sparse(&self) -> bool {
        (self.members.len() as u64) * REWRITE_BELOW_ONE_IN < u64::from(self.segment.rows)
    }
}

/// The spilled fields of a sample (its `parts`) among an RPC's input `keys`.
fn spilled_inputs<'a>(
    parts: &'a [SpillPart],
    keys: &'a [Arc<str>],
) -> impl Iterator<Item = &'a FieldKey> {
    parts
        .iter()
        .flat_map(|p| p.fields.iter().map(|(k, _)| k))
        .filter(|k| keys.iter().any(|w| **w == *k.as_str()))
}

/// A segment with fewer than one live row in this many is rewritten with its live rows.
const REWRITE_BELOW_ONE_IN: u64 = 4;

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
    pub(crate) segments_rewritten: u64,
}

/// Spill bookkeeping, under the buffer's lock.
#[derive(Debug)]
pub(crate) struct SpillState {
    pub(crate) store: Arc<dyn SpillStore>,
    /// Per slot: the spilled parts of its sample (empty while it is all in memory).
    parts: Vec<Vec<SpillPart>>,
    segments: IntMap<u64, LiveSegment>,
    loading: IntMap<u32, Loading>,
    /// The last failed segment write, until a write succeeds: putters waiting for room
    /// get it instead of waiting on a store that keeps failing.
    pub(crate) failure: Option<Error>,
    started: bool,
    /// Stored samples with at least one spilled part.
    spilled_now: u64,
    /// Live segments with few live rows, to rewrite.
    sparse: BTreeSet<u64>,
    /// Sparse segments left alone because a live row was being loaded or leased: those
    /// rows are likely about to be freed (a `Fifo` drain reaches a segment's last rows
    /// right after its first), and rewriting them would read and write data about to go.
    /// Queued again by the next free of one of their rows or the next spill write.
    deferred: BTreeSet<u64>,
    /// A segment became sparse since the spiller last looked.
    pub(crate) compact_due: bool,
    /// Rewritten segments waiting for their last reads to finish before deletion.
    retired: Vec<Arc<Segment>>,
    pub(crate) counters: SpillCounters,
}

/// Most bytes one spill round writes into one segment.
const SEGMENT_BYTES: u64 = 64 << 20;

impl SpillState {
    pub(crate) fn new(store: Arc<dyn SpillStore>, capacity: usize) -> Self {
        Self {
            store,
            parts: (0..capacity).map(|_| Vec::new()).collect(),
            segments: IntMap::default(),
            loading: IntMap::default(),
            failure: None,
            started: false,
            spilled_now: 0,
            sparse: BTreeSet::new(),
            deferred: BTreeSet::new(),
            compact_due: false,
            retired: Vec::new(),
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
        let emptied = strike(parts, keys);
        // A load registered before the patch read the old values of keys it replaced;
        // gets that lease the sample from now on must read again.
        self.loading.remove(&slot);
        if had && parts.is_empty() {
            self.spilled_now -= 1;
        }
        for segment in emptied {
            self.release_row(segment, slot);
        }
    }

    /// Forgets the spill state of a freed slot; returns where its spilled fields are (if
    /// `want_rows`: for a sink that wants the whole sample). Segments left without a live
    /// row are retired.
    pub(crate) fn forget(&mut self, slot: u32, want_rows: bool) -> Vec<SpilledRow> {
        self.loading.remove(&slot);
        let parts = self
            .parts
            .get_mut(slot as usize)
            .map(std::mem::take)
            .unwrap_or_default();
        if !parts.is_empty() {
            self.spilled_now -= 1;
        }
        let mut rows = Vec::new();
        for part in parts {
            if let (true, Some(live)) = (want_rows, self.segments.get(&part.segment)) {
                rows.push(SpilledRow {
                    slot,
                    segment: Arc::clone(&live.segment),
                    row: part.row,
                    keys: part.fields.into_iter().map(|(k, _)| k).collect(),
                });
            }
            self.release_row(part.segment, slot);
        }
        rows
    }

    /// The row of `slot`'s sample in `segment` is no longer needed; a segment no row is
    /// needed of is retired (deleted once no read holds it), one left sparse is queued for
    /// a rewrite.
    pub(crate) fn release_row(&mut self, segment: u64, slot: u32) {
        let Some(live) = self.segments.get_mut(&segment) else {
            return;
        };
        live.members.remove(&slot);
        if !live.members.is_empty() {
            if live.sparse() {
                if live.members.iter().any(|s| self.loading.contains_key(s)) {
                    self.deferred.insert(segment);
                } else if self.sparse.insert(segment) {
                    self.deferred.remove(&segment);
                    self.compact_due = true;
                }
            }
            return;
        }
        self.sparse.remove(&segment);
        self.deferred.remove(&segment);
        self.counters.segments_deleted += 1;
        if let Some(dead) = self.segments.remove(&segment) {
            self.retired.push(dead.segment);
        }
    }

    /// The id of the next sparse segment to rewrite; segments a live row of which is
    /// loading or leased (`busy`) are deferred.
    pub(super) fn next_sparse(&mut self, busy: impl Fn(u32) -> bool) -> Option<u64> {
        while let Some(id) = self.sparse.pop_first() {
            let Some(live) = self.segments.get(&id) else {
                continue;
            };
            if live
                .members
                .iter()
                .any(|&s| busy(s) || self.loading.contains_key(&s))
            {
                self.deferred.insert(id);
                continue;
            }
            return Some(id);
        }
        None
    }

    /// Queues the deferred sparse segments again (after a spill write: the buffer has
    /// moved on since they were looked at).
    pub(super) fn requeue_deferred(&mut self) {
        if !self.deferred.is_empty() {
            self.sparse.append(&mut self.deferred);
        }
    }

    /// Segments no live row needs (all their samples freed or patched, or replaced by a
    /// rewrite) that no read holds any more, to delete: the `Arc` count is the number of
    /// reads in flight (loads, and freed samples being read back for the sink), each of
    /// which takes what it leaves behind when it ends.
    pub(crate) fn take_retired(&mut self) -> Vec<Arc<Segment>> {
        let (done, busy) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(|s| Arc::strong_count(s) == 1);
        self.retired = busy;
        done
    }

    /// Where the spilled fields of the sample in `slot` are.
    pub(crate) fn rows_of(&self, slot: u32) -> Vec<SpilledRow> {
        self.parts(slot)
            .iter()
            .filter_map(|p| {
                Some(SpilledRow {
                    slot,
                    segment: Arc::clone(&self.segments.get(&p.segment)?.segment),
                    row: p.row,
                    keys: p.fields.iter().map(|(k, _)| k.clone()).collect(),
                })
            })
            .collect()
    }

    /// Gives a restored sample in `slot` its spilled parts.
    pub(crate) fn restore(&mut self, slot: u32, parts: Vec<SpillPart>) {
        if parts.is_empty() {
            return;
        }
        for p in &parts {
            let store = &self.store;
            self.segments
                .entry(p.segment)
                .or_insert_with(|| LiveSegment {
                    segment: store.segment(p.segment, p.segment_rows),
                    members: BTreeSet::new(),
                })
                .members
                .insert(slot);
        }
        if let Some(mine) = self.parts.get_mut(slot as usize) {
            *mine = parts;
            self.spilled_now += 1;
        }
    }

    /// The figures `Stats::spill` reports (`undeleted`: the segments whose delete failed,
    /// which `HandOver` keeps).
    pub(crate) fn stats(&self, undeleted: u64) -> super::SpillStats {
        let c = &self.counters;
        super::SpillStats {
            spilled_now: self.spilled_now,
            live_segments: self.segments.len() as u64,
            spilled_samples: c.spilled_samples,
            spilled_bytes: c.spilled_bytes,
            segments_written: c.segments_written,
            segments_deleted: c.segments_deleted,
            undeleted_segments: undeleted,
            segments_rewritten: c.segments_rewritten,
            loads: c.loaded_samples,
            shared_loads: c.shared_loads,
            failures: c.failures,
        }
    }

    /// Registers loads of the fields `keys` of `slots`' samples (each `(slot,
    /// generation)`), reusing loads in flight that cover them. Returns per slot the cell
    /// to wait on (`None`: nothing of `keys` is spilled), or nothing for a read-ahead
    /// (`ahead`), and adds the loads to start to `plan`.
    pub(crate) fn register(
        &mut self,
        slots: impl IntoIterator<Item = (u32, Generation)>,
        keys: &[Arc<str>],
        ahead: bool,
        plan: &mut LoadPlan,
    ) -> Vec<Option<Arc<LoadCell>>> {
        let slots = slots.into_iter();
        let mut cells = Vec::with_capacity(if ahead { 0 } else { slots.size_hint().0 });
        for (slot, generation) in slots {
            let parts = self.parts(slot);
            if spilled_inputs(parts, keys).next().is_none() {
                if !ahead {
                    cells.push(None);
                }
                continue;
            }
            // Most read-ahead registrations find the load already registered: checked
            // without allocating.
            if let Some(l) = self.loading.get(&slot) {
                let covers = spilled_inputs(parts, keys).all(|k| l.keys.contains(k));
                if l.generation == generation && covers {
                    if !ahead {
                        self.counters.shared_loads += 1;
                        cells.push(Some(Arc::clone(&l.cell)));
                    }
                    continue;
                }
            }
            let wanted: Vec<FieldKey> = spilled_inputs(parts, keys).cloned().collect();
            let mut requests = Vec::with_capacity(parts.len());
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
                    requests.push(SpilledRow {
                        slot,
                        segment: Arc::clone(segment),
                        row: part.row,
                        keys,
                    });
                }
            }
            let rows = requests.iter().map(|r| (r.segment.id, r.row)).collect();
            let cell = Arc::new(LoadCell::new(rows));
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
            if !ahead {
                plan.urgent = plan.loads.len();
            }
            if !ahead {
                cells.push(Some(cell));
            }
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

/// Fields smaller than this stay in memory: rewards, flags, ids and lengths cost little,
/// and metrics and `Prioritized` selection read them without I/O.
pub(crate) const MIN_SPILL_FIELD_BYTES: usize = 1024;

/// Whether a field is spilled (and counted against the memory budget).
pub(crate) fn spills(t: &crate::tensor::Tensor) -> bool {
    t.nbytes() >= MIN_SPILL_FIELD_BYTES
}

/// The bytes of `sample` that count against the memory budget: its fields large enough to
/// spill.
pub(crate) fn spillable_bytes(sample: &Sample) -> u64 {
    sample
        .fields
        .iter()
        .filter(|(_, t)| spills(t))
        .map(|(_, t)| t.nbytes() as u64)
        .sum()
}

/// Strikes `keys` from `parts`' field lists, dropping parts left empty; returns the
/// segments of the dropped parts.
pub(crate) fn strike(parts: &mut Vec<SpillPart>, keys: &[&str]) -> Vec<u64> {
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
    emptied
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
