//! The batch log: a (RPC, step) always gives the same samples, in this process, in another
//! run with the same seed, and after a crash and recovery.

mod common;

use common::{ids, TempDir};
use rollout_buffer::persist::PersistOptions;
use rollout_buffer::{Error, RpcDef, Sample, Selection, SequenceBuffer, POLICY_VERSION};

fn train(seed: u64) -> RpcDef {
    RpcDef::new("train", 4)
        .inputs(["tokens"])
        .selection(Selection::Uniform { seed })
}

/// 64 samples with fixed births, so two runs hold identical contents.
fn samples() -> Vec<Sample> {
    (0..64)
        .map(|i| {
            Sample::new(format!("s{i:02}"))
                .birth(i + 1)
                .with("tokens", vec![i as i32; 3])
                .meta(POLICY_VERSION, 0i64)
        })
        .collect()
}

/// Steps `from..to`, each batch committed; returns their ids.
async fn run_steps(buf: &SequenceBuffer, from: u64, to: u64) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for step in from..to {
        let batch = buf.get_batch_for_step("train", step).await.expect("get");
        assert_eq!(batch.step(), Some(step));
        out.push(ids(&batch));
        batch.commit().await.expect("commit");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_replays_until_used_then_is_consumed() {
    let buf = SequenceBuffer::new(64, [train(1)]).expect("config");
    buf.put_batch(samples()).await.expect("put");
    let first = buf.get_batch_for_step("train", 7).await.expect("get");
    let chosen = ids(&first);
    drop(first); // a trainer that died holding it
    let again = buf.get_batch_for_step("train", 7).await.expect("replay");
    assert_eq!(ids(&again), chosen);
    // While it is held, the step waits instead of being served twice.
    let err = buf
        .get_batch_for_step_timeout("train", 7, std::time::Duration::from_millis(20))
        .await
        .expect_err("held");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    again.commit().await.expect("commit");
    let err = buf.get_batch_for_step("train", 7).await.expect_err("used");
    assert!(matches!(err, Error::StepConsumed { step: 7, .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_gives_the_same_batches_in_two_runs() {
    let mut runs = Vec::new();
    for seed in [5, 5, 6] {
        let buf = SequenceBuffer::new(64, [train(seed)]).expect("config");
        buf.put_batch(samples()).await.expect("put");
        runs.push(run_steps(&buf, 0, 12).await);
    }
    assert_eq!(runs[0], runs[1]);
    assert_ne!(runs[0], runs[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_batches_across_a_crash_and_recovery() {
    let reference = {
        let buf = SequenceBuffer::new(64, [train(9)]).expect("config");
        buf.put_batch(samples()).await.expect("put");
        run_steps(&buf, 0, 10).await
    };
    let dir = TempDir::new("steps-crash");
    let open = || SequenceBuffer::open(dir.path(), 64, [train(9)], PersistOptions::default());
    let held = {
        let buf = open().await.expect("open");
        buf.put_batch(samples()).await.expect("put");
        let before = run_steps(&buf, 0, 4).await;
        assert_eq!(before, reference[..4]);
        // Step 4 is handed out, then the process dies before training on it.
        let batch = buf.get_batch_for_step("train", 4).await.expect("get");
        let held = ids(&batch);
        std::mem::forget(batch);
        held
    };
    let buf = open().await.expect("recover");
    let after = run_steps(&buf, 4, 10).await;
    assert_eq!(after[0], held, "step 4 replays what was handed out");
    assert_eq!(after, reference[4..]);
    let err = buf.get_batch_for_step("train", 2).await.expect_err("used");
    assert!(matches!(err, Error::StepConsumed { step: 2, .. }), "{err}");
    buf.flush().await.expect("flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_samples_went_stale_is_unavailable() {
    let buf = SequenceBuffer::new(64, [train(1).max_staleness(0)]).expect("config");
    buf.set_policy_version(0).expect("version");
    buf.put_batch(samples()).await.expect("put");
    drop(buf.get_batch_for_step("train", 0).await.expect("get"));
    buf.set_policy_version(1).expect("raise");
    let err = buf.get_batch_for_step("train", 0).await.expect_err("stale");
    assert!(
        matches!(&err, Error::StepUnavailable { step: 0, detail, .. } if detail.contains("no longer")),
        "{err}"
    );
}

/// `train` (the second RPC, so a slot's counts for it sit between two slots' counts for
/// `ref`) and `ref`, which keeps the samples stored after `train` is done with them.
fn train_and_ref(train: RpcDef) -> [RpcDef; 2] {
    [RpcDef::new("ref", 4).inputs(["tokens"]), train]
}

fn cannot_be_served(err: &Error) -> bool {
    matches!(err, Error::StepUnavailable { step: 0, detail, .. } if detail.contains("can no longer be served"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_samples_were_read_for_the_last_time_is_unavailable() {
    // Oldest first, two a batch: the step's batch is the second pair (`s02`, `s03`), and
    // the first pair keeps its read for `train`, so a check that looked at another
    // sample's count than the step's own would find reads left.
    let fifo = RpcDef::new("train", 2).inputs(["tokens"]);
    let buf = SequenceBuffer::new(8, train_and_ref(fifo)).expect("config");
    buf.put_batch(samples()[..8].to_vec()).await.expect("put");
    let first_pair = buf.get_batch_for_rpc("train").await.expect("first pair");
    let step = buf.get_batch_for_step("train", 0).await.expect("step 0");
    assert_eq!(ids(&step), ["s02", "s03"]);
    drop(step);
    // An unlogged read takes the step's samples' one read for `train`; `ref` keeps them.
    let read = buf.get_batch_for_rpc("train").await.expect("read");
    assert_eq!(ids(&read), ["s02", "s03"]);
    read.commit().await.expect("commit");
    drop(first_pair);
    assert_eq!(buf.len(), 8, "ref has read none of them");
    let err = buf
        .get_batch_for_step_timeout("train", 0, std::time::Duration::from_secs(20))
        .await
        .expect_err("no reads left");
    assert!(cannot_be_served(&err), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_samples_went_stale_for_its_rpc_alone_is_unavailable() {
    let buf = SequenceBuffer::new(4, train_and_ref(train(1).max_staleness(0))).expect("config");
    buf.set_policy_version(0).expect("version");
    buf.put_batch(samples()[..4].to_vec()).await.expect("put");
    drop(buf.get_batch_for_step("train", 0).await.expect("get"));
    // A sample stale for an RPC that owes it reads is dropped unless held: `ref` holds them.
    let held = buf.get_batch_for_rpc("ref").await.expect("ref leases");
    buf.set_policy_version(1).expect("raise");
    assert_eq!(buf.len(), 4, "held by ref");
    let err = buf
        .get_batch_for_step_timeout("train", 0, std::time::Duration::from_secs(20))
        .await
        .expect_err("stale");
    assert!(cannot_be_served(&err), "{err}");
    drop(held);
}
