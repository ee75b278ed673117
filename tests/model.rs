//! proptest: random sequences of puts, gets (some abandoned while pending), completions,
//! commits, releases and amends through the public API, checked after every step against a
//! plain reference model of what each RPC may be served.

mod common;
use common::assert_invariants;
use proptest::prelude::*;
use rollout_buffer::{
    Batch, BufferConfig, Error, Patch, RpcDef, Sample, SequenceBuffer, SlotHandle,
};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Polls a future once; a pending future is dropped (an abandoned call).
fn poll_once<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

const RPCS: [&str; 3] = ["gen", "reward", "train"];
const N_SEQS: [usize; 3] = [2, 1, 2];
const READS: [u32; 3] = [1, 1, 2];
/// Input keys of each RPC, as bits: prompt 1, tokens 2, reward 4, score 8.
const INPUTS: [u8; 3] = [0b0001, 0b0010, 0b1110];
/// Output key each RPC writes.
const OUTPUT: [Option<(&str, u8)>; 3] = [Some(("tokens", 0b0010)), Some(("reward", 0b0100)), None];

fn buffer(capacity: usize) -> SequenceBuffer {
    let rpcs = (0..3).map(|r| {
        let def = RpcDef::new(RPCS[r], N_SEQS[r]).reads(READS[r]);
        let inputs: Vec<&str> = [(1, "prompt"), (2, "tokens"), (4, "reward"), (8, "score")]
            .iter()
            .filter(|(bit, _)| INPUTS[r] & bit != 0)
            .map(|&(_, k)| k)
            .collect();
        let def = def.inputs(inputs);
        match OUTPUT[r] {
            Some((key, _)) => def.outputs([key]),
            None => def,
        }
    });
    SequenceBuffer::with_config(
        BufferConfig::new(capacity)
            .rpcs(rpcs)
            .external_keys(["score"]),
    )
    .expect("valid graph")
}

#[derive(Debug, Clone)]
struct ModelSample {
    id: String,
    handle: SlotHandle,
    keys: u8,
    reads_left: [u32; 3],
    leased: [bool; 3],
}

#[derive(Default)]
struct Model {
    /// Live samples in put order (which is birth order: births are the default counter).
    samples: Vec<ModelSample>,
}

impl Model {
    fn eligible(&self, r: usize) -> Vec<String> {
        self.samples
            .iter()
            .filter(|s| s.keys & INPUTS[r] == INPUTS[r] && s.reads_left[r] > 0 && !s.leased[r])
            .map(|s| s.id.clone())
            .collect()
    }

    fn get_mut(&mut self, id: &str) -> &mut ModelSample {
        match self.samples.iter_mut().find(|s| s.id == id) {
            Some(s) => s,
            None => panic!("model lost {id}"),
        }
    }

    fn finish(&mut self, r: usize, ids: &[String], used: bool) {
        for id in ids {
            let s = self.get_mut(id);
            s.leased[r] = false;
            if used {
                s.reads_left[r] -= 1;
                if let Some((_, bit)) = OUTPUT[r] {
                    s.keys |= bit;
                }
            }
        }
        self.samples.retain(|s| s.reads_left.iter().any(|&n| n > 0));
    }
}

#[derive(Debug, Clone)]
enum Op {
    Put(usize),
    Get(usize),
    Complete(usize),
    Release(usize),
    Amend(usize),
    AmendFreed,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..4).prop_map(Op::Put),
        4 => (0usize..3).prop_map(Op::Get),
        4 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Release),
        2 => any::<usize>().prop_map(Op::Amend),
        1 => Just(Op::AmendFreed),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn api_matches_reference_model(capacity in 2usize..8, ops in prop::collection::vec(op(), 1..60)) {
        let buf = buffer(capacity);
        let mut model = Model::default();
        let mut held: Vec<(usize, Batch)> = Vec::new();
        let mut freed_handles: Vec<SlotHandle> = Vec::new();
        let mut next_id = 0usize;
        for op in ops {
            match op {
                Op::Put(n) => {
                    let samples: Vec<Sample> = (next_id..next_id + n)
                        .map(|i| Sample::new(format!("s{i}")).with("prompt", i as i64))
                        .collect();
                    next_id += n;
                    let fits = capacity - model.samples.len() >= n;
                    match poll_once(buf.try_put_batch(samples.clone())) {
                        Some(Ok(handles)) => {
                            prop_assert!(fits, "put of {} succeeded with {} stored", n, model.samples.len());
                            for (s, h) in samples.iter().zip(handles) {
                                model.samples.push(ModelSample {
                                    id: s.id().to_string(),
                                    handle: h,
                                    keys: 0b0001,
                                    reads_left: READS,
                                    leased: [false; 3],
                                });
                            }
                        }
                        Some(Err(Error::Full { .. })) => prop_assert!(!fits),
                        Some(Err(Error::BatchTooLarge { .. })) => prop_assert!(n > capacity),
                        other => prop_assert!(false, "put: {:?}", other.map(|r| r.map(|_| ()))),
                    }
                }
                Op::Get(r) => {
                    let want = model.eligible(r);
                    match poll_once(buf.get_batch_for_rpc(RPCS[r])) {
                        Some(Ok(batch)) => {
                            prop_assert!(want.len() >= N_SEQS[r]);
                            let got: Vec<String> = batch.ids().map(|i| i.to_string()).collect();
                            prop_assert_eq!(&got[..], &want[..N_SEQS[r]], "{} takes the oldest", RPCS[r]);
                            for id in &got {
                                model.get_mut(id).leased[r] = true;
                            }
                            held.push((r, batch));
                        }
                        Some(Err(e)) => prop_assert!(false, "get: {}", e),
                        None => prop_assert!(want.len() < N_SEQS[r], "{} waited with {:?} eligible", RPCS[r], want),
                    }
                }
                Op::Complete(pick) => {
                    if held.is_empty() { continue; }
                    let (r, batch) = held.remove(pick % held.len());
                    let ids: Vec<String> = batch.ids().map(|i| i.to_string()).collect();
                    let handles = batch.handles().to_vec();
                    let result = match OUTPUT[r] {
                        Some((key, _)) => {
                            let out = ids.iter().map(|_| Patch::new().with(key, 1i32)).collect();
                            poll_once(batch.complete(out))
                        }
                        None => poll_once(batch.commit()),
                    };
                    prop_assert_eq!(result, Some(Ok(())));
                    model.finish(r, &ids, true);
                    for (id, h) in ids.iter().zip(handles) {
                        if !model.samples.iter().any(|s| &s.id == id) {
                            freed_handles.push(h);
                        }
                    }
                }
                Op::Release(pick) => {
                    if held.is_empty() { continue; }
                    let (r, batch) = held.remove(pick % held.len());
                    let ids: Vec<String> = batch.ids().map(|i| i.to_string()).collect();
                    drop(batch);
                    model.finish(r, &ids, false);
                }
                Op::Amend(pick) => {
                    if model.samples.is_empty() { continue; }
                    let i = pick % model.samples.len();
                    let h = model.samples[i].handle;
                    let r = poll_once(buf.amend_batch(&[h], vec![Patch::new().with("score", 1.0f64)]));
                    prop_assert_eq!(r, Some(Ok(())));
                    model.samples[i].keys |= 0b1000;
                }
                Op::AmendFreed => {
                    let Some(&h) = freed_handles.last() else { continue; };
                    let r = poll_once(buf.amend_batch(&[h], vec![Patch::new().with("score", 2.0f64)]));
                    prop_assert!(matches!(r, Some(Err(Error::StaleHandle { .. }))), "{:?}", r);
                }
            }
            assert_invariants(&buf);
            let st = buf.stats();
            prop_assert_eq!(buf.len(), model.samples.len());
            for (r, (rpc, name)) in st.rpcs.iter().zip(RPCS).enumerate() {
                prop_assert_eq!(rpc.eligible, model.eligible(r).len(), "{} eligible", name);
                let leased = model.samples.iter().filter(|s| s.leased[r]).count();
                prop_assert_eq!(rpc.leased, leased, "{} leased", name);
            }
        }
    }
}
