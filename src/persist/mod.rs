//! Storage: where a buffer's files live, the write-ahead log and checkpoints that make it
//! survive a crash, and the Parquet archive of consumed samples.
//!
//! Layout under a store's root:
//!
//! ```text
//! wal/<seq>.log                  group commits of log records (see `log.rs`)
//! segments/seg-<hash>.parquet    checkpointed samples (see `checkpoint.rs`)
//! manifest/<number>.json         the current checkpoint: segments and where the log resumes
//! spill/<id>.parquet             payloads spilled under a memory budget (see `spill/`)
//! archive/environment=<e>/policy_version=<v>/part-<hash>.parquet   consumed samples
//! archive_schema.parquet         the archive's columns (no rows)
//! damaged/<n>/...                files a repair moved aside, and its report.json
//! ```
//!
//! * `store.rs`: [`Store`], one `object_store` backend chosen by URL; the only place that
//!   talks to `object_store`; `local_read.rs`: its ranged reads on local disk;
//!   `buffer_pool.rs`: the reused buffers they (and decompressed spill pages) go into.
//! * `codec/`: the binary encoding of samples and tensors (`mod.rs`) and of log records
//!   (`record.rs`); `log.rs`: log group files.
//! * `wal.rs`: the buffer's journal ([`Durability`]) and its writer task;
//!   `state.rs`: the durable contents the log describes; `checkpoint.rs`: segments and
//!   manifests; `checkpointer.rs`: the writer's checkpoint task, which keeps the state the
//!   log describes as each group is stored and writes it out as checkpoints; `recover.rs` and `open.rs`: [`SequenceBuffer::open`](crate::SequenceBuffer::open);
//!   `repair.rs`: [`repair`], salvaging a store strict recovery refuses.
//! * `spill/`: the Parquet spill segments of a buffer with a memory budget (the buffer's
//!   `SpillStore`): `encode.rs` writes them, `layout.rs` places their plain chunks (8-byte
//!   aligned values), `read.rs` reads rows back, `pages.rs` decodes the pages this crate
//!   writes without Parquet's reader, `value.rs` pads values; `config.rs` wires a spill
//!   store into [`BufferConfig`](crate::BufferConfig) and `SequenceBuffer::with_config`.
//! * `inspect.rs`: [`inspect`] and [`archive_tail`], read-only summaries of a stored run.
//! * `archive_schema.rs`: the one schema every archive file carries.
//! * `archive.rs`: [`ArchiveWriter`], the hive-partitioned, zstd-compressed Parquet dataset
//!   of samples that left the buffer; `archiver.rs`: [`Archiver`], the background task that
//!   batches them (the buffer's `FreedSink`).
//!
//! The buffer defines the `Journal`, `FreedSink` and `SpillStore` traits this module
//! implements, and never imports it.

mod archive;
mod archive_schema;
mod archiver;
mod buffer_pool;
mod checkpoint;
mod checkpointer;
mod codec;
mod config;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod inspect;
#[cfg(unix)]
mod local_read;
mod log;
mod open;
mod recover;
#[cfg(unix)]
mod recycle;
mod repair;
mod spill;
mod state;
mod store;
mod wal;

pub use archive::{ArchiveWriter, ArchivedSample};
pub use archiver::{ArchiveOptions, Archiver};
pub use inspect::{
    archive_tail, inspect, ArchivePartition, CheckpointSummary, PartitionSummary, RpcSummary,
    StoreSummary,
};
pub use open::{PersistOptions, RecoveryMode};
pub use repair::{repair, MovedFile, RepairReport};
pub use store::{Listed, Store};
pub use wal::Durability;
