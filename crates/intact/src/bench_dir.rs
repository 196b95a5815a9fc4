//! `intact bench dir`: one directory grown to many entries through the engine (issue 18,
//! "one directory of 10^6 entries"), on the local-directory store on disk. At each power of
//! ten it measures, per operation: a create, a lookup and an unlink (creates and unlinks
//! timed up to the seal that makes them durable: [`Volume::sync_log`], what an fsync of the
//! directory runs), the checkpoint that then folds those changes in (per change), the
//! sustained cost of a create while the directory grows to that size (its checkpoints
//! included), and the bytes written to the store per change, the checkpoint's included
//! (counted by [`CountingStore`]). Each figure is the range over `--samples`
//! samples of `--ops` operations, and the last columns are the ratios to the first row, so
//! the table shows directly whether a directory of 10^6 entries costs what one of 10^3
//! does. `--format list` runs the whole-list directories of volumes made before
//! `dir-tree`, for comparison.

use anyhow::{bail, Result};
use clap::Args;
use intact_core::crypto::KdfParams;
use intact_core::format::SchemeId;
use intact_core::store::{CountingStore, LocalDirStore, LocalStateDir, TrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `intact bench dir`.
#[derive(Debug, Args)]
pub struct DirArgs {
    /// Entries to grow the directory to (measured at every power of ten from 1,000).
    #[arg(long, default_value_t = 1_000_000)]
    entries: u64,
    /// Operations per sample.
    #[arg(long, default_value_t = 500)]
    ops: u64,
    /// Samples per measurement (the table shows their range).
    #[arg(long, default_value_t = 3)]
    samples: u32,
    /// Directory format: `tree` (volumes with `dir-tree`) or `list` (older volumes).
    #[arg(long, default_value = "tree", value_parser = ["tree", "list"])]
    format: String,
    /// Where the temporary volume goes (on disk, not tmpfs).
    #[arg(long, default_value = "/var/tmp")]
    workdir: PathBuf,
}

/// A range over samples.
#[derive(Serialize, Clone, Copy)]
struct Range {
    min: f64,
    max: f64,
}

impl Range {
    fn of(v: &[f64]) -> Range {
        Range {
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(0.0, f64::max),
        }
    }
    fn show(&self) -> String {
        if self.max < 100.0 {
            format!("{:.1}–{:.1}", self.min, self.max)
        } else {
            format!("{:.0}–{:.0}", self.min, self.max)
        }
    }
    fn ratio(&self, base: &Range) -> String {
        format!("{:.2}–{:.2}", self.min / base.max, self.max / base.min)
    }
}

#[derive(Serialize, Clone)]
struct Row {
    entries: u64,
    create_us: Range,
    lookup_us: Range,
    unlink_us: Range,
    /// The checkpoint after the samples, per create or unlink in them.
    checkpoint_us: f64,
    /// Growing the directory from the previous row's size to this one, per create, the
    /// checkpoints that came due and the last one included.
    grow_us: f64,
    /// Bytes written per create or unlink of the samples, their checkpoint included.
    change_bytes: f64,
}

fn name(i: u64) -> String {
    format!("/d/entry-{i:010}")
}

/// A deterministic spread of existing entries to look up and unlink.
fn pick(seed: u64, n: u64) -> u64 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) % n
}

pub fn dir(
    a: &DirArgs,
    cache_bytes: usize,
    meta_cache_bytes: usize,
    records: usize,
    json: bool,
) -> Result<()> {
    if a.entries < 1000 || a.ops == 0 || a.samples == 0 {
        bail!("--entries must be at least 1000, --ops and --samples at least 1");
    }
    let tmp = crate::bench::TempDir::new(&a.workdir, "dir")?;
    let cipher = tmp.0.join("cipher");
    let state = tmp.0.join("state");
    std::fs::create_dir_all(&cipher)?;
    let store = Arc::new(CountingStore::new(LocalDirStore::open(&cipher)?));
    let vol = Volume::create(
        store.clone(),
        |id| Ok(Box::new(LocalStateDir::new(state.clone(), id)?) as Box<dyn TrustedStore>),
        crate::bench::PW,
        &CreateOptions {
            block_size: 4096,
            scheme: SchemeId::MtEintGcm,
            auto: false,
            kdf: KdfParams::TEST,
            inline_leaf: true,
            dir_tree: a.format == "tree",
            inline_mac: true,
            inline_tree: true,
            inline_data: true,
            ctr_segments: true,
            twin_blocks: true,
            leaf_log: true,
            log_delta: true,
        },
        &Options {
            cache_bytes,
            meta_cache_bytes,
            records,
            ..Options::default()
        },
    )?;
    vol.mkdir("/d")?;
    // The numbers of the names present, and the next new name's number.
    let mut live: Vec<u64> = Vec::new();
    let mut next = 0u64;
    let mut rows: Vec<Row> = Vec::new();
    let mut at = 1000u64;
    let started = Instant::now();
    while at <= a.entries {
        let t = Instant::now();
        let grown = at - live.len() as u64;
        while (live.len() as u64) < at {
            vol.create_file(&name(next), None)?;
            live.push(next);
            next += 1;
        }
        vol.sync()?;
        let grow_us = t.elapsed().as_secs_f64() * 1e6 / grown as f64;
        let (mut c, mut l, mut u) = (vec![], vec![], vec![]);
        let before = store.stats().total();
        for s in 0..a.samples as u64 {
            let t = Instant::now();
            for _ in 0..a.ops {
                vol.create_file(&name(next), None)?;
                live.push(next);
                next += 1;
            }
            vol.sync_log()?;
            c.push(t.elapsed().as_secs_f64() * 1e6 / a.ops as f64);
            let t = Instant::now();
            for k in 0..a.ops {
                let i = live[pick(2 * (s * a.ops + k) + 1, live.len() as u64) as usize];
                vol.stat(&name(i))?;
            }
            l.push(t.elapsed().as_secs_f64() * 1e6 / a.ops as f64);
            // Random names present, as a program deleting files it did not just make
            // would pick them (each in a leaf of its own at 10^6, not a leaf in use).
            let victims: Vec<u64> = (0..a.ops)
                .map(|k| {
                    let p = pick(2 * (s * a.ops + k) + 2, live.len() as u64);
                    live.swap_remove(p as usize)
                })
                .collect();
            let t = Instant::now();
            for &i in &victims {
                vol.unlink(&name(i))?;
            }
            vol.sync_log()?;
            u.push(t.elapsed().as_secs_f64() * 1e6 / a.ops as f64);
        }
        let changes = (2 * a.ops * a.samples as u64) as f64;
        let t = Instant::now();
        vol.sync()?;
        let checkpoint_us = t.elapsed().as_secs_f64() * 1e6 / changes;
        let change_bytes = store.stats().total().since(&before).write_bytes as f64 / changes;
        rows.push(Row {
            entries: at,
            create_us: Range::of(&c),
            lookup_us: Range::of(&l),
            unlink_us: Range::of(&u),
            checkpoint_us,
            grow_us,
            change_bytes,
        });
        if !json {
            eprintln!(
                "{at} entries measured ({:.0} s so far)",
                started.elapsed().as_secs_f64()
            );
        }
        at *= 10;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "one directory, {} format, {} ops x {} samples per row (ranges over samples; \
         create and unlink timed to the seal of the log that makes them durable, as an \
         fsync of the directory; then the checkpoint that folds them in, per change; \
         growing to the row's size, per create, checkpoints included)",
        a.format, a.ops, a.samples
    );
    println!(
        "| entries | create µs/op | lookup µs/op | unlink µs/op | checkpoint µs/change | grow µs/create | bytes written per change | create vs first row | lookup vs first | unlink vs first | grow vs first |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let base = rows[0].clone();
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.0} | {} | {} | {} | {:.2} |",
            r.entries,
            r.create_us.show(),
            r.lookup_us.show(),
            r.unlink_us.show(),
            r.checkpoint_us,
            r.grow_us,
            r.change_bytes,
            r.create_us.ratio(&base.create_us),
            r.lookup_us.ratio(&base.lookup_us),
            r.unlink_us.ratio(&base.unlink_us),
            r.grow_us / base.grow_us,
        );
    }
    Ok(())
}
