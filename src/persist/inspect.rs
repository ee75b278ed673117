//! Read-only summaries of a stored run: what its buffer holds (as recovery would restore
//! it), its archive's partitions, and the latest archived rows.
//!
//! Nothing here writes to the store, so it is safe against a run that is still writing:
//! it reads the newest checkpoint and the log after it exactly as recovery does (leniently:
//! a damaged file is skipped with a warning, as a summary should still show the rest), and
//! the archive's Parquet footers. A log group written after the listing is simply not
//! seen.

use super::archive::{ArchiveWriter, ArchivedSample};
use super::recover::recover;
use super::state::Entry;
use super::store::Store;
use crate::error::{Error, Result, StorageKind};
use crate::sample::{MetaValue, Sample};
use bytes::Bytes;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::statistics::Statistics;
use std::collections::BTreeMap;
use std::ops::Range;

/// Auxiliary keys of rollouts waiting for their group (see `rollout::GroupIngest`).
const PENDING_ROLLOUTS: &str = "rollout/pending/";
/// Auxiliary keys marking groups already stored.
const SEALED_GROUPS: &str = "rollout/sealed/";
/// The Parquet footer's tail: metadata length (4 bytes) and magic (4 bytes).
const FOOTER: u64 = parquet::file::FOOTER_SIZE as u64;

/// What a stored run holds, from [`inspect`].
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct StoreSummary {
    /// The store's URL.
    pub url: String,
    /// Samples the buffer would restore (some may have no reads left for the RPCs of the
    /// buffer that opens it; those leave at open, counted as freed).
    pub samples: usize,
    /// Of those, samples holding a rollout group (a `rollout_uid` field), and their
    /// rollouts.
    pub groups: usize,
    /// Rollouts in those groups.
    pub rollouts: usize,
    /// Stored samples per (environment, policy version) of their metadata.
    pub partitions: Vec<PartitionSummary>,
    /// Per field key: how many stored samples hold it (spilled fields included).
    pub keys: Vec<(String, usize)>,
    /// Per RPC (as the last checkpoint's configuration names them, else as the log
    /// records reads): reads per sample, stored samples it has read, and its totals.
    pub rpcs: Vec<RpcSummary>,
    /// Samples ever put, and freed.
    pub put: u64,
    /// Samples freed.
    pub freed: u64,
    /// Rollouts waiting for their group to fill (a grouped ingest's pending entries).
    pub pending_rollouts: usize,
    /// Group ids remembered as stored (so a resent group is not stored twice).
    pub sealed_markers: usize,
    /// Other auxiliary entries.
    pub aux_entries: usize,
    /// The checkpoint recovery starts from, if any.
    pub checkpoint: Option<CheckpointSummary>,
    /// Log groups after the checkpoint.
    pub log_groups: usize,
    /// Log groups skipped as damaged (a torn last write is normal after a crash).
    pub log_groups_skipped: usize,
    /// Spill segments the stored samples need.
    pub spill_segments: usize,
    /// The archive's partitions, in path order.
    pub archive: Vec<ArchivePartition>,
}

/// Stored samples of one (environment, policy version).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionSummary {
    /// The `environment` metadata, if the samples have it.
    pub environment: Option<String>,
    /// The `policy_version` metadata, if the samples have it.
    pub policy_version: Option<i64>,
    /// Samples.
    pub samples: usize,
    /// Rollouts in them (grouped samples), else 0.
    pub rollouts: usize,
}

/// One RPC's view of the stored samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RpcSummary {
    /// The RPC's name.
    pub name: String,
    /// Reads each sample owes it, when the checkpoint's configuration says.
    pub reads_per_sample: Option<u32>,
    /// Stored samples it has read at least once.
    pub samples_read: usize,
    /// Reads it has used in total (completions and commits), in samples.
    pub reads: u64,
    /// Samples it released unused.
    pub redelivered: u64,
}

/// The checkpoint a recovery starts from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointSummary {
    /// Its number (`manifest/<number>.json`).
    pub number: u64,
    /// The first log group it does not fold in.
    pub log_from: u64,
    /// Its segment files.
    pub segments: usize,
    /// Bytes of its segments.
    pub bytes: u64,
}

/// One partition directory of the archive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArchivePartition {
    /// The directory, relative to the store (`archive/environment=.../policy_version=...`).
    pub path: String,
    /// Parquet files in it.
    pub files: usize,
    /// Rows in them (from their footers).
    pub rows: u64,
    /// Bytes on the store.
    pub bytes: u64,
}

/// Summarises the run stored at `url` (see [`StoreSummary`]) without writing to it.
///
/// # Errors
///
/// [`Error::Storage`] when the store cannot be opened, listed or read, and
/// [`Error::Corrupt`] naming an archive file whose footer is not Parquet's. Damaged
/// checkpoint or log files are skipped with a warning (recovery's lenient mode).
pub async fn inspect(url: &str) -> Result<StoreSummary> {
    let store = Store::open(url)?;
    let mut recovered = recover(&store, true, true).await?;
    let state = &mut recovered.state;
    let mut out = StoreSummary {
        url: store.url().to_owned(),
        put: state.put,
        freed: state.freed,
        log_groups: recovered.replayed,
        log_groups_skipped: recovered.skipped.len(),
        spill_segments: state.spill_segments().len(),
        ..StoreSummary::default()
    };
    out.checkpoint = recovered.manifest.as_ref().map(|m| CheckpointSummary {
        number: m.number,
        log_from: m.log_from,
        segments: m.segments.len() + m.aux_segments.len(),
        bytes: m.bytes,
    });
    for key in state.aux.keys() {
        if key.starts_with(PENDING_ROLLOUTS) {
            out.pending_rollouts += 1;
        } else if key.starts_with(SEALED_GROUPS) {
            out.sealed_markers += 1;
        } else {
            out.aux_entries += 1;
        }
    }
    let mut rpcs: BTreeMap<String, RpcSummary> = BTreeMap::new();
    if let Some(m) = &recovered.manifest {
        for r in &m.config.rpcs {
            rpcs.entry(r.name.clone()).or_default().reads_per_sample = Some(r.reads);
        }
    }
    for (name, totals) in &state.rpcs {
        let r = rpcs.entry(name.to_string()).or_default();
        r.reads = totals.reads;
        r.redelivered = totals.redelivered;
    }
    let mut partitions: BTreeMap<(Option<String>, Option<i64>), PartitionSummary> = BTreeMap::new();
    let mut keys: BTreeMap<String, usize> = BTreeMap::new();
    state.decode_all().map_err(|detail| Error::Corrupt {
        url: out.url.clone(),
        path: String::new(),
        detail,
        source: None,
    })?;
    for entry in state.entries() {
        let Some(sample) = decoded(entry) else {
            continue;
        };
        out.samples += 1;
        let rollouts = sample.get("rollout_uid").map_or(0, |t| t.shape()[0]);
        if sample.get("rollout_uid").is_some() {
            out.groups += 1;
            out.rollouts += rollouts;
        }
        let environment = match sample.get_meta("environment") {
            Some(MetaValue::Str(e)) => Some(e.clone()),
            _ => None,
        };
        let policy_version = match sample.get_meta("policy_version") {
            Some(MetaValue::Int(v)) => Some(*v),
            _ => None,
        };
        let p = partitions
            .entry((environment.clone(), policy_version))
            .or_insert_with(|| PartitionSummary {
                environment,
                policy_version,
                ..PartitionSummary::default()
            });
        p.samples += 1;
        p.rollouts += rollouts;
        let spilled = entry
            .spilled
            .iter()
            .flat_map(|p| p.fields.iter().map(|(k, _)| k.as_str()));
        for key in sample.keys().chain(spilled) {
            *keys.entry(key.to_owned()).or_default() += 1;
        }
        for (name, &used) in &entry.used {
            if used > 0 {
                rpcs.entry(name.to_string()).or_default().samples_read += 1;
            }
        }
    }
    out.partitions = partitions.into_values().collect();
    out.keys = keys.into_iter().collect();
    out.rpcs = rpcs
        .into_iter()
        .map(|(name, r)| RpcSummary { name, ..r })
        .collect();
    out.archive = archive_partitions(&store).await?;
    Ok(out)
}

fn decoded(entry: &Entry) -> Option<&Sample> {
    match &entry.body {
        super::state::Body::Decoded(sample) => Some(sample),
        super::state::Body::Encoded(_) => None,
    }
}

/// The archive's partition directories with their files, rows and bytes.
async fn archive_partitions(store: &Store) -> Result<Vec<ArchivePartition>> {
    let mut parts: BTreeMap<String, ArchivePartition> = BTreeMap::new();
    for file in store.list_sized("archive").await? {
        if !file.path.ends_with(".parquet") {
            continue;
        }
        let Some(footer) = parquet_footer(store, &file.path, file.size).await? else {
            continue; // deleted since listed
        };
        let rows = u64::try_from(footer.file_metadata().num_rows()).unwrap_or(0);
        let dir = file
            .path
            .rsplit_once('/')
            .map_or("archive", |(dir, _)| dir)
            .to_owned();
        let p = parts
            .entry(dir.clone())
            .or_insert_with(|| ArchivePartition {
                path: dir,
                ..ArchivePartition::default()
            });
        p.files += 1;
        p.rows += rows;
        p.bytes += file.size;
    }
    Ok(parts.into_values().collect())
}

/// The footer of the Parquet file at `path` of `size` bytes, alone (two ranged reads);
/// `None` if it is gone.
async fn parquet_footer(store: &Store, path: &str, size: u64) -> Result<Option<ParquetMetaData>> {
    let bad = |detail: &dyn std::fmt::Display| Error::Corrupt {
        url: store.url().to_owned(),
        path: path.to_owned(),
        detail: format!("not a Parquet file: {detail}"),
        source: None,
    };
    if size < FOOTER {
        return Err(bad(&format!("{size} bytes")));
    }
    let Some(tail) = byte_range(store, path, size - FOOTER..size).await? else {
        return Ok(None);
    };
    let range = super::spill::metadata_range(size, &tail).map_err(|e| bad(&e))?;
    let Some(metadata) = byte_range(store, path, range).await? else {
        return Ok(None);
    };
    // Checked before the reader decodes it (see `spill::check_metadata`).
    super::spill::check_metadata(&metadata).map_err(|e| bad(&e))?;
    ParquetMetaDataReader::decode_metadata(&metadata)
        .map(Some)
        .map_err(|e| bad(&e))
}

/// The largest birth in an archive file, from its footer's statistics; `None` when a row
/// group has none (the file must then be read to know).
fn newest_birth(footer: &ParquetMetaData) -> Option<u64> {
    let mut newest = 0;
    for group in footer.row_groups() {
        let column = group
            .columns()
            .iter()
            .find(|c| c.column_path().string() == crate::arrow::BIRTH)?;
        match column.statistics()? {
            // Births are `UInt64`, stored as Parquet's INT64 with the bits unchanged.
            Statistics::Int64(s) => {
                newest = newest.max(u64::from_ne_bytes(s.max_opt()?.to_ne_bytes()))
            }
            _ => return None,
        }
    }
    Some(newest)
}

/// Bytes `range` of the object at `path`; `None` if it is gone.
async fn byte_range(store: &Store, path: &str, range: Range<u64>) -> Result<Option<Bytes>> {
    match store.get_ranges(path, std::slice::from_ref(&range)).await {
        Ok(mut parts) => Ok(parts.pop()),
        Err(Error::Storage {
            kind: StorageKind::NotFound,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The `n` latest archived samples of the run at `url` (the largest births, that is the
/// latest puts), oldest first.
///
/// Each file's footer says its largest birth, so files are read from the newest down, and
/// reading stops once `n` rows are in hand and no file left can hold a newer one. Files
/// are not taken by modified time: one archive batch writes a file into each partition it
/// spans, in no particular order.
///
/// # Errors
///
/// [`Error::Storage`] when listing or reading the store fails, naming the file for one
/// that does not decode as an archive file.
pub async fn archive_tail(url: &str, n: usize) -> Result<Vec<ArchivedSample>> {
    let store = Store::open(url)?;
    let reader = ArchiveWriter::new(store.clone());
    let mut files = Vec::new();
    for file in store.list_sized("archive").await? {
        if !file.path.ends_with(".parquet") {
            continue;
        }
        let Some(footer) = parquet_footer(&store, &file.path, file.size).await? else {
            continue; // deleted since listed
        };
        // A file without statistics sorts first: it is read whatever it holds.
        files.push((newest_birth(&footer).unwrap_or(u64::MAX), file.path));
    }
    // Newest first; the path breaks ties so the order does not depend on the listing.
    files.sort_unstable_by(|a, b| b.cmp(a));
    let mut rows: Vec<ArchivedSample> = Vec::new();
    for (newest, path) in files {
        if n == 0 {
            break;
        }
        if rows.len() >= n {
            // The n-th newest birth in hand: a file whose rows are all older adds nothing.
            rows.sort_unstable_by_key(|r| std::cmp::Reverse(r.sample.birth));
            rows.truncate(n);
            if rows
                .last()
                .is_some_and(|r| r.sample.birth.unwrap_or(0) > newest)
            {
                break;
            }
        }
        rows.extend(reader.read_file(&path).await?);
    }
    rows.sort_by_key(|r| r.sample.birth);
    let skip = rows.len().saturating_sub(n);
    Ok(rows.split_off(skip))
}
