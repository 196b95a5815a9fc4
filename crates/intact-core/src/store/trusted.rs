//! The trusted store: the constant-size anchor the adversary can neither modify nor roll
//! back, plus the volume lock.

use super::record::{create_synced, logged, rename, FsCall, FsLog};
use crate::error::{Error, Result};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Where the anchor lives and who holds the volume.
pub trait TrustedStore: Send + Sync {
    /// The anchor bytes, or None when no anchor exists.
    fn load(&self) -> Result<Option<Vec<u8>>>;
    /// Atomically and durably replaces the anchor (temp file + fsync + rename + fsync dir
    /// for the local implementation).
    fn store(&self, bytes: &[u8]) -> Result<()>;
    /// Takes the volume lock: exclusive for a writer, shared for readers. Returns
    /// `Err(Error::Locked(..))` at once (non-blocking) if incompatible with a holder in
    /// another process or another `lock` call in this process. The lock is released when
    /// the guard drops.
    fn lock(&self, exclusive: bool) -> Result<TrustedLock>;
    /// Human-readable location (for messages).
    fn location(&self) -> String;
    /// Deletes the anchor (used by `init --force` style recovery only). Deleting a
    /// missing anchor is not an error.
    fn remove(&self) -> Result<()>;
    /// When the anchor was last stored, where the store can tell (for diagnoses only).
    fn modified(&self) -> Option<std::time::SystemTime> {
        None
    }
    /// Whether a reader may take only what a signed root covers (a reader with a public
    /// key: [`crate::sign::SignedAnchor`]): the log's tail past the sealed end is
    /// authenticated by the volume's key alone, which every password holder has, so it
    /// is not replayed for such a reader.
    fn signed_roots_only(&self) -> bool {
        false
    }
}

impl<T: TrustedStore + ?Sized> TrustedStore for Arc<T> {
    fn load(&self) -> Result<Option<Vec<u8>>> {
        (**self).load()
    }
    fn store(&self, bytes: &[u8]) -> Result<()> {
        (**self).store(bytes)
    }
    fn lock(&self, exclusive: bool) -> Result<TrustedLock> {
        (**self).lock(exclusive)
    }
    fn location(&self) -> String {
        (**self).location()
    }
    fn remove(&self) -> Result<()> {
        (**self).remove()
    }
    fn modified(&self) -> Option<std::time::SystemTime> {
        (**self).modified()
    }
    fn signed_roots_only(&self) -> bool {
        (**self).signed_roots_only()
    }
}

/// A held volume lock; dropping it releases the lock.
#[derive(Debug)]
pub struct TrustedLock {
    exclusive: bool,
    _held: Held,
}

/// What keeps the lock held; never read, only dropped.
#[derive(Debug)]
#[allow(dead_code)]
enum Held {
    /// The flock'ed lock file; closing it releases the lock.
    File(File),
    Mem(MemGuard),
    /// A lease held in a remote service (released when dropped: [`super::EtcdAnchor`]).
    Remote(Box<dyn std::fmt::Debug + Send + Sync>),
    /// Nothing: a follower's ([`TrustedLock::follower`]).
    Nothing,
}

impl TrustedLock {
    /// A lock held by `guard` (a remote store's lease, given back when it drops).
    pub(crate) fn remote(exclusive: bool, guard: Box<dyn std::fmt::Debug + Send + Sync>) -> Self {
        TrustedLock {
            exclusive,
            _held: Held::Remote(guard),
        }
    }

    /// What a reader that follows a writer holds (`mount --ro --follow`;
    /// [`crate::Options::follow`]): nothing, so that no writer waits for it or is refused
    /// by it. Such a reader copes with the store changing under it by reading again under
    /// the next root the writer seals (docs/design.md, "Readers that follow a writer").
    pub fn follower() -> Self {
        TrustedLock {
            exclusive: false,
            _held: Held::Nothing,
        }
    }

    /// True for a writer's (exclusive) lock.
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }
}

/// The newest signed root a reader accepted: its epoch and the BLAKE3 of its anchor's
/// bytes. A reader refuses a root of an older epoch, or another root of the same epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeenRoot {
    /// The anchor's epoch (docs/file-format.md §3, bytes 24..32).
    pub epoch: u64,
    /// BLAKE3 of the anchor's bytes.
    pub digest: [u8; 32],
}

impl SeenRoot {
    const HEADER: &'static str = "intact-seen-root v1";

    /// The record of `anchor`'s bytes (§3), `None` when they are too short to hold an epoch.
    pub fn of(anchor: &[u8]) -> Option<SeenRoot> {
        let epoch = u64::from_le_bytes(anchor.get(24..32)?.try_into().ok()?);
        Some(SeenRoot {
            epoch,
            digest: *blake3::hash(anchor).as_bytes(),
        })
    }

    fn to_text(self) -> String {
        format!(
            "{}\n{} {}\n",
            Self::HEADER,
            self.epoch,
            hex::encode(self.digest)
        )
    }

    fn parse(text: &str) -> Option<SeenRoot> {
        let mut lines = text.lines();
        if lines.next()? != Self::HEADER {
            return None;
        }
        let (e, d) = lines.next()?.split_once(' ')?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(d, &mut digest).ok()?;
        lines.next().is_none().then_some(())?;
        Some(SeenRoot {
            epoch: e.parse().ok()?,
            digest,
        })
    }
}

/// The local trusted store: `dir/<volume id hex>/anchor` and `.../lock`, in a directory
/// created with mode 0700 on first use.
#[derive(Debug, Clone)]
pub struct LocalStateDir {
    dir: PathBuf,
    volume: String,
    /// Where the calls that change the file system are recorded (the crash-state tests).
    log: Option<Arc<FsLog>>,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl LocalStateDir {
    /// The state of volume `volume_id_hex` under `dir` (nothing is created yet). The id
    /// must be non-empty lowercase or uppercase hex.
    pub fn new(dir: PathBuf, volume_id_hex: &str) -> Result<Self> {
        if volume_id_hex.is_empty() || !volume_id_hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Invalid(format!("bad volume id {volume_id_hex:?}")));
        }
        Ok(LocalStateDir {
            dir: dir.join(volume_id_hex),
            volume: volume_id_hex.to_string(),
            log: None,
        })
    }

    /// The same state directory, recording its calls in `log` ([`super::record`]).
    pub fn with_log(mut self, log: Arc<FsLog>) -> Self {
        self.log = Some(log);
        self
    }

    /// The default base directory: `$XDG_STATE_HOME/intact`, else
    /// `$HOME/.local/state/intact` (relative `.local/state/intact` if neither is set).
    pub fn default_dir() -> PathBuf {
        let xdg = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from);
        if let Some(x) = xdg.filter(|p| p.is_absolute()) {
            return x.join("intact");
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        home.join(".local/state/intact")
    }

    /// The volume's state directory (`dir/<volume id>`).
    pub fn volume_dir(&self) -> &Path {
        &self.dir
    }

    /// The volume id (hex) this store is for.
    pub fn volume_id(&self) -> &str {
        &self.volume
    }

    /// The anchor file's path.
    pub fn anchor_path(&self) -> PathBuf {
        self.dir.join("anchor")
    }

    /// The lock file's path.
    pub fn lock_path(&self) -> PathBuf {
        self.dir.join("lock")
    }

    /// The file recording that the volume's anchor lives in a remote service
    /// ([`LocalStateDir::remote_anchor`]).
    pub fn remote_anchor_path(&self) -> PathBuf {
        self.dir.join("anchor.remote")
    }

    /// Where the volume's anchor lives when it is not here: the URL recorded by
    /// [`LocalStateDir::set_remote_anchor`] (`intact init --anchor`, `intact anchor move`).
    pub fn remote_anchor(&self) -> Result<Option<String>> {
        let path = self.remote_anchor_path();
        match fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s.trim().to_string()).filter(|s| !s.is_empty())),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path.display().to_string(), e)),
        }
    }

    /// Records (`Some`) or forgets (`None`) that the anchor lives at `url`, durably
    /// (temporary file, fsync, rename, fsync of the directory; or unlink and fsync).
    pub fn set_remote_anchor(&self, url: Option<&str>) -> Result<()> {
        let path = self.remote_anchor_path();
        match url {
            Some(u) => self.replace_file(&path, format!("{u}\n").as_bytes()),
            None => {
                self.ensure_dir()?;
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != ErrorKind::NotFound => {
                        Err(Error::io(path.display().to_string(), e))
                    }
                    _ => self.sync_dir(),
                }
            }
        }
    }

    /// The file where a reader with a verification key records the newest signed root it
    /// accepted (`sign::SignedAnchor`; docs/file-format.md §1.2.3).
    pub fn seen_root_path(&self) -> PathBuf {
        self.dir.join("seen")
    }

    /// The newest signed root this machine's readers accepted, if any.
    pub fn seen_root(&self) -> Result<Option<SeenRoot>> {
        let path = self.seen_root_path();
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(path.display().to_string(), e)),
        };
        SeenRoot::parse(&text).map(Some).ok_or_else(|| {
            Error::AnchorCorrupt(format!(
                "{}: not a record of the newest root seen (local damage; delete it to accept \
                 the next signed root as the newest)",
                path.display()
            ))
        })
    }

    /// Records `root` as the newest signed root seen, durably (temporary file, fsync,
    /// rename, fsync of the directory).
    pub fn set_seen_root(&self, root: &SeenRoot) -> Result<()> {
        self.replace_file(&self.seen_root_path(), root.to_text().as_bytes())
    }

    /// Replaces the file `path` of this directory with `bytes` (temporary file, fsync,
    /// rename, fsync of the directory).
    fn replace_file(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        self.ensure_dir()?;
        let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
        let tmp = self
            .dir
            .join(format!("{name}.tmp.{}.{seq}", std::process::id()));
        let log = self.log.as_deref();
        let write = || -> io::Result<()> {
            create_synced(log, OpenOptions::new().mode(0o600), &tmp, bytes)?;
            rename(log, &tmp, path)
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(Error::io(path.display().to_string(), e));
        }
        self.sync_dir()
    }

    fn ensure_dir(&self) -> Result<()> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| Error::io(self.dir.display().to_string(), e))
    }

    fn sync_dir(&self) -> Result<()> {
        let sync = || File::open(&self.dir).and_then(|d| d.sync_all());
        logged(self.log.as_deref(), sync, |r| {
            FsCall::FsyncDir(r(&self.dir))
        })
        .map_err(|e| Error::io(self.dir.display().to_string(), e))
    }

    /// Replaces the anchor file with `bytes` (temporary file, fsync, rename, fsync of the
    /// directory).
    fn replace_anchor(&self, bytes: &[u8]) -> Result<()> {
        self.replace_file(&self.anchor_path(), bytes)
    }

    /// Writes slot `idx` of the anchor file in place and makes it durable.
    fn write_slot(&self, path: &Path, idx: usize, slot: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let log = self.log.as_deref();
        let f = OpenOptions::new().write(true).open(path)?;
        let off = (idx * SLOT) as u64;
        logged(
            log,
            || f.write_all_at(slot, off),
            |r| FsCall::Write {
                path: r(path),
                off,
                data: slot.to_vec(),
            },
        )?;
        logged(log, || f.sync_data(), |r| FsCall::Fsync(r(path)))
    }
}

/// The anchor file's two slots (docs/file-format.md §1.2): each `SLOT` bytes, `ISLT`, a
/// sequence number u64, the payload's length u16, the payload, zeros, and BLAKE3 of the
/// slot's first `SLOT - 32` bytes in its last 32. The valid slot with the higher sequence
/// number holds the anchor.
pub const SLOT: usize = 512;
/// The longest anchor a slot holds.
pub const SLOT_PAYLOAD: usize = SLOT - 14 - 32;
const SLOT_MAGIC: &[u8; 4] = b"ISLT";

fn encode_slot(seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(SLOT);
    b.extend_from_slice(SLOT_MAGIC);
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    b.extend_from_slice(payload);
    b.resize(SLOT - 32, 0);
    let h = blake3::hash(&b);
    b.extend_from_slice(h.as_bytes());
    b
}

/// The sequence number and payload of a slot whose checksum holds.
fn decode_slot(b: &[u8]) -> Option<(u64, &[u8])> {
    if b.len() != SLOT || &b[..4] != SLOT_MAGIC {
        return None;
    }
    if blake3::hash(&b[..SLOT - 32]).as_bytes() != &b[SLOT - 32..] {
        return None;
    }
    let seq = u64::from_le_bytes(b[4..12].try_into().ok()?);
    let len = u16::from_le_bytes(b[12..14].try_into().ok()?) as usize;
    (len <= SLOT_PAYLOAD).then(|| (seq, &b[14..14 + len]))
}

/// A file of two slots (an older anchor file holds the anchor's bytes alone, which start
/// with `INTANCH`).
fn is_slotted(b: &[u8]) -> bool {
    b.len() == 2 * SLOT && (&b[..4] == SLOT_MAGIC || &b[SLOT..SLOT + 4] == SLOT_MAGIC)
}

/// The valid slot with the higher sequence number: its index, sequence and payload.
fn newest_slot(b: &[u8]) -> Option<(usize, u64, &[u8])> {
    (0..2)
        .filter_map(|i| decode_slot(&b[i * SLOT..(i + 1) * SLOT]).map(|(s, p)| (i, s, p)))
        .max_by_key(|(_, s, _)| *s)
}

impl TrustedStore for LocalStateDir {
    fn modified(&self) -> Option<std::time::SystemTime> {
        fs::metadata(self.anchor_path())
            .and_then(|m| m.modified())
            .ok()
    }

    fn load(&self) -> Result<Option<Vec<u8>>> {
        let path = self.anchor_path();
        match fs::read(&path) {
            Ok(b) if is_slotted(&b) => match newest_slot(&b) {
                Some((_, _, payload)) => Ok(Some(payload.to_vec())),
                // Both slots damaged: not a state a crash leaves (the slot being written
                // is never the only valid one); the bytes go up as they are, and the
                // engine's anchor check names them.
                None => Ok(Some(b)),
            },
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path.display().to_string(), e)),
        }
    }

    /// An anchor of up to [`SLOT_PAYLOAD`] bytes goes in place into the older of the
    /// anchor file's two slots, followed by one `fdatasync` (docs/file-format.md §1.2):
    /// the newer slot stays valid until the write is durable, so a crash leaves the old
    /// anchor or the new one. A first store, a file of another form and a longer anchor
    /// replace the whole file (temporary file, fsync, rename, fsync of the directory).
    fn store(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() <= SLOT_PAYLOAD {
            let path = self.anchor_path();
            if let Ok(cur) = fs::read(&path) {
                if is_slotted(&cur) {
                    if let Some((idx, seq, _)) = newest_slot(&cur) {
                        let slot = encode_slot(seq + 1, bytes);
                        return self
                            .write_slot(&path, 1 - idx, &slot)
                            .map_err(|e| Error::io(path.display().to_string(), e));
                    }
                }
            }
            let mut file = encode_slot(1, bytes);
            file.resize(2 * SLOT, 0);
            return self.replace_anchor(&file);
        }
        self.replace_anchor(bytes)
    }

    fn lock(&self, exclusive: bool) -> Result<TrustedLock> {
        self.ensure_dir()?;
        let path = self.lock_path();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(path.display().to_string(), e))?;
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        } | libc::LOCK_NB;
        loop {
            // SAFETY: `file` is open and owned by this frame, so the descriptor is valid
            // for the call; flock touches no memory of ours. The lock belongs to this open
            // file description and is released when `file` (moved into the guard) closes.
            let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
            if rc == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => {
                    let who = if exclusive {
                        "another process has the volume open"
                    } else {
                        "another process has the volume open for writing"
                    };
                    return Err(Error::Locked(format!(
                        "{who}; lock file {}",
                        path.display()
                    )));
                }
                _ => return Err(Error::io(path.display().to_string(), e)),
            }
        }
        Ok(TrustedLock {
            exclusive,
            _held: Held::File(file),
        })
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn remove(&self) -> Result<()> {
        let path = self.anchor_path();
        match logged(
            self.log.as_deref(),
            || fs::remove_file(&path),
            |r| FsCall::Unlink(r(&path)),
        ) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(path.display().to_string(), e)),
        }
    }
}

#[derive(Debug, Default)]
struct LockState {
    exclusive: bool,
    shared: usize,
}

#[derive(Debug, Default)]
struct MemInner {
    anchor: Mutex<Option<Vec<u8>>>,
    lock: Mutex<LockState>,
}

#[derive(Debug)]
struct MemGuard {
    inner: Arc<MemInner>,
    exclusive: bool,
}

impl Drop for MemGuard {
    fn drop(&mut self) {
        let mut st = self.inner.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.exclusive {
            st.exclusive = false;
        } else {
            st.shared -= 1;
        }
    }
}

/// An in-memory trusted store for tests. Clones share the anchor and the lock, so a test
/// can reopen a volume with "the same" trusted store; every `lock` call is a separate
/// holder (like separate opens of the lock file).
#[derive(Debug, Clone, Default)]
pub struct MemTrusted {
    inner: Arc<MemInner>,
}

impl MemTrusted {
    /// An empty store (no anchor, unlocked).
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the anchor (for rollback tests).
    pub fn snapshot(&self) -> Option<Vec<u8>> {
        self.inner.anchor.lock().unwrap().clone()
    }

    /// Sets the anchor to a snapshot (`None` removes it), bypassing the lock.
    pub fn restore(&self, snap: Option<Vec<u8>>) {
        *self.inner.anchor.lock().unwrap() = snap;
    }
}

impl TrustedStore for MemTrusted {
    fn load(&self) -> Result<Option<Vec<u8>>> {
        Ok(self.snapshot())
    }

    fn store(&self, bytes: &[u8]) -> Result<()> {
        *self.inner.anchor.lock().unwrap() = Some(bytes.to_vec());
        Ok(())
    }

    fn lock(&self, exclusive: bool) -> Result<TrustedLock> {
        let mut st = self.inner.lock.lock().unwrap();
        if st.exclusive {
            return Err(Error::Locked(
                "the volume is open for writing; in-memory trusted store".into(),
            ));
        }
        if exclusive {
            if st.shared > 0 {
                return Err(Error::Locked(
                    "the volume is open; in-memory trusted store".into(),
                ));
            }
            st.exclusive = true;
        } else {
            st.shared += 1;
        }
        drop(st);
        Ok(TrustedLock {
            exclusive,
            _held: Held::Mem(MemGuard {
                inner: self.inner.clone(),
                exclusive,
            }),
        })
    }

    fn location(&self) -> String {
        "<in-memory trusted store>".into()
    }

    fn remove(&self) -> Result<()> {
        self.restore(None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn local() -> (tempfile::TempDir, LocalStateDir) {
        let d = tempfile::tempdir().unwrap();
        let s = LocalStateDir::new(d.path().join("state"), "00ff").unwrap();
        (d, s)
    }

    fn check_store(s: &dyn TrustedStore) {
        assert_eq!(s.load().unwrap(), None);
        s.remove().unwrap();
        s.store(b"anchor-1").unwrap();
        assert_eq!(s.load().unwrap().unwrap(), b"anchor-1");
        s.store(b"anchor-two").unwrap();
        assert_eq!(s.load().unwrap().unwrap(), b"anchor-two");
        s.remove().unwrap();
        assert_eq!(s.load().unwrap(), None);
        assert!(!s.location().is_empty());
    }

    fn check_locks(s: &dyn TrustedStore) {
        let w = s.lock(true).unwrap();
        assert!(w.is_exclusive());
        let e = s.lock(true).unwrap_err();
        assert!(matches!(e, Error::Locked(_)), "{e}");
        let e = s.lock(false).unwrap_err();
        assert!(
            matches!(e, Error::Locked(ref m) if m.contains("for writing")),
            "{e}"
        );
        drop(w);
        let r1 = s.lock(false).unwrap();
        let r2 = s.lock(false).unwrap();
        assert!(!r1.is_exclusive());
        assert!(matches!(s.lock(true), Err(Error::Locked(_))));
        drop(r1);
        assert!(matches!(s.lock(true), Err(Error::Locked(_))));
        drop(r2);
        drop(s.lock(true).unwrap());
        drop(s.lock(false).unwrap());
    }

    #[test]
    fn local_round_trip() {
        let (d, s) = local();
        check_store(&s);
        s.store(b"x").unwrap();
        let mode = fs::metadata(d.path().join("state/00ff"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let names: Vec<_> = fs::read_dir(s.volume_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["anchor"], "no temp files left");
        // A second handle on the same directory sees the anchor.
        let s2 = LocalStateDir::new(d.path().join("state"), "00ff").unwrap();
        assert_eq!(s2.load().unwrap().unwrap(), b"x");
    }

    /// The anchor file's two slots (docs/file-format.md §1.2): a first store writes the
    /// whole file, later ones alternate slots in place and the file keeps its size; a slot
    /// torn or damaged falls back to the other (the anchor before it); an anchor file of
    /// the older form (the anchor's bytes alone) is read as it is and turned into slots at
    /// the next store; an anchor too long for a slot replaces the whole file.
    #[test]
    fn the_anchor_file_alternates_two_slots_and_survives_a_torn_one() {
        let (_d, s) = local();
        let path = s.anchor_path();
        s.store(b"first").unwrap();
        let f = fs::read(&path).unwrap();
        assert_eq!(f.len(), 2 * SLOT);
        assert_eq!(&f[..4], b"ISLT");
        assert_eq!(&f[4..12], &1u64.to_le_bytes());
        assert_eq!(&f[12..14], &5u16.to_le_bytes());
        assert_eq!(&f[14..19], b"first");
        assert_eq!(&f[480..512], blake3::hash(&f[..480]).as_bytes());
        assert!(f[SLOT..].iter().all(|&b| b == 0));
        let ino = || {
            use std::os::unix::fs::MetadataExt;
            fs::metadata(&path).unwrap().ino()
        };
        let before = ino();
        s.store(b"second").unwrap();
        s.store(b"third").unwrap();
        assert_eq!(ino(), before, "written in place, not replaced");
        let f = fs::read(&path).unwrap();
        assert_eq!(f.len(), 2 * SLOT);
        assert_eq!(decode_slot(&f[..SLOT]), Some((3, &b"third"[..])));
        assert_eq!(decode_slot(&f[SLOT..]), Some((2, &b"second"[..])));
        assert_eq!(s.load().unwrap().unwrap(), b"third");
        // A torn write of the newest slot (only its first sector's half reached the disk):
        // the other slot holds.
        let mut torn = f.clone();
        torn[200..SLOT].fill(0);
        fs::write(&path, &torn).unwrap();
        assert_eq!(s.load().unwrap().unwrap(), b"second");
        // The next store goes over the damaged slot, never over the good one.
        s.store(b"fourth").unwrap();
        let f = fs::read(&path).unwrap();
        assert_eq!(decode_slot(&f[..SLOT]), Some((3, &b"fourth"[..])));
        assert_eq!(decode_slot(&f[SLOT..]), Some((2, &b"second"[..])));
        // A flipped byte anywhere in a slot voids it.
        for at in [0, 5, 13, 20, 300, 479, 500] {
            let mut bad = f.clone();
            bad[at] ^= 1;
            fs::write(&path, &bad).unwrap();
            assert_eq!(s.load().unwrap().unwrap(), b"second", "byte {at}");
        }
        // Another magic with a checksum that holds is not a slot either.
        let mut other = encode_slot(9, b"x");
        other[..4].copy_from_slice(b"XSLT");
        let h = *blake3::hash(&other[..SLOT - 32]).as_bytes();
        other[SLOT - 32..].copy_from_slice(&h);
        assert_eq!(decode_slot(&other), None);
        assert_eq!(decode_slot(&encode_slot(9, b"x")), Some((9, &b"x"[..])));
        // An older anchor file: read as it is, slotted at the next store.
        fs::write(&path, b"INTANCH2 older form").unwrap();
        assert_eq!(s.load().unwrap().unwrap(), b"INTANCH2 older form");
        s.store(b"fifth").unwrap();
        assert_eq!(fs::read(&path).unwrap().len(), 2 * SLOT);
        assert_eq!(s.load().unwrap().unwrap(), b"fifth");
        // Too long for a slot: the whole file, as it is.
        let long = vec![7u8; SLOT_PAYLOAD + 1];
        s.store(&long).unwrap();
        assert_eq!(fs::read(&path).unwrap(), long);
        assert_eq!(s.load().unwrap().unwrap(), long);
        let fits = vec![9u8; SLOT_PAYLOAD];
        s.store(&fits).unwrap();
        assert_eq!(fs::read(&path).unwrap().len(), 2 * SLOT);
        assert_eq!(s.load().unwrap().unwrap(), fits);
        s.store(&fits).unwrap();
        assert_eq!(s.load().unwrap().unwrap(), fits, "written into a slot");
        s.store(&fits[..400]).unwrap();
        assert_eq!(s.load().unwrap().unwrap(), &fits[..400]);
    }

    /// Behind an `Arc`, a state directory keeps the same contract: every call reaches it.
    #[test]
    fn an_arc_forwards_every_call() {
        let (_d, s) = local();
        let a = Arc::new(s.clone());
        check_store(&a);
        check_locks(&a);
        assert_eq!(a.location(), s.location());
        assert_eq!(a.modified(), None);
        a.store(b"x").unwrap();
        assert!(a.modified().is_some());
        assert_eq!(a.modified(), s.modified());
        a.remove().unwrap();
        assert_eq!(s.load().unwrap(), None);
        assert_eq!(s.volume_id(), "00ff");
        assert!(s.location().ends_with("state/00ff"));
    }

    /// The calls that make the anchor durable, as recorded: a first store replaces the
    /// file (create, write, fsync, rename, fsync of the directory), the next ones write a
    /// slot in place and sync it, a removal unlinks and syncs the directory.
    #[test]
    fn the_calls_that_make_the_anchor_durable() {
        let d = tempfile::tempdir().unwrap();
        let log = Arc::new(FsLog::new(d.path()));
        let s = LocalStateDir::new(d.path().join("state"), "00ff")
            .unwrap()
            .with_log(Arc::clone(&log));
        let anchor = PathBuf::from("state/00ff/anchor");
        let dir = PathBuf::from("state/00ff");
        s.store(b"first").unwrap();
        let calls = log.calls();
        let kinds: Vec<_> = calls
            .iter()
            .map(|c| match c {
                FsCall::Create(_) => "create",
                FsCall::Write { .. } => "write",
                FsCall::Fsync(_) => "fsync",
                FsCall::Rename { .. } => "rename",
                FsCall::FsyncDir(_) => "fsync-dir",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["create", "write", "fsync", "rename", "fsync-dir"]);
        assert!(matches!(&calls[3], FsCall::Rename { to, .. } if *to == anchor));
        assert_eq!(calls[4], FsCall::FsyncDir(dir.clone()));
        let at = log.len();
        s.store(b"second").unwrap();
        let calls = log.calls();
        assert!(
            matches!(&calls[at], FsCall::Write { path, off, .. } if *path == anchor && *off == SLOT as u64)
        );
        assert_eq!(calls[at + 1..], [FsCall::Fsync(anchor.clone())]);
        let at = log.len();
        s.remove().unwrap();
        assert_eq!(
            log.calls()[at..],
            [FsCall::Unlink(anchor), FsCall::FsyncDir(dir)]
        );
        let at = log.len();
        s.remove().unwrap();
        assert_eq!(log.len(), at, "nothing to remove");
    }

    /// An anchor that cannot be read is an error, never "no anchor" (which would send the
    /// user to recreate a volume that exists).
    #[test]
    fn an_unreadable_anchor_is_an_error() {
        let (_d, s) = local();
        fs::create_dir_all(s.anchor_path()).unwrap();
        let e = s.load().unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        let e = s.remove().unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(s.anchor_path().is_dir());
    }

    #[test]
    fn local_locks() {
        let (_d, s) = local();
        check_locks(&s);
        // Separate handles (as separate processes would have) conflict too.
        let s2 = s.clone();
        let w = s.lock(true).unwrap();
        let e = s2.lock(false).unwrap_err();
        assert!(
            e.to_string().contains(&s.lock_path().display().to_string()),
            "{e}"
        );
        drop(w);
        let _r = s2.lock(false).unwrap();
    }

    #[test]
    fn bad_volume_ids() {
        for bad in ["", "../x", "ab/cd", "zz"] {
            assert!(
                LocalStateDir::new(PathBuf::from("/tmp"), bad).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn default_dir_ends_in_intact() {
        assert!(LocalStateDir::default_dir().ends_with("intact"));
    }

    #[test]
    fn mem_round_trip_and_locks() {
        let s = MemTrusted::new();
        assert!(s.location().contains("in-memory"));
        check_store(&s);
        check_locks(&s);
        let c = s.clone();
        s.store(b"v1").unwrap();
        let snap = c.snapshot();
        s.store(b"v2").unwrap();
        assert_eq!(c.load().unwrap().unwrap(), b"v2");
        c.restore(snap);
        assert_eq!(s.load().unwrap().unwrap(), b"v1");
        let _w = c.lock(true).unwrap();
        assert!(matches!(s.lock(false), Err(Error::Locked(_))));
        // An unrelated store is independent.
        let _o = MemTrusted::new().lock(true).unwrap();
    }
}
