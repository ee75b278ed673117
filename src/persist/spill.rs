//! `ParquetSpill`: spill segments as Parquet files on a [`Store`] (the buffer's
//! `SpillStore`).
//!
//! A segment is `spill/<id>.parquet`, one row per spilled sample and one binary column
//! per field name (the tensor in the crate's encoding, null where the sample lacks the
//! field). Columns are zstd-compressed, except those a sample shows zstd cannot shrink,
//! which are stored plain. Row groups are small (about 2 MiB), so a read fetches only
//! the column chunks of the RPC's input fields in the row groups holding the rows asked
//! for: ranged GETs, never the whole file. The footer of every segment written here is
//! kept in memory, so a read costs no footer round trip; a segment written by an earlier
//! process has its footer fetched on first use.

use super::buffer_pool::BufferPool;
use super::codec::{put_tensor, Writer};
use super::spill_layout::align_plain_chunks;
use super::spill_read::{fetch_footer, read_rows};
use super::spill_value::put_tensor_padded;
use super::store::{storage_err, Store};
use crate::buffer::{Segment, SpillFuture, SpillStore};
use crate::error::Result;
use crate::sample::{FieldKey, Fields};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use arrow_array::{ArrayRef, BinaryViewArray, LargeBinaryArray, RecordBatch};
use arrow_schema::{Field, Schema};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::ParquetMetaDataReader;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use std::collections::HashMap;
use std::path::PathBuf;

/// The folder of spill segments inside a store.
pub(crate) const SPILL_DIR: &str = "spill";

/// Target size of a row group: a read fetches whole row groups of the columns it needs,
/// so a read of one row costs a group; each compressed column chunk a read decodes costs
/// a codec set-up (two zstd contexts, tens of µs), which larger groups amortise. With
/// 64 KiB samples a `Fifo` reader ran as fast with 1, 2 and 4 MiB groups
/// (`examples/spill_fifo.rs`); 2 MiB keeps set-ups under 1 µs per sample.
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
    /// The id the next segment gets (shared with writes in flight, which move it past
    /// the segments they find in the store).
    next: Arc<AtomicU64>,
    /// Per segment, its footer and the Arrow schema read from it.
    footers: Arc<Mutex<HashMap<u64, ArrowReaderMetadata>>>,
    /// A directory this store owns and removes when dropped.
    temporary: Option<PathBuf>,
    /// Buffers for decompressed pages, which loaded tensors view.
    pages: Arc<BufferPool>,
}

impl ParquetSpill {
    /// Segments under `spill/` of `store`. Segment ids start from the clock, so a
    /// restarted process does not reuse the names of files an earlier one left; a write
    /// never replaces an existing segment either way (see [`SpillStore::write`] here).
    pub(crate) fn new(store: Store) -> Self {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        Self {
            store,
            next: Arc::new(AtomicU64::new(start)),
            footers: Arc::default(),
            temporary: None,
            pages: Arc::default(),
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
            let id = segment_id(&path);
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

/// Highest id of a segment under `spill/` of `store` (0 if none).
async fn highest_segment(store: &Store) -> Result<u64> {
    Ok(store
        .list(SPILL_DIR)
        .await?
        .iter()
        .filter_map(|path| segment_id(path))
        .max()
        .unwrap_or(0))
}

/// The id in a segment's path (`spill/<id>.parquet`), if it is one.
fn segment_id(path: &str) -> Option<u64> {
    path.strip_prefix(SPILL_DIR)?
        .strip_prefix('/')?
        .strip_suffix(".parquet")?
        .parse()
        .ok()
}

/// Writes a segment tries before giving up when every id it takes is already in the
/// store (another process writing segments into the same folder).
const WRITE_ATTEMPTS: usize = 3;

impl SpillStore for ParquetSpill {
    /// Writes a new segment, never replacing one: the object is created only if its name
    /// is free. A taken name (ids come from the clock, and a process resumed on a machine
    /// whose clock is behind the last one's would take names of segments live samples
    /// need) moves the ids past every segment in the store, and the write tries again.
    fn write(&self, rows: Vec<Fields>) -> SpillFuture<Arc<Segment>> {
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let next = Arc::clone(&self.next);
        let store = self.store.clone();
        let footers = Arc::clone(&self.footers);
        Box::pin(async move {
            let n = rows.len() as u32;
            let encode_path = segment_path(first);
            let url = store.url().to_owned();
            let encoded = tokio::task::spawn_blocking(move || encode(&rows))
                .await
                .map_err(|e| storage_err(&url, &encode_path, e))?
                .map_err(|e| storage_err(&url, &encode_path, e))?;
            let (bytes, footer) = encoded;
            let mut id = first;
            let mut attempt = 1;
            loop {
                let path = segment_path(id);
                if store.put_if_absent(&path, bytes.clone()).await? {
                    footers.lock().insert(id, footer);
                    return Ok(Arc::new(Segment { id, path, rows: n }));
                }
                if attempt == WRITE_ATTEMPTS {
                    return Err(storage_err(
                        store.url(),
                        &path,
                        format!("spill segment names taken {WRITE_ATTEMPTS} times in a row: is another buffer spilling into this folder?"),
                    ));
                }
                tracing::warn!(
                    store = store.url(),
                    segment = id,
                    "spill segment name already taken; moving segment ids past the store's"
                );
                next.fetch_max(
                    highest_segment(&store).await?.saturating_add(1),
                    Ordering::Relaxed,
                );
                id = next.fetch_add(1, Ordering::Relaxed);
                attempt += 1;
            }
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
        let pages = Arc::clone(&self.pages);
        Box::pin(async move {
            let footer = match footer {
                Some(f) => f,
                None => {
                    let f = fetch_footer(&store, &segment.path).await?;
                    footers.lock().insert(segment.id, f.clone());
                    f
                }
            };
            read_rows(&store, &segment.path, footer, &rows, &keys, &pages).await
        })
    }

    fn segment(&self, id: u64, rows: u32) -> Arc<Segment> {
        // Ids are never reused in a process (footers and loads are keyed by them), even
        // once this segment is deleted.
        self.next.fetch_max(id.saturating_add(1), Ordering::Relaxed);
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
fn encode(rows: &[Fields]) -> std::result::Result<(Bytes, ArrowReaderMetadata), String> {
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
        .set_statistics_enabled(EnabledStatistics::None)
        // No page index: its page offsets would move with the chunks (`spill_layout.rs`),
        // and reads take whole column chunks.
        .set_offset_index_disabled(true);
    for key in plain {
        // One page per chunk: a read aligns the values of a chunk's first page only.
        props = props
            .set_column_compression(ColumnPath::from(key.as_str()), Compression::UNCOMPRESSED)
            .set_column_data_page_size_limit(ColumnPath::from(key.as_str()), usize::MAX);
    }
    let props = props.build();
    let mut writer =
        ArrowWriter::try_new(Vec::new(), schema, Some(props)).map_err(|e| e.to_string())?;
    writer.write(&batch).map_err(|e| e.to_string())?;
    let bytes = Bytes::from(writer.into_inner().map_err(|e| e.to_string())?);
    let footer = ParquetMetaDataReader::new()
        .parse_and_finish(&bytes)
        .map_err(|e| e.to_string())?;
    let (bytes, footer) = align_plain_chunks(bytes, footer)?;
    let footer = ArrowReaderMetadata::try_new(Arc::new(footer), Default::default())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

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

    fn row_groups(spill: &ParquetSpill, segment: &Segment) -> Option<usize> {
        spill
            .footers
            .lock()
            .get(&segment.id)
            .map(|f| f.metadata().num_row_groups())
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
            assert_eq!(row_groups(&spill, &segment), Some(2));
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

    /// Rows of 32 KiB of noise (which zstd cannot shrink) and 16 KiB of one repeated
    /// number (which it can).
    fn noisy_rows(n: usize) -> Vec<Fields> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
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
            .collect()
    }

    /// The arrays of a plain column are views of the fetched bytes, in every row group,
    /// on local disk (a buffer per range) and in memory (slices of the stored file), and
    /// after a restart (the footer fetched from the file).
    #[test]
    fn plain_columns_read_back_as_views_on_every_store() {
        runtime().block_on(async {
            let local = ParquetSpill::temporary().expect("store");
            let url = local.store.url().to_owned();
            let memory = ParquetSpill::new(Store::open("memory://").expect("store"));
            // 48 KiB rows: 80 of them make two row groups.
            let rows = noisy_rows(80);
            for spill in [&local, &memory] {
                let segment = spill.write(rows.clone()).await.expect("write");
                assert_eq!(row_groups(spill, &segment), Some(2));
                let restarted = ParquetSpill::new(spill.store.clone());
                for reader in [spill, &restarted] {
                    let keys = vec![FieldKey::from("noise"), FieldKey::from("flat")];
                    let got = reader
                        .read(Arc::clone(&segment), vec![5, 70, 1, 66], keys)
                        .await
                        .expect("read");
                    let want: Vec<Fields> =
                        [5, 70, 1, 66].iter().map(|&i| rows[i].clone()).collect();
                    assert_eq!(got, want);
                    let viewed = got
                        .iter()
                        .flat_map(|f| f.iter())
                        .filter(|(_, t)| format!("{t:?}").contains("Borrowed"))
                        .count();
                    let store = reader.store.url();
                    let expect = if cfg!(target_endian = "little") { 8 } else { 0 };
                    assert_eq!(viewed, expect, "{store} (local: {url})");
                }
            }
        });
    }

    /// A column zstd cannot shrink is stored plain, one it can is compressed; both read
    /// back as written.
    #[test]
    fn incompressible_columns_are_stored_plain() {
        runtime().block_on(async {
            let spill = ParquetSpill::new(Store::open("memory://").expect("store"));
            let rows = noisy_rows(8);
            let segment = spill.write(rows.clone()).await.expect("write");
            let footer = spill
                .footers
                .lock()
                .get(&segment.id)
                .cloned()
                .expect("footer");
            let codecs: Vec<(String, Compression)> = footer.metadata().row_groups()[0]
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

    /// A chunk the direct page decoder rejects (here: its footer says the chunk holds
    /// fewer uncompressed bytes than its page does, which the decoder takes for damage and
    /// Parquet's reader does not check) is read by Parquet's reader instead.
    #[test]
    fn a_chunk_the_page_decoder_rejects_is_read_by_parquet() {
        use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataWriter};
        runtime().block_on(async {
            let store = Store::open("memory://").expect("store");
            let spill = ParquetSpill::new(store.clone());
            let segment = spill.write((0..4).map(row).collect()).await.expect("write");
            let bytes = store.get(&segment.path).await.expect("get").expect("there");
            let meta = ParquetMetaDataReader::new()
                .parse_and_finish(&bytes)
                .expect("footer");
            let row_groups = meta
                .row_groups()
                .iter()
                .map(|rg| {
                    let columns = rg
                        .columns()
                        .iter()
                        .map(|c| {
                            c.clone()
                                .into_builder()
                                .set_total_uncompressed_size(1)
                                .build()
                                .expect("column")
                        })
                        .collect();
                    rg.clone()
                        .into_builder()
                        .set_column_metadata(columns)
                        .build()
                        .expect("row group")
                })
                .collect();
            let footer_len = u32::from_le_bytes(
                bytes[bytes.len() - 8..bytes.len() - 4]
                    .try_into()
                    .expect("4 bytes"),
            ) as usize;
            let mut out = bytes[..bytes.len() - 8 - footer_len].to_vec();
            let damaged = ParquetMetaData::new(meta.file_metadata().clone(), row_groups);
            ParquetMetaDataWriter::new(&mut out, &damaged)
                .with_preserve_page_index_locations(false)
                .finish()
                .expect("footer");
            store
                .put(&segment_path(99), Bytes::from(out))
                .await
                .expect("put");
            let reader = ParquetSpill::new(store);
            let got = reader
                .read(
                    reader.segment(99, 4),
                    vec![3, 1],
                    vec![FieldKey::from("tokens")],
                )
                .await
                .expect("read");
            assert_eq!(got[0].get("tokens"), row(3).get("tokens"));
            assert_eq!(got[1].get("tokens"), row(1).get("tokens"));
        });
    }

    /// A process whose clock is behind the one before it (resumed on another machine)
    /// takes names of segments live samples need; its writes move past them instead of
    /// replacing them, and a folder whose names keep being taken is an error, not a loop.
    #[test]
    fn writes_never_replace_a_segment() {
        runtime().block_on(async {
            let store = Store::open("memory://").expect("store");
            let earlier = ParquetSpill::new(store.clone());
            let first = earlier.write(vec![row(1)]).await.expect("write");
            let second = earlier.write(vec![row(2)]).await.expect("write");
            let behind = ParquetSpill::new(store.clone());
            behind.next.store(first.id, Ordering::Relaxed);
            let third = behind.write(vec![row(3)]).await.expect("write");
            assert!(third.id > second.id, "{} after {}", third.id, second.id);
            let keys = vec![FieldKey::from("tokens"), FieldKey::from("logp")];
            for (segment, i) in [(first, 1), (second, 2), (Arc::clone(&third), 3)] {
                let reader = ParquetSpill::new(store.clone());
                let got = reader
                    .read(reader.segment(segment.id, 1), vec![0], keys.clone())
                    .await
                    .expect("read");
                assert_eq!(got, vec![row(i)], "segment {}", segment.id);
            }
            // The next write follows on without another collision.
            let fourth = behind.write(vec![row(4)]).await.expect("write");
            assert_eq!(fourth.id, third.id + 1);

            // Every name taken: a typed error naming the store's folder.
            let taken = Store::from_object_store(Arc::new(AlwaysTaken::default()), "");
            let err = ParquetSpill::new(taken)
                .write(vec![row(5)])
                .await
                .expect_err("every name taken");
            assert!(
                matches!(&err, crate::Error::Storage { path, detail, .. }
                    if path.starts_with("spill/") && detail.contains("taken")),
                "{err}"
            );
        });
    }

    /// An in-memory store where every name a create-only put asks for is taken.
    #[derive(Debug, Default)]
    struct AlwaysTaken(object_store::memory::InMemory);

    impl std::fmt::Display for AlwaysTaken {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("AlwaysTaken")
        }
    }

    #[async_trait::async_trait]
    impl object_store::ObjectStore for AlwaysTaken {
        async fn put_opts(
            &self,
            location: &object_store::path::Path,
            payload: object_store::PutPayload,
            opts: object_store::PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            if opts.mode == object_store::PutMode::Create {
                return Err(object_store::Error::AlreadyExists {
                    path: location.to_string(),
                    source: "taken".into(),
                });
            }
            self.0.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &object_store::path::Path,
            opts: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.0.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &object_store::path::Path,
            options: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            self.0.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: futures::stream::BoxStream<
                'static,
                object_store::Result<object_store::path::Path>,
            >,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>
        {
            self.0.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&object_store::path::Path>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.0.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&object_store::path::Path>,
        ) -> object_store::Result<object_store::ListResult> {
            self.0.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &object_store::path::Path,
            to: &object_store::path::Path,
            options: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }
}
