//! What a user can do after an alarm (README, "When intact raises an alarm"): see what the
//! anchor and the cipher directory each hold (`info`), look at the cipher directory's own
//! state without trusting it (`--accept-stale`), accept it on purpose (`accept-store`),
//! copy out what still authenticates (`fsck --salvage`), and verify everything at a rate
//! (`scrub`).

use crate::{locate, password, print_json, Cli};
use anyhow::{bail, Context, Result};
use intact_core::store::LocalStateDir;
use intact_core::volume::{utc, Seal, StateReport, StoreCopy, Verdict};
use intact_core::Volume;
use std::io::{IsTerminal, Write};

/// What the trusted anchor and the cipher directory each say (without opening the volume).
pub fn state_report(cli: &Cli) -> Result<StateReport> {
    let (store, state) = locate(cli)?;
    let trusted = crate::trusted(cli, &state, &store)?;
    let pw = password(cli, false)?;
    Ok(Volume::state_report(
        store.as_ref(),
        trusted.as_ref(),
        pw.as_bytes(),
    )?)
}

fn seal_text(s: &Seal) -> String {
    match s.stored_unix {
        Some(t) => format!("epoch {}, stored {}", s.epoch, utc(t)),
        None => format!("epoch {}", s.epoch),
    }
}

/// The two seals, for `intact info` (`opened`: whether the volume opened, so that the
/// anchor's state was found in the store).
pub fn print_seals(r: &StateReport, opened: bool) {
    match &r.anchor {
        Some(s) => println!("anchor's seal:      {}", seal_text(s)),
        None => println!("anchor's seal:      (no anchor)"),
    }
    match &r.store {
        StoreCopy::Authentic { seal } => {
            println!(
                "store's seal:       {} (its copy of the anchor)",
                seal_text(seal)
            )
        }
        StoreCopy::Missing => println!("store's seal:       unknown (no copy of the anchor)"),
        StoreCopy::NotAuthentic { why } => {
            println!("store's seal:       unknown (its copy of the anchor: {why})")
        }
    }
    let state = match r.verdict {
        Verdict::Same => "the anchor's",
        // The copy is written after the anchor, and not when a session starts a log
        // segment: a crash between them leaves it behind, harmlessly.
        _ if opened => "the anchor's (its copy of the anchor lags behind: harmless)",
        Verdict::StoreOlder => "OLDER than the anchor's",
        Verdict::StoreNewer => "NEWER than the anchor's",
        Verdict::Diverged => "ANOTHER state of the same epoch",
        Verdict::Unknown => "unknown",
        Verdict::NoAnchor => "unknown (no anchor)",
    };
    println!("store's state:      {state}");
    if !r.conflicts.is_empty() {
        println!(
            "conflict copies:    {} (left by a sync tool: {})",
            r.conflicts.len(),
            r.conflicts.join(", ")
        );
    }
}

/// `intact info` when the volume does not open: the report, then the failure.
pub fn print_report(cli: &Cli, r: &StateReport, err: &anyhow::Error) -> Result<()> {
    if cli.json {
        print_json(&serde_json::json!({
            "volume_id": r.volume_id,
            "state": r,
            "error": format!("{err:#}"),
        }))?;
    } else {
        println!("volume:             {}", r.volume_id);
        println!("anchor:             {}", r.anchor_location);
        print_seals(r, false);
    }
    Ok(())
}

/// A missing anchor, explained: when the state directory holds the anchors of other
/// volumes, the cipher directory is likely another volume than the one meant.
pub fn other_volumes(cli: &Cli, dir: &std::path::Path, e: intact_core::Error) -> anyhow::Error {
    let base = crate::state_dir(cli);
    let mut others: Vec<String> = std::fs::read_dir(&base)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| d.path().join("anchor").is_file())
        .filter_map(|d| d.file_name().into_string().ok())
        .collect();
    others.sort();
    if others.is_empty() {
        return e.into();
    }
    anyhow::Error::from(e).context(format!(
        "{} is a volume this state directory ({}) has never sealed; it holds the \
         anchors of {} other volume(s) ({}). If you meant one of those, this cipher directory \
         is another volume (a copy from another machine, or a foreign one); point --volume \
         at the right one, or --state at this volume's state directory",
        dir.display(),
        base.display(),
        others.len(),
        others.join(", ")
    ))
}

/// The warning every `--accept-stale` command prints.
pub fn warn_stale(vol: &Volume) {
    let epoch = vol
        .info()
        .map(|i| format!(" (epoch {})", i.epoch))
        .unwrap_or_default();
    eprintln!(
        "intact: WARNING: --accept-stale: this is the cipher directory's own state{epoch}, \
         authentic under your password but maybe not the latest (it may be older or newer \
         than the one the trusted anchor names). Read-only: nothing is written."
    );
}

/// Appends one JSON line to the state directory's audit log.
fn audit(state: &LocalStateDir, entry: &serde_json::Value) -> Result<std::path::PathBuf> {
    let path = state.volume_dir().join("audit.log");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{entry}")?;
    f.sync_all()?;
    Ok(path)
}

/// `intact accept-store`.
pub fn accept_store(cli: &Cli, yes: bool) -> Result<()> {
    let (store, state) = locate(cli)?;
    let trusted = crate::trusted(cli, &state, &store)?;
    let pw = password(cli, false)?;
    let report = Volume::state_report(store.as_ref(), trusted.as_ref(), pw.as_bytes())?;
    let (Some(anchor), StoreCopy::Authentic { seal }) = (&report.anchor, &report.store) else {
        bail!(
            "nothing to accept: {}",
            match (&report.anchor, &report.store) {
                (None, _) =>
                    "there is no trusted anchor (see `intact recover-anchor --help`)".to_string(),
                (_, StoreCopy::Missing) =>
                    "the cipher directory has no copy of the anchor: its state is unknown".into(),
                (_, StoreCopy::NotAuthentic { why }) =>
                    format!("the cipher directory's copy of the anchor is not authentic ({why})"),
                _ => unreachable!("matched above"),
            }
        );
    };
    if report.verdict == Verdict::Same {
        bail!(
            "nothing to accept: the cipher directory is at the state the trusted anchor names \
             ({}); if files fail, `intact fsck` names them and `intact fsck --salvage DIR` \
             copies out what authenticates",
            seal_text(anchor)
        );
    }
    let lost = match report.verdict {
        Verdict::StoreOlder => format!(
            "Everything sealed after the cipher directory's epoch {} up to the anchor's epoch \
             {} is given up (which files changed in between is not known: that state is no \
             longer in the cipher directory).",
            seal.epoch, anchor.epoch
        ),
        Verdict::StoreNewer => "The cipher directory's state is newer: nothing sealed here is \
                                given up, but its changes were not sealed by this machine."
            .to_string(),
        _ => format!(
            "The state sealed here at epoch {} is given up for the cipher directory's.",
            anchor.epoch
        ),
    };
    eprintln!(
        "Trusted anchor: {}.\nCipher directory: {}.\n{lost}\nThe current anchor is kept in the \
         state directory, and the change recorded in its audit log.",
        seal_text(anchor),
        seal_text(seal)
    );
    if !yes {
        if !std::io::stdin().is_terminal() {
            bail!("not confirmed: run it on a terminal, or with --yes");
        }
        eprint!("Type 'accept' to accept the cipher directory's state: ");
        std::io::stderr().flush()?;
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        if line.trim() != "accept" {
            bail!("not confirmed: nothing changed");
        }
    }
    let dir = state.volume_dir().to_path_buf();
    let mut kept = None;
    let done = Volume::accept_store(store, trusted.as_ref(), pw.as_bytes(), |old, epoch| {
        let name = format!(
            "anchor.replaced-epoch{epoch}-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        );
        let path = dir.join(name);
        let r = std::fs::write(&path, old)
            .and_then(|()| std::fs::File::open(&path)?.sync_all())
            .map_err(|e| intact_core::Error::Io {
                what: path.display().to_string(),
                source: e,
            });
        kept = Some(path);
        r
    })
    .map_err(|e| match e {
        intact_core::Error::Locked(w) => {
            anyhow::anyhow!("refused while the volume is open ({w}): unmount it first")
        }
        e => e.into(),
    })?;
    let kept = kept.expect("kept before the new anchor");
    let user = std::env::var("USER").unwrap_or_default();
    // SAFETY: getuid takes no argument and cannot fail.
    let uid = unsafe { libc::getuid() };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let log = audit(
        &state,
        &serde_json::json!({
            "event": "accept-store",
            "time_unix": now,
            "time": utc(now),
            "user": user,
            "uid": uid,
            "verdict": done.report.verdict,
            "old_epoch": done.old_epoch,
            "store_epoch": seal.epoch,
            "new_epoch": done.new_epoch,
            "old_root": done.old_root,
            "new_root": done.new_root,
            "kept_anchor": kept.display().to_string(),
        }),
    )?;
    if cli.json {
        print_json(&serde_json::json!({
            "accepted": true,
            "old_epoch": done.old_epoch,
            "new_epoch": done.new_epoch,
            "kept_anchor": kept.display().to_string(),
            "audit_log": log.display().to_string(),
        }))?;
    } else {
        println!(
            "accepted the cipher directory's state: the anchor is now at epoch {} (the one \
             replaced, epoch {}, is kept in {}; recorded in {})",
            done.new_epoch,
            done.old_epoch,
            kept.display(),
            log.display()
        );
    }
    Ok(())
}

/// One file `fsck --salvage` could not copy whole.
#[derive(Debug, serde::Serialize)]
pub struct Damaged {
    /// Its path in the volume.
    pub path: String,
    /// Byte ranges `[start, end)` that did not authenticate (holes in the copy), or the
    /// whole file when its record or directory failed.
    pub ranges: Vec<(u64, u64)>,
    /// What failed first.
    pub what: String,
    /// Where it was moved (`--quarantine`).
    pub quarantined: Option<String>,
}

/// Copies one file out: every block that authenticates; the others become holes.
fn salvage_file(
    vol: &Volume,
    path: &str,
    size: u64,
    out: &std::path::Path,
) -> Result<Option<Damaged>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    f.set_len(size)?;
    let bs = vol.block_size() as u64;
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut first_error = None;
    let mut bad = |start: u64, end: u64, e: &intact_core::Error| {
        first_error.get_or_insert_with(|| e.to_string());
        match ranges.last_mut() {
            Some(r) if r.1 == start => r.1 = end,
            _ => ranges.push((start, end)),
        }
    };
    let mut off = 0;
    while off < size {
        let n = (size - off).min(CHUNK) as usize;
        match vol.read_path(path, off, &mut buf[..n]) {
            Ok(k) => f.write_all_at(&buf[..k], off)?,
            Err(e) if e.is_tampered() => {
                // Block by block: keep every one that authenticates.
                let mut b = off;
                while b < off + n as u64 {
                    let m = (off + n as u64 - b).min(bs) as usize;
                    match vol.read_path(path, b, &mut buf[..m]) {
                        Ok(k) => f.write_all_at(&buf[..k], b)?,
                        Err(e) if e.is_tampered() => bad(b, b + m as u64, &e),
                        Err(e) => return Err(e.into()),
                    }
                    b += m as u64;
                }
            }
            Err(e) => return Err(e.into()),
        }
        off += n as u64;
    }
    f.sync_all()?;
    Ok(first_error.map(|what| Damaged {
        path: path.to_string(),
        ranges,
        what,
        quarantined: None,
    }))
}

/// `intact fsck --salvage DIR`: copies every file of the volume into `dir` (directories,
/// files, symlinks), keeping every block that authenticates, and returns what was damaged.
/// With `quarantine` (a writable volume), each damaged file is then moved to
/// `/lost+found` in the volume.
pub fn salvage(
    vol: &Volume,
    dir: &std::path::Path,
    quarantine: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<Damaged>> {
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        bail!(
            "{}: not empty (salvage writes into an empty directory)",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)?;
    let mut damaged = Vec::new();
    let mut stack = vec!["/".to_string()];
    while let Some(d) = stack.pop() {
        let entries = match vol.readdir(&d) {
            Ok(e) => e,
            Err(e) if e.is_tampered() => {
                damaged.push(Damaged {
                    path: d.clone(),
                    ranges: vec![(0, u64::MAX)],
                    what: format!("directory unreadable, its entries are lost: {e}"),
                    quarantined: None,
                });
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for e in entries {
            let p = crate::join(&d, &e.name);
            let local = dir.join(p.trim_start_matches('/'));
            let whole = |what: String| Damaged {
                path: p.clone(),
                ranges: vec![(0, u64::MAX)],
                what,
                quarantined: None,
            };
            match e.kind {
                intact_core::volume::Kind::Dir => {
                    std::fs::create_dir_all(&local)?;
                    stack.push(p.clone());
                }
                intact_core::volume::Kind::File => match vol.stat(&p) {
                    Ok(st) => {
                        if let Some(d) = salvage_file(vol, &p, st.size, &local)? {
                            damaged.push(d);
                        }
                        progress(st.size);
                    }
                    Err(err) if err.is_tampered() => damaged.push(whole(err.to_string())),
                    Err(err) => return Err(err.into()),
                },
                intact_core::volume::Kind::Symlink => match vol.readlink(&p) {
                    Ok(t) => std::os::unix::fs::symlink(t, &local)?,
                    Err(err) if err.is_tampered() => damaged.push(whole(err.to_string())),
                    Err(err) => return Err(err.into()),
                },
                // FIFOs, sockets and device nodes hold no data.
                _ => {}
            }
        }
    }
    if quarantine && !damaged.is_empty() {
        if vol.stat("/lost+found").is_err() {
            vol.mkdir("/lost+found")?;
        }
        for d in damaged.iter_mut() {
            if d.path == "/" || d.path.starts_with("/lost+found/") {
                continue;
            }
            let to = format!(
                "/lost+found/{}",
                d.path.trim_start_matches('/').replace('/', "%")
            );
            vol.rename(&d.path, &to)?;
            d.quarantined = Some(to);
        }
        vol.sync()?;
    }
    Ok(damaged)
}
