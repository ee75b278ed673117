//! `contents()`: what a buffer stores, sample by sample, with the reads each RPC has left
//! (for inspection, and what recovery is checked against).

use super::spill::{merge, read_back, SpilledRow};
use super::SequenceBuffer;
use crate::error::Result;
use crate::sample::{Sample, SampleId};
use crate::sync::Arc;
use std::collections::BTreeMap;

/// A stored sample and the reads each RPC has left of it (see
/// [`SequenceBuffer::contents`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StoredSample {
    /// The sample with every field it holds now.
    pub sample: Sample,
    /// Per RPC name: reads of the sample it has not used yet.
    pub reads_left: BTreeMap<String, u16>,
    /// The fields held in spill segments rather than in `sample`, with their sizes in
    /// bytes (`Tensor::nbytes` when spilled); empty when nothing of it is spilled, and
    /// from [`SequenceBuffer::contents_loaded`], whose samples hold every field.
    pub spilled: BTreeMap<String, u64>,
}

/// Spilled samples [`SequenceBuffer::contents_loaded`] reads back at a time (their
/// segments are read at once).
const READ_BACK_SAMPLES: usize = 256;

impl SequenceBuffer {
    /// Whether a sample with this id is stored or being put.
    pub fn contains(&self, id: &str) -> bool {
        self.shared.lock().ids.contains_key(&SampleId::from(id))
    }

    /// Every stored sample (not those still being put), oldest birth first, with the reads
    /// each RPC has left. Copies only field handles, never tensor data; for inspection and
    /// tests, O(stored samples). A spilled sample shows only the fields held in memory (see
    /// [`Self::contents_loaded`]).
    pub fn contents(&self) -> Vec<StoredSample> {
        self.snapshot_contents()
            .into_iter()
            .map(|(stored, _)| stored)
            .collect()
    }

    /// [`Self::contents`] with the spilled fields read back from their spill segments
    /// (one read per segment for every 256 spilled samples: for
    /// inspection and tests; it holds every payload in memory at once).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`](crate::Error::Storage) or [`Error::Corrupt`](crate::Error::Corrupt)
    /// when a spill segment cannot be read back.
    ///
    /// # Cancel safety
    ///
    /// It only reads: dropping the future changes nothing in the buffer.
    pub async fn contents_loaded(&self) -> Result<Vec<StoredSample>> {
        let store = self
            .shared
            .lock()
            .spill
            .as_ref()
            .map(|s| Arc::clone(&s.store));
        let mut out = Vec::new();
        let mut spilled: Vec<(usize, Vec<SpilledRow>)> = Vec::new();
        for (stored, rows) in self.snapshot_contents() {
            if !rows.is_empty() {
                spilled.push((out.len(), rows));
            }
            out.push(stored);
        }
        let Some(store) = store else {
            return Ok(out);
        };
        while !spilled.is_empty() {
            let rest = spilled.split_off(spilled.len().min(READ_BACK_SAMPLES));
            let (at, rows): (Vec<usize>, Vec<_>) =
                std::mem::replace(&mut spilled, rest).into_iter().unzip();
            for (i, fields) in at.into_iter().zip(read_back(&store, rows).await) {
                if let Some(stored) = out.get_mut(i) {
                    stored.sample = merge(&stored.sample, fields?);
                    stored.spilled.clear();
                }
            }
        }
        Ok(out)
    }

    /// Stored samples in order, with where their spilled fields are.
    fn snapshot_contents(&self) -> Vec<(StoredSample, Vec<SpilledRow>)> {
        let shared = &*self.shared;
        let inner = shared.lock();
        let table = &inner.table;
        let n_rpcs = table.rpcs.len();
        let mut stored: Vec<(_, (StoredSample, Vec<SpilledRow>))> = inner
            .samples
            .iter()
            .enumerate()
            .filter_map(|(s, sample)| {
                let sample = sample.as_ref()?;
                let reads_left = shared
                    .graph
                    .rpcs()
                    .iter()
                    .enumerate()
                    .map(|(r, info)| (info.name.to_string(), table.reads_left[s * n_rpcs + r]))
                    .collect();
                let (rows, spilled) = match &inner.spill {
                    Some(sp) => {
                        let spilled = sp
                            .parts(s as u32)
                            .iter()
                            .flat_map(|p| &p.fields)
                            .map(|(key, bytes)| (key.to_string(), *bytes))
                            .collect();
                        (sp.rows_of(s as u32), spilled)
                    }
                    None => Default::default(),
                };
                let entry = StoredSample {
                    sample: Sample::clone(sample),
                    reads_left,
                    spilled,
                };
                Some((table.slots[s].order, (entry, rows)))
            })
            .collect();
        stored.sort_by_key(|(order, _)| *order);
        stored.into_iter().map(|(_, s)| s).collect()
    }
}
