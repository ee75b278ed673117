//! `SequenceBuffer`: the async buffer around the slot state machine.
//!
//! # Locking
//!
//! One `Mutex<Inner>` guards the [`SlotTable`], the stored payloads (`Arc<Sample>` per
//! slot), the id index and the journal handle (log records are appended under it, so the
//! log is in the order of the changes). It is held only for synchronous work proportional
//! to the batch at hand: no await, no I/O, no copies of tensor data; the journal's writer
//! encodes and writes outside it. Payloads move as `Arc`s; a batch
//! holds `Arc` snapshots of its samples; an amend or completion of a sample whose previous
//! version a batch still holds copies only the sample's small list of field handles.
//!
//! # Wake-ups
//!
//! One `Notify` per RPC (its getters wait there) and one for space (putters wait there).
//! Every wait follows the same protocol, which cannot lose a wake-up:
//!
//! 1. create the `Notified` future and `enable()` it;
//! 2. take the lock and try the operation; on success return;
//! 3. drop the lock and await the `Notified`.
//!
//! Every transition returns a [`Wake`] saying which RPCs gained eligible samples and whether
//! free slots appeared; the caller notifies (`notify_waiters`) those after dropping the lock.
//! A notification between steps 1 and 3 completes the enabled future, so a waiter that saw
//! "not ready" in step 2 still wakes. Transitions that notify: put publish and amend finish
//! (RPCs whose inputs are now present; space when an amend's end frees its slot), lease
//! completion (RPCs whose inputs the outputs completed, the RPC itself when reads remain,
//! space when slots are freed), lease release and expiry (the lease's RPC), a put that gives
//! its claimed slots back, putter dequeue (space), and `close` (everyone).
//!
//! # Cancellation
//!
//! Without a sync journal, a put, an amend and a completion each change the state in one
//! critical section, with no await inside. With one (see `journal.rs`), the change is
//! finished by the journal's callback when its record is durable, whatever happened to the
//! caller's future; the guards that callback owns (claimed slots, an amend in flight, a
//! lease being finished) undo the change if the write fails or the journal goes away. A
//! waiting putter's queue ticket is removed on drop; a get leases and builds its [`Batch`]
//! without an await in between, and a `Batch` dropped without `complete`/`commit` releases
//! its lease.

mod amend;
mod aux;
mod batch;
mod config;
mod contents;
mod freed;
mod freshness;
mod get;
mod journal;
mod prepare;
mod put;
#[cfg(feature = "persist")]
mod restore;
mod select;
mod spill;
mod stats;
mod steps;

pub use batch::{Batch, SampleView, DISCARD_REASON};
pub use config::{BufferConfig, Overflow};
pub use contents::StoredSample;
pub(crate) use freed::Freed;
pub use freed::{FreedSink, SinkFuture};
pub use freshness::{CREATED_TS, POLICY_VERSION};
pub use stats::{RateLimitStats, RpcStats, RpcWaiting, SpillStats, Stats};

pub(crate) use aux::{AuxMap, AuxWrite};
pub(crate) use journal::{Durable, Journal, JournalFuture, Record};
#[cfg(feature = "persist")]
pub(crate) use restore::Restored;
#[cfg(feature = "persist")]
pub(crate) use spill::SpillFuture;
#[cfg(feature = "persist")]
pub(crate) use spill::{merge as merge_spilled, strike, SpillPart};
pub(crate) use spill::{Segment, SpillStore};

use crate::error::{Error, Result};
use crate::exit::ExitReason;
use crate::rpc_defs::{RpcDef, RpcGraph};
use crate::sample::{IdIndex, Patch, Sample, SampleId};
use crate::state::{Generation, RpcSpec, SlotTable, Wake};
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, MutexGuard, Notify, Ordering};
use std::time::Instant;

/// Bytes of the slot table per slot, at least (its line in the state machine).
const SLOT_LINE: usize = 64;

/// Names a stored sample: its slot and the slot's generation when the sample was put.
///
/// Returned by `put_batch` (in input order) and by [`Batch::handles`]; `amend_batch` rejects
/// a handle whose slot has since been freed or reused with [`Error::StaleHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotHandle {
    slot: u32,
    generation: Generation,
}

impl SlotHandle {
    /// A handle from its parts (one that crossed a process or language boundary as two
    /// integers). `amend_batch` checks the generation, so a handle to a slot freed or
    /// reused since is refused with [`Error::StaleHandle`].
    pub fn new(slot: u32, generation: u32) -> Self {
        Self {
            slot,
            generation: Generation::from_raw(generation),
        }
    }

    /// The slot index.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's generation when the handle was made.
    pub fn generation(&self) -> u32 {
        self.generation.get()
    }
}

/// The async, multi-producer multi-consumer sequence buffer. Cheap to clone: clones share
/// one buffer.
///
/// ```
/// use rollout_buffer::{RpcDef, Sample, SequenceBuffer, Tensor, Patch};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), rollout_buffer::Error> {
/// let buf = SequenceBuffer::new(8, [
///     RpcDef::new("gen", 2).inputs(["prompt"]).outputs(["tokens"]),
///     RpcDef::new("train", 2).inputs(["tokens"]),
/// ])?;
/// buf.put_batch(vec![
///     Sample::new("a").with("prompt", vec![1i32, 2]),
///     Sample::new("b").with("prompt", vec![3i32]),
/// ]).await?;
/// let batch = buf.get_batch_for_rpc("gen").await?;
/// let outputs = batch.samples().map(|_| Patch::new().with("tokens", vec![9i32])).collect();
/// batch.complete(outputs).await?;
/// buf.get_batch_for_rpc("train").await?.commit().await?;
/// assert_eq!(buf.len(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SequenceBuffer {
    shared: Arc<Shared>,
}

/// What every clone of a buffer and every live `Batch` share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) capacity: usize,
    pub(crate) graph: RpcGraph,
    /// Per RPC: its input key names (a batch carries only these fields).
    pub(crate) input_names: Vec<Vec<Arc<str>>>,
    pub(crate) inner: Mutex<Inner>,
    /// Per RPC: its getters wait here.
    pub(crate) rpc_ready: Vec<Notify>,
    /// Putters wait here for free slots or their turn at the head of the queue.
    pub(crate) space: Notify,
    /// Mirrors `Inner::closed` so calls fail fast after `close()`; the flag under the lock
    /// stays the one that decides.
    pub(crate) closed: AtomicBool,
    /// Where freed samples go (see `freed.rs`).
    pub(crate) freed_sink: Option<Arc<dyn FreedSink>>,
    /// Every RPC name once per read: what a consumed sample was read by.
    pub(crate) read_by: Vec<String>,
    /// Whether changes wait for their log records to be durable (a sync journal).
    pub(crate) sync_journal: bool,
    /// Whether some RPC has an age bound (puts then read `created_ts`).
    pub(crate) ages: bool,
    /// The byte budget, if any.
    pub(crate) max_bytes: Option<u64>,
    /// What a put that does not fit does.
    pub(crate) overflow: Overflow,
    /// The memory budget, if any (see `spill.rs`).
    pub(crate) memory_budget: Option<u64>,
    /// Whether the buffer has a spill store (spilled samples to load, a spiller to wake).
    pub(crate) spills: bool,
    /// The spiller waits here (see `spill.rs`); its own `Arc` so the task can wait without
    /// keeping the buffer alive.
    pub(crate) spill_wake: Arc<Notify>,
    /// Freed spilled samples on their way to the sink (see `spill.rs`).
    pub(crate) handover: Arc<spill::HandOver>,
    /// How long a getter waits before it logs why (see `get.rs`), if at all.
    pub(crate) wait_warning: Option<std::time::Duration>,
    /// Per RPC: warnings logged by waiting getters.
    pub(crate) wait_warnings: Vec<AtomicU64>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.spills {
            // The spiller sees the buffer gone and ends.
            self.spill_wake.notify_waiters();
        }
    }
}

/// Everything the buffer's lock guards.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) table: SlotTable,
    /// Per slot: the stored sample (`None` while empty or being put).
    pub(crate) samples: Vec<Option<Arc<Sample>>>,
    /// Id -> slot for every sample stored or being put.
    pub(crate) ids: IdIndex,
    pub(crate) closed: bool,
    /// Samples in rejected put calls.
    pub(crate) rejected: u64,
    /// The durable log, if any. It lives under the lock so that every record is appended
    /// while the change it describes is made, which keeps the log in the buffer's order.
    pub(crate) journal: Option<Arc<dyn Journal>>,
    /// RPC names by index, for log records.
    pub(crate) rpc_names: Vec<Arc<str>>,
    /// Auxiliary entries (see `aux.rs`).
    pub(crate) aux: AuxMap,
    /// Spilled payloads, with a memory budget (see `spill.rs`).
    pub(crate) spill: Option<spill::SpillState>,
    /// Whether freed samples go to a sink (which then gets their spilled fields too).
    pub(crate) sink_wants_fields: bool,
    /// The RPCs with `Prioritized` selection: index, priority key, exponent (`select.rs`).
    pub(crate) prioritized: Vec<(usize, String, f64)>,
}

impl Inner {
    /// Drops the payload and id of freed slots (logging that they left); returns the
    /// payloads so the caller can drop them after releasing the lock.
    pub(crate) fn take_freed(&mut self, freed: &[u32]) -> Freed {
        let mut out = Freed::default();
        for &s in freed {
            if let Some(sample) = self.samples.get_mut(s as usize).and_then(Option::take) {
                self.ids.remove(&sample.id);
                if let Some(spill) = self.spill.as_mut() {
                    let rows = spill.forget(s, self.sink_wants_fields);
                    if !rows.is_empty() {
                        out.spilled.push(spill::FreedSpill {
                            id: sample.id.clone(),
                            rows,
                            at_hand: crate::sample::Fields::default(),
                            held: Vec::new(),
                        });
                    }
                    out.compact |= std::mem::take(&mut spill.compact_due);
                }
                out.push(sample, self.table.exits[s as usize]);
            }
        }
        // After the frees: segments whose rows this hand-over reads back stay retired
        // until it has read them.
        if let Some(spill) = self.spill.as_mut() {
            out.dead_segments.extend(spill.take_retired());
        }
        for (samples, reason) in [
            (&out.consumed, ExitReason::Consumed),
            (&out.stale, ExitReason::Stale),
            (&out.evicted, ExitReason::Evicted),
            (&out.filtered, ExitReason::Filtered),
        ] {
            if !samples.is_empty() {
                self.log(|| Record::Free {
                    ids: samples.iter().map(|s| s.id.clone()).collect(),
                    reason,
                });
            }
        }
        out
    }

    /// Releases the leases past their deadline at `now` (logging each release) and ages
    /// samples out; freed slots are appended to `freed`.
    pub(crate) fn expire_due(&mut self, now: Instant, freed: &mut Vec<u32>) -> Wake {
        let mut expired = Vec::new();
        let mut wake = self.table.expire_due(now, freed, &mut expired);
        wake.merge(self.table.age_out(now, freed));
        for (r, slots) in expired {
            if let (Some(journal), Some(rpc)) = (&self.journal, self.rpc_names.get(r)) {
                let release = Record::Release {
                    rpc: Arc::clone(rpc),
                    ids: self.ids_of(slots),
                    expired: true,
                };
                // Only a callback is ever handed back.
                let _ = journal.append(vec![release], None);
            }
        }
        wake
    }

    /// Applies `patch` to the sample in `slot` (copying its field list if a batch still
    /// holds the old version), keeping the byte budget's count of it up to date.
    /// A spilled sample's patch goes to its stub, and the keys it sets leave the spilled
    /// list (see `spill.rs`).
    pub(crate) fn patch(&mut self, slot: u32, patch: &Patch) {
        let Some(Some(sample)) = self.samples.get_mut(slot as usize) else {
            return;
        };
        let sample = Arc::make_mut(sample);
        sample.apply(patch);
        let held = sample.payload_bytes();
        let resident = spill::spillable_bytes(sample);
        self.refresh_priorities(slot, Some(patch));
        let mut spilled = 0;
        if let Some(spill) = self.spill.as_mut() {
            if !spill.parts(slot).is_empty() {
                let keys: Vec<&str> = patch.keys().collect();
                spill.strike(slot, &keys);
                spilled = spill.spilled_bytes(slot);
            }
        }
        if self.table.budget.max.is_some() {
            self.table.set_bytes(slot as usize, held + spilled);
        }
        if self.table.residency.max.is_some() {
            self.table.set_resident(slot as usize, resident);
        }
    }

    /// Appends the record `make` builds, if there is a log (without one nothing is built).
    pub(crate) fn log(&self, make: impl FnOnce() -> Record) {
        if let Some(journal) = &self.journal {
            // Only a callback is ever handed back.
            let _ = journal.append(vec![make()], None);
        }
    }

    /// The ids of the samples stored in `slots`.
    pub(crate) fn ids_of(&self, slots: impl IntoIterator<Item = u32>) -> Vec<SampleId> {
        slots
            .into_iter()
            .filter_map(|s| self.samples.get(s as usize)?.as_ref().map(|x| x.id.clone()))
            .collect()
    }
}

/// Which end of the birth order the spiller takes first: the one the last RPC (by
/// convention the trainer, where samples wait longest) reaches last.
fn spill_newest_first(rpcs: &[RpcDef]) -> bool {
    use crate::rpc_defs::Selection;
    !matches!(
        rpcs.last().map(|r| &r.selection),
        Some(Selection::Lifo | Selection::Recency { .. } | Selection::OnPolicyFraction { .. })
    )
}

/// The current time on tokio's clock (which `tokio::time::pause` controls in tests).
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl SequenceBuffer {
    /// A buffer of `capacity` slots serving `rpcs`, with no external keys.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidCapacity`] for a capacity of 0 or past the slot index space.
    /// * [`Error::NoRpcs`] for no RPC, [`Error::TooMany`] for more RPCs or distinct keys
    ///   than the buffer's bit sets hold, and [`Error::DuplicateRpc`] for a name given twice.
    /// * [`Error::InvalidNSeqs`], [`Error::InvalidReads`] or [`Error::InvalidSelection`]
    ///   for an RPC whose `n_seqs`, reads or selection parameters are out of range.
    /// * [`Error::DuplicateProducer`] for a key two RPCs output, and [`Error::CyclicGraph`]
    ///   when an RPC's output feeds, directly or not, one of its own inputs.
    pub fn new(capacity: usize, rpcs: impl IntoIterator<Item = RpcDef>) -> Result<Self> {
        Self::with_config(BufferConfig::new(capacity).rpcs(rpcs))
    }

    /// A buffer built from a full configuration.
    ///
    /// # Errors
    ///
    /// As [`Self::build`]; without the `persist` feature a memory budget is
    /// [`Error::InvalidConfig`], as there is no spill store to spill to. (With it,
    /// `with_config` lives in `persist` and gives a memory budget a temporary spill
    /// directory.)
    #[cfg(not(feature = "persist"))]
    pub fn with_config(config: BufferConfig) -> Result<Self> {
        Self::build(config, false)
    }

    /// A buffer built from `config`; `sync_journal` says whether the journal that will be
    /// attached makes changes wait for durability. A memory budget needs a spill store:
    /// the storage layer chooses it (`persist`), this layer only uses one.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCapacity`], the RPC graph's validation errors, and
    /// [`Error::InvalidConfig`] for a memory budget without a spill store.
    pub(crate) fn build(config: BufferConfig, sync_journal: bool) -> Result<Self> {
        let capacity = config.capacity;
        if config.memory_budget.is_some() && config.spill_store.is_none() {
            return Err(Error::InvalidConfig {
                detail: "a memory budget needs a spill store (the `persist` feature's \
                         Parquet spill segments)"
                    .into(),
            });
        }
        let max = u32::MAX as usize;
        if capacity == 0 || capacity > max {
            return Err(Error::InvalidCapacity { capacity, max });
        }
        // The slot table is allocated up front, a cache line per slot and more: a capacity
        // the process cannot hold must be an error here, not an abort when it is built
        // (with Linux's default overcommit, a reservation past memory and swap fails).
        let table_bytes = capacity.saturating_mul(SLOT_LINE);
        if Vec::<u8>::new().try_reserve_exact(table_bytes).is_err() {
            return Err(Error::InvalidConfig {
                detail: format!(
                    "capacity {capacity}: its slot table alone needs {} MB, more than this \
                     process can allocate",
                    table_bytes >> 20
                ),
            });
        }
        let graph = RpcGraph::new(capacity, &config.rpcs, &config.external_keys)?;
        let specs: Vec<RpcSpec> = graph.rpcs().iter().map(RpcSpec::from).collect();
        let input_names = config
            .rpcs
            .iter()
            .map(|d| d.inputs.iter().map(|k| Arc::from(k.as_str())).collect())
            .collect();
        let n_rpcs = specs.len();
        let read_by = config
            .rpcs
            .iter()
            .flat_map(|d| std::iter::repeat_n(d.name.clone(), d.reads as usize))
            .collect();
        let inner = Inner {
            table: SlotTable::new(capacity, specs)
                .with_budget(config.max_bytes, config.overflow == Overflow::EvictOldest)
                .with_residency(config.memory_budget, spill_newest_first(&config.rpcs)),
            samples: vec![None; capacity],
            // Grows with the number of stored samples, not with the capacity: an index sized
            // for the capacity would spread a few live ids over a table far larger than the
            // cache, and every put and free would pay a miss (measured: 1.5x per call at
            // 512 live samples in a 2^20-slot buffer).
            ids: IdIndex::with_capacity_and_hasher(capacity.min(4096), Default::default()),
            closed: false,
            rejected: 0,
            journal: None,
            rpc_names: graph.rpcs().iter().map(|r| Arc::clone(&r.name)).collect(),
            aux: AuxMap::new(),
            spill: config
                .spill_store
                .as_ref()
                .map(|store| spill::SpillState::new(Arc::clone(store), capacity)),
            sink_wants_fields: config.freed_sink.is_some(),
            prioritized: graph
                .rpcs()
                .iter()
                .enumerate()
                .filter_map(|(r, d)| {
                    let (key, exponent) = d.selection.priority()?;
                    Some((r, key.to_owned(), exponent))
                })
                .collect(),
        };
        Ok(Self {
            shared: Arc::new(Shared {
                capacity,
                graph,
                input_names,
                inner: Mutex::new(inner),
                rpc_ready: (0..n_rpcs).map(|_| Notify::new()).collect(),
                space: Notify::new(),
                closed: AtomicBool::new(false),
                freed_sink: config.freed_sink,
                read_by,
                sync_journal,
                ages: config.rpcs.iter().any(|r| r.max_age.is_some()),
                max_bytes: config.max_bytes,
                overflow: config.overflow,
                memory_budget: config.memory_budget,
                spills: config.spill_store.is_some(),
                spill_wake: Arc::new(Notify::new()),
                handover: Arc::default(),
                wait_warning: config.wait_warning,
                wait_warnings: (0..n_rpcs).map(|_| AtomicU64::new(0)).collect(),
            }),
        })
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Every data key the buffer's RPCs name (their inputs, outputs and priority keys) and
    /// its external keys: the fields a sample may usefully carry. A put may carry others;
    /// no RPC reads them.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        let graph = &self.shared.graph;
        let rpcs = graph.rpcs();
        // A priority key is read by the selection, not as an input: not a graph key, unless
        // an RPC names it too. Each is listed once.
        let priorities = rpcs.iter().enumerate().filter_map(move |(i, r)| {
            let (key, _) = r.selection.priority()?;
            let named_before = rpcs[..i]
                .iter()
                .any(|e| e.selection.priority().is_some_and(|(k, _)| k == key));
            (graph.key_id(key).is_none() && !named_before).then_some(key)
        });
        graph.key_names().chain(priorities)
    }

    /// Number of samples stored (put and not yet freed).
    pub fn len(&self) -> usize {
        let inner = self.shared.inner.lock();
        inner.table.len() - inner.table.putting.count()
    }

    /// True when no sample is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes the buffer: every waiting call and every later put, amend or get returns
    /// [`Error::Closed`]. Leases already handed out can still be completed, committed or
    /// dropped, so consumers finish the work they hold. Idempotent.
    pub fn close(&self) {
        self.shared.inner.lock().closed = true;
        self.shared.closed.store(true, Ordering::Release);
        tracing::debug!("buffer closed");
        self.shared.notify(Wake {
            rpcs: (0..self.shared.graph.rpcs().len()).collect(),
            space: true,
            spill: true,
            ..Wake::default()
        });
    }

    /// Resolves once every change made so far is durable (with a journal) and every freed
    /// sample handed to the freed-sample sink is written; at once when there are neither.
    /// A persistent buffer also lets a running checkpoint finish, so after `flush` and
    /// dropping the buffer its store can be opened again at once (in this process or
    /// another) without racing the old buffer's background writes.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the log fails to write what was appended (or finds another
    /// buffer writing to its store; every later flush too, once that stopped the writer),
    /// [`Error::Closed`] when the log's writer has stopped otherwise, and the error of the
    /// freed-sample sink's [`FreedSink::flush`] (for an archiver, its failed write).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops only the wait: the log and the sink go on writing what
    /// they hold. An error only this call would have reported (an archiver's last failed
    /// write) is lost with it.
    pub async fn flush(&self) -> Result<()> {
        let journal = self.shared.lock().journal.clone();
        if let Some(journal) = &journal {
            journal.flush().await?;
        }
        if self.shared.spills {
            // Spill rounds, loads and deletes in flight (a segment a load held when its
            // last row was freed is deleted when the load ends), and the spiller catching
            // up with the budget; then what they logged.
            self.shared.handed_over().await;
            if let Some(journal) = &journal {
                journal.flush().await?;
            }
        }
        if let Some(sink) = &self.shared.freed_sink {
            sink.flush().await?;
            // A persistent archive logs that its batches are written: make that durable
            // too, so a flushed store needs no archive work at its next open.
            if let Some(journal) = &journal {
                journal.flush().await?;
            }
        }
        Ok(())
    }

    /// True once [`Self::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.shared.inner.lock().closed
    }

    /// Audits the whole state (slot masks, ready indexes, leases, payloads, id index).
    /// Costs O(capacity × RPCs): for tests and debugging, not hot paths.
    ///
    /// # Errors
    ///
    /// [`Error::InvariantViolated`], naming what is inconsistent (a bug in this crate).
    pub fn check_invariants(&self) -> Result<()> {
        let inner = self.shared.inner.lock();
        self.shared
            .check_inner(&inner)
            .map_err(|detail| Error::InvariantViolated { detail })
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Fails fast once the buffer is closed.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    /// Releases expired leases and ages samples out now, then notifies and disposes.
    pub(crate) fn reap_due(self: &Arc<Self>) {
        let mut freed = Vec::new();
        let ended = {
            let mut inner = self.lock();
            let wake = inner.expire_due(now(), &mut freed);
            (wake, inner.take_freed(&freed))
        };
        self.settle(ended);
    }

    /// Notifies the waiters a transition unblocked. Call after dropping the lock.
    pub(crate) fn notify(&self, wake: Wake) {
        if wake.expired_samples > 0 {
            tracing::debug!(
                samples = wake.expired_samples,
                "leases expired; redelivering"
            );
        }
        for r in wake.rpcs.iter() {
            match self.rpc_ready.get(r) {
                Some(n) => n.notify_waiters(),
                None => break,
            }
        }
        if wake.space {
            self.space.notify_waiters();
        }
        if wake.spill && self.spills {
            self.spill_wake.notify_waiters();
        }
    }

    fn check_inner(&self, inner: &Inner) -> std::result::Result<(), String> {
        let table = &inner.table;
        table.check_invariants()?;
        let mut reserved = 0usize;
        for s in 0..table.capacity {
            let stored = table.is_stored(s);
            let sample = inner.samples.get(s).and_then(Option::as_ref);
            if stored != sample.is_some() {
                return Err(format!(
                    "slot {s}: stored {stored} but payload present {}",
                    sample.is_some()
                ));
            }
            if let Some(sample) = sample {
                if inner.ids.get(&sample.id) != Some(&(s as u32)) {
                    return Err(format!("slot {s}: id `{}` not indexed to it", sample.id));
                }
                let spilled = inner
                    .spill
                    .as_ref()
                    .map_or(&[][..], |sp| sp.parts(s as u32));
                let keys = self.graph.key_set(
                    sample.keys().chain(
                        spilled
                            .iter()
                            .flat_map(|p| p.fields.iter().map(|(k, _)| &**k)),
                    ),
                );
                let resident = spill::spillable_bytes(sample);
                if table.residency.max.is_some() && table.residency.per_slot[s] != resident {
                    return Err(format!(
                        "slot {s}: {} resident bytes counted, {resident} held",
                        table.residency.per_slot[s]
                    ));
                }
                if keys != table.slots[s].keys {
                    return Err(format!(
                        "slot {s}: table keys {:#x} != payload keys {:#x}",
                        table.slots[s].keys.0, keys.0
                    ));
                }
            }
            if stored || table.putting.get(s) {
                reserved += 1;
            }
        }
        if inner.ids.len() != reserved {
            return Err(format!(
                "{} ids indexed for {reserved} stored or putting slots",
                inner.ids.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod audit_tests;
