//! `LeaseTable`: the live leases (batches handed to an RPC and not yet finished), with
//! their deadlines.
//!
//! Leases live in a slab; a [`LeaseId`] carries the entry's generation, so an id whose lease
//! ended (finished, released or expired) never names a later lease that reuses the entry.

use super::slot::Generation;
use std::collections::BTreeSet;
use std::time::Instant;

/// Names one lease: slab index plus the generation of that entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LeaseId {
    index: u32,
    generation: Generation,
}

impl LeaseId {
    /// A number for messages, unique among the live leases.
    pub(crate) fn number(self) -> u64 {
        (u64::from(self.generation.get()) << 32) | u64::from(self.index)
    }
}

/// A batch of slots leased to one RPC.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) rpc: usize,
    pub(crate) slots: Vec<u32>,
    pub(crate) deadline: Option<Instant>,
}

#[derive(Debug, Clone, Default)]
struct Entry {
    generation: Generation,
    lease: Option<Lease>,
}

/// The live leases.
#[derive(Debug, Clone, Default)]
pub(crate) struct LeaseTable {
    entries: Vec<Entry>,
    vacant: Vec<u32>,
    /// (deadline, entry index) of every live lease that has a deadline.
    deadlines: BTreeSet<(Instant, u32)>,
    live: usize,
}

impl LeaseTable {
    pub(crate) fn insert(&mut self, lease: Lease) -> LeaseId {
        let index = match self.vacant.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Entry::default());
                (self.entries.len() - 1) as u32
            }
        };
        if let Some(d) = lease.deadline {
            self.deadlines.insert((d, index));
        }
        self.live += 1;
        let entry = &mut self.entries[index as usize];
        entry.lease = Some(lease);
        LeaseId {
            index,
            generation: entry.generation,
        }
    }

    pub(crate) fn get(&self, id: LeaseId) -> Option<&Lease> {
        let entry = self.entries.get(id.index as usize)?;
        if entry.generation != id.generation {
            return None;
        }
        entry.lease.as_ref()
    }

    pub(crate) fn remove(&mut self, id: LeaseId) -> Option<Lease> {
        let entry = self.entries.get_mut(id.index as usize)?;
        if entry.generation != id.generation {
            return None;
        }
        let lease = entry.lease.take()?;
        entry.generation = entry.generation.advance();
        if let Some(d) = lease.deadline {
            self.deadlines.remove(&(d, id.index));
        }
        self.vacant.push(id.index);
        self.live -= 1;
        Some(lease)
    }

    /// Removes a live lease's deadline (it will not expire).
    pub(crate) fn pin(&mut self, id: LeaseId) {
        let Some(entry) = self.entries.get_mut(id.index as usize) else {
            return;
        };
        if entry.generation != id.generation {
            return;
        }
        if let Some(lease) = entry.lease.as_mut() {
            if let Some(d) = lease.deadline.take() {
                self.deadlines.remove(&(d, id.index));
            }
        }
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(d, _)| d)
    }

    /// Takes the earliest deadline if it is at or before `now` and returns its lease's id
    /// (the lease stays live until removed). Each call consumes one deadline entry, so a
    /// loop over it always ends.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<LeaseId> {
        let &(d, index) = self.deadlines.first()?;
        if d > now {
            return None;
        }
        self.deadlines.pop_first();
        let generation = self
            .entries
            .get(index as usize)
            .map_or(Generation::default(), |e| e.generation);
        Some(LeaseId { index, generation })
    }

    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Every live lease with its id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (LeaseId, &Lease)> {
        self.entries.iter().enumerate().filter_map(|(i, e)| {
            e.lease.as_ref().map(|l| {
                (
                    LeaseId {
                        index: i as u32,
                        generation: e.generation,
                    },
                    l,
                )
            })
        })
    }

    pub(crate) fn has_deadline_entry(&self, id: LeaseId, deadline: Instant) -> bool {
        self.deadlines.contains(&(deadline, id.index))
    }

    pub(crate) fn deadline_entries(&self) -> usize {
        self.deadlines.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn lease(deadline: Option<Instant>) -> Lease {
        Lease {
            rpc: 0,
            slots: vec![1, 2],
            deadline,
        }
    }

    #[test]
    fn ids_name_one_lease_and_their_numbers_differ_across_reuse() {
        let mut t = LeaseTable::default();
        assert_eq!(t.live(), 0);
        let a = t.insert(lease(None));
        let b = t.insert(lease(None));
        assert_eq!((a.number(), b.number(), t.live()), (0, 1, 2));
        assert!(t.remove(a).is_some());
        assert!(t.remove(a).is_none(), "removed twice");
        // The entry is reused under the next generation: the old id names nothing.
        let c = t.insert(lease(None));
        assert_eq!(c.number(), 1 << 32);
        assert!(t.get(a).is_none() && t.get(c).is_some());
        assert_eq!(
            t.iter().map(|(id, _)| id.number()).collect::<Vec<_>>(),
            [c.number(), 1]
        );
    }

    #[test]
    fn a_pinned_lease_never_comes_due() {
        let now = Instant::now();
        let mut t = LeaseTable::default();
        let a = t.insert(lease(Some(now)));
        let b = t.insert(lease(Some(now + Duration::from_secs(1))));
        assert_eq!(t.next_deadline(), Some(now));
        assert!(t.has_deadline_entry(a, now));
        t.pin(a);
        assert_eq!(
            (t.next_deadline(), t.deadline_entries()),
            (Some(now + Duration::from_secs(1)), 1)
        );
        assert_eq!(t.get(a).map(|l| l.deadline), Some(None));
        // A stale id pins nothing: the lease now in its entry keeps its deadline.
        assert!(t.remove(b).is_some());
        let c = t.insert(lease(Some(now)));
        t.pin(b);
        assert_eq!(t.pop_due(now + Duration::from_secs(2)), Some(c));
        assert_eq!(t.pop_due(now + Duration::from_secs(2)), None);
    }
}
