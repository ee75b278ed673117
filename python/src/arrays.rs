//! numpy arrays and tensors, through rust-numpy.
//!
//! | numpy | tensor | in | out |
//! | --- | --- | --- | --- |
//! | `int32`, `int64`, `float32`, `float64`, `uint8` (native byte order) | the same | one copy, into an aligned buffer | a read-only view, no copy |
//! | `bool` | `Bool` | one copy | a read-only view, no copy |
//! | `str_` / `object` holding str | `Str` | one string each | a list of `str` |
//! | other dtypes (`float16`, big-endian, complex, ...) | refused: `ValueError` naming the field | | |
//!
//! In: an array that is not C-contiguous and aligned (Fortran order, a slice, a
//! transpose, a misaligned buffer) is first copied into one that is by numpy; then its
//! bytes are copied once. Booleans are read through their bytes (non-zero is true), never
//! as Rust `bool` directly. Out: a view's base is a small [`TensorMemory`] holding the tensor's shared
//! memory, so the array stays valid after its batch is committed, the slot reused and the
//! buffer dropped, and nothing is copied. One of the two files of the bindings with
//! `unsafe` (the other is `arrow.rs`).

use crate::convert::{string_from_py, type_name};
use ndarray::{ArrayD, ArrayViewD, IxDyn};
use numpy::prelude::*;
use numpy::{Element as NpElement, PyArray, PyArrayDescr, PyArrayDyn, PyUntypedArray};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use rollout_buffer::{DType, Element, Tensor};

/// The memory a numpy view of a tensor reads: the array's base object. The tensor's data
/// is immutable and shared (`Arc`), so holding a clone keeps it alive and unchanged.
#[pyclass(module = "rollout_buffer._native", frozen)]
pub(crate) struct TensorMemory {
    tensor: Tensor,
}

/// The tensor element type of a numpy dtype, if this package stores it: read off the
/// dtype's kind, size and byte order (no dtype objects made per call).
fn dtype_of(descr: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    if descr.is_native_byteorder() == Some(false) {
        return None;
    }
    Some(match (descr.kind(), descr.itemsize()) {
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'u', 1) => DType::U8,
        (b'b', 1) => DType::Bool,
        _ => return None,
    })
}

/// `array` as one tensor of the same shape, copied once. `what` names the value in errors
/// (`field "x"`, `column "x"`).
pub(crate) fn tensor_from_numpy(array: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<Tensor> {
    let descr = array.dtype();
    let shape = array.shape().to_vec();
    let dtype = dtype_of(&descr);
    if dtype.is_none() && !matches!(descr.kind(), b'U' | b'O') {
        return Err(PyValueError::new_err(format!(
            "{what}: unsupported dtype {}: use int32, int64, float32, float64, uint8 or \
             bool (native byte order), or str",
            descr.str().map(|s| s.to_string()).unwrap_or_default()
        )));
    }
    let Some(dtype) = dtype else {
        // Element by element, so the error names the one at fault (a lone surrogate in a
        // str is refused as such, not as a non-str).
        let flat = array
            .call_method0("ravel")?
            .call_method0("tolist")?
            .try_iter()?
            .enumerate()
            .map(|(i, item)| {
                let item = item?;
                if item.is_instance_of::<PyString>() {
                    return string_from_py(&item, &format!("{what}, element {i}"));
                }
                Err(PyValueError::new_err(format!(
                    "{what}: element {i} is {}, not str; an object array must hold str (ints \
                     past int64 and rows of different lengths also make one)",
                    type_name(&item)
                )))
            })
            .collect::<PyResult<Vec<String>>>()?;
        let values = ArrayD::from_shape_vec(IxDyn(&shape), flat)
            .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
        return Ok(Tensor::from(values));
    };
    // Read only C-ordered, aligned memory: anything else (Fortran order, a slice, a
    // transpose, a misaligned buffer) is first copied into it by numpy, once.
    let array = c_ordered(array)?;
    match dtype {
        DType::I32 => numbers::<i32>(&array, dtype, shape),
        DType::I64 => numbers::<i64>(&array, dtype, shape),
        DType::F32 => numbers::<f32>(&array, dtype, shape),
        DType::F64 => numbers::<f64>(&array, dtype, shape),
        DType::U8 => numbers::<u8>(&array, dtype, shape),
        _ => {
            // Booleans through their bytes: any non-zero byte is true (numpy's bool is one
            // byte, and a view of other bytes may hold values other than 0 and 1).
            let bytes = array.call_method1("view", ("uint8",))?;
            let bytes = bytes.cast::<PyArrayDyn<u8>>()?.readonly();
            let values: Vec<bool> = bytes.as_slice()?.iter().map(|&b| b != 0).collect();
            let values = ArrayD::from_shape_vec(IxDyn(&shape), values)
                .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
            Ok(Tensor::from(values))
        }
    }
}

/// `array` itself when it is C-contiguous and aligned, else a copy that is.
fn c_ordered<'py>(array: &Bound<'py, PyUntypedArray>) -> PyResult<Bound<'py, PyUntypedArray>> {
    let aligned: bool = array.getattr("flags")?.getattr("aligned")?.extract()?;
    if array.is_c_contiguous() && aligned {
        return Ok(array.clone());
    }
    let copy = array
        .py()
        .import("numpy")?
        .call_method1("require", (array, py_none(array.py()), "CA"))?;
    Ok(copy.cast_into::<PyUntypedArray>()?)
}

fn py_none(py: Python<'_>) -> Bound<'_, PyAny> {
    py.None().into_bound(py)
}

/// A C-ordered, aligned numeric array as a tensor over one aligned copy of its bytes (a
/// scalar for a 0-d array).
fn numbers<T: NpElement + Element + bytemuck::Pod>(
    array: &Bound<'_, PyUntypedArray>,
    dtype: DType,
    shape: Vec<usize>,
) -> PyResult<Tensor> {
    let a = array.cast::<PyArrayDyn<T>>()?.readonly();
    let values = a.as_slice()?;
    if shape.is_empty() {
        let value = values
            .first()
            .copied()
            .ok_or_else(|| PyValueError::new_err("a 0-d array without a value"))?;
        return Ok(Tensor::scalar(value));
    }
    Tensor::copy_from_bytes(dtype, shape, bytemuck::cast_slice(values))
        .ok_or_else(|| PyValueError::new_err("array bytes do not fit its shape"))
}

/// A tensor as Python: a read-only numpy array viewing its memory (strings as `str` or a
/// list of them). Ragged tensors are the caller's business (see `convert.rs`).
pub(crate) fn tensor_to_numpy<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    if t.dtype() == DType::Str {
        return match t.array::<String>() {
            Some(a) => nested_strings(py, a),
            None => Ok(PyList::empty(py).into_any()),
        };
    }
    let memory = Bound::new(py, TensorMemory { tensor: t.clone() })?;
    let held = &memory.get().tensor;
    match t.dtype() {
        DType::I32 => view(held.array::<i32>(), &memory),
        DType::I64 => view(held.array::<i64>(), &memory),
        DType::F32 => view(held.array::<f32>(), &memory),
        DType::F64 => view(held.array::<f64>(), &memory),
        DType::U8 => view(held.array::<u8>(), &memory),
        DType::Bool => view(held.array::<bool>(), &memory),
        _ => Err(PyValueError::new_err("string tensors have no numpy view")),
    }
}

/// Sequence `i` of a ragged tensor as a read-only view of its memory.
pub(crate) fn sequence_to_numpy<'py>(
    py: Python<'py>,
    t: &Tensor,
    i: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let memory = Bound::new(py, TensorMemory { tensor: t.clone() })?;
    let held = &memory.get().tensor;
    match t.dtype() {
        DType::I32 => view(held.sequence::<i32>(i), &memory),
        DType::I64 => view(held.sequence::<i64>(i), &memory),
        DType::F32 => view(held.sequence::<f32>(i), &memory),
        DType::F64 => view(held.sequence::<f64>(i), &memory),
        DType::U8 => view(held.sequence::<u8>(i), &memory),
        DType::Bool => view(held.sequence::<bool>(i), &memory),
        _ => match held.sequence::<String>(i) {
            Some(a) => nested_strings(py, a),
            None => Ok(PyList::empty(py).into_any()),
        },
    }
}

/// Strings as lists nested as deep as their array (a list for 0 or 1 dimensions): a
/// flat list had lost the shape of a 2-d field.
fn nested_strings<'py>(py: Python<'py>, a: ArrayViewD<'_, String>) -> PyResult<Bound<'py, PyAny>> {
    if a.ndim() <= 1 {
        return Ok(PyList::new(py, a.iter().map(String::as_str))?.into_any());
    }
    let rows = a
        .outer_iter()
        .map(|row| nested_strings(py, row))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PyList::new(py, rows)?.into_any())
}

/// `array` (which points into `memory`'s tensor) as a read-only numpy array whose base is
/// `memory`.
fn view<'py, T: Element + NpElement>(
    array: Option<ArrayViewD<'_, T>>,
    memory: &Bound<'py, TensorMemory>,
) -> PyResult<Bound<'py, PyAny>> {
    let array = array.ok_or_else(|| PyValueError::new_err("tensor has no values to view"))?;
    // SAFETY: `array` views memory owned by the tensor inside `memory` (an `Arc`'d array,
    // shared bytes, or the inline scalar stored in the frozen pyclass, which never moves).
    // Tensors are immutable, and `memory` becomes the numpy array's base, so the memory
    // lives and stays unchanged as long as the numpy array does.
    let numpy = unsafe { PyArray::borrow_from_array(&array, memory.clone().into_any()) };
    // Read-only: the buffer's samples are immutable, and others may share this memory.
    let readonly = numpy.readwrite().make_nonwriteable();
    Ok(readonly.as_any().clone())
}

/// Whether `obj` is a numpy array (of any dtype).
pub(crate) fn as_numpy<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
) -> Option<&'a Bound<'py, PyUntypedArray>> {
    obj.cast::<PyUntypedArray>().ok()
}

/// A numpy masked array's masked entries are its nulls, which no column holds: they were
/// stored with whatever value lay under the mask.
pub(crate) fn no_masked(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    // A plain ndarray (the common case, on the dict paths once per field) by a type
    // compare: a failed `hasattr` raises and clears an exception each time.
    if obj.is_exact_instance_of::<PyUntypedArray>() {
        return Ok(());
    }
    if as_numpy(obj).is_none() || !obj.hasattr("mask")? {
        return Ok(());
    }
    let ma = obj.py().import("numpy")?.getattr("ma")?;
    if !obj.is_instance(&ma.getattr("MaskedArray")?)? {
        return Ok(());
    }
    let masked = ma.call_method1("getmaskarray", (obj,))?;
    if masked.call_method0("any")?.extract::<bool>()? {
        let first = masked
            .call_method0("ravel")?
            .call_method0("argmax")?
            .extract::<usize>()?;
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{what}: masked (a null) at element {first}; a column holds a value for every \
             sample (fill it first: `.filled(value)`)"
        )));
    }
    Ok(())
}
