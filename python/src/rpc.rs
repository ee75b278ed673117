//! `Rpc`: an RPC definition built from Python keyword arguments.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rollout_buffer::{RpcDef, Selection};
use std::time::Duration;

/// One consumer of the buffer (see `RpcDef`).
#[pyclass(module = "rollout_buffer._native", name = "Rpc")]
#[derive(Clone)]
pub(crate) struct PyRpc {
    pub(crate) def: RpcDef,
}

#[pymethods]
impl PyRpc {
    #[new]
    #[pyo3(signature = (name, n_seqs, inputs=vec![], outputs=vec![], reads=1, selection="fifo", seed=0, lease_timeout=None, max_staleness=None, alpha=1.0, priority_key=None, exponent=1.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        n_seqs: usize,
        inputs: Vec<String>,
        outputs: Vec<String>,
        reads: u32,
        selection: &str,
        seed: u64,
        lease_timeout: Option<f64>,
        max_staleness: Option<u64>,
        alpha: f64,
        priority_key: Option<String>,
        exponent: f64,
    ) -> PyResult<Self> {
        let selection = match (selection, priority_key) {
            ("fifo", _) => Selection::Fifo,
            ("lifo", _) => Selection::Lifo,
            ("uniform", _) => Selection::Uniform { seed },
            ("recency", _) => Selection::Recency { alpha, seed },
            ("prioritized", Some(key)) => Selection::Prioritized {
                key,
                exponent,
                seed,
            },
            ("prioritized", None) => {
                return Err(PyValueError::new_err(
                    "selection `prioritized` needs `priority_key`",
                ))
            }
            (other, _) => {
                return Err(PyValueError::new_err(format!(
                    "selection `{other}`: use fifo, lifo, uniform, recency or prioritized"
                )))
            }
        };
        let mut def = RpcDef::new(name, n_seqs)
            .inputs(inputs)
            .outputs(outputs)
            .reads(reads)
            .selection(selection);
        if let Some(t) = lease_timeout {
            let t = Duration::try_from_secs_f64(t)
                .map_err(|e| PyValueError::new_err(format!("lease_timeout: {e}")))?;
            def = def.lease_timeout(t);
        }
        if let Some(s) = max_staleness {
            def = def.max_staleness(s);
        }
        Ok(Self { def })
    }
}
