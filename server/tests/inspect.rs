//! `rollout-buffer inspect` on a store the server wrote: the summary as text and JSON, the
//! latest archived rows, and a missing store refused without being created; `repair` on a
//! damaged store, and refused beside a running server.

mod common;

use common::{cli, inspect, item, post, store, uids, write_group, Server};
use serde_json::{json, Value};
use std::ffi::OsStr;

#[tokio::test]
async fn inspect_summarises_a_stored_run() {
    let dir = store("inspect");
    let server = Server::start(&dir, &["--group-size", "4"]);
    for q in ["q0", "q1", "q2"] {
        write_group(&server, q, &[0.0, 1.0, 0.0, 1.0]).await;
    }
    for i in 0..2 {
        let (status, _) = post(&server, "/buffer/write", &item(&format!("p{i}"), "q3", 1.0)).await;
        assert_eq!(status, 200);
    }
    let (_, read) = post(&server, "/get_rollout_data", &json!({"batch_size": 4})).await;
    assert_eq!(uids(&read), ["q0-0", "q0-1", "q0-2", "q0-3"]);
    assert!(
        server.terminate().success(),
        "a graceful stop flushes the archive"
    );

    let (ok, out, err) = inspect(&[
        dir.as_os_str(),
        OsStr::new("--json"),
        OsStr::new("--tail"),
        OsStr::new("1"),
    ]);
    assert!(ok, "{err}");
    let doc: Value = serde_json::from_str(&out).expect("JSON");
    let s = &doc["summary"];
    assert_eq!(
        (
            s["samples"].as_u64(),
            s["groups"].as_u64(),
            s["rollouts"].as_u64()
        ),
        (Some(2), Some(2), Some(8)),
        "{s}"
    );
    assert_eq!(s["pending_rollouts"], 2, "{s}");
    assert_eq!(s["sealed_markers"], 3, "{s}");
    assert_eq!(s["partitions"][0]["environment"], "slime", "{s}");
    assert_eq!(s["rpcs"][0]["name"], "train");
    let rows: u64 = s["archive"]
        .as_array()
        .expect("archive")
        .iter()
        .map(|p| p["rows"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(rows, 1, "the group read is archived: {s}");
    let tail = doc["tail"].as_array().expect("tail");
    assert_eq!(tail.len(), 1);
    assert_eq!(tail[0]["environment"], "slime");
    assert_eq!(tail[0]["read_by"], json!(["train"]));
    let members: Vec<&str> = tail[0]["rollout_uid"]
        .as_array()
        .expect("uids")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(members, ["q0-0", "q0-1", "q0-2", "q0-3"]);

    let (ok, text, err) = inspect(&[dir.as_os_str(), OsStr::new("--tail"), OsStr::new("1")]);
    assert!(ok, "{err}");
    assert!(
        text.contains("buffer: 2 samples (2 groups, 8 rollouts)"),
        "{text}"
    );
    assert!(
        text.contains("pending rollouts (waiting for their group): 2"),
        "{text}"
    );
    assert!(text.contains("archive: 1 rows in 1 files"), "{text}");
    assert!(text.contains("read_by=[train]"), "{text}");
}

#[test]
fn inspecting_a_missing_store_fails_and_creates_nothing() {
    let dir = store("inspect-missing");
    let (ok, _, err) = inspect(&[dir.as_os_str()]);
    assert!(!ok);
    assert!(err.contains("not a directory"), "{err}");
    assert!(!dir.exists());
}

#[tokio::test]
async fn repair_salvages_a_store_that_will_not_open() {
    let dir = store("repair");
    let server = Server::start(&dir, &["--group-size", "2"]);
    for q in ["q0", "q1", "q2", "q3"] {
        write_group(&server, q, &[0.0, 1.0]).await;
    }
    assert!(server.terminate().success());
    let mut wal: Vec<_> = std::fs::read_dir(dir.join("wal"))
        .expect("wal")
        .map(|e| e.expect("entry").path())
        .collect();
    wal.sort();
    assert!(wal.len() >= 3, "{wal:?}");
    // A flipped byte in a group that is not the last: the server refuses to start on it.
    let mut bytes = std::fs::read(&wal[1]).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&wal[1], &bytes).expect("write");
    let (ok, _, err) = cli("inspect", &[dir.as_os_str()]);
    assert!(ok, "inspect reads a damaged store leniently: {err}");

    let (ok, out, err) = cli("repair", &[dir.as_os_str(), OsStr::new("--json")]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&out).expect("json");
    let moved = report["moved"].as_array().expect("moved");
    assert_eq!(moved.len(), wal.len() - 1, "{report}");
    assert_eq!(report["unreadable_groups"], json!([1]));
    assert!(dir.join("damaged/0/report.json").is_file());
    assert!(dir
        .join("damaged/0/wal")
        .join(wal[1].file_name().expect("name"))
        .is_file());

    // It starts again, and a second repair has nothing to do.
    let server = Server::start(&dir, &["--group-size", "2"]);
    assert!(server.terminate().success());
    let (ok, out, _) = cli("repair", &[dir.as_os_str()]);
    assert!(ok);
    assert!(out.contains("nothing to repair"), "{out}");
}

/// A repair beside a running server would move aside log files the server is writing: it
/// is refused, naming the lock, and moves nothing.
#[tokio::test]
async fn a_repair_beside_a_running_server_is_refused() {
    let dir = store("repair-live");
    let server = Server::start(&dir, &["--group-size", "2"]);
    write_group(&server, "q0", &[0.0, 1.0]).await;
    let (ok, _, err) = cli("repair", &[dir.as_os_str()]);
    assert!(
        !ok && err.contains("in use by another server or a repair"),
        "{err}"
    );
    assert!(!dir.join("damaged").exists());
    let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&body), ["q0-0", "q0-1"]);
}
