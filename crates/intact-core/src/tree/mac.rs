//! The counter MAC tree of Yun, Shi and Kim (2009), §4.1 and Fig. 2.
//!
//! An `a`-ary tree of write counters. Level 0 holds one counter per file block (the leaf
//! counters `N_i^(0)`); a counter at level `j + 1` counts the writes of the *node* below
//! it, the group of `a` level-`j` counters `N_{xa}^(j) .. N_{xa+a-1}^(j)`, and that node is
//! authenticated by a Wegman–Carter MAC whose nonce is the parent counter:
//!
//! ```text
//! T_x^(j+1) = MAC(<x, j+1, N_x^(j+1)>_a, N_{xa}^(j) || ... || N_{xa+a-1}^(j))
//! ```
//!
//! The single counter at level `l` (the root counter) is trusted, with `m` (how many leaf
//! counters exist) and `l` (the depth); everything else lives in untrusted storage. Trust
//! flows down: a node whose MAC verifies under a trusted parent counter has trusted
//! counters. Counters never repeat a value for a position (so no MAC nonce repeats): a
//! changed node's parent counter becomes `max(old + 1, floor)` where `floor` is the
//! session's counter reservation, and counters are never reset — a deleted block keeps
//! its counter (the paper's `m >= n`).
//!
//! Two additions to the paper, both to keep sparse files cheap:
//!
//! - **Zero rule.** A node whose (trusted) parent counter is 0 was never written: it is
//!   all zeros and is neither read nor verified. So `m` can grow by a huge gap at the cost
//!   of the path to the new leaves only.
//! - **Hole mark.** A leaf counter with bit 63 ([`HOLE`]) set is a hole that reads as
//!   zeros but keeps its last counter value (bits 0..63) so a later write still moves
//!   above it. Re-extending a file over blocks it once had sets this mark.
//!
//! Storage (`US_F`): level-0 nodes in one object (`.m`), each record followed by the
//! 16-byte tags of its `a` blocks; the upper levels in another (`.c`), in post-order so
//! that no node moves when the tree grows. See docs/file-format.md, "mac-tree".

use crate::crypto::{FileId, PolyAes};
use crate::metrics::{phase, timed, Phase};
use crate::tree::NodeCache;
use std::collections::{BTreeMap, BTreeSet};

/// A 16-byte MAC tag.
pub type Tag = [u8; 16];

/// Leaf-counter bit marking a hole that keeps its last counter value.
pub const HOLE: u64 = 1 << 63;

/// Domain byte of block-encryption (CTR keystream) nonces.
pub const NONCE_ENC: u8 = 0x01;
/// Domain byte of MAC nonces (blocks at level 0, nodes at levels >= 1).
pub const NONCE_MAC: u8 = 0x02;

/// The 16-byte nonce encoding (Yun et al. §4.2, `<i, j, N>_e` and `<i, j, N>_a`):
/// `N` u64 LE (0..8) || `index` u32 LE (8..12) || `(domain << 24) + sub` u32 BE (12..16).
/// Encryption uses domain [`NONCE_ENC`] with `sub` = the AES block within the file block
/// (the CTR counter, < 2^12 for 64 KiB blocks); MACs use [`NONCE_MAC`] with `sub` = the
/// level (0 for a block's tag, `j + 1` for a level-`j` node's). The domains never meet,
/// and within one domain the triple is injective.
pub fn nonce(domain: u8, index: u64, sub: u32, ctr: u64) -> [u8; 16] {
    debug_assert!(index <= u32::MAX as u64 && sub < 1 << 24);
    let mut n = [0u8; 16];
    n[..8].copy_from_slice(&ctr.to_le_bytes());
    n[8..12].copy_from_slice(&(index as u32).to_le_bytes());
    n[12..].copy_from_slice(&(((domain as u32) << 24) | sub).to_be_bytes());
    n
}

/// The trusted state of a file's MAC tree (besides `n`, the block count): `m`, `l`, the
/// root counter, and the arity. Encoded in the 32-byte root field of the inode record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacTreeState {
    /// Leaf counters that exist (positions `>= m` are 0). Never decreases.
    pub m: u64,
    /// Depth `l`: stored levels `0..l`; 0 when `m == 0`.
    pub depth: u8,
    /// log2 of the arity.
    pub arity_log2: u8,
    /// The root counter `N^(l)`.
    pub root: u64,
}

/// Why a MAC-tree operation failed.
#[derive(Debug)]
pub enum MacTreeError {
    /// A node's MAC does not verify under its trusted parent counter. `leaf` is the first
    /// requested leaf below it.
    Mismatch {
        /// Level of the node (0: leaf counters).
        level: u8,
        /// Index of the node within its level.
        node: u64,
        /// First requested leaf under the node.
        leaf: u64,
    },
    /// A counter would reach the session's limit.
    Exhausted,
    /// The trusted state is malformed.
    BadState(String),
    /// The store failed.
    Io(crate::Error),
}

/// Which object a node lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Obj {
    /// Level-0 records (counters, node tag, block tags): `.m`.
    Leaves,
    /// Levels >= 1, post-order: `.c`.
    Upper,
}

/// Byte access to the two objects.
pub trait MacIo {
    /// Reads `buf.len()` bytes at `off` (zeros past the end).
    fn read(&mut self, obj: Obj, off: u64, buf: &mut [u8]) -> crate::Result<()>;
    /// Writes `data` at `off`.
    fn write(&mut self, obj: Obj, off: u64, data: &[u8]) -> crate::Result<()>;
}

impl MacTreeState {
    /// An empty tree.
    pub fn empty(arity_log2: u8) -> Self {
        MacTreeState {
            m: 0,
            depth: 0,
            arity_log2,
            root: 0,
        }
    }

    /// `m (u64 LE) || root (u64 LE) || depth (u8) || log2 arity (u8) || 14 zero bytes`.
    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&self.m.to_le_bytes());
        b[8..16].copy_from_slice(&self.root.to_le_bytes());
        b[16] = self.depth;
        b[17] = self.arity_log2;
        b
    }

    /// Parses and validates (`depth` must be the one `m` implies).
    pub fn decode(b: &[u8; 32]) -> Option<Self> {
        let s = MacTreeState {
            m: u64::from_le_bytes(b[..8].try_into().ok()?),
            root: u64::from_le_bytes(b[8..16].try_into().ok()?),
            depth: b[16],
            arity_log2: b[17],
        };
        let ok = (1..=8).contains(&s.arity_log2)
            && b[18..].iter().all(|&x| x == 0)
            && s.m <= crate::crypto::MAX_BLOCKS
            && depth_for(s.m, 1 << s.arity_log2) == s.depth
            && (s.m == 0) == (s.root == 0)
            && s.root & HOLE == 0;
        ok.then_some(s)
    }
}

/// The depth of a tree of `m` leaf counters: the least `l >= 1` with `a^l >= m` (0 for 0).
pub fn depth_for(m: u64, a: u64) -> u8 {
    if m == 0 {
        return 0;
    }
    let (mut l, mut cap) = (1u8, a);
    while cap < m {
        cap = cap.saturating_mul(a);
        l += 1;
    }
    l
}

/// Position (in records) of upper node (`level >= 1`, `x`) in the `.c` object.
///
/// Upper nodes are grouped by the first level-1 node they cover, `y = x a^(level-1)`:
/// group `y` holds node `(1, y)`, then `(2, y/a)` if `a | y`, then `(3, y/a^2)` if
/// `a^2 | y`, and so on up to the deepest level any file can have, `K = depth_for(2^32,
/// a) - 1` (5 for `a = 64`). Groups are laid out in order, so group `y` starts at
/// `G(y) = y + sum_{k=2..=K} ceil(y / a^(k-1))` and the node sits at `G(y) + level - 1`.
/// Growing the tree (more leaves, more levels) never moves a node, and the object stays
/// dense: a file with `L` level-1 nodes uses about `L (1 + 1/(a-1)) + K` records.
pub fn upper_pos(level: u8, x: u64, a: u64) -> u64 {
    debug_assert!(level >= 1);
    let kmax = depth_for(crate::crypto::MAX_BLOCKS, a).saturating_sub(1);
    let y = x.saturating_mul(a.saturating_pow(level as u32 - 1));
    let mut g = y;
    let mut p = a;
    for _ in 2..=kmax {
        g = g.saturating_add(y.div_ceil(p));
        p = p.saturating_mul(a);
    }
    g.saturating_add(level as u64 - 1)
}

/// A loaded node: its counters (trusted once verified) and its stored tag.
#[derive(Debug, Clone)]
struct Node {
    ctrs: Vec<u64>,
    tag: Tag,
}

/// The MAC tree of one file: shape, keys and cache.
pub struct MacTree<'a> {
    /// The file (cache keys).
    pub file: FileId,
    /// The MAC (Poly1305-AES).
    pub mac: &'a PolyAes<aes::Aes256>,
    /// Cache of verified counters of levels >= 1 (the Merkle-node cache, reused).
    pub cache: Option<&'a NodeCache>,
}

/// One verified leaf: its counter and its stored block tag.
pub type Leaf = (u64, Tag);

/// Cache key of counter `x` at `level` (levels >= 1 only).
fn ckey(level: u8, x: u64) -> u64 {
    (1u64 << 63) | ((level as u64) << 48) | x
}

impl MacTree<'_> {
    fn a(ts: &MacTreeState) -> u64 {
        1 << ts.arity_log2
    }

    /// Bytes of a level-0 record: `a` counters, the node tag, `a` block tags.
    pub fn leaf_record(a: u64) -> u64 {
        8 * a + 16 + 16 * a
    }

    /// Bytes of an upper record: `a` counters and the node tag.
    pub fn upper_record(a: u64) -> u64 {
        8 * a + 16
    }

    fn node_mac(&self, level: u8, x: u64, parent: u64, ctrs: &[u64]) -> Tag {
        let mut msg = Vec::with_capacity(8 * ctrs.len());
        for c in ctrs {
            msg.extend_from_slice(&c.to_le_bytes());
        }
        let _t = phase(Phase::HashMac);
        self.mac
            .mac(&nonce(NONCE_MAC, x, level as u32 + 1, parent), &msg)
    }

    fn load_node(
        &self,
        io: &mut dyn MacIo,
        a: u64,
        level: u8,
        x: u64,
    ) -> Result<Node, MacTreeError> {
        let (obj, off) = if level == 0 {
            (Obj::Leaves, x * Self::leaf_record(a))
        } else {
            (Obj::Upper, upper_pos(level, x, a) * Self::upper_record(a))
        };
        let mut buf = vec![0u8; (8 * a + 16) as usize];
        io.read(obj, off, &mut buf).map_err(MacTreeError::Io)?;
        Ok(Self::parse(&buf, a))
    }

    fn parse(buf: &[u8], a: u64) -> Node {
        let a = a as usize;
        Node {
            ctrs: buf[..8 * a]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            tag: buf[8 * a..8 * a + 16].try_into().expect("16 bytes"),
        }
    }

    fn store_node(
        &self,
        io: &mut dyn MacIo,
        a: u64,
        level: u8,
        x: u64,
        n: &Node,
    ) -> Result<(), MacTreeError> {
        let mut buf = Vec::with_capacity((8 * a + 16) as usize);
        for c in &n.ctrs {
            buf.extend_from_slice(&c.to_le_bytes());
        }
        buf.extend_from_slice(&n.tag);
        let (obj, off) = if level == 0 {
            (Obj::Leaves, x * Self::leaf_record(a))
        } else {
            (Obj::Upper, upper_pos(level, x, a) * Self::upper_record(a))
        };
        io.write(obj, off, &buf).map_err(MacTreeError::Io)
    }

    /// Loads and verifies the nodes `wanted[0]` (level-0 node indices, each with the
    /// first requested leaf under it for error messages) and every ancestor needed to
    /// reach a trusted counter (the root, or a cached counter; with `full_paths`, always
    /// the root). Returns the verified nodes by (level, index); nodes under a zero
    /// counter are all-zero and never read.
    fn load_verified(
        &self,
        ts: &MacTreeState,
        io: &mut dyn MacIo,
        wanted: &BTreeMap<u64, u64>,
        full_paths: bool,
    ) -> Result<BTreeMap<(u8, u64), Node>, MacTreeError> {
        let a = Self::a(ts);
        let l = ts.depth;
        // Bottom-up: which nodes to load at each level, and where the walk can stop.
        // need[j]: node index -> first requested leaf below it.
        let mut need: Vec<BTreeMap<u64, u64>> = vec![wanted.clone()];
        let mut known: BTreeMap<(u8, u64), u64> = BTreeMap::new(); // trusted parent ctr
        let _t = phase(Phase::Tree);
        for j in 0..l {
            let mut up: BTreeMap<u64, u64> = BTreeMap::new();
            for (&x, &leaf) in &need[j as usize] {
                if j + 1 == l {
                    // The top level has one node; any other lies outside the tree and was
                    // never written (zero rule).
                    known.insert((j, x), if x == 0 { ts.root } else { 0 });
                    continue;
                }
                if !full_paths {
                    if let Some(h) = self.cache.and_then(|c| c.get(&self.file, ckey(j + 1, x))) {
                        known.insert((j, x), u64::from_le_bytes(h[..8].try_into().expect("8")));
                        continue;
                    }
                }
                let e = up.entry(x / a).or_insert(leaf);
                *e = (*e).min(leaf);
            }
            if up.is_empty() {
                break;
            }
            need.push(up);
        }
        // Top-down: verify each node under its trusted parent counter.
        let mut nodes: BTreeMap<(u8, u64), Node> = BTreeMap::new();
        let mut fresh_ctrs: Vec<(u8, u64, u64)> = Vec::new();
        for j in (0..need.len()).rev() {
            let j8 = j as u8;
            for (&x, &leaf) in &need[j] {
                let parent = match known.get(&(j8, x)) {
                    Some(&p) => p,
                    None => {
                        let p = nodes
                            .get(&(j8 + 1, x / a))
                            .expect("parent loaded above")
                            .ctrs[(x % a) as usize];
                        fresh_ctrs.push((j8 + 1, x, p));
                        p
                    }
                };
                let node = if parent == 0 {
                    Node {
                        ctrs: vec![0; a as usize],
                        tag: [0; 16],
                    }
                } else {
                    let node = self.load_node(io, a, j8, x)?;
                    let want = self.node_mac(j8, x, parent, &node.ctrs);
                    if !crate::crypto::ct_eq(&want, &node.tag) {
                        return Err(MacTreeError::Mismatch {
                            level: j8,
                            node: x,
                            leaf,
                        });
                    }
                    node
                };
                nodes.insert((j8, x), node);
            }
        }
        if let Some(c) = self.cache {
            for (level, x, v) in fresh_ctrs {
                let mut h = [0u8; 32];
                h[..8].copy_from_slice(&v.to_le_bytes());
                c.insert(&self.file, ckey(level, x), h);
            }
        }
        Ok(nodes)
    }

    /// Check (Yun et al. §4.2, Read): the verified counters and stored block tags of leaves
    /// `[first, first + count)`. Leaves at or past `m` are holes (counter 0).
    pub fn read_leaves(
        &self,
        ts: &MacTreeState,
        io: &mut dyn MacIo,
        first: u64,
        count: u64,
    ) -> Result<Vec<Leaf>, MacTreeError> {
        let a = Self::a(ts);
        let mut out = vec![(0u64, [0u8; 16]); count as usize];
        let end = (first + count).min(ts.m);
        if first >= end {
            return Ok(out);
        }
        let mut wanted = BTreeMap::new();
        for g in first / a..=(end - 1) / a {
            wanted.insert(g, (g * a).max(first));
        }
        let nodes = self.load_verified(ts, io, &wanted, false)?;
        let _t = phase(Phase::Tree);
        for &g in wanted.keys() {
            let node = &nodes[&(0, g)];
            let (lo, hi) = ((g * a).max(first), ((g + 1) * a).min(end));
            let mut tags = vec![0u8; 16 * (hi - lo) as usize];
            if node.ctrs[(lo % a) as usize..][..(hi - lo) as usize]
                .iter()
                .any(|&c| c != 0 && c & HOLE == 0)
            {
                let off = g * Self::leaf_record(a) + 8 * a + 16 + 16 * (lo % a);
                io.read(Obj::Leaves, off, &mut tags)
                    .map_err(MacTreeError::Io)?;
            }
            for i in lo..hi {
                let k = (i - lo) as usize;
                out[(i - first) as usize] = (
                    node.ctrs[(i % a) as usize],
                    tags[16 * k..16 * k + 16].try_into().expect("16"),
                );
            }
        }
        Ok(out)
    }

    /// Update / Append (Yun et al. §4.2): verifies the paths of leaves `[first, end)`,
    /// lets `set` choose each leaf's new counter and block tag from its verified old
    /// counter (`None` keeps the stored tag), then increments every changed node's parent
    /// counter to `max(old + 1, floor)` (below `limit`), re-MACs the changed nodes and
    /// stores them, and returns the new trusted state. `m` grows to `end` if needed; the
    /// tree deepens as `m` requires (the old root counter becomes the first counter of the
    /// new top node).
    ///
    /// `set` is called in two passes: first with every old counter (`prepare`, to choose
    /// a counter for the run), then leaf by leaf.
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &self,
        ts: &MacTreeState,
        io: &mut dyn MacIo,
        first: u64,
        end: u64,
        floor: u64,
        limit: u64,
        prepare: &mut dyn FnMut(&[u64]) -> Result<(), MacTreeError>,
        set: &mut dyn FnMut(u64, u64) -> (u64, Option<Tag>),
    ) -> Result<MacTreeState, MacTreeError> {
        if first >= end {
            return Ok(*ts);
        }
        let a = Self::a(ts);
        let l0 = ts.depth;
        let m1 = ts.m.max(end);
        let l1 = depth_for(m1, a);
        // Touched nodes per level: the nodes over [first, end), their ancestors, and (when
        // the tree deepens) the left spine that will carry the old root counter.
        let mut touched: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); l1 as usize];
        touched[0].extend(first / a..=(end - 1) / a);
        for j in 1..l1 as usize {
            let below: Vec<u64> = touched[j - 1].iter().map(|x| x / a).collect();
            touched[j].extend(below);
            if j >= l0 as usize {
                touched[j].insert(0);
            }
        }
        // Load and verify the existing part (levels < l0) from the old root down.
        let mut nodes: BTreeMap<(u8, u64), Node> = BTreeMap::new();
        if l0 > 0 {
            let wanted: BTreeMap<u64, u64> = touched[0]
                .iter()
                .map(|&g| (g, (g * a).max(first)))
                .collect();
            nodes = self.load_verified(ts, io, &wanted, true)?;
            // That is every touched node of the old tree: the touched level-0 nodes and
            // their ancestors up to the old top level (where a node other than 0 lies
            // outside the old tree and is all zeros).
            debug_assert!((0..l0).all(|j| touched[j as usize]
                .iter()
                .all(|&x| nodes.contains_key(&(j, x)))));
        }
        let _t = phase(Phase::Tree);
        // New levels.
        for j in l0..l1 {
            for &x in &touched[j as usize] {
                nodes.entry((j, x)).or_insert_with(|| Node {
                    ctrs: vec![0; a as usize],
                    tag: [0; 16],
                });
            }
        }
        if l0 >= 1 && l1 > l0 {
            nodes.get_mut(&(l0, 0)).expect("spine").ctrs[0] = ts.root;
        }
        // Leaves.
        let old: Vec<u64> = (first..end)
            .map(|i| nodes[&(0, i / a)].ctrs[(i % a) as usize])
            .collect();
        prepare(&old)?;
        let mut tags: Vec<(u64, Tag)> = Vec::new();
        for i in first..end {
            let node = nodes.get_mut(&(0, i / a)).expect("touched");
            let slot = &mut node.ctrs[(i % a) as usize];
            let (v, tag) = set(i, *slot);
            *slot = v;
            if let Some(t) = tag {
                tags.push((i, t));
            }
        }
        // Bottom-up: fresh parent counters, MACs.
        let bump = |old: u64| -> Result<u64, MacTreeError> {
            let v = (old + 1).max(floor);
            if v >= limit || v & HOLE != 0 {
                return Err(MacTreeError::Exhausted);
            }
            Ok(v)
        };
        let mut root = ts.root;
        let mut new_ctrs: Vec<(u8, u64, u64)> = Vec::new();
        for j in 0..l1 {
            for &x in &touched[j as usize] {
                let parent = if j + 1 == l1 {
                    root = bump(root)?;
                    root
                } else {
                    let p = nodes.get_mut(&(j + 1, x / a)).expect("touched parent");
                    let slot = &mut p.ctrs[(x % a) as usize];
                    *slot = bump(*slot)?;
                    *slot
                };
                new_ctrs.push((j + 1, x, parent));
                let node = &nodes[&(j, x)];
                let tag = self.node_mac(j, x, parent, &node.ctrs);
                nodes.get_mut(&(j, x)).expect("present").tag = tag;
            }
        }
        // Store.
        for ((j, x), node) in &nodes {
            if touched[*j as usize].contains(x) {
                self.store_node(io, a, *j, *x, node)?;
            }
        }
        // Block tags, in contiguous runs.
        let mut k = 0;
        while k < tags.len() {
            let (i0, _) = tags[k];
            let g = i0 / a;
            let mut buf = Vec::new();
            let mut i = i0;
            while k < tags.len() && tags[k].0 == i && i / a == g {
                buf.extend_from_slice(&tags[k].1);
                k += 1;
                i += 1;
            }
            let off = g * Self::leaf_record(a) + 8 * a + 16 + 16 * (i0 % a);
            io.write(Obj::Leaves, off, &buf).map_err(MacTreeError::Io)?;
        }
        if let Some(c) = self.cache {
            for (level, x, v) in new_ctrs {
                if level < l1 {
                    let mut h = [0u8; 32];
                    h[..8].copy_from_slice(&v.to_le_bytes());
                    c.insert(&self.file, ckey(level, x), h);
                }
            }
        }
        Ok(MacTreeState {
            m: m1,
            depth: l1,
            arity_log2: ts.arity_log2,
            root,
        })
    }

    /// The MAC of block `i`'s ciphertext under its counter: `T_i = MAC(<i, 0, N_i>_a, C_i)`.
    pub fn block_tag(&self, i: u64, ctr: u64, ct: &[u8]) -> Tag {
        timed(Phase::HashMac, || {
            self.mac.mac(&nonce(NONCE_MAC, i, 0, ctr), ct)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct VecIo {
        objs: HashMap<&'static str, Vec<u8>>,
    }
    fn oname(o: Obj) -> &'static str {
        match o {
            Obj::Leaves => "m",
            Obj::Upper => "c",
        }
    }
    impl MacIo for VecIo {
        fn read(&mut self, obj: Obj, off: u64, buf: &mut [u8]) -> crate::Result<()> {
            buf.fill(0);
            let v = self.objs.entry(oname(obj)).or_default();
            for (k, b) in buf.iter_mut().enumerate() {
                if let Some(x) = v.get(off as usize + k) {
                    *b = *x;
                }
            }
            Ok(())
        }
        fn write(&mut self, obj: Obj, off: u64, data: &[u8]) -> crate::Result<()> {
            let v = self.objs.entry(oname(obj)).or_default();
            let end = off as usize + data.len();
            if v.len() < end {
                v.resize(end, 0);
            }
            v[off as usize..end].copy_from_slice(data);
            Ok(())
        }
    }

    fn mac() -> PolyAes<aes::Aes256> {
        use aes::cipher::KeyInit;
        PolyAes::new(aes::Aes256::new(&[7u8; 32].into()), [9u8; 16])
    }

    /// Writes leaves `[first, end)` with counter `c` and block tags `[i as u8; 16]`.
    fn write(
        t: &MacTree,
        ts: &MacTreeState,
        io: &mut dyn MacIo,
        first: u64,
        end: u64,
        c: u64,
    ) -> MacTreeState {
        t.update(
            ts,
            io,
            first,
            end,
            1,
            1 << 40,
            &mut |_| Ok(()),
            &mut |i, _| (c, Some([i as u8; 16])),
        )
        .unwrap()
    }

    #[test]
    fn post_order_positions() {
        // a = 64, K = 5: group 0 = (1,0) (2,0) (3,0) (4,0) (5,0); groups 1..63 one node
        // each; group 64 = (1,64) (2,1).
        let want = [
            (1, 0, 0),
            (2, 0, 1),
            (5, 0, 4),
            (1, 1, 5),
            (1, 63, 67),
            (1, 64, 68),
            (2, 1, 69),
            (1, 65, 70),
            (1, 4096, 4096 + 64 + 1 + 1 + 1),
            (3, 1, 4096 + 64 + 1 + 1 + 1 + 2),
        ];
        for (l, x, p) in want {
            assert_eq!(upper_pos(l, x, 64), p, "({l},{x})");
        }
        // a = 2, K = 31: group 0 holds 31 nodes, group 1 one, group 2 two.
        assert_eq!(upper_pos(31, 0, 2), 30);
        assert_eq!(upper_pos(1, 1, 2), 31);
        assert_eq!(upper_pos(1, 2, 2), 32);
        assert_eq!(upper_pos(2, 1, 2), 33);
        // Every (level, x) of a big tree gets its own slot.
        let mut seen = std::collections::HashSet::new();
        for l in 1..=5u8 {
            for x in 0..(1u64 << 14) >> (6 * (l as u32 - 1)).min(14) {
                assert!(seen.insert(upper_pos(l, x, 64)), "({l},{x}) collides");
            }
        }
        assert_eq!(depth_for(1, 64), 1);
        assert_eq!(depth_for(64, 64), 1);
        assert_eq!(depth_for(65, 64), 2);
        assert_eq!(depth_for(3, 2), 2);
    }

    #[test]
    fn nonce_encodings_are_disjoint() {
        let e = nonce(NONCE_ENC, 5, 3, 9);
        let t = nonce(NONCE_MAC, 5, 0, 9);
        let n = nonce(NONCE_MAC, 5, 1, 9);
        assert_eq!(
            hex::encode(e),
            "090000000000000005000000".to_string() + "01000003"
        );
        assert_eq!(hex::encode(t), "09000000000000000500000002000000");
        assert_eq!(hex::encode(n), "09000000000000000500000002000001");
    }

    /// A 2-ary tree over 3 blocks, every stored byte computed by hand from the paper's
    /// formulas: leaves `N_0..N_2` at level 0 (nodes `[N_0, N_1]`, `[N_2, 0]`), level 1
    /// `[P_0, P_1]` (one node), the root counter `R` in TS_F.
    #[test]
    fn tiny_binary_tree_by_hand() {
        let mac = mac();
        let t = MacTree {
            file: [1; 16],
            mac: &mac,
            cache: None,
        };
        let mut io = VecIo::default();
        let ts0 = MacTreeState::empty(1);
        // Write blocks 0..3 with counter 5 (floor 1): every touched parent goes 0 -> 1.
        let ts = write(&t, &ts0, &mut io, 0, 3, 5);
        assert_eq!(
            ts,
            MacTreeState {
                m: 3,
                depth: 2,
                arity_log2: 1,
                root: 1
            }
        );
        let le = |v: &[u64]| v.iter().flat_map(|c| c.to_le_bytes()).collect::<Vec<u8>>();
        // Level 0, node 0: [5, 5], tag under <0, 1, P_0 = 1>; node 1: [5, 0] under <1, 1, 1>.
        let t00 = mac.mac(&nonce(NONCE_MAC, 0, 1, 1), &le(&[5, 5]));
        let t01 = mac.mac(&nonce(NONCE_MAC, 1, 1, 1), &le(&[5, 0]));
        // Level 1, node 0: [1, 1], tag under the root <0, 2, R = 1>.
        let t10 = mac.mac(&nonce(NONCE_MAC, 0, 2, 1), &le(&[1, 1]));
        let rec = |c: &[u64], tag: &Tag, btags: &[Tag]| {
            let mut v = le(c);
            v.extend_from_slice(tag);
            for b in btags {
                v.extend_from_slice(b);
            }
            v
        };
        let mut m = rec(&[5, 5], &t00, &[[0; 16], [1; 16]]);
        m.extend(rec(&[5, 0], &t01, &[[2; 16]]));
        assert_eq!(io.objs["m"], m, ".m: level-0 records");
        assert_eq!(
            io.objs["c"],
            rec(&[1, 1], &t10, &[]),
            ".c: the level-1 node"
        );
        // Read back.
        let leaves = t.read_leaves(&ts, &mut io, 0, 4).unwrap();
        assert_eq!(leaves[1], (5, [1; 16]));
        assert_eq!(leaves[3], (0, [0; 16]), "past m: a hole");
        // Rewrite block 2 with counter 6: node (0,1) and its path change, node (0,0) not.
        let ts2 = write(&t, &ts, &mut io, 2, 3, 6);
        assert_eq!(ts2.root, 2);
        let t01 = mac.mac(&nonce(NONCE_MAC, 1, 1, 2), &le(&[6, 0]));
        let t10 = mac.mac(&nonce(NONCE_MAC, 0, 2, 2), &le(&[1, 2]));
        assert_eq!(&io.objs["m"][64..64 + 32], &rec(&[6, 0], &t01, &[])[..]);
        assert_eq!(io.objs["c"], rec(&[1, 2], &t10, &[]));
        // The old root no longer verifies the tree; replaying the old level-1 node fails.
        assert!(matches!(
            t.read_leaves(&ts, &mut io, 2, 1),
            Err(MacTreeError::Mismatch { level: 1, .. })
        ));
        let mut replay = VecIo::default();
        replay.objs.insert("m", io.objs["m"].clone());
        replay.objs.insert(
            "c",
            rec(
                &[1, 1],
                &mac.mac(&nonce(NONCE_MAC, 0, 2, 1), &le(&[1, 1])),
                &[],
            ),
        );
        assert!(matches!(
            t.read_leaves(&ts2, &mut replay, 0, 1),
            Err(MacTreeError::Mismatch {
                level: 1,
                node: 0,
                leaf: 0
            })
        ));
    }

    #[test]
    fn growth_deepens_and_keeps_old_nodes_in_place() {
        let mac = mac();
        let cache = NodeCache::new(1024);
        for cache in [None, Some(&cache)] {
            let t = MacTree {
                file: [2; 16],
                mac: &mac,
                cache,
            };
            let mut io = VecIo::default();
            let mut ts = MacTreeState::empty(1);
            let mut model: Vec<u64> = Vec::new();
            for (k, (first, end)) in [(0, 1), (1, 2), (2, 5), (5, 9), (3, 4), (9, 40), (0, 40)]
                .into_iter()
                .enumerate()
            {
                let c = 10 + k as u64;
                ts = write(&t, &ts, &mut io, first, end, c);
                model.resize(model.len().max(end as usize), 0);
                for i in first..end {
                    model[i as usize] = c;
                }
                assert_eq!(ts.depth, depth_for(ts.m, 2));
                let got = t.read_leaves(&ts, &mut io, 0, ts.m).unwrap();
                let ctrs: Vec<u64> = got.iter().map(|l| l.0).collect();
                assert_eq!(ctrs, model);
            }
        }
    }

    #[test]
    fn sparse_growth_touches_only_the_path() {
        let mac = mac();
        let t = MacTree {
            file: [3; 16],
            mac: &mac,
            cache: None,
        };
        let mut io = VecIo::default();
        let ts = write(&t, &MacTreeState::empty(6), &mut io, 0, 1, 7);
        // A write at block 10^6 (positions 1..10^6 stay zero: holes).
        let ts = write(&t, &ts, &mut io, 1_000_000, 1_000_001, 8);
        assert_eq!(ts.depth, 4);
        let got = t.read_leaves(&ts, &mut io, 999_999, 2).unwrap();
        assert_eq!((got[0].0, got[1].0), (0, 8));
        assert_eq!(t.read_leaves(&ts, &mut io, 0, 1).unwrap()[0].0, 7);
        let upper = io.objs["c"].len() as u64 / MacTree::upper_record(64);
        assert!(upper < 260, "upper records reach position {upper}");
    }

    #[test]
    fn tampered_counter_is_caught_and_named() {
        let mac = mac();
        let t = MacTree {
            file: [4; 16],
            mac: &mac,
            cache: None,
        };
        let mut io = VecIo::default();
        let ts = write(&t, &MacTreeState::empty(6), &mut io, 0, 200, 7);
        // Lower block 130's counter (node 2 of level 0).
        let off = (2 * MacTree::leaf_record(64) + 8 * 2) as usize;
        io.objs.get_mut("m").unwrap()[off] ^= 1;
        let e = t.read_leaves(&ts, &mut io, 120, 20).unwrap_err();
        assert!(
            matches!(
                e,
                MacTreeError::Mismatch {
                    level: 0,
                    node: 2,
                    leaf: 128
                }
            ),
            "{e:?}"
        );
        // An update over it refuses too (never blesses a forged counter).
        let e = t
            .update(
                &ts,
                &mut io,
                130,
                131,
                1,
                1 << 40,
                &mut |_| Ok(()),
                &mut |_, c| (c + 1, None),
            )
            .unwrap_err();
        assert!(matches!(e, MacTreeError::Mismatch { .. }), "{e:?}");
    }

    /// The record sizes of docs/file-format.md ("mac-tree"), for the default arity 64:
    /// `a` u64 counters and a 16-byte node tag, then (level 0 only) `a` 16-byte block tags.
    #[test]
    fn record_sizes_are_the_documented_ones() {
        assert_eq!(MacTree::upper_record(64), 8 * 64 + 16);
        assert_eq!(MacTree::leaf_record(64), 8 * 64 + 16 + 16 * 64);
        assert_eq!(MacTree::upper_record(2), 32);
        assert_eq!(MacTree::leaf_record(2), 64);
    }

    /// A read loads and verifies only the level-0 nodes of the leaves it asks for (here
    /// node 0 of a 16-leaf tree of arity 4, not node 1, which is altered); with a cache of
    /// verified counters, a second read of them loads no upper node at all. Also: tags come
    /// from their own node's record, holes read nothing, and an update writes each node's
    /// record and its tags once.
    #[test]
    fn a_read_verifies_only_its_nodes_and_the_cache_spares_the_path() {
        /// Counts reads of each object and writes of the level-0 records.
        #[derive(Default)]
        struct Counting {
            io: VecIo,
            upper_reads: usize,
            leaf_reads: usize,
            leaf_writes: usize,
        }
        impl MacIo for Counting {
            fn read(&mut self, obj: Obj, off: u64, buf: &mut [u8]) -> crate::Result<()> {
                self.upper_reads += usize::from(obj == Obj::Upper);
                self.leaf_reads += usize::from(obj == Obj::Leaves);
                self.io.read(obj, off, buf)
            }
            fn write(&mut self, obj: Obj, off: u64, data: &[u8]) -> crate::Result<()> {
                self.leaf_writes += usize::from(obj == Obj::Leaves);
                self.io.write(obj, off, data)
            }
        }
        let mac = mac();
        let cache = NodeCache::new(1 << 16);
        let t = MacTree {
            file: [5; 16],
            mac: &mac,
            cache: Some(&cache),
        };
        let mut c = Counting::default();
        // Two levels of a = 4: 16 leaves, so level 1 has four nodes under one root node.
        let ts = write(&t, &MacTreeState::empty(2), &mut c, 0, 16, 3);
        assert_eq!(ts.depth, 2);
        assert_eq!(
            c.leaf_writes, 8,
            "per level-0 node: its record, then its tags in one run"
        );
        // Alter a counter of level-0 node 1 (leaves 4 to 7).
        let off = MacTree::leaf_record(4) as usize;
        c.io.objs.get_mut("m").unwrap()[off] ^= 1;
        let got = t.read_leaves(&ts, &mut c, 0, 4).unwrap();
        assert!(got.iter().all(|l| l.0 == 3));
        assert!(matches!(
            t.read_leaves(&ts, &mut c, 4, 1),
            Err(MacTreeError::Mismatch {
                level: 0,
                node: 1,
                leaf: 4
            })
        ));
        // Verified once: node 0's counter (at level 1) is cached; no upper read again.
        let before = c.upper_reads;
        t.read_leaves(&ts, &mut c, 0, 4).unwrap();
        assert_eq!(c.upper_reads, before, "the cached counter spares the path");
        // Without a cache, the path is read every time.
        let t = MacTree { cache: None, ..t };
        let before = c.upper_reads;
        t.read_leaves(&ts, &mut c, 0, 4).unwrap();
        assert_eq!(c.upper_reads, before + 1);
        // Block tags come from their own node's record (node 2: leaves 8 to 11).
        let got = t.read_leaves(&ts, &mut c, 8, 4).unwrap();
        assert_eq!(got, (8..12).map(|i| (3, [i as u8; 16])).collect::<Vec<_>>());
        // Holes have no tag to read: a write at leaf 40 leaves 16 to 39 as holes.
        let ts = write(&t, &ts, &mut c, 40, 41, 4);
        let before = c.leaf_reads;
        let got = t.read_leaves(&ts, &mut c, 16, 8).unwrap();
        assert!(got.iter().all(|l| *l == (0, [0; 16])));
        assert_eq!(c.leaf_reads, before, "never written: no node, no tag read");
    }

    /// Node counters (the MAC nonces of the level above) stay below the session's limit
    /// and never reach the hole bit: an update that would need one is refused, and
    /// changes nothing.
    #[test]
    fn node_counters_stay_below_the_limit() {
        let mac = mac();
        let t = MacTree {
            file: [6; 16],
            mac: &mac,
            cache: None,
        };
        let mut io = VecIo::default();
        let up = |ts: &MacTreeState, io: &mut VecIo, floor: u64, limit: u64| {
            t.update(ts, io, 0, 2, floor, limit, &mut |_| Ok(()), &mut |_, c| {
                (c + 1, None)
            })
        };
        let ts = up(&MacTreeState::empty(1), &mut io, 1, 2).unwrap();
        assert_eq!(ts.root, 1);
        assert!(matches!(
            up(&ts, &mut io, 1, 2),
            Err(MacTreeError::Exhausted)
        ));
        let ts = up(&ts, &mut io, 5, 6).unwrap();
        assert_eq!(ts.root, 5, "the floor");
        assert!(matches!(
            up(&ts, &mut io, 5, 6),
            Err(MacTreeError::Exhausted)
        ));
        assert!(matches!(
            up(&ts, &mut io, HOLE, u64::MAX),
            Err(MacTreeError::Exhausted)
        ));
        let got = t.read_leaves(&ts, &mut io, 0, 2).unwrap();
        assert_eq!((got[0].0, got[1].0), (2, 2));
    }

    #[test]
    fn state_encoding_round_trips_and_validates() {
        let s = MacTreeState {
            m: 65,
            depth: 2,
            arity_log2: 6,
            root: 99,
        };
        assert_eq!(MacTreeState::decode(&s.encode()), Some(s));
        let mut b = s.encode();
        b[16] = 3;
        assert_eq!(MacTreeState::decode(&b), None, "depth inconsistent with m");
        let mut b = s.encode();
        b[31] = 1;
        assert_eq!(MacTreeState::decode(&b), None);
        assert_eq!(
            MacTreeState::decode(&MacTreeState::empty(6).encode()),
            Some(MacTreeState::empty(6))
        );
    }
}
