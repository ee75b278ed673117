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
use crate::error::{Error, Result};
use crate::sync::Arc;
use arrow_array::{new_null_array, ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema, SchemaRef};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;

/// Where the schema is kept, relative to the store.
pub(crate) const SCHEMA_FILE: &str = "archive_schema.parquet";

/// Present while the archive's earlier files are rewritten with the columns it gained
/// (`ArchiveWriter::widen`), so a writer after a crash finishes the rewrite.
pub(crate) const WIDENING_FILE: &str = "archive_schema.widening";

/// `known` with the columns of `batch` it lacks appended (nullable); `known` itself when
/// it has them all.
///
/// # Errors
///
/// [`Error::Arrow`] naming a column whose type differs from the one archived before.
pub(crate) fn merge(known: Option<&SchemaRef>, batch: &Schema) -> Result<SchemaRef> {
    let mut fields: Vec<Field> = known
        .map(|s| s.fields().iter().map(|f| f.as_ref().clone()).collect())
        .unwrap_or_default();
    let before = fields.len();
    for f in batch.fields() {
        match fields.iter().find(|k| k.name() == f.name()) {
            Some(k) if k.data_type() != f.data_type() => {
                return Err(Error::Arrow {
                    column: f.name().clone(),
                    detail: format!(
                        "archived as {} before, now {}: one archive keeps one type per column",
                        k.data_type(),
                        f.data_type()
                    ),
                })
            }
            Some(_) => {}
            None => fields.push(f.as_ref().clone().with_nullable(true)),
        }
    }
    match known {
        Some(k) if fields.len() == before => Ok(Arc::clone(k)),
        _ => Ok(Arc::new(Schema::new(fields))),
    }
}

/// Whether a file of columns `file` is to be widened to `schema`: it has fewer columns,
/// and each of its columns is in `schema` with the same type (so conforming it to
/// `schema` drops nothing).
pub(crate) fn widens(file: &Schema, schema: &Schema) -> bool {
    file.fields().len() < schema.fields().len()
        && file.fields().iter().all(|f| {
            schema
                .field_with_name(f.name())
                .is_ok_and(|k| k.data_type() == f.data_type())
        })
}

/// `batch` with `schema`'s columns in its order, nulls for those it lacks.
///
/// # Errors
///
/// [`Error::Arrow`] if `schema` does not cover `batch` (a caller's bug: merge first).
pub(crate) fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| {
            batch
                .column_by_name(f.name())
                .cloned()
                .unwrap_or_else(|| new_null_array(f.data_type(), n))
        })
        .collect();
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
    for path in store.list("archive").await? {
        if !path.ends_with(".parquet") {
            continue;
        }
        let Some(bytes) = store.get(&path).await? else {
            continue;
        };
        match decode(bytes) {
            Ok(s)
                if widest
                    .as_ref()
                    .is_none_or(|w| s.fields().len() > w.fields().len()) =>
            {
                widest = Some(s);
            }
            Ok(_) => {}
            Err(detail) => tracing::warn!(path, detail, "an unreadable archive file is skipped"),
        }
    }
    Ok(widest)
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
