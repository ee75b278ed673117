//! `Batch`: a leased batch, its samples as dicts, and its completion.

use crate::arrow::{export_array, export_schema, export_stream};
use crate::columns::{batch_columns, Columns, Role};
use crate::convert::{patches_from_py, view_to_py};
use crate::errors::{py_err, BufferError};
use crate::runtime::{awaitable, block};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList, PyTuple};
use std::sync::Mutex;

/// Samples leased to one RPC.
#[pyclass(module = "rollout_buffer._native", name = "Batch")]
pub(crate) struct PyBatch {
    pub(crate) inner: Mutex<Option<rollout_buffer::Batch>>,
}

impl PyBatch {
    /// Output columns as one patch per sample, checked against the batch's size.
    /// Checked against the RPC's declared outputs before the batch is touched: a rejected
    /// call leaves the batch held, to complete properly.
    fn output_patches(&self, columns: &Bound<'_, PyAny>) -> PyResult<Vec<rollout_buffer::Patch>> {
        let (n, outputs) = self.with(|b| {
            Ok((
                b.len(),
                b.output_keys()
                    .iter()
                    .map(|k| k.to_string())
                    .collect::<Vec<_>>(),
            ))
        })?;
        let keys: Vec<&str> = outputs.iter().map(String::as_str).collect();
        Ok(Columns::read(columns, None, None, Role::Patch, &keys, Some(n))?.into_patches())
    }

    /// Dict outputs as patches, checked against the RPC's declared outputs first (as
    /// `output_patches`).
    fn dict_patches(&self, outputs: &[Bound<'_, PyAny>]) -> PyResult<Vec<rollout_buffer::Patch>> {
        let patches = patches_from_py(outputs)?;
        self.with(|b| {
            let declared = b.output_keys();
            for (row, p) in patches.iter().enumerate() {
                if let Some(key) = p.keys().find(|k| !declared.contains(k)) {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "output {row}: RPC `{}` does not declare output `{key}` (declared: {})",
                        b.rpc_name(),
                        declared.join(", ")
                    )));
                }
            }
            Ok(())
        })?;
        Ok(patches)
    }

    /// The batch's slot (`None` once finished).
    fn slot(&self) -> PyResult<std::sync::MutexGuard<'_, Option<rollout_buffer::Batch>>> {
        self.inner
            .lock()
            .map_err(|_| BufferError::new_err("batch lock poisoned"))
    }

    /// Runs `f` on the batch, unless it was finished.
    fn with<T>(&self, f: impl FnOnce(&rollout_buffer::Batch) -> PyResult<T>) -> PyResult<T> {
        f(self.slot()?.as_ref().ok_or_else(finished)?)
    }

    fn record_batch(&self) -> PyResult<arrow_array::RecordBatch> {
        self.with(|b| b.to_record_batch().map_err(py_err))
    }

    fn take(&self) -> PyResult<rollout_buffer::Batch> {
        self.slot()?.take().ok_or_else(finished)
    }

    /// The batch, once a commit passes its check (the RPC owes no outputs): a refused
    /// commit keeps the lease, so the caller can complete it with outputs instead.
    fn take_for_commit(&self) -> PyResult<rollout_buffer::Batch> {
        let mut slot = self.slot()?;
        let batch = slot.as_ref().ok_or_else(finished)?;
        batch.check_commit().map_err(py_err)?;
        slot.take().ok_or_else(finished)
    }

    /// The batch, once `outputs` pass `complete`'s checks: a rejected completion keeps the
    /// lease, so the caller can correct its outputs and complete again.
    fn take_for_complete(
        &self,
        outputs: &[rollout_buffer::Patch],
    ) -> PyResult<rollout_buffer::Batch> {
        let mut slot = self.slot()?;
        let batch = slot.as_ref().ok_or_else(finished)?;
        batch.check_outputs_for_complete(outputs).map_err(py_err)?;
        slot.take().ok_or_else(finished)
    }
}

/// Fails, with the batch still held, when no asyncio event loop runs here: the awaitable
/// a completion returns needs one, and finding that out only after the batch was taken
/// gave the lease up (redelivering the samples) for a call that raised.
pub(crate) fn needs_event_loop(py: Python<'_>) -> PyResult<()> {
    pyo3_async_runtimes::tokio::get_current_loop(py).map(drop)
}

/// The error of a batch used after it was finished.
fn finished() -> PyErr {
    BufferError::new_err("this batch was already finished")
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

    /// The samples' slots as an int64 numpy array, in the batch's order (the first half of
    /// `handles()`, as a column).
    fn slots<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray1<i64>>> {
        let guard = self
            .inner
            .lock()
            .map_err(|_| BufferError::new_err("batch lock poisoned"))?;
        let slots = guard.as_ref().map(|b| b.handles()).unwrap_or_default();
        Ok(numpy::PyArray1::from_iter(
            py,
            slots.iter().map(|h| i64::from(h.slot())),
        ))
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
        let patches = self.dict_patches(&outputs)?;
        needs_event_loop(py)?;
        let batch = self.take_for_complete(&patches)?;
        awaitable(
            py,
            async move { batch.complete(patches).await.map_err(py_err) },
        )
    }

    /// Uses one read of each sample without outputs.
    fn commit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        needs_event_loop(py)?;
        let batch = self.take_for_commit()?;
        awaitable(py, async move { batch.commit().await.map_err(py_err) })
    }

    /// Blocking `complete`.
    fn complete_blocking(&self, py: Python<'_>, outputs: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let patches = self.dict_patches(&outputs)?;
        let batch = self.take_for_complete(&patches)?;
        block(py, batch.complete(patches))
    }

    /// Blocking `commit`.
    fn commit_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let batch = self.take_for_commit()?;
        block(py, batch.commit())
    }

    /// The batch's fields as columns: per field, one numpy array of shape `[n, ...]` when
    /// every sample's field has one shape, else `(values, offsets)` (sample `i` is
    /// `values[offsets[i]:offsets[i+1]]`); strings as lists, ragged fields as one list of
    /// arrays per sample. Numbers are read-only views of the buffer's memory when the
    /// samples are adjacent rows of one put (a batch of one `put_columns`, in order), else
    /// one copy; the arrays stay valid after the batch is finished.
    fn columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.with(|b| batch_columns(py, b))
    }

    /// The batch as a `pyarrow.RecordBatch` (ids, births, fields, metadata; numbers view
    /// the buffer's memory where the samples are adjacent rows of one put). Needs pyarrow;
    /// polars and DuckDB read the batch itself (`__arrow_c_stream__`).
    fn to_arrow<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let pyarrow = py.import("pyarrow").map_err(|_| {
            pyo3::exceptions::PyImportError::new_err(
                "Batch.to_arrow() needs pyarrow; polars, DuckDB and other Arrow readers take \
                 the Batch itself (it implements __arrow_c_stream__)",
            )
        })?;
        pyarrow.call_method1("record_batch", (slf,))
    }

    /// The Arrow PyCapsule protocol: the batch's schema.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        export_schema(py, &self.record_batch()?)
    }

    /// The Arrow PyCapsule protocol: the batch as one struct array. `requested_schema` is
    /// not applied (the protocol lets a producer ignore it).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema;
        export_array(py, &self.record_batch()?)
    }

    /// The Arrow PyCapsule protocol: the batch as a one-batch stream. `requested_schema`
    /// is not applied (the protocol lets a producer ignore it).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        export_stream(py, self.record_batch()?)
    }

    /// Writes the outputs given as columns (one row per sample, in batch order; see
    /// `Buffer.put_columns` for the column forms) and uses one read of each sample.
    fn complete_columns<'py>(
        &self,
        py: Python<'py>,
        columns: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let patches = self.output_patches(&columns)?;
        needs_event_loop(py)?;
        let batch = self.take_for_complete(&patches)?;
        awaitable(
            py,
            async move { batch.complete(patches).await.map_err(py_err) },
        )
    }

    /// Blocking `complete_columns`.
    fn complete_columns_blocking(&self, py: Python<'_>, columns: Bound<'_, PyAny>) -> PyResult<()> {
        let patches = self.output_patches(&columns)?;
        let batch = self.take_for_complete(&patches)?;
        block(py, batch.complete(patches))
    }

    /// Gives the samples back unused (they are redelivered).
    fn release(&self) -> PyResult<()> {
        drop(self.take()?);
        Ok(())
    }
}
