//! Regression tests (found in review): direct writes of a transaction that never sealed
//! leave bytes past an object's committed length. Two readers used to trust such bytes after
//! a benign crash and raised a tamper alarm on reopen: hole nodes past the end of a Merkle
//! object after `append_holes`, and the tail of a grown spilled-counter object. The crash
//! here comes after a commit that does not touch the object, so no journal replay cuts the
//! remains back.

mod common;

use common::*;
use intact_core::format::SchemeId;
use intact_core::store::{CrashImage, FaultPlan, FaultStore, MemTrusted, UntrustedStore};
use intact_core::Volume;
use std::sync::Arc;

const BS: usize = 128;

/// Runs `setup` + sync, then `step` + sync with a crash after every possible write count;
/// reopens every crash image and reads `path` fully. Returns the failures.
fn crash_step(
    setup: &dyn Fn(&Volume),
    step: &dyn Fn(&Volume),
    path: &str,
    old: &[u8],
    new: &[u8],
) -> Vec<String> {
    let total = {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, BS as u32);
        setup(&vol);
        vol.sync().unwrap();
        store.reset_counters();
        step(&vol);
        vol.sync().unwrap();
        let t = store.writes();
        vol.set_seal_on_drop(false);
        drop(vol);
        t
    };
    let mut fails = Vec::new();
    for n in 0..total {
        let store = Arc::new(FaultStore::new_mem());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, BS as u32);
        setup(&vol);
        vol.sync().unwrap();
        store.reset_counters();
        store.set_plan(FaultPlan {
            crash_after_writes: Some(n),
            ..Default::default()
        });
        step(&vol);
        let _ = vol.sync();
        drop(vol);
        // Each image is opened with the trusted state as the crash left it (a recovery
        // stores anchors that belong to its own image only).
        let at_crash = trusted.snapshot();
        for mode in [CrashImage::DurableOnly, CrashImage::All] {
            trusted.restore(at_crash.clone());
            let image = Arc::new(store.crash_image(mode));
            let what = format!("crash after {n}/{total} {mode:?}");
            let vol = match open(image as Arc<dyn UntrustedStore>, &trusted) {
                Ok(v) => v,
                Err(e) => {
                    fails.push(format!("{what}: reopen: {e}"));
                    continue;
                }
            };
            match read_all(&vol, path) {
                Ok(d) if d == old || d == new => {}
                Ok(_) => fails.push(format!("{what}: content matches neither sync point")),
                Err(e) => fails.push(format!("{what}: read: {e} (tampered={})", e.is_tampered())),
            }
            vol.set_seal_on_drop(false);
        }
    }
    fails
}

/// A sparse file (holes appended by `append_holes`, whose interior nodes are never written
/// and are read back as zeros past the end of the `.m` object). Filling a hole past the
/// `.m` object's end writes its leaf and ancestors *directly*; a crash before the anchor
/// leaves them in `.m`, where the committed tree expects zeros.
#[test]
fn crash_while_filling_a_hole_past_the_metadata_end() {
    let setup = |v: &Volume| {
        v.create_file("/s", None).unwrap();
        v.write_path("/s", 0, &pattern(1, BS)).unwrap();
        v.truncate("/s", 100 * BS as u64).unwrap();
        v.sync().unwrap();
        // A later commit that does not touch `/s` (its journal must not mention `/s.m`).
        v.create_file("/other", None).unwrap();
        v.write_path("/other", 0, b"x").unwrap();
    };
    let step = |v: &Volume| {
        let _ = v.write_path("/s", 80 * BS as u64, &pattern(2, BS));
    };
    let mut old = pattern(1, BS);
    old.resize(100 * BS, 0);
    let mut new = old.clone();
    new[80 * BS..81 * BS].copy_from_slice(&pattern(2, BS));
    let fails = crash_step(&setup, &step, "/s", &old, &new);
    assert!(
        fails.is_empty(),
        "{} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

/// Spilled counters (`.c`): a commit that adds intervals writes the longer encoding at
/// offset 0; its tail lies past the committed length and goes directly to the store. A
/// crash before the anchor leaves that tail; on reopen the whole object is decoded and its
/// length no longer matches the interval count.
#[test]
fn crash_while_spilled_counters_grow() {
    // 40 blocks with alternating counters: > 7 intervals, so spilled (and past the bound
    // of data kept in the inode table's slots, so in blocks).

    let setup = |v: &Volume| {
        v.create_file("/c", None).unwrap();
        v.write_path("/c", 0, &pattern(1, 40 * BS)).unwrap();
        v.sync().unwrap();
        for b in (1..40).step_by(2) {
            v.write_path("/c", (b * BS) as u64, &pattern(3, BS))
                .unwrap();
            v.sync().unwrap();
        }
        assert!(v.stat("/c").unwrap().counters_spilled);
        // A later commit that does not touch `/c`: the anchor's journal no longer
        // mentions `/c`'s objects, so replay does not cut `.c` back.
        v.create_file("/other", None).unwrap();
        v.write_path("/other", 0, b"x").unwrap();
    };
    let expected_old = {
        let mut d = pattern(1, 40 * BS);
        for b in (1..40).step_by(2) {
            d[b * BS..(b + 1) * BS].copy_from_slice(&pattern(3, BS));
        }
        d
    };
    // One more block under the session floor (block 39 has floor + 1): one more interval.
    let step = |v: &Volume| {
        let _ = v.write_path("/c", 40 * BS as u64, &pattern(4, BS));
    };
    let mut new = expected_old.clone();
    new.extend_from_slice(&pattern(4, BS));
    let fails = crash_step(&setup, &step, "/c", &expected_old, &new);
    assert!(
        fails.is_empty(),
        "{} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

/// Counters in segments (file-format.md §9.2): a file of three segments fragmented past
/// `SEG_MIN_INTERVALS` intervals, then one write across the boundary of its second and
/// third segments (a change of two segments, logged as edits of each, and more
/// intervals). A crash at every write of that request and its seal leaves the file as it
/// was or as the request left it: never an alarm.
#[test]
fn crash_while_segmented_counters_change() {
    use intact_core::tree::{SEG_BLOCKS, SEG_MIN_INTERVALS};
    let blocks = 3 * SEG_BLOCKS as usize;
    let writes = SEG_MIN_INTERVALS / 2 + 50;
    let setup = |v: &Volume| {
        v.create_file("/c", None).unwrap();
        v.truncate("/c", (blocks * BS) as u64).unwrap();
        for i in 0..writes {
            v.write_path("/c", (3 * i * BS) as u64, &pattern(i as u8, BS))
                .unwrap();
        }
        v.sync().unwrap();
        assert!(v.stat("/c").unwrap().counter_intervals > SEG_MIN_INTERVALS as u64);
        v.create_file("/other", None).unwrap();
        v.write_path("/other", 0, b"x").unwrap();
    };
    let mut old = vec![0u8; blocks * BS];
    for i in 0..writes {
        old[3 * i * BS..(3 * i + 1) * BS].copy_from_slice(&pattern(i as u8, BS));
    }
    let at = 2 * SEG_BLOCKS as usize - 2;
    let step = |v: &Volume| {
        let _ = v.write_path("/c", (at * BS) as u64, &pattern(200, 4 * BS));
    };
    let mut new = old.clone();
    new[at * BS..(at + 4) * BS].copy_from_slice(&pattern(200, 4 * BS));
    let fails = crash_step(&setup, &step, "/c", &old, &new);
    assert!(
        fails.is_empty(),
        "{} failures:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

/// Twin blocks (docs/design.md, "Twin blocks"): a sealed file with blocks in both slots,
/// then one request over blocks of both (those in `.d` go directly to `.t`, those in `.t`
/// are staged and written in place by the checkpoint), and one that moves a block back to
/// `.d`. A crash at every write of the request and its seal leaves the file as it was or
/// as the request left it: the version the durable state names is never written over.
#[test]
fn crash_while_overwrites_go_to_the_twin_slots() {
    const BLOCKS: usize = 24;
    let setup = |v: &Volume| {
        v.create_file("/t", None).unwrap();
        v.write_path("/t", 0, &pattern(1, BLOCKS * BS)).unwrap();
        v.sync().unwrap();
        v.write_path("/t", (2 * BS) as u64, &pattern(2, 5 * BS))
            .unwrap();
        v.write_path("/t", (10 * BS) as u64, &pattern(3, BS))
            .unwrap();
        v.sync().unwrap();
        v.create_file("/other", None).unwrap();
        v.write_path("/other", 0, b"x").unwrap();
    };
    let mut old = pattern(1, BLOCKS * BS);
    old[2 * BS..7 * BS].copy_from_slice(&pattern(2, 5 * BS));
    old[10 * BS..11 * BS].copy_from_slice(&pattern(3, BS));
    for (at, len, seed) in [(0, 13 * BS, 4u8), (3 * BS + 5, 9, 5)] {
        let step = |v: &Volume| {
            let _ = v.write_path("/t", at as u64, &pattern(seed, len));
        };
        let mut new = old.clone();
        new[at..at + len].copy_from_slice(&pattern(seed, len));
        let fails = crash_step(&setup, &step, "/t", &old, &new);
        assert!(
            fails.is_empty(),
            "write at {at}: {} failures:\n{}",
            fails.len(),
            fails.join("\n")
        );
    }
}
