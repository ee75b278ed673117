//! `Batcher`: trainer batches drawn from several buffers (one per environment type) by
//! token budget, processed by the group hooks and packed.
//!
//! Each source has a target fraction of the batch's tokens (`B * S` for fixed rows, the
//! budget otherwise). Fractions may sum to less than 1: the rest is shared out in
//! proportion to the fractions, so source `e` aims at `T * f_e / sum(f)` tokens. Groups
//! are leased one at a time (each source's RPC must lease one group per call, `n_seqs`
//! 1, as [`Batcher::new`] checks), always from the source furthest below its target
//! relative to it (ties to the earlier source), and a source takes a group only while it
//! is below its target, so it ends within one group of it. The order within a source is its RPC's selection
//! (`Selection::Lifo` for newest first).
//!
//! A source with nothing eligible is waited for up to `wait`; then, by [`Shortfall`], the
//! batch waits on, fills the share from the other sources, or is returned short.
//!
//! Leases are held until the trainer is done: [`GroupBatch::complete`] commits the packed
//! groups and discards the ones the hooks rejected (archived with `reason = filtered`);
//! dropping the batch instead gives every group back. Groups that did not fit are given
//! back at once, except those that can fit in no batch (discarded as too long). A batch
//! of padding alone is never handed out: see [`Batcher::next_batch`].

use super::advantage::Advantage;
use super::hooks::{process_groups, DynamicSampling, GroupHooks, GroupStats, Rejection};
use super::pack::{Packer, Rows, TrainBatch};
use super::train_group::TrainGroup;
use crate::buffer::Batch;
use crate::error::{Error, Result};
use crate::sync::Arc;
use crate::SequenceBuffer;
use std::collections::BTreeMap;
use std::time::Duration;

/// The archive's detail for a leased group the batcher could not read as a group (see
/// [`Batcher::next_batch`]).
pub const UNREADABLE: &str = "unreadable";

/// One environment's buffer and the RPC the trainer reads groups through.
#[derive(Debug, Clone)]
pub struct Source {
    /// The environment (for reports).
    pub name: String,
    /// Its buffer.
    pub buffer: SequenceBuffer,
    /// The trainer's RPC on it (leasing one group per call).
    pub rpc: String,
    /// Its target fraction of a batch's tokens.
    pub fraction: f64,
}

/// What a batch does when a source cannot meet its share within `wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Shortfall {
    /// Give its share to the other sources.
    #[default]
    FillFromOthers,
    /// Keep waiting for it.
    BlockForever,
    /// Return the batch as it is, flagged short.
    ReturnShort,
}

/// How batches are made.
#[derive(Debug, Clone)]
pub struct BatcherConfig {
    /// The packer (rows, row length, padding).
    pub packer: Packer,
    /// The group hooks.
    pub hooks: Arc<dyn GroupHooks>,
    /// The advantage estimator.
    pub advantage: Advantage,
    /// DAPO dynamic sampling, if any.
    pub dynamic: Option<DynamicSampling>,
    /// How long a source below its share is waited for.
    pub wait: Duration,
    /// What happens then.
    pub shortfall: Shortfall,
}

/// A packed batch with the leases of its groups.
#[derive(Debug)]
pub struct GroupBatch {
    /// The tensors.
    pub batch: TrainBatch,
    /// Statistics over the groups taken, before filtering.
    pub stats: GroupStats,
    /// Real tokens per source, in source order.
    pub tokens_by_source: Vec<(String, usize)>,
    /// Groups the hooks rejected, with why (discarded on `complete`).
    pub rejected: Vec<(String, Rejection)>,
    /// Whether a source fell short and the batch was returned as it was.
    pub short: bool,
    /// Packed group id -> the name of its source.
    sources: BTreeMap<String, String>,
    packed: Vec<Batch>,
    discard: Vec<(Batch, Rejection)>,
}

impl GroupBatch {
    /// The name of the source packed group `group_id` came from.
    pub fn source_of(&self, group_id: &str) -> Option<&str> {
        self.sources.get(group_id).map(String::as_str)
    }

    /// The trainer is done with the batch: its groups' reads are used, and the groups the
    /// hooks rejected leave their buffers (archived as filtered).
    ///
    /// # Errors
    ///
    /// Every commit and discard is tried; the first error is returned: a commit's (see
    /// [`Batch::commit`]: [`Error::MissingOutput`], [`Error::LeaseExpired`], and with a
    /// sync journal [`Error::Storage`] or [`Error::Closed`]) or a discard's
    /// ([`Error::LeaseExpired`]).
    ///
    /// # Cancel safety
    ///
    /// Groups are committed one after another. Dropping the future keeps the commits done
    /// (and one a sync journal is writing) and releases the leases not yet committed or
    /// discarded: those groups, rejected ones included, are redelivered.
    pub async fn complete(self) -> Result<()> {
        let mut first_error = None;
        for lease in self.packed {
            if let Err(e) = lease.commit().await {
                first_error.get_or_insert(e);
            }
        }
        for (lease, why) in self.discard {
            if let Err(e) = lease.discard_with_reason(why.as_str()) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Makes trainer batches from several sources (see the module docs).
#[derive(Debug, Clone)]
pub struct Batcher {
    sources: Vec<Source>,
    config: BatcherConfig,
}

/// A leased group and where it came from.
struct Taken {
    source: usize,
    group: TrainGroup,
    lease: Batch,
}

impl Batcher {
    /// A batcher over `sources`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPacking`] for no sources, a negative or non-finite fraction,
    /// fractions that sum to 0, a packer whose batch holds no token (a row length, a
    /// row count or a token budget of 0), or a source whose RPC leases more than one
    /// group per call (`n_seqs` above 1: its getter would wait for that many groups, and
    /// the batch could not use them), or whose RPC does not read every key of
    /// [`GROUP_INPUTS`](super::GROUP_INPUTS). [`Error::UnknownRpc`] for a source's RPC its
    /// buffer does not define.
    pub fn new(sources: Vec<Source>, config: BatcherConfig) -> Result<Self> {
        let bad = |detail: String| Error::InvalidPacking { detail };
        if sources.is_empty() {
            return Err(bad("no sources".into()));
        }
        if batch_tokens(&config.packer) == 0 {
            // No group would ever fit: every call would wait for one forever.
            return Err(bad(format!(
                "the packer's batch holds no token (seq_len {}, rows {:?})",
                config.packer.seq_len, config.packer.rows
            )));
        }
        if let Some(s) = sources
            .iter()
            .find(|s| !s.fraction.is_finite() || s.fraction < 0.0)
        {
            return Err(bad(format!("source `{}`: fraction {}", s.name, s.fraction)));
        }
        if sources.iter().map(|s| s.fraction).sum::<f64>() <= 0.0 {
            return Err(bad("the fractions sum to 0".into()));
        }
        for s in &sources {
            let batch_size = s.buffer.batch_size_of(&s.rpc)?;
            if batch_size != 1 {
                return Err(bad(format!(
                    "source `{}`: RPC `{}` leases {batch_size} groups per call; a batcher \
                     source must lease one (n_seqs 1)",
                    s.name, s.rpc
                )));
            }
            // A group read without these cannot be trained on: every one would be
            // discarded as unreadable.
            let missing = s.buffer.inputs_missing(&s.rpc, &super::GROUP_INPUTS)?;
            if !missing.is_empty() {
                return Err(bad(format!(
                    "source `{}`: RPC `{}` does not read {missing:?}; a batcher source's RPC \
                     reads GROUP_INPUTS (see `trainer_rpc`)",
                    s.name, s.rpc
                )));
            }
        }
        Ok(Self { sources, config })
    }

    /// Leases, processes and packs the next batch.
    ///
    /// # Errors
    ///
    /// Every group the failing pass leased is given back (redelivered) on an error;
    /// groups an earlier pass of the call discarded (below) stay discarded.
    ///
    /// * A source's get errors (see [`SequenceBuffer::get_batch_for_rpc`]):
    ///   [`Error::Closed`], [`Error::UnknownRpc`], and under a memory budget
    ///   [`Error::Storage`] or [`Error::Corrupt`]. A source that times out is a shortfall,
    ///   not an error, unless no source has a group (below).
    /// * [`Error::InvalidPacking`] when a source's RPC leases more than one group at once,
    ///   or the packer's settings are invalid (see [`Packer::pack`]).
    /// * [`Error::Timeout`] when every source is dry and `wait` is zero (there is nothing
    ///   to wait for).
    ///
    /// A batch of padding alone is never returned as a training step: while every source
    /// is dry, the call waits (each source up to `wait` in turn, again and again) until a
    /// group comes, unless the shortfall is [`Shortfall::ReturnShort`], which returns the
    /// empty batch flagged short. A group that cannot fit in a batch even alone (more
    /// tokens than the batch holds, or items the packer cannot place in empty rows) is
    /// rejected as [`Rejection::TooLong`] and discarded on completion, not given back to
    /// come first again. When every group a pass took is rejected (by the hooks, dynamic
    /// sampling or as too long), they are discarded at once and the call goes on; the
    /// batch's `rejected` and `stats` then cover its last pass only (every discard is
    /// counted in the buffer's `stats().filtered` and archived with its reason).
    ///
    /// A leased sample that is not a well-formed group (see [`TrainGroup::read`]) is no
    /// error: it is discarded (archived with `reason = filtered`, detail
    /// [`UNREADABLE`], counted in `stats().filtered`) with a warning, and the batch goes
    /// on without it; given back, it would be leased first and fail every later call.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives back every group its current pass had leased
    /// (redeliveries, as for a dropped [`Batch`]); nothing is used, and only what an
    /// earlier pass rejected is discarded.
    pub async fn next_batch(&self) -> Result<GroupBatch> {
        loop {
            match self.one_pass().await? {
                Some(batch) if batch.packed.is_empty() && !batch.short => {
                    // Every group it took was rejected: discarded now (a failed discard
                    // gives the group back), and the call goes on.
                    if let Err(e) = batch.complete().await {
                        tracing::warn!(error = %e, "discarding rejected groups failed; they are given back");
                    }
                    // A backlog of rejected groups is worked through without a wait in
                    // between: let the runtime's other tasks and timers run.
                    tokio::task::yield_now().await;
                    continue;
                }
                Some(batch) => return Ok(batch),
                None => {}
            }
            if self.config.wait.is_zero() {
                return Err(Error::Timeout {
                    op: "next_batch (every source dry, and a wait of zero)".into(),
                    after: Duration::ZERO,
                    samples: Default::default(),
                });
            }
            // Every source was waited for and stayed dry: wait again.
            tracing::trace!("every batcher source is dry; waiting again");
        }
    }

    /// One pass over the sources: the batch, or `None` when no source had a group (and
    /// the shortfall is not `ReturnShort`).
    async fn one_pass(&self) -> Result<Option<GroupBatch>> {
        let packer = &self.config.packer;
        let s = packer.seq_len;
        let total = batch_tokens(packer);
        let sum: f64 = self.sources.iter().map(|x| x.fraction).sum();
        let mut targets: Vec<f64> = self
            .sources
            .iter()
            .map(|x| total as f64 * x.fraction / sum)
            .collect();
        let mut taken_tokens = vec![0usize; self.sources.len()];
        let mut done = vec![false; self.sources.len()];
        let mut taken: Vec<Taken> = Vec::new();
        let mut used = 0usize;
        let mut short = false;
        // Groups that would not fit even in an empty batch.
        let mut oversized: Vec<Taken> = Vec::new();
        loop {
            // The source furthest below its target, relative to it.
            let next = (0..self.sources.len())
                .filter(|&e| !done[e] && (taken_tokens[e] as f64) < targets[e])
                .min_by(|&a, &b| {
                    let ra = taken_tokens[a] as f64 / targets[a];
                    let rb = taken_tokens[b] as f64 / targets[b];
                    ra.total_cmp(&rb).then(a.cmp(&b))
                });
            let Some(e) = next else { break };
            let source = &self.sources[e];
            let lease = match source.buffer.try_get_batch_for_rpc(&source.rpc)? {
                Some(lease) => Some(lease),
                None => self.wait_for(source).await?,
            };
            let Some(lease) = lease else {
                match self.config.shortfall {
                    Shortfall::ReturnShort => {
                        short = true;
                        break;
                    }
                    _ => {
                        // Its unmet share goes to the others, in proportion.
                        done[e] = true;
                        let open: f64 = (0..self.sources.len())
                            .filter(|&o| !done[o])
                            .map(|o| self.sources[o].fraction)
                            .sum();
                        let unmet = (targets[e] - taken_tokens[e] as f64).max(0.0);
                        targets[e] = taken_tokens[e] as f64;
                        if open > 0.0 {
                            for o in (0..self.sources.len()).filter(|&o| !done[o]) {
                                targets[o] += unmet * self.sources[o].fraction / open;
                            }
                        }
                        continue;
                    }
                }
            };
            let group = match read_group(&lease) {
                Ok(group) => group,
                // A group no trainer can read (a field of another type or length, written
                // by a verifier's complete, say): given back, it would be leased first and
                // fail again at every call. It leaves for the archive, with why.
                Err(e @ Error::InvalidRollout { .. }) => {
                    tracing::warn!(error = %e, "an unreadable group is discarded");
                    if let Err(e) = lease.discard_with_reason(UNREADABLE) {
                        tracing::warn!(error = %e, "discarding an unreadable group failed");
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let tokens: usize = group.items.iter().map(|i| i.len().min(s)).sum();
            if tokens > total {
                // Never fits: given back, it would come first again at every call.
                oversized.push(Taken {
                    source: e,
                    group,
                    lease,
                });
                continue;
            }
            if used + tokens > total {
                // Does not fit: give it back, and this source is done for this batch.
                drop(lease);
                done[e] = true;
                continue;
            }
            used += tokens;
            taken_tokens[e] += tokens;
            taken.push(Taken {
                source: e,
                group,
                lease,
            });
        }
        if taken.is_empty() && oversized.is_empty() && !short {
            // No group at all: a batch of padding alone would be trained on as a step.
            return Ok(None);
        }
        self.finish(taken, oversized, short).map(Some)
    }

    /// Waits up to `wait` (or forever) for a group from `source`.
    async fn wait_for(&self, source: &Source) -> Result<Option<Batch>> {
        if self.config.shortfall == Shortfall::BlockForever {
            return source.buffer.get_batch_for_rpc(&source.rpc).await.map(Some);
        }
        match source
            .buffer
            .get_batch_for_rpc_timeout(&source.rpc, self.config.wait)
            .await
        {
            Ok(lease) => Ok(Some(lease)),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Runs the hooks and the packer over what was taken; sorts the leases into packed,
    /// rejected (discarded on completion) and left over (given back now). `oversized`
    /// groups, and groups left over that not even an empty batch could place, are
    /// rejected as too long: they cannot fit in any batch.
    fn finish(&self, taken: Vec<Taken>, oversized: Vec<Taken>, short: bool) -> Result<GroupBatch> {
        let mut leases: BTreeMap<String, (usize, Batch)> = BTreeMap::new();
        let mut groups = Vec::with_capacity(taken.len());
        for t in taken {
            leases.insert(t.group.id.clone(), (t.source, t.lease));
            groups.push(t.group);
        }
        let processed = process_groups(
            self.config.hooks.as_ref(),
            &self.config.advantage,
            self.config.dynamic,
            groups,
        );
        let packed = self.config.packer.pack(&processed.kept)?;
        let mut tokens_by_source: Vec<(String, usize)> =
            self.sources.iter().map(|s| (s.name.clone(), 0)).collect();
        let mut packed_leases = Vec::new();
        let mut sources = BTreeMap::new();
        for id in &packed.batch.group_ids {
            if let Some((source, lease)) = leases.remove(id) {
                sources.insert(id.clone(), self.sources[source].name.clone());
                let tokens: usize = packed
                    .batch
                    .rows
                    .iter()
                    .flatten()
                    .filter(|seg| &seg.group_id == id)
                    .map(|seg| seg.len)
                    .sum();
                tokens_by_source[source].1 += tokens;
                packed_leases.push(lease);
            }
        }
        let mut discard = Vec::new();
        let mut rejected = Vec::new();
        for &i in &packed.rejected {
            if let Some(group) = processed.kept.get(i) {
                if let Some((_, lease)) = leases.remove(&group.id) {
                    discard.push((lease, Rejection::TooLong));
                }
                rejected.push((group.id.clone(), Rejection::TooLong));
            }
        }
        for (group, why) in processed.rejected {
            if let Some((_, lease)) = leases.remove(&group.id) {
                discard.push((lease, why));
            }
            rejected.push((group.id, why));
        }
        let mut never_fit: Vec<(String, Batch)> = oversized
            .into_iter()
            .map(|t| (t.group.id, t.lease))
            .collect();
        // Left over: from empty rows (nothing packed), with more tokens once processed
        // (padded) than a batch holds, or with sequences no empty batch's rows can place
        // (three of 600 tokens in two rows of 1,000), a group will not fit in any batch
        // either. Given back, it would be leased at every call, take its source's share
        // of the batch and be left over again.
        let packer = &self.config.packer;
        let total = batch_tokens(packer);
        let s = packer.seq_len;
        let nothing_packed = packed.batch.group_ids.is_empty();
        for group in &processed.kept {
            if !leases.contains_key(&group.id) {
                continue;
            }
            let tokens: usize = group.items.iter().map(|i| i.len().min(s)).sum();
            if nothing_packed || tokens > total || !packer.fits_alone(group) {
                if let Some((_, lease)) = leases.remove(&group.id) {
                    never_fit.push((group.id.clone(), lease));
                }
            }
        }
        for (id, lease) in never_fit {
            tracing::warn!(group = %id, "a group cannot fit in any batch; discarded as too long");
            discard.push((lease, Rejection::TooLong));
            rejected.push((id, Rejection::TooLong));
        }
        // What is left did not fit (or was rejected by the packer): given back now.
        drop(leases);
        Ok(GroupBatch {
            batch: packed.batch,
            stats: processed.stats,
            tokens_by_source,
            rejected,
            short,
            sources,
            packed: packed_leases,
            discard,
        })
    }
}

/// The tokens one batch of `packer` holds: rows times their length, or the budget.
fn batch_tokens(packer: &Packer) -> usize {
    match packer.rows {
        Rows::Fixed(b) => b.saturating_mul(packer.seq_len),
        Rows::TokenBudget(t) => t,
    }
}

/// The one group a source lease holds.
fn read_group(lease: &Batch) -> Result<TrainGroup> {
    if lease.len() != 1 {
        return Err(Error::InvalidPacking {
            detail: format!(
                "RPC `{}` leased {} groups at once; a batcher source must lease one (n_seqs 1)",
                lease.rpc_name(),
                lease.len()
            ),
        });
    }
    let view = lease.sample(0).ok_or_else(|| Error::InvalidPacking {
        detail: "an empty lease".into(),
    })?;
    TrainGroup::read(view.id().as_str(), |k| view.get(k), |k| view.get_meta(k))
}
