//! Helpers shared by the mount tests (`fuse.rs`, `stress.rs`).

use std::path::{Path, PathBuf};

#[allow(dead_code)] // only the CLI tests drive volumes this way
pub mod vol;

#[allow(dead_code)] // only the S3 tests start a server
pub mod garage;

/// Deterministic pseudo-random bytes (xorshift) for `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Whether a FUSE file system is mounted at `mnt`.
pub fn is_mounted(mnt: &Path) -> bool {
    let m = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = mnt.to_str().unwrap();
    m.lines()
        .any(|l| l.split(' ').nth(4) == Some(p) && l.contains("fuse"))
}

/// The executable `tool` on PATH, if any.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// The tools a test needs, or why it cannot run.
#[allow(dead_code)] // not every test binary needs a tool
pub fn need(tools: &[&str]) -> bool {
    for t in tools {
        if which(t).is_none() {
            assert!(
                std::env::var("INTACT_REQUIRE_ALL").as_deref() != Ok("1"),
                "{t} is not installed (scripts/test.sh installs it)"
            );
            eprintln!("SKIPPED: {t} is not installed (scripts/test.sh installs it)");
            return false;
        }
    }
    true
}

/// Unmounts `mnt` as a user would (`fusermount3 -u`, retried while it is busy, up to
/// `tries` times 50 ms); when that fails, detaches it lazily and kills `daemon`. Returns
/// whether the plain unmount worked; `daemon` is reaped either way.
pub fn unmount_or_kill(
    mnt: &Path,
    daemon: &mut std::process::Child,
    tries: usize,
) -> (bool, std::process::ExitStatus) {
    use std::process::{Command, Stdio};
    let mut ok = false;
    for _ in 0..tries {
        let s = Command::new("fusermount3")
            .arg("-u")
            .arg(mnt)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        if s.success() {
            ok = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if !ok {
        detach(mnt);
        let _ = daemon.kill();
    }
    (ok, daemon.wait().unwrap())
}

/// Detaches a mount whose daemon is gone (`fusermount3 -uz`).
pub fn detach(mnt: &Path) {
    let _ = std::process::Command::new("fusermount3")
        .arg("-uz")
        .arg(mnt)
        .status();
}
