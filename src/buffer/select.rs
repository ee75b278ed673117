//! Leasing under the buffer's lock in an RPC's selection order, and the priorities that
//! `Prioritized` selection weighs samples by.
//!
//! The state machine selects (`state/table/lease.rs`); what it cannot know is a sample's
//! priority, which lives in the stored sample (a scalar field or numeric metadata). This
//! layer computes it and hands it to the table whenever it can change: when a sample is
//! put or restored, and when a patch (an amend, or a completion's outputs) sets its key.
//! Used by a plain get and by the first request for a training step (`steps.rs`).

use super::Inner;
use crate::sample::{MetaValue, Patch, Sample};
use crate::state::LeaseId;
use std::time::Instant;

/// Leases a batch for RPC `r` (batch number `step`, if given) in its selection order.
pub(crate) fn lease(
    inner: &mut Inner,
    r: usize,
    now: Option<Instant>,
    step: Option<u64>,
) -> Option<LeaseId> {
    inner.table.try_lease_with(r, now, step)
}

impl Inner {
    /// Sets the priorities of the sample in `slot` for every `Prioritized` RPC; with
    /// `patch`, only where the patch sets the priority's key (a spilled sample's stub lacks
    /// its spilled fields, so recomputing from it could lose a priority).
    pub(crate) fn refresh_priorities(&mut self, slot: u32, patch: Option<&Patch>) {
        let Inner {
            table,
            samples,
            prioritized,
            ..
        } = self;
        let Some(Some(sample)) = samples.get(slot as usize) else {
            return;
        };
        for (r, key, exponent) in prioritized.iter() {
            let touched =
                patch.is_none_or(|p| p.keys().any(|k| k == key) || p.meta.contains_key(key));
            if touched {
                table.set_ln_priority(slot as usize, *r, ln_priority(sample, key, *exponent));
            }
        }
    }
}

/// `ln(priority^exponent)` of `sample`; the priority is the scalar field or numeric
/// metadata `key`. `-inf` (weighs nothing) when missing, non-finite or `<= 0`.
fn ln_priority(sample: &Sample, key: &str, exponent: f64) -> f64 {
    let value = match sample.get(key) {
        Some(t) => t
            .scalar_value::<f64>()
            .or_else(|| t.scalar_value::<f32>().map(f64::from))
            .or_else(|| t.scalar_value::<i64>().map(|v| v as f64))
            .or_else(|| t.scalar_value::<i32>().map(f64::from)),
        None => match sample.get_meta(key) {
            Some(MetaValue::Float(f)) => Some(*f),
            Some(MetaValue::Int(i)) => Some(*i as f64),
            _ => None,
        },
    };
    match value {
        Some(p) if p.is_finite() && p > 0.0 => exponent * p.ln(),
        _ => f64::NEG_INFINITY,
    }
}
