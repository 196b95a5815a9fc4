//! Readers that follow a writer (`mount --ro --follow`; docs/design.md, "Readers that
//! follow a writer").
//!
//! A read-only volume normally holds a shared lock that keeps writers out, because a
//! writer changes objects in place (direct writes, a checkpoint applying its journal): a
//! reader whose verified state is older than what it then reads from the store meets
//! objects that no longer authenticate under it. A follower takes no lock instead
//! ([`TrustedLock::follower`]) and copes with exactly that:
//!
//! * [`Volume::refresh`] (the mount calls it every second) opens the volume again when the
//!   trusted anchor holds a newer epoch than the one served, and the new engine state takes
//!   the old one's place between requests: caches empty, the inode table read and verified
//!   again under the new root.
//! * A request that fails as tampered ran against objects the writer changed after the
//!   root it was served under: [`Volume::following`] waits for a newer root, moves to it
//!   and runs the request again. It fails as before once no newer root comes within the
//!   wait ([`crate::Options::follow`]) or it failed under [`FOLLOW_RETRIES`] newer roots:
//!   a real tampering is still reported, only later, since the writer never "fixes" a
//!   block the adversary changed.
//!
//! Every answer is verified against one sealed root (the one served when the request ran),
//! so a follower reads, for each request, the volume as of some sealed epoch no older than
//! the one before it: no mix of two roots and no rollback (the trusted anchor's epoch only
//! grows; with signed roots, `seen` refuses an older one).

use super::{Config, Inner, Keys, Volume};
use crate::error::Result;
use crate::format::Anchor;
use crate::store::{TrustedLock, TrustedStore, UntrustedStore};
use crate::Options;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Newer roots a request may fail under before its failure is reported.
pub const FOLLOW_RETRIES: u32 = 3;

/// How often a follower waiting for the writer's next root looks at the trusted anchor.
const POLL: Duration = Duration::from_millis(50);

/// What a following volume keeps ([`crate::Options::follow`]).
pub(super) struct Follow {
    /// How long a failed request waits for a newer root.
    wait: Duration,
    /// The options a refresh opens with.
    opts: Options,
    /// One refresh at a time (each opens the volume again).
    refreshing: Mutex<()>,
    /// Requests run again under a newer root ([`Volume::rereads`]).
    rereads: std::sync::atomic::AtomicU64,
}

impl Follow {
    pub(super) fn new(wait: Duration, opts: Options) -> Follow {
        Follow {
            wait,
            opts,
            refreshing: Mutex::new(()),
            rereads: Default::default(),
        }
    }
}

/// The epoch of the anchor `trusted` holds now (`None`: none, or none that authenticates).
fn sealed_epoch(trusted: &dyn TrustedStore, keys: &Keys) -> Option<u64> {
    let bytes = trusted.load().ok()??;
    Anchor::decode(&bytes, &keys.anchor).ok().map(|a| a.epoch)
}

/// Whether `done` holds within `wait`, asking it every [`POLL`] (and once at the end).
fn poll_until(wait: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// Opens a follower: as a read-only open, with no lock, and an open that fails as
/// tampered (the writer changing the store under it) is tried again under the next root.
pub(super) fn open(
    store: Arc<dyn UntrustedStore>,
    trusted: Arc<dyn TrustedStore>,
    config: Config,
    keys: Arc<Keys>,
    opts: &Options,
    wait: Duration,
) -> Result<Inner> {
    let mut tries = 0;
    loop {
        let before = sealed_epoch(trusted.as_ref(), &keys);
        // What the store keeps of objects the writer may have changed since.
        store.forget_cached();
        let r = Volume::build(
            store.clone(),
            trusted.clone(),
            TrustedLock::follower(),
            config.clone(),
            keys.clone(),
            opts,
        );
        match r {
            Err(e) if e.is_tampered() && tries < FOLLOW_RETRIES => {
                tries += 1;
                if !poll_until(wait, || sealed_epoch(trusted.as_ref(), &keys) > before) {
                    return Err(e);
                }
                tracing::debug!(error = %e, "opening again under the writer's next root");
            }
            r => return r,
        }
    }
}

impl Volume {
    /// A follower ([`crate::Options::follow`]) moves to the newest root the writer sealed:
    /// when the trusted anchor holds a newer epoch than the one served, the volume is
    /// opened again under it and the new engine state takes the old one's place between
    /// requests (open handles carried over). Returns whether it moved; `Ok(false)` for a
    /// volume that does not follow. A failure (the writer changing the store while it
    /// opens) leaves the old state served.
    pub fn refresh(&self) -> Result<bool> {
        let Some(fw) = &self.follow else {
            return Ok(false);
        };
        let _one = fw.refreshing.lock().unwrap_or_else(|p| p.into_inner());
        let (store, trusted, config, keys, epoch) = {
            let g = self.shared.lock();
            (
                g.store.clone(),
                g.trusted.clone(),
                g.config.clone(),
                g.keys.clone(),
                g.anchor.epoch,
            )
        };
        if sealed_epoch(trusted.as_ref(), &keys).is_none_or(|e| e <= epoch) {
            return Ok(false);
        }
        // The store may keep lengths and chunks of objects the writer changed since.
        store.forget_cached();
        let mut new = Volume::build(
            store,
            trusted,
            TrustedLock::follower(),
            config,
            keys,
            &fw.opts,
        )?;
        let mut g = self.shared.lock();
        new.handles = std::mem::take(&mut g.handles);
        new.track_references = g.track_references;
        new.metrics = g.metrics.clone();
        tracing::debug!(
            from = g.anchor.epoch,
            to = new.anchor.epoch,
            "following the writer's newest root"
        );
        let old = std::mem::replace(&mut *g, new);
        drop(g);
        drop(old);
        Ok(true)
    }

    /// Whether the volume follows a writer ([`crate::Options::follow`]).
    pub fn follows(&self) -> bool {
        self.follow.is_some()
    }

    /// Requests a follower ran again under a newer root, having met the writer's changes
    /// (0 for a volume that does not follow).
    pub fn rereads(&self) -> u64 {
        self.follow
            .as_ref()
            .map_or(0, |f| f.rereads.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The epoch of the root the volume serves (a writer's: the last it sealed).
    pub fn epoch(&self) -> u64 {
        self.shared.lock().anchor.epoch
    }

    /// Runs the request `f`; for a follower, again under a newer root when it failed as
    /// tampered (see the module's comment).
    pub(super) fn following<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let Some(fw) = &self.follow else {
            return f();
        };
        let mut moved = 0;
        loop {
            let epoch = self.epoch();
            match f() {
                Err(e) if e.is_tampered() && moved < FOLLOW_RETRIES => {
                    if !self.await_newer(epoch, fw.wait) {
                        return Err(e);
                    }
                    moved += 1;
                    fw.rereads
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(error = %e, "reading again under the writer's next root");
                }
                r => return r,
            }
        }
    }

    /// Waits up to `wait` until the volume serves a root newer than `epoch`, refreshing.
    fn await_newer(&self, epoch: u64, wait: Duration) -> bool {
        poll_until(wait, || {
            if let Err(e) = self.refresh() {
                tracing::debug!(error = %e, "the writer's newest root does not open yet");
            }
            self.epoch() > epoch
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ObjectNames;
    use crate::store::{MemStore, MemTrusted};
    use crate::volume::test_volume;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn follower<S: UntrustedStore + 'static>(
        store: &Arc<S>,
        trusted: &MemTrusted,
        wait: Duration,
    ) -> Volume {
        Volume::open(
            store.clone(),
            Box::new(trusted.clone()),
            b"pw",
            &Options {
                read_only: true,
                follow: Some(wait),
                ..Options::default()
            },
        )
        .expect("a follower opens beside the writer")
    }

    /// Version `v` of the file: 3 blocks and a bit, each byte naming the version, so that
    /// a read shows which version (and only one) it returned.
    fn version(v: u32) -> Vec<u8> {
        (0..3 * 4096 + 100)
            .map(|i| (v as usize * 31 + i / 4096) as u8)
            .collect()
    }

    fn which(data: &[u8]) -> Option<u32> {
        (0..10_000).find(|&v| version(v) == data)
    }

    fn read_all(vol: &Volume, path: &str) -> crate::Result<Vec<u8>> {
        let mut buf = vec![0u8; 1 << 16];
        let n = vol.read_path(path, 0, &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    #[test]
    fn a_follower_opens_beside_a_writer_and_takes_its_newest_root() {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let w = test_volume(store.clone(), &trusted);
        // A plain reader is kept out by the writer; a follower is not.
        let ro = Options {
            read_only: true,
            ..Options::default()
        };
        assert!(matches!(
            Volume::open(store.clone(), Box::new(trusted.clone()), b"pw", &ro),
            Err(crate::Error::Locked(_))
        ));
        let f = follower(&store, &trusted, Duration::from_secs(5));
        assert!(f.follows() && !w.follows());
        assert!(f.stat("/new").is_err());
        assert!(!f.refresh().unwrap(), "no newer root yet");
        w.create_file("/new", None).unwrap();
        w.write_path("/new", 0, b"sealed").unwrap();
        // Not sealed: the follower does not see it.
        assert!(!f.refresh().unwrap());
        assert!(f.stat("/new").is_err());
        w.sync().unwrap();
        let before = f.epoch();
        assert!(f.refresh().unwrap());
        assert!(f.epoch() > before);
        assert_eq!(read_all(&f, "/new").unwrap(), b"sealed");
        assert!(!f.refresh().unwrap(), "already at the newest");
        // A follower writes nothing.
        assert!(f.create_file("/x", None).is_err());
        // A writer is never a follower.
        assert!(Volume::open(
            store.clone(),
            Box::new(trusted.clone()),
            b"pw",
            &Options {
                follow: Some(Duration::from_secs(1)),
                ..Options::default()
            }
        )
        .is_err());
        assert_eq!(f.integrity_failures(), 0);
    }

    /// The writer rewrites a file (in place, through the log and checkpoints) while a
    /// follower reads it: every read returns one whole version, never an older one than a
    /// read before it, and no read fails.
    #[test]
    fn a_follower_reads_whole_versions_in_order_while_the_writer_rewrites() {
        const LAST: u32 = 200;
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let w = Arc::new(test_volume(store.clone(), &trusted));
        w.create_file("/f", None).unwrap();
        w.write_path("/f", 0, &version(0)).unwrap();
        w.sync().unwrap();
        let f = follower(&store, &trusted, Duration::from_secs(10));
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let (w, done) = (w.clone(), done.clone());
            std::thread::spawn(move || {
                for v in 1..=LAST {
                    w.write_path("/f", 0, &version(v)).unwrap();
                    std::thread::sleep(Duration::from_millis(3));
                    // Seals of the log, checkpoints, and changes left unsealed.
                    match v % 3 {
                        0 => w.sync().unwrap(),
                        1 => w.seal_periodic().unwrap(),
                        _ => {}
                    }
                }
                w.sync().unwrap();
                done.store(true, Ordering::SeqCst);
            })
        };
        let (mut last, mut reads, mut moved) = (0, 0, 0);
        loop {
            let finished = done.load(Ordering::SeqCst);
            if f.refresh().unwrap_or(false) {
                moved += 1;
            }
            let data = read_all(&f, "/f").expect("no read fails");
            let v =
                which(&data).unwrap_or_else(|| panic!("a mix of versions ({} bytes)", data.len()));
            assert!(v >= last, "version {v} after {last}");
            last = v;
            reads += 1;
            if finished {
                break;
            }
        }
        writer.join().unwrap();
        f.refresh().unwrap();
        assert_eq!(which(&read_all(&f, "/f").unwrap()), Some(LAST));
        eprintln!("moved {moved}, reads {reads}, read again {}", f.rereads());
        assert!(moved > 5 && reads > 10, "moved {moved}, reads {reads}");
        assert_eq!(f.integrity_failures(), 0);
    }

    /// The writer checkpoints a new version of a file after the follower opened: the
    /// follower's first read of it meets objects that no longer authenticate under its
    /// root, moves to the writer's newer one and returns the new version, with no failure.
    #[test]
    fn a_read_that_meets_the_writers_change_is_read_again_under_its_next_root() {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let w = test_volume(store.clone(), &trusted);
        w.create_file("/f", None).unwrap();
        w.write_path("/f", 0, &version(1)).unwrap();
        w.sync().unwrap();
        let f = follower(&store, &trusted, Duration::from_secs(5));
        let before = f.epoch();
        w.write_path("/f", 0, &version(2)).unwrap();
        w.sync().unwrap();
        assert_eq!(which(&read_all(&f, "/f").unwrap()), Some(2));
        assert!(f.epoch() > before);
        assert_eq!(f.rereads(), 1);
        assert_eq!(f.integrity_failures(), 0);
        // A volume that does not follow fails the same read.
        assert_eq!(w.rereads(), 0);
    }

    /// A follower that opens while the store does not match the trusted root (the writer
    /// changing it) waits for the writer's next root and opens under it; with none coming,
    /// the open fails as tampered once the wait is over.
    #[test]
    fn a_follower_opens_under_the_writers_next_root_when_the_store_is_changing() {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let w = Arc::new(test_volume(store.clone(), &trusted));
        w.create_file("/f", None).unwrap();
        w.write_path("/f", 0, &version(1)).unwrap();
        w.sync().unwrap();
        let old = store.snapshot();
        for i in 0..20 {
            w.create_file(&format!("/g{i}"), None).unwrap();
        }
        w.write_path("/f", 0, &version(2)).unwrap();
        w.sync().unwrap();
        let new = store.snapshot();
        // The objects of the older root under the newer anchor: no follower opens on them.
        store.restore(old);
        let t = Instant::now();
        let ro = Options {
            read_only: true,
            follow: Some(Duration::from_millis(300)),
            ..Options::default()
        };
        let e = Volume::open(store.clone(), Box::new(trusted.clone()), b"pw", &ro)
            .err()
            .expect("a follower opened on objects older than its root");
        assert!(e.is_tampered(), "{e}");
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        // The writer's objects come back, and it seals again, while a follower opens.
        let writer = {
            let (w, store) = (w.clone(), store.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                store.restore(new);
                w.create_file("/h", None).unwrap();
                w.sync().unwrap();
            })
        };
        let t = Instant::now();
        let f = follower(&store, &trusted, Duration::from_secs(10));
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        writer.join().unwrap();
        assert_eq!(which(&read_all(&f, "/f").unwrap()), Some(2));
        assert!(f.stat("/h").is_ok());
        assert_eq!(f.integrity_failures(), 0);
    }

    /// A follower in another process of a volume in a bucket: its store keeps lengths and
    /// chunks of the writer's objects, and forgets them at each refresh, so it reads the
    /// writer's rewritten file and new file under the new root, with no failure.
    #[test]
    fn a_follower_of_a_volume_in_a_bucket_reads_the_writers_changes() {
        use crate::store::{S3Store, S3Url};
        let backing = Arc::new(object_store::memory::InMemory::new());
        let url = S3Url::parse("s3://bucket/vol").unwrap();
        let t = MemTrusted::new();
        let trusted = t.clone();
        let w = Volume::create(
            Arc::new(S3Store::with_store(url.clone(), backing.clone()).unwrap()),
            move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
            b"pw",
            &crate::CreateOptions {
                kdf: crate::crypto::KdfParams::TEST,
                ..Default::default()
            },
            &Options::default(),
        )
        .unwrap();
        w.create_file("/f", None).unwrap();
        w.write_path("/f", 0, &version(1)).unwrap();
        w.sync().unwrap();
        let f = follower(
            &Arc::new(S3Store::with_store(url, backing).unwrap()),
            &trusted,
            Duration::from_secs(2),
        );
        assert_eq!(which(&read_all(&f, "/f").unwrap()), Some(1));
        w.write_path("/f", 0, &version(2)).unwrap();
        w.write_path("/f", version(2).len() as u64, &[9u8; 5000])
            .unwrap();
        for i in 0..30 {
            w.create_file(&format!("/g{i}"), None).unwrap();
            w.write_path(&format!("/g{i}"), 0, &[i as u8; 3000])
                .unwrap();
        }
        w.sync().unwrap();
        assert!(f.refresh().unwrap());
        let data = read_all(&f, "/f").unwrap();
        assert_eq!(which(&data[..version(2).len()]), Some(2));
        assert_eq!(&data[version(2).len()..], &[9u8; 5000][..]);
        assert_eq!(read_all(&f, "/g29").unwrap(), vec![29u8; 3000]);
        assert_eq!(f.integrity_failures(), 0);
        assert_eq!(f.rereads(), 0, "read under the new root at once");
    }

    /// A block the adversary changed stays changed under every root the writer seals: the
    /// follower reports it, after the wait or after its retries, whichever comes first.
    #[test]
    fn a_follower_reports_a_tampered_block_while_the_writer_seals() {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let w = Arc::new(test_volume(store.clone(), &trusted));
        w.create_file("/f", None).unwrap();
        w.write_path("/f", 0, &version(1)).unwrap();
        w.sync().unwrap();
        let id = hex::decode(w.stat("/f").unwrap().file_id).unwrap();
        let name = ObjectNames::of(&id.try_into().unwrap()).data;
        store.with_object(&name, |o| o[4100] ^= 1).unwrap();
        // No newer root: reported once the wait is over.
        let f = follower(&store, &trusted, Duration::from_millis(300));
        let t = Instant::now();
        let e = read_all(&f, "/f").unwrap_err();
        assert!(e.is_tampered(), "{e}");
        assert!(e.to_string().contains("/f"), "{e}");
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(f.integrity_failures(), 1);
        // A writer sealing other files all the while: reported after the retries, each
        // under a newer root, long before the (long) wait.
        let f = follower(&store, &trusted, Duration::from_secs(600));
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let (w, done) = (w.clone(), done.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !done.load(Ordering::SeqCst) {
                    w.create_file(&format!("/g{i}"), None).unwrap();
                    w.sync().unwrap();
                    i += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let before = f.epoch();
        let e = read_all(&f, "/f").unwrap_err();
        done.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        assert!(e.is_tampered(), "{e}");
        assert!(
            f.epoch() >= before + u64::from(FOLLOW_RETRIES),
            "{before} {}",
            f.epoch()
        );
        assert_eq!(f.integrity_failures(), 1);
    }
}
