//! RTree_F and RArr_F (Oprea–Reiter §5.2–5.3, Fig. 8–10): a Merkle tree over only *some*
//! of a file's blocks (the random-looking ones for RAND-EINT, the incompressible ones for
//! COMP-EINT), the array of their block indices in leaf order, DelOffsetTree (Fig. 9) and
//! SearchOffset.
//!
//! RArr is not a separate object: each RTree leaf carries its block index,
//! `leaf = h(i || ctr || B_i)[..28] || i as u32`, so RArr is authenticated by the trusted
//! root together with the leaves (the paper notes RArr needs no authentication of its own
//! because reordering leaves is detected; here it is covered outright). The first access
//! to a file reads all m leaves, checks that they hash to the root in TS_F, and builds the
//! in-memory RArr and its sorted copy (block index → leaf position) that SearchOffset
//! uses. After that every Check still verifies its leaf's path against the root; the
//! in-memory copy only answers "is block i in RTree, and where" — authentically, also the
//! negative answer, which a Merkle path alone could not prove.

use super::{Env, FileState, MtEint, Nodes};
use crate::crypto::Hash;
use crate::error::{Error, Result};
use crate::format::SchemeId;
use crate::metrics::{timed, Phase};
use crate::tree::TreeState;
use crate::tx::Tx;
use std::collections::BTreeMap;

/// Bytes of the keyed hash in an RTree leaf; the last 4 bytes hold the block index.
pub const LEAF_MAC_LEN: usize = 28;

/// An RTree leaf: keyed BLAKE3(LEAF key, "rleaf" || file id || i u64 || ctr u64 || B)
/// truncated to 28 bytes, then `i` as u32 LE (RArr's entry for this leaf).
pub fn leaf_value(env: &Env, f: &FileState, index: u64, ctr: u64, plain: &[u8]) -> Hash {
    let mut h = timed(Phase::HashMac, || {
        env.leaf_key.mac(&[
            b"rleaf",
            &f.id,
            &index.to_le_bytes(),
            &ctr.to_le_bytes(),
            plain,
        ])
    });
    // Block indices are below MAX_BLOCKS = 2^32 (checked at every write).
    h[LEAF_MAC_LEN..].copy_from_slice(&(index as u32).to_le_bytes());
    h
}

/// The block index a leaf names.
pub fn leaf_index(leaf: &Hash) -> u64 {
    u64::from(u32::from_le_bytes(
        leaf[LEAF_MAC_LEN..].try_into().expect("4 bytes"),
    ))
}

/// RArr_F: the block indices of RTree's leaves in leaf order, with the sorted copy that
/// answers SearchOffset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RArr {
    items: Vec<u64>,
    pos: BTreeMap<u64, u64>,
}

/// What [`RArr::del_offset`] did: the freed position and the block moved into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelOffset {
    /// Position `j` block `i` had.
    pub pos: u64,
    /// The last block `l`, now at `pos`; `None` when `i` was itself last.
    pub moved: Option<u64>,
}

impl RArr {
    /// An empty array.
    pub fn new() -> Self {
        RArr::default()
    }

    /// From leaf-ordered indices; `None` if an index repeats.
    pub fn from_items(items: Vec<u64>) -> Option<Self> {
        let mut pos = BTreeMap::new();
        for (j, &i) in items.iter().enumerate() {
            if pos.insert(i, j as u64).is_some() {
                return None;
            }
        }
        Some(RArr { items, pos })
    }

    /// RArr.items.
    pub fn len(&self) -> u64 {
        self.items.len() as u64
    }

    /// Whether RTree is empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The indices in leaf order.
    pub fn items(&self) -> &[u64] {
        &self.items
    }

    /// SearchOffset(i): the leaf position of block `i`, if it has a leaf.
    pub fn search_offset(&self, i: u64) -> Option<u64> {
        self.pos.get(&i).copied()
    }

    /// Appends block `i` as the last leaf ("append i at end of RArr_F", Fig. 8).
    pub fn push(&mut self, i: u64) {
        debug_assert!(!self.pos.contains_key(&i));
        self.pos.insert(i, self.items.len() as u64);
        self.items.push(i);
    }

    /// The array part of DelOffsetTree (Fig. 9): j ← SearchOffset(i), l ← RArr.last; if
    /// j ≠ l the last entry moves into position j; RArr.items decreases. `None` if `i` has
    /// no leaf.
    pub fn del_offset(&mut self, i: u64) -> Option<DelOffset> {
        let j = self.pos.remove(&i)?;
        let last = self.items.pop().expect("a listed block");
        if last == i {
            return Some(DelOffset {
                pos: j,
                moved: None,
            });
        }
        self.items[j as usize] = last;
        self.pos.insert(last, j);
        Some(DelOffset {
            pos: j,
            moved: Some(last),
        })
    }
}

/// A file's RTree index while open: RArr as read for the tree state `state`, and whether it
/// has been verified as a whole against that state's root.
#[derive(Debug, Clone, Default)]
pub struct RTreeIndex {
    state: Option<TreeState>,
    complete: bool,
    arr: RArr,
}

impl RTreeIndex {
    /// An unloaded index for a scheme with an RTree; `None` for the other schemes.
    pub fn for_scheme(s: SchemeId) -> Option<Self> {
        s.partial_tree().then(RTreeIndex::default)
    }
}

/// The value a leaf position takes in a planned change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Val {
    /// A leaf computed by this operation.
    New(Hash),
    /// The stored leaf at this position of the tree before the operation.
    Old(u64),
}

/// A batch of Fig. 8/10 steps on RArr, simulated in memory, then applied to RTree with as
/// few batched tree operations as possible (updates of contiguous runs, one truncation,
/// one append). The result is the same tree the paper's step-by-step algorithms build.
pub(super) struct Plan {
    arr: RArr,
    vals: BTreeMap<u64, Val>,
}

impl Plan {
    pub(super) fn new(arr: &RArr) -> Self {
        Plan {
            arr: arr.clone(),
            vals: BTreeMap::new(),
        }
    }

    /// Update(i, b) / Append(b) for RArr: `leaf` is `Some` when the new content of block
    /// `i` needs a leaf (random-looking, or incompressible), `None` when it does not.
    pub(super) fn set(&mut self, i: u64, leaf: Option<Hash>) {
        match (leaf, self.arr.search_offset(i)) {
            (None, Some(_)) => self.remove(i),
            (None, None) => {}
            (Some(h), Some(j)) => {
                self.vals.insert(j, Val::New(h));
            }
            (Some(h), None) => {
                self.vals.insert(self.arr.len(), Val::New(h));
                self.arr.push(i);
            }
        }
    }

    /// DelOffsetTree (Fig. 9): removes block `i`'s leaf, moving the last leaf into its place.
    pub(super) fn remove(&mut self, i: u64) {
        if self.arr.search_offset(i).is_none() {
            return;
        }
        let last = self.arr.len() - 1;
        if let Some(d) = self.arr.del_offset(i) {
            let last_val = self.vals.remove(&last).unwrap_or(Val::Old(last));
            if d.moved.is_some() {
                self.vals.insert(d.pos, last_val);
            }
        }
    }

    /// Applies the plan to the tree `ts` (whose stored leaves are `old_arr`'s): verifies
    /// every moved old leaf first, then updates, truncates and appends. Returns the new
    /// tree state; on error nothing has been committed to `ts`.
    pub(super) fn apply(
        self,
        env: &Env,
        f: &FileState,
        tx: &mut Tx,
        ts: &TreeState,
    ) -> Result<(TreeState, RArr)> {
        let tree = MtEint::tree(env, f);
        let meta = f.names.meta.clone();
        let mut io = Nodes::new(tx, &meta);
        let m_old = ts.leaves;
        let m_new = self.arr.len();
        let terr = |e| MtEint::tree_err(f, e);
        // Moved leaves (Val::Old(q) at p != q) are read and verified against the old root
        // before anything changes, so a tampered leaf is never moved into the new tree.
        let mut fin: BTreeMap<u64, Hash> = BTreeMap::new();
        for (&p, &v) in self.vals.range(..m_new) {
            match v {
                Val::New(h) => {
                    fin.insert(p, h);
                }
                Val::Old(q) if q == p => {}
                Val::Old(q) => {
                    let l = tree.stored_leaves(&mut io, q, 1).map_err(terr)?;
                    tree.verify(ts, &mut io, q, &l).map_err(terr)?;
                    fin.insert(p, l[0]);
                }
            }
        }
        let mut ts = *ts;
        if m_new < m_old {
            tree.truncate(&mut ts, &mut io, m_new).map_err(terr)?;
        }
        // Updates of positions inside the (possibly truncated) old tree, in contiguous runs.
        let keep = m_old.min(m_new);
        let mut run: Vec<Hash> = Vec::new();
        let mut run_start = 0;
        for (&p, h) in fin.range(..keep) {
            if !run.is_empty() && p != run_start + run.len() as u64 {
                tree.update(&mut ts, &mut io, run_start, &run)
                    .map_err(terr)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = p;
            }
            run.push(*h);
        }
        if !run.is_empty() {
            tree.update(&mut ts, &mut io, run_start, &run)
                .map_err(terr)?;
        }
        if m_new > m_old {
            let mut app = Vec::with_capacity((m_new - m_old) as usize);
            for p in m_old..m_new {
                match fin.get(&p) {
                    Some(h) => app.push(*h),
                    None => {
                        return Err(Error::Invalid(format!(
                            "internal: RTree append without a value for leaf {p}"
                        )))
                    }
                }
            }
            tree.append(&mut ts, &mut io, &app).map_err(terr)?;
        }
        Ok((ts, self.arr))
    }
}

/// RArr for a **read**: the leaves' indices as stored, not yet verified as a whole. Enough
/// for Check: a block the hints place at position j is accepted only if its computed leaf
/// (which embeds i) verifies at j against the trusted root; a block they omit is accepted
/// only by the entropy test (RAND-EINT) or its in-block hash (COMP-EINT), neither of which
/// depends on RArr. Wrong hints can make a Check fail, never pass. Verifying each accessed
/// path (not all m leaves at once) also lets a failure name its block.
pub(super) fn hints<'f>(f: &'f mut FileState, tx: &mut Tx) -> Result<&'f RArr> {
    let ts = f.tree;
    if !is_current(f) {
        let arr = read_hints(f, tx, &ts)?;
        set_index(f, ts, false, arr)?;
    }
    Ok(&f.rtree.as_ref().expect("set").arr)
}

/// Whether the state's index of RTree's leaves is the current tree's ([`hints`] then
/// reads nothing).
pub(super) fn is_current(f: &FileState) -> bool {
    matches!(&f.rtree, Some(idx) if idx.state == Some(f.tree))
}

/// [`hints`] for a read that holds the state shared: the cached index when current, else
/// read (and not kept: [`crate::scheme::Scheme::prepare_read`] keeps it).
pub(super) fn hints_of(f: &FileState, tx: &mut Tx) -> Result<RArr> {
    match &f.rtree {
        Some(idx) if idx.state == Some(f.tree) => Ok(idx.arr.clone()),
        _ => read_hints(f, tx, &f.tree),
    }
}

fn read_hints(f: &FileState, tx: &mut Tx, ts: &TreeState) -> Result<RArr> {
    let leaves = read_leaves(f, tx, ts)?;
    let mut arr = RArr::new();
    for l in &leaves {
        let i = leaf_index(l);
        if arr.search_offset(i).is_none() {
            arr.push(i);
        } else {
            // Keep positions aligned with the leaves; a duplicate is never a valid hint.
            arr.items.push(u64::MAX);
        }
    }
    Ok(arr)
}

/// RArr for a **write** (Update / Append / Delete need "i has no leaf" to be true, not
/// just a hint): reads all m leaves once per open file, checks that they hash to the
/// trusted root and name distinct written blocks of the file.
pub(super) fn verified<'f>(env: &Env, f: &'f mut FileState, tx: &mut Tx) -> Result<&'f RArr> {
    let ts = f.tree;
    let done = matches!(&f.rtree, Some(idx) if idx.state == Some(ts) && idx.complete);
    if !done {
        let arr = read_verified(env, f, tx, &ts)?;
        set_index(f, ts, true, arr)?;
    }
    Ok(&f.rtree.as_ref().expect("set").arr)
}

fn set_index(f: &mut FileState, ts: TreeState, complete: bool, arr: RArr) -> Result<()> {
    let idx = f
        .rtree
        .as_mut()
        .ok_or_else(|| Error::Invalid("internal: no RTree index for this scheme".into()))?;
    idx.state = Some(ts);
    idx.complete = complete;
    idx.arr = arr;
    Ok(())
}

/// Records the new tree state and RArr after a successful operation.
pub(super) fn commit(f: &mut FileState, ts: TreeState, arr: RArr) {
    f.tree = ts;
    if let Some(idx) = f.rtree.as_mut() {
        idx.arr = arr;
        idx.state = Some(ts);
        idx.complete = true;
    }
}

/// The m stored leaves of RTree (untrusted).
fn read_leaves(f: &FileState, tx: &mut Tx, ts: &TreeState) -> Result<Vec<Hash>> {
    let m = ts.leaves;
    if m == 0 {
        return Ok(Vec::new());
    }
    if m > f.ctrs.blocks() {
        return Err(Error::tampered(
            f.subject.clone(),
            None,
            "RTree has more leaves than the file has blocks",
        ));
    }
    let nodes = 2 * m - 1;
    let mut leaves: Vec<Hash> = Vec::with_capacity(m as usize);
    const CHUNK: u64 = 1 << 16;
    let mut buf = vec![0u8; (CHUNK.min(nodes) * 32) as usize];
    let mut at = 0u64;
    while at < nodes {
        let k = CHUNK.min(nodes - at);
        let b = &mut buf[..(k * 32) as usize];
        tx.read_at(&f.names.meta, at * 32, b)?;
        for (j, node) in b.chunks_exact(32).enumerate() {
            if (at + j as u64).is_multiple_of(2) {
                leaves.push(node.try_into().expect("32 bytes"));
            }
        }
        at += k;
    }
    Ok(leaves)
}

fn read_verified(env: &Env, f: &FileState, tx: &mut Tx, ts: &TreeState) -> Result<RArr> {
    let leaves = read_leaves(f, tx, ts)?;
    if leaves.is_empty() {
        return Ok(RArr::new());
    }
    let tree = MtEint::tree(env, f);
    if tree.root_of(&leaves) != ts.root {
        return Err(Error::tampered(
            f.subject.clone(),
            None,
            "RTree leaves do not match the trusted root",
        ));
    }
    let items: Vec<u64> = leaves.iter().map(leaf_index).collect();
    let arr = RArr::from_items(items)
        .ok_or_else(|| Error::tampered(f.subject.clone(), None, "RArr lists a block twice"))?;
    for &i in arr.items() {
        if f.ctrs.get(i) == 0 {
            return Err(f.tampered(i, "RTree has a leaf for a hole or a block past the end"));
        }
    }
    Ok(arr)
}

/// CheckTree for a set of (leaf position, computed leaf, block) triples: sorts them into
/// contiguous runs of positions and verifies each run against the trusted root.
///
/// `failed` is the first block (and reason) the caller already found bad without a leaf;
/// the error names the lowest bad block of the batch.
pub(super) fn verify_leaves(
    env: &Env,
    f: &FileState,
    tx: &mut Tx,
    mut checks: Vec<(u64, Hash, u64)>,
    failed: Option<(u64, &'static str)>,
) -> Result<()> {
    let tree = MtEint::tree(env, f);
    let mut io = Nodes::new(tx, &f.names.meta);
    // Each block against its stored leaf first, so that a failure names the block (a
    // replayed block with its old tree would otherwise fail on a neighbour's path).
    let mut first_bad = failed;
    for c in &checks {
        if first_bad.is_some_and(|(b, _)| b < c.2) {
            break;
        }
        let stored = tree
            .stored_leaves(&mut io, c.0, 1)
            .map_err(|e| MtEint::tree_err(f, e))?;
        if !crate::crypto::ct_eq(&stored[0], &c.1) {
            first_bad = Some((c.2, "block does not match its RTree leaf"));
            break;
        }
    }
    if let Some((b, what)) = first_bad {
        return Err(f.tampered(b, what));
    }
    checks.sort_by_key(|c| c.0);
    let mut s = 0;
    while s < checks.len() {
        let mut e = s + 1;
        while e < checks.len() && checks[e].0 == checks[e - 1].0 + 1 {
            e += 1;
        }
        let leaves: Vec<Hash> = checks[s..e].iter().map(|c| c.1).collect();
        if let Err(err) = tree.verify(&f.tree, &mut io, checks[s].0, &leaves) {
            if !matches!(err, crate::tree::TreeError::Mismatch { .. }) {
                return Err(MtEint::tree_err(f, err));
            }
            // Name the first block whose own leaf fails.
            for c in &checks[s..e] {
                if tree.verify(&f.tree, &mut io, c.0, &[c.1]).is_err() {
                    return Err(f.tampered(c.2, "block does not match its RTree leaf"));
                }
            }
            return Err(f.tampered(checks[s].2, "RTree path does not match the trusted root"));
        }
        s = e;
    }
    Ok(())
}

/// Delete (Fig. 8/10) generalised to truncation, and extension with holes (which have no
/// leaf: a hole reads as zeros by its trusted counter 0). Shared by RAND-EINT and COMP-EINT.
pub(super) fn resize(env: &Env, f: &mut FileState, tx: &mut Tx, blocks: u64) -> Result<()> {
    super::check_limit(blocks)?;
    let n = f.blocks();
    if blocks < n {
        let arr = verified(env, f, tx)?.clone();
        let mut plan = Plan::new(&arr);
        let gone: Vec<u64> = arr
            .items()
            .iter()
            .copied()
            .filter(|&i| i >= blocks)
            .collect();
        for i in gone {
            plan.remove(i);
        }
        let ts = f.tree;
        let (ts, arr) = plan.apply(env, f, tx, &ts)?;
        tx.set_len(&f.names.data, blocks * env.bs as u64)?;
        commit(f, ts, arr);
        f.ctr_hw = f.ctr_hw.max(f.ctrs.max_in(blocks, n - blocks));
        f.ctrs.truncate(blocks);
    } else if blocks > n {
        f.ctrs.extend(blocks);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fig. 9 by hand: RArr = [3, 7, 9, 12]; deleting 7 moves the last (12) into position 1;
    /// deleting 12 then (now at position 1) moves 9 there; deleting the last needs no move.
    #[test]
    fn del_offset_moves_last_into_hole() {
        let mut a = RArr::from_items(vec![3, 7, 9, 12]).unwrap();
        assert_eq!(
            a.del_offset(7),
            Some(DelOffset {
                pos: 1,
                moved: Some(12)
            })
        );
        assert_eq!(a.items(), &[3, 12, 9]);
        assert_eq!(a.search_offset(12), Some(1));
        assert_eq!(a.search_offset(7), None);
        assert_eq!(
            a.del_offset(12),
            Some(DelOffset {
                pos: 1,
                moved: Some(9)
            })
        );
        assert_eq!(a.items(), &[3, 9]);
        assert_eq!(
            a.del_offset(9),
            Some(DelOffset {
                pos: 1,
                moved: None
            })
        );
        assert_eq!(a.items(), &[3]);
        assert_eq!(a.del_offset(5), None);
        assert!(RArr::from_items(vec![1, 2, 1]).is_none());
    }

    /// An empty RArr says so; one with an index does not.
    #[test]
    fn empty_is_no_items() {
        assert!(RArr::new().is_empty());
        let a = RArr::from_items(vec![4]).unwrap();
        assert!(!a.is_empty());
        assert_eq!(a.len(), 1);
    }
}
