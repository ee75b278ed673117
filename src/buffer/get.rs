//! `get_batch_for_rpc` and its timeout variant.
//!
//! A getter waits on its RPC's `Notify` until at least `n_seqs` samples are eligible, then
//! leases exactly `n_seqs` in the RPC's selection order. Leasing and building the `Batch`
//! happen without an await in between, so a cancelled get never leaves a lease behind.
//!
//! Waiting getters also reap expired leases: while any lease has a deadline, a getter sleeps
//! at most until the earliest one, then releases what has expired (which wakes the getters
//! of that lease's RPC).

use super::batch::Batch;
use super::select::lease;
use super::spill::{BatchLoad, LoadPlan, SpillStore};
use super::steps::{lease_step, log_step, StepLogged};
use super::{now, Inner, SequenceBuffer, Shared, SlotHandle};
use crate::deadline::FOREVER;
use crate::error::{Error, Result, Unstored};
use crate::rpc_defs::Selection;
use crate::sample::Sample;
use crate::state::prefetch::prefetch;
use crate::state::{LeaseId, Wake};
use crate::sync::Arc;
use std::pin::pin;
use std::time::{Duration, Instant};

impl SequenceBuffer {
    /// Waits until RPC `rpc` has at least `n_seqs` eligible samples and leases exactly
    /// `n_seqs` of them (oldest birth first for `Fifo`, newest first for `Lifo`). The batch
    /// carries only the RPC's input keys.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownRpc`] for a name not defined, and [`Error::Closed`] once the buffer
    /// is closed (also while waiting). Under a memory budget, [`Error::Storage`] or
    /// [`Error::Corrupt`] when spilled inputs of the leased samples cannot be read back
    /// (the lease is then released), and [`Error::NoRuntime`] when polled outside a tokio
    /// runtime (nothing could read them).
    ///
    /// # Cancel safety
    ///
    /// Dropped while waiting, it has leased nothing. The lease is taken and its [`Batch`]
    /// built with no await in between; dropped after that (while spilled inputs load), the
    /// future drops the `Batch`, which releases the lease: the samples become eligible
    /// again, counted as a redelivery.
    pub async fn get_batch_for_rpc(&self, rpc: &str) -> Result<Batch> {
        self.get_batch(rpc, None).await
    }

    /// Leases a batch for `rpc`: any batch, or the batch of training step `step` (see
    /// [`Self::get_batch_for_step`]).
    pub(crate) async fn get_batch(&self, rpc: &str, step: Option<u64>) -> Result<Batch> {
        let shared = &self.shared;
        let r = shared.open_rpc(rpc)?;
        let mut parked = Parked {
            shared,
            rpc: r,
            counted: false,
        };
        let mut warning = shared.wait_warning.map(LongWait::new);
        loop {
            let mut notified = pin!(shared.rpc_ready[r].notified());
            notified.as_mut().enable();
            // Checked at every look, not once: the future may be polled by another
            // executor after a first poll inside the runtime.
            shared.loads_can_run("a get on a buffer with a memory budget")?;
            let next_deadline = match shared.try_get(r, step, &mut parked.counted)? {
                Attempt::Leased(mut batch, logged, loads) => {
                    drop(parked);
                    // Spilled inputs are read back before the batch is handed out; a failed
                    // read drops the batch, which releases its samples for another try.
                    if !loads.is_empty() {
                        shared.fill_batch(&mut batch, loads).await?;
                    }
                    // The step's batch is handed out only once its log entry is durable;
                    // if that fails the batch is dropped (released) with the error.
                    if let Some(logged) = logged {
                        shared.verdict(logged).await?;
                    }
                    return Ok(batch);
                }
                Attempt::Wait(deadline) => deadline,
            };
            let lease_expiry = next_deadline.map(tokio::time::Instant::from_std);
            let warn_at = warning.as_mut().map(LongWait::next_at);
            match [lease_expiry, warn_at].into_iter().flatten().min() {
                Some(d) => {
                    // Elapsed or notified: either way, look again (and say why it waits
                    // if that is what elapsed).
                    if tokio::time::timeout_at(d, notified).await.is_err() {
                        if let Some(w) = warning.as_mut().filter(|w| w.is_due()) {
                            self.warn_waiting(r, w.waited());
                            w.advance();
                        }
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Logs why a getter of RPC `r` has waited `waited`, at warn level.
    fn warn_waiting(&self, r: usize, waited: Duration) {
        let shared = &self.shared;
        shared.wait_warnings[r].fetch_add(1, crate::sync::Ordering::Relaxed);
        let w = self.current_waiting(r);
        tracing::warn!(
            rpc = %w.name,
            waited_s = waited.as_secs_f64(),
            batch_size = w.batch_size,
            eligible = w.eligible,
            leased = w.leased,
            used_up = w.used_up,
            stale = w.stale,
            discarded = w.discarded,
            amending = w.amending,
            incomplete = w.incomplete,
            missing = ?w.missing,
            rate_limited = w.rate_limited,
            "a getter is still waiting: fewer samples are eligible than a batch takes, or its rate limit holds it"
        );
    }

    /// Leases a batch for `rpc` if `n_seqs` samples are eligible now, without waiting:
    /// `Ok(None)` otherwise (also when spilled inputs of the samples are still loading).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownRpc`] for a name not defined, [`Error::Closed`] once the buffer is
    /// closed, and, under a memory budget, [`Error::Storage`] or [`Error::Corrupt`] when a
    /// load of the samples' spilled inputs failed (the lease is then released), and
    /// [`Error::NoRuntime`] for a buffer with a memory budget when this thread is outside a
    /// tokio runtime (nothing could run the loads of spilled inputs).
    pub fn try_get_batch_for_rpc(&self, rpc: &str) -> Result<Option<Batch>> {
        let shared = &self.shared;
        let r = shared.open_rpc(rpc)?;
        shared.loads_can_run("try_get_batch_for_rpc on a buffer with a memory budget")?;
        let mut counted = false;
        let attempt = shared.try_get(r, None, &mut counted);
        if counted {
            shared.lock().table.unpark_getter(r);
        }
        match attempt? {
            Attempt::Leased(mut batch, _, loads) => {
                // Without waiting: only if every spilled input is already loaded (read-ahead
                // or an earlier try); otherwise the loads go on and the samples go back.
                if !loads.is_empty() && !shared.fill_batch_now(&mut batch, loads)? {
                    return Ok(None);
                }
                Ok(Some(batch))
            }
            Attempt::Wait(_) => Ok(None),
        }
    }

    /// [`Self::get_batch_for_rpc`] that gives up after `timeout` with [`Error::Timeout`],
    /// leasing nothing. Uses tokio's timer (the runtime needs the time driver).
    ///
    /// # Errors
    ///
    /// As [`Self::get_batch_for_rpc`], plus [`Error::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// As [`Self::get_batch_for_rpc`].
    pub async fn get_batch_for_rpc_timeout(&self, rpc: &str, timeout: Duration) -> Result<Batch> {
        tokio::time::timeout(timeout.min(FOREVER), self.get_batch_for_rpc(rpc))
            .await
            .unwrap_or_else(|_| {
                Err(Error::Timeout {
                    op: format!("get_batch_for_rpc({rpc})"),
                    after: timeout,
                    samples: Unstored::default(),
                })
            })
    }

    /// Leases the batch of training step `step` for `rpc`. The first request chooses it by
    /// the RPC's selection (seeded by `step` for randomised policies) and logs its sample
    /// ids durably; every later request for the step, in this process or after a restart,
    /// gets the same samples, waiting while another holder has them leased.
    ///
    /// # Errors
    ///
    /// As [`Self::get_batch_for_rpc`], and:
    ///
    /// * [`Error::StepConsumed`] once the step's batch was completed or committed;
    /// * [`Error::StepUnavailable`] when a sample of the logged batch left the buffer
    ///   (stale, evicted) or can no longer be served to the RPC;
    /// * with a sync journal, for the first request of a step, [`Error::Storage`] when the
    ///   step's log entry fails to be written, and [`Error::Closed`] when the journal's
    ///   writer stopped before it was durable (the error that stopped it, if one did; the
    ///   lease is released in both cases).
    ///
    /// # Cancel safety
    ///
    /// As [`Self::get_batch_for_rpc`]; the first request also waits, holding the lease, for
    /// a sync journal to make the step's entry durable. Dropped after leasing, the lease is
    /// released but the step's choice stays logged: asking for the step again gets the
    /// same samples.
    pub async fn get_batch_for_step(&self, rpc: &str, step: u64) -> Result<Batch> {
        self.get_batch(rpc, Some(step)).await
    }

    /// [`Self::get_batch_for_step`] that gives up after `timeout` with [`Error::Timeout`].
    ///
    /// # Errors
    ///
    /// As [`Self::get_batch_for_step`], plus [`Error::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// As [`Self::get_batch_for_step`].
    pub async fn get_batch_for_step_timeout(
        &self,
        rpc: &str,
        step: u64,
        timeout: Duration,
    ) -> Result<Batch> {
        tokio::time::timeout(timeout.min(FOREVER), self.get_batch(rpc, Some(step)))
            .await
            .unwrap_or_else(|_| {
                Err(Error::Timeout {
                    op: format!("get_batch_for_step({rpc}, {step})"),
                    after: timeout,
                    samples: Unstored::default(),
                })
            })
    }
}

enum Attempt {
    /// With, for a step logged through a sync journal, where the log's verdict arrives,
    /// and the loads of spilled inputs to wait for.
    Leased(Batch, Option<StepLogged>, Vec<BatchLoad>),
    /// Not enough eligible samples; wait for a notification or this lease deadline.
    Wait(Option<Instant>),
}

impl Shared {
    /// The index of RPC `rpc`, once the buffer is known to be open.
    fn open_rpc(&self, rpc: &str) -> Result<usize> {
        self.check_open()?;
        self.graph
            .rpc_index(rpc)
            .ok_or_else(|| Error::UnknownRpc { name: rpc.into() })
    }

    /// `Ok` unless the buffer spills and this thread is outside a tokio runtime: then
    /// `what` is refused before anything is selected, since a load of spilled inputs
    /// registered here could not start, and a get elsewhere could share it meanwhile.
    fn loads_can_run(&self, what: &'static str) -> Result<()> {
        if self.spills && tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime { what });
        }
        Ok(())
    }

    /// One attempt to lease a batch for RPC `r`, reaping expired leases first. `counted`
    /// says whether this getter is counted as waiting; it is counted while it waits.
    fn try_get(
        self: &Arc<Self>,
        r: usize,
        step: Option<u64>,
        counted: &mut bool,
    ) -> Result<Attempt> {
        let mut logged = None;
        let mut loads = Vec::new();
        let mut plan = LoadPlan::default();
        let mut store = None;
        let mut freed = Vec::new();
        let mut wake = Wake::default();
        let mut dropped = Default::default();
        let leased = {
            let mut inner = self.lock();
            if std::mem::take(counted) {
                inner.table.unpark_getter(r);
            }
            if inner.closed {
                return Err(Error::Closed);
            }
            let has_timeout = inner.table.rpcs[r].lease_timeout.is_some();
            let t = (has_timeout || inner.table.next_deadline().is_some()).then(now);
            if let (Some(t), Some(d)) = (t, inner.table.next_deadline()) {
                if d <= t {
                    wake = inner.expire_due(t, &mut freed);
                    dropped = inner.take_freed(&freed);
                }
            }
            let leased = match step {
                None => Ok(lease(&mut inner, r, t, None)),
                Some(step) => lease_step(&mut inner, r, t, step).map(|leased| {
                    if let Some((_, true)) = leased {
                        logged = log_step(self, &mut inner, r, step, leased.map(|l| l.0));
                    }
                    leased.map(|l| l.0)
                }),
            };
            // A lease under a rate limit may let held putters in.
            wake.merge(inner.table.take_deferred());
            match leased {
                // Still notify and dispose what the reaping above freed.
                Err(e) => Err(Err(e)),
                Ok(Some(lease)) => {
                    if inner.spill.is_some() {
                        store = plan_loads(self, &mut inner, r, lease, &mut plan, &mut loads);
                    }
                    let inner = &*inner;
                    let (handles, snapshot, deadline) = match inner.table.lease(lease, None) {
                        Ok(l) => (
                            l.slots
                                .iter()
                                .map(|&slot| SlotHandle {
                                    slot,
                                    generation: inner.table.slots[slot as usize].generation,
                                })
                                .collect(),
                            snapshot(&inner.samples, &l.slots),
                            l.deadline,
                        ),
                        Err(_) => (Vec::new(), Vec::new(), None),
                    };
                    Ok(Batch::new(
                        Arc::clone(self),
                        r,
                        lease,
                        handles,
                        snapshot,
                        deadline,
                        step,
                    ))
                }
                Ok(None) => {
                    inner.table.park_getter(r);
                    *counted = true;
                    Err(Ok(inner.table.next_deadline()))
                }
            }
        };
        self.notify(wake);
        self.dispose(dropped);
        if let Some(store) = store {
            self.start_loads(plan, store);
        }
        match leased {
            Ok(batch) => Ok(Attempt::Leased(batch, logged, loads)),
            Err(Ok(deadline)) => {
                // After the lock, as every log event (see `Wake::expired_samples`).
                tracing::trace!(
                    rpc = %self.graph.rpcs()[r].name,
                    "getter waits for eligible samples"
                );
                Ok(Attempt::Wait(deadline))
            }
            Err(Err(e)) => Err(e),
        }
    }
}

/// How many samples past a `Fifo` batch are read ahead, in batches.
const READ_AHEAD_BATCHES: usize = 2;

/// Registers the loads of the spilled inputs of lease `lease` (RPC `r`) and, for a `Fifo`
/// RPC, of the samples next in its order (read-ahead). Returns the store to read from when
/// there is anything to load.
fn plan_loads(
    shared: &Shared,
    inner: &mut Inner,
    r: usize,
    lease: LeaseId,
    plan: &mut LoadPlan,
    loads: &mut Vec<BatchLoad>,
) -> Option<Arc<dyn SpillStore>> {
    let Inner { table, spill, .. } = inner;
    let spill = spill.as_mut()?;
    let keys = shared.input_names.get(r)?;
    let slots = table.lease(lease, None).ok()?.slots.clone();
    loads.reserve(slots.len());
    let leased = slots
        .iter()
        .map(|&s| (s, table.slots[s as usize].generation));
    for (i, cell) in spill
        .register(leased, keys, false, plan)
        .into_iter()
        .enumerate()
    {
        if let (Some(cell), Some(&slot)) = (cell, slots.get(i)) {
            loads.push(BatchLoad {
                index: i,
                slot,
                cell,
            });
        }
    }
    let rpc = table.rpcs.get(r)?;
    if matches!(rpc.selection, Selection::Fifo) {
        let ahead = table.ready[r]
            .iter()
            .take(rpc.n_seqs * READ_AHEAD_BATCHES)
            .map(|s| (s, table.slots[s as usize].generation));
        let _ = spill.register(ahead, keys, true, plan);
    }
    (!plan.is_empty() || !loads.is_empty()).then(|| Arc::clone(&spill.store))
}

/// Clones the stored samples of `slots`. Two passes: plain loads of every refcount first,
/// so the cache misses of a large, cold buffer overlap, then the atomic increments, which
/// would otherwise each wait for their own miss (a locked add orders the loads after it).
fn snapshot(samples: &[Option<Arc<Sample>>], slots: &[u32]) -> Vec<Arc<Sample>> {
    // The references' own lines before the counts they point to.
    for &s in slots {
        if let Some(sample) = samples.get(s as usize) {
            prefetch(sample);
        }
    }
    let mut warm = 0usize;
    for &s in slots {
        if let Some(Some(sample)) = samples.get(s as usize) {
            warm = warm.wrapping_add(Arc::strong_count(sample));
        }
    }
    std::hint::black_box(warm);
    slots
        .iter()
        .filter_map(|&s| samples.get(s as usize).cloned().flatten())
        .collect()
}

/// Keeps a getter counted as parked while it waits; uncounts it if the get is
/// dropped mid-wait.
struct Parked<'a> {
    shared: &'a Arc<Shared>,
    rpc: usize,
    counted: bool,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.shared.lock().table.unpark_getter(self.rpc);
        }
    }
}

/// When a waiting getter says why it waits: first after the configured threshold, then
/// after twice as long each time, so a stuck run logs a few lines, not a stream.
/// The shortest wait before a first warning, whatever the configured threshold: the
/// interval doubles from it.
const MIN_WARNING_INTERVAL: Duration = Duration::from_millis(10);
/// The longest: a threshold past it (`Duration::MAX`, say) is never reached.
const MAX_WARNING_INTERVAL: Duration = FOREVER;

struct LongWait {
    started: tokio::time::Instant,
    interval: Duration,
    next: Option<tokio::time::Instant>,
}

impl LongWait {
    fn new(after: Duration) -> Self {
        Self {
            started: tokio::time::Instant::now(),
            // A zero threshold would never grow by doubling: one warning per wake-up.
            interval: after.clamp(MIN_WARNING_INTERVAL, MAX_WARNING_INTERVAL),
            next: None,
        }
    }

    /// The next warning's time; the clock starts at the getter's first wait.
    fn next_at(&mut self) -> tokio::time::Instant {
        *self.next.get_or_insert_with(|| {
            self.started = tokio::time::Instant::now();
            self.started + self.interval
        })
    }

    fn is_due(&self) -> bool {
        self.next.is_some_and(|n| n <= tokio::time::Instant::now())
    }

    fn waited(&self) -> Duration {
        self.started.elapsed()
    }

    fn advance(&mut self) {
        self.interval = self.interval.saturating_mul(2).min(MAX_WARNING_INTERVAL);
        self.next = Some(tokio::time::Instant::now() + self.interval);
    }
}
