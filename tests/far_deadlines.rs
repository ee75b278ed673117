//! Timeouts that put a deadline at the clock's far edge wait (without end, in practice)
//! instead of panicking: tokio's timer rounds a deadline up by a millisecond, which
//! overflowed there. Every deadline the crate sets stops thirty years out; each test arms
//! one kind of deadline half a millisecond short of the edge and checks the task that
//! sleeps on it is still working. Most run with the clock paused, so that the deadline is
//! built at exactly the instant the edge was measured from.

mod common;
use common::*;
use rollout_buffer::persist::{Durability, PersistOptions};
use rollout_buffer::rollout::{Added, GroupConfig, GroupIngest, RolloutRecord};
use rollout_buffer::{BufferConfig, RpcDef, SequenceBuffer, CREATED_TS};
use std::future::Future;
use std::time::Duration;

/// A duration that, added to now within the next half millisecond, makes a deadline in the
/// clock's last millisecond.
fn to_the_clocks_edge() -> Duration {
    let now = tokio::time::Instant::now();
    let (mut fits, mut overflows) = (Duration::ZERO, Duration::MAX);
    while overflows - fits > Duration::from_nanos(1) {
        let mid = fits + (overflows - fits) / 2;
        if now.checked_add(mid).is_some() {
            fits = mid;
        } else {
            overflows = mid;
        }
    }
    fits - Duration::from_micros(500)
}

/// Asserts `f` is still waiting after 50 ms (a panic in it fails the test instead).
async fn still_waiting<T>(f: impl Future<Output = T>, what: &str) {
    let r = tokio::time::timeout(Duration::from_millis(50), f).await;
    assert!(r.is_err(), "{what}");
}

fn one_gen(capacity: usize, rpc: RpcDef) -> SequenceBuffer {
    SequenceBuffer::with_config(BufferConfig::new(capacity).rpc(rpc)).expect("buffer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_or_put_timeout_at_the_edge_waits() {
    let buf = one_gen(1, RpcDef::new("gen", 1).inputs(["prompt"]));
    let get = buf.get_batch_for_rpc_timeout("gen", to_the_clocks_edge());
    still_waiting(get, "the get waits").await;
    buf.put_batch(prompts("one", 1)).await.expect("put");
    let put = buf.put_batch_timeout(prompts("two", 1), to_the_clocks_edge());
    still_waiting(put, "the put waits for room").await;
}

/// A getter with nothing to take sleeps until the first lease's deadline.
#[tokio::test(start_paused = true)]
async fn a_lease_timeout_at_the_edge_never_expires() {
    let rpc = RpcDef::new("gen", 1).inputs(["prompt"]);
    let buf = one_gen(2, rpc.lease_timeout(to_the_clocks_edge()));
    buf.put_batch(prompts("one", 1)).await.expect("put");
    let held = buf.get_batch_for_rpc("gen").await.expect("lease");
    still_waiting(buf.get_batch_for_rpc("gen"), "the second getter waits").await;
    assert_eq!(ids(&held), ["one-0"]);
    held.commit().await.expect("commit");
    buf.put_batch(prompts("two", 1)).await.expect("put");
    let next = buf.get_batch_for_rpc("gen").await.expect("served");
    assert_eq!(ids(&next), ["two-0"]);
}

/// A getter waiting for a batch sleeps until the first sample ages out.
#[tokio::test(start_paused = true)]
async fn a_max_age_at_the_edge_never_ages_a_sample() {
    let rpc = RpcDef::new("gen", 2).inputs(["prompt"]);
    let buf = one_gen(4, rpc.max_age(to_the_clocks_edge()));
    // Created an hour from now: an age of zero, so the sample's deadline is the edge.
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
        + 3600.0;
    let born = |id: &str| vec![prompt(id).meta(CREATED_TS, created)];
    buf.put_batch(born("one")).await.expect("put");
    still_waiting(buf.get_batch_for_rpc("gen"), "the getter waits for two").await;
    buf.put_batch(born("two")).await.expect("put");
    let batch = buf.get_batch_for_rpc("gen").await.expect("both fresh");
    assert_eq!(ids(&batch).len(), 2);
}

/// The log's writer sleeps until the oldest queued record is an interval old; a flush
/// still writes at once.
#[tokio::test(start_paused = true)]
async fn an_interval_log_at_the_edge_still_flushes() {
    let dir = TempDir::new("far-interval");
    let options = PersistOptions::default().durability(Durability::Interval(to_the_clocks_edge()));
    let rpcs = [RpcDef::new("gen", 1).inputs(["prompt"])];
    let buf = SequenceBuffer::open(dir.path(), 4, rpcs.clone(), options.clone())
        .await
        .expect("open");
    buf.put_batch(prompts("one", 1)).await.expect("put");
    tokio::time::sleep(Duration::from_millis(20)).await;
    tokio::time::timeout(Duration::from_secs(10), buf.flush())
        .await
        .expect("the writer is alive")
        .expect("flushed");
    buf.close();
    drop(buf);
    let again = SequenceBuffer::open(dir.path(), 4, rpcs, options)
        .await
        .expect("reopen");
    assert_eq!(again.len(), 1);
}

fn rollout(example: usize, k: usize) -> RolloutRecord {
    let mut r = RolloutRecord::new(
        "math",
        format!("ex-{example}"),
        0,
        format!("u-{example}-{k}"),
    );
    r.output_tokens = vec![k as i32; 4];
    r.logprobs = vec![-0.5; 4];
    r.reward = Some(k as f64);
    r
}

/// The ingest's timer sleeps until the first group's seal deadline; after a reconfigure to
/// a short timeout it still seals on time.
#[tokio::test(start_paused = true)]
async fn a_seal_timeout_at_the_edge_leaves_the_timer_working() {
    let buf = one_gen(
        8,
        RpcDef::new("train", 1).inputs(["output_tokens", "reward"]),
    );
    let ingest = GroupIngest::start(
        buf.clone(),
        GroupConfig::new(4).seal_after(to_the_clocks_edge(), 1),
    )
    .await
    .expect("start");
    let added = ingest.add(rollout(1, 0)).await.expect("add");
    assert!(matches!(added, Added::Pending { .. }), "{added:?}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    ingest
        .reconfigure(GroupConfig::new(4).seal_after(Duration::from_millis(10), 1))
        .await
        .expect("reconfigure");
    ingest.add(rollout(2, 0)).await.expect("add");
    let sealed = tokio::time::timeout(Duration::from_secs(10), buf.get_batch_for_rpc("train"))
        .await
        .expect("a group sealed at its timeout")
        .expect("batch");
    assert_eq!(ids(&sealed).len(), 1);
}
