//! `mac-tree` through the volume: counters kept across truncation (hole marks), a tree
//! that deepens, reopen and fsck; and the measured integrity metrics of every scheme.

mod common;

use common::*;
use intact_core::format::SchemeId;
use intact_core::store::{MemStore, MemTrusted, UntrustedStore};
use std::sync::Arc;

const BS: usize = 128;

#[test]
fn truncate_then_extend_reads_zeros_and_survives_reopen() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MacTree, BS as u32);
    vol.create_file("/f", None).unwrap();
    // 5000 blocks of 128 bytes: m = 5000 needs depth 3 (64^2 < 5000 <= 64^3).
    let mut model = pattern(1, 5000 * BS);
    vol.write_path("/f", 0, &model).unwrap();
    vol.sync().unwrap();
    // Truncate to 10 blocks (the counters stay), then extend over the kept counters: the
    // blocks must read as zeros, not as their old contents.
    vol.truncate("/f", 10 * BS as u64).unwrap();
    vol.sync().unwrap();
    vol.truncate("/f", 300 * BS as u64 + 7).unwrap();
    model.truncate(10 * BS);
    model.resize(300 * BS + 7, 0);
    assert_eq!(read_all(&vol, "/f").unwrap(), model);
    vol.write_path("/f", 150 * BS as u64 + 3, b"inside")
        .unwrap();
    model[150 * BS + 3..150 * BS + 9].copy_from_slice(b"inside");
    // A write past the end, far beyond m: a hole over kept and never-used counters.
    vol.write_path("/f", 9000 * BS as u64, b"far").unwrap();
    model.resize(9000 * BS, 0);
    model.extend_from_slice(b"far");
    vol.sync().unwrap();
    assert_eq!(read_all(&vol, "/f").unwrap(), model);
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/f").unwrap(), model);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    // Rewrites after reopen (a new session floor) keep verifying.
    vol.write_path("/f", 0, &pattern(3, 4000 * BS)).unwrap();
    model[..4000 * BS].copy_from_slice(&pattern(3, 4000 * BS));
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(read_all(&vol, "/f").unwrap(), model);
}

/// A replayed upper counter node (level 1, in `.c`) is caught, and the error names the
/// file and a block under it.
#[test]
fn replayed_upper_node_is_detected() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MacTree, BS as u32);
    vol.create_file("/f", None).unwrap();
    vol.write_path("/f", 0, &pattern(1, 200 * BS)).unwrap();
    vol.sync().unwrap();
    let n = names(&vol, "/f");
    let old_c = store.read_all(&n.ctrs).unwrap().unwrap();
    vol.write_path("/f", 130 * BS as u64, b"x").unwrap();
    vol.sync().unwrap();
    // Another commit, so that the journal replayed on open does not cover /f.
    vol.create_file("/g", None).unwrap();
    vol.sync().unwrap();
    drop(vol);
    let cur = store.read_all(&n.ctrs).unwrap().unwrap();
    assert_ne!(cur, old_c, "the level-1 node changed");
    store
        .with_object(&n.ctrs, |o| o.copy_from_slice(&old_c))
        .unwrap();
    let vol = open(store, &trusted).unwrap();
    let e = read_all(&vol, "/f").unwrap_err();
    assert!(e.is_tampered(), "{e}");
    assert!(e.to_string().contains("level 1"), "{e}");
}

/// The metrics are measured: exact block counts, no `US_F` traffic for `none`, at least a
/// tag or leaf per block read for the authenticated schemes, and storage that matches the
/// object sizes.
#[test]
fn integrity_metrics_are_measured_per_file() {
    let blocks = 256u64;
    let mut bw = Vec::new();
    for scheme in SchemeId::ALL {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme, 4096);
        vol.create_file("/f", None).unwrap();
        vol.write_path("/f", 0, &pattern(7, blocks as usize * 4096))
            .unwrap();
        vol.sync().unwrap();
        let w = vol.file_integrity("/f").unwrap();
        assert_eq!(w.measured.blocks_written, blocks, "{scheme:?}");
        assert_eq!(
            w.measured.data.write_bytes, w.data_object_bytes,
            "{scheme:?}"
        );
        drop(vol);
        let vol = open(store.clone(), &trusted).unwrap();
        assert_eq!(read_all(&vol, "/f").unwrap().len(), blocks as usize * 4096);
        let f = vol.file_integrity("/f").unwrap();
        assert_eq!(f.measured.blocks_read, blocks, "{scheme:?}");
        assert_eq!(f.measured.blocks_written, 0);
        assert_eq!(f.blocks, blocks);
        let n = names(&vol, "/f");
        let len = |o: &str| store.read_all(o).unwrap().map_or(0, |b| b.len() as u64);
        assert_eq!(f.meta_object_bytes, len(&n.meta), "{scheme:?}");
        assert_eq!(
            f.integrity_bytes,
            len(&n.meta) + len(&n.ctrs) + f.data_overhead_bytes
        );
        let min_read = match scheme {
            SchemeId::None => 0.0,
            SchemeId::Aead => 0.0, // tags travel inside .d (data_overhead_bytes)
            SchemeId::MacTree => 16.0, // one block tag per block, plus counter nodes
            // `pattern` has a flat byte histogram (random-looking: one RTree leaf per block
            // under RAND-EINT) but compresses: COMP-EINT keeps every hash inside its block.
            SchemeId::CompEint | SchemeId::CompEintZstd => 0.0,
            _ => 32.0, // one Merkle leaf per block
        };
        if scheme == SchemeId::None || scheme == SchemeId::Aead {
            assert_eq!(f.measured.integrity.read_bytes, 0, "{scheme:?}");
        } else {
            assert!(
                f.read_bandwidth >= min_read,
                "{scheme:?}: {}",
                f.read_bandwidth
            );
        }
        assert_eq!(
            f.data_overhead_bytes,
            if scheme == SchemeId::Aead {
                blocks * 28
            } else {
                0
            }
        );
        assert!(f.time.total_ns() > 0, "{scheme:?}: time measured");
        assert!(f.time.encrypt_ns > 0, "{scheme:?}: encryption measured");
        let v = vol.integrity().unwrap();
        assert!(v.session.blocks_read >= blocks);
        assert!(v.ts_bytes >= f.trusted_bytes);
        assert_eq!(vol.metrics().blocks_read, v.session.blocks_read);
        bw.push((
            scheme.name(),
            f.read_bandwidth,
            w.write_bandwidth,
            f.trusted_bytes,
        ));
    }
    eprintln!("scheme, read B/block, write B/block, TS_F bytes: {bw:?}");
}
