//! `intact`: the command-line front end. It parses arguments, asks for the password, and
//! calls the volume engine; it never touches a cipher or a tree.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use intact_core::format::SchemeId;
use intact_core::store::{
    LocalDirStore, LocalStateDir, S3Store, S3Url, TrustedStore, UntrustedStore,
};
use intact_core::volume::Kind;
use intact_core::{CreateOptions, Error, Options, Volume};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

mod alarm;
mod attack_peers;
mod bench;
mod bench_attacks;
mod bench_contiu;
mod bench_contiu_macro;
mod bench_dir;
mod bench_or;
mod bench_report;
mod bench_trace;
mod bench_yun;
mod disk;
mod disk_bench;
mod hugepages;
mod mount;
mod nbd;
mod plot;
mod scrub;
mod trace;

/// Exit codes (documented in the README).
pub(crate) mod code {
    pub const INTEGRITY: u8 = 10;
    pub const PASSWORD: u8 = 11;
    pub const CONFIG: u8 = 12;
    pub const ANCHOR_MISSING: u8 = 13;
    pub const LOCKED: u8 = 14;
    pub const IO: u8 = 15;
    pub const OTHER: u8 = 1;
}

#[derive(Debug, Parser)]
#[command(
    name = "intact",
    version,
    about = "Encrypted, integrity-checked and fresh storage in a directory you do not trust"
)]
struct Cli {
    /// The cipher directory (the untrusted store), or an S3-compatible bucket:
    /// s3://BUCKET[/PREFIX][?endpoint=URL&region=R] (credentials from AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY, or the AWS_PROFILE of ~/.aws/credentials).
    #[arg(long, global = true, env = "INTACT_VOLUME")]
    volume: Option<PathBuf>,
    /// Read the password from this file (first line).
    #[arg(long, global = true)]
    passfile: Option<PathBuf>,
    /// The trusted state directory holding the anchor [default: $XDG_STATE_HOME/intact].
    #[arg(long, global = true, env = "INTACT_STATE")]
    state: Option<PathBuf>,
    /// Where the trusted anchor lives: `local` (the state directory) or
    /// `etcd://HOST:PORT[,HOST:PORT...]/KEY`, an etcd cluster shared by several clients
    /// [default: where `init --anchor` or `anchor move` put it, recorded in the state
    /// directory; else local].
    #[arg(long, global = true, env = "INTACT_ANCHOR")]
    anchor: Option<String>,
    /// Sign every anchor this writer stores with this private key (PKCS#8, from `intact
    /// keygen`), so that readers holding only its public key can check the roots.
    #[arg(long, global = true, env = "INTACT_SIGN_KEY")]
    sign_key: Option<PathBuf>,
    /// Accept only anchors signed by this public key (a `.pub` file from `intact keygen`):
    /// for readers (ls, cat, get, stat, fsck, info, `mount --ro`); a root not signed by it
    /// is an integrity failure (exit 10).
    #[arg(long, global = true, env = "INTACT_VERIFY_KEY")]
    verify_key: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    json: bool,
    /// Bytes of verified Merkle nodes to cache, counted as the paper counts them: 32 bytes
    /// a node, which takes at most 87 bytes of memory (0 disables) [default: 1 KiB as in
    /// the paper's evaluation; 4 MiB for `mount`, 16 MiB for `bench dir`].
    #[arg(long, global = true)]
    cache_bytes: Option<usize>,
    /// Inode records kept in memory before the idle ones are dropped (and read again,
    /// authenticated, at their next use) [default: 1024]
    #[arg(long, global = true)]
    records: Option<usize>,
    /// Bytes of verified metadata kept decrypted (0 disables): directory units (a big
    /// directory's root and inner nodes, the leaves a listing just read) and inode-table
    /// pieces [default: 1 MiB]
    #[arg(long, global = true)]
    meta_cache_bytes: Option<usize>,
    /// Open the cipher directory's own latest authentic state, read-only, even when it is
    /// not the one the trusted anchor names (after an alarm: to look, not to trust). For
    /// ls, cat, get, stat, fsck, info and `mount --ro`; nothing is written.
    #[arg(long, global = true)]
    accept_stale: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Create a new volume in DIR (created if missing; must be empty), or under
    /// s3://BUCKET[/PREFIX][?endpoint=URL&region=R] in an S3-compatible bucket.
    Init {
        dir: PathBuf,
        /// Default scheme of new files: mt-eint (freshness, default), mt-eint-cbc, mac-tree
        /// (freshness; Poly1305-AES counter tree), rand-eint (HCTR2; a tree over
        /// random-looking blocks only), comp-eint / comp-eint-zstd (hash inside compressible
        /// blocks), aead (no freshness), none (NO integrity: a measurement baseline only).
        #[arg(long, default_value = "mt-eint")]
        scheme: String,
        /// Block size in bytes (power of two, 128..=65536).
        #[arg(long, default_value_t = 4096)]
        block_size: u32,
        /// Argon2id memory in KiB.
        #[arg(long, default_value_t = 65536)]
        kdf_memory: u32,
        /// Argon2id passes.
        #[arg(long, default_value_t = 3)]
        kdf_passes: u32,
    },
    /// Copy a local file (or - for stdin) into the volume.
    Put {
        src: PathBuf,
        path: String,
        /// Scheme of the new file (default: the volume's).
        #[arg(long)]
        scheme: Option<String>,
    },
    /// Copy a file out of the volume (DST - for stdout).
    Get { path: String, dst: PathBuf },
    /// Print a file.
    Cat { path: String },
    /// List a directory.
    Ls {
        #[arg(default_value = "/")]
        path: String,
        /// Long listing.
        #[arg(short = 'l')]
        long: bool,
    },
    /// Create a directory.
    Mkdir {
        path: String,
        /// Create parents as needed; no error if it exists.
        #[arg(short = 'p')]
        parents: bool,
    },
    /// Remove a file, or a directory with -r.
    Rm {
        path: String,
        /// Remove directories and their contents.
        #[arg(short = 'r')]
        recursive: bool,
    },
    /// Rename or move.
    Mv { from: String, to: String },
    /// Create a symlink PATH pointing to TARGET.
    Ln {
        /// Must be given: the CLI makes symbolic links (hard links: through the mount).
        #[arg(short = 's', required = true)]
        symbolic: bool,
        target: String,
        path: String,
    },
    /// Show a file's attributes and integrity state; without PATH, the state of the mount
    /// (integrity failures reported while mounted).
    Stat {
        path: Option<String>,
        /// Measure the file's integrity costs: read (and verify) every block, then report
        /// US_F and TS_F sizes, the integrity bandwidth per block and a time breakdown.
        #[arg(long)]
        integrity: bool,
    },
    /// Mount the volume in CIPHERDIR (a directory or an s3:// URL) at MOUNTPOINT (FUSE).
    /// Runs as a daemon unless -f.
    Mount {
        cipherdir: PathBuf,
        mountpoint: PathBuf,
        /// Stay in the foreground (log to stderr; Ctrl-C unmounts).
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Let other users access the mount (needs user_allow_other in /etc/fuse.conf
        /// unless run as root).
        #[arg(long)]
        allow_other: bool,
        /// Mount read-only.
        #[arg(long)]
        ro: bool,
        /// With --ro: follow a writer that runs at the same time, on this machine or
        /// another (the anchor in etcd, or the published signed root): no lock that keeps
        /// the writer out, the newest sealed root taken every second, and a read that meets
        /// the writer's change under way read again under its next seal. A failure is
        /// reported once no newer root comes within SECS, or after three newer roots.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "30")]
        follow: Option<u64>,
        /// Scheme of new files (default: the volume's).
        #[arg(long)]
        scheme: Option<String>,
        /// Threads serving the kernel's requests. A request that waits (an fsync for its
        /// seal, a read for the disk) holds one while the others go on; bulk writes are
        /// served by a thread of their own (docs/performance.md, "Latency").
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// Seal what was written at least every N seconds (0: only on fsync and unmount).
        #[arg(long, default_value_t = 5)]
        commit_interval: u64,
        /// Largest total of extended-attribute names and values per file (ENOSPC past it).
        #[arg(long, default_value_t = intact_core::volume::XATTR_BYTES_MAX)]
        xattr_max_bytes: usize,
        /// Log file of the daemon [default: mount.log beside the anchor].
        #[arg(long)]
        log: Option<PathBuf>,
        /// Bypass the kernel's page cache: every read and write of a file reaches the
        /// engine (FOPEN_DIRECT_IO; shared mmap still works on Linux 6.6 and later).
        /// Slower; for databases that cache themselves and for testing the engine.
        #[arg(long)]
        direct_io: bool,
        /// Run CMD (with `sh -c`) the first time each file or structure fails
        /// authentication, with INTACT_ALARM_PATH, INTACT_ALARM_BLOCK (empty when none),
        /// INTACT_ALARM_KIND ("integrity"), INTACT_ALARM_WHAT and INTACT_MOUNTPOINT in its
        /// environment. Every failure also goes to alarms.jsonl beside the anchor.
        #[arg(long, value_name = "CMD")]
        on_alarm: Option<String>,
        /// Scrub in the background: a pass whenever the last complete one is older than
        /// this (7d, 12h, 30m, 45s), going on where the last stopped.
        #[arg(long, value_name = "PERIOD", value_parser = scrub::parse_period)]
        scrub_every: Option<std::time::Duration>,
        /// The background scrub's rate, MB (10^6 bytes) per second.
        #[arg(long, value_name = "MB_PER_S", default_value_t = 50.0)]
        scrub_rate: f64,
        #[arg(long, hide = true)]
        daemon_child: bool,
    },
    /// Seal a mount: when it returns, everything written through MOUNTPOINT before it is
    /// durable and rollback-protected (`sync -f` cannot do this: FUSE forwards no syncfs).
    Sync { mountpoint: PathBuf },
    /// Seal, unmount and wait until the daemon has sealed the rest and exited
    /// (`fusermount3 -u` returns before the daemon's last seal).
    Umount { mountpoint: PathBuf },
    /// Check every block of every file and directory.
    Fsck {
        /// Delete objects no file references (left by an interrupted command or a crash).
        #[arg(long)]
        remove_orphans: bool,
        /// Copy every file out into DIR (empty or new), keeping every block that
        /// authenticates; a damaged block becomes a hole, and the damaged ranges are listed.
        #[arg(long, value_name = "DIR")]
        salvage: Option<PathBuf>,
        /// With --salvage: then move each damaged file to /lost+found in the volume.
        #[arg(long, requires = "salvage")]
        quarantine: bool,
    },
    /// Verify every block of every file, at a rate, on every core; an interrupted scrub
    /// (Ctrl-C, --limit-bytes) goes on where it stopped at the next run (a cursor in the
    /// state directory).
    Scrub {
        /// At most this many MB (10^6 bytes) per second, over all workers.
        #[arg(long, value_name = "MB_PER_S")]
        rate: Option<f64>,
        /// Workers, each reading through a volume of its own [default: the cores].
        #[arg(long)]
        threads: Option<usize>,
        /// Stop once this many bytes were verified in this run (the cursor keeps the rest).
        #[arg(long)]
        limit_bytes: Option<u64>,
        /// Forget an interrupted scrub and start over.
        #[arg(long)]
        restart: bool,
    },
    /// Show the volume's scheme, sizes and trusted/untrusted storage.
    Info {
        /// Also measure: verify every block of every file (like fsck) and report the
        /// integrity bandwidth per block and the time by phase.
        #[arg(long)]
        measure: bool,
    },
    /// Accept the cipher directory's own state from now on, after an alarm that says it
    /// is older or newer than the trusted anchor (docs/threat-model.md says what this gives
    /// up). Shows what is lost and asks first; keeps the replaced anchor and records the
    /// change in the state directory's audit log. Refused while the volume is open.
    AcceptStore {
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Move the trusted anchor: into etcd (`--to etcd://HOST:PORT/KEY`) or back into the
    /// local state directory (`--to local`).
    Anchor {
        #[command(subcommand)]
        what: AnchorCmd,
    },
    /// Make a key pair for signed roots: FILE (the private key, PKCS#8, mode 0600: for
    /// `--sign-key`) and FILE.pub (for readers' `--verify-key`).
    Keygen {
        /// ed25519 (default), ecdsa-p256, ecdsa-p384, ecdsa-p521, rsa-pss-3072, rsa-pss-7680
        /// (tens of seconds to make) or rsa-pss-15360 (minutes).
        #[arg(long, default_value = "ed25519")]
        alg: String,
        /// Instead of making a key, take this one, made elsewhere (PKCS#8 DER of any of the
        /// algorithms, or an RSA key of 2048 to 16384 bits in PKCS#1 DER, as `openssl
        /// genpkey -outform DER` writes it): FILE gets it as PKCS#8, FILE.pub its public key.
        #[arg(long, conflicts_with = "alg")]
        import: Option<PathBuf>,
        /// Where to write the private key (FILE.pub gets the public one).
        #[arg(long)]
        out: PathBuf,
    },
    /// Rebuild a lost trusted anchor from the copy in the cipher directory.
    RecoverAnchor {
        /// Confirms you understand that a rollback of the cipher directory made before this
        /// command cannot be detected.
        #[arg(long)]
        i_accept_rollback_risk: bool,
    },
    /// The block disk: an encrypted, authenticated and fresh block device served over NBD
    /// (docs/design.md, "The block disk").
    Disk {
        #[command(subcommand)]
        what: disk::DiskCmd,
    },
    /// Benchmarks on throwaway volumes (see docs/performance.md).
    Bench {
        #[command(subcommand)]
        what: bench::BenchCmd,
    },
}

fn main() -> ExitCode {
    // Before anything else: the heap's allocator reads its tunables when the program starts.
    hugepages::restart_with_huge_pages();
    let cli = Cli::parse();
    // A mount logs what it serves (integrity failures with path and block); one-shot
    // commands report errors themselves.
    let default_filter = if mount::is_mount(&cli.cmd) {
        "info,fuser=error"
    } else {
        "warn,intact_core=off"
    };
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::EnvFilter::try_from_env("INTACT_LOG")
                    .unwrap_or_else(|_| default_filter.into()),
            )
            .with(GoneClients)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .init();
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("intact: {}", error_text(&e));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// The error and its causes, each cause once: the engine's errors already name their
/// source in their own text (`I/O error on X: <source>`).
fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

/// fuser logs at ERROR when it cannot send a reply because the client went away (the
/// kernel answers ENOENT for a request that was interrupted, for example a process killed
/// mid-request). That is routine, not a failure of the mount: it is logged at debug.
struct GoneClients;

#[derive(Default)]
struct LogFields {
    message: String,
    target: String,
}

impl tracing::field::Visit for LogFields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "log.target" => self.target = value.to_string(),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

impl GoneClients {
    /// Whether a log event is fuser's report of a reply to a client that went away.
    fn is_gone_client(target: &str, message: &str) -> bool {
        target.starts_with("fuser")
            && message.starts_with("Failed to send FUSE reply")
            && message.contains("os error 2)")
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for GoneClients {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        if *event.metadata().level() != tracing::Level::ERROR {
            return true;
        }
        let mut f = LogFields::default();
        event.record(&mut f);
        if f.target.is_empty() {
            f.target = event.metadata().target().to_string();
        }
        if Self::is_gone_client(&f.target, &f.message) {
            tracing::debug!(target: "intact_fuse", "a client went away before its reply: {}", f.message);
            return false;
        }
        true
    }
}

pub(crate) fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<Error>() {
        Some(Error::Tampered { .. }) | Some(Error::StateMismatch { .. }) => code::INTEGRITY,
        Some(Error::WrongPassword) => code::PASSWORD,
        Some(Error::Config(_)) | Some(Error::AnchorCorrupt(_)) => code::CONFIG,
        Some(Error::AnchorMissing { .. }) => code::ANCHOR_MISSING,
        Some(Error::Locked(_)) => code::LOCKED,
        Some(Error::Io { .. }) | Some(Error::Lost { .. }) => code::IO,
        _ => code::OTHER,
    }
}

fn password(cli: &Cli, confirm: bool) -> Result<zeroize::Zeroizing<String>> {
    if let Some(f) = &cli.passfile {
        let s = std::fs::read_to_string(f)
            .with_context(|| format!("reading passfile {}", f.display()))?;
        let line = s.lines().next().unwrap_or("").to_string();
        if line.is_empty() {
            bail!("passfile {} is empty", f.display());
        }
        return Ok(zeroize::Zeroizing::new(line));
    }
    if let Ok(p) = std::env::var("INTACT_PASSWORD") {
        if p.is_empty() {
            bail!("INTACT_PASSWORD is empty");
        }
        return Ok(zeroize::Zeroizing::new(p));
    }
    let p = zeroize::Zeroizing::new(
        rpassword::prompt_password("Password: ").context("reading the password")?,
    );
    if p.is_empty() {
        bail!("empty password");
    }
    if confirm {
        let q = zeroize::Zeroizing::new(rpassword::prompt_password("Repeat password: ")?);
        if *p != *q {
            bail!("passwords do not match");
        }
    }
    Ok(p)
}

#[derive(Debug, Subcommand)]
enum AnchorCmd {
    /// Move the anchor (the volume must not be open anywhere). Afterwards every command
    /// finds it there without `--anchor`.
    Move {
        /// `local`, or `etcd://HOST:PORT[,HOST:PORT...]/KEY`.
        #[arg(long)]
        to: String,
    },
}

/// The anchor in etcd at `url`.
fn etcd(url: &str) -> Result<intact_core::store::EtcdAnchor> {
    let u = intact_core::store::EtcdUrl::parse(url)?;
    Ok(intact_core::store::EtcdAnchor::connect(&u)?)
}

/// The volume's trusted store: the anchor in etcd when `--anchor` names it or the state
/// directory records that it lives there (`init --anchor`, `anchor move`), else the state
/// directory itself. A volume opened with `--anchor etcd://...` for the first time on
/// this machine (no local anchor) records the URL, so later commands need no flag.
///
/// A writer with `--sign-key` also publishes each signed root in `store`; a reader with
/// `--verify-key` reads it from there when the anchor cannot be reached or this machine has
/// none, and never accepts a root older than the newest it read before (kept in `state`).
pub(crate) fn trusted(
    cli: &Cli,
    state: &LocalStateDir,
    store: &Arc<dyn UntrustedStore>,
) -> Result<Box<dyn TrustedStore>> {
    let signer = match &cli.sign_key {
        Some(p) => Some(Arc::new(intact_core::sign::Signer::load(p)?)),
        None => None,
    };
    let verify = match &cli.verify_key {
        Some(p) => Some(intact_core::sign::PublicKey::load(p)?),
        None => None,
    };
    let reader = verify.is_some() && signer.is_none();
    let inner = match anchor_store(cli, state) {
        Ok(s) => s,
        // etcd down: a reader may still read the published root.
        Err(e) if reader => match e.downcast::<Error>() {
            Ok(e @ Error::Io { .. }) => Box::new(Unreachable(e.to_string())),
            Ok(e) => return Err(e.into()),
            Err(e) => return Err(e),
        },
        Err(e) => return Err(e),
    };
    // Always wrapped: a command without keys reads a signed root's anchor as any other.
    let mut s =
        intact_core::sign::SignedAnchor::new(inner, signer, verify).published_in(store.clone());
    if reader {
        s = s.remembering_in(state.clone());
    }
    Ok(Box::new(s))
}

/// A trusted anchor that could not be reached (the error, as text): every call fails with
/// it as an I/O error, so a reader with a key falls back to the published root.
struct Unreachable(String);

impl Unreachable {
    fn err(&self) -> Error {
        Error::io(self.0.clone(), std::io::Error::other("cannot be reached"))
    }
}

impl TrustedStore for Unreachable {
    fn load(&self) -> intact_core::Result<Option<Vec<u8>>> {
        Err(self.err())
    }
    fn store(&self, _: &[u8]) -> intact_core::Result<()> {
        Err(self.err())
    }
    fn lock(&self, _: bool) -> intact_core::Result<intact_core::store::TrustedLock> {
        Err(self.err())
    }
    fn location(&self) -> String {
        self.0.clone()
    }
    fn remove(&self) -> intact_core::Result<()> {
        Err(self.err())
    }
}

/// A reader's `--verify-key` with a command that writes: refused (it would store roots
/// no reader accepts), unless `--sign-key` signs them.
pub(crate) fn check_verify_only_reads(cli: &Cli, read_only: bool) -> Result<()> {
    if cli.verify_key.is_some() && cli.sign_key.is_none() && !read_only {
        bail!(
            "--verify-key is for readers (ls, cat, get, stat, fsck, info, mount --ro): this \
             command writes, and its roots would not be signed (give --sign-key to sign them)"
        );
    }
    Ok(())
}

/// `intact keygen`.
fn keygen(alg: &str, import: Option<&Path>, out: &Path, json: bool) -> Result<()> {
    use intact_core::sign::{KeyKind, Signer};
    use std::os::unix::fs::OpenOptionsExt;
    let imported = match import {
        Some(p) => Some(Signer::load(p)?),
        None => None,
    };
    let kind = KeyKind::parse(alg)?;
    let pub_path = PathBuf::from(format!("{}.pub", out.display()));
    // Created first: a large RSA key takes minutes to make, not to be thrown away.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("creating {} (it must not exist)", out.display()))?;
    if imported.is_none() && kind.rsa_bits().is_some_and(|b| b > 3072) {
        eprintln!(
            "generating a {}-bit RSA key: this takes from tens of seconds (7680) to many \
             minutes (15360)",
            kind.rsa_bits().unwrap_or_default()
        );
    }
    let made = match imported {
        Some(s) => s.to_pkcs8().map(|der| (s, zeroize::Zeroizing::new(der))),
        None => Signer::generate(kind).and_then(|der| {
            let der = zeroize::Zeroizing::new(der);
            Ok((Signer::from_pkcs8(&der)?, der))
        }),
    };
    let (signer, der) = match made {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_file(out);
            return Err(e.into());
        }
    };
    f.write_all(&der)?;
    f.sync_all()?;
    std::fs::write(&pub_path, signer.public().to_text())
        .with_context(|| format!("writing {}", pub_path.display()))?;
    if json {
        print_json(&serde_json::json!({
            "private": out, "public": pub_path,
            "algorithm": signer.public().alg().name(),
            "fingerprint": signer.public().fingerprint(),
        }))?;
    } else {
        println!(
            "{}: private key (for --sign-key; keep it secret)\n{}: public key (for readers' --verify-key), {}",
            out.display(),
            pub_path.display(),
            signer.public()
        );
    }
    Ok(())
}

/// Where the anchor's bytes live (see [`trusted`]).
fn anchor_store(cli: &Cli, state: &LocalStateDir) -> Result<Box<dyn TrustedStore>> {
    let recorded = state.remote_anchor()?;
    let flag = cli.anchor.as_deref().filter(|a| !a.is_empty());
    Ok(match (flag, recorded) {
        (None | Some("local"), None) => Box::new(state.clone()),
        (Some("local"), Some(r)) => bail!(
            "the anchor of this volume lives in {r} (recorded in {}); drop `--anchor local`, \
             or bring it back with `intact anchor move --to local`",
            state.remote_anchor_path().display()
        ),
        (None, Some(r)) => Box::new(etcd(&r)?),
        (Some(f), Some(r)) => {
            if etcd_same(f, &r)? {
                Box::new(etcd(&r)?)
            } else {
                bail!(
                    "--anchor {f}, but the anchor of this volume lives in {r} (recorded in {})",
                    state.remote_anchor_path().display()
                )
            }
        }
        (Some(f), None) => {
            let e = etcd(f)?;
            if state.load()?.is_some() {
                bail!(
                    "the anchor of this volume is in the state directory {}; move it with \
                     `intact anchor move --to {f}`",
                    state.location()
                );
            }
            state.set_remote_anchor(Some(&e.url().to_string()))?;
            Box::new(e)
        }
    })
}

/// Whether two anchor URLs name the same place.
fn etcd_same(a: &str, b: &str) -> Result<bool> {
    use intact_core::store::EtcdUrl;
    Ok(EtcdUrl::parse(a)? == EtcdUrl::parse(b)?)
}

/// `intact anchor move --to TO`: the anchor's bytes stored at the destination (which must
/// hold none, or the same), the new place recorded in the state directory, then the old
/// copy removed. A crash between the steps leaves the anchor readable where the state
/// directory says it is, and the command can be run again.
fn anchor_move(cli: &Cli, to: &str) -> Result<()> {
    let (_, state) = locate(cli)?;
    // The bytes as stored (a signed root keeps its signature).
    let src = anchor_store(cli, &state)?;
    let dst: Box<dyn TrustedStore> = if to == "local" {
        Box::new(state.clone())
    } else {
        Box::new(etcd(to)?)
    };
    if src.location() == dst.location() {
        bail!("the anchor is already in {}", src.location());
    }
    let _src_lock = src.lock(true)?;
    let _dst_lock = dst.lock(true)?;
    let bytes = src.load()?.ok_or_else(|| {
        anyhow!(
            "there is no anchor in {} to move (see `intact recover-anchor --help`)",
            src.location()
        )
    })?;
    match dst.load()? {
        Some(b) if b != bytes => bail!(
            "{} already holds another anchor: remove it first if it is stale (an earlier \
             move's leftover)",
            dst.location()
        ),
        Some(_) => {}
        None => dst.store(&bytes)?,
    }
    if dst.load()?.as_deref() != Some(&bytes[..]) {
        bail!(
            "{} does not hold the anchor after storing it",
            dst.location()
        );
    }
    let url = (to != "local").then(|| dst.location());
    state.set_remote_anchor(url.as_deref())?;
    src.remove()?;
    if cli.json {
        print_json(&serde_json::json!({ "from": src.location(), "to": dst.location() }))?;
    } else {
        println!("anchor moved from {} to {}", src.location(), dst.location());
    }
    Ok(())
}

fn state_dir(cli: &Cli) -> PathBuf {
    cli.state.clone().unwrap_or_else(LocalStateDir::default_dir)
}

/// The anchor must not live where the adversary can roll it back together with the data.
fn check_state_outside(state: &Path, volume: &Path) -> Result<()> {
    let canon = |p: &Path| -> PathBuf {
        // The state directory may not exist yet: canonicalize its nearest existing ancestor.
        let mut existing = p.to_path_buf();
        let mut rest = Vec::new();
        while !existing.exists() {
            match (
                existing.file_name().map(|n| n.to_owned()),
                existing.parent(),
            ) {
                (Some(n), Some(parent)) => {
                    rest.push(n);
                    existing = parent.to_path_buf();
                }
                _ => break,
            }
        }
        let mut c = std::fs::canonicalize(&existing).unwrap_or(existing);
        for n in rest.into_iter().rev() {
            c.push(n);
        }
        c
    };
    let (s, v) = (canon(state), canon(volume));
    if s.starts_with(&v) {
        bail!(
            "the trusted state directory {} is inside the cipher directory {}: an adversary could roll \
             the anchor back with the data; choose another --state",
            s.display(),
            v.display()
        );
    }
    Ok(())
}

/// Whether process `pid` runs (exists and has not exited: a zombie waiting for its parent
/// to reap it counts as gone).
fn pid_alive(pid: u64) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) state ...": comm may hold spaces and parentheses, so split at the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

fn volume_dir(cli: &Cli) -> Result<PathBuf> {
    cli.volume
        .clone()
        .ok_or_else(|| anyhow!("no volume given: use --volume DIR or set INTACT_VOLUME"))
}

/// The S3 location a volume argument names (`s3://BUCKET/PREFIX`), if it names one.
pub(crate) fn s3_url(dir: &Path) -> Option<Result<S3Url>> {
    let s = dir.to_str()?;
    s.starts_with("s3://")
        .then(|| S3Url::parse(s).map_err(anyhow::Error::from))
}

fn open_store(dir: &Path) -> Result<Arc<dyn UntrustedStore>> {
    if let Some(url) = s3_url(dir) {
        return Ok(Arc::new(S3Store::open(&url?)?));
    }
    if !dir.is_dir() {
        return Err(Error::Config(format!(
            "{}: no such directory (is the backend missing or unmounted?)",
            dir.display()
        ))
        .into());
    }
    Ok(Arc::new(LocalDirStore::open(dir)?))
}

/// The volume's store and its trusted state directory (which must lie outside it). Reading
/// the config here reports a missing or damaged volume before asking for a password.
fn locate(cli: &Cli) -> Result<(Arc<dyn UntrustedStore>, LocalStateDir)> {
    locate_at(cli, &volume_dir(cli)?)
}

/// [`locate`] for the cipher directory `dir`.
fn locate_at(cli: &Cli, dir: &Path) -> Result<(Arc<dyn UntrustedStore>, LocalStateDir)> {
    let store = open_store(dir)?;
    if s3_url(dir).is_none() {
        check_state_outside(&state_dir(cli), dir)?;
    }
    let state = Volume::state_for(store.as_ref(), &state_dir(cli))?;
    Ok((store, state))
}

/// `--meta-cache-bytes`, or the engine's default.
pub(crate) fn meta_cache(cli: &Cli) -> usize {
    cli.meta_cache_bytes
        .unwrap_or(intact_core::volume::META_CACHE_BYTES)
}

fn open(cli: &Cli, read_only: bool) -> Result<Volume> {
    let pw = password(cli, false)?;
    open_pw(cli, &pw, read_only)
}

/// [`open`] with the password given.
fn open_pw(cli: &Cli, pw: &str, read_only: bool) -> Result<Volume> {
    check_verify_only_reads(cli, read_only)?;
    let (mut store, mut state) = locate(cli)?;
    let opts = Options {
        cache_bytes: cli.cache_bytes.unwrap_or(1024),
        read_only,
        records: cli.records.unwrap_or(intact_core::volume::KEEP_OPEN),
        meta_cache_bytes: meta_cache(cli),
        ..Options::default()
    };
    if cli.accept_stale {
        if !read_only {
            bail!(
                "--accept-stale only reads (ls, cat, get, stat, fsck, info, mount --ro): this \
                 command writes"
            );
        }
        let anchor = trusted(cli, &state, &store)?;
        let vol = Volume::open_stale(store, anchor, pw.as_bytes(), &opts)?;
        alarm::warn_stale(&vol);
        return Ok(vol);
    }
    // Right after `fusermount3 -u` the mount's daemon may still be sealing: wait for it
    // (up to 30 s) rather than report the volume as in use.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let vol = loop {
        let unmounting = mount::unmounting(&state);
        let anchor = trusted(cli, &state, &store)?;
        match Volume::open(store, anchor, pw.as_bytes(), &opts) {
            Err(Error::Locked(_)) if unmounting && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100));
                (store, state) = locate(cli)?;
            }
            Err(e @ Error::AnchorMissing { .. }) => {
                return Err(alarm::other_volumes(cli, &volume_dir(cli)?, e))
            }
            r => break r?,
        }
    };
    // Each command is all-or-nothing: only its final explicit sync seals, and nothing is
    // logged before it.
    vol.set_seal_on_drop(false);
    vol.set_all_or_nothing(true);
    Ok(vol)
}

fn bar(total: u64, what: &str) -> ProgressBar {
    if total < 8 << 20 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Says loudly that a scheme gives no integrity.
fn warn_unprotected(s: SchemeId) {
    if !s.authenticates() {
        eprintln!(
            "warning: scheme `{}` encrypts but gives NO integrity: corrupted, swapped, replayed or \
             truncated file contents are returned without an error. Use it only as a \
             measurement baseline.",
            s.name()
        );
    }
}

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

fn print_times(t: &intact_core::metrics::PhaseTimes) {
    use intact_core::metrics::Phase;
    let a = t.to_array();
    for p in Phase::ALL {
        println!("  {:<22} {}", p.name(), ms(a[p as usize]));
    }
}

fn print_file_integrity(f: &intact_core::metrics::FileIntegrity) {
    println!("path:                {}", f.path);
    println!(
        "scheme:              {}{}",
        f.scheme,
        match (f.authenticated, f.fresh) {
            (false, _) => " (NO integrity)",
            (true, false) => " (authenticity, no freshness)",
            (true, true) => " (authenticity and freshness)",
        }
    );
    println!("blocks:              {}", f.blocks);
    println!(
        "US_F (untrusted):    {} bytes (.m {}, .c {}, per-block overhead in .d {})",
        f.integrity_bytes, f.meta_object_bytes, f.ctrs_object_bytes, f.data_overhead_bytes
    );
    println!("TS_F (trusted):      {} bytes in use", f.trusted_bytes);
    let m = &f.measured;
    println!(
        "measured:            {} blocks read, {} written; US_F {} B read, {} B written",
        m.blocks_read, m.blocks_written, m.integrity.read_bytes, m.integrity.write_bytes
    );
    println!(
        "integrity bandwidth: {:.2} B/block read, {:.2} B/block written, {:.2} B/block overall",
        f.read_bandwidth, f.write_bandwidth, f.integrity_bandwidth
    );
    println!("time by phase:");
    print_times(&f.time);
}

fn print_volume_integrity(v: &intact_core::metrics::VolumeIntegrity, measured: bool) {
    println!(
        "TS (trusted):       anchor {} bytes; TS_F in use {} bytes over {} records (in the inode table)",
        v.anchor_bytes, v.ts_bytes, v.files
    );
    println!(
        "US_F (untrusted):   {} bytes (.m and .c of files and directories)",
        v.integrity_object_bytes
    );
    println!(
        "other metadata:     {} bytes (inode table, journals, config)",
        v.other_metadata_bytes
    );
    let s = &v.session;
    if measured {
        println!(
            "measured:           {} blocks read; US_F {} B read -> {:.2} B/block",
            s.blocks_read, s.integrity.read_bytes, s.integrity_bandwidth
        );
        println!("time by phase:");
        print_times(&s.time);
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    match &cli.cmd {
        Cmd::Disk { what } => return disk::run(&cli, what),
        Cmd::Init {
            dir,
            scheme,
            block_size,
            kdf_memory,
            kdf_passes,
        } => {
            check_verify_only_reads(&cli, false)?;
            let auto = scheme == intact_core::volume::AUTO;
            let scheme = if auto {
                SchemeId::MtEintGcm
            } else {
                SchemeId::parse(scheme)?
            };
            warn_unprotected(scheme);
            let store: Arc<dyn UntrustedStore> = match s3_url(dir) {
                Some(url) => {
                    let s3 = S3Store::open(&url?)?;
                    s3.check_new_prefix()?;
                    Arc::new(s3)
                }
                None => {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    check_state_outside(&state_dir(&cli), dir)?;
                    Arc::new(LocalDirStore::open(dir)?)
                }
            };
            let pw = password(&cli, true)?;
            let copts = CreateOptions {
                block_size: *block_size,
                scheme,
                auto,
                kdf: intact_core::crypto::KdfParams {
                    m_kib: *kdf_memory,
                    t: *kdf_passes,
                    p: 1,
                },
                inline_leaf: true,
                dir_tree: true,
                inline_mac: true,
                inline_tree: true,
                inline_data: true,
                ctr_segments: true,
                twin_blocks: true,
                leaf_log: true,
                log_delta: true,
            };
            // The volume id is only known once the config exists, so the state directory
            // for the anchor is chosen by a two-step create.
            let sd = state_dir(&cli);
            let published = store.clone();
            let vol = Volume::create(
                store,
                |id| {
                    let st = LocalStateDir::new(sd.clone(), id)?;
                    trusted(&cli, &st, &published).map_err(|e| Error::Invalid(format!("{e:#}")))
                },
                pw.as_bytes(),
                &copts,
                &Options::default(),
            )?;
            let info = vol.info()?;
            if cli.json {
                print_json(&info)?;
            } else {
                println!(
                    "created volume {} in {} (scheme {}, {}-byte blocks); anchor at {}",
                    info.volume_id,
                    dir.display(),
                    info.scheme,
                    info.block_size,
                    info.anchor
                );
            }
        }
        Cmd::Put { src, path, scheme } => {
            // `--scheme auto`: the policy picks (and may later change) the scheme.
            let want_auto = scheme.as_deref() == Some(intact_core::volume::AUTO);
            let scheme = scheme
                .as_deref()
                .filter(|_| !want_auto)
                .map(SchemeId::parse)
                .transpose()?;
            if let Some(s) = scheme {
                warn_unprotected(s);
            }
            let (mut input, total): (Box<dyn Read>, u64) = if src.as_os_str() == "-" {
                (Box::new(std::io::stdin().lock()), 0)
            } else {
                let f = std::fs::File::open(src)
                    .with_context(|| format!("opening {}", src.display()))?;
                let meta = f.metadata()?;
                if meta.is_dir() {
                    bail!("{} is a directory", src.display());
                }
                (Box::new(f), meta.len())
            };
            let vol = open(&cli, false)?;
            // A replaced file keeps its scheme (or auto policy) unless --scheme says otherwise.
            let mut auto = want_auto;
            let scheme = match (scheme, vol.stat(path)) {
                (Some(s), _) => Some(s),
                (None, Ok(st)) if st.kind == Kind::File => {
                    auto |= st.auto;
                    Some(SchemeId::parse(&st.scheme)?)
                }
                (None, Ok(st)) if st.kind == Kind::Dir => bail!("{path}: is a directory"),
                (None, Ok(_)) => bail!("{path} exists and is not a regular file"),
                (None, Err(_)) => None,
            };
            // Write under a temporary name, then rename over the target: the old content
            // stays readable until the new one is complete and sealed.
            let (dir, base) = path
                .trim_end_matches('/')
                .rsplit_once('/')
                .unwrap_or(("", path.as_str()));
            let mut nonce = [0u8; 8];
            intact_core::crypto::fill_random(&mut nonce);
            let tmp = format!(
                "{dir}/.{base}.intact-put-{:016x}",
                u64::from_le_bytes(nonce)
            );
            let ino = vol.create_file(&tmp, scheme)?;
            if auto {
                vol.set_auto(ino, true)?;
            }
            let pb = bar(total, "put");
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0u64;
            loop {
                let n = read_full(&mut input, &mut buf)?;
                if n == 0 {
                    break;
                }
                vol.write_path(&tmp, off, &buf[..n])?;
                off += n as u64;
                pb.inc(n as u64);
            }
            vol.rename(&tmp, path)?;
            vol.sync()?;
            pb.finish_and_clear();
        }
        Cmd::Get { path, dst } => {
            let vol = open(&cli, true)?;
            let st = vol.stat(path)?;
            let mut out: Box<dyn Write> = if dst.as_os_str() == "-" {
                Box::new(std::io::stdout().lock())
            } else {
                Box::new(std::io::BufWriter::new(
                    std::fs::File::create(dst)
                        .with_context(|| format!("creating {}", dst.display()))?,
                ))
            };
            let pb = bar(st.size, "get");
            let copied = copy_out(&vol, path, &mut out, &pb).and_then(|()| Ok(out.flush()?));
            drop(out);
            if let Err(e) = copied {
                // Leave no truncated copy behind that could pass for the file.
                if dst.as_os_str() != "-" {
                    let _ = std::fs::remove_file(dst);
                }
                return Err(e);
            }
            pb.finish_and_clear();
        }
        Cmd::Cat { path } => {
            let vol = open(&cli, true)?;
            let mut out = std::io::stdout().lock();
            copy_out(&vol, path, &mut out, &ProgressBar::hidden())?;
            out.flush()?;
        }
        Cmd::Ls { path, long } => {
            let vol = open(&cli, true)?;
            let entries = vol.readdir(path)?;
            if cli.json {
                let mut rows = Vec::new();
                for e in &entries {
                    let p = join(path, &e.name);
                    rows.push(
                        serde_json::json!({"name": e.name, "kind": e.kind, "stat": vol.stat(&p)?}),
                    );
                }
                print_json(&rows)?;
            } else {
                for e in entries {
                    if *long {
                        let p = join(path, &e.name);
                        let st = vol.stat(&p)?;
                        let t = match st.kind {
                            Kind::Dir => 'd',
                            Kind::Symlink => 'l',
                            Kind::Fifo => 'p',
                            Kind::Socket => 's',
                            Kind::CharDev => 'c',
                            Kind::BlockDev => 'b',
                            _ => '-',
                        };
                        // A device shows its number (major, minor) where a size would be,
                        // as ls does; content-less inodes have no scheme.
                        let size = if st.kind.is_device() {
                            let d = u64::from(st.rdev);
                            format!("{}, {}", libc::major(d), libc::minor(d))
                        } else {
                            st.size.to_string()
                        };
                        let scheme = match st.kind {
                            Kind::File => st.scheme.as_str(),
                            _ => "-",
                        };
                        let target = match st.kind {
                            Kind::Symlink => format!(" -> {}", vol.readlink(&p)?),
                            _ => String::new(),
                        };
                        println!(
                            "{t}{:04o} {:>12} {:<12} {}{target}",
                            st.mode, size, scheme, e.name
                        );
                    } else {
                        println!("{}", e.name);
                    }
                }
            }
        }
        Cmd::Mkdir { path, parents } => {
            let vol = open(&cli, false)?;
            if *parents {
                let mut p = String::new();
                for c in path.split('/').filter(|c| !c.is_empty()) {
                    p.push('/');
                    p.push_str(c);
                    match vol.mkdir(&p) {
                        Ok(_) => {}
                        Err(Error::Fs {
                            kind: intact_core::FsErrorKind::Exists,
                            ..
                        }) => {
                            if vol.stat(&p)?.kind != Kind::Dir {
                                bail!("{p} exists and is not a directory");
                            }
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            } else {
                vol.mkdir(path)?;
            }
            vol.sync()?;
        }
        Cmd::Rm { path, recursive } => {
            if path.split('/').all(|c| c.is_empty() || c == ".") {
                bail!("{path}: refusing to remove the root directory");
            }
            let vol = open(&cli, false)?;
            if *recursive && vol.stat(path)?.kind == Kind::Dir {
                remove_tree(&vol, path)?;
            } else {
                vol.unlink(path)?;
            }
            vol.sync()?;
        }
        Cmd::Mv { from, to } => {
            let vol = open(&cli, false)?;
            let to = match vol.stat(to) {
                // `mv a/ dir` moves a into dir: the basename ignores trailing slashes.
                Ok(st) if st.kind == Kind::Dir => join(
                    to,
                    from.trim_end_matches('/')
                        .rsplit('/')
                        .next()
                        .unwrap_or(from),
                ),
                _ => to.clone(),
            };
            vol.rename(from, &to)?;
            vol.sync()?;
        }
        Cmd::Ln { target, path, .. } => {
            let vol = open(&cli, false)?;
            vol.symlink(target, path)?;
            vol.sync()?;
        }
        Cmd::Mount {
            cipherdir,
            mountpoint,
            ..
        } => {
            // Absolute paths: the daemon and `intact stat` find the mount by them.
            let abs = |p: &PathBuf| {
                p.canonicalize()
                    .with_context(|| format!("{}: no such directory", p.display()))
            };
            // An S3 volume's URL stays as given.
            let cipherdir = &match s3_url(cipherdir) {
                Some(_) => cipherdir.clone(),
                None => abs(cipherdir)?,
            };
            let mountpoint = &abs(mountpoint)?;
            let a = mount::MountArgs::of(&cli.cmd, cipherdir, mountpoint).expect("a mount");
            return mount::mount(&cli, &a);
        }
        Cmd::Stat { path: None, .. } => {
            let (_, state) = locate(&cli)?;
            let st = mount::read_status(&state);
            if cli.json {
                print_json(&serde_json::json!({ "mount": st }))?;
            } else {
                match st {
                    None => println!("never mounted"),
                    Some(v) => {
                        let mounted = v["mounted"].as_bool().unwrap_or(false)
                            && pid_alive(v["pid"].as_u64().unwrap_or(0));
                        println!(
                            "mount:              {} {}",
                            if mounted {
                                "mounted at"
                            } else {
                                "last mounted at"
                            },
                            v["mountpoint"].as_str().unwrap_or("?")
                        );
                        println!(
                            "integrity failures: {}{}",
                            v["integrity_failures"],
                            if mounted {
                                ""
                            } else {
                                " (during the last mount)"
                            }
                        );
                        if let Some(f) = v["last_failure"].as_str() {
                            println!("last failure:       {f}");
                        }
                    }
                }
            }
        }
        Cmd::Stat {
            path: Some(path),
            integrity: true,
        } => {
            let vol = open(&cli, true)?;
            // Check (read and verify) every block once, so the numbers are measured.
            let size = vol.stat(path)?.size;
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0;
            while off < size {
                let n = vol.read_path(path, off, &mut buf)?;
                if n == 0 {
                    break;
                }
                off += n as u64;
            }
            let f = vol.file_integrity(path)?;
            if cli.json {
                print_json(&f)?;
            } else {
                print_file_integrity(&f);
            }
        }
        Cmd::Stat {
            path: Some(path), ..
        } => {
            let vol = match open(&cli, true) {
                Err(e) if matches!(e.downcast_ref::<Error>(), Some(Error::Locked(_))) => {
                    return Err(e.context(
                        "the volume is in use (mounted?): run `intact stat` without a path for \
                         the mount's integrity report, or look at the file through the mount",
                    ));
                }
                r => r?,
            };
            let st = vol.stat(path)?;
            if cli.json {
                print_json(&st)?;
            } else {
                println!("  path: {path}");
                println!("  kind: {:?}", st.kind);
                println!("  size: {}", st.size);
                println!("  mode: {:04o}", st.mode);
                println!(" inode: {}", st.ino);
                println!(
                    "scheme: {}{}",
                    st.scheme,
                    if st.auto {
                        " (chosen by the auto policy)"
                    } else {
                        ""
                    }
                );
                if st.scheme == SchemeId::None.name() {
                    println!("        (NO integrity: tampering with this file goes undetected)");
                }
                println!("blocks: {}", st.blocks);
                println!(
                    "counter intervals: {}{}",
                    st.counter_intervals,
                    if st.counters_spilled {
                        " (spilled to untrusted storage, hashes in TS_F)"
                    } else {
                        " (in TS_F)"
                    }
                );
                if st.kind == Kind::Symlink {
                    println!("target: {}", vol.readlink(path)?);
                }
            }
        }
        Cmd::Fsck {
            salvage: Some(dir),
            quarantine,
            ..
        } => {
            let vol = open(&cli, !*quarantine)?;
            let total = vol.content_bytes()?;
            let pb = bar(total, "salvage");
            let damaged = alarm::salvage(&vol, dir, *quarantine, &mut |n| pb.inc(n))?;
            pb.finish_and_clear();
            if cli.json {
                print_json(&serde_json::json!({
                    "ok": damaged.is_empty(),
                    "salvaged_into": dir,
                    "damaged": damaged,
                }))?;
            } else {
                for d in &damaged {
                    let ranges: Vec<String> = d
                        .ranges
                        .iter()
                        .map(|(a, b)| match *b {
                            u64::MAX => "all".to_string(),
                            b => format!("bytes {a}..{b}"),
                        })
                        .collect();
                    println!(
                        "{}: damaged ({}), left as holes: {}{}",
                        d.path,
                        d.what,
                        ranges.join(", "),
                        d.quarantined
                            .as_ref()
                            .map(|q| format!("; moved to {q}"))
                            .unwrap_or_default()
                    );
                }
                eprintln!(
                    "salvage: copied into {}; {} damaged file(s)",
                    dir.display(),
                    damaged.len()
                );
            }
            if !damaged.is_empty() {
                return Ok(ExitCode::from(code::INTEGRITY));
            }
        }
        Cmd::Fsck { remove_orphans, .. } => {
            let vol = open(&cli, !*remove_orphans)?;
            let total = vol.content_bytes()?;
            let pb = bar(total, "fsck");
            let failures = vol.fsck(&mut |n| pb.inc(n))?;
            pb.finish_and_clear();
            let orphans = vol.orphans()?;
            let removed = if *remove_orphans && failures.is_empty() {
                vol.remove_orphans()?
            } else {
                0
            };
            if cli.json {
                print_json(&serde_json::json!({
                    "ok": failures.is_empty(),
                    "failures": failures,
                    "orphans": orphans,
                    "orphans_removed": removed,
                }))?;
            } else {
                for f in &failures {
                    println!("{f}");
                }
                for o in &orphans {
                    println!("{o}: orphaned object (not referenced by any file; left by an interrupted write){}", if removed > 0 { ": removed" } else { "" });
                }
                if failures.is_empty() {
                    eprintln!("fsck: no integrity failures");
                } else {
                    eprintln!("fsck: {} integrity failure(s)", failures.len());
                }
                if !orphans.is_empty() && removed == 0 {
                    eprintln!(
                        "fsck: {} orphaned object(s); `intact fsck --remove-orphans` deletes them",
                        orphans.len()
                    );
                }
            }
            if !failures.is_empty() {
                return Ok(ExitCode::from(code::INTEGRITY));
            }
        }
        Cmd::Info { measure } => {
            let report = alarm::state_report(&cli)?;
            let vol = match open(&cli, true) {
                Ok(v) => v,
                Err(e) => {
                    alarm::print_report(&cli, &report, &e)?;
                    return Err(e);
                }
            };
            let i = vol.info()?;
            let mut failures = 0;
            if *measure {
                failures = vol.fsck(&mut |_| {})?.len();
            }
            let v = vol.integrity()?;
            if cli.json {
                let mut j = serde_json::to_value(&i)?;
                j["integrity"] = serde_json::to_value(&v)?;
                j["state"] = serde_json::to_value(&report)?;
                if *measure {
                    j["integrity_failures"] = failures.into();
                }
                print_json(&j)?;
            } else {
                println!("volume:             {}", i.volume_id);
                println!("scheme:             {}", i.scheme);
                println!("block size:         {}", i.block_size);
                println!(
                    "files:              {} ({} directories, {} symlinks, {} special)",
                    i.files, i.directories, i.symlinks, i.special_files
                );
                println!("content bytes:      {}", i.content_bytes);
                println!(
                    "trusted bytes:      {} (the anchor, constant)",
                    i.trusted_bytes
                );
                println!("data object bytes:  {}", i.data_object_bytes);
                println!(
                    "integrity metadata: {} bytes (Merkle nodes, spilled counters)",
                    i.integrity_bytes
                );
                println!("inode table:        {} bytes", i.inode_table_bytes);
                println!("epoch:              {}", i.epoch);
                println!("anchor:             {}", i.anchor);
                if let Some((seg, off)) = &i.log_sealed_end {
                    println!("log sealed up to:   {seg}, byte {off}");
                }
                alarm::print_seals(&report, !cli.accept_stale);
                print_volume_integrity(&v, *measure);
                if failures > 0 {
                    println!("integrity failures: {failures} (run `intact fsck`)");
                }
            }
            if failures > 0 {
                return Ok(ExitCode::from(code::INTEGRITY));
            }
        }
        Cmd::Sync { mountpoint } => mount::sync_mount(mountpoint)?,
        Cmd::Umount { mountpoint } => mount::umount(&state_dir(&cli), mountpoint)?,
        Cmd::Bench {
            what: bench::BenchCmd::Schemes(a),
        } => bench::schemes(a, cli.cache_bytes.unwrap_or(1024), cli.json)?,
        Cmd::Bench {
            what: bench::BenchCmd::Dir(a),
        } => bench_dir::dir(
            a,
            cli.cache_bytes.unwrap_or(16 << 20),
            meta_cache(&cli),
            cli.records.unwrap_or(intact_core::volume::KEEP_OPEN),
            cli.json,
        )?,
        Cmd::Bench {
            what: bench::BenchCmd::Traces(a),
        } => bench_trace::traces(a, cli.cache_bytes.unwrap_or(1024), cli.json)?,
        Cmd::Bench {
            what: bench::BenchCmd::Yun(a),
        } => bench_yun::yun(a, cli.json)?,
        Cmd::Bench {
            what: bench::BenchCmd::OpreaReiter(a),
        } => bench_or::oprea_reiter(a, cli.json)?,
        Cmd::Bench {
            what: bench::BenchCmd::Report(a),
        } => bench_report::report(a)?,
        Cmd::Bench {
            what: bench::BenchCmd::Attacks(a),
        } => bench_attacks::attacks(a, cli.json)?,
        Cmd::Bench {
            what: bench::BenchCmd::Contiu(a),
        } => bench_contiu::contiu(a, cli.json)?,
        Cmd::AcceptStore { yes } => alarm::accept_store(&cli, *yes)?,
        Cmd::Scrub {
            rate,
            threads,
            limit_bytes,
            restart,
        } => {
            let (_, state) = locate(&cli)?;
            let pw = password(&cli, false)?;
            let n = threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                .max(1);
            let vols = (0..n)
                .map(|_| open_pw(&cli, &pw, true).map(Arc::new))
                .collect::<Result<Vec<_>>>()?;
            let volume_id = vols[0].info()?.volume_id;
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            for sig in [libc::SIGINT, libc::SIGTERM] {
                signal_hook::flag::register(sig, stop.clone())?;
            }
            let pb = Mutex::new(None::<ProgressBar>);
            let opts = scrub::ScrubOpts {
                rate: rate.map(|r| r * 1e6),
                limit: *limit_bytes,
                restart: *restart,
            };
            let report = scrub::scrub(
                &vols,
                &volume_id,
                &scrub::cursor_path(state.volume_dir()),
                &opts,
                &stop,
                &|n, total| {
                    let mut pb = pb.lock().unwrap_or_else(|p| p.into_inner());
                    pb.get_or_insert_with(|| bar(total, "scrub")).inc(n);
                },
            )?;
            if let Some(pb) = pb.into_inner().unwrap_or_else(|p| p.into_inner()) {
                pb.finish_and_clear();
            }
            if cli.json {
                print_json(&report)?;
            } else {
                for f in &report.failures {
                    println!("{}: {}", f.path, f.what);
                }
                eprintln!(
                    "scrub: {} bytes verified in {:.1} s ({:.0} MB/s), {} files, {} directories, \
                     {} failure(s){}",
                    report.bytes_verified,
                    report.seconds,
                    report.bytes_verified as f64 / report.seconds.max(1e-9) / 1e6,
                    report.files,
                    report.directories,
                    report.failures.len(),
                    if report.complete {
                        ""
                    } else {
                        "; stopped before the end: `intact scrub` goes on from here"
                    }
                );
            }
            if !report.failures.is_empty() {
                return Ok(ExitCode::from(code::INTEGRITY));
            }
        }
        Cmd::Anchor {
            what: AnchorCmd::Move { to },
        } => anchor_move(&cli, to)?,
        Cmd::Keygen { alg, import, out } => keygen(alg, import.as_deref(), out, cli.json)?,
        Cmd::RecoverAnchor {
            i_accept_rollback_risk,
        } => {
            if !i_accept_rollback_risk {
                bail!(
                    "recover-anchor trusts the cipher directory's own copy of the anchor, so a rollback \
                     of the directory made before now would go undetected. Re-run with \
                     --i-accept-rollback-risk to proceed."
                );
            }
            let (store, state) = locate(&cli)?;
            let trusted = trusted(&cli, &state, &store)?;
            let pw = password(&cli, false)?;
            let epoch = Volume::recover_anchor(store.as_ref(), trusted.as_ref(), pw.as_bytes())?;
            println!(
                "anchor restored at epoch {epoch} into {}",
                trusted.location()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}

fn copy_out(vol: &Volume, path: &str, out: &mut dyn Write, pb: &ProgressBar) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = vol.read_path(path, off, &mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        off += n as u64;
        pb.inc(n as u64);
    }
    Ok(())
}

fn remove_tree(vol: &Volume, path: &str) -> Result<()> {
    for e in vol.readdir(path)? {
        let p = join(path, &e.name);
        if e.kind == Kind::Dir {
            remove_tree(vol, &p)?;
        } else {
            vol.unlink(&p)?;
        }
    }
    vol.rmdir(path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::GoneClients;

    #[test]
    fn only_replies_to_gone_clients_are_quieted() {
        let gone = "Failed to send FUSE reply: No such file or directory (os error 2)";
        assert!(GoneClients::is_gone_client("fuser::reply", gone));
        // Another send failure (the device failing) stays an error.
        let other = "Failed to send FUSE reply: Input/output error (os error 5)";
        assert!(!GoneClients::is_gone_client("fuser::reply", other));
        assert!(!GoneClients::is_gone_client("intact_fuse", gone));
        assert!(!GoneClients::is_gone_client(
            "fuser::reply",
            "Reply not sent for operation 3"
        ));
    }
}
