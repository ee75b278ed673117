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
use arrow_array::ffi_stream::{ArrayStreamReader, FFI_ArrowArrayStream, RecordBatchStreamReader};
use arrow_array::{
    make_array, Array, ArrayReader, ArrayRef, RecordBatch, RecordBatchIterator, RecordBatchReader,
    StructArray,
};
use arrow_schema::{Field, SchemaRef};
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
/// The schema comes too: a stream of no batches (an empty table) still names its columns.
pub(crate) fn import_batches(
    obj: &Bound<'_, PyAny>,
) -> Option<PyResult<(SchemaRef, Vec<RecordBatch>)>> {
    if obj.hasattr("__arrow_c_stream__").ok()? {
        return Some(import_stream(obj));
    }
    if obj.hasattr("__arrow_c_array__").ok()? {
        return Some(import_array(obj).map(|b| (b.schema(), vec![b])));
    }
    None
}

/// One column from an object exporting Arrow that is not numpy's: one array
/// (`__arrow_c_array__`: a pyarrow Array) or a stream of them (`__arrow_c_stream__`: a
/// ChunkedArray, a polars Series), its chunks in order, with its field. `None` if it
/// exports neither. Read as Arrow, not through `numpy.asarray`, which made nulls NaN and
/// int64 floats.
pub(crate) fn import_column(obj: &Bound<'_, PyAny>) -> Option<PyResult<(Field, Vec<ArrayRef>)>> {
    if obj.hasattr("__arrow_c_array__").ok()? {
        return Some(import_one_array(obj));
    }
    if obj.hasattr("__arrow_c_stream__").ok()? {
        return Some(import_array_stream(obj));
    }
    None
}

fn import_one_array(obj: &Bound<'_, PyAny>) -> PyResult<(Field, Vec<ArrayRef>)> {
    let (schema, array) = array_capsules(obj)?;
    let schema_ptr = schema.pointer_checked(Some(SCHEMA))?;
    let array_ptr = array.pointer_checked(Some(ARRAY))?;
    // SAFETY: as in `import_array`: capsules named `arrow_schema` and `arrow_array` hold
    // initialised C Data Interface structs; the schema is only read, the array moved out.
    let (field, data) = guarded("__arrow_c_array__", || unsafe {
        let schema: &FFI_ArrowSchema = &*schema_ptr.as_ptr().cast::<FFI_ArrowSchema>();
        let field = Field::try_from(schema).map_err(arrow_err)?;
        let array = std::ptr::replace(array_ptr.as_ptr().cast(), FFI_ArrowArray::empty());
        Ok((field, from_ffi(array, schema).map_err(arrow_err)?))
    })?;
    data.validate_full().map_err(arrow_err)?;
    Ok((field, vec![make_array(data)]))
}

fn import_array_stream(obj: &Bound<'_, PyAny>) -> PyResult<(Field, Vec<ArrayRef>)> {
    let capsule = stream_capsule(obj)?;
    let pointer = capsule.pointer_checked(Some(STREAM))?;
    // SAFETY: as in `import_stream`: the capsule holds an initialised stream, which
    // `from_raw` moves out of.
    let reader =
        unsafe { ArrayStreamReader::from_raw(pointer.as_ptr().cast()) }.map_err(arrow_err)?;
    let field = reader.field().as_ref().clone();
    let chunks = guarded("__arrow_c_stream__", || {
        reader
            .map(|a| {
                let a = a.map_err(arrow_err)?;
                a.to_data().validate_full().map_err(arrow_err)?;
                Ok(a)
            })
            .collect::<PyResult<Vec<ArrayRef>>>()
    })?;
    Ok((field, chunks))
}

/// The capsule `obj.__arrow_c_stream__()` returns.
fn stream_capsule<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyCapsule>> {
    obj.call_method0("__arrow_c_stream__")?
        .cast_into::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("__arrow_c_stream__ did not return a capsule"))
}

/// `read()` of an imported stream or array (`from` names where it came from): arrow-rs
/// builds each array before it can be validated, and a malformed one (a schema that does
/// not match its array, a capsule handed out twice) can make that panic: an error here,
/// never a crash or a `PanicException`.
fn guarded<T>(from: &str, read: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|_| {
        Err(PyValueError::new_err(format!(
            "Arrow: {from} gave a malformed array (does its schema match it? was the \
             capsule already used?)"
        )))
    })
}

fn array_capsules<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyCapsule>, Bound<'py, PyCapsule>)> {
    let pair = obj.call_method0("__arrow_c_array__")?;
    let (schema, array): (Bound<'py, PyAny>, Bound<'py, PyAny>) = pair.extract()?;
    let capsule = |c: Bound<'py, PyAny>| {
        c.cast_into::<PyCapsule>()
            .map_err(|_| PyTypeError::new_err("__arrow_c_array__ did not return capsules"))
    };
    Ok((capsule(schema)?, capsule(array)?))
}

fn import_stream(obj: &Bound<'_, PyAny>) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
    let capsule = stream_capsule(obj)?;
    let pointer = capsule.pointer_checked(Some(STREAM))?;
    // SAFETY: the capsule is named `arrow_array_stream`, so by the PyCapsule protocol it
    // holds an initialised `ArrowArrayStream`, which `from_raw` moves out of (setting its
    // release to null, so the capsule's destructor leaves it alone). The capsule is alive
    // for the call.
    let reader =
        unsafe { RecordBatchStreamReader::from_raw(pointer.as_ptr().cast()) }.map_err(arrow_err)?;
    let schema = reader.schema();
    guarded("__arrow_c_stream__", || {
        reader
            .map(|b| b.map_err(arrow_err).and_then(validated))
            .collect::<PyResult<Vec<RecordBatch>>>()
            .map(|batches| (schema, batches))
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
    let (schema, array) = array_capsules(obj)?;
    let schema_ptr = schema.pointer_checked(Some(SCHEMA))?;
    let array_ptr = array.pointer_checked(Some(ARRAY))?;
    // SAFETY: capsules named `arrow_schema` and `arrow_array` hold initialised C Data
    // Interface structs (the protocol). The schema is only read; the array is moved out
    // (its release set to null in the capsule), and `from_ffi` takes ownership of it.
    let data = guarded("__arrow_c_array__", || unsafe {
        let schema: &FFI_ArrowSchema = &*schema_ptr.as_ptr().cast::<FFI_ArrowSchema>();
        let array = std::ptr::replace(array_ptr.as_ptr().cast(), FFI_ArrowArray::empty());
        from_ffi(array, schema).map_err(arrow_err)
    })?;
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
