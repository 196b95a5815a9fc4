//! Shared helpers of the integration tests.
#![allow(dead_code)]

use intact_core::crypto::KdfParams;
use intact_core::format::{ObjectNames, SchemeId};
use intact_core::store::{MemTrusted, TrustedStore, UntrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use std::sync::Arc;

pub mod workload;

pub const PW: &[u8] = b"correct horse";

/// A small deterministic generator (no dependency for a test's sequence).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// The engine's record budget for the tests: `INTACT_TEST_RECORDS` when set (scripts/test.sh
/// runs the attack, crash and model suites a second time with a budget of 1, so that every
/// record is dropped and read back, authenticated, between requests), else the default.
pub fn records() -> usize {
    match std::env::var("INTACT_TEST_RECORDS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("INTACT_TEST_RECORDS={v:?} is not a number")),
        Err(_) => intact_core::volume::KEEP_OPEN,
    }
}

/// A new volume in `store`, anchored in `trusted` (a `MemTrusted`, or a wrapper of one).
pub fn create<T: TrustedStore + Clone + 'static>(
    store: Arc<dyn UntrustedStore>,
    trusted: &T,
    scheme: SchemeId,
    bs: u32,
) -> Volume {
    let copts = CreateOptions {
        block_size: bs,
        scheme,
        auto: false,
        kdf: KdfParams::TEST,
        inline_leaf: true,
        dir_tree: true,
        inline_mac: true,
        inline_tree: true,
        inline_data: true,
        ctr_segments: true,
        twin_blocks: true,
        leaf_log: true,
        log_delta: true,
    };
    create_with(store, trusted, &copts)
}

/// [`create`] without twin blocks: every overwrite of a sealed block is staged in memory,
/// as the tests of the engine's limits on staged bytes need.
pub fn create_staging<T: TrustedStore + Clone + 'static>(
    store: Arc<dyn UntrustedStore>,
    trusted: &T,
    scheme: SchemeId,
    bs: u32,
) -> Volume {
    let copts = CreateOptions {
        block_size: bs,
        scheme,
        kdf: KdfParams::TEST,
        twin_blocks: false,
        ..CreateOptions::default()
    };
    create_with(store, trusted, &copts)
}

/// [`create`] with the volume's options given whole.
pub fn create_with<T: TrustedStore + Clone + 'static>(
    store: Arc<dyn UntrustedStore>,
    trusted: &T,
    copts: &CreateOptions,
) -> Volume {
    let t = trusted.clone();
    Volume::create(
        store,
        move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
        PW,
        copts,
        &Options {
            cache_bytes: 1024,
            read_only: false,
            records: records(),
            ..Options::default()
        },
    )
    .expect("create")
}

pub fn open(store: Arc<dyn UntrustedStore>, trusted: &MemTrusted) -> intact_core::Result<Volume> {
    Volume::open(
        store,
        Box::new(trusted.clone()),
        PW,
        &Options {
            cache_bytes: 1024,
            read_only: false,
            records: records(),
            ..Options::default()
        },
    )
}

pub fn open_ro(
    store: Arc<dyn UntrustedStore>,
    trusted: &MemTrusted,
) -> intact_core::Result<Volume> {
    Volume::open(
        store,
        Box::new(trusted.clone()),
        PW,
        &Options {
            cache_bytes: 1024,
            read_only: true,
            records: records(),
            ..Options::default()
        },
    )
}

pub fn names(vol: &Volume, path: &str) -> ObjectNames {
    let id = hex::decode(vol.stat(path).unwrap().file_id).unwrap();
    ObjectNames::of(&id.try_into().unwrap())
}

pub fn read_all(vol: &Volume, path: &str) -> intact_core::Result<Vec<u8>> {
    let size = vol.stat(path)?.size as usize;
    let mut buf = vec![0u8; size];
    let n = vol.read_path(path, 0, &mut buf)?;
    assert_eq!(n, size);
    Ok(buf)
}

#[allow(unused_imports)]
pub use intact_core::attacks::{mixed, noise, pattern, text};

/// What a test does around each `sync` (and before each read) of a store wrapped in
/// [`Hooked`].
pub trait SyncHook: Send + Sync {
    /// Runs before the inner store's read of `name`.
    fn before_read(&self, _name: &str) {}
    /// Runs before the inner store's sync of `names`.
    fn before_sync(&self, _names: &[String]) {}
    /// Runs after it, whatever it returned.
    fn after_sync(&self) {}
}

/// A store that passes every call to `inner` and runs `hook` around its syncs and before
/// its reads.
pub struct Hooked<S, H> {
    pub inner: S,
    pub hook: H,
}

impl<S: UntrustedStore, H: SyncHook> UntrustedStore for Hooked<S, H> {
    fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> intact_core::Result<usize> {
        self.hook.before_read(name);
        self.inner.read_at(name, off, buf)
    }
    fn write_at(&self, name: &str, off: u64, data: &[u8]) -> intact_core::Result<()> {
        self.inner.write_at(name, off, data)
    }
    fn len(&self, name: &str) -> intact_core::Result<Option<u64>> {
        self.inner.len(name)
    }
    fn set_len(&self, name: &str, len: u64) -> intact_core::Result<()> {
        self.inner.set_len(name, len)
    }
    fn delete(&self, name: &str) -> intact_core::Result<()> {
        self.inner.delete(name)
    }
    fn sync(&self, names: &[String]) -> intact_core::Result<()> {
        self.hook.before_sync(names);
        let r = self.inner.sync(names);
        self.hook.after_sync();
        r
    }
    fn sync_all(&self) -> intact_core::Result<()> {
        self.inner.sync_all()
    }
    fn list(&self) -> intact_core::Result<Vec<String>> {
        self.inner.list()
    }
}

/// Syncs that wait while a gate is closed: a commit's I/O is held in flight.
#[derive(Default)]
pub struct Gate {
    /// (closed, a sync is waiting)
    state: std::sync::Mutex<(bool, bool)>,
    cv: std::sync::Condvar,
    /// Only the syncs of a checkpoint's journal wait.
    pub journal_only: bool,
}

impl Gate {
    /// A gate that holds only the syncs of a checkpoint's journal.
    pub fn journal_only() -> Gate {
        Gate {
            journal_only: true,
            ..Gate::default()
        }
    }

    pub fn set(&self, closed: bool) {
        self.state.lock().unwrap().0 = closed;
        self.cv.notify_all();
    }

    /// Whether a sync reached the gate (since it was made, or [`Gate::forget_syncs`]).
    pub fn sync_reached(&self) -> bool {
        self.state.lock().unwrap().1
    }

    /// Forgets the syncs that reached the gate so far.
    pub fn forget_syncs(&self) {
        self.state.lock().unwrap().1 = false;
    }

    pub fn wait_for_a_sync(&self) {
        let mut g = self.state.lock().unwrap();
        while !g.1 {
            g = self.cv.wait(g).unwrap();
        }
    }
}

impl SyncHook for Gate {
    fn before_sync(&self, names: &[String]) {
        if self.journal_only && !names.iter().any(|n| n.starts_with("journal")) {
            return;
        }
        let mut g = self.state.lock().unwrap();
        g.1 = true;
        self.cv.notify_all();
        while g.0 {
            g = self.cv.wait(g).unwrap();
        }
        g.1 = false;
    }
}
