//! `none`: encryption without integrity, the measurement baseline (Oprea–Reiter 2006, §6:
//! "AES – no integrity").

use super::{check_limit, check_write, Env, FileState, MtEint, Scheme};
use crate::crypto::FileId;
use crate::error::Result;
use crate::metrics::{timed, Phase};
use crate::tree::TreeState;
use crate::tx::Tx;

/// Length-preserving AES-256-CBC with `IV = PRF(i || ctr)` (the IV of `mt-eint-cbc`, paper
/// §4.1 Fig. 3) and **no integrity at all**: no tags, no tree. A baseline that shows what
/// integrity costs, never a way to keep data safe.
///
/// The write counters are kept exactly as in MT-EINT (counter intervals in TS_F, the same
/// counter rule), for one reason only: the CBC IV must not repeat for a (block, counter)
/// pair, and the trusted counters guarantee it. They also decide what a hole is, so a
/// hole reads as zeros. Everything else an adversary does to the data objects goes
/// unnoticed: flipped, swapped, copied, replayed, truncated, deleted or zeroed blocks
/// decrypt to garbage (or to old contents) without an error. `tests/attacks.rs` records
/// exactly which attacks it misses; only the structure above the file (the inode table
/// and directories, always `mt-eint`) is still protected.
pub struct NoIntegrity;

impl Scheme for NoIntegrity {
    fn read_blocks(
        &self,
        env: &Env,
        f: &FileState,
        tx: &mut Tx,
        first: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let bs = env.bs;
        tx.read_at(&f.names.data, first * bs as u64, out)?;
        for (k, blk) in out.chunks_exact_mut(bs).enumerate() {
            let i = first + k as u64;
            let ctr = f.ctrs.get(i);
            if ctr == 0 {
                blk.fill(0);
                continue;
            }
            timed(Phase::Encrypt, || {
                f.keys.cbc().decrypt(f.keys.cbc_iv(i, ctr), blk)
            });
        }
        Ok(())
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
        let (n, count) = check_write(f, bs, first, data.len())?;
        let ctr = MtEint::next_ctr_any(env, f, first, count)?;
        for (k, blk) in data.chunks_exact_mut(bs).enumerate() {
            let i = first + k as u64;
            timed(Phase::Encrypt, || {
                f.keys.cbc().encrypt(f.keys.cbc_iv(i, ctr), blk)
            });
        }
        tx.write_at(&f.names.data, first * bs as u64, data)?;
        f.ctrs.set_range(first, count, ctr);
        f.tree.leaves = n.max(first + count);
        Ok(())
    }

    fn resize(&self, env: &Env, f: &mut FileState, tx: &mut Tx, blocks: u64) -> Result<()> {
        check_limit(blocks)?;
        let n = f.tree.leaves;
        if blocks < n {
            f.ctr_hw = f.ctr_hw.max(f.ctrs.max_in(blocks, n - blocks));
            f.ctrs.truncate(blocks);
            tx.set_len(&f.names.data, blocks * env.bs as u64)?;
        } else {
            f.ctrs.extend(blocks);
        }
        f.tree.leaves = blocks;
        Ok(())
    }

    fn empty(&self, _env: &Env, _id: &FileId) -> TreeState {
        TreeState {
            leaves: 0,
            root: [0; 32],
        }
    }
}
