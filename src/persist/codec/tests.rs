//! Round trips of every record kind and tensor type, and damaged input.
use super::*;

#[test]
fn samples_round_trip_with_every_element_type() -> Result<(), Bad> {
    let ragged = Tensor::ragged(vec![1i32, 2, 3], vec![1, 2]).map_err(|e| e.to_string())?;
    let matrix = Array::from_shape_vec(IxDyn(&[2, 2]), vec![0.5f32, -1.0, 2.0, 3.5])
        .map_err(|e| e.to_string())?;
    let matrix = Tensor::from(matrix);
    let s = Sample::new("x")
        .birth(7)
        .with("a", ragged)
        .with("b", matrix)
        .with("c", 1.5f64)
        .with("d", vec![true, false])
        .with("e", vec![1u8, 2])
        .with("f", vec![9i64])
        .with("g", Tensor::scalar(String::from("text")))
        .with("h", vec![String::from("p"), String::from("q")])
        .meta("env", "math")
        .meta("v", 3i64)
        .meta("w", 0.25f64)
        .meta("ok", true);
    let mut w = Writer::default();
    put_sample(&mut w, &s);
    let back = take_sample(&mut Reader::new(&w.buf))?;
    assert_eq!(back, s);
    Ok(())
}

#[test]
fn skipping_a_sample_lands_where_decoding_it_does() -> Result<(), Bad> {
    let ragged = Tensor::ragged(vec![1i32, 2, 3], vec![1, 2]).map_err(|e| e.to_string())?;
    let s = Sample::new("x")
        .birth(3)
        .with("a", ragged)
        .with("h", vec![String::from("p"), String::from("qq")])
        .with("r", 0.5f64)
        .meta("env", "math")
        .meta("v", 2i64);
    let mut w = Writer::default();
    put_record(
        &mut w,
        &Record::Put(vec![Arc::new(s.clone()), Arc::new(s.clone())]),
    );
    let source = bytes::Bytes::from(w.buf);
    let mut r = Reader::new(&source);
    let Ok(Replayed::Put(samples)) = take_replayed(&mut r, &source) else {
        panic!("a put");
    };
    assert_eq!(r.remaining(), 0);
    for e in samples {
        assert_eq!((e.id.as_str(), e.birth), ("x", 3));
        assert_eq!(take_sample(&mut Reader::new(&e.bytes))?, s);
    }
    Ok(())
}

#[test]
fn damaged_bytes_give_errors_not_panics() {
    let s = Sample::new("x").with("a", vec![1i32; 100]);
    let mut w = Writer::default();
    put_record(&mut w, &Record::Put(vec![Arc::new(s)]));
    for cut in 0..w.buf.len() {
        assert!(
            take_record(&mut Reader::new(&w.buf[..cut])).is_err(),
            "cut {cut}"
        );
    }
    let mut huge = w.buf.clone();
    huge[1..9].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(take_record(&mut Reader::new(&huge)).is_err());
}

/// Every single-byte flip, truncation and tail of zeros of a log of every record kind
/// gives values or errors, never a panic: record by record as replay reads them, and each
/// sample's bytes decoded, skipped and read as a record. (The codec has no checksum of its
/// own: a log group's checksum is what refuses a damaged group before replay.)
#[test]
fn every_damage_of_every_record_kind_is_a_value_or_an_error() {
    let s = Sample::new("x")
        .birth(7)
        .with("a", vec![1i32, 2, 3])
        .with("c", 1.5f64)
        .with("h", vec![String::from("p"), String::from("q")])
        .meta("env", "math")
        .meta("v", 3i64)
        .meta("ok", true);
    let ids = || vec![SampleId::from("x"), SampleId::from("y")];
    let patch = || Patch::new().with("r", 0.5f64).meta("judge", "v2");
    let records = [
        Record::Put(vec![Arc::new(s.clone())]),
        Record::Amend {
            ids: ids(),
            patches: Arc::from(vec![patch(), patch()]),
        },
        Record::Complete {
            rpc: Arc::from("train"),
            ids: ids(),
            outputs: Some(Arc::from(vec![patch(), patch()])),
        },
        Record::Release {
            rpc: Arc::from("train"),
            ids: ids(),
            expired: true,
        },
        Record::Free {
            ids: ids(),
            reason: ExitReason::Filtered,
        },
        Record::Archiving {
            batch: 3,
            ids: ids(),
        },
        Record::Archived { batch: 3 },
    ];
    let mut w = Writer::default();
    for record in &records {
        put_record(&mut w, record);
    }
    let log = w.buf;
    let mut sample = Writer::default();
    put_sample(&mut sample, &s);
    for good in [&log, &sample.buf] {
        for i in 0..good.len() {
            let mut flipped = good.clone();
            flipped[i] ^= 0xFF;
            let mut zeroed = good.clone();
            zeroed[i..].fill(0);
            for bytes in [flipped, zeroed, good[..i].to_vec()] {
                let source = bytes::Bytes::from(bytes);
                let mut r = Reader::new(&source);
                // Replay stops at the first record that does not decode.
                while r.remaining() > 0 && take_replayed(&mut r, &source).is_ok() {}
                let _ = take_sample(&mut Reader::new(&source));
                let _ = skip_sample(&mut Reader::new(&source));
                let _ = take_record(&mut Reader::new(&source));
            }
        }
    }
    // The undamaged log replays whole.
    let source = bytes::Bytes::from(log);
    let mut r = Reader::new(&source);
    for _ in &records {
        assert!(take_replayed(&mut r, &source).is_ok());
    }
    assert_eq!(r.remaining(), 0);
}
