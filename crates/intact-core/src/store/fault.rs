//! A fault-injecting store wrapper and a crash-image model, for tests.
//!
//! Fault injection (crash, EIO, dropped write, corrupted reads) works over any store.
//! Crash images need the wrapper to have seen the whole history of the objects: build the
//! store with [`FaultStore::new_mem`], [`FaultStore::with_mem`] or [`FaultStore::tracked`].

use super::{MemStore, UntrustedStore};
use crate::error::{Error, Result};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Which faults to inject. Call numbers are absolute (1-based) counts since the store was
/// built or [`FaultStore::reset_counters`]; compute them from [`FaultStore::writes`] /
/// [`FaultStore::attempts`] to target "the k-th call from now".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// Once [`FaultStore::writes`] (successful mutating calls) reaches this number, every
    /// further call of any kind fails with [`Error::Crashed`] (and keeps failing).
    pub crash_after_writes: Option<u64>,
    /// The mutating call whose [`FaultStore::attempts`] number equals this fails once with
    /// an `EIO` I/O error and changes nothing.
    pub fail_eio_on: Option<u64>,
    /// A full disk: from the mutating call with this [`FaultStore::attempts`] number on,
    /// every call that would take more space (a write or length past an object's end, a
    /// replace) fails with `ENOSPC` and changes nothing, until the plan changes. Writes
    /// inside an object, shrinking and deleting still work, as on a full file system.
    pub full_from: Option<u64>,
    /// The mutating call whose [`FaultStore::attempts`] number equals this fails once with
    /// `ENOSPC` and changes nothing (a disk full for one call).
    pub fail_enospc_on: Option<u64>,
    /// The sync call ([`UntrustedStore::sync`] or [`UntrustedStore::sync_all`]) whose
    /// [`FaultStore::syncs`] number equals this fails once with `EIO`, after the inner
    /// store synced (what was written may or may not be durable: the caller cannot know).
    pub fail_sync_on: Option<u64>,
    /// The `write_at` call with this (1-based) number returns `Ok` but writes nothing.
    pub drop_write: Option<u64>,
    /// Every read of this object comes back with one bit flipped (the lowest bit of the
    /// first byte returned).
    pub corrupt_reads_of: Option<String>,
}

impl FaultPlan {
    /// A plan from its text form, as the mount daemon takes it for tests (the environment
    /// variable `INTACT_FAULT`): `eio@N`, `enospc@N` (the N-th mutating call fails once),
    /// `sync-eio@N` (the N-th sync fails once), or `none`.
    pub fn parse(text: &str) -> Option<FaultPlan> {
        let mut plan = FaultPlan::default();
        if text == "none" {
            return Some(plan);
        }
        let (kind, n) = text.split_once('@')?;
        let n = n.parse().ok()?;
        match kind {
            "eio" => plan.fail_eio_on = Some(n),
            "enospc" => plan.fail_enospc_on = Some(n),
            "sync-eio" => plan.fail_sync_on = Some(n),
            _ => return None,
        }
        Some(plan)
    }
}

/// What reached the media when the power was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashImage {
    /// Only what was synced.
    DurableOnly,
    /// Everything that was written.
    All,
    /// The synced state plus a random subset (chosen by the seed) of the unsynced
    /// mutations, applied in their original order.
    Random(u64),
}

/// One unsynced mutation.
#[derive(Debug, Clone)]
enum Mutation {
    Write {
        name: String,
        off: u64,
        data: Vec<u8>,
    },
    SetLen {
        name: String,
        len: u64,
    },
    Delete {
        name: String,
    },
}

impl Mutation {
    fn name(&self) -> &str {
        match self {
            Mutation::Write { name, .. }
            | Mutation::SetLen { name, .. }
            | Mutation::Delete { name } => name,
        }
    }

    fn apply(&self, objs: &mut BTreeMap<String, Vec<u8>>) {
        match self {
            Mutation::Write { name, off, data } => {
                let obj = objs.entry(name.clone()).or_default();
                let (off, end) = (*off as usize, *off as usize + data.len());
                if obj.len() < end {
                    obj.resize(end, 0);
                }
                obj[off..end].copy_from_slice(data);
            }
            Mutation::SetLen { name, len } => objs
                .entry(name.clone())
                .or_default()
                .resize(*len as usize, 0),
            Mutation::Delete { name } => {
                objs.remove(name);
            }
        }
    }
}

/// The durable image and the unsynced mutations since.
#[derive(Debug, Default)]
struct Model {
    durable: BTreeMap<String, Vec<u8>>,
    pending: Vec<Mutation>,
}

impl Model {
    /// Makes the current (live) state of `name` durable.
    fn sync_one(&mut self, name: &str) {
        let mut one = BTreeMap::new();
        if let Some(v) = self.durable.remove(name) {
            one.insert(name.to_string(), v);
        }
        self.pending.retain(|m| {
            if m.name() == name {
                m.apply(&mut one);
                false
            } else {
                true
            }
        });
        if let Some(v) = one.remove(name) {
            self.durable.insert(name.to_string(), v);
        }
    }

    fn image(&self, mode: CrashImage) -> BTreeMap<String, Vec<u8>> {
        let mut objs = self.durable.clone();
        match mode {
            CrashImage::DurableOnly => {}
            CrashImage::All => self.pending.iter().for_each(|m| m.apply(&mut objs)),
            CrashImage::Random(seed) => {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                for m in &self.pending {
                    if rng.gen_bool(0.5) {
                        m.apply(&mut objs);
                    }
                }
            }
        }
        objs
    }
}

/// Wraps a store and injects faults according to a [`FaultPlan`] that may be changed at
/// any time; optionally models what a power cut would leave on the media.
#[derive(Debug)]
pub struct FaultStore<S> {
    inner: S,
    plan: Mutex<FaultPlan>,
    /// Successful mutating calls (including dropped writes, which report success).
    writes: AtomicU64,
    /// Mutating calls attempted (not counting calls refused after a crash).
    attempts: AtomicU64,
    /// `write_at` calls attempted.
    write_ats: AtomicU64,
    /// Sync calls attempted.
    syncs: AtomicU64,
    crashed: AtomicBool,
    /// `None` when crash images are not tracked.
    model: Option<Mutex<Model>>,
    /// Room set aside per object ([`UntrustedStore::reserve`]): writes within it take no
    /// more room when the disk is full ([`FaultPlan::full_from`]).
    reserved: Mutex<std::collections::HashMap<String, u64>>,
}

impl FaultStore<MemStore> {
    /// An empty in-memory store with crash-image tracking.
    pub fn new_mem() -> Self {
        Self::with_mem(MemStore::new())
    }

    /// Wraps an in-memory store with crash-image tracking; its current contents are
    /// taken as durable.
    pub fn with_mem(inner: MemStore) -> Self {
        let durable = inner.snapshot();
        let mut s = Self::new(inner);
        s.model = Some(Mutex::new(Model {
            durable,
            pending: Vec::new(),
        }));
        s
    }
}

impl<S: UntrustedStore> FaultStore<S> {
    /// Wraps any store with crash-image tracking, reading its current contents (taken as
    /// durable). Mutations must from now on go through the wrapper only.
    pub fn tracked(inner: S) -> Result<Self> {
        let mut durable = BTreeMap::new();
        for name in inner.list()? {
            if let Some(v) = inner.read_all(&name)? {
                durable.insert(name, v);
            }
        }
        let mut s = Self::new(inner);
        s.model = Some(Mutex::new(Model {
            durable,
            pending: Vec::new(),
        }));
        Ok(s)
    }
}

impl<S> FaultStore<S> {
    /// Wraps any store, without crash-image tracking, with an empty plan.
    pub fn new(inner: S) -> Self {
        FaultStore {
            inner,
            plan: Mutex::new(FaultPlan::default()),
            writes: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            write_ats: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            crashed: AtomicBool::new(false),
            model: None,
            reserved: Default::default(),
        }
    }

    /// The wrapped store (the live image). Mutating it directly bypasses the crash model.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The current plan.
    pub fn plan(&self) -> FaultPlan {
        self.plan.lock().unwrap().clone()
    }

    /// Replaces the plan (counters and the crashed state are kept).
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.plan.lock().unwrap() = plan;
    }

    /// Successful mutating calls (`write_at`, `set_len`, `delete`, `replace`) so far,
    /// including dropped writes.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Mutating calls attempted so far (including ones that failed), the numbering used by
    /// [`FaultPlan::fail_eio_on`].
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }

    /// `write_at` calls attempted so far, the numbering used by [`FaultPlan::drop_write`].
    pub fn write_calls(&self) -> u64 {
        self.write_ats.load(Ordering::SeqCst)
    }

    /// Sync calls attempted so far, the numbering used by [`FaultPlan::fail_sync_on`].
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::SeqCst)
    }

    /// Sets all call counters to zero (the plan's numbers then count from here).
    pub fn reset_counters(&self) {
        self.syncs.store(0, Ordering::SeqCst);
        self.writes.store(0, Ordering::SeqCst);
        self.attempts.store(0, Ordering::SeqCst);
        self.write_ats.store(0, Ordering::SeqCst);
    }

    /// Crashes the store now: every further call fails with [`Error::Crashed`].
    pub fn crash(&self) {
        self.crashed.store(true, Ordering::SeqCst);
    }

    /// True once the store has crashed.
    pub fn is_crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Un-crashes the store (the plan is cleared of `crash_after_writes` so it does not
    /// crash again at once).
    pub fn revive(&self) {
        self.plan.lock().unwrap().crash_after_writes = None;
        self.crashed.store(false, Ordering::SeqCst);
    }

    /// The state a power cut now would leave on the media, as a fresh in-memory store.
    ///
    /// # Panics
    /// When the store was built without crash-image tracking ([`FaultStore::new`]).
    pub fn crash_image(&self, mode: CrashImage) -> MemStore {
        let model = self
            .model
            .as_ref()
            .expect("FaultStore built without crash-image tracking");
        MemStore::from_snapshot(model.lock().unwrap().image(mode))
    }

    /// The number of unsynced mutations the crash model holds (0 without tracking).
    pub fn pending_mutations(&self) -> usize {
        self.model
            .as_ref()
            .map_or(0, |m| m.lock().unwrap().pending.len())
    }

    fn check_crash(&self) -> Result<()> {
        if self.crashed.load(Ordering::SeqCst) {
            return Err(Error::Crashed);
        }
        if let Some(n) = self.plan.lock().unwrap().crash_after_writes {
            if self.writes.load(Ordering::SeqCst) >= n {
                self.crashed.store(true, Ordering::SeqCst);
                return Err(Error::Crashed);
            }
        }
        Ok(())
    }

    /// Runs a mutating call: crash check, EIO injection, then `op` (which also updates the
    /// model under its lock, so the log order matches the live order).
    fn mutate(
        &self,
        dropped: bool,
        grows: impl FnOnce() -> Result<bool>,
        op: impl FnOnce(Option<&mut Model>) -> Result<()>,
    ) -> Result<()> {
        self.check_crash()?;
        let seq = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        let errno = {
            let plan = self.plan.lock().unwrap().clone();
            if plan.fail_eio_on == Some(seq) {
                Some(libc::EIO)
            } else if plan.fail_enospc_on == Some(seq)
                || (plan.full_from.is_some_and(|n| seq >= n) && grows()?)
            {
                Some(libc::ENOSPC)
            } else {
                None
            }
        };
        if let Some(errno) = errno {
            return Err(Error::io(
                "fault injection",
                std::io::Error::from_raw_os_error(errno),
            ));
        }
        if !dropped {
            match &self.model {
                Some(m) => op(Some(&mut m.lock().unwrap()))?,
                None => op(None)?,
            }
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl<S> FaultStore<S> {
    /// The error of sync call `seq` ([`FaultPlan::fail_sync_on`]).
    fn sync_fault(&self, seq: u64) -> Result<()> {
        if self.plan.lock().unwrap().fail_sync_on == Some(seq) {
            return Err(Error::io(
                "fault injection (sync)",
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        Ok(())
    }
}

impl<S: UntrustedStore> FaultStore<S> {
    /// The length object `name` can reach without taking more room: its length or the
    /// room reserved for it.
    fn room(&self, name: &str) -> Result<u64> {
        let reserved = self
            .reserved
            .lock()
            .unwrap()
            .get(name)
            .copied()
            .unwrap_or(0);
        Ok(self.inner.len(name)?.unwrap_or(0).max(reserved))
    }
}

impl<S: UntrustedStore> UntrustedStore for FaultStore<S> {
    fn modified(&self, name: &str) -> Option<std::time::SystemTime> {
        self.inner.modified(name)
    }

    fn max_object_len(&self) -> u64 {
        self.inner.max_object_len()
    }

    fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.check_crash()?;
        let n = self.inner.read_at(name, off, buf)?;
        if n > 0 && self.plan.lock().unwrap().corrupt_reads_of.as_deref() == Some(name) {
            buf[0] ^= 1;
        }
        Ok(n)
    }

    fn reserve(&self, name: &str, len: u64) -> Result<()> {
        let grows = || Ok(len > self.room(name)?);
        self.mutate(false, grows, |_| {
            let mut r = self.reserved.lock().unwrap();
            let e = r.entry(name.to_string()).or_insert(0);
            *e = (*e).max(len);
            self.inner.reserve(name, len)
        })
    }

    fn write_at(&self, name: &str, off: u64, data: &[u8]) -> Result<()> {
        self.check_crash()?;
        let n = self.write_ats.fetch_add(1, Ordering::SeqCst) + 1;
        let dropped = self.plan.lock().unwrap().drop_write == Some(n);
        let end = off + data.len() as u64;
        let grows = || Ok(end > self.room(name)?);
        self.mutate(dropped, grows, |model| {
            self.inner.write_at(name, off, data)?;
            if let Some(m) = model {
                m.pending.push(Mutation::Write {
                    name: name.into(),
                    off,
                    data: data.to_vec(),
                });
            }
            Ok(())
        })
    }

    fn len(&self, name: &str) -> Result<Option<u64>> {
        self.check_crash()?;
        self.inner.len(name)
    }

    fn set_len(&self, name: &str, len: u64) -> Result<()> {
        let grows = || Ok(len > self.room(name)?);
        self.mutate(false, grows, |model| {
            self.inner.set_len(name, len)?;
            if let Some(m) = model {
                m.pending.push(Mutation::SetLen {
                    name: name.into(),
                    len,
                });
            }
            Ok(())
        })
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.mutate(
            false,
            || Ok(false),
            |model| {
                self.inner.delete(name)?;
                self.reserved.lock().unwrap().remove(name);
                if let Some(m) = model {
                    m.pending.push(Mutation::Delete { name: name.into() });
                }
                Ok(())
            },
        )
    }

    fn sync(&self, names: &[String]) -> Result<()> {
        self.check_crash()?;
        let seq = self.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        match &self.model {
            Some(m) => {
                let mut m = m.lock().unwrap();
                self.inner.sync(names)?;
                names.iter().for_each(|n| m.sync_one(n));
            }
            None => self.inner.sync(names)?,
        }
        self.sync_fault(seq)
    }

    fn sync_all(&self) -> Result<()> {
        self.check_crash()?;
        let seq = self.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        match &self.model {
            Some(m) => {
                let mut m = m.lock().unwrap();
                self.inner.sync_all()?;
                let pending = std::mem::take(&mut m.pending);
                pending.iter().for_each(|p| p.apply(&mut m.durable));
            }
            None => self.inner.sync_all()?,
        }
        self.sync_fault(seq)
    }

    fn list(&self) -> Result<Vec<String>> {
        self.check_crash()?;
        self.inner.list()
    }

    fn replace(&self, name: &str, data: &[u8]) -> Result<()> {
        // Atomic and durable when it returns: earlier unsynced writes to the object went to
        // the old file, which the rename discards.
        self.mutate(
            false,
            || Ok(true),
            |model| {
                self.inner.replace(name, data)?;
                if let Some(m) = model {
                    m.pending.retain(|p| p.name() != name);
                    m.durable.insert(name.to_string(), data.to_vec());
                }
                Ok(())
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_eio(e: &Error) -> bool {
        matches!(e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::EIO))
    }

    #[test]
    fn reports_the_limit_of_the_store_it_wraps() {
        let s = FaultStore::new(MemStore::with_max_object_len(4096));
        assert_eq!(s.max_object_len(), 4096);
        assert!(s.write_at("a", 4090, b"1234567").is_err());
        let arc: std::sync::Arc<dyn UntrustedStore> = std::sync::Arc::new(s);
        assert_eq!(std::sync::Arc::new(arc).max_object_len(), 4096);
        assert_eq!(FaultStore::new_mem().max_object_len(), u64::MAX);
    }

    #[test]
    fn crash_after_n_writes() {
        let s = FaultStore::new(MemStore::new());
        assert!(!s.is_crashed());
        s.set_plan(FaultPlan {
            crash_after_writes: Some(3),
            ..Default::default()
        });
        s.write_at("a", 0, b"1").unwrap();
        s.set_len("a", 4).unwrap();
        assert_eq!(s.len("a").unwrap(), Some(4));
        s.sync_all().unwrap();
        s.delete("b").unwrap();
        assert_eq!(s.writes(), 3);
        assert!(matches!(s.len("a"), Err(Error::Crashed)));
        assert!(matches!(s.write_at("a", 0, b"x"), Err(Error::Crashed)));
        assert!(matches!(s.read_all("a"), Err(Error::Crashed)));
        assert!(matches!(s.sync_all(), Err(Error::Crashed)));
        assert!(matches!(s.list(), Err(Error::Crashed)));
        assert!(s.is_crashed());
        assert_eq!(s.writes(), 3);
        assert_eq!(s.plan().crash_after_writes, Some(3));
        assert_eq!(s.inner().read_all("a").unwrap().unwrap(), b"1\0\0\0");
        s.revive();
        assert!(!s.is_crashed());
        assert_eq!(s.plan(), FaultPlan::default(), "revive clears the crash");
        s.write_at("a", 0, b"2").unwrap();
        // crash() is immediate and sticky.
        s.crash();
        assert!(s.is_crashed());
        assert!(matches!(s.len("a"), Err(Error::Crashed)));
    }

    #[test]
    fn eio_once() {
        let s = FaultStore::new(MemStore::new());
        s.write_at("a", 0, b"1").unwrap();
        s.set_plan(FaultPlan {
            fail_eio_on: Some(s.attempts() + 2),
            ..Default::default()
        });
        s.write_at("a", 1, b"2").unwrap();
        let e = s.write_at("a", 2, b"3").unwrap_err();
        assert!(is_eio(&e), "{e}");
        s.write_at("a", 2, b"4").unwrap();
        assert_eq!(s.read_all("a").unwrap().unwrap(), b"124");
        assert_eq!(s.writes(), 3);
        assert_eq!(s.attempts(), 4);
        // Also for replace.
        s.set_plan(FaultPlan {
            fail_eio_on: Some(s.attempts() + 1),
            ..Default::default()
        });
        assert!(is_eio(&s.replace("a", b"new").unwrap_err()));
        assert_eq!(s.read_all("a").unwrap().unwrap(), b"124");
    }

    #[test]
    fn enospc_once_and_sync_eio_once() {
        let s = FaultStore::new(MemStore::new());
        s.set_plan(FaultPlan::parse("enospc@2").unwrap());
        s.write_at("a", 0, b"1").unwrap();
        let e = s.write_at("a", 1, b"2").unwrap_err();
        assert!(
            matches!(&e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC)),
            "{e}"
        );
        s.write_at("a", 1, b"3").unwrap();
        assert_eq!(s.read_all("a").unwrap().unwrap(), b"13");
        s.set_plan(FaultPlan::parse("sync-eio@2").unwrap());
        s.sync(&["a".into()]).unwrap();
        assert!(is_eio(&s.sync_all().unwrap_err()));
        s.sync_all().unwrap();
        assert_eq!(s.syncs(), 3);
        // `sync` counts from 1 like `sync_all`: the next call is number 4.
        s.set_plan(FaultPlan::parse("sync-eio@4").unwrap());
        assert!(is_eio(&s.sync(&["a".into()]).unwrap_err()));
        s.reset_counters();
        assert_eq!(s.syncs(), 0);
        assert_eq!(FaultPlan::parse("none"), Some(FaultPlan::default()));
        assert_eq!(FaultPlan::parse("eio@x"), None);
        assert_eq!(FaultPlan::parse("crash@1"), None);
        assert_eq!(FaultPlan::parse("eio@7").unwrap().fail_eio_on, Some(7));
    }

    #[test]
    fn full_disk_until_the_plan_changes() {
        let s = FaultStore::new(MemStore::new());
        s.write_at("a", 0, b"1").unwrap();
        s.set_plan(FaultPlan {
            full_from: Some(s.attempts() + 2),
            ..Default::default()
        });
        s.write_at("a", 1, b"2").unwrap();
        let full = |r: Result<()>| {
            let e = r.unwrap_err();
            assert!(
                matches!(&e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC)),
                "{e}"
            );
        };
        for _ in 0..3 {
            full(s.write_at("a", 2, b"3"));
        }
        full(s.set_len("a", 3));
        full(s.replace("b", b"new"));
        assert_eq!(s.read_all("a").unwrap().unwrap(), b"12");
        // What takes no space still works (a write ending exactly at the end too).
        s.write_at("a", 0, b"x").unwrap();
        s.write_at("a", 1, b"2").unwrap();
        s.set_len("a", 2).unwrap();
        s.set_len("a", 1).unwrap();
        s.write_at("c", 0, b"c").unwrap_err();
        s.set_plan(FaultPlan::default());
        s.write_at("a", 1, b"23").unwrap();
        assert_eq!(s.read_all("a").unwrap().unwrap(), b"x23");
        s.write_at("c", 0, b"c").unwrap();
        s.delete("c").unwrap();
        s.set_plan(FaultPlan {
            full_from: Some(1),
            ..Default::default()
        });
        s.delete("a").unwrap();
    }

    /// Room set aside before the disk filled takes writes up to its length; setting aside
    /// more takes space, setting aside what is already there takes none.
    #[test]
    fn reserved_room_takes_writes_when_full() {
        let s = FaultStore::new(MemStore::new());
        s.write_at("log", 0, b"1234").unwrap();
        s.reserve("log", 16).unwrap();
        s.set_plan(FaultPlan {
            full_from: Some(s.attempts() + 1),
            ..Default::default()
        });
        let full = |r: Result<()>| {
            let e = r.unwrap_err();
            assert!(
                matches!(&e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC)),
                "{e}"
            );
        };
        s.write_at("log", 4, &[5; 12]).unwrap();
        full(s.write_at("log", 16, b"x"));
        s.reserve("log", 16).unwrap();
        s.reserve("log", 8).unwrap();
        full(s.reserve("log", 17));
        full(s.reserve("other", 1));
        s.reserve("other", 0).unwrap();
        assert_eq!(s.read_all("log").unwrap().unwrap().len(), 16);
    }

    #[test]
    fn dropped_write() {
        let s = FaultStore::new_mem();
        s.set_plan(FaultPlan {
            drop_write: Some(2),
            ..Default::default()
        });
        s.write_at("a", 0, b"aaaa").unwrap();
        s.write_at("a", 0, b"bb").unwrap(); // dropped
        s.set_len("a", 4).unwrap();
        s.write_at("a", 2, b"cc").unwrap();
        assert_eq!(s.read_all("a").unwrap().unwrap(), b"aacc");
        assert_eq!(s.writes(), 4);
        assert_eq!(s.write_calls(), 3);
        assert_eq!(
            s.crash_image(CrashImage::All)
                .read_all("a")
                .unwrap()
                .unwrap(),
            b"aacc"
        );
    }

    #[test]
    fn corrupt_reads() {
        let s = FaultStore::new(MemStore::new());
        s.write_at("x.d", 0, &[0u8; 16]).unwrap();
        s.write_at("y.d", 0, &[0u8; 16]).unwrap();
        s.set_plan(FaultPlan {
            corrupt_reads_of: Some("x.d".into()),
            ..Default::default()
        });
        let mut buf = [0u8; 8];
        s.read_at("x.d", 8, &mut buf).unwrap();
        assert_eq!(buf, [1, 0, 0, 0, 0, 0, 0, 0]);
        // The bit is flipped, not set; a read of nothing flips nothing.
        s.inner().write_at("x.d", 16, &[0xff; 2]).unwrap();
        assert_eq!(s.read_at("x.d", 16, &mut buf).unwrap(), 2);
        assert_eq!(buf[..2], [0xfe, 0xff]);
        let mut buf = [0u8; 8];
        assert_eq!(s.read_at("x.d", 18, &mut buf).unwrap(), 0);
        assert_eq!(buf, [0; 8]);
        s.inner().set_len("x.d", 16).unwrap();
        assert_ne!(s.read_all("x.d").unwrap().unwrap(), vec![0u8; 16]);
        assert_eq!(s.read_all("y.d").unwrap().unwrap(), vec![0u8; 16]);
        assert_eq!(s.inner().read_all("x.d").unwrap().unwrap(), vec![0u8; 16]);
        s.set_plan(FaultPlan::default());
        assert_eq!(s.read_all("x.d").unwrap().unwrap(), vec![0u8; 16]);
    }

    #[test]
    fn crash_images_durable_and_all() {
        let s = FaultStore::new_mem();
        s.write_at("a", 0, b"synced").unwrap();
        s.write_at("b", 0, b"b-synced").unwrap();
        s.sync(&["a".into()]).unwrap();
        s.write_at("a", 0, b"SY").unwrap();
        s.replace("cfg", b"v1").unwrap();
        s.sync_all().unwrap();
        assert_eq!(s.pending_mutations(), 0);
        s.write_at("a", 6, b"+more").unwrap();
        s.delete("b").unwrap();
        s.write_at("c", 0, b"new").unwrap();
        s.write_at("cfg", 0, b"zz").unwrap();
        s.replace("cfg", b"v2").unwrap();
        s.set_len("a", 3).unwrap();

        let d = s.crash_image(CrashImage::DurableOnly);
        assert_eq!(d.read_all("a").unwrap().unwrap(), b"SYnced");
        assert_eq!(d.read_all("b").unwrap().unwrap(), b"b-synced");
        assert_eq!(d.read_all("c").unwrap(), None);
        assert_eq!(d.read_all("cfg").unwrap().unwrap(), b"v2");

        let all = s.crash_image(CrashImage::All);
        assert_eq!(all.snapshot(), s.inner().snapshot());
        assert_eq!(all.read_all("a").unwrap().unwrap(), b"SYn");
        assert_eq!(all.read_all("b").unwrap(), None);

        // Per-object sync makes exactly that object durable.
        s.sync(&["c".into(), "b".into()]).unwrap();
        let d = s.crash_image(CrashImage::DurableOnly);
        assert_eq!(d.read_all("c").unwrap().unwrap(), b"new");
        assert_eq!(d.read_all("b").unwrap(), None);
        assert_eq!(d.read_all("a").unwrap().unwrap(), b"SYnced");
    }

    #[test]
    fn random_crash_image_is_ordered_subset() {
        // Each write sets one distinct byte of "o" to a value larger than any earlier write
        // to that byte, so an image is explained by a subset applied in order iff every byte
        // holds 0 or one of the values written to it.
        let s = FaultStore::new_mem();
        s.write_at("o", 0, &[0u8; 8]).unwrap();
        s.sync_all().unwrap();
        let mut log = Vec::new();
        for i in 0..32u8 {
            let pos = (i % 8) as u64;
            s.write_at("o", pos, &[i + 1]).unwrap();
            log.push((pos, i + 1));
        }
        s.write_at("other", 0, b"x").unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..50 {
            let img = s
                .crash_image(CrashImage::Random(seed))
                .read_all("o")
                .unwrap()
                .unwrap();
            assert_eq!(img.len(), 8);
            for (pos, &v) in img.iter().enumerate() {
                assert!(v == 0 || log.contains(&(pos as u64, v)));
            }
            seen.insert(img);
        }
        assert!(seen.len() > 10, "seeds should give different images");
        let a = s.crash_image(CrashImage::Random(7)).snapshot();
        assert_eq!(
            a,
            s.crash_image(CrashImage::Random(7)).snapshot(),
            "deterministic"
        );

        // Ordering: every image must be one of the in-order subset outcomes of
        // write "abcd"@0, set_len 1, write "Z"@3; over many seeds most of them appear.
        let s = FaultStore::new_mem();
        s.write_at("t", 0, b"abcd").unwrap();
        s.set_len("t", 1).unwrap();
        s.write_at("t", 3, b"Z").unwrap();
        let ok: Vec<Option<Vec<u8>>> = vec![
            None,
            Some(b"abcd".to_vec()),
            Some(vec![0]),
            Some(b"\0\0\0Z".to_vec()),
            Some(b"a".to_vec()),
            Some(b"abcZ".to_vec()),
            Some(b"a\0\0Z".to_vec()),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let img = s
                .crash_image(CrashImage::Random(seed))
                .read_all("t")
                .unwrap();
            assert!(ok.contains(&img), "{img:?}");
            seen.insert(img);
        }
        assert_eq!(seen.len(), ok.len());
    }

    #[test]
    fn tracked_over_any_store() {
        let base = MemStore::new();
        base.write_at("pre", 0, b"existing").unwrap();
        let s = FaultStore::tracked(std::sync::Arc::new(base)).unwrap();
        s.write_at("pre", 0, b"E").unwrap();
        assert_eq!(
            s.crash_image(CrashImage::DurableOnly)
                .read_all("pre")
                .unwrap()
                .unwrap(),
            b"existing"
        );
        assert_eq!(
            s.crash_image(CrashImage::All)
                .read_all("pre")
                .unwrap()
                .unwrap(),
            b"Existing"
        );
    }
}
