//! A wrapper that counts I/O per object class, for benchmarks and overhead reports.

use super::{ObjectClass, UntrustedStore};
use crate::error::Result;
use std::ops::Sub;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one object class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IoCounts {
    /// Bytes returned by successful reads.
    pub read_bytes: u64,
    /// Bytes passed to successful writes (`write_at` and `replace`).
    pub write_bytes: u64,
    /// `read_at` calls.
    pub reads: u64,
    /// `write_at` and `replace` calls.
    pub writes: u64,
    /// Other calls: `len`, `set_len`, `delete`, `sync` (one per named object), `sync_all`
    /// and `list` (both counted as [`ObjectClass::Control`]).
    pub other: u64,
}

impl IoCounts {
    /// The field-wise difference `self - earlier` (saturating at zero).
    pub fn since(&self, earlier: &IoCounts) -> IoCounts {
        IoCounts {
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            other: self.other.saturating_sub(earlier.other),
        }
    }

    /// The field-wise sum.
    pub fn plus(&self, o: &IoCounts) -> IoCounts {
        IoCounts {
            read_bytes: self.read_bytes + o.read_bytes,
            write_bytes: self.write_bytes + o.write_bytes,
            reads: self.reads + o.reads,
            writes: self.writes + o.writes,
            other: self.other + o.other,
        }
    }
}

impl Sub for IoCounts {
    type Output = IoCounts;
    fn sub(self, rhs: IoCounts) -> IoCounts {
        self.since(&rhs)
    }
}

/// Counters of all object classes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IoStats {
    /// Encrypted file blocks.
    pub data: IoCounts,
    /// Integrity metadata.
    pub integrity: IoCounts,
    /// The journal.
    pub journal: IoCounts,
    /// Everything else.
    pub control: IoCounts,
}

impl IoStats {
    /// The counters of one class.
    pub fn get(&self, class: ObjectClass) -> &IoCounts {
        match class {
            ObjectClass::Data => &self.data,
            ObjectClass::Integrity => &self.integrity,
            ObjectClass::Journal => &self.journal,
            ObjectClass::Control => &self.control,
        }
    }

    /// The sum over all classes.
    pub fn total(&self) -> IoCounts {
        self.data
            .plus(&self.integrity)
            .plus(&self.journal)
            .plus(&self.control)
    }

    /// The difference `self - earlier`, class by class (saturating at zero).
    pub fn since(&self, earlier: &IoStats) -> IoStats {
        IoStats {
            data: self.data.since(&earlier.data),
            integrity: self.integrity.since(&earlier.integrity),
            journal: self.journal.since(&earlier.journal),
            control: self.control.since(&earlier.control),
        }
    }
}

impl Sub for IoStats {
    type Output = IoStats;
    fn sub(self, rhs: IoStats) -> IoStats {
        self.since(&rhs)
    }
}

#[derive(Debug, Default)]
struct AtomicCounts {
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    other: AtomicU64,
}

impl AtomicCounts {
    fn load(&self) -> IoCounts {
        IoCounts {
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            other: self.other.load(Ordering::Relaxed),
        }
    }

    fn reset(&self) {
        for c in [
            &self.read_bytes,
            &self.write_bytes,
            &self.reads,
            &self.writes,
            &self.other,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Wraps a store and counts every call and byte, per [`ObjectClass`]. Calls are counted
/// whether or not they succeed; bytes only for successful calls. Counters are lock-free.
#[derive(Debug, Default)]
pub struct CountingStore<S> {
    inner: S,
    counts: [AtomicCounts; 4],
}

fn idx(class: ObjectClass) -> usize {
    match class {
        ObjectClass::Data => 0,
        ObjectClass::Integrity => 1,
        ObjectClass::Journal => 2,
        ObjectClass::Control => 3,
    }
}

impl<S> CountingStore<S> {
    /// Wraps `inner` with all counters at zero.
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            counts: Default::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The counters so far (each counter is read atomically; the set is not a snapshot
    /// when calls run concurrently).
    pub fn stats(&self) -> IoStats {
        IoStats {
            data: self.counts[0].load(),
            integrity: self.counts[1].load(),
            journal: self.counts[2].load(),
            control: self.counts[3].load(),
        }
    }

    /// Sets every counter to zero.
    pub fn reset(&self) {
        self.counts.iter().for_each(AtomicCounts::reset);
    }

    fn of(&self, name: &str) -> &AtomicCounts {
        &self.counts[idx(ObjectClass::of(name))]
    }
}

impl<S: UntrustedStore> UntrustedStore for CountingStore<S> {
    fn modified(&self, name: &str) -> Option<std::time::SystemTime> {
        self.inner.modified(name)
    }

    fn max_object_len(&self) -> u64 {
        self.inner.max_object_len()
    }

    fn reserve(&self, name: &str, len: u64) -> Result<()> {
        self.inner.reserve(name, len)
    }

    fn unsynced_writes_die_with_the_process(&self) -> bool {
        self.inner.unsynced_writes_die_with_the_process()
    }

    fn absent(&self, name: &str) {
        self.inner.absent(name)
    }

    fn forget_cached(&self) {
        self.inner.forget_cached()
    }

    fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
        let c = self.of(name);
        add(&c.reads, 1);
        let n = self.inner.read_at(name, off, buf)?;
        add(&c.read_bytes, n as u64);
        Ok(n)
    }

    fn write_at(&self, name: &str, off: u64, data: &[u8]) -> Result<()> {
        let c = self.of(name);
        add(&c.writes, 1);
        self.inner.write_at(name, off, data)?;
        add(&c.write_bytes, data.len() as u64);
        Ok(())
    }

    fn len(&self, name: &str) -> Result<Option<u64>> {
        add(&self.of(name).other, 1);
        self.inner.len(name)
    }

    fn set_len(&self, name: &str, len: u64) -> Result<()> {
        add(&self.of(name).other, 1);
        self.inner.set_len(name, len)
    }

    fn delete(&self, name: &str) -> Result<()> {
        add(&self.of(name).other, 1);
        self.inner.delete(name)
    }

    fn sync(&self, names: &[String]) -> Result<()> {
        for n in names {
            add(&self.of(n).other, 1);
        }
        self.inner.sync(names)
    }

    fn sync_all(&self) -> Result<()> {
        add(&self.counts[idx(ObjectClass::Control)].other, 1);
        self.inner.sync_all()
    }

    fn list(&self) -> Result<Vec<String>> {
        add(&self.counts[idx(ObjectClass::Control)].other, 1);
        self.inner.list()
    }

    fn list_each(&self, f: &mut dyn FnMut(&str) -> Result<()>) -> Result<()> {
        add(&self.counts[idx(ObjectClass::Control)].other, 1);
        self.inner.list_each(f)
    }

    // `read_all` keeps the default (len + read_at through this wrapper, so both count).

    fn replace(&self, name: &str, data: &[u8]) -> Result<()> {
        let c = self.of(name);
        add(&c.writes, 1);
        self.inner.replace(name, data)?;
        add(&c.write_bytes, data.len() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[test]
    fn reports_the_limit_of_the_store_it_wraps() {
        let s = CountingStore::new(MemStore::with_max_object_len(100));
        assert_eq!(s.max_object_len(), 100);
        assert!(s.set_len("f/1.d", 101).is_err());
        s.set_len("f/1.d", 100).unwrap();
    }

    #[test]
    fn classifies_and_counts_exactly() {
        let s = CountingStore::new(MemStore::new());
        s.write_at("f/1.d", 0, &[1; 100]).unwrap();
        s.write_at("f/1.d", 100, &[1; 28]).unwrap();
        s.write_at("f/1.m", 0, &[2; 32]).unwrap();
        s.write_at("f/1.c", 0, &[2; 8]).unwrap();
        s.write_at("journal.0", 0, &[3; 10]).unwrap();
        s.replace("config", &[4; 7]).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(s.read_at("f/1.d", 100, &mut buf).unwrap(), 28);
        assert_eq!(s.read_all("f/1.m").unwrap().unwrap().len(), 32);
        assert!(s.read_at("missing.d", 0, &mut buf).is_err());
        s.set_len("f/1.d", 10).unwrap();
        s.delete("journal.0").unwrap();
        s.sync(&["f/1.d".into(), "f/1.m".into(), "config".into()])
            .unwrap();
        s.sync_all().unwrap();
        s.list().unwrap();

        let st = s.stats();
        assert_eq!(
            st.data,
            IoCounts {
                read_bytes: 28,
                write_bytes: 128,
                reads: 2,
                writes: 2,
                other: 2
            }
        );
        assert_eq!(
            st.integrity,
            IoCounts {
                read_bytes: 32,
                write_bytes: 40,
                reads: 1,
                writes: 2,
                other: 2
            }
        );
        assert_eq!(
            st.journal,
            IoCounts {
                read_bytes: 0,
                write_bytes: 10,
                reads: 0,
                writes: 1,
                other: 1
            }
        );
        assert_eq!(
            st.control,
            IoCounts {
                read_bytes: 0,
                write_bytes: 7,
                reads: 0,
                writes: 1,
                other: 3
            }
        );
        assert_eq!(st.get(ObjectClass::Journal), &st.journal);
        assert_eq!(st.total().write_bytes, 128 + 40 + 10 + 7);

        let before = s.stats();
        s.write_at("x.d", 0, &[0; 5]).unwrap();
        let delta = s.stats().since(&before);
        assert_eq!(
            delta.data,
            IoCounts {
                write_bytes: 5,
                writes: 1,
                ..Default::default()
            }
        );
        assert_eq!(delta.integrity, IoCounts::default());
        assert_eq!(s.stats() - before, delta);

        s.reset();
        assert_eq!(s.stats(), IoStats::default());
        assert_eq!(s.inner().len("x.d").unwrap(), Some(5));
        assert_eq!(s.stats(), IoStats::default(), "inner calls are not counted");
        let json = serde_json::to_string(&s.stats()).unwrap();
        assert!(json.contains("\"integrity\""));
    }

    fn counts(read_bytes: u64, write_bytes: u64, reads: u64, writes: u64, other: u64) -> IoCounts {
        IoCounts {
            read_bytes,
            write_bytes,
            reads,
            writes,
            other,
        }
    }

    /// Sums and differences go field by field; a difference saturates at zero.
    #[test]
    fn counts_add_and_subtract_field_by_field() {
        let a = counts(10, 20, 3, 4, 5);
        let b = counts(1, 2, 30, 1, 7);
        assert_eq!(a.plus(&b), counts(11, 22, 33, 5, 12));
        assert_eq!(a - b, counts(9, 18, 0, 3, 0));
        assert_eq!(b - a, counts(0, 0, 27, 0, 2));
        let st = IoStats {
            data: a,
            integrity: b,
            journal: a,
            control: counts(100, 0, 0, 0, 1),
        };
        assert_eq!(st.total(), counts(121, 42, 36, 9, 18));
        assert_eq!(st.get(ObjectClass::Data), &a);
        assert_eq!(st.get(ObjectClass::Integrity), &b);
        assert_eq!(st.get(ObjectClass::Control), &st.control);
        let earlier = IoStats {
            data: b,
            integrity: a,
            journal: IoCounts::default(),
            control: counts(1, 0, 0, 0, 0),
        };
        assert_eq!(
            st - earlier,
            IoStats {
                data: a - b,
                integrity: b - a,
                journal: a,
                control: counts(99, 0, 0, 0, 1),
            }
        );
    }
}
