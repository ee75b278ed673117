//! The RL layer on top of the buffer: what async-RL producers and trainers need besides
//! slots and leases.
//!
//! * `record.rs`: [`RolloutRecord`], one rollout with its provenance;
//! * `group.rs`: [`GroupKey`], the stable [`group_id`], and a [`SealedGroup`]'s form as one
//!   buffer sample;
//! * `assembler.rs`: [`GroupAssembler`], which collects rollouts into groups and seals
//!   them (size, timeout, dedupe, per-replica caps, version filter);
//! * `ingest.rs`: [`GroupIngest`], the assembler in front of a buffer: sealed groups are
//!   stored, pending rollouts are durable, and groups are never stored twice;
//! * `train_group.rs`: [`TrainGroup`], a stored group read back for training;
//! * `advantage.rs`: [`Advantage`] (RLOO, GRPO, custom);
//! * `hooks.rs`: [`GroupHooks`] with slime's defaults, DAPO's dynamic sampling, and
//!   [`process_groups`], which applies them in order;
//! * `pack.rs`: [`Packer`], groups into `[B, S]` [`TrainBatch`] tensors (first-fit
//!   decreasing, whole groups);
//! * `batcher.rs`: [`Batcher`], trainer batches from several buffers by token shares,
//!   through the hooks and the packer, holding leases until the trainer is done;
//! * `metrics.rs`: [`EnvMetrics`] per environment, as a struct and through the `metrics`
//!   facade;
//! * `admission.rs`: [`Admission`], AReaL's staleness-bounded admission control for
//!   rollout producers.

mod admission;
mod advantage;
mod assembler;
#[cfg(not(rollout_buffer_loom))]
mod batcher;
mod group;
mod hooks;
#[cfg(not(rollout_buffer_loom))]
mod ingest;
#[cfg(not(rollout_buffer_loom))]
mod metrics;
mod pack;
mod record;
mod train_group;

pub use admission::{Admission, AdmissionCounters, AdmissionLimits};
pub use advantage::{mean_std, Advantage, AdvantageFn};
pub use assembler::{
    Added, AssemblerCounters, Due, GroupAssembler, GroupConfig, Undersized, RETRY_AFTER,
};
#[cfg(not(rollout_buffer_loom))]
pub use batcher::{Batcher, BatcherConfig, GroupBatch, Shortfall, Source, UNREADABLE};
pub use group::{group_id, key_tag, GroupKey, GroupMode, SealReason, SealedGroup};
pub use hooks::{
    items_kept, process_groups, DynamicSampling, GroupHooks, GroupStats, Processed, Rejection,
    SlimeHooks, Validity,
};
#[cfg(not(rollout_buffer_loom))]
pub use ingest::{GroupIngest, IngestCounters};
#[cfg(not(rollout_buffer_loom))]
pub use metrics::{EnvMetrics, MetricsTracker};
pub use pack::{Overlong, Packed, Packer, Rows, Segment, TrainBatch};
pub use record::RolloutRecord;
pub use train_group::{trainer_rpc, TrainGroup, TrainItem, GROUP_INPUTS};
