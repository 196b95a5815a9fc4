//! Small files stored small (issues 11 and 18): a file of one block or less is one object in
//! the store. Under `mt-eint` its tree's only node lives in its inode record (the volume's
//! `inline-leaf` feature, docs/file-format.md §4); the node moves to the `.m` object when
//! the file grows past one block and back when it shrinks to one. Under `mt-eint` with GCM,
//! a tree of up to six leaves keeps its leaves' tags in the record too (`inline-tree`)
//! while the counters leave room, so a file of up to six blocks is one object.

mod common;

use common::*;
use intact_core::crypto::KdfParams;
use intact_core::format::SchemeId;
use intact_core::store::{MemStore, MemTrusted, TrustedStore, UntrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use std::sync::Arc;

const BS: u32 = 4096;
const B: usize = BS as usize;

/// The store's objects of `path`'s file, with their lengths.
fn objects(store: &MemStore, vol: &Volume, path: &str) -> Vec<(String, u64)> {
    let id = vol.stat(path).unwrap().file_id;
    let mut v: Vec<(String, u64)> = store
        .list()
        .unwrap()
        .into_iter()
        .filter(|n| n.contains(&id))
        .map(|n| {
            let len = store.len(&n).unwrap().unwrap();
            (n, len)
        })
        .collect();
    v.sort();
    v
}

/// The suffixes (`d`, `m`, `c`) of the objects of `path` that hold bytes.
fn kinds(store: &MemStore, vol: &Volume, path: &str) -> Vec<String> {
    objects(store, vol, path)
        .into_iter()
        .filter(|(_, len)| *len > 0)
        .map(|(n, _)| n.rsplit('.').next().unwrap().to_string())
        .collect()
}

/// fsck's failures, as messages.
fn fsck(vol: &Volume) -> Vec<String> {
    let failures = vol.fsck(&mut |_| {}).unwrap();
    failures.iter().map(|f| format!("{f:?}")).collect()
}

/// A volume whose files keep their data in blocks under their schemes (no `inline-data`):
/// these tests are about the schemes' objects. Small files in the inode table's slots are
/// tested in `volume/inline.rs`, and below in
/// `a_small_mt_eint_file_of_a_default_volume_has_no_object`.
fn new_volume(store: &Arc<MemStore>, trusted: &MemTrusted, scheme: SchemeId) -> Volume {
    create_with(
        store.clone(),
        trusted,
        &CreateOptions {
            block_size: BS,
            scheme,
            kdf: KdfParams::TEST,
            inline_data: false,
            ctr_segments: false,
            twin_blocks: false,
            leaf_log: false,
            log_delta: false,
            ..CreateOptions::default()
        },
    )
}

/// On a volume made with the defaults (`inline-data`), a small `mt-eint` file has no object
/// at all, where every other scheme's has one; both read back after a reopen.
#[test]
fn a_small_mt_eint_file_of_a_default_volume_has_no_object() {
    for (scheme, want) in [
        (SchemeId::MtEintGcm, &[][..]),
        (SchemeId::MtEintCbc, &["d"][..]),
        (SchemeId::MacTree, &["d"][..]),
    ] {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme, BS);
        vol.create_file("/small", Some(scheme)).unwrap();
        vol.write_path("/small", 0, &noise(2, 1024)).unwrap();
        vol.sync().unwrap();
        assert_eq!(kinds(&store, &vol, "/small"), want, "{scheme:?}");
        drop(vol);
        let vol = open(store.clone(), &trusted).unwrap();
        let mut buf = vec![0u8; 2048];
        assert_eq!(vol.read_path("/small", 0, &mut buf).unwrap(), 1024);
        assert_eq!(&buf[..1024], &noise(2, 1024)[..]);
        assert!(fsck(&vol).is_empty(), "{scheme:?}");
    }
}

#[test]
fn a_one_block_file_is_one_object_under_every_scheme() {
    const ONE: &[&str] = &["d"];
    for (scheme, data, want) in [
        (SchemeId::Aead, noise(1, 1024), ONE),
        (SchemeId::MtEintGcm, noise(2, 1024), ONE),
        (SchemeId::MtEintCbc, noise(3, 1024), ONE),
        (SchemeId::None, noise(4, 1024), ONE),
        (SchemeId::MacTree, noise(5, 1024), ONE),
        (SchemeId::MacTree, noise(11, B), ONE),
        (SchemeId::MacTree, vec![], &[]),
        (SchemeId::RandEint, noise(6, 1024), ONE),
        (SchemeId::CompEint, text(7, 1024), ONE),
        (SchemeId::CompEintZstd, text(8, 1024), ONE),
        (SchemeId::MtEintGcm, vec![], &[]),
        (SchemeId::MtEintGcm, noise(9, 1), ONE),
        (SchemeId::MtEintGcm, noise(10, B), ONE),
    ] {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = new_volume(&store, &trusted, scheme);
        vol.create_file("/small", Some(scheme)).unwrap();
        vol.write_path("/small", 0, &data).unwrap();
        vol.sync().unwrap();
        assert_eq!(
            kinds(&store, &vol, "/small"),
            want,
            "{scheme:?}, {} bytes",
            data.len()
        );
        assert!(
            objects(&store, &vol, "/small").len() <= want.len(),
            "{scheme:?}: no empty objects either: {:?}",
            objects(&store, &vol, "/small")
        );
        drop(vol);
        let vol = open(store.clone(), &trusted).unwrap();
        assert_eq!(read_all(&vol, "/small").unwrap(), data, "{scheme:?}");
        // The root directory (a few entries) is one object too.
        assert_eq!(kinds(&store, &vol, "/"), ["d"], "{scheme:?}");
        assert_eq!(fsck(&vol), Vec::<String>::new());
    }
}

/// The node moves between the record and `.m` as the leaf count crosses one, through
/// appends, truncations, holes and punches, and every state reads back after a reopen.
#[test]
fn the_inline_node_follows_the_leaf_count() {
    // With CBC the leaves are keyed hashes of 32 bytes, which the record does not keep:
    // only the one-leaf tree is in the record.
    {
        let scheme = SchemeId::MtEintCbc;
        let steps: [Step; 9] = [
            (
                "one byte",
                |v, m| {
                    v.write_path("/f", 0, b"x").unwrap();
                    *m = b"x".to_vec();
                },
                &["d"],
            ),
            (
                "grow to three blocks",
                |v, m| {
                    let d = pattern(1, 2 * B + 10);
                    v.write_path("/f", 100, &d).unwrap();
                    m.resize(100, 0);
                    m.extend_from_slice(&d);
                },
                &["d", "m"],
            ),
            (
                "cut to one block",
                |v, m| {
                    v.truncate("/f", 3000).unwrap();
                    m.truncate(3000);
                },
                &["d"],
            ),
            (
                "overwrite the block",
                |v, m| {
                    v.write_path("/f", 10, b"again").unwrap();
                    m[10..15].copy_from_slice(b"again");
                },
                &["d"],
            ),
            (
                "cut to nothing",
                |v, m| {
                    v.truncate("/f", 0).unwrap();
                    m.clear();
                },
                &[],
            ),
            (
                "a hole of one block",
                |v, m| {
                    v.truncate("/f", 5).unwrap();
                    m.resize(5, 0);
                },
                &[],
            ),
            (
                "data past a hole",
                |v, m| {
                    let at = 5 * B as u64 + 7;
                    v.write_path("/f", at, b"far").unwrap();
                    m.resize(at as usize, 0);
                    m.extend_from_slice(b"far");
                },
                &["d", "m"],
            ),
            (
                "cut back into the hole",
                |v, m| {
                    v.truncate("/f", 3).unwrap();
                    m.truncate(3);
                },
                // The data object keeps the hole's extent (design.md, "Crash safety").
                &["d"],
            ),
            (
                "write the hole's block",
                |v, m| {
                    v.write_path("/f", 0, b"abc").unwrap();
                    m.copy_from_slice(b"abc");
                },
                &["d"],
            ),
        ];
        walk(scheme, &steps);
    }
}

/// Under `mt-eint` with GCM a tree of two to six leaves keeps its leaves in the record while
/// the counters leave room (16 bytes a leaf and a counter interval, docs/file-format.md
/// §4): it moves to `.m` and back as writes and cuts change its leaves and intervals, and
/// every state reads back after a reopen.
#[test]
fn a_small_gcm_tree_follows_its_leaves_and_intervals() {
    let steps: [Step; 11] = [
        (
            "one byte",
            |v, m| {
                v.write_path("/f", 0, b"x").unwrap();
                *m = b"x".to_vec();
            },
            &["d"],
        ),
        (
            "grow to three blocks",
            |v, m| {
                let d = pattern(1, 2 * B + 10);
                v.write_path("/f", 100, &d).unwrap();
                m.resize(100, 0);
                m.extend_from_slice(&d);
            },
            &["d"],
        ),
        (
            "six blocks written at once: six leaves, one interval",
            |v, m| {
                let d = pattern(2, 6 * B);
                v.write_path("/f", 0, &d).unwrap();
                *m = d;
            },
            &["d"],
        ),
        (
            "seven blocks",
            |v, m| {
                v.write_path("/f", 6 * B as u64, b"seventh").unwrap();
                m.extend_from_slice(b"seventh");
            },
            &["d", "m"],
        ),
        (
            "cut to four blocks",
            |v, m| {
                v.truncate("/f", 4 * B as u64).unwrap();
                m.truncate(4 * B);
            },
            &["d"],
        ),
        (
            "block 1 written again: three intervals",
            |v, m| {
                v.write_path("/f", B as u64 + 5, b"one").unwrap();
                m[B + 5..B + 8].copy_from_slice(b"one");
            },
            &["d"],
        ),
        (
            "block 3 written again: four intervals and four leaves do not fit",
            |v, m| {
                v.write_path("/f", 3 * B as u64 + 5, b"three").unwrap();
                m[3 * B + 5..3 * B + 10].copy_from_slice(b"three");
            },
            &["d", "m"],
        ),
        (
            "cut to two blocks",
            |v, m| {
                v.truncate("/f", 2 * B as u64 - 1).unwrap();
                m.truncate(2 * B - 1);
            },
            &["d"],
        ),
        (
            "a hole of one block past them: three intervals, three leaves",
            |v, m| {
                v.truncate("/f", 3 * B as u64).unwrap();
                m.resize(3 * B, 0);
            },
            &["d"],
        ),
        (
            "two more: three intervals and five leaves do not fit",
            |v, m| {
                v.truncate("/f", 5 * B as u64).unwrap();
                m.resize(5 * B, 0);
            },
            &["d", "m"],
        ),
        (
            "cut to nothing",
            |v, m| {
                v.truncate("/f", 0).unwrap();
                m.clear();
            },
            &[],
        ),
    ];
    walk(SchemeId::MtEintGcm, &steps);
}

/// The record authenticates the leaves it keeps: a four-block file's data object replayed,
/// with two of its blocks swapped, or another file's in its place is caught, naming the
/// block; a `.m` planted beside it (a larger file's tree) is never read.
#[test]
fn a_small_gcm_file_is_fresh_and_ignores_a_planted_tree_object() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = new_volume(&store, &trusted, SchemeId::MtEintGcm);
    for p in ["/a", "/b", "/big"] {
        vol.create_file(p, None).unwrap();
    }
    vol.write_path("/a", 0, &pattern(1, 4 * B)).unwrap();
    vol.write_path("/b", 0, &pattern(2, 4 * B)).unwrap();
    vol.write_path("/big", 0, &pattern(3, 9 * B)).unwrap();
    vol.sync().unwrap();
    let (na, nb, nbig) = (names(&vol, "/a"), names(&vol, "/b"), names(&vol, "/big"));
    assert_eq!(kinds(&store, &vol, "/a"), ["d"]);
    assert_eq!(kinds(&store, &vol, "/big"), ["d", "m"]);
    let old = store.snapshot()[&na.data].clone();
    vol.write_path("/a", B as u64, b"version 2").unwrap();
    vol.sync().unwrap();
    let new = store.snapshot()[&na.data].clone();
    let want = read_all(&vol, "/a").unwrap();
    drop(vol);

    let planted = store.snapshot()[&nbig.meta].clone();
    store.write_at(&na.meta, 0, &planted).unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/a").unwrap(), want);
    drop(vol);

    let mut swapped = new.clone();
    swapped[2 * B..3 * B].copy_from_slice(&new[3 * B..4 * B]);
    swapped[3 * B..4 * B].copy_from_slice(&new[2 * B..3 * B]);
    for (what, bytes, block) in [
        ("replayed", &old, "block 1"),
        ("blocks 2 and 3 swapped", &swapped, "block 2"),
        (
            "another file's",
            &store.snapshot()[&nb.data].clone(),
            "block 0",
        ),
    ] {
        store.set_len(&na.data, 0).unwrap();
        store.write_at(&na.data, 0, bytes).unwrap();
        let vol = open(store.clone(), &trusted).unwrap();
        let e = read_all(&vol, "/a").unwrap_err();
        assert!(e.is_tampered(), "{what}: {e}");
        assert!(e.to_string().contains(block), "{what}: {e}");
    }

    store.set_len(&na.data, 0).unwrap();
    store.write_at(&na.data, 0, &new).unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/a").unwrap(), want);
    assert_eq!(fsck(&vol), Vec::<String>::new());
}

/// A volume made with inline leaves but before inline trees (as the intact before this one
/// made them) keeps a file of two to six blocks in two objects, across sessions, while a
/// file of one block stays one.
#[test]
fn a_volume_without_inline_trees_keeps_small_trees_in_objects() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let t = trusted.clone();
    let vol = Volume::create(
        store.clone(),
        move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
        PW,
        &CreateOptions {
            kdf: KdfParams::TEST,
            inline_tree: false,
            inline_data: false,
            ctr_segments: false,
            twin_blocks: false,
            leaf_log: false,
            log_delta: false,
            ..CreateOptions::default()
        },
        &Options::default(),
    )
    .unwrap();
    vol.create_file("/three", None).unwrap();
    vol.create_file("/one", None).unwrap();
    vol.write_path("/three", 0, &pattern(1, 3 * B)).unwrap();
    vol.write_path("/one", 0, b"small").unwrap();
    vol.sync().unwrap();
    assert_eq!(kinds(&store, &vol, "/three"), ["d", "m"]);
    assert_eq!(kinds(&store, &vol, "/one"), ["d"]);
    drop(vol);
    let config = store.snapshot()["intact.conf"].clone();
    let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(
        config["features"],
        serde_json::json!(["inline-leaf", "dir-tree", "inline-mac-leaf"])
    );
    let vol = open(store.clone(), &trusted).unwrap();
    vol.write_path("/one", B as u64, b"two").unwrap();
    vol.sync().unwrap();
    assert_eq!(kinds(&store, &vol, "/one"), ["d", "m"]);
    assert_eq!(read_all(&vol, "/three").unwrap(), pattern(1, 3 * B));
    assert_eq!(fsck(&vol), Vec::<String>::new());
}

/// A step of [`walk`]: what to do to `/f` (and its model), and the kinds of objects that
/// hold bytes afterwards (`.c` left out).
type Step = (
    &'static str,
    fn(&Volume, &mut Vec<u8>),
    &'static [&'static str],
);

/// Runs `steps` on a new file `/f` of `scheme`; after each, checks the content, the
/// objects, and (after a seal and a reopen) the content again and fsck.
fn walk(scheme: SchemeId, steps: &[Step]) {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = new_volume(&store, &trusted, scheme);
    let mut model: Vec<u8> = Vec::new();
    let p = "/f";
    vol.create_file(p, Some(scheme)).unwrap();
    let mut vol = Some(vol);
    for (what, step, want) in steps {
        let v = vol.as_ref().unwrap();
        step(v, &mut model);
        assert_eq!(read_all(v, p).unwrap(), model, "{scheme:?}: {what}");
        v.sync().unwrap();
        let mut got = kinds(&store, v, p);
        got.retain(|k| k != "c");
        assert_eq!(got, *want, "{scheme:?}: {what}");
        drop(vol.take());
        let v = open(store.clone(), &trusted).unwrap();
        assert_eq!(
            read_all(&v, p).unwrap(),
            model,
            "{scheme:?}: {what}, reopened"
        );
        assert_eq!(fsck(&v), Vec::<String>::new());
        vol = Some(v);
    }
}

/// Under `mac-tree`, level 0 (the first leaf counter, node 0's tag, block 0's tag) stays in
/// the record while the tree has one leaf counter, through overwrites, a cut to nothing
/// (the counter is kept: Yun et al.'s Delete) and a hole over it; it moves to `.m` when a
/// second block is written, and stays there (counters are never dropped, so the tree never
/// shrinks back). A file whose first write lands past a hole has its level 0 in `.m`.
#[test]
fn a_mac_tree_file_keeps_level_0_in_its_record_while_it_has_one_counter() {
    let one_counter: [Step; 6] = [
        (
            "one byte",
            |v, m| {
                v.write_path("/f", 0, b"x").unwrap();
                *m = b"x".to_vec();
            },
            &["d"],
        ),
        (
            "overwrite the block",
            |v, m| {
                v.write_path("/f", 0, b"yz").unwrap();
                *m = b"yz".to_vec();
            },
            &["d"],
        ),
        (
            "cut to nothing",
            |v, m| {
                v.truncate("/f", 0).unwrap();
                m.clear();
            },
            &[],
        ),
        (
            "a hole over the kept counter",
            |v, m| {
                v.truncate("/f", 100).unwrap();
                m.resize(100, 0);
            },
            &[],
        ),
        (
            "write the block again",
            |v, m| {
                v.write_path("/f", 50, b"again").unwrap();
                m[50..55].copy_from_slice(b"again");
            },
            &["d"],
        ),
        (
            "a whole block",
            |v, m| {
                let d = pattern(3, B);
                v.write_path("/f", 0, &d).unwrap();
                *m = d;
            },
            &["d"],
        ),
    ];
    let growing: [Step; 3] = [
        (
            "grow to three blocks",
            |v, m| {
                let d = pattern(1, 2 * B + 10);
                v.write_path("/f", 100, &d).unwrap();
                m.resize(100, 0);
                m.extend_from_slice(&d);
            },
            &["d", "m"],
        ),
        (
            "cut to one block",
            |v, m| {
                v.truncate("/f", 3000).unwrap();
                m.truncate(3000);
            },
            &["d", "m"],
        ),
        (
            "overwrite it",
            |v, m| {
                v.write_path("/f", 10, b"again").unwrap();
                m[10..15].copy_from_slice(b"again");
            },
            &["d", "m"],
        ),
    ];
    let steps: Vec<Step> = one_counter.iter().chain(&growing).copied().collect();
    walk(SchemeId::MacTree, &steps);
    walk(
        SchemeId::MacTree,
        &[
            (
                "a hole of three blocks",
                |v, m| {
                    v.truncate("/f", 3 * B as u64).unwrap();
                    m.resize(3 * B, 0);
                },
                &[],
            ),
            (
                "its last block written",
                |v, m| {
                    v.write_path("/f", 2 * B as u64, b"end").unwrap();
                    m[2 * B..2 * B + 3].copy_from_slice(b"end");
                },
                &["d", "m"],
            ),
        ],
    );
}

/// The record authenticates the one node, so the data object of a one-block file cannot be
/// replayed or swapped, and a stale `.m` left from when the file was larger is ignored.
#[test]
fn a_one_block_file_is_fresh_and_ignores_a_stale_tree_object() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = new_volume(&store, &trusted, SchemeId::MtEintGcm);
    vol.create_file("/a", None).unwrap();
    vol.create_file("/b", None).unwrap();
    vol.write_path("/a", 0, &pattern(1, 8 * B)).unwrap();
    vol.write_path("/b", 0, b"the other file").unwrap();
    vol.sync().unwrap();
    let (na, nb) = (names(&vol, "/a"), names(&vol, "/b"));
    let big_tree = store.snapshot()[&na.meta].clone();
    vol.truncate("/a", 1000).unwrap();
    vol.sync().unwrap();
    let old = store.snapshot()[&na.data].clone();
    vol.write_path("/a", 0, b"version 2").unwrap();
    vol.sync().unwrap();
    let new = store.snapshot()[&na.data].clone();
    let want = read_all(&vol, "/a").unwrap();
    drop(vol);

    // The stale tree object of the eight-block file, put back: nothing reads it.
    store.set_len(&na.meta, 0).unwrap();
    store.write_at(&na.meta, 0, &big_tree).unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/a").unwrap(), want);
    drop(vol);

    // The data object as it was before the last write: caught, naming file and block.
    store.set_len(&na.data, 0).unwrap();
    store.write_at(&na.data, 0, &old).unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    let e = read_all(&vol, "/a").unwrap_err();
    assert!(e.is_tampered(), "{e}");
    assert!(e.to_string().contains("block 0"), "{e}");
    drop(vol);

    // Another file's one-block data object in its place: caught.
    let other = store.snapshot()[&nb.data].clone();
    store.set_len(&na.data, 0).unwrap();
    store.write_at(&na.data, 0, &other).unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    assert!(read_all(&vol, "/a").unwrap_err().is_tampered());
    drop(vol);

    // Back to the current bytes: reads again.
    store.set_len(&na.data, 0).unwrap();
    store.write_at(&na.data, 0, &new).unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/a").unwrap(), want);
}

/// A volume made without the feature (as older intact made them) keeps every node in `.m`,
/// and stays so across sessions.
#[test]
fn a_volume_without_inline_leaves_keeps_its_nodes_in_objects() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let t = trusted.clone();
    let vol = Volume::create(
        store.clone(),
        move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
        PW,
        &CreateOptions {
            block_size: BS,
            scheme: SchemeId::MtEintGcm,
            auto: false,
            kdf: KdfParams::TEST,
            inline_leaf: false,
            dir_tree: false,
            inline_mac: false,
            inline_tree: false,
            inline_data: false,
            ctr_segments: false,
            twin_blocks: false,
            leaf_log: false,
            log_delta: false,
        },
        &Options::default(),
    )
    .unwrap();
    vol.create_file("/f", None).unwrap();
    vol.write_path("/f", 0, b"small").unwrap();
    vol.sync().unwrap();
    assert_eq!(kinds(&store, &vol, "/f"), ["d", "m"]);
    drop(vol);
    let config = store.snapshot()["intact.conf"].clone();
    let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(config["features"], serde_json::json!([]));
    let vol = open(store.clone(), &trusted).unwrap();
    vol.write_path("/f", 5, b" and more").unwrap();
    vol.sync().unwrap();
    assert_eq!(kinds(&store, &vol, "/f"), ["d", "m"]);
    assert_eq!(read_all(&vol, "/f").unwrap(), b"small and more");
    assert_eq!(fsck(&vol), Vec::<String>::new());
}

/// Under `mac-tree` too, the record authenticates a one-block file: a replayed or another
/// file's `.d` is caught naming block 0, and a `.m` planted beside it (another file's level
/// 0, copied under its name) is never read.
#[test]
fn a_one_block_mac_tree_file_is_fresh_and_ignores_a_planted_tree_object() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = new_volume(&store, &trusted, SchemeId::MacTree);
    for p in ["/a", "/b", "/big"] {
        vol.create_file(p, None).unwrap();
    }
    vol.write_path("/a", 0, b"version 1").unwrap();
    vol.write_path("/b", 0, b"the other file").unwrap();
    vol.write_path("/big", 0, &pattern(1, 3 * B)).unwrap();
    vol.sync().unwrap();
    let (na, nb, nbig) = (names(&vol, "/a"), names(&vol, "/b"), names(&vol, "/big"));
    let old = store.snapshot()[&na.data].clone();
    vol.write_path("/a", 0, b"version 2").unwrap();
    vol.sync().unwrap();
    let new = store.snapshot()[&na.data].clone();
    let want = read_all(&vol, "/a").unwrap();
    assert_eq!(kinds(&store, &vol, "/a"), ["d"]);
    drop(vol);

    let planted = store.snapshot()[&nbig.meta].clone();
    store.write_at(&na.meta, 0, &planted).unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/a").unwrap(), want);
    drop(vol);

    for (what, bytes) in [
        ("replayed", &old),
        ("another file's", &store.snapshot()[&nb.data].clone()),
    ] {
        store.set_len(&na.data, 0).unwrap();
        store.write_at(&na.data, 0, bytes).unwrap();
        let vol = open(store.clone(), &trusted).unwrap();
        let e = read_all(&vol, "/a").unwrap_err();
        assert!(e.is_tampered(), "{what}: {e}");
        assert!(e.to_string().contains("block 0"), "{what}: {e}");
    }

    store.set_len(&na.data, 0).unwrap();
    store.write_at(&na.data, 0, &new).unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(read_all(&vol, "/a").unwrap(), want);
}

/// A volume made with inline Merkle leaves but before inline `mac-tree` leaves (as the
/// intact before this one made them) keeps a small `mac-tree` file's level 0 in `.m`,
/// across sessions, while its `mt-eint` files keep their node in the record.
#[test]
fn a_volume_without_inline_mac_tree_leaves_keeps_level_0_in_objects() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let t = trusted.clone();
    let vol = Volume::create(
        store.clone(),
        move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
        PW,
        &CreateOptions {
            kdf: KdfParams::TEST,
            scheme: SchemeId::MacTree,
            inline_mac: false,
            inline_data: false,
            ctr_segments: false,
            twin_blocks: false,
            leaf_log: false,
            log_delta: false,
            ..CreateOptions::default()
        },
        &Options::default(),
    )
    .unwrap();
    vol.create_file("/m", None).unwrap();
    vol.create_file("/e", Some(SchemeId::MtEintGcm)).unwrap();
    vol.write_path("/m", 0, b"small").unwrap();
    vol.write_path("/e", 0, b"small").unwrap();
    vol.sync().unwrap();
    assert_eq!(kinds(&store, &vol, "/m"), ["d", "m"]);
    assert_eq!(kinds(&store, &vol, "/e"), ["d"]);
    drop(vol);
    let config = store.snapshot()["intact.conf"].clone();
    let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(
        config["features"],
        serde_json::json!(["inline-leaf", "dir-tree", "inline-tree"])
    );
    let vol = open(store.clone(), &trusted).unwrap();
    vol.write_path("/m", 5, b" and more").unwrap();
    vol.create_file("/n", None).unwrap();
    vol.write_path("/n", 0, b"new").unwrap();
    vol.sync().unwrap();
    assert_eq!(kinds(&store, &vol, "/m"), ["d", "m"]);
    assert_eq!(kinds(&store, &vol, "/n"), ["d", "m"]);
    assert_eq!(read_all(&vol, "/m").unwrap(), b"small and more");
    assert_eq!(fsck(&vol), Vec::<String>::new());
}
