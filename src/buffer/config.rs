//! `BufferConfig`: capacity, RPC definitions and external keys of a buffer.

use super::FreedSink;
use crate::rpc_defs::RpcDef;
use crate::sync::Arc;
use std::time::Duration;

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
    pub(crate) max_bytes: Option<u64>,
    pub(crate) overflow: Overflow,
    pub(crate) memory_budget: Option<u64>,
    pub(crate) spill_store: Option<Arc<dyn super::SpillStore>>,
    pub(crate) wait_warning: Option<Duration>,
}

/// What a put that does not fit (too few free slots, or over the byte budget) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overflow {
    /// Wait until it fits (back-pressure). The default.
    #[default]
    Wait,
    /// Evict the oldest fully-ready samples (stored, not leased or amended, ready for
    /// every RPC that still owes them reads) when that makes the put fit, else wait.
    /// Evicted samples go to the freed-sample sink with `ExitReason::Evicted`.
    EvictOldest,
    /// Fail at once with `Error::Full`, like `try_put_batch`.
    Reject,
}

impl BufferConfig {
    /// A configuration with `capacity` slots and no RPCs yet.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            rpcs: Vec::new(),
            external_keys: Vec::new(),
            freed_sink: None,
            max_bytes: None,
            overflow: Overflow::Wait,
            memory_budget: None,
            spill_store: None,
            wait_warning: None,
        }
    }

    /// Makes a getter that has waited `after` log, at warn level, why it waits (see
    /// [`SequenceBuffer::explain`](crate::SequenceBuffer::explain)), and again after
    /// twice as long each time; each warning counts in [`RpcStats::wait_warnings`](crate::RpcStats::wait_warnings).
    /// A threshold under 10 ms counts as 10 ms (a zero one would warn at every wake-up).
    /// Off by default: waiting getters then need no timer, and the runtime no time driver.
    pub fn wait_warning(mut self, after: Duration) -> Self {
        self.wait_warning = Some(after);
        self
    }

    /// Keeps at most about `bytes` of tensor data in memory: past it, the fields of idle
    /// samples are written to Parquet spill segments and read back when a batch selects
    /// them (see the README, "Spilling"). Every slot, its keys, metadata and readiness
    /// stay in memory. A put waits while its bytes do not fit under the budget (unless
    /// nothing is in memory), so the count stays within the budget plus one put batch
    /// (and what amends and completions add). Nothing is written while the count is within
    /// the budget and no put waits for room (or was refused it by `try_put_batch`, whose
    /// retry then finds it); once over, the spiller writes the count down to 7/8 of the
    /// budget (or lower, to make room for the put), so it works in batches.
    ///
    /// Segments go to `<root>/spill/` of a persistent buffer's store, to the store set
    /// with `spill_to` (feature `persist`), or else to a fresh directory under the system's
    /// temporary directory, removed with the buffer.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// Limits the tensor bytes the stored samples hold (besides the slot count). A put
    /// reserves its bytes when it takes its slots; amends and completions never wait and
    /// may go over, after which puts wait until the total is back under. A batch larger
    /// than the budget on its own is rejected.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// What a put that does not fit does (default [`Overflow::Wait`]).
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.overflow = overflow;
        self
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
