//! Storage: where a buffer's files live, and the Parquet archive of consumed samples.
//!
//! * `store.rs`: [`Store`], one `object_store` backend chosen by URL (`memory://`,
//!   `file:///path` or a bare path, `s3://`, `gs://`, `az://`) plus a prefix inside it;
//!   the only place that talks to `object_store`.
//! * `archive.rs`: [`ArchiveWriter`], a hive-partitioned, zstd-compressed Parquet dataset of
//!   samples that left the buffer, readable by pyarrow, DuckDB and Polars without this
//!   crate.
//!
//! Nothing here knows about slots or leases; the buffer hands it whole samples.

mod archive;
mod store;

pub use archive::{ArchiveWriter, ArchivedSample, ExitReason};
pub use store::Store;
