//! The columnar data plane: many samples per call, no Python object per sample.
//!
//! In (`put_columns`, `Batch.complete_columns`, `amend_columns`), one row per sample:
//!
//! | column | becomes |
//! | --- | --- |
//! | numpy array `[n, ...]` | each sample's `[...]` field (a scalar for `[n]`); the array is copied once, into one buffer its rows view |
//! | `(values, offsets)` | sample `i` gets `values[offsets[i]:offsets[i+1]]` (a variable-length field), same single copy |
//! | list of `n` arrays | one array per sample (copied one by one) |
//! | list of `n` str | a string per sample |
//! | anything exporting Arrow | the same, column by column: numbers, `bool`, strings, fixed-size and variable-size lists of them; other nestings through the crate's Arrow layout |
//!
//! Arrow columns are read in `arrow_columns.rs`. Every check happens before anything is stored, and a failed one is a `ValueError` naming
//! the column (and the row, where one is at fault): unequal lengths, unsupported dtypes,
//! bad offsets, nulls, missing or repeated ids, columns no RPC declares.
//!
//! Out (`Batch.columns()`): one numpy array per field, `[n, ...]` when every sample's field
//! has one shape, else `(values, offsets)`; numbers view the buffer's memory when the
//! batch's fields are adjacent rows of one put (the common case: a batch of what one
//! `put_columns` stored, in order), else are copied once. Strings come as lists, ragged
//! fields as one list of sequence views per sample.

use crate::arrays::{as_numpy, no_masked, tensor_from_numpy, tensor_to_numpy};
use crate::arrow_columns::{
    arrow_births, arrow_column_rows, arrow_ids, arrow_meta, arrow_rows, concat_batches,
    no_arrow_nulls,
};
use crate::column_keys::{py_births, py_ids, py_meta};
use crate::convert::{at, string_from_py};
use crate::rpc::RESERVED;
use numpy::{PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use rollout_buffer::{DType, FieldKey, MetaValue, Patch, Sample, SampleId, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// Columns read from Python, checked and cut into rows.
pub(crate) struct Columns {
    /// Rows (samples).
    pub(crate) n: usize,
    /// Field name, then one tensor per row.
    fields: Vec<(FieldKey, Vec<Tensor>)>,
    /// Metadata key, then one value per row.
    meta: Vec<(String, Vec<MetaValue>)>,
    ids: Option<Vec<SampleId>>,
    births: Option<Vec<u64>>,
}

/// What the columns are for: a put needs ids, outputs and patches do not.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Put,
    Patch,
}

pub(crate) fn bad(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

impl Columns {
    /// Reads `obj` (a dict of columns or an Arrow exporter), with ids from `ids` or an
    /// `id` column and metadata from `meta` (a dict of columns, or names of columns of
    /// `obj`). `keys` are the names fields may have; `rows`, when given, the number of
    /// rows expected (a batch's size).
    pub(crate) fn read(
        obj: &Bound<'_, PyAny>,
        ids: Option<&Bound<'_, PyAny>>,
        meta: Option<&Bound<'_, PyAny>>,
        role: Role,
        keys: &[&str],
        rows: Option<usize>,
    ) -> PyResult<Self> {
        let mut cols = Columns {
            n: 0,
            fields: Vec::new(),
            meta: Vec::new(),
            ids: None,
            births: None,
        };
        let mut lengths: Vec<(String, usize)> = Vec::new();
        let meta_names: Vec<String> = match meta {
            Some(m) if !m.is_instance_of::<PyDict>() => m
                .extract()
                .map_err(|_| bad("meta: a dict of columns, or a list of column names".into()))?,
            _ => Vec::new(),
        };
        if let Some(name) = meta_names.iter().find(|m| RESERVED.contains(&m.as_str())) {
            return Err(bad(format!(
                "meta: {name:?} is the samples' own {name}, not metadata"
            )));
        }
        let mut id_column: Option<Vec<SampleId>> = None;
        if let Some(imported) = crate::arrow::import_batches(obj) {
            let (schema, batches) = imported?;
            let batch = concat_batches(schema, batches)?;
            let schema = batch.schema();
            let mut seen = std::collections::HashSet::new();
            for (field, column) in schema.fields().iter().zip(batch.columns()) {
                let name = field.name().as_str();
                if !seen.insert(name) {
                    return Err(bad(format!("column {name:?} appears twice")));
                }
                let column = column.as_ref();
                // Columns `Batch.to_arrow()` marks as metadata, or a container's own.
                let marked = field
                    .metadata()
                    .get("rollout_buffer.role")
                    .map(String::as_str);
                if marked == Some("archive") {
                    continue;
                }
                lengths.push((format!("column {name:?}"), column.len()));
                match name {
                    "id" if role == Role::Put => id_column = Some(arrow_ids(column)?),
                    "birth" if role == Role::Put => cols.births = Some(arrow_births(column)?),
                    _ if marked == Some("meta") || meta_names.iter().any(|m| m == name) => {
                        cols.meta.push((name.to_owned(), arrow_meta(name, column)?));
                    }
                    _ => {
                        check_key(name, keys, role)?;
                        let rows = arrow_rows(name, field, column, &batch)?;
                        cols.fields
                            .push((FieldKey::from(Arc::<str>::from(name)), rows));
                    }
                }
            }
        } else {
            let dict = obj.cast::<PyDict>().map_err(|_| {
                bad("columns: a dict of columns, or an object exporting Arrow \
                     (__arrow_c_stream__ / __arrow_c_array__)"
                    .into())
            })?;
            for (k, v) in dict.iter() {
                let name: String = k
                    .extract()
                    .map_err(|_| bad("columns: names must be str".into()))?;
                match name.as_str() {
                    "id" if role == Role::Put => {
                        let ids = py_ids(&v)?;
                        lengths.push(("column \"id\"".into(), ids.len()));
                        id_column = Some(ids);
                    }
                    "birth" if role == Role::Put => {
                        let births = py_births(&v)?;
                        lengths.push(("column \"birth\"".into(), births.len()));
                        cols.births = Some(births);
                    }
                    _ if meta_names.contains(&name) => {
                        let values = py_meta(&name, &v)?;
                        lengths.push((format!("column {name:?}"), values.len()));
                        cols.meta.push((name, values));
                    }
                    _ => {
                        check_key(&name, keys, role)?;
                        let rows = py_rows(&name, &v)?;
                        lengths.push((format!("column {name:?}"), rows.len()));
                        cols.fields.push((FieldKey::from(name), rows));
                    }
                }
            }
        }
        for name in &meta_names {
            if !cols.meta.iter().any(|(m, _)| m == name) {
                return Err(bad(format!("meta: no column named {name:?}")));
            }
        }
        if let Some(m) = meta.filter(|m| m.is_instance_of::<PyDict>()) {
            for (k, v) in m.cast::<PyDict>()?.iter() {
                let name: String = k
                    .extract()
                    .map_err(|_| bad("meta: names must be str".into()))?;
                if RESERVED.contains(&name.as_str()) {
                    return Err(bad(format!(
                        "meta: {name:?} is the samples' own {name}, not metadata"
                    )));
                }
                if cols.fields.iter().any(|(f, _)| f.as_str() == name) {
                    return Err(bad(format!(
                        "meta {name:?} is also a column of fields: one name, one role"
                    )));
                }
                let values = py_meta(&name, &v)?;
                lengths.push((format!("meta {name:?}"), values.len()));
                cols.meta.push((name, values));
            }
        }
        if role == Role::Put {
            let ids = match (ids, id_column) {
                (Some(_), Some(_)) => {
                    return Err(bad(
                        "ids given twice: as ids=... and as an \"id\" column".into()
                    ))
                }
                (Some(ids), None) => {
                    let ids = py_ids(ids)?;
                    lengths.push(("ids".into(), ids.len()));
                    ids
                }
                (None, Some(ids)) => ids,
                (None, None) => {
                    return Err(bad(
                        "no ids: pass ids=... or an \"id\" column (one per sample)".into(),
                    ))
                }
            };
            check_unique(&ids)?;
            cols.ids = Some(ids);
        }
        cols.n = check_lengths(&lengths, rows)?;
        Ok(cols)
    }

    /// The rows as samples (a put).
    pub(crate) fn into_samples(self) -> Vec<Sample> {
        let mut births = self.births.map(Vec::into_iter);
        let mut fields: Vec<_> = self
            .fields
            .into_iter()
            .map(|(k, rows)| (k, rows.into_iter()))
            .collect();
        let mut meta: Vec<_> = self
            .meta
            .into_iter()
            .map(|(k, values)| (k, values.into_iter()))
            .collect();
        let ids = self.ids.unwrap_or_default();
        ids.into_iter()
            .map(|id| {
                let mut s = Sample::new(id);
                if let Some(b) = births.as_mut().and_then(Iterator::next) {
                    s = s.birth(b);
                }
                for (k, rows) in &mut fields {
                    if let Some(t) = rows.next() {
                        s = s.with(k.clone(), t);
                    }
                }
                for (k, values) in &mut meta {
                    if let Some(v) = values.next() {
                        s = s.meta(k, v);
                    }
                }
                s
            })
            .collect()
    }

    /// The rows as patches (outputs of a batch, amends), each with its fields and its
    /// metadata (a column `to_arrow()` marks as metadata was dropped without a word).
    pub(crate) fn into_patches(self) -> Vec<Patch> {
        let mut fields: Vec<_> = self
            .fields
            .into_iter()
            .map(|(k, rows)| (k, rows.into_iter()))
            .collect();
        let mut meta: Vec<_> = self
            .meta
            .into_iter()
            .map(|(k, values)| (k, values.into_iter()))
            .collect();
        (0..self.n)
            .map(|_| {
                let mut p = Patch::new();
                for (k, rows) in &mut fields {
                    if let Some(t) = rows.next() {
                        p = p.with(k.clone(), t);
                    }
                }
                for (k, values) in &mut meta {
                    if let Some(v) = values.next() {
                        p = p.meta(k, v);
                    }
                }
                p
            })
            .collect()
    }
}

/// Every length equal (and equal to `rows`, when given); the common length.
fn check_lengths(lengths: &[(String, usize)], rows: Option<usize>) -> PyResult<usize> {
    let Some((first, n)) = lengths.first() else {
        return Ok(rows.unwrap_or(0));
    };
    if let Some(rows) = rows.filter(|r| r != n) {
        return Err(bad(format!(
            "{first} has {n} rows, but the batch has {rows} samples"
        )));
    }
    for (label, len) in &lengths[1..] {
        if len != n {
            return Err(bad(format!("{label} has {len} rows, but {first} has {n}")));
        }
    }
    Ok(*n)
}

fn check_key(name: &str, keys: &[&str], role: Role) -> PyResult<()> {
    if keys.is_empty() || keys.contains(&name) {
        return Ok(());
    }
    let keys = keys.join(", ");
    Err(bad(match role {
        Role::Put => format!(
            "column {name:?} is not a key of any RPC (declared: {keys}); pass it in meta= if \
             it is metadata, or declare it as an RPC input, output or external key"
        ),
        // A completion or an amend: a table read back (`to_arrow()`) with a column added
        // carries the ids, births and inputs too.
        Role::Patch if name == "id" || name == "birth" => format!(
            "column {name:?}: a patch's rows follow the samples' order, and ids and births \
             are fixed; leave the column out (this call writes: {keys})"
        ),
        Role::Patch => format!(
            "column {name:?} is not a key this call writes (it writes: {keys}); leave it out, \
             e.g. `table.select([...])`, or mark it as metadata as `to_arrow()` does"
        ),
    }))
}

fn check_unique(ids: &[SampleId]) -> PyResult<()> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(ids.len());
    for (row, id) in ids.iter().enumerate() {
        if let Some(first) = seen.insert(id.as_str(), row) {
            return Err(bad(format!(
                "ids: {:?} appears at rows {first} and {row}",
                id.as_str()
            )));
        }
    }
    Ok(())
}

/// One Python column as one tensor per row.
fn py_rows(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<Tensor>> {
    let what = format!("column {name:?}");
    if as_numpy(obj).is_none() {
        if let Some(column) = crate::arrow::import_column(obj) {
            let (field, chunks) = column?;
            return arrow_column_rows(name, field, chunks);
        }
    }
    no_masked(obj, &what)?;
    // A tuple is always `(values, offsets)`: read as rows when it was not two long, a
    // tuple of two rows was split by the second as offsets.
    if let Ok(pair) = obj.cast::<PyTuple>() {
        if pair.len() != 2 {
            return Err(bad(format!(
                "{what}: a tuple is a ragged column (values, offsets), not {} items; pass \
                 rows as a list",
                pair.len()
            )));
        }
        return offsets_rows(&what, &pair.get_item(0)?, &pair.get_item(1)?);
    }
    if let Ok(list) = obj.cast::<PyList>() {
        for (row, v) in list.iter().enumerate() {
            no_arrow_nulls(&v, &format!("{what}, row {row}"))?;
            no_masked(&v, &format!("{what}, row {row}"))?;
        }
        if list.iter().all(|v| v.is_instance_of::<PyString>()) {
            return list
                .iter()
                .enumerate()
                .map(|(row, v)| {
                    string_from_py(&v, &format!("{what}, row {row}")).map(Tensor::scalar)
                })
                .collect();
        }
        if list.iter().all(|v| as_numpy(&v).is_some()) {
            let rows = list
                .iter()
                .enumerate()
                .map(|(row, v)| {
                    let array = as_numpy(&v).ok_or_else(|| bad(format!("{what}, row {row}")))?;
                    tensor_from_numpy(array, &format!("{what}, row {row}"))
                })
                .collect::<PyResult<Vec<Tensor>>>()?;
            // One column, one element type and number of dimensions: a batch of rows that
            // differ could not be read back as a column.
            if let Some(first) = rows.first() {
                let kind = |t: &Tensor| (t.dtype(), t.shape().len());
                if let Some(row) = rows.iter().position(|t| kind(t) != kind(first)) {
                    return Err(bad(format!(
                        "{what}: row {row} is {:?} {}-d, row 0 {:?} {}-d; every row has one \
                         dtype and number of dimensions",
                        rows[row].dtype(),
                        rows[row].shape().len(),
                        first.dtype(),
                        first.shape().len()
                    )));
                }
            }
            return Ok(rows);
        }
    }
    let array = match as_numpy(obj) {
        Some(a) => a.clone(),
        None => {
            let array = obj
                .py()
                .import("numpy")?
                .call_method1("asarray", (obj,))
                .map_err(|e| at(obj.py(), &what, e))?
                .cast_into()
                .map_err(|_| bad(format!("{what}: not an array")))?;
            no_rounded_ints(&what, obj, &array)?;
            array
        }
    };
    if array.ndim() == 0 {
        return Err(bad(format!(
            "{what} is a single value: a column needs one row per sample"
        )));
    }
    let tensor = tensor_from_numpy(&array, &what)?;
    tensor.rows().ok_or_else(|| {
        bad(format!(
            "{what} is a single value: a column needs one row per sample"
        ))
    })
}

/// Refuses what `numpy.asarray` made of Python numbers when it rounded an integer: a list
/// holding an int past 2^53 beside floats (or past int64) comes back float64, and storing
/// that silently changed the int. A dict put and a metadata column refuse the same.
fn no_rounded_ints(
    what: &str,
    source: &Bound<'_, PyAny>,
    array: &Bound<'_, PyUntypedArray>,
) -> PyResult<()> {
    if as_numpy(source).is_some() || array.dtype().kind() != b'f' {
        return Ok(());
    }
    match first_inexact_int(source)? {
        Some(at) => Err(bad(format!(
            "{what}: the integer at {at} is past 2^53 (or int64), and numpy would round it \
             into a float; pass a numpy array of the dtype meant"
        ))),
        None => Ok(()),
    }
}

/// Where, in nested lists and tuples, the first integer a float64 cannot hold exactly is
/// (as `[i][j]`).
fn first_inexact_int(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        for (i, item) in obj.try_iter()?.enumerate() {
            if let Some(rest) = first_inexact_int(&item?)? {
                return Ok(Some(format!("[{i}]{rest}")));
            }
        }
        return Ok(None);
    }
    if obj.is_instance_of::<PyBool>() || obj.is_instance_of::<PyFloat>() {
        return Ok(None);
    }
    // An integer array among the rows (`[np.array([2**60 + 1]), [0.5]]`): its values.
    if let Some(array) = as_numpy(obj) {
        if matches!(array.dtype().kind(), b'i' | b'u') {
            return first_inexact_int(&obj.call_method0("tolist")?);
        }
        return Ok(None);
    }
    // Python ints and numpy integers alike (both have `__index__`).
    let inexact = match obj.extract::<i128>() {
        Ok(i) => i.unsigned_abs() > 1 << 53,
        Err(_) => obj.is_instance_of::<PyInt>(),
    };
    Ok(inexact.then(String::new))
}

/// A `(values, offsets)` column: row `i` is `values[offsets[i]:offsets[i + 1]]`.
fn offsets_rows(
    what: &str,
    values: &Bound<'_, PyAny>,
    offsets: &Bound<'_, PyAny>,
) -> PyResult<Vec<Tensor>> {
    no_arrow_nulls(values, &format!("{what}: values"))?;
    no_masked(values, &format!("{what}: values"))?;
    no_masked(offsets, &format!("{what}: offsets"))?;
    let np = values.py().import("numpy")?;
    let source = values;
    let values = np.call_method1("asarray", (values,))?;
    let values =
        as_numpy(&values).ok_or_else(|| bad(format!("{what}: values are not an array")))?;
    no_rounded_ints(&format!("{what}: values"), source, values)?;
    let values = tensor_from_numpy(values, what)?;
    let offsets: Vec<i64> = np
        .call_method1("asarray", (offsets,))?
        .call_method0("tolist")?
        .extract()
        .map_err(|_| bad(format!("{what}: offsets must be one row of integers (1-d)")))?;
    let total = values.shape().first().copied().unwrap_or(0);
    let lengths = lengths_of(what, &offsets, total)?;
    values
        .split(&lengths)
        .ok_or_else(|| bad(format!("{what}: values do not split by these offsets")))
}

/// Row lengths from `offsets` (n + 1 of them, from 0, never decreasing, ending at
/// `total`).
pub(crate) fn lengths_of(what: &str, offsets: &[i64], total: usize) -> PyResult<Vec<usize>> {
    if offsets.first() != Some(&0) {
        return Err(bad(format!("{what}: offsets must start at 0")));
    }
    let mut lengths = Vec::with_capacity(offsets.len().saturating_sub(1));
    for (row, w) in offsets.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(bad(format!(
                "{what}: offsets decrease at row {row} ({} then {})",
                w[0], w[1]
            )));
        }
        lengths.push((w[1] - w[0]) as usize);
    }
    if offsets.last().copied().map(|o| o as usize) != Some(total) {
        return Err(bad(format!(
            "{what}: the last offset must be the number of values, {total}"
        )));
    }
    Ok(lengths)
}

/// A batch's fields as columns (see the module docs).
pub(crate) fn batch_columns<'py>(
    py: Python<'py>,
    batch: &rollout_buffer::Batch,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    let Some(first) = batch.sample(0) else {
        return Ok(out);
    };
    for name in first.keys() {
        let tensors: Option<Vec<&Tensor>> = batch.samples().map(|s| s.get(name)).collect();
        let Some(tensors) = tensors else {
            continue; // not every sample holds it (never an RPC input)
        };
        out.set_item(name, column_to_py(py, name, &tensors)?)?;
    }
    Ok(out)
}

fn column_to_py<'py>(
    py: Python<'py>,
    name: &str,
    tensors: &[&Tensor],
) -> PyResult<Bound<'py, PyAny>> {
    let ragged = tensors.iter().any(|t| t.lengths().is_some());
    if ragged || tensors.iter().any(|t| t.dtype() == DType::Str) {
        let rows = PyList::empty(py);
        for t in tensors {
            rows.append(crate::convert::tensor_to_py(py, t)?)?;
        }
        return Ok(rows.into_any());
    }
    if let Some(stacked) = Tensor::stack(tensors) {
        return tensor_to_numpy(py, &stacked);
    }
    let (values, lengths) = Tensor::concat(tensors).ok_or_else(|| {
        let first = tensors.first().map(|t| (t.dtype(), t.shape().to_vec()));
        let other = tensors
            .iter()
            .position(|t| Some((t.dtype(), t.shape().to_vec())) != first);
        bad(format!(
            "field {name:?}: its samples differ in element type or inner shape (sample 0: \
             {:?}, sample {}: {:?}), so they make no column; read them with samples()",
            first,
            other.unwrap_or(0),
            other
                .and_then(|i| tensors.get(i))
                .map(|t| (t.dtype(), t.shape().to_vec())),
        ))
    })?;
    let mut offsets = Vec::with_capacity(lengths.len() + 1);
    let mut at = 0i64;
    offsets.push(at);
    for l in lengths {
        at += l as i64;
        offsets.push(at);
    }
    let offsets = numpy::PyArray1::from_vec(py, offsets);
    let offsets = offsets.readwrite().make_nonwriteable();
    Ok(PyTuple::new(
        py,
        [tensor_to_numpy(py, &values)?, offsets.as_any().clone()],
    )?
    .into_any())
}
