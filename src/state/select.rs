//! Randomised selection: which `n` of an RPC's eligible samples a lease takes under
//! `Uniform`, `Recency`, `Prioritized` and `OnPolicyFraction`.
//!
//! Pure functions of their inputs: the candidates in ready-index order (oldest first), the
//! policy, and a 64-bit draw seed derived from the policy's seed and the batch's step. So
//! the same operations give the same batches, in any process, whatever the thread timing.
//!
//! Sampling without replacement in proportion to weights `w_i` uses the Gumbel-top-k
//! trick: give each candidate the key `ln w_i + G_i` with `G_i` standard Gumbel noise and
//! take the `n` largest keys. That is exactly successive weighted draws without
//! replacement, costs one pass and a partial sort, and works in log space, so weights like
//! `(10^6)^3` never overflow.

use crate::rpc_defs::Selection;

/// One eligible sample as selection sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Candidate {
    pub(crate) slot: u32,
    /// Policy version (`NO_VERSION` when the sample has none).
    pub(crate) version: u64,
    /// `ln` of the sample's weight under `Prioritized` (`-inf`: weighs nothing).
    pub(crate) log_priority: f64,
}

/// SplitMix64: a tiny, well-mixed generator; the whole state is one `u64`, so a draw
/// stream is fully named by its seed.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in the open interval (0, 1).
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard Gumbel noise.
    fn gumbel(&mut self) -> f64 {
        -(-self.unit().ln()).ln()
    }
}

/// The seed of one batch's draws: the policy's seed mixed with the batch's step.
pub(crate) fn draw_seed(seed: u64, step: u64) -> u64 {
    let mut rng = Rng::new(seed ^ step.rotate_left(32) ^ 0xD1B5_4A32_D192_ED03);
    rng.next_u64() ^ step
}

/// The seed a selection policy carries (`Fifo` and `Lifo` have none).
pub(crate) fn policy_seed(selection: &Selection) -> u64 {
    match selection {
        Selection::Uniform { seed }
        | Selection::Recency { seed, .. }
        | Selection::Prioritized { seed, .. } => *seed,
        Selection::OnPolicyFraction { then, .. } => policy_seed(then),
        _ => 0,
    }
}

/// Picks `n` of `candidates` (oldest first) under `selection`; returns their positions in
/// `candidates`, in pick order. `current` is the buffer's policy version, if set.
pub(crate) fn choose(
    selection: &Selection,
    candidates: &[Candidate],
    n: usize,
    current: Option<u64>,
    seed: u64,
) -> Vec<usize> {
    let n = n.min(candidates.len());
    let mut rng = Rng::new(seed);
    match selection {
        Selection::OnPolicyFraction { fraction, then } => {
            let want_on = ((fraction * n as f64).ceil() as usize).min(n);
            let (on, off): (Vec<usize>, Vec<usize>) = (0..candidates.len())
                .partition(|&i| current.is_some_and(|v| candidates[i].version == v));
            let mut picked = pick_among(then, candidates, &on, want_on, &mut rng);
            let mut rest: Vec<usize> = off;
            rest.extend(on.iter().filter(|i| !picked.contains(i)));
            rest.sort_unstable();
            let more = pick_among(then, candidates, &rest, n - picked.len(), &mut rng);
            picked.extend(more);
            picked
        }
        other => {
            let all: Vec<usize> = (0..candidates.len()).collect();
            pick_among(other, candidates, &all, n, &mut rng)
        }
    }
}

/// Picks `n` of the candidates at positions `among` (ascending, so oldest first).
fn pick_among(
    selection: &Selection,
    candidates: &[Candidate],
    among: &[usize],
    n: usize,
    rng: &mut Rng,
) -> Vec<usize> {
    let n = n.min(among.len());
    match selection {
        Selection::Lifo => among.iter().rev().take(n).copied().collect(),
        Selection::Uniform { .. } => top_k(among, n, |_, _| 0.0, rng),
        // `among` is ascending, so a candidate's rank by age is its place in it.
        Selection::Recency { alpha, .. } => {
            top_k(among, n, |rank, _| alpha * ((rank + 1) as f64).ln(), rng)
        }
        Selection::Prioritized { .. } => top_k(among, n, |_, i| candidates[i].log_priority, rng),
        // Fifo, and (validated away) a nested OnPolicyFraction.
        _ => among.iter().take(n).copied().collect(),
    }
}

/// The `n` positions of `among` with the largest keys `log_weight(rank, position) +
/// Gumbel`. Weightless candidates (`-inf`) rank after every weighted one, in uniformly
/// random order among themselves.
fn top_k(
    among: &[usize],
    n: usize,
    log_weight: impl Fn(usize, usize) -> f64,
    rng: &mut Rng,
) -> Vec<usize> {
    let mut keyed: Vec<(bool, f64, usize)> = among
        .iter()
        .enumerate()
        .map(|(rank, &i)| {
            let w = log_weight(rank, i);
            let g = rng.gumbel();
            if w == f64::NEG_INFINITY || w.is_nan() {
                (false, g, i)
            } else {
                (true, w + g, i)
            }
        })
        .collect();
    // Descending by (weighted, key); the position breaks exact ties deterministically.
    let order = |a: &(bool, f64, usize), b: &(bool, f64, usize)| {
        b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2))
    };
    if n < keyed.len() {
        keyed.select_nth_unstable_by(n, order);
        keyed.truncate(n);
    }
    keyed.sort_unstable_by(order);
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(versions: &[u64]) -> Vec<Candidate> {
        versions
            .iter()
            .enumerate()
            .map(|(i, &version)| Candidate {
                slot: i as u32,
                version,
                log_priority: 0.0,
            })
            .collect()
    }

    #[test]
    fn same_seed_same_picks_and_no_repeats() {
        let c = cands(&[0; 100]);
        for sel in [
            Selection::Uniform { seed: 7 },
            Selection::Recency {
                alpha: 1.0,
                seed: 7,
            },
        ] {
            let a = choose(&sel, &c, 10, None, 42);
            let b = choose(&sel, &c, 10, None, 42);
            assert_eq!(a, b);
            let mut d = a.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 10, "{sel:?} picked a sample twice: {a:?}");
            assert_ne!(a, choose(&sel, &c, 10, None, 43));
        }
    }

    #[test]
    fn on_policy_fraction_takes_its_share_of_the_current_version() {
        // 10 samples of version 3 (current) among 90 of version 1.
        let mut versions = vec![1u64; 90];
        versions.extend([3u64; 10]);
        let c = cands(&versions);
        let sel = Selection::OnPolicyFraction {
            fraction: 0.5,
            then: Box::new(Selection::Uniform { seed: 1 }),
        };
        for seed in 0..20 {
            let picks = choose(&sel, &c, 8, Some(3), seed);
            let on = picks.iter().filter(|&&i| c[i].version == 3).count();
            assert!(on >= 4, "seed {seed}: {on} on-policy of 8");
        }
        // Fewer current samples than the share: all of them, the rest from the others.
        let picks = choose(&sel, &c, 40, Some(3), 5);
        assert!(picks.iter().filter(|&&i| c[i].version == 3).count() >= 10);
        assert_eq!(picks.len(), 40);
    }

    #[test]
    fn prioritized_never_takes_weightless_samples_while_weighted_ones_remain() {
        let mut c = cands(&[0; 20]);
        for (i, cand) in c.iter_mut().enumerate() {
            cand.log_priority = if i % 2 == 0 { 0.0 } else { f64::NEG_INFINITY };
        }
        let sel = Selection::Prioritized {
            key: "p".into(),
            exponent: 1.0,
            seed: 3,
        };
        for seed in 0..20 {
            let picks = choose(&sel, &c, 10, None, seed);
            assert!(picks.iter().all(|i| i % 2 == 0), "{picks:?}");
            let picks = choose(&sel, &c, 12, None, seed);
            assert_eq!(picks.iter().filter(|&&i| i % 2 == 1).count(), 2);
        }
    }
}
