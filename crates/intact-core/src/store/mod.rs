//! Stores: where bytes live.
//!
//! The *untrusted* store holds everything the adversary may touch (ciphertext blocks,
//! integrity metadata, the journal, the config). The *trusted* store holds the constant-size
//! anchor that the adversary can neither modify nor roll back.
//!
//! Object names are relative, `/`-separated, and never contain `..`; each object is a
//! byte array addressed by offset (like a file), so that block-granular updates do not
//! rewrite whole objects.

use crate::error::Result;

mod counting;
mod etcd;
mod fault;
mod local;
mod memory;
pub mod record;
mod s3;
mod trusted;

pub use counting::{CountingStore, IoCounts, IoStats};
pub use etcd::{EtcdAnchor, EtcdUrl, LEASE_TTL_SECS};
pub use fault::{CrashImage, FaultPlan, FaultStore};
pub use local::LocalDirStore;
pub use memory::MemStore;
pub use s3::{S3Store, S3Url};
pub use trusted::{LocalStateDir, MemTrusted, SeenRoot, TrustedLock, TrustedStore};

/// What an object holds, for the counting wrapper and for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectClass {
    /// Encrypted file blocks (names ending in `.d`, and `.t` for the twin slots).
    Data,
    /// Integrity metadata, US_F: Merkle nodes (`.m`), spilled counter intervals (`.c`).
    Integrity,
    /// The commit journal (`journal.*`).
    Journal,
    /// Everything else: the config, the anchor copy.
    Control,
}

impl ObjectClass {
    /// Classifies an object by its name.
    pub fn of(name: &str) -> ObjectClass {
        if name.ends_with(".d") || name.ends_with(".t") {
            ObjectClass::Data
        } else if name.ends_with(".m") || name.ends_with(".c") {
            ObjectClass::Integrity
        } else if name.starts_with("journal") {
            ObjectClass::Journal
        } else {
            ObjectClass::Control
        }
    }
}

/// Storage the adversary controls. Every method may be called concurrently.
///
/// Contracts (the engine's crash safety relies on them):
/// - `write_at` past the end extends the object, filling any gap with zeros; it creates
///   a missing object.
/// - Nothing is durable until `sync` (of that object) or `sync_all` returns; after a
///   crash, any subset of the unsynced writes may have reached the media.
/// - `read_at` returns the number of bytes read, short only at the end of the object;
///   reading a missing object is an error of kind `NotFound`.
pub trait UntrustedStore: Send + Sync {
    /// Reads up to `buf.len()` bytes at `off`; returns how many were read.
    fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize>;
    /// Writes `data` at `off`, creating and extending the object as needed.
    fn write_at(&self, name: &str, off: u64, data: &[u8]) -> Result<()>;
    /// The object's length, or `None` when it does not exist.
    fn len(&self, name: &str) -> Result<Option<u64>>;
    /// Truncates or extends (with zeros) the object, creating it if missing.
    fn set_len(&self, name: &str, len: u64) -> Result<()>;
    /// Deletes the object; deleting a missing object is not an error.
    fn delete(&self, name: &str) -> Result<()>;
    /// Makes the named objects' contents, lengths and existence (and deletions) durable.
    fn sync(&self, names: &[String]) -> Result<()>;
    /// Makes everything written so far durable.
    fn sync_all(&self) -> Result<()>;
    /// Lists all objects (names), in no particular order.
    fn list(&self) -> Result<Vec<String>>;
    /// Calls `f` with the name of every object, in no particular order, stopping at its
    /// first error; what [`UntrustedStore::list`] lists, without holding every name at once
    /// (a volume of 10^6 files has 10^6 objects: 64 MB of names for fsck's orphan check).
    /// The default walks `list`'s result; a store that can stream overrides it.
    fn list_each(&self, f: &mut dyn FnMut(&str) -> Result<()>) -> Result<()> {
        self.list()?.iter().try_for_each(|n| f(n))
    }
    /// When object `name` was last changed, where the store can tell (for diagnoses only:
    /// the store is untrusted, so is this).
    fn modified(&self, _name: &str) -> Option<std::time::SystemTime> {
        None
    }
    /// The longest object the store can hold (a local directory: its file system's largest
    /// file, 16 TiB − 4 KiB on ext4 with 4 KiB blocks). The engine refuses a write or a
    /// truncation that would need a longer object when it arrives (EFBIG), instead of
    /// failing the seal that would store it.
    fn max_object_len(&self) -> u64 {
        u64::MAX
    }

    /// Sets aside room for the object to grow to `len` bytes, so that writes up to `len`
    /// still succeed once the store is full (the log keeps room for the records of
    /// requests that free space). A store may do it by writing zeros up to `len` (the
    /// local directory does, so that writes over them sync without a journal commit), so
    /// the object's length afterwards says nothing of what was written. A store that cannot
    /// reserve does nothing.
    fn reserve(&self, _name: &str, _len: u64) -> Result<()> {
        Ok(())
    }

    /// A hint: no object named `name` exists (its name comes from a fresh random file
    /// id), so a store that must otherwise look an object up before its first write (S3:
    /// a listing, one round trip per new file) may skip that. Only ever a saving: a store
    /// may ignore it, and nothing read is trusted for it. The default does nothing.
    fn absent(&self, _name: &str) {}

    /// Forgets what the store keeps in memory of the stored objects (lengths, chunks
    /// read), keeping unsynced writes: a reader that follows a writer in another process
    /// then sees what the writer stored since ([`crate::Volume::refresh`]). The default
    /// keeps nothing to forget.
    fn forget_cached(&self) {}

    /// Whether unsynced writes are lost when the process ends (a store that keeps them in
    /// its own memory until a sync: S3), where a local directory's are in the kernel's page
    /// cache and survive a crash of the process. The engine's periodic seal then syncs
    /// the files written since the last one too, not only the log (docs/design.md, "The
    /// log").
    fn unsynced_writes_die_with_the_process(&self) -> bool {
        false
    }

    /// Reads a whole object, or `None` when it does not exist.
    fn read_all(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let Some(len) = self.len(name)? else {
            return Ok(None);
        };
        let mut buf = vec![0u8; len as usize];
        let n = self.read_at(name, 0, &mut buf)?;
        buf.truncate(n);
        Ok(Some(buf))
    }

    /// Replaces a whole object atomically (readers see the old or the new bytes, never a mix)
    /// and durably. The default writes in place; stores override it with a rename.
    fn replace(&self, name: &str, data: &[u8]) -> Result<()> {
        self.set_len(name, 0)?;
        self.write_at(name, 0, data)?;
        self.sync(&[name.to_string()])
    }
}

impl<T: UntrustedStore + ?Sized> UntrustedStore for std::sync::Arc<T> {
    fn modified(&self, name: &str) -> Option<std::time::SystemTime> {
        (**self).modified(name)
    }
    fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
        (**self).read_at(name, off, buf)
    }
    fn write_at(&self, name: &str, off: u64, data: &[u8]) -> Result<()> {
        (**self).write_at(name, off, data)
    }
    fn len(&self, name: &str) -> Result<Option<u64>> {
        (**self).len(name)
    }
    fn set_len(&self, name: &str, len: u64) -> Result<()> {
        (**self).set_len(name, len)
    }
    fn delete(&self, name: &str) -> Result<()> {
        (**self).delete(name)
    }
    fn sync(&self, names: &[String]) -> Result<()> {
        (**self).sync(names)
    }
    fn sync_all(&self) -> Result<()> {
        (**self).sync_all()
    }
    fn list(&self) -> Result<Vec<String>> {
        (**self).list()
    }
    fn list_each(&self, f: &mut dyn FnMut(&str) -> Result<()>) -> Result<()> {
        (**self).list_each(f)
    }
    fn max_object_len(&self) -> u64 {
        (**self).max_object_len()
    }
    fn reserve(&self, name: &str, len: u64) -> Result<()> {
        (**self).reserve(name, len)
    }
    fn unsynced_writes_die_with_the_process(&self) -> bool {
        (**self).unsynced_writes_die_with_the_process()
    }
    fn absent(&self, name: &str) {
        (**self).absent(name)
    }
    fn forget_cached(&self) {
        (**self).forget_cached()
    }
    fn read_all(&self, name: &str) -> Result<Option<Vec<u8>>> {
        (**self).read_all(name)
    }
    fn replace(&self, name: &str, data: &[u8]) -> Result<()> {
        (**self).replace(name, data)
    }
}

/// Every name [`UntrustedStore::list_each`] gives, collected: `list` for the stores that
/// stream their listing.
pub(crate) fn names_of(s: &dyn UntrustedStore) -> Result<Vec<String>> {
    let mut out = Vec::new();
    s.list_each(&mut |n| {
        out.push(n.to_string());
        Ok(())
    })?;
    Ok(out)
}

/// Rejects names that could escape a store's root.
pub fn check_name(name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name.starts_with('/')
        || name
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        || name.contains('\0');
    if bad {
        return Err(crate::Error::Invalid(format!("bad object name {name:?}")));
    }
    Ok(())
}

/// The contracts of [`UntrustedStore`], checked on every store of this module through the
/// trait alone (and through an `Arc`, whose impl forwards every call).
/// Runs `f` on each chunk of `per_thread` items of `items`, each chunk on a scoped thread of
/// its own (for syncs: the device overlaps them, a journal commits them together); a chunk
/// whose thread cannot be started (the process's limit) runs on the caller's thread. Every
/// chunk runs to its end before the first error is returned.
pub(crate) fn on_threads<T: Sync>(
    items: &[T],
    per_thread: usize,
    f: impl Fn(&[T]) -> Result<()> + Sync,
) -> Result<()> {
    let f = &f;
    std::thread::scope(|s| {
        let mut here = Vec::new();
        let mut threads = Vec::new();
        for some in items.chunks(per_thread.max(1)) {
            match std::thread::Builder::new().spawn_scoped(s, move || f(some)) {
                Ok(t) => threads.push(t),
                Err(_) => here.push(some),
            }
        }
        let mut done: Vec<Result<()>> = here.into_iter().map(f).collect();
        done.extend(threads.into_iter().map(|t| {
            t.join()
                .unwrap_or_else(|_| Err(crate::Error::Invalid("a sync thread panicked".into())))
        }));
        done.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    })
}

#[cfg(test)]
mod tests {
    /// Every chunk runs, each once, and an error is returned after all of them ran.
    #[test]
    fn on_threads_runs_every_chunk_and_reports_an_error() {
        let items: Vec<u32> = (0..50).collect();
        let seen = std::sync::Mutex::new(Vec::new());
        let r = on_threads(&items, 7, |some| {
            seen.lock().unwrap().extend_from_slice(some);
            match some.contains(&20) {
                true => Err(crate::Error::Invalid("20".into())),
                false => Ok(()),
            }
        });
        assert!(matches!(r, Err(crate::Error::Invalid(m)) if m == "20"));
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, items);
        assert!(on_threads(&items, 1, |_| Ok(())).is_ok());
    }

    use super::*;
    use crate::Error;
    use std::sync::Arc;

    fn not_found(r: Result<usize>) -> bool {
        matches!(r, Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// Every contract of the trait's documentation, on a store that starts empty.
    pub(super) fn keeps_the_contract(s: &dyn UntrustedStore) {
        let mut buf = [9u8; 8];
        assert_eq!(s.list().unwrap(), Vec::<String>::new());
        assert_eq!(s.len("a/x.d").unwrap(), None);
        assert_eq!(s.read_all("a/x.d").unwrap(), None);
        assert!(not_found(s.read_at("a/x.d", 0, &mut buf)));
        // A write past the end creates the object and fills the gap with zeros.
        s.write_at("a/x.d", 3, b"abc").unwrap();
        assert_eq!(s.len("a/x.d").unwrap(), Some(6));
        assert_eq!(s.read_all("a/x.d").unwrap().unwrap(), b"\0\0\0abc");
        // Reads are short at the end only.
        assert_eq!(s.read_at("a/x.d", 1, &mut buf[..4]).unwrap(), 4);
        assert_eq!(&buf[..4], b"\0\0ab");
        assert_eq!(s.read_at("a/x.d", 4, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"bc");
        assert_eq!(s.read_at("a/x.d", 6, &mut buf).unwrap(), 0);
        assert_eq!(s.read_at("a/x.d", 1 << 40, &mut buf).unwrap(), 0);
        // Overwrites in place, extending past the end.
        s.write_at("a/x.d", 5, b"XY").unwrap();
        assert_eq!(s.read_all("a/x.d").unwrap().unwrap(), b"\0\0\0abXY");
        // set_len both ways, and on a missing object.
        s.set_len("a/x.d", 4).unwrap();
        assert_eq!(s.read_all("a/x.d").unwrap().unwrap(), b"\0\0\0a");
        s.set_len("a/x.d", 6).unwrap();
        assert_eq!(s.read_all("a/x.d").unwrap().unwrap(), b"\0\0\0a\0\0");
        s.set_len("b.m", 2).unwrap();
        assert_eq!(s.read_all("b.m").unwrap().unwrap(), b"\0\0");
        // replace is whole, longer or shorter.
        s.replace("c", b"first version").unwrap();
        s.replace("c", b"second").unwrap();
        assert_eq!(s.read_all("c").unwrap().unwrap(), b"second");
        s.sync(&["a/x.d".into(), "c".into()]).unwrap();
        s.sync_all().unwrap();
        let mut names = s.list().unwrap();
        names.sort();
        assert_eq!(names, ["a/x.d", "b.m", "c"]);
        // list_each streams the same names, and stops at the first error it is handed.
        let mut each = Vec::new();
        s.list_each(&mut |n| {
            each.push(n.to_string());
            Ok(())
        })
        .unwrap();
        each.sort();
        assert_eq!(each, names);
        let mut seen = 0;
        let r = s.list_each(&mut |_| {
            seen += 1;
            Err(Error::Invalid("stop".into()))
        });
        assert!(matches!(r, Err(Error::Invalid(m)) if m == "stop"));
        assert_eq!(seen, 1);
        // Deletion, also of a missing object.
        s.delete("b.m").unwrap();
        s.delete("b.m").unwrap();
        s.delete("never").unwrap();
        assert_eq!(s.len("b.m").unwrap(), None);
        let mut names = s.list().unwrap();
        names.sort();
        assert_eq!(names, ["a/x.d", "c"]);
        // Room set aside takes writes up to its length.
        s.reserve("r", 100).unwrap();
        s.write_at("r", 96, b"1234").unwrap();
        assert_eq!(s.read_at("r", 96, &mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"1234");
        // Names that could escape the root.
        for bad in ["", "/abs", "a/../b", "a//b", "./a", "a/", "nul\0"] {
            assert!(s.write_at(bad, 0, b"x").is_err(), "{bad:?}");
            assert!(s.set_len(bad, 1).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn memory_store_keeps_the_contract() {
        keeps_the_contract(&MemStore::new());
        keeps_the_contract(&Arc::new(MemStore::new()));
        let dynamic: Arc<dyn UntrustedStore> = Arc::new(MemStore::new());
        keeps_the_contract(&dynamic);
    }

    #[test]
    fn local_store_keeps_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        keeps_the_contract(&LocalDirStore::open(dir.path()).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(LocalDirStore::open(dir.path()).unwrap());
        keeps_the_contract(&s);
        // An Arc forwards what the store can tell of its objects.
        assert!(s.modified("c").is_some());
        assert_eq!(s.modified("missing"), None);
        assert_eq!(s.max_object_len(), s.as_ref().max_object_len());
        assert!(s.max_object_len() < u64::MAX);
        // The local store reserves by writing zeros up to the length.
        s.reserve("z", 50).unwrap();
        assert_eq!(s.len("z").unwrap(), Some(50));
        // So does the counting wrapper.
        let dir = tempfile::tempdir().unwrap();
        let c = CountingStore::new(LocalDirStore::open(dir.path()).unwrap());
        keeps_the_contract(&c);
        assert!(c.modified("c").is_some());
        c.reserve("z", 50).unwrap();
        assert_eq!(c.len("z").unwrap(), Some(50));
        // And the fault wrapper.
        let dir = tempfile::tempdir().unwrap();
        let f = FaultStore::new(LocalDirStore::open(dir.path()).unwrap());
        keeps_the_contract(&f);
        assert!(f.modified("c").is_some());
    }

    #[test]
    fn wrappers_keep_the_contract() {
        keeps_the_contract(&CountingStore::new(MemStore::new()));
        keeps_the_contract(&FaultStore::new(MemStore::new()));
        keeps_the_contract(&FaultStore::new_mem());
    }

    /// Syncs reach the store behind an `Arc`: what they make durable is no longer pending.
    #[test]
    fn syncs_are_forwarded() {
        let f = Arc::new(FaultStore::new_mem());
        let s: &dyn UntrustedStore = &f;
        s.write_at("a", 0, b"x").unwrap();
        s.write_at("b", 0, b"y").unwrap();
        assert_eq!(f.pending_mutations(), 2);
        s.sync(&["a".into()]).unwrap();
        assert_eq!((f.syncs(), f.pending_mutations()), (1, 1));
        s.sync_all().unwrap();
        assert_eq!((f.syncs(), f.pending_mutations()), (2, 0));
    }

    /// A store's largest object, through an `Arc` and the wrappers.
    #[test]
    fn the_largest_object_is_forwarded() {
        let s = Arc::new(MemStore::with_max_object_len(100));
        assert_eq!(s.max_object_len(), 100);
        assert_eq!(CountingStore::new(Arc::clone(&s)).max_object_len(), 100);
        assert_eq!(FaultStore::new(Arc::clone(&s)).max_object_len(), 100);
        assert!(s.write_at("a", 99, b"x").is_ok());
        assert!(s.write_at("a", 100, b"x").is_err());
        assert!(s.set_len("a", 101).is_err());
        assert_eq!(MemStore::new().max_object_len(), u64::MAX);
    }

    /// A store that implements only what it must: the trait's defaults.
    struct Minimal(MemStore);

    impl UntrustedStore for Minimal {
        fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
            self.0.read_at(name, off, buf)
        }
        fn write_at(&self, name: &str, off: u64, data: &[u8]) -> Result<()> {
            self.0.write_at(name, off, data)
        }
        fn len(&self, name: &str) -> Result<Option<u64>> {
            self.0.len(name)
        }
        fn set_len(&self, name: &str, len: u64) -> Result<()> {
            self.0.set_len(name, len)
        }
        fn delete(&self, name: &str) -> Result<()> {
            self.0.delete(name)
        }
        fn sync(&self, names: &[String]) -> Result<()> {
            self.0.sync(names)
        }
        fn sync_all(&self) -> Result<()> {
            self.0.sync_all()
        }
        fn list(&self) -> Result<Vec<String>> {
            self.0.list()
        }
    }

    #[test]
    fn the_defaults_keep_the_contract() {
        keeps_the_contract(&Minimal(MemStore::new()));
        let m = Minimal(MemStore::new());
        assert_eq!(m.max_object_len(), u64::MAX);
        assert_eq!(m.modified("x"), None);
        // The default reserve sets nothing aside and writes nothing.
        m.reserve("r", 10).unwrap();
        assert_eq!(m.len("r").unwrap(), None);
    }

    #[test]
    fn objects_are_classed_by_name() {
        for (name, class) in [
            ("f/ab/abcd.d", ObjectClass::Data),
            ("f/ab/abcd.t", ObjectClass::Data),
            ("f/ab/abcd.m", ObjectClass::Integrity),
            ("f/ab/abcd.c", ObjectClass::Integrity),
            ("journal.0", ObjectClass::Journal),
            ("journal", ObjectClass::Journal),
            ("intact.conf", ObjectClass::Control),
            ("anchor.copy", ObjectClass::Control),
            ("x.dd", ObjectClass::Control),
            ("log/journal.d", ObjectClass::Data),
        ] {
            assert_eq!(ObjectClass::of(name), class, "{name}");
        }
    }

    #[test]
    fn names_that_could_escape_are_refused() {
        for ok in [
            "a",
            "f/ab/abcd.d",
            "a.b/c..d",
            ".hidden",
            "a/...",
            "journal.1",
        ] {
            assert!(check_name(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "", "/", "/a", "a/", "a//b", ".", "..", "a/./b", "a/../b", "../a", "a\0b",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
