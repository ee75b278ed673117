//! The RL layer for Python: group ingestion (`Ingest.add_rollout`) and trainer batches
//! (`Batcher.next_batch`, packed `[B, S]` numpy arrays).

use crate::buffer::PyBuffer_;
use crate::convert::{at, count, meta_from_py, string_from_py, tensor_from_py, tensor_to_py};
use crate::errors::{py_err, BufferError};
use crate::runtime::{awaitable, block, seconds, timeout_arg, within};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use rollout_buffer::rollout::{
    Added, Advantage, Batcher, BatcherConfig, GroupBatch, GroupConfig, GroupIngest, GroupMode,
    Packer, RolloutRecord, Shortfall, SlimeHooks, Source,
};
use rollout_buffer::Tensor;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A field of a rollout dict, as a vector of `T`; `place` names the rollout in errors.
fn vec_of<T>(d: &Bound<'_, PyDict>, key: &str, place: &str) -> PyResult<Option<Vec<T>>>
where
    T: rollout_buffer::Element + Copy,
{
    let Some(v) = d.get_item(key)? else {
        return Ok(None);
    };
    if v.is_none() {
        return Ok(None);
    }
    let what = format!("{place}, field `{key}`");
    let t = tensor_from_py(&v, &what)?;
    if t.shape().len() != 1 || t.lengths().is_some() {
        return Err(PyValueError::new_err(format!(
            "{what}: a 1-d array, not one of shape {:?}",
            t.shape()
        )));
    }
    t.array::<T>()
        .map(|a| Some(a.iter().copied().collect()))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what}: {:?} values where {:?} are expected",
                t.dtype(),
                <T as rollout_buffer::Element>::DTYPE
            ))
        })
}

/// `d[key]` converted by `extract`, `None` when absent or `None`; a failed conversion is a
/// `ValueError` naming the rollout, the field and what it should be.
fn field<'py, T>(
    d: &Bound<'py, PyDict>,
    key: &str,
    place: &str,
    expected: &str,
    extract: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Option<T>> {
    match d.get_item(key)? {
        Some(v) if !v.is_none() => extract(&v).map(Some).map_err(|e| {
            at(
                d.py(),
                format!("{place}, field `{key}` (expected {expected})"),
                e,
            )
        }),
        _ => Ok(None),
    }
}

/// A finite float (a NaN or infinite reward would make every advantage of its group
/// meaningless).
fn finite(v: &Bound<'_, PyAny>) -> PyResult<f64> {
    if v.is_instance_of::<pyo3::types::PyBool>() || v.is_instance_of::<PyString>() {
        return Err(PyValueError::new_err(format!("got {}", v.repr()?)));
    }
    let x: f64 = v.extract()?;
    if x.is_finite() {
        Ok(x)
    } else {
        Err(PyValueError::new_err(format!("got {x}")))
    }
}

fn rollout_from_py(obj: &Bound<'_, PyAny>) -> PyResult<RolloutRecord> {
    let d = obj.cast::<PyDict>().map_err(|_| {
        PyValueError::new_err(format!(
            "a rollout is a dict, not {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    // The uid first, so every later error names the rollout.
    let uid = d
        .get_item("rollout_uid")?
        .ok_or_else(|| PyValueError::new_err("a rollout needs `rollout_uid`"))?;
    let uid = string_from_py(&uid, "field `rollout_uid`")?;
    let place = format!("rollout {uid:?}");
    let text = |k: &str| -> PyResult<String> {
        let v = d
            .get_item(k)?
            .ok_or_else(|| PyValueError::new_err(format!("{place}: needs `{k}`")))?;
        let s = string_from_py(&v, &format!("{place}, field `{k}`"))?;
        if s.is_empty() {
            return Err(PyValueError::new_err(format!(
                "{place}, field `{k}`: empty"
            )));
        }
        Ok(s)
    };
    let (environment, example_id) = (text("environment")?, text("example_id")?);
    let version = field(d, "policy_version", &place, "an int from 0", |v| {
        // A bool is an int to Python (True is 1): a flag passed for a version.
        if v.is_instance_of::<pyo3::types::PyBool>() {
            return Err(PyValueError::new_err(format!("got {}", v.repr()?)));
        }
        v.extract::<u64>()
    })?
    .ok_or_else(|| PyValueError::new_err(format!("{place}: needs `policy_version`")))?;
    let mut r = RolloutRecord::new(environment, example_id, version, uid);
    if let Some(v) = field(d, "replica_id", &place, "a str", |v| v.extract::<String>())? {
        r.replica_id = v;
    }
    if let Some(v) = field(d, "created_ts", &place, "a float", |v| v.extract())? {
        r.created_ts = v;
    }
    r.prompt_tokens = vec_of::<i32>(d, "prompt_tokens", &place)?.unwrap_or_default();
    r.output_tokens = vec_of::<i32>(d, "output_tokens", &place)?.unwrap_or_default();
    r.logprobs = vec_of::<f32>(d, "logprobs", &place)?.unwrap_or_default();
    r.ref_logprobs = vec_of::<f32>(d, "ref_logprobs", &place)?;
    if let Some(versions) = vec_of::<i64>(d, "token_versions", &place)? {
        let versions = versions
            .into_iter()
            .map(u64::try_from)
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|_| {
                PyValueError::new_err(format!(
                    "{place}, field `token_versions`: a negative version"
                ))
            })?;
        r.token_versions = Some(versions);
    }
    r.reward = field(d, "reward", &place, "a finite float", finite)?;
    if let Some(v) = field(d, "truncated", &place, "a bool", |v| v.extract::<bool>())? {
        r.truncated = v;
    }
    if let Some(components) = field(
        d,
        "reward_components",
        &place,
        "a dict of str to finite float",
        |v| {
            let dict = v.cast::<PyDict>()?;
            dict.iter()
                .map(|(k, x)| Ok((k.extract::<String>()?, finite(&x)?)))
                .collect::<PyResult<_>>()
        },
    )? {
        r.reward_components = components;
    }
    if let Some(v) = d.get_item("metadata")? {
        let meta = v
            .cast::<PyDict>()
            .map_err(|_| PyValueError::new_err(format!("{place}: `metadata` is a dict")))?;
        for (k, v) in meta.iter() {
            let key = string_from_py(&k, &format!("{place}: a `metadata` key"))?;
            let value = meta_from_py(&v, &format!("{place}, metadata {key:?}"))?;
            r.metadata.insert(key, value);
        }
    }
    Ok(r)
}

/// An add, waiting for room for the group it completes at most `timeout` (the group then
/// pending again, never lost: see `GroupIngest::add_timeout`).
async fn add(
    ingest: &GroupIngest,
    record: RolloutRecord,
    timeout: Option<Duration>,
) -> rollout_buffer::Result<Added> {
    match timeout {
        Some(t) => ingest.add_timeout(record, t).await,
        None => ingest.add(record).await,
    }
}

fn outcome(added: &Added) -> &'static str {
    match added {
        Added::Pending { .. } => "pending",
        Added::Sealed(_) => "sealed",
        Added::Duplicate => "duplicate",
        Added::UidTaken { .. } => "uid_taken",
        Added::VersionRejected => "version_rejected",
        Added::ReplicaCapped => "replica_capped",
        Added::DuplicateGroup { .. } => "duplicate_group",
        _ => "other",
    }
}

/// Groups rollouts and stores sealed groups in a buffer (see the Rust `GroupIngest`).
#[pyclass(module = "rollout_buffer._native", name = "Ingest")]
pub(crate) struct PyIngest {
    ingest: GroupIngest,
}

#[pymethods]
impl PyIngest {
    #[new]
    #[pyo3(signature = (buffer, group_size, min_size=None, seal_timeout=30.0, mixed=false, max_per_replica=None))]
    fn new(
        py: Python<'_>,
        buffer: PyRef<'_, PyBuffer_>,
        group_size: i128,
        min_size: Option<i128>,
        seal_timeout: f64,
        mixed: bool,
        max_per_replica: Option<i128>,
    ) -> PyResult<Self> {
        let group_size: usize = count("group_size", group_size)?;
        let min_size: Option<usize> = min_size.map(|m| count("min_size", m)).transpose()?;
        let max_per_replica: Option<usize> = max_per_replica
            .map(|m| count("max_per_replica", m))
            .transpose()?;
        let timeout = seconds("seal_timeout", seal_timeout)?;
        // The Rust builder clamps these; from Python a value out of range is a mistake to
        // report, not to correct (a `min_size` above the group size would drop every group
        // that times out).
        if group_size == 0 {
            return Err(PyValueError::new_err("group_size: at least 1"));
        }
        if let Some(min) = min_size.filter(|&m| m == 0 || m > group_size) {
            return Err(PyValueError::new_err(format!(
                "min_size: from 1 to group_size ({group_size}), not {min}"
            )));
        }
        if max_per_replica == Some(0) {
            return Err(PyValueError::new_err("max_per_replica: at least 1"));
        }
        let mut config = GroupConfig::new(group_size)
            .seal_after(timeout, min_size.unwrap_or(group_size))
            .mode(if mixed {
                GroupMode::Mixed
            } else {
                GroupMode::Strict
            });
        if let Some(n) = max_per_replica {
            config = config.max_per_replica(n);
        }
        let buf = buffer.buf.clone();
        // Starting replays the store's pending rollouts: it may wait, so Ctrl-C works.
        let ingest = block(py, GroupIngest::start(buf, config))?;
        Ok(Self { ingest })
    }

    /// Adds a rollout (a dict); resolves to what became of it: `"pending"`, `"sealed"`,
    /// `"duplicate"`, `"uid_taken"`, `"version_rejected"`, `"replica_capped"` or
    /// `"duplicate_group"`.
    #[pyo3(signature = (rollout, timeout=None))]
    fn add_rollout<'py>(
        &self,
        py: Python<'py>,
        rollout: Bound<'py, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let record = rollout_from_py(&rollout)?;
        let timeout = timeout_arg(timeout)?;
        let ingest = self.ingest.clone();
        awaitable(py, async move {
            let added = add(&ingest, record, timeout).await.map_err(py_err)?;
            Ok(outcome(&added))
        })
    }

    /// Blocking `add_rollout`.
    #[pyo3(signature = (rollout, timeout=None))]
    fn add_rollout_blocking(
        &self,
        py: Python<'_>,
        rollout: Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<&'static str> {
        let record = rollout_from_py(&rollout)?;
        let timeout = timeout_arg(timeout)?;
        let added = block(py, add(&self.ingest, record, timeout))?;
        Ok(outcome(&added))
    }

    /// The assembler's and ingestion's counts, as a dict.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let a = self.ingest.assembler_counters();
        let c = self.ingest.counters();
        let d = PyDict::new(py);
        d.set_item("received", a.received)?;
        d.set_item("duplicates", a.duplicates)?;
        d.set_item("uid_taken", a.uid_taken)?;
        d.set_item("pending_rollouts", a.pending_rollouts)?;
        d.set_item("storing_rollouts", self.ingest.storing_rollouts())?;
        d.set_item("sealed_full", a.sealed_full)?;
        d.set_item("sealed_timeout", a.sealed_timeout)?;
        d.set_item("dropped_groups", a.dropped_groups)?;
        d.set_item("stored_groups", c.stored_groups)?;
        d.set_item("duplicate_groups", c.duplicate_groups)?;
        d.set_item("refused_groups", c.refused_groups)?;
        d.set_item("reopened_groups", c.reopened_groups)?;
        Ok(d)
    }
}

/// A packed trainer batch: `arrays()` gives the `[B, S]` numpy arrays; `complete()` when
/// trained on (rejected groups are then discarded); dropping it gives the groups back.
#[pyclass(module = "rollout_buffer._native", name = "TrainBatch")]
pub(crate) struct PyTrainBatch {
    inner: Mutex<Option<GroupBatch>>,
    /// The packed `[B, S]` arrays, moved out of the batch once (no copy) and viewed by
    /// every `arrays()` call.
    arrays: Vec<(&'static str, Tensor)>,
    efficiency: f64,
}

impl PyTrainBatch {
    fn new(mut batch: GroupBatch) -> Self {
        let t = &mut batch.batch;
        let efficiency = t.efficiency();
        let mut arrays = vec![
            (
                "input_ids",
                Tensor::from(std::mem::take(&mut t.input_ids).into_dyn()),
            ),
            (
                "position_ids",
                Tensor::from(std::mem::take(&mut t.position_ids).into_dyn()),
            ),
            (
                "segment_ids",
                Tensor::from(std::mem::take(&mut t.segment_ids).into_dyn()),
            ),
            (
                "loss_mask",
                Tensor::from(std::mem::take(&mut t.loss_mask).into_dyn()),
            ),
            (
                "advantages",
                Tensor::from(std::mem::take(&mut t.advantages).into_dyn()),
            ),
            (
                "behavior_logprobs",
                Tensor::from(std::mem::take(&mut t.behavior_logprobs).into_dyn()),
            ),
            (
                "policy_versions",
                Tensor::from(std::mem::take(&mut t.policy_versions).into_dyn()),
            ),
        ];
        if let Some(r) = t.ref_logprobs.take() {
            arrays.push(("ref_logprobs", Tensor::from(r.into_dyn())));
        }
        Self {
            inner: Mutex::new(Some(batch)),
            arrays,
            efficiency,
        }
    }

    /// The batch, for its completion; an error once it was taken.
    fn take(&self) -> PyResult<GroupBatch> {
        self.inner
            .lock()
            .map_err(|_| BufferError::new_err("lock poisoned"))?
            .take()
            .ok_or_else(|| BufferError::new_err("this batch was already completed"))
    }
}

#[pymethods]
impl PyTrainBatch {
    /// `input_ids`, `position_ids`, `segment_ids`, `loss_mask`, `advantages`,
    /// `behavior_logprobs`, `policy_versions` (and `ref_logprobs` when present) as numpy
    /// arrays, plus `group_ids` and `efficiency`.
    fn arrays<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let guard = self
            .inner
            .lock()
            .map_err(|_| BufferError::new_err("lock poisoned"))?;
        let b = guard
            .as_ref()
            .ok_or_else(|| BufferError::new_err("this batch was already completed"))?;
        let d = PyDict::new(py);
        for (name, tensor) in &self.arrays {
            // Read-only views of the packed arrays: every call, no copy.
            d.set_item(*name, tensor_to_py(py, tensor)?)?;
        }
        d.set_item("group_ids", b.batch.group_ids.clone())?;
        d.set_item("efficiency", self.efficiency)?;
        d.set_item("short", b.short)?;
        Ok(d)
    }

    /// Commits the packed groups and discards the rejected ones.
    fn complete<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::batch::needs_event_loop(py)?;
        let batch = self.take()?;
        awaitable(py, async move { batch.complete().await.map_err(py_err) })
    }

    /// Blocking `complete`.
    fn complete_blocking(&self, py: Python<'_>) -> PyResult<()> {
        block(py, self.take()?.complete())
    }
}

/// Trainer batches from one or more environment buffers (see the Rust `Batcher`).
#[pyclass(module = "rollout_buffer._native", name = "Batcher")]
pub(crate) struct PyBatcher {
    batcher: Arc<Batcher>,
}

#[pymethods]
impl PyBatcher {
    /// `sources`: `(name, buffer, rpc, fraction)` tuples. `advantage`: `"grpo"`, `"rloo"`
    /// or `"none"`.
    #[new]
    #[pyo3(signature = (sources, seq_len, rows, group_size, advantage="grpo", wait=1.0))]
    fn new(
        sources: Vec<(String, PyRef<'_, PyBuffer_>, String, f64)>,
        seq_len: i128,
        rows: i128,
        group_size: i128,
        advantage: &str,
        wait: f64,
    ) -> PyResult<Self> {
        let seq_len: usize = count("seq_len", seq_len)?;
        let rows: usize = count("rows", rows)?;
        let group_size: usize = count("group_size", group_size)?;
        let advantage = match advantage {
            "grpo" => Advantage::Grpo {
                divide_by_std: true,
            },
            "rloo" => Advantage::Rloo,
            "none" => Advantage::None,
            other => {
                return Err(PyValueError::new_err(format!(
                    "advantage `{other}`: grpo, rloo or none"
                )))
            }
        };
        let sources = sources
            .into_iter()
            .map(|(name, buffer, rpc, fraction)| Source {
                name,
                buffer: buffer.buf.clone(),
                rpc,
                fraction,
            })
            .collect();
        let config = BatcherConfig {
            packer: Packer::new(seq_len, rows),
            hooks: Arc::new(SlimeHooks { group_size }),
            advantage,
            dynamic: None,
            wait: seconds("wait", wait)?,
            shortfall: Shortfall::FillFromOthers,
        };
        Ok(Self {
            batcher: Arc::new(Batcher::new(sources, config).map_err(py_err)?),
        })
    }

    /// The next packed batch; `timeout` in seconds raises `Timeout` (with every group it
    /// had leased given back).
    #[pyo3(signature = (timeout=None))]
    fn next_batch<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let timeout = timeout_arg(timeout)?;
        let batcher = Arc::clone(&self.batcher);
        awaitable(py, async move {
            let batch = next_batch(&batcher, timeout).await.map_err(py_err)?;
            Ok(PyTrainBatch::new(batch))
        })
    }

    /// Blocking `next_batch`.
    #[pyo3(signature = (timeout=None))]
    fn next_batch_blocking(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyTrainBatch> {
        let timeout = timeout_arg(timeout)?;
        let batch = block(py, next_batch(&self.batcher, timeout))?;
        Ok(PyTrainBatch::new(batch))
    }
}

/// A `Batcher`'s next batch, within `timeout` if one is given (dropped at the timeout, it
/// gives back every group it had leased).
async fn next_batch(
    batcher: &Batcher,
    timeout: Option<Duration>,
) -> rollout_buffer::Result<GroupBatch> {
    match timeout {
        Some(t) => within(t, "next_batch", batcher.next_batch()).await,
        None => batcher.next_batch().await,
    }
}
