//! The crate's single error type.
//!
//! Every variant says what was wrong and where (which RPC, sample, key, slot or lease), so a
//! log line is enough to find the cause. A call that returns an error has changed nothing
//! that was already stored. A put that stored nothing hands the caller's samples back in
//! its error ([`Unstored`]); a storage failure keeps its cause ([`Error::Storage`]'s
//! `kind` and `source`).
//!
//! This is the lowest layer of the crate: it names no other module. [`Unstored`] holds
//! samples without naming their type here; `sample.rs` gives it its typed accessors.

use crate::sync::Arc;
use std::any::Any;
use std::fmt;
use std::time::Duration;

/// What kind of failure an [`Error::Storage`] is, so a caller can tell a missing object
/// from a refused write or a broken connection without parsing text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StorageKind {
    /// The object or directory does not exist.
    NotFound,
    /// A create-only write found an object there already.
    AlreadyExists,
    /// A conditional write's precondition failed (another writer got there first).
    Precondition,
    /// The store refused the credentials, or the file system the permissions.
    PermissionDenied,
    /// Anything else: the network, the service, a full disk, a bad URL.
    Other,
}

/// The underlying error of an [`Error::Storage`] or [`Error::Corrupt`], shared so that
/// [`Error`] stays `Clone`. Two sources always compare equal: errors are equal when what
/// they say about the buffer (variant, store, path, kind, detail) is.
#[derive(Clone)]
pub struct ErrorSource(pub Arc<dyn std::error::Error + Send + Sync>);

impl ErrorSource {
    /// The underlying error.
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for ErrorSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl PartialEq for ErrorSource {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The samples of a put that stored none of them, handed back with the error that refused
/// them, as crossbeam's `TrySendError::Full(T)` hands back its message: take them with
/// [`Unstored::into_samples`] to retry later. Empty where the error hands nothing back (a
/// get's timeout, say).
///
/// Two `Unstored` compare equal when they hold the same number of samples.
#[derive(Clone, Default)]
pub struct Unstored(pub(crate) Option<Arc<dyn Any + Send + Sync>>);

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `rollout_buffer`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ----- configuration -------------------------------------------------------------
    /// The capacity is zero or larger than the slot index space.
    #[error("invalid capacity {capacity}: must be between 1 and {max}")]
    InvalidCapacity {
        /// The capacity asked for.
        capacity: usize,
        /// The largest capacity supported.
        max: usize,
    },
    /// No RPC was given; a buffer nobody reads from would only fill up.
    #[error("a buffer needs at least one RPC definition")]
    NoRpcs,
    /// Two RPC definitions share a name.
    #[error("RPC name `{name}` is defined twice")]
    DuplicateRpc {
        /// The repeated name.
        name: String,
    },
    /// An RPC's `n_seqs` is zero or larger than the capacity, so it could never be served.
    #[error("RPC `{rpc}` has n_seqs {n_seqs}; it must be between 1 and the capacity {capacity}")]
    InvalidNSeqs {
        /// The RPC.
        rpc: String,
        /// Its batch size.
        n_seqs: usize,
        /// The buffer capacity.
        capacity: usize,
    },
    /// An RPC allows zero reads per sample.
    #[error("RPC `{rpc}` has reads {reads}; it must be between 1 and {max}")]
    InvalidReads {
        /// The RPC.
        rpc: String,
        /// The reads asked for.
        reads: u32,
        /// The largest supported.
        max: u32,
    },
    /// A put batch holds more tensor bytes than the buffer's whole byte budget.
    #[error("put batch of {bytes} bytes exceeds the byte budget of {max}")]
    OverBudget {
        /// Bytes in the batch.
        bytes: u64,
        /// The budget.
        max: u64,
    },
    /// A rollout record is malformed (per-token arrays of the wrong length, say).
    #[error("rollout `{uid}`: {detail}")]
    InvalidRollout {
        /// The rollout's uid.
        uid: String,
        /// What is wrong.
        detail: String,
    },
    /// The batch of this training step was completed or committed already.
    #[error("RPC `{rpc}`: the batch of step {step} was already used")]
    StepConsumed {
        /// The RPC.
        rpc: String,
        /// The step.
        step: u64,
    },
    /// The logged batch of this training step cannot be served again.
    #[error("RPC `{rpc}`: the batch of step {step} cannot be served again: {detail}")]
    StepUnavailable {
        /// The RPC.
        rpc: String,
        /// The step.
        step: u64,
        /// Why.
        detail: String,
    },
    /// A packer's settings cannot produce a batch (zero rows or row length).
    #[error("invalid packing: {detail}")]
    InvalidPacking {
        /// What is wrong.
        detail: String,
    },
    /// An RPC's selection policy has parameters out of range.
    #[error("RPC `{rpc}`: invalid selection: {detail}")]
    InvalidSelection {
        /// The RPC.
        rpc: String,
        /// What is wrong.
        detail: String,
    },
    /// An RPC's rate limit has parameters out of range.
    #[error("RPC `{rpc}`: invalid rate limit: {detail}")]
    InvalidRateLimit {
        /// The RPC.
        rpc: String,
        /// What is wrong.
        detail: String,
    },
    /// A put is larger than an RPC's rate limit lets through at once: it could never
    /// proceed.
    #[error(
        "a put of {len} samples can never pass RPC `{rpc}`'s rate limit, which admits at most {max} at once"
    )]
    RateLimitedPut {
        /// The RPC whose limit refuses it.
        rpc: String,
        /// Samples in the put.
        len: usize,
        /// The largest put the limit admits.
        max: usize,
    },
    /// A sample's policy version is newer than the buffer's current one (Marin's rule:
    /// rollouts from the future are rejected).
    #[error("sample `{id}` has policy version {version}, newer than the current {current}")]
    FutureVersion {
        /// The sample.
        id: String,
        /// Its version.
        version: u64,
        /// The buffer's current version.
        current: u64,
    },
    /// A metadata entry the buffer interprets has the wrong type or value.
    #[error("sample `{id}`: metadata `{key}`: {detail}")]
    InvalidMetadata {
        /// The sample.
        id: String,
        /// The key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// `set_policy_version` was given a version older than the current one.
    #[error("policy version {requested} is older than the current {current}")]
    VersionRegressed {
        /// The current version.
        current: u64,
        /// The version asked for.
        requested: u64,
    },
    /// Two RPCs declare the same output key.
    #[error("key `{key}` is an output of both `{first}` and `{second}`")]
    DuplicateProducer {
        /// The key.
        key: String,
        /// The first RPC that outputs it.
        first: String,
        /// The second RPC that outputs it.
        second: String,
    },
    /// A key declared external is also an RPC output, so its producer would be ambiguous.
    #[error("key `{key}` is declared external but RPC `{rpc}` outputs it")]
    ExternalKeyProduced {
        /// The key.
        key: String,
        /// The RPC that outputs it.
        rpc: String,
    },
    /// The dataflow graph has a cycle: the RPC's output feeds, directly or not, one of its
    /// own inputs, so no sample could ever become ready for it.
    #[error("dataflow cycle: RPC `{rpc}` (through key `{key}`) depends on its own output")]
    CyclicGraph {
        /// An RPC on the cycle.
        rpc: String,
        /// The key through which it depends on itself.
        key: String,
    },
    /// More distinct keys or RPCs than the buffer's bitsets hold.
    #[error("too many {what}: {count} (at most {max})")]
    TooMany {
        /// `"keys"` or `"RPCs"`.
        what: &'static str,
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },

    // ----- put / amend input ---------------------------------------------------------
    /// A put batch is larger than the whole buffer and could never fit.
    #[error("batch of {len} samples is larger than the capacity {capacity}")]
    BatchTooLarge {
        /// Samples in the batch.
        len: usize,
        /// The buffer capacity.
        capacity: usize,
    },
    /// A sample id appears twice in one batch, or is already in the buffer.
    #[error("sample `{id}` (batch position {index}) is a duplicate: {conflict}")]
    DuplicateId {
        /// The id.
        id: String,
        /// Position in the rejected batch.
        index: usize,
        /// What it collides with.
        conflict: String,
    },
    /// A sample's birth is zero; births must be positive (smaller = older).
    #[error("sample `{id}` (batch position {index}) has birth 0; births must be > 0")]
    InvalidBirth {
        /// The id.
        id: String,
        /// Position in the rejected batch.
        index: usize,
    },
    /// A sample lacks a dataset key, one that some RPC reads and nothing else produces.
    #[error("sample `{id}` (batch position {index}) lacks dataset key `{key}`")]
    MissingKey {
        /// The id.
        id: String,
        /// Position in the rejected batch.
        index: usize,
        /// The missing key.
        key: String,
    },
    /// `try_put_batch` found too few free slots (or earlier putters waiting for them, or
    /// not enough room under the byte or memory budget); nothing was stored.
    #[error("buffer full: {requested} slots requested, {free} free")]
    Full {
        /// Slots asked for.
        requested: usize,
        /// Slots free at the time.
        free: usize,
        /// The samples of the put, handed back.
        samples: Unstored,
    },
    /// `try_put_batch` found a persistent buffer's log too far behind the puts already
    /// accepted (more put data waiting to be written than its limit); nothing was stored.
    /// Slots may be free: it is the store that is slow.
    #[error("log backlog: the store is behind; {requested} samples not stored")]
    Backlog {
        /// Samples in the refused put.
        requested: usize,
        /// The samples of the put, handed back.
        samples: Unstored,
    },
    /// A handle names a slot whose sample was freed or replaced since the handle was made.
    #[error(
        "stale handle: slot {slot} generation {generation} ({})",
        stale_detail(*.generation, *.current)
    )]
    StaleHandle {
        /// The slot.
        slot: u32,
        /// The handle's generation.
        generation: u32,
        /// The slot's current generation.
        current: u32,
    },
    /// One sample's handle appears twice in one amend: which patch wins would depend on
    /// their order.
    #[error(
        "amend_batch: the handle of slot {slot} appears twice (positions {first} and {index})"
    )]
    DuplicateHandle {
        /// The slot.
        slot: u32,
        /// Its first position in the call.
        first: usize,
        /// Its second position.
        index: usize,
    },
    /// A handle names a slot outside the buffer.
    #[error("handle names slot {slot}, but the capacity is {capacity}")]
    InvalidSlot {
        /// The slot.
        slot: u32,
        /// The buffer capacity.
        capacity: usize,
    },
    /// The number of patches or outputs differs from the number of samples they apply to.
    #[error("{what}: {got} patches for {expected} samples")]
    LengthMismatch {
        /// Which call.
        what: &'static str,
        /// Samples addressed.
        expected: usize,
        /// Patches given.
        got: usize,
    },
    /// `Batch::complete` was given a key the RPC does not declare as an output.
    #[error("RPC `{rpc}` does not declare output `{key}` (sample `{id}`)")]
    UndeclaredOutput {
        /// The RPC.
        rpc: String,
        /// The key.
        key: String,
        /// The sample it was given for.
        id: String,
    },
    /// `Batch::complete` or `commit` would leave a sample without an output that another
    /// RPC reads, so that RPC could never be served it and its slot would never be freed.
    #[error("RPC `{rpc}` must output `{key}` for sample `{id}`: another RPC reads it")]
    MissingOutput {
        /// The RPC.
        rpc: String,
        /// The missing key.
        key: String,
        /// The sample.
        id: String,
    },
    /// A ragged tensor's lengths do not add up to its number of rows.
    #[error("ragged tensor: lengths sum to {sum}, but the values have {rows} rows")]
    RaggedLengths {
        /// Sum of the lengths.
        sum: usize,
        /// Rows (first-axis length) of the values.
        rows: usize,
    },

    /// A column could not be converted to or from Arrow.
    #[error("Arrow column `{column}`: {detail}")]
    Arrow {
        /// The column.
        column: String,
        /// What was wrong.
        detail: String,
    },

    /// A storage operation failed.
    #[error("storage `{url}`, path `{path}`: {detail}")]
    Storage {
        /// The store's URL.
        url: String,
        /// The path inside it (empty for the store itself).
        path: String,
        /// What kind of failure it is.
        kind: StorageKind,
        /// What went wrong.
        detail: String,
        /// The store's or the file system's own error, when there is one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// A stored file is damaged: unreadable, truncated, or failing its checksum.
    #[error("corrupt file `{path}` in `{url}`: {detail}")]
    Corrupt {
        /// The store's URL.
        url: String,
        /// The file, relative to the store.
        path: String,
        /// What is wrong with it.
        detail: String,
        /// The decoder's own error (Parquet's, JSON's), when there is one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// Stored data does not fit the buffer being opened on it (an RPC or key it needs was
    /// removed, or it holds more samples than the new capacity).
    #[error("stored data does not match the buffer's configuration: {detail}")]
    Incompatible {
        /// What does not match.
        detail: String,
    },

    /// The buffer's configuration cannot work as given.
    #[error("invalid configuration: {detail}")]
    InvalidConfig {
        /// What is wrong.
        detail: String,
    },

    /// A feature that runs a background task (the log writer, the archive writer) was
    /// configured, or a buffer with a memory budget was asked for a batch (whose spilled
    /// inputs a task must read back), outside a tokio runtime.
    #[error("{what} needs a tokio runtime, and was called outside one")]
    NoRuntime {
        /// What needed it.
        what: &'static str,
    },

    // ----- get / lease ---------------------------------------------------------------
    /// No RPC of that name was defined.
    #[error("unknown RPC `{name}`")]
    UnknownRpc {
        /// The name asked for.
        name: String,
    },
    /// The lease ran past the RPC's lease timeout and was released by the buffer; the
    /// samples went back to the RPC's eligible set, and nothing of this call was applied.
    #[error(
        "lease {lease} of RPC `{rpc}` expired after {timeout:?}; its samples were redelivered"
    )]
    LeaseExpired {
        /// The RPC.
        rpc: String,
        /// The lease number.
        lease: u64,
        /// The RPC's lease timeout.
        timeout: Duration,
    },

    // ----- lifecycle -----------------------------------------------------------------
    /// The buffer was closed.
    #[error("buffer closed")]
    Closed,
    /// A wait did not finish in time; nothing was leased or stored (but see `samples`).
    #[error("{op} timed out after {after:?}")]
    Timeout {
        /// Which call (`put_batch`, `get_batch_for_rpc(<rpc>)`).
        op: String,
        /// The timeout.
        after: Duration,
        /// A put's samples, handed back when none of them was claimed. Empty for a get,
        /// and for a put whose slots were claimed and whose log write was still pending
        /// (it may yet be stored: look before putting those samples again).
        samples: Unstored,
    },
    /// `check_invariants()` found the state inconsistent (a bug in this crate).
    #[error("invariant violated: {detail}")]
    InvariantViolated {
        /// What was inconsistent, naming slot / RPC / lease.
        detail: String,
    },
}

/// Why a [`Error::StaleHandle`]'s slot does not hold the handle's sample.
fn stale_detail(generation: u32, current: u32) -> String {
    match generation.cmp(&current) {
        // Same generation, nothing stored: a slot never used (a handle made from numbers).
        std::cmp::Ordering::Equal => "the slot holds no sample".to_owned(),
        std::cmp::Ordering::Less => {
            format!("its sample was freed or replaced: the slot is now at generation {current}")
        }
        std::cmp::Ordering::Greater => {
            format!("the slot has not reached that generation: it is at {current}")
        }
    }
}
