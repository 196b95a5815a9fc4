//! COMP-EINT (Oprea–Reiter §5.3, Fig. 10).

use super::rtree::{self, leaf_value, Plan};
use super::{check_write, Env, FileState, MtEint, Scheme};
use crate::crypto::{ct_eq, FileId, Hash};
use crate::error::{Error, Result};
use crate::metrics::{timed, Phase};
use crate::tree::TreeState;
use crate::tx::Tx;

/// Size of the hash stored in a compressed block (keyed BLAKE3).
pub const HASH_LEN: usize = 32;
/// The cipher's block size (AES).
pub const CIPHER_BLOCK: usize = 16;

/// L_c (§5.3): the largest plaintext length whose length-preserving encryption fits in a
/// block of `bs` bytes beside a `hash_len`-byte hash, for a cipher with `cipher_block`-byte
/// blocks (CBC encrypts whole cipher blocks): the largest multiple of `cipher_block` not
/// above `bs - hash_len`. The paper's example: 4096-byte blocks, SHA-1 (20 bytes), AES →
/// 4064. Ours (32-byte hash): also 4064 at 4 KiB; 96 at 128 bytes.
pub const fn l_c(bs: usize, hash_len: usize, cipher_block: usize) -> usize {
    (bs - hash_len) / cipher_block * cipher_block
}

/// The compression algorithm of a COMP-EINT file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Raw DEFLATE (RFC 1951, zlib's algorithm without its header and checksum), level 1.
    Deflate,
    /// Zstandard, level 1.
    Zstd,
}

impl Compression {
    /// Compresses `src` into `dst`; the compressed length, or `None` when it does not fit.
    pub fn compress(self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        match self {
            Compression::Deflate => {
                let mut c = flate2::Compress::new(flate2::Compression::fast(), false);
                match c.compress(src, dst, flate2::FlushCompress::Finish) {
                    Ok(flate2::Status::StreamEnd) => Some(c.total_out() as usize),
                    _ => None,
                }
            }
            Compression::Zstd => zstd::bulk::compress_to_buffer(src, dst, 1).ok(),
        }
    }

    /// Decompresses `src` into exactly `dst.len()` bytes; `false` on any malformation.
    pub fn decompress(self, src: &[u8], dst: &mut [u8]) -> bool {
        match self {
            Compression::Deflate => {
                let mut d = flate2::Decompress::new(false);
                matches!(
                    d.decompress(src, dst, flate2::FlushDecompress::Finish),
                    Ok(flate2::Status::StreamEnd)
                ) && d.total_out() as usize == dst.len()
                    && d.total_in() as usize == src.len()
            }
            Compression::Zstd => {
                matches!(zstd::bulk::decompress_to_buffer(src, dst), Ok(n) if n == dst.len())
            }
        }
    }
}

/// COMP-EINT: a block that compresses to less than L_c bytes is stored as
/// `CBC(pad(compress(B))) || tag` (`pad`: ISO/IEC 7816-4, 0x80 then zeros, to L_c bytes),
/// with `tag = keyed BLAKE3(LEAF key, "ctag" || file id || i || ctr || first bs − 32 stored
/// bytes)`; any other block is stored as `CBC(B)` and gets an RTree leaf h(i || ctr || B)
/// as in RAND-EINT. CBC uses IV = PRF(i || ctr) as `mt-eint-cbc` (Fig. 3): a (block,
/// counter) pair is never reused, so IVs never repeat.
///
/// Two deliberate choices:
/// - *CBC, not HCTR2.* COMP-EINT's integrity comes from the hash, not from the cipher's
///   non-malleability, so any length-preserving IND-CPA encryption will do (§5.3 uses
///   "the length-preserving stateful encryption", the paper's prototype CBC). CBC runs in
///   aws-lc (audited, AES-NI, parallel decryption) and the 16-byte alignment it needs is
///   what the paper's L_c formula accounts for.
/// - *The stored hash covers the ciphertext* (encrypt-then-MAC) rather than the plaintext
///   as in Fig. 10. With (i, ctr) in the hash and the IV a function of (i, ctr), the
///   ciphertext determines the plaintext, so this authenticates the same thing; but it
///   lets Check verify *before* decrypting and decompressing: no byte from the store
///   reaches the decompressor unauthenticated.
///
/// Whether a block is compressed or in RTree is decided by RArr (authenticated, see
/// [`super::rtree`]), not by anything in the block. Holes (counter 0) read as zeros.
pub struct CompEint {
    /// The compression algorithm.
    pub codec: Compression,
}

fn tag(env: &Env, f: &FileState, i: u64, ctr: u64, stored: &[u8]) -> Hash {
    timed(Phase::HashMac, || {
        env.leaf_key
            .mac(&[b"ctag", &f.id, &i.to_le_bytes(), &ctr.to_le_bytes(), stored])
    })
}

impl CompEint {
    /// Encodes one block in place; returns its RTree leaf if it does not compress enough.
    fn seal(
        &self,
        env: &Env,
        f: &FileState,
        i: u64,
        ctr: u64,
        blk: &mut [u8],
        scratch: &mut [u8],
    ) -> Option<Hash> {
        let bs = blk.len();
        let lc = l_c(bs, HASH_LEN, CIPHER_BLOCK);
        let iv = f.keys.cbc_iv(i, ctr);
        // Strictly below L_c: the padding needs at least one byte.
        match timed(Phase::RandTest, || {
            self.codec.compress(blk, &mut scratch[..lc - 1])
        }) {
            Some(len) => {
                blk.fill(0);
                blk[..len].copy_from_slice(&scratch[..len]);
                blk[len] = 0x80;
                timed(Phase::Encrypt, || f.keys.cbc().encrypt(iv, &mut blk[..lc]));
                let t = tag(env, f, i, ctr, &blk[..bs - HASH_LEN]);
                blk[bs - HASH_LEN..].copy_from_slice(&t);
                None
            }
            None => {
                let leaf = leaf_value(env, f, i, ctr, blk);
                timed(Phase::Encrypt, || f.keys.cbc().encrypt(iv, blk));
                Some(leaf)
            }
        }
    }

    /// Checks and decodes a compressed block in place.
    fn open_compressed(
        &self,
        env: &Env,
        f: &FileState,
        i: u64,
        ctr: u64,
        blk: &mut [u8],
        scratch: &mut [u8],
    ) -> Result<()> {
        let bs = blk.len();
        let lc = l_c(bs, HASH_LEN, CIPHER_BLOCK);
        let want = tag(env, f, i, ctr, &blk[..bs - HASH_LEN]);
        if !ct_eq(&want, &blk[bs - HASH_LEN..]) {
            return Err(f.tampered(i, "compressed block does not match its hash"));
        }
        timed(Phase::Encrypt, || {
            f.keys.cbc().decrypt(f.keys.cbc_iv(i, ctr), &mut blk[..lc])
        });
        // Authentic from here on; a malformed payload would be our own bug.
        let end = blk[..lc].iter().rposition(|&b| b != 0);
        let Some(len) = end.filter(|&e| blk[e] == 0x80) else {
            return Err(Error::Invalid(format!(
                "block {i}: bad padding after authentication"
            )));
        };
        scratch[..len].copy_from_slice(&blk[..len]);
        if !timed(Phase::RandTest, || {
            self.codec.decompress(&scratch[..len], blk)
        }) {
            return Err(Error::Invalid(format!(
                "block {i}: authenticated payload does not decompress"
            )));
        }
        Ok(())
    }
}

impl Scheme for CompEint {
    fn read_blocks(
        &self,
        env: &Env,
        f: &FileState,
        tx: &mut Tx,
        first: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let bs = env.bs;
        let arr = rtree::hints_of(f, tx)?;
        tx.read_at(&f.names.data, first * bs as u64, out)?;
        let mut scratch = vec![0u8; bs];
        let mut checks = Vec::new();
        let mut failed = None;
        for (k, blk) in out.chunks_exact_mut(bs).enumerate() {
            let i = first + k as u64;
            let ctr = f.ctrs.get(i);
            if ctr == 0 {
                blk.fill(0);
                continue;
            }
            match arr.search_offset(i) {
                Some(j) => {
                    timed(Phase::Encrypt, || {
                        f.keys.cbc().decrypt(f.keys.cbc_iv(i, ctr), blk)
                    });
                    checks.push((j, leaf_value(env, f, i, ctr, blk), i));
                }
                None => match self.open_compressed(env, f, i, ctr, blk, &mut scratch) {
                    Ok(()) => {}
                    Err(Error::Tampered { .. }) => {
                        failed = Some((i, "compressed block does not match its hash"));
                        break;
                    }
                    Err(e) => {
                        out.fill(0);
                        return Err(e);
                    }
                },
            }
        }
        if let Err(e) = rtree::verify_leaves(env, f, tx, checks, failed) {
            out.fill(0);
            return Err(e);
        }
        Ok(())
    }

    fn prepare_read(&self, _env: &Env, f: &mut FileState, tx: &mut Tx) -> Result<()> {
        rtree::hints(f, tx).map(|_| ())
    }

    fn read_ready(&self, f: &FileState) -> bool {
        rtree::is_current(f)
    }

    fn write_blocks(
        &self,
        env: &Env,
        f: &mut FileState,
        tx: &mut Tx,
        first: u64,
        data: &mut [u8],
    ) -> Result<()> {
        let bs = env.bs;
        let (_, count) = check_write(f, bs, first, data.len())?;
        let ctr = MtEint::next_ctr_any(env, f, first, count)?;
        let mut plan = Plan::new(rtree::verified(env, f, tx)?);
        let mut scratch = vec![0u8; bs];
        for (k, blk) in data.chunks_exact_mut(bs).enumerate() {
            let i = first + k as u64;
            let leaf = self.seal(env, f, i, ctr, blk, &mut scratch);
            plan.set(i, leaf);
        }
        let ts = f.tree;
        let (ts, arr) = plan.apply(env, f, tx, &ts)?;
        tx.write_at(&f.names.data, first * bs as u64, data)?;
        rtree::commit(f, ts, arr);
        f.ctrs.set_range(first, count, ctr);
        Ok(())
    }

    fn resize(&self, env: &Env, f: &mut FileState, tx: &mut Tx, blocks: u64) -> Result<()> {
        rtree::resize(env, f, tx, blocks)
    }

    fn empty(&self, env: &Env, id: &FileId) -> TreeState {
        TreeState::empty(env.hasher, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `cmd` with `input` on its stdin and returns its stdout; `None` (after saying
    /// why) when the tool is missing, which fails the run under INTACT_REQUIRE_ALL=1.
    fn reference_tool(cmd: &[&str], input: &[u8]) -> Option<Vec<u8>> {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let child = Command::new(cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                assert!(
                    std::env::var("INTACT_REQUIRE_ALL").as_deref() != Ok("1"),
                    "{} is required (scripts/test.sh installs it): {e}",
                    cmd[0]
                );
                eprintln!("SKIPPED: {} not found ({e})", cmd[0]);
                return None;
            }
        };
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let feeder = std::thread::spawn(move || stdin.write_all(&input));
        let out = child.wait_with_output().unwrap();
        feeder.join().unwrap().unwrap();
        assert!(out.status.success(), "{cmd:?} failed");
        Some(out.stdout)
    }

    /// Blocks of every kind the scheme meets: zeros, text, a short repeat, random bytes
    /// (which do not compress and must not fit), and 1 byte.
    fn sample_blocks() -> Vec<Vec<u8>> {
        let text: Vec<u8> = b"Oprea and Reiter, Integrity checking in cryptographic file systems. "
            .iter()
            .cycle()
            .take(4096)
            .copied()
            .collect();
        let mut random = vec![0u8; 4096];
        crate::crypto::fill_random(&mut random);
        vec![
            vec![0; 4096],
            text,
            b"abcabcabc".repeat(455),
            random,
            vec![7],
        ]
    }

    /// Each sample block, compressed by us, decompresses with `unpack` (a reference tool)
    /// to the same block (a block that does not compress must be a large one); compressed
    /// by `pack`, it decompresses with us to the same block.
    fn round_trips_with(c: Compression, unpack: &[&str], pack: &[&str]) {
        for b in sample_blocks() {
            let mut out = vec![0u8; l_c(4096, HASH_LEN, CIPHER_BLOCK)];
            if let Some(n) = c.compress(&b, &mut out) {
                let Some(back) = reference_tool(unpack, &out[..n]) else {
                    return;
                };
                assert_eq!(back, b, "{c:?}: ours, then {unpack:?}");
            } else {
                assert!(b.len() > 1000, "a {}-byte block did not compress", b.len());
            }
            let Some(theirs) = reference_tool(pack, &b) else {
                return;
            };
            let mut out = vec![0u8; b.len()];
            assert!(
                c.decompress(&theirs, &mut out),
                "{c:?}: {pack:?}, then ours"
            );
            assert_eq!(out, b);
        }
    }

    /// Raw DEFLATE against zlib itself (through Python's `zlib`, wbits -15), level 9 on
    /// their side.
    #[test]
    fn deflate_round_trips_with_the_reference_zlib() {
        let inflate = "import sys, zlib; sys.stdout.buffer.write(zlib.decompress(sys.stdin.buffer.read(), -15))";
        let deflate = "import sys, zlib; c = zlib.compressobj(9, zlib.DEFLATED, -15); \
                       sys.stdout.buffer.write(c.compress(sys.stdin.buffer.read()) + c.flush())";
        round_trips_with(
            Compression::Deflate,
            &["python3", "-c", inflate],
            &["python3", "-c", deflate],
        );
    }

    /// Zstandard against the reference `zstd` tool (`-19` on its side).
    #[test]
    fn zstd_round_trips_with_the_reference_tool() {
        round_trips_with(
            Compression::Zstd,
            &["zstd", "-d", "-c", "-q"],
            &["zstd", "-19", "-c", "-q"],
        );
    }

    #[test]
    fn l_c_examples() {
        // The paper's example (§5.3): 4096-byte blocks, SHA-1, AES.
        assert_eq!(l_c(4096, 20, 16), 4064);
        // Ours: 32-byte keyed BLAKE3.
        assert_eq!(l_c(4096, HASH_LEN, CIPHER_BLOCK), 4064);
        assert_eq!(l_c(128, HASH_LEN, CIPHER_BLOCK), 96);
        assert_eq!(l_c(65536, HASH_LEN, CIPHER_BLOCK), 65504);
        assert_eq!(l_c(100, 20, 16), 80);
    }

    #[test]
    fn codecs_round_trip_and_refuse_what_does_not_fit() {
        for codec in [Compression::Deflate, Compression::Zstd] {
            let text = b"hello hello hello hello ".repeat(171);
            let src = &text[..4096];
            let mut dst = vec![0u8; 4063];
            let n = codec.compress(src, &mut dst).unwrap();
            assert!(n < 200, "{codec:?}: {n}");
            let mut back = vec![0u8; 4096];
            assert!(codec.decompress(&dst[..n], &mut back));
            assert_eq!(back, src);
            // Wrong output size and garbage are refused, not panics.
            assert!(!codec.decompress(&dst[..n], &mut back[..4000]));
            assert!(!codec.decompress(&[0xff; 64], &mut back));
            let mut rnd = vec![0u8; 4096];
            crate::crypto::fill_random(&mut rnd);
            assert_eq!(codec.compress(&rnd, &mut dst), None);
        }
    }
}
