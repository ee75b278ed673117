//! Samples as Arrow record batches, in the types a pandas, Polars or DuckDB user expects.
//!
//! One row per sample. Columns:
//!
//! * `id` (utf8) and `birth` (uint64, null when not assigned yet);
//! * one column per field name: a scalar tensor becomes a primitive column (`float64` for a
//!   reward), a tensor of `n` dimensions `n` nested lists (`list<int32>` for tokens,
//!   `list<float32>` for logprobs), and a ragged tensor one more list level for its
//!   sequences (`list<list<int32>>` for several answers of one prompt);
//! * one column per metadata key: `int64`, `float64`, `utf8` or `bool`.
//!
//! A sample that lacks a field or metadata key has a null there. Each column's Arrow field
//! metadata records what it holds (`rollout_buffer.role` = `field` or `meta`, and for fields
//! `rollout_buffer.ndim` and `rollout_buffer.ragged`), so [`from_record_batch`] rebuilds the
//! samples exactly; columns without it (written by another tool) are read as fields, with
//! nesting depth as the number of dimensions.
//!
//! Shapes round-trip except that an empty dimension hides the ones inside it (a `[0, 5]`
//! tensor comes back as `[0, 0]`): nested lists have no rows to carry them.

mod elements;
mod read;
mod write;

pub use read::from_record_batch;
pub use write::to_record_batch;

/// Re-exported so callers use the same Arrow version.
pub use arrow_array::{self, RecordBatch};
/// Re-exported so callers use the same Arrow version.
pub use arrow_schema;

/// Field metadata key: `field` or [`META_ROLE`].
pub(crate) const ROLE: &str = "rollout_buffer.role";
/// The [`ROLE`] of a metadata column.
pub(crate) const META_ROLE: &str = "meta";
/// Field metadata key: the tensor's number of dimensions (of its values, when ragged).
pub(crate) const NDIM: &str = "rollout_buffer.ndim";
/// Field metadata key: `true` for ragged tensors.
pub(crate) const RAGGED: &str = "rollout_buffer.ragged";

/// The reserved column names.
pub(crate) const ID: &str = "id";
pub(crate) const BIRTH: &str = "birth";
