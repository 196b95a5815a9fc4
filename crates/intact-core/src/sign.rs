//! Signed roots (issue 9): the writer signs every anchor it stores, and a reader that holds
//! only the writer's public key accepts only anchors signed by it (docs/design.md, "Signed
//! roots"; format: docs/file-format.md §1.2.2 and §1.2.3).
//!
//! The anchor is already authenticated by a MAC under the volume's key, but every holder of
//! the password has that key: a reader could forge an anchor (and with it any state of the
//! volume) for other readers. A signature under a key only the writer holds closes that.
//!
//! The algorithms are those of Contiu et al.'s Table 1 at their three security strengths,
//! through aws-lc-rs: Ed25519 (the default), ECDSA P-256/SHA-256, P-384/SHA-384,
//! P-521/SHA-512, and RSA-PSS at 3072 bits with SHA-256, 7680 with SHA-384 and 15360 with
//! SHA-512. aws-lc-rs takes RSA keys of 2048 to 8192 bits and generates only some sizes, so
//! RSA keys over 8192 bits (the 15360-bit row), and the generation of 7680- and 15360-bit
//! keys, go through RustCrypto's `rsa` crate (PSS with a salt as long as the hash, as
//! aws-lc-rs signs; the private key is zeroized on drop).
//!
//! Envelope (what the trusted store holds): `ISIG` (4 bytes), version 1 (u8), algorithm
//! (u8), signature length (u16 LE), the signature, then the anchor's bytes. The signed
//! message is `"intact signed anchor v1\0"` followed by the anchor's bytes.

use std::path::Path;
use std::sync::Arc;

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::error::Unspecified;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, KeyPair as _};

use crate::error::{Error, Result, Subject};
use crate::store::{LocalStateDir, SeenRoot, TrustedLock, TrustedStore, UntrustedStore};

const MAGIC: &[u8; 4] = b"ISIG";
const VERSION: u8 = 1;
const CONTEXT: &[u8] = b"intact signed anchor v1\0";
/// First line of a public key file.
const PUB_HEADER: &str = "intact-verify-key v1";

/// A signature algorithm (its byte in the envelope).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SigAlg {
    /// Ed25519 (the default).
    Ed25519 = 1,
    /// ECDSA on P-256 with SHA-256 (128-bit strength).
    EcdsaP256 = 2,
    /// ECDSA on P-384 with SHA-384 (192-bit strength).
    EcdsaP384 = 3,
    /// ECDSA on P-521 with SHA-512 (256-bit strength).
    EcdsaP521 = 4,
    /// RSA-PSS with SHA-256 (keys under 7680 bits: 3072 is the 128-bit strength).
    RsaPssSha256 = 5,
    /// RSA-PSS with SHA-384 (keys of 7680 to 15359 bits: the 192-bit strength).
    RsaPssSha384 = 6,
    /// RSA-PSS with SHA-512 (keys of 15360 bits or more: the 256-bit strength).
    RsaPssSha512 = 7,
}

impl SigAlg {
    const ALL: [SigAlg; 7] = [
        SigAlg::Ed25519,
        SigAlg::EcdsaP256,
        SigAlg::EcdsaP384,
        SigAlg::EcdsaP521,
        SigAlg::RsaPssSha256,
        SigAlg::RsaPssSha384,
        SigAlg::RsaPssSha512,
    ];

    /// Its name in key files and messages.
    pub fn name(self) -> &'static str {
        match self {
            SigAlg::Ed25519 => "ed25519",
            SigAlg::EcdsaP256 => "ecdsa-p256",
            SigAlg::EcdsaP384 => "ecdsa-p384",
            SigAlg::EcdsaP521 => "ecdsa-p521",
            SigAlg::RsaPssSha256 => "rsa-pss-sha256",
            SigAlg::RsaPssSha384 => "rsa-pss-sha384",
            SigAlg::RsaPssSha512 => "rsa-pss-sha512",
        }
    }

    fn from_name(s: &str) -> Option<SigAlg> {
        SigAlg::ALL.into_iter().find(|a| a.name() == s)
    }

    fn from_byte(b: u8) -> Option<SigAlg> {
        SigAlg::ALL.into_iter().find(|a| *a as u8 == b)
    }

    fn verification(self) -> &'static dyn signature::VerificationAlgorithm {
        match self {
            SigAlg::Ed25519 => &signature::ED25519,
            SigAlg::EcdsaP256 => &signature::ECDSA_P256_SHA256_ASN1,
            SigAlg::EcdsaP384 => &signature::ECDSA_P384_SHA384_ASN1,
            SigAlg::EcdsaP521 => &signature::ECDSA_P521_SHA512_ASN1,
            SigAlg::RsaPssSha256 => &signature::RSA_PSS_2048_8192_SHA256,
            SigAlg::RsaPssSha384 => &signature::RSA_PSS_2048_8192_SHA384,
            SigAlg::RsaPssSha512 => &signature::RSA_PSS_2048_8192_SHA512,
        }
    }

    /// The RSA-PSS algorithm for a key of `bits`: the hash of its security strength
    /// (Contiu et al.'s Table 1: 3072 bits ~ 128, 7680 ~ 192, 15360 ~ 256).
    fn rsa_for(bits: usize) -> SigAlg {
        match bits {
            ..7680 => SigAlg::RsaPssSha256,
            7680..15360 => SigAlg::RsaPssSha384,
            _ => SigAlg::RsaPssSha512,
        }
    }
}

/// RSA keys over this many bits go through the `rsa` crate (aws-lc-rs's largest).
const AWS_LC_RSA_MAX_BITS: usize = 8192;
/// The largest RSA key accepted.
const RSA_MAX_BITS: usize = 16384;

/// RSA-PSS through RustCrypto's `rsa` crate, for keys over 8192 bits.
mod big_rsa {
    use super::SigAlg;
    use rsa::pkcs1::EncodeRsaPublicKey;
    use rsa::signature::{RandomizedSigner, SignatureEncoding, Verifier};
    use rsa::{pss, BigUint, RsaPrivateKey, RsaPublicKey};

    /// A new key of `bits`, as PKCS#8 DER.
    pub fn generate(bits: usize) -> Option<Vec<u8>> {
        use rsa::pkcs8::EncodePrivateKey;
        let k = RsaPrivateKey::new(&mut rand::rngs::OsRng, bits).ok()?;
        Some(k.to_pkcs8_der().ok()?.as_bytes().to_vec())
    }

    /// The private key in PKCS#8 or PKCS#1 DER `der` (`openssl genpkey -outform DER`
    /// writes PKCS#1), its public key's DER `RSAPublicKey` and its size in bits.
    pub fn from_der(der: &[u8]) -> Option<(RsaPrivateKey, Vec<u8>, usize)> {
        use rsa::pkcs1::DecodeRsaPrivateKey;
        use rsa::pkcs8::DecodePrivateKey;
        use rsa::traits::PublicKeyParts;
        let k = RsaPrivateKey::from_pkcs8_der(der)
            .ok()
            .or_else(|| RsaPrivateKey::from_pkcs1_der(der).ok())?;
        let bits = k.n().bits();
        if !accepted(bits) {
            return None;
        }
        let public = k.to_public_key().to_pkcs1_der().ok()?.as_bytes().to_vec();
        Some((k, public, bits))
    }

    /// Whether an RSA key of `bits` is taken: 2048 to [`super::RSA_MAX_BITS`].
    pub fn accepted(bits: usize) -> bool {
        (2048..=super::RSA_MAX_BITS).contains(&bits)
    }

    /// The modulus's size in bits of the DER `RSAPublicKey` `der`.
    pub fn public_bits(der: &[u8]) -> Option<usize> {
        public(der).map(|k| rsa::traits::PublicKeyParts::n(&k).bits())
    }

    fn public(der: &[u8]) -> Option<RsaPublicKey> {
        let k = rsa::pkcs1::RsaPublicKey::try_from(der).ok()?;
        RsaPublicKey::new_with_max_size(
            BigUint::from_bytes_be(k.modulus.as_bytes()),
            BigUint::from_bytes_be(k.public_exponent.as_bytes()),
            super::RSA_MAX_BITS,
        )
        .ok()
    }

    /// The PSS signature of `msg` under `key` with `alg`'s hash.
    pub fn sign(key: &RsaPrivateKey, alg: SigAlg, msg: &[u8]) -> Vec<u8> {
        let rng = &mut rand::rngs::OsRng;
        let k = key.clone();
        match alg {
            SigAlg::RsaPssSha256 => pss::BlindedSigningKey::<sha2::Sha256>::new(k)
                .sign_with_rng(rng, msg)
                .to_vec(),
            SigAlg::RsaPssSha384 => pss::BlindedSigningKey::<sha2::Sha384>::new(k)
                .sign_with_rng(rng, msg)
                .to_vec(),
            _ => pss::BlindedSigningKey::<sha2::Sha512>::new(k)
                .sign_with_rng(rng, msg)
                .to_vec(),
        }
    }

    /// Whether `sig` is `alg`'s PSS signature of `msg` under the DER `RSAPublicKey` `der`.
    pub fn verify(der: &[u8], alg: SigAlg, msg: &[u8], sig: &[u8]) -> bool {
        let (Some(k), Ok(sig)) = (public(der), pss::Signature::try_from(sig)) else {
            return false;
        };
        match alg {
            SigAlg::RsaPssSha256 => pss::VerifyingKey::<sha2::Sha256>::new(k).verify(msg, &sig),
            SigAlg::RsaPssSha384 => pss::VerifyingKey::<sha2::Sha384>::new(k).verify(msg, &sig),
            SigAlg::RsaPssSha512 => pss::VerifyingKey::<sha2::Sha512>::new(k).verify(msg, &sig),
            _ => return false,
        }
        .is_ok()
    }
}

/// What `intact keygen --alg` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// Ed25519.
    Ed25519,
    /// ECDSA P-256.
    EcdsaP256,
    /// ECDSA P-384.
    EcdsaP384,
    /// ECDSA P-521.
    EcdsaP521,
    /// RSA-PSS, 3072 bits.
    RsaPss3072,
    /// RSA-PSS, 7680 bits (generated by the `rsa` crate: tens of seconds).
    RsaPss7680,
    /// RSA-PSS, 15360 bits (generated by the `rsa` crate: minutes).
    RsaPss15360,
}

impl KeyKind {
    /// Parses `ed25519`, `ecdsa-p256`, `ecdsa-p384`, `ecdsa-p521`, `rsa-pss-3072`,
    /// `rsa-pss-7680` or `rsa-pss-15360`.
    pub fn parse(s: &str) -> Result<KeyKind> {
        Ok(match s {
            "ed25519" => KeyKind::Ed25519,
            "ecdsa-p256" => KeyKind::EcdsaP256,
            "ecdsa-p384" => KeyKind::EcdsaP384,
            "ecdsa-p521" => KeyKind::EcdsaP521,
            "rsa-pss-3072" => KeyKind::RsaPss3072,
            "rsa-pss-7680" => KeyKind::RsaPss7680,
            "rsa-pss-15360" => KeyKind::RsaPss15360,
            _ => {
                return Err(Error::Invalid(format!(
                    "unknown key algorithm {s:?}: ed25519, ecdsa-p256, ecdsa-p384, ecdsa-p521, \
                     rsa-pss-3072, rsa-pss-7680 or rsa-pss-15360 (an RSA key of 2048 to \
                     16384 bits made elsewhere, e.g. by `openssl genpkey`, is accepted as a \
                     PKCS#8 file)"
                )))
            }
        })
    }
}

impl KeyKind {
    /// The size of an RSA kind's keys.
    pub fn rsa_bits(self) -> Option<usize> {
        match self {
            KeyKind::RsaPss3072 => Some(3072),
            KeyKind::RsaPss7680 => Some(7680),
            KeyKind::RsaPss15360 => Some(15360),
            _ => None,
        }
    }
}

fn bad_key(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("{}: {why}", path.display()))
}

/// The writer's private key.
pub struct Signer {
    alg: SigAlg,
    key: SignerKey,
    public: PublicKey,
}

enum SignerKey {
    Ed(signature::Ed25519KeyPair),
    Ec(signature::EcdsaKeyPair),
    Rsa(signature::RsaKeyPair),
    /// An RSA key over 8192 bits.
    BigRsa(Box<rsa::RsaPrivateKey>),
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({})", self.public)
    }
}

impl Signer {
    /// A new key of `kind`, as PKCS#8 DER.
    pub fn generate(kind: KeyKind) -> Result<Vec<u8>> {
        let rng = SystemRandom::new();
        let fail = |_| Error::Invalid("key generation failed".into());
        let ec = |alg| {
            signature::EcdsaKeyPair::generate_pkcs8(alg, &rng)
                .map(|d| d.as_ref().to_vec())
                .map_err(fail)
        };
        match kind {
            KeyKind::Ed25519 => signature::Ed25519KeyPair::generate_pkcs8(&rng)
                .map(|d| d.as_ref().to_vec())
                .map_err(fail),
            KeyKind::EcdsaP256 => ec(&signature::ECDSA_P256_SHA256_ASN1_SIGNING),
            KeyKind::EcdsaP384 => ec(&signature::ECDSA_P384_SHA384_ASN1_SIGNING),
            KeyKind::EcdsaP521 => ec(&signature::ECDSA_P521_SHA512_ASN1_SIGNING),
            KeyKind::RsaPss3072 => {
                let k = signature::RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa3072)
                    .map_err(fail)?;
                let der: aws_lc_rs::encoding::Pkcs8V1Der = k.as_der().map_err(fail)?;
                Ok(der.as_ref().to_vec())
            }
            KeyKind::RsaPss7680 | KeyKind::RsaPss15360 => kind
                .rsa_bits()
                .and_then(big_rsa::generate)
                .ok_or(fail(Unspecified)),
        }
    }

    /// The key in PKCS#8 DER `der` (any of the algorithms; the curve or size tells which;
    /// an RSA key may be PKCS#1 DER too).
    pub fn from_pkcs8(der: &[u8]) -> Result<Signer> {
        let p = Path::new("the key");
        if let Ok(k) = signature::Ed25519KeyPair::from_pkcs8(der) {
            let public = PublicKey::new(SigAlg::Ed25519, k.public_key().as_ref().to_vec());
            return Ok(Signer {
                alg: SigAlg::Ed25519,
                key: SignerKey::Ed(k),
                public,
            });
        }
        for (alg, sa) in [
            (
                SigAlg::EcdsaP256,
                &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            ),
            (
                SigAlg::EcdsaP384,
                &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
            ),
            (
                SigAlg::EcdsaP521,
                &signature::ECDSA_P521_SHA512_ASN1_SIGNING,
            ),
        ] {
            if let Ok(k) = signature::EcdsaKeyPair::from_pkcs8(sa, der) {
                let public = PublicKey::new(alg, k.public_key().as_ref().to_vec());
                return Ok(Signer {
                    alg,
                    key: SignerKey::Ec(k),
                    public,
                });
            }
        }
        match signature::RsaKeyPair::from_pkcs8(der).or_else(|e| {
            // PKCS#1, as `openssl genpkey -outform DER` writes RSA keys.
            signature::RsaKeyPair::from_der(der).map_err(|_| e)
        }) {
            Ok(k) => {
                let alg = SigAlg::rsa_for(k.public_modulus_len() * 8);
                let public = PublicKey::new(alg, k.public_key().as_ref().to_vec());
                Ok(Signer {
                    alg,
                    key: SignerKey::Rsa(k),
                    public,
                })
            }
            Err(e) => match big_rsa::from_der(der) {
                Some((k, public, bits)) if bits > AWS_LC_RSA_MAX_BITS => {
                    let alg = SigAlg::rsa_for(bits);
                    Ok(Signer {
                        alg,
                        key: SignerKey::BigRsa(Box::new(k)),
                        public: PublicKey::new(alg, public),
                    })
                }
                _ => Err(bad_key(
                    p,
                    format!(
                        "not a PKCS#8 Ed25519, ECDSA (P-256, P-384, P-521) or RSA (2048 to \
                         16384 bits; PKCS#1 too) private key ({e})"
                    ),
                )),
            },
        }
    }

    /// The key in the PKCS#8 DER file `path`.
    pub fn load(path: &Path) -> Result<Signer> {
        let der = std::fs::read(path).map_err(|e| Error::io(path.display().to_string(), e))?;
        Signer::from_pkcs8(&der).map_err(|e| match e {
            Error::Invalid(m) => bad_key(path, m.trim_start_matches("the key: ")),
            e => e,
        })
    }

    /// The key as PKCS#8 DER (what `keygen` writes), whatever form it was read from.
    pub fn to_pkcs8(&self) -> Result<Vec<u8>> {
        let fail = |_| Error::Invalid("encoding the key as PKCS#8 failed".into());
        match &self.key {
            SignerKey::Ed(k) => k.to_pkcs8().map(|d| d.as_ref().to_vec()).map_err(fail),
            SignerKey::Ec(k) => k.to_pkcs8v1().map(|d| d.as_ref().to_vec()).map_err(fail),
            SignerKey::Rsa(k) => {
                let der: aws_lc_rs::encoding::Pkcs8V1Der = k.as_der().map_err(fail)?;
                Ok(der.as_ref().to_vec())
            }
            SignerKey::BigRsa(k) => rsa::pkcs8::EncodePrivateKey::to_pkcs8_der(k.as_ref())
                .map(|d| d.as_bytes().to_vec())
                .map_err(|_| fail(Unspecified)),
        }
    }

    /// Its public half.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The envelope of `anchor`: signed.
    pub fn seal(&self, anchor: &[u8]) -> Result<Vec<u8>> {
        let mut msg = Vec::with_capacity(CONTEXT.len() + anchor.len());
        msg.extend_from_slice(CONTEXT);
        msg.extend_from_slice(anchor);
        let rng = SystemRandom::new();
        let fail = |_| Error::Invalid("signing the anchor failed".into());
        let sig = match &self.key {
            SignerKey::Ed(k) => k.sign(&msg).as_ref().to_vec(),
            SignerKey::Ec(k) => k.sign(&rng, &msg).map_err(fail)?.as_ref().to_vec(),
            SignerKey::Rsa(k) => {
                let enc: &'static dyn signature::RsaEncoding = match self.alg {
                    SigAlg::RsaPssSha384 => &signature::RSA_PSS_SHA384,
                    _ => &signature::RSA_PSS_SHA256,
                };
                let mut sig = vec![0u8; k.public_modulus_len()];
                k.sign(enc, &rng, &msg, &mut sig).map_err(fail)?;
                sig
            }
            SignerKey::BigRsa(k) => big_rsa::sign(k, self.alg, &msg),
        };
        let mut out = Vec::with_capacity(8 + sig.len() + anchor.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.alg as u8);
        out.extend_from_slice(&(sig.len() as u16).to_le_bytes());
        out.extend_from_slice(&sig);
        out.extend_from_slice(anchor);
        Ok(out)
    }
}

/// A verification key: the algorithm and the public key's bytes (Ed25519: 32 bytes; ECDSA:
/// the uncompressed point; RSA: the DER `RSAPublicKey`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    alg: SigAlg,
    bytes: Vec<u8>,
}

impl std::fmt::Display for PublicKey {
    /// The algorithm and the key's fingerprint (the first 8 bytes of its BLAKE3, in hex).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} key {}", self.alg.name(), self.fingerprint())
    }
}

impl PublicKey {
    fn new(alg: SigAlg, bytes: Vec<u8>) -> PublicKey {
        PublicKey { alg, bytes }
    }

    /// Its algorithm.
    pub fn alg(&self) -> SigAlg {
        self.alg
    }

    /// The first 8 bytes of the key's BLAKE3, in hex.
    pub fn fingerprint(&self) -> String {
        hex::encode(&blake3::hash(&self.bytes).as_bytes()[..8])
    }

    /// The public key file's text: `intact-verify-key v1`, then `ALG HEX` on a second line.
    pub fn to_text(&self) -> String {
        format!(
            "{PUB_HEADER}\n{} {}\n",
            self.alg.name(),
            hex::encode(&self.bytes)
        )
    }

    /// Parses [`PublicKey::to_text`]'s format.
    pub fn from_text(text: &str) -> Result<PublicKey> {
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let bad = |why: &str| Error::Invalid(format!("not an intact verification key: {why}"));
        if lines.next() != Some(PUB_HEADER) {
            return Err(bad(&format!("the first line is not {PUB_HEADER:?}")));
        }
        let (alg, hex_key) = lines
            .next()
            .and_then(|l| l.split_once(' '))
            .ok_or_else(|| bad("no `ALG HEX` line"))?;
        let alg =
            SigAlg::from_name(alg).ok_or_else(|| bad(&format!("unknown algorithm {alg:?}")))?;
        let bytes = hex::decode(hex_key.trim()).map_err(|_| bad("the key is not hex"))?;
        Ok(PublicKey { alg, bytes })
    }

    /// The key in the file `path`.
    pub fn load(path: &Path) -> Result<PublicKey> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path.display().to_string(), e))?;
        let text = String::from_utf8(bytes).map_err(|_| {
            bad_key(
                path,
                "not an intact verification key: not text (a private key? give the .pub file)",
            )
        })?;
        PublicKey::from_text(&text).map_err(|e| bad_key(path, e))
    }

    /// The anchor inside `envelope` if it is signed by this key; an integrity error
    /// otherwise (an unsigned anchor, another key's or algorithm's signature, damage).
    pub fn open<'a>(&self, envelope: &'a [u8]) -> Result<&'a [u8]> {
        let fail = |what: String| Error::tampered(Subject::Anchor, None, what);
        let (alg, sig, anchor) = split(envelope).ok_or_else(|| {
            fail("the anchor is not signed (a reader accepts only signed roots)".into())
        })?;
        if alg != Some(self.alg) {
            return Err(fail(format!(
                "the anchor is signed with {}, not with the given {}",
                alg.map_or("an unknown algorithm", SigAlg::name),
                self
            )));
        }
        let mut msg = Vec::with_capacity(CONTEXT.len() + anchor.len());
        msg.extend_from_slice(CONTEXT);
        msg.extend_from_slice(anchor);
        let big = matches!(
            self.alg,
            SigAlg::RsaPssSha256 | SigAlg::RsaPssSha384 | SigAlg::RsaPssSha512
        ) && big_rsa::public_bits(&self.bytes).is_some_and(|b| b > AWS_LC_RSA_MAX_BITS);
        let ok = if big {
            big_rsa::verify(&self.bytes, self.alg, &msg, sig)
        } else {
            signature::UnparsedPublicKey::new(self.alg.verification(), &self.bytes)
                .verify(&msg, sig)
                .is_ok()
        };
        if !ok {
            return Err(fail(format!(
                "the anchor's signature does not verify under the given {self}"
            )));
        }
        Ok(anchor)
    }
}

/// The algorithm, signature and anchor of an envelope (`None`: not an envelope).
fn split(b: &[u8]) -> Option<(Option<SigAlg>, &[u8], &[u8])> {
    if b.len() < 8 || &b[..4] != MAGIC || b[4] != VERSION {
        return None;
    }
    let n = u16::from_le_bytes([b[6], b[7]]) as usize;
    let sig = b.get(8..8 + n)?;
    Some((SigAlg::from_byte(b[5]), sig, &b[8 + n..]))
}

/// The object of the untrusted store where a signing writer publishes each signed root it
/// stores, for readers who cannot reach the trusted anchor (docs/file-format.md §1.1).
pub const PUBLISHED_NAME: &str = "anchor.signed";

/// A trusted store whose anchors are signed ([`Signer`]) and, for a reader, checked
/// ([`PublicKey`]): the writer's store signs what it stores; a reader's refuses every
/// anchor not signed by its key. Either may be absent: a writer without a key stores
/// plain anchors and reads signed ones as plain.
///
/// With [`SignedAnchor::published_in`], a writer also publishes each signed root in the
/// untrusted store ([`PUBLISHED_NAME`]), and a reader who cannot reach the trusted anchor
/// (etcd down, or a machine whose state directory holds none) reads it from there. With
/// [`SignedAnchor::remembering_in`], a reader keeps the newest root it accepted in its
/// state directory and refuses an older one, or another one of the same epoch: the
/// freshness a reader has without the trusted anchor (docs/design.md, "Signed roots").
pub struct SignedAnchor {
    inner: Box<dyn TrustedStore>,
    signer: Option<Arc<Signer>>,
    verify: Option<PublicKey>,
    published: Option<Arc<dyn UntrustedStore>>,
    seen: Option<LocalStateDir>,
    /// Where the last root a reader accepted came from, for [`TrustedStore::location`].
    source: std::sync::Mutex<Option<Source>>,
}

/// Where a reader found the root it accepted.
#[derive(Debug, Clone)]
enum Source {
    /// The trusted anchor (fresh: the newest root sealed).
    Trusted,
    /// The root published in the untrusted store: no older than the newest seen here.
    Published {
        /// Why not the trusted anchor.
        why: String,
        epoch: u64,
    },
}

impl SignedAnchor {
    /// `inner`, signing with `signer` and accepting only what `verify` signed.
    pub fn new(
        inner: Box<dyn TrustedStore>,
        signer: Option<Arc<Signer>>,
        verify: Option<PublicKey>,
    ) -> SignedAnchor {
        SignedAnchor {
            inner,
            signer,
            verify,
            published: None,
            seen: None,
            source: std::sync::Mutex::new(None),
        }
    }

    /// Publishes every signed root in `store` as well (a writer with a key), and reads it
    /// from there when the trusted anchor cannot be reached or this machine has none (a
    /// reader with a key).
    pub fn published_in(mut self, store: Arc<dyn UntrustedStore>) -> SignedAnchor {
        self.published = Some(store);
        self
    }

    /// Keeps the newest root a reader accepts in `state` ([`LocalStateDir::seen_root`]),
    /// and refuses one that is older or forks it. Its lock also stands in for the trusted
    /// anchor's when a reader falls back to the published root.
    pub fn remembering_in(mut self, state: LocalStateDir) -> SignedAnchor {
        self.seen = Some(state);
        self
    }

    /// Whether a failure of the trusted anchor lets a reader fall back to the published
    /// root: a reader with a key, a store to read it from, and an anchor that cannot be
    /// reached (an I/O error: etcd down, a timeout).
    fn falls_back(&self, e: &Error) -> bool {
        self.verify.is_some() && self.published.is_some() && matches!(e, Error::Io { .. })
    }

    /// The signed root published in the store, with why it is read instead of the trusted
    /// anchor.
    fn published_root(&self, why: String) -> Result<Option<(Vec<u8>, Source)>> {
        let Some(store) = &self.published else {
            return Ok(None);
        };
        Ok(store
            .read_all(PUBLISHED_NAME)?
            .map(|b| (b, Source::Published { why, epoch: 0 })))
    }

    /// Refuses `anchor` if it is older than the newest root seen here, or another root of
    /// the same epoch; records it when it is newer.
    fn check_seen(&self, anchor: &[u8]) -> Result<()> {
        let Some(state) = &self.seen else {
            return Ok(());
        };
        let fail = |what: String| Err(Error::tampered(Subject::Anchor, None, what));
        let Some(root) = SeenRoot::of(anchor) else {
            return fail("the signed anchor is too short to hold an epoch".into());
        };
        match state.seen_root()? {
            Some(s) if root.epoch < s.epoch => fail(format!(
                "the signed root is of epoch {}, older than epoch {} which this machine has \
                 already read (a replayed root or a rolled-back store; recorded in {})",
                root.epoch,
                s.epoch,
                state.seen_root_path().display()
            )),
            Some(s) if root.epoch == s.epoch && root.digest != s.digest => fail(format!(
                "two different roots are signed for epoch {}: the volume was forked",
                root.epoch
            )),
            Some(s) if root.epoch == s.epoch => Ok(()),
            _ => state.set_seen_root(&root),
        }
    }
}

impl TrustedStore for SignedAnchor {
    fn signed_roots_only(&self) -> bool {
        self.verify.is_some()
    }

    fn load(&self) -> Result<Option<Vec<u8>>> {
        let Some(k) = &self.verify else {
            return Ok(self.inner.load()?.map(|b| match split(&b) {
                Some((_, _, anchor)) => anchor.to_vec(),
                None => b,
            }));
        };
        let (envelope, mut source) = match self.inner.load() {
            Ok(Some(b)) => (b, Source::Trusted),
            Ok(None) => {
                let why = format!("{} holds no anchor", self.inner.location());
                match self.published_root(why)? {
                    Some(found) => found,
                    None => return Ok(None),
                }
            }
            Err(e) if self.falls_back(&e) => match self.published_root(e.to_string())? {
                Some(found) => found,
                None => return Err(e),
            },
            Err(e) => return Err(e),
        };
        let anchor = k.open(&envelope)?.to_vec();
        self.check_seen(&anchor)?;
        if let Source::Published { epoch, .. } = &mut source {
            *epoch = SeenRoot::of(&anchor).map_or(0, |r| r.epoch);
        }
        *self.source.lock().unwrap_or_else(|p| p.into_inner()) = Some(source);
        Ok(Some(anchor))
    }

    fn store(&self, bytes: &[u8]) -> Result<()> {
        let Some(s) = &self.signer else {
            return self.inner.store(bytes);
        };
        let envelope = s.seal(bytes)?;
        self.inner.store(&envelope)?;
        if let Some(store) = &self.published {
            // The seal is done once the trusted anchor holds it; a published copy that
            // lags only makes readers without the trusted anchor see an older root.
            if let Err(e) = store.replace(PUBLISHED_NAME, &envelope) {
                tracing::warn!(error = %e, "cannot publish the signed root in the store");
            }
        }
        Ok(())
    }

    fn lock(&self, exclusive: bool) -> Result<TrustedLock> {
        match self.inner.lock(exclusive) {
            Err(e) if !exclusive && self.falls_back(&e) => match &self.seen {
                Some(state) => state.lock(false),
                None => Err(e),
            },
            r => r,
        }
    }

    fn location(&self) -> String {
        let source = self
            .source
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut s = match &source {
            Some(Source::Published { .. }) => format!("{PUBLISHED_NAME} in the store"),
            _ => self.inner.location(),
        };
        if let Some(k) = &self.verify {
            s.push_str(&format!(" (roots checked against the {k}"));
            match source {
                Some(Source::Trusted) => {
                    s.push_str("; fresh: the newest root, read from the trusted anchor)")
                }
                Some(Source::Published { why, epoch }) => s.push_str(&format!(
                    "; freshness: epoch {epoch}, no older than the newest this machine has \
                     seen, since the trusted anchor was not read: {why})"
                )),
                None => s.push(')'),
            }
        } else if let Some(k) = &self.signer {
            s.push_str(&format!(" (roots signed with the {})", k.public()));
        }
        s
    }

    fn remove(&self) -> Result<()> {
        self.inner.remove()
    }

    fn modified(&self) -> Option<std::time::SystemTime> {
        self.inner.modified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemTrusted;

    const KINDS: [KeyKind; 5] = [
        KeyKind::Ed25519,
        KeyKind::EcdsaP256,
        KeyKind::EcdsaP384,
        KeyKind::EcdsaP521,
        KeyKind::RsaPss3072,
    ];

    fn signer(kind: KeyKind) -> Signer {
        Signer::from_pkcs8(&Signer::generate(kind).unwrap()).unwrap()
    }

    /// A reader with the public key takes only what the signed root covers: requests the
    /// writer logged after its last seal (the log's tail, authenticated by the volume's key
    /// alone, which every password holder has) are not replayed for it, where a reader
    /// without the key replays them as any reopen does.
    #[test]
    fn a_reader_with_the_public_key_reads_only_what_the_signed_root_covers() {
        let store = Arc::new(crate::store::MemStore::new());
        let mem = MemTrusted::new();
        let s = Arc::new(signer(KeyKind::Ed25519));
        let t = SignedAnchor::new(Box::new(mem.clone()), Some(s.clone()), None);
        let w = crate::Volume::create(
            store.clone(),
            move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
            b"pw",
            &crate::CreateOptions {
                kdf: crate::crypto::KdfParams::TEST,
                ..Default::default()
            },
            &crate::Options::default(),
        )
        .unwrap();
        w.create_file("/sealed", None).unwrap();
        w.write_path("/sealed", 0, b"signed").unwrap();
        w.sync().unwrap();
        w.create_file("/tail", None).unwrap();
        w.write_path("/tail", 0, b"logged, never sealed").unwrap();
        // The writer ends before it seals again: its log's tail is in the store.
        w.set_seal_on_drop(false);
        drop(w);
        let ro = crate::Options {
            read_only: true,
            ..Default::default()
        };
        let open = |verify: Option<PublicKey>| {
            let t = SignedAnchor::new(Box::new(mem.clone()), None, verify);
            crate::Volume::open(store.clone(), Box::new(t), b"pw", &ro).unwrap()
        };
        let reader = open(Some(s.public().clone()));
        let mut buf = [0u8; 16];
        assert_eq!(reader.read_path("/sealed", 0, &mut buf).unwrap(), 6);
        assert!(
            reader.stat("/tail").is_err(),
            "the unsigned tail was replayed"
        );
        drop(reader);
        let plain = open(None);
        assert_eq!(plain.read_path("/tail", 0, &mut buf).unwrap(), 16);
    }

    #[test]
    fn each_algorithm_signs_and_only_its_key_verifies() {
        let anchor = b"INTANCH2 an anchor's bytes".to_vec();
        let signers: Vec<Signer> = KINDS.iter().map(|&k| signer(k)).collect();
        for (i, s) in signers.iter().enumerate() {
            let env = s.seal(&anchor).unwrap();
            let pk = PublicKey::from_text(&s.public().to_text()).unwrap();
            assert_eq!(&pk, s.public());
            assert_eq!(pk.open(&env).unwrap(), &anchor[..], "{}", pk);
            for (j, other) in signers.iter().enumerate() {
                if i != j {
                    let e = other.public().open(&env).unwrap_err();
                    assert!(e.is_tampered(), "{e}");
                }
            }
            // Another key of the same algorithm.
            let e = signer(KINDS[i]).public().open(&env).unwrap_err();
            assert!(e.to_string().contains("does not verify"), "{e}");
        }
        assert_eq!(signers[0].public().alg(), SigAlg::Ed25519);
        assert_eq!(signers[4].public().alg(), SigAlg::RsaPssSha256);
    }

    #[test]
    fn a_changed_byte_a_cut_or_no_signature_is_refused_never_a_panic() {
        let s = signer(KeyKind::Ed25519);
        let anchor = vec![7u8; 402];
        let env = s.seal(&anchor).unwrap();
        for i in [0, 4, 5, 6, 8, 40, env.len() - 1] {
            let mut bad = env.clone();
            bad[i] ^= 1;
            assert!(s.public().open(&bad).is_err(), "byte {i}");
        }
        for n in 0..env.len() {
            assert!(s.public().open(&env[..n]).is_err(), "cut at {n}");
        }
        let e = s.public().open(&anchor).unwrap_err();
        assert!(e.to_string().contains("not signed"), "{e}");
        // The shortest envelope: no signature, no anchor.
        let empty: &[u8] = b"ISIG\x01\x01\x00\x00";
        assert_eq!(
            split(empty),
            Some((Some(SigAlg::Ed25519), &[][..], &[][..]))
        );
        assert_eq!(split(&empty[..7]), None);
    }

    #[test]
    fn the_envelope_has_its_documented_layout() {
        let s = signer(KeyKind::Ed25519);
        let env = s.seal(b"abc").unwrap();
        assert_eq!(&env[..4], b"ISIG");
        assert_eq!(env[4], 1);
        assert_eq!(env[5], 1, "ed25519");
        assert_eq!(u16::from_le_bytes([env[6], env[7]]), 64);
        assert_eq!(&env[8 + 64..], b"abc");
        assert_eq!(env.len(), 8 + 64 + 3);
    }

    #[test]
    fn the_store_signs_for_a_writer_and_checks_for_a_reader() {
        let mem = MemTrusted::new();
        let s = Arc::new(signer(KeyKind::EcdsaP256));
        let writer = SignedAnchor::new(Box::new(mem.clone()), Some(s.clone()), None);
        writer.store(b"epoch 1").unwrap();
        assert_eq!(&mem.snapshot().unwrap()[..4], b"ISIG");
        assert_eq!(writer.load().unwrap().unwrap(), b"epoch 1");
        let reader = SignedAnchor::new(Box::new(mem.clone()), None, Some(s.public().clone()));
        assert_eq!(reader.load().unwrap().unwrap(), b"epoch 1");
        assert!(reader.location().contains(&s.public().fingerprint()));
        // A holder of the password without the key stores a plain anchor: refused.
        let plain = SignedAnchor::new(Box::new(mem.clone()), None, None);
        plain.store(b"forged epoch 9").unwrap();
        assert!(reader.load().unwrap_err().is_tampered());
        // As is one signed by another key.
        let other = SignedAnchor::new(
            Box::new(mem.clone()),
            Some(Arc::new(signer(KeyKind::EcdsaP256))),
            None,
        );
        other.store(b"forged epoch 9").unwrap();
        assert!(reader.load().unwrap_err().is_tampered());
        writer.remove().unwrap();
        assert!(mem.snapshot().is_none());
        assert!(reader.load().unwrap().is_none());
        // The wrapped store's own answers go through.
        let dir = tempfile::tempdir().unwrap();
        let local = crate::store::LocalStateDir::new(dir.path().to_path_buf(), "ab").unwrap();
        let w = SignedAnchor::new(Box::new(local.clone()), Some(s.clone()), None);
        assert!(w.modified().is_none());
        w.store(b"epoch 1").unwrap();
        assert!(w.modified().is_some());
        assert!(w.location().starts_with(&local.location()));
        let _held = w.lock(true).unwrap();
        assert!(
            local.lock(false).is_err(),
            "the lock is the wrapped store's"
        );
    }

    /// Anchor bytes of `epoch` (bytes 24..32, as in file-format.md §3), told apart by `tag`.
    fn root(epoch: u64, tag: u8) -> Vec<u8> {
        let mut b = b"INTANCH2".to_vec();
        b.extend_from_slice(&[tag; 16]);
        b.extend_from_slice(&epoch.to_le_bytes());
        b.extend_from_slice(&[tag; 8]);
        b
    }

    /// A trusted anchor that fails every call with `err`.
    struct Failing(fn() -> Error);

    impl TrustedStore for Failing {
        fn load(&self) -> Result<Option<Vec<u8>>> {
            Err((self.0)())
        }
        fn store(&self, _: &[u8]) -> Result<()> {
            Err((self.0)())
        }
        fn lock(&self, _: bool) -> Result<TrustedLock> {
            Err((self.0)())
        }
        fn location(&self) -> String {
            "etcd://down/v".into()
        }
        fn remove(&self) -> Result<()> {
            Err((self.0)())
        }
    }

    fn down() -> Error {
        Error::io("etcd://down/v", std::io::Error::other("no answer"))
    }

    /// A writer, the store it publishes in, and a reader of another machine (empty state
    /// directory, so no trusted anchor of its own) that keeps what it saw in `dir`.
    fn writer_and_remote_reader(
        dir: &Path,
    ) -> (SignedAnchor, Arc<crate::store::MemStore>, SignedAnchor) {
        let s = Arc::new(signer(KeyKind::Ed25519));
        let store = Arc::new(crate::store::MemStore::new());
        let writer = SignedAnchor::new(Box::new(MemTrusted::new()), Some(s.clone()), None)
            .published_in(store.clone());
        let state = LocalStateDir::new(dir.to_path_buf(), "ab").unwrap();
        let reader = SignedAnchor::new(Box::new(state.clone()), None, Some(s.public().clone()))
            .published_in(store.clone())
            .remembering_in(state);
        (writer, store, reader)
    }

    #[test]
    fn a_reader_without_the_trusted_anchor_reads_the_published_root_never_an_older_one() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, store, reader) = writer_and_remote_reader(dir.path());
        assert!(reader.load().unwrap().is_none(), "nothing published yet");
        writer.store(&root(3, 1)).unwrap();
        assert_eq!(
            &store.read_all(PUBLISHED_NAME).unwrap().unwrap()[..4],
            b"ISIG"
        );
        let old = store.read_all(PUBLISHED_NAME).unwrap().unwrap();
        assert_eq!(reader.load().unwrap().unwrap(), root(3, 1));
        let loc = reader.location();
        assert!(
            loc.contains("anchor.signed in the store") && loc.contains("freshness: epoch 3"),
            "{loc}"
        );
        assert!(loc.contains("holds no anchor"), "{loc}");
        // Read again: the same root is accepted.
        assert_eq!(reader.load().unwrap().unwrap(), root(3, 1));
        writer.store(&root(4, 1)).unwrap();
        assert_eq!(reader.load().unwrap().unwrap(), root(4, 1));
        // The store rolled back to the root of epoch 3: refused, it has seen 4.
        store.replace(PUBLISHED_NAME, &old).unwrap();
        let e = reader.load().unwrap_err();
        assert!(e.is_tampered(), "{e}");
        assert!(e.to_string().contains("older than epoch 4"), "{e}");
        // Another root signed for epoch 4: a fork.
        writer.store(&root(4, 2)).unwrap();
        let e = reader.load().unwrap_err();
        assert!(e.to_string().contains("two different roots"), "{e}");
        // A newer one is accepted and remembered, in the state directory.
        writer.store(&root(5, 1)).unwrap();
        assert_eq!(reader.load().unwrap().unwrap(), root(5, 1));
        let state = LocalStateDir::new(dir.path().to_path_buf(), "ab").unwrap();
        assert_eq!(state.seen_root().unwrap().unwrap().epoch, 5);
        // Another key's root, or an unsigned one, is refused as before.
        let other = SignedAnchor::new(
            Box::new(MemTrusted::new()),
            Some(Arc::new(signer(KeyKind::Ed25519))),
            None,
        )
        .published_in(store.clone());
        other.store(&root(9, 1)).unwrap();
        assert!(reader
            .load()
            .unwrap_err()
            .to_string()
            .contains("does not verify"));
        store.replace(PUBLISHED_NAME, &root(9, 1)).unwrap();
        assert!(reader
            .load()
            .unwrap_err()
            .to_string()
            .contains("not signed"));
        // A writer without a key publishes nothing.
        let plain =
            SignedAnchor::new(Box::new(MemTrusted::new()), None, None).published_in(store.clone());
        plain.store(&root(10, 1)).unwrap();
        assert_eq!(store.read_all(PUBLISHED_NAME).unwrap().unwrap(), root(9, 1));
    }

    #[test]
    fn the_trusted_anchor_comes_first_and_a_rollback_of_it_is_refused_too() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(signer(KeyKind::EcdsaP256));
        let (mem, store) = (MemTrusted::new(), Arc::new(crate::store::MemStore::new()));
        let writer = SignedAnchor::new(Box::new(mem.clone()), Some(s.clone()), None)
            .published_in(store.clone());
        let state = LocalStateDir::new(dir.path().to_path_buf(), "ab").unwrap();
        let reader = SignedAnchor::new(Box::new(mem.clone()), None, Some(s.public().clone()))
            .published_in(store.clone())
            .remembering_in(state);
        writer.store(&root(7, 1)).unwrap();
        let old = mem.snapshot();
        // The published copy is older than the trusted anchor: the trusted one is read.
        writer.store(&root(8, 1)).unwrap();
        store
            .replace(PUBLISHED_NAME, &s.seal(&root(1, 1)).unwrap())
            .unwrap();
        assert_eq!(reader.load().unwrap().unwrap(), root(8, 1));
        assert!(reader
            .location()
            .contains("fresh: the newest root, read from the trusted anchor"));
        // A trusted anchor put back to an older signed root (a compromised etcd).
        mem.restore(old);
        let e = reader.load().unwrap_err();
        assert!(e.to_string().contains("older than epoch 8"), "{e}");
    }

    #[test]
    fn a_reader_falls_back_only_when_the_trusted_anchor_cannot_be_reached() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(signer(KeyKind::Ed25519));
        let store = Arc::new(crate::store::MemStore::new());
        let writer = SignedAnchor::new(Box::new(MemTrusted::new()), Some(s.clone()), None)
            .published_in(store.clone());
        writer.store(&root(2, 1)).unwrap();
        let state = LocalStateDir::new(dir.path().to_path_buf(), "ab").unwrap();
        let reader = |fail: fn() -> Error| {
            SignedAnchor::new(Box::new(Failing(fail)), None, Some(s.public().clone()))
                .published_in(store.clone())
                .remembering_in(state.clone())
        };
        let r = reader(down);
        assert_eq!(r.load().unwrap().unwrap(), root(2, 1));
        assert!(r.location().contains("no answer"), "{}", r.location());
        let held = r
            .lock(false)
            .expect("a reader's lock falls back to the state directory's");
        assert!(!held.is_exclusive());
        assert!(state.lock(true).is_err(), "the local lock is held");
        drop(held);
        assert!(r.lock(true).is_err(), "a writer never falls back");
        // Other errors are not an unreachable anchor: they go through.
        let locked = reader(|| Error::Locked("a writer".into()));
        assert!(matches!(locked.load(), Err(Error::Locked(_))));
        assert!(matches!(locked.lock(false), Err(Error::Locked(_))));
        // Without the published root, the anchor's own error.
        let empty = SignedAnchor::new(Box::new(Failing(down)), None, Some(s.public().clone()))
            .published_in(Arc::new(crate::store::MemStore::new()));
        assert!(matches!(empty.load(), Err(Error::Io { .. })));
        // A writer does not read the published root instead of its anchor.
        let w = SignedAnchor::new(Box::new(Failing(down)), Some(s.clone()), None)
            .published_in(store.clone());
        assert!(w.load().is_err());
        assert!(
            w.store(&root(3, 1)).is_err(),
            "a seal needs the trusted anchor"
        );
        assert_eq!(
            s.public()
                .open(&store.read_all(PUBLISHED_NAME).unwrap().unwrap())
                .unwrap(),
            &root(2, 1)[..],
            "nothing is published for a seal that failed"
        );
    }

    #[test]
    fn the_seen_root_record_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalStateDir::new(dir.path().to_path_buf(), "ab").unwrap();
        assert_eq!(state.seen_root().unwrap(), None);
        let r = SeenRoot::of(&root(0x0102, 7)).unwrap();
        assert_eq!(r.epoch, 0x0102);
        state.set_seen_root(&r).unwrap();
        assert_eq!(state.seen_root().unwrap(), Some(r));
        let text = std::fs::read_to_string(state.seen_root_path()).unwrap();
        assert_eq!(
            text,
            format!(
                "intact-seen-root v1\n258 {}\n",
                hex::encode(blake3::hash(&root(0x0102, 7)).as_bytes())
            )
        );
        for bad in [
            "",
            "intact-seen-root v1\n",
            "intact-seen-root v1\n5 zz\n",
            "intact-seen-root v2\n5 00\n",
            &format!("{text}x\n"),
        ] {
            std::fs::write(state.seen_root_path(), bad).unwrap();
            assert!(
                matches!(state.seen_root(), Err(Error::AnchorCorrupt(_))),
                "{bad:?}"
            );
        }
        assert_eq!(SeenRoot::of(&[0u8; 31]), None);
    }

    #[test]
    fn every_keygen_name_parses_and_makes_its_algorithm() {
        for (name, kind, alg) in [
            ("ed25519", KeyKind::Ed25519, SigAlg::Ed25519),
            ("ecdsa-p256", KeyKind::EcdsaP256, SigAlg::EcdsaP256),
            ("ecdsa-p384", KeyKind::EcdsaP384, SigAlg::EcdsaP384),
            ("ecdsa-p521", KeyKind::EcdsaP521, SigAlg::EcdsaP521),
            ("rsa-pss-3072", KeyKind::RsaPss3072, SigAlg::RsaPssSha256),
        ] {
            assert_eq!(KeyKind::parse(name).unwrap(), kind);
            let s = signer(kind);
            assert_eq!(s.public().alg(), alg, "{name}");
            let fp = s.public().fingerprint();
            assert_eq!(fp.len(), 16, "{name}");
            assert!(fp.bytes().all(|b| b.is_ascii_hexdigit()), "{fp}");
            assert_ne!(
                fp,
                signer(kind).public().fingerprint(),
                "two keys, one fingerprint"
            );
            assert!(format!("{s:?}").contains(&fp), "{s:?}");
            assert!(s.public().to_string().starts_with(alg.name()));
            let again = Signer::from_pkcs8(&s.to_pkcs8().unwrap()).unwrap();
            assert_eq!(again.public(), s.public(), "{name}: PKCS#8 round trip");
        }
    }

    #[test]
    fn rsa_keys_of_7680_bits_or_more_sign_with_sha_384() {
        use aws_lc_rs::encoding::{AsDer, Pkcs8V1Der};
        use aws_lc_rs::rsa::KeySize;
        for (size, alg) in [
            (KeySize::Rsa4096, SigAlg::RsaPssSha256),
            (KeySize::Rsa8192, SigAlg::RsaPssSha384),
        ] {
            let k = signature::RsaKeyPair::generate(size).unwrap();
            let der: Pkcs8V1Der = k.as_der().unwrap();
            let s = Signer::from_pkcs8(der.as_ref()).unwrap();
            assert_eq!(s.public().alg(), alg);
            let env = s.seal(b"anchor").unwrap();
            assert_eq!(env[5], alg as u8);
            assert_eq!(s.public().open(&env).unwrap(), b"anchor");
            // The other hash under the same key does not verify.
            let other = PublicKey::new(
                if alg == SigAlg::RsaPssSha256 {
                    SigAlg::RsaPssSha384
                } else {
                    SigAlg::RsaPssSha256
                },
                s.public().bytes.clone(),
            );
            let mut env2 = env.clone();
            env2[5] = other.alg as u8;
            assert!(other.open(&env2).is_err());
        }
    }

    /// An RSA key of 15360 bits made by `openssl genpkey -outform DER` (PKCS#1) for these
    /// tests only (generating one takes minutes).
    const RSA_15360: &[u8] = include_bytes!("../testdata/rsa-15360-test-only.der");

    #[test]
    fn rsa_keys_over_8192_bits_sign_through_the_rsa_crate_with_sha_512() {
        let s = Signer::from_pkcs8(RSA_15360).unwrap();
        assert!(matches!(s.key, SignerKey::BigRsa(_)));
        assert_eq!(s.public().alg(), SigAlg::RsaPssSha512);
        assert_eq!(big_rsa::public_bits(&s.public().bytes), Some(15360));
        let env = s.seal(b"INTANCH2 anchor").unwrap();
        assert_eq!(env[5], SigAlg::RsaPssSha512 as u8);
        assert_eq!(u16::from_le_bytes([env[6], env[7]]), 1920);
        // Through the key file's text, as a reader has it.
        let pk = PublicKey::from_text(&s.public().to_text()).unwrap();
        assert!(pk.to_text().contains("rsa-pss-sha512"), "{}", pk.to_text());
        assert_eq!(pk.open(&env).unwrap(), b"INTANCH2 anchor");
        // Randomized: two envelopes of one anchor differ, both verify.
        let env2 = s.seal(b"INTANCH2 anchor").unwrap();
        assert_ne!(env, env2);
        assert!(pk.open(&env2).is_ok());
        // A changed byte of the signature or of the anchor, or another hash: refused.
        for i in [8, 8 + 1919, env.len() - 1] {
            let mut bad = env.clone();
            bad[i] ^= 1;
            assert!(pk.open(&bad).unwrap_err().is_tampered(), "byte {i}");
        }
        for alg in [SigAlg::RsaPssSha256, SigAlg::RsaPssSha384] {
            let other = PublicKey::new(alg, pk.bytes.clone());
            let mut e = env.clone();
            e[5] = alg as u8;
            assert!(other.open(&e).is_err(), "{alg:?}");
        }
        // Another key's signature.
        let small = signer(KeyKind::RsaPss3072);
        let mut e = small.seal(b"INTANCH2 anchor").unwrap();
        e[5] = SigAlg::RsaPssSha512 as u8;
        assert!(pk.open(&e).is_err());
        // As PKCS#8 too.
        let (k, _, _) = big_rsa::from_der(RSA_15360).unwrap();
        let p8 = rsa::pkcs8::EncodePrivateKey::to_pkcs8_der(&k).unwrap();
        let s8 = Signer::from_pkcs8(p8.as_bytes()).unwrap();
        assert_eq!(s8.public(), s.public());
        assert_eq!(
            s.to_pkcs8().unwrap(),
            p8.as_bytes(),
            "PKCS#1 in, PKCS#8 out"
        );
        // The rsa crate's keys are read back as PKCS#8 (what `keygen` writes).
        let der = big_rsa::generate(2048).unwrap();
        let k = Signer::from_pkcs8(&der).unwrap();
        assert_eq!(k.public().alg(), SigAlg::RsaPssSha256);
        assert!(k.public().open(&k.seal(b"a").unwrap()).is_ok());
        // A key of aws-lc-rs's sizes in PKCS#1 DER.
        let (k2, _, _) = big_rsa::from_der(&der).unwrap();
        let p1 = rsa::pkcs1::EncodeRsaPrivateKey::to_pkcs1_der(&k2).unwrap();
        let s1 = Signer::from_pkcs8(p1.as_bytes()).unwrap();
        assert!(matches!(s1.key, SignerKey::Rsa(_)));
        assert_eq!(s1.public(), k.public());
        // Too large a key is refused.
        assert!(big_rsa::public_bits(b"junk").is_none());
    }

    /// The `rsa` crate's PSS and aws-lc-rs's agree (a salt as long as the hash, MGF1 with
    /// the same hash), under each hash: each verifies what the other signs, and neither
    /// under another hash.
    #[test]
    fn the_rsa_crate_and_aws_lc_rs_make_the_same_pss_signatures() {
        let der = big_rsa::generate(2048).unwrap();
        let (k, public, bits) = big_rsa::from_der(&der).unwrap();
        assert_eq!(bits, 2048);
        let aws = signature::RsaKeyPair::from_pkcs8(&der).unwrap();
        let msg = b"intact signed anchor v1\0anchor";
        let rng = SystemRandom::new();
        for (alg, enc) in [
            (SigAlg::RsaPssSha256, &signature::RSA_PSS_SHA256),
            (SigAlg::RsaPssSha384, &signature::RSA_PSS_SHA384),
            (SigAlg::RsaPssSha512, &signature::RSA_PSS_SHA512),
        ] {
            let ours = big_rsa::sign(&k, alg, msg);
            signature::UnparsedPublicKey::new(alg.verification(), &public)
                .verify(msg, &ours)
                .unwrap_or_else(|_| panic!("{alg:?}: aws-lc-rs refuses the rsa crate's"));
            let mut theirs = vec![0u8; aws.public_modulus_len()];
            aws.sign(enc, &rng, msg, &mut theirs).unwrap();
            assert!(big_rsa::verify(&public, alg, msg, &theirs), "{alg:?}");
            assert!(
                !big_rsa::verify(&public, alg, b"another", &theirs),
                "{alg:?}"
            );
            for other in [
                SigAlg::RsaPssSha256,
                SigAlg::RsaPssSha384,
                SigAlg::RsaPssSha512,
            ] {
                if other != alg {
                    assert!(
                        !big_rsa::verify(&public, other, msg, &ours),
                        "{alg:?} as {other:?}"
                    );
                }
            }
            assert!(!big_rsa::verify(&public, SigAlg::Ed25519, msg, &ours));
        }
        for (bits, ok) in [
            (1024, false),
            (2047, false),
            (2048, true),
            (16384, true),
            (16385, false),
        ] {
            assert_eq!(big_rsa::accepted(bits), ok, "{bits}");
        }
    }

    #[test]
    fn each_rsa_size_has_its_strength() {
        for (bits, alg) in [
            (2048, SigAlg::RsaPssSha256),
            (3072, SigAlg::RsaPssSha256),
            (7679, SigAlg::RsaPssSha256),
            (7680, SigAlg::RsaPssSha384),
            (8192, SigAlg::RsaPssSha384),
            (15359, SigAlg::RsaPssSha384),
            (15360, SigAlg::RsaPssSha512),
            (16384, SigAlg::RsaPssSha512),
        ] {
            assert_eq!(SigAlg::rsa_for(bits), alg, "{bits}");
        }
        for (name, bits) in [
            ("rsa-pss-3072", Some(3072)),
            ("rsa-pss-7680", Some(7680)),
            ("rsa-pss-15360", Some(15360)),
            ("ed25519", None),
            ("ecdsa-p521", None),
        ] {
            assert_eq!(KeyKind::parse(name).unwrap().rsa_bits(), bits, "{name}");
        }
    }

    #[test]
    fn key_files_are_checked() {
        assert!(PublicKey::from_text("hello").is_err());
        assert!(PublicKey::from_text("intact-verify-key v1\nrot13 00").is_err());
        assert!(PublicKey::from_text("intact-verify-key v1\ned25519 zz").is_err());
        assert!(Signer::from_pkcs8(b"not a key").is_err());
        assert!(KeyKind::parse("rsa-15360").is_err());
    }
}
