//! Columns from Arrow: the record batches an Arrow exporter hands over (`arrow.rs`), and
//! single Arrow columns given in a dict of columns, as one tensor per row for each column.
//! Numbers, booleans and strings, and fixed-size and variable-size lists of them, are read
//! directly, each column copied once; anything else (deeper nesting, the crate's own
//! layout) goes through the crate's Arrow reader.

use crate::arrays::as_numpy;
use crate::columns::{bad, lengths_of};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int32Type, Int64Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use pyo3::prelude::*;
use rollout_buffer::{DType, MetaValue, SampleId, Tensor};
use std::sync::Arc;

/// The batches of a stream back to back; none is an empty batch of `schema` (its columns
/// still checked: an empty table of an undeclared column, for one id, was stored).
pub(crate) fn concat_batches(
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> PyResult<RecordBatch> {
    match batches.len() {
        0 => Ok(RecordBatch::new_empty(schema)),
        1 => Ok(batches
            .into_iter()
            .next()
            .unwrap_or_else(|| RecordBatch::new_empty(schema))),
        _ => {
            let schema = batches[0].schema();
            let mut columns = Vec::with_capacity(schema.fields().len());
            for i in 0..schema.fields().len() {
                let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(i).as_ref()).collect();
                columns.push(concat_arrays(&parts)?);
            }
            RecordBatch::try_new(schema, columns).map_err(|e| bad(format!("Arrow: {e}")))
        }
    }
}

/// Arrays of one type back to back (a stream of several batches).
pub(crate) fn concat_arrays(parts: &[&dyn Array]) -> PyResult<arrow_array::ArrayRef> {
    let data: Vec<arrow_data::ArrayData> = parts.iter().map(|a| a.to_data()).collect();
    let refs: Vec<&arrow_data::ArrayData> = data.iter().collect();
    let total = refs.iter().map(|d| d.len()).sum();
    let mut mutable = arrow_data::transform::MutableArrayData::try_new(refs, false, total)
        .map_err(|e| bad(format!("Arrow: {e}")))?;
    for (i, d) in data.iter().enumerate() {
        mutable
            .try_extend(i, 0, d.len())
            .map_err(|e| bad(format!("Arrow: {e}")))?;
    }
    Ok(arrow_array::make_array(mutable.freeze()))
}

/// The values of a primitive column, each through `f`.
fn mapped<T: ArrowPrimitiveType, U>(column: &dyn Array, f: impl Fn(T::Native) -> U) -> Vec<U> {
    column
        .as_primitive::<T>()
        .values()
        .iter()
        .map(|&v| f(v))
        .collect()
}

/// The strings of a utf8 column of any width, `None` for other types.
fn strings(column: &dyn Array) -> Option<Vec<String>> {
    let owned = |s: Option<&str>| s.unwrap_or("").to_owned();
    Some(match column.data_type() {
        DataType::Utf8 => column.as_string::<i32>().iter().map(owned).collect(),
        DataType::LargeUtf8 => column.as_string::<i64>().iter().map(owned).collect(),
        DataType::Utf8View => column.as_string_view().iter().map(owned).collect(),
        _ => return None,
    })
}

/// A column of non-negative integers, `None` for other types or negative values.
fn unsigned(column: &dyn Array) -> Option<Vec<u64>> {
    let signed = |v: Vec<Option<u64>>| v.into_iter().collect::<Option<Vec<u64>>>();
    match column.data_type() {
        DataType::UInt64 => Some(mapped::<UInt64Type, _>(column, |v| v)),
        DataType::UInt32 => Some(mapped::<UInt32Type, _>(column, u64::from)),
        DataType::Int64 => signed(mapped::<Int64Type, _>(column, |v| u64::try_from(v).ok())),
        DataType::Int32 => signed(mapped::<Int32Type, _>(column, |v| u64::try_from(v).ok())),
        _ => None,
    }
}

/// A dictionary-encoded column (a polars categorical, pyarrow's `dictionary_encode()`) as a
/// plain column of its values, which the readers below take; `None` for a plain column.
fn decoded(what: &str, column: &dyn Array) -> PyResult<Option<ArrayRef>> {
    match column.data_type() {
        DataType::Dictionary(_, values) => arrow_cast::cast(column, values)
            .map(Some)
            .map_err(|e| bad(format!("{what}: its dictionary does not decode: {e}"))),
        _ => Ok(None),
    }
}

pub(crate) fn arrow_ids(column: &dyn Array) -> PyResult<Vec<SampleId>> {
    if let Some(plain) = decoded("column \"id\"", column)? {
        return arrow_ids(plain.as_ref());
    }
    if column.null_count() > 0 {
        return Err(bad("column \"id\" has nulls".into()));
    }
    if let Some(s) = strings(column) {
        return Ok(s.into_iter().map(SampleId::from).collect());
    }
    unsigned(column)
        .map(|v| v.into_iter().map(SampleId::from).collect())
        .ok_or_else(|| {
            bad(format!(
                "column \"id\" of type {}: ids are str or ints from 0 to 2**64 - 1",
                column.data_type()
            ))
        })
}

pub(crate) fn arrow_births(column: &dyn Array) -> PyResult<Vec<u64>> {
    unsigned(column)
        .filter(|_| column.null_count() == 0)
        .ok_or_else(|| bad("column \"birth\": non-negative ints, no nulls".into()))
}

pub(crate) fn arrow_meta(name: &str, column: &dyn Array) -> PyResult<Vec<MetaValue>> {
    if let Some(plain) = decoded(&format!("meta {name:?}"), column)? {
        return arrow_meta(name, plain.as_ref());
    }
    if column.null_count() > 0 {
        return Err(bad(format!("meta {name:?} has nulls")));
    }
    let values = match column.data_type() {
        DataType::Int64 => Some(mapped::<Int64Type, _>(column, MetaValue::Int)),
        DataType::Int32 => Some(mapped::<Int32Type, _>(column, |v| MetaValue::Int(v.into()))),
        DataType::Float64 => Some(mapped::<Float64Type, _>(column, MetaValue::Float)),
        DataType::Float32 => Some(mapped::<Float32Type, _>(column, |v| {
            MetaValue::Float(v.into())
        })),
        DataType::Boolean => Some(
            column
                .as_boolean()
                .iter()
                .flatten()
                .map(MetaValue::Bool)
                .collect(),
        ),
        _ => strings(column).map(|s| s.into_iter().map(MetaValue::Str).collect()),
    };
    values.ok_or_else(|| {
        bad(format!(
            "meta {name:?}: {} is not int, float, bool or str",
            column.data_type()
        ))
    })
}

/// One Arrow column as one tensor per row.
pub(crate) fn arrow_rows(
    name: &str,
    field: &Field,
    column: &dyn Array,
    batch: &RecordBatch,
) -> PyResult<Vec<Tensor>> {
    let what = format!("column {name:?}");
    if let Some(row) = (0..column.len()).find(|&i| column.is_null(i)) {
        return Err(bad(format!(
            "{what}: null at row {row} (every sample needs a value)"
        )));
    }
    let n = column.len();
    if let Some(values) = flat_values(column) {
        let values = values.map_err(|e| bad(format!("{what}: {e}")))?;
        return values.rows().ok_or_else(|| bad(format!("{what}: no rows")));
    }
    match column.data_type() {
        DataType::FixedSizeList(_, k) => {
            let list = column.as_fixed_size_list();
            let child = list
                .values()
                .slice(list.offset() * *k as usize, n * *k as usize);
            if let Some(values) = flat_values(child.as_ref()) {
                let values = values.map_err(|e| bad(format!("{what}: {e}")))?;
                return values
                    .split(&vec![*k as usize; n])
                    .ok_or_else(|| bad(format!("{what}: values do not split")));
            }
        }
        DataType::List(_) | DataType::LargeList(_) => {
            let (offsets, child): (Vec<i64>, _) = match column.data_type() {
                DataType::List(_) => {
                    let l = column.as_list::<i32>();
                    (
                        l.offsets().iter().map(|&o| i64::from(o)).collect(),
                        l.values().clone(),
                    )
                }
                _ => {
                    let l = column.as_list::<i64>();
                    (l.offsets().to_vec(), l.values().clone())
                }
            };
            let start = offsets.first().copied().unwrap_or(0);
            let end = offsets.last().copied().unwrap_or(0);
            let child = child.slice(start as usize, (end - start) as usize);
            if let Some(values) = flat_values(child.as_ref()) {
                let values = values.map_err(|e| bad(format!("{what}: {e}")))?;
                let rebased: Vec<i64> = offsets.iter().map(|o| o - start).collect();
                let total = values.shape().first().copied().unwrap_or(0);
                let lengths = lengths_of(&what, &rebased, total)?;
                return values
                    .split(&lengths)
                    .ok_or_else(|| bad(format!("{what}: values do not split")));
            }
        }
        _ => {}
    }
    // Anything else (deeper nesting, the crate's own layout with its field metadata):
    // through the crate's Arrow reader, on this column alone.
    let ids: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let schema = Schema::new(vec![Field::new("id", DataType::Utf8, false), field.clone()]);
    let single = RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(arrow_array::StringArray::from(ids)),
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| bad(format!("{what}: missing")))?,
        ],
    )
    .map_err(|e| bad(format!("{what}: {e}")))?;
    let samples = rollout_buffer::arrow::from_record_batch(&single)
        .map_err(|e| bad(format!("{what}: {e}")))?;
    samples
        .iter()
        .enumerate()
        .map(|(row, s)| {
            s.get(name)
                .cloned()
                .ok_or_else(|| bad(format!("{what}: no value at row {row}")))
        })
        .collect()
}

/// A flat Arrow array of numbers, booleans or strings as one `[len]` tensor (numbers
/// copied once); `None` for other types.
fn flat_values(array: &dyn Array) -> Option<Result<Tensor, String>> {
    if array.null_count() > 0 {
        return Some(Err("nulls inside a value".into()));
    }
    fn numbers<T: ArrowPrimitiveType>(array: &dyn Array, dtype: DType) -> Result<Tensor, String>
    where
        T::Native: bytemuck::Pod,
    {
        let values = array.as_primitive::<T>().values();
        Tensor::copy_from_bytes(dtype, vec![values.len()], bytemuck::cast_slice(values))
            .ok_or_else(|| "values do not fit".to_string())
    }
    Some(match array.data_type() {
        DataType::Int32 => numbers::<Int32Type>(array, DType::I32),
        DataType::Int64 => numbers::<Int64Type>(array, DType::I64),
        DataType::Float32 => numbers::<Float32Type>(array, DType::F32),
        DataType::Float64 => numbers::<Float64Type>(array, DType::F64),
        DataType::UInt8 => numbers::<UInt8Type>(array, DType::U8),
        DataType::Boolean => {
            let values: Vec<bool> = array
                .as_boolean()
                .iter()
                .map(|v| v.unwrap_or(false))
                .collect();
            Ok(Tensor::from(values))
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            Ok(Tensor::from(strings(array).unwrap_or_default()))
        }
        _ => return None,
    })
}

/// An Arrow column given inside a dict of columns (a pyarrow Array or ChunkedArray, a
/// polars Series), read as a table's column is.
/// A column's chunks as one array (`None`: no chunk, no rows).
pub(crate) fn one_array(chunks: Vec<ArrayRef>) -> PyResult<Option<ArrayRef>> {
    if chunks.len() <= 1 {
        return Ok(chunks.into_iter().next());
    }
    let parts: Vec<&dyn Array> = chunks.iter().map(|c| c.as_ref()).collect();
    concat_arrays(&parts).map(Some)
}

pub(crate) fn arrow_column_rows(
    name: &str,
    field: Field,
    chunks: Vec<ArrayRef>,
) -> PyResult<Vec<Tensor>> {
    let Some(column) = one_array(chunks)? else {
        return Ok(Vec::new());
    };
    let field = field.with_name(name);
    let schema = Arc::new(Schema::new(vec![field.clone()]));
    let batch = RecordBatch::try_new(schema, vec![column.clone()])
        .map_err(|e| bad(format!("column {name:?}: {e}")))?;
    arrow_rows(name, &field, column.as_ref(), &batch)
}

/// Arrow values (not numpy's) with a null, which `numpy.asarray` made NaN.
pub(crate) fn no_arrow_nulls(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    if as_numpy(obj).is_some() {
        return Ok(());
    }
    let Some(column) = crate::arrow::import_column(obj) else {
        return Ok(());
    };
    let (_, chunks) = column?;
    let mut at = 0;
    for chunk in &chunks {
        if let Some(i) = (0..chunk.len()).find(|&i| chunk.is_null(i)) {
            return Err(bad(format!(
                "{what}: null at element {} (every value must be there)",
                at + i
            )));
        }
        at += chunk.len();
    }
    Ok(())
}
