//! The staging layer between schemes and the untrusted store: crash-safe commits.
//!
//! Schemes read and write objects through a [`Tx`]. A write lands either
//!
//! - **directly** in the store, when it falls entirely at or past the object's *committed
//!   length* (the length it had when the transaction began) and the object was not cut
//!   shorter in this transaction: no committed state refers to those bytes, so a crash
//!   cannot hurt (this is what makes appends and new files single-write), or
//! - in the in-memory **overlay** otherwise (overwrites of committed bytes, truncations,
//!   deletions).
//!
//! [`Tx::prepare`] turns the overlay into a redo journal, written to one of two journal
//! slots and made durable; the caller then seals the journal's digest into the trusted
//! anchor; [`Tx::apply`] writes the overlay in place. On open, the journal the anchor names
//! is verified and replayed (replay is idempotent: it holds the final images of
//! overwritten ranges and final lengths). Two slots alternate so the journal the current
//! anchor names is never overwritten before the anchor moves on. See docs/design.md,
//! "Crash safety", for the case-by-case argument.
//!
//! Only data objects (`.d`) are written directly; tree nodes and spilled counters are
//! always staged, so that the log (docs/design.md, "The log") names every byte of a file's
//! integrity state, and a file's direct writes can be checked, after a crash, against the
//! tree the log holds. With [`Tx::capture`] on, every change is also recorded as a
//! [`LoggedOp`] until [`Tx::drain`] hands them to the log; bytes written directly are then
//! *logged*: a later write over them is staged, never written in place, so what the log
//! names stays in the store as it was written.
//!
//! A commit is split so that its I/O runs without the engine's lock ([`Tx::begin_commit`],
//! then [`Commit::write_journal`], the seal, [`Commit::apply`], [`Tx::end_commit`]): at
//! `begin_commit` the staged state becomes a frozen, read-only [`Commit`], and the
//! transaction goes on empty *on top of it*. Until `end_commit`, reads of an object the
//! commit changes see its final image (the commit's ranges over the store below its cut,
//! which its application never touches), and writes to such an object are staged, never
//! direct, because the commit's final `SetLen` would cut bytes written past its length.

use crate::crypto::{Hash, SubKey};
use crate::error::{Error, Result, Subject};
use crate::metrics::Phase;
use crate::store::{ObjectClass, UntrustedStore};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Magic of a journal object.
pub const JOURNAL_MAGIC: &[u8; 8] = b"INTJRNL1";

/// Name of journal slot `s` (0 or 1).
pub fn journal_name(slot: u8) -> String {
    format!("journal.{slot}")
}

/// Where the anchor says the last commit's journal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalRef {
    /// Slot (0 or 1).
    pub slot: u8,
    /// Byte length.
    pub len: u64,
    /// Keyed digest of the journal's bytes.
    pub digest: Hash,
}

#[derive(Debug, Default, Clone)]
struct ObjState {
    /// Length in the store when the transaction began (`None`: did not exist).
    committed_len: Option<u64>,
    /// Current logical length (`None`: does not exist).
    len: Option<u64>,
    /// Smallest length the object was cut to in this transaction: store bytes at or past
    /// it are no longer visible.
    cut: Option<u64>,
    /// Overlay data: non-overlapping ranges keyed by start offset.
    ranges: BTreeMap<u64, Vec<u8>>,
    /// Deleted in this transaction.
    deleted: bool,
    /// Written directly in this transaction (needs a sync before the commit is sealed).
    direct: bool,
    /// End of the bytes written directly in this transaction (0 if none).
    direct_end: u64,
    /// A commit in flight changes this object: reads below `committed_len` see its final
    /// image, and writes are staged (see the module docs).
    on_base: bool,
    /// The bytes written directly and handed to the log ([`Tx::drain`]), as disjoint
    /// ranges `start -> end`: a write over them is staged, never made in place (a logged
    /// direct write is never overwritten by a later unlogged one). A write into a gap
    /// between them (the kernel writes a file back out of order) may go to the store.
    logged: BTreeMap<u64, u64>,
    /// Holds a sealed journal's changes that the store may not have yet
    /// ([`Tx::stage_unapplied`]): writes are staged, since the store's length is not the
    /// object's (a direct write past it would land under the journal's ranges).
    pinned: bool,
}

impl ObjState {
    /// Nothing but the length the store gave at first use: forgetting it and asking the
    /// store again later gives the same view.
    fn is_clean(&self) -> bool {
        !self.staged() && !self.direct && !self.on_base && !self.pinned && self.logged.is_empty()
    }
    fn staged(&self) -> bool {
        self.deleted
            || self.cut.is_some()
            || !self.ranges.is_empty()
            || self.len != self.committed_len
    }
    /// Changed only by direct writes that leave the store holding exactly the object's
    /// bytes: its length is the store's (what it held, or the end of the direct writes), and
    /// nothing is staged, cut or deleted. A commit then needs no journal entry for it (no
    /// `SetLen`: the store's length is already the final one), only a sync; so the
    /// transaction that goes on over the commit in flight may append to it directly
    /// instead of staging (and logging) every byte (docs/design.md, "Commits in flight").
    fn only_appended(&self) -> bool {
        self.direct && self.ranges.is_empty() && self.len_is_stored()
    }
    /// A data object whose final length is what the store holds of it: in the store (or
    /// written directly), nothing deleted, cut or replayed, and its length the store's
    /// (what it held, or the end of the direct writes), so every staged range lies inside.
    /// Its commit sets no length, and the transaction over the commit in flight appends
    /// to it directly ([`FrozenObj::open_end`]; docs/design.md, "Commits in flight").
    fn open_end(&self, name: &str) -> bool {
        ObjectClass::of(name) == ObjectClass::Data
            && !self.pinned
            && (self.committed_len.is_some() || self.direct)
            && self.len_is_stored()
    }
    /// Nothing deleted or cut, and the length the store's: what it held, or the end of the
    /// direct writes (what [`ObjState::only_appended`] and [`ObjState::open_end`] share).
    fn len_is_stored(&self) -> bool {
        !self.deleted
            && self.cut.is_none()
            && self.len == Some(self.committed_len.unwrap_or(0).max(self.direct_end))
    }
}

/// One transaction's view of the untrusted store.
pub struct Tx {
    store: Arc<dyn UntrustedStore>,
    objs: HashMap<String, ObjState>,
    overlay_bytes: usize,
    /// Bytes written directly since the transaction began (or its last commit began).
    direct_bytes: usize,
    /// Never writes the store: every change stays in the overlay, and it cannot commit.
    read_only: bool,
    /// The commit in flight under this transaction, if any (see the module docs).
    base: Option<Arc<Frozen>>,
    /// Record every change for the log ([`Tx::capture`]).
    capturing: bool,
    /// Stage every write ([`Tx::stage_all`]).
    stage_all: bool,
    captured: Vec<LoggedOp>,
    /// [`Tx::forget_clean`] looks again past this many objects.
    forget_at: usize,
    /// A view ([`Tx::view`]): an object it was not given, and that no commit in flight
    /// holds, is read from the store as it is, without asking its length first.
    view: bool,
    /// Twin blocks: the bytes of data objects written by [`Tx::write_twin`] or touched
    /// ([`Tx::touch`]) since this transaction began (or its last commit began), as disjoint
    /// ranges per object ([`Tx::twin_free`]).
    recent: HashMap<String, BTreeMap<u64, u64>>,
    /// The same for the transaction the commit in flight took: until that commit is
    /// applied, the durable state is the one before it.
    recent_base: HashMap<String, BTreeMap<u64, u64>>,
}

/// Objects a transaction keeps knowing before [`Tx::forget_clean`] drops the clean ones.
const KNOW_OBJECTS: usize = 4096;

/// One change a transaction made, as the log records it ([`Tx::drain`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoggedOp {
    /// Bytes staged at `off` (the log holds them: they are not in the store yet).
    Write {
        /// Object.
        name: String,
        /// Offset.
        off: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A length set.
    SetLen {
        /// Object.
        name: String,
        /// New length.
        len: u64,
    },
    /// A deletion.
    Delete {
        /// Object.
        name: String,
    },
    /// Bytes written directly to the store at `[off, off + len)` (the log names them; a
    /// seal that covers them syncs the object first).
    Direct {
        /// Object.
        name: String,
        /// Offset.
        off: u64,
        /// Length.
        len: u64,
    },
    /// `len` bytes of an always-staged object copied from `src` to `dst`, staged (as
    /// `memmove`: the bytes the object held before the copy); [`Tx::copy_within`].
    Copy {
        /// Object.
        name: String,
        /// Where the bytes are.
        src: u64,
        /// Where they go.
        dst: u64,
        /// How many.
        len: u64,
    },
}

impl LoggedOp {
    /// The object it changes.
    pub fn name(&self) -> &str {
        match self {
            LoggedOp::Write { name, .. }
            | LoggedOp::SetLen { name, .. }
            | LoggedOp::Delete { name }
            | LoggedOp::Direct { name, .. }
            | LoggedOp::Copy { name, .. } => name,
        }
    }
}

/// The final image of the objects a commit changes.
#[derive(Debug, Default)]
pub struct Frozen {
    objs: HashMap<String, FrozenObj>,
}

#[derive(Debug)]
struct FrozenObj {
    /// Final length (`None`: deleted).
    len: Option<u64>,
    /// Store bytes at or past this are not part of the final image (unless in `ranges`).
    cut: Option<u64>,
    ranges: BTreeMap<u64, Vec<u8>>,
    /// A data object whose final length is the store's (nothing cut or deleted, every
    /// range inside what the store holds; [`ObjState::open_end`]): the commit writes its
    /// ranges in place and sets no length, so the transaction over it may write directly
    /// past that length, and reads see the store's bytes there.
    open_end: bool,
}

impl Frozen {
    /// Reads the final image of `o` at `off` into `buf` (already zeroed): store bytes below
    /// the cut (the committed ones and the commit's direct writes), which applying the
    /// commit never changes, then the commit's ranges (whether or not applied yet).
    fn read(
        store: &dyn UntrustedStore,
        name: &str,
        o: &FrozenObj,
        off: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let Some(len) = o.len else { return Ok(()) };
        // Past an open end, the store's bytes are the transaction's direct writes.
        let end = off + buf.len() as u64;
        let end = if o.open_end { end } else { end.min(len) };
        if off >= end {
            return Ok(());
        }
        // Store bytes below the cut (none when the cut lies before `off`).
        let n = o.cut.unwrap_or(u64::MAX).min(end).saturating_sub(off) as usize;
        read_store(store, name, off, &mut buf[..n])?;
        overlay_ranges(&o.ranges, off, &mut buf[..(end - off) as usize]);
        Ok(())
    }
}

/// Reads `buf.len()` bytes of the store's object at `off`, stopping early at its end (the
/// rest of `buf` is left as it is); returns how many bytes it read.
fn read_store(store: &dyn UntrustedStore, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let r = crate::metrics::timed(Phase::StoreWait, || {
            store.read_at(name, off + done as u64, &mut buf[done..])
        })?;
        if r == 0 {
            break;
        }
        done += r;
    }
    Ok(done)
}

/// Copies the parts of `ranges` that meet `[off, off + buf.len())` into `buf`.
fn overlay_ranges(ranges: &BTreeMap<u64, Vec<u8>>, off: u64, buf: &mut [u8]) {
    let end = off + buf.len() as u64;
    let first = ranges
        .range(..=off)
        .next_back()
        .map(|(k, _)| *k)
        .unwrap_or(off);
    for (&s, data) in ranges.range(first..end) {
        let e = s + data.len() as u64;
        if e <= off {
            continue;
        }
        let a = s.max(off);
        let b = e.min(end);
        buf[(a - off) as usize..(b - off) as usize]
            .copy_from_slice(&data[(a - s) as usize..(b - s) as usize]);
    }
}

/// A commit taken out of a transaction by [`Tx::begin_commit`]: what must become durable,
/// the journal that makes it atomic, and how to apply it in place. Its I/O needs no lock,
/// and nothing of it is copied under the lock: the journal is encoded and applied from the
/// frozen image, which the transaction it came from reads meanwhile.
#[derive(Debug)]
pub struct Commit {
    /// Objects written directly: synced before the seal.
    direct: Vec<String>,
    /// Objects that did not exist before this commit's transaction (see [`Tx::created`]).
    created: Vec<String>,
    /// Objects with staged changes, sorted (the journal's order).
    staged: Vec<String>,
    epoch: u64,
    /// The journal slot (the one the current anchor does not name).
    slot: u8,
    /// What the anchor must record, once [`Commit::write_journal`] wrote the journal.
    journal: std::sync::OnceLock<JournalRef>,
    frozen: Arc<Frozen>,
}

impl Commit {
    /// What the anchor must record: `None` when nothing needed journaling, or before
    /// [`Commit::write_journal`].
    pub fn journal(&self) -> Option<JournalRef> {
        self.journal.get().copied()
    }

    /// The journal's operations, borrowing the frozen image: per object, a deletion, or
    /// its cut, its ranges and its final length.
    fn ops(&self) -> Vec<Op<'_>> {
        let mut ops = Vec::new();
        for name in &self.staged {
            let f = &self.frozen.objs[name];
            let Some(len) = f.len else {
                ops.push(Op::Delete { name });
                continue;
            };
            if let Some(cut) = f.cut {
                ops.push(Op::SetLen { name, len: cut });
            }
            for (&off, data) in &f.ranges {
                ops.push(Op::Write { name, off, data });
            }
            // An open end's store length is its final length already (its direct writes
            // are synced before the seal); a SetLen would cut what the transaction over
            // the commit wrote past it, also when the journal is replayed.
            if !f.open_end {
                ops.push(Op::SetLen { name, len });
            }
        }
        ops
    }

    /// Objects that did not exist when the commit's transaction first touched them: nothing
    /// sealed before the commit refers to them, so if it never seals they are orphans.
    pub fn created(&self) -> &[String] {
        &self.created
    }

    /// Step 1 (before the seal): makes direct writes durable, then encodes the journal,
    /// writes it into its slot and syncs it. Returns what the anchor must record.
    pub fn write_journal(
        &self,
        store: &dyn UntrustedStore,
        key: &SubKey,
    ) -> Result<Option<JournalRef>> {
        if !self.direct.is_empty() {
            crate::metrics::timed(Phase::StoreWait, || store.sync(&self.direct))?;
        }
        if self.staged.is_empty() {
            return Ok(None);
        }
        let bytes = encode_journal(self.epoch, &self.ops());
        let r = JournalRef {
            slot: self.slot,
            len: bytes.len() as u64,
            digest: key.mac(&[&bytes]),
        };
        let name = journal_name(self.slot);
        // In place: the sealed anchor names the other slot, and this slot's previous
        // journal was applied durably before that anchor was sealed, so nothing refers
        // to these bytes until the next anchor does (after this sync). One fsync, no
        // rename.
        crate::metrics::timed(Phase::StoreWait, || -> Result<()> {
            store.write_at(&name, 0, &bytes)?;
            store.set_len(&name, bytes.len() as u64)?;
            store.sync(std::slice::from_ref(&name))
        })?;
        let _ = self.journal.set(r);
        Ok(Some(r))
    }

    /// Step 3 (after the anchor is sealed): applies the journal in place and syncs.
    pub fn apply(&self, store: &dyn UntrustedStore) -> Result<()> {
        crate::metrics::timed(Phase::StoreWait, || apply_ops(store, &self.ops()))
    }
}

/// One journal operation (the final image of a range, a length, or a deletion), borrowing
/// its bytes from the frozen commit or from the journal being replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op<'a> {
    Write {
        name: &'a str,
        off: u64,
        data: &'a [u8],
    },
    SetLen {
        name: &'a str,
        len: u64,
    },
    Delete {
        name: &'a str,
    },
}

impl Tx {
    /// A new, empty transaction over `store`.
    pub fn new(store: Arc<dyn UntrustedStore>) -> Self {
        Tx {
            store,
            objs: HashMap::new(),
            overlay_bytes: 0,
            direct_bytes: 0,
            read_only: false,
            base: None,
            capturing: false,
            stage_all: false,
            captured: Vec::new(),
            forget_at: KNOW_OBJECTS,
            view: false,
            recent: HashMap::new(),
            recent_base: HashMap::new(),
        }
    }

    /// Drops what the transaction knows of objects it did not change (their lengths, read
    /// from the store at first use) once it knows of more than [`KNOW_OBJECTS`], or twice
    /// as many as after the last time: a session that only reads (a mount serving a
    /// `find`, a backup) would otherwise keep an entry for every object it touched until
    /// its next commit, which a read-only session never makes (issue 18). Returns the
    /// number of objects still known.
    pub fn forget_clean(&mut self) -> usize {
        if self.objs.len() >= self.forget_at {
            self.objs.retain(|_, s| !s.is_clean());
            self.forget_at = (2 * self.objs.len()).max(KNOW_OBJECTS);
        }
        self.objs.len()
    }

    /// A transaction that never writes the store (read-only opens, which may still need to
    /// see a pending journal through the overlay; see [`Tx::stage_journal`]).
    pub fn read_only(store: Arc<dyn UntrustedStore>) -> Self {
        Tx {
            read_only: true,
            ..Tx::new(store)
        }
    }

    /// How many objects the transaction knows of (changed, or only looked at).
    pub fn known(&self) -> usize {
        self.objs.len()
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn UntrustedStore> {
        &self.store
    }

    /// Bytes currently held in the overlay (the engine commits when this grows large).
    pub fn overlay_bytes(&self) -> usize {
        self.overlay_bytes
    }

    /// Bytes written directly to the store since the transaction, or its last commit,
    /// began (the next commit syncs them).
    pub fn direct_bytes(&self) -> usize {
        self.direct_bytes
    }

    fn state(&mut self, name: &str) -> Result<&mut ObjState> {
        if !self.objs.contains_key(name) {
            let st = match self.base.as_ref().and_then(|b| b.objs.get(name)) {
                Some(f) => ObjState {
                    committed_len: f.len,
                    len: f.len,
                    on_base: true,
                    ..Default::default()
                },
                None => {
                    let len = crate::metrics::timed(Phase::StoreWait, || self.store.len(name))?;
                    ObjState {
                        committed_len: len,
                        len,
                        ..Default::default()
                    }
                }
            };
            self.objs.insert(name.to_string(), st);
        }
        Ok(self.objs.get_mut(name).expect("inserted above"))
    }

    /// The object's current length (`None` if it does not exist).
    pub fn len(&mut self, name: &str) -> Result<Option<u64>> {
        Ok(self.state(name)?.len)
    }

    /// Reads `buf.len()` bytes at `off`; bytes past the end read as zeros. Returns the
    /// number of bytes that lay inside the object.
    pub fn read_at(&mut self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
        let store = self.store.clone();
        crate::metrics::count_read(ObjectClass::of(name), buf.len());
        if self.view
            && !self.objs.contains_key(name)
            && !self
                .base
                .as_ref()
                .is_some_and(|b| b.objs.contains_key(name))
        {
            // What `state` would ask the store (its length) and then read, in one call:
            // a short read is the end, a missing object is empty (a view never writes, so
            // nothing needs the length kept).
            buf.fill(0);
            return match read_store(store.as_ref(), name, off, buf) {
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                    Ok(0)
                }
                r => r,
            };
        }
        let st = self.state(name)?;
        buf.fill(0);
        let Some(len) = st.len else { return Ok(0) };
        if off >= len {
            return Ok(0);
        }
        let inside = ((len - off) as usize).min(buf.len());
        // Base bytes, up to the cut: the store's, or the final image of a commit in flight.
        let base_end = st.cut.unwrap_or(u64::MAX).min(len);
        let in_store = st.committed_len.is_some() || st.direct;
        if in_store && off < base_end {
            // At least one byte: `off < base_end` and `off < len`.
            let n = ((base_end - off) as usize).min(inside);
            if st.on_base {
                let base = self.base.as_ref().expect("on_base objects have a base");
                let f = base
                    .objs
                    .get(name)
                    .expect("on_base objects are in the base");
                Frozen::read(store.as_ref(), name, f, off, &mut buf[..n])?;
            } else {
                read_store(store.as_ref(), name, off, &mut buf[..n])?;
            }
        }
        // Overlay ranges on top.
        let st = self.objs.get(name).expect("present");
        overlay_ranges(&st.ranges, off, &mut buf[..inside]);
        Ok(inside)
    }

    /// The commit in flight changes `name` and leaves its end open
    /// ([`FrozenObj::open_end`]). A lookup only while a commit is in flight.
    fn open_in_base(&self, name: &str) -> bool {
        self.base
            .as_ref()
            .and_then(|b| b.objs.get(name))
            .is_some_and(|f| f.open_end)
    }

    /// Writes `data` at `off` (direct or staged; see the module docs).
    pub fn write_at(&mut self, name: &str, off: u64, data: &[u8]) -> Result<()> {
        self.write(name, off, data, false)
    }

    /// [`Tx::write_at`] of each `(off, data)` of `list`, in order. Writes to a metadata
    /// object are always staged, so they are staged together: one lookup of the object
    /// for all of them (the nodes of a tree's path, written by one update). Every staged
    /// write of a metadata object goes through here ([`Tx::write`] hands them over).
    pub fn write_list(&mut self, name: &str, list: &[(u64, &[u8])]) -> Result<()> {
        let class = ObjectClass::of(name);
        if class == ObjectClass::Data {
            for &(off, data) in list {
                self.write(name, off, data, false)?;
            }
            return Ok(());
        }
        let capturing = self.capturing;
        let st = self.state(name)?;
        if st.deleted {
            return Err(Error::Invalid(format!("write to deleted object {name}")));
        }
        let (mut added, mut captured) = (0isize, Vec::new());
        for &(off, data) in list.iter().filter(|(_, d)| !d.is_empty()) {
            crate::metrics::count_write(class, data.len());
            added += insert_range(&mut st.ranges, off, data);
            st.len = Some(st.len.unwrap_or(0).max(off + data.len() as u64));
            if capturing {
                captured.push(LoggedOp::Write {
                    name: name.to_string(),
                    off,
                    data: data.to_vec(),
                });
            }
        }
        self.overlay_bytes = self.overlay_bytes.saturating_add_signed(added);
        self.captured.extend(captured);
        Ok(())
    }

    /// [`Tx::write_at`]; `twin`: direct whatever the object's lengths and ranges say
    /// ([`Tx::write_twin`]).
    fn write(&mut self, name: &str, off: u64, data: &[u8], twin: bool) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // A metadata object's writes are all staged (only a data object's may go to the
        // store directly).
        if !twin && ObjectClass::of(name) != ObjectClass::Data {
            return self.write_list(name, &[(off, data)]);
        }
        let store = self.store.clone();
        crate::metrics::count_write(ObjectClass::of(name), data.len());
        let read_only = self.read_only;
        let stage_all = self.stage_all;
        // The commit in flight sets the object's length at its end (cutting what lies
        // past it), unless its end is open: then a write past that length is direct.
        let open_base = self.open_in_base(name);
        let st = self.state(name)?;
        if st.deleted {
            return Err(Error::Invalid(format!("write to deleted object {name}")));
        }
        let on_closed_base = st.on_base && !open_base;
        let end = off + data.len() as u64;
        // Direct only past the committed length, and past the last staged range and the
        // last logged direct write that start before the write's end (ranges do not
        // overlap, so that one ends last): never under a staged range (one staged while a
        // commit was in flight can lie past the committed length; reads would see the
        // range, not the store), nor over logged bytes. A gap before them is not past it.
        let staged_end = st
            .ranges
            .range(..end)
            .next_back()
            .map_or(0, |(k, v)| k + v.len() as u64);
        let logged_end = st.logged.range(..end).next_back().map_or(0, |(_, &e)| e);
        let boundary = st
            .committed_len
            .unwrap_or(0)
            .max(logged_end)
            .max(staged_end);
        let (staged, direct) = if twin {
            (&data[..0], data)
        } else if read_only || stage_all || st.cut.is_some() || on_closed_base || st.pinned {
            (data, &data[data.len()..])
        } else if off >= boundary {
            (&data[..0], data)
        } else if end <= boundary {
            (data, &data[data.len()..])
        } else {
            data.split_at((boundary - off) as usize)
        };
        if !direct.is_empty() {
            let doff = end - direct.len() as u64;
            // Marked first: a write that fails may still have created the object (a full
            // file system), which is then among the ones to delete ([`Tx::created`]).
            st.direct = true;
            st.direct_end = st.direct_end.max(end);
            crate::metrics::timed(Phase::StoreWait, || store.write_at(name, doff, direct))?;
        }
        if !staged.is_empty() {
            let added = insert_range(&mut st.ranges, off, staged);
            self.overlay_bytes = self.overlay_bytes.saturating_add_signed(added);
        }
        self.direct_bytes = self.direct_bytes.saturating_add(direct.len());
        let st = self.objs.get_mut(name).expect("present");
        st.len = Some(st.len.unwrap_or(0).max(end));
        if self.capturing {
            if !staged.is_empty() {
                self.captured.push(LoggedOp::Write {
                    name: name.to_string(),
                    off,
                    data: staged.to_vec(),
                });
            }
            if !direct.is_empty() {
                self.captured.push(LoggedOp::Direct {
                    name: name.to_string(),
                    off: end - direct.len() as u64,
                    len: direct.len() as u64,
                });
            }
        }
        Ok(())
    }

    /// Twin blocks ([`crate::format::TWIN_BLOCKS`]; docs/design.md, "Twin blocks"):
    /// whether bytes `[off, off + len)` of data object `to` may be written directly
    /// ([`Tx::write_twin`]) although they may lie below its committed length. The caller
    /// knows that the blocks' current versions are in `other` at the same offsets, and the
    /// rest is checked here: since the state a crash comes back to at the worst (the last
    /// checkpoint whose anchor is stored), neither object was written by `write_twin` or
    /// touched over those bytes (in this transaction or in the commit in flight), so the
    /// blocks' counters are still that state's, their versions there are in `other`, and
    /// no version a replay of the log may come back to is in `to` (appends, the only other
    /// direct writes, go to the slot a block starts in). Nor may anything force staging:
    /// a read-only or staging transaction, a cut, a pinned journal, a staged
    /// range over the bytes, or a commit in flight that sets the object's length.
    pub fn twin_free(&mut self, to: &str, other: &str, off: u64, len: u64) -> Result<bool> {
        if self.read_only || self.stage_all || len == 0 {
            return Ok(false);
        }
        let end = off + len;
        let hit = |m: Option<&BTreeMap<u64, u64>>| {
            m.and_then(|r| r.range(..end).next_back())
                .is_some_and(|(_, &e)| e > off)
        };
        for name in [to, other] {
            if hit(self.recent.get(name)) || hit(self.recent_base.get(name)) {
                return Ok(false);
            }
            let open_base = self.open_in_base(name);
            let st = self.state(name)?;
            let staged = st
                .ranges
                .range(..end)
                .next_back()
                .is_some_and(|(k, v)| k + v.len() as u64 > off);
            if st.deleted || st.cut.is_some() || st.pinned || (st.on_base && !open_base) || staged {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Writes `data` at `off` of data object `name` directly, where [`Tx::twin_free`] said
    /// it may: the write is logged as a direct write, and its bytes count as written since
    /// the checkpoint. (Logged direct writes need no check there: the only ones not made
    /// here are appends, which land in the slot the block's counter then names, and moving
    /// the block to the other slot is a write here.)
    pub fn write_twin(&mut self, name: &str, off: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if ObjectClass::of(name) != ObjectClass::Data || self.read_only {
            return Err(Error::Invalid(format!("twin write to {name}")));
        }
        let end = off + data.len() as u64;
        add_recent(self.recent.entry(name.to_string()).or_default(), off, end);
        self.write(name, off, data, true)
    }

    /// Counts bytes `[off, end)` of data object `name` as written since the checkpoint
    /// (their blocks' counters changed without a write: a cut, a hole), so that
    /// [`Tx::twin_free`] no longer offers them.
    pub fn touch(&mut self, name: &str, off: u64, end: u64) {
        if end > off {
            add_recent(self.recent.entry(name.to_string()).or_default(), off, end);
        }
    }

    /// Sets the object's length (creating it if missing); shrinking hides the tail.
    pub fn set_len(&mut self, name: &str, len: u64) -> Result<()> {
        let st = self.state(name)?;
        if st.deleted {
            return Err(Error::Invalid(format!("set_len of deleted object {name}")));
        }
        let cur = st.len.unwrap_or(0);
        if len < cur {
            st.cut = Some(st.cut.unwrap_or(u64::MAX).min(len));
            let removed = truncate_ranges(&mut st.ranges, len);
            self.overlay_bytes = self.overlay_bytes.saturating_sub(removed);
        }
        let st = self.objs.get_mut(name).expect("present");
        st.len = Some(len);
        if self.capturing {
            self.captured.push(LoggedOp::SetLen {
                name: name.to_string(),
                len,
            });
        }
        Ok(())
    }

    /// Deletes the object at commit; it reads as missing from now on.
    pub fn delete(&mut self, name: &str) -> Result<()> {
        // An object this transaction has not looked at (nor a commit in flight holds) is
        // not asked for its length: a deletion needs none (it is journaled as a deletion
        // whatever the store holds, and nothing writes the object after it), and a `stat`
        // under the engine lock can wait tens of milliseconds behind the backing file
        // system's journal while a checkpoint syncs (issue 14: every FORGET of an unlinked
        // file asked for its four objects).
        if !self.objs.contains_key(name)
            && !self
                .base
                .as_ref()
                .is_some_and(|b| b.objs.contains_key(name))
        {
            // Deleted below: no length, nothing staged.
            self.objs.insert(name.to_string(), ObjState::default());
        }
        let st = self.state(name)?;
        let removed: usize = st.ranges.values().map(|v| v.len()).sum();
        st.ranges.clear();
        st.deleted = true;
        st.len = None;
        self.overlay_bytes = self.overlay_bytes.saturating_sub(removed);
        if self.capturing {
            self.captured.push(LoggedOp::Delete {
                name: name.to_string(),
            });
        }
        Ok(())
    }

    /// Copies `len` bytes of `name` from `src` to `dst` (as `memmove`: the bytes the object
    /// holds before the copy), staged. The log records the copy, not the bytes: replaying
    /// it in order reads the same bytes, since the log holds every change of a staged
    /// object since the checkpoint its replay starts from, and the checkpoint's image is
    /// what the store holds then. Only for objects that are always staged (not data
    /// objects, whose bytes may be written directly); the source must lie inside the
    /// object.
    pub fn copy_within(&mut self, name: &str, src: u64, dst: u64, len: u64) -> Result<()> {
        if ObjectClass::of(name) == ObjectClass::Data {
            return Err(Error::Invalid(format!("copy within data object {name}")));
        }
        if len == 0 || src == dst {
            return Ok(());
        }
        let n = usize::try_from(len)
            .map_err(|_| Error::Invalid(format!("copy of {len} bytes within {name}")))?;
        let mut buf = vec![0u8; n];
        if self.read_at(name, src, &mut buf)? != n {
            return Err(Error::Invalid(format!(
                "copy from past the end of {name} ({src}+{len})"
            )));
        }
        let capturing = std::mem::replace(&mut self.capturing, false);
        let r = self.write_at(name, dst, &buf);
        self.capturing = capturing;
        r?;
        if self.capturing {
            self.captured.push(LoggedOp::Copy {
                name: name.to_string(),
                src,
                dst,
                len,
            });
        }
        Ok(())
    }

    /// Stages `data` at `off` of `name` (then its length `len`, if given) and logs `edits`
    /// in their place: changes that, replayed in order on what the object held before,
    /// leave the same bytes (moves and writes of a few bytes where the bytes would be
    /// kilobytes: a spilled file's counters, docs/design.md, "Counters in the log"). Unlike
    /// [`Tx::copy_within`], nothing is read back. Only for objects that are always staged
    /// (not data objects). The caller vouches for the edits.
    pub fn stage_logging(
        &mut self,
        name: &str,
        off: u64,
        data: &[u8],
        len: Option<u64>,
        edits: Vec<LoggedOp>,
    ) -> Result<()> {
        if ObjectClass::of(name) == ObjectClass::Data {
            return Err(Error::Invalid(format!(
                "logged staging of data object {name}"
            )));
        }
        let capturing = std::mem::replace(&mut self.capturing, false);
        let r = self
            .write_at(name, off, data)
            .and_then(|()| len.map_or(Ok(()), |l| self.set_len(name, l)));
        self.capturing = capturing;
        r?;
        if self.capturing {
            self.captured.extend(edits);
        }
        Ok(())
    }

    /// Stages every write, also past an object's committed length (on), or goes back to
    /// writing appends directly (off). For content that must be logged with the change
    /// that made it, all or nothing: a symlink's target.
    pub fn stage_all(&mut self, on: bool) {
        self.stage_all = on;
    }

    /// A read-only view of `names` as this transaction sees them now, for a reader that
    /// goes on without the engine's lock (docs/design.md, "Reads without the engine lock").
    /// It stays exact while nothing writes these objects (the caller holds what excludes
    /// their writers): a commit that begins meanwhile freezes the same final image, and its
    /// application writes in place exactly the staged bytes the view carries. `None` when
    /// their staged bytes exceed `max_bytes` (copying them would cost more than the lock).
    /// An object this transaction has not looked at is left to the view, which asks the
    /// store (or the commit in flight) at its first use, as this transaction would: so a
    /// cold object's length costs the reader its round trip, not the lock's holder (an
    /// fsck walk of a bucket, a cold read).
    pub fn view(&self, names: &[&str], max_bytes: usize) -> Result<Option<Tx>> {
        let mut objs = HashMap::with_capacity(names.len());
        let mut bytes = 0;
        for &name in names {
            let Some(st) = self.objs.get(name) else {
                continue;
            };
            bytes += st.ranges.values().map(Vec::len).sum::<usize>();
            if bytes > max_bytes {
                return Ok(None);
            }
            objs.insert(name.to_string(), st.clone());
        }
        Ok(Some(Tx {
            objs,
            base: self.base.clone(),
            view: true,
            ..Tx::read_only(self.store.clone())
        }))
    }

    /// Whether the transaction (or the commit in flight under it) deletes `name`: a
    /// read-only open that has not applied the log still holds objects it deletes.
    pub fn deletes(&self, name: &str) -> bool {
        self.objs.get(name).is_some_and(|s| s.deleted)
            || self
                .base
                .as_ref()
                .and_then(|b| b.objs.get(name))
                .is_some_and(|f| f.len.is_none())
    }

    /// Starts (or stops) recording every change as a [`LoggedOp`] for the log.
    pub fn capture(&mut self, on: bool) {
        self.capturing = on;
        if !on {
            self.captured.clear();
        }
    }

    /// Whether changes were recorded since the last [`Tx::drain`].
    pub fn has_captured(&self) -> bool {
        !self.captured.is_empty()
    }

    /// The changes recorded since the last call, in order. Bytes they wrote directly are
    /// logged from now on: a later write over them is staged (see the module docs).
    pub fn drain(&mut self) -> Vec<LoggedOp> {
        let ops = std::mem::take(&mut self.captured);
        for op in &ops {
            if let LoggedOp::Direct { name, off, len } = op {
                if let Some(st) = self.objs.get_mut(name.as_str()) {
                    add_range(&mut st.logged, *off, off + len);
                }
            }
        }
        ops
    }

    /// Replays a change read back from the log (after the checkpoint it follows): staged
    /// writes, lengths and deletions go into the overlay; direct writes are in the store
    /// already, and are synced by the next commit. The objects stay staged until then
    /// (their store length may not be their length).
    pub fn replay(&mut self, op: &LoggedOp) -> Result<()> {
        let was = std::mem::replace(&mut self.read_only, true);
        let capturing = std::mem::replace(&mut self.capturing, false);
        let r = (|| {
            match op {
                LoggedOp::Write { name, off, data } => self.write_at(name, *off, data)?,
                LoggedOp::SetLen { name, len } => self.set_len(name, *len)?,
                LoggedOp::Delete { name } => self.delete(name)?,
                LoggedOp::Copy {
                    name,
                    src,
                    dst,
                    len,
                } => self.copy_within(name, *src, *dst, *len)?,
                LoggedOp::Direct { name, off, len } => {
                    let st = self.state(name)?;
                    if st.deleted {
                        return Err(Error::Invalid(format!("direct write to deleted {name}")));
                    }
                    let end = off + len;
                    st.len = Some(st.len.unwrap_or(0).max(end));
                    add_range(&mut st.logged, *off, end);
                    st.direct = true;
                    st.direct_end = st.direct_end.max(end);
                    // A direct write never followed a cut in the transaction that logged it
                    // (a cut stages every later write): the length set before it cut nothing
                    // then, but here the store already holds this write's bytes, which are
                    // current. Nothing past the cut is read but blocks written since (the
                    // others are holes), so the cut goes.
                    if st.cut.is_some_and(|c| c < end) {
                        st.cut = None;
                    }
                    // A twin write among them may lie below what the store held.
                    add_recent(self.recent.entry(name.clone()).or_default(), *off, end);
                }
            }
            if let Some(st) = self.objs.get_mut(op.name()) {
                st.pinned = true;
            }
            Ok(())
        })();
        self.read_only = was;
        self.capturing = capturing;
        r
    }

    /// Objects this transaction brought into being with direct writes: they did not exist
    /// (in the store, nor in a commit in flight) when it first touched them. Nothing sealed
    /// before it refers to them, so when its changes are discarded they are orphans.
    pub fn created(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .objs
            .iter()
            .filter(|(_, s)| s.direct && s.committed_len.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }

    /// True when anything is staged or was written directly.
    pub fn is_dirty(&self) -> bool {
        self.objs.values().any(|s| s.staged() || s.direct)
    }

    /// Takes everything staged and written directly out of the transaction as a [`Commit`]
    /// whose journal (when anything was staged) goes to the slot other than `current`. No
    /// I/O. The transaction goes on, empty, on top of the commit until [`Tx::end_commit`].
    /// Only one commit may be in flight: call `end_commit` before the next one.
    pub fn begin_commit(&mut self, epoch: u64, current: Option<u8>) -> Result<Commit> {
        if self.read_only {
            return Err(Error::Invalid("commit of a read-only transaction".into()));
        }
        if self.base.is_some() {
            return Err(Error::Invalid("a commit is already in flight".into()));
        }
        let mut direct: Vec<String> = self
            .objs
            .iter()
            .filter(|(_, s)| s.direct)
            .map(|(n, _)| n.clone())
            .collect();
        direct.sort();
        let created = self.created();
        let mut staged: Vec<String> = self
            .objs
            .iter()
            .filter(|(_, s)| s.staged() && !s.only_appended())
            .map(|(n, _)| n.clone())
            .collect();
        staged.sort();
        let mut frozen = Frozen::default();
        for name in &staged {
            // Moved, not copied: the journal is encoded from the frozen image later,
            // without the engine's lock.
            let st = self.objs.remove(name).expect("listed");
            let open_end = st.open_end(name);
            frozen.objs.insert(
                name.clone(),
                FrozenObj {
                    open_end,
                    len: if st.deleted { None } else { st.len },
                    // An object the store did not hold (one always staged, such as a new
                    // file's tree) has no store bytes in its image, even before the commit
                    // creates it.
                    cut: if st.committed_len.is_some() || st.direct {
                        st.cut
                    } else {
                        Some(0)
                    },
                    ranges: st.ranges,
                },
            );
        }
        // What remains was only read, or only appended to (the store holds its bytes and
        // its length: [`ObjState::only_appended`]): forget it, and read its length from the
        // store again at its next use.
        self.objs.clear();
        self.overlay_bytes = 0;
        self.direct_bytes = 0;
        self.recent_base = std::mem::take(&mut self.recent);
        let frozen = Arc::new(frozen);
        self.base = Some(frozen.clone());
        Ok(Commit {
            direct,
            created,
            staged,
            epoch,
            slot: match current {
                Some(0) => 1,
                _ => 0,
            },
            journal: std::sync::OnceLock::new(),
            frozen,
        })
    }

    /// The commit `c` is applied in place: the transaction stops reading through it.
    pub fn end_commit(&mut self, c: &Commit) {
        if self
            .base
            .as_ref()
            .is_some_and(|b| Arc::ptr_eq(b, &c.frozen))
        {
            self.base = None;
            self.recent_base.clear();
        }
        for st in self.objs.values_mut() {
            st.on_base = false;
        }
    }

    /// Step 1 of a commit in one call: [`Tx::begin_commit`], then
    /// [`Commit::write_journal`].
    pub fn prepare(&mut self, key: &SubKey, epoch: u64, current: Option<u8>) -> Result<Commit> {
        let c = self.begin_commit(epoch, current)?;
        c.write_journal(self.store.as_ref(), key)?;
        Ok(c)
    }

    /// Step 3 of a commit in one call (after the anchor is sealed): [`Commit::apply`],
    /// then [`Tx::end_commit`].
    pub fn apply(&mut self, c: Commit) -> Result<()> {
        c.apply(self.store.as_ref())?;
        self.end_commit(&c);
        Ok(())
    }

    /// Forgets all staged state (after a failed commit the engine reopens instead).
    pub fn abandon(&mut self) {
        self.objs.clear();
        self.overlay_bytes = 0;
        self.base = None;
        self.captured.clear();
        self.recent.clear();
        self.recent_base.clear();
    }

    /// Loads a verified journal that was sealed but may not have been applied into the
    /// overlay of a writable transaction, without writing the store: its changes become
    /// part of the next commit (which journals them again, in the other slot, and applies
    /// them). For going back to a seal whose application failed without more store writes.
    pub fn stage_unapplied(&mut self, bytes: &[u8]) -> Result<()> {
        let was = std::mem::replace(&mut self.read_only, true);
        let r = self.stage_ops(bytes, true);
        self.read_only = was;
        r
    }

    /// Loads a verified journal into the overlay without touching the store (read-only
    /// opens of a volume whose last commit may not have been applied).
    pub fn stage_journal(&mut self, bytes: &[u8]) -> Result<()> {
        debug_assert!(
            self.read_only,
            "a writable open replays the journal instead"
        );
        self.stage_ops(bytes, false)
    }

    /// Stages every operation of a journal (the transaction must be read-only meanwhile,
    /// so that nothing is written directly); `pin`: its objects stay staged after.
    fn stage_ops(&mut self, bytes: &[u8], pin: bool) -> Result<()> {
        let (_, ops) = decode_journal(bytes)?;
        for op in ops {
            let name = match op {
                Op::Write { name, off, data } => {
                    self.write_at(name, off, data)?;
                    name
                }
                Op::SetLen { name, len } => {
                    self.set_len(name, len)?;
                    name
                }
                Op::Delete { name } => {
                    self.delete(name)?;
                    name
                }
            };
            if pin {
                self.objs.get_mut(name).expect("staged above").pinned = true;
            }
        }
        Ok(())
    }
}

/// Reads, verifies against the anchor's reference, and returns a journal's bytes.
pub fn load_journal(store: &dyn UntrustedStore, key: &SubKey, r: &JournalRef) -> Result<Vec<u8>> {
    let name = journal_name(r.slot);
    // Check the length first: the store's idea of it must not size an allocation.
    if store.len(&name)?.is_some_and(|len| len != r.len) {
        return Err(Error::tampered(
            Subject::Journal,
            None,
            format!("{name} has not the length sealed in the anchor"),
        ));
    }
    let bytes = store.read_all(&name)?.ok_or_else(|| {
        Error::tampered(
            Subject::Journal,
            None,
            format!("{name} named by the anchor is missing"),
        )
    })?;
    if bytes.len() as u64 != r.len || !crate::crypto::ct_eq(&key.mac(&[&bytes]), &r.digest) {
        return Err(Error::tampered(
            Subject::Journal,
            None,
            format!("{name} does not match the digest sealed in the anchor"),
        ));
    }
    decode_journal(&bytes)?;
    Ok(bytes)
}

/// Replays a verified journal into the store (idempotent) and syncs what it touched.
pub fn replay_journal(store: &dyn UntrustedStore, bytes: &[u8]) -> Result<()> {
    let (_, ops) = decode_journal(bytes)?;
    apply_ops(store, &ops)
}

fn apply_ops(store: &dyn UntrustedStore, ops: &[Op<'_>]) -> Result<()> {
    let mut touched: Vec<String> = Vec::new();
    for op in ops {
        let name = match *op {
            Op::Write { name, off, data } => {
                store.write_at(name, off, data)?;
                name
            }
            Op::SetLen { name, len } => {
                store.set_len(name, len)?;
                name
            }
            Op::Delete { name } => {
                store.delete(name)?;
                name
            }
        };
        if touched.last().map(String::as_str) != Some(name) {
            touched.push(name.to_string());
        }
    }
    touched.sort();
    touched.dedup();
    if !touched.is_empty() {
        store.sync(&touched)?;
    }
    Ok(())
}

/// Adds `[start, end)` to disjoint ranges `start -> end`, merging what it overlaps or
/// touches. Past [`LOGGED_RANGES`] ranges they become one (from the first start to the
/// last end): more writes are staged then, never fewer.
fn add_range(ranges: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    add_range_up_to(ranges, start, end, LOGGED_RANGES);
}

fn add_range_up_to(ranges: &mut BTreeMap<u64, u64>, start: u64, end: u64, most: usize) {
    if start >= end {
        return;
    }
    let (mut s, mut e) = (start, end);
    if let Some((&ps, &pe)) = ranges.range(..=start).next_back() {
        if pe >= start {
            s = ps;
            e = e.max(pe);
        }
    }
    let touched: Vec<u64> = ranges.range(s..=e).map(|(&k, _)| k).collect();
    for k in touched {
        e = e.max(ranges.remove(&k).expect("listed"));
    }
    ranges.insert(s, e);
    if ranges.len() > most {
        let first = *ranges.keys().next().expect("many");
        let last = *ranges.values().max().expect("many");
        ranges.clear();
        ranges.insert(first, last);
    }
}

/// Most disjoint logged ranges kept per object ([`add_range`]).
const LOGGED_RANGES: usize = 256;

/// [`add_range`] for the ranges [`Tx::twin_free`] reads, which a random writer makes one
/// per block: they become one past [`RECENT_RANGES`] (about 4 MiB of them), and more
/// writes are staged until the next checkpoint.
fn add_recent(ranges: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    add_range_up_to(ranges, start, end, RECENT_RANGES);
}

/// Most disjoint ranges [`add_recent`] keeps per object.
const RECENT_RANGES: usize = 1 << 16;

/// Inserts `data` at `off` into a set of non-overlapping ranges, merging with neighbours it
/// touches. Returns the change in held bytes.
fn insert_range(ranges: &mut BTreeMap<u64, Vec<u8>>, off: u64, data: &[u8]) -> isize {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    let end = off + data.len() as u64;
    // Most writes reach no later range (a tree's nodes, scattered blocks): the range that
    // holds or touches `off` takes them where it lies, or they become a range of their
    // own, with no range taken out of the map and put back (two lookups, not four).
    let reaches_later = ranges
        .range((Excluded(off), Unbounded))
        .next()
        .is_some_and(|(&k, _)| k <= end);
    if !reaches_later {
        return match ranges.range_mut(..=off).next_back() {
            Some((&k, v)) if k + v.len() as u64 >= off => {
                let (rel, before) = ((off - k) as usize, v.len());
                if before >= rel + data.len() {
                    v[rel..rel + data.len()].copy_from_slice(data);
                } else {
                    v.truncate(rel);
                    v.extend_from_slice(data);
                }
                v.len() as isize - before as isize
            }
            _ => {
                ranges.insert(off, data.to_vec());
                data.len() as isize
            }
        };
    }
    // The range that holds or touches `off` grows in place, so that a run of adjacent
    // writes (a sequential overwrite, the nodes of a tree) costs what it writes, not a
    // copy of everything staged before it: amortized O(len), not O(range) per write.
    let (start, mut merged) = match ranges.range(..=off).next_back() {
        Some((&k, v)) if k + v.len() as u64 >= off => (k, ranges.remove(&k).expect("listed")),
        _ => (off, Vec::new()),
    };
    let mut removed = merged.len();
    let rel = (off - start) as usize;
    if merged.len() >= rel + data.len() {
        merged[rel..rel + data.len()].copy_from_slice(data);
    } else {
        merged.truncate(rel);
        merged.extend_from_slice(data);
    }
    // Later ranges that overlap or touch [off, end] are absorbed.
    let later: Vec<u64> = ranges
        .range((Excluded(off), Included(end)))
        .map(|(k, _)| *k)
        .collect();
    for k in later {
        let v = ranges.remove(&k).expect("listed");
        removed += v.len();
        let ve = k + v.len() as u64;
        if ve > end {
            merged.extend_from_slice(&v[(end - k) as usize..]);
        }
    }
    let added = merged.len();
    ranges.insert(start, merged);
    added as isize - removed as isize
}

/// Drops range bytes at or past `len`; returns the bytes removed.
fn truncate_ranges(ranges: &mut BTreeMap<u64, Vec<u8>>, len: u64) -> usize {
    let mut removed = 0;
    let tail: Vec<u64> = ranges.range(len..).map(|(k, _)| *k).collect();
    for k in tail {
        removed += ranges.remove(&k).map(|v| v.len()).unwrap_or(0);
    }
    if let Some((&k, v)) = ranges.range_mut(..len).next_back() {
        let keep = (len - k) as usize;
        if v.len() > keep {
            removed += v.len() - keep;
            v.truncate(keep);
        }
    }
    removed
}

fn encode_journal(epoch: u64, ops: &[Op<'_>]) -> Vec<u8> {
    let size: usize = ops
        .iter()
        .map(|op| match op {
            Op::Write { name, data, .. } => 1 + 2 + name.len() + 8 + 4 + data.len(),
            Op::SetLen { name, .. } => 1 + 2 + name.len() + 8,
            Op::Delete { name } => 1 + 2 + name.len(),
        })
        .sum();
    let mut out = Vec::with_capacity(20 + size);
    out.extend_from_slice(JOURNAL_MAGIC);
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        let (code, name) = match op {
            Op::Write { name, .. } => (1u8, name),
            Op::SetLen { name, .. } => (2, name),
            Op::Delete { name } => (3, name),
        };
        out.push(code);
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        match op {
            Op::Write { off, data, .. } => {
                out.extend_from_slice(&off.to_le_bytes());
                out.extend_from_slice(&(data.len() as u32).to_le_bytes());
                out.extend_from_slice(data);
            }
            Op::SetLen { len, .. } => out.extend_from_slice(&len.to_le_bytes()),
            Op::Delete { .. } => {}
        }
    }
    out
}

fn decode_journal(b: &[u8]) -> Result<(u64, Vec<Op<'_>>)> {
    let bad =
        |what: &str| Error::tampered(Subject::Journal, None, format!("malformed journal: {what}"));
    let mut r = Reader { b, pos: 0 };
    if r.take(8).ok_or_else(|| bad("short"))? != JOURNAL_MAGIC {
        return Err(bad("magic"));
    }
    let epoch = r.u64().ok_or_else(|| bad("epoch"))?;
    let n = r.u32().ok_or_else(|| bad("count"))?;
    let mut ops = Vec::with_capacity((n as usize).min(1 << 16));
    for _ in 0..n {
        let code = r.take(1).ok_or_else(|| bad("op"))?[0];
        let nl = r.u16().ok_or_else(|| bad("name"))? as usize;
        let name =
            std::str::from_utf8(r.take(nl).ok_or_else(|| bad("name"))?).map_err(|_| bad("name"))?;
        crate::store::check_name(name).map_err(|_| bad("name"))?;
        ops.push(match code {
            1 => {
                let off = r.u64().ok_or_else(|| bad("offset"))?;
                let len = r.u32().ok_or_else(|| bad("length"))? as usize;
                Op::Write {
                    name,
                    off,
                    data: r.take(len).ok_or_else(|| bad("data"))?,
                }
            }
            2 => Op::SetLen {
                name,
                len: r.u64().ok_or_else(|| bad("length"))?,
            },
            3 => Op::Delete { name },
            _ => return Err(bad("op code")),
        });
    }
    if r.pos != b.len() {
        return Err(bad("trailing bytes"));
    }
    Ok((epoch, ops))
}

/// A bounds-checked little-endian reader.
pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.b.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn key() -> SubKey {
        crate::crypto::MasterKey::from_bytes([9; 32]).derive(crate::crypto::label::JOURNAL, &[])
    }

    fn read(tx: &mut Tx, name: &str) -> Option<Vec<u8>> {
        let len = tx.len(name).unwrap()?;
        let mut b = vec![0u8; len as usize];
        tx.read_at(name, 0, &mut b).unwrap();
        Some(b)
    }

    /// `write_list` leaves what the same writes one by one leave (the bytes, the length,
    /// the overlay's count, the recorded operations and the commit), and what a model
    /// says: for a data object as for a metadata one (whose writes are all staged), over
    /// an object that exists and one that does not, with and without an empty write among
    /// them.
    #[test]
    fn write_list_is_write_at_of_each() {
        let list: [(u64, &[u8]); 6] = [
            (64, b"node-a"),
            (0, b"leaf"),
            (70, b"B"),
            (200, b""),
            (4, b"--"),
            (500, b"far"),
        ];
        let full: Vec<(u64, &[u8])> = list
            .iter()
            .copied()
            .filter(|(_, d)| !d.is_empty())
            .collect();
        for (name, list) in ["f.m", "f.d", "new.m"]
            .into_iter()
            .flat_map(|n| [(n, &list[..]), (n, &full[..])])
        {
            let run = |batched: bool| {
                let store = Arc::new(MemStore::new());
                store.write_at("f.m", 0, &[1u8; 100]).unwrap();
                store.write_at("f.d", 0, &[2u8; 100]).unwrap();
                let mut tx = Tx::new(store.clone());
                tx.capture(true);
                if batched {
                    tx.write_list(name, list).unwrap();
                } else {
                    for &(off, data) in list {
                        tx.write_at(name, off, data).unwrap();
                    }
                }
                let bytes = read(&mut tx, name);
                let (overlay, ops) = (tx.overlay_bytes(), tx.drain());
                let c = tx.begin_commit(1, None).unwrap();
                c.write_journal(store.as_ref(), &key()).unwrap();
                c.apply(store.as_ref()).unwrap();
                let mut stored = vec![0u8; store.len(name).unwrap().unwrap() as usize];
                store.read_at(name, 0, &mut stored).unwrap();
                (bytes, overlay, ops, stored)
            };
            let (one, all) = (run(false), run(true));
            assert_eq!(all, one, "{name}");
            // Against a model: the object's bytes with the writes laid on them, zeros in
            // the gaps, the same bytes in the store after the commit.
            let mut model = match name {
                "f.m" => vec![1u8; 100],
                "f.d" => vec![2u8; 100],
                _ => Vec::new(),
            };
            for &(off, data) in &full {
                let end = off as usize + data.len();
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(data);
            }
            assert_eq!(all.0.as_ref(), Some(&model), "{name}");
            assert_eq!(all.3, model, "{name}");
            if name.ends_with(".m") {
                // Every write of a metadata object is staged and recorded as written:
                // [0, 6), [64, 71) and [500, 503) are held.
                assert_eq!(all.1, 16, "{name}");
                let ops: Vec<LoggedOp> = full
                    .iter()
                    .map(|&(off, data)| LoggedOp::Write {
                        name: name.to_string(),
                        off,
                        data: data.to_vec(),
                    })
                    .collect();
                assert_eq!(all.2, ops, "{name}");
            }
        }
    }

    /// A transaction forgets the objects it only looked at once it knows many, and keeps
    /// every one it changed: reads and the commit see the same state as before.
    #[test]
    fn forgets_only_objects_it_did_not_change() {
        let store = Arc::new(MemStore::new());
        for i in 0..KNOW_OBJECTS + 10 {
            store.write_at(&format!("o{i}"), 0, b"abc").unwrap();
        }
        let mut tx = Tx::new(store.clone());
        tx.write_at("o0", 1, b"X").unwrap(); // staged overwrite
        tx.write_at("o1", 3, b"de").unwrap(); // direct append
        tx.delete("o2").unwrap();
        tx.set_len("o3", 1).unwrap();
        tx.write_at("new", 0, b"n").unwrap();
        assert_eq!(
            tx.forget_clean(),
            5,
            "nothing looked at yet beyond the changes"
        );
        for i in 4..KNOW_OBJECTS + 10 {
            assert_eq!(read(&mut tx, &format!("o{i}")).unwrap(), b"abc");
        }
        assert_eq!(
            tx.forget_clean(),
            5,
            "the lengths it only read are forgotten"
        );
        assert_eq!(read(&mut tx, "o0").unwrap(), b"aXc");
        assert_eq!(read(&mut tx, "o1").unwrap(), b"abcde");
        assert_eq!(read(&mut tx, "o2"), None);
        assert_eq!(read(&mut tx, "o3").unwrap(), b"a");
        assert_eq!(read(&mut tx, "o9").unwrap(), b"abc");
        // Below the threshold nothing is dropped (a pass costs a look at every object).
        assert_eq!(tx.forget_clean(), 6);
        let c = tx.begin_commit(1, None).unwrap();
        c.write_journal(store.as_ref(), &key()).unwrap();
        c.apply(store.as_ref()).unwrap();
        tx.end_commit(&c);
        assert_eq!(store.read_all("o0").unwrap().unwrap(), b"aXc");
        assert_eq!(store.read_all("o1").unwrap().unwrap(), b"abcde");
        assert_eq!(store.read_all("o2").unwrap(), None);
        assert_eq!(store.read_all("o3").unwrap().unwrap(), b"a");
        assert_eq!(store.read_all("new").unwrap().unwrap(), b"n");
    }

    /// A transaction going on while a commit is in flight (docs/design.md, "Commits in
    /// flight"): it reads the commit's final image before, during and after the commit's
    /// I/O; past the end of a data object the commit only overwrites and appends to (an
    /// open end: the commit sets no length) it writes directly, and reads its bytes there;
    /// past one the commit grows with a hole it stages (the commit's closing SetLen would
    /// cut a direct write); it writes new objects directly, and its own commit lands on top
    /// of the first.
    #[test]
    fn transaction_on_top_of_a_commit_in_flight() {
        let store = Arc::new(MemStore::new());
        store.write_at("a.d", 0, b"01234567").unwrap();
        store.write_at("b", 0, b"bbbb").unwrap();
        store.write_at("t", 0, b"0123456789").unwrap();
        store.write_at("g.d", 0, b"gg").unwrap();
        store.write_at("o.d", 0, b"oooo").unwrap();
        let mut tx = Tx::new(store.clone());
        tx.write_at("o.d", 1, b"O").unwrap(); // only an overwrite: an open end too
        tx.write_at("a.d", 2, b"XY").unwrap(); // staged overwrite
        tx.write_at("a.d", 8, b"zz").unwrap(); // direct append
        tx.delete("b").unwrap();
        tx.set_len("t", 3).unwrap(); // cut ...
        tx.write_at("t", 5, b"Q").unwrap(); // ... then extend past the cut
        tx.write_at("g.d", 0, b"G").unwrap(); // staged overwrite ...
        tx.set_len("g.d", 4).unwrap(); // ... and a hole at the end: a closed end
        let c = tx.begin_commit(1, None).unwrap();
        let set_lens: Vec<&str> = c
            .ops()
            .iter()
            .filter_map(|o| match o {
                Op::SetLen { name, .. } => Some(*name),
                _ => None,
            })
            .collect();
        assert_eq!(set_lens, ["g.d", "t", "t"], "no length set at an open end");
        let want_a = b"01XY4567zz".to_vec();
        let want_t = b"012\0\0Q".to_vec();
        let check = |tx: &mut Tx| {
            assert_eq!(read(tx, "a.d").unwrap(), want_a);
            assert_eq!(read(tx, "b"), None);
            assert_eq!(read(tx, "t").unwrap(), want_t);
        };
        check(&mut tx);
        // Writes on top: past the open end (direct), over the commit's range and past
        // the closed end (staged), and a new object.
        tx.write_at("a.d", 10, b"ww").unwrap();
        tx.write_at("a.d", 3, b"V").unwrap();
        tx.write_at("g.d", 4, b"HH").unwrap();
        tx.write_at("n.d", 0, b"new").unwrap();
        tx.write_at("o.d", 4, b"p").unwrap();
        assert_eq!(
            tx.direct_bytes(),
            6,
            "past the open ends and the new object"
        );
        assert_eq!(read(&mut tx, "o.d").unwrap(), b"oOoop");
        assert_eq!(read(&mut tx, "a.d").unwrap(), b"01XV4567zzww");
        assert_eq!(read(&mut tx, "g.d").unwrap(), b"Gg\0\0HH");
        assert_eq!(read(&mut tx, "n.d").unwrap(), b"new");
        c.write_journal(store.as_ref(), &key()).unwrap();
        assert!(
            c.journal().is_some(),
            "the commit's staged changes are journaled"
        );
        assert_eq!(store.read_all("a.d").unwrap().unwrap(), b"01234567zzww");
        assert_eq!(
            store.len("g.d").unwrap(),
            Some(2),
            "staged past a closed end"
        );
        assert_eq!(store.read_all("n.d").unwrap().unwrap(), b"new");
        assert_eq!(read(&mut tx, "t").unwrap(), want_t);
        c.apply(store.as_ref()).unwrap();
        // Applied, not yet ended: the store and the frozen view agree, and the direct
        // write past the open end is still there.
        assert_eq!(store.read_all("a.d").unwrap().unwrap(), b"01XY4567zzww");
        assert_eq!(store.read_all("g.d").unwrap().unwrap(), b"Gg\0\0");
        assert_eq!(store.read_all("t").unwrap().unwrap(), want_t);
        assert_eq!(store.len("b").unwrap(), None);
        assert_eq!(read(&mut tx, "a.d").unwrap(), b"01XV4567zzww");
        assert_eq!(read(&mut tx, "t").unwrap(), want_t);
        tx.end_commit(&c);
        assert_eq!(read(&mut tx, "a.d").unwrap(), b"01XV4567zzww");
        assert_eq!(read(&mut tx, "g.d").unwrap(), b"Gg\0\0HH");
        // A second commit while one is in flight is refused.
        let c2 = tx.begin_commit(2, c.journal().map(|j| j.slot)).unwrap();
        assert!(tx.begin_commit(3, None).is_err());
        assert_eq!(c2.journal(), None, "not written yet");
        c2.write_journal(store.as_ref(), &key()).unwrap();
        assert_eq!(c2.journal().unwrap().slot, 1, "the other slot");
        c2.apply(store.as_ref()).unwrap();
        tx.end_commit(&c2);
        assert_eq!(store.read_all("a.d").unwrap().unwrap(), b"01XV4567zzww");
        assert_eq!(store.read_all("g.d").unwrap().unwrap(), b"Gg\0\0HH");
        assert_eq!(store.read_all("n.d").unwrap().unwrap(), b"new");
        assert_eq!(store.read_all("o.d").unwrap().unwrap(), b"oOoop");
    }

    /// A view leaves an object the transaction has not looked at to its reader: making it
    /// asks the store nothing (the lock's holder pays no round trip), and the reader's
    /// first use asks the store, as the transaction would.
    #[test]
    fn a_view_asks_the_store_of_untouched_objects_at_their_first_use() {
        use crate::store::CountingStore;
        let store = Arc::new(CountingStore::new(MemStore::new()));
        store.write_at("u.d", 0, b"untouched").unwrap();
        store.write_at("s.d", 0, b"staged").unwrap();
        let mut tx = Tx::new(store.clone());
        tx.write_at("s.d", 0, b"S").unwrap();
        let asked = || store.stats().total().other;
        let before = asked();
        let mut v = tx.view(&["u.d", "s.d"], 1 << 20).unwrap().unwrap();
        assert_eq!(asked(), before, "no length asked");
        assert_eq!(read(&mut v, "u.d").unwrap(), b"untouched");
        assert_eq!(read(&mut v, "s.d").unwrap(), b"Staged");
        assert_eq!(asked(), before + 1, "one length, at the first read");
        // A read alone asks no length: the store's short read is the end, a missing
        // object is empty, and the bytes past them read as zeros.
        let mut v = tx.view(&["u.d", "s.d"], 1 << 20).unwrap().unwrap();
        let mut buf = [7u8; 12];
        assert_eq!(v.read_at("u.d", 2, &mut buf).unwrap(), 7);
        assert_eq!(&buf, b"touched\0\0\0\0\0");
        assert_eq!(v.read_at("gone.d", 0, &mut buf).unwrap(), 0);
        assert_eq!(buf, [0; 12]);
        assert_eq!(
            v.read_at("s.d", 0, &mut buf).unwrap(),
            6,
            "staged: the overlay's"
        );
        assert_eq!(&buf[..6], b"Staged");
        assert_eq!(asked(), before + 1, "no length asked by a read");
        assert!(
            !tx.objs.contains_key("u.d"),
            "the transaction learnt nothing"
        );
        // The transaction itself learns an object's length at its first read, and keeps it.
        tx.read_at("u.d", 0, &mut buf).unwrap();
        tx.read_at("u.d", 1, &mut buf).unwrap();
        assert_eq!(
            asked(),
            before + 2,
            "one length for the transaction's two reads"
        );
        assert!(tx.view(&["s.d"], 0).unwrap().is_none(), "past max_bytes");
    }

    /// A copy within an always-staged object is staged as `memmove`, logged as the copy
    /// (not its bytes), and replays to the same bytes over the same store; a data object
    /// and a source past the end are refused.
    #[test]
    fn a_copy_within_an_object_is_logged_as_a_copy_and_replays_to_the_same_bytes() {
        let store = Arc::new(MemStore::new());
        store.write_at("f.c", 0, b"0123456789").unwrap();
        store.write_at("f.d", 0, b"data").unwrap();
        let mut tx = Tx::new(store.clone());
        tx.capture(true);
        tx.write_at("f.c", 10, b"AB").unwrap();
        // Overlapping, forwards and backwards: the bytes before the copy are the ones moved.
        tx.copy_within("f.c", 2, 5, 7).unwrap();
        tx.copy_within("f.c", 6, 0, 4).unwrap();
        let want = b"345642345678".to_vec();
        assert_eq!(read(&mut tx, "f.c").unwrap(), want);
        assert_eq!(
            store.read_all("f.c").unwrap().unwrap(),
            b"0123456789",
            "staged"
        );
        let ops = tx.drain();
        assert!(
            matches!(&ops[1], LoggedOp::Copy { name, src: 2, dst: 5, len: 7 } if name == "f.c")
        );
        assert!(!ops
            .iter()
            .any(|o| matches!(o, LoggedOp::Write { data, .. } if data.len() > 2)));
        let mut again = Tx::new(store.clone());
        for op in &ops {
            again.replay(op).unwrap();
        }
        assert_eq!(read(&mut again, "f.c").unwrap(), want);
        assert!(tx.copy_within("f.d", 0, 1, 2).is_err(), "a data object");
        assert!(tx.copy_within("f.c", 10, 0, 3).is_err(), "past the end");
        assert!(!tx.has_captured(), "a refused copy logs nothing");
    }

    /// A crash after the first commit's journal (sealed) and before its application, with
    /// the second transaction's writes made: replaying the first journal gives its final
    /// image. Past an object the transaction only stages (not a data object), the later
    /// writes are not in the store; past a data object's open end they are, and replaying
    /// the journal (before its application, or again after it) keeps those bytes, which
    /// the log names.
    #[test]
    fn replay_of_a_commit_in_flight_keeps_what_it_must() {
        for (name, direct, stored) in [
            ("a", 0, &b"AB234567cd"[..]),
            ("a.d", 5, &b"AB234567cdlater"[..]),
        ] {
            let store = Arc::new(MemStore::new());
            store.write_at(name, 0, b"01234567").unwrap();
            let mut tx = Tx::new(store.clone());
            tx.write_at(name, 0, b"AB").unwrap();
            tx.write_at(name, 8, b"cd").unwrap();
            let c = tx.begin_commit(1, None).unwrap();
            tx.write_at(name, 10, b"later").unwrap();
            assert_eq!(tx.direct_bytes(), direct, "{name}");
            c.write_journal(store.as_ref(), &key()).unwrap();
            let r = c.journal().unwrap();
            // Crash here: the anchor names `r`; recovery replays it.
            let bytes = load_journal(store.as_ref(), &key(), &r).unwrap();
            replay_journal(store.as_ref(), &bytes).unwrap();
            assert_eq!(store.read_all(name).unwrap().unwrap(), stored, "{name}");
            c.apply(store.as_ref()).unwrap();
            replay_journal(store.as_ref(), &bytes).unwrap();
            assert_eq!(store.read_all(name).unwrap().unwrap(), stored, "{name}");
            tx.end_commit(&c);
            assert_eq!(read(&mut tx, name).unwrap(), b"AB234567cdlater", "{name}");
        }
    }

    /// A sealed journal whose application failed is staged again into a fresh transaction
    /// (going back after a failed commit). Its ranges may lie past the store's length (the
    /// appends a commit in flight staged); a later write there must be staged too, or it
    /// would land in the store under the journal's range and never be seen.
    #[test]
    fn writes_over_a_staged_unapplied_journal_are_seen() {
        let store = Arc::new(MemStore::new());
        store.write_at("o", 0, b"abcd").unwrap();
        let mut tx = Tx::new(store.clone());
        tx.write_at("o", 0, b"A").unwrap();
        let c1 = tx.begin_commit(1, None).unwrap();
        // While c1 is in flight, an append to its object is staged.
        tx.write_at("o", 4, b"EFGH").unwrap();
        c1.write_journal(store.as_ref(), &key()).unwrap();
        c1.apply(store.as_ref()).unwrap();
        tx.end_commit(&c1);
        let c2 = tx.begin_commit(2, Some(0)).unwrap();
        c2.write_journal(store.as_ref(), &key()).unwrap();
        // Sealed, not applied: the store still ends at 4.
        assert_eq!(store.read_all("o").unwrap().unwrap(), b"Abcd");
        let j = load_journal(store.as_ref(), &key(), &c2.journal().unwrap()).unwrap();
        let mut tx = Tx::new(store.clone());
        tx.stage_unapplied(&j).unwrap();
        let read = |tx: &mut Tx| {
            let mut buf = [0u8; 8];
            tx.read_at("o", 0, &mut buf).unwrap();
            buf
        };
        assert_eq!(&read(&mut tx), b"AbcdEFGH");
        tx.write_at("o", 5, b"z").unwrap();
        assert_eq!(&read(&mut tx), b"AbcdEzGH");
        assert_eq!(
            store.read_all("o").unwrap().unwrap(),
            b"Abcd",
            "nothing direct"
        );
        // The next commit applies both.
        let c3 = tx.begin_commit(3, Some(1)).unwrap();
        c3.write_journal(store.as_ref(), &key()).unwrap();
        c3.apply(store.as_ref()).unwrap();
        assert_eq!(store.read_all("o").unwrap().unwrap(), b"AbcdEzGH");
    }

    /// A read that starts past 0 and spans a cut sees the store's bytes only below it.
    #[test]
    fn reads_past_a_cut_from_an_offset_see_zeros() {
        let store = Arc::new(MemStore::new());
        store.write_at("o", 0, b"0123456789").unwrap();
        let mut tx = Tx::new(store.clone());
        tx.set_len("o", 4).unwrap();
        tx.set_len("o", 10).unwrap();
        let mut buf = [0xffu8; 8];
        assert_eq!(tx.read_at("o", 2, &mut buf).unwrap(), 8);
        assert_eq!(&buf, b"23\0\0\0\0\0\0");
    }

    #[test]
    fn ranges_merge_and_truncate() {
        let mut r = BTreeMap::new();
        assert_eq!(insert_range(&mut r, 10, b"abcd"), 4);
        assert_eq!(insert_range(&mut r, 12, b"XYZW"), 2);
        assert_eq!(r.len(), 1);
        assert_eq!(r[&10], b"abXYZW");
        insert_range(&mut r, 0, b"01");
        insert_range(&mut r, 2, b"23");
        assert_eq!(r[&0], b"0123");
        insert_range(&mut r, 4, b"456789");
        assert_eq!(r.len(), 1);
        assert_eq!(r[&0], b"0123456789abXYZW");
        assert_eq!(truncate_ranges(&mut r, 5), 11);
        assert_eq!(r[&0], b"01234");
    }

    proptest::proptest! {
        /// Ranges against a reference model (one optional byte per offset): the same
        /// bytes, no two ranges overlapping or touching, and the byte count returned
        /// adding up to what is held. Offsets are small so that writes collide often.
        #[test]
        fn ranges_match_a_byte_model(
            writes in proptest::collection::vec((0u64..64, 1usize..24, proptest::prelude::any::<u8>()), 1..40),
            cut in proptest::option::of(0u64..96),
        ) {
            let mut r = BTreeMap::new();
            let mut model = [None::<u8>; 96];
            let mut held: isize = 0;
            for (i, (off, len, fill)) in writes.iter().enumerate() {
                let data: Vec<u8> = (0..*len).map(|j| fill.wrapping_add((i + j) as u8)).collect();
                held += insert_range(&mut r, *off, &data);
                for (j, b) in data.iter().enumerate() {
                    model[*off as usize + j] = Some(*b);
                }
            }
            if let Some(cut) = cut {
                held -= truncate_ranges(&mut r, cut) as isize;
                for m in model.iter_mut().skip(cut as usize) {
                    *m = None;
                }
            }
            let mut got = [None::<u8>; 96];
            let mut prev_end = None;
            for (&k, v) in &r {
                proptest::prop_assert!(!v.is_empty());
                if let Some(e) = prev_end {
                    proptest::prop_assert!(k > e, "ranges overlap or touch at {}", k);
                }
                for (j, b) in v.iter().enumerate() {
                    got[k as usize + j] = Some(*b);
                }
                prev_end = Some(k + v.len() as u64);
            }
            proptest::prop_assert_eq!(got, model);
            proptest::prop_assert_eq!(held, r.values().map(|v| v.len() as isize).sum::<isize>());
        }
    }

    proptest::proptest! {
        /// Logged ranges against a model (one flag per offset): the same offsets covered,
        /// disjoint and not touching, and never fewer than the model once collapsed.
        #[test]
        fn logged_ranges_match_a_model(
            adds in proptest::collection::vec((0u64..200, 0u64..30), 1..60),
        ) {
            let mut r = BTreeMap::new();
            let mut model = [false; 230];
            for (start, len) in adds {
                add_range(&mut r, start, start + len);
                for m in &mut model[start as usize..(start + len) as usize] {
                    *m = true;
                }
            }
            let mut got = [false; 230];
            let mut prev_end = None;
            for (&k, &e) in &r {
                proptest::prop_assert!(k < e);
                if let Some(p) = prev_end {
                    proptest::prop_assert!(k > p, "ranges overlap or touch at {}", k);
                }
                for g in &mut got[k as usize..e as usize] {
                    *g = true;
                }
                prev_end = Some(e);
            }
            proptest::prop_assert_eq!(got, model);
        }
    }

    #[test]
    fn logged_ranges_collapse_into_one_past_the_limit() {
        let mut r = BTreeMap::new();
        for k in 0..=LOGGED_RANGES as u64 {
            add_range(&mut r, 10 * k + 5, 10 * k + 8);
        }
        let last = 10 * LOGGED_RANGES as u64 + 8;
        assert_eq!(r.into_iter().collect::<Vec<_>>(), [(5, last)]);
    }

    /// Twin blocks: bytes of a slot are offered for a direct write ([`Tx::twin_free`])
    /// until either slot was written there by [`Tx::write_twin`] or touched since the
    /// durable checkpoint, which, while a commit is in flight, is the one before it; a
    /// cut, a staged range, a read-only or staging transaction and a commit in flight that
    /// changes the object refuse too. A twin write lands in the store below the committed
    /// length and is logged as a direct write.
    #[test]
    fn twin_slots_are_offered_once_per_checkpoint() {
        let store = Arc::new(MemStore::new());
        store.write_at("f.d", 0, &[1u8; 64]).unwrap();
        let mut tx = Tx::new(store.clone());
        tx.capture(true);
        assert!(tx.twin_free("f.t", "f.d", 16, 16).unwrap());
        tx.write_twin("f.t", 16, &[2u8; 16]).unwrap();
        assert_eq!(
            tx.drain(),
            [LoggedOp::Direct {
                name: "f.t".into(),
                off: 16,
                len: 16
            }]
        );
        assert_eq!(store.read_all("f.t").unwrap().unwrap()[16..], [2u8; 16]);
        assert_eq!(tx.overlay_bytes(), 0);
        // Back to `.d`, or again into `.t`, over any of those bytes: refused.
        for (to, other) in [("f.d", "f.t"), ("f.t", "f.d")] {
            assert!(!tx.twin_free(to, other, 24, 16).unwrap(), "{to}");
            assert!(!tx.twin_free(to, other, 0, 17).unwrap(), "{to}");
        }
        // Next to them: offered.
        assert!(tx.twin_free("f.t", "f.d", 0, 16).unwrap());
        assert!(tx.twin_free("f.t", "f.d", 32, 16).unwrap());
        // Touched.
        tx.touch("f.d", 32, 40);
        assert!(!tx.twin_free("f.t", "f.d", 32, 16).unwrap());
        // A staged range over the bytes of either slot, to its last byte.
        tx.write_at("f.d", 48, &[3u8; 4]).unwrap();
        assert!(!tx.twin_free("f.t", "f.d", 48, 8).unwrap());
        tx.write_at("f.d", 1, &[3u8; 4]).unwrap();
        assert!(!tx.twin_free("f.t", "f.d", 4, 1).unwrap());
        assert!(tx.twin_free("f.t", "f.d", 5, 1).unwrap());
        // The commit in flight: what its transaction wrote is still refused, and an
        // object whose length it sets (here cut) is refused whole.
        tx.set_len("f.d", 60).unwrap();
        let c = tx.begin_commit(1, None).unwrap();
        assert!(
            !tx.twin_free("f.d", "f.t", 16, 16).unwrap(),
            "still the durable state's"
        );
        assert!(
            !tx.twin_free("f.t", "f.d", 0, 8).unwrap(),
            "f.d is in the commit"
        );
        c.write_journal(store.as_ref(), &key()).unwrap();
        c.apply(store.as_ref()).unwrap();
        tx.end_commit(&c);
        // Applied: the new checkpoint holds the twin write, the other slot is free.
        assert!(tx.twin_free("f.d", "f.t", 16, 16).unwrap());
        assert!(tx.twin_free("f.t", "f.d", 0, 8).unwrap());
        // A cut of either object.
        tx.set_len("f.t", 20).unwrap();
        assert!(!tx.twin_free("f.d", "f.t", 0, 8).unwrap());
        let mut ro = Tx::read_only(store.clone());
        assert!(!ro.twin_free("f.t", "f.d", 0, 8).unwrap());
        let mut staging = Tx::new(store.clone());
        staging.stage_all(true);
        assert!(!staging.twin_free("f.t", "f.d", 0, 8).unwrap());
        assert!(Tx::new(store.clone()).write_twin("f.m", 0, b"x").is_err());
        // After a failed commit nothing is remembered: the reload replays the log.
        let mut again = Tx::new(store.clone());
        again.write_twin("f.t", 0, &[4u8; 8]).unwrap();
        again.abandon();
        assert!(again.twin_free("f.d", "f.t", 0, 8).unwrap());
        // A replayed direct write counts as written.
        let mut fresh = Tx::new(store.clone());
        fresh
            .replay(&LoggedOp::Direct {
                name: "f.t".into(),
                off: 40,
                len: 8,
            })
            .unwrap();
        assert!(fresh.recent.get("f.t").is_some_and(|r| r.contains_key(&40)));
    }

    /// [`add_recent`] keeps a random writer's ranges one by one (far more than
    /// [`LOGGED_RANGES`]) and joins them into one only past [`RECENT_RANGES`].
    #[test]
    fn recent_ranges_are_kept_one_per_block() {
        let mut r = BTreeMap::new();
        for k in 0..1000u64 {
            add_recent(&mut r, 8192 * k, 8192 * k + 4096);
        }
        assert_eq!(r.len(), 1000);
        let mut r = BTreeMap::new();
        for k in 0..=RECENT_RANGES as u64 {
            add_recent(&mut r, 3 * k, 3 * k + 1);
        }
        assert_eq!(
            r.into_iter().collect::<Vec<_>>(),
            [(0, 3 * RECENT_RANGES as u64 + 1)]
        );
    }

    /// The kernel writes a file back out of order: a write into a gap below logged
    /// direct writes goes to the store too, while a write over logged bytes, or under a
    /// staged range, is staged.
    #[test]
    fn writes_into_a_gap_between_logged_direct_writes_go_to_the_store() {
        let store = Arc::new(MemStore::new());
        let mut tx = Tx::new(store.clone());
        tx.capture(true);
        tx.write_at("o.d", 40, &[4u8; 10]).unwrap();
        tx.write_at("o.d", 0, &[1u8; 10]).unwrap();
        tx.drain();
        // [0, 10) and [40, 50) are logged; [20, 30) is a gap.
        tx.write_at("o.d", 20, &[2u8; 10]).unwrap();
        assert_eq!(
            tx.drain(),
            [LoggedOp::Direct {
                name: "o.d".into(),
                off: 20,
                len: 10
            }]
        );
        assert_eq!(store.read_all("o.d").unwrap().unwrap()[20..30], [2u8; 10]);
        // Over logged bytes: staged from the write's start to the end of those bytes, and
        // direct past them.
        tx.write_at("o.d", 25, &[3u8; 10]).unwrap();
        assert_eq!(
            tx.drain(),
            [
                LoggedOp::Write {
                    name: "o.d".into(),
                    off: 25,
                    data: vec![3u8; 5]
                },
                LoggedOp::Direct {
                    name: "o.d".into(),
                    off: 30,
                    len: 5
                }
            ]
        );
        let raw = store.read_all("o.d").unwrap().unwrap();
        assert_eq!((raw[27], raw[32]), (2, 3));
        // A write ending inside a later logged range is staged whole.
        tx.write_at("o.d", 36, &[5u8; 6]).unwrap();
        assert!(matches!(&tx.drain()[..], [LoggedOp::Write { off: 36, .. }]));
        // Under a staged range that starts before the write's end: staged.
        tx.write_at("o.d", 60, &[6u8; 4]).unwrap();
        tx.drain();
        tx.write_at("o.d", 55, &[7u8; 10]).unwrap();
        tx.drain();
        let mut buf = [0u8; 70];
        tx.read_at("o.d", 0, &mut buf).unwrap();
        assert_eq!(&buf[20..25], &[2u8; 5]);
        assert_eq!(&buf[25..35], &[3u8; 10]);
        assert_eq!(&buf[36..42], &[5u8; 6]);
        assert_eq!(&buf[42..50], &[4u8; 8]);
        assert_eq!(&buf[55..65], &[7u8; 10]);
    }

    /// An object only appended to (directly) is not in the commit's journal: the store
    /// holds its bytes and length. The transaction over the commit in flight appends to it
    /// directly, and neither applying nor replaying the commit cuts those bytes. An object
    /// grown past its direct writes (a hole at its end) is journaled as before.
    #[test]
    fn appends_over_a_commit_in_flight_go_to_the_store() {
        let store = Arc::new(MemStore::new());
        store.write_at("a.d", 0, b"0123").unwrap();
        let mut tx = Tx::new(store.clone());
        tx.write_at("a.d", 4, b"4567").unwrap();
        tx.write_at("h.d", 0, b"ab").unwrap();
        tx.set_len("h.d", 6).unwrap();
        tx.write_at("a.d", 0, b"0").unwrap();
        assert_eq!(tx.direct_bytes(), 6, "what the next commit syncs");
        let c = tx.begin_commit(1, None).unwrap();
        assert_eq!(tx.direct_bytes(), 0);
        assert_eq!(c.staged, ["a.d", "h.d"], "an overwrite is journaled");
        assert_eq!(c.direct, ["a.d", "h.d"]);
        tx.write_at("a.d", 8, b"89").unwrap();
        assert_eq!(
            tx.direct_bytes(),
            2,
            "past the open end of the commit's object"
        );
        tx.write_at("h.d", 6, b"x").unwrap();
        assert_eq!(tx.direct_bytes(), 2, "staged past a closed end");
        c.write_journal(store.as_ref(), &key()).unwrap();
        c.apply(store.as_ref()).unwrap();
        tx.end_commit(&c);
        let c = tx.begin_commit(2, Some(0)).unwrap();
        assert_eq!(c.staged, ["h.d"], "a.d was only appended to");
        c.write_journal(store.as_ref(), &key()).unwrap();
        c.apply(store.as_ref()).unwrap();
        tx.end_commit(&c);
        // Only appended now: the commit journals nothing, and appends go on directly.
        tx.write_at("a.d", 10, b"ab").unwrap();
        let c = tx.begin_commit(3, Some(1)).unwrap();
        assert!(c.staged.is_empty());
        assert_eq!(c.direct, ["a.d"]);
        tx.write_at("a.d", 12, b"cd").unwrap();
        assert_eq!(tx.direct_bytes(), 2);
        assert_eq!(store.read_all("a.d").unwrap().unwrap(), b"0123456789abcd");
        assert_eq!(c.write_journal(store.as_ref(), &key()).unwrap(), None);
        c.apply(store.as_ref()).unwrap();
        tx.end_commit(&c);
        assert_eq!(store.read_all("a.d").unwrap().unwrap(), b"0123456789abcd");
        assert_eq!(store.read_all("h.d").unwrap().unwrap(), b"ab\0\0\0\0x");
        assert_eq!(tx.len("a.d").unwrap(), Some(14));
    }

    #[test]
    fn direct_writes_past_committed_length_staged_below() {
        let store = Arc::new(MemStore::new());
        store.write_at("o.d", 0, &[1u8; 100]).unwrap();
        let mut tx = Tx::new(store.clone());
        tx.write_at("o.d", 90, &[2u8; 20]).unwrap();
        // The part past 100 went straight to the store; the overwrite is staged.
        let raw = store.read_all("o.d").unwrap().unwrap();
        assert_eq!(raw.len(), 110);
        assert_eq!(raw[95], 1);
        assert_eq!(raw[105], 2);
        let mut buf = [0u8; 30];
        assert_eq!(tx.read_at("o.d", 85, &mut buf).unwrap(), 25);
        assert_eq!(&buf[..5], &[1; 5]);
        assert_eq!(&buf[5..25], &[2; 20]);
        assert_eq!(&buf[25..], &[0; 5]);
        let p = tx.prepare(&key(), 1, None).unwrap();
        assert!(p.journal().is_some());
        assert_eq!(
            store.read_all("o.d").unwrap().unwrap()[95],
            1,
            "staged until applied"
        );
        tx.apply(p).unwrap();
        assert_eq!(
            &store.read_all("o.d").unwrap().unwrap()[90..110],
            &[2u8; 20]
        );
    }

    #[test]
    fn truncate_then_extend_reads_zeros() {
        let store = Arc::new(MemStore::new());
        store.write_at("o", 0, &[7u8; 64]).unwrap();
        let mut tx = Tx::new(store.clone());
        tx.set_len("o", 10).unwrap();
        tx.write_at("o", 40, b"zz").unwrap();
        let mut buf = [9u8; 64];
        assert_eq!(tx.read_at("o", 0, &mut buf).unwrap(), 42);
        assert_eq!(&buf[..10], &[7; 10]);
        assert!(buf[10..40].iter().all(|&b| b == 0));
        assert_eq!(&buf[40..42], b"zz");
        let p = tx.prepare(&key(), 1, None).unwrap();
        tx.apply(p).unwrap();
        let raw = store.read_all("o").unwrap().unwrap();
        assert_eq!(raw.len(), 42);
        assert!(raw[10..40].iter().all(|&b| b == 0));
    }

    #[test]
    fn journal_round_trip_verify_and_replay_idempotent() {
        let store = Arc::new(MemStore::new());
        store.write_at("a", 0, &[1u8; 32]).unwrap();
        store.write_at("b", 0, &[1u8; 8]).unwrap();
        let mut tx = Tx::new(store.clone());
        tx.write_at("a", 4, b"four").unwrap();
        tx.delete("b").unwrap();
        let p = tx.prepare(&key(), 7, Some(0)).unwrap();
        let r = p.journal().unwrap();
        assert_eq!(r.slot, 1);
        let bytes = load_journal(store.as_ref(), &key(), &r).unwrap();
        replay_journal(store.as_ref(), &bytes).unwrap();
        replay_journal(store.as_ref(), &bytes).unwrap();
        assert_eq!(&store.read_all("a").unwrap().unwrap()[4..8], b"four");
        assert!(store.len("b").unwrap().is_none());
        // A modified journal is a tamper error.
        store.with_object("journal.1", |o| o[30] ^= 1);
        assert!(load_journal(store.as_ref(), &key(), &r)
            .unwrap_err()
            .is_tampered());
    }

    #[test]
    fn malformed_journals_never_panic() {
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let _ = decode_journal(&junk);
        }
        let mut ok = encode_journal(
            1,
            &[Op::Write {
                name: "x",
                off: 0,
                data: &[1; 4],
            }],
        );
        ok.truncate(ok.len() - 1);
        assert!(decode_journal(&ok).is_err());
    }

    #[test]
    fn only_data_objects_are_written_directly() {
        let store = Arc::new(MemStore::new());
        let mut tx = Tx::new(store.clone());
        tx.write_at("f.d", 0, b"data").unwrap();
        tx.write_at("f.m", 0, b"node").unwrap();
        tx.write_at("f.c", 0, b"ctrs").unwrap();
        assert_eq!(store.read_all("f.d").unwrap().unwrap(), b"data");
        assert_eq!(store.len("f.m").unwrap(), None, "tree nodes are staged");
        assert_eq!(store.len("f.c").unwrap(), None, "counters are staged");
        let mut buf = [0u8; 4];
        tx.read_at("f.m", 0, &mut buf).unwrap();
        assert_eq!(&buf, b"node");
    }

    #[test]
    fn captured_changes_drain_in_order_and_logged_bytes_are_not_overwritten() {
        let store = Arc::new(MemStore::new());
        store.write_at("f.d", 0, &[1u8; 10]).unwrap();
        let mut tx = Tx::new(store.clone());
        tx.capture(true);
        tx.write_at("f.d", 8, &[2u8; 4]).unwrap(); // 2 staged, 2 direct
        tx.write_at("f.m", 0, b"mm").unwrap();
        tx.set_len("f.c", 0).unwrap();
        tx.delete("g.d").unwrap();
        assert!(tx.has_captured());
        let ops = tx.drain();
        assert!(!tx.has_captured());
        assert_eq!(
            ops,
            vec![
                LoggedOp::Write {
                    name: "f.d".into(),
                    off: 8,
                    data: vec![2, 2]
                },
                LoggedOp::Direct {
                    name: "f.d".into(),
                    off: 10,
                    len: 2
                },
                LoggedOp::Write {
                    name: "f.m".into(),
                    off: 0,
                    data: b"mm".to_vec()
                },
                LoggedOp::SetLen {
                    name: "f.c".into(),
                    len: 0
                },
                LoggedOp::Delete { name: "g.d".into() },
            ]
        );
        // The direct bytes are logged: a write over them is staged, one past them direct.
        tx.write_at("f.d", 10, &[3u8; 3]).unwrap();
        let raw = store.read_all("f.d").unwrap().unwrap();
        assert_eq!(raw, [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3]);
        assert_eq!(
            tx.drain(),
            vec![
                LoggedOp::Write {
                    name: "f.d".into(),
                    off: 10,
                    data: vec![3, 3]
                },
                LoggedOp::Direct {
                    name: "f.d".into(),
                    off: 12,
                    len: 1
                },
            ]
        );
        let mut buf = [0u8; 13];
        tx.read_at("f.d", 0, &mut buf).unwrap();
        assert_eq!(buf, [1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3]);
        // Without capture, nothing is recorded.
        tx.capture(false);
        tx.write_at("f.d", 20, b"x").unwrap();
        assert!(tx.drain().is_empty());
    }

    #[test]
    fn replayed_changes_are_staged_and_direct_ones_synced_by_the_commit() {
        let store = Arc::new(MemStore::new());
        store.write_at("f.d", 0, &[1u8; 12]).unwrap(); // direct bytes 8..12 reached it
        let mut tx = Tx::new(store.clone());
        for op in [
            LoggedOp::Direct {
                name: "f.d".into(),
                off: 8,
                len: 4,
            },
            LoggedOp::Write {
                name: "f.d".into(),
                off: 0,
                data: vec![5, 5],
            },
            LoggedOp::Write {
                name: "f.m".into(),
                off: 0,
                data: b"mm".to_vec(),
            },
            LoggedOp::Delete { name: "g.d".into() },
        ] {
            tx.replay(&op).unwrap();
        }
        // Nothing written: the overlay holds it.
        assert_eq!(store.read_all("f.d").unwrap().unwrap(), [1u8; 12]);
        let mut buf = [0u8; 12];
        tx.read_at("f.d", 0, &mut buf).unwrap();
        assert_eq!(buf, [5, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        // Pinned: a later write past the store's end is staged until the commit.
        tx.write_at("f.d", 12, b"z").unwrap();
        assert_eq!(store.len("f.d").unwrap(), Some(12));
        let c = tx.prepare(&key(), 1, None).unwrap();
        tx.apply(c).unwrap();
        assert_eq!(
            store.read_all("f.d").unwrap().unwrap(),
            [5, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, b'z']
        );
        assert_eq!(store.read_all("f.m").unwrap().unwrap(), b"mm");
    }

    /// A range staged past an object's committed length while a commit was in flight stays
    /// authoritative after the commit ends: a later write over it is staged too, not
    /// written to the store under it (reads would see the stale range).
    #[test]
    fn no_direct_write_under_a_range_staged_during_a_commit() {
        let store = Arc::new(MemStore::new());
        store.write_at("x.d", 0, &[1u8; 10]).unwrap();
        let mut tx = Tx::new(store.clone());
        tx.write_at("x.d", 0, &[2u8; 2]).unwrap(); // staged: the commit changes x.d
        tx.set_len("x.d", 12).unwrap(); // and sets its length: a closed end
        let c = tx.begin_commit(1, None).unwrap();
        tx.write_at("x.d", 20, &[3u8; 10]).unwrap(); // on the commit: staged
        c.write_journal(store.as_ref(), &key()).unwrap();
        c.apply(store.as_ref()).unwrap();
        tx.end_commit(&c);
        tx.write_at("x.d", 25, &[4u8; 2]).unwrap();
        let mut buf = [0u8; 30];
        tx.read_at("x.d", 0, &mut buf).unwrap();
        let mut want = [0u8; 30];
        want[..2].fill(2);
        want[2..10].fill(1);
        want[20..30].fill(3);
        want[25..27].fill(4);
        assert_eq!(buf, want);
        assert_eq!(
            store.len("x.d").unwrap(),
            Some(12),
            "nothing written under the range"
        );
    }

    /// A truncation logged when the store's object was already that short, then a direct
    /// write: replayed over a store that holds the write, the truncation must not hide it.
    #[test]
    fn a_replayed_truncation_does_not_hide_a_later_direct_write() {
        let store = Arc::new(MemStore::new());
        store.write_at("f.d", 0, b"new!").unwrap(); // the direct write reached the store
        let mut tx = Tx::new(store.clone());
        for op in [
            LoggedOp::SetLen {
                name: "f.d".into(),
                len: 0,
            },
            LoggedOp::Direct {
                name: "f.d".into(),
                off: 0,
                len: 4,
            },
        ] {
            tx.replay(&op).unwrap();
        }
        let mut buf = [0u8; 4];
        assert_eq!(tx.read_at("f.d", 0, &mut buf).unwrap(), 4);
        assert_eq!(&buf, b"new!");
        // Without a direct write after it, the truncation hides what the store holds.
        let mut tx = Tx::new(store.clone());
        tx.replay(&LoggedOp::SetLen {
            name: "f.d".into(),
            len: 0,
        })
        .unwrap();
        tx.replay(&LoggedOp::SetLen {
            name: "f.d".into(),
            len: 4,
        })
        .unwrap();
        tx.read_at("f.d", 0, &mut buf).unwrap();
        assert_eq!(buf, [0; 4]);
    }

    /// Runs a begun commit to its end: journal written, applied in place, ended.
    fn land(tx: &mut Tx, store: &dyn UntrustedStore, c: &Commit) {
        c.write_journal(store, &key()).unwrap();
        c.apply(store).unwrap();
        tx.end_commit(c);
    }

    /// What counts as staged ([`ObjState::staged`]): an object only read is not; a cut
    /// that was extended back to the same length still is (its tail must become zeros),
    /// and so is a deletion and a growth by `set_len` alone. After the commit, nothing is
    /// left to commit.
    #[test]
    fn only_changed_objects_are_dirty_and_journaled() {
        let store = Arc::new(MemStore::new());
        for (name, data) in [
            ("a", &b"0123"[..]),
            ("b", b"bbbb"),
            ("c", b"cc"),
            ("t", b"tttt"),
        ] {
            store.write_at(name, 0, data).unwrap();
        }
        let mut tx = Tx::new(store.clone());
        assert_eq!(read(&mut tx, "a").unwrap(), b"0123");
        assert_eq!(tx.len("missing").unwrap(), None);
        assert!(!tx.is_dirty(), "reads made the transaction dirty");
        // Setting the length an object has changes nothing (ftruncate to the same size).
        tx.set_len("a", 4).unwrap();
        assert!(!tx.is_dirty(), "a set_len to the same length made it dirty");
        tx.delete("b").unwrap();
        tx.set_len("c", 6).unwrap();
        tx.set_len("t", 2).unwrap();
        tx.set_len("t", 4).unwrap();
        assert!(tx.is_dirty());
        let c = tx.begin_commit(1, None).unwrap();
        land(&mut tx, store.as_ref(), &c);
        assert_eq!(store.read_all("a").unwrap().unwrap(), b"0123");
        assert_eq!(store.len("b").unwrap(), None);
        assert_eq!(store.read_all("c").unwrap().unwrap(), b"cc\0\0\0\0");
        assert_eq!(store.read_all("t").unwrap().unwrap(), b"tt\0\0");
        assert!(!tx.is_dirty(), "something left after the commit");
    }

    /// A read-only transaction (a read-only open replaying a journal through its overlay)
    /// stages every write, even appends and new objects, which a writable one writes
    /// directly; the store is never touched, and it cannot commit.
    #[test]
    fn a_read_only_transaction_never_writes_the_store() {
        let store = Arc::new(MemStore::new());
        store.write_at("a.d", 0, b"0123").unwrap();
        let mut tx = Tx::read_only(store.clone());
        tx.write_at("a.d", 4, b"45").unwrap();
        tx.write_at("n.d", 0, b"new").unwrap();
        assert_eq!(read(&mut tx, "a.d").unwrap(), b"012345");
        assert_eq!(read(&mut tx, "n.d").unwrap(), b"new");
        assert_eq!(store.read_all("a.d").unwrap().unwrap(), b"0123");
        assert_eq!(store.len("n.d").unwrap(), None);
        assert!(tx.begin_commit(1, None).is_err());
    }

    /// The overlay's byte count, which drives the engine's dirty limits: staged bytes
    /// count once however they overlap, direct writes not at all, and a commit takes them.
    #[test]
    fn overlay_bytes_count_what_is_staged() {
        let store = Arc::new(MemStore::new());
        store.write_at("a.d", 0, &[0u8; 16]).unwrap();
        let mut tx = Tx::new(store.clone());
        assert_eq!(tx.overlay_bytes(), 0);
        tx.write_at("a.d", 0, &[1; 8]).unwrap();
        assert_eq!(tx.overlay_bytes(), 8);
        tx.write_at("a.d", 4, &[2; 8]).unwrap();
        assert_eq!(tx.overlay_bytes(), 12, "overlapping ranges count once");
        tx.write_at("a.d", 16, &[3; 4]).unwrap();
        assert_eq!(tx.overlay_bytes(), 12, "an append is written directly");
        let c = tx.begin_commit(1, None).unwrap();
        assert_eq!(tx.overlay_bytes(), 0, "the commit took them");
        tx.write_at("a.d", 0, &[4; 2]).unwrap();
        assert_eq!(tx.overlay_bytes(), 2);
        land(&mut tx, store.as_ref(), &c);
        assert_eq!(tx.overlay_bytes(), 2);
    }

    /// A store that returns at most 3 bytes per read (a network store may return less
    /// than asked): every read through the transaction is completed, from any offset,
    /// also through the frozen image of a commit in flight.
    #[test]
    fn short_reads_of_the_store_are_completed() {
        struct ShortReads(MemStore);
        impl UntrustedStore for ShortReads {
            fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
                if name == "eio.d" {
                    return Err(Error::io(name, std::io::Error::other("device error")));
                }
                let n = buf.len().min(3);
                self.0.read_at(name, off, &mut buf[..n])
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
        let mem = MemStore::new();
        mem.write_at("a.d", 0, b"0123456789abcdef").unwrap();
        let store = Arc::new(ShortReads(mem));
        let mut tx = Tx::new(store.clone());
        assert_eq!(read(&mut tx, "a.d").unwrap(), b"0123456789abcdef");
        let mut b = [0u8; 7];
        assert_eq!(tx.read_at("a.d", 6, &mut b).unwrap(), 7);
        assert_eq!(&b, b"6789abc");
        tx.write_at("a.d", 2, b"XY").unwrap();
        let c = tx.begin_commit(1, None).unwrap();
        let mut b = [0u8; 9];
        assert_eq!(tx.read_at("a.d", 5, &mut b).unwrap(), 9);
        assert_eq!(&b, b"56789abcd");
        let mut b = [0u8; 6];
        assert_eq!(tx.read_at("a.d", 1, &mut b).unwrap(), 6);
        assert_eq!(&b, b"1XY456");
        land(&mut tx, store.as_ref(), &c);
        assert_eq!(read(&mut tx, "a.d").unwrap(), b"01XY456789abcdef");
        // A view reads an object it was not given at once: short reads are completed up
        // to the end, and an I/O error other than a missing object is passed on.
        let mut v = Tx::new(store.clone()).view(&[], 0).unwrap().unwrap();
        let mut b = [9u8; 16];
        assert_eq!(v.read_at("a.d", 3, &mut b).unwrap(), 13);
        assert_eq!(&b, b"Y456789abcdef\0\0\0");
        assert!(v.read_at("eio.d", 0, &mut b).is_err());
    }

    /// The journal is written only once the commit's direct writes are durable: a power
    /// cut right after `write_journal` keeps them (an anchor naming the journal may be
    /// sealed next, and it covers them).
    #[test]
    fn direct_writes_are_durable_before_the_journal() {
        use crate::store::{CrashImage, FaultStore};
        let faulty = Arc::new(FaultStore::new_mem());
        faulty.write_at("a.d", 0, b"0123").unwrap();
        faulty.sync_all().unwrap();
        let store: Arc<dyn UntrustedStore> = faulty.clone();
        let mut tx = Tx::new(store.clone());
        tx.write_at("a.d", 4, b"4567").unwrap();
        tx.write_at("n.d", 0, b"new").unwrap();
        tx.write_at("a.d", 0, b"X").unwrap();
        let c = tx.begin_commit(1, None).unwrap();
        c.write_journal(store.as_ref(), &key()).unwrap();
        let image = faulty.crash_image(CrashImage::DurableOnly);
        assert_eq!(image.read_all("a.d").unwrap().unwrap(), b"01234567");
        assert_eq!(image.read_all("n.d").unwrap().unwrap(), b"new");
        assert!(c.journal().is_some());
    }

    /// The objects a commit creates in the store before its seal (orphans if it never
    /// seals): new ones written directly; not those the store held, nor a new object that
    /// is staged (the store gets it only once the journal is sealed).
    #[test]
    fn a_commit_names_the_objects_it_creates() {
        let store = Arc::new(MemStore::new());
        store.write_at("old.d", 0, b"old").unwrap();
        let mut tx = Tx::new(store.clone());
        tx.write_at("old.d", 3, b"more").unwrap();
        tx.write_at("new.d", 0, b"new").unwrap();
        tx.write_at("meta", 0, b"staged").unwrap();
        let c = tx.begin_commit(1, None).unwrap();
        let mut created = c.created().to_vec();
        created.sort();
        assert_eq!(created, ["new.d"]);
    }

    /// `deletes` (fsck's view of what a volume opened read-only still holds): an object
    /// deleted by the transaction, or by the commit in flight under it.
    #[test]
    fn deletes_sees_the_transaction_and_the_commit_in_flight() {
        let store = Arc::new(MemStore::new());
        for name in ["a", "b", "c"] {
            store.write_at(name, 0, b"x").unwrap();
        }
        let mut tx = Tx::new(store.clone());
        assert!(!tx.deletes("a"));
        tx.delete("a").unwrap();
        assert!(tx.deletes("a"));
        assert!(!tx.deletes("b") && !tx.deletes("missing"));
        let c = tx.begin_commit(1, None).unwrap();
        assert!(tx.deletes("a"), "deleted by the commit in flight");
        tx.delete("b").unwrap();
        assert!(tx.deletes("b"));
        assert!(!tx.deletes("c"));
        land(&mut tx, store.as_ref(), &c);
        assert!(
            !tx.deletes("a"),
            "gone from the store: nothing left to delete"
        );
    }

    /// A deletion of an object the transaction has not looked at asks the store nothing
    /// (no `stat` under the engine lock, issue 14), and the commit deletes it whether the
    /// store held it or not; the object reads as missing and takes no write after it.
    #[test]
    fn a_deletion_asks_the_store_nothing() {
        use crate::store::CountingStore;
        let store = Arc::new(CountingStore::new(MemStore::new()));
        store.write_at("held.d", 0, b"x").unwrap();
        let before = store.stats();
        let mut tx = Tx::new(store.clone());
        tx.capture(true);
        tx.delete("held.d").unwrap();
        tx.delete("missing.m").unwrap();
        assert_eq!(
            store.stats().since(&before).total().other,
            0,
            "no length asked"
        );
        assert_eq!(tx.len("held.d").unwrap(), None);
        assert_eq!(read(&mut tx, "held.d"), None);
        assert!(tx.write_at("held.d", 0, b"y").is_err());
        assert!(tx.deletes("held.d") && tx.deletes("missing.m"));
        assert_eq!(tx.drain().len(), 2, "both logged");
        let p = tx.prepare(&key(), 1, None).unwrap();
        tx.apply(p).unwrap();
        assert_eq!(store.len("held.d").unwrap(), None);
        assert_eq!(store.len("missing.m").unwrap(), None);
        // An object the transaction already knows keeps what it knew: one it created with
        // a direct write and then deleted is still among the commit's created objects (an
        // orphan to remove if the commit never seals).
        let mut tx = Tx::new(store.clone());
        tx.write_at("new.d", 0, b"direct").unwrap();
        tx.delete("new.d").unwrap();
        let c = tx.begin_commit(1, None).unwrap();
        assert_eq!(c.created(), ["new.d"]);
    }

    /// Capture is kept while on (turning it on again keeps what was recorded) and
    /// dropped when turned off.
    #[test]
    fn capture_off_drops_what_was_recorded() {
        let store = Arc::new(MemStore::new());
        let mut tx = Tx::new(store);
        tx.capture(true);
        tx.write_at("f.d", 0, b"x").unwrap();
        tx.capture(true);
        assert!(tx.has_captured());
        tx.capture(false);
        assert!(!tx.has_captured());
        assert!(tx.drain().is_empty());
    }

    /// A replayed direct write that ends exactly at a replayed cut leaves the cut in
    /// place: what the store holds past it (the tail the truncation removed) stays hidden
    /// when the object is extended again, and reads as zeros.
    #[test]
    fn a_direct_write_up_to_a_replayed_cut_keeps_the_cut() {
        let store = Arc::new(MemStore::new());
        store.write_at("f.d", 0, b"0123OLD!").unwrap();
        let mut tx = Tx::new(store.clone());
        let name = || "f.d".to_string();
        for op in [
            LoggedOp::SetLen {
                name: name(),
                len: 4,
            },
            LoggedOp::Direct {
                name: name(),
                off: 0,
                len: 4,
            },
            LoggedOp::SetLen {
                name: name(),
                len: 8,
            },
        ] {
            tx.replay(&op).unwrap();
        }
        assert_eq!(read(&mut tx, "f.d").unwrap(), b"0123\0\0\0\0");
    }
}
