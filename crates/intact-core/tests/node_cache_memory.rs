//! What the Merkle-node cache holds in memory, counted by the allocator (issue 18: the
//! daemon's memory bounded by the caches the user sets).
//!
//! A counting global allocator sees every byte the cache allocates. A cache filled many
//! times over, touched, trimmed and refilled must stay within [`RESIDENT_NODE_BYTES`] a
//! node of its capacity, and [`NodeCache::resident_bytes`] (what docs and `intact stat`
//! can quote) must not under-count what the allocator sees.
//!
//! This file holds one test so that no other test allocates while it counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use intact_core::tree::cache::{NodeCache, NODE_COST, RESIDENT_NODE_BYTES};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's layout and
// pointer unchanged; the counter only records sizes and never touches the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc`/`realloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as for `alloc` and `dealloc`: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}

#[test]
fn a_full_cache_holds_at_most_its_bound_a_node_by_the_allocators_count() {
    for nodes in [1usize, 10, 1000, 100_000, 300_000] {
        let before = live();
        let c = NodeCache::new(nodes * NODE_COST);
        let mut peak = 0isize;
        let mut check = |c: &NodeCache, what: &str| {
            let held = live() - before;
            peak = peak.max(held);
            assert!(
                c.resident_bytes() as isize + 256 >= held,
                "{nodes} nodes, {what}: the cache says {} bytes, the allocator {held}",
                c.resident_bytes()
            );
        };
        // Fill three times over, from several files (evictions leave tombstones).
        for i in 0..3 * nodes as u64 {
            c.insert(&[(i % 7) as u8; 16], i, [i as u8; 32]);
        }
        check(&c, "filled");
        for i in (0..3 * nodes as u64).rev().step_by(3) {
            let _ = c.get(&[(i % 7) as u8; 16], i);
        }
        check(&c, "touched");
        c.remove_in(&[3; 16], 0..u64::MAX);
        for i in 0..nodes as u64 {
            c.insert(&[9; 16], i, [1; 32]);
        }
        check(&c, "trimmed and refilled");
        let bound = (nodes * RESIDENT_NODE_BYTES + 256) as isize;
        assert!(
            peak <= bound,
            "{nodes} nodes held {peak} bytes at the peak, past {bound}"
        );
        drop(c);
        assert_eq!(live(), before, "{nodes} nodes: bytes left after the drop");
    }
}
