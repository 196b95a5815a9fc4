//! The block disk's engine (issue 8), without NBD: reads and writes against a byte model
//! in every mode, odd offsets and sizes, tampering with every file while stopped and while
//! serving, crashes (a session dropped without close, writes torn between their metadata
//! and their data) and their recovery, and many threads at once.

use intact_core::crypto::KdfParams;
use intact_core::disk::engine::{paths, Disk, DiskCreate, DiskOptions, Mode, TreeKind, BLOCK};
use intact_core::disk::pac::PacConfig;
use intact_core::store::{LocalStateDir, TrustedStore};
use intact_core::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PW: &[u8] = b"disk password";

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    state: PathBuf,
    id: String,
    splay: f64,
}

/// The arity that stands for the DMT in [`Fixture::new`].
const DMT: u64 = 0;

impl Fixture {
    /// A disk of `blocks` blocks under the n-ary tree of `arity`, or the DMT for arity
    /// [`DMT`] (opened splaying half its writes, so that the tests see many rotations).
    fn new(blocks: u64, arity: u64, mode: Mode) -> Fixture {
        let tree = if arity == DMT {
            TreeKind {
                arity: 2,
                dmt: true,
            }
        } else {
            TreeKind { arity, dmt: false }
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let state = dir.path().join("state");
        let st = state.clone();
        let cfg = Disk::create(
            &path,
            &DiskCreate {
                size: blocks * BLOCK as u64,
                tree,
                mode,
                kdf: KdfParams::TEST,
            },
            PW,
            move |id| Ok(Box::new(LocalStateDir::new(st, id)?) as Box<dyn TrustedStore>),
        )
        .unwrap();
        Fixture {
            _dir: dir,
            path,
            state,
            id: cfg.disk_id,
            splay: if tree.dmt { 0.5 } else { 0.01 },
        }
    }

    fn trusted(&self) -> Box<dyn TrustedStore> {
        Box::new(LocalStateDir::new(self.state.clone(), &self.id).unwrap())
    }

    fn open_with(&self, opts: &DiskOptions) -> intact_core::Result<Disk> {
        let opts = DiskOptions {
            splay: self.splay,
            ..opts.clone()
        };
        Disk::open(&self.path, PW, self.trusted(), &opts)
    }

    fn open(&self, mode: Mode) -> Disk {
        self.open_with(&DiskOptions {
            mode: Some(mode),
            cache_bytes: 4096,
            pac: PacConfig {
                capacity: 16,
                ..PacConfig::default()
            },
            ..DiskOptions::default()
        })
        .unwrap()
    }

    /// A copy of every file of the disk (what an adversary, or a crash, can put back).
    fn snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let p = paths(&self.path);
        [p.data, p.meta, p.tree, p.sealed, p.intent]
            .into_iter()
            .map(|f| {
                let b = std::fs::read(&f).unwrap();
                (f, b)
            })
            .collect()
    }

    fn restore(&self, snap: &[(PathBuf, Vec<u8>)]) {
        for (f, b) in snap {
            std::fs::write(f, b).unwrap();
        }
    }
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

fn fill(seed: u64, n: usize) -> Vec<u8> {
    let mut r = rng(seed);
    (0..n).map(|_| r() as u8).collect()
}

fn read_all(d: &Disk) -> Vec<u8> {
    let mut b = vec![0u8; d.size() as usize];
    d.read(0, &mut b).unwrap();
    b
}

/// Random writes, trims and flushes at odd offsets against a byte model, then a close and
/// a reopen: every mode, several arities.
#[test]
fn every_mode_reads_what_was_written_at_any_offset() {
    for (mode, arity) in [
        (Mode::Pac, 4),
        (Mode::Sync, 2),
        (Mode::Sync, 128),
        (Mode::Batch, 8),
        (Mode::Aead, 8),
        (Mode::None, 8),
        (Mode::Pac, DMT),
        (Mode::Sync, DMT),
        (Mode::Batch, DMT),
    ] {
        let blocks = 40;
        let f = Fixture::new(blocks, arity, mode);
        let d = f.open(mode);
        let size = blocks as usize * BLOCK;
        let mut model = vec![0u8; size];
        assert_eq!(read_all(&d), model, "a new disk reads as zeros");
        let mut r = rng(arity + mode as u64);
        for i in 0..300 {
            let off = (r() % size as u64) as usize;
            let len = match r() % 5 {
                0 => 1,
                1 => BLOCK,
                2 => BLOCK + 1,
                3 => BLOCK - 1,
                _ => (r() % (3 * BLOCK as u64)) as usize,
            }
            .min(size - off);
            match r() % 10 {
                0 => {
                    d.trim(off as u64, len as u64).unwrap();
                    model[off..off + len].fill(0);
                }
                1 => d.flush().unwrap(),
                _ => {
                    let data = fill(i, len);
                    d.write(off as u64, &data).unwrap();
                    model[off..off + len].copy_from_slice(&data);
                }
            }
            if i % 37 == 0 {
                let mut got = vec![0u8; len];
                d.read(off as u64, &mut got).unwrap();
                assert_eq!(got, model[off..off + len], "{mode:?} op {i}");
            }
        }
        assert_eq!(read_all(&d), model, "{mode:?}");
        // Edges: nothing past the end, an empty request is fine, the last byte works.
        assert!(d.write(size as u64, &[1]).is_err());
        assert!(d.read(size as u64 - 1, &mut [0u8; 2]).is_err());
        assert!(d.write(u64::MAX, &[1]).is_err());
        d.write(size as u64, &[]).unwrap();
        d.write(size as u64 - 1, &[7]).unwrap();
        model[size - 1] = 7;
        d.close().unwrap();
        assert!(d.write(0, &[1]).is_err(), "closed");
        drop(d);
        let d = f.open(mode);
        assert_eq!(read_all(&d), model, "{mode:?} after a reopen");
        assert_eq!(d.stats().failures, 0);
        if mode != Mode::None {
            assert!(d.fsck(10).unwrap().is_empty());
        }
        d.close().unwrap();
    }
}

#[test]
fn the_ciphertext_holds_no_plaintext_and_holes_stay_holes() {
    let f = Fixture::new(64, 8, Mode::Pac);
    let d = f.open(Mode::Pac);
    let secret = b"attack at dawn, attack at dawn!!".repeat(128);
    d.write(0, &secret).unwrap();
    d.close().unwrap();
    let raw = std::fs::read(&f.path).unwrap();
    assert!(!raw.windows(14).any(|w| w == b"attack at dawn"));
    // 1 block of 64 written: the data file is sparse.
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(&f.path).unwrap();
    assert_eq!(m.len(), 64 * BLOCK as u64);
    assert!(
        m.blocks() * 512 <= 4 * BLOCK as u64,
        "{} bytes",
        m.blocks() * 512
    );
}

fn expect_tampered(r: intact_core::Result<()>, block: Option<u64>, what: &str) {
    match r {
        Err(Error::Tampered { block: b, .. }) if block.is_none() || b == block => {}
        other => panic!("{what}: expected an integrity failure at {block:?}, got {other:?}"),
    }
}

/// With the disk stopped: a flipped bit, a block replayed from before, a swapped block, a
/// changed slot, a changed tree node, the whole disk rolled back, a truncated data file.
/// Each is found on the next read of an affected block; other blocks still read.
#[test]
fn tampering_while_stopped_is_found_on_the_next_read() {
    for (mode, arity) in [(Mode::Pac, 4), (Mode::Sync, 4), (Mode::Pac, DMT)] {
        let f = Fixture::new(64, arity, mode);
        let d = f.open(mode);
        for b in 0..64u64 {
            d.write(b * BLOCK as u64, &fill(b, BLOCK)).unwrap();
        }
        d.close().unwrap();
        drop(d);
        let old = f.snapshot();
        let d = f.open(mode);
        for b in [3u64, 9, 40] {
            d.write(b * BLOCK as u64, &fill(b + 100, BLOCK)).unwrap();
        }
        d.close().unwrap();
        drop(d);
        let new = f.snapshot();
        let p = paths(&f.path);
        let patch = |file: &Path, off: u64, bytes: &[u8]| {
            use std::os::unix::fs::FileExt;
            let h = std::fs::OpenOptions::new().write(true).open(file).unwrap();
            h.write_all_at(bytes, off).unwrap();
        };
        let read_block = |d: &Disk, b: u64| d.read(b * BLOCK as u64, &mut vec![0u8; BLOCK]);
        type Case<'a> = (&'a str, Box<dyn Fn() + 'a>, u64);
        let cases: Vec<Case> = vec![
            (
                "a flipped bit of the data",
                Box::new(|| {
                    let mut b = std::fs::read(&p.data).unwrap()[5 * BLOCK + 17..][..1].to_vec();
                    b[0] ^= 4;
                    patch(&p.data, 5 * BLOCK as u64 + 17, &b);
                }),
                5,
            ),
            (
                "a block and its slots replayed from before",
                Box::new(|| {
                    let (od, om) = (&old[0].1, &old[1].1);
                    patch(&p.data, 9 * BLOCK as u64, &od[9 * BLOCK..10 * BLOCK]);
                    patch(&p.meta, 9 * 72, &om[9 * 72..10 * 72]);
                }),
                9,
            ),
            (
                "a block and its slots swapped with another's",
                Box::new(|| {
                    let (nd, nm) = (&new[0].1, &new[1].1);
                    patch(&p.data, 12 * BLOCK as u64, &nd[13 * BLOCK..14 * BLOCK]);
                    patch(&p.meta, 12 * 72, &nm[13 * 72..14 * 72]);
                }),
                12,
            ),
            (
                "a slot's counter raised",
                Box::new(|| {
                    let nm = &new[1].1;
                    let mut s = nm[20 * 72..21 * 72].to_vec();
                    for k in 0..3 {
                        s[k * 24 + 7] = 0x7f;
                    }
                    patch(&p.meta, 20 * 72, &s);
                }),
                20,
            ),
            (
                "a tree node changed",
                Box::new(|| {
                    // The first node stored: block 0's leaf (the n-ary tree's first group;
                    // the DMT's first region, after the unused lower levels of the tree
                    // above its regions).
                    let t = &new[2].1;
                    let at = t.chunks(32).position(|c| c != [0; 32]).unwrap() * 32;
                    let mut g = t[at..at + 32].to_vec();
                    g[0] ^= 1;
                    patch(&p.tree, at as u64, &g);
                }),
                0,
            ),
        ];
        for (what, tamper, block) in cases {
            f.restore(&new);
            tamper();
            let d = f.open(mode);
            expect_tampered(read_block(&d, block), Some(block), what);
            // A block in another part of the tree still reads.
            read_block(&d, 63).unwrap_or_else(|e| panic!("{what}: block 63: {e}"));
            assert!(d.stats().failures >= 1);
            let _ = d.close();
            drop(d);
        }
        // The whole disk rolled back to its previous close: every changed block fails.
        f.restore(&old);
        let d = f.open(mode);
        expect_tampered(read_block(&d, 3), None, "a rollback of the whole disk");
        d.close().unwrap();
        drop(d);
        // A truncated data file: refused at open.
        f.restore(&new);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p.data)
            .unwrap()
            .set_len(10 * BLOCK as u64)
            .unwrap();
        assert!(matches!(
            f.open_with(&DiskOptions::default()),
            Err(Error::Tampered { .. })
        ));
    }
}

#[test]
fn a_write_behind_the_servers_back_is_found_while_serving() {
    let f = Fixture::new(32, 4, Mode::Pac);
    let d = f.open(Mode::Pac);
    d.write(0, &fill(1, 8 * BLOCK)).unwrap();
    d.flush().unwrap();
    let mut b = vec![0u8; BLOCK];
    d.read(2 * BLOCK as u64, &mut b).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let h = std::fs::OpenOptions::new()
            .write(true)
            .open(&f.path)
            .unwrap();
        h.write_all_at(&[0xee; 8], 2 * BLOCK as u64 + 100).unwrap();
    }
    b.fill(0x55);
    expect_tampered(d.read(2 * BLOCK as u64, &mut b), Some(2), "behind the back");
    assert!(
        b.iter().all(|&x| x == 0x55),
        "no unauthenticated byte is returned"
    );
    d.read(3 * BLOCK as u64, &mut b).unwrap();
}

#[test]
fn opening_refuses_a_wrong_password_a_second_writer_and_a_missing_anchor() {
    let f = Fixture::new(8, 4, Mode::Pac);
    assert!(matches!(
        Disk::open(&f.path, b"wrong", f.trusted(), &DiskOptions::default()),
        Err(Error::WrongPassword)
    ));
    let d = f.open(Mode::Pac);
    assert!(matches!(
        f.open_with(&DiskOptions::default()),
        Err(Error::Locked(_))
    ));
    assert!(
        f.open_with(&DiskOptions {
            mode: Some(Mode::Aead),
            ..DiskOptions::default()
        })
        .is_err(),
        "a tree disk does not serve as aead"
    );
    d.close().unwrap();
    drop(d);
    f.trusted().remove().unwrap();
    assert!(matches!(
        f.open_with(&DiskOptions::default()),
        Err(Error::AnchorMissing { .. })
    ));
    // A config changed by hand: the key envelope no longer opens.
    let cfg = paths(&f.path).config;
    let s = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, s.replace("\"arity\": 4", "\"arity\": 2")).unwrap();
    assert!(matches!(
        Disk::open(&f.path, PW, f.trusted(), &DiskOptions::default()),
        Err(Error::WrongPassword)
    ));
    std::fs::write(&cfg, "{ not json").unwrap();
    assert!(matches!(
        Disk::open(&f.path, PW, f.trusted(), &DiskOptions::default()),
        Err(Error::Config(_))
    ));
}

/// What each block may read after a crash: its value at the last flush or any value
/// written after it.
struct CrashModel {
    allowed: Vec<Vec<Vec<u8>>>,
    /// The disk block of each entry.
    at: Vec<usize>,
}

impl CrashModel {
    /// `n` entries, at blocks 0, `stride`, 2 × `stride`, …
    fn every(n: usize, stride: usize) -> CrashModel {
        CrashModel {
            allowed: vec![vec![vec![0u8; BLOCK]]; n],
            at: (0..n).map(|i| i * stride).collect(),
        }
    }
    fn write(&mut self, b: usize, v: Vec<u8>) {
        self.allowed[b].push(v);
    }
    fn flush(&mut self) {
        for a in &mut self.allowed {
            let last = a.pop().unwrap();
            *a = vec![last];
        }
    }
    fn check(&self, d: &Disk, what: &str) {
        let mut buf = vec![0u8; BLOCK];
        for (a, &b) in self.allowed.iter().zip(&self.at) {
            d.read((b * BLOCK) as u64, &mut buf)
                .unwrap_or_else(|e| panic!("{what}: block {b}: {e}"));
            assert!(
                a.contains(&buf),
                "{what}: block {b} reads a value never allowed"
            );
        }
    }
    /// After a check: the state read is the new flushed one.
    fn settle(&mut self, d: &Disk) {
        let mut buf = vec![0u8; BLOCK];
        for (a, &b) in self.allowed.iter_mut().zip(&self.at) {
            d.read((b * BLOCK) as u64, &mut buf).unwrap();
            *a = vec![buf.clone()];
        }
    }
}

/// Sessions that end without a close (a crash: the process is gone, what it wrote is in the
/// files), with flushes at random points, some writes torn between their slot and their
/// data: every reopen recovers without an alarm to the last flush or later.
#[test]
fn a_crash_at_any_point_recovers_to_the_last_flush_or_later_without_an_alarm() {
    // (mode, tree, blocks, stride): 48 blocks `stride` apart are written; the DMT's last
    // rows spread them over three regions (4096 blocks each), whose shapes splay apart.
    for (mode, arity, blocks, stride) in [
        (Mode::Pac, 4, 48, 1),
        (Mode::Sync, 2, 48, 1),
        (Mode::Batch, 4, 48, 1),
        (Mode::Aead, 4, 48, 1),
        (Mode::Pac, DMT, 48, 1),
        (Mode::Sync, DMT, 48, 1),
        (Mode::Pac, DMT, 2 * 4096 + 512, 181),
        (Mode::Sync, DMT, 2 * 4096 + 512, 181),
    ] {
        let f = Fixture::new(blocks as u64, arity, mode);
        let mut model = CrashModel::every(48, stride);
        let mut r = rng(7 + arity + blocks as u64);
        let mut epoch = 0;
        let mut splays = 0;
        for round in 0..12 {
            let d = f.open(mode);
            // Every anchor stored advances the epoch: after a crash, the recovery's seal and
            // then the session's reservation (the first open follows a clean create: one).
            let want = if round == 0 {
                epoch.max(1) + 1
            } else {
                epoch + 2
            };
            assert_eq!(d.anchor().epoch, want, "{mode:?}/{arity} round {round}");
            model.check(&d, &format!("{mode:?}/{arity} round {round}"));
            model.settle(&d);
            for i in 0..(r() % 40) {
                let m = (r() % 48) as usize;
                let b = model.at[m];
                match r() % 8 {
                    0 => d.flush().map(|_| model.flush()).unwrap(),
                    1 => {
                        d.trim((b * BLOCK) as u64, BLOCK as u64).unwrap();
                        model.write(m, vec![0u8; BLOCK]);
                    }
                    2 => {
                        // A torn write: the slot landed, the data did not (the process
                        // died between them). The data file gets its old bytes back.
                        use std::os::unix::fs::FileExt;
                        let file = std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .open(&f.path)
                            .unwrap();
                        let mut before = vec![0u8; BLOCK];
                        file.read_exact_at(&mut before, (b * BLOCK) as u64).unwrap();
                        let v = fill(round * 1000 + i, BLOCK);
                        d.write((b * BLOCK) as u64, &v).unwrap();
                        file.write_all_at(&before, (b * BLOCK) as u64).unwrap();
                        // Then the crash, right away (the block reads as the torn state
                        // until recovery).
                        break;
                    }
                    _ => {
                        let v = fill(round * 1000 + i, BLOCK);
                        d.write((b * BLOCK) as u64, &v).unwrap();
                        model.write(m, v);
                    }
                }
            }
            epoch = d.anchor().epoch;
            splays += d.stats().splays;
            drop(d); // no close: a crash
        }
        assert_eq!(
            splays > 0,
            arity == DMT,
            "{mode:?}/{arity}: {splays} splays"
        );
        let d = f.open(mode);
        assert_eq!(d.anchor().epoch, epoch + 2);
        model.check(&d, &format!("{mode:?}/{arity} last"));
        assert_eq!(d.stats().failures, 0);
        assert!(d.fsck(5).unwrap().is_empty());
        d.close().unwrap();
    }
}

/// Recovery accepts only the crashed session's own writes: a flushed block of a region
/// written since the flush, put back to an older version, is refused.
#[test]
fn recovery_refuses_a_rollback_of_a_flushed_block() {
    let f = Fixture::new(32, 4, Mode::Pac);
    let d = f.open(Mode::Pac);
    d.write(0, &fill(1, 32 * BLOCK)).unwrap();
    d.close().unwrap();
    drop(d);
    let old = f.snapshot();
    let d = f.open(Mode::Pac);
    d.write(5 * BLOCK as u64, &fill(2, BLOCK)).unwrap();
    d.flush().unwrap();
    d.write(6 * BLOCK as u64, &fill(3, BLOCK)).unwrap();
    drop(d); // crash: block 6's region is marked
             // The adversary puts block 5 (flushed) back to its first version.
    let p = paths(&f.path);
    {
        use std::os::unix::fs::FileExt;
        let (od, om) = (&old[0].1, &old[1].1);
        let h = std::fs::OpenOptions::new()
            .write(true)
            .open(&p.data)
            .unwrap();
        h.write_all_at(&od[5 * BLOCK..6 * BLOCK], 5 * BLOCK as u64)
            .unwrap();
        let h = std::fs::OpenOptions::new()
            .write(true)
            .open(&p.meta)
            .unwrap();
        h.write_all_at(&om[5 * 72..6 * 72], 5 * 72).unwrap();
    }
    let e = f.open_with(&DiskOptions::default()).unwrap_err();
    assert!(e.is_tampered(), "{e}");
    // Nor can the sealed table or the anchor's rollback be used instead.
    f.restore(&old);
    let e = f.open_with(&DiskOptions::default()).unwrap_err();
    assert!(e.is_tampered(), "{e}");
}

/// Many threads write and read (their own blocks and shared ones) with checksums while
/// another flushes, through a PAC queue small enough to fill.
#[test]
fn threads_write_read_and_flush_at_once() {
    let f = Fixture::new(256, 8, Mode::Pac);
    let d = Arc::new(f.open(Mode::Pac));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                d.flush().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        })
    };
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                let mut r = rng(t + 1);
                let mut mine = vec![None; 256];
                for i in 0..400u64 {
                    // Own blocks: t, t+4, ...; a block carries its own checksum.
                    let b = (r() % 64) * 4 + t;
                    let mut v = fill(t * 10_000 + i, BLOCK);
                    let sum = v[..BLOCK - 8].iter().map(|&x| x as u64).sum::<u64>();
                    v[BLOCK - 8..].copy_from_slice(&sum.to_le_bytes());
                    d.write(b * BLOCK as u64, &v).unwrap();
                    mine[b as usize] = Some(v);
                    let c = (r() % 64) * 4 + t;
                    let mut got = vec![0u8; BLOCK];
                    d.read(c * BLOCK as u64, &mut got).unwrap();
                    assert_eq!(
                        Some(&got),
                        mine[c as usize].as_ref().or(Some(&vec![0; BLOCK]))
                    );
                    // Any block: whole and consistent (its checksum holds, or zeros).
                    let any = r() % 256;
                    d.read(any * BLOCK as u64, &mut got).unwrap();
                    let sum = got[..BLOCK - 8].iter().map(|&x| x as u64).sum::<u64>();
                    let stored = u64::from_le_bytes(got[BLOCK - 8..].try_into().unwrap());
                    assert!(sum == stored || got.iter().all(|&x| x == 0));
                }
                mine
            })
        })
        .collect();
    let mut model = vec![vec![0u8; BLOCK]; 256];
    for w in workers {
        for (b, v) in w.join().unwrap().into_iter().enumerate() {
            if let Some(v) = v {
                model[b] = v;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flusher.join().unwrap();
    let q = d.pac_stats().unwrap();
    assert!(q.writer_waits > 0, "the queue filled: {q:?}");
    d.close().unwrap();
    let got = read_all(&d);
    assert_eq!(got, model.concat());
    assert_eq!(d.stats().failures, 0);
}

/// A power cut can persist a block's data without its slot (the two calls reach the disk
/// in either order): recovery cannot tell that from tampering, so it refuses, naming the
/// block and the repair; `repair_torn` makes the block a hole and lists it, and the disk
/// goes on. A rollback of a flushed block is refused even so.
#[test]
fn a_block_torn_by_a_power_cut_is_refused_then_repaired_on_request() {
    let f = Fixture::new(32, 4, Mode::Pac);
    let d = f.open(Mode::Pac);
    d.write(0, &fill(1, 32 * BLOCK)).unwrap();
    d.flush().unwrap();
    let before = f.snapshot();
    d.write(9 * BLOCK as u64, &fill(2, BLOCK)).unwrap();
    drop(d); // crash
             // The new data landed, its slot did not.
    let meta = &before[1];
    std::fs::write(&meta.0, &meta.1).unwrap();
    let e = f.open_with(&DiskOptions::default()).unwrap_err();
    assert!(e.is_tampered(), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("block 9") && msg.contains("--repair-torn"),
        "{msg}"
    );
    let d = f
        .open_with(&DiskOptions {
            repair_torn: true,
            ..DiskOptions::default()
        })
        .unwrap();
    assert_eq!(d.repaired(), vec![9]);
    let got = read_all(&d);
    let mut want = fill(1, 32 * BLOCK);
    want[9 * BLOCK..10 * BLOCK].fill(0);
    assert_eq!(got, want);
    assert!(d.fsck(5).unwrap().is_empty());
    d.close().unwrap();
    drop(d);
    // A rollback of a flushed block in a region written since: refused, repair or not.
    let d = f.open(Mode::Pac);
    d.write(0, &fill(3, BLOCK)).unwrap();
    d.flush().unwrap();
    let flushed = f.snapshot();
    d.write(BLOCK as u64, &fill(4, BLOCK)).unwrap();
    drop(d);
    {
        use std::os::unix::fs::FileExt;
        let (od, om) = (&before[0].1, &before[1].1);
        let h = std::fs::OpenOptions::new()
            .write(true)
            .open(&flushed[0].0)
            .unwrap();
        h.write_all_at(&od[..BLOCK], 0).unwrap();
        let h = std::fs::OpenOptions::new()
            .write(true)
            .open(&flushed[1].0)
            .unwrap();
        h.write_all_at(&om[..72], 0).unwrap();
    }
    let e = f
        .open_with(&DiskOptions {
            repair_torn: true,
            ..DiskOptions::default()
        })
        .unwrap_err();
    assert!(
        e.is_tampered() && e.to_string().contains("rolled back"),
        "{e}"
    );
}

/// The batching baseline's weakness, shown: a block replayed behind the server's back (an
/// older version, authentic under GCM) is returned to the reader, and caught only at the
/// next checkpoint; pac and sync refuse it at the read. Its window is measured.
#[test]
fn batching_returns_a_replayed_block_before_it_catches_it() {
    for mode in [Mode::Batch, Mode::Pac, Mode::Sync] {
        let f = Fixture::new(16, 4, mode);
        let d = f
            .open_with(&DiskOptions {
                mode: Some(mode),
                batch: 1000,
                ..DiskOptions::default()
            })
            .unwrap();
        d.write(0, &fill(1, 4 * BLOCK)).unwrap();
        d.flush().unwrap();
        let old = f.snapshot();
        d.write(2 * BLOCK as u64, &fill(2, BLOCK)).unwrap();
        d.flush().unwrap();
        {
            use std::os::unix::fs::FileExt;
            let p = paths(&f.path);
            let h = std::fs::OpenOptions::new()
                .write(true)
                .open(&p.data)
                .unwrap();
            h.write_all_at(&old[0].1[2 * BLOCK..3 * BLOCK], 2 * BLOCK as u64)
                .unwrap();
            let h = std::fs::OpenOptions::new()
                .write(true)
                .open(&p.meta)
                .unwrap();
            h.write_all_at(&old[1].1[2 * 72..3 * 72], 2 * 72).unwrap();
        }
        let mut b = vec![0u8; BLOCK];
        let r = d.read(2 * BLOCK as u64, &mut b);
        if mode == Mode::Batch {
            r.unwrap();
            assert_eq!(
                b,
                fill(1, 4 * BLOCK)[2 * BLOCK..3 * BLOCK],
                "the old version"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
            d.write(0, &[1]).unwrap();
            let e = d.flush().unwrap_err();
            assert!(e.is_tampered(), "{e}");
            let st = d.stats();
            assert!(st.window_reads >= 1, "{st:?}");
            assert!(st.window_max_ns >= 5_000_000, "{st:?}");
            assert_eq!(st.failures, 1);
        } else {
            expect_tampered(r, Some(2), "a replay under pac and sync");
            assert_eq!(d.stats().window_reads, 0);
        }
    }
}

/// A read-only open of a crashed disk (`intact disk info`) recovers nothing and so reads
/// nothing: the crashed session's blocks do not match the sealed tree until a recovery.
#[test]
fn a_read_only_open_after_a_crash_reads_nothing_until_a_recovery() {
    let f = Fixture::new(16, 4, Mode::Pac);
    let d = f.open(Mode::Pac);
    d.write(0, &fill(1, BLOCK)).unwrap();
    d.flush().unwrap();
    d.write(BLOCK as u64, &fill(2, BLOCK)).unwrap();
    drop(d); // crash
    let ro = f
        .open_with(&DiskOptions {
            read_only: true,
            ..DiskOptions::default()
        })
        .unwrap();
    assert!(ro.needs_recovery());
    assert!(ro.anchor().open);
    let e = ro.read(0, &mut vec![0u8; BLOCK]).unwrap_err();
    assert!(e.to_string().contains("recover"), "{e}");
    assert!(ro.fsck(1).is_err());
    drop(ro);
    let d = f.open(Mode::Pac);
    assert!(!d.needs_recovery());
    let mut b = vec![0u8; 2 * BLOCK];
    d.read(0, &mut b).unwrap();
    assert_eq!(b, [fill(1, BLOCK), fill(2, BLOCK)].concat());
    d.close().unwrap();
    drop(d);
    let ro = f
        .open_with(&DiskOptions {
            read_only: true,
            ..DiskOptions::default()
        })
        .unwrap();
    assert!(!ro.needs_recovery());
    ro.read(0, &mut b).unwrap();
}

/// A block whose update still waits in the queue (pac) or the batch is checked against
/// that pending leaf: a replay behind the server's back is refused at the read, not only
/// once the tree has the leaf.
#[test]
fn a_pending_update_vouches_for_its_block_and_only_for_it() {
    for mode in [Mode::Pac, Mode::Batch] {
        let f = Fixture::new(16, 4, mode);
        let d = f
            .open_with(&DiskOptions {
                mode: Some(mode),
                // Nothing leaves the queue or the batch on its own during the test.
                pac: PacConfig {
                    rate: Some(0.001),
                    ..PacConfig::default()
                },
                batch: 1_000_000,
                ..DiskOptions::default()
            })
            .unwrap();
        d.write(0, &fill(1, 4 * BLOCK)).unwrap();
        d.flush().unwrap();
        let old = f.snapshot();
        d.write(2 * BLOCK as u64, &fill(2, BLOCK)).unwrap();
        if let Some(q) = d.pac_stats() {
            assert_eq!(q.applied, 4, "block 2's update still pending: {q:?}");
        }
        let mut b = vec![0u8; BLOCK];
        d.read(2 * BLOCK as u64, &mut b).unwrap();
        assert_eq!(b, fill(2, BLOCK));
        {
            use std::os::unix::fs::FileExt;
            let p = paths(&f.path);
            let h = std::fs::OpenOptions::new()
                .write(true)
                .open(&p.data)
                .unwrap();
            h.write_all_at(&old[0].1[2 * BLOCK..3 * BLOCK], 2 * BLOCK as u64)
                .unwrap();
            let h = std::fs::OpenOptions::new()
                .write(true)
                .open(&p.meta)
                .unwrap();
            h.write_all_at(&old[1].1[2 * 72..3 * 72], 2 * 72).unwrap();
        }
        expect_tampered(
            d.read(2 * BLOCK as u64, &mut b),
            Some(2),
            &format!("{mode:?}: a replay of a block with a pending update"),
        );
        // Other blocks read on.
        d.read(BLOCK as u64, &mut b).unwrap();
        assert_eq!(b, fill(1, 4 * BLOCK)[BLOCK..2 * BLOCK]);
    }
}

/// The batching baseline checkpoints every `batch` requests, reads included.
#[test]
fn batching_checkpoints_every_n_requests_reads_included() {
    let f = Fixture::new(16, 4, Mode::Batch);
    let d = f
        .open_with(&DiskOptions {
            mode: Some(Mode::Batch),
            batch: 4,
            ..DiskOptions::default()
        })
        .unwrap();
    let mut b = vec![0u8; BLOCK];
    for i in 0..3 {
        d.read(i * BLOCK as u64, &mut b).unwrap();
    }
    assert_eq!(
        d.stats().window_reads,
        0,
        "three requests: no checkpoint yet"
    );
    d.read(3 * BLOCK as u64, &mut b).unwrap();
    assert_eq!(d.stats().window_reads, 4, "the fourth request checkpoints");
    for i in 0..8 {
        d.read(i * BLOCK as u64, &mut b).unwrap();
    }
    assert_eq!(d.stats().window_reads, 12);
    assert_eq!(d.stats().checkpoints, 3);
    // Writes count too: four of them, one more checkpoint.
    for i in 0..4 {
        d.write(i * BLOCK as u64, &fill(i, BLOCK)).unwrap();
    }
    assert_eq!(d.stats().checkpoints, 4);
}

/// Recovery scans only the regions the intent bitmap marks (here regions 8 and 9 of 10,
/// bits 0 and 1 of the bitmap's second byte): a region not written since the flush is left
/// to the reads, which still catch a rollback there.
#[test]
fn recovery_scans_the_marked_regions_only() {
    let f = Fixture::new(10 * 4096, 4, Mode::Pac);
    let d = f.open(Mode::Pac);
    assert_eq!(d.regions(), (4096, 10));
    d.write(0, &fill(1, BLOCK)).unwrap();
    d.flush().unwrap();
    let old = f.snapshot();
    d.write(0, &fill(2, BLOCK)).unwrap();
    d.flush().unwrap();
    let r8 = 8 * 4096 * BLOCK as u64 + 5 * BLOCK as u64;
    d.write(r8, &fill(3, BLOCK)).unwrap();
    let r9 = 9 * 4096 * BLOCK as u64 + 7 * BLOCK as u64;
    d.write(r9, &fill(4, BLOCK)).unwrap();
    drop(d); // crash: regions 8 and 9 marked
    let intent = std::fs::read(paths(&f.path).intent).unwrap();
    assert_eq!(
        intent,
        vec![0, 3],
        "regions 8 and 9 are bits 0 and 1 of byte 1"
    );
    {
        use std::os::unix::fs::FileExt;
        let p = paths(&f.path);
        let h = std::fs::OpenOptions::new()
            .write(true)
            .open(&p.data)
            .unwrap();
        h.write_all_at(&old[0].1[..BLOCK], 0).unwrap();
        let h = std::fs::OpenOptions::new()
            .write(true)
            .open(&p.meta)
            .unwrap();
        let m = &old[1].1;
        h.write_all_at(&m[..m.len().min(72)], 0).unwrap();
    }
    let d = f.open(Mode::Pac);
    let mut b = vec![0u8; BLOCK];
    d.read(r8, &mut b).unwrap();
    assert_eq!(b, fill(3, BLOCK), "region 8 recovered");
    d.read(r9, &mut b).unwrap();
    assert_eq!(b, fill(4, BLOCK), "region 9 recovered");
    expect_tampered(
        d.read(0, &mut b),
        Some(0),
        "a rollback in a region not marked",
    );
}

/// An older version of a flushed block whose slot is still kept beside it (its data put
/// back, nothing else): the sealed value no longer authenticates the data, and recovery
/// does not fall back to the older slot: refused.
#[test]
fn recovery_never_falls_back_to_an_older_flushed_version() {
    let f = Fixture::new(16, 4, Mode::Pac);
    let d = f.open(Mode::Pac);
    d.write(0, &fill(1, BLOCK)).unwrap();
    d.flush().unwrap();
    let v1 = std::fs::read(&f.path).unwrap()[..BLOCK].to_vec();
    d.write(0, &fill(2, BLOCK)).unwrap();
    d.flush().unwrap();
    d.write(3 * BLOCK as u64, &fill(3, BLOCK)).unwrap();
    drop(d); // crash: block 0's region marked; its slots hold v1 and v2
    {
        use std::os::unix::fs::FileExt;
        let h = std::fs::OpenOptions::new()
            .write(true)
            .open(&f.path)
            .unwrap();
        h.write_all_at(&v1, 0).unwrap();
    }
    let e = f.open_with(&DiskOptions::default()).unwrap_err();
    assert!(e.is_tampered() && e.to_string().contains("block 0"), "{e}");
}
