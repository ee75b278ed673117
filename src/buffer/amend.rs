//! `amend_batch`: add or replace fields of stored samples (a verifier's score, a late
//! reference logprob).
//!
//! Two steps: under the lock, check every handle and mark the slots `amending` (they leave
//! every ready index, so no batch can be taken from a half-applied amend); then, under the
//! lock again, apply the patches and end the amend, which makes the slots eligible for the
//! RPCs whose inputs are now present. Nothing awaits between the steps today; a guard ends
//! the amend if the second step is not reached (a panic now, a dropped future once the
//! durable-log write sits there). Two amends of one slot both land; for the same key the
//! one published later wins.

use super::{SequenceBuffer, Shared, SlotHandle};
use crate::error::{Error, Result};
use crate::rpc_defs::KeySet;
use crate::sample::Patch;
use crate::sync::Arc;

impl SequenceBuffer {
    /// Applies `patches[i]` to the sample behind `handles[i]`: its fields replace or add to
    /// the stored ones (and its metadata likewise).
    ///
    /// All or nothing: a handle whose slot was freed or reused since it was issued gives
    /// [`Error::StaleHandle`], a count mismatch [`Error::LengthMismatch`], and nothing is
    /// applied. Amending never waits for leases: a batch already handed out keeps the fields
    /// it was given.
    pub async fn amend_batch(&self, handles: &[SlotHandle], patches: Vec<Patch>) -> Result<()> {
        let shared = &*self.shared;
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
        let added: Vec<KeySet> = patches
            .iter()
            .map(|p| shared.graph.key_set(p.keys()))
            .collect();
        let slots: Vec<u32> = handles.iter().map(SlotHandle::slot).collect();
        {
            let mut inner = shared.lock();
            if inner.closed {
                return Err(Error::Closed);
            }
            for h in handles {
                let slot = h.slot as usize;
                if slot >= shared.capacity {
                    return Err(Error::InvalidSlot {
                        slot: h.slot,
                        capacity: shared.capacity,
                    });
                }
                match inner.table.stored_generation(slot) {
                    Some(g) if g == h.generation => {}
                    _ => {
                        return Err(Error::StaleHandle {
                            slot: h.slot,
                            generation: h.generation,
                            current: inner.table.slots[slot].generation,
                        })
                    }
                }
            }
            inner.table.begin_amend(&slots);
        }
        let mut amend = AmendInFlight {
            shared,
            slots: Some(slots),
        };
        // The amend is claimed: a durable log write goes here, outside the lock.
        amend.publish(&patches, &added);
        Ok(())
    }
}

/// Slots marked `amending` by one call; ends the amend (applying nothing) when dropped
/// unpublished.
struct AmendInFlight<'a> {
    shared: &'a Shared,
    slots: Option<Vec<u32>>,
}

impl AmendInFlight<'_> {
    fn publish(&mut self, patches: &[Patch], added: &[KeySet]) {
        let Some(slots) = self.slots.take() else {
            return;
        };
        let mut freed = Vec::new();
        let (wake, dropped) = {
            let mut inner = self.shared.lock();
            for (&slot, patch) in slots.iter().zip(patches) {
                if let Some(Some(sample)) = inner.samples.get_mut(slot as usize) {
                    Arc::make_mut(sample).apply(patch);
                }
            }
            let wake = inner.table.finish_amend(&slots, added, &mut freed);
            (wake, inner.take_freed(&freed))
        };
        self.shared.notify(wake);
        self.shared.dispose(dropped);
    }
}

impl Drop for AmendInFlight<'_> {
    fn drop(&mut self) {
        let Some(slots) = self.slots.take() else {
            return;
        };
        let mut freed = Vec::new();
        let (wake, dropped) = {
            let mut inner = self.shared.lock();
            let wake = inner.table.finish_amend(&slots, &[], &mut freed);
            (wake, inner.take_freed(&freed))
        };
        self.shared.notify(wake);
        self.shared.dispose(dropped);
    }
}
