//! Batch writes as an Arrow IPC stream, and `/debug/waiting`, against the real process.

mod common;

use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow_ipc::writer::StreamWriter;
use common::{client, get, item, post, store, uids, write_group, Server};
use serde_json::{json, Value};
use std::sync::Arc;

const ARROW: &str = "application/vnd.apache.arrow.stream";

fn ipc(columns: Vec<(&str, ArrayRef)>) -> Vec<u8> {
    let batch = RecordBatch::try_from_iter(columns).expect("batch");
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &batch.schema()).expect("writer");
    writer.write(&batch).expect("write");
    writer.finish().expect("finish");
    drop(writer);
    out
}

/// `n` items of instance 7, as Arrow columns (the instance id an integer column, the
/// reward float32).
fn items(n: usize, uid_prefix: &str) -> Vec<(&'static str, ArrayRef)> {
    let uid: StringArray = (0..n).map(|i| Some(format!("{uid_prefix}{i}"))).collect();
    let messages: StringArray = (0..n)
        .map(|i| Some(json!([{"role": "assistant", "content": format!("answer {i}")}]).to_string()))
        .collect();
    vec![
        ("uid", Arc::new(uid) as ArrayRef),
        ("instance_id", Arc::new(Int64Array::from(vec![7; n]))),
        ("messages", Arc::new(messages)),
        (
            "reward",
            Arc::new(Float32Array::from_iter_values(
                (0..n).map(|i| (i % 2) as f32),
            )),
        ),
        (
            "extra_info",
            Arc::new(StringArray::from(vec![Some(r#"{"policy_version": 3}"#); n])),
        ),
    ]
}

/// POSTs `body` to `/buffer/write_batch` as an Arrow stream: the status and the body's text.
async fn send_arrow(server: &Server, body: Vec<u8>) -> reqwest::Result<(u16, String)> {
    let resp = client()
        .post(format!("{}/buffer/write_batch", server.url))
        .header("content-type", ARROW)
        .body(body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    Ok((status, resp.text().await?))
}

async fn post_arrow(server: &Server, body: Vec<u8>) -> (u16, Value) {
    let (status, text) = send_arrow(server, body).await.expect("send");
    (status, serde_json::from_str(&text).expect("JSON answer"))
}

#[tokio::test]
async fn an_arrow_stream_writes_a_group_as_json_items_would() {
    let dir = store("arrow");
    let server = Server::start(&dir, &["--group-size", "4"]);
    let (status, body) = post_arrow(&server, ipc(items(4, "a"))).await;
    assert_eq!(status, 200, "{body}");
    let outcomes: Vec<&str> = body["data"]["data"]
        .as_array()
        .expect("answers")
        .iter()
        .map(|a| a["outcome"].as_str().expect("outcome"))
        .collect();
    assert_eq!(outcomes, ["pending", "pending", "pending", "sealed"]);
    let (_, read) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&read), ["a0", "a1", "a2", "a3"]);
    let first = &read["data"]["data"][1];
    assert_eq!(first["instance_id"], "7");
    assert_eq!(first["messages"][0]["content"], "answer 1");
    assert_eq!(first["raw_reward"], 1.0);
    assert_eq!(first["extra_info"]["policy_version"], 3);
}

/// pyarrow writes a compressed stream when asked (`IpcWriteOptions(compression="zstd")`):
/// it is read as a plain one is.
#[tokio::test]
async fn a_zstd_compressed_arrow_stream_is_taken() {
    use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
    let dir = store("arrow-zstd");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let batch = RecordBatch::try_from_iter(items(2, "z")).expect("batch");
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(arrow_ipc::CompressionType::ZSTD))
        .expect("zstd");
    let mut body = Vec::new();
    let mut writer =
        StreamWriter::try_new_with_options(&mut body, &batch.schema(), options).expect("writer");
    writer.write(&batch).expect("write");
    writer.finish().expect("finish");
    drop(writer);
    let (status, answer) = post_arrow(&server, body).await;
    assert_eq!(status, 200, "{answer}");
    let (_, read) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&read), ["z0", "z1"]);
}

#[tokio::test]
async fn bad_arrow_bodies_are_refused_whole() {
    let dir = store("arrow-bad");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let mut no_reward = items(2, "b");
    no_reward.retain(|(name, _)| *name != "reward");
    let mut null_uid = items(2, "c");
    null_uid[0].1 = Arc::new(StringArray::from(vec![Some("c0"), None]));
    let mut text_reward = items(2, "d");
    text_reward[3].1 = Arc::new(StringArray::from(vec!["high", "low"]));
    let mut bad_messages = items(2, "e");
    bad_messages[2].1 = Arc::new(StringArray::from(vec!["[{\"role\": ", "[]"]));
    let mut empty_uid = items(2, "h");
    empty_uid[0].1 = Arc::new(StringArray::from(vec!["h0", ""]));
    let mut binary_messages = items(2, "i");
    binary_messages[2].1 = Arc::new(arrow_array::BinaryArray::from(vec![&b"[]"[..], b"[]"]));
    let file = {
        let batch = RecordBatch::try_from_iter(items(2, "j")).expect("batch");
        let mut out = Vec::new();
        let mut writer =
            arrow_ipc::writer::FileWriter::try_new(&mut out, &batch.schema()).expect("writer");
        writer.write(&batch).expect("write");
        writer.finish().expect("finish");
        drop(writer);
        out
    };
    let mut truncated = ipc(items(4, "g"));
    truncated.truncate(truncated.len() - 100);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not arrow at all".to_vec(), "not an Arrow IPC stream"),
        (Vec::new(), "not an Arrow IPC stream"),
        (truncated, "bad Arrow IPC batch"),
        (ipc(no_reward), "no column `reward`"),
        (ipc(null_uid), "row 1: `uid` is null"),
        (ipc(text_reward), "`reward` must be numeric"),
        (ipc(bad_messages), "row 0: `messages` is not JSON"),
        (ipc(empty_uid), "row 1: item: `uid` is empty"),
        (
            ipc(binary_messages),
            "`messages` must be a string column (JSON text)",
        ),
        (file, "an Arrow IPC file, not a stream"),
    ];
    for (body, says) in cases {
        let (status, answer) = post_arrow(&server, body).await;
        assert_eq!(status, 400, "{answer}");
        let message = answer["message"].as_str().expect("message");
        assert!(message.contains(says), "{message:?} should say {says:?}");
    }
    let (_, stats) = get(&server, "/buffer/stats").await;
    assert_eq!(stats["data"]["data"]["total_written"], 0, "nothing stored");
    let (status, _) = post_arrow(&server, ipc(items(2, "f"))).await;
    assert_eq!(status, 200, "still serving");
}

/// Every single-byte change of a valid Arrow body (to 0x00 and to 0xFF, as a hostile or
/// damaged client might send) is answered: a 200, or a 4xx with a JSON body. The IPC
/// decoder panics on some of them (a buffer's offset run past the body); that must not
/// drop the connection, nor print the panic (the server logs it at debug level).
#[tokio::test]
async fn every_byte_of_an_arrow_body_changed_is_answered() {
    let dir = store("arrow-flips");
    let log =
        std::env::temp_dir().join(format!("rb-server-arrow-flips-{}.log", std::process::id()));
    let server = Server::start_logging(
        &dir,
        &["--group-size", "2"],
        &log,
        "info,rollout_buffer_server::arrow_items=debug",
    );
    let good = ipc(items(2, "h"));
    let mut refused = 0;
    for at in 0..good.len() {
        for value in [0x00, 0xFF] {
            if good[at] == value {
                continue;
            }
            let mut body = good.clone();
            body[at] = value;
            let (status, text) = send_arrow(&server, body)
                .await
                .unwrap_or_else(|e| panic!("byte {at} = {value:#x}: no answer ({e})"));
            assert!(
                status == 200 || (400..500).contains(&status),
                "byte {at} = {value:#x}: {status} {text}"
            );
            let answer: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("byte {at} = {value:#x}: {e}: {text}"));
            if status != 200 {
                refused += 1;
                assert!(answer["message"].is_string(), "{answer}");
            }
        }
    }
    assert!(refused > 0);
    let (status, _) = post_arrow(&server, ipc(items(2, "i"))).await;
    assert_eq!(status, 200, "still serving");
    assert!(server.terminate().success());
    let text = std::fs::read_to_string(&log).expect("the server's log");
    let _ = std::fs::remove_file(&log);
    let log = text;
    assert!(
        log.contains("the Arrow IPC decoder panicked on a malformed body"),
        "some changed bodies panic the decoder, logged at debug level"
    );
    // The default hook's report starts `thread '<name>' panicked at`.
    assert!(
        !log.lines().any(|l| l.starts_with("thread '")),
        "a caught decoder panic printed by the default hook:\n{log}"
    );
}

#[tokio::test]
async fn debug_waiting_says_why_a_read_would_wait() {
    let dir = store("waiting");
    let server = Server::start(&dir, &["--group-size", "4"]);
    for i in 0..4 {
        let (status, _) = post(
            &server,
            "/buffer/write",
            &item(&format!("g{i}"), "whole", f64::from(i % 2)),
        )
        .await;
        assert_eq!(status, 200);
    }
    for i in 0..3 {
        let (status, _) = post(
            &server,
            "/buffer/write",
            &item(&format!("h{i}"), "part", f64::from(i % 2)),
        )
        .await;
        assert_eq!(status, 200);
    }
    let (status, body) = get(&server, "/debug/waiting").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["pending_groups"], 1, "{body}");
    assert_eq!(body["pending_rollouts"], 3, "{body}");
    let train = &body["rpcs"][0];
    assert_eq!(train["rpc"], "train");
    assert_eq!(
        (train["eligible"].as_u64(), train["batch_size"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(train["incomplete"], 0);
    // Once read, the group is gone: nothing eligible, nothing stored.
    let (_, read) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&read).len(), 4);
    let (_, body) = get(&server, "/debug/waiting").await;
    assert_eq!(body["rpcs"][0]["eligible"], 0, "{body}");
    assert_eq!(body["slots_free"].as_u64(), Some(4096));
}

/// A read with `Accept: application/vnd.apache.arrow.stream` answers an Arrow IPC stream:
/// the items of the JSON answer, with `success`, `message` and `meta_info` in the schema's metadata; an empty read is an
/// empty stream saying why.
#[tokio::test]
async fn reads_answer_arrow_streams_when_asked() {
    let dir = store("arrow-read");
    let server = Server::start(&dir, &["--group-size", "4"]);
    let read_arrow = |path: &'static str| {
        let url = format!("{}{path}", server.url);
        async move {
            let resp = client()
                .post(url)
                .header("accept", ARROW)
                .header("content-type", "application/json")
                .body(r#"{"batch_size": -1, "timeout": 0}"#)
                .send()
                .await
                .expect("send");
            assert_eq!(resp.status().as_u16(), 200);
            assert_eq!(resp.headers()["content-type"], ARROW);
            let bytes = resp.bytes().await.expect("body");
            let reader =
                arrow_ipc::reader::StreamReader::try_new(&bytes[..], None).expect("a stream");
            let meta = reader.schema().metadata().clone();
            let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().expect("batches");
            (meta, batches)
        }
    };
    let (meta, batches) = read_arrow("/get_rollout_data").await;
    assert_eq!(meta["success"], "false");
    assert_eq!(meta["message"], "No data available");
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);

    // slime's start payload sets the group size to 3.
    let (status, _) = post(
        &server,
        "/start_rollout",
        &json!({"num_repeat_per_sample": 3}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = post_arrow(&server, ipc(items(3, "a"))).await;
    assert_eq!(status, 200, "{body}");
    let (meta, batches) = read_arrow("/buffer/read").await;
    assert_eq!(meta["success"], "true", "{meta:?}");
    let info: Value = serde_json::from_str(&meta["meta_info"]).expect("JSON meta info");
    assert_eq!(info["finished_groups"], json!(["7"]));
    assert_eq!(info["total_samples"], 3);
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    let text = |name: &str| -> Vec<String> {
        let c = b.column_by_name(name).expect("column");
        let c = c.as_any().downcast_ref::<StringArray>().expect("strings");
        c.iter().map(|v| v.unwrap_or_default().to_owned()).collect()
    };
    assert_eq!(text("uid"), ["a0", "a1", "a2"]);
    assert_eq!(text("instance_id"), ["7", "7", "7"]);
    let messages: Vec<Value> = text("messages")
        .iter()
        .map(|m| serde_json::from_str(m).expect("JSON text"))
        .collect();
    assert_eq!(messages[2][0]["content"], "answer 2");
    let extra: Value = serde_json::from_str(&text("extra_info")[0]).expect("JSON text");
    assert_eq!(extra["policy_version"], 3);
    let raw = b
        .column_by_name("raw_reward")
        .and_then(|c| {
            c.as_any()
                .downcast_ref::<arrow_array::Float64Array>()
                .cloned()
        })
        .expect("raw_reward");
    assert_eq!(raw.values().to_vec(), [0.0, 1.0, 0.0]);
    // Taken: a JSON read now finds nothing.
    let (_, read) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(read["success"], false);
}

/// A write timeout that a duration holds but the clock cannot reach (each write's deadline
/// overflowed: a panic, and the client saw its connection closed) waits as long as it must.
#[tokio::test]
async fn a_write_timeout_past_the_clocks_range_still_takes_writes() {
    let dir = store("endless-write-timeout");
    let server = Server::start(&dir, &["--group-size", "2", "--write-timeout", "1e19"]);
    write_group(&server, "q0", &[0.0, 1.0]).await;
    let (status, _) = post(&server, "/buffer/write", &item("q1-0", "q1", 1.0)).await;
    assert_eq!(status, 200);
}

/// Timeouts on the command line past what a duration holds, or a write timeout of 0 (every
/// write would answer 503), are usage errors (exit 1 with the option named), not a crash;
/// so is an empty token (every call, health checks included, was answered 401).
#[test]
fn huge_or_zero_timeouts_on_the_command_line_are_refused() {
    let dir = store("huge-timeouts");
    let cases = [
        ("--group-timeout", "1e20"),
        ("--write-timeout", "1e20"),
        ("--write-timeout", "0"),
        ("--body-timeout", "0"),
        ("--token", ""),
    ];
    for (option, value) in cases {
        let (ok, _, err) = common::serve_cli(&dir, &[option, value]);
        assert!(!ok);
        assert!(err.contains(option) && !err.contains("panicked"), "{err}");
    }
}
