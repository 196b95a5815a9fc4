//! The twelve tampering and rollback attacks of docs/threat-model.md ("The twelve attacks"),
//! run against a scratch volume in any untrusted store.
//!
//! Used by `tests/attacks.rs` (over a [`crate::store::MemStore`], for every scheme) and by
//! `intact bench attacks` (over the local directory store, so a user can check the claims on
//! their own machine). Each attack builds the same small volume ([`Fixture`]), manipulates
//! the untrusted store while the volume is closed (the trusted anchor is kept, as the threat
//! model says), reopens and reads. A detected attack fails with an integrity error that
//! names the file, and the block where one applies; [`judge`] checks that, and that what a
//! scheme misses is exactly what the threat model documents ([`documented_misses`]).

use crate::error::{Error, Result, Subject};
use crate::format::{ObjectNames, SchemeId};
use crate::store::UntrustedStore;
use crate::volume::{CreateOptions, Volume};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Where a scratch volume lives: its untrusted store and its trusted anchor. One bed holds
/// one volume; each attack gets a fresh bed.
pub trait Bed {
    /// The untrusted store, which the attacks manipulate.
    fn store(&self) -> Arc<dyn UntrustedStore>;
    /// Creates the volume in the (empty) store.
    fn create(&self, copts: &CreateOptions) -> Result<Volume>;
    /// Opens the volume against the kept anchor.
    fn open(&self) -> Result<Volume>;
}

/// How the fixture's file contents are made. RAND-EINT and COMP-EINT take different paths
/// for each: random-looking blocks need a Merkle leaf, low-entropy or compressible ones do
/// not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// A uniform byte histogram: random-looking to IsRand, yet compressible ([`pattern`]).
    Pattern,
    /// Low-entropy, compressible text ([`text`]).
    Text,
    /// Random-looking and incompressible ([`noise`]).
    Noise,
    /// Alternating 4 KiB stretches of noise and text ([`mixed`]).
    Mixed,
}

impl Content {
    /// Every kind, in order.
    pub const ALL: [Content; 4] = [
        Content::Pattern,
        Content::Text,
        Content::Noise,
        Content::Mixed,
    ];

    /// `len` bytes of this kind, different for each `seed`.
    pub fn bytes(self, seed: u8, len: usize) -> Vec<u8> {
        match self {
            Content::Pattern => pattern(seed, len),
            Content::Text => text(seed, len),
            Content::Noise => noise(seed, len),
            Content::Mixed => mixed(seed, len),
        }
    }

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Content::Pattern => "pattern",
            Content::Text => "text",
            Content::Noise => "noise",
            Content::Mixed => "mixed",
        }
    }

    /// The kind named `name`.
    pub fn by_name(name: &str) -> Option<Content> {
        Content::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Bytes with a uniform histogram over each 256 (random-looking to the entropy test) that
/// still compress.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).rotate_left(3) ^ (i >> 8) as u8)
        .collect()
}

/// Low-entropy, compressible text (seeded).
pub fn text(seed: u8, len: usize) -> Vec<u8> {
    let words = [
        "integrity ",
        "of ",
        "the ",
        "block ",
        "counter ",
        "tree ",
        "fresh ",
        "data ",
    ];
    let mut out = Vec::with_capacity(len + 16);
    let mut x = u32::from(seed).wrapping_mul(2654435761).wrapping_add(1);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out.extend_from_slice(words[(x % 8) as usize].as_bytes());
    }
    out.truncate(len);
    out
}

/// Random-looking, incompressible bytes (seeded; BLAKE3 XOF).
pub fn noise(seed: u8, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(&[seed, 0x6e])
        .finalize_xof()
        .fill(&mut out);
    out
}

/// Alternating 4 KiB stretches of [`noise`] and [`text`] (each block of 4 KiB or less is one
/// or the other; larger blocks mix both).
pub fn mixed(seed: u8, len: usize) -> Vec<u8> {
    let (n, t) = (noise(seed, len), text(seed, len));
    (0..len)
        .map(|i| {
            if (i / 4096 + seed as usize).is_multiple_of(2) {
                n[i]
            } else {
                t[i]
            }
        })
        .collect()
}

/// The attacked volume: `/a` (4 blocks), `/b` (4 blocks), `/c` (1 block), `/d1/x` (2 blocks)
/// and `/d2/y` (100 bytes), sealed, in a closed volume.
pub struct Fixture<'b> {
    bed: &'b dyn Bed,
    store: Arc<dyn UntrustedStore>,
    scheme: SchemeId,
    block_size: usize,
    content: Content,
}

/// A copy of every object of a store.
type Snapshot = BTreeMap<String, Vec<u8>>;

impl<'b> Fixture<'b> {
    /// Builds the fixture in `bed` with files under `copts.scheme`.
    pub fn new(bed: &'b dyn Bed, copts: &CreateOptions, content: Content) -> Result<Fixture<'b>> {
        let bs = copts.block_size as usize;
        let vol = bed.create(copts)?;
        for (path, seed, len) in [
            ("/a", 1, 4 * bs),
            ("/b", 2, 4 * bs),
            ("/c", 3, bs),
            ("/d1/x", 4, 2 * bs),
            ("/d2/y", 5, 100),
        ] {
            if let Some(dir) = path
                .rsplit_once('/')
                .map(|(d, _)| d)
                .filter(|d| !d.is_empty())
            {
                if vol.stat(dir).is_err() {
                    vol.mkdir(dir)?;
                }
            }
            vol.create_file(path, None)?;
            vol.write_path(path, 0, &content.bytes(seed, len))?;
        }
        vol.sync()?;
        drop(vol);
        Ok(Fixture {
            bed,
            store: bed.store(),
            scheme: copts.scheme,
            block_size: bs,
            content,
        })
    }

    fn vol(&self) -> Result<Volume> {
        self.bed.open()
    }

    fn names(&self, path: &str) -> Result<ObjectNames> {
        let id = self.vol()?.stat(path)?.file_id;
        let id: [u8; 16] = hex::decode(&id)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| Error::Invalid(format!("{path}: bad file id {id}")))?;
        Ok(ObjectNames::of(&id))
    }

    /// Byte range of block `i` in the data object.
    fn block(&self, i: usize) -> std::ops::Range<usize> {
        let stride = if self.scheme == SchemeId::Aead {
            self.block_size + 28
        } else {
            self.block_size
        };
        i * stride..(i + 1) * stride
    }

    /// A change through the volume, sealed.
    fn change(&self, f: impl FnOnce(&Volume) -> Result<()>) -> Result<()> {
        let v = self.vol()?;
        f(&v)?;
        v.sync()
    }

    /// An unrelated later commit: the journal the anchor names (which is replayed, and so
    /// would re-apply the latest image of what it covers) then no longer covers `/a`, `/c`
    /// or the root directory, so the attacks meet only the objects they target.
    fn settle(&self) -> Result<()> {
        self.change(|v| v.write_path("/d2/y", 0, b"later").map(|_| ()))
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let mut snap = Snapshot::new();
        for name in self.store.list()? {
            if let Some(bytes) = self.store.read_all(&name)? {
                snap.insert(name, bytes);
            }
        }
        Ok(snap)
    }

    /// Puts the named objects back as they are in `snap` (deleting those it lacks).
    fn restore_objects(&self, snap: &Snapshot, names: &[&String]) -> Result<()> {
        for n in names {
            match snap.get(*n) {
                Some(bytes) => self.store.replace(n, bytes)?,
                None => self.store.delete(n)?,
            }
        }
        self.store.sync_all()
    }

    /// Puts the whole store back as it is in `snap`.
    fn restore_all(&self, snap: &Snapshot) -> Result<()> {
        let now: BTreeSet<String> = self.store.list()?.into_iter().collect();
        let names: Vec<&String> = now.iter().chain(snap.keys()).collect();
        self.restore_objects(snap, &names)
    }

    /// Applies `f` to object `name`'s bytes and stores the result.
    fn edit(&self, name: &str, f: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        let mut bytes = self
            .store
            .read_all(name)?
            .ok_or_else(|| Error::Invalid(format!("object {name} is missing")))?;
        f(&mut bytes);
        self.store.replace(name, &bytes)?;
        self.store.sync_all()
    }
}

/// What happened when the attacked volume was read.
#[derive(Debug)]
pub enum Outcome {
    /// The open or the read failed (the error as returned).
    Detected(Error),
    /// The read succeeded: the bytes returned (a directory's names, joined).
    Undetected(Vec<u8>),
}

impl Outcome {
    /// The integrity failure behind a detection: an open that failed for the whole volume
    /// carries what the anchor and the store each hold, and the failure itself is its
    /// cause.
    pub fn failure(&self) -> Option<&Error> {
        match self {
            Outcome::Detected(Error::StateMismatch { cause, .. }) => Some(cause),
            Outcome::Detected(e) => Some(e),
            Outcome::Undetected(_) => None,
        }
    }

    /// One line for a report.
    pub fn text(&self) -> String {
        match self {
            Outcome::Detected(e) => match self.failure() {
                Some(cause) if !matches!(e, Error::Tampered { .. }) => {
                    format!("open refused: {cause}")
                }
                _ => e.to_string(),
            },
            Outcome::Undetected(bytes) => format!("undetected ({} bytes read)", bytes.len()),
        }
    }
}

fn read_outcome(fx: &Fixture, path: &str) -> Outcome {
    let vol = match fx.vol() {
        Ok(v) => v,
        Err(e) => return Outcome::Detected(e),
    };
    let read = || -> Result<Vec<u8>> {
        let size = vol.stat(path)?.size as usize;
        let mut buf = vec![0u8; size];
        let n = vol.read_path(path, 0, &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    };
    match read() {
        Ok(b) => Outcome::Undetected(b),
        Err(e) => Outcome::Detected(e),
    }
}

fn list_outcome(fx: &Fixture, path: &str) -> Outcome {
    let vol = match fx.vol() {
        Ok(v) => v,
        Err(e) => return Outcome::Detected(e),
    };
    match vol.readdir(path) {
        Ok(entries) => Outcome::Undetected(entries.iter().flat_map(|e| e.name.bytes()).collect()),
        Err(e) => Outcome::Detected(e),
    }
}

fn flip_bit(fx: &Fixture) -> Result<Outcome> {
    let n = fx.names("/a")?;
    let r = fx.block(1);
    fx.edit(&n.data, |o| o[r.start + 100] ^= 0x10)?;
    Ok(read_outcome(fx, "/a"))
}

fn swap_blocks(fx: &Fixture) -> Result<Outcome> {
    let n = fx.names("/a")?;
    let (r0, r1) = (fx.block(0), fx.block(1));
    fx.edit(&n.data, |o| {
        let b0 = o[r0.clone()].to_vec();
        let b1 = o[r1.clone()].to_vec();
        o[r0].copy_from_slice(&b1);
        o[r1].copy_from_slice(&b0);
    })?;
    Ok(read_outcome(fx, "/a"))
}

fn copy_from_other_file(fx: &Fixture) -> Result<Outcome> {
    let (na, nb) = (fx.names("/a")?, fx.names("/b")?);
    let r = fx.block(1);
    let other = fx
        .store
        .read_all(&nb.data)?
        .ok_or_else(|| Error::Invalid("/b has no data object".into()))?[r.clone()]
    .to_vec();
    fx.edit(&na.data, |o| o[r].copy_from_slice(&other))?;
    Ok(read_outcome(fx, "/a"))
}

fn replay_block(fx: &Fixture) -> Result<Outcome> {
    let n = fx.names("/a")?;
    let old = fx.snapshot()?;
    let bs = fx.block_size;
    fx.change(|v| {
        v.write_path("/a", bs as u64, &fx.content.bytes(9, bs))
            .map(|_| ())
    })?;
    fx.settle()?;
    // The block's older ciphertext, with its older metadata (tree nodes, counters).
    let r = fx.block(1);
    let old_block = old
        .get(&n.data)
        .ok_or_else(|| Error::Invalid("/a had no data object".into()))?[r.clone()]
    .to_vec();
    fx.edit(&n.data, |o| o[r].copy_from_slice(&old_block))?;
    fx.restore_objects(&old, &[&n.meta, &n.ctrs])?;
    Ok(read_outcome(fx, "/a"))
}

fn rollback_file(fx: &Fixture) -> Result<Outcome> {
    let n = fx.names("/a")?;
    let old = fx.snapshot()?;
    let len = 4 * fx.block_size;
    fx.change(|v| {
        v.write_path("/a", 0, &fx.content.bytes(10, len))
            .map(|_| ())
    })?;
    fx.settle()?;
    fx.restore_objects(&old, &[&n.data, &n.meta, &n.ctrs])?;
    Ok(read_outcome(fx, "/a"))
}

fn rollback_volume(fx: &Fixture) -> Result<Outcome> {
    let old = fx.snapshot()?;
    let len = 4 * fx.block_size;
    fx.change(|v| {
        v.write_path("/a", 0, &fx.content.bytes(11, len))
            .map(|_| ())
    })?;
    fx.restore_all(&old)?;
    Ok(read_outcome(fx, "/a"))
}

fn truncate_object(fx: &Fixture) -> Result<Outcome> {
    let n = fx.names("/a")?;
    let keep = fx.block(1).start;
    fx.edit(&n.data, |o| o.truncate(keep))?;
    Ok(read_outcome(fx, "/a"))
}

fn delete_objects(fx: &Fixture) -> Result<Outcome> {
    let n = fx.names("/a")?;
    for o in [&n.data, &n.meta, &n.ctrs] {
        fx.store.delete(o)?;
    }
    fx.store.sync_all()?;
    Ok(read_outcome(fx, "/a"))
}

fn swap_files(fx: &Fixture) -> Result<Outcome> {
    let (na, nb) = (fx.names("/a")?, fx.names("/b")?);
    let snap = fx.snapshot()?;
    let mut swapped = Snapshot::new();
    for (x, y) in [
        (&na.data, &nb.data),
        (&na.meta, &nb.meta),
        (&na.ctrs, &nb.ctrs),
    ] {
        for (to, from) in [(x, y), (y, x)] {
            if let Some(bytes) = snap.get(from) {
                swapped.insert(to.clone(), bytes.clone());
            }
            fx.restore_objects(&swapped, &[to])?;
        }
    }
    Ok(read_outcome(fx, "/a"))
}

fn move_between_dirs(fx: &Fixture) -> Result<Outcome> {
    // At the store level, "moving /d1/x into /d2" means making /d2's objects hold /d1's
    // entries (the adversary cannot write a directory it cannot decrypt).
    let (n1, n2) = (fx.names("/d1")?, fx.names("/d2")?);
    let snap = fx.snapshot()?;
    // A small directory keeps its one tree node in its record (no `.m`): what is moved is
    // then only the data object, and a missing one is moved as missing.
    for (from, to) in [(&n1.data, &n2.data), (&n1.meta, &n2.meta)] {
        let moved: Snapshot = snap
            .get(from)
            .map(|b| (to.clone(), b.clone()))
            .into_iter()
            .collect();
        fx.restore_objects(&moved, &[to])?;
    }
    Ok(list_outcome(fx, "/d2"))
}

fn resurrect(fx: &Fixture) -> Result<Outcome> {
    let old = fx.snapshot()?;
    let live: Vec<String> = {
        let v = fx.vol()?;
        let ids = ["/a", "/b", "/d1", "/d2", "/d1/x", "/d2/y"]
            .iter()
            .map(|p| v.stat(p).map(|s| s.file_id))
            .collect::<Result<Vec<_>>>()?;
        v.unlink("/c")?;
        v.sync()?;
        ids
    };
    fx.settle()?;
    // Bring back the deleted file's objects, and the root directory and inode table as they
    // were when it existed.
    let restore: Vec<&String> = old
        .keys()
        .filter(|k| k.starts_with("f/"))
        .filter(|k| !live.iter().any(|id| k.contains(id.as_str())))
        .collect();
    fx.restore_objects(&old, &restore)?;
    Ok(read_outcome(fx, "/c"))
}

fn zero_block(fx: &Fixture) -> Result<Outcome> {
    let n = fx.names("/a")?;
    let r = fx.block(2);
    fx.edit(&n.data, |o| o[r].fill(0))?;
    Ok(read_outcome(fx, "/a"))
}

/// One of the twelve attacks.
pub struct Attack {
    /// 1 to 12, as in docs/threat-model.md.
    pub number: usize,
    /// What the adversary does.
    pub name: &'static str,
    /// The path whose read must fail ("" when the failure may name the structure: the
    /// inode table, the anchor, a directory).
    pub path: &'static str,
    /// The block the failure names, where one applies.
    pub block: Option<u64>,
    run: fn(&Fixture) -> Result<Outcome>,
}

impl Attack {
    /// Runs the attack on a fixture built for it (which it spends).
    pub fn run(&self, fx: &Fixture) -> Result<Outcome> {
        (self.run)(fx)
    }
}

/// The twelve attacks, in the order of docs/threat-model.md.
pub const ATTACKS: [Attack; 12] = [
    Attack {
        number: 1,
        name: "bit flipped in a data block",
        path: "/a",
        block: Some(1),
        run: flip_bit,
    },
    Attack {
        number: 2,
        name: "two blocks swapped",
        path: "/a",
        block: Some(0),
        run: swap_blocks,
    },
    Attack {
        number: 3,
        name: "block copied from another file",
        path: "/a",
        block: Some(1),
        run: copy_from_other_file,
    },
    Attack {
        number: 4,
        name: "one block replayed with its metadata",
        path: "/a",
        block: Some(1),
        run: replay_block,
    },
    Attack {
        number: 5,
        name: "whole file rolled back",
        path: "/a",
        block: None,
        run: rollback_file,
    },
    Attack {
        number: 6,
        name: "whole cipher directory rolled back",
        path: "",
        block: None,
        run: rollback_volume,
    },
    Attack {
        number: 7,
        name: "backing object truncated",
        path: "/a",
        block: Some(1),
        run: truncate_object,
    },
    Attack {
        number: 8,
        name: "a file's objects deleted",
        path: "/a",
        block: None,
        run: delete_objects,
    },
    Attack {
        number: 9,
        name: "two files' objects swapped",
        path: "/a",
        block: None,
        run: swap_files,
    },
    Attack {
        number: 10,
        name: "file moved between directories",
        path: "/d2",
        block: None,
        run: move_between_dirs,
    },
    Attack {
        number: 11,
        name: "deleted file resurrected",
        path: "",
        block: None,
        run: resurrect,
    },
    Attack {
        number: 12,
        name: "data block overwritten with zeros",
        path: "/a",
        block: Some(2),
        run: zero_block,
    },
];

/// The attacks a scheme cannot detect, by design (docs/threat-model.md).
pub fn documented_misses(scheme: SchemeId) -> &'static [usize] {
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

/// The block an attack's failure names under `scheme`.
pub fn expected_block(scheme: SchemeId, attack: &Attack) -> Option<u64> {
    match (scheme, attack.number) {
        // A counter node's MAC covers the counters of 64 blocks: a replayed node is
        // caught as a whole, and the failure names the first block read under it.
        (SchemeId::MacTree, 4) => Some(0),
        _ => attack.block,
    }
}

/// Whether an outcome is what docs/threat-model.md promises for `scheme`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Detected, with an integrity failure naming the file (and block) as documented.
    Detected,
    /// Not detected, as documented for this scheme (the reader got old or garbled data).
    MissedAsDocumented,
    /// Not what the documentation says: why.
    Unexpected(String),
}

/// Compares an outcome with the documented behaviour of `scheme`.
pub fn judge(scheme: SchemeId, attack: &Attack, outcome: &Outcome) -> Verdict {
    let documented_miss = documented_misses(scheme).contains(&attack.number);
    match (outcome.failure(), documented_miss) {
        (Some(Error::Tampered { subject, block, .. }), false) => {
            if !attack.path.is_empty() && subject != &Subject::Path(attack.path.to_string()) {
                return Verdict::Unexpected(format!(
                    "detected, but the failure names {subject} instead of {}",
                    attack.path
                ));
            }
            let want = expected_block(scheme, attack);
            if want.is_some() && *block != want {
                return Verdict::Unexpected(format!(
                    "detected, but the failure names block {block:?} instead of {want:?}"
                ));
            }
            Verdict::Detected
        }
        (Some(e), false) => Verdict::Unexpected(format!("failed with a non-integrity error: {e}")),
        (None, false) => Verdict::Unexpected("NOT detected".into()),
        (None, true) => Verdict::MissedAsDocumented,
        (Some(e), true) => Verdict::Unexpected(format!(
            "documented as missed by {}, but detected: {e}",
            scheme.name()
        )),
    }
}

/// One attack's result.
pub struct Run {
    /// Which attack.
    pub attack: &'static Attack,
    /// What the read returned.
    pub outcome: Outcome,
    /// Against the documentation.
    pub verdict: Verdict,
}

/// Runs the twelve attacks against `copts.scheme`, each on a fresh bed from `bed`, with
/// `content` in the files. An error is a failure of the harness (the store, the fixture),
/// never an attack's outcome.
pub fn run_all(
    bed: &mut dyn FnMut() -> Result<Box<dyn Bed>>,
    copts: &CreateOptions,
    content: Content,
) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    for attack in &ATTACKS {
        let b = bed()?;
        let fx = Fixture::new(b.as_ref(), copts, content)?;
        let outcome = attack.run(&fx)?;
        let verdict = judge(copts.scheme, attack, &outcome);
        runs.push(Run {
            attack,
            outcome,
            verdict,
        });
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tampered(path: &str, block: Option<u64>) -> Outcome {
        Outcome::Detected(Error::Tampered {
            subject: Subject::Path(path.into()),
            block,
            what: "test".into(),
        })
    }

    fn unexpected(v: Verdict) -> bool {
        matches!(v, Verdict::Unexpected(_))
    }

    #[test]
    fn a_detection_must_name_the_file_and_the_block() {
        let flip = &ATTACKS[0];
        assert_eq!(
            judge(SchemeId::MtEintGcm, flip, &tampered("/a", Some(1))),
            Verdict::Detected
        );
        assert!(unexpected(judge(
            SchemeId::MtEintGcm,
            flip,
            &tampered("/b", Some(1))
        )));
        assert!(unexpected(judge(
            SchemeId::MtEintGcm,
            flip,
            &tampered("/a", Some(2))
        )));
        assert!(unexpected(judge(
            SchemeId::MtEintGcm,
            flip,
            &tampered("/a", None)
        )));
        // An attack on the structure may name anything, and no block.
        let rollback = &ATTACKS[5];
        let e = Outcome::Detected(Error::Tampered {
            subject: Subject::InodeTable,
            block: Some(7),
            what: "test".into(),
        });
        assert_eq!(judge(SchemeId::MtEintGcm, rollback, &e), Verdict::Detected);
        // mac-tree names the first block under a replayed counter node.
        let replay = &ATTACKS[3];
        assert_eq!(
            judge(SchemeId::MacTree, replay, &tampered("/a", Some(0))),
            Verdict::Detected
        );
        assert!(unexpected(judge(
            SchemeId::MtEintGcm,
            replay,
            &tampered("/a", Some(0))
        )));
    }

    #[test]
    fn only_integrity_failures_count_and_misses_must_be_documented() {
        let flip = &ATTACKS[0];
        let io = Outcome::Detected(Error::Invalid("disk on fire".into()));
        assert!(unexpected(judge(SchemeId::MtEintGcm, flip, &io)));
        let read = Outcome::Undetected(vec![1]);
        assert!(unexpected(judge(SchemeId::MtEintGcm, flip, &read)));
        assert_eq!(
            judge(SchemeId::None, flip, &read),
            Verdict::MissedAsDocumented
        );
        // A documented miss that is detected is a documentation error too.
        assert!(unexpected(judge(
            SchemeId::None,
            flip,
            &tampered("/a", Some(1))
        )));
        let replay = &ATTACKS[3];
        assert_eq!(
            judge(SchemeId::Aead, replay, &read),
            Verdict::MissedAsDocumented
        );
        assert!(unexpected(judge(SchemeId::Aead, flip, &read)));
    }

    #[test]
    fn the_attacks_are_numbered_in_order() {
        for (i, a) in ATTACKS.iter().enumerate() {
            assert_eq!(a.number, i + 1);
        }
    }

    /// The fixtures of the attack, crash and model tests are made of these bytes: they must
    /// not change under a test that expects them.
    #[test]
    fn content_is_frozen() {
        let digest = |c: Content| blake3::hash(&c.bytes(7, 10_000)).to_hex()[..16].to_string();
        let got: Vec<String> = Content::ALL.into_iter().map(digest).collect();
        assert_eq!(got, FROZEN_CONTENT, "{got:?}");
    }

    const FROZEN_CONTENT: [&str; 4] = [
        "d65fa8d6def9b20c",
        "7f4a0b00e9b611b6",
        "ae2cd6bf3f7861ea",
        "1d292a04ab5e3d59",
    ];

    #[test]
    fn outcomes_read_plainly() {
        let t = tampered("/a", Some(1));
        assert_eq!(t.text(), t.failure().unwrap().to_string());
        // An open refused for the whole volume: tests/attacks.rs (attack 6).
        assert_eq!(
            Outcome::Undetected(vec![0; 5]).text(),
            "undetected (5 bytes read)"
        );
    }

    #[test]
    fn content_kinds_differ_and_are_named() {
        for c in Content::ALL {
            assert_eq!(Content::by_name(c.name()), Some(c));
            assert_eq!(c.bytes(1, 5000).len(), 5000);
            assert_ne!(c.bytes(1, 64), c.bytes(2, 64));
        }
        assert_eq!(Content::by_name("zeros"), None);
        // What each kind is for: which blocks the entropy test calls random-looking.
        let rand = |c: Content| crate::entropy::is_rand(&c.bytes(3, 4096));
        assert!(rand(Content::Pattern));
        assert!(!rand(Content::Text));
        assert!(rand(Content::Noise));
    }
}
