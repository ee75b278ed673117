//! The slot state machine: which slots are empty, being put, stored, amended or leased,
//! which samples each RPC may take next, and the leases it holds.
//!
//! Everything here is synchronous and free of tokio, payloads and I/O: the buffer calls it
//! with its one lock held and turns the returned [`Wake`] into notifications after dropping
//! the lock. That keeps every transition testable as a plain function (unit tests, proptest
//! against a reference model) and small enough for loom to model.
//!
//! Files, lowest first (each imports only the ones above it in this list):
//!
//! * `prefetch.rs`: the cache-line prefetch hint of the batch-wide passes;
//! * `mask.rs`: word bitsets for the per-state masks;
//! * `select.rs`: the randomised selection policies (seeded, deterministic);
//! * `ranked/`: an ordered index with O(log n) lookup by age rank and by weight, for
//!   randomised selection;
//! * `ready.rs`: per-RPC ready indexes, so no call scans the capacity;
//! * `slot.rs`: per-slot metadata, generations, [`Wake`] and the other words transitions
//!   speak;
//! * `leases.rs`: live leases and their deadlines;
//! * `budget.rs`: the byte budget's bookkeeping and its eviction rule;
//! * `residency.rs`: the memory budget's bookkeeping (resident bytes, the spill index);
//! * `freshness.rs`: policy versions and ages, which make samples stale for an RPC;
//! * `rate.rs`: per-RPC rate limiters (Reverb's samples-per-insert ratio);
//! * `table/`: [`SlotTable`], its transitions, its written invariants and their audit.

mod budget;
mod freshness;
mod leases;
mod mask;
pub(crate) mod prefetch;
mod ranked;
mod rate;
mod ready;
mod residency;
mod select;
mod slot;
mod table;
#[cfg(test)]
mod tests;

pub(crate) use freshness::{Age, Freshness, NO_VERSION};
pub(crate) use leases::LeaseId;
pub(crate) use slot::{Generation, LeaseEnd, LeaseGone, RpcSpec, Ticket, Wake};
pub(crate) use table::SlotTable;
