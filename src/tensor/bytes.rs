//! Tensors over bytes that something else owns, and tensors as rows of one buffer.
//!
//! A `Repr::Borrowed` tensor views `owner`'s bytes `range` as little-endian numbers,
//! without copying them. Three things use it:
//!
//! * a spilled sample read back from a decoded Parquet page (`persist/spill/`);
//! * a column of many samples copied once into one buffer, whose rows ([`Tensor::rows`])
//!   become the samples' fields (the Python bindings' `put_columns`);
//! * the way back: fields of a batch that are adjacent rows of one buffer stack
//!   ([`Tensor::stack`], [`Tensor::concat`]) into one tensor that views them, so a numpy
//!   column or an Arrow values buffer of a batch costs no copy.
//!
//! Adjacency is decided by identity (the same `owner`, `Arc::ptr_eq`) and byte ranges,
//! never by comparing addresses of separate allocations.

use super::{DType, Element, Repr, Scalar, Tensor, TensorData};
use crate::sync::Arc;
use ndarray::{ArcArray, Array, Axis, IxDyn};
use std::ops::Range;

/// Bytes a [`Tensor`] can view without copying them (a decoded page, a column of samples
/// copied once). They must not change while any tensor views them.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// An array viewing `owner`'s bytes `range`: `shape` values of `dtype`, little-endian and
/// aligned for it (checked when made).
pub(super) struct BorrowedTensor {
    pub(super) dtype: DType,
    pub(super) shape: Vec<usize>,
    pub(super) lengths: Option<Vec<usize>>,
    pub(super) owner: SharedBytes,
    pub(super) range: Range<usize>,
}

impl BorrowedTensor {
    pub(super) fn bytes(&self) -> &[u8] {
        (*self.owner)
            .as_ref()
            .get(self.range.clone())
            .unwrap_or(&[])
    }

    /// The values as `T`, if `T` is this tensor's element type.
    pub(super) fn values<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        T::cast(self.bytes())
    }

    /// An owned copy of the values.
    pub(super) fn owned<T: Element>(&self) -> ArcArray<T, IxDyn> {
        self.values::<T>()
            .and_then(|v| Array::from_shape_vec(IxDyn(&self.shape), v.to_vec()).ok())
            // Unreachable: the dtype, length and alignment were checked when it was made.
            .map_or_else(
                || ArcArray::from_vec(Vec::new()).into_dyn(),
                Array::into_shared,
            )
    }
}

impl std::fmt::Debug for BorrowedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BorrowedTensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("lengths", &self.lengths)
            .field("bytes", &self.range.len())
            .finish()
    }
}

/// `len` bytes in a buffer aligned for every element type (8 bytes), zero-filled.
struct Words {
    words: Vec<u64>,
    len: usize,
}

impl AsRef<[u8]> for Words {
    fn as_ref(&self) -> &[u8] {
        let bytes: &[u8] = bytemuck::cast_slice(&self.words);
        bytes.get(..self.len).unwrap_or(bytes)
    }
}

/// A copy of `parts`' bytes, back to back, in one 8-byte aligned buffer.
///
/// The allocator hands out blocks aligned to at least 16 bytes in practice, so a plain
/// byte vector filled by `extend_from_slice` (a `memcpy`, with nothing zeroed first)
/// nearly always is one; only if it is not does the copy go again into words.
fn aligned_copy<'a>(parts: impl Iterator<Item = &'a [u8]> + Clone, len: usize) -> SharedBytes {
    let mut bytes: Vec<u8> = Vec::with_capacity(len);
    for part in parts.clone() {
        bytes.extend_from_slice(part);
    }
    if bytes.as_ptr().align_offset(8) == 0 {
        return Arc::new(bytes);
    }
    let mut words = vec![0u64; len.div_ceil(8)];
    let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
    let mut at = 0;
    for part in parts {
        if let Some(d) = dst.get_mut(at..at + part.len()) {
            d.copy_from_slice(part);
        }
        at += part.len();
    }
    Arc::new(Words { words, len })
}

/// A tensor (kept alive) as the owner of its own bytes, so its rows can view them.
struct TensorBytes(Tensor);

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes().unwrap_or(&[])
    }
}

impl Tensor {
    /// A tensor viewing `owner`'s bytes `range` as little-endian values of `dtype` with
    /// `shape` (at least one dimension), without copying them; `owner` stays alive as long
    /// as the tensor (or any clone) does.
    ///
    /// `None` unless `dtype` is a plain number type (`i32`, `i64`, `f32`, `f64`, `u8`), the
    /// host is little-endian, the bytes are exactly the values and aligned for them, and
    /// `lengths` (if any) add up to the first dimension.
    ///
    /// ```
    /// use rollout_buffer::{DType, SharedBytes, Tensor};
    /// use std::sync::Arc;
    /// let owner: SharedBytes = Arc::new(vec![1u8, 2, 3, 4, 5, 6]);
    /// let t = Tensor::from_shared_bytes(DType::U8, vec![2, 3], None, owner, 0..6).expect("fits");
    /// assert_eq!(t.array::<u8>().map(|a| a[[1, 0]]), Some(4));
    /// ```
    pub fn from_shared_bytes(
        dtype: DType,
        shape: Vec<usize>,
        lengths: Option<Vec<usize>>,
        owner: SharedBytes,
        range: Range<usize>,
    ) -> Option<Self> {
        let n = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
        let rows = *shape.first()?;
        if let Some(l) = &lengths {
            let sum = l.iter().try_fold(0usize, |acc, &x| acc.checked_add(x));
            if sum != Some(rows) {
                return None;
            }
        }
        let b = BorrowedTensor {
            dtype,
            shape,
            lengths,
            owner,
            range,
        };
        let fits = match dtype {
            DType::I32 => b.values::<i32>().map(<[_]>::len),
            DType::I64 => b.values::<i64>().map(<[_]>::len),
            DType::F32 => b.values::<f32>().map(<[_]>::len),
            DType::F64 => b.values::<f64>().map(<[_]>::len),
            DType::U8 => b.values::<u8>().map(<[_]>::len),
            DType::Bool | DType::Str => None,
        };
        (fits == Some(n) && b.bytes().len() == b.range.len()).then(|| Self {
            repr: Repr::Borrowed(Arc::new(b)),
        })
    }

    /// The values' bytes, without copying: little-endian numbers (a `bool` as one byte, 0
    /// or 1), in row-major order. `None` for strings, for an array not laid out contiguously
    /// in row-major order, and on big-endian hosts.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        if cfg!(target_endian = "big") {
            return None;
        }
        match &self.repr {
            Repr::Borrowed(b) => Some(b.bytes()),
            Repr::Scalar(s) => Some(match s {
                Scalar::I32(v) => bytemuck::bytes_of(v),
                Scalar::I64(v) => bytemuck::bytes_of(v),
                Scalar::F32(v) => bytemuck::bytes_of(v),
                Scalar::F64(v) => bytemuck::bytes_of(v),
                Scalar::Bool(v) => bytemuck::bytes_of(v),
                Scalar::U8(v) => bytemuck::bytes_of(v),
            }),
            Repr::Array(a) => match &a.data {
                TensorData::I32(a) => a.as_slice().map(bytemuck::cast_slice),
                TensorData::I64(a) => a.as_slice().map(bytemuck::cast_slice),
                TensorData::F32(a) => a.as_slice().map(bytemuck::cast_slice),
                TensorData::F64(a) => a.as_slice().map(bytemuck::cast_slice),
                TensorData::Bool(a) => a.as_slice().map(bytemuck::cast_slice),
                TensorData::U8(a) => a.as_slice().map(<[u8]>::as_ref),
                TensorData::Str(_) => None,
            },
        }
    }

    /// The tensor's slices along its first axis, as tensors that share its memory (no copy
    /// for numbers; strings and booleans share the array too). A column of `n` samples'
    /// fields, copied once, becomes `n` fields this way: a `[n, k]` column gives `[k]`
    /// rows, a `[n]` column scalars. `None` for a 0-dimensional or a ragged tensor.
    pub fn rows(&self) -> Option<Vec<Tensor>> {
        if self.lengths().is_some() {
            return None;
        }
        let (&n, rest) = self.shape().split_first()?;
        if rest.is_empty() {
            // One value per row: inline scalars (strings as 0-d arrays), no allocation
            // for numbers.
            return self.scalars();
        }
        if let Some(rows) = self.byte_rows(n, rest) {
            return Some(rows);
        }
        let parts = self.split(&vec![1; n])?;
        parts.iter().map(Tensor::squeeze_first).collect()
    }

    /// The values of a 1-d tensor, one scalar tensor each.
    fn scalars(&self) -> Option<Vec<Tensor>> {
        macro_rules! each {
            ($t:ty) => {
                self.array::<$t>()?
                    .iter()
                    .cloned()
                    .map(Tensor::scalar)
                    .collect()
            };
        }
        Some(match self.dtype() {
            DType::I32 => each!(i32),
            DType::I64 => each!(i64),
            DType::F32 => each!(f32),
            DType::F64 => each!(f64),
            DType::U8 => each!(u8),
            DType::Bool => each!(bool),
            DType::Str => each!(String),
        })
    }

    /// [`Self::rows`] of numbers: `[...rest]` views of one owner's byte ranges.
    fn byte_rows(&self, n: usize, rest: &[usize]) -> Option<Vec<Tensor>> {
        let dtype = self.dtype();
        let (owner, range) = self.byte_owner()?;
        let row_bytes = range.len().checked_div(n).unwrap_or(0);
        (0..n)
            .map(|i| {
                let start = range.start + i * row_bytes;
                Tensor::from_shared_bytes(
                    dtype,
                    rest.to_vec(),
                    None,
                    SharedBytes::clone(&owner),
                    start..start + row_bytes,
                )
            })
            .collect()
    }

    /// The owner and range of this tensor's bytes, for views of parts of it: its own owner
    /// when it already views one, else itself (kept alive) when its bytes are contiguous.
    fn byte_owner(&self) -> Option<(SharedBytes, Range<usize>)> {
        match &self.repr {
            Repr::Borrowed(b) => Some((SharedBytes::clone(&b.owner), b.range.clone())),
            Repr::Array(_) => {
                let len = self.as_bytes()?.len();
                Some((Arc::new(TensorBytes(self.clone())) as SharedBytes, 0..len))
            }
            Repr::Scalar(_) => None,
        }
    }

    /// The tensor cut along its first axis into consecutive parts of `lengths[i]` rows
    /// (`[lengths[i], ...rest]` each), sharing its memory as [`Self::rows`] does: a
    /// variable-length column (values and offsets) becomes its samples' fields this way.
    /// `None` for a 0-dimensional or ragged tensor, or lengths that do not add up to the
    /// first dimension.
    pub fn split(&self, lengths: &[usize]) -> Option<Vec<Tensor>> {
        if self.lengths().is_some() {
            return None;
        }
        let (&n, rest) = self.shape().split_first()?;
        let total = lengths
            .iter()
            .try_fold(0usize, |acc, &l| acc.checked_add(l))?;
        if total != n {
            return None;
        }
        if let Some(parts) = self.byte_parts(lengths, rest) {
            return Some(parts);
        }
        let data = self.to_data();
        macro_rules! split {
            ($a:expr) => {{
                let mut start = 0;
                lengths
                    .iter()
                    .map(|&len| {
                        let part = $a
                            .clone()
                            .slice_axis_move(Axis(0), (start..start + len).into());
                        start += len;
                        Tensor::from(part)
                    })
                    .collect()
            }};
        }
        Some(match data {
            TensorData::I32(a) => split!(a),
            TensorData::I64(a) => split!(a),
            TensorData::F32(a) => split!(a),
            TensorData::F64(a) => split!(a),
            TensorData::Bool(a) => split!(a),
            TensorData::U8(a) => split!(a),
            TensorData::Str(a) => split!(a),
        })
    }

    /// [`Self::split`] for numbers: views of one owner's byte ranges.
    fn byte_parts(&self, lengths: &[usize], rest: &[usize]) -> Option<Vec<Tensor>> {
        let dtype = self.dtype();
        let (owner, range) = self.byte_owner()?;
        let n: usize = lengths.iter().sum();
        let row_bytes = range.len().checked_div(n).unwrap_or(0);
        let mut start = range.start;
        lengths
            .iter()
            .map(|&len| {
                let mut shape = Vec::with_capacity(rest.len() + 1);
                shape.push(len);
                shape.extend_from_slice(rest);
                let end = start + len * row_bytes;
                let part = Tensor::from_shared_bytes(
                    dtype,
                    shape,
                    None,
                    SharedBytes::clone(&owner),
                    start..end,
                );
                start = end;
                part
            })
            .collect()
    }

    /// A `[1, ...rest]` tensor as `rest` (a scalar for `[1]`), sharing its memory.
    fn squeeze_first(&self) -> Option<Tensor> {
        let (&1, rest) = self.shape().split_first()? else {
            return None;
        };
        if rest.is_empty() {
            return self.first_value().or_else(|| {
                let strings = self.array::<String>()?;
                strings.iter().next().cloned().map(Tensor::scalar)
            });
        }
        match &self.repr {
            Repr::Borrowed(b) => Tensor::from_shared_bytes(
                b.dtype,
                rest.to_vec(),
                None,
                SharedBytes::clone(&b.owner),
                b.range.clone(),
            ),
            _ => {
                macro_rules! squeeze {
                    ($a:expr) => {
                        Tensor::from($a.index_axis_move(Axis(0), 0))
                    };
                }
                Some(match self.to_data() {
                    TensorData::I32(a) => squeeze!(a),
                    TensorData::I64(a) => squeeze!(a),
                    TensorData::F32(a) => squeeze!(a),
                    TensorData::F64(a) => squeeze!(a),
                    TensorData::Bool(a) => squeeze!(a),
                    TensorData::U8(a) => squeeze!(a),
                    TensorData::Str(a) => squeeze!(a),
                })
            }
        }
    }

    /// The single value of a one-element numeric tensor, as an inline scalar.
    fn first_value(&self) -> Option<Tensor> {
        macro_rules! first {
            ($t:ty) => {
                self.array::<$t>()?
                    .iter()
                    .next()
                    .copied()
                    .map(Tensor::scalar)
            };
        }
        match self.dtype() {
            DType::I32 => first!(i32),
            DType::I64 => first!(i64),
            DType::F32 => first!(f32),
            DType::F64 => first!(f64),
            DType::U8 => first!(u8),
            DType::Bool => first!(bool),
            DType::Str => None,
        }
    }

    /// `parts` (one element type, one shape, none ragged) as one tensor of shape
    /// `[parts.len(), ...shape]`. When they are adjacent rows of one buffer (as
    /// [`Self::rows`] makes them), the result views that buffer and nothing is copied;
    /// otherwise their values are copied once. `None` when the parts differ in type, shape
    /// or raggedness, or there are none.
    pub fn stack(parts: &[&Tensor]) -> Option<Tensor> {
        let first = parts.first()?;
        let inner = first.shape();
        let same =
            |t: &&Tensor| t.dtype() == first.dtype() && t.shape() == inner && t.lengths().is_none();
        if !parts.iter().all(same) {
            return None;
        }
        let mut shape = Vec::with_capacity(inner.len() + 1);
        shape.push(parts.len());
        shape.extend_from_slice(inner);
        Self::joined(parts, shape)
    }

    /// `parts` (one element type, shapes equal but for the first dimension, none ragged)
    /// back to back along the first axis, and each part's first dimension (a batch's
    /// variable-length field as values and lengths). Views their buffer when they are
    /// adjacent ranges of one, as [`Self::stack`]; `None` when they do not fit together.
    pub fn concat(parts: &[&Tensor]) -> Option<(Tensor, Vec<usize>)> {
        let first = parts.first()?;
        let (_, rest) = first.shape().split_first()?;
        let fits = |t: &&Tensor| {
            t.dtype() == first.dtype()
                && t.lengths().is_none()
                && t.shape().split_first().is_some_and(|(_, r)| r == rest)
        };
        if !parts.iter().all(fits) {
            return None;
        }
        let lengths: Vec<usize> = parts.iter().map(|t| t.shape()[0]).collect();
        let mut shape = Vec::with_capacity(rest.len() + 1);
        shape.push(lengths.iter().sum());
        shape.extend_from_slice(rest);
        Some((Self::joined(parts, shape)?, lengths))
    }

    /// The owner and byte range `parts` view together, when they are adjacent, in order,
    /// ranges of one owner's bytes (and at least one part).
    pub(crate) fn shared_run(parts: &[&Tensor]) -> Option<(SharedBytes, Range<usize>)> {
        let mut run: Option<(&SharedBytes, Range<usize>)> = None;
        for t in parts {
            let Repr::Borrowed(b) = &t.repr else {
                return None;
            };
            run = match run {
                None => Some((&b.owner, b.range.clone())),
                Some((owner, range))
                    if Arc::ptr_eq(owner, &b.owner) && range.end == b.range.start =>
                {
                    Some((owner, range.start..b.range.end))
                }
                Some(_) => return None,
            };
        }
        run.map(|(owner, range)| (SharedBytes::clone(owner), range))
    }

    /// `parts`' values, in order, as one tensor of `shape`: a view when they are one run of
    /// an owner's bytes, else one copy.
    fn joined(parts: &[&Tensor], shape: Vec<usize>) -> Option<Tensor> {
        let dtype = parts.first()?.dtype();
        if let Some((owner, range)) = Self::shared_run(parts) {
            if let Some(t) = Self::from_shared_bytes(dtype, shape.clone(), None, owner, range) {
                return Some(t);
            }
        }
        if !matches!(dtype, DType::Bool | DType::Str) {
            let bytes: Option<Vec<&[u8]>> = parts.iter().map(|t| t.as_bytes()).collect();
            if let Some(bytes) = bytes {
                let len = bytes.iter().map(|b| b.len()).sum();
                let owner = aligned_copy(bytes.into_iter(), len);
                return Self::from_shared_bytes(dtype, shape, None, owner, 0..len);
            }
        }
        macro_rules! gather {
            ($t:ty) => {{
                let mut values: Vec<$t> = Vec::new();
                for p in parts {
                    values.extend(p.array::<$t>()?.iter().cloned());
                }
                Tensor::from(Array::from_shape_vec(IxDyn(&shape), values).ok()?)
            }};
        }
        Some(match dtype {
            DType::I32 => gather!(i32),
            DType::I64 => gather!(i64),
            DType::F32 => gather!(f32),
            DType::F64 => gather!(f64),
            DType::U8 => gather!(u8),
            DType::Bool => gather!(bool),
            DType::Str => gather!(String),
        })
    }

    /// `values` copied once into an aligned buffer this tensor views: `shape` values of
    /// `dtype` from little-endian `bytes`. `None` as [`Self::from_shared_bytes`].
    pub fn copy_from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Option<Tensor> {
        let owner = aligned_copy(std::iter::once(bytes), bytes.len());
        Self::from_shared_bytes(dtype, shape, None, owner, 0..bytes.len())
    }
}

/// `bytes` (zero-padded to whole words) in an 8-byte aligned buffer, as a decoded page
/// would hold them: for tests of tensors viewing shared bytes.
#[cfg(test)]
pub(crate) fn aligned_bytes(bytes: &[u8]) -> SharedBytes {
    struct Words(Vec<u64>);
    impl AsRef<[u8]> for Words {
        fn as_ref(&self) -> &[u8] {
            bytemuck::cast_slice(&self.0)
        }
    }
    let words = bytes
        .chunks(8)
        .map(|c| {
            let mut word = [0u8; 8];
            word[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(word)
        })
        .collect();
    Arc::new(Words(words))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `i32` 0..12 little-endian, 8-byte aligned.
    fn words() -> SharedBytes {
        let ints: Vec<i32> = (0..12).collect();
        aligned_bytes(bytemuck::cast_slice(&ints))
    }

    #[test]
    fn borrowed_tensors_behave_as_owned_ones() {
        if cfg!(target_endian = "big") {
            assert!(
                Tensor::from_shared_bytes(DType::I32, vec![12], None, words(), 0..48).is_none()
            );
            return;
        }
        let t =
            Tensor::from_shared_bytes(DType::I32, vec![3, 4], None, words(), 0..48).expect("view");
        let owned = Tensor::from(Array::from_shape_vec((3, 4), (0..12).collect()).expect("shape"));
        assert_eq!(t, owned);
        assert_eq!(
            (t.dtype(), t.shape(), t.nbytes()),
            (DType::I32, &[3, 4][..], 48)
        );
        assert_eq!(t.array::<i32>().map(|a| a[[2, 1]]), Some(9));
        assert!(t.array::<f32>().is_none());
        assert_eq!(t.to_data(), owned.to_data());
        assert_eq!(t.scalar_value::<i32>(), None);
        // Ragged: sequences, and re-packing with other lengths.
        let r = Tensor::from_shared_bytes(DType::I32, vec![6], Some(vec![2, 4]), words(), 8..32)
            .expect("view");
        let second = r
            .sequence::<i32>(1)
            .map(|s| s.iter().copied().collect::<Vec<_>>());
        assert_eq!(second, Some(vec![4, 5, 6, 7]));
        assert_eq!(r.sequence::<i32>(2), None);
        let repacked = Tensor::ragged(r.clone(), vec![3, 3]).expect("ragged");
        assert_eq!(repacked.lengths(), Some(&[3, 3][..]));
        assert_eq!(repacked.array::<i32>(), r.array::<i32>());
    }

    #[test]
    fn borrowed_tensors_are_refused_unless_they_fit() {
        let make = |dtype, shape: Vec<usize>, lengths, range| {
            Tensor::from_shared_bytes(dtype, shape, lengths, words(), range)
        };
        // Wrong length, misaligned, out of range, bools, zero dimensions, bad lengths.
        assert!(make(DType::I32, vec![5], None, 0..24).is_none());
        assert!(make(DType::I32, vec![2], None, 2..10).is_none());
        assert!(make(DType::I32, vec![20], None, 0..80).is_none());
        assert!(make(DType::Bool, vec![8], None, 0..8).is_none());
        assert!(make(DType::I32, vec![], None, 0..4).is_none());
        assert!(make(DType::I32, vec![4], Some(vec![1, 2]), 0..16).is_none());
        assert!(make(DType::I64, vec![6], None, 0..48).is_some() || cfg!(target_endian = "big"));
    }

    fn column() -> Tensor {
        Tensor::from(
            Array::from_shape_vec((4, 3), (0..12).map(|i| i as f32).collect()).expect("shape"),
        )
    }

    #[test]
    fn rows_of_a_column_view_its_bytes_and_stack_back_without_a_copy() {
        if cfg!(target_endian = "big") {
            return;
        }
        let col = column();
        let rows = col.rows().expect("rows");
        assert_eq!(rows.len(), 4);
        assert_eq!(
            rows[2]
                .array::<f32>()
                .map(|a| a.iter().copied().collect::<Vec<_>>()),
            Some(vec![6.0, 7.0, 8.0])
        );
        let base = col.as_bytes().expect("bytes").as_ptr();
        // Each row views the column's own memory.
        assert_eq!(
            rows[1].as_bytes().map(|b| b.as_ptr()),
            Some(base.wrapping_add(12))
        );
        let refs: Vec<&Tensor> = rows.iter().collect();
        let back = Tensor::stack(&refs).expect("stacks");
        assert_eq!(back, col);
        assert_eq!(
            back.as_bytes().map(|b| b.as_ptr()),
            Some(base),
            "a view, not a copy"
        );
        // A run that skips a row, or is out of order, is copied instead (and still right).
        let gapped = Tensor::stack(&[&rows[0], &rows[2]]).expect("stacks");
        assert_ne!(gapped.as_bytes().map(|b| b.as_ptr()), Some(base));
        assert_eq!(
            gapped
                .array::<f32>()
                .map(|a| a.iter().copied().collect::<Vec<_>>()),
            Some(vec![0.0, 1.0, 2.0, 6.0, 7.0, 8.0])
        );
        let swapped = Tensor::stack(&[&rows[1], &rows[0]]).expect("stacks");
        assert_eq!(swapped.array::<f32>().map(|a| a[[0, 0]]), Some(3.0));
    }

    #[test]
    fn rows_of_other_types_and_shapes() {
        let scalars = Tensor::from(vec![1.5f64, 2.5]).rows().expect("rows");
        assert_eq!(scalars[1].scalar_value::<f64>(), Some(2.5));
        assert_eq!(scalars[1].shape(), &[] as &[usize]);
        let flags = Tensor::from(ndarray::array![[true, false], [false, true]]);
        let rows = flags.rows().expect("rows");
        assert_eq!(
            rows[1]
                .array::<bool>()
                .map(|a| a.iter().copied().collect::<Vec<_>>()),
            Some(vec![false, true])
        );
        assert_eq!(Tensor::stack(&[&rows[0], &rows[1]]), Some(flags));
        let words = Tensor::from(vec!["a".to_string(), "b".to_string()])
            .rows()
            .expect("rows");
        assert_eq!(
            words[1].array::<String>().map(|a| a.iter().next().cloned()),
            Some(Some("b".into()))
        );
        assert!(Tensor::from(3i32).rows().is_none(), "a scalar has no rows");
        let ragged = Tensor::ragged(vec![1i32, 2, 3], vec![1, 2]).expect("ragged");
        assert!(ragged.rows().is_none());
    }

    #[test]
    fn split_cuts_variable_lengths_and_concat_joins_them_back() {
        let values = Tensor::copy_from_bytes(
            DType::I32,
            vec![6],
            &(0i32..6).flat_map(i32::to_le_bytes).collect::<Vec<u8>>(),
        );
        let Some(values) = values else {
            return; // big-endian host: no byte views
        };
        let parts = values.split(&[2, 0, 4]).expect("split");
        assert_eq!(
            parts.iter().map(|p| p.shape()[0]).collect::<Vec<_>>(),
            vec![2, 0, 4]
        );
        assert_eq!(parts[2], Tensor::from(vec![2i32, 3, 4, 5]));
        let refs: Vec<&Tensor> = parts.iter().collect();
        let (joined, lengths) = Tensor::concat(&refs).expect("concat");
        assert_eq!(lengths, vec![2, 0, 4]);
        assert_eq!(
            joined.as_bytes().map(|b| b.as_ptr()),
            values.as_bytes().map(|b| b.as_ptr())
        );
        assert!(values.split(&[2, 2]).is_none(), "lengths must add up");
        let words = Tensor::from(vec!["a".to_string(), "b".into(), "c".into()]);
        let parts = words.split(&[1, 2]).expect("split");
        assert_eq!(parts[1], Tensor::from(vec!["b".to_string(), "c".into()]));
    }

    #[test]
    fn concat_gives_values_and_lengths() {
        let a = Tensor::from(vec![1i64, 2, 3]);
        let b = Tensor::from(vec![4i64]);
        let (values, lengths) = Tensor::concat(&[&a, &b]).expect("concat");
        assert_eq!(lengths, vec![3, 1]);
        assert_eq!(values, Tensor::from(vec![1i64, 2, 3, 4]));
        // Views when the parts are adjacent ranges of one buffer.
        let bytes: Vec<u8> = (1i64..=4).flat_map(i64::to_le_bytes).collect();
        let owner = aligned_bytes(&bytes);
        let p =
            Tensor::from_shared_bytes(DType::I64, vec![3], None, SharedBytes::clone(&owner), 0..24);
        let q = Tensor::from_shared_bytes(
            DType::I64,
            vec![1],
            None,
            SharedBytes::clone(&owner),
            24..32,
        );
        if let (Some(p), Some(q)) = (p, q) {
            let (joined, _) = Tensor::concat(&[&p, &q]).expect("concat");
            assert_eq!(
                joined.as_bytes().map(|b| b.as_ptr()),
                Some((*owner).as_ref().as_ptr())
            );
            assert_eq!(joined, values);
        }
        // Parts that do not fit together.
        assert!(Tensor::concat(&[&a, &Tensor::from(vec![1i32])]).is_none());
        assert!(
            Tensor::stack(&[&a, &b]).is_none(),
            "stack needs equal shapes"
        );
        assert!(Tensor::stack(&[]).is_none());
    }

    #[test]
    fn copies_from_bytes_are_aligned_views() {
        let bytes: Vec<u8> = [1.0f64, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        // Misaligned on purpose: the copy is aligned whatever the source.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        let t = Tensor::copy_from_bytes(DType::F64, vec![2], &shifted[1..]);
        if cfg!(target_endian = "little") {
            assert_eq!(t, Some(Tensor::from(vec![1.0f64, -2.0])));
        }
        assert!(
            Tensor::copy_from_bytes(DType::F64, vec![3], &bytes).is_none(),
            "wrong length"
        );
    }
}
