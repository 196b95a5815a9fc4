//! `intact mount`: opens the volume, then serves it through the FUSE adapter, in the
//! foreground (`-f`) or as a daemon. The daemon is this program started again with
//! `--daemon-child`: it gets the password on a pipe (never in argv or the environment) and
//! reports "ready" (or the error and its exit code) on another, so the parent exits only
//! once the mount is live — as gocryptfs and CryFS do.

use crate::{exit_code, locate_at, password, state_dir, Cli, Cmd};
use anyhow::{bail, Context, Result};
use intact_core::format::SchemeId;
use intact_core::store::{FaultPlan, FaultStore, UntrustedStore};
use intact_core::{Options, Volume};
use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `intact mount` (see `Cmd::Mount`).
pub struct MountArgs<'a> {
    pub cipherdir: &'a Path,
    pub mountpoint: &'a Path,
    pub foreground: bool,
    pub allow_other: bool,
    pub ro: bool,
    /// `--follow`: how long a failed read waits for the writer's next root.
    pub follow: Option<Duration>,
    pub scheme: Option<&'a str>,
    pub threads: usize,
    pub commit_interval: u64,
    pub xattr_max_bytes: usize,
    pub log: Option<&'a Path>,
    pub direct_io: bool,
    pub on_alarm: Option<&'a str>,
    pub scrub_every: Option<Duration>,
    pub scrub_rate: f64,
    pub daemon_child: bool,
}

impl<'a> MountArgs<'a> {
    /// The arguments of a parsed `mount` command, with its cipher directory and mount
    /// point as the caller resolved them (`None` for another command).
    pub fn of(cmd: &'a Cmd, cipherdir: &'a Path, mountpoint: &'a Path) -> Option<Self> {
        let Cmd::Mount {
            cipherdir: _,
            mountpoint: _,
            foreground,
            allow_other,
            ro,
            follow,
            scheme,
            threads,
            commit_interval,
            xattr_max_bytes,
            log,
            direct_io,
            on_alarm,
            scrub_every,
            scrub_rate,
            daemon_child,
        } = cmd
        else {
            return None;
        };
        Some(MountArgs {
            cipherdir,
            mountpoint,
            foreground: *foreground,
            allow_other: *allow_other,
            ro: *ro,
            follow: follow.map(Duration::from_secs),
            scheme: scheme.as_deref(),
            threads: *threads,
            commit_interval: *commit_interval,
            xattr_max_bytes: *xattr_max_bytes,
            log: log.as_deref(),
            direct_io: *direct_io,
            on_alarm: on_alarm.as_deref(),
            scrub_every: *scrub_every,
            scrub_rate: *scrub_rate,
            daemon_child: *daemon_child,
        })
    }
}

/// The status file a mount keeps beside its anchor (read by `intact stat`).
pub fn status_path(state: &intact_core::store::LocalStateDir) -> PathBuf {
    state.volume_dir().join("mount.json")
}

/// Opens the volume to mount: the trusted state, or with `--accept-stale` (and `--ro`) the
/// cipher directory's own state, with the warning in the log.
fn open_for_mount(
    cli: &Cli,
    a: &MountArgs,
    store: Arc<dyn UntrustedStore>,
    state: intact_core::store::LocalStateDir,
    pw: &[u8],
) -> Result<Volume> {
    let opts = Options {
        cache_bytes: default_cache(cli),
        read_only: a.ro,
        xattr_bytes_max: a.xattr_max_bytes,
        records: cli.records.unwrap_or(intact_core::volume::KEEP_OPEN),
        meta_cache_bytes: crate::meta_cache(cli),
        follow: a.follow,
    };
    crate::check_verify_only_reads(cli, a.ro)?;
    if a.follow.is_some() && (!a.ro || cli.accept_stale) {
        bail!(
            "--follow follows a writer read-only, from the trusted anchor: add --ro (and no \
             --accept-stale)"
        );
    }
    if a.follow.is_some() && a.scrub_every.is_some() {
        bail!("--scrub-every scrubs from the writer's mount, not a follower's: drop one");
    }
    let trusted = crate::trusted(cli, &state, &store)?;
    if cli.accept_stale {
        if !a.ro {
            bail!("--accept-stale mounts only read-only: add --ro");
        }
        let vol = Volume::open_stale(store, trusted, pw, &opts)?;
        crate::alarm::warn_stale(&vol);
        tracing::warn!(
            "--accept-stale: serving the cipher directory's own state, authentic but maybe \
             not the latest; read-only"
        );
        return Ok(vol);
    }
    match Volume::open(store, trusted, pw, &opts) {
        Err(e @ intact_core::Error::AnchorMissing { .. }) => {
            Err(crate::alarm::other_volumes(cli, a.cipherdir, e))
        }
        r => Ok(r?),
    }
}

/// How long a follower's kernel keeps attributes and entries (the writer changes them).
const FOLLOW_ATTR_TTL: Duration = Duration::from_secs(1);

/// The mount's default `--cache-bytes`, in the paper's unit of 32 bytes a node.
const MOUNT_CACHE_BYTES: usize = 4 << 20;

fn default_cache(cli: &Cli) -> usize {
    // A mount serves random reads for a long time: cache 4 MiB of verified nodes (131,072
    // nodes, about 11 MB in memory) unless told otherwise (the CLI's one-shot commands keep
    // the paper's 1 KiB).
    cli.cache_bytes.unwrap_or(MOUNT_CACHE_BYTES)
}

pub fn mount(cli: &Cli, a: &MountArgs) -> Result<ExitCode> {
    if !a.mountpoint.is_dir() {
        bail!("mount point {}: not a directory", a.mountpoint.display());
    }
    let auto = a.scheme == Some(intact_core::volume::AUTO);
    let scheme = a
        .scheme
        .filter(|_| !auto)
        .map(SchemeId::parse)
        .transpose()?;
    // One malloc arena, before any thread of the mount starts, so that the serving
    // process's heap stays near what it holds (intact_fuse::memory; the parent of a daemon
    // only waits for it).
    intact_fuse::memory::one_malloc_arena();
    if a.daemon_child {
        return child(cli, a, scheme);
    }
    let (store, state) = locate_at(cli, a.cipherdir)?;
    let status = status_path(&state);
    let pw = password(cli, false)?;
    if a.foreground {
        let (store, faults) = inject_faults(store)?;
        let vol = open_for_mount(cli, a, store, state, pw.as_bytes())?;
        drop(pw);
        serve(vol, a, scheme, status, true, || {
            eprintln!(
                "intact: mounted at {} (Ctrl-C to unmount)",
                a.mountpoint.display()
            );
        })?;
        report_faults(faults.as_deref());
        return Ok(ExitCode::SUCCESS);
    }
    // Daemon: start the child, hand it the password, wait for "ready".
    let log = match a.log {
        Some(l) => l.to_path_buf(),
        None => state.volume_dir().join("mount.log"),
    };
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("opening the log {}", log.display()))?;
    let exe = std::env::current_exe().context("locating the intact binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(daemon_args(cli, a, &log));
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(logf))
        .env_remove("INTACT_PASSWORD")
        // Its own process group: Ctrl-C in the terminal that mounted does not reach it.
        .process_group(0);
    let mut child = cmd.spawn().context("starting the mount daemon")?;
    {
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(pw.as_bytes())?;
        stdin.write_all(b"\n")?;
    }
    drop(pw);
    let mut line = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
    out.read_line(&mut line)?;
    let line = line.trim_end();
    if line == "ready" {
        if !cli.json {
            eprintln!(
                "intact: mounted at {} (log: {}; unmount with intact umount {})",
                a.mountpoint.display(),
                log.display(),
                a.mountpoint.display()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let status = child.wait()?;
    if let Some(rest) = line.strip_prefix("error ") {
        let (code, msg) = rest.split_once(' ').unwrap_or(("1", rest));
        eprintln!("intact: {msg}");
        return Ok(ExitCode::from(code.parse::<u8>().unwrap_or(1)));
    }
    bail!(
        "the mount daemon exited ({status}) before the mount was ready; see {}",
        log.display()
    )
}

fn child(cli: &Cli, a: &MountArgs, scheme: Option<SchemeId>) -> Result<ExitCode> {
    let report = |e: &anyhow::Error| {
        let msg = format!("{e:#}").replace('\n', " ");
        println!("error {} {msg}", exit_code(e));
        let _ = std::io::stdout().flush();
    };
    let r = (|| -> Result<_> {
        let (store, state) = locate_at(cli, a.cipherdir)?;
        let (store, faults) = inject_faults(store)?;
        let pw = password_from_parent()?;
        let status = status_path(&state);
        let vol = open_for_mount(cli, a, store, state, pw.as_bytes())?;
        Ok((vol, status, faults))
    })();
    let (vol, status, faults) = match r {
        Ok(v) => v,
        Err(e) => {
            report(&e);
            return Err(e);
        }
    };
    let r = serve(vol, a, scheme, status, false, || {
        println!("ready");
        let _ = std::io::stdout().flush();
    });
    if let Err(e) = &r {
        tracing::error!(error = %e, "mount failed");
        report(e);
    }
    report_faults(faults.as_deref());
    r.map(|()| ExitCode::SUCCESS)
}

/// The daemon's command line: every global option the parent was given but `--passfile`
/// (the password goes on a pipe) and `--json` (it shapes only the parent's message), and
/// every option of `mount` but `-f`, then `--daemon-child`. The daemon is a process of its
/// own that reads only this: a flag left out here was silently dropped (`--verify-key`,
/// `--sign-key`, `--anchor` and `--meta-cache-bytes` once were), so a test parses the line
/// back and compares it with the parent's whole parsed command.
fn daemon_args(cli: &Cli, a: &MountArgs, log: &Path) -> Vec<OsString> {
    let mut v: Vec<OsString> = Vec::new();
    fn opt(v: &mut Vec<OsString>, name: &str, value: impl AsRef<std::ffi::OsStr>) {
        v.push(name.into());
        v.push(value.as_ref().to_os_string());
    }
    opt(&mut v, "--volume", a.cipherdir);
    opt(&mut v, "--state", state_dir(cli));
    if let Some(c) = cli.cache_bytes {
        opt(&mut v, "--cache-bytes", c.to_string());
    }
    if let Some(r) = cli.records {
        opt(&mut v, "--records", r.to_string());
    }
    if let Some(m) = cli.meta_cache_bytes {
        opt(&mut v, "--meta-cache-bytes", m.to_string());
    }
    // Where the anchor lives and the keys that sign and check it: as variables of the
    // environment, the daemon inherits them; given as flags, they reach it only here.
    if let Some(anchor) = &cli.anchor {
        opt(&mut v, "--anchor", anchor);
    }
    if let Some(k) = &cli.sign_key {
        opt(&mut v, "--sign-key", k);
    }
    if let Some(k) = &cli.verify_key {
        opt(&mut v, "--verify-key", k);
    }
    if cli.accept_stale {
        v.push("--accept-stale".into());
    }
    opt(&mut v, "mount", a.cipherdir);
    v.push(a.mountpoint.into());
    v.push("--daemon-child".into());
    opt(&mut v, "--threads", a.threads.to_string());
    opt(&mut v, "--commit-interval", a.commit_interval.to_string());
    opt(&mut v, "--xattr-max-bytes", a.xattr_max_bytes.to_string());
    opt(&mut v, "--log", log);
    if let Some(s) = a.scheme {
        opt(&mut v, "--scheme", s);
    }
    if let Some(c) = a.on_alarm {
        opt(&mut v, "--on-alarm", c);
    }
    if let Some(e) = a.scrub_every {
        opt(&mut v, "--scrub-every", format!("{}s", e.as_secs()));
        opt(&mut v, "--scrub-rate", a.scrub_rate.to_string());
    }
    if let Some(f) = a.follow {
        v.push(format!("--follow={}", f.as_secs()).into());
    }
    for (set, flag) in [
        (a.allow_other, "--allow-other"),
        (a.ro, "--ro"),
        (a.direct_io, "--direct-io"),
    ] {
        if set {
            v.push(flag.into());
        }
    }
    v
}

/// A daemon's password: the first line of stdin, written there by the parent (`mount`,
/// `disk serve --daemon`), never in argv or the environment.
pub(crate) fn password_from_parent() -> Result<zeroize::Zeroizing<String>> {
    let mut pw = zeroize::Zeroizing::new(String::new());
    std::io::stdin()
        .lock()
        .take(4096)
        .read_line(&mut pw)
        .context("reading the password from the parent")?;
    Ok(zeroize::Zeroizing::new(
        pw.trim_end_matches('\n').to_string(),
    ))
}

type Faulty = FaultStore<Arc<dyn UntrustedStore>>;
/// The store the volume opens, and the fault injector in it, if any.
type Injected = (Arc<dyn UntrustedStore>, Option<Arc<Faulty>>);

/// A test hook (docs/testing.md, "I/O errors at every call"): with `INTACT_FAULT` set to
/// `eio@N`, `enospc@N` or `sync-eio@N`, the mount's store fails its N-th mutating call (or
/// sync) once; with `none`, it only counts. Either way the daemon prints its counts when it
/// exits, so that a test can aim at each call of a workload. It can only make calls fail.
fn inject_faults(store: Arc<dyn UntrustedStore>) -> Result<Injected> {
    let Ok(text) = std::env::var("INTACT_FAULT") else {
        return Ok((store, None));
    };
    let plan = FaultPlan::parse(&text).with_context(|| {
        format!("INTACT_FAULT={text}: want eio@N, enospc@N, sync-eio@N or none")
    })?;
    let faulty = Arc::new(FaultStore::new(store));
    faulty.set_plan(plan);
    Ok((faulty.clone() as Arc<dyn UntrustedStore>, Some(faulty)))
}

fn report_faults(faults: Option<&Faulty>) {
    if let Some(f) = faults {
        eprintln!(
            "intact: fault store: {} mutating calls, {} syncs",
            f.attempts(),
            f.syncs()
        );
    }
}

fn serve(
    vol: Volume,
    a: &MountArgs,
    scheme: Option<SchemeId>,
    status: PathBuf,
    foreground: bool,
    ready: impl FnOnce(),
) -> Result<()> {
    let vol = Arc::new(vol);
    // Failures of requests and of the background scrub, to alarms.jsonl beside the anchor
    // and to --on-alarm.
    let alarms = Arc::new(intact_fuse::Alarms::new(
        status.parent().map(|d| d.join("alarms.jsonl")),
        a.on_alarm.map(str::to_string),
        a.mountpoint.to_path_buf(),
    ));
    let opts = intact_fuse::MountOptions {
        allow_other: a.allow_other,
        scheme,
        auto: a.scheme == Some(intact_core::volume::AUTO),
        threads: a.threads.max(1),
        commit_interval: (a.commit_interval > 0).then(|| Duration::from_secs(a.commit_interval)),
        // statfs reports the backing file system's room; a bucket has no such figure.
        backing_dir: crate::s3_url(a.cipherdir)
            .is_none()
            .then(|| a.cipherdir.to_path_buf()),
        // A follower may share its state directory with the writer, whose status it is.
        status_file: a.follow.is_none().then(|| status.clone()),
        alarms: Some(alarms.clone()),
        mountpoint: a.mountpoint.to_path_buf(),
        unmount_on_hangup: foreground,
        // A follower's files change under it: every read reaches the engine (no page
        // cache), and attributes are kept a second.
        direct_io: a.direct_io || a.follow.is_some(),
        attr_ttl: match a.follow {
            Some(_) => FOLLOW_ATTR_TTL,
            None => intact_fuse::MountOptions::default().attr_ttl,
        },
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scrubber = match (a.scrub_every, status.parent()) {
        (Some(every), Some(dir)) => Some(crate::scrub::background(
            vol.clone(),
            dir.to_path_buf(),
            every,
            Some(a.scrub_rate * 1e6),
            stop.clone(),
            {
                let alarms = alarms.clone();
                move |f: &crate::scrub::Failure| alarms.raise("scrub", &f.path, f.block, &f.what)
            },
        )?),
        _ => None,
    };
    let served = intact_fuse::serve(vol.clone(), a.mountpoint, opts, ready)
        .with_context(|| format!("mounting at {}", a.mountpoint.display()));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(h) = scrubber {
        let _ = h.join();
    }
    served?;
    let failures = vol.integrity_failures();
    if failures > 0 {
        tracing::warn!(
            failures,
            "integrity failures were reported during the mount"
        );
    }
    Ok(())
}

/// What `intact stat` shows about a mount, if one is running or ran.
pub fn read_status(state: &intact_core::store::LocalStateDir) -> Option<serde_json::Value> {
    let b = std::fs::read(status_path(state)).ok()?;
    serde_json::from_slice(&b).ok()
}

/// Whether the volume's mount is going away: its daemon is alive but its mount point is
/// no longer mounted (it is sealing after `fusermount3 -u`).
pub fn unmounting(state: &intact_core::store::LocalStateDir) -> bool {
    let Some(st) = read_status(state) else {
        return false;
    };
    let pid = st["pid"].as_u64().unwrap_or(0);
    let mnt = st["mountpoint"].as_str().unwrap_or("");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(mnt));
    crate::pid_alive(pid) && !mounted
}

/// Whether `cmd` is a mount (its logging goes to the log file or stderr).
pub fn is_mount(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Mount { .. }
            | Cmd::Disk {
                what: crate::disk::DiskCmd::Serve { .. }
            }
    )
}

/// The mount point `p` as the kernel lists it, if an intact mount is there.
fn intact_mount(p: &Path) -> Result<PathBuf> {
    let canon = p
        .canonicalize()
        .with_context(|| format!("{}: no such directory", p.display()))?;
    let want = canon.to_string_lossy();
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    // Fields: id parent dev root mountpoint options [optional...] - fstype source super.
    let found = info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let mut after = f.iter().skip_while(|x| **x != "-").skip(1);
        let (fstype, source) = (after.next(), after.next());
        // Mounted by root: type "fuse", source "intact"; through fusermount3: "fuse.intact".
        f.get(4).map(|m| unescape_mountinfo(m)).as_deref() == Some(&*want)
            && (fstype == Some(&"fuse.intact")
                || (fstype == Some(&"fuse") && source == Some(&"intact")))
    });
    if !found {
        bail!("{}: not an intact mount", p.display());
    }
    Ok(canon)
}

/// A mountinfo field as the path it names: the kernel writes space, tab, newline and
/// backslash as octal escapes (`\040`, `\011`, `\012`, `\134`).
fn unescape_mountinfo(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // Three octal digits, at most \377 (one byte).
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| (b'0'..=b'3').contains(&d[0]))
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An I/O error of the mount's request as the CLI's I/O exit code (15).
fn mount_io(what: &str, mnt: &Path, source: std::io::Error) -> anyhow::Error {
    intact_core::Error::Io {
        what: format!("{what} of the mount {}", mnt.display()),
        source,
    }
    .into()
}

/// `intact sync MOUNTPOINT`: when it returns, everything written through the mount before
/// the call is sealed (durable, and rolled back only with an alarm). FUSE forwards no
/// syncfs(2) to the daemon, so `sync -f` alone cannot make it seal; and neither `sync(2)`
/// nor `syncfs(2)` waits until the daemon has the pages the kernel still caches
/// (writeback cache, shared mappings): they start their writeback and return. A close
/// waits for its file's writeback. So this calls syncfs (every file's writeback starts at
/// once), then opens and closes each file open for writing (the daemon lists them:
/// `intact_fuse::WRITERS_XATTR`; only such files can have cached pages, as every close
/// waits), then fsyncs the mount's root directory, which the daemon answers with a seal
/// (docs/design.md, "When data is durable").
pub fn sync_mount(mountpoint: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let mnt = intact_mount(mountpoint)?;
    let dir = std::fs::File::open(&mnt).with_context(|| format!("opening {}", mnt.display()))?;
    // SAFETY: syncfs reads only the descriptor, which `dir` keeps open for the call.
    // A failed writeback (the daemon refused a write, EFBIG or ENOSPC) is reported, but
    // the seal still runs: it keeps everything else.
    let mut pushed = match unsafe { libc::syncfs(dir.as_raw_fd()) } {
        0 => Ok(()),
        _ => Err(mount_io(
            "syncfs (some written data was not kept)",
            &mnt,
            std::io::Error::last_os_error(),
        )),
    };
    let waited = wait_for_writers(&mnt);
    dir.sync_all()
        .map_err(|e| mount_io("the seal (fsync of the root)", &mnt, e))?;
    if let Err(e) = waited {
        pushed = pushed.and(Err(e));
    }
    pushed
}

/// One file open for writing, as the daemon lists it.
#[derive(Debug, PartialEq)]
struct Writer {
    ino: u64,
    path: String,
}

/// Parses a value of `WRITERS_XATTR`: `ino TAB path NUL` each.
fn parse_writers(v: &[u8]) -> Option<Vec<Writer>> {
    v.split(|&b| b == 0)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let e = std::str::from_utf8(e).ok()?;
            let (ino, path) = e.split_once('\t')?;
            Some(Writer {
                ino: ino.parse().ok()?,
                path: path.strip_prefix('/')?.to_string(),
            })
        })
        .collect()
}

/// Every file of the mount open for writing, from the daemon, page by page.
fn writers_of(mnt: &Path) -> Result<Vec<Writer>> {
    use std::os::unix::ffi::OsStrExt;
    let c_mnt = std::ffi::CString::new(mnt.as_os_str().as_bytes())?;
    let mut all: Vec<Writer> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let name = match all.last() {
            None => intact_fuse::WRITERS_XATTR.to_string(),
            Some(w) => format!("{}.{}", intact_fuse::WRITERS_XATTR, w.ino),
        };
        let c_name = std::ffi::CString::new(name)?;
        // SAFETY: both names are NUL-terminated strings that live across the call, and
        // the kernel writes at most `buf.len()` bytes into `buf`.
        let n = unsafe {
            libc::getxattr(
                c_mnt.as_ptr(),
                c_name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(mount_io(
                "listing the files open for writing",
                mnt,
                std::io::Error::last_os_error(),
            ));
        }
        let page = parse_writers(&buf[..n as usize]).with_context(|| {
            format!("{}: the daemon's list of writers is garbled", mnt.display())
        })?;
        if page.is_empty() {
            return Ok(all);
        }
        all.extend(page);
    }
}

/// Opens and closes a descriptor of each file open for writing: each close returns once
/// the daemon has answered the file's writeback. A file renamed meanwhile is looked for
/// again (three rounds); one that cannot be opened is reported, by path.
fn wait_for_writers(mnt: &Path) -> Result<()> {
    use std::os::fd::IntoRawFd;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut todo: Option<std::collections::BTreeSet<u64>> = None;
    let mut failed = Vec::new();
    for _round in 0..3 {
        let writers = writers_of(mnt)?;
        let mut missed = std::collections::BTreeSet::new();
        failed.clear();
        for w in writers {
            if todo.as_ref().is_some_and(|t| !t.contains(&w.ino)) {
                continue;
            }
            let path = mnt.join(&w.path);
            let flags = libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY;
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(flags)
                .open(&path)
                .or_else(|_| {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(flags)
                        .open(&path)
                });
            let f = match opened {
                Ok(f) => f,
                Err(e) => {
                    missed.insert(w.ino);
                    failed.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            if !f.metadata().is_ok_and(|m| m.ino() == w.ino && m.is_file()) {
                // Another file took the name (a rename since the list was made).
                missed.insert(w.ino);
                failed.push(format!("{}: renamed while syncing", path.display()));
                continue;
            }
            let fd = f.into_raw_fd();
            // SAFETY: `fd` was just taken from the File, which no longer owns it; closed once.
            if unsafe { libc::close(fd) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err(mount_io(
                    &format!(
                        "the writeback of {} (some written data was not kept)",
                        w.path
                    ),
                    mnt,
                    e,
                ));
            }
        }
        if missed.is_empty() {
            return Ok(());
        }
        todo = Some(missed);
    }
    bail!(
        "{}: could not wait for the writes of {} file(s) open for writing, which may be left \
         out of this seal: {}",
        mnt.display(),
        failed.len(),
        failed.join("; ")
    )
}

/// The daemon serving `mnt`, from the status files under the state directory.
fn daemon_of(state_root: &Path, mnt: &Path) -> Option<u64> {
    let want = mnt.to_string_lossy();
    std::fs::read_dir(state_root)
        .ok()?
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("mount.json")).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .filter(|st| st["mountpoint"].as_str() == Some(&*want))
        .filter_map(|st| st["pid"].as_u64())
        .find(|pid| crate::pid_alive(*pid))
}

/// `intact umount MOUNTPOINT`: seals, unmounts, and returns once the daemon has sealed
/// what came after and exited. `fusermount3 -u` returns before the daemon's last seal, so
/// a crash right after it can lose what was written since the last one.
pub fn umount(state_root: &Path, mountpoint: &Path) -> Result<()> {
    let mnt = intact_mount(mountpoint)?;
    let Some(pid) = daemon_of(state_root, &mnt) else {
        bail!(
            "{}: no intact daemon serving it has its status under {} (was it mounted with \
             another --state?)",
            mnt.display(),
            state_root.display()
        );
    };
    // A failed seal is reported, after the unmount: the daemon seals again when it stops,
    // and a mount that cannot be unmounted helps no one.
    let sealed = sync_mount(&mnt);
    if let Err(e) = &sealed {
        eprintln!("intact: {e:#}; unmounting anyway");
    }
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .context("running fusermount3 (is fuse3 installed?)")?;
    if !st.success() {
        bail!("fusermount3 -u {} failed ({st})", mnt.display());
    }
    let since = std::time::Instant::now();
    let mut told = false;
    while crate::pid_alive(pid) {
        if !told && since.elapsed() > Duration::from_secs(2) {
            eprintln!("intact: waiting for the daemon (pid {pid}) to seal and exit");
            told = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    sealed
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The daemon's command line, parsed again, is the parent's whole command but what the
    /// parent keeps to itself (`--passfile`, `--json`) and what only the daemon is told
    /// (`--daemon-child`, the log's default path): with every option set, and with none.
    #[test]
    fn the_daemon_is_given_every_option_of_the_parent() {
        let every = [
            "intact",
            "--volume",
            "/c",
            "--passfile",
            "/pw",
            "--state",
            "/s",
            "--anchor",
            "etcd://h:1/k",
            "--sign-key",
            "/sk",
            "--verify-key",
            "/vk",
            "--json",
            "--cache-bytes",
            "7",
            "--records",
            "9",
            "--meta-cache-bytes",
            "11",
            "--accept-stale",
            "mount",
            "/c",
            "/m",
            "--allow-other",
            "--ro",
            "--follow=12",
            "--scheme",
            "aead",
            "--threads",
            "3",
            "--commit-interval",
            "4",
            "--xattr-max-bytes",
            "5",
            "--log",
            "/l",
            "--direct-io",
            "--on-alarm",
            "true",
            "--scrub-every",
            "60s",
            "--scrub-rate",
            "2.5",
        ];
        let none = ["intact", "--state", "/s", "mount", "/c", "/m"];
        for argv in [&every[..], &none[..]] {
            let mut parent = Cli::try_parse_from(argv).unwrap();
            let child = {
                let Cmd::Mount {
                    cipherdir,
                    mountpoint,
                    ..
                } = &parent.cmd
                else {
                    unreachable!()
                };
                let a = MountArgs::of(&parent.cmd, cipherdir, mountpoint).unwrap();
                let argv = daemon_args(&parent, &a, Path::new("/l"));
                Cli::try_parse_from(std::iter::once(OsString::from("intact")).chain(argv)).unwrap()
            };
            parent.passfile = None;
            parent.json = false;
            parent.volume = Some(PathBuf::from("/c"));
            if let Cmd::Mount {
                daemon_child, log, ..
            } = &mut parent.cmd
            {
                *daemon_child = true;
                *log = Some(PathBuf::from("/l"));
            }
            assert_eq!(format!("{child:?}"), format!("{parent:?}"), "{argv:?}");
        }
    }

    #[test]
    fn the_daemons_list_of_writers_is_parsed() {
        let w = |ino, path: &str| Writer {
            ino,
            path: path.to_string(),
        };
        assert_eq!(parse_writers(b""), Some(vec![]));
        assert_eq!(
            parse_writers(b"7\t/a b\x0012\t/d/tab\there\0"),
            Some(vec![w(7, "a b"), w(12, "d/tab\there")])
        );
        // Garbled: no tab, a number that is not one, a path that is not absolute.
        assert_eq!(parse_writers(b"7/a\0"), None);
        assert_eq!(parse_writers(b"x\t/a\0"), None);
        assert_eq!(parse_writers(b"7\ta\0"), None);
        assert_eq!(parse_writers(b"7\t/\xff\0"), None);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo("/tmp/a\\040b\\011c"), "/tmp/a b\tc");
        assert_eq!(unescape_mountinfo("/x\\134y\\012"), "/x\\y\n");
        assert_eq!(unescape_mountinfo("/plain\\9"), "/plain\\9");
        assert_eq!(unescape_mountinfo("/end\\04"), "/end\\04");
        assert_eq!(unescape_mountinfo("/big\\777"), "/big\\777");
    }
}
