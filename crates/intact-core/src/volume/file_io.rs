//! One file's blocks under its scheme: the open-file state ([`OpenFile`]), reads, writes,
//! truncation and the push of dirty blocks through the scheme. Knows nothing of commits,
//! the inode table or directories (it is handed the record it needs).

#[allow(unused_imports)]
use super::*;
use crate::crypto::Hash;
use crate::scheme::SealPlan;
use crate::tree::{
    touched_list, use_segments, CounterEdit, CounterError, CounterIntervals, SegHashes, SEG_BLOCKS,
    SEG_STRIDE,
};
use crate::tx::LoggedOp;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(super) struct OpenFile {
    pub(super) inode: Inode,
    pub(super) state: StateCell,
    pub(super) dirty: BTreeMap<u64, Vec<u8>>,
    pub(super) record_dirty: bool,
    pub(super) dir: Option<BTreeMap<String, (u64, Kind)>>,
    pub(super) dir_dirty: bool,
    /// A whole-list directory's entries in cookie order, with their cookies (built by the
    /// first page read after a change, so a listing in pages sorts once).
    pub(super) dir_order: Option<std::sync::Arc<Vec<(u64, DirEntry)>>>,
    /// The decoded attribute set of a hidden [`Kind::Xattr`] inode (loaded on first use,
    /// written back whole at the seal when `xattrs_dirty`): a get, set or remove costs one
    /// map operation.
    pub(super) xattrs: Option<XattrSet>,
    pub(super) xattrs_dirty: bool,
    /// A directory's subdirectories, counted when first asked after a change of its
    /// entries (`None`: not counted).
    pub(super) subdirs: Option<u32>,
    /// The commit that holds this inode's last change (0: none since it was loaded):
    /// an fsync waits for it, no more ([`Volume::fsync`]).
    pub(super) sealed_by: u64,
    /// What the `auto` policy observed this session (files with `inode.auto` only).
    pub(super) obs: Observed,
    /// Bytes written to this file since checkpoint number `.0` began (seals of the log,
    /// which every fsync starts, do not count): past the dirty limits, only a file that
    /// wrote a large share is slowed ([`Volume::after_write`]).
    pub(super) written: (u64, usize),
    /// Its data object holds direct writes that no fsync or checkpoint synced yet, logged
    /// from this position of the log on.
    pub(super) unsynced_since: Option<crate::wal::LogPos>,
    /// Where the log ends past its last logged change.
    pub(super) logged_at: crate::wal::LogPos,
    /// What the spilled-counters object (`.c`) holds as the transaction sees it
    /// (authenticated when the file was loaded, or written by [`finish_record`] since).
    pub(super) ctrs_stored: CtrStore,
    /// The file left the inode table's slots for blocks in this request
    /// ([`Inner::inline_to_blocks`]): its next push through the scheme is staged, so that
    /// the log item that frees the slots never has direct writes a crash could leave out
    /// (docs/design.md, "Small files in the inode table").
    pub(super) stage_flush: bool,
    /// An inline file's bytes changed since they were last written into its slots
    /// ([`Inner::settle_slots`] writes them, once per request, not per change).
    pub(super) slots_stale: bool,
}

/// What a file's spilled-counters object (`.c`) holds, as its writer knows it.
#[derive(Debug, Default)]
pub(super) enum CtrStore {
    /// Nothing known: the counters are inline, or a write of them failed. The next
    /// spilled form is written whole.
    #[default]
    Unknown,
    /// The arrays whole (docs/file-format.md §9.1): the next change is written as edits of
    /// them ([`CounterIntervals::edits_from`]).
    Flat(CounterIntervals),
    /// Segments (§9.2), with their hashes: the next change rewrites the segments it
    /// touched, as edits of each. With the segments this writer wrote since the file was
    /// loaded, as it wrote them, so that the next edits of one need not read it back and
    /// decode it (an overwrite in a fragmented file spent a seventh of its time there).
    /// They are a subset of the file's counters, so they cost at most what `Flat` keeps.
    Segments(SegHashes, HashMap<u64, CounterIntervals>),
}

/// A file's scheme state, shared with the readers that run without the engine lock
/// ([`Volume::read_ino`]; docs/design.md, "Reads without the engine lock"). Whoever reads or
/// changes the file's blocks or objects holds it: a reader for the whole of its read, a
/// writer (always under the engine lock as well) for its change. So a reader never sees a
/// state and objects from different moments, and readers of other files never wait.
pub(super) struct StateCell {
    /// The file's object names (fixed by its id; a copy, readable without the lock).
    pub(super) names: ObjectNames,
    cell: Arc<RwLock<FileState>>,
}

impl StateCell {
    pub(super) fn new(state: FileState) -> Self {
        StateCell {
            names: state.names.clone(),
            cell: Arc::new(RwLock::new(state)),
        }
    }

    /// The state, to change (once no read holds it). Never taken twice by one thread.
    pub(super) fn get(&self) -> RwLockWriteGuard<'_, FileState> {
        self.cell.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The state, to look at (shared with reads in flight; under the engine lock, so no
    /// writer holds it).
    pub(super) fn peek(&self) -> RwLockReadGuard<'_, FileState> {
        self.cell.read().unwrap_or_else(|p| p.into_inner())
    }

    /// [`FileState::blocks`].
    pub(super) fn blocks(&self) -> u64 {
        self.peek().blocks()
    }

    /// A handle for a reader that goes on without the engine lock.
    pub(super) fn share(&self) -> Arc<RwLock<FileState>> {
        Arc::clone(&self.cell)
    }

    /// Whether a reader holds a handle (the file must then stay the one open record of its
    /// inode: it is not evicted).
    pub(super) fn is_shared(&self) -> bool {
        Arc::strong_count(&self.cell) > 1
    }

    /// Waits until no read runs on the file (before its objects are deleted or replaced;
    /// called under the engine lock, once no new read can be handed the state).
    pub(super) fn wait_readers(&self) {
        drop(self.get());
    }
}

/// Blocks read and written, and how many of the sampled ones looked random (IsRand).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Observed {
    pub(super) reads: u64,
    pub(super) writes: u64,
    pub(super) random: u64,
    pub(super) sampled: u64,
}

impl Observed {
    pub(super) fn sample(&mut self, block: &[u8]) {
        self.sampled += 1;
        self.random += crate::entropy::is_rand(block) as u64;
    }

    /// Counts blocks read (whole blocks in `run`), sampling every fourth for entropy.
    pub(super) fn observe(&mut self, run: &[u8], bs: usize) {
        for (k, blk) in run.chunks_exact(bs).enumerate() {
            self.reads += 1;
            if k % 4 == 0 {
                self.sample(blk);
            }
        }
    }

    pub(super) fn total(&self) -> u64 {
        self.reads + self.writes
    }
}

impl OpenFile {
    pub(super) fn load(
        inode: Inode,
        keys: &Keys,
        tx: &mut Tx,
        subject: Subject,
    ) -> Result<OpenFile> {
        let names = ObjectNames::of(&inode.id);
        let ctr_hash = |b: &[u8]| keys.ctrs.mac(&[b"ctrs", &inode.id, b]);
        let tampered = |e: &dyn std::fmt::Display| {
            Error::tampered(subject.clone(), None, format!("write counters: {e}"))
        };
        // Read exactly the spilled arrays' trusted length: bytes past it may be the remains of
        // a transaction that never sealed, and the store's length is not to be trusted.
        let (ctrs, ctrs_stored) = match &inode.counters {
            TrustedCounters::Segmented {
                intervals,
                blocks,
                h_top,
            } => {
                let h = seg_hasher(keys, &inode.id);
                let (ctrs, mut hashes) =
                    read_segments(tx, &names.ctrs, *blocks, &h).map_err(|e| match e {
                        SegError::Store(e) => e,
                        SegError::Bad(why) => tampered(&why),
                    })?;
                if hashes.top(&h) != *h_top || ctrs.intervals() as u64 != u64::from(*intervals) {
                    return Err(tampered(&CounterError::Mismatch));
                }
                (ctrs, CtrStore::Segments(hashes, HashMap::new()))
            }
            t => {
                let spilled = match t {
                    TrustedCounters::Spilled { intervals, .. } => {
                        let len = 12 + 16 * *intervals as usize;
                        let mut buf = vec![0u8; len];
                        tx.read_at(&names.ctrs, 0, &mut buf)?;
                        Some(buf)
                    }
                    _ => None,
                };
                let ctrs = check_ctr(t, spilled.as_deref(), &ctr_hash).map_err(|e| tampered(&e))?;
                let stored = match spilled {
                    Some(_) => CtrStore::Flat(ctrs.clone()),
                    None => CtrStore::Unknown,
                };
                (ctrs, stored)
            }
        };
        if let Some(d) = &inode.inline_data {
            let bytes_ok = d.bytes.is_empty() || d.bytes.len() as u64 == inode.size;
            if inode.kind != Kind::File
                || inode.scheme != SchemeId::MtEintGcm
                || inode.auto
                || inode.size > INLINE_DATA_MAX
                || d.slots.len() != InlineData::slots_for(inode.size)
                || inode.tree.leaves != 0
                || ctrs.blocks() != 0
                || !bytes_ok
            {
                return Err(Error::tampered(
                    subject,
                    None,
                    "inline data in a record that cannot keep it",
                ));
            }
        }
        let mt = matches!(inode.scheme, SchemeId::MtEintGcm | SchemeId::MtEintCbc);
        if inode.inline_node.is_some() && (!mt || inode.tree.leaves != 1) {
            return Err(Error::tampered(
                subject,
                None,
                "an inline Merkle node in a record whose tree is not one leaf",
            ));
        }
        if let Some(t) = &inode.inline_tags {
            let fits = InlineTags::fit(inode.tree.leaves, ctrs.intervals())
                && matches!(inode.counters, TrustedCounters::Inline(_));
            if inode.scheme != SchemeId::MtEintGcm || t.n as u64 != inode.tree.leaves || !fits {
                return Err(Error::tampered(
                    subject,
                    None,
                    "inline Merkle leaves in a record whose tree or counters do not allow them",
                ));
            }
        }
        let one_counter = || {
            inode.scheme == SchemeId::MacTree
                && crate::scheme::MacTreeState::decode(&inode.tree.root).is_some_and(|t| t.m == 1)
        };
        if inode.inline_mac.is_some() && !one_counter() {
            return Err(Error::tampered(
                subject,
                None,
                "an inline mac-tree leaf in a record whose tree has not exactly one leaf counter",
            ));
        }
        let fresh = inode.scheme.uses_counter_intervals();
        let covered = match inode.scheme.partial_tree() {
            true => inode.tree.leaves <= ctrs.blocks(),
            false => inode.tree.leaves == ctrs.blocks(),
        };
        if fresh && !covered {
            return Err(Error::tampered(
                subject,
                None,
                "counter intervals do not cover the file's blocks",
            ));
        }
        let state = StateCell::new(FileState {
            subject,
            id: inode.id,
            keys: Arc::new(crypto::FileKeys::new(Arc::clone(&keys.master), &inode.id)),
            names,
            tree: inode.tree,
            ctrs,
            ctr_hw: inode.ctr_hw,
            rtree: crate::scheme::RTreeIndex::for_scheme(inode.scheme),
            inline: inode.inline_node,
            inline_mac: inode.inline_mac,
            tags: inode.inline_tags,
        });
        Ok(OpenFile {
            inode,
            state,
            dirty: BTreeMap::new(),
            record_dirty: false,
            dir: None,
            dir_dirty: false,
            dir_order: None,
            xattrs: None,
            xattrs_dirty: false,
            subdirs: None,
            sealed_by: 0,
            obs: Observed::default(),
            written: (0, 0),
            unsynced_since: None,
            logged_at: Default::default(),
            ctrs_stored,
            stage_flush: false,
            slots_stale: false,
        })
    }

    /// After a write that ends at byte `end`: the size grows to it, the times change, the
    /// record is to be written.
    pub(super) fn wrote_to(&mut self, end: u64) {
        self.inode.size = self.inode.size.max(end);
        self.inode.mtime_ns = now_ns();
        self.inode.ctime_ns = self.inode.mtime_ns;
        self.record_dirty = true;
    }

    /// Counts `len` bytes written in checkpoint number `checkpoint` ([`OpenFile::written`]).
    pub(super) fn note_written(&mut self, checkpoint: u64, len: usize) {
        if self.written.0 != checkpoint {
            self.written = (checkpoint, 0);
        }
        self.written.1 = self.written.1.saturating_add(len);
    }

    pub(super) fn is_dirty(&self) -> bool {
        !self.dirty.is_empty() || self.record_dirty || self.dir_dirty || self.xattrs_dirty
    }
}

/// Where block `b` meets the byte range `[off, off + len)`: the range in the buffer and
/// the range in the block (empty when they do not meet).
pub(super) fn block_part(
    bs: u64,
    b: u64,
    off: u64,
    len: usize,
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let s = (b * bs).max(off);
    let e = ((b + 1) * bs).min(off + len as u64).max(s);
    (
        (s - off) as usize..(e - off) as usize,
        (s - b * bs) as usize..(e - b * bs) as usize,
    )
}

pub(super) fn copy_block_part(bs: u64, b: u64, block: &[u8], off: u64, buf: &mut [u8]) {
    let (to, from) = block_part(bs, b, off, buf.len());
    buf[to].copy_from_slice(&block[from]);
}

/// Reads a file's bytes, from its dirty blocks or through its scheme.
pub(super) fn file_read(
    env: &Env,
    tx: &mut Tx,
    of: &mut OpenFile,
    off: u64,
    buf: &mut [u8],
) -> Result<usize> {
    if let Some(d) = &of.inode.inline_data {
        return Ok(read_inline(&d.bytes, off, buf));
    }
    let file = FileRead {
        scheme: of.inode.scheme,
        size: of.inode.size,
        dirty: &of.dirty,
    };
    let obs = of.inode.auto.then_some(&mut of.obs);
    let sch = scheme(file.scheme);
    let st = of.state.peek();
    if sch.read_ready(&st) {
        return file.read(env, tx, &st, obs, off, buf);
    }
    drop(st);
    let mut st = of.state.get();
    sch.prepare_read(env, &mut st, tx)?;
    file.read(env, tx, &st, obs, off, buf)
}

/// [`file_read`] of up to `len` bytes at `off` into bytes the metadata cache can share as
/// they are: read in place, with no buffer copied into them.
pub(super) fn file_read_shared(
    env: &Env,
    tx: &mut Tx,
    of: &mut OpenFile,
    off: u64,
    len: usize,
) -> Result<Arc<[u8]>> {
    let mut b: Arc<[u8]> = std::iter::repeat_n(0u8, len).collect();
    let n = file_read(
        env,
        tx,
        of,
        off,
        Arc::get_mut(&mut b).expect("not shared yet"),
    )?;
    Ok(if n < len { Arc::from(&b[..n]) } else { b })
}

/// Reads `buf` at `off` of an inline file's bytes (stopping at its end).
fn read_inline(bytes: &[u8], off: u64, buf: &mut [u8]) -> usize {
    let Some(rest) = usize::try_from(off).ok().and_then(|o| bytes.get(o..)) else {
        return 0;
    };
    let n = rest.len().min(buf.len());
    buf[..n].copy_from_slice(&rest[..n]);
    n
}

/// What a read of a file needs besides its scheme state: the engine hands it to a reader
/// that runs without its lock ([`Volume::read_ino`]) with no dirty blocks.
pub(super) struct FileRead<'a> {
    pub(super) scheme: SchemeId,
    pub(super) size: u64,
    /// Blocks written but not yet pushed through the scheme.
    pub(super) dirty: &'a BTreeMap<u64, Vec<u8>>,
}

impl FileRead<'_> {
    /// Reads `buf` at `off` (stopping at the file's end): dirty blocks, then stored ones
    /// through the scheme, zeros past the stored end. `obs` counts what was read.
    pub(super) fn read(
        &self,
        env: &Env,
        tx: &mut Tx,
        state: &FileState,
        mut obs: Option<&mut Observed>,
        off: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let size = self.size;
        if off >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - off) as usize;
        // The caller's buffer (it may reach past the file's end) and its part that gets
        // the file's bytes.
        let full = buf;
        let room = off.saturating_add(full.len() as u64);
        let bs = env.bs as u64;
        let sch = scheme(self.scheme);
        let (first, last) = (off / bs, (off + n as u64 - 1) / bs);
        let stored = state.blocks();
        let dirty = self.dirty;
        let mut b = first;
        let mut tmp = Vec::new();
        while b <= last {
            if let Some(d) = dirty.get(&b) {
                copy_block_part(bs, b, d, off, &mut full[..n]);
                b += 1;
                continue;
            }
            if b >= stored {
                let (to, _) = block_part(bs, b, off, n);
                full[to].fill(0);
                b += 1;
                continue;
            }
            let mut e = b;
            while e < last && e + 1 < stored && !dirty.contains_key(&(e + 1)) && e - b < 1023 {
                e += 1;
            }
            if b * bs >= off && (e + 1) * bs <= room {
                // The run starts on a block boundary of the read (the kernel's reads are
                // page-aligned) and the buffer has room for all of it: read in place, with
                // no copy through `tmp`. What lies past the file's end in its last block
                // does not stay there: the caller's bytes past `n` are put back.
                let at = (b * bs - off) as usize;
                let end = at + ((e - b + 1) * bs) as usize;
                // Kept in `tmp` (no allocation of its own per read): at most a block.
                let past = n.min(end)..end;
                tmp.clear();
                tmp.extend_from_slice(&full[past.clone()]);
                let r = sch.read_blocks(env, state, tx, b, &mut full[at..end]);
                full[past].copy_from_slice(&tmp);
                r?;
                if let Some(o) = obs.as_deref_mut() {
                    o.observe(&full[at..end], env.bs);
                }
                b = e + 1;
                continue;
            }
            tmp.resize(((e - b + 1) * bs) as usize, 0);
            sch.read_blocks(env, state, tx, b, &mut tmp)?;
            if let Some(o) = obs.as_deref_mut() {
                o.observe(&tmp, env.bs);
            }
            for k in b..=e {
                copy_block_part(
                    bs,
                    k,
                    &tmp[((k - b) * bs) as usize..((k - b + 1) * bs) as usize],
                    off,
                    &mut full[..n],
                );
            }
            b = e + 1;
        }
        Ok(n)
    }
}

/// One block's current plaintext (dirty, stored, or zeros past the stored end).
pub(super) fn load_block(env: &Env, tx: &mut Tx, of: &mut OpenFile, b: u64) -> Result<Vec<u8>> {
    if let Some(d) = of.dirty.get(&b) {
        return Ok(d.clone());
    }
    let mut blk = vec![0u8; env.bs];
    let st = of.state.peek();
    if b < st.blocks() {
        scheme(of.inode.scheme).read_blocks(env, &st, tx, b, &mut blk)?;
    }
    Ok(blk)
}

/// Refuses a length the file's scheme cannot reach: past the nonce's block limit, or (for
/// `aead`, which writes gaps as encrypted zeros) a gap too large to fill. Checked before
/// anything changes, so the error never surfaces later at a seal.
pub(super) fn check_extent(env: &Env, of: &OpenFile, size: u64) -> Result<()> {
    let blocks = size.div_ceil(env.bs as u64);
    let stored = of
        .state
        .blocks()
        .max(of.dirty.keys().next_back().map_or(0, |b| b + 1));
    let gap_ok = of.inode.scheme != SchemeId::Aead
        || blocks <= stored
        || blocks - stored <= crate::scheme::AEAD_MAX_GAP;
    // The store's largest object (the backing file system's largest file): a length that
    // would need more is refused now, not by the seal that would store it.
    let fits = scheme(of.inode.scheme).data_len(env.bs, blocks) <= env.max_object;
    if blocks > crypto::MAX_BLOCKS || !gap_ok || !fits {
        return Err(Error::fs("", FsErrorKind::TooLarge));
    }
    Ok(())
}

pub(super) fn file_write(
    env: &Env,
    tx: &mut Tx,
    of: &mut OpenFile,
    off: u64,
    data: &[u8],
) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let bs = env.bs as u64;
    let end = off
        .checked_add(data.len() as u64)
        .ok_or_else(|| Error::fs("", FsErrorKind::TooLarge))?;
    if let Some(d) = &mut of.inode.inline_data {
        // The caller moved the file to blocks if it would grow past the slots' bound.
        assert!(
            end <= INLINE_DATA_MAX,
            "an inline file written past its bound"
        );
        if d.bytes.len() < end as usize {
            d.bytes.resize(end as usize, 0);
        }
        d.bytes[off as usize..end as usize].copy_from_slice(data);
        of.slots_stale = true;
        of.wrote_to(end);
        return Ok(());
    }
    check_extent(env, of, end)?;
    for b in off / bs..=(end - 1) / bs {
        let s = (b * bs).max(off);
        let e = ((b + 1) * bs).min(end);
        let src = &data[(s - off) as usize..(e - off) as usize];
        if of.inode.auto {
            of.obs.writes += 1;
            if e - s == bs {
                of.obs.sample(src);
            }
        }
        if e - s == bs {
            of.dirty.insert(b, src.to_vec());
            continue;
        }
        if let Some(d) = of.dirty.get_mut(&b) {
            d[(s - b * bs) as usize..(e - b * bs) as usize].copy_from_slice(src);
            continue;
        }
        let mut blk = load_block(env, tx, of, b)?;
        blk[(s - b * bs) as usize..(e - b * bs) as usize].copy_from_slice(src);
        of.dirty.insert(b, blk);
    }
    of.wrote_to(end);
    Ok(())
}

/// Sets a file's length: drops dirty blocks past it, zeroes the tail of a new partial last
/// block (so a later extension reads zeros), and truncates the scheme's blocks.
pub(super) fn file_truncate(env: &Env, tx: &mut Tx, of: &mut OpenFile, size: u64) -> Result<()> {
    if let Some(d) = &mut of.inode.inline_data {
        assert!(
            size <= INLINE_DATA_MAX,
            "an inline file extended past its bound"
        );
        d.bytes.resize(size as usize, 0);
        of.slots_stale |= size != of.inode.size;
    } else {
        cut_blocks(env, tx, of, size)?;
    }
    if size != of.inode.size {
        of.inode.size = size;
        of.inode.mtime_ns = now_ns();
        of.inode.ctime_ns = of.inode.mtime_ns;
        of.record_dirty = true;
    }
    Ok(())
}

/// [`file_truncate`]'s part for a file in blocks.
fn cut_blocks(env: &Env, tx: &mut Tx, of: &mut OpenFile, size: u64) -> Result<()> {
    let bs = env.bs as u64;
    let new_blocks = size.div_ceil(bs);
    of.dirty.retain(|&b, _| b < new_blocks);
    if size < of.inode.size {
        if !size.is_multiple_of(bs) {
            let b = size / bs;
            let mut blk = load_block(env, tx, of, b)?;
            blk[(size % bs) as usize..].fill(0);
            of.dirty.insert(b, blk);
        }
        let mut st = of.state.get();
        if new_blocks < st.blocks() {
            scheme(of.inode.scheme).resize(env, &mut st, tx, new_blocks)?;
        }
    }
    Ok(())
}

/// Pushes dirty blocks through the scheme (Update / Append), extending with holes where the
/// file grew past its stored blocks. Runs are assembled in `run` (a buffer the engine keeps,
/// so large flushes do not fault in fresh pages every time) and encrypted in place. On an
/// error the file's remaining dirty blocks are gone: callers must mark the engine broken.
pub(super) fn flush_data(
    env: &Env,
    tx: &mut Tx,
    of: &mut OpenFile,
    run: &mut Vec<u8>,
) -> Result<()> {
    if of.inode.inline_data.is_some() {
        // Its bytes are in the record's slots, written with the record.
        return Ok(());
    }
    let sch = scheme(of.inode.scheme);
    let bs = env.bs as u64;
    let dirty = std::mem::take(&mut of.dirty);
    let mut st = of.state.get();
    let inside = st.blocks();
    // The runs over the file's blocks go to the scheme together (`write_runs`: MT-EINT
    // updates its tree once for all of them; a checkpoint of a big directory writes
    // hundreds of scattered leaves of it); the runs that grow the file then go one by one.
    // A lone run is gathered in `run`, as before; among several, a run of one block is its
    // dirty block itself and a longer one gets a buffer of its exact size, each block
    // dropped once copied, and each run's buffer once written, so the dirty bytes are held
    // once, not beside what the transaction keeps of them.
    let mut spans: Vec<(u64, usize)> = Vec::new();
    for &b in dirty.range(..inside).map(|(b, _)| b) {
        match spans.last_mut() {
            Some((first, count)) if *first + *count as u64 == b => *count += 1,
            _ => spans.push((b, 1)),
        }
    }
    let mut it = dirty.into_iter().peekable();
    fn gather(it: &mut impl Iterator<Item = (u64, Vec<u8>)>, buf: &mut Vec<u8>, count: usize) {
        for _ in 0..count {
            buf.extend_from_slice(&it.next().expect("counted").1);
        }
    }
    if let [(first, count)] = spans[..] {
        run.clear();
        gather(&mut it, run, count);
        sch.write_blocks(env, &mut st, tx, first, run)?;
    } else if !spans.is_empty() {
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::with_capacity(spans.len());
        for &(first, count) in &spans {
            let data = if count == 1 {
                it.next().expect("counted").1
            } else {
                let mut data = Vec::with_capacity(count * env.bs);
                gather(&mut it, &mut data, count);
                data
            };
            runs.push((first, data));
        }
        sch.write_runs(env, &mut st, tx, runs)?;
    }
    while let Some((first, blk)) = it.next() {
        run.clear();
        run.extend_from_slice(&blk);
        let mut next = first + 1;
        while let Some((b, _)) = it.peek() {
            if *b != next {
                break;
            }
            run.extend_from_slice(&it.next().expect("peeked").1);
            next += 1;
        }
        if first > st.blocks() {
            sch.resize(env, &mut st, tx, first)?;
        }
        sch.write_blocks(env, &mut st, tx, first, run)?;
    }
    let target = of.inode.size.div_ceil(bs);
    if st.blocks() < target {
        sch.resize(env, &mut st, tx, target)?;
    }
    Ok(())
}

/// auth_ctr (Fig. 6) and the TS_F fields of the record, after a flush.
pub(super) fn finish_record(
    keys: &Keys,
    tx: &mut Tx,
    of: &mut OpenFile,
    segments: bool,
) -> Result<()> {
    let id = of.inode.id;
    let hash = |b: &[u8]| keys.ctrs.mac(&[b"ctrs", &id, b]);
    let mut st = of.state.get();
    let touched = st.ctrs.take_touched();
    let name = st.names.ctrs.clone();
    let was_spilled = !matches!(of.inode.counters, TrustedCounters::Inline(_));
    // Many intervals, and enough of them a segment, go to segments (docs/file-format.md
    // §9.2; `use_segments`).
    let segmented = segments
        && st.ctrs.arrays_size() > L_CTR
        && use_segments(
            st.ctrs.intervals(),
            st.ctrs.segments(),
            matches!(of.inode.counters, TrustedCounters::Segmented { .. }),
        );
    let tc = if segmented {
        write_segments(keys, &id, tx, &name, &st.ctrs, touched, &mut of.ctrs_stored)?
    } else {
        let (tc, spill) = auth_ctr(&st.ctrs, L_CTR, &hash);
        match spill {
            // Edits of what the object holds: a random write moves most of the arrays, and
            // the log records the moves, not the bytes (docs/design.md, "Counters in the
            // log").
            Some(bytes) => match std::mem::take(&mut of.ctrs_stored) {
                // The new arrays are staged whole (they are at hand: nothing to read back)
                // and the log gets the edits.
                CtrStore::Flat(old) if old != st.ctrs => {
                    let edits = st.ctrs.edits_from(&old);
                    #[cfg(debug_assertions)]
                    {
                        // What the object holds now: the old arrays (and maybe stale bytes).
                        let mut obj = vec![0u8; old.encode().len()];
                        let n = tx.read_at(&name, 0, &mut obj)?;
                        assert_eq!(n, obj.len(), "{name} shorter than its arrays");
                        for e in &edits {
                            assert!(e.apply(&mut obj), "{e:?} reads past the end of {name}");
                        }
                        assert_eq!(obj, bytes, "the edits of {name}");
                    }
                    let ops = logged_edits(&name, 0, edits, true);
                    tx.stage_logging(&name, 0, &bytes, Some(bytes.len() as u64), ops)?;
                    of.ctrs_stored = CtrStore::Flat(st.ctrs.clone());
                }
                CtrStore::Flat(same) => of.ctrs_stored = CtrStore::Flat(same),
                _ => {
                    tx.write_at(&name, 0, &bytes)?;
                    tx.set_len(&name, bytes.len() as u64)?;
                    of.ctrs_stored = CtrStore::Flat(st.ctrs.clone());
                }
            },
            None => {
                of.ctrs_stored = CtrStore::Unknown;
                if was_spilled {
                    tx.set_len(&name, 0)?;
                }
            }
        }
        tc
    };
    of.inode.counters = tc;
    of.inode.tree = st.tree;
    of.inode.inline_node = st.inline;
    of.inode.inline_mac = st.inline_mac;
    of.inode.inline_tags = st.tags;
    of.inode.ctr_hw = st.ctr_hw;
    Ok(())
}

/// The edits of an encoding at `off` of `name`, as the log records them; a length set only
/// with `whole` (a segment's encoding is not the whole object: its length is not the
/// object's).
fn logged_edits(name: &str, off: u64, edits: Vec<CounterEdit>, whole: bool) -> Vec<LoggedOp> {
    let name_s = || name.to_string();
    edits
        .into_iter()
        .filter_map(|e| match e {
            CounterEdit::Copy { src, dst, len } => Some(LoggedOp::Copy {
                name: name_s(),
                src: off + src,
                dst: off + dst,
                len,
            }),
            CounterEdit::Write { off: at, bytes } => Some(LoggedOp::Write {
                name: name_s(),
                off: off + at,
                data: bytes,
            }),
            CounterEdit::SetLen(len) => whole.then(|| LoggedOp::SetLen {
                name: name_s(),
                len,
            }),
        })
        .collect()
}

/// The keyed hash of a segmented file's counters ([`SegHashes`]): the COUNTERS key over the
/// label, the file id, then the rest.
fn seg_hasher<'a>(keys: &'a Keys, id: &'a [u8; 16]) -> impl Fn(&[&[u8]]) -> Hash + 'a {
    move |parts: &[&[u8]]| {
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(parts[0]);
        all.push(id);
        all.extend_from_slice(&parts[1..]);
        keys.ctrs.mac(&all)
    }
}

/// Why a segmented file's counters could not be read.
enum SegError {
    /// The store failed.
    Store(Error),
    /// What it holds is not a valid segment (tampering, as the caller reports it).
    Bad(String),
}

impl From<Error> for SegError {
    fn from(e: Error) -> Self {
        SegError::Store(e)
    }
}

/// The encoding of the segment at `off` of `name` and its counters, read as the
/// transaction sees them (§9.2: its header gives its length).
fn read_slot(
    tx: &mut Tx,
    name: &str,
    off: u64,
) -> std::result::Result<(Vec<u8>, CounterIntervals), SegError> {
    let mut head = [0u8; 12];
    if tx.read_at(name, off, &mut head)? != head.len() {
        return Err(SegError::Bad(format!("segment at {off} cut short")));
    }
    let count = u64::from(u32::from_le_bytes(head[..4].try_into().expect("4 bytes")));
    if count > SEG_BLOCKS {
        return Err(SegError::Bad(format!(
            "segment at {off} of {count} intervals"
        )));
    }
    let mut enc = vec![0u8; 12 + 16 * count as usize];
    if tx.read_at(name, off, &mut enc)? != enc.len() {
        return Err(SegError::Bad(format!("segment at {off} cut short")));
    }
    let seg = CounterIntervals::decode(&enc)
        .map_err(|e| SegError::Bad(format!("segment at {off}: {e}")))?;
    Ok((enc, seg))
}

/// The counters of a file of `blocks` blocks in segments (§9.2), with their hashes: every
/// segment read, of the length its place gives, and joined. The caller compares the top
/// hash with the record's.
fn read_segments(
    tx: &mut Tx,
    name: &str,
    blocks: u64,
    h: &dyn Fn(&[&[u8]]) -> Hash,
) -> std::result::Result<(CounterIntervals, SegHashes), SegError> {
    let n = blocks.div_ceil(SEG_BLOCKS);
    let mut hashes = SegHashes::default();
    let mut segs = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for k in 0..n {
        let (enc, seg) = read_slot(tx, name, k * SEG_STRIDE)?;
        let want = (blocks - k * SEG_BLOCKS).min(SEG_BLOCKS);
        if seg.blocks() != want {
            return Err(SegError::Bad(format!(
                "segment {k} covers {} blocks, not {want}",
                seg.blocks()
            )));
        }
        hashes.set(k, &enc, h);
        segs.push(seg);
    }
    let ctrs = CounterIntervals::from_segments(&segs).map_err(|e| SegError::Bad(e.to_string()))?;
    Ok((ctrs, hashes))
}

/// Writes a file's counters in segments (docs/file-format.md §9.2): the segments
/// `touched` since the last write and the new ones, each staged whole and logged as edits
/// of what its place held; every segment when the object held another form (or a write of
/// it failed). Then the hashes of the groups they are in, and the top.
fn write_segments(
    keys: &Keys,
    id: &[u8; 16],
    tx: &mut Tx,
    name: &str,
    ctrs: &CounterIntervals,
    touched: Vec<(u64, u64)>,
    stored: &mut CtrStore,
) -> Result<TrustedCounters> {
    let h = seg_hasher(keys, id);
    let n = ctrs.segments();
    let (mut hashes, mut written, old_n, all) = match std::mem::take(stored) {
        CtrStore::Segments(hs, w) => {
            let o = hs.segments();
            (hs, w, o, false)
        }
        _ => (SegHashes::default(), HashMap::new(), 0, true),
    };
    written.retain(|&k, _| k < n);
    let list: Vec<u64> = if all {
        (0..n).collect()
    } else {
        let mut ranges = touched;
        ranges.push((old_n, n));
        touched_list(&ranges)
    };
    hashes.truncate(n);
    for k in list {
        let seg = ctrs.segment(k);
        let enc = seg.encode();
        let off = k * SEG_STRIDE;
        if !all && k < old_n {
            let old = match written.remove(&k) {
                Some(old) => {
                    #[cfg(debug_assertions)]
                    {
                        // A store that fails reads (a crashed one) is not asked again here.
                        if let Ok((_, read)) = read_slot(tx, name, off) {
                            assert_eq!(read, old, "segment {k} of {name} as kept");
                        }
                    }
                    old
                }
                None => match read_slot(tx, name, off) {
                    Ok((_, old)) => old,
                    Err(SegError::Store(e)) => return Err(e),
                    Err(SegError::Bad(why)) => {
                        return Err(Error::Invalid(format!("{name}: {why} (as written)")))
                    }
                },
            };
            let edits = seg.edits_from(&old);
            #[cfg(debug_assertions)]
            {
                let mut obj = old.encode();
                for e in &edits {
                    assert!(e.apply(&mut obj), "{e:?} reads past segment {k} of {name}");
                }
                assert_eq!(obj, enc, "the edits of segment {k} of {name}");
            }
            tx.stage_logging(name, off, &enc, None, logged_edits(name, off, edits, false))?;
        } else {
            tx.write_at(name, off, &enc)?;
        }
        hashes.set(k, &enc, &h);
        written.insert(k, seg);
    }
    if all || n < old_n {
        // The object ends with the last segment (what lay past it: an older form's bytes).
        let last = ctrs.segment(n - 1).encode().len() as u64;
        tx.set_len(name, (n - 1) * SEG_STRIDE + last)?;
    }
    let h_top = hashes.top(&h);
    #[cfg(debug_assertions)]
    {
        assert_eq!(
            SegHashes::of(ctrs, &h).top(&h),
            h_top,
            "a change of {name}'s counters was not touched"
        );
    }
    *stored = CtrStore::Segments(hashes, written);
    Ok(TrustedCounters::Segmented {
        intervals: u32::try_from(ctrs.intervals()).expect("intervals fit in u32"),
        blocks: ctrs.blocks(),
        h_top,
    })
}

/// Blocks that hold data (holes excluded): counter 0 marks a hole in the counter
/// intervals (schemes without them report every block they hold).
pub(super) fn stored_blocks(of: &OpenFile) -> u64 {
    let st = of.state.peek();
    let blocks = st.blocks();
    if !of.inode.scheme.uses_counter_intervals() {
        return blocks;
    }
    // The counters may cover fewer blocks than the file (a file grown by a truncate):
    // those past them are holes. O(1): a stat of a file of many intervals (a directory of
    // 10^6 names) must not cost one step per interval.
    debug_assert!(st.ctrs.blocks() <= blocks);
    st.ctrs.stored() + of.dirty.len() as u64
}

/// Staged bytes a read copies to go on without the engine lock (past them it runs under
/// the lock: copying would cost more than it saves).
pub(super) const VIEW_MAX: usize = 256 << 10;

/// What an [`Env`] borrows from the engine, owned: for work handed over to run without the
/// engine lock.
pub(super) struct OwnedEnv {
    keys: Arc<Keys>,
    cache: Arc<NodeCache>,
    metrics: Arc<Metrics>,
    bs: usize,
    ctr_floor: u64,
    ctr_limit: u64,
    max_object: u64,
    inline_leaf: bool,
    inline_mac: bool,
    inline_tree: bool,
    twins: bool,
}

impl OwnedEnv {
    pub(super) fn of(inner: &Inner) -> Self {
        OwnedEnv {
            keys: Arc::clone(&inner.keys),
            cache: Arc::clone(&inner.cache),
            metrics: Arc::clone(&inner.metrics),
            bs: inner.bs,
            ctr_floor: inner.ctr_floor,
            ctr_limit: inner.anchor.ctr_next,
            max_object: inner.max_object,
            inline_leaf: inner.inline_leaf,
            inline_mac: inner.inline_mac,
            inline_tree: inner.inline_tree,
            twins: inner.twin_blocks,
        }
    }

    pub(super) fn env(&self) -> Env<'_> {
        Env {
            bs: self.bs,
            hasher: &self.keys.hasher,
            leaf_key: &self.keys.leaf,
            cache: &self.cache,
            ctr_floor: self.ctr_floor,
            ctr_limit: self.ctr_limit,
            metrics: &self.metrics,
            max_object: self.max_object,
            inline_leaf: self.inline_leaf,
            inline_mac: self.inline_mac,
            inline_tree: self.inline_tree,
            twins: self.twins,
        }
    }
}

/// A read handed over by the engine to run without its lock ([`Inner::reader`]).
pub(super) struct Reader {
    /// The file's state: the read holds it (shared) throughout.
    pub(super) state: Arc<RwLock<FileState>>,
    /// The file's objects as the engine saw them ([`Tx::view`]).
    view: Tx,
    scheme: SchemeId,
    size: u64,
    env: OwnedEnv,
}

impl Reader {
    /// Reads `buf` at `off` through the file's scheme; `state` is [`Reader::state`], held.
    pub(super) fn read(mut self, state: &FileState, off: u64, buf: &mut [u8]) -> Result<usize> {
        let file = FileRead {
            scheme: self.scheme,
            size: self.size,
            dirty: &BTreeMap::new(),
        };
        file.read(&self.env.env(), &mut self.view, state, None, off, buf)
    }
}

/// Writes of at least this many bytes are encrypted without the engine lock, where the
/// file's scheme allows it ([`Inner::sealer`]); below it, the second visit to the lock
/// would cost more than the encryption it takes out.
pub(super) const SEAL_UNLOCKED: usize = 64 << 10;

/// A write's encryption handed over by the engine to run without its lock
/// ([`Inner::sealer`]; docs/design.md, "Writes sealed without the engine lock").
pub(super) struct Sealer {
    plan: SealPlan,
    scheme: SchemeId,
    env: OwnedEnv,
}

/// A run encrypted by a [`Sealer`], to be stored by [`Inner::write_sealed`].
pub(super) struct Sealed {
    plan: SealPlan,
    scheme: SchemeId,
    /// The ciphertext.
    data: Vec<u8>,
    leaves: Vec<Hash>,
}

impl Sealer {
    /// Encrypts a copy of `plain` (the write's bytes, full blocks) under the plan.
    pub(super) fn seal(self, plain: &[u8]) -> Sealed {
        let mut data = plain.to_vec();
        let leaves = scheme(self.scheme).seal_run(&self.env.env(), &self.plan, &mut data);
        Sealed {
            plan: self.plan,
            scheme: self.scheme,
            data,
            leaves,
        }
    }
}

impl Inner {
    /// What a read of `len` bytes at `off` of file `ino` needs to run without the engine
    /// lock, or `None` when it must run under it: it meets blocks not yet pushed through
    /// the scheme, the `auto` policy observes the file, there is nothing to read, or the
    /// file's staged bytes are many. The caller must take [`Reader::state`] before it lets
    /// go of the engine lock: writers of the file take it under the lock, so the state and
    /// the view stay as they are here until the read ends.
    pub(super) fn reader(&mut self, ino: u64, off: u64, len: usize) -> Result<Option<Reader>> {
        self.ensure_open(ino)?;
        let bs = self.bs as u64;
        let of = &self.files[&ino];
        let size = of.inode.size;
        if of.inode.kind != Kind::File
            || of.inode.auto
            || of.inode.inline_data.is_some()
            || off >= size
            || len == 0
        {
            return Ok(None);
        }
        let end = off + (len as u64).min(size - off);
        if of.dirty.range(off / bs..=(end - 1) / bs).next().is_some() {
            return Ok(None);
        }
        // A read of this file may hold the state shared right now: check without waiting
        // (a locked read prepares what is missing).
        let sch = scheme(of.inode.scheme);
        let ready = match of.state.cell.try_read() {
            Ok(st) => sch.read_ready(&st),
            Err(_) => false,
        };
        if !ready {
            // Load what the scheme reads with (RTree's index) here, so that the read itself
            // runs without the engine lock: a record read again after it was dropped from
            // memory starts without it, and would otherwise read under the lock each time.
            let env = env!(self);
            let of = self.files.get_mut(&ino).expect("opened");
            let Ok(mut st) = of.state.cell.try_write() else {
                return Ok(None);
            };
            sch.prepare_read(&env, &mut st, &mut self.tx)?;
            if !sch.read_ready(&st) {
                return Ok(None);
            }
        }
        let of = &self.files[&ino];
        let n = &of.state.names;
        let Some(view) = self.tx.view(&n.all().map(String::as_str), VIEW_MAX)? else {
            return Ok(None);
        };
        Ok(Some(Reader {
            state: of.state.share(),
            view,
            scheme: of.inode.scheme,
            size,
            env: OwnedEnv::of(self),
        }))
    }

    /// What a write of `len` bytes at `off` of file `ino` needs to be encrypted without the
    /// engine lock, or `None` when it is written as any other: not whole blocks, a file the
    /// `auto` policy observes, a scheme that does all of its work in
    /// [`crate::scheme::Scheme::write_blocks`], or a length the file cannot reach (the write
    /// itself then says why). The plan holds no lock and no state: the counter it chose is
    /// checked again when the run is stored ([`Inner::write_sealed`]).
    /// Refuses, before any part of it lands, a write of file `ino` that ends at `end` and
    /// could not be stored whole: the volume is read-only or full, or the file cannot reach
    /// that length ([`check_extent`]). A write applied in slices
    /// ([`Volume::write_ino`]) asks this first.
    pub(super) fn check_write_end(&mut self, ino: u64, end: u64) -> Result<()> {
        self.check_writable()?;
        self.unsealed.refuse_if_full()?;
        self.ensure_open(ino)?;
        let env = env!(self);
        check_extent(&env, &self.files[&ino], end)
    }

    pub(super) fn sealer(&mut self, ino: u64, off: u64, len: usize) -> Result<Option<Sealer>> {
        self.ensure_open(ino)?;
        let of = &self.files[&ino];
        if of.inode.size == 0 && off.saturating_add(len as u64) > INLINE_DATA_MAX {
            // A new file's first write is large: it goes to blocks now, and is sealed as
            // any file in blocks (an inline file with bytes moves under the write's lock).
            self.inline_room(ino, off.saturating_add(len as u64))?;
        }
        let bs = self.bs as u64;
        let env = env!(self);
        let of = &self.files[&ino];
        let len = len as u64;
        if of.inode.kind != Kind::File
            || of.inode.auto
            || of.inode.inline_data.is_some()
            || len == 0
            || !off.is_multiple_of(bs)
            || !len.is_multiple_of(bs)
            || off
                .checked_add(len)
                .is_none_or(|end| check_extent(&env, of, end).is_err())
        {
            return Ok(None);
        }
        let sch = scheme(of.inode.scheme);
        let Some(plan) = sch.seal_plan(&env, &of.state.peek(), off / bs, len / bs)? else {
            return Ok(None);
        };
        Ok(Some(Sealer {
            plan,
            scheme: of.inode.scheme,
            env: OwnedEnv::of(self),
        }))
    }

    pub(super) fn read_ino(&mut self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.ensure_open(ino)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        file_read(&env, &mut self.tx, of, off, buf)
    }
    pub(super) fn write_ino(&mut self, ino: u64, off: u64, data: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.unsealed.refuse_if_full()?;
        self.ensure_open(ino)?;
        self.note_data(ino);
        self.inline_room(ino, off.saturating_add(data.len() as u64))?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        let before = of.dirty.len();
        file_write(&env, &mut self.tx, of, off, data)?;
        of.note_written(self.checkpoints_begun, data.len());
        self.dirty_bytes += of.dirty.len().saturating_sub(before) * env.bs;
        if of.dirty.len() * env.bs >= FILE_DIRTY_LIMIT {
            self.dirty_bytes = self.dirty_bytes.saturating_sub(of.dirty.len() * env.bs);
            self.tx.stage_all(of.stage_flush);
            let r = flush_data(&env, &mut self.tx, of, &mut self.scratch);
            self.tx.stage_all(false);
            if let Err(e) = r {
                // The file's state is half pushed through its scheme.
                self.broke(&e);
                return Err(e);
            }
        }
        self.maybe_commit();
        Ok(())
    }
    /// Writes `plain` at `off` of file `ino` as [`Inner::write_ino`] does, storing the run
    /// `sealed` encrypted without the engine lock when its plan still holds for the file
    /// ([`crate::scheme::Scheme::write_sealed`]), and the plaintext through the scheme
    /// otherwise (another scheme by now, or a counter that is no longer fresh: the file was
    /// written, cut or reloaded meanwhile). Either way the result is the write's.
    pub(super) fn write_sealed(
        &mut self,
        ino: u64,
        off: u64,
        plain: &[u8],
        sealed: &Sealed,
    ) -> Result<()> {
        self.check_writable()?;
        self.unsealed.refuse_if_full()?;
        self.ensure_open(ino)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        let bs = env.bs as u64;
        let (first, count) = (off / bs, plain.len() as u64 / bs);
        let end = off + plain.len() as u64;
        if of.inode.scheme != sealed.scheme
            || of.inode.auto
            || of.inode.inline_data.is_some()
            || of.stage_flush
            || sealed.plan.first != first
        {
            return self.write_ino(ino, off, plain);
        }
        check_extent(&env, of, end)?;
        let sch = scheme(of.inode.scheme);
        let mut st = of.state.get();
        let r = (|| {
            if first > st.blocks() {
                // The gap before the run: holes, as a flush makes them.
                sch.resize(&env, &mut st, &mut self.tx, first)?;
            }
            sch.write_sealed(
                &env,
                &mut st,
                &mut self.tx,
                &sealed.plan,
                &sealed.data,
                &sealed.leaves,
            )
        })();
        drop(st);
        match r {
            Err(e) => {
                // The file's state may be half changed.
                self.broke(&e);
                return Err(e);
            }
            Ok(false) => return self.write_ino(ino, off, plain),
            Ok(true) => {}
        }
        self.note_data(ino);
        let of = self.files.get_mut(&ino).expect("opened");
        // Dirty copies of the run's blocks are older than this write.
        let before = of.dirty.len();
        of.dirty.retain(|&b, _| b < first || b >= first + count);
        self.dirty_bytes = self
            .dirty_bytes
            .saturating_sub((before - of.dirty.len()) * bs as usize);
        of.wrote_to(end);
        of.note_written(self.checkpoints_begun, plain.len());
        self.maybe_commit();
        Ok(())
    }

    /// Writes a symlink's target, staged: logged with the request that creates the link,
    /// so that a crash never leaves a link without its target (direct writes of a request
    /// are checked after a crash and may be left out; docs/design.md, "The log").
    pub(super) fn write_target(&mut self, ino: u64, target: &[u8]) -> Result<()> {
        self.write_ino(ino, 0, target)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("written");
        self.tx.stage_all(true);
        let r = flush_data(&env, &mut self.tx, of, &mut self.scratch)
            .and_then(|()| finish_record(&self.keys, &mut self.tx, of, self.ctr_segments));
        self.tx.stage_all(false);
        if let Err(e) = &r {
            self.broke(e);
        }
        r
    }

    pub(super) fn truncate_ino(&mut self, ino: u64, size: u64) -> Result<()> {
        self.check_writable()?;
        self.ensure_open(ino)?;
        if self.files[&ino].inode.size != size {
            self.note_data(ino);
        }
        self.inline_room(ino, size)?;
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        check_extent(&env, of, size)?;
        if size > of.inode.size {
            self.unsealed.refuse_if_full()?;
        }
        let of = self.files.get_mut(&ino).expect("opened");
        if let Err(e) = file_truncate(&env, &mut self.tx, of, size) {
            if e.is_tampered() || matches!(e, Error::Io { .. }) {
                // The file's state may be half cut.
                self.broke(&e);
            }
            return Err(e);
        }
        self.maybe_commit();
        Ok(())
    }
    /// Past the dirty limits, asks for a commit (begun by the front end's request once it
    /// leaves the lock: [`Volume::after_write`]).
    /// Makes blocks `[first, end)` of file `ino` holes through its scheme (dropping any
    /// dirty copies); false when the scheme stores no hole inside a file.
    pub(super) fn punch_blocks(&mut self, ino: u64, first: u64, end: u64) -> Result<bool> {
        self.check_writable()?;
        self.ensure_open(ino)?;
        self.note_data(ino);
        let env = env!(self);
        let of = self.files.get_mut(&ino).expect("opened");
        if let Some(d) = &mut of.inode.inline_data {
            let bs = env.bs as u64;
            let len = d.bytes.len() as u64;
            let (s, e) = (
                first.saturating_mul(bs).min(len),
                end.saturating_mul(bs).min(len),
            );
            d.bytes[s as usize..e as usize].fill(0);
            of.slots_stale = true;
            of.inode.mtime_ns = now_ns();
            of.inode.ctime_ns = of.inode.mtime_ns;
            of.record_dirty = true;
            return Ok(true);
        }
        let sch = scheme(of.inode.scheme);
        // Stored blocks first: a scheme that cannot punch changes nothing.
        let mut st = of.state.get();
        let stored_end = end.min(st.blocks());
        if first < stored_end
            && !sch.punch(&env, &mut st, &mut self.tx, first, stored_end - first)?
        {
            return Ok(false);
        }
        drop(st);
        let before = of.dirty.len();
        of.dirty.retain(|&b, _| b < first || b >= end);
        self.dirty_bytes = self
            .dirty_bytes
            .saturating_sub((before - of.dirty.len()) * env.bs);
        of.inode.mtime_ns = now_ns();
        of.inode.ctime_ns = of.inode.mtime_ns;
        of.record_dirty = true;
        Ok(true)
    }
    pub(super) fn maybe_commit(&mut self) {
        let log = self.wal.as_ref().map_or(0, |w| w.bytes);
        if self.tx.overlay_bytes() >= OVERLAY_LIMIT
            || self.tx.direct_bytes() >= DIRECT_LIMIT
            || self.dirty_bytes >= TOTAL_DIRTY_LIMIT
            || log >= LOG_LIMIT
            || self.records_over(1)
        {
            self.commit_wanted = true;
        }
    }

    /// More than `k` times [`DIRTY_RECORDS`] records past the budget (after the request's
    /// pass over the idle ones).
    pub(super) fn records_over(&self, k: usize) -> bool {
        self.files.len() >= self.records + k * DIRTY_RECORDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemStore, MemTrusted};
    use crate::tree::TreeState;

    fn volume() -> (Volume, u64) {
        let vol = test_volume(Arc::new(MemStore::new()), &MemTrusted::new());
        let ino = vol.create_file("/f", None).unwrap();
        (vol, ino)
    }

    fn blocks(byte: u8, n: usize) -> Vec<u8> {
        (0..n * 4096).map(|i| byte ^ (i / 4096) as u8).collect()
    }

    /// A read returns the file's bytes whatever its offset and length: a run of stored
    /// blocks that starts on a block boundary and fits in the caller's buffer is read in
    /// place (the caller's bytes past the file's end put back), other runs through a
    /// copy, dirty blocks from memory; and it changes nothing past what it returns.
    #[test]
    fn reads_at_any_offset_and_length_return_the_files_bytes() {
        let (vol, ino) = volume();
        let mut model = blocks(7, 6);
        model.truncate(5 * 4096 + 100);
        vol.write_path("/f", 0, &model).unwrap();
        vol.sync().unwrap();
        // One block changed after the seal (dirty, or pushed through the scheme since).
        vol.write_path("/f", 2 * 4096 + 10, &[0xAB; 5000]).unwrap();
        model[2 * 4096 + 10..2 * 4096 + 5010].fill(0xAB);
        let len = model.len() as u64;
        let edges = [
            0u64,
            1,
            4095,
            4096,
            4097,
            8192,
            2 * 4096 + 11,
            3 * 4096,
            4 * 4096,
            5 * 4096,
        ];
        for &off in &edges {
            for n in [1usize, 100, 4095, 4096, 4097, 8192, 3 * 4096 + 1, 7 * 4096] {
                let mut buf = vec![0x5Au8; n];
                let got = vol.read_ino(ino, off, &mut buf).unwrap();
                let want = &model[(off.min(len) as usize)..((off + n as u64).min(len) as usize)];
                assert_eq!(got, want.len(), "length at {off}+{n}");
                assert!(buf[..got] == *want, "bytes at {off}+{n}");
                assert!(
                    buf[got..].iter().all(|&b| b == 0x5A),
                    "past {off}+{n}'s end"
                );
            }
        }
    }

    /// The metadata cache keeps a piece of the inode table exactly as long as the table's
    /// bytes in it (`file_read_shared`), not padded to a whole piece: a record past them
    /// is read again once the table has grown (`Inner::read_raw_record`).
    #[test]
    fn a_table_piece_is_kept_as_long_as_the_table() {
        let vol = test_volume(Arc::new(MemStore::new()), &MemTrusted::new());
        for name in ["/a", "/b", "/c"] {
            vol.create_file(name, None).unwrap();
        }
        vol.sync().unwrap();
        let mut g = vol.shared.lock();
        let id = g.itable.inode.id;
        let size = g.itable.inode.size as usize;
        assert!(
            size > 0 && size < unitcache::TABLE_PIECE,
            "one partial piece: {size}"
        );
        g.units.remove_from(&id, 0);
        g.read_raw_record(ROOT_INO).unwrap();
        assert_eq!(g.units.get(&id, 0).map(|b| b.len()), Some(size));
    }

    /// A file's keys are derived at their first use: looking at its attributes derives
    /// none, reading its data does.
    #[test]
    fn a_stat_derives_no_keys_and_a_read_does() {
        let (store, trusted) = (Arc::new(MemStore::new()), MemTrusted::new());
        let vol = test_volume(store.clone(), &trusted);
        let ino = vol.create_file("/g", None).unwrap();
        vol.write_path("/g", 0, &blocks(2, 2)).unwrap();
        vol.sync().unwrap();
        drop(vol);
        let vol = Volume::open(store, Box::new(trusted), b"pw", &Options::default()).unwrap();
        let derived = |vol: &Volume| {
            let g = vol.shared.lock();
            let derived = g.files.get(&ino).map(|f| f.state.get().keys.derived());
            derived
        };
        assert_eq!(vol.stat("/g").unwrap().size, 2 * 4096);
        assert_eq!(vol.attr(ino).unwrap().size, 2 * 4096);
        // A stat answers from the record: nothing opened, no key derived.
        assert_eq!(derived(&vol), None, "a stat opened the file");
        vol.open_handle(ino).unwrap();
        assert_eq!(
            derived(&vol),
            Some(false),
            "an open derived the file's keys"
        );
        let mut buf = vec![0; 4096];
        vol.read_path("/g", 0, &mut buf).unwrap();
        assert_eq!(derived(&vol), Some(true));
        assert_eq!(buf, blocks(2, 1));
    }

    /// A record whose inline tree does not fit its tree (an inline Merkle node beside more
    /// or fewer than one leaf, an inline mac-tree leaf beside more or fewer than one leaf
    /// counter, or either under the other's scheme) is refused as damaged when it is
    /// loaded; each fitting one loads.
    #[test]
    fn an_inline_tree_that_does_not_fit_its_record_is_refused() {
        let (vol, _) = volume();
        let mut g = vol.shared.lock();
        let keys = Arc::clone(&g.keys);
        let mac = |m: u64| TreeState {
            leaves: m,
            root: crate::scheme::MacTreeState {
                m,
                depth: u8::from(m > 0),
                arity_log2: 6,
                root: m,
            }
            .encode(),
        };
        let merkle = |leaves: u64| TreeState {
            leaves,
            root: [3; 32],
        };
        let cases = [
            (SchemeId::MtEintGcm, merkle(1), true, false, true),
            (SchemeId::MtEintCbc, merkle(1), true, false, true),
            (SchemeId::MtEintGcm, merkle(2), true, false, false),
            (SchemeId::MtEintGcm, merkle(0), true, false, false),
            (SchemeId::Aead, merkle(1), true, false, false),
            (SchemeId::MacTree, mac(1), false, true, true),
            (SchemeId::MacTree, mac(2), false, true, false),
            (SchemeId::MacTree, mac(0), false, true, false),
            (SchemeId::MtEintGcm, merkle(1), false, true, false),
            (SchemeId::MtEintGcm, mac(1), false, true, false),
            (SchemeId::MacTree, mac(1), true, false, false),
        ];
        for (scheme, tree, node, leaf, fits) in cases {
            let mut inode = Inode::new(Kind::File, scheme, [9; 16], tree, 0);
            inode.inline_node = node.then_some([1; 32]);
            inode.inline_mac = leaf.then_some([2; crate::format::MAC_INLINE_LEN]);
            if scheme.uses_counter_intervals() {
                let mut c = crate::tree::CounterIntervals::new();
                c.set_range(0, tree.leaves, 5);
                inode.counters = TrustedCounters::Inline(c);
            }
            let r = OpenFile::load(inode, &keys, &mut g.tx, Subject::Inode(7));
            let what = format!("{scheme:?}, {tree:?}, node {node}, leaf {leaf}");
            match r {
                Ok(_) => assert!(fits, "{what}: loaded"),
                Err(e) => {
                    assert!(!fits, "{what}: {e}");
                    assert!(e.is_tampered(), "{what}: {e}");
                    assert!(e.to_string().contains("inline"), "{what}: {e}");
                }
            }
        }
        // Inline leaves (`inline-tree`): only a GCM tree of as many leaves as the record
        // keeps tags, with counters that leave room for them.
        for (scheme, leaves, tags, intervals, fits) in [
            (SchemeId::MtEintGcm, 3, 3, 1, true),
            (SchemeId::MtEintGcm, 4, 4, 3, true),
            (SchemeId::MtEintGcm, 4, 4, 4, false),
            (SchemeId::MtEintGcm, 4, 3, 1, false),
            (SchemeId::MtEintCbc, 3, 3, 1, false),
        ] {
            let mut inode = Inode::new(Kind::File, scheme, [9; 16], merkle(leaves), 0);
            inode.inline_tags = crate::format::InlineTags::of(&vec![[0; 32]; tags as usize]);
            let mut c = crate::tree::CounterIntervals::new();
            for i in 0..intervals - 1 {
                c.set_range(i, 1, 5 + i % 2);
            }
            c.set_range(
                intervals - 1,
                leaves + 1 - intervals,
                5 + (intervals - 1) % 2,
            );
            assert_eq!(c.intervals() as u64, intervals);
            inode.counters = TrustedCounters::Inline(c);
            let r = OpenFile::load(inode, &keys, &mut g.tx, Subject::Inode(7));
            let what = format!("{scheme:?}, {leaves} leaves, {tags} tags, {intervals} intervals");
            match r {
                Ok(_) => assert!(fits, "{what}: loaded"),
                Err(e) => {
                    assert!(!fits, "{what}: {e}");
                    assert!(
                        e.is_tampered() && e.to_string().contains("inline"),
                        "{what}: {e}"
                    );
                }
            }
        }
    }

    /// A large write planned, sealed without the engine lock and stored: the run (blocks
    /// 4..20 of 24) goes through the scheme at once under the planned counter. An earlier
    /// write into one of its blocks is dropped (older than the run); earlier writes around
    /// it stay. When requests are not logged, those writes wait in memory as dirty blocks,
    /// which is what the run must drop or keep. The file reads back the run and the writes
    /// around it, also after a seal.
    #[test]
    fn a_sealed_write_is_stored_under_its_planned_counter() {
        for all_or_nothing in [false, true] {
            let (vol, ino) = volume();
            let mut want = blocks(1, 24);
            vol.write_ino(ino, 0, &want).unwrap();
            vol.sync().unwrap();
            vol.set_all_or_nothing(all_or_nothing);
            let writes: [(u64, &[u8]); 5] = [
                (100, b"before"),
                (4 * 4096 + 7, b"older, the run's first block"),
                (5 * 4096 + 100, b"older"),
                (19 * 4096 + 4000, b"older, its last"),
                (22 * 4096 + 9, b"after"),
            ];
            for (at, bytes) in writes {
                vol.write_ino(ino, at, bytes).unwrap();
                want[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
            }
            let run = blocks(0x40, 16);
            want[4 * 4096..20 * 4096].copy_from_slice(&run);
            let (sealed, dirty_bytes) = {
                let mut g = vol.shared.lock();
                let waiting = g.files[&ino].dirty.len();
                assert_eq!(waiting, 5 * all_or_nothing as usize);
                let s = g.sealer(ino, 4 * 4096, run.len()).unwrap();
                (s.expect("mt-eint seals"), g.dirty_bytes)
            };
            let ctr = sealed.plan.ctr;
            assert_eq!(sealed.plan.first, 4);
            let sealed = sealed.seal(&run);
            assert_eq!(sealed.leaves.len(), 16);
            {
                let mut g = vol.shared.lock();
                g.write_sealed(ino, 4 * 4096, &run, &sealed).unwrap();
                let of = &g.files[&ino];
                let dirty: Vec<u64> = of.dirty.keys().copied().collect();
                let kept = if all_or_nothing { vec![0, 22] } else { vec![] };
                assert_eq!(dirty, kept, "only the run's dirty block is dropped");
                let dropped = all_or_nothing as usize * 3 * 4096;
                assert_eq!(g.dirty_bytes, dirty_bytes - dropped);
                let st = of.state.peek();
                assert_eq!(st.blocks(), 24);
                assert_eq!(st.ctrs.max_in(4, 16), ctr);
                assert_eq!(st.ctrs.runs(4, 16).count(), 1, "one counter for the run");
            }
            assert_eq!(vol.attr(ino).unwrap().size, want.len() as u64);
            let mut back = vec![0u8; want.len()];
            assert_eq!(vol.read_ino(ino, 0, &mut back).unwrap(), want.len());
            assert!(back == want, "all or nothing {all_or_nothing}");
            vol.sync().unwrap();
            assert_eq!(vol.read_ino(ino, 0, &mut back).unwrap(), want.len());
            assert!(
                back == want,
                "all or nothing {all_or_nothing}: after the seal"
            );
            assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
        }
    }

    /// A sealed run past the end of the file: the gap before it becomes holes (zeros), as a
    /// flush makes them.
    #[test]
    fn a_sealed_write_past_the_end_leaves_holes_before_it() {
        let (vol, ino) = volume();
        let run = blocks(0x20, 16);
        let sealed = vol.shared.lock().sealer(ino, 10 * 4096, run.len()).unwrap();
        let sealed = sealed.expect("mt-eint seals").seal(&run);
        vol.shared
            .lock()
            .write_sealed(ino, 10 * 4096, &run, &sealed)
            .unwrap();
        let mut back = vec![1u8; 26 * 4096];
        assert_eq!(vol.read_ino(ino, 0, &mut back).unwrap(), back.len());
        assert!(back[..10 * 4096].iter().all(|&b| b == 0), "holes");
        assert!(back[10 * 4096..] == run[..]);
        vol.sync().unwrap();
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }

    /// At the volume's entry: writes of [`SEAL_UNLOCKED`] bytes or more are sealed without
    /// the lock (stored at once, nothing left in memory even when requests are not logged),
    /// smaller ones are written as before (left dirty until a flush).
    #[test]
    fn writes_from_the_threshold_on_are_sealed_without_the_lock() {
        let (vol, ino) = volume();
        vol.set_all_or_nothing(true);
        vol.write_ino(ino, 0, &blocks(3, SEAL_UNLOCKED / 4096))
            .unwrap();
        assert!(vol.shared.lock().files[&ino].dirty.is_empty(), "sealed");
        let small = blocks(4, SEAL_UNLOCKED / 4096 - 1);
        vol.write_ino(ino, 0, &small).unwrap();
        let waiting = vol.shared.lock().files[&ino].dirty.len();
        assert_eq!(waiting, small.len() / 4096, "written as before");
    }

    /// A sealed write overtaken between its plan and its storing is stored only if its
    /// counter is still fresh, and otherwise written again from its plaintext: either way
    /// the file holds the later write, and every block's new counter is above every one
    /// the block had (no block stored twice under one counter). Overtaken by a write of
    /// one of its blocks, pushed through the scheme by a seal (it took the plan's counter:
    /// the run is written again, above it), or by a cut of the file (the cut blocks'
    /// counters go to `ctr_hw`, below the plan's).
    #[test]
    fn a_sealed_write_overtaken_by_another_is_written_from_its_plaintext() {
        for cut in [false, true] {
            let (vol, ino) = volume();
            vol.write_ino(ino, 0, &blocks(1, 8)).unwrap();
            vol.sync().unwrap();
            let run = blocks(0x80, 8);
            let sealer = vol.shared.lock().sealer(ino, 0, run.len()).unwrap();
            let sealer = sealer.expect("mt-eint seals");
            let planned = sealer.plan.ctr;
            let sealed = sealer.seal(&run);
            if cut {
                let size = SetAttr {
                    size: Some(4096),
                    ..Default::default()
                };
                vol.setattr(ino, &size).unwrap();
            } else {
                vol.write_ino(ino, 3 * 4096, &[9u8; 4096]).unwrap();
            }
            vol.sync().unwrap();
            let (before, hw) = {
                let g = vol.shared.lock();
                let st = g.files[&ino].state.peek();
                (st.ctrs.clone(), st.ctr_hw)
            };
            if !cut {
                assert_eq!(before.get(3), planned, "the other write took the counter");
            }
            vol.shared
                .lock()
                .write_sealed(ino, 0, &run, &sealed)
                .unwrap();
            vol.sync().unwrap();
            {
                let g = vol.shared.lock();
                let st = g.files[&ino].state.peek();
                for b in 0..8 {
                    let had = if b < before.blocks() {
                        before.get(b)
                    } else {
                        0
                    };
                    let now = st.ctrs.get(b);
                    assert!(now > had.max(hw), "cut {cut}, block {b}: counter {now}");
                    if !cut {
                        assert!(now > planned, "block {b}: written again, above the plan");
                    }
                }
            }
            let mut back = vec![0u8; run.len()];
            assert_eq!(vol.read_ino(ino, 0, &mut back).unwrap(), run.len());
            assert_eq!(back, run, "cut {cut}: the later write");
            assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
        }
    }

    /// Writes the plan cannot take: not whole blocks, too small to be worth it at the
    /// volume's entry (decided by the caller), a scheme that seals in one step.
    #[test]
    fn writes_that_are_not_sealed_without_the_lock() {
        let (vol, ino) = volume();
        let aead = vol.create_file("/a", Some(SchemeId::Aead)).unwrap();
        let auto = vol.create_file("/auto", None).unwrap();
        let mut g = vol.shared.lock();
        g.ensure_open(auto).unwrap();
        g.files.get_mut(&auto).expect("opened").inode.auto = true;
        assert!(
            g.sealer(auto, 0, 8192).unwrap().is_none(),
            "observed by the policy"
        );
        assert!(
            g.sealer(ino, 100, 8192).unwrap().is_none(),
            "unaligned start"
        );
        assert!(g.sealer(ino, 0, 8000).unwrap().is_none(), "partial block");
        assert!(g.sealer(ino, 0, 0).unwrap().is_none(), "nothing");
        assert!(g.sealer(aead, 0, 8192).unwrap().is_none(), "aead");
        assert!(
            g.sealer(ino, u64::MAX - 4095, 4096).unwrap().is_none(),
            "no end"
        );
        let plan = g.sealer(ino, 4096, 8192).unwrap().expect("whole blocks");
        assert_eq!(plan.plan.first, 1);
        drop(g);
        assert_eq!(plan.seal(&[0u8; 8192]).leaves.len(), 2);
    }
}
