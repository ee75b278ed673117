//! Python bindings: the module `rollout_buffer._native`, wrapped by the pure-Python package
//! `rollout_buffer`.
//!
//! Awaitables run on the crate's tokio runtime (`pyo3-async-runtimes`), not a thread per
//! call; blocking twins release the GIL while they wait and check for Ctrl-C every 100 ms.
//!
//! Data crosses as columns (`columns.rs`): numpy arrays through rust-numpy (`arrays.rs`:
//! one copy in, read-only views of the buffer's memory out) and Arrow through arrow-rs's C
//! Data Interface behind the PyCapsule protocol (`arrow.rs`). Dicts per sample
//! (`convert.rs`) remain the convenient path for small calls.
//!
//! Log events of the library reach Python's `logging` (through `pyo3-log`).
//!
//! Files: `errors.rs` (exceptions), `arrays.rs` and `arrow.rs` (the only `unsafe`, each
//! block with its `SAFETY` reason), `columns.rs` and `arrow_columns.rs`, `convert.rs`, `rpc.rs`, `batch.rs`,
//! `buffer.rs`, `runtime.rs` (running calls) with `deliver.rs` (awaited results) and
//! `interpreter.rs` (exit and fork), `rollout.rs` (the RL layer), `areal.rs` (the AReaL drop-in's
//! core) and `sequence_sample.rs` (its stand-in sample's merge and gather), `cli.rs` (the command line, for the
//! console script).

mod areal;
mod arrays;
mod arrow;
mod arrow_columns;
mod batch;
mod buffer;
mod cli;
mod column_keys;
mod columns;
mod convert;
mod deliver;
mod errors;
mod interpreter;
mod rollout;
mod rpc;
mod runtime;
mod sequence_sample;

use crate::batch::PyBatch;
use crate::buffer::PyBuffer_;
use crate::convert::Ragged;
use crate::errors::{BufferError, BufferFull, Closed, SamplesDropped, StaleHandle, Timeout};
use crate::rpc::PyRpc;
use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The library logs with `tracing`; with no subscriber its events become `log` records,
    // which go to Python's `logging` under the Rust module path (`rollout_buffer.buffer.get`,
    // say). The hooks keep threads the runtime started from attaching to an interpreter that
    // is exiting, and a forked child from using a runtime whose threads it lost.
    interpreter::install_logger(m.py())?;
    interpreter::register_hooks(m)?;
    m.add_class::<PyBuffer_>()?;
    m.add_class::<areal::ArealSlots>()?;
    m.add_function(wrap_pyfunction!(sequence_sample::gather_samples, m)?)?;
    m.add_class::<PyBatch>()?;
    m.add_class::<PyRpc>()?;
    m.add_class::<Ragged>()?;
    m.add_class::<arrays::TensorMemory>()?;
    m.add_class::<runtime::Ready>()?;
    m.add_class::<rollout::PyIngest>()?;
    m.add_class::<rollout::PyBatcher>()?;
    m.add_class::<rollout::PyTrainBatch>()?;
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    let py = m.py();
    m.add("BufferError", py.get_type::<BufferError>())?;
    m.add("BufferFull", py.get_type::<BufferFull>())?;
    m.add("Closed", py.get_type::<Closed>())?;
    m.add("StaleHandle", py.get_type::<StaleHandle>())?;
    m.add("SamplesDropped", py.get_type::<SamplesDropped>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    // The Rust constant itself, so the two can never disagree.
    m.add(
        "GROUP_INPUTS",
        rollout_buffer::rollout::GROUP_INPUTS.to_vec(),
    )?;
    Ok(())
}
