//! `rollout-buffer repair URL`: salvages a stored run that strict recovery refuses
//! (`persist::repair`), then says what was moved aside and what the run lost, as text or
//! JSON. Run it with the run stopped: it moves files (on a local store it takes the
//! server's lock, so it refuses to run beside a server, and a server beside it).

use rollout_buffer::persist::{repair, RepairReport, Store};
use std::fmt::Write as _;

/// Repairs the store at `url`; returns the report as text, or JSON with `json`.
///
/// # Errors
///
/// The library's error for a store that cannot be opened, read or written, as text.
pub async fn run(url: &str, json: bool) -> Result<String, String> {
    super::inspect::require_stored_run(url)?;
    // Held until the repair is done: a server starting meanwhile is refused, and a
    // repair beside a running server is (it would move aside files the server writes).
    let _store_lock = super::lock_store(url)?;
    let store = Store::open(url).map_err(|e| format!("cannot open {url}: {e}"))?;
    let report = repair(&store)
        .await
        .map_err(|e| format!("cannot repair {url}: {e}"))?;
    Ok(if json {
        report.to_json().to_string()
    } else {
        text(url, &report)
    })
}

fn text(url: &str, report: &RepairReport) -> String {
    let mut out = String::new();
    if report.is_clean() {
        let _ = writeln!(out, "{url}: nothing to repair; it opens as it is");
        return out;
    }
    let from = report
        .checkpoint
        .map_or("the start of the log".to_owned(), |n| {
            format!("checkpoint {n}")
        });
    let _ = writeln!(
        out,
        "{url}: recovers from {from} and {} log groups after it",
        report.groups_kept
    );
    let _ = writeln!(
        out,
        "moved aside to {}:",
        report.folder.as_deref().unwrap_or("?")
    );
    for m in &report.moved {
        let _ = writeln!(out, "  {}  ({})", m.from, m.why);
    }
    let _ = writeln!(
        out,
        "lost: {} records in readable log groups; {} samples put in them or held by the \
         moved checkpoint{}",
        report.records_lost,
        report.samples_lost.len(),
        if report.unreadable_groups.is_empty() {
            String::new()
        } else {
            format!(
                "; the records of groups {:?} cannot be read",
                report.unreadable_groups
            )
        }
    );
    list_ids(&mut out, "ids", &report.samples_lost);
    if !report.aux_lost.is_empty() {
        let _ = writeln!(
            out,
            "lost from the moved checkpoint: {} pending entries (rollouts of unsealed groups, \
             duplicate markers)",
            report.aux_lost.len()
        );
        list_ids(&mut out, "keys", &report.aux_lost);
    }
    if !report.unarchived_lost.is_empty() {
        let _ = writeln!(
            out,
            "lost from the moved checkpoint: the archive rows of {} freed samples",
            report.unarchived_lost.len()
        );
        list_ids(&mut out, "ids", &report.unarchived_lost);
    }
    if !report.unreadable_segments.is_empty() {
        let _ = writeln!(
            out,
            "what the checkpoint segments {:?} held cannot be read",
            report.unreadable_segments
        );
    }
    out
}

/// Up to 20 of `ids` on one line, and how many more.
fn list_ids(out: &mut String, what: &str, ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    let shown: Vec<&str> = ids.iter().take(20).map(String::as_str).collect();
    let more = ids.len().saturating_sub(shown.len());
    let _ = write!(out, "  {what}: {}", shown.join(", "));
    if more > 0 {
        let _ = write!(out, " and {more} more");
    }
    out.push('\n');
}
