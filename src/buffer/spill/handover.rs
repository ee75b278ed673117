//! Freed spilled samples: their spilled fields are read back for the freed-sample sink
//! (except those the batch that freed them had loaded), and the segments left without a
//! live row are deleted once no read holds them (`SpillState::take_retired`: each read
//! sweeps them when it ends). `flush` waits for the hand-overs, the loads and the deletes.
//! A delete that fails (or cannot run yet) keeps its segment in `HandOver::undeleted`,
//! tried again by the next `flush`. No lock is held across an await: the buffer's lock
//! only to sweep, `HandOver`'s only to count work in flight and keep what was not deleted.

use super::super::{Freed, FreedSink, Journal, Shared};
use super::{merge, read_back, Segment, SpillStore, SpilledRow};
use crate::sample::{Fields, SampleId};
use crate::sync::{Arc, Mutex, Notify};
use std::collections::HashMap;
use std::pin::pin;

/// A freed sample's spilled fields for the sink: those at hand, and where the rest are.
#[derive(Debug)]
pub(crate) struct FreedSpill {
    pub(crate) id: SampleId,
    /// The rows still to read (with only the keys not at hand).
    pub(crate) rows: Vec<SpilledRow>,
    /// Fields the batch that freed the sample had loaded.
    pub(crate) at_hand: Fields,
    /// The segments of rows whose fields are all at hand. Held (as `rows` holds the others)
    /// until the sample is handed to the sink: a segment no one holds is deleted once the
    /// sink has written what it was handed, and a sample not handed yet would be recovered
    /// after a crash needing its fields from that segment.
    pub(crate) held: Vec<Arc<Segment>>,
}

/// The spilled fields a batch loaded for one of its samples, and the segment rows the
/// load read them from.
#[derive(Debug)]
pub(crate) struct LoadedFields {
    pub(crate) slot: u32,
    pub(crate) rows: Vec<(u64, u32)>,
    pub(crate) fields: Fields,
}

/// Moves into `freed` the fields `loaded` holds for them, so the sink gets them without a
/// read. A loaded field is used only for a row the load read: segments never change, a
/// spilled field lives in one row at a time, an amend takes the field out of its row (the
/// patch is in memory), and a field spilled again goes to a new row, so a key still in a
/// row the load read has the value the load got. Rows the load did not read (a sparse
/// segment rewritten since, a patch spilled anew, fields the RPC does not take) are read
/// back as before.
pub(crate) fn use_loaded(freed: &mut [FreedSpill], loaded: Vec<LoadedFields>) {
    if freed.is_empty() {
        return;
    }
    for mut l in loaded {
        let Some(f) = freed
            .iter_mut()
            .find(|f| f.rows.first().is_some_and(|r| r.slot == l.slot))
        else {
            continue;
        };
        for row in &mut f.rows {
            if !l.rows.contains(&(row.segment.id, row.row)) {
                continue;
            }
            row.keys.retain(|key| match l.fields.remove(key) {
                Some(t) => {
                    f.at_hand.set(key.clone(), t);
                    false
                }
                None => true,
            });
        }
        let (done, rows) = std::mem::take(&mut f.rows)
            .into_iter()
            .partition(|r| r.keys.is_empty());
        f.rows = rows;
        f.held
            .extend(done.into_iter().map(|r: SpilledRow| r.segment));
    }
}

/// Spill work in the background that `flush` waits for: freed samples whose spilled
/// fields are being read back for the sink, segment deletes, and loads (which delete the
/// segments freed while they held them).
#[derive(Debug, Default)]
pub(crate) struct HandOver {
    pending: Mutex<usize>,
    /// Hand-overs waiting for the sink to write what they handed it (`flush` makes the
    /// sink write rather than wait for its schedule).
    on_sink: Mutex<usize>,
    /// Segments no sample needs whose delete failed or could not run: the next `flush`
    /// tries them again (a store that failed once usually answers the next time).
    undeleted: Mutex<Vec<Arc<Segment>>>,
    done: Notify,
}

impl HandOver {
    /// Counts work `flush` waits for until the guard is dropped.
    pub(super) fn busy(self: &Arc<Self>) -> Busy {
        *self.pending.lock() += 1;
        Busy(Arc::clone(self))
    }

    /// Segments whose delete failed, left for the next `flush` to try again.
    pub(crate) fn undeleted(&self) -> usize {
        self.undeleted.lock().len()
    }

    /// Keeps segments whose delete failed for the next `flush`.
    fn keep_undeleted(&self, left: Vec<Arc<Segment>>) {
        if !left.is_empty() {
            self.undeleted.lock().extend(left);
        }
    }
}

/// Work in progress that `flush` waits for (see [`HandOver::busy`]).
pub(super) struct Busy(Arc<HandOver>);

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.pending.lock() -= 1;
        self.0.done.notify_waiters();
    }
}

impl Shared {
    /// Reads back the spilled fields of freed samples, hands the whole samples to the sink
    /// and deletes the segments left without a live row, in a task (outside a runtime: at
    /// once, with the fields at hand); returns `freed` when the buffer does not spill (the
    /// caller hands it over).
    pub(crate) fn hand_over_spilled(self: &Arc<Self>, mut freed: Freed) -> Option<Freed> {
        let dead = std::mem::take(&mut freed.dead_segments);
        let (store, journal) = {
            let inner = self.lock();
            let store = inner.spill.as_ref().map(|s| Arc::clone(&s.store))?;
            (store, inner.journal.clone())
        };
        // `spilled` is only filled when there is a sink to hand the whole samples to.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let sink = self
            .freed_sink
            .clone()
            .filter(|_| !freed.spilled.is_empty());
        // Every segment these samples' fields came from stays held until the samples are
        // with the sink (see `FreedSpill::held`); reading them back lets go of the rows.
        let holding: Vec<Arc<Segment>> = freed
            .spilled
            .iter()
            .flat_map(|f| {
                f.rows
                    .iter()
                    .map(|r| Arc::clone(&r.segment))
                    .chain(f.held.iter().cloned())
            })
            .collect();
        let (Some(runtime), Some(sink)) = (runtime, sink) else {
            // The fields at hand still go with their samples; the others cannot be read.
            let (at_hand, unread) = split_at_hand(&mut freed);
            if !unread.is_empty() {
                tracing::warn!(
                    samples = unread.len(),
                    "freed spilled samples outside a tokio runtime: handed over without the spilled fields not at hand"
                );
            }
            merge_fields(&mut freed, at_hand);
            self.hand_to_sink(freed);
            drop(holding);
            self.spawn_deletes(&store, journal, dead);
            return None;
        };
        let read_by = self.read_by.clone();
        let busy = self.handover.busy();
        let weak = Arc::downgrade(self);
        let task = async move {
            let (mut by_id, unread) = split_at_hand(&mut freed);
            let (ids, rows): (Vec<SampleId>, Vec<_>) = unread.into_iter().unzip();
            for (id, result) in ids.into_iter().zip(read_back(&store, rows).await) {
                match (result, by_id.get_mut(&id)) {
                    (Ok(fields), Some(acc)) => {
                        for (k, t) in fields {
                            acc.set(k, t);
                        }
                    }
                    (Ok(_), None) => {}
                    // The sink gets the sample with the fields at hand only.
                    (Err(e), _) => tracing::warn!(
                        error = %e, id = %id,
                        "spilled fields of a freed sample could not be read back"
                    ),
                }
            }
            merge_fields(&mut freed, by_id);
            super::super::freed::hand_to_sink(&*sink, &read_by, freed);
            drop(holding);
            let left = delete_after_sink(&busy.0, Some(sink), &*store, journal, dead).await;
            busy.0.keep_undeleted(left);
            // The reads are done: segments retired while they held them can go now.
            if let Some(shared) = weak.upgrade() {
                shared.sweep_retired(&store);
            }
            drop(busy);
        };
        runtime.spawn(task);
        None
    }

    /// Waits until every freed spilled sample was handed to the sink, and every load and
    /// delete in flight is done.
    pub(crate) async fn handed_over(&self) {
        // Segments whose delete failed before this call are tried once more, not in a
        // loop: a store that keeps failing leaves them for the next flush (and `open`).
        let mut retried = false;
        loop {
            let mut notified = pin!(self.handover.done.notified());
            notified.as_mut().enable();
            if *self.handover.on_sink.lock() > 0 {
                // Hand-overs wait for the sink's next write: make it now. (Its errors are
                // `flush`'s to report, from its own flush of the sink.)
                if let Some(sink) = &self.freed_sink {
                    let _ = sink.flush().await;
                    continue;
                }
            }
            if *self.handover.pending.lock() == 0 {
                // A segment retired while something other than a read held it (a batch
                // keeping loaded fields for the sink) has no read left to sweep it when
                // that holder goes: sweep here, and wait for those deletes too.
                let store = self.lock().spill.as_ref().map(|s| Arc::clone(&s.store));
                let Some(store) = store else {
                    return;
                };
                self.sweep_retired(&store);
                if !std::mem::replace(&mut retried, true) {
                    let again = std::mem::take(&mut *self.handover.undeleted.lock());
                    self.delete_segments(&store, again);
                }
                if *self.handover.pending.lock() == 0 {
                    return;
                }
                continue;
            }
            notified.await;
        }
    }

    /// Deletes (in the background) the retired segments no read holds any more: called
    /// by each read of spill segments when it ends.
    pub(crate) fn sweep_retired(&self, store: &Arc<dyn SpillStore>) {
        let (dead, journal) = {
            let mut inner = self.lock();
            let dead = inner
                .spill
                .as_mut()
                .map_or_else(Vec::new, super::SpillState::take_retired);
            (dead, inner.journal.clone())
        };
        self.spawn_deletes(store, journal, dead);
    }

    /// Deletes segments no sample needs any more (in the background).
    /// `flush` waits for the deletes.
    pub(crate) fn delete_segments(&self, store: &Arc<dyn SpillStore>, dead: Vec<Arc<Segment>>) {
        if dead.is_empty() {
            return;
        }
        let journal = self.lock().journal.clone();
        self.spawn_deletes(store, journal, dead);
    }

    /// [`Self::delete_segments`] with the buffer's journal at hand.
    fn spawn_deletes(
        &self,
        store: &Arc<dyn SpillStore>,
        journal: Option<Arc<dyn Journal>>,
        dead: Vec<Arc<Segment>>,
    ) {
        if dead.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                segments = dead.len(),
                "spill segments kept for the next flush: no runtime to delete them now"
            );
            self.handover.keep_undeleted(dead);
            return;
        };
        let store = Arc::clone(store);
        let busy = self.handover.busy();
        let sink = self.freed_sink.clone();
        runtime.spawn(async move {
            let left = delete_after_sink(&busy.0, sink, &*store, journal, dead).await;
            busy.0.keep_undeleted(left);
            drop(busy);
        });
    }
}

/// Per freed sample, its spilled fields at hand.
type AtHand = HashMap<SampleId, Fields>;
/// Per freed sample, where its spilled fields not at hand are.
type Unread = Vec<(SampleId, Vec<SpilledRow>)>;

/// Takes `freed`'s spilled fields apart: per sample, the fields at hand (every sample with
/// spilled fields has an entry), and where the rest are to be read.
fn split_at_hand(freed: &mut Freed) -> (AtHand, Unread) {
    let mut at_hand = HashMap::new();
    let mut unread = Vec::new();
    for f in std::mem::take(&mut freed.spilled) {
        if !f.rows.is_empty() {
            unread.push((f.id.clone(), f.rows));
        }
        at_hand.insert(f.id, f.at_hand);
    }
    (at_hand, unread)
}

/// Gives each freed sample its spilled fields from `by_id` (its in-memory fields win).
fn merge_fields(freed: &mut Freed, mut by_id: HashMap<SampleId, Fields>) {
    for list in [
        &mut freed.consumed,
        &mut freed.stale,
        &mut freed.evicted,
        &mut freed.filtered,
    ] {
        for sample in list.iter_mut() {
            if let Some(fields) = by_id.remove(&sample.id) {
                if fields.len() > 0 {
                    *sample = Arc::new(merge(sample, fields));
                }
            }
        }
    }
}

/// Deletes segments once the freed-sample sink, if any, has written everything handed to
/// it so far (`FreedSink::written`): a sample whose row is not written yet is recovered for
/// the sink after a crash, and needs its spilled fields from these segments. The wait is
/// counted in `on_sink`, so a `flush` makes the sink write now instead of on its schedule.
/// Returns the segments not deleted.
async fn delete_after_sink(
    handover: &HandOver,
    sink: Option<Arc<dyn FreedSink>>,
    store: &dyn SpillStore,
    journal: Option<Arc<dyn Journal>>,
    dead: Vec<Arc<Segment>>,
) -> Vec<Arc<Segment>> {
    if dead.is_empty() {
        return dead;
    }
    if let Some(sink) = sink {
        let written = sink.written();
        // Only the buffer keeps its sink alive: once the buffer is gone, the archive stops
        // (what waits is recovered at the next open) and this wait ends with an error.
        drop(sink);
        *handover.on_sink.lock() += 1;
        handover.done.notify_waiters();
        let written = written.await;
        *handover.on_sink.lock() -= 1;
        if let Err(e) = written {
            tracing::warn!(
                error = %e, segments = dead.len(),
                "spill segments kept: samples handed to the sink are not written yet"
            );
            return dead;
        }
    }
    delete_all(store, journal, dead).await
}

/// Deletes segments; returns (and logs) the ones that would not go.
///
/// With a log, only once it is flushed: the records that freed (or moved) the segments'
/// rows must be durable before the rows go, or a crash would recover samples whose fields
/// are gone. Segments kept when the log cannot be flushed are tried again by the next
/// `flush`, or cleared by the next `open`.
pub(super) async fn delete_all(
    store: &dyn SpillStore,
    journal: Option<Arc<dyn Journal>>,
    dead: Vec<Arc<Segment>>,
) -> Vec<Arc<Segment>> {
    if dead.is_empty() {
        return dead;
    }
    if let Some(journal) = journal {
        if let Err(e) = journal.flush().await {
            tracing::warn!(error = %e, segments = dead.len(), "spill segments kept: the log is not durable");
            return dead;
        }
    }
    let mut left = Vec::new();
    for segment in dead {
        if let Err(e) = store.delete(Arc::clone(&segment)).await {
            tracing::warn!(error = %e, path = %segment.path, "spill segment not deleted");
            left.push(segment);
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::FieldKey;
    use crate::tensor::Tensor;

    fn segment(id: u64) -> Arc<Segment> {
        Arc::new(Segment {
            id,
            path: format!("spill/{id}.parquet"),
            rows: 8,
        })
    }

    fn row(slot: u32, segment_id: u64, row: u32, keys: &[&str]) -> SpilledRow {
        SpilledRow {
            slot,
            segment: segment(segment_id),
            row,
            keys: keys.iter().map(|k| FieldKey::from(k.to_string())).collect(),
        }
    }

    fn fields(keys: &[&str]) -> Fields {
        let mut f = Fields::default();
        for (i, k) in keys.iter().enumerate() {
            f.set(
                FieldKey::from(k.to_string()),
                Tensor::from(vec![i as i32; 4]),
            );
        }
        f
    }

    fn freed(slot: u32, rows: Vec<SpilledRow>) -> FreedSpill {
        FreedSpill {
            held: Vec::new(),
            id: SampleId::from(slot.to_string().as_str()),
            rows,
            at_hand: Fields::default(),
        }
    }

    fn keys_left(f: &FreedSpill) -> Vec<(u64, Vec<String>)> {
        f.rows
            .iter()
            .map(|r| (r.segment.id, r.keys.iter().map(|k| k.to_string()).collect()))
            .collect()
    }

    /// Loaded fields of the rows a sample still has are taken; what the load did not get
    /// is left to read, and rows with nothing left to read leave their segments held (not
    /// dropped: the segment must outlive the sample's hand-over to the sink).
    #[test]
    fn loaded_fields_of_unchanged_rows_are_taken() {
        let mut spilled = vec![
            freed(3, vec![row(3, 10, 0, &["a", "b"]), row(3, 11, 2, &["c"])]),
            freed(4, vec![row(4, 10, 1, &["a", "b"])]),
        ];
        let loaded = vec![
            LoadedFields {
                slot: 3,
                rows: vec![(10, 0), (11, 2)],
                fields: fields(&["a", "c"]),
            },
            LoadedFields {
                slot: 4,
                rows: vec![(10, 1)],
                fields: fields(&["a", "b"]),
            },
        ];
        use_loaded(&mut spilled, loaded);
        assert_eq!(keys_left(&spilled[0]), vec![(10, vec!["b".to_owned()])]);
        assert_eq!(spilled[0].at_hand, fields(&["a", "c"]));
        assert!(spilled[1].rows.is_empty());
        assert_eq!(spilled[1].at_hand, fields(&["a", "b"]));
        let held = |f: &FreedSpill| f.held.iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(held(&spilled[0]), vec![11]);
        assert_eq!(held(&spilled[1]), vec![10]);
    }

    /// Rows the load did not read (a rewritten segment, a patch spilled anew) are read
    /// back, even for keys the load got (from another row, so perhaps an older value);
    /// loaded fields of other slots are ignored.
    #[test]
    fn a_sample_whose_rows_changed_is_read_back() {
        let mut spilled = vec![freed(3, vec![row(3, 10, 0, &["a"]), row(3, 12, 0, &["b"])])];
        let loaded = vec![
            LoadedFields {
                slot: 3,
                rows: vec![(10, 0), (11, 0)],
                fields: fields(&["a", "b"]),
            },
            LoadedFields {
                slot: 5,
                rows: vec![(10, 0), (12, 0)],
                fields: fields(&["a", "b"]),
            },
        ];
        use_loaded(&mut spilled, loaded);
        assert_eq!(keys_left(&spilled[0]), vec![(12, vec!["b".to_owned()])]);
        assert_eq!(spilled[0].at_hand, fields(&["a"]));
    }
}
