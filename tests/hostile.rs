//! Hostile bytes in a stored run: every single-byte flip, every truncation and every
//! zero-filled tail of each log group, manifest and checkpoint segment of a small run.
//! Opening the damaged store must give a typed error or a state the undamaged run passed
//! through (a torn last log group is skipped, as documented), never a panic, never a
//! hang, and never a sample whose values changed. Salvage (`persist::repair`, then a strict
//! open) must always open, and hold only samples the run held, each once.
#![cfg(feature = "persist")]

mod common;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rollout_buffer::persist::{Durability, PersistOptions, Store};
use rollout_buffer::{BufferConfig, Error, Patch, RpcDef, Sample, SequenceBuffer, StoredSample};
use std::sync::Arc;
use std::time::Duration;

fn config(budget: Option<u64>) -> BufferConfig {
    let config = BufferConfig::new(8)
        .rpc(RpcDef::new("gen", 1).inputs(["prompt"]).outputs(["tokens"]))
        .rpc(RpcDef::new("train", 1).inputs(["tokens"]));
    match budget {
        Some(bytes) => config.memory_budget(bytes),
        None => config,
    }
}

fn options(checkpoint_bytes: u64) -> PersistOptions {
    PersistOptions::new()
        .durability(Durability::Sync)
        .archive(None)
        .checkpoint_bytes(checkpoint_bytes)
}

type Files = Vec<(Path, Bytes)>;

async fn files_of(mem: &InMemory) -> Files {
    let metas: Vec<_> = mem.list(None).try_collect().await.expect("list");
    let mut out = Vec::new();
    for m in metas {
        let bytes = mem
            .get(&m.location)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        out.push((m.location, bytes));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

async fn store_with(files: &Files) -> Store {
    let mem = Arc::new(InMemory::new());
    for (path, bytes) in files {
        mem.put(path, PutPayload::from(bytes.clone()))
            .await
            .expect("put");
    }
    Store::from_object_store(mem, "")
}

fn sorted(mut c: Vec<StoredSample>) -> Vec<(String, Sample)> {
    c.sort_by(|a, b| a.sample.id().cmp(b.sample.id()));
    c.into_iter()
        .map(|s| (s.sample.id().to_string(), s.sample))
        .collect()
}

/// How a run is set up: checkpoint threshold and memory budget (spilling).
#[derive(Clone, Copy)]
struct Setup {
    checkpoint_bytes: u64,
    budget: Option<u64>,
}

/// Opens `files` and reads every sample back, spilled fields included: `Ok(contents)`, or
/// the error; a hang fails the test.
async fn open(files: &Files, setup: Setup) -> Result<Vec<(String, Sample)>, Error> {
    read_back(files, setup, false).await
}

/// Repairs a copy of `files`, then opens it strictly.
async fn salvage(files: &Files, setup: Setup) -> Result<Vec<(String, Sample)>, Error> {
    read_back(files, setup, true).await
}

/// Repairs a copy of `files`, then opens it strictly, reading nothing.
async fn opens_after_repair(files: &Files, setup: Setup) -> Result<(), Error> {
    let store = store_with(files).await;
    let open = async {
        rollout_buffer::persist::repair(&store).await?;
        SequenceBuffer::open_in(store, config(setup.budget), options(setup.checkpoint_bytes))
            .await
            .map(drop)
    };
    tokio::time::timeout(Duration::from_secs(20), open)
        .await
        .unwrap_or_else(|_| panic!("repairing and opening a damaged store hung"))
}

async fn read_back(
    files: &Files,
    setup: Setup,
    repair: bool,
) -> Result<Vec<(String, Sample)>, Error> {
    let store = store_with(files).await;
    let read = async {
        if repair {
            rollout_buffer::persist::repair(&store).await?;
        }
        let buf =
            SequenceBuffer::open_in(store, config(setup.budget), options(setup.checkpoint_bytes))
                .await?;
        buf.contents_loaded().await
    };
    let contents = tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .unwrap_or_else(|_| panic!("opening a damaged store hung (repair first: {repair})"));
    contents.map(sorted)
}

/// A small run: puts, an amend through a completion, a consumed sample.
async fn run(setup: Setup) -> Files {
    let mem = Arc::new(InMemory::new());
    let store = Store::from_object_store(Arc::clone(&mem) as _, "");
    let buf = SequenceBuffer::open_in(store, config(setup.budget), options(setup.checkpoint_bytes))
        .await
        .expect("open");
    // Spilling moves only fields of 1 KiB or more.
    let len = if setup.budget.is_some() { 300 } else { 5 };
    for i in 0..3 {
        let s = Sample::new(format!("s{i}"))
            .with("prompt", vec![i; len])
            .meta("policy_version", i64::from(i));
        buf.put_batch(vec![s]).await.expect("put");
    }
    if setup.budget.is_some() {
        // Left spilled: the earlier puts had to make room for the later ones.
        common::wait_until(|| buf.stats().spill.spilled_now >= 2).await;
        buf.flush().await.expect("flush");
        drop(buf);
        return files_of(&mem).await;
    }
    for _ in 0..2 {
        let batch = buf.get_batch_for_rpc("gen").await.expect("gen");
        let patch = Patch::new().with("tokens", vec![7i32, 8, 9]);
        batch.complete(vec![patch]).await.expect("complete");
    }
    let train = buf.get_batch_for_rpc("train").await.expect("train");
    train.commit().await.expect("commit");
    buf.flush().await.expect("flush");
    drop(buf);
    files_of(&mem).await
}

/// Every state the run passed through, as recovery sees it: the run with its last `k`
/// log groups gone, for every `k`.
async fn states(files: &Files, setup: Setup) -> Vec<Vec<(String, Sample)>> {
    let logs: Vec<usize> = (0..files.len())
        .filter(|&i| files[i].0.as_ref().starts_with("wal/"))
        .collect();
    let mut out = Vec::new();
    for k in 0..=logs.len() {
        let kept: Files = files
            .iter()
            .enumerate()
            .filter(|(i, _)| !logs[logs.len() - k..].contains(i))
            .map(|(_, f)| f.clone())
            .collect();
        if let Ok(state) = open(&kept, setup).await {
            out.push(state);
        }
    }
    out
}

/// Each damage of the file at `at`: a flipped byte anywhere, a truncation at any length, a
/// tail of zeros of any length.
fn damages(bytes: &Bytes) -> Vec<(String, Bytes)> {
    let n = bytes.len();
    let mut out = Vec::with_capacity(3 * n);
    for i in 0..n {
        let mut b = bytes.to_vec();
        b[i] ^= 0xFF;
        out.push((format!("byte {i} flipped"), Bytes::from(b)));
        out.push((format!("cut to {i} bytes"), bytes.slice(..i)));
        let mut z = bytes.to_vec();
        z[i..].fill(0);
        out.push((format!("zeros from byte {i}"), Bytes::from(z)));
    }
    out
}

/// A thread that ends the process, naming the damage, when the sweep sends no word for
/// [`HANG`]: a synchronous loop in a decoder holds the test runtime's only thread, where
/// `tokio::time::timeout` never gets to fire, so only another thread can tell a hang.
fn watchdog() -> std::sync::mpsc::Sender<String> {
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut last = String::from("the undamaged run");
        loop {
            match rx.recv_timeout(HANG) {
                Ok(what) => last = what,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    eprintln!("hung for {HANG:?} on {last}");
                    std::process::abort();
                }
            }
        }
    });
    tx
}

/// Longer than any one damage takes to open and salvage (milliseconds in a debug build).
const HANG: Duration = Duration::from_secs(60);

async fn sweep(setup: Setup, kinds: &[&str]) -> usize {
    let alive = watchdog();
    let files = run(setup).await;
    let good = states(&files, setup).await;
    assert!(!good.is_empty(), "the undamaged run opens");
    let mut tried = 0;
    for (at, (path, bytes)) in files.iter().enumerate() {
        if !kinds.iter().any(|k| path.as_ref().starts_with(k)) {
            continue;
        }
        for (what, damaged) in damages(bytes) {
            // The watchdog ends only when the sweep does: a send cannot fail before.
            let _ = alive.send(format!("{path} with {what}"));
            let mut copy = files.clone();
            copy[at].1 = damaged;
            tried += 1;
            match open(&copy, setup).await {
                Ok(state) => assert!(
                    good.contains(&state),
                    "{path} with {what} opened as a state the run never had: {state:?}"
                ),
                Err(Error::Corrupt { .. } | Error::Storage { .. } | Error::Incompatible { .. }) => {
                }
                Err(other) => panic!("{path} with {what}: an unexpected error {other:?}"),
            }
            // Salvage always opens, and keeps only samples the run really held.
            if !path.as_ref().starts_with("spill") {
                let salvaged = salvage(&copy, setup)
                    .await
                    .unwrap_or_else(|e| panic!("{path} with {what}: salvage failed: {e}"));
                for pair in salvaged.windows(2) {
                    assert_ne!(
                        pair[0].0, pair[1].0,
                        "{path} with {what}: salvage duplicated"
                    );
                }
                for sample in &salvaged {
                    assert!(
                        good.iter().any(|state| state.contains(sample)),
                        "{path} with {what}: salvage invented {sample:?}"
                    );
                }
            } else {
                // A damaged spill segment never keeps a store from opening: its samples'
                // loads fail instead, naming it (checked above), so salvage has nothing to
                // move, and the store opens after it too.
                opens_after_repair(&copy, setup)
                    .await
                    .unwrap_or_else(|e| panic!("{path} with {what}: salvage failed: {e}"));
            }
        }
    }
    tried
}

#[tokio::test(flavor = "current_thread")]
async fn damaged_log_groups_never_panic_hang_or_invent_values() {
    let setup = Setup {
        checkpoint_bytes: 64 << 20,
        budget: None,
    };
    let tried = sweep(setup, &["wal/"]).await;
    assert!(tried > 100, "{tried} damages tried");
}

#[tokio::test(flavor = "current_thread")]
async fn damaged_checkpoints_never_panic_hang_or_invent_values() {
    // A checkpoint after every log group: manifests and segments to damage.
    let setup = Setup {
        checkpoint_bytes: 1,
        budget: None,
    };
    let tried = sweep(setup, &["manifest/", "segments/"]).await;
    assert!(tried > 100, "{tried} damages tried");
}

#[tokio::test(flavor = "current_thread")]
async fn damaged_spill_segments_never_panic_hang_or_invent_values() {
    // A memory budget of about one sample: fields go to spill segments, read back by the
    // crate's own page decoder.
    let setup = Setup {
        checkpoint_bytes: 64 << 20,
        budget: Some(1300),
    };
    let files = run(setup).await;
    assert!(
        files.iter().any(|(p, _)| p.as_ref().starts_with("spill/")),
        "the run spilled"
    );
    let tried = sweep(setup, &["spill/"]).await;
    assert!(tried > 100, "{tried} damages tried");
}
