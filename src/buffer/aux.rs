//! Auxiliary entries: small keyed samples that the layers above the buffer keep durable
//! through the buffer's own log (pending rollouts of group assembly, sealed group ids, the
//! batch log, the policy version).
//!
//! Writing them through the buffer's journal puts them in the same order as the buffer's
//! changes, and lets a write ride in the same unit as a put (a sealed group and the
//! removal of its pending rollouts land together or not at all). A copy of every entry is
//! kept under the buffer's lock (`Inner::aux`), so callers read them back at any time,
//! notably after `SequenceBuffer::open` recovered them.
//!
//! With a sync journal an entry is visible (and `aux_write` returns) once it is durable;
//! otherwise at once.

// The loom build leaves out group ingestion, the user of most of this.
#![cfg_attr(rollout_buffer_loom, allow(dead_code))]

use super::{Durable, Inner, Record, SequenceBuffer};
use crate::error::Result;
use crate::sample::Sample;
use crate::sync::{oneshot, Arc};
use std::collections::BTreeMap;

/// One auxiliary write: `value` under `key`, or the key's removal.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AuxWrite {
    pub(crate) key: Arc<str>,
    pub(crate) value: Option<Arc<Sample>>,
}

impl AuxWrite {
    pub(crate) fn set(key: impl Into<Arc<str>>, value: Sample) -> Self {
        Self {
            key: key.into(),
            value: Some(Arc::new(value)),
        }
    }

    pub(crate) fn remove(key: impl Into<Arc<str>>) -> Self {
        Self {
            key: key.into(),
            value: None,
        }
    }
}

/// The entries, by key.
pub(crate) type AuxMap = BTreeMap<Arc<str>, Arc<Sample>>;

/// Applies writes to the in-memory copy.
pub(crate) fn apply(map: &mut AuxMap, writes: &[AuxWrite]) {
    for w in writes {
        match &w.value {
            Some(v) => {
                map.insert(Arc::clone(&w.key), Arc::clone(v));
            }
            None => {
                map.remove(&w.key);
            }
        }
    }
}

impl SequenceBuffer {
    /// Writes `writes` as one unit; with a sync journal, returns once they are durable.
    pub(crate) async fn aux_write(&self, writes: Vec<AuxWrite>) -> Result<()> {
        self.aux_submit(writes).await
    }

    /// Appends `writes` as one unit now (so they are ordered before anything appended
    /// later); the returned future resolves once they are durable (at once without a sync
    /// journal).
    pub(crate) fn aux_submit(
        &self,
        writes: Vec<AuxWrite>,
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        let waiting = if writes.is_empty() {
            None
        } else {
            let mut inner = shared.lock();
            match &inner.journal {
                Some(j) if shared.sync_journal => {
                    let journal = Arc::clone(j);
                    let (tx, rx) = oneshot::channel();
                    let record = Record::Aux(writes.clone());
                    let me = Arc::clone(&shared);
                    let then: Durable = Box::new(move |verdict| {
                        if verdict.is_ok() {
                            apply(&mut me.lock().aux, &writes);
                        }
                        let _ = tx.send(verdict);
                    });
                    let refused = journal.append(vec![record], Some(then));
                    Some((rx, refused))
                }
                _ => {
                    inner.log(|| Record::Aux(writes.clone()));
                    apply(&mut inner.aux, &writes);
                    None
                }
            }
        };
        async move {
            let Some((rx, refused)) = waiting else {
                return Ok(());
            };
            drop(refused);
            shared.verdict(rx).await
        }
    }

    /// The entry under `key`.
    pub(crate) fn aux_get(&self, key: &str) -> Option<Arc<Sample>> {
        self.shared.lock().aux.get(key).cloned()
    }

    /// Every entry whose key starts with `prefix`, in key order.
    pub(crate) fn aux_range(&self, prefix: &str) -> Vec<(Arc<str>, Arc<Sample>)> {
        let inner = self.shared.lock();
        inner
            .aux
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (Arc::clone(k), Arc::clone(v)))
            .collect()
    }
}

impl Inner {
    /// Applies writes that ride with another change (a put), under the lock.
    pub(crate) fn aux_apply(&mut self, writes: &[AuxWrite]) {
        apply(&mut self.aux, writes);
    }
}
