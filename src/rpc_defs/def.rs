//! `RpcDef`: what one consumer of the buffer reads, writes and how it is served.

use std::time::Duration;

/// How an RPC picks `n_seqs` samples among the eligible ones.
///
/// `Fifo` and `Lifo` take from one end of the RPC's ready index and cost O(`n_seqs`). The
/// randomised policies look at every eligible sample once per batch (O(eligible)) and draw
/// without replacement with the Gumbel-top-k trick, from a stream seeded by `seed` and
/// the batch's step (or the RPC's count of leases): the same seed and the same sequence of
/// operations give the same batches, however unrelated tasks are scheduled. No policy
/// depends on hash-map order or on unseeded randomness.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub enum Selection {
    /// Oldest birth first; equal births in put order. The default, as in AReaL.
    #[default]
    Fifo,
    /// Newest birth first; equal births in reverse put order.
    Lifo,
    /// Every eligible sample equally likely.
    Uniform {
        /// Seed of the draws.
        seed: u64,
    },
    /// The `i`-th oldest eligible sample (from 0) has weight `(i + 1)^alpha`: the newest
    /// heaviest (Marin's replay buffer). `alpha = 0` is uniform.
    Recency {
        /// The exponent.
        alpha: f64,
        /// Seed of the draws.
        seed: u64,
    },
    /// Weight `priority^exponent`, the priority being the scalar field (or numeric
    /// metadata) `key` of the sample; missing, non-finite or non-positive priorities weigh
    /// nothing and are taken only when too few samples weigh something.
    Prioritized {
        /// The field or metadata key holding the priority.
        key: String,
        /// The exponent (Reverb's and PER's `alpha`).
        exponent: f64,
        /// Seed of the draws.
        seed: u64,
    },
    /// At least `ceil(fraction * n_seqs)` samples of the current policy version when that
    /// many are eligible, picked by `then`; the rest by `then` among all others.
    OnPolicyFraction {
        /// Share of the batch from the current version, in `[0, 1]`.
        fraction: f64,
        /// How samples are picked within each part.
        then: Box<Selection>,
    },
}

impl Selection {
    /// The priority key and exponent of a `Prioritized` selection, alone or inside
    /// `OnPolicyFraction`.
    pub(crate) fn priority(&self) -> Option<(&str, f64)> {
        match self {
            Selection::Prioritized { key, exponent, .. } => Some((key, *exponent)),
            Selection::OnPolicyFraction { then, .. } => then.priority(),
            _ => None,
        }
    }
}

/// Reverb's `SampleToInsertRatio` for one RPC: its getters wait while they would sample
/// too far ahead of the inserts, and putters wait while inserts run too far ahead of it.
///
/// With `diff = inserts * samples_per_insert - samples` (samples: the samples this RPC has
/// leased; inserts: the samples put, both counted since the buffer was built or opened), a
/// batch of `n` may be leased once the buffer holds at least `min_size` samples and
/// `diff - n >= samples_per_insert * min_size - error_buffer`; a put of `m` may proceed
/// while the buffer holds at most `min_size` samples after it, or while
/// `diff + m * samples_per_insert <= samples_per_insert * min_size + error_buffer`.
///
/// ```
/// use rollout_buffer::{RateLimit, RpcDef};
/// // Each sample trained on about twice, give or take 64 samples.
/// let train = RpcDef::new("train", 32).inputs(["tokens"]).reads(4)
///     .rate_limit(RateLimit::new(2.0, 256, 64.0));
/// # let _ = train;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Samples leased per sample put, on average (Reverb's `samples_per_insert`).
    pub samples_per_insert: f64,
    /// Samples the buffer must hold before the first lease.
    pub min_size: usize,
    /// How far, in samples, the ratio may drift either way. At least `(n_seqs +
    /// samples_per_insert) / 2`, or a getter and a putter could wait on each other.
    pub error_buffer: f64,
}

impl RateLimit {
    /// A limit of `samples_per_insert` with `min_size` and `error_buffer` (see above).
    pub fn new(samples_per_insert: f64, min_size: usize, error_buffer: f64) -> Self {
        Self {
            samples_per_insert,
            min_size,
            error_buffer,
        }
    }

    /// The largest put this limit lets through whatever the getters do, for an RPC taking
    /// batches of `n_seqs`: getters may stop anywhere below `min_diff + n_seqs`, and the
    /// put must then fit under `max_diff`.
    pub(crate) fn max_put(&self, n_seqs: usize) -> usize {
        let room = 2.0 * self.error_buffer - n_seqs as f64;
        (room / self.samples_per_insert).floor().max(0.0) as usize
    }
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
    pub(crate) max_staleness: Option<u64>,
    pub(crate) max_age: Option<Duration>,
    pub(crate) rate_limit: Option<RateLimit>,
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
            max_staleness: None,
            max_age: None,
            rate_limit: None,
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

    /// Serves a sample only while its policy version `p` satisfies
    /// `current - max_staleness <= p <= current`, `current` being the version last given to
    /// `SequenceBuffer::set_policy_version` (Marin's freshness rule; a mixed-policy group
    /// counts as its oldest member). A sample this RPC still owes reads that falls out of
    /// the window is dropped from the buffer (it could never be freed otherwise).
    pub fn max_staleness(mut self, versions: u64) -> Self {
        self.max_staleness = Some(versions);
        self
    }

    /// Serves a sample only while it is younger than `age`, measured from its
    /// `created_ts` metadata (Unix seconds; samples without it never age). Like
    /// [`Self::max_staleness`], a sample too old for an RPC that still owes it reads is
    /// dropped.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }

    /// Holds this RPC's getters and the buffer's putters to a samples-per-insert ratio
    /// (see [`RateLimit`]).
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
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

    /// The selection policy.
    pub fn selection_order(&self) -> &Selection {
        &self.selection
    }

    /// The staleness bound in policy versions, if any.
    pub fn staleness_bound(&self) -> Option<u64> {
        self.max_staleness
    }

    /// The maximum sample age, if any.
    pub fn age_bound(&self) -> Option<Duration> {
        self.max_age
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
