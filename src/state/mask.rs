//! `Mask`: a fixed-length bitset stored as plain `u64` words, with its population count kept
//! up to date so per-state slot counts cost nothing.
//!
//! Plain words, not a bitset crate: single-bit updates and word scans are all the state
//! machine needs, and they compile to a shift and a mask.

/// A vector of `len` copies of `value`, written element by element. Unlike `vec![0; n]`
/// (which maps lazily zeroed pages), this commits the memory now, so page faults happen
/// when the buffer is built and not during its first puts.
pub(crate) fn filled<T: Clone>(len: usize, value: T) -> Vec<T> {
    let mut v = Vec::with_capacity(len);
    v.resize(len, value);
    v
}

/// A bitset of `len` bits over `u64` words, counting its set bits.
#[derive(Debug, Clone, Default)]
pub(crate) struct Mask {
    words: Vec<u64>,
    ones: usize,
}

impl Mask {
    /// `len` bits, all clear.
    pub(crate) fn new(len: usize) -> Self {
        Self {
            words: filled(len.div_ceil(64), 0),
            ones: 0,
        }
    }

    /// `len` bits, all set.
    pub(crate) fn full(len: usize) -> Self {
        let mut m = Self::new(len);
        for i in 0..len {
            m.set(i);
        }
        m
    }

    /// Whether bit `i` is set (bits past the end read as clear).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> bool {
        self.words
            .get(i / 64)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }

    /// Sets bit `i`.
    #[inline]
    pub(crate) fn set(&mut self, i: usize) {
        if let Some(w) = self.words.get_mut(i / 64) {
            let bit = 1u64 << (i % 64);
            if *w & bit == 0 {
                *w |= bit;
                self.ones += 1;
            }
        }
    }

    /// Clears bit `i`.
    #[inline]
    pub(crate) fn clear(&mut self, i: usize) {
        if let Some(w) = self.words.get_mut(i / 64) {
            let bit = 1u64 << (i % 64);
            if *w & bit != 0 {
                *w &= !bit;
                self.ones -= 1;
            }
        }
    }

    /// Number of set bits.
    #[inline]
    pub(crate) fn count(&self) -> usize {
        self.ones
    }

    /// Number of set bits, recounted from the words (for invariant checks).
    pub(crate) fn recount(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::Mask;

    #[test]
    fn set_clear_count() {
        let mut m = Mask::new(130);
        m.set(0);
        m.set(129);
        m.set(129);
        assert!(m.get(129) && m.get(0) && !m.get(64));
        assert_eq!((m.count(), m.recount()), (2, 2));
        m.clear(0);
        m.clear(0);
        assert_eq!((m.count(), m.recount()), (1, 1));
        m.set(1000); // out of range: ignored
        assert!(!m.get(1000));
        assert_eq!(Mask::full(70).count(), 70);
    }
}
