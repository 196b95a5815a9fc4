//! Going on after a failed commit (docs/design.md, "A failed commit").
//!
//! A commit can fail for reasons that pass: a full backing file system, a store that
//! returns EIO for a while. The store is then in a state that a crash at that moment
//! would leave, and recovering from every such state is what the crash tests check
//! (docs/design.md, "Crash safety"). So the engine does in place what a reopen would do:
//! it reloads the sealed anchor from the trusted store, stages its journal again if the
//! failed commit sealed before its I/O failed (the next commit applies it; going back
//! writes nothing to the store that just failed but deletions of the discarded changes'
//! own objects, which may fail harmlessly), reserves a fresh range of write counters
//! (the discarded changes may have used counters of the old range with data that reached
//! the store), and reloads the inode table. Nothing sealed is lost, and nothing unsealed
//! is half-kept. What the engine discarded, it reports:
//!
//! - the call that ran the failed commit gets its error; the next fsync (or close) of
//!   each file whose unsealed changes were discarded, and the next [`Volume::sync`] (or
//!   one that waited meanwhile), get [`Error::Lost`] (as Linux reports a writeback error
//!   to the next fsync and syncfs);
//! - the front end hears which inodes to drop from its caches ([`Volume::on_discard`]);
//! - inode numbers that name no file any more (files created since the seal) stay
//!   unused until the front end forgets them, as numbers freed by unlink do, so that a
//!   kernel still holding one never reaches another file through it.
//!
//! One case is refused: a number freed *and given to a new file* since the seal, while
//! the sealed state still has the old file there. The front end may hold either; no
//! answer is safe, and the volume must be remounted (it is poisoned, as before).

use super::{Inner, CTR_RESERVATION};
use crate::error::{Error, Failure, Result, Subject};
use crate::format::{Anchor, Kind};
use crate::tx::load_journal;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Bytes written (then deleted) to learn whether the store has room again.
const PROBE_LEN: usize = 1 << 20;
/// The object of that probe (outside `f/`, so never taken for an orphan).
const PROBE_NAME: &str = "probe.space";

/// What the engine tracks to undo and report a failed commit.
#[derive(Default)]
pub(super) struct Unsealed {
    /// Inode numbers given to or taken from a file (visible to the front end) by changes
    /// not sealed yet: the commit holding the latest change, and whether one of the
    /// changes gave the number to a new file.
    reborn: HashMap<u64, (u64, bool)>,
    /// Inodes whose latest change is in a commit that has not ended, with its number.
    /// With the log, also the ticket of the inode's first logged change since it was last
    /// not pending ([`wal::LogIo`]): a change whose record failed to be written was
    /// reported to its request, and is not reported again.
    pending: HashMap<u64, (u64, Option<u64>)>,
    /// The first ticket of the log's records whose write failed, when going back follows
    /// that failure ([`Inner::take_log_failure`]).
    log_failed_from: Option<u64>,
    /// Inodes whose unsealed changes a failed commit discarded: reported once by the next
    /// fsync or close of each.
    lost: HashMap<u64, Failure>,
    /// Numbers of files a failed commit discarded (among [`Inner::stale`]): requests the
    /// front end still sends for them get the failure, not ENOENT (a program writing to a
    /// file that a full disk discarded hears ENOSPC).
    discarded: HashMap<u64, Failure>,
    /// Going-backs that discarded something, and the last one's failure. A
    /// [`Volume::sync`] reports it when one happened since the last report, or during the
    /// call (another caller may have taken the report meanwhile).
    generation: u64,
    reported: u64,
    last: Option<Failure>,
    /// A request failed halfway through pushing a file through its scheme (a store error
    /// while flushing at the file's dirty limit): the engine goes back to the last seal
    /// before the next request ([`Inner::mend`]), once no commit is in flight.
    broken: Option<Failure>,
    /// The journal the anchor names may not be applied in the store (staged again by a
    /// going back, until the next commit seals): a later going back stages it too.
    unapplied: bool,
    /// A commit failed for want of space and the store still had none after going back:
    /// writes that add data are refused at once (ENOSPC) instead of being accepted and
    /// lost at the next seal, until a seal succeeds or a probe finds room.
    /// Shared with [`Volume`], which reads it without the engine lock.
    full: Arc<AtomicBool>,
    /// Told what was discarded.
    hook: Option<DiscardHook>,
    /// Objects the discarded changes created: deleted once the sealed state is reloaded,
    /// unless it names them (a seal of the log that landed covers files created since the
    /// checkpoint).
    doomed: Vec<String>,
}

/// An inode whose cached state a front end must drop after a failed commit: its data and
/// attributes, and the name it had (parent, name), if the engine knew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discarded {
    /// The inode.
    pub ino: u64,
    /// Its directory entry in the discarded state.
    pub entry: Option<(u64, String)>,
}

/// Called, on a thread of its own, with what a failed commit discarded.
pub type DiscardHook = Arc<dyn Fn(Vec<Discarded>) + Send + Sync>;

impl Unsealed {
    /// Inode `ino` was given to a new file (`born`) or freed, in commit `n`.
    pub(super) fn reborn(&mut self, ino: u64, n: u64, born: bool) {
        let e = self.reborn.entry(ino).or_insert((n, false));
        e.0 = e.0.max(n);
        e.1 |= born;
    }

    /// Inode `ino` has changes in commit `n`.
    /// `ticket`: the log group's that holds the change, if logged.
    pub(super) fn pending(&mut self, ino: u64, n: u64, ticket: Option<u64>) {
        let e = self.pending.entry(ino).or_insert((n, ticket));
        e.0 = n;
    }

    /// Commit `n` sealed and was applied: what it held is no longer at risk.
    pub(super) fn applied(&mut self, n: u64) {
        self.unapplied = false;
        self.sealed(n);
    }

    /// A commit wrote to the store and sealed: it had room.
    pub(super) fn had_room(&mut self) {
        self.full.store(false, Ordering::Relaxed);
    }

    /// The flag of [`Unsealed::full`], for [`Volume::is_full`].
    pub(super) fn full_flag(&self) -> Arc<AtomicBool> {
        self.full.clone()
    }

    /// A write that adds data: refused while the store is full.
    pub(super) fn refuse_if_full(&self) -> Result<()> {
        if self.full.load(Ordering::Relaxed) {
            return Err(Error::io(
                "the store (full since a commit failed for want of space; free some)",
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        Ok(())
    }

    /// A seal of the log, number `n`, ended: what was logged before it began is sealed
    /// (a journal staged by a going back is still not applied).
    pub(super) fn log_sealed(&mut self, n: u64) {
        self.sealed(n);
    }

    /// Seal number `n` stored its anchor, and then failed.
    pub(super) fn seal_ended(&mut self, n: u64) {
        self.sealed(n);
    }

    /// Commit `n` sealed: what it held is no longer at risk.
    fn sealed(&mut self, n: u64) {
        self.reborn.retain(|_, e| e.0 > n);
        self.pending.retain(|_, c| c.0 > n);
    }

    /// Takes the discarded changes of `ino`, reported as an error once.
    pub(super) fn take_lost(&mut self, ino: u64, what: impl FnOnce() -> String) -> Result<()> {
        match self.lost.remove(&ino) {
            Some(f) => Err(f.lost(what())),
            None => Ok(()),
        }
    }

    /// The error for a request on `ino`, if a failed commit discarded its file.
    pub(super) fn discarded(&self, ino: u64) -> Option<Error> {
        self.discarded
            .get(&ino)
            .map(|f| f.lost(format!("inode {ino} (a file created since the last seal)")))
    }

    /// The front end forgot `ino`.
    pub(super) fn forget(&mut self, ino: u64) {
        self.discarded.remove(&ino);
    }

    /// The log's records from ticket `from` on failed to be written: the next going back
    /// follows from that.
    pub(super) fn log_failed(&mut self, from: u64) {
        self.log_failed_from = Some(from);
    }

    /// The failure of a [`Volume::sync`] is reported by it: not again by the next.
    pub(super) fn reported(&mut self) {
        self.reported = self.generation;
    }

    /// Going-backs that discarded something so far (see [`Unsealed::report`]).
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// For a [`Volume::sync`] that began at `generation`: an error if changes were
    /// discarded since the last report or during the call; either way, reported now.
    pub(super) fn report(&mut self, generation: u64) -> Result<()> {
        let unreported = self.reported != self.generation || generation != self.generation;
        self.reported = self.generation;
        match &self.last {
            Some(f) if unreported => Err(f.lost("the volume")),
            _ => Ok(()),
        }
    }

    pub(super) fn set_hook(&mut self, hook: DiscardHook) {
        self.hook = Some(hook);
    }
}

impl Inner {
    /// A commit failed with `cause` (`flight`: the commit whose I/O failed; `None` when
    /// its locked phase did). Goes back to the last seal and records what was lost, or
    /// poisons the volume when even that fails. Waiters hear of the loss through what
    /// was lost: the per-file reports ([`Volume::fsync`]) and the volume's generation
    /// ([`Volume::sync`]).
    pub(super) fn commit_failed(&mut self, cause: &Error) {
        self.go_back(Failure::of(cause));
    }

    /// A request failed with `cause` after changing the engine's state halfway: see
    /// [`Unsealed::broken`].
    pub(super) fn broke(&mut self, cause: &Error) {
        self.unsealed.broken = Some(Failure::of(cause));
    }

    /// Whether [`Inner::mend`] must run before the next request.
    pub(super) fn is_broken(&self) -> bool {
        self.unsealed.broken.is_some()
    }

    /// The error for a request on `ino`, if it is a number whose file a failed commit
    /// discarded and the front end has not forgotten yet.
    pub(super) fn discarded(&self, ino: u64) -> Option<Error> {
        self.stale
            .contains(&ino)
            .then(|| self.unsealed.discarded(ino))
            .flatten()
    }

    /// Whether the store takes [`PROBE_LEN`] more bytes (written, then deleted).
    pub(super) fn store_has_room(&self) -> bool {
        let room = self
            .store
            .write_at(PROBE_NAME, 0, &vec![0u8; PROBE_LEN])
            .and_then(|()| self.store.sync(&[PROBE_NAME.to_string()]))
            .is_ok();
        let _ = self.store.delete(PROBE_NAME);
        room
    }

    /// While the store is full, finds whether it has room again (the periodic seal asks).
    pub(super) fn probe_if_full(&mut self) {
        if self.unsealed.full.load(Ordering::Relaxed) && self.store_has_room() {
            tracing::info!("the store has room again: writes are accepted");
            self.unsealed.had_room();
        }
    }

    /// Goes back to the last seal after [`Inner::broke`] (no commit may be in flight).
    pub(super) fn mend(&mut self) {
        debug_assert!(!self.sealing(), "a seal is in flight");
        if let Some(f) = self.unsealed.broken.take() {
            self.go_back(f);
        }
    }

    fn go_back(&mut self, f: Failure) {
        // No read that runs without the engine lock may see the store go back under it.
        let readers = Arc::clone(&self.readers);
        let _quiet = readers.write().unwrap_or_else(|p| p.into_inner());
        self.unsealed.broken = None;
        // A failed write of the log left its segment's tail unknown: a new one starts.
        let _ = self.take_log_failure();
        let created = self.tx.created();
        self.tx.abandon();
        // Units read since may hold what the abandoned changes wrote.
        self.units.clear();
        if f.crashed {
            self.poisoned = Some(f.cause);
            return;
        }
        match self.back_to_seal(&f, created) {
            Ok(discarded) => {
                if f.errno == Some(libc::ENOSPC) && !self.store_has_room() {
                    self.unsealed.full.store(true, Ordering::Relaxed);
                }
                tracing::warn!(
                    error = %f.cause,
                    inodes = discarded.len(),
                    epoch = self.anchor.epoch,
                    "a commit failed: went back to the last seal and goes on"
                );
                if !discarded.is_empty() {
                    self.unsealed.generation += 1;
                    self.unsealed.last = Some(f);
                }
                if let Some(hook) = self.unsealed.hook.clone() {
                    if !discarded.is_empty() {
                        let _ = std::thread::Builder::new()
                            .name("intact-discard".into())
                            .spawn(move || hook(discarded));
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "going back to the last seal failed");
                self.poisoned = Some(format!(
                    "{}; going back to the last seal failed too: {e}",
                    f.cause
                ));
            }
        }
    }

    /// The reopen in place of the module docs, each step tried again after a store error
    /// (a store that failed once may fail again at once). `orphans`: the objects the
    /// discarded transaction created. Returns the inodes the front end must drop.
    fn back_to_seal(&mut self, f: &Failure, orphans: Vec<String>) -> Result<Vec<Discarded>> {
        let mut attempt = None;
        retry(|| self.settle(&orphans, &mut attempt))?;
        // What the front end must drop, before the state that knows it goes. Logged
        // changes are pending until a seal covers them; without the log, whatever is dirty
        // was never sealed.
        // A change whose log record failed was reported to its request: an inode whose
        // every unsealed change is such is not reported again.
        let failed_from = self.unsealed.log_failed_from.take();
        let mut lost: Vec<u64> = self
            .unsealed
            .pending
            .iter()
            .filter(|(_, (_, first))| match (failed_from, first) {
                (Some(from), Some(t)) => *t < from,
                _ => true,
            })
            .map(|(&i, _)| i)
            .collect();
        if !self.logging() {
            lost.extend(
                self.files
                    .iter()
                    .filter(|(_, of)| of.is_dirty() && of.inode.kind != Kind::Xattr)
                    .map(|(i, _)| *i),
            );
        }
        lost.sort_unstable();
        lost.dedup();
        let reborn = std::mem::take(&mut self.unsealed.reborn);
        let names = std::mem::take(&mut self.names);
        self.files.clear();
        self.unsealed.pending.clear();
        retry(|| self.reload(&reborn, f))?;
        for &ino in &lost {
            if !self.stale.contains(&ino) {
                self.unsealed.lost.insert(ino, f.clone());
            }
        }
        let mut out: Vec<Discarded> = lost
            .iter()
            .chain(reborn.keys())
            .map(|&ino| Discarded {
                ino,
                entry: names.get(&ino).cloned(),
            })
            .collect();
        out.sort_by_key(|d| d.ino);
        out.dedup_by_key(|d| d.ino);
        Ok(out)
    }

    /// Step 1: the trusted state. Adopts the anchor of a seal whose store call failed after
    /// it landed (only what came after that seal began is lost then), reserves fresh
    /// counters under a new epoch (the commit point: after it the engine's anchor is the
    /// new one), and notes the discarded objects. `attempt`: the anchor an earlier try
    /// stored, if its store call failed (it may have landed all the same).
    fn settle(&mut self, orphans: &[String], attempt: &mut Option<Attempt>) -> Result<()> {
        let bytes = self.trusted.load()?.ok_or_else(|| {
            Error::AnchorCorrupt("the trusted anchor disappeared while the volume was open".into())
        })?;
        if let Some(a) = attempt.take().filter(|a| a.bytes == bytes) {
            // An earlier try's anchor landed although its store call failed.
            self.settled(a);
            return Ok(());
        }
        let mut anchor = Anchor::decode(&bytes, &self.keys.anchor)?;
        if anchor.volume_id != self.anchor.volume_id {
            return Err(Error::AnchorCorrupt(
                "the trusted anchor changed under the open volume".into(),
            ));
        }
        // The trusted store holds the last anchor stored, or the one a failed store call
        // tried to store: then that seal happened, and the journal of a checkpoint among
        // them may not be applied.
        match self.sealer.landed(&bytes) {
            Some((_, n)) => self.unsealed.sealed(n),
            None if anchor == self.sealer.last() => {}
            None => {
                return Err(Error::AnchorCorrupt(
                    "the trusted anchor changed under the open volume".into(),
                ))
            }
        }
        let orphans = orphans.to_vec();
        self.tx.abandon();
        self.unsealed.unapplied = anchor.journal.is_some() && !anchor.applied;
        if self.unsealed.unapplied {
            // The journal's changes are staged again, for the next commit to apply:
            // nothing here writes the store that just failed.
            if let Some(j) = &anchor.journal {
                let jb = load_journal(self.store.as_ref(), &self.keys.journal, j)?;
                self.tx.stage_unapplied(&jb)?;
            }
        }
        // Every counter this session used is below the reservation's end; the discarded
        // changes may have stored data under some of them, so none is used again.
        let floor = self.anchor.ctr_next.max(anchor.ctr_next);
        anchor.ctr_next = floor
            .checked_add(CTR_RESERVATION)
            .ok_or_else(|| Error::Invalid("write counters exhausted".into()))?;
        anchor.epoch += 1;
        // Records logged after the last seal are discarded: a crash before the next seal
        // must not replay them (docs/design.md, "The log").
        if let Some(l) = &mut anchor.log {
            l.tail = false;
        }
        let a = Attempt {
            bytes: anchor.encode(&self.keys.anchor),
            anchor,
            floor,
            orphans,
        };
        if let Err(e) = self.trusted.store(&a.bytes) {
            *attempt = Some(a);
            return Err(e);
        }
        self.settled(a);
        Ok(())
    }

    /// Objects of a failed seal's commit (new files written directly): deleted by the
    /// next going back unless the state it reloads names them.
    pub(super) fn doom_created(&mut self, created: &[String]) {
        self.unsealed.doomed.extend(created.iter().cloned());
    }

    /// The new anchor is stored: it becomes the engine's, and the discarded objects go.
    fn settled(&mut self, a: Attempt) {
        self.sealer.reset(a.anchor.clone());
        self.anchor = a.anchor;
        self.ctr_floor = a.floor;
        let sealed_end = self.anchor.log.map(|l| l.sealed.end);
        if let Some(w) = &mut self.wal {
            // New segments get ids of the new reservation. The segment appended to goes on
            // (it has room set aside, which a full disk may not give a new one), after a
            // record that voids what was discarded; if an append to it failed, its tail
            // is unknown and a new segment starts after the sealed end.
            w.next_seg = a.floor;
            match (&w.writer, sealed_end) {
                (Some(_), Some(end)) if w.end > end => w.void = Some((end, w.end)),
                (Some(_), Some(_)) => {}
                _ => w.writer = None,
            }
        }
        self.unsealed.doomed.extend(a.orphans);
        // A going back: the records it discarded are no data item's base.
        if let Some(b) = &mut self.log_bases {
            b.clear();
        }
    }

    /// Step 2: the sealed inode table, as an open loads it; `reborn` (the numbers whose
    /// file changed since the seal) says which numbers to hide from the front end.
    fn reload(&mut self, reborn: &HashMap<u64, (u64, bool)>, f: &Failure) -> Result<()> {
        self.cache.clear();
        self.units.clear();
        self.files.clear();
        self.itable = super::OpenFile::load(
            self.anchor.itable.clone(),
            &self.keys,
            &mut self.tx,
            Subject::InodeTable,
        )?;
        self.header = self.read_header()?;
        self.header_dirty = false;
        self.logged_header = self.header;
        self.changes = Default::default();
        // What a seal covered in the log since the checkpoint, as an open replays it.
        let (end, segments, _) = self.replay_anchored_log(true)?;
        self.logged_header = self.header;
        if let Some(w) = &mut self.wal {
            if w.writer.is_none() {
                w.end = end;
                w.synced = end;
            }
            for s in segments {
                if !w.segments.contains(&s) {
                    w.segments.push(s);
                }
            }
            w.segments.sort_unstable();
        }
        self.dirty_bytes = 0;
        self.commit_wanted = false;
        // Numbers that name no file now are hidden until forgotten; numbers whose file is
        // back are visible again.
        for (&ino, &(_, born)) in reborn {
            let free = !self.files.contains_key(&ino)
                && (ino >= self.header.count || self.read_record(ino)?.kind == Kind::Free);
            if free {
                self.stale.insert(ino);
                self.unsealed.discarded.insert(ino, f.clone());
            } else if born {
                return Err(Error::Invalid(format!(
                    "inode {ino} was freed and given to a new file since the last seal; \
                     remount to go on"
                )));
            } else {
                self.stale.remove(&ino);
                self.unsealed.discarded.remove(&ino);
            }
        }
        let live: std::collections::HashSet<&str> = self
            .files
            .values()
            .flat_map(|of| {
                let n = &of.state.names;
                n.all().map(String::as_str)
            })
            .collect();
        for name in std::mem::take(&mut self.unsealed.doomed) {
            if live.contains(name.as_str()) {
                continue;
            }
            if let Err(e) = self.store.delete(&name) {
                tracing::warn!(object = %name, error = %e, "cannot delete an orphan object");
            }
        }
        let stale = &self.stale;
        self.handles.retain(|ino, _| !stale.contains(ino));
        // Files unlinked while open are kept open (a FORGET frees them; see `forget`).
        let mut u = self.header.unlinked_head;
        for _ in 0..=self.header.count {
            if u == 0 {
                break;
            }
            u = self.open_ino(u)?.inode.link;
        }
        Ok(())
    }
}

/// A new anchor that going back tried to store.
struct Attempt {
    bytes: Vec<u8>,
    anchor: Anchor,
    floor: u64,
    orphans: Vec<String>,
}

/// Runs `f` up to three times while it fails with a store error, pausing between tries.
fn retry(mut f: impl FnMut() -> Result<()>) -> Result<()> {
    let mut r = f();
    for pause_ms in [10, 100] {
        match &r {
            Err(Error::Io { .. }) => {
                std::thread::sleep(std::time::Duration::from_millis(pause_ms));
                r = f();
            }
            _ => break,
        }
    }
    r
}
