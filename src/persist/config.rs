//! Where the storage layer plugs into an in-memory buffer's configuration: the spill store
//! of a buffer with a memory budget. The buffer owns the `SpillStore` trait and never names
//! an implementation; this file chooses [`ParquetSpill`] for it, on the store the user
//! names or in a temporary directory.

use super::spill::ParquetSpill;
use super::store::Store;
use crate::buffer::{BufferConfig, SequenceBuffer};
use crate::error::Result;
use crate::sync::Arc;

impl BufferConfig {
    /// Where spill segments go (under `spill/` of `store`), for a buffer with a
    /// [`memory_budget`](Self::memory_budget). Any object store works: local disk, S3,
    /// GCS, Azure.
    pub fn spill_to(mut self, store: Store) -> Self {
        self.spill_store = Some(Arc::new(ParquetSpill::new(store)));
        self
    }
}

impl SequenceBuffer {
    /// A buffer built from a full configuration. A [memory budget] without a spill store
    /// set by [`BufferConfig::spill_to`] spills to a fresh directory under the system's
    /// temporary directory, removed with the buffer.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCapacity`](crate::Error::InvalidCapacity), the validation errors of
    /// the RPC graph ([`Error::DuplicateRpc`](crate::Error::DuplicateRpc),
    /// [`Error::CyclicGraph`](crate::Error::CyclicGraph), ...), and
    /// [`Error::Storage`](crate::Error::Storage) when the temporary spill directory cannot
    /// be made.
    ///
    /// [memory budget]: BufferConfig::memory_budget
    pub fn with_config(mut config: BufferConfig) -> Result<Self> {
        if config.memory_budget.is_some() && config.spill_store.is_none() {
            config.spill_store = Some(Arc::new(ParquetSpill::temporary()?));
        }
        Self::build(config, false)
    }
}
