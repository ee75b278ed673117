//! The stand-in `SequenceSample`'s `update_` and `gather` (`areal/types.py`, the
//! reference) done natively: for metadata-only samples, the drop-in's every amend and read,
//! one pass over the batch without an interpreter loop per sample. Each returns "not done"
//! (and changes nothing) for a case it leaves to the Python method.

use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PyString, PyTuple, PyType};

/// The stand-in's `update_` for two of its samples whose ids match: `other`'s keys added,
/// its values winning. `false`, with nothing changed, when a field is not of the stand-in's
/// type (a caller replaced it), so the caller runs `update_` itself.
pub(crate) fn merge<'py>(entry: &Bound<'py, PyAny>, other: &Bound<'py, PyAny>) -> PyResult<bool> {
    let py = entry.py();
    let dict = |obj: &Bound<'py, PyAny>,
                name: &Bound<'py, PyString>|
     -> PyResult<Option<Bound<'py, PyDict>>> {
        Ok(obj.getattr(name)?.cast_into::<PyDict>().ok())
    };
    let names = [
        intern!(py, "trailing_shapes"),
        intern!(py, "dtypes"),
        intern!(py, "metadata"),
        intern!(py, "seqlens"),
    ];
    let mut pairs = Vec::with_capacity(names.len());
    for name in names {
        match (dict(entry, name)?, dict(other, name)?) {
            (Some(mine), Some(theirs)) => pairs.push((mine, theirs)),
            _ => return Ok(false),
        }
    }
    let data_name = intern!(py, "data");
    let other_data = other.getattr(data_name)?;
    let data = if other_data.is_none() {
        None
    } else {
        let Ok(theirs) = other_data.cast_into::<PyDict>() else {
            return Ok(false);
        };
        let mine = entry.getattr(data_name)?;
        let mine = if mine.is_none() {
            None
        } else {
            match mine.cast_into::<PyDict>() {
                Ok(d) => Some(d),
                Err(_) => return Ok(false),
            }
        };
        Some((mine, theirs))
    };
    let keys_name = intern!(py, "keys");
    let keys = entry.getattr(keys_name)?.bitor(other.getattr(keys_name)?)?;
    entry.setattr(keys_name, keys)?;
    for (mine, theirs) in pairs {
        // Most of a sample's dicts are small, many empty (metadata): skip those.
        if !theirs.is_empty() {
            mine.update(theirs.as_mapping())?;
        }
    }
    if let Some((mine, theirs)) = data {
        let mine = match mine {
            Some(d) => d,
            None => {
                let fresh = PyDict::new(py);
                entry.setattr(data_name, &fresh)?;
                fresh
            }
        };
        mine.update(theirs.as_mapping())?;
    }
    Ok(true)
}

/// The stand-in's `SequenceSample.gather` for metadata-only samples: one `cls` holding
/// `samples` in order over `keys`. `None` when every sample carries data, whose
/// concatenation (numpy or torch) is left to the Python method, or when a sample's
/// metadata is a mapping other than a dict or lacks a key another has.
#[pyfunction]
pub(crate) fn gather_samples<'py>(
    cls: &Bound<'py, PyType>,
    samples: &Bound<'py, PyList>,
    keys: Vec<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let samples: Vec<Bound<'py, PyAny>> = samples.iter().collect();
    gather(cls, &samples, &keys, true)
}

/// `gather_samples`; with `check` false, the samples are known to hold `keys` (the buffer
/// served them to an MFC reading those keys), so that is not checked again.
pub(crate) fn gather<'py>(
    cls: &Bound<'py, PyType>,
    samples: &[Bound<'py, PyAny>],
    keys: &[Bound<'py, PyAny>],
    check: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = cls.py();
    let Some(first) = samples.first() else {
        return Err(PyValueError::new_err("gather of no samples"));
    };
    let name = intern!(py, "keys");
    let mut all_data = true;
    let mut ids = Vec::with_capacity(samples.len());
    let mut seqlens: Vec<Vec<Bound<'py, PyAny>>> = keys
        .iter()
        .map(|_| Vec::with_capacity(samples.len()))
        .collect();
    let metadata = PyDict::new(py);
    for s in samples {
        let own_ids = s.getattr(intern!(py, "ids"))?;
        if check {
            check_keys(s, &own_ids, keys)?;
        }
        extend(&mut ids, &own_ids)?;
        let lens = s.getattr(intern!(py, "seqlens"))?;
        for (k, out) in keys.iter().zip(seqlens.iter_mut()) {
            extend(out, &lens.get_item(k)?)?;
        }
        // Once one sample has no data, the others' do not matter (metadata-only samples, the
        // usual case, are read once each).
        all_data = all_data && !s.getattr(intern!(py, "data"))?.is_none();
        let meta = s.getattr(intern!(py, "metadata"))?;
        if meta.is_truthy()? {
            // Another mapping type: left to the Python method.
            let Ok(meta) = meta.cast::<PyDict>() else {
                return Ok(None);
            };
            for (mk, mv) in meta.iter() {
                let list = match metadata.get_item(&mk)? {
                    Some(list) => list,
                    None => {
                        let list = PyList::empty(py).into_any();
                        metadata.set_item(&mk, &list)?;
                        list
                    }
                };
                list.call_method1(intern!(py, "extend"), (mv,))?;
            }
        }
    }
    // A sample without some metadata key (its values would sit at the next sample's
    // place): left to the Python method, which aligns them with Nones.
    for (_, list) in metadata.iter() {
        if list.len()? != ids.len() {
            return Ok(None);
        }
    }
    if all_data {
        return Ok(None);
    }
    let (lens, shapes, dtypes) = (PyDict::new(py), PyDict::new(py), PyDict::new(py));
    let first_shapes = first.getattr(intern!(py, "trailing_shapes"))?;
    let first_dtypes = first.getattr(intern!(py, "dtypes"))?;
    let empty = PyTuple::empty(py);
    for (k, out) in keys.iter().zip(seqlens) {
        lens.set_item(k, PyList::new(py, out)?)?;
        shapes.set_item(
            k,
            first_shapes.call_method1(intern!(py, "get"), (k, &empty))?,
        )?;
        dtypes.set_item(k, first_dtypes.call_method1(intern!(py, "get"), (k,))?)?;
    }
    let out = cls.call_method1(intern!(py, "__new__"), (cls,))?;
    out.setattr(name, PySet::new(py, keys)?)?;
    out.setattr(intern!(py, "ids"), PyList::new(py, ids)?)?;
    out.setattr(intern!(py, "seqlens"), lens)?;
    out.setattr(intern!(py, "trailing_shapes"), shapes)?;
    out.setattr(intern!(py, "dtypes"), dtypes)?;
    out.setattr(intern!(py, "data"), py.None())?;
    out.setattr(intern!(py, "metadata"), metadata)?;
    Ok(Some(out))
}

/// `KeyError` naming the sample and the keys it lacks, as the Python method raises.
fn check_keys(
    sample: &Bound<'_, PyAny>,
    ids: &Bound<'_, PyAny>,
    keys: &[Bound<'_, PyAny>],
) -> PyResult<()> {
    let py = sample.py();
    let held = sample.getattr(intern!(py, "keys"))?;
    let mut missing = Vec::new();
    for k in keys {
        if !held.contains(k)? {
            missing.push(k.clone());
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(PyKeyError::new_err(format!(
        "sample {} has no key(s) {}",
        PyList::new(py, ids.try_iter()?.collect::<PyResult<Vec<_>>>()?)?.repr()?,
        PyList::new(py, missing)?.repr()?
    )))
}

/// Appends the items of `seq` (a list, usually) to `out`.
fn extend<'py>(out: &mut Vec<Bound<'py, PyAny>>, seq: &Bound<'py, PyAny>) -> PyResult<()> {
    if let Ok(list) = seq.cast::<PyList>() {
        out.extend(list.iter());
        return Ok(());
    }
    for item in seq.try_iter()? {
        out.push(item?);
    }
    Ok(())
}
