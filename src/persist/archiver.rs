//! `Archiver`: a background task that batches consumed samples and writes them to the
//! archive, plugged into a buffer as its [`FreedSink`].
//!
//! The task writes when `max_rows` samples, or `max_bytes` of their tensor data, are
//! pending, when the oldest pending sample has waited `max_delay`, and on
//! [`Archiver::flush`]. A failed write is logged and retried, as
//! the very same batch under the same file names (so the retry replaces whatever part of
//! it was written: no duplicate rows), `max_delay` later or at the next write; `flush`
//! returns the error.
//!
//! # At least once, and only once, across crashes
//!
//! In a persistent buffer (`SequenceBuffer::open`) the archiver also writes to the log. A
//! freed sample stays in the durable state (the log, then checkpoints) until its row is
//! on storage. Before writing a batch, the archiver logs `Archiving { batch, ids }` and
//! waits until that record is durable (for a flush, having the log write it at once); it names the batch's files by the batch number;
//! once they are written it logs `Archived { batch }`. Recovery hands the samples still
//! waiting back to a new archiver: a batch that was logged but not confirmed is written
//! again under the same names, replacing any file of it that did land, and samples never
//! batched form new batches. So a kill -9 at any point loses no row and duplicates none.
//! A sample whose free was not yet durable (only possible under `Durability::Interval`)
//! comes back into the buffer instead and is archived when it leaves again.

use super::{ArchiveWriter, ArchivedSample};
use crate::buffer::{FreedSink, Journal, Record, SinkFuture};
use crate::error::{Error, Result};
use crate::exit::ExitReason;
use crate::sample::Sample;
use crate::sync::{mpsc, oneshot, Arc};
use std::fmt;
use std::time::Duration;

/// When the archive task writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveOptions {
    /// Write once this many samples are pending (default 4,096).
    pub max_rows: usize,
    /// Write once the pending samples' tensor data reaches this many bytes (default 64
    /// MiB; strings count their UTF-8 bytes). With large samples this, not `max_rows`,
    /// bounds the archive's memory: 4,096 groups of slime items are some 150 MB, held
    /// again while they are encoded.
    pub max_bytes: u64,
    /// Write once the oldest pending sample has waited this long (default 1 s).
    pub max_delay: Duration,
}

impl Default for ArchiveOptions {
    fn default() -> Self {
        Self {
            max_rows: 4096,
            max_bytes: 64 << 20,
            max_delay: Duration::from_secs(1),
        }
    }
}

enum Msg {
    Rows(Vec<ArchivedSample>),
    Flush(oneshot::Sender<Result<()>>),
    /// Answered after the next write of everything pending (see `FreedSink::written`).
    Written(oneshot::Sender<Result<()>>),
}

/// A handle to the archive task; cheap to clone. Pass a clone to
/// [`BufferConfig::freed_sink`](crate::BufferConfig::freed_sink) and keep one to
/// [`flush`](Self::flush) before shutting down.
///
/// ```
/// use rollout_buffer::persist::{ArchiveOptions, ArchiveWriter, Archiver, Store};
/// use rollout_buffer::{BufferConfig, RpcDef, SequenceBuffer};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), rollout_buffer::Error> {
/// let archiver = Archiver::start(
///     ArchiveWriter::new(Store::open("memory://")?),
///     ArchiveOptions::default(),
/// )?;
/// let buf = SequenceBuffer::with_config(
///     BufferConfig::new(64)
///         .rpc(RpcDef::new("train", 8).inputs(["tokens"]))
///         .freed_sink(archiver.clone()),
/// )?;
/// // ... run; then, before exiting:
/// archiver.flush().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Archiver {
    tx: mpsc::UnboundedSender<Msg>,
}

impl fmt::Debug for Archiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Archiver")
            .field("running", &!self.tx.is_closed())
            .finish()
    }
}

impl Archiver {
    /// Starts the writing task on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::NoRuntime`] outside a tokio runtime.
    pub fn start(writer: ArchiveWriter, options: ArchiveOptions) -> Result<Self> {
        Self::start_with(writer, options, None, Vec::new())
    }

    /// [`Self::start`] for a persistent buffer: batches are logged through `log` (see the
    /// module docs), and the samples recovery found still waiting, `recovered`, are
    /// written first.
    pub(crate) fn start_logged(
        writer: ArchiveWriter,
        options: ArchiveOptions,
        log: Arc<dyn Journal>,
        next_batch: u64,
        recovered: Vec<(Option<u64>, ArchivedSample)>,
    ) -> Result<Self> {
        let log = BatchLog {
            journal: log,
            next: next_batch,
        };
        Self::start_with(writer, options, Some(log), recovered)
    }

    fn start_with(
        writer: ArchiveWriter,
        options: ArchiveOptions,
        log: Option<BatchLog>,
        recovered: Vec<(Option<u64>, ArchivedSample)>,
    ) -> Result<Self> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime {
            what: "the archiver",
        })?;
        let mut q = Queue {
            writer,
            options,
            pending: Vec::new(),
            pending_bytes: 0,
            failed: Vec::new(),
            due: None,
            last_error: None,
            log,
            waiters: Vec::new(),
        };
        // Batches the log named are written again as they were, in batch order; the rest
        // wait for a new batch.
        let mut numbered: std::collections::BTreeMap<u64, Vec<ArchivedSample>> =
            std::collections::BTreeMap::new();
        for (batch, row) in recovered {
            match batch {
                Some(n) => numbered.entry(n).or_default().push(row),
                None => {
                    q.pending_bytes += row.sample.payload_bytes();
                    q.pending.push(row);
                }
            }
        }
        q.failed = numbered
            .into_iter()
            .rev() // taken from the end: lowest batch first
            .map(|(n, rows)| Batch {
                number: Some(n),
                logged: true,
                rows,
            })
            .collect();
        if !q.failed.is_empty() || !q.pending.is_empty() {
            q.due = Some(tokio::time::Instant::now());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        handle.spawn(run(q, rx));
        Ok(Self { tx })
    }

    /// Writes every sample handed over so far.
    ///
    /// # Errors
    ///
    /// The error of this write or of the last failed write since the previous flush:
    /// [`Error::Storage`], or [`Error::Arrow`] for samples that cannot be archived (they are
    /// dropped, the rest kept for the next write). [`Error::Closed`] when the task has
    /// stopped (its runtime shut down, say).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops only the wait: once polled, the task still writes every
    /// sample handed over, but the error it would have returned is lost (the next flush
    /// does not report it).
    pub async fn flush(&self) -> Result<()> {
        let (reply, done) = oneshot::channel();
        self.tx.send(Msg::Flush(reply)).map_err(|_| Error::Closed)?;
        done.await.map_err(|_| Error::Closed)?
    }
}

impl FreedSink for Archiver {
    fn consumed(&self, samples: Vec<Arc<Sample>>, read_by: &[String]) {
        let rows = samples
            .into_iter()
            .map(|s| ArchivedSample {
                // Usually the last reference: no copy.
                sample: Arc::try_unwrap(s).unwrap_or_else(|shared| (*shared).clone()),
                read_by: read_by.to_vec(),
                reason: ExitReason::Consumed,
            })
            .collect();
        if self.tx.send(Msg::Rows(rows)).is_err() {
            tracing::warn!("the archiver has stopped; consumed samples are not archived");
        }
    }

    fn dropped(&self, samples: Vec<Arc<Sample>>, reason: ExitReason) {
        let rows = samples
            .into_iter()
            .map(|s| ArchivedSample {
                sample: Arc::try_unwrap(s).unwrap_or_else(|shared| (*shared).clone()),
                read_by: Vec::new(),
                reason,
            })
            .collect();
        if self.tx.send(Msg::Rows(rows)).is_err() {
            tracing::warn!("the archiver has stopped; dropped samples are not archived");
        }
    }

    fn flush(&self) -> SinkFuture {
        let me = self.clone();
        Box::pin(async move { Archiver::flush(&me).await })
    }

    fn written(&self) -> SinkFuture {
        let (reply, done) = oneshot::channel();
        let sent = self.tx.send(Msg::Written(reply));
        Box::pin(async move {
            sent.map_err(|_| Error::Closed)?;
            done.await.map_err(|_| Error::Closed)?
        })
    }
}

/// Where a persistent buffer's archiver logs its batches, and the next batch's number.
struct BatchLog {
    journal: Arc<dyn Journal>,
    next: u64,
}

/// Rows written (or to be written) together.
struct Batch {
    /// Its number, once it has one (always, with a log).
    number: Option<u64>,
    /// Whether its `Archiving` record is durable.
    logged: bool,
    rows: Vec<ArchivedSample>,
}

/// The task's state: rows waiting for their first write, and batches whose write failed
/// (or that recovery handed over), kept exactly as they were so a retry produces the same
/// files and replaces any part of them that did get written.
struct Queue {
    writer: ArchiveWriter,
    options: ArchiveOptions,
    pending: Vec<ArchivedSample>,
    /// The tensor bytes of `pending`.
    pending_bytes: u64,
    failed: Vec<Batch>,
    /// When the oldest waiting row (or the failed batch's retry) is due.
    due: Option<tokio::time::Instant>,
    last_error: Option<Error>,
    log: Option<BatchLog>,
    /// Callers of `written`, answered after the next write of everything pending.
    waiters: Vec<oneshot::Sender<Result<()>>>,
}

impl Queue {
    fn push(&mut self, rows: Vec<ArchivedSample>) {
        if self.due.is_none() {
            // A delay past thirty years is that long: without end in practice, where a
            // deadline at the clock's far edge would overflow.
            self.due = Some(
                tokio::time::Instant::now() + self.options.max_delay.min(crate::deadline::FOREVER),
            );
        }
        self.pending_bytes += rows.iter().map(|r| r.sample.payload_bytes()).sum::<u64>();
        self.pending.extend(rows);
    }

    /// Whether enough is pending to write now.
    fn full(&self) -> bool {
        self.pending.len() >= self.options.max_rows || self.pending_bytes >= self.options.max_bytes
    }

    /// Retries the failed batches, then writes what is pending. Returns the first error.
    /// `now`: for a flush, which has the log write the batches' records at once (see
    /// [`logged`]).
    async fn write_all(&mut self, now: bool) -> Result<()> {
        let result = async {
            while let Some(mut batch) = self.failed.pop() {
                if let Err(e) = self.write(&mut batch, now).await {
                    self.failed.push(batch);
                    return Err(e);
                }
            }
            if !self.pending.is_empty() {
                let mut batch = Batch {
                    number: None,
                    logged: false,
                    rows: std::mem::take(&mut self.pending),
                };
                self.pending_bytes = 0;
                if let Err(e) = self.write(&mut batch, now).await {
                    self.failed.push(batch);
                    return Err(e);
                }
            }
            Ok(())
        }
        .await;
        self.due = match (&result, self.failed.is_empty()) {
            (Ok(()), _) | (Err(_), true) => None,
            (Err(_), false) => Some(
                tokio::time::Instant::now() + self.options.max_delay.min(crate::deadline::FOREVER),
            ),
        };
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(result.clone());
        }
        result
    }

    /// Logs `batch` (with a log, and unless done), writes it, and logs it written.
    async fn write(&mut self, batch: &mut Batch, now: bool) -> Result<()> {
        if let Some(log) = &mut self.log {
            let number = *batch.number.get_or_insert_with(|| {
                log.next += 1;
                log.next - 1
            });
            if !batch.logged {
                let ids = batch.rows.iter().map(|r| r.sample.id().clone()).collect();
                logged(&*log.journal, Record::Archiving { batch: number, ids }, now).await?;
                batch.logged = true;
            }
        }
        write(&self.writer, batch.number, &mut batch.rows).await?;
        if let (Some(log), Some(number)) = (&self.log, batch.number) {
            // Losing this record costs only a rewrite of the same files at recovery.
            if log
                .journal
                .append(vec![Record::Archived { batch: number }], None)
                .is_some()
            {
                tracing::warn!(
                    batch = number,
                    "the log has stopped; archive batch not confirmed"
                );
            }
        }
        Ok(())
    }
}

/// Appends `record` and waits until it is durable; with `now`, has the log write it at
/// once.
///
/// Under `Durability::Interval` the record waits for the log's next interval, and so does
/// its batch. That is fine for a batch written on the archive's own schedule, but not for
/// one a flush asked for: the buffer's `flush` waits behind it, and an interval of an hour
/// made a server's graceful stop take an hour. The log's flush also waits for a running
/// checkpoint, which is why the archive's own writes do not use it: under load they would
/// hold the log's writer for a whole checkpoint each.
async fn logged(journal: &dyn Journal, record: Record, now: bool) -> Result<()> {
    let (tx, rx) = oneshot::channel();
    let then: crate::buffer::Durable = Box::new(move |result| {
        let _ = tx.send(result);
    });
    if let Some(back) = journal.append(vec![record], Some(then)) {
        drop(back);
        return Err(Error::Closed);
    }
    if now {
        journal.flush().await?;
    }
    rx.await.unwrap_or(Err(Error::Closed))
}

async fn run(mut q: Queue, mut rx: mpsc::UnboundedReceiver<Msg>) {
    loop {
        let msg = match q.due {
            None => rx.recv().await,
            Some(due) => match tokio::time::timeout_at(due, rx.recv()).await {
                Ok(msg) => msg,
                Err(_) => {
                    // A deadline, not an idle timeout: rows never wait much longer than
                    // max_delay, however steadily new ones arrive.
                    if let Err(e) = q.write_all(false).await {
                        q.last_error = Some(e);
                    }
                    continue;
                }
            },
        };
        match msg {
            Some(Msg::Rows(rows)) => {
                q.push(rows);
                if q.full() {
                    if let Err(e) = q.write_all(false).await {
                        q.last_error = Some(e);
                    }
                }
            }
            Some(Msg::Written(reply)) => {
                if q.pending.is_empty() && q.failed.is_empty() {
                    let _ = reply.send(Ok(()));
                } else {
                    q.waiters.push(reply);
                }
            }
            Some(Msg::Flush(reply)) => {
                let result = match q.write_all(true).await {
                    Ok(()) => q.last_error.take().map_or(Ok(()), Err),
                    Err(e) => {
                        q.last_error = None;
                        Err(e)
                    }
                };
                let _ = reply.send(result);
            }
            None if q.log.is_some() => {
                // The buffer is gone without a flush: what is waiting stays in the durable
                // state and is archived at the next open. Writing now could race the log
                // of a buffer already reopened on the same store.
                return;
            }
            None => {
                if let Err(e) = q.write_all(false).await {
                    let rows: usize =
                        q.failed.iter().map(|b| b.rows.len()).sum::<usize>() + q.pending.len();
                    tracing::warn!(error = %e, rows, "archiver: final write failed");
                }
                return;
            }
        }
    }
}

/// Writes what is pending; on failure keeps it for the next attempt.
async fn write(
    writer: &ArchiveWriter,
    batch: Option<u64>,
    pending: &mut Vec<ArchivedSample>,
) -> Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    match writer.write_as(pending, batch).await {
        Ok(_) => {
            pending.clear();
            Ok(())
        }
        Err(e @ Error::Arrow { .. }) => {
            // Some sample cannot be archived (a reserved name, mistyped partition metadata,
            // a field retyped since the archive's first rows): drop those, keep the rest
            // for the next write. Keeping them all failed every write after, for good.
            writer.keep_archivable(pending);
            Err(e)
        }
        Err(e) => {
            tracing::warn!(error = %e, rows = pending.len(), "archive write failed; will retry");
            Err(e)
        }
    }
}
