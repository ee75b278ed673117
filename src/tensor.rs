//! `Tensor`: one field of a sample, an immutable n-dimensional array shared by `Arc`.
//!
//! A tensor is an ndarray of one of the element types RL pipelines move around (token ids,
//! logprobs, rewards, masks, bytes, strings), optionally *ragged*: several sequences of
//! different lengths packed along the first axis, with their lengths kept beside them
//! (AReaL's `seqlens`). Cloning a tensor never copies its data, which is what lets a batch
//! be a consistent snapshot while later amends replace fields.

use crate::error::{Error, Result};
use crate::sync::Arc;
use ndarray::{ArcArray, Array, ArrayViewD, Dimension, IxDyn};

/// The element type of a [`Tensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// `i32`, e.g. token ids.
    I32,
    /// `i64`.
    I64,
    /// `f32`, e.g. logprobs.
    F32,
    /// `f64`, e.g. rewards.
    F64,
    /// `bool`, e.g. masks.
    Bool,
    /// `u8`, raw bytes.
    U8,
    /// UTF-8 strings.
    Str,
}

/// The array inside a [`Tensor`], by element type.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
#[allow(missing_docs)] // each variant is the array of its element type
pub enum TensorData {
    I32(ArcArray<i32, IxDyn>),
    I64(ArcArray<i64, IxDyn>),
    F32(ArcArray<f32, IxDyn>),
    F64(ArcArray<f64, IxDyn>),
    Bool(ArcArray<bool, IxDyn>),
    U8(ArcArray<u8, IxDyn>),
    Str(ArcArray<String, IxDyn>),
}

mod sealed {
    pub trait Sealed {}
}

/// Element types a [`Tensor`] can hold: `i32`, `i64`, `f32`, `f64`, `bool`, `u8`, `String`.
pub trait Element: Clone + sealed::Sealed + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Wraps an array of this element type.
    fn wrap(array: ArcArray<Self, IxDyn>) -> TensorData;
    /// The array, if `data` holds this element type.
    fn unwrap(data: &TensorData) -> Option<&ArcArray<Self, IxDyn>>;
}

macro_rules! element {
    ($ty:ty, $variant:ident) => {
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = DType::$variant;
            fn wrap(array: ArcArray<Self, IxDyn>) -> TensorData {
                TensorData::$variant(array)
            }
            fn unwrap(data: &TensorData) -> Option<&ArcArray<Self, IxDyn>> {
                match data {
                    TensorData::$variant(a) => Some(a),
                    _ => None,
                }
            }
        }
        impl From<$ty> for Tensor {
            /// A 0-dimensional (scalar) tensor.
            fn from(value: $ty) -> Self {
                Tensor::scalar(value)
            }
        }
        impl From<Vec<$ty>> for Tensor {
            /// A 1-dimensional tensor.
            fn from(values: Vec<$ty>) -> Self {
                Tensor::from(Array::from_vec(values))
            }
        }
    };
}

element!(i32, I32);
element!(i64, I64);
element!(f32, F32);
element!(f64, F64);
element!(bool, Bool);
element!(u8, U8);
element!(String, Str);

/// One field of a sample: an immutable, cheaply clonable n-dimensional array.
///
/// ```
/// use rollout_buffer::Tensor;
/// use ndarray::array;
///
/// let tokens = Tensor::from(vec![1i32, 2, 3]);
/// let logp = Tensor::from(array![[-0.5f32, -1.0], [-0.1, -2.0]]);
/// let reward = Tensor::from(1.0f64);
/// let two_answers = Tensor::ragged(vec![5i32, 6, 7, 8, 9], vec![2, 3]).unwrap();
/// assert_eq!(logp.shape(), &[2, 2]);
/// assert_eq!(reward.scalar_value::<f64>(), Some(1.0));
/// assert_eq!(two_answers.sequence::<i32>(1).unwrap().iter().copied().collect::<Vec<_>>(), vec![7, 8, 9]);
/// assert_eq!(tokens.array::<i32>().unwrap().len(), 3);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    data: TensorData,
    /// For ragged tensors: the length (along axis 0) of each packed sequence.
    lengths: Option<Arc<[usize]>>,
}

impl<T: Element, D: Dimension> From<Array<T, D>> for Tensor {
    fn from(array: Array<T, D>) -> Self {
        Self {
            data: T::wrap(array.into_dyn().into_shared()),
            lengths: None,
        }
    }
}

impl<T: Element, D: Dimension> From<ArcArray<T, D>> for Tensor {
    fn from(array: ArcArray<T, D>) -> Self {
        Self {
            data: T::wrap(array.into_dyn()),
            lengths: None,
        }
    }
}

impl From<&str> for Tensor {
    /// A 0-dimensional string tensor.
    fn from(value: &str) -> Self {
        Tensor::scalar(value.to_owned())
    }
}

impl Tensor {
    /// A 0-dimensional tensor holding one value.
    pub fn scalar<T: Element>(value: T) -> Self {
        Self::from(ndarray::arr0(value))
    }

    /// Several sequences packed along the first axis of `values`, with `lengths[i]` rows
    /// for sequence `i`. Fails when the lengths do not add up to the number of rows.
    pub fn ragged(values: impl Into<Tensor>, lengths: Vec<usize>) -> Result<Self> {
        let values: Tensor = values.into();
        let rows = values.shape().first().copied().unwrap_or(0);
        let sum = lengths
            .iter()
            .try_fold(0usize, |acc, &l| acc.checked_add(l));
        if values.shape().is_empty() || sum != Some(rows) {
            return Err(Error::RaggedLengths {
                sum: sum.unwrap_or(usize::MAX),
                rows,
            });
        }
        Ok(Self {
            data: values.data,
            lengths: Some(lengths.into()),
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.data {
            TensorData::I32(_) => DType::I32,
            TensorData::I64(_) => DType::I64,
            TensorData::F32(_) => DType::F32,
            TensorData::F64(_) => DType::F64,
            TensorData::Bool(_) => DType::Bool,
            TensorData::U8(_) => DType::U8,
            TensorData::Str(_) => DType::Str,
        }
    }

    /// The shape of the (packed) array.
    pub fn shape(&self) -> &[usize] {
        match &self.data {
            TensorData::I32(a) => a.shape(),
            TensorData::I64(a) => a.shape(),
            TensorData::F32(a) => a.shape(),
            TensorData::F64(a) => a.shape(),
            TensorData::Bool(a) => a.shape(),
            TensorData::U8(a) => a.shape(),
            TensorData::Str(a) => a.shape(),
        }
    }

    /// The underlying array, by element type.
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// A view of the array, if it holds `T`.
    pub fn array<T: Element>(&self) -> Option<ArrayViewD<'_, T>> {
        T::unwrap(&self.data).map(|a| a.view())
    }

    /// The value of a 0-dimensional tensor holding `T`.
    pub fn scalar_value<T: Element>(&self) -> Option<T> {
        let a = T::unwrap(&self.data)?;
        if a.ndim() != 0 {
            return None;
        }
        a.first().cloned()
    }

    /// The string of a 0-dimensional string tensor.
    pub fn as_str(&self) -> Option<&str> {
        match &self.data {
            TensorData::Str(a) if a.ndim() == 0 => a.first().map(String::as_str),
            _ => None,
        }
    }

    /// The sequence lengths of a ragged tensor.
    pub fn lengths(&self) -> Option<&[usize]> {
        self.lengths.as_deref()
    }

    /// Sequence `i` of a ragged tensor holding `T`.
    pub fn sequence<T: Element>(&self, i: usize) -> Option<ArrayViewD<'_, T>> {
        let lengths = self.lengths.as_deref()?;
        let start: usize = lengths.get(..i)?.iter().sum();
        let len = *lengths.get(i)?;
        let a = T::unwrap(&self.data)?;
        Some(
            a.slice_axis(ndarray::Axis(0), (start..start + len).into())
                .into_dyn(),
        )
    }

    /// Approximate payload size in bytes (strings count their UTF-8 bytes).
    pub fn nbytes(&self) -> usize {
        let data = match &self.data {
            TensorData::I32(a) => a.len() * 4,
            TensorData::I64(a) => a.len() * 8,
            TensorData::F32(a) => a.len() * 4,
            TensorData::F64(a) => a.len() * 8,
            TensorData::Bool(a) => a.len(),
            TensorData::U8(a) => a.len(),
            TensorData::Str(a) => a.iter().map(String::len).sum(),
        };
        data + self.lengths.as_ref().map_or(0, |l| l.len() * 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn dtypes_and_shapes() {
        assert_eq!(Tensor::from(vec![1i64, 2]).dtype(), DType::I64);
        assert_eq!(Tensor::from(array![[true], [false]]).shape(), &[2, 1]);
        assert_eq!(Tensor::from(3u8).shape(), &[] as &[usize]);
        assert_eq!(Tensor::from("hi").as_str(), Some("hi"));
        assert_eq!(Tensor::from(2.5f32).scalar_value::<f32>(), Some(2.5));
        assert_eq!(Tensor::from(2.5f32).scalar_value::<f64>(), None);
        assert_eq!(Tensor::from(vec![1i32, 2]).scalar_value::<i32>(), None);
    }

    #[test]
    fn ragged_checks_lengths() {
        let t = Tensor::ragged(vec![1i32, 2, 3], vec![1, 2]);
        let t = t.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.lengths(), Some(&[1usize, 2][..]));
        assert_eq!(
            t.sequence::<i32>(0)
                .map(|v| v.iter().copied().collect::<Vec<_>>()),
            Some(vec![1])
        );
        assert!(t.sequence::<i32>(2).is_none());
        let bad = Tensor::ragged(array![[1i32], [2], [3]], vec![2, 2]);
        assert_eq!(bad, Err(Error::RaggedLengths { sum: 4, rows: 3 }));
    }

    #[test]
    fn clone_shares_data() {
        let t = Tensor::from(vec![0f32; 1024]);
        let u = t.clone();
        let (Some(a), Some(b)) = (t.array::<f32>(), u.array::<f32>()) else {
            panic!("f32 arrays expected");
        };
        assert_eq!(a.as_ptr(), b.as_ptr());
        assert_eq!(t.nbytes(), 4096);
    }
}
