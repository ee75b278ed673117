//! `GroupAssembler`: collects rollouts under their group key and seals groups, as a plain
//! synchronous state machine driven by `add(record, now)` and `seal_due(now)`.
//!
//! * A group seals when `target_size` rollouts arrived, or once `seal_timeout` has passed
//!   since its first rollout and at least `min_size` arrived. A group still below
//!   `min_size` at its timeout is dropped (its rollouts counted) or kept waiting, by
//!   [`Undersized`]; a kept group seals as soon as it reaches `min_size`.
//! * A rollout uid names one rollout across the run. A rollout whose uid is pending in its
//!   group or was sealed (or dropped) recently is a duplicate: counted, never stored
//!   twice. "Recently" is the last `remember` rollouts, which bounds memory. A uid pending
//!   or recently gone under another group key is refused as [`Added::UidTaken`] and
//!   counted apart: that is a sender numbering its rollouts per prompt, which would
//!   otherwise lose every group after the first without a sign.
//! * `max_per_replica` caps one replica's share of a group; `accept_policy_versions`
//!   rejects rollouts of other versions. Both are counted.
//! * For a caller whose durable writes can fail: [`GroupAssembler::withdraw`] takes back a
//!   pending rollout that could not be made durable, and [`GroupAssembler::reopen`] puts
//!   back a sealed group that could not be stored; both undo what the rollouts' arrival
//!   did, so that resends are taken as new.
//!
//! Everything is ordered (B-tree maps, a deadline set): the same calls give the same
//! groups, in the same order.

use super::group::{key_tag, GroupKey, GroupMode, SealReason, SealedGroup};
use super::record::{OptionalField, RolloutRecord};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// What happens to a group still below `min_size` when its seal timeout passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Undersized {
    /// Drop it and count its rollouts (slime's and the replay spec's behaviour).
    #[default]
    Drop,
    /// Keep it; it seals as soon as it reaches `min_size`.
    KeepWaiting,
}

/// How rollouts are grouped and when groups seal.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupConfig {
    /// Strict (per policy version) or mixed-policy groups.
    pub mode: GroupMode,
    /// Rollouts per full group (GRPO's K).
    pub target_size: usize,
    /// The fewest rollouts a group may seal with at its timeout.
    pub min_size: usize,
    /// Time from a group's first rollout after which it seals with `min_size`.
    pub seal_timeout: Duration,
    /// What happens to a group below `min_size` at its timeout.
    pub undersized: Undersized,
    /// The most rollouts one replica may contribute to a group.
    pub max_per_replica: Option<usize>,
    /// Only rollouts of these policy versions are accepted (all when `None`).
    pub accept_policy_versions: Option<BTreeSet<u64>>,
    /// How many sealed or dropped rollout uids are remembered to catch late duplicates.
    pub remember: usize,
}

impl GroupConfig {
    /// Strict groups of `target_size`, sealing only when full (`min_size` =
    /// `target_size`, a 30 s timeout that then drops an undersized group), no caps.
    pub fn new(target_size: usize) -> Self {
        Self {
            mode: GroupMode::Strict,
            target_size: target_size.max(1),
            min_size: target_size.max(1),
            seal_timeout: Duration::from_secs(30),
            undersized: Undersized::Drop,
            max_per_replica: None,
            accept_policy_versions: None,
            remember: 1 << 20,
        }
    }

    /// Sets the grouping mode.
    pub fn mode(mut self, mode: GroupMode) -> Self {
        self.mode = mode;
        self
    }

    /// Seal after `timeout` with at least `min_size` rollouts.
    pub fn seal_after(mut self, timeout: Duration, min_size: usize) -> Self {
        self.seal_timeout = timeout;
        self.min_size = min_size.clamp(1, self.target_size);
        self
    }

    /// What happens to an undersized group at its timeout.
    pub fn undersized(mut self, undersized: Undersized) -> Self {
        self.undersized = undersized;
        self
    }

    /// Caps one replica's share of a group.
    pub fn max_per_replica(mut self, n: usize) -> Self {
        self.max_per_replica = Some(n);
        self
    }

    /// Accepts only these policy versions.
    pub fn accept_policy_versions(mut self, versions: impl IntoIterator<Item = u64>) -> Self {
        self.accept_policy_versions = Some(versions.into_iter().collect());
        self
    }
}

/// What became of one added rollout.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Added {
    /// Waiting in its group, which now holds `size` rollouts.
    Pending {
        /// The group key.
        key: GroupKey,
        /// Rollouts in the group now.
        size: usize,
    },
    /// It completed its group.
    Sealed(SealedGroup),
    /// Its uid was seen already, in its own group.
    Duplicate,
    /// Its uid is held by a rollout of another group, pending or recently gone: refused
    /// and counted in [`AssemblerCounters::uid_taken`]. Rollout uids must name rollouts
    /// across the run (a UUID; a resend keeps its rollout's uid), not within a group: a
    /// prompt's id and a number repeats when the prompt is sampled again.
    UidTaken {
        /// The uid.
        uid: String,
    },
    /// Its policy version is not accepted.
    VersionRejected,
    /// Its replica already contributed `max_per_replica` rollouts to the group.
    ReplicaCapped,
    /// It completed a group whose id was already stored or archived (the same rollouts
    /// sent again, after a restart say): the group is not stored twice.
    DuplicateGroup {
        /// The group id.
        id: String,
    },
}

/// Running counts of an assembler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AssemblerCounters {
    /// Rollouts added (those refused as malformed, or for a field they lack, are not).
    pub received: u64,
    /// Rollouts dropped as duplicates.
    pub duplicates: u64,
    /// Rollouts refused because another group's rollout holds their uid
    /// ([`Added::UidTaken`]).
    pub uid_taken: u64,
    /// Rollouts of a version not accepted.
    pub version_rejected: u64,
    /// Rollouts over their replica's cap.
    pub replica_capped: u64,
    /// Groups sealed full.
    pub sealed_full: u64,
    /// Groups sealed at their timeout.
    pub sealed_timeout: u64,
    /// Groups dropped below `min_size` at their timeout.
    pub dropped_groups: u64,
    /// Rollouts in those groups.
    pub dropped_rollouts: u64,
    /// Groups pending now.
    pub pending_groups: u64,
    /// Rollouts pending now.
    pub pending_rollouts: u64,
}

/// One group being assembled.
#[derive(Debug)]
struct Pending {
    rollouts: Vec<RolloutRecord>,
    uids: BTreeSet<String>,
    by_replica: BTreeMap<String, usize>,
    deadline: Instant,
    /// When its first rollout arrived.
    first: Instant,
    /// Its timeout passed while it was below `min_size` (kept waiting).
    overdue: bool,
}

/// What the timer found due.
#[derive(Debug, Default)]
pub struct Due {
    /// Groups sealed at their timeout.
    pub sealed: Vec<SealedGroup>,
    /// Groups dropped below `min_size`, with their rollouts (for the caller to forget
    /// them durably).
    pub dropped: Vec<(GroupKey, Vec<RolloutRecord>)>,
}

/// Collects rollouts into groups (see the module docs).
#[derive(Debug)]
pub struct GroupAssembler {
    config: GroupConfig,
    pending: BTreeMap<GroupKey, Pending>,
    deadlines: BTreeSet<(Instant, GroupKey)>,
    /// The uid of every pending rollout, with the tag of its group's key
    /// ([`key_tag`]): a uid is one rollout's across the groups.
    holders: HashMap<String, u64>,
    /// Uids sealed or dropped, up to `config.remember` of them, each with the number of
    /// its leaving and the tag of its group's key (`None`: remembered from a marker
    /// written before markers held key tags, or through [`Self::remember_gone`]).
    gone: HashMap<String, (u64, Option<u64>)>,
    /// The same, in the order they left, with entries of uids a reopen took back that
    /// their numbers no longer match (skipped when they come up, so a reopen needs no
    /// pass over the window).
    gone_order: VecDeque<(u64, String)>,
    /// The number of the next uid to leave.
    next_gone: u64,
    counters: AssemblerCounters,
    /// Time from first rollout to seal of the last `SEAL_TIMES` groups.
    seal_times: VecDeque<Duration>,
    /// Fields every new rollout must have: its group's store reads them (see
    /// [`Self::require`]).
    required: Vec<OptionalField>,
}

/// How many recent seal times the quantiles are taken over.
const SEAL_TIMES: usize = 1024;

/// The soonest a reopened group seals again at its timeout (see
/// [`GroupAssembler::reopen`]).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

impl GroupAssembler {
    /// An empty assembler.
    pub fn new(config: GroupConfig) -> Self {
        Self {
            config,
            pending: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            holders: HashMap::new(),
            gone: HashMap::new(),
            gone_order: VecDeque::new(),
            next_gone: 0,
            counters: AssemblerCounters::default(),
            seal_times: VecDeque::new(),
            required: Vec::new(),
        }
    }

    /// Refuses, from now on, a new rollout without one of `fields`: its group's store
    /// reads them, and would refuse the whole group when it seals, rollouts answered
    /// pending long before with it. Rollouts added back at a restart are checked too (see
    /// [`Self::add_accepted`]).
    pub(crate) fn require(&mut self, fields: Vec<OptionalField>) {
        self.required = fields;
    }

    /// The configuration.
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// The counts so far.
    pub fn counters(&self) -> AssemblerCounters {
        let mut c = self.counters;
        c.pending_groups = self.pending.len() as u64;
        c.pending_rollouts = self.pending.values().map(|p| p.rollouts.len() as u64).sum();
        c
    }

    /// The median and 99th percentile of the time from a group's first rollout to its
    /// seal, over the last 1,024 groups (`None` before any).
    pub fn seal_time_quantiles(&self) -> Option<(Duration, Duration)> {
        let mut times: Vec<Duration> = self.seal_times.iter().copied().collect();
        if times.is_empty() {
            return None;
        }
        times.sort_unstable();
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        Some((at(0.5), at(0.99)))
    }

    /// The earliest seal deadline of a pending group.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(d, _)| *d)
    }

    /// Every pending rollout, by group key order.
    pub fn pending(&self) -> impl Iterator<Item = &RolloutRecord> {
        self.pending.values().flat_map(|p| p.rollouts.iter())
    }

    /// The rollouts pending in the group `key` (none when no such group is pending).
    pub fn pending_in(&self, key: &GroupKey) -> impl Iterator<Item = &RolloutRecord> {
        self.pending
            .get(key)
            .into_iter()
            .flat_map(|p| p.rollouts.iter())
    }

    /// Adds one rollout arriving at `now`.
    ///
    /// # Errors
    ///
    /// Only [`Error::InvalidRollout`](crate::Error::InvalidRollout), with nothing changed:
    /// for a malformed record, as [`RolloutRecord::validate`] reports it, or one without a
    /// field this assembler requires (see `require`; a group ingestion requires the
    /// fields its buffer reads and no RPC outputs).
    pub fn add(&mut self, record: RolloutRecord, now: Instant) -> Result<Added> {
        self.add_with(record, now, true)
    }

    /// [`Self::add`] of a rollout accepted before (a pending rollout added back at a
    /// restart): the policy versions and the replica cap of this configuration are not
    /// applied to it, as [`Self::reconfigure`] keeps the rollouts it already holds. Its uid
    /// is still checked (a uid a stored group took is a duplicate again), and so are the
    /// required fields (a group holding a rollout without one could not be stored).
    pub(crate) fn add_accepted(&mut self, record: RolloutRecord, now: Instant) -> Result<Added> {
        self.add_with(record, now, false)
    }

    /// [`Self::add`], with the version and replica filters applied only when `filter`.
    fn add_with(&mut self, record: RolloutRecord, now: Instant, filter: bool) -> Result<Added> {
        record.validate()?;
        self.counters.received += 1;
        if let Some(accepted) = self
            .config
            .accept_policy_versions
            .as_ref()
            .filter(|_| filter)
        {
            if !accepted.contains(&record.policy_version) {
                self.counters.version_rejected += 1;
                return Ok(Added::VersionRejected);
            }
        }
        let key = GroupKey::of(&record, self.config.mode);
        let tag = key_tag(&key);
        let owner = match self.gone.get(&record.rollout_uid) {
            Some(&(_, owner)) => Some(owner),
            None => self.holders.get(&record.rollout_uid).map(|&o| Some(o)),
        };
        match owner {
            // A marker of an earlier process names no group: a plain duplicate.
            Some(Some(other)) if other != tag => {
                self.counters.uid_taken += 1;
                return Ok(Added::UidTaken {
                    uid: record.rollout_uid,
                });
            }
            Some(_) => {
                self.counters.duplicates += 1;
                return Ok(Added::Duplicate);
            }
            None => {}
        }
        let (held, mine) = self.pending.get(&key).map_or((false, 0), |g| {
            (
                g.uids.contains(&record.rollout_uid),
                g.by_replica.get(&record.replica_id).copied().unwrap_or(0),
            )
        });
        if held {
            // Its own group holds it (`holders` says so too; checked here as well so
            // that a group never holds one rollout twice).
            self.counters.duplicates += 1;
            return Ok(Added::Duplicate);
        }
        if filter && self.config.max_per_replica.is_some_and(|cap| mine >= cap) {
            self.counters.replica_capped += 1;
            return Ok(Added::ReplicaCapped);
        }
        // Checked last: a resend of a rollout taken before is a duplicate whatever it
        // holds. Refused as malformed, so not counted as received. Also for a rollout
        // accepted before a restart (a log written before this check, or a buffer that
        // reads the field since): added back, it would have sunk its whole group at seal.
        if let Some(field) = self.required.iter().find(|f| !f.is_in(&record)) {
            self.counters.received -= 1;
            return Err(Error::InvalidRollout {
                uid: record.rollout_uid,
                detail: format!(
                    "no `{}`, which the buffer's RPCs read and none outputs: its group could \
                     not be stored",
                    field.key()
                ),
            });
        }
        let group = self.join(&key, record, now);
        let (size, overdue) = (group.rollouts.len(), group.overdue);
        if size >= self.config.target_size {
            return Ok(Added::Sealed(self.seal(&key, SealReason::Full, now)));
        }
        if overdue && size >= self.config.min_size {
            return Ok(Added::Sealed(self.seal(&key, SealReason::Timeout, now)));
        }
        Ok(Added::Pending { key, size })
    }

    /// Takes a pending rollout back out of its group, as if it had never arrived, when its
    /// arrival could not be made durable: the group forgets its uid and its replica's
    /// share (a group left empty goes, with its deadline), and the uid is not remembered,
    /// so a resend is taken as new. `false` when `uid` is not pending under `key` (its
    /// group sealed meanwhile, say).
    pub fn withdraw(&mut self, key: &GroupKey, uid: &str) -> bool {
        let Some(group) = self.pending.get_mut(key) else {
            return false;
        };
        let Some(at) = group.rollouts.iter().position(|r| r.rollout_uid == uid) else {
            return false;
        };
        let record = group.rollouts.remove(at);
        group.uids.remove(uid);
        self.holders.remove(uid);
        self.counters.received = self.counters.received.saturating_sub(1);
        if let Some(n) = group.by_replica.get_mut(&record.replica_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                group.by_replica.remove(&record.replica_id);
            }
        }
        if group.rollouts.is_empty() {
            let deadline = group.deadline;
            self.deadlines.remove(&(deadline, key.clone()));
            self.pending.remove(key);
        }
        true
    }

    /// Puts a sealed group back as pending, when storing it failed for a reason that may
    /// pass (the store unreachable, say): the seal is no longer counted, no uid of the
    /// group is remembered as gone, and its rollouts for which `keep` holds are pending
    /// again (the others are as if they never arrived: their senders were told of the
    /// failure, and their resends complete the group). It seals again when a rollout
    /// completes it, or at its timeout counted from `now` but no sooner than
    /// [`RETRY_AFTER`], so a store that keeps failing is not retried in a loop. If a
    /// group of the same key arrived meanwhile, the two merge; a merge that reaches the
    /// seal condition is due at once. A merge takes every kept rollout, so it can pass
    /// `target_size` or a replica's cap (only when more than a group's worth of one key
    /// arrives while its store fails).
    pub fn reopen(
        &mut self,
        group: SealedGroup,
        keep: impl Fn(&RolloutRecord) -> bool,
        now: Instant,
    ) {
        match group.reason {
            SealReason::Full => {
                self.counters.sealed_full = self.counters.sealed_full.saturating_sub(1)
            }
            SealReason::Timeout => {
                self.counters.sealed_timeout = self.counters.sealed_timeout.saturating_sub(1)
            }
        }
        // The uids leave the remembered window, to come back at its end when the group
        // seals again (their old places in `gone_order` no longer match). A uid another
        // group took since is that group's.
        let key = group.key;
        let tag = key_tag(&key);
        for r in &group.rollouts {
            if self
                .gone
                .get(&r.rollout_uid)
                .is_some_and(|g| g.1 == Some(tag))
            {
                self.gone.remove(&r.rollout_uid);
            }
        }
        let merging = self.pending.contains_key(&key);
        let retry_at =
            crate::deadline::at_most_forever(now, self.config.seal_timeout.max(RETRY_AFTER));
        let (min_size, target_size) = (self.config.min_size, self.config.target_size);
        for record in group.rollouts {
            if !keep(&record) {
                self.counters.received = self.counters.received.saturating_sub(1);
                continue;
            }
            let uid = &record.rollout_uid;
            let elsewhere = self.holders.get(uid).is_some_and(|&other| other != tag)
                || self
                    .gone
                    .get(uid)
                    .is_some_and(|g| g.1.is_some_and(|other| other != tag));
            if elsewhere {
                // Another group took the uid meanwhile (it left the remembered window,
                // or was let go for a resend): it stays that group's.
                self.counters.received = self.counters.received.saturating_sub(1);
                continue;
            }
            self.holders.insert(record.rollout_uid.clone(), tag);
            let pending = self.open_group(&key, now);
            if pending.uids.insert(record.rollout_uid.clone()) {
                *pending
                    .by_replica
                    .entry(record.replica_id.clone())
                    .or_default() += 1;
                pending.rollouts.push(record);
            }
        }
        let Some(pending) = self.pending.get_mut(&key) else {
            return;
        };
        let size = pending.rollouts.len();
        let due = merging && (size >= target_size || (pending.overdue && size >= min_size));
        let deadline = match (due, merging) {
            (true, _) => now,
            (false, false) => retry_at,
            // Merged below the seal condition: the group's own deadline stands.
            (false, true) => return,
        };
        if deadline != pending.deadline || pending.overdue {
            // An overdue group's deadline already left the set.
            self.deadlines.remove(&(pending.deadline, key.clone()));
            pending.deadline = deadline;
            pending.overdue = false;
            self.deadlines.insert((deadline, key));
        }
    }

    /// Puts `record` into the pending group under `key` (opened at `now` if need be), with
    /// its uid and its replica's share; the group.
    fn join(&mut self, key: &GroupKey, record: RolloutRecord, now: Instant) -> &mut Pending {
        self.holders
            .insert(record.rollout_uid.clone(), key_tag(key));
        let group = self.open_group(key, now);
        group.uids.insert(record.rollout_uid.clone());
        *group
            .by_replica
            .entry(record.replica_id.clone())
            .or_default() += 1;
        group.rollouts.push(record);
        group
    }

    /// The pending group under `key`, created with its deadline from `now` if there is
    /// none (or it is empty).
    fn open_group(&mut self, key: &GroupKey, now: Instant) -> &mut Pending {
        let timeout = self.config.seal_timeout;
        let group = self.pending.entry(key.clone()).or_insert_with(|| Pending {
            rollouts: Vec::new(),
            uids: BTreeSet::new(),
            by_replica: BTreeMap::new(),
            // A timeout past FOREVER waits that long.
            deadline: crate::deadline::at_most_forever(now, timeout),
            first: now,
            overdue: false,
        });
        if group.rollouts.is_empty() {
            self.deadlines.insert((group.deadline, key.clone()));
        }
        group
    }

    /// Takes `config` from now on. Every pending rollout is grouped again as if it arrived
    /// at `now`, in its group's order (as a restart adds them back): a group that reaches
    /// the new `target_size` seals (returned), and the seal timeouts start again. Rollouts
    /// already accepted stay, whatever the new caps and versions say, and the remembered
    /// uids stay remembered.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig), with nothing changed, for a
    /// change of grouping mode: the pending groups' keys would change under their callers.
    pub fn reconfigure(&mut self, config: GroupConfig, now: Instant) -> Result<Vec<SealedGroup>> {
        if config.mode != self.config.mode {
            return Err(crate::Error::InvalidConfig {
                detail: format!(
                    "a group assembler's mode cannot change ({:?} to {:?})",
                    self.config.mode, config.mode
                ),
            });
        }
        self.config = config;
        self.deadlines.clear();
        let mut sealed = Vec::new();
        for (key, group) in std::mem::take(&mut self.pending) {
            for record in group.rollouts {
                if self.join(&key, record, now).rollouts.len() >= self.config.target_size {
                    sealed.push(self.seal(&key, SealReason::Full, now));
                }
            }
        }
        // The window of remembered uids takes the new bound at the next seal.
        Ok(sealed)
    }

    /// Seals (or drops) every group whose timeout passed at `now`.
    pub fn seal_due(&mut self, now: Instant) -> Due {
        let mut due = Due::default();
        while let Some((deadline, key)) = self.deadlines.first().cloned() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            let Some(group) = self.pending.get_mut(&key) else {
                continue;
            };
            if group.rollouts.len() >= self.config.min_size {
                // Full only when a reopened group merged with another (see `reopen`).
                let reason = if group.rollouts.len() >= self.config.target_size {
                    SealReason::Full
                } else {
                    SealReason::Timeout
                };
                due.sealed.push(self.seal(&key, reason, now));
                continue;
            }
            match self.config.undersized {
                Undersized::KeepWaiting => group.overdue = true,
                Undersized::Drop => {
                    if let Some(group) = self.pending.remove(&key) {
                        self.counters.dropped_groups += 1;
                        self.counters.dropped_rollouts += group.rollouts.len() as u64;
                        self.release(&group.uids);
                        self.forget(group.uids, Some(key_tag(&key)));
                        due.dropped.push((key, group.rollouts));
                    }
                }
            }
        }
        due
    }

    fn seal(&mut self, key: &GroupKey, reason: SealReason, now: Instant) -> SealedGroup {
        let group = self.pending.remove(key);
        let Some(group) = group else {
            return SealedGroup::new(key.clone(), Vec::new(), reason);
        };
        self.deadlines.remove(&(group.deadline, key.clone()));
        if self.seal_times.len() == SEAL_TIMES {
            self.seal_times.pop_front();
        }
        self.seal_times
            .push_back(now.saturating_duration_since(group.first));
        match reason {
            SealReason::Full => self.counters.sealed_full += 1,
            SealReason::Timeout => self.counters.sealed_timeout += 1,
        }
        self.release(&group.uids);
        self.forget(group.uids, Some(key_tag(key)));
        SealedGroup::new(key.clone(), group.rollouts, reason)
    }

    /// Forgets that `uids` left, so that each is taken as new when it comes again: for a
    /// sealed group the buffer refused for good (a malformed rollout in it), whose senders
    /// are told and may send fixed rollouts under the same uids.
    pub fn let_resend<'a>(&mut self, uids: impl IntoIterator<Item = &'a str>) {
        // Their places in `gone_order` no longer match, and are skipped (as for a reopen).
        for uid in uids {
            self.gone.remove(uid);
        }
    }

    /// Remembers `uids` as gone (sealed and stored before, by an earlier process): a
    /// rollout arriving with one of them is a duplicate, as for a group sealed here. The
    /// same bound applies: the last `remember` uids are kept.
    pub fn remember_gone(&mut self, uids: impl IntoIterator<Item = String>) {
        self.forget(uids, None);
    }

    /// [`Self::remember_gone`] for the uids of a group whose key has the tag `tag`
    /// ([`key_tag`](super::group::key_tag)): one of them arriving for another group is
    /// [`Added::UidTaken`], as before the restart.
    pub fn remember_gone_from(&mut self, uids: impl IntoIterator<Item = String>, tag: u64) {
        self.forget(uids, Some(tag));
    }

    /// The pending group that held `uids` left: they are no longer held.
    fn release(&mut self, uids: &BTreeSet<String>) {
        for uid in uids {
            self.holders.remove(uid);
        }
    }

    /// Remembers uids that left (sealed or dropped) from the group tagged `tag`,
    /// forgetting the oldest beyond the bound.
    fn forget(&mut self, uids: impl IntoIterator<Item = String>, tag: Option<u64>) {
        for uid in uids {
            let n = self.next_gone;
            self.next_gone += 1;
            self.gone.insert(uid.clone(), (n, tag));
            self.gone_order.push_back((n, uid));
        }
        while self.gone.len() > self.config.remember {
            let Some((n, old)) = self.gone_order.pop_front() else {
                break;
            };
            if self.gone.get(&old).is_some_and(|g| g.0 == n) {
                self.gone.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests;
