//! `intact disk bench`: the PAC paper's experiments (Burke et al., §7, Table 2 and Fig. 10 to
//! 17) rerun here with fio's nbd engine against throwaway disks served by this process,
//! every mode in the same run, so the ratios compare like with like. Scaled to this machine:
//! a capacity of 1 GiB instead of 1 TB, runs of seconds instead of 15 minutes.
//!
//! Defaults are the paper's: 32 KiB I/O, 1 % reads, Zipf(2.5), I/O depth 32, one job, a
//! cache of 10 % of the tree, a background rate of 1,000 updates/s, a flush every 1,000
//! writes. Each configuration runs `--runs` times; the table gives the range over runs
//! (never the best run alone), and the ratios are taken run by run.

use crate::disk::parse_size;
use crate::Cli;
use anyhow::{bail, Context, Result};
use intact_core::crypto::KdfParams;
use intact_core::disk::engine::{tree_bytes, Disk, DiskCreate, DiskOptions, Mode, TreeKind};
use intact_core::disk::pac::PacConfig;
use intact_core::store::{LocalStateDir, TrustedStore};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Which experiments: headline (every mode at the defaults), rate (Fig. 10), fsync
    /// (Fig. 11), capacity (Fig. 12), cache (Fig. 14), zipf (Fig. 16), mix (Fig. 17: read
    /// ratio, I/O size, depth), batch (Fig. 6: the batching baseline's window of
    /// vulnerability against its batch size, 50 % reads), or all.
    #[arg(long, default_value = "headline")]
    figure: String,
    /// Capacity of each disk (sparse).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Seconds measured per run (after 2 s of warm-up).
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Runs per configuration.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The tree: dmt (the paper's, and the disk's default), binary or nary:N.
    #[arg(long, default_value = "dmt")]
    tree: String,
    /// Where the throwaway disks go [default: the current directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only these modes (comma-separated: none, aead, sync, pac, batch).
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    /// Also draw each figure as an SVG bar chart in this directory (disk-FIGURE.svg).
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// One configuration of the workload and the disk.
#[derive(Debug, Clone)]
struct Config {
    mode: Mode,
    /// Background updates per second (pac); None: as fast as it can.
    rate: Option<f64>,
    /// Writes between flushes.
    fsync: u64,
    /// Zipf θ; 0: uniform.
    zipf: f64,
    /// Reads in percent.
    read_pct: u32,
    /// I/O size in bytes.
    bs: u64,
    depth: u32,
    /// Cache as a share of the tree's bytes.
    cache: f64,
    size: u64,
    /// Requests per checkpoint (batch).
    batch: usize,
}

impl Config {
    fn base(mode: Mode, size: u64) -> Config {
        Config {
            mode,
            rate: Some(1000.0),
            fsync: 1000,
            zipf: 2.5,
            read_pct: 1,
            bs: 32 << 10,
            depth: 32,
            cache: 0.10,
            size,
            batch: 64,
        }
    }
}

fn which(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// What one run measured.
struct Measured {
    /// Aggregate read + write MB/s.
    mbps: f64,
    /// `batch`: reads verified late, the mean and the longest window (ns).
    window: Option<(u64, f64, u64)>,
}

/// One run: a fresh disk served on a socket of this process, fio against it.
fn run_one(args: &BenchArgs, tree: TreeKind, c: &Config) -> Result<Measured> {
    let base = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let dir = tempfile::Builder::new()
        .prefix("intact-disk-bench")
        .tempdir_in(&base)
        .with_context(|| format!("a temporary directory in {}", base.display()))?;
    let path = dir.path().join("disk.img");
    let state = dir.path().join("state");
    let create_mode = if matches!(c.mode, Mode::Sync | Mode::Batch) {
        Mode::Pac
    } else {
        c.mode
    };
    let st = state.clone();
    let cfg = Disk::create(
        &path,
        &DiskCreate {
            size: c.size,
            tree,
            mode: create_mode,
            kdf: KdfParams::TEST,
        },
        b"bench",
        move |id| Ok(Box::new(LocalStateDir::new(st, id)?) as Box<dyn TrustedStore>),
    )?;
    let trusted = Box::new(LocalStateDir::new(state, &cfg.disk_id)?);
    let cache = (tree_bytes(&cfg) as f64 * c.cache) as usize;
    let disk = Arc::new(Disk::open(
        &path,
        b"bench",
        trusted,
        &DiskOptions {
            mode: Some(c.mode),
            cache_bytes: cache,
            pac: PacConfig {
                capacity: 1024,
                low_watermark: 0.75,
                rate: c.rate,
            },
            batch: c.batch,
            ..DiskOptions::default()
        },
    )?);
    let sock = dir.path().join("nbd.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let (disk, sock, stop) = (disk.clone(), sock.clone(), stop.clone());
        std::thread::spawn(move || {
            crate::disk::serve_until(
                disk,
                Some(&sock),
                None,
                false,
                None,
                4,
                &stop,
                false,
                &mut |_| {},
            )
        })
    };
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("the bench's server did not start");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let dist = if c.zipf > 0.0 {
        format!("--random_distribution=zipf:{}", c.zipf)
    } else {
        "--random_distribution=random".into()
    };
    let out = Command::new("fio")
        .args([
            "--name=pac",
            "--ioengine=nbd",
            &format!("--uri=nbd+unix:///?socket={}", sock.display()),
            "--rw=randrw",
            &format!("--rwmixread={}", c.read_pct),
            &format!("--bs={}", c.bs),
            &format!("--iodepth={}", c.depth),
            &dist,
            &format!("--fsync={}", c.fsync),
            &format!("--size={}", c.size),
            "--time_based=1",
            "--ramp_time=2",
            &format!("--runtime={}", args.secs),
            "--end_fsync=1",
            "--norandommap=1",
            "--output-format=json",
        ])
        .output()
        .context("running fio")?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    server
        .join()
        .map_err(|_| anyhow::anyhow!("the server panicked"))??;
    disk.close()?;
    if std::env::var_os("INTACT_BENCH_VERBOSE").is_some() {
        eprintln!("{c:?}: {:?} {:?}", disk.stats(), disk.pac_stats());
    }
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    // fio's nbd engine prints a line of its own before the JSON.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text.find("\n{").map(|i| &text[i + 1..]).unwrap_or(&text);
    let v: serde_json::Value = serde_json::from_str(json)
        .with_context(|| format!("fio's JSON output: {}", &text[..text.len().min(200)]))?;
    let job = &v["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio reported error {}", job["error"]);
    }
    let bw = job["read"]["bw_bytes"].as_f64().unwrap_or(0.0)
        + job["write"]["bw_bytes"].as_f64().unwrap_or(0.0);
    let st = disk.stats();
    let window = (c.mode == Mode::Batch).then(|| {
        let n = st.window_reads;
        (
            n,
            st.window_total_ns as f64 / n.max(1) as f64,
            st.window_max_ns,
        )
    });
    Ok(Measured {
        mbps: bw / 1e6,
        window,
    })
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    if (hi - lo).abs() < 0.005 * hi.max(1e-9) {
        format!("{lo:.2}")
    } else {
        format!("{lo:.2} – {hi:.2}")
    }
}

/// A row of results: a label and MB/s per run.
struct Row {
    figure: &'static str,
    /// The parameter as printed.
    param: String,
    /// The parameter the row is grouped by in a plot and matched by in the ratios.
    group: String,
    mode: String,
    mbps: Vec<f64>,
}

pub fn run(cli: &Cli, args: &BenchArgs) -> Result<()> {
    if !which("fio") {
        bail!("fio is not installed (apt install fio): the bench drives the disk with it");
    }
    let tree = intact_core::disk::engine::parse_tree(&args.tree)?;
    let all = args.figure == "all";
    let want = |f: &str| all || args.figure == f;
    let known = [
        "headline", "rate", "fsync", "capacity", "cache", "zipf", "mix", "batch", "all",
    ];
    if !known.contains(&args.figure.as_str()) {
        bail!("--figure {}: want one of {}", args.figure, known.join(", "));
    }
    let s = args.size;
    let mut plan: Vec<(&'static str, String, Config)> = Vec::new();
    let label = |c: &Config| match (c.mode, c.rate) {
        (Mode::Pac, Some(r)) => format!("pac@{r}"),
        (Mode::Pac, None) => "pac@max".to_string(),
        (Mode::Batch, _) => format!("batch/{}", c.batch),
        (m, _) => m.name().to_string(),
    };
    if want("headline") {
        for m in [Mode::None, Mode::Aead, Mode::Sync, Mode::Pac] {
            plan.push(("headline", "defaults".into(), Config::base(m, s)));
        }
    }
    if want("rate") {
        plan.push(("rate", "-".into(), Config::base(Mode::Sync, s)));
        for r in [
            Some(100.0),
            Some(1000.0),
            Some(10_000.0),
            Some(100_000.0),
            None,
        ] {
            let mut c = Config::base(Mode::Pac, s);
            c.rate = r;
            plan.push(("rate", "-".into(), c));
        }
    }
    for (fig, values) in [
        ("fsync", vec![1.0, 10.0, 100.0, 1000.0, 10_000.0]),
        ("zipf", vec![0.0, 1.2, 1.5, 2.5]),
        ("cache", vec![0.01, 0.10, 0.50]),
        (
            "capacity",
            vec![s as f64, (4 * s) as f64, (16 * s) as f64, (64 * s) as f64],
        ),
    ] {
        if !want(fig) {
            continue;
        }
        for v in values {
            let modes: &[Mode] = if fig == "cache" {
                &[Mode::Sync, Mode::Pac]
            } else {
                &[Mode::Aead, Mode::Sync, Mode::Pac]
            };
            for &m in modes {
                let mut c = Config::base(m, s);
                let p = match fig {
                    "fsync" => {
                        c.fsync = v as u64;
                        format!("fsync every {}", v as u64)
                    }
                    "zipf" => {
                        c.zipf = v;
                        if v == 0.0 {
                            "uniform".into()
                        } else {
                            format!("zipf {v}")
                        }
                    }
                    "cache" => {
                        c.cache = v;
                        format!("cache {}%", (v * 100.0).round())
                    }
                    _ => {
                        c.size = v as u64;
                        format!("{} GiB", v / (1u64 << 30) as f64)
                    }
                };
                plan.push((fig, p, c));
            }
        }
    }
    if want("batch") {
        for m in [Mode::Aead, Mode::Sync, Mode::Pac] {
            let mut c = Config::base(m, s);
            c.read_pct = 50;
            plan.push(("batch", "-".into(), c));
        }
        for n in [1usize, 16, 256, 4096] {
            let mut c = Config::base(Mode::Batch, s);
            c.batch = n;
            // Reads matter here: the window is theirs.
            c.read_pct = 50;
            plan.push(("batch", "-".into(), c));
        }
    }
    if want("mix") {
        type Tweak = fn(&mut Config);
        let mixes: [(&str, Tweak); 5] = [
            ("reads 50%", |c| c.read_pct = 50),
            ("reads 99%", |c| c.read_pct = 99),
            ("I/O 4 KiB", |c| c.bs = 4096),
            ("I/O 128 KiB", |c| c.bs = 128 << 10),
            ("depth 1", |c| c.depth = 1),
        ];
        for (p, f) in mixes {
            for m in [Mode::Aead, Mode::Sync, Mode::Pac] {
                let mut c = Config::base(m, s);
                f(&mut c);
                plan.push(("mix", p.into(), c));
            }
        }
    }
    if !args.modes.is_empty() {
        let keep: Vec<Mode> = args
            .modes
            .iter()
            .map(|m| Mode::parse(m))
            .collect::<intact_core::Result<_>>()?;
        plan.retain(|(_, _, c)| keep.contains(&c.mode));
    }
    eprintln!(
        "intact disk bench: {} configurations × {} runs × {} s (+2 s warm-up); tree {}, \
         capacity {} bytes",
        plan.len(),
        args.runs,
        args.secs,
        args.tree,
        s
    );
    let mut rows: Vec<Row> = Vec::new();
    println!(
        "| figure | parameter | mode | MB/s (range over {} runs) |",
        args.runs
    );
    println!("|---|---|---|---:|");
    for (fig, param, c) in &plan {
        let mut mbps = Vec::with_capacity(args.runs);
        let mut windows = Vec::new();
        for _ in 0..args.runs {
            let m = run_one(args, tree, c)?;
            mbps.push(m.mbps);
            windows.extend(m.window);
        }
        let base_param = param.clone();
        let mut param = if matches!(*fig, "rate" | "batch") {
            label(c)
        } else {
            param.clone()
        };
        if !windows.is_empty() {
            let mean: Vec<f64> = windows.iter().map(|w| w.1 / 1e3).collect();
            let max: Vec<f64> = windows.iter().map(|w| w.2 as f64 / 1e6).collect();
            param = format!(
                "{param}: window mean {} µs, max {} ms",
                range(&mean),
                range(&max)
            );
        }
        println!("| {fig} | {param} | {} | {} |", label(c), range(&mbps));
        if cli.json {
            eprintln!(
                "{}",
                serde_json::json!({"figure": fig, "param": param, "mode": label(c), "mbps": mbps})
            );
        }
        let group = if matches!(*fig, "rate" | "batch") {
            label(c)
        } else {
            base_param.clone()
        };
        rows.push(Row {
            figure: fig,
            param,
            group,
            mode: label(c),
            mbps,
        });
    }
    if let Some(dir) = &args.svg {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut figures: Vec<&str> = rows.iter().map(|r| r.figure).collect();
        figures.dedup();
        for f in figures {
            let these: Vec<&Row> = rows.iter().filter(|r| r.figure == f).collect();
            let path = dir.join(format!("disk-{f}.svg"));
            plot(&path, f, &these)?;
            eprintln!("intact disk bench: drew {}", path.display());
        }
    }
    // Ratios, run by run, where a row has its aead and sync neighbours.
    println!();
    println!("| figure | parameter | PAC / AEAD | PAC / sync |");
    println!("|---|---|---:|---:|");
    for r in rows.iter().filter(|r| r.mode.starts_with("pac")) {
        let find = |m: &str| {
            rows.iter().find(|o| {
                o.figure == r.figure
                    && o.mode == m
                    && (o.group == r.group || matches!(r.figure, "rate" | "batch"))
            })
        };
        let ratio = |o: Option<&Row>| match o {
            Some(o) => range(
                &r.mbps
                    .iter()
                    .zip(&o.mbps)
                    .map(|(a, b)| a / b.max(1e-9))
                    .collect::<Vec<_>>(),
            ),
            None => "-".into(),
        };
        println!(
            "| {} | {} | {} | {} |",
            r.figure,
            r.param,
            ratio(find("aead")),
            ratio(find("sync"))
        );
    }
    Ok(())
}

/// Draws one figure as grouped bars (SVG): a group per parameter, a bar per mode at its
/// mean MB/s over the runs, a whisker from the lowest to the highest run.
fn plot(path: &std::path::Path, figure: &str, rows: &[&Row]) -> Result<()> {
    let bars: Vec<crate::plot::Bar> = rows
        .iter()
        .map(|r| crate::plot::Bar {
            group: &r.group,
            series: &r.mode,
            values: &r.mbps,
        })
        .collect();
    crate::plot::grouped_bars(
        path,
        &format!("intact disk bench: {figure}"),
        "MB/s (read + write)",
        &bars,
    )
}
