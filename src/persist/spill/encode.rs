//! A spill segment's bytes: one binary column per field name, zstd-compressed unless a
//! sample of the column shows zstd cannot shrink it, small row groups, and plain chunks
//! moved so their values sit 8-byte aligned in the file (`layout.rs`).

use super::layout::align_plain_chunks;
use super::value::put_tensor_padded;
use crate::persist::codec::{put_tensor, Writer};
use crate::sample::{FieldKey, Fields};
use crate::sync::Arc;
use arrow_array::{ArrayRef, BinaryViewArray, LargeBinaryArray, RecordBatch};
use arrow_schema::{Field, Schema};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::ParquetMetaDataReader;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

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

/// Encodes `rows` as one Parquet file; returns its bytes and footer.
pub(super) fn encode(rows: &[Fields]) -> std::result::Result<(Bytes, ArrowReaderMetadata), String> {
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
