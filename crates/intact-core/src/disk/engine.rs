//! The disk engine (docs/design.md, "The block disk"): a fixed-size block device whose
//! blocks are sealed with [`DiskKeys`], authenticated through an [`NaryTree`] whose root
//! the trusted anchor holds, and updated in line (`sync`) or through the PAC queue
//! (`pac`: Burke et al., §5). The engine knows files, not NBD: `crates/intact/src/nbd.rs`
//! is the thin adapter that serves it.
//!
//! Files of a disk at `PATH` (all untrusted; docs/file-format.md §8):
//! * `PATH`: the ciphertext, block `i` at `i × 4096` (sparse: holes cost nothing);
//! * `PATH.meta`: three slots of (counter, tag) per block, 72 bytes at `i × 72`;
//! * `PATH.tree`: the tree's nodes, the children of each node together;
//! * `PATH.sealed`: two slots of the sealed region table (the nodes at the region level
//!   when the anchor was last stored), for recovery after a crash;
//! * `PATH.intent`: one bit per region written since the last flush (synced before the
//!   first such write);
//! * `PATH.intact`: the configuration (JSON), with the password-wrapped master key.
//!
//! Why three slots: a write stores its (counter, tag) in a slot that holds neither the
//! block's current value nor its sealed one (the value the last flush put in the tree), then
//! the ciphertext. A crash between the two leaves the old ciphertext with its own slot
//! intact, and the sealed value stays available to check the region against the sealed
//! table. Recovery (`recover`) then accepts, for each block of a region written since the
//! flush, its newest value that authenticates if that value's counter is at or above the
//! flush's floor (a write of the crashed session, which the flush never promised), else its
//! sealed value, and checks the sealed values against the sealed table: a rollback of a
//! flushed block, or a block from elsewhere, fails. A benign crash is never an alarm.

use super::block::{DiskKeys, Sealed, HOLE_LEAF, SEALED_LEN};
use super::dmt::{Dmt, DmtState, DmtStore};
use super::pac::{PacConfig, PacQueue, PacStats};
use super::tree::{NaryTree, NodeStore, ZERO};
use crate::crypto::{self, label, Hash, KdfParams, MasterKey, SubKey};
use crate::error::{Error, Result, Subject};
use crate::store::{TrustedLock, TrustedStore};
use crate::tree::NodeCache;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Bytes per block.
pub const BLOCK: usize = 4096;
/// Slots of (counter, tag) per block.
pub const SLOTS: usize = 3;
/// Bytes of `PATH.meta` per block.
pub const META_PER_BLOCK: usize = SLOTS * SEALED_LEN;
/// Write counters reserved per anchor store: a session stores its anchor again only after
/// this many writes.
const RESERVATION: u64 = 1 << 20;
/// A region (the unit of the write-intent bitmap and of recovery) spans at least this many
/// blocks (16 MiB), rounded up to a whole subtree.
const REGION_MIN_BLOCKS: u64 = 4096;
/// Lock stripes: requests on blocks of one stripe run one at a time.
const STRIPES: usize = 1024;
/// The configuration's format.
const FORMAT: u32 = 1;
/// The format of a disk whose tree is the DMT (an older intact refuses it).
const FORMAT_DMT: u32 = 2;

/// How writes reach the tree (docs/design.md, "The block disk").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No encryption and no integrity: the baseline of the measurements.
    None,
    /// AES-GCM per block, no tree: no freshness.
    Aead,
    /// Verify and update the tree in line.
    Sync,
    /// Verify in line; updates through the PAC queue; sealed at flush.
    Pac,
    /// The batching baseline (FastVer-style; Burke et al. §4, Table 1): reads return before
    /// they are verified, and every `batch` requests a checkpoint verifies them and applies
    /// the updates. Weaker: a read may return tampered data that is only caught later (its
    /// window of vulnerability is measured: [`DiskStats::window_max_ns`]).
    Batch,
}

impl Mode {
    /// Parses `none`, `aead`, `sync` or `pac`.
    pub fn parse(s: &str) -> Result<Mode> {
        Ok(match s {
            "none" => Mode::None,
            "aead" => Mode::Aead,
            "sync" => Mode::Sync,
            "pac" => Mode::Pac,
            "batch" => Mode::Batch,
            _ => {
                return Err(Error::Invalid(format!(
                    "mode {s:?}: want pac, sync, batch, aead or none"
                )))
            }
        })
    }

    /// The name [`Mode::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Aead => "aead",
            Mode::Sync => "sync",
            Mode::Pac => "pac",
            Mode::Batch => "batch",
        }
    }

    fn encrypted(self) -> bool {
        self != Mode::None
    }

    fn has_tree(self) -> bool {
        matches!(self, Mode::Sync | Mode::Pac | Mode::Batch)
    }

    /// What a disk created in this mode stores: `sync` and `pac` share one layout.
    fn layout(self) -> &'static str {
        match self {
            Mode::None => "plain",
            Mode::Aead => "aead",
            Mode::Sync | Mode::Pac | Mode::Batch => "tree",
        }
    }
}

/// A disk's tree: the n-ary tree of `arity`, or the DMT (binary, splaying inside regions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeKind {
    /// Children per node (2 for the DMT).
    pub arity: u64,
    /// The DMT ([`super::dmt`]).
    pub dmt: bool,
}

impl TreeKind {
    /// The name `parse_tree` reads.
    pub fn name(self) -> String {
        match (self.dmt, self.arity) {
            (true, _) => "dmt".into(),
            (false, 2) => "binary".into(),
            (false, a) => format!("nary:{a}"),
        }
    }
}

/// Parses a tree: `dmt`, `binary` (arity 2) or `nary:N` (N from 2 to 128).
pub fn parse_tree(s: &str) -> Result<TreeKind> {
    let (arity, dmt) = match s {
        "dmt" => (2, true),
        "binary" => (2, false),
        _ => match s.strip_prefix("nary:").map(str::parse::<u64>) {
            Some(Ok(n)) if (2..=128).contains(&n) => (n, false),
            _ => {
                return Err(Error::Invalid(format!(
                    "tree {s:?}: want dmt, binary or nary:N with N from 2 to 128"
                )))
            }
        },
    };
    Ok(TreeKind { arity, dmt })
}

/// `PATH.intact`: what the disk is, with its password-wrapped master key. Every field is
/// authenticated as the key envelope's associated data ([`DiskConfig::aad`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiskConfig {
    /// Format version.
    pub format: u32,
    /// The disk's id, hex.
    pub disk_id: String,
    /// Size in bytes (a multiple of 4096).
    pub size: u64,
    /// Children per tree node.
    pub arity: u64,
    /// The tree is the DMT (format 2; arity 2).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dmt: bool,
    /// The mode it was created for (`sync` and `pac` may be switched when serving).
    pub mode: String,
    /// Argon2id parameters.
    pub kdf: KdfParams,
    /// Argon2 salt, hex.
    pub salt: String,
    /// The master key, wrapped: nonce || ct || tag, hex.
    pub wrapped_key: String,
}

impl DiskConfig {
    /// The bytes bound to the wrapped key.
    pub fn aad(&self) -> Vec<u8> {
        let mut aad = format!(
            "intact-disk|{}|{}|{}|{}|{}|{}|{}|{}|{}",
            self.format,
            self.disk_id,
            self.size,
            self.arity,
            self.mode,
            self.kdf.m_kib,
            self.kdf.t,
            self.kdf.p,
            self.salt
        )
        .into_bytes();
        if self.dmt {
            aad.extend_from_slice(b"|dmt");
        }
        aad
    }

    /// The tree it was created with.
    pub fn tree(&self) -> TreeKind {
        TreeKind {
            arity: self.arity,
            dmt: self.dmt,
        }
    }

    fn id(&self) -> Result<[u8; 16]> {
        let v = hex::decode(&self.disk_id).map_err(|_| Error::Config("bad disk id".into()))?;
        v.try_into()
            .map_err(|_| Error::Config("bad disk id length".into()))
    }
}

/// The bytes of a disk's tree metadata (what a cache "share of the tree" is a share of):
/// the n-ary tree's groups, or, for the DMT, every region's leaf and internal hashes.
pub fn tree_bytes(c: &DiskConfig) -> u64 {
    let leaves = c.size / BLOCK as u64;
    if c.dmt {
        return leaves.next_power_of_two().max(2) * 64;
    }
    let (mut n, mut bytes) = (leaves, 0);
    while n > 1 {
        n = n.div_ceil(c.arity);
        bytes += n * c.arity * 32;
    }
    bytes
}

/// The files of a disk at `path`.
pub fn paths(path: &Path) -> DiskPaths {
    let with = |ext: &str| {
        let mut s = path.as_os_str().to_owned();
        s.push(ext);
        PathBuf::from(s)
    };
    DiskPaths {
        data: path.to_path_buf(),
        meta: with(".meta"),
        tree: with(".tree"),
        sealed: with(".sealed"),
        intent: with(".intent"),
        config: with(".intact"),
    }
}

/// Where each file of a disk lives.
#[derive(Debug, Clone)]
pub struct DiskPaths {
    /// Ciphertext.
    pub data: PathBuf,
    /// Per-block (counter, tag) slots.
    pub meta: PathBuf,
    /// Tree nodes.
    pub tree: PathBuf,
    /// The sealed region table (two slots).
    pub sealed: PathBuf,
    /// The write-intent bitmap.
    pub intent: PathBuf,
    /// The configuration.
    pub config: PathBuf,
}

impl DiskPaths {
    fn all(&self) -> [&PathBuf; 6] {
        [
            &self.data,
            &self.meta,
            &self.tree,
            &self.sealed,
            &self.intent,
            &self.config,
        ]
    }
}

/// The trusted anchor of a disk (docs/file-format.md §8): stored in the state directory
/// through a [`TrustedStore`], MACed under the disk's anchor key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskAnchor {
    /// The disk.
    pub disk_id: [u8; 16],
    /// Advanced by every store.
    pub epoch: u64,
    /// Every write counter issued is below this (the session's reservation).
    pub ctr_next: u64,
    /// Every block in the sealed tree was written under a counter below this, and every
    /// write since under one at or above it.
    pub floor: u64,
    /// The tree's root at the last flush.
    pub root: Hash,
    /// The slot of `PATH.sealed` holding the region table of `root`.
    pub table_slot: u8,
    /// A session has the disk open: if this is set when the disk is opened, it crashed.
    pub open: bool,
}

const ANCHOR_MAGIC: &[u8; 8] = b"INTACTDA";
/// Bytes of an encoded [`DiskAnchor`].
pub const DISK_ANCHOR_LEN: usize = 8 + 16 + 8 * 3 + 32 + 2 + 32;

impl DiskAnchor {
    /// magic ‖ id ‖ epoch ‖ ctr_next ‖ floor ‖ root ‖ table slot ‖ open ‖ MAC.
    pub fn encode(&self, key: &SubKey) -> Vec<u8> {
        let mut b = Vec::with_capacity(DISK_ANCHOR_LEN);
        b.extend_from_slice(ANCHOR_MAGIC);
        b.extend_from_slice(&self.disk_id);
        for v in [self.epoch, self.ctr_next, self.floor] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.root);
        b.push(self.table_slot);
        b.push(u8::from(self.open));
        let mac = key.mac(&[b"intact/disk/anchor\0", &b]);
        b.extend_from_slice(&mac);
        b
    }

    /// Checks the MAC and decodes.
    pub fn decode(b: &[u8], key: &SubKey) -> Result<DiskAnchor> {
        let bad = |w: &str| Error::AnchorCorrupt(format!("disk anchor: {w}"));
        if b.len() != DISK_ANCHOR_LEN || &b[..8] != ANCHOR_MAGIC {
            return Err(bad("not a disk anchor"));
        }
        let (body, mac) = b.split_at(DISK_ANCHOR_LEN - 32);
        if !crypto::ct_eq(&key.mac(&[b"intact/disk/anchor\0", body]), mac) {
            return Err(Error::tampered(
                Subject::Anchor,
                None,
                "the disk anchor's MAC does not match (another disk's, or changed)",
            ));
        }
        let u = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().expect("8"));
        let mut root = [0u8; 32];
        root.copy_from_slice(&body[48..80]);
        if body[80] > 1 || body[81] > 1 {
            return Err(bad("a table slot or open flag out of range"));
        }
        Ok(DiskAnchor {
            disk_id: body[8..24].try_into().expect("16"),
            epoch: u(24),
            ctr_next: u(32),
            floor: u(40),
            root,
            table_slot: body[80],
            open: body[81] != 0,
        })
    }
}

/// Options of [`Disk::create`].
#[derive(Debug, Clone)]
pub struct DiskCreate {
    /// Size in bytes (a multiple of 4096).
    pub size: u64,
    /// The tree.
    pub tree: TreeKind,
    /// Mode.
    pub mode: Mode,
    /// KDF parameters.
    pub kdf: KdfParams,
}

/// Options of [`Disk::open`].
#[derive(Debug, Clone)]
pub struct DiskOptions {
    /// Serve in this mode instead of the created one (`sync` and `pac` only switch).
    pub mode: Option<Mode>,
    /// Bytes of verified tree nodes to cache.
    pub cache_bytes: usize,
    /// The PAC queue.
    pub pac: PacConfig,
    /// Requests per checkpoint in `batch` mode.
    pub batch: usize,
    /// Open read-only (fsck, info): nothing is written, not even after a crash.
    pub read_only: bool,
    /// At a recovery, make a block that authenticates under none of its values (torn by a
    /// power cut, or changed) a hole instead of refusing to open; every such block is
    /// listed ([`Disk::repaired`]). Rollbacks of flushed blocks are refused all the same.
    pub repair_torn: bool,
    /// The DMT: the probability that a write splays (the paper's p; 0.01).
    pub splay: f64,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            mode: None,
            cache_bytes: 16 << 20,
            pac: PacConfig::default(),
            batch: 64,
            read_only: false,
            repair_torn: false,
            splay: 0.01,
        }
    }
}

/// The tree's nodes in `PATH.tree`: the groups of each level one after another (then the
/// DMT's regions). Write-back: a changed node (32 bytes) waits in `dirty` until the next
/// flush, which writes them in runs before it syncs the file (or until there are
/// [`DIRTY_NODES`] of them), so an update costs no system call for what it writes; reads
/// see them. A crash loses them with the rest of what was not flushed, which recovery
/// rebuilds anyway (the written regions from their blocks, the levels above from the
/// sealed table).
struct FileNodes {
    file: File,
    arity: u64,
    /// Byte offset of each level's first group (index = level).
    base: Vec<u64>,
    path: PathBuf,
    /// Offset → node not yet written to the file.
    dirty: std::collections::BTreeMap<u64, Hash>,
}

/// Nodes held back at most before they are written (not synced) anyway: 2 MiB of them.
const DIRTY_NODES: usize = 1 << 16;

impl FileNodes {
    fn new(file: File, tree: &NaryTree, path: PathBuf) -> FileNodes {
        let mut base = vec![0u64; tree.height() as usize + 2];
        let group = tree.arity() * 32;
        for l in 1..=tree.height() {
            base[l as usize + 1] = base[l as usize] + tree.groups_at(l) * group;
        }
        FileNodes {
            file,
            arity: tree.arity(),
            base,
            path,
            dirty: std::collections::BTreeMap::new(),
        }
    }

    /// Where the top tree's nodes end (the DMT's regions start there, on a page).
    fn end(&self) -> u64 {
        self.base
            .last()
            .copied()
            .unwrap_or(0)
            .next_multiple_of(4096)
    }

    fn offset(&self, level: u32, index: u64, child: u64) -> u64 {
        self.base[level as usize] + (index * self.arity + child) * 32
    }

    fn io(&self, e: std::io::Error) -> Error {
        Error::io(self.path.display().to_string(), e)
    }

    /// Reads `buf` at `off`: the file, then the nodes not written yet over it.
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        read_full(&self.file, buf, off).map_err(|e| self.io(e))?;
        let end = off + buf.len() as u64;
        for (&o, h) in self.dirty.range(off.saturating_sub(31)..end) {
            let (from, to) = (o.max(off), (o + 32).min(end));
            if from < to {
                buf[(from - off) as usize..(to - off) as usize]
                    .copy_from_slice(&h[(from - o) as usize..(to - o) as usize]);
            }
        }
        Ok(())
    }

    /// Writes `buf` at `off`: one node (32 bytes on a node's place) waits; anything else
    /// goes to the file at once, over any waiting node it covers.
    fn write(&mut self, off: u64, buf: &[u8]) -> Result<()> {
        if buf.len() == 32 && off.is_multiple_of(32) {
            self.dirty.insert(off, buf.try_into().expect("32 bytes"));
            if self.dirty.len() >= DIRTY_NODES {
                self.write_back()?;
            }
            return Ok(());
        }
        let end = off + buf.len() as u64;
        let covered: Vec<u64> = self
            .dirty
            .range(off.saturating_sub(31)..end)
            .map(|(&o, _)| o)
            .collect();
        if !covered.is_empty() {
            // Partly covered nodes go out first, so the write lands over them.
            self.write_back()?;
        }
        self.file.write_all_at(buf, off).map_err(|e| self.io(e))
    }

    /// Writes every waiting node to the file, adjacent ones in one call (not synced).
    fn write_back(&mut self) -> Result<()> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut run: Vec<u8> = Vec::new();
        let mut start = 0u64;
        for (o, h) in dirty {
            if !run.is_empty() && o != start + run.len() as u64 {
                self.file
                    .write_all_at(&run, start)
                    .map_err(|e| self.io(e))?;
                run.clear();
            }
            if run.is_empty() {
                start = o;
            }
            run.extend_from_slice(&h);
        }
        if !run.is_empty() {
            self.file
                .write_all_at(&run, start)
                .map_err(|e| self.io(e))?;
        }
        Ok(())
    }
}

impl NodeStore for FileNodes {
    fn read_children(&self, level: u32, index: u64, out: &mut [Hash]) -> Result<()> {
        let mut buf = vec![0u8; out.len() * 32];
        self.read(self.offset(level, index, 0), &mut buf)?;
        for (o, c) in out.iter_mut().zip(buf.chunks_exact(32)) {
            o.copy_from_slice(c);
        }
        Ok(())
    }
    fn write_child(&mut self, level: u32, index: u64, child: u64, value: &Hash) -> Result<()> {
        let off = self.offset(level, index, child);
        self.write(off, value)
    }
    fn write_group(&mut self, level: u32, index: u64, children: &[Hash]) -> Result<()> {
        let buf: Vec<u8> = children.iter().flatten().copied().collect();
        let off = self.offset(level, index, 0);
        self.write(off, &buf)
    }
}

impl DmtStore for FileNodes {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.read(off, buf)
    }
    fn write_at(&mut self, off: u64, buf: &[u8]) -> Result<()> {
        self.write(off, buf)
    }
}

/// The blocks of `[off, off + len)`: (block, offset within it, bytes of it, bytes before it).
fn spans(off: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let pos = off + done as u64;
        let (b, within) = (pos / BLOCK as u64, (pos % BLOCK as u64) as usize);
        let n = (BLOCK - within).min(len - done);
        let at = done;
        done += n;
        Some((b, within, n, at))
    })
}

/// Reads `buf.len()` bytes at `off`, zeros past the end of the file.
fn read_full(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The trees behind one trait, as the engine sees them (issue 8): the n-ary trees
/// ([`Nary`]: balanced binary, arity 2 to 128) and the DMT ([`Dmt`], splaying inside each
/// region). Both sit under the same tree over the regions (`top`, the n-ary tree itself
/// for [`Nary`]), whose region-level nodes are the sealed region table.
trait BlockTree: Send + Sync {
    /// Checks `leaf` as block `block`'s leaf under `st.root`.
    fn verify(
        &self,
        top: &NaryTree,
        st: &mut TreeState,
        cache: &NodeCache,
        block: u64,
        leaf: &Hash,
    ) -> Result<()>;
    /// Makes `leaf` block `block`'s leaf (the old path checked first) and returns the root.
    fn update(
        &self,
        top: &NaryTree,
        st: &mut TreeState,
        cache: &NodeCache,
        block: u64,
        leaf: &Hash,
    ) -> Result<Hash>;
    /// After a crash: if region `r` over its `sealed` leaves is `expected` (the sealed
    /// table's entry), rebuilds it over `current` and returns its value; else `None`.
    #[allow(clippy::too_many_arguments)]
    fn rebuild_region(
        &self,
        top: &NaryTree,
        st: &mut TreeState,
        level: u32,
        r: u64,
        sealed: &[Hash],
        current: &[Hash],
        expected: &Hash,
    ) -> Result<Option<Hash>>;
}

/// The n-ary trees: everything is `top`.
struct Nary;

impl BlockTree for Nary {
    fn verify(
        &self,
        top: &NaryTree,
        st: &mut TreeState,
        cache: &NodeCache,
        block: u64,
        leaf: &Hash,
    ) -> Result<()> {
        top.verify(&st.nodes, cache, &st.root, block, leaf)
    }
    fn update(
        &self,
        top: &NaryTree,
        st: &mut TreeState,
        cache: &NodeCache,
        block: u64,
        leaf: &Hash,
    ) -> Result<Hash> {
        top.update(&mut st.nodes, cache, &st.root, block, leaf)
    }
    fn rebuild_region(
        &self,
        top: &NaryTree,
        st: &mut TreeState,
        level: u32,
        r: u64,
        sealed: &[Hash],
        current: &[Hash],
        expected: &Hash,
    ) -> Result<Option<Hash>> {
        if region_root(top, level, r, sealed) != *expected {
            return Ok(None);
        }
        top.build(&mut st.nodes, level, r, current).map(Some)
    }
}

impl BlockTree for Dmt {
    fn verify(
        &self,
        top: &NaryTree,
        st: &mut TreeState,
        cache: &NodeCache,
        block: u64,
        leaf: &Hash,
    ) -> Result<()> {
        let TreeState { root, nodes, dmt } = st;
        Dmt::verify(self, top, nodes, dmt, cache, root, block, leaf)
    }
    fn update(
        &self,
        top: &NaryTree,
        st: &mut TreeState,
        cache: &NodeCache,
        block: u64,
        leaf: &Hash,
    ) -> Result<Hash> {
        let TreeState { root, nodes, dmt } = st;
        Dmt::update(self, top, nodes, dmt, cache, root, block, leaf)
    }
    fn rebuild_region(
        &self,
        _top: &NaryTree,
        st: &mut TreeState,
        _level: u32,
        r: u64,
        sealed: &[Hash],
        current: &[Hash],
        expected: &Hash,
    ) -> Result<Option<Hash>> {
        let TreeState { nodes, dmt, .. } = st;
        self.recover_region(nodes, dmt, r, sealed, current, expected)
    }
}

/// The tree and its root, shared by the request threads and the PAC updater.
struct TreeShared {
    /// The n-ary tree; with the DMT, the binary tree above its regions.
    tree: NaryTree,
    kind: Box<dyn BlockTree>,
    cache: NodeCache,
    state: Mutex<TreeState>,
}

struct TreeState {
    root: Hash,
    nodes: FileNodes,
    /// The DMT's shapes and dice (unused by the n-ary trees).
    dmt: DmtState,
}

use super::guard;

impl TreeShared {
    fn verify(&self, block: u64, leaf: &Hash) -> Result<()> {
        let mut st = guard(&self.state);
        self.kind
            .verify(&self.tree, &mut st, &self.cache, block, leaf)
    }
    fn update(&self, block: u64, leaf: &Hash) -> Result<()> {
        let mut st = guard(&self.state);
        st.root = self
            .kind
            .update(&self.tree, &mut st, &self.cache, block, leaf)?;
        Ok(())
    }
}

/// `batch` mode's state between checkpoints.
#[derive(Default)]
struct Batch {
    /// Leaves written since the last checkpoint.
    pending: std::collections::HashMap<u64, Hash>,
    /// Reads returned unverified: (block, leaf, when returned).
    reads: Vec<(u64, Hash, std::time::Instant)>,
    /// Requests since the last checkpoint.
    ops: usize,
    /// (reads verified late, their total window in ns, the longest).
    window: (u64, u64, u64),
    checkpoints: u64,
}

impl DiskStats {
    fn with_dmt(mut self, d: Option<(u64, u64)>) -> DiskStats {
        if let Some((splays, rotations)) = d {
            self.splays = splays;
            self.rotations = rotations;
        }
        self
    }

    fn with_window(mut self, b: Option<((u64, u64, u64), u64)>) -> DiskStats {
        if let Some(((n, total, max), checkpoints)) = b {
            self.window_reads = n;
            self.window_total_ns = total;
            self.window_max_ns = max;
            self.checkpoints = checkpoints;
        }
        self
    }
}

/// The write counters of the session: `next` up to the reservation's `end`.
struct Counters {
    next: u64,
    end: u64,
}

/// What the engine did, for `intact disk info` and the benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DiskStats {
    /// Blocks read (holes included).
    pub reads: u64,
    /// Blocks written (trims included).
    pub writes: u64,
    /// Flushes that sealed something.
    pub flushes: u64,
    /// Nanoseconds spent in those flushes (with the gate held: writes wait meanwhile).
    pub flush_ns: u64,
    /// Integrity failures reported.
    pub failures: u64,
    /// Blocks a crash recovery accepted from the crashed session's unflushed writes.
    pub recovered: u64,
    /// `batch` mode: reads verified after they returned.
    pub window_reads: u64,
    /// `batch` mode: their total window of vulnerability (returned to verified), ns.
    pub window_total_ns: u64,
    /// `batch` mode: the longest window of vulnerability, ns.
    pub window_max_ns: u64,
    /// `batch` mode: checkpoints run.
    pub checkpoints: u64,
    /// The DMT: writes that splayed.
    pub splays: u64,
    /// The DMT: rotations those splays did.
    pub rotations: u64,
}

/// An open disk. Every method may be called from many threads at once.
pub struct Disk {
    paths: DiskPaths,
    config: DiskConfig,
    mode: Mode,
    blocks: u64,
    keys: DiskKeys,
    anchor_key: SubKey,
    data: File,
    meta: Option<File>,
    sealed_file: Option<File>,
    intent_file: Option<File>,
    tree: Option<Arc<TreeShared>>,
    queue: Option<PacQueue<Hash>>,
    batch: Option<Mutex<Batch>>,
    batch_size: usize,
    region_level: u32,
    region_blocks: u64,
    regions: u64,
    trusted: Box<dyn TrustedStore>,
    _lock: TrustedLock,
    read_only: bool,
    /// Opened read-only after a crash: not recovered, so no block is read.
    unrecovered: bool,
    repair_torn: bool,
    /// Blocks a recovery made holes (`repair_torn`).
    repaired: Mutex<Vec<u64>>,
    /// Writes hold it shared, a flush exclusively: a flush sees no write half done.
    gate: RwLock<()>,
    stripes: Vec<Mutex<()>>,
    counters: Mutex<Counters>,
    /// The last anchor stored.
    anchor: Mutex<DiskAnchor>,
    /// Regions marked in `PATH.intent` (one bit each).
    intent: Mutex<Vec<u8>>,
    dirty: AtomicBool,
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    flush_ns: AtomicU64,
    failures: AtomicU64,
    recovered: AtomicU64,
    closed: AtomicBool,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("path", &self.paths.data)
            .field("mode", &self.mode)
            .field("blocks", &self.blocks)
            .finish_non_exhaustive()
    }
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(path.display().to_string(), e)
}

/// Where the regions are: the level whose nodes are regions, blocks per region, regions.
fn regions_of(tree: &NaryTree) -> (u32, u64, u64) {
    let mut level = 1;
    let mut span = tree.arity();
    while span < REGION_MIN_BLOCKS && level < tree.height() {
        level += 1;
        span *= tree.arity();
    }
    (level, span, tree.leaves().div_ceil(span))
}

impl Disk {
    /// Creates a disk at `path` (none of its files may exist) and its anchor in `trusted`.
    pub fn create(
        path: &Path,
        opts: &DiskCreate,
        password: &[u8],
        trusted: impl FnOnce(&str) -> Result<Box<dyn TrustedStore>>,
    ) -> Result<DiskConfig> {
        if opts.size == 0 || !opts.size.is_multiple_of(BLOCK as u64) {
            return Err(Error::Invalid(format!(
                "size {}: want a positive multiple of 4096 bytes",
                opts.size
            )));
        }
        if opts.size / BLOCK as u64 >= 1 << 40 {
            return Err(Error::Invalid("size: at most 4 PiB".into()));
        }
        if !(2..=128).contains(&opts.tree.arity) || (opts.tree.dmt && opts.tree.arity != 2) {
            return Err(Error::Invalid(format!(
                "arity {}: want 2 to 128 (2 for the DMT)",
                opts.tree.arity
            )));
        }
        opts.kdf.validate()?;
        let p = paths(path);
        for f in p.all() {
            if f.exists() {
                return Err(Error::Invalid(format!(
                    "{} exists: a disk is created only where none of its files are",
                    f.display()
                )));
            }
        }
        let mut id = [0u8; 16];
        crypto::fill_random(&mut id);
        let mut salt = [0u8; 16];
        crypto::fill_random(&mut salt);
        let master = MasterKey::generate();
        let mut config = DiskConfig {
            format: if opts.tree.dmt { FORMAT_DMT } else { FORMAT },
            disk_id: hex::encode(id),
            size: opts.size,
            arity: opts.tree.arity,
            dmt: opts.tree.dmt,
            mode: opts.mode.name().into(),
            kdf: opts.kdf,
            salt: hex::encode(salt),
            wrapped_key: String::new(),
        };
        let kek = crypto::password_key(password, &salt, opts.kdf)?;
        config.wrapped_key = crate::volume::keys::wrap_key(&master, &kek, &config.aad());
        let trusted = trusted(&config.disk_id)?;
        if trusted.load()?.is_some() {
            return Err(Error::Invalid(format!(
                "an anchor for disk {} exists already",
                config.disk_id
            )));
        }
        let data = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p.data)
            .map_err(io_at(&p.data))?;
        data.set_len(opts.size).map_err(io_at(&p.data))?;
        data.sync_all().map_err(io_at(&p.data))?;
        let mut created = vec![p.data.clone()];
        let result = (|| {
            for f in [&p.meta, &p.tree, &p.sealed, &p.intent] {
                let file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(f)
                    .map_err(io_at(f))?;
                created.push(f.clone());
                file.sync_all().map_err(io_at(f))?;
            }
            let anchor_key = master.derive(label::DISK_ANCHOR, &id);
            let anchor = DiskAnchor {
                disk_id: id,
                epoch: 1,
                ctr_next: 1,
                floor: 1,
                root: ZERO,
                table_slot: 0,
                open: false,
            };
            let json = serde_json::to_vec_pretty(&config)
                .map_err(|e| Error::Config(format!("encoding the config: {e}")))?;
            {
                use std::io::Write;
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&p.config)
                    .map_err(io_at(&p.config))?;
                created.push(p.config.clone());
                f.write_all(&json)
                    .and_then(|_| f.sync_all())
                    .map_err(io_at(&p.config))?;
            }
            if let Some(dir) = path.parent() {
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(io_at(dir))?;
            }
            trusted.store(&anchor.encode(&anchor_key))
        })();
        if let Err(e) = result {
            for f in created {
                let _ = std::fs::remove_file(f);
            }
            return Err(e);
        }
        Ok(config)
    }

    /// Reads a disk's configuration.
    pub fn read_config(path: &Path) -> Result<DiskConfig> {
        let p = paths(path);
        let b = std::fs::read(&p.config).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::Config(format!(
                    "{}: no such disk ({} is missing)",
                    path.display(),
                    p.config.display()
                ))
            } else {
                Error::io(p.config.display().to_string(), e)
            }
        })?;
        let c: DiskConfig = serde_json::from_slice(&b)
            .map_err(|e| Error::Config(format!("{}: {e}", p.config.display())))?;
        if c.format != if c.dmt { FORMAT_DMT } else { FORMAT } {
            return Err(Error::Config(format!(
                "{}: format {} (this intact reads {FORMAT}, and {FORMAT_DMT} with the DMT)",
                p.config.display(),
                c.format
            )));
        }
        c.id()?;
        if c.size == 0
            || !c.size.is_multiple_of(BLOCK as u64)
            || !(2..=128).contains(&c.arity)
            || (c.dmt && c.arity != 2)
        {
            return Err(Error::Config(format!(
                "{}: size or arity out of range",
                p.config.display()
            )));
        }
        Mode::parse(&c.mode).map_err(|e| Error::Config(e.to_string()))?;
        Ok(c)
    }

    /// Opens the disk at `path`: checks the password, takes the anchor's lock (exclusive
    /// unless read-only), recovers from a crash of the last session (not read-only: then a
    /// crashed disk is refused with what to do), and reserves write counters.
    pub fn open(
        path: &Path,
        password: &[u8],
        trusted: Box<dyn TrustedStore>,
        opts: &DiskOptions,
    ) -> Result<Disk> {
        let config = Self::read_config(path)?;
        let created = Mode::parse(&config.mode)?;
        let mode = match opts.mode {
            Some(m) if m.layout() != created.layout() => {
                return Err(Error::Invalid(format!(
                    "the disk was created for mode {}; it serves as {} (and pac and sync \
                     switch), not {}",
                    created.name(),
                    created.name(),
                    m.name()
                )))
            }
            Some(m) => m,
            None => created,
        };
        let id = config.id()?;
        let master = crate::volume::keys::unwrap_envelope(
            &config.wrapped_key,
            &config.salt,
            config.kdf,
            &config.aad(),
            password,
        )?;
        let keys = DiskKeys::derive(&master, id);
        let anchor_key = master.derive(label::DISK_ANCHOR, &id);
        let lock = trusted.lock(!opts.read_only)?;
        let anchor = match trusted.load()? {
            Some(b) => DiskAnchor::decode(&b, &anchor_key)?,
            None => {
                return Err(Error::AnchorMissing {
                    volume: config.disk_id.clone(),
                    dir: trusted.location(),
                })
            }
        };
        if anchor.disk_id != id {
            return Err(Error::tampered(
                Subject::Anchor,
                None,
                "the anchor belongs to another disk",
            ));
        }
        let p = paths(path);
        let open_rw = |f: &Path| {
            OpenOptions::new()
                .read(true)
                .write(!opts.read_only)
                .open(f)
                .map_err(io_at(f))
        };
        let data = open_rw(&p.data)?;
        let len = data.metadata().map_err(io_at(&p.data))?.len();
        if len != config.size {
            return Err(Error::tampered(
                Subject::Path(p.data.display().to_string()),
                None,
                format!(
                    "the data file is {len} bytes, the disk {} (truncated or extended)",
                    config.size
                ),
            ));
        }
        let blocks = config.size / BLOCK as u64;
        let (meta, sealed_file, intent_file) = if mode.encrypted() {
            (
                Some(open_rw(&p.meta)?),
                Some(open_rw(&p.sealed)?),
                Some(open_rw(&p.intent)?),
            )
        } else {
            (None, None, None)
        };
        let nary = NaryTree::new(id, blocks, config.arity, keys.node_key().clone())?;
        let (region_level, region_blocks, regions) = regions_of(&nary);
        let tree = if mode.has_tree() {
            let nodes = FileNodes::new(open_rw(&p.tree)?, &nary, p.tree.clone());
            let kind: Box<dyn BlockTree> = if config.dmt {
                Box::new(Dmt::new(
                    id,
                    &nary,
                    region_level,
                    nodes.end(),
                    keys.node_key().clone(),
                    opts.splay,
                )?)
            } else {
                Box::new(Nary)
            };
            // The shapes of as many regions as the cache's bytes would hold (8 bytes a node).
            let shapes = opts.cache_bytes / (region_blocks as usize * 8).max(1);
            Some(Arc::new(TreeShared {
                tree: nary,
                kind,
                cache: NodeCache::new(opts.cache_bytes),
                state: Mutex::new(TreeState {
                    root: anchor.root,
                    nodes,
                    dmt: DmtState::new(shapes.max(4)),
                }),
            }))
        } else {
            None
        };
        let mut intent = vec![0u8; regions.div_ceil(8) as usize];
        if let Some(f) = &intent_file {
            read_full(f, &mut intent, 0).map_err(io_at(&p.intent))?;
        }
        let mut disk = Disk {
            paths: p,
            config,
            mode,
            blocks,
            keys,
            anchor_key,
            data,
            meta,
            sealed_file,
            intent_file,
            tree,
            queue: None,
            batch: (mode == Mode::Batch).then(|| Mutex::new(Batch::default())),
            batch_size: opts.batch.max(1),
            region_level,
            region_blocks,
            regions,
            trusted,
            _lock: lock,
            read_only: opts.read_only,
            unrecovered: false,
            repair_torn: opts.repair_torn,
            repaired: Mutex::new(Vec::new()),
            gate: RwLock::new(()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            counters: Mutex::new(Counters {
                next: anchor.ctr_next,
                end: anchor.ctr_next,
            }),
            anchor: Mutex::new(anchor),
            intent: Mutex::new(intent),
            dirty: AtomicBool::new(false),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            flush_ns: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        };
        if anchor.open && mode.encrypted() {
            if opts.read_only {
                // Looked at (info), not read: blocks of the crashed session's regions do
                // not match the sealed tree until a recovery, which writes.
                disk.unrecovered = true;
            } else {
                disk.recover(&anchor)?;
            }
        }
        if !opts.read_only {
            // The session's anchor: open, with a fresh reservation of counters.
            let mut a = *guard(&disk.anchor);
            a.epoch += 1;
            a.floor = a.ctr_next;
            a.ctr_next += RESERVATION;
            a.open = true;
            disk.store_anchor(a)?;
            *guard(&disk.counters) = Counters {
                next: a.floor,
                end: a.ctr_next,
            };
        }
        if mode == Mode::Pac && !opts.read_only {
            let t = disk.tree.clone().expect("pac has a tree");
            disk.queue = Some(
                PacQueue::start(opts.pac, move |b, leaf: &Hash| t.update(b, leaf))
                    .map_err(|e| Error::io("starting the PAC updater", e))?,
            );
        }
        Ok(disk)
    }

    fn store_anchor(&self, a: DiskAnchor) -> Result<()> {
        let mut cur = guard(&self.anchor);
        self.trusted.store(&a.encode(&self.anchor_key))?;
        *cur = a;
        Ok(())
    }

    /// The disk's size in bytes.
    pub fn size(&self) -> u64 {
        self.config.size
    }

    /// The mode it serves in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Its configuration.
    pub fn config(&self) -> &DiskConfig {
        &self.config
    }

    /// Its files.
    pub fn paths(&self) -> &DiskPaths {
        &self.paths
    }

    /// The last anchor stored.
    pub fn anchor(&self) -> DiskAnchor {
        *guard(&self.anchor)
    }

    /// Whether the last session crashed and this read-only open did not recover it.
    pub fn needs_recovery(&self) -> bool {
        self.unrecovered
    }

    fn recovered_first(&self) -> Result<()> {
        if self.unrecovered {
            return Err(Error::Invalid(format!(
                "{}: the last session did not close (a crash); open it read-write once \
                 (`intact disk serve` or `intact disk fsck`) to recover it before reading",
                self.paths.data.display()
            )));
        }
        Ok(())
    }

    /// Whether opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Blocks per region and regions (the write-intent bitmap's unit).
    pub fn regions(&self) -> (u64, u64) {
        (self.region_blocks, self.regions)
    }

    /// What the engine did.
    pub fn stats(&self) -> DiskStats {
        DiskStats {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            flush_ns: self.flush_ns.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            recovered: self.recovered.load(Ordering::Relaxed),
            window_reads: 0,
            window_total_ns: 0,
            window_max_ns: 0,
            checkpoints: 0,
            splays: 0,
            rotations: 0,
        }
        .with_dmt(self.tree.as_ref().map(|t| {
            let st = guard(&t.state);
            (st.dmt.splays, st.dmt.rotations)
        }))
        .with_window(self.batch.as_ref().map(|b| {
            let b = guard(b);
            (b.window, b.checkpoints)
        }))
    }

    /// The PAC queue's counts (pac mode).
    pub fn pac_stats(&self) -> Option<PacStats> {
        self.queue.as_ref().map(|q| q.stats())
    }

    /// The PAC queue's configuration now (pac mode).
    pub fn pac_config(&self) -> Option<PacConfig> {
        self.queue.as_ref().map(|q| q.config())
    }

    /// Changes the PAC queue's rate, capacity or watermark while serving.
    pub fn configure_pac(&self, config: PacConfig) {
        if let Some(q) = &self.queue {
            q.configure(config);
        }
    }

    fn tampered(&self, block: Option<u64>, what: impl Into<String>) -> Error {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let e = Error::tampered(
            Subject::Path(self.paths.data.display().to_string()),
            block,
            what,
        );
        tracing::error!("{e}");
        e
    }

    /// Counts and logs an integrity failure found below the engine (the tree).
    fn noted(&self, e: Error) -> Error {
        if e.is_tampered() {
            self.failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!("{}: {e}", self.paths.data.display());
        }
        e
    }

    fn stripe(&self, block: u64) -> MutexGuard<'_, ()> {
        guard(&self.stripes[(block % STRIPES as u64) as usize])
    }

    fn check_range(&self, off: u64, len: u64) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.config.size => Ok(()),
            _ => Err(Error::Invalid(format!(
                "bytes {off}+{len} past the disk's end ({})",
                self.config.size
            ))),
        }
    }

    fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::Invalid("the disk is open read-only".into()));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Invalid("the disk is closed".into()));
        }
        Ok(())
    }

    // ---- block slots ----

    fn read_slots(&self, block: u64) -> Result<[Sealed; SLOTS]> {
        let meta = self.meta.as_ref().expect("encrypted mode");
        let mut b = [0u8; META_PER_BLOCK];
        read_full(meta, &mut b, block * META_PER_BLOCK as u64).map_err(io_at(&self.paths.meta))?;
        Ok(decode_slots(&b))
    }

    fn write_slot(&self, block: u64, slot: usize, s: &Sealed) -> Result<()> {
        let meta = self.meta.as_ref().expect("encrypted mode");
        let off = block * META_PER_BLOCK as u64 + (slot * SEALED_LEN) as u64;
        meta.write_all_at(&s.encode(), off)
            .map_err(io_at(&self.paths.meta))
    }

    /// The block's current value: the slot with the highest counter.
    fn current(slots: &[Sealed; SLOTS]) -> (usize, Sealed) {
        let mut best = (0, slots[0]);
        for (i, s) in slots.iter().enumerate().skip(1) {
            if s.seq() > best.1.seq() {
                best = (i, *s);
            }
        }
        best
    }

    /// The slot a new write goes to: neither the current value nor the sealed one (the
    /// newest below the floor), so a crash leaves both.
    fn target(slots: &[Sealed; SLOTS], floor: u64) -> usize {
        let (cur, _) = Self::current(slots);
        let sealed = sealed_slot(slots, floor).map(|(i, _)| i);
        (0..SLOTS)
            .filter(|&i| i != cur && Some(i) != sealed)
            .min_by_key(|&i| slots[i].seq())
            .expect("three slots: one is free")
    }

    // ---- reads ----

    /// Reads `buf.len()` bytes at `off`, every block verified before its bytes are
    /// returned.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(off, buf.len() as u64)?;
        self.recovered_first()?;
        let mut block = vec![0u8; BLOCK];
        for (b, within, n, at) in spans(off, buf.len()) {
            {
                let _s = self.stripe(b);
                self.read_block(b, &mut block)?;
            }
            buf[at..at + n].copy_from_slice(&block[within..within + n]);
        }
        Ok(())
    }

    /// Block `b` into `buf`, verified; the caller holds its stripe.
    fn read_block(&self, b: u64, buf: &mut [u8]) -> Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let off = b * BLOCK as u64;
        if !self.mode.encrypted() {
            return read_full(&self.data, buf, off).map_err(io_at(&self.paths.data));
        }
        let slots = self.read_slots(b)?;
        let (_, cur) = Self::current(&slots);
        if cur.is_trim() && !self.keys.is_authentic_trim(b, &cur) {
            return Err(self.tampered(Some(b), "a trim record does not authenticate"));
        }
        let leaf = self.keys.leaf(b, &cur);
        if let Some(batch) = &self.batch {
            // Verified at the next checkpoint, after the bytes are returned (the baseline's
            // weakness, measured).
            let mut bt = guard(batch);
            match bt.pending.get(&b) {
                Some(l) if *l != leaf => {
                    return Err(self.tampered(
                        Some(b),
                        "the block's metadata is not the one last written (pending update)",
                    ))
                }
                Some(_) => {}
                None => bt.reads.push((b, leaf, std::time::Instant::now())),
            }
            bt.ops += 1;
            if bt.ops >= self.batch_size {
                self.checkpoint(&mut bt)?;
            }
        } else if let Some(t) = &self.tree {
            let pending = self.queue.as_ref().and_then(|q| q.get(b));
            match pending {
                Some(l) if l == leaf => {}
                Some(_) => {
                    return Err(self.tampered(
                        Some(b),
                        "the block's metadata is not the one last written (pending update)",
                    ))
                }
                None => t.verify(b, &leaf).map_err(|e| self.noted(e))?,
            }
        }
        if cur.is_hole() {
            buf.fill(0);
            return Ok(());
        }
        read_full(&self.data, buf, off).map_err(io_at(&self.paths.data))?;
        if self.keys.open(b, &cur, buf).is_err() {
            return Err(self.tampered(Some(b), "the block does not authenticate"));
        }
        Ok(())
    }

    // ---- writes ----

    /// Writes `data` at `off` (a partial block is read, verified and merged first).
    pub fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        self.writable()?;
        self.check_range(off, data.len() as u64)?;
        let _g = self.gate.read().unwrap_or_else(|p| p.into_inner());
        // Stable while the gate is held: a flush changes it only under the gate.
        let floor = guard(&self.anchor).floor;
        let mut block = vec![0u8; BLOCK];
        for (b, within, n, at) in spans(off, data.len()) {
            let _s = self.stripe(b);
            if n < BLOCK {
                self.read_block(b, &mut block)?;
            }
            block[within..within + n].copy_from_slice(&data[at..at + n]);
            self.write_block(b, &mut block, false, floor)?;
        }
        Ok(())
    }

    /// Makes `[off, off + len)` read as zeros: whole blocks become holes (their data punched
    /// out of the file), partial ones are written.
    pub fn trim(&self, off: u64, len: u64) -> Result<()> {
        self.writable()?;
        self.check_range(off, len)?;
        let _g = self.gate.read().unwrap_or_else(|p| p.into_inner());
        let floor = guard(&self.anchor).floor;
        let mut block = vec![0u8; BLOCK];
        // `len` fits: check_range bounds it by the disk's size.
        for (b, within, n, _) in spans(off, len as usize) {
            let _s = self.stripe(b);
            if n < BLOCK {
                self.read_block(b, &mut block)?;
                block[within..within + n].fill(0);
                self.write_block(b, &mut block, false, floor)?;
            } else {
                self.write_block(b, &mut block, true, floor)?;
            }
        }
        Ok(())
    }

    fn next_counter(&self) -> Result<u64> {
        let mut c = guard(&self.counters);
        if c.next >= c.end {
            let mut a = *guard(&self.anchor);
            a.epoch += 1;
            a.ctr_next = c.end + RESERVATION;
            self.store_anchor(a)?;
            c.end = a.ctr_next;
        }
        c.next += 1;
        Ok(c.next - 1)
    }

    /// Marks block `b`'s region in the intent bitmap (synced) before its first write after
    /// a flush.
    fn mark(&self, b: u64) -> Result<()> {
        let r = b / self.region_blocks;
        let (byte, bit) = ((r / 8) as usize, 1u8 << (r % 8));
        let mut m = guard(&self.intent);
        if m[byte] & bit != 0 {
            return Ok(());
        }
        m[byte] |= bit;
        let f = self.intent_file.as_ref().expect("encrypted mode");
        let p = &self.paths.intent;
        f.write_all_at(&m[byte..byte + 1], byte as u64)
            .and_then(|_| f.sync_data())
            .map_err(io_at(p))
    }

    /// Writes block `b` from `buf` (encrypted in place), or a hole with `hole`; the caller
    /// holds the gate (shared), under which `floor` is the anchor's, and the block's stripe.
    fn write_block(&self, b: u64, buf: &mut [u8], hole: bool, floor: u64) -> Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.dirty.store(true, Ordering::Release);
        let off = b * BLOCK as u64;
        if !self.mode.encrypted() {
            if hole {
                buf.fill(0);
            }
            return self
                .data
                .write_all_at(buf, off)
                .map_err(io_at(&self.paths.data));
        }
        self.mark(b)?;
        let slots = self.read_slots(b)?;
        let slot = Self::target(&slots, floor);
        let c = self.next_counter()?;
        let sealed = if hole {
            self.keys.trim(b, c)
        } else {
            self.keys.seal(b, c, buf)
        };
        // The slot first: a crash before the data leaves the old block and its slot.
        self.write_slot(b, slot, &sealed)?;
        if hole {
            punch(&self.data, off, BLOCK as u64).map_err(io_at(&self.paths.data))?;
        } else {
            self.data
                .write_all_at(buf, off)
                .map_err(io_at(&self.paths.data))?;
        }
        let leaf = self.keys.leaf(b, &sealed);
        if let Some(batch) = &self.batch {
            let mut bt = guard(batch);
            bt.pending.insert(b, leaf);
            bt.ops += 1;
            if bt.ops >= self.batch_size {
                self.checkpoint(&mut bt)?;
            }
            return Ok(());
        }
        match (&self.queue, &self.tree) {
            (Some(q), _) => q.push(b, leaf),
            (None, Some(t)) => t.update(b, &leaf)?,
            (None, None) => {}
        }
        Ok(())
    }

    /// `batch` mode's checkpoint: the reads returned since the last one are verified against
    /// the tree (which no write changed meanwhile), then the writes' leaves are applied.
    fn checkpoint(&self, bt: &mut Batch) -> Result<()> {
        let t = self.tree.as_ref().expect("batch has a tree");
        let now = std::time::Instant::now();
        let mut first_err = None;
        for (b, leaf, at) in bt.reads.drain(..) {
            let ns = now.duration_since(at).as_nanos() as u64;
            bt.window.0 += 1;
            bt.window.1 += ns;
            bt.window.2 = bt.window.2.max(ns);
            if let Err(e) = t.verify(b, &leaf) {
                let e = self.noted(e);
                tracing::error!("block {b} was returned before it failed verification");
                first_err.get_or_insert(e);
            }
        }
        let mut pending: Vec<(u64, Hash)> = bt.pending.drain().collect();
        pending.sort_unstable_by_key(|(b, _)| *b);
        for (b, leaf) in pending {
            t.update(b, &leaf)?;
        }
        bt.ops = 0;
        bt.checkpoints += 1;
        first_err.map_or(Ok(()), Err)
    }

    // ---- flush ----

    /// Makes every write that returned before the call durable and, with a tree, sealed:
    /// the PAC queue drained, the files synced, the region table stored, the anchor stored
    /// with the new root and epoch (§5.4; Theorem 2).
    pub fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let t = std::time::Instant::now();
        // Most of the work before the gate, while writes go on: the queue drained of what
        // was queued so far, and the data written so far handed to the disk; the part under
        // the gate then has little left to wait for.
        if self.dirty.load(Ordering::Acquire) {
            if let Some(q) = &self.queue {
                q.flush()?;
            }
            let mut files = vec![(&self.data, &self.paths.data)];
            if let Some(m) = &self.meta {
                files.push((m, &self.paths.meta));
            }
            sync_together(&files)?;
        }
        let _g = self.gate.write().unwrap_or_else(|p| p.into_inner());
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let r = self.flush_locked(true);
        self.flush_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if r.is_err() {
            self.dirty.store(true, Ordering::Release);
        }
        r
    }

    fn flush_locked(&self, open: bool) -> Result<()> {
        let mut a = *guard(&self.anchor);
        a.epoch += 1;
        a.open = open;
        if !self.mode.encrypted() {
            sync_together(&[(&self.data, &self.paths.data)])?;
            return if open { Ok(()) } else { self.store_anchor(a) };
        }
        if let Some(q) = &self.queue {
            q.flush()?;
        }
        if let Some(b) = &self.batch {
            self.checkpoint(&mut guard(b))?;
        }
        let meta = self.meta.as_ref().expect("meta");
        if let Some(t) = &self.tree {
            let mut st = guard(&t.state);
            let table = self.table_from_tree(t, &st)?;
            a.root = st.root;
            a.table_slot = 1 - a.table_slot.min(1);
            let sealed = self.write_table(a.table_slot, &table)?;
            // The nodes that waited in memory, to the file before it is synced.
            st.nodes.write_back()?;
            // The four files' syncs at once: the devices overlap them.
            sync_together(&[
                (&self.data, &self.paths.data),
                (meta, &self.paths.meta),
                (&st.nodes.file, &self.paths.tree),
                (sealed, &self.paths.sealed),
            ])?;
            drop(st);
            a.floor = guard(&self.counters).next;
            self.store_anchor(a)?;
            // Sealed and durable: the DMT's next splays start new shape slots.
            guard(&t.state).dmt.flushed();
        } else {
            sync_together(&[(&self.data, &self.paths.data), (meta, &self.paths.meta)])?;
            if !open {
                // aead: no root to seal; the anchor only records the close.
                self.store_anchor(a)?;
            }
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.clear_intent()
    }

    /// Every write so far is durable (and sealed): the intent bits can go (not synced: a
    /// bit left set only costs a recovery a region's scan).
    fn clear_intent(&self) -> Result<()> {
        let mut m = guard(&self.intent);
        m.fill(0);
        let f = self.intent_file.as_ref().expect("intent");
        f.write_all_at(&m, 0).map_err(io_at(&self.paths.intent))
    }

    /// The nodes at the region level, checked to hash to the root.
    fn table_from_tree(&self, t: &TreeShared, st: &TreeState) -> Result<Vec<Hash>> {
        let table = if self.region_level >= t.tree.height() {
            vec![st.root]
        } else {
            t.tree.nodes_at(&st.nodes, self.region_level)?
        };
        if self.root_of_table(t, &table)? != st.root {
            return Err(self.tampered(
                None,
                "the stored tree's upper nodes do not hash to the root (changed while serving)",
            ));
        }
        Ok(table)
    }

    fn root_of_table(&self, t: &TreeShared, table: &[Hash]) -> Result<Hash> {
        if self.region_level >= t.tree.height() {
            return Ok(table[0]);
        }
        t.tree.root_over(None, self.region_level, table)
    }

    /// Writes the region table into `slot` of `PATH.sealed` (the caller syncs it).
    fn write_table(&self, slot: u8, table: &[Hash]) -> Result<&File> {
        let f = self.sealed_file.as_ref().expect("sealed");
        let buf: Vec<u8> = table.iter().flatten().copied().collect();
        let off = u64::from(slot) * self.regions * 32;
        f.write_all_at(&buf, off)
            .map_err(io_at(&self.paths.sealed))?;
        Ok(f)
    }

    fn read_table(&self, slot: u8) -> Result<Vec<Hash>> {
        let f = self.sealed_file.as_ref().expect("sealed");
        let mut buf = vec![0u8; self.regions as usize * 32];
        read_full(f, &mut buf, u64::from(slot) * self.regions * 32)
            .map_err(io_at(&self.paths.sealed))?;
        Ok(buf
            .chunks_exact(32)
            .map(|c| c.try_into().expect("32"))
            .collect())
    }

    /// Flushes and marks the session closed in the anchor. Further writes fail.
    pub fn close(&self) -> Result<()> {
        if self.read_only || self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let _g = self.gate.write().unwrap_or_else(|p| p.into_inner());
        if self.dirty.swap(false, Ordering::AcqRel) {
            return self.flush_locked(false);
        }
        // Nothing written since the last flush: only the close is recorded.
        let mut a = *guard(&self.anchor);
        a.epoch += 1;
        a.open = false;
        self.store_anchor(a)
    }

    // ---- recovery ----

    /// After a crash (the anchor says a session was open): checks the sealed region table
    /// against the anchor's root, then for every region marked in the intent bitmap takes
    /// each block's newest authentic value written at or above the floor, else its sealed
    /// value, checks the sealed values against the table, rebuilds the region, and seals the
    /// result. Regions not marked were not written since the flush and are checked on
    /// their reads as always.
    fn recover(&self, anchor: &DiskAnchor) -> Result<()> {
        let marked: Vec<u64> = {
            let m = guard(&self.intent);
            (0..self.regions)
                .filter(|r| m[(r / 8) as usize] & (1 << (r % 8)) != 0)
                .collect()
        };
        tracing::info!(
            "{}: the last session did not close; recovering {} region(s) written since its \
             last flush",
            self.paths.data.display(),
            marked.len()
        );
        let floor = anchor.floor;
        let mut table = match &self.tree {
            Some(t) => {
                let table = self.read_table(anchor.table_slot)?;
                if self.root_of_table(t, &table)? != anchor.root {
                    return Err(self.tampered(
                        None,
                        "the sealed region table does not match the anchor's root",
                    ));
                }
                table
            }
            None => Vec::new(),
        };
        let mut buf = vec![0u8; BLOCK];
        for &r in &marked {
            let first = r * self.region_blocks;
            let n = self.region_blocks.min(self.blocks - first);
            let mut raw = vec![0u8; n as usize * META_PER_BLOCK];
            read_full(
                self.meta.as_ref().expect("meta"),
                &mut raw,
                first * META_PER_BLOCK as u64,
            )
            .map_err(io_at(&self.paths.meta))?;
            let mut sealed_leaves = Vec::with_capacity(n as usize);
            let mut current_leaves = Vec::with_capacity(n as usize);
            let mut torn = Vec::new();
            for k in 0..n {
                let b = first + k;
                let at = k as usize * META_PER_BLOCK;
                let slots = decode_slots(&raw[at..at + META_PER_BLOCK]);
                let sealed = sealed_slot(&slots, floor)
                    .filter(|(_, s)| !s.is_trim() || self.keys.is_authentic_trim(b, s));
                sealed_leaves.push(match sealed {
                    Some((_, s)) => self.keys.leaf(b, &s),
                    None => HOLE_LEAF,
                });
                // The newest value written since the flush that authenticates.
                let mut order: Vec<usize> = (0..SLOTS)
                    .filter(|&i| slots[i].seq() >= floor && slots[i].counter != 0)
                    .collect();
                order.sort_by_key(|&i| std::cmp::Reverse(slots[i].seq()));
                // The block's ciphertext, read once and tried under each candidate.
                let mut cipher: Option<Vec<u8>> = None;
                let mut opens = |s: &Sealed| -> Result<bool> {
                    if cipher.is_none() {
                        let mut c = vec![0u8; BLOCK];
                        read_full(&self.data, &mut c, b * BLOCK as u64)
                            .map_err(io_at(&self.paths.data))?;
                        cipher = Some(c);
                    }
                    buf.copy_from_slice(cipher.as_deref().expect("read above"));
                    Ok(self.keys.open(b, s, &mut buf).is_ok())
                };
                let mut chosen = None;
                for i in order {
                    let s = slots[i];
                    let ok = if s.is_trim() {
                        self.keys.is_authentic_trim(b, &s)
                    } else {
                        opens(&s)?
                    };
                    if ok {
                        chosen = Some((i, s));
                        break;
                    }
                }
                let (cur_seq, leaf) = match chosen {
                    Some((_, s)) => {
                        self.recovered.fetch_add(1, Ordering::Relaxed);
                        (s.seq(), self.keys.leaf(b, &s))
                    }
                    None => match sealed {
                        Some((_, s)) if !s.is_hole() => {
                            if opens(&s)? {
                                (s.seq(), self.keys.leaf(b, &s))
                            } else if self.repair_torn {
                                // Made a hole once the region is known to be no rollback.
                                torn.push(b);
                                (u64::MAX, HOLE_LEAF)
                            } else {
                                return Err(self.tampered(
                                    Some(b),
                                    format!(
                                        "after a crash the block authenticates under none of \
                                         its values (changed, or torn by a power failure \
                                         during an unflushed write); `intact disk fsck \
                                         --repair-torn {}` makes such blocks holes (zeros) \
                                         and lists them",
                                        self.paths.data.display()
                                    ),
                                ));
                            }
                        }
                        Some((_, s)) => (s.seq(), HOLE_LEAF),
                        None => (0, HOLE_LEAF),
                    },
                };
                // Slots newer than the value kept are a crash's torn writes: cleared, so
                // that reads find the kept value as the newest.
                for (i, s) in slots.iter().enumerate() {
                    if s.seq() > cur_seq {
                        self.write_slot(b, i, &Sealed::NEVER)?;
                    }
                }
                current_leaves.push(leaf);
            }
            if let Some(t) = &self.tree {
                let mut st = guard(&t.state);
                let expected = table[r as usize];
                let rebuilt = t.kind.rebuild_region(
                    &t.tree,
                    &mut st,
                    self.region_level,
                    r,
                    &sealed_leaves,
                    &current_leaves,
                    &expected,
                )?;
                let Some(rebuilt) = rebuilt else {
                    return Err(self.tampered(
                        Some(first),
                        format!(
                            "blocks {first} to {} do not match what the last flush sealed \
                             (a flushed block was changed or rolled back)",
                            first + n - 1
                        ),
                    ));
                };
                table[r as usize] = rebuilt;
            }
            for &b in &torn {
                for i in 0..SLOTS {
                    self.write_slot(b, i, &Sealed::NEVER)?;
                }
                punch(&self.data, b * BLOCK as u64, BLOCK as u64)
                    .map_err(io_at(&self.paths.data))?;
                tracing::warn!(
                    "{}: block {b} authenticated under none of its values after a crash; \
                     it is now a hole (zeros)",
                    self.paths.data.display()
                );
            }
            guard(&self.repaired).extend_from_slice(&torn);
        }
        let mut a = *anchor;
        a.epoch += 1;
        a.floor = anchor.ctr_next;
        a.open = true;
        if let Some(t) = &self.tree {
            let mut st = guard(&t.state);
            let root = if self.region_level >= t.tree.height() {
                table[0]
            } else {
                t.tree
                    .root_over(Some(&mut st.nodes), self.region_level, &table)?
            };
            st.root = root;
            t.cache.clear();
            st.nodes.write_back()?;
            st.nodes.file.sync_data().map_err(io_at(&self.paths.tree))?;
            a.root = root;
            a.table_slot = 1 - anchor.table_slot.min(1);
            drop(st);
            let f = self.write_table(a.table_slot, &table)?;
            sync_together(&[(f, &self.paths.sealed)])?;
        }
        self.meta
            .as_ref()
            .expect("meta")
            .sync_data()
            .map_err(io_at(&self.paths.meta))?;
        self.store_anchor(a)?;
        self.clear_intent()
    }

    // ---- fsck ----

    /// Verifies every block (read, checked through the tree, decrypted); returns the
    /// failures, at most `max` of them.
    pub fn fsck(&self, max: usize) -> Result<Vec<Error>> {
        self.recovered_first()?;
        let mut bad = Vec::new();
        let mut buf = vec![0u8; BLOCK];
        for b in 0..self.blocks {
            let _s = self.stripe(b);
            match self.read_block(b, &mut buf) {
                Ok(()) => {}
                Err(e) if e.is_tampered() => {
                    bad.push(e);
                    if bad.len() >= max {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(bad)
    }

    /// The blocks a recovery made holes (`repair_torn`).
    pub fn repaired(&self) -> Vec<u64> {
        guard(&self.repaired).clone()
    }

    /// Bytes the disk's files take on the backing file system (allocated).
    pub fn allocated_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.paths
            .all()
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.blocks() * 512)
            .sum()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        // The updater applies what is pending before it stops; the disk is closed (sealed)
        // only by `close`: a drop without it is a crash, as a kill would be.
        self.queue.take();
    }
}

/// fdatasync of every file, on threads of their own so the device overlaps them; the first
/// error.
fn sync_together(files: &[(&File, &PathBuf)]) -> Result<()> {
    if let [(f, p)] = files {
        return f.sync_data().map_err(io_at(p));
    }
    crate::store::on_threads(files, 1, |one| {
        one.iter()
            .try_for_each(|(f, p)| f.sync_data().map_err(io_at(p)))
    })
}

fn decode_slots(b: &[u8]) -> [Sealed; SLOTS] {
    let mut out = [Sealed::NEVER; SLOTS];
    for (i, o) in out.iter_mut().enumerate() {
        *o = Sealed::decode(&b[i * SEALED_LEN..(i + 1) * SEALED_LEN]).expect("24 bytes");
    }
    out
}

/// The sealed value among the slots: the newest written below the floor.
fn sealed_slot(slots: &[Sealed; SLOTS], floor: u64) -> Option<(usize, Sealed)> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.counter != 0 && s.seq() < floor)
        .max_by_key(|(_, s)| s.seq())
        .map(|(i, s)| (i, *s))
}

/// The value of region `r` (node `(level, r)`) over `leaves`, computed in memory.
fn region_root(tree: &NaryTree, level: u32, r: u64, leaves: &[Hash]) -> Hash {
    struct Nowhere;
    impl NodeStore for Nowhere {
        fn read_children(&self, _: u32, _: u64, out: &mut [Hash]) -> Result<()> {
            out.fill(ZERO);
            Ok(())
        }
        fn write_child(&mut self, _: u32, _: u64, _: u64, _: &Hash) -> Result<()> {
            Ok(())
        }
        fn write_group(&mut self, _: u32, _: u64, _: &[Hash]) -> Result<()> {
            Ok(())
        }
    }
    tree.build(&mut Nowhere, level, r, leaves)
        .expect("nothing stored")
}

/// Punches `[off, off + len)` out of `f` (reads as zeros; the space is freed).
fn punch(f: &File, off: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `fallocate` only reads its integer arguments; the descriptor is open for
    // writing for the lifetime of `f`, which the borrow keeps alive during the call.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // A file system without hole punching: zeros do as well.
        return f.write_all_at(&vec![0u8; len as usize], off);
    }
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(counter: u64) -> Sealed {
        Sealed {
            counter,
            tag: [counter as u8; 16],
        }
    }

    #[test]
    fn a_write_never_takes_the_current_or_the_sealed_slot() {
        // Current 9 (slot 1), sealed 5 (slot 0: the newest below the floor 7).
        let slots = [s(5), s(9), s(3)];
        assert_eq!(Disk::current(&slots).0, 1);
        assert_eq!(sealed_slot(&slots, 7).map(|(i, _)| i), Some(0));
        assert_eq!(Disk::target(&slots, 7), 2);
        // Current and sealed the same slot: the older of the two others.
        let slots = [s(4), s(2), s(6)];
        assert_eq!(Disk::target(&slots, 10), 1);
        // Never written: any slot; a trim record counts by its counter.
        assert_eq!(Disk::target(&[Sealed::NEVER; 3], 1), 1);
        let t = Sealed {
            counter: 8 | super::super::block::TRIM_FLAG,
            tag: [0; 16],
        };
        let slots = [s(5), t, s(3)];
        assert_eq!(Disk::current(&slots).0, 1);
        assert_eq!(sealed_slot(&slots, 9).map(|(i, _)| i), Some(1));
        assert_eq!(sealed_slot(&slots, 6).map(|(i, _)| i), Some(0));
        assert_eq!(sealed_slot(&[Sealed::NEVER; 3], 6), None);
        assert_eq!(Disk::target(&slots, 6), 2);
    }

    #[test]
    fn nodes_wait_in_memory_until_written_back_in_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let key = MasterKey::from_bytes([1; 32]).derive(label::DISK_NODE, &[2; 16]);
        let tree = NaryTree::new([2; 16], 64, 4, key).unwrap();
        let mut n = FileNodes::new(file, &tree, path.clone());
        let h = |x: u8| [x; 32];
        n.write_child(1, 0, 1, &h(1)).unwrap();
        n.write_child(1, 0, 2, &h(2)).unwrap();
        n.write_at(4096, &h(3)).unwrap();
        // Read back through the store, nothing in the file yet.
        let mut g = [ZERO; 4];
        n.read_children(1, 0, &mut g).unwrap();
        assert_eq!(g, [ZERO, h(1), h(2), ZERO]);
        let mut part = [0u8; 48];
        n.read_at(32 + 16, &mut part).unwrap();
        assert_eq!((&part[..16], &part[16..]), (&h(1)[..16], &h(2)[..]));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert_eq!(n.dirty.len(), 3);
        // A larger write over a waiting node lands over it.
        n.write_at(32, &[7; 64]).unwrap();
        n.read_children(1, 0, &mut g).unwrap();
        assert_eq!(g, [ZERO, h(7), h(7), ZERO]);
        // Written back: adjacent nodes in one run, the file holds them, nothing waits.
        n.write_child(1, 0, 3, &h(9)).unwrap();
        n.write_back().unwrap();
        assert!(n.dirty.is_empty());
        let f = std::fs::read(&path).unwrap();
        assert_eq!(&f[32..96], &[7; 64]);
        assert_eq!(&f[96..128], &h(9));
        assert_eq!(&f[4096..4128], &h(3));
        // At most DIRTY_NODES wait.
        for i in 0..DIRTY_NODES as u64 + 5 {
            n.write_at(8192 + i * 32, &h(4)).unwrap();
            assert!(n.dirty.len() < DIRTY_NODES);
        }
    }

    #[test]
    fn modes_trees_and_sizes_parse() {
        for m in [Mode::None, Mode::Aead, Mode::Sync, Mode::Pac, Mode::Batch] {
            assert_eq!(Mode::parse(m.name()).unwrap(), m);
        }
        assert!(Mode::parse("dmt").is_err());
        let t = |arity, dmt| TreeKind { arity, dmt };
        assert_eq!(parse_tree("binary").unwrap(), t(2, false));
        assert_eq!(parse_tree("nary:2").unwrap(), t(2, false));
        assert_eq!(parse_tree("nary:128").unwrap(), t(128, false));
        assert_eq!(parse_tree("dmt").unwrap(), t(2, true));
        for name in ["binary", "nary:7", "dmt"] {
            assert_eq!(parse_tree(name).unwrap().name(), name);
        }
        for bad in ["nary:1", "nary:129", "nary:", "DMT", "dmt:2", "nary:x"] {
            assert!(parse_tree(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn regions_are_whole_subtrees_of_at_least_4096_blocks() {
        let t = |leaves, arity| {
            NaryTree::new(
                [1; 16],
                leaves,
                arity,
                MasterKey::from_bytes([1; 32]).derive("x", &[]),
            )
            .unwrap()
        };
        assert_eq!(regions_of(&t(1 << 20, 64)), (2, 4096, 256));
        assert_eq!(regions_of(&t(1 << 20, 2)), (12, 4096, 256));
        assert_eq!(regions_of(&t(100_000, 128)), (2, 16384, 7));
        // A disk smaller than a region: one region, the root's level.
        assert_eq!(regions_of(&t(100, 4)), (4, 256, 1));
    }

    /// Frozen (docs/file-format.md §12): a change to the anchor's layout or MAC changes
    /// these bytes.
    #[test]
    fn frozen_anchor() {
        let key = MasterKey::from_bytes([7; 32]).derive(label::DISK_ANCHOR, &[0xab; 16]);
        let a = DiskAnchor {
            disk_id: [0xab; 16],
            epoch: 3,
            ctr_next: 0x10_0001,
            floor: 0x42,
            root: [0x5c; 32],
            table_slot: 1,
            open: true,
        };
        let b = a.encode(&key);
        assert_eq!(b.len(), DISK_ANCHOR_LEN);
        assert_eq!(DiskAnchor::decode(&b, &key).unwrap(), a);
        assert_eq!(
            hex::encode(&b[82..]),
            FROZEN_MAC,
            "the anchor format changed"
        );
        let mut bad = b.clone();
        bad[30] ^= 1;
        assert!(DiskAnchor::decode(&bad, &key).unwrap_err().is_tampered());
        let other = MasterKey::from_bytes([8; 32]).derive(label::DISK_ANCHOR, &[0xab; 16]);
        assert!(DiskAnchor::decode(&b, &other).is_err());
        assert!(matches!(
            DiskAnchor::decode(&b[..100], &key),
            Err(Error::AnchorCorrupt(_))
        ));
        // Authentic but out of range (a table slot other than 0 and 1): refused.
        let odd = DiskAnchor { table_slot: 2, ..a }.encode(&key);
        assert!(matches!(
            DiskAnchor::decode(&odd, &key),
            Err(Error::AnchorCorrupt(_))
        ));
    }

    const FROZEN_MAC: &str = "63bb282a93af1e2bf3367d3b1ff6abd9a2875981cbf9dade5ab01f5ca5cec59f";
}
