//! `ArchiveWriter`: the Parquet dataset of samples that left the buffer.
//!
//! Layout, hive-partitioned so pyarrow, DuckDB and Polars read it with no schema from this
//! crate:
//!
//! ```text
//! <store>/archive/environment=<env>/policy_version=<v>/part-<hash>.parquet
//! ```
//!
//! `environment` (a string) and `policy_version` (an integer) come from the samples'
//! metadata and live only in the path; a sample without them goes to the
//! `__HIVE_DEFAULT_PARTITION__` value, which the readers turn into null. Rows hold the
//! sample's columns as [`to_record_batch`](crate::arrow::to_record_batch) lays them out,
//! plus `read_by` (list of the RPCs that used it) and `reason` (how it left). Files are
//! zstd-compressed and named by a hash of their bytes, so writing the same rows again
//! replaces the earlier attempt instead of adding a duplicate; a persistent buffer's
//! archiver names them by batch number instead (`part-<batch>.parquet`, see `archiver.rs`). Every file carries all the
//! columns the archive has had, in one order, new ones appended (`archive_schema.rs`).

use super::archive_schema;
use super::store::{percent_decode, storage_err, storage_msg, Store};
use crate::arrow::{from_record_batch, to_record_batch};
use crate::error::{Error, Result, StorageKind};
use crate::exit::ExitReason;
use crate::sample::{MetaValue, Sample};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering};
use arrow_array::{ArrayRef, ListArray, RecordBatch, StringArray};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use std::collections::{BTreeMap, HashSet};

/// Average bytes per value above which a text or binary column gets no dictionary and no
/// statistics (see [`bulky_columns_plain`]).
const BULKY_VALUE_BYTES: usize = 256;

/// `props` with dictionary encoding and statistics turned off for the text and binary
/// leaf columns of `batch` (lists of them too: a group's chats) whose values average over
/// [`BULKY_VALUE_BYTES`]: their dictionaries hash every value and fall back to plain
/// encoding once full, and their min / max compare whole values to keep a truncated
/// prefix no query prunes on. Small columns (ids, names, scalars) keep both.
fn bulky_columns_plain(props: WriterProperties, batch: &RecordBatch) -> WriterProperties {
    let mut builder = props.into_builder();
    let mut bulky = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        bulky_leaves(vec![field.name().clone()], column, &mut bulky);
    }
    for path in bulky {
        let path = ColumnPath::new(path);
        builder = builder
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_statistics_enabled(path, EnabledStatistics::None);
    }
    builder.build()
}

/// Adds to `out` the Parquet paths of the bulky byte leaves of `column` (at `path`).
fn bulky_leaves(path: Vec<String>, column: &ArrayRef, out: &mut Vec<Vec<String>>) {
    let data = column.to_data();
    match column.data_type() {
        DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => {
            let value_bytes = data.buffers().get(1).map_or(0, |b| b.len());
            if value_bytes > BULKY_VALUE_BYTES * column.len().max(1) {
                out.push(path);
            }
        }
        DataType::List(item) | DataType::LargeList(item) => {
            if let Some(values) = data.child_data().first() {
                let mut inner = path;
                inner.extend(["list".to_owned(), item.name().clone()]);
                bulky_leaves(inner, &arrow_array::make_array(values.clone()), out);
            }
        }
        _ => {}
    }
}

/// The value hive readers take as null.
const NULL_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";
/// Metadata keys that become partition directories.
const ENVIRONMENT: &str = "environment";
const POLICY_VERSION: &str = "policy_version";
/// Marks the archive's own columns, which are not sample fields.
const ARCHIVE_ROLE: &str = "archive";

/// A sample that left the buffer, the RPCs that read it, and why it left.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchivedSample {
    /// The sample, with every field and its metadata.
    pub sample: Sample,
    /// Names of the RPCs that used it, once per read.
    pub read_by: Vec<String>,
    /// How it left.
    pub reason: ExitReason,
}

/// Writes archived samples as a hive-partitioned Parquet dataset (see the module docs).
/// Clones share the archive's schema.
#[derive(Debug, Clone)]
pub struct ArchiveWriter {
    store: Store,
    props: WriterProperties,
    /// The archive's columns so far (see `archive_schema.rs`); `None` until loaded.
    schema: Arc<Mutex<Option<Option<SchemaRef>>>>,
    /// Set while files written before the archive's last new column may still lack it:
    /// the next write rewrites them ([`Self::widen`]), again after a failed attempt.
    unwidened: Arc<AtomicBool>,
    /// Integer metadata columns that stay integers: some archived value is past 2^53,
    /// which floats would round (see [`archive_schema::exact_as_floats`]).
    pinned: Arc<Mutex<HashSet<String>>>,
}

impl ArchiveWriter {
    /// An archive under `<store>/archive/`, zstd level 1 (fast; rollout tokens compress
    /// well at any level).
    pub fn new(store: Store) -> Self {
        let level = ZstdLevel::try_new(1).unwrap_or_default();
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(level))
            .build();
        Self {
            store,
            props,
            schema: Arc::new(Mutex::new(None)),
            unwidened: Arc::new(AtomicBool::new(false)),
            pinned: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// The archive's schema so far, read from the store on first use; a widening a crash
    /// interrupted (see [`Self::widen`]) is left to the write that asked, once its own
    /// files are written.
    async fn known_schema(&self) -> Result<Option<SchemaRef>> {
        if let Some(known) = self.schema.lock().clone() {
            return Ok(known);
        }
        let loaded = archive_schema::load(&self.store).await?;
        if loaded.is_some()
            && self
                .store
                .get(archive_schema::WIDENING_FILE)
                .await?
                .is_some()
        {
            self.unwidened.store(true, Ordering::Release);
        }
        Ok(self.schema.lock().get_or_insert(loaded).clone())
    }

    /// Rewrites every archive file but `skip` whose columns are fewer than `schema`'s with
    /// all of them (nulls where it had none), so every file of the dataset has one schema
    /// again after the archive gained a column; then removes the widening mark.
    ///
    /// The mark is stored before the grown schema, so a crash anywhere in between leaves
    /// it, and the next writer's first write widens again (a file already wide is left
    /// alone); a widening that fails is tried again by the next write. Nothing is done
    /// when no widening is due. A file that does not read, or whose columns are not all in
    /// `schema` with the same types (one written before the archive kept a schema), is left
    /// as it is: widening never drops a column. Files are replaced whole, so a reader sees
    /// a file before or after, never part of one.
    async fn widen(&self, schema: &SchemaRef, skip: &[String]) -> Result<()> {
        if !self.unwidened.load(Ordering::Acquire) {
            return Ok(());
        }
        for path in self.store.list("archive").await? {
            if !path.ends_with(".parquet") || skip.contains(&path) {
                continue;
            }
            let Some(bytes) = self.store.get(&path).await? else {
                continue;
            };
            // Its columns from its footer first: most files are already wide, and those
            // are not decoded.
            let batches = match self.file_schema(&path, &bytes) {
                Ok(columns) if !archive_schema::widens(&columns, schema) => continue,
                Ok(_) => self.read_batches(&path, bytes),
                Err(e) => Err(e),
            };
            let batches = match batches {
                Ok(batches) => batches,
                Err(e) => {
                    tracing::warn!(path, error = %e, "an unreadable archive file is not widened");
                    continue;
                }
            };
            let wide = batches
                .iter()
                .map(|b| archive_schema::conform(b, schema))
                .collect::<Result<Vec<_>>>()?;
            let bytes = self.encode(&path, &wide)?;
            self.store.put(&path, bytes).await?;
            tracing::debug!(
                path,
                columns = schema.fields().len(),
                "widened an archive file"
            );
        }
        self.store.delete(archive_schema::WIDENING_FILE).await?;
        self.unwidened.store(false, Ordering::Release);
        Ok(())
    }

    /// Writes `samples`, one Parquet file per partition, and returns the paths written
    /// (relative to the store). Writing the same samples again rewrites the same files.
    ///
    /// # Errors
    ///
    /// Files of partitions written before the error stay.
    ///
    /// * [`Error::Arrow`] for `environment` metadata that is not a string or
    ///   `policy_version` metadata that is not an integer, and as [`Self::record_batch`].
    /// * [`Error::Storage`] when a file fails to encode as Parquet or to be written.
    pub async fn write(&self, samples: &[ArchivedSample]) -> Result<Vec<String>> {
        self.write_as(samples, None).await
    }

    /// [`Self::write`]; with `batch`, the files are named by the batch number instead of
    /// their bytes (`part-<batch, 20 digits>.parquet`), so writing the batch again after a
    /// crash replaces what it wrote even if the archive's columns grew in between.
    pub(crate) async fn write_as(
        &self,
        samples: &[ArchivedSample],
        number: Option<u64>,
    ) -> Result<Vec<String>> {
        let mut partitions: BTreeMap<String, Vec<&ArchivedSample>> = BTreeMap::new();
        for s in samples {
            partitions
                .entry(partition_dir(&s.sample)?)
                .or_default()
                .push(s);
        }
        let batches = partitions
            .into_iter()
            .map(|(dir, rows)| Ok((dir, record_batch_of(&rows)?)))
            .collect::<Result<Vec<_>>>()?;
        // Every file gets the archive's columns; new ones are appended, and stored before
        // any file uses them.
        let known = self.known_schema().await?;
        let pinned = self.pinned.lock().clone();
        let mut schema = known.clone();
        for (_, batch) in &batches {
            schema = Some(archive_schema::merge(
                schema.as_ref(),
                &batch.schema(),
                &pinned,
            )?);
        }
        let Some(schema) = schema else {
            return Ok(Vec::new());
        };
        // Integers made floats only if every one archived survives it; else the column
        // stays integers, and the rows bringing floats are refused (the archiver drops
        // them, see `keep_archivable`).
        for column in archive_schema::promoted(known.as_ref(), &schema) {
            if !archive_schema::exact_as_floats(&self.store, column).await? {
                self.pinned.lock().insert(column.to_owned());
                return Err(Error::Arrow {
                    column: column.to_owned(),
                    detail: "archived as integers past 2^53, which floats would round: the \
                             column stays int64"
                        .to_owned(),
                });
            }
        }
        // Files written with fewer columns are widened once this write's are stored.
        let grown = known.as_ref().is_some_and(|k| k != &schema);
        if known.as_ref() != Some(&schema) {
            if grown {
                self.unwidened.store(true, Ordering::Release);
                self.store
                    .put(archive_schema::WIDENING_FILE, Bytes::new())
                    .await?;
            }
            let bytes = archive_schema::encode(&self.store, &schema)?;
            self.store.put(archive_schema::SCHEMA_FILE, bytes).await?;
            *self.schema.lock() = Some(Some(Arc::clone(&schema)));
        }
        let mut written = Vec::with_capacity(batches.len());
        for (dir, batch) in batches {
            let bytes = self.encode(&dir, &[archive_schema::conform(&batch, &schema)?])?;
            let path = match number {
                Some(n) => format!("{dir}/part-{n:020}.parquet"),
                None => format!("{dir}/part-{:016x}.parquet", content_hash(&bytes)),
            };
            self.store.put(&path, bytes).await?;
            written.push(path);
        }
        // Also after a widening that failed, or one a crash interrupted.
        self.widen(&schema, &written).await?;
        Ok(written)
    }

    /// The rows of one archive file as a `RecordBatch`: the samples' columns without the
    /// partition keys, plus `read_by` and `reason`.
    ///
    /// # Errors
    ///
    /// [`Error::Arrow`] for a field or metadata key named `read_by` or `reason`, a field
    /// named like a partition key, or samples [`to_record_batch`] refuses.
    pub fn record_batch(rows: &[ArchivedSample]) -> Result<RecordBatch> {
        let refs: Vec<&ArchivedSample> = rows.iter().collect();
        record_batch_of(&refs)
    }

    /// Drops from `rows`, logging an error for each, the samples no write can archive
    /// beside the archive's rows and the rows kept before them: a reserved name, mistyped
    /// partition metadata, a field whose type differs from the one archived. What is kept
    /// then writes without an [`Error::Arrow`], so one such sample never holds back the
    /// ones consumed after it.
    pub(crate) fn keep_archivable(&self, rows: &mut Vec<ArchivedSample>) {
        let mut schema = self.schema.lock().clone().flatten();
        let pinned = self.pinned.lock().clone();
        rows.retain(|row| {
            let fits = partition_dir(&row.sample)
                .and_then(|_| record_batch_of(&[row]))
                .and_then(|batch| {
                    let grown = archive_schema::merge(schema.as_ref(), &batch.schema(), &pinned)?;
                    // An integer past 2^53 for a float column shows only here.
                    archive_schema::conform(&batch, &grown)?;
                    Ok(grown)
                });
            match fits {
                Ok(grown) => {
                    schema = Some(grown);
                    true
                }
                Err(why) => {
                    tracing::error!(id = %row.sample.id(), error = %why, "sample cannot be archived; dropped");
                    false
                }
            }
        });
    }

    /// One Parquet file of `batches` (of one schema; at least one), for `path`.
    fn encode(&self, path: &str, batches: &[RecordBatch]) -> Result<Bytes> {
        let bad = |e| storage_err(self.store.url(), path, e);
        let Some(first) = batches.first() else {
            return Err(storage_msg(
                self.store.url(),
                path,
                StorageKind::Other,
                "no rows to encode",
            ));
        };
        let mut buf = Vec::new();
        let props = bulky_columns_plain(self.props.clone(), first);
        let mut writer =
            ArrowWriter::try_new(&mut buf, first.schema(), Some(props)).map_err(bad)?;
        for batch in batches {
            writer.write(batch).map_err(bad)?;
        }
        writer.close().map_err(bad)?;
        Ok(Bytes::from(buf))
    }

    /// Reads the whole archive back (for recovery checks and tests; analysis tools read the
    /// files directly).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when listing or reading the store fails, and, naming its path,
    /// for the first file that does not decode as an archive file.
    pub async fn read_all(&self) -> Result<Vec<ArchivedSample>> {
        let mut out = Vec::new();
        for path in self.store.list("archive").await? {
            if path.ends_with(".parquet") {
                out.extend(self.read_file(&path).await?);
            }
        }
        Ok(out)
    }

    /// Reads one archive file (a path relative to the store); a file deleted since it was
    /// listed reads as empty.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when reading fails or, naming the path, when the file does not
    /// decode as an archive file.
    pub async fn read_file(&self, path: &str) -> Result<Vec<ArchivedSample>> {
        let Some(bytes) = self.store.get(path).await? else {
            return Ok(Vec::new());
        };
        let batches = self.read_batches(path, bytes)?;
        self.decode(path, batches)
    }

    /// The columns of the archive file at `path` (its bytes), from its footer alone.
    fn file_schema(&self, path: &str, bytes: &Bytes) -> Result<SchemaRef> {
        let bad =
            |e: &dyn std::fmt::Display| storage_msg(self.store.url(), path, StorageKind::Other, e);
        // As in `read_batches`: the footer is checked before the decoder reads it.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            super::spill::footer_metadata(bytes).map_err(|e| bad(&e))?;
            let builder =
                ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).map_err(|e| bad(&e))?;
            Ok(Arc::clone(builder.schema()))
        }))
        .unwrap_or_else(|_| Err(bad(&"the Parquet decoder failed on this file")))
    }

    /// The record batches of the archive file at `path` (its bytes).
    fn read_batches(&self, path: &str, bytes: Bytes) -> Result<Vec<RecordBatch>> {
        let bad =
            |e: &dyn std::fmt::Display| storage_msg(self.store.url(), path, StorageKind::Other, e);
        // The Parquet decoder is not panic-free on every malformed page; a bad file must
        // come back as an error naming it, not take the process down.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // The footer is checked before the reader decodes it, and the page headers
            // before it sizes buffers by them.
            super::spill::footer_metadata(&bytes).map_err(|e| bad(&e))?;
            let builder =
                ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).map_err(|e| bad(&e))?;
            for group in builder.metadata().row_groups() {
                for column in group.columns() {
                    super::spill::check_chunk_pages(column, &bytes).map_err(|e| bad(&e))?;
                }
            }
            let reader = builder.build().map_err(|e| bad(&e))?;
            reader
                .map(|batch| batch.map_err(|e| bad(&e)))
                .collect::<Result<Vec<_>>>()
        }))
        .unwrap_or_else(|_| Err(bad(&"the Parquet decoder failed on this file")))
    }

    fn decode(&self, path: &str, batches: Vec<RecordBatch>) -> Result<Vec<ArchivedSample>> {
        let bad =
            |e: &dyn std::fmt::Display| storage_msg(self.store.url(), path, StorageKind::Other, e);
        let (environment, version) = partition_values(path);
        let mut out = Vec::new();
        for batch in batches {
            let read_by =
                string_lists(&batch, "read_by").ok_or_else(|| bad(&"no read_by column"))?;
            let reasons =
                string_column(&batch, "reason").ok_or_else(|| bad(&"no reason column"))?;
            for ((mut sample, read_by), reason) in from_record_batch(&batch)
                .map_err(|e| bad(&e))?
                .into_iter()
                .zip(read_by)
                .zip(reasons)
            {
                if let Some(env) = &environment {
                    sample
                        .meta_mut()
                        .insert(ENVIRONMENT.into(), MetaValue::Str(env.clone()));
                }
                if let Some(v) = version {
                    sample
                        .meta_mut()
                        .insert(POLICY_VERSION.into(), MetaValue::Int(v));
                }
                let reason = ExitReason::from_name(&reason)
                    .ok_or_else(|| bad(&format!("unknown reason `{reason}`")))?;
                out.push(ArchivedSample {
                    sample,
                    read_by,
                    reason,
                });
            }
        }
        Ok(out)
    }
}

/// `archive/environment=<e>/policy_version=<v>` for a sample. Partition metadata of another
/// type is an error rather than a silent null partition.
fn partition_dir(s: &Sample) -> Result<String> {
    let wrong = |key: &str, want: &str| Error::Arrow {
        column: key.to_owned(),
        detail: format!("sample `{}`: partition metadata must be {want}", s.id()),
    };
    let environment = match s.get_meta(ENVIRONMENT) {
        Some(MetaValue::Str(e)) => encode_segment(e),
        Some(_) => return Err(wrong(ENVIRONMENT, "a string")),
        None => NULL_PARTITION.to_owned(),
    };
    let version = match s.get_meta(POLICY_VERSION) {
        Some(MetaValue::Int(v)) => v.to_string(),
        Some(_) => return Err(wrong(POLICY_VERSION, "an integer")),
        None => NULL_PARTITION.to_owned(),
    };
    Ok(format!(
        "archive/{ENVIRONMENT}={environment}/{POLICY_VERSION}={version}"
    ))
}

/// The rows of one file (see [`ArchiveWriter::record_batch`]).
fn record_batch_of(rows: &[&ArchivedSample]) -> Result<RecordBatch> {
    for r in rows {
        let s = &r.sample;
        for name in s.keys().chain(s.metadata().keys().map(String::as_str)) {
            let partition_field =
                s.get(name).is_some() && (name == ENVIRONMENT || name == POLICY_VERSION);
            if name == "read_by" || name == "reason" || partition_field {
                return Err(Error::Arrow {
                    column: name.to_owned(),
                    detail: format!("sample `{}`: the archive reserves this name", s.id()),
                });
            }
        }
    }
    let samples: Vec<Sample> = rows
        .iter()
        .map(|r| without_partition_keys(&r.sample))
        .collect();
    let batch = to_record_batch(&samples)?;
    with_archive_columns(batch, rows).map_err(|e| Error::Arrow {
        column: "read_by".to_owned(),
        detail: e.to_string(),
    })
}

/// The partition values in a file's path, `None` for the null partition.
fn partition_values(path: &str) -> (Option<String>, Option<i64>) {
    let mut environment = None;
    let mut version = None;
    for segment in path.split('/') {
        if let Some(v) = segment.strip_prefix("environment=") {
            environment = (v != NULL_PARTITION).then(|| percent_decode(v));
        } else if let Some(v) = segment.strip_prefix("policy_version=") {
            version = v.parse().ok();
        }
    }
    (environment, version)
}

/// Percent-encodes everything but `[A-Za-z0-9._-]`, as hive readers decode partition
/// values; a value spelled like the null marker gets its underscores encoded, so it reads
/// back as itself and not as null.
fn encode_segment(s: &str) -> String {
    let keep_underscore = s != NULL_PARTITION;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-') || (b == b'_' && keep_underscore) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// FNV-1a over the encoded file, eight bytes per step: a fixed algorithm, so the same
/// rows give the same name in every process and toolchain (a retried write replaces
/// itself), and different rows never take another file's name (ids that recur across runs
/// do not overwrite older files). Also the checksum of checkpoint segments.
pub(crate) fn content_hash(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut words = bytes.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(a)).wrapping_mul(PRIME);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    h ^ (bytes.len() as u64)
}

fn without_partition_keys(s: &Sample) -> Sample {
    let mut s = s.clone();
    if s.get_meta(ENVIRONMENT).is_some() || s.get_meta(POLICY_VERSION).is_some() {
        let meta = s.meta_mut();
        meta.remove(ENVIRONMENT);
        meta.remove(POLICY_VERSION);
    }
    s
}

fn with_archive_columns(
    batch: RecordBatch,
    rows: &[&ArchivedSample],
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let role = [(crate::arrow::ROLE, ARCHIVE_ROLE.to_string())];
    let item = Arc::new(Field::new_list_field(DataType::Utf8, false));
    let names: StringArray = rows
        .iter()
        .flat_map(|r| r.read_by.iter().map(|s| Some(s.as_str())))
        .collect();
    let read_by = ListArray::try_new(
        Arc::clone(&item),
        OffsetBuffer::from_lengths(rows.iter().map(|r| r.read_by.len())),
        Arc::new(names),
        None,
    )?;
    let reasons: StringArray = rows.iter().map(|r| Some(r.reason.as_str())).collect();
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("read_by", DataType::List(item), false).with_metadata(role.clone()));
    fields.push(Field::new("reason", DataType::Utf8, false).with_metadata(role));
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(read_by));
    columns.push(Arc::new(reasons));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

fn string_column(batch: &RecordBatch, name: &str) -> Option<Vec<String>> {
    use arrow_array::cast::AsArray;
    use arrow_array::Array;
    let a = batch.column_by_name(name)?.as_string_opt::<i32>()?;
    Some((0..a.len()).map(|i| a.value(i).to_owned()).collect())
}

fn string_lists(batch: &RecordBatch, name: &str) -> Option<Vec<Vec<String>>> {
    use arrow_array::cast::AsArray;
    use arrow_array::Array;
    let list = batch.column_by_name(name)?.as_list_opt::<i32>()?;
    let values = list.values().as_string_opt::<i32>()?;
    let offsets = list.value_offsets();
    (0..list.len())
        .map(|i| {
            let lo = usize::try_from(*offsets.get(i)?).ok()?;
            let hi = usize::try_from(*offsets.get(i + 1)?).ok()?;
            Some((lo..hi).map(|j| values.value(j).to_owned()).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests;
