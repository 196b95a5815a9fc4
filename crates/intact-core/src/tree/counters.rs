//! Block write counters stored as counter intervals (Oprea–Reiter 2006, §4.2, Fig. 6).
//!
//! A counter interval is a run of consecutive blocks sharing one write counter. The intervals
//! are the two arrays `IntStart_F` (first block of each interval) and `CtrVal_F` (its
//! counter). Counter 0 means "never written" (a hole). The trusted storage holds the arrays
//! themselves when they fit in `L_ctr` bytes, else their hashes (and the arrays go to `US_F`).

use super::merkle::Hash;

/// Errors of counter authentication and decoding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CounterError {
    /// The untrusted copy of the counters does not match the trusted hashes or counts.
    #[error("counter intervals do not match their trusted authentication data")]
    Mismatch,
    /// An encoding is malformed (wrong length or broken invariant).
    #[error("malformed counter intervals: {0}")]
    Malformed(String),
}

fn malformed(msg: &str) -> CounterError {
    CounterError::Malformed(msg.to_owned())
}

/// Write counters of a file's blocks as intervals: `IntStart_F` and `CtrVal_F`. Counter 0
/// means "never written" (a hole).
///
/// Invariants: `starts` strictly increasing, `starts[0] == 0` when `blocks > 0`, adjacent
/// intervals have different counters, all starts `< blocks`; empty when `blocks == 0`.
#[derive(Clone, Debug, Default)]
pub struct CounterIntervals {
    starts: Vec<u64>,
    ctrs: Vec<u64>,
    blocks: u64,
    /// Blocks with counter 0 (holes), kept as the intervals change, so that a file's count
    /// of stored blocks (its `st_blocks`, asked at every `stat`) costs nothing however
    /// many intervals it has (derived from the value: equality ignores it).
    holes: u64,
    /// The segments ([`SEG_BLOCKS`]) changed since [`CounterIntervals::take_touched`], as
    /// half-open ranges of segment numbers (not part of the value: equality ignores it).
    touched: Vec<(u64, u64)>,
}

impl PartialEq for CounterIntervals {
    fn eq(&self, other: &Self) -> bool {
        self.blocks == other.blocks && self.starts == other.starts && self.ctrs == other.ctrs
    }
}

impl Eq for CounterIntervals {}

/// Blocks per segment of the segmented form of spilled counters (docs/file-format.md
/// §9.2): a write re-encodes and re-hashes the segments it changed, not every interval.
pub const SEG_BLOCKS: u64 = 4096;

/// Bytes from one segment to the next in `.c`: room for a segment's encoding when each of
/// its blocks is an interval (12 + 16 · 4,096 bytes), rounded up to 4 KiB. What a segment
/// does not use stays a hole.
pub const SEG_STRIDE: u64 = 69_632;

/// Spilled counters of more intervals than this are kept in segments (on volumes with
/// [`crate::format::CTR_SEGMENTS`]); the arrays of fewer, at most 64 KiB, stay whole.
pub const SEG_MIN_INTERVALS: usize = 4096;

/// A file goes to segments only with at least this many intervals a segment, on average:
/// each segment takes a place of its own in `.c` (a 4 KiB page at least), so a large sparse
/// file with few intervals keeps them whole (at most 16 · 4,096 intervals' worth of work a
/// write for a file that spans 4,096 segments, 16 GiB at 4 KiB blocks).
pub const SEG_ENTER_PER_SEGMENT: usize = 16;

/// A file in segments goes back to whole arrays below this many intervals a segment, on
/// average (4 times fewer than to enter: a file near the bound does not go back and forth).
pub const SEG_KEEP_PER_SEGMENT: usize = 4;

/// Whether spilled counters of `intervals` intervals over `segments` segments are kept in
/// segments, given whether they are now: more than [`SEG_MIN_INTERVALS`] and
/// [`SEG_ENTER_PER_SEGMENT`] a segment to go there, [`SEG_KEEP_PER_SEGMENT`] a segment to
/// stay. A writer's choice: a reader takes either form.
pub fn use_segments(intervals: usize, segments: u64, now: bool) -> bool {
    let per = |k: usize| (intervals as u64) >= segments.saturating_mul(k as u64);
    if now {
        per(SEG_KEEP_PER_SEGMENT)
    } else {
        intervals > SEG_MIN_INTERVALS && per(SEG_ENTER_PER_SEGMENT)
    }
}

/// Segment hashes per group (the groups' hashes are hashed into the trusted part).
pub const SEG_GROUP: usize = 256;

/// Touched ranges kept apart before they are joined into one span.
const TOUCHED_MAX: usize = 32;

/// The segment numbers of [`CounterIntervals::take_touched`]'s ranges, sorted, each once.
pub fn touched_list(ranges: &[(u64, u64)]) -> Vec<u64> {
    let mut out: Vec<u64> = ranges.iter().flat_map(|&(lo, hi)| lo..hi).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// One step of [`CounterIntervals::edits_from`], on the object that holds the encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterEdit {
    /// `len` bytes from `src` to `dst`, as `memmove`.
    Copy {
        /// Where they are.
        src: u64,
        /// Where they go.
        dst: u64,
        /// How many.
        len: u64,
    },
    /// Bytes at `off`.
    Write {
        /// Offset.
        off: u64,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// The object's length.
    SetLen(u64),
}

impl CounterEdit {
    /// Applies the edit to `obj`, as an object would be changed (a write past the end
    /// grows it with zeros). False, with `obj` unchanged, when a move reads past its end.
    pub fn apply(&self, obj: &mut Vec<u8>) -> bool {
        let put = |obj: &mut Vec<u8>, off: usize, b: &[u8]| {
            if obj.len() < off + b.len() {
                obj.resize(off + b.len(), 0);
            }
            obj[off..off + b.len()].copy_from_slice(b);
        };
        match self {
            CounterEdit::Copy { src, dst, len } => {
                let (src, len) = (*src as usize, *len as usize);
                let Some(b) = obj.get(src..src.saturating_add(len)).map(<[u8]>::to_vec) else {
                    return false;
                };
                put(obj, *dst as usize, &b);
            }
            CounterEdit::Write { off, bytes } => put(obj, *off as usize, bytes),
            CounterEdit::SetLen(n) => obj.resize(*n as usize, 0),
        }
        true
    }
}

/// Fixed header of the encoding: u32 interval count and u64 block count.
const HEADER: usize = 12;

impl CounterIntervals {
    /// No blocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of blocks covered.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Number of blocks with a counter other than 0 (not holes), in O(1).
    pub fn stored(&self) -> u64 {
        self.blocks - self.holes
    }

    /// Number of intervals.
    pub fn intervals(&self) -> usize {
        self.starts.len()
    }

    /// The interval starts (`IntStart_F`).
    pub fn starts(&self) -> &[u64] {
        &self.starts
    }

    /// The interval counters (`CtrVal_F`).
    pub fn ctrs(&self) -> &[u64] {
        &self.ctrs
    }

    /// Index of the interval containing block `i < blocks`.
    fn interval_of(&self, i: u64) -> usize {
        self.starts.partition_point(|&s| s <= i) - 1
    }

    /// `get_ctr`: the counter of block `i` (0 for holes and for `i >= blocks`).
    pub fn get(&self, i: u64) -> u64 {
        if i >= self.blocks {
            return 0;
        }
        self.ctrs[self.interval_of(i)]
    }

    /// Removes interval `k` if it has the same counter as interval `k - 1`.
    fn merge_at(&mut self, k: usize) {
        if k > 0 && k < self.ctrs.len() && self.ctrs[k] == self.ctrs[k - 1] {
            self.starts.remove(k);
            self.ctrs.remove(k);
        }
    }

    /// `update_ctr` for a run: sets the counter of blocks `[first, first + count)` to `ctr`,
    /// extending the file if needed (blocks in a gap get counter 0) and merging equal
    /// neighbours. `count == 0` does nothing.
    pub fn set_range(&mut self, first: u64, count: u64, ctr: u64) {
        if count == 0 {
            return;
        }
        let end = first.saturating_add(count);
        // A gap before `first` becomes a hole (nothing when there is none).
        self.extend(first);
        self.touch(first, end);
        let was_holes = self.holes_in(first, end);
        self.holes = self.holes - was_holes + if ctr == 0 { count } else { 0 };
        let tail = (end < self.blocks).then(|| self.get(end));
        let lo = self.starts.partition_point(|&s| s < first);
        let hi = self.starts.partition_point(|&s| s <= end);
        let (ns, nc): (&[u64], &[u64]) = match tail {
            Some(t) => (&[first, end], &[ctr, t]),
            None => (&[first], &[ctr]),
        };
        self.starts.splice(lo..hi, ns.iter().copied());
        self.ctrs.splice(lo..hi, nc.iter().copied());
        self.blocks = self.blocks.max(end);
        // Only the new interval can equal a neighbour. The tail (at `lo + 1`) has the
        // counter of the old interval that held `end`, which already differed from the
        // interval after it.
        self.merge_at(lo + 1);
        self.merge_at(lo);
    }

    /// `del_ctr` for every block `>= blocks`.
    pub fn truncate(&mut self, blocks: u64) {
        if blocks >= self.blocks {
            return;
        }
        // The segments of the blocks cut, and the one that now ends the file (shorter).
        self.touch(blocks.saturating_sub(1), self.blocks);
        self.holes -= self.holes_in(blocks, self.blocks);
        let k = self.starts.partition_point(|&s| s < blocks);
        self.starts.truncate(k);
        self.ctrs.truncate(k);
        self.blocks = blocks;
    }

    /// Grows to `blocks` blocks with holes (counter 0); never shrinks.
    pub fn extend(&mut self, blocks: u64) {
        if blocks <= self.blocks {
            return;
        }
        // The new blocks' segments, from the one that held the last block if it was not
        // full (a full segment does not change).
        self.touch(self.blocks, blocks);
        self.holes += blocks - self.blocks;
        if self.ctrs.last() != Some(&0) {
            self.starts.push(self.blocks);
            self.ctrs.push(0);
        }
        self.blocks = blocks;
    }

    /// Holes among the blocks `[first, end)` that exist (in the intervals that cover them).
    fn holes_in(&self, first: u64, end: u64) -> u64 {
        let end = end.min(self.blocks);
        if first >= end {
            return 0;
        }
        self.runs(first, end - first)
            .filter(|r| r.2 == 0)
            .map(|r| r.1)
            .sum()
    }

    /// Maximum counter over the blocks `[first, first + count)` (0 if empty).
    pub fn max_in(&self, first: u64, count: u64) -> u64 {
        self.runs(first, count).map(|r| r.2).max().unwrap_or(0)
    }

    /// Maximum counter over all blocks.
    pub fn max_all(&self) -> u64 {
        self.ctrs.iter().copied().max().unwrap_or(0)
    }

    /// Runs `(first, count, ctr)` covering `[first, first + count)`, in order; blocks past
    /// the end are reported as one run with counter 0.
    pub fn runs(&self, first: u64, count: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let end = first.saturating_add(count);
        let mut pos = first;
        let mut k = if first < self.blocks {
            self.interval_of(first)
        } else {
            self.starts.len()
        };
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            if pos >= self.blocks {
                let r = (pos, end - pos, 0);
                pos = end;
                return Some(r);
            }
            let iend = self
                .starts
                .get(k + 1)
                .copied()
                .unwrap_or(self.blocks)
                .min(end);
            let r = (pos, iend - pos, self.ctrs[k]);
            pos = iend;
            k += 1;
            Some(r)
        })
    }

    /// Marks the segments that hold blocks `[lo, hi)` as changed.
    fn touch(&mut self, lo: u64, hi: u64) {
        if lo >= hi {
            return;
        }
        let r = (lo / SEG_BLOCKS, (hi - 1) / SEG_BLOCKS + 1);
        match self.touched.last_mut() {
            Some(last) if r.0 <= last.1 && last.0 <= r.1 => {
                *last = (last.0.min(r.0), last.1.max(r.1));
            }
            _ => self.touched.push(r),
        }
        if self.touched.len() > TOUCHED_MAX {
            let lo = self.touched.iter().map(|t| t.0).min().expect("touched");
            let hi = self.touched.iter().map(|t| t.1).max().expect("touched");
            self.touched = vec![(lo, hi)];
        }
    }

    /// The segments changed since the last call (by [`set_range`](Self::set_range),
    /// [`truncate`](Self::truncate) and [`extend`](Self::extend)), as at most a few dozen
    /// half-open ranges of segment numbers (they may overlap), cut at the end. Taking them
    /// costs nothing for a file whose counters are not in segments, however far it grew;
    /// [`touched_list`] lists them.
    pub fn take_touched(&mut self) -> Vec<(u64, u64)> {
        let n = self.segments();
        std::mem::take(&mut self.touched)
            .into_iter()
            .map(|(lo, hi)| (lo.min(n), hi.min(n)))
            .filter(|(lo, hi)| lo < hi)
            .collect()
    }

    /// Number of segments: `ceil(blocks / SEG_BLOCKS)`.
    pub fn segments(&self) -> u64 {
        self.blocks.div_ceil(SEG_BLOCKS)
    }

    /// Segment `k`: the blocks `[k · SEG_BLOCKS, min((k + 1) · SEG_BLOCKS, blocks))` as
    /// counter intervals of their own (block 0 is the segment's first). Empty past the end.
    pub fn segment(&self, k: u64) -> CounterIntervals {
        let first = k.saturating_mul(SEG_BLOCKS);
        let end = first.saturating_add(SEG_BLOCKS).min(self.blocks);
        if first >= end {
            return CounterIntervals::new();
        }
        let lo = self.interval_of(first);
        let hi = self.starts.partition_point(|&s| s < end);
        CounterIntervals {
            starts: self.starts[lo..hi]
                .iter()
                .map(|&s| s.max(first) - first)
                .collect(),
            ctrs: self.ctrs[lo..hi].to_vec(),
            blocks: end - first,
            holes: self.holes_in(first, end),
            touched: Vec::new(),
        }
    }

    /// The counters whose segments ([`segment`](Self::segment)) are `segs`, in order: every
    /// one [`SEG_BLOCKS`] long but the last (1 to `SEG_BLOCKS`), each valid on its own.
    pub fn from_segments(segs: &[CounterIntervals]) -> Result<Self, CounterError> {
        let mut out = CounterIntervals::new();
        for (k, seg) in segs.iter().enumerate() {
            let last = k + 1 == segs.len();
            if seg.blocks == 0 || seg.blocks > SEG_BLOCKS || (!last && seg.blocks != SEG_BLOCKS) {
                return Err(malformed("segment of the wrong length"));
            }
            let base = k as u64 * SEG_BLOCKS;
            for (&s, &c) in seg.starts.iter().zip(&seg.ctrs) {
                // A run that goes on from the segment before is one interval.
                if s == 0 && out.ctrs.last() == Some(&c) {
                    continue;
                }
                out.starts.push(base + s);
                out.ctrs.push(c);
            }
            out.blocks = base + seg.blocks;
            out.holes += seg.holes;
        }
        Ok(out)
    }

    /// Size in bytes of `IntStart_F` plus `CtrVal_F` (the paper's `size`).
    pub fn arrays_size(&self) -> usize {
        16 * self.starts.len()
    }

    /// Encoding: u32 LE number of intervals, u64 LE blocks, then the starts (u64 LE each),
    /// then the counters (u64 LE each).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.arrays_size());
        out.extend_from_slice(&(self.starts.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.blocks.to_le_bytes());
        put_u64s(&mut out, &self.starts);
        put_u64s(&mut out, &self.ctrs);
        out
    }

    /// Builds from parts, validating every invariant.
    pub fn from_parts(starts: Vec<u64>, ctrs: Vec<u64>, blocks: u64) -> Result<Self, CounterError> {
        if starts.len() != ctrs.len() {
            return Err(malformed("array lengths differ"));
        }
        if (blocks == 0) != starts.is_empty() {
            return Err(malformed("interval count inconsistent with block count"));
        }
        if let Some(&s0) = starts.first() {
            if s0 != 0 {
                return Err(malformed("first interval does not start at block 0"));
            }
        }
        if starts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(malformed("interval starts not strictly increasing"));
        }
        if starts.last().is_some_and(|&s| s >= blocks) {
            return Err(malformed("interval starts past the last block"));
        }
        if ctrs.windows(2).any(|w| w[0] == w[1]) {
            return Err(malformed("adjacent intervals with equal counters"));
        }
        let mut c = CounterIntervals {
            starts,
            ctrs,
            blocks,
            holes: 0,
            touched: Vec::new(),
        };
        c.holes = c.holes_in(0, blocks);
        Ok(c)
    }

    /// Decodes [`encode`](Self::encode)'s form, validating every invariant; never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, CounterError> {
        if bytes.len() < HEADER {
            return Err(malformed("truncated header"));
        }
        let count = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
        let blocks = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
        let body = &bytes[HEADER..];
        if (body.len() as u64) != 16 * count as u64 {
            return Err(malformed("length does not match interval count"));
        }
        let (s, c) = body.split_at(8 * count);
        Self::from_parts(read_u64s(s), read_u64s(c), blocks)
    }

    /// The edits that turn the encoding of `old` ([`encode`](Self::encode)), as an object
    /// holds it, into the encoding of `self`, in that order: moves of the runs of intervals
    /// the two share (as `memmove`, reading the object as the earlier edits left it),
    /// writes of the header and of the intervals that differ (each part that changed), and the
    /// final length.
    ///
    /// A random write of one block splits an interval in three: the arrays grow by two
    /// entries at one place, and every later entry, and the whole counter array, moves
    /// (the layout is `header | starts | counters`). Written whole, as before, the spilled
    /// arrays of a file of 14,000 intervals put 224 KB into the log at every such write;
    /// these edits say the same in a few dozen bytes (docs/design.md, "Counters in the
    /// log"). The moves' order keeps every source intact until it is read: growing, from
    /// the highest destination down; shrinking, from the lowest up.
    pub fn edits_from(&self, old: &CounterIntervals) -> Vec<CounterEdit> {
        let (n, m) = (old.starts.len(), self.starts.len());
        // The longest run of leading intervals the two share, then of trailing ones among
        // the rest (an interval is shared when its start and its counter both are).
        let p = common_prefix(&old.starts, &self.starts).min(common_prefix(&old.ctrs, &self.ctrs));
        let q = common_suffix(&old.starts[p..], &self.starts[p..])
            .min(common_suffix(&old.ctrs[p..], &self.ctrs[p..]));
        // Byte offsets: `starts[i]`, and `ctrs[i]` in a layout of `c` intervals.
        let at_s = |i: usize| (HEADER + 8 * i) as u64;
        let at_c = |c: usize, i: usize| (HEADER + 8 * c + 8 * i) as u64;
        // The counters' tail, the counters' head, the starts' tail.
        let mut moves = [
            (at_c(n, n - q), at_c(m, m - q), 8 * q as u64),
            (at_c(n, 0), at_c(m, 0), 8 * p as u64),
            (at_s(n - q), at_s(m - q), 8 * q as u64),
        ];
        if m < n {
            moves.reverse();
        }
        let mut edits: Vec<CounterEdit> = moves
            .into_iter()
            .filter(|&(src, dst, len)| len > 0 && src != dst)
            .map(|(src, dst, len)| CounterEdit::Copy { src, dst, len })
            .collect();
        // The header, unless the object holds it already (the same count and blocks: most
        // overwrites change a counter in place).
        if m != n || self.blocks != old.blocks {
            let mut header = Vec::with_capacity(HEADER);
            header.extend_from_slice(&(m as u32).to_le_bytes());
            header.extend_from_slice(&self.blocks.to_le_bytes());
            edits.push(CounterEdit::Write {
                off: 0,
                bytes: header,
            });
        }
        let mid = p..m - q;
        if !mid.is_empty() {
            let bytes = |v: &[u64]| {
                let mut out = Vec::with_capacity(8 * v.len());
                put_u64s(&mut out, v);
                out
            };
            // The starts, unless they stay where they were (a counter changed in place).
            if m != n || old.starts[mid.clone()] != self.starts[mid.clone()] {
                edits.push(CounterEdit::Write {
                    off: at_s(p),
                    bytes: bytes(&self.starts[mid.clone()]),
                });
            }
            edits.push(CounterEdit::Write {
                off: at_c(m, p),
                bytes: bytes(&self.ctrs[mid]),
            });
        }
        edits.push(CounterEdit::SetLen((HEADER + self.arrays_size()) as u64));
        edits
    }

    /// `IntStart_F` as bytes (u64 LE each).
    pub fn starts_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * self.starts.len());
        put_u64s(&mut out, &self.starts);
        out
    }

    /// `CtrVal_F` as bytes (u64 LE each).
    pub fn ctrs_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * self.ctrs.len());
        put_u64s(&mut out, &self.ctrs);
        out
    }
}

/// Appends `v` as u64 LE values. Writing into bytes already there, eight at a time, is
/// several times faster than extending by an iterator of bytes: a spilled file's arrays
/// are converted at every write that changes them (`perf`, docs/performance.md, "Random
/// writes and the spilled counters").
fn put_u64s(out: &mut Vec<u8>, v: &[u64]) {
    let at = out.len();
    out.resize(at + 8 * v.len(), 0);
    for (d, x) in out[at..].chunks_exact_mut(8).zip(v) {
        d.copy_from_slice(&x.to_le_bytes());
    }
}

/// Elements per comparison of [`common_prefix`] and [`common_suffix`]: whole runs compared
/// as slices (a `memcmp`) before the one that differs is looked into.
const RUN: usize = 64;

/// Length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    let n = a.len().min(b.len());
    let mut p = 0;
    while p + RUN <= n && a[p..p + RUN] == b[p..p + RUN] {
        p += RUN;
    }
    while p < n && a[p] == b[p] {
        p += 1;
    }
    p
}

/// Length of the longest common suffix of `a` and `b`.
fn common_suffix(a: &[u64], b: &[u64]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut q = 0;
    while q + RUN <= n && a[n - q - RUN..n - q] == b[n - q - RUN..n - q] {
        q += RUN;
    }
    while q < n && a[n - 1 - q] == b[n - 1 - q] {
        q += 1;
    }
    q
}

fn read_u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Trusted part of the counters (Fig. 6): inline when `IntStart.size + CtrVal.size <= L_ctr`,
/// else the two hashes (and the untrusted copy in `US_F`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrustedCounters {
    /// The intervals themselves.
    Inline(CounterIntervals),
    /// Hashes of the arrays stored in `US_F`, with their counts.
    Spilled {
        /// Number of intervals.
        intervals: u32,
        /// Number of blocks.
        blocks: u64,
        /// `h(IntStart_F)`.
        h_starts: Hash,
        /// `h(CtrVal_F)`.
        h_ctrs: Hash,
    },
    /// The segmented form (docs/file-format.md §9.2): the counters' segments in `US_F`,
    /// hashed one by one, in groups, and the groups' hashes into `h_top`
    /// ([`SegHashes`]). A write changes the hashes of the segments it touched.
    Segmented {
        /// Number of intervals.
        intervals: u32,
        /// Number of blocks.
        blocks: u64,
        /// [`SegHashes::top`].
        h_top: Hash,
    },
}

/// The hashes of a file's counters in segments (docs/file-format.md §9.2), kept by the
/// writer so that a change re-hashes the segments it touched, their groups and the top,
/// not every segment. `h` is the caller's keyed hash of the parts (the first is the
/// label: `cseg`, `cgrp` or `ctop`; domain separation by file is the caller's).
#[derive(Clone, Debug, Default)]
pub struct SegHashes {
    seg: Vec<Hash>,
    grp: Vec<Hash>,
    /// Groups whose hash is to be computed again.
    stale: Vec<usize>,
}

impl SegHashes {
    /// The hashes of every segment of `c`, computed afresh.
    pub fn of(c: &CounterIntervals, h: &dyn Fn(&[&[u8]]) -> Hash) -> SegHashes {
        let mut out = SegHashes::default();
        for k in 0..c.segments() {
            out.set(k, &c.segment(k).encode(), h);
        }
        out
    }

    /// Number of segments.
    pub fn segments(&self) -> u64 {
        self.seg.len() as u64
    }

    /// Sets segment `k`'s hash from its encoding (`k <= segments()`: the next is added).
    pub fn set(&mut self, k: u64, enc: &[u8], h: &dyn Fn(&[&[u8]]) -> Hash) {
        let k = usize::try_from(k).expect("segment number fits");
        let v = h(&[b"cseg", &(k as u64).to_le_bytes(), enc]);
        match k.cmp(&self.seg.len()) {
            std::cmp::Ordering::Less => self.seg[k] = v,
            std::cmp::Ordering::Equal => self.seg.push(v),
            std::cmp::Ordering::Greater => panic!("segment {k} set before {}", self.seg.len()),
        }
        self.stale.push(k / SEG_GROUP);
    }

    /// Keeps the first `n` segments.
    pub fn truncate(&mut self, n: u64) {
        let n = usize::try_from(n).expect("segment count fits");
        if n < self.seg.len() {
            self.seg.truncate(n);
            self.grp.truncate(n.div_ceil(SEG_GROUP));
            if n > 0 {
                self.stale.push((n - 1) / SEG_GROUP);
            }
        }
    }

    /// `h_top`: the hash of the groups' hashes, each the hash of its segments' (computed
    /// again for the groups changed since the last call).
    pub fn top(&mut self, h: &dyn Fn(&[&[u8]]) -> Hash) -> Hash {
        let groups = self.seg.len().div_ceil(SEG_GROUP);
        self.grp.resize(groups, [0; 32]);
        let mut stale = std::mem::take(&mut self.stale);
        stale.sort_unstable();
        stale.dedup();
        for g in stale.into_iter().filter(|&g| g < groups) {
            let segs = &self.seg[g * SEG_GROUP..((g + 1) * SEG_GROUP).min(self.seg.len())];
            let at = (g as u64).to_le_bytes();
            let mut parts: Vec<&[u8]> = vec![b"cgrp", &at];
            parts.extend(segs.iter().map(|x| x.as_slice()));
            self.grp[g] = h(&parts);
        }
        let mut parts: Vec<&[u8]> = vec![b"ctop"];
        parts.extend(self.grp.iter().map(|x| x.as_slice()));
        h(&parts)
    }
}

/// Size of the spilled fixed form: tag, count, blocks, two hashes.
const SPILLED_SIZE: usize = 1 + HEADER + 64;

/// Size of the segmented fixed form: tag, count, blocks, one hash.
const SEGMENTED_SIZE: usize = 1 + HEADER + 32;

/// Fixed size of [`TrustedCounters::encode_into`]'s form for a given `L_ctr`.
pub const fn trusted_size(l_ctr: usize) -> usize {
    let inline = 1 + HEADER + (l_ctr / 16) * 16;
    if inline > SPILLED_SIZE {
        inline
    } else {
        SPILLED_SIZE
    }
}

impl TrustedCounters {
    /// Writes the fixed-size form into `out` (which must hold at least the encoded size, e.g.
    /// `trusted_size(l_ctr)` for counters produced by [`auth_ctr`] with that `l_ctr`); the
    /// rest of `out` is zeroed. Byte 0 is 0 (inline) or 1 (spilled); then u32 LE count, u64
    /// LE blocks, then (start, ctr) u64 LE pairs (inline) or `h_starts`, `h_ctrs` (spilled).
    pub fn encode_into(&self, out: &mut [u8]) -> Result<(), CounterError> {
        let need = match self {
            TrustedCounters::Inline(c) => 1 + HEADER + c.arrays_size(),
            TrustedCounters::Spilled { .. } => SPILLED_SIZE,
            TrustedCounters::Segmented { .. } => SEGMENTED_SIZE,
        };
        if out.len() < need {
            return Err(malformed("trusted counter slot too small"));
        }
        out.fill(0);
        match self {
            TrustedCounters::Inline(c) => {
                out[1..5].copy_from_slice(&(c.starts.len() as u32).to_le_bytes());
                out[5..13].copy_from_slice(&c.blocks.to_le_bytes());
                for (j, (s, v)) in c.starts.iter().zip(&c.ctrs).enumerate() {
                    let o = 13 + 16 * j;
                    out[o..o + 8].copy_from_slice(&s.to_le_bytes());
                    out[o + 8..o + 16].copy_from_slice(&v.to_le_bytes());
                }
            }
            TrustedCounters::Spilled {
                intervals,
                blocks,
                h_starts,
                h_ctrs,
            } => {
                out[0] = 1;
                out[1..5].copy_from_slice(&intervals.to_le_bytes());
                out[5..13].copy_from_slice(&blocks.to_le_bytes());
                out[13..45].copy_from_slice(h_starts);
                out[45..77].copy_from_slice(h_ctrs);
            }
            TrustedCounters::Segmented {
                intervals,
                blocks,
                h_top,
            } => {
                out[0] = 2;
                out[1..5].copy_from_slice(&intervals.to_le_bytes());
                out[5..13].copy_from_slice(&blocks.to_le_bytes());
                out[13..45].copy_from_slice(h_top);
            }
        }
        Ok(())
    }

    /// Decodes the fixed-size form (trailing bytes are ignored); never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, CounterError> {
        if bytes.len() < 1 + HEADER {
            return Err(malformed("truncated trusted counters"));
        }
        let count = u32::from_le_bytes(bytes[1..5].try_into().expect("4 bytes"));
        let blocks = u64::from_le_bytes(bytes[5..13].try_into().expect("8 bytes"));
        match bytes[0] {
            0 => {
                let n = count as usize;
                let body = &bytes[13..];
                if (body.len() as u64) < 16 * count as u64 {
                    return Err(malformed("truncated inline counters"));
                }
                let mut starts = Vec::with_capacity(n);
                let mut ctrs = Vec::with_capacity(n);
                for pair in body[..16 * n].chunks_exact(16) {
                    starts.push(u64::from_le_bytes(pair[..8].try_into().expect("8 bytes")));
                    ctrs.push(u64::from_le_bytes(pair[8..].try_into().expect("8 bytes")));
                }
                CounterIntervals::from_parts(starts, ctrs, blocks).map(TrustedCounters::Inline)
            }
            1 => {
                if bytes.len() < SPILLED_SIZE {
                    return Err(malformed("truncated spilled counters"));
                }
                if (count == 0) != (blocks == 0) || u64::from(count) > blocks {
                    return Err(malformed("inconsistent spilled counts"));
                }
                Ok(TrustedCounters::Spilled {
                    intervals: count,
                    blocks,
                    h_starts: bytes[13..45].try_into().expect("32 bytes"),
                    h_ctrs: bytes[45..77].try_into().expect("32 bytes"),
                })
            }
            2 => {
                if bytes.len() < SEGMENTED_SIZE {
                    return Err(malformed("truncated segmented counters"));
                }
                if count == 0 || blocks == 0 || u64::from(count) > blocks {
                    return Err(malformed("inconsistent segmented counts"));
                }
                Ok(TrustedCounters::Segmented {
                    intervals: count,
                    blocks,
                    h_top: bytes[13..45].try_into().expect("32 bytes"),
                })
            }
            _ => Err(malformed("unknown trusted counter tag")),
        }
    }
}

/// `auth_ctr` (Fig. 6): the trusted part and, when spilled, the bytes to store in `US_F`
/// (the [`CounterIntervals::encode`] form). `h` is a keyed hash supplied by the caller
/// (domain separation is the caller's).
pub fn auth_ctr(
    c: &CounterIntervals,
    l_ctr: usize,
    h: &dyn Fn(&[u8]) -> Hash,
) -> (TrustedCounters, Option<Vec<u8>>) {
    if c.arrays_size() <= l_ctr {
        return (TrustedCounters::Inline(c.clone()), None);
    }
    // The encoding holds both arrays as they are hashed: convert once, hash its parts.
    let bytes = c.encode();
    let (starts, ctrs) = bytes[HEADER..].split_at(8 * c.starts.len());
    let t = TrustedCounters::Spilled {
        intervals: c.starts.len() as u32,
        blocks: c.blocks,
        h_starts: h(starts),
        h_ctrs: h(ctrs),
    };
    (t, Some(bytes))
}

/// `check_ctr` (Fig. 6): the counters from the trusted part and (when spilled) the
/// untrusted bytes from `US_F`; [`CounterError::Mismatch`] when the copy is missing or its
/// hashes or counts differ.
pub fn check_ctr(
    t: &TrustedCounters,
    us: Option<&[u8]>,
    h: &dyn Fn(&[u8]) -> Hash,
) -> Result<CounterIntervals, CounterError> {
    match t {
        TrustedCounters::Inline(c) => Ok(c.clone()),
        // Checked segment by segment by the caller, which reads them ([`SegHashes`]).
        TrustedCounters::Segmented { .. } => Err(CounterError::Mismatch),
        TrustedCounters::Spilled {
            intervals,
            blocks,
            h_starts,
            h_ctrs,
        } => {
            let bytes = us.ok_or(CounterError::Mismatch)?;
            let c = CounterIntervals::decode(bytes)?;
            // `decode` checked that the arrays fill the rest exactly.
            let (starts, ctrs) = bytes[HEADER..].split_at(8 * c.starts.len());
            if c.starts.len() as u64 != u64::from(*intervals)
                || c.blocks != *blocks
                || h(starts) != *h_starts
                || h(ctrs) != *h_ctrs
            {
                return Err(CounterError::Mismatch);
            }
            Ok(c)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check_invariants(c: &CounterIntervals) {
        CounterIntervals::from_parts(c.starts.clone(), c.ctrs.clone(), c.blocks)
            .expect("invariants hold");
    }

    fn hash(b: &[u8]) -> Hash {
        *blake3::keyed_hash(&[7; 32], b).as_bytes()
    }

    #[test]
    fn sequential_writes_are_one_interval() {
        let mut c = CounterIntervals::new();
        for i in 0..100 {
            c.set_range(i, 1, 1);
        }
        assert_eq!(c.intervals(), 1);
        assert_eq!(c.blocks(), 100);
        assert_eq!(c.get(57), 1);
        assert_eq!(c.get(100), 0);
        // A second sequential pass.
        for i in 0..100 {
            c.set_range(i, 1, 2);
        }
        assert_eq!((c.intervals(), c.max_all()), (1, 2));
    }

    #[test]
    fn overwrite_middle_truncate_holes_merge() {
        let mut c = CounterIntervals::new();
        c.set_range(0, 10, 1);
        c.set_range(3, 4, 2);
        assert_eq!(c.starts(), &[0, 3, 7]);
        assert_eq!(c.ctrs(), &[1, 2, 1]);
        assert_eq!(
            c.runs(0, 12).collect::<Vec<_>>(),
            vec![(0, 3, 1), (3, 4, 2), (7, 3, 1), (10, 2, 0)]
        );
        assert_eq!(c.max_in(0, 3), 1);
        assert_eq!(c.max_in(2, 2), 2);
        // Merge of equal neighbours: overwriting the middle back to 1.
        c.set_range(3, 4, 1);
        assert_eq!(c.intervals(), 1);
        // Holes: writing past the end.
        c.set_range(15, 2, 3);
        assert_eq!(c.starts(), &[0, 10, 15]);
        assert_eq!(c.ctrs(), &[1, 0, 3]);
        assert_eq!(c.get(12), 0);
        assert_eq!(c.blocks(), 17);
        c.extend(20);
        assert_eq!(c.starts(), &[0, 10, 15, 17]);
        c.extend(25);
        assert_eq!(c.intervals(), 4);
        // Truncate.
        c.truncate(16);
        assert_eq!(c.starts(), &[0, 10, 15]);
        assert_eq!(c.blocks(), 16);
        c.truncate(10);
        assert_eq!(c.starts(), &[0]);
        c.truncate(0);
        assert_eq!(c, CounterIntervals::new());
        // Filling a hole with the neighbours' counter merges three intervals into one.
        let mut d = CounterIntervals::new();
        d.set_range(0, 2, 5);
        d.set_range(4, 2, 5);
        assert_eq!(d.ctrs(), &[5, 0, 5]);
        d.set_range(2, 2, 5);
        assert_eq!((d.starts(), d.ctrs()), (&[0u64][..], &[5u64][..]));
        check_invariants(&d);
    }

    #[test]
    fn auth_inline_vs_spilled_and_check() {
        let mut c = CounterIntervals::new();
        c.set_range(0, 10, 1);
        c.set_range(3, 4, 2); // 3 intervals = 48 bytes
        let (t, us) = auth_ctr(&c, 48, &hash);
        assert!(matches!(t, TrustedCounters::Inline(_)) && us.is_none());
        assert_eq!(check_ctr(&t, None, &hash).unwrap(), c);
        let (t, us) = auth_ctr(&c, 47, &hash);
        let us = us.expect("spilled");
        assert!(matches!(
            t,
            TrustedCounters::Spilled {
                intervals: 3,
                blocks: 10,
                ..
            }
        ));
        assert_eq!(check_ctr(&t, Some(&us), &hash).unwrap(), c);
        // The hashes are of the arrays as docs/file-format.md §4.1 defines them.
        let TrustedCounters::Spilled {
            h_starts, h_ctrs, ..
        } = &t
        else {
            unreachable!()
        };
        assert_eq!(*h_starts, hash(&c.starts_bytes()));
        assert_eq!(*h_ctrs, hash(&c.ctrs_bytes()));
        assert_eq!(
            c.starts_bytes(),
            [0u64, 3, 7].map(u64::to_le_bytes).concat()
        );
        assert_eq!(c.ctrs_bytes(), [1u64, 2, 1].map(u64::to_le_bytes).concat());
        assert!(matches!(
            check_ctr(&t, None, &hash),
            Err(CounterError::Mismatch)
        ));
        // Modified US copy: a different (valid) counter value.
        let mut bad = c.clone();
        bad.set_range(3, 4, 3);
        let bad = bad.encode();
        assert!(matches!(
            check_ctr(&t, Some(&bad), &hash),
            Err(CounterError::Mismatch)
        ));
        // Rolled-back copy (fewer blocks).
        let mut old = c.clone();
        old.truncate(9);
        assert!(matches!(
            check_ctr(&t, Some(&old.encode()), &hash),
            Err(CounterError::Mismatch)
        ));
        // Byte flip anywhere is detected (either malformed or mismatch).
        for i in 0..us.len() {
            let mut b = us.clone();
            b[i] ^= 1;
            assert!(check_ctr(&t, Some(&b), &hash).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn trusted_fixed_form_round_trip() {
        let l_ctr = 64;
        let size = trusted_size(l_ctr);
        assert_eq!(size, 77);
        assert_eq!(trusted_size(160), 173);
        let mut c = CounterIntervals::new();
        let mut buf = vec![0xAA; size];
        for k in 0..6u64 {
            c.set_range(k * 3, 1, k + 1);
            let (t, _) = auth_ctr(&c, l_ctr, &hash);
            t.encode_into(&mut buf).unwrap();
            assert_eq!(TrustedCounters::decode(&buf).unwrap(), t);
        }
        assert!(TrustedCounters::Inline(CounterIntervals::new())
            .encode_into(&mut [0u8; 5])
            .is_err());
        assert!(
            TrustedCounters::decode(&[3; 100]).is_err(),
            "tag 3 is unknown"
        );
    }

    /// The fixed form's sizes, byte for byte: tag (1), count (4), blocks (8), then 16 bytes
    /// per inline interval or two 32-byte hashes. One byte short is refused, never a panic.
    #[test]
    fn fixed_form_sizes_are_exact() {
        assert_eq!(trusted_size(0), 77, "the spilled form is the least size");
        assert_eq!(trusted_size(64), 77);
        assert_eq!(trusted_size(79), 77);
        assert_eq!(trusted_size(80), 93);
        let mut c = CounterIntervals::new();
        c.set_range(0, 10, 1);
        c.set_range(3, 4, 2); // 3 intervals: 1 + 12 + 48 = 61 bytes
        let inline = TrustedCounters::Inline(c.clone());
        assert!(inline.encode_into(&mut [0u8; 60]).is_err());
        let mut buf = [0xAAu8; 61];
        inline.encode_into(&mut buf).unwrap();
        assert_eq!(TrustedCounters::decode(&buf).unwrap(), inline);
        assert!(TrustedCounters::decode(&buf[..60]).is_err());
        let (spilled, _) = auth_ctr(&c, 0, &hash);
        assert!(spilled.encode_into(&mut [0u8; 76]).is_err());
        let mut buf = [0xAAu8; 77];
        spilled.encode_into(&mut buf).unwrap();
        assert_eq!(buf[0], 1);
        assert_eq!(TrustedCounters::decode(&buf).unwrap(), spilled);
        assert!(TrustedCounters::decode(&buf[..76]).is_err());
        // The least form: no intervals, no blocks, 13 bytes.
        assert_eq!(
            TrustedCounters::decode(&[0u8; 13]).unwrap(),
            TrustedCounters::Inline(CounterIntervals::new())
        );
        assert!(TrustedCounters::decode(&[0u8; 12]).is_err());
    }

    /// A spilled form's counts: intervals exactly when blocks, and never more intervals
    /// than blocks (each interval has a block of its own).
    #[test]
    fn spilled_counts_are_checked() {
        let form = |count: u32, blocks: u64| {
            let mut b = [0u8; 77];
            b[0] = 1;
            b[1..5].copy_from_slice(&count.to_le_bytes());
            b[5..13].copy_from_slice(&blocks.to_le_bytes());
            TrustedCounters::decode(&b)
        };
        for (count, blocks, ok) in [
            (0, 0, true),
            (1, 1, true),
            (2, 2, true),
            (2, 9, true),
            (0, 5, false),
            (1, 0, false),
            (3, 2, false),
        ] {
            assert_eq!(
                form(count, blocks).is_ok(),
                ok,
                "{count} intervals, {blocks} blocks"
            );
        }
    }

    /// An edit applied to bytes, as the store applies it to an object.
    fn apply_edit(obj: &mut Vec<u8>, e: &CounterEdit) {
        assert!(e.apply(obj), "{e:?} reads past the end");
    }

    /// Hand-computed: one block written in the middle of one interval of 4 blocks
    /// splits it in three; the edits move nothing past the new entries but the header's
    /// count, and the log carries 12 + 16 + 16 bytes, not the arrays.
    #[test]
    fn edits_of_a_split_interval() {
        let mut old = CounterIntervals::new();
        old.set_range(0, 4, 7);
        old.set_range(4, 4, 9);
        let mut new = old.clone();
        new.set_range(1, 1, 11);
        // old: starts [0, 4], ctrs [7, 9]; new: starts [0, 1, 2, 4], ctrs [7, 11, 7, 9].
        assert_eq!(new.starts(), [0, 1, 2, 4]);
        let e = new.edits_from(&old);
        // Common prefix 1 (0/7), suffix 1 (4/9): n = 2, m = 4, p = 1, q = 1.
        assert_eq!(
            e,
            vec![
                // ctrs tail: old offset 12 + 16 + 8 = 36, new 12 + 32 + 24 = 68.
                CounterEdit::Copy {
                    src: 36,
                    dst: 68,
                    len: 8
                },
                // ctrs head: 28 -> 44.
                CounterEdit::Copy {
                    src: 28,
                    dst: 44,
                    len: 8
                },
                // starts tail: 20 -> 36.
                CounterEdit::Copy {
                    src: 20,
                    dst: 36,
                    len: 8
                },
                CounterEdit::Write {
                    off: 0,
                    bytes: [&4u32.to_le_bytes()[..], &8u64.to_le_bytes()].concat()
                },
                CounterEdit::Write {
                    off: 20,
                    bytes: [1u64.to_le_bytes(), 2u64.to_le_bytes()].concat()
                },
                CounterEdit::Write {
                    off: 52,
                    bytes: [11u64.to_le_bytes(), 7u64.to_le_bytes()].concat()
                },
                CounterEdit::SetLen(76),
            ]
        );
        let mut obj = old.encode();
        for x in &e {
            apply_edit(&mut obj, x);
        }
        assert_eq!(obj, new.encode());
        // Nothing changed: the length only (the object holds the header already).
        assert_eq!(new.edits_from(&new), vec![CounterEdit::SetLen(76)]);
        // A counter changed in place: that counter and the length, not the header.
        let mut bumped = new.clone();
        bumped.set_range(1, 1, 12);
        assert_eq!(
            bumped.edits_from(&new),
            vec![
                CounterEdit::Write {
                    off: 52,
                    bytes: 12u64.to_le_bytes().to_vec()
                },
                CounterEdit::SetLen(76),
            ]
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Set(u64, u64, u64),
        Truncate(u64),
        Extend(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..60, 0u64..12, 0u64..4).prop_map(|(a, b, c)| Op::Set(a, b, c)),
            1 => (0u64..60).prop_map(Op::Truncate),
            1 => (0u64..70).prop_map(Op::Extend),
        ]
    }

    /// Ops on a scale where segments ([`SEG_BLOCKS`]) matter: runs anywhere in 3.5
    /// segments, cuts and growths that cross segment boundaries.
    fn big_op() -> impl Strategy<Value = Op> {
        let span = SEG_BLOCKS * 7 / 2;
        prop_oneof![
            6 => (0..span, 1u64..3000, 0u64..5).prop_map(|(a, b, c)| Op::Set(a, b, c)),
            1 => (0..span).prop_map(Op::Truncate),
            1 => (0..span + SEG_BLOCKS).prop_map(Op::Extend),
        ]
    }

    fn apply_op(c: &mut CounterIntervals, o: &Op) {
        match *o {
            Op::Set(f, n, v) => c.set_range(f, n, v),
            Op::Truncate(b) => c.truncate(b),
            Op::Extend(b) => c.extend(b),
        }
    }

    fn seg_hash(parts: &[&[u8]]) -> Hash {
        let mut h = blake3::Hasher::new_keyed(&[9; 32]);
        for p in parts {
            h.update(p);
        }
        *h.finalize().as_bytes()
    }

    /// Hand-computed: a file of 4,106 blocks, counter 1 everywhere but block 4,095 (2)
    /// and blocks 4,100..4,106 (3). Segment 0 is blocks 0..4,096 and ends with the
    /// interval of block 4,095; segment 1 is the last 10 blocks: counter 1 for its first
    /// four, 3 after. Joined, they are the same four intervals.
    #[test]
    fn segments_of_a_small_case() {
        let mut c = CounterIntervals::new();
        c.set_range(0, 4106, 1);
        c.set_range(4095, 1, 2);
        c.set_range(4100, 6, 3);
        assert_eq!(c.starts(), &[0, 4095, 4096, 4100]);
        assert_eq!(c.segments(), 2);
        let s0 = c.segment(0);
        assert_eq!(
            (s0.starts(), s0.ctrs(), s0.blocks()),
            (&[0, 4095][..], &[1, 2][..], 4096)
        );
        let s1 = c.segment(1);
        assert_eq!(
            (s1.starts(), s1.ctrs(), s1.blocks()),
            (&[0, 4][..], &[1, 3][..], 10)
        );
        assert_eq!(s1.encode(), {
            let mut e = vec![2, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0];
            for v in [0u64, 4, 1, 3] {
                e.extend_from_slice(&v.to_le_bytes());
            }
            e
        });
        assert!(c.segment(2).blocks() == 0);
        assert_eq!(
            CounterIntervals::from_segments(&[s0.clone(), s1.clone()]).unwrap(),
            c
        );
        // A segment of the wrong length anywhere is refused.
        assert!(CounterIntervals::from_segments(&[s1.clone(), s1]).is_err());
        assert!(CounterIntervals::from_segments(&[CounterIntervals::new()]).is_err());
        // Room for the worst segment: every block an interval.
        let mut w = CounterIntervals::new();
        for b in 0..SEG_BLOCKS {
            w.set_range(b, 1, 1 + b % 2);
        }
        assert_eq!(w.intervals() as u64, SEG_BLOCKS);
        assert!(w.segment(0).encode().len() as u64 <= SEG_STRIDE);
        assert_eq!(SEG_STRIDE % 4096, 0);
    }

    /// Hand-computed cases of the choice of form: a dense file goes to segments past
    /// 4,096 intervals; a sparse one (few intervals a segment) stays whole; once there, a
    /// file stays until it has fewer than 4 intervals a segment.
    #[test]
    fn which_files_use_segments() {
        assert!(!use_segments(4096, 8, false), "not past the bound");
        assert!(use_segments(4097, 8, false), "128 MiB, 4,097 intervals");
        assert!(use_segments(16_000, 1000, false), "16 a segment");
        assert!(!use_segments(15_999, 1000, false), "under 16 a segment");
        assert!(
            !use_segments(5000, 65_536, false),
            "1 TiB sparse, 5,000 intervals"
        );
        assert!(use_segments(15_999, 1000, true), "stays: 16 a segment");
        assert!(
            use_segments(4000, 1000, true),
            "stays: 4 a segment, under the bound too"
        );
        assert!(
            !use_segments(3999, 1000, true),
            "goes back under 4 a segment"
        );
        assert!(!use_segments(5000, u64::MAX, false), "no overflow");
        assert!(!use_segments(5000, u64::MAX, true), "no overflow");
    }

    #[test]
    fn segmented_trusted_form_round_trip() {
        let t = TrustedCounters::Segmented {
            intervals: 5000,
            blocks: 9000,
            h_top: [7; 32],
        };
        let mut out = vec![0xAA; trusted_size(112)];
        t.encode_into(&mut out).unwrap();
        assert_eq!(out[0], 2);
        assert_eq!(&out[1..5], &5000u32.to_le_bytes());
        assert_eq!(&out[5..13], &9000u64.to_le_bytes());
        assert_eq!(&out[13..45], &[7; 32]);
        assert!(out[45..].iter().all(|&b| b == 0));
        assert_eq!(TrustedCounters::decode(&out).unwrap(), t);
        assert!(TrustedCounters::decode(&out[..44]).is_err());
        for (count, blocks) in [(0u32, 9000u64), (5000, 0), (5000, 4999)] {
            out[1..5].copy_from_slice(&count.to_le_bytes());
            out[5..13].copy_from_slice(&blocks.to_le_bytes());
            assert!(TrustedCounters::decode(&out).is_err(), "{count} {blocks}");
        }
        assert!(check_ctr(&t, Some(&[]), &hash).is_err());
    }

    /// The group and top hashes kept up to date by `set` and `truncate` are the ones
    /// computed afresh; any segment's hash changes the top.
    #[test]
    fn seg_hashes_follow_their_segments() {
        let fresh = |encs: &[Vec<u8>]| {
            let mut h = SegHashes::default();
            for (k, e) in encs.iter().enumerate() {
                h.set(k as u64, e, &seg_hash);
            }
            h.top(&seg_hash)
        };
        let mut encs: Vec<Vec<u8>> = (0..600u32).map(|k| k.to_le_bytes().to_vec()).collect();
        let mut kept = SegHashes::default();
        for (k, e) in encs.iter().enumerate() {
            kept.set(k as u64, e, &seg_hash);
        }
        let top = kept.top(&seg_hash);
        assert_eq!(top, fresh(&encs));
        encs[300] = b"other".to_vec();
        kept.set(300, &encs[300], &seg_hash);
        let top2 = kept.top(&seg_hash);
        assert_ne!(top2, top);
        assert_eq!(top2, fresh(&encs));
        encs.truncate(257);
        kept.truncate(257);
        assert_eq!(kept.top(&seg_hash), fresh(&encs));
        encs.push(b"new".to_vec());
        kept.set(257, b"new", &seg_hash);
        assert_eq!(kept.top(&seg_hash), fresh(&encs));
        // Two segments swapped, or one moved to another place, hash differently.
        let mut swapped = encs.clone();
        swapped.swap(1, 2);
        assert_ne!(fresh(&swapped), fresh(&encs));
    }

    proptest! {
        #[test]
        fn matches_per_block_model(ops in proptest::collection::vec(op(), 0..40)) {
            let mut c = CounterIntervals::new();
            let mut model: Vec<u64> = Vec::new();
            for o in ops {
                match o {
                    Op::Set(f, n, v) => {
                        c.set_range(f, n, v);
                        if n > 0 {
                            let end = (f + n) as usize;
                            if model.len() < end { model.resize(end, 0); }
                            model[f as usize..end].fill(v);
                        }
                    }
                    Op::Truncate(b) => { c.truncate(b); model.truncate(b as usize); }
                    Op::Extend(b) => { c.extend(b); if model.len() < b as usize { model.resize(b as usize, 0); } }
                }
                check_invariants(&c);
                prop_assert_eq!(c.blocks(), model.len() as u64);
                for (i, v) in model.iter().enumerate() {
                    prop_assert_eq!(c.get(i as u64), *v);
                }
                let expected = model.windows(2).filter(|w| w[0] != w[1]).count() + usize::from(!model.is_empty());
                prop_assert_eq!(c.intervals(), expected);
                let total: u64 = c.runs(3, 20).map(|r| { prop_assert!(r.1 > 0); Ok(r.1) }).sum::<Result<u64, TestCaseError>>()?;
                prop_assert_eq!(total, 20);
                prop_assert_eq!(CounterIntervals::decode(&c.encode()).unwrap(), c.clone());
                prop_assert_eq!(c.max_all(), model.iter().copied().max().unwrap_or(0));
                let stored = model.iter().filter(|&&v| v != 0).count() as u64;
                prop_assert_eq!(c.stored(), stored);
                prop_assert_eq!(CounterIntervals::decode(&c.encode()).unwrap().stored(), stored);
                let segs: Vec<_> = (0..c.segments()).map(|k| c.segment(k)).collect();
                prop_assert_eq!(
                    segs.iter().map(CounterIntervals::stored).sum::<u64>(),
                    stored
                );
                if !segs.is_empty() {
                    prop_assert_eq!(CounterIntervals::from_segments(&segs).unwrap().stored(), stored);
                }
            }
        }

        /// The edits from any state to any later one, applied to an object that holds the
        /// old encoding (and stale bytes past it), leave exactly the new encoding.
        #[test]
        fn edits_turn_the_old_encoding_into_the_new(
            before in proptest::collection::vec(op(), 0..30),
            after in proptest::collection::vec(op(), 0..6),
            stale in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let apply = |c: &mut CounterIntervals, ops: &[Op]| for o in ops {
                match *o {
                    Op::Set(f, n, v) => c.set_range(f, n, v),
                    Op::Truncate(b) => c.truncate(b),
                    Op::Extend(b) => c.extend(b),
                }
            };
            let mut old = CounterIntervals::new();
            apply(&mut old, &before);
            let mut new = old.clone();
            apply(&mut new, &after);
            let mut obj = old.encode();
            obj.extend_from_slice(&stale);
            for e in new.edits_from(&old) {
                apply_edit(&mut obj, &e);
            }
            prop_assert_eq!(&obj, &new.encode());
        }

        /// The same with arrays long enough for the runs compared as slices (many
        /// intervals before, a few changes after).
        #[test]
        fn edits_of_long_arrays(
            writes in proptest::collection::vec((0u64..3000, 1u64..4, 1u64..40), 150..400),
            after in proptest::collection::vec(op(), 0..4),
        ) {
            let mut old = CounterIntervals::new();
            for (i, (f, n, v)) in writes.into_iter().enumerate() {
                old.set_range(f, n, v + i as u64);
            }
            let mut new = old.clone();
            for o in &after {
                match *o {
                    Op::Set(f, n, v) => new.set_range(f * 37, n, v),
                    Op::Truncate(b) => new.truncate(b * 150),
                    Op::Extend(b) => new.extend(b * 150),
                }
            }
            let mut obj = old.encode();
            for e in new.edits_from(&old) {
                apply_edit(&mut obj, &e);
            }
            prop_assert_eq!(&obj, &new.encode());
        }

        /// Segments join back into the counters, and the segments a change did not touch
        /// are the same as before it.
        #[test]
        fn segments_join_back_and_untouched_ones_stay(
            before in proptest::collection::vec(big_op(), 0..12),
            after in proptest::collection::vec(big_op(), 0..4),
        ) {
            let mut c = CounterIntervals::new();
            for o in &before {
                apply_op(&mut c, o);
            }
            let segs: Vec<_> = (0..c.segments()).map(|k| c.segment(k)).collect();
            for s in &segs {
                check_invariants(s);
            }
            if c.blocks() > 0 {
                let joined = CounterIntervals::from_segments(&segs).unwrap();
                prop_assert_eq!(&joined, &c);
                // The count of stored blocks, kept as the intervals change, is the
                // count over the blocks, in the segments and joined again.
                let stored = (0..c.blocks()).filter(|&i| c.get(i) != 0).count() as u64;
                prop_assert_eq!(c.stored(), stored);
                prop_assert_eq!(joined.stored(), stored);
                prop_assert_eq!(segs.iter().map(CounterIntervals::stored).sum::<u64>(), stored);
            }
            c.take_touched();
            for o in &after {
                apply_op(&mut c, o);
            }
            let ranges = c.take_touched();
            prop_assert!(ranges.len() <= TOUCHED_MAX);
            prop_assert!(ranges.iter().all(|&(lo, hi)| lo < hi && hi <= c.segments()));
            let touched = touched_list(&ranges);
            prop_assert!(touched.windows(2).all(|w| w[0] < w[1]));
            for k in 0..c.segments().min(segs.len() as u64) {
                if !touched.contains(&k) {
                    prop_assert_eq!(&c.segment(k), &segs[k as usize], "segment {} changed untouched", k);
                }
            }
            prop_assert!(c.take_touched().is_empty());
        }

        /// The common prefix and suffix, compared run by run, against a plain scan.
        #[test]
        fn common_runs_match_a_plain_scan(
            base in proptest::collection::vec(any::<u64>(), 0..400),
            cut in 0usize..400,
            del in 0usize..3,
            ins in proptest::collection::vec(any::<u64>(), 0..3),
        ) {
            let cut = cut.min(base.len());
            let mut b = base[..cut].to_vec();
            b.extend_from_slice(&ins);
            b.extend_from_slice(&base[(cut + del).min(base.len())..]);
            let plain_prefix = base.iter().zip(&b).take_while(|(x, y)| x == y).count();
            let plain_suffix = base.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count();
            prop_assert_eq!(common_prefix(&base, &b), plain_prefix);
            prop_assert_eq!(common_suffix(&base, &b), plain_suffix);
        }

        #[test]
        fn decode_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            if let Ok(c) = CounterIntervals::decode(&bytes) {
                check_invariants(&c);
                prop_assert_eq!(c.encode(), bytes.clone());
            }
            let _ = TrustedCounters::decode(&bytes);
            let _ = check_ctr(
                &TrustedCounters::Spilled { intervals: 1, blocks: 1, h_starts: [0; 32], h_ctrs: [0; 32] },
                Some(&bytes),
                &hash,
            );
        }

        #[test]
        fn decode_structured_bytes_never_panics(count in 0u32..5, blocks in 0u64..10, body in proptest::collection::vec(0u64..12, 0..10)) {
            let mut b = Vec::new();
            b.extend_from_slice(&count.to_le_bytes());
            b.extend_from_slice(&blocks.to_le_bytes());
            for x in &body { b.extend_from_slice(&x.to_le_bytes()); }
            if let Ok(c) = CounterIntervals::decode(&b) { check_invariants(&c); }
            let mut t = vec![0u8];
            t.extend_from_slice(&b);
            if let Ok(TrustedCounters::Inline(c)) = TrustedCounters::decode(&t) { check_invariants(&c); }
        }
    }
}
