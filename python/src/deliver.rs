//! Awaitables of calls that must wait: the future runs on the runtime, and its result goes
//! back to the caller's asyncio event loop.
//!
//! A runtime thread must not take the GIL (a task waiting for it would stall the runtime's
//! other tasks), so finished results queue for one delivery thread, which attaches once for
//! everything queued and schedules each result onto its loop with `call_soon_threadsafe`.
//! One thread, not one per result: 500 getters released at once cost one attach, not 500
//! threads. It attaches through `interpreter::attach`, so never while the interpreter
//! finalizes; a result that arrives after the exit hook is dropped.
//!
//! Cancelling the asyncio future drops the Rust future (the buffer tolerates that at any
//! await). A result that finds its future cancelled, or its loop closed, is dropped: a batch
//! dropped unfinished gives its lease back.

use crate::errors::BufferError;
use crate::interpreter;
use futures::FutureExt;
use pyo3::prelude::*;
use pyo3::{intern, IntoPyObjectExt};
use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Mutex, OnceLock, PoisonError};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

/// A finished result, to hand over attached to the interpreter.
type Delivery = Box<dyn for<'py> FnOnce(Python<'py>) + Send>;

/// At most this many results per attach: others waiting for the GIL get their turn.
const PER_ATTACH: usize = 256;

/// An asyncio future, resolved when `fut` finishes on `rt`.
pub(crate) fn spawn<'py, T>(
    event_loop: Bound<'py, PyAny>,
    rt: &Runtime,
    fut: Pin<Box<impl Future<Output = PyResult<T>> + Send + 'static>>,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let py = event_loop.py();
    let py_future = event_loop.call_method0(intern!(py, "create_future"))?;
    let (cancel, cancelled) = oneshot::channel();
    py_future.call_method1(
        intern!(py, "add_done_callback"),
        (OnDone {
            cancel: Mutex::new(Some(cancel)),
        },),
    )?;
    let target = Target {
        event_loop: event_loop.unbind(),
        future: py_future.clone().unbind(),
    };
    rt.spawn(async move {
        let outcome = tokio::select! {
            // A result that is there wins over a cancel that is too.
            biased;
            outcome = AssertUnwindSafe(fut).catch_unwind() => outcome,
            // The asyncio future is done: cancelled, as nothing else finishes it first.
            _ = cancelled => return,
        };
        send(Box::new(move |py| target.complete(py, outcome)));
    });
    Ok(py_future)
}

/// Where a result goes.
struct Target {
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
}

impl Target {
    fn complete<T>(self, py: Python<'_>, outcome: std::thread::Result<PyResult<T>>)
    where
        T: for<'a> IntoPyObject<'a>,
    {
        let result = match outcome {
            Ok(result) => result.and_then(|value| value.into_py_any(py)),
            Err(panic) => Err(BufferError::new_err(format!(
                "internal error: a waited call panicked: {}",
                panic_message(panic.as_ref())
            ))),
        };
        let (ok, value) = match result {
            Ok(value) => (true, value),
            Err(e) => (false, e.into_value(py).into_any()),
        };
        let scheduled = self.event_loop.call_method1(
            py,
            intern!(py, "call_soon_threadsafe"),
            (SetOutcome, self.future, ok, value),
        );
        if let Err(e) = scheduled {
            tracing::debug!(target: "rollout_buffer::python", "a waited call's result was dropped, its event loop gone: {e}");
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// Sets a future's result or exception on its loop's thread, unless it is done already
/// (cancelled meanwhile: the value is dropped).
#[pyclass(module = "rollout_buffer._native", frozen)]
struct SetOutcome;

#[pymethods]
impl SetOutcome {
    fn __call__(
        &self,
        future: &Bound<'_, PyAny>,
        ok: bool,
        value: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let py = future.py();
        if future.call_method0(intern!(py, "done"))?.is_truthy()? {
            return Ok(());
        }
        let method = if ok {
            intern!(py, "set_result")
        } else {
            intern!(py, "set_exception")
        };
        future.call_method1(method, (value,))?;
        Ok(())
    }
}

/// The asyncio future's done callback: tells the task, which returns at once if the
/// future was cancelled (and is long gone otherwise).
#[pyclass(module = "rollout_buffer._native", frozen)]
struct OnDone {
    cancel: Mutex<Option<oneshot::Sender<()>>>,
}

#[pymethods]
impl OnDone {
    fn __call__(&self, _future: &Bound<'_, PyAny>) {
        let mut cancel = self.cancel.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cancel) = cancel.take() {
            // The task may have finished: nobody to tell, nothing to do.
            let _ = cancel.send(());
        }
    }
}

static QUEUE: OnceLock<Option<Sender<Delivery>>> = OnceLock::new();

/// Queues a result for the delivery thread (started on first use).
fn send(delivery: Delivery) {
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        match std::thread::Builder::new()
            .name("rollout-buffer-deliver".into())
            .spawn(move || run(rx))
        {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::error!(target: "rollout_buffer::python", "cannot start the thread that delivers awaited results: {e}");
                None
            }
        }
    });
    if let Some(queue) = queue {
        // The thread never returns, so its receiver lives as long as the process.
        let _ = queue.send(delivery);
    }
}

/// The delivery thread: attaches once per burst of results.
fn run(queue: Receiver<Delivery>) {
    while let Ok(first) = queue.recv() {
        // `None`: the interpreter is exiting; the result is dropped unattached.
        let _ = interpreter::attach(|py| {
            first(py);
            for delivery in queue.try_iter().take(PER_ATTACH) {
                delivery(py);
            }
        });
    }
}
