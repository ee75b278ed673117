//! amend: stale handles rejected with nothing applied, concurrent amends both land (later
//! wins per key), and no batch ever sees half an amend.

mod common;
use common::*;
use rollout_buffer::{Error, Patch, RpcDef, SampleView, SequenceBuffer};

fn scored(capacity: usize) -> SequenceBuffer {
    SequenceBuffer::with_config(
        rollout_buffer::BufferConfig::new(capacity)
            .rpc(RpcDef::new("train", 1).inputs(["prompt", "a", "b"]))
            .external_keys(["a", "b"]),
    )
    .expect("valid")
}

fn scalar(s: &SampleView<'_>, key: &str) -> Option<f64> {
    s.get(key).and_then(|t| t.scalar_value::<f64>())
}

#[tokio::test]
async fn stale_handles_are_rejected_and_nothing_is_applied() {
    let buf = scored(2);
    let old = buf.put_batch(vec![prompt("s0")]).await.expect("put");
    let keep = buf.put_batch(vec![prompt("s1")]).await.expect("put");
    let both = Patch::new().with("a", 1.0).with("b", 1.0);
    buf.amend_batch(&old, vec![both.clone()])
        .await
        .expect("amend");
    let t = buf.get_batch_for_rpc("train").await.expect("get");
    assert_eq!(ids(&t), ["s0"]);
    t.commit().await.expect("commit: slot freed");
    // The old handle's slot was freed...
    let err = buf
        .amend_batch(&old, vec![Patch::new().with("a", 2.0)])
        .await;
    assert!(
        matches!(
            err,
            Err(Error::StaleHandle {
                slot: 0,
                generation: 0,
                current: 1
            })
        ),
        "{err:?}"
    );
    let said = err.expect_err("stale").to_string();
    assert!(said.contains("freed or replaced"), "{said}");
    // Handles made from two integers: one to a slot never used says the slot is empty,
    // and one from the future says so, neither that the slot moved on.
    let refusal = |buf: SequenceBuffer, slot, generation| async move {
        let handle = rollout_buffer::SlotHandle::new(slot, generation);
        let patch = vec![Patch::new().with("a", 2.0)];
        let err = buf.amend_batch(&[handle], patch).await.expect_err("stale");
        err.to_string()
    };
    let said = refusal(scored(2), 1, 0).await;
    assert!(
        said.contains("slot 1 generation 0 (the slot holds no sample)"),
        "{said}"
    );
    let said = refusal(buf.clone(), 1, 7).await;
    assert!(
        said.contains("has not reached that generation: it is at 0"),
        "{said}"
    );
    // ...and reused: still stale, and a mixed call applies nothing to the valid handle.
    let reused = buf.put_batch(vec![prompt("s2")]).await.expect("put");
    assert_eq!(reused[0].slot(), old[0].slot());
    let mixed = [keep[0], old[0]];
    let err = buf
        .amend_batch(
            &mixed,
            vec![Patch::new().with("a", 5.0), Patch::new().with("a", 6.0)],
        )
        .await;
    assert!(matches!(err, Err(Error::StaleHandle { .. })));
    assert_eq!(buf.stats().rpcs[0].eligible, 0, "s1 did not get `a`");
    buf.amend_batch(&keep, vec![both]).await.expect("amend");
    let t = buf.get_batch_for_rpc("train").await.expect("get");
    assert_eq!(scalar(&t.sample(0).expect("sample"), "a"), Some(1.0));
    assert!(matches!(
        buf.amend_batch(&keep, vec![]).await,
        Err(Error::LengthMismatch { .. })
    ));
    assert_invariants(&buf);
}

/// A handle that crossed a process or language boundary as its two integers
/// (`SlotHandle::new(slot, generation)`) is the same handle: it amends its sample, round
/// after round of the slot's reuse, and the first round's is refused once the slot moved on.
/// A batch hands out the same handles.
/// One sample twice in one amend is refused, nothing applied: the last patch won silently.
#[tokio::test]
async fn a_handle_twice_in_one_amend_is_refused() {
    let buf = scored(4);
    let h = buf
        .put_batch(vec![prompt("s0"), prompt("s1")])
        .await
        .expect("put");
    let twice = [h[0], h[1], h[0]];
    let patches = [1.0, 2.0, 3.0].map(|v| Patch::new().with("a", v).with("b", v));
    let err = buf.amend_batch(&twice, patches.to_vec()).await;
    assert!(
        matches!(
            err,
            Err(Error::DuplicateHandle {
                first: 0,
                index: 2,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(buf.stats().rpcs[0].eligible, 0, "nothing applied");
    assert_invariants(&buf);
}

#[tokio::test]
async fn a_handle_rebuilt_from_its_two_integers_is_the_same_handle() {
    use rollout_buffer::SlotHandle;
    let buf = scored(1);
    let rebuilt = |h: SlotHandle| SlotHandle::new(h.slot(), h.generation());
    let first = buf.put_batch(vec![prompt("s0")]).await.expect("put")[0];
    let mut last = first;
    for i in 1..4 {
        let both = Patch::new().with("a", 1.0).with("b", 1.0);
        buf.amend_batch(&[rebuilt(last)], vec![both])
            .await
            .unwrap_or_else(|e| panic!("round {i}: {e}"));
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        assert!(!batch.is_empty());
        assert_eq!(batch.handles(), [last], "the batch's handle is the put's");
        batch.commit().await.expect("commit");
        last = buf
            .put_batch(vec![prompt(format!("s{i}"))])
            .await
            .expect("put")[0];
        assert_eq!(last.slot(), first.slot());
    }
    let stale = buf
        .amend_batch(&[rebuilt(first)], vec![Patch::new().with("a", 2.0)])
        .await;
    assert!(matches!(stale, Err(Error::StaleHandle { .. })), "{stale:?}");
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amend_merges_and_later_wins_per_key() {
    let buf = scored(2);
    let h = buf.put_batch(vec![prompt("s")]).await.expect("put");
    // Two tasks on two threads amend the same slot, each its own key, many times.
    let writers: Vec<_> = [("a", "x"), ("b", "y")]
        .into_iter()
        .map(|(key, by)| {
            let (buf, h) = (buf.clone(), h.clone());
            tokio::spawn(async move {
                for i in 0..500 {
                    let p = Patch::new().with(key, f64::from(i)).meta(key, by);
                    buf.amend_batch(&h, vec![p]).await.expect("amend");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("writer");
    }
    let t = buf
        .get_batch_for_rpc("train")
        .await
        .expect("both keys landed");
    let s = &t.sample(0).expect("sample");
    assert_eq!((scalar(s, "a"), scalar(s, "b")), (Some(499.0), Some(499.0)));
    assert_eq!(
        (s.get_meta("a"), s.get_meta("b")),
        (Some(&"x".into()), Some(&"y".into()))
    );
    drop(t);
    // Sequential amends of one key: the later one wins; other keys and metadata stay.
    buf.amend_batch(&h, vec![Patch::new().with("a", 1.0).meta("by", "x")])
        .await
        .expect("amend");
    buf.amend_batch(&h, vec![Patch::new().with("a", 3.0)])
        .await
        .expect("overwrite");
    let t = buf.get_batch_for_rpc("train").await.expect("redelivered");
    let s = &t.sample(0).expect("sample");
    assert_eq!((scalar(s, "a"), scalar(s, "b")), (Some(3.0), Some(499.0)));
    assert_eq!(s.get_meta("by"), Some(&"x".into()));
    // The whole map too, as a batch's views hand it out.
    let keys: Vec<&str> = s.metadata().keys().map(String::as_str).collect();
    assert!(keys.contains(&"by") && keys.contains(&"a"), "{keys:?}");
    assert_invariants(&buf);
}

/// Amends write `a` and `b` together with the same value; a trainer must never see them
/// differ (a half-applied amend), under many concurrent amenders on a multi-thread runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_never_see_a_half_applied_amend() {
    let buf = SequenceBuffer::with_config(
        rollout_buffer::BufferConfig::new(8)
            .rpc(
                RpcDef::new("train", 1)
                    .inputs(["prompt", "a", "b"])
                    .reads(1000),
            )
            .external_keys(["a", "b"]),
    )
    .expect("valid");
    let h = buf.put_batch(vec![prompt("s")]).await.expect("put");
    buf.amend_batch(&h, vec![Patch::new().with("a", 0.0).with("b", 0.0)])
        .await
        .expect("init");
    let mut amenders = Vec::new();
    for task in 0..4 {
        let (buf, h) = (buf.clone(), h.clone());
        amenders.push(tokio::spawn(async move {
            for i in 0..200 {
                let v = f64::from(task * 1000 + i);
                buf.amend_batch(&h, vec![Patch::new().with("a", v).with("b", v)])
                    .await
                    .expect("amend");
            }
        }));
    }
    for _ in 0..500 {
        let t = buf.get_batch_for_rpc("train").await.expect("get");
        let s = &t.sample(0).expect("sample");
        assert_eq!(scalar(s, "a"), scalar(s, "b"), "half-applied amend seen");
        t.commit().await.expect("commit");
    }
    for a in amenders {
        a.await.expect("amender");
    }
    assert_invariants(&buf);
}

#[tokio::test]
async fn amend_of_a_leased_sample_does_not_change_the_batch() {
    let buf = scored(2);
    let h = buf.put_batch(vec![prompt("s")]).await.expect("put");
    buf.amend_batch(&h, vec![Patch::new().with("a", 1.0).with("b", 1.0)])
        .await
        .expect("amend");
    let t = buf.get_batch_for_rpc("train").await.expect("get");
    buf.amend_batch(&h, vec![Patch::new().with("a", 9.0)])
        .await
        .expect("amend while leased");
    assert_eq!(
        scalar(&t.sample(0).expect("sample"), "a"),
        Some(1.0),
        "the batch is a snapshot"
    );
    drop(t);
    let t = buf.get_batch_for_rpc("train").await.expect("redelivered");
    assert_eq!(scalar(&t.sample(0).expect("sample"), "a"), Some(9.0));
    assert_invariants(&buf);
}

#[tokio::test]
async fn the_waiting_report_names_the_keys_samples_lack() {
    let buf = scored(4);
    let handles = buf
        .put_batch(vec![prompt("w0"), prompt("w1"), prompt("w2")])
        .await
        .expect("put");
    buf.amend_batch(&handles[..1], vec![Patch::new().with("a", 1.0)])
        .await
        .expect("amend");
    let report = buf.waiting_report();
    let train = &report[0];
    assert_eq!(
        (&*train.name, train.batch_size, train.eligible),
        ("train", 1, 0)
    );
    assert_eq!(train.incomplete, 3);
    assert_eq!(
        train.missing,
        [("a".to_owned(), 2), ("b".to_owned(), 3)],
        "one sample has `a`, none has `b`"
    );
    buf.amend_batch(&handles[..1], vec![Patch::new().with("b", 1.0)])
        .await
        .expect("amend");
    let train = &buf.waiting_report()[0];
    assert_eq!((train.eligible, train.incomplete), (1, 2));
}
