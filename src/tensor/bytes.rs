//! Tensors over bytes that something else owns, and a tensor's own bytes.
//!
//! A `Repr::Borrowed` tensor views `owner`'s bytes `range` as little-endian numbers,
//! without copying them. Three things use it: a spilled sample read back from a decoded
//! Parquet page (`persist/spill/`); a column of many samples copied once into one buffer
//! (`rows.rs`); and the way back, fields of a batch joined into one tensor that views
//! their buffer (`rows.rs`). This file owns the view itself, the aligned copies views are
//! made over, and [`Tensor::as_bytes`], a tensor's bytes without a copy.

use super::{DType, Element, Repr, Scalar, Tensor, TensorData};
use crate::sync::Arc;
use ndarray::{ArcArray, Array, IxDyn};
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
pub(super) fn aligned_copy<'a>(
    parts: impl Iterator<Item = &'a [u8]> + Clone,
    len: usize,
) -> SharedBytes {
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
pub(super) struct TensorBytes(pub(super) Tensor);

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
    /// // Six bytes fill a 2 x 3 `u8` tensor exactly, so the view cannot be refused.
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
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
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
