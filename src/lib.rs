//! # rollout-buffer
//!
//! The buffer between the rollout side and the training side of asynchronous reinforcement
//! learning for language models (GRPO, RLOO, decoupled PPO). Producers put samples into a
//! fixed number of slots; each consumer ("RPC": generation, a reward model, a trainer)
//! declares the data keys it reads and writes, and gets batches of exactly `n_seqs` samples
//! as soon as that many hold all its inputs. Every sample is used a set number of times per
//! RPC and its slot is freed after the last use.
//!
//! ```
//! use rollout_buffer::{Patch, RpcDef, Sample, SequenceBuffer};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rollout_buffer::Error> {
//! let buf = SequenceBuffer::new(1024, [
//!     RpcDef::new("gen", 2).inputs(["prompt"]).outputs(["tokens"]),
//!     RpcDef::new("reward", 2).inputs(["tokens"]).outputs(["reward"]),
//!     RpcDef::new("train", 2).inputs(["tokens", "reward"]),
//! ])?;
//! let handles = buf
//!     .put_batch(vec![
//!         Sample::new("p0").with("prompt", vec![1i32, 2, 3]),
//!         Sample::new("p1").with("prompt", vec![4i32, 5]),
//!     ])
//!     .await?;
//! assert_eq!(handles.len(), 2);
//!
//! let gen = buf.get_batch_for_rpc("gen").await?;
//! let out = gen.samples().map(|_| Patch::new().with("tokens", vec![7i32, 8])).collect();
//! gen.complete(out).await?;                      // now ready for "reward"
//!
//! let rew = buf.get_batch_for_rpc("reward").await?;
//! let out = rew.samples().map(|_| Patch::new().with("reward", 1.0f64)).collect();
//! rew.complete(out).await?;                      // now ready for "train"
//!
//! let train = buf.get_batch_for_rpc("train").await?;
//! assert!(train.sample(0).is_some_and(|s| s.get("prompt").is_none())); // only the RPC's input keys
//! train.commit().await?;                         // last read: slots are freed
//! assert!(buf.is_empty());
//! # Ok(())
//! # }
//! ```
//!
//! Layers, lowest first (each uses only those below it; [`implementation`] has the picture,
//! what each module owns and the life of a sample): `sync` (the one place naming
//! synchronisation primitives, swapped for loom's under `--cfg rollout_buffer_loom`),
//! `error` and `exit`, `tensor`, `sample`, `rpc_defs` (RPC definitions, graph validation,
//! key interning) and [`arrow`] (samples as Arrow record batches), `state` (the synchronous
//! slot state machine: readiness, staleness, selection, the byte and memory budgets),
//! `buffer` (the async API; spilling payloads under a memory budget, see
//! [`BufferConfig::memory_budget`]), then two siblings: [`persist`] (write-ahead log,
//! checkpoints, recovery, the Parquet archive, spill segments) and [`rollout`] (the RL
//! layer: rollout records, group assembly and ingestion, admission, group hooks,
//! advantages, packing, the multi-environment batcher, metrics).

#[cfg(feature = "arrow")]
pub mod arrow;
mod buffer;
mod deadline;
mod error;
mod exit;
#[cfg(feature = "persist")]
pub mod persist;
pub mod rollout;
mod rpc_defs;
mod sample;
mod state;
mod sync;
mod tensor;

pub use buffer::{
    Batch, BufferConfig, FreedSink, Overflow, RateLimitStats, RpcStats, RpcWaiting, SampleView,
    SequenceBuffer, SinkFuture, SlotHandle, SpillStats, Stats, StoredSample, CREATED_TS,
    DISCARD_REASON, POLICY_VERSION,
};
pub use error::{Error, ErrorSource, Result, StorageKind, Unstored};
pub use exit::ExitReason;
pub use rpc_defs::{RateLimit, RpcDef, Selection};
pub use sample::{FieldKey, MetaValue, Patch, Sample, SampleId};
pub use tensor::{DType, Element, SharedBytes, Tensor, TensorData};

#[doc = include_str!("../docs/architecture.md")]
pub mod implementation {}

/// Re-exported so callers build tensors with the same ndarray version.
pub use ndarray;

/// The README's examples, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The examples of `docs/persistence.md`, compiled and run as doc tests.
#[doc = include_str!("../docs/persistence.md")]
#[cfg(all(doctest, feature = "persist"))]
pub struct PersistenceDoctests;

/// The examples of `docs/rl.md`, compiled and run as doc tests.
#[doc = include_str!("../docs/rl.md")]
#[cfg(doctest)]
pub struct RlDoctests;

/// The examples of `docs/spill.md`, compiled and run as doc tests.
#[doc = include_str!("../docs/spill.md")]
#[cfg(all(doctest, feature = "persist"))]
pub struct SpillDoctests;
