//! `Taken`: what [`GroupIngest::add_many`](super::GroupIngest::add_many) does under the
//! assembler's lock, in one pass over its rollouts: the answers, the rollouts left
//! pending and their log entries, the groups sealed, and the uids whose outcome the call
//! decides. Plain data; the caller holds the lock and does the awaiting.

use super::{members, pending_key};
use crate::buffer::AuxWrite;
use crate::error::Result;
use crate::rollout::assembler::{Added, GroupAssembler};
use crate::rollout::group::{GroupKey, SealedGroup};
use crate::rollout::record::RolloutRecord;
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

/// What [`super::GroupIngest::add_many`] does under the assembler's lock.
pub(super) struct Taken {
    /// Per rollout, in input order: its answer, or `None` while its group is to be stored.
    pub(super) answers: Vec<Option<Result<Added>>>,
    /// Rollouts of the call still pending, by uid: their answers.
    pub(super) pending_here: HashMap<String, usize>,
    /// Per group sealed: its answer, the answers of its members from the call, the group.
    pub(super) sealed: Vec<(usize, Vec<usize>, SealedGroup)>,
    /// The pending rollouts' log entries, in input order.
    pub(super) writes: Vec<AuxWrite>,
    /// The uids whose outcome the call decides (see the ingest module's docs).
    pub(super) watched: Vec<String>,
    /// Rollouts whose uid came earlier in the same call (answered `Duplicate`, or
    /// `UidTaken` in another group), with the first copy's place.
    pub(super) repeats: Vec<(usize, usize)>,
    /// The assembler's count of [`Added::UidTaken`] before and after the call, set by the
    /// caller (for its warning, logged after the lock).
    pub(super) uid_taken: (u64, u64),
}

impl Taken {
    /// Adds `records` to `assembler`.
    pub(super) fn add_all(
        assembler: &mut GroupAssembler,
        records: Vec<RolloutRecord>,
        now: Instant,
    ) -> Self {
        let mut answers = Vec::with_capacity(records.len());
        let mut pending_here: HashMap<String, usize> = HashMap::new();
        let mut sealed = Vec::new();
        let mut watched = Vec::new();
        let mut first: HashMap<String, usize> = HashMap::with_capacity(records.len());
        let mut repeats = Vec::new();
        for record in records {
            let uid = record.rollout_uid.clone();
            let at = answers.len();
            match first.get(&uid) {
                Some(&earlier) => repeats.push((at, earlier)),
                None => {
                    first.insert(uid.clone(), at);
                }
            }
            match assembler.add(record, now) {
                Ok(Added::Sealed(group)) => {
                    // Members that came in this call are not logged as pending: the
                    // group's put carries them, and their answers wait for it.
                    let here: Vec<usize> = group
                        .rollouts
                        .iter()
                        .filter_map(|r| pending_here.remove(&r.rollout_uid))
                        .collect();
                    watched.extend(members(&group));
                    sealed.push((at, here, group));
                    answers.push(None);
                }
                Ok(added @ Added::Pending { .. }) => {
                    pending_here.insert(uid, at);
                    answers.push(Some(Ok(added)));
                }
                other => answers.push(Some(other)),
            }
        }
        watched.extend(pending_here.keys().cloned());
        // Only what is still pending is logged, read from the assembler (which holds the
        // records now), in input order. Only the groups this call added to are read: the
        // assembler may hold thousands of other pending rollouts.
        let mut writes: Vec<(usize, AuxWrite)> = if pending_here.is_empty() {
            Vec::new()
        } else {
            // The groups the call's pending rollouts wait in, named by their answers.
            let waiting_in: BTreeSet<&GroupKey> = pending_here
                .values()
                .filter_map(|&at| match answers.get(at) {
                    Some(Some(Ok(Added::Pending { key, .. }))) => Some(key),
                    _ => None,
                })
                .collect();
            waiting_in
                .iter()
                .flat_map(|key| assembler.pending_in(key))
                .filter_map(|r| {
                    let at = *pending_here.get(&r.rollout_uid)?;
                    let key = pending_key(&r.rollout_uid);
                    Some((at, AuxWrite::set(key.clone(), r.to_sample(key))))
                })
                .collect()
        };
        writes.sort_unstable_by_key(|(at, _)| *at);
        Self {
            answers,
            pending_here,
            sealed,
            writes: writes.into_iter().map(|(_, w)| w).collect(),
            watched,
            repeats,
            uid_taken: (0, 0),
        }
    }
}
