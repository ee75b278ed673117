//! `ArrowElement`: how each tensor element type maps to a flat Arrow array and back.

use crate::sync::Arc;
use crate::tensor::{DType, Element};
use arrow_array::builder::StringBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int32Type, Int64Type, UInt8Type};
use arrow_array::{Array, ArrayRef, BooleanArray, PrimitiveArray, StringArray};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, ScalarBuffer};
use arrow_schema::DataType;
use ndarray::ArrayViewD;

/// A tensor element type with an Arrow counterpart.
pub(crate) trait ArrowElement: Element + Default {
    /// Where a column's values are gathered before they become its array: the values
    /// themselves for numbers; for text, the array's own buffers, so each text is copied
    /// once (cloning each into a `Vec<String>` first copied every archived chat twice).
    type Gather: Gather<Self>;
    /// The Arrow type of a flat array of these elements.
    fn data_type() -> DataType;
    /// A flat array of `values`, with `nulls` (only scalar columns have any).
    fn to_array(values: Vec<Self>, nulls: Option<NullBuffer>) -> ArrayRef;
    /// Elements `lo..hi` of a flat array, or `None` if it holds another type, is too short,
    /// or has a null in that range.
    fn read(array: &dyn Array, lo: usize, hi: usize) -> Option<Vec<Self>>;
    /// Bytes of text in `values` (saturating), which a utf8 array's 32-bit offsets bound.
    fn text_bytes(_values: &[Self]) -> usize {
        0
    }
    /// A flat array over `bytes` (little-endian values) without copying them, when this is
    /// a plain number type and the bytes are aligned for it; `None` otherwise.
    fn view_array(_bytes: bytes::Bytes) -> Option<ArrayRef> {
        None
    }
}

/// A column's values as they are gathered (see [`ArrowElement::Gather`]).
pub(crate) trait Gather<T>: Sized {
    /// Room for the values of `arrays` (the column's tensors' elements, in order).
    fn for_arrays(arrays: &[ArrayViewD<'_, T>]) -> Self;
    /// Appends values.
    fn extend<'a>(&mut self, values: impl Iterator<Item = &'a T>)
    where
        T: 'a;
    /// Appends values stored contiguously.
    fn extend_from_slice(&mut self, values: &[T]);
    /// Appends the element type's default value.
    fn push_default(&mut self);
    /// Bytes of text gathered (saturating), which a utf8 array's 32-bit offsets bound.
    fn text_bytes(&self) -> usize {
        0
    }
    /// The flat array, with `nulls`.
    fn finish(self, nulls: Option<NullBuffer>) -> ArrayRef;
}

impl<T: ArrowElement<Gather = Vec<T>> + Clone> Gather<T> for Vec<T> {
    fn for_arrays(arrays: &[ArrayViewD<'_, T>]) -> Self {
        Vec::with_capacity(arrays.iter().map(|a| a.len()).sum())
    }
    fn extend<'a>(&mut self, values: impl Iterator<Item = &'a T>)
    where
        T: 'a,
    {
        Extend::extend(self, values.cloned());
    }
    fn extend_from_slice(&mut self, values: &[T]) {
        Vec::extend_from_slice(self, values);
    }
    fn push_default(&mut self) {
        self.push(T::default());
    }
    fn finish(self, nulls: Option<NullBuffer>) -> ArrayRef {
        T::to_array(self, nulls)
    }
}

/// Texts gathered straight into a utf8 array's buffers, sized up front: a column of long
/// texts (chats of kilobytes each) grown by doubling is copied again at each step and
/// holds up to twice its size.
pub(crate) struct TextGather {
    builder: StringBuilder,
    bytes: usize,
}

impl Gather<String> for TextGather {
    fn for_arrays(arrays: &[ArrayViewD<'_, String>]) -> Self {
        let values = arrays.iter().map(|a| a.len()).sum();
        let bytes = arrays
            .iter()
            .flat_map(|a| a.iter())
            .fold(0usize, |acc, v| acc.saturating_add(v.len()));
        // Past 2 GiB the column is refused anyway: do not reserve for it.
        let reserve = bytes.min(i32::MAX as usize);
        Self {
            builder: StringBuilder::with_capacity(values, reserve),
            bytes: 0,
        }
    }
    fn extend<'a>(&mut self, values: impl Iterator<Item = &'a String>) {
        for v in values {
            self.bytes = self.bytes.saturating_add(v.len());
            // Past 2 GiB the column is refused (see `text_bytes`) before it is finished.
            if self.bytes <= i32::MAX as usize {
                self.builder.append_value(v);
            }
        }
    }
    fn extend_from_slice(&mut self, values: &[String]) {
        self.extend(values.iter());
    }
    fn push_default(&mut self) {
        self.builder.append_value("");
    }
    fn text_bytes(&self) -> usize {
        self.bytes
    }
    fn finish(mut self, nulls: Option<NullBuffer>) -> ArrayRef {
        let array = self.builder.finish();
        match nulls {
            None => Arc::new(array),
            Some(nulls) => {
                let (offsets, values, _) = array.into_parts();
                Arc::new(StringArray::new(offsets, values, Some(nulls)))
            }
        }
    }
}

fn no_nulls_in(array: &dyn Array, lo: usize, hi: usize) -> bool {
    hi <= array.len()
        && lo <= hi
        && (array.null_count() == 0 || (lo..hi).all(|i| array.is_valid(i)))
}

macro_rules! primitive {
    ($ty:ty, $arrow:ty, $dt:expr) => {
        impl ArrowElement for $ty {
            type Gather = Vec<Self>;
            fn data_type() -> DataType {
                $dt
            }
            fn to_array(values: Vec<Self>, nulls: Option<NullBuffer>) -> ArrayRef {
                Arc::new(PrimitiveArray::<$arrow>::new(
                    ScalarBuffer::from(values),
                    nulls,
                ))
            }
            fn read(array: &dyn Array, lo: usize, hi: usize) -> Option<Vec<Self>> {
                let a = array.as_primitive_opt::<$arrow>()?;
                no_nulls_in(a, lo, hi).then(|| a.values()[lo..hi].to_vec())
            }
            fn view_array(bytes: bytes::Bytes) -> Option<ArrayRef> {
                let size = std::mem::size_of::<Self>();
                let aligned = bytes.as_ptr().align_offset(std::mem::align_of::<Self>()) == 0;
                if cfg!(target_endian = "big") || !aligned || bytes.len() % size != 0 {
                    return None;
                }
                let n = bytes.len() / size;
                // Checked above: aligned and whole values, so `ScalarBuffer::new` accepts it.
                let values = ScalarBuffer::new(Buffer::from(bytes), 0, n);
                Some(Arc::new(PrimitiveArray::<$arrow>::new(values, None)))
            }
        }
    };
}

primitive!(i32, Int32Type, DataType::Int32);
primitive!(i64, Int64Type, DataType::Int64);
primitive!(f32, Float32Type, DataType::Float32);
primitive!(f64, Float64Type, DataType::Float64);
primitive!(u8, UInt8Type, DataType::UInt8);

impl ArrowElement for bool {
    type Gather = Vec<Self>;
    fn data_type() -> DataType {
        DataType::Boolean
    }
    fn to_array(values: Vec<Self>, nulls: Option<NullBuffer>) -> ArrayRef {
        Arc::new(BooleanArray::new(BooleanBuffer::from(values), nulls))
    }
    fn read(array: &dyn Array, lo: usize, hi: usize) -> Option<Vec<Self>> {
        let a = array.as_boolean_opt()?;
        no_nulls_in(a, lo, hi).then(|| (lo..hi).map(|i| a.value(i)).collect())
    }
}

impl ArrowElement for String {
    type Gather = TextGather;
    fn data_type() -> DataType {
        DataType::Utf8
    }
    fn to_array(values: Vec<Self>, nulls: Option<NullBuffer>) -> ArrayRef {
        // Sized up front: a column of long texts (chats of kilobytes each) grown by
        // doubling is copied again at each step and holds up to twice its size.
        let mut builder = StringBuilder::with_capacity(values.len(), Self::text_bytes(&values));
        for (i, v) in values.iter().enumerate() {
            match &nulls {
                Some(n) if n.is_null(i) => builder.append_null(),
                _ => builder.append_value(v),
            }
        }
        Arc::new(builder.finish())
    }
    fn text_bytes(values: &[Self]) -> usize {
        values
            .iter()
            .fold(0usize, |acc, v| acc.saturating_add(v.len()))
    }
    fn read(array: &dyn Array, lo: usize, hi: usize) -> Option<Vec<Self>> {
        let a = array.as_string_opt::<i32>()?;
        no_nulls_in(a, lo, hi).then(|| (lo..hi).map(|i| a.value(i).to_owned()).collect())
    }
}

/// The element type of a flat Arrow type, if it maps to one.
pub(crate) fn dtype_of(data_type: &DataType) -> Option<DType> {
    Some(match data_type {
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Float32 => DType::F32,
        DataType::Float64 => DType::F64,
        DataType::Boolean => DType::Bool,
        DataType::UInt8 => DType::U8,
        DataType::Utf8 => DType::Str,
        _ => return None,
    })
}
