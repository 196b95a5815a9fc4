//! Random overwrites of a large file: the counter intervals fragment (Oprea–Reiter §4.2)
//! and spill into the file's `.c` object, whose changes the log must carry
//! (docs/design.md, "Counters in the log").

mod common;

use common::*;
use intact_core::format::SchemeId;
use intact_core::store::{CountingStore, MemStore, MemTrusted, ObjectClass, UntrustedStore};
use std::sync::Arc;

const BS: usize = 4096;
const BLOCKS: usize = 1024;

/// A small deterministic generator (no dependency for a test's sequence).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// One overwrite of `blocks` blocks at block `b`, in the model and in the volume.
fn overwrite(vol: &intact_core::Volume, model: &mut [u8], b: usize, blocks: usize, tag: u64) {
    let off = b * BS;
    let len = (blocks * BS).min(model.len() - off);
    let data: Vec<u8> = (0..len)
        .map(|i| (tag as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect();
    vol.write_path("/big", off as u64, &data).unwrap();
    model[off..off + len].copy_from_slice(&data);
}

/// A volume on a counting store with `/big`, `BLOCKS` blocks written in one go (one
/// counter interval), and its model.
fn big_file() -> (
    Arc<CountingStore<MemStore>>,
    MemTrusted,
    intact_core::Volume,
    Vec<u8>,
) {
    let store = Arc::new(CountingStore::new(MemStore::new()));
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, BS as u32);
    vol.create_file("/big", None).unwrap();
    let model = vec![7u8; BLOCKS * BS];
    vol.write_path("/big", 0, &model).unwrap();
    (store, trusted, vol, model)
}

/// Once the counters of a file have spilled, a random overwrite of one block puts about
/// its block into the log, not the file's counter arrays (which were written whole at
/// every request: 16 bytes a interval, here over 10 KB a write); and after a crash of the
/// process (the volume dropped without a seal), the log's copies within the counter
/// object replay to the same arrays: every byte reads back, and fsck is clean.
#[test]
fn a_random_overwrite_logs_its_block_not_the_counter_arrays() {
    let (store, trusted, vol, mut model) = big_file();
    vol.sync().unwrap();
    let mut rng = Lcg(42);
    // Fragment: single blocks and short runs, so that intervals split and merge.
    for k in 0..700 {
        let b = rng.next() as usize % BLOCKS;
        let n = if k % 5 == 0 {
            1 + rng.next() as usize % 8
        } else {
            1
        };
        overwrite(&vol, &mut model, b, n, k);
    }
    let intervals = vol.stat("/big").unwrap();
    let before = store.stats();
    const MEASURED: u64 = 200;
    for k in 0..MEASURED {
        let b = rng.next() as usize % BLOCKS;
        overwrite(&vol, &mut model, b, 1, 1000 + k);
    }
    let d = store.stats().since(&before);
    let log_per_write = d.get(ObjectClass::Control).write_bytes / MEASURED;
    eprintln!("{log_per_write} bytes of log a 4 KiB overwrite");
    assert!(
        log_per_write < 2 * BS as u64,
        "{log_per_write} bytes of log a 4 KiB overwrite ({intervals:?})"
    );
    // The process dies: nothing sealed since the last sync but the log.
    vol.set_seal_on_drop(false);
    drop(vol);
    let vol = open(store.clone() as Arc<dyn UntrustedStore>, &trusted).unwrap();
    assert!(read_all(&vol, "/big").unwrap() == model, "after the replay");
    // And through a checkpoint, and a reopen from it.
    overwrite(&vol, &mut model, 3, 1, 9999);
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store as Arc<dyn UntrustedStore>, &trusted).unwrap();
    assert!(
        read_all(&vol, "/big").unwrap() == model,
        "after a checkpoint"
    );
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A request that changes no counter writes nothing of the spilled arrays: after a chmod
/// of a file whose counters spilled, the checkpoint writes no byte of its `.c` object
/// (`finish_record` writes edits only when the arrays differ from what the object holds;
/// writing them anyway would journal and rewrite the object at every checkpoint).
#[test]
fn a_request_that_changes_no_counter_leaves_the_spilled_arrays_alone() {
    let (store, _trusted, vol, mut model) = big_file();
    for k in 0..64 {
        overwrite(&vol, &mut model, (k * 13) % BLOCKS, 1, k as u64);
    }
    vol.sync().unwrap();
    let st = vol.stat("/big").unwrap();
    assert!(st.counters_spilled, "{st:?}");
    let before = store.stats();
    let set = intact_core::volume::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    vol.setattr(st.ino, &set).unwrap();
    vol.sync().unwrap();
    let d = store.stats().since(&before);
    assert_eq!(d.get(ObjectClass::Integrity).write_bytes, 0, "{d:?}");
    assert!(
        d.get(ObjectClass::Journal).write_bytes > 0,
        "the chmod was sealed"
    );
    assert!(read_all(&vol, "/big").unwrap() == model);
}
