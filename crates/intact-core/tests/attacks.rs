//! The twelve tampering and rollback attacks of the foundation issue, at library level.
//!
//! Each attack manipulates the untrusted store while the volume is closed (the trusted
//! anchor is kept), reopens and reads. A detected attack must fail with an integrity error
//! naming the file (and the block where one applies). Under `aead`, which gives no
//! per-block freshness, the replay attacks pass: the table at the bottom records exactly
//! which, so users can see what each scheme guarantees.

mod common;

use common::*;
use intact_core::format::{ObjectNames, SchemeId};
use intact_core::store::{MemStore, MemTrusted, UntrustedStore};
use intact_core::{Error, Subject, Volume};
use std::collections::BTreeMap;
use std::sync::Arc;

const BS: usize = 4096;

struct Fx {
    store: Arc<MemStore>,
    trusted: MemTrusted,
    scheme: SchemeId,
    content: Content,
}

/// How file contents are made: `pattern` (a uniform byte histogram, so random-looking to
/// IsRand, yet compressible), `text` (low entropy, compressible) or `noise` (random-looking
/// and incompressible). RAND-EINT and COMP-EINT take different paths for each.
type Content = fn(u8, usize) -> Vec<u8>;

impl Fx {
    fn new(scheme: SchemeId) -> Fx {
        Fx::with(scheme, pattern)
    }

    fn with(scheme: SchemeId, content: Content) -> Fx {
        let pattern = content;
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme, BS as u32);
        vol.create_file("/a", None).unwrap();
        vol.write_path("/a", 0, &pattern(1, 4 * BS)).unwrap();
        vol.create_file("/b", None).unwrap();
        vol.write_path("/b", 0, &pattern(2, 4 * BS)).unwrap();
        vol.create_file("/c", None).unwrap();
        vol.write_path("/c", 0, &pattern(3, BS)).unwrap();
        vol.mkdir("/d1").unwrap();
        vol.mkdir("/d2").unwrap();
        vol.create_file("/d1/x", None).unwrap();
        vol.write_path("/d1/x", 0, &pattern(4, 2 * BS)).unwrap();
        vol.create_file("/d2/y", None).unwrap();
        vol.write_path("/d2/y", 0, &pattern(5, 100)).unwrap();
        vol.sync().unwrap();
        drop(vol);
        Fx {
            store,
            trusted,
            scheme,
            content,
        }
    }

    fn vol(&self) -> intact_core::Result<Volume> {
        open(self.store.clone(), &self.trusted)
    }

    fn names(&self, path: &str) -> ObjectNames {
        let v = self.vol().unwrap();
        names(&v, path)
    }

    /// Byte range of block `i` in the data object.
    fn block(&self, i: usize) -> std::ops::Range<usize> {
        let stride = if self.scheme == SchemeId::Aead {
            BS + 28
        } else {
            BS
        };
        i * stride..(i + 1) * stride
    }

    /// An unrelated later commit: the journal the anchor names (which is replayed, and so
    /// would re-apply the latest image of what it covers) then no longer covers `/a`, `/c`
    /// or the root directory, so the attacks below meet only the blocks they target.
    fn settle(&self) {
        let v = self.vol().unwrap();
        v.write_path("/d2/y", 0, b"later").unwrap();
        v.sync().unwrap();
    }

    fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        self.store.snapshot()
    }

    fn restore_objects(&self, snap: &BTreeMap<String, Vec<u8>>, names: &[&String]) {
        for n in names {
            match snap.get(*n) {
                Some(bytes) => {
                    self.store.set_len(n, 0).unwrap();
                    self.store.write_at(n, 0, bytes).unwrap();
                }
                None => self.store.delete(n).unwrap(),
            }
        }
    }
}

/// What happened when the attacked volume was read.
#[derive(Debug)]
enum Outcome {
    Detected(Error),
    /// The read succeeded: the returned bytes, for the record.
    Undetected(Vec<u8>),
}

/// An open that failed for the whole volume carries what the anchor and the store each
/// hold; the failure itself is its cause.
fn open_failed(e: Error) -> Outcome {
    match e {
        Error::StateMismatch { cause, report } => {
            assert!(report.explain().contains("What you can do"), "{report:?}");
            Outcome::Detected(*cause)
        }
        e => Outcome::Detected(e),
    }
}

fn read_outcome(fx: &Fx, path: &str) -> Outcome {
    let vol = match fx.vol() {
        Ok(v) => v,
        Err(e) => return open_failed(e),
    };
    match read_all(&vol, path) {
        Ok(b) => Outcome::Undetected(b),
        Err(e) => Outcome::Detected(e),
    }
}

fn list_outcome(fx: &Fx, path: &str) -> Outcome {
    let vol = match fx.vol() {
        Ok(v) => v,
        Err(e) => return open_failed(e),
    };
    match vol.readdir(path) {
        Ok(entries) => Outcome::Undetected(entries.iter().flat_map(|e| e.name.bytes()).collect()),
        Err(e) => Outcome::Detected(e),
    }
}

fn flip_bit(fx: &Fx) -> Outcome {
    let n = fx.names("/a");
    let r = fx.block(1);
    fx.store
        .with_object(&n.data, |o| o[r.start + 100] ^= 0x10)
        .unwrap();
    read_outcome(fx, "/a")
}

fn swap_blocks(fx: &Fx) -> Outcome {
    let n = fx.names("/a");
    let (r0, r1) = (fx.block(0), fx.block(1));
    fx.store
        .with_object(&n.data, |o| {
            let b0 = o[r0.clone()].to_vec();
            let b1 = o[r1.clone()].to_vec();
            o[r0].copy_from_slice(&b1);
            o[r1].copy_from_slice(&b0);
        })
        .unwrap();
    read_outcome(fx, "/a")
}

fn copy_from_other_file(fx: &Fx) -> Outcome {
    let (na, nb) = (fx.names("/a"), fx.names("/b"));
    let r = fx.block(1);
    let other = fx.store.read_all(&nb.data).unwrap().unwrap()[r.clone()].to_vec();
    fx.store
        .with_object(&na.data, |o| o[r].copy_from_slice(&other))
        .unwrap();
    read_outcome(fx, "/a")
}

fn replay_block(fx: &Fx) -> Outcome {
    let n = fx.names("/a");
    let old = fx.snapshot();
    {
        let v = fx.vol().unwrap();
        v.write_path("/a", BS as u64, &(fx.content)(9, BS)).unwrap();
        v.sync().unwrap();
    }
    fx.settle();
    // The block's older ciphertext, with its older metadata (tree nodes, counters).
    let r = fx.block(1);
    let old_block = old[&n.data][r.clone()].to_vec();
    fx.store
        .with_object(&n.data, |o| o[r].copy_from_slice(&old_block))
        .unwrap();
    fx.restore_objects(&old, &[&n.meta, &n.ctrs]);
    read_outcome(fx, "/a")
}

fn rollback_file(fx: &Fx) -> Outcome {
    let n = fx.names("/a");
    let old = fx.snapshot();
    {
        let v = fx.vol().unwrap();
        v.write_path("/a", 0, &(fx.content)(10, 4 * BS)).unwrap();
        v.sync().unwrap();
    }
    fx.settle();
    fx.restore_objects(&old, &[&n.data, &n.meta, &n.ctrs]);
    read_outcome(fx, "/a")
}

fn rollback_volume(fx: &Fx) -> Outcome {
    let old = fx.snapshot();
    {
        let v = fx.vol().unwrap();
        v.write_path("/a", 0, &(fx.content)(11, 4 * BS)).unwrap();
        v.sync().unwrap();
    }
    fx.store.restore(old);
    read_outcome(fx, "/a")
}

fn truncate_object(fx: &Fx) -> Outcome {
    let n = fx.names("/a");
    let keep = fx.block(1).start as u64;
    fx.store.set_len(&n.data, keep).unwrap();
    read_outcome(fx, "/a")
}

fn delete_objects(fx: &Fx) -> Outcome {
    let n = fx.names("/a");
    for o in [&n.data, &n.meta, &n.ctrs] {
        fx.store.delete(o).unwrap();
    }
    read_outcome(fx, "/a")
}

fn swap_files(fx: &Fx) -> Outcome {
    let (na, nb) = (fx.names("/a"), fx.names("/b"));
    let snap = fx.snapshot();
    for (x, y) in [
        (&na.data, &nb.data),
        (&na.meta, &nb.meta),
        (&na.ctrs, &nb.ctrs),
    ] {
        fx.restore_objects(
            &BTreeMap::from([(x.clone(), snap.get(y).cloned().unwrap_or_default())]),
            &[x],
        );
        fx.restore_objects(
            &BTreeMap::from([(y.clone(), snap.get(x).cloned().unwrap_or_default())]),
            &[y],
        );
    }
    read_outcome(fx, "/a")
}

fn move_between_dirs(fx: &Fx) -> Outcome {
    // At the store level, "moving /d1/x into /d2" means making /d2's objects hold /d1's
    // entries (the adversary cannot write a directory it cannot decrypt).
    let (n1, n2) = (fx.names("/d1"), fx.names("/d2"));
    let snap = fx.snapshot();
    // A small directory keeps its one tree node in its record (no `.m`): what is moved is
    // then only the data object, and a missing one is moved as missing.
    for (from, to) in [(&n1.data, &n2.data), (&n1.meta, &n2.meta)] {
        let moved: BTreeMap<String, Vec<u8>> = snap
            .get(from)
            .map(|b| (to.clone(), b.clone()))
            .into_iter()
            .collect();
        fx.restore_objects(&moved, &[to]);
    }
    list_outcome(fx, "/d2")
}

fn resurrect(fx: &Fx) -> Outcome {
    let old = fx.snapshot();
    let live: Vec<String> = {
        let v = fx.vol().unwrap();
        let ids: Vec<String> = ["/", "/a", "/b", "/d1", "/d2", "/d1/x", "/d2/y"]
            .iter()
            .map(|p| v.stat(p).unwrap().file_id)
            .collect();
        v.unlink("/c").unwrap();
        v.sync().unwrap();
        ids
    };
    fx.settle();
    // Bring back the deleted file's objects, and the root directory and inode table as they
    // were when it existed.
    let restore: Vec<&String> = old
        .keys()
        .filter(|k| k.starts_with("f/"))
        .filter(|k| !live.iter().skip(1).any(|id| k.contains(id.as_str())))
        .collect();
    fx.restore_objects(&old, &restore);
    read_outcome(fx, "/c")
}

fn zero_block(fx: &Fx) -> Outcome {
    let n = fx.names("/a");
    let r = fx.block(2);
    fx.store.with_object(&n.data, |o| o[r].fill(0)).unwrap();
    read_outcome(fx, "/a")
}

type Attack = fn(&Fx) -> Outcome;

const ATTACKS: [(&str, Attack, &str, Option<u64>); 12] = [
    ("1 bit flipped in a data block", flip_bit, "/a", Some(1)),
    ("2 two blocks swapped", swap_blocks, "/a", Some(0)),
    (
        "3 block copied from another file",
        copy_from_other_file,
        "/a",
        Some(1),
    ),
    (
        "4 one block replayed with its metadata",
        replay_block,
        "/a",
        Some(1),
    ),
    ("5 whole file rolled back", rollback_file, "/a", None),
    (
        "6 whole cipher directory rolled back",
        rollback_volume,
        "",
        None,
    ),
    ("7 backing object truncated", truncate_object, "/a", Some(1)),
    ("8 file's objects deleted", delete_objects, "/a", None),
    ("9 two files' objects swapped", swap_files, "/a", None),
    (
        "10 file moved between directories",
        move_between_dirs,
        "/d2",
        None,
    ),
    ("11 deleted file resurrected", resurrect, "", None),
    (
        "12 data block overwritten with zeros",
        zero_block,
        "/a",
        Some(2),
    ),
];

/// Which attacks a scheme cannot detect (by design).
fn undetected_by(scheme: SchemeId) -> &'static [usize] {
    match scheme {
        // No freshness: an old version of a block or of a whole file authenticates.
        SchemeId::Aead => &[4, 5],
        // No integrity at all: every attack on a file's own objects goes unnoticed (the
        // reader gets garbage or old contents). Only what the inode table and the
        // directories (always mt-eint) protect is caught: 6, 10 and 11.
        SchemeId::None => &[1, 2, 3, 4, 5, 7, 8, 9, 12],
        _ => &[],
    }
}

/// The block an attack's error names, where a scheme names it differently from the table.
fn expected_block(scheme: SchemeId, attack: usize, table: Option<u64>) -> Option<u64> {
    match (scheme, attack) {
        // A counter node's MAC covers the counters of 64 blocks: a replayed node is
        // caught as a whole, and the error names the first block read under it.
        (SchemeId::MacTree, 4) => Some(0),
        _ => table,
    }
}

fn run_all(scheme: SchemeId) {
    run_all_with(scheme, pattern)
}

fn run_all_with(scheme: SchemeId, content: Content) {
    let mut report = Vec::new();
    for (k, (name, attack, path, block)) in ATTACKS.iter().enumerate() {
        let number = k + 1;
        let fx = Fx::with(scheme, content);
        let outcome = attack(&fx);
        let expect_undetected = undetected_by(scheme).contains(&number);
        match (&outcome, expect_undetected) {
            (
                Outcome::Detected(Error::Tampered {
                    subject,
                    block: b,
                    what,
                }),
                false,
            ) => {
                if !path.is_empty() {
                    assert_eq!(
                        subject,
                        &Subject::Path(path.to_string()),
                        "{scheme:?} attack {name}: wrong subject ({what})"
                    );
                }
                let block = expected_block(scheme, number, *block);
                if block.is_some() {
                    assert_eq!(b, &block, "{scheme:?} attack {name}: wrong block ({what})");
                }
                report.push(format!("{name}: detected: {}", outcome_text(&outcome)));
            }
            (Outcome::Detected(e), false) => {
                panic!("{scheme:?} attack {name}: failed with a non-integrity error: {e}")
            }
            (Outcome::Undetected(_), false) => panic!("{scheme:?} attack {name}: NOT detected"),
            (Outcome::Undetected(bytes), true) => {
                // Record what the user silently gets: the older, authentic content.
                assert!(!bytes.is_empty());
                let why = if scheme.authenticates() {
                    "no freshness"
                } else {
                    "no integrity"
                };
                report.push(format!("{name}: undetected by {} ({why})", scheme.name()));
            }
            (Outcome::Detected(e), true) => {
                panic!("{scheme:?} attack {name}: expected undetected under this scheme, but: {e}")
            }
        }
    }
    println!("{}:\n  {}", scheme.name(), report.join("\n  "));
}

fn outcome_text(o: &Outcome) -> String {
    match o {
        Outcome::Detected(e) => e.to_string(),
        Outcome::Undetected(_) => "undetected".into(),
    }
}

#[test]
fn attacks_mt_eint_gcm_all_detected() {
    run_all(SchemeId::MtEintGcm);
}

#[test]
fn attacks_mt_eint_cbc_all_detected() {
    run_all(SchemeId::MtEintCbc);
}

#[test]
fn attacks_aead_all_but_replay_detected() {
    run_all(SchemeId::Aead);
}

#[test]
fn attacks_mac_tree_all_detected() {
    run_all(SchemeId::MacTree);
}

#[test]
fn attacks_none_only_structure_detected() {
    run_all(SchemeId::None);
}

/// RAND-EINT on random-looking blocks (every block has an RTree leaf).
#[test]
fn attacks_rand_eint_random_looking_all_detected() {
    run_all_with(SchemeId::RandEint, pattern);
}

/// RAND-EINT on text (no block has a leaf: the entropy test alone authenticates).
#[test]
fn attacks_rand_eint_low_entropy_all_detected() {
    run_all_with(SchemeId::RandEint, text);
}

/// RAND-EINT on a mix: blocks with and without leaves in one file.
#[test]
fn attacks_rand_eint_mixed_all_detected() {
    run_all_with(SchemeId::RandEint, mixed);
}

/// COMP-EINT on compressible blocks (hash inside every block, no leaves).
#[test]
fn attacks_comp_eint_compressible_all_detected() {
    run_all_with(SchemeId::CompEint, text);
    run_all_with(SchemeId::CompEintZstd, pattern);
}

/// COMP-EINT on incompressible blocks (every block has an RTree leaf).
#[test]
fn attacks_comp_eint_incompressible_all_detected() {
    run_all_with(SchemeId::CompEint, noise);
    run_all_with(SchemeId::CompEintZstd, mixed);
}

/// A rollback of the anchor itself is outside the model (it is trusted), but a *stale*
/// anchor copy (the only thing `recover-anchor` can use) is refused while an anchor exists.
#[test]
fn recover_anchor_refuses_when_anchor_exists() {
    let fx = Fx::new(SchemeId::MtEintGcm);
    let err = Volume::recover_anchor(fx.store.as_ref(), &fx.trusted, PW).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
}

/// Tampering found while buffered writes are pushed through the tree: the writes still
/// buffered cannot be kept, so nothing may pretend they were. The engine goes back to the
/// last seal (docs/design.md, "A failed commit"), reports the discarded changes at the next
/// sync, and goes on for the other files; the damaged block still fails.
#[test]
fn tampering_found_during_a_flush_discards_the_unsealed_changes() {
    let fx = Fx::new(SchemeId::MtEintGcm);
    let n = fx.names("/a");
    fx.settle();
    // Damage a stored leaf: the tree update's CheckPathRoot must notice before writing.
    fx.store.with_object(&n.meta, |o| o[2 * 32] ^= 1).unwrap();
    let v = fx.vol().unwrap();
    v.write_path("/b", 0, b"lost").unwrap();
    let big = pattern(12, 8 << 20);
    let e = v.write_path("/a", 0, &big).unwrap_err();
    assert!(e.is_tampered(), "{e}");
    assert_eq!(
        v.integrity_failures(),
        1,
        "the failure is counted (intact stat shows it)"
    );
    assert_eq!(
        read_all(&v, "/b").unwrap(),
        pattern(2, 4 * BS),
        "back at the seal"
    );
    assert!(matches!(v.sync(), Err(intact_core::Error::Lost { .. })));
    v.write_path("/b", 0, b"kept").unwrap();
    v.sync().unwrap();
    assert!(read_all(&v, "/a").unwrap_err().is_tampered());
    drop(v);
    // The last sealed state is intact for the other files.
    let v = fx.vol().unwrap();
    let mut want = pattern(2, 4 * BS);
    want[..4].copy_from_slice(b"kept");
    assert_eq!(read_all(&v, "/b").unwrap(), want);
}
