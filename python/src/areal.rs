//! The core of the AReaL drop-in (`rollout_buffer.areal`): AReaL's `SequenceSample`s kept by
//! slot beside the crate's buffer, so that a put, an amend and a read each cross into Rust
//! once, whatever the batch's size.
//!
//! The buffer decides readiness, order and freeing from one marker field per key an entry
//! holds (a one-byte scalar, stored inline in the sample: no allocation); every MFC is an
//! RPC that reads each entry once. `ArealSlots` keeps, per slot, the Python sample, its
//! generation (the handle an amend names) and how many MFCs have yet to read it.
//!
//! Locking: `entries` is held across the buffer call of a put, a read and an amend, so a
//! read never finds a slot the buffer has published but whose sample is not stored yet.
//! The GIL stays held throughout (these buffer calls finish at once: `runtime::now`), and
//! no Python code runs under the lock: samples are read before it is taken, and merged and
//! released after it is dropped. A thread waiting for the lock releases the GIL while it
//! waits: a log event of the buffer's under the lock runs Python's logging, which needs it.
//!
//! Samples of the stand-in `SequenceSample` class are merged and gathered natively
//! (`sequence_sample.rs`); samples of another class by that class's own methods.

use crate::errors::{py_err, BufferError, BufferFull, SamplesDropped, StaleHandle};
use crate::runtime::now;
use crate::sequence_sample::{gather, merge};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyType};
use rollout_buffer::{
    Batch, BufferConfig, FieldKey, Patch, RpcDef, Sample, SampleId, SequenceBuffer, SlotHandle,
    Tensor,
};
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Where the drop-in logs: Python's `rollout_buffer.areal` logger (pyo3-log names a
/// logger after the target, which is this crate's module path by default).
const LOG_TARGET: &str = "rollout_buffer::areal";

/// Which of the buffer's keys an entry holds: bit `i` for `keys[i]`.
type KeyMask = u64;

/// A read for Python: the slots, then the gathered sample.
type Read<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyAny>);

/// The Python side of each slot.
struct Entries {
    samples: Vec<Option<Py<PyAny>>>,
    generation: Vec<u32>,
    /// MFCs that have yet to read the slot's entry; 0 for a free slot.
    reads_left: Vec<u32>,
    /// Per MFC, the ids of the batch whose gather last failed on the data, given back once
    /// (see `try_get`); cleared by a read that succeeds.
    failed: Vec<Option<Vec<SampleId>>>,
    /// Ids of entries dropped as ungatherable (see `try_get`), the last
    /// [`DROPPED_REMEMBERED`]: an MFC that read one before it was dropped amends it with
    /// the rest of its batch, and that amend skips it rather than fail whole. An id put
    /// again is forgotten here.
    dropped: HashMap<SampleId, u64>,
    /// The ids of `dropped` oldest first, each with the number of its drop (an id put
    /// again and dropped again is queued twice; the older copy must not forget it).
    dropped_order: VecDeque<(SampleId, u64)>,
    drops: u64,
}

/// How many dropped ids [`Entries::dropped`] remembers.
const DROPPED_REMEMBERED: usize = 4096;

impl Entries {
    fn remember_dropped(&mut self, id: SampleId) {
        self.drops += 1;
        self.dropped.insert(id.clone(), self.drops);
        self.dropped_order.push_back((id, self.drops));
        while self.dropped_order.len() > DROPPED_REMEMBERED {
            if let Some((oldest, drop)) = self.dropped_order.pop_front() {
                if self.dropped.get(&oldest) == Some(&drop) {
                    self.dropped.remove(&oldest);
                }
            }
        }
    }
}

/// AReaL's buffer state beside the crate's buffer (see the module docs).
#[pyclass(module = "rollout_buffer._native", name = "ArealSlots", frozen)]
pub(crate) struct ArealSlots {
    buf: SequenceBuffer,
    /// Every MFC input key (AReaL's `rpc_data_keys`), as Python and as buffer keys.
    keys: Vec<(Py<PyString>, FieldKey)>,
    /// Per MFC, the mask of its input keys.
    inputs: Vec<KeyMask>,
    rpcs: Vec<String>,
    /// The stand-in class: pairs of it are merged here, others by their `update_`.
    sample_type: Py<PyType>,
    entries: Mutex<Entries>,
}

impl ArealSlots {
    /// Gathers `samples` into one: natively for the stand-in class, else by `fallback`
    /// (their class's own gather). `served`: the samples hold `keys` (see `try_get`).
    fn gather<'py>(
        &self,
        samples: &[Bound<'py, PyAny>],
        keys: &[Bound<'py, PyAny>],
        fallback: &Bound<'py, PyAny>,
        served: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = fallback.py();
        let own = self.sample_type.bind(py);
        let native = if samples.iter().all(|s| s.get_type().is(own)) {
            gather(own, samples, keys, !served)?
        } else {
            None
        };
        match native {
            Some(out) => Ok(out),
            None => fallback.call1((PyList::new(py, samples)?, PyList::new(py, keys)?)),
        }
    }

    /// After the gather of a batch of the MFC's own inputs raised `error`: drops the
    /// samples that cannot be gathered alone (the oldest of the batch when each can),
    /// gives the rest back, and returns the `SamplesDropped` to raise (see `try_get`). An
    /// interruption while it tries them alone (an error that is no `Exception`:
    /// `KeyboardInterrupt`, a cancellation) drops nothing: the batch goes back and the
    /// interruption is returned.
    fn drop_ungatherable<'py>(
        &self,
        batch: Batch,
        samples: &[Bound<'py, PyAny>],
        keys: &[Bound<'py, PyAny>],
        fallback: &Bound<'py, PyAny>,
        error: PyErr,
    ) -> PyErr {
        let py = fallback.py();
        let mut bad = Vec::with_capacity(samples.len());
        for sample in samples {
            match self.gather(std::slice::from_ref(sample), keys, fallback, true) {
                Ok(_) => bad.push(false),
                Err(e) if e.is_instance_of::<PyException>(py) => bad.push(true),
                Err(interrupted) => return interrupted,
            }
        }
        if !bad.contains(&true) {
            if let Some(oldest) = bad.first_mut() {
                *oldest = true;
            }
        }
        let bad_entries: Vec<(usize, u32, SampleId)> = batch
            .handles()
            .iter()
            .zip(batch.ids())
            .zip(&bad)
            .filter(|(_, &b)| b)
            .map(|((h, id), _)| (h.slot() as usize, h.generation(), id.clone()))
            .collect();
        let named: Vec<String> = bad_entries
            .iter()
            .map(|(slot, _, id)| format!("{id} (slot {slot})"))
            .collect();
        let rpc = batch.rpc_name().to_owned();
        let reason = format!("MFC {rpc} could not gather it: {error}");
        let mut released = Vec::new();
        // Under the lock, as a commit is: a slot the discard frees is not reused by a put
        // before its entry here is cleared.
        let discarded = self.lock(py).and_then(|mut entries| {
            batch.discard_samples(&bad, &reason).map_err(py_err)?;
            // Gone from the buffer (or going, once other MFCs' leases end): no read or
            // amend finds them here either.
            for (slot, generation, id) in bad_entries {
                if entries.generation[slot] == generation {
                    entries.reads_left[slot] = 0;
                    released.push(entries.samples[slot].take());
                }
                entries.remember_dropped(id);
            }
            Ok(())
        });
        drop(released);
        let dropped = match discarded {
            Ok(()) => {
                tracing::warn!(target: LOG_TARGET, mfc = %rpc, error = %error, dropped = ?named, "samples that cannot be gathered dropped");
                SamplesDropped::new_err(format!(
                    "MFC {rpc} could not gather its batch ({error}); dropped from the buffer, as \
                     they would fail every read: {}",
                    named.join(", ")
                ))
            }
            Err(e) => e,
        };
        dropped.set_cause(py, Some(error));
        dropped
    }

    fn lock(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, Entries>> {
        loop {
            match self.entries.try_lock() {
                Ok(entries) => return Ok(entries),
                // The holder may need the GIL to finish (a log event of the buffer's goes
                // through Python's logging): wait without it. The lock is held for
                // microseconds, so yielding beats parking.
                Err(TryLockError::WouldBlock) => py.detach(std::thread::yield_now),
                Err(TryLockError::Poisoned(_)) => {
                    return Err(BufferError::new_err("the drop-in's slot lock is poisoned"))
                }
            }
        }
    }

    /// The keys of this buffer that `keys` (a sample's `keys`) holds; `last` caches the
    /// previous sample's answer, since a batch's samples usually share one key set.
    fn mask_of<'py>(
        &self,
        keys: Bound<'py, PyAny>,
        last: &mut Option<(Bound<'py, PyAny>, KeyMask)>,
    ) -> PyResult<KeyMask> {
        if let Some((prev, mask)) = last {
            if prev.is(&keys) || prev.eq(&keys)? {
                return Ok(*mask);
            }
        }
        let mut mask = 0;
        for (bit, (name, _)) in self.keys.iter().enumerate() {
            if keys.contains(name.bind(keys.py()))? {
                mask |= 1 << bit;
            }
        }
        *last = Some((keys, mask));
        Ok(mask)
    }

    /// The MFCs (bit `r` for MFC `r`; MFCs from the 64th on are not in it, and are woken
    /// always) that entries of key masks `masks` may have become ready for: an entry is
    /// ready for MFC `r` once it holds all of `r`'s inputs, so with `added` (an amend's
    /// keys) those whose inputs it touches, and with whole masks (a put's) those whose
    /// inputs it covers.
    fn ready_for(&self, masks: &[KeyMask], added: bool) -> u64 {
        let mut out = 0u64;
        for (r, &inputs) in self.inputs.iter().enumerate().take(64) {
            let woken = masks.iter().any(|&m| match added {
                true => m & inputs != 0,
                false => m & inputs == inputs,
            });
            if woken {
                out |= 1 << r;
            }
        }
        out
    }

    /// `BufferFull` unless `n` slots are free.
    fn check_room(&self, n: usize) -> PyResult<()> {
        let capacity = self.buf.capacity();
        let free = capacity.saturating_sub(self.buf.len());
        if n <= free {
            return Ok(());
        }
        Err(BufferFull::new_err(format!(
            "cannot put {n} samples: {free} of {capacity} slots are free \
             (raise max_size, as REAL_MASTER_BUFFER_SIZE does in AReaL)"
        )))
    }

    fn markers(&self, mask: KeyMask) -> impl Iterator<Item = FieldKey> + '_ {
        self.keys
            .iter()
            .enumerate()
            .filter(move |(bit, _)| mask & (1 << bit) != 0)
            .map(|(_, (_, key))| key.clone())
    }
}

#[pymethods]
impl ArealSlots {
    /// `max_size` slots read by `rpcs`, `(name, n_seqs, input_keys)` each; pairs of
    /// `sample_type` are merged natively by `amend`.
    #[new]
    fn new(
        py: Python<'_>,
        max_size: usize,
        rpcs: Vec<(String, usize, Vec<String>)>,
        sample_type: Bound<'_, PyType>,
    ) -> PyResult<Self> {
        let mut names: Vec<String> = rpcs.iter().flat_map(|r| r.2.clone()).collect();
        names.sort();
        names.dedup();
        if names.len() > KeyMask::BITS as usize {
            return Err(PyValueError::new_err(format!(
                "{} distinct input keys; the AReaL drop-in takes at most {}",
                names.len(),
                KeyMask::BITS
            )));
        }
        let defs = rpcs
            .iter()
            .map(|(name, n, inputs)| RpcDef::new(name.clone(), *n).inputs(inputs.clone()));
        // Every key is external (amended in): none is needed at put, and an entry without
        // an MFC's keys is simply not ready for it, as in AReaL.
        let config = BufferConfig::new(max_size)
            .rpcs(defs)
            .external_keys(names.clone());
        let buf = {
            let _entered = crate::interpreter::runtime()?.enter();
            SequenceBuffer::with_config(config).map_err(py_err)?
        };
        let inputs = rpcs
            .iter()
            .map(|(_, _, wanted)| {
                names
                    .iter()
                    .enumerate()
                    .filter(|(_, name)| wanted.contains(name))
                    .fold(0, |mask, (bit, _)| mask | 1 << bit)
            })
            .collect();
        let keys = names
            .into_iter()
            .map(|k| (PyString::new(py, &k).unbind(), FieldKey::from(k)))
            .collect();
        let n_rpcs = rpcs.len();
        Ok(Self {
            buf,
            keys,
            inputs,
            rpcs: rpcs.into_iter().map(|r| r.0).collect(),
            sample_type: sample_type.unbind(),
            entries: Mutex::new(Entries {
                samples: (0..max_size).map(|_| None).collect(),
                generation: vec![0; max_size],
                reads_left: vec![0; max_size],
                failed: vec![None; n_rpcs],
                dropped: HashMap::new(),
                dropped_order: VecDeque::new(),
                drops: 0,
            }),
        })
    }

    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// Stores `samples`, one entry each, with `births` (one per sample) or in arrival
    /// order; their slots as int64, and the MFCs they are ready for (see `ready_for`).
    /// All or nothing: `BufferFull` without room, `ValueError` for an id already stored.
    #[pyo3(signature = (samples, births=None))]
    fn put<'py>(
        &self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        births: Option<Vec<u64>>,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, u64)> {
        let samples = samples.try_iter()?.collect::<PyResult<Vec<_>>>()?;
        let n = samples.len();
        if births.as_ref().is_some_and(|b| b.len() != n) {
            return Err(PyValueError::new_err(format!(
                "{} birth times for {n} samples",
                births.as_ref().map_or(0, Vec::len)
            )));
        }
        // Refused before any sample is read: a producer retrying on `BufferFull` (AReaL's
        // only back-pressure) pays for the check, not for a batch it cannot store.
        self.check_room(n)?;
        let mut rows = Vec::with_capacity(n);
        let mut masks = Vec::with_capacity(n);
        let mut last = None;
        for (j, sample) in samples.iter().enumerate() {
            let mut row = Sample::new(entry_id(sample)?);
            if let Some(b) = &births {
                row = row.birth(b[j]);
            }
            let mask = self.mask_of(sample.getattr(intern!(py, "keys"))?, &mut last)?;
            for key in self.markers(mask) {
                row = row.with(key, Tensor::scalar(0u8));
            }
            rows.push(row);
            masks.push(mask);
        }
        let mut replaced = Vec::new();
        let slots = {
            let mut entries = self.lock(py)?;
            // Again under the lock: another thread may have put since.
            self.check_room(n)?;
            // Ids put again are no longer dropped; copied only once something was.
            let again: Vec<SampleId> = match entries.dropped.is_empty() {
                true => Vec::new(),
                false => rows.iter().map(|r| r.id().clone()).collect(),
            };
            let handles = now(self.buf.try_put_batch(rows))?;
            for id in &again {
                entries.dropped.remove(id);
            }
            let reads = self.rpcs.len() as u32;
            for (h, sample) in handles.iter().zip(&samples) {
                let slot = h.slot() as usize;
                replaced.push(entries.samples[slot].replace(sample.clone().unbind()));
                entries.generation[slot] = h.generation();
                entries.reads_left[slot] = reads;
            }
            handles
        };
        drop(replaced);
        let slots = PyArray1::from_iter(py, slots.iter().map(|h| i64::from(h.slot())));
        Ok((slots, self.ready_for(&masks, false)))
    }

    /// Merges `samples[j]` into the entry at `indices[j]` (`update_`); the entries become
    /// ready for the MFCs whose input keys they now hold. `StaleHandle` for a slot with no
    /// entry, `ValueError` for ids that differ; either before anything changes. A merge
    /// that raises stops there: the entries merged before it are amended in the buffer
    /// too, and the failing one is as its `update_` left it (to be amended again).
    /// Returns the MFCs the entries may have become ready for (see `ready_for`).
    fn amend(
        &self,
        py: Python<'_>,
        indices: PyReadonlyArray1<'_, i64>,
        samples: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let indices: Vec<i64> = indices.as_array().iter().copied().collect();
        let others = samples.try_iter()?.collect::<PyResult<Vec<_>>>()?;
        if indices.len() != others.len() {
            return Err(PyValueError::new_err(format!(
                "{} samples for {} indices",
                others.len(),
                indices.len()
            )));
        }
        // Only once something was dropped: the ids cost a read of each sample's `ids`,
        // which runs Python, so not under the lock (taken again if a drop came meanwhile).
        let mut ids: Option<Vec<SampleId>> = None;
        let (handles, stored, kept) = loop {
            let entries = self.lock(py)?;
            if ids.is_none() && !entries.dropped.is_empty() {
                drop(entries);
                ids = Some(others.iter().map(entry_id).collect::<PyResult<_>>()?);
                continue;
            }
            let mut handles = Vec::with_capacity(others.len());
            let mut stored = Vec::with_capacity(others.len());
            let mut kept = Vec::with_capacity(others.len());
            for (j, &i) in indices.iter().enumerate() {
                if ids
                    .as_ref()
                    .is_some_and(|ids| entries.dropped.contains_key(&ids[j]))
                {
                    continue;
                }
                kept.push(j);
                let entry = usize::try_from(i)
                    .ok()
                    .filter(|&s| s < entries.samples.len() && entries.reads_left[s] > 0)
                    .and_then(|s| Some((s, entries.samples[s].as_ref()?)));
                let Some((slot, sample)) = entry else {
                    return Err(StaleHandle::new_err(format!(
                        "slot {i} holds no entry (it was freed or never put)"
                    )));
                };
                handles.push(SlotHandle::new(slot as u32, entries.generation[slot]));
                stored.push(sample.bind(py).clone());
            }
            break (handles, stored, kept);
        };
        if kept.len() < indices.len() {
            tracing::warn!(
                target: LOG_TARGET,
                skipped = indices.len() - kept.len(),
                "amend of entries dropped as ungatherable skipped"
            );
        }
        let indices: Vec<i64> = kept.iter().map(|&j| indices[j]).collect();
        let others: Vec<Bound<'_, PyAny>> = kept.iter().map(|&j| others[j].clone()).collect();
        let mut masks = Vec::with_capacity(others.len());
        let mut last = None;
        for ((i, entry), other) in indices.iter().zip(&stored).zip(&others) {
            check_ids(*i, entry, other)?;
            masks.push(self.mask_of(other.getattr(intern!(py, "keys"))?, &mut last)?);
        }
        // The samples first, then the buffer: once the buffer has the markers, the entries
        // may be read (from another thread too), and they must hold the keys by then.
        let own = self.sample_type.bind(py);
        let mut merged = 0;
        let mut failed = None;
        for (entry, other) in stored.iter().zip(&others) {
            let step = || -> PyResult<()> {
                if entry.get_type().is(own) && other.get_type().is(own) && merge(entry, other)? {
                    return Ok(());
                }
                match entry.getattr_opt(intern!(py, "update_"))? {
                    Some(update) => update.call1((other,))?,
                    None => own.getattr(intern!(py, "update_"))?.call1((entry, other))?,
                };
                Ok(())
            };
            if let Err(e) = step() {
                failed = Some(e);
                break;
            }
            merged += 1;
        }
        // The entries merged before a failure hold their new keys: the buffer learns of
        // them too, so they are read as they are (else they would wait for ever for keys
        // they hold), and the failing one can be amended again.
        let (handles, patches): (Vec<SlotHandle>, Vec<Patch>) = handles
            .into_iter()
            .zip(&masks)
            .take(merged)
            .filter(|(_, &mask)| mask != 0)
            .map(|(h, &mask)| {
                let patch = self
                    .markers(mask)
                    .fold(Patch::new(), |p, key| p.with(key, Tensor::scalar(0u8)));
                (h, patch)
            })
            .unzip();
        if !handles.is_empty() {
            let _entries = self.lock(py)?;
            now(self.buf.amend_batch(&handles, patches))?;
        }
        failed.map_or(Ok(self.ready_for(&masks[..merged], true)), Err)
    }

    /// A batch for MFC number `rpc` if one is ready: its slots (int64, oldest birth first)
    /// and its samples gathered over `keys`: natively for the stand-in's samples, else by
    /// `fallback(samples, keys)` (their own class's gather). `served` says the MFC's
    /// declared inputs include `keys`, so the samples hold them (the buffer served them
    /// for those inputs) and the native gather need not check.
    ///
    /// The gather runs while the batch is leased, before the read is committed. One that
    /// raises gives the batch back, nothing read, unless it raised for the MFC's own inputs
    /// (so about the data, not the request), with an `Exception` (not an interruption),
    /// for the same batch as the MFC's last failed gather: given back again, it would be
    /// served again, to fail again, at every get. Then the samples that cannot be gathered
    /// alone (or, when each can, the oldest of the batch, so every failure makes progress)
    /// are dropped from the buffer, the rest given back, and `SamplesDropped` is raised
    /// naming them, the gather's error as its cause. A gather that failed once for a
    /// passing reason (memory, say) thus drops nothing. Once this returns a read, the read
    /// is done: the last MFC's read frees the slots.
    #[pyo3(signature = (rpc, keys, fallback, served=false))]
    fn try_get<'py>(
        &self,
        py: Python<'py>,
        rpc: usize,
        keys: Vec<Bound<'py, PyAny>>,
        fallback: &Bound<'py, PyAny>,
        served: bool,
    ) -> PyResult<Option<Read<'py>>> {
        let name = self
            .rpcs
            .get(rpc)
            .ok_or_else(|| PyValueError::new_err(format!("no MFC number {rpc}")))?;
        crate::interpreter::check_not_forked()?;
        // Any error from here to the commit drops `batch`, which gives it back.
        let (batch, slots, samples) = {
            let entries = self.lock(py)?;
            let Some(batch) = self.buf.try_get_batch_for_rpc(name).map_err(py_err)? else {
                return Ok(None);
            };
            let slots: Vec<usize> = batch.handles().iter().map(|h| h.slot() as usize).collect();
            let samples = slots
                .iter()
                .map(|&s| {
                    entries.samples[s]
                        .as_ref()
                        .map(|o| o.bind(py).clone())
                        .ok_or_else(|| {
                            BufferError::new_err(format!("slot {s} was read with no sample"))
                        })
                })
                .collect::<PyResult<Vec<_>>>()?;
            (batch, slots, samples)
        };
        // Outside the lock: a class's own gather is Python code, which may take long or
        // call back into this buffer.
        let gathered = match self.gather(&samples, &keys, fallback, served) {
            Ok(out) => out,
            Err(e) if served && e.is_instance_of::<PyException>(py) => {
                let ids: Vec<SampleId> = batch.ids().cloned().collect();
                let again = {
                    let mut entries = self.lock(py)?;
                    let last = entries.failed[rpc].replace(ids);
                    last.as_ref() == entries.failed[rpc].as_ref()
                };
                if !again {
                    return Err(e);
                }
                let raised = self.drop_ungatherable(batch, &samples, &keys, fallback, e);
                if raised.is_instance_of::<SamplesDropped>(py) {
                    self.lock(py)?.failed[rpc] = None;
                }
                return Err(raised);
            }
            Err(e) => return Err(e),
        };
        let mut freed = Vec::new();
        {
            let mut entries = self.lock(py)?;
            now(batch.commit())?;
            entries.failed[rpc] = None;
            for &s in &slots {
                // Each MFC reads an entry once (the buffer's reads per RPC), so the count
                // reaches 0 exactly at the buffer's last read, which frees the slot.
                let left = entries.reads_left[s].saturating_sub(1);
                entries.reads_left[s] = left;
                if left == 0 {
                    freed.push(entries.samples[s].take());
                }
            }
        }
        drop(freed);
        let slots = PyArray1::from_iter(py, slots.iter().map(|&s| s as i64));
        Ok(Some((slots, gathered)))
    }
}

/// A sample's entry id: its id, or its ids joined by `|` when it holds several, each id's
/// backslashes and `|` escaped by a backslash so no single id reads as a join: an entry
/// `["a|b"]` had been refused as a duplicate of `["a", "b"]`.
fn entry_id(sample: &Bound<'_, PyAny>) -> PyResult<SampleId> {
    let ids = sample.getattr(intern!(sample.py(), "ids"))?;
    if ids.len()? == 1 {
        let id = ids.get_item(0)?;
        // A str is read in place (its UTF-8 is cached by Python): one copy, into the id.
        let id = match id.cast::<PyString>() {
            Ok(s) => SampleId::from(escaped(s.to_str()?).as_ref()),
            Err(_) => SampleId::from(escaped(id.str()?.to_str()?).as_ref()),
        };
        return Ok(id);
    }
    let parts = ids
        .try_iter()?
        .map(|id| Ok(escaped(&text(&id?)?).into_owned()))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(SampleId::from(parts.join("|")))
}

/// `id` with its backslashes and `|` escaped by a backslash; itself (no copy) when it has
/// neither, as ids do.
fn escaped(id: &str) -> std::borrow::Cow<'_, str> {
    if !id.contains(['|', '\\']) {
        return std::borrow::Cow::Borrowed(id);
    }
    std::borrow::Cow::Owned(id.replace('\\', "\\\\").replace('|', "\\|"))
}

/// `str(obj)`, without a call for what already is a `str`.
fn text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => Ok(s.to_str()?.to_owned()),
        Err(_) => Ok(obj.str()?.to_str()?.to_owned()),
    }
}

/// The ids of an amend's sample against its entry's: equal, or equal as `str`.
fn check_ids(slot: i64, entry: &Bound<'_, PyAny>, other: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = entry.py();
    let (mine, theirs) = (
        entry.getattr(intern!(py, "ids"))?,
        other.getattr(intern!(py, "ids"))?,
    );
    if mine.eq(&theirs)? {
        return Ok(());
    }
    let as_text = |ids: &Bound<'_, PyAny>| -> PyResult<Vec<String>> {
        ids.try_iter()?.map(|id| text(&id?)).collect()
    };
    if as_text(&mine)? == as_text(&theirs)? {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "slot {slot}: ids {} do not match the entry's {}",
        PyList::new(py, theirs.try_iter()?.collect::<PyResult<Vec<_>>>()?)?.repr()?,
        PyList::new(py, mine.try_iter()?.collect::<PyResult<Vec<_>>>()?)?.repr()?,
    )))
}
