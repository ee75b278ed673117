//! `Rpc`: an RPC definition built from Python keyword arguments.

use crate::convert::count;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rollout_buffer::{RateLimit, RpcDef, Selection};

/// The keys of a sample dict that are not fields (see `convert::sample_from_py`).
pub(crate) const RESERVED: [&str; 3] = ["id", "birth", "meta"];

/// One consumer of the buffer (see `RpcDef`).
#[pyclass(module = "rollout_buffer._native", name = "Rpc")]
#[derive(Clone)]
pub(crate) struct PyRpc {
    pub(crate) def: RpcDef,
}

#[pymethods]
impl PyRpc {
    #[new]
    #[pyo3(signature = (name, n_seqs, inputs=vec![], outputs=vec![], reads=1, selection="fifo", seed=0, lease_timeout=None, max_staleness=None, alpha=1.0, priority_key=None, exponent=1.0, samples_per_insert=None, min_size_to_sample=1, error_buffer=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        n_seqs: i128,
        inputs: Vec<String>,
        outputs: Vec<String>,
        reads: i128,
        selection: &str,
        seed: i128,
        lease_timeout: Option<f64>,
        max_staleness: Option<i128>,
        alpha: f64,
        priority_key: Option<String>,
        exponent: f64,
        samples_per_insert: Option<f64>,
        min_size_to_sample: i128,
        error_buffer: Option<f64>,
    ) -> PyResult<Self> {
        let n_seqs: usize = count("n_seqs", n_seqs)?;
        let reads: u32 = count("reads", reads)?;
        let seed: u64 = count("seed", seed)?;
        let max_staleness: Option<u64> = max_staleness
            .map(|s| count("max_staleness", s))
            .transpose()?;
        let min_size_to_sample: usize = count("min_size_to_sample", min_size_to_sample)?;
        // A sample dict's own entries: a field of one of these names could never be put
        // (the dict's "id" is the sample's id), so an RPC reading it could never be served.
        let named = [("inputs", &inputs), ("outputs", &outputs)];
        for (what, keys) in named {
            if let Some(key) = keys.iter().find(|k| RESERVED.contains(&k.as_str())) {
                return Err(PyValueError::new_err(format!(
                    "Rpc {name:?}, {what}: {key:?} is reserved (a sample's {}), not a field",
                    RESERVED.join(", ")
                )));
            }
        }
        if let Some(key) = priority_key.as_deref().filter(|k| RESERVED.contains(k)) {
            return Err(PyValueError::new_err(format!(
                "Rpc {name:?}, priority_key: {key:?} is reserved, not a field"
            )));
        }
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
            // Zero expires every lease at once: each batch is served to the next getter
            // while its holder works on it, and every completion fails.
            if t.is_nan() || t <= 0.0 {
                return Err(PyValueError::new_err(format!(
                    "lease_timeout: seconds > 0 (or None: no timeout), not {t}"
                )));
            }
            def = def.lease_timeout(crate::runtime::seconds("lease_timeout", t)?);
        }
        if let Some(s) = max_staleness {
            def = def.max_staleness(s);
        }
        // Reverb's `SampleToInsertRatio`; the error buffer defaults to the smallest that
        // cannot deadlock, `(n_seqs + samples_per_insert) / 2`, rounded up.
        if let Some(spi) = samples_per_insert {
            let error_buffer = error_buffer.unwrap_or_else(|| ((n_seqs as f64 + spi) / 2.0).ceil());
            def = def.rate_limit(RateLimit::new(spi, min_size_to_sample, error_buffer));
        } else if error_buffer.is_some() {
            return Err(PyValueError::new_err(
                "error_buffer needs samples_per_insert (a rate limit)",
            ));
        }
        Ok(Self { def })
    }
}
