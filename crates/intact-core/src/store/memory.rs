//! An in-memory untrusted store, for tests and benchmarks.

use super::{check_name, UntrustedStore};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::RwLock;

/// Objects held in memory. `sync` is a no-op: nothing is lost but by dropping the store.
#[derive(Debug, Default)]
pub struct MemStore {
    objects: RwLock<BTreeMap<String, Vec<u8>>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
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
}
