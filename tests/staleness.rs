//! Policy-version and age staleness through the async API: Marin's freshness window at its
//! boundaries, future versions rejected, stale samples dropped (and handed to the sink),
//! leased ones kept until released, and ages on tokio's paused clock.

mod common;

use common::{assert_invariants, ids};
use rollout_buffer::{
    BufferConfig, Error, ExitReason, FreedSink, RpcDef, Sample, SequenceBuffer, CREATED_TS,
    POLICY_VERSION,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Records every sample handed to it, with why it left.
#[derive(Debug, Default, Clone)]
struct Recorder(Arc<Mutex<Vec<(String, &'static str)>>>);

impl FreedSink for Recorder {
    fn consumed(&self, samples: Vec<Arc<Sample>>, _read_by: &[String]) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.extend(samples.iter().map(|s| (s.id().to_string(), "consumed")));
    }

    fn dropped(&self, samples: Vec<Arc<Sample>>, reason: ExitReason) {
        let why = match reason {
            ExitReason::Stale => "stale",
            ExitReason::Evicted => "evicted",
            _ => "other",
        };
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.extend(samples.iter().map(|s| (s.id().to_string(), why)));
    }
}

impl Recorder {
    fn seen(&self) -> Vec<(String, &'static str)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn versioned(id: &str, version: i64) -> Sample {
    Sample::new(id)
        .with("tokens", vec![1i32, 2])
        .meta(POLICY_VERSION, version)
}

/// One trainer RPC with a staleness bound, recording what leaves.
fn trainer(bound: u64, n_seqs: usize) -> (SequenceBuffer, Recorder) {
    let sink = Recorder::default();
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(16)
            .rpc(
                RpcDef::new("train", n_seqs)
                    .inputs(["tokens"])
                    .max_staleness(bound),
            )
            .freed_sink(sink.clone()),
    )
    .expect("valid config");
    (buf, sink)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marin_window_at_its_boundaries() {
    let (buf, sink) = trainer(2, 1);
    buf.set_policy_version(5).expect("first version");
    // current - delay is in; current - delay - 1 is dropped at once; current is in.
    buf.put_batch(vec![
        versioned("in", 3),
        versioned("out", 2),
        versioned("now", 5),
    ])
    .await
    .expect("put");
    assert_eq!(sink.seen(), vec![("out".to_owned(), "stale")]);
    let stats = buf.stats();
    assert_eq!((stats.put, stats.stale, buf.len()), (3, 1, 2));
    // The future is rejected whole, nothing stored.
    let rejected = buf.stats().rejected;
    let err = buf
        .put_batch(vec![versioned("ok", 5), versioned("future", 6)])
        .await
        .expect_err("a version from the future");
    assert!(
        matches!(&err, Error::FutureVersion { id, version: 6, current: 5 } if id == "future"),
        "{err}"
    );
    assert_eq!(buf.len(), 2);
    assert_eq!(
        buf.stats().rejected - rejected,
        2,
        "both samples of the put counted"
    );
    let first = buf.get_batch_for_rpc("train").await.expect("get");
    assert_eq!(ids(&first), ["in"]);
    first.commit().await.expect("commit");
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_the_version_drops_what_fell_out_but_not_what_is_leased() {
    let (buf, sink) = trainer(1, 1);
    buf.set_policy_version(3).expect("version");
    buf.put_batch(vec![
        versioned("v2", 2),
        versioned("v3", 3),
        versioned("v3b", 3),
    ])
    .await
    .expect("put");
    let held = buf.get_batch_for_rpc("train").await.expect("get");
    assert_eq!(ids(&held), ["v2"]);
    buf.set_policy_version(5).expect("raise");
    // v3 and v3b fell out (5 - 1 = 4) and are dropped; v2 is leased and stays.
    assert_eq!(buf.len(), 1);
    let mut seen = sink.seen();
    seen.sort();
    assert_eq!(seen, vec![("v3".into(), "stale"), ("v3b".into(), "stale")]);
    assert_eq!(buf.stats().rpcs[0].eligible, 0);
    assert_invariants(&buf);
    // Released, it cannot be served again: it leaves as stale.
    drop(held);
    assert_eq!(buf.len(), 0);
    assert_eq!(buf.stats().stale, 3);
    assert_eq!(sink.seen().last(), Some(&("v2".to_owned(), "stale")));
    // The same version again is a no-op; an older one is refused.
    buf.set_policy_version(5).expect("same version");
    let err = buf.set_policy_version(4).expect_err("regression");
    assert!(matches!(
        err,
        Error::VersionRegressed {
            current: 5,
            requested: 4
        }
    ));
    assert_eq!(buf.policy_version(), Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_lease_of_a_stale_sample_lands_and_the_sample_leaves() {
    // gen has no bound, train has one: a sample that falls out of train's window while
    // gen holds it is dropped when gen finishes, with gen's output applied first.
    let sink = Recorder::default();
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(8)
            .rpc(RpcDef::new("gen", 1).inputs(["prompt"]).outputs(["tokens"]))
            .rpc(RpcDef::new("train", 1).inputs(["tokens"]).max_staleness(0))
            .freed_sink(sink.clone()),
    )
    .expect("config");
    buf.set_policy_version(0).expect("version");
    buf.put_batch(vec![Sample::new("a")
        .with("prompt", vec![1i32])
        .meta(POLICY_VERSION, 0i64)])
        .await
        .expect("put");
    let gen = buf.get_batch_for_rpc("gen").await.expect("gen");
    buf.set_policy_version(1).expect("raise");
    assert_eq!(buf.len(), 1, "held by gen");
    let out = vec![rollout_buffer::Patch::new().with("tokens", vec![7i32])];
    gen.complete(out).await.expect("complete");
    assert_eq!(buf.len(), 0);
    assert_eq!(sink.seen(), vec![("a".to_owned(), "stale")]);
    assert_invariants(&buf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unversioned_samples_and_bad_metadata() {
    let (buf, _) = trainer(0, 1);
    buf.set_policy_version(10).expect("version");
    // No version: never stale, never from the future.
    buf.put_batch(vec![Sample::new("plain").with("tokens", vec![1i32])])
        .await
        .expect("put");
    buf.set_policy_version(20).expect("raise");
    assert_eq!(buf.len(), 1);
    for (bad, key) in [
        (versioned("neg", -1), POLICY_VERSION),
        (
            Sample::new("str")
                .with("tokens", vec![1i32])
                .meta(POLICY_VERSION, "three"),
            POLICY_VERSION,
        ),
    ] {
        let err = buf.put_batch(vec![bad]).await.expect_err("bad metadata");
        assert!(
            matches!(&err, Error::InvalidMetadata { key: k, .. } if k == key),
            "{err}"
        );
    }
    assert_eq!(buf.len(), 1);
    assert_eq!(buf.stats().rejected, 2);
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn samples_age_out_on_the_buffers_clock() {
    let sink = Recorder::default();
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(8)
            .rpc(
                RpcDef::new("train", 3)
                    .inputs(["tokens"])
                    .max_age(Duration::from_secs(60)),
            )
            .freed_sink(sink.clone()),
    )
    .expect("config");
    let fresh = |id: &str, age: f64| {
        Sample::new(id)
            .with("tokens", vec![1i32])
            .meta(CREATED_TS, unix_now() - age)
    };
    buf.put_batch(vec![
        fresh("old", 3600.0),
        fresh("a", 0.0),
        fresh("b", 30.0),
    ])
    .await
    .expect("put");
    // Already older than the bound: dropped at the put.
    assert_eq!(sink.seen(), vec![("old".to_owned(), "stale")]);
    assert_eq!(buf.len(), 2);
    // 31 s later "b" (30 s old at the put) is past 60 s; "a" is not.
    tokio::time::advance(Duration::from_secs(31)).await;
    let stats = buf.stats();
    assert_eq!((stats.stale, buf.len()), (2, 1));
    // A getter waiting for three samples never sees "b".
    let buf2 = buf.clone();
    let getter = tokio::spawn(async move { buf2.get_batch_for_rpc("train").await });
    tokio::task::yield_now().await;
    buf.put_batch(vec![fresh("c", 0.0), fresh("d", 0.0)])
        .await
        .expect("put");
    let batch = getter.await.expect("join").expect("get");
    let mut got = ids(&batch);
    got.sort();
    assert_eq!(got, ["a", "c", "d"]);
    batch.commit().await.expect("commit");
    // A waiting getter wakes at the next age deadline and reaps on its own: "e", put at
    // 31 s with age 0, ages out at 91 s while the getter waits for more.
    buf.put_batch(vec![fresh("e", 0.0)]).await.expect("put");
    let buf3 = buf.clone();
    let waiter = tokio::spawn(async move {
        buf3.get_batch_for_rpc_timeout("train", Duration::from_secs(120))
            .await
    });
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(buf.len(), 0, "e aged out while a getter waited");
    assert_eq!(sink.seen().last(), Some(&("e".to_owned(), "stale")));
    assert!(matches!(
        waiter.await.expect("join"),
        Err(Error::Timeout { .. })
    ));
    assert_eq!(buf.stats().stale, 3);
    assert_invariants(&buf);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiting_putter_reaps_samples_that_aged_out() {
    let buf = SequenceBuffer::new(
        2,
        [RpcDef::new("train", 2)
            .inputs(["tokens"])
            .max_age(Duration::from_secs(10))],
    )
    .expect("config");
    let aged = |id: &str, age: f64| {
        Sample::new(id)
            .with("tokens", vec![1i32])
            .meta(CREATED_TS, unix_now() - age)
    };
    // a and b have 5 s left; c, waiting for a slot, has 10 s (its age counts while it
    // waits).
    buf.put_batch(vec![aged("a", 5.0), aged("b", 5.0)])
        .await
        .expect("put");
    // Full, and nobody gets or asks for stats: the putter itself wakes at the deadline.
    let buf2 = buf.clone();
    let putter = tokio::spawn(async move { buf2.put_batch(vec![aged("c", 0.0)]).await });
    tokio::time::sleep(Duration::from_secs(6)).await;
    putter
        .await
        .expect("join")
        .expect("put after the others aged out");
    // The putter reaped what was due when it woke (at least one slot); `stats()` reaps the
    // rest (a and b were created microseconds apart).
    assert_eq!(buf.stats().stale, 2);
    assert_eq!(buf.len(), 1);
}

#[cfg(feature = "persist")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_and_evicted_samples_are_archived_with_their_reason() {
    use rollout_buffer::persist::{ArchiveWriter, PersistOptions, Store};
    let dir = common::TempDir::new("stale-archive");
    let buf = SequenceBuffer::open_in(
        Store::open(dir.path()).expect("store"),
        BufferConfig::new(2)
            .rpc(RpcDef::new("train", 1).inputs(["tokens"]).max_staleness(0))
            .overflow(rollout_buffer::Overflow::EvictOldest),
        PersistOptions::default(),
    )
    .await
    .expect("open");
    buf.set_policy_version(1).expect("version");
    buf.put_batch(vec![versioned("old", 1), versioned("evictee", 1)])
        .await
        .expect("put");
    buf.set_policy_version(2).expect("raise"); // both fall out of the window
    buf.put_batch(vec![versioned("a", 2), versioned("b", 2)])
        .await
        .expect("put");
    buf.put_batch(vec![versioned("c", 2)])
        .await
        .expect("put evicts a");
    buf.flush().await.expect("flush");
    let rows = ArchiveWriter::new(Store::open(dir.path()).expect("store"))
        .read_all()
        .await
        .expect("read");
    let mut got: Vec<(String, ExitReason)> = rows
        .iter()
        .map(|r| (r.sample.id().to_string(), r.reason))
        .collect();
    got.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        got,
        vec![
            ("a".to_owned(), ExitReason::Evicted),
            ("evictee".to_owned(), ExitReason::Stale),
            ("old".to_owned(), ExitReason::Stale),
        ]
    );
}
