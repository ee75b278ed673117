//! Policy versions and ages: `set_policy_version`, and how a put reads a sample's version
//! and creation time from its metadata.
//!
//! A sample's policy version is its `policy_version` metadata (a non-negative integer) and
//! its creation time its `created_ts` metadata (Unix seconds, integer or float). The table
//! (`state/freshness.rs`) does the bookkeeping; this file turns metadata into its terms and
//! notifies: raising the version only removes eligibility, but the samples it drops free
//! slots, so putters are woken and the drops go to the freed-sample sink.

use super::{now, AuxWrite, Record, SequenceBuffer};
use crate::error::{Error, Result};
use crate::sample::{MetaValue, Sample};
use crate::state::{Age, Freshness, NO_VERSION};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Metadata key of a sample's policy version (a non-negative integer).
pub const POLICY_VERSION: &str = "policy_version";
/// Metadata key of a sample's creation time (Unix seconds).
pub const CREATED_TS: &str = "created_ts";

/// Auxiliary key of the current policy version.
const POLICY_VERSION_KEY: &str = "policy_version";

/// The policy version recorded in restored auxiliary entries, if any.
#[cfg(feature = "persist")]
pub(crate) fn recovered_version(aux: &super::AuxMap) -> Option<u64> {
    match aux.get(POLICY_VERSION_KEY)?.get_meta(POLICY_VERSION)? {
        MetaValue::Int(v) => u64::try_from(*v).ok(),
        _ => None,
    }
}

impl SequenceBuffer {
    /// Announces the trainer's current policy version. From now on a put of a sample with
    /// a newer `policy_version` fails with [`Error::FutureVersion`]; an RPC with
    /// `max_staleness = s` serves only samples with `version >= current - s`, and samples
    /// that fall out of the window of an RPC that still owes them reads are dropped (handed
    /// to the freed-sample sink as stale; leased ones when their lease ends). The same
    /// version again changes nothing. Before the first call versions are not checked.
    ///
    /// # Errors
    ///
    /// [`Error::VersionRegressed`] for a version older than the current one, with nothing
    /// changed.
    pub fn set_policy_version(&self, version: u64) -> Result<()> {
        let shared = &self.shared;
        let mut freed = Vec::new();
        let (wake, dropped) = {
            let mut inner = shared.lock();
            let previous = inner.table.policy_version();
            let wake = inner
                .table
                .set_policy_version(version, &mut freed)
                .map_err(|current| Error::VersionRegressed {
                    current,
                    requested: version,
                })?;
            if previous != Some(version) {
                // Kept durable (in log order with the drops it causes), so a recovered
                // buffer applies the same window from its first call.
                let write = AuxWrite::set(
                    POLICY_VERSION_KEY,
                    Sample::new(POLICY_VERSION_KEY).meta(POLICY_VERSION, version as i64),
                );
                inner.log(|| Record::Aux(vec![write.clone()]));
                inner.aux_apply(&[write]);
            }
            (wake, inner.take_freed(&freed))
        };
        shared.notify(wake);
        shared.dispose(dropped);
        Ok(())
    }

    /// The current policy version, if [`Self::set_policy_version`] was called.
    pub fn policy_version(&self) -> Option<u64> {
        self.shared.lock().table.policy_version()
    }
}

/// Reads a sample's version and creation time; `index` is its batch position (for
/// errors). `Ok(None)` when it has neither.
pub(crate) fn freshness_of(sample: &Sample, ages: bool) -> Result<Option<Freshness>> {
    let bad = |key: &str, detail: String| Error::InvalidMetadata {
        id: sample.id.to_string(),
        key: key.to_owned(),
        detail,
    };
    let version = match sample.get_meta(POLICY_VERSION) {
        None => NO_VERSION,
        Some(MetaValue::Int(v)) if *v >= 0 => *v as u64,
        Some(other) => {
            return Err(bad(
                POLICY_VERSION,
                format!("{other:?} is not a non-negative integer"),
            ))
        }
    };
    let created = match (ages, sample.get_meta(CREATED_TS)) {
        (false, _) | (true, None) => None,
        (true, Some(value)) => {
            let secs = match value {
                MetaValue::Float(f) => *f,
                MetaValue::Int(i) => *i as f64,
                other => return Err(bad(CREATED_TS, format!("{other:?} is not a number"))),
            };
            if !secs.is_finite() {
                return Err(bad(CREATED_TS, format!("{secs} is not finite")));
            }
            Some(Age {
                at: now(),
                age: age_now(secs),
            })
        }
    };
    if version == NO_VERSION && created.is_none() {
        return Ok(None);
    }
    Ok(Some(Freshness {
        version,
        age: created,
    }))
}

/// The age now of a sample created at Unix time `secs` (zero for a time in the future).
fn age_now(secs: f64) -> Duration {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    Duration::try_from_secs_f64((wall - secs).max(0.0)).unwrap_or(Duration::MAX)
}
