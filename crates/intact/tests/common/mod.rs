//! Helpers shared by the mount tests (`fuse.rs`, `stress.rs`).

use std::path::{Path, PathBuf};

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
