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
//! * `admission.rs`: [`Admission`], AReaL's staleness-bounded admission control for
//!   rollout producers.

mod admission;
mod assembler;
mod group;
#[cfg(not(rollout_buffer_loom))]
mod ingest;
mod record;

pub use admission::{Admission, AdmissionCounters, AdmissionLimits};
pub use assembler::{Added, AssemblerCounters, Due, GroupAssembler, GroupConfig, Undersized};
pub use group::{group_id, GroupKey, GroupMode, SealReason, SealedGroup};
#[cfg(not(rollout_buffer_loom))]
pub use ingest::{GroupIngest, IngestCounters};
pub use record::RolloutRecord;
