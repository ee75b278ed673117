//! The columns of a put that are not fields: `id`, `birth` and the `meta=` columns, each
//! from a list, a numpy array or an Arrow array (pyarrow, polars), checked whole before
//! anything is stored (see `columns.rs`, which calls these). No state, no lock.

use crate::arrays::{as_numpy, no_masked};
use crate::arrow_columns::{arrow_births, arrow_ids, arrow_meta, one_array};
use crate::columns::bad;
use crate::convert::{meta_from_py, string_from_py};
use arrow_array::Array;
use numpy::PyArrayMethods;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyString};
use rollout_buffer::{MetaValue, SampleId};

/// `obj` as a list (numpy arrays through `tolist`).
fn numpy_list<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if as_numpy(obj).is_some() {
        obj.call_method0("tolist")
    } else {
        Ok(obj.clone())
    }
}

/// `obj` read by `read` as one Arrow array when it exports Arrow (a pyarrow Array or
/// ChunkedArray, a polars Series); `None` for anything else, numpy arrays included.
fn from_arrow<T>(
    obj: &Bound<'_, PyAny>,
    read: impl FnOnce(&dyn Array) -> PyResult<Vec<T>>,
) -> Option<PyResult<Vec<T>>> {
    if as_numpy(obj).is_some() {
        return None;
    }
    let column = crate::arrow::import_column(obj)?;
    Some(column.and_then(|(_, chunks)| match one_array(chunks)? {
        Some(array) => read(array.as_ref()),
        None => Ok(Vec::new()),
    }))
}

/// A `birth` column: non-negative ints (Arrow too); a bool is refused, not taken as 1.
pub(crate) fn py_births(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let refused = || bad("column \"birth\": non-negative ints".into());
    if let Some(births) = from_arrow(obj, arrow_births) {
        return births;
    }
    no_masked(obj, "column \"birth\"")?;
    let list = numpy_list(obj)?;
    list.try_iter()
        .map_err(|_| refused())?
        .map(|item| {
            let item = item?;
            if item.is_instance_of::<PyBool>() {
                return Err(refused());
            }
            item.extract::<u64>().map_err(|_| refused())
        })
        .collect()
}

pub(crate) fn py_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<SampleId>> {
    // A masked id is no id: its raw value had been read.
    no_masked(obj, "ids")?;
    // Integer ids in a numpy array: read in place, no Python int per id.
    if let Ok(ints) = obj.cast::<numpy::PyArray1<i64>>() {
        let ints = ints.readonly();
        let ints = ints.as_array();
        return ints
            .iter()
            .enumerate()
            .map(|(row, &v)| {
                u64::try_from(v)
                    .map(SampleId::from)
                    .map_err(|_| bad(format!("ids: row {row} is negative")))
            })
            .collect();
    }
    // A str is a sequence too, of its characters: never what was meant.
    if obj.is_instance_of::<PyString>() {
        return Err(bad("ids: a sequence of str or int, not one str".into()));
    }
    // Arrow ids (a pyarrow Array or ChunkedArray, a polars Series) as an `id` column is
    // read: iterated, they were Arrow scalars, "neither str nor int".
    if let Some(ids) = from_arrow(obj, arrow_ids) {
        return ids;
    }
    let list = numpy_list(obj)?;
    let items = list
        .try_iter()
        .map_err(|_| bad("ids: a sequence of str or int".into()))?;
    items
        .enumerate()
        .map(|(row, item)| {
            let item = item?;
            // Strings first: a failed integer conversion builds a Python exception, which
            // cost more than the rest of a put of string ids together.
            if item.is_instance_of::<PyString>() {
                Ok(SampleId::from(string_from_py(
                    &item,
                    &format!("ids: row {row}"),
                )?))
            } else if item.is_instance_of::<pyo3::types::PyBool>() {
                Err(bad(format!("ids: row {row} is a bool, not an id")))
            } else if let Ok(n) = item.extract::<u64>() {
                Ok(SampleId::from(n))
            } else if item.hasattr("__index__").unwrap_or(false) {
                // An int (or numpy integer) outside what an id holds: say which, not that
                // it is no int.
                let text = item.str().map(|s| s.to_string()).unwrap_or_default();
                let shown = match text.char_indices().nth(40) {
                    Some((cut, _)) => format!("{}...", &text[..cut]),
                    None => text,
                };
                Err(bad(format!(
                    "ids: row {row} is {shown}: an int id is from 0 to 2**64 - 1"
                )))
            } else {
                Err(bad(format!(
                    "ids: row {row} is neither str nor a non-negative int"
                )))
            }
        })
        .collect()
}

pub(crate) fn py_meta(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<MetaValue>> {
    // A str is a sequence too: `meta={"env": "math"}` gave four samples "m", "a", "t", "h".
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(bad(format!(
            "meta {name:?}: one value per sample (a list), not a single {}",
            obj.get_type().name()?
        )));
    }
    if let Some(values) = from_arrow(obj, |a| arrow_meta(name, a)) {
        return values;
    }
    let list = numpy_list(obj)?;
    let items = list.try_iter().map_err(|_| {
        bad(format!(
            "meta {name:?}: a sequence of int, float, str or bool"
        ))
    })?;
    let mut values = items
        .enumerate()
        .map(|(row, item)| meta_from_py(&item?, &format!("meta {name:?}, row {row}")))
        .collect::<PyResult<Vec<MetaValue>>>()?;
    one_meta_type(name, &mut values)?;
    Ok(values)
}

/// One type per metadata column, as a field column has one dtype: ints among floats become
/// floats (unless one is past 2^53); any other mix (a bool among numbers, a str among anything) is refused, since
/// no Arrow column (`to_arrow()`, polars, DuckDB) could hold it.
fn one_meta_type(name: &str, values: &mut [MetaValue]) -> PyResult<()> {
    let kind = |v: &MetaValue| match v {
        MetaValue::Int(_) => "int",
        MetaValue::Float(_) => "float",
        MetaValue::Str(_) => "str",
        MetaValue::Bool(_) => "bool",
        _ => "other",
    };
    let has_float = values.iter().any(|v| matches!(v, MetaValue::Float(_)));
    if has_float {
        // Past 2^53 a float would round the integer: refused, as the library refuses it.
        if let Some(row) = values
            .iter()
            .position(|v| matches!(v, MetaValue::Int(i) if i.unsigned_abs() > 1 << 53))
        {
            return Err(bad(format!(
                "meta {name:?}, row {row}: an integer past 2^53 among floats, which a float \
                 column would round; one type per column"
            )));
        }
        for v in values.iter_mut() {
            if let MetaValue::Int(i) = *v {
                *v = MetaValue::Float(i as f64);
            }
        }
    }
    let Some(first) = values.first().map(kind) else {
        return Ok(());
    };
    if let Some(row) = values.iter().position(|v| kind(v) != first) {
        return Err(bad(format!(
            "meta {name:?}, row {row}: a {} among {first} values; one type per column",
            kind(&values[row])
        )));
    }
    Ok(())
}
