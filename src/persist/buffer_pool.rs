//! `BufferPool`: byte buffers reused for data that lives briefly and comes in similar
//! sizes (ranged reads on local disk, decompressed spill pages).
//!
//! On Linux a fresh buffer of a megabyte is fresh memory: writing it faults in every page,
//! and freeing it returns them (glibc trims its heaps), so a loader allocating one per
//! column chunk spent as much on that as on the data (measured with
//! `examples/spill_fifo.rs`). A buffer taken from the pool goes back to it when the last
//! `Bytes` viewing it drops (the tensors of a batch view these buffers, so that is when
//! the trainer drops the batch).
//!
//! The pool is guarded by its own mutex, held only to take or return a buffer.

use crate::sync::{Arc, Mutex};
use bytes::Bytes;

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
    /// A buffer of at least `len` initialised bytes: the smallest pooled one that fits
    /// (of those, the one given back last, whose lines are likeliest still in a cache:
    /// writing into a cold megabyte costs several times a warm one), or a new one.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock();
        let best = free
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            // In order: the list stays oldest first.
            Some(i) => free.remove(i),
            None => {
                drop(free);
                vec![0; len.div_ceil(ROUNDING) * ROUNDING]
            }
        }
    }

    pub(crate) fn give_back(&self, buf: Vec<u8>) {
        let mut free = self.free.lock();
        let pooled: usize = free.iter().map(Vec::len).sum();
        if free.len() < POOLED_BUFFERS && pooled + buf.len() <= POOLED_BYTES {
            free.push(buf);
        }
    }

    /// How many buffers wait in the pool.
    #[cfg(test)]
    pub(crate) fn pooled(&self) -> usize {
        self.free.lock().len()
    }

    /// `buf`'s first `len` bytes as `Bytes`; `buf` comes back to the pool when they drop.
    pub(crate) fn share(self: &Arc<Self>, buf: Vec<u8>, len: usize) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            len,
            pool: Arc::clone(self),
        })
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
