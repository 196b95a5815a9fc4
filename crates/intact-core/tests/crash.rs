//! Crash safety: a scripted workload with syncs is crashed at every write index by the
//! fault-injecting store. The media image after the crash keeps only synced writes, a
//! random subset of the unsynced ones (in order), or all of them. Every reopen must
//! succeed, never with a tamper error, and every file must equal its content at the last
//! completed sync or a later sync point. A second crash during recovery is survived too.

mod common;

use common::workload::{explained, flip, read_state, workload_with, Model};
use common::*;
use intact_core::format::SchemeId;
use intact_core::store::{CrashImage, FaultPlan, FaultStore, MemStore, MemTrusted, UntrustedStore};
use intact_core::Volume;
use std::collections::BTreeMap;
use std::sync::Arc;

fn check_recovered(
    image: MemStore,
    trusted: &MemTrusted,
    points: &[Model],
    done: usize,
    what: &str,
    partial: bool,
) {
    let image = Arc::new(image);
    // A second crash, during recovery itself (journal replay, counter reservation).
    let faulty = Arc::new(FaultStore::with_mem(MemStore::from_snapshot(
        image.snapshot(),
    )));
    faulty.set_plan(FaultPlan {
        crash_after_writes: Some(1),
        ..Default::default()
    });
    let at_crash = trusted.snapshot();
    if let Ok(v) = open(faulty.clone(), trusted) {
        drop(v);
    }
    let second = faulty.crash_image(CrashImage::Random(7));
    // The interrupted recovery may have sealed anchors: they belong to `second` only.
    let after_second = trusted.snapshot();
    trusted.restore(at_crash.clone());
    // A read-only open stages the pending journal in memory: same state, store untouched.
    let before = image.snapshot();
    let ro_state = {
        let ro = open_ro(image.clone(), trusted)
            .unwrap_or_else(|e| panic!("{what}: read-only open failed: {e}"));
        read_state(&ro).unwrap_or_else(|e| panic!("{what}: read-only read failed: {e}"))
    };
    assert!(
        image.snapshot() == before,
        "{what}: a read-only open modified the store"
    );
    for (label, store, anchor) in [
        ("first recovery", image.clone(), at_crash),
        (
            "after a crash during recovery",
            Arc::new(second),
            after_second,
        ),
    ] {
        trusted.restore(anchor);
        let vol = open(store.clone() as Arc<dyn UntrustedStore>, trusted)
            .unwrap_or_else(|e| panic!("{what} ({label}): reopen failed: {e}"));
        let state =
            read_state(&vol).unwrap_or_else(|e| panic!("{what} ({label}): read failed: {e}"));
        let ok = explained(&state, &points[done.saturating_sub(1)..], partial);
        assert!(
            ok,
            "{what} ({label}): state after recovery matches no operation after sync point {done}:\n{:?}",
            state.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
        );
        if label == "first recovery" {
            assert_eq!(
                state, ro_state,
                "{what}: read-only and read-write recovery disagree"
            );
        }
        // Objects of the lost transaction are orphans: removing them changes nothing.
        vol.remove_orphans()
            .unwrap_or_else(|e| panic!("{what} ({label}): remove_orphans: {e}"));
        assert!(vol.orphans().unwrap().is_empty());
        assert_eq!(
            read_state(&vol).unwrap(),
            state,
            "{what} ({label}): orphan removal changed the state"
        );
        assert!(
            vol.fsck(&mut |_| {}).unwrap().is_empty(),
            "{what} ({label}): fsck after orphan removal"
        );
        drop(vol);
    }
}

fn crash_everywhere(scheme: SchemeId, bs: usize) {
    crash_everywhere_with(scheme, bs, pattern)
}

fn crash_everywhere_with(scheme: SchemeId, bs: usize, content: fn(u8, usize) -> Vec<u8>) {
    // Count the writes of a clean run.
    let total = {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme, bs as u32);
        store.reset_counters();
        let (mut points, mut done) = (vec![], 0);
        workload_with(&vol, bs, &mut points, &mut done, content, &mut || {}).unwrap();
        drop(vol);
        store.writes()
    };
    assert!(total > 20, "workload too small: {total} writes");
    for n in 0..=total {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme, bs as u32);
        store.reset_counters();
        store.set_plan(FaultPlan {
            crash_after_writes: Some(n),
            ..Default::default()
        });
        // The sync point 0 is the freshly created, empty volume.
        let mut points = vec![BTreeMap::new()];
        let mut done = 1;
        let r = workload_with(&vol, bs, &mut points, &mut done, content, &mut || {});
        if n < total {
            let e = r.expect_err("the crash must surface as an error");
            assert!(!e.is_tampered(), "crash surfaced as a tamper error: {e}");
        }
        drop(vol);
        // Each image is checked against the trusted state as the crash left it (a recovery
        // seals a new anchor, which belongs to that image only).
        let at_crash = trusted.snapshot();
        for mode in [
            CrashImage::DurableOnly,
            CrashImage::Random(n),
            CrashImage::All,
        ] {
            trusted.restore(at_crash.clone());
            let image = store.crash_image(mode);
            check_recovered(
                image,
                &trusted,
                &points,
                done,
                &format!("{scheme:?} bs {bs} crash after write {n}/{total} {mode:?}"),
                matches!(mode, CrashImage::Random(_)),
            );
        }
    }
}

#[test]
fn crash_at_every_write_mt_eint_gcm() {
    crash_everywhere(SchemeId::MtEintGcm, 128);
}

#[test]
fn crash_at_every_write_mt_eint_cbc() {
    crash_everywhere(SchemeId::MtEintCbc, 256);
}

#[test]
fn crash_at_every_write_aead() {
    crash_everywhere(SchemeId::Aead, 4096);
}

#[test]
fn crash_at_every_write_mac_tree() {
    crash_everywhere(SchemeId::MacTree, 128);
}

#[test]
fn crash_at_every_write_none() {
    crash_everywhere(SchemeId::None, 4096);
}

#[test]
fn crash_at_every_write_rand_eint() {
    crash_everywhere_with(SchemeId::RandEint, 128, flip);
}

#[test]
fn crash_at_every_write_comp_eint() {
    crash_everywhere_with(SchemeId::CompEint, 256, flip);
}

#[test]
fn crash_at_every_write_comp_eint_zstd() {
    crash_everywhere_with(SchemeId::CompEintZstd, 4096, flip);
}

/// An I/O error in the middle of a commit is reported; the volume goes back to its last
/// seal (or the state the commit sealed, if the error came after the seal) and goes on
/// (tests/failed_commit.rs fails every call of a workload), and a reopen agrees.
#[test]
fn eio_during_commit_is_reported_and_recoverable() {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    vol.create_file("/x", None).unwrap();
    vol.write_path("/x", 0, &pattern(1, 50_000)).unwrap();
    vol.sync().unwrap();
    vol.write_path("/x", 100, b"changed").unwrap();
    store.reset_counters();
    store.set_plan(FaultPlan {
        fail_eio_on: Some(1),
        ..Default::default()
    });
    let e = vol.sync().unwrap_err();
    assert!(!e.is_tampered(), "{e}");
    let old = pattern(1, 50_000);
    let mut new = old.clone();
    new[100..107].copy_from_slice(b"changed");
    let data = read_all(&vol, "/x").unwrap();
    assert!(data == old || data == new);
    vol.write_path("/x", 0, b"more").unwrap();
    vol.sync().unwrap();
    let mut want = data;
    want[..4].copy_from_slice(b"more");
    assert_eq!(read_all(&vol, "/x").unwrap(), want);
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/x").unwrap(), want);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A crash while a volume is being created never looks like tampering: the reopen either
/// finishes the creation (empty root) or finds no volume (the config never became durable).
#[test]
fn crash_during_create_never_looks_like_tampering() {
    let make = |store: Arc<FaultStore<MemStore>>, trusted: &MemTrusted| {
        let t = trusted.clone();
        Volume::create(
            store,
            move |_| Ok(Box::new(t) as Box<dyn intact_core::store::TrustedStore>),
            PW,
            &intact_core::CreateOptions {
                block_size: 4096,
                scheme: SchemeId::MtEintGcm,
                auto: false,
                kdf: intact_core::crypto::KdfParams::TEST,
                inline_leaf: true,
                dir_tree: true,
                inline_mac: true,
                inline_tree: true,
                inline_data: true,
                ctr_segments: true,
                twin_blocks: true,
                leaf_log: true,
                log_delta: true,
            },
            &intact_core::Options {
                records: records(),
                ..Default::default()
            },
        )
    };
    let total = {
        let store = Arc::new(FaultStore::new_mem());
        drop(make(store.clone(), &MemTrusted::new()).unwrap());
        store.writes()
    };
    assert!(total > 3, "creation wrote only {total} times");
    for n in 0..total {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = MemTrusted::new();
        store.set_plan(FaultPlan {
            crash_after_writes: Some(n),
            ..Default::default()
        });
        let r = make(store.clone(), &trusted);
        if let Err(e) = &r {
            assert!(!e.is_tampered(), "crash after {n}: {e}");
        }
        drop(r);
        // Each image is checked against the trusted state as the crash left it.
        let at_crash = trusted.snapshot();
        for mode in [CrashImage::DurableOnly, CrashImage::All] {
            trusted.restore(at_crash.clone());
            let image: Arc<dyn UntrustedStore> = Arc::new(store.crash_image(mode));
            match open(image, &trusted) {
                Ok(v) => assert!(v.readdir("/").unwrap().is_empty()),
                Err(intact_core::Error::Config(_)) => {}
                Err(e) => panic!("crash after {n}/{total} {mode:?}: reopen failed: {e}"),
            }
        }
    }
}

/// The checkpoint journals' bytes: a checkpoint writes one of them.
fn journals(s: &FaultStore<MemStore>) -> [Option<Vec<u8>>; 2] {
    ["journal.0", "journal.1"].map(|j| s.inner().read_all(j).unwrap())
}

/// The periodic seal seals the log when no checkpoint is due, like a journaling file
/// system's periodic commit: no checkpoint runs (no journal written), and no file's data
/// is synced. A power cut right after it (only what was synced survives) keeps the names
/// and the staged overwrites, and files whose appends did not reach the disk come back at
/// an earlier content of theirs, with no alarm; with every write on the disk, everything
/// is there; and a rollback of the log (an older copy of the store) is detected.
#[test]
fn a_periodic_seal_seals_the_log_without_a_checkpoint() {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    vol.create_file("/a", None).unwrap();
    vol.write_path("/a", 0, &pattern(1, 50_000)).unwrap();
    vol.sync().unwrap();
    let old = store.crash_image(CrashImage::DurableOnly);
    // Appends, an overwrite and a new file, then the periodic seal.
    vol.write_path("/a", 100, &pattern(3, 5_000)).unwrap();
    vol.write_path("/a", 50_000, &pattern(2, 20_000)).unwrap();
    vol.create_file("/b", None).unwrap();
    vol.write_path("/b", 0, &pattern(4, 9_000)).unwrap();
    let before = journals(&store);
    vol.seal_periodic().unwrap();
    assert_eq!(journals(&store), before, "no checkpoint ran");
    let mut a = pattern(1, 50_000);
    a[100..5_100].copy_from_slice(&pattern(3, 5_000));
    let overwritten = a.clone();
    a.extend_from_slice(&pattern(2, 20_000));
    let durable = Arc::new(store.crash_image(CrashImage::DurableOnly));
    let all = Arc::new(store.crash_image(CrashImage::All));
    vol.set_seal_on_drop(false);
    drop(vol);
    let at_crash = trusted.snapshot();
    for (image, full) in [(durable, false), (all, true)] {
        trusted.restore(at_crash.clone());
        let v = open(image, &trusted).unwrap();
        let (got_a, got_b) = (read_all(&v, "/a").unwrap(), read_all(&v, "/b").unwrap());
        if full {
            assert_eq!(got_a, a);
            assert_eq!(got_b, pattern(4, 9_000));
        } else {
            // The overwrite went straight to the twin slot and the appends to `.d`, none
            // synced: each is kept if it reached the disk, and a file goes back to before
            // its first write that did not (the log is sealed, the data is not: an fsync
            // would have synced it).
            assert!(
                got_a == a || got_a == overwritten || got_a == pattern(1, 50_000),
                "{} bytes",
                got_a.len()
            );
            assert!(got_b == pattern(4, 9_000) || got_b.is_empty());
        }
        assert!(v.fsck(&mut |_| {}).unwrap().is_empty());
    }
    // The store as it was before the writes, under the anchor that sealed them: caught.
    trusted.restore(at_crash);
    let e = open(Arc::new(old), &trusted)
        .and_then(|v| read_all(&v, "/a"))
        .unwrap_err();
    assert!(e.is_tampered(), "{e}");
}

/// A sync of the log (an fsync of a directory, `intact sync`) keeps what a checkpoint
/// keeps without running one: no journal is written, and a power cut right after it (only
/// what was synced survives) loses nothing: appends, an overwrite, a new file, a rename
/// and an unlink are all there, with no alarm. A rollback of the log is detected.
#[test]
fn a_sync_of_the_log_keeps_everything_without_a_checkpoint() {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    vol.create_file("/a", None).unwrap();
    vol.write_path("/a", 0, &pattern(1, 50_000)).unwrap();
    vol.create_file("/gone", None).unwrap();
    vol.sync().unwrap();
    let old = store.crash_image(CrashImage::DurableOnly);
    vol.write_path("/a", 100, &pattern(3, 5_000)).unwrap();
    vol.write_path("/a", 50_000, &pattern(2, 20_000)).unwrap();
    vol.create_file("/b", None).unwrap();
    vol.write_path("/b", 0, &pattern(4, 9_000)).unwrap();
    vol.create_file("/c", None).unwrap();
    vol.write_path("/c", 0, &pattern(5, 3_000)).unwrap();
    vol.rename("/c", "/d").unwrap();
    vol.unlink("/gone").unwrap();
    let before = journals(&store);
    vol.sync_log().unwrap();
    assert_eq!(journals(&store), before, "no checkpoint ran");
    let mut a = pattern(1, 50_000);
    a[100..5_100].copy_from_slice(&pattern(3, 5_000));
    a.extend_from_slice(&pattern(2, 20_000));
    let durable = Arc::new(store.crash_image(CrashImage::DurableOnly));
    vol.set_seal_on_drop(false);
    drop(vol);
    let at_crash = trusted.snapshot();
    let v = open(durable, &trusted).unwrap();
    assert_eq!(read_all(&v, "/a").unwrap(), a);
    assert_eq!(read_all(&v, "/b").unwrap(), pattern(4, 9_000));
    assert_eq!(read_all(&v, "/d").unwrap(), pattern(5, 3_000));
    let mut names: Vec<String> = v
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b", "d"]);
    assert!(v.fsck(&mut |_| {}).unwrap().is_empty());
    drop(v);
    trusted.restore(at_crash);
    let e = open(Arc::new(old), &trusted)
        .and_then(|v| read_all(&v, "/a"))
        .unwrap_err();
    assert!(e.is_tampered(), "{e}");
}

/// A periodic seal runs a checkpoint once the last one is older than its age limit (what
/// unlinks freed goes back to the store only at a checkpoint), even with the log far from
/// its limits; and a sync of the log on a volume that logs no request (the CLI's
/// all-or-nothing commands) is a checkpoint, since the log would keep nothing: a power cut
/// right after it loses nothing.
#[test]
fn a_seal_checkpoints_when_the_log_cannot_carry_it() {
    let store = Arc::new(FaultStore::new_mem());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    vol.create_file("/a", None).unwrap();
    vol.write_path("/a", 0, &pattern(1, 10_000)).unwrap();
    vol.sync().unwrap();
    vol.write_path("/a", 0, &pattern(2, 3_000)).unwrap();
    let before = journals(&store);
    vol.seal_periodic().unwrap();
    assert_eq!(
        journals(&store),
        before,
        "a young checkpoint: the log is sealed"
    );
    vol.write_path("/a", 4_000, &pattern(3, 3_000)).unwrap();
    vol.age_last_checkpoint(std::time::Duration::from_secs(31));
    vol.seal_periodic().unwrap();
    let after_age = journals(&store);
    assert_ne!(after_age, before, "an old checkpoint: a checkpoint ran");
    // Just checkpointed: young again.
    vol.write_path("/a", 8_000, &pattern(4, 100)).unwrap();
    vol.seal_periodic().unwrap();
    assert_eq!(journals(&store), after_age);

    // No log: the sync of the log is a checkpoint.
    vol.set_all_or_nothing(true);
    vol.create_file("/b", None).unwrap();
    vol.write_path("/b", 0, &pattern(5, 7_000)).unwrap();
    vol.sync_log().unwrap();
    assert_ne!(journals(&store), after_age, "a checkpoint ran");
    let durable = Arc::new(store.crash_image(CrashImage::DurableOnly));
    vol.set_seal_on_drop(false);
    drop(vol);
    let v = open(durable, &trusted).unwrap();
    let mut a = pattern(1, 10_000);
    a[..3_000].copy_from_slice(&pattern(2, 3_000));
    a[4_000..7_000].copy_from_slice(&pattern(3, 3_000));
    a[8_000..8_100].copy_from_slice(&pattern(4, 100));
    assert_eq!(read_all(&v, "/a").unwrap(), a);
    assert_eq!(read_all(&v, "/b").unwrap(), pattern(5, 7_000));
    assert!(v.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A directory that grows past one unit, splits, shrinks and takes renames in and out
/// (its entries in a B+-tree of units, docs/file-format.md §5.2), crashed at every write:
/// the recovered tree is that of the last sync or a later operation, with no alarm, under
/// the log's replay and the checkpoint alike; and the volume stays writable.
fn big_directory(
    vol: &Volume,
    points: &mut Vec<Model>,
    done: &mut usize,
) -> intact_core::Result<()> {
    let mut m: Model = BTreeMap::new();
    let name = |i: usize| format!("/big/{}{i}", "n".repeat(150));
    let sync = |m: &Model, points: &mut Vec<Model>, done: &mut usize| {
        points.push(m.clone());
        vol.sync()?;
        *done = points.len();
        Ok::<_, intact_core::Error>(())
    };
    vol.mkdir("/big")?;
    m.insert("/big/".into(), vec![]);
    points.push(m.clone());
    // 40 names of about 170 bytes: two splits of the root's leaf.
    for i in 0..40 {
        vol.create_file(&name(i), None)?;
        m.insert(name(i), vec![]);
        points.push(m.clone());
        if i == 25 {
            sync(&m, points, done)?;
        }
    }
    sync(&m, points, done)?;
    for i in (0..40).step_by(3) {
        vol.unlink(&name(i))?;
        m.remove(&name(i));
        points.push(m.clone());
    }
    for i in 40..50 {
        vol.create_file(&name(i), None)?;
        m.insert(name(i), vec![]);
        points.push(m.clone());
        vol.write_path(&name(i), 0, b"x")?;
        m.insert(name(i), b"x".to_vec());
        points.push(m.clone());
    }
    vol.rename(&name(1), "/out")?;
    let f = m.remove(&name(1)).unwrap();
    m.insert("/out".into(), f);
    points.push(m.clone());
    sync(&m, points, done)?;
    for i in 0..50 {
        if m.contains_key(&name(i)) {
            vol.unlink(&name(i))?;
            m.remove(&name(i));
            points.push(m.clone());
        }
    }
    vol.rmdir("/big")?;
    m.remove("/big/");
    points.push(m.clone());
    sync(&m, points, done)?;
    Ok(())
}

#[test]
fn crash_at_every_write_in_a_directory_that_splits() {
    let total = {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
        store.reset_counters();
        big_directory(&vol, &mut vec![], &mut 0).unwrap();
        drop(vol);
        store.writes()
    };
    assert!(total > 20, "workload too small: {total} writes");
    let mut completed = 0;
    for n in 0..=total {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
        store.reset_counters();
        store.set_plan(FaultPlan {
            crash_after_writes: Some(n),
            ..Default::default()
        });
        let mut points = vec![BTreeMap::new()];
        let mut done = 1;
        // Each volume has a key of its own, and the names' order (so where leaves split,
        // and how many units a seal writes) follows it: a run may need fewer writes than
        // the one counted, and then completes before write `n`.
        if let Err(e) = big_directory(&vol, &mut points, &mut done) {
            assert!(!e.is_tampered(), "crash surfaced as a tamper error: {e}");
        } else {
            completed += 1;
        }
        drop(vol);
        let at_crash = trusted.snapshot();
        for mode in [
            CrashImage::DurableOnly,
            CrashImage::Random(n),
            CrashImage::All,
        ] {
            trusted.restore(at_crash.clone());
            let image = store.crash_image(mode);
            check_recovered(
                image,
                &trusted,
                &points,
                done,
                &format!("big directory, crash after write {n}/{total} {mode:?}"),
                matches!(mode, CrashImage::Random(_)),
            );
        }
    }
    assert!(
        completed <= total / 4,
        "{completed} of {total} runs ended before their crash point"
    );
}
