//! Running the crate's futures for Python: blocking calls release the GIL and honour
//! Ctrl-C; timeouts arrive as seconds.

use crate::errors::py_err;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::future::Future;
use std::time::Duration;

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

pub(crate) fn seconds(t: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(t).map_err(|e| PyValueError::new_err(format!("timeout: {e}")))
}
