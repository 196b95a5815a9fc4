//! `intact disk`: the block disk's commands (create, serve over NBD, info, fsck). The
//! engine is `intact_core::disk::engine`; this file parses arguments and maps its errors
//! to NBD's.

use crate::{password, state_dir, Cli};
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use intact_core::crypto::KdfParams;
use intact_core::disk::engine::{Disk, DiskCreate, DiskOptions, Mode};
use intact_core::disk::pac::PacConfig;
use intact_core::store::{LocalStateDir, TrustedStore};
use intact_core::Error;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum DiskCmd {
    /// Create a disk: PATH (a sparse file of SIZE bytes of ciphertext) and PATH.meta,
    /// PATH.tree, PATH.sealed, PATH.intent, PATH.intact beside it; its anchor goes to the
    /// state directory.
    Create {
        path: PathBuf,
        /// Size: bytes, or with K, M, G or T (powers of 1024); a multiple of 4096.
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// The hash tree: dmt (the splaying tree of the PAC paper, binary, hot blocks near
        /// the root), binary, or nary:N (N from 2 to 128).
        #[arg(long, default_value = "dmt")]
        tree: String,
        /// pac (verify reads in line, update the tree in the background, seal at flush),
        /// sync (update in line), aead (no freshness), none (no protection: a baseline).
        #[arg(long, default_value = "pac")]
        mode: String,
        /// Argon2id memory in KiB.
        #[arg(long, default_value_t = 65536)]
        kdf_memory: u32,
        /// Argon2id passes.
        #[arg(long, default_value_t = 3)]
        kdf_passes: u32,
    },
    /// Serve a disk over NBD until SIGINT or SIGTERM (then it flushes and closes), in the
    /// foreground. Clients: nbd+unix:///?socket=SOCK or nbd://127.0.0.1:PORT.
    Serve {
        path: PathBuf,
        /// A unix socket to listen on.
        #[arg(long, required_unless_present = "listen", conflicts_with = "listen")]
        socket: Option<PathBuf>,
        /// A TCP address to listen on (127.0.0.1:10809). Loopback only unless
        /// --allow-remote: NBD sends the plaintext, unauthenticated.
        #[arg(long)]
        listen: Option<String>,
        /// Listen on a non-loopback address (a network you trust: NBD has no encryption
        /// and no authentication).
        #[arg(long, requires = "listen")]
        allow_remote: bool,
        /// Serve a tree disk in another of its modes: pac, sync, or batch (the batching
        /// baseline: reads return before they are verified; for measurements).
        #[arg(long)]
        mode: Option<String>,
        /// Requests per checkpoint in batch mode.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Pending tree updates at most (pac).
        #[arg(long, default_value_t = 1024)]
        queue: usize,
        /// A full queue lets writers go on once it is down to this share (pac).
        #[arg(long, default_value_t = 0.75)]
        low_watermark: f64,
        /// Tree updates applied per second in the background (pac); 0: as fast as it can.
        #[arg(long, default_value_t = 1000.0)]
        rate: f64,
        /// Requests of one connection served at once.
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// The node cache: bytes (64M, 1G) or a share of the tree's metadata (1%, 0.1%);
        /// default --cache-bytes, else 16M.
        #[arg(long)]
        cache: Option<String>,
        /// The DMT: the probability that a write splays its block towards the root.
        #[arg(long, default_value_t = 0.01)]
        splay: f64,
        /// Serve in the background: returns once the socket is listening (or with the
        /// error that kept it from it), printing the server's pid; SIGTERM stops it
        /// (flushed and closed). The password goes to it on a pipe.
        #[arg(long)]
        daemon: bool,
        /// The daemon's log [default: STATE/DISK_ID/serve.log].
        #[arg(long)]
        log: Option<PathBuf>,
        /// (internal) the daemon itself: the password on stdin, "ready URI" on stdout.
        #[arg(long, hide = true)]
        daemon_child: bool,
        /// A unix socket for `intact disk ctl` (change the PAC rate or queue while serving,
        /// read the counts).
        #[arg(long)]
        control: Option<PathBuf>,
    },
    /// Send a command to a serving disk's control socket: `rate N` (background tree
    /// updates per second; 0: as fast as it can), `queue N`, `watermark F`, `stats`.
    Ctl {
        control: PathBuf,
        #[arg(num_args = 1.., required = true)]
        command: Vec<String>,
    },
    /// Rerun the PAC paper's experiments with fio over NBD on this machine, every mode in the
    /// same run (docs/performance.md, "The block disk").
    Bench(crate::disk_bench::BenchArgs),
    /// Show a disk's size, tree, mode, anchor and the space its files take.
    Info { path: PathBuf },
    /// Verify every block of a disk (recovering first if its last session crashed).
    Fsck {
        path: PathBuf,
        /// When a crash recovery finds blocks that authenticate under none of their values
        /// (torn by a power cut during an unflushed write, or changed), make them holes
        /// (zeros) and list them, instead of refusing to open. A rollback of flushed blocks
        /// is refused all the same.
        #[arg(long)]
        repair_torn: bool,
    },
}

/// Parses 4096, 64K, 10M, 64G, 1T.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match s[i..].to_ascii_uppercase().trim_end_matches("IB") {
                "K" => 1u64 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                "B" => 1,
                u => return Err(format!("unknown unit {u:?} (K, M, G or T)")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s}: too large"))
}

/// `--cache`: a size (64M) or a share of the disk's tree metadata (1%, 0.1%).
fn cache_size(s: &str, c: &intact_core::disk::engine::DiskConfig) -> Result<usize> {
    let bytes = match s.strip_suffix('%') {
        Some(p) => {
            let p: f64 = p
                .trim()
                .parse()
                .ok()
                .filter(|p: &f64| (0.0..=100.0).contains(p))
                .with_context(|| format!("--cache {s}: want a share from 0% to 100%"))?;
            (intact_core::disk::engine::tree_bytes(c) as f64 * p / 100.0) as u64
        }
        None => parse_size(s).map_err(anyhow::Error::msg)?,
    };
    usize::try_from(bytes).context("--cache: too large")
}

/// `serve --daemon`: starts this program again as the server (`--daemon-child`, in its own
/// process group, its stderr to the log), hands it the password on a pipe (never in argv
/// or the environment), and returns once it reports the socket listening, or with the
/// error (and exit code) that stopped it.
fn spawn_daemon(cli: &Cli, path: &Path, log: Option<&Path>) -> Result<std::process::ExitCode> {
    use std::io::{BufRead, Write};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let cfg = Disk::read_config(path)?;
    let pw = password(cli, false)?;
    let log = match log {
        Some(l) => l.to_path_buf(),
        None => {
            let d = state_dir(cli).join(&cfg.disk_id);
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            d.join("serve.log")
        }
    };
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("opening the log {}", log.display()))?;
    let args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .map(|a| {
            if a == "--daemon" {
                "--daemon-child".into()
            } else {
                a
            }
        })
        .collect();
    let exe = std::env::current_exe().context("locating the intact binary")?;
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(logf))
        .env_remove("INTACT_PASSWORD")
        // Its own process group: Ctrl-C in the terminal that started it does not reach it.
        .process_group(0)
        .spawn()
        .context("starting the disk server")?;
    {
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(pw.as_bytes())?;
        stdin.write_all(b"\n")?;
    }
    drop(pw);
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let line = line.trim_end();
    if let Some(uri) = line.strip_prefix("ready ") {
        if cli.json {
            println!(
                "{}",
                serde_json::json!({"pid": child.id(), "uri": uri, "log": log})
            );
        } else {
            println!("{}", child.id());
            eprintln!(
                "intact: serving {} at {uri} (pid {}; log {}; stop it with kill {})",
                path.display(),
                child.id(),
                log.display(),
                child.id()
            );
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let status = child.wait()?;
    if let Some(rest) = line.strip_prefix("error ") {
        let (code, msg) = rest.split_once(' ').unwrap_or(("1", rest));
        eprintln!("intact: {msg}");
        return Ok(std::process::ExitCode::from(
            code.parse::<u8>().unwrap_or(1),
        ));
    }
    bail!(
        "the disk server exited ({status}) before it was ready; see {}",
        log.display()
    )
}

/// The daemon's open: the password from the parent's pipe.
fn daemon_open(cli: &Cli, path: &Path, opts: &DiskOptions) -> Result<Disk> {
    open_with(cli, path, opts, &crate::mount::password_from_parent()?)
}

fn trusted_for(cli: &Cli, id: &str) -> intact_core::Result<Box<dyn TrustedStore>> {
    Ok(Box::new(LocalStateDir::new(state_dir(cli), id)?))
}

fn open(cli: &Cli, path: &Path, opts: &DiskOptions) -> Result<Disk> {
    open_with(cli, path, opts, &password(cli, false)?)
}

fn open_with(cli: &Cli, path: &Path, opts: &DiskOptions, pw: &str) -> Result<Disk> {
    let cfg = Disk::read_config(path)?;
    let trusted = trusted_for(cli, &cfg.disk_id)?;
    Ok(Disk::open(path, pw.as_bytes(), trusted, opts)?)
}

pub fn run(cli: &Cli, cmd: &DiskCmd) -> Result<std::process::ExitCode> {
    match cmd {
        DiskCmd::Create {
            path,
            size,
            tree,
            mode,
            kdf_memory,
            kdf_passes,
        } => {
            let tree_kind = intact_core::disk::engine::parse_tree(tree)?;
            let mode = Mode::parse(mode)?;
            let pw = password(cli, true)?;
            let kdf = KdfParams {
                m_kib: *kdf_memory,
                t: *kdf_passes,
                p: 1,
            };
            let cfg = Disk::create(
                path,
                &DiskCreate {
                    size: *size,
                    tree: tree_kind,
                    mode,
                    kdf,
                },
                pw.as_bytes(),
                |id| trusted_for(cli, id),
            )?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"disk_id": cfg.disk_id, "size": cfg.size})
                );
            } else {
                println!(
                    "created disk {} ({} bytes, {}, mode {}) at {}",
                    cfg.disk_id,
                    cfg.size,
                    tree,
                    mode.name(),
                    path.display()
                );
            }
        }
        DiskCmd::Serve {
            path,
            socket,
            listen,
            allow_remote,
            mode,
            queue,
            low_watermark,
            rate,
            workers,
            control,
            batch,
            cache,
            splay,
            daemon,
            log,
            daemon_child,
        } => {
            if *daemon && !*daemon_child {
                return spawn_daemon(cli, path, log.as_deref());
            }
            let cache_bytes = match cache {
                Some(c) => cache_size(c, &Disk::read_config(path)?)?,
                None => cli.cache_bytes.unwrap_or(16 << 20),
            };
            let opts = DiskOptions {
                mode: mode.as_deref().map(Mode::parse).transpose()?,
                cache_bytes,
                pac: PacConfig {
                    capacity: (*queue).max(1),
                    low_watermark: *low_watermark,
                    rate: (*rate > 0.0).then_some(*rate),
                },
                batch: *batch,
                read_only: false,
                repair_torn: false,
                splay: *splay,
            };
            if *daemon_child {
                // Errors before "ready" go to the parent, which exits with their code.
                // (The parent is gone once the server is ready: a closed pipe is no error.)
                let say = |line: String| {
                    use std::io::Write;
                    let mut out = std::io::stdout();
                    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
                };
                let report = |e: anyhow::Error| {
                    let msg = format!("{e:#}").replace('\n', " ");
                    say(format!("error {} {msg}", crate::exit_code(&e)));
                    e
                };
                let disk = daemon_open(cli, path, &opts).map_err(report)?;
                let mut ready = |uri: &str| say(format!("ready {uri}"));
                serve(
                    Arc::new(disk),
                    socket.as_deref(),
                    listen.as_deref(),
                    *allow_remote,
                    control.as_deref(),
                    (*workers).max(1),
                    &mut ready,
                )
                .map_err(report)?;
                return Ok(std::process::ExitCode::SUCCESS);
            }
            let disk = Arc::new(open(cli, path, &opts)?);
            serve(
                disk,
                socket.as_deref(),
                listen.as_deref(),
                *allow_remote,
                control.as_deref(),
                (*workers).max(1),
                &mut |_| {},
            )?;
        }
        DiskCmd::Ctl { control, command } => {
            if !control_client(control, &command.join(" "))? {
                return Ok(std::process::ExitCode::from(crate::code::OTHER));
            }
        }
        DiskCmd::Bench(args) => {
            crate::disk_bench::run(cli, args)?;
        }
        DiskCmd::Info { path } => {
            let d = open(
                cli,
                path,
                &DiskOptions {
                    read_only: true,
                    ..DiskOptions::default()
                },
            )?;
            let a = d.anchor();
            let c = d.config();
            let (rb, rn) = d.regions();
            let v = serde_json::json!({
                "path": path,
                "disk_id": c.disk_id,
                "size": c.size,
                "block_size": intact_core::disk::engine::BLOCK,
                "arity": c.arity,
                "tree": c.tree().name(),
                "mode": c.mode,
                "epoch": a.epoch,
                "root": hex::encode(a.root),
                "closed_cleanly": !a.open,
                "needs_recovery": d.needs_recovery(),
                "region_blocks": rb,
                "regions": rn,
                "allocated_bytes": d.allocated_bytes(),
                "anchor": state_dir(cli).join(&c.disk_id).join("anchor"),
            });
            if cli.json {
                println!("{v}");
            } else {
                println!("disk        {}", path.display());
                println!("id          {}", c.disk_id);
                println!(
                    "size        {} bytes ({} blocks of 4096)",
                    c.size,
                    c.size / 4096
                );
                println!(
                    "tree        {} (arity {}), regions of {rb} blocks ({rn})",
                    c.tree().name(),
                    c.arity
                );
                println!("mode        {}", c.mode);
                println!(
                    "epoch       {} (root {})",
                    a.epoch,
                    hex::encode(&a.root[..8])
                );
                println!(
                    "last close  {}",
                    if a.open {
                        "no: it crashed; the next serve or fsck recovers it"
                    } else {
                        "clean"
                    }
                );
                println!(
                    "allocated   {} bytes on the backing store",
                    d.allocated_bytes()
                );
            }
        }
        DiskCmd::Fsck { path, repair_torn } => {
            // Read-write, so that a crashed session is recovered first.
            let d = open(
                cli,
                path,
                &DiskOptions {
                    repair_torn: *repair_torn,
                    ..DiskOptions::default()
                },
            )?;
            for b in d.repaired() {
                eprintln!(
                    "{}: block {b} (bytes {} to {}) authenticated under none of its values \
                     after a crash: it is now zeros",
                    path.display(),
                    b * 4096,
                    b * 4096 + 4095
                );
            }
            let bad = d.fsck(100)?;
            d.close()?;
            for e in &bad {
                eprintln!("{e}");
            }
            if let Some(e) = bad.into_iter().next() {
                return Err(e).context(format!("{}: the disk failed its check", path.display()));
            }
            if !cli.json {
                println!("{}: every block verified", path.display());
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The engine as an NBD export: integrity failures and I/O errors are EIO (and logged by
/// the engine), requests past the end EINVAL or ENOSPC.
struct DiskExport(Arc<Disk>);

fn errno(e: Error) -> u32 {
    match e {
        Error::Invalid(_) => crate::nbd::EINVAL,
        Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
            crate::nbd::ENOSPC
        }
        e => {
            if !e.is_tampered() {
                tracing::error!("{e}");
            }
            crate::nbd::EIO
        }
    }
}

impl crate::nbd::Export for DiskExport {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_only(&self) -> bool {
        self.0.is_read_only()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), u32> {
        self.0.read(off, buf).map_err(errno)
    }
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), u32> {
        self.0.write(off, data).map_err(errno)?;
        if fua {
            self.0.flush().map_err(errno)?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), u32> {
        self.0.flush().map_err(errno)
    }
    fn trim(&self, off: u64, len: u64, fua: bool) -> Result<(), u32> {
        self.0.trim(off, len).map_err(errno)?;
        if fua {
            self.0.flush().map_err(errno)?;
        }
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, fua: bool) -> Result<(), u32> {
        self.trim(off, len, fua)
    }
}

enum Listener {
    Unix(std::os::unix::net::UnixListener, PathBuf),
    Tcp(std::net::TcpListener),
}

/// Serves `disk` until SIGINT or SIGTERM ([`serve_until`]), then closes it (a flush and the
/// anchor marked closed).
fn serve(
    disk: Arc<Disk>,
    socket: Option<&Path>,
    listen: Option<&str>,
    allow_remote: bool,
    control: Option<&Path>,
    workers: usize,
    ready: &mut dyn FnMut(&str),
) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    serve_until(
        disk.clone(),
        socket,
        listen,
        allow_remote,
        control,
        workers,
        &stop,
        true,
        ready,
    )?;
    disk.close()?;
    let s = disk.stats();
    eprintln!(
        "intact: closed: {} block reads, {} block writes, {} flushes, {} integrity failures",
        s.reads, s.writes, s.flushes, s.failures
    );
    Ok(())
}

/// Binds a unix socket, replacing one left by a server that died.
fn bind_unix(s: &Path) -> Result<std::os::unix::net::UnixListener> {
    if s.exists() {
        // Refused only if someone answers there.
        if std::os::unix::net::UnixStream::connect(s).is_ok() {
            bail!("{}: another server is listening there", s.display());
        }
        std::fs::remove_file(s).with_context(|| format!("removing {}", s.display()))?;
    }
    // NBD carries plaintext and has no authentication: the socket is the owner's alone
    // (0600) from its creation, not chmod-ed after a window in which others could connect.
    // SAFETY: umask(2) only swaps the process's file-creation mask and cannot fail; the
    // previous mask is put back right after the bind. Other threads of this process create
    // no files meanwhile (serving has not started).
    let old = unsafe { libc::umask(0o177) };
    let bound = std::os::unix::net::UnixListener::bind(s);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let l = bound.with_context(|| format!("listening on {}", s.display()))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Binds a TCP address: loopback only unless `allow_remote` (NBD sends the disk's plaintext
/// to whoever connects, unauthenticated and unencrypted).
fn bind_tcp(a: &str, allow_remote: bool) -> Result<std::net::TcpListener> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<std::net::SocketAddr> = a
        .to_socket_addrs()
        .with_context(|| format!("{a}: not an address (HOST:PORT)"))?
        .collect();
    if !allow_remote && addrs.iter().any(|x| !x.ip().is_loopback()) {
        bail!(
            "{a} is not a loopback address: NBD would send the disk's plaintext, unencrypted \
             and to anyone who connects; give --allow-remote if the network is trusted"
        );
    }
    let l = std::net::TcpListener::bind(&addrs[..]).with_context(|| format!("listening on {a}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Accepts NBD connections (and control commands) until `stop`; then closes every
/// connection and returns (the caller closes the disk).
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve_until(
    disk: Arc<Disk>,
    socket: Option<&Path>,
    listen: Option<&str>,
    allow_remote: bool,
    control: Option<&Path>,
    workers: usize,
    stop: &AtomicBool,
    verbose: bool,
    ready: &mut dyn FnMut(&str),
) -> Result<()> {
    let listener = match (socket, listen) {
        (Some(s), _) => Listener::Unix(bind_unix(s)?, s.to_path_buf()),
        (None, Some(a)) => Listener::Tcp(bind_tcp(a, allow_remote)?),
        (None, None) => bail!("give --socket or --listen"),
    };
    let ctl = control.map(bind_unix).transpose()?;
    let uri = match &listener {
        Listener::Unix(_, p) => format!("nbd+unix:///?socket={}", p.display()),
        Listener::Tcp(l) => format!("nbd://{}", l.local_addr()?),
    };
    if verbose {
        eprintln!(
            "intact: serving {} ({} bytes, mode {}) at {uri}",
            disk.paths().data.display(),
            disk.size(),
            disk.mode().name()
        );
    }
    ready(&uri);
    let export: Arc<dyn crate::nbd::Export> = Arc::new(DiskExport(disk.clone()));
    let mut conns: Vec<Live> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let accepted = match &listener {
            Listener::Unix(l, _) => l.accept().and_then(|(c, _)| {
                let closer = c.try_clone()?;
                start(c, export.clone(), workers, move || {
                    let _ = closer.shutdown(std::net::Shutdown::Both);
                })
            }),
            Listener::Tcp(l) => l.accept().and_then(|(c, _)| {
                c.set_nodelay(true)?;
                let closer = c.try_clone()?;
                start(c, export.clone(), workers, move || {
                    let _ = closer.shutdown(std::net::Shutdown::Both);
                })
            }),
        };
        match accepted {
            Ok(c) => conns.push(c),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => tracing::warn!("accepting a connection: {e}"),
        }
        conns.retain(|(t, _)| !t.is_finished());
        if let Some(c) = &ctl {
            if let Ok((conn, _)) = c.accept() {
                if let Err(e) = control_command(&disk, conn) {
                    tracing::warn!("a control command failed: {e}");
                }
            }
        }
    }
    if verbose {
        eprintln!("intact: stopping: closing connections, flushing and closing the disk");
    }
    for (_, close) in &conns {
        close();
    }
    for (t, _) in conns {
        let _ = t.join();
    }
    if let Listener::Unix(_, p) = &listener {
        let _ = std::fs::remove_file(p);
    }
    if let Some(p) = control {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// One command on the control socket, one line in, one line of JSON out: `rate N` (tree
/// updates per second in the background; 0: as fast as it can), `queue N`, `watermark F`,
/// `stats`.
fn control_command(disk: &Disk, conn: std::os::unix::net::UnixStream) -> Result<()> {
    use std::io::{BufRead, Write};
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    std::io::BufReader::new(std::io::Read::take(&conn, 256)).read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let reply = match (words.next(), words.next().map(str::parse::<f64>)) {
        (Some("stats"), None) => Ok(()),
        (Some(what @ ("rate" | "queue" | "watermark")), Some(Ok(v))) if v >= 0.0 => {
            match disk.pac_config() {
                None => Err("the disk does not serve in pac mode".to_string()),
                Some(mut c) => {
                    match what {
                        "rate" => c.rate = (v > 0.0).then_some(v),
                        "queue" => c.capacity = (v as usize).max(1),
                        _ => c.low_watermark = v.min(1.0),
                    }
                    disk.configure_pac(c);
                    Ok(())
                }
            }
        }
        _ => Err(format!(
            "unknown command {:?}: rate N, queue N, watermark F, stats",
            line.trim()
        )),
    };
    let v = match reply {
        Ok(()) => serde_json::json!({
            "ok": true,
            "stats": disk.stats(),
            "pac": disk.pac_stats().map(|p| serde_json::json!({
                "queued": p.queued, "overridden": p.overridden, "applied": p.applied,
                "writer_waits": p.writer_waits, "max_pending": p.max_pending,
            })),
            "config": disk.pac_config().map(|c| serde_json::json!({
                "rate": c.rate, "queue": c.capacity, "watermark": c.low_watermark,
            })),
        }),
        Err(e) => serde_json::json!({"ok": false, "error": e}),
    };
    (&conn).write_all(format!("{v}\n").as_bytes())?;
    Ok(())
}

/// `intact disk ctl SOCK COMMAND`: sends one command to a serving disk's control socket.
fn control_client(sock: &Path, command: &str) -> Result<bool> {
    use std::io::{Read, Write};
    let mut c = std::os::unix::net::UnixStream::connect(sock)
        .with_context(|| format!("{}: no server's control socket", sock.display()))?;
    c.write_all(format!("{command}\n").as_bytes())?;
    let mut out = String::new();
    c.read_to_string(&mut out)?;
    print!("{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).context("a garbled reply")?;
    Ok(v["ok"] == true)
}

/// A connection being served: its thread, and how to close it.
type Live = (std::thread::JoinHandle<()>, Box<dyn Fn() + Send>);

/// Serves connection `c` on a thread of its own.
fn start<C: crate::nbd::Conn + SetBlocking>(
    c: C,
    export: Arc<dyn crate::nbd::Export>,
    workers: usize,
    close: impl Fn() + Send + 'static,
) -> std::io::Result<Live> {
    c.set_blocking()?;
    let t = std::thread::spawn(move || report(crate::nbd::serve(c, export, workers)));
    Ok((t, Box::new(close)))
}

/// Accepted sockets inherit the listener's non-blocking mode; served ones block.
trait SetBlocking {
    fn set_blocking(&self) -> std::io::Result<()>;
}

impl SetBlocking for std::os::unix::net::UnixStream {
    fn set_blocking(&self) -> std::io::Result<()> {
        self.set_nonblocking(false)
    }
}

impl SetBlocking for std::net::TcpStream {
    fn set_blocking(&self) -> std::io::Result<()> {
        self.set_nonblocking(false)
    }
}

fn report(r: std::io::Result<()>) {
    match r {
        Ok(()) => tracing::debug!("a client disconnected"),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            tracing::warn!("closed a connection that broke the protocol: {e}")
        }
        Err(e) => tracing::debug!("a connection ended: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("10M"), Ok(10 << 20));
        assert_eq!(parse_size("64G"), Ok(64 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
