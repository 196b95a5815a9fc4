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

mod recover;
pub use recover::{DiscardHook, Discarded};

/// Counters reserved per session (see docs/design.md, "Counters").
pub const CTR_RESERVATION: u64 = 1 << 32;
/// Dirty plaintext held per file before it is pushed through its scheme (by the write
/// that reaches it, under the engine lock: it bounds how long one write holds the lock,
/// and leaves a seal's locked phase little to encrypt).
const FILE_DIRTY_LIMIT: usize = 2 << 20;
/// Staged (journaled) bytes before the engine seals on its own.
const OVERLAY_LIMIT: usize = 32 << 20;
/// Longest name in a directory.
pub const NAME_MAX: usize = 255;
pub use crate::format::AUTO;
/// Blocks the `auto` policy observes before it re-encrypts a file that has content.
const AUTO_MIN_OBSERVED: u64 = 64;
/// Largest file the `auto` policy re-encrypts on its own (a switch rewrites the file).
const AUTO_MAX_SIZE: u64 = 256 << 20;
/// Open-file states kept after a seal.
const KEEP_OPEN: usize = 1024;
/// Known (parent, name) pairs kept after a seal, for naming files in errors.
const KEEP_NAMES: usize = 1 << 20;
/// Dirty plaintext held across all files before the engine seals on its own. The part of a
/// seal that holds the engine lock (encrypting what is dirty) grows with it.
const TOTAL_DIRTY_LIMIT: usize = 32 << 20;
/// Bytes a file writes between two commits before it counts as a heavy writer: past twice
/// the dirty limits, only heavy writers wait for a commit ([`Volume::after_write`]).
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
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: 1024,
            read_only: false,
            xattr_bytes_max: XATTR_BYTES_MAX,
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
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            block_size: 4096,
            scheme: SchemeId::MtEintGcm,
            auto: false,
            kdf: KdfParams::DEFAULT,
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
    /// The file's random id (hex): its objects are `f/<2 hex>/<id>.{d,m,c}`.
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
}

/// An encrypted, authenticated, fresh volume.
pub struct Volume {
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    integrity_failures: AtomicU64,
    seal_on_drop: std::sync::atomic::AtomicBool,
    /// The engine's [`Volume::is_full`] flag.
    full: Arc<std::sync::atomic::AtomicBool>,
}

/// The engine and what its threads share (a seal at the dirty limit runs its I/O on a
/// thread of its own, [`Volume::after_write`]).
struct Shared {
    inner: Mutex<Inner>,
    /// Signalled when a commit in flight ends (see [`Volume::sync`]).
    commit_done: Condvar,
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
        while g.committing {
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

struct Keys {
    master: MasterKey,
    hasher: NodeHasher,
    leaf: SubKey,
    ctrs: SubKey,
    anchor: SubKey,
    journal: SubKey,
}

struct OpenFile {
    inode: Inode,
    state: FileState,
    dirty: BTreeMap<u64, Vec<u8>>,
    record_dirty: bool,
    dir: Option<BTreeMap<String, (u64, Kind)>>,
    dir_dirty: bool,
    /// The decoded attribute set of a hidden [`Kind::Xattr`] inode (loaded on first use,
    /// written back whole at the seal when `xattrs_dirty`): a get, set or remove costs one
    /// map operation.
    xattrs: Option<XattrSet>,
    xattrs_dirty: bool,
    /// A directory's subdirectories, counted when first asked after a change of its
    /// entries (`None`: not counted).
    subdirs: Option<u32>,
    /// The commit that holds this inode's last change (0: none since it was loaded):
    /// an fsync waits for it, no more ([`Volume::fsync`]).
    sealed_by: u64,
    /// What the `auto` policy observed this session (files with `inode.auto` only).
    obs: Observed,
    /// Bytes written to this file since commit number `.0` began: past the dirty limits,
    /// only a file that wrote a large share waits for a commit ([`Volume::after_write`]).
    written: (u64, usize),
}

/// Blocks read and written, and how many of the sampled ones looked random (IsRand).
#[derive(Debug, Clone, Copy, Default)]
struct Observed {
    reads: u64,
    writes: u64,
    random: u64,
    sampled: u64,
}

impl Observed {
    fn sample(&mut self, block: &[u8]) {
        self.sampled += 1;
        self.random += crate::entropy::is_rand(block) as u64;
    }

    /// Counts blocks read (whole blocks in `run`), sampling every fourth for entropy.
    fn observe(&mut self, run: &[u8], bs: usize) {
        for (k, blk) in run.chunks_exact(bs).enumerate() {
            self.reads += 1;
            if k % 4 == 0 {
                self.sample(blk);
            }
        }
    }

    fn total(&self) -> u64 {
        self.reads + self.writes
    }
}

/// One inode's extended attributes, with running totals for the limits.
#[derive(Default)]
struct XattrSet {
    map: BTreeMap<String, Vec<u8>>,
    /// Sum of name and value lengths.
    bytes: usize,
    /// Sum of name lengths plus one NUL each (what listxattr returns).
    names: usize,
}

impl XattrSet {
    fn new(map: BTreeMap<String, Vec<u8>>) -> XattrSet {
        let bytes = map.iter().map(|(k, v)| k.len() + v.len()).sum();
        let names = map.keys().map(|k| k.len() + 1).sum();
        XattrSet { map, bytes, names }
    }

    /// Sets `name`, refusing (ENOSPC) a set that would pass the limits.
    fn set(&mut self, name: &str, value: &[u8], bytes_max: usize) -> Result<()> {
        let old = self.map.get(name).map(|v| v.len());
        let bytes = self.bytes - old.map_or(0, |l| name.len() + l) + name.len() + value.len();
        let names = self.names + if old.is_some() { 0 } else { name.len() + 1 };
        if bytes > bytes_max || names > XATTR_NAMES_MAX {
            return Err(Error::fs(name, FsErrorKind::NoSpace));
        }
        self.map.insert(name.to_string(), value.to_vec());
        self.bytes = bytes;
        self.names = names;
        Ok(())
    }

    fn remove(&mut self, name: &str) -> bool {
        match self.map.remove(name) {
            Some(v) => {
                self.bytes -= name.len() + v.len();
                self.names -= name.len() + 1;
                true
            }
            None => false,
        }
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
    keys: Keys,
    cache: NodeCache,
    anchor: Anchor,
    ctr_floor: u64,
    /// The store's longest object (probed once; `u64::MAX` when read-only).
    max_object: u64,
    tx: Tx,
    itable: OpenFile,
    header: TableHeader,
    header_dirty: bool,
    files: HashMap<u64, OpenFile>,
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
    /// A commit is between [`Inner::commit_begin`] and [`Inner::commit_end`].
    committing: bool,
    /// Commits begun and ended (numbered from 1): a [`Volume::sync`] waits for one that
    /// began after it was called.
    commits_begun: u64,
    commits_ended: u64,
    /// The dirty limits were reached: the front end's request that reached them starts a
    /// commit once it has left the engine's lock (see [`Volume::after_write`]).
    commit_wanted: bool,
    /// [`Options::xattr_bytes_max`].
    xattr_bytes_max: usize,
    poisoned: Option<String>,
    /// What a failed commit must undo and report (see [`recover`]).
    unsealed: recover::Unsealed,
    /// Reused buffer of [`flush_data`].
    scratch: Vec<u8>,
    /// Measured costs (see [`crate::metrics`]).
    metrics: Arc<Metrics>,
}

const HEADER_MAGIC: &[u8; 8] = b"ITABHDR1";

#[derive(Debug, Clone, Copy)]
struct TableHeader {
    free_head: u64,
    count: u64,
    /// First file unlinked while open (docs/file-format.md §4.2).
    unlinked_head: u64,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn derive_keys(master: &MasterKey) -> Keys {
    let node = master.derive(label::NODE, &[]);
    Keys {
        master: master.clone(),
        hasher: NodeHasher::new(*node.expose_secret()),
        leaf: master.derive(label::LEAF, &[]),
        ctrs: master.derive(label::COUNTERS, &[]),
        anchor: master.derive(label::ANCHOR, &[]),
        journal: master.derive(label::JOURNAL, &[]),
    }
}

fn wrap_key(master: &MasterKey, kek: &SubKey, aad: &[u8]) -> String {
    let mut nonce = [0u8; crypto::NONCE_LEN];
    crypto::fill_random(&mut nonce);
    let mut buf = master.expose_secret().to_vec();
    crypto::Gcm::new(kek).seal_append(nonce, aad, &mut buf);
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    let h = hex::encode(&out);
    zeroize::Zeroize::zeroize(&mut buf);
    h
}

fn unwrap_key(config: &Config, password: &[u8]) -> Result<MasterKey> {
    let salt = hex::decode(&config.salt).map_err(|_| Error::Config("bad salt".into()))?;
    let kek = crypto::password_key(password, &salt, config.kdf)?;
    let mut env = zeroize::Zeroizing::new(
        hex::decode(&config.wrapped_key).map_err(|_| Error::Config("bad wrapped key".into()))?,
    );
    if env.len() != crypto::NONCE_LEN + 32 + crypto::TAG_LEN {
        return Err(Error::Config("wrapped key has the wrong length".into()));
    }
    let nonce: [u8; crypto::NONCE_LEN] = env[..crypto::NONCE_LEN].try_into().expect("12");
    let n = crypto::Gcm::new(&kek)
        .open_in_place(nonce, &config.aad(), &mut env[crypto::NONCE_LEN..])
        .ok_or(Error::WrongPassword)?;
    debug_assert_eq!(n, 32);
    let mut k = [0u8; 32];
    k.copy_from_slice(&env[crypto::NONCE_LEN..crypto::NONCE_LEN + 32]);
    Ok(MasterKey::from_bytes(k))
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

/// Reads and parses the config of the volume in `store`.
pub fn read_config(store: &dyn UntrustedStore) -> Result<Config> {
    let bytes = store.read_all(CONFIG_NAME)?.ok_or_else(|| {
        Error::Config(format!(
            "no intact volume here ({CONFIG_NAME} is missing); create one with `intact init`"
        ))
    })?;
    Config::parse(&bytes)
}

fn valid_name(name: &str) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::fs(name, FsErrorKind::NameTooLong));
    }
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Error::fs(name, FsErrorKind::InvalidName));
    }
    Ok(())
}

fn split_path(path: &str) -> Vec<&str> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

fn parent_and_name(path: &str) -> Result<(Vec<&str>, &str)> {
    let mut comps = split_path(path);
    let name = comps
        .pop()
        .ok_or_else(|| Error::fs(path, FsErrorKind::InvalidName))?;
    valid_name(name)?;
    Ok((comps, name))
}

fn encode_xattrs(map: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        8 + map
            .iter()
            .map(|(k, v)| 6 + k.len() + v.len())
            .sum::<usize>(),
    );
    out.extend_from_slice(b"IXAT");
    out.extend_from_slice(&(map.len() as u32).to_le_bytes());
    for (name, value) in map {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    out
}

fn decode_xattrs(b: &[u8]) -> Option<BTreeMap<String, Vec<u8>>> {
    let mut m = BTreeMap::new();
    let mut r = crate::tx::Reader { b, pos: 0 };
    if r.take(4)? != b"IXAT" {
        return None;
    }
    let n = r.u32()?;
    for _ in 0..n {
        let nl = r.u16()? as usize;
        let name = std::str::from_utf8(r.take(nl)?).ok()?.to_string();
        let vl = r.u32()? as usize;
        if vl > XATTR_VALUE_MAX {
            return None;
        }
        m.insert(name, r.take(vl)?.to_vec());
    }
    (r.pos == b.len()).then_some(m)
}

/// Checks an extended-attribute name: only the `user.` namespace is stored.
fn xattr_name(name: &str) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::fs(name, FsErrorKind::ValueTooLarge));
    }
    if name.len() <= 5 || name.contains('\0') {
        return Err(Error::fs(name, FsErrorKind::InvalidName));
    }
    if !name.starts_with("user.") {
        return Err(Error::fs(name, FsErrorKind::NotSupported));
    }
    Ok(())
}

fn encode_dir(entries: &BTreeMap<String, (u64, Kind)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + entries.len() * 24);
    out.extend_from_slice(b"IDIR");
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (name, (ino, kind)) in entries {
        out.push(*kind as u8);
        out.extend_from_slice(&ino.to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
    }
    out
}

fn decode_dir(b: &[u8]) -> Option<BTreeMap<String, (u64, Kind)>> {
    let mut m = BTreeMap::new();
    if b.is_empty() {
        return Some(m);
    }
    let mut r = crate::tx::Reader { b, pos: 0 };
    if r.take(4)? != b"IDIR" {
        return None;
    }
    let n = r.u32()?;
    for _ in 0..n {
        let kind = Kind::of_entry(r.take(1)?[0])?;
        let ino = r.u64()?;
        let nl = r.u16()? as usize;
        let name = std::str::from_utf8(r.take(nl)?).ok()?.to_string();
        m.insert(name, (ino, kind));
    }
    (r.pos == b.len()).then_some(m)
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
            features: vec![],
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
        Self::open_with_key(store, trusted, config, master, opts)
    }

    fn open_with_key(
        store: Arc<dyn UntrustedStore>,
        trusted: Box<dyn TrustedStore>,
        config: Config,
        master: MasterKey,
        opts: &Options,
    ) -> Result<Volume> {
        let keys = derive_keys(&master);
        let lock = trusted.lock(!opts.read_only)?;
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
        if let Some(j) = &anchor.journal {
            let jb = load_journal(store.as_ref(), &keys.journal, j)?;
            if opts.read_only {
                tx.stage_journal(&jb)?;
            } else {
                replay_journal(store.as_ref(), &jb)?;
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
        let mut inner = Inner {
            store,
            trusted: Arc::from(trusted),
            _lock: lock,
            bs: config.block_size as usize,
            default_scheme: match config.scheme.as_str() {
                AUTO => SchemeId::MtEintGcm,
                s => SchemeId::parse(s)?,
            },
            default_auto: config.scheme == AUTO,
            config,
            keys,
            cache: NodeCache::new(opts.cache_bytes),
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
            handles: HashMap::new(),
            names: HashMap::new(),
            dirty_bytes: 0,
            stale: Default::default(),
            track_references: false,
            read_only: opts.read_only,
            committing: false,
            commits_begun: 0,
            commits_ended: 0,
            commit_wanted: false,
            xattr_bytes_max: opts.xattr_bytes_max,
            poisoned: None,
            unsealed: Default::default(),
            scratch: Vec::new(),
            metrics: Arc::new(Metrics::new()),
        };
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
            if !opts.read_only && inner.header.unlinked_head != 0 {
                inner.reap_unlinked()?;
                inner.commit()?;
            }
        }
        Ok(Volume::wrap(inner))
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
        Volume {
            metrics: inner.metrics.clone(),
            full: inner.unsealed.full_flag(),
            shared: Arc::new(Shared {
                inner: Mutex::new(inner),
                commit_done: Condvar::new(),
            }),
            integrity_failures: AtomicU64::new(0),
            seal_on_drop: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Whether dropping the volume seals what was written since the last [`Volume::sync`]
    /// (the default, like unmounting a file system). A front end that wants a command to be
    /// all-or-nothing turns it off and seals explicitly at the end; what it wrote before a
    /// failure is then never sealed (its objects become orphans).
    pub fn set_seal_on_drop(&self, seal: bool) {
        self.seal_on_drop.store(seal, Ordering::Relaxed);
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>> {
        let mut g = self.shared.lock();
        if g.is_broken() {
            g = self.shared.wait_idle(g);
            g.mend();
        }
        if let Some(why) = &g.poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        Ok(g)
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

    /// Attributes of a path.
    pub fn stat(&self, path: &str) -> Result<Stat> {
        let mut g = self.lock()?;
        let r = (|| {
            let ino = g.resolve(&split_path(path), path)?;
            g.stat_ino(ino)
        })();
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
        self.note(r)
    }

    /// Creates a directory.
    pub fn mkdir(&self, path: &str) -> Result<u64> {
        let mut g = self.lock()?;
        self.note(g.create_path(path, Kind::Dir, SchemeId::MtEintGcm))
    }

    /// Creates a symlink at `path` pointing to `target`.
    pub fn symlink(&self, target: &str, path: &str) -> Result<u64> {
        let mut g = self.lock()?;
        let r = (|| {
            let ino = g.create_path(path, Kind::Symlink, SchemeId::MtEintGcm)?;
            g.write_ino(ino, 0, target.as_bytes())?;
            Ok(ino)
        })();
        self.note(r)
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
        let mut g = self.lock()?;
        let r = (|| {
            let ino = g.resolve(&split_path(path), path)?;
            g.expect_kind(ino, path, Kind::File)?;
            g.read_ino(ino, off, buf)
        })();
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
        let r = r.and_then(|()| self.after_write(g, None));
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
        let r = r.and_then(|()| self.after_write(g, None));
        self.note(r.map_err(|e| e.at_path(path)))
    }

    /// Lists a directory, sorted by name.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let mut g = self.lock()?;
        let r = (|| -> Result<Vec<DirEntry>> {
            let ino = g.resolve(&split_path(path), path)?;
            let entries = g.dir_entries(ino, path)?;
            Ok(entries
                .iter()
                .map(|(n, (i, k))| DirEntry {
                    name: n.clone(),
                    ino: *i,
                    kind: *k,
                })
                .collect())
        })();
        self.note(r.map_err(|e| e.at_path(path)))
    }

    /// Removes a file or symlink.
    pub fn unlink(&self, path: &str) -> Result<()> {
        let mut g = self.lock()?;
        let r = g.remove_path(path, false);
        self.note(r)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &str) -> Result<()> {
        let mut g = self.lock()?;
        let r = g.remove_path(path, true);
        self.note(r)
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
        self.note(r)
    }

    /// Seals everything written so far: after this returns, a crash loses none of it,
    /// and a rollback of any of it is detected. Concurrent calls share seals (group
    /// commit), and the seal's I/O runs without the engine's lock, so requests on other
    /// files go on meanwhile (docs/design.md, "Commits").
    ///
    /// If a commit failed since the last call (its changes were discarded: see
    /// [`Error::Lost`]), this call reports it, once, as syncfs(2) reports writeback errors.
    pub fn sync(&self) -> Result<()> {
        let generation = self.shared.lock().unsealed.generation();
        let r = self.seal();
        let mut g = self.shared.lock();
        if r.is_err() {
            g.unsealed.reported();
            return r;
        }
        // Also when changes made before this call were discarded while it waited, even if
        // another caller took the report.
        g.unsealed.report(generation)
    }

    /// [`Volume::sync`] without the report of earlier failures (the periodic seal, which
    /// has no user to tell).
    pub fn seal(&self) -> Result<()> {
        let mut g = self.lock()?;
        if g.read_only {
            return Ok(());
        }
        g.probe_if_full();
        // A commit in flight began before this call and may miss what it must seal.
        let need = g.commits_begun + 1;
        self.note(self.commit_until(g, need))
    }

    /// Reports, once, that a failed commit discarded unsealed changes of `ino` (the FUSE
    /// adapter calls it at close, as Linux reports a writeback error there).
    pub fn take_lost(&self, ino: u64) -> Result<()> {
        let mut g = self.shared.lock();
        let g = &mut *g;
        if let Some(e) = g.discarded(ino) {
            return Err(e); // the file itself is gone: every time
        }
        let names = &g.names;
        g.unsealed.take_lost(ino, || {
            names
                .get(&ino)
                .map_or(format!("inode {ino}"), |(_, n)| n.clone())
        })
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

    /// Makes inode `ino` durable and rollback-protected (fsync, fdatasync, fsyncdir): returns
    /// at once when nothing of it is unsealed, waits for the seal in flight when that one
    /// holds its last change, and otherwise seals (a group commit, as [`Volume::sync`]).
    pub fn fsync(&self, ino: u64) -> Result<()> {
        let g = self.lock()?;
        if g.read_only {
            return Ok(());
        }
        if let Some(e) = g.discarded(ino) {
            return Err(e);
        }
        let need = match g.files.get(&ino) {
            Some(of) if of.is_dirty() => g.commits_begun + 1,
            Some(of) => of.sealed_by,
            // Not open: clean, but possibly evicted by the commit in flight, which holds its
            // change; if that one fails, the loss is reported below.
            None => {
                drop(self.shared.wait_idle(g));
                return self.note(self.take_lost(ino));
            }
        };
        let r = self.commit_until(g, need);
        // A failure is reported once: by this call if it saw one, else the discarded
        // changes of an earlier failure are.
        let lost = self.take_lost(ino);
        self.note(r.and(lost))
    }

    /// Runs commits until commit number `need` has ended: waits for one in flight, begins
    /// the next under the lock, runs its I/O without the lock, and ends it under the lock.
    fn commit_until(&self, mut g: MutexGuard<'_, Inner>, need: u64) -> Result<()> {
        loop {
            if let Some(why) = &g.poisoned {
                return Err(Error::Poisoned(why.clone()));
            }
            if g.commits_ended >= need {
                // A commit that failed was reported to the caller that ran it; the others
                // hear of what they lost from `take_lost` or the volume's generation.
                return Ok(());
            }
            if !g.committing {
                let Some(f) = g.commit_begin()? else {
                    return Ok(());
                };
                drop(g);
                return self.shared.finish(&f);
            }
            g = self.shared.wait(g);
        }
    }

    /// The engine lock with no commit in flight (for work that reads the store directly,
    /// or seals synchronously).
    fn idle(&self) -> Result<MutexGuard<'_, Inner>> {
        let mut g = self.shared.wait_idle(self.lock()?);
        if g.is_broken() {
            g.mend();
        }
        if let Some(why) = &g.poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        Ok(g)
    }

    /// After a request that wrote (to `ino`, when it names one): past the dirty limits, a
    /// commit begins (its locked phase here) and its I/O runs on a thread of its own, so
    /// that no request waits for it. Past twice the limits, the request waits for a commit
    /// to end if its file wrote at least [`THROTTLE_SHARE`] since the last commit began
    /// (the writer that fills memory is slowed; a small write of another file, such as a
    /// create or a log line, never waits behind a bulk writer's seal). Past four times the
    /// limits every writer waits, so memory stays bounded whatever the number of files.
    fn after_write(&self, mut g: MutexGuard<'_, Inner>, ino: Option<u64>) -> Result<()> {
        if !g.commit_wanted || g.read_only {
            return Ok(());
        }
        let over = |k: usize| {
            g.tx.overlay_bytes() >= k * OVERLAY_LIMIT || g.dirty_bytes >= k * TOTAL_DIRTY_LIMIT
        };
        let heavy = || {
            ino.is_none_or(|ino| {
                g.files.get(&ino).is_some_and(|f| {
                    f.written.0 == g.commits_begun && f.written.1 >= THROTTLE_SHARE
                })
            })
        };
        if over(4) || (over(2) && heavy()) {
            let need = g.commits_begun + 1;
            return self.commit_until(g, need);
        }
        if g.committing {
            return Ok(());
        }
        let Some(f) = g.commit_begin()? else {
            return Ok(());
        };
        drop(g);
        let f = Arc::new(f);
        let (shared, bg) = (self.shared.clone(), f.clone());
        let spawned = std::thread::Builder::new()
            .name("intact-seal".into())
            .spawn(move || {
                if let Err(e) = shared.finish(&bg) {
                    tracing::error!(error = %e, "seal at the dirty limit failed");
                }
            });
        match spawned {
            Ok(_) => Ok(()),
            // No thread to be had: run it here.
            Err(_) => self.shared.finish(&f),
        }
    }

    /// Checks every block of every file and directory; returns what failed.
    pub fn fsck(&self, progress: &mut dyn FnMut(u64)) -> Result<Vec<FsckFailure>> {
        let mut g = self.idle()?;
        let r = g.fsck(progress);
        if let Ok(f) = &r {
            self.integrity_failures
                .fetch_add(f.len() as u64, Ordering::Relaxed);
        }
        r
    }

    /// Objects in the store that no file references: left behind by a transaction that
    /// never sealed (a crash, a full disk). Harmless to integrity; they only take space.
    pub fn orphans(&self) -> Result<Vec<String>> {
        let mut g = self.idle()?;
        g.orphans()
    }

    /// Deletes orphaned objects (see [`Volume::orphans`]); returns how many.
    pub fn remove_orphans(&self) -> Result<usize> {
        let mut g = self.idle()?;
        g.check_writable()?;
        // Seal first, so that nothing written in this session counts as an orphan.
        g.commit()?;
        let orphans = g.orphans()?;
        for name in &orphans {
            g.store.delete(name)?;
        }
        g.store.sync_all()?;
        Ok(orphans.len())
    }

    /// Total bytes of file contents (for fsck's progress bar).
    pub fn content_bytes(&self) -> Result<u64> {
        let mut g = self.idle()?;
        Ok(g.records()?
            .iter()
            .filter(|r| r.kind == Kind::File)
            .map(|r| r.size)
            .sum())
    }

    /// Volume facts.
    pub fn info(&self) -> Result<Info> {
        let mut g = self.idle()?;
        g.info()
    }
}

/// The inode-level API, for file-system front ends (the FUSE adapter). Inode numbers come
/// from [`Attr::ino`] and [`DirEntry::ino`]; the root is [`ROOT_INO`]. Integrity failures
/// name the inode's last known path.
impl Volume {
    /// Runs `f` on the engine and reports integrity failures with `ino`'s path.
    fn with_ino<T>(&self, ino: u64, f: impl FnOnce(&mut Inner) -> Result<T>) -> Result<T> {
        self.with_ino_then(ino, false, f)
    }

    /// [`Volume::with_ino`] for a request that adds dirty data: then, if the dirty limits
    /// were reached, this request seals or waits ([`Volume::after_write`]). Only such
    /// requests do: a lookup or a stat never waits for a seal.
    fn with_ino_write<T>(&self, ino: u64, f: impl FnOnce(&mut Inner) -> Result<T>) -> Result<T> {
        self.with_ino_then(ino, true, f)
    }

    fn with_ino_then<T>(
        &self,
        ino: u64,
        writes: bool,
        f: impl FnOnce(&mut Inner) -> Result<T>,
    ) -> Result<T> {
        let mut g = self.lock()?;
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
        let after = if writes {
            self.after_write(g, Some(ino))
        } else {
            Ok(())
        };
        let r = match (r, after) {
            (Ok(v), Ok(())) => Ok(v),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        };
        self.note(r)
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
            Ok(g.dir_entries(parent, "")?
                .get(name)
                .map(|&(ino, kind)| DirEntry {
                    name: name.to_string(),
                    ino,
                    kind,
                }))
        })
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
            g.write_ino(ino, 0, target.as_bytes())?;
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

    /// The entries of directory `ino` (sorted by name) and its parent's inode.
    pub fn readdir_ino(&self, ino: u64) -> Result<(u64, Vec<DirEntry>)> {
        self.with_ino(ino, |g| {
            let entries: Vec<DirEntry> = g
                .dir_entries(ino, "")?
                .iter()
                .map(|(n, (i, k))| DirEntry {
                    name: n.clone(),
                    ino: *i,
                    kind: *k,
                })
                .collect();
            for e in &entries {
                g.names
                    .entry(e.ino)
                    .or_insert_with(|| (ino, e.name.clone()));
            }
            let parent = g.open_ino(ino)?.inode.link;
            Ok((parent, entries))
        })
    }

    /// Reads up to `buf.len()` bytes at `off` of file `ino`; returns the bytes read.
    pub fn read_ino(&self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.with_ino(ino, |g| {
            g.expect_kind(ino, "", Kind::File)?;
            g.read_ino(ino, off, buf)
        })
    }

    /// Writes `data` at `off` of file `ino`, extending it as needed.
    pub fn write_ino(&self, ino: u64, off: u64, data: &[u8]) -> Result<()> {
        self.with_ino_write(ino, |g| {
            g.expect_kind(ino, "", Kind::File)?;
            g.write_ino(ino, off, data)
        })
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

    /// The value of extended attribute `name` of `ino`. `user.intact.scheme` names the
    /// file's scheme (whether or not it was set on the file).
    pub fn getxattr(&self, ino: u64, name: &str) -> Result<Vec<u8>> {
        self.with_ino(ino, |g| {
            if name == SCHEME_XATTR && g.open_ino(ino)?.inode.kind == Kind::File {
                let i = &g.open_ino(ino)?.inode;
                let s = i.scheme.name();
                return Ok(if i.auto {
                    format!("{AUTO}:{s}")
                } else {
                    s.to_string()
                }
                .into_bytes());
            }
            xattr_name(name)?;
            g.xattr_set(ino, false)?
                .and_then(|x| x.map.get(name).cloned())
                .ok_or_else(|| Error::fs(name, FsErrorKind::NoAttribute))
        })
    }

    /// Names of the extended attributes of `ino`; `user.intact.scheme` only when it was
    /// set on this file (so copies off the volume carry no attribute the user never set).
    pub fn listxattr(&self, ino: u64) -> Result<Vec<String>> {
        self.with_ino(ino, |g| {
            let mut names: Vec<String> = g
                .xattr_set(ino, false)?
                .map(|x| x.map.keys().cloned().collect())
                .unwrap_or_default();
            let i = &g.open_ino(ino)?.inode;
            if i.kind == Kind::File && i.scheme_set {
                names.push(SCHEME_XATTR.to_string());
            }
            Ok(names)
        })
    }

    /// Sets extended attribute `name` of `ino`. Setting `user.intact.scheme` on a file
    /// chooses its scheme (an empty file switches at once; a file with content is
    /// re-encrypted under the new scheme). Names are at most 255 bytes, values at most
    /// 64 KiB, and an inode's names and values at most [`Options::xattr_bytes_max`] in all
    /// (ENOSPC past it, as ext4 does when an inode's attribute space is full).
    pub fn setxattr(&self, ino: u64, name: &str, value: &[u8], mode: XattrMode) -> Result<()> {
        self.with_ino(ino, |g| {
            g.check_writable()?;
            if name == SCHEME_XATTR && g.open_ino(ino)?.inode.kind == Kind::File {
                let v = std::str::from_utf8(value)
                    .map_err(|_| Error::Invalid("scheme name is not UTF-8".into()))?
                    .trim_end_matches(['\n', '\0']);
                if v == AUTO || v.starts_with("auto:") {
                    let of = g.touch_record(ino)?;
                    of.inode.auto = true;
                    of.inode.scheme_set = true;
                    return Ok(());
                }
                let s = SchemeId::parse(v)?;
                g.set_scheme(ino, s)?;
                let of = g.touch_record(ino)?;
                of.inode.auto = false;
                of.inode.scheme_set = true;
                return Ok(());
            }
            xattr_name(name)?;
            if value.len() > XATTR_VALUE_MAX {
                return Err(Error::fs(name, FsErrorKind::ValueTooLarge));
            }
            let exists = g
                .xattr_set(ino, false)?
                .is_some_and(|x| x.map.contains_key(name));
            match (mode, exists) {
                (XattrMode::Create, true) => return Err(Error::fs(name, FsErrorKind::Exists)),
                (XattrMode::Replace, false) => {
                    return Err(Error::fs(name, FsErrorKind::NoAttribute))
                }
                _ => {}
            }
            let max = g.xattr_bytes_max;
            let set = g.xattr_set(ino, true)?.expect("created");
            if let Err(e) = set.set(name, value, max) {
                if set.map.is_empty() {
                    // Made for this call: free it again.
                    g.touch_xattrs(ino)?;
                }
                return Err(e);
            }
            g.touch_xattrs(ino)
        })
    }

    /// Removes extended attribute `name` of `ino`. Removing `user.intact.scheme` returns the
    /// file to the volume's default scheme (re-encrypting it if that differs).
    pub fn removexattr(&self, ino: u64, name: &str) -> Result<()> {
        self.with_ino(ino, |g| {
            g.check_writable()?;
            if name == SCHEME_XATTR && g.open_ino(ino)?.inode.kind == Kind::File {
                if !g.open_ino(ino)?.inode.scheme_set {
                    return Err(Error::fs(name, FsErrorKind::NoAttribute));
                }
                let (s, auto) = (g.default_scheme, g.default_auto);
                g.set_scheme(ino, s)?;
                let of = g.touch_record(ino)?;
                of.inode.auto = auto;
                of.inode.scheme_set = false;
                return Ok(());
            }
            xattr_name(name)?;
            let removed = g.xattr_set(ino, false)?.is_some_and(|x| x.remove(name));
            if !removed {
                return Err(Error::fs(name, FsErrorKind::NoAttribute));
            }
            g.touch_xattrs(ino)
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
        for ino in gone {
            g.free_unlinked(ino)?;
        }
        Ok(())
    }

    /// Puts file `ino` under the `auto` policy (or takes it out, keeping its scheme).
    pub fn set_auto(&self, ino: u64, on: bool) -> Result<()> {
        self.with_ino(ino, |g| {
            g.check_writable()?;
            g.expect_kind(ino, "", Kind::File)?;
            g.touch_record(ino)?.inode.auto = on;
            Ok(())
        })
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

/// A commit between its phases (docs/design.md, "Commits"): what its I/O needs, taken
/// under the engine lock by [`Inner::commit_begin`].
struct InFlight {
    /// Its number (see [`Inner::commits_begun`]).
    n: u64,
    commit: Commit,
    /// The anchor that seals it, but for the journal's reference (known once written).
    anchor: Anchor,
    anchor_key: SubKey,
    journal_key: SubKey,
    store: Arc<dyn UntrustedStore>,
    trusted: Arc<dyn TrustedStore>,
}

impl InFlight {
    /// Phase B, without the engine lock: direct writes and the journal made durable, the
    /// anchor sealed, the journal applied in place; returns the sealed anchor. The order is
    /// the crash-safety argument of docs/design.md: nothing the anchor names can be missing
    /// when it is sealed, and nothing is overwritten in place before the journal holding it
    /// is sealed.
    fn run(&self) -> Result<Anchor> {
        let mut anchor = self.anchor.clone();
        anchor.journal = self
            .commit
            .write_journal(self.store.as_ref(), &self.journal_key)?;
        let bytes = anchor.encode(&self.anchor_key);
        self.trusted.store(&bytes)?;
        self.commit.apply(self.store.as_ref())?;
        // The untrusted copy (for `recover-anchor` only) is written in place and not
        // synced: it never protects anything, and a lost or torn copy fails its MAC.
        self.store.write_at(ANCHOR_COPY_NAME, 0, &bytes)?;
        Ok(anchor)
    }
}

impl OpenFile {
    fn load(inode: Inode, keys: &Keys, tx: &mut Tx, subject: Subject) -> Result<OpenFile> {
        let names = ObjectNames::of(&inode.id);
        let ctr_hash = |b: &[u8]| keys.ctrs.mac(&[b"ctrs", &inode.id, b]);
        // Read exactly the spilled arrays' trusted length: bytes past it may be the remains of
        // a transaction that never sealed, and the store's length is not to be trusted.
        let spilled = match &inode.counters {
            TrustedCounters::Spilled { intervals, .. } => {
                let len = 12 + 16 * *intervals as usize;
                let mut buf = vec![0u8; len];
                tx.read_at(&names.ctrs, 0, &mut buf)?;
                Some(buf)
            }
            TrustedCounters::Inline(_) => None,
        };
        let ctrs = check_ctr(&inode.counters, spilled.as_deref(), &ctr_hash)
            .map_err(|e| Error::tampered(subject.clone(), None, format!("write counters: {e}")))?;
        let fresh = inode.scheme.uses_counter_intervals();
        let covered = match inode.scheme.partial_tree() {
            true => inode.tree.leaves <= ctrs.blocks(),
            false => inode.tree.leaves == ctrs.blocks(),
        };
        if fresh && !covered {
            return Err(Error::tampered(
                subject,
                None,
                "counter intervals do not cover the file's blocks",
            ));
        }
        let state = FileState {
            subject,
            id: inode.id,
            keys: crypto::FileKeys::derive(&keys.master, &inode.id),
            names,
            tree: inode.tree,
            ctrs,
            ctr_hw: inode.ctr_hw,
            rtree: crate::scheme::RTreeIndex::for_scheme(inode.scheme),
        };
        Ok(OpenFile {
            inode,
            state,
            dirty: BTreeMap::new(),
            record_dirty: false,
            dir: None,
            dir_dirty: false,
            xattrs: None,
            xattrs_dirty: false,
            subdirs: None,
            sealed_by: 0,
            obs: Observed::default(),
            written: (0, 0),
        })
    }

    fn is_dirty(&self) -> bool {
        !self.dirty.is_empty() || self.record_dirty || self.dir_dirty || self.xattrs_dirty
    }
}

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
        }
    };
}

/// Where block `b` meets the byte range `[off, off + len)`: the range in the buffer and
/// the range in the block (empty when they do not meet).
fn block_part(
    bs: u64,
    b: u64,
    off: u64,
    len: usize,
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let s = (b * bs).max(off);
    let e = ((b + 1) * bs).min(off + len as u64).max(s);
    (
        (s - off) as usize..(e - off) as usize,
        (s - b * bs) as usize..(e - b * bs) as usize,
    )
}

fn copy_block_part(bs: u64, b: u64, block: &[u8], off: u64, buf: &mut [u8]) {
    let (to, from) = block_part(bs, b, off, buf.len());
    buf[to].copy_from_slice(&block[from]);
}

/// Reads a file's bytes, from its dirty blocks or through its scheme.
fn file_read(env: &Env, tx: &mut Tx, of: &mut OpenFile, off: u64, buf: &mut [u8]) -> Result<usize> {
    let size = of.inode.size;
    if off >= size || buf.is_empty() {
        return Ok(0);
    }
    let n = (buf.len() as u64).min(size - off) as usize;
    let buf = &mut buf[..n];
    let bs = env.bs as u64;
    let sch = scheme(of.inode.scheme);
    let (first, last) = (off / bs, (off + n as u64 - 1) / bs);
    let stored = of.state.blocks();
    let mut b = first;
    let mut tmp = Vec::new();
    while b <= last {
        if let Some(d) = of.dirty.get(&b) {
            copy_block_part(bs, b, d, off, buf);
            b += 1;
            continue;
        }
        if b >= stored {
            let (to, _) = block_part(bs, b, off, buf.len());
            buf[to].fill(0);
            b += 1;
            continue;
        }
        let mut e = b;
        while e < last && e + 1 < stored && !of.dirty.contains_key(&(e + 1)) && e - b < 1023 {
            e += 1;
        }
        tmp.resize(((e - b + 1) * bs) as usize, 0);
        sch.read_blocks(env, &mut of.state, tx, b, &mut tmp)?;
        if of.inode.auto {
            of.obs.observe(&tmp, env.bs);
        }
        for k in b..=e {
            copy_block_part(
                bs,
                k,
                &tmp[((k - b) * bs) as usize..((k - b + 1) * bs) as usize],
                off,
                buf,
            );
        }
        b = e + 1;
    }
    Ok(n)
}

/// One block's current plaintext (dirty, stored, or zeros past the stored end).
fn load_block(env: &Env, tx: &mut Tx, of: &mut OpenFile, b: u64) -> Result<Vec<u8>> {
    if let Some(d) = of.dirty.get(&b) {
        return Ok(d.clone());
    }
    let mut blk = vec![0u8; env.bs];
    if b < of.state.blocks() {
        scheme(of.inode.scheme).read_blocks(env, &mut of.state, tx, b, &mut blk)?;
    }
    Ok(blk)
}

/// Refuses a length the file's scheme cannot reach: past the nonce's block limit, or (for
/// `aead`, which writes gaps as encrypted zeros) a gap too large to fill. Checked before
/// anything changes, so the error never surfaces later at a seal.
fn check_extent(env: &Env, of: &OpenFile, size: u64) -> Result<()> {
    let blocks = size.div_ceil(env.bs as u64);
    let stored = of
        .state
        .blocks()
        .max(of.dirty.keys().next_back().map_or(0, |b| b + 1));
    let gap_ok = of.inode.scheme != SchemeId::Aead
        || blocks <= stored
        || blocks - stored <= crate::scheme::AEAD_MAX_GAP;
    // The store's largest object (the backing file system's largest file): a length that
    // would need more is refused now, not by the seal that would store it.
    let fits = scheme(of.inode.scheme).data_len(env.bs, blocks) <= env.max_object;
    if blocks > crypto::MAX_BLOCKS || !gap_ok || !fits {
        return Err(Error::fs("", FsErrorKind::TooLarge));
    }
    Ok(())
}

fn file_write(env: &Env, tx: &mut Tx, of: &mut OpenFile, off: u64, data: &[u8]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let bs = env.bs as u64;
    let end = off
        .checked_add(data.len() as u64)
        .ok_or_else(|| Error::fs("", FsErrorKind::TooLarge))?;
    check_extent(env, of, end)?;
    for b in off / bs..=(end - 1) / bs {
        let s = (b * bs).max(off);
        let e = ((b + 1) * bs).min(end);
        let src = &data[(s - off) as usize..(e - off) as usize];
        if of.inode.auto {
            of.obs.writes += 1;
            if e - s == bs {
                of.obs.sample(src);
            }
        }
        if e - s == bs {
            of.dirty.insert(b, src.to_vec());
            continue;
        }
        if let Some(d) = of.dirty.get_mut(&b) {
            d[(s - b * bs) as usize..(e - b * bs) as usize].copy_from_slice(src);
            continue;
        }
        let mut blk = load_block(env, tx, of, b)?;
        blk[(s - b * bs) as usize..(e - b * bs) as usize].copy_from_slice(src);
        of.dirty.insert(b, blk);
    }
    of.inode.size = of.inode.size.max(end);
    of.inode.mtime_ns = now_ns();
    of.inode.ctime_ns = of.inode.mtime_ns;
    of.record_dirty = true;
    Ok(())
}

/// Sets a file's length: drops dirty blocks past it, zeroes the tail of a new partial last
/// block (so a later extension reads zeros), and truncates the scheme's blocks.
fn file_truncate(env: &Env, tx: &mut Tx, of: &mut OpenFile, size: u64) -> Result<()> {
    let bs = env.bs as u64;
    let new_blocks = size.div_ceil(bs);
    of.dirty.retain(|&b, _| b < new_blocks);
    if size < of.inode.size {
        if !size.is_multiple_of(bs) {
            let b = size / bs;
            let mut blk = load_block(env, tx, of, b)?;
            blk[(size % bs) as usize..].fill(0);
            of.dirty.insert(b, blk);
        }
        if new_blocks < of.state.blocks() {
            scheme(of.inode.scheme).resize(env, &mut of.state, tx, new_blocks)?;
        }
    }
    if size != of.inode.size {
        of.inode.size = size;
        of.inode.mtime_ns = now_ns();
        of.inode.ctime_ns = of.inode.mtime_ns;
        of.record_dirty = true;
    }
    Ok(())
}

/// Pushes dirty blocks through the scheme (Update / Append), extending with holes where the
/// file grew past its stored blocks. Runs are assembled in `run` (a buffer the engine keeps,
/// so large flushes do not fault in fresh pages every time) and encrypted in place. On an
/// error the file's remaining dirty blocks are gone: callers must mark the engine broken.
fn flush_data(env: &Env, tx: &mut Tx, of: &mut OpenFile, run: &mut Vec<u8>) -> Result<()> {
    let sch = scheme(of.inode.scheme);
    let bs = env.bs as u64;
    let dirty = std::mem::take(&mut of.dirty);
    let mut it = dirty.into_iter().peekable();
    while let Some((first, blk)) = it.next() {
        run.clear();
        run.extend_from_slice(&blk);
        let mut next = first + 1;
        while let Some((b, _)) = it.peek() {
            if *b != next {
                break;
            }
            run.extend_from_slice(&it.next().expect("peeked").1);
            next += 1;
        }
        if first > of.state.blocks() {
            sch.resize(env, &mut of.state, tx, first)?;
        }
        sch.write_blocks(env, &mut of.state, tx, first, run)?;
    }
    let target = of.inode.size.div_ceil(bs);
    if of.state.blocks() < target {
        sch.resize(env, &mut of.state, tx, target)?;
    }
    Ok(())
}

/// auth_ctr (Fig. 6) and the TS_F fields of the record, after a flush.
fn finish_record(keys: &Keys, tx: &mut Tx, of: &mut OpenFile) -> Result<()> {
    let id = of.inode.id;
    let hash = |b: &[u8]| keys.ctrs.mac(&[b"ctrs", &id, b]);
    let (tc, spill) = auth_ctr(&of.state.ctrs, L_CTR, &hash);
    match spill {
        Some(bytes) => {
            tx.write_at(&of.state.names.ctrs, 0, &bytes)?;
            tx.set_len(&of.state.names.ctrs, bytes.len() as u64)?;
        }
        None => {
            if matches!(of.inode.counters, TrustedCounters::Spilled { .. }) {
                tx.set_len(&of.state.names.ctrs, 0)?;
            }
        }
    }
    of.inode.counters = tc;
    of.inode.tree = of.state.tree;
    of.inode.ctr_hw = of.state.ctr_hw;
    Ok(())
}

impl Inner {
    fn empty_tree(&self, s: SchemeId, id: &FileId) -> crate::tree::TreeState {
        let env = env!(self);
        scheme(s).empty(&env, id)
    }

    /// Finishes a new volume: the inode-table header and the root directory, sealed.
    fn init_fresh(&mut self) -> Result<()> {
        self.header = TableHeader {
            free_head: 0,
            count: ROOT_INO + 1,
            unlinked_head: 0,
        };
        self.header_dirty = true;
        let id = crypto::random_file_id();
        let mut root = Inode::new(
            Kind::Dir,
            SchemeId::MtEintGcm,
            id,
            self.empty_tree(SchemeId::MtEintGcm, &id),
            now_ns(),
        );
        root.nlink = 2;
        root.link = ROOT_INO;
        let mut of = OpenFile::load(root, &self.keys, &mut self.tx, Subject::Path("/".into()))?;
        of.dir = Some(BTreeMap::new());
        of.record_dirty = true;
        self.files.insert(ROOT_INO, of);
        self.commit()
    }

    fn read_record(&mut self, ino: u64) -> Result<Inode> {
        let mut b = [0u8; RECORD_SIZE];
        let env = env!(self);
        let n = file_read(
            &env,
            &mut self.tx,
            &mut self.itable,
            ino * RECORD_SIZE as u64,
            &mut b,
        )?;
        if n != RECORD_SIZE {
            return Err(Error::tampered(
                Subject::InodeTable,
                None,
                format!("inode {ino} is past the end of the table"),
            ));
        }
        Inode::decode(&b).ok_or_else(|| {
            Error::tampered(
                Subject::InodeTable,
                None,
                format!("inode {ino}: malformed record"),
            )
        })
    }

    fn write_record(&mut self, ino: u64, inode: &Inode) -> Result<()> {
        let env = env!(self);
        file_write(
            &env,
            &mut self.tx,
            &mut self.itable,
            ino * RECORD_SIZE as u64,
            &inode.encode(),
        )
    }

    fn read_header(&mut self) -> Result<TableHeader> {
        let mut b = [0u8; RECORD_SIZE];
        let env = env!(self);
        let n = file_read(&env, &mut self.tx, &mut self.itable, 0, &mut b)?;
        if n != RECORD_SIZE || &b[..8] != HEADER_MAGIC {
            return Err(Error::tampered(
                Subject::InodeTable,
                None,
                "bad inode-table header",
            ));
        }
        let free_head = u64::from_le_bytes(b[8..16].try_into().expect("8"));
        let count = u64::from_le_bytes(b[16..24].try_into().expect("8"));
        let unlinked_head = u64::from_le_bytes(b[24..32].try_into().expect("8"));
        let records = self.itable.inode.size / RECORD_SIZE as u64;
        if count > records
            || free_head >= count.max(1)
            || count <= ROOT_INO
            || unlinked_head >= count
        {
            return Err(Error::tampered(
                Subject::InodeTable,
                None,
                "inconsistent inode-table header",
            ));
        }
        Ok(TableHeader {
            free_head,
            count,
            unlinked_head,
        })
    }

    fn write_header(&mut self) -> Result<()> {
        let mut b = [0u8; RECORD_SIZE];
        b[..8].copy_from_slice(HEADER_MAGIC);
        b[8..16].copy_from_slice(&self.header.free_head.to_le_bytes());
        b[16..24].copy_from_slice(&self.header.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.header.unlinked_head.to_le_bytes());
        let env = env!(self);
        file_write(&env, &mut self.tx, &mut self.itable, 0, &b)
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::fs("", FsErrorKind::ReadOnly));
        }
        Ok(())
    }

    fn ensure_open(&mut self, ino: u64) -> Result<()> {
        if self.files.contains_key(&ino) {
            return Ok(());
        }
        if self.stale.contains(&ino) {
            return Err(self
                .discarded(ino)
                .unwrap_or_else(|| Error::fs("", FsErrorKind::NotFound)));
        }
        if ino == 0 || ino >= self.header.count {
            return Err(Error::tampered(
                Subject::Inode(ino),
                None,
                "directory entry points outside the inode table",
            ));
        }
        let inode = self.read_record(ino)?;
        if inode.kind == Kind::Free {
            return Err(Error::tampered(
                Subject::Inode(ino),
                None,
                "directory entry points to a free inode",
            ));
        }
        let of = OpenFile::load(inode, &self.keys, &mut self.tx, Subject::Inode(ino))?;
        self.files.insert(ino, of);
        Ok(())
    }

    fn open_ino(&mut self, ino: u64) -> Result<&mut OpenFile> {
        self.ensure_open(ino)?;
        Ok(self.files.get_mut(&ino).expect("opened"))
    }

    fn expect_kind(&mut self, ino: u64, path: &str, kind: Kind) -> Result<()> {
        let k = self.open_ino(ino)?.inode.kind;
        match (k, kind) {
            (a, b) if a == b => Ok(()),
            (Kind::Dir, _) => Err(Error::fs(path, FsErrorKind::IsADirectory)),
            _ => Err(Error::Invalid(format!("{path}: not a regular file"))),
        }
    }

    fn dir_entries(&mut self, ino: u64, path: &str) -> Result<&mut BTreeMap<String, (u64, Kind)>> {
        self.ensure_open(ino)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        if of.inode.kind != Kind::Dir {
            return Err(Error::fs(path, FsErrorKind::NotADirectory));
        }
        if of.dir.is_none() {
            let mut buf = vec![0u8; of.inode.size as usize];
            file_read(&env, &mut self.tx, of, 0, &mut buf)?;
            let d = decode_dir(&buf)
                .ok_or_else(|| Error::tampered(Subject::Inode(ino), None, "malformed directory"))?;
            of.dir = Some(d);
        }
        Ok(of.dir.as_mut().expect("loaded"))
    }

    fn resolve(&mut self, comps: &[&str], path: &str) -> Result<u64> {
        let mut ino = ROOT_INO;
        for (k, c) in comps.iter().enumerate() {
            // The prefix is only formatted for an error message.
            let entries = self
                .dir_entries(ino, "")
                .map_err(|e| e.at_path(&format!("/{}", comps[..k].join("/"))))?;
            ino = entries
                .get(*c)
                .ok_or_else(|| Error::fs(path, FsErrorKind::NotFound))?
                .0;
        }
        Ok(ino)
    }

    fn stat_ino(&mut self, ino: u64) -> Result<Stat> {
        let bs = self.bs as u64;
        let of = self.open_ino(ino)?;
        let (intervals, spilled) = match &of.inode.counters {
            TrustedCounters::Inline(c) => (c.intervals() as u64, false),
            TrustedCounters::Spilled { intervals, .. } => (*intervals as u64, true),
        };
        Ok(Stat {
            ino,
            kind: of.inode.kind,
            size: of.inode.size,
            mode: of.inode.mode,
            mtime_ns: of.inode.mtime_ns,
            ctime_ns: of.inode.ctime_ns,
            scheme: of.inode.scheme.name().to_string(),
            auto: of.inode.auto,
            file_id: hex::encode(of.inode.id),
            blocks: of.state.blocks().max(of.inode.size.div_ceil(bs)),
            counter_intervals: intervals,
            counters_spilled: spilled,
            rdev: if of.inode.kind.is_device() {
                of.inode.link as u32
            } else {
                0
            },
        })
    }

    fn read_ino(&mut self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.ensure_open(ino)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        file_read(&env, &mut self.tx, of, off, buf)
    }

    fn write_ino(&mut self, ino: u64, off: u64, data: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.unsealed.refuse_if_full()?;
        self.ensure_open(ino)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        let before = of.dirty.len();
        file_write(&env, &mut self.tx, of, off, data)?;
        if of.written.0 != self.commits_begun {
            of.written = (self.commits_begun, 0);
        }
        of.written.1 = of.written.1.saturating_add(data.len());
        self.dirty_bytes += of.dirty.len().saturating_sub(before) * env.bs;
        if of.dirty.len() * env.bs >= FILE_DIRTY_LIMIT {
            self.dirty_bytes = self.dirty_bytes.saturating_sub(of.dirty.len() * env.bs);
            if let Err(e) = flush_data(&env, &mut self.tx, of, &mut self.scratch) {
                // The file's state is half pushed through its scheme.
                self.broke(&e);
                return Err(e);
            }
        }
        self.maybe_commit()
    }

    fn truncate_ino(&mut self, ino: u64, size: u64) -> Result<()> {
        self.check_writable()?;
        self.ensure_open(ino)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        check_extent(&env, of, size)?;
        if size > of.inode.size {
            self.unsealed.refuse_if_full()?;
        }
        let of = self.files.get_mut(&ino).expect("opened");
        if let Err(e) = file_truncate(&env, &mut self.tx, of, size) {
            if e.is_tampered() || matches!(e, Error::Io { .. }) {
                // The file's state may be half cut.
                self.broke(&e);
            }
            return Err(e);
        }
        self.maybe_commit()
    }

    /// Past the dirty limits, asks for a commit (begun by the front end's request once it
    /// leaves the lock: [`Volume::after_write`]).
    /// Makes blocks `[first, end)` of file `ino` holes through its scheme (dropping any
    /// dirty copies); false when the scheme stores no hole inside a file.
    fn punch_blocks(&mut self, ino: u64, first: u64, end: u64) -> Result<bool> {
        self.check_writable()?;
        self.ensure_open(ino)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        let sch = scheme(of.inode.scheme);
        // Stored blocks first: a scheme that cannot punch changes nothing.
        let stored_end = end.min(of.state.blocks());
        if first < stored_end
            && !sch.punch(&env, &mut of.state, &mut self.tx, first, stored_end - first)?
        {
            return Ok(false);
        }
        let before = of.dirty.len();
        of.dirty.retain(|&b, _| b < first || b >= end);
        self.dirty_bytes = self
            .dirty_bytes
            .saturating_sub((before - of.dirty.len()) * env.bs);
        of.inode.mtime_ns = now_ns();
        of.inode.ctime_ns = of.inode.mtime_ns;
        of.record_dirty = true;
        Ok(true)
    }

    fn maybe_commit(&mut self) -> Result<()> {
        if self.tx.overlay_bytes() >= OVERLAY_LIMIT || self.dirty_bytes >= TOTAL_DIRTY_LIMIT {
            self.commit_wanted = true;
        }
        Ok(())
    }

    fn alloc_ino(&mut self) -> Result<u64> {
        let ino = if self.header.free_head != 0 && !self.stale.contains(&self.header.free_head) {
            let ino = self.header.free_head;
            let rec = self.read_record(ino)?;
            if rec.kind != Kind::Free {
                return Err(Error::tampered(
                    Subject::InodeTable,
                    None,
                    "free list points to a used inode",
                ));
            }
            self.header.free_head = rec.link;
            ino
        } else {
            let mut ino = self.header.count;
            // Numbers past the table's end that a front end may still hold (files a failed
            // commit discarded) are skipped; they stay free until the next open.
            self.header_dirty = true;
            while self.stale.contains(&ino) {
                self.write_record(ino, &Inode::free(self.header.free_head))?;
                self.header.free_head = ino;
                ino += 1;
            }
            self.header.count = ino + 1;
            ino
        };
        self.header_dirty = true;
        Ok(ino)
    }

    fn create_path(&mut self, path: &str, kind: Kind, s: SchemeId) -> Result<u64> {
        let (parents, name) = parent_and_name(path)?;
        let pino = self.resolve(&parents, path)?;
        self.create_at(pino, name, kind, s, None, 0, 0)
            .map_err(|e| e.in_path(path))
    }

    fn remove_path(&mut self, path: &str, dir: bool) -> Result<()> {
        let (parents, name) = parent_and_name(path)?;
        let pino = self.resolve(&parents, path)?;
        self.remove_at(pino, name, dir).map_err(|e| e.in_path(path))
    }

    /// Frees an inode (and its extended-attribute file): its objects are deleted at the seal.
    fn free_ino(&mut self, ino: u64) -> Result<()> {
        self.ensure_open(ino)?;
        let of = self.files.remove(&ino).expect("opened");
        for name in [
            &of.state.names.data,
            &of.state.names.meta,
            &of.state.names.ctrs,
        ] {
            self.tx.delete(name)?;
        }
        self.cache.remove_file(&of.inode.id);
        self.names.remove(&ino);
        if of.inode.kind != Kind::Xattr {
            self.stale.insert(ino);
            self.unsealed.reborn(ino, self.commits_begun + 1, false);
        }
        let rec = Inode::free(self.header.free_head);
        self.write_record(ino, &rec)?;
        self.header.free_head = ino;
        self.header_dirty = true;
        if of.inode.xattr != 0 && of.inode.kind != Kind::Xattr {
            self.free_ino(of.inode.xattr as u64)?;
        }
        Ok(())
    }

    fn touch_dir(&mut self, ino: u64) {
        if let Some(of) = self.files.get_mut(&ino) {
            of.dir_dirty = true;
            of.subdirs = None;
            of.record_dirty = true;
            of.inode.mtime_ns = now_ns();
            of.inode.ctime_ns = of.inode.mtime_ns;
        }
    }

    /// Marks an inode's attributes changed (ctime) and its record dirty.
    fn touch_record(&mut self, ino: u64) -> Result<&mut OpenFile> {
        let of = self.open_ino(ino)?;
        of.inode.ctime_ns = now_ns();
        of.record_dirty = true;
        Ok(of)
    }

    /// The entry `name` of directory `pino`, checked against the record it names.
    fn child(&mut self, pino: u64, name: &str) -> Result<(u64, Kind)> {
        let (ino, kind) = *self
            .dir_entries(pino, "")?
            .get(name)
            .ok_or_else(|| Error::fs(name, FsErrorKind::NotFound))?;
        let actual = self.open_ino(ino)?.inode.kind;
        if actual != kind {
            return Err(Error::tampered(
                Subject::Inode(pino),
                None,
                format!("entry {name:?} names an inode of another kind"),
            ));
        }
        self.names.insert(ino, (pino, name.to_string()));
        Ok((ino, kind))
    }

    /// Whether directory `a` is `b` or one of its ancestors (walking up the parent links).
    fn is_ancestor(&mut self, a: u64, b: u64) -> Result<bool> {
        let mut cur = b;
        for _ in 0..=self.header.count {
            if cur == a {
                return Ok(true);
            }
            if cur == ROOT_INO {
                return Ok(false);
            }
            cur = self.open_ino(cur)?.inode.link;
        }
        Err(Error::tampered(
            Subject::Inode(b),
            None,
            "directory parent links form a cycle",
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn create_at(
        &mut self,
        pino: u64,
        name: &str,
        kind: Kind,
        s: SchemeId,
        mode: Option<u32>,
        uid: u32,
        gid: u32,
    ) -> Result<u64> {
        self.check_writable()?;
        valid_name(name)?;
        if self.dir_entries(pino, name)?.contains_key(name) {
            return Err(Error::fs(name, FsErrorKind::Exists));
        }
        let ino = self.new_inode(kind, s, mode, uid, gid)?;
        if kind == Kind::Dir {
            let of = self.files.get_mut(&ino).expect("created");
            of.inode.nlink = 2;
            of.inode.link = pino;
        }
        self.dir_entries(pino, name)?
            .insert(name.to_string(), (ino, kind));
        self.touch_dir(pino);
        self.names.insert(ino, (pino, name.to_string()));
        Ok(ino)
    }

    /// Allocates and opens a new, empty inode that no directory names yet.
    fn new_inode(
        &mut self,
        kind: Kind,
        s: SchemeId,
        mode: Option<u32>,
        uid: u32,
        gid: u32,
    ) -> Result<u64> {
        let ino = self.alloc_ino()?;
        if kind != Kind::Xattr {
            self.unsealed.reborn(ino, self.commits_begun + 1, true);
        }
        let id = crypto::random_file_id();
        let mut inode = Inode::new(kind, s, id, self.empty_tree(s, &id), now_ns());
        if kind == Kind::Symlink {
            inode.mode = 0o777;
        }
        if let Some(m) = mode {
            inode.mode = m & 0o7777;
        }
        inode.uid = uid;
        inode.gid = gid;
        let mut of = OpenFile::load(inode, &self.keys, &mut self.tx, Subject::Inode(ino))?;
        if kind == Kind::Dir {
            of.dir = Some(BTreeMap::new());
            of.dir_dirty = true;
        }
        of.record_dirty = true;
        self.files.insert(ino, of);
        Ok(ino)
    }

    /// Adds the name `name` in `pino` for the file `ino` (a hard link).
    fn link_at(&mut self, ino: u64, pino: u64, name: &str) -> Result<()> {
        self.check_writable()?;
        valid_name(name)?;
        let kind = self.open_ino(ino)?.inode.kind;
        if kind == Kind::Dir || kind == Kind::Xattr {
            return Err(Error::fs(name, FsErrorKind::NotPermitted));
        }
        if self.open_ino(ino)?.inode.nlink == 0 {
            return Err(Error::fs(name, FsErrorKind::NotFound));
        }
        if self.dir_entries(pino, name)?.contains_key(name) {
            return Err(Error::fs(name, FsErrorKind::Exists));
        }
        self.dir_entries(pino, name)?
            .insert(name.to_string(), (ino, kind));
        self.touch_dir(pino);
        let of = self.touch_record(ino)?;
        of.inode.nlink = of.inode.nlink.saturating_add(1);
        self.names.insert(ino, (pino, name.to_string()));
        Ok(())
    }

    /// Removes one name of `ino` (already taken out of its directory): frees the inode when
    /// it was the last name and no handle is open; otherwise keeps it (docs/file-format.md
    /// §4.2, the unlinked list).
    fn drop_link(&mut self, ino: u64) -> Result<()> {
        let open = self.track_references || self.handles.get(&ino).copied().unwrap_or(0) > 0;
        let unlinked_head = self.header.unlinked_head;
        let of = self.touch_record(ino)?;
        // A symlink or special file may have hard links too (link(2) does not follow).
        if of.inode.kind != Kind::Dir && of.inode.nlink > 1 {
            of.inode.nlink -= 1;
            return Ok(());
        }
        if of.inode.kind == Kind::File && open {
            of.inode.nlink = 0;
            of.inode.link = unlinked_head;
            self.header.unlinked_head = ino;
            self.header_dirty = true;
            self.names.remove(&ino);
            return Ok(());
        }
        self.free_ino(ino)
    }

    /// Takes `ino` off the unlinked list and frees it.
    fn free_unlinked(&mut self, ino: u64) -> Result<()> {
        let next = self.open_ino(ino)?.inode.link;
        if self.header.unlinked_head == ino {
            self.header.unlinked_head = next;
            self.header_dirty = true;
        } else {
            let mut cur = self.header.unlinked_head;
            for _ in 0..=self.header.count {
                if cur == 0 {
                    break;
                }
                let of = self.open_ino(cur)?;
                if of.inode.link == ino {
                    of.inode.link = next;
                    of.record_dirty = true;
                    break;
                }
                cur = of.inode.link;
            }
        }
        self.free_ino(ino)
    }

    /// Frees every file left on the unlinked list (by a crash or an unclean unmount).
    fn reap_unlinked(&mut self) -> Result<()> {
        let mut n = 0;
        while self.header.unlinked_head != 0 {
            let ino = self.header.unlinked_head;
            let count = self.header.count;
            let of = self.open_ino(ino)?;
            if of.inode.kind != Kind::File || of.inode.nlink != 0 || n > count {
                return Err(Error::tampered(
                    Subject::InodeTable,
                    None,
                    "malformed list of unlinked files",
                ));
            }
            self.header.unlinked_head = of.inode.link;
            self.header_dirty = true;
            self.free_ino(ino)?;
            n += 1;
        }
        if n > 0 {
            tracing::info!(
                files = n,
                "freed files unlinked while open before the last unmount"
            );
        }
        Ok(())
    }

    fn remove_at(&mut self, pino: u64, name: &str, dir: bool) -> Result<()> {
        self.check_writable()?;
        valid_name(name)?;
        let (ino, kind) = self.child(pino, name)?;
        match (dir, kind) {
            (true, Kind::Dir) => {
                if !self.dir_entries(ino, name)?.is_empty() {
                    return Err(Error::fs(name, FsErrorKind::NotEmpty));
                }
            }
            (true, _) => return Err(Error::fs(name, FsErrorKind::NotADirectory)),
            (false, Kind::Dir) => return Err(Error::fs(name, FsErrorKind::IsADirectory)),
            (false, _) => {}
        }
        self.dir_entries(pino, name)?.remove(name);
        self.touch_dir(pino);
        self.drop_link(ino)
    }

    fn rename_at(
        &mut self,
        fpino: u64,
        fname: &str,
        tpino: u64,
        tname: &str,
        mode: RenameMode,
    ) -> Result<()> {
        self.check_writable()?;
        valid_name(fname)?;
        valid_name(tname)?;
        let (ino, kind) = self.child(fpino, fname)?;
        let target = match self.child(tpino, tname) {
            Ok(t) => Some(t),
            Err(Error::Fs {
                kind: FsErrorKind::NotFound,
                ..
            }) => None,
            Err(e) => return Err(e),
        };
        if kind == Kind::Dir && self.is_ancestor(ino, tpino)? {
            return Err(Error::fs(tname, FsErrorKind::RenameIntoSelf));
        }
        match (mode, target) {
            (RenameMode::NoReplace, Some(_)) => return Err(Error::fs(tname, FsErrorKind::Exists)),
            (RenameMode::Exchange, None) => return Err(Error::fs(tname, FsErrorKind::NotFound)),
            (RenameMode::Exchange, Some((tino, tkind))) => {
                if tkind == Kind::Dir && self.is_ancestor(tino, fpino)? {
                    return Err(Error::fs(fname, FsErrorKind::RenameIntoSelf));
                }
                self.dir_entries(fpino, fname)?
                    .insert(fname.to_string(), (tino, tkind));
                self.dir_entries(tpino, tname)?
                    .insert(tname.to_string(), (ino, kind));
                for (i, k, p, n) in [(ino, kind, tpino, tname), (tino, tkind, fpino, fname)] {
                    let of = self.touch_record(i)?;
                    if k == Kind::Dir {
                        of.inode.link = p;
                    }
                    self.names.insert(i, (p, n.to_string()));
                }
                self.touch_dir(fpino);
                self.touch_dir(tpino);
                return Ok(());
            }
            (_, Some((tino, _))) if tino == ino => return Ok(()),
            (_, Some((tino, tkind))) => {
                match (kind, tkind) {
                    (Kind::Dir, Kind::Dir) if !self.dir_entries(tino, tname)?.is_empty() => {
                        return Err(Error::fs(tname, FsErrorKind::NotEmpty));
                    }
                    (Kind::Dir, Kind::Dir) => {}
                    (Kind::Dir, _) => return Err(Error::fs(tname, FsErrorKind::NotADirectory)),
                    (_, Kind::Dir) => return Err(Error::fs(tname, FsErrorKind::IsADirectory)),
                    _ => {}
                }
                self.dir_entries(tpino, tname)?.remove(tname);
                self.drop_link(tino)?;
            }
            (_, None) => {}
        }
        self.dir_entries(fpino, fname)?.remove(fname);
        self.dir_entries(tpino, tname)?
            .insert(tname.to_string(), (ino, kind));
        self.touch_dir(fpino);
        self.touch_dir(tpino);
        let of = self.touch_record(ino)?;
        if kind == Kind::Dir {
            of.inode.link = tpino;
        }
        self.names.insert(ino, (tpino, tname.to_string()));
        Ok(())
    }

    fn attr(&mut self, ino: u64) -> Result<Attr> {
        let bs = self.bs as u64;
        let nlink = match self.open_ino(ino)?.inode.kind {
            // As on ext4: its entry in the parent, its `.`, and each subdirectory's `..`.
            Kind::Dir => 2u32.saturating_add(self.subdirs(ino)?),
            _ => self.open_ino(ino)?.inode.nlink,
        };
        let of = self.open_ino(ino)?;
        let i = &of.inode;
        Ok(Attr {
            ino,
            generation: u64::from_le_bytes(i.id[..8].try_into().expect("8")),
            kind: i.kind,
            size: i.size,
            mode: i.mode,
            uid: i.uid,
            gid: i.gid,
            nlink,
            atime_ns: i.atime_ns,
            mtime_ns: i.mtime_ns,
            ctime_ns: i.ctime_ns,
            stored_bytes: stored_blocks(of).min(i.size.div_ceil(bs)) * bs,
            rdev: if i.kind.is_device() { i.link as u32 } else { 0 },
        })
    }

    /// The subdirectories of directory `ino` (counted once after each change).
    fn subdirs(&mut self, ino: u64) -> Result<u32> {
        if let Some(n) = self.open_ino(ino)?.subdirs {
            return Ok(n);
        }
        let n = self
            .dir_entries(ino, "")?
            .values()
            .filter(|(_, k)| *k == Kind::Dir)
            .count();
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.open_ino(ino)?.subdirs = Some(n);
        Ok(n)
    }

    fn setattr(&mut self, ino: u64, set: &SetAttr) -> Result<()> {
        self.check_writable()?;
        if let Some(size) = set.size {
            match self.open_ino(ino)?.inode.kind {
                Kind::File => {}
                Kind::Dir => return Err(Error::fs("", FsErrorKind::IsADirectory)),
                // truncate(2) of a FIFO, socket, device or symlink: EINVAL, as on ext4.
                _ => return Err(Error::Invalid("not a regular file".into())),
            }
            self.truncate_ino(ino, size)?;
        }
        let of = self.touch_record(ino)?;
        if let Some(m) = set.mode {
            of.inode.mode = m & 0o7777;
        }
        if let Some(u) = set.uid {
            of.inode.uid = u;
        }
        if let Some(g) = set.gid {
            of.inode.gid = g;
        }
        if let Some(t) = set.atime_ns {
            of.inode.atime_ns = t;
        }
        if let Some(t) = set.mtime_ns {
            of.inode.mtime_ns = t;
        }
        Ok(())
    }

    /// The extended attributes of `ino`, decoded once and kept with the hidden attribute
    /// inode; `None` when it has none. With `create`, an empty set is made when there is
    /// none.
    fn xattr_set(&mut self, ino: u64, create: bool) -> Result<Option<&mut XattrSet>> {
        let mut x = self.open_ino(ino)?.inode.xattr as u64;
        if x == 0 {
            if !create {
                return Ok(None);
            }
            let (uid, gid) = {
                let i = &self.open_ino(ino)?.inode;
                (i.uid, i.gid)
            };
            x = self.new_inode(Kind::Xattr, SchemeId::MtEintGcm, Some(0o600), uid, gid)?;
            match u32::try_from(x) {
                Ok(x32) => self.touch_record(ino)?.inode.xattr = x32,
                Err(_) => {
                    self.free_ino(x)?;
                    return Err(Error::fs("", FsErrorKind::NotSupported));
                }
            }
            let of = self.files.get_mut(&x).expect("created");
            of.xattrs = Some(XattrSet::default());
            of.xattrs_dirty = true;
        }
        self.ensure_open(x)?;
        let env = env!(self);
        let of = self.files.get_mut(&x).expect("opened");
        if of.inode.kind != Kind::Xattr {
            return Err(Error::tampered(
                Subject::Inode(ino),
                None,
                "extended attributes point to an inode of another kind",
            ));
        }
        if of.xattrs.is_none() {
            let mut buf = vec![0u8; of.inode.size as usize];
            file_read(&env, &mut self.tx, of, 0, &mut buf)?;
            let map = decode_xattrs(&buf).ok_or_else(|| {
                Error::tampered(Subject::Inode(ino), None, "malformed extended attributes")
            })?;
            of.xattrs = Some(XattrSet::new(map));
        }
        Ok(of.xattrs.as_mut())
    }

    /// After a change to `ino`'s attribute set: the set is written at the seal, an empty
    /// one frees its hidden inode, and `ino`'s ctime changes.
    fn touch_xattrs(&mut self, ino: u64) -> Result<()> {
        let x = self.open_ino(ino)?.inode.xattr as u64;
        let empty = {
            let of = self.files.get_mut(&x).expect("loaded by xattr_set");
            of.xattrs_dirty = true;
            of.xattrs.as_ref().is_some_and(|s| s.map.is_empty())
        };
        if empty {
            self.free_ino(x)?;
            self.touch_record(ino)?.inode.xattr = 0;
        } else {
            self.touch_record(ino)?;
        }
        Ok(())
    }

    /// Re-encrypts file `ino` under scheme `s`. The new content gets a new file id (so new
    /// keys: no (key, nonce) pair of the old scheme can repeat) and the old objects are
    /// deleted at the seal that makes the switch durable, atomically with it.
    fn set_scheme(&mut self, ino: u64, s: SchemeId) -> Result<()> {
        self.check_writable()?;
        if self.open_ino(ino)?.inode.scheme == s {
            return Ok(());
        }
        let mut old = self.files.remove(&ino).expect("opened");
        let r = self.reencrypt(ino, &mut old, s);
        match r {
            Ok(new) => {
                for name in [
                    &old.state.names.data,
                    &old.state.names.meta,
                    &old.state.names.ctrs,
                ] {
                    self.tx.delete(name)?;
                }
                self.cache.remove_file(&old.inode.id);
                self.files.insert(ino, new);
                Ok(())
            }
            Err(e) => {
                self.files.insert(ino, old);
                Err(e)
            }
        }
    }

    fn reencrypt(&mut self, ino: u64, old: &mut OpenFile, s: SchemeId) -> Result<OpenFile> {
        const CHUNK: usize = 1 << 20;
        let id = crypto::random_file_id();
        let mut inode = old.inode.clone();
        inode.scheme = s;
        inode.id = id;
        inode.tree = self.empty_tree(s, &id);
        inode.counters = TrustedCounters::Inline(crate::tree::CounterIntervals::new());
        inode.ctr_hw = 0;
        inode.size = 0;
        let mut new = OpenFile::load(inode, &self.keys, &mut self.tx, Subject::Inode(ino))?;
        let env = env!(self);
        let size = old.inode.size;
        let mut buf = vec![0u8; CHUNK];
        let mut off = 0;
        while off < size {
            let n = file_read(&env, &mut self.tx, old, off, &mut buf)?;
            if buf[..n].iter().any(|&b| b != 0) {
                file_write(&env, &mut self.tx, &mut new, off, &buf[..n])?;
            }
            off += n as u64;
            if new.dirty.len() * env.bs >= FILE_DIRTY_LIMIT {
                flush_data(&env, &mut self.tx, &mut new, &mut self.scratch)?;
            }
        }
        file_truncate(&env, &mut self.tx, &mut new, size)?;
        // The copy is not the workload: the `auto` policy starts observing afresh (otherwise
        // the copy's writes would call for another switch at the next seal).
        new.obs = Observed::default();
        new.inode.mtime_ns = old.inode.mtime_ns;
        new.inode.ctime_ns = now_ns();
        new.record_dirty = true;
        Ok(new)
    }

    /// A best-effort path of `ino`, for error messages.
    fn path_of(&self, ino: u64) -> String {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO && parts.len() < 256 {
            match self.names.get(&cur) {
                Some((p, n)) => {
                    parts.push(n.as_str());
                    cur = *p;
                }
                None => return format!("<inode {ino}>"),
            }
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    /// A whole commit, synchronously, under the lock (opening, closing, and work that
    /// needs no commit in flight; see [`Volume::idle`]).
    fn commit(&mut self) -> Result<()> {
        debug_assert!(!self.committing, "a commit is in flight");
        match self.commit_begin()? {
            None => Ok(()),
            Some(f) => {
                let r = f.run();
                self.commit_end(&f, r)
            }
        }
    }

    /// Phase A of a commit, under the lock: flushes every dirty file through its scheme,
    /// writes the records and the inode table, and takes the result out of the
    /// transaction with the anchor that will seal it. `None`: nothing to seal. On an
    /// error the engine goes back to the last seal ([`recover`]).
    fn commit_begin(&mut self) -> Result<Option<InFlight>> {
        if self.read_only {
            return Ok(None);
        }
        debug_assert!(!self.committing, "a commit is in flight");
        if self.is_broken() {
            // A half-updated file is never sealed: back to the last seal first.
            self.mend();
            if let Some(why) = &self.poisoned {
                return Err(Error::Poisoned(why.clone()));
            }
        }
        let metrics = self.metrics.clone();
        let _a = Account::with_phase(&metrics, Phase::Root);
        let r = self.commit_prepare();
        self.dirty_bytes = 0;
        self.commit_wanted = false;
        match r {
            Ok(Some((commit, anchor))) => {
                self.commits_begun += 1;
                self.committing = true;
                Ok(Some(InFlight {
                    n: self.commits_begun,
                    commit,
                    anchor,
                    anchor_key: self.keys.anchor.clone(),
                    journal_key: self.keys.journal.clone(),
                    store: self.store.clone(),
                    trusted: self.trusted.clone(),
                }))
            }
            Ok(None) => {
                self.commits_begun += 1;
                self.commits_ended = self.commits_begun;
                self.unsealed.applied(self.commits_ended);
                Ok(None)
            }
            Err(e) => {
                self.commit_failed(None, &e);
                Err(e)
            }
        }
    }

    /// Phase C of a commit, under the lock, once its I/O ([`InFlight::run`]) returned `r`:
    /// the sealed anchor becomes the engine's, or the engine goes back to the last seal.
    fn commit_end(&mut self, f: &InFlight, r: Result<Anchor>) -> Result<()> {
        self.tx.end_commit(&f.commit);
        self.committing = false;
        self.commits_ended = f.n;
        match r {
            Ok(anchor) => {
                self.anchor = anchor;
                self.unsealed.applied(f.n);
                self.unsealed.had_room();
                Ok(())
            }
            Err(e) => {
                self.commit_failed(Some(f), &e);
                Err(e)
            }
        }
    }

    /// The `auto` policy, before a seal: files whose observed contents and access mix call
    /// for another scheme (paper Table 7, [`crate::format::auto_choice`]) switch. A file
    /// never stored yet switches at no cost; one with content is re-encrypted, once enough
    /// of it was observed and if it is not too large to rewrite within a seal.
    fn apply_auto_policy(&mut self) -> Result<()> {
        let candidates: Vec<(u64, SchemeId)> = self
            .files
            .iter()
            .filter(|(_, f)| f.inode.auto && f.inode.kind == Kind::File)
            .filter_map(|(ino, f)| {
                let o = f.obs;
                let target = crate::format::auto_choice(o.reads, o.writes, o.random, o.sampled)?;
                let fresh = f.state.blocks() == 0;
                let worth = o.total() >= AUTO_MIN_OBSERVED.max(f.state.blocks() / 4)
                    && f.inode.size <= AUTO_MAX_SIZE;
                (target != f.inode.scheme && (fresh || worth)).then_some((*ino, target))
            })
            .collect();
        for (ino, target) in candidates {
            let from = self.files[&ino].inode.scheme;
            self.set_scheme(ino, target)?;
            tracing::info!(
                ino,
                from = from.name(),
                to = target.name(),
                "auto policy switched scheme"
            );
        }
        Ok(())
    }

    fn commit_prepare(&mut self) -> Result<Option<(Commit, Anchor)>> {
        self.apply_auto_policy()?;
        // 1. Directory contents, then file data, then records into the inode table.
        let dirty: Vec<u64> = self
            .files
            .iter()
            .filter(|(_, f)| f.is_dirty())
            .map(|(i, _)| *i)
            .collect();
        let this_commit = self.commits_begun + 1;
        for ino in dirty {
            let env = env!(self);
            self.unsealed.pending(ino, this_commit);
            let of = self.files.get_mut(&ino).expect("listed");
            of.sealed_by = this_commit;
            if of.dir_dirty {
                let bytes = encode_dir(of.dir.as_ref().expect("dirty dir is loaded"));
                file_write(&env, &mut self.tx, of, 0, &bytes)?;
                file_truncate(&env, &mut self.tx, of, bytes.len() as u64)?;
                of.dir_dirty = false;
            }
            if of.xattrs_dirty {
                let bytes = encode_xattrs(&of.xattrs.as_ref().expect("dirty set is loaded").map);
                file_write(&env, &mut self.tx, of, 0, &bytes)?;
                file_truncate(&env, &mut self.tx, of, bytes.len() as u64)?;
                of.xattrs_dirty = false;
            }
            flush_data(&env, &mut self.tx, of, &mut self.scratch)?;
            finish_record(&self.keys, &mut self.tx, of)?;
            of.record_dirty = false;
            let rec = of.inode.clone();
            self.write_record(ino, &rec)?;
        }
        if self.header_dirty {
            self.write_header()?;
            self.header_dirty = false;
        }
        // 2. The inode table itself.
        let env = env!(self);
        flush_data(&env, &mut self.tx, &mut self.itable, &mut self.scratch)?;
        finish_record(&self.keys, &mut self.tx, &mut self.itable)?;
        if !self.tx.is_dirty() && self.itable.inode == self.anchor.itable {
            return Ok(None);
        }
        // 3. The journal and the anchor that seals it; the I/O is [`InFlight::run`].
        let epoch = self.anchor.epoch + 1;
        let commit = self
            .tx
            .begin_commit(epoch, self.anchor.journal.map(|j| j.slot))?;
        // The journal's reference is filled in by [`InFlight::run`]; the engine takes the
        // sealed anchor at [`Inner::commit_end`] (the next commit begins after that).
        let anchor = Anchor {
            volume_id: self.anchor.volume_id,
            epoch,
            ctr_next: self.anchor.ctr_next,
            journal: None,
            itable: self.itable.inode.clone(),
        };
        if self.files.len() > KEEP_OPEN {
            // Directories, and files unlinked while referenced (`forget` finds them here
            // without reading their record). Every state is clean at this point.
            self.files
                .retain(|_, f| f.inode.kind == Kind::Dir || f.inode.nlink == 0);
        }
        if self.names.len() > KEEP_NAMES {
            // Only error messages use them; lookups repopulate what is in use.
            self.names.clear();
        }
        Ok(Some((commit, anchor)))
    }

    fn fsck(&mut self, progress: &mut dyn FnMut(u64)) -> Result<Vec<FsckFailure>> {
        let mut failures = Vec::new();
        let fail = |path: &str, e: Error| match e {
            Error::Tampered { block, what, .. } => FsckFailure {
                path: path.to_string(),
                block,
                what,
            },
            other => FsckFailure {
                path: path.to_string(),
                block: None,
                what: other.to_string(),
            },
        };
        // The whole inode table.
        let env = env!(self);
        if let Err(e) = check_all_blocks(&env, &mut self.tx, &mut self.itable, &mut |_| {}) {
            failures.extend(e.into_iter().map(|e| fail("<inode table>", e)));
            return Ok(failures);
        }
        let mut reached = std::collections::HashSet::new();
        let mut stack = vec![("/".to_string(), ROOT_INO)];
        // Files unlinked while open are not lost: the next writable open frees them.
        let mut u = self.header.unlinked_head;
        while u != 0 && !reached.contains(&u) {
            stack.push((format!("<unlinked inode {u}>"), u));
            reached.insert(u);
            u = match self.open_ino(u) {
                Ok(of) => of.inode.link,
                Err(e) => {
                    failures.push(fail("<unlinked list>", e));
                    0
                }
            };
        }
        while let Some((path, ino)) = stack.pop() {
            reached.insert(ino);
            if let Err(e) = self.ensure_open(ino) {
                failures.push(fail(&path, e));
                continue;
            }
            let env = env!(self);
            let of = self.files.get_mut(&ino).expect("opened");
            if let Err(errs) = check_all_blocks(&env, &mut self.tx, of, progress) {
                failures.extend(errs.into_iter().map(|e| fail(&path, e)));
                continue;
            }
            if of.inode.xattr != 0 {
                stack.push((
                    format!("{path} (extended attributes)"),
                    of.inode.xattr as u64,
                ));
            }
            if of.inode.kind == Kind::Dir {
                match self.dir_entries(ino, &path) {
                    Ok(entries) => {
                        for (name, (child, _)) in entries.iter().rev() {
                            let p = if path == "/" {
                                format!("/{name}")
                            } else {
                                format!("{path}/{name}")
                            };
                            stack.push((p, *child));
                        }
                    }
                    Err(e) => failures.push(fail(&path, e)),
                }
            }
        }
        for ino in ROOT_INO..self.header.count {
            if reached.contains(&ino) {
                continue;
            }
            match self.read_record(ino) {
                Ok(r) if r.kind == Kind::Free => {}
                Ok(_) => failures.push(FsckFailure {
                    path: format!("<inode {ino}>"),
                    block: None,
                    what: "allocated but not referenced by any directory (lost file)".into(),
                }),
                Err(e) => failures.push(fail("<inode table>", e)),
            }
        }
        Ok(failures)
    }

    /// Every inode record (root onwards), with open files' in-memory state.
    fn records(&mut self) -> Result<Vec<Inode>> {
        (ROOT_INO..self.header.count)
            .map(|ino| match self.files.get(&ino) {
                Some(of) => Ok(of.inode.clone()),
                None => self.read_record(ino),
            })
            .collect()
    }

    fn orphans(&mut self) -> Result<Vec<String>> {
        let mut live = std::collections::HashSet::new();
        live.insert(hex::encode(self.itable.inode.id));
        for r in self.records()? {
            if r.kind != Kind::Free {
                live.insert(hex::encode(r.id));
            }
        }
        let mut out: Vec<String> = self
            .store
            .list()?
            .into_iter()
            .filter(|n| n.starts_with("f/"))
            .filter(|n| {
                let id = n
                    .rsplit('/')
                    .next()
                    .unwrap_or("")
                    .split('.')
                    .next()
                    .unwrap_or("");
                !live.contains(id)
            })
            .collect();
        out.sort();
        Ok(out)
    }

    fn info(&mut self) -> Result<Info> {
        let (mut files, mut dirs, mut links, mut special, mut content) = (0, 0, 0, 0, 0);
        for r in self.records()? {
            match r.kind {
                Kind::File => {
                    files += 1;
                    content += r.size;
                }
                Kind::Dir => dirs += 1,
                Kind::Symlink => links += 1,
                Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev => special += 1,
                Kind::Free | Kind::Xattr => {}
            }
        }
        let itable_prefix = hex::encode(self.itable.inode.id);
        let (mut data, mut integrity, mut itable) = (0, 0, 0);
        for name in self.store.list()? {
            let len = self.store.len(&name)?.unwrap_or(0);
            if name.contains(&itable_prefix) {
                itable += len;
                continue;
            }
            match crate::store::ObjectClass::of(&name) {
                crate::store::ObjectClass::Data => data += len,
                crate::store::ObjectClass::Integrity => integrity += len,
                _ => {}
            }
        }
        Ok(Info {
            volume_id: self.config.volume_id.clone(),
            scheme: if self.default_auto {
                AUTO.to_string()
            } else {
                self.default_scheme.name().to_string()
            },
            block_size: self.bs as u32,
            files,
            directories: dirs,
            symlinks: links,
            special_files: special,
            content_bytes: content,
            trusted_bytes: ANCHOR_SIZE as u64,
            data_object_bytes: data,
            integrity_bytes: integrity,
            inode_table_bytes: itable,
            epoch: self.anchor.epoch,
            anchor: self.trusted.location(),
        })
    }
}

/// Blocks that hold data (holes excluded): counter 0 marks a hole in the counter
/// intervals (schemes without them report every block they hold).
fn stored_blocks(of: &OpenFile) -> u64 {
    let blocks = of.state.blocks();
    if !of.inode.scheme.uses_counter_intervals() {
        return blocks;
    }
    of.state
        .ctrs
        .runs(0, blocks)
        .filter(|r| r.2 != 0)
        .map(|r| r.1)
        .sum::<u64>()
        + of.dirty.len() as u64
}

/// Verifies every stored block of a file; returns every failure (one per failing block).
fn check_all_blocks(
    env: &Env,
    tx: &mut Tx,
    of: &mut OpenFile,
    progress: &mut dyn FnMut(u64),
) -> std::result::Result<(), Vec<Error>> {
    const CHUNK: u64 = 256;
    let sch = scheme(of.inode.scheme);
    let blocks = of.state.blocks();
    let mut errs = Vec::new();
    let mut buf = vec![0u8; CHUNK as usize * env.bs];
    let mut b = 0;
    while b < blocks {
        let n = (blocks - b).min(CHUNK);
        let chunk = &mut buf[..(n as usize * env.bs)];
        if sch.read_blocks(env, &mut of.state, tx, b, chunk).is_err() {
            for k in b..b + n {
                if let Err(e) = sch.read_blocks(env, &mut of.state, tx, k, &mut chunk[..env.bs]) {
                    errs.push(e);
                }
            }
        }
        progress(n * env.bs as u64);
        b += n;
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

// ---------------------------------------------------------------------------------------
// Integrity metrics (measured; see crate::metrics)

impl Volume {
    /// The measured costs of everything this volume did since it was opened: blocks,
    /// bytes of `US_F` accessed (integrity bandwidth), time by phase.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// A file's integrity costs: its storage for integrity (`US_F` objects), its trusted
    /// state (bytes of TS_F in use), and what was measured on it since open.
    pub fn file_integrity(&self, path: &str) -> Result<FileIntegrity> {
        let mut g = self.idle()?;
        let r = (|| {
            let ino = g.resolve(&split_path(path), path)?;
            g.file_integrity(ino, path)
        })();
        self.note(r.map_err(|e| e.at_path(path)))
    }

    /// The volume's integrity costs: storage for integrity, trusted storage, and what was
    /// measured since open.
    pub fn integrity(&self) -> Result<VolumeIntegrity> {
        let mut g = self.idle()?;
        let r = g.volume_integrity();
        self.note(r)
    }
}

impl Inner {
    fn file_integrity(&mut self, ino: u64, path: &str) -> Result<FileIntegrity> {
        self.ensure_open(ino)?;
        let bs = self.bs as u64;
        let of = self.files.get(&ino).expect("opened");
        let (inode, names) = (of.inode.clone(), of.state.names.clone());
        let blocks = of.state.blocks();
        let mut len = |n: &str| -> Result<u64> { Ok(self.tx.len(n)?.unwrap_or(0)) };
        let (d, m, c) = (len(&names.data)?, len(&names.meta)?, len(&names.ctrs)?);
        Ok(FileIntegrity::new(
            path,
            &inode,
            blocks,
            bs,
            [d, m, c],
            self.metrics.file(&inode.id),
        ))
    }

    fn volume_integrity(&mut self) -> Result<VolumeIntegrity> {
        let records = self.records()?;
        let itable_id = hex::encode(self.itable.inode.id);
        let mut v = VolumeIntegrity {
            anchor_bytes: ANCHOR_SIZE as u64,
            itable_ts_bytes: self.itable.inode.trusted_bytes_used(),
            ..Default::default()
        };
        for r in records.iter().filter(|r| r.kind != Kind::Free) {
            v.files += 1;
            v.ts_bytes += r.trusted_bytes_used();
        }
        for name in self.store.list()? {
            let len = self.store.len(&name)?.unwrap_or(0);
            match crate::store::ObjectClass::of(&name) {
                crate::store::ObjectClass::Integrity if !name.contains(&itable_id) => {
                    v.integrity_object_bytes += len
                }
                crate::store::ObjectClass::Data if !name.contains(&itable_id) => {
                    v.data_object_bytes += len
                }
                _ => v.other_metadata_bytes += len,
            }
        }
        v.session = self.metrics.snapshot();
        Ok(v)
    }
}
