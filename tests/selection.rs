//! Selection policies through the async API: randomised policies are reproducible from
//! their seed, never repeat a sample within a batch, and weigh what they should.

mod common;

use common::{assert_invariants, ids};
use rollout_buffer::{Error, Patch, RpcDef, Sample, Selection, SequenceBuffer, POLICY_VERSION};
use std::collections::{BTreeMap, BTreeSet};

/// A buffer whose one RPC takes `n_seqs` samples under `selection`, holding samples
/// `s000`..`s{n-1}` with births 1..=n (so `s000` is the oldest).
async fn filled(selection: Selection, n_seqs: usize, n: usize) -> SequenceBuffer {
    let buf = SequenceBuffer::new(
        n.max(n_seqs),
        [RpcDef::new("train", n_seqs)
            .inputs(["tokens"])
            .reads(u32::from(u16::MAX))
            .selection(selection)],
    )
    .expect("config");
    let samples = (0..n)
        .map(|i| {
            Sample::new(format!("s{i:03}"))
                .birth(i as u64 + 1)
                .with("tokens", vec![i as i32])
                .with("priority", (i % 4) as f64)
                .meta(POLICY_VERSION, (i % 3) as i64)
        })
        .collect();
    buf.put_batch(samples).await.expect("put");
    buf
}

/// Leases `draws` batches one after another, releasing each (so the pool stays the same);
/// returns the ids of every batch.
async fn draw(buf: &SequenceBuffer, draws: usize) -> Vec<Vec<String>> {
    let mut out = Vec::with_capacity(draws);
    for _ in 0..draws {
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        out.push(ids(&batch));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_seed_same_batches_other_seed_other_batches() {
    for make in [
        |seed| Selection::Uniform { seed },
        |seed| Selection::Recency { alpha: 1.0, seed },
        |seed| Selection::Prioritized {
            key: "priority".into(),
            exponent: 1.0,
            seed,
        },
    ] {
        let a = draw(&filled(make(7), 8, 64).await, 20).await;
        let b = draw(&filled(make(7), 8, 64).await, 20).await;
        let c = draw(&filled(make(8), 8, 64).await, 20).await;
        assert_eq!(a, b, "{:?}", make(7));
        assert_ne!(a, c, "{:?}", make(7));
        for batch in &a {
            let distinct: BTreeSet<&String> = batch.iter().collect();
            assert_eq!(distinct.len(), 8, "a repeat within a batch: {batch:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recency_alpha_3_picks_newer_samples_measurably_more_often() {
    // 100 samples, one per draw, 2,000 draws. Under weights (i+1)^3 the newest ten carry
    // sum(91..=100 i^3) / sum(1..=100 i^3) = 0.3439 of the mass and the oldest ten
    // 3025 / 25502500 = 0.00012. Tolerance: 5 standard deviations of a binomial count.
    let buf = filled(
        Selection::Recency {
            alpha: 3.0,
            seed: 11,
        },
        1,
        100,
    )
    .await;
    let batches = draw(&buf, 2000).await;
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for b in &batches {
        let i: usize = b[0][1..].parse().expect("id");
        *counts.entry(i).or_default() += 1;
    }
    let newest: usize = (90..100)
        .map(|i| counts.get(&i).copied().unwrap_or(0))
        .sum();
    let oldest: usize = (0..10).map(|i| counts.get(&i).copied().unwrap_or(0)).sum();
    let p: f64 = 0.3439;
    let expected = 2000.0 * p;
    let sd = (2000.0 * p * (1.0 - p)).sqrt();
    assert!(
        (newest as f64 - expected).abs() < 5.0 * sd,
        "newest decile drawn {newest} times, expected {expected:.0} +- {:.0}",
        5.0 * sd
    );
    assert!(oldest <= 5, "oldest decile drawn {oldest} times");
    // Uniform, for contrast: the deciles are level.
    let buf = filled(Selection::Uniform { seed: 11 }, 1, 100).await;
    let batches = draw(&buf, 2000).await;
    let newest = batches.iter().filter(|b| b[0].as_str() >= "s090").count();
    let sd = (2000.0f64 * 0.1 * 0.9).sqrt();
    assert!(
        (newest as f64 - 200.0).abs() < 5.0 * sd,
        "uniform: {newest}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prioritized_skips_weightless_samples_while_others_remain() {
    // priority = i % 4: a quarter of the samples weigh nothing.
    let buf = filled(
        Selection::Prioritized {
            key: "priority".into(),
            exponent: 2.0,
            seed: 5,
        },
        16,
        64,
    )
    .await;
    for batch in draw(&buf, 50).await {
        for id in batch {
            let i: usize = id[1..].parse().expect("id");
            assert_ne!(i % 4, 0, "picked weightless {id}");
        }
    }
    // Asking for more than the weighted ones fills up with weightless samples.
    let buf = filled(
        Selection::Prioritized {
            key: "priority".into(),
            exponent: 1.0,
            seed: 5,
        },
        52,
        64,
    )
    .await;
    let batch = draw(&buf, 1).await.remove(0);
    let weightless = batch
        .iter()
        .filter(|id| {
            id[1..]
                .parse::<usize>()
                .map(|i| i % 4 == 0)
                .unwrap_or(false)
        })
        .count();
    assert_eq!(weightless, 52 - 48);
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_policy_fraction_takes_its_share_of_the_current_version() {
    // Versions are i % 3; at current version 2 a third of the samples are on-policy.
    let buf = filled(
        Selection::OnPolicyFraction {
            fraction: 0.75,
            then: Box::new(Selection::Fifo),
        },
        8,
        60,
    )
    .await;
    buf.set_policy_version(2).expect("version");
    for batch in draw(&buf, 10).await {
        let on = batch
            .iter()
            .filter(|id| {
                id[1..]
                    .parse::<usize>()
                    .map(|i| i % 3 == 2)
                    .unwrap_or(false)
            })
            .count();
        assert!(on >= 6, "{on} of 8 on-policy: {batch:?}");
        // Fifo within each part: the on-policy ones are the oldest on-policy samples.
        assert_eq!(batch[0], "s002");
    }
}

#[test]
fn selection_parameters_are_checked() {
    for (selection, what) in [
        (
            Selection::Recency {
                alpha: f64::NAN,
                seed: 0,
            },
            "alpha",
        ),
        (
            Selection::OnPolicyFraction {
                fraction: 1.5,
                then: Box::new(Selection::Fifo),
            },
            "fraction",
        ),
        (
            Selection::Prioritized {
                key: "p".into(),
                exponent: -1.0,
                seed: 0,
            },
            "exponent",
        ),
    ] {
        let err = SequenceBuffer::new(4, [RpcDef::new("r", 1).inputs(["x"]).selection(selection)])
            .expect_err("invalid selection");
        assert!(
            matches!(&err, Error::InvalidSelection { rpc, detail } if rpc == "r" && detail.contains(what)),
            "{err}"
        );
    }
}

/// Chi-square of `counts` against probabilities proportional to `weights`.
fn chi_square(counts: &[u64], weights: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    let total: f64 = weights.iter().sum();
    counts
        .iter()
        .zip(weights)
        .map(|(&c, &w)| {
            let expected = n as f64 * w / total;
            (c as f64 - expected).powi(2) / expected
        })
        .sum()
}

/// A policy's weight of the sample at age rank `i`.
type Weight = Box<dyn Fn(usize) -> f64>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_policy_draws_exactly_its_distribution() {
    // 20 samples (s00 oldest), one per batch, 20,000 batches: the counts against each
    // policy's weights. 19 degrees of freedom: 43.8 is the 0.999 quantile.
    let cases: [(Selection, Weight); 3] = [
        (Selection::Uniform { seed: 3 }, Box::new(|_| 1.0)),
        (
            Selection::Recency {
                alpha: 1.5,
                seed: 3,
            },
            Box::new(|i| ((i + 1) as f64).powf(1.5)),
        ),
        (
            Selection::Prioritized {
                key: "p".into(),
                exponent: 1.5,
                seed: 3,
            },
            Box::new(|i| ((i % 5 + 1) as f64).powf(1.5)),
        ),
    ];
    for (selection, weight) in cases {
        let buf = SequenceBuffer::new(
            20,
            [RpcDef::new("train", 1)
                .inputs(["tokens"])
                .reads(u32::from(u16::MAX))
                .selection(selection.clone())],
        )
        .expect("config");
        let samples = (0..20)
            .map(|i| {
                Sample::new(format!("s{i:02}"))
                    .birth(i as u64 + 1)
                    .with("tokens", vec![i])
                    .with("p", (i % 5 + 1) as f64)
            })
            .collect();
        buf.put_batch(samples).await.expect("put");
        let mut counts = [0u64; 20];
        for batch in draw(&buf, 20_000).await {
            let i: usize = batch[0][1..].parse().expect("id");
            counts[i] += 1;
        }
        let weights: Vec<f64> = (0..20).map(&weight).collect();
        let chi = chi_square(&counts, &weights);
        assert!(
            chi < 43.8,
            "{selection:?}: chi-square {chi:.1}, counts {counts:?}"
        );
        assert_invariants(&buf);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_follow_amends_and_completions_at_once() {
    // `score` writes `p`; `train` weighs by it, so a sample reaches `train` only once scored.
    let buf = SequenceBuffer::new(
        10,
        [
            RpcDef::new("score", 10).inputs(["tokens"]).outputs(["p"]),
            RpcDef::new("train", 1)
                .inputs(["tokens", "p"])
                .reads(u32::from(u16::MAX))
                .selection(Selection::Prioritized {
                    key: "p".into(),
                    exponent: 1.0,
                    seed: 1,
                }),
        ],
    )
    .expect("config");
    let samples = (0..10)
        .map(|i| Sample::new(format!("s{i}")).with("tokens", vec![i]))
        .collect();
    let handles = buf.put_batch(samples).await.expect("put");
    let scored = buf.get_batch_for_rpc("score").await.expect("score");
    // s7 scores 10^6, the others 1: s7 is nearly always drawn.
    let outputs = ids(&scored)
        .iter()
        .map(|id| Patch::new().with("p", if id == "s7" { 1e6 } else { 1.0 }))
        .collect();
    scored.complete(outputs).await.expect("complete");
    let drawn: Vec<String> = draw_from(&buf, "train", 100).await;
    let sevens = drawn.iter().filter(|id| *id == "s7").count();
    assert!(sevens >= 99, "s7 drawn {sevens} of 100 times");
    // Amended to weigh nothing, s7 is never drawn while the others weigh something.
    buf.amend_batch(&handles[7..8], vec![Patch::new().with("p", 0.0)])
        .await
        .expect("amend");
    let drawn = draw_from(&buf, "train", 300).await;
    assert!(
        !drawn.iter().any(|id| id == "s7"),
        "a weightless sample drawn"
    );
    let distinct: BTreeSet<&String> = drawn.iter().collect();
    assert_eq!(distinct.len(), 9, "the other nine share the draws");
    assert_invariants(&buf);
}

/// The first sample of `draws` batches of `rpc`, each released after.
async fn draw_from(buf: &SequenceBuffer, rpc: &str, draws: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(draws);
    for _ in 0..draws {
        let batch = buf.get_batch_for_rpc(rpc).await.expect("get");
        out.push(ids(&batch).remove(0));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_may_be_metadata_and_an_infinite_one_weighs_nothing() {
    // `meta` weighs 10^6 through float metadata, `count` 10^6 through integer metadata,
    // `field` 1 through a field; `inf` has an infinite priority, which weighs nothing.
    let buf = SequenceBuffer::new(
        4,
        [RpcDef::new("train", 1)
            .inputs(["tokens"])
            .reads(u32::from(u16::MAX))
            .selection(Selection::Prioritized {
                key: "p".into(),
                exponent: 1.0,
                seed: 2,
            })],
    )
    .expect("config");
    buf.put_batch(vec![
        Sample::new("meta").with("tokens", vec![1]).meta("p", 1e6),
        Sample::new("count")
            .with("tokens", vec![2])
            .meta("p", 1_000_000i64),
        Sample::new("field").with("tokens", vec![3]).with("p", 1.0),
        Sample::new("inf")
            .with("tokens", vec![4])
            .with("p", f64::INFINITY),
    ])
    .await
    .expect("put");
    let drawn = draw_from(&buf, "train", 300).await;
    let count = |id: &str| drawn.iter().filter(|d| *d == id).count();
    assert!(count("meta") + count("count") >= 295, "{drawn:?}");
    // Each about 150 of 300; 100 is over five standard deviations below.
    assert!(count("meta") >= 100 && count("count") >= 100, "{drawn:?}");
    assert_eq!(count("inf"), 0, "an infinite priority was drawn");
    assert_invariants(&buf);
}

/// 192 weighted samples put in birth order sit in the Prioritized index's blocks of 64 and
/// 128. Once the oldest 49 go stale, the first block (15 left) merges into the full
/// second one: 143 weighted entries for a moment, more than one block's group sums hold.
/// The merged block splits again, and every draw after it takes fresh samples, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prioritized_draws_go_on_after_stale_samples_empty_a_block() {
    let buf = SequenceBuffer::new(
        192,
        [RpcDef::new("train", 7)
            .inputs(["tokens"])
            .max_staleness(0)
            .selection(Selection::Prioritized {
                key: "priority".into(),
                exponent: 1.0,
                seed: 3,
            })],
    )
    .expect("config");
    let samples = (0..192u64)
        .map(|i| {
            Sample::new(format!("s{i:03}"))
                .birth(i + 1)
                .with("tokens", vec![i as i32])
                .with("priority", (i + 1) as f64)
                .meta(POLICY_VERSION, i64::from(i >= 49))
        })
        .collect();
    buf.put_batch(samples).await.expect("put");
    buf.set_policy_version(1).expect("version");
    assert_eq!(buf.stats().rpcs[0].eligible, 143);
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        for id in ids(&batch) {
            let i: usize = id[1..].parse().expect("id");
            assert!(i >= 49, "drew stale {id}");
            assert!(seen.insert(i), "drew {id} twice");
        }
        batch.commit().await.expect("commit");
        assert_invariants(&buf);
    }
    assert_eq!(buf.stats().rpcs[0].eligible, 3);
}
