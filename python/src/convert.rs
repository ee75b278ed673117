//! Values between Python and the crate: numpy arrays (through the array interface), lists
//! of arrays as ragged tensors, scalars, strings and metadata; samples and patches as dicts.
//! The only file of the bindings with `unsafe`.

use crate::errors::{py_err, BufferError};
use ndarray::{ArrayD, IxDyn};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use rollout_buffer::{MetaValue, Patch, Sample, SlotHandle, Tensor, TensorData};

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

/// Copies `n` elements of `T` from `ptr` (alignment not assumed).
///
/// # Safety
/// `ptr` must point to `n * size_of::<T>()` readable bytes holding valid `T`s, kept alive
/// for the call.
pub(crate) unsafe fn copy_elements<T: Copy>(ptr: usize, n: usize) -> Vec<T> {
    let src = ptr as *const T;
    (0..n)
        .map(|i| unsafe { std::ptr::read_unaligned(src.add(i)) })
        .collect()
}

/// A numpy (or any `__array_interface__`) array as a tensor, copied once. `None` when the
/// object is not an array.
pub(crate) fn array_from_interface(obj: &Bound<'_, PyAny>) -> Option<PyResult<Tensor>> {
    let iface = obj.getattr(intern!(obj.py(), "__array_interface__")).ok()?;
    Some((|| {
        let get = |k: &str| {
            iface
                .get_item(k)
                .map_err(|_| PyValueError::new_err(format!("__array_interface__ lacks `{k}`")))
        };
        let typestr: String = get("typestr")?.extract()?;
        let shape: Vec<usize> = get("shape")?.extract()?;
        let (ptr, _read_only): (usize, bool) = get("data")?.extract()?;
        let strides = iface.get_item("strides").ok();
        if strides.is_some_and(|s| !s.is_none()) {
            return Err(PyValueError::new_err(
                "array is not C-contiguous (numpy.ascontiguousarray it first)",
            ));
        }
        let n: usize = shape.iter().product();
        if n > 0 && ptr == 0 {
            return Err(PyValueError::new_err("array without data"));
        }
        let dims = IxDyn(&shape);
        let shaped = |e: ndarray::ShapeError| PyValueError::new_err(format!("array shape: {e}"));
        // SAFETY: numpy guarantees `n` elements of `typestr` at `ptr` for a C-contiguous
        // array; `obj` (and so its data) stays alive and the GIL is held while copying.
        let tensor = unsafe {
            match typestr.as_str() {
                "<i4" => Tensor::from(
                    ArrayD::from_shape_vec(dims, copy_elements::<i32>(ptr, n)).map_err(shaped)?,
                ),
                "<i8" => Tensor::from(
                    ArrayD::from_shape_vec(dims, copy_elements::<i64>(ptr, n)).map_err(shaped)?,
                ),
                "<f4" => Tensor::from(
                    ArrayD::from_shape_vec(dims, copy_elements::<f32>(ptr, n)).map_err(shaped)?,
                ),
                "<f8" => Tensor::from(
                    ArrayD::from_shape_vec(dims, copy_elements::<f64>(ptr, n)).map_err(shaped)?,
                ),
                "|u1" => Tensor::from(
                    ArrayD::from_shape_vec(dims, copy_elements::<u8>(ptr, n)).map_err(shaped)?,
                ),
                "|b1" => {
                    let bytes = copy_elements::<u8>(ptr, n);
                    let bools: Vec<bool> = bytes.into_iter().map(|b| b != 0).collect();
                    Tensor::from(ArrayD::from_shape_vec(dims, bools).map_err(shaped)?)
                }
                other => {
                    return Err(PyValueError::new_err(format!(
                        "unsupported array dtype `{other}`: use int32, int64, float32, \
                         float64, uint8 or bool"
                    )))
                }
            }
        };
        Ok(tensor)
    })())
}

/// `obj` as a C-contiguous numpy array when it is an array (lists and scalars as they are).
pub(crate) fn contiguous<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if obj.hasattr("__array_interface__")? {
        obj.py()
            .import("numpy")?
            .call_method1("ascontiguousarray", (obj,))
    } else {
        Ok(obj.clone())
    }
}

/// A Python value as a field.
pub(crate) fn tensor_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    if let Ok(r) = obj.extract::<PyRef<'_, Ragged>>() {
        let values = tensor_from_py(r.values.bind(obj.py()))?;
        return Tensor::ragged(values, r.lengths.clone()).map_err(py_err);
    }
    if obj.is_instance_of::<PyBool>() {
        return Ok(Tensor::scalar(obj.extract::<bool>()?));
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(Tensor::scalar(obj.extract::<i64>()?));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Tensor::scalar(obj.extract::<f64>()?));
    }
    if obj.is_instance_of::<PyString>() {
        return Ok(Tensor::scalar(obj.extract::<String>()?));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        if let Ok(strings) = obj.extract::<Vec<String>>() {
            return Ok(Tensor::from(strings));
        }
    }
    array_from_interface(obj).unwrap_or_else(|| {
        Err(PyValueError::new_err(format!(
            "unsupported field value of type {}: use a numpy array of int32, int64, \
                 float32, float64, uint8 or bool, a Python scalar, a string, a list of \
                 strings, or Ragged",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )))
    })
}

pub(crate) fn meta_from_py(obj: &Bound<'_, PyAny>) -> PyResult<MetaValue> {
    if obj.is_instance_of::<PyBool>() {
        Ok(MetaValue::Bool(obj.extract()?))
    } else if obj.is_instance_of::<PyInt>() {
        Ok(MetaValue::Int(obj.extract()?))
    } else if obj.is_instance_of::<PyFloat>() {
        Ok(MetaValue::Float(obj.extract()?))
    } else if obj.is_instance_of::<PyString>() {
        Ok(MetaValue::Str(obj.extract()?))
    } else {
        Err(PyValueError::new_err(
            "metadata values are int, float, str or bool",
        ))
    }
}

/// `{"id": ..., "birth": ..., "meta": {...}, field: value, ...}` as a sample.
pub(crate) fn sample_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Sample> {
    let dict = obj
        .cast::<PyDict>()
        .map_err(|_| PyValueError::new_err("a sample is a dict"))?;
    let id = dict
        .get_item("id")?
        .ok_or_else(|| PyValueError::new_err("a sample needs an \"id\""))?;
    let mut sample = match id.extract::<u64>() {
        Ok(n) => Sample::new(n),
        Err(_) => Sample::new(id.extract::<String>()?),
    };
    for (k, v) in dict.iter() {
        let key: String = k.extract()?;
        match key.as_str() {
            "id" => {}
            "birth" => sample = sample.birth(v.extract()?),
            "meta" => {
                let meta = v
                    .cast::<PyDict>()
                    .map_err(|_| PyValueError::new_err("\"meta\" is a dict"))?;
                for (mk, mv) in meta.iter() {
                    sample = sample.meta(&mk.extract::<String>()?, meta_from_py(&mv)?);
                }
            }
            _ => sample = sample.with(key, tensor_from_py(&v)?),
        }
    }
    Ok(sample)
}

pub(crate) fn patch_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Patch> {
    let dict = obj
        .cast::<PyDict>()
        .map_err(|_| PyValueError::new_err("an output is a dict"))?;
    let mut patch = Patch::new();
    for (k, v) in dict.iter() {
        patch = patch.with(k.extract::<String>()?, tensor_from_py(&v)?);
    }
    Ok(patch)
}

pub(crate) fn patches_from_py(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Patch>> {
    objs.iter().map(patch_from_py).collect()
}

pub(crate) fn samples_from_py(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Sample>> {
    objs.iter().map(sample_from_py).collect()
}

/// `(slot, generation)` pairs as handles (the buffer checks their generations).
pub(crate) fn handles_from_py(pairs: Vec<(u32, u32)>) -> Vec<SlotHandle> {
    pairs
        .into_iter()
        .map(|(slot, generation)| SlotHandle::new(slot, generation))
        .collect()
}

/// Little-endian bytes of a numeric array, for `numpy.frombuffer`.
fn le_bytes<T: Copy, const N: usize>(
    a: &ndarray::ArcArray<T, IxDyn>,
    to: fn(T) -> [u8; N],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len() * N);
    for &v in a.iter() {
        out.extend_from_slice(&to(v));
    }
    out
}

/// A field as Python: numpy arrays for numeric data, Python scalars for scalars, lists of
/// str for strings, a list of arrays for a ragged field.
pub(crate) fn tensor_to_py<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    if let Some(lengths) = t.lengths() {
        let parts = PyList::empty(py);
        for i in 0..lengths.len() {
            let part = match t.dtype() {
                rollout_buffer::DType::I32 => {
                    t.sequence::<i32>(i).map(|a| Tensor::from(a.to_owned()))
                }
                rollout_buffer::DType::I64 => {
                    t.sequence::<i64>(i).map(|a| Tensor::from(a.to_owned()))
                }
                rollout_buffer::DType::F32 => {
                    t.sequence::<f32>(i).map(|a| Tensor::from(a.to_owned()))
                }
                rollout_buffer::DType::F64 => {
                    t.sequence::<f64>(i).map(|a| Tensor::from(a.to_owned()))
                }
                rollout_buffer::DType::Bool => {
                    t.sequence::<bool>(i).map(|a| Tensor::from(a.to_owned()))
                }
                rollout_buffer::DType::U8 => {
                    t.sequence::<u8>(i).map(|a| Tensor::from(a.to_owned()))
                }
                _ => t.sequence::<String>(i).map(|a| Tensor::from(a.to_owned())),
            };
            if let Some(part) = part {
                parts.append(tensor_to_py(py, &part)?)?;
            }
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
    let (bytes, dtype) = match t.to_data() {
        TensorData::I32(a) => (le_bytes(&a, i32::to_le_bytes), "<i4"),
        TensorData::I64(a) => (le_bytes(&a, i64::to_le_bytes), "<i8"),
        TensorData::F32(a) => (le_bytes(&a, f32::to_le_bytes), "<f4"),
        TensorData::F64(a) => (le_bytes(&a, f64::to_le_bytes), "<f8"),
        TensorData::U8(a) => (a.iter().copied().collect(), "u1"),
        TensorData::Bool(a) => (a.iter().map(|&b| u8::from(b)).collect(), "?"),
        TensorData::Str(a) => {
            let list = PyList::new(py, a.iter().cloned())?;
            return Ok(list.into_any());
        }
        _ => return Err(BufferError::new_err("unsupported tensor type")),
    };
    // Looked up once per process, not once per field.
    static FROMBUFFER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let frombuffer = FROMBUFFER.import(py, "numpy", "frombuffer")?;
    let array = frombuffer.call1((PyBytes::new(py, &bytes), dtype))?;
    if t.shape().len() == 1 {
        return Ok(array);
    }
    array.call_method1(intern!(py, "reshape"), (PyTuple::new(py, t.shape())?,))
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
