//! `FaultyStore`: an `ObjectStore` wrapper that fails or tears writes on demand, for the
//! fault-injection tests.

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

/// What the next writes do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Writes go through.
    None = 0,
    /// Writes fail and store nothing.
    Fail = 1,
    /// Writes store the first half of the object, then report a failure (an upload cut
    /// short on a store without atomic puts).
    Tear = 2,
    /// Writes wait until the fault is changed, then do what the new fault says (a store
    /// that hangs).
    Stall = 3,
    /// Writes store the whole object, then report a failure (a timeout after the upload
    /// completed).
    Ghost = 4,
}

/// Wraps a store; reads fail only while `fail_reads` is on and wait while held
/// (`hold_reads_after`); deletes fail only while `fail_deletes` is on; lists always go
/// through.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    fault: AtomicU8,
    /// Writes that still go through before the fault applies.
    grace: AtomicUsize,
    /// Writes refused or torn so far.
    pub injected: AtomicUsize,
    /// Stalled writes wait here for the fault to change.
    changed: tokio::sync::Notify,
    /// Writes waiting in a stall.
    pub stalled: AtomicUsize,
    /// Reads fail while set.
    read_faults: AtomicBool,
    /// Reads refused so far.
    pub failed_reads: AtomicUsize,
    /// Reads that still go through before reads are held (`usize::MAX`: never held).
    read_grace: AtomicUsize,
    /// Held reads wait here for `release_reads`.
    reads_released: tokio::sync::Notify,
    /// Reads waiting to be released.
    pub held_reads: AtomicUsize,
    /// Gets of a whole object under `spill/` (not ranged, not heads).
    pub whole_spill_gets: AtomicUsize,
    /// Gets of anything under `spill/` (ranged or not, not heads).
    pub spill_gets: AtomicUsize,
    /// Deletes fail while set.
    delete_faults: Arc<AtomicBool>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            fault: AtomicU8::new(Fault::None as u8),
            grace: AtomicUsize::new(0),
            injected: AtomicUsize::new(0),
            changed: tokio::sync::Notify::new(),
            stalled: AtomicUsize::new(0),
            read_faults: AtomicBool::new(false),
            failed_reads: AtomicUsize::new(0),
            read_grace: AtomicUsize::new(usize::MAX),
            reads_released: tokio::sync::Notify::new(),
            held_reads: AtomicUsize::new(0),
            whole_spill_gets: AtomicUsize::new(0),
            spill_gets: AtomicUsize::new(0),
            delete_faults: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Lets `grace` more reads through, then holds every read until `release_reads`.
    pub fn hold_reads_after(&self, grace: usize) {
        self.read_grace.store(grace, Ordering::SeqCst);
    }

    /// Lets held reads (and every later one) go through.
    pub fn release_reads(&self) {
        self.read_grace.store(usize::MAX, Ordering::SeqCst);
        self.reads_released.notify_waiters();
    }

    /// Waits while reads are held and this one is past the grace.
    async fn read_after_hold(&self) {
        let spared = self
            .read_grace
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |g| match g {
                usize::MAX => Some(g),
                g => g.checked_sub(1),
            })
            .is_ok();
        if spared {
            return;
        }
        self.held_reads.fetch_add(1, Ordering::SeqCst);
        loop {
            let mut released = std::pin::pin!(self.reads_released.notified());
            released.as_mut().enable();
            if self.read_grace.load(Ordering::SeqCst) == usize::MAX {
                break;
            }
            released.await;
        }
        self.held_reads.fetch_sub(1, Ordering::SeqCst);
    }

    /// A faulty store over the local directory `dir` (created if missing).
    pub fn on_local_dir(dir: &str) -> Arc<Self> {
        std::fs::create_dir_all(dir).expect("mkdir");
        let root = std::fs::canonicalize(dir).expect("canonical");
        Self::new(Arc::new(
            object_store::local::LocalFileSystem::new_with_prefix(root).expect("fs"),
        ))
    }

    /// Makes every read fail (`true`) or go through again (`false`).
    pub fn fail_reads(&self, on: bool) {
        self.read_faults.store(on, Ordering::SeqCst);
    }

    /// Makes every delete fail (`true`) or go through again (`false`).
    pub fn fail_deletes(&self, on: bool) {
        self.delete_faults.store(on, Ordering::SeqCst);
    }

    pub fn set(&self, fault: Fault) {
        self.set_after(fault, 0);
    }

    /// Lets `grace` more writes through, then applies `fault`.
    pub fn set_after(&self, fault: Fault, grace: usize) {
        self.grace.store(grace, Ordering::SeqCst);
        self.fault.store(fault as u8, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Waits while the fault is `Stall`, then returns the fault that applies.
    async fn fault_after_stall(&self) -> Fault {
        loop {
            let mut changed = std::pin::pin!(self.changed.notified());
            changed.as_mut().enable();
            let fault = self.fault();
            if fault != Fault::Stall {
                return fault;
            }
            self.stalled.fetch_add(1, Ordering::SeqCst);
            changed.await;
            self.stalled.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn fault(&self) -> Fault {
        let spared = self
            .grace
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |g| g.checked_sub(1))
            .is_ok();
        if spared {
            return Fault::None;
        }
        match self.fault.load(Ordering::SeqCst) {
            1 => Fault::Fail,
            2 => Fault::Tear,
            3 => Fault::Stall,
            4 => Fault::Ghost,
            _ => Fault::None,
        }
    }

    fn injected_error(&self, location: &Path) -> object_store::Error {
        self.injected.fetch_add(1, Ordering::SeqCst);
        object_store::Error::Generic {
            store: "faulty",
            source: format!("injected write failure at {location}").into(),
        }
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        match self.fault_after_stall().await {
            Fault::None | Fault::Stall => self.inner.put_opts(location, payload, opts).await,
            Fault::Fail => Err(self.injected_error(location)),
            Fault::Ghost => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(self.injected_error(location))
            }
            Fault::Tear => {
                let bytes = bytes::Bytes::from(payload);
                let half = PutPayload::from(bytes.slice(..bytes.len() / 2));
                self.inner.put_opts(location, half, opts).await?;
                Err(self.injected_error(location))
            }
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        match self.fault() {
            Fault::None => self.inner.put_multipart_opts(location, opts).await,
            _ => Err(self.injected_error(location)),
        }
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.read_after_hold().await;
        if !options.head && location.as_ref().starts_with("spill/") {
            self.spill_gets.fetch_add(1, Ordering::SeqCst);
            if options.range.is_none() {
                self.whole_spill_gets.fetch_add(1, Ordering::SeqCst);
            }
        }
        if self.read_faults.load(Ordering::SeqCst) {
            self.failed_reads.fetch_add(1, Ordering::SeqCst);
            return Err(object_store::Error::Generic {
                store: "faulty",
                source: format!("injected read failure at {location}").into(),
            });
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let faults = Arc::clone(&self.delete_faults);
        let locations = locations.map(move |location| match location {
            Ok(path) if faults.load(Ordering::SeqCst) => Err(object_store::Error::Generic {
                store: "faulty",
                source: format!("injected delete failure at {path}").into(),
            }),
            other => other,
        });
        self.inner.delete_stream(locations.boxed())
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
