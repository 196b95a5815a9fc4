//! Extended attributes: one hidden inode per file holds its set; `user.intact.scheme` is
//! virtual (docs/design.md, "FUSE").

#[allow(unused_imports)]
use super::*;

/// One inode's extended attributes, with running totals for the limits.
#[derive(Default)]
pub(super) struct XattrSet {
    pub(super) map: BTreeMap<String, Vec<u8>>,
    /// Sum of name and value lengths.
    pub(super) bytes: usize,
    /// Sum of name lengths plus one NUL each (what listxattr returns).
    pub(super) names: usize,
}

impl XattrSet {
    pub(super) fn new(map: BTreeMap<String, Vec<u8>>) -> XattrSet {
        let bytes = map.iter().map(|(k, v)| k.len() + v.len()).sum();
        let names = map.keys().map(|k| k.len() + 1).sum();
        XattrSet { map, bytes, names }
    }

    /// Sets `name`, refusing (ENOSPC) a set that would pass the limits.
    pub(super) fn set(&mut self, name: &str, value: &[u8], bytes_max: usize) -> Result<()> {
        let old = self.map.get(name).map(|v| v.len());
        let bytes = self.bytes - old.map_or(0, |l| name.len() + l) + name.len() + value.len();
        let names = self.names + if old.is_some() { 0 } else { name.len() + 1 };
        if bytes > bytes_max || names > XATTR_NAMES_MAX {
            return Err(Error::fs(name, FsErrorKind::NoSpace));
        }
        self.map.insert(name.to_string(), value.to_vec());
        self.bytes = bytes;
        self.names = names;
        Ok(())
    }

    pub(super) fn remove(&mut self, name: &str) -> bool {
        match self.map.remove(name) {
            Some(v) => {
                self.bytes -= name.len() + v.len();
                self.names -= name.len() + 1;
                true
            }
            None => false,
        }
    }
}

pub(super) fn encode_xattrs(map: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        8 + map
            .iter()
            .map(|(k, v)| 6 + k.len() + v.len())
            .sum::<usize>(),
    );
    out.extend_from_slice(b"IXAT");
    out.extend_from_slice(&(map.len() as u32).to_le_bytes());
    for (name, value) in map {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    out
}

pub(super) fn decode_xattrs(b: &[u8]) -> Option<BTreeMap<String, Vec<u8>>> {
    let mut m = BTreeMap::new();
    let mut r = crate::tx::Reader { b, pos: 0 };
    if r.take(4)? != b"IXAT" {
        return None;
    }
    let n = r.u32()?;
    for _ in 0..n {
        let nl = r.u16()? as usize;
        let name = std::str::from_utf8(r.take(nl)?).ok()?.to_string();
        let vl = r.u32()? as usize;
        if vl > XATTR_VALUE_MAX {
            return None;
        }
        m.insert(name, r.take(vl)?.to_vec());
    }
    (r.pos == b.len()).then_some(m)
}

/// Checks an extended-attribute name: only the `user.` namespace is stored.
pub(super) fn xattr_name(name: &str) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::fs(name, FsErrorKind::ValueTooLarge));
    }
    if name.len() <= 5 || name.contains('\0') {
        return Err(Error::fs(name, FsErrorKind::InvalidName));
    }
    if !name.starts_with("user.") {
        return Err(Error::fs(name, FsErrorKind::NotSupported));
    }
    Ok(())
}

impl Inner {
    /// The extended attributes of `ino`, decoded once and kept with the hidden attribute
    /// inode; `None` when it has none. With `create`, an empty set is made when there is
    /// none.
    pub(super) fn xattr_set(&mut self, ino: u64, create: bool) -> Result<Option<&mut XattrSet>> {
        let mut x = self.open_ino(ino)?.inode.xattr as u64;
        if x == 0 {
            if !create {
                return Ok(None);
            }
            let (uid, gid) = {
                let i = &self.open_ino(ino)?.inode;
                (i.uid, i.gid)
            };
            x = self.new_inode(Kind::Xattr, SchemeId::MtEintGcm, Some(0o600), uid, gid)?;
            match u32::try_from(x) {
                Ok(x32) => self.touch_record(ino)?.inode.xattr = x32,
                Err(_) => {
                    self.free_ino(x)?;
                    return Err(Error::fs("", FsErrorKind::NotSupported));
                }
            }
            let of = self.files.get_mut(&x).expect("created");
            of.xattrs = Some(XattrSet::default());
            of.xattrs_dirty = true;
        }
        self.ensure_open(x)?;
        let env = env!(self);
        let of = self.files.get_mut(&x).expect("opened");
        if of.inode.kind != Kind::Xattr {
            return Err(Error::tampered(
                Subject::Inode(ino),
                None,
                "extended attributes point to an inode of another kind",
            ));
        }
        if of.xattrs.is_none() {
            let mut buf = vec![0u8; of.inode.size as usize];
            file_read(&env, &mut self.tx, of, 0, &mut buf)?;
            let map = decode_xattrs(&buf).ok_or_else(|| {
                Error::tampered(Subject::Inode(ino), None, "malformed extended attributes")
            })?;
            of.xattrs = Some(XattrSet::new(map));
        }
        Ok(of.xattrs.as_mut())
    }
    /// The attribute set held by hidden attribute inode `x` (loaded on first use).
    pub(super) fn xattrs_of(&mut self, x: u64) -> Result<&mut XattrSet> {
        self.ensure_open(x)?;
        let env = env!(self);
        let of = self.files.get_mut(&x).expect("opened");
        if of.inode.kind != Kind::Xattr {
            return Err(Error::tampered(
                Subject::Inode(x),
                None,
                "extended attributes in an inode of another kind",
            ));
        }
        if of.xattrs.is_none() {
            let mut buf = vec![0u8; of.inode.size as usize];
            file_read(&env, &mut self.tx, of, 0, &mut buf)?;
            let map = decode_xattrs(&buf).ok_or_else(|| {
                Error::tampered(Subject::Inode(x), None, "malformed extended attributes")
            })?;
            of.xattrs = Some(XattrSet::new(map));
        }
        Ok(of.xattrs.as_mut().expect("loaded"))
    }

    /// After a change to `ino`'s attribute set: the set is written at the seal, an empty
    /// one frees its hidden inode, and `ino`'s ctime changes.
    pub(super) fn touch_xattrs(&mut self, ino: u64) -> Result<()> {
        let x = self.open_ino(ino)?.inode.xattr as u64;
        let empty = {
            let of = self.files.get_mut(&x).expect("loaded by xattr_set");
            of.xattrs_dirty = true;
            of.xattrs.as_ref().is_some_and(|s| s.map.is_empty())
        };
        if empty {
            self.free_ino(x)?;
            self.touch_record(ino)?.inode.xattr = 0;
        } else {
            self.touch_record(ino)?;
        }
        Ok(())
    }
}

impl Volume {
    /// The value of extended attribute `name` of `ino`. `user.intact.scheme` names the
    /// file's scheme (whether or not it was set on the file).
    pub fn getxattr(&self, ino: u64, name: &str) -> Result<Vec<u8>> {
        self.with_ino(ino, |g| {
            if name == SCHEME_XATTR && g.open_ino(ino)?.inode.kind == Kind::File {
                let i = &g.open_ino(ino)?.inode;
                let s = i.scheme.name();
                return Ok(if i.auto {
                    format!("{AUTO}:{s}")
                } else {
                    s.to_string()
                }
                .into_bytes());
            }
            xattr_name(name)?;
            g.xattr_set(ino, false)?
                .and_then(|x| x.map.get(name).cloned())
                .ok_or_else(|| Error::fs(name, FsErrorKind::NoAttribute))
        })
    }
    /// Names of the extended attributes of `ino`; `user.intact.scheme` only when it was
    /// set on this file (so copies off the volume carry no attribute the user never set).
    pub fn listxattr(&self, ino: u64) -> Result<Vec<String>> {
        self.with_ino(ino, |g| {
            let mut names: Vec<String> = g
                .xattr_set(ino, false)?
                .map(|x| x.map.keys().cloned().collect())
                .unwrap_or_default();
            let i = &g.open_ino(ino)?.inode;
            if i.kind == Kind::File && i.scheme_set {
                names.push(SCHEME_XATTR.to_string());
            }
            Ok(names)
        })
    }
    /// Sets extended attribute `name` of `ino`. Setting `user.intact.scheme` on a file
    /// chooses its scheme (an empty file switches at once; a file with content is
    /// re-encrypted under the new scheme). Names are at most 255 bytes, values at most
    /// 64 KiB, and an inode's names and values at most [`Options::xattr_bytes_max`] in all
    /// (ENOSPC past it, as ext4 does when an inode's attribute space is full).
    pub fn setxattr(&self, ino: u64, name: &str, value: &[u8], mode: XattrMode) -> Result<()> {
        self.with_ino(ino, |g| {
            g.check_writable()?;
            if name == SCHEME_XATTR && g.open_ino(ino)?.inode.kind == Kind::File {
                let v = std::str::from_utf8(value)
                    .map_err(|_| Error::Invalid("scheme name is not UTF-8".into()))?
                    .trim_end_matches(['\n', '\0']);
                if v == AUTO || v.starts_with("auto:") {
                    let of = g.touch_record(ino)?;
                    of.inode.auto = true;
                    of.inode.scheme_set = true;
                    return Ok(());
                }
                let s = SchemeId::parse(v)?;
                g.set_scheme(ino, s)?;
                let of = g.touch_record(ino)?;
                of.inode.auto = false;
                of.inode.scheme_set = true;
                return Ok(());
            }
            xattr_name(name)?;
            if value.len() > XATTR_VALUE_MAX {
                return Err(Error::fs(name, FsErrorKind::ValueTooLarge));
            }
            let exists = g
                .xattr_set(ino, false)?
                .is_some_and(|x| x.map.contains_key(name));
            match (mode, exists) {
                (XattrMode::Create, true) => return Err(Error::fs(name, FsErrorKind::Exists)),
                (XattrMode::Replace, false) => {
                    return Err(Error::fs(name, FsErrorKind::NoAttribute))
                }
                _ => {}
            }
            let max = g.xattr_bytes_max;
            let set = g.xattr_set(ino, true)?.expect("created");
            if let Err(e) = set.set(name, value, max) {
                if set.map.is_empty() {
                    // Made for this call: free it again.
                    g.touch_xattrs(ino)?;
                }
                return Err(e);
            }
            let x = g.open_ino(ino)?.inode.xattr as u64;
            g.note_item(Item::Xattr {
                x,
                name: name.to_string(),
                value: Some(value.to_vec()),
            });
            g.touch_xattrs(ino)
        })
    }
    /// Removes extended attribute `name` of `ino`. Removing `user.intact.scheme` returns the
    /// file to the volume's default scheme (re-encrypting it if that differs).
    pub fn removexattr(&self, ino: u64, name: &str) -> Result<()> {
        self.with_ino(ino, |g| {
            g.check_writable()?;
            if name == SCHEME_XATTR && g.open_ino(ino)?.inode.kind == Kind::File {
                if !g.open_ino(ino)?.inode.scheme_set {
                    return Err(Error::fs(name, FsErrorKind::NoAttribute));
                }
                let (s, auto) = (g.default_scheme, g.default_auto);
                g.set_scheme(ino, s)?;
                let of = g.touch_record(ino)?;
                of.inode.auto = auto;
                of.inode.scheme_set = false;
                return Ok(());
            }
            xattr_name(name)?;
            let removed = g.xattr_set(ino, false)?.is_some_and(|x| x.remove(name));
            if !removed {
                return Err(Error::fs(name, FsErrorKind::NoAttribute));
            }
            let x = g.open_ino(ino)?.inode.xattr as u64;
            g.note_item(Item::Xattr {
                x,
                name: name.to_string(),
                value: None,
            });
            g.touch_xattrs(ino)
        })
    }
}
