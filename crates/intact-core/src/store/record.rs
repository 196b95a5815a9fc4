//! The file-system calls of the local stores, recorded, and the crash states that a weak
//! persistence model allows from a recording: the crash tests below the engine.
//!
//! The approach is ALICE's (Pillai et al., "All File Systems Are Not Created Equal",
//! OSDI 2014, §3: an abstract persistence model applied to a trace of system calls) and
//! CrashMonkey's (Mohan et al., OSDI 2018, §4: replay the crash states allowed up to each
//! persistence point, then check what a completed fsync promised). [`FsLog`] records what
//! [`super::LocalDirStore`] and [`super::LocalStateDir`] ask of the file system, in the order
//! the calls completed (a recorded store runs its calls one at a time). [`CrashModel`] turns
//! the recording into the states a crash after any call may leave on the media, under this
//! model (weaker than ext4's `data=ordered`; docs/design.md, "Crash states of the real
//! store"):
//!
//! - What the last completed `fsync`/`fdatasync` of a file covers persists: its writes and
//!   length changes before the call. What a directory's `fsync` covers persists: the
//!   creations, renames, unlinks and `mkdir`s in it before the call. `syncfs` covers all.
//! - Any subset of the calls that no completed sync covers may have persisted, in any
//!   order. A subset is applied in program order, which is every reordering of calls that
//!   touch different bytes or names. Reorderings of two unsynced writes to the same bytes
//!   are not generated.
//! - A write may be torn: any subset of its 512-byte sectors (aligned to the file's offsets)
//!   may have persisted. A write that extended the file leaves zeros where its sectors did
//!   not land.
//! - A creation, rename or `mkdir` with no directory `fsync` after it may be undone, which
//!   leaves the file's data unreachable; a file whose directory was not persisted is gone.

use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One call of a local store to the file system. Paths are relative to the log's base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsCall {
    /// `mkdir`.
    Mkdir(PathBuf),
    /// An `open` with `O_CREAT` that created the file.
    Create(PathBuf),
    /// `pwrite` of these bytes at this offset.
    Write {
        /// The file.
        path: PathBuf,
        /// Where.
        off: u64,
        /// What.
        data: Vec<u8>,
    },
    /// `ftruncate`.
    SetLen {
        /// The file.
        path: PathBuf,
        /// Its new length.
        len: u64,
    },
    /// `fsync` or `fdatasync` of a file (both make its data and length durable).
    Fsync(PathBuf),
    /// `fsync` of a directory.
    FsyncDir(PathBuf),
    /// `rename`.
    Rename {
        /// The old name.
        from: PathBuf,
        /// The new name (replaced if it exists).
        to: PathBuf,
    },
    /// `unlink`.
    Unlink(PathBuf),
    /// `syncfs`: everything.
    Syncfs,
}

/// A recording of file-system calls under a base directory, shared by the stores that
/// record into it. While a store records, its calls run one at a time (under the log's
/// lock), so that the order of the log is the order of the calls.
#[derive(Debug)]
pub struct FsLog {
    base: PathBuf,
    calls: Mutex<Vec<FsCall>>,
}

impl FsLog {
    /// A log of the calls made under `base` (paths outside it are recorded whole).
    pub fn new(base: impl Into<PathBuf>) -> Self {
        FsLog {
            base: base.into(),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// The path as recorded: relative to the base.
    fn rel(&self, p: &Path) -> PathBuf {
        p.strip_prefix(&self.base).unwrap_or(p).to_path_buf()
    }

    /// Runs `op`, and records what `call` says of it when it succeeds (a failed call did
    /// not change the file system, as far as the model goes).
    pub(crate) fn run<T>(
        &self,
        op: impl FnOnce() -> io::Result<T>,
        call: impl FnOnce(&dyn Fn(&Path) -> PathBuf) -> FsCall,
    ) -> io::Result<T> {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let out = op()?;
        calls.push(call(&|p| self.rel(p)));
        Ok(out)
    }

    /// How many calls were recorded.
    pub fn len(&self) -> usize {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<FsCall> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Runs `op`, recording it in `log` when there is one.
pub(crate) fn logged<T>(
    log: Option<&FsLog>,
    op: impl FnOnce() -> io::Result<T>,
    call: impl FnOnce(&dyn Fn(&Path) -> PathBuf) -> FsCall,
) -> io::Result<T> {
    match log {
        Some(log) => log.run(op, call),
        None => op(),
    }
}

/// Creates `path` (which must not exist) with `opts` (`create_new` is set here), writes
/// `data` and fsyncs it, recording the three calls in `log` when there is one: the first
/// half of a replacement by rename, shared by the object store and the anchor.
pub(crate) fn create_synced(
    log: Option<&FsLog>,
    opts: &mut fs::OpenOptions,
    path: &Path,
    data: &[u8],
) -> io::Result<()> {
    use std::io::Write;
    let mut f = logged(
        log,
        || opts.write(true).create_new(true).open(path),
        |r| FsCall::Create(r(path)),
    )?;
    let write = |r: &dyn Fn(&Path) -> PathBuf| FsCall::Write {
        path: r(path),
        off: 0,
        data: data.to_vec(),
    };
    logged(log, || f.write_all(data), write)?;
    logged(log, || f.sync_all(), |r| FsCall::Fsync(r(path)))
}

/// `rename(from, to)`, recorded in `log` when there is one.
pub(crate) fn rename(log: Option<&FsLog>, from: &Path, to: &Path) -> io::Result<()> {
    let call = |r: &dyn Fn(&Path) -> PathBuf| FsCall::Rename {
        from: r(from),
        to: r(to),
    };
    logged(log, || fs::rename(from, to), call)
}

/// The regular files and directories under a directory (symbolic links and the like are
/// left out: the stores make none). Paths are relative.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tree {
    /// Directories, the base excluded.
    pub dirs: BTreeSet<PathBuf>,
    /// Files and their bytes.
    pub files: BTreeMap<PathBuf, Vec<u8>>,
}

impl Tree {
    /// Reads the tree under `base`.
    pub fn read(base: &Path) -> io::Result<Tree> {
        fn walk(base: &Path, rel: &Path, t: &mut Tree) -> io::Result<()> {
            for e in fs::read_dir(base.join(rel))? {
                let e = e?;
                let p = rel.join(e.file_name());
                let ft = e.file_type()?;
                if ft.is_dir() {
                    t.dirs.insert(p.clone());
                    walk(base, &p, t)?;
                } else if ft.is_file() {
                    t.files.insert(p.clone(), fs::read(base.join(&p))?);
                }
            }
            Ok(())
        }
        let mut t = Tree::default();
        walk(base, Path::new(""), &mut t)?;
        Ok(t)
    }

    /// Writes the tree under `base`, which must not hold any of its names yet.
    pub fn write(&self, base: &Path) -> io::Result<()> {
        fs::create_dir_all(base)?;
        for d in &self.dirs {
            fs::create_dir_all(base.join(d))?;
        }
        for (p, data) in &self.files {
            fs::write(base.join(p), data)?;
        }
        Ok(())
    }
}

/// A file, as the model knows it: by the order of its creation (the initial files first).
type Ino = usize;

/// The size of a sector: the unit a torn write keeps or loses.
pub const SECTOR: u64 = 512;

/// A recorded call, resolved to inodes, with writes cut into sectors: the unit of what
/// persists.
#[derive(Clone, Debug)]
enum Unit {
    Mkdir(PathBuf),
    Create(PathBuf, Ino),
    /// One sector's part of a write.
    Write(Ino, u64, Vec<u8>),
    SetLen(Ino, u64),
    Rename(PathBuf, PathBuf),
    Unlink(PathBuf),
    SyncFile(Ino),
    SyncDir(PathBuf),
    SyncAll,
}

impl Unit {
    fn is_sync(&self) -> bool {
        matches!(self, Unit::SyncFile(_) | Unit::SyncDir(_) | Unit::SyncAll)
    }
}

fn parent(p: &Path) -> PathBuf {
    p.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The namespace and contents a sequence of units produces.
#[derive(Clone, Debug, Default)]
struct Fs {
    dirs: BTreeSet<PathBuf>,
    names: BTreeMap<PathBuf, Ino>,
    data: HashMap<Ino, Vec<u8>>,
}

impl Fs {
    fn apply(&mut self, u: &Unit) {
        match u {
            Unit::Mkdir(d) => {
                self.dirs.insert(d.clone());
            }
            Unit::Create(p, ino) => {
                self.names.insert(p.clone(), *ino);
                self.data.entry(*ino).or_default();
            }
            Unit::Write(ino, off, bytes) => {
                let f = self.data.entry(*ino).or_default();
                let (off, end) = (*off as usize, *off as usize + bytes.len());
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[off..end].copy_from_slice(bytes);
            }
            Unit::SetLen(ino, len) => self.data.entry(*ino).or_default().resize(*len as usize, 0),
            Unit::Rename(from, to) => {
                if let Some(ino) = self.names.remove(from) {
                    self.names.insert(to.clone(), ino);
                }
            }
            Unit::Unlink(p) => {
                self.names.remove(p);
            }
            Unit::SyncFile(_) | Unit::SyncDir(_) | Unit::SyncAll => {}
        }
    }

    /// The visible tree: directories whose ancestors all exist, files in them.
    fn tree(&self) -> Tree {
        let reachable = |d: &Path| {
            d.ancestors()
                .filter(|a| !a.as_os_str().is_empty())
                .all(|a| self.dirs.contains(a))
        };
        let mut t = Tree::default();
        for d in &self.dirs {
            if reachable(d) {
                t.dirs.insert(d.clone());
            }
        }
        for (p, ino) in &self.names {
            if reachable(&parent(p)) {
                let data = self.data.get(ino).cloned().unwrap_or_default();
                t.files.insert(p.clone(), data);
            }
        }
        t
    }
}

/// Why a recording cannot be modelled.
#[derive(Debug)]
pub struct ModelError(pub String);

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "crash model: {}", self.0)
    }
}

impl std::error::Error for ModelError {}

/// How a state was chosen among those a crash point allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Only what completed syncs cover.
    DurableOnly,
    /// Every call before the crash.
    All,
    /// A random subset of the unsynced calls, some writes torn (the seed of the choice).
    Random(u64),
}

/// The crash states of a recording (see the module's documentation for the model).
#[derive(Debug)]
pub struct CrashModel {
    initial: Fs,
    units: Vec<Unit>,
    /// For each call, the number of units up to and including it.
    call_end: Vec<usize>,
    /// For each unit, the index of the first sync unit after it that covers it
    /// (`usize::MAX`: none).
    covered_by: Vec<usize>,
    /// For each unit, the call it came from.
    call_of: Vec<usize>,
}

impl CrashModel {
    /// The model of `calls` made on the files of `initial` (taken as durable).
    pub fn new(initial: &Tree, calls: &[FsCall]) -> Result<CrashModel, ModelError> {
        let mut fs = Fs {
            dirs: initial.dirs.clone(),
            ..Fs::default()
        };
        for (ino, (p, data)) in initial.files.iter().enumerate() {
            fs.names.insert(p.clone(), ino);
            fs.data.insert(ino, data.clone());
        }
        let initial_fs = fs.clone();
        let mut next_ino = initial.files.len();
        let mut units = Vec::new();
        let mut call_end = Vec::with_capacity(calls.len());
        let mut call_of = Vec::new();
        let ino_of = |fs: &Fs, p: &Path, i: usize| {
            fs.names.get(p).copied().ok_or_else(|| {
                ModelError(format!(
                    "call {i} names {} that does not exist",
                    p.display()
                ))
            })
        };
        for (i, c) in calls.iter().enumerate() {
            let start = units.len();
            match c {
                FsCall::Mkdir(d) => units.push(Unit::Mkdir(d.clone())),
                FsCall::Create(p) => {
                    units.push(Unit::Create(p.clone(), next_ino));
                    next_ino += 1;
                }
                FsCall::Write { path, off, data } => {
                    let ino = ino_of(&fs, path, i)?;
                    let (mut at, end) = (*off, *off + data.len() as u64);
                    while at < end {
                        let next = ((at / SECTOR + 1) * SECTOR).min(end);
                        let bytes = data[(at - off) as usize..(next - off) as usize].to_vec();
                        units.push(Unit::Write(ino, at, bytes));
                        at = next;
                    }
                }
                FsCall::SetLen { path, len } => {
                    units.push(Unit::SetLen(ino_of(&fs, path, i)?, *len))
                }
                FsCall::Fsync(p) => units.push(Unit::SyncFile(ino_of(&fs, p, i)?)),
                FsCall::FsyncDir(d) => units.push(Unit::SyncDir(d.clone())),
                FsCall::Rename { from, to } => {
                    ino_of(&fs, from, i)?;
                    units.push(Unit::Rename(from.clone(), to.clone()))
                }
                FsCall::Unlink(p) => units.push(Unit::Unlink(p.clone())),
                FsCall::Syncfs => units.push(Unit::SyncAll),
            }
            for u in &units[start..] {
                fs.apply(u);
                call_of.push(i);
            }
            call_end.push(units.len());
        }
        // The first sync after each unit that covers it, found backwards in one pass.
        let mut covered_by = vec![usize::MAX; units.len()];
        let mut next_all = usize::MAX;
        let mut next_file: HashMap<Ino, usize> = HashMap::new();
        let mut next_dir: HashMap<PathBuf, usize> = HashMap::new();
        for j in (0..units.len()).rev() {
            let dir = |d: &Path| next_dir.get(d).copied().unwrap_or(usize::MAX);
            let file = |ino: &Ino| next_file.get(ino).copied().unwrap_or(usize::MAX);
            let by = match &units[j] {
                Unit::Mkdir(d) => dir(&parent(d)),
                Unit::Create(p, _) | Unit::Unlink(p) => dir(&parent(p)),
                Unit::Rename(from, to) => dir(&parent(from)).min(dir(&parent(to))),
                Unit::Write(ino, _, _) | Unit::SetLen(ino, _) => file(ino),
                Unit::SyncFile(ino) => {
                    next_file.insert(*ino, j);
                    usize::MAX
                }
                Unit::SyncDir(d) => {
                    next_dir.insert(d.clone(), j);
                    usize::MAX
                }
                Unit::SyncAll => {
                    next_all = j;
                    next_file.clear();
                    next_dir.clear();
                    usize::MAX
                }
            };
            covered_by[j] = by.min(next_all);
        }
        Ok(CrashModel {
            initial: initial_fs,
            units,
            call_end,
            covered_by,
            call_of,
        })
    }

    /// The number of crash points: after each call, and before the first.
    pub fn points(&self) -> usize {
        self.call_end.len() + 1
    }

    /// The units done by a crash after `calls` calls.
    fn end(&self, calls: usize) -> usize {
        if calls == 0 {
            0
        } else {
            self.call_end[calls - 1]
        }
    }

    /// True when a crash after `calls` calls leaves a unit that is not covered: the
    /// states at that point differ from the durable one.
    pub fn has_unsynced(&self, calls: usize) -> bool {
        let end = self.end(calls);
        (0..end).any(|u| !self.units[u].is_sync() && self.covered_by[u] >= end)
    }

    /// The state a crash after `calls` calls leaves, as `choice` picks it; also how many
    /// writes it tore (kept some of their sectors, not all).
    pub fn state(&self, calls: usize, choice: Choice) -> (Tree, usize) {
        let end = self.end(calls);
        let mut keep = vec![false; end];
        let mut torn = 0;
        let mut rng = match choice {
            Choice::Random(seed) => Some(rand::rngs::StdRng::seed_from_u64(seed)),
            _ => None,
        };
        let mut u = 0;
        while u < end {
            // The units of one call decide together (a write's sectors).
            let call = self.call_of[u];
            let mut stop = u;
            while stop < end && self.call_of[stop] == call {
                stop += 1;
            }
            let durable = self.covered_by[u] < end;
            match (&mut rng, durable) {
                (_, true) => keep[u..stop].iter_mut().for_each(|k| *k = true),
                (None, false) => {
                    let all = choice == Choice::All;
                    keep[u..stop].iter_mut().for_each(|k| *k = all);
                }
                (Some(rng), false) => {
                    if rng.gen_bool(0.5) {
                        let sectors = stop - u;
                        if sectors > 1 && rng.gen_bool(0.3) {
                            // Torn at 4 KiB or at 512-byte boundaries.
                            let group = if rng.gen_bool(0.5) { 8 } else { 1 };
                            let mut first = true;
                            let mut kept = 0;
                            for k in u..stop {
                                // A 4 KiB tear keeps or loses eight sectors at a time.
                                let Unit::Write(_, off, _) = &self.units[k] else {
                                    unreachable!("a call of several units is a write")
                                };
                                let boundary = (off / SECTOR).is_multiple_of(group);
                                if first || boundary {
                                    first = false;
                                    keep[k] = rng.gen_bool(0.5);
                                } else {
                                    keep[k] = keep[k - 1];
                                }
                                kept += usize::from(keep[k]);
                            }
                            torn += usize::from(kept > 0 && kept < sectors);
                        } else {
                            keep[u..stop].iter_mut().for_each(|k| *k = true);
                        }
                    }
                }
            }
            u = stop;
        }
        let mut fs = self.initial.clone();
        for (unit, _) in self.units[..end].iter().zip(&keep).filter(|(_, k)| **k) {
            fs.apply(unit);
        }
        (fs.tree(), torn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn w(path: &str, off: u64, data: &[u8]) -> FsCall {
        FsCall::Write {
            path: p(path),
            off,
            data: data.to_vec(),
        }
    }

    fn files(t: &Tree) -> Vec<(String, Vec<u8>)> {
        t.files
            .iter()
            .map(|(k, v)| (k.display().to_string(), v.clone()))
            .collect()
    }

    /// A file created, written and fsynced, with its directory fsynced: before the syncs it
    /// may be missing or empty; after both, only the written content remains.
    #[test]
    fn fsync_of_the_file_and_of_its_directory() {
        let init = Tree::default();
        let calls = vec![
            FsCall::Create(p("f")),
            w("f", 0, b"abc"),
            FsCall::Fsync(p("f")),
            FsCall::FsyncDir(p("")),
        ];
        let m = CrashModel::new(&init, &calls).unwrap();
        assert_eq!(m.points(), 5);
        // After the file's fsync only: the name may still be undone.
        assert!(files(&m.state(3, Choice::DurableOnly).0).is_empty());
        assert_eq!(
            files(&m.state(3, Choice::All).0),
            [("f".into(), b"abc".to_vec())]
        );
        assert!(m.has_unsynced(3));
        // After the directory's fsync: the one state there is.
        assert!(!m.has_unsynced(4));
        assert_eq!(
            files(&m.state(4, Choice::DurableOnly).0),
            [("f".into(), b"abc".to_vec())]
        );
        // A directory fsync without the file's: the name persists, the data may not.
        let calls = vec![
            FsCall::Create(p("f")),
            w("f", 0, b"abc"),
            FsCall::FsyncDir(p("")),
        ];
        let m = CrashModel::new(&init, &calls).unwrap();
        assert_eq!(
            files(&m.state(3, Choice::DurableOnly).0),
            [("f".into(), vec![])]
        );
    }

    /// A write of three sectors keeps any of them; one extending the file leaves zeros
    /// where its sectors did not land. Over many seeds every tear of the three shows up.
    #[test]
    fn torn_writes_keep_any_sectors() {
        let mut init = Tree::default();
        init.files.insert(p("f"), vec![1; 100]);
        let data = vec![9u8; 2 * SECTOR as usize + 10];
        let calls = vec![w("f", 0, &data)];
        let m = CrashModel::new(&init, &calls).unwrap();
        let mut seen = BTreeSet::new();
        let mut torn = 0;
        for seed in 0..400 {
            let (t, n) = m.state(1, Choice::Random(seed));
            torn += n;
            let f = &t.files[&p("f")];
            let pattern: Vec<bool> = [0usize, 512, 1024]
                .iter()
                .map(|&o| f.get(o) == Some(&9))
                .collect();
            // Without its last sector, the write leaves the file no longer than the end of
            // the sectors that landed (at least the old 100 bytes); holes read as zeros.
            if !pattern[2] {
                assert!(f.len() <= 1024, "{}", f.len());
            }
            if !pattern[0] && pattern[1] {
                assert!(f[100..512].iter().all(|&b| b == 0));
            }
            // A state is counted torn when some of the write's sectors landed, not all.
            let mixed = pattern.contains(&true) && pattern.contains(&false);
            assert_eq!(n, usize::from(mixed), "seed {seed}: {pattern:?}");
            seen.insert(pattern);
        }
        assert_eq!(seen.len(), 8, "{seen:?}");
        assert!(torn > 0);
        // Unchanged and whole are the extremes.
        assert_eq!(m.state(1, Choice::DurableOnly).0, init);
        assert_eq!(m.state(1, Choice::All).0.files[&p("f")], data);
    }

    /// A write of two 4 KiB pages is also torn at the page boundary, each page whole (a
    /// tear of a page-cache page): over 2,000 seeds, states with each page all new or all
    /// old, one of each, show up about once in 27 (a half kept, three in ten torn, half of
    /// them at 4 KiB, half of those split), far more than a tear of independent sectors
    /// would give (2^-15).
    #[test]
    fn torn_writes_tear_at_4_kib_pages_too() {
        let page = 8 * SECTOR as usize;
        let mut init = Tree::default();
        init.files.insert(p("f"), vec![1; 2 * page]);
        let calls = vec![w("f", 0, &vec![9u8; 2 * page])];
        let m = CrashModel::new(&init, &calls).unwrap();
        let mut split = 0;
        for seed in 0..2000 {
            let f = &m.state(1, Choice::Random(seed)).0.files[&p("f")];
            let whole = |pg: usize, b: u8| f[pg * page..(pg + 1) * page].iter().all(|&x| x == b);
            if (whole(0, 9) && whole(1, 1)) || (whole(0, 1) && whole(1, 9)) {
                split += 1;
            }
        }
        assert!(split >= 30, "{split} page-torn states of 2,000");
    }

    /// A rename without a directory fsync may be undone; the temporary file then stays.
    /// The replace pattern (write a temporary, fsync it, rename, fsync the directory).
    #[test]
    fn rename_needs_a_directory_fsync() {
        let mut init = Tree::default();
        init.dirs.insert(p("s"));
        init.files.insert(p("s/anchor"), b"old".to_vec());
        let calls = vec![
            FsCall::Create(p("s/tmp")),
            w("s/tmp", 0, b"new"),
            FsCall::Fsync(p("s/tmp")),
            FsCall::Rename {
                from: p("s/tmp"),
                to: p("s/anchor"),
            },
            FsCall::FsyncDir(p("s")),
        ];
        let m = CrashModel::new(&init, &calls).unwrap();
        let before = m.state(4, Choice::DurableOnly).0;
        assert_eq!(before.files[&p("s/anchor")], b"old");
        let after = m.state(4, Choice::All).0;
        assert_eq!(after.files[&p("s/anchor")], b"new");
        assert!(!after.files.contains_key(&p("s/tmp")));
        let done = m.state(5, Choice::DurableOnly).0;
        assert_eq!(files(&done), [("s/anchor".into(), b"new".to_vec())]);
        // Every random state is one of the two anchors (never a mix, never missing).
        for seed in 0..50 {
            let a = m.state(4, Choice::Random(seed)).0.files[&p("s/anchor")].clone();
            assert!(a == b"old" || a == b"new");
        }
    }

    /// A file in a directory whose mkdir was not persisted is gone; syncfs covers all.
    #[test]
    fn mkdir_unlink_and_syncfs() {
        let mut init = Tree::default();
        init.files.insert(p("gone"), b"x".to_vec());
        let calls = vec![
            FsCall::Mkdir(p("a")),
            FsCall::Create(p("a/f")),
            w("a/f", 3, b"z"),
            FsCall::Fsync(p("a/f")),
            FsCall::FsyncDir(p("a")),
            FsCall::Unlink(p("gone")),
            FsCall::SetLen {
                path: p("a/f"),
                len: 1,
            },
            FsCall::Syncfs,
        ];
        let m = CrashModel::new(&init, &calls).unwrap();
        // `a` itself is not durable until its parent is fsynced: its file is unreachable.
        let t = m.state(5, Choice::DurableOnly).0;
        assert!(t.dirs.is_empty());
        assert_eq!(files(&t), [("gone".into(), b"x".to_vec())]);
        let t = m.state(8, Choice::DurableOnly).0;
        assert_eq!(files(&t), [("a/f".into(), vec![0])]);
        assert!(!m.has_unsynced(8));
    }

    #[test]
    fn calls_on_unknown_files_are_refused() {
        let e = CrashModel::new(&Tree::default(), &[w("nope", 0, b"1")]).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn a_log_records_in_order_with_relative_paths() {
        let log = FsLog::new("/base");
        assert!(log.is_empty());
        let r: io::Result<()> =
            log.run(|| Ok(()), |rel| FsCall::Mkdir(rel(Path::new("/base/a/b"))));
        r.unwrap();
        let r: io::Result<()> = log.run(|| Err(io::Error::other("no")), |_| FsCall::Syncfs);
        assert!(r.is_err());
        assert_eq!(log.calls(), [FsCall::Mkdir(p("a/b"))]);
        assert_eq!(log.len(), 1);
        assert!(!log.is_empty());
    }

    #[test]
    fn a_tree_round_trips_through_a_directory() {
        let d = tempfile::tempdir().unwrap();
        let mut t = Tree::default();
        t.dirs.insert(p("x"));
        t.dirs.insert(p("x/y"));
        t.files.insert(p("x/y/f"), b"data".to_vec());
        t.files.insert(p("e"), vec![]);
        t.write(&d.path().join("t")).unwrap();
        assert_eq!(Tree::read(&d.path().join("t")).unwrap(), t);
        assert_eq!(t.files[&p("x/y/f")], b"data");
    }
}
