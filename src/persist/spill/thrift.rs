//! A reader of Parquet's Thrift page headers, and the checks every Parquet file read from a
//! store gets before the `parquet` reader trusts its footer and page headers.
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
//! first with this reader, whose every element costs a byte, so it ends within the
//! footer's length.

use parquet::file::metadata::{ColumnChunkMetaData, FooterTail, ParquetMetaData};
use parquet::file::FOOTER_SIZE;
use std::ops::Range;

// Thrift compact protocol types.
const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
pub(super) const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
pub(super) const STRUCT: u8 = 12;

/// Nesting deeper than this is refused (a page header nests three levels).
const MAX_DEPTH: usize = 16;

/// A reader of Thrift compact-protocol bytes.
pub(super) struct Thrift<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
}

impl Thrift<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| "header truncated".to_owned())?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".to_owned())
    }

    /// A zigzag-encoded integer (i16, i32 or i64).
    pub(super) fn int(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// The next field's id and type, or `None` at the struct's end.
    pub(super) fn field(&mut self, last: &mut i16) -> Result<Option<(i16, u8)>, String> {
        let b = self.byte()?;
        if b == 0 {
            return Ok(None);
        }
        let delta = b >> 4;
        let id = if delta == 0 {
            i16::try_from(self.int()?).map_err(|_| "field id out of range".to_owned())?
        } else {
            last.checked_add(i16::from(delta))
                .ok_or_else(|| "field id out of range".to_owned())?
        };
        *last = id;
        Ok(Some((id, b & 0x0f)))
    }

    /// Steps over a value of type `ty`: a field's (`in_field`), whose bool is in its
    /// type, or an element's, whose bool is a byte.
    pub(super) fn skip(&mut self, ty: u8, depth: usize, in_field: bool) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("header nested too deep".to_owned());
        }
        match ty {
            BOOL_TRUE | BOOL_FALSE if in_field => {}
            BOOL_TRUE | BOOL_FALSE | BYTE => {
                self.byte()?;
            }
            I16 | I32 | I64 => {
                self.varint()?;
            }
            DOUBLE => self.advance(8)?,
            BINARY => {
                let n = self.varint()?;
                self.advance(usize::try_from(n).map_err(|_| "binary too long".to_owned())?)?;
            }
            LIST | SET => {
                let head = self.byte()?;
                let n = match head >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                for _ in 0..n {
                    self.skip(head & 0x0f, depth + 1, false)?;
                }
            }
            MAP => {
                let n = self.varint()?;
                if n > 0 {
                    let kinds = self.byte()?;
                    for _ in 0..n {
                        self.skip(kinds >> 4, depth + 1, false)?;
                        self.skip(kinds & 0x0f, depth + 1, false)?;
                    }
                }
            }
            STRUCT => {
                let mut last = 0i16;
                while let Some((_, ty)) = self.field(&mut last)? {
                    self.skip(ty, depth + 1, true)?;
                }
            }
            other => return Err(format!("unknown type {other}")),
        }
        Ok(())
    }

    fn advance(&mut self, n: usize) -> Result<(), String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        self.at = end.ok_or_else(|| "header truncated".to_owned())?;
        Ok(())
    }
}

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

/// Checks that `metadata` is one Thrift struct (a footer's `FileMetaData`) that ends
/// within it, stepping over every field, before the `parquet` decoder reads it (see the
/// module docs).
pub(crate) fn check_metadata(metadata: &[u8]) -> Result<(), String> {
    let mut t = Thrift {
        bytes: metadata,
        at: 0,
    };
    t.skip(STRUCT, 0, false)
        .map_err(|e| format!("footer metadata at byte {}: {e}", t.at))
}

/// Appends `v` as a compact-protocol varint (for tests that write Thrift by hand).
#[cfg(test)]
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
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
