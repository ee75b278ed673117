//! `Archiver`: a background task that batches consumed samples and writes them to the
//! archive, plugged into a buffer as its [`FreedSink`].
//!
//! The task writes when `max_rows` samples are pending, when `max_delay` has passed since
//! the last write attempt with samples pending, and on [`Archiver::flush`]. A failed write
//! is logged and retried with the next one; `flush` returns the error. Until the
//! write-ahead log lands, samples not yet written when the process dies are not archived.

use super::{ArchiveWriter, ArchivedSample, ExitReason};
use crate::buffer::FreedSink;
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::sync::{mpsc, oneshot, Arc};
use std::fmt;
use std::time::Duration;

/// When the archive task writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveOptions {
    /// Write once this many samples are pending (default 4,096).
    pub max_rows: usize,
    /// Write at most this long after samples started waiting (default 1 s).
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
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
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
/// # Ok::<(), rollout_buffer::Error>(()) }).unwrap();
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
    /// Starts the writing task on the current tokio runtime ([`Error::NoRuntime`] outside
    /// one).
    pub fn start(writer: ArchiveWriter, options: ArchiveOptions) -> Result<Self> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime {
            what: "the archiver",
        })?;
        let (tx, rx) = mpsc::unbounded_channel();
        handle.spawn(run(writer, options, rx));
        Ok(Self { tx })
    }

    /// Writes every sample handed over so far, and returns the error of the last failed
    /// write since the previous flush, if any.
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
}

async fn run(writer: ArchiveWriter, options: ArchiveOptions, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut pending: Vec<ArchivedSample> = Vec::new();
    let mut last_error: Option<Error> = None;
    loop {
        let msg = if pending.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout(options.max_delay, rx.recv()).await {
                Ok(msg) => msg,
                Err(_) => {
                    last_error = write(&writer, &mut pending).await.err().or(last_error);
                    continue;
                }
            }
        };
        match msg {
            Some(Msg::Rows(rows)) => {
                pending.extend(rows);
                if pending.len() >= options.max_rows {
                    last_error = write(&writer, &mut pending).await.err().or(last_error);
                }
            }
            Some(Msg::Flush(reply)) => {
                let result = match write(&writer, &mut pending).await {
                    Ok(()) => last_error.take().map_or(Ok(()), Err),
                    Err(e) => {
                        last_error = None;
                        Err(e)
                    }
                };
                let _ = reply.send(result);
            }
            None => {
                if let Err(e) = write(&writer, &mut pending).await {
                    tracing::warn!(error = %e, rows = pending.len(), "archiver: final write failed");
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
