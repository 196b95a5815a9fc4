//! On-disk records: the inode record (a file's trusted state TS_F), the trusted anchor and
//! the volume config. Byte tables are in docs/file-format.md; tests/format_vectors.rs
//! freezes them, and the tests at the bottom check every code and name.

use crate::crypto::{FileId, Hash, KdfParams, SubKey};
use crate::error::{Error, Result, Subject};
use crate::tree::{CounterIntervals, TreeState, TrustedCounters};
use crate::tx::{JournalRef, Reader};

/// Size of one inode record.
pub const RECORD_SIZE: usize = 256;
/// Where a record keeps its inline Merkle node (record flag bit 2): the last 32 bytes, which
/// the trusted counters of a one-leaf tree (one interval, 29 bytes from byte 128) never use.
pub const INLINE_NODE_AT: usize = RECORD_SIZE - 32;
/// Size of a `mac-tree` record's inline leaf (record flag bit 2 on a `mac-tree` record):
/// level-0 node 0's first counter `N_0` (8), its node tag (16) and block 0's tag `T_0` (16).
pub const MAC_INLINE_LEN: usize = 40;
/// Where a `mac-tree` record keeps its inline leaf: the last 40 bytes, which its trusted
/// counters (always the empty form, 13 bytes from byte 128) never use.
pub const MAC_INLINE_AT: usize = RECORD_SIZE - MAC_INLINE_LEN;
/// The most leaves whose GCM tags a record keeps (record flag bit 3, [`InlineTags`]).
pub const MAX_INLINE_TAGS: usize = 6;
/// Bytes of one inline leaf: an `mt-eint` (GCM) leaf is `tag || 16 zero bytes`, so its tag
/// alone is the leaf.
pub const INLINE_TAG_LEN: usize = 16;

/// The leaves of a small `mt-eint` (GCM) Merkle tree, kept in the inode record instead of
/// a `.m` object on volumes with the [`INLINE_TREE`] feature (record flag bit 3,
/// docs/file-format.md §4): leaf `i` is `tags[i] || 16 zero bytes`; the tree's internal
/// nodes are not stored anywhere, they are computed from the leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineTags {
    /// Number of leaves (2 to [`MAX_INLINE_TAGS`], the tree's leaf count).
    pub n: u8,
    /// The leaves' tags; entries at `n` and above are zero.
    pub tags: [[u8; INLINE_TAG_LEN]; MAX_INLINE_TAGS],
}

impl InlineTags {
    /// Whether a tree of `leaves` leaves whose counters have `intervals` intervals can keep
    /// its leaves in the record: the counters' inline form (13 + 16 per interval bytes from
    /// byte 128) and the tags (16 bytes a leaf, up to byte 256) share the record's last 128
    /// bytes.
    pub fn fit(leaves: u64, intervals: usize) -> bool {
        (2..=MAX_INLINE_TAGS as u64).contains(&leaves)
            && 13 + 16 * intervals + INLINE_TAG_LEN * leaves as usize <= TCTR_SIZE
    }

    /// The leaves, as 32-byte hashes.
    pub fn leaves(&self) -> Vec<Hash> {
        self.tags[..self.n as usize]
            .iter()
            .map(|t| {
                let mut h = [0u8; 32];
                h[..INLINE_TAG_LEN].copy_from_slice(t);
                h
            })
            .collect()
    }

    /// The tags of `leaves`; `None` unless every leaf's last 16 bytes are zero (what an
    /// `mt-eint` GCM leaf always is) and there are 2 to [`MAX_INLINE_TAGS`] of them.
    pub fn of(leaves: &[Hash]) -> Option<InlineTags> {
        if !(2..=MAX_INLINE_TAGS).contains(&leaves.len()) {
            return None;
        }
        let mut t = InlineTags {
            n: leaves.len() as u8,
            tags: [[0; INLINE_TAG_LEN]; MAX_INLINE_TAGS],
        };
        for (slot, leaf) in t.tags.iter_mut().zip(leaves) {
            if leaf[INLINE_TAG_LEN..] != [0u8; 32 - INLINE_TAG_LEN] {
                return None;
            }
            slot.copy_from_slice(&leaf[..INLINE_TAG_LEN]);
        }
        Some(t)
    }

    /// Where the tags start in the record.
    fn at(n: usize) -> usize {
        RECORD_SIZE - INLINE_TAG_LEN * n
    }
}
/// Bytes of trusted storage for counter intervals per file (L_ctr, paper §4.2): 7 intervals.
pub const L_CTR: usize = 112;
/// Bytes reserved in the record for the trusted counters.
pub const TCTR_SIZE: usize = 128;
const _: () = assert!(crate::tree::trusted_size(L_CTR) <= TCTR_SIZE);
/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// An unused record.
    Free = 0,
    /// A regular file.
    File = 1,
    /// A directory (a file of entries).
    Dir = 2,
    /// A symbolic link (its target is its content).
    Symlink = 3,
    /// The extended attributes of one inode (a hidden file named by its owner's record).
    Xattr = 4,
    /// A named pipe (no content).
    Fifo = 5,
    /// A unix-domain socket (no content).
    Socket = 6,
    /// A character device (its device number in [`Inode::link`]).
    CharDev = 7,
    /// A block device (its device number in [`Inode::link`]).
    BlockDev = 8,
    /// A slot of a small file's data, kept in the inode table (volumes with the
    /// [`INLINE_DATA`] feature; docs/file-format.md §4.3): never named by a directory entry,
    /// listed by exactly one file's record ([`InlineData::slots`]).
    Data = 9,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            0 => Kind::Free,
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Xattr,
            5 => Kind::Fifo,
            6 => Kind::Socket,
            7 => Kind::CharDev,
            8 => Kind::BlockDev,
            9 => Kind::Data,
            _ => return None,
        })
    }

    /// The kind of a directory entry's code (1 file, 2 directory, 3 symlink, 5 to 8 the
    /// special files); `None` for codes no entry may have.
    pub fn of_entry(b: u8) -> Option<Kind> {
        Kind::from_u8(b).filter(|k| !matches!(k, Kind::Free | Kind::Xattr | Kind::Data))
    }

    /// A FIFO, socket or device node: an inode with no content.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev
        )
    }

    /// A device node, whose record keeps its device number.
    pub fn is_device(self) -> bool {
        matches!(self, Kind::CharDev | Kind::BlockDev)
    }
}

/// A file's integrity scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum SchemeId {
    /// AES-GCM per block with a random nonce: authenticity, no freshness.
    Aead,
    /// MT-EINT (paper §5.1): Merkle tree, GCM tags as leaves.
    MtEintGcm,
    /// MT-EINT with length-preserving CBC, IV = PRF(i || ctr) (paper §4.1, Fig. 3).
    MtEintCbc,
    /// Encryption only (length-preserving CBC, IV = PRF(i || ctr)), **no integrity**: a
    /// measurement baseline (Oprea–Reiter's "AES – no integrity").
    None,
    /// Yun–Shi–Kim's counter MAC tree (§4, Fig. 2–3): AES-CTR blocks with Poly1305-AES
    /// tags, leaf counters authenticated by an n-ary tree of Poly1305-AES MACs.
    MacTree,
    /// RAND-EINT (paper §5.2): HCTR2, a tree only over random-looking blocks.
    RandEint,
    /// COMP-EINT (paper §5.3) with DEFLATE (zlib): the hash inside compressible blocks.
    CompEint,
    /// COMP-EINT with Zstandard.
    CompEintZstd,
}

impl SchemeId {
    /// The byte stored in the inode record.
    pub fn code(self) -> u8 {
        match self {
            SchemeId::Aead => 1,
            SchemeId::MtEintGcm => 2,
            SchemeId::MtEintCbc => 3,
            SchemeId::None => 4,
            SchemeId::MacTree => 8,
            SchemeId::RandEint => 5,
            SchemeId::CompEint => 6,
            SchemeId::CompEintZstd => 7,
        }
    }
    /// Parses a stored byte.
    pub fn from_code(b: u8) -> Option<SchemeId> {
        Some(match b {
            1 => SchemeId::Aead,
            2 => SchemeId::MtEintGcm,
            3 => SchemeId::MtEintCbc,
            4 => SchemeId::None,
            8 => SchemeId::MacTree,
            5 => SchemeId::RandEint,
            6 => SchemeId::CompEint,
            7 => SchemeId::CompEintZstd,
            _ => return None,
        })
    }
    /// The name users type (`--scheme`).
    pub fn name(self) -> &'static str {
        match self {
            SchemeId::Aead => "aead",
            SchemeId::MtEintGcm => "mt-eint",
            SchemeId::MtEintCbc => "mt-eint-cbc",
            SchemeId::None => "none",
            SchemeId::MacTree => "mac-tree",
            SchemeId::RandEint => "rand-eint",
            SchemeId::CompEint => "comp-eint",
            SchemeId::CompEintZstd => "comp-eint-zstd",
        }
    }
    /// Parses a user-supplied name.
    pub fn parse(s: &str) -> Result<SchemeId> {
        Ok(match s {
            "aead" => SchemeId::Aead,
            "mt-eint" | "mt-eint-gcm" => SchemeId::MtEintGcm,
            "mt-eint-cbc" => SchemeId::MtEintCbc,
            "none" => SchemeId::None,
            "mac-tree" => SchemeId::MacTree,
            "rand-eint" => SchemeId::RandEint,
            "comp-eint" => SchemeId::CompEint,
            "comp-eint-zstd" => SchemeId::CompEintZstd,
            _ => {
                return Err(Error::Invalid(format!(
                    "unknown scheme {s:?} (known: aead, mt-eint, mt-eint-cbc, none, mac-tree, rand-eint, comp-eint, comp-eint-zstd)"
                )))
            }
        })
    }
    /// Whether the scheme detects replay of old block versions (freshness).
    pub fn fresh(self) -> bool {
        !matches!(self, SchemeId::Aead | SchemeId::None)
    }
    /// Whether the scheme detects any tampering at all (`none` detects nothing).
    pub fn authenticates(self) -> bool {
        !matches!(self, SchemeId::None)
    }
    /// Whether the record's trusted counters (counter intervals, paper §4.2) hold the
    /// file's block write counters. `aead` keeps none; `mac-tree` keeps its counters in
    /// its own tree (Yun et al. §4.1) with only the root counter in TS_F.
    pub fn uses_counter_intervals(self) -> bool {
        !matches!(self, SchemeId::Aead | SchemeId::MacTree)
    }
    /// Whether the scheme's Merkle tree (RTree, §5.2–5.3) covers only some of the file's
    /// blocks: then the record's leaf count is the tree's, and the file's block count is the
    /// counter intervals'.
    pub fn partial_tree(self) -> bool {
        matches!(
            self,
            SchemeId::RandEint | SchemeId::CompEint | SchemeId::CompEintZstd
        )
    }
    /// All schemes.
    pub const ALL: [SchemeId; 8] = [
        SchemeId::Aead,
        SchemeId::MtEintGcm,
        SchemeId::MtEintCbc,
        SchemeId::None,
        SchemeId::MacTree,
        SchemeId::RandEint,
        SchemeId::CompEint,
        SchemeId::CompEintZstd,
    ];
}

/// The name of the `auto` policy (`--scheme auto`, the config's default scheme,
/// `user.intact.scheme`).
pub const AUTO: &str = "auto";

/// The `auto` policy: the scheme for a file from what was observed of it, following
/// Oprea–Reiter's Table 7 (2006, §8): majority high-entropy contents → MT-EINT; majority
/// low-entropy contents → RAND-EINT when writes dominate, COMP-EINT when reads do.
/// `random` of `sampled` observed blocks looked random (IsRand); `None` without samples.
pub fn auto_choice(reads: u64, writes: u64, random: u64, sampled: u64) -> Option<SchemeId> {
    if sampled == 0 {
        return None;
    }
    Some(if 2 * random > sampled {
        SchemeId::MtEintGcm
    } else if writes >= reads {
        SchemeId::RandEint
    } else {
        SchemeId::CompEint
    })
}

/// One inode record: a file's attributes and its trusted state TS_F.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    /// What it is.
    pub kind: Kind,
    /// The file's scheme.
    pub scheme: SchemeId,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Link count: directory entries naming a file (hard links); 2 for directories.
    pub nlink: u32,
    /// The scheme is chosen by the `auto` policy (paper Table 7), which may re-encrypt the
    /// file under another scheme as its observed contents and access mix change.
    pub auto: bool,
    /// The scheme (or `auto`) was chosen for this file through the `user.intact.scheme`
    /// extended attribute: only then does listxattr name it, and removing it returns the
    /// file to the volume's default.
    pub scheme_set: bool,
    /// Inode of the hidden [`Kind::Xattr`] file holding this inode's extended attributes
    /// (0: none).
    pub xattr: u32,
    /// Length in bytes.
    pub size: u64,
    /// Modification time, ns since the Unix epoch.
    pub mtime_ns: i64,
    /// Change time, ns since the Unix epoch.
    pub ctime_ns: i64,
    /// Access time, ns since the Unix epoch (set by utimens; reads do not update it).
    pub atime_ns: i64,
    /// The file's random id (names objects, binds keys).
    pub id: FileId,
    /// Merkle tree state (leaf count and root), or the block count for `aead`.
    pub tree: TreeState,
    /// Highest write counter of any deleted block: new counters stay above it, so
    /// truncation never lets a (block, counter) pair repeat.
    pub ctr_hw: u64,
    /// Free-list link (free records), parent directory (directories), the next entry of
    /// the list of unlinked files still open (files with `nlink == 0`), or the device
    /// number (`rdev`, character and block devices).
    pub link: u64,
    /// The trusted part of the counter intervals (paper Fig. 6).
    pub counters: TrustedCounters,
    /// The single node of a one-leaf Merkle tree (`mt-eint`, `mt-eint-cbc`), kept in the
    /// record instead of a `.m` object, on volumes with the [`INLINE_LEAF`] feature: a small
    /// file is then one object in the store (docs/file-format.md §4).
    pub inline_node: Option<Hash>,
    /// The level-0 bytes of a `mac-tree` file with at most one leaf counter (`m <= 1`),
    /// kept in the record instead of a `.m` object on volumes with the [`INLINE_MAC`]
    /// feature: `N_0 || node tag || T_0` (docs/file-format.md §4 and §7.6).
    pub inline_mac: Option<[u8; MAC_INLINE_LEN]>,
    /// The leaves of a Merkle tree of 2 to [`MAX_INLINE_TAGS`] leaves (`mt-eint`, GCM),
    /// kept in the record instead of a `.m` object on volumes with the [`INLINE_TREE`]
    /// feature (docs/file-format.md §4).
    pub inline_tags: Option<InlineTags>,
    /// A small file's data, kept in slots of the inode table instead of objects of its own
    /// (volumes with the [`INLINE_DATA`] feature; docs/file-format.md §4.3). The record
    /// holds the slots' inode numbers; the bytes are read from them by the engine (and
    /// carried by the log's data items), so a decoded record has them empty.
    pub inline_data: Option<InlineData>,
}

/// Payload bytes of one inline-data slot (a [`Kind::Data`] record: its kind byte, seven
/// zero bytes, then these).
pub const SLOT_BYTES: usize = RECORD_SIZE - 8;
/// Most slots one file lists (record bytes 136..256, eight bytes each).
pub const MAX_SLOTS: usize = 15;
/// Largest file kept inline: [`MAX_SLOTS`] slots of [`SLOT_BYTES`].
pub const INLINE_DATA_MAX: u64 = (MAX_SLOTS * SLOT_BYTES) as u64;
/// The tag byte at record offset 128 that marks an inline-data file (where the counter
/// intervals' form byte, 0 or 1, would be).
const INLINE_DATA_TAG: u8 = 2;

/// A small file's data in the inode table ([`Inode::inline_data`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InlineData {
    /// Inode numbers of the [`Kind::Data`] records that hold the bytes, in order:
    /// exactly `ceil(size / SLOT_BYTES)` of them.
    pub slots: Vec<u64>,
    /// The file's bytes (its size), once read from the slots or carried by the log.
    pub bytes: Vec<u8>,
}

impl InlineData {
    /// Slots a file of `size` bytes takes.
    pub fn slots_for(size: u64) -> usize {
        size.div_ceil(SLOT_BYTES as u64) as usize
    }
}

/// A [`Kind::Data`] record holding `part` (at most [`SLOT_BYTES`]; zeros after it).
pub fn encode_slot(part: &[u8]) -> [u8; RECORD_SIZE] {
    let mut b = [0u8; RECORD_SIZE];
    b[0] = Kind::Data as u8;
    b[8..8 + part.len()].copy_from_slice(part);
    b
}

/// The payload of a [`Kind::Data`] record; `None` when `b` is not one (another kind, or
/// nonzero reserved bytes).
pub fn slot_payload(b: &[u8]) -> Option<&[u8]> {
    (b.len() == RECORD_SIZE && b[0] == Kind::Data as u8 && b[1..8].iter().all(|&x| x == 0))
        .then(|| &b[8..])
}

impl Inode {
    /// A new, empty inode.
    pub fn new(kind: Kind, scheme: SchemeId, id: FileId, tree: TreeState, now_ns: i64) -> Self {
        Inode {
            kind,
            scheme,
            mode: if kind == Kind::Dir { 0o755 } else { 0o644 },
            uid: 0,
            gid: 0,
            nlink: 1,
            auto: false,
            scheme_set: false,
            xattr: 0,
            size: 0,
            mtime_ns: now_ns,
            ctime_ns: now_ns,
            atime_ns: now_ns,
            id,
            tree,
            ctr_hw: 0,
            link: 0,
            counters: TrustedCounters::Inline(CounterIntervals::new()),
            inline_node: None,
            inline_mac: None,
            inline_tags: None,
            inline_data: None,
        }
    }

    /// A free record linking to `next`.
    pub fn free(next: u64) -> Self {
        let mut i = Inode::new(
            Kind::Free,
            SchemeId::Aead,
            [0; 16],
            TreeState {
                leaves: 0,
                root: [0; 32],
            },
            0,
        );
        i.mode = 0;
        i.nlink = 0;
        i.link = next;
        i
    }

    /// Bytes of this record's TS_F that are in use: the scheme byte, the block count, and
    /// what the scheme keeps trusted (Merkle root, `ctr_hw` and counter intervals for the
    /// MT-EINT family and `none`; `m`, depth, arity and root counter for `mac-tree`;
    /// nothing more for `aead`). The record itself is a fixed 256 bytes.
    pub fn trusted_bytes_used(&self) -> u64 {
        let ctrs = match &self.counters {
            TrustedCounters::Inline(c) => 13 + 16 * c.intervals() as u64,
            TrustedCounters::Spilled { .. } => 77,
            TrustedCounters::Segmented { .. } => 45,
        };
        1 + 8
            + if self.inline_node.is_some() { 32 } else { 0 }
            + if self.inline_mac.is_some() {
                MAC_INLINE_LEN as u64
            } else {
                0
            }
            + self
                .inline_tags
                .map_or(0, |t| (INLINE_TAG_LEN * t.n as usize) as u64)
            + match self.scheme {
                SchemeId::Aead => 0,
                SchemeId::MacTree => 8 + 8 + 1 + 1,
                SchemeId::None => 8 + ctrs,
                _ => 32 + 8 + ctrs,
            }
    }

    /// Serializes into exactly [`RECORD_SIZE`] bytes.
    pub fn encode(&self) -> [u8; RECORD_SIZE] {
        let mut b = [0u8; RECORD_SIZE];
        b[0] = self.kind as u8;
        b[1] = self.scheme.code();
        b[2] = self.auto as u8
            | (self.scheme_set as u8) << 1
            | ((self.inline_node.is_some() || self.inline_mac.is_some()) as u8) << 2
            | (self.inline_tags.is_some() as u8) << 3
            | (self.inline_data.is_some() as u8) << 4;
        b[4..8].copy_from_slice(&self.mode.to_le_bytes());
        b[8..12].copy_from_slice(&self.uid.to_le_bytes());
        b[12..16].copy_from_slice(&self.gid.to_le_bytes());
        b[16..20].copy_from_slice(&self.nlink.to_le_bytes());
        b[20..24].copy_from_slice(&self.xattr.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..40].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b[40..48].copy_from_slice(&self.ctime_ns.to_le_bytes());
        b[48..56].copy_from_slice(&self.atime_ns.to_le_bytes());
        b[56..72].copy_from_slice(&self.id);
        b[72..80].copy_from_slice(&self.tree.leaves.to_le_bytes());
        b[80..112].copy_from_slice(&self.tree.root);
        b[112..120].copy_from_slice(&self.ctr_hw.to_le_bytes());
        b[120..128].copy_from_slice(&self.link.to_le_bytes());
        if let Some(d) = &self.inline_data {
            assert!(
                d.slots.len() <= MAX_SLOTS,
                "at most MAX_SLOTS inline-data slots"
            );
            b[128] = INLINE_DATA_TAG;
            b[129] = d.slots.len() as u8;
            for (k, s) in d.slots.iter().enumerate() {
                b[136 + 8 * k..144 + 8 * k].copy_from_slice(&s.to_le_bytes());
            }
            return b;
        }
        let ctrs_end = match (&self.inline_node, &self.inline_mac, &self.inline_tags) {
            (None, None, Some(t)) => {
                let at = InlineTags::at(t.n as usize);
                for (k, tag) in t.tags[..t.n as usize].iter().enumerate() {
                    b[at + INLINE_TAG_LEN * k..at + INLINE_TAG_LEN * (k + 1)].copy_from_slice(tag);
                }
                at
            }
            (Some(node), _, _) => {
                b[INLINE_NODE_AT..RECORD_SIZE].copy_from_slice(node);
                INLINE_NODE_AT
            }
            (None, Some(leaf), _) => {
                b[MAC_INLINE_AT..RECORD_SIZE].copy_from_slice(leaf);
                MAC_INLINE_AT
            }
            (None, None, None) => 128 + TCTR_SIZE,
        };
        self.counters
            .encode_into(&mut b[128..ctrs_end])
            .expect("counters produced by auth_ctr with L_CTR fit in TCTR_SIZE; a one-leaf tree has one interval; inline tags are kept only when InlineTags::fit");
        b
    }

    /// Parses a record; `None` when it is malformed.
    pub fn decode(b: &[u8]) -> Option<Inode> {
        if b.len() != RECORD_SIZE {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let kind = Kind::from_u8(b[0])?;
        if kind == Kind::Data {
            // A slot of a small file's data: its payload is read with [`slot_payload`].
            slot_payload(b)?;
            let mut i = Inode::free(0);
            i.kind = Kind::Data;
            return Some(i);
        }
        let scheme = if kind == Kind::Free {
            SchemeId::Aead
        } else {
            SchemeId::from_code(b[1])?
        };
        let mut root = [0u8; 32];
        root.copy_from_slice(&b[80..112]);
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[56..72]);
        // Flag bit 4: a small file's data in slots of the table; bytes 128.. list them (in
        // place of the counters), and the tree is empty.
        let inline_data = if b[2] & 16 != 0 {
            let n = b[129] as usize;
            if kind != Kind::File
                || scheme != SchemeId::MtEintGcm
                || b[2] & !(2 | 16) != 0
                || b[128] != INLINE_DATA_TAG
                || n > MAX_SLOTS
                || b[130..136].iter().any(|&x| x != 0)
                || b[136 + 8 * n..].iter().any(|&x| x != 0)
                || u64_at(72) != 0
                || u64_at(112) != 0
                || InlineData::slots_for(u64_at(24)) != n
            {
                return None;
            }
            Some(InlineData {
                slots: (0..n).map(|k| u64_at(136 + 8 * k)).collect(),
                bytes: Vec::new(),
            })
        } else {
            None
        };
        // Flag bit 2: the inline part of the tree, whose form the scheme decides.
        let inline = b[2] & 4 != 0;
        let mac = scheme == SchemeId::MacTree;
        let inline_node = (inline && !mac).then(|| {
            let mut n = [0u8; 32];
            n.copy_from_slice(&b[INLINE_NODE_AT..RECORD_SIZE]);
            n
        });
        let inline_mac = (inline && mac).then(|| {
            let mut n = [0u8; MAC_INLINE_LEN];
            n.copy_from_slice(&b[MAC_INLINE_AT..RECORD_SIZE]);
            n
        });
        // Flag bit 3: the leaves of a small GCM Merkle tree, as many as it has.
        let leaves = u64_at(72);
        let inline_tags = if b[2] & 8 != 0 {
            if inline
                || scheme != SchemeId::MtEintGcm
                || !(2..=MAX_INLINE_TAGS as u64).contains(&leaves)
            {
                return None;
            }
            let n = leaves as usize;
            let at = InlineTags::at(n);
            let mut t = InlineTags {
                n: n as u8,
                tags: [[0; INLINE_TAG_LEN]; MAX_INLINE_TAGS],
            };
            for (k, tag) in t.tags[..n].iter_mut().enumerate() {
                tag.copy_from_slice(&b[at + INLINE_TAG_LEN * k..at + INLINE_TAG_LEN * (k + 1)]);
            }
            Some(t)
        } else {
            None
        };
        let ctrs_end = match (inline, mac, inline_tags) {
            (false, _, Some(t)) => InlineTags::at(t.n as usize),
            (false, _, None) => 128 + TCTR_SIZE,
            (true, false, _) => INLINE_NODE_AT,
            (true, true, _) => MAC_INLINE_AT,
        };
        Some(Inode {
            kind,
            scheme,
            mode: u32_at(4),
            uid: u32_at(8),
            gid: u32_at(12),
            nlink: u32_at(16),
            auto: b[2] & 1 != 0,
            scheme_set: b[2] & 2 != 0,
            xattr: u32_at(20),
            size: u64_at(24),
            mtime_ns: u64_at(32) as i64,
            ctime_ns: u64_at(40) as i64,
            atime_ns: u64_at(48) as i64,
            id,
            tree: TreeState { leaves, root },
            ctr_hw: u64_at(112),
            link: u64_at(120),
            counters: match inline_data {
                Some(_) => TrustedCounters::Inline(CounterIntervals::new()),
                None => TrustedCounters::decode(&b[128..ctrs_end]).ok()?,
            },
            inline_node,
            inline_mac,
            inline_tags,
            inline_data,
        })
    }
}

/// Magic of the anchor.
pub const ANCHOR_MAGIC: &[u8; 8] = b"INTANCH2";
/// Size of an encoded anchor.
pub const ANCHOR_SIZE: usize = 8 + 16 + 8 + 8 + 1 + 8 + 32 + LOG_REF_SIZE + RECORD_SIZE + 32;
/// Magic and size of the anchor before the log (read, never written).
const ANCHOR_V1_MAGIC: &[u8; 8] = b"INTANCH1";
const ANCHOR_V1_SIZE: usize = ANCHOR_SIZE - LOG_REF_SIZE;
/// The log's reference in the anchor: flags (1) + start (seg, off) + end (seg, off).
const LOG_REF_SIZE: usize = 1 + 32;
/// Anchor log flag: the anchor names a log.
const LOG_PRESENT: u8 = 1;
/// Anchor log flag: records past the sealed end are not replayed (a going back discarded
/// them; docs/design.md, "The log").
const LOG_NO_TAIL: u8 = 2;
/// Anchor flag: the journal was applied in full (a reopen does not replay it: since then,
/// appends to its objects may lie past the lengths it sets).
const JOURNAL_APPLIED: u8 = 4;

/// The trusted anchor: the only state the adversary can neither modify nor roll back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    /// The volume it belongs to.
    pub volume_id: [u8; 16],
    /// Monotonic counter, advanced by every seal.
    pub epoch: u64,
    /// Every write counter ever issued is below this (a reservation; see docs/design.md).
    pub ctr_next: u64,
    /// The last commit's journal, if it had one.
    pub journal: Option<JournalRef>,
    /// The journal was applied in full: only a journal not known to be applied is replayed.
    pub applied: bool,
    /// The log: where replay begins, what the last seal covered (see [`crate::wal`]).
    pub log: Option<AnchorLog>,
    /// TS of the inode table.
    pub itable: Inode,
}

/// What the anchor says of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnchorLog {
    /// Where replay begins and where the sealed records end.
    pub sealed: crate::wal::LogRef,
    /// Whether records past the sealed end are replayed (false after a going back, until
    /// the next seal names a new segment).
    pub tail: bool,
}

impl Anchor {
    /// Serializes and MACs.
    pub fn encode(&self, key: &SubKey) -> Vec<u8> {
        let mut b = Vec::with_capacity(ANCHOR_SIZE);
        b.extend_from_slice(ANCHOR_MAGIC);
        b.extend_from_slice(&self.volume_id);
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&self.ctr_next.to_le_bytes());
        match &self.journal {
            Some(j) => {
                b.push(j.slot);
                b.extend_from_slice(&j.len.to_le_bytes());
                b.extend_from_slice(&j.digest);
            }
            None => {
                b.push(0xff);
                b.extend_from_slice(&[0u8; 40]);
            }
        }
        let applied = if self.applied { JOURNAL_APPLIED } else { 0 };
        match &self.log {
            Some(l) => {
                b.push(LOG_PRESENT | if l.tail { 0 } else { LOG_NO_TAIL } | applied);
                for p in [l.sealed.start, l.sealed.end] {
                    b.extend_from_slice(&p.seg.to_le_bytes());
                    b.extend_from_slice(&p.off.to_le_bytes());
                }
            }
            None => {
                b.push(applied);
                b.extend_from_slice(&[0u8; LOG_REF_SIZE - 1]);
            }
        }
        b.extend_from_slice(&self.itable.encode());
        let mac = key.mac(&[&b]);
        b.extend_from_slice(&mac);
        debug_assert_eq!(b.len(), ANCHOR_SIZE);
        b
    }

    /// Parses and verifies the MAC.
    pub fn decode(bytes: &[u8], key: &SubKey) -> Result<Anchor> {
        let corrupt = |what: &str| Error::AnchorCorrupt(what.to_string());
        let v1 = bytes.len() == ANCHOR_V1_SIZE && bytes.starts_with(ANCHOR_V1_MAGIC);
        if bytes.len() != ANCHOR_SIZE && !v1 {
            return Err(corrupt(&format!(
                "size {} instead of {ANCHOR_SIZE}",
                bytes.len()
            )));
        }
        if &bytes[..8] != ANCHOR_MAGIC && !v1 {
            return Err(corrupt("bad magic"));
        }
        let (body, mac) = bytes.split_at(bytes.len() - 32);
        if !crate::crypto::ct_eq(&key.mac(&[body]), mac) {
            return Err(corrupt(
                "MAC does not verify (damaged, or the anchor of another volume or key)",
            ));
        }
        let mut r = Reader { b: body, pos: 8 };
        let mut volume_id = [0u8; 16];
        volume_id.copy_from_slice(r.take(16).unwrap());
        let epoch = r.u64().unwrap();
        let ctr_next = r.u64().unwrap();
        let slot = r.take(1).unwrap()[0];
        let len = r.u64().unwrap();
        let mut digest: Hash = [0; 32];
        digest.copy_from_slice(r.take(32).unwrap());
        let journal = match slot {
            0 | 1 => Some(JournalRef { slot, len, digest }),
            0xff => None,
            _ => return Err(corrupt("bad journal slot")),
        };
        let mut applied = false;
        let log = if v1 {
            None
        } else {
            let flags = r.take(1).unwrap()[0];
            applied = flags & JOURNAL_APPLIED != 0;
            let flags = flags & !JOURNAL_APPLIED;
            let mut pos = || crate::wal::LogPos {
                seg: r.u64().unwrap(),
                off: r.u64().unwrap(),
            };
            let (start, end) = (pos(), pos());
            match flags {
                0 => None,
                f if f & !(LOG_PRESENT | LOG_NO_TAIL) == 0 && f & LOG_PRESENT != 0 => {
                    if end < start {
                        return Err(corrupt("the log's sealed end is before its start"));
                    }
                    Some(AnchorLog {
                        sealed: crate::wal::LogRef { start, end },
                        tail: f & LOG_NO_TAIL == 0,
                    })
                }
                _ => return Err(corrupt("bad log flags")),
            }
        };
        let itable = Inode::decode(r.take(RECORD_SIZE).unwrap())
            .ok_or_else(|| corrupt("bad inode-table record"))?;
        Ok(Anchor {
            volume_id,
            epoch,
            ctr_next,
            journal,
            applied,
            log,
            itable,
        })
    }
}

/// Name of the config object in the untrusted store.
pub const CONFIG_NAME: &str = "intact.conf";
/// Name of the untrusted copy of the last anchor (for explicit recovery only).
pub const ANCHOR_COPY_NAME: &str = "anchor.copy";
/// Current format version.
pub const FORMAT_VERSION: u32 = 1;

/// The volume config, stored in clear (but authenticated: it is the AAD of the key envelope).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Format version (refuses to open a newer one).
    pub format: u32,
    /// Volume id, hex.
    pub volume_id: String,
    /// Block size in bytes (power of two, 128 ..= 65536).
    pub block_size: u32,
    /// Default scheme for new files.
    pub scheme: String,
    /// Argon2id parameters.
    pub kdf: KdfParams,
    /// Argon2 salt, hex.
    pub salt: String,
    /// Feature flags; an unknown one refuses to open.
    pub features: Vec<String>,
    /// The master key wrapped with AES-256-GCM under the password key: nonce || ct || tag, hex.
    pub wrapped_key: String,
}

/// Feature flag: one-leaf Merkle trees keep their node in the inode record
/// ([`Inode::inline_node`]). Set on every volume created since it exists; a volume without
/// it keeps every node in `.m` objects, and an intact that does not know it refuses the
/// volume rather than misread its records.
pub const INLINE_LEAF: &str = "inline-leaf";

/// Feature flag: directories keep their entries in a B+-tree of units ordered by a keyed
/// hash of the names (docs/file-format.md §5.2), so that a change reads and writes O(log n)
/// units. A volume without it keeps each directory as one sorted list (§5), rewritten
/// whole at every checkpoint that changes it.
pub const DIR_TREE: &str = "dir-tree";

/// Feature flag: a `mac-tree` file with at most one leaf counter keeps its level-0 bytes
/// (`N_0`, the node tag and `T_0`) in its inode record ([`Inode::inline_mac`]), so a small
/// `mac-tree` file is one object, as [`INLINE_LEAF`] makes a small `mt-eint` file. Set
/// with [`INLINE_LEAF`] on every volume created since it exists; a volume without it keeps
/// every `mac-tree` file's level 0 in `.m`.
pub const INLINE_MAC: &str = "inline-mac-leaf";

/// Feature flag: an `mt-eint` (GCM) Merkle tree of 2 to [`MAX_INLINE_TAGS`] leaves keeps
/// its leaves' tags in the inode record ([`Inode::inline_tags`]) while its counters leave
/// room, so a file of up to six blocks is one object in the store, as [`INLINE_LEAF`] makes
/// a file of one block. Set on every volume created since it exists; a volume without it
/// keeps such trees in `.m`.
pub const INLINE_TREE: &str = "inline-tree";

/// Feature flag: a new `mt-eint` (GCM) file keeps its data in slots of the inode table
/// ([`Inode::inline_data`]) while it is at most [`INLINE_DATA_MAX`] bytes, so a small file
/// has no object of its own in the store; the inode table's tree authenticates the bytes
/// and keeps them fresh. A file that grows past the bound moves to blocks under its scheme
/// and stays there. Set on every volume created since it exists.
pub const INLINE_DATA: &str = "inline-data";

/// Feature flag: a file's spilled counters of more than [`crate::tree::SEG_MIN_INTERVALS`]
/// intervals are kept in segments of [`crate::tree::SEG_BLOCKS`] blocks, hashed one by one,
/// in groups, and the groups into the record (docs/file-format.md §9.2, counter tag 2), so
/// that a random write rewrites and hashes one segment, not every interval. Set on every
/// volume created since it exists.
pub const CTR_SEGMENTS: &str = "ctr-segments";

/// Feature flag: an `mt-eint` block whose write counter is odd lives in the file's twin
/// object (`.t`), at the offset it would have in `.d`; one whose counter is even (or 0, a
/// hole) in `.d`. An overwrite of a block no state since the last checkpoint wrote goes,
/// under a counter of the other parity, directly into the slot the durable state does not
/// use, so the version the durable state names stays whole (docs/design.md, "Twin
/// blocks"). Set on every volume created since it exists.
pub const TWIN_BLOCKS: &str = "twin-blocks";

/// Feature flag: an `mt-eint` file's data item in the log leaves out the Merkle nodes its
/// leaves determine (every complete node above a leaf the item writes); replay recomputes
/// them from the leaves up and checks the tree against the item's root (docs/design.md,
/// "Leaves in the log"; docs/file-format.md §6a). An overwrite's record then carries one
/// node, not its whole path. Set on every volume created since it exists.
pub const LEAF_LOG: &str = "leaf-log";

/// Feature flag: a file's data item in the log takes the form of log item tag 12: its
/// record as the 8-byte words that changed since the file's previous data item in the log
/// (after a checkpoint, the first one holds all of them), its operations in variable-length
/// integers, a written range without its trailing zeros (docs/design.md, "Changes in the
/// log"; docs/file-format.md §6a). Set on every volume created since it exists.
pub const LOG_DELTA: &str = "log-delta";

/// Known feature flags.
pub const KNOWN_FEATURES: &[&str] = &[
    INLINE_LEAF,
    DIR_TREE,
    INLINE_MAC,
    INLINE_TREE,
    INLINE_DATA,
    CTR_SEGMENTS,
    TWIN_BLOCKS,
    LEAF_LOG,
    LOG_DELTA,
];

impl Config {
    /// The bytes authenticated together with the wrapped key: every field but the envelope.
    pub fn aad(&self) -> Vec<u8> {
        format!(
            "intact-config|{}|{}|{}|{}|{}|{}|{}|{}|{}",
            self.format,
            self.volume_id,
            self.block_size,
            self.scheme,
            self.kdf.m_kib,
            self.kdf.t,
            self.kdf.p,
            self.salt,
            self.features.join(",")
        )
        .into_bytes()
    }

    /// Parses and validates a config's bytes.
    pub fn parse(bytes: &[u8]) -> Result<Config> {
        let c: Config = serde_json::from_slice(bytes)
            .map_err(|e| Error::Config(format!("{CONFIG_NAME} is corrupted or truncated: {e}")))?;
        if c.format > FORMAT_VERSION {
            return Err(Error::Config(format!(
                "format version {} is newer than this intact understands ({FORMAT_VERSION})",
                c.format
            )));
        }
        if let Some(f) = c
            .features
            .iter()
            .find(|f| !KNOWN_FEATURES.contains(&f.as_str()))
        {
            return Err(Error::Config(format!(
                "unknown feature flag {f:?}: written by a newer intact"
            )));
        }
        check_block_size(c.block_size)?;
        if c.scheme != AUTO {
            SchemeId::parse(&c.scheme)?;
        }
        c.kdf.validate()?;
        if c.volume_id.len() != 32 || hex::decode(&c.volume_id).is_err() {
            return Err(Error::Config("bad volume id".into()));
        }
        Ok(c)
    }

    /// The volume id bytes.
    pub fn volume_id_bytes(&self) -> [u8; 16] {
        let mut id = [0u8; 16];
        id.copy_from_slice(&hex::decode(&self.volume_id).expect("validated"));
        id
    }
}

/// Block sizes must be powers of two from 128 B to 64 KiB.
pub fn check_block_size(bs: u32) -> Result<()> {
    if !(128..=65536).contains(&bs) || !bs.is_power_of_two() {
        return Err(Error::Config(format!(
            "block size {bs} is not a power of two in 128..=65536"
        )));
    }
    Ok(())
}

/// Names of a file's objects in the untrusted store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectNames {
    /// Encrypted blocks.
    pub data: String,
    /// Merkle nodes (US_F).
    pub meta: String,
    /// Spilled counter intervals (US_F).
    pub ctrs: String,
    /// Encrypted blocks whose counter is odd, at the same offsets as in `data`, on a volume
    /// with twin blocks ([`TWIN_BLOCKS`]).
    pub twin: String,
}

impl ObjectNames {
    /// Object names of file `id`: `f/<first two hex>/<hex>.{d,m,c,t}`.
    pub fn of(id: &FileId) -> Self {
        let h = hex::encode(id);
        let base = format!("f/{}/{}", &h[..2], h);
        ObjectNames {
            data: format!("{base}.d"),
            meta: format!("{base}.m"),
            ctrs: format!("{base}.c"),
            twin: format!("{base}.t"),
        }
    }

    /// Every object of the file.
    pub fn all(&self) -> [&String; 4] {
        [&self.data, &self.meta, &self.ctrs, &self.twin]
    }

    /// The objects that hold its blocks (written directly, synced by fsync).
    pub fn blocks(&self) -> [&String; 2] {
        [&self.data, &self.twin]
    }
}

/// Errors while decoding integrity-protected structures name what they came from.
pub fn malformed(subject: Subject, what: impl Into<String>) -> Error {
    Error::tampered(subject, None, what)
}

/// The codes and rules of this file, one table each. The byte-level records are frozen
/// in tests/format_vectors.rs; these check every code and name, which a vector of one
/// record does not.
#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind's record byte (docs/file-format.md §4), which kinds a directory entry
    /// may name, and which have no content or keep a device number.
    /// The record's last 128 bytes hold the counters' inline form (13 bytes and 16 an
    /// interval) and 16 bytes a leaf: k + n <= 7, for 2 to 6 leaves (docs/file-format.md §4).
    /// An inline-data record round-trips with its slot list (bytes 128..256 of
    /// docs/file-format.md §4.3), and every departure from the layout is refused: slots that
    /// do not match the size, another kind or scheme, the `auto` bit or another inline bit,
    /// a tree or `ctr_hw`, nonzero padding, a size past the bound.
    #[test]
    fn inline_data_records_round_trip_and_malformed_ones_are_refused() {
        let mut rec = Inode::new(
            Kind::File,
            SchemeId::MtEintGcm,
            [3; 16],
            TreeState {
                leaves: 0,
                root: [0; 32],
            },
            1,
        );
        rec.size = 2 * SLOT_BYTES as u64 + 1;
        rec.inline_data = Some(InlineData {
            slots: vec![10, 11, 500],
            bytes: Vec::new(),
        });
        let b = rec.encode();
        assert_eq!(b[2], 16, "flag bit 4");
        assert_eq!(&b[128..136], &[2, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[136..144], &10u64.to_le_bytes());
        assert_eq!(&b[152..160], &500u64.to_le_bytes());
        assert!(b[160..].iter().all(|&x| x == 0));
        assert_eq!(Inode::decode(&b), Some(rec.clone()));
        let refused = |f: &dyn Fn(&mut [u8; RECORD_SIZE])| {
            let mut c = b;
            f(&mut c);
            Inode::decode(&c)
        };
        assert_eq!(
            refused(&|c| c[129] = 2),
            None,
            "fewer slots than the size needs"
        );
        assert_eq!(refused(&|c| c[129] = 4), None, "more");
        assert_eq!(refused(&|c| c[0] = Kind::Dir as u8), None, "a directory");
        assert_eq!(
            refused(&|c| c[1] = SchemeId::MacTree.code()),
            None,
            "mac-tree"
        );
        assert_eq!(refused(&|c| c[2] |= 1), None, "auto");
        assert_eq!(refused(&|c| c[2] |= 4), None, "an inline node too");
        assert_eq!(refused(&|c| c[2] |= 8), None, "inline tags too");
        assert_eq!(refused(&|c| c[72] = 1), None, "a leaf");
        assert_eq!(refused(&|c| c[112] = 1), None, "ctr_hw");
        assert_eq!(refused(&|c| c[128] = 0), None, "the counters' tag");
        assert_eq!(refused(&|c| c[131] = 1), None, "padding");
        assert_eq!(refused(&|c| c[200] = 1), None, "past the slots");
        let past = |c: &mut [u8; RECORD_SIZE]| {
            c[24..32].copy_from_slice(&(INLINE_DATA_MAX + 1).to_le_bytes());
            c[129] = 16;
        };
        assert_eq!(refused(&past), None, "past the bound");
        // Decoded, the bytes are empty (the engine reads the slots).
        let mut with_bytes = rec.clone();
        with_bytes.inline_data.as_mut().unwrap().bytes = vec![1; 497];
        assert_eq!(Inode::decode(&with_bytes.encode()), Some(rec));
        // A slot: its payload, and nothing else of kind 9.
        let slot = encode_slot(b"abc");
        assert_eq!(slot[0], 9);
        assert_eq!(&slot_payload(&slot).unwrap()[..4], b"abc\0");
        assert_eq!(Inode::decode(&slot).map(|i| i.kind), Some(Kind::Data));
        let mut c = slot;
        c[3] = 1;
        assert_eq!(slot_payload(&c), None);
        assert_eq!(Inode::decode(&c), None);
    }

    #[test]
    fn inline_tags_fit_where_counters_and_tags_share_the_record() {
        for (leaves, intervals, fits) in [
            (2, 1, true),
            (2, 5, true),
            (2, 6, false),
            (4, 3, true),
            (4, 4, false),
            (6, 1, true),
            (6, 2, false),
            (1, 1, false),
            (7, 0, false),
            (0, 0, false),
        ] {
            assert_eq!(
                InlineTags::fit(leaves, intervals),
                fits,
                "{leaves} leaves, {intervals} intervals"
            );
        }
    }

    #[test]
    fn kind_codes_are_frozen() {
        // (kind, code, may be an entry, special, device)
        let table = [
            (Kind::Free, 0, false, false, false),
            (Kind::File, 1, true, false, false),
            (Kind::Dir, 2, true, false, false),
            (Kind::Symlink, 3, true, false, false),
            (Kind::Xattr, 4, false, false, false),
            (Kind::Fifo, 5, true, true, false),
            (Kind::Socket, 6, true, true, false),
            (Kind::CharDev, 7, true, true, true),
            (Kind::BlockDev, 8, true, true, true),
            (Kind::Data, 9, false, false, false),
        ];
        for (kind, code, entry, special, device) in table {
            assert_eq!(kind as u8, code);
            assert_eq!(Kind::from_u8(code), Some(kind), "{kind:?}");
            assert_eq!(Kind::of_entry(code), entry.then_some(kind), "{kind:?}");
            assert_eq!(kind.is_special(), special, "{kind:?}");
            assert_eq!(kind.is_device(), device, "{kind:?}");
        }
        for code in [10, 0x80, 0xff] {
            assert_eq!(Kind::from_u8(code), None);
            assert_eq!(Kind::of_entry(code), None);
        }
    }

    /// Every scheme's record byte, the names users type, and what each promises.
    #[test]
    fn scheme_codes_names_and_properties_are_frozen() {
        // (scheme, code, name, fresh, authenticates, counter intervals, partial tree)
        let table = [
            (SchemeId::Aead, 1, "aead", false, true, false, false),
            (SchemeId::MtEintGcm, 2, "mt-eint", true, true, true, false),
            (
                SchemeId::MtEintCbc,
                3,
                "mt-eint-cbc",
                true,
                true,
                true,
                false,
            ),
            (SchemeId::None, 4, "none", false, false, true, false),
            (SchemeId::RandEint, 5, "rand-eint", true, true, true, true),
            (SchemeId::CompEint, 6, "comp-eint", true, true, true, true),
            (
                SchemeId::CompEintZstd,
                7,
                "comp-eint-zstd",
                true,
                true,
                true,
                true,
            ),
            (SchemeId::MacTree, 8, "mac-tree", true, true, false, false),
        ];
        assert_eq!(table.len(), SchemeId::ALL.len());
        for (s, code, name, fresh, auth, intervals, partial) in table {
            assert!(SchemeId::ALL.contains(&s));
            assert_eq!(s.code(), code, "{s:?}");
            assert_eq!(SchemeId::from_code(code), Some(s), "{s:?}");
            assert_eq!(s.name(), name);
            assert_eq!(SchemeId::parse(name).unwrap(), s);
            assert_eq!(s.fresh(), fresh, "{s:?}");
            assert_eq!(s.authenticates(), auth, "{s:?}");
            assert_eq!(s.uses_counter_intervals(), intervals, "{s:?}");
            assert_eq!(s.partial_tree(), partial, "{s:?}");
        }
        assert_eq!(SchemeId::parse("mt-eint-gcm").unwrap(), SchemeId::MtEintGcm);
        for code in [0, 9, 0xff] {
            assert_eq!(SchemeId::from_code(code), None);
        }
        for bad in ["", "MT-EINT", "auto", "mt_eint", "aead "] {
            let e = SchemeId::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("unknown scheme") && e.contains("comp-eint-zstd"),
                "{e}"
            );
        }
    }

    /// Table 7 of Oprea–Reiter (2006, §8) at its edges: "majority" is strict, and a tie
    /// of reads and writes counts as write-dominated.
    #[test]
    fn auto_choice_at_its_edges() {
        assert_eq!(auto_choice(1, 1, 0, 0), None);
        // Exactly half random is not a majority: low entropy.
        assert_eq!(auto_choice(0, 4, 2, 4), Some(SchemeId::RandEint));
        assert_eq!(auto_choice(0, 4, 3, 4), Some(SchemeId::MtEintGcm));
        assert_eq!(auto_choice(0, 4, 1, 1), Some(SchemeId::MtEintGcm));
        assert_eq!(auto_choice(0, 4, 0, 1), Some(SchemeId::RandEint));
        assert_eq!(auto_choice(0, 0, 5, 9), Some(SchemeId::MtEintGcm));
        assert_eq!(auto_choice(0, 0, 4, 9), Some(SchemeId::RandEint));
        // Writes equal to reads: RAND-EINT; one more read: COMP-EINT.
        assert_eq!(auto_choice(7, 7, 0, 3), Some(SchemeId::RandEint));
        assert_eq!(auto_choice(8, 7, 0, 3), Some(SchemeId::CompEint));
        assert_eq!(auto_choice(7, 8, 0, 3), Some(SchemeId::RandEint));
    }

    /// TS_F's bytes in use, counted by hand from docs/file-format.md §4: scheme byte and
    /// block count (9), the inline node (32), then per scheme.
    #[test]
    fn trusted_bytes_are_counted_per_scheme() {
        let tree = TreeState {
            leaves: 3,
            root: [1; 32],
        };
        let mut i = Inode::new(Kind::File, SchemeId::MtEintGcm, [7; 16], tree, 0);
        let mut c = CounterIntervals::new();
        c.set_range(0, 1, 5);
        c.set_range(1, 1, 6);
        c.set_range(2, 1, 7);
        assert_eq!(c.intervals(), 3);
        i.counters = TrustedCounters::Inline(c);
        // Root 32, ctr_hw 8, intervals 13 + 16 each.
        assert_eq!(i.trusted_bytes_used(), 9 + 32 + 8 + 13 + 48);
        i.scheme = SchemeId::None;
        assert_eq!(i.trusted_bytes_used(), 9 + 8 + 13 + 48);
        i.scheme = SchemeId::Aead;
        assert_eq!(i.trusted_bytes_used(), 9);
        i.scheme = SchemeId::MacTree;
        assert_eq!(i.trusted_bytes_used(), 9 + 18);
        i.inline_node = Some([2; 32]);
        assert_eq!(i.trusted_bytes_used(), 9 + 32 + 18);
        i.scheme = SchemeId::RandEint;
        i.inline_node = None;
        i.counters = TrustedCounters::Spilled {
            intervals: 3,
            blocks: 3,
            h_starts: [3; 32],
            h_ctrs: [4; 32],
        };
        assert_eq!(i.trusted_bytes_used(), 9 + 32 + 8 + 77);
    }

    fn key() -> SubKey {
        crate::crypto::MasterKey::from_bytes([9; 32]).derive(crate::crypto::label::ANCHOR, &[])
    }

    fn anchor() -> Anchor {
        let itable = Inode::new(
            Kind::File,
            SchemeId::MtEintGcm,
            [5; 16],
            TreeState {
                leaves: 2,
                root: [6; 32],
            },
            1,
        );
        let pos = |seg, off| crate::wal::LogPos { seg, off };
        Anchor {
            volume_id: [1; 16],
            epoch: 3,
            ctr_next: 4,
            journal: None,
            applied: false,
            log: Some(AnchorLog {
                sealed: crate::wal::LogRef {
                    start: pos(1, 10),
                    end: pos(1, 20),
                },
                tail: true,
            }),
            itable,
        }
    }

    /// Offset of the log flags in an encoded anchor (docs/file-format.md §3).
    const FLAGS_AT: usize = 8 + 16 + 8 + 8 + 1 + 8 + 32;

    /// `edit` applied to an encoded anchor, with its MAC made again under the key: what
    /// a writer with the key (a newer intact, a bug) could have stored.
    fn remade(edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut b = anchor().encode(&key());
        b.truncate(b.len() - 32);
        edit(&mut b);
        let mac = key().mac(&[&b]);
        b.extend_from_slice(&mac);
        b
    }

    fn refused(b: &[u8], why: &str) {
        match Anchor::decode(b, &key()) {
            Err(Error::AnchorCorrupt(w)) => assert!(w.contains(why), "{w:?}, not {why:?}"),
            other => panic!("expected a corrupt anchor ({why}), got {other:?}"),
        }
    }

    /// An anchor is refused for its size, its magic, its MAC, and for every field the MAC
    /// vouches for but no writer of this format writes.
    #[test]
    fn anchors_with_fields_no_writer_writes_are_refused() {
        let a = anchor();
        assert_eq!(Anchor::decode(&remade(|_| ()), &key()).unwrap(), a);
        let good = a.encode(&key());
        refused(&good[..ANCHOR_SIZE - 1], "size");
        refused(&[good.clone(), vec![0]].concat(), "size");
        // The size of the format before the log, but not its magic.
        refused(&good[..ANCHOR_V1_SIZE], "size");
        let mut flipped = good.clone();
        flipped[ANCHOR_SIZE - 1] ^= 1;
        refused(&flipped, "MAC");
        let other =
            crate::crypto::MasterKey::from_bytes([8; 32]).derive(crate::crypto::label::ANCHOR, &[]);
        assert!(Anchor::decode(&a.encode(&other), &key()).is_err());
        // The current size under the old magic is neither format.
        refused(
            &remade(|b| b[..8].copy_from_slice(ANCHOR_V1_MAGIC)),
            "magic",
        );
        refused(&remade(|b| b[..8].copy_from_slice(b"INTANCH3")), "magic");
        refused(&remade(|b| b[40] = 2), "journal slot");
        // The log flags: no tail without a log, no unknown bit.
        refused(&remade(|b| b[FLAGS_AT] = LOG_NO_TAIL), "log flags");
        refused(
            &remade(|b| b[FLAGS_AT] = LOG_NO_TAIL | JOURNAL_APPLIED),
            "log flags",
        );
        refused(&remade(|b| b[FLAGS_AT] = LOG_PRESENT | 8), "log flags");
        refused(&remade(|b| b[FLAGS_AT] = 0x80), "log flags");
        // No log and no tail bits: no log, whatever the positions say.
        let no_log = Anchor::decode(&remade(|b| b[FLAGS_AT] = JOURNAL_APPLIED), &key()).unwrap();
        assert_eq!((no_log.log, no_log.applied), (None, true));
        // The sealed end before its start (end.seg is 8 bytes after start.off).
        refused(&remade(|b| b[FLAGS_AT + 17] = 0), "before its start");
        let same = remade(|b| b.copy_within(FLAGS_AT + 1..FLAGS_AT + 17, FLAGS_AT + 17));
        let l = Anchor::decode(&same, &key()).unwrap().log.unwrap();
        assert_eq!(l.sealed.start, l.sealed.end, "an empty sealed log is fine");
        // The inode table's record.
        refused(&remade(|b| b[FLAGS_AT + 33] = 9), "inode-table record");
    }

    /// A record is refused for its length, its kind and its scheme; a free record's
    /// scheme byte is not read.
    #[test]
    fn records_with_bad_codes_are_refused() {
        let i = anchor().itable;
        let b = i.encode();
        assert_eq!(Inode::decode(&b), Some(i.clone()));
        assert_eq!(Inode::decode(&b[..RECORD_SIZE - 1]), None);
        assert_eq!(Inode::decode(&[b.to_vec(), vec![0]].concat()), None);
        let with = |at: usize, v: u8| {
            let mut c = b;
            c[at] = v;
            Inode::decode(&c)
        };
        assert_eq!(with(0, 9), None);
        assert_eq!(with(1, 0), None);
        assert_eq!(with(1, 9), None);
        let free = Inode::free(77).encode();
        let mut odd = free;
        odd[1] = 0xee;
        assert_eq!(Inode::decode(&odd), Some(Inode::free(77)));
        // Each flag bit alone.
        assert!(with(2, 1).unwrap().auto);
        assert!(!with(2, 1).unwrap().scheme_set);
        assert!(with(2, 2).unwrap().scheme_set);
        assert!(!with(2, 2).unwrap().auto);
        assert_eq!(with(2, 4).unwrap().inline_node, Some([0; 32]));
    }

    fn config() -> Config {
        Config {
            format: FORMAT_VERSION,
            volume_id: "0123456789abcdef0123456789abcdef".into(),
            block_size: 4096,
            scheme: "mt-eint".into(),
            kdf: KdfParams {
                m_kib: 8,
                t: 1,
                p: 1,
            },
            salt: "00".into(),
            features: vec![INLINE_LEAF.into(), DIR_TREE.into()],
            wrapped_key: String::new(),
        }
    }

    fn parsed(edit: impl FnOnce(&mut Config)) -> Result<Config> {
        let mut c = config();
        edit(&mut c);
        Config::parse(&serde_json::to_vec(&c).unwrap())
    }

    fn config_refused(edit: impl FnOnce(&mut Config), why: &str) {
        match parsed(edit) {
            Err(Error::Config(w)) => assert!(w.contains(why), "{w:?}, not {why:?}"),
            other => panic!("expected a bad config ({why}), got {other:?}"),
        }
    }

    /// A config is checked field by field: a newer format, an unknown feature, a block
    /// size, a scheme or a volume id that no intact writes is refused with its reason.
    #[test]
    fn configs_are_checked_field_by_field() {
        assert_eq!(parsed(|_| ()).unwrap(), config());
        assert_eq!(config().volume_id_bytes()[..2], [0x01, 0x23]);
        assert!(parsed(|c| c.format = 0).is_ok(), "an older format opens");
        config_refused(|c| c.format = FORMAT_VERSION + 1, "newer");
        assert!(parsed(|c| c.features.clear()).is_ok());
        config_refused(|c| c.features.push("tails".into()), "unknown feature");
        config_refused(|c| c.block_size = 3000, "block size");
        config_refused(|c| c.block_size = 64, "block size");
        assert!(parsed(|c| c.scheme = AUTO.into()).is_ok());
        assert!(parsed(|c| c.scheme = "comp-eint-zstd".into()).is_ok());
        assert!(matches!(
            parsed(|c| c.scheme = "bogus".into()),
            Err(Error::Invalid(w)) if w.contains("unknown scheme")
        ));
        config_refused(|c| c.kdf.t = 0, "Argon2");
        config_refused(|c| c.volume_id.pop().map(drop).unwrap_or(()), "volume id");
        config_refused(|c| c.volume_id = "zz".repeat(16), "volume id");
        config_refused(|c| c.volume_id = "00".repeat(17), "volume id");
        assert!(matches!(
            Config::parse(b"{\"format\": 1"),
            Err(Error::Config(w)) if w.contains("corrupted or truncated")
        ));
    }

    /// Block sizes are the powers of two from 128 to 65,536.
    #[test]
    fn block_sizes_are_powers_of_two_in_range() {
        for ok in [128, 256, 4096, 65536] {
            assert!(check_block_size(ok).is_ok(), "{ok}");
        }
        for bad in [0, 1, 64, 127, 129, 3000, 4095, 65535, 131072, u32::MAX] {
            assert!(check_block_size(bad).is_err(), "{bad}");
        }
    }
}
