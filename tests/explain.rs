//! `explain`: why a getter of one RPC would wait, each cause constructed and named; and
//! the warning a long wait logs, counted in the stats, at growing intervals.

mod common;

use common::{prompt, prompts};
use rollout_buffer::{BufferConfig, Error, Patch, RpcDef, SequenceBuffer, Tensor};
use std::time::Duration;

fn tokens(n: usize) -> Vec<Patch> {
    (0..n)
        .map(|_| Patch::new().with("tokens", Tensor::from(vec![7i32; 4])))
        .collect()
}

#[tokio::test]
async fn missing_keys_are_named_with_their_counts() {
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(8)
            .rpc(RpcDef::new("gen", 2).inputs(["prompt"]).outputs(["tokens"]))
            .rpc(RpcDef::new("train", 2).inputs(["tokens", "reward"]))
            .external_keys(["reward"]),
    )
    .expect("config");
    buf.put_batch(prompts("p", 3)).await.expect("put");
    let gen = buf.explain("gen").expect("gen");
    assert!(
        gen.eligible >= 2 && !gen.rate_limited,
        "no limiter holds gen: {gen:?}"
    );
    let train = buf.explain("train").expect("train");
    assert_eq!(
        (train.eligible, train.batch_size, train.incomplete),
        (0, 2, 3)
    );
    // By key, in the order the definitions name them.
    assert_eq!(
        train.missing,
        [("tokens".to_owned(), 3), ("reward".to_owned(), 3)]
    );
    let gen = buf.get_batch_for_rpc("gen").await.expect("gen");
    gen.complete(tokens(2)).await.expect("complete");
    let train = buf.explain("train").expect("train");
    assert_eq!(
        train.missing,
        [("tokens".to_owned(), 1), ("reward".to_owned(), 3)],
        "two samples wait on the verifier's reward, one still on gen"
    );
    assert!(matches!(buf.explain("nope"), Err(Error::UnknownRpc { .. })));
}

#[tokio::test]
async fn leased_and_used_up_samples_are_told_apart() {
    let buf = SequenceBuffer::new(
        8,
        [
            RpcDef::new("a", 2).inputs(["prompt"]),
            RpcDef::new("b", 3).inputs(["prompt"]),
        ],
    )
    .expect("config");
    buf.put_batch(prompts("p", 3)).await.expect("put");
    let held = buf.get_batch_for_rpc("a").await.expect("a");
    let a = buf.explain("a").expect("a");
    assert_eq!((a.leased, a.eligible, a.used_up), (2, 1, 0));
    held.commit().await.expect("commit");
    let a = buf.explain("a").expect("a");
    assert_eq!((a.leased, a.eligible, a.used_up), (0, 1, 2));
    let b = buf.explain("b").expect("b");
    assert_eq!((b.eligible, b.batch_size), (3, 3), "b has not read them");
}

#[tokio::test]
async fn stale_samples_are_named() {
    let buf = SequenceBuffer::new(
        8,
        [
            RpcDef::new("train", 1).inputs(["prompt"]).max_staleness(0),
            RpcDef::new("log", 1).inputs(["prompt"]),
        ],
    )
    .expect("config");
    buf.set_policy_version(1).expect("version");
    let samples = (0..3)
        .map(|i| prompt(format!("s{i}")).meta("policy_version", 1i64))
        .collect();
    buf.put_batch(samples).await.expect("put");
    let held = buf.get_batch_for_rpc("log").await.expect("log");
    assert_eq!(buf.explain("train").expect("train").eligible, 3);
    buf.set_policy_version(2).expect("version");
    // The one `log` holds stays, stale for train, until released; the others are gone.
    let train = buf.explain("train").expect("train");
    assert_eq!(
        (train.eligible, train.stale, train.dropped_stale),
        (0, 1, 2)
    );
    assert_eq!(buf.explain("log").expect("log").leased, 1);
    drop(held);
    let train = buf.explain("train").expect("train");
    assert_eq!((train.eligible, train.dropped_stale), (0, 3));
    assert_eq!(buf.len(), 0);
}

/// A buffer that warns after `after` of waiting, with one prompt for an RPC `train` taking
/// batches of two, and a getter of `train` waiting for the second.
async fn a_getter_short_of_one_sample(
    after: Duration,
) -> (
    SequenceBuffer,
    tokio::task::JoinHandle<Result<rollout_buffer::Batch, Error>>,
) {
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(4)
            .rpc(RpcDef::new("train", 2).inputs(["prompt"]))
            .wait_warning(after),
    )
    .expect("config");
    buf.put_batch(prompts("p", 1)).await.expect("put");
    let getter = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.get_batch_for_rpc("train").await })
    };
    (buf, getter)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_long_wait_warns_at_growing_intervals() {
    let (buf, getter) = a_getter_short_of_one_sample(Duration::from_secs(10)).await;
    let warnings = |buf: &SequenceBuffer| buf.stats().rpcs[0].wait_warnings;
    // Paused time jumps to each timer: warnings at 10 s, then 30 s (10 + 20), then 70 s.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(warnings(&buf), 1);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        warnings(&buf),
        2,
        "the second after twice the first interval"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(warnings(&buf), 2, "the third is due at 70 s");
    buf.put_batch(prompts("q", 1)).await.expect("put");
    let batch = getter.await.expect("join").expect("served");
    assert_eq!(batch.len(), 2);
}

/// A zero threshold warns at 10 ms, then at doubling intervals: a handful of warnings in
/// a second, not one per wake-up.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_zero_threshold_still_warns_at_growing_intervals() {
    let (buf, getter) = a_getter_short_of_one_sample(Duration::ZERO).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // At 10, 30, 70, 150, 310 and 630 ms.
    assert_eq!(buf.stats().rpcs[0].wait_warnings, 6);
    buf.put_batch(prompts("q", 1)).await.expect("put");
    assert_eq!(getter.await.expect("join").expect("served").len(), 2);
}

/// A waiting getter also wakes for other timers (a lease of another RPC expiring here);
/// those wake-ups say nothing: the warning comes only once the getter has waited the
/// threshold.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_wake_up_before_the_threshold_does_not_warn() {
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(4)
            .rpc(
                RpcDef::new("gen", 1)
                    .inputs(["prompt"])
                    .outputs(["tokens"])
                    .lease_timeout(Duration::from_secs(3)),
            )
            .rpc(RpcDef::new("train", 1).inputs(["tokens"]))
            .wait_warning(Duration::from_secs(10)),
    )
    .expect("config");
    buf.put_batch(prompts("p", 1)).await.expect("put");
    let held = buf.get_batch_for_rpc("gen").await.expect("leased");
    let getter = {
        let buf = buf.clone();
        tokio::spawn(async move { buf.get_batch_for_rpc("train").await })
    };
    let warnings = |buf: &SequenceBuffer| buf.stats().rpcs[1].wait_warnings;
    // The lease expires at 3 s, waking the train getter's timer too.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(buf.stats().rpcs[0].expired_leases, 1, "the lease expired");
    assert_eq!(warnings(&buf), 0, "5 s of waiting is below the threshold");
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(warnings(&buf), 1, "warned at 10 s");
    drop(held);
    getter.abort();
}

/// What the buffer logs, as text.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut text = self.0.lock().unwrap_or_else(|e| e.into_inner());
        text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

/// The warning itself, at warn level: how long the getter has waited and why (one sample
/// eligible for a batch of two).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_warning_says_how_long_the_getter_waited_and_why() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let (buf, getter) = a_getter_short_of_one_sample(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let text = logs.text();
    let warning = text
        .lines()
        .find(|l| l.contains("a getter is still waiting"))
        .unwrap_or_else(|| panic!("no warning in {text:?}"));
    for field in [
        "WARN",
        "rpc=train",
        "waited_s=10",
        "batch_size=2",
        "eligible=1",
    ] {
        assert!(warning.contains(field), "{field} not in {warning:?}");
    }
    buf.put_batch(prompts("q", 1)).await.expect("put");
    assert_eq!(getter.await.expect("join").expect("served").len(), 2);
}
