//! `FreedSink`: where samples go when their slot is freed.
//!
//! The buffer calls the sink outside its lock, after notifying waiters, with every sample
//! whose reads were all used, and with every sample it dropped unconsumed (stale, or
//! evicted to make room). The persistence layer implements it to archive them
//! (`persist::Archiver`); without a sink the payloads are simply dropped.

use super::Shared;
use crate::error::Result;
use crate::exit::ExitReason;
use crate::sample::Sample;
use crate::sync::Arc;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// Receives the samples the buffer frees. Implementations must not block: the call runs on
/// the task that finished the last read.
pub trait FreedSink: Send + Sync + fmt::Debug {
    /// `samples` used every read of every RPC; `read_by` names the RPCs that read them, one
    /// entry per read (the same for every sample).
    fn consumed(&self, samples: Vec<Arc<Sample>>, read_by: &[String]);

    /// `samples` left the buffer unconsumed, for `reason`. The default drops them.
    fn dropped(&self, samples: Vec<Arc<Sample>>, reason: ExitReason) {
        let _ = (samples, reason);
    }

    /// Resolves once every sample handed over so far is written (for sinks that write in
    /// the background); the default has nothing to wait for.
    fn flush(&self) -> SinkFuture {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Resolves once every sample handed over so far is written, at the sink's own pace
    /// (unlike [`Self::flush`], it forces nothing), with the error of that write if it
    /// failed. The buffer waits for it before deleting the spill segments whose fields it
    /// read back for the sink, so a crash before the write can still find them. The
    /// default resolves at once.
    fn written(&self) -> SinkFuture {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The payloads a transition freed, by why they left; handed to the sink after unlocking.
#[derive(Debug, Default)]
#[must_use = "freed payloads go to the sink after the lock is dropped"]
pub(crate) struct Freed {
    pub(crate) consumed: Vec<Arc<Sample>>,
    pub(crate) stale: Vec<Arc<Sample>>,
    pub(crate) evicted: Vec<Arc<Sample>>,
    pub(crate) filtered: Vec<Arc<Sample>>,
    /// Spilled fields of the freed samples, by id (only with a sink, which gets the whole
    /// sample): read back before the sink sees them.
    pub(crate) spilled: Vec<super::spill::FreedSpill>,
    /// Spill segments left without a live row (deleted once `spilled` is read).
    pub(crate) dead_segments: Vec<Arc<super::Segment>>,
    /// A spill segment became sparse: the spiller should rewrite it.
    pub(crate) compact: bool,
}

impl Freed {
    pub(crate) fn push(&mut self, sample: Arc<Sample>, exit: ExitReason) {
        match exit {
            ExitReason::Consumed => self.consumed.push(sample),
            ExitReason::Stale => self.stale.push(sample),
            ExitReason::Evicted => self.evicted.push(sample),
            ExitReason::Filtered => self.filtered.push(sample),
        }
    }

    pub(crate) fn extend(&mut self, other: Freed) {
        self.consumed.extend(other.consumed);
        self.stale.extend(other.stale);
        self.evicted.extend(other.evicted);
        self.filtered.extend(other.filtered);
        self.spilled.extend(other.spilled);
        self.dead_segments.extend(other.dead_segments);
        self.compact |= other.compact;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.consumed.is_empty()
            && self.stale.is_empty()
            && self.evicted.is_empty()
            && self.filtered.is_empty()
            && self.dead_segments.is_empty()
    }
}

/// The future [`FreedSink::flush`] returns.
pub type SinkFuture = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

impl Shared {
    /// After a transition, outside the lock: notifies the waiters it unblocked and hands
    /// the payloads it freed to the sink.
    pub(crate) fn settle(self: &Arc<Self>, (wake, freed): (crate::state::Wake, Freed)) {
        self.notify(wake);
        self.dispose(freed);
    }

    /// Hands freed payloads to the sink, if any; runs outside the lock.
    pub(crate) fn dispose(self: &Arc<Self>, mut freed: Freed) {
        if freed.compact && self.spills {
            self.spill_wake.notify_waiters();
        }
        if freed.is_empty() {
            return;
        }
        // Logged here, after the lock, never under it (see `Wake::expired_samples`).
        if !freed.evicted.is_empty() {
            tracing::debug!(
                evicted = freed.evicted.len(),
                "evicted to make room for a put"
            );
        }
        if !freed.stale.is_empty() {
            tracing::debug!(dropped = freed.stale.len(), "stale samples dropped");
        }
        if !freed.spilled.is_empty() || !freed.dead_segments.is_empty() {
            // Spilled fields are read back (then their segments deleted) in a task.
            if let Some(freed) = self.hand_over_spilled(std::mem::take(&mut freed)) {
                self.hand_to_sink(freed);
            }
            return;
        }
        self.hand_to_sink(freed);
    }

    /// Hands freed samples to the sink, if any.
    pub(crate) fn hand_to_sink(&self, freed: Freed) {
        if let Some(sink) = &self.freed_sink {
            hand_to_sink(&**sink, &self.read_by, freed);
        }
    }
}

/// Hands freed samples to `sink`; `read_by` names every RPC once per read.
pub(crate) fn hand_to_sink(sink: &dyn FreedSink, read_by: &[String], freed: Freed) {
    {
        if !freed.consumed.is_empty() {
            sink.consumed(freed.consumed, read_by);
        }
        if !freed.stale.is_empty() {
            sink.dropped(freed.stale, ExitReason::Stale);
        }
        if !freed.evicted.is_empty() {
            sink.dropped(freed.evicted, ExitReason::Evicted);
        }
        if !freed.filtered.is_empty() {
            sink.dropped(freed.filtered, ExitReason::Filtered);
        }
    }
}
