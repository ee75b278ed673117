//! Reproduces the workload AReaL's `AsyncIOSequenceBuffer` was measured on, and prints one
//! JSON line per capacity:
//!
//! ```text
//! {"capacity": N, "put_per_s": .., "pipeline_per_s": .., "get_p50_us": .., "get_p99_us": ..}
//! ```
//!
//! Workload: RPCs gen (`packed_prompts -> packed_input_ids`), reward (`packed_input_ids ->
//! rewards`), train (`packed_input_ids, rewards`; the last reader frees the slot), all with
//! `n_seqs` 64; puts of 64; metadata-only samples (one scalar per key) built before timing.
//!
//! Each figure is the median of three runs on fresh buffers.
//!
//! * `put_per_s`: samples/s filling empty buffers with puts of 64 (at least 16,384 samples).
//! * `pipeline_per_s`: samples/s trained end to end: one producer putting 64 at a time
//!   under back-pressure, one task per RPC doing get -> complete (gen, reward) or commit
//!   (train), on a 2-worker multi-thread runtime; max(N, 16,384) samples.
//!   `pipeline_1thread_per_s`: the same on a current-thread runtime (one core, like the
//!   single asyncio event loop AReaL runs on).
//! * `get_p50_us` / `get_p99_us`: one `get_batch_for_rpc` call with data ready (buffer kept
//!   full of samples holding every key, gets round-robin over the three RPCs).
//!
//! A last line gives the wake-up latency, from the start of a put to the moment a getter
//! parked on the RPC runs, both tasks on the 2-worker runtime (`wakeup_*`), and with the
//! putter outside the runtime's workers (`wakeup_from_outside_*`, which adds waking a parked
//! worker thread).
//!
//! Usage: `cargo run --release --example areal_workload [-- --capacities 1024,8192]`.

use rollout_buffer::{Patch, RpcDef, Sample, SequenceBuffer, Tensor};
use std::time::{Duration, Instant};

const N_SEQS: usize = 64;
const MIN_SAMPLES: usize = 16_384;

fn rpcs() -> Vec<RpcDef> {
    vec![
        RpcDef::new("gen", N_SEQS)
            .inputs(["packed_prompts"])
            .outputs(["packed_input_ids"]),
        RpcDef::new("reward", N_SEQS)
            .inputs(["packed_input_ids"])
            .outputs(["rewards"]),
        RpcDef::new("train", N_SEQS).inputs(["packed_input_ids", "rewards"]),
    ]
}

fn buffer(capacity: usize) -> SequenceBuffer {
    match SequenceBuffer::new(capacity, rpcs()) {
        Ok(b) => b,
        Err(e) => panic!("invalid workload definition: {e}"),
    }
}

/// Metadata-only samples: one scalar per key, ids `tag-start..`.
fn samples(tag: &str, start: usize, n: usize, keys: &[&'static str]) -> Vec<Vec<Sample>> {
    let all: Vec<Sample> = (start..start + n)
        .map(|i| {
            keys.iter().fold(Sample::new(format!("{tag}-{i}")), |s, k| {
                s.with(*k, Tensor::from(i as i32))
            })
        })
        .collect();
    let mut batches = Vec::with_capacity(n.div_ceil(N_SEQS));
    let mut it = all.into_iter().peekable();
    while it.peek().is_some() {
        batches.push(it.by_ref().take(N_SEQS).collect());
    }
    batches
}

fn ok<T>(r: rollout_buffer::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("buffer call failed: {e}"))
}

/// (a) put throughput into empty buffers.
/// The median of three runs of `f` (each on fresh buffers): the first run in a process also
/// pays for faulting in fresh heap pages, which later runs (and a long-running job) do not.
async fn median3<F: std::future::Future<Output = f64>>(mut f: impl FnMut() -> F) -> f64 {
    let mut v = vec![f().await, f().await, f().await];
    percentile(&mut v, 0.5)
}

async fn measure_put(capacity: usize) -> f64 {
    let rounds = MIN_SAMPLES.div_ceil(capacity).max(1);
    let mut elapsed = Duration::ZERO;
    let mut total = 0usize;
    for round in 0..rounds {
        let buf = buffer(capacity);
        let batches = samples(&format!("put{round}"), 0, capacity, &["packed_prompts"]);
        let t0 = Instant::now();
        for b in batches {
            total += b.len();
            ok(buf.put_batch(b).await);
        }
        elapsed += t0.elapsed();
    }
    total as f64 / elapsed.as_secs_f64()
}

/// (b) end-to-end pipeline throughput.
async fn measure_pipeline(capacity: usize) -> f64 {
    let buf = buffer(capacity);
    let total = capacity.max(MIN_SAMPLES) / N_SEQS * N_SEQS;
    let batches = samples("pipe", 0, total, &["packed_prompts"]);
    let t0 = Instant::now();
    let producer = tokio::spawn({
        let buf = buf.clone();
        async move {
            for b in batches {
                ok(buf.put_batch(b).await);
            }
        }
    });
    let stage = |rpc: &'static str, out: Option<&'static str>| {
        let buf = buf.clone();
        tokio::spawn(async move {
            let mut done = 0usize;
            while done < total {
                let batch = ok(buf.get_batch_for_rpc(rpc).await);
                done += batch.len();
                match out {
                    Some(key) => {
                        let patches = batch
                            .samples()
                            .map(|_| Patch::new().with(key, Tensor::from(1i32)))
                            .collect();
                        ok(batch.complete(patches).await);
                    }
                    None => ok(batch.commit().await),
                }
            }
        })
    };
    let gen = stage("gen", Some("packed_input_ids"));
    let reward = stage("reward", Some("rewards"));
    let train = stage("train", None);
    for task in [producer, gen, reward, train] {
        if let Err(e) = task.await {
            panic!("pipeline task failed: {e}");
        }
    }
    let rate = total as f64 / t0.elapsed().as_secs_f64();
    assert!(buf.is_empty(), "pipeline left samples behind");
    rate
}

/// (c) latency of one get with data ready: the median over three runs (fresh buffers) of
/// each run's p50 and p99, so one noisy run on a shared machine does not decide.
async fn measure_get(capacity: usize) -> (f64, f64) {
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    for _ in 0..3 {
        let (p50, p99) = measure_get_once(capacity).await;
        p50s.push(p50);
        p99s.push(p99);
    }
    (percentile(&mut p50s, 0.5), percentile(&mut p99s, 0.5))
}

async fn measure_get_once(capacity: usize) -> (f64, f64) {
    let keys = ["packed_prompts", "packed_input_ids", "rewards"];
    let buf = buffer(capacity);
    let mut next_id = 0usize;
    let mut refill = |buf: &SequenceBuffer| {
        let free = capacity - buf.len();
        let n = free / N_SEQS * N_SEQS;
        let b = samples("get", next_id, n, &keys);
        next_id += n;
        b
    };
    for b in refill(&buf) {
        ok(buf.put_batch(b).await);
    }
    let calls = 3_000usize.max(3 * capacity / N_SEQS / 4).min(30_000);
    let warmup = 300;
    let mut times = Vec::with_capacity(calls);
    let names = ["gen", "reward", "train"];
    for i in 0..calls + warmup {
        let rpc = names[i % 3];
        if buf.stats().rpcs.iter().any(|r| r.eligible < N_SEQS) {
            for b in refill(&buf) {
                ok(buf.put_batch(b).await);
            }
        }
        let t0 = Instant::now();
        let batch = ok(buf.get_batch_for_rpc(rpc).await);
        let dt = t0.elapsed();
        ok(batch.commit().await);
        if i >= warmup {
            times.push(dt.as_secs_f64() * 1e6);
        }
    }
    (percentile(&mut times, 0.50), percentile(&mut times, 0.99))
}

/// The wake-up measurement run as a task on a worker thread, as producers and consumers
/// are in a tokio application (not on the thread blocked in `Runtime::block_on`, whose
/// wake-ups also pay for waking a parked worker thread).
async fn wakeup_on_worker() -> (f64, f64) {
    match tokio::spawn(measure_wakeup(5_000)).await {
        Ok(r) => r,
        Err(e) => panic!("wake-up measurement failed: {e}"),
    }
}

/// Time from the start of a put until a getter parked on the RPC runs.
async fn measure_wakeup(rounds: usize) -> (f64, f64) {
    let buf = match SequenceBuffer::new(16, [RpcDef::new("r", 1).inputs(["x"])]) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let mut times = Vec::with_capacity(rounds);
    for i in 0..rounds + 100 {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let getter = tokio::spawn({
            let buf = buf.clone();
            async move {
                let b = ok(buf.get_batch_for_rpc("r").await);
                let woke = Instant::now();
                ok(b.commit().await);
                let _ = tx.send(woke);
            }
        });
        // Let the getter park before timing the put.
        while buf.stats().rpcs[0].waiting == 0 {
            tokio::task::yield_now().await;
        }
        let t0 = Instant::now();
        ok(buf
            .put_batch(vec![Sample::new(format!("w{i}")).with("x", 0i32)])
            .await);
        let woke = match rx.await {
            Ok(t) => t,
            Err(e) => panic!("getter vanished: {e}"),
        };
        if i >= 100 {
            times.push(woke.duration_since(t0).as_secs_f64() * 1e6);
        }
        let _ = getter.await;
    }
    (percentile(&mut times, 0.50), percentile(&mut times, 0.99))
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// The 2-worker multi-thread runtime the measurements run on.
fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("cannot start tokio: {e}"),
    }
}

/// A current-thread runtime (one core, like one asyncio event loop).
fn runtime_single() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("cannot start tokio: {e}"),
    }
}

fn main() {
    let mut capacities = vec![1_024usize, 8_192, 65_536, 1_048_576];
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--capacities") {
        if let Some(list) = args.get(i + 1) {
            capacities = list
                .split(',')
                .filter_map(|c| c.trim().parse().ok())
                .collect();
        }
    }
    let runtime = runtime();
    let single = runtime_single();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    if let Some(phase) = only {
        // Profiling aid: one phase, repeated.
        runtime.block_on(async {
            for &capacity in &capacities {
                for _ in 0..5 {
                    match phase.as_str() {
                        "put" => println!("put {:.0}", measure_put(capacity).await),
                        "pipeline" => println!("pipeline {:.0}", measure_pipeline(capacity).await),
                        "pipeline1" => println!(
                            "pipeline 1 thread {:.0}",
                            single.block_on(measure_pipeline(capacity))
                        ),
                        "get" => println!("get {:?}", measure_get(capacity).await),
                        _ => println!("wakeup {:?}", wakeup_on_worker().await),
                    }
                }
            }
        });
        return;
    }
    for &capacity in &capacities {
        let put = runtime.block_on(median3(|| measure_put(capacity)));
        let pipeline = runtime.block_on(median3(|| measure_pipeline(capacity)));
        let pipeline_1t = single.block_on(median3(|| measure_pipeline(capacity)));
        let (p50, p99) = runtime.block_on(measure_get(capacity));
        println!(
            "{{\"capacity\": {capacity}, \"put_per_s\": {put:.0}, \"pipeline_per_s\": {pipeline:.0}, \"pipeline_1thread_per_s\": {pipeline_1t:.0}, \"get_p50_us\": {p50:.2}, \"get_p99_us\": {p99:.2}}}"
        );
    }
    runtime.block_on(async {
        let (w50, w99) = wakeup_on_worker().await;
        // The same from the thread blocked in `block_on`: the wake-up then also wakes a
        // parked worker thread (an OS futex wake), as for a caller outside the runtime.
        let (o50, o99) = measure_wakeup(2_000).await;
        println!(
            "{{\"wakeup_p50_us\": {w50:.2}, \"wakeup_p99_us\": {w99:.2}, \"wakeup_from_outside_p50_us\": {o50:.2}, \"wakeup_from_outside_p99_us\": {o99:.2}}}"
        );
    });
}
