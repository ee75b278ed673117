//! The spiller task: writes idle samples out while the buffer is over its memory budget.

use super::super::{Inner, Record, Shared};
use super::{spills, LiveSegment, Segment, SpillPart, SpillStore, SEGMENT_BYTES};
use crate::rpc_defs::RpcSet;
use crate::sample::{FieldKey, Sample};
use crate::state::{Generation, Wake};
use crate::sync::Weak;
use crate::sync::{Arc, Notify};
use std::collections::BTreeSet;
use std::pin::pin;
use std::time::Duration;

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

    /// One spill round: if the buffer is over its budget (or a putter waits for room), or
    /// `continuing` an episode the last round could not finish, writes spillable samples
    /// until the resident bytes are back under the budget's low mark (at most one
    /// segment's worth); otherwise compacts a sparse segment, if any.
    ///
    /// Only being over the budget starts an episode: a buffer under it but above the low
    /// mark is left alone, whatever woke the spiller (its first round, a free that left a
    /// segment sparse), so what is spilled does not depend on when the task ran.
    async fn spill_round(self: &Arc<Self>, continuing: bool) -> Round {
        let (store, picked, more, asks) = {
            let mut inner = self.lock();
            let residency = &inner.table.residency;
            let asks = residency.asks;
            let excess = if continuing || residency.over() {
                residency.excess()
            } else {
                0
            };
            let Some(spill) = inner.spill.as_ref() else {
                return Round::Idle;
            };
            let store = Arc::clone(&spill.store);
            if excess == 0 {
                (store, None, false, asks)
            } else {
                let slots = inner.table.pick_spill(excess.min(SEGMENT_BYTES));
                let picked: Vec<(u32, Generation, Arc<Sample>)> = slots
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
                (store, Some(picked), excess > SEGMENT_BYTES, asks)
            }
        };
        let Some(picked) = picked else {
            return self.compact_round(store).await;
        };
        // `flush` waits for the round (its deletes are registered before this ends).
        let _busy = self.handover.busy();
        let rows = picked
            .iter()
            .map(|(_, _, s)| s.fields.filtered_by(|_, t| spills(t)))
            .collect();
        let written = store.write(rows).await;
        // Logged once the lock is dropped: a log event can wait (under Python, for the GIL).
        let mut failed = None;
        let mut inner = self.lock();
        let result = match written {
            Ok(segment) => {
                adopt(&mut inner, &segment, &picked);
                let table = &mut inner.table;
                if table.putters.is_empty() && table.residency.asks == asks {
                    // Room asked by a put that did not wait (refused, or a `try_put`) is
                    // made once: its retry finds it, and a put given up leaves no demand.
                    // One asked while this wrote is served by the next round: this one
                    // picked its samples without knowing of it.
                    table.residency.wanted = 0;
                }
                if let Some(spill) = inner.spill.as_mut() {
                    spill.requeue_deferred();
                }
                Round::Wrote { more }
            }
            Err(e) => {
                failed = Some(e.to_string());
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
        // Segments whose rows all died before they were adopted (their samples changed or
        // left meanwhile) go now: no free may come along to take them.
        let dead = inner
            .spill
            .as_mut()
            .map(super::SpillState::take_retired)
            .unwrap_or_default();
        let samples = picked.len();
        drop(inner);
        if let Some(error) = failed {
            tracing::warn!(%error, samples, "spill write failed");
        }
        self.delete_segments(&store, dead);
        self.notify(Wake {
            rpcs: RpcSet::EMPTY,
            space: true,
            ..Wake::default()
        });
        result
    }
}

/// Under the lock, after a segment write: swaps in the stub of every written sample that is
/// still the one written and idle, logs the move, and ends every spill.
///
/// A sample leased or amended since it was picked keeps its fields: a completion or an
/// amend in flight is logged before the spill would be, and replaying it before the spill
/// record would strip what it wrote.
fn adopt(inner: &mut Inner, segment: &Arc<Segment>, picked: &[(u32, Generation, Arc<Sample>)]) {
    let mut members = BTreeSet::new();
    let mut bytes = 0u64;
    let mut logged_ids = Vec::new();
    let mut logged_parts = Vec::new();
    for (row, (s, generation, written)) in picked.iter().enumerate() {
        let slot = *s as usize;
        let current = inner.samples.get(slot).and_then(Option::as_ref);
        let meta = &inner.table.slots[slot];
        let unchanged = inner.table.stored_generation(slot) == Some(*generation)
            && meta.amenders == 0
            && meta.lease_bits.is_empty()
            && current.is_some_and(|c| Arc::ptr_eq(c, written));
        if !unchanged {
            // Changed, held or freed meanwhile: the row is dead on arrival.
            let resident = inner.table.residency.per_slot[slot];
            inner.table.end_spill(slot, resident);
            continue;
        }
        let fields: Vec<(FieldKey, u64)> = written
            .fields
            .iter()
            .filter(|(_, t)| spills(t))
            .map(|(k, t)| (k.clone(), t.nbytes() as u64))
            .collect();
        if fields.is_empty() {
            // Nothing large enough to spill (cannot happen: it counted resident bytes).
            inner.table.end_spill(slot, 0);
            continue;
        }
        bytes += fields.iter().map(|(_, b)| b).sum::<u64>();
        // Small fields stay with the stub.
        let stub = Sample {
            id: written.id.clone(),
            birth: written.birth,
            fields: written.fields.filtered_by(|_, t| !spills(t)),
            meta: written.meta.clone(),
        };
        if let Some(entry) = inner.samples.get_mut(slot) {
            *entry = Some(Arc::new(stub));
        }
        if let Some(spill) = inner.spill.as_mut() {
            // A load registered earlier does not know the new part.
            spill.loading.remove(&(slot as u32));
            if let Some(parts) = spill.parts.get_mut(slot) {
                if parts.is_empty() {
                    spill.spilled_now += 1;
                }
                let part = SpillPart {
                    segment: segment.id,
                    segment_rows: segment.rows,
                    row: row as u32,
                    fields,
                };
                if inner.journal.is_some() {
                    logged_ids.push(written.id.clone());
                    logged_parts.push(part.clone());
                }
                parts.push(part);
            }
        }
        inner.table.end_spill(slot, 0);
        members.insert(*s);
    }
    if !logged_ids.is_empty() {
        inner.log(|| Record::Spill {
            ids: logged_ids,
            parts: logged_parts,
            replaces: None,
        });
    }
    let Some(spill) = inner.spill.as_mut() else {
        return;
    };
    spill.counters.segments_written += 1;
    spill.counters.spilled_samples += members.len() as u64;
    spill.counters.spilled_bytes += bytes;
    spill.failure = None;
    if !members.is_empty() {
        spill.segments.insert(
            segment.id,
            LiveSegment {
                segment: Arc::clone(segment),
                members,
            },
        );
    } else {
        // Every written sample changed meanwhile: deleted at the end of the round.
        spill.counters.segments_deleted += 1;
        spill.retired.push(Arc::clone(segment));
    }
}

impl Shared {
    /// Rewrites the sparsest segment's live rows into a new segment and points their
    /// samples at it; the old segment is deleted once no read holds it.
    async fn compact_round(&self, store: Arc<dyn SpillStore>) -> Round {
        // `flush` waits for a rewrite in flight (and the delete of the segment it replaces).
        let _busy = self.handover.busy();
        // (slot, generation, old row, keys) of every live row.
        let (old, members) = {
            let mut inner = self.lock();
            let Inner { spill, table, .. } = &mut *inner;
            let Some(spill) = spill.as_mut() else {
                return Round::Idle;
            };
            let Some(id) = spill.next_sparse(|slot| !table.idle.get(slot as usize)) else {
                return Round::Idle;
            };
            let Some(live) = spill.segments.get(&id) else {
                return Round::Wrote { more: false };
            };
            let mut members = Vec::with_capacity(live.members.len());
            for &slot in &live.members {
                let part = spill.parts(slot).iter().find(|p| p.segment == id);
                if let (Some(part), Some(generation)) =
                    (part, table.stored_generation(slot as usize))
                {
                    let keys: Vec<FieldKey> = part.fields.iter().map(|(k, _)| k.clone()).collect();
                    members.push((slot, generation, part.row, keys));
                }
            }
            (Arc::clone(&live.segment), members)
        };
        let mut keys: Vec<FieldKey> = Vec::new();
        for (_, _, _, k) in &members {
            for key in k {
                if !keys.contains(key) {
                    keys.push(key.clone());
                }
            }
        }
        let rows = members.iter().map(|m| m.2).collect();
        let rewritten = match store.read(Arc::clone(&old), rows, keys).await {
            Ok(fields) => store.write(fields).await,
            Err(e) => Err(e),
        };
        let round = match rewritten {
            Ok(new) => {
                self.swap_rewritten(&old, new, &members);
                Round::Wrote { more: false }
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %old.path, "spill segment not rewritten");
                Round::Failed
            }
        };
        // The read is done: the old segment (retired by the swap, or by frees meanwhile)
        // can go.
        drop(old);
        self.sweep_retired(&store);
        round
    }

    /// Under the lock: points the rows of `old` that are still live at their copies in
    /// `new`, and retires `old` if no row of it is left.
    fn swap_rewritten(
        &self,
        old: &Arc<Segment>,
        new: Arc<Segment>,
        members: &[(u32, Generation, u32, Vec<FieldKey>)],
    ) {
        let mut inner = self.lock();
        let Inner {
            spill,
            table,
            samples,
            journal,
            ..
        } = &mut *inner;
        let Some(spill) = spill.as_mut() else {
            return;
        };
        let mut moved = BTreeSet::new();
        let mut logged = (Vec::new(), Vec::new());
        for (new_row, (slot, generation, old_row, _)) in members.iter().enumerate() {
            if table.stored_generation(*slot as usize) != Some(*generation) {
                continue;
            }
            let Some(parts) = spill.parts.get_mut(*slot as usize) else {
                continue;
            };
            if let Some(part) = parts
                .iter_mut()
                .find(|p| p.segment == old.id && p.row == *old_row)
            {
                part.segment = new.id;
                part.segment_rows = new.rows;
                part.row = new_row as u32;
                moved.insert(*slot);
                if let Some(Some(sample)) = samples.get(*slot as usize) {
                    logged.0.push(sample.id.clone());
                    logged.1.push(part.clone());
                }
            }
        }
        if let (Some(journal), false) = (journal.as_ref(), logged.0.is_empty()) {
            // Only a callback is ever handed back.
            let _ = journal.append(
                vec![Record::Spill {
                    ids: logged.0,
                    parts: logged.1,
                    replaces: Some(old.id),
                }],
                None,
            );
        }
        if let Some(live) = spill.segments.get_mut(&old.id) {
            live.members.retain(|s| !moved.contains(s));
            if live.members.is_empty() {
                spill.segments.remove(&old.id);
                spill.retired.push(Arc::clone(old));
                spill.counters.segments_deleted += 1;
            }
        }
        spill.counters.segments_written += 1;
        spill.counters.segments_rewritten += 1;
        if moved.is_empty() {
            spill.counters.segments_deleted += 1;
            spill.retired.push(new);
        } else {
            spill.segments.insert(
                new.id,
                LiveSegment {
                    segment: new,
                    members: moved,
                },
            );
        }
    }
}

enum Round {
    Idle,
    /// A segment was written; `more`: the spill episode needs another round (its excess
    /// was more than one segment).
    Wrote {
        more: bool,
    },
    Failed,
}

/// The spiller: spills while the buffer is over its budget, sleeps on `wake` otherwise;
/// ends when the buffer is dropped.
async fn run_spiller(weak: Weak<Shared>, wake: Arc<Notify>) {
    let mut backoff = Duration::from_millis(20);
    // Held from a round that writes until a round finds nothing to do: `flush` waits for
    // the spiller to catch up, so that nothing it logs lands after the buffer is dropped
    // (a store reopened at once would find the old buffer still writing to it).
    let mut catching_up = None;
    let mut continuing = false;
    loop {
        let mut notified = pin!(wake.notified());
        notified.as_mut().enable();
        let Some(shared) = weak.upgrade() else {
            return;
        };
        if catching_up.is_none() {
            catching_up = Some(shared.handover.busy());
        }
        let round = shared.spill_round(continuing).await;
        drop(shared);
        continuing = matches!(round, Round::Wrote { more: true });
        if !matches!(round, Round::Wrote { .. }) {
            catching_up = None;
        }
        match round {
            Round::Wrote { .. } => backoff = Duration::from_millis(20),
            Round::Idle => notified.await,
            Round::Failed => {
                // Retry: the store may come back. Waiting putters have the error already.
                let _ = tokio::time::timeout(backoff, notified).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}
