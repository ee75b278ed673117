//! Crash recovery under SIGKILL.
//!
//! This test binary is its own child: with `ROLLOUT_BUFFER_CRASH_URL` set it runs a random
//! workload on a `Durability::Sync` buffer and prints every acknowledged operation; without
//! it, it starts such children on one store, kills each with SIGKILL after a random number
//! of acknowledgements, reopens the store and checks, against everything ever acknowledged:
//!
//! * every acknowledged put is stored, or was consumed (a trainer leased it: only a durable
//!   completion of that lease can have freed it);
//! * every acknowledged amend is in its sample;
//! * no acknowledged completion has a read left (it will not be served again), and a
//!   completed generation's outputs are there;
//! * the archive holds every sample whose training was acknowledged, exactly once, with
//!   the score and tokens it was trained with, and no row twice;
//! * the buffer's invariants hold.
//!
//! Runs on a temp dir and, when `ROLLOUT_BUFFER_S3_URL` is set, on S3.

mod common;

use rollout_buffer::persist::{ArchiveOptions, ArchiveWriter, Durability, PersistOptions};
use rollout_buffer::ExitReason;
use rollout_buffer::{BufferConfig, Patch, RpcDef, Sample, SequenceBuffer, SlotHandle};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const URL_VAR: &str = "ROLLOUT_BUFFER_CRASH_URL";
const RUN_VAR: &str = "ROLLOUT_BUFFER_CRASH_RUN";
const BUDGET_VAR: &str = "ROLLOUT_BUFFER_CRASH_BUDGET";
const KILLS: u64 = 20;
/// A memory budget of a few samples: the children spill and read back all the time, so
/// kills land during spills, rewrites and loads.
const SMALL_BUDGET: u64 = 256;

fn config(budget: Option<u64>) -> BufferConfig {
    let config = BufferConfig::new(256)
        .rpc(RpcDef::new("gen", 2).inputs(["prompt"]).outputs(["tokens"]))
        .rpc(RpcDef::new("train", 2).inputs(["tokens", "score"]))
        .external_keys(["score"]);
    match budget {
        Some(bytes) => config.memory_budget(bytes),
        None => config,
    }
}

fn options() -> PersistOptions {
    PersistOptions::new()
        .durability(Durability::Sync)
        // Small, frequent archive batches, so that kills land in the middle of them.
        .archive(Some(ArchiveOptions {
            max_rows: 8,
            max_delay: Duration::from_millis(20),
            ..ArchiveOptions::default()
        }))
        // Small, so that checkpoints happen (and get killed) too.
        .checkpoint_bytes(16 << 10)
}

fn main() {
    // Test runners (cargo-nextest) list a binary's tests before running them; answer the
    // way libtest does, with the one test this harness runs.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            println!("crash: test");
        }
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Ok(url) = std::env::var(URL_VAR) {
        let run: u64 = std::env::var(RUN_VAR)
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let budget = std::env::var(BUDGET_VAR).ok().and_then(|b| b.parse().ok());
        runtime.block_on(child(url, run, budget));
        return;
    }
    let dir = common::TempDir::new("crash");
    runtime.block_on(parent(dir.path(), None));
    let dir = common::TempDir::new("crash-spill");
    runtime.block_on(parent(dir.path(), Some(SMALL_BUDGET)));
    if let Some(url) = common::s3_url("crash") {
        runtime.block_on(parent(&url, None));
    }
    if let Some(url) = common::s3_url("crash-spill") {
        runtime.block_on(parent(&url, Some(SMALL_BUDGET)));
    }
    println!("crash: ok");
}

/// A small deterministic generator (no dependency, same sequence on every platform).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

// ----- the child -------------------------------------------------------------------------

async fn child(url: String, run: u64, budget: Option<u64>) {
    let store = rollout_buffer::persist::Store::open(&url).expect("store");
    let buf = SequenceBuffer::open_in(store, config(budget), options())
        .await
        .expect("child opens");
    let ack = |what: &str, id: &str| println!("{what} {id}");
    let putter = {
        let buf = buf.clone();
        tokio::spawn(async move {
            let mut rng = Rng(run * 7919 + 1);
            let mut n = 0u64;
            loop {
                let k = 1 + rng.below(4);
                let samples: Vec<Sample> = (0..k)
                    .map(|i| {
                        Sample::new(format!("r{run}-{}", n + i)).with("prompt", vec![n as i32])
                    })
                    .collect();
                n += k;
                let ids: Vec<String> = samples.iter().map(|s| s.id().to_string()).collect();
                let Ok(handles) = buf.put_batch(samples).await else {
                    continue;
                };
                ids.iter().for_each(|id| ack("PUT", id));
                // Score every sample, in a separate amend, right after its put.
                let scores: Vec<Patch> = handles
                    .iter()
                    .map(|h: &SlotHandle| Patch::new().with("score", f64::from(h.slot())))
                    .collect();
                if buf.amend_batch(&handles, scores).await.is_ok() {
                    for (id, h) in ids.iter().zip(&handles) {
                        println!("AMEND {id} {}", h.slot());
                    }
                }
            }
        })
    };
    let worker = |rpc: &'static str, seed: u64| {
        let buf = buf.clone();
        tokio::spawn(async move {
            let mut rng = Rng(seed);
            loop {
                let Ok(batch) = buf
                    .get_batch_for_rpc_timeout(rpc, Duration::from_millis(50))
                    .await
                else {
                    continue;
                };
                let ids: Vec<String> = batch.ids().map(|id| id.to_string()).collect();
                ids.iter().for_each(|id| ack(&format!("LEASE {rpc}"), id));
                if rng.below(8) == 0 {
                    drop(batch); // a consumer that gives up: redelivered
                    continue;
                }
                let done = if rpc == "gen" {
                    let out = ids
                        .iter()
                        .map(|id| Patch::new().with("tokens", vec![id.len() as i32; 8]))
                        .collect();
                    batch.complete(out).await
                } else {
                    batch.commit().await
                };
                if done.is_ok() {
                    ids.iter().for_each(|id| ack(&format!("DONE {rpc}"), id));
                }
            }
        })
    };
    let gen = worker("gen", run * 31 + 5);
    let train = worker("train", run * 17 + 3);
    // Killed from outside long before any of these ends.
    let _ = tokio::join!(putter, gen, train);
}

// ----- the parent ------------------------------------------------------------------------

/// Everything the children acknowledged, over all runs.
#[derive(Default)]
struct Acked {
    put: HashSet<String>,
    amend: HashMap<String, f64>,
    leased_by_train: HashSet<String>,
    done: HashSet<(String, String)>,
}

impl Acked {
    fn record(&mut self, line: &str) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["PUT", id] => {
                self.put.insert((*id).to_owned());
            }
            ["AMEND", id, v] => {
                let v = v.parse().unwrap_or_else(|_| panic!("bad line `{line}`"));
                self.amend.insert((*id).to_owned(), v);
            }
            ["LEASE", "train", id] => {
                self.leased_by_train.insert((*id).to_owned());
            }
            ["LEASE", _, _] => {}
            ["DONE", rpc, id] => {
                self.done.insert(((*rpc).to_owned(), (*id).to_owned()));
            }
            _ => panic!("unexpected child output `{line}`"),
        }
    }
}

async fn parent(url: &str, budget: Option<u64>) {
    let exe = std::env::current_exe().expect("own path");
    let mut acked = Acked::default();
    let mut rng = Rng(0x5eed_u64 ^ std::process::id() as u64);
    for run in 0..KILLS {
        let mut command = Command::new(&exe);
        if let Some(bytes) = budget {
            command.env(BUDGET_VAR, bytes.to_string());
        }
        let mut child = command
            .env(URL_VAR, url)
            .env(RUN_VAR, run.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("child starts");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let kill_after = 1 + rng.below(400);
        let mut seen = 0;
        while seen < kill_after {
            match lines.next() {
                Some(Ok(line)) => {
                    acked.record(&line);
                    seen += 1;
                }
                _ => break,
            }
        }
        child.kill().expect("SIGKILL");
        // What it printed before dying was acknowledged too.
        for line in lines.map_while(Result::ok) {
            acked.record(&line);
        }
        let status = child.wait().expect("reaped");
        assert!(
            !status.success(),
            "run {run}: the child must die by the kill"
        );
        verify(url, run, budget, &acked).await;
    }
    assert!(
        acked.put.len() > 100,
        "the children did work: {}",
        acked.put.len()
    );
    assert!(acked.done.iter().any(|(rpc, _)| rpc == "train"));
    println!(
        "crash: {url} (memory budget {budget:?}): {KILLS} kills; {} puts, {} amends, {} completions acknowledged and recovered",
        acked.put.len(),
        acked.amend.len(),
        acked.done.len()
    );
}

async fn verify(url: &str, run: u64, budget: Option<u64>, acked: &Acked) {
    let store = rollout_buffer::persist::Store::open(url).expect("store");
    let buf = SequenceBuffer::open_in(store, config(budget), options())
        .await
        .unwrap_or_else(|e| panic!("run {run}: recovery failed: {e}"));
    if let Err(e) = buf.check_invariants() {
        panic!("run {run}: {e}");
    }
    // With the spilled fields read back from their segments.
    let contents: HashMap<String, _> = buf
        .contents_loaded()
        .await
        .unwrap_or_else(|e| panic!("run {run}: spilled fields unreadable: {e}"))
        .into_iter()
        .map(|s| (s.sample.id().to_string(), s))
        .collect();
    for id in &acked.put {
        assert!(
            contents.contains_key(id) || acked.leased_by_train.contains(id),
            "run {run}: acknowledged put `{id}` was lost; stats {:?}; {} stored",
            buf.stats(),
            contents.len()
        );
    }
    for (id, score) in &acked.amend {
        if let Some(s) = contents.get(id) {
            let got = s.sample.get("score").and_then(|t| t.scalar_value::<f64>());
            assert_eq!(got, Some(*score), "run {run}: acknowledged amend of `{id}`");
        }
    }
    for (rpc, id) in &acked.done {
        let Some(s) = contents.get(id) else {
            continue;
        };
        assert_eq!(
            s.reads_left.get(rpc),
            Some(&0),
            "run {run}: acknowledged completion of `{id}` by {rpc} would be served again"
        );
        if rpc == "gen" {
            assert!(
                s.sample.get("tokens").is_some(),
                "run {run}: `{id}` lost its tokens"
            );
        }
    }
    // The recovered buffer may have spilled meanwhile: hand the store over cleanly (this
    // also writes what recovery found still waiting for the archive).
    buf.flush()
        .await
        .unwrap_or_else(|e| panic!("run {run}: flush: {e}"));
    let store = rollout_buffer::persist::Store::open(url).expect("store");
    let rows = ArchiveWriter::new(store)
        .read_all()
        .await
        .unwrap_or_else(|e| panic!("run {run}: archive unreadable: {e}"));
    let mut archived: HashMap<String, usize> = HashMap::new();
    for row in &rows {
        let id = row.sample.id().to_string();
        *archived.entry(id.clone()).or_default() += 1;
        if row.reason != ExitReason::Consumed {
            continue;
        }
        assert!(
            acked.leased_by_train.contains(&id),
            "run {run}: `{id}` archived as consumed but never leased for training"
        );
        if let Some(score) = acked.amend.get(&id) {
            let got = row
                .sample
                .get("score")
                .and_then(|t| t.scalar_value::<f64>());
            assert_eq!(
                got,
                Some(*score),
                "run {run}: archived `{id}` lost its score"
            );
        }
        let tokens = row.sample.get("tokens").and_then(|t| {
            t.array::<i32>()
                .map(|a| a.iter().copied().collect::<Vec<i32>>())
        });
        assert_eq!(
            tokens,
            Some(vec![id.len() as i32; 8]),
            "run {run}: archived `{id}` is not what was trained"
        );
    }
    let twice: Vec<_> = archived.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "run {run}: archived more than once: {twice:?}"
    );
    for (rpc, id) in &acked.done {
        if rpc == "train" {
            assert!(
                archived.contains_key(id),
                "run {run}: `{id}` was trained (acknowledged) but is not in the archive"
            );
        }
    }
}
