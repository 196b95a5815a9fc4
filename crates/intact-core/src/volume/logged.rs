//! The engine's side of the log (docs/design.md, "The log"): what each request changed,
//! appended as one group when the request ends ([`Inner::log_point`]), and replayed on top
//! of the last checkpoint when a volume opens ([`Inner::replay_log`]).
//!
//! A group holds [`Item`]s. Namespace changes (records, directory entries, the table
//! header, extended attributes) are logical; a file's data changes are one [`Item::Data`]:
//! its record and the changes of its objects (staged bytes, lengths, and the ranges written
//! directly). Replay applies every group in order, but a file's data items that no fsync
//! covered are first checked against the store: if the bytes they wrote directly did not
//! all survive (a power cut before they reached the disk), that item and the file's later
//! data items are left out, and the file is back at its last complete state. Everything an
//! fsync covered ([`Item::Synced`]) must be there: a failure is an integrity alarm.

use super::*;
use crate::tree::{ancestors, flat_index, flat_span, peaks, Hash};
use crate::tx::LoggedOp;
use crate::wal::{self, Chain, LogKeys, LogPos, Payload, Writer};
use std::collections::BTreeSet;

/// One change in a logged group.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Item {
    /// An inode's record: its attributes count, or all of it when the inode is created or
    /// freed.
    Rec { ino: u64, rec: Box<Inode> },
    /// A file's data: its record (its data fields count) and the changes of its objects.
    Data {
        ino: u64,
        rec: Box<Inode>,
        ops: Vec<LoggedOp>,
    },
    /// A directory entry set (`Some`) or removed (`None`).
    Entry {
        dir: u64,
        name: String,
        target: Option<(u64, Kind)>,
    },
    /// The inode-table header.
    Header(TableHeader),
    /// An extended attribute of hidden attribute inode `x` set or removed.
    Xattr {
        x: u64,
        name: String,
        value: Option<Vec<u8>>,
    },
    /// Changes of objects no file's data item holds (the objects of freed files).
    Ops(Vec<LoggedOp>),
    /// Data items of these inodes logged before `upto` wrote nothing directly that is not
    /// durable (an fsync synced their objects first).
    Synced { upto: LogPos, inos: Vec<u64> },
    /// The records in `[from, to)` do not count: a going back discarded them (the log goes
    /// on in the same segment after them).
    Void { from: LogPos, to: LogPos },
}

const I_REC: u8 = 1;
const I_DATA: u8 = 2;
const I_ENTRY: u8 = 3;
const I_HEADER: u8 = 4;
const I_XATTR: u8 = 5;
const I_OPS: u8 = 6;
const I_SYNCED: u8 = 7;
const I_VOID: u8 = 8;
/// A data item of a file whose data is in the inode table's slots: as [`I_DATA`], then the
/// file's bytes (u32 length, equal to the record's size, and the bytes).
const I_DATA_INLINE: u8 = 9;
/// A data item in the compact form of leaf-log volumes ([`LEAF_LOG`]; docs/file-format.md
/// §6a): as [`I_DATA`], but the record is its data fields ([`put_data_rec`]) and an
/// operation on one of the file's own objects names it by a code ([`OWN_NAME`]).
const I_DATA_LEAF: u8 = 10;
/// [`I_DATA_INLINE`] in the compact form of [`I_DATA_LEAF`].
const I_DATA_LEAF_INLINE: u8 = 11;
/// A data item of a [`LOG_DELTA`] volume (docs/file-format.md §6a): a flags byte
/// ([`V_INLINE`], [`V_CHANGE`], [`V_CTIME`]), the inode number (varint), the record's data fields as the
/// words that differ from a base ([`put_words`]), the operations in varints
/// ([`put_vops`]), and with [`V_INLINE`] the file's bytes (varint length, the bytes).
const I_DATA_V: u8 = 12;
/// Flag of [`I_DATA_V`]: the file's data is in the inode table's slots; its bytes follow.
const V_INLINE: u8 = 1;
/// Flag of [`I_DATA_V`]: the base is the record of the file's previous data item in the
/// log ([`Bases`]), named by the first 4 bytes of its BLAKE3 hash; without it, the base is
/// all zeros.
const V_CHANGE: u8 = 2;
/// Flag of [`I_DATA_V`]: the ctime word (word 5 of the record) equals the mtime word (4),
/// which the words hold; the ctime word is not among them (a write sets both alike).
const V_CTIME: u8 = 4;
/// Words of the record's mtime and ctime (docs/file-format.md §4: bytes 32..40, 40..48).
const MTIME_WORD: usize = 4;
const CTIME_WORD: usize = 5;

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u16).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_bytes(b: &mut Vec<u8>, d: &[u8]) {
    b.extend_from_slice(&(d.len() as u32).to_le_bytes());
    b.extend_from_slice(d);
}

/// Code bit of an operation, in a compact data item ([`I_DATA_LEAF`]), on one of the item's
/// file's objects: a byte follows, its index in [`ObjectNames::all`] (0 `.d`, 1 `.m`, 2
/// `.c`, 3 `.t`), in place of the name.
const OWN_NAME: u8 = 0x40;

/// The bytes of a record that a data item's replay takes ([`merge_data`]): the record's
/// encoding (docs/file-format.md §4) with the fields only attributes use set to zero (bytes
/// 3..24: mode, uid, gid, nlink, xattr; 48..56: atime; 120..128: link).
fn data_rec_bytes(rec: &Inode) -> [u8; RECORD_SIZE] {
    let mut full: [u8; RECORD_SIZE] = rec.encode()[..].try_into().expect("a record's size");
    for r in [3..24, 48..56, 120..128] {
        full[r].fill(0);
    }
    full
}

/// The form a compact data item keeps a record's data fields in ([`data_rec_bytes`]): of
/// their 32 words of 8 bytes, a u32 whose bit `w` says word `w` differs from `base`'s, and
/// those words in order.
fn put_words(b: &mut Vec<u8>, full: &[u8; RECORD_SIZE], base: &[u8; RECORD_SIZE]) {
    const _: () = assert!(RECORD_SIZE == 32 * 8);
    let mut map = 0u32;
    for (w, (word, was)) in full.chunks(8).zip(base.chunks(8)).enumerate() {
        if word != was {
            map |= 1 << w;
        }
    }
    b.extend_from_slice(&map.to_le_bytes());
    for (w, word) in full.chunks(8).enumerate() {
        if map & (1 << w) != 0 {
            b.extend_from_slice(word);
        }
    }
}

/// Reads what [`put_words`] wrote, over `base`.
fn get_words(r: &mut crate::tx::Reader<'_>, base: &[u8; RECORD_SIZE]) -> Option<[u8; RECORD_SIZE]> {
    let map = r.u32()?;
    let mut full = *base;
    for (w, word) in full.chunks_mut(8).enumerate() {
        if map & (1 << w) != 0 {
            word.copy_from_slice(r.take(8)?);
        }
    }
    Some(full)
}

/// A record's data fields as a compact data item ([`I_DATA_LEAF`]) keeps them: the words of
/// [`data_rec_bytes`] that are not zero ([`put_words`] over zeros).
fn put_data_rec(b: &mut Vec<u8>, rec: &Inode) {
    put_words(b, &data_rec_bytes(rec), &[0; RECORD_SIZE]);
}

/// Reads what [`put_data_rec`] wrote.
fn get_data_rec(r: &mut crate::tx::Reader<'_>) -> Option<Box<Inode>> {
    Inode::decode(&get_words(r, &[0; RECORD_SIZE])?).map(Box::new)
}

/// The records of the files' last data items in the log since it last started again
/// ([`data_rec_bytes`], as the log holds them): the base of each file's next data item
/// ([`I_DATA_V`]). The writer and the replay keep them alike, from the items themselves:
/// the writer clears them wherever a replay may begin (a checkpoint starts the log again),
/// after a going back and after a failed append, and holds at most [`BASES_MAX`] (past
/// that it clears them, and each file's next item holds its whole record), so its memory
/// stays bounded however many files a session touches. An item whose base is not the one
/// it names (a bug, never the store's doing: the log is authenticated) does not parse.
#[derive(Default)]
pub(super) struct Bases(HashMap<u64, Box<[u8; RECORD_SIZE]>>);

/// Most records [`Bases`] holds on the writer's side (1 MiB).
const BASES_MAX: usize = 4096;

impl Bases {
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    /// `full` becomes `ino`'s base (in the place of its last one: no allocation per item).
    fn set(&mut self, ino: u64, full: [u8; RECORD_SIZE]) {
        match self.0.get_mut(&ino) {
            Some(b) => **b = full,
            None => {
                self.0.insert(ino, Box::new(full));
            }
        }
    }
}

/// The first 4 bytes of the BLAKE3 hash of a base: what an [`I_DATA_V`] item names its
/// base by.
fn base_digest(base: &[u8; RECORD_SIZE]) -> [u8; 4] {
    blake3::hash(base).as_bytes()[..4]
        .try_into()
        .expect("4 bytes")
}

/// The record of an [`I_DATA_V`] item: its words that differ from `base` ([`put_words`]),
/// but with [`V_CTIME`] in the flags it returns, not the ctime word when it is the mtime's.
fn put_words_v(b: &mut Vec<u8>, full: &[u8; RECORD_SIZE], base: &[u8; RECORD_SIZE]) -> u8 {
    let word = |w: usize| &full[8 * w..8 * w + 8];
    if word(CTIME_WORD) == word(MTIME_WORD) {
        let mut base = *base;
        base[8 * CTIME_WORD..8 * CTIME_WORD + 8].copy_from_slice(word(CTIME_WORD));
        put_words(b, full, &base);
        V_CTIME
    } else {
        put_words(b, full, base);
        0
    }
}

/// Reads what [`put_words_v`] wrote.
fn get_words_v(
    r: &mut crate::tx::Reader<'_>,
    base: &[u8; RECORD_SIZE],
    flags: u8,
) -> Option<[u8; RECORD_SIZE]> {
    let mut full = get_words(r, base)?;
    if flags & V_CTIME != 0 {
        full.copy_within(8 * MTIME_WORD..8 * MTIME_WORD + 8, 8 * CTIME_WORD);
    }
    Some(full)
}

/// Appends `v` as an unsigned LEB128 varint (7 bits a byte, low first; the high bit says
/// another byte follows).
fn put_var(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push(v as u8 | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

/// Reads what [`put_var`] wrote (at most 10 bytes; a value past `u64` does not parse).
fn get_var(r: &mut crate::tx::Reader<'_>) -> Option<u64> {
    let mut v = 0u64;
    for k in 0..10 {
        let byte = r.take(1)?[0];
        let bits = u64::from(byte & 0x7f);
        if k == 9 && bits > 1 {
            return None;
        }
        v |= bits << (7 * k);
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Code bit of an operation whose object is the previous operation's in the same list: its
/// name is left out (volumes with twin blocks; docs/file-format.md §6a). A file's item
/// names its `.m` at every node of a path, so this is most of a small overwrite's record.
const SAME_NAME: u8 = 0x80;

/// Encodes operations; `compact`: names repeated from the previous operation are left out
/// ([`SAME_NAME`]).
/// `own`: the objects of the file whose compact data item holds the operations, named by
/// their index in [`ObjectNames::all`] ([`OWN_NAME`]).
/// `var` ([`I_DATA_V`]): the count and every number are varints ([`put_var`]), and a
/// write's bytes are its length, the length before their trailing zeros, and those bytes.
fn put_ops(b: &mut Vec<u8>, ops: &[LoggedOp], compact: bool, own: Option<&ObjectNames>, var: bool) {
    let num = |b: &mut Vec<u8>, v: u64| {
        if var {
            put_var(b, v);
        } else {
            b.extend_from_slice(&v.to_le_bytes());
        }
    };
    if var {
        put_var(b, ops.len() as u64);
    } else {
        b.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    }
    let mut prev: Option<&str> = None;
    for op in ops {
        let name = op.name();
        let same = compact && prev == Some(name);
        prev = Some(name);
        let mine = own.and_then(|o| o.all().iter().position(|n| n.as_str() == name));
        let code = |b: &mut Vec<u8>, code: u8| {
            if same {
                b.push(code | SAME_NAME);
            } else if let Some(k) = mine {
                b.push(code | OWN_NAME);
                b.push(k as u8);
            } else {
                b.push(code);
                put_str(b, name);
            }
        };
        match op {
            LoggedOp::Write { off, data, .. } => {
                code(b, 1);
                num(b, *off);
                if var {
                    let kept = data.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
                    put_var(b, data.len() as u64);
                    put_var(b, kept as u64);
                    b.extend_from_slice(&data[..kept]);
                } else {
                    put_bytes(b, data);
                }
            }
            LoggedOp::SetLen { len, .. } => {
                code(b, 2);
                num(b, *len);
            }
            LoggedOp::Delete { .. } => code(b, 3),
            LoggedOp::Direct { off, len, .. } => {
                code(b, 4);
                num(b, *off);
                num(b, *len);
            }
            LoggedOp::Copy { src, dst, len, .. } => {
                code(b, 5);
                for v in [src, dst, len] {
                    num(b, *v);
                }
            }
        }
    }
}

fn get_str(r: &mut crate::tx::Reader<'_>) -> Option<String> {
    let n = r.u16()? as usize;
    std::str::from_utf8(r.take(n)?).ok().map(str::to_string)
}

fn get_name(r: &mut crate::tx::Reader<'_>) -> Option<String> {
    let s = get_str(r)?;
    crate::store::check_name(&s).ok()?;
    Some(s)
}

/// Reads what [`put_ops`] wrote.
fn get_ops(
    r: &mut crate::tx::Reader<'_>,
    own: Option<&ObjectNames>,
    var: bool,
) -> Option<Vec<LoggedOp>> {
    let num = |r: &mut crate::tx::Reader<'_>| if var { get_var(r) } else { r.u64() };
    let n = if var {
        usize::try_from(get_var(r)?).ok()?
    } else {
        r.u32()? as usize
    };
    let mut ops: Vec<LoggedOp> = Vec::with_capacity(n.min(1 << 12));
    for _ in 0..n {
        let code = r.take(1)?[0];
        let name = if code & SAME_NAME != 0 {
            ops.last()?.name().to_string()
        } else if code & OWN_NAME != 0 {
            own?.all().get(r.take(1)?[0] as usize)?.to_string()
        } else {
            get_name(r)?
        };
        ops.push(match code & !(SAME_NAME | OWN_NAME) {
            1 => {
                let off = num(r)?;
                let data = if var {
                    let len = usize::try_from(get_var(r)?).ok()?;
                    let kept = usize::try_from(get_var(r)?).ok()?;
                    if kept > len || len > wal::RECORD_MAX {
                        return None;
                    }
                    let mut d = r.take(kept)?.to_vec();
                    d.resize(len, 0);
                    d
                } else {
                    let len = r.u32()? as usize;
                    r.take(len)?.to_vec()
                };
                LoggedOp::Write { name, off, data }
            }
            2 => LoggedOp::SetLen { name, len: num(r)? },
            3 => LoggedOp::Delete { name },
            4 => LoggedOp::Direct {
                name,
                off: num(r)?,
                len: num(r)?,
            },
            5 => LoggedOp::Copy {
                name,
                src: num(r)?,
                dst: num(r)?,
                len: num(r)?,
            },
            _ => return None,
        });
    }
    Some(ops)
}

fn get_rec(r: &mut crate::tx::Reader<'_>) -> Option<Box<Inode>> {
    Inode::decode(r.take(RECORD_SIZE)?).map(Box::new)
}

/// Encodes a group (docs/file-format.md, "The log"); `compact`: operations leave out a name
/// repeated from the previous one (volumes with twin blocks); `leaf`: data items take the
/// compact form of [`I_DATA_LEAF`] (leaf-log volumes).
pub(super) fn encode_group(items: &[Item], compact: bool, leaf: bool) -> Vec<u8> {
    encode_group_in(items, compact, leaf, None)
}

/// [`encode_group`]; `bases` (volumes with [`LOG_DELTA`]): data items take the form of
/// [`I_DATA_V`], each record a change of its file's base there when it has one, and each
/// becomes its file's base.
pub(super) fn encode_group_in(
    items: &[Item],
    compact: bool,
    leaf: bool,
    mut bases: Option<&mut Bases>,
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for it in items {
        match it {
            Item::Rec { ino, rec } => {
                b.push(I_REC);
                b.extend_from_slice(&ino.to_le_bytes());
                b.extend_from_slice(&rec.encode());
            }
            Item::Data { ino, rec, ops } if bases.is_some() => {
                let bases = bases.as_deref_mut().expect("matched");
                let inline = rec.inline_data.as_ref();
                let full = data_rec_bytes(rec);
                let base = bases.0.get(ino);
                b.push(I_DATA_V);
                let at = b.len();
                b.push(
                    if inline.is_some() { V_INLINE } else { 0 }
                        | if base.is_some() { V_CHANGE } else { 0 },
                );
                put_var(&mut b, *ino);
                let ctime = match base {
                    Some(base) => {
                        b.extend_from_slice(&base_digest(base));
                        put_words_v(&mut b, &full, base)
                    }
                    None => put_words_v(&mut b, &full, &[0; RECORD_SIZE]),
                };
                b[at] |= ctime;
                put_ops(&mut b, ops, compact, Some(&ObjectNames::of(&rec.id)), true);
                if let Some(d) = inline {
                    put_var(&mut b, d.bytes.len() as u64);
                    b.extend_from_slice(&d.bytes);
                }
                bases.set(*ino, full);
            }
            Item::Data { ino, rec, ops } => {
                let inline = rec.inline_data.as_ref();
                b.push(match (leaf, inline.is_some()) {
                    (false, false) => I_DATA,
                    (false, true) => I_DATA_INLINE,
                    (true, false) => I_DATA_LEAF,
                    (true, true) => I_DATA_LEAF_INLINE,
                });
                b.extend_from_slice(&ino.to_le_bytes());
                if leaf {
                    put_data_rec(&mut b, rec);
                    put_ops(&mut b, ops, compact, Some(&ObjectNames::of(&rec.id)), false);
                } else {
                    b.extend_from_slice(&rec.encode());
                    put_ops(&mut b, ops, compact, None, false);
                }
                if let Some(d) = inline {
                    put_bytes(&mut b, &d.bytes);
                }
            }
            Item::Entry { dir, name, target } => {
                b.push(I_ENTRY);
                b.extend_from_slice(&dir.to_le_bytes());
                put_str(&mut b, name);
                match target {
                    Some((ino, kind)) => {
                        b.push(*kind as u8);
                        b.extend_from_slice(&ino.to_le_bytes());
                    }
                    None => b.push(0),
                }
            }
            Item::Header(h) => {
                b.push(I_HEADER);
                for v in [h.free_head, h.count, h.unlinked_head] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
            }
            Item::Xattr { x, name, value } => {
                b.push(I_XATTR);
                b.extend_from_slice(&x.to_le_bytes());
                put_str(&mut b, name);
                match value {
                    Some(v) => {
                        b.push(1);
                        put_bytes(&mut b, v);
                    }
                    None => b.push(0),
                }
            }
            Item::Ops(ops) => {
                b.push(I_OPS);
                put_ops(&mut b, ops, compact, None, false);
            }
            Item::Void { from, to } => {
                b.push(I_VOID);
                for p in [from, to] {
                    b.extend_from_slice(&p.seg.to_le_bytes());
                    b.extend_from_slice(&p.off.to_le_bytes());
                }
            }
            Item::Synced { upto, inos } => {
                b.push(I_SYNCED);
                b.extend_from_slice(&upto.seg.to_le_bytes());
                b.extend_from_slice(&upto.off.to_le_bytes());
                b.extend_from_slice(&(inos.len() as u32).to_le_bytes());
                for ino in inos {
                    b.extend_from_slice(&ino.to_le_bytes());
                }
            }
        }
    }
    b
}

/// Decodes a group; `None` when malformed (an authentic record that does not parse is
/// damage the MAC should have caught, or a bug: the caller raises an integrity failure).
#[cfg(test)]
pub(super) fn decode_group(b: &[u8]) -> Option<Vec<Item>> {
    decode_group_in(b, &mut Bases::default())
}

/// [`decode_group`], with the [`Bases`] of the groups before it in the log (from where
/// replay begins), which its [`I_DATA_V`] items update.
pub(super) fn decode_group_in(b: &[u8], bases: &mut Bases) -> Option<Vec<Item>> {
    let mut r = crate::tx::Reader { b, pos: 0 };
    let n = r.u32()? as usize;
    let mut items = Vec::with_capacity(n.min(1 << 12));
    for _ in 0..n {
        let code = r.take(1)?[0];
        items.push(match code {
            I_REC => Item::Rec {
                ino: r.u64()?,
                rec: get_rec(&mut r)?,
            },
            I_DATA => Item::Data {
                ino: r.u64()?,
                rec: get_rec(&mut r)?,
                ops: get_ops(&mut r, None, false)?,
            },
            I_DATA_LEAF => {
                let (ino, rec) = (r.u64()?, get_data_rec(&mut r)?);
                let ops = get_ops(&mut r, Some(&ObjectNames::of(&rec.id)), false)?;
                if rec.inline_data.is_some() {
                    return None;
                }
                Item::Data { ino, rec, ops }
            }
            I_DATA_INLINE | I_DATA_LEAF_INLINE => {
                let ino = r.u64()?;
                let (mut rec, ops) = if code == I_DATA_LEAF_INLINE {
                    let rec = get_data_rec(&mut r)?;
                    let ops = get_ops(&mut r, Some(&ObjectNames::of(&rec.id)), false)?;
                    (rec, ops)
                } else {
                    (get_rec(&mut r)?, get_ops(&mut r, None, false)?)
                };
                let len = r.u32()? as usize;
                let d = rec.inline_data.as_mut()?;
                if len as u64 != rec.size {
                    return None;
                }
                d.bytes = r.take(len)?.to_vec();
                Item::Data { ino, rec, ops }
            }
            I_DATA_V => {
                let flags = r.take(1)?[0];
                if flags & !(V_INLINE | V_CHANGE | V_CTIME) != 0 {
                    return None;
                }
                let ino = get_var(&mut r)?;
                let full = if flags & V_CHANGE != 0 {
                    let base = bases.0.get(&ino)?;
                    if r.take(4)? != base_digest(base) {
                        return None;
                    }
                    get_words_v(&mut r, base, flags)?
                } else {
                    get_words_v(&mut r, &[0; RECORD_SIZE], flags)?
                };
                let mut rec = Box::new(Inode::decode(&full)?);
                let ops = get_ops(&mut r, Some(&ObjectNames::of(&rec.id)), true)?;
                match (flags & V_INLINE != 0, rec.inline_data.as_mut()) {
                    (true, Some(d)) => {
                        let len = get_var(&mut r)?;
                        if len != rec.size {
                            return None;
                        }
                        d.bytes = r.take(usize::try_from(len).ok()?)?.to_vec();
                    }
                    (false, None) => {}
                    _ => return None,
                }
                bases.set(ino, full);
                Item::Data { ino, rec, ops }
            }
            I_ENTRY => {
                let dir = r.u64()?;
                let name = get_str(&mut r)?;
                let target = match r.take(1)?[0] {
                    0 => None,
                    k => Some((r.u64()?, Kind::of_entry(k)?)),
                };
                Item::Entry { dir, name, target }
            }
            I_HEADER => Item::Header(TableHeader {
                free_head: r.u64()?,
                count: r.u64()?,
                unlinked_head: r.u64()?,
            }),
            I_XATTR => {
                let x = r.u64()?;
                let name = get_str(&mut r)?;
                let value = match r.take(1)?[0] {
                    0 => None,
                    1 => {
                        let n = r.u32()? as usize;
                        Some(r.take(n)?.to_vec())
                    }
                    _ => return None,
                };
                Item::Xattr { x, name, value }
            }
            I_OPS => Item::Ops(get_ops(&mut r, None, false)?),
            I_VOID => {
                let mut pos = || -> Option<LogPos> {
                    Some(LogPos {
                        seg: r.u64()?,
                        off: r.u64()?,
                    })
                };
                let (from, to) = (pos()?, pos()?);
                Item::Void { from, to }
            }
            I_SYNCED => {
                let upto = LogPos {
                    seg: r.u64()?,
                    off: r.u64()?,
                };
                let k = r.u32()? as usize;
                let mut inos = Vec::with_capacity(k.min(1 << 12));
                for _ in 0..k {
                    inos.push(r.u64()?);
                }
                Item::Synced { upto, inos }
            }
            _ => return None,
        });
    }
    (r.pos == b.len()).then_some(items)
}

/// The log of an open, writable volume.
pub(super) struct Wal {
    pub(super) keys: LogKeys,
    /// Writes the records, outside the engine lock ([`wal::LogIo`]).
    pub(super) io: Arc<wal::LogIo>,
    /// The segment appended to (`None` until the first append after an open or a going
    /// back, which starts one and has the anchor name it first).
    pub(super) writer: Option<Writer>,
    /// Where the log ends now: past the last record (the writer's position, or the end
    /// read at open or sealed before a going back).
    pub(super) end: LogPos,
    /// Segments from the one replay begins in, oldest first.
    pub(super) segments: Vec<u64>,
    /// Segments a checkpoint in flight folds in (its obsolete ones): until its anchor is
    /// stored, an anchor a seal of the log stores names a chain through them, so such a
    /// seal syncs them too ([`Inner::segments_between`]). Those before `synced` are done.
    pub(super) folded: Vec<u64>,
    /// The next segment id (this session's counter reservation; see docs/design.md,
    /// "Counters").
    pub(super) next_seg: u64,
    /// Everything before this is durable in the store (a seal syncs from here on).
    pub(super) synced: LogPos,
    /// Records a going back discarded, still in the segment appended to: the next append
    /// first logs that they do not count ([`Item::Void`]).
    pub(super) void: Option<(LogPos, LogPos)>,
    /// Bytes appended since the last checkpoint began.
    pub(super) bytes: u64,
}

/// What a request changed, for its group ([`Inner::log_point`]).
#[derive(Default)]
pub(super) struct Changes {
    /// Inodes whose record changed.
    pub(super) records: BTreeSet<u64>,
    /// Files whose data changed, with objects of theirs that their current names do not
    /// cover (the old objects of a re-encryption).
    pub(super) data: BTreeMap<u64, Vec<String>>,
    /// Entry and extended-attribute items, in order.
    pub(super) items: Vec<Item>,
    /// Inodes of fsyncs waiting for the next seal, and where their data sync began.
    pub(super) synced: Vec<(u64, LogPos)>,
}

impl Changes {
    fn is_empty(&self) -> bool {
        self.records.is_empty() && self.data.is_empty() && self.items.is_empty()
    }
}

/// Takes the data fields of `d` (a data item's record) into `cur`.
fn merge_data(cur: &mut Inode, d: &Inode) {
    cur.scheme = d.scheme;
    cur.id = d.id;
    cur.size = d.size;
    cur.mtime_ns = d.mtime_ns;
    cur.ctime_ns = cur.ctime_ns.max(d.ctime_ns);
    cur.tree = d.tree;
    cur.ctr_hw = d.ctr_hw;
    cur.counters = d.counters.clone();
    cur.inline_node = d.inline_node;
    cur.inline_mac = d.inline_mac;
    cur.inline_tags = d.inline_tags;
    cur.inline_data = d.inline_data.clone();
}

/// Takes the attribute fields of `a` (a record item) into `cur`.
fn merge_attrs(cur: &mut Inode, a: &Inode) {
    cur.kind = a.kind;
    cur.mode = a.mode;
    cur.uid = a.uid;
    cur.gid = a.gid;
    cur.nlink = a.nlink;
    cur.auto = a.auto;
    cur.scheme_set = a.scheme_set;
    cur.xattr = a.xattr;
    cur.atime_ns = a.atime_ns;
    cur.mtime_ns = a.mtime_ns;
    cur.ctime_ns = cur.ctime_ns.max(a.ctime_ns);
    cur.link = a.link;
}

/// One line about an item, for the debug log of a replay.
fn describe(it: &Item) -> String {
    let ops = |ops: &[LoggedOp]| {
        ops.iter()
            .map(|o| match o {
                LoggedOp::Write { name, off, data } => format!("W {name} {off}+{}", data.len()),
                LoggedOp::Direct { name, off, len } => format!("D {name} {off}+{len}"),
                LoggedOp::Copy {
                    name,
                    src,
                    dst,
                    len,
                } => format!("C {name} {src}->{dst}+{len}"),
                LoggedOp::SetLen { name, len } => format!("L {name} {len}"),
                LoggedOp::Delete { name } => format!("X {name}"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    match it {
        Item::Rec { ino, rec } => format!("record {ino} {:?} nlink {}", rec.kind, rec.nlink),
        Item::Data { ino, rec, ops: o } => format!(
            "data {ino} {} size {} leaves {} counters {:?} hw {} [{}]",
            hex::encode(&rec.id[..4]),
            rec.size,
            rec.tree.leaves,
            rec.counters,
            rec.ctr_hw,
            ops(o)
        ),
        Item::Entry { dir, name, target } => format!("entry {dir}/{name} -> {target:?}"),
        Item::Header(h) => format!("header {h:?}"),
        Item::Xattr { x, name, value } => {
            format!("xattr {x} {name} {:?}", value.as_ref().map(|v| v.len()))
        }
        Item::Ops(o) => format!("ops [{}]", ops(o)),
        Item::Synced { upto, inos } => format!("synced {inos:?} before {upto:?}"),
        Item::Void { from, to } => format!("void {from:?} .. {to:?}"),
    }
}

/// Leaf-log volumes ([`LEAF_LOG`]; docs/design.md, "Leaves in the log"): for a data item
/// of an `mt-eint` file whose tree is in its `.m` object (as the item's record leaves it),
/// that object's name and the nodes the item's leaves determine ([`ancestors`] of every
/// leaf a write of whole nodes to `.m` in `ops` covers), bottom-up. `None` for any other
/// item. The item's writer leaves out of the log every write of whole nodes all of which
/// are in the list; replay ([`derive_nodes`]) computes them again. Both sides compute the
/// list from what the log keeps (the record, and the writes of leaves, which are never
/// left out), so they agree.
fn derived_nodes(rec: &Inode, ops: &[LoggedOp]) -> Option<(String, Vec<u64>)> {
    let n = rec.tree.leaves;
    // A tree of fewer than two leaves has no internal node, and a file whose data is in
    // the table's slots has none (n = 0).
    if !matches!(rec.scheme, SchemeId::MtEintGcm | SchemeId::MtEintCbc)
        || rec.inline_tags.is_some()
        || n < 2
    {
        return None;
    }
    let meta = ObjectNames::of(&rec.id).meta;
    let mut leaves = Vec::new();
    for op in ops {
        if let LoggedOp::Write { name, off, data } = op {
            if *name == meta && off % 32 == 0 && data.len() % 32 == 0 {
                let first = off / 32;
                let end = first + data.len() as u64 / 32;
                leaves.extend((first.next_multiple_of(2)..end).step_by(2).map(|f| f / 2));
            }
        }
    }
    Some((meta, ancestors(n, leaves)))
}

/// The operations of a data item as a leaf-log volume logs them: without the writes of
/// whole nodes that [`derived_nodes`] lists.
fn without_derived(rec: &Inode, ops: Vec<LoggedOp>) -> Vec<LoggedOp> {
    let Some((meta, nodes)) = derived_nodes(rec, &ops) else {
        return ops;
    };
    if nodes.is_empty() {
        return ops;
    }
    let nodes: std::collections::HashSet<u64> = nodes.into_iter().collect();
    ops.into_iter()
        .filter(|op| match op {
            LoggedOp::Write { name, off, data }
                if *name == meta && off % 32 == 0 && data.len() % 32 == 0 && !data.is_empty() =>
            {
                let first = off / 32;
                !(first..first + data.len() as u64 / 32).all(|f| nodes.contains(&f))
            }
            _ => true,
        })
        .collect()
}

/// Replay of a leaf-log data item whose operations `tx` has staged: writes the nodes its
/// writer left out ([`derived_nodes`]), each computed from its children as `tx` reads them
/// (children first), where it differs from what `tx` holds; then checks the tree's peaks
/// against the item's root. `Ok(false)`: they do not give it (the objects under `tx` are not
/// the tree the item's writer had).
fn derive_nodes(hasher: &NodeHasher, tx: &mut Tx, rec: &Inode, ops: &[LoggedOp]) -> Result<bool> {
    let Some((meta, nodes)) = derived_nodes(rec, ops) else {
        return Ok(true);
    };
    if nodes.is_empty() {
        return Ok(true);
    }
    let read = |tx: &mut Tx, flat: u64| -> Result<Hash> {
        if let (0, Some(node)) = (flat, rec.inline_node) {
            return Ok(node);
        }
        let mut h = [0u8; 32];
        tx.read_at(&meta, flat * 32, &mut h)?;
        Ok(h)
    };
    for flat in nodes {
        let (level, start) = flat_span(flat);
        let below = level - 1;
        let left = read(tx, flat_index(below, start >> below))?;
        let right = read(tx, flat_index(below, (start >> below) + 1))?;
        let v = hasher.node(&rec.id, flat, &left, &right);
        if read(tx, flat)? != v {
            tx.replay(&LoggedOp::Write {
                name: meta.clone(),
                off: flat * 32,
                data: v.to_vec(),
            })?;
        }
    }
    let n = rec.tree.leaves;
    let mut tops = Vec::new();
    for (s, h) in peaks(n) {
        tops.push((s, read(tx, flat_index(h, s >> h))?));
    }
    Ok(hasher.root_from_peaks(&rec.id, n, &tops) == rec.tree.root)
}

fn log_damage(what: impl Into<String>) -> Error {
    Error::tampered(Subject::Journal, None, what)
}

impl Inner {
    /// Whether requests are logged: a writable volume whose front end did not ask for
    /// all-or-nothing commands ([`Volume::set_all_or_nothing`]).
    pub(super) fn logging(&self) -> bool {
        self.wal.is_some() && self.log_requests
    }

    /// Whether a seal must be a checkpoint whatever its caller asked: a volume that keeps
    /// no log, or the dirty limits or the log past their limits.
    pub(super) fn checkpoint_due(&self) -> bool {
        !self.logging()
            || self.commit_wanted
            || self
                .wal
                .as_ref()
                .is_some_and(|w| w.bytes >= super::LOG_LIMIT)
    }

    /// Notes that `ino`'s record changed in this request.
    pub(super) fn note_record(&mut self, ino: u64) {
        if self.logging() {
            self.changes.records.insert(ino);
        }
    }

    /// Notes that file `ino`'s data changed in this request.
    pub(super) fn note_data(&mut self, ino: u64) {
        if self.logging() {
            self.changes.data.entry(ino).or_default();
        }
    }

    /// [`Inner::note_data`], with objects of the file's that its current names do not
    /// cover (the old objects of a re-encryption, deleted with it).
    pub(super) fn note_data_with(&mut self, ino: u64, extra: Vec<String>) {
        if self.logging() {
            self.changes.data.entry(ino).or_default().extend(extra);
        }
    }

    /// Notes an item of this request (an entry or an extended attribute).
    pub(super) fn note_item(&mut self, item: Item) {
        if self.logging() {
            self.changes.items.push(item);
        }
    }

    /// Sets (`Some`) or removes an entry of directory `dir`, noting it for the log.
    pub(super) fn set_entry(
        &mut self,
        dir: u64,
        name: &str,
        target: Option<(u64, Kind)>,
    ) -> Result<()> {
        self.dir_put(dir, name, target)?;
        self.note_item(Item::Entry {
            dir,
            name: name.to_string(),
            target,
        });
        Ok(())
    }

    /// Ends a request whose result is `r`: its changes are logged ([`Inner::log_point`]),
    /// also when it failed halfway (what it changed is in memory, and would be sealed).
    pub(super) fn ended<T>(&mut self, r: Result<T>) -> Result<T> {
        self.last_logged = false;
        let logged = self.log_point();
        self.evict_idle();
        match (r, logged) {
            (Ok(v), Ok(())) => Ok(v),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        }
    }

    /// Ends a request: pushes what it wrote through the files' schemes and appends what it
    /// changed to the log as one group, so that it reaches the store before the request
    /// returns. Nothing to do when it changed nothing.
    pub(super) fn log_point(&mut self) -> Result<()> {
        if !self.logging() {
            self.changes.records.clear();
            self.changes.data.clear();
            self.changes.items.clear();
            let _ = self.tx.drain();
            return Ok(());
        }
        let header_changed = self.header != self.logged_header;
        if self.changes.is_empty() && !header_changed && !self.tx.has_captured() {
            return Ok(());
        }
        let r = self.log_changes(header_changed);
        self.changes.records.clear();
        self.changes.data.clear();
        self.changes.items.clear();
        if let Err(e) = &r {
            // What is in memory is not in the log: back to the last seal before the next
            // request.
            self.broke(e);
        }
        r
    }

    fn log_changes(&mut self, header_changed: bool) -> Result<()> {
        // 1. Data through the schemes (direct writes to the store, staged bytes).
        let data: Vec<(u64, Vec<String>)> =
            std::mem::take(&mut self.changes.data).into_iter().collect();
        for (ino, _) in &data {
            self.auto_first_store(*ino)?;
            self.settle_slots(*ino)?;
            let env = env!(self);
            let Some(of) = self.files.get_mut(ino) else {
                continue;
            };
            let flushed = of.dirty.len() * env.bs;
            // A file that left the table's slots in this request: its blocks are logged
            // with the slots' release (docs/design.md, "Small files in the inode table").
            self.tx.stage_all(of.stage_flush);
            let r = flush_data(&env, &mut self.tx, of, &mut self.scratch)
                .and_then(|()| finish_record(&self.keys, &mut self.tx, of, self.ctr_segments));
            self.tx.stage_all(false);
            r?;
            of.stage_flush = false;
            self.dirty_bytes = self.dirty_bytes.saturating_sub(flushed);
        }
        // Slots allocated or freed above changed the table's header.
        let header_changed = header_changed || self.header != self.logged_header;
        // 2. The group.
        let before = self.wal.as_ref().expect("logging").end;
        let mut ops = self.tx.drain();
        let mut items = Vec::new();
        if header_changed {
            items.push(Item::Header(self.header));
            self.logged_header = self.header;
        }
        let records = std::mem::take(&mut self.changes.records);
        for &ino in &records {
            let rec = match self.files.get(&ino) {
                Some(of) => of.inode.clone(),
                None => self.read_record(ino)?,
            };
            items.push(Item::Rec {
                ino,
                rec: Box::new(rec),
            });
        }
        items.append(&mut self.changes.items);
        for (ino, extra) in data {
            let Some(of) = self.files.get_mut(&ino) else {
                continue;
            };
            let names = of.state.names.all();
            let mine =
                |n: &str| names.iter().any(|m| m.as_str() == n) || extra.iter().any(|m| m == n);
            let (own, rest): (Vec<LoggedOp>, Vec<LoggedOp>) =
                ops.into_iter().partition(|op| mine(op.name()));
            ops = rest;
            if own.iter().any(|op| matches!(op, LoggedOp::Direct { .. })) {
                of.unsynced_since.get_or_insert(before);
            }
            let own = if self.leaf_log {
                without_derived(&of.inode, own)
            } else {
                own
            };
            items.push(Item::Data {
                ino,
                rec: Box::new(of.inode.clone()),
                ops: own,
            });
        }
        if !ops.is_empty() {
            items.push(Item::Ops(ops));
        }
        if items.is_empty() {
            return Ok(());
        }
        let end = self.log_append(&items)?;
        self.last_logged = true;
        // The request returns once its group is written ([`Volume::settle_log`]).
        self.log_ticket = self.wal.as_ref().and_then(|w| w.io.last_ticket());
        let n = self.commits_begun + 1;
        for it in &items {
            match it {
                Item::Rec { ino, .. } | Item::Data { ino, .. } => {
                    self.unsealed.pending(*ino, n, self.log_ticket);
                    if let Some(of) = self.files.get_mut(ino) {
                        of.logged_at = end;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Appends one group; starts a segment first if none is open (and has the anchor name
    /// it, so that a crash cannot orphan what follows), and closes a full one.
    pub(super) fn log_append(&mut self, items: &[Item]) -> Result<LogPos> {
        self.take_log_failure()?;
        if self.wal.as_ref().is_some_and(|w| w.writer.is_none()) {
            self.start_segment()?;
        }
        if let Some((from, to)) = self.wal.as_ref().and_then(|w| w.void) {
            self.void_discarded(from, to)?;
        }
        let w = self.wal.as_mut().expect("logging");
        let writer = w.writer.as_mut().expect("started above");
        if let Some(b) = self.log_bases.as_mut().filter(|b| b.0.len() >= BASES_MAX) {
            b.clear();
        }
        let bases = self.log_bases.as_mut();
        let payload = Payload::Group(encode_group_in(
            items,
            self.twin_blocks,
            self.leaf_log,
            bases,
        ));
        let r = writer.append(&w.io, &w.keys, &payload);
        match r {
            Ok((end, _)) => {
                w.bytes += end.off.saturating_sub(w.end.off);
                w.end = end;
                if writer.full() {
                    self.roll_segment()?;
                }
                Ok(self.wal.as_ref().expect("logging").end)
            }
            Err(e) => {
                // Not queued (too large); the bases took the group's items all the same,
                // so a new segment starts with whole records.
                w.writer = None;
                if let Some(b) = &mut self.log_bases {
                    b.clear();
                }
                Err(e)
            }
        }
    }

    /// A new segment with its `Begin`, synced, and an anchor that names it (so that the
    /// chain reaches it): after an open or a going back, before the first group.
    pub(super) fn start_segment(&mut self) -> Result<()> {
        let store = self.store.clone();
        let limit = self.anchor.ctr_next;
        let w = self.wal.as_mut().expect("logging");
        let seg = w.next_seg;
        if seg >= limit {
            return Err(Error::Invalid("write counters exhausted".into()));
        }
        let prev = (w.end != LogPos::default()).then_some(w.end);
        // The id is used up whatever happens next (a half-written segment is never
        // appended to again).
        w.next_seg += 1;
        let (writer, ticket) = Writer::begin(&w.io, &w.keys, seg, prev)?;
        w.io.flush_through(ticket)?;
        writer.sync(store.as_ref())?;
        let end = writer.pos();
        // Only once the anchor names it does the segment take records.
        self.anchor_log_end(end)?;
        let w = self.wal.as_mut().expect("logging");
        w.end = end;
        w.synced = end;
        w.segments.push(seg);
        w.writer = Some(writer);
        Ok(())
    }

    /// After a going back that kept its segment: logs that the discarded records in
    /// `[from, to)` do not count, and has the anchor cover that record (so that a crash
    /// from now on replays what follows it).
    fn void_discarded(&mut self, from: LogPos, to: LogPos) -> Result<()> {
        let store = self.store.clone();
        let w = self.wal.as_mut().expect("logging");
        let writer = w.writer.as_mut().expect("a segment is open");
        let payload = Payload::Group(encode_group(&[Item::Void { from, to }], false, false));
        let end = match writer
            .append(&w.io, &w.keys, &payload)
            .and_then(|(end, ticket)| w.io.flush_through(ticket).map(|()| end))
        {
            Ok(end) => end,
            Err(e) => {
                w.writer = None;
                return Err(e);
            }
        };
        w.end = end;
        w.void = None;
        let sync = self.segments_between(self.wal.as_ref().expect("logging").synced, end);
        store.sync(&sync)?;
        let w = self.wal.as_mut().expect("logging");
        w.synced = end;
        self.anchor_log_end(end)
    }

    /// Stores an anchor whose log ends at `end` (its sealed part keeps its start; a tail
    /// may follow), and takes it as the current anchor.
    fn anchor_log_end(&mut self, end: LogPos) -> Result<()> {
        self.sealer.store(0, |a| {
            let start = a.log.map_or(end, |l| l.sealed.start);
            a.log = Some(AnchorLog {
                sealed: wal::LogRef { start, end },
                tail: true,
            });
        })?;
        self.anchor = self.sealer.last();
        Ok(())
    }

    /// Closes the current segment with `Next` and opens its successor (its `Begin` names
    /// where the closed one ends). Returns where the new one's records begin.
    pub(super) fn roll_segment(&mut self) -> Result<LogPos> {
        let limit = self.anchor.ctr_next;
        let w = self.wal.as_mut().expect("logging");
        let seg = w.next_seg;
        if seg >= limit {
            return Err(Error::Invalid("write counters exhausted".into()));
        }
        let mut old = w.writer.take().expect("a segment is open");
        let (end, _) = old.append(&w.io, &w.keys, &Payload::Next { seg })?;
        let (writer, _) = Writer::begin(&w.io, &w.keys, seg, Some(end))?;
        w.next_seg += 1;
        w.segments.push(seg);
        w.end = writer.pos();
        w.writer = Some(writer);
        Ok(w.end)
    }

    /// Takes a failed write of the log's records ([`wal::LogIo::take_failure`]): that
    /// segment's tail is unknown, so a new one starts, and the caller goes back to the last
    /// seal ([`Inner::broke`]): what is in memory is not all in the log.
    pub(super) fn take_log_failure(&mut self) -> Result<()> {
        let Some(w) = &mut self.wal else {
            return Ok(());
        };
        let Some((from, e)) = w.io.take_failure() else {
            return Ok(());
        };
        w.writer = None;
        self.unsealed.log_failed(from);
        if let Some(b) = &mut self.log_bases {
            b.clear();
        }
        Err(e)
    }

    /// What a seal waits for before it syncs the log: every record queued so far written
    /// ([`wal::LogIo::flush_through`]).
    pub(super) fn log_wait(&self) -> Option<(Arc<wal::LogIo>, u64)> {
        let w = self.wal.as_ref()?;
        Some((w.io.clone(), w.io.last_ticket()?))
    }

    /// Forgets what was noted for the log (the checkpoint being prepared holds it).
    pub(super) fn forget_changes(&mut self) {
        let _ = self.tx.drain();
        self.changes.records.clear();
        self.changes.data.clear();
        self.changes.items.clear();
        self.logged_header = self.header;
    }

    /// Phase A of a checkpoint, for the log: closes the current segment and opens the one
    /// the checkpoint's anchor names as where replay begins. Returns that position, the
    /// segment to sync before the anchor (its `Begin`), and the segments the checkpoint
    /// makes obsolete.
    pub(super) fn roll_for_checkpoint(
        &mut self,
    ) -> Result<(Option<LogPos>, Vec<String>, Vec<String>)> {
        if self.wal.is_none() {
            return Ok((None, Vec::new(), Vec::new()));
        }
        let old: Vec<u64> = self.wal.as_ref().expect("logging").segments.clone();
        let start = if self.wal.as_ref().expect("logging").writer.is_some() {
            self.roll_segment()?
        } else {
            let limit = self.anchor.ctr_next;
            let w = self.wal.as_mut().expect("logging");
            let seg = w.next_seg;
            if seg >= limit {
                return Err(Error::Invalid("write counters exhausted".into()));
            }
            let prev = (w.end != LogPos::default()).then_some(w.end);
            let (writer, _) = Writer::begin(&w.io, &w.keys, seg, prev)?;
            w.next_seg += 1;
            w.segments.push(seg);
            w.end = writer.pos();
            w.writer = Some(writer);
            w.end
        };
        // Replay may begin at `start` from now on: no data item after it is a change of one
        // before it.
        if let Some(b) = &mut self.log_bases {
            b.clear();
        }
        let w = self.wal.as_mut().expect("logging");
        let synced = w.synced.seg;
        w.folded.retain(|&s| s >= synced);
        w.folded
            .extend(w.segments.iter().copied().filter(|&s| s != start.seg));
        w.segments.retain(|&s| s == start.seg);
        w.bytes = 0;
        let obsolete = old
            .into_iter()
            .filter(|&s| s != start.seg)
            .map(wal::segment_name)
            .collect();
        Ok((Some(start), vec![wal::segment_name(start.seg)], obsolete))
    }

    /// Phase A of a seal of the log (an fsync's): logs which files' appends the waiting
    /// fsyncs made durable, and takes the anchor that seals the log up to here. `None`:
    /// nothing new to seal.
    pub(super) fn log_seal_begin(&mut self) -> Result<Option<super::commit::InFlight>> {
        if self.read_only || self.wal.is_none() {
            return Ok(None);
        }
        if self.is_broken() {
            self.mend();
            if let Some(why) = &self.poisoned {
                return Err(Error::Poisoned(why.clone()));
            }
        }
        let synced = std::mem::take(&mut self.changes.synced);
        if !synced.is_empty() {
            let mut by_pos: BTreeMap<LogPos, Vec<u64>> = BTreeMap::new();
            for (ino, at) in synced {
                by_pos.entry(at).or_default().push(ino);
            }
            let items: Vec<Item> = by_pos
                .into_iter()
                .map(|(upto, inos)| Item::Synced { upto, inos })
                .collect();
            if let Err(e) = self.log_append(&items) {
                self.broke(&e);
                return Err(e);
            }
        }
        let target = self.wal.as_ref().expect("logging").end;
        let sealed = self.sealer.last().log.map(|l| l.sealed.end);
        self.commits_begun += 1;
        let n = self.commits_begun;
        if sealed.is_none_or(|s| target <= s) {
            // Nothing logged past what the anchor covers.
            self.commits_ended = self.commits_ended.max(n);
            self.unsealed.log_sealed(n);
            return Ok(None);
        }
        let from = self.wal.as_ref().expect("logging").synced;
        self.log_sealing = true;
        Ok(Some(super::commit::InFlight {
            n,
            commit: None,
            itable: None,
            log_sync: self.segments_between(from, target),
            obsolete: Vec::new(),
            log_end: Some(target),
            log_wait: self.log_wait(),
            journal_key: self.keys.journal.clone(),
            store: self.store.clone(),
            sealer: self.sealer.clone(),
        }))
    }

    /// Names of the segments holding records in `[from, to)` (the ones a seal syncs).
    pub(super) fn segments_between(&self, from: LogPos, to: LogPos) -> Vec<String> {
        self.wal
            .as_ref()
            .map(|w| {
                let mut ids: Vec<u64> = w
                    .folded
                    .iter()
                    .chain(&w.segments)
                    .copied()
                    .filter(|&s| s >= from.seg && s <= to.seg)
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                ids.into_iter().map(wal::segment_name).collect()
            })
            .unwrap_or_default()
    }

    /// Replays groups read back from the log (docs/design.md, "The log"): in order, leaving
    /// out a file's data items from the first one whose direct writes did not survive (no
    /// fsync covered them). Returns how many groups were applied.
    pub(super) fn replay_log(&mut self, groups: Vec<(LogPos, Vec<u8>)>) -> Result<usize> {
        let mut decoded = Vec::with_capacity(groups.len());
        let mut bases = Bases::default();
        for (at, bytes) in groups {
            let items = decode_group_in(&bytes, &mut bases).ok_or_else(|| {
                log_damage(format!(
                    "log record at {:016x}:{} does not parse",
                    at.seg, at.off
                ))
            })?;
            decoded.push((at, items));
        }
        // Records a going back discarded (a later record says so) do not count.
        let voids: Vec<(LogPos, LogPos)> = decoded
            .iter()
            .flat_map(|(_, items)| items.iter())
            .filter_map(|it| match it {
                Item::Void { from, to } => Some((*from, *to)),
                _ => None,
            })
            .collect();
        decoded.retain(|(at, _)| !voids.iter().any(|(f, t)| at >= f && at < t));
        let skip = self.check_unsynced(&decoded)?;
        for (k, (at, items)) in decoded.iter().enumerate() {
            for (j, it) in items.iter().enumerate() {
                tracing::debug!(
                    seg = at.seg,
                    off = at.off,
                    left_out = skip.contains(&(k, j)),
                    item = %describe(it),
                    "replay"
                );
            }
        }
        let n = decoded.len();
        for (k, (_, items)) in decoded.into_iter().enumerate() {
            for (j, it) in items.into_iter().enumerate() {
                if skip.contains(&(k, j)) {
                    continue;
                }
                self.replay_item(it)?;
            }
        }
        self.load_replayed_inline()?;
        Ok(n)
    }

    /// After a replay: reads from their slots the bytes of the inline files the log
    /// changed only the attributes of (their slots are as the last checkpoint left them).
    fn load_replayed_inline(&mut self) -> Result<()> {
        let missing: Vec<u64> = self
            .files
            .iter()
            .filter(|(_, of)| {
                of.inode
                    .inline_data
                    .as_ref()
                    .is_some_and(|d| d.bytes.len() as u64 != of.inode.size)
            })
            .map(|(&ino, _)| ino)
            .collect();
        for ino in missing {
            let mut inode = self.files[&ino].inode.clone();
            self.load_inline(ino, &mut inode)?;
            self.files.get_mut(&ino).expect("listed").inode = inode;
        }
        Ok(())
    }

    /// Finds the data items to leave out: for each file, its data items that no `Synced`
    /// covers are checked (their direct writes read back through the file's scheme, under
    /// the state they logged); from the first that fails, the file's later data items go.
    fn check_unsynced(
        &mut self,
        groups: &[(LogPos, Vec<Item>)],
    ) -> Result<BTreeSet<(usize, usize)>> {
        // Per inode: its data items since it was last created or freed, and the last
        // position a Synced covers for it.
        struct Run {
            items: Vec<(usize, usize)>,
            synced: Option<LogPos>,
        }
        let mut runs: Vec<Run> = Vec::new();
        let mut current: HashMap<u64, usize> = HashMap::new();
        for (k, (_, items)) in groups.iter().enumerate() {
            for (j, it) in items.iter().enumerate() {
                match it {
                    // A freed inode: a later file there is another one.
                    Item::Rec { ino, rec } if rec.kind == Kind::Free => {
                        current.remove(ino);
                    }
                    Item::Data { ino, .. } => {
                        let r = *current.entry(*ino).or_insert_with(|| {
                            runs.push(Run {
                                items: Vec::new(),
                                synced: None,
                            });
                            runs.len() - 1
                        });
                        runs[r].items.push((k, j));
                    }
                    Item::Synced { upto, inos } => {
                        for ino in inos {
                            if let Some(&r) = current.get(ino) {
                                runs[r].synced = Some(*upto);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut skip = BTreeSet::new();
        for run in runs {
            let unsynced: Vec<(usize, usize)> = run
                .items
                .iter()
                .copied()
                .filter(|&(k, _)| run.synced.is_none_or(|s| groups[k].0 >= s))
                .collect();
            let direct = |k: usize, j: usize| match &groups[k].1[j] {
                Item::Data { ops, .. } => ops.iter().any(|o| matches!(o, LoggedOp::Direct { .. })),
                _ => false,
            };
            if !unsynced.iter().any(|&(k, j)| direct(k, j)) {
                continue;
            }
            // Fast path: the whole run holds.
            let all = run.items.len();
            if self.run_holds(groups, &run.items, all, &unsynced)? {
                continue;
            }
            let mut cut = None;
            for (m, &(k, j)) in run.items.iter().enumerate() {
                if !unsynced.contains(&(k, j)) {
                    continue;
                }
                if !self.run_holds(groups, &run.items, m + 1, &unsynced)? {
                    cut = Some(m);
                    break;
                }
            }
            let cut = cut.unwrap_or(all);
            if let Some(&(k, j)) = run.items.get(cut) {
                let ino = match &groups[k].1[j] {
                    Item::Data { ino, .. } => *ino,
                    _ => unreachable!("runs hold data items"),
                };
                tracing::warn!(
                    ino,
                    kept = cut,
                    left_out = all - cut,
                    "writes not fsynced before a crash did not all reach the store: the file \
                     is back at its last complete state"
                );
            }
            skip.extend(run.items[cut..].iter().copied());
        }
        Ok(skip)
    }

    /// Whether the first `n` data items of a run leave every block they wrote directly
    /// readable (among the `unsynced` ones): the file's state after them, its objects as
    /// the store holds them plus the staged changes, read through its scheme.
    fn run_holds(
        &mut self,
        groups: &[(LogPos, Vec<Item>)],
        run: &[(usize, usize)],
        n: usize,
        unsynced: &[(usize, usize)],
    ) -> Result<bool> {
        let mut tx = Tx::read_only(self.store.clone());
        let mut last = None;
        for &(k, j) in &run[..n] {
            let Item::Data { rec, ops, .. } = &groups[k].1[j] else {
                unreachable!("runs hold data items")
            };
            for op in ops {
                if tx.replay(op).is_err() {
                    return Ok(false);
                }
            }
            // A tree that does not match is caught by the read below.
            if self.leaf_log && derive_nodes(&self.keys.hasher, &mut tx, rec, ops).is_err() {
                return Ok(false);
            }
            last = Some(rec);
        }
        let rec = last.expect("n > 0");
        let cache = NodeCache::new(0);
        let env = Env {
            cache: &cache,
            ..env!(self)
        };
        let of = match OpenFile::load((**rec).clone(), &self.keys, &mut tx, Subject::Journal) {
            Ok(of) => of,
            Err(e) if e.is_tampered() => return Ok(false),
            Err(e) => return Err(e),
        };
        let bs = env.bs as u64;
        let blocks = of.state.blocks();
        for &(k, j) in &run[..n] {
            if !unsynced.contains(&(k, j)) {
                continue;
            }
            let Item::Data { ops, .. } = &groups[k].1[j] else {
                unreachable!("runs hold data items")
            };
            for op in ops {
                let LoggedOp::Direct { name, off, len } = op else {
                    continue;
                };
                // Missing or short: the write did not reach the store.
                if self.store.len(name)?.is_none_or(|l| l < off + len) {
                    return Ok(false);
                }
                if !of.state.names.blocks().contains(&name) {
                    continue;
                }
                let first = off / bs;
                let end = (off + len).div_ceil(bs).min(blocks);
                let mut b = first;
                while b < end {
                    let e = end.min(b + 256);
                    let mut buf = vec![0u8; ((e - b) * bs) as usize];
                    match scheme(of.inode.scheme).read_blocks(
                        &env,
                        &of.state.peek(),
                        &mut tx,
                        b,
                        &mut buf,
                    ) {
                        Ok(()) => {}
                        Err(e) if e.is_tampered() => return Ok(false),
                        Err(e) => return Err(e),
                    }
                    b = e;
                }
            }
        }
        Ok(true)
    }

    /// Applies one item to the engine's state (records dirty, entries, the overlay).
    fn replay_item(&mut self, it: Item) -> Result<()> {
        match it {
            Item::Rec { ino, rec } => {
                if ino == 0 {
                    return Err(log_damage("the log names inode 0"));
                }
                // A number past the table's records is free (the table grows at the
                // checkpoint that writes the new record).
                let in_table = (ino + 1) * RECORD_SIZE as u64 <= self.itable.inode.size;
                let cur_free = match self.files.get(&ino) {
                    Some(_) => false,
                    None => {
                        ino >= self.header.count
                            || !in_table
                            || self.read_record(ino)?.kind == Kind::Free
                    }
                };
                if rec.kind == Kind::Free {
                    // Its nodes age out of the node cache (see `free_ino`).
                    self.files.remove(&ino);
                    self.write_record(ino, &rec)?;
                    return Ok(());
                }
                if cur_free {
                    // Created empty: its data items, if any survived, fill it.
                    let mut rec = *rec;
                    rec.size = 0;
                    rec.tree = self.empty_tree(rec.scheme, &rec.id);
                    rec.counters = TrustedCounters::Inline(crate::tree::CounterIntervals::new());
                    rec.ctr_hw = 0;
                    rec.inline_node = None;
                    rec.inline_mac = None;
                    rec.inline_tags = None;
                    // Its slots come with its data items (the record lists none yet).
                    rec.inline_data = rec.inline_data.map(|_| InlineData::default());
                    let mut of =
                        OpenFile::load(rec, &self.keys, &mut self.tx, Subject::Inode(ino))?;
                    match of.inode.kind {
                        Kind::Dir if !self.dir_tree => of.dir = Some(BTreeMap::new()),
                        Kind::Xattr => of.xattrs = Some(XattrSet::default()),
                        _ => {}
                    }
                    of.dir_dirty = of.dir.is_some();
                    of.xattrs_dirty = of.inode.kind == Kind::Xattr;
                    of.record_dirty = true;
                    self.files.insert(ino, of);
                    return Ok(());
                }
                let of = self.replay_open(ino)?;
                merge_attrs(&mut of.inode, &rec);
                of.record_dirty = true;
            }
            Item::Data { ino, rec, ops } => {
                // The record as it was, before the item's changes of its objects (its
                // spilled counters, say) are staged.
                let (mut inode, dir, xattrs) = match self.files.remove(&ino) {
                    Some(of) => (of.inode, of.dir, of.xattrs),
                    None => (self.replay_record(ino)?, None, None),
                };
                for op in &ops {
                    self.tx.replay(op)?;
                }
                if self.leaf_log && !derive_nodes(&self.keys.hasher, &mut self.tx, &rec, &ops)? {
                    // A node of `.m` the recomputation read is not the one the item's writer
                    // had: damage or tampering of that file's tree. The root the log holds
                    // stays the trusted one, so every read under the node fails its check
                    // and names the file and block; the rest of the volume opens.
                    self.replay_failures += 1;
                    tracing::error!(
                        ino,
                        "integrity failure: the Merkle nodes recomputed from the leaves the \
                         log holds do not give the root it holds (the file's tree in the store \
                         is damaged or was tampered with; reads under it will fail)"
                    );
                }
                if self.twin_blocks {
                    // Twin blocks: the item may have moved blocks between slots in ways
                    // its operations do not show (a hole), so none of the file's blocks
                    // goes directly to a slot until the next checkpoint (docs/design.md,
                    // "Twin blocks"; the open checkpoints after a replay at once).
                    for name in ObjectNames::of(&rec.id).blocks() {
                        self.tx.touch(name, 0, u64::MAX);
                    }
                }
                merge_data(&mut inode, &rec);
                // Its slots in the table as the log says (allocated by the group's header).
                self.write_slots(&inode)?;
                let mut new = OpenFile::load(inode, &self.keys, &mut self.tx, Subject::Inode(ino))?;
                new.dir = dir;
                new.xattrs = xattrs;
                new.record_dirty = true;
                if ops.iter().any(|o| matches!(o, LoggedOp::Direct { .. })) {
                    // Its appends may not be durable: an fsync syncs them.
                    let at = self.wal.as_ref().map(|w| w.end).unwrap_or_default();
                    new.unsynced_since = Some(at);
                }
                self.files.insert(ino, new);
            }
            Item::Entry { dir, name, target } => {
                self.replay_open(dir)?;
                self.dir_put(dir, &name, target)?;
                let of = self.files.get_mut(&dir).expect("opened by replay_open");
                of.dir_dirty = of.dir.is_some();
                of.subdirs = None;
                of.record_dirty = true;
            }
            Item::Header(h) => {
                self.header = h;
                self.logged_header = h;
                self.header_dirty = true;
            }
            Item::Xattr { x, name, value } => {
                let set = self.xattrs_of(x)?;
                match value {
                    Some(v) => {
                        set.set(&name, &v, usize::MAX)?;
                    }
                    None => {
                        set.remove(&name);
                    }
                }
                self.files.get_mut(&x).expect("loaded").xattrs_dirty = true;
            }
            Item::Ops(ops) => {
                for op in &ops {
                    self.tx.replay(op)?;
                }
            }
            Item::Synced { .. } | Item::Void { .. } => {}
        }
        Ok(())
    }

    /// An inode the log changes, loaded from the table if it is not open (also a number
    /// the front end was told is gone: replay rebuilds what the log holds).
    fn replay_open(&mut self, ino: u64) -> Result<&mut OpenFile> {
        if !self.files.contains_key(&ino) {
            let inode = self.replay_record(ino)?;
            let of = OpenFile::load(inode, &self.keys, &mut self.tx, Subject::Inode(ino))?;
            self.files.insert(ino, of);
        }
        Ok(self.files.get_mut(&ino).expect("loaded"))
    }

    /// The table's record of an inode the log changes (which must be in use).
    fn replay_record(&mut self, ino: u64) -> Result<Inode> {
        if ino == 0 || ino >= self.header.count {
            return Err(log_damage(format!(
                "the log changes inode {ino}, past the inode table"
            )));
        }
        let inode = self.read_record(ino)?;
        if matches!(inode.kind, Kind::Free | Kind::Data) {
            return Err(log_damage(format!(
                "the log changes inode {ino}, which is free or a slot of inline data"
            )));
        }
        // An inline file's bytes are read from its slots once the whole log is replayed
        // ([`Inner::load_replayed_inline`]): items before its data item may have freed
        // slots the table's older record still lists.
        Ok(inode)
    }

    /// Reads the log the anchor names and replays it (an open; `sealed_only`: a going
    /// back, which keeps only what a seal covered). Returns the chain's end and how many
    /// groups were applied.
    pub(super) fn replay_anchored_log(
        &mut self,
        sealed_only: bool,
    ) -> Result<(LogPos, Vec<u64>, usize)> {
        let Some(l) = self.anchor.log else {
            return Ok((LogPos::default(), Vec::new(), 0));
        };
        let keys = LogKeys::new(&self.keys.log, self.anchor.volume_id);
        let chain: Chain = wal::read_chain(self.store.as_ref(), &keys, &l.sealed)?;
        let tail = l.tail && !sealed_only;
        let mut end = l.sealed.end;
        let groups: Vec<(LogPos, Vec<u8>)> = chain
            .groups
            .into_iter()
            .filter(|(_, _, sealed)| *sealed || tail)
            .map(|(at, g, _)| (at, g))
            .collect();
        if tail {
            end = chain.end;
        }
        // The replay changes objects below the directories' units (its data items): no
        // unit read before it may be served after it. Both callers start with an empty
        // cache (a new volume, or `reload`); this keeps the rule whoever calls.
        let n = self.replay_log(groups);
        self.units.clear();
        Ok((end, chain.segments, n?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `mt-eint` file's record of 3 leaves (root all 5s), id `id`, for the item tests.
    fn file_rec(id: [u8; 16]) -> Inode {
        Inode::new(
            Kind::File,
            SchemeId::MtEintGcm,
            id,
            crate::tree::TreeState {
                leaves: 3,
                root: [5; 32],
            },
            0o644,
        )
    }

    /// `r` as a compact data item gives it back: its data fields, the fields only
    /// attributes use zero.
    fn data_only(r: &Inode) -> Inode {
        let mut d = r.clone();
        (d.mode, d.uid, d.gid, d.nlink, d.atime_ns, d.link) = (0, 0, 0, 0, 0, 0);
        d
    }

    /// Every operation survives a group's encoding; a copy's bytes are frozen
    /// (docs/file-format.md §6a, operation 5).
    #[test]
    fn a_group_of_every_operation_round_trips_and_a_copy_is_a_few_bytes() {
        let ops = vec![
            LoggedOp::Write {
                name: "a.m".into(),
                off: 3,
                data: b"xyz".to_vec(),
            },
            LoggedOp::SetLen {
                name: "a.c".into(),
                len: 76,
            },
            LoggedOp::Delete { name: "b.d".into() },
            LoggedOp::Direct {
                name: "a.d".into(),
                off: 4096,
                len: 8192,
            },
            LoggedOp::Copy {
                name: "a.c".into(),
                src: 36,
                dst: 68,
                len: 8,
            },
        ];
        for compact in [false, true] {
            let group = encode_group(&[Item::Ops(ops.clone())], compact, false);
            match decode_group(&group).as_deref() {
                Some([Item::Ops(back)]) => assert_eq!(back, &ops),
                other => panic!("decoded {other:?}"),
            }
        }
        let mut b = Vec::new();
        put_ops(&mut b, &ops[4..], true, None, false);
        let mut want = vec![1, 0, 0, 0, 5, 3, 0];
        want.extend_from_slice(b"a.c");
        for v in [36u64, 68, 8] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(b, want);
        assert_eq!(b.len() - 4, 1 + 2 + 3 + 24, "code, name and three u64");
    }

    /// On a volume with twin blocks, an operation on the previous one's object leaves its
    /// name out (code bit 0x80, frozen bytes), and a list that starts with one does not
    /// parse.
    #[test]
    fn an_operation_on_the_previous_object_leaves_its_name_out() {
        let ops = vec![
            LoggedOp::SetLen {
                name: "a.c".into(),
                len: 76,
            },
            LoggedOp::Write {
                name: "a.c".into(),
                off: 3,
                data: b"xy".to_vec(),
            },
            LoggedOp::Delete { name: "b.d".into() },
        ];
        let mut b = Vec::new();
        put_ops(&mut b, &ops, true, None, false);
        let mut want = vec![3, 0, 0, 0, 2, 3, 0];
        want.extend_from_slice(b"a.c");
        want.extend_from_slice(&76u64.to_le_bytes());
        want.push(0x81);
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(b"xy");
        want.extend_from_slice(&[3, 3, 0]);
        want.extend_from_slice(b"b.d");
        assert_eq!(b, want);
        let mut r = crate::tx::Reader { b: &b, pos: 0 };
        assert_eq!(get_ops(&mut r, None, false), Some(ops.clone()));
        let mut plain = Vec::new();
        put_ops(&mut plain, &ops, false, None, false);
        assert_eq!(plain.len(), b.len() + 5, "the name written again");
        let first_same = [1, 0, 0, 0, 0x83];
        assert_eq!(
            get_ops(
                &mut crate::tx::Reader {
                    b: &first_same,
                    pos: 0
                },
                None,
                false
            ),
            None
        );
    }

    /// A leaf-log volume's data item (tag 10, frozen bytes): the record's data fields, as
    /// words with a map of those that are not zero, and the file's own objects named by a
    /// code; it decodes to the data fields (attributes read as zero), the operations whole.
    /// An own-object code past the four objects, or one in an item that is not compact,
    /// does not parse.
    #[test]
    fn a_compact_data_item_keeps_the_data_fields_and_names_own_objects_by_code() {
        let id = [0xab; 16];
        let mut rec = file_rec(id);
        rec.uid = 1000;
        rec.gid = 1000;
        rec.nlink = 2;
        rec.size = 10_000;
        rec.mtime_ns = 77;
        rec.ctime_ns = 78;
        rec.atime_ns = 79;
        rec.link = 4;
        let names = ObjectNames::of(&id);
        let ops = vec![
            LoggedOp::Write {
                name: names.meta.clone(),
                off: 64,
                data: vec![9; 32],
            },
            LoggedOp::Direct {
                name: names.twin.clone(),
                off: 8192,
                len: 4096,
            },
            LoggedOp::SetLen {
                name: "f/00/other.c".into(),
                len: 12,
            },
        ];
        let item = Item::Data {
            ino: 9,
            rec: Box::new(rec.clone()),
            ops: ops.clone(),
        };
        let group = encode_group(std::slice::from_ref(&item), true, true);
        let full = rec.encode();
        let mut want = Vec::new();
        want.extend_from_slice(&1u32.to_le_bytes());
        want.push(10);
        want.extend_from_slice(&9u64.to_le_bytes());
        // Words 0 (kind, scheme), 3 (size), 4 (mtime), 5 (ctime), 7-8 (id), 9 (leaves),
        // 10-13 (root); atime, link, the owner and the counters (none: all zero) are not.
        let words = [0usize, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13];
        let map: u32 = words.iter().map(|w| 1u32 << w).sum();
        want.extend_from_slice(&map.to_le_bytes());
        for w in words {
            let mut word = full[8 * w..8 * w + 8].to_vec();
            if w == 0 {
                word[3..].fill(0);
            }
            want.extend_from_slice(&word);
        }
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&[1 | 0x40, 1]);
        want.extend_from_slice(&64u64.to_le_bytes());
        want.extend_from_slice(&32u32.to_le_bytes());
        want.extend_from_slice(&[9; 32]);
        want.extend_from_slice(&[4 | 0x40, 3]);
        want.extend_from_slice(&8192u64.to_le_bytes());
        want.extend_from_slice(&4096u64.to_le_bytes());
        want.extend_from_slice(&[2, 12, 0]);
        want.extend_from_slice(b"f/00/other.c");
        want.extend_from_slice(&12u64.to_le_bytes());
        assert_eq!(group, want);
        let decoded = decode_group(&group);
        let Some(
            [Item::Data {
                ino: 9,
                rec: back,
                ops: back_ops,
            }],
        ) = decoded.as_deref()
        else {
            panic!("decodes");
        };
        assert_eq!(back_ops, &ops);
        assert_eq!(**back, data_only(&rec));
        let mut cur = rec.clone();
        merge_data(&mut cur, back);
        assert_eq!(cur, rec, "the data fields are whole");
        // An own-object code past `.t`.
        let mut bad = group.clone();
        let at = want.len() - (2 + 8 + 8) - (1 + 2 + 12 + 8) + 1;
        assert_eq!(bad[at], 3);
        bad[at] = 4;
        assert_eq!(decode_group(&bad), None);
        // The same code in an item that is not compact.
        let plain = encode_group(std::slice::from_ref(&item), true, false);
        let mut bad = plain.clone();
        let at = 4 + 1 + 8 + RECORD_SIZE + 4;
        assert_eq!(bad[at], 1);
        bad.splice(at..at + 3 + names.meta.len(), [1 | 0x40, 1]);
        assert_eq!(decode_group(&bad), None);
        assert!(
            group.len() + 200 < plain.len(),
            "{} against {}",
            group.len(),
            plain.len()
        );
    }

    /// Varints ([`put_var`], frozen): 7 bits a byte, low first; at most 10 bytes, and
    /// nothing past `u64` parses.
    #[test]
    fn varints_are_leb128() {
        for (v, want) in [
            (0u64, vec![0u8]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0x01]),
            (8192, vec![0x80, 0x40]),
            (u64::MAX, [vec![0xff; 9], vec![0x01]].concat()),
        ] {
            let mut b = Vec::new();
            put_var(&mut b, v);
            assert_eq!(b, want, "{v}");
            let mut r = crate::tx::Reader { b: &b, pos: 0 };
            assert_eq!(get_var(&mut r), Some(v));
            assert_eq!(r.pos, b.len());
        }
        for bad in [
            [vec![0xff; 9], vec![0x02]].concat(),
            vec![0x80; 10],
            vec![0x80],
        ] {
            assert_eq!(get_var(&mut crate::tx::Reader { b: &bad, pos: 0 }), None);
        }
    }

    /// A log-delta volume's data items (tag 12, frozen bytes). The first of a file holds
    /// its record's non-zero data words; the next holds the words that changed since, after
    /// the first 4 bytes of its base's hash; a ctime equal to the mtime is left out (flag
    /// 4). Operations are varints, a write without its trailing zeros. The second does not
    /// parse without its base, or after another one.
    #[test]
    fn a_delta_data_item_holds_the_words_that_changed() {
        let id = [0xab; 16];
        let mut rec = file_rec(id);
        rec.uid = 1000;
        rec.size = 10_000;
        rec.mtime_ns = 77;
        rec.ctime_ns = 77;
        let names = ObjectNames::of(&id);
        let leaf = [vec![9u8; 16], vec![0; 16]].concat();
        let ops = vec![
            LoggedOp::Write {
                name: names.meta.clone(),
                off: 64,
                data: leaf,
            },
            LoggedOp::Direct {
                name: names.twin.clone(),
                off: 8192,
                len: 4096,
            },
            LoggedOp::SetLen {
                name: "f/00/other.c".into(),
                len: 12,
            },
        ];
        let first = Item::Data {
            ino: 9,
            rec: Box::new(rec.clone()),
            ops: ops.clone(),
        };
        let mut bases = Bases::default();
        let g1 = encode_group_in(std::slice::from_ref(&first), true, true, Some(&mut bases));
        let full = rec.encode();
        let word = |w: usize| {
            let mut x = full[8 * w..8 * w + 8].to_vec();
            if w == 0 {
                x[3..].fill(0);
            }
            x
        };
        let mut want = vec![1, 0, 0, 0, 12, 4, 9];
        // Words 0 (kind, scheme), 3 (size), 4 (mtime), 7-8 (id), 9 (leaves), 10-13
        // (root); not 5, the ctime (flag 4).
        let words = [0usize, 3, 4, 7, 8, 9, 10, 11, 12, 13];
        want.extend_from_slice(&words.iter().map(|w| 1u32 << w).sum::<u32>().to_le_bytes());
        for w in words {
            want.extend_from_slice(&word(w));
        }
        // Three operations: `.m` (own 1) at 64, 32 bytes of which 16 are kept; `.t` (own
        // 3) from 8192, 4096 bytes; another object's length, 12.
        want.extend_from_slice(&[3, 1 | 0x40, 1, 64, 32, 16]);
        want.extend_from_slice(&[9; 16]);
        want.extend_from_slice(&[4 | 0x40, 3, 0x80, 0x40, 0x80, 0x20]);
        want.extend_from_slice(&[2, 12, 0]);
        want.extend_from_slice(b"f/00/other.c");
        want.push(12);
        assert_eq!(g1, want);
        // The next write: size, mtime and ctime, and the root change.
        let mut next = rec.clone();
        next.size = 12_288;
        next.mtime_ns = 90;
        next.ctime_ns = 90;
        next.tree.root = [6; 32];
        let second = Item::Data {
            ino: 9,
            rec: Box::new(next.clone()),
            ops: ops[..1].to_vec(),
        };
        let g2 = encode_group_in(std::slice::from_ref(&second), true, true, Some(&mut bases));
        let nfull = next.encode();
        let mut want = vec![1, 0, 0, 0, 12, 2 | 4, 9];
        want.extend_from_slice(&base_digest(&data_rec_bytes(&rec)));
        let words = [3usize, 4, 10, 11, 12, 13];
        want.extend_from_slice(&words.iter().map(|w| 1u32 << w).sum::<u32>().to_le_bytes());
        for w in words {
            want.extend_from_slice(&nfull[8 * w..8 * w + 8]);
        }
        want.extend_from_slice(&[1, 1 | 0x40, 1, 64, 32, 16]);
        want.extend_from_slice(&[9; 16]);
        assert_eq!(g2, want);
        // Decoded in order, both come back (with their data fields).
        let mut back = Bases::default();
        let (Some(d1), Some(d2)) = (
            decode_group_in(&g1, &mut back),
            decode_group_in(&g2, &mut back),
        ) else {
            panic!("decodes");
        };
        for (d, r, o) in [(&d1, &rec, &ops[..]), (&d2, &next, &ops[..1])] {
            match d.as_slice() {
                [Item::Data { ino: 9, rec, ops }] => {
                    assert_eq!(**rec, data_only(r));
                    assert_eq!(ops, o);
                }
                other => panic!("decoded {other:?}"),
            }
        }
        // Without its base, or after another one, the second does not parse.
        assert_eq!(decode_group_in(&g2, &mut Bases::default()), None);
        let mut other = rec.clone();
        other.size = 1;
        let mut wrong = Bases::default();
        encode_group_in(
            &[Item::Data {
                ino: 9,
                rec: Box::new(other),
                ops: Vec::new(),
            }],
            true,
            true,
            Some(&mut wrong),
        );
        assert_eq!(decode_group_in(&g2, &mut wrong), None);
        // A ctime that is not the mtime is a word of its own.
        let mut apart = next.clone();
        apart.ctime_ns = 91;
        let g3 = encode_group_in(
            &[Item::Data {
                ino: 9,
                rec: Box::new(apart.clone()),
                ops: Vec::new(),
            }],
            true,
            true,
            Some(&mut bases),
        );
        assert_eq!(g3[5], 2, "flags");
        assert_eq!(&g3[11..15], &(1u32 << 5).to_le_bytes());
        match decode_group_in(&g3, &mut back).as_deref() {
            Some([Item::Data { rec, .. }]) => assert_eq!(**rec, data_only(&apart)),
            other => panic!("decoded {other:?}"),
        }
        // A write that keeps more bytes than its length does not parse.
        let w = Item::Data {
            ino: 9,
            rec: Box::new(rec.clone()),
            ops: vec![LoggedOp::Write {
                name: names.meta.clone(),
                off: 7,
                data: vec![5, 6],
            }],
        };
        let mut bad = encode_group_in(&[w], true, true, Some(&mut Bases::default()));
        let n = bad.len();
        assert_eq!(&bad[n - 7..], &[1, 1 | 0x40, 1, 7, 2, 2, 5, 6][1..]);
        bad[n - 4] = 1;
        assert_eq!(decode_group_in(&bad, &mut Bases::default()), None);
        // An unknown flag does not parse.
        let mut bad = g1.clone();
        bad[5] |= 8;
        assert_eq!(decode_group_in(&bad, &mut Bases::default()), None);
        // An inline file's item (flag 1) ends with its bytes: a varint length, the bytes;
        // the flag on a record in blocks does not parse.
        let mut small = rec.clone();
        small.size = 3;
        small.tree = crate::tree::TreeState {
            leaves: 0,
            root: [0; 32],
        };
        small.inline_data = Some(InlineData {
            slots: vec![40],
            bytes: vec![1, 2, 3],
        });
        let inline = Item::Data {
            ino: 9,
            rec: Box::new(small.clone()),
            ops: Vec::new(),
        };
        let g4 = encode_group_in(
            std::slice::from_ref(&inline),
            true,
            true,
            Some(&mut Bases::default()),
        );
        assert_eq!(g4[5], 1 | 4, "flags");
        assert_eq!(
            &g4[g4.len() - 5..],
            &[0, 3, 1, 2, 3],
            "no ops, then the bytes"
        );
        match decode_group_in(&g4, &mut Bases::default()).as_deref() {
            Some([Item::Data { rec, .. }]) => assert_eq!(**rec, data_only(&small)),
            other => panic!("decoded {other:?}"),
        }
        let mut bad = g1.clone();
        bad[5] |= 1;
        bad.extend_from_slice(&[0]);
        assert_eq!(decode_group_in(&bad, &mut Bases::default()), None);
    }

    /// The writer's bases: one per file written since the log started again, at most
    /// [`BASES_MAX`] (past that it starts over), none after a checkpoint; and a replay of
    /// items written across the start-over reads every file back.
    /// `v` gone as a killed daemon goes (no seal), and its volume opened again.
    fn killed_and_reopened(
        v: Volume,
        store: &Arc<crate::store::MemStore>,
        trusted: &crate::store::MemTrusted,
    ) -> Volume {
        v.set_seal_on_drop(false);
        drop(v);
        test_reopen(store, trusted)
    }

    /// Every request returns once its log group is in the store (the group is written
    /// after the request let go of the engine lock, docs/design.md "Log records written
    /// outside the engine lock"): after each call nothing is queued, and a reopen with no
    /// seal (a killed daemon) finds every change.
    #[test]
    fn every_request_returns_with_its_group_written() {
        use crate::store::{MemStore, MemTrusted};
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::default();
        let v = test_volume(store.clone(), &trusted);
        let queued = |v: &Volume, what: &str| {
            let io = v.shared.log_io.as_ref().expect("a log");
            assert_eq!(io.pending(), 0, "{what} returned with its group queued");
        };
        let a = v
            .create_at(ROOT_INO, "a", Kind::File, 0o644, 0, 0, None)
            .unwrap()
            .ino;
        queued(&v, "create_at");
        v.write_ino(a, 0, b"hello").unwrap();
        queued(&v, "write_ino");
        let big: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        v.write_ino(a, 5, &big).unwrap();
        queued(&v, "a bulk write_ino");
        v.setattr(
            a,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
        queued(&v, "setattr");
        let d = v
            .create_at(ROOT_INO, "d", Kind::Dir, 0o755, 0, 0, None)
            .unwrap()
            .ino;
        v.symlink_at(d, "s", "/a", 0, 0).unwrap();
        queued(&v, "symlink_at");
        v.link_at(a, d, "b").unwrap();
        queued(&v, "link_at");
        v.rename_at(ROOT_INO, "a", d, "c", RenameMode::Replace)
            .unwrap();
        queued(&v, "rename_at");
        v.setxattr(a, "user.k", b"v", XattrMode::Set).unwrap();
        queued(&v, "setxattr");
        v.zero_range(a, 1, 2, true).unwrap();
        queued(&v, "zero_range");
        v.unlink_at(d, "b").unwrap();
        queued(&v, "unlink_at");
        v.create_file("/p", None).unwrap();
        v.write_path("/p", 0, b"xyz").unwrap();
        queued(&v, "write_path");
        v.truncate("/p", 1).unwrap();
        queued(&v, "truncate");
        v.mkdir("/q").unwrap();
        v.rename("/q", "/r").unwrap();
        queued(&v, "rename");
        v.rmdir("/r").unwrap();
        queued(&v, "rmdir");
        let v = killed_and_reopened(v, &store, &trusted);
        let mut want = b"hello".to_vec();
        want.extend_from_slice(&big);
        want[1..3].fill(0);
        let mut got = vec![0u8; want.len() + 1];
        assert_eq!(v.read_path("/d/c", 0, &mut got).unwrap(), want.len());
        assert!(got[..want.len()] == want[..], "content after the reopen");
        assert_eq!(v.stat("/d/c").unwrap().mode & 0o777, 0o600);
        assert_eq!(v.readlink("/d/s").unwrap(), "/a");
        assert!(v.stat("/d/b").is_err());
        assert_eq!(v.stat("/p").unwrap().size, 1);
        assert!(v.stat("/r").is_err());
        assert_eq!(v.getxattr(a, "user.k").unwrap(), b"v");
        assert_eq!(v.integrity_failures(), 0);
    }

    #[test]
    fn the_writers_bases_are_bounded_and_start_over_at_a_checkpoint() {
        use crate::store::{MemStore, MemTrusted};
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::default();
        let v = test_volume(store.clone(), &trusted);
        let bases = |v: &Volume| v.shared.lock().log_bases.as_ref().map(|b| b.0.len());
        v.create_file("/a", None).unwrap();
        v.sync().unwrap();
        assert_eq!(bases(&v), Some(0));
        v.write_path("/a", 0, b"x").unwrap();
        assert_eq!(bases(&v), Some(1));
        v.write_path("/a", 1, b"y").unwrap();
        assert_eq!(bases(&v), Some(1), "the same file's base, replaced");
        let n = BASES_MAX + 10;
        for i in 0..n {
            let p = format!("/f{i}");
            v.create_file(&p, None).unwrap();
            v.write_path(&p, 0, p.as_bytes()).unwrap();
            let held = bases(&v).unwrap();
            assert!((1..=BASES_MAX).contains(&held), "{held} after {i}");
        }
        assert!(bases(&v).unwrap() < n, "started over");
        let v = killed_and_reopened(v, &store, &trusted);
        assert_eq!(v.integrity_failures(), 0);
        for i in [0, 1, BASES_MAX - 1, BASES_MAX, n - 1] {
            let p = format!("/f{i}");
            let mut b = vec![0u8; 16];
            let k = v.read_path(&p, 0, &mut b).unwrap();
            assert_eq!(&b[..k], p.as_bytes());
        }
        let mut b = [0u8; 4];
        assert_eq!(v.read_path("/a", 0, &mut b).unwrap(), 2);
        assert_eq!(&b[..2], b"xy");
    }

    /// Which writes a leaf-log data item leaves out, hand-computed for 5 leaves (peaks
    /// `[0, 4)` and `[4, 5)`): the whole-node writes to `.m` all of whose nodes are above a
    /// leaf the item writes; nothing for a tree kept in the record, one of fewer than two
    /// leaves, or another scheme.
    #[test]
    fn a_data_item_leaves_out_the_nodes_above_its_leaves() {
        let id = [3; 16];
        let tree = crate::tree::TreeState {
            leaves: 5,
            root: [0; 32],
        };
        let rec = Inode::new(Kind::File, SchemeId::MtEintGcm, id, tree, 0o600);
        let names = ObjectNames::of(&id);
        let meta = names.meta.clone();
        let w = |name: &str, off: u64, len: usize| LoggedOp::Write {
            name: name.to_string(),
            off,
            data: vec![1; len],
        };
        // Leaf 1 (flat 2), its parent (flat 1), the peak (flat 3), leaf 4 (flat 8, a peak
        // alone), a write that is not of whole nodes, and one to `.d`.
        let ops = vec![
            w(&meta, 64, 32),
            w(&meta, 32, 32),
            w(&meta, 96, 32),
            w(&meta, 256, 32),
            w(&meta, 70, 32),
            w(&names.data, 32, 32),
        ];
        assert_eq!(derived_nodes(&rec, &ops), Some((meta.clone(), vec![1, 3])));
        let kept = [0, 3, 4, 5].map(|k| ops[k].clone()).to_vec();
        assert_eq!(without_derived(&rec, ops.clone()), kept);
        // Nodes 4 to 6 in one write (leaves 2 and 3, and flat 5 between them): flats 5
        // and 3 are derived, but the write holds leaves and stays.
        let span = vec![w(&meta, 128, 96)];
        assert_eq!(derived_nodes(&rec, &span), Some((meta.clone(), vec![5, 3])));
        assert_eq!(without_derived(&rec, span.clone()), span);
        // Flat 3 alone, with no leaf under it written: stays.
        let lone = vec![w(&meta, 96, 32), w(&meta, 256, 32)];
        assert_eq!(derived_nodes(&rec, &lone), Some((meta.clone(), vec![])));
        assert_eq!(without_derived(&rec, lone.clone()), lone);
        // Another file's `.m`.
        let other = vec![w(&ObjectNames::of(&[4; 16]).meta, 64, 32)];
        assert_eq!(derived_nodes(&rec, &other), Some((meta.clone(), vec![])));
        let mut aead = rec.clone();
        aead.scheme = SchemeId::Aead;
        let mut tags = rec.clone();
        tags.inline_tags = Some(InlineTags {
            n: 5,
            tags: [[0; INLINE_TAG_LEN]; MAX_INLINE_TAGS],
        });
        let mut one = rec.clone();
        one.tree.leaves = 1;
        let mut cbc = rec.clone();
        cbc.scheme = SchemeId::MtEintCbc;
        assert!(derived_nodes(&cbc, &ops).is_some());
        // Two leaves in `.m` (a CBC tree: GCM keeps so small a tree in the record): the
        // node over them is derived.
        let mut two = cbc.clone();
        two.tree.leaves = 2;
        assert_eq!(
            derived_nodes(&two, &[w(&meta, 0, 32)]),
            Some((meta.clone(), vec![1]))
        );
        for r in [aead, tags, one] {
            assert_eq!(derived_nodes(&r, &ops), None, "{r:?}");
            assert_eq!(without_derived(&r, ops.clone()), ops);
        }
    }

    /// A data item of an inline file carries its bytes (tag 9, frozen: after the data
    /// item's fields, the length and the bytes); one whose length is not the record's size,
    /// or a tag-9 item whose record is not inline, does not parse.
    #[test]
    fn an_inline_data_item_carries_the_files_bytes() {
        let mut rec = Inode::new(
            Kind::File,
            SchemeId::MtEintGcm,
            [7; 16],
            crate::tree::TreeState {
                leaves: 0,
                root: [0; 32],
            },
            5,
        );
        rec.size = 300;
        rec.inline_data = Some(InlineData {
            slots: vec![40, 41],
            bytes: (0..300).map(|i| i as u8).collect(),
        });
        let item = Item::Data {
            ino: 9,
            rec: Box::new(rec.clone()),
            ops: Vec::new(),
        };
        let group = encode_group(std::slice::from_ref(&item), true, false);
        assert_eq!(group[4], 9, "tag");
        let mut want = Vec::new();
        want.extend_from_slice(&1u32.to_le_bytes());
        want.push(9);
        want.extend_from_slice(&9u64.to_le_bytes());
        want.extend_from_slice(&rec.encode());
        want.extend_from_slice(&0u32.to_le_bytes());
        want.extend_from_slice(&300u32.to_le_bytes());
        want.extend_from_slice(&rec.inline_data.as_ref().unwrap().bytes);
        assert_eq!(group, want);
        assert_eq!(decode_group(&group), Some(vec![item]));
        // A length that is not the size.
        let mut bad = group.clone();
        let at = 4 + 1 + 8 + RECORD_SIZE + 4;
        bad[at..at + 4].copy_from_slice(&299u32.to_le_bytes());
        bad.pop();
        assert_eq!(decode_group(&bad), None);
        // Tag 9 on a record in blocks.
        let mut plain = rec.clone();
        plain.inline_data = None;
        plain.size = 0;
        let mut bad = encode_group(
            &[Item::Data {
                ino: 9,
                rec: Box::new(plain),
                ops: Vec::new(),
            }],
            true,
            false,
        );
        bad[4] = 9;
        bad.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(decode_group(&bad), None);
    }
}
