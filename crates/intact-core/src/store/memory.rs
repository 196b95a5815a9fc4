//! An in-memory untrusted store, for tests and benchmarks.

use super::{check_name, UntrustedStore};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::RwLock;

/// Objects held in memory. `sync` is a no-op: nothing is lost but by dropping the store.
#[derive(Debug, Default)]
pub struct MemStore {
    objects: RwLock<BTreeMap<String, Vec<u8>>>,
    /// Longest object (`None`: no limit); writes past it fail with EFBIG, as a file
    /// system's do past its largest file.
    max_len: Option<u64>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose objects cannot grow past `max_len` bytes (EFBIG), like a file
    /// system's largest file.
    pub fn with_max_object_len(max_len: u64) -> Self {
        MemStore {
            max_len: Some(max_len),
            ..Self::default()
        }
    }

    fn check_len(&self, name: &str, len: u64) -> Result<()> {
        match self.max_len {
            Some(max) if len > max => Err(Error::io(
                name,
                std::io::Error::from_raw_os_error(libc::EFBIG),
            )),
            _ => Ok(()),
        }
    }

    /// A deep copy of all objects (for tests that snapshot and roll back).
    pub fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        self.objects.read().unwrap().clone()
    }

    /// Replaces all objects with a snapshot.
    pub fn restore(&self, snap: BTreeMap<String, Vec<u8>>) {
        *self.objects.write().unwrap() = snap;
    }

    /// Builds a store from a snapshot.
    pub fn from_snapshot(snap: BTreeMap<String, Vec<u8>>) -> Self {
        MemStore {
            objects: RwLock::new(snap),
            max_len: None,
        }
    }

    /// Direct mutable access to one object's bytes (for attack tests).
    pub fn with_object<R>(&self, name: &str, f: impl FnOnce(&mut Vec<u8>) -> R) -> Option<R> {
        self.objects.write().unwrap().get_mut(name).map(f)
    }
}

fn not_found(name: &str) -> Error {
    Error::io(
        name,
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such object"),
    )
}

impl UntrustedStore for MemStore {
    fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
        let objs = self.objects.read().unwrap();
        let obj = objs.get(name).ok_or_else(|| not_found(name))?;
        let start = (off as usize).min(obj.len());
        let n = buf.len().min(obj.len() - start);
        buf[..n].copy_from_slice(&obj[start..start + n]);
        Ok(n)
    }

    fn write_at(&self, name: &str, off: u64, data: &[u8]) -> Result<()> {
        check_name(name)?;
        self.check_len(name, off.saturating_add(data.len() as u64))?;
        let mut objs = self.objects.write().unwrap();
        let obj = objs.entry(name.to_string()).or_default();
        let end = off as usize + data.len();
        if obj.len() < end {
            obj.resize(end, 0);
        }
        obj[off as usize..end].copy_from_slice(data);
        Ok(())
    }

    fn len(&self, name: &str) -> Result<Option<u64>> {
        Ok(self
            .objects
            .read()
            .unwrap()
            .get(name)
            .map(|o| o.len() as u64))
    }

    fn set_len(&self, name: &str, len: u64) -> Result<()> {
        check_name(name)?;
        self.check_len(name, len)?;
        self.objects
            .write()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .resize(len as usize, 0);
        Ok(())
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.objects.write().unwrap().remove(name);
        Ok(())
    }

    fn sync(&self, _names: &[String]) -> Result<()> {
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        Ok(())
    }

    fn list(&self) -> Result<Vec<String>> {
        Ok(self.objects.read().unwrap().keys().cloned().collect())
    }

    fn max_object_len(&self) -> u64 {
        self.max_len.unwrap_or(u64::MAX)
    }
}
