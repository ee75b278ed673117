//! Loads of spilled fields: registered under the buffer's lock with the lease (and the
//! read-ahead), read by a task outside it, published through each sample's [`LoadCell`].

use super::super::{Batch, Shared};
use super::int_map::IntMap;
use super::{LoadedFields, Segment, SpillStore, SpilledRow};
use crate::error::{Error, ErrorSource, Result, StorageKind};
use crate::sample::{FieldKey, Fields};
use crate::state::Generation;
use crate::sync::Weak;
use crate::sync::{Arc, Mutex, Notify};
use std::pin::pin;

/// One load of a sample's spilled fields, shared by every get that needs them.
#[derive(Debug)]
pub(crate) struct LoadCell {
    result: Mutex<Option<Result<Fields>>>,
    done: Notify,
    /// The segment rows the load reads (`(segment id, row)`).
    rows: Vec<(u64, u32)>,
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

    /// A load of `rows` (`(segment id, row)`).
    pub(super) fn new(rows: Vec<(u64, u32)>) -> Self {
        Self {
            result: Mutex::new(None),
            done: Notify::new(),
            rows,
        }
    }

    fn finish(&self, result: Result<Fields>) {
        *self.result.lock() = Some(result);
        self.done.notify_waiters();
    }
}

/// A load in flight (or done and not yet taken) for the sample in one slot.
#[derive(Debug, Clone)]
pub(super) struct Loading {
    pub(super) generation: Generation,
    pub(super) keys: Vec<FieldKey>,
    pub(super) cell: Arc<LoadCell>,
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
    /// Per sample to load: its cell and its reads, one per part. The first `urgent` are
    /// samples a get waits for; the rest are read-ahead.
    pub(super) loads: Vec<(Arc<LoadCell>, Vec<SpilledRow>)>,
    pub(super) urgent: usize,
}

impl LoadPlan {
    pub(crate) fn is_empty(&self) -> bool {
        self.loads.is_empty()
    }
}

impl Shared {
    /// Starts `plan`'s loads in a task (so they finish even if every get that waits for
    /// them is dropped). Call after dropping the lock.
    pub(crate) fn start_loads(self: &Arc<Self>, plan: LoadPlan, store: Arc<dyn SpillStore>) {
        if plan.is_empty() {
            return;
        }
        let weak = Arc::downgrade(self);
        // The loads a get waits for are read first, then the read-ahead: reading both at
        // once would share the cores between them and delay the batch (a trainer's first
        // get registers three batches).
        let LoadPlan { mut loads, urgent } = plan;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Nothing would ever run the loads: fail them (and drop their registrations),
            // or every later get would wait for them forever.
            self.fail_loads(loads);
            return;
        };
        let ahead = loads.split_off(urgent.min(loads.len()));
        // `flush` waits for loads too: a segment freed while a load still holds it is
        // deleted when the load ends.
        let busy = self.handover.busy();
        let task = async move {
            run_loads(Weak::clone(&weak), Arc::clone(&store), loads).await;
            run_loads(weak, store, ahead).await;
            drop(busy);
        };
        runtime.spawn(task);
    }

    /// Fails loads that cannot run (no runtime): each leaves the registry, so a get inside
    /// a runtime reads again, and whoever waits for one gets [`Error::NoRuntime`].
    fn fail_loads(&self, loads: Vec<(Arc<LoadCell>, Vec<SpilledRow>)>) {
        tracing::warn!(
            samples = loads.len(),
            "spilled samples selected outside a tokio runtime: their loads fail"
        );
        {
            let mut inner = self.lock();
            if let Some(spill) = inner.spill.as_mut() {
                for (cell, rows) in &loads {
                    if let Some(r) = rows.first() {
                        spill.failed(r.slot, cell);
                    }
                }
            }
        }
        for (cell, _) in loads {
            cell.finish(Err(Error::NoRuntime {
                what: "loading spilled samples",
            }));
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
            let fields = result?;
            if self.freed_sink.is_some() {
                // Kept for the sink, should the commit free the sample (no read back).
                batch.keep_loaded(LoadedFields {
                    slot: load.slot,
                    rows: load.cell.rows.clone(),
                    fields: fields.clone(),
                });
            }
            batch.fill(load.index, fields);
        }
        Ok(())
    }
}

/// A segment read in flight: on the runtime, or (without one) awaited in place.
enum Read {
    Spawned(tokio::task::JoinHandle<Result<Vec<Fields>>>),
    Inline(super::SpillFuture<Vec<Fields>>),
}

/// A segment and the reads of it: `(load, request)` indexes into a plan.
type SegmentReads = (Arc<Segment>, Vec<(usize, usize)>);

/// Reads back the spilled fields of several samples (`samples[i]`: where sample `i`'s
/// are), with one read per segment, as loads do; returns each sample's fields or the
/// error of a read it needed. For samples outside the registry of loads: freed ones
/// handed to the sink, and snapshots of the contents.
pub(crate) async fn read_back(
    store: &Arc<dyn SpillStore>,
    samples: Vec<Vec<SpilledRow>>,
) -> Vec<Result<Fields>> {
    let loads: Vec<(Arc<LoadCell>, Vec<SpilledRow>)> = samples
        .into_iter()
        .map(|rows| (Arc::new(LoadCell::new(Vec::new())), rows))
        .collect();
    let cells: Vec<Arc<LoadCell>> = loads.iter().map(|(c, _)| Arc::clone(c)).collect();
    // No buffer: a failed read leaves no registration behind.
    run_loads(Weak::new(), Arc::clone(store), loads).await;
    let mut out = Vec::with_capacity(cells.len());
    for cell in cells {
        // Finished: `run_loads` publishes every load before it returns.
        out.push(cell.wait().await);
    }
    out
}

/// Reads every registered load, segment by segment, and publishes each sample's fields
/// as soon as the reads it needs are in. `weak` is the buffer whose registry failed
/// loads leave (dangling for [`read_back`]).
async fn run_loads(
    weak: Weak<Shared>,
    store: Arc<dyn SpillStore>,
    loads: Vec<(Arc<LoadCell>, Vec<SpilledRow>)>,
) {
    if loads.is_empty() {
        return;
    }
    // Group the reads by segment: one read per segment, rows in order.
    let mut by_segment: IntMap<u64, SegmentReads> = IntMap::default();
    for (i, (_, requests)) in loads.iter().enumerate() {
        for (j, r) in requests.iter().enumerate() {
            by_segment
                .entry(r.segment.id)
                .or_insert_with(|| (Arc::clone(&r.segment), Vec::new()))
                .1
                .push((i, j));
        }
    }
    let mut loaded: Vec<Result<Fields>> = loads.iter().map(|_| Ok(Fields::default())).collect();
    // Reads outstanding per load; a load is published when its count reaches zero.
    let mut outstanding: Vec<usize> = loads.iter().map(|(_, r)| r.len()).collect();
    let mut published = vec![false; loads.len()];
    let mut segments: Vec<_> = by_segment.into_values().collect();
    // Reads start and are gathered in the order of the loads: the order the RPC takes the
    // samples in. (Under `Fifo` the oldest samples, which go first, are in the newest
    // segments.)
    segments.sort_by_key(|(s, wants)| (wants.first().map(|&(i, _)| i), s.id));
    // Every segment is read at once (the reads wait on storage, not on this core).
    let mut reads = Vec::with_capacity(segments.len());
    for (segment, wants) in segments {
        let mut keys: Vec<FieldKey> = Vec::new();
        let mut rows = Vec::with_capacity(wants.len());
        for &(i, j) in &wants {
            let r = &loads[i].1[j];
            rows.push(r.row);
            for k in &r.keys {
                if !keys.contains(k) {
                    keys.push(k.clone());
                }
            }
        }
        let read = store.read(Arc::clone(&segment), rows, keys);
        let read = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => Read::Spawned(runtime.spawn(read)),
            Err(_) => Read::Inline(read),
        };
        reads.push((segment, wants, read));
    }
    for (segment, wants, read) in reads {
        let result = match read {
            Read::Spawned(task) => task.await.unwrap_or_else(|e| {
                Err(Error::Storage {
                    url: String::new(),
                    path: segment.path.clone(),
                    kind: StorageKind::Other,
                    detail: format!("spill read task ended: {e}"),
                    source: Some(ErrorSource(Arc::new(e))),
                })
            }),
            Read::Inline(read) => read.await,
        };
        match result {
            Ok(fields) => {
                for (&(i, j), got) in wants.iter().zip(fields) {
                    let want = &loads[i].1[j];
                    // Every key the sample spilled here must come back: a missing one is
                    // damage the segment's footer or levels hid, never a field to drop.
                    let lost = want.keys.iter().find(|k| got.get(k.as_str()).is_none());
                    let Some(slot) = loaded.get_mut(i) else {
                        continue;
                    };
                    if let Some(k) = lost {
                        let e = Error::Corrupt {
                            url: String::new(),
                            path: segment.path.clone(),
                            detail: format!("row {} lacks its spilled field `{k}`", want.row),
                            source: None,
                        };
                        tracing::warn!(error = %e, "spill read incomplete");
                        *slot = Err(e);
                    } else if let Ok(acc) = slot {
                        for (k, t) in got {
                            if want.keys.contains(&k) {
                                acc.set(k, t);
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
        // Loads whose reads are all in, and succeeded, are published now: a get waiting
        // for them need not wait for the rest of the plan.
        for &(i, _) in &wants {
            let Some(left) = outstanding.get_mut(i) else {
                continue;
            };
            *left = left.saturating_sub(1);
            if let (0, Some(Ok(fields)), Some((cell, _))) = (*left, loaded.get_mut(i), loads.get(i))
            {
                cell.finish(Ok(std::mem::take(fields)));
                published[i] = true;
            }
        }
    }
    // Failed loads leave the registry first, so a retry reads again.
    if let Some(shared) = weak.upgrade() {
        let mut inner = shared.lock();
        if let Some(spill) = inner.spill.as_mut() {
            for ((cell, requests), result) in loads.iter().zip(&loaded) {
                if let (Err(_), Some(r)) = (result, requests.first()) {
                    spill.failed(r.slot, cell);
                }
            }
        }
    }
    for (((cell, _), result), published) in loads.iter().zip(loaded).zip(published) {
        if !published {
            cell.finish(result);
        }
    }
    // The reads are done: segments retired while they held them can go now.
    drop(loads);
    if let Some(shared) = weak.upgrade() {
        shared.sweep_retired(&store);
    }
}
