//! `Archiver`: a background task that batches consumed samples and writes them to the
//! archive, plugged into a buffer as its [`FreedSink`].
//!
//! The task writes when `max_rows` samples are pending, when the oldest pending sample has
//! waited `max_delay`, and on [`Archiver::flush`]. A failed write is logged and retried, as
//! the very same batch (file names hash the content, so the retry replaces whatever part
//! of it was written: no duplicate rows), `max_delay` later or at the next write; `flush`
//! returns the error. Until the write-ahead log lands, samples not yet written when the
//! process dies are not archived.

use super::{ArchiveWriter, ArchivedSample};
use crate::buffer::{FreedSink, SinkFuture};
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
    /// Write once the oldest pending sample has waited this long (default 1 s).
    pub max_delay: Duration,
}

impl Default for ArchiveOptions {
    fn default() -> Self {
        Self {
            max_rows: 4096,
            max_delay: Duration::from_secs(1),
        }
    }
}

enum Msg {
    Rows(Vec<ArchivedSample>),
    Flush(oneshot::Sender<Result<()>>),
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
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime {
            what: "the archiver",
        })?;
        let (tx, rx) = mpsc::unbounded_channel();
        handle.spawn(run(writer, options, rx));
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
}

/// The task's state: rows waiting for their first write, and a batch whose write failed,
/// kept exactly as it was so its retry produces the same files (names are a hash of the
/// content) and replaces any part of it that did get written.
struct Queue {
    writer: ArchiveWriter,
    options: ArchiveOptions,
    pending: Vec<ArchivedSample>,
    failed: Vec<ArchivedSample>,
    /// When the oldest waiting row (or the failed batch's retry) is due.
    due: Option<tokio::time::Instant>,
    last_error: Option<Error>,
}

impl Queue {
    fn push(&mut self, rows: Vec<ArchivedSample>) {
        if self.due.is_none() {
            self.due = Some(tokio::time::Instant::now() + self.options.max_delay);
        }
        self.pending.extend(rows);
    }

    /// Retries the failed batch, then writes what is pending. Returns the first error.
    async fn write_all(&mut self) -> Result<()> {
        let result = async {
            write(&self.writer, &mut self.failed).await?;
            if !self.pending.is_empty() {
                self.failed = std::mem::take(&mut self.pending);
                write(&self.writer, &mut self.failed).await?;
            }
            Ok(())
        }
        .await;
        self.due = match (&result, self.failed.is_empty()) {
            (Ok(()), _) | (Err(_), true) => None,
            (Err(_), false) => Some(tokio::time::Instant::now() + self.options.max_delay),
        };
        result
    }
}

async fn run(writer: ArchiveWriter, options: ArchiveOptions, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut q = Queue {
        writer,
        options,
        pending: Vec::new(),
        failed: Vec::new(),
        due: None,
        last_error: None,
    };
    loop {
        let msg = match q.due {
            None => rx.recv().await,
            Some(due) => match tokio::time::timeout_at(due, rx.recv()).await {
                Ok(msg) => msg,
                Err(_) => {
                    // A deadline, not an idle timeout: rows never wait much longer than
                    // max_delay, however steadily new ones arrive.
                    if let Err(e) = q.write_all().await {
                        q.last_error = Some(e);
                    }
                    continue;
                }
            },
        };
        match msg {
            Some(Msg::Rows(rows)) => {
                q.push(rows);
                if q.pending.len() >= q.options.max_rows {
                    if let Err(e) = q.write_all().await {
                        q.last_error = Some(e);
                    }
                }
            }
            Some(Msg::Flush(reply)) => {
                let result = match q.write_all().await {
                    Ok(()) => q.last_error.take().map_or(Ok(()), Err),
                    Err(e) => {
                        q.last_error = None;
                        Err(e)
                    }
                };
                let _ = reply.send(result);
            }
            None => {
                if let Err(e) = q.write_all().await {
                    let rows = q.failed.len() + q.pending.len();
                    tracing::warn!(error = %e, rows, "archiver: final write failed");
                }
                return;
            }
        }
    }
}

/// Writes what is pending; on failure keeps it for the next attempt.
async fn write(writer: &ArchiveWriter, pending: &mut Vec<ArchivedSample>) -> Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    match writer.write(pending).await {
        Ok(_) => {
            pending.clear();
            Ok(())
        }
        Err(e @ Error::Arrow { .. }) => {
            // Some sample cannot be archived at all (a reserved name, mistyped partition
            // metadata): drop those, keep the rest for the next write.
            pending.retain(|row| match ArchiveWriter::record_batch(std::slice::from_ref(row)) {
                Ok(_) => true,
                Err(why) => {
                    tracing::error!(id = %row.sample.id(), error = %why, "sample cannot be archived; dropped");
                    false
                }
            });
            Err(e)
        }
        Err(e) => {
            tracing::warn!(error = %e, rows = pending.len(), "archive write failed; will retry");
            Err(e)
        }
    }
}
