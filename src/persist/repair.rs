//! Salvage: turning a store that strict recovery refuses (a damaged log group that is not
//! the torn tail, a missing group, a damaged checkpoint) into one it opens, losing as
//! little as can be known to be consistent, deleting nothing, and saying what was lost.
//!
//! [`repair`] recovers the newest checkpoint that loads and the log groups after it up to
//! the first one that is damaged, missing or does not apply: everything before the damage.
//! It then moves aside, under `damaged/<n>/` (the same relative paths; `n` one more than
//! any earlier repair), every file recovery would trip on or must no longer apply: that
//! group and every group after it, groups that a moved group declared abandoned (once
//! their declaration is gone they would be applied), manifests newer than the one that
//! loaded, and the segments no remaining manifest names. Moving is a copy then a delete
//! of the original, so a crash part-way leaves a file in both places, never in neither.
//! The report (also written as `damaged/<n>/report.json`) lists every file moved and why,
//! and what the run loses: for the moved log groups that still decode, how many records
//! they held and the ids of the samples they put; for the moved checkpoint segments, the
//! samples, auxiliary entries (pending rollouts, duplicate markers) and unarchived frees
//! they hold that the state kept does not. A damaged group's or segment's contents are
//! unknown, and named as such.
//!
//! Nothing is invented: the state kept is a prefix of the log the run wrote, on top of a
//! checkpoint the run committed; `tests/hostile.rs` checks this over every byte flip,
//! truncation and zeroed tail of every file of a small run.

use super::checkpoint::{self, parse_manifest_path, MANIFEST_DIR, SEGMENT_DIR};
use super::codec::Replayed;
use super::log::{decode_group, Group};
use super::state::{DurableState, Unarchived};
use super::store::Store;
use crate::buffer::Record;
use crate::error::Result;
use crate::SampleId;
use bytes::Bytes;
use serde_json::json;
use std::collections::BTreeSet;

/// Where repairs move files.
const DAMAGED_DIR: &str = "damaged";

/// A file [`repair`] moved aside.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MovedFile {
    /// Its path before, relative to the store.
    pub from: String,
    /// Its path now.
    pub to: String,
    /// Why it was moved.
    pub why: String,
}

/// What [`repair`] did (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepairReport {
    /// The checkpoint recovery now starts from (`None`: the log from its start).
    pub checkpoint: Option<u64>,
    /// Log groups kept and applied after it.
    pub groups_kept: usize,
    /// Every file moved aside, in the order moved.
    pub moved: Vec<MovedFile>,
    /// Records in the moved log groups that still decode.
    pub records_lost: u64,
    /// Ids of the samples put in the moved log groups that still decode, in log order,
    /// then of those moved checkpoint segments hold and the state kept does not.
    pub samples_lost: Vec<String>,
    /// Moved log groups whose contents cannot be read (their records are unknown).
    pub unreadable_groups: Vec<u64>,
    /// Ids of the auxiliary entries (an ingest's pending rollouts and duplicate markers,
    /// say) that moved checkpoint segments hold and the state kept does not.
    pub aux_lost: Vec<String>,
    /// Ids of freed samples whose archive rows were not yet durable, held by moved
    /// checkpoint segments and not by the state kept: their rows will not be archived.
    pub unarchived_lost: Vec<String>,
    /// Moved checkpoint segments that cannot be read (what they held is unknown).
    pub unreadable_segments: Vec<String>,
    /// The folder the files went to, when any did.
    pub folder: Option<String>,
}

impl RepairReport {
    /// Whether the store needed no repair.
    pub fn is_clean(&self) -> bool {
        self.moved.is_empty()
    }

    /// The report as JSON (what `report.json` holds).
    pub fn to_json(&self) -> serde_json::Value {
        let moved: Vec<_> = self
            .moved
            .iter()
            .map(|m| json!({"from": m.from, "to": m.to, "why": m.why}))
            .collect();
        json!({
            "checkpoint": self.checkpoint,
            "groups_kept": self.groups_kept,
            "moved": moved,
            "records_lost": self.records_lost,
            "samples_lost": self.samples_lost,
            "unreadable_groups": self.unreadable_groups,
            "aux_lost": self.aux_lost,
            "unarchived_lost": self.unarchived_lost,
            "unreadable_segments": self.unreadable_segments,
            "folder": self.folder,
        })
    }
}

/// Salvages the store (see the module docs). A store strict recovery opens is left as it is
/// (the report is clean), save for a torn last log group, which strict recovery skips on
/// its own.
///
/// # Errors
///
/// [`Error::Storage`](crate::Error::Storage) when the store cannot be listed, read or
/// written; files moved before the error stay moved (a repair can be run again).
pub async fn repair(store: &Store) -> Result<RepairReport> {
    let loaded = checkpoint::load(store, true).await?;
    let mut report = RepairReport::default();
    let mut to_move: Vec<(String, String)> = Vec::new();
    let (log_from, mut state, named) = match loaded.checkpoint {
        Some((manifest, state)) => {
            report.checkpoint = Some(manifest.number);
            let named: BTreeSet<String> = manifest
                .segments
                .iter()
                .chain(&manifest.aux_segments)
                .chain(&manifest.freed_segments)
                .cloned()
                .collect();
            (manifest.log_from, state, named)
        }
        None => (0, DurableState::default(), BTreeSet::new()),
    };
    // Manifests newer than the one that loaded are damaged; the segments only they named
    // would be deleted as orphans by the next checkpoint, so they go with them.
    let mut newer = Vec::new();
    for path in store.list(MANIFEST_DIR).await? {
        let number = parse_manifest_path(&path);
        if number.is_some_and(|n| report.checkpoint.is_none_or(|loaded| n > loaded)) {
            newer.push(path);
        }
    }
    if !newer.is_empty() {
        for path in newer {
            to_move.push((path, "a checkpoint that does not load".into()));
        }
        for path in store.list(SEGMENT_DIR).await? {
            if !named.contains(&path) {
                to_move.push((path, "a segment the checkpoint kept does not name".into()));
            }
        }
    }
    let mut seen = Seen::default();
    let cut = replay_until_damage(
        store,
        log_from,
        &mut state,
        &mut seen,
        &mut report,
        &mut to_move,
    )
    .await?;
    tracing::debug!(?cut, "repair: log cut");
    if to_move.is_empty() {
        return Ok(report);
    }
    // What the kept state holds, or still archives, is accounted for too.
    seen.samples.extend(
        state
            .unarchived
            .iter()
            .map(|u| (u.entry.id.to_string(), u.entry.seq)),
    );
    for (path, _) in &to_move {
        if path.starts_with(SEGMENT_DIR) {
            count_segment_losses(store, path, &state, &seen, &mut report).await?;
        }
    }
    dedup_in_order(&mut report.samples_lost);
    let folder = next_folder(store).await?;
    for (from, why) in to_move {
        let to = format!("{folder}/{from}");
        if let Some(bytes) = store.get(&from).await? {
            store.put(&to, bytes).await?;
            store.delete(&from).await?;
        }
        report.moved.push(MovedFile { from, to, why });
    }
    let json = Bytes::from(report_json(&report, &folder));
    store.put(&format!("{folder}/report.json"), json).await?;
    report.folder = Some(folder);
    tracing::warn!(
        moved = report.moved.len(),
        records_lost = report.records_lost,
        samples_lost = report.samples_lost.len(),
        aux_lost = report.aux_lost.len(),
        unarchived_lost = report.unarchived_lost.len(),
        unreadable_groups = report.unreadable_groups.len(),
        "store repaired: damaged files moved aside"
    );
    Ok(report)
}

fn report_json(report: &RepairReport, folder: &str) -> String {
    let mut value = report.to_json();
    value["folder"] = json!(folder);
    value.to_string()
}

/// `damaged/<n>` with `n` above every earlier repair's.
async fn next_folder(store: &Store) -> Result<String> {
    let highest = store
        .list(DAMAGED_DIR)
        .await?
        .iter()
        .filter_map(|p| {
            p.strip_prefix(DAMAGED_DIR)?
                .strip_prefix('/')?
                .split('/')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max();
    Ok(format!("{DAMAGED_DIR}/{}", highest.map_or(0, |n| n + 1)))
}

/// Applies the log groups from `log_from` on until the first that is missing, damaged (and
/// not the last: a torn tail is skipped by recovery itself) or does not apply; queues that
/// group, every later one, and the abandoned groups the moved ones declared, for moving.
/// Returns the sequence number of the cut, if any.
async fn replay_until_damage(
    store: &Store,
    log_from: u64,
    state: &mut DurableState,
    seen: &mut Seen,
    report: &mut RepairReport,
    to_move: &mut Vec<(String, String)>,
) -> Result<Option<u64>> {
    let files = checkpoint::log_files(store, log_from).await?;
    let mut groups: Vec<(u64, String, std::result::Result<Group, String>)> = Vec::new();
    for (seq, path) in files {
        let decoded = match store.get(&path).await? {
            Some(bytes) => decode_group(&bytes),
            None => continue,
        };
        groups.push((seq, path, decoded));
    }
    let declared = |groups: &[(u64, String, std::result::Result<Group, String>)]| {
        groups
            .iter()
            .filter_map(|(_, _, g)| g.as_ref().ok())
            .flat_map(|g| g.abandoned.iter().copied())
            .collect::<BTreeSet<u64>>()
    };
    let abandoned = declared(&groups);
    let last = groups.last().map(|g| g.0);
    let mut expected = log_from;
    let mut cut = None;
    for (i, (seq, _, decoded)) in groups.iter().enumerate() {
        let gap = (expected..*seq).any(|s| !abandoned.contains(&s));
        expected = seq + 1;
        if gap {
            cut = Some(i);
            break;
        }
        if abandoned.contains(seq) {
            continue;
        }
        let applies = match decoded {
            Ok(group) => {
                // Noted apart and kept only if the whole group applies: a group that fails
                // partway is moved, and what it named is then not the kept log's.
                let mut noted = Seen::default();
                let applied = group.records.iter().try_for_each(|r| {
                    noted.before(r, state);
                    state.apply(r)?;
                    noted.after(r, state);
                    Ok::<(), String>(())
                });
                if applied.is_ok() {
                    seen.samples.extend(noted.samples);
                    seen.aux.extend(noted.aux);
                }
                applied.is_ok()
            }
            Err(_) => Some(*seq) == last,
        };
        if !applies {
            cut = Some(i);
            break;
        }
        report.groups_kept += usize::from(decoded.is_ok());
    }
    let Some(cut) = cut else {
        return Ok(None);
    };
    let (kept, moved) = groups.split_at(cut);
    // A group the kept log no longer declares abandoned must not come back to life.
    let still_declared = declared(kept);
    for (seq, path, _) in kept {
        if abandoned.contains(seq) && !still_declared.contains(seq) {
            to_move.push((
                path.clone(),
                "abandoned by a log group that was moved".into(),
            ));
        }
    }
    for (n, (seq, path, decoded)) in moved.iter().enumerate() {
        let why = match (n, decoded) {
            (0, Err(detail)) => format!("damaged: {detail}"),
            (0, Ok(_)) => "does not apply, or follows a missing group".to_owned(),
            _ => "after the damaged group".to_owned(),
        };
        match decoded {
            Ok(group) => {
                report.records_lost += group.records.len() as u64;
                for record in &group.records {
                    let ids = put_ids(record).into_iter().map(ToString::to_string);
                    report.samples_lost.extend(ids);
                }
            }
            Err(_) => report.unreadable_groups.push(*seq),
        }
        to_move.push((path.clone(), why));
    }
    Ok(moved.first().map(|g| g.0))
}

/// What the kept log groups account for: each sample incarnation (id and put sequence)
/// they put, free or archive, and each auxiliary key they write. A moved checkpoint's entry
/// of one of these lost nothing: its fate is the kept log's. An id put again later is
/// another incarnation, so a moved checkpoint holding that one is still reported.
#[derive(Debug, Default)]
struct Seen {
    samples: std::collections::HashSet<(String, u64)>,
    aux: std::collections::HashSet<String>,
}

impl Seen {
    /// Before `record` applies to `state`: the incarnations it frees or archives (looked
    /// up while `state` still has them) and the keys it writes.
    fn before(&mut self, record: &Replayed, state: &DurableState) {
        match record {
            Replayed::Other(Record::Free { ids, .. }) => {
                for id in ids {
                    if let Some(e) = state.entry(id) {
                        self.samples.insert((id.to_string(), e.seq));
                    }
                }
            }
            Replayed::Other(Record::Archiving { ids, .. }) => {
                let ids: std::collections::HashSet<&SampleId> = ids.iter().collect();
                self.note_unarchived(state, |u| ids.contains(&u.entry.id));
            }
            Replayed::Other(Record::Archived { batch }) => {
                self.note_unarchived(state, |u| u.batch == Some(*batch));
            }
            Replayed::Other(Record::Aux(writes)) => {
                self.aux.extend(writes.iter().map(|w| w.key.to_string()));
            }
            _ => {}
        }
    }

    /// After `record` applied: the incarnations it put.
    fn after(&mut self, record: &Replayed, state: &DurableState) {
        for id in put_ids(record) {
            if let Some(e) = state.entry(id) {
                self.samples.insert((id.to_string(), e.seq));
            }
        }
    }

    fn note_unarchived(&mut self, state: &DurableState, which: impl Fn(&Unarchived) -> bool) {
        for u in state.unarchived.iter().filter(|u| which(u)) {
            self.samples.insert((u.entry.id.to_string(), u.entry.seq));
        }
    }
}

/// Adds to `report` what the moved checkpoint segment `path` holds that neither the kept
/// `state` nor the kept log (`seen`) accounts for: a newer checkpoint's samples, pending
/// entries and unarchived frees whose log groups were deleted once it landed.
async fn count_segment_losses(
    store: &Store,
    path: &str,
    state: &DurableState,
    seen: &Seen,
    report: &mut RepairReport,
) -> Result<()> {
    let Some(bytes) = store.get(path).await? else {
        return Ok(());
    };
    // As recovery decodes segments: a bad file is an unreadable segment, not a panic.
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        checkpoint::decode_segment(bytes)
    }));
    let Ok(Ok(entries)) = decoded else {
        report.unreadable_segments.push(path.to_owned());
        return Ok(());
    };
    let name = path.rsplit('/').next().unwrap_or(path);
    for (entry, _) in entries {
        let id = entry.id.to_string();
        if name.starts_with("aux-") {
            if !state.aux.contains_key(entry.id.as_str()) && !seen.aux.contains(&id) {
                report.aux_lost.push(id);
            }
        } else if seen.samples.contains(&(id.clone(), entry.seq))
            || state.entry(&entry.id).is_some_and(|e| e.seq == entry.seq)
        {
            continue;
        } else if name.starts_with("freed-") {
            report.unarchived_lost.push(id);
        } else {
            report.samples_lost.push(id);
        }
    }
    Ok(())
}

/// Drops repeats from `ids`, keeping each id's first place.
fn dedup_in_order(ids: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(id.clone()));
}

/// The ids of the samples `record` puts.
fn put_ids(record: &Replayed) -> Vec<&SampleId> {
    match record {
        Replayed::Put(samples) => samples.iter().map(|s| &s.id).collect(),
        Replayed::Other(Record::Put(samples)) => samples.iter().map(|s| s.id()).collect(),
        Replayed::Other(_) => Vec::new(),
    }
}
