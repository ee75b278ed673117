//! `RateLimiter`: Reverb's `SampleToInsertRatio` for one RPC, as counters the slot table
//! keeps under the buffer's lock.
//!
//! `diff = inserts * samples_per_insert - samples`. A lease of `n` is allowed once the
//! buffer holds `min_size` samples and `diff - n >= min_diff`; a put of `m` while the
//! buffer holds at most `min_size` samples after it, or while `diff + m * samples_per_insert
//! <= max_diff`, where `min_diff` and `max_diff` are `samples_per_insert * min_size` minus
//! and plus the error buffer (Reverb's definitions, `rate_limiter.cc`). Once past
//! `min_size`, `diff` stays within `[min_diff, max_diff]`: every lease and put is checked
//! against the bound it could cross. The table holds a getter whose RPC's limiter refuses
//! (`try_lease_with`) and a putter any limiter refuses (`claim_put_sized`); a put reports
//! the limited RPCs' getters for waking, a lease of a limited RPC reports space.

use crate::rpc_defs::RateLimit;

/// One RPC's limiter (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RateLimiter {
    samples_per_insert: f64,
    min_size: usize,
    pub(crate) min_diff: f64,
    pub(crate) max_diff: f64,
    /// Samples put since the buffer was built.
    pub(crate) inserts: u64,
    /// Samples this RPC leased since the buffer was built.
    pub(crate) samples: u64,
    /// Leases refused with enough samples eligible.
    pub(crate) held_gets: u64,
    /// Puts refused.
    pub(crate) held_puts: u64,
}

impl RateLimiter {
    pub(crate) fn new(limit: &RateLimit) -> Self {
        let centre = limit.samples_per_insert * limit.min_size as f64;
        Self {
            samples_per_insert: limit.samples_per_insert,
            min_size: limit.min_size,
            min_diff: centre - limit.error_buffer,
            max_diff: centre + limit.error_buffer,
            inserts: 0,
            samples: 0,
            held_gets: 0,
            held_puts: 0,
        }
    }

    /// `inserts * samples_per_insert - samples`.
    pub(crate) fn diff(&self) -> f64 {
        self.inserts as f64 * self.samples_per_insert - self.samples as f64
    }

    /// Whether a lease of `n` may proceed with `size` samples in the buffer.
    pub(crate) fn can_sample(&self, n: usize, size: usize) -> bool {
        size >= self.min_size && self.diff() - n as f64 >= self.min_diff
    }

    /// Whether a put of `m` may proceed with `size` samples in the buffer.
    pub(crate) fn can_insert(&self, m: usize, size: usize) -> bool {
        size + m <= self.min_size
            || self.diff() + m as f64 * self.samples_per_insert <= self.max_diff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverb_bounds_hold_as_inserts_and_samples_alternate() {
        // Two samples per insert, min size 4, error buffer 3: diff in [5, 11].
        let mut rl = RateLimiter::new(&RateLimit::new(2.0, 4, 3.0));
        assert_eq!((rl.min_diff, rl.max_diff), (5.0, 11.0));
        assert!(!rl.can_sample(1, 3), "below min size");
        for size in 0..4 {
            assert!(rl.can_insert(1, size), "free until min size");
            rl.inserts += 1;
        }
        // diff 8: one more insert reaches 10, two would reach 12 > 11.
        assert!(rl.can_insert(1, 4) && !rl.can_insert(2, 4));
        assert!(rl.can_sample(3, 4) && !rl.can_sample(4, 4));
        rl.samples += 3; // diff 5
        assert!(!rl.can_sample(1, 4));
        assert!(rl.can_insert(3, 4), "5 + 6 = 11");
        // Filling up to min size is free only while the put stays within it: at min size,
        // the ratio decides.
        rl.inserts += 3; // diff 11
        assert!(!rl.can_insert(1, 4), "11 + 2 > 11 at min size");
        assert!(rl.can_insert(1, 3), "3 + 1 only reaches min size");
        assert!(!rl.can_insert(2, 3), "3 + 2 passes it, and 11 + 4 > 11");
    }
}
