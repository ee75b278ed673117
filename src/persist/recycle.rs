//! Recycled files for a store on local disk: a retired log file is renamed aside and a
//! later write reuses it, so a busy store stops creating and freeing a file per write.
//!
//! A persistent buffer writes a log file per group commit (hundreds a second under load)
//! and deletes them at each checkpoint. On ext4 every new file allocates an inode, and
//! without a journal ext4 also scans past the inodes freed in the last half minute to find
//! one: under the HTTP server's load, file creation alone was a sixth of the server's CPU.
//! Renaming a file is a directory change only; writing into an existing file reuses its
//! inode and blocks.
//!
//! Only log files are recycled
//! ([`Store::retire_all`](super::store::Store::retire_all)): no reader opens one again
//! once a checkpoint has superseded it, and a spare is reused only after it has been
//! aside for [`MIN_AGE`], so a reader that opened it just before (a
//! concurrent `inspect`) has long finished. Had it not, its checksum would fail and it
//! would skip the group, as it does a group deleted under it.
//!
//! Each [`Recycler`] owns a directory of its own, `<root>/.recycled/<pid>-<nanos>/`, and
//! only ever uses the files it put there itself, so two processes (or two stores on one
//! directory) never write into the same file. A new recycler removes what the others left
//! (a crashed process's spares); if that removes a live one's, the live one's calls fail
//! and fall back to the plain `object_store` path: a write is exposed under its final name
//! only by a link or rename made after the whole of it is written, so no failure here can
//! expose a partial file. Nothing in `.recycled` is ever read back as data, and listings
//! of the store's folders do not see it.
//!
//! # Locking
//!
//! One mutex guards the list of spare files; a spare popped from it belongs to one call
//! until it is pushed back or linked under a final name. All file operations are blocking
//! and run outside the mutex.

use crate::sync::{AtomicU64, Mutex, Ordering};
use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The folder, under the store's root, that holds each recycler's own folder.
pub(crate) const RECYCLED_DIR: &str = ".recycled";
/// Spare files kept at most; a delete beyond them deletes. A checkpoint retires every log
/// file written since the one before (thousands under load) and the writer uses several
/// hundred a second, so the spares must hold a whole checkpoint interval's files: with
/// 4,096 files and 256 MiB, the server's 256 MiB checkpoints retired more than was kept,
/// and the writer ran out before the next checkpoint and created a file per group again
/// (a sixth of the server's CPU under single writes, in steady state).
const MAX_SPARES: usize = 16384;
/// Bytes the spares may hold on disk, at most (disk, not memory: the spares are what the
/// last checkpoints retired, used up as the log is written).
const MAX_SPARES_BYTES: u64 = 1 << 30;
/// Larger files are deleted, not kept: reusing them would save little against their size.
const MAX_SPARE_BYTES: u64 = 8 << 20;
/// How long a spare stays aside before it is written again.
pub(crate) const MIN_AGE: Duration = Duration::from_secs(2);

/// A spare file: where it is, its size, since when it is aside.
#[derive(Debug)]
struct Spare {
    path: PathBuf,
    bytes: u64,
    since: Instant,
}

#[derive(Debug, Default)]
struct Spares {
    /// Oldest first.
    files: VecDeque<Spare>,
    bytes: u64,
}

/// A store's spare files (see the module docs).
#[derive(Debug)]
pub(crate) struct Recycler {
    dir: PathBuf,
    spares: Mutex<Spares>,
    next: AtomicU64,
    min_age: Duration,
}

/// Something making a [`Recycler`] could not do, logged by the caller at debug level.
pub(crate) struct Note {
    what: &'static str,
    path: PathBuf,
    error: io::Error,
}

impl Note {
    /// Logs it (at debug: the store works without recycled files).
    pub(crate) fn log(&self) {
        tracing::debug!(error = %self.error, path = %self.path.display(), "{}", self.what);
    }
}

impl Recycler {
    /// A recycler with a new folder of its own under `root`, after removing the folders
    /// other recyclers left there. `None` when the folder cannot be made (the store then
    /// deletes and creates files as `object_store` does). What could not be done is in
    /// `notes`, for the caller to log once its lock is dropped (nothing is logged under a
    /// lock: a log event can wait, under Python for the GIL).
    pub(crate) fn new(root: &Path, notes: &mut Vec<Note>) -> Option<Self> {
        Self::with_min_age(root, MIN_AGE, notes)
    }

    fn with_min_age(root: &Path, min_age: Duration, notes: &mut Vec<Note>) -> Option<Self> {
        let parent = root.join(RECYCLED_DIR);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = parent.join(format!("{}-{nanos}", std::process::id()));
        if let Ok(entries) = std::fs::read_dir(&parent) {
            for entry in entries.flatten() {
                if let Err(error) = std::fs::remove_dir_all(entry.path()) {
                    notes.push(Note {
                        what: "left a recycled folder",
                        path: entry.path(),
                        error,
                    });
                }
            }
        }
        match std::fs::create_dir_all(&dir) {
            Ok(()) => Some(Self {
                dir,
                spares: Mutex::new(Spares::default()),
                next: AtomicU64::new(0),
                min_age,
            }),
            Err(error) => {
                notes.push(Note {
                    what: "no recycled files for this store",
                    path: dir,
                    error,
                });
                None
            }
        }
    }

    /// Deletes the file at `path`, keeping it as a spare when there is room. A missing file
    /// is not an error.
    pub(crate) fn delete(&self, path: &Path) -> io::Result<()> {
        let size = std::fs::metadata(path)
            .ok()
            .filter(|m| m.is_file() && m.len() <= MAX_SPARE_BYTES)
            .map(|m| m.len());
        if let Some(bytes) = size.filter(|&b| self.has_room(b)) {
            let spare = self
                .dir
                .join(self.next.fetch_add(1, Ordering::Relaxed).to_string());
            if std::fs::rename(path, &spare).is_ok() {
                let mut spares = self.spares.lock();
                spares.bytes += bytes;
                spares.files.push_back(Spare {
                    path: spare,
                    bytes,
                    since: Instant::now(),
                });
                return Ok(());
            }
        }
        remove_missing_ok(path)
    }

    fn has_room(&self, bytes: u64) -> bool {
        let spares = self.spares.lock();
        spares.files.len() < MAX_SPARES && spares.bytes + bytes <= MAX_SPARES_BYTES
    }

    /// Whether a spare is ready to be written.
    pub(crate) fn has_spare(&self) -> bool {
        self.spares
            .lock()
            .files
            .front()
            .is_some_and(|s| s.since.elapsed() >= self.min_age)
    }

    /// The oldest spare, if it has been aside long enough.
    fn take(&self) -> Option<Spare> {
        let mut spares = self.spares.lock();
        if spares.files.front()?.since.elapsed() < self.min_age {
            return None;
        }
        let spare = spares.files.pop_front()?;
        spares.bytes -= spare.bytes;
        Some(spare)
    }

    /// Puts back a spare that was taken and not used (aside since it first was).
    fn put_back(&self, spare: Spare) {
        let mut spares = self.spares.lock();
        spares.bytes += spare.bytes;
        spares.files.push_front(spare);
    }

    /// Writes `bytes` at `path` through a spare file: `Some(true)` when written,
    /// `Some(false)` when `create_only` and a file is already there, `None` when there is
    /// no spare or using it failed (the caller then writes the usual way, which reports
    /// any error the disk gives).
    ///
    /// The spare is overwritten in place and cut to length, then linked (`create_only`) or
    /// renamed to `path`: readers see the old file or the whole new one.
    pub(crate) fn write(&self, path: &Path, bytes: &[u8], create_only: bool) -> Option<bool> {
        let mut taken = self.take()?;
        let spare = taken.path.clone();
        let written = std::fs::OpenOptions::new()
            .write(true)
            .open(&spare)
            .and_then(|mut file| {
                file.write_all(bytes)?;
                file.set_len(bytes.len() as u64)
            });
        let placed = written.and_then(|()| {
            if create_only {
                with_parent(path, || std::fs::hard_link(&spare, path))
            } else {
                with_parent(path, || std::fs::rename(&spare, path))
            }
        });
        match placed {
            Ok(()) => {
                if create_only {
                    // The file lives on under `path`; only the spare's name goes.
                    let _ = remove_missing_ok(&spare);
                }
                Some(true)
            }
            Err(e) if create_only && e.kind() == io::ErrorKind::AlreadyExists => {
                taken.bytes = bytes.len() as u64;
                self.put_back(taken);
                Some(false)
            }
            Err(e) => {
                // Nothing was placed; the spare may be gone already (see the module docs).
                let _ = std::fs::remove_file(&spare);
                tracing::debug!(error = %e, spare = %spare.display(), "dropped a spare file");
                None
            }
        }
    }
}

impl Drop for Recycler {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `op`; if it fails because `path`'s folder is missing, makes the folder and runs it
/// again.
fn with_parent(path: &Path, op: impl Fn() -> io::Result<()>) -> io::Result<()> {
    match op() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            op()
        }
        other => other,
    }
}

fn remove_missing_ok(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    use super::*;

    /// A fresh directory, removed when the test ends.
    fn root(name: &str) -> Root {
        let dir = std::env::temp_dir().join(format!("rb-recycle-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("root");
        Root(dir)
    }

    struct Root(PathBuf);

    impl std::ops::Deref for Root {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn now(root: &Path) -> Recycler {
        Recycler::with_min_age(root, Duration::ZERO, &mut Vec::new()).expect("recycler")
    }

    #[test]
    fn a_deleted_file_is_reused_with_its_inode_and_cut_to_the_new_length() {
        use std::os::unix::fs::MetadataExt;
        let root = root("reuse");
        let r = now(&root);
        let old = root.join("a.log");
        std::fs::write(&old, vec![7u8; 1000]).expect("write");
        let inode = std::fs::metadata(&old).expect("meta").ino();
        assert!(r.write(&root.join("x"), b"x", true).is_none());
        r.delete(&old).expect("delete");
        assert!(!old.exists());
        let new = root.join("wal").join("b.log");
        assert_eq!(r.write(&new, b"fresh", true), Some(true));
        assert_eq!(std::fs::read(&new).expect("read"), b"fresh");
        assert_eq!(std::fs::metadata(&new).expect("meta").ino(), inode);
        assert_eq!(std::fs::metadata(&new).expect("meta").nlink(), 1);
        assert_eq!(std::fs::read_dir(&r.dir).expect("dir").count(), 0);
        // No spare left: the next write goes the usual way.
        assert!(r.write(&root.join("c"), b"c", false).is_none());
        assert!(!root.join("c").exists());
    }

    #[test]
    fn a_spare_is_not_written_before_it_has_been_aside_long_enough() {
        let root = root("age");
        let r = Recycler::with_min_age(&root, Duration::from_secs(3600), &mut Vec::new())
            .expect("recycler");
        let old = root.join("a");
        std::fs::write(&old, b"old").expect("write");
        r.delete(&old).expect("delete");
        assert!(!old.exists());
        assert!(r.write(&root.join("b"), b"new", true).is_none());
        assert_eq!(r.spares.lock().files.len(), 1);
    }

    #[test]
    fn create_only_never_replaces_and_keeps_the_spare() {
        let root = root("create");
        let r = now(&root);
        let there = root.join("there");
        std::fs::write(&there, b"first").expect("write");
        let gone = root.join("gone");
        std::fs::write(&gone, b"old").expect("write");
        r.delete(&gone).expect("delete");
        assert_eq!(r.write(&there, b"second", true), Some(false));
        assert_eq!(std::fs::read(&there).expect("read"), b"first");
        // The spare is kept: an overwrite uses it and replaces the file.
        assert_eq!(r.write(&there, b"second", false), Some(true));
        assert_eq!(std::fs::read(&there).expect("read"), b"second");
        assert_eq!(r.spares.lock().bytes, 0);
    }

    #[test]
    fn missing_files_are_fine_and_large_ones_are_deleted_not_kept() {
        let root = root("bounded");
        let r = now(&root);
        r.delete(&root.join("missing")).expect("missing is fine");
        let big = root.join("big");
        std::fs::write(&big, vec![0u8; MAX_SPARE_BYTES as usize + 1]).expect("write");
        r.delete(&big).expect("delete");
        assert!(!big.exists());
        assert_eq!(r.spares.lock().files.len(), 0);
        assert_eq!(std::fs::read_dir(&r.dir).expect("dir").count(), 0);
        let small = root.join("small");
        std::fs::write(&small, vec![0u8; 100]).expect("write");
        r.delete(&small).expect("delete");
        assert_eq!(r.spares.lock().bytes, 100);
    }

    #[test]
    fn a_new_recycler_removes_what_others_left_and_its_own_folder_goes_with_it() {
        let root = root("leftover");
        let first = now(&root);
        let p = root.join("f");
        std::fs::write(&p, b"x").expect("write");
        first.delete(&p).expect("delete");
        let first_dir = first.dir.clone();
        std::mem::forget(first); // as if its process had died
        let second = now(&root);
        assert!(!first_dir.exists());
        let second_dir = second.dir.clone();
        assert!(second_dir.exists());
        drop(second);
        assert!(!second_dir.exists());
    }

    #[test]
    fn a_spare_removed_under_a_recycler_falls_back_to_the_usual_write() {
        let root = root("stolen");
        let r = now(&root);
        let p = root.join("f");
        std::fs::write(&p, b"x").expect("write");
        r.delete(&p).expect("delete");
        std::fs::remove_dir_all(&r.dir).expect("taken away");
        assert!(r.write(&root.join("g"), b"y", true).is_none());
        assert!(!root.join("g").exists());
        // Deletes fall back too: the file goes.
        std::fs::write(&p, b"x").expect("write");
        r.delete(&p).expect("delete");
        assert!(!p.exists());
    }
}
