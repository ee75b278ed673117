//! When a thread Python did not start may attach to the interpreter, and what a fork keeps.
//!
//! **Exit.** Two kinds of threads attach to Python without Python having started them: the
//! delivery thread (`deliver.rs`), which hands a waited call's result to its event loop, and
//! any thread whose log event goes to Python's `logging` (`GatedLogger`). A thread that
//! attaches while the interpreter finalizes is stopped in the middle of Rust code: a crash at
//! exit (SIGSEGV, or an abort in `PyGILState_Release`). So every such attach goes through
//! [`attach`], which counts it, and an `atexit` hook ([`stop_attaching`]), which Python runs
//! before finalization starts, refuses every later one and waits, with the GIL released, for
//! the ones in flight. `ATTACHED` holds the count and the exit flag in one word: no lock, so
//! a fork cannot leave one held for the child.
//!
//! **Fork.** A forked child keeps the tokio runtime's data but none of its threads, so a
//! call that waits would wait forever, and the parent's buffers would serve the parent's
//! samples a second time. After a fork of a process that had started the runtime (an
//! `os.register_at_fork` hook), every call that needs it raises `BufferError` instead.

use crate::errors::BufferError;
use log::{Log, Metadata, Record};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// The high bit: the interpreter is exiting, attach no more. The rest: attaches in flight.
const EXITING: usize = 1 << (usize::BITS - 1);
static ATTACHED: AtomicUsize = AtomicUsize::new(0);

/// How long the exit hook waits for attaches in flight: each is a delivery or a log event,
/// microseconds once it has the GIL, so this bound is only reached by a thread stuck in
/// Python code.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Runs `f` attached to the interpreter, unless it is exiting: then `None`, and `f` is
/// dropped unrun.
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    let mut state = ATTACHED.load(Ordering::Acquire);
    loop {
        if state & EXITING != 0 {
            return None;
        }
        match ATTACHED.compare_exchange_weak(state, state + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => break,
            Err(now) => state = now,
        }
    }
    // Counted until detached again, even if `f` unwinds.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            ATTACHED.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let _leave = Leave;
    Some(Python::attach(f))
}

/// The `atexit` hook: no thread attaches from now on; returns once the attaches in flight
/// are done (or after [`EXIT_WAIT`]).
#[pyfunction]
pub(crate) fn stop_attaching(py: Python<'_>) {
    ATTACHED.fetch_or(EXITING, Ordering::AcqRel);
    py.detach(|| {
        let deadline = Instant::now() + EXIT_WAIT;
        // Polled rather than signalled: a condvar needs a lock, which a fork could leave
        // held. This runs once, at exit, and the attaches it waits for take microseconds.
        while ATTACHED.load(Ordering::Acquire) & !EXITING != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Whether this process started the runtime (then a fork of it cannot use it).
static STARTED: AtomicBool = AtomicBool::new(false);
/// Whether this process is a fork of one that had started the runtime.
static FORKED: AtomicBool = AtomicBool::new(false);

/// The runtime the buffers' futures run on; `BufferError` in a forked child of a process
/// that had started it.
pub(crate) fn runtime() -> PyResult<&'static Runtime> {
    check_not_forked()?;
    // Loaded first: a store on every call would bounce the line between threads.
    if !STARTED.load(Ordering::Relaxed) {
        STARTED.store(true, Ordering::Relaxed);
    }
    Ok(pyo3_async_runtimes::tokio::get_runtime())
}

/// `BufferError` in a forked child of a process that had started the runtime: for the
/// calls that do not need the runtime but would serve the parent's samples again.
pub(crate) fn check_not_forked() -> PyResult<()> {
    if FORKED.load(Ordering::Relaxed) {
        return Err(BufferError::new_err(
            "this process was forked from one that had used rollout_buffer: the runtime's \
             threads do not survive a fork, and the parent's buffers would serve its samples \
             again; start workers with multiprocessing's 'spawn' or 'forkserver' method",
        ));
    }
    Ok(())
}

/// The `os.register_at_fork(after_in_child=...)` hook.
#[pyfunction]
pub(crate) fn after_fork_in_child() {
    if STARTED.load(Ordering::Relaxed) {
        FORKED.store(true, Ordering::Relaxed);
    }
}

/// pyo3-log's logger, attaching through [`attach`]: an event logged while the interpreter
/// exits is dropped.
struct GatedLogger(pyo3_log::Logger);

impl Log for GatedLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        // Checked first, without the GIL (pyo3-log caches Python's levels): an event Python
        // would drop costs no attach. pyo3-log attaches by itself; counting it here keeps
        // the exit hook waiting for it.
        if self.0.enabled(record.metadata()) {
            attach(|_| self.0.log(record));
        }
    }

    fn flush(&self) {}
}

/// Sends the library's log events to Python's `logging`, as `pyo3_log::try_init` does, but
/// through [`GatedLogger`]. Another extension may have installed a logger first: then that
/// one gets them.
pub(crate) fn install_logger(py: Python<'_>) -> PyResult<()> {
    let logger = pyo3_log::Logger::new(py, pyo3_log::Caching::LoggersAndLevels)?;
    if log::set_boxed_logger(Box::new(GatedLogger(logger))).is_ok() {
        // pyo3-log's own default: Python's logger levels filter further.
        log::set_max_level(log::LevelFilter::Debug);
    }
    Ok(())
}

/// Registers the exit and fork hooks with Python.
pub(crate) fn register_hooks(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    py.import("atexit")?
        .call_method1("register", (wrap_pyfunction!(stop_attaching, m)?,))?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("after_in_child", wrap_pyfunction!(after_fork_in_child, m)?)?;
    py.import("os")?
        .call_method("register_at_fork", (), Some(&kwargs))?;
    Ok(())
}
