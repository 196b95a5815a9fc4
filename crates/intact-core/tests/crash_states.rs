//! Crash states of the real local-directory store, below the engine (docs/design.md,
//! "Crash states of the real store"; ALICE and CrashMonkey's way).
//!
//! Each workload runs on a volume in a real directory: the store's root and the trusted
//! state directory, both recording their file-system calls ([`FsLog`]). The workloads are
//! Ace's (Mohan et al., OSDI 2018, §5): every sequence of one and two operations drawn from
//! write, overwrite, append, truncate, rename, link, unlink, mkdir, rmdir, symlink and
//! setxattr, over two files and one subdirectory, with `Volume::sync` (what `intact sync`,
//! `sync(1)` and FSYNCDIR run) after each. The freshness scheme turns with the workload.
//!
//! [`CrashModel`] builds, for a crash after every recorded call, the states that the weak
//! persistence model allows: what completed fsyncs cover, plus any subset of the rest,
//! writes torn at 512-byte or 4 KiB boundaries, creations and renames undone without their
//! directory's fsync. Each distinct state is written to a fresh directory, opened with the
//! real stores (recovery runs), read whole, cleaned of orphans and fscked. It must:
//! - open and read without any error, so without a tamper alarm;
//! - hold exactly the tree of the last completed sync or of a later operation (everything
//!   a returned sync acknowledged is there; nothing older than the last seal is served);
//! - pass fsck.
//!
//! One state in four is also crashed during its recovery (at a random call of the
//! recovery, a random subset of its unsynced calls) and must recover to the same tree.
//!
//! Knobs (the long mode, `scripts/crash-states.sh`): `INTACT_CRASH_OPS` the longest
//! sequence (default 2; 3 adds Ace's 1,331 three-operation workloads),
//! `INTACT_CRASH_RANDOM` random states per crash point (default 2), `INTACT_CRASH_SEED`
//! (default 1), and `INTACT_CRASH_MIN` the distinct states the run must reach (default
//! 1,000).

mod common;

use common::workload::{explained, flip, read_state, workload_at};
use common::{mixed, PW};
use intact_core::format::{SchemeId, ROOT_INO};
use intact_core::store::record::{Choice, CrashModel, FsCall, FsLog, Tree};
use intact_core::store::{LocalDirStore, LocalStateDir, TrustedStore, UntrustedStore};
use intact_core::volume::XattrMode;
use intact_core::{CreateOptions, Options, Result, Volume};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const OPS: [&str; 11] = [
    "write",
    "overwrite",
    "append",
    "truncate",
    "rename",
    "link",
    "unlink",
    "mkdir",
    "rmdir",
    "symlink",
    "setxattr",
];

const SCHEMES: [SchemeId; 8] = [
    SchemeId::MtEintGcm,
    SchemeId::MacTree,
    SchemeId::RandEint,
    SchemeId::CompEint,
    SchemeId::Aead,
    SchemeId::CompEintZstd,
    SchemeId::MtEintCbc,
    SchemeId::None,
];

const BS: usize = 4096;

/// A tree as the tests compare it: `p` a file's bytes (or `-> target` for a symlink),
/// `p/` a directory, `p@name` an extended attribute.
type Flat = BTreeMap<String, Vec<u8>>;

type Xattrs = BTreeMap<String, Vec<u8>>;

/// The workload's own record of the tree, by inode (hard links share one).
#[derive(Clone, Debug, Default)]
struct Model {
    names: BTreeMap<String, usize>,
    files: Vec<(Vec<u8>, Xattrs)>,
    dirs: BTreeSet<String>,
    symlinks: BTreeMap<String, String>,
}

impl Model {
    fn flat(&self) -> Flat {
        let mut out = Flat::new();
        for (p, &ino) in &self.names {
            let (data, xattrs) = &self.files[ino];
            out.insert(p.clone(), data.clone());
            for (k, v) in xattrs {
                out.insert(format!("{p}@{k}"), v.clone());
            }
        }
        for d in &self.dirs {
            out.insert(format!("{d}/"), vec![]);
        }
        for (p, t) in &self.symlinks {
            out.insert(p.clone(), format!("-> {t}").into_bytes());
        }
        out
    }

    fn first_file(&self) -> Option<String> {
        self.names.keys().next().cloned()
    }

    fn data(&mut self, p: &str) -> &mut Vec<u8> {
        let ino = self.names[p];
        &mut self.files[ino].0
    }

    fn empty_dir(&self) -> Option<String> {
        let busy = |d: &str| {
            let pre = format!("{d}/");
            self.names.keys().any(|n| n.starts_with(&pre))
                || self.dirs.iter().any(|n| n.starts_with(&pre))
                || self.symlinks.keys().any(|n| n.starts_with(&pre))
        };
        self.dirs.iter().find(|d| !busy(d)).cloned()
    }

    /// Where a new name goes: in the subdirectory while it exists.
    fn new_name(&self, stem: &str, i: usize) -> String {
        if self.dirs.contains("/d") {
            format!("/d/{stem}{i}")
        } else {
            format!("/{stem}{i}")
        }
    }
}

fn parent_ino(vol: &Volume, path: &str) -> Result<(u64, String)> {
    let (dir, name) = path.rsplit_once('/').expect("absolute");
    let parent = if dir.is_empty() {
        ROOT_INO
    } else {
        vol.stat(dir)?.ino
    };
    Ok((parent, name.to_string()))
}

/// Runs operation `op` (the `i`th of the workload) on the volume and the model; `step`
/// gets the model after each request of an operation that takes two (each is logged
/// when it returns, so a crash may come back between them).
fn apply(
    op: &str,
    i: usize,
    vol: &Volume,
    m: &mut Model,
    step: &mut dyn FnMut(&Model),
) -> Result<()> {
    let seed = (i * 16 + OPS.iter().position(|o| *o == op).unwrap()) as u8;
    let first = m.first_file().unwrap_or_default();
    if first.is_empty() && !["write", "mkdir", "rmdir", "symlink"].contains(&op) {
        // Every file is gone (two unlinks): a new one instead.
        return apply("write", i, vol, m, step);
    }
    match op {
        "write" => {
            let p = m.new_name("n", i);
            let data = mixed(seed, BS + BS / 2);
            vol.create_file(&p, None)?;
            m.files.push((Vec::new(), BTreeMap::new()));
            m.names.insert(p.clone(), m.files.len() - 1);
            step(m);
            vol.write_path(&p, 0, &data)?;
            *m.data(&p) = data;
        }
        "overwrite" => {
            let data = mixed(seed, BS);
            let off = BS / 2;
            vol.write_path(&first, off as u64, &data)?;
            let f = m.data(&first);
            if f.len() < off + data.len() {
                f.resize(off + data.len(), 0);
            }
            f[off..off + data.len()].copy_from_slice(&data);
        }
        "append" => {
            let data = mixed(seed, BS + 7);
            let off = m.data(&first).len();
            vol.write_path(&first, off as u64, &data)?;
            m.data(&first).extend_from_slice(&data);
        }
        "truncate" => {
            let len = m.data(&first).len();
            let to = if len > 1 { len / 2 } else { 100 };
            vol.truncate(&first, to as u64)?;
            m.data(&first).resize(to, 0);
        }
        "rename" => {
            let to = m.new_name("r", i);
            vol.rename(&first, &to)?;
            let ino = m.names.remove(&first).unwrap();
            m.names.insert(to, ino);
        }
        "link" => {
            let to = format!("/l{i}");
            let (parent, name) = parent_ino(vol, &to)?;
            vol.link_at(vol.stat(&first)?.ino, parent, &name)?;
            let ino = m.names[&first];
            m.names.insert(to, ino);
        }
        "unlink" => {
            vol.unlink(&first)?;
            m.names.remove(&first);
        }
        "mkdir" => {
            let d = format!("/m{i}");
            vol.mkdir(&d)?;
            m.dirs.insert(d);
        }
        "rmdir" => {
            let d = match m.empty_dir() {
                Some(d) => d,
                None => {
                    let d = format!("/e{i}");
                    vol.mkdir(&d)?;
                    m.dirs.insert(d.clone());
                    step(m);
                    d
                }
            };
            vol.rmdir(&d)?;
            m.dirs.remove(&d);
        }
        "symlink" => {
            let p = format!("/s{i}");
            vol.symlink("a", &p)?;
            m.symlinks.insert(p, "a".into());
        }
        "setxattr" => {
            let (k, v) = (format!("user.k{i}"), mixed(seed, 40));
            vol.setxattr(vol.stat(&first)?.ino, &k, &v, XattrMode::Set)?;
            let ino = m.names[&first];
            m.files[ino].1.insert(k, v);
        }
        _ => unreachable!("{op}"),
    }
    Ok(())
}

fn opts() -> Options {
    Options {
        cache_bytes: 1024,
        read_only: false,
        records: common::records(),
        ..Options::default()
    }
}

/// Opens the volume under `base` (`store/`, `state/`), recording into `log` if given.
fn open(base: &Path, log: Option<Arc<FsLog>>) -> Result<Volume> {
    let (root, state) = (base.join("store"), base.join("state"));
    let store = match &log {
        Some(log) => LocalDirStore::open_logged(&root, log.clone())?,
        None => LocalDirStore::open(&root)?,
    };
    let mut trusted = Volume::state_for(&store, &state)?;
    if let Some(log) = log {
        trusted = trusted.with_log(log);
    }
    Volume::open(
        Arc::new(store) as Arc<dyn UntrustedStore>,
        Box::new(trusted) as Box<dyn TrustedStore>,
        PW,
        &opts(),
    )
}

/// What a workload recorded: the tree before it, its calls, the model after each
/// operation (index 0: before the first) and the calls done when each sync returned.
struct Recording {
    calls: Vec<FsCall>,
    model: CrashModel,
    points: Vec<Flat>,
    /// The index in `points` of the tree at each sync (0: before the first operation).
    syncs: Vec<usize>,
    sync_end: Vec<usize>,
}

fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Creates a volume under a scratch directory, runs `setup` on it (sealed, not recorded),
/// reopens it recording, and runs `body`, which calls its third argument as each of its
/// syncs returns and gives back the tree before its first operation and after each sync.
fn record_with<S>(
    scheme: SchemeId,
    bs: usize,
    setup: impl FnOnce(&Volume) -> S,
    body: impl FnOnce(&Volume, S, &mut dyn FnMut()) -> (Vec<Flat>, Vec<usize>),
) -> Recording {
    let dir = scratch();
    let base = dir.path();
    let state = base.join("state");
    let store = Arc::new(LocalDirStore::create(base.join("store")).unwrap());
    let vol = Volume::create(
        store as Arc<dyn UntrustedStore>,
        |id| Ok(Box::new(LocalStateDir::new(state.clone(), id)?) as Box<dyn TrustedStore>),
        PW,
        &CreateOptions {
            block_size: bs as u32,
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
        },
        &opts(),
    )
    .unwrap();
    let first = setup(&vol);
    vol.sync().unwrap();
    drop(vol);
    let initial = Tree::read(base).unwrap();

    let log = Arc::new(FsLog::new(base));
    let vol = open(base, Some(log.clone())).unwrap();
    let mut sync_end = vec![0];
    let (points, syncs) = body(&vol, first, &mut || sync_end.push(log.len()));
    assert_eq!(syncs.len(), sync_end.len(), "one tree per sync");
    assert_eq!(
        &read_state(&vol).unwrap(),
        points.last().unwrap(),
        "the volume itself"
    );
    drop(vol);
    let calls = log.calls();
    let model = CrashModel::new(&initial, &calls).unwrap();
    Recording {
        calls,
        model,
        points,
        syncs,
        sync_end,
    }
}

/// An Ace workload: two files and a subdirectory, then `ops`, each followed by a sync.
fn record(ops: &[&str], scheme: SchemeId) -> Recording {
    let setup = |vol: &Volume| {
        let mut m = Model::default();
        for (p, len, seed) in [("/a", 3 * BS + 100, 200u8), ("/b", 10, 201)] {
            let data = mixed(seed, len);
            vol.create_file(p, None).unwrap();
            vol.write_path(p, 0, &data).unwrap();
            m.files.push((data, BTreeMap::new()));
            m.names.insert(p.into(), m.files.len() - 1);
        }
        vol.mkdir("/d").unwrap();
        m.dirs.insert("/d".into());
        m
    };
    record_with(scheme, BS, setup, |vol, mut m, synced| {
        let (mut points, mut syncs) = (vec![m.flat()], vec![0]);
        for (i, op) in ops.iter().enumerate() {
            apply(op, i, vol, &mut m, &mut |m| points.push(m.flat()))
                .unwrap_or_else(|e| panic!("{ops:?}: {op}: {e}"));
            points.push(m.flat());
            syncs.push(points.len() - 1);
            vol.sync().unwrap();
            synced();
        }
        (points, syncs)
    })
}

/// Opens the state `tree`, recovers, reads, cleans and fscks it: the tree it holds, or
/// what went wrong. With `log`, recovery's calls are recorded.
fn recover(tree: &Tree, log: bool) -> std::result::Result<(Flat, Option<Vec<FsCall>>), String> {
    let dir = scratch();
    tree.write(dir.path())
        .map_err(|e| format!("writing the state: {e}"))?;
    let log = log.then(|| Arc::new(FsLog::new(dir.path())));
    let vol = open(dir.path(), log.clone()).map_err(|e| format!("open: {e}"))?;
    let state = read_state(&vol).map_err(|e| format!("read: {e}"))?;
    vol.remove_orphans()
        .map_err(|e| format!("removing orphans: {e}"))?;
    let fsck = vol.fsck(&mut |_| {}).map_err(|e| format!("fsck: {e}"))?;
    if !fsck.is_empty() {
        return Err(format!("fsck: {fsck:?}"));
    }
    drop(vol);
    Ok((state, log.map(|l| l.calls())))
}

fn summary(f: &Flat) -> String {
    f.iter()
        .map(|(k, v)| format!("{k}:{}", v.len()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Default)]
struct Totals {
    workloads: usize,
    points: usize,
    states: usize,
    torn: usize,
    second: usize,
    failures: Vec<String>,
}

/// A seed from seeds (SplitMix64's finalizer over each).
fn mix(parts: &[u64]) -> u64 {
    parts.iter().fold(0x9e37_79b9_7f4a_7c15, |h, &p| {
        let mut z = (h ^ p).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

fn hash_of(t: &Tree) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

/// Checks every distinct crash state of one workload.
fn check_workload(
    ops: &[&str],
    scheme: SchemeId,
    random: usize,
    seed: u64,
    totals: &Mutex<Totals>,
) {
    let rec = record(ops, scheme);
    check_recording(
        &rec,
        &format!("{scheme:?} {ops:?}"),
        scheme,
        random,
        seed,
        totals,
    );
}

/// Checks every distinct crash state of a recording.
fn check_recording(
    rec: &Recording,
    label: &str,
    scheme: SchemeId,
    random: usize,
    seed: u64,
    totals: &Mutex<Totals>,
) {
    let mut seen = HashSet::new();
    let (mut states, mut torn, mut second, mut failures) = (0, 0, 0, vec![]);
    for k in 0..rec.model.points() {
        // The syncs that returned before the crash: the tree is theirs or a later one.
        let done = rec.sync_end.iter().rposition(|&e| e <= k).unwrap();
        let from = rec.syncs[done];
        let mut choices = vec![Choice::DurableOnly];
        if rec.model.has_unsynced(k) {
            choices.push(Choice::All);
            choices.extend((0..random).map(|r| Choice::Random(mix(&[seed, k as u64, r as u64]))));
        }
        for choice in choices {
            let (tree, n) = rec.model.state(k, choice);
            if !seen.insert(hash_of(&tree)) {
                continue;
            }
            states += 1;
            torn += n;
            let what = format!(
                "{label}: crash after call {k}/{} ({choice:?}, {} syncs done)",
                rec.model.points() - 1,
                done
            );
            let crash_again = matches!(choice, Choice::Random(s) if mix(&[s]).is_multiple_of(4));
            let got = match recover(&tree, crash_again) {
                Ok(g) => g,
                Err(e) => {
                    failures.push(format!("{what}: {e}"));
                    continue;
                }
            };
            let (state, calls) = got;
            let partial = matches!(choice, Choice::Random(_));
            // `none` has no integrity: appends not fsynced that did not reach the disk
            // cannot be told from data (they read as what the disk holds, as on a file
            // system without checksums); the tree's names must still be a point's.
            let unchecked = partial
                && scheme == SchemeId::None
                && rec.points[from..].iter().any(|p| p.keys().eq(state.keys()));
            if !unchecked && !explained(&state, &rec.points[from..], partial) {
                failures.push(format!(
                    "{what}: the tree matches no point at or after sync {done}:\n  got  {}\n  want {}",
                    summary(&state),
                    summary(&rec.points[from])
                ));
                continue;
            }
            // A second crash, during that recovery: it must come back to the same tree.
            if let (Choice::Random(s), Some(calls)) = (choice, calls) {
                let model = CrashModel::new(&tree, &calls).expect("recovery's model");
                let k2 = (mix(&[s, 1]) % model.points() as u64) as usize;
                let (tree2, _) = model.state(k2, Choice::Random(mix(&[s, 2])));
                second += 1;
                match recover(&tree2, false) {
                    Ok((again, _)) if again == state => {}
                    Ok((again, _)) => failures.push(format!(
                        "{what}, crashed again after recovery call {k2}: another tree:\n  got  {}\n  want {}",
                        summary(&again),
                        summary(&state)
                    )),
                    Err(e) => failures.push(format!(
                        "{what}, crashed again after recovery call {k2}: {e}"
                    )),
                }
            }
        }
    }
    let mut t = totals.lock().unwrap();
    t.workloads += 1;
    t.points += rec.model.points();
    t.states += states;
    t.torn += torn;
    t.second += second;
    t.failures.extend(failures);
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v:?}: not a number"))
        })
        .unwrap_or(default)
}

/// Every workload of one and two operations, crashed at every call of the real store.
#[test]
fn crash_states_of_the_local_store() {
    let random = env("INTACT_CRASH_RANDOM", 2) as usize;
    let seed = env("INTACT_CRASH_SEED", 1);
    let min = env("INTACT_CRASH_MIN", 1000) as usize;
    let longest = env("INTACT_CRASH_OPS", 2) as usize;
    // Every sequence of 1 to `longest` operations.
    let mut workloads: Vec<Vec<&str>> = vec![];
    let mut last: Vec<Vec<&str>> = vec![vec![]];
    for _ in 0..longest {
        last = last
            .iter()
            .flat_map(|w| OPS.iter().map(move |o| [w.as_slice(), &[*o]].concat()))
            .collect();
        workloads.extend(last.iter().cloned());
    }
    let next = AtomicUsize::new(0);
    let totals = Mutex::new(Totals::default());
    std::thread::scope(|s| {
        for _ in 0..std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .min(4)
        {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(ops) = workloads.get(i) else { break };
                let scheme = SCHEMES[i % SCHEMES.len()];
                check_workload(ops, scheme, random, mix(&[seed, i as u64]), &totals);
            });
        }
    });
    report(totals.into_inner().unwrap(), seed, random, min);
}

/// Prints what a run checked and its first failures; fails it on any failure, or when it
/// checked fewer than `min` distinct states.
fn report(t: Totals, seed: u64, random: usize, min: usize) {
    println!(
        "crash states: {} workloads, {} crash points, {} distinct states checked ({} with torn \
         writes), {} crashed again during recovery; seed {seed}, {random} random states per \
         point; {} failures",
        t.workloads,
        t.points,
        t.states,
        t.torn,
        t.second,
        t.failures.len(),
    );
    for f in t.failures.iter().take(10) {
        println!("FAILED {f}");
    }
    assert!(
        t.failures.is_empty(),
        "{} crash states failed",
        t.failures.len()
    );
    assert!(
        t.states >= min,
        "only {} crash states (at least {min} expected)",
        t.states
    );
}

/// The scripted workload of `crash.rs` (files written, overwritten, truncated, renamed
/// across directories, a hard link, an extended attribute, a file unlinked while open,
/// re-encryption under another scheme, an atomic exchange; six syncs), over the real store,
/// for every scheme with its block size there.
#[test]
fn crash_states_of_the_scripted_workload() {
    let random = env("INTACT_CRASH_RANDOM", 2) as usize;
    let seed = env("INTACT_CRASH_SEED", 1);
    type Content = fn(u8, usize) -> Vec<u8>;
    let schemes: [(SchemeId, usize, Content); 8] = [
        (SchemeId::MtEintGcm, 128, common::pattern),
        (SchemeId::MtEintCbc, 256, common::pattern),
        (SchemeId::Aead, 4096, common::pattern),
        (SchemeId::MacTree, 128, common::pattern),
        (SchemeId::None, 4096, common::pattern),
        (SchemeId::RandEint, 128, flip),
        (SchemeId::CompEint, 256, flip),
        (SchemeId::CompEintZstd, 4096, flip),
    ];
    let totals = Mutex::new(Totals::default());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(scheme, bs, content)) = schemes.get(i) else {
                    break;
                };
                let rec = record_with(
                    scheme,
                    bs,
                    |_| (),
                    |vol, (), synced| {
                        let (mut points, mut syncs, mut done) = (vec![Flat::new()], vec![0], 1);
                        workload_at(vol, bs, &mut points, &mut syncs, &mut done, content, synced)
                            .unwrap();
                        (points, syncs)
                    },
                );
                let what = format!("{scheme:?} bs {bs} scripted");
                check_recording(&rec, &what, scheme, random, mix(&[seed, i as u64]), &totals);
            });
        }
    });
    report(totals.into_inner().unwrap(), seed, random, 8 * 300);
}

fn is_log(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(intact_core::wal::SEGMENT_PREFIX))
}

/// A call without its bytes.
fn brief(c: &FsCall) -> String {
    match c {
        FsCall::Write { path, off, data } => {
            format!("write {} bytes at {off} of {}", data.len(), path.display())
        }
        c => format!("{c:?}"),
    }
}

/// The recording sees the store's whole protocol, and the order the engine's crash safety
/// rests on: every write a sync made before the anchor is stored is durable before it
/// (fsync of its file, syncfs), and so is every name it created (fsync of its directory).
/// The first anchor goes through a temporary file, its fsync, the rename and the state
/// directory's fsync; later ones are written in place into a slot of the anchor file,
/// then fsynced (docs/file-format.md §1.2).
#[test]
fn the_anchor_is_stored_after_what_it_seals_is_durable() {
    let rec = record(&["write", "rename"], SchemeId::MtEintGcm);
    let calls = &rec.calls;
    let parent = |p: &Path| p.parent().map(Path::to_path_buf).unwrap_or_default();
    let stores: Vec<usize> = (0..calls.len())
        .filter(|&i| match &calls[i] {
            FsCall::Rename { to, .. } => to.ends_with("anchor"),
            FsCall::Write { path, .. } => path.ends_with("anchor"),
            _ => false,
        })
        .collect();
    assert!(stores.len() >= 2, "two syncs seal two anchors: {calls:#?}");
    assert!(
        stores
            .iter()
            .any(|&i| matches!(&calls[i], FsCall::Write { .. })),
        "later anchors are written in place"
    );
    for &r in &stores {
        let synced = |i: usize, covers: &dyn Fn(&FsCall) -> bool| {
            calls[i + 1..r]
                .iter()
                .any(|c| matches!(c, FsCall::Syncfs) || covers(c))
        };
        for (i, c) in calls[..r].iter().enumerate() {
            match c {
                // Earlier anchors (each fsynced, checked at its own store).
                FsCall::Write { path, .. } if path.ends_with("anchor") => {}
                // The untrusted copy of the anchor, read only to rebuild a lost state
                // directory (`intact recover-anchor`): nothing relies on it being current.
                FsCall::Write { path, .. } if path.ends_with("anchor.copy") => {}
                // Records of a log segment that a checkpoint folds in (deleted after it):
                // nothing relies on them once it is sealed.
                FsCall::Write { path, .. } | FsCall::SetLen { path, .. }
                    if is_log(path)
                        && calls[i + 1..]
                            .iter()
                            .any(|c| matches!(c, FsCall::Unlink(p) if p == path)) => {}
                FsCall::Write { path, .. } | FsCall::SetLen { path, .. } => assert!(
                    synced(i, &|c| matches!(c, FsCall::Fsync(p) if p == path)),
                    "call {i} ({}) is not durable before the anchor's rename {r}",
                    brief(c)
                ),
                FsCall::Create(path) | FsCall::Unlink(path) | FsCall::Mkdir(path) => {
                    // A name the sync still removes or renames later is not sealed by it.
                    let dir = parent(path);
                    assert!(
                        synced(i, &|c| matches!(c, FsCall::FsyncDir(d) if *d == dir))
                            || path.starts_with("state"),
                        "call {i} ({}) is not durable before the anchor's rename {r}",
                        brief(c)
                    )
                }
                _ => {}
            }
        }
        match &calls[r] {
            FsCall::Rename { from, to } => {
                assert!(
                    matches!(&calls[r - 1], FsCall::Fsync(p) if p == from),
                    "the anchor's temporary file is fsynced just before the rename"
                );
                assert!(
                    calls[r + 1..]
                        .iter()
                        .any(|c| matches!(c, FsCall::FsyncDir(d) if *d == parent(to))),
                    "the state directory is fsynced after the rename"
                );
            }
            FsCall::Write { path, off, data } => {
                assert!(
                    matches!(&calls[r + 1], FsCall::Fsync(p) if p == path),
                    "a slot written in place is fsynced at once"
                );
                assert!(
                    (*off == 0 || *off == 512) && data.len() == 512,
                    "one whole slot: {off}, {} bytes",
                    data.len()
                );
            }
            _ => unreachable!(),
        }
    }
}
