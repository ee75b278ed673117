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

    /// Uniform in `0..k` (`k > 0`), by the multiply-shift method.
    pub(crate) fn below(&mut self, k: usize) -> usize {
        ((u128::from(self.next_u64()) * k as u128) >> 64) as usize
    }

    /// Uniform in the open interval (0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
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

/// Draws `n` distinct age ranks in `0..m` (0 = oldest) under a selection whose weights
/// depend on the rank only (`Uniform`, `Recency`), without looking at the samples: O(n)
/// expected work instead of a pass over all `m`.
///
/// * `Uniform`: Floyd's algorithm (exact, no rejections).
/// * `Recency { alpha }`: weight `(i + 1)^alpha`. Exact rejection sampling from the
///   continuous envelope `(x + 1)^alpha` on `[0, m)` (increasing, so it bounds the weight of
///   every rank in its unit interval): `x` by inverse CDF, rank `floor(x)`, accepted with
///   probability `((rank + 1) / (x + 1))^alpha`; ranks drawn already are redrawn. When the
///   batch is a large share of the pool, the Gumbel-top-k pass is cheaper and used instead.
pub(crate) fn sample_ranks(selection: &Selection, m: usize, n: usize, seed: u64) -> Vec<usize> {
    let n = n.min(m);
    let mut rng = Rng::new(seed);
    match selection {
        Selection::Recency { alpha, .. } if n * 4 <= m => {
            let a1 = alpha + 1.0;
            let top = (m as f64 + 1.0).powf(a1);
            let mut picked = Vec::with_capacity(n);
            let mut seen = RankSet::with_room(n);
            while picked.len() < n {
                let x = envelope_inverse_cdf(rng.unit(), top, a1);
                let rank = (x.max(0.0) as usize).min(m - 1);
                let accept = ((rank as f64 + 1.0) / (x + 1.0)).powf(*alpha);
                if rng.unit() <= accept && seen.insert(rank) {
                    picked.push(rank);
                }
            }
            picked
        }
        Selection::Recency { alpha, .. } => {
            let ranks: Vec<usize> = (0..m).collect();
            top_k(
                &ranks,
                n,
                |rank, _| alpha * ((rank + 1) as f64).ln(),
                &mut rng,
            )
        }
        _ => {
            // Floyd: for j in m-n..m, draw t in 0..=j; take t, or j if t was taken.
            let mut seen = RankSet::with_room(n);
            let mut picked = Vec::with_capacity(n);
            for j in m - n..m {
                let t = rng.below(j + 1);
                let take = if seen.contains(t) { j } else { t };
                seen.insert(take);
                picked.push(take);
            }
            picked
        }
    }
}

/// The `x` in `[0, m]` where the CDF of the `Recency` envelope `(x + 1)^(a1 - 1)` on
/// `[0, m)` reaches `u`: `F(x) = ((x + 1)^a1 - 1) / (top - 1)`, with `top = (m + 1)^a1`.
fn envelope_inverse_cdf(u: f64, top: f64, a1: f64) -> f64 {
    (u * top + (1.0 - u)).powf(1.0 / a1) - 1.0
}

/// The set of ranks drawn so far in one batch: open addressing over a table at least
/// twice the batch, so a lookup is a probe or two in one or two cache lines (a
/// `BTreeSet` cost more than the rest of a batch's draws).
struct RankSet {
    /// `usize::MAX`: empty.
    table: Vec<usize>,
    /// `64 - log2(table.len())`: a rank's home is the top bits of its hash.
    shift: u32,
}

impl RankSet {
    fn with_room(n: usize) -> Self {
        let len = (2 * n).next_power_of_two().max(8);
        Self {
            table: vec![usize::MAX; len],
            shift: 64 - len.trailing_zeros(),
        }
    }

    /// Where the probe for `rank` ends: its place, or the empty one it would take.
    fn probe(&self, rank: usize) -> usize {
        let mask = self.table.len() - 1;
        // Fibonacci hashing: consecutive ranks spread over the table.
        let hash = (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift;
        let mut at = hash as usize & mask;
        while self.table[at] != usize::MAX && self.table[at] != rank {
            at = (at + 1) & mask;
        }
        at
    }

    /// Adds `rank` (below `usize::MAX`); whether it was new. The table never fills: it
    /// has room for twice the ranks one batch draws.
    fn insert(&mut self, rank: usize) -> bool {
        let at = self.probe(rank);
        let new = self.table[at] == usize::MAX;
        self.table[at] = rank;
        new
    }

    fn contains(&self, rank: usize) -> bool {
        self.table[self.probe(rank)] == rank
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

    #[test]
    fn the_generator_is_splitmix64() {
        // The reference outputs from state 0 (Vigna's splitmix64.c): the same seed gives the
        // same batches in every build and every version of the crate.
        let mut rng = Rng::new(0);
        let first: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [
                0xE220_A839_7B1D_CDAF,
                0x6E78_9E6A_A1B9_65F4,
                0x06C4_5D18_8009_454F
            ]
        );
    }

    #[test]
    fn each_seed_and_step_draws_its_own_stream() {
        // Policies seeded 0..64 at steps 0..64: no two batches share a draw seed.
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            for step in 0..64 {
                assert!(
                    seen.insert(draw_seed(seed, step)),
                    "seed {seed} step {step}"
                );
            }
        }
    }

    #[test]
    fn the_rank_set_holds_what_was_inserted_and_nothing_else() {
        // A batch's worth of ranks, many sharing a home (multiples of the table size),
        // inserted twice: the set answers as a `BTreeSet` does.
        let mut set = RankSet::with_room(64);
        let mut model = std::collections::BTreeSet::new();
        let mut rng = Rng::new(5);
        for i in 0..64usize {
            let rank = if i % 2 == 0 {
                i * 128
            } else {
                rng.below(1 << 40)
            };
            assert_eq!(set.insert(rank), model.insert(rank));
            assert!(!set.insert(rank), "{rank} inserted twice");
        }
        for probe in (0..10_000).chain(model.iter().copied()) {
            assert_eq!(set.contains(probe), model.contains(&probe), "{probe}");
        }
    }

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
    fn rank_draws_are_distinct_in_range_and_follow_the_weights() {
        for sel in [
            Selection::Uniform { seed: 0 },
            Selection::Recency {
                alpha: 2.0,
                seed: 0,
            },
        ] {
            for (m, n) in [(10, 10), (100, 7), (1000, 64), (5, 0)] {
                let ranks = sample_ranks(&sel, m, n, 99);
                assert_eq!(ranks, sample_ranks(&sel, m, n, 99));
                let distinct: std::collections::BTreeSet<usize> = ranks.iter().copied().collect();
                assert_eq!((ranks.len(), distinct.len()), (n, n), "{sel:?} m {m}");
                assert!(ranks.iter().all(|&r| r < m));
            }
        }
        // One draw from 20 ranks, alpha 2: P(rank i) = (i+1)^2 / sum(1..=20 of k^2).
        let sel = Selection::Recency {
            alpha: 2.0,
            seed: 0,
        };
        assert_first_picks_follow(
            |seed| sample_ranks(&sel, 20, 1, seed)[0],
            20,
            |i| ((i + 1) * (i + 1)) as f64,
        );
    }

    #[test]
    fn the_recency_envelope_is_inverted_exactly() {
        // m = 9, alpha = 1: F(x) = ((x + 1)^2 - 1) / 99, from 0 at x = 0 to 1 at x = 9.
        let (top, a1) = (100.0, 2.0);
        for (u, x) in [
            (0.0, 0.0),
            (1.0, 9.0),
            (3.0 / 99.0, 1.0),
            (24.0 / 99.0, 4.0),
        ] {
            let got = envelope_inverse_cdf(u, top, a1);
            assert!((got - x).abs() < 1e-9, "F^-1({u}) = {got}, not {x}");
        }
    }

    /// Over 40,000 seeds, `first(seed)` (in `0..m`) lands on `i` in proportion to
    /// `weight(i)`, each count within 5 standard deviations.
    fn assert_first_picks_follow(
        first: impl Fn(u64) -> usize,
        m: usize,
        weight: impl Fn(usize) -> f64,
    ) {
        let draws = 40_000;
        let mut counts = vec![0usize; m];
        for seed in 0..draws {
            counts[first(seed)] += 1;
        }
        let total: f64 = (0..m).map(&weight).sum();
        for (i, &c) in counts.iter().enumerate() {
            let p = weight(i) / total;
            let expected = draws as f64 * p;
            let sd = (draws as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (c as f64 - expected).abs() < 5.0 * sd + 1.0,
                "{i}: {c} draws, expected {expected:.0} +- {:.0}",
                5.0 * sd
            );
        }
    }

    #[test]
    fn a_large_batch_leads_with_a_weighted_draw() {
        // The Gumbel-top-k pass returns the largest key first: one weighted draw. A batch of
        // 4 of 8 ranks under Recency takes it, and so does every pick under
        // OnPolicyFraction.
        let sel = Selection::Recency {
            alpha: 2.0,
            seed: 0,
        };
        let square = |i: usize| ((i + 1) * (i + 1)) as f64;
        assert_first_picks_follow(|seed| sample_ranks(&sel, 8, 4, seed)[0], 8, square);
        let c = cands(&[1; 8]);
        assert_first_picks_follow(|seed| choose(&sel, &c, 4, None, seed)[0], 8, square);
        let mut c = cands(&[1; 8]);
        for (i, cand) in c.iter_mut().enumerate() {
            cand.log_priority = (i as f64 + 1.0).ln();
        }
        let sel = Selection::Prioritized {
            key: "p".into(),
            exponent: 1.0,
            seed: 0,
        };
        assert_first_picks_follow(
            |seed| choose(&sel, &c, 4, None, seed)[0],
            8,
            |i| i as f64 + 1.0,
        );
    }

    #[test]
    fn weightless_candidates_come_in_random_order() {
        let mut c = cands(&[1; 5]);
        for cand in &mut c {
            cand.log_priority = f64::NEG_INFINITY;
        }
        let sel = Selection::Prioritized {
            key: "p".into(),
            exponent: 1.0,
            seed: 0,
        };
        assert_first_picks_follow(|seed| choose(&sel, &c, 2, None, seed)[0], 5, |_| 1.0);
    }

    #[test]
    fn on_policy_fraction_takes_the_rest_from_every_sample_not_yet_taken() {
        // 10 of version 1, then 50 of version 3 (current); a quarter of 40 is 10 current
        // ones, and the other 30 come from the 10 old and the 40 current left.
        let mut versions = vec![1u64; 10];
        versions.extend([3u64; 50]);
        let c = cands(&versions);
        for then in [Selection::Uniform { seed: 1 }, Selection::Fifo] {
            let sel = Selection::OnPolicyFraction {
                fraction: 0.25,
                then: Box::new(then),
            };
            for seed in 0..20 {
                let picks = choose(&sel, &c, 40, Some(3), seed);
                let distinct: std::collections::BTreeSet<usize> = picks.iter().copied().collect();
                assert_eq!(
                    (picks.len(), distinct.len()),
                    (40, 40),
                    "{sel:?}: {picks:?}"
                );
            }
        }
        // The share is a fraction of the batch: under Fifo, 4 of 8 from the 10 current at
        // the end, then the oldest.
        let mut versions = vec![1u64; 90];
        versions.extend([3u64; 10]);
        let sel = Selection::OnPolicyFraction {
            fraction: 0.5,
            then: Box::new(Selection::Fifo),
        };
        assert_eq!(
            choose(&sel, &cands(&versions), 8, Some(3), 0),
            [90, 91, 92, 93, 0, 1, 2, 3]
        );
        // Newest first within each part under Lifo: none current here, so all from the rest.
        let sel = Selection::OnPolicyFraction {
            fraction: 0.5,
            then: Box::new(Selection::Lifo),
        };
        assert_eq!(choose(&sel, &cands(&[1; 10]), 3, Some(3), 0), [9, 8, 7]);
    }

    #[test]
    fn on_policy_fraction_draws_with_the_seed_of_its_inner_policy() {
        let sel = Selection::OnPolicyFraction {
            fraction: 0.5,
            then: Box::new(Selection::Uniform { seed: 7 }),
        };
        assert_eq!(policy_seed(&sel), 7);
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
