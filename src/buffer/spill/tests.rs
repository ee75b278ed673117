//! Unit tests of the spill bookkeeping (`SpillState`): when a sparse segment is queued
//! for a rewrite, put off, and queued again; a failed load's registration.

use super::*;

/// A store the bookkeeping never calls (these tests run no spiller or load).
#[derive(Debug)]
struct Unused;

impl SpillStore for Unused {
    fn write(&self, _: Vec<Fields>) -> SpillFuture<Arc<Segment>> {
        Box::pin(std::future::pending())
    }
    fn read(&self, _: Arc<Segment>, _: Vec<u32>, _: Vec<FieldKey>) -> SpillFuture<Vec<Fields>> {
        Box::pin(std::future::pending())
    }
    fn delete(&self, _: Arc<Segment>) -> SpillFuture<()> {
        Box::pin(std::future::pending())
    }
    fn segment(&self, id: u64, rows: u32) -> Arc<Segment> {
        Arc::new(Segment {
            id,
            path: format!("spill/{id}"),
            rows,
        })
    }
}

const SEGMENT: u64 = 7;

/// Bookkeeping holding segment 7 of 16 rows, row `i` the field `tokens` of slot `i`, for
/// the slots in `members`.
fn with_segment(members: &[u32]) -> SpillState {
    let mut spill = SpillState::new(Arc::new(Unused), 16);
    for &slot in members {
        spill.parts[slot as usize] = vec![SpillPart {
            segment: SEGMENT,
            segment_rows: 16,
            row: slot,
            fields: vec![(FieldKey::from("tokens"), 64)],
        }];
    }
    spill.spilled_now = members.len() as u64;
    spill.segments.insert(
        SEGMENT,
        LiveSegment {
            segment: Unused.segment(SEGMENT, 16),
            members: members.iter().copied().collect(),
        },
    );
    spill
}

#[test]
fn a_sparse_segment_put_off_while_a_row_is_leased_is_queued_again_by_a_spill_write() {
    let mut spill = with_segment(&[0, 1, 2, 3]);
    spill.release_row(SEGMENT, 3);
    assert!(spill.compact_due, "3 live rows of 16 is sparse");
    assert_eq!(spill.next_sparse(|slot| slot == 0), None, "row 0 is leased");
    assert_eq!(spill.next_sparse(|_| false), None, "put off, not queued");
    spill.requeue_deferred();
    assert_eq!(spill.next_sparse(|_| false), Some(SEGMENT));
    assert_eq!(spill.next_sparse(|_| false), None, "taken once");
}

#[test]
fn a_put_off_segment_is_queued_again_by_the_next_free_of_one_of_its_rows() {
    let mut spill = with_segment(&[0, 1, 2, 3]);
    spill.release_row(SEGMENT, 3);
    assert_eq!(spill.next_sparse(|slot| slot == 0), None);
    spill.release_row(SEGMENT, 2);
    assert_eq!(spill.next_sparse(|_| false), Some(SEGMENT));
}

#[test]
fn a_segment_not_yet_sparse_is_not_queued() {
    let mut spill = with_segment(&[0, 1, 2, 3, 4]);
    spill.release_row(SEGMENT, 4);
    assert!(
        !spill.compact_due,
        "4 live rows of 16 is not below one in four"
    );
    spill.requeue_deferred();
    assert_eq!(spill.next_sparse(|_| false), None);
}

#[test]
fn a_failed_load_is_forgotten_so_the_next_get_reads_again() {
    let mut spill = with_segment(&[0, 1, 2, 3]);
    let keys: Vec<Arc<str>> = vec![Arc::from("tokens")];
    let mut plan = LoadPlan::default();
    let first = spill.register([(1, Generation::default())], &keys, false, &mut plan);
    let Some(Some(cell)) = first.first() else {
        panic!("slot 1 has a spilled input: {first:?}");
    };
    let cell = Arc::clone(cell);
    // A second get of the same sample shares the load in flight.
    let shared = spill.register([(1, Generation::default())], &keys, false, &mut plan);
    assert!(matches!(shared.first(), Some(Some(c)) if Arc::ptr_eq(c, &cell)));
    assert_eq!(spill.counters.shared_loads, 1);
    spill.failed(1, &cell);
    let again = spill.register([(1, Generation::default())], &keys, false, &mut plan);
    assert!(
        matches!(again.first(), Some(Some(c)) if !Arc::ptr_eq(c, &cell)),
        "a new load, not the failed one"
    );
    assert_eq!(spill.counters.loaded_samples, 2);
    drop(plan);
}

#[test]
fn a_segment_whose_last_row_is_released_is_retired_and_counted() {
    let mut spill = with_segment(&[0, 1]);
    spill.release_row(SEGMENT, 0);
    assert_eq!(spill.counters.segments_deleted, 0, "row 1 still needs it");
    assert!(spill.retired.is_empty());
    spill.release_row(SEGMENT, 1);
    assert_eq!(spill.counters.segments_deleted, 1);
    assert_eq!(spill.retired.len(), 1, "queued for deletion");
    assert!(!spill.segments.contains_key(&SEGMENT));
    spill.release_row(SEGMENT, 1);
    assert_eq!(spill.counters.segments_deleted, 1, "released once only");
}
