//! Residency: which payload bytes are held in memory, under a memory budget, and which
//! samples to spill next.
//!
//! With a memory budget, every stored (or claimed) slot counts the payload bytes it holds
//! in memory; a spilled sample counts only the fields it holds beside its spilled ones
//! (fields an amend added since). A sample is *spillable* when it is stored, neither
//! amended nor leased, holds resident bytes, and is not being spilled already. Spillable
//! samples are indexed by order key, and the spiller takes them from the end that the
//! buffer's consumers reach last:
//!
//! * `newest_first` (the consumer takes the oldest first, `Fifo` and the randomised
//!   policies): the newest samples are the ones a `Fifo` trainer reaches last;
//! * otherwise (`Lifo`, `Recency`, `OnPolicyFraction`): the oldest are.
//!
//! A put claims its slots only when its bytes fit under the budget (or nothing is
//! resident, so one oversized batch still goes in); otherwise it waits for the spiller,
//! which `wanted` tells how much room the waiting putter needs. Amends and completions
//! never wait: they may take the count over the budget, and the spiller brings it back.
//! So the resident count never exceeds the budget by more than one put batch plus what
//! amends added.

use super::mask::Mask;
use super::ready::OrderKey;
use std::collections::BTreeMap;

/// Residency bookkeeping of a [`SlotTable`].
#[derive(Debug, Default)]
pub(crate) struct Residency {
    /// The memory budget, if any (nothing below is maintained without one).
    pub(crate) max: Option<u64>,
    /// Payload bytes held in memory by stored and claimed slots.
    pub(crate) resident: u64,
    /// Per slot: its share of `resident`.
    pub(crate) per_slot: Vec<u64>,
    /// Slots whose payload is being written out (excluded from `spillable`).
    pub(crate) spilling: Mask,
    /// Spillable samples by order key.
    pub(crate) spillable: BTreeMap<OrderKey, u32>,
    /// Take the newest spillable samples first (else the oldest).
    pub(crate) newest_first: bool,
    /// Bytes the putter at the head of the queue waits to fit (0 when none waits).
    pub(crate) wanted: u64,
    /// Requests for room made so far (each [`Self::ask`]), so the spiller can tell whether
    /// one came while it was writing: only a request it picked its samples for is served
    /// by the write.
    pub(crate) asks: u64,
}

impl Residency {
    pub(crate) fn new(capacity: usize, max: Option<u64>, newest_first: bool) -> Self {
        match max {
            Some(_) => Self {
                max,
                per_slot: super::mask::filled(capacity, 0),
                spilling: Mask::new(capacity),
                newest_first,
                ..Self::default()
            },
            None => Self::default(),
        }
    }

    /// Whether a put of `bytes` may claim its slots now.
    pub(crate) fn fits(&self, bytes: u64) -> bool {
        match self.max {
            None => true,
            Some(max) => self.resident == 0 || self.resident.saturating_add(bytes) <= max,
        }
    }

    /// Bytes to spill so that the resident count drops to `target` below the budget
    /// (room for the waiting putter, and a margin so the spiller works in batches).
    pub(crate) fn excess(&self) -> u64 {
        let Some(max) = self.max else { return 0 };
        let low = max - max / 8;
        let target = low.min(max.saturating_sub(self.wanted));
        self.resident.saturating_sub(target)
    }

    /// Asks the spiller for room for `resident` more bytes (the most any put asked since
    /// the last claim). A request no waiting putter holds (a refused put's, a `try_put`'s)
    /// is served by one write: its retry finds the room, and a put given up leaves no
    /// demand behind.
    pub(crate) fn ask(&mut self, resident: u64) {
        self.wanted = self.wanted.max(resident);
        self.asks = self.asks.wrapping_add(1);
    }

    /// Whether the resident count is over the budget (or a putter waits for room).
    pub(crate) fn over(&self) -> bool {
        match self.max {
            None => false,
            Some(max) => self.resident > max || self.wanted > 0,
        }
    }
}
