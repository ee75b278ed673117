//! `Admission`: how many more rollouts the producers may start now without exceeding the
//! concurrency limit or the staleness bound (AReaL's `StalenessManager`, with its formula).
//!
//! A rollout moves through `enqueued -> running -> accepted | rejected`. With the trainer at
//! policy version `v`, batches of `batch_size` samples and a staleness bound `s`, at most
//! `(s + v + 1) * batch_size` rollouts may ever have been accepted or be running: a rollout
//! started now is then consumed at most `s` versions after the one that produced it. The
//! room left is
//!
//! ```text
//! capacity = min(max(1, max_concurrent) - running,
//!                (max_staleness + version + 1) * max(1, batch_size) - (accepted + running))
//! ```
//!
//! and may be negative (more is running than either limit allows). Counters are signed so
//! that a misordered call (an accept without a submit) shows up as a negative count instead
//! of a panic or a wrap-around. After a restart, [`Admission::on_version_recovered`] sets
//! `accepted` to what the recovered version implies, so the bound holds from the first call
//! (AReaL issue #1388: staleness grew without bound after resuming because `accepted`
//! restarted at 0 while the version did not).
//!
//! # Locking
//!
//! One mutex guards the four counters; every method holds it for a few additions. Nothing
//! here waits or notifies.

use crate::sync::Mutex;
use crate::SequenceBuffer;

impl SequenceBuffer {
    /// How many more samples producers may start now so that none is consumed more than
    /// `max_staleness` versions after the one that produced it (AReaL's admission bound
    /// without a concurrency limit): `(max_staleness + version + 1) * batch_size - put`,
    /// with `version` the current policy version (0 before one is set) and `put` every
    /// sample this buffer has stored, both restored with the buffer after a restart.
    /// Samples still being generated are not known here; use [`Admission`] to count them.
    pub fn admission(&self, batch_size: u64, max_staleness: u64) -> i64 {
        let stats = self.stats();
        let limits = AdmissionLimits {
            max_concurrent: u64::MAX,
            batch_size,
            max_staleness,
        };
        let counters = AdmissionCounters {
            accepted: signed(stats.put),
            ..AdmissionCounters::default()
        };
        capacity(limits, stats.policy_version.unwrap_or(0), counters)
    }
}

/// The limits admission enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Rollouts that may run at once (at least 1 is used).
    pub max_concurrent: u64,
    /// Samples per training batch (at least 1 is used).
    pub batch_size: u64,
    /// Versions a rollout may lag the policy that trains on it.
    pub max_staleness: u64,
}

/// The rollout counters, as [`Admission::counters`] reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdmissionCounters {
    /// Waiting to start.
    pub enqueued: i64,
    /// Started and not yet accepted or rejected.
    pub running: i64,
    /// Finished and kept.
    pub accepted: i64,
    /// Finished and discarded.
    pub rejected: i64,
}

/// Admission control for rollout producers (see the module docs).
///
/// ```
/// use rollout_buffer::rollout::{Admission, AdmissionLimits};
/// let admission = Admission::new(AdmissionLimits { max_concurrent: 10, batch_size: 4, max_staleness: 2 });
/// assert_eq!(admission.capacity(0), 10);
/// let admission = Admission::new(AdmissionLimits { max_concurrent: 100, batch_size: 4, max_staleness: 2 });
/// assert_eq!(admission.capacity(0), 12); // (2 + 0 + 1) * 4
/// assert_eq!(admission.capacity(5), 32); // (2 + 5 + 1) * 4
/// ```
#[derive(Debug)]
pub struct Admission {
    limits: AdmissionLimits,
    counters: Mutex<AdmissionCounters>,
}

impl Admission {
    /// Admission with these limits and every counter at zero.
    pub fn new(limits: AdmissionLimits) -> Self {
        Self {
            limits,
            counters: Mutex::new(AdmissionCounters::default()),
        }
    }

    /// The limits.
    pub fn limits(&self) -> AdmissionLimits {
        self.limits
    }

    /// How many more rollouts may start now, with the trainer at `version` (negative when
    /// more run than the limits allow).
    pub fn capacity(&self, version: u64) -> i64 {
        let c = *self.counters.lock();
        capacity(self.limits, version, c)
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> AdmissionCounters {
        *self.counters.lock()
    }

    /// `n` rollouts were queued to start.
    pub fn enqueued(&self, n: u64) {
        self.counters.lock().enqueued += signed(n);
    }

    /// `n` queued rollouts started.
    pub fn submitted(&self, n: u64) {
        let mut c = self.counters.lock();
        c.enqueued -= signed(n);
        c.running += signed(n);
    }

    /// `n` running rollouts finished and were kept.
    pub fn accepted(&self, n: u64) {
        let mut c = self.counters.lock();
        c.running -= signed(n);
        c.accepted += signed(n);
    }

    /// `n` running rollouts finished and were discarded.
    pub fn rejected(&self, n: u64) {
        let mut c = self.counters.lock();
        c.running -= signed(n);
        c.rejected += signed(n);
    }

    /// Sets the accepted count (after a restart, from what the buffer holds durably).
    pub fn restore_accepted(&self, accepted: u64) {
        self.counters.lock().accepted = signed(accepted);
    }

    /// Admission for producers of `buf`: `accepted` starts at the number of samples the
    /// buffer has stored over its life (restored with it by `SequenceBuffer::open`), so the
    /// bound holds across restarts. Ask [`Self::capacity`] with `buf.policy_version()`.
    pub fn for_buffer(buf: &SequenceBuffer, limits: AdmissionLimits) -> Self {
        let admission = Self::new(limits);
        admission.restore_accepted(buf.stats().put);
        admission
    }

    /// After a restart at policy `version`: counts `version * batch_size` rollouts as
    /// accepted (what training up to that version consumed), so the staleness bound holds
    /// from the first call instead of admitting a whole window's worth again.
    pub fn on_version_recovered(&self, version: u64) {
        let batch = self.limits.batch_size.max(1);
        self.counters.lock().accepted = signed(version.saturating_mul(batch));
    }
}

/// Counts are far below `i64::MAX`; a larger one saturates instead of wrapping.
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The capacity formula (module docs), in saturating signed arithmetic.
fn capacity(limits: AdmissionLimits, version: u64, c: AdmissionCounters) -> i64 {
    let concurrency = signed(limits.max_concurrent.max(1)).saturating_sub(c.running);
    let window = limits
        .max_staleness
        .saturating_add(version)
        .saturating_add(1)
        .saturating_mul(limits.batch_size.max(1));
    let staleness = signed(window).saturating_sub(c.accepted.saturating_add(c.running));
    concurrency.min(staleness)
}

#[cfg(test)]
mod tests {
    //! AReaL's `tests/test_staleness_manager.py`, case by case (the research notes list
    //! them in §4.3), plus the boundaries of the arithmetic.

    use super::*;

    fn admission(max_concurrent: u64, batch_size: u64, max_staleness: u64) -> Admission {
        Admission::new(AdmissionLimits {
            max_concurrent,
            batch_size,
            max_staleness,
        })
    }

    /// `n` x (enqueue, submit).
    fn start(a: &Admission, n: u64) {
        a.enqueued(n);
        a.submitted(n);
    }

    #[test]
    fn initial_capacity_is_the_smaller_limit() {
        assert_eq!(admission(10, 4, 2).capacity(0), 10);
        assert_eq!(admission(100, 32, 10).capacity(0), 100);
        assert_eq!(admission(100, 4, 2).capacity(0), 12);
        assert_eq!(admission(10, 1, 2).capacity(0), 3);
        assert_eq!(admission(10_000, 64, 10).capacity(1_000_000), 10_000);
    }

    #[test]
    fn the_staleness_window_grows_with_the_version() {
        let a = admission(1000, 4, 2);
        assert_eq!((a.capacity(0), a.capacity(5)), (12, 32));
        let zero = admission(100, 8, 0);
        assert_eq!((zero.capacity(0), zero.capacity(5)), (8, 48));
        for v in [0u64, 1, 10, 100, 1000] {
            let expected = 1000.min((5 + v as i64 + 1) * 32);
            assert_eq!(admission(1000, 32, 5).capacity(v), expected, "version {v}");
        }
    }

    #[test]
    fn running_and_accepted_rollouts_use_up_capacity() {
        let a = admission(5, 2, 10);
        start(&a, 3);
        assert_eq!(a.capacity(0), 2);
        let a = admission(10, 4, 2);
        start(&a, 3);
        assert_eq!(a.capacity(0), 7);
        let a = admission(20, 4, 2);
        for _ in 0..5 {
            start(&a, 1);
            a.accepted(1);
        }
        assert_eq!(a.capacity(0), 7);
        let a = admission(5, 2, 5);
        start(&a, 5);
        assert_eq!(a.capacity(0), 0);
        let a = admission(3, 2, 1);
        start(&a, 10);
        assert!(a.capacity(0) < 0);
        let a = admission(100, 8, 3);
        for _ in 0..30 {
            start(&a, 1);
            a.accepted(1);
        }
        assert_eq!(a.capacity(0), 2);
        let a = admission(20, 8, 3);
        start(&a, 20);
        a.accepted(15);
        a.rejected(5);
        assert_eq!(a.capacity(0), 17);
    }

    #[test]
    fn counters_follow_the_lifecycle() {
        let a = admission(10, 4, 2);
        start(&a, 5);
        a.accepted(3);
        a.rejected(2);
        let c = a.counters();
        assert_eq!(
            (c.enqueued, c.running, c.accepted, c.rejected),
            (0, 0, 3, 2)
        );
        // Rejections free capacity for good.
        let b = admission(10, 4, 2);
        for _ in 0..10 {
            start(&b, 1);
            b.rejected(1);
        }
        assert_eq!(b.counters().rejected, 10);
        assert_eq!(b.capacity(0), 10);
        // An accept without a submit is visible, not a panic.
        let odd = admission(10, 4, 2);
        odd.accepted(1);
        assert_eq!((odd.counters().running, odd.counters().accepted), (-1, 1));
    }

    #[test]
    fn degenerate_limits_do_not_crash() {
        assert!(admission(0, 0, 0).capacity(0) >= 0);
        assert_eq!(admission(0, 0, 0).capacity(0), 1);
        let huge = admission(u64::MAX, u64::MAX, u64::MAX);
        assert_eq!(huge.capacity(u64::MAX), i64::MAX);
    }

    #[test]
    fn a_typical_training_run_and_a_burst() {
        let a = admission(32, 16, 2);
        start(&a, 16);
        a.accepted(14);
        a.rejected(2);
        assert_eq!(a.capacity(1), 32);
        start(&a, 16);
        let c = a.counters();
        assert_eq!((c.running, c.accepted, c.rejected), (16, 14, 2));

        let burst = admission(50, 32, 5);
        start(&burst, 100);
        assert!(burst.capacity(0) < 0);
        burst.accepted(80);
        burst.rejected(20);
        assert!(burst.capacity(0) > 0);
    }

    #[test]
    fn recovery_restores_the_bound() {
        for recovered in [0u64, 5, 10, 50] {
            let a = admission(1000, 16, 2);
            a.on_version_recovered(recovered);
            assert_eq!(a.capacity(recovered), 48, "recovered at {recovered}");
        }
        for running in [1u64, 5, 16] {
            let a = admission(1000, 16, 2);
            start(&a, running);
            a.on_version_recovered(10);
            assert_eq!(a.capacity(10), 48 - running as i64);
        }
    }

    #[test]
    fn concurrent_updates_are_all_counted() {
        let a = crate::sync::Arc::new(admission(1000, 32, 10));
        let threads: Vec<_> = (0..10)
            .map(|_| {
                let a = crate::sync::Arc::clone(&a);
                std::thread::spawn(move || (0..100).for_each(|_| start(&a, 1)))
            })
            .collect();
        for t in threads {
            assert!(t.join().is_ok());
        }
        let c = a.counters();
        assert_eq!(
            (c.enqueued, c.running, c.accepted, c.rejected),
            (0, 1000, 0, 0)
        );
    }
}
