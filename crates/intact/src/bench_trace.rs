//! `intact bench traces`: Oprea and Reiter's trace experiment (USENIX Security 2007 §7.2,
//! Fig. 10 of the excerpt; the 2006 report §6, Figs. 16 and 17), rerun on the engine.
//!
//! Each trace ([`crate::trace`]: the three synthetic Harvard traces, or a real one) is
//! replayed on a fresh volume per scheme and per block content (all low-entropy, all
//! high-entropy, half and half), with the papers' 1 KiB node cache. For each run: the time
//! to replay and seal, the integrity bandwidth (bytes of `US_F` read or written per block
//! accessed) and the untrusted storage for integrity, each also relative to MT-EINT as
//! Fig. 10 plots them. Every read is checked against what the trace wrote. Then the
//! trusted storage that counter intervals need per file (2006 Fig. 17): how many files
//! would keep their intervals in untrusted storage at each size of TS_F.

use crate::bench::{TempDir, PW};
use crate::trace::{self, Op, Profile, Rng, Trace};
use anyhow::{bail, Context, Result};
use clap::Args;
use intact_core::crypto::KdfParams;
use intact_core::format::SchemeId;
use intact_core::store::{LocalDirStore, LocalStateDir, TrustedStore, UntrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `intact bench traces`.
#[derive(Debug, Args)]
pub struct TracesArgs {
    /// Comma-separated synthetic traces to run: LAIR, DEASNA, HOME02 [default: all three;
    /// none when --trace is given].
    #[arg(long, value_delimiter = ',')]
    profiles: Vec<String>,
    /// Multiply the synthetic traces' files, writes and reads by this (quick runs).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Seed of the synthetic traces.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A real trace to replay as well (see --format).
    #[arg(long, value_name = "FILE")]
    trace: Vec<PathBuf>,
    /// Format of --trace files: `nfsdump` (the Harvard traces' text) or `fio` (fio's
    /// write_iolog, version 2 or 3).
    #[arg(long, default_value = "nfsdump", value_parser = ["nfsdump", "fio"])]
    format: String,
    /// Comma-separated schemes [default: mt-eint, rand-eint, comp-eint, as in Fig. 10].
    #[arg(long, value_delimiter = ',')]
    schemes: Vec<String>,
    /// Block contents: comma-separated from low, high, half [default: all three].
    #[arg(long, value_delimiter = ',')]
    contents: Vec<String>,
    /// Where the temporary volumes go.
    #[arg(long, default_value = "/var/tmp")]
    workdir: PathBuf,
    /// Replays of each trace, scheme and content, alternating (times are given as the
    /// range over them).
    #[arg(long, default_value_t = 3)]
    runs: u32,
}

impl TracesArgs {
    /// The three synthetic traces at `scale`, `runs` replays each, under every scheme and
    /// content of Fig. 10 (as `intact bench oprea-reiter` runs them).
    pub fn quick(scale: f64, runs: u32, workdir: PathBuf) -> TracesArgs {
        TracesArgs {
            profiles: Vec::new(),
            scale,
            seed: 1,
            trace: Vec::new(),
            format: "nfsdump".into(),
            schemes: Vec::new(),
            contents: Vec::new(),
            workdir,
            runs,
        }
    }
}

/// What a replay writes into blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Content {
    /// Text-like bytes (words from a small vocabulary): low entropy.
    Low,
    /// Bytes that look random.
    High,
    /// Each block version low or high by a fair coin.
    Half,
}

impl Content {
    fn parse(s: &str) -> Result<Content> {
        Ok(match s.trim() {
            "low" => Content::Low,
            "high" => Content::High,
            "half" => Content::Half,
            other => bail!("unknown content {other:?} (low, high or half)"),
        })
    }
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Content::Low => "low",
            Content::High => "high",
            Content::Half => "half",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Content::Low => "0 % high-entropy",
            Content::High => "100 % high-entropy",
            Content::Half => "50 % high-entropy",
        }
    }
}

const WORDS: [&str; 32] = [
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were",
];

/// The bytes of version `version` of `block` of `file` under `content`: the same for the
/// same arguments, so that a read can be checked without keeping what was written.
pub fn fill(content: Content, file: u32, block: u64, version: u32, out: &mut [u8]) {
    let seed = (u64::from(file) << 40) ^ (block << 8) ^ u64::from(version).rotate_left(52);
    let mut rng = Rng::new(seed ^ 0x6a09_e667_f3bc_c908);
    let high = match content {
        Content::Low => false,
        Content::High => true,
        Content::Half => rng.next() & 1 == 1,
    };
    if high {
        for c in out.chunks_mut(8) {
            let v = rng.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    } else {
        let mut k = 0;
        while k < out.len() {
            let w = WORDS[(rng.next() % 32) as usize].as_bytes();
            for &b in w.iter().chain(b" ") {
                if k < out.len() {
                    out[k] = b;
                    k += 1;
                }
            }
        }
    }
}

/// One replay: a trace on one scheme with one content.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub trace: String,
    pub scheme: String,
    pub content: Content,
    /// Replay and final seal, seconds: one per run (the other fields are the same in
    /// every run, the replay being deterministic).
    pub secs: Vec<f64>,
    pub blocks_written: u64,
    pub blocks_read: u64,
    /// `US_F` bytes read or written per block accessed.
    pub integrity_bandwidth: f64,
    /// `US_F` bytes of the trace's files (`.m`, `.c`, in-block overhead).
    pub integrity_bytes: u64,
    /// TS_F bytes in use, per file.
    pub trusted_bytes_per_file: f64,
    /// Counter intervals of every file at the end (schemes with counter intervals).
    pub intervals: Vec<u64>,
}

/// Replays `t` on a fresh volume under `scheme` with `content` blocks.
pub fn replay(
    t: &Trace,
    scheme: SchemeId,
    content: Content,
    cache_bytes: usize,
    workdir: &std::path::Path,
    bs: u32,
) -> Result<Run> {
    let tmp = TempDir::new(workdir, &format!("trace-{}", scheme.name()))?;
    let cipher = tmp.0.join("cipher");
    let state = tmp.0.join("state");
    std::fs::create_dir_all(&cipher)?;
    let store: Arc<dyn UntrustedStore> = Arc::new(LocalDirStore::open(&cipher)?);
    let vol = Volume::create(
        store,
        |id| Ok(Box::new(LocalStateDir::new(state.clone(), id)?) as Box<dyn TrustedStore>),
        PW,
        &CreateOptions {
            block_size: bs,
            scheme,
            kdf: KdfParams::TEST,
            // The paper's metrics are those of the scheme's blocks and trees: no file's
            // data in the inode table's slots.
            inline_data: false,
            // The counters as the paper keeps them (Fig. 6): the arrays whole.
            ctr_segments: false,
            twin_blocks: false,
            leaf_log: false,
            log_delta: false,
            ..CreateOptions::default()
        },
        &Options {
            cache_bytes,
            // Every file's record stays resident, so that its measured counts (kept with
            // the record) cover the whole replay.
            records: t.files as usize + 1024,
            ..Options::default()
        },
    )?;
    let mut rp = Replayer {
        vol: &vol,
        content,
        bs: bs as usize,
        inos: HashMap::new(),
        dirs: std::collections::HashSet::new(),
        versions: HashMap::new(),
        buf: Vec::new(),
        want: vec![0u8; bs as usize],
    };
    for op in t.preexisting() {
        rp.apply(&op)?;
    }
    vol.sync()?;
    let before: HashMap<u32, (u64, u64, u64, u64)> = rp
        .inos
        .keys()
        .map(|&f| {
            let m = vol.file_integrity(&file_path(f))?.measured;
            Ok((
                f,
                (
                    m.blocks_written,
                    m.blocks_read,
                    m.integrity.read_bytes,
                    m.integrity.write_bytes,
                ),
            ))
        })
        .collect::<Result<_>>()?;
    let t0 = Instant::now();
    for op in &t.ops {
        rp.apply(op)?;
    }
    vol.sync()?;
    let secs = t0.elapsed().as_secs_f64();
    let mut r = Run {
        trace: t.name.clone(),
        scheme: scheme.name().to_string(),
        content,
        secs: vec![secs],
        blocks_written: 0,
        blocks_read: 0,
        integrity_bandwidth: 0.0,
        integrity_bytes: 0,
        trusted_bytes_per_file: 0.0,
        intervals: Vec::new(),
    };
    let (mut us, mut trusted) = (0u64, 0u64);
    let mut files: Vec<u32> = rp.inos.keys().copied().collect();
    files.sort_unstable();
    for f in &files {
        let p = file_path(*f);
        let fi = vol.file_integrity(&p)?;
        let m = fi.measured;
        let b = before.get(f).copied().unwrap_or_default();
        let now = (
            m.blocks_written,
            m.blocks_read,
            m.integrity.read_bytes,
            m.integrity.write_bytes,
        );
        if now.0 < b.0 || now.1 < b.1 || now.2 < b.2 || now.3 < b.3 {
            bail!("{p}: its measured counts went back (its record was dropped)");
        }
        r.blocks_written += now.0 - b.0;
        r.blocks_read += now.1 - b.1;
        us += (now.2 - b.2) + (now.3 - b.3);
        r.integrity_bytes += fi.integrity_bytes;
        trusted += fi.trusted_bytes;
        if scheme.uses_counter_intervals() {
            r.intervals.push(vol.stat(&p)?.counter_intervals);
        }
    }
    r.intervals.sort_unstable();
    let accessed = r.blocks_written + r.blocks_read;
    r.integrity_bandwidth = if accessed == 0 {
        0.0
    } else {
        us as f64 / accessed as f64
    };
    r.trusted_bytes_per_file = trusted as f64 / files.len().max(1) as f64;
    vol.set_seal_on_drop(false);
    Ok(r)
}

/// Where a replay keeps file `f` of a trace (256 files a directory).
fn file_path(f: u32) -> String {
    format!("/d{:03}/f{f:06}", f / 256)
}

/// A replay in progress: the trace's files so far, and each block's version (how many
/// times the trace wrote it), from which [`fill`] gives its expected bytes.
struct Replayer<'a> {
    vol: &'a Volume,
    content: Content,
    bs: usize,
    inos: HashMap<u32, u64>,
    dirs: std::collections::HashSet<u32>,
    versions: HashMap<(u32, u64), u32>,
    buf: Vec<u8>,
    want: Vec<u8>,
}

impl Replayer<'_> {
    /// Runs one request; a read is checked against what the trace wrote.
    fn apply(&mut self, op: &Op) -> Result<()> {
        let ino = match self.inos.get(&op.file) {
            Some(&i) => i,
            None => {
                if self.dirs.insert(op.file / 256) {
                    self.vol.mkdir(&format!("/d{:03}", op.file / 256))?;
                }
                let i = self.vol.create_file(&file_path(op.file), None)?;
                self.inos.insert(op.file, i);
                i
            }
        };
        let bs = self.bs;
        let len = op.blocks as usize * bs;
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        let buf = &mut self.buf[..len];
        let off = op.block * bs as u64;
        if op.write {
            for (k, b) in buf.chunks_mut(bs).enumerate() {
                let v = self
                    .versions
                    .entry((op.file, op.block + k as u64))
                    .or_default();
                *v += 1;
                fill(self.content, op.file, op.block + k as u64, *v, b);
            }
            self.vol.write_ino(ino, off, buf)?;
        } else {
            let n = self.vol.read_ino(ino, off, buf)?;
            if n < len {
                bail!(
                    "file {} block {}: read {n} of {len} bytes",
                    op.file,
                    op.block
                );
            }
            for (k, b) in buf.chunks(bs).enumerate() {
                let block = op.block + k as u64;
                let v = self.versions.get(&(op.file, block)).copied().unwrap_or(0);
                fill(self.content, op.file, block, v, &mut self.want);
                if v == 0 || b != self.want.as_slice() {
                    bail!("file {} block {block}: read back other bytes", op.file);
                }
            }
        }
        Ok(())
    }
}

/// Files whose counter intervals would not fit in `ts` bytes of trusted storage (16 bytes
/// an interval: its first block and its counter, u64 each, as file-format.md §4.1 keeps
/// them, after the form's 13-byte header).
pub fn spilled_at(intervals: &[u64], ts: u64) -> usize {
    let fit = ts.saturating_sub(13) / 16;
    intervals.iter().filter(|&&k| k > fit).count()
}

/// The trusted-storage sizes of the Fig. 17 table, in bytes.
pub const TS_SIZES: [u64; 8] = [29, 61, 125, 200, 253, 509, 1021, 4093];

/// One trace's replays.
#[derive(Serialize)]
pub struct TraceReport {
    pub name: String,
    pub counts: trace::Counts,
    /// Table 3's counts, for the synthetic traces.
    pub published: Option<trace::Counts>,
    pub preexisting_blocks: u64,
    pub runs: Vec<Run>,
    /// Counter intervals per file computed from the trace itself.
    pub trace_intervals: Vec<u64>,
}

/// What `intact bench traces` measured.
#[derive(Serialize)]
pub struct Report {
    pub command: String,
    pub release_build: bool,
    pub cache_bytes: usize,
    pub block_size: u32,
    pub traces: Vec<TraceReport>,
}

fn rel(x: f64, base: f64) -> String {
    if base == 0.0 {
        return if x == 0.0 { "=".into() } else { "n/a".into() };
    }
    format!("{:+.1} %", 100.0 * (x / base - 1.0))
}

/// `v`'s range as `show` writes its ends ("a" when they agree, else "a to b").
fn span(v: &[f64], show: impl Fn(f64) -> String) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.is_empty() {
        return "n/a".into();
    }
    let (a, b) = (show(lo), show(hi));
    if a == b {
        a
    } else {
        format!("{a} to {b}")
    }
}

/// Runs `intact bench traces`.
pub fn traces(a: &TracesArgs, cache_bytes: usize, json: bool) -> Result<()> {
    let report = run(a, cache_bytes)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

/// The schemes named on the command line, or Oprea and Reiter's three (MT-EINT, RAND-EINT,
/// COMP-EINT, as in their Fig. 10) when none is.
pub fn fig10_schemes(names: &[String]) -> Result<Vec<SchemeId>> {
    if names.is_empty() {
        return Ok(vec![
            SchemeId::MtEintGcm,
            SchemeId::RandEint,
            SchemeId::CompEint,
        ]);
    }
    Ok(names
        .iter()
        .map(|s| SchemeId::parse(s.trim()))
        .collect::<Result<_, _>>()?)
}

/// Replays the traces `a` names; the report.
pub fn run(a: &TracesArgs, cache_bytes: usize) -> Result<Report> {
    const BS: u32 = 4096;
    if !(a.scale > 0.0 && a.scale <= 1.0) {
        bail!("--scale must be in (0, 1]");
    }
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let schemes = fig10_schemes(&a.schemes)?;
    let contents: Vec<Content> = if a.contents.is_empty() {
        vec![Content::Low, Content::High, Content::Half]
    } else {
        a.contents
            .iter()
            .map(|c| Content::parse(c))
            .collect::<Result<_>>()?
    };
    let mut traces: Vec<(Trace, Option<Profile>)> = Vec::new();
    let names: Vec<String> = if a.profiles.is_empty() && a.trace.is_empty() {
        trace::PROFILES.iter().map(|p| p.name.to_string()).collect()
    } else {
        a.profiles.clone()
    };
    for n in &names {
        let p = trace::PROFILES
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(n.trim()))
            .with_context(|| format!("unknown trace {n:?} (LAIR, DEASNA or HOME02)"))?;
        let scaled = p.scaled(a.scale);
        traces.push((scaled.generate(a.seed), Some(scaled)));
    }
    for f in &a.trace {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let name = f.display().to_string();
        let t = match a.format.as_str() {
            "fio" => trace::parse_fio_iolog(&text, &name, u64::from(BS))?,
            _ => trace::parse_nfsdump(&text, &name, u64::from(BS))?,
        };
        if t.ops.is_empty() {
            bail!("{name}: no reads or writes");
        }
        traces.push((t, None));
    }
    std::fs::create_dir_all(&a.workdir)?;
    let mut reports = Vec::new();
    let pb = crate::bench::steps(
        (traces.len() * a.runs as usize * contents.len() * schemes.len()) as u64,
        "bench traces",
    );
    for (t, p) in &traces {
        let counts = t.counts();
        crate::bench::log(
            &pb,
            &format!(
                "trace {}: {} files, {} block writes, {} block reads",
                t.name, counts.files, counts.writes, counts.reads
            ),
        );
        let mut runs: Vec<Run> = Vec::new();
        for k in 0..a.runs {
            for &c in &contents {
                for &s in &schemes {
                    let r = replay(t, s, c, cache_bytes, &a.workdir, BS)?;
                    pb.inc(1);
                    crate::bench::log(
                        &pb,
                        &format!(
                            "  run {k}: {:<5} {:<12} {:>8.2} s  IB {:>7.2} B/block  US {:>11} B  (every read checked)",
                            c.name(),
                            r.scheme,
                            r.secs[0],
                            r.integrity_bandwidth,
                            r.integrity_bytes
                        ),
                    );
                    match runs
                        .iter_mut()
                        .find(|x| x.content == c && x.scheme == r.scheme)
                    {
                        Some(x) => x.secs.extend(r.secs),
                        None => runs.push(r),
                    }
                }
            }
        }
        reports.push(TraceReport {
            name: t.name.clone(),
            counts,
            published: p.map(|p| trace::Counts {
                files: p.files,
                writes: p.writes,
                reads: p.reads,
            }),
            preexisting_blocks: t.preexisting().iter().map(|o| u64::from(o.blocks)).sum(),
            runs,
            trace_intervals: t.counter_intervals(),
        });
    }
    pb.finish_and_clear();
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        release_build: !cfg!(debug_assertions),
        cache_bytes,
        block_size: BS,
        traces: reports,
    };
    Ok(report)
}

/// The report as Markdown.
pub fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "# intact bench traces\n");
    let _ = writeln!(o, "- command: `{}`", r.command);
    let _ = writeln!(
        o,
        "- {} build; {}-byte blocks; {}-byte node cache (the papers' 1 KiB); every read checked",
        if r.release_build { "release" } else { "DEBUG" },
        r.block_size,
        r.cache_bytes
    );
    for t in &r.traces {
        let _ = writeln!(o, "\n## {}\n", t.name);
        let _ = write!(
            o,
            "{} files, {} block writes, {} block reads",
            t.counts.files, t.counts.writes, t.counts.reads
        );
        if let Some(p) = t.published {
            let _ = write!(
                o,
                " (Table 3, scaled: {} / {} / {})",
                p.files, p.writes, p.reads
            );
        }
        if t.preexisting_blocks > 0 {
            let _ = write!(
                o,
                "; {} blocks read before the trace writes them were written first, untimed",
                t.preexisting_blocks
            );
        }
        let _ = writeln!(o, ".\n");
        let _ = writeln!(
            o,
            "| content | scheme | time s | vs MT-EINT | IB B/block | vs MT-EINT | US_F bytes | vs MT-EINT | TS_F B/file |"
        );
        let _ = writeln!(o, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
        for run in &t.runs {
            let base = t
                .runs
                .iter()
                .find(|b| b.content == run.content && b.scheme == SchemeId::MtEintGcm.name());
            let (bt, bi, bu) = base.map_or((&[][..], 0.0, 0.0), |b| {
                (&b.secs[..], b.integrity_bandwidth, b.integrity_bytes as f64)
            });
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {:.2} | {} | {} | {} | {:.1} |",
                run.content.label(),
                run.scheme,
                span(&run.secs, |x| format!("{x:.2}")),
                span(
                    &run.secs
                        .iter()
                        .zip(bt)
                        .map(|(x, b)| x / b)
                        .collect::<Vec<_>>(),
                    |r| format!("{:+.0} %", 100.0 * (r - 1.0))
                ),
                run.integrity_bandwidth,
                rel(run.integrity_bandwidth, bi),
                run.integrity_bytes,
                rel(run.integrity_bytes as f64, bu),
                run.trusted_bytes_per_file
            );
        }
        let iv = &t.trace_intervals;
        if !iv.is_empty() {
            let _ = writeln!(
                o,
                "\nCounter intervals per file (2006 Fig. 5, from the trace): median {}, 90th \
                 percentile {}, max {}; files with at least 10 / 100 / 1000: {} / {} / {}.\n",
                iv[iv.len() / 2],
                iv[iv.len() * 9 / 10],
                iv[iv.len() - 1],
                iv.iter().filter(|&&k| k >= 10).count(),
                iv.iter().filter(|&&k| k >= 100).count(),
                iv.iter().filter(|&&k| k >= 1000).count()
            );
            let _ = writeln!(
                o,
                "Files whose intervals do not fit in TS_F of a given size (2006 Fig. 17; 13 \
                 bytes of header, 16 an interval; intact keeps 125 bytes, 7 intervals):\n"
            );
            let _ = writeln!(
                o,
                "| TS_F bytes | {} |",
                TS_SIZES.map(|s| s.to_string()).join(" | ")
            );
            let _ = writeln!(o, "|---|{}", "---:|".repeat(TS_SIZES.len()));
            let _ = writeln!(
                o,
                "| files spilled (of {}) | {} |",
                iv.len(),
                TS_SIZES.map(|s| spilled_at(iv, s).to_string()).join(" | ")
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Low blocks are words, high blocks look random, half mixes them, and the bytes are a
    /// function of (file, block, version).
    #[test]
    fn contents_are_repeatable_and_of_their_entropy() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        fill(Content::Low, 1, 2, 3, &mut a);
        assert!(a.iter().all(|c| c.is_ascii_lowercase() || *c == b' '));
        fill(Content::Low, 1, 2, 3, &mut b);
        assert_eq!(a, b);
        fill(Content::Low, 1, 2, 4, &mut b);
        assert_ne!(a, b);
        fill(Content::High, 1, 2, 3, &mut a);
        let distinct = a.iter().collect::<std::collections::BTreeSet<_>>().len();
        assert!(distinct > 200, "{distinct}");
        let high = (0..200)
            .filter(|&v| {
                fill(Content::Half, 9, 9, v, &mut a);
                !a.iter().all(|c| c.is_ascii_lowercase() || *c == b' ')
            })
            .count();
        assert!((70..130).contains(&high), "{high} of 200 high");
    }

    #[test]
    fn spilled_files_by_hand() {
        let iv = [1, 1, 7, 8, 12, 40];
        assert_eq!(spilled_at(&iv, 125), 3); // 7 intervals fit
        assert_eq!(spilled_at(&iv, 124), 4); // 6 fit
        assert_eq!(spilled_at(&iv, 13), 6);
        assert_eq!(spilled_at(&iv, 0), 6);
        assert_eq!(spilled_at(&iv, 653), 0); // 40 fit
    }

    /// A small trace replayed under each scheme of Fig. 10: every block written, read back
    /// and checked; a scheme with counter intervals reports them per file.
    #[test]
    fn a_small_trace_replays_under_each_scheme() {
        let dir = tempfile::tempdir().unwrap();
        let t = trace::PROFILES[2].scaled(0.005).generate(5);
        let c = t.counts();
        for s in [
            SchemeId::MtEintGcm,
            SchemeId::RandEint,
            SchemeId::CompEint,
            SchemeId::MacTree,
        ] {
            for content in [Content::Low, Content::Half] {
                let r = replay(&t, s, content, 1024, dir.path(), 4096).unwrap();
                // Blocks rewritten while still in memory reach the scheme once.
                assert!((1..=c.writes).contains(&r.blocks_written), "{s:?}");
                assert!(r.blocks_read <= c.reads, "{s:?}");
                assert_eq!(
                    r.intervals.len() as u64,
                    if s.uses_counter_intervals() {
                        c.files
                    } else {
                        0
                    }
                );
            }
        }
    }
}
