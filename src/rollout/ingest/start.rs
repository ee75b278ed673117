//! [`GroupIngest::start`]: ingestion resumed from the buffer's durable state. The sealed
//! markers give back the window of stored groups and their uids (remembered as gone), the
//! pending entries go back into the assembler (groups they complete are stored), and the
//! task that seals groups at their timeout starts. See the ingest module's docs for what
//! each entry means.

use super::in_flight::InFlight;
use super::timer::seal_on_time;
use super::{
    GroupIngest, IngestCounters, Shared, State, Timer, MARKER_KEY_TAG, MARKER_UIDS, PENDING, SEALED,
};
use crate::buffer::AuxWrite;
use crate::error::Result;
use crate::rollout::assembler::{Added, GroupAssembler, GroupConfig};
use crate::rollout::group::SealedGroup;
use crate::rollout::record::{OptionalField, RolloutRecord};
use crate::sample::Sample;
use crate::sync::{Arc, AtomicBool, Mutex, Notify};
use crate::SequenceBuffer;
use std::collections::{HashMap, HashSet};

impl GroupIngest {
    /// Starts ingestion into `buf`, adding back the rollouts pending in its durable state
    /// and spawning the task that seals groups at their timeout (needs a tokio runtime with
    /// the time driver). The task stops when the last clone is dropped.
    ///
    /// # Errors
    ///
    /// The error storing a group that the pending rollouts complete (as in [`Self::add`]);
    /// `start` stops at the first one. Unreadable or invalid pending rollouts are skipped
    /// with a warning (and kept in the log, until a resend of the uid replaces them), as
    /// is one without a field the buffer now reads and no RPC outputs (`reward`,
    /// `ref_logprobs`; see [`Self::add`]), which would sink its whole group when it
    /// sealed. Pending rollouts were accepted before: they
    /// rejoin their groups whatever `config`'s policy versions and replica cap say (as
    /// [`Self::reconfigure`] keeps them), which apply to rollouts added from now on.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future starts no task. Groups whose put was claimed are stored (as in
    /// [`Self::add`]); the rest stay pending in the buffer's log, added back by the next
    /// `start`.
    pub async fn start(buf: SequenceBuffer, config: GroupConfig) -> Result<Self> {
        let (ingest, sealed) = Self::resume(buf, config).await?;
        for group in sealed {
            ingest.store(group, None).await?;
        }
        ingest.spawn_timer();
        Ok(ingest)
    }

    /// [`Self::start`], except that the groups the pending rollouts complete are stored by
    /// a task, so this returns without waiting for room: a server restarted over a full
    /// buffer (with a smaller group size, which completes groups at once) must listen
    /// before any read can make that room. Until a group is stored, a resend of one of its
    /// rollouts waits for the outcome, as one does while an [`Self::add`] stores it.
    ///
    /// The task's result is the first error storing a group (every group is tried); its
    /// rollouts stay pending in the log, added back by the next start.
    ///
    /// # Errors
    ///
    /// Writing the log's removal of duplicate pending rollouts.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::start`]; once this returns, the task runs on its own.
    pub async fn start_background(
        buf: SequenceBuffer,
        config: GroupConfig,
    ) -> Result<(Self, tokio::task::JoinHandle<Result<()>>)> {
        let (ingest, sealed) = Self::resume(buf, config).await?;
        // Each group's uids are marked before the task exists, so no resend slips in
        // before it starts, and unmarked once that group is stored (or the task is
        // dropped), so a resend waits for its own group's outcome only.
        let marked: Vec<(SealedGroup, InFlight)> = {
            let mut state = ingest.shared.state.lock();
            sealed
                .into_iter()
                .map(|group| {
                    let uids: Vec<String> = super::members(&group).collect();
                    let n = uids.len();
                    let guard = InFlight::mark(&ingest.shared, &mut state, uids, Vec::new(), n);
                    (group, guard)
                })
                .collect()
        };
        let storing = ingest.clone();
        let task = tokio::spawn(async move {
            let mut first_error = None;
            for (group, in_flight) in marked {
                if let Err(e) = storing.store(group, None).await {
                    tracing::warn!(error = %e, "a group completed at the start was not stored");
                    first_error.get_or_insert(e);
                }
                drop(in_flight);
            }
            first_error.map_or(Ok(()), Err)
        });
        ingest.spawn_timer();
        Ok((ingest, task))
    }

    /// Starts the task that seals groups at their timeout.
    fn spawn_timer(&self) {
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(seal_on_time(weak, Arc::clone(&self.shared.timer)));
    }

    /// The ingest over `buf`'s durable state, and the groups its pending rollouts complete
    /// (not stored yet); duplicates among the pending rollouts are removed from the log.
    async fn resume(buf: SequenceBuffer, config: GroupConfig) -> Result<(Self, Vec<SealedGroup>)> {
        let remember_groups = config.remember;
        let mut markers: Vec<(u64, String, Arc<Sample>)> = buf
            .aux_range(SEALED)
            .into_iter()
            .map(|(k, v)| (v.birth.unwrap_or(0), k[SEALED.len()..].to_owned(), v))
            .collect();
        markers.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let next_seal = markers.last().map_or(1, |m| m.0 + 1);
        let mut assembler = GroupAssembler::new(config);
        assembler.require(
            OptionalField::ALL
                .into_iter()
                .filter(|f| buf.needs_dataset_key(f.key()))
                .collect(),
        );
        // The uids of the groups stored last are duplicates again after a restart, as
        // they were before it, and taken for any other group (markers written before
        // markers held uids have none; before they held key tags, they are duplicates for
        // any group).
        for (_, _, marker) in &markers {
            let Some(uids) = marker.get(MARKER_UIDS).and_then(|t| t.array::<String>()) else {
                continue;
            };
            let uids = uids.iter().cloned();
            match marker
                .get(MARKER_KEY_TAG)
                .and_then(|t| t.scalar_value::<i64>())
            {
                Some(tag) => assembler.remember_gone_from(uids, tag as u64),
                None => assembler.remember_gone(uids),
            }
        }
        let markers: Vec<(u64, String)> =
            markers.into_iter().map(|(seq, id, _)| (seq, id)).collect();
        let shared = Arc::new(Shared {
            buf: buf.clone(),
            state: Mutex::new(State {
                assembler,
                sealed: markers.into_iter().map(|(_, id)| id).collect(),
                next_seal,
                counters: IngestCounters::default(),
                in_flight: HashMap::new(),
                writing: HashSet::new(),
                waiters: 0,
                storing: 0,
            }),
            timer: Arc::new(Timer {
                wake: Notify::new(),
                stopped: AtomicBool::new(false),
            }),
            settled: Notify::new(),
            remember_groups,
        });
        let ingest = Self { shared };
        let now = crate::buffer::now();
        let mut sealed = Vec::new();
        let mut stale = Vec::new();
        // Logged once the lock is dropped: a log event can wait (under Python, for the GIL).
        let mut unreadable = Vec::new();
        let mut invalid = Vec::new();
        {
            let mut state = ingest.shared.state.lock();
            for (key, value) in buf.aux_range(PENDING) {
                let Some(record) = RolloutRecord::from_sample(&value) else {
                    unreadable.push(key);
                    continue;
                };
                state.counters.recovered_rollouts += 1;
                // Accepted before the restart: this configuration's versions and replica
                // cap are not applied again (as `reconfigure` keeps what it holds), so
                // nothing acknowledged is refused after the fact.
                match state.assembler.add_accepted(record, now) {
                    Ok(Added::Sealed(group)) => sealed.push(group),
                    // Its uid was stored in a group since (the same uid sent to two
                    // groups, in a log written before such rollouts were refused): it
                    // stays out, and so leaves the log.
                    Ok(Added::Duplicate | Added::UidTaken { .. }) => {
                        stale.push(AuxWrite::remove(key.to_string()));
                    }
                    Ok(_) => {}
                    Err(e) => invalid.push(e),
                }
            }
        }
        for key in unreadable {
            tracing::warn!(key = %key, "unreadable pending rollout skipped");
        }
        for e in invalid {
            tracing::warn!(error = %e, "invalid pending rollout skipped");
        }
        if !stale.is_empty() {
            buf.aux_write(stale).await?;
        }
        Ok((ingest, sealed))
    }
}
