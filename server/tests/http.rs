//! The server as a real process on an ephemeral loopback port, driven by a real HTTP
//! client as slime's generators and consumer drive theirs.

mod common;

use common::{client, get, item, post, send, store, uids, write_group, Server, StoreDir};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn slime_generator_and_consumer_round_trip() {
    let dir = store("round-trip");
    let server = Server::start(&dir, &["--group-size", "4"]);
    let (status, health) = get(&server, "/").await;
    assert_eq!((status, health["success"].clone()), (200, json!(true)));
    write_group(&server, "q-varied", &[0.0, 1.0, 1.0, 0.0]).await;
    write_group(&server, "q-flat", &[1.0, 1.0, 1.0, 1.0]).await;
    let (status, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(body["success"], true, "{body}");
    // The group whose rewards are all equal is finished but invalid: archived, not sent.
    assert_eq!(
        uids(&body),
        ["q-varied-0", "q-varied-1", "q-varied-2", "q-varied-3"]
    );
    let meta = &body["data"]["meta_info"];
    let mut finished: Vec<&str> = meta["finished_groups"]
        .as_array()
        .expect("finished_groups")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    finished.sort();
    assert_eq!(finished, ["q-flat", "q-varied"]);
    assert_eq!(meta["total_samples"], 8);
    let first = &body["data"]["data"][0];
    assert_eq!(first["messages"][1]["content"], "4");
    assert_eq!(first["extra_info"]["finish_reason"], "stop");
    // GRPO-normalized rewards: mean 0, raw kept.
    let rewards: Vec<f64> = body["data"]["data"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["reward"].as_f64().expect("reward"))
        .collect();
    assert!(rewards.iter().sum::<f64>().abs() < 1e-6, "{rewards:?}");
    // Nothing left: slime answers success false.
    let (_, empty) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(empty["success"], false);
    let (_, stats) = get(&server, "/buffer/stats").await;
    assert_eq!(stats["data"]["data"]["total_written"], 8);
    assert_eq!(stats["data"]["data"]["total_read"], 4);
}

#[tokio::test]
async fn a_killed_server_restarts_with_every_answered_write() {
    let dir = store("kill");
    let server = Server::start(&dir, &["--group-size", "4"]);
    write_group(&server, "q1", &[0.0, 1.0, 0.0, 1.0]).await;
    write_group(&server, "q2", &[1.0, 0.0]).await; // pending: half a group
    drop(server); // SIGKILL
    let server = Server::start(&dir, &["--group-size", "4"]);
    for (i, r) in [(2, 0.0), (3, 1.0)] {
        let (status, _) = post(&server, "/buffer/write", &item(&format!("q2-{i}"), "q2", r)).await;
        assert_eq!(status, 200);
    }
    let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(body["success"], true, "{body}");
    let got = uids(&body);
    assert_eq!(got.len(), 8, "{got:?}");
    assert!(
        got.contains(&"q2-0".to_owned()),
        "the pending half survived: {got:?}"
    );
}

/// Three seconds (and 64 rounds at least) of writes and reads with a checkpoint after
/// every few groups, so log files are retired and written again as the store recycles
/// them; then kill -9: every answered write comes back once, and nothing a read answered
/// comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_after_many_checkpoints_has_every_answered_write_once() {
    let dir = store("kill-checkpoints");
    let args = ["--group-size", "4", "--checkpoint-mb", "0"];
    let server = Server::start(&dir, &args);
    let (mut written, mut read) = (Vec::new(), Vec::new());
    let started = std::time::Instant::now();
    let mut round = 0;
    // At least 64 rounds however slow the machine: the check below counts on far more
    // rounds than the few log files a checkpoint in progress still leaves.
    while started.elapsed() < Duration::from_secs(3) || round < 64 {
        let batch: Vec<Value> = (0..8)
            .map(|i| {
                let group = format!("g{round}-{}", i / 4);
                item(&format!("r{round}-{i}"), &group, f64::from(i % 2))
            })
            .collect();
        let (status, body) = post(&server, "/buffer/write_batch", &json!(batch)).await;
        assert_eq!(status, 200, "{body}");
        written.extend((0..8).map(|i| format!("r{round}-{i}")));
        if round % 3 == 0 {
            let (_, body) = post(&server, "/buffer/read", &json!({"timeout": 0})).await;
            read.extend(uids(&body));
        }
        round += 1;
    }
    assert!(
        std::fs::read_dir(dir.join("wal")).expect("log").count() < written.len() / 8,
        "checkpoints retired log files"
    );
    drop(server); // SIGKILL
    let server = Server::start(&dir, &args);
    let (_, body) = post(&server, "/buffer/read", &json!({"timeout": 0})).await;
    let after = uids(&body);
    let mut all: Vec<String> = read.iter().chain(&after).cloned().collect();
    all.sort();
    let mut want = written.clone();
    want.sort();
    assert_eq!(
        all,
        want,
        "{} read before, {} after",
        read.len(),
        after.len()
    );
}

#[tokio::test]
async fn bad_requests_get_json_errors_and_store_nothing() {
    let dir = store("bad");
    let server = Server::start(&dir, &["--group-size", "2", "--body-limit", "2048"]);
    let url = format!("{}/buffer/write", server.url);
    let read = format!("{}/get_rollout_data", server.url);
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (client().post(&url).body("{not json"), 400, "malformed JSON"),
        // Cut off inside a value: no `?` where serde cannot name the place.
        (client().post(&url).body(r#"{"uid": "x","#), 400, "malformed JSON: "),
        // Valid JSON (`json.dumps` writes it), but no Unicode string can hold the escape.
        (client().post(&url).body(r#"{"uid": "\ud800", "instance_id": "q", "messages": [], "reward": 1}"#), 400, "malformed JSON in `uid`: "),
        (client().post(&url).body(r#"{"uid": "a\udc80", "instance_id": "q", "messages": [], "reward": 1}"#), 400, "lone UTF-16 surrogate"),
        (client().post(&url).body(json!({"uid": "a", "instance_id": "q", "messages": []}).to_string()), 422, "reward"),
        (client().post(&url).body(json!({"uid": "a", "instance_id": "q", "messages": [], "reward": "high"}).to_string()), 422, "reward"),
        (client().post(&url).body(json!({"uid": "a", "instance_id": "q", "messages": "hi", "reward": 1}).to_string()), 400, "messages"),
        (client().post(&url).body(json!({"uid": "a", "instance_id": "q", "messages": [], "reward": 1, "extra_info": {"pad": "x".repeat(4096)}}).to_string()), 413, "--body-limit"),
        (client().get(format!("{}/no/such/route", server.url)), 404, "/no/such/route"),
        (client().get(&url), 405, "/buffer/write does not take GET"),
        (client().post(&read).body(r#"{"batch_size": "3"}"#), 422, "batch_size"),
        (client().post(&read).body(format!(r#"{{"pad": "{}"}}"#, "x".repeat(4096))), 413, "--body-limit"),
    ];
    // A batch write takes JSON or Arrow, and says so.
    let plain = client()
        .post(format!("{}/buffer/write_batch", server.url))
        .header("content-type", "text/plain")
        .body("[]");
    let (status, body) = common::answer(plain).await;
    assert_eq!(status, 415, "{body}");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains("JSON") && message.contains("Arrow IPC stream"),
        "{message}"
    );
    for (req, want, names) in cases {
        let (status, body) = send(req).await;
        assert_eq!(status, want, "{body}");
        assert_eq!(body["success"], false);
        assert!(
            body["message"].as_str().expect("message").contains(names),
            "{body}"
        );
    }
    // A batch with one bad item stores none of it.
    let batch = json!([item("b0", "q", 1.0), {"uid": "b1", "instance_id": null, "messages": [], "reward": 0}]);
    let (status, body) = post(&server, "/buffer/write_batch", &batch).await;
    assert_eq!(status, 400, "{body}");
    // So does one whose policy version the buffer cannot hold, or that is no whole number.
    for version in [json!(1u64 << 63), json!(-1), json!(2.5), json!("three")] {
        let mut bad = item("b3", "q", 0.0);
        bad["extra_info"] = json!({"policy_version": version});
        let batch = json!([item("b2", "q", 1.0), bad]);
        let (status, body) = post(&server, "/buffer/write_batch", &batch).await;
        assert_eq!(status, 400, "{body}");
        let message = body["message"].as_str().expect("message");
        assert!(message.contains("extra_info.policy_version"), "{message}");
    }
    let (_, stats) = get(&server, "/buffer/stats").await;
    assert_eq!(stats["data"]["data"]["total_written"], 0);
    // Still serving.
    let (status, _) = post(
        &server,
        "/buffer/write_batch",
        &json!([item("c0", "q", 1.0), item("c1", "q", 0.0)]),
    )
    .await;
    assert_eq!(status, 200);
    let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&body), ["c0", "c1"]);
}

#[tokio::test]
async fn a_token_guards_every_route() {
    let dir = store("token");
    let server = Server::start(&dir, &["--token", "s3cret"]);
    let (status, body) = get(&server, "/buffer/stats").await;
    assert_eq!(
        (status, body["error"].clone()),
        (401, json!("unauthorized"))
    );
    let wrong = client().get(format!("{}/", server.url)).bearer_auth("nope");
    assert_eq!(send(wrong).await.0, 401);
    let right = client()
        .get(format!("{}/buffer/stats", server.url))
        .bearer_auth("s3cret");
    assert_eq!(send(right).await.0, 200);
}

#[tokio::test]
async fn start_rollout_sets_the_group_size_as_slime_sends_it() {
    let dir = store("start");
    let server = Server::start(&dir, &["--group-size", "8"]);
    let payload = json!({"num_repeat_per_sample": "2", "task_type": "math", "num_epoch": "3"});
    let (status, body) = post(&server, "/start_rollout", &payload).await;
    assert_eq!(
        (status, body["message"].clone()),
        (200, json!("Rollout started"))
    );
    write_group(&server, "q", &[0.0, 1.0]).await;
    let (_, data) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&data), ["q-0", "q-1"]);
    let (status, _) = post(
        &server,
        "/start_rollout",
        &json!({"min_valid_item_size_ratio": 3}),
    )
    .await;
    assert_eq!(status, 400);
    // A timeout past what a duration holds is refused, not a dropped connection.
    let (status, body) = post(
        &server,
        "/start_rollout",
        &json!({"group_timeout_seconds": 1e20}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"]
        .as_str()
        .is_some_and(|m| m.contains("group_timeout_seconds")));
    assert_eq!(post(&server, "/start_rollout", &json!({})).await.0, 200);
}

/// A server of one slot for groups of two, with write timeout `timeout` (seconds): group
/// q0 fills the slot, and q1-0 is pending (it needs no room yet).
/// The store (removed when dropped, so the test keeps it) and its server.
async fn one_full_slot(tag: &str, timeout: &str) -> (StoreDir, Server) {
    let dir = store(tag);
    let server = Server::start(
        &dir,
        &[
            "--group-size",
            "2",
            "--capacity",
            "1",
            "--write-timeout",
            timeout,
        ],
    );
    write_group(&server, "q0", &[0.0, 1.0]).await;
    let (status, _) = post(&server, "/buffer/write", &item("q1-0", "q1", 1.0)).await;
    assert_eq!(status, 200, "pending: no room needed yet");
    (dir, server)
}

#[tokio::test]
async fn a_full_buffer_answers_503_with_retry_after() {
    // Long enough for the writes that succeed on a loaded machine (each one's fsynced log
    // write counts against it), short enough that the one refused is refused soon.
    let (_dir, server) = one_full_slot("full", "2").await;
    // The second item seals q1, which needs the one slot q0 holds.
    let resp = client()
        .post(format!("{}/buffer/write", server.url))
        .header("content-type", "application/json")
        .body(item("q1-1", "q1", 0.0).to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let (_, stats) = get(&server, "/buffer/stats").await;
    assert_eq!(stats["data"]["data"]["items_adding"], 1, "{stats}");
    // An item that seals nothing needs no slot: it gets in beside the waiting one.
    let (status, _) = post(&server, "/buffer/write", &item("q2-0", "q2", 1.0)).await;
    assert_eq!(status, 200);
    // Reading makes room: the waiting put lands, the retried write is a duplicate (200),
    // and q1 is whole (read with a wait: the put lands in the background).
    let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&body), ["q0-0", "q0-1"]);
    // Once the waiting put has landed, the retry is decided at once (while it is still
    // landing, the retry would wait for it under its own write timeout).
    stat_reaches(&server, "items_adding", 0).await;
    let (status, body) = post(&server, "/buffer/write", &item("q1-1", "q1", 0.0)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["data"][0]["outcome"], "duplicate");
    let (_, body) = post(
        &server,
        "/buffer/read",
        &json!({"batch_size": 2, "timeout": 10}),
    )
    .await;
    assert_eq!(uids(&body), ["q1-0", "q1-1"]);
}

/// Polls `/buffer/stats` until `key` is `want` (10 s at most).
async fn stat_reaches(server: &Server, key: &str, want: u64) {
    let seen = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let (_, stats) = get(server, "/buffer/stats").await;
            if stats["data"]["data"][key] == want {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(seen.is_ok(), "`{key}` never reached {want}");
}

/// A write POSTed in the background: its status when it is answered.
fn spawn_write(server: &Server, path: &str, body: Value) -> tokio::task::JoinHandle<u16> {
    let url = format!("{}{path}", server.url);
    tokio::spawn(async move {
        client()
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("send")
            .status()
            .as_u16()
    })
}

/// At most one buffer's worth of items is on its way in and as many more wait their turn;
/// past that a write is refused at once, before its body is parsed. The waiting writes
/// land, in turn, as reads make room.
#[tokio::test]
async fn writes_wait_their_turn_and_past_a_buffers_worth_are_refused_at_once() {
    let (_dir, server) = one_full_slot("queue", "60").await;
    // q1-1 seals q1 and waits for the slot q0 holds: one of the two items that may be on
    // their way in at once.
    let sealing = spawn_write(&server, "/buffer/write", item("q1-1", "q1", 0.0));
    stat_reaches(&server, "items_adding", 1).await;
    // Two more items wait their turn: a buffer's worth is queued.
    let queued = spawn_write(
        &server,
        "/buffer/write_batch",
        json!([item("q2-0", "q2", 1.0), item("q2-1", "q2", 0.0)]),
    );
    stat_reaches(&server, "items_queued", 2).await;
    let resp = client()
        .post(format!("{}/buffer/write_batch", server.url))
        .header("content-type", "application/json")
        .body("[{not json")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 503, "refused before it is parsed");
    assert_eq!(resp.headers()["retry-after"], "1");
    // Each read makes room for the next group, in the order written.
    let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&body), ["q0-0", "q0-1"]);
    for (write, group) in [(sealing, "q1"), (queued, "q2")] {
        assert_eq!(write.await.expect("the write"), 200, "{group}");
        let (_, body) = post(
            &server,
            "/buffer/read",
            &json!({"batch_size": 2, "timeout": 10}),
        )
        .await;
        assert_eq!(uids(&body), [format!("{group}-0"), format!("{group}-1")]);
    }
    let (_, stats) = get(&server, "/buffer/stats").await;
    assert_eq!(stats["data"]["data"]["items_queued"], 0, "{stats}");
    assert_eq!(stats["data"]["data"]["items_adding"], 0, "{stats}");
}

#[tokio::test]
async fn metrics_and_a_graceful_stop() {
    let dir = store("metrics");
    let server = Server::start(&dir, &["--group-size", "2"]);
    write_group(&server, "q", &[0.0, 1.0]).await;
    let text = common::metrics_text(&server).await;
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert_eq!(value("rollout_buffer_http_items_written_total"), 2.0);
    assert_eq!(value("rollout_buffer_ingest_stored_groups"), 1.0);
    assert_eq!(value("rollout_buffer_ingest_reopened_groups"), 0.0);
    assert_eq!(value("rollout_buffer_rpc_eligible{rpc=\"train\"}"), 1.0);
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
}

/// SIGTERM sent the moment the server announces its address stops it gracefully (exit 0),
/// never by the signal's default action: the handlers are installed before the line.
#[test]
fn sigterm_right_after_the_listening_line_exits_cleanly() {
    let dir = store("sigterm-at-start");
    for round in 0..30 {
        let server = Server::start(&dir, &[]);
        let status = server.terminate();
        assert!(status.success(), "round {round}: {status:?}");
    }
}

#[test]
fn serve_refuses_settings_out_of_range_before_touching_the_store() {
    let dir = store("serve-bad-settings");
    for (flag, value) in [("--archive-mb", "0"), ("--group-size", "0")] {
        let (ok, _, err) = common::cli(
            "serve",
            &[
                "--store".as_ref(),
                dir.as_os_str(),
                flag.as_ref(),
                value.as_ref(),
            ],
        );
        assert!(!ok, "{flag} {value} was accepted");
        assert!(err.contains(&format!("{flag} must be")), "{err}");
        assert!(!dir.exists(), "{flag} {value}: the store was created");
    }
}

/// A `/buffer/read` that falls short waits for more groups without taking the ones it
/// holds again and again (each pass gave them back and took them at once, logging a
/// redelivery every time), lets other reads through meanwhile, and answers all of them
/// once enough are ready.
#[tokio::test]
async fn a_read_that_falls_short_waits_for_new_groups_without_spinning() {
    let dir = store("read-wait");
    let server = Server::start(&dir, &["--group-size", "2"]);
    write_group(&server, "q0", &[0.0, 1.0]).await;
    async fn redelivered(server: &Server) -> f64 {
        common::metrics_text(server)
            .await
            .lines()
            .find(|l| l.starts_with("rollout_buffer_rpc_redelivered{rpc=\"train\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    }
    // Waits 1 s for 100 items, and gives up.
    let (status, body) = post(
        &server,
        "/buffer/read",
        &json!({"batch_size": 100, "timeout": 1}),
    )
    .await;
    assert_eq!(
        (status, body["success"].clone()),
        (200, json!(false)),
        "{body}"
    );
    let after_wait = redelivered(&server).await;
    assert!(after_wait <= 2.0, "{after_wait} redeliveries in one wait");
    // A read waiting for 4 items: another read gets through meanwhile (it answers at once,
    // with nothing: the waiting read holds q0), and a new group completes the wait.
    let waiting = {
        let server_url = server.url.clone();
        tokio::spawn(async move {
            let req = client()
                .post(format!("{server_url}/buffer/read"))
                .header("content-type", "application/json")
                .body(json!({"batch_size": 4, "timeout": 30}).to_string());
            send(req).await.1
        })
    };
    stat_reaches(&server, "groups_leased", 1).await;
    let (_, other) = tokio::time::timeout(
        Duration::from_secs(10),
        post(&server, "/get_rollout_data", &json!({})),
    )
    .await
    .expect("a read does not wait behind a waiting read");
    assert_eq!(other["success"], false, "{other}");
    write_group(&server, "q1", &[0.0, 1.0]).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the wait ends once the group is ready")
        .expect("task");
    assert_eq!(answer["success"], true, "{answer}");
    assert_eq!(uids(&answer), ["q0-0", "q0-1", "q1-0", "q1-1"]);
    assert!(redelivered(&server).await - after_wait <= 4.0);
}

/// A uid another group's item holds is refused (`uid_taken`): slime's uids are uuid4s, one
/// per item, and the ingest logs pending items under their uid. The holder keeps its texts,
/// and the other group completes with items of its own.
#[tokio::test]
async fn a_uid_another_group_holds_is_refused_and_the_holder_keeps_its_texts() {
    let dir = store("same-uid");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let mut outcomes = Vec::new();
    for (instance, reward) in [("A", 0.25), ("B", 0.75)] {
        let mut same = item("same", instance, reward);
        same["messages"] = json!([{"role": "user", "content": format!("from {instance}")}]);
        let (status, body) = post(&server, "/buffer/write", &same).await;
        assert_eq!(status, 200, "{body}");
        outcomes.push(body["data"]["data"][0]["outcome"].clone());
    }
    assert_eq!(outcomes, [json!("pending"), json!("uid_taken")]);
    // Rewards that differ within each group, or the default hooks discard it.
    for (uid, reward) in [("A-2", 0.5), ("B-1", 0.25), ("B-2", 0.75)] {
        let other = item(uid, &uid[..1], reward);
        assert_eq!(post(&server, "/buffer/write", &other).await.0, 200);
    }
    let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
    let answered = body["data"]["data"].as_array().expect("items");
    let mut held: Vec<(String, String, String)> = answered
        .iter()
        .map(|i| {
            (
                i["instance_id"].as_str().expect("id").to_owned(),
                i["uid"].as_str().expect("uid").to_owned(),
                i["messages"][0]["content"]
                    .as_str()
                    .expect("text")
                    .to_owned(),
            )
        })
        .collect();
    held.sort();
    let text = "2+2?".to_owned();
    assert_eq!(
        held,
        [
            ("A".to_owned(), "A-2".to_owned(), text.clone()),
            ("A".to_owned(), "same".to_owned(), "from A".to_owned()),
            ("B".to_owned(), "B-1".to_owned(), text.clone()),
            ("B".to_owned(), "B-2".to_owned(), text),
        ]
    );
}

/// A rollout resent after the server restarted, once its group was read, is a duplicate
/// (as it is before a restart), not the start of a new group served again.
#[tokio::test]
async fn a_rollout_resent_after_a_restart_is_not_served_again() {
    let dir = store("resend-restart");
    let server = Server::start(&dir, &["--group-size", "2"]);
    write_group(&server, "q", &[0.0, 1.0]).await;
    let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&body), ["q-0", "q-1"]);
    assert!(server.terminate().success());
    let server = Server::start(&dir, &["--group-size", "2"]);
    let (status, body) = post(&server, "/buffer/write", &item("q-0", "q", 0.0)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["data"][0]["outcome"], "duplicate", "{body}");
    let (_, body) = post(&server, "/buffer/write", &item("q-2", "q", 0.5)).await;
    assert_eq!(body["data"]["data"][0]["outcome"], "pending", "{body}");
    let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert!(uids(&body).is_empty(), "{body}");
}

/// `/start_rollout` changing the settings while writes are in flight loses no item and
/// serves none twice (the ingest was swapped for a new one, which raced the old one for
/// the pending items).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_rollout_during_writes_loses_and_doubles_nothing() {
    let dir = store("start-race");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let url = server.url.clone();
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut answered = Vec::new();
                // Each group's first item, then the group before's second: a group is
                // pending across other writes.
                let order = std::iter::once((0, 0))
                    .chain((1..31).flat_map(|g| [(g, 0), (g - 1, 1)]))
                    .chain([(30, 1)]);
                for (g, k) in order {
                    let uid = format!("w{w}-g{g}-{k}");
                    let body = item(&uid, &format!("w{w}-g{g}"), k as f64);
                    let req = client()
                        .post(format!("{url}/buffer/write"))
                        .header("content-type", "application/json")
                        .body(body.to_string());
                    let (status, answer) = send(req).await;
                    assert_eq!(status, 200, "{answer}");
                    answered.push(uid);
                }
                answered
            })
        })
        .collect();
    // Settings changing back and forth for as long as the writes go on.
    let writing = Arc::new(AtomicBool::new(true));
    let starts = {
        let (url, writing) = (url.clone(), Arc::clone(&writing));
        tokio::spawn(async move {
            let mut i = 0;
            while writing.load(Ordering::Relaxed) {
                let req = client()
                    .post(format!("{url}/start_rollout"))
                    .header("content-type", "application/json")
                    .body(json!({"group_timeout_seconds": 300 + i % 2}).to_string());
                assert_eq!(send(req).await.0, 200);
                i += 1;
            }
            i
        })
    };
    // And a consumer reading as they go on.
    let reader = {
        let (url, writing) = (url.clone(), Arc::clone(&writing));
        tokio::spawn(async move {
            let mut read = Vec::new();
            while writing.load(Ordering::Relaxed) {
                let req = client()
                    .post(format!("{url}/get_rollout_data"))
                    .header("content-type", "application/json")
                    .body("{}");
                read.extend(uids(&send(req).await.1));
            }
            read
        })
    };
    let mut written = Vec::new();
    for w in writers {
        written.extend(w.await.expect("writer"));
    }
    writing.store(false, Ordering::Relaxed);
    assert!(starts.await.expect("starts") > 1);
    let mut read = reader.await.expect("reader");
    // A third item for every group: one that an ingest still held as pending, although
    // its group was stored, would form a group with it and be served again.
    let fillers: Vec<Value> = (0..8)
        .flat_map(|w| {
            (0..31).map(move |g| item(&format!("fill-w{w}-g{g}"), &format!("w{w}-g{g}"), 0.5))
        })
        .collect();
    let (status, body) = post(&server, "/buffer/write_batch", &json!(fillers)).await;
    assert_eq!(status, 200, "{body}");
    loop {
        let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
        let got = uids(&body);
        if got.is_empty() {
            break;
        }
        read.extend(got);
    }
    read.retain(|uid| !uid.starts_with("fill-"));
    read.sort();
    written.sort();
    assert_eq!(read, written, "every item answered is read, once");
}

/// `current_size` counts the items held, grouped or waiting for their group, also those
/// a restart brought back.
#[tokio::test]
async fn current_size_counts_the_items_held_across_a_restart() {
    let dir = store("current-size");
    let server = Server::start(&dir, &["--group-size", "2"]);
    write_group(&server, "r", &[0.0, 1.0]).await;
    assert_eq!(
        post(&server, "/buffer/write", &item("p-0", "p", 1.0))
            .await
            .0,
        200
    );
    let size = |server: &Server| {
        let url = format!("{}/buffer/stats", server.url);
        async move {
            let (_, stats) = send(client().get(url)).await;
            stats["data"]["data"]["current_size"].clone()
        }
    };
    assert_eq!(size(&server).await, 3);
    assert!(server.terminate().success());
    let server = Server::start(&dir, &["--group-size", "2"]);
    assert_eq!(size(&server).await, 3);
    let (_, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&body), ["r-0", "r-1"]);
    assert_eq!(size(&server).await, 1);
}
