//! A tensor as the rows of a column, and a batch's fields joined back into a column.
//!
//! A column of `n` samples' fields is copied once into one buffer; [`Tensor::rows`] and
//! [`Tensor::split`] cut it into the samples' fields, each a view of its byte range (no
//! copy). [`Tensor::stack`] and [`Tensor::concat`] join fields back into one tensor, and
//! when the fields are adjacent ranges of one buffer (same owner, by `Arc::ptr_eq`) the
//! result views that buffer and nothing is copied: a numpy column or an Arrow values
//! buffer of a batch then costs no copy. Strings and booleans share their arrays instead
//! (ndarray's `ArcArray`), and are gathered when joined.

use super::bytes::{aligned_copy, TensorBytes};
use super::{DType, Repr, SharedBytes, Tensor, TensorData};
use crate::sync::Arc;
use ndarray::{Array, Axis, IxDyn};
use std::ops::Range;

impl Tensor {
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
        Some(with_element!(self.dtype(), T => self
            .array::<T>()?
            .iter()
            .cloned()
            .map(Tensor::scalar)
            .collect()))
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
        Some(with_element!(dtype, T => {
            let mut values: Vec<T> = Vec::new();
            for p in parts {
                values.extend(p.array::<T>()?.iter().cloned());
            }
            Tensor::from(Array::from_shape_vec(IxDyn(&shape), values).ok()?)
        }))
    }
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    use super::*;
    use crate::tensor::aligned_bytes;

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
}
