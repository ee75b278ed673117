//! Requests an audit of the server with hostile input found mishandled: each is answered
//! as the contract says (a 4xx naming the problem, nothing stored) or, for slime's own
//! habits (an empty read body, a lower-case `bearer`), served.

mod common;

use common::{answer, client, get, item, post, store, uids, write_group, Server};
use serde_json::{json, Value};

/// The status and JSON body of a POST of raw `body` with `content_type`.
async fn raw(server: &Server, path: &str, content_type: &str, body: String) -> (u16, Value) {
    let url = format!("{}{path}", server.url);
    answer(
        client()
            .post(url)
            .header("content-type", content_type)
            .body(body),
    )
    .await
}

async fn written(server: &Server) -> u64 {
    let (_, stats) = get(server, "/buffer/stats").await;
    stats["data"]["data"]["total_written"]
        .as_u64()
        .expect("total_written")
}

/// slime's consumer may post nothing at all: that is `{}`, all ready groups (it was a 400
/// saying `batch_size` 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_read_body_reads_everything_ready() {
    let dir = store("empty-read");
    let server = Server::start(&dir, &["--group-size", "2"]);
    write_group(&server, "q0", &[0.0, 1.0]).await;
    write_group(&server, "q1", &[0.0, 1.0]).await;
    let (status, body) = raw(&server, "/get_rollout_data", "application/json", "".into()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        uids(&body),
        ["q0-0", "q0-1", "q1-0", "q1-1"].map(String::from)
    );
    write_group(&server, "q2", &[0.0, 1.0]).await;
    let (status, body) = raw(&server, "/buffer/read", "application/json", " \n".into()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(uids(&body), ["q2-0", "q2-1"].map(String::from));
}

/// serde's derived structs also take an array of their fields in order: an item written
/// as `["u", "q", [], 0.5, {}]` was stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_array_where_an_object_belongs_is_refused() {
    let dir = store("array-shaped");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let one = json!(["a1", "q", [], 0.5, {}]);
    let (status, body) = post(&server, "/buffer/write", &one).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["message"]
        .as_str()
        .is_some_and(|m| m.contains("a JSON object")));
    let batch = json!([item("b0", "q", 1.0), ["b1", "q", [], 0.5, null]]);
    let (status, body) = post(&server, "/buffer/write_batch", &batch).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(written(&server).await, 0, "nothing stored");
    let (status, body) = post(&server, "/buffer/read", &json!([])).await;
    assert_eq!(status, 422, "{body}");
}

/// A chat nested past serde_json's own limit was stored and answered, and no reader could
/// parse the answer (Python's `json` gives up at about a thousand levels).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_or_extra_info_nested_too_deep_are_refused() {
    let dir = store("deep");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let item_with = |uid: &str, messages: &str, extra: &str| {
        format!(
            r#"{{"uid": "{uid}", "instance_id": "q", "messages": {messages}, "reward": 1, "extra_info": {extra}}}"#
        )
    };
    for (messages, extra) in [
        (nested(200_000), "{}".to_owned()),
        ("[]".to_owned(), format!(r#"{{"k": {}}}"#, nested(129))),
    ] {
        let body = item_with("deep", &messages, &extra);
        let (status, answer) = raw(&server, "/buffer/write", "application/json", body).await;
        assert_eq!(status, 400, "{answer}");
        assert!(
            answer["message"]
                .as_str()
                .is_some_and(|m| m.contains("deep")),
            "{answer}"
        );
    }
    assert_eq!(written(&server).await, 0, "nothing stored");
    let body = item_with("fine", &nested(128), "{}");
    let (status, answer) = raw(&server, "/buffer/write", "application/json", body).await;
    assert_eq!(status, 200, "{answer}");
}

/// A group size past any real one (1e308 saturated to usize::MAX: no group ever sealed
/// again) and a group timeout that is > 0 but rounds to no time at all are 400s that
/// change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_settings_out_of_range_are_refused() {
    let dir = store("settings-range");
    let server = Server::start(&dir, &["--group-size", "2"]);
    for bad in [
        json!({"num_repeat_per_sample": 1e308}),
        json!({"num_repeat_per_sample": 65_537}),
        json!({"group_timeout_seconds": 1e-320}),
    ] {
        let (status, body) = post(&server, "/start_rollout", &bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (_, stats) = get(&server, "/buffer/stats").await;
    assert_eq!(
        stats["data"]["data"]["max_size"],
        4096 * 2,
        "settings unchanged"
    );
    write_group(&server, "q0", &[0.0, 1.0]).await;
    let (status, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!((status, uids(&body).len()), (200, 2), "{body}");
    for (option, value) in [("--group-size", "65537"), ("--group-timeout", "1e-320")] {
        let (ok, _, err) = common::cli(
            "serve",
            &[
                "--store".as_ref(),
                dir.as_os_str(),
                option.as_ref(),
                value.as_ref(),
            ],
        );
        assert!(!ok && err.contains(option), "{err}");
    }
}

/// A read asking for more items than the buffer ever holds held every ready group, hiding
/// them from other readers, until its timeout; it is a 400 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_size_past_the_buffer_is_refused_at_once() {
    let dir = store("batch-past");
    let server = Server::start(&dir, &["--group-size", "2", "--capacity", "4"]);
    write_group(&server, "q0", &[0.0, 1.0]).await;
    let read = json!({"batch_size": 9, "timeout": 600});
    let (status, body) = post(&server, "/buffer/read", &read).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("8 items")),
        "{body}"
    );
    let (status, body) = post(
        &server,
        "/buffer/read",
        &json!({"batch_size": 8, "wait": false}),
    )
    .await;
    assert_eq!(
        (status, body["success"].clone()),
        (200, json!(false)),
        "{body}"
    );
    let (status, body) = post(&server, "/get_rollout_data", &json!({})).await;
    assert_eq!((status, uids(&body).len()), (200, 2), "{body}");
}

/// Media types and the authorization scheme are case-insensitive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_types_and_the_bearer_scheme_ignore_case() {
    let dir = store("case");
    let server = Server::start(&dir, &["--group-size", "2", "--token", "s3cret"]);
    let write = |uid: &str, content_type: &'static str, auth: &'static str| {
        client()
            .post(format!("{}/buffer/write", server.url))
            .header("content-type", content_type)
            .header("authorization", auth)
            .body(item(uid, "q", 1.0).to_string())
            .send()
    };
    let resp = write("a", "Application/JSON", "bearer s3cret")
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    let resp = write("b", "application/json", "BEARER s3cret")
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    let resp = write("c", "application/json", "bearer wrong")
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 401);
}

/// A bad item of a JSON batch is named by its place: an empty uid names no item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_item_of_a_batch_is_named_by_its_place() {
    let dir = store("batch-place");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let mut nameless = item("x", "q", 1.0);
    nameless["uid"] = json!("");
    let batch = json!([item("a", "q", 1.0), nameless]);
    let (status, body) = post(&server, "/buffer/write_batch", &batch).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["message"], "[1]: item: `uid` is empty");
    assert_eq!(written(&server).await, 0, "nothing stored");
}

/// Sends `head` on a raw connection and reads until the server closes it: `Err` if it
/// was still open after 20 s, else what came back (or the read's error, a reset say).
async fn send_until_closed(
    server: &Server,
    head: &str,
) -> Result<std::io::Result<Vec<u8>>, tokio::time::error::Elapsed> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = server.url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    let read = tokio::time::timeout(std::time::Duration::from_secs(20), read).await;
    read.map(|r| r.map(|_| answer))
}

/// A client that declared a body and stopped sending it held its request (and a task) for
/// good; it gets a 408 once `--body-timeout` has passed, and the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_is_answered_408() {
    let dir = store("body-timeout");
    let server = Server::start(&dir, &["--group-size", "2", "--body-timeout", "0.2"]);
    for path in ["/buffer/write", "/start_rollout"] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: 50\r\n\r\n{{\"uid\""
        );
        let answer = send_until_closed(&server, &head)
            .await
            .expect("answered, not held")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(answer.contains("--body-timeout"), "{path}: {answer}");
    }
    let (status, body) = post(&server, "/buffer/write", &item("a", "q", 1.0)).await;
    assert_eq!(status, 200, "{body}");
}

/// A connection whose request head never finishes (or that never sends one) was held
/// for good, a file descriptor and a task each; it is closed once `--header-timeout` has
/// passed, and the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_that_stops_arriving_is_closed() {
    let dir = store("header-timeout");
    let server = Server::start(&dir, &["--group-size", "2", "--header-timeout", "0.2"]);
    for head in ["POST /buffer/write HTTP/1.1\r\nHost: x\r\n", ""] {
        // Closed (an EOF, or a reset for the bytes left unread), not held.
        let closed = send_until_closed(&server, head).await;
        assert!(closed.is_ok(), "{head:?}: held open");
    }
    let (status, body) = post(&server, "/buffer/write", &item("a", "q", 1.0)).await;
    assert_eq!(status, 200, "{body}");
}

/// A `/start_rollout` naming a setting twice is a 422 naming it, and changes nothing (the
/// last value had won without a word, where an item naming a field twice is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_named_twice_is_refused() {
    let dir = store("settings-twice");
    let server = Server::start(&dir, &["--group-size", "2"]);
    let body = r#"{"num_repeat_per_sample": 4, "num_repeat_per_sample": 8}"#;
    let (status, answer) = raw(&server, "/start_rollout", "application/json", body.into()).await;
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer
            .to_string()
            .contains("duplicate field `num_repeat_per_sample`"),
        "{answer}"
    );
    let (_, stats) = get(&server, "/buffer/stats").await;
    assert_eq!(
        stats["data"]["data"]["max_size"],
        4096 * 2,
        "settings unchanged"
    );
    let (status, answer) = raw(
        &server,
        "/start_rollout",
        "application/json",
        r#"{"num_repeat_per_sample": 4}"#.into(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}

/// A stop waits for the requests in flight for `--stop-grace`, then closes their
/// connections and exits: a client stalled mid-body held the stop for `--body-timeout`
/// (60 s by default, past Kubernetes' 30 s grace period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_does_not_wait_for_a_stalled_body_past_its_grace() {
    use tokio::io::AsyncWriteExt;
    let dir = store("stop-grace");
    let server = Server::start(&dir, &["--body-timeout", "600", "--stop-grace", "0.5"]);
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut stalled = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    stalled
        .write_all(
            b"POST /buffer/write HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 50\r\n\r\n{\"uid\"",
        )
        .await
        .expect("send");
    // A request on another connection answered: the server is reading requests.
    let (status, _) = get(&server, "/").await;
    assert_eq!(status, 200);
    let stopped = tokio::task::spawn_blocking(move || server.terminate());
    let status = tokio::time::timeout(std::time::Duration::from_secs(60), stopped)
        .await
        .expect("the stop waited for the stalled body")
        .expect("join");
    assert!(status.success(), "{status:?}");
    drop(stalled);
}
