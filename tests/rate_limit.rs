//! Rate limits (Reverb's samples-per-insert ratio) through the async API: getters wait for
//! the minimum size and the ratio, putters wait while inserts run ahead, both honour
//! timeouts and close, the limiter shows in stats and `explain`, and a long randomized run
//! keeps the ratio within its error buffer.

mod common;

use common::assert_invariants;
use rollout_buffer::{BufferConfig, Error, Overflow, RateLimit, RpcDef, Sample, SequenceBuffer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SHORT: Duration = Duration::from_millis(20);

fn sample(id: impl Into<String>) -> Sample {
    Sample::new(id.into()).with("x", vec![1i32])
}

/// One RPC with batches of `n_seqs`, reading each sample up to `reads` times, limited.
fn limited(capacity: usize, n_seqs: usize, reads: u32, limit: RateLimit) -> SequenceBuffer {
    let rpc = RpcDef::new("train", n_seqs)
        .inputs(["x"])
        .reads(reads)
        .rate_limit(limit);
    SequenceBuffer::new(capacity, [rpc]).expect("config")
}

async fn get(buf: &SequenceBuffer) -> Result<rollout_buffer::Batch, Error> {
    buf.get_batch_for_rpc_timeout("train", SHORT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_getter_waits_for_the_minimum_size_then_for_the_ratio() {
    // One sample per insert, min size 4, error buffer 2: diff within [2, 6].
    let buf = limited(16, 1, u32::from(u16::MAX), RateLimit::new(1.0, 4, 2.0));
    for i in 0..3 {
        buf.put_batch(vec![sample(format!("s{i}"))])
            .await
            .expect("put");
    }
    assert!(
        matches!(get(&buf).await, Err(Error::Timeout { .. })),
        "below min size"
    );
    let why = buf.explain("train").expect("explain");
    assert!(why.rate_limited && why.eligible >= 1, "{why:?}");
    buf.put_batch(vec![sample("s3")]).await.expect("put");
    // diff 4: two leases take it to 2, a third would cross min_diff.
    for _ in 0..2 {
        drop(get(&buf).await.expect("allowed"));
    }
    assert!(
        matches!(get(&buf).await, Err(Error::Timeout { .. })),
        "ratio"
    );
    let stats = buf.stats().rpcs[0].rate_limit.expect("limited");
    assert_eq!((stats.inserts, stats.samples), (4, 2));
    assert!(!stats.can_sample && stats.held_gets >= 1, "{stats:?}");
    buf.put_batch(vec![sample("s4")]).await.expect("put");
    drop(get(&buf).await.expect("one more insert, one more lease"));
    assert_invariants(&buf);
}

/// Under `RateLimit::new(1.0, 4, 2.0)` with batches of 1: puts free up to the minimum size
/// (4), then to diff 5 and 6 (`max_diff`); the next put is held, and times out.
async fn fill_until_puts_are_held(buf: &SequenceBuffer) {
    for i in 0..6 {
        buf.put_batch(vec![sample(format!("s{i}"))])
            .await
            .expect("put");
    }
    let held = buf.put_batch_timeout(vec![sample("late")], SHORT).await;
    assert!(matches!(held, Err(Error::Timeout { .. })), "{held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_putter_waits_while_inserts_run_ahead_and_a_lease_lets_it_in() {
    let buf = limited(16, 1, u32::from(u16::MAX), RateLimit::new(1.0, 4, 2.0));
    fill_until_puts_are_held(&buf).await;
    let stats = buf.stats().rpcs[0].rate_limit.expect("limited");
    assert!(!stats.can_insert && stats.held_puts >= 1, "{stats:?}");
    let putter = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.put_batch(vec![sample("late")]).await })
    };
    // Parked before the lease: only the lease's wake-up can let it in.
    common::wait_until(|| buf.stats().waiting_putters == 1).await;
    let batch = buf.get_batch_for_rpc("train").await.expect("lease");
    tokio::time::timeout(Duration::from_secs(10), putter)
        .await
        .expect("the lease let the putter in")
        .expect("task")
        .expect("put");
    drop(batch);
    assert_eq!(buf.len(), 7);
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_releases_getters_and_putters_the_limiter_holds() {
    // min_diff 1, max_diff 3: after puts a, b, c (diff 3) a fourth put waits; after two
    // leases (diff 1) a third lease waits.
    let filled = || async {
        let buf = limited(16, 1, u32::from(u16::MAX), RateLimit::new(1.0, 2, 1.0));
        for id in ["a", "b", "c"] {
            buf.put_batch(vec![sample(id)]).await.expect("put");
        }
        buf
    };
    let buf = filled().await;
    let putter = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.put_batch(vec![sample("d")]).await.map(|_| ()) })
    };
    common::wait_until(|| buf.stats().waiting_putters == 1).await;
    buf.close();
    let outcome = tokio::time::timeout(Duration::from_secs(10), putter)
        .await
        .expect("the putter still waits after close")
        .expect("task");
    assert!(matches!(outcome, Err(Error::Closed)), "{outcome:?}");

    let buf = filled().await;
    for _ in 0..2 {
        drop(get(&buf).await.expect("lease"));
    }
    let getter = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.get_batch_for_rpc("train").await.map(|_| ()) })
    };
    common::wait_until(|| buf.stats().rpcs[0].waiting == 1).await;
    assert!(buf.explain("train").expect("explain").rate_limited);
    buf.close();
    let outcome = tokio::time::timeout(Duration::from_secs(10), getter)
        .await
        .expect("the getter still waits after close")
        .expect("task");
    assert!(matches!(outcome, Err(Error::Closed)), "{outcome:?}");
}

#[test]
fn limits_that_could_deadlock_and_puts_that_could_never_pass_are_refused() {
    let err = SequenceBuffer::new(
        8,
        [RpcDef::new("train", 4)
            .inputs(["x"])
            .rate_limit(RateLimit::new(1.0, 2, 2.0))],
    )
    .expect_err("error buffer below (4 + 1) / 2");
    assert!(
        matches!(err, Error::InvalidRateLimit { ref rpc, .. } if rpc == "train"),
        "{err}"
    );
    for bad in [
        RateLimit::new(0.0, 1, 8.0),
        RateLimit::new(f64::NAN, 1, 8.0),
        RateLimit::new(1.0, 1, -1.0),
    ] {
        let rpc = RpcDef::new("train", 1).inputs(["x"]).rate_limit(bad);
        assert!(matches!(
            SequenceBuffer::new(8, [rpc]),
            Err(Error::InvalidRateLimit { .. })
        ));
    }
    // Error buffer 2 with batches of 1 admits puts of at most 3 once past min size 2.
    let buf = limited(16, 1, 1, RateLimit::new(1.0, 2, 2.0));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let err = rt
        .block_on(buf.put_batch((0..4).map(|i| sample(format!("s{i}"))).collect()))
        .expect_err("too large");
    assert!(
        matches!(err, Error::RateLimitedPut { len: 4, max: 3, .. }),
        "{err}"
    );
    assert!(buf.is_empty(), "a refused put stores nothing");
    let three = (0..3).map(|i| sample(format!("t{i}"))).collect();
    rt.block_on(buf.try_put_batch(three))
        .expect("a put of the largest size passes");
    assert_eq!(buf.len(), 3);
}

/// Asserts that the limiter of `buf`'s one RPC keeps `diff` at most `bounds.1`, and, once
/// anything was leased, at least `bounds.0` (before that, inserts start it from 0).
fn check_diff(buf: &SequenceBuffer, spi: f64, bounds: (f64, f64)) {
    let l = buf.stats().rpcs[0].rate_limit.expect("limited");
    let diff = l.inserts as f64 * spi - l.samples as f64;
    let low = if l.samples > 0 { bounds.0 } else { f64::MIN };
    assert!(
        (low..=bounds.1).contains(&diff),
        "spi {spi}: diff {diff} outside {bounds:?} ({l:?})"
    );
}

/// Putters and consumers at random sizes and speeds: every snapshot keeps
/// `inserts * samples_per_insert - samples` within `[min_diff, max_diff]` (see
/// `check_diff`), and the run ends
/// (no getter and putter wait on each other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_random_run_keeps_the_ratio_within_its_error_buffer() {
    for (spi, reads, n_seqs) in [(1.0, 1u32, 4usize), (2.0, 2, 3)] {
        let (min_size, eb) = (8usize, 8.0);
        let buf = limited(64, n_seqs, reads, RateLimit::new(spi, min_size, eb));
        let bounds = (spi * min_size as f64 - eb, spi * min_size as f64 + eb);
        let target = 1500u64;
        let put = Arc::new(AtomicU64::new(0));
        let putters_done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for p in 0..2u64 {
            let (buf, put, done) = (buf.clone(), Arc::clone(&put), Arc::clone(&putters_done));
            tasks.push(tokio::spawn(async move {
                let mut x = p * 7919 + 11;
                let mut n = 0;
                while put.load(Ordering::Relaxed) < target {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let m = 1 + (x % 3) as usize;
                    let samples = (0..m).map(|i| sample(format!("p{p}-{}", n + i))).collect();
                    n += m;
                    buf.put_batch(samples).await.expect("put");
                    put.fetch_add(m as u64, Ordering::Relaxed);
                    check_diff(&buf, spi, bounds);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }));
        }
        for _ in 0..2 {
            let (buf, done) = (buf.clone(), Arc::clone(&putters_done));
            tasks.push(tokio::spawn(async move {
                // Until both putters are done: one held by the limiter needs leases.
                while done.load(Ordering::Relaxed) < 2 {
                    let Ok(batch) = buf
                        .get_batch_for_rpc_timeout("train", Duration::from_millis(50))
                        .await
                    else {
                        continue;
                    };
                    check_diff(&buf, spi, bounds);
                    batch.commit().await.expect("commit");
                }
            }));
        }
        let all = async {
            for task in tasks {
                task.await.expect("task");
            }
        };
        tokio::time::timeout(Duration::from_secs(60), all)
            .await
            .expect("the run ends: nobody waits on anybody for good");
        check_diff(&buf, spi, bounds);
        let l = buf.stats().rpcs[0].rate_limit.expect("limited");
        assert!(
            l.inserts >= target && l.held_puts + l.held_gets > 0,
            "{l:?}"
        );
        assert_invariants(&buf);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_up_to_the_minimum_size_passes_and_one_held_by_the_limiter_waits_even_under_reject() {
    // min size 4, error buffer 2, batches of 1: the largest put the limit always lets
    // through is 3, but a put that leaves the buffer at or under the minimum size (4)
    // passes too; one of 5 can never pass and is refused.
    let limit = RateLimit::new(1.0, 4, 2.0);
    // Room for 7: the held put of one (after six) finds exactly the room it needs.
    let config = |overflow| {
        BufferConfig::new(7)
            .rpc(
                RpcDef::new("train", 1)
                    .inputs(["x"])
                    .reads(u32::from(u16::MAX))
                    .rate_limit(limit),
            )
            .overflow(overflow)
    };
    let buf = SequenceBuffer::with_config(config(Overflow::Wait)).expect("config");
    let five = (0..5).map(|i| sample(format!("f{i}"))).collect();
    assert!(
        matches!(
            buf.put_batch(five).await,
            Err(Error::RateLimitedPut { len: 5, max: 3, .. })
        ),
        "a put of 5 can never pass"
    );
    let four = (0..4).map(|i| sample(format!("s{i}"))).collect();
    buf.put_batch(four).await.expect("up to the minimum size");
    assert_eq!(buf.len(), 4);
    // Under `Overflow::Reject` a put held only by the limiter still waits: it is not full.
    let buf = SequenceBuffer::with_config(config(Overflow::Reject)).expect("config");
    fill_until_puts_are_held(&buf).await;
    assert_invariants(&buf);
}
