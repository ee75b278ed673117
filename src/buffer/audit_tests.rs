//! Unit tests of the buffer's audit (`check_invariants` over the payloads and the id
//! index): each breaks one thing a valid buffer holds and checks the audit names it. The
//! slot table's own audit has its tests in `src/state/tests/audit.rs`.

// `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot fail
// (an in-memory store, a runtime, data the test built); library code has none
// (tests/layout.rs checks).

use super::*;
use crate::tensor::Tensor;

/// A buffer of 4 slots holding the samples `a` (slot 0) and `b` (slot 1), each with a
/// `prompt`.
async fn two_stored() -> SequenceBuffer {
    let buf = SequenceBuffer::new(4, [RpcDef::new("train", 1).inputs(["prompt"])]).expect("buffer");
    let prompt = |id: &str| Sample::new(id).with("prompt", Tensor::from(vec![1i32]));
    buf.put_batch(vec![prompt("a"), prompt("b")])
        .await
        .expect("put");
    buf.check_invariants().expect("valid");
    buf
}

/// The audit's complaint after `break_it` changed the buffer's state.
async fn complaint(break_it: impl FnOnce(&mut Inner)) -> String {
    let buf = two_stored().await;
    break_it(&mut buf.shared.inner.lock());
    match buf.check_invariants() {
        Err(Error::InvariantViolated { detail }) => detail,
        other => panic!("the audit let it pass: {other:?}"),
    }
}

#[tokio::test]
async fn a_stored_slot_without_its_sample_is_named() {
    let detail = complaint(|inner| inner.samples[1] = None).await;
    assert!(detail.contains("slot 1: stored true"), "{detail}");
}

#[tokio::test]
async fn a_sample_whose_id_points_elsewhere_is_named() {
    let detail = complaint(|inner| {
        inner.ids.insert(SampleId::from("a"), 1);
    })
    .await;
    assert!(detail.contains("slot 0: id `a` not indexed"), "{detail}");
}

#[tokio::test]
async fn a_sample_whose_keys_differ_from_the_tables_is_named() {
    let detail = complaint(|inner| inner.samples[0] = Some(Arc::new(Sample::new("a")))).await;
    assert!(detail.contains("slot 0: table keys"), "{detail}");
}

#[tokio::test]
async fn an_id_indexed_for_no_slot_is_named() {
    let detail = complaint(|inner| {
        inner.ids.insert(SampleId::from("ghost"), 3);
    })
    .await;
    assert!(detail.contains("3 ids indexed for 2"), "{detail}");
}
