//! The one rule for deadlines: none is set more than [`FOREVER`] from its start.
//!
//! A timeout may be any `Duration` (`Duration::MAX` from Rust, `math.inf` or `1e15` from
//! Python, `group_timeout_seconds` of `1e300` over HTTP). Adding it to an instant either
//! overflows (a panic with `+`) or lands in the clock's last millisecond, where tokio's timer
//! panics when it rounds the deadline up. Every deadline the crate builds therefore stops
//! thirty years out, which is without end for any run, and is built by [`after`].

use std::time::{Duration, Instant};

/// The longest wait a deadline is set for: a timeout past it waits this long.
pub(crate) const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `start + wait`, with `wait` stopped at [`FOREVER`]; `None` only when even that is past
/// the clock's range (an uptime of some 290 billion years).
pub(crate) fn after(start: Instant, wait: Duration) -> Option<Instant> {
    start.checked_add(wait.min(FOREVER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_stops_thirty_years_out() {
        let now = Instant::now();
        assert_eq!(after(now, Duration::MAX), Some(now + FOREVER));
        assert_eq!(
            after(now, FOREVER + Duration::from_nanos(1)),
            Some(now + FOREVER)
        );
        assert_eq!(
            after(now, Duration::from_secs(5)),
            Some(now + Duration::from_secs(5))
        );
        assert_eq!(after(now, Duration::ZERO), Some(now));
    }
}
