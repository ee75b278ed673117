//! Where the values of a spill segment's plain column chunks sit in the file: 8-byte
//! aligned, so that a load can view them in place wherever the bytes come from.
//!
//! A spill value is padded so that its array starts 8-byte aligned relative to the start
//! of its page's values (`spill_value.rs`), and a plain column chunk is one page. Parquet's
//! writer puts a chunk wherever the previous one ended, and its page values after a header
//! of some length, so the values start at any byte. [`align_plain_chunks`] moves each plain
//! chunk forward by up to 7 bytes (the gap is zeros, which Parquet readers skip: they find
//! chunks by the offsets in the footer) and writes the footer again with the new offsets.
//! Page indexes and bloom filters are not carried over (spill segments have neither).
//!
//! A fetch of a chunk that starts at an 8-byte boundary below the chunk (the chunk's
//! offset rounded down) then holds the page's values 8-byte aligned, in a buffer of its
//! own (local disk), in a stretch of one merged request (object stores), or in a mapping
//! of the file (which keeps file offsets modulo the page size).

use super::pages::data_page_header_len;
use bytes::Bytes;
use parquet::basic::Compression;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader, ParquetMetaDataWriter};

/// Alignment of plain chunks' values in the file, and of every fetch's start.
pub(super) const ALIGN: u64 = 8;

/// The Parquet file `bytes` (footer `meta`) with the values of every uncompressed column
/// chunk's first page moved to an [`ALIGN`]ed offset; its new footer. Returns the file as
/// it is if it has no such chunk.
pub(super) fn align_plain_chunks(
    bytes: Bytes,
    meta: ParquetMetaData,
) -> Result<(Bytes, ParquetMetaData), String> {
    let any_plain = meta.row_groups().iter().any(|rg| {
        rg.columns()
            .iter()
            .any(|c| c.compression() == Compression::UNCOMPRESSED)
    });
    if !any_plain {
        return Ok((bytes, meta));
    }
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len() + 8 * 64);
    out.extend_from_slice(b"PAR1");
    let mut row_groups = Vec::with_capacity(meta.num_row_groups());
    for rg in meta.row_groups() {
        let mut columns = Vec::with_capacity(rg.columns().len());
        let mut group_start = None;
        for chunk in rg.columns() {
            let (start, len) = chunk.byte_range();
            let (from, to) = (
                usize::try_from(start).map_err(|e| e.to_string())?,
                usize::try_from(start.saturating_add(len)).map_err(|e| e.to_string())?,
            );
            let body = bytes
                .get(from..to)
                .ok_or_else(|| format!("column chunk {from}..{to} past the file's end"))?;
            // A chunk of another kind (a dictionary page first, say) is not padded: its
            // values are copied when loaded.
            let header = (chunk.compression() == Compression::UNCOMPRESSED)
                .then(|| data_page_header_len(body))
                .flatten();
            if let Some(header) = header {
                let at = (out.len() + header) as u64;
                out.resize(out.len() + ((ALIGN - at % ALIGN) % ALIGN) as usize, 0);
            }
            let moved_to = out.len() as i64;
            out.extend_from_slice(body);
            group_start.get_or_insert(moved_to);
            let shift = moved_to - start as i64;
            columns.push(
                chunk
                    .clone()
                    .into_builder()
                    .set_data_page_offset(chunk.data_page_offset() + shift)
                    .set_dictionary_page_offset(chunk.dictionary_page_offset().map(|o| o + shift))
                    .set_index_page_offset(chunk.index_page_offset().map(|o| o + shift))
                    // Only the chunks move: page indexes and bloom filters are left behind.
                    .set_column_index_offset(None)
                    .set_column_index_length(None)
                    .set_offset_index_offset(None)
                    .set_offset_index_length(None)
                    .set_bloom_filter_offset(None)
                    .set_bloom_filter_length(None)
                    .build()
                    .map_err(|e| e.to_string())?,
            );
        }
        let mut moved = rg.clone().into_builder().set_column_metadata(columns);
        if let Some(start) = group_start {
            moved = moved.set_file_offset(start);
        }
        row_groups.push(moved.build().map_err(|e| e.to_string())?);
    }
    let moved = ParquetMetaData::new(meta.file_metadata().clone(), row_groups);
    ParquetMetaDataWriter::new(&mut out, &moved)
        .with_preserve_page_index_locations(false)
        .finish()
        .map_err(|e| e.to_string())?;
    let out = Bytes::from(out);
    let meta = ParquetMetaDataReader::new()
        .parse_and_finish(&out)
        .map_err(|e| e.to_string())?;
    Ok((out, meta))
}

/// Where a fetch of bytes from `start` begins: `start` rounded down to [`ALIGN`].
pub(super) fn fetch_start(start: u64) -> u64 {
    start - start % ALIGN
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    use super::*;
    use crate::sync::Arc;
    use arrow_array::{Array, ArrayRef, BinaryViewArray, RecordBatch};
    use arrow_schema::{Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ArrowWriter;
    use parquet::basic::ZstdLevel;
    use parquet::file::properties::WriterProperties;
    use parquet::schema::types::ColumnPath;

    /// A file of 3 row groups with a plain column of odd-length values (so its chunks
    /// end at odd offsets) and a zstd one; `plain` false writes both compressed.
    fn file(plain: bool) -> (Bytes, ParquetMetaData, RecordBatch) {
        let values = |n: usize| -> ArrayRef {
            Arc::new(BinaryViewArray::from_iter_values(
                (0..30).map(|i| vec![(i * n) as u8; 1 + (i * 37 + n) % 101]),
            ))
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", arrow_schema::DataType::BinaryView, false),
            Field::new("b", arrow_schema::DataType::BinaryView, false),
        ]));
        let batch =
            RecordBatch::try_new(Arc::clone(&schema), vec![values(3), values(5)]).expect("batch");
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(10))
            .set_dictionary_enabled(false)
            .set_offset_index_disabled(true);
        if plain {
            props = props.set_column_compression(ColumnPath::from("a"), Compression::UNCOMPRESSED);
        }
        let mut writer =
            ArrowWriter::try_new(Vec::new(), schema, Some(props.build())).expect("writer");
        writer.write(&batch).expect("write");
        let bytes = Bytes::from(writer.into_inner().expect("close"));
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&bytes)
            .expect("footer");
        (bytes, meta, batch)
    }

    fn read_all(bytes: Bytes) -> Vec<RecordBatch> {
        // Loading the page index too: the moved footer must not point at stale ones.
        let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
            .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional);
        ParquetRecordBatchReaderBuilder::try_new_with_options(bytes, options)
            .expect("reader")
            .build()
            .expect("reader")
            .collect::<std::result::Result<_, _>>()
            .expect("read")
    }

    /// After the move, every plain chunk's page values start 8-byte aligned in the file
    /// (at least one did not before), and Parquet's own reader reads the file back as
    /// written.
    #[test]
    fn plain_chunk_values_are_aligned_and_the_file_reads_back() {
        let (bytes, meta, batch) = file(true);
        let values_at = |bytes: &Bytes, meta: &ParquetMetaData| -> Vec<u64> {
            meta.row_groups()
                .iter()
                .flat_map(|rg| rg.columns())
                .filter(|c| c.compression() == Compression::UNCOMPRESSED)
                .map(|c| {
                    let start = c.byte_range().0;
                    let header = data_page_header_len(&bytes[start as usize..]).expect("page");
                    start + header as u64
                })
                .collect()
        };
        let before = values_at(&bytes, &meta);
        assert_eq!(before.len(), 3);
        assert!(before.iter().any(|at| at % ALIGN != 0), "{before:?}");
        let (moved, moved_meta) = align_plain_chunks(bytes, meta).expect("align");
        let after = values_at(&moved, &moved_meta);
        assert_eq!(after.len(), 3);
        assert!(after.iter().all(|at| at % ALIGN == 0), "{after:?}");
        let back = read_all(moved);
        let rows: usize = back.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 30);
        let whole = one_batch(&back);
        assert_eq!(whole, batch);
    }

    /// A file without plain chunks is returned as it is.
    #[test]
    fn files_without_plain_chunks_are_unchanged() {
        let (bytes, meta, _) = file(false);
        let (same, _) = align_plain_chunks(bytes.clone(), meta).expect("align");
        assert_eq!(same, bytes);
    }

    /// The batches as one (they share the schema).
    fn one_batch(batches: &[RecordBatch]) -> RecordBatch {
        let schema = batches[0].schema();
        let columns = (0..schema.fields().len())
            .map(|c| {
                let values: Vec<Vec<u8>> = batches
                    .iter()
                    .flat_map(|b| {
                        let col = b
                            .column(c)
                            .as_any()
                            .downcast_ref::<BinaryViewArray>()
                            .expect("view column");
                        (0..col.len())
                            .map(|i| col.value(i).to_vec())
                            .collect::<Vec<_>>()
                    })
                    .collect();
                Arc::new(BinaryViewArray::from_iter_values(values)) as ArrayRef
            })
            .collect();
        RecordBatch::try_new(schema, columns).expect("batch")
    }
}
