//! `Journal`: the durable log the buffer writes through, defined here so the buffer never
//! depends on how (or whether) it is stored. `persist::Wal` implements it.
//!
//! # Ordering
//!
//! The buffer appends with its lock held, so the log order is the order in which the
//! changes happened. One call's records are appended as one unit, and a journal writes
//! units whole: after a crash a call is either entirely in the log or not at all.
//!
//! # Sync journals
//!
//! When [`Journal::sync`] is true, a put, an amend or a completion does not take effect
//! when it is appended: its slots stay hidden (`putting`, `amending`, or leased) and the
//! journal calls the unit's [`Durable`] callback once the unit is on storage (`Ok`), or
//! known not to be (`Err`). The callback publishes or undoes the change under the buffer's
//! lock. Callbacks run in log order, from the journal's writer, independently of the
//! caller, so a caller that stops waiting (a dropped future) changes nothing: the change
//! lands exactly when its record does. Records whose changes are already visible (releases,
//! frees) carry no callback; losing them in a crash loses nothing the log cannot rebuild.

// Without `persist` nothing implements the journal; the buffer's side of it stays compiled.
#![cfg_attr(not(feature = "persist"), allow(dead_code))]

use super::spill::SpillPart;
use super::AuxWrite;
use crate::error::{Error, Result};
use crate::exit::ExitReason;
use crate::sample::{Patch, Sample, SampleId};
use crate::sync::Arc;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// One change to the buffer's contents, in the order the buffer applied it.
#[derive(Debug, Clone)]
pub(crate) enum Record {
    /// Samples stored, with their births assigned.
    Put(Vec<Arc<Sample>>),
    /// `patches[i]` applied to sample `ids[i]`.
    Amend {
        ids: Vec<SampleId>,
        patches: Arc<[Patch]>,
    },
    /// RPC `rpc` used one read of every sample in `ids`, adding `outputs[i]` to sample `i`.
    Complete {
        rpc: Arc<str>,
        ids: Vec<SampleId>,
        outputs: Option<Arc<[Patch]>>,
    },
    /// RPC `rpc` gave its lease of `ids` back unused (`expired`: by the lease timeout).
    Release {
        rpc: Arc<str>,
        ids: Vec<SampleId>,
        expired: bool,
    },
    /// The samples left the buffer.
    Free {
        ids: Vec<SampleId>,
        reason: ExitReason,
    },
    /// Auxiliary entries set or removed (see `aux.rs`).
    Aux(Vec<AuxWrite>),
    /// The archiver is about to write freed samples `ids` as archive batch `batch`
    /// (persistence only: the buffer never logs it). Until `Archived` follows, recovery
    /// keeps these samples and writes the batch again, under the same names.
    Archiving { batch: u64, ids: Vec<SampleId> },
    /// Archive batch `batch` is on storage: its samples may leave the durable state.
    Archived { batch: u64 },
    /// Fields of `ids[i]` moved to `parts[i]` of a spill segment and out of memory. With
    /// `replaces`, a rewrite: each sample's part in segment `replaces` is now `parts[i]`.
    Spill {
        ids: Vec<SampleId>,
        parts: Vec<SpillPart>,
        replaces: Option<u64>,
    },
}

/// Called once with the fate of a unit of records: `Ok` once it is durable, `Err` once it
/// is known not to be. Runs on the journal's writer, outside the journal's own lock.
pub(crate) type Durable = Box<dyn FnOnce(Result<()>) + Send>;

/// A future the journal returns (boxed: the trait is used as `dyn`).
pub(crate) type JournalFuture = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// The log a buffer writes through (see the module docs).
pub(crate) trait Journal: Send + Sync + fmt::Debug {
    /// Queues `records` as one unit. Called with the buffer's lock held: it must only
    /// queue, never block, wait, or run or drop `then` (which takes the buffer's lock).
    /// `then`, if given, is called with the unit's fate. A journal that can no longer write
    /// hands `then` back; the caller drops it after unlocking, which undoes the change (as
    /// does a `then` the journal drops uncalled when it shuts down).
    #[must_use = "a callback handed back must be dropped after the buffer's lock"]
    fn append(&self, records: Vec<Record>, then: Option<Durable>) -> Option<Durable>;

    /// Writes everything appended so far and resolves once it is durable, or with the
    /// error that stopped it.
    fn flush(&self) -> JournalFuture;

    /// The error that stopped the journal's writer for good, if one did: what a call whose
    /// change was handed back (or dropped) returns, instead of a bare [`Error::Closed`].
    fn stopped_by(&self) -> Option<Error> {
        None
    }

    /// `Some(wait)` when more put data waits to be written than the journal's limit:
    /// putters await it, outside the buffer's lock, before claiming slots, so a store that
    /// falls behind slows puts down instead of growing memory without bound. Called with
    /// the buffer's lock held: it only looks.
    fn backlog(&self) -> Option<JournalFuture>;
}

impl super::Shared {
    /// The fate of a change a sync journal logs, sent on `rx` by its callback. A callback
    /// the journal handed back or dropped uncalled answers with the error that stopped the
    /// journal's writer (another buffer writing the store, say), or [`Error::Closed`].
    /// Takes the lock then: await it after dropping it.
    pub(crate) async fn verdict<T>(
        &self,
        rx: crate::sync::oneshot::Receiver<Result<T>>,
    ) -> Result<T> {
        rx.await.unwrap_or_else(|_| {
            let inner = self.lock();
            let stopped = inner.journal.as_ref().and_then(|j| j.stopped_by());
            Err(stopped.unwrap_or(Error::Closed))
        })
    }
}
