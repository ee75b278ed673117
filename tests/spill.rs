//! Spilling under a memory budget: every sample trained once with its data while the
//! resident bytes stay within budget + one batch; amends of spilled samples; shared
//! loads; segments deleted once their samples are freed. (Failing stores:
//! `spill_faults.rs`; sparse segments rewritten, and read-ahead: `spill_rewrite.rs`.)

mod common;

use common::faulty::FaultyStore;
use common::payload::{self, rollout, SAMPLE_BYTES};
use common::spill::{check, spilled_buffer};
use common::{assert_invariants, TempDir};
use rollout_buffer::persist::Store;
use rollout_buffer::{
    BufferConfig, Error, Overflow, Patch, RpcDef, Selection, SequenceBuffer, Tensor,
};
use std::collections::HashSet;
use std::sync::Arc;

fn local(dir: &TempDir) -> Store {
    Store::open(dir.path()).expect("store")
}

async fn spill_files(store: &Store) -> Vec<String> {
    store.list("spill").await.expect("list")
}

/// The storage suite's spill run: data ten times the budget, every sample trained once
/// with its data, resident bytes within budget + one batch, every segment gone at the end.
async fn ten_times_the_budget(store: Store) {
    const N: u64 = 1_024;
    const BATCH: usize = 16;
    let budget = N * SAMPLE_BYTES / 10;
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(N as usize)
            .rpc(RpcDef::new("train", BATCH).inputs(["tokens", "logp"]))
            .memory_budget(budget)
            .spill_to(store.clone()),
    )
    .expect("buffer");
    let producer = {
        let buf = buf.clone();
        tokio::spawn(async move {
            let mut peak = 0u64;
            for start in (0..N).step_by(BATCH) {
                let batch = (start..(start + BATCH as u64).min(N))
                    .map(rollout)
                    .collect();
                buf.put_batch(batch).await.expect("put");
                peak = peak.max(buf.stats().resident_bytes);
            }
            peak
        })
    };
    // The trainer starts once most of the data is in, so most of it was spilled.
    common::wait_until(|| buf.stats().put >= N * 3 / 4).await;
    let mut seen = HashSet::new();
    let mut peak = 0u64;
    while (seen.len() as u64) < N {
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        for view in batch.samples() {
            assert!(seen.insert(check(&view)), "a sample was trained twice");
        }
        batch.commit().await.expect("commit");
        peak = peak.max(buf.stats().resident_bytes);
    }
    peak = peak.max(producer.await.expect("producer"));
    let one_batch = BATCH as u64 * SAMPLE_BYTES;
    assert!(
        peak <= budget + one_batch,
        "resident peak {peak} over budget {budget} + one batch {one_batch}"
    );
    let stats = buf.stats();
    assert_eq!(stats.freed, N);
    assert!(stats.spill.spilled_samples >= N / 2, "{:?}", stats.spill);
    assert!(stats.spill.loads > 0, "{:?}", stats.spill);
    assert!(
        stats.spill.shared_loads > 0,
        "read-ahead never served a batch: {:?}",
        stats.spill
    );
    assert_invariants(&buf);
    buf.flush().await.expect("flush");
    let spill = buf.stats().spill;
    assert_eq!(spill.live_segments, 0);
    assert_eq!(
        spill_files(&store).await,
        Vec::<String>::new(),
        "segments left after the flush: {spill:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_times_the_budget_on_local_disk() {
    let dir = TempDir::new("spill-10x");
    ten_times_the_budget(local(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_times_the_budget_in_memory_store() {
    ten_times_the_budget(Store::open("memory://").expect("store")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_times_the_budget_on_s3() {
    if let Some(url) = common::s3_url("spill-10x") {
        ten_times_the_budget(Store::open(&url).expect("store")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amending_a_spilled_sample_keeps_the_patch_beside_it() {
    let dir = TempDir::new("spill-amend");
    let (buf, handles) = spilled_buffer(
        local(&dir),
        4,
        vec![RpcDef::new("train", 4).inputs(["tokens", "logp", "reward"])],
    )
    .await;
    let loads_before = buf.stats().spill.loads;
    let patches = (0..4)
        .map(|i| Patch::new().with("reward", i as f64))
        .collect();
    buf.amend_batch(&handles, patches).await.expect("amend");
    assert_eq!(
        buf.stats().spill.loads,
        loads_before,
        "an amend loaded a sample"
    );
    assert_invariants(&buf);
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    for view in batch.samples() {
        let i = check(&view);
        let reward = view.get("reward").and_then(|t| t.scalar_value::<f64>());
        assert_eq!(reward, Some(i as f64), "sample {i}");
    }
    batch.commit().await.expect("commit");
    assert_invariants(&buf);
}

/// On one thread, so both gets register before the loads run: the second finds the
/// first one's loads in flight and waits for them. (Once a load is done and its batch
/// handed out, a later get reads again: loads are shared, not cached.)
#[tokio::test(flavor = "current_thread")]
async fn two_rpcs_reading_one_spilled_sample_share_its_load() {
    let dir = TempDir::new("spill-share");
    let (buf, _) = spilled_buffer(
        local(&dir),
        4,
        vec![
            RpcDef::new("ref", 4).inputs(["tokens"]),
            RpcDef::new("train", 4).inputs(["tokens"]),
        ],
    )
    .await;
    let (a, b) = tokio::join!(buf.get_batch_for_rpc("ref"), buf.get_batch_for_rpc("train"));
    let (a, b) = (a.expect("ref"), b.expect("train"));
    for batch in [&a, &b] {
        assert_eq!(batch.len(), 4);
        for view in batch.samples() {
            assert!(view.get("tokens").is_some());
            assert!(view.get("logp").is_none(), "only the RPC's inputs");
        }
    }
    a.commit().await.expect("commit");
    b.commit().await.expect("commit");
    let spill = buf.stats().spill;
    // Samples 0..2 were spilled (the last fits the budget): each is loaded once in all.
    assert_eq!(spill.loads, 3, "{spill:?}");
    assert_eq!(spill.shared_loads, spill.loads, "{spill:?}");
    buf.flush().await.expect("flush");
    assert_eq!(spill_files(&local(&dir)).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_buffer_spills_to_a_temporary_directory_it_removes() {
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(64)
            .rpc(RpcDef::new("train", 8).inputs(["tokens"]))
            .memory_budget(SAMPLE_BYTES * 2),
    )
    .expect("buffer");
    for i in 0..8 {
        buf.put_batch(vec![rollout(i)]).await.expect("put");
    }
    common::wait_until(|| buf.stats().spill.spilled_now >= 6).await;
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    let tokens: Vec<Tensor> = batch
        .samples()
        .map(|v| v.get("tokens").cloned().expect("tokens"))
        .collect();
    assert_eq!(tokens.len(), 8);
    batch.commit().await.expect("commit");
    let temp: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("rollout-buffer-spill-{}-", std::process::id()))
        })
        .collect();
    assert!(!temp.is_empty(), "spilled under the temp dir");
    drop(buf);
    // Dropping the buffer drops its store (the spiller holds only a weak handle).
    common::wait_until(|| !temp.iter().any(|e| e.path().exists())).await;
}

/// Only being over the budget (or a putter waiting for room) starts a spill: a buffer at
/// its budget, above the low mark the spiller writes down to, keeps its samples in memory
/// when the spiller runs anyway (its first round, here, which the yield lets run on this
/// one thread before the `flush` that waits for it).
#[tokio::test(flavor = "current_thread")]
async fn a_buffer_at_its_budget_spills_nothing() {
    let dir = TempDir::new("spill-at-budget");
    let buf = one_sample_budget(&dir);
    // (spilled now, segments written) once sample `i` is put and the spiller has run.
    let buf = &buf;
    let put = |i| async move {
        buf.put_batch(vec![rollout(i)]).await.expect("put");
        tokio::task::yield_now().await;
        buf.flush().await.expect("flush");
        let spill = buf.stats().spill;
        (spill.spilled_now, spill.segments_written)
    };
    assert_eq!(put(0).await, (0, 0), "{:?}", buf.stats().spill);
    // One more sample is over the budget: the first goes out to make room, and the
    // second, which fits, stays.
    assert_eq!(put(1).await, (1, 1), "{:?}", buf.stats().spill);
    assert_invariants(buf);
}

/// A put that gave up waiting for room leaves no demand behind: once the lease that held
/// the room is given back, nothing is spilled (the spiller made room for no one).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_put_that_gave_up_waiting_for_room_leaves_nothing_to_spill() {
    let dir = TempDir::new("spill-gave-up");
    let buf = one_sample_budget(&dir);
    buf.put_batch(vec![rollout(0)]).await.expect("put");
    // Leased, sample 0 cannot be spilled: the next put waits, then times out.
    let lease = buf.get_batch_for_rpc("train").await.expect("get");
    let late = buf
        .put_batch_timeout(vec![rollout(1)], std::time::Duration::from_secs(1))
        .await;
    assert!(matches!(late, Err(Error::Timeout { .. })), "{late:?}");
    drop(lease);
    tokio::task::yield_now().await;
    buf.flush().await.expect("flush");
    let spill = buf.stats().spill;
    assert_eq!(
        (spill.spilled_now, spill.segments_written),
        (0, 0),
        "{spill:?}"
    );
    assert_invariants(&buf);
}

/// A put refused for room under the memory budget (a `try_put_batch`, or any put under
/// `Overflow::Reject`) has the spiller make it, so a retry gets in (a producer that only
/// tried, or a put under `Reject`, was refused until something else happened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_refused_for_room_gets_in_on_a_retry() {
    for reject in [false, true] {
        let dir = TempDir::new("spill-try-put");
        let mut config = BufferConfig::new(8)
            .rpc(RpcDef::new("train", 1).inputs(["tokens", "logp"]))
            .memory_budget(SAMPLE_BYTES)
            .spill_to(local(&dir));
        if reject {
            config = config.overflow(Overflow::Reject);
        }
        let buf = SequenceBuffer::with_config(config).expect("buffer");
        buf.put_batch(vec![rollout(0)]).await.expect("put");
        let refused = if reject {
            buf.put_batch(vec![rollout(1)]).await
        } else {
            buf.try_put_batch(vec![rollout(1)]).await
        };
        assert!(matches!(refused, Err(Error::Full { .. })), "{refused:?}");
        common::wait_until(|| buf.stats().spill.spilled_now == 1).await;
        buf.try_put_batch(vec![rollout(1)])
            .await
            .expect("room was made");
        assert_eq!(buf.len(), 2);
        assert_invariants(&buf);
    }
}

/// A buffer of 8 slots whose memory budget holds one `rollout`, spilling to `dir`.
fn one_sample_budget(dir: &TempDir) -> SequenceBuffer {
    SequenceBuffer::with_config(
        BufferConfig::new(8)
            .rpc(RpcDef::new("train", 1).inputs(["tokens", "logp"]))
            .memory_budget(SAMPLE_BYTES)
            .spill_to(local(dir)),
    )
    .expect("buffer")
}

/// Outside any runtime, the loads of spilled samples cannot start. `try_get_batch_for_rpc`
/// refuses at once (`NoRuntime`); a get polled there by another executor fails the loads
/// it registered and leaves none behind that nothing would run, so a get inside the
/// runtime reads the samples and is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_outside_a_runtime_leaves_no_load_behind() {
    let dir = TempDir::new("spill-no-runtime");
    let (buf, _) = spilled_buffer(
        local(&dir),
        4,
        vec![RpcDef::new("train", 4).inputs(["tokens", "logp"])],
    )
    .await;
    let outside = buf.clone();
    let (tried, polled) = std::thread::spawn(move || {
        let tried = outside.try_get_batch_for_rpc("train").map(|b| b.is_some());
        let mut get = std::pin::pin!(outside.get_batch_for_rpc("train"));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let polled = match std::future::Future::poll(get.as_mut(), &mut cx) {
            std::task::Poll::Ready(r) => Some(r.map(|b| b.len())),
            std::task::Poll::Pending => None,
        };
        (tried, polled)
    })
    .join()
    .expect("thread");
    assert!(matches!(tried, Err(Error::NoRuntime { .. })), "{tried:?}");
    assert!(
        matches!(polled, Some(Err(Error::NoRuntime { .. }))),
        "{polled:?}"
    );
    assert_eq!(buf.stats().rpcs[0].eligible, 4, "the samples went back");
    let batch = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        buf.get_batch_for_rpc("train"),
    )
    .await
    .expect("the get waited for loads nothing runs")
    .expect("get");
    let ids: HashSet<u64> = batch.samples().map(|v| check(&v)).collect();
    assert_eq!(ids, (0..4).collect());
    batch.commit().await.expect("commit");
    assert_invariants(&buf);
}

/// Only fields of at least 1 KiB are spilled: a spilled sample keeps its small fields (a
/// reward) in memory, where metrics and `Prioritized` selection read them without I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spilled_sample_keeps_its_small_fields_in_memory() {
    let dir = TempDir::new("spill-small-fields");
    let buf = one_sample_budget(&dir);
    for i in 0..4u64 {
        let sample = rollout(i).with("reward", i as f64);
        buf.put_batch(vec![sample]).await.expect("put");
    }
    common::wait_until(|| buf.stats().spill.spilled_now >= 3).await;
    let contents = buf.contents();
    let spilled: Vec<_> = contents.iter().filter(|s| !s.spilled.is_empty()).collect();
    assert!(spilled.len() >= 3, "{} spilled", spilled.len());
    for s in spilled {
        let keys: Vec<&str> = s.spilled.keys().map(String::as_str).collect();
        assert_eq!(keys, ["logp", "tokens"], "sample {}", s.sample.id());
        let i: f64 = s.sample.id().as_str().parse().expect("numeric id");
        let reward = s.sample.get("reward").and_then(|t| t.array::<f64>());
        assert_eq!(
            reward.map(|a| a.iter().copied().collect::<Vec<_>>()),
            Some(vec![i]),
            "sample {i}: the reward stays in memory"
        );
    }
}

/// A load read ahead before an amend replaced a spilled field must not serve the old value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amend_after_read_ahead_is_what_the_next_get_sees() {
    let dir = TempDir::new("spill-ahead");
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(16)
            .rpc(RpcDef::new("train", 1).inputs(["tokens", "logp"]))
            .memory_budget(2048)
            .spill_to(local(&dir)),
    )
    .expect("buffer");
    let mut handles = Vec::new();
    for i in 0..4 {
        handles.extend(buf.put_batch(vec![rollout(i)]).await.expect("put"));
    }
    common::wait_until(|| buf.stats().spill.spilled_now == 4).await;
    // Leasing sample 0 reads samples 1 and 2 ahead.
    let first = buf.get_batch_for_rpc("train").await.expect("get");
    assert_eq!(first.ids().next().map(|id| id.as_str()), Some("0"));
    let replaced = vec![-7i32; payload::TOKENS];
    buf.amend_batch(&handles[1..2], vec![Patch::new().with("tokens", replaced)])
        .await
        .expect("amend");
    // The new tokens are over the budget: they are spilled in a segment of their own.
    common::wait_until(|| {
        let s = buf.stats();
        s.resident_bytes == 0 && s.spill.spilled_samples == 5
    })
    .await;
    first.commit().await.expect("commit");
    let second = buf.get_batch_for_rpc("train").await.expect("get");
    let view = second.sample(0).expect("one sample");
    assert_eq!(view.id().as_str(), "1");
    let tokens = view
        .get("tokens")
        .and_then(|t| t.array::<i32>())
        .expect("tokens");
    assert!(tokens.iter().all(|&t| t == -7), "the amended tokens");
    let logp = view
        .get("logp")
        .and_then(|t| t.array::<f32>())
        .expect("logp");
    assert_eq!(logp[3], -3.0 - 1.0, "the logprobs from the first spill");
    second.commit().await.expect("commit");
    assert_invariants(&buf);
}

/// A sink that keeps every sample it gets, consumed or dropped.
#[derive(Debug, Default, Clone)]
struct Collect(Arc<std::sync::Mutex<Vec<Arc<rollout_buffer::Sample>>>>);

impl rollout_buffer::FreedSink for Collect {
    fn consumed(&self, samples: Vec<Arc<rollout_buffer::Sample>>, _read_by: &[String]) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(samples);
    }

    fn dropped(&self, samples: Vec<Arc<rollout_buffer::Sample>>, _: rollout_buffer::ExitReason) {
        self.consumed(samples, &[]);
    }
}

/// A spilled buffer with a sink (see [`one_segment_with_a_sink`]).
struct WithSink {
    faulty: Arc<FaultyStore>,
    store: Store,
    sink: Collect,
    buf: SequenceBuffer,
    handles: Vec<rollout_buffer::SlotHandle>,
}

/// A buffer whose `n` samples (0..n) sit in one spill segment on a `FaultyStore`, with a
/// sink and one RPC `train` of batches of `n` reading `inputs`.
async fn one_segment_with_a_sink(dir: &TempDir, inputs: &[&str], n: u64) -> WithSink {
    let faulty = FaultyStore::on_local_dir(dir.path());
    let store = Store::from_object_store(Arc::clone(&faulty) as _, "");
    let sink = Collect::default();
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(64)
            .rpc(RpcDef::new("train", n as usize).inputs(inputs.iter().copied()))
            .memory_budget(SAMPLE_BYTES)
            .spill_to(store.clone())
            .freed_sink(sink.clone()),
    )
    .expect("buffer");
    // One oversized put (it fits an empty buffer), spilled as one segment.
    let handles = buf
        .put_batch((0..n).map(rollout).collect())
        .await
        .expect("put");
    common::wait_until(|| buf.stats().spill.spilled_now == n).await;
    assert_eq!(buf.stats().spill.segments_written, 1);
    WithSink {
        faulty,
        store,
        sink,
        buf,
        handles,
    }
}

impl Collect {
    /// The samples consumed so far, checked against `payload::rollout`; returns their
    /// numbers, sorted.
    fn checked(&self) -> Vec<u64> {
        let got = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut numbers: Vec<u64> = got
            .iter()
            .map(|s| payload::check(s.id().as_str(), |k| s.get(k)))
            .collect();
        numbers.sort_unstable();
        numbers
    }
}

fn spill_gets(faulty: &FaultyStore) -> usize {
    faulty.spill_gets.load(std::sync::atomic::Ordering::SeqCst)
}

/// Freed spilled samples reach the sink whole. The fields the committing batch loaded
/// are handed over as they are; the others (here the logprobs, which the trainer does not
/// read) are read back with one read per segment, not one per sample.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freed_spilled_samples_reach_the_sink_whole_with_one_read_per_segment() {
    const N: u64 = 16;
    for (inputs, reads) in [(&["tokens"][..], 1), (&["tokens", "logp"][..], 0)] {
        let dir = TempDir::new("spill-handover");
        let WithSink {
            faulty,
            store,
            sink,
            buf,
            ..
        } = one_segment_with_a_sink(&dir, inputs, N).await;
        let batch = buf.get_batch_for_rpc("train").await.expect("get");
        assert_eq!(batch.len(), N as usize);
        let before = spill_gets(&faulty);
        batch.commit().await.expect("commit");
        buf.flush().await.expect("flush");
        assert_eq!(
            spill_gets(&faulty) - before,
            reads,
            "reads to hand over {N} samples of one segment, trained on {inputs:?}"
        );
        assert_eq!(sink.checked(), (0..N).collect::<Vec<_>>());
        assert!(spill_files(&store).await.is_empty());
        assert_invariants(&buf);
    }
}

/// A discarded batch's samples reach the sink whole too, from the fields it loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discarded_batch_hands_its_loaded_fields_to_the_sink() {
    const N: u64 = 8;
    let dir = TempDir::new("spill-handover-discard");
    let WithSink {
        faulty, sink, buf, ..
    } = one_segment_with_a_sink(&dir, &["tokens", "logp"], N).await;
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    let before = spill_gets(&faulty);
    batch.discard().expect("discard");
    buf.flush().await.expect("flush");
    assert_eq!(spill_gets(&faulty) - before, 0, "reads to hand over");
    assert_eq!(sink.checked(), (0..N).collect::<Vec<_>>());
    assert_eq!(buf.stats().filtered, N);
    assert_invariants(&buf);
}

/// A sample amended while its batch holds loaded fields reaches the sink with the patch,
/// not the loaded copy of the key it replaced, and with the loaded copies of the others.
/// (A leased sample is not idle, so the patch stays in memory until the commit frees it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amend_while_leased_wins_over_the_loaded_fields_in_the_sink() {
    const N: u64 = 4;
    let dir = TempDir::new("spill-handover-amend");
    let WithSink {
        sink, buf, handles, ..
    } = one_segment_with_a_sink(&dir, &["tokens", "logp"], N).await;
    let batch = buf.get_batch_for_rpc("train").await.expect("get");
    let replaced = vec![-7i32; payload::TOKENS];
    buf.amend_batch(&handles[1..2], vec![Patch::new().with("tokens", replaced)])
        .await
        .expect("amend");
    batch.commit().await.expect("commit");
    buf.flush().await.expect("flush");
    let got = sink.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(got.len(), N as usize);
    for s in &got {
        let tokens = s
            .get("tokens")
            .and_then(|t| t.array::<i32>())
            .expect("tokens");
        let logp = s.get("logp").and_then(|t| t.array::<f32>()).expect("logp");
        let i: u64 = s.id().as_str().parse().expect("number");
        if i == 1 {
            assert_eq!(tokens.len(), payload::TOKENS, "the amended tokens");
            assert!(tokens.iter().all(|&t| t == -7), "the amended tokens");
            assert_eq!(logp[3], -3.0 - 1.0, "the spilled logprobs");
        } else {
            payload::check(s.id().as_str(), |k| s.get(k));
        }
    }
    assert_invariants(&buf);
}

/// Spill segment files under a local store's directory.
fn local_spill_files(dir: &TempDir) -> usize {
    std::fs::read_dir(std::path::Path::new(dir.path()).join("spill"))
        .map(|entries| entries.filter_map(Result::ok).count())
        .unwrap_or(0)
}

/// A segment whose last rows are freed while an earlier hand-over still has to read it
/// back is deleted only after that read: the second hand-over, which has every field at
/// hand, leaves it to the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_outlives_the_hand_overs_that_read_it() {
    let dir = TempDir::new("spill-handover-race");
    let faulty = FaultyStore::on_local_dir(dir.path());
    let store = Store::from_object_store(Arc::clone(&faulty) as _, "");
    let sink = Collect::default();
    let buf = SequenceBuffer::with_config(
        BufferConfig::new(64)
            // `a` loads the tokens only (its frees read the logprobs back), `b` both.
            .rpc(
                RpcDef::new("a", 8)
                    .inputs(["tokens"])
                    .selection(Selection::Lifo),
            )
            .rpc(RpcDef::new("b", 8).inputs(["tokens", "logp"]))
            .memory_budget(SAMPLE_BYTES)
            .spill_to(store)
            .freed_sink(sink.clone()),
    )
    .expect("buffer");
    buf.put_batch((0..16).map(rollout).collect())
        .await
        .expect("put");
    common::wait_until(|| buf.stats().spill.spilled_now == 16).await;
    assert_eq!(local_spill_files(&dir), 1);
    // Each RPC reads one half; then `a` takes the first half (freeing it needs a read
    // back) and `b` the second (freeing it needs none).
    let ids = |batch: &rollout_buffer::Batch| -> Vec<u64> {
        batch
            .ids()
            .map(|id| id.as_str().parse().expect("number"))
            .collect()
    };
    let first = buf.get_batch_for_rpc("b").await.expect("get");
    assert_eq!(ids(&first), (0..8).collect::<Vec<_>>());
    first.commit().await.expect("commit");
    let second = buf.get_batch_for_rpc("a").await.expect("get");
    assert!(ids(&second).iter().all(|&i| i >= 8));
    second.commit().await.expect("commit");
    let reads_back = buf.get_batch_for_rpc("a").await.expect("get");
    let all_at_hand = buf.get_batch_for_rpc("b").await.expect("get");
    assert!(ids(&all_at_hand).iter().all(|&i| i >= 8));

    faulty.hold_reads_after(0);
    reads_back.commit().await.expect("commit");
    common::wait_until(|| faulty.held_reads.load(std::sync::atomic::Ordering::SeqCst) == 1).await;
    all_at_hand.commit().await.expect("commit");
    common::wait_until(|| sink.0.lock().unwrap_or_else(|e| e.into_inner()).len() == 8).await;
    // The segment stays while the first hand-over's read is held.
    let gone = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        common::wait_until(|| local_spill_files(&dir) == 0),
    )
    .await
    .is_ok();
    assert!(!gone, "the segment was deleted before a hand-over read it");
    faulty.release_reads();
    buf.flush().await.expect("flush");
    assert_eq!(sink.checked(), (0..16).collect::<Vec<_>>());
    assert_eq!(local_spill_files(&dir), 0);
    assert_invariants(&buf);
}
