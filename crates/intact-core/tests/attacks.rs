//! The twelve tampering and rollback attacks of docs/threat-model.md, at library level,
//! for every scheme (the attacks themselves are `intact_core::attacks`, which `intact bench
//! attacks` also runs).
//!
//! Each attack manipulates the untrusted store while the volume is closed (the trusted
//! anchor is kept), reopens and reads. A detected attack must fail with an integrity error
//! naming the file (and the block where one applies). Under `aead`, which gives no
//! per-block freshness, the replay attacks pass: `attacks::documented_misses` records
//! exactly which, so users can see what each scheme guarantees.

mod common;

use common::*;
use intact_core::attacks::{self, Bed, Content, Outcome, Verdict};
use intact_core::format::SchemeId;
use intact_core::store::{MemStore, MemTrusted, UntrustedStore};
use intact_core::{CreateOptions, Error, Result, Volume};
use std::sync::Arc;

const BS: usize = 4096;

/// A scratch volume in memory.
struct MemBed {
    store: Arc<MemStore>,
    trusted: MemTrusted,
}

impl MemBed {
    fn new() -> MemBed {
        MemBed {
            store: Arc::new(MemStore::new()),
            trusted: MemTrusted::new(),
        }
    }
}

impl Bed for MemBed {
    fn store(&self) -> Arc<dyn UntrustedStore> {
        self.store.clone()
    }
    fn create(&self, copts: &CreateOptions) -> Result<Volume> {
        Ok(create_with(self.store.clone(), &self.trusted, copts))
    }
    fn open(&self) -> Result<Volume> {
        open(self.store.clone(), &self.trusted)
    }
}

fn copts(scheme: SchemeId) -> CreateOptions {
    CreateOptions {
        block_size: BS as u32,
        scheme,
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
    }
}

fn run_all(scheme: SchemeId) {
    run_all_with(scheme, Content::Pattern)
}

fn run_all_with(scheme: SchemeId, content: Content) {
    let runs = attacks::run_all(
        &mut || Ok(Box::new(MemBed::new()) as Box<dyn Bed>),
        &copts(scheme),
        content,
    )
    .unwrap();
    assert_eq!(runs.len(), 12);
    let mut report = Vec::new();
    let mut opens_refused = 0;
    for r in &runs {
        let name = r.attack.name;
        assert!(
            matches!(r.verdict, Verdict::Detected | Verdict::MissedAsDocumented),
            "{scheme:?} on {content:?}, attack {} ({name}): {:?}",
            r.attack.number,
            r.verdict
        );
        if let Outcome::Detected(Error::StateMismatch { report, cause }) = &r.outcome {
            // An open refused for the whole volume says what the user can do, and the
            // report line gives its cause.
            assert!(report.explain().contains("What you can do"), "{report:?}");
            assert_eq!(r.outcome.text(), format!("open refused: {cause}"));
            opens_refused += 1;
        }
        if let Outcome::Undetected(bytes) = &r.outcome {
            // What the user silently gets: under aead, the older, authentic content; under
            // none, garbage or old contents.
            assert!(!bytes.is_empty());
            if scheme == SchemeId::Aead {
                assert_eq!(
                    bytes,
                    &content.bytes(1, 4 * BS),
                    "attack {}",
                    r.attack.number
                );
            }
        }
        report.push(format!("{} {name}: {}", r.attack.number, r.outcome.text()));
    }
    // The rollback of the whole store is caught at the open.
    assert!(opens_refused >= 1, "{report:?}");
    println!("{}:\n  {}", scheme.name(), report.join("\n  "));
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
    run_all_with(SchemeId::RandEint, Content::Pattern);
}

/// RAND-EINT on text (no block has a leaf: the entropy test alone authenticates).
#[test]
fn attacks_rand_eint_low_entropy_all_detected() {
    run_all_with(SchemeId::RandEint, Content::Text);
}

/// RAND-EINT on a mix: blocks with and without leaves in one file.
#[test]
fn attacks_rand_eint_mixed_all_detected() {
    run_all_with(SchemeId::RandEint, Content::Mixed);
}

/// COMP-EINT on compressible blocks (hash inside every block, no leaves).
#[test]
fn attacks_comp_eint_compressible_all_detected() {
    run_all_with(SchemeId::CompEint, Content::Text);
    run_all_with(SchemeId::CompEintZstd, Content::Pattern);
}

/// COMP-EINT on incompressible blocks (every block has an RTree leaf).
#[test]
fn attacks_comp_eint_incompressible_all_detected() {
    run_all_with(SchemeId::CompEint, Content::Noise);
    run_all_with(SchemeId::CompEintZstd, Content::Mixed);
}

/// A rollback of the anchor itself is outside the model (it is trusted), but a *stale*
/// anchor copy (the only thing `recover-anchor` can use) is refused while an anchor exists.
#[test]
fn recover_anchor_refuses_when_anchor_exists() {
    let bed = MemBed::new();
    attacks::Fixture::new(&bed, &copts(SchemeId::MtEintGcm), Content::Pattern).unwrap();
    let err = Volume::recover_anchor(bed.store.as_ref(), &bed.trusted, PW).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
}

/// Tampering found while buffered writes are pushed through the tree: the writes still
/// buffered cannot be kept, so nothing may pretend they were. The engine goes back to the
/// last seal (docs/design.md, "A failed commit"), reports the discarded changes at the next
/// sync, and goes on for the other files; the damaged block still fails.
#[test]
fn tampering_found_during_a_flush_discards_the_unsealed_changes() {
    let bed = MemBed::new();
    attacks::Fixture::new(&bed, &copts(SchemeId::MtEintGcm), Content::Pattern).unwrap();
    let n = names(&bed.open().unwrap(), "/a");
    {
        // /a grows past what its record keeps of its tree (six leaves), so that its leaves
        // are in `.m`; then a later commit, so that the journal the anchor names no longer
        // covers /a.
        let v = bed.open().unwrap();
        v.write_path("/a", 0, &pattern(1, 8 * BS)).unwrap();
        v.sync().unwrap();
        v.write_path("/d2/y", 0, b"later").unwrap();
        v.sync().unwrap();
    }
    // Damage a stored leaf: the tree update's CheckPathRoot must notice before writing.
    bed.store.with_object(&n.meta, |o| o[2 * 32] ^= 1).unwrap();
    let v = bed.open().unwrap();
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
    let v = bed.open().unwrap();
    let mut want = pattern(2, 4 * BS);
    want[..4].copy_from_slice(b"kept");
    assert_eq!(read_all(&v, "/b").unwrap(), want);
}
