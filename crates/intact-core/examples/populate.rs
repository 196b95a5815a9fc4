//! A volume of many small files, made through the engine (no mount), for measuring what
//! the CLI's walks (`fsck`, `info`, `ls -R`) and a mount cost at 10^5 to 10^6 files
//! (issue 18) without the hour a mount takes to create them.
//!
//! `cargo run --release -p intact-core --example populate -- CIPHER STATE N [PER_DIR]`
//! creates a volume (password `INTACT_PASSWORD`, or `pw`) in CIPHER with its anchor under
//! STATE (`intact --state STATE`), then N files of 1 KiB of random-looking bytes in
//! directories `/dNNNN` of PER_DIR files (1,000), sealing every 10,000 files, as
//! `bench/scale.sh` lays them out through the mount.
use intact_core::crypto::KdfParams;
use intact_core::store::{LocalDirStore, LocalStateDir, TrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return Err("usage: populate CIPHER STATE N [PER_DIR]".into());
    }
    let cipher = PathBuf::from(&args[0]);
    let state = PathBuf::from(&args[1]);
    let n: u64 = args[2].parse()?;
    let per_dir: u64 = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let pw = std::env::var("INTACT_PASSWORD").unwrap_or_else(|_| "pw".into());
    std::fs::create_dir_all(&cipher)?;
    let vol = Volume::create(
        Arc::new(LocalDirStore::open(&cipher)?),
        |id| Ok(Box::new(LocalStateDir::new(state.clone(), id)?) as Box<dyn TrustedStore>),
        pw.as_bytes(),
        // The defaults (mt-eint, 4 KiB blocks, every format feature), with a fast KDF.
        &CreateOptions {
            kdf: KdfParams::TEST,
            ..CreateOptions::default()
        },
        &Options::default(),
    )?;
    vol.set_all_or_nothing(true);
    let started = Instant::now();
    let mut data = vec![0u8; 1024];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..n {
        if i % per_dir == 0 {
            vol.mkdir(&format!("/d{:04}", i / per_dir))?;
        }
        for b in data.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let path = format!("/d{:04}/f{:07}", i / per_dir, i);
        vol.create_file(&path, None)?;
        vol.write_path(&path, 0, &data)?;
        if (i + 1) % 10_000 == 0 {
            vol.sync()?;
            eprintln!("{} files, {:.0} s", i + 1, started.elapsed().as_secs_f64());
        }
    }
    vol.sync()?;
    eprintln!("{n} files in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}
