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
mod fault;
mod local;
mod memory;
pub mod record;
mod trusted;

pub use counting::{CountingStore, IoCounts, IoStats};
pub use fault::{CrashImage, FaultPlan, FaultStore};
pub use local::LocalDirStore;
pub use memory::MemStore;
pub use trusted::{LocalStateDir, MemTrusted, TrustedLock, TrustedStore};

/// What an object holds, for the counting wrapper and for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectClass {
    /// Encrypted file blocks (names ending in `.d`).
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
        if name.ends_with(".d") {
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
    fn max_object_len(&self) -> u64 {
        (**self).max_object_len()
    }
    fn reserve(&self, name: &str, len: u64) -> Result<()> {
        (**self).reserve(name, len)
    }
    fn read_all(&self, name: &str) -> Result<Option<Vec<u8>>> {
        (**self).read_all(name)
    }
    fn replace(&self, name: &str, data: &[u8]) -> Result<()> {
        (**self).replace(name, data)
    }
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
