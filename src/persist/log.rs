//! Log files: one object per group commit, `wal/<seq>.log`.
//!
//! Object stores have no append, so each group of records the writer commits is a new
//! object named by its sequence number (20 digits, so names sort in sequence order):
//!
//! ```text
//! magic "RBLOG\0\0\x01" | seq u64 | abandoned: count u64, seqs u64... |
//! records: count u64, records... | checksum u64 of everything before it
//! ```
//!
//! A group is applied whole or not at all: the checksum covers all of it. It is the
//! word-wise FNV-1a hash that also names data files (any change to one 8-byte word always
//! changes it, and it runs several times faster than a table-driven CRC-32, which was a
//! sixth of the log writer's time). `abandoned` names
//! earlier groups whose write failed: their callers were told so, and recovery must ignore
//! them even if the failed write did leave an object behind.

use super::archive::content_hash;
use super::codec::{put_record, take_replayed, Bad, Reader, Replayed, Writer};
use crate::buffer::Record;

/// Where log files live, relative to the store.
pub(crate) const LOG_DIR: &str = "wal";
const MAGIC: &[u8; 8] = b"RBLOG\0\0\x01";

/// The path of group `seq`.
pub(crate) fn log_path(seq: u64) -> String {
    format!("{LOG_DIR}/{seq:020}.log")
}

/// The sequence number of a log path (`None` for anything else).
pub(crate) fn parse_log_path(path: &str) -> Option<u64> {
    let name = path.strip_prefix(LOG_DIR)?.strip_prefix('/')?;
    let digits = name.strip_suffix(".log")?;
    (digits.len() == 20).then_some(())?;
    digits.parse().ok()
}

/// A decoded group.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) seq: u64,
    pub(crate) abandoned: Vec<u64>,
    pub(crate) records: Vec<Replayed>,
}

/// Encodes group `seq` into `buf` (cleared first: pass the previous group's buffer to
/// reuse its memory).
pub(crate) fn encode_group(
    seq: u64,
    abandoned: &[u64],
    records: &[Record],
    mut buf: Vec<u8>,
) -> Vec<u8> {
    buf.clear();
    let mut w = Writer { buf };
    w.buf.extend_from_slice(MAGIC);
    w.u64(seq);
    w.len(abandoned.len());
    abandoned.iter().for_each(|&s| w.u64(s));
    w.len(records.len());
    records.iter().for_each(|r| put_record(&mut w, r));
    let checksum = content_hash(&w.buf);
    w.u64(checksum);
    w.buf
}

/// Decodes a group file, checking its checksum first. Put records keep their samples
/// encoded, as slices of `bytes`.
pub(crate) fn decode_group(bytes: &bytes::Bytes) -> Result<Group, Bad> {
    let Some(body_len) = bytes.len().checked_sub(8) else {
        return Err(format!("{} bytes: too short for a log file", bytes.len()));
    };
    let (body, trailer) = bytes.split_at(body_len);
    let mut checksum = [0u8; 8];
    checksum.copy_from_slice(trailer);
    if content_hash(body) != u64::from_le_bytes(checksum) {
        return Err(format!(
            "checksum mismatch over {} bytes (torn or damaged)",
            bytes.len()
        ));
    }
    let mut r = Reader::new(body);
    if r.bytes(MAGIC.len())? != MAGIC {
        return Err("not a log file (bad magic)".into());
    }
    let seq = r.u64()?;
    let n = r.count(8)?;
    let mut abandoned = Vec::with_capacity(n);
    for _ in 0..n {
        abandoned.push(r.u64()?);
    }
    let n = r.count(1)?;
    let mut records = Vec::with_capacity(n);
    for _ in 0..n {
        records.push(take_replayed(&mut r, bytes)?);
    }
    if r.remaining() != 0 {
        return Err(format!("{} bytes after the last record", r.remaining()));
    }
    Ok(Group {
        seq,
        abandoned,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::Sample;
    use crate::sync::Arc;

    #[test]
    fn paths_sort_in_sequence_order_and_parse_back() {
        assert!(log_path(9) < log_path(10));
        assert_eq!(parse_log_path(&log_path(12345)), Some(12345));
        assert_eq!(parse_log_path("wal/12.log"), None);
        assert_eq!(parse_log_path("segments/00000000000000000001.log"), None);
    }

    #[test]
    fn a_group_round_trips_and_any_damage_is_detected() -> Result<(), Bad> {
        let put = Record::Put(vec![Arc::new(Sample::new("a").with("x", vec![1i32, 2]))]);
        let bytes = bytes::Bytes::from(encode_group(7, &[5, 6], &[put], Vec::new()));
        let group = decode_group(&bytes)?;
        assert_eq!((group.seq, group.abandoned.as_slice()), (7, &[5u64, 6][..]));
        assert!(matches!(&group.records[..], [Replayed::Put(s)] if s[0].id.as_str() == "a"));
        for cut in 0..bytes.len() {
            assert!(
                decode_group(&bytes.slice(..cut)).is_err(),
                "truncated at {cut}"
            );
        }
        for i in 0..bytes.len() {
            let mut flipped = bytes.to_vec();
            flipped[i] ^= 0x40;
            assert!(decode_group(&flipped.into()).is_err(), "flipped byte {i}");
        }
        Ok(())
    }
}
