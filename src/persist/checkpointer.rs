//! `Checkpointer`: the log writer's handle on an image of what the log holds, kept by a
//! task of its own that also writes it out as checkpoints.
//!
//! The writer hands every group it has written to [`Checkpointer::logged`], and the image
//! task applies its records to a `DurableState` (the *image*) with the same `apply`
//! recovery uses. A group whose write failed is never handed over, so the image is always
//! what a recovery of the stored files would build. A put costs the image an entry
//! sharing the buffer's sample (no copy of its fields); a free drops it.
//!
//! Once the log since the last checkpoint outgrows both `checkpoint_bytes` and the last
//! checkpoint, the writer asks the image task for a checkpoint of the log before the next
//! group. The task writes the image out as segments and a manifest; groups written
//! meanwhile wait in the channel, in log order, and are applied after it. The writer only
//! ever sends: neither the image's upkeep nor a checkpoint delays a group.
//!
//! Checkpoints used to be rebuilt from the stored files, the previous checkpoint's
//! segments and every log group since read back and decoded: half of a checkpoint's
//! cost, and a tenth of a loaded server's CPU.
//!
//! The image task owns the image; the channel is the only thing shared. If a record does
//! not apply (it cannot, for records this buffer made) the task logs it and stops: no
//! more checkpoints, and the log keeps everything for the next open.

use super::checkpoint::{self, Manifest, StoredConfig};
use super::codec::Replayed;
use super::state::DurableState;
use super::store::Store;
use crate::buffer::Record;
use crate::error::{Error, Result};
use crate::sync::{mpsc, oneshot};

/// What the writer tells the image task.
enum Message {
    /// A group of these records is on storage.
    Logged(Vec<Record>),
    /// Write everything logged so far as checkpoint `number` of the log before `log_from`.
    Checkpoint {
        log_from: u64,
        number: u64,
        done: oneshot::Sender<Result<Manifest>>,
    },
}

/// The writer's side: when to checkpoint, and the checkpoint running.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    to_image: mpsc::UnboundedSender<Message>,
    /// The running checkpoint's answer.
    running: Option<oneshot::Receiver<Result<Manifest>>>,
    /// The image task stopped: no more checkpoints.
    lost: bool,
    /// The next manifest's number.
    next_manifest: u64,
    /// Log bytes written since the last checkpoint started.
    log_bytes: u64,
    /// Log bytes after which a checkpoint is considered.
    floor: u64,
    /// Size of the last checkpoint's segments.
    last_size: u64,
}

impl Checkpointer {
    /// Starts the image task on the current runtime with `state`, what the store holds
    /// before the writer's first group; `last_size` is the size of the store's checkpoint.
    pub(crate) fn start(
        store: Store,
        config: StoredConfig,
        state: DurableState,
        next_manifest: u64,
        floor: u64,
        last_size: u64,
    ) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime {
            what: "the checkpoint task",
        })?;
        let (to_image, from_writer) = mpsc::unbounded_channel();
        runtime.spawn(keep_image(from_writer, state, store, config));
        Ok(Self {
            to_image,
            running: None,
            lost: false,
            next_manifest,
            log_bytes: 0,
            floor,
            last_size,
        })
    }

    /// A group of `bytes` holding `records` is on storage.
    pub(crate) fn logged(&mut self, records: Vec<Record>, bytes: usize) {
        self.log_bytes += bytes as u64;
        if !self.lost && self.to_image.send(Message::Logged(records)).is_err() {
            self.lost = true;
        }
    }

    /// Collects a finished checkpoint; then starts one of the log before group `log_from`
    /// if the log since the last one outgrew it (so the work stays proportional to what is
    /// logged) and the floor.
    pub(crate) fn maybe_start(&mut self, log_from: u64) {
        if let Some(running) = &mut self.running {
            match running.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => {}
                Ok(written) => self.finished(Ok(written)),
                Err(oneshot::error::TryRecvError::Closed) => self.finished(Err(())),
            }
        }
        let outgrown = self.log_bytes >= self.floor.max(self.last_size);
        if self.running.is_some() || self.lost || !outgrown {
            return;
        }
        let (done, answer) = oneshot::channel();
        let number = self.next_manifest;
        let asked = Message::Checkpoint {
            log_from,
            number,
            done,
        };
        if self.to_image.send(asked).is_err() {
            self.lost = true;
            return;
        }
        self.next_manifest += 1;
        self.log_bytes = 0;
        self.running = Some(answer);
    }

    /// Waits for the running checkpoint, if any.
    pub(crate) async fn wait(&mut self) {
        if let Some(running) = self.running.as_mut() {
            let answer = running.await.map_err(|_| ());
            self.finished(answer);
        }
    }

    /// Takes the running checkpoint's answer (`Err` when the image task dropped it).
    fn finished(&mut self, answer: std::result::Result<Result<Manifest>, ()>) {
        self.running = None;
        match answer {
            Ok(Ok(m)) => self.last_size = m.bytes,
            Ok(Err(e)) => tracing::warn!(error = %e, "checkpoint failed; the log is kept"),
            Err(_) => {
                tracing::error!("the checkpoint task stopped; no more checkpoints");
                self.lost = true;
            }
        }
    }
}

/// The image task: applies logged groups and writes checkpoints, in the order asked,
/// until the writer is gone.
async fn keep_image(
    mut from_writer: mpsc::UnboundedReceiver<Message>,
    mut image: DurableState,
    store: Store,
    config: StoredConfig,
) {
    while let Some(message) = from_writer.recv().await {
        match message {
            // Once the writer is gone no checkpoint follows: what is left is not applied.
            Message::Logged(_) if from_writer.is_closed() => {}
            Message::Logged(records) => {
                let applied = records
                    .into_iter()
                    .try_for_each(|r| image.apply(&Replayed::Other(r)));
                if let Err(e) = applied {
                    tracing::error!(
                        error = %e,
                        "the image of the log lost track; no more checkpoints"
                    );
                    return;
                }
            }
            Message::Checkpoint {
                log_from,
                number,
                done,
            } => {
                let written = checkpoint::write(&store, &image, log_from, number, &config).await;
                let _ = done.send(written);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    //! The image against recovery: for random record sequences, a checkpoint written from
    //! the image, recovered, equals the recovery of the log those records were written to.
    //! (`expect` here is on fixtures that cannot fail, an in-memory store and a runtime, or
    //! is the test's own assertion that a recovery succeeds.)

    use super::*;
    use crate::buffer::{AuxWrite, SpillPart};
    use crate::exit::ExitReason;
    use crate::persist::log::{encode_group, log_path};
    use crate::persist::recover::{recover, Recovered};
    use crate::persist::state::Entry;
    use crate::sample::{Patch, Sample, SampleId};
    use crate::sync::Arc;
    use bytes::Bytes;
    use proptest::prelude::*;

    /// An operation, its numbers reduced modulo what exists when it applies.
    #[derive(Debug, Clone)]
    enum Op {
        Put(u8),
        Amend(u8),
        Complete(u8, bool),
        Release(u8),
        Free(u8, u8),
        Aux(u8, bool),
        Archiving(u8),
        Archived(u8),
        Spill(u8),
        /// Ends the group: the records so far are written as one log group.
        Commit,
        /// Starts a checkpoint (it then runs while later groups are written).
        Checkpoint,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => any::<u8>().prop_map(Op::Put),
            1 => any::<u8>().prop_map(Op::Amend),
            2 => (any::<u8>(), any::<bool>()).prop_map(|(i, o)| Op::Complete(i, o)),
            1 => any::<u8>().prop_map(Op::Release),
            2 => (any::<u8>(), any::<u8>()).prop_map(|(i, r)| Op::Free(i, r)),
            1 => (any::<u8>(), any::<bool>()).prop_map(|(k, s)| Op::Aux(k, s)),
            1 => any::<u8>().prop_map(Op::Archiving),
            1 => any::<u8>().prop_map(Op::Archived),
            1 => any::<u8>().prop_map(Op::Spill),
            3 => Just(Op::Commit),
            1 => Just(Op::Checkpoint),
        ]
    }

    /// Which ids are live, freed (waiting for the archive) and in logged archive batches.
    #[derive(Default)]
    struct Model {
        next: u64,
        live: Vec<SampleId>,
        freed: Vec<SampleId>,
        batches: Vec<u64>,
        next_batch: u64,
    }

    fn pick(ids: &[SampleId], i: u8) -> Option<SampleId> {
        (!ids.is_empty()).then(|| ids[usize::from(i) % ids.len()].clone())
    }

    fn record(m: &mut Model, op: &Op) -> Option<Record> {
        let patch = |v: f64| Patch::new().with("reward", v).meta("note", "x");
        Some(match *op {
            Op::Put(n) => {
                let samples = (0..=n % 3)
                    .map(|_| {
                        m.next += 1;
                        let id = SampleId::from(format!("s{}", m.next));
                        m.live.push(id.clone());
                        Arc::new(
                            Sample::new(id)
                                .with("tokens", vec![m.next as i32; usize::from(n % 5)])
                                .birth(m.next % 4),
                        )
                    })
                    .collect();
                Record::Put(samples)
            }
            Op::Amend(i) => Record::Amend {
                ids: vec![pick(&m.live, i)?],
                patches: vec![patch(f64::from(i))].into(),
            },
            Op::Complete(i, outputs) => Record::Complete {
                rpc: Arc::from(if i % 2 == 0 { "train" } else { "ref" }),
                ids: vec![pick(&m.live, i)?],
                outputs: outputs.then(|| vec![patch(0.5)].into()),
            },
            Op::Release(i) => Record::Release {
                rpc: Arc::from("train"),
                ids: vec![pick(&m.live, i)?],
                expired: i % 2 == 0,
            },
            Op::Free(i, r) => {
                let id = pick(&m.live, i)?;
                m.live.retain(|x| *x != id);
                m.freed.push(id.clone());
                let reason = [ExitReason::Consumed, ExitReason::Stale, ExitReason::Evicted];
                Record::Free {
                    ids: vec![id],
                    reason: reason[usize::from(r) % 3],
                }
            }
            Op::Aux(k, set) => Record::Aux(vec![if set {
                AuxWrite::set(
                    format!("k{}", k % 4),
                    Sample::new("pending").with("x", 1i64),
                )
            } else {
                AuxWrite {
                    key: Arc::from(format!("k{}", k % 4)),
                    value: None,
                }
            }]),
            Op::Archiving(n) => {
                let take = usize::from(n) % (m.freed.len() + 1);
                let ids: Vec<SampleId> = m.freed.drain(..take).collect();
                m.batches.push(m.next_batch);
                m.next_batch += 1;
                Record::Archiving {
                    batch: m.next_batch - 1,
                    ids,
                }
            }
            Op::Archived(i) => Record::Archived {
                batch: pick_batch(&mut m.batches, i)?,
            },
            Op::Spill(i) => Record::Spill {
                ids: vec![pick(&m.live, i)?],
                parts: vec![SpillPart {
                    segment: u64::from(i),
                    segment_rows: 4,
                    row: u32::from(i % 4),
                    fields: vec![("tokens".into(), 4)],
                }],
                replaces: None,
            },
            Op::Commit | Op::Checkpoint => return None,
        })
    }

    fn pick_batch(batches: &mut Vec<u64>, i: u8) -> Option<u64> {
        (!batches.is_empty()).then(|| batches.remove(usize::from(i) % batches.len()))
    }

    /// Everything a recovered state holds, comparable.
    fn summary(r: &Recovered) -> Vec<String> {
        let entry = |e: &Entry| {
            let mut w = crate::persist::codec::Writer::default();
            e.encode_sample(&mut w);
            format!(
                "{} {} {} {:?} {:?} {:?}",
                e.seq,
                e.id,
                e.birth,
                e.used,
                e.spilled
                    .iter()
                    .map(|p| (p.segment, p.row))
                    .collect::<Vec<_>>(),
                w.buf
            )
        };
        let s = &r.state;
        let mut out: Vec<String> = s.entries().map(entry).collect();
        out.extend(s.aux.values().map(|e| format!("aux {}", entry(e))));
        out.extend(
            s.unarchived
                .iter()
                .map(|u| format!("freed {:?} {:?} {}", u.reason, u.batch, entry(&u.entry))),
        );
        out.push(format!(
            "put {} freed {} next_seq {} archive {} totals {:?} unmatched {}",
            s.put, s.freed, s.next_seq, s.next_archive_batch, s.rpcs, s.unmatched
        ));
        out
    }

    /// Starts a checkpoint of the log before `seq` unless one is running.
    async fn start_now(checkpoints: &mut Checkpointer, seq: u64) {
        checkpoints.floor = 0;
        checkpoints.last_size = 0;
        checkpoints.maybe_start(seq);
        checkpoints.floor = u64::MAX;
    }

    async fn check(ops: Vec<Op>) {
        let store = Store::open("memory://").expect("memory store");
        let mut state = DurableState::default();
        state.archiving = true;
        let mut checkpoints = Checkpointer::start(
            store.clone(),
            StoredConfig::default(),
            state,
            0,
            u64::MAX,
            0,
        )
        .expect("a runtime");
        let (mut model, mut group, mut seq) = (Model::default(), Vec::new(), 0u64);
        let write = |seq: u64, records: &[Record]| {
            let bytes = encode_group(seq, &[], records, Vec::new());
            let store = store.clone();
            async move {
                store
                    .put(&log_path(seq), Bytes::from(bytes))
                    .await
                    .expect("log write");
            }
        };
        for op in ops.iter().chain([&Op::Commit]) {
            match op {
                Op::Commit if !group.is_empty() => {
                    let records = std::mem::take(&mut group);
                    write(seq, &records).await;
                    seq += 1;
                    checkpoints.logged(records, 1);
                }
                Op::Checkpoint => start_now(&mut checkpoints, seq).await,
                other => group.extend(record(&mut model, other)),
            }
        }
        // The reference: what the stored files hold (the last checkpoint and the log).
        checkpoints.wait().await;
        let from_files = recover(&store, false, true).await.expect("recover the log");
        // A checkpoint of the image after every group, recovered alone.
        start_now(&mut checkpoints, seq).await;
        checkpoints.wait().await;
        let from_image = recover(&store, false, true)
            .await
            .expect("recover the image");
        assert_eq!(
            from_image.replayed, 0,
            "the image's checkpoint holds everything"
        );
        assert!(!checkpoints.lost);
        assert_eq!(summary(&from_image), summary(&from_files));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn a_checkpoint_of_the_image_is_what_recovery_of_the_log_builds(
            ops in proptest::collection::vec(op(), 0..120)
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(check(ops));
        }
    }

    /// The image's samples are the buffer's: an entry holds the put's `Arc`, not a copy,
    /// and lets it go when the sample is freed.
    #[tokio::test]
    async fn the_image_shares_the_samples_it_holds() {
        let store = Store::open("memory://").expect("memory store");
        let mut checkpoints = Checkpointer::start(
            store,
            StoredConfig::default(),
            DurableState::default(),
            0,
            u64::MAX,
            0,
        )
        .expect("a runtime");
        let sample = Arc::new(Sample::new("a").with("tokens", vec![1i32; 1024]));
        checkpoints.logged(vec![Record::Put(vec![Arc::clone(&sample)])], 1);
        // A checkpoint is answered after every group logged before it is applied.
        start_now(&mut checkpoints, 1).await;
        checkpoints.wait().await;
        assert_eq!(Arc::strong_count(&sample), 2, "the test's and the image's");
        let free = Record::Free {
            ids: vec![SampleId::from("a")],
            reason: ExitReason::Consumed,
        };
        checkpoints.logged(vec![free], 1);
        start_now(&mut checkpoints, 2).await;
        checkpoints.wait().await;
        assert_eq!(Arc::strong_count(&sample), 1);
    }
}
