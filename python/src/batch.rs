//! `Batch`: a leased batch, its samples as dicts, and its completion.

use crate::convert::{patches_from_py, view_to_py};
use crate::errors::{py_err, BufferError};
use crate::runtime::block;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::sync::Mutex;

/// Samples leased to one RPC.
#[pyclass(module = "rollout_buffer._native", name = "Batch")]
pub(crate) struct PyBatch {
    pub(crate) inner: Mutex<Option<rollout_buffer::Batch>>,
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
