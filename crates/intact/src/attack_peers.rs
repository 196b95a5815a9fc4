//! The twelve attacks of docs/threat-model.md against the encrypted file systems installed
//! beside intact (gocryptfs, CryFS, securefs), through their own mounts.
//!
//! A peer stores a file in objects of its cipher directory that only it can name. The
//! harness learns which by watching, as an adversary who sees the directory change would:
//! each fixture file is written in a mount of its own, and the objects that appear are that
//! file's. Where a block lives is learnt the same way: one byte of it is rewritten, and the
//! object that changes holds the block. gocryptfs and securefs keep a file in one object,
//! its blocks at places their formats fix (checked against the change); CryFS keeps every
//! block in an object of its own. Each attack then does to the cipher directory what
//! `intact_core::attacks` does to intact's store, and the file is read back through a new
//! mount. A refused mount or an error other than "no such file" is a detection; otherwise
//! the bytes are compared with what was written, to say what the reader silently got.

use crate::bench::TempDir;
use anyhow::{bail, Context, Result};
use intact_core::attacks::{Content, ATTACKS};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The peers' block size, and ours in the fixture (4 KiB, as in `intact_core::attacks`).
const U: usize = 4096;
const PASSWORD: &str = "intact bench attacks (a throwaway volume)";

/// An encrypted file system to attack.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum PeerKind {
    Gocryptfs,
    Cryfs,
    Securefs,
}

impl PeerKind {
    pub(crate) const ALL: [PeerKind; 3] =
        [PeerKind::Gocryptfs, PeerKind::Cryfs, PeerKind::Securefs];

    pub(crate) fn name(self) -> &'static str {
        match self {
            PeerKind::Gocryptfs => "gocryptfs",
            PeerKind::Cryfs => "cryfs",
            PeerKind::Securefs => "securefs",
        }
    }

    fn by_name(name: &str) -> Option<PeerKind> {
        PeerKind::ALL.into_iter().find(|k| k.name() == name)
    }

    fn installed(self) -> bool {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(self.name()).is_file()))
    }

    fn version(self) -> String {
        let arg = match self {
            PeerKind::Gocryptfs => "-version",
            PeerKind::Cryfs => "--version",
            PeerKind::Securefs => "version",
        };
        let out = Command::new(self.name())
            .arg(arg)
            .env("CRYFS_NO_UPDATE_CHECK", "true")
            .output();
        let text = out
            .map(|o| {
                let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
                s.push_str(&String::from_utf8_lossy(&o.stderr));
                s
            })
            .unwrap_or_default();
        let own = text
            .lines()
            .find(|l| l.to_ascii_lowercase().contains("version") || l.contains(self.name()))
            .unwrap_or("")
            .trim()
            .to_string();
        // Debian's securefs says "GIT-NOTFOUND": the package's version says more.
        let package = Command::new("dpkg-query")
            .args(["-W", "-f", "${Version}", self.name()])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|v| !v.is_empty());
        match package {
            Some(v) if !own.contains(&v) => format!("{own}; package {v}"),
            _ if own.is_empty() => "version unknown".into(),
            _ => own,
        }
    }

    /// Where block `i` of a file lives in the file's one object: a header, then records of
    /// nonce or IV, ciphertext and tag (`None`: every block is an object of its own).
    fn layout(self) -> Option<(usize, usize)> {
        match self {
            // gocryptfs: 18-byte header (version, file id); 16-byte nonce + 4096 + 16-byte tag.
            PeerKind::Gocryptfs => Some((18, U + 32)),
            // securefs lite format (4): 16-byte header; 12-byte IV + 4096 + 16-byte MAC.
            PeerKind::Securefs => Some((16, U + 28)),
            PeerKind::Cryfs => None,
        }
    }

    /// Whether a directory of the file system is a directory of the cipher directory
    /// (gocryptfs, securefs). CryFS keeps directories in blocks like files, and files its
    /// blocks in directories named by the blocks' first three hex digits: those buckets are
    /// nobody's objects.
    fn keeps_directories(self) -> bool {
        self != PeerKind::Cryfs
    }

    fn init(self, s: &Scratch) -> Result<()> {
        let out = match self {
            PeerKind::Gocryptfs => Command::new("gocryptfs")
                .args(["-init", "-q", "-scryptn", "10", "-passfile"])
                .arg(&s.passfile)
                .arg(&s.cipher)
                .output()?,
            PeerKind::Securefs => Command::new("securefs")
                .args(["create", "--pass", PASSWORD, "-r", "1"])
                .args(["--pbkdf", "pkcs5-pbkdf2-hmac-sha256"])
                .arg(&s.cipher)
                .output()?,
            // CryFS creates its file system at the first mount.
            PeerKind::Cryfs => return Ok(()),
        };
        if !out.status.success() {
            bail!(
                "{} could not create a file system: {}",
                self.name(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// The command that serves `s` in the foreground (the first mount of CryFS creates it,
    /// with 4 KiB blocks like the others').
    fn mount_command(self, s: &Scratch, first: bool) -> Command {
        let mut c = Command::new(self.name());
        match self {
            PeerKind::Gocryptfs => {
                c.args(["-fg", "-q", "-passfile"]).arg(&s.passfile);
            }
            PeerKind::Securefs => {
                c.args(["mount", "--pass", PASSWORD]);
            }
            PeerKind::Cryfs => {
                c.arg("-f")
                    .env("CRYFS_FRONTEND", "noninteractive")
                    .env("CRYFS_NO_UPDATE_CHECK", "true")
                    .env("CRYFS_LOCAL_STATE_DIR", &s.state);
                if first {
                    c.args(["--cipher", "aes-256-gcm", "--blocksize", "4096"]);
                }
            }
        }
        c.arg(&s.cipher).arg(&s.plain);
        c
    }
}

/// The peers to attack: those named (`none`: no peer), or every one installed.
pub(crate) fn chosen(names: &[String]) -> Result<Vec<PeerKind>> {
    if names.is_empty() {
        return Ok(PeerKind::ALL
            .into_iter()
            .filter(|k| k.installed())
            .collect());
    }
    let mut out = Vec::new();
    for n in names {
        if n == "none" {
            continue;
        }
        let k = PeerKind::by_name(n)
            .with_context(|| format!("unknown peer {n:?} (gocryptfs, cryfs, securefs or none)"))?;
        if k.installed() && !out.contains(&k) {
            out.push(k);
        }
    }
    Ok(out)
}

/// The peers asked for (or, by default, known) that are not installed, and why.
pub(crate) fn unavailable(names: &[String]) -> Vec<(String, String)> {
    let asked: Vec<PeerKind> = if names.is_empty() {
        PeerKind::ALL.to_vec()
    } else {
        names.iter().filter_map(|n| PeerKind::by_name(n)).collect()
    };
    asked
        .into_iter()
        .filter(|k| !k.installed())
        .map(|k| {
            (
                k.name().to_string(),
                format!("not installed (apt install {})", k.name()),
            )
        })
        .collect()
}

/// One attack on one peer.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct PeerRun {
    pub(crate) peer: String,
    pub(crate) version: String,
    pub(crate) attack: usize,
    pub(crate) name: String,
    /// The mount was refused, or the read failed with an error other than ENOENT.
    pub(crate) detected: bool,
    /// The reader got exactly what was last written: the attack changed nothing this peer
    /// reads (neither a detection nor a miss).
    pub(crate) no_effect: bool,
    /// What the reader got.
    pub(crate) got: String,
    /// Bytes the peer keeps outside the cipher directory (its trusted state, if any: CryFS's
    /// integrity data) for the fixture, and the files in its cipher directory then.
    pub(crate) local_state_bytes: u64,
    pub(crate) cipher_files: usize,
}

/// A peer's cipher directory, mount point and local state, removed when dropped.
struct Scratch {
    _dir: TempDir,
    root: PathBuf,
    cipher: PathBuf,
    plain: PathBuf,
    state: PathBuf,
    passfile: PathBuf,
}

impl Scratch {
    fn new(workdir: &Path, kind: PeerKind) -> Result<Scratch> {
        let dir = TempDir::new(workdir, kind.name())?;
        let root = dir.0.clone();
        let s = Scratch {
            cipher: root.join("cipher"),
            plain: root.join("plain"),
            state: root.join("state"),
            passfile: root.join("pass"),
            root,
            _dir: dir,
        };
        for d in [&s.cipher, &s.plain, &s.state] {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(&s.passfile, format!("{PASSWORD}\n"))?;
        Ok(s)
    }

    /// A copy of this scratch volume (cipher directory and local state), for one attack.
    fn copy(&self, workdir: &Path, kind: PeerKind) -> Result<Scratch> {
        let s = Scratch::new(workdir, kind)?;
        for (from, to) in [(&self.cipher, &s.cipher), (&self.state, &s.state)] {
            std::fs::remove_dir_all(to)?;
            let st = Command::new("cp").arg("-a").arg(from).arg(to).status()?;
            if !st.success() {
                bail!("cp -a {} {} failed", from.display(), to.display());
            }
        }
        Ok(s)
    }

    fn obj(&self, rel: &str) -> PathBuf {
        self.cipher.join(rel)
    }

    fn read(&self, rel: &str) -> Result<Vec<u8>> {
        std::fs::read(self.obj(rel)).with_context(|| format!("reading {rel}"))
    }

    fn write(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        // The peers create some objects read-only (gocryptfs.conf): the adversary owns the
        // directory, so it replaces the file.
        let p = self.obj(rel);
        let _ = std::fs::remove_file(&p);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(&p, bytes).with_context(|| format!("writing {rel}"))
    }

    fn edit(&self, rel: &str, f: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        let mut b = self.read(rel)?;
        f(&mut b);
        self.write(rel, &b)
    }
}

/// A running peer daemon, unmounted (and stopped) when dropped.
struct Mounted {
    child: Child,
    plain: PathBuf,
    done: bool,
}

fn is_mounted(p: &Path) -> bool {
    let Ok(p) = p.canonicalize() else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = p.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| m == want))
}

/// Mounts `s`; `Ok(Err(why))` when the peer refused.
fn mount(kind: PeerKind, s: &Scratch, first: bool) -> Result<std::result::Result<Mounted, String>> {
    let log = s.root.join("log");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)?;
    let mut child = kind
        .mount_command(s, first)
        .stdin(Stdio::piped())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {}", kind.name()))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        // CryFS reads the password on its input; the others ignore it.
        let _ = stdin.write_all(format!("{PASSWORD}\n").as_bytes());
    }
    let t = Instant::now();
    loop {
        if is_mounted(&s.plain) {
            return Ok(Ok(Mounted {
                child,
                plain: s.plain.clone(),
                done: false,
            }));
        }
        if let Some(st) = child.try_wait()? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let last: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = last[last.len().saturating_sub(3)..].join(" / ");
            return Ok(Err(format!("mount refused ({st}): {tail}")));
        }
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{} did not mount within 120 s", kind.name());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Mounted {
    fn p(&self, path: &str) -> PathBuf {
        self.plain.join(path.trim_start_matches('/'))
    }

    /// Unmounts and waits for the daemon to write out and exit.
    fn unmount(mut self) -> Result<()> {
        self.done = true;
        let t = Instant::now();
        while is_mounted(&self.plain) {
            let st = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.plain)
                .stderr(Stdio::null())
                .status()?;
            if st.success() {
                break;
            }
            if t.elapsed() > Duration::from_secs(30) {
                bail!("could not unmount {}", self.plain.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let t = Instant::now();
        while self.child.try_wait()?.is_none() {
            if t.elapsed() > Duration::from_secs(120) {
                let _ = self.child.kill();
                bail!("the daemon did not exit within 120 s of its unmount");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if !self.done {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.plain)
                .stderr(Stdio::null())
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn mount_ok(kind: PeerKind, s: &Scratch, first: bool) -> Result<Mounted> {
    match mount(kind, s, first)? {
        Ok(m) => Ok(m),
        Err(why) => bail!("{}: {why}", kind.name()),
    }
}

/// Every entry under `root`: files with their bytes, directories as `None`.
type Snap = BTreeMap<String, Option<Vec<u8>>>;

fn snapshot(root: &Path) -> Result<Snap> {
    fn walk(root: &Path, dir: &Path, out: &mut Snap) -> Result<()> {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            let rel = p
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .into_owned();
            if p.is_dir() {
                out.insert(rel, None);
                walk(root, &p, out)?;
            } else {
                out.insert(rel, Some(std::fs::read(&p)?));
            }
        }
        Ok(())
    }
    let mut out = Snap::new();
    walk(root, root, &mut out)?;
    Ok(out)
}

/// Puts `names` back as they are in `snap` (deleting those it lacks).
fn restore(s: &Scratch, snap: &Snap, names: &[String]) -> Result<()> {
    for n in names {
        match snap.get(n) {
            Some(Some(bytes)) => s.write(n, bytes)?,
            Some(None) => std::fs::create_dir_all(s.obj(n))?,
            None => {
                let p = s.obj(n);
                if p.is_dir() {
                    std::fs::remove_dir_all(&p)?;
                } else if p.exists() {
                    std::fs::remove_file(&p)?;
                }
            }
        }
    }
    Ok(())
}

/// Where one block of a file lives.
#[derive(Clone, Debug)]
struct Place {
    object: String,
    range: std::ops::Range<usize>,
}

/// What was written through the mount, to say what a reader got.
#[derive(Clone, Default)]
struct Model {
    current: BTreeMap<String, Vec<u8>>,
    older: BTreeMap<String, Vec<Vec<u8>>>,
}

impl Model {
    fn write_at(&mut self, path: &str, off: usize, data: &[u8]) {
        let cur = self.current.entry(path.to_string()).or_default();
        self.older
            .entry(path.to_string())
            .or_default()
            .push(cur.clone());
        if cur.len() < off + data.len() {
            cur.resize(off + data.len(), 0);
        }
        cur[off..off + data.len()].copy_from_slice(data);
    }

    fn remove(&mut self, path: &str) {
        if let Some(old) = self.current.remove(path) {
            self.older.entry(path.to_string()).or_default().push(old);
        }
    }

    /// What the reader of `path` got, said plainly, and whether it is exactly the current
    /// contents.
    fn describe(&self, path: &str, got: &[u8]) -> (String, bool) {
        let cur = self.current.get(path);
        if cur.is_some_and(|c| c == got) {
            return (
                "the current contents: the attack changed nothing it reads".into(),
                true,
            );
        }
        if self
            .older
            .get(path)
            .is_some_and(|o| o.iter().any(|v| v == got))
        {
            return if cur.is_none() {
                (
                    "the deleted file, back with its contents, and no error".into(),
                    false,
                )
            } else {
                ("an older version of the file, and no error".into(), false)
            };
        }
        if let Some((other, _)) = self
            .current
            .iter()
            .find(|(p, c)| p.as_str() != path && c.as_slice() == got)
        {
            return (format!("the contents of {other}, and no error"), false);
        }
        let Some(cur) = cur else {
            return ("a file that was deleted, and no error".into(), false);
        };
        if got.len() < cur.len() && cur.starts_with(got) {
            return (
                format!(
                    "the file cut from {} to {} bytes, and no error",
                    cur.len(),
                    got.len()
                ),
                false,
            );
        }
        let blocks: Vec<usize> = (0..cur.len().max(got.len()).div_ceil(U))
            .filter(|&b| {
                let r = |v: &[u8]| v[(b * U).min(v.len())..((b + 1) * U).min(v.len())].to_vec();
                r(cur) != r(got)
            })
            .collect();
        let zeros = blocks.iter().all(|&b| {
            got[(b * U).min(got.len())..((b + 1) * U).min(got.len())]
                .iter()
                .all(|&x| x == 0)
        });
        (
            format!(
                "{} in block(s) {blocks:?}, and no error",
                if zeros { "zeros" } else { "altered bytes" }
            ),
            false,
        )
    }

    /// The names the model has in directory `dir`.
    fn names_in(&self, dir: &str) -> BTreeSet<String> {
        let prefix = format!("{}/", dir.trim_end_matches('/'));
        self.current
            .keys()
            .filter_map(|p| p.strip_prefix(&prefix))
            .filter(|rest| !rest.contains('/'))
            .map(str::to_string)
            .collect()
    }
}

/// The peer's fixture (as `intact_core::attacks::Fixture`): `/a` and `/b` of 4 blocks, `/c`
/// of one, `/d1/x` of two and `/d2/y` of 100 bytes, with the objects of each and the places
/// of the blocks the attacks touch.
struct PeerFixture {
    kind: PeerKind,
    scratch: Scratch,
    objects: BTreeMap<String, Vec<String>>,
    places: BTreeMap<(String, usize), Place>,
    model: Model,
}

fn build(kind: PeerKind, workdir: &Path, progress: &dyn Fn(&str)) -> Result<PeerFixture> {
    let s = Scratch::new(workdir, kind)?;
    kind.init(&s)?;
    let content = Content::Pattern;
    let mut model = Model::default();
    let mut objects = BTreeMap::new();
    // An empty mount first: CryFS creates its file system (root directory and all) then, so
    // that what the first file adds is the file's alone.
    mount_ok(kind, &s, true)?.unmount()?;
    let mut prev = snapshot(&s.cipher)?;
    let steps: [(&str, Option<(u8, usize)>); 7] = [
        ("/a", Some((1, 4 * U))),
        ("/b", Some((2, 4 * U))),
        ("/c", Some((3, U))),
        ("/d1", None),
        ("/d2", None),
        ("/d1/x", Some((4, 2 * U))),
        ("/d2/y", Some((5, 100))),
    ];
    for (path, file) in steps {
        progress(&format!("{}: writing {path} of the fixture", kind.name()));
        let m = mount_ok(kind, &s, false)?;
        match file {
            Some((seed, len)) => {
                let data = content.bytes(seed, len);
                std::fs::write(m.p(path), &data)?;
                model.write_at(path, 0, &data);
            }
            None => std::fs::create_dir(m.p(path))?,
        }
        m.unmount()?;
        let snap = snapshot(&s.cipher)?;
        let new: Vec<String> = snap
            .iter()
            .filter(|(k, v)| !prev.contains_key(*k) && (v.is_some() || kind.keeps_directories()))
            .map(|(k, _)| k.clone())
            .collect();
        if new.is_empty() {
            bail!(
                "{}: writing {path} added nothing to the cipher directory",
                kind.name()
            );
        }
        objects.insert(path.to_string(), new);
        prev = snap;
    }
    let mut places = BTreeMap::new();
    for (path, block) in [("/a", 0), ("/a", 1), ("/a", 2), ("/b", 1)] {
        progress(&format!("{}: finding block {block} of {path}", kind.name()));
        let m = mount_ok(kind, &s, false)?;
        let off = block * U + 100;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.p(path))?;
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, off as u64)?;
        b[0] ^= 0xff;
        f.write_all_at(&b, off as u64)?;
        drop(f);
        model.write_at(path, off, &b);
        m.unmount()?;
        let snap = snapshot(&s.cipher)?;
        let changed: Vec<&String> = objects[path]
            .iter()
            .filter(|o| matches!(prev.get(*o), Some(Some(_))) && prev.get(*o) != snap.get(*o))
            .collect();
        let [object] = changed.as_slice() else {
            bail!(
                "{}: rewriting block {block} of {path} changed {} of its objects, not one",
                kind.name(),
                changed.len()
            );
        };
        let (before, after) = match (&prev[*object], snap.get(*object)) {
            (Some(b), Some(Some(a))) => (b, a),
            _ => bail!("{}: {object} is not a file", kind.name()),
        };
        let range = match kind.layout() {
            Some((header, record)) => {
                let r = header + block * record..(header + (block + 1) * record).min(after.len());
                // The bytes that changed must lie in the block's record, or the format is not
                // what this harness assumes.
                let diff: Vec<usize> = (0..before.len().max(after.len()))
                    .filter(|&k| before.get(k) != after.get(k))
                    .collect();
                if diff.first().is_none_or(|&d| d < r.start)
                    || diff.last().is_none_or(|&d| d >= r.end)
                {
                    bail!(
                        "{}: block {block} of {path} is not where its format puts it ({r:?})",
                        kind.name()
                    );
                }
                r
            }
            None => 0..after.len(),
        };
        places.insert(
            (path.to_string(), block),
            Place {
                object: (*object).clone(),
                range,
            },
        );
        prev = snap;
    }
    Ok(PeerFixture {
        kind,
        scratch: s,
        objects,
        places,
        model,
    })
}

/// Reads `path` (a file, or a directory's listing) through a new mount.
fn outcome(
    kind: PeerKind,
    s: &Scratch,
    model: &Model,
    path: &str,
    dir: bool,
) -> Result<(bool, bool, String)> {
    let m = match mount(kind, s, false)? {
        Ok(m) => m,
        Err(why) => return Ok((true, false, why)),
    };
    let r = if dir {
        match std::fs::read_dir(m.p(path)).and_then(|d| {
            d.map(|e| e.map(|e| e.file_name()))
                .collect::<Result<Vec<_>, _>>()
        }) {
            Ok(names) => {
                let got: BTreeSet<String> = names
                    .into_iter()
                    .map(|n| n.to_string_lossy().into_owned())
                    .collect();
                let want = model.names_in(path);
                if got == want {
                    (
                        false,
                        true,
                        "the current listing: the attack changed nothing it reads".to_string(),
                    )
                } else {
                    (
                        false,
                        false,
                        format!("lists {got:?} instead of {want:?}, and no error"),
                    )
                }
            }
            Err(e) => (true, false, format!("listing failed: {e}")),
        }
    } else {
        match std::fs::read(m.p(path)) {
            Ok(bytes) => {
                let (got, same) = model.describe(path, &bytes);
                (false, same, got)
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => (
                false,
                false,
                "no such file: the file is gone, and no integrity error".to_string(),
            ),
            Err(e) => (true, false, format!("read failed: {e}")),
        }
    };
    m.unmount()?;
    Ok(r)
}

/// Writes `data` at `off` of `path` through a mount, and records it.
fn change(
    kind: PeerKind,
    s: &Scratch,
    model: &mut Model,
    path: &str,
    off: usize,
    data: &[u8],
) -> Result<()> {
    let m = mount_ok(kind, s, false)?;
    let f = std::fs::OpenOptions::new().write(true).open(m.p(path))?;
    f.write_all_at(data, off as u64)?;
    drop(f);
    m.unmount()?;
    model.write_at(path, off, data);
    Ok(())
}

fn swap_bytes(s: &Scratch, p: &Place, q: &Place) -> Result<()> {
    if p.object == q.object {
        if p.range.len() != q.range.len() {
            bail!("blocks of different sizes: {:?} and {:?}", p.range, q.range);
        }
        s.edit(&p.object, |o| {
            let (x, y) = (o[p.range.clone()].to_vec(), o[q.range.clone()].to_vec());
            o[p.range.clone()].copy_from_slice(&y);
            o[q.range.clone()].copy_from_slice(&x);
        })
    } else {
        let (x, y) = (s.read(&p.object)?, s.read(&q.object)?);
        s.write(&p.object, &y)?;
        s.write(&q.object, &x)
    }
}

/// Runs attack `n` on a copy of the fixture.
fn attack(fx: &PeerFixture, n: usize, workdir: &Path) -> Result<(bool, bool, String)> {
    let kind = fx.kind;
    let s = fx.scratch.copy(workdir, kind)?;
    let mut model = fx.model.clone();
    let place = |p: &str, b: usize| fx.places[&(p.to_string(), b)].clone();
    let content = Content::Pattern;
    match n {
        1 => {
            let p = place("/a", 1);
            s.edit(&p.object, |o| o[p.range.start + 100] ^= 0x10)?;
        }
        2 => swap_bytes(&s, &place("/a", 0), &place("/a", 1))?,
        3 => {
            let (p, q) = (place("/a", 1), place("/b", 1));
            let other = s.read(&q.object)?;
            if kind.layout().is_none() {
                s.write(&p.object, &other)?;
            } else {
                s.edit(&p.object, |o| {
                    o[p.range.clone()].copy_from_slice(&other[q.range])
                })?;
            }
        }
        4 => {
            let old = snapshot(&s.cipher)?;
            change(kind, &s, &mut model, "/a", U, &content.bytes(9, U))?;
            let new = snapshot(&s.cipher)?;
            let p = place("/a", 1);
            let Some(Some(before)) = old.get(&p.object) else {
                bail!("{} had no {}", kind.name(), p.object);
            };
            s.edit(&p.object, |o| {
                o[p.range.clone()].copy_from_slice(&before[p.range.clone()])
            })?;
            // With its metadata: any other object of the file that the write changed.
            let others: Vec<String> = fx.objects["/a"]
                .iter()
                .filter(|o| **o != p.object && old.get(*o) != new.get(*o))
                .cloned()
                .collect();
            restore(&s, &old, &others)?;
        }
        5 => {
            let old = snapshot(&s.cipher)?;
            change(kind, &s, &mut model, "/a", 0, &content.bytes(10, 4 * U))?;
            restore(&s, &old, &fx.objects["/a"])?;
        }
        6 => {
            let old = snapshot(&s.cipher)?;
            change(kind, &s, &mut model, "/a", 0, &content.bytes(11, 4 * U))?;
            let now = snapshot(&s.cipher)?;
            let all: BTreeSet<String> = now.keys().chain(old.keys()).cloned().collect();
            restore(&s, &old, &all.into_iter().collect::<Vec<_>>())?;
        }
        7 => {
            let p = place("/a", 1);
            s.edit(&p.object, |o| o.truncate(p.range.start))?;
        }
        8 => restore(&s, &Snap::new(), &fx.objects["/a"])?,
        9 => {
            let (a, b) = (&fx.objects["/a"], &fx.objects["/b"]);
            if a.len() != b.len() {
                bail!("/a and /b have {} and {} objects", a.len(), b.len());
            }
            for (x, y) in a.iter().zip(b).filter(|(x, _)| !s.obj(x).is_dir()) {
                let (bx, by) = (s.read(x)?, s.read(y)?);
                s.write(x, &by)?;
                s.write(y, &bx)?;
            }
        }
        10 => {
            // /d2 gets /d1's entries: for a peer that keeps a directory as a directory, its
            // contents; for one that keeps it in objects, those objects' bytes.
            let dir_of = |p: &str| {
                fx.objects[p]
                    .iter()
                    .find(|o| kind.keeps_directories() && s.obj(o).is_dir())
                    .cloned()
            };
            match (dir_of("/d1"), dir_of("/d2")) {
                (Some(d1), Some(d2)) => {
                    std::fs::remove_dir_all(s.obj(&d2))?;
                    let st = Command::new("cp")
                        .arg("-a")
                        .arg(s.obj(&d1))
                        .arg(s.obj(&d2))
                        .status()?;
                    if !st.success() {
                        bail!("cp -a {d1} {d2} failed");
                    }
                }
                _ => {
                    let (a, b) = (&fx.objects["/d1"], &fx.objects["/d2"]);
                    for (x, y) in a.iter().zip(b) {
                        let bytes = s.read(x)?;
                        s.write(y, &bytes)?;
                    }
                }
            }
            return outcome(kind, &s, &model, "/d2", true);
        }
        11 => {
            let old = snapshot(&s.cipher)?;
            let m = mount_ok(kind, &s, false)?;
            std::fs::remove_file(m.p("/c"))?;
            m.unmount()?;
            model.remove("/c");
            let now = snapshot(&s.cipher)?;
            // Everything the unlink changed or removed, as it was.
            let changed: Vec<String> = old
                .keys()
                .filter(|k| now.get(*k) != old.get(*k))
                .cloned()
                .collect();
            restore(&s, &old, &changed)?;
            return outcome(kind, &s, &model, "/c", false);
        }
        12 => {
            let p = place("/a", 2);
            s.edit(&p.object, |o| o[p.range.clone()].fill(0))?;
        }
        _ => bail!("no attack {n}"),
    }
    outcome(kind, &s, &model, "/a", false)
}

/// The twelve attacks on `kind`.
pub(crate) fn run_peer(
    kind: PeerKind,
    workdir: &Path,
    progress: &dyn Fn(&str),
) -> Result<Vec<PeerRun>> {
    let version = kind.version();
    let fx = build(kind, workdir, progress)?;
    let files = |d: &Path| snapshot(d).map(|s| s.into_values().flatten().collect::<Vec<_>>());
    let local_state_bytes = files(&fx.scratch.state)?
        .iter()
        .map(|f| f.len() as u64)
        .sum();
    let cipher_files = files(&fx.scratch.cipher)?.len();
    let mut out = Vec::new();
    for a in &ATTACKS {
        progress(&format!(
            "{}: attack {} ({})",
            kind.name(),
            a.number,
            a.name
        ));
        let (detected, no_effect, got) = attack(&fx, a.number, workdir)
            .with_context(|| format!("{}: attack {}", kind.name(), a.number))?;
        out.push(PeerRun {
            peer: kind.name().to_string(),
            version: version.clone(),
            attack: a.number,
            name: a.name.to_string(),
            detected,
            no_effect,
            got,
            local_state_bytes,
            cipher_files,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_says_what_a_reader_got() {
        let mut m = Model::default();
        let a0 = vec![1u8; 3 * U];
        m.write_at("/a", 0, &a0);
        m.write_at("/b", 0, &[2u8; 10]);
        m.write_at("/a", U, &[9u8; U]);
        let cur = m.current["/a"].clone();
        assert!(m.describe("/a", &cur).1);
        assert!(m.describe("/a", &a0).0.starts_with("an older version"));
        assert!(m
            .describe("/a", &[2u8; 10])
            .0
            .starts_with("the contents of /b"));
        assert!(m
            .describe("/a", &cur[..U])
            .0
            .contains("cut from 12288 to 4096"));
        let mut z = cur.clone();
        z[2 * U..].fill(0);
        assert_eq!(
            m.describe("/a", &z).0,
            "zeros in block(s) [2], and no error"
        );
        let mut f = cur.clone();
        f[U + 5] ^= 1;
        assert_eq!(
            m.describe("/a", &f).0,
            "altered bytes in block(s) [1], and no error"
        );
        m.write_at("/d/x", 0, b"x");
        m.write_at("/d/e/f", 0, b"f");
        assert_eq!(m.names_in("/d"), BTreeSet::from(["x".to_string()]));
        m.remove("/b");
        assert!(m
            .describe("/b", &[2u8; 10])
            .0
            .starts_with("the deleted file"));
    }

    #[test]
    fn peers_are_chosen_by_name() {
        assert!(chosen(&["none".into()]).unwrap().is_empty());
        assert!(chosen(&["bitlocker".into()]).is_err());
        for k in PeerKind::ALL {
            let c = chosen(&[k.name().into()]).unwrap();
            assert_eq!(c == vec![k], k.installed(), "{k:?}");
            assert_eq!(
                unavailable(&[k.name().into()]).is_empty(),
                k.installed(),
                "{k:?}"
            );
        }
    }
}
