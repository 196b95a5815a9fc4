//! RAND-EINT (Oprea–Reiter §3.3, §5.2, Fig. 8–9).

use super::rtree::{self, leaf_value, Plan};
use super::{check_write, Env, FileState, MtEint, Scheme};
use crate::crypto::FileId;
use crate::entropy::is_rand;
use crate::error::Result;
use crate::metrics::{timed, Phase};
use crate::tree::TreeState;
use crate::tx::Tx;

/// RAND-EINT: every block is enciphered with HCTR2 (a wide-block tweakable cipher, see
/// [`crate::wide`]) under the tweak h(i || ctr) — the keyed hash of the block index and its
/// trusted write counter. A Merkle tree, RTree, covers only the blocks whose plaintext is
/// random-looking ([`is_rand`]); its leaves carry RArr (see [`super::rtree`]).
///
/// Check(i): decrypt under the current counter's tweak. If block i has an RTree leaf, the
/// leaf (and its path to the root in TS_F) must verify. Otherwise the plaintext must *not*
/// look random: any ciphertext other than the one written under this tweak — flipped bits,
/// another block's or file's ciphertext, an older version of this block (older counter,
/// other tweak), all-zero bytes — deciphers to a block that is computationally
/// indistinguishable from uniform (HCTR2 is a tweakable strong PRP), which passes as "not
/// random" with probability at most 2^-64 ([`crate::entropy::forgery_log2_bound`]). This is
/// the paper's Check with one strengthening: a block that has a leaf is always checked
/// against it, even if it deciphers to non-random data (which a genuine leafed block never
/// does).
///
/// Holes: a block with counter 0 (never written since the file grew past it) reads as
/// zeros without reading the store; the counter is trusted, so stored bytes can never make
/// a block a hole. A stored all-zero block of a written block is just another ciphertext:
/// it deciphers to random-looking garbage and has no leaf, so it is rejected.
pub struct RandEint;

impl Scheme for RandEint {
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
        let mut checks = Vec::new();
        let mut failed = None;
        for (k, blk) in out.chunks_exact_mut(bs).enumerate() {
            let i = first + k as u64;
            let ctr = f.ctrs.get(i);
            if ctr == 0 {
                blk.fill(0);
                continue;
            }
            timed(Phase::Encrypt, || {
                f.keys.wide().decrypt(&f.keys.tweak(i, ctr), blk)
            });
            match arr.search_offset(i) {
                Some(j) => checks.push((j, leaf_value(env, f, i, ctr, blk), i)),
                None if timed(Phase::RandTest, || is_rand(blk)) => {
                    failed = Some((
                        i,
                        "block deciphers to random-looking data and has no RTree leaf",
                    ));
                    break;
                }
                // Not random-looking: authentic (§3.3, HCTR2's non-malleability).
                None => {}
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
        for (k, blk) in data.chunks_exact_mut(bs).enumerate() {
            let i = first + k as u64;
            let leaf =
                timed(Phase::RandTest, || is_rand(blk)).then(|| leaf_value(env, f, i, ctr, blk));
            plan.set(i, leaf);
            timed(Phase::Encrypt, || {
                f.keys.wide().encrypt(&f.keys.tweak(i, ctr), blk)
            });
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
