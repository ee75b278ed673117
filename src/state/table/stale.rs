//! The freshness transitions of [`SlotTable`]: moving the policy version, ageing samples
//! out, and marking them stale (sticky until freed). The index they act on, and the rules,
//! are in `state/freshness.rs`.

use super::SlotTable;
use crate::rpc_defs::RpcSet;
use crate::state::freshness::{Freshness, NO_VERSION};
use crate::state::slot::Wake;
use std::time::Instant;

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
                wake.merge(self.mark_stale(s as usize, RpcSet::one(r), freed));
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
            if self.is_stored(s) && self.slots[s].generation.get() == generation {
                wake.merge(self.mark_stale(s, RpcSet::one(usize::from(r)), freed));
            }
        }
        wake
    }

    /// The stale bits of a sample being stored now, registering what will make it stale
    /// later (its version, its age deadlines).
    pub(crate) fn admit_fresh(
        &mut self,
        s: usize,
        fresh: Freshness,
        now: Option<Instant>,
    ) -> RpcSet {
        let mut stale = RpcSet::EMPTY;
        self.freshness.versions[s] = fresh.version;
        if fresh.version != NO_VERSION && self.freshness.track_versions {
            self.freshness.by_version.insert((fresh.version, s as u32));
        }
        let generation = self.slots[s].generation.get();
        for (r, rpc) in self.rpcs.iter().enumerate() {
            if let (Some(bound), Some(current)) = (rpc.max_staleness, self.freshness.current) {
                if fresh.version != NO_VERSION && fresh.version < current.saturating_sub(bound) {
                    stale.insert(r);
                }
            }
            if let (Some(bound), Some(age)) = (rpc.max_age, fresh.age) {
                let deadline = bound
                    .checked_sub(age.age)
                    .and_then(|left| crate::deadline::after(age.at, left));
                match deadline {
                    None if bound <= age.age => stale.insert(r),
                    Some(deadline) if now.is_some_and(|now| deadline <= now) => stale.insert(r),
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

    /// Audits invariant 10 (see `mod.rs`).
    pub(crate) fn check_versions(&self) -> Result<(), String> {
        let f = &self.freshness;
        let mut versioned = 0usize;
        for (s, &version) in f.versions.iter().enumerate() {
            if version == NO_VERSION {
                continue;
            }
            if !self.is_stored(s) {
                return Err(format!("slot {s}: not stored but has version {version}"));
            }
            if f.track_versions {
                if !f.by_version.contains(&(version, s as u32)) {
                    return Err(format!(
                        "slot {s}: version {version} missing from the version index"
                    ));
                }
                versioned += 1;
            }
        }
        if f.by_version.len() != versioned {
            return Err(format!(
                "{} entries in the version index, for {versioned} versioned stored slots",
                f.by_version.len()
            ));
        }
        Ok(())
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
    fn mark_stale(&mut self, s: usize, rpcs: RpcSet, freed: &mut Vec<u32>) -> Wake {
        if self.slots[s].stale.union(rpcs) == self.slots[s].stale {
            return Wake::default();
        }
        self.slots[s].stale = self.slots[s].stale.union(rpcs);
        self.settle(s, freed)
    }

    /// Whether stored slot `s` is stale for an RPC that still owes it reads.
    pub(crate) fn is_doomed(&self, s: usize) -> bool {
        let stale = self.slots[s].stale;
        if stale.is_empty() {
            return false;
        }
        let n_rpcs = self.rpcs.len();
        (0..n_rpcs).any(|r| stale.contains(r) && self.reads_left[s * n_rpcs + r] > 0)
    }
}
