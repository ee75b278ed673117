//! A put's batch before it touches a slot: validated on its own (ids, births, dataset keys,
//! size, byte budget), births assigned, payloads wrapped for sharing, sizes counted for the
//! budgets. Runs without the buffer's lock. A put that stores none of its samples hands them
//! back from here ([`Prepared::into_unstored`]).

use super::freshness::freshness_of;
use super::spill::spillable_bytes;
use super::{AuxWrite, Record, Shared};
use crate::error::{Error, Result, Unstored};
use crate::rpc_defs::KeySet;
use crate::sample::{next_births, PrehashedId, Sample, SampleId};
use crate::state::Freshness;
use crate::sync::Arc;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// A validated batch: the shared payloads with their births assigned, and their graph key
/// sets.
pub(super) struct Prepared {
    pub(super) samples: Vec<Arc<Sample>>,
    pub(super) births: Vec<u64>,
    pub(super) keys: Vec<KeySet>,
    /// Each sample's policy version and age, up to the last sample with either (a missing
    /// entry reads as the default: none).
    pub(super) fresh: Vec<Freshness>,
    /// Each sample's tensor bytes, when the buffer has a byte budget (else empty).
    pub(super) bytes: Vec<u64>,
    /// Each sample's bytes that count against the memory budget (see `spill`), when the
    /// buffer has one (else empty).
    pub(super) resident: Vec<u64>,
    /// Auxiliary writes that land with the put.
    pub(super) aux: Vec<AuxWrite>,
}

impl Prepared {
    /// The samples, to hand back to the caller of a put that stored none of them. Nothing
    /// else holds them by then (no slot was claimed), so they are moved, not copied.
    pub(super) fn into_unstored(self) -> Unstored {
        let samples = self
            .samples
            .into_iter()
            .map(|s| Arc::try_unwrap(s).unwrap_or_else(|shared| (*shared).clone()))
            .collect();
        Unstored::new(samples)
    }

    /// `err` with the samples handed back, if it is an error that carries them.
    pub(super) fn hand_back(self, err: Error) -> Error {
        match err {
            Error::Full {
                requested, free, ..
            } => Error::Full {
                requested,
                free,
                samples: self.into_unstored(),
            },
            other => other,
        }
    }

    pub(super) fn total_bytes(&self) -> (u64, u64) {
        (self.bytes.iter().sum(), self.resident.iter().sum())
    }

    /// The log records of the put: the samples, and the auxiliary writes with them.
    pub(super) fn records(&self) -> Vec<Record> {
        let mut records = vec![Record::Put(self.samples.clone())];
        if !self.aux.is_empty() {
            records.push(Record::Aux(self.aux.clone()));
        }
        records
    }
}

impl Shared {
    /// Checks that the buffer is open and everything that does not depend on its contents,
    /// and assigns default births. Runs without the lock. `None` for an empty batch.
    pub(super) fn prepare(&self, mut samples: Vec<Sample>) -> Result<Option<Prepared>> {
        self.check_open()?;
        let n = samples.len();
        if n == 0 {
            return Ok(None);
        }
        let checked = self.validate(&samples).and_then(|keys| {
            let mut fresh = Vec::new();
            for (i, s) in samples.iter().enumerate() {
                if let Some(f) = freshness_of(s, self.ages)? {
                    fresh.resize(i, Freshness::default());
                    fresh.push(f);
                }
            }
            Ok((keys, fresh))
        });
        let (keys, fresh) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                self.lock().rejected += n as u64;
                tracing::debug!(error = %e, "put rejected");
                return Err(e);
            }
        };
        let unset = samples.iter().filter(|s| s.birth.is_none()).count() as u64;
        if unset > 0 {
            let births = next_births(unset)..;
            for (birth, s) in births.zip(samples.iter_mut().filter(|s| s.birth.is_none())) {
                s.birth = Some(birth);
            }
        }
        let births = samples.iter().map(|s| s.birth.unwrap_or(1)).collect();
        let bytes: Vec<u64> = match self.max_bytes {
            Some(_) => samples.iter().map(Sample::payload_bytes).collect(),
            None => Vec::new(),
        };
        let resident: Vec<u64> = match self.memory_budget {
            Some(_) => samples.iter().map(spillable_bytes).collect(),
            None => Vec::new(),
        };
        if let Some(max) = self.max_bytes {
            let total = bytes.iter().sum();
            if total > max {
                self.lock().rejected += n as u64;
                return Err(Error::OverBudget { bytes: total, max });
            }
        }
        let samples = samples.into_iter().map(Arc::new).collect();
        Ok(Some(Prepared {
            samples,
            births,
            keys,
            fresh,
            bytes,
            resident,
            aux: Vec::new(),
        }))
    }

    /// Validates the batch on its own; returns each sample's graph keys.
    fn validate(&self, samples: &[Sample]) -> Result<Vec<KeySet>> {
        let capacity = self.capacity;
        if samples.len() > capacity {
            return Err(Error::BatchTooLarge {
                len: samples.len(),
                capacity,
            });
        }
        for rpc in self.graph.rpcs() {
            let Some(limit) = rpc.rate_limit else {
                continue;
            };
            let max = limit.max_put(rpc.n_seqs);
            if samples.len() > max && samples.len() > limit.min_size {
                return Err(Error::RateLimitedPut {
                    rpc: rpc.name.to_string(),
                    len: samples.len(),
                    max,
                });
            }
        }
        let dataset = self.graph.dataset_keys();
        let mut seen: HashMap<&SampleId, usize, BuildHasherDefault<PrehashedId>> =
            HashMap::with_capacity_and_hasher(samples.len(), Default::default());
        let mut keys = Vec::with_capacity(samples.len());
        for (index, s) in samples.iter().enumerate() {
            if s.birth == Some(0) {
                return Err(Error::InvalidBirth {
                    id: s.id.to_string(),
                    index,
                });
            }
            let have = self.graph.key_set(s.keys());
            if !have.contains_all(dataset) {
                let missing = dataset.ids().find(|&k| !have.contains(k)).unwrap_or(0);
                return Err(Error::MissingKey {
                    id: s.id.to_string(),
                    index,
                    key: self.graph.key_name(missing).to_owned(),
                });
            }
            if let Some(first) = seen.insert(&s.id, index) {
                return Err(Error::DuplicateId {
                    id: s.id.to_string(),
                    index,
                    conflict: format!("also at batch position {first}"),
                });
            }
            keys.push(have);
        }
        Ok(keys)
    }
}
