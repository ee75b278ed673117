//! Recovery: the newest checkpoint plus the log groups after it.
//!
//! Groups are applied in sequence order. A group that a later group declares abandoned is
//! ignored (its write failed and its callers were told so). A damaged group (bad checksum,
//! truncated) that is the last one is a torn tail, the write a crash interrupted: it is
//! skipped with a warning. Any other damaged or missing group is an error naming its path,
//! or a warning under lenient recovery. Nothing here panics on what it reads.
//!
//! Recovery streams: it reads, decodes and applies one group at a time, so it holds one
//! group besides the state (the log since the last checkpoint can be hundreds of
//! megabytes). Whether a group is abandoned is only known for
//! sure once every later group is read, but a group is only ever declared abandoned after
//! its write failed, so the streaming pass gives up at the first sign of a failure (a
//! declaration naming a group it applied, a gap not known to be abandoned, a damaged group
//! before the last) and recovery starts over with a pass that reads every group before it
//! applies any.

use super::checkpoint::{self, Manifest};
use super::log::{decode_group, log_path};
use super::state::DurableState;
use super::store::Store;
use crate::error::{Error, Result};
use std::collections::BTreeSet;

/// What recovery found.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub(crate) manifest: Option<Manifest>,
    /// The number the next manifest must take.
    pub(crate) next_manifest: u64,
    pub(crate) state: DurableState,
    /// The sequence number the next log group must take.
    pub(crate) next_seq: u64,
    /// Groups skipped (torn, damaged, or missing) that the next group must declare
    /// abandoned, so a later recovery never applies them either.
    pub(crate) skipped: Vec<u64>,
    /// Log groups applied on top of the checkpoint.
    pub(crate) replayed: usize,
}

/// Recovers everything the store holds; `archiving` keeps freed samples until a logged
/// `Archived` says their rows are on storage.
pub(crate) async fn recover(store: &Store, lenient: bool, archiving: bool) -> Result<Recovered> {
    if let Some(recovered) = streaming(store, lenient, archiving).await? {
        return Ok(recovered);
    }
    tracing::debug!("log holds abandoned or damaged groups: recovering with a full pass");
    full_pass(store, lenient, archiving).await
}

/// What recovery starts from: the checkpoint (loaded, its manifest and state) and the log
/// files after it, in sequence order.
struct Start {
    loaded: checkpoint::Loaded,
    manifest: Option<Manifest>,
    state: DurableState,
    log_from: u64,
    files: Vec<(u64, String)>,
}

async fn start(store: &Store, lenient: bool, archiving: bool) -> Result<Start> {
    let mut loaded = checkpoint::load(store, lenient).await?;
    let (manifest, mut state) = match loaded.checkpoint.take() {
        Some((m, s)) => (Some(m), s),
        None => (None, DurableState::default()),
    };
    state.archiving = archiving;
    if !archiving {
        // Opened without an archive: samples left over from one are not kept.
        state.unarchived.clear();
    }
    let log_from = manifest.as_ref().map_or(0, |m| m.log_from);
    let files = checkpoint::log_files(store, log_from).await?;
    Ok(Start {
        loaded,
        manifest,
        state,
        log_from,
        files,
    })
}

/// Recovery one group at a time; `None` when the log shows a failed write (see the module
/// docs), for [`full_pass`] to recover from.
async fn streaming(store: &Store, lenient: bool, archiving: bool) -> Result<Option<Recovered>> {
    let Start {
        loaded,
        manifest,
        mut state,
        log_from,
        files,
    } = start(store, lenient, archiving).await?;
    let last = files.last().map(|(seq, _)| *seq);
    let mut declared: BTreeSet<u64> = BTreeSet::new();
    let (mut applied, mut skipped) = (Vec::new(), Vec::new());
    let mut expected = log_from;
    for (seq, path) in files {
        if (expected..seq).any(|s| !declared.contains(&s)) {
            return Ok(None);
        }
        expected = seq + 1;
        if declared.contains(&seq) {
            continue;
        }
        // A file deleted between the listing and the read is a gap: a failed write.
        let Some(bytes) = store.get(&path).await? else {
            return Ok(None);
        };
        let group = match decode_group(&bytes) {
            Ok(group) if group.seq == seq => group,
            Err(detail) if Some(seq) == last => {
                tracing::warn!(%path, %detail, "torn last log group skipped");
                skipped.push(seq);
                continue;
            }
            _ => return Ok(None),
        };
        drop(bytes);
        if group
            .abandoned
            .iter()
            .any(|s| applied.binary_search(s).is_ok())
        {
            return Ok(None);
        }
        declared.extend(group.abandoned.iter().copied());
        // A record that does not apply is damage, or the sign of a group a later one
        // abandons: the full pass tells which.
        if group.records.iter().any(|r| state.apply(r).is_err()) {
            return Ok(None);
        }
        applied.push(seq);
    }
    Ok(Some(finish(
        &loaded,
        manifest,
        state,
        expected,
        skipped,
        applied.len(),
    )))
}

fn finish(
    loaded: &checkpoint::Loaded,
    manifest: Option<Manifest>,
    state: DurableState,
    next_seq: u64,
    skipped: Vec<u64>,
    replayed: usize,
) -> Recovered {
    if state.unmatched > 0 {
        tracing::warn!(
            records = state.unmatched,
            "log records named samples the recovered state does not hold"
        );
    }
    Recovered {
        manifest,
        next_manifest: loaded.highest.map_or(0, |n| n + 1),
        state,
        next_seq,
        skipped,
        replayed,
    }
}

/// Recovery that reads and decodes every group before it applies any, so that a group a
/// later one declares abandoned is never applied.
async fn full_pass(store: &Store, lenient: bool, archiving: bool) -> Result<Recovered> {
    let Start {
        loaded,
        manifest,
        mut state,
        log_from,
        files,
    } = start(store, lenient, archiving).await?;
    let mut groups = Vec::with_capacity(files.len());
    for (seq, path) in files {
        // A file deleted between the listing and the read is a missing group, handled below.
        let Some(bytes) = store.get(&path).await? else {
            continue;
        };
        let decoded = decode_group(&bytes).and_then(|g| {
            if g.seq == seq {
                Ok(g)
            } else {
                Err(format!(
                    "holds group {} under the name of group {seq}",
                    g.seq
                ))
            }
        });
        groups.push((seq, path, decoded));
    }
    let abandoned: BTreeSet<u64> = groups
        .iter()
        .filter_map(|(_, _, g)| g.as_ref().ok())
        .flat_map(|g| g.abandoned.iter().copied())
        .collect();
    let last = groups.last().map(|(seq, _, _)| *seq);
    let mut skipped = Vec::new();
    let mut replayed = 0;
    let mut expected = log_from;
    let damaged = |path: &str, detail: String| Error::Corrupt {
        url: store.url().to_owned(),
        path: path.to_owned(),
        detail,
        source: None,
    };
    for (seq, path, decoded) in groups {
        // Groups missing before this one: each must have been abandoned. (A missing group
        // needs no abandoning: there is nothing to ignore later.)
        if let Some(missing) = (expected..seq).find(|s| !abandoned.contains(s)) {
            let path = log_path(missing);
            let detail = "log group missing while later groups exist".to_owned();
            if !lenient {
                return Err(damaged(&path, detail));
            }
            tracing::warn!(%path, until = seq, "{detail}; skipped (lenient recovery)");
        }
        expected = seq + 1;
        if abandoned.contains(&seq) {
            continue;
        }
        match decoded {
            Ok(group) => {
                for record in &group.records {
                    state.apply(record).map_err(|e| damaged(&path, e))?;
                }
                replayed += 1;
            }
            Err(detail) if Some(seq) == last => {
                tracing::warn!(%path, %detail, "torn last log group skipped");
                skipped.push(seq);
            }
            Err(detail) if lenient => {
                tracing::warn!(%path, %detail, "damaged log group skipped (lenient recovery)");
                skipped.push(seq);
            }
            Err(detail) => return Err(damaged(&path, detail)),
        }
    }
    Ok(finish(
        &loaded, manifest, state, expected, skipped, replayed,
    ))
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    use super::*;
    use crate::buffer::Record;
    use crate::persist::codec::Replayed;
    use crate::sample::{Sample, SampleId};
    use crate::sync::Arc;
    use bytes::Bytes;

    async fn write(store: &Store, seq: u64, abandoned: &[u64], id: &str) {
        let sample = Arc::new(Sample::new(id).with("prompt", vec![1i32]));
        let bytes = super::super::log::encode_group(
            seq,
            abandoned,
            &[Record::Put(vec![sample])],
            Vec::new(),
        );
        store
            .put(&log_path(seq), Bytes::from(bytes))
            .await
            .expect("put");
    }

    /// A checksummed group whose sample does not decode (written damaged): the record that
    /// decodes it later (an amend) does not apply, and recovery names the damage rather
    /// than recovering a state without the amend.
    #[tokio::test]
    async fn a_record_that_does_not_apply_is_damage_even_when_streaming() {
        use crate::persist::archive::content_hash;
        use crate::persist::codec::{take_sample, Reader};
        // Ragged: the lengths must add up to the values, which only a full decode checks.
        let tokens =
            crate::tensor::Tensor::ragged(vec![1i32, 2, 3], vec![1, 2]).expect("lengths add up");
        let sample = Arc::new(Sample::new("a").with("tokens", tokens));
        let good = super::super::log::encode_group(0, &[], &[Record::Put(vec![sample])], vec![]);
        let good = Bytes::from(good);
        // Where the sample's bytes lie in the file.
        let Ok(group) = decode_group(&good) else {
            panic!("the written group decodes")
        };
        let [Replayed::Put(puts)] = &group.records[..] else {
            panic!("one put")
        };
        let start = puts[0].bytes.as_ptr() as usize - good.as_ptr() as usize;
        let end = start + puts[0].bytes.len();
        // A byte of the sample changed and the checksum made to match: the group decodes,
        // the sample does not.
        let damaged = (start..end)
            .find_map(|i| {
                let mut bytes = good.to_vec();
                bytes[i] ^= 0xff;
                let body = bytes.len() - 8;
                let checksum = content_hash(&bytes[..body]).to_le_bytes();
                bytes[body..].copy_from_slice(&checksum);
                let sample_bytes = &bytes[start..end];
                let undecodable = take_sample(&mut Reader::new(sample_bytes)).is_err();
                let bytes = Bytes::from(bytes);
                (undecodable && decode_group(&bytes).is_ok()).then_some(bytes)
            })
            .expect("a byte whose change the sample decoder refuses");
        let store = Store::open("memory://").expect("store");
        store.put(&log_path(0), damaged).await.expect("put");
        let amend = Record::Amend {
            ids: vec![SampleId::from("a")],
            patches: vec![crate::sample::Patch::new().with("reward", 1.0f64)].into(),
        };
        let bytes = super::super::log::encode_group(1, &[], &[amend], vec![]);
        store
            .put(&log_path(1), Bytes::from(bytes))
            .await
            .expect("put");
        let err = match recover(&store, false, false).await {
            Ok(_) => panic!("recovered a state without the amend"),
            Err(e) => e,
        };
        assert!(
            matches!(&err, Error::Corrupt { path, .. } if *path == log_path(1)),
            "{err}"
        );
    }

    /// A group whose write failed but landed is declared abandoned by the next group, or
    /// (after a lenient recovery skipped it) by a later one: either way it is never
    /// applied, although the streaming pass applied it before it read the declaration.
    #[tokio::test]
    async fn a_group_declared_abandoned_after_it_was_applied_is_not_recovered() {
        for declared_by in [2, 3] {
            let store = Store::open("memory://").expect("store");
            write(&store, 0, &[], "a").await;
            write(&store, 1, &[], "ghost").await;
            let declare = |seq: u64| if seq == declared_by { vec![1] } else { vec![] };
            write(&store, 2, &declare(2), "c").await;
            write(&store, 3, &declare(3), "d").await;
            let recovered = recover(&store, false, false).await.expect("recovers");
            let mut ids: Vec<String> = recovered
                .state
                .entries()
                .map(|e| e.id.to_string())
                .collect();
            ids.sort();
            assert_eq!(ids, ["a", "c", "d"], "declared by group {declared_by}");
            assert_eq!(recovered.next_seq, 4);
            assert_eq!(recovered.replayed, 3);
        }
    }
}
