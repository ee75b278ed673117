//! `put_batch`, `try_put_batch` and `put_batch_timeout`.
//!
//! A put is validated and its shared payloads are built before any slot is touched. Then,
//! under the lock, it claims free slots (they become `putting` and its ids are reserved)
//! and, without a sync journal, publishes them at once (they become stored and enter the
//! ready indexes) and logs the put if there is a journal. With a sync journal the put is
//! logged at the claim and the slots stay `putting` until the journal reports the record
//! durable; the journal's callback then publishes them (or gives them back if the write
//! failed), whether or not the caller is still waiting. A put that must wait joins a FIFO
//! queue of putters, so waiting putters are served in arrival order; only the head of the
//! queue may claim.

use super::prepare::Prepared;
use super::{
    now, AuxWrite, Durable, Freed, Inner, JournalFuture, Overflow, SequenceBuffer, Shared,
    SlotHandle,
};
use crate::error::{Error, Result, Unstored};
use crate::sample::{Sample, SampleId};
use crate::state::{Ticket, Wake};
use crate::sync::{oneshot, Arc};
use std::collections::hash_map::Entry;
use std::pin::pin;
use std::time::Duration;

/// What storing claimed slots gave: handles now, or the journal's verdict later; and who
/// to wake once the lock is dropped.
enum Stored {
    Done(Vec<SlotHandle>, Wake, Freed),
    /// With a callback the journal handed back, to drop once the lock is released.
    Pending(
        oneshot::Receiver<Result<Vec<SlotHandle>>>,
        Wake,
        Option<Durable>,
        Freed,
    ),
}

impl Stored {
    /// Notifies (the lock is dropped by now) and waits for the handles if they are not
    /// there yet.
    async fn finish(self, shared: &Arc<Shared>) -> Result<Vec<SlotHandle>> {
        match self {
            Stored::Done(handles, wake, dropped) => {
                shared.settle((wake, dropped));
                Ok(handles)
            }
            Stored::Pending(rx, wake, refused, evicted) => {
                shared.settle((wake, evicted));
                drop(refused);
                shared.verdict(rx).await
            }
        }
    }
}

impl SequenceBuffer {
    /// Stores `samples`, waiting for free slots if needed, and returns one handle per sample
    /// in input order.
    ///
    /// All or nothing: a rejected batch stores none of its samples. Waiting putters are
    /// served in arrival order. With `Durability::Sync` it returns once the put is on
    /// storage. A persistent buffer whose log has more put data waiting to be written than
    /// its limit (`PersistOptions::max_backlog`) waits for it first.
    ///
    /// # Errors
    ///
    /// Nothing is stored on any error.
    ///
    /// * [`Error::Closed`] once the buffer is closed (also while waiting for room), or when
    ///   a sync journal's writer stopped before the put was durable.
    /// * [`Error::BatchTooLarge`] for more samples than the capacity,
    ///   [`Error::InvalidBirth`] for a birth of 0, [`Error::MissingKey`] for a sample
    ///   without a dataset key, and [`Error::DuplicateId`] for an id repeated in the batch
    ///   or already stored or being put.
    /// * [`Error::InvalidMetadata`] for a `policy_version` that is not a non-negative
    ///   integer, or (when an RPC has an age bound) a `created_ts` that is not a finite
    ///   number; [`Error::FutureVersion`] for a version newer than the current one.
    /// * [`Error::OverBudget`] for a batch holding more tensor bytes than the whole byte
    ///   budget ([`BufferConfig::max_bytes`](crate::BufferConfig::max_bytes)).
    /// * [`Error::Full`] under [`Overflow::Reject`] when the batch does not fit now, with
    ///   the samples handed back.
    /// * [`Error::Storage`] when a sync journal fails to write the put, or when the put
    ///   waits for room under the memory budget and spilling to the spill store fails.
    ///
    /// # Cancel safety
    ///
    /// Dropped while waiting for room (or for the log's backlog), the put has claimed
    /// nothing: its queue ticket is removed and nothing is stored. Once its slots are
    /// claimed with a sync journal, the journal's callback finishes the put when the record
    /// is durable, so a dropped put may still be stored (check with [`Self::contains`]).
    pub async fn put_batch(&self, samples: Vec<Sample>) -> Result<Vec<SlotHandle>> {
        self.put_batch_with_aux(samples, Vec::new(), None).await
    }

    /// [`Self::put_batch`] whose auxiliary writes land in the same log unit as the put
    /// (both or neither after a crash). With `room_by`, waiting for room gives up then
    /// with [`Error::Timeout`], the samples handed back and nothing stored; once its slots
    /// are claimed the put waits for its log write whatever the time, so it is never left
    /// undecided (the group ingest reopens a group whose put timed out).
    pub(crate) async fn put_batch_with_aux(
        &self,
        samples: Vec<Sample>,
        aux: Vec<AuxWrite>,
        room_by: Option<(tokio::time::Instant, Duration)>,
    ) -> Result<Vec<SlotHandle>> {
        self.put_until(samples, aux, room_by, false).await
    }

    /// The put behind every waiting put: gives up at `deadline` (if any) with
    /// [`Error::Timeout`], handing the samples back when none was claimed yet; a claimed
    /// put's log write is bounded by it too when `bound_write`.
    async fn put_until(
        &self,
        samples: Vec<Sample>,
        aux: Vec<AuxWrite>,
        deadline: Option<(tokio::time::Instant, Duration)>,
        bound_write: bool,
    ) -> Result<Vec<SlotHandle>> {
        let shared = &self.shared;
        let timed_out = |samples: Unstored| {
            let after = deadline.map_or(Duration::ZERO, |(_, after)| after);
            Error::Timeout {
                op: "put_batch".into(),
                after,
                samples,
            }
        };
        let Some(mut prepared) = shared.prepare(samples)? else {
            return Ok(Vec::new());
        };
        prepared.aux = aux;
        let n = prepared.samples.len();
        let mut ticket = TicketGuard {
            shared,
            ticket: None,
        };
        let stored = loop {
            let mut notified = pin!(shared.space.notified());
            notified.as_mut().enable();
            let wait = {
                let mut inner = shared.lock();
                if let Some(wait) = inner.journal.as_ref().and_then(|j| j.backlog()) {
                    // The log is behind: wait for it before taking slots (and the queue's
                    // head), so memory stays bounded when the store is slow.
                    Wait::Backlog(wait)
                } else {
                    match shared.try_claim(&mut inner, &prepared, &mut ticket.ticket) {
                        Claim::Claimed(slots, wake, evicted) => {
                            break shared.store(&mut inner, slots, prepared, wake, evicted);
                        }
                        Claim::Rejected(err, wake, freed) => {
                            drop(inner);
                            shared.settle((wake, freed));
                            return Err(prepared.hand_back(err));
                        }
                        Claim::Wait(freed) => {
                            if ticket.ticket.is_none() {
                                ticket.ticket = Some(inner.table.enqueue_putter(n));
                            }
                            let reap = inner.table.next_deadline();
                            drop(inner);
                            shared.dispose(freed);
                            Wait::Space(reap)
                        }
                    }
                }
            };
            if matches!(wait, Wait::Space(_)) && shared.spills {
                // The wait may be for room under the memory budget.
                shared.spill_wake.notify_waiters();
            }
            let give_up = deadline.map(|(at, _)| at);
            match wait {
                Wait::Backlog(wait) => match give_up {
                    Some(at) => match tokio::time::timeout_at(at, wait).await {
                        Ok(done) => done?,
                        Err(_) => return Err(timed_out(prepared.into_unstored())),
                    },
                    None => wait.await?,
                },
                // Samples ageing out free slots with no other call to notice: wake at the
                // next deadline and reap.
                Wait::Space(reap) => {
                    let reap = reap.map(tokio::time::Instant::from_std);
                    let wake_at = match (reap, give_up) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    let Some(wake_at) = wake_at else {
                        notified.await;
                        continue;
                    };
                    if tokio::time::timeout_at(wake_at, notified).await.is_err() {
                        if give_up.is_some_and(|at| tokio::time::Instant::now() >= at) {
                            return Err(timed_out(prepared.into_unstored()));
                        }
                        shared.reap_due();
                    }
                }
            }
        };
        drop(ticket);
        match deadline.filter(|_| bound_write) {
            // Claimed: the put may still land (a sync journal's write is on its way), so
            // nothing is handed back past this point.
            Some((at, _)) => tokio::time::timeout_at(at, stored.finish(shared))
                .await
                .unwrap_or_else(|_| Err(timed_out(Unstored::default()))),
            None => stored.finish(shared).await,
        }
    }

    /// Stores `samples` if there is room now (and no earlier putter is waiting, and a
    /// persistent buffer's log is not behind), without waiting for room. Validation as in
    /// [`Self::put_batch`].
    ///
    /// # Errors
    ///
    /// As [`Self::put_batch`], except that it never waits: [`Error::Full`] when too few
    /// slots are free (or an earlier putter waits for them, or the batch does not fit under
    /// the byte or memory budget), and [`Error::Backlog`] when a persistent buffer's log is
    /// behind. Both hand the samples back, with nothing changed.
    ///
    /// # Cancel safety
    ///
    /// It claims and, without a sync journal, stores at its first poll, with no await.
    /// With one, a future dropped while waiting for the log leaves the put to the journal's
    /// callback: it is stored once its record is durable (its slots given back if the
    /// write fails).
    pub async fn try_put_batch(&self, samples: Vec<Sample>) -> Result<Vec<SlotHandle>> {
        let shared = &self.shared;
        let Some(prepared) = shared.prepare(samples)? else {
            return Ok(Vec::new());
        };
        let n = prepared.samples.len();
        let stored = {
            let mut inner = shared.lock();
            if inner.journal.as_ref().and_then(|j| j.backlog()).is_some() {
                inner.rejected += n as u64;
                drop(inner);
                return Err(Error::Backlog {
                    requested: n,
                    samples: prepared.into_unstored(),
                });
            }
            match shared.try_claim(&mut inner, &prepared, &mut None) {
                Claim::Claimed(slots, wake, evicted) => {
                    shared.store(&mut inner, slots, prepared, wake, evicted)
                }
                Claim::Rejected(err, wake, freed) => {
                    drop(inner);
                    shared.settle((wake, freed));
                    return Err(prepared.hand_back(err));
                }
                Claim::Wait(freed) => {
                    inner.rejected += n as u64;
                    let free = inner.table.free.len();
                    // Refused for room under the memory budget (`wanted` is set until a
                    // put claims): the spiller makes it, so a retry gets in.
                    let spill = shared.spills && inner.table.residency.wanted > 0;
                    drop(inner);
                    if spill {
                        shared.spill_wake.notify_waiters();
                    }
                    shared.dispose(freed);
                    return Err(Error::Full {
                        requested: n,
                        free,
                        samples: prepared.into_unstored(),
                    });
                }
            }
        };
        stored.finish(shared).await
    }

    /// [`Self::put_batch`] that gives up after `timeout` with [`Error::Timeout`], storing
    /// nothing. Uses tokio's timer (the runtime needs the time driver).
    ///
    /// A put that timed out while waiting for room hands its samples back in the error's
    /// `samples` ([`Unstored::into_samples`]), births assigned. One whose slots were already
    /// claimed, and whose log write a sync journal had not confirmed in time, hands back
    /// nothing: that put may still be stored.
    ///
    /// # Errors
    ///
    /// As [`Self::put_batch`], plus [`Error::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// As [`Self::put_batch`].
    pub async fn put_batch_timeout(
        &self,
        samples: Vec<Sample>,
        timeout: Duration,
    ) -> Result<Vec<SlotHandle>> {
        let at = tokio::time::Instant::now() + timeout.min(crate::deadline::FOREVER);
        self.put_until(samples, Vec::new(), Some((at, timeout)), true)
            .await
    }
}

/// What a putter that could not claim waits for.
enum Wait {
    /// The log to catch up.
    Backlog(JournalFuture),
    /// Free slots, or this deadline (an age bound that may free some).
    Space(Option<std::time::Instant>),
}

/// Outcome of one claim attempt under the lock.
enum Claim {
    /// These slots are `putting`, with the batch's ids reserved for them; the samples
    /// evicted to make room go to the sink once the lock is dropped.
    Claimed(Vec<u32>, Wake, Freed),
    /// With what the attempt freed all the same (samples evicted before a later check
    /// failed, spill segments it found retired): the caller settles it like a claim's.
    Rejected(Error, Wake, Freed),
    Wait(Freed),
}

impl Shared {
    /// One claim attempt: fails on close or on an id already in the buffer, waits when the
    /// slots are not there (or an earlier putter is), else claims and reserves the ids.
    fn try_claim(
        &self,
        inner: &mut Inner,
        prepared: &Prepared,
        ticket: &mut Option<Ticket>,
    ) -> Claim {
        let n = prepared.samples.len();
        let leave_queue = |inner: &mut Inner, ticket: &mut Option<Ticket>| {
            ticket
                .take()
                .map_or(Wake::default(), |t| inner.table.dequeue_putter(t))
        };
        if inner.closed {
            let wake = leave_queue(inner, ticket);
            return Claim::Rejected(Error::Closed, wake, Freed::default());
        }
        if let Some(err) = future_version(inner, prepared) {
            let wake = leave_queue(inner, ticket);
            inner.rejected += n as u64;
            return Claim::Rejected(err, wake, Freed::default());
        }
        let (bytes, resident) = prepared.total_bytes();
        let mut claimed = inner.table.claim_put_sized(n, bytes, resident, *ticket);
        let mut evicted = Vec::new();
        if claimed.is_none()
            && self.overflow == Overflow::EvictOldest
            && stored_duplicate(inner, prepared).is_none()
            && inner.table.is_turn_of(*ticket)
            && inner.table.make_room(n, bytes, &mut evicted)
        {
            claimed = inner.table.claim_put_sized(n, bytes, resident, *ticket);
        }
        let evicted = inner.take_freed(&evicted);
        let Some((slots, wake)) = claimed else {
            // Waiting: an id that is already stored would fail after the wait too.
            // A put held only by a rate limiter waits, whatever the overflow policy.
            let short = inner.table.free.len() < n
                || !inner.table.budget.fits(bytes)
                || !inner.table.residency.fits(resident);
            let full = (self.overflow == Overflow::Reject && short).then_some(Error::Full {
                requested: n,
                free: inner.table.free.len(),
                samples: Unstored::default(),
            });
            // Over the memory budget: the spiller makes room (woken by the caller, or by the
            // refusal below), unless its store keeps failing, which this put then reports.
            let needs_room = !inner.table.residency.fits(resident);
            let spill_failure = needs_room
                .then(|| inner.spill.as_ref().and_then(|s| s.failure.clone()))
                .flatten();
            let duplicate = stored_duplicate(inner, prepared);
            let refused_for_id = duplicate.is_some();
            if let Some(err) = duplicate.or(full).or(spill_failure) {
                let mut wake = leave_queue(inner, ticket);
                // Asked after leaving the queue (which clears the room of a queue left
                // empty): a put refused for room (`Overflow::Reject`) finds it on a retry.
                if needs_room && !refused_for_id {
                    inner.table.residency.ask(resident);
                    wake.spill = true;
                }
                inner.rejected += n as u64;
                return Claim::Rejected(err, wake, evicted);
            }
            if needs_room {
                inner.table.residency.ask(resident);
            }
            return Claim::Wait(evicted);
        };
        *ticket = None; // claim_put took it off the queue
        inner.table.residency.wanted = 0;
        inner.table.reserve_bytes(&slots, &prepared.bytes);
        inner.table.reserve_resident(&slots, &prepared.resident);

        // Reserve the ids: one probe each. Ids are unique within the batch (validated), so
        // a hit is a sample stored or being put by someone else.
        for (index, (s, &slot)) in prepared.samples.iter().zip(&slots).enumerate() {
            match inner.ids.entry(s.id.clone()) {
                Entry::Vacant(v) => {
                    v.insert(slot);
                }
                Entry::Occupied(o) => {
                    let err = Error::DuplicateId {
                        id: s.id.to_string(),
                        index,
                        conflict: format!("already in the buffer at slot {}", o.get()),
                    };
                    for earlier in &prepared.samples[..index] {
                        inner.ids.remove(&earlier.id);
                    }
                    let mut wake = wake;
                    wake.merge(inner.table.abort_put(&slots));
                    inner.rejected += n as u64;
                    return Claim::Rejected(err, wake, evicted);
                }
            }
        }
        Claim::Claimed(slots, wake, evicted)
    }

    /// Stores the batch in its claimed slots: publishes them now (logging the put if there
    /// is a journal), or, with a sync journal, logs the put and leaves the publishing to the
    /// journal's verdict.
    fn store(
        self: &Arc<Self>,
        inner: &mut Inner,
        slots: Vec<u32>,
        prepared: Prepared,
        mut wake: Wake,
        evicted: Freed,
    ) -> Stored {
        self.start_spiller(inner);
        let journal = match &inner.journal {
            Some(j) if self.sync_journal => Arc::clone(j),
            _ => {
                if let Some(journal) = &inner.journal {
                    // Only a callback is ever handed back.
                    let _ = journal.append(prepared.records(), None);
                }
                let (handles, published, mut dropped) = publish(inner, &slots, prepared, self.ages);
                wake.merge(published);
                dropped.extend(evicted);
                return Stored::Done(handles, wake, dropped);
            }
        };
        let (tx, rx) = oneshot::channel();
        let ids = prepared.samples.iter().map(|s| s.id.clone()).collect();
        let claimed = ClaimedSlots {
            shared: Arc::clone(self),
            slots: Some((slots, ids)),
        };
        let records = prepared.records();
        let then: Durable = Box::new(move |verdict| {
            // Publish, or give the slots back, before the caller hears of it.
            let result = match verdict {
                Ok(()) => Ok(claimed.publish(prepared)),
                Err(e) => {
                    drop(claimed);
                    Err(e)
                }
            };
            let _ = tx.send(result);
        });
        let refused = journal.append(records, Some(then));
        Stored::Pending(rx, wake, refused, evicted)
    }
}

/// Publishes claimed slots under the lock; returns the handles, who to wake, and the
/// samples dropped at once for being stale already.
fn publish(
    inner: &mut Inner,
    slots: &[u32],
    prepared: Prepared,
    ages: bool,
) -> (Vec<SlotHandle>, Wake, Freed) {
    for (&slot, payload) in slots.iter().zip(prepared.samples) {
        if let Some(entry) = inner.samples.get_mut(slot as usize) {
            *entry = Some(payload);
        }
        inner.refresh_priorities(slot, None);
    }
    inner.aux_apply(&prepared.aux);
    let mut freed = Vec::new();
    let (generations, wake) = inner.table.publish_put_fresh(
        slots,
        &prepared.births,
        &prepared.keys,
        &prepared.fresh,
        ages.then(now),
        &mut freed,
    );
    let handles = slots
        .iter()
        .zip(generations)
        .map(|(&slot, generation)| SlotHandle { slot, generation })
        .collect();
    (handles, wake, inner.take_freed(&freed))
}

/// A sample with a policy version newer than the buffer's, as an error.
fn future_version(inner: &Inner, prepared: &Prepared) -> Option<Error> {
    prepared
        .samples
        .iter()
        .zip(&prepared.fresh)
        .find_map(|(s, f)| {
            inner
                .table
                .check_version(f.version)
                .err()
                .map(|current| Error::FutureVersion {
                    id: s.id.to_string(),
                    version: f.version,
                    current,
                })
        })
}

/// The first sample whose id is already in the buffer, as an error.
fn stored_duplicate(inner: &Inner, prepared: &Prepared) -> Option<Error> {
    prepared.samples.iter().enumerate().find_map(|(index, s)| {
        inner.ids.get(&s.id).map(|slot| Error::DuplicateId {
            id: s.id.to_string(),
            index,
            conflict: format!("already in the buffer at slot {slot}"),
        })
    })
}

/// Claimed slots (and the ids reserved for them) waiting for a sync journal; dropping it
/// unpublished (a failed write, or a journal that shut down) gives them back and releases
/// the ids.
struct ClaimedSlots {
    shared: Arc<Shared>,
    slots: Option<(Vec<u32>, Vec<SampleId>)>,
}

impl ClaimedSlots {
    fn publish(mut self, prepared: Prepared) -> Vec<SlotHandle> {
        let Some((slots, _)) = self.slots.take() else {
            return Vec::new();
        };
        let ages = self.shared.ages;
        let (handles, wake, dropped) = publish(&mut self.shared.lock(), &slots, prepared, ages);
        self.shared.settle((wake, dropped));
        handles
    }
}

impl Drop for ClaimedSlots {
    fn drop(&mut self) {
        let Some((slots, ids)) = self.slots.take() else {
            return;
        };
        let wake = {
            let mut inner = self.shared.lock();
            for id in &ids {
                inner.ids.remove(id);
            }
            inner.table.abort_put(&slots)
        };
        self.shared.notify(wake);
    }
}

/// A waiting putter's place in the queue; dropping it (a cancelled put) leaves the queue.
struct TicketGuard<'a> {
    shared: &'a Shared,
    ticket: Option<Ticket>,
}

impl Drop for TicketGuard<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let wake = self.shared.lock().table.dequeue_putter(ticket);
        self.shared.notify(wake);
    }
}
