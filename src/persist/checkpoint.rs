//! Checkpoints: the durable state folded into immutable Parquet segments, made current by a
//! manifest committed with create-if-absent.
//!
//! ```text
//! segments/seg-<hash of bytes>.parquet   id | birth | seq | state (binary)
//! segments/aux-<hash of bytes>.parquet   the auxiliary entries, same columns (id = key)
//! segments/freed-<hash of bytes>.parquet freed samples not yet archived: the same columns
//!                                        and reason | archive_batch (see `archiver.rs`)
//! manifest/<number, 20 digits>.json      segments, log_from, RPCs, totals
//! ```
//!
//! Segment rows hold a sample's id and birth as plain columns (for inspection with any
//! Parquet reader) and its reads used plus every field in `state`, in this crate's binary
//! encoding, so a segment stores whatever the buffer held, whatever its field types. Files
//! are named by a hash of their bytes: a retried upload rewrites the same object. A
//! checkpoint exists once its manifest does; `PutMode::Create` makes that the commit point,
//! and a manifest number that is already taken means another writer shares the store.
//! Recovery reads the newest manifest, its segments, and the log groups from `log_from` on;
//! anything no manifest names is an orphan, deleted only after a newer manifest commits.

use super::archive::content_hash;
use super::codec::{put_parts, take_parts, Reader, Writer};
use super::log::{parse_log_path, LOG_DIR};
use super::spill::{check_chunk_pages, footer_metadata};
use super::state::{Body, DurableState, Entry, RpcTotals, Unarchived};
use super::store::{corrupt, corrupt_by, storage_msg, Store};
use crate::error::{Result, StorageKind};
use crate::exit::ExitReason;
use crate::rpc_defs::RpcDef;
use crate::sync::Arc;
use arrow_array::builder::BinaryBuilder;
use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub(crate) const SEGMENT_DIR: &str = "segments";
pub(crate) const MANIFEST_DIR: &str = "manifest";
/// Rows per segment file, at most: bounds the memory one file takes to write or read.
const SEGMENT_ROWS: usize = 65_536;
/// Sample bytes per segment file: a segment is cut once its samples' encodings reach this
/// (one sample more at most). Writing one holds its bytes about twice (the Arrow column and
/// the Parquet file): with 4 KB samples, 65,536 rows held 0.5 GB, most of a loaded
/// server's peak memory.
const SEGMENT_BYTES: usize = 32 << 20;
const FORMAT: u64 = 1;

/// An RPC as a manifest records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredRpc {
    pub(crate) name: String,
    pub(crate) reads: u32,
    pub(crate) inputs: Vec<String>,
    pub(crate) outputs: Vec<String>,
}

impl From<&RpcDef> for StoredRpc {
    fn from(d: &RpcDef) -> Self {
        Self {
            name: d.name.clone(),
            reads: d.reads,
            inputs: d.inputs.clone(),
            outputs: d.outputs.clone(),
        }
    }
}

/// The configuration a checkpoint was written under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StoredConfig {
    pub(crate) rpcs: Vec<StoredRpc>,
    pub(crate) external_keys: Vec<String>,
}

impl StoredConfig {
    /// Every key the configuration names.
    pub(crate) fn keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self
            .rpcs
            .iter()
            .flat_map(|r| r.inputs.iter().chain(&r.outputs))
            .chain(&self.external_keys)
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

/// A committed checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Manifest {
    pub(crate) number: u64,
    /// The first log group not folded into the segments.
    pub(crate) log_from: u64,
    pub(crate) segments: Vec<String>,
    /// Segments of auxiliary entries (absent in manifests written before they existed).
    pub(crate) aux_segments: Vec<String>,
    /// Segments of freed samples not yet archived (absent before they existed).
    pub(crate) freed_segments: Vec<String>,
    /// The number the archiver's next batch takes.
    pub(crate) next_archive_batch: u64,
    pub(crate) bytes: u64,
    pub(crate) config: StoredConfig,
    pub(crate) put: u64,
    pub(crate) freed: u64,
    pub(crate) next_seq: u64,
    pub(crate) totals: BTreeMap<String, RpcTotals>,
}

fn manifest_path(number: u64) -> String {
    format!("{MANIFEST_DIR}/{number:020}.json")
}

pub(crate) fn parse_manifest_path(path: &str) -> Option<u64> {
    let digits = path
        .strip_prefix(MANIFEST_DIR)?
        .strip_prefix('/')?
        .strip_suffix(".json")?;
    (digits.len() == 20).then_some(())?;
    digits.parse().ok()
}

impl Manifest {
    fn to_json(&self) -> Value {
        let rpcs: Vec<Value> = self
            .config
            .rpcs
            .iter()
            .map(|r| json!({"name": r.name, "reads": r.reads, "inputs": r.inputs, "outputs": r.outputs}))
            .collect();
        let totals: serde_json::Map<String, Value> = self
            .totals
            .iter()
            .map(|(name, t)| {
                let v = json!({"reads": t.reads, "redelivered": t.redelivered, "expired_leases": t.expired_leases});
                (name.clone(), v)
            })
            .collect();
        json!({
            "format": FORMAT,
            "number": self.number,
            "log_from": self.log_from,
            "segments": self.segments,
            "aux_segments": self.aux_segments,
            "freed_segments": self.freed_segments,
            "next_archive_batch": self.next_archive_batch,
            "bytes": self.bytes,
            "rpcs": rpcs,
            "external_keys": self.config.external_keys,
            "put": self.put,
            "freed": self.freed,
            "next_seq": self.next_seq,
            "totals": totals,
        })
    }

    pub(crate) fn from_json(v: &Value) -> std::result::Result<Self, String> {
        let u = |k: &str| v.get(k).and_then(Value::as_u64).ok_or(format!("no `{k}`"));
        let strings = |v: Option<&Value>, what: &str| -> std::result::Result<Vec<String>, String> {
            v.and_then(Value::as_array)
                .ok_or(format!("no `{what}` list"))?
                .iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_owned)
                        .ok_or(format!("`{what}`: not a string"))
                })
                .collect()
        };
        if u("format")? != FORMAT {
            return Err(format!("format {} is not {FORMAT}", u("format")?));
        }
        let mut rpcs = Vec::new();
        for r in v.get("rpcs").and_then(Value::as_array).ok_or("no `rpcs`")? {
            rpcs.push(StoredRpc {
                name: r
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or("rpc without a name")?
                    .to_owned(),
                reads: r
                    .get("reads")
                    .and_then(Value::as_u64)
                    .ok_or("rpc without reads")? as u32,
                inputs: strings(r.get("inputs"), "inputs")?,
                outputs: strings(r.get("outputs"), "outputs")?,
            });
        }
        let mut totals = BTreeMap::new();
        for (name, t) in v
            .get("totals")
            .and_then(Value::as_object)
            .ok_or("no `totals`")?
        {
            let f = |k: &str| t.get(k).and_then(Value::as_u64).unwrap_or(0);
            let t = RpcTotals {
                reads: f("reads"),
                redelivered: f("redelivered"),
                expired_leases: f("expired_leases"),
            };
            totals.insert(name.clone(), t);
        }
        Ok(Self {
            number: u("number")?,
            log_from: u("log_from")?,
            segments: strings(v.get("segments"), "segments")?,
            aux_segments: match v.get("aux_segments") {
                Some(list) => strings(Some(list), "aux_segments")?,
                None => Vec::new(),
            },
            freed_segments: match v.get("freed_segments") {
                Some(list) => strings(Some(list), "freed_segments")?,
                None => Vec::new(),
            },
            next_archive_batch: v
                .get("next_archive_batch")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            bytes: u("bytes")?,
            config: StoredConfig {
                rpcs,
                external_keys: strings(v.get("external_keys"), "external_keys")?,
            },
            put: u("put")?,
            freed: u("freed")?,
            next_seq: u("next_seq")?,
            totals,
        })
    }
}

// ----- writing ---------------------------------------------------------------------------

/// Writes `state` (everything the log holds before group `log_from`) as checkpoint
/// `number`, then deletes what it supersedes. Returns the committed manifest.
pub(crate) async fn write(
    store: &Store,
    state: &DurableState,
    log_from: u64,
    number: u64,
    config: &StoredConfig,
) -> Result<Manifest> {
    let entries: Vec<&Entry> = state.entries().collect();
    let mut bytes = 0u64;
    let segments = write_segments(store, &entries, "seg", &mut bytes).await?;
    let aux: Vec<&Entry> = state.aux.values().collect();
    let aux_segments = write_segments(store, &aux, "aux", &mut bytes).await?;
    let freed: Vec<&Entry> = state.unarchived.iter().map(|u| &u.entry).collect();
    let exits: Vec<(ExitReason, Option<u64>)> = state
        .unarchived
        .iter()
        .map(|u| (u.reason, u.batch))
        .collect();
    let freed_segments =
        write_segments_with(store, &freed, Some(&exits), "freed", &mut bytes).await?;
    let manifest = Manifest {
        number,
        log_from,
        segments,
        aux_segments,
        freed_segments,
        next_archive_batch: state.next_archive_batch,
        bytes,
        config: config.clone(),
        put: state.put,
        freed: state.freed,
        next_seq: state.next_seq,
        totals: state
            .rpcs
            .iter()
            .map(|(name, t)| (name.to_string(), *t))
            .collect(),
    };
    let path = manifest_path(number);
    let json = Bytes::from(manifest.to_json().to_string());
    if !store.put_if_absent(&path, json).await? {
        return Err(storage_msg(
            store.url(),
            &path,
            StorageKind::AlreadyExists,
            "this manifest already exists: another buffer is writing to this store",
        ));
    }
    tracing::debug!(
        number,
        log_from,
        rows = entries.len(),
        bytes,
        "checkpoint committed"
    );
    if let Err(e) = delete_superseded(store, &manifest).await {
        tracing::warn!(error = %e, "could not delete files the checkpoint superseded");
    }
    Ok(manifest)
}

/// Writes `entries` as segments named `<kind>-<hash>.parquet`; returns their paths and adds
/// their sizes to `bytes`.
async fn write_segments(
    store: &Store,
    entries: &[&Entry],
    kind: &str,
    bytes: &mut u64,
) -> Result<Vec<String>> {
    write_segments_with(store, entries, None, kind, bytes).await
}

/// [`write_segments`], with a reason and archive batch per entry for freed samples.
async fn write_segments_with(
    store: &Store,
    entries: &[&Entry],
    exits: Option<&[(ExitReason, Option<u64>)]>,
    kind: &str,
    bytes: &mut u64,
) -> Result<Vec<String>> {
    let mut paths = Vec::new();
    let mut start = 0;
    while start < entries.len() {
        let rest = entries.get(start..).unwrap_or_default();
        let rows = start..start + segment_len(rest.iter().map(|e| e.encoded_len_hint()));
        let chunk = entries.get(rows.clone()).unwrap_or(rest);
        start = rows.end;
        let exits = exits.and_then(|e| e.get(rows));
        let encoded = encode_segment(chunk, exits)
            .map_err(|e| storage_msg(store.url(), SEGMENT_DIR, StorageKind::Other, e))?;
        let path = format!(
            "{SEGMENT_DIR}/{kind}-{:016x}.parquet",
            content_hash(&encoded)
        );
        *bytes += encoded.len() as u64;
        store.put(&path, encoded).await?;
        paths.push(path);
    }
    Ok(paths)
}

/// How many of the next entries, of these encoded sizes, go in one segment: at most
/// [`SEGMENT_ROWS`], and no more once their bytes reach [`SEGMENT_BYTES`]; at least one.
fn segment_len(sizes: impl Iterator<Item = usize>) -> usize {
    let mut bytes = 0;
    sizes
        .take(SEGMENT_ROWS)
        .take_while(|size| {
            let more = bytes < SEGMENT_BYTES;
            bytes += size;
            more
        })
        .count()
        .max(1)
}

/// Deletes log groups before the manifest's `log_from`, segments it does not name, and
/// older manifests.
async fn delete_superseded(store: &Store, manifest: &Manifest) -> Result<()> {
    let mut superseded = store.list(LOG_DIR).await?;
    superseded.retain(|path| parse_log_path(path).is_some_and(|seq| seq < manifest.log_from));
    store.retire_all(&superseded).await?;
    for path in store.list(SEGMENT_DIR).await? {
        let named = manifest.segments.contains(&path)
            || manifest.aux_segments.contains(&path)
            || manifest.freed_segments.contains(&path);
        if !named {
            store.delete(&path).await?;
        }
    }
    for path in store.list(MANIFEST_DIR).await? {
        if parse_manifest_path(&path).is_some_and(|n| n < manifest.number) {
            store.delete(&path).await?;
        }
    }
    Ok(())
}

fn encode_segment(
    entries: &[&Entry],
    exits: Option<&[(ExitReason, Option<u64>)]>,
) -> std::result::Result<Bytes, String> {
    let ids = StringArray::from_iter_values(entries.iter().map(|e| e.id.as_str()));
    let births = UInt64Array::from_iter_values(entries.iter().map(|e| e.birth));
    let seqs = UInt64Array::from_iter_values(entries.iter().map(|e| e.seq));
    // Each state straight into the column: one copy of the samples' bytes besides the file.
    let hint: usize = entries.iter().map(|e| e.encoded_len_hint() + 64).sum();
    let mut states = BinaryBuilder::with_capacity(entries.len(), hint);
    let mut w = Writer::default();
    for e in entries {
        w.buf.clear();
        w.len(e.used.len());
        for (rpc, &used) in &e.used {
            w.str(rpc);
            w.u16(used);
        }
        e.encode_sample(&mut w);
        states.append_value(&w.buf);
    }
    let states = states.finish();
    // Where a spilled sample's other fields are (its `state` holds the stub).
    let spilled = BinaryArray::from_iter(entries.iter().map(|e| {
        (!e.spilled.is_empty()).then(|| {
            let mut w = Writer::default();
            put_parts(&mut w, &e.spilled);
            w.buf
        })
    }));
    let mut fields = vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("birth", DataType::UInt64, false),
        Field::new("seq", DataType::UInt64, false),
        Field::new("state", DataType::Binary, false),
        Field::new("spilled", DataType::Binary, true),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(ids),
        Arc::new(births),
        Arc::new(seqs),
        Arc::new(states),
        Arc::new(spilled),
    ];
    // Freed samples: why each left, and the archive batch it is in, if any.
    if let Some(exits) = exits {
        fields.push(Field::new("reason", DataType::Utf8, false));
        fields.push(Field::new("archive_batch", DataType::UInt64, true));
        columns.push(Arc::new(StringArray::from_iter_values(
            exits.iter().map(|(r, _)| r.as_str()),
        )));
        columns.push(Arc::new(UInt64Array::from_iter(
            exits.iter().map(|(_, b)| *b),
        )));
    }
    let batch =
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())?;
    // The samples' bytes are stored as the log stores them, uncompressed: compressing them
    // was most of a checkpoint's cost (zstd, even at level 1, about 19 instructions a
    // byte, on every live byte at every checkpoint), and the log, which a checkpoint
    // follows only once it has outgrown it, already writes each of them uncompressed.
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()))
        .set_column_compression(ColumnPath::from("state"), Compression::UNCOMPRESSED)
        .set_column_dictionary_enabled(ColumnPath::from("state"), false)
        // Min / max of whole states compare every state byte for a prefix no read uses.
        .set_column_statistics_enabled(ColumnPath::from("state"), EnabledStatistics::None)
        .build();
    // Sized up front: the file is about the states' bytes (uncompressed) and a little more.
    let mut buf = Vec::with_capacity(hint + entries.len() * 64);
    let mut writer =
        ArrowWriter::try_new(&mut buf, batch.schema(), Some(props)).map_err(|e| e.to_string())?;
    writer.write(&batch).map_err(|e| e.to_string())?;
    writer.close().map_err(|e| e.to_string())?;
    Ok(Bytes::from(buf))
}

// ----- reading ---------------------------------------------------------------------------

/// What [`load`] found.
pub(crate) struct Loaded {
    /// The newest manifest that loads, and the state its segments hold.
    pub(crate) checkpoint: Option<(Manifest, DurableState)>,
    /// The largest manifest number listed, damaged or not: the next checkpoint must come
    /// after it.
    pub(crate) highest: Option<u64>,
}

/// The newest manifest and the state its segments hold (`None` for a store without one).
/// With `lenient`, a damaged manifest or segment is skipped with a warning (falling back
/// to an older manifest, or to an empty state) instead of failing.
pub(crate) async fn load(store: &Store, lenient: bool) -> Result<Loaded> {
    let mut numbers: Vec<(u64, String)> = store
        .list(MANIFEST_DIR)
        .await?
        .into_iter()
        .filter_map(|p| parse_manifest_path(&p).map(|n| (n, p)))
        .collect();
    numbers.sort();
    let highest = numbers.last().map(|(n, _)| *n);
    while let Some((_, path)) = numbers.pop() {
        match load_one(store, &path).await {
            Ok(loaded) => {
                return Ok(Loaded {
                    checkpoint: Some(loaded),
                    highest,
                })
            }
            Err(e) if lenient => {
                tracing::warn!(error = %e, "skipping a damaged checkpoint (lenient recovery)");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Loaded {
        checkpoint: None,
        highest,
    })
}

async fn load_one(store: &Store, path: &str) -> Result<(Manifest, DurableState)> {
    let bytes = store
        .get(path)
        .await?
        .ok_or_else(|| corrupt(store, path, "listed but gone"))?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| corrupt_by(store, path, e))?;
    let manifest = Manifest::from_json(&value).map_err(|e| corrupt(store, path, e))?;
    let mut state = DurableState::default();
    state.next_seq = manifest.next_seq;
    state.put = manifest.put;
    state.freed = manifest.freed;
    state.rpcs = manifest
        .totals
        .iter()
        .map(|(n, t)| (Arc::from(n.as_str()), *t))
        .collect();
    state.next_archive_batch = manifest.next_archive_batch;
    let mut files: Vec<(&String, &str)> = Vec::new();
    files.extend(manifest.segments.iter().map(|s| (s, "seg")));
    files.extend(manifest.aux_segments.iter().map(|s| (s, "aux")));
    files.extend(manifest.freed_segments.iter().map(|s| (s, "freed")));
    for (segment, kind) in files {
        let bytes = store
            .get(segment)
            .await?
            .ok_or_else(|| corrupt(store, segment, "named by the manifest but missing"))?;
        // The name is the hash of the bytes: any damage shows before decoding (Parquet
        // pages carry no checksum by default).
        let expected = format!("{SEGMENT_DIR}/{kind}-{:016x}.parquet", content_hash(&bytes));
        if *segment != expected {
            return Err(corrupt(store, segment, "content does not match its hash"));
        }
        // The Parquet decoder is not panic-free on every malformed page: a bad file must
        // come back as an error naming it.
        let decoded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode_segment(bytes)))
                .unwrap_or_else(|_| Err("the Parquet decoder failed on this file".into()))
                .map_err(|e| corrupt(store, segment, e))?;
        for (entry, exit) in decoded {
            match (kind, exit) {
                ("aux", _) => {
                    state.aux.insert(Arc::from(entry.id.as_str()), entry);
                }
                ("freed", Some((reason, batch))) => state.unarchived.push(Unarchived {
                    entry,
                    reason,
                    batch,
                }),
                ("freed", None) => {
                    return Err(corrupt(store, segment, "a freed sample without its reason"))
                }
                _ => state.push(entry),
            }
        }
    }
    Ok((manifest, state))
}

/// A freed sample's reason and archive batch (`None` in other segments).
type Exit = Option<(ExitReason, Option<u64>)>;

pub(crate) fn decode_segment(bytes: Bytes) -> std::result::Result<Vec<(Entry, Exit)>, String> {
    // The footer is checked before the reader decodes it (see `spill::footer_metadata`).
    footer_metadata(&bytes)?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).map_err(|e| e.to_string())?;
    // The page headers are checked before the reader sizes buffers by them.
    for group in builder.metadata().row_groups() {
        for column in group.columns() {
            check_chunk_pages(column, &bytes)?;
        }
    }
    let reader = builder.build().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| e.to_string())?;
        let ids: StringArray = column(&batch, "id")?;
        let births: UInt64Array = column(&batch, "birth")?;
        let seqs: UInt64Array = column(&batch, "seq")?;
        let states: BinaryArray = column(&batch, "state")?;
        // Segments written before spilling existed have no such column.
        let spilled: Option<BinaryArray> = column(&batch, "spilled").ok();
        // Only segments of freed samples have these.
        let reasons: Option<StringArray> = column(&batch, "reason").ok();
        let batches: Option<UInt64Array> = column(&batch, "archive_batch").ok();
        for row in 0..batch.num_rows() {
            let parts = match &spilled {
                Some(col) if col.is_valid(row) => take_parts(&mut Reader::new(col.value(row)))?,
                _ => Vec::new(),
            };
            let state = states.value(row);
            let mut r = Reader::new(state);
            let n = r.count(10)?;
            let mut used = BTreeMap::new();
            for _ in 0..n {
                let rpc: Arc<str> = Arc::from(r.str()?);
                used.insert(rpc, r.u16()?);
            }
            // The sample stays encoded until someone needs it.
            let sample = Bytes::copy_from_slice(&state[r.position()..]);
            let exit = match &reasons {
                Some(col) => {
                    let name = col.value(row);
                    let reason = ExitReason::from_name(name)
                        .ok_or(format!("unknown exit reason `{name}`"))?;
                    let batch = batches
                        .as_ref()
                        .and_then(|b| b.is_valid(row).then(|| b.value(row)));
                    Some((reason, batch))
                }
                None => None,
            };
            let entry = Entry {
                seq: seqs.value(row),
                id: ids.value(row).into(),
                birth: births.value(row),
                body: Body::Encoded(sample),
                used,
                spilled: parts,
            };
            out.push((entry, exit));
        }
    }
    Ok(out)
}

/// Column `name` of `batch` as an array of type `A`.
fn column<A: Array + Clone + 'static>(
    batch: &RecordBatch,
    name: &str,
) -> std::result::Result<A, String> {
    batch
        .column_by_name(name)
        .ok_or(format!("no `{name}` column"))?
        .as_any()
        .downcast_ref::<A>()
        .cloned()
        .ok_or(format!(
            "`{name}` has type {:?}",
            batch
                .schema()
                .field_with_name(name)
                .map(|f| f.data_type().clone())
                .ok()
        ))
}

/// Every log path from `log_from` on, with its sequence number, in order.
pub(crate) async fn log_files(store: &Store, log_from: u64) -> Result<Vec<(u64, String)>> {
    let mut files: Vec<(u64, String)> = store
        .list(LOG_DIR)
        .await?
        .into_iter()
        .filter_map(|p| parse_log_path(&p).map(|s| (s, p)))
        .filter(|&(s, _)| s >= log_from)
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_cut_by_bytes_and_by_rows_and_hold_at_least_one_sample() {
        let kb4 = std::iter::repeat(4096);
        // Up to the first sample that reaches the bound.
        assert_eq!(segment_len(kb4.clone()), SEGMENT_BYTES / 4096);
        assert_eq!(
            segment_len(std::iter::repeat(5000)),
            SEGMENT_BYTES.div_ceil(5000)
        );
        assert_eq!(segment_len(kb4.take(10)), 10);
        assert_eq!(segment_len(std::iter::repeat(8)), SEGMENT_ROWS);
        assert_eq!(segment_len(std::iter::repeat(SEGMENT_BYTES * 2)), 1);
        assert_eq!(segment_len([100, SEGMENT_BYTES, 1].into_iter()), 2);
    }
}
