//! `rollout-buffer inspect URL`: what a stored run holds, read without writing to it
//! (safe while the run is still going), as text for people or JSON for machines, and the
//! latest archived rows.

use arrow_array::RecordBatch;
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use rollout_buffer::persist::{archive_tail, inspect, ArchiveWriter, ArchivedSample, StoreSummary};
use rollout_buffer::MetaValue;
use serde_json::{json, Map, Value};
use std::fmt::Write as _;

/// Cells of `--tail` text longer than this are cut (token lists run to thousands).
const CELL: usize = 60;

/// Fails, without creating anything, when `url` names a local directory that does not
/// exist (opening a local store would create it; a look or a repair must not).
pub fn require_stored_run(url: &str) -> Result<(), String> {
    let local = match url.split_once("://") {
        None => Some(url),
        Some(("file", path)) => Some(path),
        Some(_) => None,
    };
    match local.filter(|d| !std::path::Path::new(d).is_dir()) {
        Some(dir) => Err(format!("no stored run at {url}: {dir} is not a directory")),
        None => Ok(()),
    }
}

/// The summary of the run at `url` and, with `tail > 0`, its latest archived rows; `json`
/// prints one JSON document (`{"summary": ..., "tail": [...]}`) instead of text.
///
/// # Errors
///
/// The library's error for a store that cannot be read, as text.
pub async fn run(url: &str, tail: usize, json: bool) -> Result<String, String> {
    require_stored_run(url)?;
    let summary = inspect(url)
        .await
        .map_err(|e| format!("cannot inspect {url}: {e}"))?;
    let rows = if tail > 0 {
        archive_tail(url, tail)
            .await
            .map_err(|e| format!("cannot read the archive of {url}: {e}"))?
    } else {
        Vec::new()
    };
    if json {
        let rows = rows.iter().map(row_json).collect::<Result<Vec<_>, _>>()?;
        let doc = json!({"summary": summary_json(&summary), "tail": rows});
        return serde_json::to_string_pretty(&doc).map_err(|e| e.to_string());
    }
    let mut out = summary_text(&summary);
    if tail > 0 {
        let _ = writeln!(out, "latest {} archived rows (oldest first):", rows.len());
        for row in &rows {
            let _ = writeln!(out, "  {}", row_text(row)?);
        }
    }
    Ok(printable(&out))
}

/// `text` with control characters other than line ends escaped (`\u{0}`): names and
/// texts come from the generators, and a terminal must not take them as its own.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' => c.to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

fn summary_text(s: &StoreSummary) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "store {}", s.url);
    let _ = writeln!(
        o,
        "  buffer: {} samples ({} groups, {} rollouts); {} put and {} freed over the run",
        s.samples, s.groups, s.rollouts, s.put, s.freed
    );
    for p in &s.partitions {
        let _ = writeln!(
            o,
            "    environment {:<16} policy version {:<6} {:>8} samples {:>9} rollouts",
            p.environment.as_deref().unwrap_or("-"),
            p.policy_version.map_or("-".to_owned(), |v| v.to_string()),
            p.samples,
            p.rollouts
        );
    }
    let _ = writeln!(
        o,
        "  pending rollouts (waiting for their group): {}; sealed-group markers: {}; other entries: {}",
        s.pending_rollouts, s.sealed_markers, s.aux_entries
    );
    if !s.keys.is_empty() {
        let keys: Vec<String> = s.keys.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(o, "  samples per key: {}", keys.join(", "));
    }
    for r in &s.rpcs {
        let per = r.reads_per_sample.map_or("?".to_owned(), |n| n.to_string());
        let _ = writeln!(
            o,
            "  rpc {}: {} reads per sample; {} stored samples read; {} reads, {} redelivered in all",
            r.name, per, r.samples_read, r.reads, r.redelivered
        );
    }
    match &s.checkpoint {
        Some(c) => {
            let _ = writeln!(
                o,
                "  last checkpoint: manifest {} ({} segments, {}), log from group {}",
                c.number,
                c.segments,
                mb(c.bytes),
                c.log_from
            );
        }
        None => {
            let _ = writeln!(o, "  no checkpoint yet");
        }
    }
    let _ = writeln!(
        o,
        "  log groups after it: {} ({} skipped as damaged); spill segments: {}",
        s.log_groups, s.log_groups_skipped, s.spill_segments
    );
    let (files, rows, bytes) = s.archive.iter().fold((0, 0, 0), |(f, r, b), p| {
        (f + p.files, r + p.rows, b + p.bytes)
    });
    let _ = writeln!(o, "  archive: {rows} rows in {files} files, {}", mb(bytes));
    for p in &s.archive {
        let _ = writeln!(
            o,
            "    {:<60} {:>4} files {:>9} rows {:>12}",
            p.path,
            p.files,
            p.rows,
            mb(p.bytes)
        );
    }
    o
}

fn summary_json(s: &StoreSummary) -> Value {
    let partitions: Vec<Value> = s
        .partitions
        .iter()
        .map(|p| {
            json!({"environment": p.environment, "policy_version": p.policy_version,
                   "samples": p.samples, "rollouts": p.rollouts})
        })
        .collect();
    let keys: Map<String, Value> = s.keys.iter().map(|(k, n)| (k.clone(), json!(n))).collect();
    let rpcs: Vec<Value> = s
        .rpcs
        .iter()
        .map(|r| {
            json!({"name": r.name, "reads_per_sample": r.reads_per_sample,
                   "samples_read": r.samples_read, "reads": r.reads,
                   "redelivered": r.redelivered})
        })
        .collect();
    let archive: Vec<Value> = s
        .archive
        .iter()
        .map(|p| json!({"path": p.path, "files": p.files, "rows": p.rows, "bytes": p.bytes}))
        .collect();
    json!({
        "url": s.url,
        "samples": s.samples,
        "groups": s.groups,
        "rollouts": s.rollouts,
        "put": s.put,
        "freed": s.freed,
        "partitions": partitions,
        "keys": keys,
        "rpcs": rpcs,
        "pending_rollouts": s.pending_rollouts,
        "sealed_markers": s.sealed_markers,
        "aux_entries": s.aux_entries,
        "checkpoint": s.checkpoint.as_ref().map(|c| json!({
            "number": c.number, "log_from": c.log_from, "segments": c.segments, "bytes": c.bytes,
        })),
        "log_groups": s.log_groups,
        "log_groups_skipped": s.log_groups_skipped,
        "spill_segments": s.spill_segments,
        "archive": archive,
    })
}

/// One archived row as one Arrow row (its fields in the archive's column types), with the
/// partition keys the archive keeps in its paths.
fn row_batch(row: &ArchivedSample) -> Result<(RecordBatch, Map<String, Value>), String> {
    let batch = ArchiveWriter::record_batch(std::slice::from_ref(row))
        .map_err(|e| format!("row {}: {e}", row.sample.id()))?;
    let mut partition = Map::new();
    for key in ["environment", "policy_version"] {
        let value = match row.sample.get_meta(key) {
            Some(MetaValue::Str(s)) => json!(s),
            Some(MetaValue::Int(i)) => json!(i),
            Some(MetaValue::Float(f)) => json!(f),
            Some(MetaValue::Bool(b)) => json!(b),
            _ => Value::Null,
        };
        partition.insert(key.to_owned(), value);
    }
    Ok((batch, partition))
}

fn row_json(row: &ArchivedSample) -> Result<Value, String> {
    let (batch, mut out) = row_batch(row)?;
    let mut writer = arrow_json::ArrayWriter::new(Vec::new());
    writer
        .write(&batch)
        .and_then(|()| writer.finish())
        .map_err(|e| format!("row {}: {e}", row.sample.id()))?;
    let rows: Vec<Map<String, Value>> =
        serde_json::from_slice(&writer.into_inner()).map_err(|e| e.to_string())?;
    for fields in rows {
        out.extend(fields);
    }
    Ok(Value::Object(out))
}

fn row_text(row: &ArchivedSample) -> Result<String, String> {
    let (batch, partition) = row_batch(row)?;
    let mut cells: Vec<String> = partition.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let options = FormatOptions::default();
    let schema = batch.schema();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let formatter = ArrayFormatter::try_new(column.as_ref(), &options)
            .map_err(|e| format!("row {}: {e}", row.sample.id()))?;
        let mut cell = formatter.value(0).to_string();
        if cell.chars().count() > CELL {
            cell = cell.chars().take(CELL).collect::<String>() + "...";
        }
        cells.push(format!("{}={cell}", field.name()));
    }
    Ok(cells.join(" "))
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_escaped_and_line_ends_kept() {
        assert_eq!(
            printable("env=a\u{0}b\n\u{1b}[31mred\tx"),
            "env=a\\u{0}b\n\\u{1b}[31mred\\tx"
        );
        assert_eq!(printable("ünï 数"), "ünï 数");
    }
}
