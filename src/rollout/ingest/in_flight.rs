//! The in-flight uids of [`GroupIngest`](super::GroupIngest): rollouts whose outcome is not
//! decided yet (see the ingest module's docs), so that a resend waits for it.
//!
//! Everything here is guarded by the ingest's state mutex (`State::in_flight`,
//! `State::writing`, `State::waiters`). A call marks uids under the lock that decided
//! their outcome is pending, and its [`InFlight`] guard unmarks them when the call ends,
//! however it ends (also when its future is dropped); it then notifies `Shared::settled`,
//! after dropping the lock, if a resend is waiting.

use super::{Shared, State};
use crate::sync::Arc;

/// The uids one call marked: in flight (counted, as a uid can be both a pending rollout
/// whose write is in flight and a member of a group being stored), and those whose own
/// pending write is in flight.
pub(super) struct InFlight {
    /// Owned, so a guard can live in a task of its own (the groups a restart completes).
    shared: Arc<Shared>,
    uids: Vec<String>,
    writing: Vec<String>,
    /// Rollouts of the groups sealed and being stored, counted in `State::storing`: out
    /// of the assembler and not yet in the buffer, so no other count holds them.
    storing: usize,
}

impl InFlight {
    /// Marks `uids` in flight, `writing` as having their pending write in flight, and
    /// counts `storing` rollouts of sealed groups as being stored.
    pub(super) fn mark(
        shared: &Arc<Shared>,
        state: &mut State,
        uids: Vec<String>,
        writing: Vec<String>,
        storing: usize,
    ) -> Self {
        state.storing += storing;
        for uid in &uids {
            *state.in_flight.entry(uid.clone()).or_default() += 1;
        }
        for uid in &writing {
            state.writing.insert(uid.clone());
        }
        Self {
            shared: Arc::clone(shared),
            uids,
            writing,
            storing,
        }
    }

    /// `n` rollouts of the groups being stored are decided (stored, put back as pending or
    /// refused): they leave `State::storing` now, not when the call ends, so a group stored
    /// while a later one of the same call waits for room is not counted twice meanwhile.
    pub(super) fn stored(&mut self, n: usize) {
        let n = n.min(self.storing);
        if n > 0 {
            self.shared.state.lock().storing -= n;
            self.storing -= n;
        }
    }

    /// The pending writes are decided: called under the lock that also withdraws them if
    /// they failed, so a reopen never sees a failed write as still in flight.
    pub(super) fn written(&mut self, state: &mut State) {
        for uid in self.writing.drain(..) {
            state.writing.remove(&uid);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.uids.is_empty() && self.writing.is_empty() && self.storing == 0 {
            return;
        }
        let wake = {
            let mut state = self.shared.state.lock();
            state.storing -= self.storing;
            // As `written` does, on the fields apart (the lock borrows `shared`).
            for uid in self.writing.drain(..) {
                state.writing.remove(&uid);
            }
            for uid in &self.uids {
                if let Some(n) = state.in_flight.get_mut(uid) {
                    *n -= 1;
                    if *n == 0 {
                        state.in_flight.remove(uid);
                    }
                }
            }
            state.waiters > 0
        };
        if wake {
            self.shared.settled.notify_waiters();
        }
    }
}

/// Waits until `uid` is not in flight.
pub(super) async fn settled(shared: &Shared, uid: &str) {
    loop {
        let notified = shared.settled.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let _waiting = {
            let mut state = shared.state.lock();
            if !state.in_flight.contains_key(uid) {
                return;
            }
            state.waiters += 1;
            Waiting(shared)
        };
        notified.await;
    }
}

/// Counts one resend waiting in [`settled`], so that unmarking notifies only when someone
/// waits.
struct Waiting<'a>(&'a Shared);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.waiters = state.waiters.saturating_sub(1);
    }
}
