//! Reads of local files (whole, or ranges of them) into pooled buffers.
//!
//! `object_store`'s local backend reads each range into a new, zero-filled buffer; a
//! spilled trainer reads a megabyte or so per batch, and faulting in that fresh memory
//! cost about as much as the read itself (measured with `examples/spill_fifo.rs`). Here
//! each range is read into a buffer of its own from a [`BufferPool`].

use super::buffer_pool::BufferPool;
use crate::sync::Arc;
use bytes::Bytes;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Reads `ranges` of the file at `path`, each into a buffer of its own from `pool`.
/// Blocking.
pub(crate) fn read_ranges(
    pool: &Arc<BufferPool>,
    path: &Path,
    ranges: &[Range<u64>],
) -> std::io::Result<Vec<Bytes>> {
    read_ranges_of(pool, &std::fs::File::open(path)?, ranges)
}

fn read_ranges_of(
    pool: &Arc<BufferPool>,
    file: &std::fs::File,
    ranges: &[Range<u64>],
) -> std::io::Result<Vec<Bytes>> {
    ranges
        .iter()
        .map(|range| {
            let len = usize::try_from(range.end.saturating_sub(range.start)).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "range too large")
            })?;
            let mut buf = pool.take(len);
            let read = buf
                .get_mut(..len)
                .map(|into| file.read_exact_at(into, range.start));
            match read {
                Some(Ok(())) => Ok(pool.share(buf, len)),
                Some(Err(e)) => {
                    pool.give_back(buf);
                    Err(e)
                }
                None => Err(std::io::Error::other("pooled buffer shorter than asked")),
            }
        })
        .collect()
}

/// The whole file at `path`, read into a buffer from `pool`; `None` if there is no file.
/// Blocking.
pub(crate) fn read_whole(pool: &Arc<BufferPool>, path: &Path) -> std::io::Result<Option<Bytes>> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let mut got = read_ranges_of(pool, &file, std::slice::from_ref(&(0..len)))?;
    Ok(got.pop())
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    use super::*;

    fn read_one(pool: &Arc<BufferPool>, path: &Path, range: Range<u64>) -> std::io::Result<Bytes> {
        let mut got = read_ranges(pool, path, std::slice::from_ref(&range))?;
        got.pop().ok_or_else(|| std::io::Error::other("no bytes"))
    }

    /// Ranges read back as in the file; a dropped buffer is reused by the next read; a
    /// range past the end is an error and the pool keeps working.
    #[test]
    fn ranges_read_into_reused_buffers() {
        let dir = std::env::temp_dir().join(format!("rb-local-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).expect("write");
        let pool = Arc::new(BufferPool::default());
        let got = read_ranges(&pool, &path, &[10..1000, 150_000..200_000]).expect("read");
        assert_eq!(&got[0][..], &data[10..1000]);
        assert_eq!(&got[1][..], &data[150_000..200_000]);
        let before: Vec<*const u8> = got.iter().map(|b| b.as_ptr()).collect();
        drop(got);
        assert_eq!(pool.pooled(), 2);
        let again = read_one(&pool, &path, 0..40_000).expect("read");
        assert_eq!(&again[..], &data[..40_000]);
        assert!(
            before.contains(&again.as_ptr()),
            "a pooled buffer is reused"
        );
        assert!(read_one(&pool, &path, 199_000..201_000).is_err());
        let after = read_one(&pool, &path, 5..6).expect("read");
        assert_eq!(&after[..], &data[5..6]);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_whole_file_reads_back_and_a_missing_one_is_none() {
        let dir = std::env::temp_dir().join(format!("rb-local-whole-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f");
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).expect("write");
        let pool = Arc::new(BufferPool::default());
        let got = read_whole(&pool, &path).expect("read").expect("there");
        assert_eq!(&got[..], &data[..]);
        assert!(read_whole(&pool, &dir.join("missing"))
            .expect("read")
            .is_none());
        std::fs::write(&path, b"").expect("write");
        assert!(read_whole(&pool, &path)
            .expect("read")
            .expect("there")
            .is_empty());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
