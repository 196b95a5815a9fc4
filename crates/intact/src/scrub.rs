//! `intact scrub`: verify every block of every file at a chosen rate, on every core, and
//! resume where an interrupted run stopped (a cursor in the state directory). A mount runs
//! it in the background with `--scrub-every` (docs/design.md, "Scrub").
//!
//! Directories and inode records are verified by the walk that lists the files (reading a
//! directory verifies it; so does stat of each entry); then the files' contents are read
//! and verified by `threads` workers, each through a volume of its own (the CLI opens the
//! volume once per worker, read-only) or through the mount's.

use anyhow::{Context, Result};
use intact_core::volume::Kind;
use intact_core::Volume;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How to scrub.
#[derive(Clone, Debug)]
pub struct ScrubOpts {
    /// Bytes per second at most, over all workers (`None`: as fast as it goes).
    pub rate: Option<f64>,
    /// Stop (and keep the cursor) once this many bytes were verified in this run.
    pub limit: Option<u64>,
    /// Forget the cursor and start over.
    pub restart: bool,
}

/// Where an interrupted scrub goes on: every file whose path sorts before `below` is done,
/// and so are those in `done`; a file in `partial` is done up to that byte offset.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Cursor {
    /// The volume it belongs to.
    pub volume_id: String,
    /// When this pass began (seconds since 1970).
    pub started_unix: u64,
    /// Every file path that sorts before this one is verified.
    pub below: String,
    /// Files at or after `below` already verified.
    pub done: BTreeSet<String>,
    /// Files verified up to an offset.
    pub partial: BTreeMap<String, u64>,
    /// Bytes verified in this pass so far, over all runs.
    pub bytes: u64,
}

/// One block (or structure) that failed.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// The file, directory or structure.
    pub path: String,
    /// The block, where one applies.
    pub block: Option<u64>,
    /// What failed (the engine's error).
    pub what: String,
}

impl Failure {
    fn of(path: &str, e: &intact_core::Error) -> Failure {
        Failure {
            path: path.to_string(),
            block: match e {
                intact_core::Error::Tampered { block, .. } => *block,
                _ => None,
            },
            what: e.to_string(),
        }
    }
}

/// What a run did.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Files in the volume.
    pub files: usize,
    /// Directories walked (each one verified).
    pub directories: usize,
    /// Bytes of file contents verified in this run.
    pub bytes_verified: u64,
    /// Bytes verified in this pass, over all its runs.
    pub pass_bytes: u64,
    /// Whether the pass is complete (else the cursor is kept).
    pub complete: bool,
    /// Whether this run resumed a pass.
    pub resumed: bool,
    /// Seconds this run took.
    pub seconds: f64,
    /// Everything that failed.
    pub failures: Vec<Failure>,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The cursor file of a volume's state directory.
pub fn cursor_path(state_dir: &Path) -> PathBuf {
    state_dir.join("scrub.cursor")
}

/// Where the last complete pass is recorded (beside the cursor).
pub fn last_path(cursor_file: &Path) -> PathBuf {
    cursor_file.with_file_name("scrub.last")
}

/// When the last complete pass ended (seconds since 1970).
pub fn last_completed(cursor_file: &Path) -> Option<u64> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(last_path(cursor_file)).ok()?).ok()?;
    v["completed_unix"].as_u64()
}

/// A period: `7d`, `12h`, `30m`, `45s` or seconds.
pub fn parse_period(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: want a number with d, h, m or s (7d)"))?;
    let unit = match unit {
        'd' => 86_400,
        'h' => 3_600,
        'm' => 60,
        's' => 1,
        _ => return Err(format!("{s:?}: the unit is d, h, m or s")),
    };
    match n.checked_mul(unit) {
        Some(0) | None => Err(format!("{s:?}: out of range")),
        Some(secs) => Ok(Duration::from_secs(secs)),
    }
}

/// The mount's background scrub (`--scrub-every`): a pass when the last complete one is
/// older than `every`, at `rate`, through the mounted volume; an unmount stops it (the
/// cursor keeps its place). Failures are logged at ERROR, as the mount's own are.
pub fn background(
    vol: Arc<Volume>,
    state_dir: PathBuf,
    every: Duration,
    rate: Option<f64>,
    stop: Arc<AtomicBool>,
    on_failure: impl Fn(&Failure) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("intact-scrub".into())
        .spawn(move || {
            let cursor = cursor_path(&state_dir);
            let id = match vol.info() {
                Ok(i) => i.volume_id,
                Err(e) => return tracing::error!(error = %e, "scrub: no volume facts"),
            };
            while !stop.load(Ordering::Relaxed) {
                let due = last_completed(&cursor)
                    .map_or(0, |t| t.saturating_add(every.as_secs()));
                if now_unix() < due {
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
                tracing::info!("scrub: a pass begins (or goes on)");
                let opts = ScrubOpts {
                    rate,
                    limit: None,
                    restart: false,
                };
                match scrub(std::slice::from_ref(&vol), &id, &cursor, &opts, &stop, &|_, _| {}) {
                    Ok(r) => {
                        for f in &r.failures {
                            tracing::error!(path = %f.path, error = %f.what, "scrub: integrity failure");
                            on_failure(f);
                        }
                        tracing::info!(
                            bytes = r.bytes_verified,
                            complete = r.complete,
                            failures = r.failures.len(),
                            "scrub: pass ended"
                        );
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "scrub failed; again in an hour");
                        for _ in 0..7200 {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                }
            }
        })
}

fn load_cursor(path: &Path, volume_id: &str) -> Option<Cursor> {
    let c: Cursor = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    (c.volume_id == volume_id).then_some(c)
}

fn save_cursor(path: &Path, c: &Cursor) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(c)?)
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing {}", path.display()))
}

/// Every file (path, size) under the root, sorted by path. On the way, verifies the inode
/// table, every directory, every record, symlink and extended-attribute set (failures go
/// to `failures`).
fn walk(vol: &Volume, failures: &mut Vec<Failure>) -> Result<(Vec<(String, u64)>, usize)> {
    for f in vol.verify_inode_table()? {
        failures.push(Failure {
            path: f.path,
            block: f.block,
            what: f.what,
        });
    }
    let mut files = Vec::new();
    let mut dirs = 0;
    let mut stack = vec!["/".to_string()];
    while let Some(d) = stack.pop() {
        dirs += 1;
        let entries = match vol.readdir(&d) {
            Ok(e) => e,
            Err(e) if e.is_tampered() => {
                failures.push(Failure::of(&d, &e));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for e in entries {
            let p = crate::join(&d, &e.name);
            let checked = vol.stat(&p).and_then(|st| {
                // The extended attributes (the set is read and verified whole to list its
                // names) and a symlink's target.
                vol.listxattr(st.ino)?;
                if e.kind == Kind::Symlink {
                    vol.readlink(&p)?;
                }
                Ok(st)
            });
            match checked {
                Ok(st) => match e.kind {
                    Kind::Dir => stack.push(p),
                    Kind::File => files.push((p, st.size)),
                    _ => {}
                },
                Err(err) if err.is_tampered() => failures.push(Failure::of(&p, &err)),
                Err(err) => return Err(err.into()),
            }
        }
    }
    files.sort();
    Ok((files, dirs))
}

/// Holds every worker to `rate` bytes per second in total.
struct Pace {
    rate: Option<f64>,
    start: Instant,
    bytes: AtomicU64,
}

impl Pace {
    /// Counts `n` bytes and waits until they are due, or until `halted`.
    fn take(&self, n: u64, halted: &dyn Fn() -> bool) {
        let total = self.bytes.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(rate) = self.rate {
            let due = Duration::from_secs_f64(total as f64 / rate);
            loop {
                let elapsed = self.start.elapsed();
                if due <= elapsed || halted() {
                    return;
                }
                std::thread::sleep((due - elapsed).min(Duration::from_millis(50)));
            }
        }
    }
}

/// Scrubs the volume through `vols` (one per worker; they may be the same volume). `stop`
/// ends the run early, keeping the cursor; `progress` hears of every verified chunk.
pub fn scrub(
    vols: &[Arc<Volume>],
    volume_id: &str,
    cursor_file: &Path,
    opts: &ScrubOpts,
    stop: &AtomicBool,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Report> {
    let t0 = Instant::now();
    let mut failures = Vec::new();
    let (files, directories) = walk(&vols[0], &mut failures)?;
    let saved = if opts.restart {
        None
    } else {
        load_cursor(cursor_file, volume_id)
    };
    let resumed = saved.is_some();
    // Bytes verified by the earlier runs of this pass.
    let base = saved.as_ref().map_or(0, |c| c.bytes);
    let cursor = Mutex::new(saved.unwrap_or_else(|| Cursor {
        volume_id: volume_id.to_string(),
        started_unix: now_unix(),
        ..Cursor::default()
    }));
    // What is left: (path, from, size).
    let todo: Vec<(String, u64, u64)> = {
        let c = cursor.lock().unwrap();
        files
            .iter()
            .filter(|(p, _)| *p >= c.below && !c.done.contains(p))
            .map(|(p, size)| (p.clone(), c.partial.get(p).copied().unwrap_or(0), *size))
            .collect()
    };
    let left: u64 = todo
        .iter()
        .map(|(_, from, size)| size.saturating_sub(*from))
        .sum();
    progress(0, left);
    let pace = Pace {
        rate: opts.rate,
        start: Instant::now(),
        bytes: AtomicU64::new(0),
    };
    let next = AtomicUsize::new(0);
    let verified = AtomicU64::new(0);
    let found = Mutex::new(Vec::new());
    let limit_hit = AtomicBool::new(false);
    let halted = || stop.load(Ordering::Relaxed) || limit_hit.load(Ordering::Relaxed);
    let work = |vol: &Volume| -> Result<()> {
        let bs = u64::from(vol.block_size());
        let mut buf = vec![0u8; 1 << 20];
        loop {
            if halted() {
                return Ok(());
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((path, from, size)) = todo.get(i) else {
                return Ok(());
            };
            let mut off = *from;
            while off < *size {
                if halted() {
                    cursor.lock().unwrap().partial.insert(path.clone(), off);
                    return Ok(());
                }
                let n = (*size - off).min(buf.len() as u64) as usize;
                match vol.read_path(path, off, &mut buf[..n]) {
                    Ok(_) => {}
                    Err(e) if e.is_tampered() => {
                        // Name every failing block.
                        let mut b = off;
                        while b < off + n as u64 {
                            let m = (off + n as u64 - b).min(bs) as usize;
                            if let Err(e) = vol.read_path(path, b, &mut buf[..m]) {
                                if !e.is_tampered() {
                                    return Err(e.into());
                                }
                                found.lock().unwrap().push(Failure::of(path, &e));
                            }
                            b += m as u64;
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
                off += n as u64;
                let total = verified.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
                progress(n as u64, left);
                pace.take(n as u64, &halted);
                if opts.limit.is_some_and(|l| total >= l) {
                    limit_hit.store(true, Ordering::Relaxed);
                }
            }
            let mut c = cursor.lock().unwrap();
            c.partial.remove(path);
            c.done.insert(path.clone());
            // Move the watermark over what is done in order.
            let mut k = files.partition_point(|(p, _)| *p < c.below);
            while let Some((p, _)) = files.get(k) {
                if !c.done.remove(p) {
                    break;
                }
                k += 1;
            }
            c.below = files
                .get(k)
                .map(|(p, _)| p.clone())
                .unwrap_or_else(|| "\u{10FFFF}".into());
        }
    };
    let saver_done = AtomicBool::new(false);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let saver = s.spawn(|| {
            // Keeps the cursor on disk about once a second.
            while !saver_done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let mut c = cursor.lock().unwrap();
                c.bytes = base + verified.load(Ordering::Relaxed);
                let _ = save_cursor(cursor_file, &c);
            }
        });
        let hs: Vec<_> = vols.iter().map(|v| s.spawn(|| work(v))).collect();
        let r = hs.into_iter().map(|h| h.join().expect("worker")).collect();
        saver_done.store(true, Ordering::Relaxed);
        saver.join().expect("saver");
        r
    });
    for r in results {
        r?;
    }
    failures.extend(found.into_inner().unwrap());
    let run_bytes = verified.load(Ordering::Relaxed);
    let mut c = cursor.into_inner().unwrap();
    let complete = next.load(Ordering::Relaxed) >= todo.len() && c.partial.is_empty() && !halted();
    let pass_bytes = base + run_bytes;
    c.bytes = pass_bytes;
    if complete {
        let _ = std::fs::remove_file(cursor_file);
        let last = serde_json::json!({
            "completed_unix": now_unix(),
            "started_unix": c.started_unix,
            "bytes": pass_bytes,
            "files": files.len(),
            "failures": failures.len(),
        });
        std::fs::write(last_path(cursor_file), last.to_string())
            .with_context(|| format!("writing {}", last_path(cursor_file).display()))?;
    } else {
        save_cursor(cursor_file, &c)?;
    }
    Ok(Report {
        files: files.len(),
        directories,
        bytes_verified: run_bytes,
        pass_bytes,
        complete,
        resumed,
        seconds: t0.elapsed().as_secs_f64(),
        failures,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_period;
    use std::time::Duration;

    #[test]
    fn periods_parse() {
        assert_eq!(parse_period("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_period("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_period("30m"), Ok(Duration::from_secs(1_800)));
        assert_eq!(parse_period("45s"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_period("90"), Ok(Duration::from_secs(90)));
        for bad in ["", "d", "0d", "7w", "-1h", "1.5h", "99999999999999999999d"] {
            assert!(parse_period(bad).is_err(), "{bad}");
        }
    }
}
