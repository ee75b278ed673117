//! The RL layer on top of the buffer: what async-RL producers and trainers need besides
//! slots and leases.
//!
//! * `admission.rs`: [`Admission`], AReaL's staleness-bounded admission control for
//!   rollout producers.

mod admission;

pub use admission::{Admission, AdmissionCounters, AdmissionLimits};
