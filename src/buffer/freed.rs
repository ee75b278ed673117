//! `FreedSink`: where samples go when their slot is freed.
//!
//! The buffer calls the sink outside its lock, after notifying waiters, with every sample
//! whose reads were all used. The persistence layer implements it to archive consumed
//! samples (`persist::Archiver`); without a sink the payloads are simply dropped.

use super::Shared;
use crate::error::Result;
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

    /// Resolves once every sample handed over so far is written (for sinks that write in
    /// the background); the default has nothing to wait for.
    fn flush(&self) -> SinkFuture {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The future [`FreedSink::flush`] returns.
pub type SinkFuture = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

impl Shared {
    /// After a transition, outside the lock: notifies the waiters it unblocked and hands
    /// the payloads it freed to the sink.
    pub(crate) fn settle(&self, (wake, freed): (crate::state::Wake, Vec<Arc<Sample>>)) {
        self.notify(wake);
        self.dispose(freed);
    }

    /// Hands freed payloads to the sink, if any; runs outside the lock.
    pub(crate) fn dispose(&self, freed: Vec<Arc<Sample>>) {
        if freed.is_empty() {
            return;
        }
        if let Some(sink) = &self.freed_sink {
            sink.consumed(freed, &self.read_by);
        }
    }
}
