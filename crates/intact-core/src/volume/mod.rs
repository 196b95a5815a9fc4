//! The volume engine: the trust chain of docs/design.md.
//!
//! ```text
//! trusted anchor (volume id, epoch, counter reservation, journal digest, TS of the inode table; MAC'd)
//!   └─ inode table: a file under mt-eint; record k is inode k's attributes and TS_F
//!        └─ files: blocks under their scheme, US_F beside them
//!        └─ directories: files of entries name -> inode (always mt-eint)
//! ```
//!
//! All mutation goes through one [`Tx`]; [`Volume::sync`] seals it: the journal is made
//! durable, the anchor's epoch advances with the new inode-table root and the journal's
//! digest, then the journal is applied in place.

use crate::crypto::{self, label, FileId, KdfParams, MasterKey, SubKey};
use crate::error::{Error, FsErrorKind, Result, Subject};
use crate::format::*;
use crate::metrics::{Account, FileIntegrity, Metrics, MetricsSnapshot, Phase, VolumeIntegrity};
use crate::scheme::{scheme, Env, FileState};
use crate::store::{LocalStateDir, TrustedLock, TrustedStore, UntrustedStore};
use crate::tree::{auth_ctr, check_ctr, NodeCache, NodeHasher, TrustedCounters};
use crate::tx::{load_journal, replay_journal, Commit, Tx};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

macro_rules! env {
    ($s:ident) => {
        Env {
            bs: $s.bs,
            hasher: &$s.keys.hasher,
            leaf_key: &$s.keys.leaf,
            cache: &$s.cache,
            ctr_floor: $s.ctr_floor,
            ctr_limit: $s.anchor.ctr_next,
            metrics: &$s.metrics,
            max_object: $s.max_object,
            inline_leaf: $s.inline_leaf,
            inline_mac: $s.inline_mac,
            inline_tree: $s.inline_tree,
            twins: $s.twin_blocks,
        }
    };
}

mod commit;
mod diagnose;
mod dirtree;
mod file_io;
mod follow;
mod fsck;
mod gate;
mod inline;
mod inodes;
pub(crate) mod keys;
mod logged;
mod namespace;
mod policy;
mod recover;
mod sealer;
mod unitcache;
mod xattr;
use commit::*;
pub use diagnose::{is_conflict_copy, utc, Accepted, Seal, StateReport, StoreCopy, Verdict};
use file_io::*;
pub use follow::FOLLOW_RETRIES;
use inodes::*;
use keys::*;
use logged::Item;
use namespace::*;
pub use recover::{DiscardHook, Discarded};
use xattr::*;

/// Counters reserved per session (see docs/design.md, "Counters").
pub const CTR_RESERVATION: u64 = 1 << 32;
/// Dirty plaintext held per file before it is pushed through its scheme (by the write
/// that reaches it, under the engine lock: it bounds how long one write holds the lock,
/// and leaves a seal's locked phase little to encrypt).
const FILE_DIRTY_LIMIT: usize = 2 << 20;
/// Staged (journaled) bytes before the engine seals on its own.
const OVERLAY_LIMIT: usize = 32 << 20;
/// Log bytes since the last checkpoint before the engine checkpoints on its own (bounds the
/// work of a recovery).
const LOG_LIMIT: u64 = 64 << 20;
/// Bytes written directly to the store (appends) since the last checkpoint began before the
/// engine checkpoints on its own: a checkpoint syncs them, so this bounds its I/O (and the
/// data a crash of the machine can lose). Appends made while a checkpoint is in flight go
/// to the store too (they were staged, and so logged, before), so the log's limit no
/// longer bounds them. They take no memory of the engine's (they are in the store's own
/// cache, whose writers the kernel throttles), so no writer is paced or stopped for them.
const DIRECT_LIMIT: usize = 64 << 20;
/// A periodic seal checkpoints when the last checkpoint is older than this (what unlinks
/// free is given back to the store at checkpoints); otherwise it seals the log only.
const CHECKPOINT_AGE: std::time::Duration = std::time::Duration::from_secs(30);
/// Longest name in a directory.
pub const NAME_MAX: usize = 255;
pub use crate::format::AUTO;
/// Blocks the `auto` policy observes before it re-encrypts a file that has content.
const AUTO_MIN_OBSERVED: u64 = 64;
/// Largest file the `auto` policy re-encrypts on its own (a switch rewrites the file).
const AUTO_MAX_SIZE: u64 = 256 << 20;
/// Open-file states kept after a seal, and past which idle ones are dropped at the end of
/// a request ([`Inner::evict_idle`]).
pub const KEEP_OPEN: usize = 1024;
/// Known (parent, name) pairs kept after a seal, for naming files in errors (about 100
/// bytes each: 65,536 is 6.5 MB; past it, a seal keeps only the paths of open files, and
/// lookups add back what is in use).
const KEEP_NAMES: usize = 1 << 16;
/// Dirty plaintext held across all files before the engine seals on its own. The part of a
/// seal that holds the engine lock (encrypting what is dirty) grows with it.
const TOTAL_DIRTY_LIMIT: usize = 32 << 20;
/// Records past the budget ([`Options::records`]) that cannot be dropped (changed and not
/// yet checkpointed) before the engine checkpoints on its own: a create, an unlink or a
/// rename adds no dirty bytes, so without this a run of them (`touch` of 10^6 names)
/// would keep every new record in memory until a data write or an unmount.
const DIRTY_RECORDS: usize = 8192;
/// Bytes a file writes after a checkpoint began before it counts as a heavy writer: past
/// twice the dirty limits, only heavy writers are slowed ([`Volume::after_write`]).
const THROTTLE_SHARE: usize = 4 << 20;
/// Longest extended-attribute value.
pub const XATTR_VALUE_MAX: usize = 64 << 10;
/// Default largest total of extended-attribute names and values per inode
/// ([`Options::xattr_bytes_max`]): one attribute of the largest size with the longest name
/// fits (ext4 without `ea_inode` stops near 4 KiB; `--xattr-max-bytes 4096` behaves so).
pub const XATTR_BYTES_MAX: usize = XATTR_VALUE_MAX + NAME_MAX;
/// Largest total of extended-attribute names (each with its NUL) per inode: the kernel's
/// listxattr limit (XATTR_LIST_MAX), so that every name set can also be listed.
pub const XATTR_NAMES_MAX: usize = 64 << 10;
/// The extended attribute that names a file's scheme (virtual: never stored).
pub const SCHEME_XATTR: &str = "user.intact.scheme";

/// How to open or create a volume.
#[derive(Clone)]
pub struct Options {
    /// Bytes of verified Merkle nodes to cache (0 disables; the paper's evaluation used 1 KiB).
    pub cache_bytes: usize,
    /// Open without writing anything (no lock for writing, no journal replay on disk).
    pub read_only: bool,
    /// Largest total of extended-attribute names and values per inode (ENOSPC past it).
    pub xattr_bytes_max: usize,
    /// Inode records kept in memory before the idle ones are dropped (read again, and
    /// authenticated again, at their next use; docs/design.md, "Resident inode records").
    /// Directories, files with unsealed changes and files in use stay whatever the budget.
    pub records: usize,
    /// Bytes of verified metadata to keep decrypted (0 disables; see
    /// `volume/unitcache.rs`): directory units (the root and inner nodes of big
    /// directories, the leaves a listing just read) and pieces of the inode table (the
    /// records of files created together), which the lookups after a listing meet again.
    pub meta_cache_bytes: usize,
    /// Read-only only: follow a writer that runs at the same time (`mount --ro --follow`),
    /// waiting up to this long for its next root. No lock is taken
    /// ([`TrustedLock::follower`]); [`Volume::refresh`] moves to the newest sealed root; a
    /// request that fails as tampered (the writer changing what it read) runs again under
    /// a newer root, and fails once no newer root comes within the wait or it failed under
    /// [`FOLLOW_RETRIES`] newer roots (docs/design.md, "Readers that follow a writer").
    pub follow: Option<std::time::Duration>,
}

/// What [`Volume::meta_cache`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MetaCacheStats {
    /// Bytes of units held.
    pub bytes: usize,
    /// Unit reads answered from the cache since open.
    pub hits: u64,
    /// Unit reads that went to the directory's file.
    pub misses: u64,
}

/// The default of [`Options::meta_cache_bytes`]: 256 pieces of 4 KiB.
pub const META_CACHE_BYTES: usize = 1 << 20;

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: 1024,
            read_only: false,
            xattr_bytes_max: XATTR_BYTES_MAX,
            records: KEEP_OPEN,
            meta_cache_bytes: META_CACHE_BYTES,
            follow: None,
        }
    }
}

/// Parameters of a new volume.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Block size.
    pub block_size: u32,
    /// Default scheme of new files.
    pub scheme: SchemeId,
    /// New files follow the `auto` policy ([`crate::format::auto_choice`]), starting
    /// from `scheme`.
    pub auto: bool,
    /// Argon2id parameters.
    pub kdf: KdfParams,
    /// One-leaf Merkle trees keep their node in the inode record, so that a small file is
    /// one object ([`INLINE_LEAF`]). `false` makes a volume as intact made them before,
    /// which older versions of intact open.
    pub inline_leaf: bool,
    /// Directories are B+-trees of units ([`DIR_TREE`]). `false` makes them one sorted
    /// list each, as intact made them before, which older versions of intact open.
    pub dir_tree: bool,
    /// `mac-tree` trees of one leaf counter keep their level 0 in the inode record, so that
    /// a small `mac-tree` file is one object ([`INLINE_MAC`]). `false` makes a volume as
    /// intact made them before, which older versions of intact open.
    pub inline_mac: bool,
    /// `mt-eint` trees of 2 to 6 leaves keep their leaves in the inode record, so that a
    /// file of up to six blocks is one object ([`INLINE_TREE`]; needs `inline_leaf`).
    /// `false` makes a volume as intact made them before, which older versions open.
    pub inline_tree: bool,
    /// New `mt-eint` files keep up to [`INLINE_DATA_MAX`] bytes in slots of the inode
    /// table, with no object of their own ([`INLINE_DATA`]). `false` makes a volume as
    /// intact made them before, which older versions open.
    pub inline_data: bool,
    /// Counters of many intervals are kept in segments, so that a random write rewrites
    /// one segment, not every interval ([`CTR_SEGMENTS`]). `false` makes a volume as intact
    /// made them before, which older versions open.
    pub ctr_segments: bool,
    /// `mt-eint` blocks of odd counter live in a twin object, so that an overwrite goes
    /// straight to the store once, not through the log, the journal and in place
    /// ([`TWIN_BLOCKS`]). `false` makes a volume as intact made them before, which older
    /// versions open.
    pub twin_blocks: bool,
    /// The log leaves out the Merkle nodes an `mt-eint` file's leaves determine, and replay
    /// recomputes them ([`LEAF_LOG`]). `false` makes a volume as intact made them before,
    /// which older versions open.
    pub leaf_log: bool,
    /// A data item in the log holds what changed since the file's previous one, in
    /// variable-length integers ([`LOG_DELTA`]). `false` makes a volume as intact made
    /// them before, which older versions open.
    pub log_delta: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            block_size: 4096,
            scheme: SchemeId::MtEintGcm,
            auto: false,
            kdf: KdfParams::DEFAULT,
            inline_leaf: true,
            dir_tree: true,
            inline_mac: true,
            inline_tree: true,
            inline_data: true,
            ctr_segments: true,
            twin_blocks: true,
            leaf_log: true,
            log_delta: true,
        }
    }
}

/// What `stat` reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stat {
    /// Inode number.
    pub ino: u64,
    /// File, directory, symlink, FIFO, socket or device node.
    pub kind: Kind,
    /// Length in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, ns.
    pub mtime_ns: i64,
    /// Change time, ns.
    pub ctime_ns: i64,
    /// Integrity scheme of the contents.
    pub scheme: String,
    /// Whether the `auto` policy chooses (and may change) the scheme.
    pub auto: bool,
    /// The file's random id (hex): its objects are `f/<2 hex>/<id>.{d,m,c,t}`.
    pub file_id: String,
    /// Blocks held by the scheme.
    pub blocks: u64,
    /// Counter intervals, and whether they are spilled to untrusted storage.
    pub counter_intervals: u64,
    /// True when the counter arrays live in US_F with their hashes in TS_F.
    pub counters_spilled: bool,
    /// The device number of a character or block device (0 for every other kind).
    pub rdev: u32,
}

/// Attributes of an inode, as a file-system front end needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Changes whenever an inode number is reused (from the file's random id).
    pub generation: u64,
    /// File, directory or symlink.
    pub kind: Kind,
    /// Length in bytes.
    pub size: u64,
    /// Permission bits (and setuid/setgid/sticky).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Names of the inode (hard links); for a directory 2 plus its subdirectories.
    pub nlink: u32,
    /// Access time, ns.
    pub atime_ns: i64,
    /// Modification time, ns.
    pub mtime_ns: i64,
    /// Change time, ns.
    pub ctime_ns: i64,
    /// Bytes of blocks the scheme holds (holes past them excluded).
    pub stored_bytes: u64,
    /// The device number of a character or block device (0 for every other kind).
    pub rdev: u32,
}

/// Attribute changes (`setattr`): `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New length (files only): truncates or extends with zeros.
    pub size: Option<u64>,
    /// New access time, ns.
    pub atime_ns: Option<i64>,
    /// New modification time, ns.
    pub mtime_ns: Option<i64>,
    /// Clear the set-user-ID bit, and the set-group-ID bit when the group may execute, of
    /// a file that is not a directory, after the changes above: what Linux does at a
    /// `chown`, and at a truncate or write by a caller without `CAP_FSETID` (a FUSE
    /// mount that handles the kill itself, `FUSE_HANDLE_KILLPRIV_V2`, is asked to).
    pub kill_suidgid: bool,
}

/// `mode` without the bits a write, truncate or `chown` clears: set-user-ID, and
/// set-group-ID when the group may execute (without it the bit marks mandatory locking,
/// which Linux keeps: `setattr_should_drop_sgid`).
pub fn killed_suidgid(mode: u32) -> u32 {
    let mut m = mode & !0o4000;
    if m & 0o010 != 0 {
        m &= !0o2000;
    }
    m
}

/// What a rename does when the target name exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace it (a non-empty directory is never replaced).
    Replace,
    /// Fail with `Exists` (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap the two names atomically (`RENAME_EXCHANGE`); both must exist.
    Exchange,
}

/// How `setxattr` treats an existing attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    Set,
    /// Fail if it exists (`XATTR_CREATE`).
    Create,
    /// Fail unless it exists (`XATTR_REPLACE`).
    Replace,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DirEntry {
    /// Name.
    pub name: String,
    /// Inode.
    pub ino: u64,
    /// Kind.
    pub kind: Kind,
}

/// One fsck finding.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FsckFailure {
    /// Path of the damaged file (or a structure name).
    pub path: String,
    /// Block index, where one applies.
    pub block: Option<u64>,
    /// What failed.
    pub what: String,
}

impl std::fmt::Display for FsckFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.block {
            Some(b) => write!(f, "{}: block {}: {}", self.path, b, self.what),
            None => write!(f, "{}: {}", self.path, self.what),
        }
    }
}

/// Volume facts for `intact info`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Info {
    /// Volume id (hex).
    pub volume_id: String,
    /// Default scheme.
    pub scheme: String,
    /// Block size.
    pub block_size: u32,
    /// Regular files.
    pub files: u64,
    /// Directories (including the root).
    pub directories: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes.
    pub special_files: u64,
    /// Bytes of file contents.
    pub content_bytes: u64,
    /// Bytes of trusted storage (the anchor), constant.
    pub trusted_bytes: u64,
    /// Bytes of encrypted data objects in the store.
    pub data_object_bytes: u64,
    /// Bytes of integrity metadata (Merkle nodes, spilled counters) in the store.
    pub integrity_bytes: u64,
    /// Bytes of inode table objects (records, their tree).
    pub inode_table_bytes: u64,
    /// The anchor's epoch.
    pub epoch: u64,
    /// Where the anchor lives.
    pub anchor: String,
    /// Where the log records the last seal covers end: the segment (its object's name) and
    /// the byte offset in it. Records past it were logged since: a crash of the daemon
    /// keeps them, a crash of the machine may lose them. `None` without a log.
    pub log_sealed_end: Option<(String, u64)>,
}

/// An encrypted, authenticated, fresh volume.
pub struct Volume {
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    integrity_failures: AtomicU64,
    seal_on_drop: std::sync::atomic::AtomicBool,
    /// The engine's [`Volume::is_full`] flag.
    full: Arc<std::sync::atomic::AtomicBool>,
    /// Bulk writes give way to other requests at the engine lock.
    gate: gate::Gate,
    /// A read-only volume that follows a writer ([`Options::follow`]).
    follow: Option<follow::Follow>,
}

/// The engine and what its threads share (a seal at the dirty limit runs its I/O on a
/// thread of its own, [`Volume::after_write`]).
struct Shared {
    inner: Mutex<Inner>,
    /// Signalled when a commit in flight ends (see [`Volume::sync`]).
    commit_done: Condvar,
    /// Writes the log's records without the engine lock (`None`: no log).
    log_io: Option<Arc<crate::wal::LogIo>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits (releasing `g`) until the commit in flight ends.
    fn wait<'a>(&self, g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        self.commit_done.wait(g).unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until no commit is in flight.
    fn wait_idle<'a>(&self, mut g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        while g.sealing() {
            g = self.wait(g);
        }
        g
    }

    /// Phases B and C of a begun commit: its I/O without the lock, then its end under the
    /// lock, and the waiters woken.
    fn finish(&self, f: &InFlight) -> Result<()> {
        let r = f.run();
        let r = self.lock().commit_end(f, r);
        self.commit_done.notify_all();
        r
    }
}

struct Inner {
    store: Arc<dyn UntrustedStore>,
    trusted: Arc<dyn TrustedStore>,
    _lock: TrustedLock,
    config: Config,
    bs: usize,
    default_scheme: SchemeId,
    default_auto: bool,
    keys: Arc<Keys>,
    cache: Arc<NodeCache>,
    /// Verified directory units and inode-table pieces ([`unitcache`]).
    units: unitcache::UnitCache,
    anchor: Anchor,
    ctr_floor: u64,
    /// The store's longest object (probed once; `u64::MAX` when read-only).
    max_object: u64,
    /// The volume has the [`INLINE_LEAF`] feature.
    inline_leaf: bool,
    /// The volume has the [`INLINE_MAC`] feature.
    inline_mac: bool,
    /// The volume has the [`INLINE_TREE`] feature (and [`INLINE_LEAF`], which it extends).
    inline_tree: bool,
    /// The volume has the [`INLINE_DATA`] feature: new `mt-eint` files start inline.
    inline_data: bool,
    /// The volume has the [`DIR_TREE`] feature.
    dir_tree: bool,
    /// The volume has the [`CTR_SEGMENTS`] feature.
    ctr_segments: bool,
    /// The volume has the [`TWIN_BLOCKS`] feature.
    twin_blocks: bool,
    /// The volume has the [`LEAF_LOG`] feature.
    leaf_log: bool,
    /// The volume has the [`LOG_DELTA`] feature: the records of the data items logged since
    /// the log last started again (the bases of the next ones), as the log holds them.
    log_bases: Option<logged::Bases>,
    /// Data items whose replay found that the Merkle nodes it recomputed do not give the
    /// root the log holds (a damaged or tampered node of the file's tree; `logged.rs`):
    /// counted with the integrity failures the volume reports.
    replay_failures: u64,
    tx: Tx,
    itable: OpenFile,
    header: TableHeader,
    header_dirty: bool,
    files: HashMap<u64, OpenFile>,
    /// `files` is pruned of idle records at the end of a request once it holds this many
    /// ([`Inner::evict_idle`]).
    evict_at: usize,
    /// [`Options::records`].
    records: usize,
    /// Open handles per inode (a file unlinked while open lives until the last closes).
    handles: HashMap<u64, u32>,
    /// Last known (parent, name) of inodes, for naming them in integrity errors.
    names: HashMap<u64, (u64, String)>,
    /// Approximate dirty plaintext across files since the last seal.
    dirty_bytes: usize,
    /// Inode numbers freed in this session that a front end may still hold (the kernel
    /// keeps an unlinked inode until it forgets it): requests on them are ENOENT, and the
    /// numbers are not reused until [`Volume::forget`].
    stale: std::collections::HashSet<u64>,
    /// The front end reports when it stops referring to inodes ([`Volume::forget`]): a file
    /// losing its last name is kept (on the unlinked list) until then, as a kernel keeps an
    /// inode until its last reference goes.
    track_references: bool,
    read_only: bool,
    /// A checkpoint is between [`Inner::commit_begin`] and [`Inner::commit_end`].
    checkpointing: bool,
    /// A seal of the log is between its phases (it may run beside a checkpoint).
    log_sealing: bool,
    /// The trusted store's one writer ([`sealer::Sealer`]).
    sealer: Arc<sealer::Sealer>,
    /// Commits begun and ended (numbered from 1): a [`Volume::sync`] waits for one that
    /// began after it was called.
    commits_begun: u64,
    commits_ended: u64,
    /// The number of the last checkpoint that ended (a seal of the log only is not one).
    checkpoints_ended: u64,
    /// Checkpoints begun (seals of the log not counted): what a file wrote since the last
    /// one began makes it a heavy writer ([`Volume::after_write`]).
    checkpoints_begun: u64,
    /// When the last checkpoint ended (or the volume opened).
    checkpointed_at: std::time::Instant,
    /// How fast checkpoints write out what is staged: heavy writers are paced by it.
    drain: gate::Drain,
    /// The dirty limits were reached: the front end's request that reached them starts a
    /// commit once it has left the engine's lock (see [`Volume::after_write`]).
    commit_wanted: bool,
    /// The last request appended to the log (it changed something): it checks the dirty
    /// limits on its way out ([`Volume::changed`]).
    last_logged: bool,
    /// The ticket of the last request's log group ([`wal::LogIo`]): the request takes it
    /// as it leaves the lock and returns once the group is written ([`Volume::settle_log`]).
    log_ticket: Option<u64>,
    /// [`Options::xattr_bytes_max`].
    xattr_bytes_max: usize,
    poisoned: Option<String>,
    /// What a failed commit must undo and report (see [`recover`]).
    unsealed: recover::Unsealed,
    /// Reused buffer of [`flush_data`].
    scratch: Vec<u8>,
    /// Measured costs (see [`crate::metrics`]).
    metrics: Arc<Metrics>,
    /// The log (writable volumes; docs/design.md, "The log").
    wal: Option<logged::Wal>,
    /// Requests are logged (off for all-or-nothing commands: [`Volume::set_all_or_nothing`]).
    log_requests: bool,
    /// What the request under way changed ([`Inner::log_point`]).
    changes: logged::Changes,
    /// The table header as last logged.
    logged_header: TableHeader,
    /// Held (shared) by every read that runs without the engine lock, for its whole
    /// length; going back after a failed commit takes it exclusively, so that no reader
    /// sees the store change under the state it was handed ([`Volume::read_ino`]).
    readers: Arc<std::sync::RwLock<()>>,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub use crate::format::Kind;

/// Creates a volume in `store` with its anchor under the local state directory `state_dir`.
pub fn create_local(
    store: Arc<dyn UntrustedStore>,
    state_dir: &std::path::Path,
    password: &[u8],
    copts: &CreateOptions,
) -> Result<Volume> {
    Volume::create(
        store,
        |id| Ok(Box::new(LocalStateDir::new(state_dir.to_path_buf(), id)?) as Box<dyn TrustedStore>),
        password,
        copts,
        &Options::default(),
    )
}

/// A volume for the engine's unit tests: on `store`, its anchor in `trusted`, default
/// options, password `pw`, the test KDF.
#[cfg(test)]
pub(crate) fn test_volume(
    store: Arc<crate::store::MemStore>,
    trusted: &crate::store::MemTrusted,
) -> Volume {
    test_volume_with(store, trusted, true)
}

/// The volume of a [`test_volume`] opened again (its password, default options).
#[cfg(test)]
pub(crate) fn test_reopen(
    store: &Arc<crate::store::MemStore>,
    trusted: &crate::store::MemTrusted,
) -> Volume {
    Volume::open(
        store.clone(),
        Box::new(trusted.clone()),
        b"pw",
        &Options::default(),
    )
    .expect("the test volume opens again")
}

/// [`test_volume`] without the [`INLINE_DATA`] feature: every file's data in blocks under
/// its scheme (for tests of the schemes' objects).
#[cfg(test)]
pub(crate) fn test_volume_in_blocks(
    store: Arc<crate::store::MemStore>,
    trusted: &crate::store::MemTrusted,
) -> Volume {
    test_volume_with(store, trusted, false)
}

#[cfg(test)]
fn test_volume_with(
    store: Arc<crate::store::MemStore>,
    trusted: &crate::store::MemTrusted,
    inline_data: bool,
) -> Volume {
    let t = trusted.clone();
    Volume::create(
        store,
        move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
        b"pw",
        &CreateOptions {
            kdf: KdfParams::TEST,
            inline_data,
            ..Default::default()
        },
        &Options::default(),
    )
    .expect("a test volume")
}

/// Reads and parses the config of the volume in `store`.
pub fn read_config(store: &dyn UntrustedStore) -> Result<Config> {
    let bytes = store.read_all(CONFIG_NAME)?.ok_or_else(|| {
        Error::Config(format!(
            "no intact volume here ({CONFIG_NAME} is missing): if the volume was here, its \
             cipher directory was moved, deleted, or not synced or mounted yet; point --volume \
             at it, or create a volume with `intact init`"
        ))
    })?;
    Config::parse(&bytes)
}

impl Volume {
    /// Creates a new volume in `store`, anchored in `trusted`.
    /// `trusted` makes the anchor store once the new volume's id (hex) is known.
    pub fn create(
        store: Arc<dyn UntrustedStore>,
        trusted: impl FnOnce(&str) -> Result<Box<dyn TrustedStore>>,
        password: &[u8],
        copts: &CreateOptions,
        opts: &Options,
    ) -> Result<Volume> {
        check_block_size(copts.block_size)?;
        if store.len(CONFIG_NAME)?.is_some() {
            return Err(Error::Config("an intact volume already exists here".into()));
        }
        if !store.list()?.is_empty() {
            return Err(Error::Config(
                "the directory is not empty; intact init needs an empty directory".into(),
            ));
        }
        let master = MasterKey::generate();
        let mut volume_id = [0u8; 16];
        crypto::fill_random(&mut volume_id);
        let mut salt = [0u8; 16];
        crypto::fill_random(&mut salt);
        let mut config = Config {
            format: FORMAT_VERSION,
            volume_id: hex::encode(volume_id),
            block_size: copts.block_size,
            scheme: if copts.auto {
                AUTO.to_string()
            } else {
                copts.scheme.name().to_string()
            },
            kdf: copts.kdf,
            salt: hex::encode(salt),
            features: [
                (copts.inline_leaf, INLINE_LEAF),
                (copts.dir_tree, DIR_TREE),
                (copts.inline_mac, INLINE_MAC),
                (copts.inline_tree && copts.inline_leaf, INLINE_TREE),
                (copts.inline_data, INLINE_DATA),
                (copts.ctr_segments, CTR_SEGMENTS),
                (copts.twin_blocks, TWIN_BLOCKS),
                (copts.leaf_log, LEAF_LOG),
                (copts.log_delta, LOG_DELTA),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, f)| f.to_string())
            .collect(),
            wrapped_key: String::new(),
        };
        let kek = crypto::password_key(password, &salt, copts.kdf)?;
        config.wrapped_key = wrap_key(&master, &kek, &config.aad());
        let trusted = trusted(&config.volume_id)?;
        {
            let _lock = trusted.lock(true)?;
            if trusted.load()?.is_some() {
                return Err(Error::Config(format!(
                    "an anchor already exists at {}",
                    trusted.location()
                )));
            }
            // The initial anchor names an empty inode table; the first open finishes the
            // volume (header, root directory) and seals. The anchor goes first: a crash before
            // the config is written leaves an empty directory that `init` can use again.
            let keys = derive_keys(&master);
            let itable_id = crypto::random_file_id();
            let tree = crate::tree::TreeState::empty(&keys.hasher, &itable_id);
            let anchor = Anchor {
                volume_id,
                epoch: 0,
                ctr_next: 1,
                journal: None,
                applied: false,
                log: None,
                itable: Inode::new(Kind::File, SchemeId::MtEintGcm, itable_id, tree, now_ns()),
            };
            trusted.store(&anchor.encode(&keys.anchor))?;
        }
        let json = serde_json::to_string_pretty(&config).expect("config serializes");
        store.replace(CONFIG_NAME, json.as_bytes())?;
        let opts = Options {
            read_only: false,
            ..opts.clone()
        };
        Self::open_with_key(store, trusted, config, master, &opts)
    }

    /// Opens the volume in `store` with `password`; `trusted` must be the anchor store of
    /// this volume (see [`Volume::state_for`]).
    pub fn open(
        store: Arc<dyn UntrustedStore>,
        trusted: Box<dyn TrustedStore>,
        password: &[u8],
        opts: &Options,
    ) -> Result<Volume> {
        let config = read_config(store.as_ref())?;
        let master = unwrap_key(&config, password)?;
        // Kept to explain a failure of the whole volume (diagnose.rs).
        let keys = derive_keys(&master);
        let location = trusted.location();
        let loaded = trusted.load();
        // An anchor refused by the trusted store itself (a signed root that does not
        // verify) is its own explanation: there is no anchor to compare the store with.
        let refused = loaded.is_err();
        let anchor = loaded.ok().flatten().map(|b| (b, trusted.modified()));
        match Self::open_with_key(store.clone(), trusted, config.clone(), master, opts) {
            Err(e) if e.is_tampered() && !refused => {
                let report = StateReport::read(store.as_ref(), &config, &keys, location, anchor);
                Err(Error::StateMismatch {
                    cause: Box::new(e),
                    report: Box::new(report),
                })
            }
            r => r,
        }
    }

    fn open_with_key(
        store: Arc<dyn UntrustedStore>,
        trusted: Box<dyn TrustedStore>,
        config: Config,
        master: MasterKey,
        opts: &Options,
    ) -> Result<Volume> {
        let keys = Arc::new(derive_keys(&master));
        if opts.follow.is_some() && !opts.read_only {
            return Err(Error::Invalid(
                "only a read-only volume follows a writer".into(),
            ));
        }
        let trusted: Arc<dyn TrustedStore> = Arc::from(trusted);
        let inner = match opts.follow {
            None => {
                let lock = trusted.lock(!opts.read_only)?;
                Volume::build(store, trusted, lock, config, keys, opts)?
            }
            Some(wait) => follow::open(store, trusted, config, keys, opts, wait)?,
        };
        let mut v = Volume::wrap(inner);
        v.follow = opts
            .follow
            .map(|wait| follow::Follow::new(wait, opts.clone()));
        Ok(v)
    }

    /// A volume's engine state, opened under the anchor `trusted` holds now, with `lock`
    /// held ([`Volume::open`]; a follower's [`Volume::refresh`]).
    fn build(
        store: Arc<dyn UntrustedStore>,
        trusted: Arc<dyn TrustedStore>,
        lock: TrustedLock,
        config: Config,
        keys: Arc<Keys>,
        opts: &Options,
    ) -> Result<Inner> {
        let bytes = trusted.load()?.ok_or_else(|| Error::AnchorMissing {
            volume: config.volume_id.clone(),
            dir: trusted.location(),
        })?;
        let mut anchor = Anchor::decode(&bytes, &keys.anchor)?;
        if anchor.volume_id != config.volume_id_bytes() {
            return Err(Error::AnchorCorrupt(
                "the anchor belongs to another volume".into(),
            ));
        }
        let mut tx = if opts.read_only {
            Tx::read_only(store.clone())
        } else {
            Tx::new(store.clone())
        };
        if let Some(j) = anchor.journal.as_ref().filter(|_| !anchor.applied) {
            let jb = load_journal(store.as_ref(), &keys.journal, j)?;
            if opts.read_only {
                tx.stage_journal(&jb)?;
            } else {
                replay_journal(store.as_ref(), &jb)?;
                // Applied and synced: the anchor stored below says so, so that neither a
                // later open nor a going back replays it again over what this session
                // writes directly (a twin write into a slot the journal also wrote).
                anchor.applied = true;
            }
        }
        let ctr_floor = anchor.ctr_next;
        if !opts.read_only {
            // Reserve this session's counters before any block can be written with them.
            anchor.ctr_next = anchor
                .ctr_next
                .checked_add(CTR_RESERVATION)
                .ok_or_else(|| Error::Invalid("write counters exhausted".into()))?;
            anchor.epoch += 1;
            trusted.store(&anchor.encode(&keys.anchor))?;
        }
        let itable = OpenFile::load(anchor.itable.clone(), &keys, &mut tx, Subject::InodeTable)?;
        let max_object = if opts.read_only {
            u64::MAX
        } else {
            store.max_object_len()
        };
        let sealer = Arc::new(sealer::Sealer::new(
            anchor.clone(),
            trusted.clone(),
            keys.anchor.clone(),
        ));
        let mut inner = Inner {
            store,
            trusted,
            _lock: lock,
            bs: config.block_size as usize,
            default_scheme: match config.scheme.as_str() {
                AUTO => SchemeId::MtEintGcm,
                s => SchemeId::parse(s)?,
            },
            default_auto: config.scheme == AUTO,
            inline_leaf: config.features.iter().any(|f| f == INLINE_LEAF),
            inline_mac: config.features.iter().any(|f| f == INLINE_MAC),
            inline_tree: config.features.iter().any(|f| f == INLINE_TREE)
                && config.features.iter().any(|f| f == INLINE_LEAF),
            inline_data: config.features.iter().any(|f| f == INLINE_DATA),
            dir_tree: config.features.iter().any(|f| f == DIR_TREE),
            ctr_segments: config.features.iter().any(|f| f == CTR_SEGMENTS),
            twin_blocks: config.features.iter().any(|f| f == TWIN_BLOCKS),
            leaf_log: config.features.iter().any(|f| f == LEAF_LOG),
            log_bases: config
                .features
                .iter()
                .any(|f| f == LOG_DELTA)
                .then(logged::Bases::default),
            replay_failures: 0,
            config,
            keys,
            cache: Arc::new(NodeCache::new(opts.cache_bytes)),
            units: unitcache::UnitCache::new(opts.meta_cache_bytes),
            anchor,
            ctr_floor,
            max_object,
            tx,
            itable,
            header: TableHeader {
                free_head: 0,
                count: 0,
                unlinked_head: 0,
            },
            header_dirty: false,
            files: HashMap::new(),
            evict_at: opts.records,
            records: opts.records,
            handles: HashMap::new(),
            names: HashMap::new(),
            dirty_bytes: 0,
            stale: Default::default(),
            track_references: false,
            read_only: opts.read_only,
            checkpointing: false,
            log_sealing: false,
            sealer,
            commits_begun: 0,
            commits_ended: 0,
            checkpoints_ended: 0,
            checkpoints_begun: 0,
            checkpointed_at: std::time::Instant::now(),
            drain: gate::Drain::default(),
            commit_wanted: false,
            last_logged: false,
            log_ticket: None,
            xattr_bytes_max: opts.xattr_bytes_max,
            poisoned: None,
            unsealed: Default::default(),
            scratch: Vec::new(),
            metrics: Arc::new(Metrics::new()),
            wal: None,
            log_requests: !opts.read_only,
            changes: Default::default(),
            logged_header: TableHeader::default(),
            readers: Default::default(),
        };
        if !opts.read_only {
            inner.wal = Some(logged::Wal {
                keys: crate::wal::LogKeys::new(&inner.keys.log, inner.anchor.volume_id),
                io: Arc::new(crate::wal::LogIo::new(inner.store.clone())),
                writer: None,
                end: Default::default(),
                segments: Vec::new(),
                folded: Vec::new(),
                // Segment ids come from this session's reservation (docs/design.md, "The
                // log"): never used by an earlier session, even one that crashed.
                next_seg: ctr_floor,
                synced: Default::default(),
                void: None,
                bytes: 0,
            });
            inner.tx.capture(true);
        }
        if inner.itable.inode.size == 0 {
            // The anchor names an empty inode table: the volume's creation has not sealed yet
            // (this is trusted state, not something the store can fake).
            if opts.read_only {
                return Err(Error::Config(
                    "the volume's creation was interrupted; open it for writing once to finish it"
                        .into(),
                ));
            }
            inner.init_fresh()?;
        } else {
            inner.header = inner.read_header()?;
            inner.logged_header = inner.header;
            // What was logged since the last checkpoint: what the last seal covered, and
            // the tail written after it (requests acknowledged before a crash).
            // A reader with a public key takes only what the signed root covers.
            let sealed_only = opts.read_only && inner.trusted.signed_roots_only();
            let (end, segments, replayed) = inner.replay_anchored_log(sealed_only)?;
            inner.logged_header = inner.header;
            if let Some(w) = &mut inner.wal {
                w.end = end;
                w.synced = end;
                w.segments = segments;
            }
            if replayed > 0 {
                tracing::info!(
                    groups = replayed,
                    "replayed the log written since the last checkpoint"
                );
            }
            if !opts.read_only && (replayed > 0 || inner.header.unlinked_head != 0) {
                inner.reap_unlinked()?;
                inner.commit()?;
            }
        }
        if inner.wal.as_ref().is_some_and(|w| w.writer.is_none()) {
            // The segment requests go to, named by the anchor before the first one (so
            // that the first write does not wait for it). A full disk may refuse it; the
            // first request that changes something tries again.
            if let Err(e) = inner.start_segment() {
                tracing::debug!(error = %e, "the log's segment starts with the first change");
            }
        }
        Ok(inner)
    }

    /// The local trusted state directory of the volume in `store`.
    pub fn state_for(
        store: &dyn UntrustedStore,
        state_dir: &std::path::Path,
    ) -> Result<LocalStateDir> {
        let config = read_config(store)?;
        LocalStateDir::new(state_dir.to_path_buf(), &config.volume_id)
    }

    /// Rebuilds a missing anchor from the untrusted copy the volume keeps. This trusts the
    /// untrusted store's idea of the latest state: a rollback of the store before this call
    /// goes undetected. Only for a lost state directory, after explicit confirmation.
    pub fn recover_anchor(
        store: &dyn UntrustedStore,
        trusted: &dyn TrustedStore,
        password: &[u8],
    ) -> Result<u64> {
        let config = read_config(store)?;
        let master = unwrap_key(&config, password)?;
        let keys = derive_keys(&master);
        let _lock = trusted.lock(true)?;
        if trusted.load()?.is_some() {
            return Err(Error::Invalid(format!(
                "an anchor already exists at {}; nothing to recover",
                trusted.location()
            )));
        }
        let copy = store.read_all(ANCHOR_COPY_NAME)?.ok_or_else(|| {
            Error::Config(format!(
                "{ANCHOR_COPY_NAME} is missing: the anchor cannot be recovered"
            ))
        })?;
        let anchor = Anchor::decode(&copy, &keys.anchor)?;
        if anchor.volume_id != config.volume_id_bytes() {
            return Err(Error::AnchorCorrupt(
                "the anchor copy belongs to another volume".into(),
            ));
        }
        trusted.store(&copy)?;
        Ok(anchor.epoch)
    }

    fn wrap(inner: Inner) -> Volume {
        let failures = inner.replay_failures;
        Volume {
            metrics: inner.metrics.clone(),
            full: inner.unsealed.full_flag(),
            shared: Arc::new(Shared {
                log_io: inner.wal.as_ref().map(|w| w.io.clone()),
                inner: Mutex::new(inner),
                commit_done: Condvar::new(),
            }),
            integrity_failures: AtomicU64::new(failures),
            seal_on_drop: std::sync::atomic::AtomicBool::new(true),
            gate: gate::Gate::default(),
            follow: None,
        }
    }

    /// Whether dropping the volume seals what was written since the last [`Volume::sync`]
    /// (the default, like unmounting a file system). A front end that wants a command to be
    /// all-or-nothing turns it off and seals explicitly at the end; what it wrote before a
    /// failure is then never sealed (its objects become orphans).
    pub fn set_seal_on_drop(&self, seal: bool) {
        self.seal_on_drop.store(seal, Ordering::Relaxed);
    }

    /// Moves the last checkpoint's time back by `by`, as if it had run that long ago: a
    /// test's way to reach [`Volume::seal_periodic`]'s age rule without waiting for it.
    #[doc(hidden)]
    pub fn age_last_checkpoint(&self, by: std::time::Duration) {
        let mut g = self.shared.lock();
        if let Some(t) = g.checkpointed_at.checked_sub(by) {
            g.checkpointed_at = t;
        }
    }

    /// Makes each command all-or-nothing (the CLI): nothing is logged, so that a command
    /// that fails before its final [`Volume::sync`] leaves nothing that a reopen would
    /// replay (what it wrote directly is orphaned), and `fsync` seals the whole volume.
    /// A front end that serves a mount leaves it off: then every request is logged when
    /// it returns (docs/design.md, "The log").
    pub fn set_all_or_nothing(&self, on: bool) {
        let mut g = self.shared.lock();
        g.log_requests = !on && !g.read_only;
        let capture = g.log_requests;
        g.tx.capture(capture);
    }

    /// The engine lock, for any request but a bulk write ([`gate`]).
    fn lock(&self) -> Result<MutexGuard<'_, Inner>> {
        let light = self.gate.light();
        let g = self.shared.lock();
        drop(light);
        self.ready(g)
    }

    /// A just-taken engine lock, mended after a failed commit, or the reason the engine
    /// can serve nothing.
    fn ready<'a>(&self, mut g: MutexGuard<'a, Inner>) -> Result<MutexGuard<'a, Inner>> {
        debug_assert!(
            g.log_ticket.is_none(),
            "a request returned without waiting for its log group (Volume::settle_log)"
        );
        // A write of the log failed since the last request: back to the last seal.
        if let Err(e) = g.take_log_failure() {
            g.broke(&e);
        }
        if g.is_broken() {
            g = self.shared.wait_idle(g);
            g.mend();
        }
        if let Some(why) = &g.poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        // Requests that do not end through `Inner::ended` (path lookups of the CLI) prune
        // here, before they touch any record.
        g.evict_idle();
        Ok(g)
    }

    /// For a request that took its log group's ticket under the lock
    /// ([`Inner::log_ticket`]) and has let go of the lock: returns once the group and every
    /// one before it are written to the store (docs/design.md, "Log records written
    /// outside the engine lock"), with `r`, or the failure that lost the group.
    fn settle_log<T>(&self, ticket: Option<u64>, r: Result<T>) -> Result<T> {
        let (Some(t), Some(io)) = (ticket, &self.shared.log_io) else {
            return r;
        };
        match (io.flush_through(t), r) {
            (Ok(()), r) => r,
            (Err(_), Err(e)) | (Err(e), Ok(_)) => Err(e),
        }
    }

    fn note<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if e.is_tampered() {
                self.integrity_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "integrity failure");
            }
        }
        r
    }

    /// Integrity failures seen since open.
    pub fn integrity_failures(&self) -> u64 {
        self.integrity_failures.load(Ordering::Relaxed)
    }

    /// The metadata cache ([`Options::meta_cache_bytes`]): bytes held, and lookups
    /// answered and not since open.
    pub fn meta_cache(&self) -> MetaCacheStats {
        let g = self.shared.lock();
        let (hits, misses) = g.units.hits_misses();
        MetaCacheStats {
            bytes: g.units.bytes(),
            hits,
            misses,
        }
    }

    /// Inode records the engine holds in memory (open files, directories, files with
    /// changes not yet sealed): idle ones are dropped past 1,024, so that looking at many
    /// files (a `find`, a backup) does not grow the engine with every file it touches.
    pub fn resident_records(&self) -> usize {
        self.shared.lock().files.len()
    }

    /// Names the engine keeps for messages and for the paths of open files (at most
    /// 65,536 past the end of a request, with the ones on the way to open files).
    pub fn names_known(&self) -> usize {
        self.shared.lock().names.len()
    }

    /// Store objects the engine's transaction knows of: those it changed since the last
    /// seal, and at most a few thousand it only looked at (issue 18).
    pub fn objects_known(&self) -> usize {
        self.shared.lock().tx.known()
    }

    /// Ends a request that may change the namespace (a create, an unlink, a rename): logs
    /// it ([`Inner::ended`]) and, if it changed something, checks the dirty limits, which
    /// may start a checkpoint ([`Volume::after_write`]).
    fn changed<T>(&self, mut g: MutexGuard<'_, Inner>, r: Result<T>) -> Result<T> {
        let r = g.ended(r);
        let ticket = g.log_ticket.take();
        if !g.last_logged {
            drop(g);
            return self.note(self.settle_log(ticket, r));
        }
        g.maybe_commit();
        let after = self.after_write(g, None, 0);
        let r = match (r, after) {
            (Ok(v), Ok(())) => Ok(v),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        };
        self.note(self.settle_log(ticket, r))
    }

    /// Attributes of a path.
    pub fn stat(&self, path: &str) -> Result<Stat> {
        let r = self.following(|| {
            let mut g = self.lock()?;
            let ino = g.resolve(&split_path(path), path)?;
            g.stat_ino(ino)
        });
        self.note(r.map_err(|e| e.at_path(path)))
    }

    /// Creates an empty regular file (`scheme` defaults to the volume's).
    pub fn create_file(&self, path: &str, scheme: Option<SchemeId>) -> Result<u64> {
        let mut g = self.lock()?;
        let s = scheme.unwrap_or(g.default_scheme);
        let r = g.create_path(path, Kind::File, s).inspect(|&ino| {
            if scheme.is_none() && g.default_auto {
                g.files.get_mut(&ino).expect("created").inode.auto = true;
            }
        });
        self.changed(g, r)
    }

    /// Creates a directory.
    pub fn mkdir(&self, path: &str) -> Result<u64> {
        let mut g = self.lock()?;
        let r = g.create_path(path, Kind::Dir, SchemeId::MtEintGcm);
        self.changed(g, r)
    }

    /// Creates a symlink at `path` pointing to `target`.
    pub fn symlink(&self, target: &str, path: &str) -> Result<u64> {
        let mut g = self.lock()?;
        let r = (|| {
            let ino = g.create_path(path, Kind::Symlink, SchemeId::MtEintGcm)?;
            g.write_target(ino, target.as_bytes())?;
            Ok(ino)
        })();
        self.changed(g, r)
    }

    /// The target of a symlink.
    pub fn readlink(&self, path: &str) -> Result<String> {
        let mut g = self.lock()?;
        let r = (|| {
            let ino = g.resolve(&split_path(path), path)?;
            let of = g.open_ino(ino)?;
            if of.inode.kind != Kind::Symlink {
                return Err(Error::Invalid(format!("{path}: not a symlink")));
            }
            let size = of.inode.size as usize;
            let mut buf = vec![0u8; size];
            g.read_ino(ino, 0, &mut buf)?;
            String::from_utf8(buf).map_err(|_| {
                Error::tampered(
                    Subject::Path(path.into()),
                    None,
                    "symlink target is not UTF-8",
                )
            })
        })();
        self.note(r.map_err(|e| e.at_path(path)))
    }

    /// Reads up to `buf.len()` bytes at `off` of the file at `path`; returns bytes read.
    pub fn read_path(&self, path: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
        let find = |g: &mut Inner| {
            let ino = g.resolve(&split_path(path), path)?;
            g.expect_kind(ino, path, Kind::File)?;
            Ok(ino)
        };
        let r = self.following(|| self.read_unlocked(find, off, buf));
        self.note(r.map_err(|e| e.at_path(path)))
    }

    /// Writes `data` at `off` of the file at `path`, extending it as needed.
    pub fn write_path(&self, path: &str, off: u64, data: &[u8]) -> Result<()> {
        let mut g = self.lock()?;
        let r = (|| {
            let ino = g.resolve(&split_path(path), path)?;
            g.expect_kind(ino, path, Kind::File)?;
            g.write_ino(ino, off, data)
        })();
        let r = g.ended(r);
        let ticket = g.log_ticket.take();
        let r = r.and_then(|()| self.after_write(g, None, data.len()));
        let r = self.settle_log(ticket, r);
        self.note(r.map_err(|e| e.at_path(path)))
    }

    /// Sets the length of the file at `path` (shrinks or extends with zeros).
    pub fn truncate(&self, path: &str, size: u64) -> Result<()> {
        let mut g = self.lock()?;
        let r = (|| {
            let ino = g.resolve(&split_path(path), path)?;
            g.expect_kind(ino, path, Kind::File)?;
            g.truncate_ino(ino, size)
        })();
        let r = g.ended(r);
        let ticket = g.log_ticket.take();
        let r = r.and_then(|()| self.after_write(g, None, 0));
        let r = self.settle_log(ticket, r);
        self.note(r.map_err(|e| e.at_path(path)))
    }

    /// Lists a directory, sorted by name.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let mut g = self.lock()?;
        let r = (|| -> Result<Vec<DirEntry>> {
            let ino = g.resolve(&split_path(path), path)?;
            let mut entries = Vec::new();
            g.dir_each(ino, path, |_, e| {
                entries.push(e);
                Ok(())
            })?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(entries)
        })();
        self.note(r.map_err(|e| e.at_path(path)))
    }

    /// Removes a file or symlink.
    pub fn unlink(&self, path: &str) -> Result<()> {
        let mut g = self.lock()?;
        let r = g.remove_path(path, false);
        self.changed(g, r)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &str) -> Result<()> {
        let mut g = self.lock()?;
        let r = g.remove_path(path, true);
        self.changed(g, r)
    }

    /// Renames `from` to `to`, replacing a file (or empty directory) at `to`.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let mut g = self.lock()?;
        let r = (|| {
            let (fp, fname) = parent_and_name(from)?;
            let (tp, tname) = parent_and_name(to)?;
            let fpino = g.resolve(&fp, from)?;
            let tpino = g.resolve(&tp, to)?;
            g.rename_at(fpino, fname, tpino, tname, RenameMode::Replace)
                .map_err(|e| e.in_path(to))
        })();
        self.changed(g, r)
    }

    /// Whether writes that add data are refused because the store is full (after a commit
    /// failed with ENOSPC and going back found no room; until a seal succeeds or finds
    /// room). A front end may then stop caching writes (FUSE: direct I/O for new opens),
    /// so that write(2) itself gets ENOSPC.
    /// Read without the engine lock (a front end asks at every open); after a request
    /// that failed halfway, it turns true once the next request went back.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Calls `hook` (on a thread of its own) with the inodes a failed commit discarded
    /// changes of: a front end that caches them (the kernel, through FUSE) drops them.
    pub fn on_discard(&self, hook: DiscardHook) {
        self.shared.lock().unsealed.set_hook(hook);
    }
}

/// The inode-level API, for file-system front ends (the FUSE adapter). Inode numbers come
/// from [`Attr::ino`] and [`DirEntry::ino`]; the root is [`ROOT_INO`]. Integrity failures
/// name the inode's last known path.
impl Volume {
    /// Runs `f` on the engine and reports integrity failures with `ino`'s path.
    fn with_ino<T>(&self, ino: u64, mut f: impl FnMut(&mut Inner) -> Result<T>) -> Result<T> {
        self.note(self.following(|| {
            let g = self.lock()?;
            self.run_locked(g, None, ino, None, &mut f)
        }))
    }

    /// [`Volume::with_ino`] for a request that adds dirty data: then, if the dirty limits
    /// were reached, this request seals or waits ([`Volume::after_write`]). Only such
    /// requests do: a lookup or a stat never waits for a seal.
    fn with_ino_write<T>(&self, ino: u64, f: impl FnOnce(&mut Inner) -> Result<T>) -> Result<T> {
        self.with_ino_then(ino, Some(0), f)
    }

    /// [`Volume::run_locked`] under the engine lock taken as any request but a bulk write
    /// takes it.
    fn with_ino_then<T>(
        &self,
        ino: u64,
        written: Option<usize>,
        f: impl FnOnce(&mut Inner) -> Result<T>,
    ) -> Result<T> {
        let g = self.lock()?;
        self.note(self.run_locked(g, None, ino, written, f))
    }

    /// [`Volume::with_ino_write`] for a bulk write: it takes its turn at the gate first,
    /// and gives the turn back before it may wait for a seal ([`gate`]).
    fn with_ino_bulk<T>(
        &self,
        ino: u64,
        len: usize,
        f: impl FnOnce(&mut Inner) -> Result<T>,
    ) -> Result<T> {
        let turn = self.gate.bulk(gate::MAX_YIELD);
        let g = self.ready(self.shared.lock())?;
        self.note(self.run_locked(g, Some(turn), ino, Some(len), f))
    }

    /// Runs `f` under the engine lock `g` for a request about `ino`: errors name the
    /// file, the request is logged, and a request that wrote (`written`: the bytes of data
    /// it wrote, if any) goes on to [`Volume::after_write`]. A bulk write's `turn` is given
    /// back before that.
    fn run_locked<T>(
        &self,
        mut g: MutexGuard<'_, Inner>,
        turn: Option<MutexGuard<'_, ()>>,
        ino: u64,
        written: Option<usize>,
        f: impl FnOnce(&mut Inner) -> Result<T>,
    ) -> Result<T> {
        let r = f(&mut g).map_err(|e| match e {
            Error::Tampered {
                subject: Subject::Inode(i),
                block,
                what,
            } => Error::Tampered {
                subject: Subject::Path(g.path_of(i)),
                block,
                what,
            },
            Error::Fs { path, kind } if path.is_empty() => Error::Fs {
                path: g.path_of(ino),
                kind,
            },
            other => other,
        });
        let r = g.ended(r);
        let ticket = g.log_ticket.take();
        drop(turn);
        let after = match written {
            Some(len) => self.after_write(g, Some(ino), len),
            None if g.last_logged => self.after_write(g, Some(ino), 0),
            None => {
                drop(g);
                Ok(())
            }
        };
        let r = match (r, after) {
            (Ok(v), Ok(())) => Ok(v),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        };
        self.settle_log(ticket, r)
    }

    /// Attributes of `ino`.
    pub fn attr(&self, ino: u64) -> Result<Attr> {
        self.with_ino(ino, |g| g.attr(ino))
    }

    /// Looks `name` up in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr> {
        self.with_ino(parent, |g| {
            let (ino, _) = g.child(parent, name)?;
            g.attr(ino)
        })
    }

    /// The entry `name` of directory `parent` as it is now (`None`: no such name), without
    /// opening the inode it names.
    pub fn entry_at(&self, parent: u64, name: &str) -> Result<Option<DirEntry>> {
        self.with_ino(parent, |g| {
            Ok(g.dir_get(parent, name, "")?.map(|(ino, kind)| DirEntry {
                name: name.to_string(),
                ino,
                kind,
            }))
        })
    }

    /// Clears what a write by a caller without `CAP_FSETID` clears ([`killed_suidgid`]),
    /// when the file has any of it; otherwise changes nothing (no ctime, no record written).
    /// Returns whether it cleared anything.
    pub fn kill_suidgid(&self, ino: u64) -> Result<bool> {
        self.with_ino_write(ino, |g| g.kill_suidgid(ino))
    }

    /// Changes attributes (a size truncates or extends the file) and returns the result.
    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        self.with_ino_write(ino, |g| {
            g.setattr(ino, set)?;
            g.attr(ino)
        })
    }

    /// Creates a file or directory `name` in `parent` (`scheme` defaults to the volume's).
    #[allow(clippy::too_many_arguments)]
    pub fn create_at(
        &self,
        parent: u64,
        name: &str,
        kind: Kind,
        mode: u32,
        uid: u32,
        gid: u32,
        scheme: Option<SchemeId>,
    ) -> Result<Attr> {
        if kind != Kind::File && kind != Kind::Dir {
            return Err(Error::fs(name, FsErrorKind::NotSupported));
        }
        self.with_ino(parent, |g| {
            let s = match kind {
                Kind::File => scheme.unwrap_or(g.default_scheme),
                _ => SchemeId::MtEintGcm,
            };
            let ino = g.create_at(parent, name, kind, s, Some(mode), uid, gid)?;
            if kind == Kind::File && scheme.is_none() && g.default_auto {
                g.files.get_mut(&ino).expect("created").inode.auto = true;
            }
            g.attr(ino)
        })
    }

    /// Creates a FIFO, a unix socket or a device node `name` in `parent` (mknod(2); a
    /// regular file too). `rdev` is the device number of a device node (ignored for the
    /// others). These inodes have no content; they carry their name, mode, owner, times
    /// and links like any other.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod_at(
        &self,
        parent: u64,
        name: &str,
        kind: Kind,
        mode: u32,
        rdev: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        if kind == Kind::File {
            return self.create_at(parent, name, kind, mode, uid, gid, None);
        }
        if !kind.is_special() {
            return Err(Error::fs(name, FsErrorKind::NotSupported));
        }
        self.with_ino(parent, |g| {
            let ino = g.create_at(
                parent,
                name,
                kind,
                SchemeId::MtEintGcm,
                Some(mode),
                uid,
                gid,
            )?;
            if kind.is_device() {
                g.files.get_mut(&ino).expect("created").inode.link = u64::from(rdev);
            }
            g.attr(ino)
        })
    }

    /// Creates a symlink `name` in `parent` pointing to `target`.
    pub fn symlink_at(
        &self,
        parent: u64,
        name: &str,
        target: &str,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.with_ino(parent, |g| {
            let ino = g.create_at(
                parent,
                name,
                Kind::Symlink,
                SchemeId::MtEintGcm,
                None,
                uid,
                gid,
            )?;
            g.write_target(ino, target.as_bytes())?;
            g.attr(ino)
        })
    }

    /// The target of the symlink `ino`.
    pub fn readlink_ino(&self, ino: u64) -> Result<String> {
        self.with_ino(ino, |g| {
            let of = g.open_ino(ino)?;
            if of.inode.kind != Kind::Symlink {
                return Err(Error::Invalid("not a symlink".into()));
            }
            let mut buf = vec![0u8; of.inode.size as usize];
            g.read_ino(ino, 0, &mut buf)?;
            String::from_utf8(buf).map_err(|_| {
                Error::tampered(Subject::Inode(ino), None, "symlink target is not UTF-8")
            })
        })
    }

    /// Adds a name for `ino` (a hard link) and returns its attributes.
    pub fn link_at(&self, ino: u64, parent: u64, name: &str) -> Result<Attr> {
        self.with_ino(ino, |g| {
            g.link_at(ino, parent, name)?;
            g.attr(ino)
        })
    }

    /// Removes the file or symlink `name` from `parent`. A file still open through
    /// [`Volume::open_handle`] stays readable and writable until its last handle is released.
    pub fn unlink_at(&self, parent: u64, name: &str) -> Result<()> {
        self.with_ino(parent, |g| g.remove_at(parent, name, false))
    }

    /// Removes the empty directory `name` from `parent`.
    pub fn rmdir_at(&self, parent: u64, name: &str) -> Result<()> {
        self.with_ino(parent, |g| g.remove_at(parent, name, true))
    }

    /// Renames `parent/name` to `new_parent/new_name`.
    pub fn rename_at(
        &self,
        parent: u64,
        name: &str,
        new_parent: u64,
        new_name: &str,
        mode: RenameMode,
    ) -> Result<()> {
        self.with_ino(parent, |g| {
            g.rename_at(parent, name, new_parent, new_name, mode)
        })
    }

    /// The path of `ino` as far as the engine knows it: every name on the way was looked
    /// up, created or renamed through it (the names of open files are always kept), or
    /// `None` (an unlinked file).
    pub fn path_of_ino(&self, ino: u64) -> Result<Option<String>> {
        Ok(self.lock()?.known_path(ino))
    }

    /// Up to `max` entries of directory `ino` past `cookie` (0: from the start), each with
    /// its cookie, and the directory's parent. The cookies order the directory by a keyed
    /// hash of the names and stay valid while it changes: a listing that resumes after the
    /// last cookie it got skips and repeats no entry that was there all along, and never
    /// returns a removed name (docs/design.md, "Directories"). Fewer than `max`: the end.
    pub fn readdir_page(
        &self,
        ino: u64,
        cookie: u64,
        max: usize,
    ) -> Result<(u64, Vec<(u64, DirEntry)>)> {
        self.with_ino(ino, |g| {
            let page = g.dir_page(ino, cookie, max, "")?;
            let parent = g.open_ino(ino)?.inode.link;
            Ok((parent, page))
        })
    }

    /// Reads up to `buf.len()` bytes at `off` of file `ino`; returns the bytes read.
    ///
    /// A read of stored blocks runs without the engine lock: under it, the engine hands
    /// the read the file's state and a view of its objects ([`Inner::reader`]); the read
    /// holds the file's state, so only a writer of the same file waits for it, and
    /// decrypts and verifies while other requests go on (docs/design.md, "Reads without
    /// the engine lock"). A read that meets blocks written but not yet pushed through the
    /// scheme, or a file the `auto` policy watches, runs under the lock as before.
    pub fn read_ino(&self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        let r = self.following(|| self.read_unlocked(|_| Ok(ino), off, buf));
        let r = r.map_err(|e| match e {
            Error::Tampered {
                subject: Subject::Inode(i),
                block,
                what,
            } => Error::Tampered {
                subject: Subject::Path(self.shared.lock().path_of(i)),
                block,
                what,
            },
            Error::Fs { path, kind } if path.is_empty() => Error::Fs {
                path: self.shared.lock().path_of(ino),
                kind,
            },
            other => other,
        });
        self.note(r)
    }

    /// Reads `buf` at `off` of the regular file `find` names (found under the engine lock,
    /// again at every retry), without the engine lock where it can ([`Volume::read_ino`]).
    /// Errors name inodes: the caller names them as it knows them.
    fn read_unlocked(
        &self,
        find: impl Fn(&mut Inner) -> Result<u64>,
        off: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        loop {
            let mut g = self.lock()?;
            let plan = find(&mut g).and_then(|ino| {
                g.expect_kind(ino, "", Kind::File)?;
                Ok((ino, g.reader(ino, off, buf.len())?))
            });
            let plan = g.ended(plan);
            // (A read logs nothing as a rule; if it did, it waits as any request.)
            let ticket = g.log_ticket.take();
            let reader = match plan {
                Ok((_, Some(r))) => r,
                Ok((ino, None)) => {
                    let r = g.read_ino(ino, off, buf);
                    let r = g.ended(r);
                    let ticket = g.log_ticket.take().or(ticket);
                    drop(g);
                    return self.settle_log(ticket, r);
                }
                Err(e) => {
                    drop(g);
                    return self.settle_log(ticket, Err(e));
                }
            };
            if ticket.is_some() {
                drop(g);
                self.settle_log(ticket, Ok(()))?;
                continue;
            }
            // Excludes going back after a failed commit until the read ends (taken under
            // the engine lock, so never while going back is under way).
            let quiesce = Arc::clone(&g.readers);
            let _held = quiesce.read().unwrap_or_else(|p| p.into_inner());
            // Shared with the other reads of the file; never waits here: writers take the
            // state only under the engine lock, which this request holds.
            let cell = Arc::clone(&reader.state);
            let state = match cell.try_read() {
                Ok(s) => s,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    drop(g);
                    std::thread::yield_now();
                    continue;
                }
            };
            drop(g);
            return reader.read(&state, off, buf);
        }
    }

    /// Whether a write of `len` bytes is a bulk write: it gives way to other requests at
    /// the engine lock ([`gate`]), and a front end may serve it off the threads that serve
    /// small requests.
    pub fn is_bulk_write(len: usize) -> bool {
        len >= gate::BULK_WRITE
    }

    /// Writes `data` at `off` of file `ino`, extending it as needed.
    ///
    /// A bulk write longer than [`gate::BULK_SLICE`] is applied in slices of that length,
    /// in order, each its own turn at the engine lock, so that a small request waits for
    /// one slice at most, not for a whole 1 MiB write (docs/design.md, "Bulk writes in
    /// slices"). The whole range is checked first (a write the file or the volume could
    /// not take fails before any slice lands); a slice that fails later (the store's I/O
    /// error) leaves the slices before it written, as the kernel's own split of a larger
    /// write into requests does.
    pub fn write_ino(&self, ino: u64, off: u64, data: &[u8]) -> Result<()> {
        if data.len() <= gate::BULK_SLICE {
            return self.write_slice(ino, off, data, None);
        }
        let end = off
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::fs("", FsErrorKind::TooLarge))?;
        for (k, slice) in data.chunks(gate::BULK_SLICE).enumerate() {
            let at = off + (k * gate::BULK_SLICE) as u64;
            self.write_slice(ino, at, slice, (k == 0).then_some(end))?;
        }
        Ok(())
    }

    /// One visit (or two: planned, then stored) to the engine for a write of at most
    /// [`gate::BULK_SLICE`]; `end`: the end of the whole write, checked first (the first
    /// slice of a longer write).
    fn write_slice(&self, ino: u64, off: u64, data: &[u8], end: Option<u64>) -> Result<()> {
        const _: () = assert!(gate::BULK_SLICE >= file_io::SEAL_UNLOCKED);
        // A large write is encrypted without the engine lock where its file's scheme allows:
        // a visit to plan it, then one to store it (docs/design.md, "Writes sealed without
        // the engine lock").
        let check = |g: &mut Inner| -> Result<()> {
            g.expect_kind(ino, "", Kind::File)?;
            match end {
                Some(end) => g.check_write_end(ino, end),
                None => Ok(()),
            }
        };
        let sealed = match data.len() >= file_io::SEAL_UNLOCKED {
            true => self
                .with_ino(ino, |g| {
                    check(g)?;
                    g.sealer(ino, off, data.len())
                })?
                .map(|s| s.seal(data)),
            // A first slice is a whole one, so it has the visit above.
            false => None,
        };
        let f = |g: &mut Inner| {
            g.expect_kind(ino, "", Kind::File)?;
            match &sealed {
                Some(s) => g.write_sealed(ino, off, data, s),
                None => g.write_ino(ino, off, data),
            }
        };
        if Self::is_bulk_write(data.len()) {
            self.with_ino_bulk(ino, data.len(), f)
        } else {
            self.with_ino_then(ino, Some(data.len()), f)
        }
    }

    /// Makes `[off, off + len)` of file `ino` read as zeros (fallocate's PUNCH_HOLE and
    /// ZERO_RANGE). Without `keep_size` the file grows to cover the range. A range that
    /// reaches the end of the file is stored as a hole (the file is cut at `off` and
    /// extended again, which stores no data); inside the file, whole blocks become holes
    /// where the scheme stores them ([`crate::scheme::Scheme::punch`]) and the rest is
    /// written as encrypted zeros.
    pub fn zero_range(&self, ino: u64, off: u64, len: u64, keep_size: bool) -> Result<()> {
        const CHUNK: u64 = 1 << 20;
        let end = off
            .checked_add(len)
            .ok_or_else(|| Error::fs("", FsErrorKind::TooLarge))?;
        self.with_ino_write(ino, |g| {
            g.check_writable()?;
            g.expect_kind(ino, "", Kind::File)?;
            let size = g.open_ino(ino)?.inode.size;
            let new_size = if keep_size { size } else { size.max(end) };
            if len == 0 {
                return Ok(());
            }
            if off >= size {
                // Nothing stored there: only the size may change.
                return g.truncate_ino(ino, new_size);
            }
            if end >= size {
                g.truncate_ino(ino, off)?;
                return g.truncate_ino(ino, new_size);
            }
            // Whole blocks inside the range become holes where the scheme can store one
            // there; the partial blocks at its edges (and every block, otherwise) are
            // written as zeros.
            let bs = g.bs as u64;
            let (hole_first, hole_end) = (off.div_ceil(bs), end / bs);
            let punched = hole_first < hole_end && g.punch_blocks(ino, hole_first, hole_end)?;
            let zero = |g: &mut Inner, a: u64, b: u64| -> Result<()> {
                let zeros = vec![0u8; CHUNK.min(b - a) as usize];
                let mut at = a;
                while at < b {
                    let n = (b - at).min(CHUNK) as usize;
                    g.write_ino(ino, at, &zeros[..n])?;
                    at += n as u64;
                }
                Ok(())
            };
            if punched {
                zero(g, off, hole_first * bs)?;
                zero(g, hole_end * bs, end)
            } else {
                zero(g, off, end)
            }
        })
    }

    /// Notes an open handle on `ino` (see [`Volume::unlink_at`]).
    pub fn open_handle(&self, ino: u64) -> Result<()> {
        self.with_ino(ino, |g| {
            g.open_ino(ino)?;
            *g.handles.entry(ino).or_insert(0) += 1;
            Ok(())
        })
    }

    /// Releases a handle taken by [`Volume::open_handle`]; the last release of an unlinked
    /// file frees it.
    pub fn release_handle(&self, ino: u64) -> Result<()> {
        self.with_ino(ino, |g| {
            let n = g.handles.get_mut(&ino).map(|n| {
                *n -= 1;
                *n
            });
            if n == Some(0) {
                g.handles.remove(&ino);
                if !g.read_only && !g.track_references && g.open_ino(ino)?.inode.nlink == 0 {
                    g.free_unlinked(ino)?;
                }
            }
            Ok(())
        })
    }

    /// Makes a file that loses its last name live on until [`Volume::forget`] (the FUSE
    /// adapter's mode; see [`Volume::unlink_at`]).
    pub fn track_references(&self) {
        self.shared.lock().track_references = true;
    }

    /// The front end no longer refers to `ino` (FUSE `FORGET`): an unlinked file with no
    /// open handle is freed, and a freed number may be reused.
    pub fn forget(&self, ino: u64) -> Result<()> {
        self.with_ino(ino, |g| {
            g.unsealed.forget(ino);
            if g.stale.remove(&ino) || g.read_only || g.handles.contains_key(&ino) {
                return Ok(());
            }
            // An unlinked file stays open in the engine until freed (commit keeps it), so a
            // file not open here is not unlinked: no record read per FORGET.
            let unlinked = g
                .files
                .get(&ino)
                .is_some_and(|of| of.inode.kind == Kind::File && of.inode.nlink == 0);
            if unlinked {
                g.free_unlinked(ino)?;
                g.stale.remove(&ino);
            }
            Ok(())
        })
    }

    /// Frees every unlinked file that no handle holds (the front end is going away, so no
    /// reference remains).
    pub fn forget_all(&self) -> Result<()> {
        let mut g = self.lock()?;
        if g.read_only {
            return Ok(());
        }
        let mut u = g.header.unlinked_head;
        let mut gone = Vec::new();
        for _ in 0..=g.header.count {
            if u == 0 {
                break;
            }
            if !g.handles.contains_key(&u) {
                gone.push(u);
            }
            u = g.open_ino(u)?.inode.link;
        }
        let r = gone.into_iter().try_for_each(|ino| g.free_unlinked(ino));
        let r = g.ended(r);
        let ticket = g.log_ticket.take();
        drop(g);
        self.settle_log(ticket, r)
    }

    /// Bytes the engine holds for what is not checkpointed yet: staged changes (overwrites
    /// of sealed data, tree nodes) and written data not yet pushed through its scheme. The
    /// dirty limits bound it (docs/design.md, "Commits in flight").
    pub fn held_bytes(&self) -> usize {
        let g = self.shared.lock();
        g.tx.overlay_bytes() + g.dirty_bytes
    }

    /// The volume's block size.
    pub fn block_size(&self) -> u32 {
        self.shared.lock().bs as u32
    }

    /// Whether the volume was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.shared.lock().read_only
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        // A seal running on its own thread ends first, and lets go of the engine (which
        // holds the volume's lock: a reopen right after the drop must find it free).
        drop(self.shared.wait_idle(self.shared.lock()));
        while Arc::strong_count(&self.shared) > 1 {
            std::thread::yield_now();
        }
        let mut g = self.shared.lock();
        if !self.seal_on_drop.load(Ordering::Relaxed) {
            return;
        }
        // (A broken engine goes back before this seal: `Inner::commit_begin`.)
        if !g.read_only && g.poisoned.is_none() {
            if let Err(e) = g.commit() {
                tracing::error!(error = %e, "final seal on close failed");
            }
        }
    }
}
