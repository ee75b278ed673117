//! Ranged reads of local files into reused buffers.
//!
//! `object_store`'s local backend reads each range into a new, zero-filled buffer. A
//! spilled trainer reads a megabyte or so per batch this way, and on Linux a fresh buffer
//! of that size is fresh memory: the zero-filling alone faults in every page of it, which
//! cost about as much as the read itself (measured with `examples/spill_fifo.rs`). Here a
//! range is read into a buffer from a small pool, and the buffer goes back to the pool when
//! the last `Bytes` viewing it is dropped (the tensors of a batch view these buffers, so
//! that is when the trainer drops the batch).
//!
//! The pool is guarded by its own mutex, held only to take or return a buffer.

use crate::sync::{Arc, Mutex};
use bytes::Bytes;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Buffers kept for reuse, at most.
const POOLED_BUFFERS: usize = 16;

/// Bytes kept for reuse, at most.
const POOLED_BYTES: usize = 32 << 20;

/// Buffer sizes are rounded up to this, so that ranges of nearly the same size (column
/// chunks of one segment layout) share buffers.
const ROUNDING: usize = 64 << 10;

/// Read buffers kept for reuse.
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// A buffer of at least `len` initialised bytes: the smallest pooled one that fits,
    /// or a new one.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock();
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                vec![0; len.div_ceil(ROUNDING) * ROUNDING]
            }
        }
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut free = self.free.lock();
        let pooled: usize = free.iter().map(Vec::len).sum();
        if free.len() < POOLED_BUFFERS && pooled + buf.len() <= POOLED_BYTES {
            free.push(buf);
        }
    }

    /// Reads `ranges` of the file at `path`, each into a buffer of its own. Blocking.
    pub(crate) fn read_ranges(
        self: &Arc<Self>,
        path: &Path,
        ranges: &[Range<u64>],
    ) -> std::io::Result<Vec<Bytes>> {
        let file = std::fs::File::open(path)?;
        ranges
            .iter()
            .map(|range| {
                let len = usize::try_from(range.end.saturating_sub(range.start)).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, "range too large")
                })?;
                let mut buf = self.take(len);
                let read = buf
                    .get_mut(..len)
                    .map(|into| file.read_exact_at(into, range.start));
                match read {
                    Some(Ok(())) => Ok(Bytes::from_owner(Pooled {
                        buf,
                        len,
                        pool: Arc::clone(self),
                    })),
                    Some(Err(e)) => {
                        self.give_back(buf);
                        Err(e)
                    }
                    None => Err(std::io::Error::other("pooled buffer shorter than asked")),
                }
            })
            .collect()
    }
}

/// A pooled buffer holding `len` bytes read; back to the pool when dropped.
struct Pooled {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_one(pool: &Arc<BufferPool>, path: &Path, range: Range<u64>) -> std::io::Result<Bytes> {
        let mut got = pool.read_ranges(path, std::slice::from_ref(&range))?;
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
        let got = pool
            .read_ranges(&path, &[10..1000, 150_000..200_000])
            .expect("read");
        assert_eq!(&got[0][..], &data[10..1000]);
        assert_eq!(&got[1][..], &data[150_000..200_000]);
        let before: Vec<*const u8> = got.iter().map(|b| b.as_ptr()).collect();
        drop(got);
        assert_eq!(pool.free.lock().len(), 2);
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
}
