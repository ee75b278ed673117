//! proptest: random sequences of puts, amends, completions, commits, releases and reopens
//! of a `Durability::Sync` buffer; every reopen must give back exactly the buffer that was
//! dropped (every sample, its fields and reads left, and `stats()`), with checkpoints
//! taken at random points in between.
#![cfg(feature = "persist")]

mod common;

use proptest::prelude::*;
use rollout_buffer::persist::{PersistOptions, Store};
use rollout_buffer::{BufferConfig, Patch, Sample, SequenceBuffer, SlotHandle};

#[derive(Debug, Clone)]
enum Op {
    /// Put this many new samples.
    Put(usize),
    /// Amend the sample at this index of the handles put so far (if still stored).
    Amend(usize, f64),
    /// Lease a batch for RPC `r` if it has one ready, then complete / commit it (true) or
    /// drop it (false).
    Serve(usize, bool),
    /// Drop the buffer and open the store again.
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..4).prop_map(Op::Put),
        2 => (0usize..64, -1.0f64..1.0).prop_map(|(i, v)| Op::Amend(i, v)),
        4 => (0usize..3, prop::bool::weighted(0.8)).prop_map(|(r, done)| Op::Serve(r, done)),
        1 => Just(Op::Reopen),
    ]
}

const RPCS: [&str; 3] = ["gen", "reward", "train"];

fn config() -> BufferConfig {
    common::gen_reward_train(&["tokens", "reward", "score"])
}

async fn open(store: &Store, checkpoint_bytes: u64) -> SequenceBuffer {
    let options = PersistOptions::new()
        .archive(None)
        .checkpoint_bytes(checkpoint_bytes);
    SequenceBuffer::open_in(store.clone(), config(), options)
        .await
        .expect("opens")
}

async fn run(ops: Vec<Op>, checkpoint_bytes: u64) {
    let store = Store::open("memory://").expect("memory store");
    let mut buf = open(&store, checkpoint_bytes).await;
    let mut handles: Vec<SlotHandle> = Vec::new();
    let mut next = 0usize;
    for op in ops {
        match op {
            Op::Put(n) => {
                // Only puts that fit: a rejected put counts in `rejected`, which a restart
                // does not keep.
                if buf.stats().empty < n {
                    continue;
                }
                let samples: Vec<Sample> = (next..next + n)
                    .map(|i| Sample::new(format!("s{i}")).with("prompt", vec![i as i32]))
                    .collect();
                next += n;
                handles.extend(buf.try_put_batch(samples).await.expect("fits"));
            }
            Op::Amend(i, v) => {
                if let Some(&h) = handles.get(i % handles.len().max(1)) {
                    // A handle whose sample was freed is stale: an error, nothing applied.
                    let _ = buf
                        .amend_batch(&[h], vec![Patch::new().with("score", v)])
                        .await;
                }
            }
            Op::Serve(r, done) => {
                let stats = buf.stats();
                let n_seqs = [2, 1, 2][r];
                if stats.rpcs[r].eligible < n_seqs {
                    continue;
                }
                let batch = buf.get_batch_for_rpc(RPCS[r]).await.expect("ready");
                if !done {
                    drop(batch);
                } else if r == 2 {
                    batch.commit().await.expect("commit");
                } else {
                    let key = if r == 0 { "tokens" } else { "reward" };
                    let out = batch
                        .samples()
                        .map(|s| Patch::new().with(key, vec![s.id().as_str().len() as i32]))
                        .collect();
                    batch.complete(out).await.expect("complete");
                }
            }
            Op::Reopen => {
                let (contents, stats) = (buf.contents(), buf.stats());
                // Releases are logged without waiting; flushing writes them and lets any
                // checkpoint finish, so the store is quiet when it is opened again.
                buf.flush().await.expect("flush");
                drop(buf);
                buf = open(&store, checkpoint_bytes).await;
                common::assert_invariants(&buf);
                assert_eq!(buf.contents(), contents);
                assert_eq!(buf.stats(), stats);
                // Handles do not survive a restart; fresh ones come with new puts.
                handles.clear();
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn reopening_gives_back_exactly_the_buffer_that_was_dropped(
        ops in prop::collection::vec(op(), 1..80),
        checkpoint_often in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let checkpoint_bytes = if checkpoint_often { 1 } else { 64 << 20 };
        rt.block_on(run(ops, checkpoint_bytes));
    }
}
