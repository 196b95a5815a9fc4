//! The `auto` policy (Oprea–Reiter 2006, Table 7): per file, from the observed entropy of
//! its blocks and its read/write mix, MT-EINT / RAND-EINT / COMP-EINT, re-encrypting a file
//! when its workload changes.

mod common;

use common::*;
use intact_core::format::{auto_choice, SchemeId};
use intact_core::store::{MemStore, MemTrusted};
use intact_core::volume::{XattrMode, SCHEME_XATTR};
use std::sync::Arc;

#[test]
fn table_7() {
    // (reads, writes, random, sampled)
    assert_eq!(auto_choice(0, 100, 0, 100), Some(SchemeId::RandEint)); // low entropy, writes
    assert_eq!(auto_choice(300, 100, 10, 100), Some(SchemeId::CompEint)); // low entropy, reads
    assert_eq!(auto_choice(0, 100, 90, 100), Some(SchemeId::MtEintGcm)); // high, writes
    assert_eq!(auto_choice(500, 10, 90, 100), Some(SchemeId::MtEintGcm)); // high, reads
    assert_eq!(auto_choice(5, 5, 0, 0), None); // nothing sampled: no opinion
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    intact_core::crypto::fill_random(&mut v);
    v
}

fn auto_volume() -> (Arc<MemStore>, MemTrusted, intact_core::Volume) {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    (store, trusted, vol)
}

#[test]
fn new_files_get_the_scheme_their_contents_call_for() {
    let (store, trusted, vol) = auto_volume();
    let low = text(1, 300 * 1024);
    let high = random_bytes(300 * 1024);
    for (p, data) in [("/low", &low), ("/high", &high)] {
        let ino = vol.create_file(p, None).unwrap();
        vol.setxattr(ino, SCHEME_XATTR, b"auto", XattrMode::Set)
            .unwrap();
        vol.write_path(p, 0, data).unwrap();
    }
    let fixed = vol.create_file("/fixed", None).unwrap();
    vol.write_path("/fixed", 0, &low).unwrap();
    vol.sync().unwrap();
    assert_eq!(vol.stat("/low").unwrap().scheme, "rand-eint");
    assert_eq!(vol.stat("/high").unwrap().scheme, "mt-eint");
    assert_eq!(
        vol.stat("/fixed").unwrap().scheme,
        "mt-eint",
        "not auto: unchanged"
    );
    assert_eq!(vol.getxattr(fixed, SCHEME_XATTR).unwrap(), b"mt-eint");
    assert!(vol.stat("/low").unwrap().auto);
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(read_all(&vol, "/low").unwrap(), low);
    assert_eq!(read_all(&vol, "/high").unwrap(), high);
    assert!(vol.stat("/low").unwrap().auto, "the policy flag persists");
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// Creates `path` under the auto policy with low-entropy `data`, sealed: RAND-EINT.
fn stored_auto_file(vol: &intact_core::Volume, path: &str, data: &[u8]) {
    let ino = vol.create_file(path, None).unwrap();
    vol.set_auto(ino, true).unwrap();
    vol.write_path(path, 0, data).unwrap();
    vol.sync().unwrap();
    assert_eq!(vol.stat(path).unwrap().scheme, "rand-eint");
}

#[test]
fn a_file_read_more_than_written_moves_to_comp_eint_and_back() {
    let (store, trusted, vol) = auto_volume();
    let low = text(2, 512 * 1024);
    stored_auto_file(&vol, "/f", &low);
    drop(vol);
    // A read-mostly session: three full reads, no writes.
    let vol = open(store.clone(), &trusted).unwrap();
    for _ in 0..3 {
        assert_eq!(read_all(&vol, "/f").unwrap(), low);
    }
    vol.sync().unwrap();
    assert_eq!(vol.stat("/f").unwrap().scheme, "comp-eint");
    assert!(vol.orphans().unwrap().is_empty(), "old objects deleted");
    // The switch itself (a rewrite) is not taken for a write-heavy workload.
    let id = vol.stat("/f").unwrap().file_id;
    vol.create_file("/g", None).unwrap();
    vol.write_path("/g", 0, b"another seal").unwrap();
    vol.sync().unwrap();
    assert_eq!(vol.stat("/f").unwrap().scheme, "comp-eint");
    assert_eq!(vol.stat("/f").unwrap().file_id, id, "not rewritten again");
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(vol.stat("/f").unwrap().scheme, "comp-eint");
    assert_eq!(vol.stat("/f").unwrap().file_id, id, "nor at close");
    drop(vol);
    // Then rewritten with incompressible data: high entropy → MT-EINT.
    let vol = open(store.clone(), &trusted).unwrap();
    let high = random_bytes(512 * 1024);
    vol.write_path("/f", 0, &high).unwrap();
    vol.sync().unwrap();
    assert_eq!(vol.stat("/f").unwrap().scheme, "mt-eint");
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(read_all(&vol, "/f").unwrap(), high);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A volume whose default is `auto` (its config says so) reopens, and new files follow the
/// policy.
#[test]
fn a_volume_whose_default_is_auto() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let copts = intact_core::CreateOptions {
        block_size: 4096,
        scheme: SchemeId::MtEintGcm,
        auto: true,
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
    };
    let t = trusted.clone();
    let vol = intact_core::Volume::create(
        store.clone(),
        move |_| Ok(Box::new(t) as Box<dyn intact_core::store::TrustedStore>),
        PW,
        &copts,
        &intact_core::Options::default(),
    )
    .unwrap();
    assert_eq!(vol.info().unwrap().scheme, "auto");
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    vol.create_file("/t", None).unwrap();
    vol.write_path("/t", 0, &text(4, 100_000)).unwrap();
    vol.create_file("/fixed", Some(SchemeId::MacTree)).unwrap();
    vol.write_path("/fixed", 0, &text(4, 100_000)).unwrap();
    vol.sync().unwrap();
    assert!(vol.stat("/t").unwrap().auto);
    assert_eq!(vol.stat("/t").unwrap().scheme, "rand-eint");
    assert!(!vol.stat("/fixed").unwrap().auto);
    assert_eq!(vol.stat("/fixed").unwrap().scheme, "mac-tree");
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(read_all(&vol, "/t").unwrap(), text(4, 100_000));
}

#[test]
fn a_small_sample_does_not_rewrite_a_stored_file() {
    let (store, trusted, vol) = auto_volume();
    let low = text(3, 4 << 20);
    let ino = vol.create_file("/big", None).unwrap();
    vol.set_auto(ino, true).unwrap();
    vol.write_path("/big", 0, &low).unwrap();
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    // A few reads of a 1,024-block file are not enough evidence to rewrite it.
    let mut buf = vec![0u8; 64 * 4096];
    vol.read_path("/big", 0, &mut buf).unwrap();
    vol.read_path("/big", 0, &mut buf).unwrap();
    vol.sync().unwrap();
    assert_eq!(vol.stat("/big").unwrap().scheme, "rand-eint");
}

/// Reads the policy observes include those of a file whose RTree index is loaded (they are
/// served under the engine lock, where the observation lives, not by a read that runs
/// without it): read-mostly in the session that wrote it, the file moves to COMP-EINT.
#[test]
fn reads_in_the_session_that_wrote_the_file_are_observed() {
    let (_store, _trusted, vol) = auto_volume();
    let low = text(2, 512 * 1024);
    stored_auto_file(&vol, "/f", &low);
    for _ in 0..4 {
        assert_eq!(read_all(&vol, "/f").unwrap(), low);
    }
    vol.sync().unwrap();
    assert_eq!(vol.stat("/f").unwrap().scheme, "comp-eint");
}
