//! The daemon's heap under glibc: one malloc arena, and free pages given back.
//!
//! glibc gives each thread that allocates while another holds an arena an arena of its own,
//! up to 8 per core. The daemon's request threads each load inode records, directory units
//! and names and free them on other threads, so every arena keeps pages of its own that are
//! mostly free: after `ls -lR` of a volume of 10^6 files, nine arenas held 116 MB of
//! anonymous memory, where one arena held 64 MB for the same listing at the same speed
//! (1 min 29 s either way), 39 MB once trimmed (docs/performance.md, issue 18). Requests
//! allocate little on their paths that run in parallel (reads decrypt into buffers the
//! kernel's request brought), and each thread's cache (`tcache`) serves small sizes without
//! the arena's lock.
//!
//! Other C libraries (musl) have no arenas; there both functions do nothing.

/// Makes every later allocation come from one arena, unless `MALLOC_ARENA_MAX` is set
/// (then glibc already took the user's choice). Call it before the daemon starts threads:
/// arenas made before stay.
pub fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt takes two integers and changes an allocator setting under the
        // allocator's own lock; it reads and writes no memory of ours, and M_ARENA_MAX with
        // a positive value is a documented, valid pair at any time.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// Gives the operating system back the free pages of every arena (`malloc_trim`). It walks
/// the arena's free lists under its lock, so call it from a background thread, seldom (the
/// mount's `intact-trim` thread calls it every 30 s).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes a byte count and returns unused pages at the top of the heap
    // and inside free chunks to the kernel (madvise); it touches only the allocator's own
    // memory, under its locks, and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    /// Free pages go back: memory freed by this thread is out of the process's resident set
    /// once trimmed (glibc only; elsewhere it does nothing and this checks nothing).
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn trimming_gives_freed_pages_back() {
        fn anon_kib() -> u64 {
            let s = std::fs::read_to_string("/proc/self/status").unwrap();
            s.lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap()
        }
        // 16 MiB in small pieces (below the mmap threshold, so they live in an arena), then
        // one more kept after them, so that freeing them leaves a free region inside the
        // heap, which free() never gives back by itself (it only shrinks the heap's top).
        let pieces: Vec<Vec<u8>> = (0..8192).map(|_| vec![1u8; 2048]).collect();
        let guard = vec![2u8; 2048];
        drop(pieces);
        let before = anon_kib();
        super::release_free_memory();
        let after = anon_kib();
        assert!(
            after + 8 * 1024 < before,
            "trim gave back {} KiB of 16 MiB freed",
            before.saturating_sub(after)
        );
        assert_eq!(guard[0], 2);
    }
}
