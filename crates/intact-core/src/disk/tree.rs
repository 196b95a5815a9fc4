//! The disk's n-ary hash tree (docs/design.md, "The block disk"): a fixed number of leaves
//! (one per block), `arity` children per node (2: the balanced binary tree; up to 128:
//! dm-x's high-degree trees), every internal node a keyed hash of its position and its
//! children, the root held by the caller (sealed in the anchor). Verified nodes go to the
//! shared [`NodeCache`] and are trusted from then on, so a verification climbs only to the
//! first cached ancestor (the paper's hash cache). A node over children that are all zero
//! is zero, so a disk that is mostly holes stores almost nothing.
//!
//! Storage: the children of node (level, i) are stored together (`arity` × 32 bytes), so a
//! verification reads one group per level, as dm-x reads one metadata block per level.

use crate::crypto::{Hash, SubKey};
use crate::error::{Error, Result, Subject};
use crate::tree::NodeCache;

/// The all-zero hash: a hole's leaf, and every node over holes only.
pub const ZERO: Hash = [0; 32];

/// Where the tree's nodes live (untrusted): the children of each internal node together.
pub trait NodeStore {
    /// The `arity` children of node `(level, index)` (level 1 and up; level 0 holds the
    /// leaves), zeros where none was ever written.
    fn read_children(&self, level: u32, index: u64, out: &mut [Hash]) -> Result<()>;
    /// Stores child `child` of node `(level, index)`.
    fn write_child(&mut self, level: u32, index: u64, child: u64, value: &Hash) -> Result<()>;
    /// Stores all children of node `(level, index)` at once (a rebuild).
    fn write_group(&mut self, level: u32, index: u64, children: &[Hash]) -> Result<()> {
        for (c, v) in children.iter().enumerate() {
            self.write_child(level, index, c as u64, v)?;
        }
        Ok(())
    }
}

/// A [`NodeStore`] in memory (tests, benchmarks).
#[derive(Debug, Default, Clone)]
pub struct MemNodes {
    /// (level, index) → children.
    pub groups: std::collections::HashMap<(u32, u64), Vec<Hash>>,
}

impl NodeStore for MemNodes {
    fn read_children(&self, level: u32, index: u64, out: &mut [Hash]) -> Result<()> {
        out.fill(ZERO);
        if let Some(g) = self.groups.get(&(level, index)) {
            let n = g.len().min(out.len());
            out[..n].copy_from_slice(&g[..n]);
        }
        Ok(())
    }
    fn write_child(&mut self, level: u32, index: u64, child: u64, value: &Hash) -> Result<()> {
        let g = self.groups.entry((level, index)).or_default();
        if g.len() <= child as usize {
            g.resize(child as usize + 1, ZERO);
        }
        g[child as usize] = *value;
        Ok(())
    }
}

/// The tree's shape and keys; the nodes live in a [`NodeStore`], the root with the caller.
pub struct NaryTree {
    id: [u8; 16],
    arity: u64,
    leaves: u64,
    /// Levels above the leaves (the root's level).
    height: u32,
    key: SubKey,
}

impl std::fmt::Debug for NaryTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NaryTree")
            .field("arity", &self.arity)
            .field("leaves", &self.leaves)
            .field("height", &self.height)
            .finish_non_exhaustive()
    }
}

/// A position in the tree as the cache's key: level in the top 6 bits.
fn pos(level: u32, index: u64) -> u64 {
    (u64::from(level) << 58) | index
}

impl NaryTree {
    /// The tree of disk `id` over `leaves` leaves with `arity` children per node (2 to
    /// 128), hashing internal nodes with `key` (the disk's node key).
    pub fn new(id: [u8; 16], leaves: u64, arity: u64, key: SubKey) -> Result<NaryTree> {
        if !(2..=128).contains(&arity) {
            return Err(Error::Invalid(format!("arity {arity}: want 2 to 128")));
        }
        if leaves == 0 || leaves >= 1 << 58 {
            return Err(Error::Invalid(format!(
                "{leaves} leaves: want 1 to 2^58 - 1"
            )));
        }
        let mut height = 0;
        let mut span = 1u64;
        while span < leaves {
            span = span.saturating_mul(arity);
            height += 1;
        }
        Ok(NaryTree {
            id,
            arity,
            leaves,
            height: height.max(1),
            key,
        })
    }

    /// Leaves (blocks) under the tree.
    pub fn leaves(&self) -> u64 {
        self.leaves
    }

    /// Groups of children stored at `level` (1 ..= height): the nodes of level `level`.
    pub fn groups_at(&self, level: u32) -> u64 {
        let mut n = self.leaves;
        for _ in 0..level {
            n = n.div_ceil(self.arity);
        }
        n
    }

    /// Builds the subtree of node `(level, index)` over `leaves` (its leaves in order, zero
    /// padded past the disk's end), stores every group in it and returns its value: a
    /// rebuild after a crash, which trusts the leaves it is given.
    pub fn build(
        &self,
        store: &mut dyn NodeStore,
        level: u32,
        index: u64,
        leaves: &[Hash],
    ) -> Result<Hash> {
        let mut cur: Vec<Hash> = leaves.to_vec();
        let mut first = index * self.arity.pow(level);
        let a = self.arity as usize;
        for l in 1..=level {
            let parent0 = first / self.arity;
            let mut next = Vec::with_capacity(cur.len().div_ceil(a));
            for (k, chunk) in cur.chunks(a).enumerate() {
                let mut children = vec![ZERO; a];
                children[..chunk.len()].copy_from_slice(chunk);
                let p = parent0 + k as u64;
                store.write_group(l, p, &children)?;
                next.push(self.node(l, p, &children));
            }
            cur = next;
            first = parent0;
        }
        Ok(cur.first().copied().unwrap_or(ZERO))
    }

    /// The values of every node at `level` from the store (its parents' groups), in order.
    pub fn nodes_at(&self, store: &dyn NodeStore, level: u32) -> Result<Vec<Hash>> {
        let n = self.groups_at(level);
        if level >= self.height {
            return Err(Error::Invalid(format!(
                "level {level}: the root's level is {}",
                self.height
            )));
        }
        let mut out = Vec::with_capacity(n as usize);
        let mut children = vec![ZERO; self.arity as usize];
        for g in 0..n.div_ceil(self.arity) {
            store.read_children(level + 1, g, &mut children)?;
            let take = (n - g * self.arity).min(self.arity) as usize;
            out.extend_from_slice(&children[..take]);
        }
        Ok(out)
    }

    /// The root over the nodes of `level` (all of them, in order), storing the groups above
    /// when `store` is given.
    pub fn root_over(
        &self,
        mut store: Option<&mut dyn NodeStore>,
        level: u32,
        nodes: &[Hash],
    ) -> Result<Hash> {
        let mut cur = nodes.to_vec();
        let a = self.arity as usize;
        for l in level + 1..=self.height {
            let mut next = Vec::with_capacity(cur.len().div_ceil(a));
            for (p, chunk) in cur.chunks(a).enumerate() {
                let mut children = vec![ZERO; a];
                children[..chunk.len()].copy_from_slice(chunk);
                if let Some(s) = store.as_deref_mut() {
                    s.write_group(l, p as u64, &children)?;
                }
                next.push(self.node(l, p as u64, &children));
            }
            cur = next;
        }
        Ok(cur.first().copied().unwrap_or(ZERO))
    }

    /// Children per node.
    pub fn arity(&self) -> u64 {
        self.arity
    }

    /// The root's level.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// The root of a disk that was never written.
    pub fn empty_root(&self) -> Hash {
        ZERO
    }

    /// Node `(level, index)` over `children`: `keyed_blake3(node key, "intact/disk/node\0"
    /// || id || level || index || children)`, or [`ZERO`] over zeros only.
    pub fn node(&self, level: u32, index: u64, children: &[Hash]) -> Hash {
        if children.iter().all(|c| *c == ZERO) {
            return ZERO;
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(4 + children.len());
        let (l, i) = (level.to_le_bytes(), index.to_le_bytes());
        parts.extend_from_slice(&[b"intact/disk/node\0", &self.id, &l, &i]);
        parts.extend(children.iter().map(|c| &c[..]));
        self.key.mac(&parts)
    }

    fn tampered(&self, block: u64, what: String) -> Error {
        Error::tampered(Subject::Path("<disk>".into()), Some(block), what)
    }

    /// Checks that `leaf` is block `block`'s leaf under `root`; on the way up, every
    /// sibling group read is checked with it, and the nodes so verified are cached. Stops
    /// at the first cached (trusted) ancestor.
    pub fn verify(
        &self,
        store: &dyn NodeStore,
        cache: &NodeCache,
        root: &Hash,
        block: u64,
        leaf: &Hash,
    ) -> Result<()> {
        self.verify_at(store, cache, root, 0, block, leaf)
    }

    /// [`NaryTree::verify`] of node `(level, index)`: the DMT's regions are the nodes of
    /// one level, their insides kept by [`super::dmt::Dmt`].
    pub fn verify_at(
        &self,
        store: &dyn NodeStore,
        cache: &NodeCache,
        root: &Hash,
        level: u32,
        index: u64,
        value: &Hash,
    ) -> Result<()> {
        self.climb(store, cache, root, level, index, *value, None)
    }

    /// Makes `leaf` block `block`'s leaf: verifies the path first (the siblings must be
    /// authentic before a new root is built on them), then stores the new nodes and
    /// returns the new root.
    pub fn update(
        &self,
        store: &mut dyn NodeStore,
        cache: &NodeCache,
        root: &Hash,
        block: u64,
        leaf: &Hash,
    ) -> Result<Hash> {
        let mut old = [0u8; 32];
        let mut g = vec![ZERO; self.arity as usize];
        store.read_children(1, block / self.arity, &mut g)?;
        old.copy_from_slice(&g[(block % self.arity) as usize]);
        self.update_at(store, cache, root, 0, block, &old, leaf)
    }

    /// [`NaryTree::update`] of node `(level, index)` from `old` (checked against `root`
    /// with every group up to it) to `new`; nothing is stored if the check fails.
    #[allow(clippy::too_many_arguments)]
    pub fn update_at(
        &self,
        store: &mut dyn NodeStore,
        cache: &NodeCache,
        root: &Hash,
        level: u32,
        index: u64,
        old: &Hash,
        new: &Hash,
    ) -> Result<Hash> {
        // The groups on the path, verified against the current root.
        let mut groups = Vec::with_capacity(self.height as usize);
        self.climb(&*store, cache, root, level, index, *old, Some(&mut groups))?;
        // Recompute the path with the new value.
        let mut value = *new;
        let mut index = index;
        for (k, mut children) in groups.into_iter().enumerate() {
            let level = level + k as u32 + 1;
            let (parent, child) = (index / self.arity, index % self.arity);
            children[child as usize] = value;
            store.write_child(level, parent, child, &value)?;
            cache.insert(&self.id, pos(level - 1, index), value);
            value = self.node(level, parent, &children);
            index = parent;
        }
        cache.insert(&self.id, pos(self.height, 0), value);
        Ok(value)
    }

    /// Climbs from `value` at node `(level0, index)` (a leaf at level 0) towards the root,
    /// checking each computed node against the cache (trusted) or, at the top, the root.
    /// With `groups`, also reads every group up to the root (for an update) and returns
    /// them in order from the bottom.
    #[allow(clippy::too_many_arguments)]
    fn climb(
        &self,
        store: &dyn NodeStore,
        cache: &NodeCache,
        root: &Hash,
        level0: u32,
        index: u64,
        value: Hash,
        mut groups: Option<&mut Vec<Vec<Hash>>>,
    ) -> Result<()> {
        if level0 > self.height || index >= self.groups_at(level0) {
            return Err(Error::Invalid(if level0 == 0 {
                format!("block {index} past the disk's {} blocks", self.leaves)
            } else {
                format!(
                    "node {index} of level {level0} past the disk's {} blocks",
                    self.leaves
                )
            }));
        }
        // The first block under the node, to name in an error.
        let block = index.saturating_mul(self.arity.saturating_pow(level0));
        let mut value = value;
        let mut index = index;
        let mut verified: Vec<(u64, Hash)> = Vec::new();
        for level in level0 + 1..=self.height {
            let (parent, child) = (index / self.arity, index % self.arity);
            // A cached node is trusted: the climb ends there (not for an update, which
            // needs every group to the root).
            if groups.is_none() {
                if let Some(h) = cache.get(&self.id, pos(level - 1, index)) {
                    if h != value {
                        return Err(self.tampered(
                            block,
                            format!("tree node at level {} does not match", level - 1),
                        ));
                    }
                    cache.insert_many(&self.id, &verified);
                    return Ok(());
                }
            }
            let mut children = vec![ZERO; self.arity as usize];
            store.read_children(level, parent, &mut children)?;
            if children[child as usize] != value {
                return Err(self.tampered(
                    block,
                    format!("stored tree node at level {} does not match", level - 1),
                ));
            }
            verified.push((pos(level - 1, index), value));
            value = self.node(level, parent, &children);
            if let Some(g) = groups.as_deref_mut() {
                g.push(children);
            }
            index = parent;
        }
        if value != *root {
            return Err(self.tampered(block, "the tree's root does not match".into()));
        }
        verified.push((pos(self.height, 0), value));
        cache.insert_many(&self.id, &verified);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::MasterKey;

    fn tree(leaves: u64, arity: u64) -> NaryTree {
        let key = MasterKey::from_bytes([3; 32]).derive(crate::crypto::label::DISK_NODE, &[9; 16]);
        NaryTree::new([9; 16], leaves, arity, key).unwrap()
    }

    fn leaf(b: u64, v: u64) -> Hash {
        let mut h = [0u8; 32];
        h[..8].copy_from_slice(&b.to_le_bytes());
        h[8..16].copy_from_slice(&(v + 1).to_le_bytes());
        h
    }

    /// The root recomputed from all leaves, level by level (the reference model).
    fn reference_root(t: &NaryTree, leaves: &[Hash]) -> Hash {
        let mut level: Vec<Hash> = leaves.to_vec();
        for l in 1..=t.height() {
            let n = level.len().div_ceil(t.arity() as usize);
            let mut next = Vec::with_capacity(n);
            for p in 0..n {
                let mut children = vec![ZERO; t.arity() as usize];
                for (c, v) in level
                    .iter()
                    .skip(p * t.arity() as usize)
                    .take(t.arity() as usize)
                    .enumerate()
                {
                    children[c] = *v;
                }
                next.push(t.node(l, p as u64, &children));
            }
            level = next;
        }
        level[0]
    }

    #[test]
    fn updates_match_a_full_recomputation_for_every_arity() {
        for (leaves, arity) in [
            (1, 2),
            (2, 2),
            (7, 2),
            (64, 2),
            (100, 4),
            (1000, 128),
            (129, 128),
        ] {
            let t = tree(leaves, arity);
            let mut store = MemNodes::default();
            let cache = NodeCache::new(0);
            let mut root = t.empty_root();
            let mut model = vec![ZERO; leaves as usize];
            let mut x = leaves * 31 + arity;
            for v in 0..200 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let b = x % leaves;
                root = t.update(&mut store, &cache, &root, b, &leaf(b, v)).unwrap();
                model[b as usize] = leaf(b, v);
                assert_eq!(
                    root,
                    reference_root(&t, &model),
                    "{leaves} leaves, arity {arity}"
                );
            }
            for (b, l) in model.iter().enumerate() {
                t.verify(&store, &cache, &root, b as u64, l).unwrap();
            }
        }
    }

    #[test]
    fn a_rebuild_from_regions_matches_the_updates() {
        for (leaves, arity, level) in [(100, 4, 2), (64, 2, 3), (1000, 8, 1), (5, 2, 2)] {
            let t = tree(leaves, arity);
            let cache = NodeCache::new(0);
            let mut store = MemNodes::default();
            let mut root = ZERO;
            let model: Vec<Hash> = (0..leaves).map(|b| leaf(b, b % 3)).collect();
            for (b, l) in model.iter().enumerate() {
                root = t.update(&mut store, &cache, &root, b as u64, l).unwrap();
            }
            let nodes = t.nodes_at(&store, level).unwrap();
            assert_eq!(nodes.len() as u64, t.groups_at(level));
            assert_eq!(t.root_over(None, level, &nodes).unwrap(), root);
            // Rebuilt into an empty store, region by region: the same nodes and root.
            let mut fresh = MemNodes::default();
            let span = arity.pow(level) as usize;
            let mut rebuilt = Vec::new();
            for (r, chunk) in model.chunks(span).enumerate() {
                rebuilt.push(t.build(&mut fresh, level, r as u64, chunk).unwrap());
            }
            assert_eq!(rebuilt, nodes, "{leaves} leaves, arity {arity}");
            assert_eq!(
                t.root_over(Some(&mut fresh), level, &rebuilt).unwrap(),
                root
            );
            assert_eq!(root, reference_root(&t, &model));
            for (b, l) in model.iter().enumerate() {
                t.verify(&fresh, &cache, &root, b as u64, l).unwrap();
            }
        }
        assert!(tree(16, 2).nodes_at(&MemNodes::default(), 4).is_err());
    }

    #[test]
    fn a_changed_replayed_or_swapped_node_fails_and_names_the_block() {
        let t = tree(64, 4);
        let mut store = MemNodes::default();
        let cache = NodeCache::new(0);
        let mut root = ZERO;
        for b in 0..64 {
            root = t.update(&mut store, &cache, &root, b, &leaf(b, 0)).unwrap();
        }
        let old = store.clone();
        root = t.update(&mut store, &cache, &root, 5, &leaf(5, 1)).unwrap();
        // The leaf itself: the old one no longer verifies (a replayed block).
        let e = t.verify(&store, &cache, &root, 5, &leaf(5, 0)).unwrap_err();
        assert!(e.is_tampered() && e.to_string().contains("block 5"), "{e}");
        // A stored node changed.
        let mut bad = store.clone();
        bad.groups.get_mut(&(2, 0)).unwrap()[1][0] ^= 1;
        assert!(t.verify(&bad, &cache, &root, 5, &leaf(5, 1)).is_err());
        assert!(
            t.verify(&bad, &cache, &root, 60, &leaf(60, 0)).is_ok(),
            "another subtree"
        );
        // The whole store rolled back: fails against the new root.
        assert!(t.verify(&old, &cache, &root, 5, &leaf(5, 0)).is_err());
        // Two groups swapped.
        let mut swapped = store.clone();
        let (a, b) = (
            swapped.groups[&(1, 0)].clone(),
            swapped.groups[&(1, 1)].clone(),
        );
        swapped.groups.insert((1, 0), b);
        swapped.groups.insert((1, 1), a);
        assert!(t.verify(&swapped, &cache, &root, 1, &leaf(1, 0)).is_err());
        // An update over a tampered sibling is refused: no new root is built on it.
        let mut s = bad.clone();
        assert!(t.update(&mut s, &cache, &root, 6, &leaf(6, 9)).is_err());
        // Past the end.
        assert!(t.verify(&store, &cache, &root, 64, &ZERO).is_err());
    }

    #[test]
    fn a_cached_ancestor_ends_the_climb_and_holes_cost_nothing() {
        struct Counting<'a>(&'a MemNodes, std::cell::Cell<u32>);
        impl NodeStore for Counting<'_> {
            fn read_children(&self, l: u32, i: u64, out: &mut [Hash]) -> Result<()> {
                self.1.set(self.1.get() + 1);
                self.0.read_children(l, i, out)
            }
            fn write_child(&mut self, _: u32, _: u64, _: u64, _: &Hash) -> Result<()> {
                unreachable!()
            }
        }
        let t = tree(4096, 8);
        let mut store = MemNodes::default();
        let cache = NodeCache::new(1 << 20);
        let mut root = ZERO;
        for b in [0, 1, 4095] {
            root = t.update(&mut store, &cache, &root, b, &leaf(b, 0)).unwrap();
        }
        // Three leaves written: three paths stored, the rest is holes.
        assert!(store.groups.len() <= 3 * t.height() as usize);
        cache.clear();
        let c = Counting(&store, Default::default());
        t.verify(&c, &cache, &root, 0, &leaf(0, 0)).unwrap();
        assert_eq!(
            c.1.get(),
            t.height(),
            "a cold climb reads one group per level"
        );
        c.1.set(0);
        t.verify(&c, &cache, &root, 1, &leaf(1, 0)).unwrap();
        assert_eq!(c.1.get(), 1, "its sibling's parent is cached now");
        // A hole verifies as zero.
        t.verify(&c, &cache, &root, 7, &ZERO).unwrap();
        assert!(t.verify(&c, &cache, &root, 7, &leaf(7, 0)).is_err());
    }

    #[test]
    fn shapes_are_checked() {
        let key =
            || MasterKey::from_bytes([3; 32]).derive(crate::crypto::label::DISK_NODE, &[9; 16]);
        assert!(NaryTree::new([0; 16], 10, 1, key()).is_err());
        assert!(NaryTree::new([0; 16], 10, 129, key()).is_err());
        assert!(NaryTree::new([0; 16], 0, 2, key()).is_err());
        assert_eq!(
            NaryTree::new([0; 16], 1 << 20, 2, key()).unwrap().height(),
            20
        );
        assert_eq!(
            NaryTree::new([0; 16], 1 << 21, 128, key())
                .unwrap()
                .height(),
            3
        );
        assert_eq!(NaryTree::new([0; 16], 1, 2, key()).unwrap().height(), 1);
    }
}
