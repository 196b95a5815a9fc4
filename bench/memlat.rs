//! What a random memory access costs on this machine, on 4 KiB pages and on transparent
//! huge pages (docs/performance.md, "Huge pages for the heap"). Built and run by
//! bench/hugepages.sh with `rustc -O`; no dependencies.
//!
//! 1. Random one-byte reads of a 1 GiB array, without and with `madvise(MADV_HUGEPAGE)`.
//! 2. `HashMap` lookups among 10^3 to 10^6 names of 256-byte values (run it twice, with
//!    and without `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, for the heap's pages).
use std::collections::HashMap;
use std::time::Instant;

extern "C" {
    fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
    fn posix_memalign(p: *mut *mut u8, align: usize, size: usize) -> i32;
}

const MADV_HUGEPAGE: i32 = 14;

fn array_reads(huge: bool) -> Vec<f64> {
    let n = 1usize << 30;
    let mut p: *mut u8 = std::ptr::null_mut();
    // SAFETY: posix_memalign writes a pointer to n bytes aligned to 2 MiB (checked below);
    // madvise only advises on that range; write_bytes initialises all n bytes before the
    // slice is made, and the memory is never freed while the slice lives (never freed).
    let v = unsafe {
        assert_eq!(posix_memalign(&mut p, 2 << 20, n), 0, "posix_memalign");
        if huge {
            madvise(p, n, MADV_HUGEPAGE);
        }
        std::ptr::write_bytes(p, 1, n);
        std::slice::from_raw_parts(p, n)
    };
    let ops = 2_000_000usize;
    let (mut s, mut x) = (0usize, 12345usize);
    (0..3)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..ops {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                s += v[(x >> 11) % n] as usize;
            }
            std::hint::black_box(s);
            t.elapsed().as_secs_f64() * 1e9 / ops as f64
        })
        .collect()
}

fn name(i: u64) -> String {
    format!("f{:016x}.txt", i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

fn pick(i: u64, n: u64) -> u64 {
    (i.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ (i >> 7)).wrapping_mul(0x9E37_79B9_7F4A_7C15) % n
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().cloned().fold(f64::MAX, f64::min);
    let hi = v.iter().cloned().fold(0.0, f64::max);
    format!("{lo:.0}–{hi:.0}")
}

fn main() {
    let heap = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    let heap_huge = heap.contains("glibc.malloc.hugetlb=1");
    if std::env::args().nth(1).as_deref() != Some("--maps-only") {
        println!("random 1-byte read of a 1 GiB array, ns: 4 KiB pages {}, huge pages {}",
            range(&array_reads(false)), range(&array_reads(true)));
    }
    for &n in &[1_000u64, 10_000, 100_000, 1_000_000] {
        let mut h: HashMap<String, [u8; 256]> = HashMap::new();
        for i in 0..n {
            h.insert(name(i), [i as u8; 256]);
        }
        // Other work between lookups evicts the CPU's caches: a 64 MiB sweep first.
        let mut sweep = vec![0u8; 64 << 20];
        let ops = 100_000u64;
        let t: Vec<f64> = (0..3)
            .map(|r| {
                for x in sweep.iter_mut().step_by(64) {
                    *x = x.wrapping_add(1);
                }
                let names: Vec<String> = (0..ops).map(|k| name(pick(k + r * ops, n))).collect();
                let t = Instant::now();
                let mut s = 0u64;
                for nm in &names {
                    s += h.get(nm).map_or(0, |v| u64::from(v[(s % 256) as usize]));
                }
                std::hint::black_box(s);
                t.elapsed().as_secs_f64() * 1e9 / ops as f64
            })
            .collect();
        std::hint::black_box(&sweep);
        println!("HashMap lookup among {n} names, heap on {} pages, ns: {}",
            if heap_huge { "huge" } else { "4 KiB" }, range(&t));
    }
}
