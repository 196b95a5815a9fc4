//! Sparse files: extending an `mt-eint` file with a hole far past its end costs O(log n)
//! hashes and Merkle-node writes (holes are all-zero subtrees that are never written), so
//! a write at 1 TiB is immediate; `aead`, which must write every gap block, refuses huge
//! gaps.

mod common;

use common::*;
use intact_core::format::SchemeId;
use intact_core::store::{CountingStore, LocalDirStore, MemStore, MemTrusted, UntrustedStore};
use intact_core::{Error, FsErrorKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u32 = 4096;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
/// Generous bound for a debug build on a loaded machine (appending the holes one leaf at
/// a time took minutes at 1 TiB).
const LIMIT: Duration = Duration::from_secs(20);

fn read_at(vol: &intact_core::Volume, path: &str, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xEE; len];
    let n = vol.read_path(path, off, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Checks the content of `path`: `head` at 0, `tail` at `far`, `extra` (if any) at its
/// offset, zeros around and in the middle of the hole.
fn check(vol: &intact_core::Volume, far: u64, extra: Option<(u64, u8)>) {
    let path = "/sparse";
    assert_eq!(vol.stat(path).unwrap().size, far + 5);
    assert_eq!(read_at(vol, path, 0, 6), b"head\0\0");
    assert_eq!(read_at(vol, path, far - 2, 10), b"\0\0tail!");
    assert_eq!(read_at(vol, path, far / 2 - 3, 8), [0; 8]);
    assert_eq!(read_at(vol, path, far - 3 * BS as u64, 5), [0; 5]);
    if let Some((off, b)) = extra {
        assert_eq!(read_at(vol, path, off - 1, 3), [0, b, 0]);
        assert_eq!(read_at(vol, path, off - BS as u64, 2), [0, 0]);
        assert_eq!(read_at(vol, path, off + BS as u64, 2), [0, 0]);
    }
}

/// Writes "head" at 0 and "tail!" at `far` (a hole in between), syncs, reopens and reads
/// back; then writes one byte at `inside` (in the hole) and checks again after a reopen.
/// Returns the integrity-metadata bytes written.
fn run(
    store: Arc<dyn UntrustedStore>,
    counting: &dyn Fn() -> u64,
    scheme: SchemeId,
    far: u64,
    inside: u64,
) -> u64 {
    let start = Instant::now();
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, scheme, BS);
    vol.create_file("/sparse", Some(scheme)).unwrap();
    vol.write_path("/sparse", 0, b"head").unwrap();
    vol.sync().unwrap();
    let before = counting();
    vol.write_path("/sparse", far, b"tail!").unwrap();
    vol.sync().unwrap();
    let meta = counting() - before;
    check(&vol, far, None);
    drop(vol);

    let vol = open(store.clone(), &trusted).unwrap();
    check(&vol, far, None);
    assert_eq!(vol.stat("/sparse").unwrap().scheme, scheme.name());
    vol.write_path("/sparse", inside, &[0x5A]).unwrap();
    check(&vol, far, Some((inside, 0x5A)));
    vol.sync().unwrap();
    drop(vol);

    let vol = open(store, &trusted).unwrap();
    check(&vol, far, Some((inside, 0x5A)));
    if far <= 64 << 20 {
        // fsck reads every block, holes included: only for the small file.
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }
    drop(vol);
    let took = start.elapsed();
    eprintln!(
        "{} at {far}: {took:?}, {meta} integrity bytes written",
        scheme.name()
    );
    assert!(took < LIMIT, "{}: {took:?}", scheme.name());
    meta
}

#[test]
fn hole_of_one_tib_on_disk() {
    for scheme in [
        SchemeId::MtEintGcm,
        SchemeId::MtEintCbc,
        SchemeId::MacTree,
        SchemeId::None,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(CountingStore::new(
            LocalDirStore::create(dir.path()).unwrap(),
        ));
        let s2 = store.clone();
        let meta = run(
            store,
            &|| s2.stats().integrity.write_bytes,
            scheme,
            TIB,
            4 * GIB + 1,
        );
        // 2^28 hole blocks: the old path wrote 2^29 nodes (16 GiB); now O(log n) nodes.
        assert!(
            meta < 64 << 10,
            "{}: {meta} integrity bytes written",
            scheme.name()
        );
    }
}

/// MemStore holds objects in memory and zero-fills gaps, so the file stays small here:
/// the data written at `far` and the Merkle nodes around flat index `2 * far / BS` are
/// allocated in full.
#[test]
fn hole_in_memory() {
    for scheme in [
        SchemeId::MtEintGcm,
        SchemeId::MtEintCbc,
        SchemeId::MacTree,
        SchemeId::None,
    ] {
        let store = Arc::new(CountingStore::new(MemStore::new()));
        let s2 = store.clone();
        let meta = run(
            store,
            &|| s2.stats().integrity.write_bytes,
            scheme,
            64 << 20,
            (16 << 20) + 1,
        );
        // 2^14 hole blocks: the old path wrote 2^15 nodes (1 MiB).
        assert!(
            meta < 16 << 10,
            "{}: {meta} integrity bytes written",
            scheme.name()
        );
    }
}

#[test]
fn aead_refuses_huge_gaps() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::Aead, BS);
    vol.create_file("/a", Some(SchemeId::Aead)).unwrap();
    vol.write_path("/a", 0, b"head").unwrap();
    vol.sync().unwrap();
    // Refused by the write itself, before anything changes: the volume stays usable.
    let r = vol.write_path("/a", TIB, b"x");
    assert!(
        matches!(
            r,
            Err(Error::Fs {
                kind: FsErrorKind::TooLarge,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(matches!(
        vol.truncate("/a", TIB),
        Err(Error::Fs {
            kind: FsErrorKind::TooLarge,
            ..
        })
    ));
    vol.write_path("/a", 4, b"!").unwrap();
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(read_all(&vol, "/a").unwrap(), b"head!");
    // A small gap is still filled.
    vol.write_path("/a", 10 * BS as u64, b"y").unwrap();
    vol.sync().unwrap();
    let all = read_all(&vol, "/a").unwrap();
    assert_eq!(all.len(), 10 * BS as usize + 1);
    assert_eq!(&all[..5], b"head!");
    assert!(all[5..10 * BS as usize].iter().all(|&b| b == 0));
    assert_eq!(all[10 * BS as usize], b'y');
}

/// fallocate's PUNCH_HOLE inside a file (`Volume::zero_range`): whole blocks become holes
/// where the scheme stores them inside a file (mt-eint: fewer stored bytes), edges and
/// other schemes get zeros; the content matches a model through a rewrite of a punched
/// block, a seal and a reopen, and fsck stays clean.
#[test]
fn punch_hole_inside_a_file() {
    use intact_core::format::ROOT_INO;
    use intact_core::volume::Kind;
    for (s, holes) in [
        (SchemeId::MtEintGcm, true),
        (SchemeId::MtEintCbc, true),
        (SchemeId::MacTree, false),
    ] {
        const BS: usize = 4096;
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, s, BS as u32);
        let ino = vol
            .create_at(ROOT_INO, "f", Kind::File, 0o644, 0, 0, None)
            .unwrap()
            .ino;
        let mut model = pattern(7, 10 * BS);
        vol.write_ino(ino, 0, &model).unwrap();
        vol.sync().unwrap();
        let before = vol.attr(ino).unwrap().stored_bytes;
        // Blocks 3..=6 whole, plus 100 bytes of block 2 and 100 of block 7.
        let (off, len) = (2 * BS + BS - 100, 4 * BS + 200);
        vol.zero_range(ino, off as u64, len as u64, true).unwrap();
        model[off..off + len].fill(0);
        assert_eq!(read_all(&vol, "/f").unwrap(), model, "{s:?}");
        vol.sync().unwrap();
        let after = vol.attr(ino).unwrap().stored_bytes;
        if holes {
            assert_eq!(
                after,
                before - 4 * BS as u64,
                "{s:?}: four blocks are holes"
            );
        } else {
            assert_eq!(after, before, "{s:?}: zeros written");
        }
        // A punch of blocks 1 and 2 only: block 3 keeps its content.
        vol.zero_range(ino, BS as u64, 2 * BS as u64, true).unwrap();
        model[BS..3 * BS].fill(0);
        assert_eq!(read_all(&vol, "/f").unwrap(), model, "{s:?}");
        // A punched block written again (a new counter), sealed, reopened.
        vol.write_ino(ino, 4 * BS as u64 + 10, b"again").unwrap();
        model[4 * BS + 10..4 * BS + 15].copy_from_slice(b"again");
        vol.sync().unwrap();
        drop(vol);
        let vol = open(store, &trusted).unwrap();
        assert_eq!(read_all(&vol, "/f").unwrap(), model, "{s:?}");
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty(), "{s:?}");
    }
}

/// A block punched and written again in the same session takes a counter above the one
/// it had (the punch raises `ctr_hw`): the two GCM ciphertexts of that block do not XOR to
/// the XOR of the plaintexts, as they would under a repeated nonce.
#[test]
fn punched_block_rewritten_never_repeats_a_nonce() {
    use intact_core::format::ROOT_INO;
    use intact_core::volume::Kind;
    const BS: usize = 4096;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, BS as u32);
    let ino = vol
        .create_at(ROOT_INO, "f", Kind::File, 0o644, 0, 0, None)
        .unwrap()
        .ino;
    let p1 = pattern(1, 8 * BS);
    vol.write_ino(ino, 0, &p1).unwrap();
    vol.sync().unwrap();
    let data = format!(
        "f/{}/{}.d",
        &vol.stat("/f").unwrap().file_id[..2],
        vol.stat("/f").unwrap().file_id
    );
    let block = |n: usize| store.read_all(&data).unwrap().unwrap()[n * BS..(n + 1) * BS].to_vec();
    // Block 5 written again: its counter is above blocks 3 and 4's, so a punch that
    // raised `ctr_hw` over only part of the range would let block 5's counter repeat.
    vol.write_ino(ino, 5 * BS as u64, &p1[5 * BS..6 * BS])
        .unwrap();
    vol.sync().unwrap();
    // Blocks 3, 4 and 5 are punched, then each written again.
    let c1: Vec<Vec<u8>> = (3..6).map(block).collect();
    vol.zero_range(ino, 3 * BS as u64, 3 * BS as u64, true)
        .unwrap();
    let p2 = pattern(2, 3 * BS);
    vol.write_ino(ino, 3 * BS as u64, &p2).unwrap();
    vol.sync().unwrap();
    for (k, n) in (3..6).enumerate() {
        let c2 = block(n);
        let xc: Vec<u8> = c1[k].iter().zip(&c2).map(|(a, b)| a ^ b).collect();
        let xp: Vec<u8> = p1[n * BS..(n + 1) * BS]
            .iter()
            .zip(&p2[k * BS..(k + 1) * BS])
            .map(|(a, b)| a ^ b)
            .collect();
        assert_ne!(xc, xp, "block {n} was encrypted twice under one nonce");
    }
    assert_eq!(read_all(&vol, "/f").unwrap()[3 * BS..6 * BS], p2[..]);
}

/// A punch wider than one chunk of the tree update (65,536 leaves; 128-byte blocks keep the
/// file small): every block in the range becomes a hole, the blocks around it stay.
#[test]
fn punch_hole_across_tree_update_chunks() {
    const BS: usize = 128;
    const BLOCKS: usize = 70_000;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, BS as u32);
    vol.create_file("/f", None).unwrap();
    let mut model = pattern(3, BLOCKS * BS);
    vol.write_path("/f", 0, &model).unwrap();
    vol.sync().unwrap();
    let ino = vol.stat("/f").unwrap().ino;
    let (first, end) = (2, BLOCKS - 1000);
    vol.zero_range(ino, (first * BS) as u64, ((end - first) * BS) as u64, true)
        .unwrap();
    model[first * BS..end * BS].fill(0);
    vol.sync().unwrap();
    assert_eq!(read_all(&vol, "/f").unwrap(), model);
    assert_eq!(
        vol.attr(ino).unwrap().stored_bytes,
        ((BLOCKS - (end - first)) * BS) as u64
    );
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(read_all(&vol, "/f").unwrap(), model);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

fn too_large<T: std::fmt::Debug>(r: intact_core::Result<T>) -> bool {
    matches!(
        r,
        Err(Error::Fs {
            kind: FsErrorKind::TooLarge,
            ..
        })
    )
}

/// A store whose objects cannot pass 1 MiB (as ext4's files cannot pass 16 TiB − 4 KiB):
/// a write or truncation that would need a longer data object is refused when it arrives
/// (EFBIG), and the volume goes on: other writes, seals and a reopen work. Before, the
/// write was accepted and the seal that stored it failed, poisoning the volume.
#[test]
fn store_object_limit_is_refused_at_the_request() {
    const MAX: u64 = 1 << 20;
    for scheme in [SchemeId::MtEintGcm, SchemeId::Aead, SchemeId::MacTree] {
        let store = Arc::new(MemStore::with_max_object_len(MAX));
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme, BS);
        vol.create_file("/a", Some(scheme)).unwrap();
        vol.write_path("/a", 0, b"head").unwrap();
        vol.sync().unwrap();
        // aead stores a nonce and a tag beside each block: its data object is longer.
        let fits = if scheme == SchemeId::Aead {
            MAX / (BS as u64 + 28) * BS as u64
        } else {
            MAX
        };
        let r = vol.write_path("/a", fits - 1, b"xy");
        assert!(too_large(r), "{}: write past the limit", scheme.name());
        assert!(too_large(vol.truncate("/a", fits + 1)), "{}", scheme.name());
        // Up to the limit is kept.
        vol.write_path("/a", fits - 1, b"z").unwrap();
        vol.sync().unwrap();
        vol.create_file("/b", Some(scheme)).unwrap();
        vol.write_path("/b", 0, b"other").unwrap();
        vol.sync().unwrap();
        drop(vol);
        let vol = open(store, &trusted).unwrap();
        let a = read_all(&vol, "/a").unwrap();
        assert_eq!(a.len() as u64, fits, "{}", scheme.name());
        assert_eq!((&a[..4], a[a.len() - 1]), (&b"head"[..], b'z'));
        assert_eq!(read_all(&vol, "/b").unwrap(), b"other");
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }
}

/// The local directory store finds its file system's largest file by probing, and leaves
/// nothing behind.
#[test]
fn local_store_probes_the_largest_object() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::create(dir.path()).unwrap();
    let max = store.max_object_len();
    // Every Linux file system here holds at least 2 GiB and at most 2^63 − 1 bytes.
    assert!((2 * GIB..1 << 63).contains(&max), "{max}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    assert_eq!(store.max_object_len(), max, "probed once");
    // Exactly the limit: one more byte is refused by the file system itself.
    let f = std::fs::File::create(dir.path().join("x")).unwrap();
    f.set_len(max).unwrap();
    let e = f.set_len(max + 1).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::EFBIG) | Some(libc::EINVAL)),
        "{e}"
    );
}

/// The limits at their exact boundaries: a file of exactly 2^32 blocks is accepted, one
/// byte more is not; an aead gap of exactly `AEAD_MAX_GAP` blocks past the stored ones is
/// filled, one block more is not (128-byte blocks keep both small: a sparse 512 GiB file
/// on disk, a 128 MiB gap).
#[test]
fn limits_hold_at_their_exact_boundaries() {
    const SMALL: u32 = 128;
    let bs = SMALL as u64;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalDirStore::create(dir.path()).unwrap());
    let trusted = MemTrusted::new();
    let vol = create(store, &trusted, SchemeId::MtEintGcm, SMALL);
    vol.create_file("/a", None).unwrap();
    let end = intact_core::crypto::MAX_BLOCKS * bs;
    vol.write_path("/a", end - 1, b"z").unwrap();
    assert!(too_large(vol.write_path("/a", end - 1, b"zz")));
    assert!(too_large(vol.truncate("/a", end + 1)));
    vol.sync().unwrap();
    assert_eq!(read_at(&vol, "/a", end - 1, 1), b"z");
    drop(vol);

    let (store, trusted) = (Arc::new(MemStore::new()), MemTrusted::new());
    let vol = create(store, &trusted, SchemeId::Aead, SMALL);
    vol.create_file("/g", Some(SchemeId::Aead)).unwrap();
    let stored = 10u64;
    vol.write_path("/g", 0, &vec![1u8; (stored * bs) as usize])
        .unwrap();
    vol.sync().unwrap();
    let gap_end = (stored + intact_core::scheme::AEAD_MAX_GAP) * bs;
    assert!(too_large(vol.truncate("/g", gap_end + 1)));
    vol.truncate("/g", gap_end).unwrap();
    vol.sync().unwrap();
    assert_eq!(read_at(&vol, "/g", gap_end - 1, 1), [0]);
}
