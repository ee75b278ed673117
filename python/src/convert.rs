//! Values between Python and the crate, one sample at a time (the convenient, slow path;
//! `columns.rs` is the columnar one): samples and patches as dicts of numpy arrays
//! (through `arrays.rs`), lists of arrays as ragged tensors, scalars, strings and metadata.

use crate::arrays::{as_numpy, sequence_to_numpy, tensor_from_numpy, tensor_to_numpy};
use crate::errors::py_err;
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use rollout_buffer::{MetaValue, Patch, Sample, SlotHandle, Tensor};

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
    if let Some(array) = as_numpy(obj) {
        return tensor_from_numpy(array, "field");
    }
    if obj.hasattr(intern!(obj.py(), "__array_interface__"))? {
        // Another array type (a memoryview, a torch CPU tensor): through numpy, once.
        let array = obj.py().import("numpy")?.call_method1("asarray", (obj,))?;
        if let Some(array) = as_numpy(&array) {
            return tensor_from_numpy(array, "field");
        }
    }
    Err(PyValueError::new_err(format!(
        "unsupported field value of type {}: use a numpy array of int32, int64, float32, \
         float64, uint8 or bool, a Python scalar, a string, a list of strings, or Ragged",
        obj.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    )))
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
    // Strings first: a failed integer conversion costs a Python exception.
    let mut sample = match id.cast::<PyString>() {
        Ok(s) => Sample::new(s.to_str()?),
        Err(_) => Sample::new(id.extract::<u64>()?),
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
