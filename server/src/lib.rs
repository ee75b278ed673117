//! The `rollout-buffer` command line as a library: [`run`] parses the arguments and runs
//! `serve` (slime's rollout-buffer API over HTTP on a durable buffer), `inspect` or
//! `repair`, printing what a command line prints. The binary calls it, and so does the
//! Python wheel's `rollout-buffer` console script, which runs the same code in the Python
//! process.
//!
//! ```sh
//! rollout-buffer serve --store ./run --listen 127.0.0.1:8889 --group-size 8
//! rollout-buffer inspect ./run --tail 5
//! rollout-buffer repair ./run
//! ```
//!
//! The server prints `listening on http://ADDR` once it accepts connections (with
//! `--listen 127.0.0.1:0` the port is the one the system chose). SIGTERM or Ctrl-C stops
//! accepting, lets calls in flight finish, flushes the buffer and exits 0.

mod answer;
mod api_error;
mod app;
mod arrow_items;
mod inspect;
mod listen;
mod metrics;
mod nesting;
mod repair;
mod slime;

use clap::{Parser, Subcommand};
use rollout_buffer::persist::{ArchiveOptions, Durability, PersistOptions};
use rollout_buffer::SequenceBuffer;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "rollout-buffer", version, about = "rollout-buffer over HTTP")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serves slime's rollout-buffer API, metrics and health on a store.
    Serve(Serve),
    /// Summarises a stored run (read-only; safe while the run goes on).
    Inspect(Inspect),
    /// Salvages a stored run that will not open: keeps everything before the damage, moves
    /// the damaged files aside (never deletes) and reports what was lost. Stop the run first.
    Repair(Repair),
}

#[derive(Debug, clap::Args)]
struct Repair {
    /// The store: a directory, file://, s3://, gs://, az://.
    url: String,
    /// Print JSON for machines instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct Inspect {
    /// The store: a directory, file://, s3://, gs://, az://.
    url: String,
    /// Also print the latest N archived rows.
    #[arg(long, default_value_t = 0)]
    tail: usize,
    /// Print JSON for machines instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct Serve {
    /// Where the buffer lives: a directory, file://, s3://, gs://, az:// or memory://.
    #[arg(long)]
    store: String,
    /// Address to listen on (loopback by default; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8889")]
    listen: SocketAddr,
    /// Items per group (slime's `num_repeat_per_sample`; `/start_rollout` may change it).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Seconds without a new item after which a group seals short.
    #[arg(long, default_value_t = 300.0)]
    group_timeout: f64,
    /// Groups the buffer holds; writes past it wait `--write-timeout`, then get 503.
    #[arg(long, default_value_t = 4096)]
    capacity: usize,
    /// `sync` (a write is on storage when answered), `interval:<ms>` or `none`.
    #[arg(long, default_value = "sync")]
    durability: Durability,
    /// MiB of log written before a checkpoint folds it into segments (it also waits until
    /// the log outgrows the last checkpoint). Larger: less checkpoint work per item
    /// written, more log to replay after a crash and more disk; memory does not grow with
    /// it (recovery reads the log one group at a time). 256 rather than the library's 64:
    /// a server taking batches grows its log by 100-200 MB/s, and each checkpoint writes
    /// the whole buffer again.
    #[arg(long, default_value_t = 256)]
    checkpoint_mb: u64,
    /// MiB of consumed items the archive gathers before it writes a Parquet file (or
    /// after 1 s). Smaller: less memory held, more files; 16 keeps the server's peak
    /// memory near half of what 64 does under load, at no cost in throughput.
    #[arg(long, default_value_t = 16)]
    archive_mb: u64,
    /// Seconds a write may take in all (its turn, room, the log write) before answering
    /// 503 with Retry-After; > 0.
    #[arg(long, default_value_t = 2.0)]
    write_timeout: f64,
    /// Largest request body, bytes (larger ones get 413).
    #[arg(long, default_value_t = 64 << 20)]
    body_limit: usize,
    /// Seconds a request's body may take to arrive once its head has (408 after); > 0.
    /// A client that declared a length and stopped sending held its request for good.
    #[arg(long, default_value_t = 60.0)]
    body_timeout: f64,
    /// Seconds a request's head may take to arrive, counted from when the server starts
    /// reading it (also on an idle keep-alive connection): the connection is closed after.
    #[arg(long, default_value_t = 30.0)]
    header_timeout: f64,
    /// Seconds a stop (Ctrl-C, SIGTERM) waits for the requests in flight before it closes
    /// their connections and flushes: a client stalled mid-body held the stop for
    /// `--body-timeout`, past a scheduler's grace period (Kubernetes: 30 s). > 0.
    #[arg(long, default_value_t = 10.0)]
    stop_grace: f64,
    /// Environment name the items are stored under.
    #[arg(long, default_value = "slime")]
    environment: String,
    /// Every call must carry `Authorization: Bearer <token>`.
    #[arg(long, env = "ROLLOUT_BUFFER_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Runs the command line `args` (the program name first, as `std::env::args_os` gives
/// it) and returns the process's exit code: 0 on success (and for `--help`), 1 when the
/// command failed, 2 for arguments clap refused.
///
/// Logs go to stderr (`RUST_LOG` filters them, `info` by default) unless the process has
/// a `tracing` subscriber already. `serve` installs the process's `metrics` recorder, so
/// it runs once per process.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with code 0, mistakes to stderr with code 2.
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rollout-buffer: cannot start the runtime: {e}");
            return 1;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => runtime.block_on(serve(args)),
        Command::Inspect(args) => runtime
            .block_on(inspect::run(&args.url, args.tail, args.json))
            .map(|text| println!("{}", text.trim_end())),
        Command::Repair(args) => runtime
            .block_on(repair::run(&args.url, args.json))
            .map(|text| println!("{}", text.trim_end())),
    };
    let code = match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rollout-buffer: {e}");
            1
        }
    };
    // In a host process (the Python console script) nothing flushes stdout at exit.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    code
}

/// A command-line timeout: > 0 and finite (`why` says what 0 would break), at most thirty
/// years (a request's deadline is now plus this, which past the clock's range panicked:
/// every write answered by a closed connection).
fn seconds(option: &str, t: f64, why: &str) -> Result<Duration, String> {
    let d = Duration::try_from_secs_f64(t)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{option} must be > 0 and finite{why}, not {t}"))?;
    Ok(d.min(Duration::from_secs(86_400 * 365 * 30)))
}

async fn serve(args: Serve) -> Result<(), String> {
    arrow_items::quiet_decoder_panics();
    if !(1..=slime::MAX_GROUP_SIZE).contains(&args.group_size) {
        return Err(format!(
            "--group-size must be from 1 to {}, not {}",
            slime::MAX_GROUP_SIZE,
            args.group_size
        ));
    }
    if args.archive_mb == 0 {
        return Err("--archive-mb must be >= 1".into());
    }
    // An empty secret is a secret that failed to load, not a choice: the server answered
    // 401 to every call, health checks included.
    if args.token.as_deref().is_some_and(str::is_empty) {
        return Err(
            "--token (or ROLLOUT_BUFFER_TOKEN) is empty: no call could carry it; \
                    give a token, or leave both unset to serve without one"
                .into(),
        );
    }
    // Not 0: the timeout bounds the whole write, its log write included, so at 0 every
    // write answered 503 however much room there was.
    let write_timeout = seconds(
        "--write-timeout",
        args.write_timeout,
        " (it bounds the whole write, the log write included)",
    )?;
    let body_timeout = seconds("--body-timeout", args.body_timeout, "")?;
    let header_timeout = seconds("--header-timeout", args.header_timeout, "")?;
    let stop_grace = seconds("--stop-grace", args.stop_grace, "")?;
    if slime::timeout_seconds(args.group_timeout).is_none() {
        return Err(format!(
            "--group-timeout must be at least a nanosecond and finite, not {}",
            args.group_timeout
        ));
    }
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let options = PersistOptions::default()
        .durability(args.durability)
        .checkpoint_bytes(args.checkpoint_mb.saturating_mul(1 << 20))
        .archive(Some(ArchiveOptions {
            max_bytes: args.archive_mb.saturating_mul(1 << 20),
            ..ArchiveOptions::default()
        }));
    let _store_lock = lock_store(&args.store)?;
    let buf = SequenceBuffer::open(&args.store, args.capacity, slime::rpcs(), options)
        .await
        .map_err(|e| format!("cannot open the store {}: {e}", args.store))?;
    let mut settings = slime::Settings::new(args.group_size);
    settings.group_timeout_seconds = args.group_timeout;
    let app_options = app::Options {
        environment: args.environment.clone(),
        token: args.token.clone(),
        write_timeout,
        body_limit: args.body_limit,
        body_timeout,
    };
    let app = app::App::new(buf.clone(), settings, &app_options, prometheus)
        .await
        .map_err(|e| format!("cannot start ingestion: {e}"))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?;
    let stop = shutdown();
    let stopping = Arc::clone(&app);
    // The line tests and scripts wait for; stdout is flushed per line.
    println!("listening on http://{addr}");
    tracing::info!(%addr, store = %args.store, "serving");
    listen::serve(
        listener,
        app::router(app, app_options.body_limit),
        header_timeout,
        stop,
        stop_grace,
        // The reads waiting for more groups answer now, so the shutdown that waits for
        // them does not wait out their timeouts.
        move || stopping.begin_stop(),
    )
    .await;
    tracing::info!("stopping: flushing the buffer");
    buf.flush()
        .await
        .map_err(|e| format!("flush failed: {e}"))?;
    Ok(())
}

/// The lock file a server (or a repair) holds in its store's directory for as long as it
/// runs.
const STORE_LOCK: &str = ".server.lock";

/// Takes the store for this process: an exclusive lock on [`STORE_LOCK`] in its directory,
/// released when the returned file is dropped or the process ends (however it ends). Two
/// servers on one store had each served the same groups without a word: making the same
/// changes, they wrote the same log records, and each took the other's for its own; and a
/// repair moves log files aside, which under a live server loses what it writes. Local
/// directories only: an object store has no such lock, and there a second writer is found
/// only once the two write different records.
pub(crate) fn lock_store(url: &str) -> Result<Option<std::fs::File>, String> {
    let store = rollout_buffer::persist::Store::open(url)
        .map_err(|e| format!("cannot open the store {url}: {e}"))?;
    let Some(root) = store.local_root() else {
        return Ok(None);
    };
    let path = root.join(STORE_LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open the lock file {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "the store {url} is in use by another server or a repair (a process holds {}); \
             stop it first, or give this one a store of its own",
            path.display()
        )),
        // A file system without locks (some network mounts): served as before, unguarded.
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::warn!(
                error = %e,
                path = %path.display(),
                "the store's lock file cannot be locked; a second server would not be refused"
            );
            Ok(None)
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
///
/// The handlers are installed when this is called, not when the future is first polled:
/// the caller calls it before announcing the address, so a signal sent as soon as the
/// "listening on" line appears stops the server gracefully instead of killing it.
fn shutdown() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let handlers = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        );
        async move {
            match handlers {
                (Ok(mut int), Ok(mut term)) => {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "no signal handler; stop with SIGKILL");
                    std::future::pending::<()>().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "no Ctrl-C handler");
            std::future::pending::<()>().await;
        }
    }
}
