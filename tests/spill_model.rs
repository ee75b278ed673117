//! proptest: random sequences of puts, amends (small fields, and large ones that replace a
//! spilled field), completions, commits, discards, releases and reopens of a durable
//! buffer whose memory budget holds one large field, so nearly every sample is
//! spilled, loaded back, patched beside its spilled copy, rewritten and freed. Checked
//! against a plain model of every sample's fields: every batch shows exactly the model's
//! values, every sample ends up either stored (with the model's values, spilled fields
//! read back) or handed once to the freed-sample sink (whole, with the model's values),
//! and the spill directory holds only segments stored samples need.
#![cfg(feature = "persist")]

mod common;

use proptest::prelude::*;
use rollout_buffer::persist::{Durability, PersistOptions, Store};
use rollout_buffer::{
    BufferConfig, ExitReason, FreedSink, Patch, Sample, SequenceBuffer, SlotHandle, Tensor,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Values in a large field: 1,200 bytes, over the size below which fields stay in memory.
const LARGE: usize = 300;

#[derive(Debug, Clone)]
enum Op {
    /// Put this many new samples.
    Put(usize),
    /// Amend the sample at this index of the handles put so far (if still stored): its
    /// score (small, stays in memory) or, with `true`, its prompt (large: replaces a
    /// spilled field).
    Amend(usize, bool, i32),
    /// Lease a batch for RPC `r` if it has one ready, then: 0 complete / commit, 1 drop
    /// (release), 2 discard.
    Serve(usize, u8),
    /// Flush, drop the buffer and open the store again.
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..17).prop_map(Op::Put),
        3 => (0usize..64, any::<bool>(), any::<i32>()).prop_map(|(i, big, v)| Op::Amend(i, big, v)),
        5 => (0usize..3, prop::sample::select(vec![0u8, 0, 0, 0, 1, 2]))
            .prop_map(|(r, how)| Op::Serve(r, how)),
        1 => Just(Op::Reopen),
    ]
}

const RPCS: [&str; 3] = ["gen", "reward", "train"];
const N_SEQS: [usize; 3] = [2, 1, 2];

/// A large field whose values say whose it is and which version.
fn large(seed: i32) -> Tensor {
    Tensor::from(
        (0..LARGE as i32)
            .map(|t| seed.wrapping_mul(31).wrapping_add(t))
            .collect::<Vec<i32>>(),
    )
}

/// What every stored or freed sample must hold, by id.
type Model = BTreeMap<String, BTreeMap<String, Tensor>>;

/// Keeps every sample the buffer frees (consumed or dropped).
#[derive(Debug, Default, Clone)]
struct Collect(Arc<Mutex<Vec<Arc<Sample>>>>);

impl FreedSink for Collect {
    fn consumed(&self, samples: Vec<Arc<Sample>>, _read_by: &[String]) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(samples);
    }

    fn dropped(&self, samples: Vec<Arc<Sample>>, _: ExitReason) {
        self.consumed(samples, &[]);
    }
}

fn config(sink: &Collect) -> BufferConfig {
    common::gen_reward_train(&["prompt", "tokens", "reward", "score"])
        // One prompt: nearly everything is spilled, often several samples of a put in one
        // segment, which frees leave sparse (and the spiller now and then rewrites).
        .memory_budget((LARGE * 4) as u64)
        .freed_sink(sink.clone())
}

async fn open(store: &Store, sink: &Collect) -> SequenceBuffer {
    let options = PersistOptions::new()
        .durability(Durability::Sync)
        .archive(None);
    SequenceBuffer::open_in(store.clone(), config(sink), options)
        .await
        .expect("opens")
}

/// `fields` (a sample's, or a batch view's) equal the model's for `id`, key by key.
fn check<'a>(model: &Model, id: &str, fields: impl Iterator<Item = (&'a str, &'a Tensor)>) {
    let want = model.get(id).expect("a sample the model knows");
    let got: BTreeMap<&str, &Tensor> = fields.collect();
    for (key, tensor) in &got {
        assert_eq!(Some(*tensor), want.get(*key), "sample {id}, field {key}");
    }
}

async fn run(ops: Vec<Op>) {
    let store = Store::open("memory://").expect("memory store");
    let sink = Collect::default();
    let mut buf = open(&store, &sink).await;
    let mut model = Model::new();
    // Handles put so far, with their samples' ids.
    let mut handles: Vec<(SlotHandle, String)> = Vec::new();
    let mut next = 0i32;
    for op in ops {
        match op {
            Op::Put(n) => {
                if buf.stats().empty < n {
                    continue;
                }
                let mut samples = Vec::with_capacity(n);
                let mut ids = Vec::with_capacity(n);
                for i in next..next + n as i32 {
                    let id = format!("s{i}");
                    let prompt = large(i);
                    model
                        .entry(id.clone())
                        .or_default()
                        .insert("prompt".into(), prompt.clone());
                    samples.push(Sample::new(id.as_str()).with("prompt", prompt));
                    ids.push(id);
                }
                next += n as i32;
                let put = buf.put_batch(samples).await.expect("fits");
                handles.extend(put.into_iter().zip(ids));
            }
            Op::Amend(i, big, v) => {
                let Some((h, id)) = handles.get(i % handles.len().max(1)).cloned() else {
                    continue;
                };
                let (key, value) = if big {
                    ("prompt", large(v))
                } else {
                    ("score", Tensor::scalar(f64::from(v)))
                };
                let patch = Patch::new().with(key, value.clone());
                // A handle whose sample was freed is stale: an error, nothing applied.
                if buf.amend_batch(&[h], vec![patch]).await.is_ok() {
                    model.entry(id).or_default().insert(key.into(), value);
                }
            }
            Op::Serve(r, how) => {
                if buf.stats().rpcs[r].eligible < N_SEQS[r] {
                    continue;
                }
                let batch = buf.get_batch_for_rpc(RPCS[r]).await.expect("ready");
                for view in batch.samples() {
                    check(&model, view.id().as_str(), view.fields());
                }
                match how {
                    1 => drop(batch),
                    2 => batch.discard().expect("discard"),
                    _ if r == 2 => batch.commit().await.expect("commit"),
                    _ => {
                        let key = if r == 0 { "tokens" } else { "reward" };
                        let mut outputs = Vec::new();
                        for view in batch.samples() {
                            let id = view.id().to_string();
                            let seed = id.len() as i32 * 7 + next;
                            let value = if r == 0 {
                                large(seed)
                            } else {
                                Tensor::scalar(f64::from(seed))
                            };
                            model
                                .entry(id)
                                .or_default()
                                .insert(key.into(), value.clone());
                            outputs.push(Patch::new().with(key, value));
                        }
                        batch.complete(outputs).await.expect("complete");
                    }
                }
            }
            Op::Reopen => {
                buf.flush().await.expect("flush");
                drop(buf);
                buf = open(&store, &sink).await;
                common::assert_invariants(&buf);
                // Handles do not survive a restart; fresh ones come with new puts.
                handles.clear();
            }
        }
    }
    buf.flush().await.expect("flush");
    common::assert_invariants(&buf);
    // Every sample put is stored or was freed, once, with the model's fields.
    let stored = buf.contents_loaded().await.expect("contents");
    let freed = sink.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for s in stored
        .iter()
        .map(|s| &s.sample)
        .chain(freed.iter().map(|s| &**s))
    {
        let id = s.id().to_string();
        *seen.entry(id.clone()).or_default() += 1;
        let want = model.get(&id).expect("a sample the model knows");
        let keys: Vec<&str> = s.keys().collect();
        assert_eq!(keys.len(), want.len(), "sample {id}: {keys:?}");
        check(&model, &id, s.fields());
    }
    assert_eq!(seen.len(), model.len(), "every sample stored or freed");
    assert!(
        seen.values().all(|&n| n == 1),
        "stored or freed once: {seen:?}"
    );
    // No segment but those stored samples need (every other one is deleted by now).
    let live = buf.stats().spill.live_segments;
    let files = store.list("spill").await.expect("list").len() as u64;
    assert_eq!(
        files, live,
        "segment files and segments stored samples need"
    );
    if buf.stats().spill.spilled_now == 0 {
        assert_eq!(files, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn spilled_samples_keep_their_data_through_every_operation(
        ops in prop::collection::vec(op(), 1..160),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(run(ops));
    }
}
