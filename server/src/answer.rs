//! A read's answer, in slime's JSON envelope or, for a client that sends `Accept:
//! application/vnd.apache.arrow.stream`, as an Arrow IPC stream.
//!
//! The items' `messages` and `extra_info` are JSON text checked when they were written
//! (a JSON body parses them; an Arrow body's are parsed one by one), and the store's
//! records are checksummed, so an answer copies that text into its body as it is: it is
//! not parsed again, which on a read of thousands of 4 KB items was the read's largest
//! cost. The Arrow answer has one row per item, the columns of an Arrow batch write plus
//! `raw_reward`, and carries `success`, `message` and `meta_info` (JSON text) in its
//! schema's metadata.

use crate::api_error::ApiError;
use crate::arrow_items::ARROW_STREAM;
use arrow_array::builder::StringBuilder;
use arrow_array::{ArrayRef, Float64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// How a client wants its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// slime's `BufferResponse` envelope.
    Json,
    /// An Arrow IPC stream.
    Arrow,
}

impl Format {
    /// What the request's `Accept` prefers: the Arrow stream media type, named, or JSON
    /// (`application/json`, a `+json` type, or a wildcard), by their `q` weights, the
    /// first listed on a tie; a range of `q=0` is refused, and JSON is the default.
    pub fn of(headers: &HeaderMap) -> Self {
        let mut best: Option<(f32, Self)> = None;
        let ranges = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','));
        for range in ranges {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| {
                    let (name, value) = p.split_once('=')?;
                    name.trim().eq_ignore_ascii_case("q").then(|| value.trim())
                })
                .next()
                .map_or(Some(1.0), |v| v.parse::<f32>().ok());
            let format = if media == ARROW_STREAM {
                Self::Arrow
            } else if media == "application/json"
                || media.ends_with("+json")
                || media == "*/*"
                || media == "application/*"
            {
                Self::Json
            } else {
                continue;
            };
            match q {
                Some(q) if q > 0.0 && best.is_none_or(|(b, _)| q > b) => best = Some((q, format)),
                _ => {}
            }
        }
        best.map_or(Self::Json, |(_, format)| format)
    }
}

/// One item of an answer, its texts borrowed from the leased groups.
#[derive(Debug, Clone, Copy)]
pub struct OutItem<'a> {
    /// The rollout's uid (a padding copy repeats its original's, as slime's do).
    pub uid: &'a str,
    /// The group key.
    pub instance_id: &'a str,
    /// The message list as JSON text; `None` if the value is gone.
    pub messages: Option<&'a str>,
    /// The reward after normalization and padding.
    pub reward: f64,
    /// The reward as written.
    pub raw_reward: f64,
    /// An object as JSON text; `None` if the value is gone.
    pub extra_info: Option<&'a str>,
}

/// An answer's items, encoded.
#[derive(Debug)]
pub enum Items {
    /// A JSON array.
    Json(Vec<u8>),
    /// One batch.
    Arrow(RecordBatch),
}

impl Items {
    /// `items` encoded as `format` asks.
    pub fn encode(format: Format, items: &[OutItem<'_>]) -> Result<Self, ApiError> {
        match format {
            Format::Json => json_items(items).map(Self::Json),
            Format::Arrow => arrow_items(items).map(Self::Arrow),
        }
    }

    /// No items.
    pub fn empty(format: Format) -> Result<Self, ApiError> {
        Self::encode(format, &[])
    }
}

fn encoding_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(format!("encoding the answer: {e}"))
}

fn json_items(items: &[OutItem<'_>]) -> Result<Vec<u8>, ApiError> {
    let text: usize = items
        .iter()
        .map(|i| i.messages.map_or(4, str::len) + i.extra_info.map_or(4, str::len) + 128)
        .sum();
    let mut out = Vec::with_capacity(text + 2);
    out.push(b'[');
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"uid\":");
        serde_json::to_writer(&mut out, item.uid).map_err(encoding_error)?;
        out.extend_from_slice(b",\"instance_id\":");
        serde_json::to_writer(&mut out, item.instance_id).map_err(encoding_error)?;
        out.extend_from_slice(b",\"messages\":");
        out.extend_from_slice(item.messages.unwrap_or("null").as_bytes());
        out.extend_from_slice(b",\"reward\":");
        serde_json::to_writer(&mut out, &item.reward).map_err(encoding_error)?;
        out.extend_from_slice(b",\"raw_reward\":");
        serde_json::to_writer(&mut out, &item.raw_reward).map_err(encoding_error)?;
        out.extend_from_slice(b",\"extra_info\":");
        out.extend_from_slice(item.extra_info.unwrap_or("null").as_bytes());
        out.push(b'}');
    }
    out.push(b']');
    Ok(out)
}

/// The schema of an Arrow answer.
fn arrow_schema() -> Schema {
    let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    Schema::new(vec![
        text("uid", false),
        text("instance_id", false),
        text("messages", true),
        Field::new("reward", DataType::Float64, false),
        Field::new("raw_reward", DataType::Float64, false),
        text("extra_info", true),
    ])
}

fn arrow_items(items: &[OutItem<'_>]) -> Result<RecordBatch, ApiError> {
    let columns: Vec<ArrayRef> = vec![
        text_array(items, |i| Some(i.uid)),
        text_array(items, |i| Some(i.instance_id)),
        text_array(items, |i| i.messages),
        Arc::new(Float64Array::from_iter_values(
            items.iter().map(|i| i.reward),
        )),
        Arc::new(Float64Array::from_iter_values(
            items.iter().map(|i| i.raw_reward),
        )),
        text_array(items, |i| i.extra_info),
    ];
    RecordBatch::try_new(Arc::new(arrow_schema()), columns).map_err(encoding_error)
}

/// A text column sized up front: an answer's chats are tens of megabytes, and a builder
/// grown by doubling copies them again at each step.
fn text_array<'a>(
    items: &[OutItem<'a>],
    text: impl Fn(&OutItem<'a>) -> Option<&'a str>,
) -> ArrayRef {
    let bytes = items.iter().map(|i| text(i).map_or(0, str::len)).sum();
    let mut column = StringBuilder::with_capacity(items.len(), bytes);
    for item in items {
        column.append_option(text(item));
    }
    Arc::new(column.finish())
}

/// The bytes an IPC stream of `batch` takes, about: its buffers (each padded to 64 bytes)
/// and room for the schema and message headers. The stream is written into a buffer of
/// this size, so it is not copied again as it grows.
fn ipc_size(batch: &RecordBatch) -> usize {
    let buffers: usize = batch
        .columns()
        .iter()
        .map(|c| {
            let data = c.to_data();
            data.buffers().iter().map(|b| b.len() + 64).sum::<usize>()
                + data.nulls().map_or(0, |n| n.buffer().len() + 64)
        })
        .sum();
    buffers
        + 4096
        + batch
            .schema()
            .metadata()
            .values()
            .map(String::len)
            .sum::<usize>()
}

/// The HTTP answer: slime's envelope around `items`, or the Arrow stream of them with
/// `success`, `message` and `meta_info` in its schema's metadata.
pub fn respond(
    success: bool,
    message: &str,
    items: Items,
    meta_info: Map<String, Value>,
) -> Result<Response, ApiError> {
    let meta_info = Value::Object(meta_info);
    match items {
        Items::Json(array) => {
            // Sized exactly: an answer of thousands of items is tens of megabytes, and
            // growing it would copy it and hold twice its size.
            let message = serde_json::to_vec(message).map_err(encoding_error)?;
            let meta_info = serde_json::to_vec(&meta_info).map_err(encoding_error)?;
            let mut body = Vec::with_capacity(array.len() + message.len() + meta_info.len() + 64);
            body.extend_from_slice(b"{\"success\":");
            body.extend_from_slice(if success { b"true" } else { b"false" });
            body.extend_from_slice(b",\"message\":");
            body.extend_from_slice(&message);
            body.extend_from_slice(b",\"data\":{\"data\":");
            body.extend_from_slice(&array);
            body.extend_from_slice(b",\"meta_info\":");
            body.extend_from_slice(&meta_info);
            body.extend_from_slice(b"}}");
            Ok(with_type(body, "application/json"))
        }
        Items::Arrow(batch) => {
            let metadata = HashMap::from([
                ("success".to_owned(), success.to_string()),
                ("message".to_owned(), message.to_owned()),
                ("meta_info".to_owned(), meta_info.to_string()),
            ]);
            let schema = batch.schema().as_ref().clone().with_metadata(metadata);
            let batch = batch
                .with_schema(Arc::new(schema))
                .map_err(encoding_error)?;
            let body = ipc_stream(&batch)?;
            Ok(with_type(body, ARROW_STREAM))
        }
    }
}

/// `batch` as an IPC stream, written into a buffer sized for it.
fn ipc_stream(batch: &RecordBatch) -> Result<Vec<u8>, ApiError> {
    let mut body = Vec::with_capacity(ipc_size(batch));
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut body, &batch.schema())
        .map_err(encoding_error)?;
    writer.write(batch).map_err(encoding_error)?;
    writer.finish().map_err(encoding_error)?;
    drop(writer);
    Ok(body)
}

fn with_type(body: Vec<u8>, media_type: &'static str) -> Response {
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    response
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    use super::*;
    use arrow_array::StringArray;

    #[test]
    fn accept_is_read_by_its_q_weights() {
        let format = |accept: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT, accept.parse().expect("a header value"));
            Format::of(&headers)
        };
        let arrow = ARROW_STREAM;
        assert_eq!(format(arrow), Format::Arrow);
        assert_eq!(format(&format!("{arrow}; q=0")), Format::Json);
        assert_eq!(format(&format!("application/json, {arrow}")), Format::Json);
        assert_eq!(format(&format!("{arrow}, application/json")), Format::Arrow);
        assert_eq!(
            format(&format!("application/json;q=0.5, {arrow}")),
            Format::Arrow
        );
        assert_eq!(format(&format!("{arrow};q=0.2, */*;q=0.8")), Format::Json);
        assert_eq!(format(&format!("text/html, {arrow};Q=0.9")), Format::Arrow);
        assert_eq!(format("*/*"), Format::Json);
        assert_eq!(format(&format!("{arrow};q=junk")), Format::Json);
        assert_eq!(Format::of(&HeaderMap::new()), Format::Json);
    }

    fn items() -> Vec<OutItem<'static>> {
        vec![
            OutItem {
                uid: "a\"1",
                instance_id: "q",
                messages: Some(r#"[{"role":"user","content":"hi \u00e9"}]"#),
                reward: 0.5,
                raw_reward: 1.0,
                extra_info: Some(r#"{"k":[1,2]}"#),
            },
            OutItem {
                uid: "b",
                instance_id: "q",
                messages: None,
                reward: f64::NAN,
                raw_reward: -2.0,
                extra_info: None,
            },
        ]
    }

    /// The JSON array is what serializing the items as values gives: texts inserted as
    /// they are, strings escaped, a missing text and a non-finite number as null.
    #[test]
    fn json_items_are_valid_json_with_the_texts_in_place() {
        let Ok(Items::Json(bytes)) = Items::encode(Format::Json, &items()) else {
            panic!("a JSON answer");
        };
        let got: Value = serde_json::from_slice(&bytes).expect("valid JSON");
        let want = serde_json::json!([
            {"uid": "a\"1", "instance_id": "q",
             "messages": [{"role": "user", "content": "hi é"}],
             "reward": 0.5, "raw_reward": 1.0, "extra_info": {"k": [1, 2]}},
            {"uid": "b", "instance_id": "q", "messages": null,
             "reward": null, "raw_reward": -2.0, "extra_info": null},
        ]);
        assert_eq!(got, want);
        let Ok(Items::Json(empty)) = Items::empty(Format::Json) else {
            panic!("a JSON answer");
        };
        assert_eq!(empty, b"[]");
    }

    /// The envelope is slime's, and an Arrow answer carries the same items and metadata.
    #[test]
    fn envelopes_of_both_formats() {
        let mut meta = Map::new();
        meta.insert("finished_groups".into(), serde_json::json!(["q"]));
        for format in [Format::Json, Format::Arrow] {
            let encoded = Items::encode(format, &items()).expect("items");
            let response = respond(true, "read 2 items", encoded, meta.clone()).expect("answer");
            let media = response.headers()[header::CONTENT_TYPE].clone();
            let body = futures_body(response);
            match format {
                Format::Json => {
                    assert_eq!(media, "application/json");
                    let v: Value = serde_json::from_slice(&body).expect("JSON");
                    assert_eq!(v["success"], true);
                    assert_eq!(v["message"], "read 2 items");
                    assert_eq!(v["data"]["data"][1]["uid"], "b");
                    assert_eq!(v["data"]["meta_info"]["finished_groups"][0], "q");
                }
                Format::Arrow => {
                    assert_eq!(media, ARROW_STREAM);
                    let reader = arrow_ipc::reader::StreamReader::try_new(&body[..], None)
                        .expect("an IPC stream");
                    let schema = reader.schema();
                    assert_eq!(schema.metadata()["success"], "true");
                    assert_eq!(schema.metadata()["message"], "read 2 items");
                    let meta: Value =
                        serde_json::from_str(&schema.metadata()["meta_info"]).expect("JSON");
                    assert_eq!(meta["finished_groups"][0], "q");
                    let batches: Vec<RecordBatch> =
                        reader.collect::<Result<_, _>>().expect("batches");
                    assert_eq!(batches.len(), 1);
                    let b = &batches[0];
                    assert_eq!(b.num_rows(), 2);
                    let uid = b
                        .column_by_name("uid")
                        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                        .expect("uid");
                    assert_eq!(uid.value(0), "a\"1");
                    let messages = b
                        .column_by_name("messages")
                        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                        .expect("messages");
                    assert_eq!(messages.value(0), items()[0].messages.unwrap_or_default());
                    assert!(arrow_array::Array::is_null(messages, 1));
                }
            }
        }
    }

    fn futures_body(response: Response) -> Vec<u8> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime
            .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
            .expect("body")
            .to_vec()
    }

    /// An Arrow answer is written into the buffer reserved for it, never grown (which
    /// would copy it): with long texts, nulls and metadata.
    #[test]
    fn the_ipc_stream_fits_the_buffer_reserved_for_it() {
        let chat = format!("[\"{}\"]", "x".repeat(4000));
        let uids: Vec<String> = (0..300).map(|n| format!("u{n}")).collect();
        let items: Vec<OutItem<'_>> = uids
            .iter()
            .enumerate()
            .map(|(n, uid)| OutItem {
                uid,
                instance_id: "group",
                messages: (n % 7 != 0).then_some(chat.as_str()),
                reward: n as f64,
                raw_reward: 1.0,
                extra_info: (n % 3 == 0).then_some("{}"),
            })
            .collect();
        for items in [&items[..], &items[..1], &[]] {
            let Ok(Items::Arrow(batch)) = Items::encode(Format::Arrow, items) else {
                panic!("an Arrow answer");
            };
            let metadata = HashMap::from([("meta_info".to_owned(), "{}".repeat(500))]);
            let schema = batch.schema().as_ref().clone().with_metadata(metadata);
            let batch = batch.with_schema(Arc::new(schema)).expect("same columns");
            let reserved = ipc_size(&batch);
            let body = ipc_stream(&batch).expect("a stream");
            assert!(body.len() <= reserved, "{} > {reserved}", body.len());
            assert_eq!(body.capacity(), reserved, "the buffer was grown");
            let back = arrow_ipc::reader::StreamReader::try_new(&body[..], None)
                .expect("a stream")
                .collect::<Result<Vec<_>, _>>()
                .expect("batches");
            assert_eq!(back[0].num_rows(), items.len());
        }
    }
}
