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

use crate::crypto::FileId;
use std::sync::Arc;

/// The inode table is cached in pieces of this many bytes (16 records), whatever the
/// volume's block size.
pub(super) const TABLE_PIECE: usize = 4096;
use std::collections::{BTreeMap, HashMap};

/// What an entry costs beside its bytes (its places in the map and in the use order), so
/// that empty units count too.
const ENTRY_COST: usize = 64;

/// A unit's verified bytes (shared with the readers that took them: a hit copies no bytes)
/// and the clock value of its last use.
type Kept = (Arc<[u8]>, u64);

/// Verified plaintext of directory units, least recently used first out.
#[derive(Default)]
pub(super) struct UnitCache {
    cap: usize,
    bytes: usize,
    clock: u64,
    map: HashMap<(FileId, u32), Kept>,
    /// Use order: clock value of the last use → key.
    order: BTreeMap<u64, (FileId, u32)>,
    hits: u64,
    misses: u64,
}

impl UnitCache {
    /// A cache of at most `cap` bytes of units (0 disables it).
    pub(super) fn new(cap: usize) -> Self {
        UnitCache {
            cap,
            ..Default::default()
        }
    }

    /// Unit `k` of directory `file`, if kept.
    pub(super) fn get(&mut self, file: &FileId, k: u32) -> Option<Arc<[u8]>> {
        self.clock += 1;
        let now = self.clock;
        match self.map.get_mut(&(*file, k)) {
            Some((b, used)) => {
                self.order.remove(used);
                *used = now;
                self.order.insert(now, (*file, k));
                self.hits += 1;
                Some(Arc::clone(b))
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Keeps `b`, the verified bytes of unit `k` of `file`.
    pub(super) fn put(&mut self, file: &FileId, k: u32, b: Arc<[u8]>) {
        if b.len() + ENTRY_COST > self.cap {
            return;
        }
        self.remove(file, k);
        self.clock += 1;
        self.bytes += b.len() + ENTRY_COST;
        self.map.insert((*file, k), (b, self.clock));
        self.order.insert(self.clock, (*file, k));
        while self.bytes > self.cap {
            let Some((_, key)) = self.order.pop_first() else {
                break;
            };
            if let Some((old, _)) = self.map.remove(&key) {
                self.bytes -= old.len() + ENTRY_COST;
            }
        }
    }

    fn remove(&mut self, file: &FileId, k: u32) {
        self.take(file, k);
    }

    /// Drops unit `k` of `file`, returning its bytes if it was kept (not counted as a
    /// lookup).
    pub(super) fn take(&mut self, file: &FileId, k: u32) -> Option<Arc<[u8]>> {
        let (old, used) = self.map.remove(&(*file, k))?;
        self.order.remove(&used);
        self.bytes -= old.len() + ENTRY_COST;
        Some(old)
    }

    /// Drops the units of `file` numbered `first` and up (a write or a cut changed them).
    pub(super) fn remove_from(&mut self, file: &FileId, first: u32) {
        let gone: Vec<u32> = self
            .map
            .keys()
            .filter(|(f, k)| f == file && *k >= first)
            .map(|(_, k)| *k)
            .collect();
        for k in gone {
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
        self.order.clear();
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
