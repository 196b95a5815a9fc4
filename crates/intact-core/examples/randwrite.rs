//! Random 4 KiB overwrites through the engine alone (no FUSE), on a local-directory store:
//! what one overwrite of a 128 MiB `mt-eint` file costs the engine, round after round, as
//! the file's counter intervals fragment (docs/performance.md, "What one random overwrite
//! costs the engine").
//!
//! Each round makes 8,192 overwrites of random blocks (each a `Volume::write_ino`, which
//! returns once the write's log record is in the store, as a FUSE WRITE does) and then
//! seals; the round prints µs per write and the seal's time.
//!
//! Run: `cargo run --release -p intact-core --example randwrite -- [DIR [ROUNDS]]`
//! (DIR default `/dev/shm/intact-randwrite`, emptied first; ROUNDS default 4).

use intact_core::crypto::KdfParams;
use intact_core::format::SchemeId;
use intact_core::store::{LocalDirStore, MemTrusted, TrustedStore, UntrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use std::sync::Arc;
use std::time::Instant;

const FILE_BLOCKS: u64 = 32_768;
const WRITES: u32 = 8_192;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .unwrap_or_else(|| "/dev/shm/intact-randwrite".into());
    let rounds: usize = args.next().map_or(Ok(4), |s| s.parse())?;
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let store: Arc<dyn UntrustedStore> = Arc::new(LocalDirStore::create(&dir)?);
    let trusted = MemTrusted::default();
    // The mount's node cache (4 MiB); the rest as a mount has it.
    let opts = Options {
        cache_bytes: 4 << 20,
        ..Options::default()
    };
    let vol = Volume::create(
        store,
        move |_| Ok(Box::new(trusted) as Box<dyn TrustedStore>),
        b"randwrite",
        &CreateOptions {
            scheme: SchemeId::MtEintGcm,
            kdf: KdfParams::TEST,
            ..CreateOptions::default()
        },
        &opts,
    )?;
    let ino = vol.create_file("/f", None)?;
    let mib = vec![7u8; 1 << 20];
    for k in 0..FILE_BLOCKS / 256 {
        vol.write_ino(ino, k << 20, &mib)?;
    }
    vol.sync()?;
    // splitmix64: the same blocks in every run.
    let mut x = 42u64;
    let mut next = move || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let block = vec![9u8; 4096];
    for r in 0..rounds {
        let t = Instant::now();
        for _ in 0..WRITES {
            vol.write_ino(ino, (next() % FILE_BLOCKS) * 4096, &block)?;
        }
        let per_write = t.elapsed().as_secs_f64() * 1e6 / f64::from(WRITES);
        let t = Instant::now();
        vol.sync()?;
        println!(
            "round {r}: {per_write:.1} us per write, seal {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}
