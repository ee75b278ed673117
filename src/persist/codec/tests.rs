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
