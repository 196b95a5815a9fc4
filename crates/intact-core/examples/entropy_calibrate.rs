//! Calibration of the IsRand threshold (Oprea–Reiter §5.2, Table 3).
//!
//! `cargo run -p intact-core --example entropy_calibrate -- bounds` prints, per block size,
//! the largest threshold meeting the security target and the bound at the chosen one.
//!
//! `cargo run -p intact-core --example entropy_calibrate -- classes [MAX_MB]` walks files of
//! this machine by class (text/source, object/executable, compressed, images), splits each
//! into blocks of 128..4096 bytes and prints the fraction of blocks `is_rand` calls random,
//! next to the paper's Table 3.
use intact_core::entropy::{byte_entropy, forgery_log2_bound, threshold, SECURITY_BITS};
use std::path::{Path, PathBuf};

const SIZES: [usize; 6] = [128, 256, 512, 1024, 2048, 4096];

fn walk(dir: &Path, out: &mut Vec<PathBuf>, keep: &dyn Fn(&Path) -> bool, limit: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.flatten().collect();
    entries.sort_by_key(|e| e.path());
    for e in entries {
        if out.len() >= limit {
            return;
        }
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk(&p, out, keep, limit);
        } else if ft.is_file() && keep(&p) {
            out.push(p);
        }
    }
}

fn ext_in(p: &Path, exts: &[&str]) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    exts.iter().any(|e| name.ends_with(e))
}

fn bounds() {
    println!(
        "bs     chosen t  log2 bound   largest t (1/16 steps) with bound <= 2^-{SECURITY_BITS}"
    );
    for bs in [
        128usize, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
    ] {
        let mut t = 0.0;
        while t < 8.0 && forgery_log2_bound(bs, t + 0.0625) <= -SECURITY_BITS {
            t += 0.0625;
        }
        println!(
            "{bs:6} {:8.4} {:11.1}   {t:.4}",
            threshold(bs),
            forgery_log2_bound(bs, threshold(bs))
        );
    }
}

fn classes(max_bytes: usize) {
    let rust_src = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string()));
    let mut text_dirs = vec![
        PathBuf::from("/usr/include"),
        PathBuf::from("/usr/share/doc"),
    ];
    if let Some(r) = &rust_src {
        text_dirs.push(r.join("lib/rustlib/src"));
    }
    let text = |p: &Path| {
        ext_in(
            p,
            &[
                ".txt", ".h", ".c", ".rs", ".md", ".html", ".py", ".hpp", ".cc", ".tex",
            ],
        )
    };
    let objs = |p: &Path| ext_in(p, &[".so", ".a", ".o", ".rlib"]) || p.starts_with("/usr/bin");
    let comp = |p: &Path| ext_in(p, &[".gz", ".xz", ".zst", ".bz2", ".zip", ".crate", ".tgz"]);
    let imgs = |p: &Path| ext_in(p, &[".jpg", ".jpeg", ".png", ".webp"]);
    let home = std::env::var("HOME").unwrap_or_default();
    type Class<'a> = (&'a str, Vec<PathBuf>, &'a dyn Fn(&Path) -> bool);
    let sets: Vec<Class> = vec![
        ("text/source", text_dirs, &text),
        (
            "object/exec",
            vec![PathBuf::from("/usr/lib"), PathBuf::from("/usr/bin")],
            &objs,
        ),
        (
            "compressed",
            vec![
                PathBuf::from("/usr/share"),
                PathBuf::from(format!("{home}/.cargo/registry/cache")),
                PathBuf::from("/var/cache"),
            ],
            &comp,
        ),
        (
            "images",
            vec![
                PathBuf::from("/usr/share"),
                PathBuf::from("/usr/lib"),
                PathBuf::from(&home),
            ],
            &imgs,
        ),
    ];
    println!("fraction of random-looking blocks (is_rand), per block size");
    print!("{:12} {:>6} {:>9}", "class", "files", "MB");
    for bs in SIZES {
        print!(" {bs:>7}");
    }
    println!("   mean entropy @4096");
    for (name, dirs, keep) in sets {
        let mut files = Vec::new();
        for d in &dirs {
            walk(d, &mut files, keep, 200_000);
        }
        let mut used = 0usize;
        let mut nfiles = 0;
        let mut rand = [0u64; SIZES.len()];
        let mut total = [0u64; SIZES.len()];
        let mut hsum = 0.0;
        let mut hn = 0u64;
        for f in files {
            if used >= max_bytes {
                break;
            }
            let Ok(data) = std::fs::read(&f) else {
                continue;
            };
            let data = &data[..data.len().min(max_bytes - used).min(8 << 20)];
            if data.is_empty() {
                continue;
            }
            used += data.len();
            nfiles += 1;
            for (k, &bs) in SIZES.iter().enumerate() {
                for blk in data.chunks(bs) {
                    // The last partial block is zero-padded, as the volume stores it.
                    let mut b = blk.to_vec();
                    b.resize(bs, 0);
                    total[k] += 1;
                    if byte_entropy(&b) > threshold(bs) {
                        rand[k] += 1;
                    }
                    if bs == 4096 {
                        hsum += byte_entropy(&b);
                        hn += 1;
                    }
                }
            }
        }
        print!("{name:12} {nfiles:>6} {:>9.1}", used as f64 / 1e6);
        for k in 0..SIZES.len() {
            print!(" {:>7.4}", rand[k] as f64 / total[k].max(1) as f64);
        }
        println!("   {:.3}", hsum / hn.max(1) as f64);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("bounds") => bounds(),
        Some("classes") => {
            let mb: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200);
            classes(mb << 20)
        }
        _ => eprintln!("usage: entropy_calibrate bounds | classes [MAX_MB]"),
    }
}
