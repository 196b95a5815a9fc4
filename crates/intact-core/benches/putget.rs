//! Put / get throughput per integrity scheme on the in-memory store, against a baseline
//! that copies the same bytes straight into a `MemStore` object.
//!
//! - `put/<scheme>`: create a file, write 16 MiB in 1 MiB writes, `sync()`.
//! - `get/<scheme>`: reopen the volume (cold caches), read the 16 MiB back in 1 MiB reads.
//! - `rand4k/overwrite/<scheme>`: 64 random block-aligned 4 KiB overwrites of a 16 MiB
//!   file, then `sync()`.
//! - `rand4k/read/<scheme>`: 64 random block-aligned 4 KiB reads of the same file.
//! - `*/memcpy`: the same access pattern on a bare `MemStore` object (no crypto, no
//!   integrity, no journal): the ratio to it is the cost of the scheme.
//!
//! Before the benchmarks, a summary of integrity and journal bytes per MiB of data, measured
//! through `CountingStore`, is printed for each scheme.
//!
//! Run: `cargo bench -p intact-core --bench putget`.

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use intact_core::crypto::KdfParams;
use intact_core::format::SchemeId;
use intact_core::store::{
    CountingStore, IoStats, MemStore, MemTrusted, TrustedStore, UntrustedStore,
};
use intact_core::{CreateOptions, Options, Volume};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u32 = 4096;
const MIB: usize = 1 << 20;
const FILE_SIZE: usize = 16 * MIB;
const CHUNK: usize = MIB;
/// Random operations per iteration of the `rand4k` benchmarks.
const RAND_OPS: usize = 64;
const PW: &[u8] = b"bench";
const PATH: &str = "/f";

fn opts() -> Options {
    Options {
        cache_bytes: 1024,
        read_only: false,
        ..Options::default()
    }
}

fn create(store: Arc<dyn UntrustedStore>, trusted: &MemTrusted, scheme: SchemeId) -> Volume {
    let t = trusted.clone();
    Volume::create(
        store,
        move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
        PW,
        &CreateOptions {
            block_size: BS,
            scheme,
            auto: false,
            kdf: KdfParams::TEST,
            inline_leaf: true,
            dir_tree: true,
            inline_mac: true,
            inline_tree: true,
            inline_data: true,
            ctr_segments: true,
            twin_blocks: true,
            leaf_log: true,
            log_delta: true,
        },
        &opts(),
    )
    .expect("create volume")
}

fn open(store: Arc<dyn UntrustedStore>, trusted: &MemTrusted) -> Volume {
    Volume::open(store, Box::new(trusted.clone()), PW, &opts()).expect("open volume")
}

/// Deterministic, incompressible-looking content.
fn content(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A small deterministic PRNG (splitmix64) for random offsets.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A random block-aligned offset inside the file.
    fn block_off(&mut self) -> u64 {
        (self.next() % (FILE_SIZE as u64 / u64::from(BS))) * u64::from(BS)
    }
}

fn put(vol: &Volume, data: &[u8]) {
    vol.create_file(PATH, None).expect("create file");
    for (k, chunk) in data.chunks(CHUNK).enumerate() {
        vol.write_path(PATH, (k * CHUNK) as u64, chunk)
            .expect("write");
    }
    vol.sync().expect("sync");
}

fn get(vol: &Volume, buf: &mut [u8]) {
    for (k, chunk) in buf.chunks_mut(CHUNK).enumerate() {
        let n = vol
            .read_path(PATH, (k * CHUNK) as u64, chunk)
            .expect("read");
        assert_eq!(n, chunk.len());
    }
}

/// A volume holding the 16 MiB file, closed.
fn prepared(scheme: SchemeId, data: &[u8]) -> (Arc<MemStore>, MemTrusted) {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, scheme);
    put(&vol, data);
    drop(vol);
    (store, trusted)
}

// ---------------------------------------------------------------------------------------
// Overhead summary (CountingStore)

fn per_mib(bytes: u64, data: usize) -> f64 {
    bytes as f64 / (data as f64 / MIB as f64)
}

fn print_row(what: &str, scheme: &str, s: &IoStats, data: usize, write: bool) {
    let pick = |c: &intact_core::store::IoCounts| if write { c.write_bytes } else { c.read_bytes };
    println!(
        "{what:<10} {scheme:<12} {:>12.0} {:>12.0} {:>12.0} {:>12.0}",
        per_mib(pick(&s.data), data),
        per_mib(pick(&s.integrity), data),
        per_mib(pick(&s.journal), data),
        per_mib(pick(&s.control), data),
    );
}

fn overhead_summary() {
    let data = content(FILE_SIZE);
    println!();
    println!("Store bytes per MiB of file data (4 KiB blocks, 16 MiB file, CountingStore):");
    println!(
        "{:<10} {:<12} {:>12} {:>12} {:>12} {:>12}",
        "op", "scheme", "data", "integrity", "journal", "control"
    );
    for scheme in SchemeId::ALL {
        let store = Arc::new(CountingStore::new(MemStore::new()));
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme);
        store.reset();
        put(&vol, &data);
        let w = store.stats();
        drop(vol);

        let vol = open(store.clone(), &trusted);
        store.reset();
        let mut buf = vec![0u8; FILE_SIZE];
        get(&vol, &mut buf);
        let r = store.stats();
        assert!(buf == data, "read back what was written");

        // Random overwrites: RAND_OPS * 16 of them, committed every RAND_OPS.
        let mut rng = Rng(7);
        let block = content(BS as usize);
        store.reset();
        for _ in 0..16 {
            for _ in 0..RAND_OPS {
                vol.write_path(PATH, rng.block_off(), &block)
                    .expect("write");
            }
            vol.sync().expect("sync");
        }
        let ow = store.stats();
        let ow_bytes = 16 * RAND_OPS * BS as usize;
        store.reset();
        let mut b4 = vec![0u8; BS as usize];
        for _ in 0..16 * RAND_OPS {
            vol.read_path(PATH, rng.block_off(), &mut b4).expect("read");
        }
        let rr = store.stats();
        drop(vol);

        print_row("put:write", scheme.name(), &w, FILE_SIZE, true);
        print_row("get:read", scheme.name(), &r, FILE_SIZE, false);
        print_row("rand:write", scheme.name(), &ow, ow_bytes, true);
        print_row("rand:read", scheme.name(), &ow, ow_bytes, false);
        print_row("rread:read", scheme.name(), &rr, ow_bytes, false);
    }
    println!("(rand: 64 random 4 KiB overwrites then sync, x16; rread: 1024 random 4 KiB reads)");
    println!();
}

// ---------------------------------------------------------------------------------------
// Benchmarks

fn configure<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(300));
    g.measurement_time(Duration::from_secs(2));
    g
}

fn bench_put(c: &mut Criterion) {
    overhead_summary();
    let data = content(FILE_SIZE);
    let mut g = configure(c, "put");
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Bytes(FILE_SIZE as u64));
    g.bench_function("memcpy", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let store = MemStore::new();
                let t = Instant::now();
                for (k, chunk) in data.chunks(CHUNK).enumerate() {
                    store
                        .write_at("f/00/obj.d", (k * CHUNK) as u64, chunk)
                        .expect("write");
                }
                store.sync(&["f/00/obj.d".to_string()]).expect("sync");
                total += t.elapsed();
                drop(black_box(store));
            }
            total
        })
    });
    for scheme in SchemeId::ALL {
        g.bench_function(BenchmarkId::from_parameter(scheme.name()), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let store = Arc::new(MemStore::new());
                    let trusted = MemTrusted::new();
                    let vol = create(store.clone(), &trusted, scheme);
                    let t = Instant::now();
                    put(&vol, &data);
                    total += t.elapsed();
                    drop(vol);
                }
                total
            })
        });
    }
    g.finish();
}

fn bench_get(c: &mut Criterion) {
    let data = content(FILE_SIZE);
    let mut g = configure(c, "get");
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Bytes(FILE_SIZE as u64));
    let mut buf = vec![0u8; FILE_SIZE];
    {
        let store = MemStore::new();
        store.write_at("f/00/obj.d", 0, &data).expect("write");
        g.bench_function("memcpy", |b| {
            b.iter(|| {
                for (k, chunk) in buf.chunks_mut(CHUNK).enumerate() {
                    let n = store
                        .read_at("f/00/obj.d", (k * CHUNK) as u64, chunk)
                        .expect("read");
                    assert_eq!(n, chunk.len());
                }
                black_box(&buf);
            })
        });
    }
    for scheme in SchemeId::ALL {
        let (store, trusted) = prepared(scheme, &data);
        g.bench_function(BenchmarkId::from_parameter(scheme.name()), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let vol = open(store.clone(), &trusted);
                    let t = Instant::now();
                    get(&vol, &mut buf);
                    total += t.elapsed();
                    drop(vol);
                }
                total
            })
        });
        assert!(buf == data, "{}: read back what was written", scheme.name());
    }
    g.finish();
}

fn bench_rand(c: &mut Criterion) {
    let data = content(FILE_SIZE);
    let block = content(BS as usize);
    let mut g = configure(c, "rand4k");
    g.throughput(Throughput::Bytes((RAND_OPS * BS as usize) as u64));
    let mut b4 = vec![0u8; BS as usize];
    {
        let store = MemStore::new();
        store.write_at("f/00/obj.d", 0, &data).expect("write");
        let mut rng = Rng(1);
        g.bench_function("overwrite/memcpy", |b| {
            b.iter(|| {
                for _ in 0..RAND_OPS {
                    store
                        .write_at("f/00/obj.d", rng.block_off(), &block)
                        .expect("write");
                }
                store.sync(&["f/00/obj.d".to_string()]).expect("sync");
            })
        });
        g.bench_function("read/memcpy", |b| {
            b.iter(|| {
                for _ in 0..RAND_OPS {
                    store
                        .read_at("f/00/obj.d", rng.block_off(), &mut b4)
                        .expect("read");
                }
                black_box(&b4);
            })
        });
    }
    for scheme in SchemeId::ALL {
        let (store, trusted) = prepared(scheme, &data);
        let vol = open(store, &trusted);
        let mut rng = Rng(1);
        g.bench_function(BenchmarkId::new("overwrite", scheme.name()), |b| {
            b.iter(|| {
                for _ in 0..RAND_OPS {
                    vol.write_path(PATH, rng.block_off(), &block)
                        .expect("write");
                }
                vol.sync().expect("sync");
            })
        });
        g.bench_function(BenchmarkId::new("read", scheme.name()), |b| {
            b.iter(|| {
                for _ in 0..RAND_OPS {
                    vol.read_path(PATH, rng.block_off(), &mut b4).expect("read");
                }
                black_box(&b4);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_put, bench_get, bench_rand);
criterion_main!(benches);
