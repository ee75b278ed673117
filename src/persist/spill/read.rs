//! Reading rows back from spill segments: which row groups and column chunks a read
//! needs, one ranged fetch for all of them, a decode per row group, and tensors that view
//! the decoded pages where they can.
//!
//! Loads view their values in place only when each array starts 8-byte aligned in memory.
//! The padded values (`spill_value.rs`) see to that relative to the start of a page's
//! values. A compressed page is decompressed into a fresh (aligned) buffer; a plain page
//! is a slice of the fetched bytes, whose values the writer put 8-byte aligned in the file
//! (`spill_layout.rs`), so every fetch starts at an 8-byte boundary and keeps them so.

use super::checks::{check_footer, check_metadata, chunk_byte_range, metadata_range};
use super::layout::fetch_start;
use super::pages::{decode_chunk, ValueEncoding};
use super::value::take_tensor_padded;
use crate::error::{Error, Result, StorageKind};
use crate::persist::buffer_pool::BufferPool;
use crate::persist::codec::{take_tensor, Reader};
use crate::persist::store::{corrupt, corrupt_by, storage_msg, Store};
use crate::sample::{FieldKey, Fields};
use crate::sync::Arc;
use crate::tensor::{SharedBytes, Tensor};
use arrow_array::{Array, ArrayRef, BinaryViewArray, LargeBinaryArray, RecordBatch};
use arrow_schema::DataType;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, TryStreamExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection, RowSelector};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::FOOTER_SIZE;
use std::collections::HashMap;
use std::ops::Range;
use std::panic::AssertUnwindSafe;

/// How much of a segment's end a footer fetch reads first: the footer of a segment with a
/// few columns and row groups fits, so it takes one ranged read after the size.
const FOOTER_PREFETCH: usize = 64 << 10;

/// The footer of a segment this process did not write, read from the end of the file
/// (ranged reads: a recovered buffer's first load of a segment does not fetch all of
/// it), checked before it is decoded (see `thrift.rs`), with its Arrow schema.
pub(super) async fn fetch_footer(store: &Store, path: &str) -> Result<ArrowReaderMetadata> {
    let size = store.size(path).await?.ok_or_else(|| {
        storage_msg(
            store.url(),
            path,
            StorageKind::NotFound,
            "spill segment not found",
        )
    })?;
    let metadata = fetch_metadata(store, path, size).await?;
    check_metadata(&metadata).map_err(|e| corrupt(store, path, &e))?;
    let meta = ParquetMetaDataReader::decode_metadata(&metadata)
        .map_err(|e| corrupt_by(store, path, e))?;
    check_footer(&meta).map_err(|e| corrupt(store, path, &e))?;
    ArrowReaderMetadata::try_new(Arc::new(meta), Default::default())
        .map_err(|e| corrupt_by(store, path, e))
}

/// The footer metadata of the segment at `path` (`size` bytes): one ranged read of the
/// file's last [`FOOTER_PREFETCH`] bytes, and a second only for a longer footer.
pub(super) async fn fetch_metadata(store: &Store, path: &str, size: u64) -> Result<Bytes> {
    let prefetched = size - size.min(FOOTER_PREFETCH as u64);
    let tail = fetch_range(store, path, prefetched..size).await?;
    let last = tail.len().saturating_sub(FOOTER_SIZE);
    let range = metadata_range(size, &tail[last..]).map_err(|e| corrupt(store, path, &e))?;
    if range.start >= prefetched {
        let at = |offset: u64| (offset - prefetched) as usize;
        return Ok(tail.slice(at(range.start)..at(range.end)));
    }
    fetch_range(store, path, range).await
}

/// Bytes `range` of the segment at `path`; an error if the store answers with another
/// length (the file changed since its size was read), so no slice of it can fall outside.
async fn fetch_range(store: &Store, path: &str, range: Range<u64>) -> Result<Bytes> {
    let mut got = store.get_ranges(path, std::slice::from_ref(&range)).await?;
    let bytes = got
        .pop()
        .ok_or_else(|| corrupt(store, path, "empty range read"))?;
    if bytes.len() as u64 != range.end - range.start {
        return Err(corrupt(
            store,
            path,
            format!("{} bytes read for the range {range:?}", bytes.len()),
        ));
    }
    Ok(bytes)
}

/// The crate's error for a failed Parquet read: the storage error that caused it, or
/// the file is damaged.
fn read_error(store: &Store, path: &str, e: parquet::errors::ParquetError) -> Error {
    match e {
        parquet::errors::ParquetError::External(inner) => match inner.downcast::<Error>() {
            Ok(err) => *err,
            Err(other) => corrupt(store, path, other),
        },
        other => corrupt_by(store, path, other),
    }
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
/// `path` (footer and Arrow schema `meta`; decompressed pages go into buffers from
/// `pages`); returns one `Fields` per entry of `rows`, in that order.
///
/// The column chunks are fetched in one request, then decoded row group by row group.
pub(super) async fn read_rows(
    store: &Store,
    path: &str,
    meta: ArrowReaderMetadata,
    rows: &[u32],
    keys: &[FieldKey],
    pages: &Arc<BufferPool>,
) -> Result<Vec<Fields>> {
    let bad = |e: &dyn std::fmt::Display| corrupt(store, path, e);
    let footer = Arc::clone(meta.metadata());
    let schema = Arc::clone(meta.schema());
    // A key without a column comes back absent; the loader, which knows what each sample
    // spilled here, refuses a load missing one.
    let columns: Vec<(usize, FieldKey)> = keys
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
        // Row groups decode one after the other: decoding them in tasks of their own was
        // measured no faster (the hand-offs cost what the parallel decode saved, on two
        // cores with the trainer on one).
        for group in groups {
            let direct = decode_group_direct(&reader, &meta, &columns, &group, pages);
            let decoded = match direct {
                Some(Ok(decoded)) => decoded,
                None => {
                    decode_group(reader.clone(), meta.clone(), mask.clone(), &columns, group)
                        .await?
                }
                // Parquet's reader has the last word on a chunk the direct decoder finds
                // damaged: the two parsers agree on every file the crate writes, and a
                // rollout must not be lost to a disagreement.
                Some(Err(direct)) => {
                    tracing::warn!(path, error = %direct, "spill page decode failed; trying Parquet's reader");
                    decode_group(reader.clone(), meta.clone(), mask.clone(), &columns, group)
                        .await
                        .map_err(|e| bad(&format!("{direct}; Parquet's reader: {e}")))?
                }
            };
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
    /// The segment's row number of the row group's first row.
    first_row: u64,
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
                first_row: start,
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

/// Decodes `columns` of `group`'s rows from `reader`'s prefetched chunks without Parquet's
/// reader (`spill_pages.rs`); `None` if a chunk is not of the kind that reads that way.
fn decode_group_direct(
    reader: &SegmentReader,
    meta: &ArrowReaderMetadata,
    columns: &[(usize, FieldKey)],
    group: &GroupRead,
    pages: &Arc<BufferPool>,
) -> Option<std::result::Result<Vec<(u32, Fields)>, String>> {
    let footer = meta.metadata();
    let schema = footer.file_metadata().schema_descr();
    // A flat schema, where each field is one leaf column of the same index.
    if schema.num_columns() != meta.schema().fields().len() {
        return None;
    }
    let rg = footer.row_groups().get(group.index)?;
    let wanted: Vec<u64> = group
        .rows
        .iter()
        .map(|&r| u64::from(r).saturating_sub(group.first_row))
        .collect();
    let mut out: Vec<(u32, Fields)> = group.rows.iter().map(|&r| (r, Fields::default())).collect();
    for (index, key) in columns {
        let chunk = rg.columns().get(*index)?;
        let encoding = match meta.schema().field(*index).data_type() {
            DataType::BinaryView => ValueEncoding::Padded,
            DataType::LargeBinary => ValueEncoding::Plain,
            _ => return None,
        };
        let (start, len) = chunk_byte_range(chunk).ok()?;
        let bytes = reader.prefetched(&(start..start.saturating_add(len)))?;
        let tensors = match decode_chunk(chunk, &bytes, &wanted, encoding, pages)? {
            Ok(t) if t.len() == out.len() => t,
            Ok(t) => {
                return Some(Err(format!(
                    "row group {}, field `{key}`: {} rows decoded, {} asked for",
                    group.index,
                    t.len(),
                    out.len()
                )))
            }
            Err(e) => {
                return Some(Err(format!(
                    "row group {}, field `{key}`: {e}",
                    group.index
                )))
            }
        };
        for ((_, fields), tensor) in out.iter_mut().zip(tensors) {
            fields.set(key.clone(), tensor);
        }
    }
    Some(Ok(out))
}

/// Decodes `columns` of `group`'s rows from `reader`'s prefetched chunks.
async fn decode_group(
    reader: SegmentReader,
    meta: ArrowReaderMetadata,
    mask: ProjectionMask,
    columns: &[(usize, FieldKey)],
    group: GroupRead,
) -> Result<Vec<(u32, Fields)>> {
    let store = reader.store.clone();
    let path = reader.path.clone();
    let bad = |e: &dyn std::fmt::Display| corrupt(&store, &path, e);
    let rows = group.rows.len();
    let decode = async {
        ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta)
            .with_projection(mask)
            .with_row_groups(vec![group.index])
            .with_row_selection(RowSelection::from(group.selection))
            .with_batch_size(rows)
            .build()
            .map_err(|e| bad(&e))?
            .try_collect::<Vec<RecordBatch>>()
            .await
            .map_err(|e| read_error(&store, &path, e))
    };
    // The Parquet decoder is not panic-free on every malformed page (the footer is
    // checked first, the pages are not): a damaged segment must come back as an error
    // naming it, not take the loading task down.
    let batches = AssertUnwindSafe(decode)
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(bad(&"the Parquet decoder failed on this segment")))?;
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

/// The byte ranges to fetch for the column chunks of root columns `roots` in row groups
/// `groups`: each chunk, from the 8-byte boundary at or below its start (which keeps the
/// values of a plain chunk aligned in the fetched bytes).
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
            let (start, len) =
                chunk_byte_range(chunk).map_err(|e| format!("row group {g}: {e}"))?;
            ranges.push(fetch_start(start)..start.saturating_add(len));
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
