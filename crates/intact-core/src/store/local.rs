//! The embedded default untrusted store: one file per object under a root directory.
//!
//! Object `a/b/c` lives at `root/a/b/c`; parent directories are created on demand.
//! Reads and writes use positioned I/O (`pread`/`pwrite`) on cached file handles, so hot
//! paths neither reopen files nor seek. Durability follows the trait contract: `sync`
//! fsyncs the named files (on up to 16 threads) plus every directory whose entries changed
//! (creation, deletion) on the way to them, or past 1,024 names one `syncfs(2)` on the
//! root's file system, which `sync_all` uses.

use super::record::{create_synced, logged, rename, FsCall, FsLog};
use super::{check_name, UntrustedStore};
use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How many open file handles the store keeps at most.
const MAX_HANDLES: usize = 256;

/// Prefix of the temporary files `replace` writes; `list` skips them and object names may
/// not use it.
const TMP_PREFIX: &str = ".intact-tmp.";

/// A cached open file, remembering whether it was opened for writing.
#[derive(Debug, Clone)]
struct Handle {
    file: Arc<File>,
    writable: bool,
}

/// Objects stored as files under a root directory (the embedded default store).
#[derive(Debug)]
pub struct LocalDirStore {
    root: PathBuf,
    /// Open handles by object name. Unlinking and renaming happen under this lock and
    /// count in `unlinks`; a handle opened without the lock is cached only if no unlink or
    /// rename happened meanwhile, so a handle to a replaced or deleted file is never
    /// cached.
    handles: Mutex<HashMap<String, Handle>>,
    /// Unlinks and renames so far (changed under the `handles` lock).
    unlinks: AtomicU64,
    /// Directories whose entries were created or removed since they were last fsynced.
    dirty_dirs: Mutex<HashSet<PathBuf>>,
    tmp_seq: AtomicU64,
    /// Directories known to exist (so creating objects does not retry `mkdir` on them).
    known_dirs: Mutex<HashSet<PathBuf>>,
    /// The root, open since the store was: `syncfs` on it reports every writeback error of
    /// the file system since then (errors are sampled per open file description).
    root_fd: File,
    /// The file system's largest file, probed on first use ([`probe_max_len`]).
    max_len: std::sync::OnceLock<u64>,
    /// Where the calls that change the file system are recorded, for the crash-state
    /// tests ([`LocalDirStore::open_logged`]).
    log: Option<Arc<FsLog>>,
    /// Names the engine said do not exist ([`UntrustedStore::absent`]: a new file's
    /// objects), so that their first use asks the file system nothing first (a `statx`
    /// and a failed `open` per new file, before its create). At most [`ABSENT_KEPT`],
    /// the oldest forgotten first; a name leaves once created.
    absent: Mutex<Absent>,
}

/// Names kept by [`LocalDirStore`]'s hint of absent objects: four per new file, of which
/// most small files never create any (their bytes are in the inode table).
const ABSENT_KEPT: usize = 4096;

/// [`LocalDirStore::absent`]: the names, and their order of arrival for forgetting.
#[derive(Debug, Default)]
struct Absent {
    names: HashSet<String>,
    order: std::collections::VecDeque<String>,
}

/// Objects per `sync` beyond which one `syncfs` replaces per-object `fdatasync`s.
///
/// Below it a sync writes only what it names: `syncfs` also writes every other dirty page
/// of the file system (a bulk writer's, the log's being appended) and, for each page still
/// being written by earlier writeback, waits with the page locked, so an append to the
/// log's last page waited 30 – 40 ms behind a checkpoint's `syncfs` under a mixed load
/// (docs/performance.md, "Checkpoints that sync what they wrote"). Past it one `syncfs`
/// costs less: about 20 µs an object against 50 for the `fdatasync`s on 16 threads, on
/// ext4 with or without a journal (a seal after creating thousands of files).
const SYNCFS_THRESHOLD: usize = 1024;

/// Threads a sync's `fdatasync`s run on at most: the device overlaps them, and a journal
/// commits concurrent ones together.
const SYNC_THREADS: usize = 16;

/// Objects each of a sync's threads takes at least; a sync of this many or fewer runs on
/// the caller's thread alone.
const SYNCS_PER_THREAD: usize = 8;

/// The largest length a file at `tmp` (created, then removed) can be given: ftruncate
/// fails with EFBIG past the file system's limit, and a sparse file costs no space, so a
/// binary search over lengths finds it exactly. There is no call that reports it (pathconf's
/// FILESIZEBITS is coarse: 64 on ext4, whose limit is 2^44 − 4096 with 4 KiB blocks).
/// When the probe cannot run (a read-only directory), the limit is unknown: `u64::MAX`.
fn probe_max_len(tmp: &Path) -> u64 {
    let Ok(f) = OpenOptions::new().write(true).create_new(true).open(tmp) else {
        return u64::MAX;
    };
    // Invariant: `lo` fits; `hi` does not (i64::MAX + 1 is past any off_t).
    let (mut lo, mut hi) = (0u64, 1u64 << 63);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match f.set_len(mid) {
            Ok(()) => lo = mid,
            Err(e)
                if e.raw_os_error() == Some(libc::EFBIG)
                    || e.raw_os_error() == Some(libc::EINVAL) =>
            {
                hi = mid
            }
            // Anything else (a full disk on a file system that allocates): unknown.
            Err(_) => {
                lo = u64::MAX;
                break;
            }
        }
    }
    drop(f);
    let _ = fs::remove_file(tmp);
    lo
}

impl LocalDirStore {
    /// Opens a store rooted at an existing directory.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::io(
                    root.display().to_string(),
                    io::Error::other("store root is not a directory"),
                ))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::io(
                    root.display().to_string(),
                    io::Error::new(ErrorKind::NotFound, "store root directory does not exist"),
                ))
            }
            Err(e) => return Err(Error::io(root.display().to_string(), e)),
        }
        let root_fd = File::open(&root).map_err(|e| Error::io(root.display().to_string(), e))?;
        Ok(LocalDirStore {
            root,
            handles: Mutex::new(HashMap::new()),
            unlinks: AtomicU64::new(0),
            dirty_dirs: Mutex::new(HashSet::new()),
            tmp_seq: AtomicU64::new(0),
            known_dirs: Mutex::new(HashSet::new()),
            root_fd,
            max_len: std::sync::OnceLock::new(),
            log: None,
            absent: Mutex::new(Absent::default()),
        })
    }

    /// Whether the engine said `name` does not exist, and nothing created it since.
    fn known_absent(&self, name: &str) -> bool {
        self.absent.lock().unwrap().names.contains(name)
    }

    /// `name` exists now (created, or replaced whole).
    fn present(&self, name: &str) {
        self.absent.lock().unwrap().names.remove(name);
    }

    /// Opens a store that records every call changing the file system in `log`, and
    /// runs its calls one at a time so that the log's order is theirs (the crash-state
    /// tests: [`super::record`]).
    pub fn open_logged(root: impl Into<PathBuf>, log: Arc<FsLog>) -> Result<Self> {
        let mut s = Self::open(root)?;
        s.log = Some(log);
        Ok(s)
    }

    fn log(&self) -> Option<&FsLog> {
        self.log.as_deref()
    }

    /// Creates the root directory (and its parents) if needed, then opens the store.
    pub fn create(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| Error::io(root.display().to_string(), e))?;
        Self::open(root)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn check(name: &str) -> Result<()> {
        check_name(name)?;
        if name.split('/').any(|c| c.starts_with(TMP_PREFIX)) {
            return Err(Error::Invalid(format!(
                "bad object name {name:?} (reserved prefix)"
            )));
        }
        Ok(())
    }

    fn mark_dirty(&self, dir: PathBuf) {
        self.dirty_dirs.lock().unwrap().insert(dir);
    }

    /// Creates the missing directories between the root and `name`'s parent, marking the
    /// directory that received each new entry dirty.
    fn make_parents(&self, name: &str) -> Result<()> {
        let mut dir = self.root.clone();
        let comps: Vec<&str> = name.split('/').collect();
        for comp in &comps[..comps.len() - 1] {
            let child = dir.join(comp);
            if !self.known_dirs.lock().unwrap().contains(&child) {
                match logged(
                    self.log(),
                    || fs::create_dir(&child),
                    |r| FsCall::Mkdir(r(&child)),
                ) {
                    Ok(()) => self.mark_dirty(dir),
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(Error::io(name, e)),
                }
                self.known_dirs.lock().unwrap().insert(child.clone());
            }
            dir = child;
        }
        Ok(())
    }

    /// The handle for `name`: `Ok(None)` when the object is missing and `create` is false.
    ///
    /// The cache's lock is not held while a file is opened or created: a create can wait
    /// tens of milliseconds for the file system's journal under load, and every other
    /// store call (a log append of the engine, issue 14) would wait behind it.
    fn handle(&self, name: &str, create: bool, write: bool) -> Result<Option<Arc<File>>> {
        let unlinks = {
            let handles = self.handles.lock().unwrap();
            if let Some(h) = handles.get(name) {
                if h.writable || !write {
                    return Ok(Some(h.file.clone()));
                }
            }
            self.unlinks.load(Ordering::Relaxed)
        };
        let path = self.path_of(name);
        // A new file's object: straight to its create (which falls back to an open if the
        // hint was wrong), no open that fails first.
        let opened = if self.known_absent(name) {
            Err(io::Error::from(ErrorKind::NotFound))
        } else {
            OpenOptions::new().read(true).write(true).open(&path)
        };
        let file = match opened {
            Ok(f) => Handle {
                file: Arc::new(f),
                writable: true,
            },
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if !create {
                    return Ok(None);
                }
                self.make_parents(name)?;
                let create = || {
                    OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .open(&path)
                };
                let f = match logged(self.log(), create, |r| FsCall::Create(r(&path))) {
                    // Created by another process since the open above: no new entry.
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                        OpenOptions::new().read(true).write(true).open(&path)
                    }
                    r => r,
                }
                .map_err(|e| Error::io(name, e))?;
                self.mark_dirty(parent_of(&path));
                self.present(name);
                Handle {
                    file: Arc::new(f),
                    writable: true,
                }
            }
            // A read-only store (permissions or a read-only mount) can still be read.
            Err(e) if !write && is_read_only_error(&e) => {
                let f = File::open(&path).map_err(|e| Error::io(name, e))?;
                Handle {
                    file: Arc::new(f),
                    writable: false,
                }
            }
            Err(e) => return Err(Error::io(name, e)),
        };
        let mut handles = self.handles.lock().unwrap();
        if let Some(h) = handles.get(name) {
            // Opened by another call meanwhile: one handle per object.
            if h.writable || !file.writable {
                return Ok(Some(h.file.clone()));
            }
        }
        if self.unlinks.load(Ordering::Relaxed) != unlinks {
            // The file may have been deleted or replaced since it was opened: good for this
            // call (ordered before that), not for later ones.
            return Ok(Some(file.file));
        }
        if handles.len() >= MAX_HANDLES && !handles.contains_key(name) {
            // Evict an arbitrary entry; in-flight users keep their Arc.
            if let Some(k) = handles.keys().next().cloned() {
                handles.remove(&k);
            }
        }
        let out = file.file.clone();
        handles.insert(name.to_string(), file);
        Ok(Some(out))
    }

    /// Drops the cached handle of `name`, which is about to be (or was just) unlinked or
    /// replaced: called before and after, so that no call caches a handle it opened
    /// before the change ([`LocalDirStore::handle`]). The unlink or rename itself runs
    /// without the lock (it can wait for the file system's journal).
    fn forget_handle(&self, name: &str) {
        let mut handles = self.handles.lock().unwrap();
        handles.remove(name);
        self.unlinks.fetch_add(1, Ordering::Relaxed);
    }

    /// Fsyncs `dir`, re-marking it dirty when that fails.
    fn fsync_dir(&self, dir: &Path) -> Result<()> {
        let res = logged(
            self.log(),
            || File::open(dir).and_then(|d| d.sync_all()),
            |r| FsCall::FsyncDir(r(dir)),
        );
        res.map_err(|e| {
            self.mark_dirty(dir.to_path_buf());
            Error::io(dir.display().to_string(), e)
        })
    }

    /// `fdatasync` of each object in `names` that exists, in order; the first error.
    fn sync_files(&self, names: &[String]) -> Result<()> {
        for name in names {
            if let Some(file) = self.handle(name, false, false)? {
                // fdatasync also flushes the metadata needed to read the data back (the size).
                logged(
                    self.log(),
                    || file.sync_data(),
                    |r| FsCall::Fsync(r(&self.path_of(name))),
                )
                .map_err(|e| Error::io(name.as_str(), e))?;
            }
        }
        Ok(())
    }

    /// Fsyncs every dirty directory between `name`'s parent and the root.
    fn sync_dirs_for(&self, name: &str) -> Result<()> {
        let mut dirs = Vec::new();
        {
            let mut dirty = self.dirty_dirs.lock().unwrap();
            if dirty.is_empty() {
                return Ok(());
            }
            let mut p = parent_of(&self.path_of(name));
            loop {
                // Removing before the fsync is safe: an entry created after the removal
                // marks the directory dirty again.
                if dirty.remove(&p) {
                    dirs.push(p.clone());
                }
                if p == self.root || !p.pop() {
                    break;
                }
            }
        }
        let mut first_err = None;
        for d in dirs {
            if let Err(e) = self.fsync_dir(&d) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Calls `f` with every object under `dir` (named `prefix` + its path below `dir`),
    /// a directory at a time: nothing but the path to it is held.
    fn list_dir(
        &self,
        dir: &Path,
        prefix: &str,
        f: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        let entries = fs::read_dir(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(dir.display().to_string(), e))?;
            let Ok(fname) = entry.file_name().into_string() else {
                continue;
            };
            if fname.starts_with(TMP_PREFIX) {
                continue;
            }
            let ft = entry
                .file_type()
                .map_err(|e| Error::io(dir.display().to_string(), e))?;
            let name = format!("{prefix}{fname}");
            if ft.is_dir() {
                self.list_dir(&entry.path(), &format!("{name}/"), f)?;
            } else if ft.is_file() {
                f(&name)?;
            }
        }
        Ok(())
    }
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn is_read_only_error(e: &io::Error) -> bool {
    e.kind() == ErrorKind::PermissionDenied || e.raw_os_error() == Some(libc::EROFS)
}

fn not_found(name: &str) -> Error {
    Error::io(name, io::Error::new(ErrorKind::NotFound, "no such object"))
}

impl UntrustedStore for LocalDirStore {
    fn modified(&self, name: &str) -> Option<std::time::SystemTime> {
        Self::check(name).ok()?;
        fs::metadata(self.path_of(name))
            .and_then(|m| m.modified())
            .ok()
    }

    fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
        Self::check(name)?;
        let file = self
            .handle(name, false, false)?
            .ok_or_else(|| not_found(name))?;
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(name, e)),
            }
        }
        Ok(done)
    }

    fn write_at(&self, name: &str, off: u64, data: &[u8]) -> Result<()> {
        Self::check(name)?;
        let file = self.handle(name, true, true)?.expect("created");
        // A write past the end leaves a hole, which reads as zeros.
        logged(
            self.log(),
            || file.write_all_at(data, off),
            |r| FsCall::Write {
                path: r(&self.path_of(name)),
                off,
                data: data.to_vec(),
            },
        )
        .map_err(|e| Error::io(name, e))
    }

    fn absent(&self, name: &str) {
        let mut a = self.absent.lock().unwrap();
        if a.names.contains(name) {
            return;
        }
        while a.order.len() >= ABSENT_KEPT {
            if let Some(old) = a.order.pop_front() {
                a.names.remove(&old);
            }
        }
        a.names.insert(name.to_string());
        a.order.push_back(name.to_string());
    }

    fn len(&self, name: &str) -> Result<Option<u64>> {
        Self::check(name)?;
        if self.known_absent(name) {
            return Ok(None);
        }
        match fs::metadata(self.path_of(name)) {
            Ok(m) if m.is_file() => Ok(Some(m.len())),
            Ok(_) => Ok(None),
            Err(e)
                if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                Ok(None)
            }
            Err(e) => Err(Error::io(name, e)),
        }
    }

    fn set_len(&self, name: &str, len: u64) -> Result<()> {
        Self::check(name)?;
        let file = self.handle(name, true, true)?.expect("created");
        logged(
            self.log(),
            || file.set_len(len),
            |r| FsCall::SetLen {
                path: r(&self.path_of(name)),
                len,
            },
        )
        .map_err(|e| Error::io(name, e))
    }

    /// Writes zeros from the object's end up to `len` (the object grows to `len`): real
    /// blocks, not `fallocate`'s unwritten extents, so that a later write over them and its
    /// `fdatasync` change no metadata, and ext4 commits no journal transaction for it. The
    /// log's records are written over this room: an fsync then syncs only those bytes and
    /// never waits for a journal commit, which under a concurrent bulk writer waits in turn
    /// for that writer's data (`data=ordered`): 14 ms against 1 ms per fsync, measured in
    /// docs/performance.md. One commit per reservation (1 MiB of log) remains. Past the
    /// end, zeros read as nothing to the log (a record of length 0 is not authentic).
    fn reserve(&self, name: &str, len: u64) -> Result<()> {
        const CHUNK: usize = 256 << 10;
        Self::check(name)?;
        let file = self.handle(name, true, true)?.expect("created");
        let mut at = file.metadata().map_err(|e| Error::io(name, e))?.len();
        let zeros = vec![0u8; CHUNK.min(len.saturating_sub(at) as usize)];
        while at < len {
            let n = (len - at).min(CHUNK as u64) as usize;
            self.write_at(name, at, &zeros[..n])?;
            at += n as u64;
        }
        Ok(())
    }

    fn delete(&self, name: &str) -> Result<()> {
        Self::check(name)?;
        let path = self.path_of(name);
        self.forget_handle(name);
        let r = logged(
            self.log(),
            || fs::remove_file(&path),
            |r| FsCall::Unlink(r(&path)),
        );
        self.forget_handle(name);
        match r {
            Ok(()) => {
                self.mark_dirty(parent_of(&path));
                Ok(())
            }
            Err(e)
                if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                Ok(())
            }
            Err(e) => Err(Error::io(name, e)),
        }
    }

    fn sync(&self, names: &[String]) -> Result<()> {
        for name in names {
            Self::check(name)?;
        }
        if names.len() > SYNCFS_THRESHOLD {
            return self.sync_all();
        }
        let per_thread = names.len().div_ceil(SYNC_THREADS).max(SYNCS_PER_THREAD);
        if names.len() <= per_thread {
            self.sync_files(names)?;
        } else {
            super::on_threads(names, per_thread, |some| self.sync_files(some))?;
        }
        for name in names {
            self.sync_dirs_for(name)?;
        }
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        let taken = std::mem::take(&mut *self.dirty_dirs.lock().unwrap());
        // SAFETY: `root_fd` is an open file owned by `self`, so its fd is valid for the
        // duration of the call; syncfs only reads the descriptor and touches no memory of ours.
        let syncfs = || match unsafe { libc::syncfs(self.root_fd.as_raw_fd()) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        };
        if let Err(e) = logged(self.log(), syncfs, |_| FsCall::Syncfs) {
            self.dirty_dirs.lock().unwrap().extend(taken);
            return Err(Error::io(self.root.display().to_string(), e));
        }
        Ok(())
    }

    fn list(&self) -> Result<Vec<String>> {
        super::names_of(self)
    }

    fn list_each(&self, f: &mut dyn FnMut(&str) -> Result<()>) -> Result<()> {
        self.list_dir(&self.root, "", f)
    }

    fn max_object_len(&self) -> u64 {
        *self.max_len.get_or_init(|| {
            let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
            let tmp = self
                .root
                .join(format!("{TMP_PREFIX}probe.{}.{seq}", std::process::id()));
            probe_max_len(&tmp)
        })
    }

    fn replace(&self, name: &str, data: &[u8]) -> Result<()> {
        Self::check(name)?;
        self.make_parents(name)?;
        let path = self.path_of(name);
        let dir = parent_of(&path);
        let base = path.file_name().and_then(|s| s.to_str()).unwrap_or("obj");
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{TMP_PREFIX}{base}.{}.{seq}", std::process::id()));
        let log = self.log();
        if let Err(e) = create_synced(log, &mut OpenOptions::new(), &tmp, data) {
            let _ = fs::remove_file(&tmp);
            return Err(Error::io(name, e));
        }
        self.forget_handle(name);
        let r = rename(log, &tmp, &path);
        self.forget_handle(name);
        if let Err(e) = r {
            let _ = fs::remove_file(&tmp);
            return Err(Error::io(name, e));
        }
        self.present(name);
        self.mark_dirty(dir);
        self.sync_dirs_for(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, LocalDirStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDirStore::open(dir.path()).unwrap();
        (dir, s)
    }

    #[test]
    fn open_requires_existing_root() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = LocalDirStore::open(&missing).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
        let s = LocalDirStore::create(missing.join("deeper")).unwrap();
        s.write_at("x", 0, b"1").unwrap();
        assert!(missing.join("deeper/x").is_file());
        // A regular file is no root, and neither is a path through one (the system's
        // reason, not "does not exist").
        let file = missing.join("deeper/x");
        let err = LocalDirStore::open(&file).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        let err = LocalDirStore::open(file.join("y")).unwrap_err();
        assert!(
            matches!(&err, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOTDIR)),
            "{err}"
        );
    }

    /// A read goes through the handle a write left open, and a write through one a read
    /// left (no open per call).
    #[test]
    fn reads_and_writes_share_one_handle() {
        let (_d, s) = store();
        s.write_at("x.d", 0, b"1").unwrap();
        let handle = || s.handles.lock().unwrap()["x.d"].file.clone();
        let h = handle();
        let mut b = [0u8; 1];
        s.read_at("x.d", 0, &mut b).unwrap();
        s.write_at("x.d", 1, b"2").unwrap();
        assert!(Arc::ptr_eq(&h, &handle()));
        // Below the bound, every object keeps its handle.
        s.write_at("y.d", 0, b"1").unwrap();
        s.read_at("x.d", 0, &mut b).unwrap();
        s.write_at("z.d", 0, b"1").unwrap();
        assert_eq!(s.handles.lock().unwrap().len(), 3);
        assert!(Arc::ptr_eq(&h, &handle()));
    }

    /// What counts as a store that may be read but not written.
    #[test]
    fn read_only_errors() {
        let e = |n| io::Error::from_raw_os_error(n);
        assert!(is_read_only_error(&e(libc::EROFS)));
        assert!(is_read_only_error(&e(libc::EACCES)));
        for other in [libc::ENOENT, libc::EIO, libc::ENOSPC, libc::EISDIR] {
            assert!(!is_read_only_error(&e(other)), "{other}");
        }
    }

    /// The length of what is not an object: none for a directory or a path through an
    /// object, an error for a name the file system refuses.
    #[test]
    fn lengths_of_what_is_not_an_object() {
        let (_d, s) = store();
        s.write_at("a/x.d", 0, b"1").unwrap();
        assert_eq!(s.len("a").unwrap(), None);
        assert_eq!(s.len("a/x.d/y").unwrap(), None);
        assert_eq!(s.len("b/y").unwrap(), None);
        let long = "n".repeat(300);
        assert!(s.len(&long).is_err());
        assert!(s.read_at("a", 0, &mut [0u8; 4]).is_err());
    }

    /// A sync on several threads fails when one object's sync fails, after syncing the
    /// others, and leaves the directories dirty for the next sync.
    #[test]
    fn a_sync_on_threads_reports_a_failed_object() {
        let d = tempfile::tempdir().unwrap();
        let log = Arc::new(FsLog::new(d.path()));
        let s = LocalDirStore::open_logged(d.path(), Arc::clone(&log)).unwrap();
        let mut names: Vec<String> = (0..40).map(|i| format!("o/{i}.d")).collect();
        for n in &names {
            s.write_at(n, 0, b"x").unwrap();
        }
        // A directory is no object: opening it for writing fails (EISDIR). 41 names go
        // 8 to a thread, and this one is the last of its thread's share.
        names.insert(31, "o".to_string());
        let at = log.len();
        let e = s.sync(&names).unwrap_err();
        assert!(e.to_string().contains('o'), "{e}");
        let synced = log.calls()[at..]
            .iter()
            .filter(|c| matches!(c, FsCall::Fsync(_)))
            .count();
        assert_eq!(synced, 40, "every other thread ran to its end");
        assert!(s.dirty_dirs.lock().unwrap().contains(&d.path().join("o")));
        names.remove(31);
        s.sync(&names).unwrap();
        assert!(s.dirty_dirs.lock().unwrap().is_empty());
    }

    /// The calls a sync makes, as recorded: up to [`SYNCFS_THRESHOLD`] objects, an
    /// `fdatasync` each and a fsync of each directory that got an entry; past it one
    /// `syncfs`. A deletion dirties its directory; deleting what is not there does not.
    #[test]
    fn the_calls_a_sync_makes() {
        let d = tempfile::tempdir().unwrap();
        let log = Arc::new(FsLog::new(d.path()));
        let s = LocalDirStore::open_logged(d.path(), Arc::clone(&log)).unwrap();
        let names: Vec<String> = (0..=SYNCFS_THRESHOLD).map(|i| format!("o/{i}.d")).collect();
        for n in &names {
            s.write_at(n, 0, b"x").unwrap();
        }
        let count = |from: usize, f: &dyn Fn(&FsCall) -> bool| {
            log.calls()[from..].iter().filter(|c| f(c)).count()
        };
        let at = log.len();
        s.sync(&names[..SYNCFS_THRESHOLD]).unwrap();
        assert_eq!(
            count(at, &|c| matches!(c, FsCall::Fsync(_))),
            SYNCFS_THRESHOLD
        );
        assert_eq!(
            count(at, &|c| matches!(c, FsCall::FsyncDir(_))),
            2,
            "o/ and the root"
        );
        assert_eq!(count(at, &|c| matches!(c, FsCall::Syncfs)), 0);
        for few in [1, SYNCS_PER_THREAD, SYNCS_PER_THREAD + 1] {
            let at = log.len();
            s.sync(&names[..few]).unwrap();
            assert_eq!(count(at, &|c| matches!(c, FsCall::Fsync(_))), few);
        }
        let at = log.len();
        s.sync(&names).unwrap();
        assert_eq!(log.calls()[at..], [FsCall::Syncfs]);
        let at = log.len();
        s.sync(&[]).unwrap();
        assert_eq!(log.len(), at);
        // A deletion dirties its directory, which the next sync_all covers.
        s.delete("o/0.d").unwrap();
        s.delete("o/0.d").unwrap();
        s.delete("o/1.d/under").unwrap();
        assert!(s.delete("o").is_err(), "a directory is no object");
        assert_eq!(
            *s.dirty_dirs.lock().unwrap(),
            HashSet::from([d.path().join("o")])
        );
        s.sync_all().unwrap();
        assert!(s.dirty_dirs.lock().unwrap().is_empty());
        assert_eq!(log.calls().last(), Some(&FsCall::Syncfs));
    }

    /// The probe finds the file system's largest file exactly: that length can be set,
    /// one byte more cannot; the probe leaves nothing behind.
    #[test]
    fn the_largest_file_is_probed_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("probe");
        let max = probe_max_len(&tmp);
        assert!(!tmp.exists());
        assert!(max > 1 << 32 && max < u64::MAX, "{max}");
        let f = File::create(dir.path().join("big")).unwrap();
        f.set_len(max).unwrap();
        let e = f.set_len(max + 1).unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::EFBIG) | Some(libc::EINVAL)),
            "{e}"
        );
        let (_d, s) = store();
        assert_eq!(s.max_object_len(), max, "same file system");
    }

    /// Directories made by another handle on the same root (another process, an earlier
    /// open) are used as they are.
    #[test]
    fn parents_made_by_another_handle_are_used() {
        let (dir, s) = store();
        s.write_at("a/b/x.d", 0, b"1").unwrap();
        let other = LocalDirStore::open(dir.path()).unwrap();
        other.write_at("a/b/y.d", 0, b"2").unwrap();
        other.write_at("a/c/z.d", 0, b"3").unwrap();
        let mut names = s.list().unwrap();
        names.sort();
        assert_eq!(names, ["a/b/x.d", "a/b/y.d", "a/c/z.d"]);
        // Only the directory that got a new entry is dirty: a/ (for c/) and a/c/ (for z.d).
        let dirty = other.dirty_dirs.lock().unwrap().clone();
        let want: HashSet<PathBuf> = [
            dir.path().join("a"),
            dir.path().join("a/b"),
            dir.path().join("a/c"),
        ]
        .into_iter()
        .collect();
        assert_eq!(dirty, want);
    }

    #[test]
    fn round_trip_and_zero_fill() {
        let (dir, s) = store();
        s.write_at("a/b/c.d", 4, b"xyz").unwrap();
        assert!(dir.path().join("a/b/c.d").is_file());
        assert_eq!(s.len("a/b/c.d").unwrap(), Some(7));
        assert_eq!(s.read_all("a/b/c.d").unwrap().unwrap(), b"\0\0\0\0xyz");
        s.write_at("a/b/c.d", 1, b"Q").unwrap();
        assert_eq!(s.read_all("a/b/c.d").unwrap().unwrap(), b"\0Q\0\0xyz");
        let made: HashSet<PathBuf> = [
            dir.path().to_path_buf(),
            dir.path().join("a"),
            dir.path().join("a/b"),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            *s.dirty_dirs.lock().unwrap(),
            made,
            "each new entry's directory"
        );
        s.sync(&["a/b/c.d".to_string()]).unwrap();
        assert!(s.dirty_dirs.lock().unwrap().is_empty());
        s.sync_all().unwrap();
    }

    #[test]
    fn short_reads_at_eof_and_missing() {
        let (_d, s) = store();
        s.write_at("o", 0, b"hello").unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(s.read_at("o", 3, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"lo");
        assert_eq!(s.read_at("o", 10, &mut buf).unwrap(), 0);
        let err = s.read_at("missing", 0, &mut buf).unwrap_err();
        assert!(
            matches!(err, Error::Io { ref source, .. } if source.kind() == ErrorKind::NotFound)
        );
        assert_eq!(s.len("missing").unwrap(), None);
        assert_eq!(s.read_all("missing").unwrap(), None);
        assert_eq!(s.len("o/under-a-file").unwrap(), None);
    }

    #[test]
    fn set_len_both_ways() {
        let (_d, s) = store();
        s.set_len("n/x", 3).unwrap();
        assert_eq!(s.read_all("n/x").unwrap().unwrap(), vec![0; 3]);
        s.write_at("n/x", 0, b"abc").unwrap();
        s.set_len("n/x", 1).unwrap();
        assert_eq!(s.read_all("n/x").unwrap().unwrap(), b"a");
        s.set_len("n/x", 4).unwrap();
        assert_eq!(s.read_all("n/x").unwrap().unwrap(), b"a\0\0\0");
    }

    #[test]
    fn delete_and_list() {
        let (_d, s) = store();
        s.delete("never").unwrap();
        s.delete("no/such/dir").unwrap();
        for n in ["a", "b/c", "b/d/e", "journal.0"] {
            s.write_at(n, 0, n.as_bytes()).unwrap();
        }
        s.replace("b/r", b"r").unwrap();
        let mut l = s.list().unwrap();
        l.sort();
        assert_eq!(l, ["a", "b/c", "b/d/e", "b/r", "journal.0"]);
        s.delete("b/c").unwrap();
        assert_eq!(s.len("b/c").unwrap(), None);
        let mut buf = [0u8; 1];
        assert!(s.read_at("b/c", 0, &mut buf).is_err());
        s.sync(&["b/c".to_string()]).unwrap();
        assert!(!s.dirty_dirs.lock().unwrap().contains(&s.root.join("b")));
        assert!(!s.dirty_dirs.lock().unwrap().contains(&s.root));
        // Rewriting a deleted object starts from empty (no stale cached handle).
        s.write_at("b/c", 2, b"z").unwrap();
        assert_eq!(s.read_all("b/c").unwrap().unwrap(), b"\0\0z");
    }

    /// Handles are opened without the cache's lock; one opened by a reader while the
    /// object is deleted and written again is never cached: each write lands in the file
    /// the name holds.
    #[test]
    fn a_handle_opened_during_a_delete_is_not_kept() {
        let (dir, s) = store();
        let s = Arc::new(s);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (s, stop) = (s.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = s.read_all("c.d");
                    }
                })
            })
            .collect();
        let path = dir.path().join("c.d");
        for i in 0..3000u32 {
            s.delete("c.d").unwrap();
            s.write_at("c.d", 0, &i.to_le_bytes()).unwrap();
            let on_disk = fs::read(&path).unwrap_or_default();
            assert_eq!(on_disk, i.to_le_bytes(), "write {i} went elsewhere");
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
    }

    #[test]
    fn replace_is_whole_and_drops_stale_handles() {
        let (dir, s) = store();
        s.write_at("cfg", 0, b"old contents, long").unwrap();
        assert_eq!(s.read_all("cfg").unwrap().unwrap(), b"old contents, long");
        s.replace("cfg", b"new").unwrap();
        assert_eq!(s.read_all("cfg").unwrap().unwrap(), b"new");
        s.replace("x/y/fresh", b"f").unwrap();
        assert_eq!(s.read_all("x/y/fresh").unwrap().unwrap(), b"f");
        // No temp files left behind.
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(TMP_PREFIX))
            .collect();
        assert!(leftovers.is_empty());
        // A leftover temp file (as after a crash) is not listed.
        fs::write(dir.path().join(format!("{TMP_PREFIX}cfg.1.1")), b"junk").unwrap();
        let mut l = s.list().unwrap();
        l.sort();
        assert_eq!(l, ["cfg", "x/y/fresh"]);
        // Everything created was synced by replace.
        assert!(s.dirty_dirs.lock().unwrap().is_empty());
    }

    #[test]
    fn bad_names_rejected() {
        let (_d, s) = store();
        for bad in [
            "",
            "/abs",
            "a/../b",
            "..",
            "a//b",
            "a/",
            "./a",
            "x\0y",
            ".intact-tmp.foo",
        ] {
            assert!(s.write_at(bad, 0, b"x").is_err(), "{bad:?}");
            assert!(s.replace(bad, b"x").is_err(), "{bad:?}");
            assert!(s.set_len(bad, 1).is_err(), "{bad:?}");
            assert!(s.delete(bad).is_err(), "{bad:?}");
            let mut buf = [0u8; 1];
            assert!(s.read_at(bad, 0, &mut buf).is_err(), "{bad:?}");
        }
    }

    /// Room is reserved as zeros written up to the length asked (real blocks, so that a
    /// later write over them changes no metadata); a smaller reservation changes nothing.
    #[test]
    fn reserve_writes_zeros_up_to_the_length() {
        let (_d, s) = store();
        s.write_at("n/x", 0, b"abc").unwrap();
        s.reserve("n/x", 600 << 10).unwrap();
        let b = s.read_all("n/x").unwrap().unwrap();
        assert_eq!(b.len(), 600 << 10);
        assert_eq!(&b[..3], b"abc");
        assert!(b[3..].iter().all(|&x| x == 0));
        s.reserve("n/x", 10).unwrap();
        assert_eq!(s.len("n/x").unwrap(), Some(600 << 10));
        s.reserve("n/new", 5).unwrap();
        assert_eq!(s.read_all("n/new").unwrap().unwrap(), [0u8; 5]);
        // No unwritten extents: every block of the reservation is allocated.
        let meta = std::fs::metadata(s.path_of("n/x")).unwrap();
        assert!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512 >= 600 << 10);
    }

    /// The hint of absent objects: a hinted name is absent without a look at the file
    /// system (so even a wrong hint reads as absent: nothing read is trusted for it), its
    /// first write creates it (over what a wrong hint hid, keeping the bytes past the
    /// write), and then it is an object like any other; the hint keeps at most
    /// `ABSENT_KEPT` names, the oldest forgotten first.
    #[test]
    fn absent_names_are_created_without_a_look_first() {
        let (_d, s) = store();
        s.absent("f/ab/new.d");
        assert_eq!(s.len("f/ab/new.d").unwrap(), None);
        s.write_at("f/ab/new.d", 0, b"hello").unwrap();
        assert_eq!(s.len("f/ab/new.d").unwrap(), Some(5));
        assert_eq!(s.read_all("f/ab/new.d").unwrap().unwrap(), b"hello");
        // A wrong hint: the object exists.
        s.write_at("f/cd/old.d", 0, b"0123456789").unwrap();
        s.forget_handle("f/cd/old.d");
        s.absent("f/cd/old.d");
        assert_eq!(s.len("f/cd/old.d").unwrap(), None, "the hint is believed");
        s.write_at("f/cd/old.d", 0, b"ab").unwrap();
        assert_eq!(s.read_all("f/cd/old.d").unwrap().unwrap(), b"ab23456789");
        assert_eq!(s.len("f/cd/old.d").unwrap(), Some(10));
        // Bounded: the oldest hint goes first.
        s.write_at("f/ef/real.d", 0, b"x").unwrap();
        s.absent("f/ef/real.d");
        assert_eq!(s.len("f/ef/real.d").unwrap(), None);
        for i in 0..ABSENT_KEPT {
            s.absent(&format!("f/00/n{i}.d"));
        }
        assert_eq!(s.len("f/ef/real.d").unwrap(), Some(1), "forgotten");
        assert_eq!(
            s.len(&format!("f/00/n{}.d", ABSENT_KEPT - 1)).unwrap(),
            None
        );
        assert!(s.absent.lock().unwrap().order.len() <= ABSENT_KEPT);
    }

    #[test]
    fn handle_cache_is_bounded() {
        let (_d, s) = store();
        for i in 0..(MAX_HANDLES + 20) {
            s.write_at(&format!("f/{i}"), 0, &[i as u8]).unwrap();
        }
        assert!(s.handles.lock().unwrap().len() <= MAX_HANDLES);
        for i in 0..(MAX_HANDLES + 20) {
            assert_eq!(s.read_all(&format!("f/{i}")).unwrap().unwrap(), [i as u8]);
        }
    }

    #[test]
    fn concurrent_writers() {
        let (_d, s) = store();
        let s = Arc::new(s);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        s.write_at("shared.d", (t * 50 + i) * 4, &[t as u8; 4])
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let all = s.read_all("shared.d").unwrap().unwrap();
        assert_eq!(all.len(), 8 * 50 * 4);
        for (i, chunk) in all.chunks(200).enumerate() {
            assert!(chunk.iter().all(|&b| b == i as u8));
        }
    }
}
