//! Freed spilled samples: their spilled fields are read back for the freed-sample sink,
//! then the segments left without a live row are deleted. `flush` waits for both.

use super::super::{Freed, Journal, Shared};
use super::{merge, read_back, Segment, SpillStore};
use crate::sample::{Fields, SampleId};
use crate::sync::{Arc, Mutex, Notify};
use std::collections::HashMap;
use std::pin::pin;

/// Freed samples whose spilled fields are being read back for the sink.
#[derive(Debug, Default)]
pub(crate) struct HandOver {
    pending: Mutex<usize>,
    done: Notify,
}

impl HandOver {
    /// Counts work `flush` waits for until the guard is dropped.
    pub(super) fn busy(self: &Arc<Self>) -> Busy {
        *self.pending.lock() += 1;
        Busy(Arc::clone(self))
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
    /// and deletes the segments left without a live row, in a task; returns `freed` when
    /// there is nothing to read (the caller hands it over at once).
    pub(crate) fn hand_over_spilled(&self, mut freed: Freed) -> Option<Freed> {
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
        let (Some(runtime), Some(sink)) = (runtime, sink) else {
            if !freed.spilled.is_empty() {
                tracing::warn!("freed spilled samples outside a tokio runtime: handed over without their spilled fields");
            }
            freed.spilled.clear();
            self.spawn_deletes(&store, journal, dead);
            return Some(freed);
        };
        let read_by = self.read_by.clone();
        let busy = self.handover.busy();
        let task = async move {
            let (ids, rows): (Vec<SampleId>, Vec<_>) =
                std::mem::take(&mut freed.spilled).into_iter().unzip();
            let mut by_id: HashMap<SampleId, Fields> = HashMap::new();
            for (id, result) in ids.into_iter().zip(read_back(&store, rows).await) {
                match result {
                    Ok(fields) => {
                        by_id.insert(id, fields);
                    }
                    Err(e) => tracing::warn!(
                        error = %e, id = %id,
                        "spilled fields of a freed sample could not be read back"
                    ),
                }
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
            super::super::freed::hand_to_sink(&*sink, &read_by, freed);
            delete_all(&*store, journal, dead).await;
            drop(busy);
        };
        runtime.spawn(task);
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
                "spill segments left: no runtime to delete them"
            );
            return;
        };
        let store = Arc::clone(store);
        let busy = self.handover.busy();
        runtime.spawn(async move {
            delete_all(&*store, journal, dead).await;
            drop(busy);
        });
    }
}

/// Deletes segments, logging the ones that would not go.
///
/// With a log, only once it is flushed: the records that freed (or moved) the segments'
/// rows must be durable before the rows go, or a crash would recover samples whose fields
/// are gone. A failed flush leaves the segments for the next `open` to clear.
pub(super) async fn delete_all(
    store: &dyn SpillStore,
    journal: Option<Arc<dyn Journal>>,
    dead: Vec<Arc<Segment>>,
) {
    if dead.is_empty() {
        return;
    }
    if let Some(journal) = journal {
        if let Err(e) = journal.flush().await {
            tracing::warn!(error = %e, segments = dead.len(), "spill segments kept: the log is not durable");
            return;
        }
    }
    for segment in dead {
        if let Err(e) = store.delete(Arc::clone(&segment)).await {
            tracing::warn!(error = %e, path = %segment.path, "spill segment not deleted");
        }
    }
}
