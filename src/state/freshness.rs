//! Freshness: the policy version and age rules that make a stored sample stale for an RPC.
//!
//! A sample carries a policy version (or none) and may carry a creation instant. RPC `r`
//! with a staleness bound `s_r` may serve it only while `version >= current - s_r`; with an
//! age bound `a_r`, only before `created + a_r`. Both only ever move one way (versions only
//! grow, time only passes), so staleness is sticky: bit `r` of the slot's `stale` word,
//! once set, stays set until the slot is freed. That keeps the work proportional to the
//! samples that go stale, never to the capacity:
//!
//! * `by_version` orders the versioned samples, so raising the version visits exactly the
//!   samples that fall below each RPC's new floor;
//! * `ages` orders (deadline, slot) pairs, so the clock visits exactly the samples whose
//!   age passed a bound. Entries of freed slots are left behind and skipped by generation
//!   when they come due.
//!
//! A stale sample leaves the ready index of that RPC (invariant 5). When it is stale for an
//! RPC that still owes it reads, it could never be freed by reads alone, so `settle` drops
//! it (exit `Stale`) as soon as no lease or amend holds it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The version of a sample that has none: never stale by version, never "current".
pub(crate) const NO_VERSION: u64 = u64::MAX;

/// What a put tells freshness about one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Freshness {
    /// Policy version, or [`NO_VERSION`].
    pub(crate) version: u64,
    /// The sample's age, and when it was measured (`None`: never ages).
    pub(crate) age: Option<Age>,
}

/// A sample's age `age` at instant `at` of the buffer's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Age {
    pub(crate) at: Instant,
    pub(crate) age: Duration,
}

impl Default for Freshness {
    fn default() -> Self {
        Self {
            version: NO_VERSION,
            age: None,
        }
    }
}

/// The table's freshness bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct FreshnessIndex {
    /// The current policy version; `None` until first set (nothing is stale by version and
    /// no version is "from the future" before that).
    pub(crate) current: Option<u64>,
    /// Per slot: the stored sample's version.
    pub(crate) versions: Vec<u64>,
    /// Versioned stored samples, when some RPC has a staleness bound.
    pub(super) by_version: BTreeSet<(u64, u32)>,
    /// Per RPC: versions below this were marked stale already.
    pub(super) floors: Vec<u64>,
    /// (deadline, slot, generation, rpc) for every age bound still ahead.
    pub(super) ages: BTreeSet<(Instant, u32, u32, u8)>,
    pub(super) track_versions: bool,
}

impl FreshnessIndex {
    pub(crate) fn new(capacity: usize, n_rpcs: usize, track_versions: bool) -> Self {
        Self {
            versions: super::mask::filled(capacity, NO_VERSION),
            floors: vec![0; n_rpcs],
            track_versions,
            ..Self::default()
        }
    }

    /// The earliest age deadline still ahead (some may belong to freed slots).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.ages.first().map(|e| e.0)
    }
}
