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
    /// Per-file HCTR2-AES-256 key (rand-eint), info = label || file id.
    pub const FILE_WIDE: &str = "intact v1 file HCTR2 key";
    /// Per-file key of the HCTR2 tweak hash h(i || ctr) (rand-eint), info = label || file id.
    pub const FILE_TWEAK: &str = "intact v1 file HCTR2 tweak hash";
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

/// Keys of one file, derived from the master key and the file id.
pub struct FileKeys {
    /// Block AEAD (aead scheme, mt-eint in GCM mode).
    pub gcm: Gcm,
    /// Block cipher for mt-eint in CBC mode.
    pub cbc: Cbc,
    /// IV PRF key for CBC mode.
    pub iv: SubKey,
    /// Wide-block tweakable cipher (rand-eint).
    pub wide: crate::wide::Hctr2,
    /// Key of the HCTR2 tweak hash (rand-eint).
    pub tweak: SubKey,
}

impl FileKeys {
    /// Derives a file's keys.
    pub fn derive(master: &MasterKey, file: &FileId) -> Self {
        let data = master.derive(label::FILE_DATA, file);
        FileKeys {
            gcm: Gcm::new(&data),
            cbc: Cbc::new(&data),
            iv: master.derive(label::FILE_IV, file),
            wide: crate::wide::Hctr2::new(master.derive(label::FILE_WIDE, file).expose_secret()),
            tweak: master.derive(label::FILE_TWEAK, file),
        }
    }

    /// The HCTR2 tweak of block `index` at counter `ctr` (RAND-EINT §5.2: "the hash of the
    /// block number concatenated with the block write counter"): keyed BLAKE3 over
    /// "tweak" || i (u64 LE) || ctr (u64 LE), 32 bytes.
    pub fn tweak(&self, index: u64, ctr: u64) -> Hash {
        self.tweak
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
            .iv
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

    #[test]
    fn gcm_round_trip_and_tamper() {
        let m = fixed_master();
        let k = FileKeys::derive(&m, &[1; 16]);
        let mut buf = b"hello world, sixteen+".to_vec();
        let tag = k.gcm.seal(FileKeys::nonce(1, 1), b"aad", &mut buf);
        let mut out = buf.clone();
        k.gcm
            .open(FileKeys::nonce(1, 1), b"aad", &tag, &mut out)
            .unwrap();
        assert_eq!(&out, b"hello world, sixteen+");
        buf[0] ^= 1;
        assert!(k
            .gcm
            .open(FileKeys::nonce(1, 1), b"aad", &tag, &mut buf)
            .is_err());
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn cbc_round_trip_length_preserving() {
        let k = FileKeys::derive(&fixed_master(), &[2; 16]);
        let plain = vec![0xabu8; 4096];
        let mut buf = plain.clone();
        let iv = k.cbc_iv(3, 4);
        k.cbc.encrypt(iv, &mut buf);
        assert_eq!(buf.len(), 4096);
        assert_ne!(buf, plain);
        k.cbc.decrypt(iv, &mut buf);
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
