//! The `rollout-buffer` command line (`serve`, `inspect`, `repair`) run inside the Python
//! process: what the package's console script (`rollout_buffer.cli:main`) calls, so
//! installing the Python package gives the server without a separate `cargo install`.

use pyo3::prelude::*;

/// Runs the command line `argv` (the program name first) with the GIL released, until the
/// command ends (`serve`: until SIGTERM or SIGINT); returns its exit code.
#[pyfunction]
pub fn cli_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| rollout_buffer_server::run(argv))
}
