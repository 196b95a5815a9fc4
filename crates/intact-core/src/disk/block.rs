//! The disk's block crypto (docs/design.md, "The block disk"): every block is sealed with
//! AES-256-GCM under a key of its own disk, with a nonce made of a write counter that no
//! earlier write of the disk used (counters come from the anchor's reservation, as the
//! file system's do: docs/design.md, "Counters and nonce uniqueness"), and with the disk's
//! id and the block's index as associated data, so a block moved to another index or
//! another disk fails. The tree authenticates each block through its leaf, a keyed hash of
//! (index, counter, tag): a block replayed with an older counter and tag, both authentic,
//! no longer matches its leaf.
//!
//! The reference code of the PAC paper reuses GCM nonces and hashes nodes unkeyed without
//! binding their position; neither is done here.

use crate::crypto::{label, AuthFailed, Gcm, Hash, MasterKey, SubKey, NONCE_LEN, TAG_LEN};

/// What the disk keeps per block beside its ciphertext (untrusted): the write counter and
/// the GCM tag. Encoded in [`SEALED_LEN`] bytes: counter (u64 LE), tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed {
    /// The write counter the block was sealed under (0: never written, a hole).
    pub counter: u64,
    /// The GCM tag.
    pub tag: [u8; TAG_LEN],
}

/// Bytes of an encoded [`Sealed`].
pub const SEALED_LEN: usize = 8 + TAG_LEN;

/// The leaf of a block never written: it reads as zeros, and the tree's all-zero subtrees
/// cost nothing to store.
pub const HOLE_LEAF: Hash = [0; 32];

/// The first 4 bytes of every block nonce: keeps block nonces apart from any other use of
/// GCM that a future format might give the same key.
const NONCE_DOMAIN: [u8; 4] = *b"blk0";

/// The counter's top bit marks a trim record: the block was discarded (TRIM, or zeros
/// written as a hole) under that write counter; its tag is then [`DiskKeys::trim`]'s MAC, not
/// a GCM tag, and its leaf is the hole's.
pub const TRIM_FLAG: u64 = 1 << 63;

impl Sealed {
    /// Never written: counter 0, no tag.
    pub const NEVER: Sealed = Sealed {
        counter: 0,
        tag: [0; TAG_LEN],
    };

    /// Whether this is a trim record ([`TRIM_FLAG`]).
    pub fn is_trim(&self) -> bool {
        self.counter & TRIM_FLAG != 0
    }

    /// The write counter without the trim flag: the order of writes to a disk.
    pub fn seq(&self) -> u64 {
        self.counter & !TRIM_FLAG
    }

    /// Whether the block reads as zeros (never written, or trimmed).
    pub fn is_hole(&self) -> bool {
        self.counter == 0 || self.is_trim()
    }

    /// The encoding kept beside the block.
    pub fn encode(&self) -> [u8; SEALED_LEN] {
        let mut b = [0u8; SEALED_LEN];
        b[..8].copy_from_slice(&self.counter.to_le_bytes());
        b[8..].copy_from_slice(&self.tag);
        b
    }

    /// Decodes [`Sealed::encode`]'s bytes (`None` for another length).
    pub fn decode(b: &[u8]) -> Option<Sealed> {
        if b.len() != SEALED_LEN {
            return None;
        }
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&b[8..]);
        Some(Sealed {
            counter: u64::from_le_bytes(b[..8].try_into().ok()?),
            tag,
        })
    }
}

/// The keys of one disk, derived from its master key and bound to its id.
pub struct DiskKeys {
    id: [u8; 16],
    data: Gcm,
    leaf: SubKey,
    node: SubKey,
}

impl std::fmt::Debug for DiskKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskKeys")
            .field("id", &hex::encode(self.id))
            .finish_non_exhaustive()
    }
}

impl DiskKeys {
    /// The keys of disk `id` (HKDF-SHA256 with the labels of [`label`], context = the id).
    pub fn derive(master: &MasterKey, id: [u8; 16]) -> DiskKeys {
        DiskKeys {
            id,
            data: Gcm::new(&master.derive(label::DISK_DATA, &id)),
            leaf: master.derive(label::DISK_LEAF, &id),
            node: master.derive(label::DISK_NODE, &id),
        }
    }

    /// The key of the tree's internal nodes (for the tree's hasher).
    pub fn node_key(&self) -> &SubKey {
        &self.node
    }

    fn nonce(counter: u64) -> [u8; NONCE_LEN] {
        let mut n = [0u8; NONCE_LEN];
        n[..4].copy_from_slice(&NONCE_DOMAIN);
        n[4..].copy_from_slice(&counter.to_le_bytes());
        n
    }

    fn aad(&self, index: u64) -> [u8; 24] {
        let mut a = [0u8; 24];
        a[..16].copy_from_slice(&self.id);
        a[16..].copy_from_slice(&index.to_le_bytes());
        a
    }

    /// Encrypts block `index` in place under `counter`, which must never have sealed a
    /// block of this disk before (it is the nonce). Counter 0 is the hole's.
    pub fn seal(&self, index: u64, counter: u64, buf: &mut [u8]) -> Sealed {
        assert_ne!(counter, 0, "counter 0 marks a hole");
        assert_eq!(counter & TRIM_FLAG, 0, "counters stay below 2^63");
        let tag = self.data.seal(Self::nonce(counter), &self.aad(index), buf);
        Sealed { counter, tag }
    }

    /// Decrypts block `index` in place after checking it against `sealed` (which the
    /// caller has checked against the tree: [`DiskKeys::leaf`]). On failure `buf` is
    /// zeroed. A hole (counter 0) must read as zeros and has no tag to check.
    pub fn open(&self, index: u64, sealed: &Sealed, buf: &mut [u8]) -> Result<(), AuthFailed> {
        if sealed.is_hole() {
            return Err(AuthFailed);
        }
        self.data.open(
            Self::nonce(sealed.counter),
            &self.aad(index),
            &sealed.tag,
            buf,
        )
    }

    /// The tree's leaf of block `index` sealed as `sealed`:
    /// `keyed_blake3(leaf key, "intact/disk/leaf\0" || index || counter || tag)`, or
    /// [`HOLE_LEAF`] for a hole.
    pub fn leaf(&self, index: u64, sealed: &Sealed) -> Hash {
        if sealed.is_hole() {
            return HOLE_LEAF;
        }
        self.leaf.mac(&[
            b"intact/disk/leaf\0",
            &index.to_le_bytes(),
            &sealed.counter.to_le_bytes(),
            &sealed.tag,
        ])
    }
}

impl DiskKeys {
    /// The trim record of block `index` under write counter `counter` (below 2^63, never
    /// used before): the counter with [`TRIM_FLAG`], and as tag the first 16 bytes of
    /// `keyed_blake3(leaf key, "intact/disk/trim\0" || index || counter)`. Authenticated, so
    /// that where no tree vouches for a block (the `aead` mode, a crash's unflushed tail)
    /// nobody without the key can make a block read as zeros.
    pub fn trim(&self, index: u64, counter: u64) -> Sealed {
        assert_eq!(counter & TRIM_FLAG, 0, "counters stay below 2^63");
        let mac = self.leaf.mac(&[
            b"intact/disk/trim\0",
            &index.to_le_bytes(),
            &counter.to_le_bytes(),
        ]);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&mac[..TAG_LEN]);
        Sealed {
            counter: counter | TRIM_FLAG,
            tag,
        }
    }

    /// Whether `sealed` is an authentic trim record of block `index`.
    pub fn is_authentic_trim(&self, index: u64, sealed: &Sealed) -> bool {
        sealed.is_trim() && crate::crypto::ct_eq(&self.trim(index, sealed.seq()).tag, &sealed.tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(id: u8) -> DiskKeys {
        DiskKeys::derive(&MasterKey::from_bytes([7; 32]), [id; 16])
    }

    fn block(fill: u8) -> Vec<u8> {
        (0..4096).map(|i| fill ^ (i as u8)).collect()
    }

    #[test]
    fn a_block_round_trips_and_binds_its_index_counter_and_disk() {
        let k = keys(1);
        let plain = block(3);
        let mut b = plain.clone();
        let s = k.seal(5, 100, &mut b);
        assert_ne!(b, plain);
        let mut c = b.clone();
        k.open(5, &s, &mut c).unwrap();
        assert_eq!(c, plain);
        // Moved to another index, or to another disk with the same password: fails, and
        // leaves no plaintext behind.
        let mut c = b.clone();
        assert_eq!(k.open(6, &s, &mut c), Err(AuthFailed));
        assert!(c.iter().all(|&x| x == 0));
        let mut c = b.clone();
        assert_eq!(keys(2).open(5, &s, &mut c), Err(AuthFailed));
        // Another counter (the nonce) or tag: fails.
        let mut c = b.clone();
        let other = Sealed { counter: 101, ..s };
        assert_eq!(k.open(5, &other, &mut c), Err(AuthFailed));
        let mut c = b.clone();
        let mut t = s;
        t.tag[0] ^= 1;
        assert_eq!(k.open(5, &t, &mut c), Err(AuthFailed));
        // A flipped bit of the ciphertext: fails.
        let mut c = b.clone();
        c[4095] ^= 0x80;
        assert_eq!(k.open(5, &s, &mut c), Err(AuthFailed));
        // A hole has nothing to open.
        let hole = Sealed {
            counter: 0,
            tag: [0; TAG_LEN],
        };
        assert_eq!(k.open(5, &hole, &mut b.clone()), Err(AuthFailed));
    }

    #[test]
    fn the_same_block_under_two_counters_is_two_ciphertexts() {
        let k = keys(1);
        let (mut a, mut b) = (block(9), block(9));
        let sa = k.seal(0, 1 << 32, &mut a);
        let sb = k.seal(0, (1 << 32) + 1, &mut b);
        assert_ne!(a, b);
        assert_ne!(sa.tag, sb.tag);
    }

    #[test]
    fn leaves_bind_index_counter_and_tag_and_a_hole_is_zero() {
        let k = keys(1);
        let s = Sealed {
            counter: 9,
            tag: [4; TAG_LEN],
        };
        let l = k.leaf(3, &s);
        assert_ne!(l, HOLE_LEAF);
        assert_ne!(l, k.leaf(4, &s));
        assert_ne!(l, k.leaf(3, &Sealed { counter: 10, ..s }));
        let mut t = s;
        t.tag[15] ^= 1;
        assert_ne!(l, k.leaf(3, &t));
        assert_ne!(l, keys(2).leaf(3, &s), "leaves are keyed per disk");
        assert_eq!(
            k.leaf(3, &Sealed { counter: 0, ..s }),
            HOLE_LEAF,
            "a hole's leaf"
        );
    }

    #[test]
    fn trim_records_are_keyed_holes_bound_to_index_and_counter() {
        let k = keys(1);
        let t = k.trim(7, 42);
        assert!(t.is_trim() && t.is_hole());
        assert_eq!(t.seq(), 42);
        assert_eq!(k.leaf(7, &t), HOLE_LEAF);
        assert!(k.is_authentic_trim(7, &t));
        assert!(!k.is_authentic_trim(8, &t), "bound to the index");
        assert!(!keys(2).is_authentic_trim(7, &t), "keyed per disk");
        let mut f = t;
        f.tag[0] ^= 1;
        assert!(!k.is_authentic_trim(7, &f));
        let g = Sealed {
            counter: 43 | TRIM_FLAG,
            ..t
        };
        assert!(!k.is_authentic_trim(7, &g), "bound to the counter");
        let s = Sealed {
            counter: 42,
            tag: t.tag,
        };
        assert!(!k.is_authentic_trim(7, &s), "only a trim record is one");
        assert!(!s.is_hole() && Sealed::NEVER.is_hole() && !Sealed::NEVER.is_trim());
        assert_eq!(k.open(7, &t, &mut [0u8; 16]), Err(AuthFailed));
    }

    #[test]
    fn keys_print_the_disk_and_no_key() {
        let k = keys(0xcd);
        let s = format!("{k:?}");
        assert!(s.contains(&"cd".repeat(16)), "{s}");
        assert!(!s.contains("data") && !s.contains("leaf:"), "{s}");
    }

    #[test]
    fn sealed_metadata_encodes_in_24_bytes() {
        let s = Sealed {
            counter: 0x0102_0304_0506_0708,
            tag: *b"0123456789abcdef",
        };
        let b = s.encode();
        assert_eq!(b.len(), 24);
        assert_eq!(&b[..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[8..], b"0123456789abcdef");
        assert_eq!(Sealed::decode(&b), Some(s));
        assert_eq!(Sealed::decode(&b[..23]), None);
    }

    /// Frozen: a change to the keys, nonce, AAD or leaf encoding changes these bytes
    /// (docs/file-format.md will hold them with the disk's format).
    #[test]
    fn frozen_vector() {
        let k = keys(0xab);
        let mut b = vec![0u8; 64];
        let s = k.seal(2, 0x1_0000_0001, &mut b);
        let got = format!(
            "{} {} {}",
            hex::encode(&b[..16]),
            hex::encode(s.tag),
            hex::encode(k.leaf(2, &s))
        );
        assert_eq!(got, FROZEN, "the block format changed");
    }

    /// Ciphertext and tag checked against an independent implementation (Python's
    /// `cryptography` AES-GCM with an HKDF-SHA256 written from RFC 5869 over `hmac`):
    /// key = HKDF(master, "intact v1 disk block encryption" || id), nonce = "blk0" ||
    /// counter LE, AAD = id || index LE. The leaf (keyed BLAKE3, the `blake3` crate) is
    /// frozen from this code.
    const FROZEN: &str = "e341bb1e3252fac0b9f6519febff8547 0a0f21216f5a2a6ca495b1c5bc26d99e \
                          e8f608a7e55366c94102d2ae29d26dafc5e637f6d86e0eeb4155d5e9ee98af59";
}
