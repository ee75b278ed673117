//! `contents()`: what a buffer stores, sample by sample, with the reads each RPC has left
//! (for inspection, and what recovery is checked against).

use super::SequenceBuffer;
use crate::sample::{Sample, SampleId};
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
}

impl SequenceBuffer {
    /// Whether a sample with this id is stored or being put.
    pub fn contains(&self, id: &str) -> bool {
        self.shared.lock().ids.contains_key(&SampleId::from(id))
    }

    /// Every stored sample (not those still being put), oldest birth first, with the reads
    /// each RPC has left. Copies only field handles, never tensor data; for inspection and
    /// tests, O(stored samples).
    pub fn contents(&self) -> Vec<StoredSample> {
        let shared = &*self.shared;
        let inner = shared.lock();
        let table = &inner.table;
        let n_rpcs = table.rpcs.len();
        let mut stored: Vec<(_, StoredSample)> = inner
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
                let entry = StoredSample {
                    sample: Sample::clone(sample),
                    reads_left,
                };
                Some((table.slots[s].order, entry))
            })
            .collect();
        stored.sort_by_key(|(order, _)| *order);
        stored.into_iter().map(|(_, s)| s).collect()
    }
}
