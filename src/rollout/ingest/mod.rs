//! `GroupIngest`: rollouts in, sealed groups into the buffer, durably and idempotently.
//!
//! Many environment replicas call [`GroupIngest::add`] concurrently. A
//! [`GroupAssembler`] behind one mutex groups the rollouts; a background task seals groups
//! whose timeout passed, also when no rollout arrives. A sealed group is put into the
//! buffer as one sample whose id is the group id.
//!
//! # Durability and idempotence
//!
//! Everything goes through the buffer's log as auxiliary entries, so it is exactly as
//! durable as the buffer's own changes (`Durability::Sync`: `add` returns once the rollout
//! is on storage):
//!
//! * a pending rollout is written under `rollout/pending/<uid>` while it waits (appended
//!   under the assembler's lock, so before any seal that could include it);
//! * a sealed group's put carries, in the same log unit, the removal of its members'
//!   pending entries and a marker `rollout/sealed/<group id>`: after a crash either the
//!   group is stored and its rollouts are no longer pending, or neither happened;
//! * on start, pending rollouts are added back (their seal timeout restarts), and a group
//!   whose id has a marker or is in the buffer is not stored again, so replicas that resend
//!   after a restart cannot double a group. The newest `remember_groups` markers are kept.
//!   A marker lists its group's uids, and on start the assembler remembers them as gone:
//!   one rollout resent after a restart is a `Duplicate` as it was before, instead of the
//!   first of a new group that would train on it twice.
//!
//! # Failures: nothing acknowledged lives in memory alone
//!
//! A rollout's outcome is undecided while its pending entry is being written, and while a
//! group holding it is being stored; its uid is then *in flight* (`State::in_flight`), and
//! a resend waits for the outcome instead of being answered `Duplicate` at once:
//!
//! * a pending rollout whose write fails is taken back out of its group
//!   ([`GroupAssembler::withdraw`]): its sender gets the error, and its resend is new;
//! * a group whose store fails for a reason that may pass (the store failing, the buffer
//!   closed or full, an `add_timeout` that found no room in time) goes back to pending ([`GroupAssembler::reopen`]) with the members
//!   whose pending entries are durable or still being written (their own calls withdraw
//!   them if that fails); the others (the rollout that completed it, never logged on its
//!   own, and any whose write failed) get the error, and their resends complete the same
//!   group again. It seals again at the latest at its new timeout;
//! * a uid sent twice in one `add_many` shares its first copy's failure.
//!
//! # Locking
//!
//! The assembler's mutex (`Shared::state`, which also guards the in-flight uids) is taken
//! before the buffer's lock (auxiliary appends and reads), never the other way round, and
//! is never held across an await. The in-flight marks live in `in_flight.rs`; sealing at
//! timeouts and on a new configuration in `timer.rs`; resuming from the log in `start.rs`.

mod in_flight;
mod start;
mod taken;
mod timer;

use super::assembler::{Added, GroupAssembler};
use super::group::{key_tag, SealedGroup};
use super::record::RolloutRecord;
use crate::buffer::AuxWrite;
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::sync::{Arc, AtomicBool, Mutex, Notify};
use crate::SequenceBuffer;
use in_flight::{settled, InFlight};
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;
use taken::Taken;
use tokio::time::Instant;

const PENDING: &str = "rollout/pending/";
const SEALED: &str = "rollout/sealed/";
/// The field of a sealed marker that lists its group's uids.
const MARKER_UIDS: &str = "rollout_uids";
/// The field of a sealed marker that holds its group key's [`key_tag`] (as the `i64` of
/// the same bits), so that after a restart a uid arriving for another group is still
/// [`Added::UidTaken`].
const MARKER_KEY_TAG: &str = "key_tag";

/// Warns that a rollout was refused because another group's rollout holds its uid, when
/// the count of such refusals went from `before` to `after` past a power of two: a sender
/// numbering rollouts per prompt has every rollout refused after its first groups, and
/// gets a warning at the 1st, 2nd, 4th, 8th... refusal rather than one for each.
fn warn_uid_taken(uid: &str, before: u64, after: u64) {
    let crossed = after > 0 && (before == 0 || after.ilog2() > before.ilog2());
    if crossed {
        tracing::warn!(
            uid = %uid,
            refused_so_far = after,
            "a rollout was refused: its uid is held by a rollout of another group. Rollout \
             uids must name rollouts across the run (a UUID), not number them within a \
             group or a prompt"
        );
    }
}

fn pending_key(uid: &str) -> String {
    format!("{PENDING}{uid}")
}

fn sealed_key(id: &str) -> String {
    format!("{SEALED}{id}")
}

/// Counts of what ingestion did, besides the assembler's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IngestCounters {
    /// Groups stored in the buffer.
    pub stored_groups: u64,
    /// Sealed groups not stored because their id was already stored or archived.
    pub duplicate_groups: u64,
    /// Sealed groups the buffer refused (a future policy version, say).
    pub refused_groups: u64,
    /// Sealed groups whose store failed for a reason that may pass, put back as pending
    /// to seal again (see the module docs).
    pub reopened_groups: u64,
    /// Pending rollouts added back at start.
    pub recovered_rollouts: u64,
    /// Rollouts in the groups stored.
    pub stored_rollouts: u64,
    /// Tokens (prompt and output) in the groups stored.
    pub stored_tokens: u64,
    /// Output tokens in the groups stored.
    pub stored_generated_tokens: u64,
}

impl IngestCounters {
    fn count_stored(&mut self, group: &SealedGroup) {
        let generated: usize = group.rollouts.iter().map(|r| r.output_tokens.len()).sum();
        let prompts: usize = group.rollouts.iter().map(|r| r.prompt_tokens.len()).sum();
        self.stored_groups += 1;
        self.stored_rollouts += group.rollouts.len() as u64;
        self.stored_tokens += (generated + prompts) as u64;
        self.stored_generated_tokens += generated as u64;
    }
}

/// Rollouts in, groups out (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct GroupIngest {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    buf: SequenceBuffer,
    state: Mutex<State>,
    timer: Arc<Timer>,
    /// Wakes resends waiting for in-flight uids to be decided.
    settled: Notify,
    remember_groups: usize,
}

/// What the timer task shares with the ingest: it holds this strongly and the ingest only
/// weakly, so dropping the last clone of the ingest ends the task.
#[derive(Debug)]
struct Timer {
    /// Wakes the task when the earliest deadline may have changed, or to stop.
    wake: Notify,
    stopped: AtomicBool,
}

#[derive(Debug)]
struct State {
    assembler: GroupAssembler,
    /// Sealed-group markers, oldest first.
    sealed: VecDeque<String>,
    next_seal: u64,
    counters: IngestCounters,
    /// Uids whose outcome is undecided: a pending entry being written, or a member of a
    /// group being stored (see the module docs).
    in_flight: HashMap<String, u32>,
    /// Uids whose own pending write is in flight (a reopen keeps them: their own call
    /// withdraws them if the write fails).
    writing: HashSet<String>,
    /// Resends waiting for in-flight uids.
    waiters: usize,
    /// Rollouts of sealed groups being stored (see [`GroupIngest::storing_rollouts`]).
    storing: usize,
}

impl GroupIngest {
    /// Adds one rollout. A rollout that completes its group stores the group before this
    /// returns; a pending one is durable when this returns (under `Durability::Sync`).
    /// Duplicates, rejected versions and capped replicas are counted and change nothing.
    ///
    /// # Errors
    ///
    /// * [`Error::Closed`] once the buffer is closed, with nothing changed.
    /// * [`Error::InvalidRollout`] for a malformed record (see
    ///   [`RolloutRecord::validate`]), or a new one without a field the buffer reads and
    ///   no RPC outputs (`reward`, `ref_logprobs`), with nothing changed.
    /// * With a sync journal, [`Error::Storage`] when a log write (the pending rollout, or
    ///   the forgetting of a group's members) fails, and [`Error::Closed`] when the
    ///   journal's writer stopped. The rollout is then not held: resend it.
    /// * The buffer's error when it refuses the completed group (see
    ///   [`SequenceBuffer::put_batch`]; a group id already stored counts as a duplicate
    ///   group instead). If the refusal may pass (a storage error, the buffer closed or
    ///   full, no room in time under [`Self::add_timeout`]), the group is pending again
    ///   without this rollout, which is to be resent before the group's seal timeout;
    ///   otherwise the group's pending rollouts are forgotten, and taken as new when they
    ///   are resent (fixed).
    ///
    /// A resend of a rollout whose outcome is still undecided (its write or its group's
    /// store in flight) waits for it, then is answered as it then stands.
    ///
    /// # Cancel safety
    ///
    /// The rollout enters the assembler at the first poll and its pending entry is logged
    /// whether or not the future is still polled; a future dropped before the write is
    /// decided leaves the rollout in its group even if the write fails. If it completes a
    /// group, a future dropped before the group's put is claimed leaves the group unstored,
    /// its rollouts pending in the log only (added back by the next [`Self::start`]).
    pub async fn add(&self, record: RolloutRecord) -> Result<Added> {
        self.add_until(record, None).await
    }

    /// [`Self::add`] that waits for room for the group it completes at most `timeout`:
    /// past it, [`Error::Timeout`], and the group goes back to pending as after a failed
    /// store (its other members stay; this rollout, never logged on its own, is resent
    /// and completes it again). A log write once room is found is waited for whatever the
    /// time, so the outcome is never left undecided. Prefer it to dropping an `add`
    /// (`tokio::time::timeout`, an asyncio cancel), which leaves such a group unstored
    /// until a restart.
    ///
    /// # Errors
    ///
    /// As [`Self::add`], plus [`Error::Timeout`].
    pub async fn add_timeout(&self, record: RolloutRecord, timeout: Duration) -> Result<Added> {
        let at = Instant::now() + timeout.min(crate::deadline::FOREVER);
        self.add_until(record, Some((at, timeout))).await
    }

    async fn add_until(
        &self,
        record: RolloutRecord,
        room_by: Option<(Instant, Duration)>,
    ) -> Result<Added> {
        let shared = &self.shared;
        // A closed buffer takes nothing: a rollout held pending there would be refused only
        // once its group sealed.
        if shared.buf.is_closed() {
            return Err(Error::Closed);
        }
        let uid = record.rollout_uid.clone();
        let logged = record.to_sample(pending_key(&uid));
        let (added, durable, mut in_flight, taken) = loop {
            {
                let mut state = shared.state.lock();
                if !state.in_flight.contains_key(&uid) {
                    let before = state.assembler.next_deadline();
                    let taken_before = state.assembler.counters().uid_taken;
                    let added = state.assembler.add(record, crate::buffer::now())?;
                    let taken = (taken_before, state.assembler.counters().uid_taken);
                    let (durable, watched, writing) = match &added {
                        Added::Pending { .. } => {
                            let write = AuxWrite::set(pending_key(&uid), logged);
                            let durable = shared.buf.aux_submit(vec![write]);
                            (Some(durable), vec![uid.clone()], vec![uid.clone()])
                        }
                        Added::Sealed(group) => (None, members(group).collect(), Vec::new()),
                        _ => (None, Vec::new(), Vec::new()),
                    };
                    let storing = match &added {
                        Added::Sealed(group) => group.rollouts.len(),
                        _ => 0,
                    };
                    if state.assembler.next_deadline() != before {
                        shared.timer.wake.notify_one();
                    }
                    let in_flight = InFlight::mark(shared, &mut state, watched, writing, storing);
                    break (added, durable, in_flight, taken);
                }
            }
            settled(shared, &uid).await;
        };
        // After the lock, as every log event.
        if let Added::UidTaken { uid } = &added {
            warn_uid_taken(uid, taken.0, taken.1);
        }
        if let Some(durable) = durable {
            let written = durable.await;
            let mut state = shared.state.lock();
            in_flight.written(&mut state);
            if let Err(e) = written {
                // Not durable, so not acknowledged: a resend must be taken as new.
                if let Added::Pending { key, .. } = &added {
                    state.assembler.withdraw(key, &uid);
                }
                return Err(e);
            }
        }
        match added {
            Added::Sealed(group) => self.store(group, room_by).await,
            other => Ok(other),
        }
    }

    /// Adds many rollouts at once: one pass under the assembler's lock, one log record for
    /// those that stay pending, and one put for the groups they complete. A rollout whose
    /// group completes in the same call is never logged as pending (the group's put holds
    /// it), so a batch of whole groups is written to the log once. The answers come in
    /// input order, each as [`Self::add`] would give it, and each is durable when this
    /// returns; a rollout that is refused (malformed, say) refuses only itself.
    ///
    /// # Errors
    ///
    /// Per rollout, as [`Self::add`]: a failed log write of the pending rollouts is each
    /// pending one's error, and a group the buffer refuses is the error of its members
    /// from this call too.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::add`], for every rollout: all enter the assembler at the first poll.
    pub async fn add_many(&self, records: Vec<RolloutRecord>) -> Vec<Result<Added>> {
        let shared = &self.shared;
        if shared.buf.is_closed() {
            return records.iter().map(|_| Err(Error::Closed)).collect();
        }
        let (taken, durable, mut in_flight) = loop {
            let busy = {
                let mut state = shared.state.lock();
                let busy = records
                    .iter()
                    .find(|r| state.in_flight.contains_key(&r.rollout_uid));
                match busy {
                    Some(r) => r.rollout_uid.clone(),
                    None => {
                        let before = state.assembler.next_deadline();
                        let now = crate::buffer::now();
                        let taken_before = state.assembler.counters().uid_taken;
                        let mut taken = Taken::add_all(&mut state.assembler, records, now);
                        taken.uid_taken = (taken_before, state.assembler.counters().uid_taken);
                        if state.assembler.next_deadline() != before {
                            shared.timer.wake.notify_one();
                        }
                        let durable = shared.buf.aux_submit(std::mem::take(&mut taken.writes));
                        let watched = std::mem::take(&mut taken.watched);
                        let writing = taken.pending_here.keys().cloned().collect();
                        let storing = taken.sealed.iter().map(|(_, _, g)| g.rollouts.len()).sum();
                        let in_flight =
                            InFlight::mark(shared, &mut state, watched, writing, storing);
                        break (taken, durable, in_flight);
                    }
                }
            };
            settled(shared, &busy).await;
        };
        let Taken {
            mut answers,
            pending_here,
            sealed,
            repeats,
            uid_taken,
            ..
        } = taken;
        // After the lock, as every log event.
        let first_taken = answers.iter().find_map(|a| match a {
            Some(Ok(Added::UidTaken { uid })) => Some(uid.as_str()),
            _ => None,
        });
        if let Some(uid) = first_taken {
            warn_uid_taken(uid, uid_taken.0, uid_taken.1);
        }
        {
            let written = durable.await;
            let mut state = shared.state.lock();
            in_flight.written(&mut state);
            if let Err(e) = written {
                // As in `add`: what is not durable is taken back out.
                for (uid, &at) in &pending_here {
                    if let Some(Ok(Added::Pending { key, .. })) = &answers[at] {
                        state.assembler.withdraw(key, uid);
                    }
                    answers[at] = Some(Err(e.clone()));
                }
            }
        }
        let (heads, groups): (Vec<(usize, Vec<usize>)>, Vec<SealedGroup>) = sealed
            .into_iter()
            .map(|(at, members, group)| ((at, members), group))
            .unzip();
        let stored = self.store_many(groups, &mut in_flight).await;
        for ((at, members), result) in heads.into_iter().zip(stored) {
            if let Err(e) = &result {
                for m in members {
                    answers[m] = Some(Err(e.clone()));
                }
            }
            answers[at] = Some(result);
        }
        // A uid sent twice in the call shares its first copy's failure when it was
        // answered `Duplicate` of it: that stood for a rollout that was then not kept. A
        // later copy taken on its own (the first refused as malformed, a fixed resend in
        // the same call) keeps its own answer.
        for (again, first) in repeats {
            if let (Some(Ok(Added::Duplicate)), Some(Err(e))) = (&answers[again], &answers[first]) {
                answers[again] = Some(Err(e.clone()));
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(Error::Closed)))
            .collect()
    }

    /// The assembler's counts.
    pub fn assembler_counters(&self) -> super::AssemblerCounters {
        self.shared.state.lock().assembler.counters()
    }

    /// Rollouts of completed groups on their way into the buffer: out of the assembler (so
    /// not in [`AssemblerCounters::pending_rollouts`](super::AssemblerCounters)) and not
    /// stored yet, such as a group waiting for room in a full buffer. A group stored, or
    /// put back as pending when its store failed, leaves the count once its store returns
    /// (until then, for an instant, it is counted in both).
    pub fn storing_rollouts(&self) -> u64 {
        self.shared.state.lock().storing as u64
    }

    /// Seal-time quantiles (see [`GroupAssembler::seal_time_quantiles`]).
    pub fn seal_time_quantiles(&self) -> Option<(std::time::Duration, std::time::Duration)> {
        self.shared.state.lock().assembler.seal_time_quantiles()
    }

    /// What ingestion stored, skipped and recovered.
    pub fn counters(&self) -> IngestCounters {
        self.shared.state.lock().counters
    }

    /// Stores sealed groups as [`Self::store`] does, those not stored before in one put
    /// (one log unit). If that put fails, each is stored on its own, so one bad group
    /// refuses only itself.
    /// `in_flight` counts the groups as being stored; each leaves that count once decided.
    async fn store_many(
        &self,
        groups: Vec<SealedGroup>,
        in_flight: &mut InFlight,
    ) -> Vec<Result<Added>> {
        let shared = &self.shared;
        let known = |g: &SealedGroup| {
            shared.buf.aux_get(&sealed_key(&g.id)).is_some() || shared.buf.contains(&g.id)
        };
        if groups.len() < 2 || groups.iter().any(known) {
            return self.store_each(groups, in_flight).await;
        }
        let samples = match groups.iter().map(SealedGroup::to_sample).collect() {
            Ok(samples) => samples,
            Err(_) => return self.store_each(groups, in_flight).await,
        };
        let mut writes: Vec<AuxWrite> = groups
            .iter()
            .flat_map(|g| g.rollouts.iter())
            .map(|r| AuxWrite::remove(pending_key(&r.rollout_uid)))
            .collect();
        let let_go = self.mark_sealed(groups.iter(), &mut writes);
        if shared
            .buf
            .put_batch_with_aux(samples, writes, None)
            .await
            .is_err()
        {
            // Nothing was stored: each group alone, with its own marker.
            {
                let mut state = shared.state.lock();
                for g in &groups {
                    forget_sealed(&mut state.sealed, &g.id);
                }
                keep_sealed(&mut state.sealed, let_go);
            }
            return self.store_each(groups, in_flight).await;
        }
        let mut state = shared.state.lock();
        for g in &groups {
            state.counters.count_stored(g);
        }
        drop(state);
        in_flight.stored(groups.iter().map(|g| g.rollouts.len()).sum());
        groups.into_iter().map(|g| Ok(Added::Sealed(g))).collect()
    }

    /// Remembers `groups` as stored: their markers go into `writes` (the put's log unit),
    /// and so do the removals of the oldest markers past `remember_groups`. A marker holds
    /// its group's uids, so that after a restart a resent member is still a duplicate
    /// (see [`Self::start`]). Returns the ids it let go of, oldest first, for
    /// [`keep_sealed`] if the put fails (their markers then stay in the log, so the window
    /// must keep them too).
    fn mark_sealed<'a>(
        &self,
        groups: impl Iterator<Item = &'a SealedGroup>,
        writes: &mut Vec<AuxWrite>,
    ) -> Vec<String> {
        let shared = &self.shared;
        let mut state = shared.state.lock();
        for group in groups {
            let seq = state.next_seal;
            state.next_seal += 1;
            let uids: Vec<String> = group
                .rollouts
                .iter()
                .map(|r| r.rollout_uid.clone())
                .collect();
            writes.push(AuxWrite::set(
                sealed_key(&group.id),
                Sample::new(group.id.clone())
                    .birth(seq)
                    .with(MARKER_UIDS, uids)
                    .with(MARKER_KEY_TAG, key_tag(&group.key) as i64),
            ));
            state.sealed.push_back(group.id.clone());
        }
        let mut let_go = Vec::new();
        while state.sealed.len() > shared.remember_groups {
            if let Some(old) = state.sealed.pop_front() {
                writes.push(AuxWrite::remove(sealed_key(&old)));
                let_go.push(old);
            }
        }
        let_go
    }

    async fn store_each(
        &self,
        groups: Vec<SealedGroup>,
        in_flight: &mut InFlight,
    ) -> Vec<Result<Added>> {
        let mut out = Vec::with_capacity(groups.len());
        for group in groups {
            let n = group.rollouts.len();
            out.push(self.store(group, None).await);
            in_flight.stored(n);
        }
        out
    }

    /// Stores a sealed group unless its id was stored before; in the same log unit, its
    /// members stop being pending and its marker is written.
    async fn store(
        &self,
        group: SealedGroup,
        room_by: Option<(Instant, Duration)>,
    ) -> Result<Added> {
        let shared = &self.shared;
        let mut writes: Vec<AuxWrite> = group
            .rollouts
            .iter()
            .map(|r| AuxWrite::remove(pending_key(&r.rollout_uid)))
            .collect();
        let known =
            shared.buf.aux_get(&sealed_key(&group.id)).is_some() || shared.buf.contains(&group.id);
        if known {
            shared.buf.aux_write(writes).await?;
            shared.state.lock().counters.duplicate_groups += 1;
            tracing::debug!(group = %group.id, "group already stored; not stored again");
            return Ok(Added::DuplicateGroup { id: group.id });
        }
        let let_go = self.mark_sealed(std::iter::once(&group), &mut writes);
        let sample = group.to_sample()?;
        let put = shared
            .buf
            .put_batch_with_aux(vec![sample], writes.clone(), room_by)
            .await
            .map_err(|e| match e {
                // Named for the call the caller made, not the put behind it.
                Error::Timeout { after, samples, .. } => Error::Timeout {
                    op: format!("add_timeout (no room for group {} in time)", group.id),
                    after,
                    samples,
                },
                other => other,
            });
        match put {
            Ok(_) => {
                shared.state.lock().counters.count_stored(&group);
                Ok(Added::Sealed(group))
            }
            Err(Error::DuplicateId { .. }) => {
                // Already stored (the buffer refused the id): the members are still to
                // be forgotten, and the oldest markers `mark_sealed` let go of are
                // removed, as after a store (the window in memory no longer holds them).
                writes.retain(|w| w.value.is_none());
                if let Err(e) = shared.buf.aux_write(writes).await {
                    keep_sealed(&mut shared.state.lock().sealed, let_go);
                    return Err(e);
                }
                shared.state.lock().counters.duplicate_groups += 1;
                Ok(Added::DuplicateGroup { id: group.id })
            }
            Err(e) if may_pass(&e) => {
                // A timeout is back-pressure the caller asked for, not a fault.
                if matches!(e, Error::Timeout { .. }) {
                    tracing::debug!(group = %group.id, "no room for a group in time; pending again");
                } else {
                    tracing::warn!(group = %group.id, error = %e, "storing a group failed; pending again");
                }
                self.reopen(group, let_go);
                Err(e)
            }
            Err(e) => {
                // Dropped: its members are forgotten, its id leaves the window (it was
                // never stored), and the oldest markers `mark_sealed` let go of are
                // removed, so the markers in the log stay the window in memory. Its uids
                // are not remembered either: fixed rollouts resent under them are new.
                writes.retain(|w| w.value.is_none());
                let written = shared.buf.aux_write(writes).await;
                let mut state = shared.state.lock();
                state
                    .assembler
                    .let_resend(group.rollouts.iter().map(|r| r.rollout_uid.as_str()));
                forget_sealed(&mut state.sealed, &group.id);
                if written.is_err() {
                    keep_sealed(&mut state.sealed, let_go);
                }
                state.counters.refused_groups += 1;
                drop(state);
                tracing::warn!(group = %group.id, error = %e, "sealed group refused by the buffer");
                Err(e)
            }
        }
    }

    /// Puts a group whose store failed back into the assembler with the members whose
    /// pending entries are durable or still being written (the others' senders got an
    /// error), takes its id out of the remembered markers, and keeps the markers its
    /// store would have let go of (`let_go`, from [`Self::mark_sealed`]).
    fn reopen(&self, group: SealedGroup, let_go: Vec<String>) {
        let shared = &self.shared;
        let mut state = shared.state.lock();
        forget_sealed(&mut state.sealed, &group.id);
        keep_sealed(&mut state.sealed, let_go);
        state.counters.reopened_groups += 1;
        let before = state.assembler.next_deadline();
        // Kept: the members whose pending entries are durable, and those whose own write
        // is still in flight (its call withdraws them if it fails).
        let keep: HashSet<String> = group
            .rollouts
            .iter()
            .filter(|r| {
                state.writing.contains(&r.rollout_uid)
                    || shared.buf.aux_get(&pending_key(&r.rollout_uid)).is_some()
            })
            .map(|r| r.rollout_uid.clone())
            .collect();
        let kept = |r: &RolloutRecord| keep.contains(&r.rollout_uid);
        state.assembler.reopen(group, kept, crate::buffer::now());
        if state.assembler.next_deadline() != before {
            shared.timer.wake.notify_one();
        }
    }
}

/// Takes a group that was not stored out of the window of remembered groups, where
/// `mark_sealed` pushed it last, or nearly so.
fn forget_sealed(sealed: &mut VecDeque<String>, id: &str) {
    if let Some(at) = sealed.iter().rposition(|s| s == id) {
        sealed.remove(at);
    }
}

/// Puts back at the front of the window the ids `mark_sealed` let go of for a put that
/// failed: their markers are still in the log. The window may then hold more than
/// `remember_groups`; the next store trims it and writes the removals.
fn keep_sealed(sealed: &mut VecDeque<String>, let_go: Vec<String>) {
    for id in let_go.into_iter().rev() {
        sealed.push_front(id);
    }
}

/// The uids of a group's members.
fn members(group: &SealedGroup) -> impl Iterator<Item = String> + '_ {
    group.rollouts.iter().map(|r| r.rollout_uid.clone())
}

/// Whether storing a group failed for a reason that may pass (the store failing, the
/// buffer closed, full under `Overflow::Reject`, or no room before an `add_timeout`'s
/// deadline), rather than the buffer refusing the group itself.
fn may_pass(e: &Error) -> bool {
    matches!(
        e,
        Error::Storage { .. } | Error::Closed | Error::Full { .. } | Error::Timeout { .. }
    )
}
