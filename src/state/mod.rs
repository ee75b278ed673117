//! The slot state machine: which slots are empty, being put, stored, amended or leased,
//! which samples each RPC may take next, and the leases it holds.
//!
//! Everything here is synchronous and free of tokio, payloads and I/O: the buffer calls it
//! with its one lock held and turns the returned [`Wake`] into notifications after dropping
//! the lock. That keeps every transition testable as a plain function (unit tests, proptest
//! against a reference model) and small enough for loom to model.
//!
//! * `table.rs`: [`SlotTable`], its transitions and the written invariants;
//! * `invariants.rs`: `check_invariants()`, the audit of those invariants;
//! * `ready.rs`: per-RPC ready indexes, so no call scans the capacity;
//! * `leases.rs`: live leases and their deadlines;
//! * `mask.rs`: word bitsets for the per-state masks;
//! * `budget.rs`: the byte budget and eviction of the oldest fully-ready samples;
//! * `residency.rs`: the memory budget: resident payload bytes and what to spill next;
//! * `freshness.rs`: policy versions and ages, which make samples stale for an RPC;
//! * `select.rs`: the randomised selection policies (seeded, deterministic).

mod budget;
#[cfg(test)]
mod fresh_tests;
mod freshness;
mod invariants;
mod leases;
mod mask;
mod ready;
mod residency;
#[cfg(test)]
mod residency_tests;
mod select;
mod table;
#[cfg(test)]
mod tests;

pub(crate) use freshness::{Age, Freshness, NO_VERSION};
pub(crate) use leases::LeaseId;
pub(crate) use table::{Exit, LeaseEnd, LeaseGone, RpcSpec, SlotTable, Ticket, Wake};
