//! Sealing outside `add`: the timer task that seals groups at their timeout (and the
//! ingest's `seal_due`, which it calls), and `reconfigure`, which regroups what is pending
//! under new settings. Both take the state mutex as `add` does, never across an await.

use super::{members, pending_key, GroupIngest, InFlight, Shared, Timer};
use crate::buffer::AuxWrite;
use crate::error::Result;
use crate::rollout::assembler::{Added, GroupConfig};
use crate::sync::{Arc, Ordering, Weak};
use std::time::Instant;

impl GroupIngest {
    /// Seals and stores every group whose timeout passed by `now` (the background task
    /// does this on its own; tests and callers driving time may call it).
    ///
    /// # Errors
    ///
    /// With a sync journal, [`Error::Storage`](crate::Error::Storage) or [`Error::Closed`](crate::Error::Closed) when forgetting the
    /// rollouts of groups dropped unsealed fails to be logged, or the first error storing a
    /// group (as in [`Self::add`]); every due group is tried either way.
    ///
    /// # Cancel safety
    ///
    /// The due groups leave the assembler at the first poll. A future dropped before a
    /// group's put is claimed leaves that group unstored, its rollouts pending in the log
    /// only (added back by the next [`Self::start`]).
    pub async fn seal_due(&self, now: Instant) -> Result<()> {
        let (due, mut in_flight) = {
            let mut state = self.shared.state.lock();
            let due = state.assembler.seal_due(now);
            let watched: Vec<String> = due.sealed.iter().flat_map(members).collect();
            let storing = watched.len();
            (
                due,
                InFlight::mark(&self.shared, &mut state, watched, Vec::new(), storing),
            )
        };
        for (key, rollouts) in &due.dropped {
            tracing::warn!(
                group = %crate::rollout::key_tag(key),
                rollouts = rollouts.len(),
                "a group timed out short of its minimum size and is dropped"
            );
        }
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
            let n = group.rollouts.len();
            if let Err(e) = self.store(group, None).await {
                first_error.get_or_insert(e);
            }
            in_flight.stored(n);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Takes `config` from now on, in place: every pending rollout is grouped again under
    /// it (see [`GroupAssembler::reconfigure`](crate::rollout::GroupAssembler::reconfigure)) and the groups that completes are stored
    /// before this returns. Calls adding rollouts meanwhile go on against the same groups,
    /// so none is lost or stored twice (a second ingest started on the same buffer would
    /// race this one for the pending rollouts). The seal timer takes the new timeouts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a change of grouping mode, with nothing changed; else
    /// the first error storing a completed group (as in [`Self::add`]), every group tried.
    ///
    /// # Cancel safety
    ///
    /// The new configuration is taken at the first poll. As in [`Self::add`], a future
    /// dropped before a completed group's put is claimed leaves that group unstored, its
    /// rollouts pending in the log only (added back by the next [`Self::start`]); a caller
    /// that may be cancelled (a request handler) runs it in a task of its own.
    pub async fn reconfigure(&self, config: GroupConfig) -> Result<Vec<Added>> {
        let (sealed, mut in_flight) = {
            let mut state = self.shared.state.lock();
            let sealed = state.assembler.reconfigure(config, crate::buffer::now())?;
            let watched: Vec<String> = sealed.iter().flat_map(members).collect();
            let storing = watched.len();
            (
                sealed,
                InFlight::mark(&self.shared, &mut state, watched, Vec::new(), storing),
            )
        };
        self.shared.timer.wake.notify_one();
        let mut out = Vec::with_capacity(sealed.len());
        let mut first_error = None;
        for group in sealed {
            let n = group.rollouts.len();
            match self.store(group, None).await {
                Ok(added) => out.push(added),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            in_flight.stored(n);
        }
        first_error.map_or(Ok(out), Err)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.timer.stopped.store(true, Ordering::Release);
        self.timer.wake.notify_one();
    }
}

/// The timer task: sleeps until the earliest seal deadline (or a new group), then seals
/// what is due. Ends when the last clone of the ingest is dropped.
pub(super) async fn seal_on_time(weak: Weak<Shared>, timer: Arc<Timer>) {
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
