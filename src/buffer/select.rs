//! Leasing under the buffer's lock in an RPC's selection order. `Fifo`, `Lifo` and the
//! rank-based policies are the state machine's alone; `Prioritized` also needs each
//! candidate's priority, which lives in the stored sample (a scalar field or numeric
//! metadata), so this layer reads it for the state machine. Used by a plain get and by the
//! first request for a training step (`steps.rs`).

use super::Inner;
use crate::rpc_defs::Selection;
use crate::sample::{MetaValue, Sample};
use crate::state::LeaseId;
use crate::sync::Arc;
use std::time::Instant;

/// Leases a batch for RPC `r` (batch number `step`, if given) in its selection order.
pub(crate) fn lease(
    inner: &mut Inner,
    r: usize,
    now: Option<Instant>,
    step: Option<u64>,
) -> Option<LeaseId> {
    let Inner { table, samples, .. } = inner;
    match priority_key(&table.rpcs.get(r)?.selection) {
        Some((key, exponent)) => {
            let key = key.to_owned();
            table.try_lease_with(r, now, step, &|slot| {
                log_priority(samples, slot, &key, exponent)
            })
        }
        None => table.try_lease_with(r, now, step, &|_| 0.0),
    }
}

/// The priority key and exponent of a `Prioritized` selection (possibly inside
/// `OnPolicyFraction`).
fn priority_key(selection: &Selection) -> Option<(&str, f64)> {
    match selection {
        Selection::Prioritized { key, exponent, .. } => Some((key, *exponent)),
        Selection::OnPolicyFraction { then, .. } => priority_key(then),
        _ => None,
    }
}

/// `ln(priority^exponent)` of the sample in `slot`; the priority is the scalar field or
/// numeric metadata `key`. `-inf` (weighs nothing) when missing, non-finite or `<= 0`.
fn log_priority(samples: &[Option<Arc<Sample>>], slot: u32, key: &str, exponent: f64) -> f64 {
    let Some(Some(sample)) = samples.get(slot as usize) else {
        return f64::NEG_INFINITY;
    };
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
