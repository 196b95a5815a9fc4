//! HCTR2 (Crowley, Huckleberry, Biggers, "Length-preserving encryption with HCTR2",
//! ePrint 2021/1441): a wide-block tweakable cipher, here over AES-256.
//!
//! RAND-EINT (Oprea–Reiter §3.3, §5.2) needs a *tweakable* length-preserving cipher whose
//! decryption of any ciphertext other than the one written under the same tweak looks
//! uniformly random over the whole block (non-malleability, §3.2): then a block whose
//! decryption does not look random is authentic. The paper used CMC; HCTR2 is its modern
//! successor (one AES call per 16 bytes plus two POLYVAL passes, arbitrary lengths ≥ 16,
//! any tweak length, Linux's fscrypt uses it for file names). Adiantum would do too but is
//! built for machines without AES instructions. See docs/design.md, "HCTR2".
//!
//! Written here because the `hctr2` crate needs a nightly compiler; it is a direct
//! transcription of the paper's Fig. 1 over RustCrypto's `aes` and `polyval` (both
//! constant-time with hardware acceleration when available), checked against Google's
//! published vectors (`hctr2_vectors.txt`).

use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use aes::Aes256;
use polyval::universal_hash::UniversalHash;
use polyval::Polyval;
use zeroize::Zeroize;

/// HCTR2's block size n (AES): the minimum message length.
pub const BLOCK: usize = 16;

/// HCTR2-AES-256 under one key.
#[derive(Clone)]
pub struct Hctr2 {
    aes: Aes256,
    /// L = E_K(bin(1)).
    l: [u8; BLOCK],
    /// POLYVAL keyed with h = E_K(bin(0)), before any input.
    poly: Polyval,
}

impl Drop for Hctr2 {
    fn drop(&mut self) {
        // `aes` and `polyval` zeroize their own state (feature "zeroize").
        self.l.zeroize();
    }
}

impl std::fmt::Debug for Hctr2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hctr2(..)")
    }
}

/// Bytes of XCTR keystream produced per batch of AES calls.
const XCTR_BATCH: usize = 32;

impl Hctr2 {
    /// A cipher under a 32-byte AES-256 key.
    pub fn new(key: &[u8; 32]) -> Self {
        let aes = Aes256::new(key.into());
        let mut h = aes::Block::default();
        aes.encrypt_block(&mut h);
        let mut l = aes::Block::default();
        l[0] = 1;
        aes.encrypt_block(&mut l);
        let poly = Polyval::new(&h);
        h.zeroize();
        let mut lb = [0u8; BLOCK];
        lb.copy_from_slice(&l);
        l.zeroize();
        Hctr2 { aes, l: lb, poly }
    }

    /// Encrypts `data` (at least 16 bytes) in place under `tweak`.
    ///
    /// # Panics
    /// If `data` is shorter than [`BLOCK`]; callers pass whole file blocks (≥ 128 bytes).
    pub fn encrypt(&self, tweak: &[u8], data: &mut [u8]) {
        self.crypt(tweak, data, true);
    }

    /// Decrypts `data` (at least 16 bytes) in place under `tweak`.
    ///
    /// # Panics
    /// If `data` is shorter than [`BLOCK`].
    pub fn decrypt(&self, tweak: &[u8], data: &mut [u8]) {
        self.crypt(tweak, data, false);
    }

    /// H_h(T, X): POLYVAL(h, bin(2|T|+2) ‖ pad(T) ‖ X) when 16 divides |X|, else
    /// POLYVAL(h, bin(2|T|+3) ‖ pad(T) ‖ pad(X ‖ 1)), |T| in bits, bin() 128-bit LE.
    fn hash(&self, tweak: &[u8], x: &[u8]) -> [u8; BLOCK] {
        let mut p = self.poly.clone();
        let mut first = polyval::Block::default();
        let bits =
            (tweak.len() as u128) * 8 * 2 + if x.len().is_multiple_of(BLOCK) { 2 } else { 3 };
        first.copy_from_slice(&bits.to_le_bytes());
        p.update(&[first]);
        p.update_padded(tweak);
        let whole = x.len() / BLOCK * BLOCK;
        p.update_padded(&x[..whole]);
        if whole < x.len() {
            let mut last = polyval::Block::default();
            let tail = &x[whole..];
            last[..tail.len()].copy_from_slice(tail);
            last[tail.len()] = 1;
            p.update(&[last]);
        }
        let mut out = [0u8; BLOCK];
        out.copy_from_slice(&p.finalize());
        out
    }

    /// XCTR: `data ^= E_K(S ⊕ bin(1)) ‖ E_K(S ⊕ bin(2)) ‖ …`.
    fn xctr(&self, s: &[u8; BLOCK], data: &mut [u8]) {
        let mut ks = [aes::Block::default(); XCTR_BATCH];
        let mut i: u128 = 1;
        for chunk in data.chunks_mut(XCTR_BATCH * BLOCK) {
            let nblocks = chunk.len().div_ceil(BLOCK);
            for b in ks.iter_mut().take(nblocks) {
                let ctr = (i ^ u128::from_le_bytes(*s)).to_le_bytes();
                b.copy_from_slice(&ctr);
                i += 1;
            }
            self.aes.encrypt_blocks(&mut ks[..nblocks]);
            for (k, byte) in chunk.iter_mut().enumerate() {
                *byte ^= ks[k / BLOCK][k % BLOCK];
            }
        }
        for b in ks.iter_mut() {
            b.zeroize();
        }
    }

    /// The HCTR2 encryption (`enc`) or decryption of Fig. 1, which differ only in the
    /// direction of the middle AES call.
    fn crypt(&self, tweak: &[u8], data: &mut [u8], enc: bool) {
        assert!(data.len() >= BLOCK, "HCTR2 needs at least 16 bytes");
        let (m, n) = data.split_at_mut(BLOCK);
        // MM ← M ⊕ H(T, N)
        let mut mm = self.hash(tweak, n);
        for (a, b) in mm.iter_mut().zip(m.iter()) {
            *a ^= b;
        }
        // UU ← E_K(MM) (D_K on decryption)
        let mut uu = aes::Block::clone_from_slice(&mm);
        if enc {
            self.aes.encrypt_block(&mut uu);
        } else {
            self.aes.decrypt_block(&mut uu);
        }
        // S ← MM ⊕ UU ⊕ L
        let mut s = [0u8; BLOCK];
        for k in 0..BLOCK {
            s[k] = mm[k] ^ uu[k] ^ self.l[k];
        }
        // V ← N ⊕ XCTR(S)
        self.xctr(&s, n);
        // U ← UU ⊕ H(T, V)
        let hv = self.hash(tweak, n);
        for k in 0..BLOCK {
            m[k] = uu[k] ^ hv[k];
        }
        mm.zeroize();
        s.zeroize();
        uu.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        if s == "-" {
            Vec::new()
        } else {
            hex::decode(s).unwrap()
        }
    }

    /// Google's HCTR2-AES256 vectors, lengths 16, 17, 31, 48, 128, 255 and 512 bytes with
    /// tweaks of 0, 1, 16, 32 and 47 bytes.
    #[test]
    fn google_vectors() {
        let text = include_str!("hctr2_vectors.txt");
        let mut count = 0;
        let mut lens = std::collections::BTreeSet::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            let key: [u8; 32] = unhex(f[0]).try_into().unwrap();
            let (tweak, pt, ct) = (unhex(f[1]), unhex(f[2]), unhex(f[3]));
            let c = Hctr2::new(&key);
            let mut buf = pt.clone();
            c.encrypt(&tweak, &mut buf);
            assert_eq!(hex::encode(&buf), f[3], "encrypt, line {line}");
            c.decrypt(&tweak, &mut buf);
            assert_eq!(buf, pt, "decrypt");
            let mut buf = ct.clone();
            c.decrypt(&tweak, &mut buf);
            assert_eq!(buf, pt);
            lens.insert(pt.len());
            count += 1;
        }
        assert_eq!(count, 35);
        assert_eq!(
            lens.into_iter().collect::<Vec<_>>(),
            [16, 17, 31, 48, 128, 255, 512]
        );
    }

    /// Whole file blocks (past the vectors' 512 bytes, across XCTR batches): round trip, and
    /// a one-bit change of ciphertext or tweak changes about half of every part of the
    /// decryption (the wide-block property RAND-EINT relies on).
    #[test]
    fn wide_block_diffusion() {
        let c = Hctr2::new(&[3; 32]);
        for len in [128usize, 4096, 65536, 1000] {
            let pt: Vec<u8> = (0..len).map(|i| (i % 7) as u8).collect();
            let mut ct = pt.clone();
            c.encrypt(b"tweak", &mut ct);
            assert_ne!(ct, pt);
            let mut back = ct.clone();
            c.decrypt(b"tweak", &mut back);
            assert_eq!(back, pt);
            for (flip_at, tweak) in [(len - 1, &b"tweak"[..]), (0, b"tweak"), (0, b"tweaK")] {
                let mut bad = ct.clone();
                if tweak == b"tweak" {
                    bad[flip_at] ^= 1;
                }
                c.decrypt(tweak, &mut bad);
                for at in [0, len / 2, len - 16] {
                    let diff: u32 = bad[at..at + 16]
                        .iter()
                        .zip(&pt[at..at + 16])
                        .map(|(a, b)| (a ^ b).count_ones())
                        .sum();
                    assert!((24..=104).contains(&diff), "len {len}: {diff} bits differ");
                }
            }
        }
    }
}
