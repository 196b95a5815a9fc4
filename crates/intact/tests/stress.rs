//! stress-ng's file-system stressors through a real mount, for every scheme with freshness
//! (issue 14): many processes at once creating, renaming, linking, unlinking, listing,
//! writing with verification, syncing, setting attributes and allocating. Afterwards: no
//! integrity alarm, no EIO, the daemon still serving, fsck clean after the unmount, and a
//! reference tree written before the run reads back after a remount.
//!
//! Needs stress-ng (`scripts/test.sh` and `.ci/run` install it). Without it the test says
//! so and counts as skipped, unless INTACT_REQUIRE_ALL=1 (CI), where it fails.
//! INTACT_STRESS_SECS sets the run per scheme (default 15, which keeps CI inside its time;
//! `scripts/stress.sh` runs 600).

mod common;
use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PW: &str = "stress test password";
const BIN: &str = env!("CARGO_BIN_EXE_intact");

/// The stressors the issue names, 2 instances each.
const STRESSORS: &[&str] = &[
    "dir",
    "dentry",
    "rename",
    "link",
    "symlink",
    "hdd",
    "xattr",
    "fallocate",
    "getdent",
    "filename",
    "open",
    "chdir",
    "seek",
    "sync-file",
    "io",
    "flock",
    "lockf",
    "utime",
    "chmod",
];

fn cli(root: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("--volume")
        .arg(root.join("cipher"))
        .arg("--state")
        .arg(root.join("state"))
        .args(args)
        .env("INTACT_PASSWORD", PW)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `intact mount -f` with its log in `log`.
fn mount(root: &Path, log: &Path) -> Child {
    let logf = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut child = Command::new(BIN)
        .arg("--state")
        .arg(root.join("state"))
        .arg("mount")
        .arg(root.join("cipher"))
        .arg(root.join("mnt"))
        .arg("-f")
        .env("INTACT_PASSWORD", PW)
        .env("INTACT_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(logf))
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !is_mounted(&root.join("mnt")) {
        if let Some(s) = child.try_wait().unwrap() {
            panic!(
                "mount exited with {s}: {}",
                fs::read_to_string(log).unwrap()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "mount did not appear"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn unmount(root: &Path, mut child: Child, log: &Path) {
    let (ok, status) = unmount_or_kill(&root.join("mnt"), &mut child, 200);
    let logtext = fs::read_to_string(log).unwrap_or_default();
    assert!(ok, "unmount failed; log:\n{logtext}");
    assert!(
        status.success(),
        "the daemon exited with {status}; log:\n{logtext}"
    );
}

/// The reference tree: a few directories of files of awkward sizes.
fn reference(mnt: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let sizes = [0usize, 1, 4095, 4096, 4097, 70_000, 1 << 20];
    let mut files = Vec::new();
    for d in 0..3 {
        for (k, s) in sizes.iter().enumerate() {
            let rel = PathBuf::from(format!("ref/d{d}/f{k}"));
            files.push((rel, pattern((d * 100 + k) as u64, *s)));
        }
    }
    for (rel, data) in &files {
        fs::create_dir_all(mnt.join(rel).parent().unwrap()).unwrap();
        fs::write(mnt.join(rel), data).unwrap();
    }
    files
}

fn check_reference(mnt: &Path, files: &[(PathBuf, Vec<u8>)]) {
    for (rel, data) in files {
        let got = fs::read(mnt.join(rel)).unwrap_or_else(|e| panic!("{}: {e}", rel.display()));
        assert!(got == *data, "{} differs", rel.display());
    }
}

fn stress_one(stress: &Path, scheme: &str, secs: u64) {
    let tmp = tempfile::Builder::new()
        .prefix("intact-stress-")
        .tempdir()
        .unwrap();
    let root = tmp.path().canonicalize().unwrap();
    fs::create_dir(root.join("mnt")).unwrap();
    let root_s = root.join("cipher");
    let (code, _, err) = cli(
        &root,
        &[
            "init",
            root_s.to_str().unwrap(),
            "--scheme",
            scheme,
            "--kdf-memory",
            "64",
            "--kdf-passes",
            "1",
        ],
    );
    assert_eq!(code, 0, "init: {err}");
    let log = root.join("mount.log");
    let child = mount(&root, &log);
    let mnt = root.join("mnt");
    let files = reference(&mnt);
    fs::create_dir(mnt.join("s")).unwrap();
    let mut cmd = Command::new(stress);
    cmd.arg("--temp-path").arg(mnt.join("s"));
    for s in STRESSORS {
        cmd.arg(format!("--{s}")).arg("2");
    }
    cmd.args(["--verify", "--timeout"])
        .arg(format!("{secs}s"))
        .args(["--metrics-brief"]);
    let started = Instant::now();
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{scheme}: stress-ng ran {:.1} s, exit {:?}\n{}",
        started.elapsed().as_secs_f64(),
        out.status.code(),
        text.lines()
            .filter(|l| l.contains("metrc") || l.contains("fail"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let logtext = fs::read_to_string(&log).unwrap_or_default();
    // Exit 7 is stress-ng's "metrics untrustworthy": a stressor's bogo-op counter was not
    // ready when the run ended (seen with flock on a loaded machine). It says nothing of
    // the file system; every check below still applies, and the run must have completed.
    let metrics_only = out.status.code() == Some(7) && text.contains("successful run completed");
    assert!(
        out.status.success() || metrics_only,
        "{scheme}: stress-ng failed:\n{text}\nmount log:\n{logtext}"
    );
    for bad in ["errno=5 ", "Input/output error"] {
        assert!(
            !text.contains(bad),
            "{scheme}: EIO seen by stress-ng:\n{text}"
        );
    }
    assert!(is_mounted(&mnt), "{scheme}: the mount went away");
    // The daemon still serves, and has seen no integrity failure.
    check_reference(&mnt, &files);
    let (code, out_s, err) = cli(&root, &["--json", "stat"]);
    assert_eq!(code, 0, "{err}");
    let st: serde_json::Value = serde_json::from_str(&out_s).unwrap();
    assert_eq!(
        st["mount"]["integrity_failures"], 0,
        "{scheme}: integrity alarms:\n{logtext}"
    );
    unmount(&root, child, &log);
    let logtext = fs::read_to_string(&log).unwrap_or_default();
    for l in logtext.lines() {
        assert!(
            !l.contains("ERROR") && !l.contains("integrity failure"),
            "{scheme}: {l}"
        );
    }
    let (code, out_f, err) = cli(&root, &["fsck"]);
    assert_eq!(code, 0, "{scheme}: fsck after the run: {out_f}{err}");
    let child = mount(&root, &log);
    check_reference(&mnt, &files);
    unmount(&root, child, &log);
}

#[test]
fn stress_ng_file_system_stressors_every_fresh_scheme() {
    let Some(stress) = which("stress-ng") else {
        assert!(
            std::env::var("INTACT_REQUIRE_ALL").as_deref() != Ok("1"),
            "stress-ng is not installed (scripts/test.sh installs it)"
        );
        eprintln!("SKIPPED: stress-ng is not installed (scripts/test.sh installs it)");
        return;
    };
    let secs: u64 = std::env::var("INTACT_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let schemes = std::env::var("INTACT_STRESS_SCHEMES").unwrap_or_else(|_| {
        "mt-eint,mt-eint-cbc,rand-eint,comp-eint,comp-eint-zstd,mac-tree".to_string()
    });
    for scheme in schemes.split(',') {
        stress_one(&stress, scheme, secs);
    }
}
