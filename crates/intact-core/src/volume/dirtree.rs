//! Directories that scale (issue 18; docs/file-format.md §5.2): a directory's entries in a
//! B+-tree ordered by a keyed hash of their names, its nodes in fixed-size *units* of the
//! directory's own file (so every unit is encrypted and authenticated by the directory's
//! scheme like any file block).
//!
//! A lookup reads the units on one root-to-leaf path; a create, unlink or rename writes the
//! leaf it changes and unit 0 (the root, which carries the counts), and a split one or two
//! more: O(log n) units of a directory of n entries, where the whole-directory encoding of
//! volumes without the `dir-tree` feature rewrote all of it. Leaves are never merged; a
//! directory that becomes empty shrinks back to nothing.
//!
//! The order is the *cookie* `((key << 2) | i) + 3`, where `key` is the top 60 bits of
//! keyed BLAKE3 of the name (label [`crate::crypto::label::DIR_NAME`]) and `i` the entry's
//! rank among the names of its leaf that share the key (at most [`GROUP_MAX`]). readdir
//! resumes after a cookie, so a listing stays valid while the directory changes: no
//! entry present for the whole listing is skipped or repeated, and no name comes back
//! carrying another file. Names stay hidden: the key is keyed, and it is stored only
//! inside the encrypted units.

use super::*;

/// A directory in the tree format starts with these bytes (unit 0).
pub(super) const DIR_MAGIC: &[u8; 4] = b"IDT1";
/// Unit 0's header: magic, depth (u8), 3 zero bytes, entries (u64), subdirectories
/// (u64), units (u32), 4 zero bytes.
pub(super) const HEADER_LEN: usize = 32;
/// Names of one leaf that may share a 60-bit key (more is refused with ENOSPC: about
/// 2^-60 a pair of names, never seen in practice).
pub(super) const GROUP_MAX: usize = 4;
/// The smallest unit: a leaf holds at least 14 entries of the longest names.
pub(super) const MIN_UNIT: usize = 4096;
/// Cookies below this are the listing's start, `.` and `..`.
pub(super) const FIRST_COOKIE: u64 = 3;

const TAG_LEAF: u8 = b'L';
const TAG_INNER: u8 = b'I';

/// The unit size of a volume whose block size is `bs`: a whole number of blocks.
pub(super) fn unit_size(bs: usize) -> usize {
    bs.max(MIN_UNIT)
}

/// The 60-bit order key of `name`.
pub(super) fn name_key(k: &SubKey, name: &str) -> u64 {
    let h = k.mac(&[name.as_bytes()]);
    u64::from_le_bytes(h[..8].try_into().expect("8")) >> 4
}

fn cookie(key: u64, rank: usize) -> u64 {
    ((key << 2) | rank as u64) + FIRST_COOKIE
}

/// Where a directory's units live: the directory's file, read and written through its
/// scheme (an in-memory vector in the unit tests).
pub(super) trait Units {
    /// The stored bytes of unit `k` (shorter than a unit, or empty, at the file's end),
    /// shared with the metadata cache that may keep them.
    fn read(&mut self, k: u32) -> Result<Arc<[u8]>>;
    /// Writes `b` at unit `k`'s offset.
    fn write(&mut self, k: u32, b: &[u8]) -> Result<()>;
    /// Sets the file's length.
    fn set_len(&mut self, len: u64) -> Result<()>;
    /// What an error names.
    fn malformed(&self, what: &str) -> Error;
    /// Unit `k`'s checked node, if one was kept with the bytes [`Units::read`] returns now.
    fn kept(&mut self, _k: u32) -> Option<Arc<Unit>> {
        None
    }
    /// Keeps `u`, decoded and checked from `b` (unit `k`'s bytes as read), beside them.
    fn keep(&mut self, _k: u32, _b: &Arc<[u8]>, _u: &Arc<Unit>) {}
}

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ent {
    pub(super) key: u64,
    pub(super) name: String,
    pub(super) ino: u64,
    pub(super) kind: Kind,
}

impl Ent {
    fn len(&self) -> usize {
        18 + self.name.len()
    }
}

/// Appends an entry's bytes (file-format.md §5.2).
fn encode_entry(key: u64, kind: Kind, ino: u64, name: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&key.to_le_bytes());
    out.push(kind as u8);
    out.extend_from_slice(&ino.to_le_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Leaf(Vec<Ent>),
    /// A leaf already encoded (its tag, count and entries): a create, unlink or rename
    /// that needs no split edits the unit's bytes and never takes its entries out one by
    /// one (a `String` each).
    RawLeaf(Vec<u8>),
    /// `kids[i]` holds the keys in `[keys[i-1], keys[i])`.
    Inner {
        keys: Vec<u64>,
        kids: Vec<u32>,
    },
}

impl Node {
    fn len(&self) -> usize {
        match self {
            Node::Leaf(es) => 3 + es.iter().map(Ent::len).sum::<usize>(),
            Node::RawLeaf(b) => b.len(),
            Node::Inner { keys, kids } => 3 + 8 * keys.len() + 4 * kids.len(),
        }
    }
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Node::Leaf(es) => {
                out.push(TAG_LEAF);
                out.extend_from_slice(&(es.len() as u16).to_le_bytes());
                for e in es {
                    encode_entry(e.key, e.kind, e.ino, &e.name, out);
                }
            }
            Node::RawLeaf(b) => out.extend_from_slice(b),
            Node::Inner { keys, kids } => {
                out.push(TAG_INNER);
                out.extend_from_slice(&(keys.len() as u16).to_le_bytes());
                for c in kids {
                    out.extend_from_slice(&c.to_le_bytes());
                }
                for k in keys {
                    out.extend_from_slice(&k.to_le_bytes());
                }
            }
        }
    }
}

/// A node as read from its unit and checked whole, once: its layout, the strict order of
/// its keys (a leaf's entries by key, then name), the zero padding after it. A lookup then
/// binary-searches it. The metadata cache keeps it beside the unit's bytes
/// ([`Units::keep`]), so a unit that many paths cross is parsed and checked when it is
/// read, not at every visit (issue 18: a lookup among 10^6 names crosses three units);
/// what each visit still checks is that its keys lie within the bounds its parent gives
/// it, which, the keys being in order, its first and last key tell.
pub(super) enum Read {
    Leaf(RawLeaf),
    Inner { keys: Vec<u64>, kids: Vec<u32> },
}

impl Read {
    /// The first and last key (`None`: an empty leaf).
    fn key_span(&self) -> Option<(u64, u64)> {
        let keys = match self {
            Read::Leaf(l) => &l.keys,
            Read::Inner { keys, .. } => keys,
        };
        Some((*keys.first()?, *keys.last()?))
    }

    /// What keeping it costs beside the unit's bytes.
    pub(super) fn cost(&self) -> usize {
        match self {
            Read::Leaf(l) => 12 * l.keys.len(),
            Read::Inner { keys, kids } => 8 * keys.len() + 4 * kids.len(),
        }
    }
}

/// A unit's checked node and, for unit 0, the header before it.
pub(super) struct Unit {
    header: Header,
    node: Read,
}

impl Unit {
    /// What keeping it costs beside the unit's bytes.
    pub(super) fn cost(&self) -> usize {
        self.node.cost()
    }

    /// An inner node of `n` keys (for the cache's tests).
    #[cfg(test)]
    pub(super) fn inner_for_test(n: usize) -> Arc<Unit> {
        Arc::new(Unit {
            header: Header::default(),
            node: Read::Inner {
                keys: (0..n as u64).collect(),
                kids: (0..=n as u32).collect(),
            },
        })
    }
}

/// A leaf's entries in its unit's bytes, checked to parse (kinds, lengths; a name's UTF-8
/// is checked when it is taken out, [`RawLeaf::owned`]), with each entry's key and offset.
pub(super) struct RawLeaf {
    b: Arc<[u8]>,
    start: usize,
    /// Where the entries end (the padding begins).
    end: usize,
    /// Each entry's key, in order (their count is the leaf's).
    keys: Vec<u64>,
    offs: Vec<u32>,
}

/// One entry of a [`RawLeaf`].
struct RawEnt<'a> {
    key: u64,
    kind: Kind,
    ino: u64,
    name: &'a [u8],
}

impl RawLeaf {
    fn entry(&self, i: usize) -> RawEnt<'_> {
        let b = &self.b;
        let at = self.offs[i] as usize;
        let nl = b[at + 17] as usize;
        RawEnt {
            key: self.keys[i],
            kind: Kind::of_entry(b[at + 8]).expect("checked"),
            ino: u64::from_le_bytes(b[at + 9..at + 17].try_into().expect("checked")),
            name: &b[at + 18..at + 18 + nl],
        }
    }

    fn entries(&self) -> impl Iterator<Item = RawEnt<'_>> {
        (0..self.keys.len()).map(|i| self.entry(i))
    }

    /// The entry `name` of key `key`: a binary search for the key, then the few names
    /// that share it.
    fn find(&self, key: u64, name: &[u8]) -> Option<RawEnt<'_>> {
        let first = self.keys.partition_point(|&k| k < key);
        (first..self.keys.len())
            .take_while(|&i| self.keys[i] == key)
            .map(|i| self.entry(i))
            .find(|e| e.name == name)
    }

    /// The entries, owned (`None`: a name is not UTF-8).
    fn owned(&self) -> Option<Vec<Ent>> {
        self.entries().map(|e| e.owned()).collect()
    }
}

impl RawEnt<'_> {
    fn owned(&self) -> Option<Ent> {
        Some(Ent {
            key: self.key,
            name: std::str::from_utf8(self.name).ok()?.to_string(),
            ino: self.ino,
            kind: self.kind,
        })
    }
}

/// Decodes and checks the node at `at` of unit bytes `b`, which must end in zero bytes
/// ([`Read`]).
fn decode_node(b: Arc<[u8]>, at: usize) -> Option<Read> {
    let mut r = crate::tx::Reader { b: &b, pos: at };
    let tag = r.take(1)?[0];
    let n = r.u16()? as usize;
    match tag {
        TAG_LEAF => {
            let start = r.pos;
            let mut keys = Vec::with_capacity(n);
            let mut offs = Vec::with_capacity(n);
            let mut prev: Option<(u64, &[u8])> = None;
            for _ in 0..n {
                offs.push(u32::try_from(r.pos).ok()?);
                let key = r.u64()?;
                Kind::of_entry(r.take(1)?[0])?;
                r.u64()?;
                let nl = r.take(1)?[0] as usize;
                let name = r.take(nl)?;
                if prev.is_some_and(|p| p >= (key, name)) {
                    return None;
                }
                prev = Some((key, name));
                keys.push(key);
            }
            padding_ok(&b[r.pos..]).then_some(())?;
            let end = r.pos;
            Some(Read::Leaf(RawLeaf {
                b,
                start,
                end,
                keys,
                offs,
            }))
        }
        TAG_INNER if n >= 1 => {
            let mut kids = Vec::with_capacity(n + 1);
            for _ in 0..=n {
                kids.push(r.u32()?);
            }
            let mut keys = Vec::with_capacity(n);
            for _ in 0..n {
                keys.push(r.u64()?);
            }
            keys.is_sorted_by(|a, b| a < b).then_some(())?;
            padding_ok(&b[r.pos..]).then_some(())?;
            Some(Read::Inner { keys, kids })
        }
        _ => None,
    }
}

/// Unit 0's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Header {
    /// Levels of inner nodes above the leaves (0: the root is the only leaf).
    pub(super) depth: u8,
    pub(super) entries: u64,
    pub(super) subdirs: u64,
    /// Units in use (0 for an empty directory).
    pub(super) units: u32,
}

/// A directory's tree over its units.
pub(super) struct DirTree<'a, U: Units> {
    pub(super) units: &'a mut U,
    pub(super) key: &'a SubKey,
    /// The unit size ([`unit_size`]).
    pub(super) unit: usize,
}

/// What a descent found: the path's inner nodes (unit, node, child taken), the leaf, and
/// the smallest key past it (`None`: the last leaf).
struct Path {
    inner: Vec<(u32, Arc<Unit>, usize)>,
    leaf_unit: u32,
    leaf: Arc<Unit>,
    upper: Option<u64>,
}

impl Path {
    fn leaf(&self) -> &RawLeaf {
        match &self.leaf.node {
            Read::Leaf(l) => l,
            Read::Inner { .. } => unreachable!("a descent ends at a leaf"),
        }
    }
}

impl<U: Units> DirTree<'_, U> {
    fn cap(&self, unit: u32) -> usize {
        if unit == 0 {
            self.unit - HEADER_LEN
        } else {
            self.unit
        }
    }

    /// Unit 0: the header and the root (an empty directory: no units, an empty leaf).
    fn root(&mut self) -> Result<Arc<Unit>> {
        if let Some(u) = self.units.kept(0) {
            return Ok(u);
        }
        let b = self.units.read(0)?;
        if b.is_empty() {
            let empty = RawLeaf {
                b,
                start: 0,
                end: 0,
                keys: Vec::new(),
                offs: Vec::new(),
            };
            return Ok(Arc::new(Unit {
                header: Header::default(),
                node: Read::Leaf(empty),
            }));
        }
        let bad = || self.units.malformed("malformed directory header");
        let mut r = crate::tx::Reader { b: &b, pos: 0 };
        if r.take(4) != Some(DIR_MAGIC.as_slice()) {
            return Err(bad());
        }
        let fixed = (|| {
            let depth = r.take(1)?[0];
            (r.take(3)? == [0u8; 3]).then_some(())?;
            let entries = r.u64()?;
            let subdirs = r.u64()?;
            let units = r.u32()?;
            (r.take(4)? == [0u8; 4]).then_some(())?;
            Some(Header {
                depth,
                entries,
                subdirs,
                units,
            })
        })();
        let h = fixed.ok_or_else(bad)?;
        let node = decode_node(Arc::clone(&b), HEADER_LEN).ok_or_else(bad)?;
        if h.units == 0 || subdirs_over(&h) {
            return Err(bad());
        }
        if (h.depth == 0) != matches!(node, Read::Leaf(_)) {
            return Err(bad());
        }
        let u = Arc::new(Unit { header: h, node });
        self.units.keep(0, &b, &u);
        Ok(u)
    }

    fn node(&mut self, h: &Header, k: u32) -> Result<Arc<Unit>> {
        if k == 0 || k >= h.units {
            return Err(self
                .units
                .malformed(&format!("directory node names unit {k} of {}", h.units)));
        }
        if let Some(u) = self.units.kept(k) {
            return Ok(u);
        }
        let b = self.units.read(k)?;
        let node = decode_node(Arc::clone(&b), 0).ok_or_else(|| {
            self.units
                .malformed(&format!("malformed directory unit {k}"))
        })?;
        let u = Arc::new(Unit {
            header: Header::default(),
            node,
        });
        self.units.keep(k, &b, &u);
        Ok(u)
    }

    fn put(&mut self, h: &Header, k: u32, node: &Node) -> Result<()> {
        let mut b = Vec::with_capacity(self.unit);
        if k == 0 {
            b.extend_from_slice(DIR_MAGIC);
            b.push(h.depth);
            b.extend_from_slice(&[0; 3]);
            b.extend_from_slice(&h.entries.to_le_bytes());
            b.extend_from_slice(&h.subdirs.to_le_bytes());
            b.extend_from_slice(&h.units.to_le_bytes());
            b.extend_from_slice(&[0; 4]);
        }
        node.encode(&mut b);
        debug_assert!(b.len() <= self.unit);
        if h.units == 1 {
            // A directory of one unit keeps its exact length (a small directory stays
            // within a block, in its record under `inline-leaf`).
            self.units.write(0, &b)?;
            return self.units.set_len(b.len() as u64);
        }
        b.resize(self.unit, 0);
        self.units.write(k, &b)
    }

    /// Descends to the leaf that holds `key`, checking each node against the bounds its
    /// parent gives it.
    fn descend(&mut self, h: &Header, root: Arc<Unit>, key: u64) -> Result<Path> {
        let mut inner = Vec::new();
        let (mut lo, mut hi) = (0u64, None::<u64>);
        let mut unit = 0u32;
        let mut node = root;
        for level in 0..=h.depth {
            let in_bounds = node
                .node
                .key_span()
                .is_none_or(|(a, z)| a >= lo && hi.is_none_or(|h| z < h));
            match &node.node {
                Read::Inner { keys, kids } if level < h.depth => {
                    if !in_bounds {
                        return Err(self.units.malformed("directory keys out of order"));
                    }
                    let i = keys.partition_point(|&k| k <= key);
                    if i > 0 {
                        lo = keys[i - 1];
                    }
                    if i < keys.len() {
                        hi = Some(keys[i]);
                    }
                    let next = kids[i];
                    inner.push((unit, Arc::clone(&node), i));
                    node = self.node(h, next)?;
                    unit = next;
                }
                Read::Leaf(_) if level == h.depth => {
                    if !in_bounds {
                        return Err(self
                            .units
                            .malformed(&format!("directory unit {unit} out of order")));
                    }
                    return Ok(Path {
                        inner,
                        leaf_unit: unit,
                        leaf: node,
                        upper: hi,
                    });
                }
                _ => {
                    return Err(self
                        .units
                        .malformed(&format!("directory unit {unit} at the wrong level")))
                }
            }
        }
        unreachable!("the loop returns at the leaf level")
    }

    fn not_utf8(&self, unit: u32) -> Error {
        self.units
            .malformed(&format!("a name in directory unit {unit} is not UTF-8"))
    }

    /// The counts of unit 0.
    pub(super) fn header(&mut self) -> Result<Header> {
        Ok(self.root()?.header)
    }

    /// The entry `name`.
    pub(super) fn get(&mut self, name: &str) -> Result<Option<(u64, Kind)>> {
        let root = self.root()?;
        let key = name_key(self.key, name);
        let p = self.descend(&root.header, Arc::clone(&root), key)?;
        let found = p.leaf().find(key, name.as_bytes()).map(|e| (e.ino, e.kind));
        Ok(found)
    }

    /// Sets (`Some`) or removes (`None`) the entry `name`; returns whether it was there.
    /// The leaf is edited in its unit's bytes ([`Node::RawLeaf`]); its entries are taken
    /// out only if it must split.
    pub(super) fn set(&mut self, name: &str, target: Option<(u64, Kind)>) -> Result<bool> {
        let root = self.root()?;
        let mut h = root.header;
        let key = name_key(self.key, name);
        let p = self.descend(&h, root, key)?;
        let leaf = p.leaf();
        // The entry's place in the sorted leaf (by key, then name): the offset of the first
        // entry not below it, and the entry there if it is this name.
        let (mut at, mut same) = (leaf.start, None);
        let mut group = 0;
        for e in leaf.entries() {
            group += usize::from(e.key == key);
            match (e.key, e.name).cmp(&(key, name.as_bytes())) {
                std::cmp::Ordering::Less => at += 18 + e.name.len(),
                std::cmp::Ordering::Equal => same = Some((e.kind, 18 + e.name.len())),
                std::cmp::Ordering::Greater => {}
            }
        }
        let dir = |k: Kind| u64::from(k == Kind::Dir);
        let was = same.is_some();
        let miscounted = || {
            self.units
                .malformed("directory counts disagree with its entries")
        };
        let (n, removed, added) = match (same, target) {
            (None, None) => return Ok(false),
            (Some((kind, len)), None) => {
                h.entries = h.entries.checked_sub(1).ok_or_else(miscounted)?;
                h.subdirs = h.subdirs.checked_sub(dir(kind)).ok_or_else(miscounted)?;
                if h.entries == 0 {
                    // Empty again: no units at all.
                    self.units.set_len(0)?;
                    return Ok(true);
                }
                (leaf.keys.len() - 1, len, None)
            }
            (Some((kind, len)), Some((ino, new))) => {
                h.subdirs = (h.subdirs + dir(new))
                    .checked_sub(dir(kind))
                    .ok_or_else(miscounted)?;
                (leaf.keys.len(), len, Some((ino, new)))
            }
            (None, Some((ino, kind))) => {
                if group >= GROUP_MAX {
                    return Err(Error::fs(name, FsErrorKind::NoSpace));
                }
                h.entries += 1;
                h.subdirs += dir(kind);
                if h.units == 0 {
                    h.units = 1;
                }
                (leaf.keys.len() + 1, 0, Some((ino, kind)))
            }
        };
        let n = u16::try_from(n).map_err(|_| self.units.malformed("directory leaf too full"))?;
        let mut b = Vec::with_capacity(leaf.end - leaf.start + 3 + 18 + name.len());
        b.push(TAG_LEAF);
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&leaf.b[leaf.start..at]);
        if let Some((ino, kind)) = added {
            encode_entry(key, kind, ino, name, &mut b);
        }
        b.extend_from_slice(&leaf.b[at + removed..leaf.end]);
        let path = p
            .inner
            .into_iter()
            .map(|(unit, n, i)| match &n.node {
                Read::Inner { keys, kids } => (
                    unit,
                    Node::Inner {
                        keys: keys.clone(),
                        kids: kids.clone(),
                    },
                    i,
                ),
                Read::Leaf(_) => unreachable!("the path holds inner nodes"),
            })
            .collect();
        self.store(h, path, p.leaf_unit, Node::RawLeaf(b))?;
        Ok(was)
    }

    /// Writes the changed leaf, splitting up the path while a node overflows.
    fn store(
        &mut self,
        mut h: Header,
        mut path: Vec<(u32, Node, usize)>,
        leaf_unit: u32,
        leaf: Node,
    ) -> Result<()> {
        let mut unit = leaf_unit;
        let mut node = leaf;
        loop {
            if node.len() <= self.cap(unit) {
                if unit != 0 {
                    self.put(&h, unit, &node)?;
                    // Unit 0 carries the counts: rewritten with its root unchanged.
                    let root = match path.into_iter().next() {
                        Some((_, n, _)) => n,
                        None => unreachable!("a unit past 0 has a parent"),
                    };
                    return self.put(&h, 0, &root);
                }
                return self.put(&h, 0, &node);
            }
            let whole = match node {
                // Read back as a unit is (its count and entries parsed by `decode_node`),
                // then taken apart: about once a hundred changes.
                Node::RawLeaf(b) => match decode_node(b.into(), 0) {
                    Some(Read::Leaf(raw)) => {
                        Node::Leaf(raw.owned().ok_or_else(|| self.not_utf8(unit))?)
                    }
                    _ => unreachable!("set encodes a leaf"),
                },
                other => other,
            };
            let (left, sep, right) = self.split(whole)?;
            if unit == 0 {
                // The root splits: both halves move to new units, the root points at them.
                let (a, b) = (h.units, h.units + 1);
                h.units += 2;
                h.depth = h
                    .depth
                    .checked_add(1)
                    .ok_or_else(|| self.units.malformed("directory too deep"))?;
                self.put(&h, a, &left)?;
                self.put(&h, b, &right)?;
                let root = Node::Inner {
                    keys: vec![sep],
                    kids: vec![a, b],
                };
                return self.put(&h, 0, &root);
            }
            let b = h.units;
            h.units += 1;
            self.put(&h, unit, &left)?;
            self.put(&h, b, &right)?;
            let (punit, parent, i) = path.pop().expect("a unit past 0 has a parent");
            let Node::Inner { mut keys, mut kids } = parent else {
                unreachable!("the path holds inner nodes")
            };
            keys.insert(i, sep);
            kids.insert(i + 1, b);
            unit = punit;
            node = Node::Inner { keys, kids };
        }
    }

    /// Splits an overflowing node near the middle of its bytes; a leaf splits between
    /// two keys (names sharing a key stay in one leaf).
    fn split(&self, node: Node) -> Result<(Node, u64, Node)> {
        match node {
            Node::Leaf(mut es) => {
                let total: usize = es.iter().map(Ent::len).sum();
                let mut acc = 0;
                let mut mid = 0;
                while mid < es.len() && acc + es[mid].len() <= total / 2 {
                    acc += es[mid].len();
                    mid += 1;
                }
                let boundary = |m: usize| m > 0 && m < es.len() && es[m - 1].key != es[m].key;
                let m = (0..es.len())
                    .flat_map(|d| [mid.checked_sub(d), mid.checked_add(d)])
                    .flatten()
                    .find(|&m| boundary(m))
                    .ok_or_else(|| Error::fs(&es[0].name, FsErrorKind::NoSpace))?;
                let right = es.split_off(m);
                let sep = right[0].key;
                Ok((Node::Leaf(es), sep, Node::Leaf(right)))
            }
            Node::RawLeaf(_) => unreachable!("a raw leaf is taken apart before it splits"),
            Node::Inner { mut keys, mut kids } => {
                let m = keys.len() / 2;
                let rkeys = keys.split_off(m + 1);
                let sep = keys.pop().expect("m < len");
                let rkids = kids.split_off(m + 1);
                Ok((
                    Node::Inner { keys, kids },
                    sep,
                    Node::Inner {
                        keys: rkeys,
                        kids: rkids,
                    },
                ))
            }
        }
    }

    /// Up to `max` entries whose cookies follow `after` (0: from the start), in cookie
    /// order, each with its cookie. Fewer than `max` (possibly none): the end.
    pub(super) fn page(&mut self, after: u64, max: usize) -> Result<Vec<(u64, Ent)>> {
        let root = self.root()?;
        let h = root.header;
        let mut out = Vec::new();
        let mut key = after.saturating_sub(FIRST_COOKIE) >> 2;
        loop {
            // Unit 0 is read once a page; each next leaf descends from its copy.
            let p = self.descend(&h, Arc::clone(&root), key)?;
            let cookies = cookies(p.leaf().entries().map(|e| e.key));
            for (c, e) in cookies.zip(p.leaf().entries()) {
                if c > after {
                    let e = e.owned().ok_or_else(|| self.not_utf8(p.leaf_unit))?;
                    out.push((c, e));
                    if out.len() == max {
                        return Ok(out);
                    }
                }
            }
            match p.upper {
                Some(u) => key = u,
                None => return Ok(out),
            }
        }
    }
}

/// A leaf's entries with their cookies.
pub(super) fn ranked(es: Vec<Ent>) -> impl Iterator<Item = (u64, Ent)> {
    let keys: Vec<u64> = es.iter().map(|e| e.key).collect();
    cookies(keys.into_iter()).zip(es)
}

/// The cookies of a leaf's keys, in order: each key with its rank among equal ones.
fn cookies(keys: impl Iterator<Item = u64>) -> impl Iterator<Item = u64> {
    let (mut prev, mut rank) = (None, 0);
    keys.map(move |k| {
        rank = if prev == Some(k) { rank + 1 } else { 0 };
        prev = Some(k);
        cookie(k, rank.min(GROUP_MAX - 1))
    })
}

/// Whether `rest` is all zero bytes. The OR of every byte is a loop the compiler vectorizes,
/// where `all` stops at the first non-zero byte and is checked a byte at a time: every
/// descent checks the padding of each unit on its path, up to a unit's length.
fn padding_ok(rest: &[u8]) -> bool {
    rest.iter().fold(0u8, |acc, &b| acc | b) == 0
}

fn subdirs_over(h: &Header) -> bool {
    h.subdirs > h.entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Units in memory: the file's bytes, and the checked nodes kept as the metadata
    /// cache keeps them (`kept`: `None` keeps none).
    struct Mem {
        bytes: Vec<u8>,
        unit: usize,
        writes: usize,
        reads: usize,
        kept: Option<std::collections::HashMap<u32, Arc<Unit>>>,
    }

    impl Units for Mem {
        fn read(&mut self, k: u32) -> Result<Arc<[u8]>> {
            self.reads += 1;
            let s = (k as usize * self.unit).min(self.bytes.len());
            let e = (s + self.unit).min(self.bytes.len());
            Ok(self.bytes[s..e].into())
        }
        fn kept(&mut self, k: u32) -> Option<Arc<Unit>> {
            self.kept.as_ref()?.get(&k).cloned()
        }
        fn keep(&mut self, k: u32, _b: &Arc<[u8]>, u: &Arc<Unit>) {
            if let Some(m) = self.kept.as_mut() {
                m.insert(k, Arc::clone(u));
            }
        }
        fn write(&mut self, k: u32, b: &[u8]) -> Result<()> {
            if let Some(m) = self.kept.as_mut() {
                m.clear();
            }
            let s = k as usize * self.unit;
            if self.bytes.len() < s + b.len() {
                self.bytes.resize(s + b.len(), 0);
            }
            self.bytes[s..s + b.len()].copy_from_slice(b);
            self.writes += 1;
            Ok(())
        }
        fn set_len(&mut self, len: u64) -> Result<()> {
            if let Some(m) = self.kept.as_mut() {
                m.clear();
            }
            self.bytes.resize(len as usize, 0);
            Ok(())
        }
        fn malformed(&self, what: &str) -> Error {
            Error::tampered(Subject::Inode(7), None, what)
        }
    }

    fn key() -> SubKey {
        MasterKey::from_bytes([7; 32]).derive(label::DIR_NAME, &[])
    }

    fn mem() -> Mem {
        Mem {
            bytes: Vec::new(),
            unit: MIN_UNIT,
            writes: 0,
            reads: 0,
            kept: None,
        }
    }

    fn all(m: &mut Mem, k: &SubKey, step: usize) -> Vec<(u64, Ent)> {
        let mut t = DirTree {
            units: m,
            key: k,
            unit: MIN_UNIT,
        };
        let mut out: Vec<(u64, Ent)> = Vec::new();
        loop {
            let after = out.last().map_or(0, |(c, _)| *c);
            let page = t.page(after, step).unwrap();
            let n = page.len();
            out.extend(page);
            if n < step {
                return out;
            }
        }
    }

    #[test]
    fn small_directory_is_one_short_unit_and_empty_is_nothing() {
        let k = key();
        let mut m = mem();
        let mut t = DirTree {
            units: &mut m,
            key: &k,
            unit: MIN_UNIT,
        };
        assert!(!t.set("a", Some((5, Kind::File))).unwrap());
        assert!(!t.set("d", Some((6, Kind::Dir))).unwrap());
        let h = t.header().unwrap();
        assert_eq!((h.depth, h.entries, h.subdirs, h.units), (0, 2, 1, 1));
        assert_eq!(t.get("a").unwrap(), Some((5, Kind::File)));
        assert_eq!(t.get("b").unwrap(), None);
        // 32 header + 3 leaf + 2 entries of 19 bytes.
        assert_eq!(m.bytes.len(), HEADER_LEN + 3 + 2 * 19);
        let mut t = DirTree {
            units: &mut m,
            key: &k,
            unit: MIN_UNIT,
        };
        assert!(t.set("a", None).unwrap());
        assert!(!t.set("a", None).unwrap());
        assert!(t.set("d", None).unwrap());
        assert!(m.bytes.is_empty());
    }

    /// Frozen vector (docs/file-format.md §5.2): the order key of "a" under the master key
    /// of 32 bytes 0x07, and a directory of one entry composed field by field.
    #[test]
    fn format_vector_of_a_one_entry_directory() {
        let k = key();
        let ka = name_key(&k, "a");
        assert_eq!(ka, FROZEN_KEY_A, "{ka:#x}");
        // By its definition: keyed BLAKE3, the first 8 bytes little-endian, shifted by 4.
        let h = blake3::keyed_hash(k.expose_secret(), b"a");
        assert_eq!(
            u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap()) >> 4,
            ka
        );
        let mut m = mem();
        DirTree {
            units: &mut m,
            key: &k,
            unit: MIN_UNIT,
        }
        .set("a", Some((5, Kind::File)))
        .unwrap();
        let mut want = Vec::new();
        want.extend_from_slice(b"IDT1"); // magic
        want.push(0); // depth: the root is a leaf
        want.extend_from_slice(&[0; 3]);
        want.extend_from_slice(&1u64.to_le_bytes()); // entries
        want.extend_from_slice(&0u64.to_le_bytes()); // subdirectories
        want.extend_from_slice(&1u32.to_le_bytes()); // units
        want.extend_from_slice(&[0; 4]);
        want.push(b'L'); // leaf
        want.extend_from_slice(&1u16.to_le_bytes()); // one entry
        want.extend_from_slice(&FROZEN_KEY_A.to_le_bytes());
        want.push(Kind::File as u8);
        want.extend_from_slice(&5u64.to_le_bytes()); // inode
        want.push(1); // name length
        want.push(b'a');
        assert_eq!(m.bytes, want);
        // As printed in docs/file-format.md §5.2.
        let doc = "49445431 00 000000 0100000000000000 0000000000000000 01000000 00000000 \
                   4c 0100 c6086a3672315701 01 0500000000000000 01 61";
        assert_eq!(hex::encode(&m.bytes), doc.replace([' ', '\n'], ""));
        // Its first cookie.
        assert_eq!(cookie(ka, 0), (FROZEN_KEY_A << 2) + 3);
    }

    const FROZEN_KEY_A: u64 = 0x0157_3172_366a_08c6;

    #[test]
    fn one_hundred_thousand_entries_cost_a_path_each() {
        let k = key();
        let mut m = mem();
        let n = 100_000u64;
        for i in 0..n {
            let mut t = DirTree {
                units: &mut m,
                key: &k,
                unit: MIN_UNIT,
            };
            let before = t.units.writes;
            t.set(&format!("file-{i:07}"), Some((i + 2, Kind::File)))
                .unwrap();
            // A leaf and unit 0, and at a split one or two more per level.
            assert!(t.units.writes - before <= 6, "{}", t.units.writes - before);
        }
        let mut t = DirTree {
            units: &mut m,
            key: &k,
            unit: MIN_UNIT,
        };
        let h = t.header().unwrap();
        assert_eq!(h.entries, n);
        assert_eq!(h.depth, 2, "{h:?}");
        for i in (0..n).step_by(997) {
            assert_eq!(
                t.get(&format!("file-{i:07}")).unwrap(),
                Some((i + 2, Kind::File))
            );
        }
        let listed = all(&mut m, &k, 1000);
        assert_eq!(listed.len() as u64, n);
        assert!(listed.windows(2).all(|w| w[0].0 < w[1].0));
    }

    /// A node is parsed and checked whole when it is read (the order of its keys, and of
    /// its names): kept beside its unit, lookups read no unit again. At every visit, kept
    /// or not, its keys must lie within the bounds its parent gives: two leaves swapped
    /// (each in order by itself) answer no lookup wrongly, nor does a leaf with two entries
    /// swapped.
    #[test]
    fn nodes_are_checked_once_and_bounded_at_every_visit() {
        const N: u64 = 2000;
        let k = key();
        let mut m = mem();
        for i in 0..N {
            DirTree {
                units: &mut m,
                key: &k,
                unit: MIN_UNIT,
            }
            .set(&format!("n{i:04}"), Some((i + 2, Kind::File)))
            .unwrap();
        }
        let get_all = |m: &mut Mem| -> Vec<Result<Option<(u64, Kind)>>> {
            let mut t = DirTree {
                units: m,
                key: &k,
                unit: MIN_UNIT,
            };
            (0..N).map(|i| t.get(&format!("n{i:04}"))).collect()
        };
        let h = DirTree {
            units: &mut m,
            key: &k,
            unit: MIN_UNIT,
        }
        .header()
        .unwrap();
        assert_eq!(h.depth, 1, "{h:?}");
        m.kept = Some(Default::default());
        for r in [get_all(&mut m), get_all(&mut m)] {
            for (i, r) in r.into_iter().enumerate() {
                assert_eq!(r.unwrap(), Some((i as u64 + 2, Kind::File)));
            }
        }
        let reads = m.reads;
        get_all(&mut m);
        assert_eq!(m.reads, reads, "lookups over kept nodes read units");
        // Leaf units 1 and 2 swapped; then, in unit 1, its first two entries (names of
        // five bytes, so the layout stays whole).
        let u = MIN_UNIT;
        let mut swapped = m.bytes.clone();
        let (a, b) = swapped[u..].split_at_mut(u);
        a.swap_with_slice(&mut b[..u]);
        let mut reordered = m.bytes.clone();
        let first = &m.bytes[u + 3..u + 3 + 23];
        let second = &m.bytes[u + 3 + 23..u + 3 + 46];
        assert_eq!((first[17], second[17]), (5, 5), "names of five bytes");
        reordered[u + 3..u + 3 + 46].copy_from_slice(&[second, first].concat());
        for (what, bytes) in [("leaves swapped", swapped), ("entries swapped", reordered)] {
            for keep in [false, true] {
                let mut bad = Mem {
                    bytes: bytes.clone(),
                    kept: keep.then(Default::default),
                    ..mem()
                };
                let mut alarms = 0;
                for (i, r) in get_all(&mut bad).into_iter().enumerate() {
                    match r {
                        Ok(v) => assert_eq!(v, Some((i as u64 + 2, Kind::File)), "{what}"),
                        Err(Error::Tampered { .. }) => alarms += 1,
                        Err(e) => panic!("{what}: {e}"),
                    }
                }
                assert!(alarms > 0, "{what}, kept nodes: {keep}");
            }
        }
    }

    #[test]
    fn a_damaged_unit_is_named_not_a_panic() {
        let k = key();
        let mut m = mem();
        for i in 0..2000u64 {
            DirTree {
                units: &mut m,
                key: &k,
                unit: MIN_UNIT,
            }
            .set(&format!("n{i}"), Some((i + 2, Kind::File)))
            .unwrap();
        }
        // The last: a byte of a unit's padding, past its last entry.
        for (at, v) in [
            (0, b'X'),
            (4, 9),
            (HEADER_LEN, b'Q'),
            (MIN_UNIT + 1, 0xff),
            (2 * MIN_UNIT - 1, 1),
        ] {
            let mut bad = Mem {
                bytes: m.bytes.clone(),
                ..mem()
            };
            bad.bytes[at] = v;
            let mut t = DirTree {
                units: &mut bad,
                key: &k,
                unit: MIN_UNIT,
            };
            let r = (0..2000)
                .map(|i| t.get(&format!("n{i}")))
                .find(|r| r.is_err());
            assert!(
                matches!(r, Some(Err(Error::Tampered { .. }))),
                "byte {at}: {r:?}"
            );
        }
    }

    /// A node's length is what it encodes to (splits are decided on it), and leaves fill:
    /// 20,000 names take at most twice the units their bytes need.
    #[test]
    fn node_lengths_are_their_encodings_and_leaves_fill() {
        let es: Vec<Ent> = (0..5u64)
            .map(|i| Ent {
                key: i,
                name: "n".repeat(i as usize + 1),
                ino: i,
                kind: Kind::File,
            })
            .collect();
        for node in [
            Node::Leaf(es),
            Node::Leaf(Vec::new()),
            Node::Inner {
                keys: vec![4, 9, 12],
                kids: vec![1, 2, 3, 4],
            },
        ] {
            let mut b = Vec::new();
            node.encode(&mut b);
            assert_eq!(node.len(), b.len(), "{node:?}");
        }
        let k = key();
        let mut m = mem();
        let n = 20_000u64;
        for i in 0..n {
            DirTree {
                units: &mut m,
                key: &k,
                unit: MIN_UNIT,
            }
            .set(&format!("file-{i:07}"), Some((i + 2, Kind::File)))
            .unwrap();
        }
        let need = (n as usize * (18 + 12)).div_ceil(MIN_UNIT);
        let units = m.bytes.len() / MIN_UNIT;
        assert!(
            units <= 2 * need,
            "{units} units for {need} units of entries"
        );
    }

    #[test]
    fn names_sharing_a_key_keep_their_order_and_ranks() {
        let es: Vec<Ent> = ["a", "b", "c"]
            .iter()
            .map(|n| Ent {
                key: 9,
                name: n.to_string(),
                ino: 2,
                kind: Kind::File,
            })
            .chain(std::iter::once(Ent {
                key: 10,
                name: "z".into(),
                ino: 3,
                kind: Kind::File,
            }))
            .collect();
        let c: Vec<u64> = ranked(es).map(|(c, _)| c).collect();
        assert_eq!(c, vec![39, 40, 41, 43]);
    }

    /// A leaf holds at most [`GROUP_MAX`] names of one key: one more is refused (ENOSPC),
    /// and the last one that fits is taken.
    #[test]
    fn names_of_one_key_are_bounded_per_leaf() {
        let k = key();
        let shared = name_key(&k, "new");
        for (have, fits) in [(GROUP_MAX - 1, true), (GROUP_MAX, false)] {
            let mut m = mem();
            let es: Vec<Ent> = (0..have)
                .map(|i| Ent {
                    key: shared,
                    name: format!("g{i}"),
                    ino: 2 + i as u64,
                    kind: Kind::File,
                })
                .collect();
            let h = Header {
                depth: 0,
                entries: have as u64,
                subdirs: 0,
                units: 1,
            };
            let mut t = DirTree {
                units: &mut m,
                key: &k,
                unit: MIN_UNIT,
            };
            t.put(&h, 0, &Node::Leaf(es)).unwrap();
            let r = t.set("new", Some((99, Kind::File)));
            assert_eq!(r.is_ok(), fits, "{have} names of the key: {r:?}");
            let found = t.get("new").unwrap();
            assert_eq!(found.is_some(), fits);
            assert_eq!(t.header().unwrap().entries, have as u64 + u64::from(fits));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Against a map: any sequence of sets and removes, then a listing in pages of any
        /// size, gives the map's entries, each once, in cookie order; and a listing that
        /// runs while the directory changes returns every name present throughout.
        #[test]
        fn behaves_as_a_map(ops in proptest::collection::vec((0u16..3000, any::<bool>(), 0u8..3), 1..2500), step in 1usize..300) {
            let k = key();
            let mut m = mem();
            let mut model = BTreeMap::new();
            for (n, add, kind) in &ops {
                let name = format!("{n}-{}", "x".repeat(*n as usize % 200));
                let kind = [Kind::File, Kind::Dir, Kind::Symlink][*kind as usize];
                let mut t = DirTree { units: &mut m, key: &k, unit: MIN_UNIT };
                let target = add.then_some((*n as u64 + 2, kind));
                let was = t.set(&name, target).unwrap();
                let before = match target {
                    Some(t) => model.insert(name, t),
                    None => model.remove(&name),
                };
                prop_assert_eq!(was, before.is_some());
            }
            let listed = all(&mut m, &k, step);
            prop_assert!(listed.windows(2).all(|w| w[0].0 < w[1].0));
            let got: BTreeMap<String, (u64, Kind)> =
                listed.into_iter().map(|(_, e)| (e.name, (e.ino, e.kind))).collect();
            prop_assert_eq!(&got, &model);
            let mut t = DirTree { units: &mut m, key: &k, unit: MIN_UNIT };
            let h = t.header().unwrap();
            prop_assert_eq!(h.entries, model.len() as u64);
            prop_assert_eq!(h.subdirs, model.values().filter(|(_, k)| *k == Kind::Dir).count() as u64);
            if model.is_empty() {
                prop_assert!(m.bytes.is_empty());
            }
        }

        #[test]
        fn a_listing_survives_changes(seed in 0u64..1000, step in 1usize..50) {
            let k = key();
            let mut m = mem();
            let stay: Vec<String> = (0..600).map(|i| format!("stay{i}")).collect();
            for (i, n) in stay.iter().enumerate() {
                DirTree { units: &mut m, key: &k, unit: MIN_UNIT }.set(n, Some((i as u64 + 2, Kind::File))).unwrap();
            }
            let mut seen = std::collections::BTreeSet::new();
            let mut after = 0;
            let mut round = seed;
            loop {
                let page = DirTree { units: &mut m, key: &k, unit: MIN_UNIT }.page(after, step).unwrap();
                for (c, e) in &page {
                    prop_assert!(*c > after);
                    prop_assert!(seen.insert(e.name.clone()), "{} twice", e.name);
                }
                if page.len() < step {
                    break;
                }
                after = page.last().unwrap().0;
                // Between pages: churn that adds and removes other names (splits too).
                for j in 0..40 {
                    round = round.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let n = format!("churn{}", (round >> 33) % 400);
                    let add = j % 3 != 0;
                    DirTree { units: &mut m, key: &k, unit: MIN_UNIT }.set(&n, add.then_some((1000, Kind::File))).unwrap();
                }
            }
            for n in &stay {
                prop_assert!(seen.contains(n), "{} skipped", n);
            }
        }
    }
}
