//! The Merkle-node cache: an LRU of verified (trusted) tree nodes, sized in bytes.
//!
//! Entries are keyed by `(file, flat index)` and hold the node's hash. Every value in the
//! cache is trusted: it was either verified against a trusted root or computed by a trusted
//! update. Callers therefore must keep it coherent (see [`NodeCache::remove_file`] when a
//! file id is reused, and the tree operations which refresh changed nodes).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use super::merkle::{FileId, Hash};

/// Bytes charged per cached node: the node size, as the paper counts it.
pub const NODE_COST: usize = 32;

/// Default cache size in bytes (the paper's 1 KiB Merkle-node cache).
pub const DEFAULT_CACHE_BYTES: usize = 1024;

type Key = (FileId, u64);

struct Entry {
    hash: Hash,
    gen: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Entry>,
    /// Recency queue with lazy deletion: an element is live iff its generation equals the
    /// entry's current generation.
    queue: VecDeque<(Key, u64)>,
    gen: u64,
    hits: u64,
    misses: u64,
}

impl Inner {
    fn touch(&mut self, key: Key) {
        self.gen += 1;
        let gen = self.gen;
        if let Some(e) = self.map.get_mut(&key) {
            e.gen = gen;
            self.queue.push_back((key, gen));
        }
        self.compact();
    }

    fn insert(&mut self, key: Key, hash: Hash, cap: usize) {
        self.gen += 1;
        let gen = self.gen;
        self.map.insert(key, Entry { hash, gen });
        self.queue.push_back((key, gen));
        while self.map.len() > cap {
            if !self.evict_one() {
                break;
            }
        }
        self.compact();
    }

    fn evict_one(&mut self) -> bool {
        while let Some((k, g)) = self.queue.pop_front() {
            if self.map.get(&k).is_some_and(|e| e.gen == g) {
                self.map.remove(&k);
                return true;
            }
        }
        false
    }

    fn compact(&mut self) {
        if self.queue.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.queue
                .retain(|(k, g)| map.get(k).is_some_and(|e| e.gen == *g));
        }
    }
}

/// Result of checking a run of computed nodes against the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunCheck {
    /// Every node of the run is cached with an equal value: the run is verified.
    AllVerified,
    /// No cached value differs, but some nodes are not cached.
    Partial,
    /// The node at this flat index is cached with a different value.
    Mismatch(u64),
}

/// LRU cache of verified (trusted) Merkle nodes, sized in bytes (each entry costs 32 bytes,
/// the node size, as the paper counts it). A size of 0 disables it. Thread-safe.
pub struct NodeCache {
    cap: usize,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for NodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCache")
            .field("capacity_bytes", &self.capacity_bytes())
            .field("len", &self.len())
            .finish()
    }
}

impl Default for NodeCache {
    fn default() -> Self {
        Self::new(DEFAULT_CACHE_BYTES)
    }
}

impl NodeCache {
    /// A cache holding at most `bytes / 32` nodes; 0 disables caching.
    pub fn new(bytes: usize) -> Self {
        NodeCache {
            cap: bytes / NODE_COST,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Capacity in bytes (a multiple of 32).
    pub fn capacity_bytes(&self) -> usize {
        self.cap * NODE_COST
    }

    /// Capacity in nodes.
    pub fn capacity_entries(&self) -> usize {
        self.cap
    }

    /// Number of cached nodes.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether no node is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cached (trusted) value of node `flat` of `file`, marking it recently used.
    pub fn get(&self, file: &FileId, flat: u64) -> Option<Hash> {
        if self.cap == 0 {
            return None;
        }
        let mut g = self.lock();
        let key = (*file, flat);
        match g.map.get(&key).map(|e| e.hash) {
            Some(h) => {
                g.hits += 1;
                g.touch(key);
                Some(h)
            }
            None => {
                g.misses += 1;
                None
            }
        }
    }

    /// Inserts (or replaces) a trusted node value, evicting the least recently used nodes.
    pub fn insert(&self, file: &FileId, flat: u64, h: Hash) {
        if self.cap == 0 {
            return;
        }
        self.lock().insert((*file, flat), h, self.cap);
    }

    /// Inserts several trusted nodes in order (the last ones end up most recently used).
    pub fn insert_many(&self, file: &FileId, nodes: &[(u64, Hash)]) {
        if self.cap == 0 || nodes.is_empty() {
            return;
        }
        let mut g = self.lock();
        for &(flat, h) in nodes {
            g.insert((*file, flat), h, self.cap);
        }
    }

    /// Checks the nodes `values[j]` at flat indices `flat_first + j * stride` against the
    /// cache: all cached and equal, some missing, or one cached with a different value.
    pub fn check_run(
        &self,
        file: &FileId,
        flat_first: u64,
        stride: u64,
        values: &[Hash],
    ) -> RunCheck {
        if self.cap == 0 {
            return RunCheck::Partial;
        }
        let mut g = self.lock();
        let mut all = true;
        for (j, v) in values.iter().enumerate() {
            let key = (*file, flat_first + j as u64 * stride);
            match g.map.get(&key).map(|e| e.hash) {
                Some(h) if h == *v => {
                    g.hits += 1;
                    g.touch(key);
                }
                Some(_) => return RunCheck::Mismatch(key.1),
                None => {
                    g.misses += 1;
                    all = false;
                }
            }
        }
        if all {
            RunCheck::AllVerified
        } else {
            RunCheck::Partial
        }
    }

    /// Replaces the values of the nodes at `flat_first + j` that are already cached with
    /// `values[j]` (keeps the cache coherent after a write; inserts nothing).
    pub fn refresh_run(&self, file: &FileId, flat_first: u64, values: &[Hash]) {
        if self.cap == 0 || values.is_empty() {
            return;
        }
        let mut g = self.lock();
        let end = flat_first + values.len() as u64;
        if values.len() <= g.map.len() {
            for (j, v) in values.iter().enumerate() {
                if let Some(e) = g.map.get_mut(&(*file, flat_first + j as u64)) {
                    e.hash = *v;
                }
            }
        } else {
            for ((f, flat), e) in g.map.iter_mut() {
                if f == file && *flat >= flat_first && *flat < end {
                    e.hash = values[(*flat - flat_first) as usize];
                }
            }
        }
    }

    /// Removes node `flat` of `file` (a node that no longer exists: the DMT's rotations
    /// retire the range a node covered).
    pub fn remove(&self, file: &FileId, flat: u64) {
        let mut g = self.lock();
        g.map.remove(&(*file, flat));
        g.compact();
    }

    /// Keeps only the nodes of `file` whose flat index satisfies `keep`.
    pub fn retain(&self, file: &FileId, mut keep: impl FnMut(u64) -> bool) {
        let mut g = self.lock();
        g.map.retain(|(f, flat), _| f != file || keep(*flat));
        g.compact();
    }

    /// Removes the nodes of `file` with flat index `>= flat_first`.
    pub fn remove_from(&self, file: &FileId, flat_first: u64) {
        self.retain(file, |flat| flat < flat_first);
    }

    /// Removes every node of `file` (call when a file is deleted or its id reused).
    pub fn remove_file(&self, file: &FileId) {
        self.retain(file, |_| false);
    }

    /// Removes everything (hit and miss counters are kept).
    pub fn clear(&self) {
        let mut g = self.lock();
        g.map.clear();
        g.queue.clear();
    }

    /// Number of lookups answered from the cache.
    pub fn hits(&self) -> u64 {
        self.lock().hits
    }

    /// Number of lookups not answered from the cache.
    pub fn misses(&self) -> u64 {
        self.lock().misses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: FileId = [1; 16];
    const G: FileId = [2; 16];

    fn h(x: u8) -> Hash {
        [x; 32]
    }

    #[test]
    fn lru_eviction_order() {
        let c = NodeCache::new(3 * 32);
        assert_eq!(c.capacity_bytes(), 96);
        c.insert(&F, 1, h(1));
        c.insert(&F, 2, h(2));
        c.insert(&F, 3, h(3));
        assert_eq!(c.get(&F, 1), Some(h(1))); // 1 now most recent
        c.insert(&F, 4, h(4)); // evicts 2
        assert_eq!(c.get(&F, 2), None);
        assert_eq!(c.get(&F, 1), Some(h(1)));
        assert_eq!(c.get(&F, 3), Some(h(3)));
        assert_eq!(c.get(&F, 4), Some(h(4)));
        assert_eq!(c.len(), 3);
        assert_eq!(c.hits(), 4);
        assert_eq!(c.misses(), 1);
    }

    /// Inserting a node again (a refreshed value) makes it the most recently used.
    #[test]
    fn inserting_again_refreshes_recency() {
        let c = NodeCache::new(2 * 32);
        c.insert(&F, 1, h(1));
        c.insert(&F, 2, h(2));
        c.insert(&F, 1, h(9));
        c.insert(&F, 3, h(3)); // evicts 2, the least recently used
        assert_eq!(c.get(&F, 2), None);
        assert_eq!(c.get(&F, 1), Some(h(9)));
        assert_eq!(c.get(&F, 3), Some(h(3)));
        assert_eq!(c.len(), 2);
    }

    /// Many touches leave stale entries in the recency queue; compacting them never drops
    /// a live one: the cache still evicts down to its capacity, in LRU order, and the queue
    /// stays within twice the entries plus 64.
    #[test]
    fn compaction_keeps_live_entries_and_bounds_the_queue() {
        let c = NodeCache::new(4 * 32);
        for k in 0..4 {
            c.insert(&F, k, h(k as u8));
        }
        for round in 0..1000u64 {
            assert!(c.get(&F, round % 4).is_some());
            let q = c.lock().queue.len();
            assert!(q <= 2 * 4 + 64 + 1, "queue of {q} after {round} touches");
        }
        // 3 was touched last, 0 first among the last four touches.
        for k in 10..13 {
            c.insert(&F, k, h(k as u8));
            assert!(c.len() <= 4, "{} nodes past a capacity of 4", c.len());
        }
        assert_eq!(c.get(&F, 3), Some(h(3)));
        for k in 0..3 {
            assert_eq!(c.get(&F, k), None, "node {k}");
        }
    }

    /// A run's check counts a hit for each cached node and a miss for each missing one.
    #[test]
    fn a_run_check_counts_hits_and_misses() {
        let c = NodeCache::new(1 << 10);
        c.insert(&F, 2, h(2));
        let before = (c.hits(), c.misses());
        assert_eq!(
            c.check_run(&F, 0, 2, &[h(0), h(2), h(4)]),
            RunCheck::Partial
        );
        assert_eq!((c.hits(), c.misses()), (before.0 + 1, before.1 + 2));
        assert_eq!(c.check_run(&F, 2, 1, &[h(2)]), RunCheck::AllVerified);
        assert_eq!(c.check_run(&F, 2, 1, &[h(7)]), RunCheck::Mismatch(2));
    }

    #[test]
    fn debug_shows_capacity_and_length() {
        let c = NodeCache::new(2 * 32 + 31);
        assert_eq!(c.capacity_entries(), 2);
        assert!(c.is_empty());
        c.insert(&F, 1, h(1));
        assert!(!c.is_empty());
        assert_eq!(format!("{c:?}"), "NodeCache { capacity_bytes: 64, len: 1 }");
    }

    #[test]
    fn one_node_is_removed_and_the_rest_stay() {
        let c = NodeCache::new(1 << 10);
        c.insert(&F, 1, h(1));
        c.insert(&F, 2, h(2));
        c.insert(&G, 1, h(3));
        c.remove(&F, 1);
        assert_eq!(c.get(&F, 1), None);
        assert_eq!(c.get(&F, 2), Some(h(2)));
        assert_eq!(c.get(&G, 1), Some(h(3)));
        assert_eq!(c.len(), 2);
        // Evicting after a removal still evicts the least recently used live node.
        let c = NodeCache::new(2 * 32);
        c.insert(&F, 1, h(1));
        c.insert(&F, 2, h(2));
        c.remove(&F, 1);
        c.insert(&F, 3, h(3));
        c.insert(&F, 4, h(4));
        assert_eq!((c.get(&F, 2), c.len()), (None, 2));
    }

    #[test]
    fn disabled_cache_holds_nothing() {
        let c = NodeCache::new(0);
        c.insert(&F, 1, h(1));
        assert_eq!(c.get(&F, 1), None);
        assert!(c.is_empty());
        assert_eq!(c.check_run(&F, 1, 2, &[h(1)]), RunCheck::Partial);
        assert_eq!(NodeCache::default().capacity_bytes(), 1024);
    }

    #[test]
    fn removal_and_refresh() {
        let c = NodeCache::new(1 << 16);
        for i in 0..10 {
            c.insert(&F, i, h(i as u8));
            c.insert(&G, i, h(i as u8));
        }
        c.remove_from(&F, 5);
        assert_eq!(c.get(&F, 4), Some(h(4)));
        assert_eq!(c.get(&F, 5), None);
        assert_eq!(c.get(&G, 9), Some(h(9)));
        c.refresh_run(&G, 8, &[h(80), h(90), h(100)]);
        assert_eq!(c.get(&G, 8), Some(h(80)));
        assert_eq!(c.get(&G, 10), None);
        c.remove_file(&G);
        assert_eq!(c.get(&G, 0), None);
        assert_eq!(c.len(), 5);
        assert_eq!(
            c.check_run(&F, 0, 2, &[h(0), h(2), h(4)]),
            RunCheck::AllVerified
        );
        assert_eq!(c.check_run(&F, 0, 2, &[h(0), h(3)]), RunCheck::Mismatch(2));
        assert_eq!(c.check_run(&F, 4, 2, &[h(4), h(6)]), RunCheck::Partial);
        c.clear();
        assert!(c.is_empty());
    }

    #[test]
    fn many_touches_do_not_grow_queue_unboundedly() {
        let c = NodeCache::new(4 * 32);
        for i in 0..4 {
            c.insert(&F, i, h(i as u8));
        }
        for _ in 0..10_000 {
            assert!(c.get(&F, 2).is_some());
        }
        assert!(c.lock().queue.len() < 200);
        c.insert_many(&F, &[(10, h(10)), (11, h(11)), (12, h(12))]);
        assert_eq!(c.len(), 4);
        assert_eq!(c.get(&F, 2), Some(h(2)));
    }
}
