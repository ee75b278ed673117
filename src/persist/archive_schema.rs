//! One schema for every file of an archive: the columns seen so far, in the order first
//! seen, each nullable. A batch with a column the archive has not had appends it; every
//! file is written with all the columns, nulls where its rows have no value. So readers
//! that want one schema per dataset (Polars' `scan_parquet`) read every file, and none
//! ever sees a column move.
//!
//! The schema lives in `archive_schema.parquet` at the store's root (outside `archive/`,
//! so no reader of the dataset takes it for data): a Parquet file with no rows. It is
//! written before any data file that uses a new column, so a crash never leaves a file
//! with a column the schema lacks; a damaged schema file is rebuilt from the files.
//! Archives written before it existed are left as they are.
//!
//! When a write adds a column, the files written before it are rewritten with it (nulls),
//! so every file of the dataset has the same columns, which Polars' readers require by
//! default (a file with a column the first one lacks is an error to them). A mark,
//! `archive_schema.widening`, is stored before the grown schema and removed once every
//! earlier file is rewritten; a writer that finds it when it loads the schema (after a
//! crash) rewrites what is left. Columns are added rarely (while a run's first rows show
//! which fields and metadata they carry), so the rewrites are few.

use super::store::{storage_err, Store};
use crate::arrow::{META_ROLE, ROLE};
use crate::error::{Error, Result};
use crate::sync::Arc;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{new_null_array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::statistics::Statistics;
use std::collections::HashSet;

/// Where the schema is kept, relative to the store.
pub(crate) const SCHEMA_FILE: &str = "archive_schema.parquet";

/// Present while the archive's earlier files are rewritten with the columns it gained
/// (`ArchiveWriter::widen`), so a writer after a crash finishes the rewrite.
pub(crate) const WIDENING_FILE: &str = "archive_schema.widening";

/// The largest integer magnitude a float64 holds exactly: integers past it are never made
/// floats (a nanosecond timestamp or a 64-bit id would be rounded for good).
pub(crate) const EXACT_IN_F64: i64 = 1 << 53;

/// `known` with the columns of `batch` it lacks appended (nullable), and metadata columns
/// archived as integers made floats if `batch` brings floats (see [`unified`]), unless
/// the column is in `pinned` (its archived integers would not all survive as floats);
/// `known` itself when nothing changes.
///
/// # Errors
///
/// [`Error::Arrow`] naming a column whose type (or role: field or metadata) differs from
/// the one archived before.
pub(crate) fn merge(
    known: Option<&SchemaRef>,
    batch: &Schema,
    pinned: &HashSet<String>,
) -> Result<SchemaRef> {
    let mut fields: Vec<Field> = known
        .map(|s| s.fields().iter().map(|f| f.as_ref().clone()).collect())
        .unwrap_or_default();
    let mut changed = false;
    for f in batch.fields() {
        match fields.iter_mut().find(|k| k.name() == f.name()) {
            Some(k) => match unified(k, f) {
                Some(t) if &t == k.data_type() => {}
                Some(t) if !pinned.contains(k.name()) => {
                    *k = k.clone().with_data_type(t);
                    changed = true;
                }
                _ => {
                    return Err(Error::Arrow {
                        column: f.name().clone(),
                        detail: format!(
                            "archived as {} {} before, now {} {}: one archive keeps one type \
                             per column (integers past 2^53 are never made floats)",
                            role(k).unwrap_or("archive"),
                            k.data_type(),
                            role(f).unwrap_or("archive"),
                            f.data_type()
                        ),
                    })
                }
            },
            None => {
                fields.push(f.as_ref().clone().with_nullable(true));
                changed = true;
            }
        }
    }
    match known {
        Some(k) if !changed => Ok(Arc::clone(k)),
        _ => Ok(Arc::new(Schema::new(fields))),
    }
}

/// The type a column archived as `known` has once a batch brings it as `new`: the same
/// type, or `Float64` for a metadata key that holds integers in some samples and floats in
/// others (a score of 1 here and 0.5 there, as Python callers write them), as a batch's
/// own export makes it. `None`: the types cannot share a column.
fn unified(known: &Field, new: &Field) -> Option<DataType> {
    // A name that is a field in some rows and metadata in others cannot share a column:
    // read back, one kind would come back as the other.
    if role(known) != role(new) {
        return None;
    }
    if known.data_type() == new.data_type() {
        return Some(known.data_type().clone());
    }
    let number = |f: &Field| {
        f.metadata().get(ROLE).is_some_and(|role| role == META_ROLE)
            && matches!(f.data_type(), DataType::Int64 | DataType::Float64)
    };
    (number(known) && number(new)).then_some(DataType::Float64)
}

/// What a column holds (`field`, `meta`), from its Arrow metadata.
fn role(f: &Field) -> Option<&str> {
    f.metadata().get(ROLE).map(String::as_str)
}

/// The columns `grown` makes floats that `known` holds as integers.
pub(crate) fn promoted<'a>(known: Option<&SchemaRef>, grown: &'a Schema) -> Vec<&'a str> {
    let Some(known) = known else {
        return Vec::new();
    };
    grown
        .fields()
        .iter()
        .filter(|f| {
            known
                .field_with_name(f.name())
                .is_ok_and(|k| k.data_type() != f.data_type())
        })
        .map(|f| f.name().as_str())
        .collect()
}

/// Whether every archive file's integers in `column` are within [`EXACT_IN_F64`], by its
/// Parquet statistics (the archive keeps them for every scalar column): a file without
/// them for the column, where it holds it, counts as not. Files that do not read are
/// left out, as the widening leaves them.
///
/// # Errors
///
/// [`Error::Storage`] when listing or reading fails.
pub(crate) async fn exact_as_floats(store: &Store, column: &str) -> Result<bool> {
    for path in store.list("archive").await? {
        if !path.ends_with(".parquet") {
            continue;
        }
        let Some(bytes) = store.get(&path).await? else {
            continue;
        };
        // The Parquet decoder is not panic-free on every malformed file.
        let exact = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            super::spill::footer_metadata(&bytes).ok()?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).ok()?;
            let within =
                |v: Option<&i64>| v.is_some_and(|v| v.unsigned_abs() <= EXACT_IN_F64 as u64);
            let all = builder.metadata().row_groups().iter().all(|rg| {
                rg.columns()
                    .iter()
                    .filter(|c| c.column_path().string() == column)
                    .all(|c| match c.statistics() {
                        Some(Statistics::Int64(v)) => match (v.min_opt(), v.max_opt()) {
                            (None, None) => true, // all null: nothing to round
                            (min, max) => within(min) && within(max),
                        },
                        // Not integers (floats already): nothing to round.
                        Some(_) => true,
                        None => false,
                    })
            });
            Some(all)
        }))
        .ok()
        .flatten();
        if exact == Some(false) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether a file of columns `file` is to be rewritten to `schema`: it lacks some of its
/// columns or holds integers where `schema` now holds floats, and conforming it to
/// `schema` loses nothing (each of its columns is in `schema` with its type or the one it
/// widens to).
pub(crate) fn widens(file: &Schema, schema: &Schema) -> bool {
    let mut retyped = false;
    let fits = file.fields().iter().all(|f| {
        schema.field_with_name(f.name()).is_ok_and(|k| {
            retyped |= k.data_type() != f.data_type();
            unified(k, f).as_ref() == Some(k.data_type())
        })
    });
    fits && (retyped || file.fields().len() < schema.fields().len())
}

/// `batch` with `schema`'s columns in its order, nulls for those it lacks, and integer
/// metadata as floats where `schema` has made the column floats.
///
/// # Errors
///
/// [`Error::Arrow`] if `schema` does not cover `batch` (a caller's bug: merge first).
pub(crate) fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            None => Ok(new_null_array(f.data_type(), n)),
            Some(c) if c.data_type() == f.data_type() => Ok(Arc::clone(c)),
            // An integer column made floats; any other mismatch is left for `try_new` to
            // name.
            Some(c) => match c.as_primitive_opt::<Int64Type>() {
                Some(ints) if f.data_type() == &DataType::Float64 => {
                    if ints
                        .iter()
                        .flatten()
                        .any(|x| x.unsigned_abs() > EXACT_IN_F64 as u64)
                    {
                        return Err(Error::Arrow {
                            column: f.name().clone(),
                            detail: "an integer past 2^53, which this float column would round"
                                .to_owned(),
                        });
                    }
                    let floats: ArrayRef = Arc::new(ints.unary::<_, Float64Type>(|x| x as f64));
                    Ok(floats)
                }
                _ => Ok(Arc::clone(c)),
            },
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    RecordBatch::try_new(Arc::clone(schema), columns).map_err(|e| Error::Arrow {
        column: String::new(),
        detail: format!("conforming an archive batch to the archive's schema: {e}"),
    })
}

/// The schema as a Parquet file without rows.
pub(crate) fn encode(store: &Store, schema: &SchemaRef) -> Result<Bytes> {
    let bad = |e| storage_err(store.url(), SCHEMA_FILE, e);
    let mut buf = Vec::new();
    let writer = ArrowWriter::try_new(&mut buf, Arc::clone(schema), None).map_err(bad)?;
    writer.close().map_err(bad)?;
    Ok(Bytes::from(buf))
}

/// The schema stored in `store`, if any. A damaged schema file (a put torn on a store
/// without atomic writes) is rebuilt from the archive's files: each carries a prefix of the
/// schema, so the widest one is the schema as of the last file written.
///
/// # Errors
///
/// [`Error::Storage`] when reading or listing fails.
pub(crate) async fn load(store: &Store) -> Result<Option<SchemaRef>> {
    let Some(bytes) = store.get(SCHEMA_FILE).await? else {
        return Ok(None);
    };
    match decode(bytes) {
        Ok(schema) => Ok(Some(schema)),
        Err(detail) => {
            tracing::warn!(
                url = store.url(),
                detail,
                "the archive's schema file is damaged; rebuilding it from the archive's files"
            );
            rebuild(store).await
        }
    }
}

async fn rebuild(store: &Store) -> Result<Option<SchemaRef>> {
    let mut widest: Option<SchemaRef> = None;
    // Each file's types too: a metadata column made floats may still be integers in the
    // widest file, if a crash cut the rewrite short.
    let mut all: Vec<SchemaRef> = Vec::new();
    for path in store.list("archive").await? {
        if !path.ends_with(".parquet") {
            continue;
        }
        let Some(bytes) = store.get(&path).await? else {
            continue;
        };
        match decode(bytes) {
            Ok(s) => {
                if widest
                    .as_ref()
                    .is_none_or(|w| s.fields().len() > w.fields().len())
                {
                    widest = Some(Arc::clone(&s));
                }
                all.push(s);
            }
            Err(detail) => tracing::warn!(path, detail, "an unreadable archive file is skipped"),
        }
    }
    // Every file's columns are a prefix of the widest one's: merging adds none, it only
    // makes floats of what any file holds as floats.
    Ok(widest.map(|w| {
        all.iter().fold(w, |acc, s| {
            merge(Some(&acc), s, &HashSet::new()).unwrap_or(acc)
        })
    }))
}

/// The Arrow schema of a Parquet file.
fn decode(bytes: Bytes) -> std::result::Result<SchemaRef, String> {
    // The Parquet decoder is not panic-free on every malformed file.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        // The footer is checked before the reader decodes it (`spill::footer_metadata`).
        super::spill::footer_metadata(&bytes)?;
        ParquetRecordBatchReaderBuilder::try_new(bytes)
            .map(|b| Arc::clone(b.schema()))
            .map_err(|e| e.to_string())
    }))
    .unwrap_or_else(|_| Err("the Parquet decoder failed on this file".to_owned()))
}
