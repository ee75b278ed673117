//! `ParquetSpill`: spill segments as Parquet files on a [`Store`] (the buffer's
//! `SpillStore`).
//!
//! A segment is `spill/<id>.parquet`, one row per spilled sample and one binary column
//! per field name (the tensor in the crate's encoding, null where the sample lacks the
//! field). Columns are zstd-compressed, except those a sample shows zstd cannot shrink,
//! which are stored plain. Row groups are small (about 2 MiB), so a read fetches only
//! the column chunks of the RPC's input fields in the row groups holding the rows asked
//! for: ranged GETs, never the whole file. The footer of every segment written here is
//! kept in memory, so a read costs no footer round trip; a segment written by an earlier
//! process has its footer fetched on first use.
//!
//! This folder is the storage side of spilling; the buffer's side (what spills when, loads,
//! read-ahead, hand-over of freed samples) is `buffer/spill/`, and `docs/spill.md` is the
//! design of both with its measurements.

mod checks;
mod encode;
mod layout;
mod pages;
mod read;
mod shapes;
#[cfg(test)]
mod shapes_tests;
mod thrift;
mod value;

pub(crate) use checks::{check_chunk_pages, check_metadata, footer_metadata, metadata_range};

#[cfg(feature = "fuzzing")]
pub(crate) use value::take_tensor_padded;

use crate::buffer::{Segment, SpillFuture, SpillStore};
use crate::error::{Result, StorageKind};
use crate::persist::buffer_pool::BufferPool;
use crate::persist::store::{storage_err, storage_msg, Store};
use crate::sample::{FieldKey, Fields};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use encode::encode;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use read::{fetch_footer, read_rows};
use std::collections::HashMap;
use std::path::PathBuf;

/// The folder of spill segments inside a store.
pub(crate) const SPILL_DIR: &str = "spill";

/// Spill segments as Parquet files under `spill/` of a store.
#[derive(Debug)]
pub(crate) struct ParquetSpill {
    store: Store,
    /// The id the next segment gets (shared with writes in flight, which move it past
    /// the segments they find in the store).
    next: Arc<AtomicU64>,
    /// Per segment, its footer and the Arrow schema read from it.
    footers: Arc<Mutex<HashMap<u64, ArrowReaderMetadata>>>,
    /// A directory this store owns and removes when dropped.
    temporary: Option<PathBuf>,
    /// Buffers for decompressed pages, which loaded tensors view.
    pages: Arc<BufferPool>,
}

impl ParquetSpill {
    /// Segments under `spill/` of `store`. Segment ids start from the clock, so a
    /// restarted process does not reuse the names of files an earlier one left; a write
    /// never replaces an existing segment either way (see [`SpillStore::write`] here).
    pub(crate) fn new(store: Store) -> Self {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        Self {
            store,
            next: Arc::new(AtomicU64::new(start)),
            footers: Arc::default(),
            temporary: None,
            pages: Arc::default(),
        }
    }

    /// Segments in a new directory under the system's temporary directory, removed when
    /// the store is dropped (with the buffer).
    pub(crate) fn temporary() -> Result<Self> {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("rollout-buffer-spill-{}-{n}", std::process::id()));
        let url = dir.to_string_lossy().into_owned();
        let mut spill = Self::new(Store::open(&url)?);
        spill.temporary = Some(dir);
        Ok(spill)
    }

    /// Deletes the spill segments no recovered sample needs (`keep`: the ids of those it
    /// does): written but never logged as holding anything, or left by a rewrite or a free
    /// whose delete did not happen before a crash.
    pub(crate) async fn clear_orphans(
        store: &Store,
        keep: &std::collections::BTreeSet<u64>,
    ) -> Result<usize> {
        let mut deleted = 0;
        for path in store.list(SPILL_DIR).await? {
            let id = segment_id(&path);
            if id.is_some_and(|id| keep.contains(&id)) {
                continue;
            }
            store.delete(&path).await?;
            deleted += 1;
        }
        Ok(deleted)
    }
}

impl Drop for ParquetSpill {
    fn drop(&mut self) {
        if let Some(dir) = &self.temporary {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                tracing::warn!(error = %e, dir = %dir.display(), "spill directory not removed");
            }
        }
    }
}

fn segment_path(id: u64) -> String {
    format!("{SPILL_DIR}/{id:020}.parquet")
}

/// Highest id of a segment under `spill/` of `store` (0 if none).
async fn highest_segment(store: &Store) -> Result<u64> {
    Ok(store
        .list(SPILL_DIR)
        .await?
        .iter()
        .filter_map(|path| segment_id(path))
        .max()
        .unwrap_or(0))
}

/// The id in a segment's path (`spill/<id>.parquet`), if it is one.
fn segment_id(path: &str) -> Option<u64> {
    path.strip_prefix(SPILL_DIR)?
        .strip_prefix('/')?
        .strip_suffix(".parquet")?
        .parse()
        .ok()
}

/// Writes a segment tries before giving up when every id it takes is already in the
/// store (another process writing segments into the same folder).
const WRITE_ATTEMPTS: usize = 3;

impl SpillStore for ParquetSpill {
    /// Writes a new segment, never replacing one: the object is created only if its name
    /// is free. A taken name (ids come from the clock, and a process resumed on a machine
    /// whose clock is behind the last one's would take names of segments live samples
    /// need) moves the ids past every segment in the store, and the write tries again.
    fn write(&self, rows: Vec<Fields>) -> SpillFuture<Arc<Segment>> {
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let next = Arc::clone(&self.next);
        let store = self.store.clone();
        let footers = Arc::clone(&self.footers);
        Box::pin(async move {
            let n = rows.len() as u32;
            let encode_path = segment_path(first);
            let url = store.url().to_owned();
            let encoded = tokio::task::spawn_blocking(move || encode(&rows))
                .await
                .map_err(|e| storage_err(&url, &encode_path, e))?
                .map_err(|e| storage_msg(&url, &encode_path, StorageKind::Other, e))?;
            let (bytes, footer) = encoded;
            let mut id = first;
            let mut attempt = 1;
            loop {
                let path = segment_path(id);
                // An object already there holding these bytes is this write's own: a put
                // that landed but whose reply was lost, retried by the client and refused
                // as a taken name (the log's writes treat theirs the same way). Taking a
                // new name then would leave it behind, needed by no one.
                // A put that failed may have landed all the same (its reply was lost and
                // the client gave up): an object holding these bytes is this write's,
                // which returning the error would leave behind, needed by no one.
                let created = match store.put_if_absent(&path, bytes.clone()).await {
                    Ok(created) => created,
                    Err(e) => match store.get(&path).await {
                        Ok(Some(old)) if old == bytes => true,
                        _ => return Err(e),
                    },
                };
                if created || store.get(&path).await?.is_some_and(|old| old == bytes) {
                    footers.lock().insert(id, footer);
                    return Ok(Arc::new(Segment { id, path, rows: n }));
                }
                if attempt == WRITE_ATTEMPTS {
                    return Err(storage_msg(
                        store.url(),
                        &path,
                        StorageKind::AlreadyExists,
                        format!("spill segment names taken {WRITE_ATTEMPTS} times in a row: is another buffer spilling into this folder?"),
                    ));
                }
                tracing::warn!(
                    store = store.url(),
                    segment = id,
                    "spill segment name already taken; moving segment ids past the store's"
                );
                next.fetch_max(
                    highest_segment(&store).await?.saturating_add(1),
                    Ordering::Relaxed,
                );
                id = next.fetch_add(1, Ordering::Relaxed);
                attempt += 1;
            }
        })
    }

    fn read(
        &self,
        segment: Arc<Segment>,
        rows: Vec<u32>,
        keys: Vec<FieldKey>,
    ) -> SpillFuture<Vec<Fields>> {
        let store = self.store.clone();
        let footer = self.footers.lock().get(&segment.id).cloned();
        let footers = Arc::clone(&self.footers);
        let pages = Arc::clone(&self.pages);
        Box::pin(async move {
            let footer = match footer {
                Some(f) => f,
                None => {
                    let f = fetch_footer(&store, &segment.path).await?;
                    footers.lock().insert(segment.id, f.clone());
                    f
                }
            };
            read_rows(&store, &segment.path, footer, &rows, &keys, &pages).await
        })
    }

    fn segment(&self, id: u64, rows: u32) -> Arc<Segment> {
        // Ids are never reused in a process (footers and loads are keyed by them), even
        // once this segment is deleted.
        self.next.fetch_max(id.saturating_add(1), Ordering::Relaxed);
        Arc::new(Segment {
            id,
            path: segment_path(id),
            rows,
        })
    }

    fn delete(&self, segment: Arc<Segment>) -> SpillFuture<()> {
        self.footers.lock().remove(&segment.id);
        let store = self.store.clone();
        Box::pin(async move { store.delete(&segment.path).await })
    }
}

#[cfg(test)]
mod tests;
