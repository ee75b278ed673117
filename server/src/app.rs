//! The HTTP application: state, routes and handlers.
//!
//! Writes go through the buffer's `GroupIngest` (durable per the store's durability before
//! the answer); reads take one at a time (`reads`), as slime's buffer lock does. The ingest
//! is swapped whole when `/start_rollout` changes the group settings; its pending rollouts
//! are in the buffer's log, and the new ingest adds them back, so nothing pending is lost.

use crate::answer::{self, Format, Items};
use crate::api_error::{ApiBody, ApiError, ApiJson, Object, UniqueKeys};
use crate::arrow_items;
use crate::slime::{self, Item, Settings};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use rollout_buffer::rollout::{Added, GroupIngest, MetricsTracker};
use rollout_buffer::SequenceBuffer;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Everything a handler needs.
#[derive(Debug)]
pub struct App {
    /// The buffer (groups of items).
    pub buf: SequenceBuffer,
    ingest: GroupIngest,
    settings: Mutex<Settings>,
    start_payload: Mutex<Option<Value>>,
    /// One read at a time (slime's buffer lock).
    reads: tokio::sync::Mutex<()>,
    /// Reads that wait take turns (see [`read_groups`]).
    waiting_reads: tokio::sync::Mutex<()>,
    /// True once the server is stopping: no read waits any more.
    stop: tokio::sync::watch::Sender<bool>,
    /// One `/start_rollout` at a time (held by its regrouping task, see [`start_rollout`]).
    starts: Arc<tokio::sync::Mutex<()>>,
    tracker: tokio::sync::Mutex<MetricsTracker>,
    environment: String,
    token: Option<String>,
    prometheus: PrometheusHandle,
    write_timeout: Duration,
    body_timeout: Duration,
    /// Items being added now (see [`add_all`]).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// A buffer's worth of items at the largest group size so far (the permits of
    /// `in_flight`, which only ever grow).
    max_in_flight: AtomicUsize,
    /// Items of writes waiting for their place among those being added.
    queued: AtomicUsize,
    written: AtomicU64,
    read: AtomicU64,
}

/// How the application is set up (from the command line).
#[derive(Debug, Clone)]
pub struct Options {
    /// The environment name items are stored under.
    pub environment: String,
    /// The bearer token every call needs, if any.
    pub token: Option<String>,
    /// How long a write waits for room before answering 503.
    pub write_timeout: Duration,
    /// Largest request body, bytes.
    pub body_limit: usize,
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
}

impl App {
    /// An application over `buf`, ingesting with `settings`.
    ///
    /// # Errors
    ///
    /// The ingest's start (adding back pending rollouts; the groups they complete are
    /// stored in the background, a failure logged).
    pub async fn new(
        buf: SequenceBuffer,
        settings: Settings,
        options: &Options,
        prometheus: PrometheusHandle,
    ) -> rollout_buffer::Result<Arc<Self>> {
        // The groups the pending rollouts complete (a restart with a smaller group size)
        // are stored by a task: on a full buffer they wait for room only reads make, and
        // no read comes before the server listens.
        let (ingest, _storing) =
            GroupIngest::start_background(buf.clone(), settings.group_config()).await?;
        // One buffer's worth of items may be on their way in at once.
        let max_in_flight = items_in_flight(buf.capacity(), settings.group_size);
        Ok(Arc::new(Self {
            buf,
            ingest,
            settings: Mutex::new(settings),
            start_payload: Mutex::new(None),
            reads: tokio::sync::Mutex::new(()),
            waiting_reads: tokio::sync::Mutex::new(()),
            stop: tokio::sync::watch::Sender::new(false),
            starts: Arc::new(tokio::sync::Mutex::new(())),
            tracker: tokio::sync::Mutex::new(MetricsTracker::new(options.environment.clone())),
            environment: options.environment.clone(),
            token: options.token.clone(),
            prometheus,
            write_timeout: options.write_timeout,
            body_timeout: options.body_timeout,
            in_flight: Arc::new(tokio::sync::Semaphore::new(max_in_flight)),
            max_in_flight: AtomicUsize::new(max_in_flight),
            queued: AtomicUsize::new(0),
            written: AtomicU64::new(0),
            read: AtomicU64::new(0),
        }))
    }

    fn ingest(&self) -> GroupIngest {
        self.ingest.clone()
    }

    /// Ends the reads waiting now (each answers with what it has) and keeps later ones
    /// from waiting: the server is stopping, and its graceful shutdown waits for every
    /// request in flight, which a long-poll read held for up to an hour.
    pub fn begin_stop(&self) {
        self.stop.send_replace(true);
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Resolves once [`Self::begin_stop`] was called.
    async fn stopped(&self) {
        let mut stop = self.stop.subscribe();
        // An error only means the sender is gone, with the application: stopping too.
        let _ = stop.wait_for(|&stopping| stopping).await;
    }

    fn settings(&self) -> Settings {
        *lock(&self.settings)
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::Relaxed)
    }

    /// Lets a buffer's worth of items at `group_size` be on their way in at once: a group
    /// size raised by `/start_rollout` had kept the startup one's limit, refusing a write
    /// of one whole group as too large.
    fn allow_in_flight(&self, group_size: usize) {
        let wanted = items_in_flight(self.buf.capacity(), group_size);
        let before = self.max_in_flight.fetch_max(wanted, Ordering::Relaxed);
        if wanted > before {
            self.in_flight.add_permits(wanted - before);
        }
    }
}

/// How many items may be on their way in at once: a buffer's worth (`capacity` groups of
/// `group_size`), within what a semaphore counts.
fn items_in_flight(capacity: usize, group_size: usize) -> usize {
    capacity.saturating_mul(group_size).clamp(
        1,
        tokio::sync::Semaphore::MAX_PERMITS.min(u32::MAX as usize),
    )
}

/// A poisoned lock only means a handler panicked while holding it; the value is whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The routes (slime's, plus batch writes, metrics and health), behind the token check.
pub fn router(app: Arc<App>, body_limit: usize) -> Router {
    Router::new()
        .route("/", get(health))
        .route("/buffer/write", post(write))
        .route("/buffer/write_batch", post(write_batch))
        .route("/get_rollout_data", post(get_rollout_data))
        .route("/buffer/read", post(buffer_read))
        .route("/buffer/stats", get(stats))
        .route("/start_rollout", post(start_rollout))
        .route("/metrics", get(metrics_text))
        .route("/debug/waiting", get(debug_waiting))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), auth))
        .with_state(app)
}

async fn auth(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if let Some(token) = &app.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            // The scheme is case-insensitive (RFC 9110, 11.1): `bearer` is `Bearer`.
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token);
        if given != Some(token.as_str()) {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(uri.path().to_owned())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::BadRequest {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("{} does not take {method}", uri.path()),
    }
}

async fn health() -> Json<Value> {
    Json(json!({"success": true, "message": "rollout-buffer is serving"}))
}

/// slime's `BufferResponse` envelope: `{success, message, data: {data, meta_info}}`.
#[derive(Debug, serde::Serialize)]
pub struct Envelope<T> {
    success: bool,
    message: String,
    data: EnvelopeData<T>,
}

#[derive(Debug, serde::Serialize)]
struct EnvelopeData<T> {
    data: T,
    meta_info: Value,
}

fn envelope<T>(
    success: bool,
    message: impl Into<String>,
    data: T,
    meta_info: Value,
) -> Json<Envelope<T>> {
    Json(Envelope {
        success,
        message: message.into(),
        data: EnvelopeData { data, meta_info },
    })
}

fn outcome(added: &Added) -> &'static str {
    match added {
        Added::Pending { .. } => "pending",
        Added::Sealed(_) => "sealed",
        Added::Duplicate => "duplicate",
        Added::UidTaken { .. } => "uid_taken",
        Added::VersionRejected => "version_rejected",
        Added::ReplicaCapped => "replica_capped",
        Added::DuplicateGroup { .. } => "duplicate_group",
        _ => "other",
    }
}

impl crate::api_error::BodyTimeout for Arc<App> {
    fn body_timeout(&self) -> Duration {
        self.body_timeout
    }
}

/// A 503 at once when a buffer's worth of items already waits to get on its way in (see
/// [`add_all`]): a write now would only wait behind them. Checked before a body is parsed
/// too, so that an overloaded server does not spend its CPU decoding bodies it then
/// refuses.
fn refuse_if_busy(app: &App) -> Result<(), ApiError> {
    if app.queued.load(Ordering::Relaxed) >= app.max_in_flight() {
        return Err(ApiError::Busy { retry_after: 1 });
    }
    Ok(())
}

/// Takes back the items a write queued when its wait ends, however it ends.
struct Queued<'a>(&'a AtomicUsize, usize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// Adds records, waiting at most the write timeout (in all) for a place among the items
/// on their way in and then for room.
///
/// At most one buffer's worth of items (`--capacity` x group size) is being added at any
/// time, and at most as many more wait their turn (in arrival order): a write beyond that
/// answers 503 at once, so what writes hold stays bounded however many clients write.
/// The adds run in a task of their own: an add that seals a group must not be cancelled
/// halfway (the group would leave the ingest's memory and wait in the log for the next
/// start), so a write that times out answers 503 while its adds go on and land once a read
/// makes room; the client's retry is then a duplicate, answered 200.
async fn add_all(
    app: &App,
    records: Vec<rollout_buffer::rollout::RolloutRecord>,
) -> Result<Vec<Value>, ApiError> {
    let n = records.len();
    let most = app.max_in_flight();
    let Some(permits) = u32::try_from(n).ok().filter(|_| n <= most) else {
        return Err(ApiError::bad(format!(
            "{n} items in one write; this server takes at most {most} at once"
        )));
    };
    let deadline = tokio::time::Instant::now() + app.write_timeout;
    let permit = {
        let queued = app.queued.fetch_add(n, Ordering::Relaxed);
        let _queued = Queued(&app.queued, n);
        if queued >= most {
            return Err(ApiError::Busy { retry_after: 1 });
        }
        let acquire = Arc::clone(&app.in_flight).acquire_many_owned(permits);
        match tokio::time::timeout_at(deadline, acquire).await {
            Ok(Ok(permit)) => permit,
            _ => return Err(ApiError::Busy { retry_after: 1 }),
        }
    };
    let uids: Vec<String> = records.iter().map(|r| r.rollout_uid.clone()).collect();
    let ingest = app.ingest();
    let task = tokio::spawn(async move {
        let answers = ingest.add_many(records).await;
        drop(permit);
        answers
    });
    let answers = match tokio::time::timeout_at(deadline, task).await {
        Err(_) => return Err(ApiError::Busy { retry_after: 1 }),
        Ok(Err(joined)) => return Err(ApiError::Internal(format!("the write failed: {joined}"))),
        Ok(Ok(answers)) => answers,
    };
    let mut out = Vec::with_capacity(n);
    for (uid, added) in uids.into_iter().zip(answers) {
        let added = added?;
        out.push(json!({"uid": uid, "outcome": outcome(&added)}));
    }
    app.written.fetch_add(n as u64, Ordering::Relaxed);
    metrics::counter!("rollout_buffer_http_items_written_total").increment(n as u64);
    Ok(out)
}

async fn write(
    State(app): State<Arc<App>>,
    body: ApiBody,
) -> Result<Json<Envelope<Vec<Value>>>, ApiError> {
    refuse_if_busy(&app)?;
    let record = body
        .json::<Object<Item>>()?
        .0
        .into_record(&app.environment)?;
    let out = add_all(&app, vec![record]).await?;
    Ok(envelope(
        true,
        "write to buffer",
        out,
        json!("write to buffer"),
    ))
}

/// Many items in one call, as a JSON array or an Arrow IPC stream (by `Content-Type`):
/// all are checked before any is stored.
async fn write_batch(
    State(app): State<Arc<App>>,
    body: ApiBody,
) -> Result<Json<Envelope<Vec<Value>>>, ApiError> {
    refuse_if_busy(&app)?;
    let records = if body.is(arrow_items::ARROW_STREAM) {
        arrow_items::records(&body.body, &app.environment)?
    } else if !body.is_json() {
        return Err(ApiError::BadRequest {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: format!(
                "the body must be JSON (Content-Type: application/json) or an Arrow IPC \
                 stream (Content-Type: {})",
                arrow_items::ARROW_STREAM
            ),
        });
    } else {
        body.json::<Vec<Object<Item>>>()?
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                (item.0)
                    .into_record(&app.environment)
                    .map_err(|e| e.at(format_args!("[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    let n = records.len();
    let out = add_all(&app, records).await?;
    Ok(envelope(
        true,
        format!("wrote {n} items"),
        out,
        json!("write to buffer"),
    ))
}

/// A JSON object body that may be empty (slime's consumer posts `{}` or nothing).
fn lenient<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    crate::api_error::from_json::<Object<T>>(body).map(|o| o.0)
}

#[derive(Debug, Deserialize)]
struct ReadRequest {
    #[serde(default = "all")]
    batch_size: i64,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    wait: Option<bool>,
}

fn all() -> i64 {
    -1
}

/// An empty body is `{}`: all ready groups (a derived default had `batch_size` 0, refused).
impl Default for ReadRequest {
    fn default() -> Self {
        Self {
            batch_size: all(),
            timeout: None,
            wait: None,
        }
    }
}

async fn get_rollout_data(
    State(app): State<Arc<App>>,
    ApiBody { headers, body }: ApiBody,
) -> Result<Response, ApiError> {
    let req: ReadRequest = lenient(&body)?;
    read_groups(&app, req.batch_size, None, Format::of(&headers)).await
}

async fn buffer_read(
    State(app): State<Arc<App>>,
    ApiBody { headers, body }: ApiBody,
) -> Result<Response, ApiError> {
    let req: ReadRequest = lenient(&body)?;
    let wait = match (req.wait.unwrap_or(true), req.timeout) {
        (false, _) => None,
        (true, Some(t)) if t.is_finite() && t >= 0.0 => {
            Some(Duration::from_secs_f64(t.min(3600.0)))
        }
        (true, Some(t)) => return Err(ApiError::bad(format!("`timeout` must be >= 0, not {t}"))),
        (true, None) => Some(Duration::from_secs(10)),
    };
    read_groups(&app, req.batch_size, wait, Format::of(&headers)).await
}

/// Takes groups for an answer (see [`slime::take`]); with `wait`, waits up to it for a new
/// group while the answer falls short.
///
/// Reads that wait take turns, each until it answers or its own deadline passes: a read
/// falling short holds the groups it has while it waits for more, and two of them holding
/// a share each waited out their timeouts short of their batches with enough groups
/// between them. Reads that do not wait never queue behind one that does.
async fn read_groups(
    app: &App,
    batch_size: i64,
    wait: Option<Duration>,
    format: Format,
) -> Result<Response, ApiError> {
    if batch_size == 0 || batch_size < -1 {
        return Err(ApiError::bad(format!(
            "`batch_size` must be -1 (all) or > 0, not {batch_size}"
        )));
    }
    // More than the buffer ever holds: the read would hold every ready group, hiding them
    // from every other reader, until its timeout (up to an hour), then answer nothing.
    let most = app.buf.capacity().saturating_mul(app.settings().group_size);
    if usize::try_from(batch_size).is_ok_and(|n| n > most) {
        return Err(ApiError::bad(format!(
            "`batch_size` {batch_size} is more than this server ever holds: {most} items \
             (--capacity groups of the group size)"
        )));
    }
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    // Past its deadline in the queue (or once the server is stopping), a read makes one
    // take that does not wait.
    let _turn = match deadline {
        Some(d) => tokio::select! {
            turn = tokio::time::timeout_at(d, app.waiting_reads.lock()) => turn.ok(),
            () = app.stopped() => None,
        },
        None => None,
    };
    loop {
        let one_read = app.reads.lock().await;
        let taken = slime::take(&app.buf, &app.settings(), batch_size, format).await?;
        if !taken.held_back.is_empty() || taken.count == 0 {
            let left = deadline
                .filter(|_| !app.stopping())
                .map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            if let Some(left) = left.filter(|l| !l.is_zero()) {
                // Wait for one group more, holding the ones in hand so the wait cannot
                // return one of them (given back first, each pass would take it again at
                // once: a busy loop logging a redelivery each time). Other reads go on
                // meanwhile. The next pass takes the new group with the rest.
                drop(one_read);
                let more = tokio::select! {
                    more = app.buf.get_batch_for_rpc_timeout(slime::TRAIN_RPC, left) => Some(more),
                    () = app.stopped() => None,
                };
                drop(taken.held_back);
                match more {
                    Some(Ok(batch)) => {
                        drop(batch);
                        continue;
                    }
                    Some(Err(rollout_buffer::Error::Timeout { .. })) | None => {}
                    Some(Err(e)) => return Err(e.into()),
                }
            }
            let message = if batch_size > 0 {
                format!("Not enough data: fewer than {batch_size} valid items ready")
            } else {
                "No data available".to_owned()
            };
            return answer::respond(false, &message, Items::empty(format)?, taken.meta_info);
        }
        let n = taken.count;
        // All at once: with `Sync` durability their log records share writes.
        let commits: Vec<_> = taken
            .answered
            .into_iter()
            .map(|lease| tokio::spawn(lease.commit()))
            .collect();
        for commit in commits {
            commit
                .await
                .map_err(|e| ApiError::Internal(format!("a commit failed: {e}")))??;
        }
        app.read.fetch_add(n as u64, Ordering::Relaxed);
        metrics::counter!("rollout_buffer_http_items_read_total").increment(n as u64);
        return answer::respond(
            true,
            &format!("read {n} items"),
            taken.items,
            taken.meta_info,
        );
    }
}

async fn stats(State(app): State<Arc<App>>) -> Json<Envelope<Value>> {
    let s = app.buf.stats();
    let read = app.read.load(Ordering::Relaxed);
    // Items held, as slime's buffer holds items: the members of the groups stored (also
    // those recovered at start), the items waiting for their group, and those of completed
    // groups on their way in (waiting for room, say).
    let in_groups: usize = app
        .buf
        .contents()
        .iter()
        .filter_map(|g| {
            g.sample
                .get("rollout_uid")
                .and_then(|t| t.array::<String>())
        })
        .map(|uids| uids.len())
        .sum();
    let ingest = app.ingest();
    let pending = ingest.assembler_counters().pending_rollouts + ingest.storing_rollouts();
    let data = json!({
        "current_size": in_groups as u64 + pending,
        "max_size": s.capacity.saturating_mul(app.settings().group_size),
        "total_written": app.written.load(Ordering::Relaxed),
        "total_read": read,
        "groups_ready": s.rpcs.iter().map(|r| r.eligible).sum::<usize>(),
        "groups_leased": s.live_leases,
        "slots_free": s.empty,
        "items_adding": app.max_in_flight() - app.in_flight.available_permits().min(app.max_in_flight()),
        "items_queued": app.queued.load(Ordering::Relaxed),
    });
    envelope(true, "buffer stats", data, json!("buffer stats"))
}

/// `/start_rollout`: new group settings, for the groups pending too.
///
/// The settings change first, then the ingest regroups what is pending, in a task of its
/// own holding the one-start lock: the groups that completes wait for room like a write's,
/// and this answers 503 after `--write-timeout` while they go on and land once a read
/// makes room (a retry waits its turn, then finds the settings in place). Awaited inline,
/// a client giving up cancelled it halfway: the groups it had taken out of the ingest were
/// neither stored nor pending until a restart (resends of their items answered
/// `duplicate`), and the old settings stayed for reads while the ingest grouped by the new
/// ones (a new group padded to the old size served items twice).
async fn start_rollout(
    State(app): State<Arc<App>>,
    ApiJson(UniqueKeys(payload)): ApiJson<UniqueKeys>,
) -> Result<Json<Value>, ApiError> {
    let deadline = tokio::time::Instant::now() + app.write_timeout;
    let one_start = tokio::time::timeout_at(deadline, Arc::clone(&app.starts).lock_owned())
        .await
        .map_err(|_| ApiError::Busy { retry_after: 1 })?;
    let before = app.settings();
    let mut next = before;
    next.apply(&payload)?;
    if next != before {
        *lock(&app.settings) = next;
        app.allow_in_flight(next.group_size);
        let task_app = Arc::clone(&app);
        let regroup = tokio::spawn(async move {
            let _one_start = one_start;
            let done = task_app.ingest().reconfigure(next.group_config()).await;
            match &done {
                // Refused with nothing changed: the old settings hold.
                Err(rollout_buffer::Error::InvalidConfig { .. }) => {
                    *lock(&task_app.settings) = before;
                }
                // Logged here too: the call may have answered 503 before this.
                Err(e) => {
                    tracing::error!(error = %e, "storing the groups /start_rollout regrouped failed")
                }
                Ok(_) => {}
            }
            done
        });
        match tokio::time::timeout_at(deadline, regroup).await {
            Err(_) => return Err(ApiError::Busy { retry_after: 1 }),
            Ok(Err(joined)) => {
                return Err(ApiError::Internal(format!(
                    "the regrouping failed: {joined}"
                )))
            }
            Ok(Ok(done)) => {
                done?;
            }
        }
    }
    *lock(&app.start_payload) = Some(Value::Object(payload));
    tracing::info!(?next, "start_rollout");
    Ok(Json(json!({"success": true, "message": "Rollout started"})))
}

async fn metrics_text(State(app): State<Arc<App>>) -> impl IntoResponse {
    crate::metrics::publish(&app.buf, &app.ingest(), &mut *app.tracker.lock().await);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.prometheus.render(),
    )
}

/// Per RPC, why a read would wait: how many groups are eligible, leased, used up, stale,
/// discarded, mid-amend, or lack which key (see [`SequenceBuffer::waiting_report`]).
async fn debug_waiting(State(app): State<Arc<App>>) -> Json<Value> {
    let rpcs: Vec<Value> = app
        .buf
        .waiting_report()
        .into_iter()
        .map(|w| {
            let missing: Map<String, Value> =
                w.missing.into_iter().map(|(k, n)| (k, json!(n))).collect();
            json!({
                "rpc": &*w.name,
                "batch_size": w.batch_size,
                "getters_waiting": w.waiting,
                "eligible": w.eligible,
                "leased": w.leased,
                "used_up": w.used_up,
                "stale": w.stale,
                "dropped_stale": w.dropped_stale,
                "discarded": w.discarded,
                "amending": w.amending,
                "incomplete": w.incomplete,
                "missing": missing,
                "rate_limited": w.rate_limited,
            })
        })
        .collect();
    let s = app.buf.stats();
    let ingest = app.ingest();
    let pending = ingest.assembler_counters();
    Json(json!({
        "rpcs": rpcs,
        "slots_free": s.empty,
        "putters_waiting": s.waiting_putters,
        "pending_groups": pending.pending_groups,
        "pending_rollouts": pending.pending_rollouts,
        "storing_rollouts": ingest.storing_rollouts(),
        "dropped_groups": pending.dropped_groups,
        "dropped_rollouts": pending.dropped_rollouts,
    }))
}
