//! Running the crate's futures for Python. Most calls can finish at once (a put with room,
//! a get with samples ready, a commit): they are polled once on the calling thread and
//! never touch another thread. Only a call that must wait goes further: a blocking call
//! waits on the calling thread with the GIL released (polled again at each wake-up, and
//! checking for Ctrl-C every 100 ms), an awaitable is handed to the runtime with its result
//! sent back to the asyncio loop (`deliver.rs`). Timeouts arrive as seconds.
//!
//! Polling once with a no-op waker and then handing the same future on is sound: a future
//! must use the waker of its latest poll, and the buffer's waits re-check their condition
//! (an enabled `Notified` keeps a notification that arrived meanwhile), so nothing is lost
//! between the two polls.

use crate::errors::py_err;
use crate::interpreter::runtime;
use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::runtime::Runtime;

/// Polls `fut` once on this thread, inside the runtime's context (timers, spawns):
/// its output if it finished, else the future to drive elsewhere.
fn poll_once<F: Future>(rt: &Runtime, mut fut: Pin<Box<F>>) -> Result<F::Output, Pin<Box<F>>> {
    let _entered = rt.enter();
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
    match poll_once(runtime()?, Box::pin(fut)) {
        Ok(result) => result.map_err(py_err),
        Err(_) => Err(crate::errors::BufferError::new_err(
            "a call that cannot wait would have waited (a buffer with a store or a memory budget?)",
        )),
    }
}

/// Runs `fut` to its end: at once when it can finish now, else on this thread in the
/// runtime's context with the GIL released, checking for Ctrl-C every 100 ms (a
/// `KeyboardInterrupt` drops the future, which the buffer tolerates at any await).
pub(crate) fn block<T: Send>(
    py: Python<'_>,
    fut: impl Future<Output = rollout_buffer::Result<T>> + Send,
) -> PyResult<T> {
    // The first poll does the call's work (a put's preparation, say): without the GIL, so
    // other Python threads run meanwhile.
    let rt = runtime()?;
    let mut fut = match py.detach(|| poll_once(rt, Box::pin(fut))) {
        Ok(result) => return result.map_err(py_err),
        Err(pending) => pending,
    };
    loop {
        match py.detach(|| poll_for(rt, fut.as_mut(), Duration::from_millis(100))) {
            Some(result) => return result.map_err(py_err),
            None => py.check_signals()?,
        }
    }
}

/// Wakes the thread waiting in [`poll_for`].
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// Drives `fut` on this thread, inside the runtime's context, for up to `limit`: its
/// output, or `None` once `limit` has passed. Between polls the thread parks with the
/// operating system's timeout, not a tokio timer, so the caller gets control back on
/// time whatever the runtime does (a blocking call once never returned to check for
/// Ctrl-C, parked in `Runtime::block_on` waiting for its 100 ms timer), and a wake-up
/// (or a spurious return from `park_timeout`) just polls again, which the buffer's
/// futures allow at any time.
fn poll_for<F: Future>(rt: &Runtime, mut fut: Pin<&mut F>, limit: Duration) -> Option<F::Output> {
    let _entered = rt.enter();
    let waker = Waker::from(std::sync::Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
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
    let event_loop = pyo3_async_runtimes::tokio::get_current_loop(py)?;
    let rt = runtime()?;
    match py.detach(|| poll_once(rt, Box::pin(fut))) {
        Ok(result) => {
            let value = result.and_then(|v| v.into_py_any(py));
            Ok(Bound::new(py, Ready { value })?.into_any())
        }
        Err(pending) => crate::deliver::spawn(event_loop, rt, pending),
    }
}

/// An awaitable whose result is already there: awaiting it returns it (or raises its
/// error) without suspending, every time it is awaited, as a done asyncio future does.
#[pyclass(module = "rollout_buffer._native", frozen)]
pub(crate) struct Ready {
    value: PyResult<Py<PyAny>>,
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.value {
            Ok(value) => Err(PyStopIteration::new_err((value.clone_ref(py),))),
            Err(e) => Err(e.clone_ref(py)),
        }
    }
}

/// Argument `name`, a duration in seconds; `math.inf` waits as long as no timeout would
/// (every deadline the library sets stops thirty years out).
pub(crate) fn seconds(name: &str, t: f64) -> PyResult<Duration> {
    if t == f64::INFINITY {
        return Ok(Duration::MAX);
    }
    Duration::try_from_secs_f64(t).map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
}

/// A call's `timeout` argument, in seconds (`None`: no timeout).
pub(crate) fn timeout_arg(t: Option<f64>) -> PyResult<Option<Duration>> {
    // Thirty years or more is none: a deadline near the clock's far edge would overflow.
    const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 30);
    let t = t.map(|t| seconds("timeout", t)).transpose()?;
    Ok(t.filter(|&t| t < FOREVER))
}

/// `fut`, or the buffer's `Timeout` naming `op` if it has not finished after `timeout`:
/// for calls whose future may be dropped at any await with nothing changed (a flush, a
/// `Batcher`'s next batch, which gives back what it had leased).
pub(crate) async fn within<T>(
    timeout: Duration,
    op: &str,
    fut: impl Future<Output = rollout_buffer::Result<T>>,
) -> rollout_buffer::Result<T> {
    // A deadline past the clock's range is no deadline.
    let Some(at) = tokio::time::Instant::now().checked_add(timeout) else {
        return fut.await;
    };
    match tokio::time::timeout_at(at, fut).await {
        Ok(result) => result,
        Err(_) => Err(rollout_buffer::Error::Timeout {
            op: op.to_owned(),
            after: timeout,
            samples: Default::default(),
        }),
    }
}
