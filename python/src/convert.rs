//! Values between Python and the crate, one sample at a time (the convenient, slow path;
//! `columns.rs` is the columnar one): samples and patches as dicts of numpy arrays
//! (through `arrays.rs`), lists of arrays as ragged tensors, scalars, strings and metadata.

use crate::arrays::{as_numpy, sequence_to_numpy, tensor_from_numpy, tensor_to_numpy};
use crate::errors::py_err;
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use rollout_buffer::{DType, MetaValue, Patch, Sample, SlotHandle, Tensor};

/// A ragged field: `values` holds several sequences back to back, `lengths` their lengths.
#[pyclass(module = "rollout_buffer._native")]
pub(crate) struct Ragged {
    values: Py<PyAny>,
    lengths: Vec<usize>,
}

#[pymethods]
impl Ragged {
    #[new]
    fn new(values: Py<PyAny>, lengths: Vec<usize>) -> Self {
        Self { values, lengths }
    }
}

/// `err`, a failed conversion of a caller's value, as a `ValueError` that says where the
/// value was (`sample 3 (id "a"), field "x"`), the original error as its cause. Other
/// errors (`MemoryError`, `KeyboardInterrupt`) pass unchanged.
pub(crate) fn at(py: Python<'_>, place: impl std::fmt::Display, err: PyErr) -> PyErr {
    let bad_value = err.is_instance_of::<PyValueError>(py)
        || err.is_instance_of::<PyTypeError>(py)
        || err.is_instance_of::<PyOverflowError>(py);
    if !bad_value {
        return err;
    }
    let wrapped = PyValueError::new_err(format!("{place}: {}", err.value(py)));
    wrapped.set_cause(py, Some(err));
    wrapped
}

/// The Python type name of `obj`, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// `obj` as a dict; `what` says what it should be (`sample 3: a sample`).
fn dict_of<'a, 'py>(obj: &'a Bound<'py, PyAny>, what: &str) -> PyResult<&'a Bound<'py, PyDict>> {
    obj.cast::<PyDict>()
        .map_err(|_| PyValueError::new_err(format!("{what} is a dict, not {}", type_name(obj))))
}

/// A Python int as an `i64`; one past its range is refused naming `what`.
fn int64(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    obj.extract::<i64>().map_err(|_| {
        PyValueError::new_err(format!(
            "{what}: the int {} does not fit in int64",
            obj.str().map(|s| s.to_string()).unwrap_or_default()
        ))
    })
}

/// A Python value as a field; `what` names it in errors (`field "x"`).
pub(crate) fn tensor_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
    let py = obj.py();
    if let Ok(r) = obj.extract::<PyRef<'_, Ragged>>() {
        let values = tensor_from_py(r.values.bind(py), what)?;
        return Tensor::ragged(values, r.lengths.clone()).map_err(|e| at(py, what, py_err(e)));
    }
    if obj.is_instance_of::<PyBool>() {
        return Ok(Tensor::scalar(obj.extract::<bool>()?));
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(Tensor::scalar(int64(obj, what)?));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Tensor::scalar(obj.extract::<f64>()?));
    }
    if obj.is_instance_of::<PyString>() {
        return Ok(Tensor::scalar(string_from_py(obj, what)?));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        if let Ok(strings) = obj.extract::<Vec<String>>() {
            return Ok(Tensor::from(strings));
        }
    }
    if let Some(array) = as_numpy(obj) {
        crate::arrays::no_masked(obj, what)?;
        return tensor_from_numpy(array, what);
    }
    if obj.hasattr(intern!(py, "__array_interface__"))? {
        // Another array type (a memoryview, a torch CPU tensor): through numpy, once.
        let array = py.import("numpy")?.call_method1("asarray", (obj,))?;
        if let Some(array) = as_numpy(&array) {
            return tensor_from_numpy(array, what);
        }
    }
    Err(PyValueError::new_err(format!(
        "{what}: unsupported value of type {}: use a numpy array of int32, int64, float32, \
         float64, uint8 or bool, a Python scalar, a string, a list of strings, or Ragged",
        type_name(obj)
    )))
}

/// A Python `str` as a Rust string: one that is not valid Unicode (a lone surrogate from
/// a bad decode) is refused naming `what`.
pub(crate) fn string_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let s = obj
        .cast::<PyString>()
        .map_err(|_| PyValueError::new_err(format!("{what}: a str, not {}", type_name(obj))))?;
    s.to_str().map(str::to_owned).map_err(|_| {
        PyValueError::new_err(format!(
            "{what}: not valid Unicode (a lone surrogate?): {}",
            s.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

/// A Python value as metadata; `what` names it in errors.
pub(crate) fn meta_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<MetaValue> {
    let py = obj.py();
    if obj.is_instance_of::<PyBool>() {
        return Ok(MetaValue::Bool(obj.extract()?));
    }
    if obj.is_instance_of::<PyString>() {
        return Ok(MetaValue::Str(string_from_py(obj, what)?));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(MetaValue::Float(obj.extract()?));
    }
    // Python ints and numpy integer scalars (anything with `__index__`), then numpy
    // floats: a value read out of an array is as good as a literal.
    let number = py.import("numbers")?;
    if obj.is_instance_of::<PyInt>() || obj.is_instance(&number.getattr("Integral")?)? {
        return int64(obj, what).map(MetaValue::Int);
    }
    if obj.is_instance(&number.getattr("Real")?)? {
        return Ok(MetaValue::Float(obj.extract()?));
    }
    // A numpy bool (not a Python bool, nor a number): as a bool, as in an array.
    if obj.is_instance(&py.import("numpy")?.getattr("bool_")?)? {
        return Ok(MetaValue::Bool(obj.call_method0("__bool__")?.extract()?));
    }
    Err(PyValueError::new_err(format!(
        "{what}: metadata values are int, float, str or bool, not {}",
        type_name(obj)
    )))
}

/// `{"id": ..., "birth": ..., "meta": {...}, field: value, ...}` as a sample; `index` is
/// its position in the call, for errors.
pub(crate) fn sample_from_py(obj: &Bound<'_, PyAny>, index: usize) -> PyResult<Sample> {
    let dict = dict_of(obj, &format!("sample {index}: a sample"))?;
    let id = dict
        .get_item("id")?
        .ok_or_else(|| PyValueError::new_err(format!("sample {index}: needs an \"id\"")))?;
    // Strings first: a failed integer conversion costs a Python exception.
    let mut sample = if id.is_instance_of::<PyString>() {
        Sample::new(string_from_py(&id, &format!("sample {index}, \"id\""))?)
    } else if id.is_instance_of::<PyInt>() && !id.is_instance_of::<PyBool>() {
        Sample::new(id.extract::<u64>().map_err(|_| {
            PyValueError::new_err(format!(
                "sample {index}: \"id\" {} is not from 0 to 2^64-1",
                id.str().map(|s| s.to_string()).unwrap_or_default()
            ))
        })?)
    } else {
        return Err(PyValueError::new_err(format!(
            "sample {index}: \"id\" is a str or an int from 0 to 2^64-1, not {}",
            type_name(&id)
        )));
    };
    let place = format!("sample {index} (id {:?})", sample.id());
    let py = obj.py();
    for (k, v) in dict.iter() {
        let key = string_from_py(&k, &format!("{place}: a key"))?;
        match key.as_str() {
            "id" => {}
            "birth" => {
                let birth = v.extract::<u64>().map_err(|e| {
                    at(
                        py,
                        format!("{place}, \"birth\" (an int from 0 to 2^64-1)"),
                        e,
                    )
                })?;
                sample = sample.birth(birth);
            }
            "meta" => {
                let meta = v
                    .cast::<PyDict>()
                    .map_err(|_| PyValueError::new_err(format!("{place}: \"meta\" is a dict")))?;
                for (mk, mv) in meta.iter() {
                    let name = string_from_py(&mk, &format!("{place}: a \"meta\" key"))?;
                    // Stored, this failed every Arrow export of the batch (a column named
                    // twice), as `put_columns` already says at the put.
                    if crate::rpc::RESERVED.contains(&name.as_str()) || dict.contains(&name)? {
                        return Err(PyValueError::new_err(format!(
                            "{place}: meta {name:?} is also the sample's own {name}: one \
                             name, one role"
                        )));
                    }
                    let value = meta_from_py(&mv, &format!("{place}, meta {name:?}"))?;
                    sample = sample.meta(&name, value);
                }
            }
            _ => {
                let tensor = tensor_from_py(&v, &format!("{place}, field {key:?}"))?;
                sample = sample.with(key, tensor);
            }
        }
    }
    Ok(sample)
}

/// An RPC's output for one sample (`{field: value}`); `index` is its position, for errors.
pub(crate) fn patch_from_py(obj: &Bound<'_, PyAny>, index: usize) -> PyResult<Patch> {
    let dict = dict_of(obj, &format!("output {index}: an output"))?;
    let mut patch = Patch::new();
    for (k, v) in dict.iter() {
        let key = string_from_py(&k, &format!("output {index}: a key"))?;
        let tensor = tensor_from_py(&v, &format!("output {index}, field {key:?}"))?;
        patch = patch.with(key, tensor);
    }
    Ok(patch)
}

pub(crate) fn patches_from_py(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Patch>> {
    objs.iter()
        .enumerate()
        .map(|(i, o)| patch_from_py(o, i))
        .collect()
}

/// Samples from dicts, each field of one type across them (see [`check_field_types`]).
pub(crate) fn samples_from_py(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Sample>> {
    let samples = objs
        .iter()
        .enumerate()
        .map(|(i, o)| sample_from_py(o, i))
        .collect::<PyResult<Vec<_>>>()?;
    check_field_types(&samples)?;
    Ok(samples)
}

/// A field's kind as a batch's column needs it the same in every sample: element type,
/// number of dimensions, raggedness.
fn kind_of(t: &Tensor) -> (DType, usize, bool) {
    (t.dtype(), t.shape().len(), t.lengths().is_some())
}

/// Describes a [`kind_of`] for messages: `int64 0-d`, `float32 1-d ragged`.
fn describe_kind((dtype, ndim, ragged): (DType, usize, bool)) -> String {
    let name = match dtype {
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::U8 => "uint8",
        DType::Bool => "bool",
        _ => "str",
    };
    format!("{name} {ndim}-d{}", if ragged { " ragged" } else { "" })
}

/// Refuses a put whose samples give one field different kinds (a Python `1` beside `0.5`,
/// int32 beside float32 arrays, a scalar beside an array): a batch of them could not be
/// read as one column, so the put, not every later read, is where it is caught.
fn check_field_types(samples: &[Sample]) -> PyResult<()> {
    let mut first: std::collections::HashMap<&str, (usize, (DType, usize, bool))> =
        std::collections::HashMap::new();
    for (i, sample) in samples.iter().enumerate() {
        for (name, tensor) in sample.fields() {
            let kind = kind_of(tensor);
            let (j, seen) = *first.entry(name).or_insert((i, kind));
            if seen != kind {
                return Err(PyValueError::new_err(format!(
                    "field {name:?}: sample {i} (id {:?}) holds {}, sample {j} (id {:?}) holds {}; \
                     a field has one element type and number of dimensions in every sample \
                     (write 1.0, not 1, beside 0.5)",
                    sample.id(),
                    describe_kind(kind),
                    samples[j].id(),
                    describe_kind(seen),
                )));
            }
        }
    }
    Ok(())
}

/// `(slot, generation)` pairs as handles (the buffer checks their generations).
pub(crate) fn handles_from_py(pairs: Vec<(u32, u32)>) -> Vec<SlotHandle> {
    pairs
        .into_iter()
        .map(|(slot, generation)| SlotHandle::new(slot, generation))
        .collect()
}

/// A field as Python: a read-only numpy array viewing the tensor's memory for numeric
/// data, a Python scalar for a scalar, `str` or a list of `str` for strings, a list of
/// views (one per sequence) for a ragged field.
pub(crate) fn tensor_to_py<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    if let Some(lengths) = t.lengths() {
        let parts = PyList::empty(py);
        for i in 0..lengths.len() {
            parts.append(sequence_to_numpy(py, t, i)?)?;
        }
        return Ok(parts.into_any());
    }
    if t.shape().is_empty() {
        if let Some(v) = t.scalar_value::<i64>() {
            return Ok(v.into_pyobject(py)?.into_any());
        }
        if let Some(v) = t.scalar_value::<i32>() {
            return Ok(v.into_pyobject(py)?.into_any());
        }
        if let Some(v) = t.scalar_value::<f64>() {
            return Ok(v.into_pyobject(py)?.into_any());
        }
        if let Some(v) = t.scalar_value::<f32>() {
            return Ok(v.into_pyobject(py)?.into_any());
        }
        if let Some(v) = t.scalar_value::<bool>() {
            return Ok(PyBool::new(py, v).to_owned().into_any());
        }
        if let Some(v) = t.scalar_value::<u8>() {
            return Ok(v.into_pyobject(py)?.into_any());
        }
        if let Some(s) = t.as_str() {
            return Ok(PyString::new(py, s).into_any());
        }
    }
    tensor_to_numpy(py, t)
}

/// A sample (only the fields a batch shows) as a dict.
pub(crate) fn view_to_py<'py>(
    py: Python<'py>,
    view: rollout_buffer::SampleView<'_>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", view.id().as_str())?;
    d.set_item("birth", view.birth())?;
    for (k, t) in view.fields() {
        d.set_item(k, tensor_to_py(py, t)?)?;
    }
    let meta = PyDict::new(py);
    for (k, v) in view.metadata() {
        match v {
            MetaValue::Int(i) => meta.set_item(k, i)?,
            MetaValue::Float(f) => meta.set_item(k, f)?,
            MetaValue::Str(s) => meta.set_item(k, s)?,
            MetaValue::Bool(b) => meta.set_item(k, b)?,
            _ => {}
        }
    }
    d.set_item("meta", meta)?;
    Ok(d)
}

/// Argument `name`, a count or a size: a Python int from 0 up to what `T` holds. Taken as
/// `i128` and narrowed here, so a negative or too large value is a `ValueError` naming the
/// argument (pyo3's own conversion raises an `OverflowError` that names nothing).
pub(crate) fn count<T: TryFrom<i128>>(name: &str, value: i128) -> PyResult<T> {
    T::try_from(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name}: {value} is out of range (a whole number from 0 to 2^{} - 1)",
            8 * std::mem::size_of::<T>()
        ))
    })
}
