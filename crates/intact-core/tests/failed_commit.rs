//! A failed commit or request (a store error, a full disk) at every mutating call of a
//! workload: the volume goes back to its last seal and goes on (docs/design.md, "A failed
//! commit"). Requests reach the store as they return (their data and their log record), so
//! a write, a create or a rename can meet the failure as well as a sync.
//!
//! SQLite's way: run a fixed workload once to count its store calls, then once per call
//! with that call failing. A simple model of the tree says what each operation must do and
//! what was acknowledged (sealed by a sync or fsync that returned Ok). Each run checks:
//! no operation after the failure is refused for it (the volume is not poisoned), the
//! volume holds exactly the sealed state or (when the failed commit had sealed before its
//! I/O failed) the state it sealed, the discarded changes are reported once, at the next
//! fsync of each file and the next sync, and at the end fsck is clean, no object is left
//! orphaned, and a reopen reads the same tree.

mod common;

use common::*;
use intact_core::format::{Kind, SchemeId};
use intact_core::store::{FaultPlan, FaultStore, MemStore, MemTrusted, UntrustedStore};
use intact_core::{Error, Volume};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Dir,
}

type Tree = BTreeMap<String, Node>;

#[derive(Debug, Clone, Copy)]
enum Op {
    Create(&'static str),
    Mkdir(&'static str),
    Write(&'static str, u64, usize, u8),
    Truncate(&'static str, u64),
    Rename(&'static str, &'static str),
    Unlink(&'static str),
    Fsync(&'static str),
    Sync,
}

/// Applies `op` to the model; `Err(())` where the volume must refuse it.
fn model_apply(t: &mut Tree, op: Op) -> Result<(), ()> {
    let parent_ok = |t: &Tree, p: &str| {
        let parent = &p[..p.rfind('/').unwrap()];
        parent.is_empty() || t.get(parent) == Some(&Node::Dir)
    };
    match op {
        Op::Create(p) | Op::Mkdir(p) => {
            if t.contains_key(p) || !parent_ok(t, p) {
                return Err(());
            }
            let n = match op {
                Op::Create(_) => Node::File(Vec::new()),
                _ => Node::Dir,
            };
            t.insert(p.to_string(), n);
        }
        Op::Write(p, off, len, seed) => match t.get_mut(p) {
            Some(Node::File(d)) => {
                let end = off as usize + len;
                if d.len() < end {
                    d.resize(end, 0);
                }
                d[off as usize..end].copy_from_slice(&pattern(seed, len));
            }
            _ => return Err(()),
        },
        Op::Truncate(p, len) => match t.get_mut(p) {
            Some(Node::File(d)) => d.resize(len as usize, 0),
            _ => return Err(()),
        },
        Op::Rename(a, b) => {
            if !matches!(t.get(a), Some(Node::File(_))) || t.contains_key(b) || !parent_ok(t, b) {
                return Err(());
            }
            let n = t.remove(a).unwrap();
            t.insert(b.to_string(), n);
        }
        Op::Unlink(p) => match t.get(p) {
            Some(Node::File(_)) => {
                t.remove(p);
            }
            _ => return Err(()),
        },
        Op::Fsync(p) => {
            if !t.contains_key(p) {
                return Err(());
            }
        }
        Op::Sync => {}
    }
    Ok(())
}

fn vol_apply(vol: &Volume, op: Op) -> intact_core::Result<()> {
    match op {
        Op::Create(p) => vol.create_file(p, None).map(|_| ()),
        Op::Mkdir(p) => vol.mkdir(p).map(|_| ()),
        Op::Write(p, off, len, seed) => vol.write_path(p, off, &pattern(seed, len)),
        Op::Truncate(p, len) => vol.truncate(p, len),
        Op::Rename(a, b) => vol.rename(a, b),
        Op::Unlink(p) => vol.unlink(p),
        Op::Fsync(p) => vol.fsync(vol.stat(p)?.ino),
        Op::Sync => vol.sync(),
    }
}

/// The whole tree as the volume shows it.
fn snapshot(vol: &Volume) -> Tree {
    let mut t = Tree::new();
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        let list = vol
            .readdir(if dir.is_empty() { "/" } else { &dir })
            .unwrap();
        for e in list {
            let p = format!("{dir}/{}", e.name);
            match e.kind {
                Kind::Dir => {
                    t.insert(p.clone(), Node::Dir);
                    stack.push(p);
                }
                _ => {
                    t.insert(p.clone(), Node::File(read_all(vol, &p).unwrap()));
                }
            }
        }
    }
    t
}

const SETUP: &[Op] = &[
    Op::Create("/a"),
    Op::Write("/a", 0, 10_000, 1),
    Op::Mkdir("/d"),
    Op::Create("/d/b"),
    Op::Write("/d/b", 0, 5_000, 2),
    Op::Sync,
];

const WORKLOAD: &[Op] = &[
    Op::Write("/a", 100, 4096, 3),
    Op::Create("/c"),
    Op::Write("/c", 0, 9_000, 4),
    Op::Fsync("/c"),
    Op::Rename("/d/b", "/e"),
    Op::Mkdir("/f"),
    Op::Create("/f/g"),
    Op::Write("/f/g", 0, 300, 5),
    Op::Truncate("/e", 10),
    Op::Sync,
    Op::Write("/c", 8_000, 4_000, 6),
    Op::Unlink("/a"),
    Op::Create("/h"),
    Op::Write("/h", 0, 5_000, 7),
    Op::Fsync("/h"),
    Op::Write("/e", 20_000, 100, 8),
    Op::Unlink("/c"),
    Op::Sync,
];

fn fresh(scheme: SchemeId) -> (Arc<FaultStore<MemStore>>, MemTrusted, Volume, Tree) {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, scheme, 4096);
    let mut model = Tree::new();
    for &op in SETUP {
        vol_apply(&vol, op).unwrap();
        model_apply(&mut model, op).unwrap();
    }
    (store, trusted, vol, model)
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// One call fails with EIO.
    Eio,
    /// The disk is full from that call on, until the check after the failure frees it.
    Full,
}

/// Runs the workload with mutating call `k` (from the workload's start) failing. Returns
/// whether an operation failed (`false`: `k` is past the workload's calls).
fn run_with_fault(scheme: SchemeId, fault: Fault, k: u64) -> bool {
    let (store, trusted, vol, mut sealed) = fresh(scheme);
    let at = store.attempts() + k;
    store.set_plan(match fault {
        Fault::Eio => FaultPlan {
            fail_eio_on: Some(at),
            ..Default::default()
        },
        Fault::Full => FaultPlan {
            full_from: Some(at),
            ..Default::default()
        },
    });
    let ctx = |op: Op| format!("{scheme:?} {fault:?} call {k}, {op:?}");
    let mut cur = sealed.clone();
    let mut failed = false;
    for &op in WORKLOAD {
        let before = cur.clone();
        let expect = model_apply(&mut cur, op);
        let r = vol_apply(&vol, op);
        match (&r, expect) {
            (Ok(()), Ok(())) => {
                if matches!(op, Op::Fsync(_) | Op::Sync) {
                    sealed = cur.clone();
                }
                continue;
            }
            (Err(e), Err(())) if !matches!(e, Error::Lost { .. } | Error::Io { .. }) => {
                continue;
            }
            // Every request reaches the store (its data, its log record), so any may fail.
            (Err(e), Ok(())) => {
                assert!(!failed, "{}: a second failure: {e}", ctx(op));
                assert!(
                    matches!(e, Error::Io { .. } | Error::Lost { .. }),
                    "{}: {e}",
                    ctx(op)
                );
            }
            (r, expect) => panic!("{}: got {r:?}, the model says {expect:?}", ctx(op)),
        }
        failed = true;
        store.set_plan(FaultPlan::default());
        // Room again (a full disk was freed): the next seal finds it, and writes are
        // accepted again.
        vol.seal().unwrap();
        assert!(!vol.is_full(), "{}", ctx(op));
        // Back at the last seal, or at the state the failed commit sealed.
        let now = snapshot(&vol);
        let reverted = now != cur;
        if reverted {
            assert_eq!(
                now,
                sealed,
                "{}: neither the sealed nor the new state",
                ctx(op)
            );
            // Each file whose changes were discarded reports it at its next fsync, once
            // (the failed fsync reported its own file's).
            for (p, n) in &sealed {
                let Node::File(_) = n else { continue };
                // Changed content (an unlink undone changed no file's content).
                let changed = before.get(p).is_some_and(|b| b != n);
                if !changed || matches!(op, Op::Fsync(q) if q == p) {
                    continue;
                }
                let ino = vol.stat(p).unwrap().ino;
                let e = vol
                    .fsync(ino)
                    .expect_err(&format!("{}: fsync of {p}", ctx(op)));
                assert!(matches!(e, Error::Lost { .. }), "{}: {p}: {e}", ctx(op));
                vol.fsync(ino).unwrap();
            }
            // Others touched by the discarded changes (directories, a renamed file) may
            // report too; once at most.
            for p in sealed.keys() {
                let ino = vol.stat(p).unwrap().ino;
                if let Err(e) = vol.fsync(ino) {
                    assert!(matches!(e, Error::Lost { .. }), "{}: {p}: {e}", ctx(op));
                    vol.fsync(ino).unwrap();
                }
            }
            cur = sealed.clone();
        } else {
            sealed = cur.clone();
        }
        // The sync after the failure reports the loss of what earlier requests had
        // changed since the last seal, once (a failed sync reported it itself); nothing
        // was lost when the failed seal had sealed, or when only the failed request's own
        // change went (its caller got the error).
        if reverted && before != sealed && !matches!(op, Op::Sync) {
            let e = vol.sync().expect_err(&ctx(op));
            assert!(matches!(e, Error::Lost { .. }), "{}: {e}", ctx(op));
        }
        vol.sync().unwrap();
        assert_eq!(snapshot(&vol), cur, "{}", ctx(op));
    }
    if !failed {
        // Past the workload's calls: nothing failed, and the check below must not.
        store.set_plan(FaultPlan::default());
    }
    vol.sync().unwrap();
    assert_eq!(
        snapshot(&vol),
        cur,
        "{scheme:?} {fault:?} call {k}: at the end"
    );
    assert_eq!(sealed, cur);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    assert_eq!(
        vol.orphans().unwrap(),
        Vec::<String>::new(),
        "{scheme:?} {fault:?} call {k}: objects of discarded changes were left behind"
    );
    assert_eq!(vol.integrity_failures(), 0);
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(
        snapshot(&vol),
        sealed,
        "{scheme:?} {fault:?} call {k}: reopened"
    );
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    failed
}

fn every_call(scheme: SchemeId, fault: Fault) {
    // The workload's store calls, counted on a clean run.
    let calls = {
        let (store, _trusted, vol, _) = fresh(scheme);
        let before = store.attempts();
        for &op in WORKLOAD {
            let _ = vol_apply(&vol, op);
        }
        store.attempts() - before
    };
    // A failing call that no request needs (room set aside for the log, which is best
    // effort) fails no operation: it is run all the same.
    let failures = (1..=calls)
        .filter(|&k| run_with_fault(scheme, fault, k))
        .count();
    assert!(
        failures > 20,
        "only {failures} of {calls} calls failed an operation"
    );
    println!("{scheme:?} {fault:?}: {failures} failure points, each recovered");
}

#[test]
fn eio_at_every_call_mt_eint() {
    every_call(SchemeId::MtEintGcm, Fault::Eio);
}

#[test]
fn full_disk_at_every_call_mt_eint() {
    every_call(SchemeId::MtEintGcm, Fault::Full);
}

#[test]
fn eio_at_every_call_mac_tree() {
    every_call(SchemeId::MacTree, Fault::Eio);
}

#[test]
fn eio_at_every_call_rand_eint() {
    every_call(SchemeId::RandEint, Fault::Eio);
}

#[test]
fn eio_at_every_call_comp_eint() {
    every_call(SchemeId::CompEint, Fault::Eio);
}

#[test]
fn full_disk_at_every_call_aead() {
    every_call(SchemeId::Aead, Fault::Full);
}

/// Commits fail at the store's call `k` from now (EIO once) until one does; returns the
/// failed sync's error.
fn fail_next_sync(store: &FaultStore<MemStore>, vol: &Volume, k: u64) -> Option<Error> {
    store.set_plan(FaultPlan {
        fail_eio_on: Some(store.attempts() + k),
        ..Default::default()
    });
    let r = vol.sync();
    store.set_plan(FaultPlan::default());
    r.err()
}

/// The discarded changes may have stored ciphertext under write counters of the session's
/// reservation (data appended in place, or in the journal): after going back, new writes
/// use counters past it, so no (key, nonce) pair encrypts two plaintexts. With GCM a
/// reused nonce shows as C1 ^ C2 == P1 ^ P2.
#[test]
fn a_failed_commit_never_reuses_a_write_counter() {
    let bs = 4096;
    let mut checked = 0;
    for k in 1..40 {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, bs as u32);
        vol.create_file("/x", None).unwrap();
        vol.write_path("/x", 0, &pattern(1, bs)).unwrap();
        vol.sync().unwrap();
        let data = names(&vol, "/x").data;
        let p1 = vec![0u8; bs];
        vol.write_path("/x", bs as u64, &p1).unwrap();
        let Some(e) = fail_next_sync(&store, &vol, k) else {
            break;
        };
        assert!(!e.is_tampered(), "{e}");
        let raw = store.inner().read_all(&data).unwrap().unwrap();
        if raw.len() < 2 * bs {
            continue; // failed before the block was stored
        }
        let c1 = raw[bs..2 * bs].to_vec();
        if vol.stat("/x").unwrap().size != bs as u64 {
            continue; // the commit sealed before its I/O failed: nothing was discarded
        }
        let p2 = vec![0xa5u8; bs];
        vol.write_path("/x", bs as u64, &p2).unwrap();
        vol.sync().unwrap();
        let raw = store.inner().read_all(&data).unwrap().unwrap();
        let c2 = &raw[bs..2 * bs];
        let reused = (0..bs).all(|i| c1[i] ^ c2[i] == p1[i] ^ p2[i]);
        assert!(!reused, "call {k}: a write counter was used twice");
        assert_eq!(read_all(&vol, "/x").unwrap()[bs..], p2[..]);
        checked += 1;
    }
    assert!(checked > 0, "no failure came after the block was stored");
}

/// Whether requests on `ino` hear that a failed commit discarded its file.
fn discarded(vol: &Volume, ino: u64) -> bool {
    match vol.attr(ino) {
        Err(Error::Lost { .. }) => true,
        Err(e) => panic!("{e}"),
        Ok(_) => false,
    }
}

/// A file created since the seal is gone after a failed commit; the front end (the kernel)
/// may still hold its inode number, so requests on the number get the failure (a program
/// writing to it hears ENOSPC or EIO, not ENOENT), and the number is not given to another
/// file until the front end forgets it. The front end hears what to drop.
#[test]
fn numbers_of_discarded_files_stay_unused_until_forgotten() {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    vol.track_references();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    vol.on_discard(Arc::new(move |d| tx.lock().unwrap().send(d).unwrap()));
    let root = vol.lookup(1, ".").map(|a| a.ino).unwrap_or(1);
    let a = vol
        .create_at(root, "a", Kind::File, 0o644, 0, 0, None)
        .unwrap();
    vol.write_ino(a.ino, 0, b"sealed").unwrap();
    vol.sync().unwrap();
    let n = vol
        .create_at(root, "n", Kind::File, 0o644, 0, 0, None)
        .unwrap();
    vol.write_ino(n.ino, 0, b"discarded").unwrap();
    vol.write_ino(a.ino, 0, b"SEALED, then changed").unwrap();
    let epoch = vol.info().unwrap().epoch;
    let e = fail_next_sync(&store, &vol, 1).expect("the sync fails");
    assert!(matches!(e, Error::Io { .. }), "{e}");
    // Going back is a new epoch (with a new counter reservation): epochs only grow.
    assert!(vol.info().unwrap().epoch > epoch);
    // The front end is told to drop the new file (with its name) and the changed one.
    let mut gone = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the hook is called");
    gone.sort_by_key(|d| d.ino);
    assert!(gone.contains(&intact_core::volume::Discarded {
        ino: n.ino,
        entry: Some((root, "n".into()))
    }));
    assert!(gone.iter().any(|d| d.ino == a.ino));
    // Back at the seal; the volume goes on.
    let mut buf = [0u8; 6];
    assert_eq!(vol.read_ino(a.ino, 0, &mut buf).unwrap(), 6);
    assert_eq!(&buf, b"sealed");
    assert!(vol.lookup(root, "n").is_err());
    assert!(discarded(&vol, n.ino));
    assert!(matches!(
        vol.write_ino(n.ino, 0, b"x"),
        Err(Error::Lost { .. })
    ));
    let m = vol
        .create_at(root, "m", Kind::File, 0o644, 0, 0, None)
        .unwrap();
    assert_ne!(
        m.ino, n.ino,
        "a number the front end may hold was given away"
    );
    assert!(discarded(&vol, n.ino));
    // Also after later seals: the program that wrote it never hears success.
    vol.seal().unwrap();
    assert!(matches!(vol.fsync(n.ino), Err(Error::Lost { .. })));
    assert!(matches!(vol.take_lost(n.ino), Err(Error::Lost { .. })));
    // Each file reports its loss once (the failed sync reported the volume's).
    assert!(matches!(vol.fsync(a.ino), Err(Error::Lost { .. })));
    vol.fsync(a.ino).unwrap();
    vol.sync().unwrap();
    vol.forget(n.ino).unwrap();
    let o = vol
        .create_at(root, "o", Kind::File, 0o644, 0, 0, None)
        .unwrap();
    assert_eq!(o.ino, n.ino, "a forgotten number is used again");
    vol.sync().unwrap();
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    assert_eq!(vol.orphans().unwrap(), Vec::<String>::new());
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    let mut names: Vec<String> = vol
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names, ["a", "m", "o"]);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// The one case that cannot go on: a number freed and given to a new file since the seal,
/// while the sealed state still has the old file there (the front end may hold either).
/// The volume refuses further work until reopened, and the reopen finds the seal.
#[test]
fn a_number_freed_and_reused_since_the_seal_needs_a_reopen() {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    vol.track_references();
    let a = vol
        .create_at(1, "a", Kind::File, 0o644, 0, 0, None)
        .unwrap();
    vol.write_ino(a.ino, 0, b"old").unwrap();
    vol.sync().unwrap();
    vol.unlink_at(1, "a").unwrap();
    vol.forget(a.ino).unwrap();
    let b = vol
        .create_at(1, "b", Kind::File, 0o644, 0, 0, None)
        .unwrap();
    assert_eq!(b.ino, a.ino, "the test needs the number reused");
    fail_next_sync(&store, &vol, 1).expect("the sync fails");
    assert!(matches!(vol.attr(a.ino), Err(Error::Poisoned(_))));
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/a").unwrap(), b"old");
    assert!(vol.stat("/b").is_err());
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// Failures while other threads write and fsync their own files: no thread's acknowledged
/// content is lost, nothing is poisoned, and fsck is clean.
#[test]
fn failed_commits_under_concurrent_writers_lose_nothing_acknowledged() {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = Arc::new(create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096));
    const THREADS: usize = 4;
    const ROUNDS: u8 = 40;
    let len = 3 * 4096 + 100;
    for t in 0..THREADS {
        vol.create_file(&format!("/t{t}"), None).unwrap();
    }
    // Made before the faults begin: a create that meets one would fail the test, not what
    // it tests (the big writer makes it again when a failure takes it away).
    vol.create_file("/big", None).unwrap();
    vol.sync().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let faults = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                store.set_plan(FaultPlan {
                    fail_eio_on: Some(store.attempts() + 1 + n % 7),
                    ..Default::default()
                });
                n += 1;
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
            store.set_plan(FaultPlan::default());
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let vol = vol.clone();
            std::thread::spawn(move || {
                let path = format!("/t{t}");
                let ino = vol.stat(&path).unwrap().ino;
                let (mut acked, mut failures) = (None, 0);
                for r in 1..=ROUNDS {
                    let seed = r.wrapping_mul(THREADS as u8).wrapping_add(t as u8);
                    // A write reaches the store too (its data, its log record): it may
                    // fail, and then its round is not acknowledged.
                    match vol.write_ino(ino, 0, &pattern(seed, len)) {
                        Ok(()) => {}
                        Err(Error::Io { .. } | Error::Lost { .. }) => {
                            failures += 1;
                            continue;
                        }
                        Err(e) => panic!("thread {t} round {r}: write: {e}"),
                    }
                    match vol.fsync(ino) {
                        Ok(()) => acked = Some(r),
                        Err(Error::Io { .. } | Error::Lost { .. }) => failures += 1,
                        Err(e) => panic!("thread {t} round {r}: {e}"),
                    }
                }
                (acked, failures)
            })
        })
        .collect();
    // One more writer passes the per-file dirty limit at every round, so that failures
    // also hit a write halfway through a file (the engine mends before the next request).
    let big = {
        let vol = vol.clone();
        std::thread::spawn(move || {
            let mut failed = 0;
            for r in 0..ROUNDS {
                match vol.write_path("/big", 0, &pattern(r, 5 << 19)) {
                    Ok(()) => {}
                    Err(Error::Io { .. } | Error::Lost { .. }) => failed += 1,
                    // Created after the last seal, and gone with a failure.
                    Err(Error::Fs { .. }) => drop(vol.create_file("/big", None)),
                    Err(e) => panic!("big round {r}: {e}"),
                }
            }
            failed
        })
    };
    let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let big_failed = big.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    faults.join().unwrap();
    let _ = vol.sync(); // may report an earlier failure once
    vol.sync().unwrap();
    let total: u32 = results.iter().map(|r| r.1).sum();
    assert!(total > 0, "no commit failed: the test tested nothing");
    let check = |vol: &Volume| {
        for (t, (acked, _)) in results.iter().enumerate() {
            let data = read_all(vol, &format!("/t{t}")).unwrap();
            let round = (1..=ROUNDS).find(|&r| {
                let seed = r.wrapping_mul(THREADS as u8).wrapping_add(t as u8);
                data == pattern(seed, len)
            });
            if let Some(a) = acked {
                let r = round.unwrap_or_else(|| panic!("thread {t}: content of no round"));
                assert!(
                    r >= *a,
                    "thread {t}: round {a} was acknowledged, {r} is there"
                );
            }
        }
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    };
    check(&vol);
    assert_eq!(vol.integrity_failures(), 0);
    println!("{total} fsyncs and {big_failed} large writes failed; every acknowledged round kept");
    drop(Arc::try_unwrap(vol).ok().expect("one owner"));
    check(&open(store.clone(), &trusted).unwrap());
}

/// A store error while a write pushes a file through its scheme (at the per-file dirty
/// limit, before any commit) leaves that file half updated: the engine goes back to the
/// last seal before the next request, and goes on.
#[test]
fn a_write_failing_at_the_file_dirty_limit_goes_back_too() {
    for scheme in [SchemeId::MtEintGcm, SchemeId::MacTree, SchemeId::Aead] {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme, 4096);
        vol.create_file("/s", None).unwrap();
        vol.write_path("/s", 0, b"sealed").unwrap();
        vol.sync().unwrap();
        vol.create_file("/big", None).unwrap();
        store.set_plan(FaultPlan {
            full_from: Some(store.attempts() + 1),
            ..Default::default()
        });
        let chunk = pattern(9, 64 << 10);
        let e = (0..64u64)
            .find_map(|i| vol.write_path("/big", i * chunk.len() as u64, &chunk).err())
            .expect("a write fails once the disk is full");
        let enospc = |e: &Error| matches!(e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC));
        assert!(enospc(&e), "{scheme:?}: {e}");
        // Still full after going back (which the next request does): writes that add
        // data are refused at once, not accepted to be lost at the next seal.
        vol.stat("/s").unwrap();
        assert!(vol.is_full(), "{scheme:?}");
        let e = vol.write_path("/s", 0, b"x").unwrap_err();
        assert!(enospc(&e), "{scheme:?}: {e}");
        assert!(enospc(&vol.truncate("/s", 100).unwrap_err()));
        vol.seal().unwrap(); // nothing to seal; the probe finds no room
        assert!(vol.is_full());
        vol.truncate("/s", 6).unwrap(); // the same size takes no room
        store.set_plan(FaultPlan::default());
        vol.seal().unwrap();
        assert!(!vol.is_full(), "{scheme:?}: room again");
        assert_eq!(read_all(&vol, "/s").unwrap(), b"sealed", "{scheme:?}");
        assert!(
            vol.stat("/big").is_err(),
            "{scheme:?}: created after the seal"
        );
        // The report carries the cause's errno (ENOSPC through FUSE, not a bare EIO).
        let e = vol.sync().unwrap_err();
        assert!(
            matches!(
                e,
                Error::Lost {
                    errno: Some(libc::ENOSPC),
                    ..
                }
            ),
            "{scheme:?}: {e:?}"
        );
        vol.write_path("/s", 6, b", then more").unwrap();
        vol.sync().unwrap();
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty(), "{scheme:?}");
        assert_eq!(vol.orphans().unwrap(), Vec::<String>::new(), "{scheme:?}");
        drop(vol);
        let vol = open(store.clone(), &trusted).unwrap();
        assert_eq!(read_all(&vol, "/s").unwrap(), b"sealed, then more");
    }
}

/// Handles the front end holds on files that exist at the seal survive going back: a file
/// open while it is unlinked afterwards is still kept until its last release.
#[test]
fn open_handles_survive_going_back() {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    vol.create_file("/a", None).unwrap();
    vol.write_path("/a", 0, b"kept while open").unwrap();
    vol.sync().unwrap();
    let a = vol.stat("/a").unwrap().ino;
    vol.open_handle(a).unwrap();
    vol.write_path("/a", 0, b"KEPT").unwrap();
    fail_next_sync(&store, &vol, 1).expect("the sync fails");
    vol.unlink("/a").unwrap();
    let mut buf = [0u8; 15];
    assert_eq!(
        vol.read_ino(a, 0, &mut buf).unwrap(),
        15,
        "open, so not freed"
    );
    assert_eq!(&buf, b"kept while open");
    vol.release_handle(a).unwrap();
    assert!(
        vol.read_ino(a, 0, &mut buf).is_err(),
        "freed at the last release"
    );
    vol.sync().unwrap();
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A trusted store whose next `store` fails, after writing (`Some(true)`) or before
/// (`Some(false)`).
struct FlakyTrusted {
    inner: MemTrusted,
    fail: std::sync::Mutex<Option<bool>>,
}

impl intact_core::store::TrustedStore for FlakyTrusted {
    fn load(&self) -> intact_core::Result<Option<Vec<u8>>> {
        self.inner.load()
    }
    fn store(&self, bytes: &[u8]) -> intact_core::Result<()> {
        if let Some(landed) = self.fail.lock().unwrap().take() {
            if landed {
                self.inner.store(bytes)?;
            }
            return Err(Error::io(
                "trusted store",
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        self.inner.store(bytes)
    }
    fn lock(&self, exclusive: bool) -> intact_core::Result<intact_core::store::TrustedLock> {
        self.inner.lock(exclusive)
    }
    fn location(&self) -> String {
        self.inner.location()
    }
    fn remove(&self) -> intact_core::Result<()> {
        self.inner.remove()
    }
}

/// Going back stores a new anchor; if that store call fails, it is tried again. When the
/// failed call had written the anchor all the same, the retry adopts it (it must not take
/// it for someone else's anchor and poison the volume).
#[test]
fn a_failed_anchor_store_while_going_back_is_tried_again() {
    for landed in [false, true] {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = Arc::new(FlakyTrusted {
            inner: MemTrusted::new(),
            fail: std::sync::Mutex::new(None),
        });
        let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
        vol.create_file("/a", None).unwrap();
        vol.write_path("/a", 0, b"sealed").unwrap();
        vol.sync().unwrap();
        vol.write_path("/a", 0, b"SEALED").unwrap();
        // The commit fails at its first store call, before its seal; then going back's
        // anchor store fails once.
        *trusted.fail.lock().unwrap() = Some(landed);
        fail_next_sync(&store, &vol, 1).expect("the sync fails");
        assert!(
            trusted.fail.lock().unwrap().is_none(),
            "the anchor store was tried"
        );
        assert_eq!(read_all(&vol, "/a").unwrap(), b"sealed", "landed: {landed}");
        vol.write_path("/a", 0, b"later!").unwrap();
        vol.sync().unwrap();
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
        drop(vol);
        let vol = open(store.clone(), &trusted.inner).unwrap();
        assert_eq!(read_all(&vol, "/a").unwrap(), b"later!");
    }
}

/// An fsync of a file the failed commit did not touch succeeds: the loss is reported to
/// those who lost something, not to every caller.
#[test]
fn an_untouched_file_fsyncs_after_a_failure() {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    for p in ["/a", "/c"] {
        vol.create_file(p, None).unwrap();
        vol.write_path(p, 0, b"sealed").unwrap();
    }
    vol.sync().unwrap();
    vol.write_path("/a", 0, b"SEALED").unwrap();
    fail_next_sync(&store, &vol, 1).expect("the sync fails");
    vol.fsync(vol.stat("/c").unwrap().ino).unwrap();
    let a = vol.stat("/a").unwrap().ino;
    assert!(matches!(vol.fsync(a), Err(Error::Lost { .. })));
    vol.fsync(a).unwrap();
}

/// Tampering found by a truncation that already dropped the file's unsealed blocks past
/// the new end: the engine goes back too, so the loss of those writes is reported.
#[test]
fn a_truncation_failing_halfway_goes_back_too() {
    let bs = 4096;
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, bs as u32);
    vol.create_file("/t", None).unwrap();
    vol.write_path("/t", 0, &pattern(1, 3 * bs)).unwrap();
    vol.sync().unwrap();
    vol.write_path("/t", 2 * bs as u64, &pattern(2, bs))
        .unwrap();
    store.set_plan(FaultPlan {
        corrupt_reads_of: Some(names(&vol, "/t").data),
        ..Default::default()
    });
    let e = vol.truncate("/t", bs as u64 / 2).unwrap_err();
    assert!(e.is_tampered(), "{e}");
    store.set_plan(FaultPlan::default());
    assert_eq!(
        read_all(&vol, "/t").unwrap(),
        pattern(1, 3 * bs),
        "back at the seal"
    );
    assert!(
        matches!(vol.sync(), Err(Error::Lost { .. })),
        "the write was lost"
    );
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// Files created and removed while a commit is in flight belong to the next commit: when
/// that one fails, the new file is discarded (its number answers the failure) and the
/// removed one is back, although the commit in flight sealed meanwhile.
#[test]
fn changes_made_while_a_commit_is_in_flight_go_back_with_the_next() {
    let faults = Arc::new(FaultStore::new_mem());
    let gated = Arc::new(Hooked {
        inner: faults.clone(),
        hook: Gate::default(),
    });
    let trusted = MemTrusted::new();
    let vol = Arc::new(create(gated.clone(), &trusted, SchemeId::MtEintGcm, 4096));
    vol.create_file("/x", None).unwrap();
    vol.write_path("/x", 0, b"kept").unwrap();
    vol.create_file("/y", None).unwrap();
    vol.sync().unwrap();
    vol.write_path("/y", 0, b"in flight").unwrap();
    gated.hook.set(true);
    let syncer = {
        let vol = vol.clone();
        std::thread::spawn(move || vol.sync())
    };
    gated.hook.wait_for_a_sync();
    // The commit is in flight: these belong to the next one.
    let n = vol.create_file("/n", None).unwrap();
    vol.unlink("/x").unwrap();
    gated.hook.set(false);
    syncer.join().unwrap().unwrap();
    assert_eq!(read_all(&vol, "/y").unwrap(), b"in flight");
    faults.set_plan(FaultPlan {
        fail_eio_on: Some(faults.attempts() + 1),
        ..Default::default()
    });
    vol.sync().unwrap_err();
    faults.set_plan(FaultPlan::default());
    assert_eq!(
        read_all(&vol, "/x").unwrap(),
        b"kept",
        "the removal went back"
    );
    assert!(vol.stat("/n").is_err());
    assert!(
        discarded(&vol, n),
        "the new file's number answers the failure"
    );
    assert_eq!(
        read_all(&vol, "/y").unwrap(),
        b"in flight",
        "sealed in flight"
    );
    vol.sync().unwrap();
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}
