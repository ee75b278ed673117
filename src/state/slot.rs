//! The words of the slot state machine that more than one of its files speaks: per-slot
//! metadata, what an RPC means to the table, generations, the [`Wake`] a transition
//! returns, and how a lease ends. Nothing here changes state; `table/` does.

use super::ready::OrderKey;
use crate::rpc_defs::{KeySet, RateLimit, RpcInfo, RpcSet, Selection};
use std::time::Duration;

/// How many times a slot (or a lease-table entry) was reused. Bumped each time the slot
/// returns to `empty`, so a handle made before names an older generation and is refused.
///
/// It wraps at 2^32: a handle held across exactly 2^32 reuses of its slot aliases the
/// sample stored then (the ABA case). At one reuse of the same slot per microsecond that
/// takes more than an hour of holding one handle, far beyond any lease or amend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(transparent)]
pub(crate) struct Generation(u32);

impl Generation {
    /// The generation with this number (one that crossed a process boundary).
    pub(crate) const fn from_raw(n: u32) -> Self {
        Self(n)
    }

    /// Its number.
    pub(crate) const fn get(self) -> u32 {
        self.0
    }

    /// The next generation, wrapping at 2^32.
    #[must_use]
    pub(crate) const fn advance(self) -> Self {
        Self(self.0.wrapping_add(1))
    }
}

/// Per-slot state (besides the state masks and `reads_left`), laid out so that one
/// transition on a slot touches one cache line.
#[derive(Debug, Clone, Default)]
#[repr(align(64))]
pub(crate) struct SlotMeta {
    /// Sort key in the ready indexes: (birth, put sequence).
    pub(crate) order: OrderKey,
    /// Graph keys the stored sample holds.
    pub(crate) keys: KeySet,
    /// The RPCs holding a lease on the slot.
    pub(crate) lease_bits: RpcSet,
    /// The RPCs whose ready index holds the slot.
    pub(crate) in_ready: RpcSet,
    /// Bumped each time the slot returns to `empty`.
    pub(crate) generation: Generation,
    /// Sum of the slot's `reads_left` over all RPCs.
    pub(crate) reads_total: u32,
    /// Amends in flight.
    pub(crate) amenders: u32,
    /// The RPCs the sample is too old for (by version or age); sticky until freed.
    pub(crate) stale: RpcSet,
}

/// What one RPC means to the state machine.
#[derive(Debug, Clone)]
pub(crate) struct RpcSpec {
    pub(crate) inputs: KeySet,
    pub(crate) reads: u16,
    pub(crate) n_seqs: usize,
    pub(crate) selection: Selection,
    pub(crate) lease_timeout: Option<Duration>,
    pub(crate) max_staleness: Option<u64>,
    pub(crate) max_age: Option<Duration>,
    pub(crate) rate_limit: Option<RateLimit>,
}

impl From<&RpcInfo> for RpcSpec {
    fn from(info: &RpcInfo) -> Self {
        Self {
            inputs: info.inputs,
            reads: info.reads,
            n_seqs: info.n_seqs,
            selection: info.selection.clone(),
            lease_timeout: info.lease_timeout,
            max_staleness: info.max_staleness,
            max_age: info.max_age,
            rate_limit: info.rate_limit,
        }
    }
}

/// Which waiters a transition may have unblocked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use = "waiters must be notified after the lock is dropped"]
pub(crate) struct Wake {
    /// The RPCs that gained eligible samples.
    pub(crate) rpcs: RpcSet,
    /// Free slots appeared, or the head of the putter queue changed.
    pub(crate) space: bool,
    /// More payload bytes are resident than the memory budget allows: the spiller has work.
    pub(crate) spill: bool,
    /// Samples of leases that expired (and were given back), logged once the lock is
    /// dropped: a log event under the lock can wait on whatever the subscriber needs (a
    /// Python logging bridge needs the GIL, whose holder may be waiting for the lock).
    pub(crate) expired_samples: u32,
}

impl Wake {
    pub(crate) fn merge(&mut self, other: Wake) {
        self.rpcs = self.rpcs.union(other.rpcs);
        self.space |= other.space;
        self.spill |= other.spill;
        self.expired_samples = self.expired_samples.saturating_add(other.expired_samples);
    }
}

/// A putter's place in the queue of puts waiting for free slots.
pub(crate) type Ticket = u64;

/// Running totals, in samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) put: u64,
    pub(crate) freed: u64,
    /// Per RPC: reads used (completions and commits).
    pub(crate) reads: Vec<u64>,
    /// Per RPC: samples whose lease was released or expired unused.
    pub(crate) redelivered: Vec<u64>,
    /// Per RPC: leases that expired.
    pub(crate) expired_leases: Vec<u64>,
    /// Samples dropped because an RPC that owed them reads could no longer serve them.
    pub(crate) stale: u64,
    /// Samples evicted to make room.
    pub(crate) evicted: u64,
    /// Samples discarded by a consumer.
    pub(crate) filtered: u64,
}

/// How a lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseEnd {
    /// One read of every sample is used (`complete` / `commit`).
    Used,
    /// Nothing is used; the samples are eligible again for the RPC (drop or expiry).
    Released,
    /// The samples leave the buffer (once nothing else holds them), whatever reads are
    /// left: the consumer rejected them.
    Discarded,
}

/// A lease that cannot be finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseGone {
    /// Its deadline passed; it was (or now is) released.
    Expired,
}
