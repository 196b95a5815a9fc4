//! The FUSE front end: a thin adapter from kernel requests to the inode API of
//! [`intact_core::Volume`]. No cipher, tree or store code lives here; every decision about
//! bytes is the engine's. What the adapter owns: errno mapping, kernel cache settings (see
//! docs/design.md, "FUSE"), directory-listing snapshots per open directory, the periodic
//! seal, and a clean unmount on SIGINT/SIGTERM/SIGHUP.
#![deny(missing_docs)]

pub mod memory;
mod refs;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};
use intact_core::format::{Kind, SchemeId, ROOT_INO};
use intact_core::volume::{
    killed_suidgid, Attr, Discarded, RenameMode, SetAttr, XattrMode, NAME_MAX,
};
use intact_core::{Error, FsErrorKind, Volume};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Let other users (and root) access the mount (`allow_other`; needs
    /// `user_allow_other` in /etc/fuse.conf for non-root mounters).
    pub allow_other: bool,
    /// Scheme of new files (`None`: the volume's default).
    pub scheme: Option<SchemeId>,
    /// New files follow the `auto` policy (overrides `scheme`).
    pub auto: bool,
    /// Threads serving kernel requests.
    pub threads: usize,
    /// Seal what was written at least this often (like ext4's commit interval); `None`
    /// seals only on fsync and unmount.
    pub commit_interval: Option<Duration>,
    /// The local directory backing the store, for `statfs` (free space).
    pub backing_dir: Option<PathBuf>,
    /// Kernel attribute and entry cache lifetime.
    pub attr_ttl: Duration,
    /// Where to keep the mount's status (JSON: pid, mount point, integrity failures), for
    /// `intact stat` while the volume is mounted. Rewritten on every integrity failure.
    pub status_file: Option<PathBuf>,
    /// The mount point (recorded in the status file).
    pub mountpoint: PathBuf,
    /// Whether SIGHUP unmounts (a foreground mount) or is ignored (a daemon).
    pub unmount_on_hangup: bool,
    /// Every file opened with direct I/O (FOPEN_DIRECT_IO) and no writeback cache: each
    /// read and write reaches the engine. Shared mmap goes through the page cache
    /// (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6 and later).
    pub direct_io: bool,
    /// Who hears of integrity failures besides the log ([`Alarms`]).
    pub alarms: Option<Arc<Alarms>>,
}

/// Integrity failures for those who watch: each is appended as one JSON line to a file
/// (time, request, object, block, what), and the first failure of each object runs a
/// command (`sh -c`, on a thread of its own that waits for it) with the failure in its
/// environment: INTACT_ALARM_PATH, INTACT_ALARM_BLOCK (empty when none),
/// INTACT_ALARM_KIND, INTACT_ALARM_WHAT, INTACT_MOUNTPOINT. Shared by the mount's
/// requests and its background scrub.
#[derive(Debug)]
pub struct Alarms {
    file: Option<PathBuf>,
    command: Option<String>,
    mountpoint: PathBuf,
    /// Objects whose first failure ran the command.
    heard: Mutex<std::collections::HashSet<String>>,
}

impl Alarms {
    /// Failures go to `file` and run `command`, for the mount at `mountpoint`.
    pub fn new(file: Option<PathBuf>, command: Option<String>, mountpoint: PathBuf) -> Alarms {
        Alarms {
            file,
            command,
            mountpoint,
            heard: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Reports an integrity failure of `object` (block `block`) found by `op`.
    pub fn raise(&self, op: &str, object: &str, block: Option<u64>, what: &str) {
        if let Some(path) = &self.file {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let line = serde_json::json!({
                "time_unix": now,
                "kind": "integrity",
                "request": op,
                "object": object,
                "block": block,
                "what": what,
                "mountpoint": self.mountpoint.display().to_string(),
            })
            .to_string()
                + "\n";
            // One append per line: lines of concurrent failures do not interleave.
            let r = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            if let Err(err) = r {
                tracing::warn!(error = %err, path = %path.display(), "cannot write the alarms file");
            }
        }
        let Some(cmd) = &self.command else { return };
        if !lock(&self.heard).insert(object.to_string()) {
            return;
        }
        let spawned = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .env("INTACT_ALARM_PATH", object)
            .env(
                "INTACT_ALARM_BLOCK",
                block.map(|b| b.to_string()).unwrap_or_default(),
            )
            .env("INTACT_ALARM_KIND", "integrity")
            .env("INTACT_ALARM_WHAT", what)
            .env("INTACT_MOUNTPOINT", &self.mountpoint)
            .stdin(std::process::Stdio::null())
            .spawn();
        match spawned {
            Ok(mut child) => {
                let reaped = std::thread::Builder::new()
                    .name("intact-on-alarm".into())
                    .spawn(move || {
                        if let Ok(st) = child.wait() {
                            if !st.success() {
                                tracing::warn!(status = %st, "the --on-alarm command failed");
                            }
                        }
                    });
                if let Err(err) = reaped {
                    tracing::warn!(error = %err, "no thread to wait for the --on-alarm command");
                }
            }
            Err(err) => tracing::error!(error = %err, "cannot run the --on-alarm command"),
        }
    }
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            scheme: None,
            auto: false,
            threads: 8,
            commit_interval: Some(Duration::from_secs(5)),
            backing_dir: None,
            attr_ttl: Duration::from_secs(10),
            status_file: None,
            mountpoint: PathBuf::new(),
            unmount_on_hangup: true,
            direct_io: false,
            alarms: None,
        }
    }
}

/// The errno an engine error becomes. Integrity failures are EIO (never wrong bytes).
pub fn errno(e: &Error) -> Errno {
    match e {
        Error::Tampered { .. } | Error::Crashed | Error::Poisoned(_) => Errno::EIO,
        Error::Lost { errno, .. } => errno.map(Errno::from_i32).unwrap_or(Errno::EIO),
        Error::Io { source, .. } => source
            .raw_os_error()
            .map(Errno::from_i32)
            .unwrap_or(Errno::EIO),
        Error::Fs { kind, .. } => match kind {
            FsErrorKind::NotFound => Errno::ENOENT,
            FsErrorKind::Exists => Errno::EEXIST,
            FsErrorKind::NotADirectory => Errno::ENOTDIR,
            FsErrorKind::IsADirectory => Errno::EISDIR,
            FsErrorKind::NotEmpty => Errno::ENOTEMPTY,
            FsErrorKind::NameTooLong => Errno::ENAMETOOLONG,
            FsErrorKind::InvalidName => Errno::EINVAL,
            FsErrorKind::TooLarge => Errno::EFBIG,
            FsErrorKind::ReadOnly => Errno::EROFS,
            FsErrorKind::RenameIntoSelf => Errno::EINVAL,
            FsErrorKind::NoAttribute => Errno::ENODATA,
            FsErrorKind::NotPermitted => Errno::EPERM,
            FsErrorKind::ValueTooLarge => Errno::E2BIG,
            FsErrorKind::NotSupported => Errno::EOPNOTSUPP,
            FsErrorKind::NoSpace => Errno::ENOSPC,
        },
        Error::Locked(_) => Errno::EBUSY,
        _ => Errno::EINVAL,
    }
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

fn ns_of(t: TimeOrNow) -> i64 {
    match t {
        TimeOrNow::SpecificTime(t) => ns(t),
        TimeOrNow::Now => ns(SystemTime::now()),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
        Kind::File | Kind::Free | Kind::Xattr | Kind::Data => FileType::RegularFile,
    }
}

fn name_str(name: &OsStr) -> Result<&str, Errno> {
    name.to_str().ok_or(Errno::EILSEQ)
}

/// The file system served to the kernel.
pub struct IntactFs {
    vol: Arc<Volume>,
    opts: MountOptions,
    /// The kernel's lookup count per inode (every entry reply adds one, FORGET subtracts its
    /// count). The engine hears of an inode's FORGET only when the count reaches zero: until
    /// then the kernel may still send requests for it, so a freed number is not reused.
    lookups: Mutex<refs::RefCounts>,
    next_fh: AtomicU64,
    /// Handles that may write, per inode: the files whose pages the kernel may still hold
    /// dirty (a close waits for its file's writeback), which `intact sync` makes the kernel
    /// hand over ([`WRITERS_XATTR`]).
    writers: Mutex<BTreeMap<u64, u32>>,
    sealer: Option<Periodic>,
    /// Gives free heap pages back every [`TRIM_EVERY`], read-only mounts too.
    trimmer: Option<Periodic>,
    /// A follower's refresh ([`Volume::refresh`]).
    follower: Option<Periodic>,
    /// Where bulk writes are served ([`BulkWrites`]); `None` before `init` and read-only.
    bulk: Option<BulkWrites>,
    report: Reporter,
    /// The volume's block size (fixed; read once instead of locking the engine per reply).
    bs: u32,
    /// Tells the kernel what it caches went stale (set by [`serve`] once the session is).
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
}

/// What the adapter's threads share to report failures: the log, and the status file
/// that `intact stat` reads.
#[derive(Clone)]
struct Reporter {
    vol: Arc<Volume>,
    status_file: Option<PathBuf>,
    mountpoint: PathBuf,
    last_failure: Arc<Mutex<Option<String>>>,
    /// Held while the status file is written: one writer at a time, each writing the
    /// counts it reads under the lock, so the file always ends with the latest counts.
    status_lock: Arc<Mutex<()>>,
    alarms: Option<Arc<Alarms>>,
}

impl Reporter {
    /// Records the mount's state for `intact stat` (best effort: a failure is logged). One
    /// writer at a time, through a temporary file renamed over the status file, so a reader
    /// sees a whole file and the last write holds the latest counts.
    fn write_status(&self, mounted: bool) {
        let Some(path) = &self.status_file else {
            return;
        };
        let _one = self.status_lock.lock().unwrap_or_else(|p| p.into_inner());
        let last_failure = self
            .last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let status = serde_json::json!({
            "mounted": mounted,
            "pid": std::process::id(),
            "mountpoint": self.mountpoint.display().to_string(),
            "integrity_failures": self.vol.integrity_failures(),
            "last_failure": last_failure,
            "updated_unix": SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        });
        let json = serde_json::to_string_pretty(&status).expect("json") + "\n";
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let r = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = r {
            tracing::warn!(error = %e, path = %path.display(), "cannot write the status file");
        }
    }

    /// An integrity failure for those who watch ([`Alarms`]).
    fn alarm(&self, op: &str, e: &Error) {
        let Some(alarms) = &self.alarms else { return };
        match e {
            Error::Tampered {
                subject,
                block,
                what,
            } => alarms.raise(op, &subject.to_string(), *block, what),
            other => alarms.raise(op, "", None, &other.to_string()),
        }
    }

    /// Logs an engine error (integrity failures loudly, with path and block) and maps it.
    fn fail(&self, op: &str, e: Error) -> Errno {
        if matches!(e, Error::Lost { .. }) && !BY_HANDLE.contains(&op) {
            // The inode was created since the last seal and discarded with a failed commit:
            // the kernel reached it through a name it still caches. ESTALE makes it look
            // the name up again (and find it gone) instead of failing the call; the loss
            // itself is reported to the descriptors that wrote, by the calls below.
            tracing::debug!(op, error = %e, "stale inode: ESTALE");
            return Errno::ESTALE;
        }
        if e.is_tampered() {
            tracing::error!(op, error = %e, "integrity failure: returning EIO");
            *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            self.write_status(true);
            self.alarm(op, &e);
        } else if matches!(
            e,
            Error::Io { .. } | Error::Poisoned(_) | Error::Lost { .. }
        ) {
            tracing::error!(op, error = %e, "I/O failure");
        } else {
            tracing::debug!(op, error = %e);
        }
        errno(&e)
    }
}

/// Requests made through an open descriptor: a change lost with a failed commit is
/// reported to them with the failure's errno (as Linux reports a writeback error). Other
/// requests name an inode the kernel found by name, and hear ESTALE ([`Reporter::fail`]).
const BY_HANDLE: &[&str] = &[
    "read",
    "write",
    "flush",
    "fsync",
    "release",
    "fallocate",
    "readdir",
    "readdirplus",
    "fsyncdir",
    "fgetattr",
    "fsetattr",
];

/// Bulk writes (a copy, a backup, the kernel's writeback of a large file), served by a
/// thread of their own instead of the kernel's request threads (issue 14). A bulk write
/// takes its turn behind other requests at the engine lock and may wait for a seal when
/// its writer fills memory ([`Volume::write_ino`]); on a request thread, a few of them
/// held every thread, and a lookup or a create of another process found none free.
/// Replies are sent from the worker; the queue is bounded, so the memory held by writes
/// not yet served is too (the request thread waits when it is full).
struct BulkWrites {
    queue: Option<std::sync::mpsc::SyncSender<BulkWrite>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct BulkWrite {
    ino: u64,
    offset: u64,
    data: Vec<u8>,
    reply: ReplyWrite,
}

/// Bulk writes queued at most (each up to the mount's largest write, 1 MiB): what they hold
/// is bounded at 64 MiB. The kernel keeps less than that in flight for one mount (its dirty
/// limit for a FUSE mount is 1 % of the system's), so writeback does not fill the queue;
/// when it is full, the request thread waits for room.
const BULK_QUEUE: usize = 64;
/// What the thread that applies bulk writes adds to its nice value: its encryption and hashing take a
/// core at a few hundred MB/s, and at the same priority as the request threads it made a
/// small request that woke up wait for a CPU for up to 10 ms on a machine of 2 cores
/// (`perf sched timehist` under bench/latency.py). At 5 the scheduler gives it about a
/// third of a request thread's share when both want the CPU, and all of an idle one
/// (docs/performance.md, "Checkpoints that sync what they wrote").
const BULK_NICE: libc::c_int = 5;
/// Requests the kernel sends in the background (writeback, readahead) before it queues
/// them on its side. Above what one mount's dirty limit lets it have in flight, so that
/// the writeback of a small file never waits in the kernel behind a bulk writer's.
const MAX_BACKGROUND: u16 = 256;

/// The virtual extended attribute of the mount's root that lists the files open for
/// writing (`ino TAB path NUL` each), for `intact sync`: the kernel writes a file's cached
/// pages back and waits for the daemon's answers when a descriptor of it is closed, which
/// `sync(2)` and `syncfs(2)` do not wait for on a FUSE mount (docs/design.md, "When data is
/// durable"). `WRITERS_XATTR.N` lists those after inode N. Never stored; not listed.
pub const WRITERS_XATTR: &str = "user.intact.writers";
/// Largest value of [`WRITERS_XATTR`] (the kernel's limit is 64 KiB).
pub const WRITERS_MAX: usize = 60 << 10;

/// A mutex's guard, whether or not a thread panicked while holding it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds `inc` to the calling thread's nice value (on Linux nice is per thread: glibc's
/// `nice` is `setpriority(PRIO_PROCESS, 0, ..)`, which acts on the calling thread).
/// A failure leaves the priority as it was, which costs only latency.
fn lower_priority(inc: libc::c_int) {
    // SAFETY: nice takes an integer, reads and writes no memory of ours, and changes only
    // the calling thread's scheduling priority; lowering it needs no privilege.
    unsafe {
        libc::nice(inc);
    }
}

impl BulkWrites {
    fn start(vol: Arc<Volume>, report: Reporter) -> std::io::Result<BulkWrites> {
        let (queue, jobs) = std::sync::mpsc::sync_channel::<BulkWrite>(BULK_QUEUE);
        let thread = std::thread::Builder::new()
            .name("intact-bulk".into())
            .spawn(move || {
                lower_priority(BULK_NICE);
                for w in jobs {
                    match vol.write_ino(w.ino, w.offset, &w.data) {
                        Ok(()) => w.reply.written(w.data.len() as u32),
                        Err(e) => w.reply.error(report.fail("write", e)),
                    }
                }
            })?;
        Ok(BulkWrites {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues a write, or gives it back if the worker is gone.
    fn submit(&self, w: BulkWrite) -> Result<(), BulkWrite> {
        match &self.queue {
            Some(q) => q.send(w).map_err(|e| e.0),
            None => Err(w),
        }
    }

    /// Serves what is queued, then ends the worker.
    fn stop(&mut self) {
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How often free heap pages are given back ([`memory`]): seldom, since the trim holds the
/// allocator's lock while it walks its free lists.
const TRIM_EVERY: Duration = Duration::from_secs(30);

/// How often a follower looks for the writer's newest root (`mount --ro --follow`).
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// A thread that runs `f` every `every` until stopped: the periodic seal
/// ([`Volume::seal_periodic`] every `commit_interval`) and the heap's trim.
struct Periodic {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Periodic {
    fn start(name: &str, every: Duration, mut f: impl FnMut() + Send + 'static) -> Periodic {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let (lock, cv) = &*s;
                let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                while !*stopped {
                    let (g, timeout) = cv
                        .wait_timeout(stopped, every)
                        .unwrap_or_else(|p| p.into_inner());
                    stopped = g;
                    if *stopped || !timeout.timed_out() {
                        continue;
                    }
                    f();
                }
            })
            .unwrap_or_else(|e| panic!("spawn the {name} thread: {e}"));
        Periodic {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl IntactFs {
    /// An adapter over `vol`.
    pub fn new(vol: Arc<Volume>, opts: MountOptions) -> IntactFs {
        // Unlinked files live until the kernel forgets them (it may still send requests).
        vol.track_references();
        IntactFs {
            bs: vol.block_size(),
            vol: vol.clone(),
            opts: opts.clone(),
            lookups: Mutex::new(refs::RefCounts::default()),
            next_fh: AtomicU64::new(1),
            writers: Mutex::new(BTreeMap::new()),
            sealer: None,
            trimmer: None,
            follower: None,
            bulk: None,
            notifier: Arc::new(std::sync::OnceLock::new()),
            report: Reporter {
                vol: vol.clone(),
                status_file: opts.status_file.clone(),
                mountpoint: opts.mountpoint.clone(),
                last_failure: Arc::new(Mutex::new(None)),
                status_lock: Arc::new(Mutex::new(())),
                alarms: opts.alarms.clone(),
            },
        }
    }

    fn fuse_attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.stored_bytes.div_ceil(512),
            atime: time(a.atime_ns),
            mtime: time(a.mtime_ns),
            ctime: time(a.ctime_ns),
            crtime: time(a.ctime_ns),
            kind: file_type(a.kind),
            perm: (a.mode & 0o7777) as u16,
            // A directory's: 2 plus its subdirectories, as on ext4.
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: self.bs.max(4096),
            flags: 0,
        }
    }

    fn write_status(&self, mounted: bool) {
        self.report.write_status(mounted);
    }

    fn fail(&self, op: &str, e: Error) -> Errno {
        self.report.fail(op, e)
    }

    /// Counts one more kernel reference to `ino` (before the reply that creates it is
    /// sent, so that a FORGET racing with it cannot see a count that is too low).
    fn remember(&self, ino: u64) {
        self.lookups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(ino);
    }

    /// The kernel dropped `nlookup` references to `ino`; at zero the engine may free an
    /// unlinked file and reuse the number.
    fn release_lookups(&self, ino: u64, nlookup: u64) {
        let mut l = self.lookups.lock().unwrap_or_else(|p| p.into_inner());
        if l.release(ino, nlookup) > 0 {
            return;
        }
        // Still under the lock: a lookup that would count a new reference waits, so the
        // engine never frees a number that a reply is about to hand out.
        if let Err(e) = self.vol.forget(ino) {
            self.fail("forget", e);
        }
    }

    fn entry(&self, r: intact_core::Result<Attr>, reply: ReplyEntry, op: &str) {
        match r {
            Ok(a) => {
                self.remember(a.ino);
                reply.entry(
                    &self.opts.attr_ttl,
                    &self.fuse_attr(&a),
                    Generation(a.generation),
                )
            }
            Err(e) => reply.error(self.fail(op, e)),
        }
    }

    fn empty(&self, r: intact_core::Result<()>, reply: ReplyEmpty, op: &str) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail(op, e)),
        }
    }

    /// Entries of directory `ino` past `offset` for a reply, a page at a time, until `add`
    /// says the reply is full (it returns `true`) or the directory ends: `.` at offset 1,
    /// `..` at 2, then the engine's entries at their cookies ([`Volume::readdir_page`]),
    /// which stay valid while the directory changes. No snapshot: an entry is read when it
    /// is returned, so a name removed since opendir is never returned, and a name is
    /// never paired with an inode number it no longer has. POSIX leaves open only whether
    /// entries added or removed during the listing appear.
    fn list(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, Option<Kind>, &str) -> Result<bool, Errno>,
        op: &str,
    ) -> Result<(), Errno> {
        const PAGE: usize = 64;
        let (parent, mut page) = self
            .vol
            .readdir_page(ino, offset, PAGE)
            .map_err(|e| self.fail(op, e))?;
        if offset < 1 && add(ino, 1, None, ".")? {
            return Ok(());
        }
        if offset < 2 && add(parent.max(1), 2, None, "..")? {
            return Ok(());
        }
        loop {
            let n = page.len();
            let mut last = offset;
            for (cookie, e) in page {
                if add(e.ino, cookie, Some(e.kind), &e.name)? {
                    return Ok(());
                }
                last = cookie;
            }
            if n < PAGE {
                return Ok(());
            }
            page = self
                .vol
                .readdir_page(ino, last, PAGE)
                .map_err(|e| self.fail(op, e))?
                .1;
        }
    }

    /// The kernel drops the attributes it caches of `ino`: the daemon changed its mode
    /// where no reply carries attributes (the set-ID bits a write, an open with `O_TRUNC`
    /// or a fallocate clears). Only the attributes: offset -1 keeps the pages.
    fn attrs_changed(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            if let Err(e) = n.inval_inode(INodeNo(ino), -1, 0) {
                tracing::debug!(ino, error = %e, "attribute invalidation");
            }
        }
    }

    /// Clears the set-ID bits of `ino` that a write or fallocate by a caller without
    /// `CAP_FSETID` clears, and tells the kernel when it did.
    fn kill_suidgid(&self, ino: u64) -> intact_core::Result<()> {
        if self.vol.kill_suidgid(ino)? {
            self.attrs_changed(ino);
        }
        Ok(())
    }

    /// Whether a truncate or fallocate of `ino` by the caller must clear set-ID bits: the
    /// file has some that Linux clears, and the caller lacks `CAP_FSETID`
    /// ([`holds_fsetid`], asked only then).
    fn kill_wanted(&self, req: &Request, ino: u64) -> bool {
        self.vol
            .attr(ino)
            .is_ok_and(|a| killed_suidgid(a.mode) != a.mode && !holds_fsetid(req))
    }

    fn new_fh(&self) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed) << 1)
    }

    /// How a file is opened: through the page cache, kept across opens (nobody else
    /// writes the volume), but with direct I/O when the mount asks for it, and while the
    /// store is full, so that write(2)
    /// itself gets ENOSPC instead of a cache that cannot be written back.
    fn open_flags(&self) -> FopenFlags {
        match self.opts.direct_io || self.vol.is_full() {
            true => FopenFlags::FOPEN_DIRECT_IO,
            false => FopenFlags::FOPEN_KEEP_CACHE,
        }
    }

    /// A handle of `ino` opened with `flags`; its low bit says it may write (its close
    /// reports discarded changes: a reader's close does not take that report). A handle
    /// that may write is counted in [`IntactFs::writers`] until its release.
    fn file_fh(&self, ino: u64, flags: i32) -> FileHandle {
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writes {
            *lock(&self.writers).entry(ino).or_insert(0) += 1;
        }
        FileHandle(self.new_fh().0 | u64::from(writes))
    }

    /// The value of [`WRITERS_XATTR`] (of the root) after inode `after`: `ino TAB path NUL`
    /// for the files open for writing with a known path, in inode order, up to
    /// [`WRITERS_MAX`] bytes. Unlinked files are left out: nothing can reach them.
    fn writers_after(&self, after: u64) -> Result<Vec<u8>, Error> {
        let inos: Vec<u64> = lock(&self.writers)
            .range(after.saturating_add(1)..)
            .map(|(ino, _)| *ino)
            .collect();
        let mut out = Vec::new();
        for ino in inos {
            let Some(path) = self.vol.path_of_ino(ino)? else {
                continue;
            };
            let line = format!("{ino}\t{path}\0");
            if out.len() + line.len() > WRITERS_MAX {
                break;
            }
            out.extend_from_slice(line.as_bytes());
        }
        Ok(out)
    }
}

macro_rules! name_or_reply {
    ($name:expr, $reply:expr) => {
        match name_str($name) {
            Ok(n) => n,
            Err(e) => return $reply.error(e),
        }
    };
}

impl Filesystem for IntactFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Every capability is optional: an older kernel that lacks one still mounts.
        let mut want = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_CACHE_SYMLINKS
            // The daemon clears set-user-ID and set-group-ID bits at writes, truncates and
            // chowns ([`SetAttr::kill_suidgid`]). In return the kernel stops asking for
            // `security.capability` before every write(2) (a GETXATTR round trip each)
            // once it knows a file has none (docs/design.md, "Set-ID bits").
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if self.opts.direct_io {
            want |= InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        } else if !self.vol.is_read_only() {
            // The engine is the only writer of the volume (it holds the trusted store's
            // lock), so the kernel may cache writes and attributes.
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        for flag in want.iter() {
            if config.add_capabilities(flag).is_err() {
                tracing::debug!(?flag, "kernel lacks capability");
            }
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND / 4 * 3);
        if !self.vol.is_read_only() {
            match BulkWrites::start(self.vol.clone(), self.report.clone()) {
                Ok(b) => self.bulk = Some(b),
                // Without the worker, bulk writes are served on the request threads.
                Err(e) => tracing::warn!(error = %e, "no thread for bulk writes"),
            }
        }
        if let Some(every) = self.opts.commit_interval {
            if !self.vol.is_read_only() {
                let vol = self.vol.clone();
                self.sealer = Some(Periodic::start("intact-sealer", every, move || {
                    if let Err(e) = vol.seal_periodic() {
                        tracing::error!(error = %e, "periodic seal failed");
                    }
                }));
            }
        }
        if self.vol.follows() {
            // A follower takes the writer's newest sealed root (Volume::refresh).
            let vol = self.vol.clone();
            self.follower = Some(Periodic::start("intact-follow", FOLLOW_EVERY, move || {
                if let Err(e) = vol.refresh() {
                    tracing::debug!(error = %e, "the writer's newest root does not open yet");
                }
            }));
        }
        // What requests freed (records, units, names of a walk) goes back to the system.
        self.trimmer = Some(Periodic::start(
            "intact-trim",
            TRIM_EVERY,
            memory::release_free_memory,
        ));
        self.write_status(true);
        tracing::info!("mounted");
        Ok(())
    }

    fn destroy(&mut self) {
        if let Some(mut b) = self.bulk.take() {
            b.stop();
        }
        for mut p in [
            self.sealer.take(),
            self.trimmer.take(),
            self.follower.take(),
        ]
        .into_iter()
        .flatten()
        {
            p.stop();
        }
        // The kernel holds no inode any more (it may not have sent every FORGET).
        if let Err(e) = self.vol.forget_all() {
            tracing::error!(error = %e, "freeing unlinked files failed");
        }
        if self.vol.follows() {
            tracing::info!(
                epoch = self.vol.epoch(),
                read_again = self.vol.rereads(),
                "unmounted; followed the writer to its root of this epoch, reading again \
                 under a newer root this many requests that met its changes"
            );
        }
        if !self.vol.is_read_only() {
            match self.vol.sync() {
                Ok(()) => tracing::info!("unmounted; everything sealed"),
                Err(e) => tracing::error!(error = %e, "final seal failed"),
            }
        }
        self.write_status(false);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name_or_reply!(name, reply);
        if name.len() > NAME_MAX {
            return reply.error(Errno::ENAMETOOLONG);
        }
        self.entry(self.vol.lookup(parent.0, name), reply, "lookup");
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.release_lookups(ino.0, nlookup);
    }

    // batch_forget: fuser's default calls `forget` for each node (its ForgetOne type is
    // not public in 0.18, so it cannot be overridden).

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.vol.attr(ino.0) {
            Ok(a) => reply.attr(&self.opts.attr_ttl, &self.fuse_attr(&a)),
            Err(e) => reply.error(self.fail(if fh.is_some() { "fgetattr" } else { "getattr" }, e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime_ns: atime.map(ns_of),
            mtime_ns: mtime.map(ns_of),
            // As Linux: a chown always, a truncate by a caller without CAP_FSETID.
            kill_suidgid: uid.is_some()
                || gid.is_some()
                || (size.is_some() && self.kill_wanted(req, ino.0)),
        };
        match self.vol.setattr(ino.0, &set) {
            Ok(a) => reply.attr(&self.opts.attr_ttl, &self.fuse_attr(&a)),
            Err(e) => reply.error(self.fail(if fh.is_some() { "fsetattr" } else { "setattr" }, e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.vol.readlink_ino(ino.0) {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(self.fail("readlink", e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let name = name_or_reply!(name, reply);
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => return reply.error(Errno::EINVAL),
        };
        if kind != Kind::File {
            // FIFOs, sockets and device nodes: inodes with no content (the kernel does
            // their I/O; the mount is nodev, so a device node here never opens a device).
            let r = self.vol.mknod_at(
                parent.0,
                name,
                kind,
                mode & 0o7777,
                rdev,
                req.uid(),
                req.gid(),
            );
            return self.entry(r, reply, "mknod");
        }
        let r = self
            .vol
            .create_at(
                parent.0,
                name,
                Kind::File,
                mode & 0o7777,
                req.uid(),
                req.gid(),
                self.opts.scheme,
            )
            .and_then(|a| match self.opts.auto {
                true => self
                    .vol
                    .set_auto(a.ino, true)
                    .and_then(|()| self.vol.attr(a.ino)),
                false => Ok(a),
            });
        self.entry(r, reply, "mknod");
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name_or_reply!(name, reply);
        let r = self.vol.create_at(
            parent.0,
            name,
            Kind::Dir,
            mode & 0o7777,
            req.uid(),
            req.gid(),
            None,
        );
        self.entry(r, reply, "mkdir");
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_or_reply!(name, reply);
        self.empty(self.vol.unlink_at(parent.0, name), reply, "unlink");
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_or_reply!(name, reply);
        self.empty(self.vol.rmdir_at(parent.0, name), reply, "rmdir");
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let name = name_or_reply!(link_name, reply);
        let target = name_or_reply!(target.as_os_str(), reply);
        let r = self
            .vol
            .symlink_at(parent.0, name, target, req.uid(), req.gid());
        self.entry(r, reply, "symlink");
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let name = name_or_reply!(name, reply);
        let newname = name_or_reply!(newname, reply);
        let mode = if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            RenameMode::Exchange
        } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            RenameMode::NoReplace
        } else if flags.is_empty() {
            RenameMode::Replace
        } else {
            return reply.error(Errno::EINVAL);
        };
        let r = self
            .vol
            .rename_at(parent.0, name, newparent.0, newname, mode);
        self.empty(r, reply, "rename");
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let name = name_or_reply!(newname, reply);
        self.entry(self.vol.link_at(ino.0, newparent.0, name), reply, "link");
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if let Err(e) = self.vol.open_handle(ino.0) {
            return reply.error(self.fail("open", e));
        }
        if flags.0 & libc::O_TRUNC != 0 && flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            let set = SetAttr {
                size: Some(0),
                kill_suidgid: self.kill_wanted(req, ino.0),
                ..SetAttr::default()
            };
            if let Err(e) = self.vol.setattr(ino.0, &set) {
                let _ = self.vol.release_handle(ino.0);
                return reply.error(self.fail("open", e));
            }
            if set.kill_suidgid {
                self.attrs_changed(ino.0);
            }
        }
        // The page cache stays valid across opens: nobody else writes the volume.
        reply.opened(self.file_fh(ino.0, flags.0), self.open_flags());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut buf = vec![0u8; size as usize];
        match self.vol.read_ino(ino.0, offset, &mut buf) {
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(self.fail("read", e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // Set by the kernel for a caller without CAP_FSETID (FUSE_HANDLE_KILLPRIV_V2).
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.kill_suidgid(ino.0) {
                return reply.error(self.fail("write", e));
            }
        }
        let reply = match &self.bulk {
            Some(bulk) if Volume::is_bulk_write(data.len()) => {
                let w = BulkWrite {
                    ino: ino.0,
                    offset,
                    data: data.to_vec(),
                    reply,
                };
                match bulk.submit(w) {
                    Ok(()) => return,
                    Err(w) => w.reply,
                }
            }
            _ => reply,
        };
        match self.vol.write_ino(ino.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(self.fail("write", e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() does not seal (as on a local file system, fsync does); the periodic seal
        // bounds what a crash can lose. The close of a descriptor that may write reports,
        // once, changes a failed commit discarded (as Linux reports a writeback error at
        // close).
        if fh.0 & 1 == 0 {
            return reply.ok();
        }
        self.empty(self.vol.take_lost(ino.0), reply, "flush");
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if fh.0 & 1 == 1 {
            let mut w = lock(&self.writers);
            if let Some(n) = w.get_mut(&ino.0) {
                *n -= 1;
                if *n == 0 {
                    w.remove(&ino.0);
                }
            }
        }
        self.empty(self.vol.release_handle(ino.0), reply, "release");
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // After it, this file's data and its names are durable and rollback-protected: the
        // seal that holds its last change has ended (a seal covers the whole volume; an
        // fsync of a file with nothing unsealed costs nothing).
        self.empty(self.vol.fsync(ino.0), reply, "fsync");
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.vol.attr(ino.0) {
            Ok(a) if a.kind == Kind::Dir => reply.opened(self.new_fh(), FopenFlags::empty()),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(self.fail("opendir", e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.list(
            ino.0,
            offset,
            |eino, off, kind, name| {
                let kind = kind.map_or(FileType::Directory, file_type);
                Ok(reply.add(INodeNo(eino), off, kind, name))
            },
            "readdir",
        );
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.list(
            ino.0,
            offset,
            |eino, off, kind, name| {
                // The kernel takes no reference for `.` and `..` (fuse_direntplus_link
                // skips them); every other entry it receives counts as a lookup.
                let a = match kind {
                    None => self.vol.attr(eino),
                    Some(_) => self.vol.lookup(ino.0, name),
                };
                let a = match a {
                    Ok(a) => a,
                    // Removed since its page was read: skipped. Only stored data that
                    // fails its checks is an error here, never a name that went away.
                    Err(e) if errno(&e) == Errno::ENOENT => return Ok(false),
                    Err(e) => return Err(self.fail("readdirplus", e)),
                };
                if kind.is_some() {
                    // Counted before the reply is sent (at `reply.ok()` below).
                    self.remember(a.ino);
                }
                let full = reply.add(
                    INodeNo(a.ino),
                    off,
                    name,
                    &self.opts.attr_ttl,
                    &self.fuse_attr(&a),
                    Generation(a.generation),
                );
                if full && kind.is_some() {
                    // Did not fit: the kernel never sees it.
                    self.release_lookups(a.ino, 1);
                }
                Ok(full)
            },
            "readdirplus",
        );
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // fsync of a directory makes everything durable and rollback-protected: the way
        // for a program to make everything durable (FUSE forwards no syncfs;
        // docs/design.md, "FUSE"), by a seal of the log: the checkpoint comes when due.
        self.empty(self.vol.sync_log(), reply, "fsyncdir");
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bs = self.bs as u64;
        let (blocks, bfree, bavail) = match &self.opts.backing_dir {
            Some(dir) => match nix::sys::statvfs::statvfs(dir) {
                Ok(s) => {
                    let f = s.fragment_size();
                    let conv = |n: u64| n.saturating_mul(f) / bs;
                    (
                        conv(s.blocks()),
                        conv(s.blocks_free()),
                        conv(s.blocks_available()),
                    )
                }
                Err(e) => return reply.error(Errno::from_i32(e as i32)),
            },
            None => (0, 0, 0),
        };
        reply.statfs(
            blocks,
            bfree,
            bavail,
            0,
            u32::MAX as u64,
            bs as u32,
            NAME_MAX as u32,
            bs as u32,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let name = name_or_reply!(name, reply);
        if name.starts_with(WRITERS_XATTR) {
            return reply.error(Errno::EPERM);
        }
        let mode = if flags & libc::XATTR_CREATE != 0 {
            XattrMode::Create
        } else if flags & libc::XATTR_REPLACE != 0 {
            XattrMode::Replace
        } else {
            XattrMode::Set
        };
        self.empty(
            self.vol.setxattr(ino.0, name, value, mode),
            reply,
            "setxattr",
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name_or_reply!(name, reply);
        if !name.starts_with("user.") {
            // security.capability is asked on every write; answer without the engine.
            return reply.error(Errno::ENODATA);
        }
        if ino.0 == ROOT_INO {
            if let Some(cursor) = name.strip_prefix(WRITERS_XATTR) {
                let after = match cursor {
                    "" => Some(0),
                    c => c.strip_prefix('.').and_then(|n| n.parse().ok()),
                };
                return match after.map(|a| self.writers_after(a)) {
                    Some(Ok(v)) => xattr_reply(reply, size, &v),
                    Some(Err(e)) => reply.error(self.fail("getxattr", e)),
                    None => reply.error(Errno::ENODATA),
                };
            }
        }
        match self.vol.getxattr(ino.0, name) {
            Ok(v) => xattr_reply(reply, size, &v),
            Err(e) => reply.error(self.fail("getxattr", e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.vol.listxattr(ino.0) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(n.as_bytes());
                    buf.push(0);
                }
                xattr_reply(reply, size, &buf);
            }
            Err(e) => reply.error(self.fail("listxattr", e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_or_reply!(name, reply);
        if name.starts_with(WRITERS_XATTR) {
            return reply.error(Errno::EPERM);
        }
        self.empty(self.vol.removexattr(ino.0, name), reply, "removexattr");
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name_or_reply!(name, reply);
        let r = self
            .vol
            .create_at(
                parent.0,
                name,
                Kind::File,
                mode & 0o7777,
                req.uid(),
                req.gid(),
                self.opts.scheme,
            )
            .and_then(|a| {
                if self.opts.auto {
                    self.vol.set_auto(a.ino, true)?;
                }
                self.vol.open_handle(a.ino).map(|()| a)
            });
        match r {
            Ok(a) => {
                self.remember(a.ino);
                reply.created(
                    &self.opts.attr_ttl,
                    &self.fuse_attr(&a),
                    Generation(a.generation),
                    self.file_fh(a.ino, flags),
                    self.open_flags(),
                )
            }
            Err(e) => reply.error(self.fail("create", e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Space is never reserved on the store (it may be a synced folder or an object
        // store): allocating only makes the range part of the file, reading as zeros.
        const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;
        let Some(end) = offset.checked_add(length) else {
            return reply.error(Errno::EFBIG);
        };
        if length == 0 {
            return reply.error(Errno::EINVAL);
        }
        let keep = mode & KEEP_SIZE != 0;
        // As ext4's fallocate (file_modified): the kernel leaves it to a daemon that
        // handles the kill (FUSE_HANDLE_KILLPRIV_V2).
        if self.kill_wanted(req, ino.0) {
            if let Err(e) = self.kill_suidgid(ino.0) {
                return reply.error(self.fail("fallocate", e));
            }
        }
        let r = match mode & !KEEP_SIZE {
            // Allocate: grow the size unless KEEP_SIZE (then nothing changes).
            0 => self.vol.attr(ino.0).and_then(|a| {
                if keep || end <= a.size {
                    return Ok(());
                }
                let set = SetAttr {
                    size: Some(end),
                    ..SetAttr::default()
                };
                self.vol.setattr(ino.0, &set).map(|_| ())
            }),
            // As on ext4, punching needs KEEP_SIZE; it never changes the size.
            PUNCH_HOLE if keep => self.vol.zero_range(ino.0, offset, length, true),
            ZERO_RANGE => self.vol.zero_range(ino.0, offset, length, keep),
            PUNCH_HOLE => return reply.error(Errno::EINVAL),
            // COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE and combinations.
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        self.empty(r, reply, "fallocate");
    }
}

/// Whether the caller holds `CAP_FSETID`, which lets it keep set-ID bits at a truncate
/// or fallocate: FUSE sends its thread id, whose effective capabilities `/proc` shows. A
/// caller whose status cannot be read (gone already) is judged by its uid: root holds it.
/// (For writes the kernel tells: `FUSE_WRITE_KILL_SUIDGID`.)
fn holds_fsetid(req: &Request) -> bool {
    const CAP_FSETID: u32 = 4;
    std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
        .ok()
        .and_then(|s| {
            let v = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(v.trim(), 16).ok()
        })
        .map_or(req.uid() == 0, |caps| caps >> CAP_FSETID & 1 == 1)
}

fn xattr_reply(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

/// Mounts `vol` at `mountpoint` and serves it until it is unmounted (`fusermount3 -u`,
/// `umount`) or the process gets SIGINT, SIGTERM or SIGHUP, which unmount cleanly.
/// `ready` runs once the mount is live. Everything written is sealed before this returns.
pub fn serve(
    vol: Arc<Volume>,
    mountpoint: &Path,
    opts: MountOptions,
    ready: impl FnOnce(),
) -> std::io::Result<()> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("intact".into()),
        MountOption::Subtype("intact".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    if vol.is_read_only() {
        config.mount_options.push(MountOption::RO);
    }
    if opts.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    let mut sigs = vec![signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM];
    if opts.unmount_on_hangup {
        sigs.push(signal_hook::consts::SIGHUP);
    } else {
        // A daemon outlives its terminal: a hangup must neither unmount nor kill it.
        signal_hook::flag::register(
            signal_hook::consts::SIGHUP,
            Arc::new(std::sync::atomic::AtomicBool::new(false)),
        )?;
    }
    let fs = IntactFs::new(vol.clone(), opts);
    let notifier_slot = fs.notifier.clone();
    let mut session = fuser::Session::new(fs, mountpoint, &config)?;
    let _ = notifier_slot.set(session.notifier());
    // After a failed commit the engine is back at its last seal: the kernel drops what it
    // caches of the discarded changes (pages, attributes, names).
    let notifier = session.notifier();
    vol.on_discard(Arc::new(move |gone: Vec<Discarded>| {
        for d in gone {
            if let Some((parent, name)) = &d.entry {
                let _ = notifier.inval_entry(INodeNo(*parent), OsStr::new(name));
            }
            if let Err(e) = notifier.inval_inode(INodeNo(d.ino), 0, 0) {
                tracing::debug!(ino = d.ino, error = %e, "cache invalidation");
            }
        }
    }));
    let mut unmounter = session.unmount_callable();
    let mut signals = signal_hook::iterator::Signals::new(&sigs)?;
    let handle = signals.handle();
    let waiter = std::thread::Builder::new()
        .name("intact-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "signal: unmounting");
                if let Err(e) = unmounter.unmount() {
                    tracing::error!(error = %e, "unmount failed");
                }
            }
        })?;
    ready();
    let r = session_end(session.run());
    // The channel is gone; so is the notifier's use.
    vol.on_discard(Arc::new(|_| {}));
    handle.close();
    let _ = waiter.join();
    // The adapter's destroy() sealed; seal again in case the session ended without it.
    if !vol.is_read_only() {
        if let Err(e) = vol.sync() {
            tracing::error!(error = %e, "final seal failed");
            return Err(std::io::Error::other(e.to_string()));
        }
    }
    r
}

/// What the end of the session says of the mount. The kernel answers a worker that was
/// reading a request as the connection ended (an unmount racing the read) with
/// `ECONNABORTED` instead of `ENODEV` (`fuse_dev_do_read`), which fuser reports as an
/// error: the mount is gone either way, and the daemon seals after it as after any end.
/// A test's unmount once exited 1 with "Software caused connection abort".
fn session_end(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            tracing::info!("the kernel ended the connection as a request was read");
            Ok(())
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use intact_core::crypto::KdfParams;
    use intact_core::store::{MemStore, MemTrusted, TrustedStore};
    use intact_core::{CreateOptions, Options};

    /// A connection the kernel ended while a request was read is the end of the mount,
    /// not a failure; every other error of the session still is.
    #[test]
    fn an_aborted_connection_ends_the_session_cleanly() {
        let aborted = std::io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert!(session_end(Err(aborted)).is_ok());
        assert!(session_end(Ok(())).is_ok());
        let other = std::io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(
            session_end(Err(other)).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
    }

    /// The kernel's references decide when the engine frees an unlinked file: not while any
    /// is left (a lookup counted twice and forgotten once), at once when the last goes.
    #[test]
    fn an_unlinked_file_is_freed_when_the_kernels_last_reference_goes() {
        let trusted = MemTrusted::default();
        let vol = Volume::create(
            Arc::new(MemStore::new()),
            move |_| Ok(Box::new(trusted) as Box<dyn TrustedStore>),
            b"pw",
            &CreateOptions {
                kdf: KdfParams::TEST,
                ..CreateOptions::default()
            },
            &Options::default(),
        )
        .unwrap();
        let fs = IntactFs::new(Arc::new(vol), MountOptions::default());
        let a = fs
            .vol
            .create_at(ROOT_INO, "a", Kind::File, 0o644, 0, 0, None)
            .unwrap();
        fs.remember(a.ino);
        fs.remember(a.ino);
        fs.vol.unlink_at(ROOT_INO, "a").unwrap();
        // Unlinked, still referred to: the engine keeps it.
        assert_eq!(fs.vol.attr(a.ino).unwrap().nlink, 0);
        fs.release_lookups(a.ino, 1);
        assert_eq!(
            fs.vol.attr(a.ino).unwrap().nlink,
            0,
            "freed with a reference left"
        );
        fs.release_lookups(a.ino, 1);
        assert!(
            fs.vol.attr(a.ino).is_err(),
            "kept after the last reference went"
        );
    }
}
