//! Integrity schemes: how one file's blocks are encrypted and authenticated.
//!
//! A scheme sees only a file's trusted state ([`FileState`], held in its inode record) and
//! its objects through the transaction ([`Tx`]); it never touches a path. Operations are
//! the paper's Update / Check / Append / Delete, batched over contiguous blocks:
//! [`Scheme::read_blocks`] (Check), [`Scheme::write_blocks`] (Update and Append) and
//! [`Scheme::resize`] (Delete generalised to truncation, and extension with holes).

use crate::crypto::{FileId, FileKeys, Hash, SubKey, MAX_BLOCKS, NONCE_LEN, TAG_LEN};
use crate::error::{Error, Result, Subject};
use crate::format::{InlineTags, ObjectNames, SchemeId, MAX_INLINE_TAGS};
use crate::metrics::{phase, timed, Account, FileAccount, Metrics, Phase};
use crate::tree::{
    flat_index, stored_node_count, CounterIntervals, MerkleTree, NodeCache, NodeHasher, NodeIo,
    TreeError, TreeState,
};
use crate::tx::Tx;
use std::sync::Arc;

mod mac_tree;
mod none;
pub use mac_tree::{MacTree, MacTreeState, DEFAULT_ARITY_LOG2};
pub use none::NoIntegrity;
mod comp_eint;
mod rand_eint;
mod rtree;

pub use comp_eint::{l_c, CompEint, Compression};
pub use rand_eint::RandEint;
pub use rtree::{leaf_value, RArr, RTreeIndex};

/// Volume-wide context a scheme needs.
pub struct Env<'a> {
    /// Block size in bytes.
    pub bs: usize,
    /// Keyed hashing of Merkle nodes.
    pub hasher: &'a NodeHasher,
    /// Key of the leaf hash h(i || ctr || B_i) (CBC mode).
    pub leaf_key: &'a SubKey,
    /// Verified-node cache.
    pub cache: &'a NodeCache,
    /// New write counters are at least this (the session's reservation floor).
    pub ctr_floor: u64,
    /// And strictly below this.
    pub ctr_limit: u64,
    /// Where measured costs go (time by phase, bytes, blocks; see [`crate::metrics`]).
    pub metrics: &'a Metrics,
    /// The longest object the store holds ([`crate::store::UntrustedStore::max_object_len`]).
    pub max_object: u64,
    /// One-leaf Merkle trees keep their node in the record ([`FileState::inline`]; the
    /// volume's [`crate::format::INLINE_LEAF`] feature).
    pub inline_leaf: bool,
    /// `mac-tree` trees of one leaf counter keep their level 0 in the record
    /// ([`FileState::inline_mac`]; the volume's [`crate::format::INLINE_MAC`] feature).
    pub inline_mac: bool,
    /// `mt-eint` (GCM) trees of 2 to [`crate::format::MAX_INLINE_TAGS`] leaves keep their
    /// leaves in the record ([`FileState::tags`]; the volume's [`crate::format::INLINE_TREE`]
    /// feature).
    pub inline_tree: bool,
    /// `mt-eint` blocks of odd counter live in the twin object, and an overwrite may go
    /// directly into the slot the durable state does not use (the volume's
    /// [`crate::format::TWIN_BLOCKS`] feature; [`MtEint::write_blocks`]).
    pub twins: bool,
}

/// A file's state while open: identity, keys, and the trusted state TS_F in usable form.
pub struct FileState {
    /// For error messages.
    pub subject: Subject,
    /// The file id.
    pub id: FileId,
    /// Object names.
    pub names: ObjectNames,
    /// Derived keys.
    /// Derived keys (shared with a write sealed without the engine lock, [`SealPlan`]).
    pub keys: Arc<FileKeys>,
    /// Leaf count and root (for `aead`: block count; root unused).
    pub tree: TreeState,
    /// Write counters (paper §4, as intervals).
    pub ctrs: CounterIntervals,
    /// Highest counter of any deleted block.
    pub ctr_hw: u64,
    /// RAND-EINT / COMP-EINT: the in-memory index of RTree's leaves (RArr and its sorted
    /// copy); `None` for schemes whose tree covers every block.
    pub rtree: Option<RTreeIndex>,
    /// MT-EINT on a volume with inline leaves: the tree's node 0 (its only node when it has
    /// one leaf), kept in the record instead of the `.m` object. `Some` exactly when the
    /// tree has one leaf (between operations); `None` for other schemes.
    pub inline: Option<Hash>,
    /// `mac-tree` on a volume with inline `mac-tree` leaves: level 0's bytes (`N_0`, node
    /// 0's tag, `T_0`) while the tree has exactly one leaf counter, kept in the record
    /// instead of the `.m` object (docs/file-format.md §7.6); `None` otherwise.
    pub inline_mac: Option<[u8; crate::format::MAC_INLINE_LEN]>,
    /// MT-EINT (GCM) on a volume with inline trees: the leaves of a tree of 2 to
    /// [`crate::format::MAX_INLINE_TAGS`] leaves, kept in the record instead of `.m` while
    /// the counters leave room ([`InlineTags::fit`]); `None` otherwise.
    pub tags: Option<InlineTags>,
}

impl FileState {
    /// Number of blocks the scheme holds. Under RAND-EINT / COMP-EINT the tree covers only
    /// some blocks; the file's block count is then the trusted counter intervals'.
    pub fn blocks(&self) -> u64 {
        match self.rtree {
            Some(_) => self.ctrs.blocks(),
            None => self.tree.leaves,
        }
    }

    fn tampered(&self, block: u64, what: impl Into<String>) -> Error {
        Error::tampered(self.subject.clone(), Some(block), what)
    }

    fn tampered_file(&self, what: impl Into<String>) -> Error {
        Error::tampered(self.subject.clone(), None, what)
    }
}

/// The operations every scheme provides.
pub trait Scheme: Sync {
    /// Check (batched): decrypts and verifies blocks `[first, first + out.len()/bs)`, all
    /// below `f.blocks()`, into `out`. Holes read as zeros.
    ///
    /// `f` is only read, so reads of one file may run at once (docs/design.md, "Reads
    /// without the engine lock"); what a scheme caches in the state for reads is loaded by
    /// [`Scheme::prepare_read`] beforehand (without it a read still works, just slower).
    fn read_blocks(
        &self,
        env: &Env,
        f: &FileState,
        tx: &mut Tx,
        first: u64,
        out: &mut [u8],
    ) -> Result<()>;
    /// Loads what [`Scheme::read_blocks`] reads faster with (RTree's index of leaves).
    fn prepare_read(&self, _env: &Env, _f: &mut FileState, _tx: &mut Tx) -> Result<()> {
        Ok(())
    }
    /// Whether [`Scheme::prepare_read`] has nothing to load.
    fn read_ready(&self, _f: &FileState) -> bool {
        true
    }
    /// Update and Append (batched): writes full plaintext blocks starting at `first`
    /// (`first <= f.blocks()`), growing the file when the run passes its end. `data` may be
    /// encrypted in place: its contents are unspecified afterwards.
    fn write_blocks(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        data: &mut [u8],
    ) -> Result<()>;
    /// Several runs of full blocks, each written as [`Scheme::write_blocks`] writes it (in
    /// order of block, disjoint, each inside the file: `first + blocks <= f.blocks()`). A
    /// scheme may share work between them: MT-EINT updates its tree once for all of them.
    /// Each run's buffer is dropped once it is written (what a run leaves in the
    /// transaction is then its only copy).
    fn write_runs(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        runs: Vec<(u64, Vec<u8>)>,
    ) -> Result<()> {
        runs_one_by_one(self, env, f, tx, runs)
    }
    /// Delete (generalised): truncates to `blocks`, or extends with holes.
    fn resize(&self, env: &Env, f: &mut FileState, tx: &mut Tx, blocks: u64) -> Result<()>;
    /// Makes stored blocks `[first, first + count)` holes (fallocate's PUNCH_HOLE), where
    /// the scheme can store a hole inside a file; returns false (and changes nothing) where
    /// it cannot, and the caller writes zeros instead.
    fn punch(
        &self,
        _env: &Env,
        _f: &mut FileState,
        _tx: &mut Tx,
        _first: u64,
        _count: u64,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Update split in three, so that a write's encryption runs without the engine lock
    /// (docs/design.md, "Writes sealed without the engine lock"). First, with the file's
    /// state at hand: what a run of `count` full blocks at `first` will be written under.
    /// `None` where the scheme does all of its work in [`Scheme::write_blocks`].
    fn seal_plan(
        &self,
        _env: &Env,
        _f: &FileState,
        _first: u64,
        _count: u64,
    ) -> Result<Option<SealPlan>> {
        Ok(None)
    }
    /// Second, holding no lock: encrypts the run in place under `plan` and returns its
    /// leaves. Reads no file state.
    fn seal_run(&self, _env: &Env, _plan: &SealPlan, _data: &mut [u8]) -> Vec<Hash> {
        Vec::new()
    }
    /// Third, with the file's state at hand again: stores a run sealed by
    /// [`Scheme::seal_run`] (`data` its ciphertext, `leaves` what it returned) as
    /// [`Scheme::write_blocks`] would have. `Ok(false)`, changing nothing, when the plan no
    /// longer holds for the file as it is now (another file, or a counter that is not fresh
    /// for these blocks any more: they were written, cut or punched since, or the session's
    /// counters were reserved anew); the caller then writes the plaintext.
    fn write_sealed(
        &self,
        _env: &Env,
        _f: &mut FileState,
        _tx: &mut Tx,
        _plan: &SealPlan,
        _data: &[u8],
        _leaves: &[Hash],
    ) -> Result<bool> {
        Ok(false)
    }
    /// The initial tree state of an empty file.
    fn empty(&self, env: &Env, id: &FileId) -> TreeState;
    /// The length of the data object of a file of `blocks` blocks: the longest object the
    /// scheme stores for it (tree nodes and counters take less than a block per block).
    fn data_len(&self, bs: usize, blocks: u64) -> u64 {
        blocks.saturating_mul(bs as u64)
    }
}

/// What a run of full blocks is written under, chosen with the file's state at hand and
/// used without it ([`Scheme::seal_plan`]).
pub struct SealPlan {
    /// The file's keys.
    pub keys: Arc<FileKeys>,
    /// The file's id (a plan applies to this file only).
    pub id: FileId,
    /// The run's first block.
    pub first: u64,
    /// Its write counter.
    pub ctr: u64,
}

/// The implementation of a scheme id, wrapped so that every call is measured (blocks,
/// bytes and time per file and per volume; see [`crate::metrics`]).
pub fn scheme(id: SchemeId) -> &'static dyn Scheme {
    match id {
        SchemeId::Aead => &Metered(Aead),
        SchemeId::MtEintGcm => &Metered(MtEint { cbc: false }),
        SchemeId::MtEintCbc => &Metered(MtEint { cbc: true }),
        SchemeId::None => &Metered(NoIntegrity),
        SchemeId::MacTree => &Metered(MacTree),
        SchemeId::RandEint => &Metered(RandEint),
        SchemeId::CompEint => &Metered(CompEint {
            codec: Compression::Deflate,
        }),
        SchemeId::CompEintZstd => &Metered(CompEint {
            codec: Compression::Zstd,
        }),
    }
}

/// Measures a scheme: counts the blocks of each call (Check / Update) and accounts the
/// call's time and bytes to the volume's [`Metrics`] and to the file.
struct Metered<S>(S);

impl<S: Scheme> Scheme for Metered<S> {
    fn read_blocks(
        &self,
        env: &Env,
        f: &FileState,
        tx: &mut Tx,
        first: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let _a = Account::new(env.metrics);
        let _f = FileAccount::new(env.metrics, f.id, (out.len() / env.bs) as u64, 0);
        self.0.read_blocks(env, f, tx, first, out)
    }
    fn prepare_read(&self, env: &Env, f: &mut FileState, tx: &mut Tx) -> Result<()> {
        // What it reads is the reads' integrity traffic (it was part of the first Check).
        let _a = Account::new(env.metrics);
        let _f = FileAccount::new(env.metrics, f.id, 0, 0);
        self.0.prepare_read(env, f, tx)
    }
    fn read_ready(&self, f: &FileState) -> bool {
        self.0.read_ready(f)
    }
    fn write_blocks(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        data: &mut [u8],
    ) -> Result<()> {
        let _a = Account::new(env.metrics);
        let _f = FileAccount::new(env.metrics, f.id, 0, (data.len() / env.bs) as u64);
        self.0.write_blocks(env, f, tx, first, data)
    }
    fn write_runs(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        runs: Vec<(u64, Vec<u8>)>,
    ) -> Result<()> {
        let _a = Account::new(env.metrics);
        let blocks = runs.iter().map(|r| (r.1.len() / env.bs) as u64).sum();
        let _f = FileAccount::new(env.metrics, f.id, 0, blocks);
        self.0.write_runs(env, f, tx, runs)
    }
    fn resize(&self, env: &Env, f: &mut FileState, tx: &mut Tx, blocks: u64) -> Result<()> {
        let _a = Account::new(env.metrics);
        let _f = FileAccount::new(env.metrics, f.id, 0, 0);
        self.0.resize(env, f, tx, blocks)
    }
    fn punch(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        count: u64,
    ) -> Result<bool> {
        let _a = Account::new(env.metrics);
        let _f = FileAccount::new(env.metrics, f.id, 0, 0);
        self.0.punch(env, f, tx, first, count)
    }
    fn seal_plan(
        &self,
        env: &Env,
        f: &FileState,
        first: u64,
        count: u64,
    ) -> Result<Option<SealPlan>> {
        self.0.seal_plan(env, f, first, count)
    }
    fn seal_run(&self, env: &Env, plan: &SealPlan, data: &mut [u8]) -> Vec<Hash> {
        // The encryption's time and the file's share of it; the blocks count when stored.
        let _a = Account::new(env.metrics);
        let _f = FileAccount::new(env.metrics, plan.id, 0, 0);
        self.0.seal_run(env, plan, data)
    }
    fn write_sealed(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        plan: &SealPlan,
        data: &[u8],
        leaves: &[Hash],
    ) -> Result<bool> {
        let _a = Account::new(env.metrics);
        let _f = FileAccount::new(env.metrics, f.id, 0, (data.len() / env.bs) as u64);
        self.0.write_sealed(env, f, tx, plan, data, leaves)
    }
    fn empty(&self, env: &Env, id: &FileId) -> TreeState {
        self.0.empty(env, id)
    }
    fn data_len(&self, bs: usize, blocks: u64) -> u64 {
        self.0.data_len(bs, blocks)
    }
}

/// The precondition of [`Scheme::write_blocks`]: the run starts at or before the file's end
/// and stays within [`MAX_BLOCKS`]. Returns the file's block count and the run's length.
fn check_write(f: &FileState, bs: usize, first: u64, len: usize) -> Result<(u64, u64)> {
    let (n, count) = (f.blocks(), (len / bs) as u64);
    if first > n {
        return Err(Error::Invalid(format!(
            "write at block {first} past the end ({n}); resize first"
        )));
    }
    check_limit(first + count)?;
    Ok((n, count))
}

fn check_limit(blocks: u64) -> Result<()> {
    if blocks > MAX_BLOCKS {
        return Err(Error::fs("", crate::FsErrorKind::TooLarge));
    }
    Ok(())
}

/// Associated data of block `index` of file `id`: `label || file id || index (u64 LE)`.
fn block_aad(label: &[u8; 8], id: &FileId, index: u64) -> [u8; 32] {
    let mut a = [0u8; 32];
    a[..8].copy_from_slice(label);
    a[8..24].copy_from_slice(id);
    a[24..].copy_from_slice(&index.to_le_bytes());
    a
}

// ---------------------------------------------------------------------------------------
// aead

/// AES-256-GCM per block with a random nonce stored beside it (`nonce || ct || tag`) and
/// the block index and file id as associated data: blocks cannot be altered, moved within
/// or between files, but an old version of a block (or a whole file) can be replayed
/// undetected — authenticity without freshness, what gocryptfs offers. Gaps are written as
/// encrypted zeros (an all-zero stored block is never taken for a hole).
pub struct Aead;

const AEAD_LABEL: &[u8; 8] = b"intactA1";

/// The largest gap (in blocks) `aead` fills with encrypted zeros when a file is extended.
pub const AEAD_MAX_GAP: u64 = 1 << 20;

impl Aead {
    fn stride(bs: usize) -> usize {
        NONCE_LEN + bs + TAG_LEN
    }

    fn seal_blocks(env: &Env, f: &FileState, first: u64, data: &[u8]) -> Vec<u8> {
        let bs = env.bs;
        let stride = Self::stride(bs);
        let count = data.len() / bs;
        let mut out = vec![0u8; count * stride];
        for k in 0..count {
            let rec = &mut out[k * stride..(k + 1) * stride];
            let mut nonce = [0u8; NONCE_LEN];
            crate::crypto::fill_random(&mut nonce);
            rec[..NONCE_LEN].copy_from_slice(&nonce);
            rec[NONCE_LEN..NONCE_LEN + bs].copy_from_slice(&data[k * bs..(k + 1) * bs]);
            let aad = block_aad(AEAD_LABEL, &f.id, first + k as u64);
            let tag = timed(Phase::Encrypt, || {
                f.keys
                    .gcm()
                    .seal(nonce, &aad, &mut rec[NONCE_LEN..NONCE_LEN + bs])
            });
            rec[NONCE_LEN + bs..].copy_from_slice(&tag);
        }
        out
    }
}

impl Scheme for Aead {
    fn data_len(&self, bs: usize, blocks: u64) -> u64 {
        blocks.saturating_mul(Self::stride(bs) as u64)
    }
    fn read_blocks(
        &self,
        env: &Env,
        f: &FileState,
        tx: &mut Tx,
        first: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let bs = env.bs;
        let stride = Self::stride(bs);
        let count = out.len() / bs;
        let mut raw = vec![0u8; count * stride];
        tx.read_at(&f.names.data, first * stride as u64, &mut raw)?;
        for k in 0..count {
            let rec = &raw[k * stride..(k + 1) * stride];
            let nonce: [u8; NONCE_LEN] = rec[..NONCE_LEN].try_into().expect("12 bytes");
            let aad = block_aad(AEAD_LABEL, &f.id, first + k as u64);
            let blk = &mut out[k * bs..(k + 1) * bs];
            blk.copy_from_slice(&rec[NONCE_LEN..NONCE_LEN + bs]);
            timed(Phase::Encrypt, || {
                f.keys.gcm().open(nonce, &aad, &rec[NONCE_LEN + bs..], blk)
            })
            .map_err(|_| f.tampered(first + k as u64, "AES-GCM authentication failed"))?;
        }
        Ok(())
    }

    fn write_blocks(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        data: &mut [u8],
    ) -> Result<()> {
        let (_, count) = check_write(f, env.bs, first, data.len())?;
        let sealed = Self::seal_blocks(env, f, first, data);
        tx.write_at(&f.names.data, first * Self::stride(env.bs) as u64, &sealed)?;
        f.tree.leaves = f.tree.leaves.max(first + count);
        Ok(())
    }

    /// Truncates, or extends with encrypted zero blocks. An extension by more than
    /// [`AEAD_MAX_GAP`] blocks is refused (`TooLarge`): without a freshness structure an
    /// all-zero stored block cannot be trusted to be a hole (the adversary could zero any
    /// block), so every gap block is written, and a huge gap would take O(gap) time and
    /// space. Sparse files need a freshness scheme (`mt-eint`), whose trusted write counters
    /// say which blocks are holes.
    fn resize(&self, env: &Env, f: &mut FileState, tx: &mut Tx, blocks: u64) -> Result<()> {
        check_limit(blocks)?;
        let stride = Self::stride(env.bs) as u64;
        if blocks > f.tree.leaves && blocks - f.tree.leaves > AEAD_MAX_GAP {
            return Err(Error::fs("", crate::FsErrorKind::TooLarge));
        }
        if blocks < f.tree.leaves {
            tx.set_len(&f.names.data, blocks * stride)?;
            f.tree.leaves = blocks;
        } else {
            const CHUNK: u64 = 256;
            let mut zeros = vec![0u8; CHUNK as usize * env.bs];
            while f.tree.leaves < blocks {
                let n = (blocks - f.tree.leaves).min(CHUNK);
                let first = f.tree.leaves;
                zeros.fill(0);
                self.write_blocks(env, f, tx, first, &mut zeros[..n as usize * env.bs])?;
            }
        }
        Ok(())
    }

    fn empty(&self, _env: &Env, _id: &FileId) -> TreeState {
        TreeState {
            leaves: 0,
            root: [0; 32],
        }
    }
}

// ---------------------------------------------------------------------------------------
// mt-eint

/// [`Scheme::write_runs`] without sharing: each run through [`Scheme::write_blocks`], its
/// buffer dropped once written.
fn runs_one_by_one<S: Scheme + ?Sized>(
    sch: &S,
    env: &Env,
    f: &mut FileState,
    tx: &mut Tx,
    runs: Vec<(u64, Vec<u8>)>,
) -> Result<()> {
    for (first, mut data) in runs {
        sch.write_blocks(env, f, tx, first, &mut data)?;
    }
    Ok(())
}

/// MT-EINT (Oprea–Reiter §5.1, Fig. 7): blocks encrypted length-preservingly under a write
/// counter and authenticated by a Merkle tree (§3.1, Fig. 1–2) whose root is in TS_F.
///
/// - GCM mode (`mt-eint`, as PAC does): nonce = (i, ctr), the 16-byte tag is the leaf;
///   the data object holds exactly the ciphertext.
/// - CBC mode (`mt-eint-cbc`, the paper's Fig. 3): IV = PRF_k1(i || ctr), leaf = keyed
///   h(i || ctr || B_i), so no plaintext-derived value is stored unkeyed.
///
/// A hole (counter 0, never written since it came into existence) has the all-zero leaf
/// and reads as zeros; the counter, being trusted, decides what is a hole, never the
/// stored bytes.
pub struct MtEint {
    cbc: bool,
}

const MT_LABEL: &[u8; 8] = b"intactM1";
const ZERO_LEAF: Hash = [0u8; 32];

/// The most nodes a tree kept in the record has ([`Nodes::mem`]): that of
/// [`MAX_INLINE_TAGS`] leaves.
const MEM_NODES: u64 = 2 * MAX_INLINE_TAGS as u64 - 1;

/// A tree's stored nodes: the object `name`, except node 0 while `inline` is `Some` (it is
/// then that value, kept in the record, and the object's first 32 bytes are unused), and
/// every node while `mem` is `Some`.
struct Nodes<'a> {
    tx: &'a mut Tx,
    name: &'a str,
    inline: Option<Hash>,
    /// On a volume with inline trees, for a tree kept in the record (none, one node, or
    /// [`FileState::tags`]): its nodes as `.m` would hold them (docs/file-format.md §8.2),
    /// computed from the record's leaves. An operation that makes the tree larger than
    /// [`MEM_NODES`] moves them to the object first ([`Nodes::spill`]) and goes on there;
    /// [`MtEint::settle`] decides where the tree it leaves is kept.
    mem: Option<Vec<Hash>>,
    /// For a read only ([`Nodes::windowed`]): the object's nodes are read [`WINDOW`] at a
    /// time, aligned, and the last run read serves the reads that fall in it. In the
    /// in-order layout (docs/file-format.md §8.2) an aligned run of 128 nodes is a subtree
    /// of 64 leaves, so a block's leaf and its path's siblings up to six levels come in one
    /// read of the store, not one each. The nodes are as untrusted as any read one: the
    /// tree checks them against the trusted root. `None` until the first read; writes
    /// drop it.
    window: Option<(u64, Box<[Hash]>)>,
    windowed: bool,
}

/// Nodes a windowed read fetches at once: 4 KiB, a subtree of 64 leaves.
const WINDOW: u64 = 128;

impl<'a> Nodes<'a> {
    fn new(tx: &'a mut Tx, name: &'a str) -> Self {
        Nodes {
            tx,
            name,
            inline: None,
            mem: None,
            window: None,
            windowed: false,
        }
    }
    /// For reading the tree as it is.
    fn of(env: &Env, tx: &'a mut Tx, f: &'a FileState) -> Self {
        Nodes {
            tx,
            name: &f.names.meta,
            inline: f.inline,
            mem: f.tags.map(|t| flat_nodes(env, &f.id, &t.leaves())),
            window: None,
            windowed: false,
        }
    }
    /// Reads the object a window at a time (see [`Nodes::window`]): for a read of blocks,
    /// which writes nothing while it lasts.
    fn windowed(mut self) -> Self {
        self.windowed = true;
        self
    }
    /// Serves `out` from the window holding `first`, reading that window first if it is
    /// not the one kept. `false`: the range does not fit in one window.
    fn read_windowed(&mut self, first: u64, out: &mut [Hash]) -> std::io::Result<bool> {
        let base = first & !(WINDOW - 1);
        if !self.windowed || first.saturating_add(out.len() as u64) > base + WINDOW {
            return Ok(false);
        }
        if self.window.as_ref().map(|w| w.0) != Some(base) {
            let mut w = vec![ZERO_LEAF; WINDOW as usize].into_boxed_slice();
            self.tx
                .read_at(self.name, base * 32, w.as_flattened_mut())
                .map_err(std::io::Error::other)?;
            self.window = Some((base, w));
        }
        let (_, w) = self.window.as_ref().expect("just read");
        let at = (first - base) as usize;
        out.copy_from_slice(&w[at..at + out.len()]);
        Ok(true)
    }
    /// For an operation that changes the tree: an empty tree on a volume with inline leaves
    /// starts with node 0 inline (so a file's first block never creates a `.m` object); on
    /// a volume with inline trees, a tree kept in the record starts in memory.
    fn entering(env: &Env, tx: &'a mut Tx, f: &'a FileState) -> Self {
        let mut io = Self::of(env, tx, f);
        if env.inline_tree && io.mem.is_none() && (f.tree.leaves == 0 || f.inline.is_some()) {
            io.mem = Some(io.inline.take().into_iter().collect());
        } else if env.inline_leaf && f.tree.leaves == 0 {
            io.inline = Some(ZERO_LEAF);
        }
        io
    }
    /// Moves a tree held in memory to the object (which holds none of it: a tree kept in
    /// the record has no bytes in `.m`), for an operation that makes it larger than the
    /// record keeps.
    fn spill(&mut self) -> std::io::Result<()> {
        let io = std::io::Error::other;
        if let Some(nodes) = self.mem.take() {
            if self.tx.len(self.name).map_err(io)?.is_some_and(|l| l > 0) {
                self.tx.set_len(self.name, 0).map_err(io)?;
            }
            if !nodes.is_empty() {
                self.tx
                    .write_at(self.name, 0, nodes.as_flattened())
                    .map_err(io)?;
            }
        }
        Ok(())
    }
}

/// The nodes a `.m` object holds for a tree with these leaves (docs/file-format.md §8.2):
/// the leaves at even positions, every complete internal node (§8.3, with the zero rule),
/// zeros elsewhere.
fn flat_nodes(env: &Env, id: &FileId, leaves: &[Hash]) -> Vec<Hash> {
    let n = leaves.len() as u64;
    let mut out = vec![ZERO_LEAF; stored_node_count(n) as usize];
    for (i, leaf) in leaves.iter().enumerate() {
        out[2 * i] = *leaf;
    }
    let mut h = 1;
    while 1u64 << h <= n {
        let mut s = 0;
        while s + (1 << h) <= n {
            let half = 1u64 << (h - 1);
            let l = out[flat_index(h - 1, s >> (h - 1)) as usize];
            let r = out[flat_index(h - 1, (s + half) >> (h - 1)) as usize];
            let at = flat_index(h, s >> h);
            out[at as usize] = env.hasher.node(id, at, &l, &r);
            s += 1 << h;
        }
        h += 1;
    }
    out
}

impl NodeIo for Nodes<'_> {
    fn read_nodes(&mut self, mut first: u64, mut out: &mut [Hash]) -> std::io::Result<()> {
        if let Some(nodes) = &self.mem {
            for (j, o) in out.iter_mut().enumerate() {
                *o = usize::try_from(first + j as u64)
                    .ok()
                    .and_then(|i| nodes.get(i))
                    .copied()
                    .unwrap_or(ZERO_LEAF);
            }
            return Ok(());
        }
        if let (Some(node), 0, [o, ..]) = (self.inline, first, &mut *out) {
            *o = node;
            out = &mut out[1..];
            first = 1;
        }
        if out.is_empty() || self.read_windowed(first, out)? {
            return Ok(());
        }
        self.tx
            .read_at(self.name, first * 32, out.as_flattened_mut())
            .map(|_| ())
            .map_err(std::io::Error::other)
    }
    fn write_nodes(&mut self, mut first: u64, mut nodes: &[Hash]) -> std::io::Result<()> {
        self.window = None;
        if self.mem.is_some() && first.saturating_add(nodes.len() as u64) > MEM_NODES {
            self.spill()?;
        }
        if let Some(mem) = &mut self.mem {
            let (at, end) = (first as usize, first as usize + nodes.len());
            if mem.len() < end {
                mem.resize(end, ZERO_LEAF);
            }
            mem[at..end].copy_from_slice(nodes);
            return Ok(());
        }
        if let (Some(node), 0, [n, ..]) = (&mut self.inline, first, nodes) {
            *node = *n;
            nodes = &nodes[1..];
            first = 1;
        }
        if nodes.is_empty() {
            return Ok(());
        }
        self.tx
            .write_at(self.name, first * 32, nodes.as_flattened())
            .map_err(std::io::Error::other)
    }
    fn write_scattered(&mut self, nodes: &[(u64, Hash)]) -> std::io::Result<()> {
        // Kept in memory, or node 0 in the record: node by node, as `write_nodes` places them.
        if self.mem.is_some() || (self.inline.is_some() && nodes.iter().any(|n| n.0 == 0)) {
            for (flat, v) in nodes {
                self.write_nodes(*flat, std::slice::from_ref(v))?;
            }
            return Ok(());
        }
        self.window = None;
        let list: Vec<(u64, &[u8])> = nodes.iter().map(|(f, v)| (f * 32, &v[..])).collect();
        self.tx
            .write_list(self.name, &list)
            .map_err(std::io::Error::other)
    }
    fn truncate_nodes(&mut self, count: u64) -> std::io::Result<()> {
        let io = std::io::Error::other;
        self.window = None;
        if self.mem.is_some() && count > MEM_NODES {
            self.spill()?;
        }
        if let Some(mem) = &mut self.mem {
            mem.resize(count as usize, ZERO_LEAF);
            return Ok(());
        }
        if let Some(node) = &mut self.inline {
            if count == 0 {
                *node = ZERO_LEAF;
            }
            // Node 0 is not in the object: keep none there for a tree of one node.
            if count <= 1 {
                if self.tx.len(self.name).map_err(io)?.is_some_and(|l| l > 0) {
                    self.tx.set_len(self.name, 0).map_err(io)?;
                }
                return Ok(());
            }
        }
        self.tx.set_len(self.name, count * 32).map_err(io)
    }
}

impl MtEint {
    fn tree<'a>(env: &'a Env, f: &FileState) -> MerkleTree<'a> {
        MerkleTree {
            hasher: env.hasher,
            file: f.id,
            cache: Some(env.cache),
        }
    }

    fn leaf_hash(env: &Env, id: &FileId, index: u64, ctr: u64, plain: &[u8]) -> Hash {
        env.leaf_key
            .mac(&[b"leaf", id, &index.to_le_bytes(), &ctr.to_le_bytes(), plain])
    }

    fn tree_err(f: &FileState, e: TreeError) -> Error {
        match e {
            TreeError::Mismatch { leaf } => {
                f.tampered(leaf, "Merkle path does not match the trusted root")
            }
            TreeError::CacheMismatch { leaf, flat } => f.tampered(
                leaf,
                format!("Merkle node {flat} differs from its verified value"),
            ),
            TreeError::Io(e) => match e.downcast::<Error>() {
                Ok(inner) => inner,
                Err(e) => Error::io(f.names.meta.clone(), e),
            },
            other => Error::Invalid(other.to_string()),
        }
    }

    /// After an operation that changed the tree: restores the rule of where the tree is
    /// kept. `inline` and `mem` are where the operation left it ([`Nodes::inline`],
    /// [`Nodes::mem`]; both `None`: every node in `.m`).
    ///
    /// On a volume with inline trees ([`Env::inline_tree`]) a tree of one leaf keeps its
    /// node in the record ([`FileState::inline`]), one of 2 to [`MAX_INLINE_TAGS`] leaves
    /// (GCM only) its leaves' tags while the counters leave room ([`FileState::tags`],
    /// [`InlineTags::fit`]), and `.m` holds nothing; a larger tree is all in `.m`. Leaves
    /// that move from `.m` into the record are checked against the trusted root the
    /// operation just computed, so no unverified byte of `.m` becomes trusted.
    fn settle(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        inline: Option<Hash>,
        mem: Option<Vec<Hash>>,
    ) -> Result<()> {
        if !env.inline_tree {
            return Self::settle_leaf(env, f, tx, inline);
        }
        let n = f.tree.leaves;
        let in_record = n <= 1 || (!self.cbc && InlineTags::fit(n, f.ctrs.intervals()));
        let from_object = mem.is_none();
        let tree = Self::tree(env, f);
        let leaves = match &mem {
            Some(nodes) => {
                let leaves: Vec<Hash> = nodes.iter().step_by(2).take(n as usize).copied().collect();
                debug_assert_eq!(leaves.len() as u64, n);
                debug_assert!(n == 0 || tree.root_of(&leaves) == f.tree.root);
                leaves
            }
            None if in_record && n > 0 => {
                let leaves = tree
                    .stored_leaves(&mut Nodes::new(tx, &f.names.meta), 0, n)
                    .map_err(|e| Self::tree_err(f, e))?;
                if tree.root_of(&leaves) != f.tree.root {
                    return Err(
                        f.tampered_file("Merkle tree object does not match the trusted root")
                    );
                }
                leaves
            }
            None => Vec::new(),
        };
        f.inline = None;
        f.tags = None;
        if !in_record {
            if let Some(nodes) = mem {
                // The tree was in the record, so `.m` holds nothing yet.
                Nodes::new(tx, &f.names.meta)
                    .write_nodes(0, &nodes)
                    .map_err(|e| Self::tree_err(f, TreeError::Io(e)))?;
            }
            return Ok(());
        }
        match n {
            0 => {}
            1 => f.inline = Some(leaves[0]),
            _ => {
                f.tags = Some(InlineTags::of(&leaves).ok_or_else(|| {
                    f.tampered_file("a GCM Merkle leaf whose last 16 bytes are not zero")
                })?);
            }
        }
        if from_object && tx.len(&f.names.meta)?.is_some_and(|l| l > 0) {
            tx.set_len(&f.names.meta, 0)?;
        }
        Ok(())
    }

    /// [`MtEint::settle`] on a volume without inline trees: restores the rule of
    /// [`FileState::inline`]. A tree of one leaf keeps its node in the record and no bytes
    /// in `.m` (when the volume has inline leaves); a larger one keeps node 0 in `.m` like
    /// every other node; an empty one has neither.
    fn settle_leaf(env: &Env, f: &mut FileState, tx: &mut Tx, inline: Option<Hash>) -> Result<()> {
        f.inline = match (f.tree.leaves, inline) {
            (0, _) => None,
            (1, Some(node)) => Some(node),
            (1, None) if env.inline_leaf => {
                let mut node = [ZERO_LEAF];
                Nodes::new(tx, &f.names.meta)
                    .read_nodes(0, &mut node)
                    .map_err(|e| Self::tree_err(f, TreeError::Io(e)))?;
                tx.set_len(&f.names.meta, 0)?;
                Some(node[0])
            }
            (_, Some(node)) => {
                Nodes::new(tx, &f.names.meta)
                    .write_nodes(0, &[node])
                    .map_err(|e| Self::tree_err(f, TreeError::Io(e)))?;
                None
            }
            (_, None) => None,
        };
        Ok(())
    }

    /// Encrypts a run of file `id` in place under counter `ctr`; returns the leaves. Needs
    /// only the file's keys: [`Scheme::seal_run`] calls it without any lock.
    fn seal(
        &self,
        env: &Env,
        keys: &FileKeys,
        id: &FileId,
        first: u64,
        ctr: u64,
        ct: &mut [u8],
    ) -> Vec<Hash> {
        let bs = env.bs;
        let count = ct.len() / bs;
        let mut leaves = Vec::with_capacity(count);
        for k in 0..count {
            let i = first + k as u64;
            let blk = &mut ct[k * bs..(k + 1) * bs];
            if self.cbc {
                leaves.push(timed(Phase::HashMac, || {
                    Self::leaf_hash(env, id, i, ctr, blk)
                }));
                let _t = phase(Phase::Encrypt);
                keys.cbc().encrypt(keys.cbc_iv(i, ctr), blk);
            } else {
                let _t = phase(Phase::Encrypt);
                let tag =
                    keys.gcm()
                        .seal(FileKeys::nonce(i, ctr), &block_aad(MT_LABEL, id, i), blk);
                let mut leaf = [0u8; 32];
                leaf[..TAG_LEN].copy_from_slice(&tag);
                leaves.push(leaf);
            }
        }
        leaves
    }

    /// Decrypts one block in place (`buf` holds its ciphertext) and checks it against its
    /// stored leaf (not yet the tree).
    fn open_block(
        &self,
        env: &Env,
        f: &FileState,
        i: u64,
        leaf: &Hash,
        buf: &mut [u8],
    ) -> Result<()> {
        let ctr = f.ctrs.get(i);
        if ctr == 0 {
            if leaf != &ZERO_LEAF {
                return Err(f.tampered(i, "a hole has a non-empty leaf"));
            }
            buf.fill(0);
            return Ok(());
        }
        if self.cbc {
            timed(Phase::Encrypt, || {
                f.keys.cbc().decrypt(f.keys.cbc_iv(i, ctr), buf)
            });
            let h = timed(Phase::HashMac, || Self::leaf_hash(env, &f.id, i, ctr, buf));
            if !crate::crypto::ct_eq(&h, leaf) {
                buf.fill(0);
                return Err(f.tampered(i, "block does not match its Merkle leaf"));
            }
        } else {
            if leaf[TAG_LEN..] != [0u8; 32 - TAG_LEN] {
                return Err(f.tampered(i, "malformed Merkle leaf"));
            }
            timed(Phase::Encrypt, || {
                f.keys.gcm().open(
                    FileKeys::nonce(i, ctr),
                    &block_aad(MT_LABEL, &f.id, i),
                    &leaf[..TAG_LEN],
                    buf,
                )
            })
            .map_err(|_| f.tampered(i, "AES-GCM authentication failed"))?;
        }
        Ok(())
    }

    /// Whether `ctr` is still fresh for blocks `[first, first + count)`: above every counter
    /// they have (a block's counter only grows, so above every one it had), above every
    /// deleted block's, and inside the session's reservation. What [`MtEint::next_ctr`]
    /// chooses is, until the state changes.
    fn fresh(env: &Env, f: &FileState, first: u64, count: u64, ctr: u64) -> bool {
        ctr > f.ctrs.max_in(first, count)
            && ctr > f.ctr_hw
            && ctr >= env.ctr_floor
            && ctr < env.ctr_limit
    }

    /// Stores a run sealed under `ctr` (`data` its ciphertext): the tree's leaves (updated
    /// over the file's blocks, appended past them), the data, the counters.
    ///
    /// `direct`, block by block (missing: false): the block goes directly into the slot the
    /// durable state does not use ([`MtEint::twin_plan`]); otherwise the transaction
    /// decides (appends go directly, the rest is staged). A block that changes slot counts
    /// as written in both since the checkpoint ([`Tx::touch`]).
    #[allow(clippy::too_many_arguments)]
    fn store_sealed(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        ctr: u64,
        data: &[u8],
        leaves: &[Hash],
        direct: &[bool],
    ) -> Result<()> {
        let bs = env.bs;
        let (n, count) = check_write(f, bs, first, data.len())?;
        if leaves.len() as u64 != count {
            return Err(Error::Invalid(format!(
                "{} leaves for a run of {count} blocks",
                leaves.len()
            )));
        }
        let over = (n - first).min(count) as usize;
        let tree = Self::tree(env, f);
        let mut ts = f.tree;
        let mut io = Nodes::entering(env, tx, f);
        {
            let _t = phase(Phase::Tree);
            if over > 0 {
                tree.update(&mut ts, &mut io, first, &leaves[..over])
                    .map_err(|e| Self::tree_err(f, e))?;
            }
            if over < leaves.len() {
                tree.append(&mut ts, &mut io, &leaves[over..])
                    .map_err(|e| Self::tree_err(f, e))?;
            }
        }
        let (inline, mem) = (io.inline, io.mem.take());
        Self::place(env, f, tx, first, ctr, data, over as u64, direct)?;
        f.tree = ts;
        self.settle(env, f, tx, inline, mem)
    }

    /// What [`MtEint::store_sealed`] does once the tree holds the run's leaves: the run's
    /// blocks (`data`, sealed under `ctr`; the first `over` over the file's blocks) go to
    /// their slot, and the counters take `ctr`.
    #[allow(clippy::too_many_arguments)]
    fn place(
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        ctr: u64,
        data: &[u8],
        over: u64,
        direct: &[bool],
    ) -> Result<()> {
        let bs = env.bs;
        let count = (data.len() / bs) as u64;
        let odd = ctr & 1 == 1;
        if env.twins {
            let moved = |k: u64| (f.ctrs.get(first + k) & 1 == 1) != odd;
            let mut k = 0;
            while k < over {
                if !moved(k) {
                    k += 1;
                    continue;
                }
                let mut e = k + 1;
                while e < over && moved(e) {
                    e += 1;
                }
                Self::touch_slots(env, f, tx, first + k, first + e);
                k = e;
            }
        }
        let slot = Self::slot(env, f, ctr);
        let is_direct = |k: usize| direct.get(k).copied().unwrap_or(false);
        let mut k = 0;
        while k < count as usize {
            let d = is_direct(k);
            let mut e = k + 1;
            while e < count as usize && is_direct(e) == d {
                e += 1;
            }
            let (off, part) = ((first + k as u64) * bs as u64, &data[k * bs..e * bs]);
            if d {
                tx.write_twin(slot, off, part)?;
            } else {
                tx.write_at(slot, off, part)?;
            }
            k = e;
        }
        f.ctrs.set_range(first, count, ctr);
        Ok(())
    }

    /// The next write counter for a run: above every counter the run's blocks had, above
    /// every deleted block's, and inside the session's reservation; odd exactly when `odd`
    /// on a volume with twin blocks (the counter's parity names the block's slot).
    fn next_ctr(env: &Env, f: &FileState, first: u64, count: u64, odd: bool) -> Result<u64> {
        let c = Self::next_ctr_any(env, f, first, count)?;
        if env.twins && (c & 1 == 1) != odd {
            return Self::check_ctr(env, c + 1);
        }
        Ok(c)
    }

    /// [`MtEint::next_ctr`] of any parity (the schemes that keep every block in `.d`).
    fn next_ctr_any(env: &Env, f: &FileState, first: u64, count: u64) -> Result<u64> {
        let c = (f.ctrs.max_in(first, count) + 1)
            .max(env.ctr_floor)
            .max(f.ctr_hw + 1);
        Self::check_ctr(env, c)
    }

    fn check_ctr(env: &Env, c: u64) -> Result<u64> {
        if c >= env.ctr_limit {
            return Err(Error::Invalid(
                "write-counter reservation exhausted; close and reopen the volume".into(),
            ));
        }
        Ok(c)
    }
}

/// Twin blocks (docs/design.md, "Twin blocks"; the volume's
/// [`crate::format::TWIN_BLOCKS`] feature).
impl MtEint {
    /// The object that holds a block written under counter `ctr`: the twin when the
    /// counter is odd (on a volume with twin blocks), the data object otherwise (and for
    /// holes, counter 0, which are never read).
    fn slot<'a>(env: &Env, f: &'a FileState, ctr: u64) -> &'a str {
        if env.twins && ctr & 1 == 1 {
            &f.names.twin
        } else {
            &f.names.data
        }
    }

    /// Reads the stored blocks `[first, first + out.len() / bs)` (ciphertext), each from
    /// the slot its counter names.
    fn read_slots(env: &Env, f: &FileState, tx: &mut Tx, first: u64, out: &mut [u8]) -> Result<()> {
        let bs = env.bs;
        if !env.twins {
            tx.read_at(&f.names.data, first * bs as u64, out)?;
            return Ok(());
        }
        let count = out.len() / bs;
        let odd = |k: usize| f.ctrs.get(first + k as u64) & 1 == 1;
        let mut k = 0;
        while k < count {
            let o = odd(k);
            let mut e = k + 1;
            while e < count && odd(e) == o {
                e += 1;
            }
            let name = if o { &f.names.twin } else { &f.names.data };
            tx.read_at(
                name,
                (first + k as u64) * bs as u64,
                &mut out[k * bs..e * bs],
            )?;
            k = e;
        }
        Ok(())
    }

    /// Where a write over the file's blocks `[first, first + count)` goes: `(odd, direct)`,
    /// the parity of its one counter (so one slot for the whole run, and one counter
    /// interval) and, block by block, whether it goes directly to the store.
    ///
    /// The run goes to the slot most of its blocks are *not* in. A block in the other slot
    /// goes there directly when the transaction says that no state a crash could come back
    /// to uses those bytes ([`Tx::twin_free`]): the version the durable state names stays
    /// whole, so the write needs no journal and no second copy. Every other block is staged
    /// (logged, journaled at the checkpoint and written in place, as before twin blocks). A
    /// file whose tree is kept in its record (one to six blocks) stays one object: its run
    /// goes to the slot most of its blocks are in, staged.
    fn twin_plan(
        env: &Env,
        f: &FileState,
        tx: &mut Tx,
        first: u64,
        count: u64,
    ) -> Result<(bool, Vec<bool>)> {
        let count = count as usize;
        let mut direct = vec![false; count];
        if !env.twins {
            return Ok((false, direct));
        }
        let cur: Vec<bool> = (0..count)
            .map(|k| f.ctrs.get(first + k as u64) & 1 == 1)
            .collect();
        let in_object = Self::in_object(f);
        let odd = Self::twin_parity(in_object, &cur);
        if !in_object {
            return Ok((odd, direct));
        }
        let bs = env.bs as u64;
        let (to, other) = if odd {
            (&f.names.twin, &f.names.data)
        } else {
            (&f.names.data, &f.names.twin)
        };
        let mut k = 0;
        while k < count {
            if cur[k] == odd {
                k += 1;
                continue;
            }
            let mut e = k + 1;
            while e < count && cur[e] != odd {
                e += 1;
            }
            let at = |j: usize| (first + j as u64) * bs;
            if tx.twin_free(to, other, at(k), at(e) - at(k))? {
                direct[k..e].fill(true);
            } else {
                for (j, d) in direct.iter_mut().enumerate().take(e).skip(k) {
                    *d = tx.twin_free(to, other, at(j), bs)?;
                }
            }
            k = e;
        }
        Ok((odd, direct))
    }

    /// The slot a run over blocks whose slots are `cur` (odd: the twin) goes to: the one
    /// most are not in for a file kept in objects, the one most are in otherwise.
    fn twin_parity(in_object: bool, cur: &[bool]) -> bool {
        let odds = cur.iter().filter(|&&c| c).count();
        if in_object {
            2 * odds < cur.len()
        } else {
            2 * odds > cur.len()
        }
    }

    /// The file's tree is in `.m` (it has objects of its own besides `.d`).
    fn in_object(f: &FileState) -> bool {
        f.inline.is_none() && f.tags.is_none() && f.tree.leaves > 1
    }

    /// What a cut or a hole leaves behind: the blocks' bytes in both slots count as written
    /// since the checkpoint ([`Tx::touch`]), since their counters changed without a write.
    fn touch_slots(env: &Env, f: &FileState, tx: &mut Tx, first: u64, end: u64) {
        if env.twins && end > first {
            let bs = env.bs as u64;
            for name in f.names.blocks() {
                tx.touch(name, first * bs, end * bs);
            }
        }
    }
}

impl Scheme for MtEint {
    fn read_blocks(
        &self,
        env: &Env,
        f: &FileState,
        tx: &mut Tx,
        first: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let bs = env.bs;
        let count = (out.len() / bs) as u64;
        let tree = Self::tree(env, f);
        // One node I/O for the leaves and the check: a tree kept in the record is expanded
        // from its tags once per read.
        let mut io = Nodes::of(env, tx, f).windowed();
        let leaves = timed(Phase::Tree, || tree.stored_leaves(&mut io, first, count))
            .map_err(|e| Self::tree_err(f, e))?;
        Self::read_slots(env, f, io.tx, first, out)?;
        for k in 0..count as usize {
            let blk = &mut out[k * bs..(k + 1) * bs];
            if let Err(e) = self.open_block(env, f, first + k as u64, &leaves[k], blk) {
                // Earlier blocks decrypted but are not yet checked against the tree.
                out.fill(0);
                return Err(e);
            }
        }
        if let Err(e) = timed(Phase::Tree, || {
            tree.verify(&f.tree, &mut io, first, &leaves)
        }) {
            out.fill(0);
            // Name the first block whose own path fails, for a precise message.
            if matches!(e, TreeError::Mismatch { .. }) {
                for k in 0..count {
                    if tree
                        .verify(
                            &f.tree,
                            &mut io,
                            first + k,
                            &leaves[k as usize..k as usize + 1],
                        )
                        .is_err()
                    {
                        return Err(
                            f.tampered(first + k, "Merkle path does not match the trusted root")
                        );
                    }
                }
            }
            return Err(Self::tree_err(f, e));
        }
        Ok(())
    }

    fn write_blocks(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        data: &mut [u8],
    ) -> Result<()> {
        let (n, count) = check_write(f, env.bs, first, data.len())?;
        // On a volume with twin blocks, the blocks over the file's and the ones appended
        // are two runs: appends go to `.d` under an even counter.
        let over = if env.twins {
            n.saturating_sub(first).min(count)
        } else {
            0
        };
        let (head, tail) = data.split_at_mut(over as usize * env.bs);
        if over > 0 {
            let (odd, direct) = Self::twin_plan(env, f, tx, first, over)?;
            let ctr = Self::next_ctr(env, f, first, over, odd)?;
            let leaves = self.seal(env, &f.keys, &f.id, first, ctr, head);
            self.store_sealed(env, f, tx, first, ctr, head, &leaves, &direct)?;
        }
        if !tail.is_empty() {
            let at = first + over;
            let ctr = Self::next_ctr(env, f, at, count - over, false)?;
            let leaves = self.seal(env, &f.keys, &f.id, at, ctr, tail);
            self.store_sealed(env, f, tx, at, ctr, tail, &leaves, &[])?;
        }
        Ok(())
    }

    /// The runs sealed and placed one by one as [`Scheme::write_blocks`] does it (each its
    /// own counter, slot and direct blocks; its buffer dropped once placed), then the tree
    /// updated once for all of them ([`MerkleTree::update_runs`]: the old leaves checked
    /// against the trusted root first). A failure fails the whole flush, and the commit
    /// with it (the engine goes back to its last seal), whichever step it comes at. A tree
    /// kept in the record (a few blocks) goes run by run.
    fn write_runs(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        runs: Vec<(u64, Vec<u8>)>,
    ) -> Result<()> {
        let n = f.tree.leaves;
        let inside = |r: &(u64, Vec<u8>)| r.0.saturating_add((r.1.len() / env.bs) as u64) <= n;
        if runs.len() < 2 || !Self::in_object(f) || !runs.iter().all(inside) {
            return runs_one_by_one(self, env, f, tx, runs);
        }
        let mut leaves = Vec::with_capacity(runs.len());
        for (first, mut data) in runs {
            let (_, count) = check_write(f, env.bs, first, data.len())?;
            let (odd, direct) = Self::twin_plan(env, f, tx, first, count)?;
            let ctr = Self::next_ctr(env, f, first, count, odd)?;
            let sealed = self.seal(env, &f.keys, &f.id, first, ctr, &mut data);
            Self::place(env, f, tx, first, ctr, &data, count, &direct)?;
            leaves.push((first, sealed));
        }
        let tree = Self::tree(env, f);
        let mut ts = f.tree;
        let mut io = Nodes::entering(env, tx, f);
        {
            let _t = phase(Phase::Tree);
            let arg: Vec<(u64, &[Hash])> = leaves.iter().map(|(b, l)| (*b, l.as_slice())).collect();
            tree.update_runs(&mut ts, &mut io, &arg)
                .map_err(|e| Self::tree_err(f, e))?;
        }
        let (inline, mem) = (io.inline, io.mem.take());
        f.tree = ts;
        self.settle(env, f, tx, inline, mem)
    }

    fn seal_plan(
        &self,
        env: &Env,
        f: &FileState,
        first: u64,
        count: u64,
    ) -> Result<Option<SealPlan>> {
        check_limit(first.saturating_add(count))?;
        // Twin blocks: a run past the end is appended under an even counter; one over the
        // file's blocks, all in one slot, is planned for the other slot (checked again
        // when it is stored); a run that is both goes through `write_blocks`.
        let n = f.tree.leaves;
        let odd = if !env.twins || first >= n {
            false
        } else {
            if first.saturating_add(count) > n {
                return Ok(None);
            }
            let cur: Vec<bool> = (first..first + count)
                .map(|b| f.ctrs.get(b) & 1 == 1)
                .collect();
            Self::twin_parity(Self::in_object(f), &cur)
        };
        Ok(Some(SealPlan {
            keys: Arc::clone(&f.keys),
            id: f.id,
            first,
            ctr: Self::next_ctr(env, f, first, count, odd)?,
        }))
    }

    fn seal_run(&self, env: &Env, plan: &SealPlan, data: &mut [u8]) -> Vec<Hash> {
        self.seal(env, &plan.keys, &plan.id, plan.first, plan.ctr, data)
    }

    fn write_sealed(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        plan: &SealPlan,
        data: &[u8],
        leaves: &[Hash],
    ) -> Result<bool> {
        let count = (data.len() / env.bs) as u64;
        if plan.id != f.id || !Self::fresh(env, f, plan.first, count, plan.ctr) {
            return Ok(false);
        }
        // The slot the plan's counter names must be the one the run goes to now.
        let direct = if env.twins && plan.first < f.tree.leaves {
            let (odd, direct) = Self::twin_plan(env, f, tx, plan.first, count)?;
            if plan.first + count > f.tree.leaves || odd != (plan.ctr & 1 == 1) {
                return Ok(false);
            }
            direct
        } else if env.twins && plan.ctr & 1 == 1 {
            return Ok(false);
        } else {
            Vec::new()
        };
        self.store_sealed(env, f, tx, plan.first, plan.ctr, data, leaves, &direct)?;
        Ok(true)
    }

    fn resize(&self, env: &Env, f: &mut FileState, tx: &mut Tx, blocks: u64) -> Result<()> {
        check_limit(blocks)?;
        let n = f.tree.leaves;
        if blocks == n {
            return Ok(());
        }
        let tree = Self::tree(env, f);
        let mut ts = f.tree;
        let (inline, mem);
        if blocks < n {
            {
                let mut io = Nodes::entering(env, tx, f);
                tree.truncate(&mut ts, &mut io, blocks)
                    .map_err(|e| Self::tree_err(f, e))?;
                (inline, mem) = (io.inline, io.mem.take());
            }
            f.ctr_hw = f.ctr_hw.max(f.ctrs.max_in(blocks, n - blocks));
            f.ctrs.truncate(blocks);
            tx.set_len(&f.names.data, blocks * env.bs as u64)?;
            if env.twins {
                Self::touch_slots(env, f, tx, blocks, n);
                if tx
                    .len(&f.names.twin)?
                    .is_some_and(|l| l > blocks * env.bs as u64)
                {
                    tx.set_len(&f.names.twin, blocks * env.bs as u64)?;
                }
            }
        } else {
            // Holes have the all-zero leaf (ZERO_LEAF == ZERO_HASH): O(log) however many.
            let mut io = Nodes::entering(env, tx, f);
            tree.append_holes(&mut ts, &mut io, blocks - n)
                .map_err(|e| Self::tree_err(f, e))?;
            (inline, mem) = (io.inline, io.mem.take());
            f.ctrs.extend(blocks);
        }
        f.tree = ts;
        self.settle(env, f, tx, inline, mem)
    }

    /// A hole inside the file: the all-zero leaf and counter 0, as for holes appended by
    /// `resize` (the trusted counter, never the stored bytes, says what is a hole). The
    /// punched blocks' counters go into `ctr_hw`, so a later write of any of them takes a
    /// counter above every one it had: no (block, counter) pair repeats.
    fn punch(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        count: u64,
    ) -> Result<bool> {
        const CHUNK: u64 = 1 << 16;
        let end = first.saturating_add(count).min(f.tree.leaves);
        if first >= end {
            return Ok(true);
        }
        f.ctr_hw = f.ctr_hw.max(f.ctrs.max_in(first, end - first));
        let tree = Self::tree(env, f);
        let mut ts = f.tree;
        let mut io = Nodes::entering(env, tx, f);
        let mut at = first;
        while at < end {
            let n = (end - at).min(CHUNK);
            let leaves = vec![ZERO_LEAF; n as usize];
            let _t = phase(Phase::Tree);
            tree.update(&mut ts, &mut io, at, &leaves)
                .map_err(|e| Self::tree_err(f, e))?;
            at += n;
        }
        let (inline, mem) = (io.inline, io.mem.take());
        f.tree = ts;
        f.ctrs.set_range(first, end - first, 0);
        Self::touch_slots(env, f, tx, first, end);
        self.settle(env, f, tx, inline, mem)?;
        Ok(true)
    }

    fn empty(&self, env: &Env, id: &FileId) -> TreeState {
        TreeState::empty(env.hasher, id)
    }
}

/// A scheme driven directly, without a volume: its file state, its keys and a transaction
/// over an in-memory store. For the checks that the volume makes first (so that no request
/// through it reaches them) and for what a scheme promises whatever calls it.
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;
    use crate::crypto::MasterKey;
    use crate::store::MemStore;
    use std::sync::Arc;

    /// The volume-wide context of [`Env`], owned.
    pub(crate) struct Fixture {
        master: MasterKey,
        hasher: NodeHasher,
        leaf: SubKey,
        cache: NodeCache,
        metrics: Metrics,
        pub(crate) bs: usize,
        /// [`Env::inline_leaf`] (off unless a test sets it).
        pub(crate) inline_leaf: bool,
        /// [`Env::inline_mac`] (off unless a test sets it).
        pub(crate) inline_mac: bool,
        /// [`Env::inline_tree`] (off unless a test sets it).
        pub(crate) inline_tree: bool,
        /// [`Env::twins`] (off unless a test sets it).
        pub(crate) twins: bool,
        /// [`Env::ctr_limit`]: the session's counters stay below it.
        pub(crate) ctr_limit: u64,
        pub(crate) tx: Tx,
    }

    /// The master key of every fixture.
    pub(crate) fn master() -> MasterKey {
        MasterKey::from_bytes([7; 32])
    }

    /// Commits what `tx` staged and wrote directly, journal and all, as a seal does: the
    /// store then holds it as committed state.
    pub(crate) fn commit(tx: &mut Tx) {
        let key = master().derive(crate::crypto::label::JOURNAL, &[]);
        let store = tx.store().clone();
        let c = tx.begin_commit(1, None).unwrap();
        c.write_journal(store.as_ref(), &key).unwrap();
        c.apply(store.as_ref()).unwrap();
        tx.end_commit(&c);
    }

    impl Fixture {
        pub(crate) fn new(bs: usize) -> Self {
            Self::with_cache(bs, 1 << 20)
        }

        /// With a verified-node cache of `bytes` (0: every read verifies from the store).
        pub(crate) fn with_cache(bs: usize, bytes: usize) -> Self {
            let master = master();
            let node = master.derive("intact test nodes", &[]);
            Fixture {
                hasher: NodeHasher::new(*node.expose_secret()),
                leaf: master.derive("intact test leaves", &[]),
                master,
                cache: NodeCache::new(bytes),
                metrics: Metrics::new(),
                bs,
                inline_leaf: false,
                inline_mac: false,
                inline_tree: false,
                twins: false,
                ctr_limit: u64::MAX >> 1,
                tx: Tx::new(Arc::new(MemStore::new())),
            }
        }

        /// What the scheme's calls were measured at.
        pub(crate) fn metrics(&self) -> &Metrics {
            &self.metrics
        }

        /// The context and the transaction, borrowed at once.
        pub(crate) fn parts(&mut self) -> (Env<'_>, &mut Tx) {
            let env = Env {
                bs: self.bs,
                hasher: &self.hasher,
                leaf_key: &self.leaf,
                cache: &self.cache,
                ctr_floor: 1,
                ctr_limit: self.ctr_limit,
                metrics: &self.metrics,
                max_object: u64::MAX,
                inline_leaf: self.inline_leaf,
                inline_mac: self.inline_mac,
                inline_tree: self.inline_tree,
                twins: self.twins,
            };
            (env, &mut self.tx)
        }

        /// The state of a new, empty file of scheme `id`.
        pub(crate) fn file(&mut self, id: SchemeId) -> FileState {
            let fid: FileId = [id as u8; 16];
            let (env, _) = self.parts();
            let tree = scheme(id).empty(&env, &fid);
            FileState {
                subject: Subject::Inode(2),
                id: fid,
                names: ObjectNames::of(&fid),
                keys: Arc::new(FileKeys::new(Arc::new(self.master.clone()), &fid)),
                tree,
                ctrs: CounterIntervals::new(),
                ctr_hw: 0,
                rtree: super::RTreeIndex::for_scheme(id),
                inline: None,
                inline_mac: None,
                tags: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::Fixture;
    use super::*;
    use crate::FsErrorKind;

    fn too_large(r: Result<()>) -> bool {
        matches!(
            r,
            Err(Error::Fs {
                kind: FsErrorKind::TooLarge,
                ..
            })
        )
    }

    /// No scheme grows a file past [`MAX_BLOCKS`] (the limit of its counters and tree
    /// positions), whoever asks: a resize to one block more is refused, and so is a write
    /// of one block at the limit into a file that already reaches it. The volume refuses
    /// both before any scheme sees them (`check_extent`), so only this test reaches them.
    #[test]
    fn no_scheme_grows_a_file_past_max_blocks() {
        for id in SchemeId::ALL {
            let mut fx = Fixture::new(512);
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            assert!(
                too_large(sch.resize(&env, &mut f, tx, MAX_BLOCKS + 1)),
                "{id:?}: resize past the limit"
            );
            assert_eq!(f.blocks(), 0, "{id:?}: a refused resize changes nothing");
            // A file that reaches the limit (its state set by hand: building it would
            // take 2^32 blocks), written one block past it.
            f.tree.leaves = MAX_BLOCKS;
            f.ctrs.extend(MAX_BLOCKS);
            let mut block = vec![1u8; env.bs];
            assert!(
                too_large(sch.write_blocks(&env, &mut f, tx, MAX_BLOCKS, &mut block)),
                "{id:?}: a write of the block past the limit"
            );
        }
    }

    /// [`Scheme::read_ready`] says whether a read can run without the engine lock as it is:
    /// always for the schemes whose tree covers every block; for RAND-EINT and COMP-EINT only
    /// once [`Scheme::prepare_read`] loaded RTree's index for the file's current state (a
    /// state read back from its record starts without it), and no longer after a write.
    #[test]
    fn read_ready_once_prepared() {
        for id in SchemeId::ALL {
            let mut fx = Fixture::new(512);
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            let mut data: Vec<u8> = (0..4 * env.bs).map(|i| (i * 7 % 251) as u8).collect();
            sch.write_blocks(&env, &mut f, tx, 0, &mut data).unwrap();
            if !id.partial_tree() {
                assert!(sch.read_ready(&f), "{id:?}");
                continue;
            }
            // As read back from the record: the trusted state without the index.
            f.rtree = RTreeIndex::for_scheme(id);
            assert!(!sch.read_ready(&f), "{id:?}: no index loaded yet");
            sch.prepare_read(&env, &mut f, tx).unwrap();
            assert!(sch.read_ready(&f), "{id:?}: the index is loaded");
            let mut more = vec![9u8; env.bs];
            sch.write_blocks(&env, &mut f, tx, 4, &mut more).unwrap();
            let mut out = vec![0u8; 5 * env.bs];
            sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
            assert_eq!(&out[4 * env.bs..], &vec![9u8; env.bs][..], "{id:?}");
        }
    }

    /// One operation on a file, as the volume issues them ([`crate::volume`]'s
    /// `flush_data` and truncation): a run of blocks written at `at` (a share of the file
    /// and one block more, so it may start past the end, which a resize fills first), a
    /// resize (to at most two blocks past the end: an empty file grows too), or a punch.
    #[derive(Debug, Clone)]
    enum Op {
        Write { at: f64, count: u64, seed: u8 },
        Resize { at: f64 },
        Punch { at: f64, count: u64 },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0.0..1.5f64, 1..6u64, any::<u8>())
                .prop_map(|(at, count, seed)| Op::Write { at, count, seed }),
            1 => (0.0..2.0f64).prop_map(|at| Op::Resize { at }),
            1 => (0.0..1.0f64, 1..4u64).prop_map(|(at, count)| Op::Punch { at, count }),
        ]
    }

    /// `len` bytes that look random (xorshift64 from `seed`): blocks of them are
    /// random-looking to RAND-EINT's entropy test and do not compress for COMP-EINT.
    fn random_bytes(mut x: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Reads the whole file through the scheme.
    fn read_all(sch: &dyn Scheme, env: &Env, f: &FileState, tx: &mut Tx) -> Result<Vec<u8>> {
        let mut out = vec![0u8; f.blocks() as usize * env.bs];
        if !out.is_empty() {
            sch.read_blocks(env, f, tx, 0, &mut out)?;
        }
        Ok(out)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Every scheme against a model (a vector of blocks, zeros for holes): after each
        /// operation the file reads as the model, whole and block by block, also from its
        /// trusted state alone (as read back from its record: RTree's index not loaded);
        /// its data object never exceeds [`Scheme::data_len`]; and, for every scheme that
        /// authenticates, a byte flipped in the data object fails the read instead of
        /// changing what it returns.
        #[test]
        fn every_scheme_reads_as_a_model(ops in proptest::collection::vec(op(), 1..10)) {
            let twins = [SchemeId::MtEintGcm, SchemeId::MtEintCbc].map(|id| (id, true));
            for (id, twin) in SchemeId::ALL.map(|id| (id, false)).into_iter().chain(twins) {
                let mut fx = Fixture::new(256);
                fx.twins = twin;
                let mut f = fx.file(id);
                let (env, tx) = fx.parts();
                let bs = env.bs;
                let sch = scheme(id);
                let mut model: Vec<Vec<u8>> = Vec::new();
                for (k, op) in ops.iter().enumerate() {
                    let n = model.len() as u64;
                    match *op {
                        Op::Write { at, count, seed } => {
                            let first = (at * (n + 1) as f64) as u64;
                            if first > f.blocks() {
                                sch.resize(&env, &mut f, tx, first).unwrap();
                                model.resize(first as usize, vec![0; bs]);
                            }
                            let run: Vec<u8> = (0..count as usize * bs)
                                .map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed))
                                .collect();
                            sch.write_blocks(&env, &mut f, tx, first, &mut run.clone()).unwrap();
                            let end = (first + count) as usize;
                            if model.len() < end {
                                model.resize(end, vec![0; bs]);
                            }
                            for (k, b) in run.chunks(bs).enumerate() {
                                model[first as usize + k] = b.to_vec();
                            }
                        }
                        Op::Resize { at } => {
                            let blocks = (at * (n + 2) as f64) as u64;
                            sch.resize(&env, &mut f, tx, blocks).unwrap();
                            model.resize(blocks as usize, vec![0; bs]);
                        }
                        Op::Punch { at, count } => {
                            let first = (at * n as f64) as u64;
                            let count = count.min(n - first.min(n));
                            if count == 0 {
                                continue;
                            }
                            if sch.punch(&env, &mut f, tx, first, count).unwrap() {
                                for b in &mut model[first as usize..(first + count) as usize] {
                                    b.fill(0);
                                }
                            }
                        }
                    }
                    let want = model.concat();
                    proptest::prop_assert_eq!(f.blocks(), model.len() as u64, "{:?}", id);
                    proptest::prop_assert!(read_all(sch, &env, &f, tx).unwrap() == want, "{:?}", id);
                    let reloaded = reloaded(&f, id);
                    proptest::prop_assert!(read_all(sch, &env, &reloaded, tx).unwrap() == want, "{:?}: reloaded", id);
                    // Block by block too: each read starts inside the file.
                    for (i, b) in model.iter().enumerate() {
                        let mut one = vec![0u8; bs];
                        sch.read_blocks(&env, &f, tx, i as u64, &mut one).unwrap();
                        proptest::prop_assert!(&one == b, "{:?}: block {}", id, i);
                    }
                    let stored = tx.len(&f.names.data).unwrap().unwrap_or(0);
                    proptest::prop_assert!(stored <= sch.data_len(bs, f.blocks()), "{:?}: {} stored", id, stored);
                    // Every other operation goes on from the state as read back (a record
                    // dropped from memory and loaded again): writes then load RTree's index.
                    if k % 2 == 1 {
                        f = reloaded;
                    }
                }
                // Tampering: every byte of the data objects is covered.
                let want = model.concat();
                for name in f.names.blocks() {
                    let stored = tx.len(name).unwrap().unwrap_or(0);
                    if stored == 0 || id == SchemeId::None {
                        continue;
                    }
                    for pos in [0, stored / 2, stored - 1] {
                        let mut b = [0u8; 1];
                        tx.read_at(name, pos, &mut b).unwrap();
                        tx.write_at(name, pos, &[b[0] ^ 0x20]).unwrap();
                        let r = read_all(sch, &env, &f, tx);
                        proptest::prop_assert!(
                            matches!(&r, Err(e) if e.is_tampered()) || r.as_ref().ok() == Some(&want),
                            "{:?}: byte {} of {} flipped read as {:?}", id, pos, name, r.map(|v| v.len())
                        );
                        tx.write_at(name, pos, &b).unwrap();
                    }
                }
            }
        }
    }

    /// What [`held`] returns: trusted state, contents, `.d`, complete nodes, `.c`.
    type Held = (TreeState, Vec<u8>, Vec<u8>, Vec<Option<Hash>>, Vec<u8>);

    /// What a file holds in a fixture: its trusted state, its contents, and its objects'
    /// bytes (`.m` as the complete nodes of its tree, the only positions that are ever
    /// trusted, docs/file-format.md §8.2).
    fn held(sch: &dyn Scheme, env: &Env, f: &FileState, tx: &mut Tx) -> Held {
        let object = |tx: &mut Tx, name: &str| {
            let len = tx.len(name).unwrap().unwrap_or(0);
            let mut b = vec![0u8; len as usize];
            tx.read_at(name, 0, &mut b).unwrap();
            b
        };
        let mut io = Nodes::of(env, tx, f);
        let n = f.tree.leaves;
        let mut nodes = vec![ZERO_LEAF; stored_node_count(n) as usize];
        io.read_nodes(0, &mut nodes).unwrap();
        let nodes = (0..stored_node_count(n))
            .map(|at| crate::tree::is_complete_node(at, n).then_some(nodes[at as usize]))
            .collect();
        let contents = read_all(sch, env, f, tx).unwrap();
        (
            f.tree,
            contents,
            object(tx, &f.names.data),
            nodes,
            object(tx, &f.names.ctrs),
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// MT-EINT on a volume with inline trees (docs/file-format.md §4) against the same
        /// operations on volumes without them (and without inline leaves): after each one,
        /// the same trusted state (leaf count and root), contents, `.d`, `.c`, and tree
        /// nodes, read where each keeps them; a tree is in the record exactly when the rule
        /// says ([`InlineTags::fit`], GCM only), and `.m` then holds no byte. Trees cross
        /// six leaves and the counters' room both ways.
        #[test]
        fn inline_trees_change_only_where_the_tree_is_kept(ops in proptest::collection::vec(op(), 1..16)) {
            for id in [SchemeId::MtEintGcm, SchemeId::MtEintCbc] {
                let mut fxs: Vec<Fixture> = [(false, false), (true, false), (true, true)]
                    .into_iter()
                    .map(|(leaf, tree)| {
                        let mut fx = Fixture::new(256);
                        fx.inline_leaf = leaf;
                        fx.inline_tree = tree;
                        fx
                    })
                    .collect();
                let mut files: Vec<FileState> = fxs.iter_mut().map(|fx| fx.file(id)).collect();
                let sch = scheme(id);
                for (k, op) in ops.iter().enumerate() {
                    let mut seen = Vec::new();
                    for (fx, f) in fxs.iter_mut().zip(files.iter_mut()) {
                        let (env, tx) = fx.parts();
                        let bs = env.bs;
                        let n = f.blocks();
                        match *op {
                            Op::Write { at, count, seed } => {
                                let first = (at * (n + 1) as f64) as u64;
                                if first > n {
                                    sch.resize(&env, f, tx, first).unwrap();
                                }
                                let mut run: Vec<u8> = (0..count as usize * bs)
                                    .map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed))
                                    .collect();
                                sch.write_blocks(&env, f, tx, first, &mut run).unwrap();
                            }
                            Op::Resize { at } => {
                                sch.resize(&env, f, tx, (at * (n + 2) as f64) as u64).unwrap();
                            }
                            Op::Punch { at, count } => {
                                let first = (at * n as f64) as u64;
                                let count = count.min(n - first.min(n));
                                if count > 0 {
                                    sch.punch(&env, f, tx, first, count).unwrap();
                                }
                            }
                        }
                        let reloaded = reloaded(f, id);
                        proptest::prop_assert_eq!(
                            read_all(sch, &env, &reloaded, tx).unwrap(),
                            read_all(sch, &env, f, tx).unwrap()
                        );
                        seen.push(held(sch, &env, f, tx));
                        if k % 2 == 1 {
                            *f = reloaded;
                        }
                    }
                    proptest::prop_assert!(seen[0] == seen[1], "{:?}, op {}: inline leaf", id, k);
                    proptest::prop_assert!(seen[0] == seen[2], "{:?}, op {}: inline tree", id, k);
                    let f = &files[2];
                    let n = f.tree.leaves;
                    let fits = id == SchemeId::MtEintGcm && InlineTags::fit(n, f.ctrs.intervals());
                    proptest::prop_assert_eq!(f.tags.is_some(), fits, "{:?}, op {}", id, k);
                    proptest::prop_assert_eq!(f.inline.is_some(), n == 1, "{:?}, op {}", id, k);
                    let meta = fxs[2].tx.len(&f.names.meta).unwrap().unwrap_or(0);
                    if n <= 1 || fits {
                        proptest::prop_assert_eq!(meta, 0, "{:?}, op {}: .m while in the record", id, k);
                    } else {
                        proptest::prop_assert_eq!(meta, stored_node_count(n) * 32, "{:?}, op {}", id, k);
                    }
                }
            }
        }
    }

    /// A tree kept in the record that an extension makes large goes to `.m` before it
    /// grows (`Nodes::spill`): a hole of 2^30 blocks extends `.m` (sparse) instead of
    /// holding 2^31 nodes in memory.
    #[test]
    fn a_tree_in_the_record_extended_by_a_huge_hole_moves_to_its_object() {
        let mut fx = Fixture::new(256);
        fx.inline_leaf = true;
        fx.inline_tree = true;
        let mut f = fx.file(SchemeId::MtEintGcm);
        let (env, tx) = fx.parts();
        let sch = scheme(SchemeId::MtEintGcm);
        let mut run = vec![3u8; 2 * 256];
        sch.write_blocks(&env, &mut f, tx, 0, &mut run).unwrap();
        assert!(f.tags.is_some());
        sch.resize(&env, &mut f, tx, 1 << 30).unwrap();
        assert!(f.tags.is_none());
        assert_eq!(
            tx.len(&f.names.meta).unwrap(),
            Some(stored_node_count(1 << 30) * 32)
        );
        let mut out = vec![0u8; 3 * 256];
        sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
        assert_eq!(out[..512], [3u8; 512]);
        assert_eq!(out[512..], [0u8; 256]);
    }

    /// Leaves that move from `.m` into the record are checked against the trusted root
    /// first: a tampered leaf of a tree cut to fewer leaves is an integrity failure, not a
    /// leaf blessed into the record.
    #[test]
    fn leaves_moving_into_the_record_are_checked() {
        let mut fx = Fixture::with_cache(256, 0);
        fx.inline_leaf = true;
        fx.inline_tree = true;
        let mut f = fx.file(SchemeId::MtEintGcm);
        let (env, tx) = fx.parts();
        let sch = scheme(SchemeId::MtEintGcm);
        let mut run = vec![5u8; 9 * 256];
        sch.write_blocks(&env, &mut f, tx, 0, &mut run).unwrap();
        assert!(f.tags.is_none(), "nine leaves are in .m");
        // Leaf 3 (flat 6), which a cut to four leaves keeps but does not read on its path.
        let mut b = [0u8; 1];
        tx.read_at(&f.names.meta, 6 * 32, &mut b).unwrap();
        tx.write_at(&f.names.meta, 6 * 32, &[b[0] ^ 1]).unwrap();
        let e = sch.resize(&env, &mut f, tx, 4).unwrap_err();
        assert!(e.is_tampered(), "{e}");
        // Put back, the same cut keeps the leaves in the record, and they read.
        tx.write_at(&f.names.meta, 6 * 32, &b).unwrap();
        let mut f = fx.file(SchemeId::MtEintGcm);
        let (env, tx) = fx.parts();
        let mut run = vec![5u8; 9 * 256];
        sch.write_blocks(&env, &mut f, tx, 0, &mut run).unwrap();
        sch.resize(&env, &mut f, tx, 4).unwrap();
        assert!(f.tags.is_some());
        assert_eq!(tx.len(&f.names.meta).unwrap().unwrap_or(0), 0);
        assert_eq!(read_all(sch, &env, &f, tx).unwrap(), vec![5u8; 4 * 256]);
    }

    /// A file's state as read back from its record (of scheme `id`): the trusted state
    /// alone, RTree's index not loaded.
    fn reloaded(f: &FileState, id: SchemeId) -> FileState {
        FileState {
            subject: f.subject.clone(),
            id: f.id,
            names: ObjectNames::of(&f.id),
            keys: Arc::new(FileKeys::new(Arc::new(super::fixture::master()), &f.id)),
            tree: f.tree,
            ctrs: f.ctrs.clone(),
            ctr_hw: f.ctr_hw,
            rtree: RTreeIndex::for_scheme(id),
            inline: f.inline,
            inline_mac: f.inline_mac,
            tags: f.tags,
        }
    }

    /// `aead` fills a gap with encrypted zeros (it has no trusted counters to say which
    /// blocks are holes), up to [`AEAD_MAX_GAP`] blocks at once: one more is refused and
    /// changes nothing.
    #[test]
    fn aead_fills_gaps_up_to_its_limit() {
        let mut fx = Fixture::new(16);
        let mut f = fx.file(SchemeId::Aead);
        let (env, tx) = fx.parts();
        let sch = scheme(SchemeId::Aead);
        let mut two = [5u8; 32];
        sch.write_blocks(&env, &mut f, tx, 0, &mut two).unwrap();
        let r = sch.resize(&env, &mut f, tx, 2 + AEAD_MAX_GAP + 1);
        assert!(too_large(r), "one block more than the limit");
        assert_eq!(f.blocks(), 2);
        sch.resize(&env, &mut f, tx, 2 + AEAD_MAX_GAP).unwrap();
        assert_eq!(f.blocks(), 2 + AEAD_MAX_GAP);
        let mut out = [1u8; 48];
        sch.read_blocks(&env, &f, tx, 1, &mut out).unwrap();
        assert_eq!(out[..16], [5u8; 16]);
        assert_eq!(out[16..], [0u8; 32]);
        sch.read_blocks(&env, &f, tx, 1 + AEAD_MAX_GAP, &mut out[..16])
            .unwrap();
        assert_eq!(out[..16], [0u8; 16]);
    }

    /// The counter rule of MT-EINT (and of every scheme on counter intervals): a new
    /// counter is above every counter the run's blocks had and above every deleted block's
    /// (`ctr_hw`), so a block cut off and written again never reuses a nonce (Oprea–Reiter
    /// 2006, §4.2: counters never go back).
    #[test]
    fn a_block_written_again_after_a_cut_takes_a_new_counter() {
        for id in [SchemeId::MtEintGcm, SchemeId::None, SchemeId::RandEint] {
            let mut fx = Fixture::new(64);
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            sch.write_blocks(&env, &mut f, tx, 0, &mut [1u8; 128])
                .unwrap();
            sch.write_blocks(&env, &mut f, tx, 1, &mut [2u8; 64])
                .unwrap();
            assert_eq!((f.ctrs.get(0), f.ctrs.get(1)), (1, 2), "{id:?}");
            sch.resize(&env, &mut f, tx, 0).unwrap();
            assert_eq!(f.ctr_hw, 2, "{id:?}: the highest counter cut off");
            sch.write_blocks(&env, &mut f, tx, 0, &mut [3u8; 64])
                .unwrap();
            assert_eq!(f.ctrs.get(0), 3, "{id:?}");
        }
    }

    /// Twin blocks, by hand: appends get even counters and go to `.d`; an overwrite of a
    /// block in `.d` gets an odd counter and goes directly to `.t` (the block's `.d` bytes
    /// untouched); written again before a checkpoint, it stays in `.t` under an odd counter,
    /// staged; a run over blocks of both slots is split at the slot boundary; a file of
    /// one block stays in `.d`. A large run's plan takes the parity of the slot it will go
    /// to, and a run partly past the end has none.
    #[test]
    fn overwrites_alternate_between_the_twin_slots() {
        let bs = 64;
        let mut fx = Fixture::new(bs);
        fx.twins = true;
        let mut f = fx.file(SchemeId::MtEintGcm);
        let (env, tx) = fx.parts();
        let sch = scheme(SchemeId::MtEintGcm);
        sch.write_blocks(&env, &mut f, tx, 0, &mut [1u8; 8 * 64])
            .unwrap();
        assert_eq!(f.ctrs.get(0) % 2, 0, "appended under an even counter");
        let store = tx.store().clone();
        // Sealed: the file's bytes are committed.
        fixture::commit(tx);
        // Each write a request of its own: its direct writes are logged after it.
        tx.capture(true);
        let d_before = store.read_all(&f.names.data).unwrap().unwrap();
        assert_eq!(d_before.len(), 8 * bs);
        assert!(store.len(&f.names.twin).unwrap().is_none());

        sch.write_blocks(&env, &mut f, tx, 3, &mut [2u8; 64])
            .unwrap();
        tx.drain();
        assert_eq!(f.ctrs.get(3) % 2, 1, "an overwrite goes to the twin");
        assert_eq!(store.len(&f.names.twin).unwrap(), Some(4 * bs as u64));
        assert_eq!(store.read_all(&f.names.data).unwrap().unwrap(), d_before);
        assert_eq!(tx.len(&f.names.data).unwrap(), Some(8 * bs as u64));
        let staged = tx.overlay_bytes();

        let c3 = f.ctrs.get(3);
        let t_now = store.read_all(&f.names.twin).unwrap().unwrap();
        sch.write_blocks(&env, &mut f, tx, 3, &mut [3u8; 64])
            .unwrap();
        tx.drain();
        assert!(
            f.ctrs.get(3) > c3 && f.ctrs.get(3).is_multiple_of(2),
            "back to `.d`"
        );
        assert!(
            tx.overlay_bytes() >= staged + bs,
            "staged, since `.t` was written"
        );
        assert_eq!(store.read_all(&f.names.twin).unwrap().unwrap(), t_now);
        assert_eq!(store.read_all(&f.names.data).unwrap().unwrap(), d_before);

        // Blocks 2..5, all in `.d` now: to the twin, directly but for block 3 (written
        // since the checkpoint: staged there).
        let mut run: Vec<u8> = (0..3 * bs).map(|i| i as u8).collect();
        sch.write_blocks(&env, &mut f, tx, 2, &mut run.clone())
            .unwrap();
        tx.drain();
        assert_eq!(
            [2, 3, 4].map(|b| f.ctrs.get(b) % 2),
            [1, 1, 1],
            "every block of the run in the twin"
        );
        assert_eq!(
            store.read_all(&f.names.twin).unwrap().unwrap()[3 * bs..4 * bs],
            t_now[3 * bs..4 * bs],
            "block 3 staged, not written over"
        );
        let mut model = vec![1u8; 8 * bs];
        model[2 * bs..5 * bs].copy_from_slice(&run);
        let mut out = vec![0u8; 8 * bs];
        sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
        assert!(out == model);
        run.fill(9);

        // Planned runs: the other slot's parity over blocks of one slot, none when partly
        // past the end.
        let plan = sch.seal_plan(&env, &f, 5, 3).unwrap().unwrap();
        assert_eq!(plan.ctr % 2, 1);
        let plan = sch.seal_plan(&env, &f, 2, 3).unwrap().unwrap();
        assert_eq!(plan.ctr % 2, 0);
        assert!(sch.seal_plan(&env, &f, 6, 4).unwrap().is_none());
        assert_eq!(sch.seal_plan(&env, &f, 8, 4).unwrap().unwrap().ctr % 2, 0);

        // One block: stays in `.d`.
        let mut g = fx.file(SchemeId::MtEintGcm);
        g.id = [9; 16];
        g.names = ObjectNames::of(&g.id);
        let (env, tx) = fx.parts();
        sch.write_blocks(&env, &mut g, tx, 0, &mut [1u8; 64])
            .unwrap();
        sch.write_blocks(&env, &mut g, tx, 0, &mut [2u8; 64])
            .unwrap();
        assert_eq!(g.ctrs.get(0) % 2, 0);
        assert!(tx.len(&g.names.twin).unwrap().is_none());
    }

    /// A hole punched in a block whose durable version is in `.t` (its counter now 0, which
    /// names `.d`) counts as written: the next write of the block is staged, not written
    /// over the durable version in `.t`. And the slot a run goes to: the one most of its
    /// blocks are not in for a file kept in objects, the one most are in otherwise.
    #[test]
    fn a_hole_keeps_the_durable_slot_until_the_checkpoint() {
        assert!(MtEint::twin_parity(true, &[false, false, true]));
        assert!(!MtEint::twin_parity(true, &[true, true, false]));
        assert!(MtEint::twin_parity(false, &[true, true, false]));
        assert!(!MtEint::twin_parity(false, &[false, false, true]));
        let bs = 64;
        let mut fx = Fixture::new(bs);
        fx.twins = true;
        let mut f = fx.file(SchemeId::MtEintGcm);
        let (env, tx) = fx.parts();
        let sch = scheme(SchemeId::MtEintGcm);
        let seal = fixture::commit;
        sch.write_blocks(&env, &mut f, tx, 0, &mut [1u8; 8 * 64])
            .unwrap();
        seal(tx);
        sch.write_blocks(&env, &mut f, tx, 2, &mut [2u8; 64])
            .unwrap();
        assert_eq!(f.ctrs.get(2) % 2, 1);
        seal(tx);
        let twin = tx.store().read_all(&f.names.twin).unwrap().unwrap();
        assert!(sch.punch(&env, &mut f, tx, 2, 1).unwrap());
        assert_eq!(f.ctrs.get(2), 0);
        sch.write_blocks(&env, &mut f, tx, 2, &mut [3u8; 64])
            .unwrap();
        assert_eq!(f.ctrs.get(2) % 2, 1, "to the twin, staged");
        assert_eq!(tx.store().read_all(&f.names.twin).unwrap().unwrap(), twin);
        let mut out = vec![0u8; 3 * bs];
        sch.read_blocks(&env, &f, tx, 1, &mut out).unwrap();
        assert!(out[..bs] == [1u8; 64] && out[bs..2 * bs] == [3u8; 64]);
    }

    /// A Merkle tree cut to one leaf on a volume with inline leaves keeps its only node in
    /// the record, and nothing in its node object (no stale nodes left in the store).
    #[test]
    fn a_tree_cut_to_one_leaf_empties_its_node_object() {
        let mut fx = Fixture::new(64);
        fx.inline_leaf = true;
        let mut f = fx.file(SchemeId::MtEintGcm);
        let (env, tx) = fx.parts();
        let sch = scheme(SchemeId::MtEintGcm);
        let mut four: Vec<u8> = (0..=255).collect();
        sch.write_blocks(&env, &mut f, tx, 0, &mut four).unwrap();
        assert!(f.inline.is_none());
        assert!(tx.len(&f.names.meta).unwrap().unwrap() > 0);
        sch.resize(&env, &mut f, tx, 1).unwrap();
        assert!(f.inline.is_some(), "one leaf: its node in the record");
        assert_eq!(tx.len(&f.names.meta).unwrap(), Some(0));
        let mut out = [0u8; 64];
        sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
        assert_eq!(out[..], (0..64).collect::<Vec<u8>>()[..]);
    }

    /// A read of one block of MT-EINT reads its leaf and the siblings of its path a window
    /// of 128 nodes (64 leaves) at a time, not a node at a time: in a tree of 256 leaves
    /// without a node cache, block 77's leaf (flat 154) and its siblings up to six levels
    /// are in the window [128, 256), the seventh level's sibling (flat 63, leaves 0–63) in
    /// [0, 128) and the eighth's (flat 383, leaves 128–255) in [256, 384): three reads of
    /// `.m`, where a node at a time took nine. Each of those siblings altered in the store
    /// still fails the read.
    #[test]
    fn a_block_read_fetches_its_path_a_window_at_a_time() {
        use crate::store::{CountingStore, MemStore, ObjectClass};
        let id = SchemeId::MtEintGcm;
        let mut fx = Fixture::with_cache(64, 0);
        let store = Arc::new(CountingStore::new(MemStore::new()));
        fx.tx = Tx::new(store.clone());
        let mut f = fx.file(id);
        let (env, tx) = fx.parts();
        let sch = scheme(id);
        let data: Vec<u8> = (0..256 * 64).map(|i| (i * 7 % 251) as u8).collect();
        sch.write_blocks(&env, &mut f, tx, 0, &mut data.clone())
            .unwrap();
        fixture::commit(tx);
        let before = store.stats();
        let mut out = [0u8; 64];
        sch.read_blocks(&env, &f, tx, 77, &mut out).unwrap();
        assert_eq!(out[..], data[77 * 64..78 * 64]);
        let reads = store
            .stats()
            .since(&before)
            .get(ObjectClass::Integrity)
            .reads;
        assert_eq!(reads, 3, "reads of the node object");
        // The path's siblings: levels 0 to 7 (flat indices in the in-order layout).
        let siblings = [152u64, 157, 147, 135, 175, 223, 63, 383];
        for flat in siblings {
            let mut b = [0u8; 1];
            tx.read_at(&f.names.meta, flat * 32, &mut b).unwrap();
            tx.write_at(&f.names.meta, flat * 32, &[b[0] ^ 1]).unwrap();
            fixture::commit(tx);
            let r = sch.read_blocks(&env, &f, tx, 77, &mut out);
            assert!(
                matches!(
                    r,
                    Err(Error::Tampered {
                        block: Some(77),
                        ..
                    })
                ),
                "sibling at flat {flat} altered: {r:?}"
            );
            tx.write_at(&f.names.meta, flat * 32, &b).unwrap();
            fixture::commit(tx);
        }
        sch.read_blocks(&env, &f, tx, 77, &mut out).unwrap();
        assert_eq!(out[..], data[77 * 64..78 * 64]);
        // A run whose leaves cross a window's edge (flats 248 to 266, around 256) is read
        // as it is, not from one window.
        let mut run = vec![0u8; 10 * 64];
        sch.read_blocks(&env, &f, tx, 124, &mut run).unwrap();
        assert_eq!(run[..], data[124 * 64..134 * 64]);
    }

    /// A read of a run that fails names a block of the run whose own read fails too, and
    /// returns nothing unverified. Each stored node of an MT-EINT file in turn is altered (a
    /// run of 3 blocks read from block 2, no node cache, so every read verifies from the
    /// store): a leaf fails its block's authentication, an inner node the Merkle path of
    /// the blocks under it.
    #[test]
    fn a_failed_run_names_a_block_of_it_that_fails() {
        for id in [SchemeId::MtEintGcm, SchemeId::MtEintCbc] {
            let mut fx = Fixture::with_cache(64, 0);
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            let mut data: Vec<u8> = (0..8 * 64).map(|i| (i % 253) as u8).collect();
            sch.write_blocks(&env, &mut f, tx, 0, &mut data).unwrap();
            let len = tx.len(&f.names.meta).unwrap().unwrap();
            let mut named = 0;
            for pos in (0..len).step_by(32) {
                let mut b = [0u8; 1];
                tx.read_at(&f.names.meta, pos, &mut b).unwrap();
                tx.write_at(&f.names.meta, pos, &[b[0] ^ 1]).unwrap();
                let mut out = vec![0u8; 3 * 64];
                if let Err(Error::Tampered { block, what, .. }) =
                    sch.read_blocks(&env, &f, tx, 2, &mut out)
                {
                    let b = block.expect("a block is named");
                    assert!(
                        (2..5).contains(&b),
                        "{id:?}: node at {pos}: block {b} ({what})"
                    );
                    assert!(out.iter().all(|&x| x == 0), "nothing unverified returned");
                    let r = sch.read_blocks(&env, &f, tx, b, &mut out[..64]);
                    assert!(
                        r.is_err(),
                        "{id:?}: node at {pos}: block {b} ({what}) reads alone"
                    );
                    named += 1;
                }
                tx.write_at(&f.names.meta, pos, &b).unwrap();
            }
            assert!(named > 0, "{id:?}: some node altered fails the run");
        }
    }

    /// No block is ever encrypted twice under one counter (one nonce): the same plaintext
    /// (zeros) written again and again to the same blocks, through rewrites, cuts,
    /// extensions over kept counters and punches, never stores the same bytes at a block
    /// twice. Under a repeated (block, counter) pair it would (every scheme's encryption is
    /// deterministic in the pair), and two ciphertexts under one keystream give away the
    /// XOR of their plaintexts.
    #[test]
    fn no_block_is_encrypted_twice_under_one_counter() {
        use std::collections::HashSet;
        for id in SchemeId::ALL {
            if id == SchemeId::Aead {
                continue; // random nonces, no counters
            }
            let mut fx = Fixture::new(64);
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            let mut seen: HashSet<(u64, Vec<u8>)> = HashSet::new();
            let mut write = |f: &mut FileState, tx: &mut Tx, first: u64, count: u64| {
                if first > f.blocks() {
                    sch.resize(&env, f, tx, first).unwrap();
                }
                let mut zeros = vec![0u8; count as usize * 64];
                sch.write_blocks(&env, f, tx, first, &mut zeros).unwrap();
                for i in first..first + count {
                    let mut stored = vec![0u8; 64];
                    tx.read_at(&f.names.data, i * 64, &mut stored).unwrap();
                    assert!(
                        seen.insert((i, stored)),
                        "{id:?}: block {i} stored the same bytes twice"
                    );
                }
            };
            write(&mut f, tx, 0, 4);
            write(&mut f, tx, 2, 1);
            write(&mut f, tx, 1, 2);
            sch.resize(&env, &mut f, tx, 1).unwrap();
            sch.resize(&env, &mut f, tx, 4).unwrap();
            write(&mut f, tx, 2, 1);
            write(&mut f, tx, 1, 3);
            sch.resize(&env, &mut f, tx, 0).unwrap();
            write(&mut f, tx, 0, 4);
            sch.punch(&env, &mut f, tx, 1, 2).unwrap();
            write(&mut f, tx, 1, 1);
            write(&mut f, tx, 2, 2);
            sch.resize(&env, &mut f, tx, 2).unwrap();
            write(&mut f, tx, 3, 1);
            write(&mut f, tx, 2, 2);
        }
    }

    /// RTree's leaves are read back in chunks of 65,536 nodes: a file with more random
    /// blocks than one chunk holds (33,000 leaves, 65,999 nodes) reads back whole from its
    /// trusted state, under RAND-EINT and COMP-EINT.
    #[test]
    fn an_rtree_of_more_than_one_read_chunk_reads_back() {
        const BLOCKS: usize = 33_000;
        for id in [SchemeId::RandEint, SchemeId::CompEint] {
            let mut fx = Fixture::new(64);
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            let data = random_bytes(0x9e37_79b9_7f4a_7c15u64, BLOCKS * 64);
            sch.write_blocks(&env, &mut f, tx, 0, &mut data.clone())
                .unwrap();
            assert!(f.tree.leaves > 32_768, "{id:?}: {} leaves", f.tree.leaves);
            let mut reloaded = reloaded(&f, id);
            let mut out = vec![0u8; 64];
            for i in [0, BLOCKS / 2, BLOCKS - 1] {
                sch.read_blocks(&env, &reloaded, tx, i as u64, &mut out)
                    .unwrap();
                assert_eq!(out, data[i * 64..(i + 1) * 64], "{id:?}: block {i}");
            }
            // A write verifies every stored leaf against the root (read in chunks too).
            let block = random_bytes(7, 64);
            sch.write_blocks(&env, &mut reloaded, tx, 1, &mut block.clone())
                .unwrap();
            sch.read_blocks(&env, &reloaded, tx, 1, &mut out).unwrap();
            assert_eq!(out, block, "{id:?}");
        }
    }

    /// Under RAND-EINT a failed read names the lowest bad block of the run, whether the
    /// block failed the entropy test (a low-entropy block altered decrypts to random bytes
    /// that no RTree leaf accounts for) or its RTree leaf (a random block altered): block 1
    /// altered of the first kind, block 3 of the second, in a run of blocks 0 to 3.
    #[test]
    fn rand_eint_names_the_lowest_bad_block() {
        let mut fx = Fixture::new(256);
        let mut f = fx.file(SchemeId::RandEint);
        let (env, tx) = fx.parts();
        let sch = scheme(SchemeId::RandEint);
        let mut data = vec![0u8; 2 * 256];
        data.extend(random_bytes(0x2545_f491_4f6c_dd1d, 2 * 256));
        sch.write_blocks(&env, &mut f, tx, 0, &mut data.clone())
            .unwrap();
        assert_eq!(
            f.tree.leaves, 2,
            "blocks 2 and 3 are random: two RTree leaves"
        );
        for i in [1u64, 3] {
            let mut b = [0u8; 1];
            tx.read_at(&f.names.data, i * 256 + 5, &mut b).unwrap();
            tx.write_at(&f.names.data, i * 256 + 5, &[b[0] ^ 0x40])
                .unwrap();
        }
        let mut out = vec![0u8; 4 * 256];
        match sch.read_blocks(&env, &f, tx, 0, &mut out) {
            Err(Error::Tampered { block, .. }) => assert_eq!(block, Some(1)),
            other => panic!("{other:?}"),
        }
        let mut one = vec![0u8; 256];
        match sch.read_blocks(&env, &f, tx, 2, &mut one) {
            Ok(()) => assert_eq!(one, data[2 * 256..3 * 256]),
            other => panic!("block 2 is intact: {other:?}"),
        }
    }

    /// A session's counters stay inside its reservation (below [`Env::ctr_limit`], which
    /// the anchor records before any is used): past it a write is refused and changes
    /// nothing, instead of taking a counter that the next session may take again.
    #[test]
    fn no_counter_at_or_past_the_session_limit() {
        for id in SchemeId::ALL {
            if id == SchemeId::Aead {
                continue;
            }
            let mut fx = Fixture::new(64);
            fx.ctr_limit = 3;
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            sch.write_blocks(&env, &mut f, tx, 0, &mut [1u8; 64])
                .unwrap();
            sch.write_blocks(&env, &mut f, tx, 0, &mut [2u8; 64])
                .unwrap();
            let r = sch.write_blocks(&env, &mut f, tx, 0, &mut [3u8; 64]);
            assert!(r.is_err(), "{id:?}: counter 3 taken");
            let mut out = [0u8; 64];
            sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
            assert_eq!(out, [2u8; 64], "{id:?}");
        }
    }

    /// A MAC tree cut and extended twice over the same kept counters reads zeros there
    /// (the hole mark set once stays set), and a block written there afterwards takes a
    /// counter above the kept one.
    #[test]
    fn mac_tree_extended_twice_over_kept_counters_reads_holes() {
        let mut fx = Fixture::new(64);
        let mut f = fx.file(SchemeId::MacTree);
        let (env, tx) = fx.parts();
        let sch = scheme(SchemeId::MacTree);
        let data: Vec<u8> = (0..=255).collect();
        sch.write_blocks(&env, &mut f, tx, 0, &mut data.clone())
            .unwrap();
        for _ in 0..2 {
            sch.resize(&env, &mut f, tx, 1).unwrap();
            sch.resize(&env, &mut f, tx, 4).unwrap();
            let mut out = vec![1u8; 256];
            sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
            assert_eq!(out[..64], data[..64]);
            assert!(out[64..].iter().all(|&b| b == 0));
        }
        let mut zeros = vec![0u8; 64];
        sch.write_blocks(&env, &mut f, tx, 2, &mut zeros).unwrap();
        let mut stored = vec![0u8; 64];
        tx.read_at(&f.names.data, 128, &mut stored).unwrap();
        let mut again = vec![0u8; 64];
        sch.write_blocks(&env, &mut f, tx, 2, &mut again).unwrap();
        let mut stored2 = vec![0u8; 64];
        tx.read_at(&f.names.data, 128, &mut stored2).unwrap();
        assert_ne!(stored, stored2, "a new counter each time");
    }

    /// A `mac-tree` file of one leaf counter keeps its level 0 in the record (on a volume
    /// with inline `mac-tree` leaves), and nothing else differs: the same sequence of
    /// writes, truncations, hole extensions and growth past one counter (next to the
    /// first, and far away, deepening the tree) gives the same trusted state, the same
    /// `.d` and `.c` bytes, and the same `.m` bytes once the tree has left the record, as on
    /// a volume without it. While inline, `.m` has no bytes.
    #[test]
    fn mac_tree_level_0_in_the_record_changes_only_where_it_is_kept() {
        let write = |at: u64, fill: u8| {
            move |sch: &dyn Scheme, env: &Env, f: &mut FileState, tx: &mut Tx| {
                let mut d = vec![fill; 64];
                sch.write_blocks(env, f, tx, at, &mut d).unwrap();
            }
        };
        type Op = Box<dyn Fn(&dyn Scheme, &Env, &mut FileState, &mut Tx)>;
        let runs: [(&str, Vec<Op>, u64); 3] = [
            (
                "grows next to block 0",
                vec![
                    Box::new(write(0, 1)),
                    Box::new(write(0, 2)),
                    Box::new(
                        |sch: &dyn Scheme, env: &Env, f: &mut FileState, tx: &mut Tx| {
                            sch.resize(env, f, tx, 0).unwrap();
                            sch.resize(env, f, tx, 1).unwrap();
                        },
                    ),
                    Box::new(write(0, 3)),
                    Box::new(write(1, 4)),
                    Box::new(write(0, 5)),
                ],
                4,
            ),
            (
                "grows far away",
                vec![
                    Box::new(write(0, 6)),
                    Box::new(
                        |sch: &dyn Scheme, env: &Env, f: &mut FileState, tx: &mut Tx| {
                            sch.resize(env, f, tx, 200).unwrap();
                            let mut d = vec![7u8; 64];
                            sch.write_blocks(env, f, tx, 200, &mut d).unwrap();
                        },
                    ),
                ],
                1,
            ),
            (
                "starts past a hole",
                vec![
                    Box::new(
                        |sch: &dyn Scheme, env: &Env, f: &mut FileState, tx: &mut Tx| {
                            sch.resize(env, f, tx, 3).unwrap();
                        },
                    ),
                    Box::new(write(2, 8)),
                ],
                0,
            ),
        ];
        for (what, ops, inline_steps) in runs {
            let mut states = Vec::new();
            for inline in [false, true] {
                let mut fx = Fixture::new(64);
                fx.inline_mac = inline;
                let mut f = fx.file(SchemeId::MacTree);
                let (env, tx) = fx.parts();
                let sch = scheme(SchemeId::MacTree);
                let mut seen = Vec::new();
                for (k, op) in ops.iter().enumerate() {
                    op(sch, &env, &mut f, tx);
                    let m = MacTreeState::decode(&f.tree.root).unwrap().m;
                    let meta = tx.len(&f.names.meta).unwrap().unwrap_or(0);
                    if inline && (k as u64) < inline_steps {
                        assert_eq!(m, 1, "{what}, step {k}");
                        assert!(f.inline_mac.is_some(), "{what}, step {k}");
                        assert_eq!(meta, 0, "{what}, step {k}: no .m while inline");
                    } else {
                        assert!(f.inline_mac.is_none(), "{what}, step {k}");
                    }
                    let mut out = vec![0u8; 64 * f.tree.leaves as usize];
                    sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
                    let mut objects = Vec::new();
                    for name in [&f.names.data, &f.names.meta, &f.names.ctrs] {
                        let len = tx.len(name).unwrap().unwrap_or(0);
                        let mut b = vec![0u8; len as usize];
                        tx.read_at(name, 0, &mut b).unwrap();
                        objects.push(b);
                    }
                    if f.inline_mac.is_some() {
                        objects[1].clear();
                    }
                    seen.push((f.tree, f.inline_mac.is_some(), out, objects));
                }
                states.push(seen);
            }
            for (k, (a, b)) in states[0].iter().zip(&states[1]).enumerate() {
                assert_eq!(a.0, b.0, "{what}, step {k}: trusted state");
                assert_eq!(a.2, b.2, "{what}, step {k}: contents");
                assert_eq!(a.3[0], b.3[0], "{what}, step {k}: .d");
                assert_eq!(a.3[2], b.3[2], "{what}, step {k}: .c");
                if !b.1 {
                    assert_eq!(a.3[1], b.3[1], "{what}, step {k}: .m");
                }
            }
        }
    }

    /// RTree leaves that are not neighbours in RArr are verified as separate runs: blocks
    /// 0 and 2 random, block 1 rewritten with zeros (its leaf deleted, the last leaf moved
    /// into its place), read together. And an altered inner node of RTree (odd node
    /// indices) fails the read naming the block whose path it is on, not a leaf position
    /// (no node cache: every read verifies from the store).
    #[test]
    fn rtree_runs_and_inner_nodes() {
        for id in [SchemeId::RandEint, SchemeId::CompEint] {
            let mut fx = Fixture::with_cache(256, 0);
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            let mut data = random_bytes(0x5851_f42d_4c95_7f2du64, 4 * 256);
            sch.write_blocks(&env, &mut f, tx, 0, &mut data.clone())
                .unwrap();
            assert_eq!(f.tree.leaves, 4, "{id:?}");
            data[256..512].fill(0);
            sch.write_blocks(&env, &mut f, tx, 1, &mut vec![0u8; 256])
                .unwrap();
            assert_eq!(f.tree.leaves, 3, "{id:?}");
            let mut out = vec![0u8; 3 * 256];
            sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
            assert_eq!(out, data[..3 * 256], "{id:?}");
            // Node 1 is inner (leaves sit at even indices).
            let mut b = [0u8; 1];
            tx.read_at(&f.names.meta, 32, &mut b).unwrap();
            tx.write_at(&f.names.meta, 32, &[b[0] ^ 1]).unwrap();
            match sch.read_blocks(&env, &f, tx, 0, &mut out) {
                Err(Error::Tampered { block, .. }) => {
                    // Node 1 (over positions 0 and 1) is a sibling on the path of
                    // position 2 only, which is block 2's leaf.
                    assert_eq!(block, Some(2), "{id:?}")
                }
                other => panic!("{id:?}: {other:?}"),
            }
        }
    }

    /// RTree's leaf positions follow the order in which blocks got a leaf, not the block
    /// numbers. Here blocks 0–4 sit at positions 0–4, block 7 at 5 and block 5 at 6 (it got
    /// its leaf last). A write of blocks 3–5 then updates positions 3, 4 and 6: two runs,
    /// never one run 3–5 (which would put block 5's leaf over block 7's). And a bad sibling
    /// on block 7's path names block 7, not its position 5.
    #[test]
    fn rtree_positions_that_are_not_block_numbers() {
        for id in [SchemeId::RandEint, SchemeId::CompEint] {
            let bs = 256;
            let mut fx = Fixture::with_cache(bs, 0);
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            // Random blocks get a leaf; zero blocks (low entropy, compressible) do not.
            let mut data = random_bytes(0x9e37_79b9_7f4a_7c15, 8 * bs);
            data[5 * bs..7 * bs].fill(0);
            sch.write_blocks(&env, &mut f, tx, 0, &mut data.clone())
                .unwrap();
            let five = random_bytes(0x2545_f491_4f6c_dd1d, bs);
            data[5 * bs..6 * bs].copy_from_slice(&five);
            sch.write_blocks(&env, &mut f, tx, 5, &mut five.clone())
                .unwrap();
            assert_eq!(f.tree.leaves, 7, "{id:?}");
            let new = random_bytes(0xd1b5_4a32_d192_ed03, 3 * bs);
            data[3 * bs..6 * bs].copy_from_slice(&new);
            sch.write_blocks(&env, &mut f, tx, 3, &mut new.clone())
                .unwrap();
            assert_eq!(f.tree.leaves, 7, "{id:?}");
            let mut out = vec![0u8; 8 * bs];
            sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
            assert_eq!(out, data, "{id:?}");
            // Position 4's stored leaf (flat index 8) is the sibling on position 5's path.
            let mut b = [0u8; 1];
            tx.read_at(&f.names.meta, 8 * 32, &mut b).unwrap();
            tx.write_at(&f.names.meta, 8 * 32, &[b[0] ^ 1]).unwrap();
            let mut one = vec![0u8; bs];
            match sch.read_blocks(&env, &f, tx, 7, &mut one) {
                Err(Error::Tampered { block, .. }) => assert_eq!(block, Some(7), "{id:?}"),
                other => panic!("{id:?}: {other:?}"),
            }
        }
    }

    /// A write may start at the file's end (an append) but not past it: the gap must be
    /// made first ([`Scheme::resize`]), so that no scheme stores a block whose predecessors
    /// it never accounted for. Refused with a clear error, not written.
    #[test]
    fn a_write_past_the_end_is_refused() {
        for id in SchemeId::ALL {
            let mut fx = Fixture::new(512);
            let mut f = fx.file(id);
            let (env, tx) = fx.parts();
            let sch = scheme(id);
            let mut block = vec![3u8; env.bs];
            sch.write_blocks(&env, &mut f, tx, 0, &mut block).unwrap();
            let mut block = vec![4u8; env.bs];
            let r = sch.write_blocks(&env, &mut f, tx, 2, &mut block);
            assert!(matches!(r, Err(Error::Invalid(_))), "{id:?}: {r:?}");
            assert_eq!(f.blocks(), 1, "{id:?}");
            let mut out = vec![0u8; env.bs];
            sch.read_blocks(&env, &f, tx, 0, &mut out).unwrap();
            assert_eq!(out, vec![3u8; env.bs], "{id:?}");
        }
    }

    /// Stores `data` at `first` the way the volume does for a large write: plans with the
    /// state, seals without it, stores with it. Returns what [`Scheme::write_sealed`] said.
    fn write_in_three(
        sch: &dyn Scheme,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        data: &[u8],
    ) -> bool {
        let plan = sch
            .seal_plan(env, f, first, (data.len() / env.bs) as u64)
            .unwrap()
            .expect("mt-eint plans");
        let mut ct = data.to_vec();
        let leaves = sch.seal_run(env, &plan, &mut ct);
        sch.write_sealed(env, f, tx, &plan, &ct, &leaves).unwrap()
    }

    /// A run sealed without the file's state (docs/design.md, "Writes sealed without the
    /// engine lock") is stored exactly as [`Scheme::write_blocks`] stores it: the same
    /// counters, root, tree nodes and ciphertext, for an append, an overwrite, a run that
    /// does both and a file of one block (its node inline), in both modes of MT-EINT.
    #[test]
    fn a_run_sealed_in_three_steps_is_stored_as_write_blocks_stores_it() {
        for id in [SchemeId::MtEintGcm, SchemeId::MtEintCbc] {
            for inline in [false, true] {
                let sch = scheme(id);
                let (mut a, mut b) = (Fixture::new(64), Fixture::new(64));
                a.inline_leaf = inline;
                b.inline_leaf = inline;
                let (mut fa, mut fb) = (a.file(id), b.file(id));
                let runs: [(u64, usize, u8); 5] =
                    [(0, 1, 1), (0, 3, 2), (1, 4, 3), (5, 2, 4), (2, 1, 5)];
                for (first, blocks, byte) in runs {
                    let data = random_bytes(byte as u64, blocks * 64);
                    let (env, tx) = a.parts();
                    sch.write_blocks(&env, &mut fa, tx, first, &mut data.clone())
                        .unwrap();
                    let (env, tx) = b.parts();
                    assert!(
                        write_in_three(sch, &env, &mut fb, tx, first, &data),
                        "{id:?}: a fresh plan is stored"
                    );
                    let what = format!("{id:?}, inline {inline}, run at {first}");
                    assert_eq!(fa.tree, fb.tree, "{what}");
                    assert_eq!(fa.ctrs, fb.ctrs, "{what}");
                    assert_eq!(fa.inline, fb.inline, "{what}");
                    for name in [&fa.names.data, &fa.names.meta] {
                        let la = a.tx.len(name).unwrap();
                        assert_eq!(la, b.tx.len(name).unwrap(), "{what}: {name}");
                        let mut ba = vec![0u8; la.unwrap_or(0) as usize];
                        let mut bb = ba.clone();
                        a.tx.read_at(name, 0, &mut ba).unwrap();
                        b.tx.read_at(name, 0, &mut bb).unwrap();
                        assert_eq!(ba, bb, "{what}: {name}");
                    }
                }
                // Measured alike: the blocks written and the bytes of data and integrity.
                let (ma, mb) = (a.metrics().file(&fa.id), b.metrics().file(&fb.id));
                assert_eq!(mb.blocks_written, 1 + 3 + 4 + 2 + 1);
                assert_eq!(
                    (ma.blocks_written, ma.data, ma.integrity),
                    (mb.blocks_written, mb.data, mb.integrity)
                );
                let (env, tx) = b.parts();
                let (env_a, tx_a) = a.parts();
                assert_eq!(
                    read_all(sch, &env, &fb, tx).unwrap(),
                    read_all(sch, &env_a, &fa, tx_a).unwrap()
                );
            }
        }
    }

    /// Runs written together (`write_runs`: MT-EINT updates its tree once for all) leave
    /// the file as the runs written one by one do, in every scheme, with and without twin
    /// blocks: the same tree root, counters and bytes read back, the same blocks counted.
    /// A tampered node of the tree makes the whole batch fail as a tampered file.
    #[test]
    fn runs_written_together_are_stored_as_one_by_one() {
        let twins = [SchemeId::MtEintGcm, SchemeId::MtEintCbc].map(|id| (id, true));
        for (id, twin) in SchemeId::ALL.map(|id| (id, false)).into_iter().chain(twins) {
            let sch = scheme(id);
            // No node cache: every node a write reads comes from the store.
            let (mut a, mut b) = (Fixture::with_cache(64, 0), Fixture::with_cache(64, 0));
            a.twins = twin;
            b.twins = twin;
            let (mut fa, mut fb) = (a.file(id), b.file(id));
            let base = random_bytes(7, 40 * 64);
            for (fx, f) in [(&mut a, &mut fa), (&mut b, &mut fb)] {
                let (env, tx) = fx.parts();
                sch.write_blocks(&env, f, tx, 0, &mut base.clone()).unwrap();
            }
            let runs: Vec<(u64, Vec<u8>)> = [(1, 1), (3, 2), (10, 1), (12, 3), (39, 1)]
                .into_iter()
                .map(|(first, n)| (first, random_bytes(first + 100, n * 64)))
                .collect();
            let what = format!("{id:?}, twins {twin}");
            for (first, data) in &runs {
                let (env, tx) = a.parts();
                sch.write_blocks(&env, &mut fa, tx, *first, &mut data.clone())
                    .unwrap();
            }
            let (env, tx) = b.parts();
            sch.write_runs(&env, &mut fb, tx, runs.clone()).unwrap();
            assert_eq!(fa.tree, fb.tree, "{what}");
            assert_eq!(fa.ctrs, fb.ctrs, "{what}");
            let (ma, mb) = (a.metrics().file(&fa.id), b.metrics().file(&fb.id));
            assert_eq!(ma.blocks_written, mb.blocks_written, "{what}");
            let (env, tx) = b.parts();
            let got = read_all(sch, &env, &fb, tx).unwrap();
            let mut want = base.clone();
            for (first, data) in &runs {
                let at = *first as usize * 64;
                want[at..at + data.len()].copy_from_slice(data);
            }
            assert!(got == want, "{what}: reads back");
            if !matches!(id, SchemeId::MtEintGcm | SchemeId::MtEintCbc) {
                continue;
            }
            // Node 5 of the tree object (over blocks 2 and 3), which the batch of blocks 0
            // and 8 reads on block 0's path: flipped, the batch fails.
            let (env, tx) = b.parts();
            let meta = fb.names.meta.clone();
            let mut node = [0u8; 32];
            tx.read_at(&meta, 5 * 32, &mut node).unwrap();
            node[0] ^= 1;
            tx.write_at(&meta, 5 * 32, &node).unwrap();
            let e = sch
                .write_runs(&env, &mut fb, tx, vec![(0, vec![1; 64]), (8, vec![2; 64])])
                .unwrap_err();
            assert!(e.is_tampered(), "{what}: {e}");
        }
    }

    /// A sealed run is stored only while its counter is still fresh for its blocks; else
    /// it is refused and nothing changes, and the caller writes the plaintext. Stale: a
    /// block of the run written since (even one), or written and cut off since (its
    /// counter is then in `ctr_hw`), the session's counters reserved anew (a floor above
    /// the plan's), a counter at the session's limit, another file. Not stale: a block
    /// written outside the run, the run cut off with counters below the plan's.
    #[test]
    fn a_sealed_run_whose_counter_is_no_longer_fresh_is_refused() {
        type Change = fn(&dyn Scheme, &mut Env, &mut FileState, &mut Tx);
        let cases: [(&str, Change, bool); 8] = [
            ("nothing", |_, _, _, _| {}, true),
            (
                "a block outside the run written",
                |s, e, f, tx| s.write_blocks(e, f, tx, 3, &mut [9u8; 64]).unwrap(),
                true,
            ),
            (
                "a block of the run written",
                |s, e, f, tx| s.write_blocks(e, f, tx, 2, &mut [9u8; 64]).unwrap(),
                false,
            ),
            (
                "the run cut off",
                |s, e, f, tx| s.resize(e, f, tx, 1).unwrap(),
                true,
            ),
            (
                "a block of the run written, then cut off",
                |s, e, f, tx| {
                    s.write_blocks(e, f, tx, 2, &mut [9u8; 64]).unwrap();
                    s.resize(e, f, tx, 1).unwrap()
                },
                false,
            ),
            (
                "counters reserved anew",
                |_, e, _, _| e.ctr_floor = 1 << 20,
                false,
            ),
            ("the session's limit", |_, e, _, _| e.ctr_limit = 2, false),
            ("another file", |_, _, f, _| f.id = [0xee; 16], false),
        ];
        for id in [SchemeId::MtEintGcm, SchemeId::MtEintCbc] {
            for (what, change, stored) in cases {
                let mut fx = Fixture::new(64);
                let mut f = fx.file(id);
                let sch = scheme(id);
                let (mut env, tx) = fx.parts();
                sch.write_blocks(&env, &mut f, tx, 0, &mut [1u8; 256])
                    .unwrap();
                let plan = sch.seal_plan(&env, &f, 1, 2).unwrap().expect("planned");
                assert_eq!(plan.ctr, 2, "{id:?}: above the run's counters");
                let mut ct = vec![7u8; 128];
                let leaves = sch.seal_run(&env, &plan, &mut ct);
                assert_ne!(ct, vec![7u8; 128], "{id:?}: encrypted in place");
                change(sch, &mut env, &mut f, tx);
                let (tree, ctrs) = (f.tree, f.ctrs.clone());
                let r = sch.write_sealed(&env, &mut f, tx, &plan, &ct, &leaves);
                assert_eq!(r.unwrap(), stored, "{id:?}: {what}");
                if stored {
                    assert_eq!(f.ctrs.get(1), 2, "{id:?}: {what}");
                    let mut out = [0u8; 128];
                    sch.read_blocks(&env, &f, tx, 1, &mut out).unwrap();
                    assert_eq!(out, [7u8; 128], "{id:?}: {what}");
                } else {
                    assert_eq!((f.tree, &f.ctrs), (tree, &ctrs), "{id:?}: {what}");
                }
            }
        }
    }

    /// The schemes whose write is one step decline to plan one, and refuse to store one
    /// (the volume then writes the plaintext as before); MT-EINT plans, and refuses a run
    /// past the block limit at the plan.
    #[test]
    fn only_mt_eint_seals_without_the_state() {
        for id in SchemeId::ALL {
            let mut fx = Fixture::new(64);
            let mut f = fx.file(id);
            let sch = scheme(id);
            let (env, tx) = fx.parts();
            let plan = sch.seal_plan(&env, &f, 0, 1).unwrap();
            let mt = matches!(id, SchemeId::MtEintGcm | SchemeId::MtEintCbc);
            assert_eq!(plan.is_some(), mt, "{id:?}");
            if mt {
                let far = sch.seal_plan(&env, &f, MAX_BLOCKS, 1);
                assert!(far.is_err(), "{id:?}: past the block limit");
                continue;
            }
            let plan = SealPlan {
                keys: Arc::clone(&f.keys),
                id: f.id,
                first: 0,
                ctr: 1,
            };
            let mut data = [5u8; 64];
            assert!(sch.seal_run(&env, &plan, &mut data).is_empty(), "{id:?}");
            let r = sch.write_sealed(&env, &mut f, tx, &plan, &data, &[]);
            assert!(!r.unwrap(), "{id:?}");
            assert_eq!(f.blocks(), 0, "{id:?}");
        }
    }
}
