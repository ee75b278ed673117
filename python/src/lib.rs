//! Python bindings: the module `rollout_buffer._native`, wrapped by the pure-Python package
//! `rollout_buffer`.
//!
//! Awaitables run on the crate's tokio runtime (`pyo3-async-runtimes`), not a thread per
//! call; blocking twins release the GIL while they wait and check for Ctrl-C every 100 ms.
//! Numeric arrays cross by numpy's array interface into one owned copy on the way in, and
//! one `bytes` object (wrapped by `numpy.frombuffer`, no further copy) on the way out.

use ndarray::{ArrayD, IxDyn};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTimeoutError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use rollout_buffer::{
    BufferConfig, Error, MetaValue, Patch, RpcDef, Sample, Selection, SequenceBuffer, SlotHandle,
    Tensor, TensorData,
};
mod rollout;

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

create_exception!(_native, BufferError, PyException, "An error of the buffer.");
create_exception!(
    _native,
    BufferFull,
    BufferError,
    "No room now (`try_put_batch`)."
);
create_exception!(_native, Closed, BufferError, "The buffer is closed.");
create_exception!(
    _native,
    StaleHandle,
    BufferError,
    "A handle names a freed or reused slot."
);
create_exception!(
    _native,
    Timeout,
    PyTimeoutError,
    "A wait timed out; nothing was changed."
);

/// The Python exception for a buffer error: bad input is `ValueError`.
pub(crate) fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Full { .. } => BufferFull::new_err(msg),
        Error::Closed => Closed::new_err(msg),
        Error::Timeout { .. } => Timeout::new_err(msg),
        Error::StaleHandle { .. } => StaleHandle::new_err(msg),
        Error::DuplicateId { .. }
        | Error::MissingKey { .. }
        | Error::InvalidBirth { .. }
        | Error::BatchTooLarge { .. }
        | Error::LengthMismatch { .. }
        | Error::UndeclaredOutput { .. }
        | Error::MissingOutput { .. }
        | Error::UnknownRpc { .. }
        | Error::FutureVersion { .. }
        | Error::InvalidMetadata { .. }
        | Error::InvalidSelection { .. }
        | Error::InvalidRollout { .. }
        | Error::OverBudget { .. }
        | Error::VersionRegressed { .. } => PyValueError::new_err(msg),
        _ => BufferError::new_err(msg),
    }
}

/// A ragged field: `values` holds several sequences back to back, `lengths` their lengths.
#[pyclass(module = "rollout_buffer._native")]
struct Ragged {
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
unsafe fn copy_elements<T: Copy>(ptr: usize, n: usize) -> Vec<T> {
    let src = ptr as *const T;
    (0..n)
        .map(|i| unsafe { std::ptr::read_unaligned(src.add(i)) })
        .collect()
}

/// A numpy (or any `__array_interface__`) array as a tensor, copied once. `None` when the
/// object is not an array.
fn array_from_interface(obj: &Bound<'_, PyAny>) -> Option<PyResult<Tensor>> {
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

fn meta_from_py(obj: &Bound<'_, PyAny>) -> PyResult<MetaValue> {
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
fn sample_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Sample> {
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

fn patch_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Patch> {
    let dict = obj
        .cast::<PyDict>()
        .map_err(|_| PyValueError::new_err("an output is a dict"))?;
    let mut patch = Patch::new();
    for (k, v) in dict.iter() {
        patch = patch.with(k.extract::<String>()?, tensor_from_py(&v)?);
    }
    Ok(patch)
}

fn patches_from_py(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Patch>> {
    objs.iter().map(patch_from_py).collect()
}

fn samples_from_py(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Sample>> {
    objs.iter().map(sample_from_py).collect()
}

/// `(slot, generation)` pairs as handles (the buffer checks their generations).
fn handles_from_py(pairs: Vec<(u32, u32)>) -> Vec<SlotHandle> {
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
fn view_to_py<'py>(
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

/// One consumer of the buffer (see `RpcDef`).
#[pyclass(module = "rollout_buffer._native", name = "Rpc")]
#[derive(Clone)]
struct PyRpc {
    def: RpcDef,
}

#[pymethods]
impl PyRpc {
    #[new]
    #[pyo3(signature = (name, n_seqs, inputs=vec![], outputs=vec![], reads=1, selection="fifo", seed=0, lease_timeout=None, max_staleness=None, alpha=1.0, priority_key=None, exponent=1.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        n_seqs: usize,
        inputs: Vec<String>,
        outputs: Vec<String>,
        reads: u32,
        selection: &str,
        seed: u64,
        lease_timeout: Option<f64>,
        max_staleness: Option<u64>,
        alpha: f64,
        priority_key: Option<String>,
        exponent: f64,
    ) -> PyResult<Self> {
        let selection = match (selection, priority_key) {
            ("fifo", _) => Selection::Fifo,
            ("lifo", _) => Selection::Lifo,
            ("uniform", _) => Selection::Uniform { seed },
            ("recency", _) => Selection::Recency { alpha, seed },
            ("prioritized", Some(key)) => Selection::Prioritized {
                key,
                exponent,
                seed,
            },
            ("prioritized", None) => {
                return Err(PyValueError::new_err(
                    "selection `prioritized` needs `priority_key`",
                ))
            }
            (other, _) => {
                return Err(PyValueError::new_err(format!(
                    "selection `{other}`: use fifo, lifo, uniform, recency or prioritized"
                )))
            }
        };
        let mut def = RpcDef::new(name, n_seqs)
            .inputs(inputs)
            .outputs(outputs)
            .reads(reads)
            .selection(selection);
        if let Some(t) = lease_timeout {
            let t = Duration::try_from_secs_f64(t)
                .map_err(|e| PyValueError::new_err(format!("lease_timeout: {e}")))?;
            def = def.lease_timeout(t);
        }
        if let Some(s) = max_staleness {
            def = def.max_staleness(s);
        }
        Ok(Self { def })
    }
}

/// Samples leased to one RPC.
#[pyclass(module = "rollout_buffer._native", name = "Batch")]
struct PyBatch {
    inner: Mutex<Option<rollout_buffer::Batch>>,
}

impl PyBatch {
    fn take(&self) -> PyResult<rollout_buffer::Batch> {
        self.inner
            .lock()
            .map_err(|_| BufferError::new_err("batch lock poisoned"))?
            .take()
            .ok_or_else(|| BufferError::new_err("this batch was already finished"))
    }
}

#[pymethods]
impl PyBatch {
    /// The samples as dicts of the RPC's input fields (numpy arrays), with `id`, `birth`
    /// and `meta`.
    fn samples<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let guard = self
            .inner
            .lock()
            .map_err(|_| BufferError::new_err("batch lock poisoned"))?;
        let batch = guard
            .as_ref()
            .ok_or_else(|| BufferError::new_err("this batch was already finished"))?;
        let list = PyList::empty(py);
        for view in batch.samples() {
            list.append(view_to_py(py, view)?)?;
        }
        Ok(list)
    }

    /// The samples' handles, `(slot, generation)`, for `Buffer.amend_batch`.
    fn handles(&self) -> PyResult<Vec<(u32, u32)>> {
        let guard = self
            .inner
            .lock()
            .map_err(|_| BufferError::new_err("batch lock poisoned"))?;
        Ok(guard
            .as_ref()
            .map(|b| {
                b.handles()
                    .iter()
                    .map(|h| (h.slot(), h.generation()))
                    .collect()
            })
            .unwrap_or_default())
    }

    fn __len__(&self) -> usize {
        self.inner
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(rollout_buffer::Batch::len))
            .unwrap_or(0)
    }

    /// Writes `outputs` (one dict per sample) and uses one read of each.
    fn complete<'py>(
        &self,
        py: Python<'py>,
        outputs: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let patches = patches_from_py(&outputs)?;
        let batch = self.take()?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            batch.complete(patches).await.map_err(py_err)
        })
    }

    /// Uses one read of each sample without outputs.
    fn commit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let batch = self.take()?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            batch.commit().await.map_err(py_err)
        })
    }

    /// Blocking `complete`.
    fn complete_blocking(&self, py: Python<'_>, outputs: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let patches = patches_from_py(&outputs)?;
        let batch = self.take()?;
        block(py, batch.complete(patches))
    }

    /// Blocking `commit`.
    fn commit_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let batch = self.take()?;
        block(py, batch.commit())
    }

    /// Gives the samples back unused (they are redelivered).
    fn release(&self) -> PyResult<()> {
        drop(self.take()?);
        Ok(())
    }
}

/// Runs `fut` on the runtime with the GIL released, checking for Ctrl-C every 100 ms
/// (a `KeyboardInterrupt` drops the future, which the buffer tolerates at any await).
pub(crate) fn block<T: Send>(
    py: Python<'_>,
    fut: impl Future<Output = rollout_buffer::Result<T>> + Send,
) -> PyResult<T> {
    let rt = pyo3_async_runtimes::tokio::get_runtime();
    let mut fut = Box::pin(fut);
    loop {
        let step = py.detach(|| {
            rt.block_on(async { tokio::time::timeout(Duration::from_millis(100), &mut fut).await })
        });
        match step {
            Ok(result) => return result.map_err(py_err),
            Err(_) => py.check_signals()?,
        }
    }
}

/// The async sequence buffer (see the Rust `SequenceBuffer`).
#[pyclass(module = "rollout_buffer._native", name = "Buffer")]
pub(crate) struct PyBuffer_ {
    pub(crate) buf: SequenceBuffer,
}

#[pymethods]
impl PyBuffer_ {
    /// A buffer of `capacity` slots serving `rpcs`; with `store` (a path or URL:
    /// `file:///...`, `memory://`, `s3://...`), persistent and recovered from it, with
    /// `durability` `"sync"` (the default), `"interval:<ms>"` or `"none"`; with
    /// `memory_budget` (bytes), tensor fields past it are spilled to Parquet (under the
    /// store's `spill/`, or a temporary directory).
    #[new]
    #[pyo3(signature = (capacity, rpcs, store=None, external_keys=vec![], durability="sync", memory_budget=None))]
    fn new(
        py: Python<'_>,
        capacity: usize,
        rpcs: Vec<Bound<'_, PyAny>>,
        store: Option<String>,
        external_keys: Vec<String>,
        durability: &str,
        memory_budget: Option<u64>,
    ) -> PyResult<Self> {
        let durability = parse_durability(durability)?;
        let defs = rpcs
            .iter()
            .map(|r| Ok(r.extract::<PyRef<'_, PyRpc>>()?.def.clone()))
            .collect::<PyResult<Vec<RpcDef>>>()?;
        let mut config = BufferConfig::new(capacity)
            .rpcs(defs)
            .external_keys(external_keys);
        if let Some(bytes) = memory_budget {
            config = config.memory_budget(bytes);
        }
        let rt = pyo3_async_runtimes::tokio::get_runtime();
        let buf = match store {
            // Inside the runtime: the spiller is a task on it.
            None => {
                let _entered = rt.enter();
                SequenceBuffer::with_config(config).map_err(py_err)?
            }
            Some(url) => py
                .detach(|| {
                    rt.block_on(async {
                        let store = rollout_buffer::persist::Store::open(&url)?;
                        SequenceBuffer::open_in(
                            store,
                            config,
                            rollout_buffer::persist::PersistOptions::default()
                                .durability(durability),
                        )
                        .await
                    })
                })
                .map_err(py_err)?,
        };
        Ok(Self { buf })
    }

    /// Stores samples (dicts), waiting for room; resolves to one `(slot, generation)` per
    /// sample.
    fn put_batch<'py>(
        &self,
        py: Python<'py>,
        samples: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let samples = samples_from_py(&samples)?;
        let buf = self.buf.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let handles = buf.put_batch(samples).await.map_err(py_err)?;
            Ok(handles
                .iter()
                .map(|h| (h.slot(), h.generation()))
                .collect::<Vec<_>>())
        })
    }

    /// Adds or replaces fields (one dict per handle, handles as `(slot, generation)`
    /// from `put_batch` or `Batch.handles()`).
    fn amend_batch<'py>(
        &self,
        py: Python<'py>,
        handles: Vec<(u32, u32)>,
        patches: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let patches = patches_from_py(&patches)?;
        let handles = handles_from_py(handles);
        let buf = self.buf.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            buf.amend_batch(&handles, patches).await.map_err(py_err)
        })
    }

    /// Blocking `amend_batch`.
    fn amend_batch_blocking(
        &self,
        py: Python<'_>,
        handles: Vec<(u32, u32)>,
        patches: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let patches = patches_from_py(&patches)?;
        let handles = handles_from_py(handles);
        block(py, self.buf.amend_batch(&handles, patches))
    }

    /// Blocking `put_batch`.
    fn put_batch_blocking(
        &self,
        py: Python<'_>,
        samples: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<(u32, u32)>> {
        let samples = samples_from_py(&samples)?;
        let handles = block(py, self.buf.put_batch(samples))?;
        Ok(handles.iter().map(|h| (h.slot(), h.generation())).collect())
    }

    /// Waits for and leases a batch for `rpc` (`timeout` in seconds raises `Timeout`).
    #[pyo3(signature = (rpc, timeout=None))]
    fn get_batch_for_rpc<'py>(
        &self,
        py: Python<'py>,
        rpc: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let buf = self.buf.clone();
        let timeout = timeout.map(seconds).transpose()?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let batch = match timeout {
                Some(t) => buf.get_batch_for_rpc_timeout(&rpc, t).await,
                None => buf.get_batch_for_rpc(&rpc).await,
            }
            .map_err(py_err)?;
            Ok(PyBatch {
                inner: Mutex::new(Some(batch)),
            })
        })
    }

    /// Blocking `get_batch_for_rpc`.
    #[pyo3(signature = (rpc, timeout=None))]
    fn get_batch_for_rpc_blocking(
        &self,
        py: Python<'_>,
        rpc: String,
        timeout: Option<f64>,
    ) -> PyResult<PyBatch> {
        let batch = match timeout.map(seconds).transpose()? {
            Some(t) => block(py, self.buf.get_batch_for_rpc_timeout(&rpc, t))?,
            None => block(py, self.buf.get_batch_for_rpc(&rpc))?,
        };
        Ok(PyBatch {
            inner: Mutex::new(Some(batch)),
        })
    }

    /// Announces the trainer's policy version.
    fn set_policy_version(&self, version: u64) -> PyResult<()> {
        self.buf.set_policy_version(version).map_err(py_err)
    }

    /// Closes the buffer: waiters get `Closed`.
    fn close(&self) {
        self.buf.close();
    }

    /// Waits until everything is durable and archived.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        block(py, self.buf.flush())
    }

    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// A snapshot of the buffer as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.buf.stats();
        let d = PyDict::new(py);
        d.set_item("capacity", s.capacity)?;
        d.set_item("empty", s.empty)?;
        d.set_item("put", s.put)?;
        d.set_item("read", s.read)?;
        d.set_item("freed", s.freed)?;
        d.set_item("stale", s.stale)?;
        d.set_item("evicted", s.evicted)?;
        d.set_item("filtered", s.filtered)?;
        d.set_item("redelivered", s.redelivered)?;
        d.set_item("rejected", s.rejected)?;
        d.set_item("waiting_putters", s.waiting_putters)?;
        d.set_item("live_leases", s.live_leases)?;
        d.set_item("policy_version", s.policy_version)?;
        d.set_item("closed", s.closed)?;
        d.set_item("resident_bytes", s.resident_bytes)?;
        let spill = PyDict::new(py);
        spill.set_item("spilled_now", s.spill.spilled_now)?;
        spill.set_item("spilled_samples", s.spill.spilled_samples)?;
        spill.set_item("live_segments", s.spill.live_segments)?;
        spill.set_item("loads", s.spill.loads)?;
        spill.set_item("failures", s.spill.failures)?;
        d.set_item("spill", spill)?;
        let rpcs = PyDict::new(py);
        for r in &s.rpcs {
            let rd = PyDict::new(py);
            rd.set_item("eligible", r.eligible)?;
            rd.set_item("leased", r.leased)?;
            rd.set_item("reads", r.reads)?;
            rd.set_item("redelivered", r.redelivered)?;
            rd.set_item("waiting", r.waiting)?;
            rpcs.set_item(&*r.name, rd)?;
        }
        d.set_item("rpcs", rpcs)?;
        Ok(d)
    }
}

/// `"sync"`, `"none"`, or `"interval:<milliseconds>"`.
fn parse_durability(s: &str) -> PyResult<rollout_buffer::persist::Durability> {
    use rollout_buffer::persist::Durability;
    match s {
        "sync" => Ok(Durability::Sync),
        "none" => Ok(Durability::None),
        other => other
            .strip_prefix("interval:")
            .and_then(|ms| ms.parse::<u64>().ok())
            .map(|ms| Durability::Interval(Duration::from_millis(ms)))
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "durability `{other}`: use \"sync\", \"none\" or \"interval:<ms>\""
                ))
            }),
    }
}

fn seconds(t: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(t).map_err(|e| PyValueError::new_err(format!("timeout: {e}")))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBuffer_>()?;
    m.add_class::<PyBatch>()?;
    m.add_class::<PyRpc>()?;
    m.add_class::<Ragged>()?;
    m.add_class::<rollout::PyIngest>()?;
    m.add_class::<rollout::PyBatcher>()?;
    m.add_class::<rollout::PyTrainBatch>()?;
    let py = m.py();
    m.add("BufferError", py.get_type::<BufferError>())?;
    m.add("BufferFull", py.get_type::<BufferFull>())?;
    m.add("Closed", py.get_type::<Closed>())?;
    m.add("StaleHandle", py.get_type::<StaleHandle>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    // The Rust constant itself, so the two can never disagree.
    m.add(
        "GROUP_INPUTS",
        rollout_buffer::rollout::GROUP_INPUTS.to_vec(),
    )?;
    Ok(())
}
