//! A reader of Thrift compact-protocol bytes (Parquet's page headers and footers), which
//! spends at least a byte on every value it steps over, so it ends within its bytes: the
//! crate's own page decoder (`pages.rs`) reads page headers with it, and the checks of
//! `checks.rs` walk footers and page headers with it before the `parquet` reader sees them.

// Thrift compact protocol types.
pub(super) const BOOL_TRUE: u8 = 1;
pub(super) const BOOL_FALSE: u8 = 2;
pub(super) const BYTE: u8 = 3;
pub(super) const I16: u8 = 4;
pub(super) const I32: u8 = 5;
pub(super) const I64: u8 = 6;
pub(super) const DOUBLE: u8 = 7;
pub(super) const BINARY: u8 = 8;
pub(super) const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
pub(super) const STRUCT: u8 = 12;

/// Nesting deeper than this is refused (a page header nests three levels, a footer six).
pub(super) const MAX_DEPTH: usize = 16;

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
                let (element, n) = self.collection()?;
                if n > 0 {
                    refuse_booleans(element)?;
                }
                for _ in 0..n {
                    self.skip(element, depth + 1, false)?;
                }
            }
            MAP => {
                let n = self.varint()?;
                if n > 0 {
                    let kinds = self.byte()?;
                    refuse_booleans(kinds >> 4)?;
                    refuse_booleans(kinds & 0x0f)?;
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

    /// A list's or set's header: its element type and length.
    pub(super) fn collection(&mut self) -> Result<(u8, u64), String> {
        let head = self.byte()?;
        let n = match head >> 4 {
            15 => self.varint()?,
            n => u64::from(n),
        };
        Ok((head & 0x0f, n))
    }

    fn advance(&mut self, n: usize) -> Result<(), String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        self.at = end.ok_or_else(|| "header truncated".to_owned())?;
        Ok(())
    }
}

/// Refuses booleans as a collection's elements (or a map's keys or values): the `parquet`
/// decoder steps over such a collection without reading the byte each element takes, so
/// it would read what follows differently from this reader (see `shapes.rs`).
fn refuse_booleans(element: u8) -> Result<(), String> {
    match element {
        BOOL_TRUE | BOOL_FALSE => Err("a collection of booleans, which the parquet decoder \
             steps over unread"
            .to_owned()),
        _ => Ok(()),
    }
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
