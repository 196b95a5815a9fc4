//! Measured (not estimated) integrity costs: the metrics of Oprea–Reiter (2006, §2 and §6;
//! 2007, Fig. 7): integrity bandwidth, untrusted storage for integrity, trusted storage, and
//! a time breakdown by phase.
//!
//! How it is measured:
//!
//! - **Time.** Code that does a phase's work wraps it in [`phase`] (or [`timed`]). Phases
//!   nest *exclusively*: entering one pauses the enclosing one, so a tree operation that
//!   waits for the store is charged to [`Phase::Tree`] only for its own work and to
//!   [`Phase::StoreWait`] for the wait (the `Tx` wraps every store call). Accumulation is
//!   per thread, in plain integers; an [`Account`] guard around an operation (every scheme
//!   call, every commit) moves what accrued on its thread into a shared [`Metrics`]
//!   (atomics) when the outermost guard ends. Time inside an account not claimed by any
//!   phase is [`Phase::Other`].
//! - **Bytes.** The `Tx` counts every logical read and write a scheme makes, per object
//!   class ([`crate::store::ObjectClass`]): the bytes of `US_F` the algorithm touches,
//!   which is the paper's integrity bandwidth, whatever the journal later does with them.
//! - **Blocks.** The scheme dispatch ([`crate::scheme::scheme`]) counts blocks read
//!   (Check) and written (Update/Append), so bandwidth per block access is a ratio of two
//!   measured counts. Per-file numbers are kept by file id.
//!
//! Reading the numbers is [`Metrics::snapshot`] / [`Metrics::file`]; the cost when nobody
//! reads them is a few `Instant::now()` calls and relaxed atomic adds per scheme call.

use crate::crypto::FileId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Where time goes (the categories of Oprea–Reiter 2007, Fig. 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Block encryption and decryption.
    Encrypt = 0,
    /// Hashing and MACs: leaf hashes, Merkle node hashes, block and node MACs.
    HashMac = 1,
    /// RAND-EINT's randomness test or COMP-EINT's compression.
    RandTest = 2,
    /// Tree bookkeeping: walking, loading and laying out nodes (excluding the hashing and
    /// the store wait inside, which are charged to their own phases).
    Tree = 3,
    /// Updating or checking the trusted root: the seal (records, journal, anchor).
    Root = 4,
    /// Waiting for the untrusted store.
    StoreWait = 5,
    /// Everything else inside an accounted operation.
    Other = 6,
}

/// Number of phases.
pub const PHASES: usize = 7;

impl Phase {
    /// All phases, in order.
    pub const ALL: [Phase; PHASES] = [
        Phase::Encrypt,
        Phase::HashMac,
        Phase::RandTest,
        Phase::Tree,
        Phase::Root,
        Phase::StoreWait,
        Phase::Other,
    ];
    /// A short name (used as a JSON key).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Encrypt => "encrypt",
            Phase::HashMac => "hash_mac",
            Phase::RandTest => "rand_test_or_compress",
            Phase::Tree => "tree",
            Phase::Root => "root_update",
            Phase::StoreWait => "store_wait",
            Phase::Other => "other",
        }
    }
}

/// Byte and call counts of one object class, as the algorithm accessed them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Io {
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Read calls.
    pub reads: u64,
    /// Write calls.
    pub writes: u64,
}

impl Io {
    fn since(&self, e: &Io) -> Io {
        Io {
            read_bytes: self.read_bytes - e.read_bytes,
            write_bytes: self.write_bytes - e.write_bytes,
            reads: self.reads - e.reads,
            writes: self.writes - e.writes,
        }
    }
    fn add(&mut self, o: &Io) {
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.reads += o.reads;
        self.writes += o.writes;
    }
}

/// What one thread accrued (monotone counters).
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    ns: [u64; PHASES],
    data: Io,
    integrity: Io,
}

impl Tally {
    fn since(&self, e: &Tally) -> Tally {
        let mut ns = [0; PHASES];
        for (k, v) in ns.iter_mut().enumerate() {
            *v = self.ns[k] - e.ns[k];
        }
        Tally {
            ns,
            data: self.data.since(&e.data),
            integrity: self.integrity.since(&e.integrity),
        }
    }
}

struct Local {
    tally: Tally,
    current: Phase,
    since: Instant,
    depth: u32,
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local {
        tally: Tally::default(),
        current: Phase::Other,
        since: Instant::now(),
        depth: 0,
    });
}

/// Charges the time since the last switch to the current phase and switches to `to`;
/// returns the phase that was current.
fn switch(to: Phase) -> Phase {
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let now = Instant::now();
        let cur = l.current;
        l.tally.ns[cur as usize] += now.duration_since(l.since).as_nanos() as u64;
        l.since = now;
        l.current = to;
        cur
    })
}

/// A running phase; ends (and resumes the enclosing phase) when dropped.
#[must_use = "the phase ends when this guard is dropped"]
pub struct PhaseGuard {
    prev: Phase,
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        switch(self.prev);
    }
}

/// Starts charging this thread's time to `p` until the guard drops.
pub fn phase(p: Phase) -> PhaseGuard {
    PhaseGuard { prev: switch(p) }
}

/// Runs `f`, charging its (exclusive) time to `p`.
pub fn timed<T>(p: Phase, f: impl FnOnce() -> T) -> T {
    let _g = phase(p);
    f()
}

/// Records a logical read of `n` bytes of an object of `class` (called by the `Tx`).
pub fn count_read(class: crate::store::ObjectClass, n: usize) {
    count(class, n, true)
}

/// Records a logical write of `n` bytes of an object of `class` (called by the `Tx`).
pub fn count_write(class: crate::store::ObjectClass, n: usize) {
    count(class, n, false)
}

fn count(class: crate::store::ObjectClass, n: usize, read: bool) {
    use crate::store::ObjectClass;
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let io = match class {
            ObjectClass::Data => &mut l.tally.data,
            ObjectClass::Integrity => &mut l.tally.integrity,
            _ => return,
        };
        if read {
            io.read_bytes += n as u64;
            io.reads += 1;
        } else {
            io.write_bytes += n as u64;
            io.writes += 1;
        }
    })
}

fn tally_now() -> Tally {
    switch(LOCAL.with(|l| l.borrow().current));
    LOCAL.with(|l| l.borrow().tally)
}

/// Accounts one operation: what its thread accrues between creation and drop is added to
/// `metrics` (only by the outermost guard on a thread, so nested operations count once).
#[must_use = "the operation is accounted when this guard is dropped"]
pub struct Account<'a> {
    metrics: &'a Metrics,
    start: Tally,
    prev: Phase,
}

impl<'a> Account<'a> {
    /// Starts accounting; time not claimed by a phase is [`Phase::Other`].
    pub fn new(metrics: &'a Metrics) -> Self {
        let start = tally_now();
        let prev = switch(Phase::Other);
        LOCAL.with(|l| l.borrow_mut().depth += 1);
        Account {
            metrics,
            start,
            prev,
        }
    }

    /// Starts accounting with the time charged to `p` by default.
    pub fn with_phase(metrics: &'a Metrics, p: Phase) -> Self {
        let a = Account::new(metrics);
        switch(p);
        a
    }
}

impl Drop for Account<'_> {
    fn drop(&mut self) {
        switch(self.prev);
        let outer = LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            l.depth -= 1;
            l.depth == 0
        });
        if outer {
            let d = tally_now().since(&self.start);
            self.metrics.add(&d);
        }
    }
}

/// Per-file accounting of one scheme call: blocks and the bytes and time the call accrued
/// (nested calls included) go to `file`'s entry.
pub(crate) struct FileAccount<'a> {
    metrics: &'a Metrics,
    file: FileId,
    start: Tally,
    blocks_read: u64,
    blocks_written: u64,
}

impl<'a> FileAccount<'a> {
    pub(crate) fn new(metrics: &'a Metrics, file: FileId, read: u64, written: u64) -> Self {
        FileAccount {
            metrics,
            file,
            start: tally_now(),
            blocks_read: read,
            blocks_written: written,
        }
    }
}

impl Drop for FileAccount<'_> {
    fn drop(&mut self) {
        let d = tally_now().since(&self.start);
        let m = self.metrics;
        m.blocks_read.fetch_add(self.blocks_read, Ordering::Relaxed);
        m.blocks_written
            .fetch_add(self.blocks_written, Ordering::Relaxed);
        let mut files = m.files.lock().unwrap_or_else(|e| e.into_inner());
        let f = files.entry(self.file).or_default();
        f.blocks_read += self.blocks_read;
        f.blocks_written += self.blocks_written;
        f.data.add(&d.data);
        f.integrity.add(&d.integrity);
        for (k, v) in f.time_ns.iter_mut().enumerate() {
            *v += d.ns[k];
        }
    }
}

#[derive(Default)]
struct AtomicIo {
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
}

impl AtomicIo {
    fn add(&self, d: &Io) {
        self.read_bytes.fetch_add(d.read_bytes, Ordering::Relaxed);
        self.write_bytes.fetch_add(d.write_bytes, Ordering::Relaxed);
        self.reads.fetch_add(d.reads, Ordering::Relaxed);
        self.writes.fetch_add(d.writes, Ordering::Relaxed);
    }
    fn load(&self) -> Io {
        Io {
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
        }
    }
}

/// A volume's measured costs since it was opened (shared, lock-free counters; the per-file
/// table takes a lock once per scheme call).
#[derive(Default)]
pub struct Metrics {
    ns: [AtomicU64; PHASES],
    data: AtomicIo,
    integrity: AtomicIo,
    blocks_read: AtomicU64,
    blocks_written: AtomicU64,
    files: Mutex<HashMap<FileId, FileCounts>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

/// A file's measured costs since the volume was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FileCounts {
    /// Blocks checked (read through the scheme).
    pub blocks_read: u64,
    /// Blocks updated or appended (written through the scheme).
    pub blocks_written: u64,
    /// Encrypted-block bytes accessed.
    pub data: Io,
    /// `US_F` bytes accessed (Merkle nodes, counters, tags, spilled counters).
    pub integrity: Io,
    /// Time by phase, ns (indexed by [`Phase`]).
    #[serde(skip)]
    pub time_ns: [u64; PHASES],
}

impl FileCounts {
    /// Integrity bandwidth: bytes of `US_F` read or written per block accessed (0 when no
    /// block was accessed).
    pub fn integrity_bandwidth(&self) -> f64 {
        ratio(
            self.integrity.read_bytes + self.integrity.write_bytes,
            self.blocks_read + self.blocks_written,
        )
    }
    /// `US_F` bytes read per block read.
    pub fn read_bandwidth(&self) -> f64 {
        ratio(self.integrity.read_bytes, self.blocks_read)
    }
    /// `US_F` bytes read and written per block written.
    pub fn write_bandwidth(&self) -> f64 {
        ratio(self.integrity.write_bytes, self.blocks_written)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// A copy of a volume's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct MetricsSnapshot {
    /// Blocks checked.
    pub blocks_read: u64,
    /// Blocks updated or appended.
    pub blocks_written: u64,
    /// Encrypted-block bytes accessed.
    pub data: Io,
    /// `US_F` bytes accessed, all files (the inode table and directories included).
    pub integrity: Io,
    /// Integrity bandwidth: `US_F` bytes read or written per block accessed.
    pub integrity_bandwidth: f64,
    /// Time by phase.
    pub time: PhaseTimes,
}

/// Time by phase, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PhaseTimes {
    /// [`Phase::Encrypt`].
    pub encrypt_ns: u64,
    /// [`Phase::HashMac`].
    pub hash_mac_ns: u64,
    /// [`Phase::RandTest`].
    pub rand_test_or_compress_ns: u64,
    /// [`Phase::Tree`].
    pub tree_ns: u64,
    /// [`Phase::Root`].
    pub root_update_ns: u64,
    /// [`Phase::StoreWait`].
    pub store_wait_ns: u64,
    /// [`Phase::Other`].
    pub other_ns: u64,
}

impl PhaseTimes {
    /// From an array indexed by [`Phase`].
    pub fn from_array(ns: [u64; PHASES]) -> Self {
        PhaseTimes {
            encrypt_ns: ns[0],
            hash_mac_ns: ns[1],
            rand_test_or_compress_ns: ns[2],
            tree_ns: ns[3],
            root_update_ns: ns[4],
            store_wait_ns: ns[5],
            other_ns: ns[6],
        }
    }
    /// As an array indexed by [`Phase`].
    pub fn to_array(&self) -> [u64; PHASES] {
        [
            self.encrypt_ns,
            self.hash_mac_ns,
            self.rand_test_or_compress_ns,
            self.tree_ns,
            self.root_update_ns,
            self.store_wait_ns,
            self.other_ns,
        ]
    }
    /// The sum.
    pub fn total_ns(&self) -> u64 {
        self.to_array().iter().sum()
    }
}

/// A file's integrity costs (`intact stat --integrity`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileIntegrity {
    /// The path asked for.
    pub path: String,
    /// Its scheme.
    pub scheme: String,
    /// Whether the scheme detects tampering at all (`none` does not).
    pub authenticated: bool,
    /// Whether it detects replay of old versions.
    pub fresh: bool,
    /// Blocks the scheme holds.
    pub blocks: u64,
    /// Length of the data object `.d`.
    pub data_object_bytes: u64,
    /// Bytes of `.d` beyond the blocks themselves (`aead`'s nonce and tag per block).
    pub data_overhead_bytes: u64,
    /// Length of `.m` (Merkle nodes; `mac-tree`: leaf-counter nodes and block tags).
    pub meta_object_bytes: u64,
    /// Length of `.c` (spilled counter intervals; `mac-tree`: upper counter nodes).
    pub ctrs_object_bytes: u64,
    /// Untrusted storage for integrity, `US_F`: `.m` + `.c` + the data overhead.
    pub integrity_bytes: u64,
    /// Bytes of TS_F in use in the record ([`crate::format::Inode::trusted_bytes_used`]).
    pub trusted_bytes: u64,
    /// Measured since the volume was opened.
    pub measured: FileCounts,
    /// `US_F` bytes read per block read (measured).
    pub read_bandwidth: f64,
    /// `US_F` bytes written per block written (measured).
    pub write_bandwidth: f64,
    /// `US_F` bytes read or written per block accessed (measured).
    pub integrity_bandwidth: f64,
    /// Time by phase (measured).
    pub time: PhaseTimes,
}

impl FileIntegrity {
    pub(crate) fn new(
        path: &str,
        inode: &crate::format::Inode,
        blocks: u64,
        bs: u64,
        [d, m, c]: [u64; 3],
        measured: FileCounts,
    ) -> Self {
        let overhead = d.saturating_sub(blocks * bs);
        FileIntegrity {
            path: path.to_string(),
            scheme: inode.scheme.name().to_string(),
            authenticated: inode.scheme.authenticates(),
            fresh: inode.scheme.fresh(),
            blocks,
            data_object_bytes: d,
            data_overhead_bytes: overhead,
            meta_object_bytes: m,
            ctrs_object_bytes: c,
            integrity_bytes: m + c + overhead,
            trusted_bytes: inode.trusted_bytes_used(),
            read_bandwidth: measured.read_bandwidth(),
            write_bandwidth: measured.write_bandwidth(),
            integrity_bandwidth: measured.integrity_bandwidth(),
            time: PhaseTimes::from_array(measured.time_ns),
            measured,
        }
    }
}

/// A volume's integrity costs (`intact info`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VolumeIntegrity {
    /// Files, directories and symlinks.
    pub files: u64,
    /// The trusted anchor (the only trusted storage of the volume).
    pub anchor_bytes: u64,
    /// TS_F bytes in use over all records (held in the inode table, trusted through the
    /// anchor; the per-file trusted storage of the papers).
    pub ts_bytes: u64,
    /// TS bytes in use of the inode table itself (inside the anchor).
    pub itable_ts_bytes: u64,
    /// Untrusted storage for integrity: every file's `.m` and `.c` (directories too).
    pub integrity_object_bytes: u64,
    /// Data objects (`.d`) of files and directories (`aead`'s per-block overhead included).
    pub data_object_bytes: u64,
    /// The other metadata objects: the inode table's objects, journals, config, anchor copy.
    pub other_metadata_bytes: u64,
    /// Measured since the volume was opened.
    pub session: MetricsSnapshot,
}

impl Metrics {
    /// Zeroed counters.
    pub fn new() -> Self {
        Self::default()
    }

    fn add(&self, d: &Tally) {
        for (k, v) in d.ns.iter().enumerate() {
            self.ns[k].fetch_add(*v, Ordering::Relaxed);
        }
        self.data.add(&d.data);
        self.integrity.add(&d.integrity);
    }

    /// The volume's counters.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let ns: [u64; PHASES] = std::array::from_fn(|k| self.ns[k].load(Ordering::Relaxed));
        let integrity = self.integrity.load();
        let blocks_read = self.blocks_read.load(Ordering::Relaxed);
        let blocks_written = self.blocks_written.load(Ordering::Relaxed);
        MetricsSnapshot {
            blocks_read,
            blocks_written,
            data: self.data.load(),
            integrity,
            integrity_bandwidth: ratio(
                integrity.read_bytes + integrity.write_bytes,
                blocks_read + blocks_written,
            ),
            time: PhaseTimes::from_array(ns),
        }
    }

    /// Drops the counters of files whose records the engine dropped from memory (issue 18:
    /// the table must not grow with every file a walk touches). A file's counters then
    /// start again at its next use.
    pub fn forget_files<'a>(&self, ids: impl IntoIterator<Item = &'a FileId>) {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            files.remove(id);
        }
    }

    /// How many files have counters (the per-file table's size).
    pub fn files_counted(&self) -> usize {
        self.files.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// One file's counters (zero when it was not accessed since the volume was opened,
    /// or since its record was last dropped from memory).
    pub fn file(&self, id: &FileId) -> FileCounts {
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .copied()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ObjectClass;

    fn spin(d: std::time::Duration) {
        let t = Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn phases_nest_exclusively_and_outermost_account_counts_once() {
        let m = Metrics::new();
        {
            let _a = Account::new(&m);
            {
                let _t = phase(Phase::Tree);
                spin(std::time::Duration::from_millis(20));
                timed(Phase::StoreWait, || {
                    spin(std::time::Duration::from_millis(30))
                });
                count_read(ObjectClass::Integrity, 100);
                count_write(ObjectClass::Data, 7);
                count_write(ObjectClass::Journal, 1000);
            }
            // A nested account (a scheme call inside a commit) must not count twice.
            let _inner = Account::new(&m);
            count_read(ObjectClass::Integrity, 5);
        }
        let s = m.snapshot();
        let ms = |ns: u64| ns / 1_000_000;
        assert!((20..30).contains(&ms(s.time.tree_ns)), "{s:?}");
        assert!((30..45).contains(&ms(s.time.store_wait_ns)), "{s:?}");
        assert_eq!(s.integrity.read_bytes, 105);
        assert_eq!(s.integrity.reads, 2);
        assert_eq!(s.data.write_bytes, 7);
        // Nothing outside an account is charged.
        count_read(ObjectClass::Integrity, 1);
        assert_eq!(m.snapshot().integrity.read_bytes, 105);
    }

    #[test]
    fn file_accounts_attribute_nested_work() {
        let m = Metrics::new();
        let id = [9u8; 16];
        {
            let _outer = Account::new(&m);
            let _f = FileAccount::new(&m, id, 3, 0);
            count_read(ObjectClass::Integrity, 96);
        }
        let f = m.file(&id);
        assert_eq!(f.blocks_read, 3);
        assert_eq!(f.integrity.read_bytes, 96);
        assert_eq!(f.read_bandwidth(), 32.0);
        assert_eq!(m.file(&[1; 16]), FileCounts::default());
        assert_eq!(m.snapshot().integrity_bandwidth, 32.0);
    }
}
