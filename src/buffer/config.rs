//! `BufferConfig`: capacity, RPC definitions and external keys of a buffer.

use super::FreedSink;
use crate::rpc_defs::RpcDef;
use crate::sync::Arc;

/// Everything needed to build a [`SequenceBuffer`](crate::SequenceBuffer).
///
/// ```
/// use rollout_buffer::{BufferConfig, RpcDef, SequenceBuffer};
/// let buf = SequenceBuffer::with_config(
///     BufferConfig::new(1024)
///         .rpc(RpcDef::new("gen", 8).inputs(["prompt"]).outputs(["tokens"]))
///         .rpc(RpcDef::new("train", 8).inputs(["tokens", "score"]))
///         .external_keys(["score"]), // a verifier amends it in
/// )?;
/// assert_eq!(buf.capacity(), 1024);
/// # Ok::<(), rollout_buffer::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct BufferConfig {
    pub(crate) capacity: usize,
    pub(crate) rpcs: Vec<RpcDef>,
    pub(crate) external_keys: Vec<String>,
    pub(crate) freed_sink: Option<Arc<dyn FreedSink>>,
}

impl BufferConfig {
    /// A configuration with `capacity` slots and no RPCs yet.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            rpcs: Vec::new(),
            external_keys: Vec::new(),
            freed_sink: None,
        }
    }

    /// Adds one RPC.
    pub fn rpc(mut self, rpc: RpcDef) -> Self {
        self.rpcs.push(rpc);
        self
    }

    /// Adds several RPCs.
    pub fn rpcs(mut self, rpcs: impl IntoIterator<Item = RpcDef>) -> Self {
        self.rpcs.extend(rpcs);
        self
    }

    /// Hands every consumed sample (all reads used) to `sink` when its slot is freed, e.g.
    /// a `persist::Archiver` writing them to Parquet.
    pub fn freed_sink(mut self, sink: impl FreedSink + 'static) -> Self {
        self.freed_sink = Some(Arc::new(sink));
        self
    }

    /// Declares keys that a task outside the RPC graph supplies through `amend_batch` (a
    /// verifier's score, say). RPCs may read them; puts need not carry them.
    pub fn external_keys<S: Into<String>>(mut self, keys: impl IntoIterator<Item = S>) -> Self {
        self.external_keys.extend(keys.into_iter().map(Into::into));
        self
    }
}
