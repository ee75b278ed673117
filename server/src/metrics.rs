//! `GET /metrics`: the buffer's state and the RL metrics, through the `metrics` facade
//! into the Prometheus recorder the binary installs.
//!
//! Gauges are set when scraped: the buffer's slot counts, per RPC (`rpc` label) what is
//! ready, leased and waiting, the ingest's counters, and the library's per-environment RL
//! metrics (`rollout_buffer_*`, labelled `environment`, by [`MetricsTracker`]). The HTTP
//! handlers count items written and read as they go.

use rollout_buffer::rollout::{GroupIngest, MetricsTracker};
use rollout_buffer::SequenceBuffer;

/// Refreshes every gauge from the buffer, the ingest and the tracker.
pub fn publish(buf: &SequenceBuffer, ingest: &GroupIngest, tracker: &mut MetricsTracker) {
    let s = buf.stats();
    for (name, value) in [
        ("rollout_buffer_capacity_slots", s.capacity),
        ("rollout_buffer_empty_slots", s.empty),
        ("rollout_buffer_idle_slots", s.idle),
        ("rollout_buffer_reading_slots", s.reading),
        ("rollout_buffer_waiting_putters", s.waiting_putters),
        ("rollout_buffer_live_leases", s.live_leases),
    ] {
        metrics::gauge!(name).set(value as f64);
    }
    for (name, value) in [
        ("rollout_buffer_put_samples", s.put),
        ("rollout_buffer_freed_samples", s.freed),
        ("rollout_buffer_stale_samples", s.stale),
        ("rollout_buffer_evicted_samples", s.evicted),
    ] {
        metrics::gauge!(name).set(value as f64);
    }
    for rpc in &s.rpcs {
        let label = rpc.name.to_string();
        metrics::gauge!("rollout_buffer_rpc_eligible", "rpc" => label.clone())
            .set(rpc.eligible as f64);
        metrics::gauge!("rollout_buffer_rpc_leased", "rpc" => label.clone()).set(rpc.leased as f64);
        metrics::gauge!("rollout_buffer_rpc_waiting", "rpc" => label.clone())
            .set(rpc.waiting as f64);
        metrics::gauge!("rollout_buffer_rpc_reads", "rpc" => label.clone()).set(rpc.reads as f64);
        metrics::gauge!("rollout_buffer_rpc_redelivered", "rpc" => label)
            .set(rpc.redelivered as f64);
    }
    let c = ingest.counters();
    for (name, value) in [
        ("rollout_buffer_ingest_stored_groups", c.stored_groups),
        ("rollout_buffer_ingest_duplicate_groups", c.duplicate_groups),
        ("rollout_buffer_ingest_refused_groups", c.refused_groups),
        ("rollout_buffer_ingest_reopened_groups", c.reopened_groups),
        ("rollout_buffer_ingest_stored_rollouts", c.stored_rollouts),
        (
            "rollout_buffer_ingest_recovered_rollouts",
            c.recovered_rollouts,
        ),
    ] {
        metrics::gauge!(name).set(value as f64);
    }
    // Groups that timed out short of `min_timeout_group_size_ratio` are discarded, as
    // slime discards them; this is where that shows.
    let a = ingest.assembler_counters();
    for (name, value) in [
        (
            "rollout_buffer_ingest_sealed_timeout_groups",
            a.sealed_timeout,
        ),
        ("rollout_buffer_ingest_dropped_groups", a.dropped_groups),
        ("rollout_buffer_ingest_dropped_rollouts", a.dropped_rollouts),
    ] {
        metrics::gauge!(name).set(value as f64);
    }
    tracker.snapshot(buf, Some(ingest)).publish();
}
