//! RAND-EINT and COMP-EINT: RTree / RArr stay consistent while blocks move in and out of
//! the tree (a block flipping between random-looking and not, or compressible and not),
//! and all-high-entropy, all-low-entropy and mixed files work.

mod common;

use common::*;
use intact_core::entropy::is_rand;
use intact_core::format::SchemeId;
use intact_core::scheme::{l_c, Compression};
use intact_core::store::{MemStore, MemTrusted, UntrustedStore};
use intact_core::Volume;
use proptest::prelude::*;
use std::sync::Arc;

const NEW: [SchemeId; 3] = [
    SchemeId::RandEint,
    SchemeId::CompEint,
    SchemeId::CompEintZstd,
];

/// Whether a block (plaintext, full) gets an RTree leaf under `scheme`.
fn leafed(scheme: SchemeId, blk: &[u8]) -> bool {
    let mut dst = vec![0u8; l_c(blk.len(), 32, 16) - 1];
    match scheme {
        SchemeId::RandEint => is_rand(blk),
        SchemeId::CompEint => Compression::Deflate.compress(blk, &mut dst).is_none(),
        SchemeId::CompEintZstd => Compression::Zstd.compress(blk, &mut dst).is_none(),
        _ => unreachable!(),
    }
}

fn block_of(kind: u8, seed: u8, bs: usize) -> Vec<u8> {
    match kind % 3 {
        0 => text(seed, bs),
        1 => noise(seed, bs),
        _ => pattern(seed, bs),
    }
}

/// The RTree leaf count, from the Merkle object's length ((2m − 1) · 32 bytes).
fn rtree_leaves(store: &MemStore, vol: &Volume, path: &str) -> u64 {
    let n = names(vol, path);
    let len = store
        .read_all(&n.meta)
        .unwrap()
        .map_or(0, |b| b.len() as u64);
    if len == 0 {
        0
    } else {
        (len / 32).div_ceil(2)
    }
}

/// Checks contents, the leaf count against the model, and (by rewriting block 0, which
/// makes the scheme verify every leaf against the root, that they name distinct written
/// blocks) the whole RTree.
fn check(store: &MemStore, v: &Volume, scheme: SchemeId, bs: usize, model: &[Vec<u8>]) {
    let got = read_all(v, "/f").unwrap();
    assert_eq!(got, model.concat());
    v.sync().unwrap();
    let want = model.iter().filter(|b| leafed(scheme, b)).count() as u64;
    assert_eq!(rtree_leaves(store, v, "/f"), want, "{scheme:?} leaf count");
    if let Some(b0) = model.first() {
        v.write_path("/f", 0, b0).unwrap();
        v.sync().unwrap();
    }
    assert_eq!(read_all(v, "/f").unwrap().len(), model.len() * bs);
}

#[derive(Debug, Clone)]
enum Op {
    /// Write one whole block (at most one past the end: no holes).
    Write {
        block: usize,
        kind: u8,
        seed: u8,
    },
    /// Truncate to whole blocks.
    Truncate {
        blocks: usize,
    },
    /// A run of blocks of alternating kinds.
    Run {
        block: usize,
        count: usize,
        kind: u8,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..10usize, any::<u8>(), any::<u8>()).prop_map(|(block, kind, seed)| Op::Write { block, kind, seed }),
        1 => (0..10usize).prop_map(|blocks| Op::Truncate { blocks }),
        2 => (0..10usize, 1..6usize, any::<u8>()).prop_map(|(block, count, kind)| Op::Run { block, count, kind }),
        1 => Just(Op::Reopen),
    ]
}

fn run(scheme: SchemeId, bs: usize, ops: Vec<Op>) {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let mut vol = create(store.clone(), &trusted, scheme, bs as u32);
    vol.create_file("/f", None).unwrap();
    let mut model: Vec<Vec<u8>> = Vec::new();
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            Op::Write { block, kind, seed } => {
                let b = block.min(model.len());
                let data = block_of(kind, seed, bs);
                vol.write_path("/f", (b * bs) as u64, &data).unwrap();
                if b == model.len() {
                    model.push(data);
                } else {
                    model[b] = data;
                }
            }
            Op::Truncate { blocks } => {
                let t = blocks.min(model.len());
                vol.truncate("/f", (t * bs) as u64).unwrap();
                model.truncate(t);
            }
            Op::Run { block, count, kind } => {
                let b = block.min(model.len());
                let blocks: Vec<Vec<u8>> = (0..count)
                    .map(|k| block_of(kind.wrapping_add(k as u8), n as u8 ^ k as u8, bs))
                    .collect();
                vol.write_path("/f", (b * bs) as u64, &blocks.concat())
                    .unwrap();
                for (k, d) in blocks.into_iter().enumerate() {
                    if b + k < model.len() {
                        model[b + k] = d;
                    } else {
                        model.push(d);
                    }
                }
            }
            Op::Reopen => {
                drop(vol);
                vol = open(store.clone(), &trusted).unwrap();
                check(&store, &vol, scheme, bs, &model);
            }
        }
        assert_eq!(read_all(&vol, "/f").unwrap(), model.concat());
    }
    check(&store, &vol, scheme, bs, &model);
    drop(vol);
    let v = open(store.clone(), &trusted).unwrap();
    check(&store, &v, scheme, bs, &model);
    assert!(v.fsck(&mut |_| {}).unwrap().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 200, ..ProptestConfig::default() })]
    #[test]
    fn flips_keep_rtree_consistent_128(s in 0..3usize, ops in proptest::collection::vec(op(), 1..40)) {
        run(NEW[s], 128, ops);
    }
    #[test]
    fn flips_keep_rtree_consistent_4096(s in 0..3usize, ops in proptest::collection::vec(op(), 1..40)) {
        run(NEW[s], 4096, ops);
    }
}

/// All-high-entropy, all-low-entropy and mixed files of 64 blocks: contents survive a
/// reopen, and exactly the expected blocks have leaves (RAND-EINT: the noisy ones;
/// COMP-EINT: the incompressible ones).
#[test]
fn high_low_and_mixed_files() {
    const BS: usize = 4096;
    for scheme in NEW {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, scheme, BS as u32);
        let files = [
            ("/high", noise(1, 64 * BS)),
            ("/low", text(2, 64 * BS)),
            ("/mixed", mixed(3, 64 * BS)),
        ];
        for (p, d) in &files {
            vol.create_file(p, None).unwrap();
            vol.write_path(p, 0, d).unwrap();
        }
        vol.sync().unwrap();
        drop(vol);
        let vol = open(store.clone(), &trusted).unwrap();
        for ((p, d), want) in files.iter().zip([64, 0, 32]) {
            assert_eq!(&read_all(&vol, p).unwrap(), d, "{scheme:?} {p}");
            assert_eq!(rtree_leaves(&store, &vol, p), want, "{scheme:?} {p} leaves");
        }
        // Flip the high file's middle to text and the low file's to noise, and back.
        vol.write_path("/high", 10 * BS as u64, &text(7, 20 * BS))
            .unwrap();
        vol.write_path("/low", 10 * BS as u64, &noise(7, 20 * BS))
            .unwrap();
        vol.sync().unwrap();
        assert_eq!(rtree_leaves(&store, &vol, "/high"), 44);
        assert_eq!(rtree_leaves(&store, &vol, "/low"), 20);
        let mut high = files[0].1.clone();
        high[10 * BS..30 * BS].copy_from_slice(&text(7, 20 * BS));
        assert_eq!(read_all(&vol, "/high").unwrap(), high);
        vol.truncate("/low", 15 * BS as u64).unwrap();
        vol.sync().unwrap();
        assert_eq!(rtree_leaves(&store, &vol, "/low"), 5);
        drop(vol);
        let vol = open(store.clone(), &trusted).unwrap();
        assert_eq!(read_all(&vol, "/high").unwrap(), high);
        let mut low = files[1].1[..15 * BS].to_vec();
        low[10 * BS..].copy_from_slice(&noise(7, 20 * BS)[..5 * BS]);
        assert_eq!(read_all(&vol, "/low").unwrap(), low);
    }
}

/// A written block whose ciphertext is replaced by zeros is rejected under RAND-EINT even
/// though its leafless neighbours are accepted by the entropy test alone, and a hole (counter
/// 0) reads as zeros whatever its stored bytes.
#[test]
fn zero_ciphertext_and_holes() {
    const BS: usize = 4096;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::RandEint, BS as u32);
    vol.create_file("/t", None).unwrap();
    vol.write_path("/t", 0, &text(1, 2 * BS)).unwrap();
    vol.write_path("/t", 5 * BS as u64, &text(2, BS)).unwrap();
    vol.sync().unwrap();
    let n = names(&vol, "/t");
    drop(vol);
    // Garbage where the holes are (blocks 2..5) is never read.
    store
        .with_object(&n.data, |o| {
            o[2 * BS..5 * BS].fill(0xa5);
        })
        .unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    let got = read_all(&vol, "/t").unwrap();
    assert!(got[2 * BS..5 * BS].iter().all(|&b| b == 0));
    drop(vol);
    store
        .with_object(&n.data, |o| o[BS..2 * BS].fill(0))
        .unwrap();
    let vol = open(store.clone(), &trusted).unwrap();
    match read_all(&vol, "/t") {
        Err(intact_core::Error::Tampered { block, .. }) => assert_eq!(block, Some(1)),
        other => panic!("zeroed block not detected: {other:?}"),
    }
}
