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
//!
//! # Locking
//!
//! The assembler's mutex is taken before the buffer's lock (auxiliary appends), never the
//! other way round, and is never held across an await.

use super::assembler::{Added, GroupAssembler, GroupConfig};
use super::group::SealedGroup;
use super::record::RolloutRecord;
use crate::buffer::AuxWrite;
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::sync::Weak;
use crate::sync::{Arc, AtomicBool, Mutex, Notify, Ordering};
use crate::SequenceBuffer;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

const PENDING: &str = "rollout/pending/";
const SEALED: &str = "rollout/sealed/";

fn pending_key(uid: &str) -> String {
    format!("{PENDING}{uid}")
}

fn sealed_key(id: &str) -> String {
    format!("{SEALED}{id}")
}

/// A sealed group to store, with the uids of its members never logged as pending (see
/// [`GroupIngest::store`]).
type ToStore = (SealedGroup, Vec<String>);

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
    /// Sealed groups whose store failed for a reason that may pass (the store unreachable,
    /// the buffer closing), put back as pending to seal again.
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
}

impl GroupIngest {
    /// Starts ingestion into `buf`, adding back the rollouts pending in its durable state
    /// and spawning the task that seals groups at their timeout (needs a tokio runtime with
    /// the time driver). The task stops when the last clone is dropped.
    ///
    /// # Errors
    ///
    /// The error storing a group that the pending rollouts complete (as in [`Self::add`]);
    /// `start` stops at the first one. Unreadable or invalid pending rollouts are skipped
    /// with a warning.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future starts no task. Groups whose put was claimed are stored (as in
    /// [`Self::add`]); the rest stay pending in the buffer's log, added back by the next
    /// `start`.
    pub async fn start(buf: SequenceBuffer, config: GroupConfig) -> Result<Self> {
        let remember_groups = config.remember;
        let mut markers: Vec<(u64, String)> = buf
            .aux_range(SEALED)
            .into_iter()
            .map(|(k, v)| (v.birth.unwrap_or(0), k[SEALED.len()..].to_owned()))
            .collect();
        markers.sort();
        let next_seal = markers.last().map_or(1, |m| m.0 + 1);
        let shared = Arc::new(Shared {
            buf: buf.clone(),
            state: Mutex::new(State {
                assembler: GroupAssembler::new(config),
                sealed: markers.into_iter().map(|(_, id)| id).collect(),
                next_seal,
                counters: IngestCounters::default(),
            }),
            timer: Arc::new(Timer {
                wake: Notify::new(),
                stopped: AtomicBool::new(false),
            }),
            remember_groups,
        });
        let ingest = Self { shared };
        let now = crate::buffer::now();
        let mut sealed = Vec::new();
        {
            let mut state = ingest.shared.state.lock();
            for (key, value) in buf.aux_range(PENDING) {
                let Some(record) = RolloutRecord::from_sample(&value) else {
                    tracing::warn!(key = %key, "unreadable pending rollout skipped");
                    continue;
                };
                state.counters.recovered_rollouts += 1;
                match state.assembler.add(record, now) {
                    Ok(Added::Sealed(group)) => sealed.push(group),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "invalid pending rollout skipped"),
                }
            }
        }
        for group in sealed {
            ingest.store(group, Vec::new()).await?;
        }
        let weak = Arc::downgrade(&ingest.shared);
        tokio::spawn(seal_on_time(weak, Arc::clone(&ingest.shared.timer)));
        Ok(ingest)
    }

    /// Adds one rollout. A rollout that completes its group stores the group before this
    /// returns; a pending one is durable when this returns (under `Durability::Sync`).
    /// Duplicates, rejected versions and capped replicas are counted and change nothing.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidRollout`] for a malformed record (see
    ///   [`RolloutRecord::validate`]), with nothing changed.
    /// * With a sync journal, [`Error::Storage`] when a log write (the pending rollout, or
    ///   the forgetting of a group's members) fails, and [`Error::Closed`] when the
    ///   journal's writer stopped.
    /// * The buffer's error when it refuses the completed group (see
    ///   [`SequenceBuffer::put_batch`]; a group id already stored counts as a duplicate
    ///   group instead). Its pending rollouts are then forgotten.
    ///
    /// # Cancel safety
    ///
    /// The rollout enters the assembler at the first poll and its pending entry is logged
    /// whether or not the future is still polled. If it completes a group, a future dropped
    /// before the group's put is claimed leaves the group unstored, its rollouts pending in
    /// the log only (added back by the next [`Self::start`]).
    pub async fn add(&self, record: RolloutRecord) -> Result<Added> {
        let shared = &self.shared;
        let uid = record.rollout_uid.clone();
        let logged = record.to_sample(pending_key(&uid));
        let (added, durable) = {
            let mut state = shared.state.lock();
            let before = state.assembler.next_deadline();
            let added = state.assembler.add(record, crate::buffer::now())?;
            let durable = match &added {
                Added::Pending { .. } => {
                    let write = AuxWrite::set(pending_key(&uid), logged);
                    Some(shared.buf.aux_submit(vec![write]))
                }
                _ => None,
            };
            if state.assembler.next_deadline() != before {
                shared.timer.wake.notify_one();
            }
            (added, durable)
        };
        if let Some(durable) = durable {
            if let Err(e) = durable.await {
                // Not durable, so not acknowledged: a resend must be taken as new, not
                // answered as a duplicate of a rollout that lives only in memory.
                if let Added::Pending { key, .. } = &added {
                    shared.state.lock().assembler.withdraw(key, &uid);
                }
                return Err(e);
            }
        }
        match added {
            // The completing rollout was never logged as pending: if the group cannot be
            // stored, its sender is told and the group waits for the resend.
            Added::Sealed(group) => self.store(group, vec![uid]).await,
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
        let now = crate::buffer::now();
        let n = records.len();
        let mut answers: Vec<Option<Result<Added>>> = Vec::with_capacity(n);
        // Rollouts of this call still pending, by uid: their answers.
        let mut pending_here: HashMap<String, usize> = HashMap::new();
        // Per group sealed here: its answer, the answers of its members from this call, and
        // the uids of those and of the rollout that completed it (none of them logged).
        let mut sealed: Vec<(usize, Vec<usize>, SealedGroup, Vec<String>)> = Vec::new();
        let durable = {
            let mut state = shared.state.lock();
            let before = state.assembler.next_deadline();
            for record in records {
                let uid = record.rollout_uid.clone();
                let at = answers.len();
                match state.assembler.add(record, now) {
                    Ok(Added::Sealed(group)) => {
                        // Members that came in this call are not logged as pending: the
                        // group's put carries them, and their answers wait for it.
                        let (members, mut unlogged): (Vec<usize>, Vec<String>) = group
                            .rollouts
                            .iter()
                            .filter_map(|r| {
                                let at = pending_here.remove(&r.rollout_uid)?;
                                Some((at, r.rollout_uid.clone()))
                            })
                            .unzip();
                        unlogged.push(uid);
                        sealed.push((at, members, group, unlogged));
                        answers.push(None);
                    }
                    Ok(added @ Added::Pending { .. }) => {
                        pending_here.insert(uid, at);
                        answers.push(Some(Ok(added)));
                    }
                    other => answers.push(Some(other)),
                }
            }
            // Only what is still pending is logged, read from the assembler (which holds
            // the records now), in input order.
            let mut writes: Vec<(usize, AuxWrite)> = if pending_here.is_empty() {
                Vec::new()
            } else {
                state
                    .assembler
                    .pending()
                    .filter_map(|r| {
                        let at = *pending_here.get(&r.rollout_uid)?;
                        let key = pending_key(&r.rollout_uid);
                        Some((at, AuxWrite::set(key.clone(), r.to_sample(key))))
                    })
                    .collect()
            };
            writes.sort_unstable_by_key(|(at, _)| *at);
            if state.assembler.next_deadline() != before {
                shared.timer.wake.notify_one();
            }
            shared
                .buf
                .aux_submit(writes.into_iter().map(|(_, w)| w).collect())
        };
        if let Err(e) = durable.await {
            // As in `add`: what is not durable is taken back out.
            let mut state = shared.state.lock();
            for (uid, &at) in &pending_here {
                if let Some(Ok(Added::Pending { key, .. })) = &answers[at] {
                    state.assembler.withdraw(key, uid);
                }
                answers[at] = Some(Err(e.clone()));
            }
        }
        let (heads, groups): (Vec<(usize, Vec<usize>)>, Vec<ToStore>) = sealed
            .into_iter()
            .map(|(at, members, group, unlogged)| ((at, members), (group, unlogged)))
            .unzip();
        for ((at, members), result) in heads.into_iter().zip(self.store_many(groups).await) {
            if let Err(e) = &result {
                for m in members {
                    answers[m] = Some(Err(e.clone()));
                }
            }
            answers[at] = Some(result);
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

    /// Seal-time quantiles (see [`GroupAssembler::seal_time_quantiles`]).
    pub fn seal_time_quantiles(&self) -> Option<(std::time::Duration, std::time::Duration)> {
        self.shared.state.lock().assembler.seal_time_quantiles()
    }

    /// What ingestion stored, skipped and recovered.
    pub fn counters(&self) -> IngestCounters {
        self.shared.state.lock().counters
    }

    /// Seals and stores every group whose timeout passed by `now` (the background task
    /// does this on its own; tests and callers driving time may call it).
    ///
    /// # Errors
    ///
    /// With a sync journal, [`Error::Storage`] or [`Error::Closed`] when forgetting the
    /// rollouts of groups dropped unsealed fails to be logged; otherwise the first error
    /// storing a group (as in [`Self::add`]), after every due group was tried.
    ///
    /// # Cancel safety
    ///
    /// The due groups leave the assembler at the first poll. A future dropped before a
    /// group's put is claimed leaves that group unstored, its rollouts pending in the log
    /// only (added back by the next [`Self::start`]).
    pub async fn seal_due(&self, now: Instant) -> Result<()> {
        let due = self.shared.state.lock().assembler.seal_due(now);
        let forget: Vec<AuxWrite> = due
            .dropped
            .iter()
            .flat_map(|(_, rollouts)| rollouts.iter())
            .map(|r| AuxWrite::remove(pending_key(&r.rollout_uid)))
            .collect();
        // A failed forget leaves the dropped rollouts in the log (a restart adds them back
        // and drops them again); the sealed groups are stored all the same.
        let mut first_error = self.shared.buf.aux_write(forget).await.err();
        for group in due.sealed {
            if let Err(e) = self.store(group, Vec::new()).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Stores sealed groups as [`Self::store`] does (each with its unlogged uids), those
    /// not stored before in one put (one log unit). If that put fails, each is stored on
    /// its own, so one bad group refuses only itself.
    async fn store_many(&self, groups: Vec<ToStore>) -> Vec<Result<Added>> {
        let shared = &self.shared;
        let known = |(g, _): &ToStore| {
            shared.buf.aux_get(&sealed_key(&g.id)).is_some() || shared.buf.contains(&g.id)
        };
        if groups.len() < 2 || groups.iter().any(known) {
            return self.store_each(groups).await;
        }
        let samples = match groups.iter().map(|(g, _)| g.to_sample()).collect() {
            Ok(samples) => samples,
            Err(_) => return self.store_each(groups).await,
        };
        let mut writes: Vec<AuxWrite> = groups
            .iter()
            .flat_map(|(g, _)| g.rollouts.iter())
            .map(|r| AuxWrite::remove(pending_key(&r.rollout_uid)))
            .collect();
        self.mark_sealed(groups.iter().map(|(g, _)| g.id.as_str()), &mut writes);
        if shared
            .buf
            .put_batch_with_aux(samples, writes)
            .await
            .is_err()
        {
            // Nothing was stored: each group alone, with its own marker.
            let ids: std::collections::HashSet<&str> =
                groups.iter().map(|(g, _)| g.id.as_str()).collect();
            shared
                .state
                .lock()
                .sealed
                .retain(|id| !ids.contains(id.as_str()));
            return self.store_each(groups).await;
        }
        let mut state = shared.state.lock();
        for (g, _) in &groups {
            state.counters.count_stored(g);
        }
        drop(state);
        groups
            .into_iter()
            .map(|(g, _)| Ok(Added::Sealed(g)))
            .collect()
    }

    /// Remembers `ids` as stored: their markers go into `writes` (the put's log unit),
    /// and so do the removals of the oldest markers past `remember_groups`.
    fn mark_sealed<'a>(&self, ids: impl Iterator<Item = &'a str>, writes: &mut Vec<AuxWrite>) {
        let shared = &self.shared;
        let mut state = shared.state.lock();
        for id in ids {
            let seq = state.next_seal;
            state.next_seal += 1;
            writes.push(AuxWrite::set(
                sealed_key(id),
                Sample::new(id.to_owned()).birth(seq),
            ));
            state.sealed.push_back(id.to_owned());
        }
        while state.sealed.len() > shared.remember_groups {
            if let Some(old) = state.sealed.pop_front() {
                writes.push(AuxWrite::remove(sealed_key(&old)));
            }
        }
    }

    async fn store_each(&self, groups: Vec<ToStore>) -> Vec<Result<Added>> {
        let mut out = Vec::with_capacity(groups.len());
        for (group, unlogged) in groups {
            out.push(self.store(group, unlogged).await);
        }
        out
    }

    /// Stores a sealed group unless its id was stored before; in the same log unit, its
    /// members stop being pending and its marker is written. `unlogged` names the members
    /// never logged as pending, whose senders get this call's error: if the store fails for
    /// a reason that may pass, the other members are pending again (see
    /// [`GroupAssembler::reopen`]) and stay so in the log, and those wait for a resend.
    async fn store(&self, group: SealedGroup, unlogged: Vec<String>) -> Result<Added> {
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
        self.mark_sealed(std::iter::once(group.id.as_str()), &mut writes);
        let sample = group.to_sample()?;
        match shared
            .buf
            .put_batch_with_aux(vec![sample], writes.clone())
            .await
        {
            Ok(_) => {
                shared.state.lock().counters.count_stored(&group);
                Ok(Added::Sealed(group))
            }
            Err(Error::DuplicateId { .. }) => {
                // Already stored (the buffer refused the id): the members are still to
                // be forgotten, and the oldest markers `mark_sealed` let go of are
                // removed, as after a store (the window in memory no longer holds them).
                writes.retain(|w| w.value.is_none());
                shared.buf.aux_write(writes).await?;
                shared.state.lock().counters.duplicate_groups += 1;
                Ok(Added::DuplicateGroup { id: group.id })
            }
            Err(e) if may_pass(&e) => {
                tracing::warn!(group = %group.id, error = %e, "storing a sealed group failed; its rollouts are pending again");
                self.reopen(group, &unlogged);
                Err(e)
            }
            Err(e) => {
                writes.retain(|w| w.value.is_none() && w.key.starts_with(PENDING));
                let _ = shared.buf.aux_write(writes).await;
                shared.state.lock().counters.refused_groups += 1;
                tracing::warn!(group = %group.id, error = %e, "sealed group refused by the buffer");
                Err(e)
            }
        }
    }

    /// Puts a group whose store failed back into the assembler, without the members in
    /// `unlogged` (see [`Self::store`]), and takes its id out of the remembered markers.
    fn reopen(&self, group: SealedGroup, unlogged: &[String]) {
        let shared = &self.shared;
        let mut state = shared.state.lock();
        // `mark_sealed` pushed it last, or nearly so.
        if let Some(at) = state.sealed.iter().rposition(|id| *id == group.id) {
            state.sealed.remove(at);
        }
        state.counters.reopened_groups += 1;
        let before = state.assembler.next_deadline();
        state
            .assembler
            .reopen(group, unlogged, crate::buffer::now());
        if state.assembler.next_deadline() != before {
            shared.timer.wake.notify_one();
        }
    }
}

/// Whether storing a group failed for a reason that may pass (the store or the buffer
/// unavailable for now), rather than the buffer refusing the group itself.
fn may_pass(e: &Error) -> bool {
    matches!(
        e,
        Error::Storage { .. }
            | Error::Closed
            | Error::Timeout { .. }
            | Error::Full { .. }
            | Error::Backlog { .. }
    )
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.timer.stopped.store(true, Ordering::Release);
        self.timer.wake.notify_one();
    }
}

/// The timer task: sleeps until the earliest seal deadline (or a new group), then seals
/// what is due. Ends when the last clone of the ingest is dropped.
async fn seal_on_time(weak: Weak<Shared>, timer: Arc<Timer>) {
    loop {
        let notified = timer.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if timer.stopped.load(Ordering::Acquire) {
            return;
        }
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let deadline = shared.state.lock().assembler.next_deadline();
        let now = crate::buffer::now();
        if deadline.is_some_and(|d| d <= now) {
            let ingest = GroupIngest { shared };
            if let Err(e) = ingest.seal_due(now).await {
                tracing::warn!(error = %e, "sealing groups at their timeout failed");
            }
            continue;
        }
        drop(shared);
        match deadline {
            Some(d) => {
                // Elapsed or woken: either way, look again.
                let _ = tokio::time::timeout_at(tokio::time::Instant::from_std(d), notified).await;
            }
            None => notified.await,
        }
    }
}
