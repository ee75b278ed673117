//! Errors as HTTP answers: every failure is a status and a JSON body
//! `{"success": false, "message": ..., "error": kind}` naming what was wrong, and the
//! `Json` extractor's rejections (bad JSON, a missing key, an oversized body) become the
//! same.

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::{Deserialize, DeserializeOwned};
use serde_json::{json, Map, Value};

/// A failed request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or names something invalid (400, or the rejection's own
    /// status: 413 for a body over the limit, 415 for another content type).
    #[error("{message}")]
    BadRequest {
        /// The status to answer with.
        status: StatusCode,
        /// What was wrong, and where.
        message: String,
    },
    /// No or a wrong bearer token (401).
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// No such route (404).
    #[error("no route {0}")]
    NotFound(String),
    /// The buffer is full: try again after `retry_after` seconds (503).
    #[error("the buffer is full; retry after {retry_after} s")]
    Busy {
        /// Seconds to wait.
        retry_after: u64,
    },
    /// The buffer failed (storage, closed): 500.
    #[error(transparent)]
    Buffer(#[from] rollout_buffer::Error),
    /// The server failed on its own side (encoding an answer): 500.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// A 400 naming the problem.
    pub fn bad(message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// The same error, its message starting with where in the request it is (`[3]`, the
    /// fourth item of a JSON batch; `row 3` of an Arrow stream): an empty or repeated uid
    /// names no item.
    pub fn at(self, place: impl std::fmt::Display) -> Self {
        match self {
            ApiError::BadRequest { status, message } => ApiError::BadRequest {
                status,
                message: format!("{place}: {message}"),
            },
            other => other,
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { status, .. } => *status,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Buffer(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotFound(_) => "not_found",
            ApiError::Busy { .. } => "busy",
            ApiError::Buffer(_) => "buffer",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() && !matches!(self, ApiError::Busy { .. }) {
            tracing::warn!(error = %self, "request failed");
        }
        let body = json!({"success": false, "message": self.to_string(), "error": self.kind()});
        let mut response = (status, axum::Json(body)).into_response();
        match &self {
            ApiError::Busy { retry_after } => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
            }
            ApiError::Unauthorized => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

/// `axum::Json` whose rejections answer as [`ApiError`]s.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: BodyTimeout + Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let timeout = state.body_timeout();
        match tokio::time::timeout(timeout, axum::Json::<T>::from_request(req, state)).await {
            Err(_) => Err(body_timed_out(timeout)),
            Ok(Ok(axum::Json(v))) => Ok(ApiJson(v)),
            Ok(Err(rejection)) => Err(rejected(rejection)),
        }
    }
}

/// A 408: the body did not arrive within `timeout`.
fn body_timed_out(timeout: std::time::Duration) -> ApiError {
    ApiError::BadRequest {
        status: StatusCode::REQUEST_TIMEOUT,
        message: format!(
            "the body did not arrive within {} s (--body-timeout)",
            timeout.as_secs_f64()
        ),
    }
}

fn rejected(rejection: JsonRejection) -> ApiError {
    let status = rejection.status();
    let message = match &rejection {
        JsonRejection::JsonDataError(e) => format!("invalid request: {}", e.body_text()),
        JsonRejection::JsonSyntaxError(e) => format!("malformed JSON: {}", e.body_text()),
        JsonRejection::MissingJsonContentType(_) => {
            "the body must be JSON (Content-Type: application/json)".to_owned()
        }
        other if status == StatusCode::PAYLOAD_TOO_LARGE => {
            format!(
                "the body is over the size limit (--body-limit): {}",
                other.body_text()
            )
        }
        other => other.body_text(),
    };
    ApiError::BadRequest { status, message }
}

/// A request's body and headers, with a body over the limit answered as an [`ApiError`]
/// (413). Handlers parse it themselves, borrowing from it (see [`parse_json`]).
#[derive(Debug)]
pub struct ApiBody {
    /// The request's headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

/// The state that says how long a body may take to arrive.
pub trait BodyTimeout {
    /// How long a request's body may take to arrive once its head has.
    fn body_timeout(&self) -> std::time::Duration;
}

impl<S: BodyTimeout + Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let headers = req.headers().clone();
        let timeout = state.body_timeout();
        let body = tokio::time::timeout(timeout, Bytes::from_request(req, state))
            .await
            .map_err(|_| body_timed_out(timeout))?
            .map_err(|e| ApiError::BadRequest {
                status: e.status(),
                message: if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    format!(
                        "the body is over the size limit (--body-limit): {}",
                        e.body_text()
                    )
                } else {
                    format!("cannot read the body: {}", e.body_text())
                },
            })?;
        Ok(ApiBody { headers, body })
    }
}

impl ApiBody {
    /// Whether the body is declared as `media_type` (parameters aside; media types are
    /// case-insensitive).
    pub fn is(&self, media_type: &str) -> bool {
        self.media_type()
            .is_some_and(|m| m.eq_ignore_ascii_case(media_type))
    }

    fn media_type(&self) -> Option<&str> {
        let value = self.headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
        value.split(';').next().map(str::trim)
    }

    /// Whether the body is declared as JSON (`application/json`, or any `+json` type).
    pub fn is_json(&self) -> bool {
        self.media_type().is_some_and(|m| {
            let m = m.to_ascii_lowercase();
            m == "application/json" || m.ends_with("+json")
        })
    }

    /// The body as JSON, as axum's `Json` takes it (a JSON content type, else 415; bad
    /// syntax 400; the wrong shape 422 naming the path), with strings borrowed from the
    /// body where `T` borrows them.
    pub fn json<'a, T: Deserialize<'a>>(&'a self) -> Result<T, ApiError> {
        if !self.is_json() {
            return Err(ApiError::BadRequest {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                message: "the body must be JSON (Content-Type: application/json)".to_owned(),
            });
        }
        from_json(&self.body)
    }
}

/// Why a `\\uD800`-style escape fails: JSON allows it, but a lone UTF-16 surrogate is no
/// Unicode character, so no string can hold it (serde's own message speaks of hex escapes).
fn surrogate_hint(e: &serde_json::Error) -> &'static str {
    let text = e.to_string();
    if text.contains("surrogate") || text.contains("hex escape") {
        " (a string holds a lone UTF-16 surrogate escape, which is not a Unicode character)"
    } else {
        ""
    }
}

/// `T` from a JSON object only: serde's derived structs also take an array of their fields
/// in order, so `["u1", "q", [], 0.5, {}]` was stored as an item and `[]` read as `{}`.
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Fields<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Fields(std::marker::PhantomData))
            .map(Object)
    }
}

/// A JSON object whose keys are all different: a payload naming a setting twice is refused
/// (a 422 naming the key), as an item naming a field twice is, where a plain map kept the
/// last value without a word.
#[derive(Debug)]
pub struct UniqueKeys(pub Map<String, Value>);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = Map<String, Value>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Map::new();
                while let Some((key, value)) = map.next_entry::<String, Value>()? {
                    if out.contains_key(&key) {
                        return Err(serde::de::Error::custom(format_args!(
                            "duplicate field `{key}`"
                        )));
                    }
                    out.insert(key, value);
                }
                Ok(out)
            }
        }
        d.deserialize_map(Keys).map(UniqueKeys)
    }
}

/// `bytes` as JSON of a `T`: a 400 for malformed JSON, a 422 naming the field (its path)
/// for well-formed JSON of the wrong shape.
pub fn from_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let syntax = !e.inner().is_data();
        ApiError::BadRequest {
            status: if syntax {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            },
            message: if syntax {
                let path = e.path().to_string();
                // `.` is the top level and `?` a place serde could not name (the body
                // ended inside a value, say): neither says more than the message.
                let place = if path == "." || path == "?" {
                    String::new()
                } else {
                    format!(" in `{path}`")
                };
                format!(
                    "malformed JSON{place}: {}{}",
                    e.inner(),
                    surrogate_hint(e.inner())
                )
            } else {
                format!("invalid request: {e}")
            },
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad(format!("malformed JSON: {e}")))?;
    Ok(value)
}
