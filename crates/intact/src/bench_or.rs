//! `intact bench oprea-reiter`: Oprea and Reiter's file experiments, rerun here, beside
//! their published numbers (the 2006 report §6, Tables 2, 3 and 5, Figs. 12 and 13; the
//! 2007 paper §7.1, Figs. 7 to 9 of the excerpt), then their trace experiment
//! (`intact bench traces`).
//!
//! Five corpora are gathered from this machine as in their §6: text files, object files
//! (libraries), executables, images and compressed files. For each: its statistics
//! (Table 2), the fraction of blocks the entropy test finds random-looking at every block
//! size from 128 to 4096 bytes (Table 3), and every scheme asked for (MT-EINT, RAND-EINT
//! and COMP-EINT by default) writing the corpus and reading it back (after a reopen, every
//! byte checked) at each node-cache size with 4 KiB blocks (Figs. 8 and 9) and at each
//! block size with the papers' 1 KiB cache (Figs. 12 and 13): write and read time,
//! integrity bandwidth, untrusted storage for integrity, and the time by phase (Fig. 7).

use crate::bench::{gather, run_scheme, DataSet, RunParams, SchemeResult};
use anyhow::{bail, Result};
use clap::Args;
use intact_core::format::SchemeId;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Arguments of `intact bench oprea-reiter`.
#[derive(Debug, Args)]
pub struct OpreaReiterArgs {
    /// At most this many MiB per corpus.
    #[arg(long, default_value_t = 32)]
    mb: u64,
    /// Node-cache sizes of the cache sweep, bytes (4 KiB blocks).
    #[arg(long, value_delimiter = ',', default_value = "0,1024,2048,4096,65536")]
    caches: Vec<usize>,
    /// Block sizes of the block sweep (with a 1 KiB cache).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "128,256,512,1024,2048,4096"
    )]
    block_sizes: Vec<u32>,
    /// Comma-separated schemes [default: mt-eint, rand-eint, comp-eint].
    #[arg(long, value_delimiter = ',')]
    schemes: Vec<String>,
    /// Scale of the trace experiment's synthetic traces (0: skip it).
    #[arg(long, default_value_t = 1.0)]
    traces_scale: f64,
    /// A small run (at most 4 MiB per corpus, caches 0, 1 KiB, 4 KiB, blocks 512 and 4096,
    /// traces at 2 % at most, one replay each) that shows every table in a few minutes.
    #[arg(long)]
    quick: bool,
    /// Where the temporary volumes go (on disk).
    #[arg(long, default_value = "/var/tmp")]
    workdir: PathBuf,
    /// Do not drop the page cache between writing and reading back, even as root.
    #[arg(long)]
    no_drop_caches: bool,
}

/// The corpora of §6, in the papers' order.
pub const CORPORA: [&str; 5] = ["text", "object", "executable", "image", "compressed"];

/// Table 2 of the 2006 report: total MB, files, min, max, average file size (bytes).
const TABLE_2: [(f64, u64, f64, f64, f64); 5] = [
    (245.0, 808, 27.0, 34.94e6, 307.11e3),
    (217.0, 28, 15.0, 92.66e6, 7.71e6),
    (341.0, 3029, 24.0, 13.21e6, 112.84e3),
    (189.0, 641, 17.0, 2.24e6, 198.4e3),
    (249.0, 2, 80.44e6, 167.65e6, 124.05e6),
];

/// Table 3 of the 2006 report: fraction of random-looking blocks at 128 .. 4096 bytes.
pub const TABLE_3: [[f64; 6]; 5] = [
    [0.1075, 0.087, 0.0652, 0.0524, 0.0409, 0.0351],
    [0.0003, 0.0002, 0.0002, 0.0002, 0.0002, 0.0001],
    [0.003, 0.0019, 0.0015, 0.0013, 0.0011, 0.0009],
    [0.9421, 0.9277, 0.8794, 0.788, 0.6176, 0.502],
    [0.936, 0.8936, 0.8481, 0.8292, 0.7915, 0.7812],
];

/// Table 5 of the 2006 report: average integrity bandwidth per block (bytes) at 4 KiB
/// blocks, per corpus, for AES-Merkle (MT-EINT), CMC-Entropy (RAND-EINT) and
/// AES-Compression (COMP-EINT).
const TABLE_5_IB: [(SchemeId, [f64; 5]); 3] = [
    (
        SchemeId::MtEintGcm,
        [132.86, 204.38, 111.22, 106.42, 227.09],
    ),
    (SchemeId::RandEint, [4.71, 0.16, 0.52, 60.74, 211.08]),
    (SchemeId::CompEint, [9.93, 3.01, 3.66, 113.26, 229.44]),
];

const BLOCKS: [u32; 6] = [128, 256, 512, 1024, 2048, 4096];

fn is_elf(d: &[u8]) -> bool {
    d.starts_with(b"\x7fELF")
}

/// Gathers corpus `name` (one of [`CORPORA`]) from this machine, up to `cap` bytes.
pub fn corpus(name: &str, cap: u64) -> DataSet {
    let p = |s: &str| PathBuf::from(s);
    let ext = |path: &Path| crate::bench::ext_of(path);
    match name {
        "text" => gather(
            name,
            &[
                p("/usr/share/doc"),
                p("/usr/include"),
                p("/usr/share/perl"),
                p("/usr/lib/python3"),
            ],
            cap,
            &|path, d| {
                let e = ext(path);
                (e == "pdf" || e == "ps")
                    || ([
                        "txt", "tex", "c", "h", "cpp", "java", "py", "pl", "pm", "md", "rs",
                    ]
                    .contains(&e.as_str())
                        && !d.contains(&0))
            },
        ),
        "object" => gather(
            name,
            &[
                p("/usr/lib/x86_64-linux-gnu"),
                p("/usr/lib"),
                p("/usr/local/lib"),
            ],
            cap,
            &|path, d| {
                let n = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                (n.contains(".so") && is_elf(d))
                    || ((ext(path) == "a" || ext(path) == "o")
                        && (d.starts_with(b"!<arch>") || is_elf(d)))
            },
        ),
        "executable" => gather(
            name,
            &[p("/usr/local/bin"), p("/usr/bin"), p("/usr/sbin")],
            cap,
            &|_, d| is_elf(d),
        ),
        "image" => gather(name, &[p("/usr/share"), p("/usr/lib")], cap, &|path, _| {
            ["jpg", "jpeg", "png", "gif"].contains(&ext(path).as_str())
        }),
        _ => {
            let mut roots = vec![p("/usr/share"), p("/usr/lib")];
            if let Some(h) = std::env::var_os("CARGO_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
            {
                roots.push(h.join("registry/cache"));
            }
            gather("compressed", &roots, cap, &|path, _| {
                ["gz", "tgz", "xz", "bz2", "zst", "crate"].contains(&ext(path).as_str())
            })
        }
    }
}

/// Table 2's statistics of a corpus.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Stats {
    pub files: u64,
    pub bytes: u64,
    pub min: u64,
    pub max: u64,
    pub avg: f64,
}

pub fn stats(set: &DataSet) -> Stats {
    let sizes: Vec<u64> = set.files.iter().map(|f| f.data.len() as u64).collect();
    let bytes = sizes.iter().sum();
    Stats {
        files: sizes.len() as u64,
        bytes,
        min: sizes.iter().copied().min().unwrap_or(0),
        max: sizes.iter().copied().max().unwrap_or(0),
        avg: bytes as f64 / sizes.len().max(1) as f64,
    }
}

/// The fraction of the corpus's whole `bs`-byte blocks that the entropy test finds
/// random-looking (Table 3). A file's shorter last block is left out: the test calls every
/// block under 128 bytes random-looking, which would count tails, not contents.
pub fn random_fraction(set: &DataSet, bs: usize) -> f64 {
    let (mut rand, mut all) = (0u64, 0u64);
    for f in &set.files {
        for b in f.data.chunks_exact(bs) {
            all += 1;
            rand += u64::from(intact_core::entropy::is_rand(b));
        }
    }
    if all == 0 {
        0.0
    } else {
        rand as f64 / all as f64
    }
}

/// One scheme on one corpus at one cache size and block size.
#[derive(Serialize, Clone)]
pub struct Point {
    pub corpus: String,
    pub scheme: String,
    pub block_size: u32,
    pub cache_bytes: usize,
    /// The first run's measurements (the integrity counts are the same in every run).
    pub result: SchemeResult,
    /// Write and read seconds of every run.
    pub write_secs: Vec<f64>,
    pub read_secs: Vec<f64>,
}

impl Point {
    /// `US_F` bytes read and written per block accessed, writing and reading together.
    pub fn bandwidth(&self) -> f64 {
        let r = &self.result;
        let blocks = r.blocks_written + r.blocks_read;
        if blocks == 0 {
            0.0
        } else {
            (r.us_written + r.us_read_while_writing + r.us_read) as f64 / blocks as f64
        }
    }
}

/// One corpus: where it came from, its statistics, its random-looking blocks.
#[derive(Serialize)]
pub struct CorpusReport {
    pub name: String,
    pub roots: Vec<crate::bench::RootSummary>,
    pub stats: Stats,
    pub random_fraction: Vec<(u32, f64)>,
}

/// What the file experiments measured.
#[derive(Serialize)]
pub struct Report {
    pub command: String,
    pub machine: String,
    pub release_build: bool,
    pub mb: u64,
    pub page_cache_dropped: bool,
    pub corpora: Vec<CorpusReport>,
    pub cache_sweep: Vec<Point>,
    pub block_sweep: Vec<Point>,
}

impl OpreaReiterArgs {
    /// The arguments `intact bench report` runs the section with: the defaults, or the
    /// quick run; `mb` caps the corpora further.
    pub fn for_report(quick: bool, mb: Option<u64>, workdir: PathBuf) -> OpreaReiterArgs {
        OpreaReiterArgs {
            mb: mb.unwrap_or(32),
            caches: vec![0, 1024, 2048, 4096, 65536],
            block_sizes: BLOCKS.to_vec(),
            schemes: Vec::new(),
            traces_scale: 1.0,
            quick,
            workdir,
            no_drop_caches: false,
        }
    }
}

/// Runs `intact bench oprea-reiter`.
pub fn oprea_reiter(a: &OpreaReiterArgs, json: bool) -> Result<()> {
    let (report, traces) = run(a)?;
    if json {
        let both = serde_json::json!({ "files": report, "traces": traces });
        println!("{}", serde_json::to_string_pretty(&both)?);
    } else {
        print!("{}", markdown(&report));
        if let Some(t) = &traces {
            print!("\n{}", crate::bench_trace::markdown(t));
        }
    }
    Ok(())
}

/// Runs the file experiments, then the trace experiment unless its scale is 0.
pub fn run(a: &OpreaReiterArgs) -> Result<(Report, Option<crate::bench_trace::Report>)> {
    let (mb, caches, blocks, traces_scale, runs) = if a.quick {
        (
            a.mb.min(4),
            vec![0, 1024, 4096],
            vec![512, 4096],
            a.traces_scale.min(0.02),
            1,
        )
    } else {
        (
            a.mb,
            a.caches.clone(),
            a.block_sizes.clone(),
            a.traces_scale,
            3,
        )
    };
    if mb == 0 {
        bail!("--mb must be at least 1");
    }
    for &b in &blocks {
        if !b.is_power_of_two() || !(128..=65536).contains(&b) {
            bail!("block size {b}: a power of two from 128 to 65536");
        }
    }
    let schemes = crate::bench_trace::fig10_schemes(&a.schemes)?;
    std::fs::create_dir_all(&a.workdir)?;
    let want_drop = !a.no_drop_caches;
    let mut dropped_all = want_drop;
    let mut report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: crate::bench::machine(),
        release_build: !cfg!(debug_assertions),
        mb,
        page_cache_dropped: false,
        corpora: Vec::new(),
        cache_sweep: Vec::new(),
        block_sweep: Vec::new(),
    };
    for name in CORPORA {
        let set = corpus(name, mb << 20);
        if set.files.is_empty() {
            bail!("corpus `{name}` is empty: no such files on this machine");
        }
        let st = stats(&set);
        eprintln!(
            "corpus {name}: {} files, {:.1} MiB",
            st.files,
            st.bytes as f64 / 1048576.0
        );
        report.corpora.push(CorpusReport {
            name: name.to_string(),
            roots: set.roots.clone(),
            stats: st,
            random_fraction: BLOCKS
                .iter()
                .map(|&b| (b, random_fraction(&set, b as usize)))
                .collect(),
        });
        let mut run = |bs: u32, cache: usize, out: &mut Vec<Point>| -> Result<()> {
            let first = out.len();
            for k in 0..runs {
                for (j, &s) in schemes.iter().enumerate() {
                    let params = RunParams {
                        workdir: a.workdir.clone(),
                        block_size: bs,
                    };
                    let (r, dropped) = run_scheme(&set, Some(s), &params, cache, want_drop)?;
                    dropped_all &= dropped;
                    if k == 0 {
                        out.push(Point {
                            corpus: name.to_string(),
                            scheme: s.name().to_string(),
                            block_size: bs,
                            cache_bytes: cache,
                            write_secs: vec![r.write_secs],
                            read_secs: vec![r.read_secs],
                            result: r,
                        });
                    } else {
                        let p = &mut out[first + j];
                        p.write_secs.push(r.write_secs);
                        p.read_secs.push(r.read_secs);
                    }
                }
            }
            Ok(())
        };
        for &c in &caches {
            run(4096, c, &mut report.cache_sweep)?;
        }
        for &b in &blocks {
            run(b, 1024, &mut report.block_sweep)?;
        }
    }
    report.page_cache_dropped = want_drop && dropped_all;
    let traces = match traces_scale > 0.0 {
        true => {
            let t = crate::bench_trace::TracesArgs::quick(traces_scale, runs, a.workdir.clone());
            Some(crate::bench_trace::run(&t, 1024)?)
        }
        false => None,
    };
    Ok((report, traces))
}

/// A range of seconds over runs ("a" or "a–b").
fn secs(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (a, b) = (format!("{lo:.3}"), format!("{hi:.3}"));
    if v.is_empty() {
        "-".into()
    } else if a == b {
        a
    } else {
        format!("{a}–{b}")
    }
}

/// Table 5's integrity bandwidth of `scheme` on corpus number `corpus` (4 KiB blocks).
pub fn paper_ib(scheme: &str, corpus: usize) -> Option<f64> {
    TABLE_5_IB
        .iter()
        .find(|(s, _)| s.name() == scheme)
        .map(|(_, v)| v[corpus])
}

/// The file experiments as Markdown.
pub fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "# intact bench oprea-reiter\n");
    let _ = writeln!(o, "- command: `{}`", r.command);
    let _ = writeln!(
        o,
        "- machine: {}; {} build; at most {} MiB per corpus; page cache {} before each read-back; every byte read back checked",
        r.machine,
        if r.release_build { "release" } else { "DEBUG" },
        r.mb,
        if r.page_cache_dropped { "dropped" } else { "NOT dropped" }
    );
    let _ = writeln!(
        o,
        "\n## The corpora (2006 Table 2), ours and the paper's\n\n| corpus | files | MB | min B | avg B | max B | paper: files | MB | min | avg | max |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (c, p) in r.corpora.iter().zip(TABLE_2) {
        let s = c.stats;
        let _ = writeln!(
            o,
            "| {} | {} | {:.1} | {} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            c.name,
            s.files,
            s.bytes as f64 / 1e6,
            s.min,
            s.avg,
            s.max,
            p.1,
            p.0,
            p.2,
            p.4,
            p.3
        );
    }
    let _ = writeln!(
        o,
        "\n## Random-looking blocks (2006 Table 3): ours / the paper's\n\n| corpus | {} |\n|---|{}",
        BLOCKS.map(|b| format!("{b} B")).join(" | "),
        "---:|".repeat(BLOCKS.len())
    );
    for (c, p) in r.corpora.iter().zip(TABLE_3) {
        let cells: Vec<String> = c
            .random_fraction
            .iter()
            .zip(p)
            .map(|((_, f), q)| format!("{f:.4} / {q:.4}"))
            .collect();
        let _ = writeln!(o, "| {} | {} |", c.name, cells.join(" | "));
    }
    let table = |o: &mut String, title: &str, pts: Vec<&Point>, key: &dyn Fn(&Point) -> String| {
        let _ = writeln!(
            o,
            "\n## {title}\n\n| corpus | {} | scheme | write s | read s | IB B/block | paper IB (4 KiB, 1 KiB cache) | US_F bytes | write: enc / hash / test+compress / tree / root / store ms |\n|---|---:|---|---:|---:|---:|---:|---:|---|",
            if title.contains("cache") { "cache B" } else { "block B" }
        );
        for pt in pts {
            let ci = CORPORA.iter().position(|c| *c == pt.corpus).unwrap_or(0);
            let paper = if pt.block_size == 4096 && pt.cache_bytes == 1024 {
                paper_ib(&pt.scheme, ci).map_or("-".to_string(), |v| format!("{v:.2}"))
            } else {
                "-".to_string()
            };
            let t = &pt.result.write_time;
            let ms = |ns: u64| format!("{:.0}", ns as f64 / 1e6);
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {:.2} | {paper} | {} | {} / {} / {} / {} / {} / {} |",
                pt.corpus,
                key(pt),
                pt.scheme,
                secs(&pt.write_secs),
                secs(&pt.read_secs),
                pt.bandwidth(),
                pt.result.integrity_bytes,
                ms(t.encrypt_ns),
                ms(t.hash_mac_ns),
                ms(t.rand_test_or_compress_ns),
                ms(t.tree_ns),
                ms(t.root_update_ns),
                ms(t.store_wait_ns)
            );
        }
    };
    table(
        &mut o,
        "Node-cache sweep, 4 KiB blocks (2007 Figs. 8 and 9)",
        r.cache_sweep.iter().collect(),
        &|p| p.cache_bytes.to_string(),
    );
    table(
        &mut o,
        "Block-size sweep, 1 KiB cache (2006 Figs. 12 and 13, Tables 4 and 5)",
        r.block_sweep.iter().collect(),
        &|p| p.block_size.to_string(),
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::SrcFile;

    fn set(files: Vec<Vec<u8>>) -> DataSet {
        DataSet {
            name: "t".into(),
            roots: Vec::new(),
            files: files
                .into_iter()
                .map(|data| SrcFile {
                    path: PathBuf::from("x"),
                    data,
                })
                .collect(),
        }
    }

    /// Statistics and the random-looking fraction by hand: a text block and a random one
    /// at 4 KiB (the 1,500-byte file has no whole block); at 1 KiB, four of each and one
    /// of the 1,500-byte file's, its 476-byte tail left out.
    #[test]
    fn corpus_statistics_by_hand() {
        let text: Vec<u8> = b"the integrity of a block "
            .iter()
            .cycle()
            .take(4096)
            .copied()
            .collect();
        let mut noise = vec![0u8; 4096];
        intact_core::crypto::fill_random(&mut noise);
        let s = set(vec![text.clone(), noise.clone(), vec![b'a'; 1500]]);
        let st = stats(&s);
        assert_eq!((st.files, st.bytes, st.min, st.max), (3, 9692, 1500, 4096));
        assert!((st.avg - 9692.0 / 3.0).abs() < 1e-9);
        assert!((random_fraction(&s, 4096) - 0.5).abs() < 1e-9);
        assert!((random_fraction(&s, 1024) - 4.0 / 9.0).abs() < 1e-9);
        assert_eq!(random_fraction(&set(vec![]), 4096), 0.0);
    }

    /// The paper's tables are as printed (a typo here would misstate every comparison).
    #[test]
    fn published_tables_as_printed() {
        assert_eq!(TABLE_3[0][5], 0.0351);
        assert_eq!(TABLE_3[3][0], 0.9421);
        assert_eq!(paper_ib("mt-eint", 0), Some(132.86));
        assert_eq!(paper_ib("rand-eint", 4), Some(211.08));
        assert_eq!(paper_ib("comp-eint", 1), Some(3.01));
        assert_eq!(paper_ib("aead", 1), None);
        assert_eq!(TABLE_2[4].1, 2);
    }

    /// The corpora are found on this machine (Debian has each kind), within the cap, of
    /// the kind asked: executables and objects are ELF files or archives.
    #[test]
    fn every_corpus_is_found_here() {
        for name in CORPORA {
            let s = corpus(name, 1 << 20);
            assert!(!s.files.is_empty(), "{name}");
            assert!(stats(&s).bytes <= 1 << 20, "{name}");
            if name == "executable" {
                assert!(s.files.iter().all(|f| is_elf(&f.data)));
            }
        }
    }
}
