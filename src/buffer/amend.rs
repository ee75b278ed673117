//! `amend_batch`: add or replace fields of stored samples (a verifier's score, a late
//! reference logprob).
//!
//! Under the lock every handle is checked first, so a rejected call changes nothing. Then,
//! without a sync journal, the patches are applied (and logged) in the same critical
//! section. With a sync journal the slots are marked `amending` (they leave every ready
//! index, so no batch is taken from a sample whose amend is not yet durable), the amend is
//! logged, and the journal's callback applies the patches once the record is durable (or
//! ends the amend with nothing applied if the write failed). Callbacks run in log order, so
//! two amends of one key end as the log replays them: the one called later wins.

use super::{Durable, Inner, Record, SequenceBuffer, Shared, SlotHandle};
use crate::error::{Error, Result};
use crate::rpc_defs::KeySet;
use crate::sample::Patch;
use crate::sync::{oneshot, Arc};

impl SequenceBuffer {
    /// Applies `patches[i]` to the sample behind `handles[i]`: its fields replace or add to
    /// the stored ones (and its metadata likewise).
    ///
    /// All or nothing. Amending never waits for leases: a batch already handed out keeps the
    /// fields it was given. With `Durability::Sync` it returns once the amend is on storage.
    ///
    /// # Errors
    ///
    /// Nothing is applied on any error.
    ///
    /// * [`Error::Closed`] once the buffer is closed, or when a sync journal's writer
    ///   stopped before the amend was durable ([`Error::Storage`] instead when a storage
    ///   error stopped it, another buffer writing the store say).
    /// * [`Error::LengthMismatch`] when `handles` and `patches` differ in length.
    /// * [`Error::DuplicateHandle`] when one sample's handle appears twice.
    /// * [`Error::InvalidSlot`] for a handle naming a slot outside the buffer, and
    ///   [`Error::StaleHandle`] for one whose slot was freed or reused since it was issued.
    /// * [`Error::Storage`] when a sync journal fails to write the amend.
    ///
    /// # Cancel safety
    ///
    /// Handles are checked, and without a sync journal the patches applied, at the first
    /// poll, with no await. With one, a future dropped while waiting for the log leaves the
    /// amend to the journal's callback: it is applied once its record is durable (or ends
    /// unapplied if the write fails), whatever happened to the future.
    pub async fn amend_batch(&self, handles: &[SlotHandle], patches: Vec<Patch>) -> Result<()> {
        let shared = &self.shared;
        shared.check_open()?;
        if handles.len() != patches.len() {
            return Err(Error::LengthMismatch {
                what: "amend_batch",
                expected: handles.len(),
                got: patches.len(),
            });
        }
        if handles.is_empty() {
            return Ok(());
        }
        // Two patches of one sample in one call: the last silently won.
        let mut first_at = std::collections::HashMap::with_capacity(handles.len());
        for (index, h) in handles.iter().enumerate() {
            if let Some(&first) = first_at.get(&h.slot()) {
                return Err(Error::DuplicateHandle {
                    slot: h.slot(),
                    first,
                    index,
                });
            }
            first_at.insert(h.slot(), index);
        }
        let added: Vec<KeySet> = patches
            .iter()
            .map(|p| shared.graph.key_set(p.keys()))
            .collect();
        let slots: Vec<u32> = handles.iter().map(SlotHandle::slot).collect();
        let patches: Arc<[Patch]> = patches.into();
        let pending = {
            let mut inner = shared.lock();
            if inner.closed {
                return Err(Error::Closed);
            }
            shared.check_handles(&inner, handles)?;
            inner.table.begin_amend(&slots);
            let record = |inner: &Inner| Record::Amend {
                ids: inner.ids_of(slots.iter().copied()),
                patches: Arc::clone(&patches),
            };
            let record = inner.journal.is_some().then(|| record(&inner));
            let mut amend = AmendInFlight {
                shared: Arc::clone(shared),
                slots: Some(slots),
            };
            match inner.journal.clone().filter(|_| shared.sync_journal) {
                Some(journal) => {
                    let (tx, rx) = oneshot::channel();
                    let then: Durable = Box::new(move |verdict| {
                        // Apply, or end the amend unapplied, before the caller hears of it.
                        match verdict {
                            Ok(()) => amend.publish(&patches, &added),
                            Err(_) => drop(amend),
                        }
                        let _ = tx.send(verdict);
                    });
                    let records = record.into_iter().collect();
                    let refused = journal.append(records, Some(then));
                    (rx, refused)
                }
                None => {
                    if let Some(record) = record {
                        inner.log(|| record);
                    }
                    let (wake, dropped) = amend.apply(&mut inner, &patches, &added);
                    drop(inner);
                    shared.notify(wake);
                    shared.dispose(dropped);
                    return Ok(());
                }
            }
        };
        let (pending, refused) = pending;
        drop(refused);
        shared.verdict(pending).await
    }
}

impl Shared {
    /// Checks that every handle names a stored sample of the generation it was issued for.
    fn check_handles(&self, inner: &Inner, handles: &[SlotHandle]) -> Result<()> {
        for h in handles {
            let slot = h.slot as usize;
            if slot >= self.capacity {
                return Err(Error::InvalidSlot {
                    slot: h.slot,
                    capacity: self.capacity,
                });
            }
            match inner.table.stored_generation(slot) {
                Some(g) if g == h.generation => {}
                _ => {
                    return Err(Error::StaleHandle {
                        slot: h.slot,
                        generation: h.generation.get(),
                        current: inner.table.slots[slot].generation.get(),
                    })
                }
            }
        }
        Ok(())
    }
}

/// Slots marked `amending` by one call; ends the amend (applying nothing) when dropped
/// unpublished (a failed write, or a journal that shut down).
struct AmendInFlight {
    shared: Arc<Shared>,
    slots: Option<Vec<u32>>,
}

/// Who to wake, and the payloads freed, by the end of an amend.
type Ended = (crate::state::Wake, super::Freed);

impl AmendInFlight {
    /// Applies the patches and ends the amend, under the lock `inner`.
    fn apply(&mut self, inner: &mut Inner, patches: &[Patch], added: &[KeySet]) -> Ended {
        let Some(slots) = self.slots.take() else {
            return Default::default();
        };
        for (&slot, patch) in slots.iter().zip(patches) {
            inner.patch(slot, patch);
        }
        end(inner, &slots, added)
    }

    /// Takes the lock, applies the patches and ends the amend.
    fn publish(mut self, patches: &[Patch], added: &[KeySet]) {
        let shared = Arc::clone(&self.shared);
        let (wake, dropped) = self.apply(&mut shared.lock(), patches, added);
        shared.notify(wake);
        shared.dispose(dropped);
    }
}

/// Ends the amend of `slots`, adding `added` to their keys.
fn end(inner: &mut Inner, slots: &[u32], added: &[KeySet]) -> Ended {
    let mut freed = Vec::new();
    let wake = inner.table.finish_amend(slots, added, &mut freed);
    (wake, inner.take_freed(&freed))
}

impl Drop for AmendInFlight {
    fn drop(&mut self) {
        let Some(slots) = self.slots.take() else {
            return;
        };
        let (wake, dropped) = end(&mut self.shared.lock(), &slots, &[]);
        self.shared.notify(wake);
        self.shared.dispose(dropped);
    }
}
