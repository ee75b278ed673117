//! Load on the server from a real HTTP client on loopback: 64 concurrent connections
//! writing slime-shaped items of about 4 KB while one reader polls `/get_rollout_data`.
//! Prints one JSON line per mode:
//! `{"mode": "single" | "batch", "items_per_s", "p50_ms", "p99_ms", "rss_mb", ...}`
//! (`single`: one item per `/buffer/write`; `batch`: 256 per `/buffer/write_batch` as a
//! JSON array; `arrow`: the same as an Arrow IPC stream, and reads answered as Arrow
//! streams; latencies per request; `rss_mb`: the server's peak resident memory).
//!
//! ```sh
//! cargo bench -p rollout-buffer-server --bench load -- [seconds] [durability] [modes]
//! ```
//!
//! `LOAD_CAPACITY` sets the server's `--capacity` (groups, 1024 by default) and
//! `LOAD_SERVER_ARGS` adds options to its command line. `LOAD_SERVER` runs another
//! `rollout-buffer` command as the server instead of this build's binary: the Python
//! package's console script, say (`LOAD_SERVER=$(which rollout-buffer)`), which runs the
//! same server inside a Python process.
//!
//! `LOAD_SERVER=discard`, `LOAD_SERVER=parse` and `LOAD_SERVER=echo` measure the ceiling
//! this machine puts on any server under the same client: a server that reads each
//! request's body and answers at once (`discard`), or that also parses it (JSON into
//! values, Arrow into batches: `parse`), storing nothing, its reads answering no items; or
//! one that keeps what it parsed in memory (as much as the real server holds) and answers
//! each read with the oldest 2,048 items, as slime's JSON envelope or an Arrow stream (`echo`: the least any server of this wire
//! format does, with no grouping, log or archive). It runs as its own process (this bench
//! binary again), as the real server does.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 64;
const ARROW: &str = "application/vnd.apache.arrow.stream";
const GROUP: usize = 8;
const BATCH: usize = 256;
/// Groups the server holds (its memory bound: about this many x 8 items x 4 KB), unless
/// `LOAD_CAPACITY` says otherwise.
const CAPACITY: &str = "1024";

fn start(store: &std::path::Path, durability: &str) -> (Child, String) {
    let command = server_command();
    let mut command = match NullServer::named(&command) {
        Some(_) => {
            let mut own = Command::new(std::env::current_exe().expect("this bench's path"));
            own.env(NULL_SERVER, &command);
            own
        }
        None => Command::new(command),
    };
    let mut child = command
        .args(["serve", "--listen", "127.0.0.1:0", "--capacity"])
        .arg(std::env::var("LOAD_CAPACITY").unwrap_or_else(|_| CAPACITY.into()))
        .args([
            "--group-size",
            &GROUP.to_string(),
            "--durability",
            durability,
        ])
        .arg("--store")
        .arg(store)
        .args(
            std::env::var("LOAD_SERVER_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("first line");
    let url = line.trim().trim_start_matches("listening on ").to_owned();
    (child, url)
}

/// The server's command: `LOAD_SERVER`, or this build's binary.
fn server_command() -> String {
    std::env::var("LOAD_SERVER").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rollout-buffer").into())
}

/// The environment variable that makes this binary a null server of the kind it names.
const NULL_SERVER: &str = "LOAD_NULL_SERVER";

/// A server that stores nothing: the ceiling of the client, HTTP and (for `Parse`) the
/// parsing of bodies on this machine.
#[derive(Clone, Copy, PartialEq)]
enum NullServer {
    /// Reads each body whole and answers.
    Discard,
    /// Reads each body and parses it as the real server must before storing it.
    Parse,
    /// Parses each body, keeps the items in memory and hands the oldest to each read.
    Echo,
}

/// What an `Echo` server holds between a write and the read that takes it.
#[derive(Default)]
struct Echoed {
    /// Each item's JSON text, checked as JSON but not taken apart (the least a JSON
    /// server does with an item it passes on).
    items: Vec<Box<serde_json::value::RawValue>>,
    batches: Vec<arrow_array::RecordBatch>,
    rows: usize,
}

/// Items an `Echo` read answers at most: a trainer's batch. Answers of everything held (32
/// MB of JSON) cost the reader more per item than the real server's smaller ones.
const ECHO_READ: usize = 2048;
/// How long an `Echo` write waits for room (the real server's `--write-timeout`).
const ECHO_WAIT: Duration = Duration::from_secs(2);

/// An `Echo` server's items and the wake-up of writes waiting for room.
struct EchoStore {
    held: std::sync::Mutex<Echoed>,
    room: tokio::sync::Notify,
    /// Items it holds at most: what the real server holds (`LOAD_CAPACITY` groups of
    /// `GROUP`). A write beyond waits for a read to make room, for at most [`ECHO_WAIT`],
    /// then answers 503, as the real server's does when full, so the reader sets the pace,
    /// as it does there.
    holds: usize,
}

impl EchoStore {
    /// Holding as many items as the real server would under `LOAD_CAPACITY`.
    fn new() -> Self {
        let groups = std::env::var("LOAD_CAPACITY")
            .unwrap_or_else(|_| CAPACITY.into())
            .parse::<usize>()
            .expect("LOAD_CAPACITY is a number of groups");
        Self {
            held: std::sync::Mutex::default(),
            room: tokio::sync::Notify::new(),
            holds: groups.saturating_mul(GROUP),
        }
    }

    /// Keeps a write's items once there is room; `false` if none came in time.
    async fn keep(
        &self,
        mut items: Vec<Box<serde_json::value::RawValue>>,
        mut batches: Vec<arrow_array::RecordBatch>,
    ) -> bool {
        let count = items.len() + batches.iter().map(|b| b.num_rows()).sum::<usize>();
        let deadline = tokio::time::Instant::now() + ECHO_WAIT;
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut held = self.held.lock().expect("echo lock");
                if held.rows == 0 || held.rows + count <= self.holds {
                    held.rows += count;
                    held.items.append(&mut items);
                    held.batches.append(&mut batches);
                    return true;
                }
            }
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                return false;
            }
        }
    }

    /// Takes the oldest [`ECHO_READ`] items held (whole Arrow batches), waking the writes
    /// waiting for room.
    fn take(&self) -> Echoed {
        let mut held = self.held.lock().expect("echo lock");
        let items: Vec<_> = {
            let n = held.items.len().min(ECHO_READ);
            held.items.drain(..n).collect()
        };
        let mut batches = Vec::new();
        let mut rows = 0;
        while rows < ECHO_READ && !held.batches.is_empty() {
            let batch = held.batches.remove(0);
            rows += batch.num_rows();
            batches.push(batch);
        }
        held.rows -= items.len() + rows;
        drop(held);
        self.room.notify_waiters();
        Echoed {
            rows: items.len() + rows,
            items,
            batches,
        }
    }
}

impl NullServer {
    fn named(name: &str) -> Option<Self> {
        match name {
            "discard" => Some(Self::Discard),
            "parse" => Some(Self::Parse),
            "echo" => Some(Self::Echo),
            _ => None,
        }
    }

    /// Serves on an ephemeral loopback port, printing `listening on URL` first as the
    /// real server does, until killed.
    fn serve(self) {
        use axum::http::HeaderMap;
        use axum::routing::post;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let held = Arc::new(EchoStore::new());
        let is_arrow = |headers: &HeaderMap, name: &str| {
            headers
                .get(name)
                .is_some_and(|v| v.as_bytes() == ARROW.as_bytes())
        };
        runtime.block_on(async move {
            let kept = Arc::clone(&held);
            let write = move |headers: HeaderMap, body: axum::body::Bytes| {
                let kept = Arc::clone(&kept);
                async move {
                    let arrow = is_arrow(&headers, "content-type");
                    let (mut items, mut batches, mut count_only) = (Vec::new(), Vec::new(), 0);
                    match (self, arrow) {
                        (Self::Discard, _) => {}
                        (_, true) => {
                            if let Ok(r) = arrow_ipc::reader::StreamReader::try_new(&body[..], None)
                            {
                                batches.extend(r.flatten());
                            }
                        }
                        (Self::Parse, false) => match serde_json::from_slice::<Value>(&body) {
                            Ok(Value::Array(all)) => count_only = all.len(),
                            Ok(_) => count_only = 1,
                            Err(_) => {}
                        },
                        (_, false) => {
                            if body.first() == Some(&b'[') {
                                items = serde_json::from_slice(&body).unwrap_or_default();
                            } else if let Ok(one) = serde_json::from_slice(&body) {
                                items.push(one);
                            }
                        }
                    }
                    let count = count_only
                        + items.len()
                        + batches.iter().map(|b| b.num_rows()).sum::<usize>();
                    if self == Self::Echo && !kept.keep(items, batches).await {
                        return (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            axum::Json(json!({"success": false, "message": "full"})),
                        );
                    }
                    let message = format!("{count} items");
                    (
                        axum::http::StatusCode::OK,
                        axum::Json(json!({"success": true, "message": message})),
                    )
                }
            };
            let read = move |headers: HeaderMap| {
                let held = Arc::clone(&held);
                async move {
                    use axum::response::IntoResponse;
                    let taken = held.take();
                    if is_arrow(&headers, "accept") {
                        let mut out = Vec::new();
                        if let Some(first) = taken.batches.first() {
                            let mut w =
                                arrow_ipc::writer::StreamWriter::try_new(&mut out, &first.schema())
                                    .expect("ipc");
                            for batch in &taken.batches {
                                w.write(batch).expect("write");
                            }
                            w.finish().expect("finish");
                        }
                        return ([("content-type", ARROW)], out).into_response();
                    }
                    let data = json!({"data": taken.items, "meta_info": {}});
                    axum::Json(json!({"success": true, "message": "", "data": data}))
                        .into_response()
                }
            };
            let app = axum::Router::new()
                .route("/buffer/write", post(write.clone()))
                .route("/buffer/write_batch", post(write))
                .route("/buffer/read", post(read))
                .layer(axum::extract::DefaultBodyLimit::max(64 << 20));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("address");
            println!("listening on http://{addr}");
            axum::serve(listener, app).await.expect("serve");
        });
    }
}

/// Peak resident memory of a process, MB (Linux).
fn peak_rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A slime trajectory item of about 4 KB, as JSON text. The messages and extra info are
/// made once: the client's own work must not be what is measured.
fn item(writer: usize, n: u64) -> String {
    static BODY: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let (messages, extra) = BODY.get_or_init(|| {
        let messages = json!([
            {"role": "user", "content": "q".repeat(1000)},
            {"role": "assistant", "content": "a".repeat(2900)},
        ]);
        let extra =
            json!({"timestamp": "1700000000.0", "finish_reason": "stop", "round_number": 1});
        (messages.to_string(), extra.to_string())
    });
    let group = n / GROUP as u64;
    format!(
        r#"{{"uid":"w{writer}-{n}","instance_id":"w{writer}-g{group}","messages":{messages},"reward":{},"extra_info":{extra}}}"#,
        n % 2
    )
}

/// `BATCH` items from `n` on, as an Arrow IPC stream (the columns a generator holding its
/// items as a table sends).
fn arrow_body(writer: usize, n: u64) -> Vec<u8> {
    use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray};
    static TEXT: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let (messages, extra) = TEXT.get_or_init(|| {
        let v: Value = serde_json::from_str(&item(0, 0)).expect("item");
        (v["messages"].to_string(), v["extra_info"].to_string())
    });
    let range = n..n + BATCH as u64;
    let uid: StringArray = range
        .clone()
        .map(|i| Some(format!("w{writer}-{i}")))
        .collect();
    let instance: StringArray = range
        .clone()
        .map(|i| Some(format!("w{writer}-g{}", i / GROUP as u64)))
        .collect();
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("uid", Arc::new(uid)),
        ("instance_id", Arc::new(instance)),
        (
            "messages",
            Arc::new(StringArray::from(vec![messages.as_str(); BATCH])),
        ),
        (
            "reward",
            Arc::new(Float64Array::from_iter_values(
                range.clone().map(|i| (i % 2) as f64),
            )),
        ),
        (
            "extra_info",
            Arc::new(StringArray::from(vec![extra.as_str(); BATCH])),
        ),
    ];
    let batch = RecordBatch::try_from_iter(columns).expect("batch");
    let mut out = Vec::new();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut out, &batch.schema()).expect("ipc");
    w.write(&batch).expect("write");
    w.finish().expect("finish");
    drop(w);
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn run(mode: &str, seconds: f64, durability: &str) -> Value {
    let dir = std::env::temp_dir().join(format!("rb-load-{mode}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut child, url) = start(&dir, durability);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONNECTIONS)
        .build()
        .expect("client");
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..CONNECTIONS {
        let (client, url, stop, written, errors) = (
            client.clone(),
            url.clone(),
            Arc::clone(&stop),
            Arc::clone(&written),
            Arc::clone(&errors),
        );
        let mode = mode.to_owned();
        writers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (path, body, count, content_type) = match mode.as_str() {
                    "batch" => {
                        let items: Vec<String> =
                            (0..BATCH as u64).map(|i| item(w, n + i)).collect();
                        (
                            "/buffer/write_batch",
                            format!("[{}]", items.join(",")).into_bytes(),
                            BATCH as u64,
                            "application/json",
                        )
                    }
                    "arrow" => ("/buffer/write_batch", arrow_body(w, n), BATCH as u64, ARROW),
                    _ => (
                        "/buffer/write",
                        item(w, n).into_bytes(),
                        1,
                        "application/json",
                    ),
                };
                let t = Instant::now();
                let resp = client
                    .post(format!("{url}{path}"))
                    .header("content-type", content_type)
                    .body(body)
                    .send()
                    .await;
                match resp {
                    // Counted only if answered before the run's end: the writes still
                    // waiting for room then (the reader has stopped) would stretch the
                    // run by the write timeout.
                    Ok(r) if r.status().is_success() => {
                        let _ = r.bytes().await;
                        if !stop.load(Ordering::Relaxed) {
                            latencies.push(t.elapsed().as_secs_f64() * 1e3);
                            written.fetch_add(count, Ordering::Relaxed);
                        }
                        n += count;
                    }
                    Ok(r) => {
                        let _ = r.bytes().await;
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            latencies
        }));
    }
    let reader = {
        let (client, url, stop) = (client.clone(), url.clone(), Arc::clone(&stop));
        // The client that writes Arrow reads Arrow (`Accept`); the others read slime's JSON.
        let arrow = mode == "arrow";
        tokio::spawn(async move {
            let mut read = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut request = client
                    .post(format!("{url}/buffer/read"))
                    .header("content-type", "application/json");
                if arrow {
                    request = request.header("accept", ARROW);
                }
                let body = request
                    .body(r#"{"batch_size": -1, "timeout": 0.2}"#)
                    .send()
                    .await;
                if let Ok(r) = body {
                    let got = if arrow {
                        r.arrow_rows().await
                    } else {
                        r.json_text().await
                    };
                    if let Ok(v) = got {
                        read += v;
                    }
                }
            }
            read
        })
    };
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies = Vec::new();
    for w in writers {
        latencies.extend(w.await.expect("writer"));
    }
    let read = reader.await.expect("reader");
    latencies.sort_by(f64::total_cmp);
    let rss = peak_rss_mb(child.id());
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    json!({
        "mode": mode,
        "items_per_s": (written.load(Ordering::Relaxed) as f64 / elapsed).round(),
        "p50_ms": (percentile(&latencies, 0.5) * 100.0).round() / 100.0,
        "p99_ms": (percentile(&latencies, 0.99) * 100.0).round() / 100.0,
        "rss_mb": rss.round(),
        "items_read": read,
        "rejected_requests": errors.load(Ordering::Relaxed),
        "connections": CONNECTIONS,
        "durability": durability,
        "seconds": seconds,
        "server": server_command(),
    })
}

/// The number of items a read answered (0 when it answered none), parsed as a client
/// would: every item of a JSON answer into values, the columns of an Arrow one.
trait ReadAnswer {
    async fn json_text(self) -> Result<u64, reqwest::Error>;
    async fn arrow_rows(self) -> Result<u64, reqwest::Error>;
}

impl ReadAnswer for reqwest::Response {
    async fn arrow_rows(self) -> Result<u64, reqwest::Error> {
        let bytes = self.bytes().await?;
        let Ok(reader) = arrow_ipc::reader::StreamReader::try_new(&bytes[..], None) else {
            return Ok(0);
        };
        Ok(reader.flatten().map(|b| b.num_rows() as u64).sum())
    }

    async fn json_text(self) -> Result<u64, reqwest::Error> {
        let text = self.text().await?;
        Ok(serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["data"]["data"].as_array().map(|a| a.len() as u64))
            .unwrap_or(0))
    }
}

fn main() {
    if let Some(null) = std::env::var(NULL_SERVER)
        .ok()
        .and_then(|name| NullServer::named(&name))
    {
        null.serve();
        return;
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let seconds: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let durability = args.get(1).cloned().unwrap_or_else(|| "sync".into());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let modes: Vec<String> = args.get(2).map_or_else(
        || vec!["single".into(), "batch".into(), "arrow".into()],
        |m| m.split(',').map(str::to_owned).collect(),
    );
    for mode in &modes {
        let line = runtime.block_on(run(mode, seconds, &durability));
        println!("{line}");
    }
}
