//! Smoke test of `intact bench schemes` on small synthetic data sets passed with `--dir`:
//! the tables have the rows asked for, every file is accounted for, and the measured
//! integrity bandwidth shows RAND-EINT's point (Oprea–Reiter 2007 §6): on text it moves far
//! less `US_F` than MT-EINT, on random data about as much.

#[allow(dead_code)]
mod common;

use common::need;
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_intact");

/// A deterministic xorshift generator (no dependency, same files on every run).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const WORDS: &[&str] = &[
    "the",
    "integrity",
    "of",
    "a",
    "block",
    "is",
    "checked",
    "against",
    "tree",
    "root",
    "file",
    "system",
    "untrusted",
    "storage",
    "counter",
    "and",
    "with",
    "data",
    "random",
    "entropy",
    "cipher",
    "key",
    "read",
    "write",
    "hash",
    "node",
    "leaf",
    "trusted",
    "fresh",
    "version",
];

fn text(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        let w = WORDS[(rng.next() % WORDS.len() as u64) as usize];
        out.extend_from_slice(w.as_bytes());
        out.push(if rng.next().is_multiple_of(12) {
            b'\n'
        } else {
            b' '
        });
    }
    out.truncate(len);
    out
}

fn random(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| (rng.next() >> 24) as u8).collect()
}

/// Writes 6 files (~0.85 MiB in all, sizes not block multiples) under `dir`; their sizes.
fn make_set(dir: &Path, gen: fn(&mut Rng, usize) -> Vec<u8>) -> Vec<u64> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let sizes = [200_000usize, 150_001, 180_000, 100_003, 120_000, 140_000];
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    for (k, n) in sizes.iter().enumerate() {
        let p = if k % 2 == 0 {
            dir.join(format!("f{k}.txt"))
        } else {
            dir.join("sub").join(format!("g{k}.txt"))
        };
        std::fs::write(p, gen(&mut rng, *n)).unwrap();
    }
    sizes.iter().map(|&n| n as u64).collect()
}

fn bench(dir: &Path, work: &Path, json: bool) -> String {
    let mut c = Command::new(BIN);
    c.args([
        "bench",
        "schemes",
        "--mb",
        "1",
        "--schemes",
        "mt-eint,rand-eint",
    ])
    .arg("--dir")
    .arg(dir)
    .arg("--workdir")
    .arg(work)
    .arg("--no-drop-caches");
    if json {
        c.arg("--json");
    }
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// `(read, write)` integrity bandwidth of `scheme`, checking the file accounting.
fn bandwidth(j: &serde_json::Value, scheme: &str, files: usize, bytes: u64) -> (f64, f64) {
    let set = &j["sets"][0];
    let r = set["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scheme"] == scheme)
        .unwrap_or_else(|| panic!("no {scheme} row in {set}"));
    assert_eq!(r["files"].as_u64().unwrap() as usize, files);
    assert_eq!(r["bytes"].as_u64().unwrap(), bytes);
    let blocks = bytes.div_ceil(4096) as f64;
    // Every block is written and read back once (files in 1 MiB chunks, whole-file reads;
    // a file's last, partial block is one block access).
    let bw = r["blocks_written"].as_f64().unwrap();
    let br = r["blocks_read"].as_f64().unwrap();
    assert!(
        bw >= blocks - 6.0 && bw <= blocks + 6.0,
        "{scheme}: {bw} blocks written"
    );
    assert!(
        br >= blocks - 6.0 && br <= blocks + 6.0,
        "{scheme}: {br} blocks read"
    );
    (
        r["read_bandwidth"].as_f64().unwrap(),
        r["write_bandwidth"].as_f64().unwrap(),
    )
}

#[test]
fn bench_schemes_text_and_random() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();

    // Text: the table has exactly the two rows asked for.
    let text_dir = tmp.path().join("text");
    let sizes = make_set(&text_dir, text);
    let (files, bytes) = (sizes.len(), sizes.iter().sum::<u64>());
    let md = bench(&text_dir, &work, false);
    assert!(
        md.contains(&format!("## Set `dir`: {files} files, {bytes} bytes")),
        "{md}"
    );
    for row in ["| mt-eint |", "| rand-eint |"] {
        assert!(md.contains(row), "no row {row}:\n{md}");
    }
    for absent in ["| aead |", "| none |", "| mac-tree |", "| comp-eint |"] {
        assert!(!md.contains(absent), "unexpected row {absent}:\n{md}");
    }

    let j: serde_json::Value = serde_json::from_str(&bench(&text_dir, &work, true)).unwrap();
    assert_eq!(j["sets"][0]["set"], "dir");
    assert_eq!(j["sets"][0]["file_list"].as_array().unwrap().len(), files);
    let (mt_r, mt_w) = bandwidth(&j, "mt-eint", files, bytes);
    let (re_r, re_w) = bandwidth(&j, "rand-eint", files, bytes);
    // MT-EINT reads a leaf and nodes for every block; RAND-EINT has no leaf for text.
    assert!(mt_r > 16.0 && mt_w > 16.0, "mt-eint: {mt_r} / {mt_w}");
    assert!(
        re_r * 20.0 < mt_r,
        "rand-eint read {re_r} vs mt-eint {mt_r}"
    );
    assert!(
        re_w * 20.0 < mt_w,
        "rand-eint write {re_w} vs mt-eint {mt_w}"
    );

    // Random data: every block looks random, so RAND-EINT keeps a leaf per block too.
    let rand_dir = tmp.path().join("rand");
    let sizes = make_set(&rand_dir, random);
    let (files, bytes) = (sizes.len(), sizes.iter().sum::<u64>());
    let j: serde_json::Value = serde_json::from_str(&bench(&rand_dir, &work, true)).unwrap();
    let (mt_r, _) = bandwidth(&j, "mt-eint", files, bytes);
    let (re_r, _) = bandwidth(&j, "rand-eint", files, bytes);
    assert!(
        re_r > mt_r / 2.0,
        "rand-eint on random data: {re_r} vs mt-eint {mt_r}"
    );

    // The throwaway volumes are gone.
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
}

#[test]
fn bench_rejects_bad_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(["bench", "schemes", "--no-drop-caches", "--workdir"])
            .arg(tmp.path())
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["--schemes", "mt-eint,nope", "--dir", "/"]);
    assert!(!out.status.success());
    let out = run(&["--dir", tmp.path().join("missing").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
}

/// `intact bench dir` (docs/performance.md, "One directory of 10^6 entries"): one row per
/// power of ten, each with its ranges, its checkpoint and growth figures and the bytes
/// written per change counted by the store, no temporary volume left behind; bad
/// arguments are refused.
#[test]
fn bench_dir_prints_a_row_per_power_of_ten() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "--json",
            "bench",
            "dir",
            "--entries",
            "10000",
            "--ops",
            "20",
        ])
        .args(["--samples", "2", "--workdir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (r, n) in rows.iter().zip([1000, 10000]) {
        assert_eq!(r["entries"], n);
        for k in ["create_us", "lookup_us", "unlink_us"] {
            let (lo, hi) = (r[k]["min"].as_f64().unwrap(), r[k]["max"].as_f64().unwrap());
            assert!(lo > 0.0 && lo <= hi, "{k}: {r}");
        }
        for k in ["checkpoint_us", "grow_us"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{k}: {r}");
        }
        // A change writes its log record and, at the checkpoint, a share of its leaf: at
        // least the record, far less than a unit.
        let b = r["change_bytes"].as_f64().unwrap();
        assert!((64.0..64.0 * 1024.0).contains(&b), "{r}");
    }
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "left behind"
    );
    let bad = Command::new(BIN)
        .args(["bench", "dir", "--entries", "10", "--workdir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("at least 1000"));
}

/// `intact bench traces` (docs/performance.md, "Oprea–Reiter's traces"): the synthetic
/// DEASNA trace at 1 % keeps Table 3's counts scaled, runs every scheme of Fig. 10 with
/// every content, and shows the paper's point on low-entropy blocks: RAND-EINT and
/// COMP-EINT move far less `US_F` per block than MT-EINT. Real traces, written by hand in
/// both formats, are replayed too (their reads of data older than the trace first written,
/// untimed); a malformed one is refused naming its line; no volume is left behind.
#[test]
fn bench_traces_replays_synthetic_and_real_traces() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(["--json", "bench", "traces", "--workdir"])
            .arg(&work)
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["--profiles", "deasna", "--scale", "0.01"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &r["traces"][0];
    assert_eq!(t["name"], "DEASNA");
    assert_eq!(t["counts"], t["published"]);
    assert_eq!(t["counts"]["files"], 9);
    assert_eq!(t["counts"]["writes"], 641);
    let runs = t["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 9);
    let ib = |content: &str, scheme: &str| {
        runs.iter()
            .find(|x| x["content"] == content && x["scheme"] == scheme)
            .unwrap()["integrity_bandwidth"]
            .as_f64()
            .unwrap()
    };
    for scheme in ["rand-eint", "comp-eint"] {
        assert!(
            ib("low", scheme) * 10.0 < ib("low", "mt-eint"),
            "{scheme}: {} against {}",
            ib("low", scheme),
            ib("low", "mt-eint")
        );
    }
    assert!(ib("high", "mt-eint") > 0.0);
    for x in runs {
        let secs = x["secs"].as_array().unwrap();
        assert_eq!(secs.len(), 3, "{x}");
        assert!(secs.iter().all(|s| s.as_f64().unwrap() > 0.0), "{x}");
        assert_eq!(x["intervals"].as_array().unwrap().len(), 9, "{x}");
    }
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "left behind");

    let nfs = tmp.path().join("hand.txt");
    std::fs::write(
        &nfs,
        "1003970000.000100 30.0801 31.03fe U C3 1 6 read fh aa01 off 0 count 3000 euid 0\n\
         1003970000.000200 31.03fe 30.0801 U R3 1 6 read OK count 3000\n\
         1003970000.000300 30.0801 31.03fe U C3 2 7 write fh aa02 off 1000 count 2000 stable 2\n\
         1003970000.000400 30.0801 31.03fe U C3 3 7 write fh aa01 off 0 count 1000\n\
         1003970000.000500 30.0801 31.03fe U C3 4 6 read fh aa01 off 0 count 1000\n",
    )
    .unwrap();
    let fio = tmp.path().join("hand.iolog");
    std::fs::write(
        &fio,
        "fio version 3 iolog\n0 f add\n1 f open\n2 f write 0 8192\n3 f read 4096 4096\n4 f close\n",
    )
    .unwrap();
    for (file, format, files, writes, reads, pre) in
        [(&nfs, "nfsdump", 2, 3, 4, 3), (&fio, "fio", 1, 2, 1, 0)]
    {
        let out = run(&[
            "--trace",
            file.to_str().unwrap(),
            "--format",
            format,
            "--schemes",
            "mt-eint,mac-tree",
            "--contents",
            "half",
        ]);
        assert!(
            out.status.success(),
            "{format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let t = &r["traces"][0];
        assert_eq!(r["traces"].as_array().unwrap().len(), 1, "{format}");
        assert_eq!(t["counts"]["files"], files, "{format}");
        assert_eq!(t["counts"]["writes"], writes, "{format}");
        assert_eq!(t["counts"]["reads"], reads, "{format}");
        assert_eq!(t["preexisting_blocks"], pre, "{format}");
        assert_eq!(t["runs"].as_array().unwrap().len(), 2, "{format}");
    }

    std::fs::write(&fio, "fio version 3 iolog\n0 f write 0\n").unwrap();
    let out = run(&["--trace", fio.to_str().unwrap(), "--format", "fio"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("hand.iolog:2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["--profiles", "nowhere"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown trace"));
    let out = run(&["--profiles", "lair", "--runs", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--runs"));
}

/// `intact bench yun` (docs/performance.md, "Yun, Shi and Kim's Fig. 5"): both
/// constructions and the four schemes through the file system, a split per run, every
/// byte checked, the Markdown table naming the paper's claim; bad arguments refused.
#[test]
fn bench_yun_splits_encryption_from_authentication() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |json: bool, args: &[&str]| {
        let mut c = Command::new(BIN);
        if json {
            c.arg("--json");
        }
        c.args(["bench", "yun", "--workdir"])
            .arg(tmp.path())
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(true, &["--mb", "2", "--runs", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for c in ["hash_tree", "mac_tree"] {
        let runs = r[c].as_array().unwrap();
        assert_eq!(runs.len(), 2, "{c}");
        for x in runs {
            for k in [
                "write_encrypt_ms",
                "write_auth_ms",
                "read_encrypt_ms",
                "read_auth_ms",
            ] {
                assert!(x[k].as_f64().unwrap() > 0.0, "{c} {k}: {x}");
            }
        }
    }
    let engine = r["engine"].as_array().unwrap();
    let names: Vec<&str> = engine.iter().map(|e| e[0].as_str().unwrap()).collect();
    assert_eq!(names, ["none", "aead", "mac-tree", "mt-eint"]);
    for e in engine {
        assert_eq!(e[1].as_array().unwrap().len(), 2, "{e}");
    }
    let out = run(false, &["--mb", "1", "--runs", "1"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("16-ary SHA-1/128 Merkle tree") && text.contains("about 0.5"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "left behind"
    );
    assert!(!run(false, &["--mb", "0"]).status.success());
}

/// `intact bench oprea-reiter --quick` (docs/performance.md, "Oprea–Reiter's file
/// experiments"): the five corpora with their statistics and random-looking fractions at
/// every block size, every scheme at every cache size and block size of the quick sweep
/// (every byte read back checked), the paper's Table 5 beside ours at 4 KiB with a 1 KiB
/// cache, and the trace experiment after; on text, RAND-EINT moves far less `US_F` than
/// MT-EINT (the paper's point); no volume left behind.
#[test]
fn bench_oprea_reiter_quick_runs_every_table() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let out = Command::new(BIN)
        .args(["--json", "bench", "oprea-reiter", "--quick", "--mb", "1"])
        .args(["--schemes", "mt-eint,rand-eint", "--traces-scale", "0.005"])
        .args(["--no-drop-caches", "--workdir"])
        .arg(&work)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &r["files"];
    let corpora = f["corpora"].as_array().unwrap();
    let names: Vec<&str> = corpora
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["text", "object", "executable", "image", "compressed"]
    );
    for c in corpora {
        assert!(c["stats"]["files"].as_u64().unwrap() > 0, "{c}");
        assert!(c["stats"]["bytes"].as_u64().unwrap() <= 1 << 20, "{c}");
        assert_eq!(c["random_fraction"].as_array().unwrap().len(), 6, "{c}");
    }
    // Compressed files look random far more often than text does.
    let frac = |i: usize| corpora[i]["random_fraction"][5][1].as_f64().unwrap();
    assert!(frac(4) > 0.5 && frac(0) < 0.2, "{} {}", frac(4), frac(0));
    let cache = f["cache_sweep"].as_array().unwrap();
    let block = f["block_sweep"].as_array().unwrap();
    assert_eq!(cache.len(), 5 * 2 * 3);
    assert_eq!(block.len(), 5 * 2 * 2);
    let ib = |scheme: &str| {
        let p = cache
            .iter()
            .find(|p| p["corpus"] == "text" && p["scheme"] == scheme && p["cache_bytes"] == 1024)
            .unwrap();
        let r = &p["result"];
        let us = r["us_written"].as_f64().unwrap() + r["us_read"].as_f64().unwrap();
        us / (r["blocks_written"].as_f64().unwrap() + r["blocks_read"].as_f64().unwrap())
    };
    assert!(
        ib("rand-eint") * 5.0 < ib("mt-eint"),
        "{} {}",
        ib("rand-eint"),
        ib("mt-eint")
    );
    assert_eq!(r["traces"]["traces"].as_array().unwrap().len(), 3);
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "left behind");
}

/// `intact bench report --quick` (what CI runs, so that docs/evaluation.md cannot rot):
/// the report has a claims table for each paper with a verdict on every claim, its
/// figures exist and are SVG, the measurements follow; no volume or disk left behind.
#[test]
fn bench_report_quick_writes_the_evaluation_with_its_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let out_md = tmp.path().join("evaluation.md");
    let out = Command::new(BIN)
        .args(["bench", "report", "--quick", "--mb", "1", "--out"])
        .arg(&out_md)
        .arg("--workdir")
        .arg(&work)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(&out_md).unwrap();
    for h in [
        "## Oprea and Reiter",
        "## Yun, Shi and Kim",
        "## Burke et al.",
        "## Contiu et al.",
        "## Tampering and rollback: intact beside its peers",
        "| | **detected** |",
        "## The measurements",
        "| claim | published | ours | verdict | why they differ |",
    ] {
        assert!(md.contains(h), "no {h:?} in:\n{md}");
    }
    let verdicts = md.matches("**confirmed**").count() + md.matches("**refuted**").count();
    assert!(verdicts >= 10, "{verdicts} verdicts:\n{md}");
    for f in [
        "or-bandwidth.svg",
        "or-time.svg",
        "or-traces.svg",
        "yun.svg",
        "disk-headline.svg",
    ] {
        let p = tmp.path().join("evaluation").join(f);
        let svg = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(svg.contains("<svg"), "{f}");
        assert!(md.contains(&format!("(evaluation/{f})")), "{f} not linked");
    }
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "left behind");
}

/// A set of more files than the engine keeps records for by default (1,024) is counted
/// whole: every block written and read back is in the per-file counts (they are kept with
/// each record, and a dropped record lost them: `bench schemes` then under-counted its
/// integrity bandwidth, and `bench oprea-reiter` printed 0 for text).
#[test]
fn bench_schemes_counts_every_file_of_a_large_set() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut blocks = 0u64;
    // Up to ten blocks: a file of up to six keeps its tree in its record (`inline-tree`),
    // so the larger ones are what writes integrity objects.
    for k in 0..1100u64 {
        let len = 100 + (rng.next() % 40_000) as usize;
        let text: String = (0..len)
            .map(|i| (b'a' + ((i as u64 ^ k) % 26) as u8) as char)
            .collect();
        std::fs::write(src.join(format!("f{k:05}.txt")), text).unwrap();
        blocks += (len as u64).div_ceil(4096);
    }
    let out = Command::new(BIN)
        .args([
            "--json",
            "bench",
            "schemes",
            "--no-drop-caches",
            "--schemes",
            "mt-eint",
        ])
        .arg("--dir")
        .arg(&src)
        .arg("--workdir")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let x = &r["sets"][0]["results"][0];
    assert_eq!(r["sets"][0]["files"], 1100);
    assert_eq!(x["blocks_written"], blocks, "{x}");
    assert_eq!(x["blocks_read"], blocks, "{x}");
    assert!(x["write_bandwidth"].as_f64().unwrap() > 0.0, "{x}");
}

/// `bench attacks` against real gocryptfs and securefs mounts (Debian's): each misses the
/// nine attacks that need freshness or authenticated structure, and the table says what
/// the reader got; intact's schemes are as docs/threat-model.md says.
#[test]
fn bench_attacks_runs_the_twelve_on_intact_and_its_peers() {
    if !need(&["gocryptfs", "securefs", "fusermount3"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["--json", "bench", "attacks", "--schemes", "mt-eint,aead"])
        .args(["--peers", "gocryptfs,securefs", "--workdir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["unexpected"], 0, "{j}");
    let intact = j["intact"].as_array().unwrap();
    assert_eq!(intact.len(), 24);
    let missed: Vec<u64> = intact
        .iter()
        .filter(|r| r["scheme"] == "aead" && r["detected"] == false)
        .map(|r| r["attack"].as_u64().unwrap())
        .collect();
    assert_eq!(missed, [4, 5]);
    for peer in ["gocryptfs", "securefs"] {
        let runs: Vec<&serde_json::Value> = j["peers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["peer"] == peer)
            .collect();
        assert_eq!(runs.len(), 12, "{peer}: {j}");
        let detected: Vec<u64> = runs
            .iter()
            .filter(|r| r["detected"] == true)
            .map(|r| r["attack"].as_u64().unwrap())
            .collect();
        assert_eq!(detected, [1, 2, 3], "{peer}: {j}");
        assert!(runs.iter().all(|r| r["no_effect"] == false), "{peer}: {j}");
        // Neither keeps any state of its own to check freshness against.
        assert_eq!(runs[0]["local_state_bytes"], 0, "{peer}");
        assert!(runs[0]["cipher_files"].as_u64().unwrap() >= 5, "{peer}");
        let got = |n: usize| runs[n - 1]["got"].as_str().unwrap().to_string();
        assert!(got(1).contains("read failed"), "{}", got(1));
        assert!(got(5).starts_with("an older version"), "{}", got(5));
        assert!(got(7).contains("cut from 16384 to 4096"), "{}", got(7));
        assert!(got(8).starts_with("no such file"), "{}", got(8));
        assert!(got(9).starts_with("the contents of /b"), "{}", got(9));
        assert!(got(11).starts_with("the deleted file"), "{}", got(11));
        assert_eq!(got(12), "zeros in block(s) [2], and no error");
    }
    assert!(j["skipped"].as_array().unwrap().is_empty(), "{j}");
    // The scratch volumes are gone, and nothing is left mounted.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(tmp.path().to_str().unwrap()));
}

/// `intact bench contiu --quick`: every AES mode and key size, the three SHA-2 and the six
/// signature keys of Contiu et al.'s Table 1 measured (RSA over 3072 bits through OpenSSL
/// only), in JSON and Markdown, each of their six claims with a verdict.
#[test]
fn bench_contiu_measures_figs_2_to_4_and_judges_each_claim() {
    if !common::need(&["openssl"]) {
        return;
    }
    let out = Command::new(BIN)
        .args([
            "--json", "bench", "contiu", "--quick", "--runs", "2", "--part", "micro",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let both: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(both["macro"].is_null(), "micro only");
    let r = &both["micro"];
    assert_eq!(r["runs"], 2);
    let aes = r["aes"].as_array().unwrap();
    assert_eq!(aes.len(), 9);
    for a in aes {
        for k in ["enc", "dec"] {
            let x = &a[k];
            assert!(
                x["min"].as_f64().unwrap() > 0.0 || a["mode"] == "Gcm",
                "{a}"
            );
            assert!(
                x["max"].as_f64().unwrap() >= x["min"].as_f64().unwrap(),
                "{a}"
            );
        }
    }
    assert_eq!(r["sha"].as_array().unwrap().len(), 3);
    let sigs = r["signatures"].as_array().unwrap();
    assert_eq!(sigs.len(), 6);
    for g in sigs {
        assert!(g["ossl_sign"]["min"].as_f64().unwrap() > 0.0, "{g}");
        assert!(g["ossl_verify"]["min"].as_f64().unwrap() > 0.0, "{g}");
        let aws = g["alg"] == "ECDSA" || g["bits"] == 3072;
        assert_eq!(g["aws_sign"].is_null(), !aws, "{g}");
    }
    let claims = r["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 6, "{claims:?}");
    for c in claims {
        let v = c["verdict"].as_str().unwrap();
        assert!(v.starts_with("confirmed") || v == "refuted", "{c}");
    }
    let md = Command::new(BIN)
        .args([
            "bench", "contiu", "--quick", "--runs", "1", "--part", "micro",
        ])
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&md.stdout);
    for s in [
        "| CBC | 192 |",
        "| SHA-384 |",
        "| high | RSA-15360 |",
        "Fig. 4b",
    ] {
        assert!(md.contains(s), "{s}: {md}");
    }
}

/// `intact bench contiu --part macro --quick` (Contiu et al. §4.2, Figs. 5–7): their six
/// schemes and intact's on each data set under each workload, in the simulated cloud. Their
/// client makes exactly one request an operation (so a run's total is at least 50 ms times
/// its files), intact's at least one a write; every claim gets a verdict; the figures are
/// drawn.
#[test]
fn bench_contiu_macro_runs_their_schemes_and_intacts_on_each_set_and_workload() {
    let tmp = tempfile::tempdir().unwrap();
    let plots = tmp.path().join("plots");
    let out = Command::new(BIN)
        .args([
            "--json", "bench", "contiu", "--part", "macro", "--quick", "--runs", "2",
        ])
        // 5 ms a request: intact's rows sleep it (the default 50 ms took most of 160 s).
        .args(["--delay-ms", "5"])
        .args(["--intact", "mt-eint,aead", "--workdir"])
        .arg(tmp.path())
        .arg("--keys")
        .arg(tmp.path().join("keys"))
        .arg("--plots")
        .arg(&plots)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let both: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(both["micro"].is_null(), "macro only");
    let r = &both["macro"];
    assert_eq!(r["runs"], 2);
    assert_eq!(r["delay_ms"], 5);
    let sets = r["sets"].as_array().unwrap();
    assert_eq!(sets.len(), 3);
    let rows = r["rows"].as_array().unwrap();
    // 3 sets × 4 workloads × (6 of theirs + 2 of intact's), at the low level only.
    assert_eq!(rows.len(), 3 * 4 * 8, "{rows:?}");
    for row in rows {
        assert_eq!(row["level"], "low");
        assert_eq!(row["totals"].as_array().unwrap().len(), 2);
        let files = sets.iter().find(|s| s["set"] == row["set"]).unwrap()["files"]
            .as_u64()
            .unwrap();
        let req = row["requests"].as_array().unwrap();
        let (reads, writes) = (
            row["reads"].as_u64().unwrap(),
            row["writes"].as_u64().unwrap(),
        );
        assert_eq!(reads + writes, files, "{row}");
        let min = row["total_s"]["min"].as_f64().unwrap();
        if row["scheme"].as_str().unwrap().starts_with("intact") {
            assert!(req[1].as_u64().unwrap() >= writes, "a PUT a write: {row}");
            assert!(req[0].as_u64().unwrap() >= reads, "cold reads: {row}");
        } else {
            assert_eq!(req[0].as_u64().unwrap(), reads, "{row}");
            assert_eq!(req[1].as_u64().unwrap(), writes, "{row}");
            assert!(row["crypto_s"]["min"].as_f64().unwrap() > 0.0, "{row}");
        }
        // At least one request of 5 ms a file.
        assert!(min >= 0.005 * files as f64, "{row}");
    }
    let workloads: Vec<&str> = rows
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    for w in ["mostly-write", "write-heavy", "read-heavy", "read-only"] {
        assert!(workloads.contains(&w), "{w}");
    }
    let claims = r["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 7);
    for c in claims {
        let v = c["verdict"].as_str().unwrap();
        assert!(
            v.starts_with("confirmed") || v == "refuted" || v == "not measured",
            "{c}"
        );
    }
    // Claims over the strengths need all three; the others are judged.
    assert_eq!(claims[0]["verdict"], "not measured");
    assert_ne!(claims[3]["verdict"], "not measured");
    let svgs = std::fs::read_dir(&plots).unwrap().count();
    assert_eq!(svgs, 3, "one figure per set at the low level");
    // The keys were made once and are used again.
    assert!(tmp.path().join("keys/rsa-3072.der").exists());
    assert!(tmp.path().join("keys/ecdsa-p256.der").exists());
}
