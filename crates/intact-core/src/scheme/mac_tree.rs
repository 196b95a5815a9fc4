//! `mac-tree`: Yun, Shi and Kim (2009), §4.1–4.2, Fig. 2–3.

use super::{check_limit, check_write, Env, FileState, Scheme};
use crate::crypto::FileId;
use crate::error::{Error, Result};
use crate::format::MAC_INLINE_LEN;
use crate::metrics::{timed, Phase};
pub use crate::tree::mac::MacTreeState;
use crate::tree::mac::{nonce, MacIo, MacTree as Tree, MacTreeError, Obj, HOLE, NONCE_ENC};
use crate::tree::TreeState;
use crate::tx::Tx;
use std::cell::Cell;

/// log2 of the default arity: 64, as in the paper's implementation (§5).
pub const DEFAULT_ARITY_LOG2: u8 = 6;

/// The counter MAC tree scheme (Yun et al. §4): block `i` with leaf counter `N_i` is
/// encrypted with AES-256-CTR under `<i, k, N_i>_e` and authenticated by
/// `T_i = Poly1305-AES(<i, 0, N_i>_a, C_i)` (encrypt-then-MAC, Fig. 3); the leaf counters
/// are authenticated by the counter MAC tree ([`crate::tree::mac`], Fig. 2) whose root
/// counter, `m` and depth are in TS_F (the record's root field; `n` is its leaf count).
/// One AES key serves the keystream and the MAC's blinding (§4.4), with disjoint nonce
/// encodings ([`crate::tree::mac::nonce`]).
///
/// Check verifies the leaf counters up to the root counter (or a cached verified
/// counter), then the block's tag, then decrypts. Update verifies the path, moves the
/// run's counter to `max(old + 1, session floor)`, re-MACs the path and writes. Truncation
/// keeps the counters (`m >= n`, so an Append never reuses a nonce); re-extension marks
/// the kept counters as holes.
pub struct MacTree;

/// The two objects of a file's tree, as [`MacIo`] sees them. While `inline` is `Some`
/// (a tree of at most one leaf counter on a volume with [`crate::format::INLINE_MAC`]),
/// level 0 is not in `.m`: its only bytes that can be non-zero, `N_0`, node 0's tag and
/// `T_0`, are kept in the record ([`FileState::inline_mac`]) and every other byte of the
/// level-0 object reads as zero, as it would from `.m`. A write that puts a non-zero byte
/// anywhere else (the tree grew past one leaf counter) first moves the inline bytes into
/// `.m` at their places, so the tree code sees the same bytes either way.
struct Io<'a> {
    tx: &'a mut Tx,
    leaves: &'a str,
    upper: &'a str,
    inline: Option<[u8; MAC_INLINE_LEN]>,
    /// The tree's arity `a` (node 0's tag and `T_0` are at `8a` in the level-0 object).
    a: u64,
}

impl<'a> Io<'a> {
    /// For reading, or for a change of a tree whose level 0 stays where it is.
    fn of(tx: &'a mut Tx, f: &'a FileState, ts: &MacTreeState) -> Self {
        Io {
            tx,
            leaves: &f.names.meta,
            upper: &f.names.ctrs,
            inline: f.inline_mac,
            a: 1 << ts.arity_log2,
        }
    }

    /// For an operation that changes the tree: a tree with no leaf counter yet, on a volume
    /// with inline `mac-tree` leaves, starts with its level 0 in the record (so a file's
    /// first block never creates a `.m` object).
    fn entering(env: &Env, tx: &'a mut Tx, f: &'a FileState, ts: &MacTreeState) -> Self {
        let mut io = Self::of(tx, f, ts);
        if env.inline_mac && ts.m == 0 {
            io.inline = Some([0; MAC_INLINE_LEN]);
        }
        io
    }

    /// Where the inline bytes sit in the level-0 object: `(offset in the object, offset in
    /// the inline bytes, length)`. `N_0` first; node 0's tag and `T_0` follow the node's
    /// `a` counters.
    fn places(a: u64) -> [(u64, usize, usize); 2] {
        [(0, 0, 8), (8 * a, 8, 32)]
    }

    /// Where the inline bytes meet `len` bytes of the level-0 object at `off`: pairs of
    /// ranges, in the inline bytes and in those `len` bytes.
    fn overlaps(
        a: u64,
        off: u64,
        len: usize,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, std::ops::Range<usize>)> {
        Self::places(a)
            .into_iter()
            .filter_map(move |(at, from, n)| {
                let lo = at.max(off);
                let hi = (at + n as u64).min(off + len as u64);
                (lo < hi).then(|| {
                    let start = from + (lo - at) as usize;
                    let k = (hi - lo) as usize;
                    (start..start + k, (lo - off) as usize..(hi - off) as usize)
                })
            })
    }

    /// Writes the inline bytes into `.m` at their places and leaves the record's form.
    fn spill(&mut self) -> Result<()> {
        if let Some(b) = self.inline.take() {
            if b != [0; MAC_INLINE_LEN] {
                for (at, from, len) in Self::places(self.a) {
                    self.tx.write_at(self.leaves, at, &b[from..from + len])?;
                }
            }
        }
        Ok(())
    }
}

impl MacIo for Io<'_> {
    fn read(&mut self, obj: Obj, off: u64, buf: &mut [u8]) -> Result<()> {
        let name = match obj {
            Obj::Leaves => {
                if let Some(b) = &self.inline {
                    buf.fill(0);
                    for (inline, io) in Self::overlaps(self.a, off, buf.len()) {
                        buf[io].copy_from_slice(&b[inline]);
                    }
                    return Ok(());
                }
                self.leaves
            }
            Obj::Upper => self.upper,
        };
        self.tx.read_at(name, off, buf).map(|_| ())
    }
    fn write(&mut self, obj: Obj, off: u64, data: &[u8]) -> Result<()> {
        let name = match obj {
            Obj::Leaves => {
                if let Some(b) = &mut self.inline {
                    let places = Self::places(self.a);
                    let inside = |p: u64| {
                        places
                            .iter()
                            .any(|&(at, _, len)| (at..at + len as u64).contains(&p))
                    };
                    let fits = data
                        .iter()
                        .enumerate()
                        .all(|(k, &v)| v == 0 || inside(off + k as u64));
                    if fits {
                        for (inline, io) in Self::overlaps(self.a, off, data.len()) {
                            b[inline].copy_from_slice(&data[io]);
                        }
                        return Ok(());
                    }
                    self.spill()?;
                }
                self.leaves
            }
            Obj::Upper => self.upper,
        };
        self.tx.write_at(name, off, data)
    }
}

impl MacTree {
    fn state(f: &FileState) -> Result<MacTreeState> {
        MacTreeState::decode(&f.tree.root)
            .ok_or_else(|| f.tampered_file("malformed mac-tree trusted state"))
    }

    fn tree<'a>(env: &'a Env, f: &'a FileState) -> Tree<'a> {
        Tree {
            file: f.id,
            mac: f.keys.mac(),
            cache: Some(env.cache),
        }
    }

    fn err(f: &FileState, e: MacTreeError) -> Error {
        match e {
            MacTreeError::Mismatch { level, node, leaf } => f.tampered(
                leaf,
                format!(
                    "counter node {node} at level {level} fails its Poly1305-AES MAC under its \
                     trusted parent counter"
                ),
            ),
            MacTreeError::Exhausted => Error::Invalid(
                "write-counter reservation exhausted; close and reopen the volume".into(),
            ),
            MacTreeError::BadState(s) => f.tampered_file(format!("mac-tree state: {s}")),
            MacTreeError::Io(e) => e,
        }
    }

    /// After an operation that changed the tree (its level 0 inline or not, as `inline`
    /// says): restores the rule of [`FileState::inline_mac`]. Level 0 stays in the record
    /// while the tree has exactly one leaf counter (`m = 1`; `m` never decreases, so a tree
    /// that left the record never comes back), and is in `.m` once it has more; a tree with
    /// none has neither.
    fn settle(
        f: &mut FileState,
        tx: &mut Tx,
        ts: &MacTreeState,
        inline: Option<[u8; MAC_INLINE_LEN]>,
    ) -> Result<()> {
        f.inline_mac = match (ts.m, inline) {
            (0, _) | (_, None) => None,
            (1, Some(b)) => Some(b),
            (_, Some(b)) => {
                let mut io = Io::of(tx, f, ts);
                io.inline = Some(b);
                io.spill()?;
                None
            }
        };
        Ok(())
    }

    /// CTR keystream of block `i` at counter `ctr`: `AES(<i, k, ctr>_e)` for k = 0, 1, ...
    fn xor(f: &FileState, i: u64, ctr: u64, blk: &mut [u8]) {
        timed(Phase::Encrypt, || {
            f.keys.ctr().xor(nonce(NONCE_ENC, i, 0, ctr), blk)
        })
    }
}

impl Scheme for MacTree {
    fn read_blocks(
        &self,
        env: &Env,
        f: &FileState,
        tx: &mut Tx,
        first: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let bs = env.bs;
        let count = (out.len() / bs) as u64;
        let ts = Self::state(f)?;
        let tree = Self::tree(env, f);
        let leaves = {
            let mut io = Io::of(tx, f, &ts);
            tree.read_leaves(&ts, &mut io, first, count)
                .map_err(|e| Self::err(f, e))?
        };
        tx.read_at(&f.names.data, first * bs as u64, out)?;
        for (k, blk) in out.chunks_exact_mut(bs).enumerate() {
            let i = first + k as u64;
            let (ctr, tag) = leaves[k];
            if ctr == 0 || ctr & HOLE != 0 {
                blk.fill(0);
                continue;
            }
            let want = tree.block_tag(i, ctr, blk);
            if !crate::crypto::ct_eq(&want, &tag) {
                out.fill(0);
                return Err(f.tampered(i, "block MAC (Poly1305-AES) does not verify"));
            }
            Self::xor(f, i, ctr, blk);
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
        let ts = Self::state(f)?;
        let tree = Self::tree(env, f);
        let ctr = Cell::new(0u64);
        let (floor, limit, hw) = (env.ctr_floor, env.ctr_limit, f.ctr_hw);
        let (new_ts, inline) = {
            let mut io = Io::entering(env, tx, f, &ts);
            let fs: &FileState = f;
            let new_ts = tree
                .update(
                    &ts,
                    &mut io,
                    first,
                    first + count,
                    floor,
                    limit,
                    &mut |old| {
                        // The counter rule: above every counter the run had (hole marks
                        // stripped), the session floor and any deleted block's counter.
                        let max = old.iter().map(|c| c & !HOLE).max().unwrap_or(0);
                        let c = (max + 1).max(floor).max(hw + 1);
                        if c >= limit || c & HOLE != 0 {
                            return Err(MacTreeError::Exhausted);
                        }
                        ctr.set(c);
                        Ok(())
                    },
                    &mut |i, _old| {
                        let c = ctr.get();
                        let k = (i - first) as usize;
                        let blk = &mut data[k * bs..(k + 1) * bs];
                        Self::xor(fs, i, c, blk);
                        (c, Some(tree.block_tag(i, c, blk)))
                    },
                )
                .map_err(|e| Self::err(fs, e))?;
            (new_ts, io.inline)
        };
        tx.write_at(&f.names.data, first * bs as u64, data)?;
        f.tree.root = new_ts.encode();
        f.tree.leaves = n.max(first + count);
        Self::settle(f, tx, &new_ts, inline)
    }

    /// Truncation keeps the leaf counters (Yun et al.: Delete never resets a counter, so
    /// `m >= n`); extension over kept counters marks them as holes; past `m` nothing is
    /// stored (counter 0).
    fn resize(&self, env: &Env, f: &mut FileState, tx: &mut Tx, blocks: u64) -> Result<()> {
        check_limit(blocks)?;
        let n = f.tree.leaves;
        if blocks < n {
            tx.set_len(&f.names.data, blocks * env.bs as u64)?;
        } else if blocks > n {
            let ts = Self::state(f)?;
            let end = blocks.min(ts.m);
            if n < end {
                let tree = Self::tree(env, f);
                let mut io = Io::of(tx, f, &ts);
                let new_ts = tree
                    .update(
                        &ts,
                        &mut io,
                        n,
                        end,
                        env.ctr_floor,
                        env.ctr_limit,
                        &mut |_| Ok(()),
                        &mut |_, old| (if old == 0 { 0 } else { old | HOLE }, None),
                    )
                    .map_err(|e| Self::err(f, e))?;
                let inline = io.inline;
                f.tree.root = new_ts.encode();
                Self::settle(f, tx, &new_ts, inline)?;
            }
        }
        f.tree.leaves = blocks;
        Ok(())
    }

    fn empty(&self, _env: &Env, _id: &FileId) -> TreeState {
        TreeState {
            leaves: 0,
            root: MacTreeState::empty(DEFAULT_ARITY_LOG2).encode(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::SchemeId;
    use crate::scheme::fixture::Fixture;

    /// A tree past one leaf counter whose level 0 is still in the record (which the object
    /// I/O never leaves behind: it moves the bytes at the write that grows the tree) is
    /// settled by writing the 40 bytes to `.m` at their places: `N_0` at 0, node 0's tag
    /// and `T_0` at `8a`.
    #[test]
    fn settle_moves_level_0_out_of_the_record_past_one_counter() {
        let mut fx = Fixture::new(64);
        fx.inline_mac = true;
        let mut f = fx.file(SchemeId::MacTree);
        let (_, tx) = fx.parts();
        let mut leaf = [0u8; MAC_INLINE_LEN];
        for (k, b) in leaf.iter_mut().enumerate() {
            *b = k as u8 + 1;
        }
        let mut ts = MacTreeState::empty(DEFAULT_ARITY_LOG2);
        ts.m = 1;
        MacTree::settle(&mut f, tx, &ts, Some(leaf)).unwrap();
        assert_eq!(f.inline_mac, Some(leaf));
        assert_eq!(tx.len(&f.names.meta).unwrap(), None);
        ts.m = 2;
        MacTree::settle(&mut f, tx, &ts, Some(leaf)).unwrap();
        assert_eq!(f.inline_mac, None);
        let mut m = vec![0u8; 8 * 64 + 32];
        tx.read_at(&f.names.meta, 0, &mut m).unwrap();
        assert_eq!(m[..8], leaf[..8]);
        assert!(m[8..8 * 64].iter().all(|&b| b == 0));
        assert_eq!(m[8 * 64..], leaf[8..]);
        ts.m = 0;
        MacTree::settle(&mut f, tx, &ts, Some(leaf)).unwrap();
        assert_eq!(f.inline_mac, None, "no counter: neither");
    }
}
