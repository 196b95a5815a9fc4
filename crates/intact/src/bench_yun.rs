//! `intact bench yun`: Yun, Shi and Kim's evaluation (2009, §5 and Fig. 5), rerun here.
//!
//! Their claim: with a Merkle hash tree (AES-CTR and a 16-ary tree of SHA-1 truncated to
//! 128 bits), authentication costs 60–70 % of encryption; with their MAC tree (AES-CTR,
//! Poly1305-AES block tags, a tree of MAC'd write counters: intact's `mac-tree`),
//! authentication costs about half of the hash tree's. They measured CPU cycles of a
//! Bonnie++ sequential write and read of a 2 GB file, with every verified node cached and
//! metadata written at close.
//!
//! Two parts, each run `--runs` times (ranges over the runs):
//!
//! * **The constructions, in memory** ([`constructions`]): the same `--mb` of data written
//!   (encrypted, then authenticated) and read (verified, then decrypted) block by block
//!   under (a) AES-256-CTR with their 16-ary SHA-1/128 Merkle tree and (b) AES-256-CTR
//!   with the MAC tree's Poly1305-AES block tags and counter-node MACs (64-ary, as
//!   intact's), with the time of encryption and of authentication kept apart. Nothing but
//!   the cryptography runs, as in their cycle counts.
//! * **The file system** ([`engine`]): the same sequential write (1 MiB requests, then a
//!   seal) and read (after a reopen) through intact's engine on a local directory, under
//!   `none` (encryption alone, no integrity), `aead`, `mac-tree` and `mt-eint`: throughput
//!   and the engine's own split of its time into encryption and authentication (hashing
//!   or MACs, the tree, the root).

use crate::bench::{TempDir, PW};
use anyhow::{bail, Result};
use aws_lc_rs::digest;
use clap::Args;
use intact_core::crypto::{Ctr, MasterKey, PolyAes};
use intact_core::format::SchemeId;
use intact_core::store::{LocalDirStore, LocalStateDir, TrustedStore, UntrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `intact bench yun`.
#[derive(Debug, Args)]
pub struct YunArgs {
    /// MiB written and read (the paper: a 2 GB file).
    #[arg(long, default_value_t = 256)]
    mb: u64,
    /// Runs of each part (the table gives the range over them).
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Where the file-system part's temporary volumes go (on disk).
    #[arg(long, default_value = "/var/tmp")]
    workdir: PathBuf,
}

const BS: usize = 4096;

/// A (min, max) over runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Range {
    pub min: f64,
    pub max: f64,
}

impl Range {
    pub(crate) fn of(v: &[f64]) -> Range {
        Range {
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
    /// `self ÷ other` as a range: the smallest and the largest quotient of their ends.
    pub(crate) fn over(&self, other: &Range) -> Range {
        Range {
            min: self.min / other.max,
            max: self.max / other.min,
        }
    }
    pub(crate) fn show(&self, digits: usize) -> String {
        if format!("{:.*}", digits, self.min) == format!("{:.*}", digits, self.max) {
            format!("{:.*}", digits, self.min)
        } else {
            format!("{:.*}–{:.*}", digits, self.min, digits, self.max)
        }
    }
}

/// One construction's times in one run, ms.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Split {
    pub write_encrypt_ms: f64,
    pub write_auth_ms: f64,
    pub read_encrypt_ms: f64,
    pub read_auth_ms: f64,
}

/// SHA-1 truncated to 128 bits (the paper's hash).
fn sha1_128(parts: &[&[u8]]) -> [u8; 16] {
    let mut c = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    for p in parts {
        c.update(p);
    }
    let d = c.finish();
    d.as_ref()[..16].try_into().expect("SHA-1 has 20 bytes")
}

/// The levels of a 16-ary SHA-1/128 tree over `leaves`, bottom first (the last level is
/// the root).
fn hash_tree(leaves: Vec<[u8; 16]>) -> Vec<Vec<[u8; 16]>> {
    let mut levels = vec![leaves];
    while levels.last().is_some_and(|l| l.len() > 1) {
        let below = levels.last().expect("a level");
        let up = below
            .chunks(16)
            .map(|c| sha1_128(&[c.as_flattened()]))
            .collect();
        levels.push(up);
    }
    levels
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Block `i`'s CTR initial counter: the block index and its write counter.
fn iv(i: u64, ctr: u64) -> [u8; 16] {
    let mut n = [0u8; 16];
    n[..8].copy_from_slice(&ctr.to_le_bytes());
    n[8..].copy_from_slice(&i.to_le_bytes());
    n
}

/// The paper's two constructions over `data` (a multiple of 4 KiB): returns (Merkle hash
/// tree, MAC tree). Each write encrypts every block, then authenticates; each read
/// authenticates every block and every tree node once (an unlimited cache), then decrypts;
/// every check is made and must pass.
pub fn constructions(data: &[u8]) -> Result<(Split, Split)> {
    let master = MasterKey::generate();
    let ctr = Ctr::new(&master.derive("intact bench yun ctr", &[]));
    let mac_key = master.derive("intact bench yun mac", &[]);
    let r: [u8; 16] = mac_key.expose_secret()[..16].try_into().expect("16 bytes");
    let aes = {
        use aes::cipher::KeyInit;
        aes::Aes256::new_from_slice(master.derive("intact bench yun aes", &[]).expose_secret())
            .expect("a 32-byte key")
    };
    let poly = PolyAes::new(aes, r);
    let n = data.len() / BS;

    // (a) AES-CTR + 16-ary SHA-1/128 Merkle tree.
    let mut h = Split::default();
    let mut buf = data.to_vec();
    let t = Instant::now();
    for (i, b) in buf.chunks_mut(BS).enumerate() {
        ctr.xor(iv(i as u64, 1), b);
    }
    h.write_encrypt_ms = ms(t);
    let t = Instant::now();
    let leaves: Vec<[u8; 16]> = buf
        .chunks(BS)
        .enumerate()
        .map(|(i, b)| sha1_128(&[&(i as u64).to_le_bytes(), b]))
        .collect();
    let tree = hash_tree(leaves);
    h.write_auth_ms = ms(t);
    let t = Instant::now();
    for (i, b) in buf.chunks(BS).enumerate() {
        if sha1_128(&[&(i as u64).to_le_bytes(), b]) != tree[0][i] {
            bail!("hash tree: block {i} fails");
        }
    }
    for (j, level) in tree.iter().enumerate().skip(1) {
        for (x, node) in level.iter().enumerate() {
            let children = &tree[j - 1][x * 16..((x + 1) * 16).min(tree[j - 1].len())];
            if sha1_128(&[children.as_flattened()]) != *node {
                bail!("hash tree: node {x} at level {j} fails");
            }
        }
    }
    h.read_auth_ms = ms(t);
    let t = Instant::now();
    for (i, b) in buf.chunks_mut(BS).enumerate() {
        ctr.xor(iv(i as u64, 1), b);
    }
    h.read_encrypt_ms = ms(t);
    if buf != data {
        bail!("hash tree: decryption differs");
    }

    // (b) AES-CTR + the MAC tree: a Poly1305-AES tag per block under its counter, and a
    // 64-ary tree of counters, each node MAC'd under its parent counter.
    let mut m = Split::default();
    let t = Instant::now();
    for (i, b) in buf.chunks_mut(BS).enumerate() {
        ctr.xor(iv(i as u64, 1), b);
    }
    m.write_encrypt_ms = ms(t);
    let t = Instant::now();
    let tags: Vec<[u8; 16]> = buf
        .chunks(BS)
        .enumerate()
        .map(|(i, b)| poly.mac(&iv(i as u64, 1), b))
        .collect();
    let mut counters: Vec<Vec<u64>> = vec![vec![1; n]];
    let mut node_tags: Vec<Vec<[u8; 16]>> = Vec::new();
    while counters.last().is_some_and(|c| c.len() > 1) {
        let below = counters.last().expect("a level");
        let level = node_tags.len() as u64 + 1;
        let mut ts = Vec::new();
        for (x, c) in below.chunks(64).enumerate() {
            let msg: Vec<u8> = c.iter().flat_map(|v| v.to_le_bytes()).collect();
            ts.push(poly.mac(&iv(x as u64 | level << 56, 1), &msg));
        }
        counters.push(vec![1; ts.len()]);
        node_tags.push(ts);
    }
    m.write_auth_ms = ms(t);
    let t = Instant::now();
    for (i, b) in buf.chunks(BS).enumerate() {
        if !poly.verify(&iv(i as u64, 1), b, &tags[i]) {
            bail!("MAC tree: block {i} fails");
        }
    }
    for (j, ts) in node_tags.iter().enumerate() {
        let level = j as u64 + 1;
        for (x, c) in counters[j].chunks(64).enumerate() {
            let msg: Vec<u8> = c.iter().flat_map(|v| v.to_le_bytes()).collect();
            if !poly.verify(&iv(x as u64 | level << 56, 1), &msg, &ts[x]) {
                bail!("MAC tree: node {x} at level {level} fails");
            }
        }
    }
    m.read_auth_ms = ms(t);
    let t = Instant::now();
    for (i, b) in buf.chunks_mut(BS).enumerate() {
        ctr.xor(iv(i as u64, 1), b);
    }
    m.read_encrypt_ms = ms(t);
    if buf != data {
        bail!("MAC tree: decryption differs");
    }
    Ok((h, m))
}

/// One scheme's sequential write and read through the engine.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EngineRun {
    pub write_mb_s: f64,
    pub read_mb_s: f64,
    pub write_encrypt_ms: f64,
    pub write_auth_ms: f64,
    pub read_encrypt_ms: f64,
    pub read_auth_ms: f64,
}

/// The file's own time since the volume was opened: (encryption, authentication: hashes
/// or MACs, the tree and the root), ms. The volume's directories and inode table, which
/// have their own trees, are left out.
fn split_of(vol: &Volume, path: &str) -> Result<(f64, f64)> {
    let t = vol.file_integrity(path)?.time;
    Ok((
        t.encrypt_ns as f64 / 1e6,
        (t.hash_mac_ns + t.tree_ns + t.root_update_ns) as f64 / 1e6,
    ))
}

/// Writes `data` to one file of a fresh volume under `scheme` (1 MiB requests, then a
/// seal), reopens it and reads it back, checking every byte.
pub fn engine(data: &[u8], scheme: SchemeId, workdir: &Path) -> Result<EngineRun> {
    let tmp = TempDir::new(workdir, &format!("yun-{}", scheme.name()))?;
    let cipher = tmp.0.join("cipher");
    let state = tmp.0.join("state");
    std::fs::create_dir_all(&cipher)?;
    let store: Arc<dyn UntrustedStore> = Arc::new(LocalDirStore::open(&cipher)?);
    // Every verified node cached, as in the paper's prototype.
    let opts = Options {
        cache_bytes: 256 << 20,
        ..Options::default()
    };
    let vol = Volume::create(
        store.clone(),
        |id| Ok(Box::new(LocalStateDir::new(state.clone(), id)?) as Box<dyn TrustedStore>),
        PW,
        &CreateOptions {
            scheme,
            kdf: intact_core::crypto::KdfParams::TEST,
            ..CreateOptions::default()
        },
        &opts,
    )?;
    let ino = vol.create_file("/big", None)?;
    let t = Instant::now();
    for (k, c) in data.chunks(1 << 20).enumerate() {
        vol.write_ino(ino, (k << 20) as u64, c)?;
    }
    vol.sync()?;
    let write_s = t.elapsed().as_secs_f64();
    let (we, wa) = split_of(&vol, "/big")?;
    drop(vol);
    let trusted = Volume::state_for(store.as_ref(), &state)?;
    let vol = Volume::open(store, Box::new(trusted), PW, &opts)?;
    let ino = vol.stat("/big")?.ino;
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    for (k, c) in data.chunks(1 << 20).enumerate() {
        let n = vol.read_ino(ino, (k << 20) as u64, &mut buf[..c.len()])?;
        if n != c.len() || buf[..n] != *c {
            bail!("{}: read back other bytes at MiB {k}", scheme.name());
        }
    }
    let read_s = t.elapsed().as_secs_f64();
    let (re, ra) = split_of(&vol, "/big")?;
    vol.set_seal_on_drop(false);
    let mb = data.len() as f64 / 1e6;
    Ok(EngineRun {
        write_mb_s: mb / write_s,
        read_mb_s: mb / read_s,
        write_encrypt_ms: we,
        write_auth_ms: wa,
        read_encrypt_ms: re,
        read_auth_ms: ra,
    })
}

/// What `intact bench yun` measured.
#[derive(Serialize)]
pub struct Report {
    pub command: String,
    pub release_build: bool,
    pub mb: u64,
    pub runs: u32,
    pub hash_tree: Vec<Split>,
    pub mac_tree: Vec<Split>,
    pub engine: Vec<(String, Vec<EngineRun>)>,
}

impl YunArgs {
    /// The arguments `intact bench report` runs the section with.
    pub fn for_report(mb: u64, runs: u32, workdir: PathBuf) -> YunArgs {
        YunArgs { mb, runs, workdir }
    }
}

/// Runs `intact bench yun`.
pub fn yun(a: &YunArgs, json: bool) -> Result<()> {
    let report = run(a)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

/// Runs both parts.
pub fn run(a: &YunArgs) -> Result<Report> {
    if a.mb == 0 || a.runs == 0 {
        bail!("--mb and --runs must be at least 1");
    }
    let mut data = vec![0u8; (a.mb << 20) as usize];
    intact_core::crypto::fill_random(&mut data);
    std::fs::create_dir_all(&a.workdir)?;
    let mut report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        release_build: !cfg!(debug_assertions),
        mb: a.mb,
        runs: a.runs,
        hash_tree: Vec::new(),
        mac_tree: Vec::new(),
        engine: Vec::new(),
    };
    let pb = crate::bench::steps(u64::from(a.runs) * 5, "bench yun");
    for _ in 0..a.runs {
        let (h, m) = constructions(&data)?;
        report.hash_tree.push(h);
        report.mac_tree.push(m);
        pb.inc(1);
    }
    for s in [
        SchemeId::None,
        SchemeId::Aead,
        SchemeId::MacTree,
        SchemeId::MtEintGcm,
    ] {
        let mut runs = Vec::new();
        for _ in 0..a.runs {
            runs.push(engine(&data, s, &a.workdir)?);
            pb.inc(1);
        }
        crate::bench::log(&pb, &format!("  {:<10} done", s.name()));
        report.engine.push((s.name().to_string(), runs));
    }
    pb.finish_and_clear();
    Ok(report)
}

/// The report as Markdown.
pub fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "# intact bench yun\n");
    let _ = writeln!(o, "- command: `{}`", r.command);
    let _ = writeln!(
        o,
        "- {} build; {} MiB written and read; ranges over {} runs",
        if r.release_build { "release" } else { "DEBUG" },
        r.mb,
        r.runs
    );
    let _ = writeln!(
        o,
        "\n## The constructions (Fig. 5), cryptography only, ms\n\n| construction | write: encrypt | write: authenticate | auth / enc | read: decrypt | read: verify | auth / enc |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    let row = |o: &mut String, name: &str, v: &[Split]| {
        let col = |f: &dyn Fn(&Split) -> f64| Range::of(&v.iter().map(f).collect::<Vec<_>>());
        let _ = writeln!(
            o,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            col(&|s| s.write_encrypt_ms).show(1),
            col(&|s| s.write_auth_ms).show(1),
            col(&|s| s.write_auth_ms / s.write_encrypt_ms).show(2),
            col(&|s| s.read_encrypt_ms).show(1),
            col(&|s| s.read_auth_ms).show(1),
            col(&|s| s.read_auth_ms / s.read_encrypt_ms).show(2),
        );
    };
    row(
        &mut o,
        "AES-CTR + 16-ary SHA-1/128 Merkle tree",
        &r.hash_tree,
    );
    row(&mut o, "AES-CTR + MAC tree (Poly1305-AES)", &r.mac_tree);
    let ratio = |f: &dyn Fn(&Split) -> f64| {
        Range::of(
            &r.mac_tree
                .iter()
                .zip(&r.hash_tree)
                .map(|(m, h)| f(m) / f(h))
                .collect::<Vec<_>>(),
        )
    };
    let _ = writeln!(
        o,
        "\nMAC tree's authentication over the hash tree's: write {}, read {} (the paper: about 0.5).",
        ratio(&|s| s.write_auth_ms).show(2),
        ratio(&|s| s.read_auth_ms).show(2)
    );
    let _ = writeln!(
        o,
        "\n## Through the file system (sequential, 1 MiB requests; the engine's own phase times, ms)\n\n| scheme | write MB/s | read MB/s | write: encrypt | write: authenticate | read: decrypt | read: verify |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for (name, runs) in &r.engine {
        let col =
            |f: &dyn Fn(&EngineRun) -> f64| Range::of(&runs.iter().map(f).collect::<Vec<_>>());
        let _ = writeln!(
            o,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            col(&|x| x.write_mb_s).show(0),
            col(&|x| x.read_mb_s).show(0),
            col(&|x| x.write_encrypt_ms).show(0),
            col(&|x| x.write_auth_ms).show(0),
            col(&|x| x.read_encrypt_ms).show(0),
            col(&|x| x.read_auth_ms).show(0),
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16-ary tree by hand: 17 leaves make two nodes and a root; a changed leaf changes
    /// the root; SHA-1 of "abc" is the FIPS 180 value, truncated.
    #[test]
    fn hash_tree_by_hand() {
        assert_eq!(
            hex::encode(sha1_128(&[b"abc"])),
            "a9993e364706816aba3e25717850c26c"
        );
        assert_eq!(
            hex::encode(sha1_128(&[b"a", b"bc"])),
            "a9993e364706816aba3e25717850c26c"
        );
        let leaves: Vec<[u8; 16]> = (0..17u8).map(|k| [k; 16]).collect();
        let t = hash_tree(leaves.clone());
        assert_eq!(t.iter().map(|l| l.len()).collect::<Vec<_>>(), [17, 2, 1]);
        assert_eq!(t[1][1], sha1_128(&[&[16u8; 16]]));
        assert_eq!(t[2][0], sha1_128(&[t[1][0].as_slice(), t[1][1].as_slice()]));
        let mut other = leaves;
        other[3][0] ^= 1;
        assert_ne!(hash_tree(other)[2], t[2]);
        assert_eq!(hash_tree(vec![[7; 16]]), vec![vec![[7; 16]]]);
    }

    /// Both constructions run over 1 MiB: every check passes, every time is measured.
    #[test]
    fn both_constructions_check_what_they_wrote() {
        let mut data = vec![0u8; 1 << 20];
        intact_core::crypto::fill_random(&mut data);
        let (h, m) = constructions(&data).unwrap();
        for s in [h, m] {
            assert!(s.write_encrypt_ms > 0.0 && s.write_auth_ms > 0.0, "{s:?}");
            assert!(s.read_encrypt_ms > 0.0 && s.read_auth_ms > 0.0, "{s:?}");
        }
    }

    /// The file-system part writes, reads back and checks under each scheme, and splits
    /// the engine's time: `none` spends nothing on authentication, the others do.
    #[test]
    fn the_engine_part_splits_encryption_from_authentication() {
        let dir = tempfile::tempdir().unwrap();
        let mut data = vec![0u8; 2 << 20];
        intact_core::crypto::fill_random(&mut data);
        for s in [SchemeId::None, SchemeId::MacTree, SchemeId::MtEintGcm] {
            let r = engine(&data, s, dir.path()).unwrap();
            assert!(r.write_mb_s > 0.0 && r.read_mb_s > 0.0, "{s:?}");
            assert!(r.write_encrypt_ms > 0.0, "{s:?}: {r:?}");
            match s {
                SchemeId::None => assert_eq!(r.write_auth_ms, 0.0, "{r:?}"),
                _ => assert!(
                    r.write_auth_ms > 0.0 && r.read_auth_ms > 0.0,
                    "{s:?}: {r:?}"
                ),
            }
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
