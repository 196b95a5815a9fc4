//! `intact bench schemes`: the papers' metrics for every scheme, measured on this machine.
//!
//! The metrics are those of Oprea–Reiter (2006 §6; 2007 §6, Fig. 7): write and read time,
//! integrity bandwidth (bytes of `US_F` accessed per block accessed), untrusted storage for
//! integrity, trusted storage per file, and the time by phase; and Yun–Shi–Kim (2009 §5):
//! the MAC tree's authentication cost against a Merkle tree. Every number comes from
//! [`intact_core::metrics`] (counted by the `Tx` and the scheme dispatch, not estimated) or
//! from the store's object lengths, on a real [`LocalDirStore`] on disk.
//!
//! Data sets are gathered at run time from this machine (the list is part of the output):
//! `low` = text and source files, `high` = already-compressed files, or `--dir PATH`.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use intact_core::crypto::KdfParams;
use intact_core::format::SchemeId;
use intact_core::metrics::{Io, MetricsSnapshot, PhaseTimes};
use intact_core::store::{LocalDirStore, LocalStateDir, TrustedStore, UntrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Every scheme on the same data sets, in one process: write and read throughput,
    /// integrity bandwidth, storage for integrity, trusted bytes per file, time by phase
    /// (Oprea–Reiter 2006 §6 / 2007 Fig. 7; Yun–Shi–Kim §5). Use a release build.
    Schemes(SchemesArgs),
    /// One directory grown to 10^6 entries through the engine: create, lookup and unlink
    /// per operation, and bytes written per create, at every power of ten, with their
    /// ratios to 10^3 (issue 18). Use a release build.
    Dir(crate::bench_dir::DirArgs),
    /// Oprea–Reiter's trace experiment (2007 §7.2 Fig. 10; 2006 §6 Figs. 16, 17): the
    /// LAIR, DEASNA and HOME02 traces, synthetic with Table 3's counts (or real ones with
    /// --trace), replayed under MT-EINT, RAND-EINT and COMP-EINT with all-low, all-high and
    /// half high-entropy blocks: time, integrity bandwidth and untrusted storage relative
    /// to MT-EINT, and counter intervals against trusted storage per file. Use a release
    /// build.
    Traces(crate::bench_trace::TracesArgs),
    /// Yun–Shi–Kim's evaluation (2009 §5, Fig. 5): encryption against authentication
    /// under their 16-ary SHA-1 Merkle tree and their MAC tree (the cryptography alone),
    /// and a sequential write and read through the file system under none, aead, mac-tree
    /// and mt-eint. Use a release build.
    Yun(crate::bench_yun::YunArgs),
    /// Oprea–Reiter's file experiments (2006 §6 Tables 2, 3, 5, Figs. 12, 13; 2007 §7.1
    /// Figs. 7–9): five corpora from this machine (text, objects, executables, images,
    /// compressed), their random-looking blocks per block size, and MT-EINT, RAND-EINT and
    /// COMP-EINT over a node-cache sweep and a block-size sweep, beside the published
    /// numbers; then the trace experiment (`bench traces`). Use a release build.
    OpreaReiter(crate::bench_or::OpreaReiterArgs),
    /// Every paper's experiments that exist here (Oprea–Reiter's files and traces, Yun et
    /// al.'s Fig. 5, Burke et al.'s PAC headline) and the twelve attacks on every scheme
    /// and the peers installed, rerun and written into one report with figures
    /// (docs/evaluation.md): each claim, the published numbers, ours, a verdict, and why
    /// they differ. `--quick` runs in minutes. Use a release build.
    Report(crate::bench_report::ReportArgs),
    /// The twelve tampering and rollback attacks of docs/threat-model.md against scratch
    /// volumes, one set per scheme, and against gocryptfs, CryFS and securefs where they
    /// are installed: the detection table, and what a reader silently got from each
    /// attack that went unnoticed. Fails when an outcome differs from the documentation.
    Attacks(crate::bench_attacks::AttacksArgs),
    /// Contiu et al.'s testbed (2017). Micro (§4.1, Figs. 2–4): AES-CBC/CTR/GCM at 128, 192
    /// and 256 bits, SHA-256/384/512 and RSA/ECDSA signatures at the three strengths of
    /// their Table 1, in cycles, through aws-lc-rs and OpenSSL 3. Macro (§4.2, Figs. 5–7):
    /// their six object-level schemes and intact's on their three data sets under their
    /// four workloads, in a cloud with 50 ms a request and on a real S3 server. Beside their
    /// numbers and a verdict on each claim. Use a release build.
    Contiu(crate::bench_contiu::ContiuArgs),
}

/// Arguments of `intact bench schemes`.
#[derive(Debug, Args)]
pub struct SchemesArgs {
    /// Data set: low (text and source files), high (already-compressed files), or both.
    #[arg(long, default_value = "both", value_parser = ["low", "high", "both"])]
    set: String,
    /// Use every regular file under PATH as the data set instead (named `dir`).
    #[arg(long, value_name = "PATH")]
    dir: Option<PathBuf>,
    /// At most this many MiB per data set.
    #[arg(long, default_value_t = 64)]
    mb: u64,
    /// Comma-separated schemes to run (`auto`: the policy) [default: all eight, then auto].
    #[arg(long, value_delimiter = ',')]
    schemes: Vec<String>,
    /// Where the temporary volumes go (must be on disk, not tmpfs, for the store wait to mean
    /// anything).
    #[arg(long, default_value = "/var/tmp")]
    workdir: PathBuf,
    /// Block size in bytes.
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// Do not drop the page cache between writing and reading back, even as root.
    #[arg(long)]
    no_drop_caches: bool,
}

/// One data set: the files (content held in memory to verify what is read back).
pub(crate) struct DataSet {
    pub(crate) name: String,
    pub(crate) roots: Vec<RootSummary>,
    pub(crate) files: Vec<SrcFile>,
}

pub(crate) struct SrcFile {
    pub(crate) path: PathBuf,
    pub(crate) data: Vec<u8>,
}

/// Where and how [`run_scheme`] makes its volume.
pub(crate) struct RunParams {
    pub(crate) workdir: PathBuf,
    pub(crate) block_size: u32,
}

#[derive(Serialize, Clone)]
pub(crate) struct RootSummary {
    root: String,
    files: usize,
    bytes: u64,
}

pub(crate) const COMPRESSED_EXT: &[&str] =
    &["gz", "xz", "zst", "bz2", "jpg", "jpeg", "png", "crate"];
/// Other binary formats kept out of the text set.
const BINARY_EXT: &[&str] = &["zip", "pdf", "gif", "ico", "woff", "woff2", "ttf", "otf"];

pub(crate) fn ext_of(p: &Path) -> String {
    p.extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// Regular files under `root` in sorted order (symlinks are not followed; unreadable
/// directories are skipped).
fn walk(root: &Path, out: &mut Vec<(PathBuf, u64)>) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Ok(md) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if md.is_dir() {
            walk(&e.path(), out);
        } else if md.is_file() && md.len() > 0 {
            out.push((e.path(), md.len()));
        }
    }
}

/// Fills up to `quota` bytes from `root` with files accepted by `keep` (in sorted order;
/// files that do not fit are skipped so smaller later ones can fill the rest).
fn fill(
    root: &Path,
    quota: u64,
    keep: &dyn Fn(&Path, &[u8]) -> bool,
    files: &mut Vec<SrcFile>,
) -> RootSummary {
    let mut list = Vec::new();
    walk(root, &mut list);
    let mut s = RootSummary {
        root: root.display().to_string(),
        files: 0,
        bytes: 0,
    };
    for (path, len) in list {
        if s.bytes >= quota - quota / 50 {
            break;
        }
        if s.bytes + len > quota {
            continue;
        }
        let Ok(data) = std::fs::read(&path) else {
            continue;
        };
        if data.is_empty() || s.bytes + data.len() as u64 > quota || !keep(&path, &data) {
            continue;
        }
        s.files += 1;
        s.bytes += data.len() as u64;
        files.push(SrcFile { path, data });
    }
    s
}

pub(crate) fn gather(
    name: &str,
    roots: &[PathBuf],
    cap: u64,
    keep: &dyn Fn(&Path, &[u8]) -> bool,
) -> DataSet {
    let mut files = Vec::new();
    let mut summaries = Vec::new();
    let mut used = 0u64;
    for (k, root) in roots.iter().enumerate() {
        // An even share of what is left, so every root contributes.
        let quota = (cap - used) / (roots.len() - k) as u64;
        let s = fill(root, quota, keep, &mut files);
        used += s.bytes;
        summaries.push(s);
    }
    DataSet {
        name: name.to_string(),
        roots: summaries,
        files,
    }
}

fn low_set(cap: u64) -> DataSet {
    let mut roots = vec![
        PathBuf::from("/usr/share/doc"),
        PathBuf::from("/usr/include"),
    ];
    if let Ok(out) = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
    {
        let src =
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("lib/rustlib/src");
        if out.status.success() && src.is_dir() {
            roots.push(src);
        }
    }
    gather("low", &roots, cap, &|p, d| {
        let e = ext_of(p);
        !COMPRESSED_EXT.contains(&e.as_str())
            && !BINARY_EXT.contains(&e.as_str())
            && !d.contains(&0)
    })
}

fn high_set(cap: u64) -> DataSet {
    let mut roots = vec![PathBuf::from("/usr/share"), PathBuf::from("/usr/lib")];
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(c) = cargo_home {
        let cache = c.join("registry/cache");
        if cache.is_dir() {
            roots.push(cache);
        }
    }
    gather("high", &roots, cap, &|p, _| {
        COMPRESSED_EXT.contains(&ext_of(p).as_str())
    })
}

/// What one scheme measured on one data set.
#[derive(Serialize, Clone)]
pub(crate) struct SchemeResult {
    pub(crate) scheme: String,
    pub(crate) files: usize,
    pub(crate) bytes: u64,
    pub(crate) write_secs: f64,
    pub(crate) read_secs: f64,
    pub(crate) write_mb_s: f64,
    pub(crate) read_mb_s: f64,
    /// Blocks written / read through the scheme, summed over the data set's files.
    pub(crate) blocks_written: u64,
    pub(crate) blocks_read: u64,
    /// `US_F` bytes of the data set's files accessed while writing (read, written) and
    /// while reading back (read).
    pub(crate) us_read_while_writing: u64,
    pub(crate) us_written: u64,
    pub(crate) us_read: u64,
    /// `US_F` bytes read per block read (reading back, cold).
    pub(crate) read_bandwidth: f64,
    /// `US_F` bytes written per block written.
    pub(crate) write_bandwidth: f64,
    /// The same over the whole volume (directories and the inode table included).
    pub(crate) volume_read_bandwidth: f64,
    pub(crate) volume_write_bandwidth: f64,
    /// Untrusted storage for integrity of the data set's files.
    pub(crate) meta_object_bytes: u64,
    pub(crate) ctrs_object_bytes: u64,
    pub(crate) data_overhead_bytes: u64,
    pub(crate) integrity_bytes: u64,
    pub(crate) integrity_pct: f64,
    /// TS_F bytes in use, summed and per file.
    pub(crate) trusted_bytes: u64,
    pub(crate) trusted_bytes_per_file: f64,
    pub(crate) write_time: PhaseTimes,
    pub(crate) read_time: PhaseTimes,
    /// Throughput over the wall time less the time waiting for the store (the CPU cost).
    pub(crate) write_mb_s_excl_store: f64,
    pub(crate) read_mb_s_excl_store: f64,
    /// The whole volume's counters over the write and the read phase.
    pub(crate) write_volume: MetricsSnapshot,
    pub(crate) read_volume: MetricsSnapshot,
}

#[derive(Serialize)]
struct SetReport {
    set: String,
    files: usize,
    bytes: u64,
    roots: Vec<RootSummary>,
    /// Every file, in the order written: (path, bytes).
    file_list: Vec<(String, u64)>,
    results: Vec<SchemeResult>,
}

#[derive(Serialize)]
struct Report {
    command: String,
    date_utc: String,
    machine: String,
    release_build: bool,
    block_size: u32,
    cache_bytes: usize,
    page_cache_dropped: bool,
    page_cache_note: String,
    workdir: String,
    sets: Vec<SetReport>,
}

fn io_since(a: &Io, b: &Io) -> Io {
    Io {
        read_bytes: a.read_bytes - b.read_bytes,
        write_bytes: a.write_bytes - b.write_bytes,
        reads: a.reads - b.reads,
        writes: a.writes - b.writes,
    }
}

/// `a - b` of two snapshots of the same volume.
fn since(a: &MetricsSnapshot, b: &MetricsSnapshot) -> MetricsSnapshot {
    let (ta, tb) = (a.time.to_array(), b.time.to_array());
    let blocks_read = a.blocks_read - b.blocks_read;
    let blocks_written = a.blocks_written - b.blocks_written;
    let integrity = io_since(&a.integrity, &b.integrity);
    MetricsSnapshot {
        blocks_read,
        blocks_written,
        data: io_since(&a.data, &b.data),
        integrity,
        integrity_bandwidth: ratio(
            integrity.read_bytes + integrity.write_bytes,
            blocks_read + blocks_written,
        ),
        time: PhaseTimes::from_array(std::array::from_fn(|k| ta[k] - tb[k])),
    }
}

/// MB/s over `secs` less the store wait.
fn excl(bytes: u64, secs: f64, m: &MetricsSnapshot) -> f64 {
    let cpu = secs - m.time.store_wait_ns as f64 / 1e9;
    if cpu <= 0.0 {
        0.0
    } else {
        bytes as f64 / 1e6 / cpu
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// A progress bar of `total` steps on stderr for a long benchmark (hidden when stderr is
/// not a terminal). Lines logged meanwhile go through [`log`], above the bar.
pub(crate) fn steps(total: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} runs, {elapsed} elapsed, eta {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Prints `line` on stderr above `pb` (also when the bar is hidden).
pub(crate) fn log(pb: &indicatif::ProgressBar, line: &str) {
    pb.suspend(|| eprintln!("{line}"));
}

/// A temporary directory removed when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(parent: &Path, tag: &str) -> Result<TempDir> {
        let mut r = [0u8; 8];
        intact_core::crypto::fill_random(&mut r);
        let p = parent.join(format!(
            "intact-bench-{}-{tag}-{:016x}",
            std::process::id(),
            u64::from_le_bytes(r)
        ));
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn vpath(k: usize) -> (String, String) {
    let dir = format!("/d{:03}", k / 256);
    (dir.clone(), format!("{dir}/f{k:06}"))
}

pub(crate) const PW: &[u8] = b"intact bench (a throwaway volume)";
const CHUNK: usize = 1 << 20;

/// Syncs and drops the page cache (root only); whether it did.
pub(crate) fn drop_caches() -> bool {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

/// `scheme`: `None` runs the `auto` policy (a volume whose default is `auto`).
pub(crate) fn run_scheme(
    set: &DataSet,
    scheme: Option<SchemeId>,
    a: &RunParams,
    cache_bytes: usize,
    drop_cache: bool,
) -> Result<(SchemeResult, bool)> {
    let name = scheme.map_or(intact_core::volume::AUTO, |s| s.name());
    let tmp = TempDir::new(&a.workdir, name)?;
    let cipher = tmp.0.join("cipher");
    let state = tmp.0.join("state");
    std::fs::create_dir_all(&cipher)?;
    let opts = Options {
        cache_bytes,
        read_only: false,
        // Every file's record stays resident, so that its measured counts (kept with the
        // record) cover the whole write and the whole read: with the default budget, a set
        // of more than 1,024 files lost the counts of the files dropped meanwhile.
        records: set.files.len() + 1024,
        ..Options::default()
    };
    let copts = CreateOptions {
        block_size: a.block_size,
        scheme: scheme.unwrap_or(SchemeId::MtEintGcm),
        auto: scheme.is_none(),
        kdf: KdfParams::TEST,
        inline_leaf: true,
        dir_tree: true,
        inline_mac: true,
        inline_tree: true,
        // The papers' metrics are those of each scheme's blocks and trees: no file's data
        // in the inode table's slots.
        inline_data: false,
        // The counters as the paper keeps them (Fig. 6): the arrays whole, however many.
        ctr_segments: false,
        twin_blocks: false,
        leaf_log: false,
        log_delta: false,
    };
    let store: Arc<dyn UntrustedStore> = Arc::new(LocalDirStore::open(&cipher)?);
    let vol = Volume::create(
        store.clone(),
        |id| Ok(Box::new(LocalStateDir::new(state.clone(), id)?) as Box<dyn TrustedStore>),
        PW,
        &copts,
        &opts,
    )?;
    let bytes: u64 = set.files.iter().map(|f| f.data.len() as u64).sum();
    for k in (0..set.files.len()).step_by(256) {
        vol.mkdir(&vpath(k).0)?;
    }
    vol.sync()?;

    // Write: create + 1 MiB writes, one sync at the end.
    let m0 = vol.metrics();
    let t = Instant::now();
    for (k, f) in set.files.iter().enumerate() {
        let p = vpath(k).1;
        vol.create_file(&p, scheme)?;
        for (c, chunk) in f.data.chunks(CHUNK).enumerate() {
            vol.write_path(&p, (c * CHUNK) as u64, chunk)?;
        }
    }
    vol.sync()?;
    let write_secs = t.elapsed().as_secs_f64();
    let wm = since(&vol.metrics(), &m0);
    let mut r = SchemeResult {
        scheme: name.to_string(),
        files: set.files.len(),
        bytes,
        write_secs,
        read_secs: 0.0,
        write_mb_s: bytes as f64 / 1e6 / write_secs,
        read_mb_s: 0.0,
        blocks_written: 0,
        blocks_read: 0,
        us_read_while_writing: 0,
        us_written: 0,
        us_read: 0,
        read_bandwidth: 0.0,
        write_bandwidth: 0.0,
        volume_read_bandwidth: 0.0,
        volume_write_bandwidth: ratio(wm.integrity.write_bytes, wm.blocks_written),
        meta_object_bytes: 0,
        ctrs_object_bytes: 0,
        data_overhead_bytes: 0,
        integrity_bytes: 0,
        integrity_pct: 0.0,
        trusted_bytes: 0,
        trusted_bytes_per_file: 0.0,
        write_time: wm.time,
        read_time: PhaseTimes::default(),
        write_mb_s_excl_store: excl(bytes, write_secs, &wm),
        read_mb_s_excl_store: 0.0,
        write_volume: wm,
        read_volume: MetricsSnapshot::default(),
    };
    for k in 0..set.files.len() {
        let fi = vol.file_integrity(&vpath(k).1)?;
        r.blocks_written += fi.measured.blocks_written;
        r.us_written += fi.measured.integrity.write_bytes;
        r.us_read_while_writing += fi.measured.integrity.read_bytes;
        r.meta_object_bytes += fi.meta_object_bytes;
        r.ctrs_object_bytes += fi.ctrs_object_bytes;
        r.data_overhead_bytes += fi.data_overhead_bytes;
        r.integrity_bytes += fi.integrity_bytes;
        r.trusted_bytes += fi.trusted_bytes;
    }
    r.write_bandwidth = ratio(r.us_written, r.blocks_written);
    r.integrity_pct = 100.0 * r.integrity_bytes as f64 / bytes.max(1) as f64;
    r.trusted_bytes_per_file = r.trusted_bytes as f64 / set.files.len().max(1) as f64;
    drop(vol);

    let dropped = drop_cache && drop_caches();

    // Read back after a reopen, verifying every byte.
    let trusted = Volume::state_for(store.as_ref(), &state)?;
    let vol = Volume::open(store, Box::new(trusted), PW, &opts)?;
    let m0 = vol.metrics();
    let mut buf = vec![0u8; CHUNK];
    let t = Instant::now();
    for (k, f) in set.files.iter().enumerate() {
        let p = vpath(k).1;
        let mut off = 0usize;
        loop {
            let n = vol.read_path(&p, off as u64, &mut buf)?;
            if n == 0 {
                break;
            }
            if off + n > f.data.len() || buf[..n] != f.data[off..off + n] {
                bail!(
                    "{}: {} returned wrong bytes at offset {off} (of {})",
                    name,
                    f.path.display(),
                    f.data.len()
                );
            }
            off += n;
        }
        if off != f.data.len() {
            bail!(
                "{}: {} read back {off} bytes of {}",
                name,
                f.path.display(),
                f.data.len()
            );
        }
    }
    r.read_secs = t.elapsed().as_secs_f64();
    let rm = since(&vol.metrics(), &m0);
    r.read_mb_s = bytes as f64 / 1e6 / r.read_secs;
    r.read_time = rm.time;
    r.read_mb_s_excl_store = excl(bytes, r.read_secs, &rm);
    r.read_volume = rm;
    r.volume_read_bandwidth = ratio(rm.integrity.read_bytes, rm.blocks_read);
    for k in 0..set.files.len() {
        let fi = vol.file_integrity(&vpath(k).1)?;
        r.blocks_read += fi.measured.blocks_read;
        r.us_read += fi.measured.integrity.read_bytes;
    }
    r.read_bandwidth = ratio(r.us_read, r.blocks_read);
    vol.set_seal_on_drop(false);
    Ok((r, dropped))
}

/// Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

pub(crate) fn now_utc() -> String {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = civil(s.div_euclid(86_400));
    let t = s.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {kernel}")
}

/// The schemes to run; `None` is the `auto` policy.
fn parse_schemes(names: &[String]) -> Result<Vec<Option<SchemeId>>> {
    if names.is_empty() {
        let mut all: Vec<Option<SchemeId>> = SchemeId::ALL.iter().map(|&s| Some(s)).collect();
        all.push(None);
        return Ok(all);
    }
    let mut out = Vec::new();
    for n in names {
        let s = match n.trim() {
            intact_core::volume::AUTO => None,
            n => Some(SchemeId::parse(n)?),
        };
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}

/// Runs `intact bench schemes`.
pub fn schemes(a: &SchemesArgs, cache_bytes: usize, json: bool) -> Result<()> {
    let schemes = parse_schemes(&a.schemes)?;
    if a.mb == 0 {
        bail!("--mb must be at least 1");
    }
    let cap = a.mb << 20;
    let mut sets = Vec::new();
    if let Some(d) = &a.dir {
        if !d.is_dir() {
            bail!("{}: not a directory", d.display());
        }
        sets.push(gather("dir", std::slice::from_ref(d), cap, &|_, _| true));
    } else {
        if a.set != "high" {
            sets.push(low_set(cap));
        }
        if a.set != "low" {
            sets.push(high_set(cap));
        }
    }
    for s in &sets {
        if s.files.is_empty() {
            bail!("data set `{}` is empty: no files found", s.name);
        }
    }
    let want_drop = !a.no_drop_caches;
    let mut dropped_all = want_drop;
    let mut reports = Vec::new();
    for set in &sets {
        let bytes: u64 = set.files.iter().map(|f| f.data.len() as u64).sum();
        eprintln!(
            "set {}: {} files, {:.1} MiB",
            set.name,
            set.files.len(),
            bytes as f64 / (1 << 20) as f64
        );
        let mut results = Vec::new();
        for &s in &schemes {
            let params = RunParams {
                workdir: a.workdir.clone(),
                block_size: a.block_size,
            };
            let (r, dropped) = run_scheme(set, s, &params, cache_bytes, want_drop)?;
            dropped_all &= dropped;
            eprintln!(
                "  {:<15} write {:>8.1} MB/s  read {:>8.1} MB/s  (verified)",
                r.scheme, r.write_mb_s, r.read_mb_s
            );
            results.push(r);
        }
        reports.push(SetReport {
            set: set.name.clone(),
            files: set.files.len(),
            bytes,
            roots: set.roots.clone(),
            file_list: set
                .files
                .iter()
                .map(|f| (f.path.display().to_string(), f.data.len() as u64))
                .collect(),
            results,
        });
    }
    let note = if !want_drop {
        "not dropped (--no-drop-caches): reads may be served from the page cache".to_string()
    } else if dropped_all {
        "dropped before every read-back (sync; echo 3 > /proc/sys/vm/drop_caches)".to_string()
    } else {
        "NOT dropped (not root?): reads may be served from the page cache".to_string()
    };
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        date_utc: now_utc(),
        machine: machine(),
        release_build: !cfg!(debug_assertions),
        block_size: a.block_size,
        cache_bytes,
        page_cache_dropped: want_drop && dropped_all,
        page_cache_note: note,
        workdir: a.workdir.display().to_string(),
        sets: reports,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

fn ms(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e6)
}

/// `x` relative to `base` as "×r", or a note when a side is zero.
fn rel(x: f64, base: f64) -> String {
    if base == 0.0 {
        if x == 0.0 {
            "both 0".into()
        } else {
            "base 0".into()
        }
    } else if x == 0.0 {
        "0 (∞× less)".into()
    } else if x < base {
        format!("×{:.3} ({:.1}× less)", x / base, base / x)
    } else {
        format!("×{:.2}", x / base)
    }
}

fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "# intact bench schemes\n");
    let _ = writeln!(o, "- command: `{}`", r.command);
    let _ = writeln!(o, "- date: {}", r.date_utc);
    let _ = writeln!(
        o,
        "- machine: {}; {} build; volumes under {}",
        r.machine,
        if r.release_build { "release" } else { "DEBUG" },
        r.workdir
    );
    let _ = writeln!(
        o,
        "- {}-byte blocks, {}-byte node cache, writes in 1 MiB chunks with one sync, reads after \
         a reopen, every byte verified",
        r.block_size, r.cache_bytes
    );
    let _ = writeln!(o, "- page cache: {}", r.page_cache_note);
    for s in &r.sets {
        let _ = writeln!(
            o,
            "\n## Set `{}`: {} files, {} bytes ({:.1} MiB, mean {:.0} bytes/file)\n",
            s.set,
            s.files,
            s.bytes,
            s.bytes as f64 / (1 << 20) as f64,
            s.bytes as f64 / s.files.max(1) as f64
        );
        for root in &s.roots {
            let _ = writeln!(
                o,
                "- {}: {} files, {} bytes",
                root.root, root.files, root.bytes
            );
        }
        let _ = writeln!(o, "\n(`--json` lists every file.)\n");
        let _ = writeln!(
            o,
            "| scheme | write MB/s | read MB/s | w / r MB/s without store wait | IB read (B/block) | \
             IB write (B/block) | US_F bytes (.m / .c / in-block) | US_F % of data | TS_F B/file |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---|---:|---:|");
        for x in &s.results {
            let _ = writeln!(
                o,
                "| {} | {:.1} | {:.1} | {:.0} / {:.0} | {:.2} | {:.2} | {} ({} / {} / {}) | {:.3} | {:.1} |",
                x.scheme,
                x.write_mb_s,
                x.read_mb_s,
                x.write_mb_s_excl_store,
                x.read_mb_s_excl_store,
                x.read_bandwidth,
                x.write_bandwidth,
                x.integrity_bytes,
                x.meta_object_bytes,
                x.ctrs_object_bytes,
                x.data_overhead_bytes,
                x.integrity_pct,
                x.trusted_bytes_per_file
            );
        }
        let _ = writeln!(
            o,
            "\nTime by phase, ms (write / read): encrypt, hash/MAC, randomness test or \
             compression, tree, root update, store wait, other; and wall time.\n"
        );
        let _ = writeln!(
            o,
            "| scheme | encrypt | hash/MAC | rand/compress | tree | root | store wait | other | wall |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for x in &s.results {
            let (w, rd) = (x.write_time.to_array(), x.read_time.to_array());
            let cells: Vec<String> = (0..w.len())
                .map(|k| format!("{} / {}", ms(w[k]), ms(rd[k])))
                .collect();
            let _ = writeln!(
                o,
                "| {} | {} | {:.0} / {:.0} |",
                x.scheme,
                cells.join(" | "),
                x.write_secs * 1e3,
                x.read_secs * 1e3
            );
        }
        let find = |n: &str| s.results.iter().find(|x| x.scheme == n);
        let mt = find("mt-eint");
        let none = find("none");
        let _ = writeln!(
            o,
            "\nRatios: integrity bandwidth against mt-eint; throughput against `none` \
             (encryption only).\n"
        );
        let _ = writeln!(
            o,
            "| scheme | IB read vs mt-eint | IB write vs mt-eint | hash/MAC time vs mt-eint (w / r) | write vs none | read vs none |"
        );
        let _ = writeln!(o, "|---|---|---|---|---:|---:|");
        for x in &s.results {
            let (ibr, ibw, hm) = match mt {
                Some(m) => (
                    rel(x.read_bandwidth, m.read_bandwidth),
                    rel(x.write_bandwidth, m.write_bandwidth),
                    format!(
                        "{} / {}",
                        rel(
                            x.write_time.hash_mac_ns as f64,
                            m.write_time.hash_mac_ns as f64
                        ),
                        rel(
                            x.read_time.hash_mac_ns as f64,
                            m.read_time.hash_mac_ns as f64
                        )
                    ),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let (tw, tr) = match none {
                Some(n) => (
                    format!("{:.2}", x.write_mb_s / n.write_mb_s),
                    format!("{:.2}", x.read_mb_s / n.read_mb_s),
                ),
                None => ("-".into(), "-".into()),
            };
            let _ = writeln!(o, "| {} | {ibr} | {ibw} | {hm} | {tw} | {tr} |", x.scheme);
        }
        if let Some(m) = mt {
            let _ = writeln!(o);
            // Oprea–Reiter 2007 §6: integrity bandwidth of RAND-EINT / COMP-EINT against
            // MT-EINT, 92.93× / 58.25× lower on low-entropy files, 30.15 % / 10.22 % lower
            // (÷1.43 / ÷1.11) on high-entropy files.
            let paper = match s.set.as_str() {
                "low" => "paper, low-entropy files: > 20 (RAND-EINT 92.9, COMP-EINT 58.3)",
                "high" => "paper, high-entropy files: RAND-EINT 1.43, COMP-EINT 1.11",
                _ => "no paper figure for this set",
            };
            for n in ["rand-eint", "comp-eint", "comp-eint-zstd"] {
                if let Some(x) = find(n) {
                    let f = |a: f64, b: f64| {
                        if b == 0.0 {
                            "∞ (0 B/block)".to_string()
                        } else {
                            format!("{:.2}", a / b)
                        }
                    };
                    let _ = writeln!(
                        o,
                        "- Oprea–Reiter: integrity bandwidth mt-eint ÷ {n} = {} (read), {} \
                         (write) [{paper}].",
                        f(m.read_bandwidth, x.read_bandwidth),
                        f(m.write_bandwidth, x.write_bandwidth)
                    );
                }
            }
            if let Some(x) = find("mac-tree") {
                // Against mt-eint (GCM: the leaf is the block's tag, so its "hash" is inside
                // the encryption) and mt-eint-cbc (a separate keyed leaf hash per block).
                for base in [Some(m), find("mt-eint-cbc")].into_iter().flatten() {
                    let q = |a: f64, b: f64| if b == 0.0 { f64::NAN } else { a / b };
                    let hw = q(
                        x.write_time.hash_mac_ns as f64,
                        base.write_time.hash_mac_ns as f64,
                    );
                    let hr = q(
                        x.read_time.hash_mac_ns as f64,
                        base.read_time.hash_mac_ns as f64,
                    );
                    let br = q(x.read_bandwidth, base.read_bandwidth);
                    let bw = q(x.write_bandwidth, base.write_bandwidth);
                    let holds = [hw, hr, br, bw].iter().all(|v| *v <= 0.5);
                    let _ = writeln!(
                        o,
                        "- Yun–Shi–Kim (MAC tree ≤ ½ of a Merkle tree's authentication cost): \
                         mac-tree / {} hash+MAC time {hw:.2} (write), {hr:.2} (read); integrity \
                         bandwidth {br:.2} (read), {bw:.2} (write): {}.",
                        base.scheme,
                        if holds {
                            "holds"
                        } else {
                            "does not hold on every measure"
                        }
                    );
                }
            }
        }
    }
    o
}
