//! `Buffer`: the sequence buffer for Python, in memory or on a store, with awaitable and
//! blocking calls.

use crate::batch::PyBatch;
use crate::columns::{Columns, Role};
use crate::convert::{count, handles_from_py, patches_from_py, samples_from_py};
use crate::errors::py_err;
use crate::interpreter::runtime;
use crate::rpc::PyRpc;
use crate::runtime::{awaitable, block, seconds, timeout_arg, within};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rollout_buffer::{BufferConfig, RpcDef, SequenceBuffer};
use std::sync::Mutex;
use std::time::Duration;

/// A put, with its timeout if one is given.
async fn put(
    buf: &SequenceBuffer,
    samples: Vec<rollout_buffer::Sample>,
    timeout: Option<Duration>,
    call: &str,
) -> rollout_buffer::Result<Vec<rollout_buffer::SlotHandle>> {
    let result = match timeout {
        Some(t) => buf.put_batch_timeout(samples, t).await,
        None => buf.put_batch(samples).await,
    };
    // A timeout names the Python call that timed out (`put_columns`, say).
    result.map_err(|mut e| {
        if let rollout_buffer::Error::Timeout { op, .. } = &mut e {
            *op = call.to_owned();
        }
        e
    })
}

/// Handles as `(slot, generation)` pairs for Python.
fn pairs(handles: &[rollout_buffer::SlotHandle]) -> Vec<(u32, u32)> {
    handles.iter().map(|h| (h.slot(), h.generation())).collect()
}

impl PyBuffer_ {
    fn column_samples(
        &self,
        columns: &Bound<'_, PyAny>,
        ids: Option<&Bound<'_, PyAny>>,
        meta: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<rollout_buffer::Sample>> {
        let keys: Vec<&str> = self.buf.keys().collect();
        Ok(Columns::read(columns, ids, meta, Role::Put, &keys, None)?.into_samples())
    }

    /// Dict samples, each field checked against the keys the RPCs declare (as the column
    /// path checks its columns): a misspelt key would be stored, and the RPC reading the
    /// right one would wait for it forever.
    fn dict_samples(&self, samples: &[Bound<'_, PyAny>]) -> PyResult<Vec<rollout_buffer::Sample>> {
        let samples = samples_from_py(samples)?;
        let declared: Vec<&str> = self.buf.keys().collect();
        for (row, sample) in samples.iter().enumerate() {
            let place = || format!("sample {row} (id {:?})", sample.id().as_str());
            check_dict_keys(&declared, sample.fields().map(|(k, _)| k), place)?;
        }
        Ok(samples)
    }

    /// Dict patches, checked as [`Self::dict_samples`] checks samples.
    fn dict_patches(&self, patches: &[Bound<'_, PyAny>]) -> PyResult<Vec<rollout_buffer::Patch>> {
        let patches = patches_from_py(patches)?;
        let declared: Vec<&str> = self.buf.keys().collect();
        for (row, patch) in patches.iter().enumerate() {
            check_dict_keys(&declared, patch.keys(), || format!("patch {row}"))?;
        }
        Ok(patches)
    }

    fn column_patches(
        &self,
        columns: &Bound<'_, PyAny>,
        rows: usize,
    ) -> PyResult<Vec<rollout_buffer::Patch>> {
        let keys: Vec<&str> = self.buf.keys().collect();
        Ok(Columns::read(columns, None, None, Role::Patch, &keys, Some(rows))?.into_patches())
    }
}

/// `fields` of one dict sample or patch (at `place`) against the buffer's keys.
fn check_dict_keys<'k>(
    declared: &[&str],
    mut fields: impl Iterator<Item = &'k str>,
    place: impl Fn() -> String,
) -> PyResult<()> {
    match fields.find(|k| !declared.is_empty() && !declared.contains(k)) {
        None => Ok(()),
        Some(key) => Err(PyValueError::new_err(format!(
            "{}: field {key:?} is not a key of any RPC (declared: {}); declare it as an RPC \
             input, output or external key, or store it under \"meta\"",
            place(),
            declared.join(", ")
        ))),
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
    #[pyo3(signature = (capacity, rpcs, store=None, external_keys=vec![], durability="sync", memory_budget=None, wait_warning=Some(60.0)))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        capacity: i128,
        rpcs: Vec<Bound<'_, PyAny>>,
        store: Option<String>,
        external_keys: Vec<String>,
        durability: &str,
        memory_budget: Option<i128>,
        wait_warning: Option<f64>,
    ) -> PyResult<Self> {
        let capacity: usize = count("capacity", capacity)?;
        let memory_budget: Option<u64> = memory_budget
            .map(|b| count("memory_budget", b))
            .transpose()?;
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
        if let Some(after) = wait_warning {
            config = config.wait_warning(seconds("wait_warning", after)?);
        }
        if store.as_deref().is_some_and(|url| url.trim().is_empty()) {
            return Err(PyValueError::new_err(
                "store: an empty URL (None keeps the buffer in memory)",
            ));
        }
        let buf = match store {
            // Inside the runtime: the spiller is a task on it.
            None => {
                let _entered = runtime()?.enter();
                SequenceBuffer::with_config(config).map_err(py_err)?
            }
            // Opening may wait on the store (recovery, a slow object store): Ctrl-C works.
            Some(url) => block(py, async move {
                let store = rollout_buffer::persist::Store::open(&url)?;
                SequenceBuffer::open_in(
                    store,
                    config,
                    rollout_buffer::persist::PersistOptions::default().durability(durability),
                )
                .await
            })?,
        };
        Ok(Self { buf })
    }

    /// Stores samples (dicts), waiting for room; resolves to one `(slot, generation)` per
    /// sample. `timeout` in seconds raises `Timeout`.
    #[pyo3(signature = (samples, timeout=None))]
    fn put_batch<'py>(
        &self,
        py: Python<'py>,
        samples: Vec<Bound<'py, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let samples = self.dict_samples(&samples)?;
        let timeout = timeout_arg(timeout)?;
        let buf = self.buf.clone();
        awaitable(py, async move {
            let handles = put(&buf, samples, timeout, "put_batch")
                .await
                .map_err(py_err)?;
            Ok(pairs(&handles))
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
        let patches = self.dict_patches(&patches)?;
        let handles = handles_from_py(handles);
        let buf = self.buf.clone();
        awaitable(py, async move {
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
        let patches = self.dict_patches(&patches)?;
        let handles = handles_from_py(handles);
        block(py, self.buf.amend_batch(&handles, patches))
    }

    /// Stores samples given as columns, one row per sample (numpy arrays `[n, ...]`,
    /// `(values, offsets)`, lists of arrays or of str, or anything exporting Arrow), with
    /// ids from `ids` or an `id` column and metadata from `meta` (a dict of columns, or
    /// names of columns); resolves to one `(slot, generation)` per sample. All or nothing.
    /// `timeout` in seconds raises `Timeout`.
    #[pyo3(signature = (columns, ids=None, meta=None, timeout=None))]
    fn put_columns<'py>(
        &self,
        py: Python<'py>,
        columns: Bound<'py, PyAny>,
        ids: Option<Bound<'py, PyAny>>,
        meta: Option<Bound<'py, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let samples = self.column_samples(&columns, ids.as_ref(), meta.as_ref())?;
        let timeout = timeout_arg(timeout)?;
        let buf = self.buf.clone();
        awaitable(py, async move {
            let handles = put(&buf, samples, timeout, "put_columns")
                .await
                .map_err(py_err)?;
            Ok(pairs(&handles))
        })
    }

    /// Blocking `put_columns`.
    #[pyo3(signature = (columns, ids=None, meta=None, timeout=None))]
    fn put_columns_blocking(
        &self,
        py: Python<'_>,
        columns: Bound<'_, PyAny>,
        ids: Option<Bound<'_, PyAny>>,
        meta: Option<Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<(u32, u32)>> {
        let samples = self.column_samples(&columns, ids.as_ref(), meta.as_ref())?;
        let timeout = timeout_arg(timeout)?;
        let handles = block(py, put(&self.buf, samples, timeout, "put_columns"))?;
        Ok(pairs(&handles))
    }

    /// Adds or replaces fields given as columns, one row per handle (`(slot,
    /// generation)` pairs from `put_batch`, `put_columns` or `Batch.handles()`).
    fn amend_columns<'py>(
        &self,
        py: Python<'py>,
        handles: Vec<(u32, u32)>,
        columns: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let patches = self.column_patches(&columns, handles.len())?;
        let handles = handles_from_py(handles);
        let buf = self.buf.clone();
        awaitable(py, async move {
            buf.amend_batch(&handles, patches).await.map_err(py_err)
        })
    }

    /// Blocking `amend_columns`.
    fn amend_columns_blocking(
        &self,
        py: Python<'_>,
        handles: Vec<(u32, u32)>,
        columns: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let patches = self.column_patches(&columns, handles.len())?;
        let handles = handles_from_py(handles);
        block(py, self.buf.amend_batch(&handles, patches))
    }

    /// Blocking `put_batch`.
    #[pyo3(signature = (samples, timeout=None))]
    fn put_batch_blocking(
        &self,
        py: Python<'_>,
        samples: Vec<Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<(u32, u32)>> {
        let samples = self.dict_samples(&samples)?;
        let timeout = timeout_arg(timeout)?;
        let handles = block(py, put(&self.buf, samples, timeout, "put_batch"))?;
        Ok(pairs(&handles))
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
        let timeout = timeout_arg(timeout)?;
        awaitable(py, async move {
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

    /// A batch for `rpc` if one is ready now, else `None`; never waits.
    fn try_get_batch_for_rpc(&self, rpc: &str) -> PyResult<Option<PyBatch>> {
        crate::interpreter::check_not_forked()?;
        // Inside the runtime's context: loads of spilled inputs it starts run there.
        let _entered = crate::interpreter::runtime()?.enter();
        let batch = self.buf.try_get_batch_for_rpc(rpc).map_err(py_err)?;
        Ok(batch.map(|batch| PyBatch {
            inner: Mutex::new(Some(batch)),
        }))
    }

    /// Blocking `get_batch_for_rpc`.
    #[pyo3(signature = (rpc, timeout=None))]
    fn get_batch_for_rpc_blocking(
        &self,
        py: Python<'_>,
        rpc: String,
        timeout: Option<f64>,
    ) -> PyResult<PyBatch> {
        let batch = match timeout_arg(timeout)? {
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

    /// Waits until everything is durable and archived (`timeout` in seconds raises
    /// `Timeout`; what was flushing goes on).
    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        match timeout_arg(timeout)? {
            Some(t) => block(py, within(t, "flush", self.buf.flush())),
            None => block(py, self.buf.flush()),
        }
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
        spill.set_item("undeleted_segments", s.spill.undeleted_segments)?;
        d.set_item("spill", spill)?;
        let rpcs = PyDict::new(py);
        for r in &s.rpcs {
            let rd = PyDict::new(py);
            rd.set_item("eligible", r.eligible)?;
            rd.set_item("leased", r.leased)?;
            rd.set_item("reads", r.reads)?;
            rd.set_item("redelivered", r.redelivered)?;
            rd.set_item("waiting", r.waiting)?;
            rd.set_item("wait_warnings", r.wait_warnings)?;
            rpcs.set_item(&*r.name, rd)?;
        }
        d.set_item("rpcs", rpcs)?;
        Ok(d)
    }

    /// Why a getter of `rpc` would wait now, as a dict: eligible samples against the
    /// batch size, then every stored sample under the first reason it is not eligible, and
    /// the input keys samples lack.
    fn explain<'py>(&self, py: Python<'py>, rpc: &str) -> PyResult<Bound<'py, PyDict>> {
        let w = self.buf.explain(rpc).map_err(py_err)?;
        let d = PyDict::new(py);
        d.set_item("rpc", &*w.name)?;
        d.set_item("batch_size", w.batch_size)?;
        d.set_item("waiting", w.waiting)?;
        d.set_item("eligible", w.eligible)?;
        d.set_item("leased", w.leased)?;
        d.set_item("used_up", w.used_up)?;
        d.set_item("stale", w.stale)?;
        d.set_item("dropped_stale", w.dropped_stale)?;
        d.set_item("discarded", w.discarded)?;
        d.set_item("amending", w.amending)?;
        d.set_item("incomplete", w.incomplete)?;
        let missing = PyDict::new(py);
        for (key, n) in &w.missing {
            missing.set_item(key, n)?;
        }
        d.set_item("missing", missing)?;
        d.set_item("rate_limited", w.rate_limited)?;
        Ok(d)
    }
}

/// `"sync"`, `"none"`, or `"interval:<milliseconds>"` (the library's `FromStr`); a bad
/// one is a `ValueError`.
pub(crate) fn parse_durability(s: &str) -> PyResult<rollout_buffer::persist::Durability> {
    s.parse()
        .map_err(|e: rollout_buffer::Error| PyValueError::new_err(e.to_string()))
}
