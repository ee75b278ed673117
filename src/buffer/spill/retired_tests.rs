//! Retired segments are deleted whoever takes them off the retired list: a put whose
//! claim fails takes them too (with any samples it evicted), and must hand them on.

// `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot fail
// (an in-memory store, a runtime, data the test built); library code has none
// (tests/layout.rs checks).

use super::super::{BufferConfig, SequenceBuffer};
use super::{Segment, SpillFuture, SpillStore};
use crate::rpc_defs::RpcDef;
use crate::sample::{FieldKey, Fields, Sample};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use crate::Error;
use std::collections::HashMap;
use std::time::Duration;

/// A spill store in memory whose reads keep the segment they read (as a read still in
/// flight holds it) until the test lets go.
#[derive(Debug, Default)]
struct HoldingStore {
    next: AtomicU64,
    segments: Arc<Mutex<HashMap<u64, Vec<Fields>>>>,
    held: Arc<Mutex<Vec<Arc<Segment>>>>,
}

impl SpillStore for HoldingStore {
    fn write(&self, rows: Vec<Fields>) -> SpillFuture<Arc<Segment>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let n = rows.len() as u32;
        self.segments.lock().insert(id, rows);
        Box::pin(std::future::ready(Ok(self.segment(id, n))))
    }

    fn read(
        &self,
        segment: Arc<Segment>,
        rows: Vec<u32>,
        keys: Vec<FieldKey>,
    ) -> SpillFuture<Vec<Fields>> {
        let stored = self.segments.lock().get(&segment.id).cloned();
        self.held.lock().push(segment);
        let out = stored.unwrap_or_default();
        let read = rows
            .iter()
            .map(|&r| {
                out.get(r as usize).map_or_else(Fields::default, |f| {
                    f.filtered(|k| keys.iter().any(|want| want.as_str() == k))
                })
            })
            .collect();
        Box::pin(std::future::ready(Ok(read)))
    }

    fn delete(&self, segment: Arc<Segment>) -> SpillFuture<()> {
        self.segments.lock().remove(&segment.id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn segment(&self, id: u64, rows: u32) -> Arc<Segment> {
        Arc::new(Segment {
            id,
            path: format!("spill/{id}"),
            rows,
        })
    }
}

/// A sample whose `tokens` spill (over the smallest spilled field).
fn big(i: u64) -> Sample {
    Sample::new(i).with("tokens", vec![i as i32; 1024])
}

/// A sample too small to spill.
fn small(id: &str) -> Sample {
    Sample::new(id).with("tokens", vec![0i32; 4])
}

/// Segments left in the store.
type Segments = Arc<Mutex<HashMap<u64, Vec<Fields>>>>;

/// A buffer of two slots holding the small samples `stored`, and in its store a spill
/// segment no sample needs that only a read held: retired, and swept by no one since the
/// read let go, so the next call to take the retired segments is the one under test.
async fn with_an_unswept_segment(stored: &[&str]) -> (SequenceBuffer, Segments) {
    let store = Arc::new(HoldingStore::default());
    let (segments, held) = (Arc::clone(&store.segments), Arc::clone(&store.held));
    let mut config = BufferConfig::new(2)
        .rpc(RpcDef::new("train", 2).inputs(["tokens"]))
        .memory_budget(4096);
    config.spill_store = Some(store);
    let buf = SequenceBuffer::build(config, false).expect("buffer");
    // The second sample does not fit the budget beside the first: the first is spilled.
    buf.put_batch(vec![big(0)]).await.expect("put");
    buf.put_batch(vec![big(1)]).await.expect("put");
    assert_eq!(buf.stats().spill.spilled_samples, 1);
    assert_eq!(segments.lock().len(), 1);
    // The get loads the spilled sample (the read holds its segment); the commit frees
    // both, retiring the segment while the read still holds it.
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    batch.commit().await.expect("commit");
    assert_eq!(held.lock().len(), 1, "the load read the segment");
    for &id in stored {
        buf.put_batch(vec![small(id)]).await.expect("put");
    }
    held.lock().clear();
    assert_eq!(segments.lock().len(), 1, "nothing deleted it yet");
    (buf, segments)
}

/// After `flush`, the store holds no segment.
async fn assert_deleted(buf: &SequenceBuffer, segments: &Segments) {
    buf.flush().await.expect("flush");
    assert_eq!(
        segments.lock().len(),
        0,
        "a segment no sample needs was never deleted: {:?}",
        buf.stats().spill
    );
}

#[tokio::test]
async fn a_put_refused_for_a_duplicate_id_hands_on_the_retired_segments_it_took() {
    let (buf, segments) = with_an_unswept_segment(&["a"]).await;
    let refused = buf.try_put_batch(vec![small("a")]).await;
    assert!(
        matches!(refused, Err(Error::DuplicateId { .. })),
        "{refused:?}"
    );
    assert_deleted(&buf, &segments).await;
}

#[tokio::test]
async fn a_put_refused_for_a_full_buffer_hands_on_the_retired_segments_it_took() {
    let (buf, segments) = with_an_unswept_segment(&["a", "b"]).await;
    let refused = buf.try_put_batch(vec![small("c")]).await;
    assert!(matches!(refused, Err(Error::Full { .. })), "{refused:?}");
    assert_deleted(&buf, &segments).await;
}

#[tokio::test(start_paused = true)]
async fn a_put_waiting_for_room_hands_on_the_retired_segments_it_took() {
    let (buf, segments) = with_an_unswept_segment(&["a", "b"]).await;
    let waited = buf
        .put_batch_timeout(vec![small("c")], Duration::from_secs(1))
        .await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    assert_deleted(&buf, &segments).await;
}
