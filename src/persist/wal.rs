//! `Wal`: the write-ahead log a persistent buffer writes through (the buffer's `Journal`),
//! and the task that commits it in groups and checkpoints it.
//!
//! # Locking
//!
//! The buffer appends with its own lock held; `Wal::append` only pushes onto the queue under
//! the queue's mutex and wakes the writer. The writer takes the whole queue at once (one
//! group commit: every record appended since the last one), encodes and writes it outside
//! any lock, then runs the callbacks of the units it held, in log order. Lock order is
//! buffer, then queue; the writer never takes the buffer's lock while holding the queue's.
//!
//! # Durability modes
//!
//! * `Sync`: the writer commits as soon as anything is queued (while one write is in
//!   flight, new records gather for the next). A failed write fails every call whose
//!   records it held (their changes are undone) and the group is *abandoned*: the next
//!   group lists it, so recovery ignores it even if the failed write left an object.
//! * `Interval(d)`: changes apply at once; a record waits at most `d` before its group's
//!   write starts. A failed write is retried, same name and bytes, with backoff, before
//!   anything newer is written, so the log never has a hole.
//!
//! Each group written goes to the writer's [`Checkpointer`], which keeps an image of what
//! the log holds and checkpoints it in a separate task once the log has grown enough (see
//! `checkpointer.rs`). A group whose write failed is never applied to the image.

use super::checkpointer::Checkpointer;
use super::log::{encode_group, log_path};
use super::store::{storage_msg, Store};
use crate::buffer::{Durable, Journal, JournalFuture, Record};
use crate::error::{Error, Result, StorageKind};
use crate::sync::{oneshot, Arc, AtomicU64, Mutex, Notify, Ordering};
use bytes::Bytes;
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// When a change counts as done, relative to its log record reaching storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// A put, amend or completion returns only after its record is on storage; a failed
    /// write returns the error with nothing changed.
    Sync,
    /// Changes apply at once and are written in groups at most this long after they were
    /// made: a crash loses at most the last interval, never part of a call and never out
    /// of order.
    Interval(Duration),
    /// No log: the buffer starts from what is stored but records nothing new.
    None,
}

impl std::str::FromStr for Durability {
    type Err = Error;

    /// `"sync"`, `"none"` or `"interval:<milliseconds>"`: how command lines and the Python
    /// package name a durability.
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "sync" => Ok(Durability::Sync),
            "none" => Ok(Durability::None),
            other => other
                .strip_prefix("interval:")
                .and_then(|ms| ms.parse::<u64>().ok())
                .map(|ms| Durability::Interval(Duration::from_millis(ms)))
                .ok_or_else(|| Error::InvalidConfig {
                    detail: format!(
                        "durability `{other}`: use \"sync\", \"none\" or \"interval:<ms>\""
                    ),
                }),
        }
    }
}

/// What the writer needs besides the queue.
#[derive(Debug)]
pub(crate) struct WriterSetup {
    pub(crate) store: Store,
    pub(crate) durability: Durability,
    /// The next group's sequence number.
    pub(crate) seq: u64,
    /// Groups the next commit must declare abandoned.
    pub(crate) abandoned: Vec<u64>,
    /// The image of the stored contents and its checkpoints.
    pub(crate) checkpoints: Checkpointer,
    /// Tensor bytes of puts not yet durable above which putters wait.
    pub(crate) max_backlog: u64,
}

#[derive(Default)]
struct Queue {
    records: Vec<Record>,
    callbacks: Vec<Durable>,
    flushes: Vec<oneshot::Sender<Result<()>>>,
    /// When the oldest queued record was appended.
    oldest: Option<Instant>,
    /// Tensor bytes of the queued puts.
    bytes: u64,
    /// The buffer is gone: write what is queued, then stop.
    closing: bool,
    /// The writer has stopped: appends hand their callbacks back.
    stopped: bool,
    /// The error that stopped it (another writer's log, say), if one did.
    stop_error: Option<Error>,
}

struct WalShared {
    queue: Mutex<Queue>,
    wake: Notify,
    sync: bool,
    /// Tensor bytes of puts appended and not yet durable (queued, being written, or
    /// waiting for a retry).
    backlog: AtomicU64,
    max_backlog: u64,
    /// Notified when the backlog shrinks or the writer stops.
    drained: Notify,
}

impl WalShared {
    /// `bytes` of puts became durable, were abandoned, or will never be written.
    fn settled(&self, bytes: u64) {
        if bytes > 0 {
            self.backlog.fetch_sub(bytes, Ordering::AcqRel);
            self.drained.notify_waiters();
        }
    }
}

/// The journal handle the buffer holds. Dropping it (with the buffer) lets the writer
/// commit what is queued and stop.
pub(crate) struct Wal {
    shared: Arc<WalShared>,
}

impl fmt::Debug for Wal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wal")
            .field("sync", &self.shared.sync)
            .finish()
    }
}

impl Wal {
    /// Starts the writer on the current runtime.
    pub(crate) fn start(setup: WriterSetup) -> Result<Self> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime {
            what: "the write-ahead log",
        })?;
        let shared = Arc::new(WalShared {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            sync: setup.durability == Durability::Sync,
            backlog: AtomicU64::new(0),
            max_backlog: setup.max_backlog,
            drained: Notify::new(),
        });
        handle.spawn(run(Arc::clone(&shared), setup));
        Ok(Self { shared })
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.shared.queue.lock().closing = true;
        self.shared.wake.notify_one();
    }
}

impl Journal for Wal {
    fn append(&self, records: Vec<Record>, then: Option<Durable>) -> Option<Durable> {
        let mut q = self.shared.queue.lock();
        if q.stopped {
            // Not logged here: the caller holds the buffer's lock, under which a log event
            // can wait on what the subscriber needs (a Python bridge needs the GIL, whose
            // holder may wait for that lock). The writer logged its stop once, as an error.
            return then;
        }
        let was_empty = q.records.is_empty();
        let bytes = put_bytes(&records);
        if bytes > 0 {
            q.bytes += bytes;
            self.shared.backlog.fetch_add(bytes, Ordering::AcqRel);
        }
        q.records.extend(records);
        if let Some(then) = then {
            q.callbacks.push(then);
        }
        if q.oldest.is_none() {
            q.oldest = Some(Instant::now());
        }
        drop(q);
        // The interval writer only needs to know when its timer should start.
        if self.shared.sync || was_empty {
            self.shared.wake.notify_one();
        }
        None
    }

    fn backlog(&self) -> Option<JournalFuture> {
        if self.shared.backlog.load(Ordering::Acquire) < self.shared.max_backlog {
            return None;
        }
        let shared = Arc::clone(&self.shared);
        Some(Box::pin(async move {
            loop {
                let mut drained = std::pin::pin!(shared.drained.notified());
                drained.as_mut().enable();
                let stopped = shared.queue.lock().stopped;
                if stopped || shared.backlog.load(Ordering::Acquire) < shared.max_backlog {
                    return Ok(());
                }
                drained.await;
            }
        }))
    }

    fn flush(&self) -> JournalFuture {
        let (tx, rx) = oneshot::channel();
        {
            let mut q = self.shared.queue.lock();
            if q.stopped {
                let error = q.stop_error.clone().unwrap_or(Error::Closed);
                return Box::pin(std::future::ready(Err(error)));
            }
            q.flushes.push(tx);
        }
        self.shared.wake.notify_one();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(shared
                    .queue
                    .lock()
                    .stop_error
                    .clone()
                    .unwrap_or(Error::Closed))
            })
        })
    }

    fn stopped_by(&self) -> Option<Error> {
        self.shared.queue.lock().stop_error.clone()
    }
}

/// Tensor bytes of the samples the put records among `records` carry.
fn put_bytes(records: &[Record]) -> u64 {
    records
        .iter()
        .map(|r| match r {
            Record::Put(samples) => samples
                .iter()
                .flat_map(|s| s.fields().map(|(_, t)| t.nbytes() as u64))
                .sum(),
            _ => 0,
        })
        .sum()
}

/// One group taken off the queue.
struct Taken {
    records: Vec<Record>,
    callbacks: Vec<Durable>,
    flushes: Vec<oneshot::Sender<Result<()>>>,
    /// Tensor bytes of its puts (counted in the backlog until they settle).
    bytes: u64,
    last: bool,
}

/// How a group write failed.
enum Failure {
    /// The store failed; the write may be retried.
    Store(Error),
    /// Another writer's group holds this sequence number: this buffer no longer owns the
    /// store, and must stop writing to it.
    Conflict(Error),
}

/// Writes group `seq` with create-if-absent, so two buffers writing one store cannot
/// overwrite each other's log. An object already there is an earlier attempt of ours if it
/// holds these bytes (a write that landed but reported failure) or a prefix of them (one
/// torn on a store without atomic puts: rewritten); anything else is another writer's.
async fn write_group(store: &Store, seq: u64, bytes: &Bytes) -> std::result::Result<(), Failure> {
    let path = log_path(seq);
    if store
        .put_if_absent(&path, bytes.clone())
        .await
        .map_err(Failure::Store)?
    {
        return Ok(());
    }
    let existing = store.get(&path).await.map_err(Failure::Store)?;
    match existing {
        Some(old) if old == *bytes => Ok(()),
        Some(old) if old.len() < bytes.len() && bytes.starts_with(&old) => store
            .put(&path, bytes.clone())
            .await
            .map_err(Failure::Store),
        // Deleted between the two calls: only a checkpoint of another writer does that.
        _ => Err(Failure::Conflict(storage_msg(
            store.url(),
            &path,
            StorageKind::NotFound,
            "another buffer is writing to this store (its log holds this group)",
        ))),
    }
}

/// Deletes a group whose write failed, retrying a few times; if the store refuses even
/// that, the abandonment the next group declares is what keeps recovery from applying it.
async fn remove_failed_group(store: &Store, seq: u64) {
    let mut pause = Duration::from_millis(10);
    for attempt in 1..=3 {
        match store.delete(&log_path(seq)).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, seq, attempt, "could not delete a failed log group");
                tokio::time::sleep(pause).await;
                pause *= 4;
            }
        }
    }
}

/// Interval mode: a group whose write failed, kept to be retried as it was.
struct FailedGroup {
    seq: u64,
    bytes: Bytes,
    /// Its records, for the checkpointer once the group is written.
    records: Vec<Record>,
    /// The backlog bytes it holds.
    backlog: u64,
}

/// The writer's own state besides its setup.
struct Progress {
    failed: Option<FailedGroup>,
    backoff: Duration,
    /// The encoding buffer, kept between groups: a fresh one each time costs more in page
    /// faults (the kernel zeroing new pages) than the encoding itself.
    spare: Vec<u8>,
    /// Flushes whose data is written, answered once no checkpoint runs.
    flushed: Vec<oneshot::Sender<Result<()>>>,
}

/// What the writer does after a group.
enum Next {
    Continue,
    Stop,
}

/// Marks the writer stopped when its task ends, however it ends (returning, panicking, or
/// dropped with its runtime): later appends hand their callbacks back, queued ones are
/// dropped (undoing their changes), flushes fail and putters stop waiting for the backlog.
/// Nobody is left waiting on a writer that is gone.
struct StopOnExit(Arc<WalShared>);

impl Drop for StopOnExit {
    fn drop(&mut self) {
        let shared = &self.0;
        let leftover = {
            let mut q = shared.queue.lock();
            q.stopped = true;
            let callbacks = std::mem::take(&mut q.callbacks);
            let flushes = std::mem::take(&mut q.flushes);
            (std::mem::take(&mut q.records), callbacks, flushes)
        };
        drop(leftover);
        shared.backlog.store(0, Ordering::Release);
        shared.drained.notify_waiters();
    }
}

/// The writer task.
async fn run(shared: Arc<WalShared>, mut w: WriterSetup) {
    let _stop = StopOnExit(Arc::clone(&shared));
    let interval = match w.durability {
        Durability::Interval(d) => Some(d),
        _ => None,
    };
    let mut p = Progress {
        failed: None,
        backoff: Duration::from_millis(10),
        spare: Vec::new(),
        flushed: Vec::new(),
    };
    loop {
        let taken = next_group(&shared, interval, p.failed.is_some()).await;
        let last = taken.last;
        let next = commit(&shared, &mut w, &mut p, interval.is_some(), taken).await;
        if matches!(next, Next::Stop) || last {
            break;
        }
        // Not while a failed group waits for its retry: it must be part of the log first.
        if p.failed.is_none() {
            w.checkpoints.maybe_start(w.seq);
        }
        answer_flushes(&mut w, &mut p).await;
    }
    w.checkpoints.wait().await;
    p.flushed.drain(..).for_each(|f| {
        let _ = f.send(Ok(()));
    });
}

/// Writes a failed group again (interval mode), then the group taken, and settles the
/// callbacks and flushes.
async fn commit(
    shared: &WalShared,
    w: &mut WriterSetup,
    p: &mut Progress,
    retries: bool,
    taken: Taken,
) -> Next {
    let fail_flushes = |flushes: Vec<oneshot::Sender<Result<()>>>, e: &Error| {
        flushes.into_iter().for_each(|f| {
            let _ = f.send(Err(e.clone()));
        });
    };
    let stop = |taken: Taken, e: Error| {
        tracing::error!(error = %e, "the log cannot be written any more; changes fail");
        shared.queue.lock().stop_error = Some(e.clone());
        taken.callbacks.into_iter().for_each(|f| f(Err(e.clone())));
        fail_flushes(taken.flushes, &e);
        Next::Stop
    };
    if let Some(failed) = p.failed.take() {
        match write_group(&w.store, failed.seq, &failed.bytes).await {
            Ok(()) => {
                w.checkpoints.logged(failed.records, failed.bytes.len());
                p.backoff = Duration::from_millis(10);
                shared.settled(failed.backlog);
            }
            Err(Failure::Conflict(e)) => return stop(taken, e),
            Err(Failure::Store(e)) => {
                tracing::warn!(error = %e, seq = failed.seq, "log write failed again; retrying");
                fail_flushes(taken.flushes, &e);
                p.failed = Some(failed);
                requeue(shared, taken.records, taken.callbacks, taken.bytes);
                if taken.last {
                    tracing::error!("the buffer is gone and the log cannot be written");
                    return Next::Stop;
                }
                tokio::time::sleep(p.backoff).await;
                p.backoff = (p.backoff * 2).min(Duration::from_secs(1));
                return Next::Continue;
            }
        }
    }
    if !taken.records.is_empty() {
        let seq = w.seq;
        let buf = std::mem::take(&mut p.spare);
        let bytes = Bytes::from(encode_group(seq, &w.abandoned, &taken.records, buf));
        w.seq += 1;
        match write_group(&w.store, seq, &bytes).await {
            Ok(()) => {
                w.abandoned.clear();
                taken.callbacks.into_iter().for_each(|f| f(Ok(())));
                shared.settled(taken.bytes);
                // After the callbacks: the image's upkeep is not the callers' latency.
                w.checkpoints.logged(taken.records, bytes.len());
                if let Ok(buf) = bytes.try_into_mut() {
                    p.spare = Vec::from(buf);
                }
            }
            Err(Failure::Conflict(e)) => return stop(taken, e),
            Err(Failure::Store(e)) if retries => {
                tracing::warn!(error = %e, seq, "log write failed; retrying");
                fail_flushes(taken.flushes, &e);
                p.failed = Some(FailedGroup {
                    seq,
                    bytes,
                    records: taken.records,
                    backlog: taken.bytes,
                });
                if taken.last {
                    tracing::error!("the buffer is gone and the log cannot be written");
                    return Next::Stop;
                }
                return Next::Continue;
            }
            Err(Failure::Store(e)) => {
                tracing::warn!(error = %e, seq, "log write failed; its calls fail");
                // A write that reported failure may still have stored the group (or part of
                // it). Its callers are about to hear it failed, so it must never be
                // replayed: delete it now, and declare it abandoned in the next group too.
                remove_failed_group(&w.store, seq).await;
                w.abandoned.push(seq);
                taken.callbacks.into_iter().for_each(|f| f(Err(e.clone())));
                shared.settled(taken.bytes);
                fail_flushes(taken.flushes, &e);
                return Next::Continue;
            }
        }
    }
    p.flushed.extend(taken.flushes);
    Next::Continue
}

/// Answers the flushes whose data is written, once no checkpoint is running either: a
/// flushed buffer leaves its store quiescent, so it can be opened again (after the buffer
/// is dropped) without racing a checkpoint's deletions.
async fn answer_flushes(w: &mut WriterSetup, p: &mut Progress) {
    if p.flushed.is_empty() {
        return;
    }
    w.checkpoints.wait().await;
    p.flushed.drain(..).for_each(|f| {
        let _ = f.send(Ok(()));
    });
}

/// Puts records back at the front of the queue (the interval writer's retry holds them
/// back until the failed group is written).
fn requeue(shared: &WalShared, mut records: Vec<Record>, mut callbacks: Vec<Durable>, bytes: u64) {
    if records.is_empty() && callbacks.is_empty() {
        return;
    }
    let mut q = shared.queue.lock();
    q.bytes += bytes;
    records.append(&mut q.records);
    q.records = records;
    callbacks.append(&mut q.callbacks);
    q.callbacks = callbacks;
    if q.oldest.is_none() {
        q.oldest = Some(Instant::now());
    }
}

/// Waits until a group is due and takes it: anything queued in sync mode, the queue once
/// its oldest record is `interval` old, everything on a flush or when closing, or nothing
/// (to retry a failed group) when `retry` is set.
async fn next_group(shared: &WalShared, interval: Option<Duration>, retry: bool) -> Taken {
    loop {
        let notified = shared.wake.notified();
        let deadline = {
            let mut q = shared.queue.lock();
            let now = Instant::now();
            // An interval too long to represent means "only on flush or close".
            let due_at = match (interval, q.oldest) {
                (Some(d), Some(t)) => {
                    crate::deadline::after(t.into_std(), d).map(Instant::from_std)
                }
                (None, Some(t)) => Some(t),
                _ => None,
            };
            let due =
                retry || q.closing || !q.flushes.is_empty() || due_at.is_some_and(|t| t <= now);
            if due {
                q.oldest = None;
                return Taken {
                    records: std::mem::take(&mut q.records),
                    callbacks: std::mem::take(&mut q.callbacks),
                    flushes: std::mem::take(&mut q.flushes),
                    bytes: std::mem::take(&mut q.bytes),
                    last: q.closing,
                };
            }
            due_at
        };
        match deadline {
            Some(t) => {
                let _ = tokio::time::timeout_at(t, notified).await;
            }
            None => notified.await,
        }
    }
}
