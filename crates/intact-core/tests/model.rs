//! Property test: random sequences of write / truncate / rename / unlink / sync / reopen
//! against a simple in-memory model, for every scheme at 128, 4096 and 65536-byte blocks.
//! After every operation the touched files, and at the end all files, equal the model.
//! The `concurrent_*` tests run two or three such clients at once, on files of their own.

mod common;

use common::*;
use intact_core::format::SchemeId;
use intact_core::store::{MemStore, MemTrusted};
use intact_core::Volume;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const SLOTS: [&str; 4] = ["/a", "/b", "/d/c", "/d/e"];

#[derive(Debug, Clone)]
enum Op {
    /// Write `len` bytes at `off` (offsets in units scaled by the block size below).
    Write {
        slot: usize,
        off: u32,
        len: u32,
        seed: u8,
    },
    Truncate {
        slot: usize,
        size: u32,
    },
    Rename {
        from: usize,
        to: usize,
    },
    Unlink {
        slot: usize,
    },
    Sync,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4usize, 0..6000u32, 0..3000u32, any::<u8>()).prop_map(|(slot, off, len, seed)| Op::Write { slot, off, len, seed }),
        2 => (0..4usize, 0..7000u32).prop_map(|(slot, size)| Op::Truncate { slot, size }),
        1 => (0..4usize, 0..4usize).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => (0..4usize).prop_map(|slot| Op::Unlink { slot }),
        1 => Just(Op::Sync),
        1 => Just(Op::Reopen),
    ]
}

/// Maps the op's abstract offsets (0..6000, in thousandths of a block, up to ~6 blocks)
/// onto byte offsets for block size `bs`, keeping block-boundary cases likely.
fn scale(x: u32, bs: usize) -> usize {
    let blocks = x as usize / 1000;
    let within = x as usize % 1000;
    let part = match within % 5 {
        0 => 0,
        1 => 1,
        2 => bs - 1,
        3 => (within * bs) / 1000,
        _ => bs / 2,
    };
    blocks * bs + part
}

/// File contents of three kinds, so that RAND-EINT and COMP-EINT blocks move between
/// having an RTree leaf and not: `pattern` (random-looking but compressible), `text` (low
/// entropy) and `noise` (random-looking, incompressible).
fn content(seed: u8, len: usize) -> Vec<u8> {
    match seed % 3 {
        0 => pattern(seed, len),
        1 => text(seed, len),
        _ => noise(seed, len),
    }
}

/// Applies `op` to `v` and to `model`, over the files `slots`, and checks what it touched.
/// `Reopen` is the caller's (it needs the volume alone).
fn apply<'a>(
    v: &Volume,
    model: &mut BTreeMap<&'a str, Vec<u8>>,
    slots: &[&'a str],
    bs: usize,
    op: Op,
) {
    match op {
        Op::Write {
            slot,
            off,
            len,
            seed,
        } => {
            let path = slots[slot];
            let off = scale(off, bs);
            let len = scale(len, bs);
            if !model.contains_key(path) {
                v.create_file(path, None).unwrap();
                model.insert(path, vec![]);
            }
            let data = content(seed, len);
            v.write_path(path, off as u64, &data).unwrap();
            if len > 0 {
                let f = model.get_mut(path).unwrap();
                if f.len() < off + len {
                    f.resize(off + len, 0);
                }
                f[off..off + len].copy_from_slice(&data);
            }
            assert_eq!(
                &read_all(v, path).unwrap(),
                &model[path],
                "{path} after write"
            );
        }
        Op::Truncate { slot, size } => {
            let path = slots[slot];
            if let Some(f) = model.get_mut(path) {
                let size = scale(size, bs);
                v.truncate(path, size as u64).unwrap();
                f.resize(size, 0);
                assert_eq!(
                    &read_all(v, path).unwrap(),
                    &model[path],
                    "{path} after truncate"
                );
            }
        }
        Op::Rename { from, to } => {
            let (f, t) = (slots[from], slots[to]);
            if model.contains_key(f) && f != t {
                v.rename(f, t).unwrap();
                let data = model.remove(f).unwrap();
                model.insert(t, data);
                assert!(v.stat(f).is_err());
            }
        }
        Op::Unlink { slot } => {
            let path = slots[slot];
            if model.remove(path).is_some() {
                v.unlink(path).unwrap();
                assert!(v.stat(path).is_err());
            }
        }
        Op::Sync => v.sync().unwrap(),
        Op::Reopen => unreachable!("the caller reopens"),
    }
}

/// Every file of `slots` equals `model` (or does not exist).
fn check_all(v: &Volume, model: &BTreeMap<&str, Vec<u8>>, slots: &[&str]) {
    for path in slots {
        match model.get(path) {
            Some(data) => assert_eq!(&read_all(v, path).unwrap(), data, "{path} at the end"),
            None => assert!(v.stat(path).is_err(), "{path} should not exist"),
        }
    }
}

fn run(scheme: SchemeId, bs: usize, ops: Vec<Op>) {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let mut vol: Option<Volume> = Some(create(store.clone(), &trusted, scheme, bs as u32));
    vol.as_ref().unwrap().mkdir("/d").unwrap();
    let mut model: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    for op in ops {
        if let Op::Reopen = op {
            drop(vol.take());
            vol = Some(open(store.clone(), &trusted).unwrap());
        } else {
            apply(vol.as_ref().unwrap(), &mut model, &SLOTS, bs, op);
        }
    }
    let v = vol.as_ref().unwrap();
    check_all(v, &model, &SLOTS);
    let names: Vec<String> = v
        .readdir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    let expect: Vec<String> = model
        .keys()
        .filter_map(|p| p.strip_prefix("/d/"))
        .map(String::from)
        .collect();
    assert_eq!(names, expect);
    // Everything written is intact on disk too.
    drop(vol.take());
    let v = open(store, &trusted).unwrap();
    assert!(v.fsck(&mut |_| {}).unwrap().is_empty());
}

/// Counts a client out of `running` when it ends, also by a panic.
struct Finished<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The files of concurrent client `k`.
const CLIENT_SLOTS: [[&str; 4]; 3] = [
    ["/c0/a", "/c0/b", "/d/c0a", "/d/c0b"],
    ["/c1/a", "/c1/b", "/d/c1a", "/d/c1b"],
    ["/c2/a", "/c2/b", "/d/c2a", "/d/c2b"],
];

/// Concurrent clients (issue 11): each client runs its own sequence on its own files, all
/// at once on one volume, in rounds; between rounds the volume may be reopened. After every
/// operation a client's touched file equals its model (reads run without the engine lock
/// while the other clients write, rename in a shared directory, seal and unlink), and at the
/// end every file does, after a reopen too, and fsck is clean.
fn run_concurrent(scheme: SchemeId, bs: usize, rounds: Vec<Vec<Vec<Op>>>) {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let mut vol = create(store.clone(), &trusted, scheme, bs as u32);
    for d in ["/d", "/c0", "/c1", "/c2"] {
        vol.mkdir(d).unwrap();
    }
    let mut models: Vec<BTreeMap<&str, Vec<u8>>> = vec![BTreeMap::new(); 3];
    for clients in rounds {
        let mut reopen = false;
        let running = std::sync::atomic::AtomicUsize::new(clients.len());
        std::thread::scope(|s| {
            // An observer reads every client's files meanwhile: what it reads is not
            // determined, but it must never be an error other than a name that is gone.
            let (vol_, running_) = (&vol, &running);
            s.spawn(move || {
                let mut buf = vec![0u8; 3 * bs];
                while running_.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                    for path in CLIENT_SLOTS.iter().flatten() {
                        for off in [0, bs as u64 / 2, 2 * bs as u64] {
                            match vol_.read_path(path, off, &mut buf) {
                                Ok(_) => {}
                                Err(intact_core::Error::Fs {
                                    kind: intact_core::FsErrorKind::NotFound,
                                    ..
                                }) => {}
                                Err(e) => panic!("observer, {path} at {off}: {e}"),
                            }
                        }
                    }
                }
            });
            for ((ops, model), slots) in clients
                .into_iter()
                .zip(models.iter_mut())
                .zip(&CLIENT_SLOTS)
            {
                reopen |= ops.iter().any(|op| matches!(op, Op::Reopen));
                let (vol, running) = (&vol, &running);
                s.spawn(move || {
                    // Counted out also when the client fails, so the observer stops.
                    let _out = Finished(running);
                    for op in ops {
                        if !matches!(op, Op::Reopen) {
                            apply(vol, model, slots, bs, op);
                        }
                    }
                });
            }
        });
        if reopen {
            drop(vol);
            vol = open(store.clone(), &trusted).unwrap();
        }
    }
    for (model, slots) in models.iter().zip(&CLIENT_SLOTS) {
        check_all(&vol, model, slots);
    }
    assert_eq!(vol.integrity_failures(), 0);
    drop(vol);
    let v = open(store, &trusted).unwrap();
    for (model, slots) in models.iter().zip(&CLIENT_SLOTS) {
        check_all(&v, model, slots);
    }
    assert!(v.fsck(&mut |_| {}).unwrap().is_empty());
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 24,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    }
}

macro_rules! model_test {
    ($name:ident, $scheme:expr, $bs:expr) => {
        proptest! {
            #![proptest_config(config())]
            #[test]
            fn $name(ops in proptest::collection::vec(op(), 1..40)) {
                run($scheme, $bs, ops);
            }
        }
    };
}

model_test!(model_aead_128, SchemeId::Aead, 128);
model_test!(model_aead_4096, SchemeId::Aead, 4096);
model_test!(model_aead_65536, SchemeId::Aead, 65536);
model_test!(model_mt_gcm_128, SchemeId::MtEintGcm, 128);
model_test!(model_mt_gcm_4096, SchemeId::MtEintGcm, 4096);
model_test!(model_mt_gcm_65536, SchemeId::MtEintGcm, 65536);
model_test!(model_mt_cbc_128, SchemeId::MtEintCbc, 128);
model_test!(model_mt_cbc_4096, SchemeId::MtEintCbc, 4096);
model_test!(model_mt_cbc_65536, SchemeId::MtEintCbc, 65536);
model_test!(model_none_128, SchemeId::None, 128);
model_test!(model_none_4096, SchemeId::None, 4096);
model_test!(model_none_65536, SchemeId::None, 65536);
model_test!(model_mac_tree_128, SchemeId::MacTree, 128);
model_test!(model_mac_tree_4096, SchemeId::MacTree, 4096);
model_test!(model_mac_tree_65536, SchemeId::MacTree, 65536);
model_test!(model_rand_eint_128, SchemeId::RandEint, 128);
model_test!(model_rand_eint_4096, SchemeId::RandEint, 4096);
model_test!(model_rand_eint_65536, SchemeId::RandEint, 65536);
model_test!(model_comp_eint_128, SchemeId::CompEint, 128);
model_test!(model_comp_eint_4096, SchemeId::CompEint, 4096);
model_test!(model_comp_eint_65536, SchemeId::CompEint, 65536);
model_test!(model_comp_eint_zstd_128, SchemeId::CompEintZstd, 128);
model_test!(model_comp_eint_zstd_4096, SchemeId::CompEintZstd, 4096);
model_test!(model_comp_eint_zstd_65536, SchemeId::CompEintZstd, 65536);

macro_rules! concurrent_model_test {
    ($name:ident, $scheme:expr, $bs:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: 12, ..config() })]
            #[test]
            fn $name(rounds in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(op(), 1..20), 2..=3),
                1..4,
            )) {
                run_concurrent($scheme, $bs, rounds);
            }
        }
    };
}

concurrent_model_test!(concurrent_mt_gcm_4096, SchemeId::MtEintGcm, 4096);
concurrent_model_test!(concurrent_mt_cbc_128, SchemeId::MtEintCbc, 128);
concurrent_model_test!(concurrent_mac_tree_4096, SchemeId::MacTree, 4096);
concurrent_model_test!(concurrent_aead_4096, SchemeId::Aead, 4096);
concurrent_model_test!(concurrent_rand_eint_128, SchemeId::RandEint, 128);
concurrent_model_test!(concurrent_comp_eint_zstd_4096, SchemeId::CompEintZstd, 4096);
