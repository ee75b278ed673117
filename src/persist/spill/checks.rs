//! The checks every Parquet file read from a store gets before the `parquet` reader trusts
//! its footer and page headers.
//!
//! The `parquet` reader sizes its buffers by what a page header says: a damaged value count
//! in a dictionary page made it allocate 15 GB for a 1.6 KB checkpoint segment (found by
//! `fuzz/`, target `segment`). [`check_chunk_pages`] walks every page header of a column
//! chunk first and refuses one that claims more values than its chunk holds, more bytes
//! uncompressed than the chunk, or that ends outside it.
//!
//! Its footer decoder steps over a field it does not know without reading the elements of
//! a list of booleans (in a list each is a byte), so a footer declaring such a list of 2^31
//! elements held it for a second per list, and a few hundred bytes of such lists for
//! minutes (found by `fuzz/`, target `spill_segment`). [`footer_metadata`] walks the footer
//! first with the crate's Thrift reader (`thrift.rs`), as `parquet.thrift` shapes it
//! (`shapes.rs`), so the walk reads every byte as the decoder will, each element costs it a
//! byte, and it ends within the footer's length; [`check_chunk_pages`] walks page headers
//! the same way.

use super::shapes::{FILE_META_DATA, PAGE_HEADER};
use super::thrift::{Thrift, I32, STRUCT};
use parquet::file::metadata::{ColumnChunkMetaData, FooterTail, ParquetMetaData};
use parquet::file::FOOTER_SIZE;
use std::ops::Range;

/// The footer metadata of the Parquet file `file` (its Thrift `FileMetaData`, the bytes
/// before the last eight), checked with [`check_metadata`]; an error if the file does not
/// end as a Parquet file does.
pub(crate) fn footer_metadata(file: &[u8]) -> Result<&[u8], String> {
    let last = file.len().saturating_sub(FOOTER_SIZE);
    let range = metadata_range(file.len() as u64, &file[last..])?;
    // Within the file: `metadata_range` checked it against the file's size.
    let metadata = file
        .get(range.start as usize..range.end as usize)
        .unwrap_or_default();
    check_metadata(metadata)?;
    Ok(metadata)
}

/// Where the footer metadata of a Parquet file of `size` bytes lies, from the file's last
/// eight bytes (`last`): the metadata's length and the magic number.
pub(crate) fn metadata_range(size: u64, last: &[u8]) -> Result<Range<u64>, String> {
    if size < FOOTER_SIZE as u64 || last.len() != FOOTER_SIZE {
        return Err(format!("{size} bytes: shorter than a Parquet footer"));
    }
    let tail = FooterTail::try_from(last).map_err(|e| e.to_string())?;
    let len = tail.metadata_length() as u64;
    let end = size - FOOTER_SIZE as u64;
    let start = end
        .checked_sub(len)
        .ok_or_else(|| format!("a footer of {len} bytes in a file of {size}"))?;
    Ok(start..end)
}

/// Checks that `metadata` is one `FileMetaData` (a footer's Thrift struct) that ends
/// within it, read as the `parquet` decoder will read it (see `shapes.rs`), before that
/// decoder reads it (see the module docs).
pub(crate) fn check_metadata(metadata: &[u8]) -> Result<(), String> {
    let mut t = Thrift {
        bytes: metadata,
        at: 0,
    };
    t.walk(FILE_META_DATA, STRUCT, 0)
        .map_err(|e| format!("footer metadata at byte {}: {e}", t.at))
}

/// Where the column chunk `meta` describes starts in its file and how long it is, or an
/// error if its footer gives a negative offset or size.
///
/// `ColumnChunkMetaData::byte_range` asserts those are not negative (it panics on a
/// damaged footer, found by `fuzz/`, target `spill_segment`), and the `parquet` reader
/// calls it on every column of a row group it reads: every footer read from a store goes
/// through [`check_footer`] before the reader sees it.
pub(crate) fn chunk_byte_range(meta: &ColumnChunkMetaData) -> Result<(u64, u64), String> {
    let start = meta
        .dictionary_page_offset()
        .unwrap_or_else(|| meta.data_page_offset());
    match (u64::try_from(start), u64::try_from(meta.compressed_size())) {
        (Ok(start), Ok(len)) => Ok((start, len)),
        _ => Err(format!(
            "column `{}` at offset {start} with size {}: negative",
            meta.column_path().string(),
            meta.compressed_size()
        )),
    }
}

/// Checks that every column chunk of every row group in `footer` has a non-negative
/// offset and size, which the `parquet` reader assumes (see [`chunk_byte_range`]).
pub(crate) fn check_footer(footer: &ParquetMetaData) -> Result<(), String> {
    for (g, group) in footer.row_groups().iter().enumerate() {
        for column in group.columns() {
            chunk_byte_range(column).map_err(|e| format!("row group {g}: {e}"))?;
        }
    }
    Ok(())
}

/// Checks every page header of the column chunk `meta` describes, in `file` (the whole
/// Parquet file), against the chunk's own metadata (see the module docs).
pub(crate) fn check_chunk_pages(meta: &ColumnChunkMetaData, file: &[u8]) -> Result<(), String> {
    let (start, len) = chunk_byte_range(meta)?;
    let chunk = usize::try_from(start)
        .ok()
        .zip(usize::try_from(len).ok())
        .and_then(|(s, l)| file.get(s..s.checked_add(l)?))
        .ok_or_else(|| format!("column chunk at {start}+{len} is outside the file"))?;
    let values = u64::try_from(meta.num_values()).unwrap_or(0);
    let largest = u64::try_from(meta.uncompressed_size()).unwrap_or(0);
    let mut at = 0usize;
    while at < chunk.len() {
        // As the `parquet` decoder will read it, first; then its fields are where the
        // loop below looks for them.
        let mut shape = Thrift {
            bytes: &chunk[at..],
            at: 0,
        };
        shape
            .walk(PAGE_HEADER, STRUCT, 0)
            .map_err(|e| format!("page at byte {at} of its chunk, byte {}: {e}", shape.at))?;
        let mut t = Thrift {
            bytes: &chunk[at..],
            at: 0,
        };
        let (mut uncompressed, mut compressed, mut count) = (0i64, 0i64, 0i64);
        let mut last = 0i16;
        while let Some((id, ty)) = t.field(&mut last)? {
            match (id, ty) {
                (2, I32) => uncompressed = t.int()?,
                (3, I32) => compressed = t.int()?,
                // data page v1, dictionary page, data page v2: field 1 is the value count
                (5 | 7 | 8, STRUCT) => {
                    let mut inner = 0i16;
                    while let Some((id, ty)) = t.field(&mut inner)? {
                        match (id, ty) {
                            (1, I32) => count = t.int()?,
                            _ => t.skip(ty, 0, true)?,
                        }
                    }
                }
                _ => t.skip(ty, 0, true)?,
            }
        }
        let page = |what: &str| format!("page at byte {} of its chunk: {what}", at);
        if count < 0 || count as u64 > values {
            return Err(page(&format!("{count} values, its chunk holds {values}")));
        }
        if uncompressed < 0 || uncompressed as u64 > largest {
            return Err(page(&format!(
                "{uncompressed} bytes uncompressed, its chunk {largest}"
            )));
        }
        let end = usize::try_from(compressed)
            .ok()
            .and_then(|c| (at + t.at).checked_add(c))
            .filter(|&e| e <= chunk.len())
            .ok_or_else(|| page("ends outside its chunk"))?;
        at = end;
    }
    Ok(())
}
