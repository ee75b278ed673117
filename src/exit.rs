//! [`ExitReason`]: why a sample left the buffer. One type for the state machine that frees
//! the slot, the freed-sample sink that receives the payload, the log that records the
//! free and the archive's `reason` column.

/// Why a sample left the buffer.
///
/// The archive stores it as the string of [`ExitReason::as_str`]; a
/// [`FreedSink`](crate::FreedSink) receives consumed samples through `consumed` and the
/// other reasons through `dropped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExitReason {
    /// Every RPC used all its reads of it.
    Consumed,
    /// Too old (by policy version or age) for an RPC that still owed it reads, so no read
    /// could ever free it. It is dropped once no lease or amend holds it.
    Stale,
    /// Evicted to make room for a put (`Overflow::EvictOldest` under a byte budget or a
    /// full buffer).
    Evicted,
    /// Discarded by its consumer (`Batch::discard`; a group a hook rejected, say).
    Filtered,
}

impl ExitReason {
    /// Every reason, in the order of their codes in the log.
    pub const ALL: [ExitReason; 4] = [Self::Consumed, Self::Stale, Self::Evicted, Self::Filtered];

    /// The name stored in the archive's `reason` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Consumed => "consumed",
            Self::Stale => "stale",
            Self::Evicted => "evicted",
            Self::Filtered => "filtered",
        }
    }

    /// The reason named `name` (as [`Self::as_str`] writes it), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ExitReason;

    #[test]
    fn names_round_trip_and_are_distinct() {
        for r in ExitReason::ALL {
            assert_eq!(ExitReason::from_name(r.as_str()), Some(r));
        }
        assert_eq!(ExitReason::from_name("lost"), None);
        let mut names: Vec<_> = ExitReason::ALL.iter().map(|r| r.as_str()).collect();
        names.dedup();
        assert_eq!(names.len(), 4);
    }
}
