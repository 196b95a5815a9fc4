//! Seals: the three phases of a commit (docs/design.md, "Commits in flight"), group
//! commit for sync and fsync, and the dirty limits.

#[allow(unused_imports)]
use super::*;

/// A seal between its phases (docs/design.md, "Commits in flight" and "The log"): what its
/// I/O needs, taken under the engine lock by [`Inner::commit_begin`] (a checkpoint) or
/// [`Inner::log_seal_begin`] (a seal of the log only). A checkpoint and a seal of the log
/// may be in flight at the same time; each composes its anchor from the last one stored
/// ([`sealer::Sealer`]).
pub(super) struct InFlight {
    /// Its number (see [`Inner::commits_begun`]).
    pub(super) n: u64,
    /// A checkpoint's commit (`None`: a seal of the log).
    pub(super) commit: Option<Commit>,
    /// A checkpoint's inode-table record.
    pub(super) itable: Option<Inode>,
    /// Log segments to sync before the anchor is stored.
    pub(super) log_sync: Vec<String>,
    /// Log segments a checkpoint folds in: deleted once it is applied.
    pub(super) obsolete: Vec<String>,
    /// A seal of the log: where the sealed log ends; a checkpoint: where the log it
    /// rolled begins.
    pub(super) log_end: Option<crate::wal::LogPos>,
    /// The log's records to be written before it is synced: every one queued when the
    /// seal began ([`Inner::log_wait`]).
    pub(super) log_wait: Option<(Arc<crate::wal::LogIo>, u64)>,
    pub(super) journal_key: SubKey,
    pub(super) store: Arc<dyn UntrustedStore>,
    pub(super) sealer: Arc<sealer::Sealer>,
}

impl InFlight {
    /// Phase B, without the engine lock: a checkpoint's direct writes and journal made
    /// durable, the log's new records made durable, the anchor sealed, the journal applied
    /// in place; returns the sealed anchor. The order is the crash-safety argument of
    /// docs/design.md: nothing the anchor names can be missing when it is sealed, and
    /// nothing is overwritten in place before the journal holding it is sealed.
    pub(super) fn run(&self) -> Result<Anchor> {
        let (anchor, bytes) = match &self.commit {
            Some(c) => {
                let journal = c.write_journal(self.store.as_ref(), &self.journal_key)?;
                self.sync_log()?;
                let itable = self.itable.clone().expect("a checkpoint's record");
                let start = self.log_end;
                let (anchor, bytes) = self.sealer.store(self.n, |a| {
                    a.journal = journal;
                    a.applied = false;
                    a.itable = itable;
                    if let Some(start) = start {
                        // A seal of the log may have sealed past the new start already.
                        let end = a.log.map_or(start, |l| l.sealed.end.max(start));
                        a.log = Some(AnchorLog {
                            sealed: crate::wal::LogRef { start, end },
                            tail: true,
                        });
                    }
                })?;
                c.apply(self.store.as_ref())?;
                let done = if journal.is_some() {
                    // Applied in full: a reopen must not replay it (appends made to its
                    // objects from now on lie past the lengths it sets).
                    self.sealer.store(self.n, |a| {
                        if a.journal == journal {
                            a.applied = true;
                        }
                    })?
                } else {
                    (anchor, bytes)
                };
                for name in &self.obsolete {
                    if let Err(e) = self.store.delete(name) {
                        tracing::warn!(object = %name, error = %e, "cannot delete an old log segment");
                    }
                }
                done
            }
            None => {
                self.sync_log()?;
                let target = self.log_end.expect("a seal of the log's end");
                self.sealer.store(self.n, |a| {
                    if let Some(l) = &mut a.log {
                        l.sealed.end = l.sealed.end.max(target);
                        l.tail = true;
                    }
                })?
            }
        };
        // The untrusted copy (for `recover-anchor` only) is written in place and not
        // synced: it never protects anything, and a lost or torn copy fails its MAC.
        self.store.write_at(ANCHOR_COPY_NAME, 0, &bytes)?;
        Ok(anchor)
    }

    /// Syncs the log segments the anchor will name; one a checkpoint folded in (and
    /// deleted) meanwhile needs nothing.
    fn sync_log(&self) -> Result<()> {
        if let Some((io, ticket)) = &self.log_wait {
            crate::metrics::timed(Phase::StoreWait, || io.flush_through(*ticket))?;
        }
        if self.log_sync.is_empty() {
            return Ok(());
        }
        crate::metrics::timed(Phase::StoreWait, || match self.store.sync(&self.log_sync) {
            Ok(()) => Ok(()),
            Err(e) => {
                let mut gone = false;
                for name in &self.log_sync {
                    match self.store.len(name)? {
                        Some(_) => self.store.sync(std::slice::from_ref(name))?,
                        None => gone = true,
                    }
                }
                if gone {
                    Ok(())
                } else {
                    Err(e)
                }
            }
        })
    }
}

impl Inner {
    /// Whether a seal (a checkpoint or a seal of the log) is in flight.
    pub(super) fn sealing(&self) -> bool {
        self.checkpointing || self.log_sealing
    }

    /// A whole commit, synchronously, under the lock (opening, closing, and work that
    /// needs no commit in flight; see [`Volume::idle`]).
    pub(super) fn commit(&mut self) -> Result<()> {
        debug_assert!(!self.sealing(), "a seal is in flight");
        match self.commit_begin()? {
            None => Ok(()),
            Some(f) => {
                let r = f.run();
                self.commit_end(&f, r)
            }
        }
    }
    /// Phase A of a commit, under the lock: flushes every dirty file through its scheme,
    /// writes the records and the inode table, and takes the result out of the
    /// transaction with the anchor that will seal it. `None`: nothing to seal. On an
    /// error the engine goes back to the last seal ([`recover`]).
    pub(super) fn commit_begin(&mut self) -> Result<Option<InFlight>> {
        if self.read_only {
            return Ok(None);
        }
        debug_assert!(!self.checkpointing, "a checkpoint is in flight");
        if self.is_broken() {
            debug_assert!(!self.sealing(), "going back with a seal in flight");
            // A half-updated file is never sealed: back to the last seal first.
            self.mend();
            if let Some(why) = &self.poisoned {
                return Err(Error::Poisoned(why.clone()));
            }
        }
        let metrics = self.metrics.clone();
        let _a = Account::with_phase(&metrics, Phase::Root);
        let staged = self.tx.overlay_bytes() + self.dirty_bytes;
        let r = self.commit_prepare();
        self.dirty_bytes = 0;
        self.commit_wanted = false;
        match r {
            Ok(Some((commit, anchor, start, log_sync, obsolete))) => {
                self.commits_begun += 1;
                self.checkpointing = true;
                self.checkpoints_begun += 1;
                self.drain.begin(staged);
                Ok(Some(InFlight {
                    n: self.commits_begun,
                    commit: Some(commit),
                    itable: Some(anchor.itable),
                    log_sync,
                    obsolete,
                    log_end: start,
                    log_wait: self.log_wait(),
                    journal_key: self.keys.journal.clone(),
                    store: self.store.clone(),
                    sealer: self.sealer.clone(),
                }))
            }
            Ok(None) => {
                self.commits_begun += 1;
                self.commits_ended = self.commits_ended.max(self.commits_begun);
                self.checkpoints_ended = self.commits_begun;
                if !self.sealing() {
                    self.unsealed.applied(self.commits_begun);
                }
                Ok(None)
            }
            Err(e) => {
                if self.sealing() {
                    // A seal of the log is in flight: it ends first, then the next
                    // request goes back.
                    self.broke(&e);
                } else {
                    self.commit_failed(&e);
                }
                Err(e)
            }
        }
    }
    /// Phase C of a commit, under the lock, once its I/O ([`InFlight::run`]) returned `r`:
    /// the sealed anchor becomes the engine's, or the engine goes back to the last seal.
    pub(super) fn commit_end(&mut self, f: &InFlight, r: Result<Anchor>) -> Result<()> {
        if let Some(c) = &f.commit {
            self.tx.end_commit(c);
            self.checkpointing = false;
            self.drain.end(r.is_ok());
        } else {
            self.log_sealing = false;
        }
        self.commits_ended = self.commits_ended.max(f.n);
        // The anchor as the trusted store holds it (another seal may have stored one
        // after this one's).
        self.anchor = self.sealer.last();
        match r {
            Ok(_) => {
                if f.commit.is_some() {
                    self.checkpoints_ended = self.checkpoints_ended.max(f.n);
                    self.checkpointed_at = std::time::Instant::now();
                    self.unsealed.applied(f.n);
                    // Everything written directly before the checkpoint began is synced.
                    if let Some(cut) = f.log_end {
                        for of in self.files.values_mut() {
                            if of.unsynced_since.is_some_and(|p| p < cut) {
                                of.unsynced_since = None;
                            }
                        }
                    }
                } else {
                    self.unsealed.log_sealed(f.n);
                }
                if let (Some(w), Some(end)) = (self.wal.as_mut(), f.log_end) {
                    w.synced = w.synced.max(end);
                }
                self.unsealed.had_room();
                Ok(())
            }
            Err(e) => {
                if self.sealer.stored_by(f.n) {
                    // Its anchor landed, then its I/O failed (applying the journal, the
                    // anchor's copy): what it sealed is sealed.
                    self.unsealed.seal_ended(f.n);
                } else if let Some(c) = &f.commit {
                    self.doom_created(c.created());
                }
                if self.sealing() {
                    // The other seal in flight ends first; the next request goes back.
                    self.broke(&e);
                } else {
                    self.commit_failed(&e);
                }
                Err(e)
            }
        }
    }
    #[allow(clippy::type_complexity)]
    pub(super) fn commit_prepare(
        &mut self,
    ) -> Result<
        Option<(
            Commit,
            Anchor,
            Option<crate::wal::LogPos>,
            Vec<String>,
            Vec<String>,
        )>,
    > {
        // A checkpoint holds everything: fsyncs waiting for a log seal are served by it.
        self.changes.synced.clear();
        self.apply_auto_policy()?;
        // 1. Directory contents, then file data, then records into the inode table.
        let mut dirty: Vec<u64> = self
            .files
            .iter()
            .filter(|(_, f)| f.is_dirty())
            .map(|(i, _)| *i)
            .collect();
        // In order of number: the records go into the table in order, so that a piece
        // the table grows into is kept whole in the metadata cache
        // (`Inner::write_raw_record`).
        dirty.sort_unstable();
        let this_commit = self.commits_begun + 1;
        for ino in dirty {
            self.settle_slots(ino)?;
            let env = env!(self);
            self.unsealed.pending(ino, this_commit, None);
            let of = self.files.get_mut(&ino).expect("listed");
            of.sealed_by = this_commit;
            if of.dir_dirty {
                let bytes = encode_dir(of.dir.as_ref().expect("dirty dir is loaded"));
                file_write(&env, &mut self.tx, of, 0, &bytes)?;
                file_truncate(&env, &mut self.tx, of, bytes.len() as u64)?;
                of.dir_dirty = false;
            }
            if of.xattrs_dirty {
                let bytes = encode_xattrs(&of.xattrs.as_ref().expect("dirty set is loaded").map);
                file_write(&env, &mut self.tx, of, 0, &bytes)?;
                file_truncate(&env, &mut self.tx, of, bytes.len() as u64)?;
                of.xattrs_dirty = false;
            }
            flush_data(&env, &mut self.tx, of, &mut self.scratch)?;
            finish_record(&self.keys, &mut self.tx, of, self.ctr_segments)?;
            of.record_dirty = false;
            of.stage_flush = false;
            let rec = of.inode.clone();
            self.write_record(ino, &rec)?;
        }
        if self.header_dirty {
            self.write_header()?;
            self.header_dirty = false;
        }
        // 2. The inode table itself.
        let env = env!(self);
        flush_data(&env, &mut self.tx, &mut self.itable, &mut self.scratch)?;
        finish_record(
            &self.keys,
            &mut self.tx,
            &mut self.itable,
            self.ctr_segments,
        )?;
        if !self.tx.is_dirty() && self.itable.inode == self.anchor.itable {
            self.forget_changes();
            return Ok(None);
        }
        // 3. The log starts again after the checkpoint, which holds all of it (before the
        // transaction is taken: a failure here leaves it as it was).
        let (start, log_sync, obsolete) = self.roll_for_checkpoint()?;
        // 4. The journal and the anchor that seals it; the I/O is [`InFlight::run`].
        let epoch = self.anchor.epoch + 1;
        let commit = self
            .tx
            .begin_commit(epoch, self.anchor.journal.map(|j| j.slot))?;
        // The journal's reference is filled in by [`InFlight::run`]; the engine takes the
        // sealed anchor at [`Inner::commit_end`] (the next commit begins after that).
        let anchor = Anchor {
            volume_id: self.anchor.volume_id,
            epoch,
            ctr_next: self.anchor.ctr_next,
            journal: None,
            applied: false,
            log: match start {
                Some(start) => Some(AnchorLog {
                    sealed: crate::wal::LogRef { start, end: start },
                    tail: true,
                }),
                None => self.anchor.log,
            },
            itable: self.itable.inode.clone(),
        };
        // What this phase wrote is the checkpoint's, not a request's: not logged.
        self.forget_changes();
        if self.files.len() > self.records {
            // Directories, and files unlinked while referenced (`forget` finds them here
            // without reading their record), and files a read holds (it runs without the
            // engine lock: a second record of the file must not appear beside it). Every
            // state is clean at this point.
            let mut dropped = Vec::new();
            self.files.retain(|_, f| {
                let keep = f.inode.kind == Kind::Dir || f.inode.nlink == 0 || f.state.is_shared();
                if !keep {
                    dropped.push(f.inode.id);
                }
                keep
            });
            self.metrics.forget_files(&dropped);
            self.evict_at = self.next_eviction();
        }
        Ok(Some((commit, anchor, start, log_sync, obsolete)))
    }
}

impl Volume {
    /// Seals everything written so far: after this returns, a crash loses none of it,
    /// and a rollback of any of it is detected. Concurrent calls share seals (group
    /// commit), and the seal's I/O runs without the engine's lock, so requests on other
    /// files go on meanwhile (docs/design.md, "Commits").
    ///
    /// If a commit failed since the last call (its changes were discarded: see
    /// [`Error::Lost`]), this call reports it, once, as syncfs(2) reports writeback errors.
    pub fn sync(&self) -> Result<()> {
        self.reporting(|| self.seal())
    }
    /// Runs `seal`, then reports, once, changes discarded since the call began (or the
    /// seal's own failure), as syncfs(2) reports writeback errors.
    fn reporting(&self, seal: impl FnOnce() -> Result<()>) -> Result<()> {
        let generation = self.shared.lock().unsealed.generation();
        let r = seal();
        let mut g = self.shared.lock();
        if r.is_err() {
            g.unsealed.reported();
            return r;
        }
        // Also when changes made before this call were discarded while it waited, even if
        // another caller took the report.
        g.unsealed.report(generation)
    }
    /// [`Volume::sync`] without the report of earlier failures: a checkpoint.
    pub fn seal(&self) -> Result<()> {
        let mut g = self.lock()?;
        if g.read_only {
            return Ok(());
        }
        g.probe_if_full();
        // A seal in flight began before this call and may miss what it must seal.
        let need = g.commits_begun + 1;
        self.note(self.seal_until(g, need, true))
    }

    /// [`Volume::sync`]'s guarantee by a seal of the log instead of a checkpoint (what
    /// an fsync of a directory and `intact sync` ask for): every file's data written
    /// directly and not yet synced (appends, twin writes) is synced, then the log is
    /// sealed in the anchor. After it returns a crash loses nothing written before, and a
    /// rollback of any of it is detected, as after a checkpoint; the checkpoint that
    /// folds the log in runs when one is due ([`Volume::seal_periodic`]), not here, so
    /// its cost (a directory of 10^6 names: a leaf of its tree per name changed) is shared
    /// by everything changed between checkpoints. A checkpoint instead when one is due
    /// now: the log or the staged changes past their limits, or a volume that keeps no log
    /// (docs/design.md, "FUSE").
    ///
    /// Reports earlier failures once, as [`Volume::sync`] does.
    pub fn sync_log(&self) -> Result<()> {
        self.reporting(|| {
            let g = self.lock()?;
            if g.read_only {
                return Ok(());
            }
            let due = g.checkpoint_due();
            self.seal_with_data(g, due, true)
        })
    }

    /// The periodic seal (it has no user to tell of earlier failures): seals the log, like
    /// a journaling file system's periodic commit, without syncing any file's data (the
    /// kernel writes it back at its pace: a burst of it here would stall every fsync
    /// behind it). What was logged is then rollback-protected (records, names, attributes,
    /// staged overwrites); data written directly but not synced is checked at a recovery
    /// and may be left out as a power cut would. A checkpoint instead when one is due: the
    /// log or the staged changes past their limits, or the last checkpoint older than 30 s
    /// (deleted files' objects go, and everything is synced, at checkpoints).
    pub fn seal_periodic(&self) -> Result<()> {
        let g = self.lock()?;
        if g.read_only {
            return Ok(());
        }
        let due = g.checkpoint_due() || g.checkpointed_at.elapsed() >= CHECKPOINT_AGE;
        // The log alone would name appends that die with this process (S3): their data
        // objects are synced first, as fsync does for one file, so that a crash after
        // this tick loses none of them.
        let data = g.store.unsynced_writes_die_with_the_process();
        self.seal_with_data(g, due, data)
    }

    /// A checkpoint if `full`, else a seal of the log, preceded (`data`) by a sync of the
    /// data objects written directly since the last seal.
    fn seal_with_data<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        full: bool,
        data: bool,
    ) -> Result<()> {
        g.probe_if_full();
        // A seal in flight began before this call and may miss what it must seal.
        let need = g.commits_begun + 1;
        if !full && data {
            let log_end = g.wal.as_ref().map(|w| w.end).unwrap_or_default();
            let pending: Vec<(u64, [String; 2])> = g
                .files
                .iter_mut()
                .filter_map(|(&ino, of)| {
                    of.unsynced_since
                        .take()
                        .map(|_| (ino, of.state.names.blocks().map(String::clone)))
                })
                .collect();
            if !pending.is_empty() {
                let store = g.store.clone();
                let names: Vec<String> = pending.iter().flat_map(|(_, n)| n.clone()).collect();
                drop(g);
                let r = crate::metrics::timed(Phase::StoreWait, || store.sync(&names));
                g = self.shared.lock();
                if let Err(e) = r {
                    g.broke(&e);
                    return self.note(Err(e));
                }
                g.changes
                    .synced
                    .extend(pending.into_iter().map(|(ino, _)| (ino, log_end)));
                // A seal begun while the lock was let go may miss those.
                let need = g.commits_begun + 1;
                return self.note(self.seal_until(g, need, full));
            }
        }
        self.note(self.seal_until(g, need, full))
    }

    /// Reports, once, that a failed commit discarded unsealed changes of `ino` (the FUSE
    /// adapter calls it at close, as Linux reports a writeback error there).
    pub fn take_lost(&self, ino: u64) -> Result<()> {
        let mut g = self.shared.lock();
        let g = &mut *g;
        if let Some(e) = g.discarded(ino) {
            return Err(e); // the file itself is gone: every time
        }
        let names = &g.names;
        g.unsealed.take_lost(ino, || {
            names
                .get(&ino)
                .map_or(format!("inode {ino}"), |(_, n)| n.clone())
        })
    }
    /// Makes inode `ino` durable and rollback-protected (fsync, fdatasync): returns at once
    /// when a seal covers its last change; otherwise syncs what its data object holds that
    /// was written directly (appends), then seals the log (a group commit with concurrent
    /// fsyncs: one sync of the log and one anchor for all of them; docs/design.md, "The
    /// log"). Other files' data is not synced.
    pub fn fsync(&self, ino: u64) -> Result<()> {
        let mut g = self.lock()?;
        if g.read_only {
            return Ok(());
        }
        if let Some(e) = g.discarded(ino) {
            return Err(e);
        }
        if !g.logging() {
            // All-or-nothing commands: a checkpoint, as before the log.
            let need = match g.files.get(&ino) {
                Some(of) if of.is_dirty() => g.commits_begun + 1,
                Some(of) => of.sealed_by,
                None => 0,
            };
            let r = self.seal_until(g, need, true);
            let lost = self.take_lost(ino);
            return self.note(r.and(lost));
        }
        let sealed_end = g.anchor.log.map(|l| l.sealed.end).unwrap_or_default();
        let log_end = g.wal.as_ref().map(|w| w.end).unwrap_or_default();
        let Some(of) = g.files.get_mut(&ino) else {
            // Not open: clean, but possibly evicted by the commit in flight, which holds
            // its change; if that one fails, the loss is reported below.
            drop(self.shared.wait_idle(g));
            return self.note(self.take_lost(ino));
        };
        if of.logged_at <= sealed_end && of.unsynced_since.is_none() {
            drop(g);
            return self.note(self.take_lost(ino));
        }
        let data = of
            .unsynced_since
            .take()
            .map(|_| of.state.names.blocks().map(String::clone));
        if let Some(names) = data {
            // Its appends and twin writes, before the log record that says they are
            // durable.
            let store = g.store.clone();
            drop(g);
            let r = crate::metrics::timed(Phase::StoreWait, || store.sync(&names));
            g = self.shared.lock();
            if let Err(e) = r {
                // Written-back pages may be gone: back to the last seal.
                g.broke(&e);
                return self.note(Err(e));
            }
            g.changes.synced.push((ino, log_end));
        }
        let need = g.commits_begun + 1;
        let r = self.seal_until(g, need, false);
        // A failure is reported once: by this call if it saw one, else the discarded
        // changes of an earlier failure are.
        let lost = self.take_lost(ino);
        self.note(r.and(lost))
    }
    /// Runs seals until seal number `need` has ended (`full`: a checkpoint numbered at
    /// least `need`; otherwise a seal of the log will do): waits for one in flight, begins
    /// the next under the lock, runs its I/O without the lock, and ends it under the lock.
    pub(super) fn seal_until(
        &self,
        mut g: MutexGuard<'_, Inner>,
        need: u64,
        full: bool,
    ) -> Result<()> {
        let full = full || !g.logging();
        loop {
            if let Some(why) = &g.poisoned {
                return Err(Error::Poisoned(why.clone()));
            }
            let done = if full {
                g.checkpoints_ended >= need
            } else {
                g.commits_ended >= need
            };
            if done {
                // A seal that failed was reported to the caller that ran it; the others
                // hear of what they lost from `take_lost` or the volume's generation.
                return Ok(());
            }
            // A checkpoint and a seal of the log may run at once: an fsync never waits
            // for a checkpoint's I/O. A broken engine goes back first, with no seal in
            // flight.
            let can = !g.is_broken() || !g.sealing();
            let begun = match (full, g.checkpointing, g.log_sealing) {
                (true, false, _) if can => Some(g.commit_begin()?),
                (false, _, false) if can => Some(g.log_seal_begin()?),
                _ => None,
            };
            match begun {
                Some(Some(f)) => {
                    drop(g);
                    return self.shared.finish(&f);
                }
                Some(None) => return Ok(()),
                None => g = self.shared.wait(g),
            }
        }
    }
    /// The engine lock with no commit in flight (for work that reads the store directly,
    /// or seals synchronously).
    pub(super) fn idle(&self) -> Result<MutexGuard<'_, Inner>> {
        let mut g = self.shared.wait_idle(self.lock()?);
        if g.is_broken() {
            g.mend();
        }
        if let Some(why) = &g.poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        Ok(g)
    }
    /// After a request that wrote (to `ino`, when it names one; `len` bytes of data):
    /// past the dirty limits, a commit begins (its locked phase here) and its I/O runs on a
    /// thread of its own, so that no request waits for it. A file that wrote at least
    /// [`THROTTLE_SHARE`] since the last checkpoint began is a heavy writer:
    /// - past twice the limits, it is paced: each of its writes waits as long as
    ///   checkpoints take to write `len` bytes out, more the further past the limits
    ///   ([`gate::Drain`]), so that it slows to the store's speed without long stops;
    /// - past three times the limits, it waits for a checkpoint to end.
    ///
    /// A small write of another file, such as a create or a log line, never waits behind
    /// a bulk writer's seal. Past four times the limits every writer waits, so memory stays
    /// bounded whatever the number of files.
    pub(super) fn after_write(
        &self,
        mut g: MutexGuard<'_, Inner>,
        ino: Option<u64>,
        len: usize,
    ) -> Result<()> {
        // Counted after the request's end pushed its data through the schemes (its direct
        // writes, staged bytes and log record), not only when the data arrived.
        g.maybe_commit();
        if !g.commit_wanted || g.read_only {
            return Ok(());
        }
        let over = |k: usize| {
            g.tx.overlay_bytes() >= k * OVERLAY_LIMIT
                || g.dirty_bytes >= k * TOTAL_DIRTY_LIMIT
                || g.records_over(k)
        };
        let heavy = || {
            ino.is_none_or(|ino| {
                g.files.get(&ino).is_some_and(|f| {
                    f.written.0 == g.checkpoints_begun && f.written.1 >= THROTTLE_SHARE
                })
            })
        };
        let pace = if over(2) && heavy() {
            // 1 at twice the limits, 9 halfway to three times.
            let limits = (g.tx.overlay_bytes() as f64 / OVERLAY_LIMIT as f64)
                .max(g.dirty_bytes as f64 / TOTAL_DIRTY_LIMIT as f64);
            let pressure = 1.0 + 16.0 * (limits - 2.0);
            Some(g.drain.delay(len, pressure)).filter(|_| !over(3))
        } else {
            Some(std::time::Duration::ZERO)
        };
        let Some(pace) = pace.filter(|_| !over(4)) else {
            let need = g.commits_begun + 1;
            return self.seal_until(g, need, true);
        };
        let begun = if g.checkpointing || (g.is_broken() && g.sealing()) {
            None
        } else {
            g.commit_begin()?
        };
        drop(g);
        if let Some(f) = begun {
            let f = Arc::new(f);
            let (shared, bg) = (self.shared.clone(), f.clone());
            let spawned = std::thread::Builder::new()
                .name("intact-seal".into())
                .spawn(move || {
                    if let Err(e) = shared.finish(&bg) {
                        tracing::error!(error = %e, "seal at the dirty limit failed");
                    }
                });
            if spawned.is_err() {
                // No thread to be had: run it here.
                self.shared.finish(&f)?;
            }
        }
        if !pace.is_zero() {
            std::thread::sleep(pace);
        }
        Ok(())
    }
}
