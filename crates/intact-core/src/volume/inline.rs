//! Small files kept in slots of the inode table (docs/design.md, "Small files in the inode
//! table"; docs/file-format.md §4.3). A new `mt-eint` (GCM) file on a volume with the
//! [`INLINE_DATA`] feature keeps its bytes in [`Kind::Data`] records of the table while it is
//! at most [`INLINE_DATA_MAX`] bytes long: the table is itself an `mt-eint` file whose
//! record is in the anchor, so its tree authenticates the bytes and keeps them fresh, as it
//! does the record that lists them. Such a file has no object of its own in the store.
//!
//! In memory the bytes are in the record ([`InlineData::bytes`]); the log carries them in
//! the file's data items; the slots are allocated when a request is logged (or a commit
//! seals it) and written with the record at the checkpoint. A file that would grow past the
//! bound moves to blocks under its scheme ([`Inner::inline_to_blocks`]) and never comes back.

use super::*;

impl Inner {
    /// Whether a new inode of `kind` under scheme `s` starts with its data in the table.
    pub(super) fn starts_inline(&self, kind: Kind, s: SchemeId) -> bool {
        self.inline_data && kind == Kind::File && s == SchemeId::MtEintGcm && !self.default_auto
    }

    /// Fills the bytes of `inode` (record `ino`, just read from the table) from its slots,
    /// checking that each is a data slot of the table and holds zeros past the file's end.
    pub(super) fn load_inline(&mut self, ino: u64, inode: &mut Inode) -> Result<()> {
        let Some(d) = &inode.inline_data else {
            return Ok(());
        };
        let size = inode.size as usize;
        if d.bytes.len() == size {
            return Ok(());
        }
        let slots = d.slots.clone();
        let bad = |what: String| Error::tampered(Subject::Inode(ino), None, what);
        let mut bytes = Vec::with_capacity(size);
        for (k, &s) in slots.iter().enumerate() {
            if s <= ROOT_INO || s == ino || s >= self.header.count || slots[..k].contains(&s) {
                return Err(bad(format!(
                    "inline data slot {s} is outside the inode table or listed twice"
                )));
            }
            let raw = self.read_raw_record(s)?;
            let Some(p) = slot_payload(&raw) else {
                return Err(bad(format!("inline data slot {s} is not a data record")));
            };
            let take = (size - bytes.len()).min(SLOT_BYTES);
            if p[take..].iter().any(|&x| x != 0) {
                return Err(bad(format!(
                    "inline data slot {s} holds bytes past the file's end"
                )));
            }
            bytes.extend_from_slice(&p[..take]);
        }
        inode.inline_data.as_mut().expect("inline").bytes = bytes;
        Ok(())
    }

    /// Before a change that makes file `ino` (open) `end` bytes long: an inline file that
    /// would pass [`INLINE_DATA_MAX`] moves to blocks first.
    pub(super) fn inline_room(&mut self, ino: u64, end: u64) -> Result<()> {
        let inline = self.files[&ino].inode.inline_data.is_some();
        if inline && end > INLINE_DATA_MAX {
            self.inline_to_blocks(ino)?;
        }
        Ok(())
    }

    /// Moves inline file `ino` (open) to blocks under its scheme: its bytes become dirty
    /// blocks, pushed through the scheme at the request's end, and its slots are freed.
    /// That push is staged (logged with the request), so that the log item that frees the
    /// slots and the one that holds the blocks are applied together or not at all.
    pub(super) fn inline_to_blocks(&mut self, ino: u64) -> Result<()> {
        let bs = self.bs;
        let of = self.files.get_mut(&ino).expect("opened");
        let Some(d) = of.inode.inline_data.take() else {
            return Ok(());
        };
        for (b, chunk) in d.bytes.chunks(bs).enumerate() {
            let mut blk = chunk.to_vec();
            blk.resize(bs, 0);
            of.dirty.insert(b as u64, blk);
        }
        of.record_dirty = true;
        // Slots were logged (or will be sealed) for it only if it has some.
        of.stage_flush = !d.slots.is_empty();
        self.dirty_bytes += d.bytes.len().div_ceil(bs) * bs;
        self.note_data(ino);
        self.free_slots(&d.slots)
    }

    /// Makes inline file `ino`'s slot list as long as its bytes need (allocates the missing
    /// slots from the table's free list, or frees the ones past its end) and writes its
    /// bytes into them if they changed ([`OpenFile::slots_stale`]), so that the table in
    /// memory always holds what the log says. Nothing for a file in blocks, or one not
    /// open; a request that changed nothing of the bytes leaves the table clean.
    pub(super) fn settle_slots(&mut self, ino: u64) -> Result<()> {
        let Some((have, size)) = self
            .files
            .get(&ino)
            .and_then(|of| Some((of.inode.inline_data.as_ref()?.slots.len(), of.inode.size)))
        else {
            return Ok(());
        };
        let need = InlineData::slots_for(size);
        if need > have {
            let mut new = Vec::with_capacity(need - have);
            for _ in have..need {
                new.push(self.alloc_ino()?);
            }
            self.inline_of(ino).slots.extend(new);
        } else if need < have {
            let gone = self.inline_of(ino).slots.split_off(need);
            self.free_slots(&gone)?;
        }
        let of = self.files.get_mut(&ino).expect("opened");
        if !std::mem::take(&mut of.slots_stale) && need <= have {
            return Ok(());
        }
        let inode = of.inode.clone();
        self.write_slots(&inode)
    }

    fn inline_of(&mut self, ino: u64) -> &mut InlineData {
        let of = self.files.get_mut(&ino).expect("opened");
        of.record_dirty = true;
        of.inode.inline_data.as_mut().expect("inline")
    }

    /// Writes the slots of `inode` (an inline file) into the table: [`SLOT_BYTES`] of its
    /// bytes each, zeros after its end.
    pub(super) fn write_slots(&mut self, inode: &Inode) -> Result<()> {
        let Some(d) = &inode.inline_data else {
            return Ok(());
        };
        debug_assert_eq!(d.bytes.len() as u64, inode.size, "inline bytes loaded");
        for (k, &s) in d.slots.iter().enumerate() {
            let from = (k * SLOT_BYTES).min(d.bytes.len());
            let to = ((k + 1) * SLOT_BYTES).min(d.bytes.len());
            self.write_raw_record(s, &encode_slot(&d.bytes[from..to]))?;
        }
        Ok(())
    }

    /// Returns slots to the table's free list (logged as freed records).
    pub(super) fn free_slots(&mut self, slots: &[u64]) -> Result<()> {
        for &s in slots {
            self.write_record(s, &Inode::free(self.header.free_head))?;
            self.note_record(s);
            self.header.free_head = s;
            self.header_dirty = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemStore, MemTrusted};

    fn data(seed: u8, n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| seed.wrapping_add((i * 7 % 251) as u8))
            .collect()
    }

    /// Objects of the file with id `hex` in the store.
    fn objects_of(store: &MemStore, hex: &str) -> Vec<String> {
        store
            .snapshot()
            .into_keys()
            .filter(|n| n.contains(hex))
            .collect()
    }

    fn read_all(vol: &Volume, path: &str) -> Vec<u8> {
        let mut buf = vec![0u8; 1 << 16];
        let n = vol.read_path(path, 0, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    /// The inode table's free list.
    fn free_list(vol: &Volume) -> Vec<u64> {
        let mut g = vol.shared.lock();
        let (mut out, mut at) = (Vec::new(), g.header.free_head);
        while at != 0 {
            out.push(at);
            at = g.read_record(at).unwrap().link;
        }
        out
    }

    /// The slots a file lists (`None`: the file is in blocks).
    fn slots(vol: &Volume, path: &str) -> Option<Vec<u64>> {
        let ino = vol.stat(path).unwrap().ino;
        let mut g = vol.shared.lock();
        g.ensure_open(ino).unwrap();
        g.files[&ino]
            .inode
            .inline_data
            .as_ref()
            .map(|d| d.slots.clone())
    }

    /// A file of up to `INLINE_DATA_MAX` bytes has no object in the store: its bytes are in
    /// slots of the inode table, one per `SLOT_BYTES`, read back after a reopen, and fsck
    /// finds nothing wrong. Sizes at the slots' edges: 0, 1, a slot ± 1, the bound.
    #[test]
    fn a_small_file_lives_in_slots_of_the_table() {
        let (store, trusted) = (Arc::new(MemStore::new()), MemTrusted::new());
        let vol = test_volume(store.clone(), &trusted);
        let sizes = [0, 1, SLOT_BYTES - 1, SLOT_BYTES, SLOT_BYTES + 1, 1024, 3720];
        assert_eq!(INLINE_DATA_MAX, 3720);
        for (k, &n) in sizes.iter().enumerate() {
            let path = format!("/f{k}");
            vol.create_file(&path, None).unwrap();
            vol.write_path(&path, 0, &data(k as u8, n)).unwrap();
        }
        vol.sync().unwrap();
        drop(vol);
        let vol = test_reopen(&store, &trusted);
        let mut all = Vec::new();
        for (k, &n) in sizes.iter().enumerate() {
            let path = format!("/f{k}");
            assert_eq!(read_all(&vol, &path), data(k as u8, n), "{path}");
            let st = vol.stat(&path).unwrap();
            assert_eq!(st.size, n as u64);
            assert!(objects_of(&store, &st.file_id).is_empty(), "{path}");
            let s = slots(&vol, &path).expect("inline");
            assert_eq!(s.len(), n.div_ceil(SLOT_BYTES), "{path}");
            all.extend(s);
        }
        let before = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), before, "no slot listed twice");
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }

    /// Growing past the bound moves the file to blocks under its scheme (a `.d` appears),
    /// frees its slots (the next small file takes them), and never comes back: cut below
    /// the bound, the file stays in blocks. Contents hold throughout, and after a reopen.
    #[test]
    fn a_file_that_grows_past_the_bound_moves_to_blocks_and_stays() {
        let (store, trusted) = (Arc::new(MemStore::new()), MemTrusted::new());
        let vol = test_volume(store.clone(), &trusted);
        vol.create_file("/g", None).unwrap();
        let small = data(3, 1000);
        vol.write_path("/g", 0, &small).unwrap();
        vol.sync().unwrap();
        let freed = slots(&vol, "/g").unwrap();
        assert_eq!(freed.len(), 5);
        // One byte past the bound, written at its end.
        vol.write_path("/g", INLINE_DATA_MAX, b"!").unwrap();
        assert_eq!(slots(&vol, "/g"), None, "in blocks");
        let mut want = small.clone();
        want.resize(INLINE_DATA_MAX as usize, 0);
        want.push(b'!');
        assert_eq!(read_all(&vol, "/g"), want);
        vol.sync().unwrap();
        let id = vol.stat("/g").unwrap().file_id;
        assert!(!objects_of(&store, &id).is_empty(), "a data object");
        // The freed slots are on the table's free list again, and the next small file
        // takes its record and slots from there.
        let free = free_list(&vol);
        assert!(
            freed.iter().all(|s| free.contains(s)),
            "{freed:?} in {free:?}"
        );
        vol.create_file("/h", None).unwrap();
        vol.write_path("/h", 0, &data(9, 5 * SLOT_BYTES)).unwrap();
        vol.sync().unwrap();
        let h = slots(&vol, "/h").unwrap();
        let reused = h.iter().filter(|s| freed.contains(s)).count();
        assert!(reused >= 4, "{h:?} from {freed:?}");
        // Cut back: still in blocks.
        vol.truncate("/g", 10).unwrap();
        assert_eq!(slots(&vol, "/g"), None);
        vol.sync().unwrap();
        drop(vol);
        let vol = test_reopen(&store, &trusted);
        assert_eq!(read_all(&vol, "/g"), &want[..10]);
        assert_eq!(read_all(&vol, "/h"), data(9, 5 * SLOT_BYTES));
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }

    /// Cuts, extensions within the bound, overwrites in the middle and a punched range
    /// change the slots as the bytes need; unlinking frees them all (fsck finds no slot
    /// that no file lists, and no lost file). Each step is checked against a plain vector,
    /// after the log's replay too (the volume is reopened without a seal).
    #[test]
    fn slots_follow_cuts_extensions_punches_and_unlink() {
        let (store, trusted) = (Arc::new(MemStore::new()), MemTrusted::new());
        let vol = test_volume(store.clone(), &trusted);
        vol.create_file("/f", None).unwrap();
        let mut model = data(1, 2000);
        vol.write_path("/f", 0, &model).unwrap();
        vol.truncate("/f", 300).unwrap();
        model.truncate(300);
        vol.truncate("/f", 3000).unwrap();
        model.resize(3000, 0);
        vol.write_path("/f", 2500, &data(2, 400)).unwrap();
        model[2500..2900].copy_from_slice(&data(2, 400));
        let ino = vol.stat("/f").unwrap().ino;
        vol.zero_range(ino, 10, 50, true).unwrap();
        model[10..60].fill(0);
        vol.zero_range(ino, 100, 4096, true).unwrap();
        model[100..].fill(0);
        assert_eq!(read_all(&vol, "/f"), model);
        assert_eq!(
            slots(&vol, "/f").unwrap().len(),
            3000usize.div_ceil(SLOT_BYTES)
        );
        // Reopened from the log alone (no seal since the creation).
        drop(vol);
        let vol = test_reopen(&store, &trusted);
        assert_eq!(read_all(&vol, "/f"), model);
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
        // A cut inside the last slot (the slot count stays), sealed, and read back from the
        // table's slots alone (a reopen after a seal replays nothing).
        vol.truncate("/f", 2990).unwrap();
        model.truncate(2990);
        assert_eq!(
            slots(&vol, "/f").unwrap().len(),
            2990usize.div_ceil(SLOT_BYTES)
        );
        vol.sync().unwrap();
        drop(vol);
        let vol = test_reopen(&store, &trusted);
        assert_eq!(read_all(&vol, "/f"), model);
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
        vol.unlink("/f").unwrap();
        vol.sync().unwrap();
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty(), "no lost slot");
        // Its record and its slots are free again.
        let free = free_list(&vol).len();
        assert!(free > 3000usize.div_ceil(SLOT_BYTES), "{free} free records");
    }

    /// A record that lists a slot the table does not hold as a data slot (a bug, or damage
    /// the table's tree did not see) is an integrity failure that names the file's inode,
    /// not a read of whatever is there; so is a slot with bytes past the file's end.
    #[test]
    fn a_slot_that_is_not_one_is_refused() {
        let (store, trusted) = (Arc::new(MemStore::new()), MemTrusted::new());
        let vol = test_volume(store, &trusted);
        vol.create_file("/f", None).unwrap();
        vol.write_path("/f", 0, &data(5, 600)).unwrap();
        vol.sync().unwrap();
        let ino = vol.stat("/f").unwrap().ino;
        let s = slots(&vol, "/f").unwrap();
        let mut g = vol.shared.lock();
        let free_head = g.header.free_head;
        for bad in [
            Inode::free(free_head).encode(),
            encode_slot(&[1u8; SLOT_BYTES]),
        ] {
            g.write_raw_record(s[2], &bad).unwrap();
            g.files.remove(&ino);
            let e = g.ensure_open(ino).unwrap_err();
            assert!(e.is_tampered(), "{e}");
            assert!(e.to_string().contains(&format!("slot {}", s[2])), "{e}");
        }
    }

    /// A new file on a volume without the feature, one under another scheme, and one under
    /// the `auto` policy are in blocks; a file put under `auto` leaves the slots first.
    #[test]
    fn only_new_mt_eint_files_of_a_volume_with_the_feature_start_inline() {
        let (store, trusted) = (Arc::new(MemStore::new()), MemTrusted::new());
        let vol = test_volume_in_blocks(store, &trusted);
        vol.create_file("/old", None).unwrap();
        vol.write_path("/old", 0, b"x").unwrap();
        assert_eq!(slots(&vol, "/old"), None);
        let (store, trusted) = (Arc::new(MemStore::new()), MemTrusted::new());
        let vol = test_volume(store, &trusted);
        vol.create_file("/mac", Some(SchemeId::MacTree)).unwrap();
        vol.write_path("/mac", 0, b"x").unwrap();
        assert_eq!(slots(&vol, "/mac"), None);
        vol.create_file("/a", None).unwrap();
        vol.write_path("/a", 0, b"auto").unwrap();
        vol.sync().unwrap();
        assert_eq!(slots(&vol, "/a").map(|s| s.len()), Some(1));
        let ino = vol.stat("/a").unwrap().ino;
        vol.set_auto(ino, true).unwrap();
        assert_eq!(slots(&vol, "/a"), None);
        assert_eq!(read_all(&vol, "/a"), b"auto");
        vol.sync().unwrap();
        assert_eq!(read_all(&vol, "/a"), b"auto");
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }
}
