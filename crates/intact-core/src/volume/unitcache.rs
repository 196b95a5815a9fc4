//! Verified metadata kept decrypted: directory units and pieces of the inode table (issue
//! 18: per-file costs flat from 10^3 to 10^6 files).
//!
//! A lookup in a directory tree reads the units on its root-to-leaf path
//! ([`super::dirtree`]), each a block decrypted and checked against the directory's tree.
//! Every lookup reads the root, a big directory's lookups share its few inner nodes, and the
//! lookups the kernel sends after a listing meet the leaves the listing just read, and the
//! records of the listed files, created together and so 16 to a 4 KiB piece of the inode
//! table ([`TABLE_PIECE`]). This cache keeps the plaintext of units and pieces already
//! authenticated, in the engine's trusted
//! memory like the node cache ([`crate::tree::NodeCache`]), in least-recently-used order
//! under a byte budget ([`Options::meta_cache_bytes`]).
//!
//! What it holds is what a read of the unit would return now, by these rules:
//! - a write or a cut of a directory's file goes through [`super::namespace`]'s units,
//!   which keep the bytes they wrote as whole units (a partly written unit is dropped)
//!   and cut the unit the new end falls in, and a record is written only by
//!   `Inner::write_raw_record`, which writes the new record into its cached piece: the
//!   operations after a create or an unlink meet the leaf and the record it changed
//!   without reading them back;
//! - going back to the last seal after a failed commit, and replaying the log, change
//!   objects below the units: both empty the cache;
//! - an entry is keyed by the file id of the directory (or of the inode table), never
//!   reused, so a freed or re-encrypted directory's units cannot be served for another.

use super::dirtree;
use crate::crypto::FileId;
use std::sync::Arc;

/// The inode table is cached in pieces of this many bytes (16 records), whatever the
/// volume's block size.
pub(super) const TABLE_PIECE: usize = 4096;
use std::collections::HashMap;

/// What an entry costs beside its bytes (its place in the map and in the use order), so
/// that empty units count too.
const ENTRY_COST: usize = 64;

/// A unit's verified bytes (shared with the readers that took them: a hit copies no
/// bytes) and the directory node checked from them if one was kept ([`dirtree::Unit`]).
struct Kept {
    b: Arc<[u8]>,
    node: Option<Arc<dirtree::Unit>>,
}

impl Kept {
    fn cost(&self) -> usize {
        self.b.len() + ENTRY_COST + self.node.as_ref().map_or(0, |n| n.cost())
    }
}

/// Verified plaintext of directory units, least recently used first out (the `lru`
/// crate's map: a use moves an entry to the front of a linked list in O(1)).
pub(super) struct UnitCache {
    cap: usize,
    bytes: usize,
    map: lru::LruCache<(FileId, u32), Kept>,
    /// For each file with units kept: how many, and the highest unit number kept since it
    /// had none (so that dropping a file's units from one on visits those numbers, not
    /// every entry of the cache).
    files: HashMap<FileId, (usize, u32)>,
    hits: u64,
    misses: u64,
}

impl UnitCache {
    /// A cache of at most `cap` bytes of units (0 disables it).
    pub(super) fn new(cap: usize) -> Self {
        UnitCache {
            cap,
            bytes: 0,
            map: lru::LruCache::unbounded(),
            files: HashMap::new(),
            hits: 0,
            misses: 0,
        }
    }

    /// The entry of unit `k` of `file`, marked used now.
    fn touch(&mut self, file: &FileId, k: u32) -> Option<&Kept> {
        self.map.get(&(*file, k))
    }

    /// Unit `k` of directory `file`, if kept.
    pub(super) fn get(&mut self, file: &FileId, k: u32) -> Option<Arc<[u8]>> {
        match self.touch(file, k).map(|e| Arc::clone(&e.b)) {
            Some(b) => {
                self.hits += 1;
                Some(b)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// The checked node of unit `k` of directory `file`, if one is kept with its bytes
    /// (counted as a hit; without one, the read of the bytes that follows counts).
    pub(super) fn node(&mut self, file: &FileId, k: u32) -> Option<Arc<dirtree::Unit>> {
        let n = self.touch(file, k).and_then(|e| e.node.clone());
        self.hits += u64::from(n.is_some());
        n
    }

    /// Keeps `node`, checked from `b`, beside unit `k` of `file` if `b` is still what the
    /// cache holds for it.
    pub(super) fn keep_node(
        &mut self,
        file: &FileId,
        k: u32,
        b: &Arc<[u8]>,
        node: &Arc<dirtree::Unit>,
    ) {
        let Some(e) = self.map.peek_mut(&(*file, k)) else {
            return;
        };
        if !Arc::ptr_eq(&e.b, b) || e.node.is_some() {
            return;
        }
        e.node = Some(Arc::clone(node));
        self.bytes += node.cost();
        self.shrink();
    }

    /// Keeps `b`, the verified bytes of unit `k` of `file`.
    pub(super) fn put(&mut self, file: &FileId, k: u32, b: Arc<[u8]>) {
        if b.len() + ENTRY_COST > self.cap {
            return;
        }
        self.remove(file, k);
        let e = Kept { b, node: None };
        self.bytes += e.cost();
        self.map.put((*file, k), e);
        let f = self.files.entry(*file).or_insert((0, 0));
        f.0 += 1;
        f.1 = f.1.max(k);
        self.shrink();
    }

    /// Drops the least recently used entries until the budget holds.
    fn shrink(&mut self) {
        while self.bytes > self.cap {
            let Some(&(file, k)) = self.map.peek_lru().map(|(key, _)| key) else {
                break;
            };
            self.take(&file, k);
        }
    }

    fn remove(&mut self, file: &FileId, k: u32) {
        self.take(file, k);
    }

    /// Drops unit `k` of `file`, returning its bytes if it was kept (not counted as a
    /// lookup).
    pub(super) fn take(&mut self, file: &FileId, k: u32) -> Option<Arc<[u8]>> {
        let e = self.map.pop(&(*file, k))?;
        self.bytes -= e.cost();
        if let Some(f) = self.files.get_mut(file) {
            f.0 -= 1;
            if f.0 == 0 {
                self.files.remove(file);
            }
        }
        Some(e.b)
    }

    /// Drops the units of `file` numbered `first` and up (a write or a cut changed them).
    pub(super) fn remove_from(&mut self, file: &FileId, first: u32) {
        let Some(&(_, hi)) = self.files.get(file) else {
            return;
        };
        for k in first..=hi {
            if !self.files.contains_key(file) {
                return;
            }
            self.remove(file, k);
        }
    }

    /// Drops units `first .. first + count` of `file`.
    pub(super) fn remove_range(&mut self, file: &FileId, first: u32, count: u32) {
        for k in first..first.saturating_add(count) {
            self.remove(file, k);
        }
    }

    /// Drops everything.
    pub(super) fn clear(&mut self) {
        self.map.clear();
        self.files.clear();
        self.bytes = 0;
    }

    /// Bytes held, each entry's bookkeeping counted.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Lookups answered, and not, since the volume opened.
    pub(super) fn hits_misses(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: FileId = [1; 16];
    const B: FileId = [2; 16];

    /// What an entry of `n` bytes counts.
    const fn cost(n: usize) -> usize {
        n + ENTRY_COST
    }

    #[test]
    fn least_recently_used_goes_first_within_the_budget() {
        let mut c = UnitCache::new(3 * cost(100));
        c.put(&A, 0, [0; 100][..].into());
        c.put(&A, 1, [1; 100][..].into());
        c.put(&B, 0, [2; 100][..].into());
        assert_eq!(c.bytes(), 3 * cost(100));
        // A's unit 0 used: A's unit 1 is now the oldest.
        assert_eq!(c.get(&A, 0), Some(vec![0; 100].into()));
        c.put(&B, 1, [3; 100][..].into());
        assert_eq!(c.bytes(), 3 * cost(100));
        assert_eq!(c.get(&A, 1), None);
        assert_eq!(c.get(&A, 0), Some(vec![0; 100].into()));
        assert_eq!(c.get(&B, 0), Some(vec![2; 100].into()));
        assert_eq!(c.get(&B, 1), Some(vec![3; 100].into()));
        assert_eq!(c.hits_misses(), (4, 1));
        // Replacing a unit keeps one copy, counted once.
        c.put(&B, 1, [4; 50][..].into());
        assert_eq!(c.bytes(), 2 * cost(100) + cost(50));
        assert_eq!(c.get(&B, 1), Some(vec![4; 50].into()));
        // Too big for the budget: not kept (and a budget of 0 keeps nothing, not even an
        // empty unit).
        c.put(&A, 9, [0; 3 * 100 + 2 * ENTRY_COST + 1][..].into());
        assert_eq!(c.get(&A, 9), None);
        // ... and what was kept stays.
        assert_eq!(c.get(&B, 1), Some(vec![4; 50].into()));
        // An entry of exactly the budget is kept.
        let mut one = UnitCache::new(cost(100));
        one.put(&A, 0, [5; 100][..].into());
        assert_eq!(one.get(&A, 0), Some(vec![5; 100].into()));
        let mut off = UnitCache::new(0);
        off.put(&A, 0, [1][..].into());
        off.put(&A, 1, [][..].into());
        assert_eq!(
            (off.get(&A, 0), off.get(&A, 1), off.bytes()),
            (None, None, 0)
        );
        // Empty units count: a budget holds a bounded number of them.
        let mut few = UnitCache::new(10 * ENTRY_COST);
        for k in 0..1000 {
            few.put(&A, k, [][..].into());
        }
        assert_eq!(few.bytes(), 10 * ENTRY_COST);
        assert_eq!(few.map.len(), 10);
    }

    /// A checked node is kept only beside the very bytes it was checked from, counts
    /// in the budget, and goes with them (a new put of the unit, a drop, an eviction).
    #[test]
    fn a_checked_node_is_kept_with_its_bytes_only() {
        let node = dirtree::Unit::inner_for_test(10);
        let node_cost = node.cost();
        assert_eq!(node_cost, 10 * 8 + 11 * 4);
        let mut c = UnitCache::new(2 * cost(100) + node_cost);
        let b: Arc<[u8]> = [7; 100][..].into();
        // Not kept: no unit, or other bytes than the cache holds.
        c.keep_node(&A, 0, &b, &node);
        assert!(c.node(&A, 0).is_none());
        c.put(&A, 0, [7; 100][..].into());
        c.keep_node(&A, 0, &b, &node);
        assert!(c.node(&A, 0).is_none());
        assert_eq!(c.bytes(), cost(100));
        c.put(&A, 0, Arc::clone(&b));
        c.keep_node(&A, 0, &b, &node);
        assert!(Arc::ptr_eq(&c.node(&A, 0).unwrap(), &node));
        assert_eq!(c.bytes(), cost(100) + node_cost);
        // Kept once.
        c.keep_node(&A, 0, &b, &node);
        assert_eq!(c.bytes(), cost(100) + node_cost);
        // A new put of the unit drops it.
        c.put(&A, 0, Arc::clone(&b));
        assert!(c.node(&A, 0).is_none());
        assert_eq!(c.bytes(), cost(100));
        c.keep_node(&A, 0, &b, &node);
        // It counts in the budget: a third unit evicts the least recently used.
        c.put(&B, 0, [1; 100][..].into());
        assert_eq!(c.bytes(), 2 * cost(100) + node_cost);
        c.put(&B, 1, [2; 100][..].into());
        assert!(c.node(&A, 0).is_none() && c.get(&A, 0).is_none());
        assert_eq!(c.bytes(), 2 * cost(100));
        // Taken with its unit.
        let b2: Arc<[u8]> = [3; 100][..].into();
        c.put(&B, 1, Arc::clone(&b2));
        c.keep_node(&B, 1, &b2, &node);
        assert_eq!(c.bytes(), 2 * cost(100) + node_cost);
        c.remove_from(&B, 1);
        assert_eq!(c.bytes(), cost(100));
        // A node too big for what the budget leaves evicts the others, then itself.
        let big = dirtree::Unit::inner_for_test(1000);
        let b3: Arc<[u8]> = [4; 100][..].into();
        c.put(&A, 5, Arc::clone(&b3));
        c.keep_node(&A, 5, &b3, &big);
        assert!(c.bytes() <= 2 * cost(100) + node_cost, "{}", c.bytes());
    }

    #[test]
    fn changed_units_are_dropped_and_only_those() {
        let mut c = UnitCache::new(1 << 20);
        for k in 0..6 {
            c.put(&A, k, [k as u8; 10][..].into());
            c.put(&B, k, [k as u8; 10][..].into());
        }
        c.remove_range(&A, 1, 2);
        c.remove_from(&B, 4);
        let kept = |c: &mut UnitCache, f: &FileId| -> Vec<u32> {
            (0..6).filter(|&k| c.get(f, k).is_some()).collect()
        };
        assert_eq!(kept(&mut c, &A), [0, 3, 4, 5]);
        assert_eq!(kept(&mut c, &B), [0, 1, 2, 3]);
        assert_eq!(c.bytes(), 8 * cost(10));
        // Only the named file's units go, whatever units the others have.
        let mut d = UnitCache::new(1 << 20);
        for k in [0, 1, 2] {
            d.put(&A, k, [1][..].into());
        }
        for k in [0, 5] {
            d.put(&B, k, [1][..].into());
        }
        d.remove_from(&B, 1);
        assert_eq!(kept(&mut d, &B), [0]);
        assert_eq!(kept(&mut d, &A), [0, 1, 2]);
        c.clear();
        assert_eq!(c.bytes(), 0);
        assert_eq!(kept(&mut c, &A), [] as [u32; 0]);
    }
}
