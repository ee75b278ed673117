//! `Tensor`: one field of a sample, an immutable n-dimensional array shared by `Arc`.
//!
//! A tensor is an ndarray of one of the element types RL pipelines move around (token ids,
//! logprobs, rewards, masks, bytes, strings), optionally *ragged*: several sequences of
//! different lengths packed along the first axis, with their lengths kept beside them
//! (AReaL's `seqlens`). Cloning a tensor never copies its data, which is what lets a batch
//! be a consistent snapshot while later amends replace fields.

/// Runs `$body` with `$t` bound to the element type of `$dtype` (every `DType`): the one
/// dispatch from a runtime element type to code generic over it.
macro_rules! with_element {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::tensor::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::tensor::DType::I64 => {
                type $t = i64;
                $body
            }
            $crate::tensor::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::tensor::DType::F64 => {
                type $t = f64;
                $body
            }
            $crate::tensor::DType::Bool => {
                type $t = bool;
                $body
            }
            $crate::tensor::DType::U8 => {
                type $t = u8;
                $body
            }
            $crate::tensor::DType::Str => {
                type $t = String;
                $body
            }
        }
    };
}
#[cfg_attr(not(feature = "arrow"), allow(unused_imports))] // the Arrow conversions use it too
pub(crate) use with_element;

mod bytes;
mod rows;

#[cfg(test)]
pub(crate) use bytes::aligned_bytes;
use bytes::BorrowedTensor;
pub use bytes::SharedBytes;

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
    /// A numeric or boolean scalar kept inline in the tensor, so scalar fields (rewards,
    /// versions, flags) cost no allocation. Public only inside this private module.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub enum Scalar {
        I32(i32),
        I64(i64),
        F32(f32),
        F64(f64),
        Bool(bool),
        U8(u8),
    }

    pub trait Sealed: Sized {
        /// The value as an inline scalar, or back if it cannot be one (strings).
        fn into_scalar(self) -> Result<Scalar, Self>;
        /// The value inside an inline scalar of this type.
        fn scalar_ref(s: &Scalar) -> Option<&Self>;
        /// Little-endian `bytes` as values of this type, without copying: `None` for types
        /// that are not plain numbers, on big-endian hosts, and for misaligned bytes.
        fn cast(_bytes: &[u8]) -> Option<&[Self]> {
            None
        }
    }
}
use sealed::Scalar;

/// Element types a [`Tensor`] can hold: `i32`, `i64`, `f32`, `f64`, `bool`, `u8`, `String`.
pub trait Element: Clone + sealed::Sealed + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Wraps an array of this element type.
    fn wrap(array: ArcArray<Self, IxDyn>) -> TensorData;
    /// The array, if `data` holds this element type.
    fn unwrap(data: &TensorData) -> Option<&ArcArray<Self, IxDyn>>;
}

macro_rules! scalar_element {
    ($ty:ty, $variant:ident $(, $cast:ident)?) => {
        impl sealed::Sealed for $ty {
            fn into_scalar(self) -> Result<Scalar, Self> {
                Ok(Scalar::$variant(self))
            }
            fn scalar_ref(s: &Scalar) -> Option<&Self> {
                match s {
                    Scalar::$variant(v) => Some(v),
                    _ => None,
                }
            }
            $(
                fn $cast(bytes: &[u8]) -> Option<&[Self]> {
                    if cfg!(target_endian = "little") {
                        bytemuck::try_cast_slice(bytes).ok()
                    } else {
                        None
                    }
                }
            )?
        }
        element!($ty, $variant);
    };
}

macro_rules! element {
    ($ty:ty, $variant:ident) => {
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

scalar_element!(i32, I32, cast);
scalar_element!(i64, I64, cast);
scalar_element!(f32, F32, cast);
scalar_element!(f64, F64, cast);
scalar_element!(bool, Bool);
scalar_element!(u8, U8, cast);
impl sealed::Sealed for String {
    fn into_scalar(self) -> Result<Scalar, Self> {
        Err(self)
    }
    fn scalar_ref(_: &Scalar) -> Option<&Self> {
        None
    }
}
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
/// let two_answers = Tensor::ragged(vec![5i32, 6, 7, 8, 9], vec![2, 3])?;
/// assert_eq!(logp.shape(), &[2, 2]);
/// assert_eq!(reward.scalar_value::<f64>(), Some(1.0));
/// let second = two_answers.sequence::<i32>(1).map(|s| s.iter().copied().collect::<Vec<_>>());
/// assert_eq!(second, Some(vec![7, 8, 9]));
/// assert_eq!(tokens.array::<i32>().map(|a| a.len()), Some(3));
/// # Ok::<(), rollout_buffer::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Tensor {
    repr: Repr,
}

/// A scalar inline, or an array behind one `Arc`, so a `Tensor` is two words and cloning
/// one is a single reference-count increment.
#[derive(Debug, Clone)]
enum Repr {
    Scalar(Scalar),
    Array(Arc<ArrayTensor>),
    /// Little-endian numbers inside bytes owned by something else (a decoded Parquet page
    /// of a spill segment): loading a spilled sample then copies nothing.
    #[cfg_attr(not(feature = "persist"), allow(dead_code))]
    Borrowed(Arc<BorrowedTensor>),
}

#[derive(Debug)]
struct ArrayTensor {
    data: TensorData,
    /// For ragged tensors: the length (along axis 0) of each packed sequence.
    lengths: Option<Vec<usize>>,
}

impl PartialEq for Tensor {
    /// Equal dtype, shape, lengths and elements (an inline scalar equals a 0-d array).
    fn eq(&self, other: &Self) -> bool {
        self.lengths() == other.lengths() && self.to_data() == other.to_data()
    }
}

impl<T: Element, D: Dimension> From<Array<T, D>> for Tensor {
    fn from(array: Array<T, D>) -> Self {
        Self::from(array.into_shared())
    }
}

impl<T: Element, D: Dimension> From<ArcArray<T, D>> for Tensor {
    fn from(array: ArcArray<T, D>) -> Self {
        Self::from_parts(T::wrap(array.into_dyn()), None)
    }
}

impl From<&str> for Tensor {
    /// A 0-dimensional string tensor.
    fn from(value: &str) -> Self {
        Tensor::scalar(value.to_owned())
    }
}

impl Tensor {
    fn from_parts(data: TensorData, lengths: Option<Vec<usize>>) -> Self {
        Self {
            repr: Repr::Array(Arc::new(ArrayTensor { data, lengths })),
        }
    }

    /// The array, unless this is an inline scalar or views borrowed bytes.
    fn array_data(&self) -> Option<&TensorData> {
        match &self.repr {
            Repr::Array(a) => Some(&a.data),
            Repr::Scalar(_) | Repr::Borrowed(_) => None,
        }
    }

    /// A 0-dimensional tensor holding one value (numbers and booleans are kept inline,
    /// without allocating).
    pub fn scalar<T: Element>(value: T) -> Self {
        match value.into_scalar() {
            Ok(s) => Self {
                repr: Repr::Scalar(s),
            },
            Err(value) => Self::from(ndarray::arr0(value)),
        }
    }

    /// Several sequences packed along the first axis of `values`, with `lengths[i]` rows
    /// for sequence `i`.
    ///
    /// # Errors
    ///
    /// [`Error::RaggedLengths`] when the lengths do not add up to the number of rows of
    /// `values`, or `values` is a 0-dimensional tensor (it has no first axis).
    pub fn ragged(values: impl Into<Tensor>, lengths: Vec<usize>) -> Result<Self> {
        let values: Tensor = values.into();
        let rows = values.shape().first().copied().unwrap_or(0);
        let sum = lengths
            .iter()
            .try_fold(0usize, |acc, &l| acc.checked_add(l));
        let data = match &values.repr {
            Repr::Scalar(_) => None,
            Repr::Array(a) => Some(a.data.clone()),
            Repr::Borrowed(_) => Some(values.to_data()),
        };
        match data {
            Some(data) if !values.shape().is_empty() && sum == Some(rows) => {
                Ok(Self::from_parts(data, Some(lengths)))
            }
            _ => Err(Error::RaggedLengths {
                sum: sum.unwrap_or(usize::MAX),
                rows,
            }),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.repr {
            Repr::Scalar(s) => match s {
                Scalar::I32(_) => DType::I32,
                Scalar::I64(_) => DType::I64,
                Scalar::F32(_) => DType::F32,
                Scalar::F64(_) => DType::F64,
                Scalar::Bool(_) => DType::Bool,
                Scalar::U8(_) => DType::U8,
            },
            Repr::Array(a) => match &a.data {
                TensorData::I32(_) => DType::I32,
                TensorData::I64(_) => DType::I64,
                TensorData::F32(_) => DType::F32,
                TensorData::F64(_) => DType::F64,
                TensorData::Bool(_) => DType::Bool,
                TensorData::U8(_) => DType::U8,
                TensorData::Str(_) => DType::Str,
            },
            Repr::Borrowed(b) => b.dtype,
        }
    }

    /// The shape of the (packed) array; empty for a scalar.
    pub fn shape(&self) -> &[usize] {
        if let Repr::Borrowed(b) = &self.repr {
            return &b.shape;
        }
        match self.array_data() {
            None => &[],
            Some(TensorData::I32(a)) => a.shape(),
            Some(TensorData::I64(a)) => a.shape(),
            Some(TensorData::F32(a)) => a.shape(),
            Some(TensorData::F64(a)) => a.shape(),
            Some(TensorData::Bool(a)) => a.shape(),
            Some(TensorData::U8(a)) => a.shape(),
            Some(TensorData::Str(a)) => a.shape(),
        }
    }

    /// The values as an ndarray, by element type (shares the data; an inline scalar becomes
    /// a 0-dimensional array). A tensor loaded from a spill segment views the decoded page
    /// its values are in; this copies them (`array` does not).
    pub fn to_data(&self) -> TensorData {
        match &self.repr {
            Repr::Array(a) => a.data.clone(),
            Repr::Borrowed(b) => match b.dtype {
                DType::I32 => TensorData::I32(b.owned()),
                DType::I64 => TensorData::I64(b.owned()),
                DType::F32 => TensorData::F32(b.owned()),
                DType::F64 => TensorData::F64(b.owned()),
                DType::U8 => TensorData::U8(b.owned()),
                // Never made for these (see `borrowed`).
                DType::Bool => TensorData::Bool(ArcArray::from_vec(Vec::new()).into_dyn()),
                DType::Str => TensorData::Str(ArcArray::from_vec(Vec::new()).into_dyn()),
            },
            Repr::Scalar(s) => match *s {
                Scalar::I32(v) => TensorData::I32(ndarray::arr0(v).into_dyn().into_shared()),
                Scalar::I64(v) => TensorData::I64(ndarray::arr0(v).into_dyn().into_shared()),
                Scalar::F32(v) => TensorData::F32(ndarray::arr0(v).into_dyn().into_shared()),
                Scalar::F64(v) => TensorData::F64(ndarray::arr0(v).into_dyn().into_shared()),
                Scalar::Bool(v) => TensorData::Bool(ndarray::arr0(v).into_dyn().into_shared()),
                Scalar::U8(v) => TensorData::U8(ndarray::arr0(v).into_dyn().into_shared()),
            },
        }
    }

    /// A view of the array, if it holds `T`.
    pub fn array<T: Element>(&self) -> Option<ArrayViewD<'_, T>> {
        match &self.repr {
            Repr::Array(a) => T::unwrap(&a.data).map(|a| a.view()),
            Repr::Borrowed(b) => ArrayViewD::from_shape(IxDyn(&b.shape), b.values::<T>()?).ok(),
            Repr::Scalar(s) => {
                let v = T::scalar_ref(s)?;
                ArrayViewD::from_shape(IxDyn(&[]), std::slice::from_ref(v)).ok()
            }
        }
    }

    /// The value of a 0-dimensional tensor holding `T`.
    pub fn scalar_value<T: Element>(&self) -> Option<T> {
        match &self.repr {
            Repr::Scalar(s) => T::scalar_ref(s).cloned(),
            // Always at least one-dimensional.
            Repr::Borrowed(_) => None,
            Repr::Array(a) => {
                let a = T::unwrap(&a.data)?;
                if a.ndim() != 0 {
                    return None;
                }
                a.first().cloned()
            }
        }
    }

    /// The string of a 0-dimensional string tensor.
    pub fn as_str(&self) -> Option<&str> {
        match self.array_data() {
            Some(TensorData::Str(a)) if a.ndim() == 0 => a.first().map(String::as_str),
            _ => None,
        }
    }

    /// The sequence lengths of a ragged tensor.
    pub fn lengths(&self) -> Option<&[usize]> {
        match &self.repr {
            Repr::Array(a) => a.lengths.as_deref(),
            Repr::Borrowed(b) => b.lengths.as_deref(),
            Repr::Scalar(_) => None,
        }
    }

    /// Sequence `i` of a ragged tensor holding `T`.
    pub fn sequence<T: Element>(&self, i: usize) -> Option<ArrayViewD<'_, T>> {
        let lengths = self.lengths()?;
        let start: usize = lengths.get(..i)?.iter().sum();
        let len = *lengths.get(i)?;
        let mut a = self.array::<T>()?;
        if a.ndim() == 0 || start + len > a.shape()[0] {
            return None;
        }
        a.slice_axis_inplace(ndarray::Axis(0), (start..start + len).into());
        Some(a)
    }

    /// Approximate payload size in bytes (strings count their UTF-8 bytes).
    pub fn nbytes(&self) -> usize {
        let data = match &self.repr {
            Repr::Scalar(Scalar::I64(_) | Scalar::F64(_)) => 8,
            Repr::Scalar(Scalar::I32(_) | Scalar::F32(_)) => 4,
            Repr::Scalar(Scalar::Bool(_) | Scalar::U8(_)) => 1,
            Repr::Borrowed(b) => b.range.len(),
            Repr::Array(a) => match &a.data {
                TensorData::I32(a) => a.len() * 4,
                TensorData::I64(a) => a.len() * 8,
                TensorData::F32(a) => a.len() * 4,
                TensorData::F64(a) => a.len() * 8,
                TensorData::Bool(a) => a.len(),
                TensorData::U8(a) => a.len(),
                TensorData::Str(a) => a.iter().map(String::len).sum(),
            },
        };
        data + self.lengths().map_or(0, |l| l.len() * 8)
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
    fn inline_scalars_behave_like_0d_arrays() {
        let inline = Tensor::from(2.5f64);
        let boxed = Tensor::from(ndarray::arr0(2.5f64));
        assert_eq!(inline, boxed);
        assert_eq!(inline.shape(), boxed.shape());
        assert_eq!(inline.dtype(), DType::F64);
        assert_eq!(inline.array::<f64>().map(|a| a.ndim()), Some(0));
        assert_eq!(
            inline.array::<f64>().and_then(|a| a.first().copied()),
            Some(2.5)
        );
        assert!(inline.array::<f32>().is_none());
        assert_eq!(inline.nbytes(), 8);
        assert_ne!(inline, Tensor::from(2.5f32));
        assert!(Tensor::ragged(1i32, vec![1]).is_err());
    }

    #[test]
    fn tensor_is_two_words() {
        assert!(std::mem::size_of::<Tensor>() <= 16);
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
