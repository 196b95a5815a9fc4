//! One large directory (issue 18): with the `dir-tree` format a create, a lookup and an
//! unlink in a directory of many entries cost what they cost in a small one (bytes written
//! to the store per create and seal, from the counting store; not timed), where the
//! whole-list format of older volumes rewrote the directory at every seal. The entries
//! survive a reopen, a listing in pages under churn returns every name that stays, and a
//! damaged unit of the directory is an alarm naming it.

mod common;

use common::*;
use intact_core::crypto::KdfParams;
use intact_core::store::{CountingStore, MemStore, MemTrusted, UntrustedStore};
use intact_core::{CreateOptions, Volume};
use std::collections::BTreeSet;
use std::sync::Arc;

fn new_volume(store: Arc<dyn UntrustedStore>, trusted: &MemTrusted, dir_tree: bool) -> Volume {
    let copts = CreateOptions {
        kdf: KdfParams::TEST,
        dir_tree,
        ..CreateOptions::default()
    };
    create_with(store, trusted, &copts)
}

fn name(i: usize) -> String {
    format!("/big/entry-{i:08}")
}

/// Bytes written to the store per operation `op` followed by a seal, over `k` operations
/// in a directory that already holds `n` entries.
fn per_op(dir_tree: bool, n: usize, k: usize, op: &str) -> u64 {
    let store = Arc::new(CountingStore::new(MemStore::new()));
    let trusted = MemTrusted::new();
    let vol = new_volume(store.clone(), &trusted, dir_tree);
    vol.mkdir("/big").unwrap();
    for i in 0..n {
        vol.create_file(&name(i), None).unwrap();
    }
    vol.sync().unwrap();
    let before = store.stats().total();
    for j in 0..k {
        match op {
            "create" => {
                vol.create_file(&name(n + j), None).unwrap();
            }
            "unlink" => vol.unlink(&name(j * 7)).unwrap(),
            _ => unreachable!(),
        }
        vol.sync().unwrap();
    }
    store.stats().total().since(&before).write_bytes / k as u64
}

#[test]
fn a_create_or_unlink_in_a_large_directory_writes_what_it_writes_in_a_small_one() {
    const SMALL: usize = 1_000;
    const LARGE: usize = 30_000;
    for op in ["create", "unlink"] {
        let small = per_op(true, SMALL, 20, op);
        let large = per_op(true, LARGE, 20, op);
        let old = per_op(false, LARGE, 5, op);
        eprintln!("{op} + seal: {small} B at {SMALL}, {large} B at {LARGE}, whole list {old} B");
        assert!(
            large * 2 <= small * 3,
            "{op}: {large} B written per op at {LARGE} entries, {small} B at {SMALL}"
        );
        // The whole list of 30,000 names is 0.8 MB, written at every seal.
        assert!(old > 10 * large, "{op}: whole list {old} B, tree {large} B");
    }
}

#[test]
fn many_entries_reopen_list_under_churn_and_a_damaged_unit_is_named() {
    const N: usize = 20_000;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = new_volume(store.clone(), &trusted, true);
    vol.mkdir("/big").unwrap();
    for i in 0..N {
        vol.create_file(&name(i), None).unwrap();
    }
    vol.write_path(&name(5), 0, b"five").unwrap();
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    let big = vol.stat("/big").unwrap();
    let objects = names(&vol, "/big");
    assert_eq!(read_all(&vol, &name(5)).unwrap(), b"five");
    assert!(vol.stat(&name(N)).is_err());
    list_under_churn(&vol, big.ino, N);
    vol.sync().unwrap();
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    drop(vol);
    // A damaged byte in the directory's data: the lookups through that unit fail as
    // integrity errors naming the directory, the others still answer. (The same byte of
    // both slots of its block: one of them holds the unit, docs/file-format.md §7.4a.)
    let at = store.len(&objects.data).unwrap().unwrap() / 2;
    for name in objects.blocks() {
        if store.len(name).unwrap().is_some_and(|l| l > at) {
            store.with_object(name, |o| o[at as usize] ^= 1).unwrap();
        }
    }
    let vol = open(store, &trusted).unwrap();
    let mut failed = 0;
    for i in 0..N {
        match vol.stat(&name(i)) {
            Ok(_) => {}
            Err(e) => {
                assert!(e.is_tampered(), "{e}");
                assert!(e.to_string().contains("/big"), "{e}");
                failed += 1;
            }
        }
    }
    assert!(failed > 0, "no lookup went through the damaged unit");
    assert!(
        failed < N / 10,
        "{failed} lookups failed: one unit is damaged"
    );
}

/// A listing in pages while other names come and go: every name present throughout is
/// returned once, and every returned entry is current when returned.
fn list_under_churn(vol: &Volume, dir: u64, n: usize) {
    let mut seen = BTreeSet::new();
    let mut cookie = 0;
    let mut round = 0;
    loop {
        let (parent, page) = vol.readdir_page(dir, cookie, 500).unwrap();
        assert_eq!(parent, intact_core::format::ROOT_INO);
        for (c, e) in &page {
            assert!(*c > cookie);
            assert!(seen.insert(e.name.clone()), "{} twice", e.name);
            let now = vol.stat(&format!("/big/{}", e.name)).unwrap();
            assert_eq!(now.ino, e.ino, "{}", e.name);
        }
        if page.len() < 500 {
            break;
        }
        cookie = page.last().unwrap().0;
        for j in 0..50 {
            let n = format!("/big/churn-{}", (round * 50 + j) % 700);
            match vol.create_file(&n, None) {
                Ok(_) => {}
                Err(_) => vol.unlink(&n).unwrap(),
            }
        }
        round += 1;
    }
    for i in 0..n {
        assert!(seen.contains(&format!("entry-{i:08}")), "entry {i} skipped");
    }
}

/// Volumes made before `dir-tree` list in pages the same way (their whole list ordered by
/// cookie once after each change).
#[test]
fn a_whole_list_directory_lists_in_pages_too() {
    const N: usize = 3_000;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = new_volume(store.clone(), &trusted, false);
    vol.mkdir("/big").unwrap();
    for i in 0..N {
        vol.create_file(&name(i), None).unwrap();
    }
    vol.sync().unwrap();
    let big = vol.stat("/big").unwrap();
    list_under_churn(&vol, big.ino, N);
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    // After a reopen: `readdir` (the CLI's `ls`) sorted by name, every entry there.
    let all = vol.readdir("/big").unwrap();
    assert!(all.windows(2).all(|w| w[0].name < w[1].name));
    assert_eq!(
        all.iter().filter(|e| e.name.starts_with("entry-")).count(),
        N
    );
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A run of creates with no write and no sync (what `touch` of many names sends) adds no
/// dirty bytes: the engine checkpoints on its own once 8,192 records past its budget
/// cannot be dropped, so the records in memory stay bounded (before, every new record
/// stayed until the next data write or unmount: 5.7 GB at 10^6 names).
#[test]
fn a_run_of_creates_checkpoints_by_itself_and_memory_stays_bounded() {
    const N: usize = 40_000;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = new_volume(store.clone(), &trusted, true);
    vol.mkdir("/big").unwrap();
    let bound = records() + 3 * 8192 + 64;
    let mut most = 0;
    for i in 0..N {
        vol.create_file(&name(i), None).unwrap();
        most = most.max(vol.resident_records());
        assert!(
            vol.resident_records() <= bound,
            "{} records resident after {} creates",
            vol.resident_records(),
            i + 1
        );
    }
    assert!(
        most + 1 >= records() + 8192,
        "the limit was reached ({most})"
    );
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(vol.readdir("/big").unwrap().len(), N);
}

/// The metadata cache (`Options::meta_cache_bytes`): the lookups the kernel sends after a
/// listing meet the directory units the listing read and the inode-table pieces of files
/// created together, so they read far less of the store; the cache stays within its
/// budget, and a budget of 0 keeps nothing.
#[test]
fn lookups_after_a_listing_are_served_from_the_metadata_cache() {
    const N: usize = 3_000;
    let store = Arc::new(CountingStore::new(MemStore::new()));
    let trusted = MemTrusted::new();
    let vol = new_volume(store.clone(), &trusted, true);
    vol.mkdir("/big").unwrap();
    for i in 0..N {
        vol.create_file(&name(i), None).unwrap();
    }
    vol.sync().unwrap();
    drop(vol);
    let run = |cap: usize| {
        let opts = intact_core::Options {
            cache_bytes: 1024,
            records: records(),
            meta_cache_bytes: cap,
            ..intact_core::Options::default()
        };
        let vol = Volume::open(store.clone(), Box::new(trusted.clone()), PW, &opts).unwrap();
        let listed = vol.readdir("/big").unwrap();
        assert_eq!(listed.len(), N);
        let before = store.stats().total();
        for e in &listed {
            assert_eq!(vol.stat(&format!("/big/{}", e.name)).unwrap().size, 0);
        }
        let read = store.stats().total().since(&before).read_bytes;
        let c = vol.meta_cache();
        assert!(c.bytes <= cap, "{c:?} over {cap}");
        (read, c)
    };
    let (without, c0) = run(0);
    assert_eq!((c0.bytes, c0.hits), (0, 0));
    let (with, c) = run(64 << 10);
    eprintln!("lookups read {with} bytes of the store with the cache ({c:?}), {without} without");
    // Every lookup meets the root and its leaf in the cache.
    assert!(c.hits >= 2 * N as u64, "{c:?}");
    assert!(
        with * 4 < without,
        "store bytes read by the lookups: {with} with the cache, {without} without"
    );
}

/// What a create, an unlink or a change of a record writes stays in the metadata cache as
/// written (directory units whole, the record in its table piece, a small directory's
/// single unit cut or grown to its new length): the lookups after them read nothing back,
/// and they answer what a volume opened afresh, with no cache, reads from the store.
#[test]
fn what_operations_write_stays_in_the_metadata_cache_as_written() {
    const N: usize = 2_000;
    let store = Arc::new(CountingStore::new(MemStore::new()));
    let trusted = MemTrusted::new();
    drop(new_volume(store.clone(), &trusted, true));
    let open = |meta: usize| {
        let opts = intact_core::Options {
            cache_bytes: 1 << 20,
            // Few records resident: the stats below read records from the table.
            records: 16,
            meta_cache_bytes: meta,
            ..intact_core::Options::default()
        };
        Volume::open(store.clone(), Box::new(trusted.clone()), PW, &opts).unwrap()
    };
    let vol = open(32 << 20);
    vol.mkdir("/big").unwrap();
    vol.mkdir("/small").unwrap();
    let mut inos = Vec::new();
    for i in 0..N {
        inos.push(vol.create_file(&name(i), None).unwrap());
    }
    for n in ["a", "bb", "ccc"] {
        vol.create_file(&format!("/small/{n}"), None).unwrap();
    }
    vol.sync().unwrap();
    // Everything read once, so that the cache holds every unit and table piece.
    for i in 0..N {
        vol.stat(&name(i)).unwrap();
    }
    for n in ["a", "bb", "ccc"] {
        vol.stat(&format!("/small/{n}")).unwrap();
    }
    // Changes of records, of big units and of the small directory's one unit (shorter,
    // then longer).
    for (i, &ino) in inos.iter().enumerate() {
        let set = intact_core::volume::SetAttr {
            mode: Some(0o600 | (i % 8) as u32),
            ..Default::default()
        };
        vol.setattr(ino, &set).unwrap();
    }
    for i in (0..N).step_by(3) {
        vol.unlink(&name(i)).unwrap();
    }
    for i in N..N + 100 {
        vol.create_file(&name(i), None).unwrap();
    }
    vol.unlink("/small/bb").unwrap();
    vol.create_file("/small/a-much-longer-name-than-before", None)
        .unwrap();
    vol.sync().unwrap();
    let answers = |vol: &Volume| -> Vec<Option<(u64, u32)>> {
        let small = ["a", "bb", "ccc", "a-much-longer-name-than-before"];
        (0..N + 100)
            .map(name)
            .chain(small.iter().map(|n| format!("/small/{n}")))
            .map(|p| vol.stat(&p).ok().map(|s| (s.ino, s.mode)))
            .collect()
    };
    let misses = vol.meta_cache().misses;
    let cached = answers(&vol);
    assert_eq!(
        vol.meta_cache().misses,
        misses,
        "lookups after the changes read units back"
    );
    drop(vol);
    let fresh = answers(&open(0));
    assert_eq!(cached, fresh);
    // And the answers are the changes made.
    for i in 0..N {
        let want = (i % 3 != 0).then(|| (inos[i], 0o600 | (i % 8) as u32));
        assert_eq!(
            fresh[i].map(|(ino, m)| (ino, m & 0o7777)),
            want,
            "{}",
            name(i)
        );
    }
    assert!(fresh[N..N + 100].iter().all(Option::is_some));
    let small: Vec<bool> = fresh[N + 100..].iter().map(Option::is_some).collect();
    assert_eq!(small, [true, false, true, true]);
}

/// A stat or a lookup of a file whose record is not resident answers from the record
/// itself, with no open-file state built (issue 18: a lookup among 10^6 names loaded and
/// then evicted one for every name): what it answers is what the open file answered, for
/// every scheme, kind and shape of counters (inline data, a tree kept in the record, one
/// in objects, holes, a partial tree, spilled counters), and the records stay out of
/// memory. (The attack suites run with a budget of one record, so every stat there goes
/// this way too, and a tampered or rolled-back record is caught.)
#[test]
fn a_stat_or_lookup_answers_from_the_record_without_opening_it() {
    use intact_core::format::{Kind, SchemeId};
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = new_volume(store.clone(), &trusted, true);
    vol.mkdir("/f").unwrap();
    vol.mkdir("/f/sub").unwrap();
    vol.mkdir("/f/sub/inner").unwrap();
    let bs = vol.block_size() as u64;
    let block = |seed: u8| noise(seed, bs as usize);
    let mut files = vec![];
    for s in SchemeId::ALL {
        let p = |what: &str| format!("/f/{}-{what}", s.name());
        vol.create_file(&p("empty"), Some(s)).unwrap();
        vol.create_file(&p("small"), Some(s)).unwrap();
        vol.write_path(&p("small"), 0, b"a hundred bytes or so")
            .unwrap();
        vol.create_file(&p("five"), Some(s)).unwrap();
        for k in 0..5u8 {
            vol.write_path(&p("five"), u64::from(k) * bs, &block(k))
                .unwrap();
        }
        vol.create_file(&p("sparse"), Some(s)).unwrap();
        vol.write_path(&p("sparse"), 10 * bs + 7, b"x").unwrap();
        // Blocks written under many counters: the intervals spill out of the record;
        // half of them zeros (a partial tree under RAND-EINT and COMP-EINT).
        vol.create_file(&p("many"), Some(s)).unwrap();
        for k in 0..48u8 {
            let b = if k % 2 == 0 {
                block(k)
            } else {
                vec![0; bs as usize]
            };
            vol.write_path(&p("many"), u64::from(k) * bs, &b).unwrap();
        }
        for k in (0..48u8).step_by(2) {
            vol.write_path(&p("many"), u64::from(k) * bs + 1, b"y")
                .unwrap();
            vol.sync().unwrap();
        }
        files.extend(["empty", "small", "five", "sparse", "many"].map(p));
    }
    vol.symlink("/f/five", "/f/link").unwrap();
    let dir = vol.stat("/f").unwrap().ino;
    vol.mknod_at(dir, "fifo", Kind::Fifo, 0o640, 0, 1, 2)
        .unwrap();
    vol.mknod_at(dir, "dev", Kind::CharDev, 0o600, 0x0501, 0, 0)
        .unwrap();
    files.extend(["/f/link", "/f/fifo", "/f/dev", "/f/sub", "/f/sub/inner"].map(String::from));
    vol.sync().unwrap();
    let sub = vol.stat("/f/sub").unwrap().ino;
    let answers = |vol: &Volume| -> Vec<String> {
        files
            .iter()
            .map(|p| {
                let (parent, name) = p.rsplit_once('/').unwrap();
                let pino = if parent == "/f" { dir } else { sub };
                format!(
                    "{:?} {:?}",
                    vol.stat(p).unwrap(),
                    vol.lookup(pino, name).unwrap()
                )
            })
            .collect()
    };
    // Every record resident, opened by the writes: the answers of the open files.
    let open = answers(&vol);
    drop(vol);
    // A budget that drops nothing: what the answers open stays resident.
    let opts = intact_core::Options::default();
    let vol = Volume::open(store.clone(), Box::new(trusted.clone()), PW, &opts).unwrap();
    let resident = vol.resident_records();
    let from_records = answers(&vol);
    for (a, b) in open.iter().zip(&from_records) {
        assert_eq!(a, b);
    }
    // And the figures themselves, from a record: five whole blocks stored are five blocks'
    // bytes, a file with one byte at block 10 stores that block alone (a freshness scheme
    // keeps the holes before it unstored).
    let five = vol.lookup(dir, "mt-eint-five").unwrap();
    assert_eq!(five.stored_bytes, 5 * bs, "{five:?}");
    let sparse = vol.lookup(dir, "mt-eint-sparse").unwrap();
    assert_eq!(sparse.stored_bytes, bs, "{sparse:?}");
    // Only the four directories on the paths (the root, /f, /f/sub and /f/sub/inner), and
    // the files whose counters spilled (a lookup counts their holes in the arrays), were
    // opened.
    let spilled = open
        .iter()
        .filter(|a| a.contains("counters_spilled: true"))
        .count();
    assert!(spilled >= 4, "{spilled} files with spilled counters");
    assert!(
        vol.resident_records() <= resident + 4 + spilled,
        "{} records resident, {resident} before, {spilled} with spilled counters",
        vol.resident_records()
    );
}

/// A record's table block that the metadata cache holds is written whole from it: an
/// unlink (or a chmod) of a file whose name and record a lookup just read reads nothing
/// from the store (at 10^6 names the write read and checked the block a second time),
/// and the volume reopened reads back what was written.
#[test]
fn a_record_in_the_metadata_cache_is_written_without_reading_its_block() {
    const N: usize = 600;
    let store = Arc::new(CountingStore::new(MemStore::new()));
    let trusted = MemTrusted::new();
    let vol = new_volume(store.clone(), &trusted, true);
    vol.mkdir("/big").unwrap();
    for i in 0..N {
        vol.create_file(&name(i), None).unwrap();
    }
    vol.sync().unwrap();
    drop(vol);
    let opts = intact_core::Options {
        cache_bytes: 1 << 20,
        meta_cache_bytes: 1 << 20,
        ..intact_core::Options::default()
    };
    let vol = Volume::open(store.clone(), Box::new(trusted.clone()), PW, &opts).unwrap();
    let dir = vol.stat("/big").unwrap().ino;
    // Not the table's last piece, shorter than a block: its block is read to be written.
    for i in (0..N - 32).step_by(37) {
        let leaf = &name(i)["/big/".len()..];
        let ino = vol.lookup(dir, leaf).unwrap().ino;
        let before = store.stats().total();
        if i % 2 == 0 {
            vol.unlink_at(dir, leaf).unwrap();
        } else {
            let set = intact_core::volume::SetAttr {
                mode: Some(0o600),
                ..Default::default()
            };
            vol.setattr(ino, &set).unwrap();
        }
        let read = store.stats().total().since(&before).reads;
        assert_eq!(read, 0, "entry {i}: {read} reads of the store");
    }
    vol.sync().unwrap();
    drop(vol);
    let vol = Volume::open(store.clone(), Box::new(trusted.clone()), PW, &opts).unwrap();
    for i in 0..N {
        let st = vol.stat(&name(i));
        match (i % 37 == 0 && i < N - 32, i % 2) {
            (true, 0) => assert!(st.is_err(), "{i} was unlinked"),
            (true, _) => assert_eq!(st.unwrap().mode & 0o777, 0o600, "{i}"),
            _ => assert_eq!(st.unwrap().mode & 0o777, 0o644, "{i}"),
        }
    }
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}
