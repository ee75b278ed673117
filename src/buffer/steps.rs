//! The batch log: batches asked for by (RPC, training step) are logged, so asking again
//! for the same step (after a crash, or after dropping the batch) returns the same
//! samples. A trainer that resumes from a checkpoint replays exactly the batches it saw.
//!
//! The first request for a step chooses its samples by the RPC's selection, with the step
//! as the seed of randomised policies, and writes their ids as the auxiliary entry
//! `batch/<rpc>/<step>` under the buffer's lock (with a sync journal the batch is handed
//! out only once that entry is durable). A later request for the step leases exactly those
//! samples, waiting while they are leased or being amended. Completing or committing the
//! step's batch marks the entry done, in the same log unit as the completion; the step can
//! then not be served again ([`Error::StepConsumed`]). A logged sample that left the buffer
//! or can never be served to the RPC again makes the step [`Error::StepUnavailable`].
//!
//! The public calls are `SequenceBuffer::get_batch_for_step` (in `get.rs`) and the
//! completion of its batch (`batch.rs`, which writes [`step_done`]).

use super::select::lease;
use super::{AuxWrite, Durable, Inner, Record, Shared};
use crate::error::{Error, Result};
use crate::sample::{MetaValue, Sample, SampleId};
use crate::state::LeaseId;
use crate::sync::{oneshot, Arc};
use std::time::Instant;

/// Where the verdict on a step's log entry arrives (sync journals only).
pub(crate) type StepLogged = oneshot::Receiver<Result<()>>;

fn step_key(rpc: &str, step: u64) -> String {
    format!("batch/{rpc}/{step:020}")
}

/// The entry that marks step `step` of `rpc` as used.
pub(crate) fn step_done(rpc: &str, step: u64) -> AuxWrite {
    AuxWrite::set(
        step_key(rpc, step),
        Sample::new(format!("{rpc}/{step}")).meta("done", true),
    )
}

/// Leases step `step`'s batch for RPC `r` if it can be now: the logged batch when the step
/// was served before, else a new choice. Returns the lease and whether it is new (to be
/// logged); `Ok(None)` to wait.
pub(crate) fn lease_step(
    inner: &mut Inner,
    r: usize,
    now: Option<Instant>,
    step: u64,
) -> Result<Option<(LeaseId, bool)>> {
    let rpc = Arc::clone(&inner.rpc_names[r]);
    let Some(entry) = inner.aux.get(step_key(&rpc, step).as_str()).cloned() else {
        return Ok(lease(inner, r, now, Some(step)).map(|l| (l, true)));
    };
    let unavailable = |detail: String| Error::StepUnavailable {
        rpc: rpc.to_string(),
        step,
        detail,
    };
    if entry.get_meta("done") == Some(&MetaValue::Bool(true)) {
        return Err(Error::StepConsumed {
            rpc: rpc.to_string(),
            step,
        });
    }
    let ids = entry
        .get("ids")
        .and_then(|t| t.array::<String>())
        .ok_or_else(|| unavailable("its log entry holds no ids".into()))?;
    let mut slots = Vec::with_capacity(ids.len());
    for id in ids.iter() {
        match inner.ids.get(&SampleId::from(id.as_str())) {
            Some(&s) if inner.table.is_stored(s as usize) => slots.push(s),
            _ => {
                return Err(unavailable(format!(
                    "sample `{id}` is no longer in the buffer"
                )))
            }
        }
    }
    if let Some(&s) = slots
        .iter()
        .find(|&&s| !inner.table.can_serve_again(s as usize, r))
    {
        let id = inner
            .ids_of([s])
            .pop()
            .map(|i| i.to_string())
            .unwrap_or_default();
        return Err(unavailable(format!(
            "sample `{id}` can no longer be served to it (no reads left, or stale)"
        )));
    }
    Ok(inner
        .table
        .try_lease_slots(r, &slots, now)
        .map(|l| (l, false)))
}

/// Logs the ids of step `step`'s new batch (`lease`) for RPC `r`. With a sync journal,
/// returns where the verdict on its durability arrives.
pub(crate) fn log_step(
    shared: &Arc<Shared>,
    inner: &mut Inner,
    r: usize,
    step: u64,
    lease: Option<LeaseId>,
) -> Option<StepLogged> {
    let slots = inner.table.lease(lease?, None).ok()?.slots.clone();
    let ids: Vec<String> = inner.ids_of(slots).iter().map(|i| i.to_string()).collect();
    let rpc = Arc::clone(&inner.rpc_names[r]);
    let write = AuxWrite::set(
        step_key(&rpc, step),
        Sample::new(format!("{rpc}/{step}")).with("ids", ids),
    );
    // Visible at once, so a second request for the step replays this choice even before
    // it is durable.
    inner.aux_apply(std::slice::from_ref(&write));
    let journal = inner.journal.clone()?;
    let record = Record::Aux(vec![write]);
    if !shared.sync_journal {
        // Only a callback is ever handed back.
        let _ = journal.append(vec![record], None);
        return None;
    }
    let (tx, rx) = oneshot::channel();
    let then: Durable = Box::new(move |verdict| {
        let _ = tx.send(verdict);
    });
    // A journal that refuses the entry hands `then` back; dropping it closes `rx`, so the
    // get fails. It takes no lock, so dropping it here, under the buffer's lock, is safe.
    drop(journal.append(vec![record], Some(then)));
    Some(rx)
}
