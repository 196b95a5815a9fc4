//! The `auto` scheme policy (Oprea–Reiter Table 7) and re-encryption under another scheme.

#[allow(unused_imports)]
use super::*;

/// The scheme the `auto` policy calls for, for a file under it: one never stored yet
/// switches at no cost; one with content only once enough of it was observed and if it is
/// not too large to rewrite within a seal.
pub(super) fn auto_target(f: &OpenFile) -> Option<SchemeId> {
    if !f.inode.auto || f.inode.kind != Kind::File {
        return None;
    }
    let o = f.obs;
    let target = crate::format::auto_choice(o.reads, o.writes, o.random, o.sampled)?;
    let fresh = f.state.blocks() == 0;
    let worth =
        o.total() >= AUTO_MIN_OBSERVED.max(f.state.blocks() / 4) && f.inode.size <= AUTO_MAX_SIZE;
    (target != f.inode.scheme && (fresh || worth)).then_some(target)
}

impl Inner {
    /// A file under the `auto` policy that was never stored takes the scheme its first
    /// writes call for before they are stored (at no cost: nothing to re-encrypt).
    pub(super) fn auto_first_store(&mut self, ino: u64) -> Result<()> {
        let Some(f) = self.files.get(&ino) else {
            return Ok(());
        };
        if f.state.blocks() != 0 || f.dirty.is_empty() {
            return Ok(());
        }
        if let Some(target) = auto_target(f) {
            self.set_scheme(ino, target)?;
        }
        Ok(())
    }

    /// The `auto` policy, before a seal: files whose observed contents and access mix call
    /// for another scheme (paper Table 7, [`crate::format::auto_choice`]) switch. A file
    /// never stored yet switches at no cost; one with content is re-encrypted, once enough
    /// of it was observed and if it is not too large to rewrite within a seal.
    pub(super) fn apply_auto_policy(&mut self) -> Result<()> {
        let candidates: Vec<(u64, SchemeId)> = self
            .files
            .iter()
            .filter_map(|(ino, f)| Some((*ino, auto_target(f)?)))
            .collect();
        for (ino, target) in candidates {
            let from = self.files[&ino].inode.scheme;
            self.set_scheme(ino, target)?;
            tracing::info!(
                ino,
                from = from.name(),
                to = target.name(),
                "auto policy switched scheme"
            );
        }
        Ok(())
    }
    /// Re-encrypts file `ino` under scheme `s`. The new content gets a new file id (so new
    /// keys: no (key, nonce) pair of the old scheme can repeat) and the old objects are
    /// deleted at the seal that makes the switch durable, atomically with it.
    pub(super) fn set_scheme(&mut self, ino: u64, s: SchemeId) -> Result<()> {
        self.check_writable()?;
        if self.open_ino(ino)?.inode.scheme == s {
            return Ok(());
        }
        let mut old = self.files.remove(&ino).expect("opened");
        old.state.wait_readers();
        let r = self.reencrypt(ino, &mut old, s);
        match r {
            Ok(mut new) => {
                if let Some(d) = &old.inode.inline_data {
                    // Out of the table's slots: logged with the new blocks, all or nothing.
                    self.free_slots(&d.slots)?;
                    new.stage_flush = true;
                }
                for name in old.state.names.all() {
                    self.tx.delete(name)?;
                }
                // The old id's nodes age out of the node cache (see `free_ino`).
                self.files.insert(ino, new);
                // The old objects' deletion goes with the new content in the log.
                self.note_data_with(ino, old.state.names.all().map(String::clone).into());
                Ok(())
            }
            Err(e) => {
                self.files.insert(ino, old);
                Err(e)
            }
        }
    }
    pub(super) fn reencrypt(
        &mut self,
        ino: u64,
        old: &mut OpenFile,
        s: SchemeId,
    ) -> Result<OpenFile> {
        const CHUNK: usize = 1 << 20;
        let id = crypto::random_file_id();
        self.objects_absent(&id);
        let mut inode = old.inode.clone();
        inode.scheme = s;
        inode.id = id;
        inode.tree = self.empty_tree(s, &id);
        inode.counters = TrustedCounters::Inline(crate::tree::CounterIntervals::new());
        inode.ctr_hw = 0;
        inode.inline_node = None;
        inode.inline_mac = None;
        inode.inline_tags = None;
        inode.inline_data = None;
        inode.size = 0;
        let mut new = OpenFile::load(inode, &self.keys, &mut self.tx, Subject::Inode(ino))?;
        let env = env!(self);
        let size = old.inode.size;
        let mut buf = vec![0u8; CHUNK];
        let mut off = 0;
        while off < size {
            let n = file_read(&env, &mut self.tx, old, off, &mut buf)?;
            if buf[..n].iter().any(|&b| b != 0) {
                file_write(&env, &mut self.tx, &mut new, off, &buf[..n])?;
            }
            off += n as u64;
            if new.dirty.len() * env.bs >= FILE_DIRTY_LIMIT {
                flush_data(&env, &mut self.tx, &mut new, &mut self.scratch)?;
            }
        }
        file_truncate(&env, &mut self.tx, &mut new, size)?;
        // The copy is not the workload: the `auto` policy starts observing afresh (otherwise
        // the copy's writes would call for another switch at the next seal).
        new.obs = Observed::default();
        new.inode.mtime_ns = old.inode.mtime_ns;
        new.inode.ctime_ns = now_ns();
        new.record_dirty = true;
        Ok(new)
    }
}

impl Volume {
    /// Puts file `ino` under the `auto` policy (or takes it out, keeping its scheme).
    pub fn set_auto(&self, ino: u64, on: bool) -> Result<()> {
        self.with_ino(ino, |g| {
            g.check_writable()?;
            g.expect_kind(ino, "", Kind::File)?;
            if on {
                // The policy chooses among schemes of files in blocks.
                g.inline_to_blocks(ino)?;
            }
            g.touch_record(ino)?.inode.auto = on;
            Ok(())
        })
    }
}
