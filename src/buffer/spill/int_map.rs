//! Hash maps keyed by slot numbers and segment ids, with a multiply-rotate hash.
//!
//! The spill state looks these maps up on every get, lease and free (a `Fifo` get checks
//! its read-ahead window of two batches each time). The standard SipHash costs tens of
//! nanoseconds per key to resist keys chosen by an attacker; slot numbers and segment ids
//! are the buffer's own, so a hash of a few cycles (the one rustc uses for its own
//! integer-keyed tables) does.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by integers the buffer assigns.
pub(crate) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// Multiply-rotate hashing of integer keys (FxHash).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(SEED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys map to their values, and neighbouring integers hash apart.
    #[test]
    fn integer_keys_map_and_spread() {
        let mut m: IntMap<u32, u32> = IntMap::default();
        for k in 0..10_000u32 {
            m.insert(k, k * 3);
        }
        assert!((0..10_000u32).all(|k| m.get(&k) == Some(&(k * 3))));
        assert_eq!(m.remove(&77), Some(231));
        assert_eq!(m.get(&77), None);
        let hash = |k: u64| {
            let mut h = IntHasher::default();
            h.write_u64(k);
            h.finish()
        };
        let top: std::collections::HashSet<u64> = (0..1024).map(|k| hash(k) >> 57).collect();
        assert!(top.len() > 64, "the top bits vary: {}", top.len());
        // Slot numbers are `u32`s, hashed through `write_u32`.
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<IntHasher>::default();
        let top: std::collections::HashSet<u64> =
            (0..1024u32).map(|k| build.hash_one(k) >> 57).collect();
        assert!(top.len() > 64, "u32 keys spread too: {}", top.len());
        // Other keys come as bytes, through `write`.
        let top: std::collections::HashSet<u64> = (0..1024u32)
            .map(|k| build.hash_one(k.to_le_bytes()) >> 57)
            .collect();
        assert!(top.len() > 64, "byte keys spread too: {}", top.len());
    }
}
