//! `DurableState`: the buffer's contents as the stored files describe them.
//!
//! Recovery builds one from the newest checkpoint's segments and replays the log after it;
//! `open` restores it into a buffer, and a checkpoint writes it out as the next segments.
//! It knows nothing of slots or leases: a sample, the reads each RPC (by name) has used,
//! and its put order. Whether a sample still has reads left is decided when it is
//! restored, against the RPC definitions of the buffer being opened.
//!
//! A sample stays in its encoded form until something needs its fields (an amend or a
//! completion to apply, a buffer to restore it into): a checkpoint mostly moves samples
//! from the log into a segment, and copying their bytes costs a fraction of decoding them.

use super::codec::{put_sample, take_sample, Bad, Reader, Replayed, Writer};
use crate::buffer::{strike, Record, Restored, SpillPart};
use crate::exit::ExitReason;
use crate::sample::{Patch, PrehashedId, Sample, SampleId};
use crate::sync::Arc;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;

/// A sample's fields: still encoded, or decoded.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    Encoded(Bytes),
    Decoded(Arc<Sample>),
}

/// One stored sample.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Put order (ties between equal births are served in this order).
    pub(crate) seq: u64,
    pub(crate) id: SampleId,
    pub(crate) birth: u64,
    pub(crate) body: Body,
    /// Reads used, per RPC name.
    pub(crate) used: BTreeMap<Arc<str>, u16>,
    /// Fields held in spill segments instead of `body` (which is then the stub).
    pub(crate) spilled: Vec<SpillPart>,
}

impl Entry {
    /// The sample, decoding it on first use.
    pub(crate) fn sample(&mut self) -> Result<&mut Arc<Sample>, Bad> {
        if let Body::Encoded(bytes) = &self.body {
            let sample = take_sample(&mut Reader::new(bytes))
                .map_err(|e| format!("sample `{}`: {e}", self.id))?;
            self.body = Body::Decoded(Arc::new(sample));
        }
        match &mut self.body {
            Body::Decoded(sample) => Ok(sample),
            Body::Encoded(_) => Err("undecodable".into()),
        }
    }

    /// Applies a patch: to the stub of a spilled sample, whose patched keys then leave the
    /// spilled list (as the buffer does).
    fn patch(&mut self, patch: &Patch) -> Result<(), Bad> {
        Arc::make_mut(self.sample()?).apply(patch);
        if !self.spilled.is_empty() {
            let keys: Vec<&str> = patch.keys().collect();
            strike(&mut self.spilled, &keys);
        }
        Ok(())
    }

    /// Moves the fields `part` lists out of the sample into a spill segment, or (`replaces`)
    /// points the part in segment `replaces` at its rewritten copy.
    fn spill(&mut self, part: &SpillPart, replaces: Option<u64>) -> Result<(), Bad> {
        if let Some(old) = replaces {
            if let Some(p) = self.spilled.iter_mut().find(|p| p.segment == old) {
                p.segment = part.segment;
                p.segment_rows = part.segment_rows;
                p.row = part.row;
            }
            return Ok(());
        }
        let sample = Arc::make_mut(self.sample()?);
        let keys: Vec<&str> = part.fields.iter().map(|(k, _)| k.as_str()).collect();
        sample.fields = sample.fields.filtered(|k| !keys.contains(&k));
        self.spilled.push(part.clone());
        Ok(())
    }

    /// About how many bytes [`Self::encode_sample`] appends (exact for a sample still
    /// encoded; its fields' bytes for a decoded one).
    pub(crate) fn encoded_len_hint(&self) -> usize {
        match &self.body {
            Body::Encoded(bytes) => bytes.len(),
            Body::Decoded(sample) => sample.fields().map(|(_, t)| t.nbytes()).sum(),
        }
    }

    /// Appends the sample's encoding (the same bytes `put_sample` writes).
    pub(crate) fn encode_sample(&self, w: &mut Writer) {
        match &self.body {
            Body::Encoded(bytes) => w.buf.extend_from_slice(bytes),
            Body::Decoded(sample) => put_sample(w, sample),
        }
    }
}

/// A sample that left the buffer whose archive row is not known to be on storage yet
/// (kept only when the store is archived): recovery hands it to the archiver again.
#[derive(Debug, Clone)]
pub(crate) struct Unarchived {
    /// The sample as it left (every amend and output applied).
    pub(crate) entry: Entry,
    pub(crate) reason: ExitReason,
    /// The archive batch the archiver logged it in (`Archiving`), once it has: recovery
    /// writes that batch again under the same names, so a batch that did land is replaced,
    /// not duplicated.
    pub(crate) batch: Option<u64>,
}

/// A sample waiting for the archive, handed to the archiver at open: the sample (a stub
/// when it spilled), where its spilled fields are, why it left, its logged batch.
pub(crate) type Waiting = (Arc<Sample>, Vec<SpillPart>, ExitReason, Option<u64>);

/// Running totals per RPC name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RpcTotals {
    pub(crate) reads: u64,
    pub(crate) redelivered: u64,
    pub(crate) expired_leases: u64,
}

/// The contents and totals the stored files describe.
///
/// Entries live in a vector in put order (a freed one leaves a `None`), with an id index
/// beside it: recovery appends far more than it looks up, and everything that walks the
/// state (decoding, restoring, checkpointing) walks it in put order, which is also the
/// order its bytes were read in.
#[derive(Debug, Clone, Default)]
pub(crate) struct DurableState {
    entries: Vec<Option<Entry>>,
    index: HashMap<SampleId, usize, BuildHasherDefault<PrehashedId>>,
    pub(crate) next_seq: u64,
    pub(crate) put: u64,
    pub(crate) freed: u64,
    pub(crate) rpcs: BTreeMap<Arc<str>, RpcTotals>,
    /// Records that named a sample the state does not hold (only after a damaged log was
    /// skipped under lenient recovery).
    pub(crate) unmatched: u64,
    /// Auxiliary entries by key (the entry's id is its key; birth and seq are unused).
    pub(crate) aux: BTreeMap<Arc<str>, Entry>,
    /// Whether freed samples are kept until archived (the store has an archive).
    pub(crate) archiving: bool,
    /// Freed samples whose archive rows are not durable yet, in the order they left.
    pub(crate) unarchived: Vec<Unarchived>,
    /// The number the archiver's next batch takes.
    pub(crate) next_archive_batch: u64,
    /// Samples `restored` found consumed without a logged free.
    pub(crate) settled_on_restore: usize,
}

impl DurableState {
    /// The entry held under `id`, if any.
    pub(crate) fn entry(&self, id: &SampleId) -> Option<&Entry> {
        let at = *self.index.get(id)?;
        self.entries.get(at)?.as_ref()
    }

    /// Adds an entry after every other (a later seq); replaces one with the same id.
    pub(crate) fn push(&mut self, entry: Entry) {
        // Freed entries leave holes; the log writer's image lives as long as its buffer, so
        // they are squeezed out once they outnumber the live ones (amortised O(1) a push).
        if self.entries.len() >= 2 * self.index.len() + 4096 {
            self.compact();
        }
        if let Some(old) = self.index.insert(entry.id.clone(), self.entries.len()) {
            self.entries[old] = None;
        }
        self.entries.push(Some(entry));
    }

    /// Drops the holes freed entries left, keeping put order.
    fn compact(&mut self) {
        self.entries.retain(Option::is_some);
        self.index.clear();
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(e) = e {
                self.index.insert(e.id.clone(), i);
            }
        }
    }

    fn get_mut(&mut self, id: &SampleId) -> Option<&mut Entry> {
        let i = *self.index.get(id)?;
        self.entries.get_mut(i)?.as_mut()
    }

    fn remove(&mut self, id: &SampleId) -> Option<Entry> {
        let i = self.index.remove(id)?;
        self.entries.get_mut(i).and_then(Option::take)
    }

    /// Keeps a freed entry until its archive row is durable (only when archiving).
    fn keep_unarchived(&mut self, entry: Entry, reason: ExitReason) {
        if self.archiving {
            self.unarchived.push(Unarchived {
                entry,
                reason,
                batch: None,
            });
        }
    }

    /// The entries in put order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().flatten()
    }

    /// Adds a sample put now, with the next seq.
    fn insert(&mut self, id: &SampleId, birth: u64, body: Body) {
        let entry = Entry {
            seq: self.next_seq,
            id: id.clone(),
            birth,
            body,
            used: BTreeMap::new(),
            spilled: Vec::new(),
        };
        self.next_seq += 1;
        self.put += 1;
        self.push(entry);
    }

    /// Applies one log record, as the buffer applied it. Fails only on a sample whose
    /// bytes do not decode.
    pub(crate) fn apply(&mut self, record: &Replayed) -> Result<(), Bad> {
        let record = match record {
            Replayed::Put(samples) => {
                for e in samples {
                    self.insert(&e.id, e.birth, Body::Encoded(e.bytes.clone()));
                }
                return Ok(());
            }
            Replayed::Other(record) => record,
        };
        match record {
            // A put the log writer applies to its image (recovery reads puts as
            // `Replayed::Put`): the entry shares the buffer's sample.
            Record::Put(samples) => {
                for s in samples {
                    let body = Body::Decoded(Arc::clone(s));
                    self.insert(&s.id, s.birth.unwrap_or(0), body);
                }
            }
            Record::Amend { ids, patches } => {
                for (id, patch) in ids.iter().zip(patches.iter()) {
                    match self.get_mut(id) {
                        Some(e) => e.patch(patch)?,
                        None => self.unmatched += 1,
                    }
                }
            }
            Record::Spill {
                ids,
                parts,
                replaces,
            } => {
                for (id, part) in ids.iter().zip(parts) {
                    match self.get_mut(id) {
                        Some(e) => e.spill(part, *replaces)?,
                        None => self.unmatched += 1,
                    }
                }
            }
            Record::Complete { rpc, ids, outputs } => {
                for (i, id) in ids.iter().enumerate() {
                    let Some(e) = self.get_mut(id) else {
                        self.unmatched += 1;
                        continue;
                    };
                    if let Some(patch) = outputs.as_ref().and_then(|o| o.get(i)) {
                        e.patch(patch)?;
                    }
                    let used = e.used.entry(Arc::clone(rpc)).or_default();
                    *used = used.saturating_add(1);
                }
                self.rpcs.entry(Arc::clone(rpc)).or_default().reads += ids.len() as u64;
            }
            Record::Release { rpc, ids, expired } => {
                let totals = self.rpcs.entry(Arc::clone(rpc)).or_default();
                totals.redelivered += ids.len() as u64;
                totals.expired_leases += u64::from(*expired);
            }
            Record::Aux(writes) => {
                for w in writes {
                    match &w.value {
                        Some(sample) => {
                            let entry = Entry {
                                seq: 0,
                                id: SampleId::from(&*w.key),
                                birth: 0,
                                body: Body::Decoded(Arc::clone(sample)),
                                used: BTreeMap::new(),
                                spilled: Vec::new(),
                            };
                            self.aux.insert(Arc::clone(&w.key), entry);
                        }
                        None => {
                            self.aux.remove(&w.key);
                        }
                    }
                }
            }
            Record::Free { ids, reason } => {
                for id in ids {
                    match self.remove(id) {
                        Some(entry) => {
                            self.freed += 1;
                            self.keep_unarchived(entry, *reason);
                        }
                        None => self.unmatched += 1,
                    }
                }
            }
            Record::Archiving { batch, ids } => {
                // Each id takes the first sample of that id not in a batch yet: one pass
                // over the waiting samples, however many the batch names.
                let mut named: HashMap<&SampleId, usize, BuildHasherDefault<PrehashedId>> =
                    HashMap::default();
                ids.iter().for_each(|id| *named.entry(id).or_default() += 1);
                for u in self.unarchived.iter_mut().filter(|u| u.batch.is_none()) {
                    if let Some(left) = named.get_mut(&u.entry.id).filter(|n| **n > 0) {
                        *left -= 1;
                        u.batch = Some(*batch);
                    }
                }
                self.next_archive_batch = self.next_archive_batch.max(batch + 1);
            }
            Record::Archived { batch } => {
                self.unarchived.retain(|u| u.batch != Some(*batch));
                self.next_archive_batch = self.next_archive_batch.max(batch + 1);
            }
        }
        Ok(())
    }

    /// Decodes every sample still encoded; fails naming the first that does not decode.
    pub(crate) fn decode_all(&mut self) -> Result<(), Bad> {
        self.entries
            .iter_mut()
            .flatten()
            .try_for_each(|e| e.sample().map(|_| ()))
    }

    /// The contents for a buffer whose RPCs are `rpcs` (name, reads per sample), decoding
    /// every sample. A sample with no read left for any of them was consumed before the
    /// crash (its free was not yet logged): it is dropped from the state and counted as
    /// freed.
    pub(crate) fn restored(&mut self, rpcs: &[(Arc<str>, u16)]) -> Result<Restored, Bad> {
        let left_of = |e: &Entry| -> Vec<u16> {
            rpcs.iter()
                .map(|(name, reads)| reads.saturating_sub(e.used.get(name).copied().unwrap_or(0)))
                .collect()
        };
        let consumed: Vec<SampleId> = self
            .entries()
            .filter(|e| left_of(e).iter().all(|&l| l == 0))
            .map(|e| e.id.clone())
            .collect();
        for id in &consumed {
            if let Some(entry) = self.remove(id) {
                self.keep_unarchived(entry, ExitReason::Consumed);
            }
        }
        self.freed += consumed.len() as u64;
        self.settled_on_restore = consumed.len();
        self.decode_all()?;
        let mut out = Restored {
            put: self.put,
            freed: self.freed,
            ..Restored::default()
        };
        for e in self.entries() {
            if let Body::Decoded(sample) = &e.body {
                out.samples
                    .push((Arc::clone(sample), left_of(e), e.spilled.clone()));
            }
        }
        for (key, entry) in &mut self.aux {
            let sample = entry.sample()?;
            out.aux.push((Arc::clone(key), Arc::clone(sample)));
        }
        for (name, _) in rpcs {
            let t = self.rpcs.get(name).copied().unwrap_or_default();
            out.reads.push(t.reads);
            out.redelivered.push(t.redelivered);
            out.expired_leases.push(t.expired_leases);
        }
        Ok(out)
    }

    /// The spill segments the stored samples (and those still to archive) need.
    pub(crate) fn spill_segments(&self) -> std::collections::BTreeSet<u64> {
        self.entries()
            .chain(self.unarchived.iter().map(|u| &u.entry))
            .flat_map(|e| e.spilled.iter().map(|p| p.segment))
            .collect()
    }

    /// The samples still to archive, decoded, with their reasons and batches, for the
    /// archiver (they stay in the state until a logged `Archived` says their rows are on
    /// storage).
    pub(crate) fn unarchived_samples(&mut self) -> Result<Vec<Waiting>, Bad> {
        let mut out = Vec::with_capacity(self.unarchived.len());
        for u in &mut self.unarchived {
            let sample = Arc::clone(u.entry.sample()?);
            out.push((sample, u.entry.spilled.clone(), u.reason, u.batch));
        }
        Ok(out)
    }

    /// The largest birth of any stored sample.
    pub(crate) fn max_birth(&self) -> u64 {
        self.entries().map(|e| e.birth).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::Sample;

    fn apply(state: &mut DurableState, record: Record) {
        if let Err(e) = state.apply(&Replayed::Other(record)) {
            panic!("apply: {e}");
        }
    }

    fn put(state: &mut DurableState, id: &str) {
        let sample = Arc::new(Sample::new(id).with("x", vec![1i32]));
        apply(state, Record::Put(vec![sample]));
    }

    fn ids(ids: &[&str]) -> Vec<SampleId> {
        ids.iter().map(|&i| SampleId::from(i)).collect()
    }

    fn waiting(state: &DurableState) -> Vec<(String, Option<u64>)> {
        state
            .unarchived
            .iter()
            .map(|u| (u.entry.id.to_string(), u.batch))
            .collect()
    }

    /// The holes frees leave are squeezed out as puts go on, keeping put order and every
    /// id's entry reachable.
    #[test]
    fn holes_are_compacted_without_losing_order_or_ids() {
        let mut state = DurableState::default();
        let name = |i: usize| format!("s{i}");
        for i in 0..20_000 {
            put(&mut state, &name(i));
            if i % 10 != 0 {
                let freed = Record::Free {
                    ids: ids(&[&name(i)]),
                    reason: ExitReason::Consumed,
                };
                apply(&mut state, freed);
            }
        }
        assert!(state.entries.len() < 2 * state.index.len() + 4097);
        let kept: Vec<String> = state.entries().map(|e| e.id.to_string()).collect();
        let expected: Vec<String> = (0..20_000).step_by(10).map(name).collect();
        assert_eq!(kept, expected);
        let read = Record::Complete {
            rpc: Arc::from("train"),
            ids: ids(&["s0", "s19990"]),
            outputs: None,
        };
        apply(&mut state, read);
        assert_eq!(state.unmatched, 0);
        let used: Vec<u16> = state
            .entries()
            .filter_map(|e| e.used.get("train").copied())
            .collect();
        assert_eq!(used, [1, 1]);
    }

    #[test]
    fn freed_samples_wait_until_their_archive_batch_is_written() {
        let mut state = DurableState {
            archiving: true,
            ..DurableState::default()
        };
        for id in ["a", "b", "c"] {
            put(&mut state, id);
        }
        let free = |names: &[&str], reason| Record::Free {
            ids: ids(names),
            reason,
        };
        apply(&mut state, free(&["a", "b"], ExitReason::Consumed));
        assert_eq!(waiting(&state), [("a".into(), None), ("b".into(), None)]);
        apply(
            &mut state,
            Record::Archiving {
                batch: 4,
                ids: ids(&["a"]),
            },
        );
        assert_eq!(waiting(&state), [("a".into(), Some(4)), ("b".into(), None)]);
        assert_eq!(state.next_archive_batch, 5);
        apply(&mut state, Record::Archived { batch: 4 });
        apply(&mut state, free(&["c"], ExitReason::Stale));
        assert_eq!(waiting(&state), [("b".into(), None), ("c".into(), None)]);
        assert_eq!(state.unarchived[1].reason, ExitReason::Stale);
        assert_eq!(state.entries().count(), 0);
        let waiting_samples = state.unarchived_samples().unwrap_or_default();
        assert_eq!(waiting_samples.len(), 2);
        assert_eq!(state.unarchived.len(), 2);
        state.unarchived.clear();

        // An id freed twice (put again after its first free) waits twice; a batch naming
        // it once takes the first.
        for _ in 0..2 {
            put(&mut state, "d");
            apply(&mut state, free(&["d"], ExitReason::Consumed));
        }
        apply(
            &mut state,
            Record::Archiving {
                batch: 7,
                ids: ids(&["d", "x"]),
            },
        );
        assert_eq!(waiting(&state), [("d".into(), Some(7)), ("d".into(), None)]);

        // Without an archive, a free drops the sample at once.
        let mut plain = DurableState::default();
        put(&mut plain, "a");
        apply(&mut plain, free(&["a"], ExitReason::Consumed));
        assert!(plain.unarchived.is_empty());
        assert_eq!(plain.freed, 1);
    }
}
