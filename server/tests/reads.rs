//! Reads beside other calls, against the real process: two long-poll reads waiting
//! together, a read waiting when the server is told to stop, a `/start_rollout` (or a
//! restart) whose regrouped groups wait for room; a read that falls short, one past a
//! group the hooks reject, and groups that time out short.

mod common;

use common::{client, get, item, post, store, uids, write_group, Server};
use serde_json::{json, Value};
use std::time::Duration;

/// Waits (bounded) until `n` reads wait on the buffer for a group.
async fn getters_waiting(server: &Server, n: u64) {
    for _ in 0..1000 {
        let (_, body) = get(server, "/debug/waiting").await;
        if body["rpcs"][0]["getters_waiting"].as_u64() == Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} reads never waited");
}

/// A `/buffer/read` of `batch_size` items waiting up to `timeout` seconds, with a client
/// that waits longer than the read.
async fn long_read(url: String, batch_size: u64, timeout: f64) -> (u16, Value) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(timeout + 30.0))
        .build()
        .expect("client");
    common::send(
        client
            .post(format!("{url}/buffer/read"))
            .body(json!({"batch_size": batch_size, "timeout": timeout}).to_string()),
    )
    .await
}

/// Two reads of 6 items waiting while groups of 2 arrive one at a time: each held the
/// groups it had taken while it waited for more, so with 8 items in, each could hold 4 and
/// wait out its timeout short, one of them answering nothing. Reads that wait take turns
/// now: the first answers as soon as 6 items are in.
#[tokio::test]
async fn two_waiting_reads_take_turns_instead_of_splitting_the_groups() {
    let dir = store("two-readers");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let first = tokio::spawn(long_read(server.url.clone(), 6, 25.0));
    getters_waiting(&server, 1).await;
    let second = tokio::spawn(long_read(server.url.clone(), 6, 25.0));
    let (mut first, mut second) = (first, second);
    for g in 0..4 {
        write_group(&server, &format!("q{g}"), &[0.0, 1.0]).await;
    }
    let (done, first_done) = tokio::select! {
        done = &mut first => (done, true),
        done = &mut second => (done, false),
    };
    let rest = if first_done { second } else { first };
    let (status, body) = done.expect("the read");
    assert_eq!(
        (status, body["success"].clone()),
        (200, json!(true)),
        "{body}"
    );
    assert_eq!(uids(&body).len(), 6, "{body}");
    for g in 4..6 {
        write_group(&server, &format!("q{g}"), &[0.0, 1.0]).await;
    }
    let (status, other) = rest.await.expect("join");
    assert_eq!(
        (status, other["success"].clone()),
        (200, json!(true)),
        "{other}"
    );
    let mut all = uids(&body);
    all.extend(uids(&other));
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 12, "every item served once");
}

/// SIGTERM while a read waits for groups: the graceful shutdown waited for the read,
/// its timeout up to an hour, and further signals did not help. The read answers now
/// (with what it has), and the server exits.
#[tokio::test]
async fn a_stopping_server_ends_the_reads_waiting() {
    let dir = store("stop-read");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let read = tokio::spawn(long_read(server.url.clone(), 2, 600.0));
    getters_waiting(&server, 1).await;
    let pid = server.child.id().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
    let (code, body) = tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the read answered once the server began to stop")
        .expect("join");
    assert_eq!(
        (code, body["success"].clone()),
        (200, json!(false)),
        "{body}"
    );
    let mut server = server;
    let status = tokio::task::spawn_blocking(move || server.child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

/// `/start_rollout` regrouping pending items into groups that wait for room: awaited
/// inline, it hung with a full buffer, and a client that gave up cancelled it halfway,
/// the groups it had taken out of the ingest neither stored nor pending (resends answered
/// `duplicate`, reads never serving them). It answers 503 after `--write-timeout` now,
/// the groups land once a read makes room, and a write of one whole new group is taken.
#[tokio::test]
async fn a_regrouping_that_waits_for_room_answers_503_and_lands_later() {
    let dir = store("start-rollout-full");
    let server = Server::start(
        &dir,
        &[
            "--group-size",
            "8",
            "--capacity",
            "2",
            "--write-timeout",
            "1",
        ],
    );
    for g in 0..2 {
        write_group(
            &server,
            &format!("full{g}"),
            &[0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0],
        )
        .await;
    }
    // Three half groups pending: at size 4 each is a whole group, with no room for it.
    for g in 0..3 {
        write_group(&server, &format!("half{g}"), &[0.0, 1.0, 0.0, 1.0]).await;
    }
    let start = json!({"num_repeat_per_sample": 4});
    let (status, body) = post(&server, "/start_rollout", &start).await;
    assert_eq!(status, 503, "{body}");
    let (_, stats) = get(&server, "/buffer/stats").await;
    assert_eq!(
        stats["data"]["data"]["max_size"],
        json!(8),
        "the new settings hold: {stats}"
    );
    // A read makes room; the regrouped groups land and are read whole.
    let (_, full) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&full).len(), 16, "{full}");
    // Two of the three fit at a time (two groups of 4 now).
    let mut half = Vec::new();
    for n in [8, 4] {
        let (status, body) = long_read(server.url.clone(), n, 25.0).await;
        assert_eq!(
            (status, body["success"].clone()),
            (200, json!(true)),
            "{body}"
        );
        half.extend(uids(&body));
    }
    half.sort();
    let mut want: Vec<String> = (0..3)
        .flat_map(|g| (0..4).map(move |i| format!("half{g}-{i}")))
        .collect();
    want.sort();
    assert_eq!(half, want);
    let (status, body) = post(&server, "/start_rollout", &start).await;
    assert_eq!(status, 200, "the settings are in place: {body}");
}

/// A group size raised by `/start_rollout` kept the startup size's limit on the items in
/// flight (a buffer's worth): a write of one whole group of the new size was refused as
/// too many items at once.
#[tokio::test]
async fn a_raised_group_size_takes_a_whole_group_in_one_write() {
    let dir = store("start-rollout-in-flight");
    let server = Server::start(&dir, &["--group-size", "1", "--capacity", "4"]);
    let (status, body) = post(
        &server,
        "/start_rollout",
        &json!({"num_repeat_per_sample": 8}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let batch: Vec<Value> = (0..8)
        .map(|i| item(&format!("new-{i}"), "new", f64::from(i % 2)))
        .collect();
    let (status, body) = common::send(
        client()
            .post(format!("{}/buffer/write_batch", server.url))
            .body(json!(batch).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, read) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&read).len(), 8, "{read}");
}

/// Two servers on one store each served the same groups: making the same changes, they
/// wrote the same log records, and each took the other's for its own. The second is
/// refused at startup now, naming the store; `inspect` still reads it beside the first,
/// and once the first stops, a server starts on it again.
#[tokio::test]
async fn a_second_server_on_one_store_is_refused() {
    let dir = store("two-servers");
    let first = Server::start(&dir, &["--group-size", "2"]);
    write_group(&first, "q0", &[0.0, 1.0]).await;
    let (ok, _, err) = common::serve_cli(&dir, &[]);
    assert!(
        !ok && err.contains("in use by another server or a repair"),
        "{err}"
    );
    let (ok, out, err) = common::inspect(&[dir.as_os_str()]);
    assert!(ok, "{out}{err}");
    assert!(first.terminate().success());
    let again = Server::start(&dir, &["--group-size", "2"]);
    let (_, body) = post(&again, "/get_rollout_data", &json!({})).await;
    assert_eq!(uids(&body), ["q0-0", "q0-1"]);
}

/// A restart with a smaller group size completes the groups pending at the old size. On
/// a full store their put waits for room, which only a read makes: the server stored them
/// before listening, so it never listened. It listens now, and they land after the read.
#[tokio::test]
async fn a_restart_that_completes_groups_on_a_full_store_still_listens() {
    let dir = store("restart-full");
    let first = Server::start(&dir, &["--group-size", "4", "--capacity", "1"]);
    write_group(&first, "full", &[0.0, 1.0, 0.0, 1.0]).await;
    let half: Vec<Value> = (0..2)
        .map(|i| item(&format!("half-{i}"), "half", f64::from(i)))
        .collect();
    let (status, body) = common::send(
        client()
            .post(format!("{}/buffer/write_batch", first.url))
            .body(json!(half).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(first.terminate().success());
    // Started on a thread of its own, so a server that never listens fails the test
    // rather than hanging it.
    let (started, listening) = std::sync::mpsc::channel();
    let path = dir.to_path_buf();
    std::thread::spawn(move || {
        let _ = started.send(Server::start(
            &path,
            &["--group-size", "2", "--capacity", "1"],
        ));
    });
    let server = listening
        .recv_timeout(Duration::from_secs(60))
        .expect("the server listens");
    // The completed group waiting for room is held too.
    let (_, stats) = get(&server, "/buffer/stats").await;
    assert_eq!(stats["data"]["data"]["current_size"], 6, "{stats}");
    let (_, full) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!(
        uids(&full),
        ["full-0", "full-1", "full-2", "full-3"],
        "{full}"
    );
    let (status, body) = long_read(server.url.clone(), 2, 25.0).await;
    assert_eq!(
        (status, uids(&body)),
        (200, vec!["half-0".to_owned(), "half-1".to_owned()]),
        "{body}"
    );
}

/// A group that times out short of `min_timeout_group_size_ratio` is dropped, as slime
/// drops it, and counted where an operator looks: `/debug/waiting` and `/metrics`.
#[tokio::test]
async fn a_group_that_times_out_short_is_dropped_and_counted() {
    let dir = store("timed-out-short");
    let server = Server::start(&dir, &["--group-size", "4", "--group-timeout", "0.2"]);
    let (status, _) = post(&server, "/buffer/write", &item("q1-0", "q1", 1.0)).await;
    assert_eq!(status, 200);
    let mut dropped = Value::Null;
    for _ in 0..1000 {
        let (_, body) = get(&server, "/debug/waiting").await;
        dropped = body["dropped_groups"].clone();
        if dropped == json!(1) {
            assert_eq!(body["dropped_rollouts"], 1, "{body}");
            assert_eq!(body["pending_groups"], 0, "{body}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(dropped, json!(1), "the group was never dropped");
    let text = common::metrics_text(&server).await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("rollout_buffer_ingest_dropped_rollouts 1")),
        "{text}"
    );
}

#[tokio::test]
async fn a_read_that_falls_short_drops_nothing() {
    let dir = store("short");
    let server = Server::start(&dir, &["--group-size", "4"]);
    write_group(&server, "q1", &[0.0, 1.0, 0.0, 1.0]).await;
    let (_, short) = post(&server, "/get_rollout_data", &json!({"batch_size": 8})).await;
    assert_eq!(short["success"], false, "{short}");
    let (_, whole) = post(&server, "/get_rollout_data", &json!({"batch_size": 4})).await;
    assert_eq!(whole["success"], true, "{whole}");
    assert_eq!(uids(&whole).len(), 4);
}

/// A group the hooks reject after it is leased (every reward outside [0, 1]) counts for
/// nothing: a read that does not wait goes on to the next group, as slime's does.
#[tokio::test]
async fn a_read_goes_past_a_group_the_hooks_reject() {
    let dir = store("rejected-first");
    let server = Server::start(&dir, &["--group-size", "4"]);
    write_group(&server, "q-out", &[2.0, 3.0, 2.0, 3.0]).await;
    write_group(&server, "q-in", &[0.0, 1.0, 0.0, 1.0]).await;
    let (_, read) = post(&server, "/get_rollout_data", &json!({"batch_size": 4})).await;
    assert_eq!(read["success"], true, "{read}");
    assert_eq!(uids(&read), ["q-in-0", "q-in-1", "q-in-2", "q-in-3"]);
}
