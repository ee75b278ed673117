//! An Arrow `RecordBatch` back to samples (see the module docs for the layout).

use super::elements::{dtype_of, ArrowElement};
use super::write::arrow_err;
use super::{BIRTH, ID, META_ROLE, NDIM, RAGGED, ROLE};
use crate::error::Result;
use crate::sample::{FieldKey, MetaValue, Sample};
use crate::tensor::with_element;
use crate::tensor::{DType, Tensor};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field};
use ndarray::{ArrayD, IxDyn};

/// Rebuilds the samples of a batch written by [`to_record_batch`](super::to_record_batch),
/// or of any batch with a non-null utf8 `id` column whose other columns are primitive or
/// nested lists of `int32`, `int64`, `float32`, `float64`, `bool`, `uint8` or `utf8`.
///
/// # Errors
///
/// [`Error::Arrow`](crate::Error::Arrow), naming the column, when the `id` column is
/// missing, not utf8 or has nulls, `birth` is not uint64, or a column has another type,
/// nulls inside a tensor, lists too irregular for an n-dimensional tensor, or field
/// metadata (`ndim`, `ragged`) its nesting contradicts.
pub fn from_record_batch(batch: &RecordBatch) -> Result<Vec<Sample>> {
    let schema = batch.schema();
    let ids = batch
        .column_by_name(ID)
        .and_then(|c| c.as_string_opt::<i32>())
        .filter(|c| c.null_count() == 0)
        .ok_or_else(|| arrow_err(ID, "missing, not utf8, or with nulls"))?;
    let births = match batch.column_by_name(BIRTH) {
        Some(c) => Some(
            c.as_primitive_opt::<UInt64Type>()
                .ok_or_else(|| arrow_err(BIRTH, "not uint64"))?,
        ),
        None => None,
    };
    let mut samples: Vec<Sample> = (0..batch.num_rows())
        .map(|i| {
            let mut s = Sample::new(ids.value(i));
            s.birth = births.filter(|b| b.is_valid(i)).map(|b| b.value(i));
            s
        })
        .collect();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let name = field.name().as_str();
        if name == ID || name == BIRTH {
            continue;
        }
        match field.metadata().get(ROLE).map(String::as_str) {
            Some(META_ROLE) => read_meta(field, column.as_ref(), &mut samples)?,
            // Columns a container of samples adds about them (the archive's `reason`).
            Some("archive") => {}
            _ => read_field(field, column.as_ref(), &mut samples)?,
        }
    }
    Ok(samples)
}

fn read_meta(field: &Field, column: &dyn Array, samples: &mut [Sample]) -> Result<()> {
    let name = field.name();
    for (i, s) in samples.iter_mut().enumerate() {
        if column.is_null(i) {
            continue;
        }
        let value = match column.data_type() {
            DataType::Int64 => column
                .as_primitive_opt::<Int64Type>()
                .map(|a| MetaValue::Int(a.value(i))),
            DataType::Float64 => column
                .as_primitive_opt::<Float64Type>()
                .map(|a| MetaValue::Float(a.value(i))),
            DataType::Utf8 => column
                .as_string_opt::<i32>()
                .map(|a| MetaValue::Str(a.value(i).to_owned())),
            DataType::Boolean => column.as_boolean_opt().map(|a| MetaValue::Bool(a.value(i))),
            _ => None,
        };
        let value = value
            .ok_or_else(|| arrow_err(name, "metadata must be int64, float64, utf8 or bool"))?;
        s.meta_mut().insert(name.clone(), value);
    }
    Ok(())
}

/// Nesting depth and innermost type of a (possibly nested) list type.
fn list_shape(data_type: &DataType) -> (usize, &DataType) {
    match data_type {
        DataType::List(item) => {
            let (depth, inner) = list_shape(item.data_type());
            (depth + 1, inner)
        }
        other => (0, other),
    }
}

fn read_field(field: &Field, column: &dyn Array, samples: &mut [Sample]) -> Result<()> {
    let name = field.name();
    let (depth, inner) = list_shape(field.data_type());
    let dtype: DType = dtype_of(inner).ok_or_else(|| {
        arrow_err(
            name,
            &format!("element type {inner} has no tensor counterpart"),
        )
    })?;
    let ragged = field.metadata().get(RAGGED).map(String::as_str) == Some("true");
    if ragged && depth < 2 {
        return Err(arrow_err(name, "marked ragged but not a list of lists"));
    }
    if let Some(ndim) = field.metadata().get(NDIM) {
        if ndim.parse::<usize>().ok() != Some(depth - usize::from(ragged)) {
            return Err(arrow_err(name, "nesting does not match its recorded ndim"));
        }
    }
    let key = FieldKey::from(name);
    for (i, s) in samples.iter_mut().enumerate() {
        let tensor = with_element!(dtype, T => tensor_at::<T>(name, column, i, depth, ragged)?);
        if let Some(t) = tensor {
            s.fields.set(key.clone(), t);
        }
    }
    Ok(())
}

/// Row `i` of a tensor column, `None` where the sample lacks the field.
fn tensor_at<T: ArrowElement>(
    name: &str,
    column: &dyn Array,
    i: usize,
    depth: usize,
    ragged: bool,
) -> Result<Option<Tensor>> {
    if column.is_null(i) {
        return Ok(None);
    }
    let bad = |what: &str| arrow_err(name, &format!("row {i}: {what}"));
    // Walk down the list levels, keeping the range of items the row spans at each level.
    let (mut lo, mut hi) = (i, i + 1);
    let mut array: &dyn Array = column;
    let mut shape: Vec<usize> = Vec::with_capacity(depth);
    let mut lengths: Vec<usize> = Vec::new();
    for level in 0..depth {
        let list = array
            .as_list_opt::<i32>()
            .ok_or_else(|| bad("list expected"))?;
        if level > 0 && (lo..hi).any(|j| list.is_null(j)) {
            return Err(bad("null inside a tensor"));
        }
        let offsets = list.value_offsets();
        let at = |j: usize| -> Result<usize> {
            offsets
                .get(j)
                .and_then(|&o| usize::try_from(o).ok())
                .ok_or_else(|| bad("offset out of range"))
        };
        let sizes: Vec<usize> = (lo..hi)
            .map(|j| Ok(at(j + 1)?.saturating_sub(at(j)?)))
            .collect::<Result<_>>()?;
        if ragged && level == 1 {
            lengths = sizes;
        } else {
            let extent = sizes.first().copied().unwrap_or(0);
            if sizes.iter().any(|&n| n != extent) {
                return Err(bad("lists of different lengths in a dense dimension"));
            }
            if !(ragged && level == 0) {
                shape.push(extent);
            }
        }
        (lo, hi) = (at(lo)?, at(hi)?);
        array = list.values().as_ref();
    }
    let values = T::read(array, lo, hi).ok_or_else(|| bad("values of the wrong type or null"))?;
    if depth == 0 {
        return match values.into_iter().next() {
            Some(v) => Ok(Some(Tensor::scalar(v))),
            None => Err(bad("missing value")),
        };
    }
    if ragged {
        // The values' first dimension is the rows of all sequences together.
        shape.insert(0, lengths.iter().sum());
    }
    let array = ArrayD::from_shape_vec(IxDyn(&shape), values)
        .map_err(|e| bad(&format!("shape {shape:?}: {e}")))?;
    let tensor = Tensor::from(array);
    if ragged {
        return Tensor::ragged(tensor, lengths).map(Some);
    }
    Ok(Some(tensor))
}
