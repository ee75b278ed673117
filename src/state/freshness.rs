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

use super::table::{SlotTable, Wake};
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
    by_version: BTreeSet<(u64, u32)>,
    /// Per RPC: versions below this were marked stale already.
    floors: Vec<u64>,
    /// (deadline, slot, generation, rpc) for every age bound still ahead.
    ages: BTreeSet<(Instant, u32, u32, u8)>,
    track_versions: bool,
}

impl FreshnessIndex {
    pub(crate) fn new(capacity: usize, n_rpcs: usize, track_versions: bool) -> Self {
        Self {
            versions: super::table::filled(capacity, NO_VERSION),
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

impl SlotTable {
    /// The current policy version, if set.
    pub(crate) fn policy_version(&self) -> Option<u64> {
        self.freshness.current
    }

    /// Whether a sample of `version` may be put now: `Err(current)` when it is newer than
    /// the current version.
    pub(crate) fn check_version(&self, version: u64) -> Result<(), u64> {
        match self.freshness.current {
            Some(current) if version != NO_VERSION && version > current => Err(current),
            _ => Ok(()),
        }
    }

    /// Moves the current policy version to `version`: samples that fall below an RPC's
    /// staleness window leave its ready index, and those that can no longer be freed are
    /// dropped (appended to `freed`). `Err(current)` for a version older than the current.
    pub(crate) fn set_policy_version(
        &mut self,
        version: u64,
        freed: &mut Vec<u32>,
    ) -> Result<Wake, u64> {
        if let Some(current) = self.freshness.current {
            if version < current {
                return Err(current);
            }
        }
        self.freshness.current = Some(version);
        let mut wake = Wake::default();
        for r in 0..self.rpcs.len() {
            let Some(bound) = self.rpcs[r].max_staleness else {
                continue;
            };
            let floor = version.saturating_sub(bound);
            let from = self.freshness.floors[r];
            if floor <= from {
                continue;
            }
            self.freshness.floors[r] = floor;
            let due: Vec<u32> = self
                .freshness
                .by_version
                .range((from, 0)..(floor, 0))
                .map(|&(_, s)| s)
                .collect();
            for s in due {
                wake.merge(self.mark_stale(s as usize, 1 << r, freed));
            }
        }
        Ok(wake)
    }

    /// Marks every sample whose age bound passed at `now` stale for that RPC; drops those
    /// that can no longer be freed (appended to `freed`).
    pub(crate) fn age_out(&mut self, now: Instant, freed: &mut Vec<u32>) -> Wake {
        let mut wake = Wake::default();
        while let Some(&(deadline, s, generation, r)) = self.freshness.ages.first() {
            if deadline > now {
                break;
            }
            self.freshness.ages.pop_first();
            let s = s as usize;
            if self.is_stored(s) && self.slots[s].generation == generation {
                wake.merge(self.mark_stale(s, 1 << r, freed));
            }
        }
        wake
    }

    /// The stale bits of a sample being stored now, registering what will make it stale
    /// later (its version, its age deadlines).
    pub(crate) fn admit_fresh(&mut self, s: usize, fresh: Freshness, now: Option<Instant>) -> u64 {
        let mut stale = 0u64;
        self.freshness.versions[s] = fresh.version;
        if fresh.version != NO_VERSION && self.freshness.track_versions {
            self.freshness.by_version.insert((fresh.version, s as u32));
        }
        let generation = self.slots[s].generation;
        for (r, rpc) in self.rpcs.iter().enumerate() {
            if let (Some(bound), Some(current)) = (rpc.max_staleness, self.freshness.current) {
                if fresh.version != NO_VERSION && fresh.version < current.saturating_sub(bound) {
                    stale |= 1 << r;
                }
            }
            if let (Some(bound), Some(age)) = (rpc.max_age, fresh.age) {
                let deadline = bound
                    .checked_sub(age.age)
                    .and_then(|left| age.at.checked_add(left));
                match deadline {
                    None if bound <= age.age => stale |= 1 << r,
                    Some(deadline) if now.is_some_and(|now| deadline <= now) => stale |= 1 << r,
                    Some(deadline) => {
                        self.freshness
                            .ages
                            .insert((deadline, s as u32, generation, r as u8));
                    }
                    // Too far ahead to represent: never ages.
                    None => {}
                }
            }
        }
        stale
    }

    /// Forgets a freed slot's version.
    pub(crate) fn forget_fresh(&mut self, s: usize) {
        let version = std::mem::replace(&mut self.freshness.versions[s], NO_VERSION);
        if version != NO_VERSION && self.freshness.track_versions {
            self.freshness.by_version.remove(&(version, s as u32));
        }
    }

    /// Sets stale bits on stored slot `s` and settles it (it leaves those ready indexes,
    /// and is dropped if nothing holds it and an RPC that owes it reads can never serve it).
    fn mark_stale(&mut self, s: usize, bits: u64, freed: &mut Vec<u32>) -> Wake {
        if self.slots[s].stale & bits == bits {
            return Wake::default();
        }
        self.slots[s].stale |= bits;
        self.settle(s, freed)
    }

    /// Whether stored slot `s` is stale for an RPC that still owes it reads.
    pub(crate) fn is_doomed(&self, s: usize) -> bool {
        let stale = self.slots[s].stale;
        if stale == 0 {
            return false;
        }
        let n_rpcs = self.rpcs.len();
        (0..n_rpcs).any(|r| stale & (1 << r) != 0 && self.reads_left[s * n_rpcs + r] > 0)
    }
}
