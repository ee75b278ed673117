//! Decoding the rows of a spill segment's row group straight from its fetched column
//! chunks, for the chunks this crate writes: one required binary column per field, data
//! pages (v1) of PLAIN values, uncompressed or zstd.
//!
//! Parquet's Arrow reader does this too, but for each column chunk it sets up a reader, a
//! decoder and a codec (two zstd contexts, a few hundred kilobytes of fresh memory), and
//! for each read it builds the Arrow arrays the values are then taken from. A trainer
//! reading spilled samples pays that per row group, tens of microseconds, on the path
//! every batch waits on. Here a page header is parsed (Thrift compact protocol, the few
//! fields a data page has), a compressed page is decompressed with the calling thread's
//! zstd context, and the wanted values become tensors viewing the page.
//!
//! Anything else (a nullable column, a dictionary or v2 page, another encoding or codec)
//! makes [`decode_chunk`] answer `None`, and the caller uses Parquet's reader, which
//! reads every valid file.

use super::thrift::{Thrift, I32, STRUCT};
use super::value::take_tensor_padded;
use crate::persist::buffer_pool::BufferPool;
use crate::persist::codec::{take_tensor, Reader};
use crate::sync::Arc;
use crate::tensor::{SharedBytes, Tensor};
use bytes::Bytes;
use parquet::basic::{Compression, Type as PhysicalType};
use parquet::file::metadata::ColumnChunkMetaData;
use std::cell::RefCell;

/// How the values of a column encode tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ValueEncoding {
    /// Padded so that arrays start 8-byte aligned in the page (binary-view columns).
    Padded,
    /// The plain tensor encoding (large-binary columns).
    Plain,
}

/// The tensors of rows `wanted` (ascending row numbers inside the row group) of a column
/// chunk whose bytes are `chunk`, or `None` if the chunk is not of the kind this module
/// reads (see the module doc). An error says what is wrong with the chunk.
pub(super) fn decode_chunk(
    meta: &ColumnChunkMetaData,
    chunk: &Bytes,
    wanted: &[u64],
    encoding: ValueEncoding,
    pool: &Arc<BufferPool>,
) -> Option<Result<Vec<Tensor>, String>> {
    let descr = meta.column_descr();
    let simple = descr.physical_type() == PhysicalType::BYTE_ARRAY
        && descr.max_def_level() == 0
        && descr.max_rep_level() == 0
        && matches!(
            meta.compression(),
            Compression::UNCOMPRESSED | Compression::ZSTD(_)
        )
        && meta.dictionary_page_offset().is_none();
    if !simple {
        return None;
    }
    let compressed = meta.compression() != Compression::UNCOMPRESSED;
    // Every page header first (no values are touched): their value counts must add up
    // to the chunk's, so a damaged count is an error rather than rows read from the
    // wrong place.
    let mut pages: Vec<Page> = Vec::new();
    let mut at = 0usize;
    let largest = u64::try_from(meta.uncompressed_size())
        .unwrap_or(0)
        .min(i32::MAX as u64);
    while at < chunk.len() {
        let header = match PageHeader::parse(&chunk[at..]) {
            Ok(Some(h)) => h,
            Ok(None) => return None,
            Err(e) => return Some(Err(format!("page header at byte {at}: {e}"))),
        };
        let body = at + header.len..(at + header.len).saturating_add(header.compressed_size);
        if body.end > chunk.len() {
            return Some(Err(format!("page at byte {at} ends past its column chunk")));
        }
        if header.uncompressed_size as u64 > largest {
            return Some(Err(format!(
                "page at byte {at}: {} bytes uncompressed, more than its chunk's {largest}",
                header.uncompressed_size
            )));
        }
        at = body.end;
        pages.push(Page {
            body,
            uncompressed_size: header.uncompressed_size,
            values: header.num_values,
        });
    }
    let total: u64 = pages.iter().map(|p| p.values).sum();
    if Some(total) != u64::try_from(meta.num_values()).ok() {
        return Some(Err(format!(
            "the pages hold {total} values, the column chunk {}",
            meta.num_values()
        )));
    }
    let mut out = Vec::with_capacity(wanted.len());
    let mut next = wanted.iter().peekable();
    // The row number of the first value of the page.
    let mut first_row = 0u64;
    for page in &pages {
        let rows = first_row..first_row + page.values;
        first_row = rows.end;
        if next.peek().is_none_or(|&&r| r >= rows.end) {
            // No wanted row in this page: skipped without decompressing.
            continue;
        }
        let bytes: Bytes = if compressed {
            match decompress(&chunk[page.body.clone()], page.uncompressed_size, pool) {
                Ok(v) => v,
                Err(e) => return Some(Err(format!("page at byte {}: {e}", page.body.start))),
            }
        } else {
            chunk.slice(page.body.clone())
        };
        let owner: SharedBytes = Arc::new(bytes.clone());
        let mut r = Reader::new(&bytes);
        // Every value of the page is stepped over (by its length), so that a page whose
        // values do not fill it exactly is an error.
        for row in rows {
            let len = match r.bytes(4) {
                Ok(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize,
                Err(e) => return Some(Err(format!("row {row}: {e}"))),
            };
            let start = r.position();
            let value = match r.bytes(len) {
                Ok(v) => v,
                Err(e) => return Some(Err(format!("row {row}: {e}"))),
            };
            if next.peek() != Some(&&row) {
                continue;
            }
            next.next();
            let tensor = match encoding {
                ValueEncoding::Padded => take_tensor_padded(value, Some((&owner, start))),
                ValueEncoding::Plain => take_tensor(&mut Reader::new(value)),
            };
            match tensor {
                Ok(t) => out.push(t),
                Err(e) => return Some(Err(format!("row {row}: {e}"))),
            }
        }
        if r.remaining() != 0 {
            return Some(Err(format!(
                "page at byte {}: {} bytes after its last value",
                page.body.start,
                r.remaining()
            )));
        }
    }
    if let Some(row) = next.peek() {
        return Some(Err(format!(
            "row {row} asked for, but the column chunk has {first_row} rows"
        )));
    }
    Some(Ok(out))
}

/// Where a data page's values are in its column chunk, and how many.
struct Page {
    body: std::ops::Range<usize>,
    uncompressed_size: usize,
    values: u64,
}

thread_local! {
    /// This thread's zstd decompression context, made on first use and kept.
    static ZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Decompresses a zstd page of `size` bytes into a buffer from `pool`.
fn decompress(page: &[u8], size: usize, pool: &Arc<BufferPool>) -> Result<Bytes, String> {
    ZSTD.with(|cell| {
        let mut cell = cell.borrow_mut();
        let context = match cell.as_mut() {
            Some(c) => c,
            None => cell.insert(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?),
        };
        let mut buf = pool.take(size);
        let got = match buf.get_mut(..size) {
            Some(into) => context
                .decompress_to_buffer(page, into)
                .map_err(|e| format!("zstd: {e}")),
            None => Err("pooled buffer shorter than asked".to_owned()),
        };
        match got {
            Ok(n) if n == size => Ok(pool.share(buf, size)),
            other => {
                pool.give_back(buf);
                Err(other.map_or_else(
                    |e| e,
                    |n| format!("{n} bytes decompressed, {size} expected"),
                ))
            }
        }
    })
}

/// The length of the header of the page at the start of `bytes` if it is a v1 data page
/// of PLAIN values (the kind a spill segment's chunks hold); its values follow it.
pub(super) fn data_page_header_len(bytes: &[u8]) -> Option<usize> {
    PageHeader::parse(bytes).ok().flatten().map(|h| h.len)
}

/// What a data page's header says that a read needs.
struct PageHeader {
    /// Bytes of the header itself.
    len: usize,
    uncompressed_size: usize,
    compressed_size: usize,
    num_values: u64,
}

/// Parquet's `PageType::DATA_PAGE`.
const DATA_PAGE: i64 = 0;
/// Parquet's `Encoding::PLAIN`.
const PLAIN: i64 = 0;

impl PageHeader {
    /// The header at the start of `bytes`; `None` if it is not a v1 data page of PLAIN
    /// values.
    fn parse(bytes: &[u8]) -> Result<Option<Self>, String> {
        let mut t = Thrift { bytes, at: 0 };
        let (mut kind, mut uncompressed, mut compressed) = (None, None, None);
        let (mut num_values, mut encoding) = (None, None);
        let mut last = 0i16;
        while let Some((id, ty)) = t.field(&mut last)? {
            match (id, ty) {
                (1, I32) => kind = Some(t.int()?),
                (2, I32) => uncompressed = Some(t.int()?),
                (3, I32) => compressed = Some(t.int()?),
                (5, STRUCT) => {
                    let mut inner = 0i16;
                    while let Some((id, ty)) = t.field(&mut inner)? {
                        match (id, ty) {
                            (1, I32) => num_values = Some(t.int()?),
                            (2, I32) => encoding = Some(t.int()?),
                            _ => t.skip(ty, 0, true)?,
                        }
                    }
                }
                // An index, dictionary or v2 page header: not this module's kind.
                (6..=8, _) => return Ok(None),
                _ => t.skip(ty, 0, true)?,
            }
        }
        if kind != Some(DATA_PAGE) || encoding != Some(PLAIN) {
            return Ok(None);
        }
        let size = |v: Option<i64>, what: &str| {
            v.and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| format!("no valid {what}"))
        };
        Ok(Some(Self {
            len: t.at,
            uncompressed_size: size(uncompressed, "uncompressed size")?,
            compressed_size: size(compressed, "compressed size")?,
            num_values: size(num_values, "value count")? as u64,
        }))
    }
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    use super::*;
    use crate::persist::codec::{put_tensor, Writer};
    use crate::persist::spill::value::put_tensor_padded;
    use arrow_array::{ArrayRef, BinaryViewArray, LargeBinaryArray, RecordBatch};
    use arrow_schema::{Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::ZstdLevel;
    use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
    use parquet::file::properties::{EnabledStatistics, WriterProperties};

    fn tensors(n: usize) -> Vec<Tensor> {
        (0..n)
            .map(|i| match i % 3 {
                0 => Tensor::from(vec![i as i32; 500 + i]),
                1 => Tensor::from(vec![-(i as f32) * 0.25; 300]),
                _ => Tensor::from(ndarray::array![[i as f64, 1.5], [2.0, -3.0]]),
            })
            .collect()
    }

    /// A one-column file of `values` (required unless `nullable`), in small pages with
    /// page statistics (so that page headers carry fields the parser skips).
    fn file(
        values: ArrayRef,
        nullable: bool,
        compression: Compression,
        dictionary: bool,
    ) -> (Bytes, ParquetMetaData) {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "f",
            values.data_type().clone(),
            nullable,
        )]));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![values]).expect("batch");
        let props = WriterProperties::builder()
            .set_compression(compression)
            .set_dictionary_enabled(dictionary)
            .set_data_page_size_limit(4 << 10)
            .set_write_batch_size(4)
            .set_statistics_enabled(EnabledStatistics::Page)
            .build();
        let mut writer = ArrowWriter::try_new(Vec::new(), schema, Some(props)).expect("writer");
        writer.write(&batch).expect("write");
        let bytes = Bytes::from(writer.into_inner().expect("close"));
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&bytes)
            .expect("footer");
        (bytes, meta)
    }

    fn padded(ts: &[Tensor]) -> ArrayRef {
        let mut w = Writer::default();
        Arc::new(BinaryViewArray::from_iter_values(ts.iter().map(|t| {
            w.buf.clear();
            put_tensor_padded(&mut w, t);
            w.buf.clone()
        })))
    }

    fn chunk_of(bytes: &Bytes, meta: &ParquetMetaData) -> (ColumnChunkMetaData, Bytes) {
        let chunk = meta.row_group(0).column(0).clone();
        let (start, len) = chunk.byte_range();
        (chunk, bytes.slice(start as usize..(start + len) as usize))
    }

    /// Wanted rows of many pages, plain and zstd, padded and in the plain tensor
    /// encoding, decode to the tensors written; pages with no wanted row are skipped.
    #[test]
    fn wanted_rows_decode_from_every_page() {
        let pool = Arc::new(BufferPool::default());
        let ts = tensors(90);
        let mut w = Writer::default();
        let plain: ArrayRef = Arc::new(LargeBinaryArray::from_iter_values(ts.iter().map(|t| {
            w.buf.clear();
            put_tensor(&mut w, t);
            w.buf.clone()
        })));
        let wanted: Vec<u64> = vec![0, 1, 2, 17, 40, 41, 88, 89];
        let zstd = Compression::ZSTD(ZstdLevel::default());
        for (values, encoding) in [
            (padded(&ts), ValueEncoding::Padded),
            (plain, ValueEncoding::Plain),
        ] {
            for compression in [Compression::UNCOMPRESSED, zstd] {
                let (bytes, meta) = file(Arc::clone(&values), false, compression, false);
                let (chunk, data) = chunk_of(&bytes, &meta);
                let got = decode_chunk(&chunk, &data, &wanted, encoding, &pool)
                    .expect("a chunk of the kind read directly")
                    .expect("decoded");
                let want: Vec<Tensor> = wanted.iter().map(|&i| ts[i as usize].clone()).collect();
                assert_eq!(got, want, "{encoding:?}, {compression:?}");
            }
        }
    }

    /// Nullable and dictionary-encoded chunks are left to Parquet's reader.
    #[test]
    fn other_chunks_are_not_read_directly() {
        let pool = Arc::new(BufferPool::default());
        let ts = tensors(10);
        for (nullable, dictionary) in [(true, false), (false, true)] {
            let (bytes, meta) = file(padded(&ts), nullable, Compression::UNCOMPRESSED, dictionary);
            let (chunk, data) = chunk_of(&bytes, &meta);
            assert!(decode_chunk(&chunk, &data, &[0, 3], ValueEncoding::Padded, &pool).is_none());
        }
    }

    /// A damaged chunk (cut short anywhere, or any byte of a page header changed to any
    /// value) is an error or is left to Parquet's reader, never a panic or wrong rows.
    #[test]
    fn damaged_chunks_are_errors() {
        let pool = Arc::new(BufferPool::default());
        let ts = tensors(12);
        let all: Vec<u64> = (0..12).collect();
        for compression in [
            Compression::UNCOMPRESSED,
            Compression::ZSTD(ZstdLevel::default()),
        ] {
            let (bytes, meta) = file(padded(&ts), false, compression, false);
            let (chunk, data) = chunk_of(&bytes, &meta);
            for cut in 0..data.len() {
                let short = data.slice(..cut);
                if let Some(Ok(got)) =
                    decode_chunk(&chunk, &short, &all, ValueEncoding::Padded, &pool)
                {
                    panic!("{} rows from {cut} of {} bytes", got.len(), data.len());
                }
            }
            // Every byte of the first two page headers, set to every value.
            let first = PageHeader::parse(&data)
                .expect("header")
                .expect("data page");
            let second_at = first.len + first.compressed_size;
            let second = PageHeader::parse(&data[second_at..])
                .expect("header")
                .expect("data page");
            let header_bytes = (0..first.len).chain(second_at..second_at + second.len);
            for at in header_bytes {
                for v in 0..=255u8 {
                    let mut bad = data.to_vec();
                    if bad[at] == v {
                        continue;
                    }
                    bad[at] = v;
                    let bad = Bytes::from(bad);
                    // All rows (every page decoded), and the last two (the pages before
                    // them skipped, trusting only their headers).
                    for wanted in [&all[..], &all[10..]] {
                        let got = decode_chunk(&chunk, &bad, wanted, ValueEncoding::Padded, &pool);
                        if let Some(Ok(got)) = got {
                            let want = &ts[wanted[0] as usize..];
                            assert_eq!(got, want, "byte {at} set to {v} ({compression:?})");
                        }
                    }
                }
            }
        }
    }

    /// A data page header in the compact protocol, as Parquet writes one.
    fn header(uncompressed: i64, compressed: i64, values: i64) -> Vec<u8> {
        let mut out = Vec::new();
        let int = |field_header: u8, v: i64, out: &mut Vec<u8>| {
            out.push(field_header);
            super::super::thrift::put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
        };
        int(0x15, DATA_PAGE, &mut out); // 1: type
        int(0x15, uncompressed, &mut out); // 2: uncompressed size
        int(0x15, compressed, &mut out); // 3: compressed size
        out.push(0x2c); // 5: the data page header, a struct
        int(0x15, values, &mut out); // 5.1: value count
        int(0x15, PLAIN, &mut out); // 5.2: encoding
        int(0x15, 3, &mut out); // 5.3: definition level encoding (RLE)
        int(0x15, 3, &mut out); // 5.4: repetition level encoding (RLE)
        out.extend([0, 0]);
        out
    }

    /// A page claiming more uncompressed bytes than its whole chunk holds is an error
    /// before any buffer of that size is taken.
    #[test]
    fn implausible_page_sizes_are_errors() {
        let pool = Arc::new(BufferPool::default());
        let ts = tensors(12);
        let (bytes, meta) = file(
            padded(&ts),
            false,
            Compression::ZSTD(ZstdLevel::default()),
            false,
        );
        let (chunk, data) = chunk_of(&bytes, &meta);
        let first = PageHeader::parse(&data)
            .expect("header")
            .expect("data page");
        let body = &data[first.len..];
        let with = |uncompressed: i64| {
            let mut c = header(
                uncompressed,
                first.compressed_size as i64,
                first.num_values as i64,
            );
            c.extend_from_slice(body);
            Bytes::from(c)
        };
        let all: Vec<u64> = (0..12).collect();
        // The header as written reads back as the original.
        let same = decode_chunk(
            &chunk,
            &with(first.uncompressed_size as i64),
            &all,
            ValueEncoding::Padded,
            &pool,
        );
        assert_eq!(same.expect("read directly").expect("decoded"), ts);
        for huge in [1 << 40, i64::MAX, -1] {
            let got = decode_chunk(&chunk, &with(huge), &all, ValueEncoding::Padded, &pool);
            assert!(matches!(got, Some(Err(_))), "{huge}: {got:?}");
        }
    }
}
