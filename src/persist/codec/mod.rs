//! The binary encoding of log records and of samples in segments.
//!
//! Little-endian, length-prefixed, no schema: a record says what it is in its first byte.
//! Decoding never trusts a length it reads: every count is checked against the bytes left
//! before anything is allocated, so a damaged file gives an error, never a panic or a huge
//! allocation. Tensors keep their element type, shape and ragged lengths exactly.

use crate::buffer::{AuxWrite, Record, SpillPart};
use crate::exit::ExitReason;
use crate::sample::{FieldKey, MetaValue, Patch, Sample, SampleId};
use crate::sync::Arc;
use crate::tensor::{Tensor, TensorData};
use ndarray::{ArcArray, Array, IxDyn};

mod record;
#[cfg(test)]
mod tests;

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use record::take_record;
pub(crate) use record::{put_parts, put_record, take_parts, take_replayed, Replayed};

/// What is wrong with bytes that do not decode.
pub(crate) type Bad = String;

/// Appends values to a byte buffer.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// A count or length (no buffer holds 4 G items).
    pub(crate) fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }
    pub(crate) fn str(&mut self, s: &str) {
        self.len(s.len());
        self.buf.extend_from_slice(s.as_bytes());
    }
}

/// Reads values back, failing (never panicking) on bytes that run out or make no sense.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub(crate) fn position(&self) -> usize {
        self.pos
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        if n > self.remaining() {
            return Err(format!(
                "needs {n} bytes at offset {} but {} remain",
                self.pos,
                self.remaining()
            ));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Bad> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Bad> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, Bad> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Bad> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A count of items each at least `min_size` bytes long, checked against what is left.
    pub(crate) fn count(&mut self, min_size: usize) -> Result<usize, Bad> {
        let n = self.u64()?;
        let fits = usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(min_size.max(1)) <= self.remaining());
        fits.ok_or_else(|| {
            format!(
                "count {n} at offset {} exceeds the {} bytes left",
                self.pos,
                self.remaining()
            )
        })
    }
    pub(crate) fn str(&mut self) -> Result<&'a str, Bad> {
        let n = self.count(1)?;
        std::str::from_utf8(self.bytes(n)?).map_err(|e| format!("invalid UTF-8: {e}"))
    }
}

// ----- tensors ---------------------------------------------------------------------------

/// Element types on the wire: a tag and a fixed little-endian encoding.
trait Wire: Sized + Clone {
    const TAG: u8;
    const SIZE: usize;
    fn put(&self, w: &mut Writer);
    fn take(r: &mut Reader<'_>) -> Result<Self, Bad>;
    /// Encodes a contiguous run of values (numbers override this with a loop the
    /// compiler vectorises).
    fn put_slice(values: &[Self], w: &mut Writer) {
        values.iter().for_each(|v| v.put(w));
    }
    /// Decodes `n` values (checked against the bytes left by the caller).
    fn take_vec(r: &mut Reader<'_>, n: usize) -> Result<Vec<Self>, Bad> {
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            values.push(Self::take(r)?);
        }
        Ok(values)
    }
}

macro_rules! wire_number {
    ($ty:ty, $tag:expr) => {
        impl Wire for $ty {
            const TAG: u8 = $tag;
            const SIZE: usize = std::mem::size_of::<$ty>();
            fn put(&self, w: &mut Writer) {
                w.buf.extend_from_slice(&self.to_le_bytes());
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, Bad> {
                Ok(<$ty>::from_le_bytes(r.array()?))
            }
            fn put_slice(values: &[Self], w: &mut Writer) {
                const N: usize = std::mem::size_of::<$ty>();
                let start = w.buf.len();
                w.buf.resize(start + values.len() * N, 0);
                for (out, v) in w.buf[start..].chunks_exact_mut(N).zip(values) {
                    out.copy_from_slice(&v.to_le_bytes());
                }
            }
            fn take_vec(r: &mut Reader<'_>, n: usize) -> Result<Vec<Self>, Bad> {
                const N: usize = std::mem::size_of::<$ty>();
                let bytes = r.bytes(n.saturating_mul(N))?;
                Ok(bytes
                    .chunks_exact(N)
                    .map(|c| {
                        let mut a = [0u8; N];
                        a.copy_from_slice(c);
                        <$ty>::from_le_bytes(a)
                    })
                    .collect())
            }
        }
    };
}
wire_number!(i32, 1);
wire_number!(i64, 2);
wire_number!(f32, 3);
wire_number!(f64, 4);
wire_number!(u8, 6);

impl Wire for bool {
    const TAG: u8 = 5;
    const SIZE: usize = 1;
    fn put(&self, w: &mut Writer) {
        w.u8(u8::from(*self));
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, Bad> {
        Ok(r.u8()? != 0)
    }
}

impl Wire for String {
    const TAG: u8 = 7;
    const SIZE: usize = 8;
    fn put(&self, w: &mut Writer) {
        w.str(self);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, Bad> {
        r.str().map(str::to_owned)
    }
}

fn put_array<T: Wire>(w: &mut Writer, a: &ArcArray<T, IxDyn>) {
    w.u8(T::TAG);
    w.len(a.ndim());
    for &d in a.shape() {
        w.len(d);
    }
    match a.as_slice() {
        Some(values) => T::put_slice(values, w),
        None => a.iter().for_each(|v| v.put(w)),
    }
}

/// An array's shape and number of values, checked against the bytes left for values of
/// `size` bytes each.
pub(crate) fn take_shape(r: &mut Reader<'_>, size: usize) -> Result<(Vec<usize>, usize), Bad> {
    let ndim = r.count(8)?;
    let mut shape = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        shape.push(r.count(0)?);
    }
    let n = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n.saturating_mul(size) <= r.remaining())
        .ok_or_else(|| format!("shape {shape:?} exceeds the {} bytes left", r.remaining()))?;
    Ok((shape, n))
}

/// The element type of a tag and its size, for the plain number types.
pub(crate) fn number_tag(tag: u8) -> Option<(crate::tensor::DType, usize)> {
    use crate::tensor::DType;
    Some(match tag {
        i32::TAG => (DType::I32, 4),
        i64::TAG => (DType::I64, 8),
        f32::TAG => (DType::F32, 4),
        f64::TAG => (DType::F64, 8),
        u8::TAG => (DType::U8, 1),
        _ => return None,
    })
}

fn take_array<T: Wire + crate::tensor::Element>(r: &mut Reader<'_>) -> Result<Tensor, Bad> {
    let (shape, n) = take_shape(r, T::SIZE)?;
    let ndim = shape.len();
    let mut values = T::take_vec(r, n)?;
    if ndim == 0 {
        if let Some(v) = values.pop() {
            return Ok(Tensor::scalar(v));
        }
    }
    Array::from_shape_vec(IxDyn(&shape), values)
        .map(Tensor::from)
        .map_err(|e| format!("bad shape {shape:?}: {e}"))
}

pub(crate) fn put_tensor(w: &mut Writer, t: &Tensor) {
    match t.to_data() {
        TensorData::I32(a) => put_array(w, &a),
        TensorData::I64(a) => put_array(w, &a),
        TensorData::F32(a) => put_array(w, &a),
        TensorData::F64(a) => put_array(w, &a),
        TensorData::Bool(a) => put_array(w, &a),
        TensorData::U8(a) => put_array(w, &a),
        TensorData::Str(a) => put_array(w, &a),
        // A variant added later without an encoding here.
        #[allow(unreachable_patterns)]
        _ => w.u8(0),
    }
    match t.lengths() {
        Some(lengths) => {
            w.u8(1);
            w.len(lengths.len());
            lengths.iter().for_each(|&l| w.len(l));
        }
        None => w.u8(0),
    }
}

pub(crate) fn take_tensor(r: &mut Reader<'_>) -> Result<Tensor, Bad> {
    let tensor = match r.u8()? {
        i32::TAG => take_array::<i32>(r)?,
        i64::TAG => take_array::<i64>(r)?,
        f32::TAG => take_array::<f32>(r)?,
        f64::TAG => take_array::<f64>(r)?,
        bool::TAG => take_array::<bool>(r)?,
        u8::TAG => take_array::<u8>(r)?,
        String::TAG => take_array::<String>(r)?,
        tag => return Err(format!("unknown element type tag {tag}")),
    };
    match take_lengths(r)? {
        None => Ok(tensor),
        Some(lengths) => Tensor::ragged(tensor, lengths).map_err(|e| e.to_string()),
    }
}

/// The sequence lengths after a tensor's values (`None`: not ragged).
pub(crate) fn take_lengths(r: &mut Reader<'_>) -> Result<Option<Vec<usize>>, Bad> {
    if r.u8()? == 0 {
        return Ok(None);
    }
    let n = r.count(8)?;
    let mut lengths = Vec::with_capacity(n);
    for _ in 0..n {
        lengths.push(r.count(0)?);
    }
    Ok(Some(lengths))
}

// ----- samples and patches ---------------------------------------------------------------

fn put_meta(w: &mut Writer, meta: &std::collections::BTreeMap<String, MetaValue>) {
    w.len(meta.len());
    for (k, v) in meta {
        w.str(k);
        match v {
            MetaValue::Int(i) => {
                w.u8(0);
                w.u64(*i as u64);
            }
            MetaValue::Float(f) => {
                w.u8(1);
                w.u64(f.to_bits());
            }
            MetaValue::Str(s) => {
                w.u8(2);
                w.str(s);
            }
            MetaValue::Bool(b) => {
                w.u8(3);
                w.u8(u8::from(*b));
            }
        }
    }
}

fn take_meta(r: &mut Reader<'_>) -> Result<Vec<(String, MetaValue)>, Bad> {
    let n = r.count(10)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let key = r.str()?.to_owned();
        let value = match r.u8()? {
            0 => MetaValue::Int(r.u64()? as i64),
            1 => MetaValue::Float(f64::from_bits(r.u64()?)),
            2 => MetaValue::Str(r.str()?.to_owned()),
            3 => MetaValue::Bool(r.u8()? != 0),
            tag => return Err(format!("unknown metadata tag {tag}")),
        };
        out.push((key, value));
    }
    Ok(out)
}

fn put_fields<'a>(w: &mut Writer, n: usize, fields: impl Iterator<Item = (&'a str, &'a Tensor)>) {
    w.len(n);
    for (k, t) in fields {
        w.str(k);
        put_tensor(w, t);
    }
}

fn take_fields(r: &mut Reader<'_>) -> Result<Vec<(String, Tensor)>, Bad> {
    let n = r.count(10)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let key = r.str()?.to_owned();
        out.push((key, take_tensor(r)?));
    }
    Ok(out)
}

pub(crate) fn put_sample(w: &mut Writer, s: &Sample) {
    w.str(s.id.as_str());
    w.u64(s.birth.unwrap_or(0));
    put_fields(w, s.fields.len(), s.fields());
    put_meta(w, s.metadata());
}

pub(crate) fn take_sample(r: &mut Reader<'_>) -> Result<Sample, Bad> {
    let mut s = Sample::new(r.str()?);
    let birth = r.u64()?;
    if birth > 0 {
        s = s.birth(birth);
    }
    for (k, t) in take_fields(r)? {
        s = s.with(k, t);
    }
    for (k, v) in take_meta(r)? {
        s = s.meta(&k, v);
    }
    Ok(s)
}

/// Steps over an encoded sample, returning its id and birth: recovery keeps the bytes of
/// samples it only moves into a checkpoint, instead of decoding their tensors.
pub(crate) fn skip_sample(r: &mut Reader<'_>) -> Result<(SampleId, u64), Bad> {
    let id = SampleId::from(r.str()?);
    let birth = r.u64()?;
    for _ in 0..r.count(10)? {
        r.str()?;
        skip_tensor(r)?;
    }
    for _ in 0..r.count(10)? {
        r.str()?;
        match r.u8()? {
            0 | 1 => {
                r.u64()?;
            }
            2 => {
                r.str()?;
            }
            3 => {
                r.u8()?;
            }
            tag => return Err(format!("unknown metadata tag {tag}")),
        }
    }
    Ok((id, birth))
}

fn skip_tensor(r: &mut Reader<'_>) -> Result<(), Bad> {
    let size = match r.u8()? {
        i32::TAG | f32::TAG => Some(4),
        i64::TAG | f64::TAG => Some(8),
        bool::TAG | u8::TAG => Some(1),
        String::TAG => None,
        tag => return Err(format!("unknown element type tag {tag}")),
    };
    let ndim = r.count(8)?;
    let mut n = 1usize;
    for _ in 0..ndim {
        n = n.saturating_mul(r.count(0)?);
    }
    match size {
        Some(size) => {
            r.bytes(n.saturating_mul(size))?;
        }
        None => {
            for _ in 0..n {
                r.str()?;
            }
        }
    }
    if r.u8()? != 0 {
        let lengths = r.count(8)?;
        r.bytes(lengths * 8)?;
    }
    Ok(())
}
