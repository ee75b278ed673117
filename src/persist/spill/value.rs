//! The encoding of one tensor in a spill segment: the crate's tensor encoding, padded so
//! that a load can view the decoded Parquet page instead of copying out of it.
//!
//! A segment column holds one value per sample, plain-encoded: in a decoded page each
//! value follows a 4-byte length. A value here is a pad count (its high bit set), a
//! checksum of the tensor's bytes (8 bytes), that many zero bytes, the tensor
//! ([`put_tensor`]) and zeros up to a length of 4 more than a multiple of 8. A Parquet
//! page carries no checksum, so without it a flipped byte of a spilled array would load
//! as a wrong number; a value whose pad count lacks the high bit (segments written before
//! the checksum) is read unchecked. The pad puts the array's first number 4 bytes past
//! an 8-byte boundary of the value, so in a
//! page whose values all have such lengths (a column without nulls, whose page holds no
//! level data) every array starts on an 8-byte boundary of the page. [`take_tensor_padded`]
//! then returns a tensor viewing the page (`Tensor::borrowed`); wherever that does not hold
//! (a page laid out otherwise, a big-endian host, bools and strings) it copies, as
//! [`take_tensor`] does.

use crate::persist::codec::{
    number_tag, put_tensor, take_lengths, take_shape, take_tensor, Bad, Reader, Writer,
};
use crate::tensor::{SharedBytes, Tensor};

/// Marks a pad count followed by a checksum.
const CHECKED: u8 = 0x80;

/// The checksum of a value's tensor bytes (XXH3: vectorised, so a load of a large array
/// checks it at memory speed).
fn checksum(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// Appends `t`'s padded encoding to `w`.
pub(crate) fn put_tensor_padded(w: &mut Writer, t: &Tensor) {
    let start = w.buf.len();
    // `put_tensor` writes a tag, the number of dimensions and each dimension (8 bytes
    // each) before the values; the pad byte and the 8-byte checksum come first.
    let header = 1 + 8 + 8 * t.shape().len();
    let pad = (12 - (1 + 8 + header) % 8) % 8;
    w.u8(CHECKED | pad as u8);
    let check_at = w.buf.len();
    w.u64(0);
    w.buf.resize(w.buf.len() + pad, 0);
    let body = w.buf.len();
    put_tensor(w, t);
    let check = checksum(&w.buf[body..]);
    w.buf[check_at..check_at + 8].copy_from_slice(&check.to_le_bytes());
    let len = w.buf.len() - start;
    w.buf.resize(w.buf.len() + (12 - len % 8) % 8, 0);
}

/// Decodes a padded value `bytes`. When `at` gives the bytes' owner and where in it they
/// start, a little-endian number array aligned there is returned as a view of the owner.
pub(crate) fn take_tensor_padded(
    bytes: &[u8],
    at: Option<(&SharedBytes, usize)>,
) -> Result<Tensor, Bad> {
    let mut r = Reader::new(bytes);
    let flags = r.u8()?;
    let check = if flags & CHECKED != 0 {
        Some(r.u64()?)
    } else {
        None
    };
    r.bytes(usize::from(flags & !CHECKED))?;
    let body = r.position();
    let checked = |end: usize| match check {
        Some(want) if checksum(bytes.get(body..end).unwrap_or(&[])) != want => {
            Err(Bad::from("the spilled value fails its checksum"))
        }
        _ => Ok(()),
    };
    if let Some((owner, start)) = at {
        if let Some(t) = view(&mut r, owner, start)? {
            checked(r.position())?;
            return Ok(t);
        }
    }
    let mut r = Reader::new(bytes.get(body..).unwrap_or(&[]));
    let t = take_tensor(&mut r)?;
    checked(body + r.position())?;
    Ok(t)
}

/// The tensor at `r` as a view of `owner` (whose bytes hold `r`'s from `start`), if it
/// is a number array that can be viewed there.
fn view(r: &mut Reader<'_>, owner: &SharedBytes, start: usize) -> Result<Option<Tensor>, Bad> {
    let Some((dtype, size)) = number_tag(r.u8()?) else {
        return Ok(None);
    };
    let (shape, n) = take_shape(r, size)?;
    if shape.is_empty() {
        return Ok(None);
    }
    let first = start + r.position();
    r.bytes(n * size)?;
    let lengths = take_lengths(r)?;
    Ok(Tensor::from_shared_bytes(
        dtype,
        shape,
        lengths,
        SharedBytes::clone(owner),
        first..first + n * size,
    ))
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    use super::*;
    use crate::tensor::aligned_bytes;

    /// Lays `values` out as a plain-encoded page does (a 4-byte length before each) in an
    /// 8-byte aligned buffer; returns it and where each value starts.
    fn page(values: &[Vec<u8>]) -> (SharedBytes, Vec<usize>) {
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        for v in values {
            bytes.extend_from_slice(&(v.len() as u32).to_le_bytes());
            starts.push(bytes.len());
            bytes.extend_from_slice(v);
        }
        (aligned_bytes(&bytes), starts)
    }

    fn tensors() -> Vec<Tensor> {
        vec![
            Tensor::from(vec![1i32, 2, 3]),
            Tensor::from(ndarray::array![[0.5f64, -1.0], [2.0, 3.5]]),
            Tensor::ragged(vec![7i64, 8, 9, 10, 11], vec![2, 3]).expect("ragged"),
            Tensor::from(vec![-0.25f32; 101]),
            Tensor::from(vec![9u8; 13]),
            Tensor::from(vec![true, false]),
            Tensor::from(vec!["a".to_owned(), "bc".to_owned()]),
            Tensor::from(3.5f64),
        ]
    }

    /// Every tensor reads back equal, numbers as views of the page, others as copies.
    #[test]
    fn padded_values_read_back_as_views_of_the_page() {
        let encoded: Vec<Vec<u8>> = tensors()
            .iter()
            .map(|t| {
                let mut w = Writer::default();
                put_tensor_padded(&mut w, t);
                assert_eq!(w.buf.len() % 8, 4, "{t:?}");
                w.buf
            })
            .collect();
        let (owner, starts) = page(&encoded);
        for ((t, bytes), start) in tensors().iter().zip(&encoded).zip(starts) {
            let got = take_tensor_padded(bytes, Some((&owner, start))).expect("decode");
            assert_eq!(&got, t);
            assert_eq!(got.lengths(), t.lengths());
            let viewed = format!("{got:?}").contains("Borrowed");
            let number_array = !t.shape().is_empty()
                && !matches!(
                    t.dtype(),
                    crate::tensor::DType::Bool | crate::tensor::DType::Str
                );
            assert_eq!(
                viewed,
                number_array && cfg!(target_endian = "little"),
                "{t:?}"
            );
            // Without an owner, a copy.
            let copied = take_tensor_padded(bytes, None).expect("decode");
            assert_eq!(&copied, t);
            assert!(!format!("{copied:?}").contains("Borrowed"));
        }
    }

    /// A value that does not sit where the padding expects is copied, not misread.
    #[test]
    fn misaligned_values_are_copied() {
        let t = Tensor::from(vec![1i32, 2, 3, 4]);
        let mut w = Writer::default();
        put_tensor_padded(&mut w, &t);
        let mut shifted = vec![0u8; 3];
        shifted.extend_from_slice(&w.buf);
        let (owner, starts) = page(&[shifted.clone()]);
        let got = take_tensor_padded(&shifted[3..], Some((&owner, starts[0] + 3))).expect("decode");
        assert_eq!(got, t);
        assert!(!format!("{got:?}").contains("Borrowed"));
    }

    /// Cut-short bytes are errors, never panics or short tensors.
    #[test]
    fn damaged_values_are_errors() {
        let t = Tensor::from(vec![5i32; 64]);
        let mut plain = Writer::default();
        put_tensor(&mut plain, &t);
        let mut w = Writer::default();
        put_tensor_padded(&mut w, &t);
        let pad = usize::from(w.buf[0] & !CHECKED);
        let (owner, starts) = page(std::slice::from_ref(&w.buf));
        for cut in 0..1 + 8 + pad + plain.buf.len() {
            assert!(take_tensor_padded(&w.buf[..cut], Some((&owner, starts[0]))).is_err());
            assert!(take_tensor_padded(&w.buf[..cut], None).is_err());
        }
        assert!(take_tensor_padded(&[200], None).is_err());
    }

    /// A flipped byte anywhere in the tensor fails the checksum, viewed or copied.
    #[test]
    fn flipped_bytes_fail_the_checksum() {
        let t = Tensor::from((0..64).collect::<Vec<i32>>());
        let mut w = Writer::default();
        put_tensor_padded(&mut w, &t);
        let body = 1 + 8 + usize::from(w.buf[0] & !CHECKED);
        let mut plain = Writer::default();
        put_tensor(&mut plain, &t);
        for i in body..body + plain.buf.len() {
            let mut bad = w.buf.clone();
            bad[i] ^= 0x01;
            let (owner, starts) = page(std::slice::from_ref(&bad));
            assert!(
                take_tensor_padded(&bad, Some((&owner, starts[0]))).is_err(),
                "byte {i}"
            );
            assert!(take_tensor_padded(&bad, None).is_err(), "byte {i}");
        }
    }

    /// Values written before the checksum (pad count without the high bit) still read.
    #[test]
    fn unchecked_values_still_read() {
        let t = Tensor::from(vec![3i64; 5]);
        let mut w = Writer::default();
        put_tensor_padded(&mut w, &t);
        let pad = usize::from(w.buf[0] & !CHECKED);
        let mut old = vec![pad as u8];
        old.extend_from_slice(&w.buf[1 + 8..]);
        assert_eq!(take_tensor_padded(&old, None).expect("decode"), t);
    }
}
