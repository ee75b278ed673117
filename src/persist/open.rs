//! `SequenceBuffer::open`: a buffer whose contents live in a store, created or recovered.
//!
//! Opening recovers the newest checkpoint and the log after it, checks that the stored
//! data fits the RPC definitions given, restores every sample with the reads it has left
//! (leases held at the crash come back released), writes a fresh checkpoint when the log
//! had anything to replay, and starts the log writer and the archiver.

use super::archive::{ArchiveWriter, ArchivedSample};
use super::archiver::{ArchiveOptions, Archiver};
use super::checkpoint::{self, StoredConfig, StoredRpc};
use super::checkpointer::Checkpointer;
use super::recover::recover;
use super::spill::ParquetSpill;
use super::state::{Body, DurableState};
use super::store::Store;
use super::wal::{Durability, Wal, WriterSetup};
use crate::buffer::{merge_spilled, BufferConfig, Journal, SequenceBuffer, SpillStore};
use crate::error::{Error, Result};
use crate::exit::ExitReason;
use crate::rpc_defs::RpcDef;
use crate::sample::births_after;
use crate::sync::Arc;

/// What recovery does with a damaged file that is not the log's torn tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RecoveryMode {
    /// Fail with [`Error::Corrupt`] naming the file.
    #[default]
    Strict,
    /// Skip it with a warning and recover what the other files hold.
    Lenient,
    /// [`repair`](super::repair) the store first: recover everything before the first
    /// damaged file, move it and everything that depended on it aside under `damaged/<n>/`
    /// (nothing is deleted), log what was lost, then recover strictly.
    Salvage,
}

/// How a persistent buffer logs, recovers and archives.
///
/// ```
/// use rollout_buffer::persist::{Durability, PersistOptions, RecoveryMode};
/// use std::time::Duration;
///
/// let options = PersistOptions::new()
///     .durability(Durability::Interval(Duration::from_millis(10)))
///     .recovery(RecoveryMode::Strict);
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
pub struct PersistOptions {
    durability: Durability,
    recovery: RecoveryMode,
    archive: Option<ArchiveOptions>,
    checkpoint_bytes: u64,
    max_backlog: u64,
}

impl Default for PersistOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl PersistOptions {
    /// `Durability::Sync`, strict recovery, consumed samples archived with the default
    /// [`ArchiveOptions`], a checkpoint once 64 MiB of log (and at least the size of the
    /// last checkpoint) has been written, puts held back while more than 256 MiB of put
    /// data waits for the log.
    pub fn new() -> Self {
        Self {
            durability: Durability::Sync,
            recovery: RecoveryMode::Strict,
            archive: Some(ArchiveOptions::default()),
            checkpoint_bytes: 64 << 20,
            max_backlog: 256 << 20,
        }
    }

    /// When a change counts as done.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// What recovery does with damaged files.
    pub fn recovery(mut self, mode: RecoveryMode) -> Self {
        self.recovery = mode;
        self
    }

    /// Archives consumed samples under `<url>/archive/` with `options` (the default), or,
    /// with `None`, not at all.
    pub fn archive(mut self, options: Option<ArchiveOptions>) -> Self {
        self.archive = options;
        self
    }

    /// Tensor bytes of puts not yet on storage above which `put_batch` waits (and
    /// `try_put_batch` returns
    /// [`Error::Backlog`](crate::Error::Backlog)): what a store that falls behind may cost in memory.
    pub fn max_backlog(mut self, bytes: u64) -> Self {
        self.max_backlog = bytes.max(1);
        self
    }

    /// Log bytes written before a checkpoint folds the log into segments (it also waits
    /// until the log outgrows the last checkpoint, so checkpoints cost amortised O(1) per
    /// logged byte).
    pub fn checkpoint_bytes(mut self, bytes: u64) -> Self {
        self.checkpoint_bytes = bytes;
        self
    }
}

impl SequenceBuffer {
    /// Creates or recovers the buffer stored at `url` (`memory://`, `file:///dir` or a
    /// path, `s3://bucket/prefix`, `gs://…`, `az://…`): `capacity` slots serving `rpcs`.
    /// Must run inside a tokio runtime (the log writer and archiver are tasks).
    ///
    /// Everything durable before a crash comes back: samples with their fields, amends,
    /// births and the reads each RPC has left; leases held at the crash come back released.
    ///
    /// # Errors
    ///
    /// * [`Error::Storage`] when the store cannot be opened, read or written (recovery,
    ///   the checkpoint written after it, clearing orphaned spill segments).
    /// * [`Error::Corrupt`] naming a damaged file (unless [`RecoveryMode::Lenient`] skips
    ///   it), or for a recovered sample that does not decode.
    /// * [`Error::Incompatible`] when the stored data needs an RPC or key that `rpcs` no
    ///   longer has, or more slots than `capacity`.
    /// * The configuration errors of [`SequenceBuffer::new`] ([`Error::InvalidCapacity`],
    ///   [`Error::DuplicateRpc`], [`Error::CyclicGraph`], ...).
    /// * [`Error::NoRuntime`] when the log writer or the archiver finds no tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no buffer and no log writer, and the store as consistent
    /// as after a crash (a checkpoint counts once its manifest is written): opening it again
    /// recovers the same contents.
    ///
    /// ```
    /// use rollout_buffer::{persist::PersistOptions, RpcDef, Sample, SequenceBuffer};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), rollout_buffer::Error> {
    /// let dir = std::env::temp_dir().join(format!("rb-open-doc-{}", std::process::id()));
    /// let url = dir.to_string_lossy().into_owned();
    /// let rpcs = || [RpcDef::new("train", 1).inputs(["tokens"])];
    /// let buf = SequenceBuffer::open(&url, 8, rpcs(), PersistOptions::new()).await?;
    /// buf.put_batch(vec![Sample::new("a").with("tokens", vec![1i32, 2])]).await?;
    /// drop(buf); // or a crash: the put returned, so it is on disk
    /// let again = SequenceBuffer::open(&url, 8, rpcs(), PersistOptions::new()).await?;
    /// assert_eq!(again.len(), 1);
    /// # drop(again);
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok(())
    /// # }
    /// ```
    pub async fn open(
        url: &str,
        capacity: usize,
        rpcs: impl IntoIterator<Item = RpcDef>,
        options: PersistOptions,
    ) -> Result<Self> {
        let store = Store::open(url)?;
        Self::open_in(store, BufferConfig::new(capacity).rpcs(rpcs), options).await
    }

    /// [`Self::open`] on a [`Store`] already opened, with a full configuration (external
    /// keys; a freed-sample sink of its own replaces the archiver).
    ///
    /// # Errors
    ///
    /// As [`Self::open`] (the configuration errors including
    /// [`Error::ExternalKeyProduced`] for an external key an RPC outputs).
    ///
    /// # Cancel safety
    ///
    /// As [`Self::open`].
    pub async fn open_in(
        store: Store,
        mut config: BufferConfig,
        options: PersistOptions,
    ) -> Result<Self> {
        let lenient = options.recovery == RecoveryMode::Lenient;
        if options.recovery == RecoveryMode::Salvage {
            let report = super::repair::repair(&store).await?;
            if !report.is_clean() {
                tracing::warn!(report = %report.to_json(), "opened a salvaged store");
            }
        }
        // The archive is at least once only through the log (see `archiver.rs`).
        let archive = options
            .archive
            .filter(|_| config.freed_sink.is_none() && options.durability != Durability::None);
        let mut recovered = recover(&store, lenient, archive.is_some()).await?;
        let stored_config = StoredConfig {
            rpcs: config.rpcs.iter().map(StoredRpc::from).collect(),
            external_keys: config.external_keys.clone(),
        };
        let undecodable = |detail| Error::Corrupt {
            url: store.url().to_owned(),
            path: String::new(),
            detail,
            source: None,
        };
        recovered.state.decode_all().map_err(undecodable)?;
        let old_config = recovered.manifest.as_ref().map(|m| &m.config);
        check_compatible(&recovered.state, old_config, &stored_config)?;
        let reads: Vec<(Arc<str>, u16)> = config
            .rpcs
            .iter()
            .map(|d| {
                (
                    Arc::from(d.name.as_str()),
                    u16::try_from(d.reads).unwrap_or(u16::MAX),
                )
            })
            .collect();
        let restored = recovered.state.restored(&reads).map_err(undecodable)?;
        births_after(recovered.state.max_birth());
        // Spill segments are the durable copy of the fields spilled samples left in them;
        // the others are orphans of an interrupted spill, rewrite or delete.
        let needed = recovered.state.spill_segments();
        let cleared = ParquetSpill::clear_orphans(&store, &needed).await?;
        if cleared > 0 {
            tracing::info!(segments = cleared, "deleted spill segments no sample needs");
        }
        if (config.memory_budget.is_some() || !needed.is_empty()) && config.spill_store.is_none() {
            config = config.spill_to(store.clone());
        }
        let sync = options.durability == Durability::Sync;
        if options.durability == Durability::None {
            if let Some(archive) = options.archive.filter(|_| config.freed_sink.is_none()) {
                let archiver = Archiver::start(ArchiveWriter::new(store.clone()), archive)?;
                config = config.freed_sink(archiver);
            }
            let buffer = SequenceBuffer::build(config, sync)?;
            buffer.restore(restored, None)?;
            return Ok(buffer);
        }
        let mut number = recovered.next_manifest;
        let mut checkpoint_size = recovered.manifest.as_ref().map_or(0, |m| m.bytes);
        let changed = Some(&stored_config) != recovered.manifest.as_ref().map(|m| &m.config);
        let mut skipped = recovered.skipped;
        // Samples found consumed without a logged free left the state above; a checkpoint
        // records that, so the next recovery does not find (and archive) them again.
        let settled = recovered.state.settled_on_restore > 0;
        if recovered.replayed > 0 || changed || !skipped.is_empty() || settled {
            // Fold what was replayed into a checkpoint now: the next recovery starts from
            // it, and the skipped groups are deleted with the rest of the old log.
            let next = recovered.next_seq;
            let m =
                checkpoint::write(&store, &recovered.state, next, number, &stored_config).await?;
            number += 1;
            checkpoint_size = m.bytes;
            skipped.clear();
        }
        // The samples still waiting for the archive, which stay in the state too.
        let waiting = match archive {
            Some(_) => {
                let read_by: Vec<String> = config
                    .rpcs
                    .iter()
                    .flat_map(|d| std::iter::repeat_n(d.name.clone(), d.reads as usize))
                    .collect();
                unarchived_rows(&store, &mut recovered.state, &read_by).await?
            }
            None => Vec::new(),
        };
        let next_archive_batch = recovered.state.next_archive_batch;
        // What the store holds now, the image the log writer keeps up to date (its
        // samples are the ones the buffer gets: shared, not copied).
        let checkpoints = Checkpointer::start(
            store.clone(),
            stored_config,
            recovered.state,
            number,
            options.checkpoint_bytes,
            checkpoint_size,
        )?;
        let wal = Wal::start(WriterSetup {
            store: store.clone(),
            durability: options.durability,
            seq: recovered.next_seq,
            abandoned: skipped,
            checkpoints,
            max_backlog: options.max_backlog,
        })?;
        let journal: Arc<dyn Journal> = Arc::new(wal);
        if let Some(archive) = archive {
            let archiver = Archiver::start_logged(
                ArchiveWriter::new(store.clone()),
                archive,
                Arc::clone(&journal),
                next_archive_batch,
                waiting,
            )?;
            config = config.freed_sink(archiver);
        }
        let buffer = SequenceBuffer::build(config, sync)?;
        buffer.restore(restored, Some(journal))?;
        Ok(buffer)
    }
}

/// The samples recovery found still waiting for the archive, as archive rows with the
/// batch the log put them in: whole again (their spilled fields read back), `read_by`
/// naming every read of every RPC for the consumed ones.
async fn unarchived_rows(
    store: &Store,
    state: &mut DurableState,
    read_by: &[String],
) -> Result<Vec<(Option<u64>, ArchivedSample)>> {
    let undecodable = |detail| Error::Corrupt {
        url: store.url().to_owned(),
        path: String::new(),
        detail,
        source: None,
    };
    let waiting = state.unarchived_samples().map_err(undecodable)?;
    let spill = ParquetSpill::new(store.clone());
    let mut rows = Vec::with_capacity(waiting.len());
    for (sample, parts, reason, batch) in waiting {
        let mut sample = Arc::unwrap_or_clone(sample);
        for part in parts {
            let keys = part.fields.iter().map(|(k, _)| k.clone()).collect();
            let segment = spill.segment(part.segment, part.segment_rows);
            match spill.read(segment, vec![part.row], keys).await {
                Ok(mut loaded) => {
                    if let Some(fields) = loaded.pop() {
                        sample = merge_spilled(&sample, fields);
                    }
                }
                Err(e) => tracing::warn!(
                    id = %sample.id(), error = %e,
                    "a sample waiting for the archive lost its spilled fields; archived without them"
                ),
            }
        }
        let read_by = if reason == ExitReason::Consumed {
            read_by.to_vec()
        } else {
            Vec::new()
        };
        rows.push((
            batch,
            ArchivedSample {
                sample,
                read_by,
                reason,
            },
        ));
    }
    Ok(rows)
}

/// Fails when the stored samples need something the new configuration dropped: reads of
/// an RPC that no longer exists, or a key the old configuration knew and the new one does
/// not.
fn check_compatible(
    state: &DurableState,
    old: Option<&StoredConfig>,
    new: &StoredConfig,
) -> Result<()> {
    let Some(old) = old else {
        return Ok(());
    };
    let new_keys = new.keys();
    let removed: Vec<&str> = old
        .keys()
        .into_iter()
        .filter(|k| !new_keys.contains(k))
        .collect();
    for key in removed {
        let holders = state
            .entries()
            .filter(|e| matches!(&e.body, Body::Decoded(s) if s.get(key).is_some()))
            .count();
        if holders > 0 {
            return Err(Error::Incompatible {
                detail: format!(
                    "key `{key}` was removed from the RPC definitions, but {holders} stored \
                     samples hold it"
                ),
            });
        }
    }
    for rpc in &old.rpcs {
        if new.rpcs.iter().any(|r| r.name == rpc.name) {
            continue;
        }
        let owed = state
            .entries()
            .filter(|e| u32::from(e.used.get(rpc.name.as_str()).copied().unwrap_or(0)) < rpc.reads)
            .count();
        if owed > 0 {
            return Err(Error::Incompatible {
                detail: format!(
                    "RPC `{}` was removed, but {owed} stored samples still owe it reads",
                    rpc.name
                ),
            });
        }
    }
    Ok(())
}
