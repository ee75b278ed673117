//! `RpcDef`: what one consumer of the buffer reads, writes and how it is served.

use std::time::Duration;

/// The order in which an RPC takes eligible samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Selection {
    /// Oldest birth first; equal births in put order. The default, as in AReaL.
    #[default]
    Fifo,
    /// Newest birth first; equal births in reverse put order.
    Lifo,
}

/// One consumer of the buffer: a name, the batch size it takes (`n_seqs`), the keys a sample
/// must hold before it may be served to it, and the keys it writes back on completion.
///
/// ```
/// use rollout_buffer::{RpcDef, Selection};
/// use std::time::Duration;
/// let train = RpcDef::new("train", 64)
///     .inputs(["tokens", "reward"])
///     .reads(2)                       // each sample is trained on twice
///     .selection(Selection::Lifo)
///     .lease_timeout(Duration::from_secs(600));
/// assert_eq!(train.n_seqs(), 64);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RpcDef {
    pub(crate) name: String,
    pub(crate) n_seqs: usize,
    pub(crate) inputs: Vec<String>,
    pub(crate) outputs: Vec<String>,
    pub(crate) reads: u32,
    pub(crate) selection: Selection,
    pub(crate) lease_timeout: Option<Duration>,
}

impl RpcDef {
    /// An RPC taking batches of exactly `n_seqs` samples, with no inputs or outputs yet,
    /// one read per sample and `Fifo` selection.
    pub fn new(name: impl Into<String>, n_seqs: usize) -> Self {
        Self {
            name: name.into(),
            n_seqs,
            inputs: Vec::new(),
            outputs: Vec::new(),
            reads: 1,
            selection: Selection::Fifo,
            lease_timeout: None,
        }
    }

    /// The keys a sample must hold to be served to this RPC; the batch carries only these.
    pub fn inputs<S: Into<String>>(mut self, keys: impl IntoIterator<Item = S>) -> Self {
        self.inputs = dedup(keys);
        self
    }

    /// The keys this RPC writes with `Batch::complete`; no other key is accepted there.
    pub fn outputs<S: Into<String>>(mut self, keys: impl IntoIterator<Item = S>) -> Self {
        self.outputs = dedup(keys);
        self
    }

    /// How many times this RPC may use one sample (default 1).
    pub fn reads(mut self, reads: u32) -> Self {
        self.reads = reads;
        self
    }

    /// The order in which eligible samples are taken (default [`Selection::Fifo`]).
    pub fn selection(mut self, selection: Selection) -> Self {
        self.selection = selection;
        self
    }

    /// A lease neither completed nor committed within `timeout` is released by the buffer
    /// (its samples are redelivered) and a late `complete`/`commit` fails with
    /// `Error::LeaseExpired`. Without it a lease lasts until its `Batch` is dropped.
    /// Waiting getters sleep until the next deadline with tokio's timer, so a buffer whose
    /// RPCs use lease timeouts needs a runtime with the time driver enabled.
    pub fn lease_timeout(mut self, timeout: Duration) -> Self {
        self.lease_timeout = Some(timeout);
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The batch size.
    pub fn n_seqs(&self) -> usize {
        self.n_seqs
    }

    /// The input keys.
    pub fn input_keys(&self) -> &[String] {
        &self.inputs
    }

    /// The output keys.
    pub fn output_keys(&self) -> &[String] {
        &self.outputs
    }

    /// Reads per sample.
    pub fn reads_per_sample(&self) -> u32 {
        self.reads
    }

    /// The selection order.
    pub fn selection_order(&self) -> Selection {
        self.selection
    }

    /// The lease timeout, if any.
    pub fn lease_timeout_duration(&self) -> Option<Duration> {
        self.lease_timeout
    }
}

fn dedup<S: Into<String>>(keys: impl IntoIterator<Item = S>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for k in keys {
        let k = k.into();
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}
