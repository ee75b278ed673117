//! `/buffer/write_batch` bodies as an Arrow IPC stream (`Content-Type:
//! application/vnd.apache.arrow.stream`): one row per slime item, columns `uid`,
//! `instance_id` (string or integer), `messages` (the message list as JSON text), `reward`
//! (any numeric type) and, optionally, `extra_info` (an object as JSON text). A generator
//! holding its items as a pyarrow table sends them with no per-item JSON object.

use crate::api_error::ApiError;
use crate::slime::ItemText;
use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_schema::DataType;
use axum::body::Bytes;
use rollout_buffer::rollout::RolloutRecord;

/// The media type of an Arrow IPC stream.
pub const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

thread_local! {
    /// Set while this thread runs the IPC decoder under `catch_unwind` (see [`records`]).
    static DECODING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes a panic of the IPC decoder on a malformed body, which [`records`] catches and
/// answers as a 400, a `debug` event rather than the default hook's message and backtrace
/// on stderr; every other panic still goes to the hook that was set before. Idempotent.
pub fn quiet_decoder_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if DECODING.with(std::cell::Cell::get) {
                tracing::debug!(panic = %info, "the Arrow IPC decoder panicked on a malformed body");
            } else {
                previous(info);
            }
        }));
    });
}

/// The records of every row of the stream in `body`; a 400 naming the column (and row)
/// at the first problem, so nothing of a bad body is stored.
///
/// The batches are decoded in place over the request's body (a reader over `&[u8]` would
/// copy each batch's buffers into fresh zeroed ones first): each text is then copied once,
/// into its record.
pub fn records(body: &Bytes, environment: &str) -> Result<Vec<RolloutRecord>, ApiError> {
    if body.starts_with(b"ARROW1") {
        return Err(ApiError::bad(
            "an Arrow IPC file, not a stream: send the stream format (pyarrow.ipc.new_stream, \
             not new_file)",
        ));
    }
    let mut decoder = StreamDecoder::new();
    let mut rest = Buffer::from(body.clone());
    let bad = |decoder: &StreamDecoder, e: arrow_schema::ArrowError| match decoder.schema() {
        None => ApiError::bad(format!("not an Arrow IPC stream: {e}")),
        Some(_) => ApiError::bad(format!("bad Arrow IPC batch: {e}")),
    };
    let mut out = Vec::new();
    // The IPC decoder is not panic-free on every malformed message (a buffer whose offset
    // and length run past the body slices out of bounds): a bad body must be a 400, not a
    // dropped connection.
    DECODING.with(|d| d.set(true));
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        while !rest.is_empty() {
            match decoder.decode(&mut rest) {
                Ok(Some(batch)) => batch_records(&batch, environment, out.len(), &mut out)?,
                Ok(None) => {}
                Err(e) => return Err(bad(&decoder, e)),
            }
        }
        decoder.finish().map_err(|e| bad(&decoder, e))
    }));
    DECODING.with(|d| d.set(false));
    decoded.unwrap_or_else(|_| Err(ApiError::bad("bad Arrow IPC stream: a malformed message")))?;
    if decoder.schema().is_none() {
        return Err(ApiError::bad(
            "not an Arrow IPC stream: the body holds no schema",
        ));
    }
    Ok(out)
}

fn batch_records(
    batch: &RecordBatch,
    environment: &str,
    first_row: usize,
    out: &mut Vec<RolloutRecord>,
) -> Result<(), ApiError> {
    let uid = text_column(batch, "uid", true)?;
    let instance_id = text_column(batch, "instance_id", true)?;
    let messages = text_column(batch, "messages", false)?;
    let extra_info = match batch.column_by_name("extra_info") {
        Some(_) => Some(text_column(batch, "extra_info", false)?),
        None => None,
    };
    let reward = required(batch, "reward")?;
    if !reward.data_type().is_numeric() {
        return Err(ApiError::bad(format!(
            "column `reward` must be numeric, not {}",
            reward.data_type()
        )));
    }
    let reward = arrow_cast::cast(reward, &DataType::Float64)
        .map_err(|e| ApiError::bad(format!("column `reward`: {e}")))?;
    let reward = reward.as_primitive::<Float64Type>();
    out.reserve(batch.num_rows());
    for row in 0..batch.num_rows() {
        let at = first_row + row;
        if reward.is_null(row) {
            return Err(ApiError::bad(format!("row {at}: `reward` is null")));
        }
        let extra = match &extra_info {
            Some(column) if !column.is_null(row) => Some(column.value(row)),
            _ => None,
        };
        let chat = cell(&messages, row, at, "messages")?;
        serde_json::from_str::<&serde_json::value::RawValue>(chat)
            .map_err(|e| ApiError::bad(format!("row {at}: `messages` is not JSON text: {e}")))?;
        let item = ItemText {
            uid: cell(&uid, row, at, "uid")?.to_owned(),
            instance_id: cell(&instance_id, row, at, "instance_id")?.to_owned(),
            messages: chat.trim(),
            reward: reward.value(row),
            extra_info: extra,
        };
        out.push(
            item.into_record(environment)
                .map_err(|e| e.at(format_args!("row {at}")))?,
        );
    }
    Ok(())
}

/// Row `row`'s text (row `at` of the stream), or a 400 if it is null.
fn cell<'a>(
    column: &'a StringArray,
    row: usize,
    at: usize,
    name: &str,
) -> Result<&'a str, ApiError> {
    if column.is_null(row) {
        return Err(ApiError::bad(format!("row {at}: `{name}` is null")));
    }
    Ok(column.value(row))
}

fn required<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, ApiError> {
    batch
        .column_by_name(name)
        .ok_or_else(|| ApiError::bad(format!("the Arrow stream has no column `{name}`")))
}

/// Column `name` as strings: string columns as they are, and, where `integers` (ids),
/// integers as their digits.
fn text_column(batch: &RecordBatch, name: &str, integers: bool) -> Result<StringArray, ApiError> {
    let column = required(batch, name)?;
    let taken = matches!(
        column.data_type(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    ) || (integers && column.data_type().is_integer());
    if !taken {
        let kind = if integers {
            "a string (or integer) column"
        } else {
            "a string column (JSON text)"
        };
        return Err(ApiError::bad(format!(
            "column `{name}` must be {kind}, not {}",
            column.data_type()
        )));
    }
    let text = arrow_cast::cast(column, &DataType::Utf8)
        .map_err(|e| ApiError::bad(format!("column `{name}`: {e}")))?;
    Ok(text.as_string::<i32>().clone())
}
