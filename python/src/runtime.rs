//! Running the crate's futures for Python. Most calls can finish at once (a put with room,
//! a get with samples ready, a commit): they are polled once on the calling thread and
//! never touch another thread. Only a call that must wait is handed over: a blocking call
//! to the runtime with the GIL released (checking for Ctrl-C every 100 ms), an awaitable
//! to the runtime with its result sent back to the asyncio loop. Timeouts arrive as
//! seconds.
//!
//! Polling once with a no-op waker and then handing the same future on is sound: a future
//! must use the waker of its latest poll, and the buffer's waits re-check their condition
//! (an enabled `Notified` keeps a notification that arrived meanwhile), so nothing is lost
//! between the two polls.

use crate::errors::py_err;
use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Polls `fut` once on this thread, inside the runtime's context (timers, spawns):
/// its output if it finished, else the future to drive elsewhere.
fn poll_once<F: Future>(mut fut: Pin<Box<F>>) -> Result<F::Output, Pin<Box<F>>> {
    let _entered = pyo3_async_runtimes::tokio::get_runtime().enter();
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(out) => Ok(out),
        Poll::Pending => Err(fut),
    }
}

/// Runs `fut`, which must finish without waiting (an in-memory buffer's put with room,
/// read with samples ready, amend or commit), on this thread and with the GIL held: a
/// caller that holds a lock of its own across the call needs both. `BufferError` if it
/// would wait.
pub(crate) fn now<T>(fut: impl Future<Output = rollout_buffer::Result<T>>) -> PyResult<T> {
    match poll_once(Box::pin(fut)) {
        Ok(result) => result.map_err(py_err),
        Err(_) => Err(crate::errors::BufferError::new_err(
            "a call that cannot wait would have waited (a buffer with a store or a memory budget?)",
        )),
    }
}

/// Runs `fut` to its end: at once when it can finish now, else on the runtime with the
/// GIL released, checking for Ctrl-C every 100 ms (a `KeyboardInterrupt` drops the
/// future, which the buffer tolerates at any await).
pub(crate) fn block<T: Send>(
    py: Python<'_>,
    fut: impl Future<Output = rollout_buffer::Result<T>> + Send,
) -> PyResult<T> {
    // The first poll does the call's work (a put's preparation, say): without the GIL, so
    // other Python threads run meanwhile.
    let mut fut = match py.detach(|| poll_once(Box::pin(fut))) {
        Ok(result) => return result.map_err(py_err),
        Err(pending) => pending,
    };
    let rt = pyo3_async_runtimes::tokio::get_runtime();
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

/// An awaitable of `fut`'s result: already finished when `fut` can finish now (no thread
/// hop, no event-loop wake-up), else a future the runtime drives and the asyncio loop is
/// told about. Errors are raised when it is awaited.
pub(crate) fn awaitable<'py, T>(
    py: Python<'py>,
    fut: impl Future<Output = PyResult<T>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    // The event loop first: without one, fail before anything is done (a sync journal
    // would otherwise finish a change whose caller was told it failed).
    pyo3_async_runtimes::tokio::get_current_loop(py)?;
    match py.detach(|| poll_once(Box::pin(fut))) {
        Ok(result) => {
            let value = result.and_then(|v| v.into_py_any(py));
            Ok(Bound::new(py, Ready { value: Some(value) })?.into_any())
        }
        Err(pending) => {
            // Only a call that waits needs the task's context (copied here, still inside
            // the caller's call): a call that finished at once skips that copy.
            let locals = pyo3_async_runtimes::tokio::get_current_locals(py)?;
            pyo3_async_runtimes::tokio::future_into_py_with_locals(py, locals, pending)
        }
    }
}

/// An awaitable whose result is already there: awaiting it returns it (or raises its
/// error) without suspending.
#[pyclass(module = "rollout_buffer._native")]
pub(crate) struct Ready {
    value: Option<PyResult<Py<PyAny>>>,
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.value.take() {
            Some(Ok(value)) => Err(PyStopIteration::new_err((value,))),
            Some(Err(e)) => Err(e),
            None => Err(PyStopIteration::new_err((py.None(),))),
        }
    }
}

/// A timeout in seconds; `math.inf` waits as long as no timeout would.
pub(crate) fn seconds(t: f64) -> PyResult<Duration> {
    if t == f64::INFINITY {
        return Ok(Duration::MAX);
    }
    Duration::try_from_secs_f64(t).map_err(|e| PyValueError::new_err(format!("timeout: {e}")))
}
