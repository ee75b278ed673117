//! Storage: where a buffer's files live, and the Parquet archive of consumed samples.
//!
//! * `store.rs`: [`Store`], one `object_store` backend chosen by URL (`memory://`,
//!   `file:///path` or a bare path, `s3://`, `gs://`, `az://`) plus a prefix inside it;
//!   the only place that talks to `object_store`.
//! * `archive.rs`: [`ArchiveWriter`], a hive-partitioned, zstd-compressed Parquet dataset of
//!   samples that left the buffer, readable by pyarrow, DuckDB and Polars without this
//!   crate;
//! * `archiver.rs`: [`Archiver`], the background task that batches the buffer's consumed
//!   samples (it is the buffer's `FreedSink`) and writes them with an `ArchiveWriter`.
//!
//! Nothing here knows about slots or leases; the buffer hands it whole samples through the
//! `FreedSink` trait it defines, and never imports this module.

mod archive;
mod archiver;
mod store;

pub use archive::{ArchiveWriter, ArchivedSample, ExitReason};
pub use archiver::{ArchiveOptions, Archiver};
pub use store::Store;
