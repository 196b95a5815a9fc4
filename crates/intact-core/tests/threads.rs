//! The engine is shared between threads (the FUSE mount will call it from many): concurrent
//! writers on different files and on the same file, readers, and syncs, then a reopen.

mod common;

use common::*;
use intact_core::format::SchemeId;
use intact_core::store::{MemStore, MemTrusted, UntrustedStore};
use intact_core::Volume;
use std::sync::Arc;

#[test]
fn volume_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Volume>();
}

#[test]
fn concurrent_writers_readers_and_syncs() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = Arc::new(create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096));
    vol.create_file("/shared", None).unwrap();
    const T: usize = 4;
    const CHUNK: usize = 10_000;
    std::thread::scope(|s| {
        for t in 0..T {
            let vol = vol.clone();
            s.spawn(move || {
                let own = format!("/own{t}");
                vol.create_file(&own, None).unwrap();
                for round in 0..20u8 {
                    let data = pattern(t as u8 ^ round, CHUNK);
                    vol.write_path(&own, (round as usize * CHUNK) as u64, &data)
                        .unwrap();
                    // Disjoint ranges of one shared file.
                    vol.write_path(
                        "/shared",
                        ((round as usize * T + t) * 1000) as u64,
                        &[t as u8; 1000],
                    )
                    .unwrap();
                    let mut back = vec![0u8; CHUNK];
                    vol.read_path(&own, (round as usize * CHUNK) as u64, &mut back)
                        .unwrap();
                    assert_eq!(back, data);
                    if round % 7 == t as u8 {
                        vol.sync().unwrap();
                    }
                }
            });
        }
    });
    drop(Arc::try_unwrap(vol).ok().expect("threads done"));
    let vol = open(store, &trusted).unwrap();
    for t in 0..T {
        let data = read_all(&vol, &format!("/own{t}")).unwrap();
        for round in 0..20u8 {
            assert_eq!(
                &data[round as usize * CHUNK..(round as usize + 1) * CHUNK],
                &pattern(t as u8 ^ round, CHUNK)[..]
            );
        }
    }
    let shared = read_all(&vol, "/shared").unwrap();
    for (k, chunk) in shared.chunks(1000).enumerate() {
        assert!(
            chunk.iter().all(|&b| b as usize == k % T),
            "shared chunk {k}"
        );
    }
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// Syncs that take a while, counted as they begin and end: a request that starts and
/// ends inside one sync ran while a seal's I/O was in flight.
#[derive(Default)]
struct SyncTimes {
    begun: std::sync::atomic::AtomicU64,
    ended: std::sync::atomic::AtomicU64,
}

impl SyncHook for SyncTimes {
    fn before_sync(&self, _names: &[String]) {
        self.begun.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    fn after_sync(&self) {
        self.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A store in memory whose syncs take a while.
fn slow_sync() -> Hooked<MemStore, SyncTimes> {
    Hooked {
        inner: MemStore::new(),
        hook: SyncTimes::default(),
    }
}

/// Writers overwrite, append and truncate their own files and read them back against a
/// model, a directory thread creates and removes entries, and a syncer seals in a loop
/// (group commits, their I/O outside the engine lock). Requests must complete while seals
/// are in flight; every file equals its model after a reopen, and fsck is clean.
#[test]
fn requests_complete_during_seals_and_match_the_model() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

    let slow = Arc::new(slow_sync());
    let store: Arc<dyn intact_core::store::UntrustedStore> = slow.clone();
    let trusted = MemTrusted::new();
    let vol = Arc::new(create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096));
    let stop = AtomicBool::new(false);
    let overlapped = AtomicU64::new(0);
    const W: usize = 3;
    let models: Vec<Vec<u8>> = std::thread::scope(|s| {
        let syncer = s.spawn(|| {
            let mut n = 0;
            while !stop.load(SeqCst) {
                vol.sync().unwrap();
                n += 1;
            }
            n
        });
        s.spawn(|| {
            let mut k = 0u32;
            while !stop.load(SeqCst) {
                vol.mkdir(&format!("/d{k}")).unwrap();
                vol.create_file(&format!("/d{k}/x"), None).unwrap();
                if k >= 2 {
                    vol.unlink(&format!("/d{}/x", k - 2)).unwrap();
                    vol.rmdir(&format!("/d{}", k - 2)).unwrap();
                }
                k += 1;
            }
        });
        let writers: Vec<_> = (0..W)
            .map(|t| {
                let (vol, slow, overlapped) = (&vol, &slow, &overlapped);
                s.spawn(move || {
                    let path = format!("/w{t}");
                    vol.create_file(&path, None).unwrap();
                    let mut model: Vec<u8> = Vec::new();
                    for round in 0..300u32 {
                        let seed = (t as u32 * 1000 + round) as u8;
                        let len = 1 + (round as usize * 7919) % 9000;
                        let off = match round % 4 {
                            0 => model.len(),                                    // append
                            1 => (round as usize * 104_729) % (model.len() + 1), // overwrite
                            2 => model.len() + 5000,                             // sparse
                            _ => 0,
                        };
                        let data = pattern(seed, len);
                        let (b0, e0) = (slow.hook.begun.load(SeqCst), slow.hook.ended.load(SeqCst));
                        vol.write_path(&path, off as u64, &data).unwrap();
                        if b0 == e0 + 1 && slow.hook.ended.load(SeqCst) == e0 {
                            overlapped.fetch_add(1, SeqCst);
                        }
                        if model.len() < off + len {
                            model.resize(off + len, 0);
                        }
                        model[off..off + len].copy_from_slice(&data);
                        if round % 9 == 8 {
                            let cut = model.len() / 2;
                            vol.truncate(&path, cut as u64).unwrap();
                            model.truncate(cut);
                        }
                        assert_eq!(read_all(vol, &path).unwrap(), model, "{path} round {round}");
                    }
                    model
                })
            })
            .collect();
        let models = writers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, SeqCst);
        assert!(syncer.join().unwrap() > 0);
        models
    });
    assert!(
        overlapped.load(SeqCst) > 0,
        "no request completed while a seal's I/O was in flight"
    );
    drop(Arc::try_unwrap(vol).ok().expect("threads done"));
    let vol = open(store, &trusted).unwrap();
    for (t, model) in models.iter().enumerate() {
        assert_eq!(&read_all(&vol, &format!("/w{t}")).unwrap(), model);
    }
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    assert!(vol.orphans().unwrap().is_empty());
}

/// Overwrites past the in-memory limit begin a seal whose I/O runs on its own thread (the
/// store's syncs are slow here, so it is still running when the writer returns); the volume
/// dropped right after waits for it and lets go of its lock, so an immediate reopen works
/// and reads the last content.
#[test]
fn background_seal_at_the_dirty_limit_and_drop_right_after() {
    let slow = Arc::new(slow_sync());
    let store: Arc<dyn intact_core::store::UntrustedStore> = slow.clone();
    let trusted = MemTrusted::new();
    let vol = create_staging(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    const SIZE: usize = 48 << 20;
    vol.create_file("/f", None).unwrap();
    for (k, chunk) in pattern(1, SIZE).chunks(1 << 20).enumerate() {
        vol.write_path("/f", (k << 20) as u64, chunk).unwrap();
    }
    vol.sync().unwrap();
    let synced = slow.hook.begun.load(std::sync::atomic::Ordering::SeqCst);
    // Overwrites are staged in memory: past 32 MiB of them a seal begins.
    let last = pattern(2, SIZE);
    for (k, chunk) in last.chunks(1 << 20).enumerate() {
        vol.write_path("/f", (k << 20) as u64, chunk).unwrap();
    }
    // The seal runs on its own thread: its first sync comes soon, with no call of ours.
    let t0 = std::time::Instant::now();
    while slow.hook.begun.load(std::sync::atomic::Ordering::SeqCst) == synced {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "48 MiB of overwrites began no seal on their own"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(read_all(&vol, "/f").unwrap(), last);
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(read_all(&vol, "/f").unwrap(), last);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// Appends go to the store directly and are not logged, so neither the staged bytes nor
/// the log's size begin a checkpoint for them: 64 MiB of them do (a checkpoint syncs them,
/// so this bounds its I/O). While that checkpoint is held in flight, more appends to the
/// same file still go to the store (the checkpoint only appended to it, so it journals
/// nothing that would cut them); all of it reads back after a reopen.
#[test]
fn appends_begin_a_checkpoint_past_64_mib_and_go_on_directly_over_it() {
    use std::time::{Duration, Instant};
    let gated = Arc::new(Hooked {
        inner: MemStore::new(),
        hook: Gate::default(),
    });
    let store: Arc<dyn intact_core::store::UntrustedStore> = gated.clone();
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    vol.create_file("/bulk", None).unwrap();
    vol.sync().unwrap();
    gated.hook.set(true);
    gated.hook.forget_syncs();
    // A failed assertion opens the gate before the volume's drop seals.
    struct Opens<'a>(&'a Gate);
    impl Drop for Opens<'_> {
        fn drop(&mut self) {
            self.0.set(false);
        }
    }
    let _opens = Opens(&gated.hook);
    let data = pattern(3, 72 << 20);
    let chunks: Vec<&[u8]> = data.chunks(1 << 20).collect();
    let reached_within = |wait: Duration| {
        let t = Instant::now();
        while !gated.hook.sync_reached() && t.elapsed() < wait {
            std::thread::sleep(Duration::from_millis(5));
        }
        gated.hook.sync_reached()
    };
    for (k, chunk) in chunks[..60].iter().enumerate() {
        vol.write_path("/bulk", (k << 20) as u64, chunk).unwrap();
    }
    assert!(
        !reached_within(Duration::from_millis(200)),
        "a checkpoint began before 64 MiB were appended"
    );
    for (k, chunk) in chunks.iter().enumerate().take(64).skip(60) {
        vol.write_path("/bulk", (k << 20) as u64, chunk).unwrap();
    }
    assert!(
        reached_within(Duration::from_secs(20)),
        "no checkpoint began after 64 MiB of appends"
    );
    // The checkpoint is held at its first sync. More appends go to the store.
    let data_len = || {
        let names = gated.inner.list().unwrap();
        names
            .iter()
            .filter(|n| n.ends_with(".d"))
            .filter_map(|n| gated.inner.len(n).unwrap())
            .max()
            .unwrap()
    };
    for (k, chunk) in chunks.iter().enumerate().skip(64) {
        vol.write_path("/bulk", (k << 20) as u64, chunk).unwrap();
    }
    assert_eq!(
        data_len(),
        72 << 20,
        "appends over the checkpoint in flight were not written to the store"
    );
    gated.hook.set(false);
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert!(read_all(&vol, "/bulk").unwrap() == data);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// Past twice the dirty limits, the writer that filled memory is paced, and past three
/// times it waits for the commit in flight; a small write of another file does not (a
/// create or a log line never waits behind a bulk writer's seal). The commit's syncs are
/// held by a gate, so "waits" is exact: the bulk writer stops making progress until the
/// gate opens, while the small write returns with the gate still closed.
#[test]
fn past_twice_the_dirty_limits_only_the_heavy_writer_waits() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    let gated = Arc::new(Hooked {
        inner: MemStore::new(),
        hook: Gate::default(),
    });
    let store: Arc<dyn intact_core::store::UntrustedStore> = gated.clone();
    let trusted = MemTrusted::new();
    let vol = Arc::new(create_staging(
        store.clone(),
        &trusted,
        SchemeId::MtEintGcm,
        4096,
    ));
    // Overwrites are staged in memory: 32 MiB of them begin a seal, 96 MiB more (the next
    // transaction's, while that seal is held in flight) are three times the limit.
    const SIZE: usize = 144 << 20;
    vol.create_file("/bulk", None).unwrap();
    vol.create_file("/small", None).unwrap();
    for (k, chunk) in pattern(1, SIZE).chunks(1 << 20).enumerate() {
        vol.write_path("/bulk", (k << 20) as u64, chunk).unwrap();
    }
    vol.write_path("/small", 0, b"sealed").unwrap();
    vol.sync().unwrap();
    let bulk = vol
        .lookup(intact_core::format::ROOT_INO, "bulk")
        .unwrap()
        .ino;
    let small = vol
        .lookup(intact_core::format::ROOT_INO, "small")
        .unwrap()
        .ino;

    gated.hook.set(true);
    let done = Arc::new(AtomicUsize::new(0));
    let last = pattern(2, SIZE);
    let writer = {
        let (vol, done, last) = (vol.clone(), done.clone(), last.clone());
        std::thread::spawn(move || {
            for (k, chunk) in last.chunks(1 << 20).enumerate() {
                vol.write_ino(bulk, (k << 20) as u64, chunk).unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    gated.hook.wait_for_a_sync();
    // The bulk writer stops once it is past three times the limit (it cannot get through
    // all 144 MiB while the seal is held).
    let mut seen = usize::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = done.load(Ordering::SeqCst);
        assert!(now < SIZE >> 20, "the bulk writer never waited");
        if now == seen {
            break;
        }
        seen = now;
    }
    assert!(
        seen >= 96,
        "stopped after {seen} MiB, before three times the limit"
    );
    // A small write of another file returns while the seal is still held.
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let vol = vol.clone();
        std::thread::spawn(move || tx.send(vol.write_ino(small, 0, b"a log line")).unwrap());
    }
    let r = rx.recv_timeout(Duration::from_secs(20));
    assert!(
        matches!(r, Ok(Ok(()))),
        "a small write waited behind the bulk writer's seal: {r:?}"
    );
    assert_eq!(done.load(Ordering::SeqCst), seen, "the bulk writer went on");
    gated.hook.set(false);
    writer.join().unwrap();
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(read_all(&vol, "/bulk").unwrap(), last);
    assert_eq!(read_all(&vol, "/small").unwrap(), b"a log line");
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// Many light writers (none reaches the heavy writer's share, none fills its own dirty
/// limit) overwriting sealed data while a seal is held in flight: their overwrites are
/// staged (in memory and in the log) until the next checkpoint. Past twice the limits none
/// of them waits, past four times every one does, so what the engine holds stays bounded
/// at four times the limit (128 MiB) whatever the number of files.
#[test]
fn dirty_data_of_light_writers_is_bounded_at_four_times_the_limit() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    const FILES: usize = 200;
    let gated = Arc::new(Hooked {
        inner: MemStore::new(),
        hook: Gate::default(),
    });
    let store: Arc<dyn intact_core::store::UntrustedStore> = gated.clone();
    let trusted = MemTrusted::new();
    let vol = Arc::new(create_staging(
        store.clone(),
        &trusted,
        SchemeId::MtEintGcm,
        4096,
    ));
    for i in 0..FILES {
        vol.create_file(&format!("/s{i}"), None).unwrap();
        vol.write_path(&format!("/s{i}"), 0, &pattern(0, 1 << 20))
            .unwrap();
    }
    vol.create_file("/first", None).unwrap();
    vol.sync().unwrap();
    let inos: Vec<u64> = (0..FILES)
        .map(|i| {
            vol.lookup(intact_core::format::ROOT_INO, &format!("s{i}"))
                .unwrap()
                .ino
        })
        .collect();
    // A seal held in flight: nothing written after it can be sealed until it ends.
    gated.hook.set(true);
    vol.write_path("/first", 0, b"in flight").unwrap();
    let syncer = {
        let vol = vol.clone();
        std::thread::spawn(move || vol.sync())
    };
    gated.hook.wait_for_a_sync();
    let done = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (vol, done) = (vol.clone(), done.clone());
        std::thread::spawn(move || {
            for (i, ino) in inos.iter().enumerate() {
                vol.write_ino(*ino, 0, &pattern(i as u8, 1 << 20)).unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let mut seen = usize::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = done.load(Ordering::SeqCst);
        assert!(now < FILES, "{now} MiB held: memory is not bounded");
        assert!(
            vol.held_bytes() <= 133 << 20,
            "{} bytes held",
            vol.held_bytes()
        );
        if now == seen {
            break;
        }
        seen = now;
    }
    // 1 MiB per file: the writes stop at four times the 32 MiB limit, not at twice it.
    assert!(
        (120..=132).contains(&seen),
        "light writers stopped after {seen} MiB, not at four times the limit"
    );
    gated.hook.set(false);
    syncer.join().unwrap().unwrap();
    writer.join().unwrap();
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    for i in (0..FILES).step_by(37) {
        assert_eq!(
            read_all(&vol, &format!("/s{i}")).unwrap(),
            pattern(i as u8, 1 << 20)
        );
    }
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// fsx's operations on one file (writes at random offsets, extending and overwriting;
/// truncations down and up; zeroed ranges) against a byte model, with a thread sealing the
/// volume all along, so that every kind of change meets a checkpoint in flight: every read
/// matches the model, and so does the file after a reopen.
#[test]
fn fsx_like_operations_during_checkpoints_match_the_model() {
    use rand::{Rng, SeedableRng};
    for scheme in [
        SchemeId::MtEintGcm,
        SchemeId::Aead,
        SchemeId::MacTree,
        SchemeId::CompEint,
        SchemeId::RandEint,
    ] {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = Arc::new(create(store.clone(), &trusted, scheme, 4096));
        vol.create_file("/f", None).unwrap();
        let ino = vol.stat("/f").unwrap().ino;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sealer = {
            let (vol, stop) = (vol.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    vol.seal().unwrap();
                    std::thread::sleep(std::time::Duration::from_micros(300));
                }
            })
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut model: Vec<u8> = Vec::new();
        const FLEN: usize = 1 << 20;
        for step in 0..3000u32 {
            match rng.gen_range(0..10) {
                0..=4 => {
                    let off = rng.gen_range(0..FLEN);
                    let len = rng.gen_range(1..65536).min(FLEN - off);
                    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                    vol.write_ino(ino, off as u64, &data).unwrap();
                    if model.len() < off + len {
                        model.resize(off + len, 0);
                    }
                    model[off..off + len].copy_from_slice(&data);
                }
                5 => {
                    let to = rng.gen_range(0..FLEN);
                    vol.truncate("/f", to as u64).unwrap();
                    model.resize(to, 0);
                }
                6 if !model.is_empty() => {
                    let off = rng.gen_range(0..model.len());
                    let len = rng.gen_range(1..65536);
                    vol.zero_range(ino, off as u64, len as u64, true).unwrap();
                    let end = (off + len).min(model.len());
                    model[off..end].fill(0);
                }
                _ => {
                    let got = read_all(&vol, "/f").unwrap();
                    assert!(
                        got == model,
                        "{scheme:?} step {step}: the file differs from the model (len {} vs {}, first difference at {:?})",
                        got.len(),
                        model.len(),
                        got.iter().zip(&model).position(|(a, b)| a != b)
                    );
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sealer.join().unwrap();
        assert_eq!(read_all(&vol, "/f").unwrap(), model, "{scheme:?}");
        // A crash of the process (nothing sealed on the way out): what every request
        // logged is there after the reopen.
        let vol = Arc::try_unwrap(vol).ok().expect("one owner");
        vol.set_seal_on_drop(false);
        drop(vol);
        let vol = open(store, &trusted).unwrap();
        assert_eq!(
            read_all(&vol, "/f").unwrap(),
            model,
            "{scheme:?} after a reopen"
        );
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }
}

/// An fsync never waits for a checkpoint's I/O (docs/design.md, "The log"): with a
/// checkpoint held in flight (its journal's sync waits at a gate), writes and an fsync of
/// another file return, and what they wrote survives a crash of the process.
#[test]
fn an_fsync_completes_while_a_checkpoint_is_in_flight() {
    use std::time::Duration;
    let gated = Arc::new(Hooked {
        inner: MemStore::new(),
        hook: Gate::journal_only(),
    });
    let store: Arc<dyn intact_core::store::UntrustedStore> = gated.clone();
    let trusted = MemTrusted::new();
    let vol = Arc::new(create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096));
    vol.create_file("/a", None).unwrap();
    vol.write_path("/a", 0, &pattern(1, 100_000)).unwrap();
    vol.create_file("/b", None).unwrap();
    vol.sync().unwrap();
    // An overwrite, so that the next checkpoint has a journal; it is held at its sync.
    vol.write_path("/a", 10, &pattern(2, 5_000)).unwrap();
    gated.hook.set(true);
    let syncer = {
        let vol = vol.clone();
        std::thread::spawn(move || vol.sync())
    };
    gated.hook.wait_for_a_sync();
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = {
        let vol = vol.clone();
        std::thread::spawn(move || {
            let ino = vol.stat("/b").unwrap().ino;
            let r = vol
                .write_path("/b", 0, &pattern(3, 20_000))
                .and_then(|()| vol.fsync(ino));
            tx.send(r).unwrap();
        })
    };
    let r = rx.recv_timeout(Duration::from_secs(20));
    assert!(
        matches!(r, Ok(Ok(()))),
        "the fsync waited for the checkpoint's I/O: {r:?}"
    );
    gated.hook.set(false);
    writer.join().unwrap();
    syncer.join().unwrap().unwrap();
    let vol = Arc::try_unwrap(vol).ok().expect("one owner");
    vol.set_seal_on_drop(false);
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    let mut a = pattern(1, 100_000);
    a[10..5_010].copy_from_slice(&pattern(2, 5_000));
    assert_eq!(read_all(&vol, "/a").unwrap(), a);
    assert_eq!(read_all(&vol, "/b").unwrap(), pattern(3, 20_000));
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A seal of the log (an fsync) that begins while a checkpoint is in flight stores an
/// anchor naming the log from before the checkpoint's roll: the segment the checkpoint
/// folds in must be durable then too. A crash right after the fsync, keeping only synced
/// writes (what a crash of the process leaves on S3, where unsynced writes are in its
/// memory), reopens with no alarm and the fsynced file (it raised "log segment ... is
/// shorter than the sealed log" when the seal synced only the new segment).
#[test]
fn an_fsync_during_a_checkpoint_leaves_a_sealed_log_that_is_durable() {
    use intact_core::store::{CrashImage, FaultStore};
    let gated = Arc::new(Hooked {
        inner: FaultStore::new_mem(),
        hook: Gate::journal_only(),
    });
    let store: Arc<dyn intact_core::store::UntrustedStore> = gated.clone();
    let trusted = MemTrusted::new();
    let vol = Arc::new(create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096));
    vol.create_file("/a", None).unwrap();
    vol.write_path("/a", 0, &pattern(1, 100_000)).unwrap();
    vol.create_file("/b", None).unwrap();
    vol.sync().unwrap();
    // Logged, not synced: the checkpoint folds this record's segment in.
    vol.write_path("/a", 10, &pattern(2, 5_000)).unwrap();
    gated.hook.set(true);
    let syncer = {
        let vol = vol.clone();
        std::thread::spawn(move || vol.sync())
    };
    gated.hook.wait_for_a_sync();
    let ino = vol.stat("/b").unwrap().ino;
    vol.write_path("/b", 0, &pattern(3, 20_000)).unwrap();
    vol.fsync(ino).unwrap();
    // The crash: while the checkpoint is still held, only what was synced survives.
    let image = gated.inner.crash_image(CrashImage::DurableOnly);
    let anchor = trusted.snapshot();
    gated.hook.set(false);
    syncer.join().unwrap().unwrap();
    let after = MemTrusted::new();
    after.restore(anchor);
    let vol = open(Arc::new(image), &after)
        .unwrap_or_else(|e| panic!("reopen after a crash during a checkpoint: {e}"));
    assert_eq!(read_all(&vol, "/b").unwrap(), pattern(3, 20_000));
    let a = read_all(&vol, "/a").unwrap();
    let mut a2 = pattern(1, 100_000);
    a2[10..5_010].copy_from_slice(&pattern(2, 5_000));
    assert!(
        a == pattern(1, 100_000) || a == a2,
        "/a is neither of its states"
    );
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A crash of the process leaves the log's tail in the page cache, not durable; the next
/// open replays it and starts a segment after it, whose anchor names the chain through
/// that tail: the tail must be made durable first, or a power cut right after the open
/// leaves a sealed log shorter than its anchor says.
#[test]
fn a_reopen_makes_the_replayed_tail_durable_before_an_anchor_names_it() {
    use intact_core::store::{CrashImage, FaultStore};
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    vol.create_file("/a", None).unwrap();
    vol.sync().unwrap();
    vol.write_path("/a", 0, &pattern(4, 10_000)).unwrap();
    // The process dies: its log records stay in the store's page cache, unsynced.
    vol.set_seal_on_drop(false);
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/a").unwrap(), pattern(4, 10_000));
    vol.create_file("/b", None).unwrap();
    vol.set_seal_on_drop(false);
    drop(vol);
    // The power cut: only what was synced.
    let image = store.crash_image(CrashImage::DurableOnly);
    let vol =
        open(Arc::new(image), &trusted).unwrap_or_else(|e| panic!("reopen after a power cut: {e}"));
    let a = read_all(&vol, "/a").unwrap();
    assert!(a.is_empty() || a == pattern(4, 10_000), "{} bytes", a.len());
}

/// Block `b` of file `f` at generation `g`: a header naming all three, then bytes that
/// depend on them (half of each block compressible, half not, so that RAND-EINT and
/// COMP-EINT take both of their paths).
fn gen_block(f: u32, b: u32, g: u32) -> Vec<u8> {
    let mut blk = vec![0u8; 4096];
    blk[..4].copy_from_slice(&f.to_le_bytes());
    blk[4..8].copy_from_slice(&b.to_le_bytes());
    blk[8..12].copy_from_slice(&g.to_le_bytes());
    let mut x = (f as u64) << 40 | (b as u64) << 20 | g as u64 | 1;
    for (i, v) in blk[12..].iter_mut().enumerate() {
        *v = if (f + b + g).is_multiple_of(2) && i < 2048 {
            (i % 7) as u8
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        };
    }
    blk
}

/// Reads run without the engine lock (issue 11): readers of many files, and of the same
/// file at once, while writers overwrite blocks, seals run (evicting open records: more
/// files than the engine keeps open), and files switch schemes. Every block a read returns
/// is one a writer wrote there, never an error or an alarm; at the end every block holds
/// its last write, also after a reopen, and fsck is clean.
#[test]
fn reads_without_the_engine_lock_during_writes_seals_and_scheme_switches() {
    use intact_core::format::ROOT_INO;
    use intact_core::volume::XattrMode;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Mutex;
    const SCHEMES: [SchemeId; 7] = [
        SchemeId::MtEintGcm,
        SchemeId::MtEintCbc,
        SchemeId::MacTree,
        SchemeId::Aead,
        SchemeId::RandEint,
        SchemeId::CompEint,
        SchemeId::CompEintZstd,
    ];
    const BIG: u32 = 7; // files 0..7: 32 blocks, one per scheme; the rest one block
    const FILES: u32 = 1100;
    const BLOCKS: u32 = 32;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = Arc::new(create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096));
    let blocks = |f: u32| if f < BIG { BLOCKS } else { 1 };
    let mut inos = Vec::new();
    for f in 0..FILES {
        let scheme = (f < BIG).then(|| SCHEMES[f as usize]);
        let ino = vol.create_file(&format!("/f{f}"), scheme).unwrap();
        let mut data = Vec::new();
        for b in 0..blocks(f) {
            data.extend(gen_block(f, b, 1));
        }
        vol.write_ino(ino, 0, &data).unwrap();
        inos.push(ino);
    }
    vol.sync().unwrap();
    // The newest generation written to each block (raised before the write).
    let model: Vec<Vec<AtomicU32>> = (0..FILES)
        .map(|f| (0..blocks(f)).map(|_| AtomicU32::new(1)).collect())
        .collect();
    let writing: Vec<Mutex<()>> = (0..FILES).map(|_| Mutex::new(())).collect();
    let done = AtomicBool::new(false);
    let reads = AtomicU32::new(0);
    // Files unlinked and created again under the same names, read by name meanwhile:
    // a read finds the old file or the new one, or no file, never an alarm.
    const CHURN: u32 = 3;
    let churn_gen: Vec<AtomicU32> = (0..CHURN).map(|_| AtomicU32::new(0)).collect();
    for c in 0..CHURN {
        let name = format!("/c{c}");
        vol.create_file(&name, None).unwrap();
        let data: Vec<u8> = (0..16).flat_map(|b| gen_block(FILES + c, b, 0)).collect();
        vol.write_path(&name, 0, &data).unwrap();
    }
    vol.sync().unwrap();
    let churn_gen = &churn_gen;
    std::thread::scope(|s| {
        // Readers: ranges of one to eight blocks, at offsets inside blocks too.
        for r in 0..3u64 {
            let (vol, inos, model, done, reads) = (&vol, &inos, &model, &done, &reads);
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ r;
                let mut next = |n: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % n
                };
                while !done.load(Ordering::Relaxed) {
                    // Mostly the big files (the same file as other readers, often).
                    let f = if next(4) == 0 {
                        BIG + next((FILES - BIG) as u64) as u32
                    } else {
                        next(BIG as u64) as u32
                    };
                    let n = blocks(f) as u64;
                    let first = next(n);
                    let count = 1 + next(8.min(n - first));
                    let skew = next(3) * 100;
                    let mut buf = vec![0u8; (count * 4096 - skew) as usize];
                    let got = vol
                        .read_ino(inos[f as usize], first * 4096 + skew, &mut buf)
                        .unwrap_or_else(|e| panic!("read of file {f} block {first}: {e}"));
                    assert_eq!(got, buf.len(), "file {f}: short read");
                    let start = first * 4096 + skew;
                    for b in first..first + count {
                        // The part of block b the read covers.
                        let (s, e) = ((b * 4096).max(start), (b + 1) * 4096);
                        let got = &buf[(s - start) as usize..(e - start) as usize];
                        let within = (s - b * 4096) as usize;
                        let newest = model[f as usize][b as usize].load(Ordering::Acquire);
                        let ok = (1..=newest).any(|g| got == &gen_block(f, b as u32, g)[within..]);
                        assert!(
                            ok,
                            "file {f} block {b}: a read returned bytes no write wrote"
                        );
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for r in 0..2u32 {
            let (vol, done) = (&vol, &done);
            s.spawn(move || {
                let mut buf = vec![0u8; 8 * 4096];
                let mut i = 0u32;
                while !done.load(Ordering::Relaxed) {
                    i += 1;
                    let c = (i + r) % CHURN;
                    let first = (i * 7 + r) % 8;
                    match vol.read_path(&format!("/c{c}"), first as u64 * 4096, &mut buf) {
                        // Created, not yet written.
                        Ok(0) => {}
                        Ok(n) => {
                            assert_eq!(n, buf.len(), "churned file {c}: short read");
                            let newest = churn_gen[c as usize].load(Ordering::Acquire);
                            for (k, got) in buf.chunks(4096).enumerate() {
                                let b = first + k as u32;
                                assert!(
                                    (0..=newest).any(|g| got == &gen_block(FILES + c, b, g)[..]),
                                    "churned file {c} block {b}: bytes no write wrote"
                                );
                            }
                        }
                        Err(e) => assert!(
                            matches!(
                                e,
                                intact_core::Error::Fs {
                                    kind: intact_core::FsErrorKind::NotFound,
                                    ..
                                }
                            ),
                            "churned file {c}: {e}"
                        ),
                    }
                }
            });
        }
        let vol_ = &vol;
        let churner = s.spawn(move || {
            let vol = vol_;
            for round in 1..=240u32 {
                let c = round % CHURN;
                let name = format!("/c{c}");
                churn_gen[c as usize].store(round, Ordering::Release);
                vol.unlink(&name).unwrap();
                vol.create_file(&name, None).unwrap();
                let data: Vec<u8> = (0..16)
                    .flat_map(|b| gen_block(FILES + c, b, round))
                    .collect();
                vol.write_path(&name, 0, &data).unwrap();
                vol.sync().unwrap();
            }
        });
        // Writers, then seals and scheme switches.
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (vol, inos, model, writing) = (&vol, &inos, &model, &writing);
                s.spawn(move || {
                    let mut x = 0x2545_f491_4f6c_dd1du64 ^ w;
                    let mut next = |n: u64| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x % n
                    };
                    for i in 0..600u32 {
                        let f = if i % 3 == 0 {
                            BIG + next((FILES - BIG) as u64) as u32
                        } else {
                            next(BIG as u64) as u32
                        };
                        let n = blocks(f) as u64;
                        let first = next(n);
                        let count = 1 + next(4.min(n - first));
                        let _w = writing[f as usize].lock().unwrap();
                        let mut data = Vec::new();
                        for b in first..first + count {
                            let slot = &model[f as usize][b as usize];
                            let g = slot.load(Ordering::Relaxed) + 1;
                            slot.store(g, Ordering::Release);
                            data.extend(gen_block(f, b as u32, g));
                        }
                        vol.write_ino(inos[f as usize], first * 4096, &data)
                            .unwrap();
                        if i % 50 == 49 {
                            vol.sync().unwrap();
                        }
                    }
                })
            })
            .collect();
        let (vol, inos, writing) = (&vol, &inos, &writing);
        let switcher = s.spawn(move || {
            for round in 0..12usize {
                let f = round % BIG as usize;
                let to = SCHEMES[(f + 1 + round) % SCHEMES.len()];
                let _w = writing[f].lock().unwrap();
                vol.setxattr(
                    inos[f],
                    "user.intact.scheme",
                    to.name().as_bytes(),
                    XattrMode::Set,
                )
                .unwrap_or_else(|e| panic!("switch file {f} to {to:?}: {e}"));
                drop(_w);
                vol.sync().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        switcher.join().unwrap();
        churner.join().unwrap();
        done.store(true, Ordering::Relaxed);
    });
    assert!(reads.load(Ordering::Relaxed) > 100, "the readers ran");
    assert_eq!(vol.integrity_failures(), 0);
    let check = |vol: &Volume| {
        for f in 0..FILES {
            let ino = vol.lookup(ROOT_INO, &format!("f{f}")).unwrap().ino;
            let mut buf = vec![0u8; blocks(f) as usize * 4096];
            assert_eq!(vol.read_ino(ino, 0, &mut buf).unwrap(), buf.len());
            for (b, chunk) in buf.chunks(4096).enumerate() {
                let g = model[f as usize][b].load(Ordering::Relaxed);
                assert!(
                    chunk == gen_block(f, b as u32, g),
                    "file {f} block {b}: not generation {g}"
                );
            }
        }
    };
    check(&vol);
    drop(Arc::try_unwrap(vol).ok().expect("threads done"));
    let vol = open(store, &trusted).unwrap();
    check(&vol);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A hook whose first read of one object waits while its gate is closed.
#[derive(Default)]
struct HeldReads {
    /// (the object whose reads wait, gate closed, a read is waiting)
    held: std::sync::Mutex<(String, bool, bool)>,
    cv: std::sync::Condvar,
}

impl HeldReads {
    fn hold(&self, name: &str) {
        *self.held.lock().unwrap() = (name.to_string(), true, false);
    }
    fn wait_for_reader(&self) {
        let mut h = self.held.lock().unwrap();
        while !h.2 {
            h = self.cv.wait(h).unwrap();
        }
    }
    fn release(&self) {
        self.held.lock().unwrap().1 = false;
        self.cv.notify_all();
    }
}

impl SyncHook for HeldReads {
    fn before_read(&self, name: &str) {
        let mut h = self.held.lock().unwrap();
        // Only the first read of the object waits.
        if h.1 && h.0 == name && !h.2 {
            h.2 = true;
            self.cv.notify_all();
            while h.1 {
                h = self.cv.wait(h).unwrap();
            }
        }
    }
}

/// A store whose reads wait as [`HeldReads`] says.
fn held_reads() -> Arc<Hooked<MemStore, HeldReads>> {
    Arc::new(Hooked {
        inner: MemStore::new(),
        hook: HeldReads::default(),
    })
}

/// A read whose store I/O is held up holds no engine lock: reads of the same file, and
/// reads, writes and seals of other files complete meanwhile. Unlinking the file it reads waits for it (its objects
/// are deleted only once the read is done), and the read returns the file's content.
#[test]
fn a_read_in_flight_holds_no_engine_lock_and_its_file_outlives_it() {
    for scheme in [
        SchemeId::MtEintGcm,
        SchemeId::MacTree,
        SchemeId::RandEint,
        SchemeId::CompEint,
    ] {
        let store = held_reads();
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme, 4096);
        vol.create_file("/a", None).unwrap();
        vol.create_file("/b", None).unwrap();
        let a = pattern(1, 5 * 4096);
        vol.write_path("/a", 0, &a).unwrap();
        vol.write_path("/b", 0, &pattern(2, 4096)).unwrap();
        vol.sync().unwrap();
        // Reopened: what a scheme caches for reads (RTree's index) is not loaded; the first
        // read loads it, so that the next one runs without the engine lock.
        drop(vol);
        let vol = open(store.clone(), &trusted).unwrap();
        assert_eq!(read_all(&vol, "/a").unwrap(), a, "{scheme:?}");
        let data = names(&vol, "/a").data;
        store.hook.hold(&data);
        let unlinked = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut buf = vec![0u8; a.len()];
                let n = vol.read_path("/a", 0, &mut buf);
                (n, buf)
            });
            store.hook.wait_for_reader();
            // The read is in its store I/O: other requests go on, a read of the same file
            // too (reads share the file's state). If they wait for it, the store is let go
            // after a while and the test fails instead of hanging.
            let (done, finished) = std::sync::mpsc::channel();
            let (vol_, a_) = (&vol, &a);
            s.spawn(move || {
                assert_eq!(read_all(vol_, "/a").unwrap(), *a_, "{scheme:?}");
                assert_eq!(read_all(vol_, "/b").unwrap(), pattern(2, 4096));
                vol_.write_path("/b", 4096, &pattern(3, 4096)).unwrap();
                vol_.sync().unwrap();
                done.send(()).unwrap();
            });
            if finished
                .recv_timeout(std::time::Duration::from_secs(20))
                .is_err()
            {
                store.hook.release();
                panic!("{scheme:?}: other requests waited for a read's store I/O");
            }
            let unlinker = s.spawn(|| {
                vol.unlink("/a").unwrap();
                unlinked.store(true, std::sync::atomic::Ordering::SeqCst);
                vol.sync().unwrap();
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            let early = unlinked.load(std::sync::atomic::Ordering::SeqCst);
            store.hook.release();
            assert!(
                !early,
                "{scheme:?}: the unlink did not wait for the read of the file"
            );
            let (n, buf) = reader.join().unwrap();
            assert_eq!(n.unwrap(), a.len(), "{scheme:?}");
            assert!(buf == a, "{scheme:?}: the read returned other bytes");
            unlinker.join().unwrap();
        });
        assert_eq!(vol.integrity_failures(), 0);
        assert!(
            store.inner.len(&data).unwrap().is_none(),
            "{scheme:?}: deleted at the seal"
        );
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }
}

/// The record of a file being read without the engine lock is not dropped when requests on
/// many other files prune the idle ones: a write of the file then waits for the read (a
/// second record of the file would let it go ahead under the read).
#[test]
fn a_record_a_read_holds_is_not_dropped() {
    let store = held_reads();
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let a = pattern(1, 3 * 4096);
    vol.create_file("/a", None).unwrap();
    vol.write_path("/a", 0, &a).unwrap();
    for k in 0..1200 {
        vol.create_file(&format!("/m{k}"), None).unwrap();
    }
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    vol.sync().unwrap();
    store.hook.hold(&names(&vol, "/a").data);
    let wrote = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut buf = vec![0u8; a.len()];
            let n = vol.read_path("/a", 0, &mut buf);
            (n, buf)
        });
        store.hook.wait_for_reader();
        // More records than the engine keeps: idle ones are dropped at each request's end.
        for k in 0..1200 {
            vol.stat(&format!("/m{k}")).unwrap();
        }
        let writer = s.spawn(|| {
            vol.write_path("/a", 0, &pattern(2, 4096)).unwrap();
            wrote.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        let early = wrote.load(std::sync::atomic::Ordering::SeqCst);
        store.hook.release();
        assert!(!early, "a write went ahead of a read of its file in flight");
        let (n, buf) = reader.join().unwrap();
        assert_eq!(n.unwrap(), a.len());
        assert!(buf == a, "the read returned other bytes");
        writer.join().unwrap();
    });
    let mut want = a.clone();
    want[..4096].copy_from_slice(&pattern(2, 4096));
    assert_eq!(read_all(&vol, "/a").unwrap(), want);
    assert_eq!(vol.integrity_failures(), 0);
    assert!(vol.resident_records() <= 1100, "{}", vol.resident_records());
}

/// Large writes are encrypted without the engine lock (docs/design.md, "Writes sealed
/// without the engine lock"): writers of 64 and 128 KiB runs race on the same blocks of two
/// files (mt-eint in GCM and CBC mode), beside 4 KiB writers of the same blocks, seals and
/// readers, so that plans are overtaken and written again from their plaintext. No read
/// fails or returns a block no write wrote there (no torn block, no alarm); after a reopen
/// every block holds what it held before, and fsck is clean.
#[test]
fn large_writes_sealed_without_the_lock_race_on_the_same_blocks() {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Mutex;
    const BLOCKS: u32 = 64;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = Arc::new(create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096));
    let schemes = [SchemeId::MtEintGcm, SchemeId::MtEintCbc];
    let mut inos = Vec::new();
    for (f, s) in schemes.iter().enumerate() {
        let ino = vol.create_file(&format!("/s{f}"), Some(*s)).unwrap();
        let data: Vec<u8> = (0..BLOCKS)
            .flat_map(|b| gen_block(f as u32, b, 1))
            .collect();
        vol.write_ino(ino, 0, &data).unwrap();
        inos.push(ino);
    }
    vol.sync().unwrap();
    // Every generation written (or being written) to each block.
    let model: Vec<Vec<Mutex<HashSet<u32>>>> = (0..2)
        .map(|_| {
            (0..BLOCKS)
                .map(|_| Mutex::new(HashSet::from([1])))
                .collect()
        })
        .collect();
    let next_gen = AtomicU32::new(2);
    let done = AtomicBool::new(false);
    let check = |f: usize, b: u32, got: &[u8]| {
        let gens = model[f][b as usize].lock().unwrap();
        assert!(
            gens.iter().any(|&g| got == gen_block(f as u32, b, g)),
            "file {f} block {b}: bytes no write wrote"
        );
    };
    std::thread::scope(|s| {
        let (vol, inos, model, next_gen, done, check) =
            (&vol, &inos, &model, &next_gen, &done, &check);
        let mut writers = Vec::new();
        for w in 0..4u64 {
            writers.push(s.spawn(move || {
                let mut x = 0x2545_f491_4f6c_dd1du64 ^ (w << 32);
                let mut next = |n: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % n
                };
                for _ in 0..60 {
                    let f = next(2) as usize;
                    // Writer 3 writes single blocks; the others 16- or 32-block runs
                    // starting on a few offsets, so that they overlap often.
                    let count = if w == 3 { 1 } else { 16 << next(2) };
                    let first = if w == 3 {
                        next(BLOCKS as u64) as u32
                    } else {
                        (next(3) * 8) as u32
                    };
                    let g = next_gen.fetch_add(1, Ordering::Relaxed);
                    let mut data = Vec::new();
                    for b in first..first + count {
                        model[f][b as usize].lock().unwrap().insert(g);
                        data.extend(gen_block(f as u32, b, g));
                    }
                    vol.write_ino(inos[f], first as u64 * 4096, &data)
                        .unwrap_or_else(|e| panic!("write of file {f} at {first}: {e}"));
                }
            }));
        }
        s.spawn(move || {
            while !done.load(Ordering::Relaxed) {
                vol.sync().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        });
        s.spawn(move || {
            let mut i = 0u32;
            let mut buf = vec![0u8; 16 * 4096];
            while !done.load(Ordering::Relaxed) {
                i += 1;
                let f = (i % 2) as usize;
                let first = (i * 5) % (BLOCKS - 16);
                let n = vol
                    .read_ino(inos[f], first as u64 * 4096, &mut buf)
                    .unwrap_or_else(|e| panic!("read of file {f} at {first}: {e}"));
                assert_eq!(n, buf.len());
                for (k, got) in buf.chunks(4096).enumerate() {
                    check(f, first + k as u32, got);
                }
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    let mut held = Vec::new();
    for (f, &ino) in inos.iter().enumerate() {
        let mut buf = vec![0u8; BLOCKS as usize * 4096];
        assert_eq!(vol.read_ino(ino, 0, &mut buf).unwrap(), buf.len());
        for (b, got) in buf.chunks(4096).enumerate() {
            check(f, b as u32, got);
        }
        held.push(buf);
    }
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    drop(Arc::try_unwrap(vol).ok().expect("threads done"));
    let vol = open(store, &trusted).unwrap();
    for (f, buf) in held.iter().enumerate() {
        assert_eq!(&read_all(&vol, &format!("/s{f}")).unwrap(), buf, "file {f}");
    }
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A bulk write longer than a slice (256 KiB) is applied in slices, each its own visit to
/// the engine and its own log record, so that a small request waits for one slice at most
/// (docs/design.md, "Bulk writes in slices"); it reads back whole, after a reopen too. A
/// write whose end the file cannot reach (past 2^32 blocks) fails before any slice lands.
#[test]
fn a_bulk_write_goes_in_slices_and_fails_whole_when_it_cannot_fit() {
    use intact_core::store::{CountingStore, ObjectClass};
    let store = Arc::new(CountingStore::new(MemStore::new()));
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let ino = vol.create_file("/f", None).unwrap();
    vol.write_ino(ino, 0, &[1u8; 8192]).unwrap();
    let data: Vec<u8> = (0..(1 << 20) + 5000).map(|i| (i % 251) as u8).collect();
    let before = store.stats();
    vol.write_ino(ino, 3, &data).unwrap();
    let records = store
        .stats()
        .since(&before)
        .get(ObjectClass::Control)
        .writes;
    assert!(records >= 5, "{records} log appends for five slices");
    let mut want = vec![1u8; 8192];
    want.resize(3 + data.len(), 0);
    want[3..].copy_from_slice(&data);
    assert!(read_all(&vol, "/f").unwrap() == want);
    // Past the largest file: the first slices would fit, the last would not.
    let limit = intact_core::crypto::MAX_BLOCKS * 4096;
    let e = vol
        .write_ino(ino, limit - (512 << 10), &data[..1 << 20])
        .unwrap_err();
    assert!(
        matches!(
            e,
            intact_core::Error::Fs {
                kind: intact_core::FsErrorKind::TooLarge,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        vol.stat("/f").unwrap().size,
        want.len() as u64,
        "nothing landed"
    );
    vol.set_seal_on_drop(false);
    drop(vol);
    let vol = open(store as Arc<dyn UntrustedStore>, &trusted).unwrap();
    assert!(read_all(&vol, "/f").unwrap() == want, "after the replay");
}
