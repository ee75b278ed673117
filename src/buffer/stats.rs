//! `stats()`: a consistent snapshot of slot states, per-RPC progress and running totals;
//! `waiting_report()`: per RPC, why a getter would wait. Both are taken under the buffer's
//! lock after releasing the leases past their deadline (whose waiters are notified once
//! the lock is dropped).

use super::{now, Inner, SequenceBuffer};
use crate::error::{Error, Result};
use crate::sync::{Arc, Ordering};

/// Per-RPC figures in a [`Stats`] snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RpcStats {
    /// The RPC's name.
    pub name: Arc<str>,
    /// Samples it could take right now.
    pub eligible: usize,
    /// Samples it holds leased.
    pub leased: usize,
    /// Reads it has used (completions and commits), in samples.
    pub reads: u64,
    /// Samples it released unused (dropped batches and expired leases).
    pub redelivered: u64,
    /// Leases of it that expired.
    pub expired_leases: u64,
    /// Getters parked waiting for it to have `n_seqs` eligible samples.
    pub waiting: usize,
    /// Warnings logged by its getters for waiting long (see
    /// [`BufferConfig::wait_warning`](crate::BufferConfig::wait_warning)).
    pub wait_warnings: u64,
    /// Its rate limiter, if it has one.
    pub rate_limit: Option<RateLimitStats>,
}

/// The state of one RPC's [`RateLimit`](crate::RateLimit), counted since the buffer was
/// built or opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitStats {
    /// Samples put.
    pub inserts: u64,
    /// Samples the RPC leased.
    pub samples: u64,
    /// Whether a batch may be leased now, as far as the limiter is concerned.
    pub can_sample: bool,
    /// Whether a put of one sample may proceed now, as far as the limiter is concerned.
    pub can_insert: bool,
    /// Leases the limiter refused although enough samples were eligible.
    pub held_gets: u64,
    /// Put attempts the limiter refused.
    pub held_puts: u64,
}

/// Why a getter of one RPC would wait, from [`SequenceBuffer::waiting_report`]. Every
/// stored sample is counted once, under the first reason in field order (`leased` before
/// `used_up`, and so on); a getter waits while `eligible < batch_size`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RpcWaiting {
    /// The RPC's name.
    pub name: Arc<str>,
    /// Samples a batch of it takes (`n_seqs`).
    pub batch_size: usize,
    /// Getters parked now.
    pub waiting: usize,
    /// Samples it could take now.
    pub eligible: usize,
    /// Samples its batches hold.
    pub leased: usize,
    /// Samples it has read as often as configured.
    pub used_up: usize,
    /// Samples too old for it that another holder (a lease, an amend) still keeps; a stale
    /// sample leaves the buffer once nothing holds it (see `dropped_stale`).
    pub stale: usize,
    /// Samples the buffer dropped as too old so far (all RPCs): gone, not waited on.
    pub dropped_stale: u64,
    /// Samples a consumer discarded, waiting for their other holders.
    pub discarded: usize,
    /// Samples with an amend in flight.
    pub amending: usize,
    /// Samples lacking at least one of its input keys.
    pub incomplete: usize,
    /// Per input key (by name): how many of the incomplete samples lack it.
    pub missing: Vec<(String, usize)>,
    /// Enough samples are eligible, but the RPC's rate limiter holds the getter until more
    /// samples are put (see [`RateLimit`](crate::RateLimit)).
    pub rate_limited: bool,
}

/// A snapshot of the buffer, taken under its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Number of slots.
    pub capacity: usize,
    /// Free slots.
    pub empty: usize,
    /// Slots claimed by a put that has not published yet.
    pub putting: usize,
    /// Stored slots with an amend in flight.
    pub amending: usize,
    /// Stored slots leased by at least one RPC.
    pub reading: usize,
    /// Stored slots neither amended nor leased.
    pub idle: usize,
    /// Putters waiting for free slots.
    pub waiting_putters: usize,
    /// Live leases.
    pub live_leases: usize,
    /// Per RPC, in definition order.
    pub rpcs: Vec<RpcStats>,
    /// Samples put.
    pub put: u64,
    /// Reads used, over all RPCs.
    pub read: u64,
    /// Samples freed after their last read.
    pub freed: u64,
    /// Samples dropped unconsumed because an RPC that owed them reads could no longer
    /// serve them (policy version or age).
    pub stale: u64,
    /// Samples evicted to make room under the byte budget.
    pub evicted: u64,
    /// Samples discarded by a consumer (`Batch::discard`).
    pub filtered: u64,
    /// The current policy version, if set.
    pub policy_version: Option<u64>,
    /// Tensor bytes held (only counted when the buffer has a byte budget).
    pub bytes: u64,
    /// Samples released unused, over all RPCs.
    pub redelivered: u64,
    /// Samples in put calls that were rejected (invalid, duplicate, or `Full`).
    pub rejected: u64,
    /// Whether the buffer is closed.
    pub closed: bool,
    /// Tensor bytes held in memory (only counted when the buffer has a memory budget).
    pub resident_bytes: u64,
    /// Spill activity (all zero without a memory budget).
    pub spill: SpillStats,
}

/// What a buffer with a memory budget has spilled and read back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpillStats {
    /// Stored samples with fields in a spill segment now.
    pub spilled_now: u64,
    /// Spill segments holding a live row now.
    pub live_segments: u64,
    /// Samples spilled so far (a sample spilled twice counts twice).
    pub spilled_samples: u64,
    /// Tensor bytes spilled so far.
    pub spilled_bytes: u64,
    /// Segments written so far.
    pub segments_written: u64,
    /// Segments deleted so far, their rows all freed (or moved by a rewrite).
    pub segments_deleted: u64,
    /// Segments no sample needs whose delete failed: each `flush` tries them again, and
    /// the next `open` of the store clears what is left.
    pub undeleted_segments: u64,
    /// Sparse segments rewritten with their live rows so far.
    pub segments_rewritten: u64,
    /// Sample loads started (for gets and read-ahead).
    pub loads: u64,
    /// Leased samples whose load was already under way or done (read ahead, or for
    /// another RPC), so nothing was read twice.
    pub shared_loads: u64,
    /// Segment writes that failed.
    pub failures: u64,
}

impl SequenceBuffer {
    /// A snapshot of slot states, per-RPC eligible / leased counts and totals. Releases
    /// leases past their deadline first, so the figures never count an expired lease.
    pub fn stats(&self) -> Stats {
        let shared = &self.shared;
        self.current(|inner| {
            let t = &inner.table;
            let rpcs = shared
                .graph
                .rpcs()
                .iter()
                .enumerate()
                .map(|(r, info)| RpcStats {
                    name: Arc::clone(&info.name),
                    eligible: t.eligible(r),
                    leased: t.leased[r],
                    reads: t.totals.reads[r],
                    redelivered: t.totals.redelivered[r],
                    expired_leases: t.totals.expired_leases[r],
                    waiting: t.waiting[r],
                    wait_warnings: shared.wait_warnings[r].load(Ordering::Relaxed),
                    rate_limit: rate_stats(t, r),
                })
                .collect();
            Stats {
                capacity: t.capacity,
                empty: t.empty.count(),
                putting: t.putting.count(),
                amending: t.amending.count(),
                reading: t.reading.count(),
                idle: t.idle.count(),
                waiting_putters: t.putters.len(),
                live_leases: t.leases.live(),
                rpcs,
                put: t.totals.put,
                read: t.totals.reads.iter().sum(),
                freed: t.totals.freed,
                stale: t.totals.stale,
                evicted: t.totals.evicted,
                filtered: t.totals.filtered,
                policy_version: t.policy_version(),
                bytes: t.budget.used,
                redelivered: t.totals.redelivered.iter().sum(),
                rejected: inner.rejected,
                closed: inner.closed,
                resident_bytes: t.residency.resident,
                spill: inner
                    .spill
                    .as_ref()
                    .map(|s| s.stats(shared.handover.undeleted() as u64))
                    .unwrap_or_default(),
            }
        })
    }

    /// Per RPC, why a getter would wait: every stored sample counted once under the first
    /// reason it is not eligible (see [`RpcWaiting`]). Scans every slot under the lock, so
    /// it is for debugging (an HTTP `/debug/waiting`, say), not for a hot loop.
    pub fn waiting_report(&self) -> Vec<RpcWaiting> {
        let n = self.shared.graph.rpcs().len();
        self.current(|inner| (0..n).map(|r| self.waiting_of(inner, r)).collect())
    }

    /// Why a getter of `rpc` would wait now (one entry of [`Self::waiting_report`]): its
    /// eligible samples against its batch size, then every stored sample under the first
    /// reason it is not eligible, down to the input keys samples lack (the dataflow edge
    /// they wait on). A scan of every slot under the lock: for debugging and for the
    /// warning a long wait logs, not for a hot loop.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownRpc`] for a name not defined.
    pub fn explain(&self, rpc: &str) -> Result<RpcWaiting> {
        let r = self
            .shared
            .graph
            .rpc_index(rpc)
            .ok_or_else(|| Error::UnknownRpc { name: rpc.into() })?;
        Ok(self.current_waiting(r))
    }

    /// How many samples a batch of `rpc` takes (its `n_seqs`), read from its definition
    /// without the lock.
    pub(crate) fn batch_size_of(&self, rpc: &str) -> Result<usize> {
        let graph = &self.shared.graph;
        let r = graph
            .rpc_index(rpc)
            .ok_or_else(|| Error::UnknownRpc { name: rpc.into() })?;
        Ok(graph.rpcs()[r].n_seqs)
    }

    /// Which of `keys` RPC `rpc` does not read.
    pub(crate) fn inputs_missing<'k>(&self, rpc: &str, keys: &[&'k str]) -> Result<Vec<&'k str>> {
        let graph = &self.shared.graph;
        let r = graph
            .rpc_index(rpc)
            .ok_or_else(|| Error::UnknownRpc { name: rpc.into() })?;
        let inputs = graph.rpcs()[r].inputs;
        Ok(keys
            .iter()
            .copied()
            .filter(|k| !graph.key_id(k).is_some_and(|id| inputs.contains(id)))
            .collect())
    }

    /// Whether every stored sample must hold `key`: an RPC reads it and none outputs it,
    /// nor is it declared external (a dataset key).
    pub(crate) fn needs_dataset_key(&self, key: &str) -> bool {
        let graph = &self.shared.graph;
        graph
            .key_id(key)
            .is_some_and(|id| graph.dataset_keys().contains(id))
    }

    /// [`Self::explain`] of RPC index `r`.
    pub(crate) fn current_waiting(&self, r: usize) -> RpcWaiting {
        self.current(|inner| self.waiting_of(inner, r))
    }

    fn waiting_of(&self, inner: &Inner, r: usize) -> RpcWaiting {
        let graph = &self.shared.graph;
        let t = &inner.table;
        let b = t.blockers(r, graph.key_names().count());
        let missing = b
            .missing
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(k, &n)| (graph.key_name(k).to_owned(), n))
            .collect();
        RpcWaiting {
            name: Arc::clone(&graph.rpcs()[r].name),
            batch_size: t.rpcs[r].n_seqs,
            waiting: t.waiting[r],
            eligible: b.eligible,
            leased: b.leased,
            used_up: b.used_up,
            stale: b.stale,
            dropped_stale: t.totals.stale,
            discarded: b.discarded,
            amending: b.amending,
            incomplete: b.incomplete,
            missing,
            rate_limited: b.eligible >= t.rpcs[r].n_seqs
                && rate_stats(t, r).is_some_and(|l| !l.can_sample),
        }
    }

    /// Runs `f` on the buffer's state after releasing expired leases, then wakes whoever
    /// the release let go and frees what it dropped, with the lock released.
    fn current<T>(&self, f: impl FnOnce(&Inner) -> T) -> T {
        let shared = &self.shared;
        let mut freed = Vec::new();
        let (out, wake, dropped) = {
            let mut inner = shared.lock();
            let wake = match inner.table.next_deadline() {
                Some(_) => inner.expire_due(now(), &mut freed),
                None => Default::default(),
            };
            let dropped = inner.take_freed(&freed);
            (f(&inner), wake, dropped)
        };
        shared.notify(wake);
        shared.dispose(dropped);
        out
    }
}

/// RPC `r`'s rate limiter as stats, if it has one.
fn rate_stats(t: &crate::state::SlotTable, r: usize) -> Option<RateLimitStats> {
    let (limiter, can_sample, can_insert) = t.rate_state(r)?;
    Some(RateLimitStats {
        inserts: limiter.inserts,
        samples: limiter.samples,
        can_sample,
        can_insert,
        held_gets: limiter.held_gets,
        held_puts: limiter.held_puts,
    })
}
