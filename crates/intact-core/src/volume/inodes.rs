//! The inode table: records, the header, allocation and freeing, attributes, and the list
//! of files unlinked while open (docs/file-format.md §4).

#[allow(unused_imports)]
use super::*;

pub(super) const HEADER_MAGIC: &[u8; 8] = b"ITABHDR1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct TableHeader {
    pub(super) free_head: u64,
    pub(super) count: u64,
    /// First file unlinked while open (docs/file-format.md §4.2).
    pub(super) unlinked_head: u64,
}

/// Inode `ino`'s record from its bytes in the inode table (authenticated by the table's
/// tree before this is called): a record that does not parse is damage.
pub(super) fn decode_record(ino: u64, b: &[u8]) -> Result<Inode> {
    Inode::decode(b).ok_or_else(|| {
        Error::tampered(
            Subject::InodeTable,
            None,
            format!("inode {ino}: malformed record"),
        )
    })
}

/// The piece of the inode table ([`unitcache::TABLE_PIECE`]) that holds record `ino`,
/// and the record's offset in it (records never straddle pieces).
fn piece_of(ino: u64) -> (u64, usize) {
    let off = ino * RECORD_SIZE as u64;
    (
        off / unitcache::TABLE_PIECE as u64,
        (off % unitcache::TABLE_PIECE as u64) as usize,
    )
}

/// The blocks a record's file holds, as [`FileState::blocks`] gives them once it is open:
/// the counter intervals' under a scheme whose tree covers only some blocks, the tree's
/// leaves otherwise.
fn record_blocks(i: &Inode) -> u64 {
    if !i.scheme.partial_tree() {
        return i.tree.leaves;
    }
    match &i.counters {
        TrustedCounters::Inline(c) => c.blocks(),
        TrustedCounters::Spilled { blocks, .. } | TrustedCounters::Segmented { blocks, .. } => {
            *blocks
        }
    }
}

/// The blocks of a record's file that are stored (not holes), as [`stored_blocks`] counts
/// them for an open file with nothing dirty; `None` when that needs the counters' spilled
/// arrays.
fn record_stored_blocks(i: &Inode) -> Option<u64> {
    let blocks = record_blocks(i);
    if !i.scheme.uses_counter_intervals() {
        return Some(blocks);
    }
    match &i.counters {
        TrustedCounters::Inline(c) => Some(
            c.runs(0, blocks)
                .filter(|r| r.2 != 0)
                .map(|r| r.1)
                .sum::<u64>(),
        ),
        _ => None,
    }
}

/// What `intact stat` shows of record `i` of `ino`, its file holding `blocks` blocks.
fn stat_of(ino: u64, i: &Inode, blocks: u64, bs: u64) -> Stat {
    let (intervals, spilled) = match &i.counters {
        TrustedCounters::Inline(c) => (c.intervals() as u64, false),
        TrustedCounters::Spilled { intervals, .. }
        | TrustedCounters::Segmented { intervals, .. } => (*intervals as u64, true),
    };
    Stat {
        ino,
        kind: i.kind,
        size: i.size,
        mode: i.mode,
        mtime_ns: i.mtime_ns,
        ctime_ns: i.ctime_ns,
        scheme: i.scheme.name().to_string(),
        auto: i.auto,
        file_id: hex::encode(i.id),
        blocks: blocks.max(i.size.div_ceil(bs)),
        counter_intervals: intervals,
        counters_spilled: spilled,
        rdev: if i.kind.is_device() { i.link as u32 } else { 0 },
    }
}

/// The attributes of record `i` of `ino`, with link count `nlink` and `stored` blocks
/// stored ([`stored_blocks`]).
fn attr_of(ino: u64, i: &Inode, nlink: u32, stored: u64, bs: u64) -> Attr {
    Attr {
        ino,
        generation: u64::from_le_bytes(i.id[..8].try_into().expect("8")),
        kind: i.kind,
        size: i.size,
        mode: i.mode,
        uid: i.uid,
        gid: i.gid,
        nlink,
        atime_ns: i.atime_ns,
        mtime_ns: i.mtime_ns,
        ctime_ns: i.ctime_ns,
        // An inline file's bytes are all stored (none is a hole): tools that take a
        // file with fewer blocks than its size for a sparse one then read it whole.
        stored_bytes: match &i.inline_data {
            Some(_) => i.size,
            None => stored.min(i.size.div_ceil(bs)) * bs,
        },
        rdev: if i.kind.is_device() { i.link as u32 } else { 0 },
    }
}

impl Inner {
    pub(super) fn empty_tree(&self, s: SchemeId, id: &FileId) -> crate::tree::TreeState {
        let env = env!(self);
        scheme(s).empty(&env, id)
    }
    /// Tells the store that the objects of the fresh file id `id` do not exist
    /// ([`crate::store::UntrustedStore::absent`]): on S3, a new file's first write then
    /// sends no listing.
    pub(super) fn objects_absent(&self, id: &FileId) {
        let n = ObjectNames::of(id);
        for o in n.all() {
            self.store.absent(o);
        }
    }

    /// Finishes a new volume: the inode-table header and the root directory, sealed.
    pub(super) fn init_fresh(&mut self) -> Result<()> {
        self.header = TableHeader {
            free_head: 0,
            count: ROOT_INO + 1,
            unlinked_head: 0,
        };
        self.header_dirty = true;
        let id = crypto::random_file_id();
        let mut root = Inode::new(
            Kind::Dir,
            SchemeId::MtEintGcm,
            id,
            self.empty_tree(SchemeId::MtEintGcm, &id),
            now_ns(),
        );
        root.nlink = 2;
        root.link = ROOT_INO;
        let mut of = OpenFile::load(root, &self.keys, &mut self.tx, Subject::Path("/".into()))?;
        if !self.dir_tree {
            of.dir = Some(BTreeMap::new());
        }
        of.record_dirty = true;
        self.files.insert(ROOT_INO, of);
        self.commit()
    }
    /// Record `ino`, from the inode table's piece that holds it: pieces of
    /// [`unitcache::TABLE_PIECE`] bytes (16 records) read once stay in the metadata cache
    /// ([`unitcache`]), so the records of files created together, which a listing's
    /// lookups meet one after the other, cost one read and check between them.
    pub(super) fn read_record(&mut self, ino: u64) -> Result<Inode> {
        let b = self.read_raw_record(ino)?;
        decode_record(ino, &b)
    }
    /// Record `ino`'s bytes ([`Inner::read_record`] without the decoding).
    pub(super) fn read_raw_record(&mut self, ino: u64) -> Result<[u8; RECORD_SIZE]> {
        let (piece, at) = piece_of(ino);
        let Ok(k) = u32::try_from(piece) else {
            return Err(past_table_end(ino));
        };
        let id = self.itable.inode.id;
        // A kept piece shorter than the record (the table grew past it since) is read
        // again.
        let b = match self.units.get(&id, k) {
            Some(b) if b.len() >= at + RECORD_SIZE => b,
            _ => {
                let env = env!(self);
                let b = file_read_shared(
                    &env,
                    &mut self.tx,
                    &mut self.itable,
                    piece * unitcache::TABLE_PIECE as u64,
                    unitcache::TABLE_PIECE,
                )?;
                self.units.put(&id, k, b.clone());
                b
            }
        };
        match b.get(at..at + RECORD_SIZE) {
            Some(rec) => Ok(rec.try_into().expect("a record's bytes")),
            None => Err(past_table_end(ino)),
        }
    }
    pub(super) fn write_record(&mut self, ino: u64, inode: &Inode) -> Result<()> {
        self.write_raw_record(ino, &inode.encode())
    }
    /// Writes record `ino`'s bytes. A cached piece of the table that holds the record is
    /// kept with the new bytes in place (what a read of the piece returns now); records
    /// never straddle pieces.
    pub(super) fn write_raw_record(&mut self, ino: u64, b: &[u8; RECORD_SIZE]) -> Result<()> {
        let off = ino * RECORD_SIZE as u64;
        let (piece, at) = piece_of(ino);
        let piece = u32::try_from(piece).ok();
        let id = self.itable.inode.id;
        let kept = match piece.map(|k| (k, self.units.take(&id, k))) {
            // A piece wholly past the table's end: it reads as zeros up to this record.
            Some((_, None)) if off - at as u64 >= self.itable.inode.size => {
                Some(Arc::from(&[][..]))
            }
            p => p.and_then(|(_, b)| b),
        };
        let env = env!(self);
        if let (Some(k), Some(old)) = (piece, &kept) {
            if env.bs == unitcache::TABLE_PIECE && old.len() == env.bs {
                // The record's whole block is in the cache, checked, as a read returns it
                // now: written whole, it is not read again from the store and checked
                // (a partial write loads its block first). An unlink among 10^6 names
                // read and checked its record's block twice.
                let mut new = old.to_vec();
                new[at..at + RECORD_SIZE].copy_from_slice(b);
                let start = u64::from(k) * unitcache::TABLE_PIECE as u64;
                file_write(&env, &mut self.tx, &mut self.itable, start, &new)?;
                self.units.put(&id, k, new.into());
                return Ok(());
            }
        }
        file_write(&env, &mut self.tx, &mut self.itable, off, b)?;
        if let (Some(k), Some(old)) = (piece, kept) {
            let mut new = old.to_vec();
            if new.len() < at + RECORD_SIZE {
                // The record grew the table: the piece now reaches its end.
                new.resize(at + RECORD_SIZE, 0);
            }
            new[at..at + RECORD_SIZE].copy_from_slice(b);
            self.units.put(&id, k, new.into());
        }
        Ok(())
    }
    pub(super) fn read_header(&mut self) -> Result<TableHeader> {
        let mut b = [0u8; RECORD_SIZE];
        let env = env!(self);
        let n = file_read(&env, &mut self.tx, &mut self.itable, 0, &mut b)?;
        if n != RECORD_SIZE || &b[..8] != HEADER_MAGIC {
            return Err(Error::tampered(
                Subject::InodeTable,
                None,
                "bad inode-table header",
            ));
        }
        let free_head = u64::from_le_bytes(b[8..16].try_into().expect("8"));
        let count = u64::from_le_bytes(b[16..24].try_into().expect("8"));
        let unlinked_head = u64::from_le_bytes(b[24..32].try_into().expect("8"));
        let records = self.itable.inode.size / RECORD_SIZE as u64;
        if count > records
            || free_head >= count.max(1)
            || count <= ROOT_INO
            || unlinked_head >= count
        {
            return Err(Error::tampered(
                Subject::InodeTable,
                None,
                "inconsistent inode-table header",
            ));
        }
        Ok(TableHeader {
            free_head,
            count,
            unlinked_head,
        })
    }
    pub(super) fn write_header(&mut self) -> Result<()> {
        let mut b = [0u8; RECORD_SIZE];
        b[..8].copy_from_slice(HEADER_MAGIC);
        b[8..16].copy_from_slice(&self.header.free_head.to_le_bytes());
        b[16..24].copy_from_slice(&self.header.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.header.unlinked_head.to_le_bytes());
        // The header is record 0.
        self.write_raw_record(0, &b)
    }
    pub(super) fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::fs("", FsErrorKind::ReadOnly));
        }
        Ok(())
    }
    pub(super) fn ensure_open(&mut self, ino: u64) -> Result<()> {
        self.ensure_open_with(ino, Self::read_record)
    }

    /// [`Inner::ensure_open`], reading the record with `read` (fsck's walk reads the inode
    /// table a block at a time).
    pub(super) fn ensure_open_with(
        &mut self,
        ino: u64,
        read: impl FnOnce(&mut Self, u64) -> Result<Inode>,
    ) -> Result<()> {
        if self.files.contains_key(&ino) {
            return Ok(());
        }
        let mut inode = self.checked_record(ino, read)?;
        self.load_inline(ino, &mut inode)?;
        let of = OpenFile::load(inode, &self.keys, &mut self.tx, Subject::Inode(ino))?;
        self.files.insert(ino, of);
        Ok(())
    }

    /// The record of `ino`, not resident, read with `read` and checked to be one an entry
    /// may name (in the table, not discarded, not free, not a slot of inline data).
    fn checked_record(
        &mut self,
        ino: u64,
        read: impl FnOnce(&mut Self, u64) -> Result<Inode>,
    ) -> Result<Inode> {
        if self.stale.contains(&ino) {
            return Err(self
                .discarded(ino)
                .unwrap_or_else(|| Error::fs("", FsErrorKind::NotFound)));
        }
        if ino == 0 || ino >= self.header.count {
            return Err(Error::tampered(
                Subject::Inode(ino),
                None,
                "directory entry points outside the inode table",
            ));
        }
        let inode = read(self, ino)?;
        if inode.kind == Kind::Free {
            return Err(Error::tampered(
                Subject::Inode(ino),
                None,
                "directory entry points to a free inode",
            ));
        }
        if inode.kind == Kind::Data {
            return Err(Error::tampered(
                Subject::Inode(ino),
                None,
                "directory entry points to a slot of inline data",
            ));
        }
        Ok(inode)
    }

    /// The record of `ino` as a stat or a lookup shows it: `None` when it is resident (in
    /// `files`), or else the record read from the table and checked as
    /// [`Inner::ensure_open`] checks it, with no open-file state built (issue 18: a `find`,
    /// an `ls -l` or a lookup among 10^6 names neither loads scheme state and keys nor
    /// leaves a record to evict). The record is authenticated by the table as on every
    /// read; what an open adds (the counters' spilled arrays read and checked against it,
    /// the inline data's bytes) no attribute needs.
    pub(super) fn peek_record(&mut self, ino: u64) -> Result<Option<Inode>> {
        if self.files.contains_key(&ino) {
            return Ok(None);
        }
        self.checked_record(ino, Self::read_record).map(Some)
    }
    /// At the end of a request, once `files` holds [`Inner::evict_at`] records, drops the
    /// idle ones (issue 18: memory bounded by the caches, not by the files a `find` or a
    /// backup touches; the seals' pruning comes only with changes to seal). Idle: a file
    /// (directories, and files unlinked while referenced, are kept as at a seal) with no
    /// change in memory, nothing logged past the last seal of the log (an fsync looks its
    /// record up), no change in a commit that has not ended, and no read in flight without
    /// the engine lock. A dropped record is read again, authenticated through the inode
    /// table, at its next use.
    pub(super) fn evict_idle(&mut self) {
        // What the transaction knows of objects it only looked at goes too.
        self.tx.forget_clean();
        // And the names kept for messages: a `find` through the mount looks up every name,
        // and a walk that changes nothing never checkpoints, which trimmed them before.
        if self.names.len() > KEEP_NAMES {
            self.trim_names();
        }
        if self.files.len() < self.evict_at {
            return;
        }
        let sealed_end = self.anchor.log.map(|l| l.sealed.end).unwrap_or_default();
        let ended = self.commits_ended;
        let mut dropped = Vec::new();
        self.files.retain(|_, f| {
            // A whole-list directory's entries are costly to decode again; a tree's are
            // read a path at a time.
            let idle = (f.inode.kind != Kind::Dir || f.dir.is_none())
                && f.inode.nlink != 0
                && !f.is_dirty()
                && f.unsynced_since.is_none()
                && f.logged_at <= sealed_end
                && f.sealed_by <= ended
                && !f.state.is_shared();
            if idle {
                dropped.push(f.inode.id);
            }
            !idle
        });
        self.metrics.forget_files(&dropped);
        self.evict_at = self.next_eviction();
    }
    /// When [`Inner::evict_idle`] looks again: once the records have doubled (each look
    /// costs one pass over them, so passes stay O(1) a request however many are not idle),
    /// and never below the budget. A budget under 64 looks at every request past it (tests
    /// run the engine so, to drop and reload records on every path).
    pub(super) fn next_eviction(&self) -> usize {
        if self.records < 64 {
            self.records
        } else {
            (2 * self.files.len()).max(self.records)
        }
    }
    pub(super) fn open_ino(&mut self, ino: u64) -> Result<&mut OpenFile> {
        self.ensure_open(ino)?;
        Ok(self.files.get_mut(&ino).expect("opened"))
    }
    pub(super) fn expect_kind(&mut self, ino: u64, path: &str, kind: Kind) -> Result<()> {
        let k = self.open_ino(ino)?.inode.kind;
        match (k, kind) {
            (a, b) if a == b => Ok(()),
            (Kind::Dir, _) => Err(Error::fs(path, FsErrorKind::IsADirectory)),
            _ => Err(Error::Invalid(format!("{path}: not a regular file"))),
        }
    }
    pub(super) fn stat_ino(&mut self, ino: u64) -> Result<Stat> {
        let (inode, blocks);
        let i = match self.peek_record(ino)? {
            Some(rec) => {
                blocks = record_blocks(&rec);
                inode = rec;
                &inode
            }
            None => {
                let of = self.files.get(&ino).expect("resident");
                blocks = of.state.blocks();
                &of.inode
            }
        };
        Ok(stat_of(ino, i, blocks, self.bs as u64))
    }
    pub(super) fn alloc_ino(&mut self) -> Result<u64> {
        let ino = if self.header.free_head != 0 && !self.stale.contains(&self.header.free_head) {
            let ino = self.header.free_head;
            let rec = self.read_record(ino)?;
            if rec.kind != Kind::Free {
                return Err(Error::tampered(
                    Subject::InodeTable,
                    None,
                    "free list points to a used inode",
                ));
            }
            self.header.free_head = rec.link;
            ino
        } else {
            let mut ino = self.header.count;
            // Numbers past the table's end that a front end may still hold (files a failed
            // commit discarded) are skipped; they stay free until the next open.
            self.header_dirty = true;
            while self.stale.contains(&ino) {
                self.write_record(ino, &Inode::free(self.header.free_head))?;
                self.note_record(ino);
                self.header.free_head = ino;
                ino += 1;
            }
            self.header.count = ino + 1;
            ino
        };
        self.header_dirty = true;
        Ok(ino)
    }
    /// Frees an inode (and its extended-attribute file): its objects are deleted at the seal.
    pub(super) fn free_ino(&mut self, ino: u64) -> Result<()> {
        self.ensure_open(ino)?;
        let of = self.files.remove(&ino).expect("opened");
        of.state.wait_readers();
        if let Some(d) = &of.inode.inline_data {
            self.free_slots(&d.slots)?;
        }
        for name in of.state.names.all() {
            self.tx.delete(name)?;
        }
        // Its nodes stay in the node cache until they age out: a file id is random and
        // never given again, so they are never looked up (removing them took a pass over
        // the whole cache, 10 % of a mount's CPU under a load of small files).
        self.names.remove(&ino);
        if of.inode.kind != Kind::Xattr {
            self.stale.insert(ino);
            self.unsealed.reborn(ino, self.commits_begun + 1, false);
        }
        let rec = Inode::free(self.header.free_head);
        self.write_record(ino, &rec)?;
        self.note_record(ino);
        self.header.free_head = ino;
        self.header_dirty = true;
        if of.inode.xattr != 0 && of.inode.kind != Kind::Xattr {
            self.free_ino(of.inode.xattr as u64)?;
        }
        Ok(())
    }
    /// Marks an inode's attributes changed (ctime) and its record dirty.
    pub(super) fn touch_record(&mut self, ino: u64) -> Result<&mut OpenFile> {
        self.note_record(ino);
        let of = self.open_ino(ino)?;
        of.inode.ctime_ns = now_ns();
        of.record_dirty = true;
        Ok(of)
    }
    /// Allocates and opens a new, empty inode that no directory names yet.
    pub(super) fn new_inode(
        &mut self,
        kind: Kind,
        s: SchemeId,
        mode: Option<u32>,
        uid: u32,
        gid: u32,
    ) -> Result<u64> {
        let ino = self.alloc_ino()?;
        if kind != Kind::Xattr {
            self.unsealed.reborn(ino, self.commits_begun + 1, true);
        }
        let id = crypto::random_file_id();
        self.objects_absent(&id);
        let mut inode = Inode::new(kind, s, id, self.empty_tree(s, &id), now_ns());
        if self.starts_inline(kind, s) {
            inode.inline_data = Some(InlineData::default());
        }
        if kind == Kind::Symlink {
            inode.mode = 0o777;
        }
        if let Some(m) = mode {
            inode.mode = m & 0o7777;
        }
        inode.uid = uid;
        inode.gid = gid;
        let mut of = OpenFile::load(inode, &self.keys, &mut self.tx, Subject::Inode(ino))?;
        if kind == Kind::Dir && !self.dir_tree {
            of.dir = Some(BTreeMap::new());
            of.dir_dirty = true;
        }
        of.record_dirty = true;
        self.files.insert(ino, of);
        self.note_record(ino);
        Ok(ino)
    }
    /// Removes one name of `ino` (already taken out of its directory): frees the inode when
    /// it was the last name and no handle is open; otherwise keeps it (docs/file-format.md
    /// §4.2, the unlinked list).
    pub(super) fn drop_link(&mut self, ino: u64) -> Result<()> {
        let open = self.track_references || self.handles.get(&ino).copied().unwrap_or(0) > 0;
        let unlinked_head = self.header.unlinked_head;
        let of = self.touch_record(ino)?;
        // A symlink or special file may have hard links too (link(2) does not follow).
        if of.inode.kind != Kind::Dir && of.inode.nlink > 1 {
            of.inode.nlink -= 1;
            return Ok(());
        }
        if of.inode.kind == Kind::File && open {
            of.inode.nlink = 0;
            of.inode.link = unlinked_head;
            self.header.unlinked_head = ino;
            self.header_dirty = true;
            self.names.remove(&ino);
            return Ok(());
        }
        self.free_ino(ino)
    }
    /// Takes `ino` off the unlinked list and frees it.
    pub(super) fn free_unlinked(&mut self, ino: u64) -> Result<()> {
        let next = self.open_ino(ino)?.inode.link;
        if self.header.unlinked_head == ino {
            self.header.unlinked_head = next;
            self.header_dirty = true;
        } else {
            let mut cur = self.header.unlinked_head;
            for _ in 0..=self.header.count {
                if cur == 0 {
                    break;
                }
                let of = self.open_ino(cur)?;
                if of.inode.link == ino {
                    of.inode.link = next;
                    of.record_dirty = true;
                    self.note_record(cur);
                    break;
                }
                cur = of.inode.link;
            }
        }
        self.free_ino(ino)
    }
    /// Frees every file left on the unlinked list (by a crash or an unclean unmount).
    pub(super) fn reap_unlinked(&mut self) -> Result<()> {
        let mut n = 0;
        while self.header.unlinked_head != 0 {
            let ino = self.header.unlinked_head;
            let count = self.header.count;
            let of = self.open_ino(ino)?;
            if of.inode.kind != Kind::File || of.inode.nlink != 0 || n > count {
                return Err(Error::tampered(
                    Subject::InodeTable,
                    None,
                    "malformed list of unlinked files",
                ));
            }
            self.header.unlinked_head = of.inode.link;
            self.header_dirty = true;
            self.free_ino(ino)?;
            n += 1;
        }
        if n > 0 {
            tracing::info!(
                files = n,
                "freed files unlinked while open before the last unmount"
            );
        }
        Ok(())
    }
    pub(super) fn attr(&mut self, ino: u64) -> Result<Attr> {
        let bs = self.bs as u64;
        // A record not resident answers from itself, unless it is a directory (its link
        // count is in its tree's header) or its counters are spilled (their arrays say
        // which blocks are holes): those are opened.
        if let Some(rec) = self.peek_record(ino)? {
            let stored = (rec.kind != Kind::Dir)
                .then(|| record_stored_blocks(&rec))
                .flatten();
            if let Some(stored) = stored {
                return Ok(attr_of(ino, &rec, rec.nlink, stored, bs));
            }
            // Opened from the record just read, not read again.
            self.ensure_open_with(ino, |_, _| Ok(rec))?;
        }
        let nlink = match self.open_ino(ino)?.inode.kind {
            // As on ext4: its entry in the parent, its `.`, and each subdirectory's `..`.
            Kind::Dir => 2u32.saturating_add(self.subdirs(ino)?),
            _ => self.open_ino(ino)?.inode.nlink,
        };
        let of = self.open_ino(ino)?;
        Ok(attr_of(ino, &of.inode, nlink, stored_blocks(of), bs))
    }
    pub(super) fn setattr(&mut self, ino: u64, set: &SetAttr) -> Result<()> {
        self.check_writable()?;
        if let Some(size) = set.size {
            match self.open_ino(ino)?.inode.kind {
                Kind::File => {}
                Kind::Dir => return Err(Error::fs("", FsErrorKind::IsADirectory)),
                // truncate(2) of a FIFO, socket, device or symlink: EINVAL, as on ext4.
                _ => return Err(Error::Invalid("not a regular file".into())),
            }
            self.truncate_ino(ino, size)?;
        }
        let of = self.touch_record(ino)?;
        if let Some(m) = set.mode {
            of.inode.mode = m & 0o7777;
        }
        if let Some(u) = set.uid {
            of.inode.uid = u;
        }
        if let Some(g) = set.gid {
            of.inode.gid = g;
        }
        if let Some(t) = set.atime_ns {
            of.inode.atime_ns = t;
        }
        if let Some(t) = set.mtime_ns {
            of.inode.mtime_ns = t;
        }
        if set.kill_suidgid && of.inode.kind != Kind::Dir {
            of.inode.mode = super::killed_suidgid(of.inode.mode);
        }
        Ok(())
    }

    /// [`Volume::kill_suidgid`].
    pub(super) fn kill_suidgid(&mut self, ino: u64) -> Result<bool> {
        let inode = &self.open_ino(ino)?.inode;
        let mode = super::killed_suidgid(inode.mode);
        if inode.kind == Kind::Dir || mode == inode.mode {
            return Ok(false);
        }
        self.check_writable()?;
        self.touch_record(ino)?.inode.mode = mode;
        Ok(true)
    }
    /// A best-effort path of `ino`, for error messages.
    pub(super) fn path_of(&self, ino: u64) -> String {
        self.known_path(ino)
            .unwrap_or_else(|| format!("<inode {ino}>"))
    }

    /// The path of `ino` from the names the engine last saw (lookups, creates, renames),
    /// or `None` when one on the way is unknown (an unlinked file, say).
    pub(super) fn known_path(&self, ino: u64) -> Option<String> {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO {
            if parts.len() >= 4096 {
                return None;
            }
            let (p, n) = self.names.get(&cur)?;
            parts.push(n.as_str());
            cur = *p;
        }
        parts.reverse();
        Some(format!("/{}", parts.join("/")))
    }

    /// Drops the names kept for error messages, but those on the way to an open file
    /// ([`Volume::path_of_ino`] must find them).
    pub(super) fn trim_names(&mut self) {
        let mut keep = HashMap::new();
        for &ino in self.handles.keys() {
            let mut cur = ino;
            while cur != ROOT_INO {
                let Some(e) = self.names.get(&cur) else { break };
                if keep.insert(cur, e.clone()).is_some() {
                    break;
                }
                cur = e.0;
            }
        }
        self.names = keep;
    }
}

/// A record the inode table does not hold: the table is shorter than an inode number
/// that something authentic names.
pub(super) fn past_table_end(ino: u64) -> Error {
    Error::tampered(
        Subject::InodeTable,
        None,
        format!("inode {ino} is past the end of the table"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemStore, MemTrusted};

    /// A memory store that records each name it is told is absent, and whether an object
    /// of that name existed then.
    struct Hints {
        inner: MemStore,
        said: Mutex<Vec<(String, bool)>>,
    }

    impl UntrustedStore for Hints {
        fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
            self.inner.read_at(name, off, buf)
        }
        fn write_at(&self, name: &str, off: u64, data: &[u8]) -> Result<()> {
            self.inner.write_at(name, off, data)
        }
        fn len(&self, name: &str) -> Result<Option<u64>> {
            self.inner.len(name)
        }
        fn set_len(&self, name: &str, len: u64) -> Result<()> {
            self.inner.set_len(name, len)
        }
        fn delete(&self, name: &str) -> Result<()> {
            self.inner.delete(name)
        }
        fn sync(&self, names: &[String]) -> Result<()> {
            self.inner.sync(names)
        }
        fn sync_all(&self) -> Result<()> {
            self.inner.sync_all()
        }
        fn list(&self) -> Result<Vec<String>> {
            self.inner.list()
        }
        fn absent(&self, name: &str) {
            let existed = self.inner.len(name).unwrap().is_some();
            self.said.lock().unwrap().push((name.to_string(), existed));
        }
    }

    /// A kept piece of the table shorter than a record it holds now (kept before the table
    /// grew past it) is read again, not taken as the table's end.
    #[test]
    fn a_kept_piece_shorter_than_its_record_is_read_again() {
        let vol = crate::volume::test_volume(Arc::new(MemStore::new()), &MemTrusted::new());
        for i in 0..20 {
            vol.create_file(&format!("/f{i}"), None).unwrap();
        }
        vol.sync().unwrap();
        let ino = vol.stat("/f19").unwrap().ino;
        let mut g = vol.shared.lock();
        let want = g.read_raw_record(ino).unwrap();
        let (k, at) = piece_of(ino);
        let k = k as u32;
        let id = g.itable.inode.id;
        let piece = g.units.take(&id, k).expect("kept by the read");
        g.units.put(&id, k, piece[..at].into());
        assert_eq!(g.read_raw_record(ino).unwrap(), want);
    }

    /// The objects of a new file, and of a file re-encrypted under a new id, are said
    /// absent to the store before they exist (S3 then lists nothing before their first
    /// write), and nothing that exists is.
    #[test]
    fn a_new_files_objects_are_said_absent_before_they_exist() {
        let hints = Arc::new(Hints {
            inner: MemStore::new(),
            said: Mutex::new(Vec::new()),
        });
        let trusted = MemTrusted::new();
        let vol = Volume::create(
            hints.clone(),
            move |_| Ok(Box::new(trusted) as Box<dyn TrustedStore>),
            b"pw",
            &CreateOptions {
                kdf: KdfParams::TEST,
                ..Default::default()
            },
            &Options::default(),
        )
        .unwrap();
        let said_of = |path: &str| {
            let id: FileId = hex::decode(vol.stat(path).unwrap().file_id)
                .unwrap()
                .try_into()
                .unwrap();
            let n = ObjectNames::of(&id);
            let said = hints.said.lock().unwrap().clone();
            for o in [&n.data, &n.meta, &n.ctrs] {
                assert!(said.contains(&(o.clone(), false)), "{o} not said absent");
            }
            n
        };
        vol.create_file("/f", None).unwrap();
        vol.write_path("/f", 0, &[1u8; 10_000]).unwrap();
        vol.sync().unwrap();
        let n = said_of("/f");
        assert!(hints.inner.len(&n.data).unwrap().is_some(), "written");
        // A change of scheme re-encrypts the file under a new id.
        let ino = vol.stat("/f").unwrap().ino;
        vol.setxattr(ino, SCHEME_XATTR, b"mac-tree", XattrMode::Set)
            .unwrap();
        vol.sync().unwrap();
        assert_ne!(said_of("/f").data, n.data);
        let said = hints.said.lock().unwrap().clone();
        assert!(said.iter().all(|(_, existed)| !existed), "{said:?}");
    }
}
