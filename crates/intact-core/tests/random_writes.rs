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

/// Bytes of log a random 1-block overwrite costs: `count` overwrites at blocks drawn by
/// `rng` below `below` (tags from `tag`), and the log's share of what the store was sent.
fn log_per_overwrite(
    store: &CountingStore<MemStore>,
    vol: &intact_core::Volume,
    model: &mut [u8],
    rng: &mut Lcg,
    below: usize,
    count: u64,
    tag: u64,
) -> u64 {
    let before = store.stats();
    for k in 0..count {
        let b = rng.next() as usize % below;
        overwrite(vol, model, b, 1, tag + k);
    }
    store
        .stats()
        .since(&before)
        .get(ObjectClass::Control)
        .write_bytes
        / count
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
    let log_per_write = log_per_overwrite(&store, &vol, &mut model, &mut rng, BLOCKS, 200, 1000);
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

/// A file whose counters break into more than `SEG_MIN_INTERVALS` intervals keeps them in
/// segments of `SEG_BLOCKS` blocks (docs/file-format.md §9.2): a random overwrite then
/// logs its block and a few bytes of one segment, replays after a crash, reads back after
/// a checkpoint; and a segment changed, put in another's place, or rolled back to an
/// older copy of itself is an integrity failure of the file.
#[test]
fn counters_of_many_intervals_live_in_segments() {
    use intact_core::tree::{SEG_BLOCKS, SEG_MIN_INTERVALS, SEG_STRIDE};
    let store = Arc::new(CountingStore::new(MemStore::new()));
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, BS as u32);
    vol.create_file("/big", None).unwrap();
    // Three segments, sparse: holes but where written.
    let blocks = 3 * SEG_BLOCKS as usize;
    vol.truncate("/big", (blocks * BS) as u64).unwrap();
    let mut model = vec![0u8; blocks * BS];
    // Every third block of the first two segments: two intervals a write.
    let writes = SEG_MIN_INTERVALS / 2 + 100;
    for i in 0..writes {
        overwrite(&vol, &mut model, 3 * i, 1, i as u64);
    }
    let st = vol.stat("/big").unwrap();
    assert!(st.counters_spilled, "{st:?}");
    assert!(st.counter_intervals > SEG_MIN_INTERVALS as u64, "{st:?}");
    vol.sync().unwrap();
    let c = names(&vol, "/big").ctrs;
    let len = store.len(&c).unwrap().unwrap();
    assert!(
        len > 2 * SEG_STRIDE && len < 3 * SEG_STRIDE,
        "three segments at their places: {len}"
    );
    // A random overwrite logs about its block, not the segment (tens of KB here).
    let below = 2 * SEG_BLOCKS as usize;
    let log_per_write =
        log_per_overwrite(&store, &vol, &mut model, &mut Lcg(7), below, 100, 50_000);
    assert!(
        log_per_write < 2 * BS as u64,
        "{log_per_write} bytes of log a 4 KiB overwrite"
    );
    // A crash: the log's edits of the segments replay.
    vol.set_seal_on_drop(false);
    drop(vol);
    let vol = open(store.clone() as Arc<dyn UntrustedStore>, &trusted).unwrap();
    let got = read_all(&vol, "/big").unwrap();
    let bad: Vec<usize> = (0..blocks)
        .filter(|&b| got[b * BS..(b + 1) * BS] != model[b * BS..(b + 1) * BS])
        .collect();
    assert!(
        bad.is_empty(),
        "after the replay: {} blocks differ, first {:?}; len {} vs {}",
        bad.len(),
        &bad[..bad.len().min(10)],
        got.len(),
        model.len()
    );
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store.clone() as Arc<dyn UntrustedStore>, &trusted).unwrap();
    assert!(
        read_all(&vol, "/big").unwrap() == model,
        "after a checkpoint"
    );
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    // Segment 1 as it is now, to roll back to after it changes.
    let slot = |k: u64| {
        let mut b = vec![0u8; SEG_STRIDE as usize];
        let n = store.read_at(&c, k * SEG_STRIDE, &mut b).unwrap();
        b.truncate(n);
        b
    };
    let old1 = slot(1);
    overwrite(&vol, &mut model, SEG_BLOCKS as usize + 1, 1, 77_777);
    vol.sync().unwrap();
    drop(vol);
    let good: Vec<Vec<u8>> = (0..3).map(slot).collect();
    let put = |k: u64, b: &[u8]| store.write_at(&c, k * SEG_STRIDE, b).unwrap();
    // Refused when the file is opened: its counters are checked before any block is read
    // (a block's tag would catch a wrong counter only when that block is read, and a write
    // would choose its counter from them). A read of the first block opens it (a stat
    // answers from the record alone).
    let refused = |what: &str| {
        let Err(e) = open(store.clone() as Arc<dyn UntrustedStore>, &trusted)
            .and_then(|v| v.read_path("/big", 0, &mut [0u8; 1]))
        else {
            panic!("{what}: opened without an error");
        };
        assert!(e.is_tampered(), "{what}: {e}");
        let msg = e.to_string();
        assert!(msg.contains("/big"), "{what}: names the file: {e}");
        assert!(msg.contains("write counters"), "{what}: the counters: {e}");
    };
    // A counter changed in segment 0: its last interval's (the last byte it uses; what
    // lies past it in its place is not read).
    let mut b = good[0].clone();
    let count = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
    let at = 12 + 16 * count - 1;
    b[at] ^= 1;
    put(0, &b);
    refused("a segment changed");
    put(0, &good[0]);
    // Segments 0 and 1 swapped (both full segments of the same length).
    put(0, &good[1]);
    put(1, &good[0]);
    refused("two segments swapped");
    put(0, &good[0]);
    put(1, &good[1]);
    // Segment 1 rolled back to its copy before the last write.
    put(1, &old1);
    refused("a segment rolled back");
    put(1, &good[1]);
    let vol = open(store.clone() as Arc<dyn UntrustedStore>, &trusted).unwrap();
    assert!(read_all(&vol, "/big").unwrap() == model, "restored");
    // Four blocks of the third segment, then one write over the first two: 10 intervals
    // over 3 segments, fewer than 4 a segment, so the counters go back to whole arrays
    // (§9.1) in that request.
    let s2 = 2 * SEG_BLOCKS as usize;
    for k in 0..4 {
        overwrite(&vol, &mut model, s2 + 100 * (k + 1), 1, 90_000 + k as u64);
    }
    overwrite(&vol, &mut model, 0, s2, 99_999);
    let st = vol.stat("/big").unwrap();
    assert_eq!(st.counter_intervals, 10, "{st:?}");
    assert!(st.counters_spilled, "{st:?}");
    vol.sync().unwrap();
    assert_eq!(
        store.len(&c).unwrap(),
        Some(12 + 16 * 10),
        "whole arrays again"
    );
    drop(vol);
    let vol = open(store as Arc<dyn UntrustedStore>, &trusted).unwrap();
    assert!(read_all(&vol, "/big").unwrap() == model, "after going back");
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A file whose counters are in segments grows past its last segment and later shrinks
/// (docs/file-format.md §9.2): the new segments are written whole, the segments it had are
/// logged as edits of what they held, and after a crash the log's replay, and after a
/// checkpoint the store, give the file's bytes back, at every step.
#[test]
fn segmented_counters_grow_into_new_segments_and_shrink() {
    use intact_core::tree::{SEG_BLOCKS, SEG_MIN_INTERVALS};
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let mut vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, BS as u32);
    vol.create_file("/big", None).unwrap();
    let seg = SEG_BLOCKS as usize;
    vol.truncate("/big", (2 * seg * BS) as u64).unwrap();
    let mut model = vec![0u8; 2 * seg * BS];
    for i in 0..SEG_MIN_INTERVALS / 2 + 100 {
        overwrite(&vol, &mut model, 3 * i % (2 * seg), 1, i as u64);
    }
    vol.sync().unwrap();
    // Each step, then a crash (the log replays it), then a checkpoint and a reopen.
    type Step<'a> = &'a dyn Fn(&intact_core::Volume, &mut Vec<u8>);
    let steps: [Step; 4] = [
        // Writes past the end, into the two segments after the last one: a block of the
        // third segment and blocks on both sides of the fourth's start.
        &|v, m| {
            let at = 2 * seg + 7;
            m.resize((3 * seg + 3) * BS, 0);
            overwrite(v, m, at, 1, 1_000);
            overwrite(v, m, 3 * seg - 2, 5, 1_001);
        },
        // Overwrites in the old segments and the new ones in one request each.
        &|v, m| {
            for k in 0..8 {
                overwrite(v, m, 1 + 450 * k, 1, 2_000 + k as u64);
            }
            overwrite(v, m, 3 * seg + 1, 1, 2_100);
        },
        // A cut inside the third segment: the fourth goes.
        &|v, m| {
            let len = (2 * seg + 11) * BS + 100;
            v.truncate("/big", len as u64).unwrap();
            m.truncate(len);
        },
        // And growing again past the cut, sparse.
        &|v, m| {
            m.resize((3 * seg + 32) * BS, 0);
            overwrite(v, m, 3 * seg + 30, 2, 3_000);
        },
    ];
    for (i, step) in steps.iter().enumerate() {
        step(&vol, &mut model);
        assert!(
            vol.stat("/big").unwrap().counter_intervals > SEG_MIN_INTERVALS as u64,
            "step {i}: still in segments"
        );
        vol.set_seal_on_drop(false);
        drop(vol);
        vol = open(store.clone() as Arc<dyn UntrustedStore>, &trusted).unwrap();
        assert!(
            read_all(&vol, "/big").unwrap() == model,
            "step {i}: after the log's replay"
        );
        vol.sync().unwrap();
        drop(vol);
        vol = open(store.clone() as Arc<dyn UntrustedStore>, &trusted).unwrap();
        assert!(
            read_all(&vol, "/big").unwrap() == model,
            "step {i}: after a checkpoint"
        );
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty(), "step {i}: fsck");
    }
}
