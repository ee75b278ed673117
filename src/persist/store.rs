//! `Store`: an `object_store` backend chosen by URL, and a prefix inside it.
//!
//! Credentials and endpoints come from the environment variables each backend documents
//! (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`,
//! `AZURE_STORAGE_ACCOUNT_NAME`, ...). Two code paths special-case the local disk beyond
//! choosing `LocalFileSystem` for it: reads, which go into pooled buffers of their own
//! (`local_read.rs`) instead of `object_store`'s fresh zero-filled ones; and deletes and
//! writes, which recycle files instead of freeing and creating one each time
//! (`recycle.rs`). Both fall back to `object_store` for anything they do not handle.

#[cfg(unix)]
use super::buffer_pool::BufferPool;
#[cfg(unix)]
use super::recycle::Recycler;
use crate::error::{Error, ErrorSource, Result, StorageKind};
use crate::sync::{Arc, Mutex};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::{Path, PathPart};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::fmt;
use std::ops::Range;

/// An object found by [`Store::list_sized`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listed {
    /// Its path, relative to the store.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written.
    pub modified: std::time::SystemTime,
}

/// A place to keep files: an object store and a prefix inside it. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    prefix: Path,
    url: Arc<str>,
    /// On local disk: see [`Local`].
    #[cfg(unix)]
    local: Option<Arc<Local>>,
}

/// What a store on local disk keeps besides `object_store`'s backend; shared by clones.
#[cfg(unix)]
#[derive(Debug)]
struct Local {
    /// The filesystem, for its paths.
    fs: Arc<LocalFileSystem>,
    /// The store's directory.
    root: std::path::PathBuf,
    /// Buffers reads go into.
    pool: Arc<BufferPool>,
    /// Spare files, made on the first write or delete (a store only read never makes
    /// one: `inspect` runs beside a live buffer).
    /// `None` until the first retire; then `Some(None)` if no folder could be made.
    recycler: Mutex<Option<Option<Arc<Recycler>>>>,
}

#[cfg(unix)]
impl Local {
    /// The recycler, made on first use. Blocking.
    fn recycler(&self) -> Option<Arc<Recycler>> {
        let mut notes = Vec::new();
        let recycler = self
            .recycler
            .lock()
            .get_or_insert_with(|| Recycler::new(&self.root, &mut notes).map(Arc::new))
            .clone();
        for note in &notes {
            note.log();
        }
        recycler
    }

    /// The recycler if it exists and has a spare ready (never blocks on the disk).
    fn ready_recycler(&self) -> bool {
        self.recycler
            .lock()
            .as_ref()
            .and_then(Option::as_ref)
            .is_some_and(|r| r.has_spare())
    }

    /// Runs blocking `op` on the blocking pool (inline outside a runtime).
    async fn blocking<T: Send + 'static>(
        op: impl FnOnce() -> T + Send + 'static,
    ) -> std::result::Result<T, tokio::task::JoinError> {
        match tokio::runtime::Handle::try_current() {
            Ok(_) => tokio::task::spawn_blocking(op).await,
            Err(_) => Ok(op()),
        }
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("url", &self.url).finish()
    }
}

pub(crate) fn storage_err(
    url: &str,
    path: &str,
    cause: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::Storage {
        url: url.to_owned(),
        path: path.to_owned(),
        kind: storage_kind(&cause),
        detail: cause.to_string(),
        source: Some(ErrorSource(Arc::new(cause))),
    }
}

/// The error for a failed operation on `path` of the store at `url` that has no error of
/// its own to carry (a bad URL, an object missing where one must be).
pub(crate) fn storage_msg(
    url: &str,
    path: &str,
    kind: StorageKind,
    detail: impl fmt::Display,
) -> Error {
    Error::Storage {
        url: url.to_owned(),
        path: path.to_owned(),
        kind,
        detail: detail.to_string(),
        source: None,
    }
}

/// What kind of failure `cause` is: object_store's and the file system's errors say it;
/// anything else is [`StorageKind::Other`].
fn storage_kind(cause: &(dyn std::error::Error + 'static)) -> StorageKind {
    if let Some(e) = cause.downcast_ref::<object_store::Error>() {
        return match e {
            object_store::Error::NotFound { .. } => StorageKind::NotFound,
            object_store::Error::AlreadyExists { .. } => StorageKind::AlreadyExists,
            object_store::Error::Precondition { .. } => StorageKind::Precondition,
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => StorageKind::PermissionDenied,
            _ => StorageKind::Other,
        };
    }
    match cause
        .downcast_ref::<std::io::Error>()
        .map(std::io::Error::kind)
    {
        Some(std::io::ErrorKind::NotFound) => StorageKind::NotFound,
        Some(std::io::ErrorKind::AlreadyExists) => StorageKind::AlreadyExists,
        Some(std::io::ErrorKind::PermissionDenied) => StorageKind::PermissionDenied,
        _ => StorageKind::Other,
    }
}

/// The error for a damaged file at `path` of `store`.
pub(crate) fn corrupt(store: &Store, path: &str, detail: impl fmt::Display) -> Error {
    Error::Corrupt {
        url: store.url().to_owned(),
        path: path.to_owned(),
        detail: detail.to_string(),
        source: None,
    }
}

/// [`corrupt`] with the decoder's own error as the source.
pub(crate) fn corrupt_by(
    store: &Store,
    path: &str,
    cause: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::Corrupt {
        url: store.url().to_owned(),
        path: path.to_owned(),
        detail: cause.to_string(),
        source: Some(ErrorSource(Arc::new(cause))),
    }
}

impl Store {
    /// Opens the store a URL names:
    ///
    /// * `memory://`: a new, empty in-memory store, for tests (every `open` makes another
    ///   one; share a `Store` by cloning it);
    /// * `file:///abs/dir` (absolute, percent-decoded) or a bare path (`./runs/a`,
    ///   `/data/buf`): a local directory, created if missing;
    /// * `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`: the cloud
    ///   stores (and S3-compatible servers through `AWS_ENDPOINT_URL`), configured from the
    ///   environment.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] for an unsupported scheme, a `file://` URL that is not absolute,
    /// a cloud URL without a bucket, a local directory that cannot be created, or a cloud
    /// store whose configuration from the environment is refused.
    pub fn open(url: &str) -> Result<Self> {
        let err = |e: std::io::Error| storage_err(url, "", e);
        let store_err = |e: object_store::Error| storage_err(url, "", e);
        let bad_url = |detail: &str| storage_msg(url, "", StorageKind::Other, detail);
        let (scheme, rest) = match url.split_once("://") {
            Some((s, r)) => (s, r),
            None => ("file", url),
        };
        #[cfg(unix)]
        let mut local = None;
        let (inner, prefix): (Arc<dyn ObjectStore>, &str) = match scheme {
            "memory" => (Arc::new(InMemory::new()), ""),
            "file" => {
                let decoded;
                let rest = if url.starts_with("file://") {
                    if !rest.starts_with('/') {
                        return Err(bad_url("file URLs name an absolute path: file:///dir"));
                    }
                    decoded = percent_decode(rest);
                    decoded.as_str()
                } else {
                    rest
                };
                let dir = std::path::Path::new(if rest.is_empty() { "." } else { rest });
                std::fs::create_dir_all(dir).map_err(err)?;
                let dir = dir.canonicalize().map_err(err)?;
                let fs = Arc::new(LocalFileSystem::new_with_prefix(&dir).map_err(store_err)?);
                #[cfg(unix)]
                {
                    local = Some(Arc::new(Local {
                        fs: Arc::clone(&fs),
                        root: dir.clone(),
                        pool: Arc::default(),
                        recycler: Mutex::new(None),
                    }));
                }
                (fs, "")
            }
            "s3" | "gs" | "az" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(bad_url("no bucket in the URL"));
                }
                let root = format!("{scheme}://{bucket}");
                let store: Arc<dyn ObjectStore> = match scheme {
                    "s3" => Arc::new(
                        AmazonS3Builder::from_env()
                            .with_url(root)
                            .build()
                            .map_err(store_err)?,
                    ),
                    "gs" => Arc::new(
                        GoogleCloudStorageBuilder::from_env()
                            .with_url(root)
                            .build()
                            .map_err(store_err)?,
                    ),
                    _ => Arc::new(
                        MicrosoftAzureBuilder::from_env()
                            .with_url(root)
                            .build()
                            .map_err(store_err)?,
                    ),
                };
                (store, prefix)
            }
            other => return Err(bad_url(&format!("unsupported scheme `{other}`"))),
        };
        Ok(Self {
            inner,
            prefix: Path::from(prefix.trim_matches('/')),
            url: url.into(),
            #[cfg(unix)]
            local,
        })
    }

    /// A store over an existing `object_store` (a wrapper that injects faults, say), with
    /// every path under `prefix`.
    pub fn from_object_store(inner: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        Self {
            inner,
            prefix: Path::from(prefix.trim_matches('/')),
            url: format!("object_store:///{}", prefix.trim_matches('/')).into(),
            #[cfg(unix)]
            local: None,
        }
    }

    /// The URL (or description) the store was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The directory of a store on local disk (`None` for an object store, or off Unix):
    /// where a process serving the store keeps its lock file.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        #[cfg(unix)]
        {
            self.local.as_ref().map(|l| l.root.as_path())
        }
        #[cfg(not(unix))]
        {
            None
        }
    }

    /// The object path of `rel`. Paths are taken as already percent-encoded (hive
    /// partition values are), so `%2F` stays `%2F` instead of becoming `%252F`; a path that
    /// is not valid encoded is encoded.
    fn path(&self, rel: &str) -> Path {
        let rel = rel.trim_matches('/');
        let full = if self.prefix.as_ref().is_empty() {
            rel.to_owned()
        } else if rel.is_empty() {
            return self.prefix.clone();
        } else {
            format!("{}/{rel}", self.prefix)
        };
        // Segment by segment: a segment that is not valid encoded (`..`, a stray `%`) is
        // encoded on its own, and the others keep their encoding.
        Path::from_iter(
            full.split('/')
                .filter(|seg| !seg.is_empty())
                .map(|seg| PathPart::parse(seg).unwrap_or_else(|_| PathPart::from(seg))),
        )
    }

    fn relative(&self, full: &Path) -> String {
        let full = full.as_ref();
        let prefix = self.prefix.as_ref();
        match full.strip_prefix(prefix) {
            Some(rest) if !prefix.is_empty() => rest.trim_start_matches('/').to_owned(),
            _ => full.to_owned(),
        }
    }

    /// Writes `bytes` at `rel`, replacing what was there (atomically: readers see the old
    /// or the new object, never part of one).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store refuses or fails the write.
    pub async fn put(&self, rel: &str, bytes: Bytes) -> Result<()> {
        #[cfg(unix)]
        if self.recycled_write(rel, &bytes, false).await? == Some(true) {
            return Ok(());
        }
        self.inner
            .put(&self.path(rel), PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|e| storage_err(&self.url, rel, e))
    }

    /// Writes `bytes` at `rel` only if nothing is there; `false` when something was (the
    /// commit point of a manifest).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store fails the write for any other reason than an
    /// object already there.
    pub async fn put_if_absent(&self, rel: &str, bytes: Bytes) -> Result<bool> {
        #[cfg(unix)]
        if let Some(written) = self.recycled_write(rel, &bytes, true).await? {
            return Ok(written);
        }
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .inner
            .put_opts(&self.path(rel), PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(storage_err(&self.url, rel, e)),
        }
    }

    /// The object at `rel`, or `None` if there is none.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the read fails for any other reason than a missing object.
    pub async fn get(&self, rel: &str) -> Result<Option<Bytes>> {
        #[cfg(unix)]
        if let Some(local) = &self.local {
            let path = self.local_path(local, rel)?;
            let pool = Arc::clone(&local.pool);
            return Local::blocking(move || super::local_read::read_whole(&pool, &path))
                .await
                .map_err(|e| storage_err(&self.url, rel, e))?
                .map_err(|e| storage_err(&self.url, rel, e));
        }
        let found = match self.inner.get(&self.path(rel)).await {
            Ok(found) => found,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(storage_err(&self.url, rel, e)),
        };
        found
            .bytes()
            .await
            .map(Some)
            .map_err(|e| storage_err(&self.url, rel, e))
    }

    /// The size in bytes of the object at `rel`, or `None` if there is none.
    pub(crate) async fn size(&self, rel: &str) -> Result<Option<u64>> {
        match self.inner.head(&self.path(rel)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(storage_err(&self.url, rel, e)),
        }
    }

    /// The bytes of `ranges` of the object at `rel` (one request per range, or fewer where
    /// the backend coalesces them). On local disk each range is read into a buffer of its
    /// own, from a pool (`local_read.rs`), whatever the ranges.
    pub(crate) async fn get_ranges(&self, rel: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        #[cfg(unix)]
        if let Some(local) = &self.local {
            let path = self.local_path(local, rel)?;
            let (pool, ranges) = (Arc::clone(&local.pool), ranges.to_vec());
            return Local::blocking(move || super::local_read::read_ranges(&pool, &path, &ranges))
                .await
                .map_err(|e| storage_err(&self.url, rel, e))?
                .map_err(|e| storage_err(&self.url, rel, e));
        }
        self.inner
            .get_ranges(&self.path(rel), ranges)
            .await
            .map_err(|e| storage_err(&self.url, rel, e))
    }

    /// Every object under `rel_prefix` (recursively), as paths relative to the store,
    /// sorted.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when listing fails.
    pub async fn list(&self, rel_prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .list_sized(rel_prefix)
            .await?
            .into_iter()
            .map(|o| o.path)
            .collect())
    }

    /// [`Self::list`] with each object's size and last-modified time.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when listing fails.
    pub async fn list_sized(&self, rel_prefix: &str) -> Result<Vec<Listed>> {
        let prefix = self.path(rel_prefix);
        let prefix = (!prefix.as_ref().is_empty()).then_some(prefix);
        let metas: Vec<_> = self
            .inner
            .list(prefix.as_ref())
            .try_collect()
            .await
            .map_err(|e| storage_err(&self.url, rel_prefix, e))?;
        let mut listed: Vec<Listed> = metas
            .iter()
            .map(|m| Listed {
                path: self.relative(&m.location),
                size: m.size,
                modified: std::time::SystemTime::from(m.last_modified),
            })
            .collect();
        listed.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(listed)
    }

    /// Deletes the objects at `rels`, which no reader opens again once this returns: on
    /// local disk their files may be written again as other objects (see `recycle.rs`).
    /// Deleting a missing object is not an error. On local disk the files go aside in one
    /// call to the blocking pool: a checkpoint retires thousands of log files under load,
    /// and one round trip each kept the writer short of spares for as long.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] for the first object the store refuses or fails to delete
    /// (those before it are deleted).
    pub(crate) async fn retire_all(&self, rels: &[String]) -> Result<()> {
        #[cfg(unix)]
        if let Some(local) = &self.local {
            let paths = rels
                .iter()
                .map(|rel| self.local_path(local, rel))
                .collect::<Result<Vec<_>>>()?;
            let local = Arc::clone(local);
            let retired = Local::blocking(move || {
                let recycler = local.recycler()?;
                for (i, path) in paths.iter().enumerate() {
                    if let Err(e) = recycler.delete(path) {
                        return Some(Err((i, e)));
                    }
                }
                Some(Ok(()))
            })
            .await;
            match retired {
                Ok(Some(Ok(()))) => return Ok(()),
                Ok(Some(Err((i, e)))) => return Err(storage_err(&self.url, &rels[i], e)),
                Ok(None) => {}
                Err(e) => return Err(storage_err(&self.url, rels.first().map_or("", |r| r), e)),
            }
        }
        for rel in rels {
            self.delete(rel).await?;
        }
        Ok(())
    }

    /// On local disk, writes `bytes` at `rel` through a spare file if there is one (see
    /// [`Recycler::write`]); `None` otherwise.
    #[cfg(unix)]
    async fn recycled_write(
        &self,
        rel: &str,
        bytes: &Bytes,
        create_only: bool,
    ) -> Result<Option<bool>> {
        let Some(local) = &self.local else {
            return Ok(None);
        };
        // Spares exist only once something was retired; until then, no detour.
        if !local.ready_recycler() {
            return Ok(None);
        }
        let path = self.local_path(local, rel)?;
        let (local, bytes) = (Arc::clone(local), bytes.clone());
        Local::blocking(move || {
            local
                .recycler()
                .and_then(|r| r.write(&path, &bytes, create_only))
        })
        .await
        .map_err(|e| storage_err(&self.url, rel, e))
    }

    /// The file of `rel` in a store on local disk.
    #[cfg(unix)]
    fn local_path(&self, local: &Local, rel: &str) -> Result<std::path::PathBuf> {
        local
            .fs
            .path_to_filesystem(&self.path(rel))
            .map_err(|e| storage_err(&self.url, rel, e))
    }

    /// Deletes the object at `rel`; deleting a missing object is not an error.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store refuses or fails the delete.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        match self.inner.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(storage_err(&self.url, rel, e)),
        }
    }
}

/// Decodes `%XX` escapes (two hex digits); anything else is kept as is.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_errors_say_what_kind_of_failure_they_are() {
        let missing = object_store::Error::NotFound {
            path: "a".into(),
            source: "gone".into(),
        };
        let err = storage_err("memory://", "a", missing);
        assert!(matches!(
            &err,
            Error::Storage { kind: StorageKind::NotFound, source: Some(s), .. }
                if s.get().downcast_ref::<object_store::Error>().is_some()
        ));
        let taken = std::io::Error::from(std::io::ErrorKind::AlreadyExists);
        assert!(matches!(
            storage_err("file:///x", "b", taken),
            Error::Storage {
                kind: StorageKind::AlreadyExists,
                ..
            }
        ));
        let refused = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(matches!(
            storage_err("file:///x", "b", refused),
            Error::Storage {
                kind: StorageKind::PermissionDenied,
                ..
            }
        ));
        let other = std::io::Error::other("disk full");
        assert!(matches!(
            storage_err("file:///x", "b", other),
            Error::Storage {
                kind: StorageKind::Other,
                ..
            }
        ));
        // A message has no source of its own.
        assert!(matches!(
            storage_msg("memory://", "c", StorageKind::NotFound, "no segment"),
            Error::Storage {
                source: None,
                kind: StorageKind::NotFound,
                ..
            }
        ));
    }
}
