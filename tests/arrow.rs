//! Samples to Arrow record batches and back: natural column types, exact round trips
//! (checked by proptest over random shapes and element types), typed errors.
#![cfg(feature = "arrow")]

mod common;
use arrow_array::{Array, Int32Array, ListArray, RecordBatch, StringArray};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema};
use common::*;
use ndarray::{array, ArrayD, IxDyn};
use proptest::prelude::*;
use rollout_buffer::arrow::{from_record_batch, to_record_batch};
use rollout_buffer::{Error, MetaValue, Sample, Tensor};
use std::sync::Arc;

fn assert_round_trip(samples: &[Sample]) -> RecordBatch {
    let batch = to_record_batch(samples).unwrap_or_else(|e| panic!("to arrow: {e}"));
    let back = from_record_batch(&batch).unwrap_or_else(|e| panic!("from arrow: {e}"));
    assert_eq!(back, samples, "field order aside, samples come back equal");
    batch
}

fn column_type(batch: &RecordBatch, name: &str) -> String {
    match batch.schema().field_with_name(name) {
        Ok(f) => f.data_type().to_string(),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn rollout_columns_have_the_natural_types() {
    let rollout = |i: i32| {
        Sample::new(format!("r{i}"))
            .birth(10 + i as u64)
            .with("tokens", vec![i, i + 1, i + 2])
            .with("logprobs", vec![-0.5f32, -1.25])
            .with("reward", f64::from(i))
            .with(
                "answers",
                Tensor::ragged(vec![1i32, 2, 3], vec![1, 2]).expect("ragged"),
            )
            .with("prompt", "What is 2 + 2?")
            .meta("environment", "math")
            .meta("policy_version", 3i64)
    };
    let batch = assert_round_trip(&[rollout(0), rollout(1)]);
    assert_eq!(column_type(&batch, "id"), "Utf8");
    assert_eq!(column_type(&batch, "birth"), "UInt64");
    assert_eq!(column_type(&batch, "tokens"), "List(non-null Int32)");
    assert_eq!(column_type(&batch, "logprobs"), "List(non-null Float32)");
    assert_eq!(column_type(&batch, "reward"), "Float64");
    assert_eq!(
        column_type(&batch, "answers"),
        "List(non-null List(non-null Int32))"
    );
    assert_eq!(column_type(&batch, "prompt"), "Utf8");
    assert_eq!(column_type(&batch, "environment"), "Utf8");
    assert_eq!(column_type(&batch, "policy_version"), "Int64");
}

#[test]
fn every_element_type_and_shape_round_trips() {
    let s = Sample::new("all")
        .with("i64", array![[1i64, 2, 3], [4, 5, 6]])
        .with(
            "f32_3d",
            ArrayD::from_shape_vec(IxDyn(&[2, 1, 2]), vec![1f32, 2., 3., 4.]).expect("shape"),
        )
        .with("bool", vec![true, false])
        .with("u8", 7u8)
        .with("strings", vec!["a".to_string(), "bc".to_string()])
        .with(
            "ragged_rows",
            Tensor::ragged(array![[1f64, 2.], [3., 4.], [5., 6.]], vec![2, 1]).expect("ragged"),
        )
        .with("empty", Vec::<i32>::new())
        .meta("flag", true)
        .meta("score", 0.25f64);
    let partial = Sample::new("partial")
        .with("bool", vec![false])
        .meta("flag", false);
    let batch = assert_round_trip(&[s, partial]);
    assert_eq!(batch.column_by_name("i64").map(|c| c.null_count()), Some(1));
    assert_eq!(
        column_type(&batch, "f32_3d"),
        "List(non-null List(non-null List(non-null Float32)))"
    );
}

#[test]
fn inconsistent_columns_are_typed_errors() {
    let mixed = [
        Sample::new("a").with("x", 1i32),
        Sample::new("b").with("x", 1.0f32),
    ];
    assert!(matches!(to_record_batch(&mixed), Err(Error::Arrow { column, .. }) if column == "x"));
    let dims = [
        Sample::new("a").with("x", vec![1i32]),
        Sample::new("b").with("x", 1i32),
    ];
    assert!(matches!(to_record_batch(&dims), Err(Error::Arrow { .. })));
    let reserved = [Sample::new("a").with("id", 1i32)];
    assert!(
        matches!(to_record_batch(&reserved), Err(Error::Arrow { column, .. }) if column == "id")
    );
    let clash = [Sample::new("a").with("env", 1i32).meta("env", "math")];
    assert!(matches!(to_record_batch(&clash), Err(Error::Arrow { .. })));
    let meta = [
        Sample::new("a").meta("v", 1i64),
        Sample::new("b").meta("v", "one"),
    ];
    assert!(matches!(to_record_batch(&meta), Err(Error::Arrow { .. })));
    let bool_and_int = [
        Sample::new("a").meta("v", 1i64),
        Sample::new("b").meta("v", true),
    ];
    assert!(matches!(
        to_record_batch(&bool_and_int),
        Err(Error::Arrow { .. })
    ));
}

/// A metadata key holding an integer in some samples and a float in others (a score of 1
/// and one of 0.5) is one column of floats, as a put of Python columns makes it; it had
/// made the export fail.
#[test]
fn integer_and_float_metadata_share_a_column_of_floats() {
    let samples = [
        Sample::new("a").meta("score", 1i64),
        Sample::new("b").meta("score", 0.5f64),
        Sample::new("c"),
        Sample::new("d").meta("score", -(1i64 << 40)),
    ];
    let batch = to_record_batch(&samples).expect("to arrow");
    assert_eq!(column_type(&batch, "score"), "Float64");
    let back = from_record_batch(&batch).expect("from arrow");
    let scores: Vec<Option<&MetaValue>> = back.iter().map(|s| s.get_meta("score")).collect();
    assert_eq!(
        scores,
        [
            Some(&MetaValue::Float(1.0)),
            Some(&MetaValue::Float(0.5)),
            None,
            Some(&MetaValue::Float(-(2f64.powi(40)))),
        ]
    );
    // Integers alone stay integers; integers past 2^53 never become floats (rounded).
    let ints = to_record_batch(&samples[..1]).expect("to arrow");
    assert_eq!(column_type(&ints, "score"), "Int64");
    let big = [
        Sample::new("a").meta("ts", (1i64 << 60) + 1),
        Sample::new("b").meta("ts", 0.5f64),
    ];
    assert!(matches!(to_record_batch(&big), Err(Error::Arrow { column, .. }) if column == "ts"));
}

#[test]
fn foreign_batches_are_read_or_rejected_by_column() {
    let ids = Arc::new(StringArray::from(vec!["a", "b"]));
    let item = Arc::new(Field::new_list_field(DataType::Int32, false));
    // Row "a" is [[1, 2], [3]]: too irregular for a dense 2-d tensor.
    let inner = ListArray::new(
        Arc::clone(&item),
        OffsetBuffer::from_lengths([2, 1, 1]),
        Arc::new(Int32Array::from(vec![1, 2, 3, 4])),
        None,
    );
    let outer_field = Arc::new(Field::new_list_field(DataType::List(item), false));
    let outer = ListArray::new(
        outer_field,
        OffsetBuffer::from_lengths([2, 1]),
        Arc::new(inner),
        None,
    );
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("grid", outer.data_type().clone(), true),
    ]);
    let batch = RecordBatch::try_new(Arc::new(schema), vec![ids, Arc::new(outer)]).expect("batch");
    match from_record_batch(&batch) {
        Err(Error::Arrow { column, detail }) => {
            assert_eq!(column, "grid");
            assert!(detail.contains("row 0"), "{detail}");
        }
        other => panic!("expected an Arrow error, got {other:?}"),
    }
    let no_id = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)])),
        vec![Arc::new(Int32Array::from(vec![1]))],
    )
    .expect("batch");
    assert!(
        matches!(from_record_batch(&no_id), Err(Error::Arrow { column, .. }) if column == "id")
    );
}

#[tokio::test]
async fn a_leased_batch_exports_its_input_fields() {
    let buf = ppo(4, 2);
    buf.put_batch(vec![
        prompt("a").with("tokens", vec![5i32]),
        prompt("b").with("tokens", vec![6i32]),
    ])
    .await
    .expect("put");
    let b = buf.get_batch_for_rpc("reward").await.expect("get");
    let rb = b.to_record_batch().expect("arrow");
    let names: Vec<String> = rb
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["id", "birth", "tokens"]);
    let out = patches(&b, "reward");
    b.complete(out).await.expect("complete");
}

/// A random column: element type, dimensions, raggedness; each sample gets its own shape.
#[derive(Debug, Clone)]
struct Column {
    dtype: u8,
    ndim: usize,
    ragged: bool,
    transposed: bool,
}

fn tensor(col: &Column, dims: &[usize], lengths: &[usize], seed: u32) -> Tensor {
    let ndim = col.ndim.max(usize::from(col.ragged));
    let mut lengths = lengths.to_vec();
    if col.ragged && ndim >= 2 && lengths.iter().sum::<usize>() == 0 {
        lengths[0] = 1; // an empty first dimension would hide the inner ones
    }
    let mut shape: Vec<usize> = dims.iter().take(ndim).copied().collect();
    if col.ragged {
        shape[0] = lengths.iter().sum();
    }
    let n: usize = shape.iter().product();
    let shape = IxDyn(&shape);
    macro_rules! build {
        ($values:expr) => {{
            let a = ArrayD::from_shape_vec(shape, $values).expect("shape matches");
            // A transposed view is not contiguous: exercises the strided copy.
            if col.transposed && !col.ragged && a.ndim() >= 2 {
                Tensor::from(a.reversed_axes())
            } else {
                Tensor::from(a)
            }
        }};
    }
    let t: Tensor = match col.dtype {
        0 => build!((0..n as i32).map(|v| v + seed as i32).collect()),
        1 => build!((0..n).map(|v| v as f32 * 0.5).collect()),
        2 => build!((0..n)
            .map(|v| (v as u32 + seed).is_multiple_of(3))
            .collect()),
        3 => build!((0..n).map(|v| format!("s{v}")).collect()),
        _ => build!((0..n).map(|v| v as i64 - 3).collect()),
    };
    if col.ragged {
        Tensor::ragged(t, lengths).expect("lengths add up")
    } else if col.ndim == 0 {
        match col.dtype {
            0 => Tensor::from(seed as i32),
            1 => Tensor::from(seed as f32),
            2 => Tensor::from(seed.is_multiple_of(2)),
            3 => Tensor::from(format!("v{seed}").as_str()),
            _ => Tensor::from(i64::from(seed)),
        }
    } else {
        t
    }
}

fn meta_value(kind: u8, seed: u32) -> MetaValue {
    match kind {
        0 => MetaValue::Int(i64::from(seed)),
        1 => MetaValue::Float(f64::from(seed) / 8.0),
        2 => MetaValue::Str(format!("m{seed}")),
        _ => MetaValue::Bool(seed.is_multiple_of(2)),
    }
}

proptest! {
    #[test]
    fn random_samples_round_trip(
        columns in prop::collection::vec((0u8..5, 0usize..4, any::<bool>(), any::<bool>()), 1..4),
        metas in prop::collection::vec(0u8..4, 0..3),
        rows in prop::collection::vec(
            (prop::collection::vec(1usize..4, 4), prop::collection::vec(0usize..3, 1..4), any::<u8>(), any::<u32>()),
            1..6,
        ),
    ) {
        let cols: Vec<Column> = columns
            .into_iter()
            .map(|(dtype, ndim, ragged, transposed)| Column { dtype, ndim, ragged, transposed })
            .collect();
        let samples: Vec<Sample> = rows
            .iter()
            .enumerate()
            .map(|(i, (dims, lengths, present, seed))| {
                let s = cols.iter().enumerate().fold(Sample::new(format!("s{i}")).birth(i as u64 + 1), |s, (c, col)| {
                    if present & (1 << c) == 0 { return s; }
                    s.with(format!("c{c}"), tensor(col, dims, lengths, *seed))
                });
                metas.iter().enumerate().fold(s, |s, (m, &kind)| {
                    if present & (1 << (4 + m)) == 0 { return s; }
                    s.meta(&format!("m{m}"), meta_value(kind, *seed))
                })
            })
            .collect();
        let batch = to_record_batch(&samples).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let back = from_record_batch(&batch).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&back, &samples);
        // A slice of the batch (offsets not starting at 0) reads back as the same rows.
        if samples.len() > 1 {
            let tail = from_record_batch(&batch.slice(1, samples.len() - 1))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&tail[..], &samples[1..]);
        }
    }
}

#[test]
fn rows_of_one_column_become_an_arrow_column_without_a_copy() {
    if cfg!(target_endian = "big") {
        return;
    }
    let column = Tensor::from(
        ArrayD::from_shape_vec(IxDyn(&[4, 3]), (0..12).map(|i| i as f32).collect()).expect("shape"),
    );
    let base = column.as_bytes().expect("contiguous").as_ptr();
    let rows = column.rows().expect("rows");
    let samples: Vec<Sample> = rows
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            Sample::new(format!("s{i}"))
                .birth(1 + i as u64)
                .with("x", row)
        })
        .collect();
    let batch = assert_round_trip(&samples);
    let list = batch
        .column_by_name("x")
        .and_then(|c| c.as_any().downcast_ref::<ListArray>())
        .expect("list column");
    let values = list.values().to_data();
    assert_eq!(
        values.buffers()[0].as_ptr(),
        base,
        "the values view the column's memory"
    );
    // Out of order, the same samples are copied into a new values buffer, and still right.
    let reversed: Vec<Sample> = samples.iter().rev().cloned().collect();
    let batch = assert_round_trip(&reversed);
    let list = batch
        .column_by_name("x")
        .and_then(|c| c.as_any().downcast_ref::<ListArray>())
        .expect("list column");
    assert_ne!(list.values().to_data().buffers()[0].as_ptr(), base);
}
