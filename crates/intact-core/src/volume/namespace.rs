//! Directories: lookup, path resolution, create, link, unlink and rename.

#[allow(unused_imports)]
use super::*;

pub(super) fn valid_name(name: &str) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::fs(name, FsErrorKind::NameTooLong));
    }
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Error::fs(name, FsErrorKind::InvalidName));
    }
    Ok(())
}

pub(super) fn split_path(path: &str) -> Vec<&str> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

pub(super) fn parent_and_name(path: &str) -> Result<(Vec<&str>, &str)> {
    let mut comps = split_path(path);
    let name = comps
        .pop()
        .ok_or_else(|| Error::fs(path, FsErrorKind::InvalidName))?;
    valid_name(name)?;
    Ok((comps, name))
}

pub(super) fn encode_dir(entries: &BTreeMap<String, (u64, Kind)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + entries.len() * 24);
    out.extend_from_slice(b"IDIR");
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (name, (ino, kind)) in entries {
        out.push(*kind as u8);
        out.extend_from_slice(&ino.to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
    }
    out
}

pub(super) fn decode_dir(b: &[u8]) -> Option<BTreeMap<String, (u64, Kind)>> {
    let mut m = BTreeMap::new();
    if b.is_empty() {
        return Some(m);
    }
    let mut r = crate::tx::Reader { b, pos: 0 };
    if r.take(4)? != b"IDIR" {
        return None;
    }
    let n = r.u32()?;
    for _ in 0..n {
        let kind = Kind::of_entry(r.take(1)?[0])?;
        let ino = r.u64()?;
        let nl = r.u16()? as usize;
        let name = std::str::from_utf8(r.take(nl)?).ok()?.to_string();
        m.insert(name, (ino, kind));
    }
    (r.pos == b.len()).then_some(m)
}

/// A directory's units in its file, read and written through its scheme
/// ([`dirtree::Units`]).
/// Units read once are kept decrypted in `cache` (verified, as the read returned them); a
/// write or a cut drops the units it changes before it changes them.
struct FileUnits<'a, 'e> {
    env: &'a Env<'e>,
    tx: &'a mut Tx,
    of: &'a mut OpenFile,
    cache: &'a mut unitcache::UnitCache,
    ino: u64,
    unit: usize,
}

impl dirtree::Units for FileUnits<'_, '_> {
    fn read(&mut self, k: u32) -> Result<Arc<[u8]>> {
        if let Some(b) = self.cache.get(&self.of.inode.id, k) {
            return Ok(b);
        }
        let off = k as u64 * self.unit as u64;
        let len = self.of.inode.size.saturating_sub(off).min(self.unit as u64);
        let buf = file_read_shared(self.env, self.tx, self.of, off, len as usize)?;
        self.cache.put(&self.of.inode.id, k, buf.clone());
        Ok(buf)
    }
    fn write(&mut self, k: u32, b: &[u8]) -> Result<()> {
        let units = b.len().div_ceil(self.unit).max(1) as u32;
        let id = self.of.inode.id;
        self.cache.remove_range(&id, k, units);
        file_write(self.env, self.tx, self.of, k as u64 * self.unit as u64, b)?;
        // What was written is what a read of the unit returns now when it is the whole
        // unit, or ends the file: keep it, so that the operations after a create or an
        // unlink meet the leaf it changed without reading it back. (The tree writes one
        // unit at a time; a longer write is only dropped.)
        let whole = (self.of.inode.size)
            .saturating_sub(k as u64 * self.unit as u64)
            .min(self.unit as u64);
        if b.len() as u64 == whole {
            self.cache.put(&id, k, b.into());
        }
        Ok(())
    }
    fn set_len(&mut self, len: u64) -> Result<()> {
        let first = (len / self.unit as u64).min(u32::MAX as u64) as u32;
        let id = self.of.inode.id;
        let kept = self.cache.take(&id, first);
        self.cache.remove_from(&id, first);
        file_truncate(self.env, self.tx, self.of, len)?;
        // The unit the new end falls in reads as its old bytes cut there, or, when the file
        // grew from inside it, as its old bytes and zeros up to the end.
        let rem = (len % self.unit as u64) as usize;
        if let (Some(old), true) = (kept, rem > 0) {
            let mut b = old.to_vec();
            b.resize(rem, 0);
            self.cache.put(&id, first, b.into());
        }
        Ok(())
    }
    fn malformed(&self, what: &str) -> Error {
        Error::tampered(Subject::Inode(self.ino), None, what)
    }
    fn kept(&mut self, k: u32) -> Option<Arc<dirtree::Unit>> {
        self.cache.node(&self.of.inode.id, k)
    }
    fn keep(&mut self, k: u32, b: &Arc<[u8]>, u: &Arc<dirtree::Unit>) {
        self.cache.keep_node(&self.of.inode.id, k, b, u);
    }
}

impl Inner {
    /// Runs `f` on directory `ino`'s tree (a volume with [`DIR_TREE`]); the units it
    /// dirties count towards the dirty limit.
    fn with_tree<T>(
        &mut self,
        ino: u64,
        path: &str,
        f: impl FnOnce(&mut dirtree::DirTree<'_, FileUnits<'_, '_>>) -> Result<T>,
    ) -> Result<T> {
        self.ensure_open(ino)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("open");
        if of.inode.kind != Kind::Dir {
            return Err(Error::fs(path, FsErrorKind::NotADirectory));
        }
        let before = of.dirty.len();
        let unit = dirtree::unit_size(env.bs);
        let mut units = FileUnits {
            env: &env,
            tx: &mut self.tx,
            of,
            cache: &mut self.units,
            ino,
            unit,
        };
        let r = f(&mut dirtree::DirTree {
            units: &mut units,
            key: &self.keys.names,
            unit,
        });
        let grown = units.of.dirty.len().saturating_sub(before);
        self.dirty_bytes += grown * env.bs;
        r
    }

    /// The entries of open directory `ino` on a volume without [`DIR_TREE`], decoded
    /// whole on first use.
    pub(super) fn loaded_dir(
        &mut self,
        ino: u64,
        path: &str,
    ) -> Result<&mut BTreeMap<String, (u64, Kind)>> {
        self.ensure_open(ino)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("open");
        if of.inode.kind != Kind::Dir {
            return Err(Error::fs(path, FsErrorKind::NotADirectory));
        }
        if of.dir.is_none() {
            let mut buf = vec![0u8; of.inode.size as usize];
            file_read(&env, &mut self.tx, of, 0, &mut buf)?;
            let d = decode_dir(&buf)
                .ok_or_else(|| Error::tampered(Subject::Inode(ino), None, "malformed directory"))?;
            of.dir = Some(d);
        }
        Ok(of.dir.as_mut().expect("loaded"))
    }

    /// The entry `name` of directory `ino`.
    pub(super) fn dir_get(
        &mut self,
        ino: u64,
        name: &str,
        path: &str,
    ) -> Result<Option<(u64, Kind)>> {
        if self.dir_tree {
            return self.with_tree(ino, path, |t| t.get(name));
        }
        Ok(self.loaded_dir(ino, path)?.get(name).copied())
    }

    /// Sets (`Some`) or removes (`None`) the entry `name` of directory `ino` (not logged:
    /// [`Inner::set_entry`] is what requests call).
    pub(super) fn dir_put(
        &mut self,
        ino: u64,
        name: &str,
        target: Option<(u64, Kind)>,
    ) -> Result<()> {
        if self.dir_tree {
            self.with_tree(ino, name, |t| t.set(name, target))?;
        } else {
            let entries = self.loaded_dir(ino, name)?;
            match target {
                Some(t) => entries.insert(name.to_string(), t),
                None => entries.remove(name),
            };
            self.files.get_mut(&ino).expect("loaded").dir_order = None;
        }
        Ok(())
    }

    /// Whether directory `ino` has no entries.
    pub(super) fn dir_is_empty(&mut self, ino: u64, path: &str) -> Result<bool> {
        if self.dir_tree {
            return self.with_tree(ino, path, |t| Ok(t.header()?.entries == 0));
        }
        Ok(self.loaded_dir(ino, path)?.is_empty())
    }

    /// Up to `max` entries of directory `ino` whose cookies follow `after` (0: the start),
    /// in cookie order ([`dirtree`]: the order of a keyed hash of the names, stable while
    /// the directory changes). Fewer than `max`: the end.
    pub(super) fn dir_page(
        &mut self,
        ino: u64,
        after: u64,
        max: usize,
        path: &str,
    ) -> Result<Vec<(u64, DirEntry)>> {
        let listed = |(c, e): (u64, dirtree::Ent)| {
            (
                c,
                DirEntry {
                    name: e.name,
                    ino: e.ino,
                    kind: e.kind,
                },
            )
        };
        if self.dir_tree {
            let page = self.with_tree(ino, path, |t| t.page(after, max))?;
            return Ok(page.into_iter().map(listed).collect());
        }
        // The whole list, ordered as a tree would order it (sorted once after a change).
        self.loaded_dir(ino, path)?;
        let names = &self.keys.names;
        let of = self.files.get_mut(&ino).expect("loaded");
        let order = match &of.dir_order {
            Some(o) => o.clone(),
            None => {
                let mut es: Vec<dirtree::Ent> = of
                    .dir
                    .as_ref()
                    .expect("loaded")
                    .iter()
                    .map(|(n, &(ino, kind))| dirtree::Ent {
                        key: dirtree::name_key(names, n),
                        name: n.clone(),
                        ino,
                        kind,
                    })
                    .collect();
                es.sort_by(|a, b| (a.key, &a.name).cmp(&(b.key, &b.name)));
                let o = std::sync::Arc::new(dirtree::ranked(es).map(listed).collect::<Vec<_>>());
                of.dir_order = Some(o.clone());
                o
            }
        };
        let from = order.partition_point(|(c, _)| *c <= after);
        Ok(order[from..].iter().take(max).cloned().collect())
    }

    /// Every entry of directory `ino`, page by page (in cookie order).
    pub(super) fn dir_each(
        &mut self,
        ino: u64,
        path: &str,
        mut f: impl FnMut(&mut Self, DirEntry) -> Result<()>,
    ) -> Result<()> {
        const PAGE: usize = 512;
        let mut after = 0;
        loop {
            let page = self.dir_page(ino, after, PAGE, path)?;
            let n = page.len();
            for (c, e) in page {
                after = c;
                f(self, e)?;
            }
            if n < PAGE {
                return Ok(());
            }
        }
    }
    pub(super) fn resolve(&mut self, comps: &[&str], path: &str) -> Result<u64> {
        let mut ino = ROOT_INO;
        for (k, c) in comps.iter().enumerate() {
            // The prefix is only formatted for an error message.
            ino = self
                .dir_get(ino, c, "")
                .map_err(|e| e.at_path(&format!("/{}", comps[..k].join("/"))))?
                .ok_or_else(|| Error::fs(path, FsErrorKind::NotFound))?
                .0;
        }
        Ok(ino)
    }
    pub(super) fn create_path(&mut self, path: &str, kind: Kind, s: SchemeId) -> Result<u64> {
        let (parents, name) = parent_and_name(path)?;
        let pino = self.resolve(&parents, path)?;
        self.create_at(pino, name, kind, s, None, 0, 0)
            .map_err(|e| e.in_path(path))
    }
    pub(super) fn remove_path(&mut self, path: &str, dir: bool) -> Result<()> {
        let (parents, name) = parent_and_name(path)?;
        let pino = self.resolve(&parents, path)?;
        self.remove_at(pino, name, dir).map_err(|e| e.in_path(path))
    }
    pub(super) fn touch_dir(&mut self, ino: u64) {
        self.note_record(ino);
        if let Some(of) = self.files.get_mut(&ino) {
            // A whole-list directory is encoded again at the checkpoint; a tree's units
            // are already written.
            of.dir_dirty = of.dir.is_some();
            of.subdirs = None;
            of.record_dirty = true;
            of.inode.mtime_ns = now_ns();
            of.inode.ctime_ns = of.inode.mtime_ns;
        }
    }
    /// The entry `name` of directory `pino`, checked against the record it names.
    pub(super) fn child(&mut self, pino: u64, name: &str) -> Result<(u64, Kind)> {
        let (ino, kind) = self
            .dir_get(pino, name, "")?
            .ok_or_else(|| Error::fs(name, FsErrorKind::NotFound))?;
        let actual = match self.peek_record(ino)? {
            Some(rec) => rec.kind,
            None => self.files[&ino].inode.kind,
        };
        if actual != kind {
            return Err(Error::tampered(
                Subject::Inode(pino),
                None,
                format!("entry {name:?} names an inode of another kind"),
            ));
        }
        self.names.insert(ino, (pino, name.to_string()));
        Ok((ino, kind))
    }
    /// Whether directory `a` is `b` or one of its ancestors (walking up the parent links).
    pub(super) fn is_ancestor(&mut self, a: u64, b: u64) -> Result<bool> {
        let mut cur = b;
        for _ in 0..=self.header.count {
            if cur == a {
                return Ok(true);
            }
            if cur == ROOT_INO {
                return Ok(false);
            }
            cur = self.open_ino(cur)?.inode.link;
        }
        Err(Error::tampered(
            Subject::Inode(b),
            None,
            "directory parent links form a cycle",
        ))
    }
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_at(
        &mut self,
        pino: u64,
        name: &str,
        kind: Kind,
        s: SchemeId,
        mode: Option<u32>,
        uid: u32,
        gid: u32,
    ) -> Result<u64> {
        self.check_writable()?;
        valid_name(name)?;
        if self.dir_get(pino, name, name)?.is_some() {
            return Err(Error::fs(name, FsErrorKind::Exists));
        }
        let ino = self.new_inode(kind, s, mode, uid, gid)?;
        if kind == Kind::Dir {
            let of = self.files.get_mut(&ino).expect("created");
            of.inode.nlink = 2;
            of.inode.link = pino;
        }
        self.set_entry(pino, name, Some((ino, kind)))?;
        self.touch_dir(pino);
        self.names.insert(ino, (pino, name.to_string()));
        Ok(ino)
    }
    /// Adds the name `name` in `pino` for the file `ino` (a hard link).
    pub(super) fn link_at(&mut self, ino: u64, pino: u64, name: &str) -> Result<()> {
        self.check_writable()?;
        valid_name(name)?;
        let kind = self.open_ino(ino)?.inode.kind;
        if kind == Kind::Dir || kind == Kind::Xattr {
            return Err(Error::fs(name, FsErrorKind::NotPermitted));
        }
        if self.open_ino(ino)?.inode.nlink == 0 {
            return Err(Error::fs(name, FsErrorKind::NotFound));
        }
        if self.dir_get(pino, name, name)?.is_some() {
            return Err(Error::fs(name, FsErrorKind::Exists));
        }
        self.set_entry(pino, name, Some((ino, kind)))?;
        self.touch_dir(pino);
        let of = self.touch_record(ino)?;
        of.inode.nlink = of.inode.nlink.saturating_add(1);
        self.names.insert(ino, (pino, name.to_string()));
        Ok(())
    }
    pub(super) fn remove_at(&mut self, pino: u64, name: &str, dir: bool) -> Result<()> {
        self.check_writable()?;
        valid_name(name)?;
        let (ino, kind) = self.child(pino, name)?;
        match (dir, kind) {
            (true, Kind::Dir) => {
                if !self.dir_is_empty(ino, name)? {
                    return Err(Error::fs(name, FsErrorKind::NotEmpty));
                }
            }
            (true, _) => return Err(Error::fs(name, FsErrorKind::NotADirectory)),
            (false, Kind::Dir) => return Err(Error::fs(name, FsErrorKind::IsADirectory)),
            (false, _) => {}
        }
        self.set_entry(pino, name, None)?;
        self.touch_dir(pino);
        self.drop_link(ino)
    }
    pub(super) fn rename_at(
        &mut self,
        fpino: u64,
        fname: &str,
        tpino: u64,
        tname: &str,
        mode: RenameMode,
    ) -> Result<()> {
        self.check_writable()?;
        valid_name(fname)?;
        valid_name(tname)?;
        let (ino, kind) = self.child(fpino, fname)?;
        let target = match self.child(tpino, tname) {
            Ok(t) => Some(t),
            Err(Error::Fs {
                kind: FsErrorKind::NotFound,
                ..
            }) => None,
            Err(e) => return Err(e),
        };
        if kind == Kind::Dir && self.is_ancestor(ino, tpino)? {
            return Err(Error::fs(tname, FsErrorKind::RenameIntoSelf));
        }
        match (mode, target) {
            (RenameMode::NoReplace, Some(_)) => return Err(Error::fs(tname, FsErrorKind::Exists)),
            (RenameMode::Exchange, None) => return Err(Error::fs(tname, FsErrorKind::NotFound)),
            (RenameMode::Exchange, Some((tino, tkind))) => {
                if tkind == Kind::Dir && self.is_ancestor(tino, fpino)? {
                    return Err(Error::fs(fname, FsErrorKind::RenameIntoSelf));
                }
                self.set_entry(fpino, fname, Some((tino, tkind)))?;
                self.set_entry(tpino, tname, Some((ino, kind)))?;
                for (i, k, p, n) in [(ino, kind, tpino, tname), (tino, tkind, fpino, fname)] {
                    let of = self.touch_record(i)?;
                    if k == Kind::Dir {
                        of.inode.link = p;
                    }
                    self.names.insert(i, (p, n.to_string()));
                }
                self.touch_dir(fpino);
                self.touch_dir(tpino);
                return Ok(());
            }
            (_, Some((tino, _))) if tino == ino => return Ok(()),
            (_, Some((tino, tkind))) => {
                match (kind, tkind) {
                    (Kind::Dir, Kind::Dir) if !self.dir_is_empty(tino, tname)? => {
                        return Err(Error::fs(tname, FsErrorKind::NotEmpty));
                    }
                    (Kind::Dir, Kind::Dir) => {}
                    (Kind::Dir, _) => return Err(Error::fs(tname, FsErrorKind::NotADirectory)),
                    (_, Kind::Dir) => return Err(Error::fs(tname, FsErrorKind::IsADirectory)),
                    _ => {}
                }
                self.set_entry(tpino, tname, None)?;
                self.drop_link(tino)?;
            }
            (_, None) => {}
        }
        self.set_entry(fpino, fname, None)?;
        self.set_entry(tpino, tname, Some((ino, kind)))?;
        self.touch_dir(fpino);
        self.touch_dir(tpino);
        let of = self.touch_record(ino)?;
        if kind == Kind::Dir {
            of.inode.link = tpino;
        }
        self.names.insert(ino, (tpino, tname.to_string()));
        Ok(())
    }
    /// The subdirectories of directory `ino` (counted once after each change).
    pub(super) fn subdirs(&mut self, ino: u64) -> Result<u32> {
        if let Some(n) = self.open_ino(ino)?.subdirs {
            return Ok(n);
        }
        let n = if self.dir_tree {
            self.with_tree(ino, "", |t| Ok(t.header()?.subdirs))?
        } else {
            self.loaded_dir(ino, "")?
                .values()
                .filter(|(_, k)| *k == Kind::Dir)
                .count() as u64
        };
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.open_ino(ino)?.subdirs = Some(n);
        Ok(n)
    }
}
