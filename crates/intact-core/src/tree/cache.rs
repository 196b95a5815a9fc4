//! The Merkle-node cache: an LRU of verified (trusted) tree nodes, sized in bytes.
//!
//! Entries are keyed by `(file, flat index)` and hold the node's hash. Every value in the
//! cache is trusted: it was either verified against a trusted root or computed by a trusted
//! update. Callers therefore must keep it coherent (see [`NodeCache::remove_in`] when a
//! file is truncated, and the tree operations which refresh changed nodes).
//!
//! **Memory.** The size is counted as the paper counts it (Oprea and Reiter, §6: a cache of
//! 1 KiB holds 32 nodes of 32 bytes), so `intact bench oprea-reiter` sweeps it in the
//! paper's units. What a node takes in memory is [`RESIDENT_NODE_BYTES`] at most: a slot
//! of 64 bytes in one array (key, hash and the two links of the recency list) and a 4-byte
//! index in a hash table (5 bytes a bucket with its control byte, 2.3 to 4.6 buckets a
//! node). The array grows to the capacity and never past it. An
//! earlier design kept a `HashMap` of entries and a recency queue with lazy deletion:
//! about 190 bytes a node, 100 MB for the 16 MiB a mount used to set (issue 18).

use std::sync::{Mutex, MutexGuard};

use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;

use super::merkle::{FileId, Hash};

/// Bytes charged per cached node: the node size, as the paper counts it.
pub const NODE_COST: usize = 32;

/// Bytes a cached node takes in memory at most, once the cache is full: its 64-byte slot
/// and up to 32/7 table buckets of 5 bytes. (The table doubles when it fills, with live
/// entries or the tombstones evictions leave, unless fewer than half its room is live:
/// in the worst case it doubles with 7/16 of its buckets live, then holds 7/32.) Checked
/// against the allocator by `tests/node_cache_memory.rs`.
pub const RESIDENT_NODE_BYTES: usize = 64 + 23;

/// Default cache size in bytes (the paper's 1 KiB Merkle-node cache).
pub const DEFAULT_CACHE_BYTES: usize = 1024;

type Key = (FileId, u64);

/// What a lookup by key costs, in slots of a pass over the whole cache.
const PROBE_COST: u64 = 8;

/// No slot (the end of the recency list, or of the free list).
const NIL: u32 = u32::MAX;
/// `prev` of a slot on the free list.
const FREE: u32 = u32::MAX - 1;

/// One cached node, linked into the recency list (or, when free, the free list through
/// `next`).
struct Slot {
    key: Key,
    hash: Hash,
    /// The next more recently used slot, or [`FREE`] for a free slot.
    prev: u32,
    /// The next less recently used slot (the next free slot for a free one).
    next: u32,
}

struct Inner {
    /// Every slot, live or free (`prev == FREE`); never longer than the capacity.
    slots: Vec<Slot>,
    /// The index in `slots` of every live node, hashed by its key.
    table: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// Most recently used live slot.
    head: u32,
    /// Least recently used live slot (the next one evicted).
    tail: u32,
    /// First free slot.
    free: u32,
    hits: u64,
    misses: u64,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            slots: Vec::new(),
            table: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            head: NIL,
            tail: NIL,
            free: NIL,
            hits: 0,
            misses: 0,
        }
    }
}

impl Inner {
    /// Live nodes (the table holds one index per live slot).
    fn len(&self) -> usize {
        self.table.len()
    }

    fn find(&self, key: &Key) -> Option<u32> {
        self.find_hashed(self.hasher.hash_one(key), key)
    }

    /// [`Inner::find`] with the key's hash already computed.
    fn find_hashed(&self, h: u64, key: &Key) -> Option<u32> {
        let slots = &self.slots;
        self.table
            .find(h, |&i| slots[i as usize].key == *key)
            .copied()
    }

    /// The cached value of `key`, made the most recently used.
    fn get(&mut self, key: &Key) -> Option<Hash> {
        let i = self.find(key)?;
        self.promote(i);
        Some(self.slots[i as usize].hash)
    }

    /// Makes live slot `i` the most recently used.
    fn promote(&mut self, i: u32) {
        self.unlink(i);
        self.push_front(i);
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let s = &self.slots[i as usize];
            (s.prev, s.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        {
            let s = &mut self.slots[i as usize];
            s.prev = NIL;
            s.next = old;
        }
        match old {
            NIL => self.tail = i,
            o => self.slots[o as usize].prev = i,
        }
        self.head = i;
    }

    /// Inserts or replaces `key`, most recently used; evicts the least recently used node
    /// first when `cap` nodes are cached.
    fn insert(&mut self, key: Key, hash: Hash, cap: usize) {
        // Hashed once: for the lookup and, on a miss, for the new entry.
        let h = self.hasher.hash_one(key);
        if let Some(i) = self.find_hashed(h, &key) {
            self.slots[i as usize].hash = hash;
            self.promote(i);
            return;
        }
        if self.len() >= cap {
            let t = self.tail;
            self.remove_slot(t);
        }
        let i = match self.free {
            NIL => {
                let n = self.slots.len();
                if n == self.slots.capacity() {
                    // Double, but never past the capacity: a full cache holds no slack.
                    let want = cap.min((2 * n).max(16));
                    self.slots.reserve_exact(want - n);
                }
                self.slots.push(Slot {
                    key,
                    hash,
                    prev: NIL,
                    next: NIL,
                });
                n as u32
            }
            f => {
                self.free = self.slots[f as usize].next;
                let s = &mut self.slots[f as usize];
                s.key = key;
                s.hash = hash;
                f
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.table
            .insert_unique(h, i, |&j| hasher.hash_one(slots[j as usize].key));
        self.push_front(i);
    }

    /// Drops live slot `i`: out of the table and the recency list, onto the free list.
    fn remove_slot(&mut self, i: u32) {
        let h = self.hasher.hash_one(self.slots[i as usize].key);
        if let Ok(e) = self.table.find_entry(h, |&j| j == i) {
            e.remove();
        }
        self.unlink(i);
        let s = &mut self.slots[i as usize];
        s.prev = FREE;
        s.next = self.free;
        self.free = i;
    }

    /// Drops every live node whose key fails `keep`.
    fn retain(&mut self, mut keep: impl FnMut(&Key) -> bool) {
        for i in 0..self.slots.len() as u32 {
            let s = &self.slots[i as usize];
            if s.prev != FREE && !keep(&s.key) {
                self.remove_slot(i);
            }
        }
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.table.clear();
        (self.head, self.tail, self.free) = (NIL, NIL, NIL);
    }

    /// Bytes the slots and the table hold (their capacities, not their lengths).
    fn resident_bytes(&self) -> usize {
        // hashbrown's buckets are a power of two of which 7/8 are usable (all but one below
        // 8): the smallest power of two above the usable count.
        let buckets = match self.table.capacity() {
            0 => 0,
            c => (c + 1).next_power_of_two(),
        };
        self.slots.capacity() * std::mem::size_of::<Slot>() + buckets * 5
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
            // Slot indices are u32, two values of which mark the ends of lists.
            cap: (bytes / NODE_COST).min(FREE as usize),
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
        self.lock().len()
    }

    /// Bytes the cache holds in memory now (at most [`RESIDENT_NODE_BYTES`] a node of its
    /// capacity, once full).
    pub fn resident_bytes(&self) -> usize {
        self.lock().resident_bytes()
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
        match g.get(&(*file, flat)) {
            Some(h) => {
                g.hits += 1;
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
            match g.find(&key) {
                Some(i) if g.slots[i as usize].hash == *v => {
                    g.hits += 1;
                    g.promote(i);
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
        if values.len() <= g.len() {
            for (j, v) in values.iter().enumerate() {
                if let Some(i) = g.find(&(*file, flat_first + j as u64)) {
                    g.slots[i as usize].hash = *v;
                }
            }
        } else {
            for s in g.slots.iter_mut() {
                let (f, flat) = s.key;
                if s.prev != FREE && f == *file && flat >= flat_first && flat < end {
                    s.hash = values[(flat - flat_first) as usize];
                }
            }
        }
    }

    /// Removes node `flat` of `file` (a node that no longer exists: the DMT's rotations
    /// retire the range a node covered).
    pub fn remove(&self, file: &FileId, flat: u64) {
        let mut g = self.lock();
        if let Some(i) = g.find(&(*file, flat)) {
            g.remove_slot(i);
        }
    }

    /// Keeps, of `file`'s nodes with flat index in `flats`, only those that satisfy
    /// `keep`; nodes outside `flats` stay. It looks each index of the range up when that
    /// costs less than a pass over the whole cache (a lookup hashes its key: about eight
    /// slots' worth of a pass), so removing a small file's nodes from a large cache costs
    /// the file's size, not the cache's (a pass over a cache of 16 MiB, 512 Ki slots, for
    /// every deleted file was 10 % of a mount's CPU under bench/latency.py).
    pub fn retain_in(
        &self,
        file: &FileId,
        flats: std::ops::Range<u64>,
        mut keep: impl FnMut(u64) -> bool,
    ) {
        let mut g = self.lock();
        let span = flats.end.saturating_sub(flats.start);
        if span.saturating_mul(PROBE_COST) <= g.slots.len() as u64 {
            for flat in flats {
                if keep(flat) {
                    continue;
                }
                if let Some(i) = g.find(&(*file, flat)) {
                    g.remove_slot(i);
                }
            }
        } else {
            g.retain(|(f, flat)| f != file || !flats.contains(flat) || keep(*flat));
        }
    }

    /// Removes `file`'s nodes with flat index in `flats` (see [`NodeCache::retain_in`]).
    pub fn remove_in(&self, file: &FileId, flats: std::ops::Range<u64>) {
        self.retain_in(file, flats, |_| false);
    }

    /// Removes everything (hit and miss counters are kept).
    pub fn clear(&self) {
        self.lock().clear();
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

    /// Touches reorder the recency list in place: after thousands of them the cache
    /// still evicts down to its capacity, in LRU order, and holds no more memory.
    #[test]
    fn touches_keep_lru_order_and_memory_flat() {
        let c = NodeCache::new(4 * 32);
        for k in 0..4 {
            c.insert(&F, k, h(k as u8));
        }
        let resident = c.resident_bytes();
        for round in 0..1000u64 {
            assert!(c.get(&F, round % 4).is_some());
        }
        assert_eq!(c.resident_bytes(), resident);
        // 3 was touched last, 0 first among the last four touches.
        for k in 10..13 {
            c.insert(&F, k, h(k as u8));
            assert!(c.len() <= 4, "{} nodes past a capacity of 4", c.len());
        }
        assert_eq!(c.get(&F, 3), Some(h(3)));
        for k in 0..3 {
            assert_eq!(c.get(&F, k), None, "node {k}");
        }
        assert_eq!(c.resident_bytes(), resident);
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
        c.remove_in(&F, 5..u64::MAX);
        assert_eq!(c.get(&F, 4), Some(h(4)));
        assert_eq!(c.get(&F, 5), None);
        assert_eq!(c.get(&G, 9), Some(h(9)));
        c.refresh_run(&G, 8, &[h(80), h(90), h(100)]);
        assert_eq!(c.get(&G, 8), Some(h(80)));
        assert_eq!(c.get(&G, 10), None);
        c.remove_in(&G, 0..u64::MAX);
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
    fn insert_many_leaves_the_last_most_recent() {
        let c = NodeCache::new(4 * 32);
        for i in 0..4 {
            c.insert(&F, i, h(i as u8));
        }
        assert!(c.get(&F, 2).is_some());
        c.insert_many(&F, &[(10, h(10)), (11, h(11)), (12, h(12))]);
        assert_eq!(c.len(), 4);
        assert_eq!(c.get(&F, 2), Some(h(2)));
        assert_eq!(c.get(&F, 3), None);
    }

    /// The slot array grows to the capacity and stops there; a full cache holds at most
    /// [`RESIDENT_NODE_BYTES`] a node.
    #[test]
    fn a_full_cache_holds_its_bound_and_no_more() {
        for nodes in [1usize, 3, 7, 8, 100, 1000, 4096, 5000] {
            let c = NodeCache::new(nodes * NODE_COST);
            for i in 0..3 * nodes as u64 {
                c.insert(&F, i, h(i as u8));
            }
            assert_eq!(c.len(), nodes);
            assert_eq!(c.lock().slots.capacity(), nodes, "{nodes} nodes");
            let r = c.resident_bytes();
            assert!(
                r <= nodes * RESIDENT_NODE_BYTES + 64,
                "{nodes} nodes take {r} bytes"
            );
            assert!(
                r > nodes * (std::mem::size_of::<Slot>() + 5),
                "{nodes} nodes said to take {r} bytes"
            );
        }
    }

    /// The bound is the design's: a 64-byte slot and at most 32/7 buckets of 5 bytes.
    #[test]
    fn the_bound_is_a_slot_and_the_tables_worst_load() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
        assert_eq!(
            RESIDENT_NODE_BYTES,
            std::mem::size_of::<Slot>() + (5 * 32usize).div_ceil(7)
        );
    }

    /// `resident_bytes` counts the slots' capacity and the table's buckets, as hashbrown
    /// sizes them: a power of two whose usable part (all but one below 8 buckets, 7/8 from
    /// 8 on) is the table's capacity.
    #[test]
    fn resident_bytes_counts_the_slots_and_the_buckets() {
        let c = NodeCache::new(1 << 20);
        assert_eq!(c.resident_bytes(), 0);
        for n in [1u64, 2, 3, 4, 7, 8, 9, 15, 16, 17, 100, 1000] {
            for i in 0..n {
                c.insert(&F, i, h(i as u8));
            }
            let g = c.lock();
            let slots = g.slots.capacity() * std::mem::size_of::<Slot>();
            let table = g.resident_bytes() - slots;
            assert_eq!(table % 5, 0, "{n} nodes: {table} bytes of table");
            let buckets = table / 5;
            assert!(buckets.is_power_of_two(), "{n} nodes: {buckets} buckets");
            let usable = if buckets < 8 {
                buckets - 1
            } else {
                buckets / 8 * 7
            };
            assert_eq!(usable, g.table.capacity(), "{n} nodes");
            assert!(g.table.capacity() >= g.len());
        }
        // The slot array doubles from 16 (never one slot at a time).
        let c = NodeCache::new(1 << 20);
        for i in 0..17 {
            c.insert(&F, i, h(i as u8));
        }
        assert_eq!(c.lock().slots.capacity(), 32);
    }

    /// Removed slots are reused before the array grows.
    #[test]
    fn removed_slots_are_reused() {
        let c = NodeCache::new(1 << 10);
        for i in 0..8 {
            c.insert(&F, i, h(i as u8));
        }
        let cap = c.lock().slots.len();
        c.remove_in(&F, 0..u64::MAX);
        for i in 0..8 {
            c.insert(&G, i, h(i as u8));
        }
        assert_eq!(c.lock().slots.len(), cap);
        assert_eq!(c.len(), 8);
    }

    mod model {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Get(u8, u64),
            Insert(u8, u64, u8),
            Check(u8, u64, u64, Vec<u8>),
            Refresh(u8, u64, Vec<u8>),
            Remove(u8, u64),
            RemoveFrom(u8, u64),
            RemoveFile(u8),
            /// Of the file's nodes in `[first, first + span)`, keep those whose index is a
            /// multiple of `m`.
            RetainIn(u8, u64, u64, u64),
            Clear,
        }

        fn op() -> impl Strategy<Value = Op> {
            let file = 0u8..3;
            let flat = 0u64..24;
            prop_oneof![
                4 => (file.clone(), flat.clone()).prop_map(|(f, k)| Op::Get(f, k)),
                4 => (file.clone(), flat.clone(), any::<u8>()).prop_map(|(f, k, v)| Op::Insert(f, k, v)),
                2 => (file.clone(), flat.clone(), 1u64..3, prop::collection::vec(0u8..4, 0..4))
                    .prop_map(|(f, k, s, v)| Op::Check(f, k, s, v)),
                1 => (file.clone(), flat.clone(), prop::collection::vec(any::<u8>(), 0..30))
                    .prop_map(|(f, k, v)| Op::Refresh(f, k, v)),
                1 => (file.clone(), flat.clone()).prop_map(|(f, k)| Op::Remove(f, k)),
                1 => (file.clone(), flat).prop_map(|(f, k)| Op::RemoveFrom(f, k)),
                1 => file.clone().prop_map(Op::RemoveFile),
                2 => (file, 0u64..24, 0u64..6, 1u64..4)
                    .prop_map(|(f, k, n, m)| Op::RetainIn(f, k, n, m)),
                1 => Just(Op::Clear),
            ]
        }

        fn fid(f: u8) -> FileId {
            [f; 16]
        }

        /// The reference: a list of (key, value), most recently used first.
        #[derive(Default)]
        struct Lru(Vec<(Key, Hash)>);

        impl Lru {
            fn get(&mut self, k: Key) -> Option<Hash> {
                let i = self.0.iter().position(|e| e.0 == k)?;
                let e = self.0.remove(i);
                self.0.insert(0, e);
                Some(e.1)
            }
            fn insert(&mut self, k: Key, v: Hash, cap: usize) {
                if let Some(i) = self.0.iter().position(|e| e.0 == k) {
                    self.0.remove(i);
                } else if self.0.len() >= cap {
                    self.0.pop();
                }
                self.0.insert(0, (k, v));
            }
        }

        proptest! {
            /// The cache answers, evicts and counts as a list kept in recency order does.
            #[test]
            fn the_cache_is_an_lru(cap in 0usize..48, ops in prop::collection::vec(op(), 1..200)) {
                let c = NodeCache::new(cap * NODE_COST);
                let mut m = Lru::default();
                let (mut hits, mut misses) = (0u64, 0u64);
                for o in ops {
                    match o {
                        Op::Get(f, k) => {
                            let want = if cap == 0 { None } else { m.get((fid(f), k)) };
                            if cap > 0 {
                                if want.is_some() { hits += 1 } else { misses += 1 }
                            }
                            prop_assert_eq!(c.get(&fid(f), k), want);
                        }
                        Op::Insert(f, k, v) => {
                            c.insert(&fid(f), k, h(v));
                            if cap > 0 {
                                m.insert((fid(f), k), h(v), cap);
                            }
                        }
                        Op::Check(f, first, stride, vals) => {
                            let vals: Vec<Hash> = vals.into_iter().map(h).collect();
                            let got = c.check_run(&fid(f), first, stride, &vals);
                            let want = if cap == 0 {
                                RunCheck::Partial
                            } else {
                                let mut all = true;
                                let mut r = None;
                                for (j, v) in vals.iter().enumerate() {
                                    let k = (fid(f), first + j as u64 * stride);
                                    match m.0.iter().find(|e| e.0 == k).map(|e| e.1) {
                                        Some(x) if x == *v => {
                                            hits += 1;
                                            m.get(k);
                                        }
                                        Some(_) => {
                                            r = Some(RunCheck::Mismatch(k.1));
                                            break;
                                        }
                                        None => {
                                            misses += 1;
                                            all = false;
                                        }
                                    }
                                }
                                r.unwrap_or(if all { RunCheck::AllVerified } else { RunCheck::Partial })
                            };
                            prop_assert_eq!(got, want);
                        }
                        Op::Refresh(f, first, vals) => {
                            let vals: Vec<Hash> = vals.into_iter().map(h).collect();
                            c.refresh_run(&fid(f), first, &vals);
                            for e in m.0.iter_mut() {
                                let (ef, k) = e.0;
                                if ef == fid(f) && k >= first && k < first + vals.len() as u64 {
                                    e.1 = vals[(k - first) as usize];
                                }
                            }
                        }
                        Op::Remove(f, k) => {
                            c.remove(&fid(f), k);
                            m.0.retain(|e| e.0 != (fid(f), k));
                        }
                        Op::RemoveFrom(f, k) => {
                            c.remove_in(&fid(f), k..u64::MAX);
                            m.0.retain(|e| e.0.0 != fid(f) || e.0.1 < k);
                        }
                        Op::RemoveFile(f) => {
                            c.remove_in(&fid(f), 0..u64::MAX);
                            m.0.retain(|e| e.0.0 != fid(f));
                        }
                        Op::RetainIn(f, first, span, every) => {
                            c.retain_in(&fid(f), first..first + span, |k| k % every == 0);
                            m.0.retain(|e| {
                                e.0.0 != fid(f)
                                    || !(first..first + span).contains(&e.0.1)
                                    || e.0.1 % every == 0
                            });
                        }
                        Op::Clear => {
                            c.clear();
                            m.0.clear();
                        }
                    }
                    prop_assert_eq!(c.len(), m.0.len());
                    prop_assert_eq!((c.hits(), c.misses()), (hits, misses));
                }
                // Evicting what is left, one insert at a time, follows the model's order.
                for (i, (k, v)) in m.0.iter().rev().enumerate() {
                    prop_assert_eq!(c.get(&k.0, k.1), Some(*v), "node {} of the model", i);
                }
            }
        }
    }
}
