//! `ParquetSpill`: spill segments as Parquet files on a [`Store`] (the buffer's
//! `SpillStore`).
//!
//! A segment is `spill/<id>.parquet`, one row per spilled sample and one binary column
//! per field name (the tensor in the crate's encoding, null where the sample lacks the
//! field). Columns are zstd-compressed, except those a sample shows zstd cannot shrink,
//! which are stored plain. Row groups are small (about 2 MiB), so a read fetches only
//! the column chunks of the RPC's input fields in the row groups holding the rows asked
//! for: ranged GETs, never the whole file; each row group is decoded in a task of its own. The footer of every segment written here is
//! kept in memory, so a read costs no footer round trip; a segment written by an earlier
//! process has its footer fetched on first use.

use super::codec::{put_tensor, take_tensor, Reader, Writer};
use super::spill_value::{put_tensor_padded, take_tensor_padded};
use super::store::{corrupt, storage_err, Store};
use crate::buffer::{Segment, SpillFuture, SpillStore};
use crate::error::{Error, Result};
use crate::sample::{FieldKey, Fields};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use crate::tensor::{SharedBytes, Tensor};
use arrow_array::{Array, ArrayRef, BinaryViewArray, LargeBinaryArray, RecordBatch};
use arrow_schema::{Field, Schema};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, TryStreamExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection, RowSelector};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{ArrowWriter, ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;

/// The folder of spill segments inside a store.
pub(crate) const SPILL_DIR: &str = "spill";

/// Target size of a row group: a read fetches whole row groups of the columns it needs,
/// so a read of one row costs a group; each column chunk a read decodes costs a codec
/// set-up (two zstd contexts, tens of µs), which larger groups amortise. With 64 KiB
/// samples a `Fifo` reader ran as fast with 1, 2 and 4 MiB groups once loads stopped
/// copying (`examples/spill_fifo.rs`); 2 MiB keeps set-ups under 1 µs per sample.
const ROW_GROUP_BYTES: u64 = 2 << 20;

/// zstd level of spill segments. Negative levels skip entropy coding of literals: token
/// ids and logprobs then decode at about memcpy speed (as fast as uncompressed pages,
/// measured), where level 1 decodes three times slower for a further 1.4x in size. A
/// spill segment is read back soon and once, so decode speed matters more than size.
const ZSTD_LEVEL: i32 = -1;

/// Spill segments as Parquet files under `spill/` of a store.
#[derive(Debug)]
pub(crate) struct ParquetSpill {
    store: Store,
    next: AtomicU64,
    footers: Arc<Mutex<HashMap<u64, Arc<ParquetMetaData>>>>,
    /// A directory this store owns and removes when dropped.
    temporary: Option<PathBuf>,
}

impl ParquetSpill {
    /// Segments under `spill/` of `store`. Segment ids start from the clock, so a
    /// restarted process does not reuse the names of files an earlier one left.
    pub(crate) fn new(store: Store) -> Self {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        Self {
            store,
            next: AtomicU64::new(start),
            footers: Arc::default(),
            temporary: None,
        }
    }

    /// Segments in a new directory under the system's temporary directory, removed when
    /// the store is dropped (with the buffer).
    pub(crate) fn temporary() -> Result<Self> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("rollout-buffer-spill-{}-{n}", std::process::id()));
        let url = dir.to_string_lossy().into_owned();
        let mut spill = Self::new(Store::open(&url)?);
        spill.temporary = Some(dir);
        Ok(spill)
    }

    /// Deletes the spill segments no recovered sample needs (`keep`: the ids of those it
    /// does): written but never logged as holding anything, or left by a rewrite or a free
    /// whose delete did not happen before a crash.
    pub(crate) async fn clear_orphans(
        store: &Store,
        keep: &std::collections::BTreeSet<u64>,
    ) -> Result<usize> {
        let mut deleted = 0;
        for path in store.list(SPILL_DIR).await? {
            let id = path
                .strip_prefix(SPILL_DIR)
                .and_then(|p| p.strip_prefix('/'))
                .and_then(|p| p.strip_suffix(".parquet"))
                .and_then(|p| p.parse::<u64>().ok());
            if id.is_some_and(|id| keep.contains(&id)) {
                continue;
            }
            store.delete(&path).await?;
            deleted += 1;
        }
        Ok(deleted)
    }
}

impl Drop for ParquetSpill {
    fn drop(&mut self) {
        if let Some(dir) = &self.temporary {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                tracing::warn!(error = %e, dir = %dir.display(), "spill directory not removed");
            }
        }
    }
}

fn segment_path(id: u64) -> String {
    format!("{SPILL_DIR}/{id:020}.parquet")
}

impl SpillStore for ParquetSpill {
    fn write(&self, rows: Vec<Fields>) -> SpillFuture<Arc<Segment>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let path = segment_path(id);
        let store = self.store.clone();
        let footers = Arc::clone(&self.footers);
        Box::pin(async move {
            let n = rows.len() as u32;
            let encode_path = path.clone();
            let url = store.url().to_owned();
            let encoded = tokio::task::spawn_blocking(move || encode(&rows))
                .await
                .map_err(|e| storage_err(&url, &encode_path, e))?
                .map_err(|e| storage_err(&url, &encode_path, e))?;
            let (bytes, footer) = encoded;
            store.put(&path, bytes).await?;
            footers.lock().insert(id, Arc::new(footer));
            Ok(Arc::new(Segment { id, path, rows: n }))
        })
    }

    fn read(
        &self,
        segment: Arc<Segment>,
        rows: Vec<u32>,
        keys: Vec<FieldKey>,
    ) -> SpillFuture<Vec<Fields>> {
        let store = self.store.clone();
        let footer = self.footers.lock().get(&segment.id).cloned();
        let footers = Arc::clone(&self.footers);
        Box::pin(async move {
            let footer = match footer {
                Some(f) => f,
                None => {
                    let f = fetch_footer(&store, &segment.path).await?;
                    footers.lock().insert(segment.id, Arc::clone(&f));
                    f
                }
            };
            read_rows(&store, &segment.path, footer, &rows, &keys).await
        })
    }

    fn segment(&self, id: u64, rows: u32) -> Arc<Segment> {
        Arc::new(Segment {
            id,
            path: segment_path(id),
            rows,
        })
    }

    fn delete(&self, segment: Arc<Segment>) -> SpillFuture<()> {
        self.footers.lock().remove(&segment.id);
        let store = self.store.clone();
        Box::pin(async move { store.delete(&segment.path).await })
    }
}

/// Encodes `rows` as one Parquet file; returns its bytes and footer.
fn encode(rows: &[Fields]) -> std::result::Result<(Bytes, ParquetMetaData), String> {
    let mut keys: Vec<FieldKey> = Vec::new();
    let mut total = 0u64;
    for row in rows {
        for (k, t) in row.iter() {
            total += t.nbytes() as u64;
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(keys.len());
    // Columns stored uncompressed.
    let mut plain: Vec<FieldKey> = Vec::new();
    let mut w = Writer::default();
    for key in &keys {
        // A view column reads back without copying its values out of the decoded pages
        // (parquet's view decoder points into them), and its padded values let loads
        // view the arrays in place (`spill_value`). A view holds at most 4 GiB, so a
        // column with a larger value is large binary, in the plain tensor encoding.
        let encode_column = |padded: bool, w: &mut Writer| -> Vec<Option<Vec<u8>>> {
            rows.iter()
                .map(|row| {
                    row.get(key).map(|t| {
                        w.buf.clear();
                        if padded {
                            put_tensor_padded(w, t);
                        } else {
                            put_tensor(w, t);
                        }
                        w.buf.clone()
                    })
                })
                .collect()
        };
        let mut values = encode_column(true, &mut w);
        let fits_views = values
            .iter()
            .flatten()
            .all(|v| u32::try_from(v.len()).is_ok());
        if !fits_views {
            values = encode_column(false, &mut w);
        }
        if !compresses(&values) {
            plain.push(key.clone());
        }
        columns.push(if fits_views {
            Arc::new(BinaryViewArray::from_iter(values))
        } else {
            Arc::new(LargeBinaryArray::from_iter(values))
        });
    }
    // A column is nullable only if a row lacks the field: a page of a required column
    // holds no level data before the values, which keeps them where the padding expects.
    let fields: Vec<Field> = keys
        .iter()
        .zip(&columns)
        .map(|(k, c)| Field::new(k.as_str(), c.data_type().clone(), c.null_count() > 0))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = if keys.is_empty() {
        RecordBatch::try_new_with_options(
            Arc::clone(&schema),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows.len())),
        )
    } else {
        RecordBatch::try_new(Arc::clone(&schema), columns)
    }
    .map_err(|e| e.to_string())?;
    let per_row = (total / rows.len().max(1) as u64).max(1);
    let group_rows = (ROW_GROUP_BYTES / per_row).clamp(1, 1024) as usize;
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(ZSTD_LEVEL).unwrap_or_default(),
        ))
        .set_max_row_group_row_count(Some(group_rows))
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None);
    for key in plain {
        props =
            props.set_column_compression(ColumnPath::from(key.as_str()), Compression::UNCOMPRESSED);
    }
    let props = props.build();
    let mut writer =
        ArrowWriter::try_new(Vec::new(), schema, Some(props)).map_err(|e| e.to_string())?;
    writer.write(&batch).map_err(|e| e.to_string())?;
    let bytes = Bytes::from(writer.into_inner().map_err(|e| e.to_string())?);
    let footer = ParquetMetaDataReader::new()
        .parse_and_finish(&bytes)
        .map_err(|e| e.to_string())?;
    Ok((bytes, footer))
}

/// How much of a column [`compresses`] tries.
const COMPRESSION_SAMPLE_BYTES: usize = 256 << 10;

/// Whether zstd shrinks a column's values by at least an eighth, judged on the first
/// [`COMPRESSION_SAMPLE_BYTES`] of them. A column it cannot shrink (token ids or logprobs
/// with high-entropy bytes) is stored plain: zstd would store it as raw blocks anyway,
/// and a read would then copy every value out of them, where the values of a plain page
/// are viewed in place.
fn compresses(values: &[Option<Vec<u8>>]) -> bool {
    let mut sample = Vec::with_capacity(COMPRESSION_SAMPLE_BYTES);
    for value in values.iter().flatten() {
        if sample.len() >= COMPRESSION_SAMPLE_BYTES {
            break;
        }
        let take = value.len().min(COMPRESSION_SAMPLE_BYTES - sample.len());
        sample.extend_from_slice(&value[..take]);
    }
    if sample.is_empty() {
        return false;
    }
    match zstd::bulk::compress(&sample, ZSTD_LEVEL) {
        Ok(packed) => packed.len() * 8 <= sample.len() * 7,
        // The codec failing on a sample says nothing about the column: compress it.
        Err(_) => true,
    }
}

/// The footer of a segment this process did not write.
async fn fetch_footer(store: &Store, path: &str) -> Result<Arc<ParquetMetaData>> {
    let bytes = store.get(path).await?.ok_or_else(|| Error::Storage {
        url: store.url().to_owned(),
        path: path.to_owned(),
        detail: "spill segment not found".into(),
    })?;
    ParquetMetaDataReader::new()
        .parse_and_finish(&bytes)
        .map(Arc::new)
        .map_err(|e| corrupt(store, path, e))
}

/// Ranged reads of one segment, with its footer at hand and the column chunks a read
/// needs fetched up front.
#[derive(Clone)]
struct SegmentReader {
    store: Store,
    path: String,
    footer: Arc<ParquetMetaData>,
    /// Byte ranges fetched before decoding, with their bytes (shared by the row groups'
    /// decodes).
    prefetched: Arc<[(Range<u64>, Bytes)]>,
}

impl SegmentReader {
    /// The bytes of `range` if a prefetched range holds them (a slice of it, no copy).
    fn prefetched(&self, range: &Range<u64>) -> Option<Bytes> {
        self.prefetched.iter().find_map(|(have, bytes)| {
            if have.start <= range.start && range.end <= have.end {
                let from = usize::try_from(range.start - have.start).ok()?;
                let to = usize::try_from(range.end - have.start).ok()?;
                bytes.get(from..to).map(|_| bytes.slice(from..to))
            } else {
                None
            }
        })
    }

    async fn fetch(&self, ranges: Vec<Range<u64>>) -> parquet::errors::Result<Vec<Bytes>> {
        let mut out: Vec<Option<Bytes>> = ranges.iter().map(|r| self.prefetched(r)).collect();
        let missing: Vec<Range<u64>> = ranges
            .iter()
            .zip(&out)
            .filter(|(_, got)| got.is_none())
            .map(|(r, _)| r.clone())
            .collect();
        if !missing.is_empty() {
            let mut fetched = self
                .store
                .get_ranges(&self.path, &missing)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?
                .into_iter();
            for slot in out.iter_mut().filter(|got| got.is_none()) {
                *slot = fetched.next();
            }
        }
        out.into_iter()
            .map(|b| b.ok_or_else(|| parquet::errors::ParquetError::EOF("short range read".into())))
            .collect()
    }
}

impl AsyncFileReader for SegmentReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let mut got = self.fetch(vec![range]).await?;
            got.pop()
                .ok_or_else(|| parquet::errors::ParquetError::EOF("empty range read".into()))
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move { self.fetch(ranges).await }.boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a parquet::arrow::arrow_reader::ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        let footer = Arc::clone(&self.footer);
        async move { Ok(footer) }.boxed()
    }
}

/// Reads fields `keys` of `rows` (any order, no duplicates needed) of the segment at
/// `path`; returns one `Fields` per entry of `rows`, in that order.
///
/// The column chunks are fetched in one request, then each row group is decoded in a task
/// of its own (on the runtime, when there is one): decoding is CPU work, and a trainer
/// waiting for a batch leaves a core to it.
async fn read_rows(
    store: &Store,
    path: &str,
    footer: Arc<ParquetMetaData>,
    rows: &[u32],
    keys: &[FieldKey],
) -> Result<Vec<Fields>> {
    let bad = |e: &dyn std::fmt::Display| corrupt(store, path, e);
    let meta = ArrowReaderMetadata::try_new(Arc::clone(&footer), Default::default())
        .map_err(|e| bad(&e))?;
    let schema = Arc::clone(meta.schema());
    let columns: Arc<[(usize, FieldKey)]> = keys
        .iter()
        .filter_map(|k| Some((schema.index_of(k.as_str()).ok()?, k.clone())))
        .collect();
    let mut wanted: Vec<u32> = rows.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    let groups = group_reads(&footer, &wanted).map_err(|e| bad(&e))?;
    let mut by_row: HashMap<u32, Fields> = HashMap::with_capacity(wanted.len());
    if !columns.is_empty() && !wanted.is_empty() {
        let mask = ProjectionMask::roots(meta.parquet_schema(), columns.iter().map(|(i, _)| *i));
        // Every column chunk the read decodes, fetched in one request (contiguous chunks
        // become one read): the decoder would otherwise fetch row group by row group, a
        // round trip (and on local disk a thread hand-off) each.
        let roots: Vec<usize> = columns.iter().map(|(i, _)| *i).collect();
        let indexes: Vec<usize> = groups.iter().map(|g| g.index).collect();
        let ranges = chunk_ranges(&footer, &indexes, &roots).map_err(|e| bad(&e))?;
        let bytes = store.get_ranges(path, &ranges).await?;
        let reader = SegmentReader {
            store: store.clone(),
            path: path.to_owned(),
            footer,
            prefetched: ranges.into_iter().zip(bytes).collect::<Vec<_>>().into(),
        };
        // One group decodes in place: a task would only add a hand-off.
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|_| groups.len() > 1);
        let mut decodes = Vec::with_capacity(groups.len());
        for group in groups {
            let decode = decode_group(
                reader.clone(),
                meta.clone(),
                mask.clone(),
                Arc::clone(&columns),
                group,
            );
            decodes.push(match &runtime {
                Some(runtime) => Decode::Spawned(runtime.spawn(decode)),
                None => Decode::Inline(Box::pin(decode)),
            });
        }
        for decode in decodes {
            let decoded = match decode {
                Decode::Spawned(task) => task
                    .await
                    .unwrap_or_else(|e| Err(bad(&format!("decode task ended: {e}")))),
                Decode::Inline(decode) => decode.await,
            }?;
            by_row.extend(decoded);
        }
        if by_row.len() != wanted.len() {
            return Err(bad(&format!(
                "{} rows read, {} asked for",
                by_row.len(),
                wanted.len()
            )));
        }
    }
    Ok(rows
        .iter()
        .map(|r| by_row.get(r).cloned().unwrap_or_default())
        .collect())
}

/// The rows a read wants from one row group.
struct GroupRead {
    /// The row group's index in the segment.
    index: usize,
    /// The rows wanted, ascending, as row numbers of the segment.
    rows: Vec<u32>,
    /// The same rows as a selection inside the row group.
    selection: Vec<RowSelector>,
}

/// Splits `wanted` (ascending, no duplicates) by the row groups of `footer` holding them.
fn group_reads(
    footer: &ParquetMetaData,
    wanted: &[u32],
) -> std::result::Result<Vec<GroupRead>, String> {
    let mut groups = Vec::new();
    let mut start = 0u64;
    let mut next = wanted.iter().peekable();
    for (index, rg) in footer.row_groups().iter().enumerate() {
        let end = start + rg.num_rows().max(0) as u64;
        let mut at = start;
        let mut group: Option<GroupRead> = None;
        while let Some(&&row) = next.peek() {
            if u64::from(row) >= end {
                break;
            }
            let g = group.get_or_insert_with(|| GroupRead {
                index,
                rows: Vec::new(),
                selection: Vec::new(),
            });
            if u64::from(row) > at {
                g.selection
                    .push(RowSelector::skip((u64::from(row) - at) as usize));
            }
            g.selection.push(RowSelector::select(1));
            g.rows.push(row);
            at = u64::from(row) + 1;
            next.next();
        }
        if let Some(mut g) = group {
            if at < end {
                g.selection.push(RowSelector::skip((end - at) as usize));
            }
            groups.push(g);
        }
        start = end;
    }
    match next.next() {
        Some(row) => Err(format!(
            "row {row} asked for, but the segment has {start} rows"
        )),
        None => Ok(groups),
    }
}

/// A row group's decode: in a task of its own, or awaited in place.
enum Decode {
    Spawned(tokio::task::JoinHandle<Result<Vec<(u32, Fields)>>>),
    Inline(BoxFuture<'static, Result<Vec<(u32, Fields)>>>),
}

/// Decodes `columns` of `group`'s rows from `reader`'s prefetched chunks.
async fn decode_group(
    reader: SegmentReader,
    meta: ArrowReaderMetadata,
    mask: ProjectionMask,
    columns: Arc<[(usize, FieldKey)]>,
    group: GroupRead,
) -> Result<Vec<(u32, Fields)>> {
    let store = reader.store.clone();
    let path = reader.path.clone();
    let bad = |e: &dyn std::fmt::Display| corrupt(&store, &path, e);
    let batches: Vec<RecordBatch> =
        ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta)
            .with_projection(mask)
            .with_row_groups(vec![group.index])
            .with_row_selection(RowSelection::from(group.selection))
            .with_batch_size(group.rows.len())
            .build()
            .map_err(|e| bad(&e))?
            .try_collect()
            .await
            .map_err(|e| match e {
                parquet::errors::ParquetError::External(inner) => match inner.downcast::<Error>() {
                    Ok(err) => *err,
                    Err(other) => bad(&other),
                },
                other => bad(&other),
            })?;
    let mut out = Vec::with_capacity(group.rows.len());
    let mut rows_in_order = group.rows.iter();
    for batch in &batches {
        let decoded: Vec<(BinaryColumn<'_>, &FieldKey)> = columns
            .iter()
            .filter_map(|(_, k)| Some((BinaryColumn::of(batch.column_by_name(k.as_str())?)?, k)))
            .collect();
        for i in 0..batch.num_rows() {
            let Some(&row) = rows_in_order.next() else {
                return Err(bad(&"more rows read than asked for"));
            };
            let mut fields = Fields::default();
            for (col, key) in &decoded {
                let Some(tensor) = col.tensor(i) else {
                    continue;
                };
                let tensor = tensor.map_err(|e| bad(&format!("row {row}, field `{key}`: {e}")))?;
                fields.set((*key).clone(), tensor);
            }
            out.push((row, fields));
        }
    }
    Ok(out)
}

/// The byte ranges of the column chunks of root columns `roots` in row groups `groups`.
fn chunk_ranges(
    footer: &ParquetMetaData,
    groups: &[usize],
    roots: &[usize],
) -> std::result::Result<Vec<Range<u64>>, String> {
    let schema = footer.file_metadata().schema_descr();
    let mut ranges = Vec::new();
    for &g in groups {
        let rg = footer
            .row_groups()
            .get(g)
            .ok_or_else(|| format!("no row group {g}"))?;
        for (leaf, chunk) in rg.columns().iter().enumerate() {
            if leaf >= schema.num_columns() {
                return Err(format!("row group {g} has more columns than the schema"));
            }
            if !roots.contains(&schema.get_column_root_idx(leaf)) {
                continue;
            }
            let start = chunk
                .dictionary_page_offset()
                .unwrap_or_else(|| chunk.data_page_offset());
            let (Ok(start), Ok(len)) =
                (u64::try_from(start), u64::try_from(chunk.compressed_size()))
            else {
                return Err(format!(
                    "row group {g}, column {leaf}: negative offset or size"
                ));
            };
            ranges.push(start..start.saturating_add(len));
        }
    }
    Ok(ranges)
}

/// A segment column: binary views of padded values, or large binary in the plain tensor
/// encoding (values over 4 GiB, and segments written before views).
enum BinaryColumn<'a> {
    View {
        column: &'a BinaryViewArray,
        /// The column's data buffers (decoded pages), shared by the tensors viewing them.
        pages: Vec<SharedBytes>,
    },
    Large(&'a LargeBinaryArray),
}

/// A decoded page as bytes a tensor can view.
struct Page(arrow_buffer::Buffer);

impl AsRef<[u8]> for Page {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl<'a> BinaryColumn<'a> {
    fn of(column: &'a ArrayRef) -> Option<Self> {
        let any = column.as_any();
        match any.downcast_ref::<BinaryViewArray>() {
            Some(column) => Some(Self::View {
                column,
                pages: column
                    .data_buffers()
                    .iter()
                    .map(|b| Arc::new(Page(b.clone())) as SharedBytes)
                    .collect(),
            }),
            None => any.downcast_ref::<LargeBinaryArray>().map(Self::Large),
        }
    }

    /// Row `i`'s tensor, `None` where the sample lacks the field.
    fn tensor(&self, i: usize) -> Option<std::result::Result<Tensor, String>> {
        match self {
            Self::View { column, pages } => {
                if column.is_null(i) {
                    return None;
                }
                let value = column.value(i);
                // Which page holds the value, and where: the tensor can then view it.
                let at = value.as_ptr() as usize;
                let page = pages.iter().find_map(|p| {
                    let bytes = (**p).as_ref();
                    let start = at.checked_sub(bytes.as_ptr() as usize)?;
                    (start + value.len() <= bytes.len()).then_some((p, start))
                });
                Some(take_tensor_padded(value, page))
            }
            Self::Large(c) => (!c.is_null(i)).then(|| take_tensor(&mut Reader::new(c.value(i)))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: i32) -> Fields {
        let mut f = Fields::default();
        // 64 KiB: a segment of 40 rows spans two row groups.
        f.set(FieldKey::from("tokens"), Tensor::from(vec![i; 16 << 10]));
        if i % 2 == 0 {
            f.set(
                FieldKey::from("logp"),
                Tensor::from(vec![-0.5f32 * i as f32; 300]),
            );
        }
        f
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    }

    /// Rows read back equal the rows written, in the order asked for, with only the
    /// fields asked for; a row without a field reads back without it.
    #[test]
    fn rows_read_back_as_written() {
        runtime().block_on(async {
            let spill = ParquetSpill::new(Store::open("memory://").expect("store"));
            let rows: Vec<Fields> = (0..40).map(row).collect();
            let segment = spill.write(rows.clone()).await.expect("write");
            let groups = spill
                .footers
                .lock()
                .get(&segment.id)
                .map(|f| f.num_row_groups());
            assert_eq!(groups, Some(2));
            let keys = vec![FieldKey::from("tokens"), FieldKey::from("logp")];
            let got = spill
                .read(Arc::clone(&segment), vec![33, 2, 17], keys)
                .await
                .expect("read");
            assert_eq!(got, vec![row(33), row(2), row(17)]);
            // Every row has `tokens`: its arrays are views of the decoded pages.
            let viewed = got
                .iter()
                .filter(|f| format!("{:?}", f.get("tokens")).contains("Borrowed"))
                .count();
            assert_eq!(viewed, if cfg!(target_endian = "little") { 3 } else { 0 });
            let tokens_only = spill
                .read(segment, vec![4], vec![FieldKey::from("tokens")])
                .await
                .expect("read");
            assert_eq!(tokens_only[0].len(), 1);
            assert_eq!(tokens_only[0].get("tokens"), row(4).get("tokens"));
        });
    }

    /// A column zstd cannot shrink is stored plain, one it can is compressed; both read
    /// back as written.
    #[test]
    fn incompressible_columns_are_stored_plain() {
        runtime().block_on(async {
            let spill = ParquetSpill::new(Store::open("memory://").expect("store"));
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let rows: Vec<Fields> = (0..8)
                .map(|i| {
                    let noise: Vec<i64> = (0..4096)
                        .map(|_| {
                            // xorshift64: bytes zstd cannot predict.
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            state as i64
                        })
                        .collect();
                    let mut f = Fields::default();
                    f.set(FieldKey::from("noise"), Tensor::from(noise));
                    f.set(FieldKey::from("flat"), Tensor::from(vec![i as f32; 4096]));
                    f
                })
                .collect();
            let segment = spill.write(rows.clone()).await.expect("write");
            let footer = spill.footers.lock().get(&segment.id).cloned().expect("footer");
            let codecs: Vec<(String, Compression)> = footer.row_groups()[0]
                .columns()
                .iter()
                .map(|c| (c.column_path().string(), c.compression()))
                .collect();
            assert!(codecs.contains(&("noise".to_owned(), Compression::UNCOMPRESSED)));
            assert!(codecs
                .iter()
                .any(|(k, c)| k == "flat" && matches!(c, Compression::ZSTD(_))));
            let keys = vec![FieldKey::from("noise"), FieldKey::from("flat")];
            let got = spill
                .read(segment, vec![7, 0, 3], keys)
                .await
                .expect("read");
            assert_eq!(got, vec![rows[7].clone(), rows[0].clone(), rows[3].clone()]);
        });
    }

    /// Segments with large-binary columns (values over 4 GiB, and segments written before
    /// view columns) read back too.
    #[test]
    fn large_binary_segments_read_back() {
        runtime().block_on(async {
            let store = Store::open("memory://").expect("store");
            let rows: Vec<Fields> = (0..8).map(row).collect();
            let mut w = Writer::default();
            let column: LargeBinaryArray = rows
                .iter()
                .map(|r| {
                    r.get("tokens").map(|t| {
                        w.buf.clear();
                        put_tensor(&mut w, t);
                        w.buf.clone()
                    })
                })
                .collect();
            let schema = Arc::new(Schema::new(vec![Field::new(
                "tokens",
                arrow_schema::DataType::LargeBinary,
                true,
            )]));
            let batch =
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(column)]).expect("batch");
            let mut writer = ArrowWriter::try_new(Vec::new(), schema, None).expect("writer");
            writer.write(&batch).expect("write");
            let bytes = Bytes::from(writer.into_inner().expect("close"));
            store.put(&segment_path(7), bytes).await.expect("put");
            // A fresh spill store: the footer is fetched, as after a restart.
            let spill = ParquetSpill::new(store);
            let got = spill
                .read(
                    spill.segment(7, 8),
                    vec![5, 0],
                    vec![FieldKey::from("tokens")],
                )
                .await
                .expect("read");
            assert_eq!(got[0].get("tokens"), row(5).get("tokens"));
            assert_eq!(got[1].get("tokens"), row(0).get("tokens"));
        });
    }
}
