//! Leaves in the log (docs/design.md, "Leaves in the log"; `format::LEAF_LOG`): an
//! `mt-eint` file's data item leaves out the Merkle nodes its leaves determine, and replay
//! recomputes them from the leaves up and checks them against the root the item holds.

mod common;

use common::*;
use intact_core::crypto::KdfParams;
use intact_core::format::SchemeId;
use intact_core::store::{CountingStore, MemStore, MemTrusted, ObjectClass, UntrustedStore};
use intact_core::CreateOptions;
use std::sync::Arc;

const BS: usize = 4096;

fn block(tag: u64) -> Vec<u8> {
    (0..BS)
        .map(|i| (tag as usize).wrapping_mul(37).wrapping_add(i * 11) as u8)
        .collect()
}

fn volume(
    store: Arc<dyn UntrustedStore>,
    trusted: &MemTrusted,
    leaf_log: bool,
    log_delta: bool,
) -> intact_core::Volume {
    create_with(
        store,
        trusted,
        &CreateOptions {
            block_size: BS as u32,
            scheme: SchemeId::MtEintGcm,
            kdf: KdfParams::TEST,
            leaf_log,
            log_delta,
            ..CreateOptions::default()
        },
    )
}

fn write(vol: &intact_core::Volume, model: &mut Vec<u8>, path: &str, off: usize, data: &[u8]) {
    vol.write_path(path, off as u64, data).unwrap();
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

/// Every way a request changes a tree (overwrites that go to the twin slot and ones that
/// are staged, a write across blocks, appends that merge peaks, a cut, a punched hole, a
/// write far past the end), each logged without the nodes above its leaves; the process
/// dies before a checkpoint, and the open rebuilds the tree from the log's leaves: the
/// file reads back, fsck is clean, and so after the checkpoint the open takes.
#[test]
fn replay_rebuilds_the_tree_from_the_leaves() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = volume(store.clone(), &trusted, true, true);
    vol.create_file("/f", None).unwrap();
    let mut model = Vec::new();
    for b in 0..37 {
        write(&vol, &mut model, "/f", b * BS, &block(b as u64));
    }
    vol.sync().unwrap();
    for (k, b) in [3usize, 17, 36, 3, 0].into_iter().enumerate() {
        write(&vol, &mut model, "/f", b * BS, &block(100 + k as u64));
    }
    write(&vol, &mut model, "/f", 20 * BS + 3000, &[9u8; 5000]);
    for b in 37..47 {
        write(&vol, &mut model, "/f", b * BS, &block(200 + b as u64));
    }
    vol.truncate("/f", (45 * BS + 100) as u64).unwrap();
    model.truncate(45 * BS + 100);
    let ino = vol.stat("/f").unwrap().ino;
    vol.zero_range(ino, (10 * BS) as u64, BS as u64, true)
        .unwrap();
    model[10 * BS..11 * BS].fill(0);
    write(&vol, &mut model, "/f", 60 * BS + 5, b"past the end");
    write(&vol, &mut model, "/f", 12 * BS, &block(300));
    assert!(read_all(&vol, "/f").unwrap() == model);
    vol.set_seal_on_drop(false);
    drop(vol);
    let vol = open(store.clone() as Arc<dyn UntrustedStore>, &trusted).unwrap();
    assert_eq!(
        vol.integrity_failures(),
        0,
        "the replay's trees give their roots"
    );
    assert!(read_all(&vol, "/f").unwrap() == model, "after the replay");
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    drop(vol);
    let vol = open(store as Arc<dyn UntrustedStore>, &trusted).unwrap();
    assert!(read_all(&vol, "/f").unwrap() == model, "after a reopen");
}

/// What it saves: random overwrites of distinct blocks of a sealed 1,024-block file log
/// about 1,080 bytes each without leaf-log (11 nodes of the path, a 256-byte record) and
/// about 420 with it (docs/performance.md, "Leaves in the log").
#[test]
fn an_overwrite_logs_one_node_not_its_path() {
    let per_write = |leaf_log: bool, log_delta: bool| {
        let store = Arc::new(CountingStore::new(MemStore::new()));
        let trusted = MemTrusted::new();
        let vol = volume(store.clone(), &trusted, leaf_log, log_delta);
        vol.create_file("/big", None).unwrap();
        vol.write_path("/big", 0, &vec![1u8; 1024 * BS]).unwrap();
        vol.sync().unwrap();
        let before = store.stats();
        let mut rng = Lcg(9);
        let mut done = std::collections::BTreeSet::new();
        while done.len() < 200 {
            let b = rng.next() as usize % 1024;
            if done.insert(b) {
                vol.write_path("/big", (b * BS) as u64, &block(b as u64))
                    .unwrap();
            }
        }
        let log = store
            .stats()
            .since(&before)
            .get(ObjectClass::Control)
            .write_bytes;
        log as f64 / 200.0
    };
    let (plain, leaf, delta) = (
        per_write(false, false),
        per_write(true, false),
        per_write(true, true),
    );
    eprintln!(
        "log bytes per overwrite: {plain:.0} without leaf-log, {leaf:.0} with, {delta:.0} with \
         log-delta too"
    );
    assert!(plain > 950.0, "{plain}");
    assert!(leaf < 450.0, "{leaf}");
    assert!(delta < 260.0, "{delta}");
}

/// A node the recomputation reads (the sibling of an overwritten leaf) damaged in the
/// store before the open. Fsynced, the overwrite's item is replayed: the open still takes
/// (no lock-out) and counts one integrity failure. Not fsynced, the check of direct writes
/// finds the write does not read back and leaves it out, as a crash may. Either way the
/// other files read, and the damaged file's reads fail as integrity errors (the root the
/// log holds stays the trusted one), never returning wrong bytes.
#[test]
fn a_damaged_sibling_is_caught_and_locks_out_only_its_file() {
    for fsynced in [true, false] {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = volume(store.clone(), &trusted, true, true);
        vol.create_file("/f", None).unwrap();
        vol.create_file("/g", None).unwrap();
        vol.write_path("/f", 0, &vec![3u8; 64 * BS]).unwrap();
        vol.write_path("/g", 0, &vec![4u8; 16 * BS]).unwrap();
        vol.sync().unwrap();
        vol.write_path("/f", (5 * BS) as u64, &block(5)).unwrap();
        if fsynced {
            vol.fsync(vol.stat("/f").unwrap().ino).unwrap();
        }
        let meta = names(&vol, "/f").meta;
        vol.set_seal_on_drop(false);
        drop(vol);
        // Leaf 4 (flat 8), which the recomputation of leaf 5's parent reads.
        let mut node = [0u8; 32];
        store.read_at(&meta, 8 * 32, &mut node).unwrap();
        node[0] ^= 1;
        store.write_at(&meta, 8 * 32, &node).unwrap();
        let vol = open(store as Arc<dyn UntrustedStore>, &trusted).unwrap();
        assert_eq!(
            vol.integrity_failures(),
            u64::from(fsynced),
            "fsynced: {fsynced}"
        );
        assert_eq!(read_all(&vol, "/g").unwrap(), vec![4u8; 16 * BS]);
        let e = read_all(&vol, "/f").unwrap_err();
        assert!(e.is_tampered(), "{e}");
    }
}
