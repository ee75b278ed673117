//! The one rule for deadlines: none is set [`FOREVER`] or more from its start.
//!
//! A timeout may be any `Duration` (`Duration::MAX` from Rust, `math.inf` or `1e15` from
//! Python, `group_timeout_seconds` of `1e300` over HTTP). Adding it to an instant either
//! overflows (a panic with `+`) or lands in the clock's last millisecond, where tokio's timer
//! panics when it rounds the deadline up. A wait of thirty years or more is therefore no
//! deadline ([`after`]), or where a deadline must be an instant, one thirty years out
//! ([`at_most_forever`]), which is without end for any run.

use std::time::{Duration, Instant};

/// The longest wait a deadline is set for: a timeout past it waits this long.
pub(crate) const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `start + wait`, or `None` (no deadline) for a wait of [`FOREVER`] or more, or past the
/// clock's range: a lease that never expires, a sample that never ages.
pub(crate) fn after(start: Instant, wait: Duration) -> Option<Instant> {
    if wait >= FOREVER {
        return None;
    }
    start.checked_add(wait)
}

/// `start + wait`, with `wait` stopped at [`FOREVER`], for a deadline that must be an
/// instant (a group's seal deadline); `start` itself only where even that is past the
/// clock's range (some 290 billion years after boot).
pub(crate) fn at_most_forever(start: Instant, wait: Duration) -> Instant {
    start.checked_add(wait.min(FOREVER)).unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_of_thirty_years_or_more_is_no_deadline() {
        let now = Instant::now();
        assert_eq!(after(now, Duration::MAX), None);
        assert_eq!(after(now, FOREVER), None);
        let just_short = FOREVER - Duration::from_nanos(1);
        assert_eq!(after(now, just_short), Some(now + just_short));
        assert_eq!(after(now, Duration::ZERO), Some(now));
    }

    #[test]
    fn an_instant_deadline_stops_thirty_years_out() {
        let now = Instant::now();
        assert_eq!(at_most_forever(now, Duration::MAX), now + FOREVER);
        let five = Duration::from_secs(5);
        assert_eq!(at_most_forever(now, five), now + five);
    }
}
