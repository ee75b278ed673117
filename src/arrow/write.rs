//! Samples to an Arrow `RecordBatch` (see the module docs for the layout).

use super::elements::{ArrowElement, Gather};
use super::{BIRTH, ID, META_ROLE, NDIM, RAGGED, ROLE};
use crate::error::{Error, Result};
use crate::sample::{MetaValue, Sample};
use crate::sync::Arc;
use crate::tensor::with_element;
use crate::tensor::{SharedBytes, Tensor};
use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, ListArray, RecordBatch, StringArray,
    UInt64Array,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, Schema};
use std::ops::Range;

/// One row per sample: `id`, `birth`, a column per field name and per metadata key. A
/// metadata key holding integers in some samples and floats in others is a column of
/// floats.
///
/// # Errors
///
/// [`Error::Arrow`], naming the column, when one name holds tensors of different element
/// types, numbers of dimensions or raggedness in different samples, metadata of different
/// types (other than integers and floats), or is both a field and a metadata key (or `id` / `birth`); and when a column
/// exceeds Arrow's 32-bit offsets (over 2 GiB of ids or text, or over 2^31 list entries
/// in one level).
///
/// ```
/// use rollout_buffer::{arrow::to_record_batch, Sample};
/// let rows = vec![
///     Sample::new("a").birth(1).with("tokens", vec![1i32, 2, 3]).with("reward", 0.5f64),
///     Sample::new("b").birth(2).with("tokens", vec![4i32]).meta("env", "math"),
/// ];
/// let batch = to_record_batch(&rows)?;
/// assert_eq!(batch.num_rows(), 2);
/// assert_eq!(batch.schema().field_with_name("tokens").map(|f| f.data_type().to_string()).ok(),
///            Some("List(non-null Int32)".to_string()));
/// # Ok::<(), rollout_buffer::Error>(())
/// ```
pub fn to_record_batch(samples: &[Sample]) -> Result<RecordBatch> {
    let mut field_names: Vec<&str> = Vec::new();
    let mut meta_names: Vec<&str> = Vec::new();
    for s in samples {
        for key in s.keys() {
            if !field_names.contains(&key) {
                field_names.push(key);
            }
        }
        for key in s.metadata().keys() {
            if !meta_names.contains(&key.as_str()) {
                meta_names.push(key);
            }
        }
    }
    for name in field_names.iter().chain(&meta_names) {
        let reserved = *name == ID || *name == BIRTH;
        let both = field_names.contains(name) && meta_names.contains(name);
        if reserved || both {
            return Err(arrow_err(
                name,
                "the name is used twice (reserved column, or both a field and a metadata key)",
            ));
        }
    }
    let mut fields = vec![
        Field::new(ID, DataType::Utf8, false),
        Field::new(BIRTH, DataType::UInt64, true),
    ];
    let id_bytes = samples
        .iter()
        .try_fold(0usize, |acc, s| acc.checked_add(s.id().as_str().len()));
    if id_bytes.is_none_or(|n| n > MAX_LIST_ENTRIES) {
        return Err(arrow_err(ID, "more than 2 GiB of ids in one batch"));
    }
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            samples.iter().map(|s| s.id().as_str()),
        )),
        Arc::new(UInt64Array::from_iter(samples.iter().map(|s| s.birth))),
    ];
    for name in &field_names {
        let tensors: Vec<Option<&Tensor>> = samples.iter().map(|s| s.get(name)).collect();
        let (field, column) = tensor_column(name, &tensors)?;
        fields.push(field);
        columns.push(column);
    }
    for name in &meta_names {
        let values: Vec<Option<&MetaValue>> = samples.iter().map(|s| s.get_meta(name)).collect();
        let (field, column) = meta_column(name, &values)?;
        fields.push(field);
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| arrow_err("<batch>", &e.to_string()))
}

/// `owner`'s bytes `range`, for a zero-copy Arrow buffer.
struct OwnerRange(SharedBytes, Range<usize>);

impl AsRef<[u8]> for OwnerRange {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref().get(self.1.clone()).unwrap_or(&[])
    }
}

/// Arrow's 32-bit offsets bound every list level and string column.
const MAX_LIST_ENTRIES: usize = i32::MAX as usize;

pub(super) fn arrow_err(column: &str, detail: &str) -> Error {
    Error::Arrow {
        column: column.to_owned(),
        detail: detail.to_owned(),
    }
}

/// The column of field `name`, nested lists as deep as the tensors have dimensions (one
/// more when ragged).
fn tensor_column(name: &str, tensors: &[Option<&Tensor>]) -> Result<(Field, ArrayRef)> {
    let Some(first) = tensors.iter().flatten().next() else {
        return Err(arrow_err(name, "no sample holds this field"));
    };
    let (dtype, ndim, ragged) = (
        first.dtype(),
        first.shape().len(),
        first.lengths().is_some(),
    );
    for t in tensors.iter().flatten() {
        if (t.dtype(), t.shape().len(), t.lengths().is_some()) != (dtype, ndim, ragged) {
            return Err(arrow_err(
                name,
                &format!(
                    "mixes {dtype:?} {ndim}-d{} with {:?} {}-d{} tensors",
                    if ragged { " ragged" } else { "" },
                    t.dtype(),
                    t.shape().len(),
                    if t.lengths().is_some() { " ragged" } else { "" },
                ),
            ));
        }
    }
    let column = with_element!(dtype, T => nested::<T>(name, tensors, ndim, ragged)?);
    let field = Field::new(name, column.data_type().clone(), true).with_metadata([
        (ROLE, "field".to_string()),
        (NDIM, ndim.to_string()),
        (RAGGED, ragged.to_string()),
    ]);
    Ok((field, column))
}

/// Builds the nested list column: the flat values, then one list level per dimension
/// (levels[0] is the outermost: one list per sample, null for samples without the field).
fn nested<T: ArrowElement>(
    name: &str,
    tensors: &[Option<&Tensor>],
    ndim: usize,
    ragged: bool,
) -> Result<ArrayRef> {
    let depth = ndim + usize::from(ragged);
    // Every sample's values in one run of one buffer (a batch of rows put as a column):
    // the values array views that buffer instead of copying it.
    let present: Option<Vec<&Tensor>> = tensors.iter().copied().collect();
    let shared = match present {
        Some(present) if depth > 0 => Tensor::shared_run(&present),
        _ => None,
    }
    .and_then(|(owner, range)| T::view_array(bytes::Bytes::from_owner(OwnerRange(owner, range))));
    // The element arrays first: the values are gathered into buffers sized for all of them.
    let mut arrays = Vec::with_capacity(tensors.len());
    for t in tensors.iter().flatten() {
        let Some(array) = t.array::<T>() else {
            return Err(arrow_err(
                name,
                "tensor does not hold the column's element type",
            ));
        };
        arrays.push(array);
    }
    let mut values = if shared.is_some() {
        T::Gather::for_arrays(&[])
    } else {
        T::Gather::for_arrays(&arrays)
    };
    let mut arrays = arrays.into_iter();
    let mut levels: Vec<Vec<usize>> = vec![Vec::new(); depth];
    let mut valid: Vec<bool> = Vec::with_capacity(tensors.len());
    for t in tensors {
        let (Some(t), Some(array)) = (t, t.and_then(|_| arrays.next())) else {
            valid.push(false);
            match levels.first_mut() {
                Some(outer) => outer.push(0),
                None => values.push_default(),
            }
            continue;
        };
        valid.push(true);
        match array.as_slice() {
            _ if shared.is_some() => {}
            // Contiguous, row-major: one copy (memcpy for numbers).
            Some(flat) => values.extend_from_slice(flat),
            None => values.extend(array.iter()),
        }
        let shape = array.shape();
        // Dense dimension d of the values is a list level holding, per sample,
        // prod(shape[..d]) lists of shape[d] elements; a ragged tensor adds a level of
        // sequences in front and splits the first dimension by the sequence lengths.
        let dense_from = if ragged {
            let lengths = t.lengths().unwrap_or(&[]);
            levels[0].push(lengths.len());
            levels[1].extend_from_slice(lengths);
            1
        } else {
            0
        };
        let mut count = 1usize;
        for (d, &extent) in shape.iter().enumerate().skip(dense_from) {
            let lists = if ragged && d == 1 { shape[0] } else { count };
            // An empty tensor can still claim huge outer dimensions ([2^40, 0]); a list
            // level can never hold more than 2^31 entries, so refuse before allocating.
            if lists > MAX_LIST_ENTRIES {
                return Err(arrow_err(name, "more than 2^31 lists in one level"));
            }
            let level = d + usize::from(ragged);
            levels[level].extend(std::iter::repeat_n(extent, lists));
            count = lists.saturating_mul(extent);
        }
    }
    if values.text_bytes() > MAX_LIST_ENTRIES {
        return Err(arrow_err(name, "more than 2 GiB of text in one column"));
    }
    let nulls = valid.iter().any(|v| !v).then(|| NullBuffer::from(valid));
    if depth == 0 {
        return Ok(values.finish(nulls));
    }
    let mut child = match shared {
        Some(view) => view,
        None => values.finish(None),
    };
    let mut data_type = T::data_type();
    let mut nulls = nulls;
    for (level, lengths) in levels.into_iter().enumerate().rev() {
        let total = lengths
            .iter()
            .try_fold(0usize, |acc, &n| acc.checked_add(n));
        if total.is_none_or(|t| t > MAX_LIST_ENTRIES) {
            return Err(arrow_err(name, "more than 2^31 elements in one list level"));
        }
        let item = Arc::new(Field::new_list_field(data_type, false));
        let level_nulls = if level == 0 { nulls.take() } else { None };
        let list = ListArray::try_new(
            Arc::clone(&item),
            OffsetBuffer::from_lengths(lengths),
            child,
            level_nulls,
        )
        .map_err(|e| arrow_err(name, &e.to_string()))?;
        data_type = DataType::List(item);
        child = Arc::new(list);
    }
    Ok(child)
}

/// The column of metadata key `name`; every sample that has it must use the same type,
/// except that integers among floats are floats (a score of 1 in one put and 0.5 in
/// another), as a put of Python columns stores them.
fn meta_column(name: &str, values: &[Option<&MetaValue>]) -> Result<(Field, ArrayRef)> {
    let kind = |v: &MetaValue| std::mem::discriminant(v);
    let Some(first) = values.iter().flatten().next() else {
        return Err(arrow_err(name, "no sample holds this metadata key"));
    };
    let number = |v: &&MetaValue| matches!(v, MetaValue::Int(_) | MetaValue::Float(_));
    let mixed = values.iter().flatten().any(|v| kind(v) != kind(first));
    if mixed && !values.iter().flatten().all(number) {
        return Err(arrow_err(name, "metadata values of different types"));
    }
    // Integers past 2^53 never become floats: they would be rounded.
    let exact = |v: &&MetaValue| !matches!(v, MetaValue::Int(i) if i.unsigned_abs() > 1 << 53);
    if mixed && !values.iter().flatten().all(exact) {
        return Err(arrow_err(
            name,
            "metadata integers past 2^53 among floats (a float column would round them)",
        ));
    }
    let column: ArrayRef = match first {
        MetaValue::Int(_) if !mixed => {
            Arc::new(Int64Array::from_iter(values.iter().map(|v| match v {
                Some(MetaValue::Int(x)) => Some(*x),
                _ => None,
            })))
        }
        MetaValue::Int(_) | MetaValue::Float(_) => {
            Arc::new(Float64Array::from_iter(values.iter().map(|v| match v {
                Some(MetaValue::Float(x)) => Some(*x),
                Some(MetaValue::Int(x)) => Some(*x as f64),
                _ => None,
            })))
        }
        MetaValue::Str(_) => Arc::new(StringArray::from_iter(values.iter().map(|v| match v {
            Some(MetaValue::Str(x)) => Some(x.as_str()),
            _ => None,
        }))),
        MetaValue::Bool(_) => Arc::new(BooleanArray::from_iter(values.iter().map(|v| match v {
            Some(MetaValue::Bool(x)) => Some(*x),
            _ => None,
        }))),
    };
    let field = Field::new(name, column.data_type().clone(), true)
        .with_metadata([(ROLE, META_ROLE.to_string())]);
    Ok((field, column))
}
