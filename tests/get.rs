//! get: exactly n_seqs, selection order, only input keys, readiness by key arrival,
//! independent RPCs, reads per sample.

mod common;
use common::*;
use rollout_buffer::{Error, Patch, RpcDef, Sample, Selection, SequenceBuffer};
use std::time::Duration;

fn births_buffer(selection: Selection) -> SequenceBuffer {
    SequenceBuffer::new(8, [RpcDef::new("r", 3).inputs(["x"]).selection(selection)]).expect("valid")
}

fn with_births(births: &[u64]) -> Vec<Sample> {
    births
        .iter()
        .enumerate()
        .map(|(i, &b)| Sample::new(format!("s{i}")).birth(b).with("x", 0i32))
        .collect()
}

#[tokio::test]
async fn fifo_takes_oldest_first_and_ties_in_put_order() {
    let buf = births_buffer(Selection::Fifo);
    buf.put_batch(with_births(&[5, 5, 5, 1, 5, 5]))
        .await
        .expect("put");
    let b = buf.get_batch_for_rpc("r").await.expect("get");
    assert_eq!(ids(&b), ["s3", "s0", "s1"]);
    assert_eq!(b.len(), 3);
    let births: Vec<_> = b.samples().map(|s| s.birth()).collect();
    assert_eq!(births, [1, 5, 5]);
    b.commit().await.expect("commit");
    let b = buf.get_batch_for_rpc("r").await.expect("get");
    assert_eq!(ids(&b), ["s2", "s4", "s5"]);
}

#[tokio::test]
async fn lifo_takes_newest_first() {
    let buf = births_buffer(Selection::Lifo);
    buf.put_batch(with_births(&[10, 30, 20, 30]))
        .await
        .expect("put");
    let b = buf.get_batch_for_rpc("r").await.expect("get");
    assert_eq!(ids(&b), ["s3", "s1", "s2"]);
}

#[tokio::test]
async fn default_births_follow_put_order() {
    let buf = births_buffer(Selection::Fifo);
    for i in 0..3 {
        buf.put_batch(vec![Sample::new(format!("s{i}")).with("x", 0i32)])
            .await
            .expect("put");
    }
    let b = buf.get_batch_for_rpc("r").await.expect("get");
    assert_eq!(ids(&b), ["s0", "s1", "s2"]);
}

#[tokio::test(start_paused = true)]
async fn batch_carries_only_input_keys_and_exactly_n_seqs() {
    let buf = ppo(8, 2);
    let samples: Vec<Sample> = (0..3)
        .map(|i| {
            prompt(i)
                .with("tokens", vec![4i32])
                .with("extra", 1u8)
                .meta("env", "math")
        })
        .collect();
    buf.put_batch(samples).await.expect("put");
    let b = buf.get_batch_for_rpc("gen").await.expect("get");
    assert_eq!(b.len(), 2);
    for s in b.samples() {
        assert_eq!(s.keys().collect::<Vec<_>>(), ["prompt"]);
        assert_eq!(s.get_meta("env"), Some(&"math".into()));
    }
    let r = buf
        .get_batch_for_rpc("reward")
        .await
        .expect("tokens were put");
    assert_eq!(
        r.sample(0).expect("sample").keys().collect::<Vec<_>>(),
        ["tokens"]
    );
    // One sample left for gen: n_seqs 2 cannot be met, so the get waits.
    assert!(matches!(
        buf.get_batch_for_rpc_timeout("gen", Duration::from_secs(1))
            .await,
        Err(Error::Timeout { .. })
    ));
}

#[tokio::test]
async fn unknown_rpc_is_an_error() {
    let buf = ppo(4, 1);
    assert_eq!(
        buf.get_batch_for_rpc("nope").await.err(),
        Some(Error::UnknownRpc {
            name: "nope".into()
        })
    );
}

#[tokio::test]
async fn readiness_follows_key_arrival() {
    let buf = SequenceBuffer::with_config(
        rollout_buffer::BufferConfig::new(8)
            .rpc(RpcDef::new("gen", 1).inputs(["prompt"]).outputs(["tokens"]))
            .rpc(RpcDef::new("score", 1).inputs(["tokens", "verdict"]))
            .rpc(RpcDef::new("any", 1)) // no inputs: ready at put
            .external_keys(["verdict"]),
    )
    .expect("valid");
    let h = buf
        .put_batch(vec![prompt("a").with("unrelated", 1i64)])
        .await
        .expect("put");
    let eligible = |buf: &SequenceBuffer| -> Vec<usize> {
        buf.stats().rpcs.iter().map(|r| r.eligible).collect()
    };
    assert_eq!(
        eligible(&buf),
        [1, 0, 1],
        "gen and the input-less RPC are ready at put"
    );
    let any = buf.get_batch_for_rpc("any").await.expect("get");
    assert_eq!(any.sample(0).expect("sample").keys().count(), 0);
    any.commit().await.expect("commit");

    // By amend: verdict alone is not enough for score.
    buf.amend_batch(&h, vec![Patch::new().with("verdict", true)])
        .await
        .expect("amend");
    assert_eq!(eligible(&buf), [1, 0, 0]);
    // By complete: tokens arrive, score becomes ready at that moment.
    let gen = buf.get_batch_for_rpc("gen").await.expect("get");
    let out = vec![Patch::new().with("tokens", vec![1i32])];
    gen.complete(out).await.expect("complete");
    assert_eq!(eligible(&buf), [0, 1, 0]);
    let s = buf.get_batch_for_rpc("score").await.expect("get");
    assert_eq!(
        s.sample(0).expect("sample").keys().collect::<Vec<_>>(),
        ["verdict", "tokens"]
    );
    s.commit().await.expect("commit");
    assert!(buf.is_empty(), "every RPC used its read: slot freed");
    assert_invariants(&buf);
}

#[tokio::test]
async fn rpcs_with_shared_inputs_read_independently() {
    let buf = SequenceBuffer::new(
        8,
        [
            RpcDef::new("a", 2).inputs(["x"]).outputs(["ya"]),
            RpcDef::new("b", 3).inputs(["x"]).outputs(["yb"]),
            RpcDef::new("c", 2).inputs(["ya", "yb"]),
        ],
    )
    .expect("valid");
    let samples = (0..4)
        .map(|i| Sample::new(i.to_string()).with("x", 0i32))
        .collect();
    buf.put_batch(samples).await.expect("put");
    let a1 = buf.get_batch_for_rpc("a").await.expect("a");
    let b1 = buf.get_batch_for_rpc("b").await.expect("b");
    assert_eq!(ids(&a1), ["0", "1"]);
    assert_eq!(ids(&b1), ["0", "1", "2"], "b is not affected by a's lease");
    let out_a = patches(&a1, "ya");
    a1.complete(out_a).await.expect("complete");
    let a2 = buf.get_batch_for_rpc("a").await.expect("a again");
    assert_eq!(ids(&a2), ["2", "3"]);
    assert_invariants(&buf);
}

#[tokio::test(start_paused = true)]
async fn each_rpc_uses_each_sample_reads_times_then_frees() {
    let buf = SequenceBuffer::new(
        4,
        [
            RpcDef::new("once", 1).inputs(["x"]),
            RpcDef::new("twice", 1).inputs(["x"]).reads(2),
        ],
    )
    .expect("valid");
    buf.put_batch(vec![Sample::new("s").with("x", 0i32)])
        .await
        .expect("put");
    common::commit_next(&buf, "twice").await;
    common::commit_next(&buf, "once").await;
    assert_eq!(buf.len(), 1, "twice has one read left");
    assert!(matches!(
        buf.get_batch_for_rpc_timeout("once", Duration::from_secs(1))
            .await,
        Err(Error::Timeout { .. })
    ));
    let b = buf.get_batch_for_rpc("twice").await.expect("2nd");
    assert_eq!(ids(&b), ["s"]);
    b.commit().await.expect("commit");
    assert_eq!(buf.len(), 0);
    let st = buf.stats();
    assert_eq!((st.put, st.read, st.freed), (1, 3, 1));
    assert_invariants(&buf);
}

/// A batch names its RPC's declared outputs, the keys `complete` takes (none for the
/// last reader).
#[tokio::test]
async fn a_batch_names_its_rpcs_outputs() {
    let buf = ppo(4, 1);
    buf.put_batch(prompts("s", 1)).await.expect("put");
    let gen = buf.get_batch_for_rpc("gen").await.expect("gen");
    assert_eq!(gen.output_keys(), ["tokens"]);
    gen.complete(vec![Patch::new().with("tokens", vec![1i32, 2])])
        .await
        .expect("complete");
    let reward = buf.get_batch_for_rpc("reward").await.expect("reward");
    assert_eq!(reward.output_keys(), ["reward"]);
    reward
        .complete(vec![Patch::new().with("reward", 1.0f64)])
        .await
        .expect("complete");
    let train = buf.get_batch_for_rpc("train").await.expect("train");
    assert!(train.output_keys().is_empty());
    train.commit().await.expect("commit");
}

/// A waiting getter shows in the RPC's `waiting` count while it waits, and leaves it when
/// served or when its future is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_getter_counts_as_waiting_only_while_it_waits() {
    let buf = births_buffer(Selection::Fifo);
    let waiting = |buf: &SequenceBuffer| buf.stats().rpcs[0].waiting;
    let getter = tokio::spawn({
        let buf = buf.clone();
        async move { buf.get_batch_for_rpc("r").await }
    });
    wait_until(|| waiting(&buf) == 1).await;
    buf.put_batch(with_births(&[1, 2, 3])).await.expect("put");
    // Held, so the next getter finds nothing.
    let held = getter.await.expect("join").expect("served");
    assert_eq!(held.len(), 3);
    assert_eq!(waiting(&buf), 0, "served");

    let cancelled = tokio::time::timeout(Duration::from_millis(20), buf.get_batch_for_rpc("r"));
    assert!(cancelled.await.is_err(), "nothing to serve: it waits");
    assert_eq!(waiting(&buf), 0, "dropped");
    drop(held);
}
