//! Arrow across the language boundary: the Arrow C Data Interface through the PyCapsule
//! protocol (`__arrow_c_schema__`, `__arrow_c_array__`, `__arrow_c_stream__`), with
//! arrow-rs's own `ffi` and `ffi_stream` doing the data interface. pyarrow, polars and
//! DuckDB all produce and consume it, so none of them is a dependency.
//!
//! Capsule names and ownership follow the protocol: a capsule owns the struct it holds
//! until a consumer moves it out (setting its `release` to null); the capsule's destructor
//! then releases whatever was not moved. One of the two files with `unsafe` (see
//! `arrays.rs`).

use arrow_array::ffi::{from_ffi, to_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::ffi_stream::{FFI_ArrowArrayStream, RecordBatchStreamReader};
use arrow_array::{Array, RecordBatch, RecordBatchIterator, StructArray};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};
use std::ffi::CStr;

const SCHEMA: &CStr = c"arrow_schema";
const ARRAY: &CStr = c"arrow_array";
const STREAM: &CStr = c"arrow_array_stream";

fn arrow_err(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("Arrow: {e}"))
}

/// `batch` as the `(schema, array)` capsule pair of `__arrow_c_array__`.
pub(crate) fn export_array<'py>(
    py: Python<'py>,
    batch: &RecordBatch,
) -> PyResult<Bound<'py, PyTuple>> {
    let data = StructArray::from(batch.clone()).into_data();
    let (array, schema) = to_ffi(&data).map_err(arrow_err)?;
    let schema = PyCapsule::new_with_value(py, schema, SCHEMA)?;
    let array = PyCapsule::new_with_value(py, array, ARRAY)?;
    PyTuple::new(py, [schema.into_any(), array.into_any()])
}

/// `batch`'s schema as the capsule of `__arrow_c_schema__`.
pub(crate) fn export_schema<'py>(
    py: Python<'py>,
    batch: &RecordBatch,
) -> PyResult<Bound<'py, PyCapsule>> {
    let schema = FFI_ArrowSchema::try_from(batch.schema().as_ref()).map_err(arrow_err)?;
    PyCapsule::new_with_value(py, schema, SCHEMA)
}

/// `batch` as a one-batch stream, the capsule of `__arrow_c_stream__`.
pub(crate) fn export_stream<'py>(
    py: Python<'py>,
    batch: RecordBatch,
) -> PyResult<Bound<'py, PyCapsule>> {
    let schema = batch.schema();
    let reader = RecordBatchIterator::new([Ok(batch)], schema);
    let stream = FFI_ArrowArrayStream::new(Box::new(reader));
    PyCapsule::new_with_value(py, stream, STREAM)
}

/// The record batches of any object that exports Arrow: a stream (`__arrow_c_stream__`:
/// a pyarrow Table, a polars DataFrame, a DuckDB relation) or one struct array
/// (`__arrow_c_array__`: a pyarrow RecordBatch). `None` if it exports neither.
pub(crate) fn import_batches(obj: &Bound<'_, PyAny>) -> Option<PyResult<Vec<RecordBatch>>> {
    if obj.hasattr("__arrow_c_stream__").ok()? {
        return Some(import_stream(obj));
    }
    if obj.hasattr("__arrow_c_array__").ok()? {
        return Some(import_array(obj).map(|b| vec![b]));
    }
    None
}

fn import_stream(obj: &Bound<'_, PyAny>) -> PyResult<Vec<RecordBatch>> {
    let capsule = obj.call_method0("__arrow_c_stream__")?;
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("__arrow_c_stream__ did not return a capsule"))?;
    let pointer = capsule.pointer_checked(Some(STREAM))?;
    // SAFETY: the capsule is named `arrow_array_stream`, so by the PyCapsule protocol it
    // holds an initialised `ArrowArrayStream`, which `from_raw` moves out of (setting its
    // release to null, so the capsule's destructor leaves it alone). The capsule is alive
    // for the call.
    let reader =
        unsafe { RecordBatchStreamReader::from_raw(pointer.as_ptr().cast()) }.map_err(arrow_err)?;
    // arrow-rs builds each batch from the imported arrays before `validated` can look at
    // them, and a malformed array can make that panic: an error here, never a crash.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reader
            .map(|b| b.map_err(arrow_err).and_then(validated))
            .collect()
    }))
    .unwrap_or_else(|_| {
        Err(PyValueError::new_err(
            "Arrow: the stream holds a malformed array",
        ))
    })
}

/// `batch`, once every column is checked whole (offsets in bounds, buffers long enough):
/// arrays from another library are data, and a malformed one must be an error here, never
/// a panic or a read out of bounds later.
fn validated(batch: RecordBatch) -> PyResult<RecordBatch> {
    for column in batch.columns() {
        column.to_data().validate_full().map_err(arrow_err)?;
    }
    Ok(batch)
}

fn import_array(obj: &Bound<'_, PyAny>) -> PyResult<RecordBatch> {
    let pair = obj.call_method0("__arrow_c_array__")?;
    let (schema, array): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair.extract()?;
    let schema = schema
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("__arrow_c_array__ did not return capsules"))?;
    let array = array
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("__arrow_c_array__ did not return capsules"))?;
    let schema_ptr = schema.pointer_checked(Some(SCHEMA))?;
    let array_ptr = array.pointer_checked(Some(ARRAY))?;
    // SAFETY: capsules named `arrow_schema` and `arrow_array` hold initialised C Data
    // Interface structs (the protocol). The schema is only read; the array is moved out
    // (its release set to null in the capsule), and `from_ffi` takes ownership of it.
    let data = unsafe {
        let schema: &FFI_ArrowSchema = &*schema_ptr.as_ptr().cast::<FFI_ArrowSchema>();
        let array = std::ptr::replace(array_ptr.as_ptr().cast(), FFI_ArrowArray::empty());
        from_ffi(array, schema)
    }
    .map_err(arrow_err)?;
    data.validate_full().map_err(arrow_err)?;
    if !matches!(data.data_type(), arrow_schema::DataType::Struct(_)) {
        return Err(PyValueError::new_err(format!(
            "Arrow: __arrow_c_array__ gave a {} array, not a struct of columns",
            data.data_type()
        )));
    }
    let array = StructArray::from(data);
    if array.null_count() > 0 {
        return Err(PyValueError::new_err(
            "Arrow: the struct array has null rows",
        ));
    }
    validated(RecordBatch::from(array))
}
