//! Primitives: key newtypes, labelled key derivation, block ciphers and keyed hashes.
//!
//! Every key is a zeroizing newtype; every derived key is bound to a label (and, for
//! per-file keys, the file id) so no two uses share a key. The labels are part of the
//! on-disk format (docs/file-format.md, "Key derivation") and frozen by test vectors.

use crate::error::{Error, Result};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use aws_lc_rs::cipher::{
    DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext, UnboundCipherKey, AES_256,
};
use aws_lc_rs::iv::FixedLength;
// (EncryptingKey is also used in CTR mode for `mac-tree`.)
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// A 32-byte hash or keyed-hash output.
pub type Hash = [u8; 32];
/// A file's random identity: names its objects and binds its keys and hashes.
pub type FileId = [u8; 16];
/// Size of an AES-GCM tag.
pub const TAG_LEN: usize = 16;
/// Size of an AES-GCM nonce.
pub const NONCE_LEN: usize = 12;

/// HKDF labels: each names one use of key material. Part of the on-disk format.
pub mod label {
    /// Per-file data encryption key (GCM or CBC), info = label || file id.
    pub const FILE_DATA: &str = "intact v1 file data encryption";
    /// Per-file PRF key for CBC IVs (paper Fig. 3, G_k1), info = label || file id.
    pub const FILE_IV: &str = "intact v1 file CBC IV PRF";
    /// Volume-wide key for keyed leaf hashes h(i || ctr || B_i).
    pub const LEAF: &str = "intact v1 Merkle leaf hash";
    /// Volume-wide key for Merkle internal nodes.
    pub const NODE: &str = "intact v1 Merkle node hash";
    /// Volume-wide key for hashing spilled counter arrays (paper Fig. 6, h(IntStart), h(CtrVal)).
    pub const COUNTERS: &str = "intact v1 counter interval hash";
    /// Key of the MAC over the trusted anchor.
    pub const ANCHOR: &str = "intact v1 trusted anchor MAC";
    /// Key of the digest of the commit journal.
    pub const JOURNAL: &str = "intact v1 journal digest";
    /// Volume-wide key of the order keys of directory entries (the top 60 bits of keyed
    /// BLAKE3 of a name; docs/file-format.md §5.2).
    pub const DIR_NAME: &str = "intact v1 directory name order";
    /// Key of the log's records (AES-256-GCM; see [`crate::wal`]).
    pub const LOG: &str = "intact v1 log record encryption";
    /// Per-file AES-256 key of the `mac-tree` scheme, used both for the CTR keystream and
    /// to blind Poly1305 (Yun et al. §4.4: safe with disjoint nonce encodings),
    /// info = label || file id.
    pub const MAC_TREE_AES: &str = "intact v1 mac-tree AES key";
    /// Per-file Poly1305 key `r` (first 16 bytes; clamped by Poly1305) of `mac-tree`,
    /// info = label || file id.
    pub const MAC_TREE_POLY: &str = "intact v1 mac-tree Poly1305 r";
    /// Per-file HCTR2-AES-256 key (rand-eint), info = label || file id.
    pub const FILE_WIDE: &str = "intact v1 file HCTR2 key";
    /// Per-file key of the HCTR2 tweak hash h(i || ctr) (rand-eint), info = label || file id.
    pub const FILE_TWEAK: &str = "intact v1 file HCTR2 tweak hash";
    /// Per-disk AES-256-GCM key of the block disk's blocks, info = label || disk id.
    pub const DISK_DATA: &str = "intact v1 disk block encryption";
    /// Per-disk key of the block disk's leaves h(i || ctr || tag), info = label || disk id.
    pub const DISK_LEAF: &str = "intact v1 disk leaf hash";
    /// Per-disk key of the block disk's tree nodes, info = label || disk id.
    pub const DISK_NODE: &str = "intact v1 disk node hash";
    /// Per-disk key of the block disk's trusted anchor MAC, info = label || disk id.
    pub const DISK_ANCHOR: &str = "intact v1 disk anchor MAC";
}

/// The volume master key: never stored in clear; wrapped under the password key.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct MasterKey([u8; 32]);

/// A derived 32-byte key.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct SubKey([u8; 32]);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}
impl std::fmt::Debug for SubKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubKey(..)")
    }
}

impl MasterKey {
    /// A fresh random master key.
    pub fn generate() -> Self {
        let mut k = [0u8; 32];
        fill_random(&mut k);
        MasterKey(k)
    }

    /// Wraps raw bytes (from the key envelope).
    pub fn from_bytes(b: [u8; 32]) -> Self {
        MasterKey(b)
    }

    /// The raw key, for wrapping only. Greppable on purpose.
    pub fn expose_secret(&self) -> &[u8; 32] {
        &self.0
    }

    /// HKDF-SHA256 (RFC 5869) with an empty salt, info = label || context.
    pub fn derive(&self, label: &str, context: &[u8]) -> SubKey {
        let hk = hkdf::Hkdf::<sha2::Sha256>::new(None, &self.0);
        let mut info = Zeroizing::new(Vec::with_capacity(label.len() + context.len()));
        info.extend_from_slice(label.as_bytes());
        info.extend_from_slice(context);
        let mut out = [0u8; 32];
        hk.expand(&info, &mut out)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        SubKey(out)
    }
}

impl SubKey {
    /// The raw key bytes. Greppable on purpose.
    pub fn expose_secret(&self) -> &[u8; 32] {
        &self.0
    }

    /// Keyed BLAKE3 of the concatenated parts.
    pub fn mac(&self, parts: &[&[u8]]) -> Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        for p in parts {
            h.update(p);
        }
        *h.finalize().as_bytes()
    }
}

/// Fills `buf` from the operating system's CSPRNG.
pub fn fill_random(buf: &mut [u8]) {
    use rand::RngCore;
    rand::rngs::OsRng.fill_bytes(buf);
}

/// A fresh random file id.
pub fn random_file_id() -> FileId {
    let mut id = [0u8; 16];
    fill_random(&mut id);
    id
}

/// Constant-time equality of two byte strings.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && aws_lc_rs::constant_time::verify_slices_are_equal(a, b).is_ok()
}

/// An AEAD tag did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthFailed;

/// AES-256-GCM with a caller-supplied nonce and a detached tag.
pub struct Gcm {
    key: LessSafeKey,
}

impl Gcm {
    /// A GCM key from a derived key.
    pub fn new(key: &SubKey) -> Self {
        let unbound = UnboundKey::new(&AES_256_GCM, key.expose_secret()).expect("32-byte AES key");
        Gcm {
            key: LessSafeKey::new(unbound),
        }
    }

    /// Encrypts `buf` in place and returns the tag.
    pub fn seal(&self, nonce: [u8; NONCE_LEN], aad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self
            .key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), buf)
            .expect("GCM seal cannot fail for in-range lengths");
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(tag.as_ref());
        t
    }

    /// Decrypts `buf` in place after checking the detached `tag`; on failure `buf` is zeroed
    /// (no unauthenticated plaintext is left behind).
    pub fn open(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        tag: &[u8],
        buf: &mut [u8],
    ) -> std::result::Result<(), AuthFailed> {
        let r = self.key.open_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            tag,
            buf,
        );
        if r.is_err() {
            buf.fill(0);
            return Err(AuthFailed);
        }
        Ok(())
    }

    /// Encrypts `buf` in place, appending the tag (for small envelopes).
    pub fn seal_append(&self, nonce: [u8; NONCE_LEN], aad: &[u8], buf: &mut Vec<u8>) {
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), buf)
            .expect("GCM seal");
    }

    /// Opens a sealed envelope in place; returns the plaintext length.
    pub fn open_in_place(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        buf: &mut [u8],
    ) -> Option<usize> {
        self.key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), buf)
            .ok()
            .map(|p| p.len())
    }
}

impl std::fmt::Debug for Gcm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gcm(..)")
    }
}

/// AES-256-CBC without padding, IV supplied by the caller: the length-preserving block
/// cipher of the paper's §4.1 (Fig. 3), used with IV = PRF(i || ctr).
pub struct Cbc {
    enc: EncryptingKey,
    dec: DecryptingKey,
}

impl Cbc {
    /// A CBC key from a derived key.
    pub fn new(key: &SubKey) -> Self {
        let k1 = UnboundCipherKey::new(&AES_256, key.expose_secret()).expect("AES key");
        let k2 = UnboundCipherKey::new(&AES_256, key.expose_secret()).expect("AES key");
        Cbc {
            enc: EncryptingKey::cbc(k1).expect("CBC key"),
            dec: DecryptingKey::cbc(k2).expect("CBC key"),
        }
    }

    /// Encrypts `buf` (a multiple of 16 bytes) in place.
    pub fn encrypt(&self, iv: [u8; 16], buf: &mut [u8]) {
        self.enc
            .less_safe_encrypt(buf, EncryptionContext::Iv128(FixedLength::from(iv)))
            .expect("CBC input is a multiple of the AES block");
    }

    /// Decrypts `buf` (a multiple of 16 bytes) in place.
    pub fn decrypt(&self, iv: [u8; 16], buf: &mut [u8]) {
        self.dec
            .decrypt(buf, DecryptionContext::Iv128(FixedLength::from(iv)))
            .expect("CBC input is a multiple of the AES block");
    }
}

impl std::fmt::Debug for Cbc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cbc(..)")
    }
}

/// Argon2id parameters, recorded in the volume config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KdfParams {
    /// Memory in KiB.
    pub m_kib: u32,
    /// Iterations.
    pub t: u32,
    /// Lanes.
    pub p: u32,
}

impl KdfParams {
    /// The default: 64 MiB, 3 passes, 1 lane (OWASP's second recommended setting is lighter).
    pub const DEFAULT: KdfParams = KdfParams {
        m_kib: 64 * 1024,
        t: 3,
        p: 1,
    };
    /// Cheap parameters for tests only.
    pub const TEST: KdfParams = KdfParams {
        m_kib: 64,
        t: 1,
        p: 1,
    };

    /// Refuses parameters outside sane bounds (a corrupted config must not make us allocate TBs).
    pub fn validate(&self) -> Result<()> {
        if !(8..=4 * 1024 * 1024).contains(&self.m_kib)
            || !(1..=64).contains(&self.t)
            || !(1..=16).contains(&self.p)
        {
            return Err(Error::Config(format!(
                "Argon2 parameters out of range: {self:?}"
            )));
        }
        Ok(())
    }
}

/// Derives the key-encryption key from a password with Argon2id.
pub fn password_key(password: &[u8], salt: &[u8], params: KdfParams) -> Result<SubKey> {
    params.validate()?;
    let p = argon2::Params::new(params.m_kib, params.t, params.p, Some(32))
        .map_err(|e| Error::Config(format!("Argon2 parameters: {e}")))?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, p);
    let mut out = [0u8; 32];
    a.hash_password_into(password, salt, &mut out)
        .map_err(|e| Error::Config(format!("Argon2: {e}")))?;
    Ok(SubKey(out))
}

/// Poly1305-AES (Bernstein, "The Poly1305-AES message-authentication code", 2005), the
/// Wegman–Carter MAC of Yun et al. §3.4: `MAC(n, m) = (Poly1305_r(m) + AES_k(n)) mod 2^128`.
/// A nonce `n` must never authenticate two different messages; verification may repeat it.
///
/// Built from RustCrypto's `poly1305` (whose key is `r || s`, computing
/// `Poly1305_r(m) + s`) with `s = AES_k(n)` from RustCrypto's `aes`. Generic over the AES
/// key size: the paper's test vectors use AES-128, the `mac-tree` scheme AES-256.
pub struct PolyAes<C> {
    aes: C,
    r: Zeroizing<[u8; 16]>,
}

impl<
        C: aes::cipher::BlockEncrypt
            + aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
    > PolyAes<C>
{
    /// A MAC from an AES key schedule and the 16-byte Poly1305 key `r` (clamped inside).
    pub fn new(aes: C, r: [u8; 16]) -> Self {
        PolyAes {
            aes,
            r: Zeroizing::new(r),
        }
    }

    /// `AES_k(block)`.
    pub fn aes_block(&self, block: &[u8; 16]) -> [u8; 16] {
        let mut b = aes::cipher::generic_array::GenericArray::from(*block);
        self.aes.encrypt_block(&mut b);
        b.into()
    }

    /// The 16-byte tag of `msg` under nonce `n`.
    pub fn mac(&self, n: &[u8; 16], msg: &[u8]) -> [u8; 16] {
        use poly1305::universal_hash::KeyInit;
        let mut key = Zeroizing::new([0u8; 32]);
        key[..16].copy_from_slice(&*self.r);
        key[16..].copy_from_slice(&self.aes_block(n));
        let poly = poly1305::Poly1305::new(poly1305::Key::from_slice(&*key));
        poly.compute_unpadded(msg).into()
    }

    /// Whether `tag` is the tag of `msg` under `n` (constant time).
    pub fn verify(&self, n: &[u8; 16], msg: &[u8], tag: &[u8]) -> bool {
        ct_eq(&self.mac(n, msg), tag)
    }
}

impl<C> std::fmt::Debug for PolyAes<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolyAes(..)")
    }
}

/// AES-256-CTR (aws-lc-rs): XORs a buffer with `AES_k(iv) || AES_k(iv + 1) || ...`, the
/// counter block incremented as a 128-bit big-endian integer. Callers keep the increments
/// inside their own nonce domain (see the `mac-tree` nonce table: the last four bytes
/// never carry).
pub struct Ctr {
    key: EncryptingKey,
}

impl Ctr {
    /// A CTR key from a derived key.
    pub fn new(key: &SubKey) -> Self {
        let k = UnboundCipherKey::new(&AES_256, key.expose_secret()).expect("AES key");
        Ctr {
            key: EncryptingKey::ctr(k).expect("CTR key"),
        }
    }

    /// XORs `buf` with the keystream starting at counter block `iv` (encrypts or decrypts).
    pub fn xor(&self, iv: [u8; 16], buf: &mut [u8]) {
        self.key
            .less_safe_encrypt(buf, EncryptionContext::Iv128(FixedLength::from(iv)))
            .expect("CTR accepts any length");
    }
}

impl std::fmt::Debug for Ctr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ctr(..)")
    }
}

/// Keys of one file, derived from the master key and the file id, each scheme's group
/// at its first use: a record opened for its attributes (a `stat`, a lookup, a listing)
/// needs none, and a file needs only its scheme's (deriving all of them took about 5 µs:
/// six HKDF expansions and five key schedules, 5 % of a mount's CPU while it created
/// files of 16 KiB).
pub struct FileKeys {
    master: std::sync::Arc<MasterKey>,
    file: FileId,
    /// Block AEAD (aead scheme, mt-eint in GCM mode).
    gcm: std::sync::OnceLock<Gcm>,
    /// Block cipher for mt-eint in CBC mode (and `none`, `comp-eint`), and its IV PRF key.
    cbc: std::sync::OnceLock<(Cbc, SubKey)>,
    /// `mac-tree`: Poly1305-AES with AES-256 and Poly1305's `r`, and AES-256-CTR under the
    /// same AES key (Yun et al. §4.4).
    mac: std::sync::OnceLock<(PolyAes<aes::Aes256>, Ctr)>,
    /// Wide-block tweakable cipher (rand-eint) and the key of its tweak hash.
    wide: std::sync::OnceLock<(crate::wide::Hctr2, SubKey)>,
}

impl FileKeys {
    /// The keys of `file`, each group derived when first used.
    pub fn new(master: std::sync::Arc<MasterKey>, file: &FileId) -> Self {
        FileKeys {
            master,
            file: *file,
            gcm: std::sync::OnceLock::new(),
            cbc: std::sync::OnceLock::new(),
            mac: std::sync::OnceLock::new(),
            wide: std::sync::OnceLock::new(),
        }
    }

    /// The keys of `file`, every group derived now.
    pub fn derive(master: &MasterKey, file: &FileId) -> Self {
        let keys = FileKeys::new(std::sync::Arc::new(master.clone()), file);
        keys.gcm();
        keys.cbc();
        keys.mac();
        keys.wide();
        keys
    }

    /// Whether any group has been derived.
    pub fn derived(&self) -> bool {
        self.gcm.get().is_some()
            || self.cbc.get().is_some()
            || self.mac.get().is_some()
            || self.wide.get().is_some()
    }

    /// Block AEAD (aead scheme, mt-eint in GCM mode).
    pub fn gcm(&self) -> &Gcm {
        self.gcm
            .get_or_init(|| Gcm::new(&self.master.derive(label::FILE_DATA, &self.file)))
    }

    fn cbc_group(&self) -> &(Cbc, SubKey) {
        self.cbc.get_or_init(|| {
            let data = self.master.derive(label::FILE_DATA, &self.file);
            (
                Cbc::new(&data),
                self.master.derive(label::FILE_IV, &self.file),
            )
        })
    }

    /// Block cipher for mt-eint in CBC mode (and `none`, `comp-eint`).
    pub fn cbc(&self) -> &Cbc {
        &self.cbc_group().0
    }

    fn mac_group(&self) -> &(PolyAes<aes::Aes256>, Ctr) {
        self.mac.get_or_init(|| {
            use aes::cipher::KeyInit;
            let aes_key = self.master.derive(label::MAC_TREE_AES, &self.file);
            let poly = self.master.derive(label::MAC_TREE_POLY, &self.file);
            let mut r = [0u8; 16];
            r.copy_from_slice(&poly.expose_secret()[..16]);
            let mac = PolyAes::new(
                aes::Aes256::new(aes::cipher::generic_array::GenericArray::from_slice(
                    aes_key.expose_secret(),
                )),
                r,
            );
            r.zeroize();
            (mac, Ctr::new(&aes_key))
        })
    }

    /// `mac-tree`: Poly1305-AES with AES-256 and Poly1305's `r`.
    pub fn mac(&self) -> &PolyAes<aes::Aes256> {
        &self.mac_group().0
    }

    /// `mac-tree`: AES-256-CTR under the same AES key as [`FileKeys::mac`] (Yun et al.
    /// §4.4).
    pub fn ctr(&self) -> &Ctr {
        &self.mac_group().1
    }

    fn wide_group(&self) -> &(crate::wide::Hctr2, SubKey) {
        self.wide.get_or_init(|| {
            let wide = self.master.derive(label::FILE_WIDE, &self.file);
            (
                crate::wide::Hctr2::new(wide.expose_secret()),
                self.master.derive(label::FILE_TWEAK, &self.file),
            )
        })
    }

    /// Wide-block tweakable cipher (rand-eint).
    pub fn wide(&self) -> &crate::wide::Hctr2 {
        &self.wide_group().0
    }

    /// The HCTR2 tweak of block `index` at counter `ctr` (RAND-EINT §5.2: "the hash of the
    /// block number concatenated with the block write counter"): keyed BLAKE3 over
    /// "tweak" || i (u64 LE) || ctr (u64 LE), 32 bytes.
    pub fn tweak(&self, index: u64, ctr: u64) -> Hash {
        self.wide_group()
            .1
            .mac(&[b"tweak", &index.to_le_bytes(), &ctr.to_le_bytes()])
    }

    /// The deterministic GCM nonce of block `index` at write counter `ctr`:
    /// index as u32 LE (4 bytes) || ctr as u64 LE (8 bytes). Unique per file key because a
    /// (block, counter) pair is never written twice (see docs/design.md, "Counters").
    pub fn nonce(index: u64, ctr: u64) -> [u8; NONCE_LEN] {
        let mut n = [0u8; NONCE_LEN];
        n[..4].copy_from_slice(&(index as u32).to_le_bytes());
        n[4..].copy_from_slice(&ctr.to_le_bytes());
        n
    }

    /// The CBC IV of block `index` at counter `ctr`: G_k1(i || ctr) of Fig. 3, here the first
    /// 16 bytes of keyed BLAKE3 over "iv" || i (u64 LE) || ctr (u64 LE).
    pub fn cbc_iv(&self, index: u64, ctr: u64) -> [u8; 16] {
        let h = self
            .cbc_group()
            .1
            .mac(&[b"iv", &index.to_le_bytes(), &ctr.to_le_bytes()]);
        let mut iv = [0u8; 16];
        iv.copy_from_slice(&h[..16]);
        iv
    }
}

/// Largest block index a file may have: the GCM nonce holds the index in 32 bits.
pub const MAX_BLOCKS: u64 = 1 << 32;

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed_master() -> MasterKey {
        MasterKey::from_bytes(*b"0123456789abcdef0123456789abcdef")
    }

    /// Each group is derived at its first use, alone, and is the group derived eagerly.
    #[test]
    fn lazy_keys_are_the_file_keys_derived_once() {
        let m = fixed_master();
        let eager = FileKeys::derive(&m, &[4; 16]);
        let lazy = FileKeys::new(std::sync::Arc::new(m.clone()), &[4; 16]);
        assert!(!lazy.derived());
        assert_eq!(lazy.tweak(3, 9), eager.tweak(3, 9));
        assert!(lazy.derived());
        assert!(lazy.wide.get().is_some());
        assert!(lazy.gcm.get().is_none() && lazy.cbc.get().is_none() && lazy.mac.get().is_none());
        assert_ne!(lazy.tweak(3, 9), FileKeys::derive(&m, &[5; 16]).tweak(3, 9));
        assert_eq!(lazy.cbc_iv(3, 9), eager.cbc_iv(3, 9));
        assert!(lazy.gcm.get().is_none() && lazy.mac.get().is_none());
        let (mut a, mut b) = ([7u8; 32], [7u8; 32]);
        let ta = lazy.gcm().seal(FileKeys::nonce(1, 2), b"aad", &mut a);
        let tb = eager.gcm().seal(FileKeys::nonce(1, 2), b"aad", &mut b);
        assert_eq!((a, ta), (b, tb));
        assert!(lazy.mac.get().is_none());
        let (mut a, mut b) = ([7u8; 32], [7u8; 32]);
        lazy.ctr().xor([3; 16], &mut a);
        eager.ctr().xor([3; 16], &mut b);
        assert_eq!(a, b);
        let (mut a, mut b) = ([7u8; 32], [7u8; 32]);
        lazy.cbc().encrypt([1; 16], &mut a);
        eager.cbc().encrypt([1; 16], &mut b);
        assert_eq!(a, b);
        // Any one group counts as derived.
        let uses: [fn(&FileKeys); 4] = [
            |k| {
                let _ = k.gcm();
            },
            |k| {
                let _ = k.cbc();
            },
            |k| {
                let _ = k.mac();
            },
            |k| {
                let _ = k.wide();
            },
        ];
        for used in uses {
            let one = FileKeys::new(std::sync::Arc::new(m.clone()), &[4; 16]);
            used(&one);
            assert!(one.derived());
        }
    }

    /// Frozen vectors: these must never change, or existing volumes stop opening.
    #[test]
    fn kdf_vectors_are_frozen() {
        let m = fixed_master();
        let file = [7u8; 16];
        assert_eq!(
            hex::encode(m.derive(label::FILE_DATA, &file).expose_secret()),
            FROZEN_FILE_DATA
        );
        assert_eq!(
            hex::encode(m.derive(label::NODE, &[]).expose_secret()),
            FROZEN_NODE
        );
        assert_eq!(
            hex::encode(FileKeys::nonce(5, 0x0102030405060708)),
            "050000000807060504030201"
        );
        let keys = FileKeys::derive(&m, &file);
        assert_eq!(hex::encode(keys.cbc_iv(5, 9)), FROZEN_IV);
    }
    const FROZEN_FILE_DATA: &str =
        "ab4a7794e2a7f417700c4694fba1f40018aa12e7d4d81c9d5f8c13882f6b0e8c";
    const FROZEN_NODE: &str = "c12a321c93a67b3ca74d453230c81d573022ee20fa0ab2e25c849c64f3012a0a";
    const FROZEN_IV: &str = "2658afe7b3d36c6f02007bf03f82f1a0";

    /// Keys never print: their Debug form is a fixed placeholder, not the bytes.
    #[test]
    fn keys_debug_print_no_bytes() {
        let m = MasterKey::from_bytes([0xab; 32]);
        assert_eq!(format!("{m:?}"), "MasterKey(..)");
        let k = m.derive(label::FILE_DATA, b"f");
        assert_eq!(format!("{k:?}"), "SubKey(..)");
        assert_eq!(format!("{:?}", Gcm::new(&k)), "Gcm(..)");
        assert_eq!(format!("{:?}", Cbc::new(&k)), "Cbc(..)");
        let fk = FileKeys::derive(&m, &[1; 16]);
        assert_eq!(format!("{:?}", fk.mac()), "PolyAes(..)");
        assert_eq!(format!("{:?}", fk.ctr()), "Ctr(..)");
        assert_eq!(format!("{:?}", fk.wide()), "Hctr2(..)");
    }

    /// RAND-EINT's tweak (§5.2) binds the block's index and its write counter: changing
    /// either changes it, and so does the file.
    #[test]
    fn tweaks_bind_index_counter_and_file() {
        let m = fixed_master();
        let (a, b) = (
            FileKeys::derive(&m, &[1; 16]),
            FileKeys::derive(&m, &[2; 16]),
        );
        let t = a.tweak(1, 1);
        assert_ne!(t, [0u8; 32]);
        assert_ne!(t, a.tweak(2, 1));
        assert_ne!(t, a.tweak(1, 2));
        assert_ne!(a.tweak(1, 2), a.tweak(2, 1));
        assert_ne!(t, b.tweak(1, 1));
        assert_eq!(t, FileKeys::derive(&m, &[1; 16]).tweak(1, 1));
    }

    /// Argon2 parameters from a config are bounded one by one: memory 8 KiB to 4 GiB,
    /// 1 to 64 passes, 1 to 16 lanes (a damaged config cannot make us allocate terabytes).
    #[test]
    fn kdf_parameters_are_bounded_each() {
        // The default the README states: 64 MiB, 3 passes, 1 lane.
        assert_eq!(
            KdfParams::DEFAULT,
            KdfParams {
                m_kib: 65536,
                t: 3,
                p: 1
            }
        );
        KdfParams::DEFAULT.validate().unwrap();
        let ok = KdfParams {
            m_kib: 8,
            t: 1,
            p: 1,
        };
        ok.validate().unwrap();
        KdfParams {
            m_kib: 4 << 20,
            t: 64,
            p: 16,
        }
        .validate()
        .unwrap();
        for bad in [
            KdfParams { m_kib: 7, ..ok },
            KdfParams {
                m_kib: (4 << 20) + 1,
                ..ok
            },
            KdfParams {
                m_kib: u32::MAX,
                ..ok
            },
            KdfParams { t: 0, ..ok },
            KdfParams { t: 65, ..ok },
            KdfParams { p: 0, ..ok },
            KdfParams { p: 17, ..ok },
        ] {
            assert!(matches!(bad.validate(), Err(Error::Config(_))), "{bad:?}");
        }
    }

    /// The master key's bytes are what it was made from (the key envelope wraps them).
    #[test]
    fn master_key_exposes_the_bytes_it_holds() {
        let b: [u8; 32] = std::array::from_fn(|i| i as u8);
        assert_eq!(MasterKey::from_bytes(b).expose_secret(), &b);
        let g = MasterKey::generate();
        assert_ne!(g.expose_secret(), MasterKey::generate().expose_secret());
    }

    /// File ids are random: distinct, and not the zero id.
    #[test]
    fn random_file_ids_differ() {
        let ids: std::collections::HashSet<FileId> = (0..64).map(|_| random_file_id()).collect();
        assert_eq!(ids.len(), 64);
        assert!(!ids.contains(&[0u8; 16]));
    }

    #[test]
    fn gcm_round_trip_and_tamper() {
        let m = fixed_master();
        let k = FileKeys::derive(&m, &[1; 16]);
        let mut buf = b"hello world, sixteen+".to_vec();
        let tag = k.gcm().seal(FileKeys::nonce(1, 1), b"aad", &mut buf);
        let mut out = buf.clone();
        k.gcm()
            .open(FileKeys::nonce(1, 1), b"aad", &tag, &mut out)
            .unwrap();
        assert_eq!(&out, b"hello world, sixteen+");
        buf[0] ^= 1;
        assert!(k
            .gcm()
            .open(FileKeys::nonce(1, 1), b"aad", &tag, &mut buf)
            .is_err());
        assert!(buf.iter().all(|&b| b == 0));
    }

    /// Known answers: the AES-256 test cases 13 to 16 of McGrew and Viega, "The
    /// Galois/Counter Mode of Operation (GCM)" (2005), Appendix B, the vectors NIST's GCM
    /// validation reuses: (key, nonce, AAD, plaintext, ciphertext, tag). Sealed in place
    /// with a detached tag (the block path), appended (the envelope path), opened back, and
    /// a flipped tag bit refused.
    #[test]
    fn gcm_aes256_mcgrew_viega_test_cases_13_to_16() {
        const K15: &str = "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308";
        const P15: &str = "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
                           1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255";
        const C15: &str = "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
                           8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad";
        let zero = "00".repeat(32);
        let vectors: [(&str, &str, &str, &str, &str, &str); 4] = [
            (
                &zero,
                "000000000000000000000000",
                "",
                "",
                "",
                "530f8afbc74536b9a963b4f1c4cb738b",
            ),
            (
                &zero,
                "000000000000000000000000",
                "",
                "00000000000000000000000000000000",
                "cea7403d4d606b6e074ec5d3baf39d18",
                "d0d1c8a799996bf0265b98b5d48ab919",
            ),
            (
                K15,
                "cafebabefacedbaddecaf888",
                "",
                P15,
                C15,
                "b094dac5d93471bdec1a502270e3cc6c",
            ),
            (
                K15,
                "cafebabefacedbaddecaf888",
                "feedfacedeadbeeffeedfacedeadbeefabaddad2",
                &P15[..120],
                &C15[..120],
                "76fc6ece0f4e1768cddf8853bb2d551b",
            ),
        ];
        for (n, (key, nonce, aad, p, c, t)) in vectors.into_iter().enumerate() {
            let key: [u8; 32] = hex::decode(key).unwrap().try_into().unwrap();
            let gcm = Gcm::new(&SubKey(key));
            let nonce: [u8; NONCE_LEN] = hex::decode(nonce).unwrap().try_into().unwrap();
            let (aad, p) = (hex::decode(aad).unwrap(), hex::decode(p).unwrap());
            let mut buf = p.clone();
            let tag = gcm.seal(nonce, &aad, &mut buf);
            assert_eq!(hex::encode(&buf), c, "test case {}: ciphertext", 13 + n);
            assert_eq!(hex::encode(tag), t, "test case {}: tag", 13 + n);
            let mut env = p.clone();
            gcm.seal_append(nonce, &aad, &mut env);
            assert_eq!(hex::encode(&env), format!("{c}{t}"));
            assert_eq!(gcm.open_in_place(nonce, &aad, &mut env), Some(p.len()));
            assert_eq!(&env[..p.len()], &p[..]);
            gcm.open(nonce, &aad, &tag, &mut buf).unwrap();
            assert_eq!(buf, p);
            let mut bad = tag;
            bad[15] ^= 0x80;
            assert!(gcm.open(nonce, &aad, &bad, &mut buf).is_err());
        }
    }

    /// Known answers: the four examples of Bernstein, "The Poly1305-AES
    /// message-authentication code" (2005), Appendix B: (m, r, k, n, AES_k(n), tag).
    #[test]
    fn poly1305_aes_bernstein_appendix_b() {
        use aes::cipher::KeyInit;
        let vectors: [(&str, &str, &str, &str, &str, &str); 4] = [
            (
                "f3f6",
                "851fc40c3467ac0be05cc20404f3f700",
                "ec074c835580741701425b623235add6",
                "fb447350c4e868c52ac3275cf9d4327e",
                "580b3b0f9447bb1e69d095b5928b6dbc",
                "f4c633c3044fc145f84f335cb81953de",
            ),
            (
                "",
                "a0f3080000f46400d0c7e9076c834403",
                "75deaa25c09f208e1dc4ce6b5cad3fbf",
                "61ee09218d29b0aaed7e154a2c5509cc",
                "dd3fab2251f11ac759f0887129cc2ee7",
                "dd3fab2251f11ac759f0887129cc2ee7",
            ),
            (
                "663cea190ffb83d89593f3f476b6bc24d7e679107ea26adb8caf6652d0656136",
                "48443d0bb0d21109c89a100b5ce2c208",
                "6acb5f61a7176dd320c5c1eb2edcdc74",
                "ae212a55399729595dea458bc621ff0e",
                "83149c69b561dd88298a1798b10716ef",
                "0ee1c16bb73f0f4fd19881753c01cdbe",
            ),
            (
                "ab0812724a7f1e342742cbed374d94d136c6b8795d45b3819830f2c04491faf0\
                 990c62e48b8018b2c3e4a0fa3134cb67fa83e158c994d961c4cb21095c1bf9",
                "12976a08c4426d0ce8a82407c4f48207",
                "e1a5668a4d5b66a5f68cc5424ed5982d",
                "9ae831e743978d3a23527c7128149e3a",
                "80f8c20aa71202d1e29179cbcb555a57",
                "5154ad0d2cb26e01274fc51148491f1b",
            ),
        ];
        let h16 = |s: &str| -> [u8; 16] { hex::decode(s).unwrap().try_into().unwrap() };
        for (m, r, k, n, aes_n, tag) in vectors {
            let m = hex::decode(m.replace(' ', "")).unwrap();
            let aes = aes::Aes128::new_from_slice(&hex::decode(k).unwrap()).unwrap();
            let mac = PolyAes::new(aes, h16(r));
            assert_eq!(hex::encode(mac.aes_block(&h16(n))), aes_n);
            assert_eq!(hex::encode(mac.mac(&h16(n), &m)), tag);
            assert!(mac.verify(&h16(n), &m, &h16(tag)));
            let mut bad = h16(tag);
            bad[15] ^= 1;
            assert!(!mac.verify(&h16(n), &m, &bad));
        }
    }

    /// CTR keystream block k is AES_k(iv with its last four bytes + k, big-endian), with
    /// the same AES key as the MAC's blinding (Yun et al. §4.4).
    #[test]
    fn ctr_counts_in_the_last_four_bytes() {
        let k = FileKeys::derive(&fixed_master(), &[3; 16]);
        let iv: [u8; 16] = *b"0123456789ab\x01\x00\x00\xfe";
        let mut buf = [0u8; 48];
        k.ctr().xor(iv, &mut buf);
        for j in 0..3u32 {
            let mut b = iv;
            b[12..].copy_from_slice(&(0x0100_00feu32 + j).to_be_bytes());
            assert_eq!(
                &buf[16 * j as usize..16 * (j as usize + 1)],
                &k.mac().aes_block(&b)
            );
        }
    }

    #[test]
    fn cbc_round_trip_length_preserving() {
        let k = FileKeys::derive(&fixed_master(), &[2; 16]);
        let plain = vec![0xabu8; 4096];
        let mut buf = plain.clone();
        let iv = k.cbc_iv(3, 4);
        k.cbc().encrypt(iv, &mut buf);
        assert_eq!(buf.len(), 4096);
        assert_ne!(buf, plain);
        k.cbc().decrypt(iv, &mut buf);
        assert_eq!(buf, plain);
    }

    #[test]
    fn password_key_depends_on_all_inputs() {
        let a = password_key(b"pw", b"saltsaltsaltsalt", KdfParams::TEST).unwrap();
        let b = password_key(b"pw2", b"saltsaltsaltsalt", KdfParams::TEST).unwrap();
        let c = password_key(b"pw", b"saltsaltsaltsalT", KdfParams::TEST).unwrap();
        assert_ne!(a.expose_secret(), b.expose_secret());
        assert_ne!(a.expose_secret(), c.expose_secret());
        assert!(KdfParams {
            m_kib: u32::MAX,
            t: 1,
            p: 1
        }
        .validate()
        .is_err());
    }
}
