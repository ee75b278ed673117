//! What the server's tests share: the server as a real process on an ephemeral loopback
//! port, and a real HTTP client.
#![allow(dead_code)] // each test file uses its own part

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running server; killed (SIGKILL) when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Server {
    pub fn start(store: &std::path::Path, args: &[&str]) -> Server {
        Self::spawn(store, args, Stdio::null(), None)
    }

    /// [`Self::start`] with the server's stderr (its log, at `log_filter`) in file `log`.
    pub fn start_logging(
        store: &std::path::Path,
        args: &[&str],
        log: &std::path::Path,
        log_filter: &str,
    ) -> Server {
        let file = std::fs::File::create(log).expect("the log file");
        Self::spawn(store, args, Stdio::from(file), Some(log_filter))
    }

    fn spawn(
        store: &std::path::Path,
        args: &[&str],
        stderr: Stdio,
        log_filter: Option<&str>,
    ) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rollout-buffer"));
        if let Some(filter) = log_filter {
            command.env("RUST_LOG", filter);
        }
        let mut child = command
            .arg("serve")
            .arg("--store")
            .arg(store)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn the server");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the server's first line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Server { child, url }
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(sent.success());
        self.child.wait().expect("wait")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh store directory under the system temp dir, removed when the test drops it
/// (declare it before the `Server` using it, so the server is stopped first).
pub fn store(name: &str) -> StoreDir {
    let dir = std::env::temp_dir().join(format!("rb-server-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    StoreDir(dir)
}

/// See [`store`].
pub struct StoreDir(PathBuf);

impl std::ops::Deref for StoreDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for StoreDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for StoreDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for StoreDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// POSTs JSON; the status and the parsed body.
pub async fn post(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    send(
        client()
            .post(format!("{}{path}", server.url))
            .body(body.to_string()),
    )
    .await
}

pub async fn get(server: &Server, path: &str) -> (u16, Value) {
    send(client().get(format!("{}{path}", server.url))).await
}

/// Sends `req` as JSON; the status and the parsed body.
pub async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    answer(req.header("content-type", "application/json")).await
}

/// Sends `req` as it is; the status and the parsed body.
pub async fn answer(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}"));
    (status, body)
}

/// slime's trajectory item.
pub fn item(uid: &str, instance: &str, reward: f64) -> Value {
    json!({
        "uid": uid,
        "instance_id": instance,
        "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
        "reward": reward,
        "extra_info": {"timestamp": "1700000000.5", "finish_reason": "stop"},
    })
}

pub async fn write_group(server: &Server, instance: &str, rewards: &[f64]) {
    for (i, r) in rewards.iter().enumerate() {
        let (status, body) = post(
            server,
            "/buffer/write",
            &item(&format!("{instance}-{i}"), instance, *r),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["success"], true);
    }
}

pub fn uids(body: &Value) -> Vec<String> {
    let mut out: Vec<String> = body["data"]["data"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["uid"].as_str().expect("uid").to_owned())
        .collect();
    out.sort();
    out
}

/// Runs `rollout-buffer inspect` with `args`; its exit success and stdout.
pub fn inspect(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    cli("inspect", args)
}

/// Runs `rollout-buffer serve` on `store` (a loopback ephemeral port) with `args`, for a
/// start that is expected to fail; returns success, stdout and stderr.
pub fn serve_cli(store: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let mut all: Vec<&std::ffi::OsStr> = vec![
        "--store".as_ref(),
        store.as_os_str(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
    ];
    all.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
    cli("serve", &all)
}

/// Runs `rollout-buffer <command> <args>`; returns success, stdout and stderr.
pub fn cli(command: &str, args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rollout-buffer"))
        .arg(command)
        .args(args)
        .output()
        .expect("run the command line");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The server's `/metrics` text.
pub async fn metrics_text(server: &Server) -> String {
    client()
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}
