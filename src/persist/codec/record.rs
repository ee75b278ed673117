//! Log records: each kind's tag byte and layout (puts, amends, completions, releases,
//! frees, auxiliary writes, spills), on top of the sample and tensor encoding of `mod.rs`.

use super::*;

/// A put recovery has not decoded: the sample's id, birth and encoded bytes.
#[derive(Debug, Clone)]
pub(crate) struct EncodedSample {
    pub(crate) id: SampleId,
    pub(crate) birth: u64,
    pub(crate) bytes: bytes::Bytes,
}

/// A log record as recovery reads it: puts stay encoded.
#[derive(Debug)]
pub(crate) enum Replayed {
    Put(Vec<EncodedSample>),
    Other(Record),
}

/// [`take_record`] for recovery: a put's samples are stepped over, not decoded, and kept
/// as slices of `source` (the bytes `r` reads).
pub(crate) fn take_replayed(r: &mut Reader<'_>, source: &bytes::Bytes) -> Result<Replayed, Bad> {
    if r.buf.get(r.pos) != Some(&PUT) {
        return take_record(r).map(Replayed::Other);
    }
    r.u8()?;
    let n = r.count(16)?;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = r.position();
        let (id, birth) = skip_sample(r)?;
        samples.push(EncodedSample {
            id,
            birth,
            bytes: source.slice(start..r.position()),
        });
    }
    Ok(Replayed::Put(samples))
}

fn put_patch(w: &mut Writer, p: &Patch) {
    put_fields(w, p.len(), p.fields.iter().map(|(k, t)| (k.as_str(), t)));
    put_meta(w, &p.meta);
}

fn take_patch(r: &mut Reader<'_>) -> Result<Patch, Bad> {
    let mut p = Patch::new();
    for (k, t) in take_fields(r)? {
        p = p.with(k, t);
    }
    for (k, v) in take_meta(r)? {
        p = p.meta(&k, v);
    }
    Ok(p)
}

fn put_ids(w: &mut Writer, ids: &[SampleId]) {
    w.len(ids.len());
    ids.iter().for_each(|id| w.str(id.as_str()));
}

fn take_ids(r: &mut Reader<'_>) -> Result<Vec<SampleId>, Bad> {
    let n = r.count(8)?;
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(SampleId::from(r.str()?));
    }
    Ok(ids)
}

fn take_patches(r: &mut Reader<'_>, n: usize) -> Result<Arc<[Patch]>, Bad> {
    let mut patches = Vec::with_capacity(n);
    for _ in 0..n {
        patches.push(take_patch(r)?);
    }
    Ok(patches.into())
}

// ----- records ---------------------------------------------------------------------------

const PUT: u8 = 1;
const AMEND: u8 = 2;
const COMPLETE: u8 = 3;
const RELEASE: u8 = 4;
const FREE: u8 = 5;
const AUX: u8 = 6;
const SPILL: u8 = 7;
const ARCHIVING: u8 = 8;
const ARCHIVED: u8 = 9;

/// Appends the location and field list of spilled parts.
pub(crate) fn put_parts(w: &mut Writer, parts: &[SpillPart]) {
    w.len(parts.len());
    for p in parts {
        w.u64(p.segment);
        w.u64(u64::from(p.segment_rows));
        w.u64(u64::from(p.row));
        w.len(p.fields.len());
        for (key, bytes) in &p.fields {
            w.str(key);
            w.u64(*bytes);
        }
    }
}

/// Reads what [`put_parts`] wrote.
pub(crate) fn take_parts(r: &mut Reader<'_>) -> Result<Vec<SpillPart>, Bad> {
    let n = r.count(24)?;
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        let segment = r.u64()?;
        let rows = u32::try_from(r.u64()?).map_err(|e| e.to_string())?;
        let row = u32::try_from(r.u64()?).map_err(|e| e.to_string())?;
        if row >= rows {
            return Err(format!("spill row {row} of a {rows}-row segment"));
        }
        let k = r.count(9)?;
        let mut fields = Vec::with_capacity(k);
        for _ in 0..k {
            let key = FieldKey::from(r.str()?.to_owned());
            fields.push((key, r.u64()?));
        }
        parts.push(SpillPart {
            segment,
            segment_rows: rows,
            row,
            fields,
        });
    }
    Ok(parts)
}

pub(crate) fn put_record(w: &mut Writer, record: &Record) {
    match record {
        Record::Put(samples) => {
            w.u8(PUT);
            w.len(samples.len());
            samples.iter().for_each(|s| put_sample(w, s));
        }
        Record::Amend { ids, patches } => {
            w.u8(AMEND);
            put_ids(w, ids);
            patches.iter().for_each(|p| put_patch(w, p));
        }
        Record::Complete { rpc, ids, outputs } => {
            w.u8(COMPLETE);
            w.str(rpc);
            put_ids(w, ids);
            match outputs {
                Some(outputs) => {
                    w.u8(1);
                    outputs.iter().for_each(|p| put_patch(w, p));
                }
                None => w.u8(0),
            }
        }
        Record::Release { rpc, ids, expired } => {
            w.u8(RELEASE);
            w.str(rpc);
            w.u8(u8::from(*expired));
            put_ids(w, ids);
        }
        Record::Free { ids, reason } => {
            w.u8(FREE);
            w.u8(match reason {
                ExitReason::Consumed => 0,
                ExitReason::Stale => 1,
                ExitReason::Evicted => 2,
                ExitReason::Filtered => 3,
            });
            put_ids(w, ids);
        }
        Record::Archiving { batch, ids } => {
            w.u8(ARCHIVING);
            w.u64(*batch);
            put_ids(w, ids);
        }
        Record::Archived { batch } => {
            w.u8(ARCHIVED);
            w.u64(*batch);
        }
        Record::Spill {
            ids,
            parts,
            replaces,
        } => {
            w.u8(SPILL);
            match replaces {
                Some(old) => {
                    w.u8(1);
                    w.u64(*old);
                }
                None => w.u8(0),
            }
            put_ids(w, ids);
            for part in parts {
                put_parts(w, std::slice::from_ref(part));
            }
        }
        Record::Aux(writes) => {
            w.u8(AUX);
            w.len(writes.len());
            for aux in writes {
                w.str(&aux.key);
                match &aux.value {
                    Some(sample) => {
                        w.u8(1);
                        put_sample(w, sample);
                    }
                    None => w.u8(0),
                }
            }
        }
    }
}

pub(crate) fn take_record(r: &mut Reader<'_>) -> Result<Record, Bad> {
    Ok(match r.u8()? {
        PUT => {
            let n = r.count(16)?;
            let mut samples = Vec::with_capacity(n);
            for _ in 0..n {
                samples.push(Arc::new(take_sample(r)?));
            }
            Record::Put(samples)
        }
        AMEND => {
            let ids = take_ids(r)?;
            let patches = take_patches(r, ids.len())?;
            Record::Amend { ids, patches }
        }
        COMPLETE => {
            let rpc = Arc::from(r.str()?);
            let ids = take_ids(r)?;
            let outputs = match r.u8()? {
                0 => None,
                _ => Some(take_patches(r, ids.len())?),
            };
            Record::Complete { rpc, ids, outputs }
        }
        RELEASE => {
            let rpc = Arc::from(r.str()?);
            let expired = r.u8()? != 0;
            let ids = take_ids(r)?;
            Record::Release { rpc, ids, expired }
        }
        FREE => {
            let reason = match r.u8()? {
                0 => ExitReason::Consumed,
                1 => ExitReason::Stale,
                2 => ExitReason::Evicted,
                3 => ExitReason::Filtered,
                tag => return Err(format!("unknown free reason {tag}")),
            };
            Record::Free {
                ids: take_ids(r)?,
                reason,
            }
        }
        AUX => {
            let n = r.count(2)?;
            let mut writes = Vec::with_capacity(n);
            for _ in 0..n {
                let key: Arc<str> = Arc::from(r.str()?);
                let value = match r.u8()? {
                    0 => None,
                    _ => Some(Arc::new(take_sample(r)?)),
                };
                writes.push(AuxWrite { key, value });
            }
            Record::Aux(writes)
        }
        SPILL => {
            let replaces = match r.u8()? {
                0 => None,
                _ => Some(r.u64()?),
            };
            let ids = take_ids(r)?;
            let mut parts = Vec::with_capacity(ids.len());
            for _ in 0..ids.len() {
                let mut one = take_parts(r)?;
                match (one.pop(), one.is_empty()) {
                    (Some(part), true) => parts.push(part),
                    _ => return Err("a spill record holds one part per sample".into()),
                }
            }
            Record::Spill {
                ids,
                parts,
                replaces,
            }
        }
        ARCHIVING => {
            let batch = r.u64()?;
            Record::Archiving {
                batch,
                ids: take_ids(r)?,
            }
        }
        ARCHIVED => Record::Archived { batch: r.u64()? },
        tag => return Err(format!("unknown record tag {tag}")),
    })
}
