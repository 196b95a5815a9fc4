//! A million files (issue 18): the engine's memory is bounded by its budget of resident
//! inode records, not by the number of files a request touches, and a record dropped from
//! memory is read back authenticated and fresh.

mod common;

use common::*;
use intact_core::format::SchemeId;
use intact_core::store::{MemStore, MemTrusted, UntrustedStore};
use std::sync::Arc;

/// Resident records allowed: the engine's 1,024 idle records, plus what it keeps whatever
/// their number (here the directories), plus the request under way.
const BUDGET: usize = 1024 + DIRS + 2;
const DIRS: usize = 100;
/// Names the engine keeps past the end of a request (`KEEP_NAMES`).
const NAMES_KEPT: usize = 65_536;

fn files() -> usize {
    std::env::var("INTACT_SCALE_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

fn path(k: usize) -> String {
    format!("/d{}/f{}", k % DIRS, k / DIRS)
}

fn content(k: usize, version: u8) -> Vec<u8> {
    let mut v = format!("file {k} version {version} ").into_bytes();
    // Files 0 and 1, which the end of the test rolls back and damages in the store, are
    // past the bytes a file keeps in the inode table's slots: in blocks, in objects of
    // their own. The others are in slots (docs/design.md, "Small files in the inode table").
    v.resize(if k < 2 { 5000 } else { 1000 + k % 100 }, version);
    v
}

/// Touches every file of a volume (stat, read, one write in a hundred) and checks after
/// each request that the resident records stay within the budget; then puts back an older
/// copy of a file touched at the start (long evicted), and flips a byte of another: both are
/// caught when they are read again.
#[test]
fn resident_records_stay_within_the_budget_and_evicted_records_reload_fresh() {
    let n = files();
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    for d in 0..DIRS {
        vol.mkdir(&format!("/d{d}")).unwrap();
    }
    for k in 0..n {
        vol.create_file(&path(k), None).unwrap();
        vol.write_path(&path(k), 0, &content(k, 1)).unwrap();
        if k % 1000 == 999 {
            vol.sync().unwrap();
        }
    }
    vol.sync().unwrap();
    // An older copy of file 0, then a newer version of it.
    let f0 = names(&vol, &path(0));
    let old: Vec<(String, Vec<u8>)> = [&f0.data, &f0.meta]
        .into_iter()
        .map(|o| (o.clone(), store.read_all(o).unwrap().unwrap_or_default()))
        .collect();
    vol.write_path(&path(0), 0, &content(0, 2)).unwrap();
    vol.sync().unwrap();
    drop(vol);

    let vol = open(store.clone(), &trusted).unwrap();
    let mut most = 0;
    for k in 0..n {
        let p = path(k);
        let st = vol.stat(&p).unwrap();
        let want = content(k, if k == 0 { 2 } else { 1 });
        assert_eq!(st.size, want.len() as u64, "{p}");
        if k % 100 == 50 {
            vol.write_path(&p, 0, &want[..10]).unwrap();
        }
        if k % 1000 == 999 {
            // As the mount's periodic seal does (a file with changes not yet sealed stays
            // resident: an fsync looks its record up).
            vol.sync().unwrap();
        }
        assert_eq!(read_all(&vol, &p).unwrap(), want, "{p}");
        most = most.max(vol.resident_records());
        assert!(
            vol.resident_records() <= BUDGET,
            "{} records resident after touching {} files",
            vol.resident_records(),
            k + 1
        );
        // What the transaction knows of objects it only read is forgotten too.
        assert!(
            vol.objects_known() <= 8192,
            "{} objects known after touching {} files",
            vol.objects_known(),
            k + 1
        );
        // The per-file counters go with the records (the inode table and the request's
        // files beside them).
        assert!(
            vol.files_measured() <= BUDGET + 1,
            "counters of {} files kept after touching {} files",
            vol.files_measured(),
            k + 1
        );
    }
    assert!(most > 1000, "the budget was reached ({most})");
    // Lookups by inode (what the mount sends for a `find`), with no seal meanwhile: the
    // names kept for messages stay bounded too.
    let dirs: Vec<u64> = (0..DIRS)
        .map(|d| {
            vol.lookup(intact_core::format::ROOT_INO, &format!("d{d}"))
                .unwrap()
                .ino
        })
        .collect();
    let mut most_names = 0;
    for k in 0..n {
        let a = vol
            .lookup(dirs[k % DIRS], &format!("f{}", k / DIRS))
            .unwrap();
        assert_eq!(a.size, content(k, if k == 0 { 2 } else { 1 }).len() as u64);
        most_names = most_names.max(vol.names_known());
        assert!(
            vol.names_known() <= NAMES_KEPT,
            "{} names kept after {} lookups",
            vol.names_known(),
            k + 1
        );
    }
    assert!(
        most_names >= NAMES_KEPT.min(n),
        "the names' bound was reached ({most_names})"
    );
    // File 0 was dropped from memory thousands of files ago: an older copy of it put back
    // is a rollback, and a flipped byte of file 1 is tampering.
    for (name, bytes) in &old {
        store.set_len(name, 0).unwrap();
        store.write_at(name, 0, bytes).unwrap();
    }
    let e = read_all(&vol, &path(0)).unwrap_err();
    assert!(e.is_tampered(), "rollback of an evicted file: {e}");
    let f1 = names(&vol, &path(1)).data;
    let mut bytes = store.read_all(&f1).unwrap().unwrap();
    bytes[100] ^= 1;
    store.write_at(&f1, 0, &bytes).unwrap();
    let e = read_all(&vol, &path(1)).unwrap_err();
    assert!(e.is_tampered(), "flipped byte in an evicted file: {e}");
}

/// The budget is the user's (`Options::records`, `--records`): with 16, touching 3,000
/// files keeps at most 16 idle records beside the request's own (directories are dropped
/// too: a tree directory keeps nothing in memory once clean), and every file still reads
/// back (each read after its record was dropped).
#[test]
fn the_record_budget_the_user_sets_bounds_the_resident_records() {
    const SMALL: usize = 16;
    const N: usize = 3000;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    for d in 0..DIRS {
        vol.mkdir(&format!("/d{d}")).unwrap();
    }
    for k in 0..N {
        vol.create_file(&path(k), None).unwrap();
        vol.write_path(&path(k), 0, &content(k, 1)).unwrap();
    }
    vol.sync().unwrap();
    drop(vol);
    let vol = intact_core::Volume::open(
        store.clone(),
        Box::new(trusted.clone()),
        PW,
        &intact_core::Options {
            records: SMALL,
            ..Default::default()
        },
    )
    .unwrap();
    let mut most = 0;
    for round in 0..2 {
        for k in 0..N {
            let p = path(k);
            assert_eq!(
                read_all(&vol, &p).unwrap(),
                content(k, 1),
                "{p}, round {round}"
            );
            most = most.max(vol.resident_records());
            assert!(
                vol.resident_records() <= SMALL + 2,
                "{} records resident with a budget of {SMALL}",
                vol.resident_records()
            );
            assert!(vol.files_measured() <= SMALL + 3);
            // A session that only reads never commits: what its transaction learnt of the
            // objects it read must be forgotten all the same (3 objects a file here).
            assert!(
                vol.objects_known() <= 8192,
                "{} objects known after reading {} files",
                vol.objects_known(),
                k + 1
            );
        }
    }
    assert!(most + 1 >= SMALL, "the budget was reached ({most})");
}
