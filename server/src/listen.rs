//! The accept loop: each connection served by hyper's HTTP/1 with a header-read timeout,
//! and a graceful stop. `axum::serve` sets no timer, so a connection that never finished
//! its request head (or sat idle between requests) was held forever, a file descriptor
//! and a task each: enough of them and no client could connect. No lock here; the stop
//! signal is a future, and `GracefulShutdown` tracks the connections still open.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

/// Serves `router` on `listener` until `stop` resolves, then stops accepting, calls
/// `stopping` (so long-poll reads answer now) and waits for every connection to finish
/// the request it is serving, for up to `grace`: then the connections still open are
/// closed, as a client hanging up closes one (a client stalled mid-body held the stop
/// for its whole body timeout). A connection whose request head takes longer than
/// `header_timeout` to arrive (counted from when the server starts reading it, so also
/// an idle keep-alive connection) is closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    header_timeout: Duration,
    stop: impl Future<Output = ()>,
    grace: Duration,
    stopping: impl FnOnce(),
) {
    let graceful = GracefulShutdown::new();
    // Set once the stop's grace has passed: every connection still open is dropped.
    let (close_all, closing) = tokio::sync::watch::channel(false);
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            // A client that gave up before its connection was taken: the next one is
            // served at once (as `axum::serve` does).
            Err(e) if is_connection_error(&e) => {
                tracing::debug!(error = %e, "a connection went before it was accepted");
                continue;
            }
            Err(e) => {
                // Out of file descriptors, usually: the error repeats until a
                // connection closes, so wait a little rather than spin (as axum does).
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    () = &mut stop => break,
                }
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(
                TokioIo::new(stream),
                TowerToHyperService::new(router.clone()),
            );
        let connection = graceful.watch(connection);
        let mut closing = closing.clone();
        tokio::spawn(async move {
            tokio::select! {
                // Closing first: once the grace is over, no request goes on to store
                // anything (the flush after the stop must see all that was answered).
                biased;
                // Dropping the connection drops its request's handler, at an await the
                // buffer tolerates: nothing half done, and no answer it cannot keep.
                _ = closing.wait_for(|&close| close) => {}
                ended = connection => if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                },
            }
        });
    }
    drop(listener);
    drop(closing);
    stopping();
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_s = grace.as_secs_f64(),
            "requests still in flight after the stop's grace (--stop-grace): their connections are closed"
        );
        let _ = close_all.send(true);
        // Every connection task gone (each held a receiver): no request is answered after
        // this. Work a handler handed to a task of its own (an ingest's store, a commit)
        // may still land, unanswered, as when a client hangs up.
        close_all.closed().await;
    }
}

/// Errors of one connection that the listener itself survives.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    )
}
