//! The left-complete Merkle tree of MT-EINT (Oprea–Reiter 2006, §3.1, Fig. 1–2), stored in
//! flat-tree layout.
//!
//! Shape: for `n` leaves, decompose `n` into powers of two from the largest to the smallest.
//! Each power is a *peak*: a complete subtree over an aligned leaf range `[s, s + 2^h)`. The
//! tree's fold is `spine(P1, spine(P2, ... spine(P(k-1), Pk)))` (a right fold), which is the
//! paper's tree whose left subtrees are all complete. The trusted root additionally binds the
//! leaf count: `root = H_root(file, n, fold)`, so truncation and extension are detected.
//!
//! Storage: leaf `i` lives at flat index `2i`; the complete node over aligned leaves
//! `[a, a + 2^h)` lives at flat index `2a + 2^h - 1`. Spine nodes are not stored (they are
//! recomputed from the peaks). All stored nodes of an `n`-leaf tree have flat index
//! `< 2n - 1`; positions below that which are not complete nodes ("holes") hold junk that is
//! never trusted.
//!
//! File holes: a hole's leaf is all zeros, and a complete node over two all-zero children is
//! all zeros (see [`NodeHasher::node`]), so a long run of holes is appended in O(log n)
//! ([`MerkleTree::append_holes`]) and its interior is never written: those positions read
//! as zeros, which is their value.

use std::fmt;

use zeroize::{Zeroize, ZeroizeOnDrop};

use super::cache::{NodeCache, RunCheck};

/// A node value (a keyed BLAKE3 hash, or a leaf value supplied by the caller).
pub type Hash = [u8; 32];

/// The identifier of the file a tree belongs to (bound into every node hash).
pub type FileId = [u8; 16];

/// The all-zero hash: what unwritten storage positions read as.
pub const ZERO_HASH: Hash = [0; 32];

/// The largest supported number of leaves (keeps flat indices inside `u64`).
pub const MAX_LEAVES: u64 = 1 << 62;

/// Flat index of the complete node at `level` (0 = leaves) with index `index` in that level,
/// i.e. the node over leaves `[index * 2^level, (index + 1) * 2^level)`.
#[inline]
pub const fn flat_index(level: u32, index: u64) -> u64 {
    ((2 * index + 1) << level) - 1
}

/// Inverse of [`flat_index`]: `(level, first leaf covered)`.
#[inline]
pub const fn flat_span(flat: u64) -> (u32, u64) {
    let level = (flat + 1).trailing_zeros();
    // flat = (2 index + 1) 2^level - 1 = index 2^(level + 1) + (2^level - 1).
    let index = flat >> (level + 1);
    (level, index << level)
}

/// Number of storage positions used by a tree of `leaves` leaves (`2n - 1`, or 0).
#[inline]
pub const fn stored_node_count(leaves: u64) -> u64 {
    if leaves == 0 {
        0
    } else {
        2 * leaves - 1
    }
}

/// Whether the node stored at `flat` is a complete node of a tree with `leaves` leaves
/// (rather than a hole or a position past the end).
#[inline]
pub const fn is_complete_node(flat: u64, leaves: u64) -> bool {
    let (level, start) = flat_span(flat);
    match start.checked_add(1 << level) {
        Some(end) => end <= leaves,
        None => false,
    }
}

/// The peaks of an `n`-leaf tree, left to right, as `(first leaf, height)`.
pub fn peaks(n: u64) -> impl Iterator<Item = (u64, u32)> {
    let mut rem = n;
    let mut s = 0u64;
    std::iter::from_fn(move || {
        if rem == 0 {
            return None;
        }
        let h = 63 - rem.leading_zeros();
        let out = (s, h);
        s += 1 << h;
        rem -= 1 << h;
        Some(out)
    })
}

/// The complete internal nodes of an `n`-leaf tree above the leaves `written` (leaf
/// numbers; those at or past `n` count for nothing), as flat indices, bottom-up: level by
/// level, left to right. These are the nodes whose values the leaves determine given the
/// rest of the tree, in an order in which each one's children come before it (a leaf-log
/// volume's data items leave them out and replay recomputes them; docs/design.md, "Leaves
/// in the log"). A node stops at its peak (§3.1: spine nodes are not stored).
pub fn ancestors(n: u64, written: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let mut set = std::collections::BTreeSet::new();
    for i in written {
        if i >= n {
            continue;
        }
        let mut h = 1u32;
        while h < 63 {
            let index = i >> h;
            // `index << h <= i < n <= MAX_LEAVES`: no overflow below 2^63.
            if (index << h) + (1u64 << h) > n || !set.insert((h, index)) {
                // Past its peak, or already there with everything above it.
                break;
            }
            h += 1;
        }
    }
    set.into_iter().map(|(h, i)| flat_index(h, i)).collect()
}

/// Flat index of the peak `(s, h)`.
#[inline]
const fn peak_flat(s: u64, h: u32) -> u64 {
    flat_index(h, s >> h)
}

/// Keyed BLAKE3 hashing of tree nodes, domain-separated by node kind and bound to the file
/// and the node's position. The key is zeroized on drop.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct NodeHasher {
    key: [u8; 32],
}

impl fmt::Debug for NodeHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NodeHasher { key: <redacted> }")
    }
}

impl NodeHasher {
    /// A hasher keyed with `key` (a per-volume or per-file tree key).
    pub fn new(key: [u8; 32]) -> Self {
        NodeHasher { key }
    }

    /// Complete internal node at `flat` over children `(left, right)`:
    /// `keyed_hash(key, "intact/merkle/node\0" || file || flat_le || left || right)`,
    /// except that a node whose children are both [`ZERO_HASH`] is [`ZERO_HASH`] itself.
    ///
    /// The zero rule gives a complete subtree whose leaves are all holes (the all-zero leaf;
    /// a block is a hole iff its write counter, which is trusted, is 0) a canonical value,
    /// as in sparse Merkle trees, so a hole range of any length is appended (and later read
    /// back from storage that was never written, which reads as zeros) without hashing or
    /// writing its interior ([`MerkleTree::append_holes`]). It does not weaken binding:
    /// substituting `ZERO_HASH` for a real subtree changes the parent's hash input, just as
    /// any other substitution does, and passing a subtree off as all-zero would require
    /// children whose keyed BLAKE3 is all zeros, which is infeasible. Spine and root nodes
    /// are always hashed, so the root still binds the leaf count (a file of holes is not
    /// confused with a shorter or longer one).
    pub fn node(&self, file: &FileId, flat: u64, left: &Hash, right: &Hash) -> Hash {
        let _t = crate::metrics::phase(crate::metrics::Phase::HashMac);
        if *left == ZERO_HASH && *right == ZERO_HASH {
            return ZERO_HASH;
        }
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"intact/merkle/node\0");
        h.update(file);
        h.update(&flat.to_le_bytes());
        h.update(left);
        h.update(right);
        *h.finalize().as_bytes()
    }

    /// Spine node joining the peak starting at leaf `start` with everything right of it, in
    /// a tree of `n` leaves:
    /// `keyed_hash(key, "intact/merkle/spine\0" || file || start_le || n_le || left || right)`.
    pub fn spine(&self, file: &FileId, start: u64, n: u64, left: &Hash, right: &Hash) -> Hash {
        let _t = crate::metrics::phase(crate::metrics::Phase::HashMac);
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"intact/merkle/spine\0");
        h.update(file);
        h.update(&start.to_le_bytes());
        h.update(&n.to_le_bytes());
        h.update(left);
        h.update(right);
        *h.finalize().as_bytes()
    }

    /// Root of an empty tree: `keyed_hash(key, "intact/merkle/empty\0" || file)`.
    pub fn empty_root(&self, file: &FileId) -> Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"intact/merkle/empty\0");
        h.update(file);
        *h.finalize().as_bytes()
    }

    /// The trusted root of a non-empty tree of `n` leaves whose fold (the single peak, or the
    /// spine over the peaks) is `fold`:
    /// `keyed_hash(key, "intact/merkle/root\0" || file || n_le || fold)`.
    pub fn root(&self, file: &FileId, n: u64, fold: &Hash) -> Hash {
        let _t = crate::metrics::phase(crate::metrics::Phase::HashMac);
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"intact/merkle/root\0");
        h.update(file);
        h.update(&n.to_le_bytes());
        h.update(fold);
        *h.finalize().as_bytes()
    }

    /// The root of an `n`-leaf tree from its peak values, left to right, as
    /// `(first leaf, value)` (`peaks` must be the peaks of `n`; empty iff `n == 0`).
    pub fn root_from_peaks(&self, file: &FileId, n: u64, peaks: &[(u64, Hash)]) -> Hash {
        let Some((last, rest)) = peaks.split_last() else {
            return self.empty_root(file);
        };
        let mut acc = last.1;
        for (s, p) in rest.iter().rev() {
            acc = self.spine(file, *s, n, p, &acc);
        }
        self.root(file, n, &acc)
    }
}

/// Access to the stored (untrusted) tree nodes, addressed by flat index.
pub trait NodeIo {
    /// Reads `out.len()` consecutive stored nodes starting at flat index `first`. Positions
    /// past the end of storage read as zero hashes.
    fn read_nodes(&mut self, first: u64, out: &mut [Hash]) -> std::io::Result<()>;
    /// Writes consecutive nodes starting at flat index `first` (extending storage, with zero
    /// hashes in any gap, when needed).
    fn write_nodes(&mut self, first: u64, nodes: &[Hash]) -> std::io::Result<()>;
    /// Truncates storage to `count` nodes.
    fn truncate_nodes(&mut self, count: u64) -> std::io::Result<()>;
    /// Writes single nodes `(flat index, value)` at scattered positions, in order: what
    /// [`NodeIo::write_nodes`] of each does, in one call (a store stages them together).
    fn write_scattered(&mut self, nodes: &[(u64, Hash)]) -> std::io::Result<()> {
        for (flat, v) in nodes {
            self.write_nodes(*flat, std::slice::from_ref(v))?;
        }
        Ok(())
    }
}

/// In-memory [`NodeIo`], for tests and benches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VecNodeIo(pub Vec<Hash>);

impl NodeIo for VecNodeIo {
    fn read_nodes(&mut self, first: u64, out: &mut [Hash]) -> std::io::Result<()> {
        for (j, o) in out.iter_mut().enumerate() {
            *o = usize::try_from(first + j as u64)
                .ok()
                .and_then(|i| self.0.get(i))
                .copied()
                .unwrap_or(ZERO_HASH);
        }
        Ok(())
    }

    fn write_nodes(&mut self, first: u64, nodes: &[Hash]) -> std::io::Result<()> {
        let first = usize::try_from(first).map_err(std::io::Error::other)?;
        let end = first + nodes.len();
        if self.0.len() < end {
            self.0.resize(end, ZERO_HASH);
        }
        self.0[first..end].copy_from_slice(nodes);
        Ok(())
    }

    fn truncate_nodes(&mut self, count: u64) -> std::io::Result<()> {
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        self.0.truncate(count);
        Ok(())
    }
}

/// Errors of the Merkle-tree operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    /// The stored tree does not hash to the trusted root (tampering or rollback), detected
    /// while checking leaf `leaf`.
    #[error("Merkle path of leaf {leaf} does not match the trusted root")]
    Mismatch {
        /// The (first) leaf being checked.
        leaf: u64,
    },
    /// A node differs from a trusted (cached) value.
    #[error("Merkle node at flat index {flat} differs from its verified value")]
    CacheMismatch {
        /// Flat index of the differing node.
        flat: u64,
        /// The (first) leaf being checked.
        leaf: u64,
    },
    /// The node storage failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A leaf range outside the tree (or a tree larger than [`MAX_LEAVES`]).
    #[error("leaf range {first}+{count} out of bounds for {leaves} leaves")]
    OutOfRange {
        /// First leaf of the range.
        first: u64,
        /// Number of leaves in the range.
        count: u64,
        /// Number of leaves in the tree.
        leaves: u64,
    },
}

/// The trusted state of a tree (kept in `TS_F`): its leaf count and root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeState {
    /// Number of leaves.
    pub leaves: u64,
    /// The trusted root (binds the leaf count).
    pub root: Hash,
}

impl TreeState {
    /// The state of an empty tree of `file`.
    pub fn empty(h: &NodeHasher, file: &FileId) -> Self {
        TreeState {
            leaves: 0,
            root: h.empty_root(file),
        }
    }
}

/// A Merkle tree of one file: the hasher, the file id and an optional trusted-node cache.
/// The trusted state ([`TreeState`]) and the storage ([`NodeIo`]) are passed to each call.
#[derive(Clone, Copy, Debug)]
pub struct MerkleTree<'a> {
    /// Node hasher (holds the tree key).
    pub hasher: &'a NodeHasher,
    /// The file the tree authenticates.
    pub file: FileId,
    /// Cache of verified nodes, if any.
    pub cache: Option<&'a NodeCache>,
}

/// Outcome of computing one peak's part of a range.
enum PartOut {
    /// Verified against the cache before reaching the peak.
    Stopped,
    /// The peak's new (and old) values.
    Top { new: Hash, old: Hash },
}

/// Scratch state of one operation.
struct Walk<'a> {
    hasher: &'a NodeHasher,
    file: FileId,
    cache: Option<&'a NodeCache>,
    /// Nodes known to be trusted (e.g. verified old peaks), consulted before cache and I/O.
    known: &'a [(u64, Hash)],
    /// Nodes to insert into the cache once the operation has verified (bottom-up order).
    trusted: Vec<(u64, Hash)>,
    /// Contiguous runs to write: (first flat, nodes).
    runs: Vec<(u64, Vec<Hash>)>,
    /// Single nodes to write, outside the runs.
    extras: Vec<(u64, Hash)>,
    /// Leaf reported in errors.
    leaf: u64,
    /// Check computed nodes against the cache and stop early (verify only).
    cache_stop: bool,
    /// Record computed boundary nodes as trusted (verify only).
    note_boundary: bool,
}

impl<'a> Walk<'a> {
    fn new(tree: &MerkleTree<'a>, known: &'a [(u64, Hash)], leaf: u64) -> Self {
        Walk {
            hasher: tree.hasher,
            file: tree.file,
            cache: tree.cache.filter(|c| c.capacity_entries() > 0),
            known,
            trusted: Vec::new(),
            runs: Vec::new(),
            extras: Vec::new(),
            leaf,
            cache_stop: false,
            note_boundary: false,
        }
    }

    /// A stored node: from the trusted set, else the cache, else storage (untrusted).
    fn fetch(&mut self, io: &mut dyn NodeIo, flat: u64) -> Result<Hash, TreeError> {
        let v = if let Some(&(_, v)) = self.known.iter().find(|(f, _)| *f == flat) {
            v
        } else if let Some(v) = self.cache.and_then(|c| c.get(&self.file, flat)) {
            v
        } else {
            let mut buf = [ZERO_HASH];
            io.read_nodes(flat, &mut buf)?;
            buf[0]
        };
        self.trusted.push((flat, v));
        Ok(v)
    }

    /// Whether the run `values` at `level` starting at index `lo` is verified by the cache.
    fn cache_verified(&self, level: u32, lo: u64, values: &[Hash]) -> Result<bool, TreeError> {
        let Some(cache) = self.cache.filter(|_| self.cache_stop) else {
            return Ok(false);
        };
        if values.len() > cache.capacity_entries() {
            return Ok(false);
        }
        match cache.check_run(&self.file, flat_index(level, lo), 2u64 << level, values) {
            RunCheck::AllVerified => Ok(true),
            RunCheck::Partial => Ok(false),
            RunCheck::Mismatch(flat) => Err(TreeError::CacheMismatch {
                flat,
                leaf: self.leaf,
            }),
        }
    }

    fn boundary(&mut self, level: u32, lo: u64, values: &[Hash]) {
        if !self.note_boundary {
            return;
        }
        if let (Some(f), Some(l)) = (values.first(), values.last()) {
            self.trusted.push((flat_index(level, lo), *f));
            if values.len() > 1 {
                self.trusted
                    .push((flat_index(level, lo + values.len() as u64 - 1), *l));
            }
        }
    }

    /// Computes bottom-up the part of the leaf range starting at `a` (with values `new`,
    /// and optionally the old values `old`) that lies in the peak `(s, h)`; reads only the
    /// boundary siblings. With `write`, records every computed node for writing.
    fn part(
        &mut self,
        io: &mut dyn NodeIo,
        h: u32,
        a: u64,
        new: &[Hash],
        old: Option<&[Hash]>,
        write: bool,
    ) -> Result<PartOut, TreeError> {
        debug_assert!(!new.is_empty());
        let len = new.len() as u64;
        let b = a + len - 1;
        let (lo_f, hi_f) = (2 * a, 2 * b);
        let mut cur: Vec<Hash> = new.to_vec();
        let mut cur_old: Option<Vec<Hash>> = old.map(<[Hash]>::to_vec);
        let mut main: Vec<Hash> = Vec::new();
        if write {
            main = vec![ZERO_HASH; (2 * len - 1) as usize];
            for (j, v) in new.iter().enumerate() {
                main[2 * j] = *v;
            }
        }
        let (mut lo, mut hi) = (a, b);
        for level in 0..h {
            let width = (hi - lo + 1) as usize;
            if self.cache_verified(level, lo, &cur[..width])? {
                return Ok(PartOut::Stopped);
            }
            self.boundary(level, lo, &cur[..width]);
            let ls = if lo & 1 == 1 {
                self.fetch(io, flat_index(level, lo - 1))?
            } else {
                ZERO_HASH
            };
            let rs = if hi & 1 == 0 {
                self.fetch(io, flat_index(level, hi + 1))?
            } else {
                ZERO_HASH
            };
            let (nlo, nhi) = (lo >> 1, hi >> 1);
            let up = |v: &mut Vec<Hash>, j: usize, pf: u64, hasher: &NodeHasher, file: &FileId| {
                // Children of parent nlo + j are 2(nlo + j) and 2(nlo + j) + 1; reading
                // them (at positions >= j) before writing position j makes this in place.
                let c0 = 2 * (nlo + j as u64);
                let left = if c0 < lo { ls } else { v[(c0 - lo) as usize] };
                let right = if c0 + 1 > hi {
                    rs
                } else {
                    v[(c0 + 1 - lo) as usize]
                };
                v[j] = hasher.node(file, pf, &left, &right);
            };
            for j in 0..=(nhi - nlo) as usize {
                let pf = flat_index(level + 1, nlo + j as u64);
                up(&mut cur, j, pf, self.hasher, &self.file);
                if let Some(o) = cur_old.as_mut() {
                    up(o, j, pf, self.hasher, &self.file);
                }
                if write {
                    if (lo_f..=hi_f).contains(&pf) {
                        main[(pf - lo_f) as usize] = cur[j];
                    } else {
                        self.extras.push((pf, cur[j]));
                        self.trusted.push((pf, cur[j]));
                    }
                }
            }
            lo = nlo;
            hi = nhi;
        }
        if self.cache_verified(h, lo, &cur[..1])? {
            return Ok(PartOut::Stopped);
        }
        self.boundary(h, lo, &cur[..1]);
        if write {
            self.runs.push((lo_f, main));
        }
        let new_top = cur[0];
        let old_top = cur_old.map_or(new_top, |o| o[0]);
        Ok(PartOut::Top {
            new: new_top,
            old: old_top,
        })
    }

    /// Computes the new and old peak values of an `n`-leaf tree in which the leaves
    /// `[first, first + new.len())` have values `new` (and `old`). Peaks not touched by the
    /// range are fetched. Returns `None` when every touched part was verified by the cache
    /// (verify only). Peaks are written into `new_peaks` / `old_peaks` as `(start, value)`.
    #[allow(clippy::too_many_arguments)]
    fn peaks(
        &mut self,
        io: &mut dyn NodeIo,
        n: u64,
        first: u64,
        new: &[Hash],
        old: Option<&[Hash]>,
        write: bool,
        new_peaks: &mut Vec<(u64, Hash)>,
        old_peaks: &mut Vec<(u64, Hash)>,
    ) -> Result<bool, TreeError> {
        let last = first + new.len() as u64 - 1;
        let mut all_stopped = true;
        // Stopped parts and untouched peaks need their stored value, fetched afterwards
        // (only if some part did not stop): remember their positions.
        let mut pending: [usize; 64] = [0; 64];
        let mut npending = 0;
        for (s, h) in peaks(n) {
            let e = s + (1 << h) - 1;
            if e < first || s > last {
                pending[npending] = new_peaks.len();
                npending += 1;
                new_peaks.push((s, ZERO_HASH));
                old_peaks.push((s, ZERO_HASH));
                continue;
            }
            let a = first.max(s);
            let b = last.min(e);
            let r = (a - first) as usize..=(b - first) as usize;
            let part_old = old.map(|o| &o[r.clone()]);
            match self.part(io, h, a, &new[r], part_old, write)? {
                PartOut::Stopped => {
                    pending[npending] = new_peaks.len();
                    npending += 1;
                    new_peaks.push((s, ZERO_HASH));
                    old_peaks.push((s, ZERO_HASH));
                }
                PartOut::Top { new: nv, old: ov } => {
                    all_stopped = false;
                    new_peaks.push((s, nv));
                    old_peaks.push((s, ov));
                }
            }
        }
        if all_stopped {
            return Ok(false);
        }
        for &i in &pending[..npending] {
            let (s, _) = new_peaks[i];
            let flat = peak_flat(s, peak_height(n, s));
            let v = self.fetch(io, flat)?;
            new_peaks[i].1 = v;
            old_peaks[i].1 = v;
        }
        Ok(true)
    }

    /// Writes the collected runs, then the extras one by one: extras are inner nodes (odd
    /// flat indices), so no two are neighbours in storage.
    fn flush(&mut self, io: &mut dyn NodeIo) -> Result<(), TreeError> {
        for (start, nodes) in &self.runs {
            io.write_nodes(*start, nodes)?;
        }
        debug_assert!(
            self.extras.iter().all(|(flat, _)| flat % 2 == 1),
            "an extra is an inner node"
        );
        io.write_scattered(&self.extras)?;
        Ok(())
    }

    /// Makes the cache coherent with what was written and inserts the trusted nodes.
    fn commit_cache(&self) {
        let Some(cache) = self.cache else { return };
        for (start, nodes) in &self.runs {
            cache.refresh_run(&self.file, *start, nodes);
        }
        cache.insert_many(&self.file, &self.trusted);
    }
}

/// Height of the peak of an `n`-leaf tree that starts at leaf `s` (`s` must start a peak).
#[inline]
fn peak_height(n: u64, s: u64) -> u32 {
    // The peak starting at s has size equal to the highest power of two in n - s.
    63 - (n - s).leading_zeros()
}

impl<'a> MerkleTree<'a> {
    /// A tree of `file` hashed with `hasher`, optionally caching verified nodes in `cache`.
    pub fn new(hasher: &'a NodeHasher, file: FileId, cache: Option<&'a NodeCache>) -> Self {
        MerkleTree {
            hasher,
            file,
            cache,
        }
    }

    /// The root of a tree with the given leaves, computed from scratch (no storage).
    pub fn root_of(&self, leaves: &[Hash]) -> Hash {
        fn complete(t: &MerkleTree<'_>, leaves: &[Hash], s: u64, h: u32) -> Hash {
            if h == 0 {
                return leaves[s as usize];
            }
            let half = 1u64 << (h - 1);
            let l = complete(t, leaves, s, h - 1);
            let r = complete(t, leaves, s + half, h - 1);
            t.hasher.node(&t.file, flat_index(h, s >> h), &l, &r)
        }
        let n = leaves.len() as u64;
        let ps: Vec<(u64, Hash)> = peaks(n)
            .map(|(s, h)| (s, complete(self, leaves, s, h)))
            .collect();
        self.hasher.root_from_peaks(&self.file, n, &ps)
    }

    /// Reads the stored (untrusted) leaf values for `[first, first + count)`.
    pub fn stored_leaves(
        &self,
        io: &mut dyn NodeIo,
        first: u64,
        count: u64,
    ) -> Result<Vec<Hash>, TreeError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let oor = TreeError::OutOfRange {
            first,
            count,
            leaves: MAX_LEAVES,
        };
        match first.checked_add(count) {
            Some(end) if end <= MAX_LEAVES => {}
            _ => return Err(oor),
        }
        if count == 1 {
            let mut buf = [ZERO_HASH];
            io.read_nodes(2 * first, &mut buf)?;
            return Ok(buf.to_vec());
        }
        let mut buf = vec![ZERO_HASH; (2 * count - 1) as usize];
        io.read_nodes(2 * first, &mut buf)?;
        let mut w = 0;
        for r in (0..buf.len()).step_by(2) {
            buf[w] = buf[r];
            w += 1;
        }
        buf.truncate(w);
        Ok(buf)
    }

    fn check_range(ts: &TreeState, first: u64, count: u64) -> Result<(), TreeError> {
        match first.checked_add(count) {
            Some(end) if end <= ts.leaves => Ok(()),
            _ => Err(TreeError::OutOfRange {
                first,
                count,
                leaves: ts.leaves,
            }),
        }
    }

    /// CheckTree (Fig. 2) for a contiguous batch: verifies that `leaves` are the values of
    /// the leaves `[first, first + leaves.len())` of the tree authenticated by `ts.root`.
    /// Reads at most two boundary siblings per level and the other peaks; stops early when a
    /// computed level is entirely verified by the cache.
    pub fn verify(
        &self,
        ts: &TreeState,
        io: &mut dyn NodeIo,
        first: u64,
        leaves: &[Hash],
    ) -> Result<(), TreeError> {
        Self::check_range(ts, first, leaves.len() as u64)?;
        if leaves.is_empty() {
            return Ok(());
        }
        let mut w = Walk::new(self, &[], first);
        w.cache_stop = true;
        w.note_boundary = true;
        let mut np = Vec::with_capacity(64);
        let mut op = Vec::with_capacity(64);
        let computed = w.peaks(io, ts.leaves, first, leaves, None, false, &mut np, &mut op)?;
        if computed && self.hasher.root_from_peaks(&self.file, ts.leaves, &np) != ts.root {
            return Err(TreeError::Mismatch { leaf: first });
        }
        w.commit_cache();
        Ok(())
    }

    /// UpdateTree for a contiguous batch inside `[0, ts.leaves)`: verifies the old stored
    /// leaves of the range against `ts.root` (CheckPathRoot before updating, so tampered
    /// siblings are never blessed into the new root), then writes the new leaves and every
    /// changed internal node, and sets `ts.root`. On error nothing is written.
    pub fn update(
        &self,
        ts: &mut TreeState,
        io: &mut dyn NodeIo,
        first: u64,
        leaves: &[Hash],
    ) -> Result<(), TreeError> {
        let count = leaves.len() as u64;
        Self::check_range(ts, first, count)?;
        if leaves.is_empty() {
            return Ok(());
        }
        let old = self.stored_leaves(io, first, count)?;
        let mut w = Walk::new(self, &[], first);
        let mut np = Vec::with_capacity(64);
        let mut op = Vec::with_capacity(64);
        w.peaks(
            io,
            ts.leaves,
            first,
            leaves,
            Some(&old),
            true,
            &mut np,
            &mut op,
        )?;
        if self.hasher.root_from_peaks(&self.file, ts.leaves, &op) != ts.root {
            return Err(TreeError::Mismatch { leaf: first });
        }
        w.flush(io)?;
        w.commit_cache();
        ts.root = self.hasher.root_from_peaks(&self.file, ts.leaves, &np);
        Ok(())
    }

    /// UpdateTree for several runs at once (`runs`: `(first leaf, new values)`, in order of
    /// leaf, disjoint, non-empty, inside `[0, ts.leaves)`): the same checks and the same
    /// resulting tree as [`MerkleTree::update`] run by run, but each node the runs share is
    /// hashed, verified and written once. A checkpoint that writes 1,000 scattered blocks
    /// of one file (a directory of 10^6 names: every create a leaf of its own) updated
    /// 1,000 paths of 14 levels one by one, computing their common upper levels again
    /// each time (issue 18).
    ///
    /// §3.1, Fig. 2 (UpdateTree, CheckPathRoot before updating), level by level: the
    /// changed nodes of a level, in order, go up in pairs when two are siblings, else with
    /// their stored sibling; every peak they reach yields its new and old value, the other
    /// peaks are read. The old root, from the stored old leaves and the siblings read, must
    /// be the trusted one before anything is written (so no tampered sibling is blessed
    /// into the new root); then the new leaves and every changed inner node are written,
    /// neighbours in the flat layout in one write. On error nothing is written.
    pub fn update_runs(
        &self,
        ts: &mut TreeState,
        io: &mut dyn NodeIo,
        runs: &[(u64, &[Hash])],
    ) -> Result<(), TreeError> {
        let n = ts.leaves;
        let mut end = 0u64;
        for &(first, leaves) in runs {
            if leaves.is_empty() || first < end {
                return Err(TreeError::OutOfRange {
                    first,
                    count: leaves.len() as u64,
                    leaves: n,
                });
            }
            Self::check_range(ts, first, leaves.len() as u64)?;
            end = first + leaves.len() as u64;
        }
        let Some(&(leaf0, _)) = runs.first() else {
            return Ok(());
        };
        // Level 0: (index, new, old), in order of index.
        let mut level: Vec<(u64, Hash, Hash)> = Vec::new();
        for &(first, leaves) in runs {
            let old = self.stored_leaves(io, first, leaves.len() as u64)?;
            level.extend(
                leaves
                    .iter()
                    .zip(old)
                    .enumerate()
                    .map(|(k, (nv, ov))| (first + k as u64, *nv, ov)),
            );
        }
        let mut w = Walk::new(self, &[], leaf0);
        let mut writes: Vec<(u64, Hash)> = level.iter().map(|&(i, nv, _)| (2 * i, nv)).collect();
        let (mut new_peaks, mut old_peaks) = (Vec::with_capacity(64), Vec::with_capacity(64));
        let mut at = 0;
        for (s, h) in peaks(n) {
            let e = s + (1u64 << h);
            let mut cur: Vec<(u64, Hash, Hash)> = level[at..]
                .iter()
                .take_while(|x| x.0 < e)
                .copied()
                .collect();
            at += cur.len();
            if cur.is_empty() {
                let v = w.fetch(io, peak_flat(s, h))?;
                new_peaks.push((s, v));
                old_peaks.push((s, v));
                continue;
            }
            for l in 0..h {
                let mut up = Vec::with_capacity(cur.len().div_ceil(2));
                let mut j = 0;
                while j < cur.len() {
                    let (i, nv, ov) = cur[j];
                    let (left, right) = match cur.get(j + 1) {
                        Some(&(i2, nv2, ov2)) if i & 1 == 0 && i2 == i + 1 => {
                            j += 2;
                            ((nv, ov), (nv2, ov2))
                        }
                        _ => {
                            j += 1;
                            let sib = w.fetch(io, flat_index(l, i ^ 1))?;
                            if i & 1 == 0 {
                                ((nv, ov), (sib, sib))
                            } else {
                                ((sib, sib), (nv, ov))
                            }
                        }
                    };
                    let pf = flat_index(l + 1, i >> 1);
                    let pn = self.hasher.node(&self.file, pf, &left.0, &right.0);
                    let po = self.hasher.node(&self.file, pf, &left.1, &right.1);
                    writes.push((pf, pn));
                    up.push((i >> 1, pn, po));
                }
                cur = up;
            }
            debug_assert_eq!(cur.len(), 1);
            new_peaks.push((s, cur[0].1));
            old_peaks.push((s, cur[0].2));
        }
        if self.hasher.root_from_peaks(&self.file, n, &old_peaks) != ts.root {
            return Err(TreeError::Mismatch { leaf: leaf0 });
        }
        writes.sort_unstable_by_key(|x| x.0);
        let mut k = 0;
        while k < writes.len() {
            let mut e = k + 1;
            while e < writes.len() && writes[e].0 == writes[e - 1].0 + 1 {
                e += 1;
            }
            let nodes: Vec<Hash> = writes[k..e].iter().map(|x| x.1).collect();
            io.write_nodes(writes[k].0, &nodes)?;
            w.runs.push((writes[k].0, nodes));
            k = e;
        }
        // The inner nodes written are trusted now, like the siblings the check read.
        w.trusted
            .extend(writes.iter().filter(|x| x.0 % 2 == 1).copied());
        w.commit_cache();
        ts.root = self.hasher.root_from_peaks(&self.file, n, &new_peaks);
        Ok(())
    }

    /// AppendTree for a batch: verifies the existing peaks against `ts.root` (when
    /// `ts.leaves > 0`), then appends `leaves` at `[ts.leaves, ..)`, writing the new leaves
    /// and the new complete nodes (merging peaks), and updates `ts`.
    pub fn append(
        &self,
        ts: &mut TreeState,
        io: &mut dyn NodeIo,
        leaves: &[Hash],
    ) -> Result<(), TreeError> {
        let n = ts.leaves;
        let m = leaves.len() as u64;
        let n2 = match n.checked_add(m) {
            Some(n2) if n2 <= MAX_LEAVES => n2,
            _ => {
                return Err(TreeError::OutOfRange {
                    first: n,
                    count: m,
                    leaves: n,
                })
            }
        };
        if m == 0 {
            return Ok(());
        }
        let known: Vec<(u64, Hash)> = self
            .verified_peaks(ts, io)?
            .into_iter()
            .map(|(s, v)| (peak_flat(s, peak_height(n, s)), v))
            .collect();
        let mut w = Walk::new(self, &known, n);
        let mut np = Vec::with_capacity(64);
        let mut op = Vec::with_capacity(64);
        w.peaks(io, n2, n, leaves, None, true, &mut np, &mut op)?;
        w.flush(io)?;
        w.commit_cache();
        ts.leaves = n2;
        ts.root = self.hasher.root_from_peaks(&self.file, n2, &np);
        Ok(())
    }

    /// The peaks of the tree of `ts`, as `(first leaf, value)`, fetched (cache or storage)
    /// and verified against the trusted root (when `ts.leaves > 0`).
    fn verified_peaks(
        &self,
        ts: &TreeState,
        io: &mut dyn NodeIo,
    ) -> Result<Vec<(u64, Hash)>, TreeError> {
        let n = ts.leaves;
        let mut old_peaks: Vec<(u64, Hash)> = Vec::with_capacity(64);
        let mut w0 = Walk::new(self, &[], n);
        for (s, h) in peaks(n) {
            let v = w0.fetch(io, peak_flat(s, h))?;
            old_peaks.push((s, v));
        }
        if n > 0 && self.hasher.root_from_peaks(&self.file, n, &old_peaks) != ts.root {
            return Err(TreeError::Mismatch { leaf: n });
        }
        Ok(old_peaks)
    }

    /// Appends `count` holes (all-zero leaves, [`ZERO_HASH`]) at `[ts.leaves, ..)`: the same
    /// resulting root and the same readable node values as `append` of `count` zero leaves,
    /// but in O(log(n + count)) hashes and node writes, `n = ts.leaves`.
    ///
    /// The old peaks are verified against `ts.root` first (as `append` does). By the zero
    /// rule of [`NodeHasher::node`], every complete node lying entirely inside the hole range
    /// is `ZERO_HASH`; such nodes are not written, they read as zero because they lie at
    /// flat indices `>= 2n - 1`, past the end of the storage, which is first truncated to
    /// the old node count ([`stored_node_count`]) so that nothing stale lies there. Only
    /// the nodes that merge old content with holes are computed and written: the ancestors
    /// of the boundary between leaf `n - 1` and leaf `n` inside the new peak that crosses
    /// it (at most one per level). Later `append`, `update`, `verify` and `truncate` read
    /// the unwritten hole nodes as zeros, which are their values.
    pub fn append_holes(
        &self,
        ts: &mut TreeState,
        io: &mut dyn NodeIo,
        count: u64,
    ) -> Result<(), TreeError> {
        let n = ts.leaves;
        let n2 = match n.checked_add(count) {
            Some(n2) if n2 <= MAX_LEAVES => n2,
            _ => {
                return Err(TreeError::OutOfRange {
                    first: n,
                    count,
                    leaves: n,
                })
            }
        };
        if count == 0 {
            return Ok(());
        }
        let old_peaks = self.verified_peaks(ts, io)?;
        let old_end = stored_node_count(n);
        // Nodes at or past the old end are complete nodes of the new tree only if they lie
        // inside the hole range (zero) or are boundary nodes (written below): clear them.
        io.truncate_nodes(old_end)?;
        if let Some(c) = self.cache {
            // The cache holds no node of this file at or past `old_end` (it holds verified
            // nodes of the current tree, and a truncation drops the rest); this clears the
            // new tree's positions of it all the same.
            c.remove_in(&self.file, old_end..stored_node_count(n2));
        }
        let old_peak = |s: u64| -> Result<Hash, TreeError> {
            old_peaks
                .iter()
                .find(|p| p.0 == s)
                .map(|p| p.1)
                // Unreachable: every complete node left of the boundary is an old peak.
                .ok_or(TreeError::Mismatch { leaf: n })
        };
        let mut new_peaks: Vec<(u64, Hash)> = Vec::with_capacity(64);
        // Boundary nodes, top-down per crossing peak: (flat, value).
        let mut merged: Vec<(u64, Hash)> = Vec::new();
        for (s, h) in peaks(n2) {
            let e = s + (1u64 << h);
            let v = if e <= n {
                old_peak(s)?
            } else if s >= n {
                ZERO_HASH
            } else {
                // s < n < e: descend to the boundary, remembering the left children (old
                // peaks, or ZERO where the boundary lies in the left half), then hash up.
                let mut chain: Vec<(u64, u32, Hash)> = Vec::with_capacity(64);
                let (mut a, mut l) = (s, h);
                let mut acc = loop {
                    // Invariant: a < n < a + 2^l, so l >= 1.
                    let mid = a + (1u64 << (l - 1));
                    if n < mid {
                        chain.push((a, l, ZERO_HASH));
                        l -= 1;
                    } else if n == mid {
                        break self.hasher.node(
                            &self.file,
                            flat_index(l, a >> l),
                            &old_peak(a)?,
                            &ZERO_HASH,
                        );
                    } else {
                        chain.push((a, l, old_peak(a)?));
                        a = mid;
                        l -= 1;
                    }
                };
                merged.push((flat_index(l, a >> l), acc));
                for &(pa, pl, other) in chain.iter().rev() {
                    let flat = flat_index(pl, pa >> pl);
                    // `other` is the right sibling (ZERO) when the boundary went left.
                    let (left, right) = if pa == a { (acc, other) } else { (other, acc) };
                    acc = self.hasher.node(&self.file, flat, &left, &right);
                    merged.push((flat, acc));
                    a = pa;
                }
                acc
            };
            new_peaks.push((s, v));
        }
        // Zero-valued nodes past the old end already read as zero; below it, the position
        // may hold junk (it was not a complete node of the old tree), so write it.
        // They are inner nodes (odd flat indices), never neighbours: one write each.
        for &(f, v) in &merged {
            debug_assert!(f % 2 == 1, "a merged node is an inner node");
            if v != ZERO_HASH || f < old_end {
                io.write_nodes(f, &[v])?;
            }
        }
        if let Some(c) = self.cache.filter(|c| c.capacity_entries() > 0) {
            let mut trusted: Vec<(u64, Hash)> = old_peaks
                .iter()
                .map(|&(s, v)| (peak_flat(s, peak_height(n, s)), v))
                .collect();
            trusted.extend_from_slice(&merged);
            c.insert_many(&self.file, &trusted);
        }
        // Give storage the full length of the new tree, zero-filled: the hole nodes then lie
        // *inside* the object, so a later write of one is an overwrite of committed bytes
        // (journaled by the engine), never a write past the end whose remains a crash could
        // leave where the committed tree expects zeros.
        io.truncate_nodes(stored_node_count(n2))?;
        ts.leaves = n2;
        ts.root = self.hasher.root_from_peaks(&self.file, n2, &new_peaks);
        Ok(())
    }

    /// DeleteTree generalised: truncates the tree to `new_leaves <= ts.leaves` leaves. The
    /// new peaks are the left siblings on the path of old leaf `new_leaves` (and old peaks
    /// left of it); that path is verified with the stored old leaf first. Then storage is
    /// truncated to the new node count and `ts` is set.
    pub fn truncate(
        &self,
        ts: &mut TreeState,
        io: &mut dyn NodeIo,
        new_leaves: u64,
    ) -> Result<(), TreeError> {
        let n = ts.leaves;
        let t = new_leaves;
        if t > n {
            return Err(TreeError::OutOfRange {
                first: t,
                count: 0,
                leaves: n,
            });
        }
        if t == n {
            return Ok(());
        }
        if t == 0 {
            io.truncate_nodes(0)?;
            if let Some(c) = self.cache {
                // Every cached node of this file is a node of the current tree.
                c.remove_in(&self.file, 0..stored_node_count(n));
            }
            *ts = TreeState::empty(self.hasher, &self.file);
            return Ok(());
        }
        let leaf = self.stored_leaves(io, t, 1)?;
        let mut w = Walk::new(self, &[], t);
        let mut np = Vec::with_capacity(64);
        let mut op = Vec::with_capacity(64);
        w.peaks(io, n, t, &leaf, None, false, &mut np, &mut op)?;
        if self.hasher.root_from_peaks(&self.file, n, &np) != ts.root {
            return Err(TreeError::Mismatch { leaf: t });
        }
        let mut new_peaks: Vec<(u64, Hash)> = Vec::with_capacity(64);
        for (s, h) in peaks(t) {
            let flat = peak_flat(s, h);
            match w.trusted.iter().find(|(f, _)| *f == flat) {
                Some(&(_, v)) => new_peaks.push((s, v)),
                // Unreachable: every new peak is an old peak or a left sibling on the path.
                None => return Err(TreeError::Mismatch { leaf: t }),
            }
        }
        io.truncate_nodes(stored_node_count(t))?;
        if let Some(c) = self.cache {
            // A node that is not complete in the new tree covers some leaf `>= t`: with
            // span [a, e), e > t, its flat index 2a + (e - a) - 1 = a + e - 1 is at least
            // t. Every cached node of this file is below the old tree's node count.
            c.retain_in(&self.file, t..stored_node_count(n), |flat| {
                is_complete_node(flat, t)
            });
            let flats: Vec<(u64, Hash)> = new_peaks
                .iter()
                .map(|&(s, v)| (peak_flat(s, peak_height(t, s)), v))
                .collect();
            c.insert_many(&self.file, &flats);
        }
        ts.leaves = t;
        ts.root = self.hasher.root_from_peaks(&self.file, t, &new_peaks);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    const FILE: FileId = [9; 16];

    fn leaf(x: u64) -> Hash {
        *blake3::hash(&x.to_le_bytes()).as_bytes()
    }

    /// A NodeIo that records which flat indices were written and how many calls were made.
    #[derive(Default)]
    struct Recording {
        inner: VecNodeIo,
        written: BTreeSet<u64>,
        write_calls: usize,
        reads: usize,
    }

    impl NodeIo for Recording {
        fn read_nodes(&mut self, first: u64, out: &mut [Hash]) -> std::io::Result<()> {
            self.reads += out.len();
            self.inner.read_nodes(first, out)
        }
        fn write_nodes(&mut self, first: u64, nodes: &[Hash]) -> std::io::Result<()> {
            self.write_calls += 1;
            self.written.extend(first..first + nodes.len() as u64);
            self.inner.write_nodes(first, nodes)
        }
        fn truncate_nodes(&mut self, count: u64) -> std::io::Result<()> {
            self.inner.truncate_nodes(count)
        }
    }

    /// Independent reference: the expected stored value of every complete node.
    fn reference_nodes(t: &MerkleTree<'_>, leaves: &[Hash]) -> Vec<Option<Hash>> {
        let n = leaves.len() as u64;
        let mut out = vec![None; stored_node_count(n) as usize];
        for (i, l) in leaves.iter().enumerate() {
            out[2 * i] = Some(*l);
        }
        let mut level = 1;
        while (1u64 << level) <= n {
            for j in 0..(n >> level) {
                let f = flat_index(level, j);
                let l = out[flat_index(level - 1, 2 * j) as usize].unwrap();
                let r = out[flat_index(level - 1, 2 * j + 1) as usize].unwrap();
                out[f as usize] = Some(t.hasher.node(&t.file, f, &l, &r));
            }
            level += 1;
        }
        out
    }

    /// Hand-computed, 8 leaves (one peak, flat 7): leaves 0 and 1 as two runs share every
    /// ancestor. The batch reads their old values (flats 0, 2) and the two siblings off the
    /// path (flat 5, over leaves 2–3; flat 11, over 4–7), hashes nodes 1, 3, 7 once each,
    /// and writes flats 0–3 in one write and 7 in another; the runs one by one read
    /// 3 + 3 nodes and write 4 + 4.
    #[test]
    fn runs_updated_together_share_their_ancestors() {
        let h = NodeHasher::new([5; 32]);
        let t = MerkleTree::new(&h, FILE, None);
        let mut ts = TreeState::empty(&h, &FILE);
        let mut io = Recording::default();
        let leaves: Vec<Hash> = (0..8).map(leaf).collect();
        t.append(&mut ts, &mut io, &leaves).unwrap();
        let (a, b) = ([leaf(100)], [leaf(101)]);
        let mut one = (ts, VecNodeIo(io.inner.0.clone()));
        t.update(&mut one.0, &mut one.1, 0, &a).unwrap();
        t.update(&mut one.0, &mut one.1, 1, &b).unwrap();
        io.reads = 0;
        io.write_calls = 0;
        io.written.clear();
        t.update_runs(&mut ts, &mut io, &[(0, &a), (1, &b)])
            .unwrap();
        assert_eq!(ts, one.0);
        assert_eq!(io.inner.0, one.1 .0);
        assert_eq!(io.reads, 4);
        assert_eq!(io.write_calls, 2);
        assert_eq!(io.written, BTreeSet::from([0, 1, 2, 3, 7]));
        // Out of order, overlapping, empty or past the end: refused, nothing read.
        for bad in [
            vec![(1, &b[..]), (0, &a[..])],
            vec![(0, &a[..]), (0, &b[..])],
            vec![(0, &[][..])],
            vec![(8, &a[..])],
        ] {
            let before = ts;
            assert!(matches!(
                t.update_runs(&mut ts, &mut io, &bad),
                Err(TreeError::OutOfRange { .. })
            ));
            assert_eq!(ts, before);
        }
        assert_eq!(io.reads, 4);
    }

    /// Hand-computed: 5 leaves are the peaks `[0, 4)` (nodes 1, 5 at level 1 and 3 at level
    /// 2) and `[4, 5)` (leaf 4 alone, flat 8).
    #[test]
    fn ancestors_stop_at_the_peak_and_come_bottom_up() {
        assert_eq!(ancestors(5, [1]), vec![1, 3]);
        assert_eq!(ancestors(5, [2, 1]), vec![1, 5, 3]);
        assert_eq!(ancestors(5, [3, 3, 2]), vec![5, 3]);
        assert_eq!(ancestors(5, [4]), Vec::<u64>::new());
        assert_eq!(ancestors(5, [5, 9]), Vec::<u64>::new());
        assert_eq!(ancestors(1, [0]), Vec::<u64>::new());
        assert_eq!(ancestors(2, [0]), vec![1]);
        assert_eq!(ancestors(6, [4]), vec![9]);
        // Every stored node of a tree from all its leaves: the complete internal ones.
        for n in 1..40u64 {
            let all = ancestors(n, 0..n);
            let want: Vec<u64> = (0..stored_node_count(n))
                .filter(|&f| f % 2 == 1 && is_complete_node(f, n))
                .collect();
            let mut got = all.clone();
            got.sort_unstable();
            assert_eq!(got, want, "n = {n}");
            for (k, &f) in all.iter().enumerate() {
                let (level, start) = flat_span(f);
                let half = 1u64 << (level - 1);
                for child in [start, start + half] {
                    let c = flat_index(level - 1, child >> (level - 1));
                    assert!(
                        c.is_multiple_of(2) || all[..k].contains(&c),
                        "n = {n}: {c} before {f}"
                    );
                }
            }
        }
    }

    #[test]
    fn flat_layout() {
        assert_eq!(flat_index(0, 3), 6);
        assert_eq!(flat_index(1, 0), 1);
        assert_eq!(flat_index(1, 2), 9);
        assert_eq!(flat_index(2, 0), 3);
        assert_eq!(flat_index(3, 0), 7);
        for f in 0..200 {
            let (l, a) = flat_span(f);
            assert_eq!(flat_index(l, a >> l), f);
        }
        assert_eq!(peaks(6).collect::<Vec<_>>(), vec![(0, 2), (4, 1)]);
        assert_eq!(peaks(7).collect::<Vec<_>>(), vec![(0, 2), (4, 1), (6, 0)]);
        assert!(is_complete_node(3, 6) && !is_complete_node(7, 6) && is_complete_node(9, 6));
    }

    #[test]
    fn figure_1_shapes() {
        let h = NodeHasher::new([3; 32]);
        let t = MerkleTree::new(&h, FILE, None);
        let l: Vec<Hash> = (0..8).map(leaf).collect();
        let mut ts = TreeState::empty(&h, &FILE);
        let mut io = Recording::default();
        t.append(&mut ts, &mut io, &l[..6]).unwrap();
        let p4 = h.node(
            &FILE,
            3,
            &h.node(&FILE, 1, &l[0], &l[1]),
            &h.node(&FILE, 5, &l[2], &l[3]),
        );
        let p2 = h.node(&FILE, 9, &l[4], &l[5]);
        let root6 = h.root(&FILE, 6, &h.spine(&FILE, 0, 6, &p4, &p2));
        assert_eq!(
            ts,
            TreeState {
                leaves: 6,
                root: root6
            }
        );
        // Stored nodes: 0..=10 except the hole at 7 (the node over [0, 8) does not exist).
        let expect6: BTreeSet<u64> = (0..=10).filter(|&f| f != 7).collect();
        assert_eq!(io.written, expect6);
        assert_eq!(io.inner.0.len(), 11);
        assert_eq!(io.inner.0[3], p4);
        assert_eq!(io.inner.0[9], p2);

        // Append the 7th leaf: only leaf 6 (flat 12) is written.
        io.written.clear();
        t.append(&mut ts, &mut io, &l[6..7]).unwrap();
        let root7 = h.root(
            &FILE,
            7,
            &h.spine(&FILE, 0, 7, &p4, &h.spine(&FILE, 4, 7, &p2, &l[6])),
        );
        assert_eq!(ts.root, root7);
        assert_eq!(io.written, BTreeSet::from([12]));
        t.verify(&ts, &mut io, 0, &l[..7]).unwrap();
        for i in 0..7 {
            t.verify(&ts, &mut io, i, &l[i as usize..=i as usize])
                .unwrap();
        }

        // 8th leaf completes the tree: 14, 13 ([6,8)), 11 ([4,8)), 7 ([0,8)).
        io.written.clear();
        t.append(&mut ts, &mut io, &l[7..8]).unwrap();
        assert_eq!(io.written, BTreeSet::from([7, 11, 13, 14]));
        let p8 = h.node(
            &FILE,
            7,
            &p4,
            &h.node(&FILE, 11, &p2, &h.node(&FILE, 13, &l[6], &l[7])),
        );
        assert_eq!(ts.root, h.root(&FILE, 8, &p8));

        // Delete back to 7 and 6: the same roots as before.
        t.truncate(&mut ts, &mut io, 7).unwrap();
        assert_eq!(ts.root, root7);
        t.truncate(&mut ts, &mut io, 6).unwrap();
        assert_eq!(
            ts,
            TreeState {
                leaves: 6,
                root: root6
            }
        );
        assert_eq!(io.inner.0.len(), 11);
        t.truncate(&mut ts, &mut io, 0).unwrap();
        assert_eq!(ts, TreeState::empty(&h, &FILE));
        assert!(io.inner.0.is_empty());
    }

    #[test]
    fn root_binds_leaf_count_and_file() {
        let h = NodeHasher::new([3; 32]);
        let l: Vec<Hash> = (0..4).map(leaf).collect();
        let t = MerkleTree::new(&h, FILE, None);
        let other = MerkleTree::new(&h, [8; 16], None);
        assert_ne!(t.root_of(&l), other.root_of(&l));
        assert_ne!(t.root_of(&l[..2]), t.root_of(&l[..3]));
        assert_ne!(t.root_of(&[]), other.root_of(&[]));
        // A verified range must lie within the trusted leaf count.
        let mut io = VecNodeIo::default();
        let mut ts = TreeState::empty(&h, &FILE);
        t.append(&mut ts, &mut io, &l).unwrap();
        assert!(matches!(
            t.verify(&ts, &mut io, 3, &l[..2]),
            Err(TreeError::OutOfRange { .. })
        ));
        assert!(matches!(
            t.update(&mut ts, &mut io, 4, &l[..1]),
            Err(TreeError::OutOfRange { .. })
        ));
        assert!(matches!(
            t.truncate(&mut ts, &mut io, 5),
            Err(TreeError::OutOfRange { .. })
        ));
        assert_eq!(format!("{h:?}"), "NodeHasher { key: <redacted> }");
    }

    #[test]
    fn single_leaf_costs_are_logarithmic() {
        let h = NodeHasher::new([1; 32]);
        let t = MerkleTree::new(&h, FILE, None);
        let n = 1000u64;
        let l: Vec<Hash> = (0..n).map(leaf).collect();
        let mut ts = TreeState::empty(&h, &FILE);
        let mut io = Recording::default();
        t.append(&mut ts, &mut io, &l).unwrap();
        assert!(io.write_calls <= 6 * 11, "append calls {}", io.write_calls);
        io.reads = 0;
        t.verify(&ts, &mut io, 517, &l[517..518]).unwrap();
        assert!(io.reads <= 2 * 10 + 6, "reads {}", io.reads);
        io.reads = 0;
        io.write_calls = 0;
        t.update(&mut ts, &mut io, 300, &[leaf(5000); 64]).unwrap();
        // The old leaves are read as one contiguous flat run (2k - 1 nodes).
        assert!(io.reads <= 2 * 64 + 2 * 10 + 6, "reads {}", io.reads);
        assert!(io.write_calls <= 12, "write calls {}", io.write_calls);
    }

    #[test]
    fn cache_shortcuts_and_detects() {
        let h = NodeHasher::new([1; 32]);
        let cache = NodeCache::new(1024);
        let t = MerkleTree::new(&h, FILE, Some(&cache));
        let l: Vec<Hash> = (0..100).map(leaf).collect();
        let mut ts = TreeState::empty(&h, &FILE);
        let mut io = Recording::default();
        t.append(&mut ts, &mut io, &l).unwrap();
        t.verify(&ts, &mut io, 40, &l[40..41]).unwrap();
        io.reads = 0;
        t.verify(&ts, &mut io, 40, &l[40..41]).unwrap();
        assert_eq!(io.reads, 0, "second verify answered by the cache");
        // A wrong leaf that is cached is a cache mismatch.
        assert!(matches!(
            t.verify(&ts, &mut io, 40, &[leaf(1)]),
            Err(TreeError::CacheMismatch { flat: 80, leaf: 40 })
        ));
        // Neighbour leaf: its path meets the cached path at the parent.
        io.reads = 0;
        t.verify(&ts, &mut io, 41, &l[41..42]).unwrap();
        assert!(io.reads <= 1);
        assert!(cache.hits() > 0);
        // Update keeps the cache coherent: the old value no longer verifies.
        t.update(&mut ts, &mut io, 40, &[leaf(777)]).unwrap();
        assert!(t.verify(&ts, &mut io, 40, &l[40..41]).is_err());
        t.verify(&ts, &mut io, 40, &[leaf(777)]).unwrap();
        t.verify(&ts, &mut io, 41, &l[41..42]).unwrap();
    }

    /// Past [`MAX_LEAVES`], reads and appends are refused as out of range before any
    /// storage is touched (flat indices would leave `u64`).
    #[test]
    fn nothing_past_max_leaves() {
        let h = NodeHasher::new([1; 32]);
        let t = MerkleTree::new(&h, FILE, None);
        let mut io = Recording::default();
        for (first, count) in [(MAX_LEAVES, 1), (MAX_LEAVES - 1, 2), (u64::MAX, 1)] {
            assert!(
                matches!(
                    t.stored_leaves(&mut io, first, count),
                    Err(TreeError::OutOfRange { .. })
                ),
                "{first}+{count}"
            );
        }
        assert_eq!(
            t.stored_leaves(&mut io, MAX_LEAVES - 1, 1).unwrap(),
            [ZERO_HASH]
        );
        let mut ts = TreeState {
            leaves: MAX_LEAVES,
            root: h.empty_root(&FILE),
        };
        for r in [
            t.append(&mut ts, &mut io, &[leaf(1)]),
            t.append_holes(&mut ts, &mut io, 1),
        ] {
            assert!(matches!(r, Err(TreeError::OutOfRange { .. })), "{r:?}");
        }
        assert_eq!(io.reads, 1, "only the one read in range");
    }

    /// A verified run leaves both its end leaves in the cache (the leaves in between are
    /// covered by the cached nodes above them): either end then verifies with no read.
    #[test]
    fn a_verified_run_caches_both_ends() {
        let h = NodeHasher::new([1; 32]);
        let cache = NodeCache::new(1 << 16);
        let t = MerkleTree::new(&h, FILE, Some(&cache));
        let l: Vec<Hash> = (0..8).map(leaf).collect();
        let mut ts = TreeState::empty(&h, &FILE);
        let mut io = Recording::default();
        t.append(&mut ts, &mut io, &l).unwrap();
        cache.remove_in(&FILE, 0..u64::MAX);
        t.verify(&ts, &mut io, 2, &l[2..6]).unwrap();
        io.reads = 0;
        t.verify(&ts, &mut io, 5, &l[5..6]).unwrap();
        t.verify(&ts, &mut io, 2, &l[2..3]).unwrap();
        assert_eq!(io.reads, 0, "both ends answered by the cache");
    }

    /// A truncation leaves in the cache only complete nodes of the new tree, and a
    /// truncation to nothing or an extension by holes leaves none that is not one: for
    /// every length, the node over `[0, t + 1)` (at flat index `t` when `t + 1` is a power
    /// of two) is gone after a truncation to `t`.
    #[test]
    fn truncations_leave_only_nodes_of_the_new_tree_cached() {
        let h = NodeHasher::new([1; 32]);
        let l: Vec<Hash> = (0..16).map(leaf).collect();
        for t_len in 0..16u64 {
            let cache = NodeCache::new(1 << 16);
            let t = MerkleTree::new(&h, FILE, Some(&cache));
            let mut ts = TreeState::empty(&h, &FILE);
            let mut io = VecNodeIo::default();
            t.append(&mut ts, &mut io, &l).unwrap();
            t.verify(&ts, &mut io, 0, &l).unwrap();
            t.truncate(&mut ts, &mut io, t_len).unwrap();
            for flat in 0..stored_node_count(16) {
                if cache.get(&FILE, flat).is_some() {
                    assert!(
                        is_complete_node(flat, t_len),
                        "node {flat} cached after a truncation to {t_len}"
                    );
                }
            }
            t.append_holes(&mut ts, &mut io, 16 - t_len).unwrap();
            for flat in 0..stored_node_count(16) {
                if let Some(v) = cache.get(&FILE, flat) {
                    let stored = io.0.get(flat as usize).copied().unwrap_or(ZERO_HASH);
                    assert_eq!(v, stored, "node {flat} after holes from {t_len}");
                }
            }
        }
    }

    #[test]
    fn append_and_truncate_reject_tampered_storage() {
        let h = NodeHasher::new([2; 32]);
        let t = MerkleTree::new(&h, FILE, None);
        let l: Vec<Hash> = (0..13).map(leaf).collect();
        let mut ts = TreeState::empty(&h, &FILE);
        let mut io = VecNodeIo::default();
        t.append(&mut ts, &mut io, &l[..11]).unwrap();
        // Peaks of 11: [0,8) at 7, [8,10) at 17, leaf 10 at 20.
        for f in [7usize, 17, 20] {
            let mut io2 = io.clone();
            io2.0[f][1] ^= 1;
            let mut ts2 = ts;
            assert!(matches!(
                t.append(&mut ts2, &mut io2, &l[11..]),
                Err(TreeError::Mismatch { leaf: 11 })
            ));
            assert_eq!(ts2, ts);
        }
        // Truncate to 5: path of old leaf 5 reads leaf 4 (flat 8), node [6,8) (13), node [0,4) (3), peaks.
        for f in [8usize, 13, 3, 17, 20, 10] {
            let mut io2 = io.clone();
            io2.0[f][1] ^= 1;
            let mut ts2 = ts;
            assert!(t.truncate(&mut ts2, &mut io2, 5).is_err(), "flat {f}");
            assert_eq!(ts2, ts);
            assert_eq!(io2.0.len(), io.0.len());
        }
        t.truncate(&mut ts, &mut io, 5).unwrap();
        assert_eq!(ts.root, t.root_of(&l[..5]));
        assert_eq!(io.0.len(), 9);
    }

    #[test]
    fn zero_rule() {
        let h = NodeHasher::new([4; 32]);
        assert_eq!(h.node(&FILE, 1, &ZERO_HASH, &ZERO_HASH), ZERO_HASH);
        let a = h.node(&FILE, 1, &leaf(1), &ZERO_HASH);
        let b = h.node(&FILE, 1, &ZERO_HASH, &leaf(1));
        assert!(a != ZERO_HASH && b != ZERO_HASH && a != b);
        // Spine and root are always hashed: the root still binds the leaf count.
        assert_ne!(h.spine(&FILE, 0, 3, &ZERO_HASH, &ZERO_HASH), ZERO_HASH);
        let t = MerkleTree::new(&h, FILE, None);
        let z = vec![ZERO_HASH; 8];
        assert_ne!(t.root_of(&z[..4]), t.root_of(&z[..8]));
        assert_ne!(t.root_of(&z[..5]), t.root_of(&z[..6]));
        assert_ne!(t.root_of(&z[..1]), t.root_of(&[]));
    }

    /// A sparse in-memory [`NodeIo`] that counts node writes (a `VecNodeIo` would allocate
    /// every position up to the highest one written).
    #[derive(Default)]
    struct SparseIo {
        nodes: BTreeMap<u64, Hash>,
        written: usize,
    }

    impl NodeIo for SparseIo {
        fn read_nodes(&mut self, first: u64, out: &mut [Hash]) -> std::io::Result<()> {
            for (j, o) in out.iter_mut().enumerate() {
                *o = self
                    .nodes
                    .get(&(first + j as u64))
                    .copied()
                    .unwrap_or(ZERO_HASH);
            }
            Ok(())
        }
        fn write_nodes(&mut self, first: u64, nodes: &[Hash]) -> std::io::Result<()> {
            self.written += nodes.len();
            for (j, v) in nodes.iter().enumerate() {
                self.nodes.insert(first + j as u64, *v);
            }
            Ok(())
        }
        fn truncate_nodes(&mut self, count: u64) -> std::io::Result<()> {
            self.nodes.split_off(&count);
            Ok(())
        }
    }

    /// Reference root of an `n`-leaf tree whose leaves are zero except `nonzero`, computed
    /// from scratch with the zero rule (all-zero subtrees are not descended into).
    fn sparse_root(t: &MerkleTree<'_>, nonzero: &BTreeMap<u64, Hash>, n: u64) -> Hash {
        fn complete(t: &MerkleTree<'_>, nz: &BTreeMap<u64, Hash>, s: u64, h: u32) -> Hash {
            if nz.range(s..s + (1u64 << h)).next().is_none() {
                return ZERO_HASH;
            }
            if h == 0 {
                return nz[&s];
            }
            let half = 1u64 << (h - 1);
            let l = complete(t, nz, s, h - 1);
            let r = complete(t, nz, s + half, h - 1);
            t.hasher.node(&t.file, flat_index(h, s >> h), &l, &r)
        }
        let ps: Vec<(u64, Hash)> = peaks(n)
            .map(|(s, h)| (s, complete(t, nonzero, s, h)))
            .collect();
        t.hasher.root_from_peaks(&t.file, n, &ps)
    }

    #[test]
    fn append_holes_matches_slow_path() {
        let h = NodeHasher::new([6; 32]);
        let l: Vec<Hash> = (0..40).map(leaf).collect();
        for cache_bytes in [None, Some(0), Some(1024), Some(1 << 20)] {
            let cache = cache_bytes.map(NodeCache::new);
            let fast_t = MerkleTree::new(&h, FILE, cache.as_ref());
            let slow_t = MerkleTree::new(&h, FILE, None);
            for n0 in [0usize, 1, 2, 3, 5, 6, 7, 8, 13, 16, 31] {
                for count in [1u64, 2, 3, 7, 8, 9, 100, 1023, 1024, 3001] {
                    let mut fast = Recording::default();
                    let mut slow = VecNodeIo::default();
                    let mut fts = TreeState::empty(&h, &FILE);
                    let mut sts = fts;
                    fast_t.append(&mut fts, &mut fast, &l[..n0]).unwrap();
                    slow_t.append(&mut sts, &mut slow, &l[..n0]).unwrap();
                    // Stale junk past the end of the node storage (e.g. a leftover of an
                    // interrupted operation) must not be taken for hole nodes.
                    let end = stored_node_count(n0 as u64) as usize;
                    fast.inner
                        .0
                        .resize(end + 2 * count as usize + 8, [0xAB; 32]);
                    fast.written.clear();
                    fast.write_calls = 0;
                    fast_t.append_holes(&mut fts, &mut fast, count).unwrap();
                    slow_t
                        .append(&mut sts, &mut slow, &vec![ZERO_HASH; count as usize])
                        .unwrap();
                    assert_eq!(fts, sts, "n0 {n0} count {count}");
                    let n2 = n0 as u64 + count;
                    assert!(fast.written.len() <= 64, "{} writes", fast.written.len());
                    assert!(fast.write_calls <= 64);
                    // Same readable values at every complete node.
                    let mut a = vec![ZERO_HASH; stored_node_count(n2) as usize];
                    let mut b = a.clone();
                    fast.read_nodes(0, &mut a).unwrap();
                    slow.read_nodes(0, &mut b).unwrap();
                    for f in 0..stored_node_count(n2) {
                        if is_complete_node(f, n2) {
                            assert_eq!(a[f as usize], b[f as usize], "node {f}");
                        }
                    }
                    // Then the same operations agree.
                    let mid = n0 as u64 + count / 2;
                    for (tr, ts, io) in [
                        (&fast_t, &mut fts, &mut fast as &mut dyn NodeIo),
                        (&slow_t, &mut sts, &mut slow as &mut dyn NodeIo),
                    ] {
                        tr.verify(ts, io, mid, &[ZERO_HASH]).unwrap();
                        tr.update(ts, io, mid, &[leaf(999)]).unwrap();
                        tr.append(ts, io, &l[..3]).unwrap();
                        tr.verify(ts, io, mid, &[leaf(999)]).unwrap();
                        tr.verify(ts, io, n2, &l[..3]).unwrap();
                        tr.truncate(ts, io, mid + 1).unwrap();
                        tr.verify(ts, io, mid, &[leaf(999)]).unwrap();
                    }
                    assert_eq!(fts, sts);
                    let mut nz: BTreeMap<u64, Hash> = (0..n0).map(|i| (i as u64, l[i])).collect();
                    nz.insert(mid, leaf(999));
                    nz.retain(|&i, _| i <= mid);
                    assert_eq!(fts.root, sparse_root(&fast_t, &nz, mid + 1));
                }
            }
        }
    }

    #[test]
    fn append_holes_is_logarithmic() {
        let h = NodeHasher::new([7; 32]);
        let l: Vec<Hash> = (0..8).map(leaf).collect();
        for cache_bytes in [None, Some(1024)] {
            let cache = cache_bytes.map(NodeCache::new);
            let t = MerkleTree::new(&h, FILE, cache.as_ref());
            let mut ts = TreeState::empty(&h, &FILE);
            let mut io = SparseIo::default();
            t.append(&mut ts, &mut io, &l[..5]).unwrap();
            let mut nz: BTreeMap<u64, Hash> = (0..5).map(|i| (i, l[i as usize])).collect();
            io.written = 0;
            let start = std::time::Instant::now();
            let count = 1u64 << 30;
            t.append_holes(&mut ts, &mut io, count).unwrap();
            assert!(start.elapsed() < std::time::Duration::from_secs(1));
            assert!(io.written <= 2 * 31, "{} node writes", io.written);
            let n = 5 + count;
            assert_eq!(ts.leaves, n);
            assert_eq!(ts.root, sparse_root(&t, &nz, n));
            t.verify(&ts, &mut io, 0, &l[..5]).unwrap();
            let mid = 1u64 << 29;
            t.verify(&ts, &mut io, mid - 2, &[ZERO_HASH; 4]).unwrap();
            t.verify(&ts, &mut io, n - 1, &[ZERO_HASH]).unwrap();
            assert!(t.verify(&ts, &mut io, mid, &[leaf(1)]).is_err());
            // Writing a block in the middle of the hole.
            io.written = 0;
            t.update(&mut ts, &mut io, mid, &[leaf(42)]).unwrap();
            assert!(io.written <= 2 * 31, "{} node writes", io.written);
            nz.insert(mid, leaf(42));
            assert_eq!(ts.root, sparse_root(&t, &nz, n));
            t.verify(&ts, &mut io, mid, &[leaf(42)]).unwrap();
            assert!(t.verify(&ts, &mut io, mid, &[ZERO_HASH]).is_err());
            t.verify(&ts, &mut io, mid + 1, &[ZERO_HASH]).unwrap();
            // Appending after the hole, and a second hole.
            t.append(&mut ts, &mut io, &l[5..8]).unwrap();
            nz.extend((0..3).map(|k| (n + k, l[5 + k as usize])));
            t.append_holes(&mut ts, &mut io, count + 12345).unwrap();
            let n = n + 3 + count + 12345;
            assert_eq!(ts.root, sparse_root(&t, &nz, n));
            t.verify(&ts, &mut io, n - 3 - count - 12345, &l[5..8])
                .unwrap();
            t.verify(&ts, &mut io, mid, &[leaf(42)]).unwrap();
            // Truncating into the hole and back to the original leaves.
            t.truncate(&mut ts, &mut io, mid + 1).unwrap();
            nz.retain(|&i, _| i <= mid);
            assert_eq!(ts.root, sparse_root(&t, &nz, mid + 1));
            t.verify(&ts, &mut io, mid, &[leaf(42)]).unwrap();
            t.truncate(&mut ts, &mut io, 5).unwrap();
            assert_eq!(ts.root, t.root_of(&l[..5]));
            assert!(start.elapsed() < std::time::Duration::from_secs(1));
        }
    }

    #[test]
    fn append_holes_rejects_tampered_peaks() {
        let h = NodeHasher::new([2; 32]);
        let t = MerkleTree::new(&h, FILE, None);
        let l: Vec<Hash> = (0..11).map(leaf).collect();
        let mut ts = TreeState::empty(&h, &FILE);
        let mut io = VecNodeIo::default();
        t.append(&mut ts, &mut io, &l).unwrap();
        for f in [7usize, 17, 20] {
            let mut io2 = io.clone();
            io2.0[f][1] ^= 1;
            let mut ts2 = ts;
            assert!(matches!(
                t.append_holes(&mut ts2, &mut io2, 1000),
                Err(TreeError::Mismatch { leaf: 11 })
            ));
            assert_eq!(ts2, ts);
        }
        assert!(matches!(
            t.append_holes(&mut ts, &mut io, MAX_LEAVES),
            Err(TreeError::OutOfRange { .. })
        ));
        let before = (ts, io.clone());
        t.append_holes(&mut ts, &mut io, 0).unwrap();
        assert_eq!((ts, io), before);
    }

    // ---- property test against a from-scratch reference ----

    #[derive(Clone, Debug)]
    enum Op {
        Append(Vec<u64>),
        /// Append this many holes (`append_holes`).
        AppendHoles(u64),
        Update(u64, Vec<u64>),
        /// Several runs at once (`update_runs`): gaps before each run and its values.
        UpdateRuns(Vec<(u64, Vec<u64>)>),
        Truncate(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => proptest::collection::vec(any::<u64>(), 1..40).prop_map(Op::Append),
            1 => prop_oneof![1u64..40, 1u64..2000].prop_map(Op::AppendHoles),
            3 => (any::<u64>(), proptest::collection::vec(any::<u64>(), 1..20)).prop_map(|(f, v)| Op::Update(f, v)),
            3 => proptest::collection::vec(
                (prop_oneof![0u64..3, 0u64..40], proptest::collection::vec(any::<u64>(), 1..4)),
                1..12,
            )
            .prop_map(Op::UpdateRuns),
            1 => any::<u64>().prop_map(Op::Truncate),
        ]
    }

    /// Flips bits of the stored node `f`, extending the storage with zeros (which is what
    /// positions past its end read as) when needed.
    fn flip(io: &mut VecNodeIo, f: usize, byte: usize, mask: u8) {
        if io.0.len() <= f {
            io.0.resize(f + 1, ZERO_HASH);
        }
        io.0[f][byte] ^= mask;
    }

    /// Verifies a few ranges, and that wrong leaves and tampered nodes are rejected.
    fn check_all(
        t: &MerkleTree<'_>,
        ts: &TreeState,
        io: &mut VecNodeIo,
        leaves: &[Hash],
        seed: u64,
    ) -> Result<(), TestCaseError> {
        let n = leaves.len() as u64;
        prop_assert_eq!(ts.leaves, n);
        prop_assert_eq!(ts.root, t.root_of(leaves));
        // Stored complete nodes (as read: positions past the end read as zero) equal the
        // reference.
        let reference = reference_nodes(t, leaves);
        let mut stored = vec![ZERO_HASH; reference.len()];
        io.read_nodes(0, &mut stored)?;
        for (f, v) in reference.iter().enumerate() {
            if let Some(v) = v {
                prop_assert_eq!(stored[f], *v, "stored node {}", f);
            }
        }
        prop_assert!(io.0.len() as u64 <= stored_node_count(n));
        if n == 0 {
            return Ok(());
        }
        let nocache = MerkleTree::new(t.hasher, t.file, None);
        for k in 0..4u64 {
            let a = (seed.wrapping_mul(k + 7) >> 3) % n;
            let len = 1 + (seed.wrapping_add(k * 31) >> 5) % (n - a).min(17);
            let r = a as usize..(a + len) as usize;
            t.verify(ts, io, a, &leaves[r.clone()])
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            // Wrong leaf value anywhere in the range: rejected (also with the cache).
            let mut wrong = leaves[r.clone()].to_vec();
            let w = ((seed >> 7) % len) as usize;
            wrong[w][0] ^= 1;
            prop_assert!(t.verify(ts, io, a, &wrong).is_err());
            prop_assert!(nocache.verify(ts, io, a, &wrong).is_err());
        }
        // Flip one stored complete node; a leaf whose path reads it must fail to verify.
        let f = (seed % stored_node_count(n)) as usize;
        if is_complete_node(f as u64, n) {
            let (level, start) = flat_span(f as u64);
            let size = 1u64 << level;
            // A leaf reading node f: in its sibling subtree, or, for a peak, any other peak.
            let is_peak = peaks(n).any(|(s, h)| s == start && h == level);
            let reader = if is_peak {
                peaks(n).find(|&(s, _)| s != start).map(|(s, _)| s)
            } else {
                Some(start ^ size)
            };
            if let Some(i) = reader {
                flip(io, f, 5, 0x40);
                prop_assert!(
                    nocache
                        .verify(ts, io, i, &leaves[i as usize..=i as usize])
                        .is_err(),
                    "flip at {} not detected by leaf {}",
                    f,
                    i
                );
                // Update through a tampered sibling must fail and leave state unchanged.
                let mut ts2 = *ts;
                let before = io.clone();
                prop_assert!(nocache.update(&mut ts2, io, i, &[leaf(12345)]).is_err());
                prop_assert_eq!(ts2, *ts);
                prop_assert!(before == *io);
                flip(io, f, 5, 0x40);
            }
        }
        Ok(())
    }

    fn run_ops(cache_bytes: Option<usize>, ops: Vec<Op>, seed: u64) -> Result<(), TestCaseError> {
        let h = NodeHasher::new([5; 32]);
        let cache = cache_bytes.map(NodeCache::new);
        let t = MerkleTree::new(&h, FILE, cache.as_ref());
        let mut ts = TreeState::empty(&h, &FILE);
        let mut io = VecNodeIo::default();
        let mut leaves: Vec<Hash> = Vec::new();
        for (k, o) in ops.into_iter().enumerate() {
            let seed = seed
                .wrapping_add(k as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
            match o {
                Op::Append(v) => {
                    let new: Vec<Hash> = v.iter().map(|&x| leaf(x)).collect();
                    t.append(&mut ts, &mut io, &new)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    leaves.extend(new);
                }
                Op::AppendHoles(count) => {
                    t.append_holes(&mut ts, &mut io, count)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    leaves.resize(leaves.len() + count as usize, ZERO_HASH);
                }
                Op::Update(f, v) => {
                    if leaves.is_empty() {
                        continue;
                    }
                    let n = leaves.len() as u64;
                    let first = f % n;
                    let count = (v.len() as u64).min(n - first) as usize;
                    let new: Vec<Hash> = v[..count].iter().map(|&x| leaf(x)).collect();
                    // A tampered stored old leaf makes the update fail (without cache help).
                    if seed.is_multiple_of(3) {
                        let nocache = MerkleTree::new(&h, FILE, None);
                        let fl = 2 * (first + (seed >> 9) % count as u64) as usize;
                        flip(&mut io, fl, 0, 1);
                        let mut ts2 = ts;
                        prop_assert!(nocache.update(&mut ts2, &mut io, first, &new).is_err());
                        prop_assert_eq!(ts2, ts);
                        flip(&mut io, fl, 0, 1);
                    }
                    t.update(&mut ts, &mut io, first, &new)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    leaves[first as usize..first as usize + count].copy_from_slice(&new);
                }
                Op::UpdateRuns(spec) => {
                    let n = leaves.len() as u64;
                    // The runs that fit, from a start picked by the seed.
                    let mut runs: Vec<(u64, Vec<Hash>)> = Vec::new();
                    let mut at = if n == 0 { 0 } else { seed % n };
                    for (gap, v) in spec {
                        let first = at + gap;
                        if first >= n {
                            break;
                        }
                        let count = (v.len() as u64).min(n - first) as usize;
                        runs.push((first, v[..count].iter().map(|&x| leaf(x)).collect()));
                        at = first + count as u64;
                    }
                    if runs.is_empty() {
                        continue;
                    }
                    let arg: Vec<(u64, &[Hash])> =
                        runs.iter().map(|(f, v)| (*f, v.as_slice())).collect();
                    // The same tree as the runs one by one.
                    let mut one_by_one = (ts, io.clone());
                    let nocache = MerkleTree::new(&h, FILE, None);
                    for (f, v) in &runs {
                        nocache
                            .update(&mut one_by_one.0, &mut one_by_one.1, *f, v)
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    }
                    // A tampered stored old leaf of any run, or a tampered node a run reads,
                    // makes the update fail (without cache help) and write nothing.
                    let (r, _) = &runs[(seed >> 5) as usize % runs.len()];
                    for fl in [2 * *r as usize, (seed % stored_node_count(n)) as usize] {
                        if !is_complete_node(fl as u64, n) {
                            continue;
                        }
                        let before = io.clone();
                        flip(&mut io, fl, 3, 8);
                        let mut ts2 = ts;
                        let tampered = io.clone();
                        match nocache.update_runs(&mut ts2, &mut io, &arg) {
                            Err(_) => {
                                prop_assert_eq!(ts2, ts);
                                prop_assert!(tampered == io, "written after a failed check");
                            }
                            // The flipped node is none the runs read (one they all
                            // rewrite, or off their paths): the tree is the right one.
                            Ok(()) => prop_assert_eq!(ts2, one_by_one.0),
                        }
                        io = before;
                    }
                    t.update_runs(&mut ts, &mut io, &arg)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(ts, one_by_one.0);
                    for (f, v) in &runs {
                        leaves[*f as usize..*f as usize + v.len()].copy_from_slice(v);
                    }
                }
                Op::Truncate(x) => {
                    let n = leaves.len() as u64;
                    let to = if n == 0 { 0 } else { x % (n + 1) };
                    t.truncate(&mut ts, &mut io, to)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    leaves.truncate(to as usize);
                }
            }
            check_all(&t, &ts, &mut io, &leaves, seed)?;
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn ops_match_reference_no_cache(ops in proptest::collection::vec(op(), 1..25), seed in any::<u64>()) {
            run_ops(None, ops, seed)?;
        }

        #[test]
        fn ops_match_reference_zero_cache(ops in proptest::collection::vec(op(), 1..25), seed in any::<u64>()) {
            run_ops(Some(0), ops, seed)?;
        }

        #[test]
        fn ops_match_reference_small_cache(ops in proptest::collection::vec(op(), 1..25), seed in any::<u64>()) {
            run_ops(Some(1024), ops, seed)?;
        }

        #[test]
        fn ops_match_reference_large_cache(ops in proptest::collection::vec(op(), 1..25), seed in any::<u64>()) {
            run_ops(Some(1 << 20), ops, seed)?;
        }
    }
}
