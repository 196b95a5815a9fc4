//! File-access traces for `intact bench traces`: the synthetic NFS traces of Oprea and
//! Reiter's evaluation, and importers for real traces (issue 10).
//!
//! Oprea and Reiter replay three one-day NFS traces from Harvard (Ellard et al., FAST 2003):
//! LAIR, DEASNA and HOME02 (USENIX Security 2007 §7.2, Table 3 of the excerpt; the 2006
//! report §6, Table 6). The traces are not on this machine, so [`Profile::generate`] builds
//! traces with their published characteristics: the number of files, of block writes and of
//! block reads, 4 KiB blocks. What the tables do not give is drawn from what the papers say
//! of the traces: most accesses are sequential (Ellard et al.; the 2006 report §4), the
//! writes per block and the counter intervals per file are heavy-tailed (2006 Figs. 4 and 5:
//! most files have few intervals, a few have over a thousand).
//!
//! A user who has real traces reads them with [`parse_nfsdump`] (the text format of the
//! Harvard traces) or [`parse_fio_iolog`] (fio's `write_iolog`, versions 2 and 3).

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// One request of a trace: `blocks` consecutive blocks of one file from `block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Op {
    /// The file (an index into the trace's files).
    pub file: u32,
    /// The first block.
    pub block: u64,
    /// How many blocks (at least 1).
    pub blocks: u32,
    /// A write (else a read).
    pub write: bool,
}

/// A trace: requests in order over `files` files.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    /// Where it came from (a profile's name, or a file's).
    pub name: String,
    /// Files named by the requests are `0..files`.
    pub files: u32,
    /// The requests, in order.
    pub ops: Vec<Op>,
}

/// What a trace holds, counted as the papers' Table 3 counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Files that some request names.
    pub files: u64,
    /// Block writes.
    pub writes: u64,
    /// Block reads.
    pub reads: u64,
}

impl Trace {
    /// The trace's counts.
    pub fn counts(&self) -> Counts {
        let mut seen = vec![false; self.files as usize];
        let mut c = Counts::default();
        for op in &self.ops {
            if !std::mem::replace(&mut seen[op.file as usize], true) {
                c.files += 1;
            }
            match op.write {
                true => c.writes += u64::from(op.blocks),
                false => c.reads += u64::from(op.blocks),
            }
        }
        c
    }

    /// The blocks a read names before any write of the trace wrote them (data that existed
    /// before the trace began), as write requests in file and block order: a replay writes
    /// them first, outside its timed part, so that every read finds data.
    pub fn preexisting(&self) -> Vec<Op> {
        let mut written: HashSet<(u32, u64)> = HashSet::new();
        let mut needed: BTreeSet<(u32, u64)> = BTreeSet::new();
        for op in &self.ops {
            for b in op.block..op.block + u64::from(op.blocks) {
                if op.write {
                    written.insert((op.file, b));
                } else if !written.contains(&(op.file, b)) {
                    needed.insert((op.file, b));
                }
            }
        }
        let mut out: Vec<Op> = Vec::new();
        for (file, b) in needed {
            match out.last_mut() {
                Some(l)
                    if l.file == file && l.block + u64::from(l.blocks) == b && l.blocks < 256 =>
                {
                    l.blocks += 1
                }
                _ => out.push(Op {
                    file,
                    block: b,
                    blocks: 1,
                    write: true,
                }),
            }
        }
        out
    }

    /// Every file's intervals of consecutive blocks that share a write count at the end of
    /// the trace (the 2006 report's counter intervals, §4, counted as Fig. 5 counts them: a
    /// block never written counts 0, and a hole between written blocks starts an interval),
    /// for files the trace writes.
    pub fn counter_intervals(&self) -> Vec<u64> {
        let mut writes: HashMap<u32, BTreeMap<u64, u64>> = HashMap::new();
        for op in self.ops.iter().filter(|o| o.write) {
            let f = writes.entry(op.file).or_default();
            for b in op.block..op.block + u64::from(op.blocks) {
                *f.entry(b).or_default() += 1;
            }
        }
        let mut out: Vec<u64> = writes
            .into_values()
            .map(|blocks| {
                let mut n = 0;
                let mut prev: Option<(u64, u64)> = None;
                for (b, c) in blocks {
                    if prev != Some((b.wrapping_sub(1), c)) {
                        n += 1;
                    }
                    prev = Some((b, c));
                }
                n
            })
            .collect();
        out.sort_unstable();
        out
    }
}

/// A trace's published characteristics (Oprea–Reiter 2007, Table 3 of the excerpt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// The trace's name.
    pub name: &'static str,
    /// Files.
    pub files: u64,
    /// Block writes.
    pub writes: u64,
    /// Block reads.
    pub reads: u64,
}

/// The three Harvard traces as the excerpt's Table 3 gives them (4 KiB blocks).
pub const PROFILES: [Profile; 3] = [
    Profile {
        name: "LAIR",
        files: 7_017,
        writes: 66_331,
        reads: 23_281,
    },
    Profile {
        name: "DEASNA",
        files: 890,
        writes: 64_091,
        reads: 521,
    },
    Profile {
        name: "HOME02",
        files: 183,
        writes: 89_425,
        reads: 11_815,
    },
];

/// SplitMix64 (Steele, Lea and Flood 2014): the generator needs spread and repeatability,
/// not secrecy.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Splits `total` into parts proportional to `weights`, each part an integer, the parts
/// summing to `total` exactly (largest remainders first).
fn apportion(total: u64, weights: &[f64]) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    if weights.is_empty() || sum <= 0.0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<f64> = weights.iter().map(|w| w / sum * total as f64).collect();
    let mut parts: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let mut left = total - parts.iter().sum::<u64>().min(total);
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        parts[i] += 1;
        left -= 1;
    }
    parts
}

/// The largest request a generated trace makes, in blocks (32 KiB: NFSv3 clients of the
/// time read and wrote 8 to 32 KiB at once).
pub const MAX_RUN: u64 = 8;

impl Profile {
    /// The profile with its counts multiplied by `f` (at least one file, and at least one
    /// write per file), for quick runs.
    pub fn scaled(&self, f: f64) -> Profile {
        let s = |x: u64| ((x as f64 * f).round() as u64).max(1);
        let files = s(self.files);
        Profile {
            files,
            writes: s(self.writes).max(files),
            reads: if self.reads == 0 { 0 } else { s(self.reads) },
            ..*self
        }
    }

    /// A trace with exactly this profile's files, block writes and block reads, the same
    /// for the same seed.
    ///
    /// Each file gets one block write, and the rest are shared out by a Zipf law of
    /// exponent 1.2 over the files in a random order (writes per file are heavy-tailed,
    /// 2006 Fig. 4). Files are of three kinds. Most (60 %) are written once, sequentially
    /// from block 0. Rewritten files (30 %) are written in 2 to 4 passes: after the first,
    /// sequential rewrites from block 0 or from a random block (85 %) and appends (15 %).
    /// Files updated in place (10 %: mailboxes, databases) are written in 5 to 16 passes:
    /// after the first, one-block overwrites at random blocks (90 %) and appends. A file's
    /// length is its writes over its passes; requests are at most [`MAX_RUN`] blocks.
    /// Reads are shared out over the files in proportion to their writes and read runs of
    /// at most [`MAX_RUN`] blocks from a random block of what the first pass wrote, each
    /// after that pass. Each file's requests keep their order and are spread over the day
    /// from a random start, so the files' requests interleave.
    pub fn generate(&self, seed: u64) -> Trace {
        let name_seed = self.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let mut rng = Rng::new(seed ^ name_seed);
        let n = self.files.max(1) as usize;
        let mut rank: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            rank.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let zipf: Vec<f64> = rank
            .iter()
            .map(|&r| 1.0 / (r as f64 + 1.0).powf(1.2))
            .collect();
        let writes: Vec<u64> = apportion(self.writes.saturating_sub(n as u64), &zipf)
            .into_iter()
            .map(|w| w + 1)
            .collect();
        let wf: Vec<f64> = writes.iter().map(|&w| w as f64).collect();
        let reads = apportion(self.reads, &wf);
        let mut timed: Vec<(f64, u32, Op)> = Vec::new();
        for (file, (&w, &r)) in writes.iter().zip(&reads).enumerate() {
            let ops = Self::file_ops(&mut rng, file as u32, w, r);
            let start = rng.unit() * 0.9;
            let mut times: Vec<f64> = (0..ops.len())
                .map(|_| start + rng.unit() * (1.0 - start))
                .collect();
            times.sort_by(f64::total_cmp);
            for (k, (t, op)) in times.into_iter().zip(ops).enumerate() {
                timed.push((t, k as u32, op));
            }
        }
        timed.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then(a.2.file.cmp(&b.2.file))
                .then(a.1.cmp(&b.1))
        });
        Trace {
            name: self.name.to_string(),
            files: n as u32,
            ops: timed.into_iter().map(|(_, _, op)| op).collect(),
        }
    }

    /// One file's requests: `w` block writes and `r` block reads, in order.
    fn file_ops(rng: &mut Rng, file: u32, w: u64, r: u64) -> Vec<Op> {
        let u = rng.unit();
        let (passes, in_place) = if u < 0.6 {
            (1, false)
        } else if u < 0.9 {
            (2 + rng.below(3), false)
        } else {
            (5 + rng.below(12), true)
        };
        let len = w.div_ceil(passes).max(1);
        let mut ops = Vec::new();
        let run = |ops: &mut Vec<Op>, block: u64, blocks: u64, write: bool| {
            let mut b = block;
            while b < block + blocks {
                let n = (block + blocks - b).min(MAX_RUN);
                ops.push(Op {
                    file,
                    block: b,
                    blocks: n as u32,
                    write,
                });
                b += n;
            }
        };
        // The first pass, sequential from block 0.
        let first = len.min(w);
        run(&mut ops, 0, first, true);
        let first_ops = ops.len();
        let mut size = first;
        let mut left = w - first;
        while left > 0 {
            let u = rng.unit();
            if in_place && u < 0.9 {
                run(&mut ops, rng.below(size), 1, true);
                left -= 1;
            } else if in_place || u < 0.15 {
                let n = (1 + rng.below(MAX_RUN)).min(left);
                run(&mut ops, size, n, true);
                size += n;
                left -= n;
            } else {
                let from = if rng.unit() < 0.5 { 0 } else { rng.below(size) };
                let n = (size - from).min(left);
                run(&mut ops, from, n, true);
                left -= n;
            }
        }
        // Reads, each after the first pass, within what it wrote.
        let mut reads = Vec::new();
        let mut left = r;
        while left > 0 {
            let from = rng.below(first);
            let n = (1 + rng.below(MAX_RUN)).min(first - from).min(left);
            run(&mut reads, from, n, false);
            left -= n;
        }
        for op in reads {
            let at = first_ops + rng.below((ops.len() - first_ops) as u64 + 1) as usize;
            ops.insert(at, op);
        }
        ops
    }
}

/// Files named in a trace, numbered in the order they first appear.
#[derive(Default)]
struct Names(HashMap<String, u32>);

impl Names {
    fn id(&mut self, name: &str) -> u32 {
        let next = self.0.len() as u32;
        *self.0.entry(name.to_string()).or_insert(next)
    }
}

/// The blocks of `bs` bytes that `len` bytes at `off` touch, as one request (`None` for an
/// empty one).
fn op_of(file: u32, off: u64, len: u64, write: bool, bs: u64) -> Option<Op> {
    if len == 0 {
        return None;
    }
    let first = off / bs;
    let last = (off + len - 1) / bs;
    Some(Op {
        file,
        block: first,
        blocks: u32::try_from(last - first + 1).ok()?,
        write,
    })
}

/// Reads fio's I/O log (`write_iolog`), version 2 (`fio version 2 iolog`: lines `FILE
/// ACTION [OFFSET LENGTH]`) or 3 (`fio version 3 iolog`: a timestamp first). `read` and
/// `write` become requests on `bs`-byte blocks; `add`, `open`, `close`, `sync`,
/// `datasync`, `trim` and `wait` are skipped. Anything else is an error naming the line.
pub fn parse_fio_iolog(text: &str, name: &str, bs: u64) -> Result<Trace> {
    let mut lines = text.lines().enumerate();
    let v3 = match lines.next().map(|(_, l)| l.trim()) {
        Some("fio version 2 iolog") => false,
        Some("fio version 3 iolog") => true,
        other => bail!(
            "{name}: not a fio iolog of version 2 or 3 (first line {:?})",
            other.unwrap_or("")
        ),
    };
    let mut names = Names::default();
    let mut ops = Vec::new();
    for (k, line) in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let at = |what: &str| format!("{name}:{}: {what}: {line:?}", k + 1);
        let f = if v3 {
            f[0].parse::<u64>()
                .map_err(|_| anyhow::anyhow!(at("a timestamp (integer) first")))?;
            &f[1..]
        } else {
            &f[..]
        };
        let (file, action) = match f {
            [file, action, ..] => (*file, *action),
            _ => bail!(at("a file and an action")),
        };
        let write = match action {
            "read" => false,
            "write" => true,
            "add" | "open" | "close" | "sync" | "datasync" | "trim" | "wait" => continue,
            _ => bail!(at("an unknown action")),
        };
        let (off, len) = match &f[2..] {
            [off, len] => (
                off.parse::<u64>()
                    .map_err(|_| anyhow::anyhow!(at("an offset")))?,
                len.parse::<u64>()
                    .map_err(|_| anyhow::anyhow!(at("a length")))?,
            ),
            _ => bail!(at("an offset and a length")),
        };
        let id = names.id(file);
        ops.extend(op_of(id, off, len, write, bs));
    }
    Ok(Trace {
        name: name.to_string(),
        files: names.0.len() as u32,
        ops,
    })
}

/// Reads the text output of `nfsdump` (Ellard and Seltzer, LISA 2003), the format of the
/// Harvard traces: one packet per line, `TIME SRC DST PROTO DIR XID PROC NAME` then the
/// call's fields as `name value` pairs, numbers in hex. Calls (`C3`, `C2`) of `read` and
/// `write` become requests on `bs`-byte blocks of the file named by `fh`, from `off` (v3;
/// `offset` in v2) for `count` bytes; replies, other procedures and lines starting with
/// `#` are skipped. A read or write call without those fields is an error naming the line.
pub fn parse_nfsdump(text: &str, name: &str, bs: u64) -> Result<Trace> {
    let mut names = Names::default();
    let mut ops = Vec::new();
    for (k, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() || f[0].starts_with('#') {
            continue;
        }
        let at = |what: &str| format!("{name}:{}: {what}: {line:?}", k + 1);
        if f.len() < 8 {
            bail!(at("fewer than the 8 fields every nfsdump line has"));
        }
        if !matches!(f[4], "C3" | "C2") {
            continue;
        }
        let write = match f[7] {
            "read" => false,
            "write" => true,
            _ => continue,
        };
        let field = |key: &str| f[8..].windows(2).find(|w| w[0] == key).map(|w| w[1]);
        let hex = |keys: &[&str], what: &str| -> Result<u64> {
            let v = keys
                .iter()
                .find_map(|k| field(k))
                .with_context(|| at(&format!("no {what}")))?;
            u64::from_str_radix(v, 16).with_context(|| at(&format!("{what} is not hex")))
        };
        let fh = field("fh").with_context(|| at("no file handle (fh)"))?;
        let off = hex(&["off", "offset"], "offset (off)")?;
        let count = hex(&["count"], "count")?;
        let id = names.id(fh);
        ops.extend(op_of(id, off, count, write, bs));
    }
    Ok(Trace {
        name: name.to_string(),
        files: names.0.len() as u32,
        ops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generator gives exactly Table 3's counts for each trace, the same trace for the
    /// same seed and another for another seed, and no read of a block before it was
    /// written.
    #[test]
    fn generated_traces_have_table_3s_counts() {
        for p in PROFILES {
            let t = p.generate(1);
            let c = t.counts();
            assert_eq!(
                (c.files, c.writes, c.reads),
                (p.files, p.writes, p.reads),
                "{}",
                p.name
            );
            assert!(
                t.preexisting().is_empty(),
                "{}: a read before its write",
                p.name
            );
            assert!(t
                .ops
                .iter()
                .all(|o| o.blocks >= 1 && u64::from(o.blocks) <= MAX_RUN));
            assert_eq!(
                p.generate(1).ops,
                t.ops,
                "{}: the same for one seed",
                p.name
            );
            assert_ne!(
                p.generate(2).ops,
                t.ops,
                "{}: another for another seed",
                p.name
            );
        }
    }

    /// The shape the papers describe: most files have few counter intervals, a few many
    /// (2006 Fig. 5); most requests continue the file's previous request (sequential).
    #[test]
    fn generated_traces_are_mostly_sequential_with_heavy_tailed_intervals() {
        for p in PROFILES {
            let t = p.generate(7);
            let iv = t.counter_intervals();
            assert_eq!(iv.len() as u64, p.files, "{}", p.name);
            let median = iv[iv.len() / 2];
            let max = *iv.last().unwrap();
            assert!(median <= 4, "{}: median {median}", p.name);
            assert!(
                max >= 20 * median.max(1),
                "{}: max {max}, median {median}",
                p.name
            );
            // A block is accessed sequentially when it follows the block its file's last
            // access ended at (Ellard et al.'s measure, by blocks).
            let mut last: HashMap<u32, u64> = HashMap::new();
            let (mut seq, mut all) = (0u64, 0u64);
            for op in &t.ops {
                let n = u64::from(op.blocks);
                seq += n - 1 + u64::from(last.get(&op.file) == Some(&op.block));
                all += n;
                last.insert(op.file, op.block + n);
            }
            assert!(seq * 10 > all * 6, "{}: {seq} of {all} blocks", p.name);
        }
    }

    #[test]
    fn scaled_profiles_keep_a_file_and_a_write_per_file() {
        let p = PROFILES[1].scaled(0.01);
        assert_eq!((p.files, p.writes, p.reads), (9, 641, 5));
        let tiny = PROFILES[2].scaled(0.0001);
        assert_eq!((tiny.files, tiny.writes), (1, 9));
        let t = tiny.generate(3);
        assert_eq!(t.counts().writes, 9);
    }

    #[test]
    fn apportion_is_exact_and_proportional() {
        assert_eq!(apportion(10, &[1.0, 1.0, 2.0]), vec![3, 2, 5]);
        assert_eq!(apportion(0, &[1.0, 2.0]), vec![0, 0]);
        assert_eq!(apportion(7, &[]), Vec::<u64>::new());
        assert_eq!(apportion(5, &[0.0, 0.0]), vec![0, 0]);
        let w: Vec<f64> = (1..50).map(|k| 1.0 / f64::from(k)).collect();
        let p = apportion(1000, &w);
        assert_eq!(p.iter().sum::<u64>(), 1000);
        assert!(p.windows(2).all(|x| x[0] >= x[1]));
    }

    /// Counter intervals counted by hand: a file written 0..4, then block 1 again (3
    /// intervals: [0], [1], [2, 3]); one written at 0 and 5 (a hole between: 2); one
    /// written 0..2 twice (1).
    #[test]
    fn counter_intervals_by_hand() {
        let w = |file, block, blocks| Op {
            file,
            block,
            blocks,
            write: true,
        };
        let t = Trace {
            name: "hand".into(),
            files: 4,
            ops: vec![
                w(0, 0, 4),
                w(0, 1, 1),
                w(1, 0, 1),
                w(1, 5, 1),
                w(2, 0, 2),
                w(2, 0, 2),
                Op {
                    file: 3,
                    block: 0,
                    blocks: 3,
                    write: false,
                },
            ],
        };
        assert_eq!(t.counter_intervals(), vec![1, 2, 3]);
        assert_eq!(
            t.counts(),
            Counts {
                files: 4,
                writes: 11,
                reads: 3
            }
        );
        assert_eq!(t.preexisting(), vec![w(3, 0, 3)]);
    }

    /// A fio version 3 log written by hand: timestamps, a file opened and closed, reads and
    /// writes across block edges, a second file, a zero-length write; and version 2.
    #[test]
    fn fio_iologs_written_by_hand() {
        let v3 = "fio version 3 iolog\n\
                  0 /dev/nbd0 add\n\
                  1 /dev/nbd0 open\n\
                  10 /dev/nbd0 write 0 4096\n\
                  11 /dev/nbd0 write 4096 8192\n\
                  12 /dev/nbd0 read 4000 200\n\
                  13 /tmp/other write 12288 1\n\
                  14 /tmp/other write 0 0\n\
                  15 /dev/nbd0 sync\n\
                  \n\
                  16 /dev/nbd0 close\n";
        let t = parse_fio_iolog(v3, "v3.log", 4096).unwrap();
        let op = |file, block, blocks, write| Op {
            file,
            block,
            blocks,
            write,
        };
        assert_eq!(
            t.ops,
            vec![
                op(0, 0, 1, true),
                op(0, 1, 2, true),
                op(0, 0, 2, false),
                op(1, 3, 1, true),
            ]
        );
        assert_eq!(t.files, 2);
        let v2 = "fio version 2 iolog\nf add\nf open\nf read 8192 4096\nf write 0 512\n";
        let t = parse_fio_iolog(v2, "v2.log", 4096).unwrap();
        assert_eq!(t.ops, vec![op(0, 2, 1, false), op(0, 0, 1, true)]);
        assert_eq!(t.preexisting(), vec![op(0, 2, 1, true)]);
    }

    #[test]
    fn fio_iolog_errors_name_the_line() {
        for (text, says) in [
            ("fio version 9 iolog\n", "not a fio iolog"),
            ("", "not a fio iolog"),
            ("fio version 3 iolog\nx f write 0 1\n", ":2: a timestamp"),
            (
                "fio version 3 iolog\n1 f write 0\n",
                ":2: an offset and a length",
            ),
            ("fio version 2 iolog\nf write zero 1\n", ":2: an offset"),
            (
                "fio version 2 iolog\nf open\nf write 0 -1\n",
                ":3: a length",
            ),
            ("fio version 2 iolog\nf erase 0 1\n", "an unknown action"),
            ("fio version 2 iolog\nonlyone\n", "a file and an action"),
        ] {
            let e = parse_fio_iolog(text, "t.log", 4096)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    /// nfsdump lines written by hand in the Harvard traces' format: a v3 read and write
    /// call with their replies, a v2 write (`offset`), a lookup, a comment; two file
    /// handles; offsets and counts in hex.
    #[test]
    fn nfsdump_lines_written_by_hand() {
        let text = "\
# a comment
1003970000.000100 30.0801 31.03fe U C3 1a2b3c4d 6 read fh 6a3e00000001 off 2000 count 2000 euid 1f4 egid 64 con = 82 len = 97
1003970000.000300 31.03fe 30.0801 U R3 1a2b3c4d 6 read OK ftype 1 mode 1a4 size 8000 count 2000 eof 0 status=0 pl = 8192 con = 130 len = 8324
1003970000.000500 30.0801 31.03fe U C3 1a2b3c4e 7 write fh 6a3e00000002 off 0 count 1001 stable 2 euid 1f4 egid 64 con = 82 len = 4200
1003970000.000700 30.0801 31.03fe U C3 1a2b3c4f 3 lookup fh 6a3e00000001 name \"x\" euid 1f4 egid 64
1003970000.000900 30.0801 31.03fe U C2 1a2b3c50 8 write fh 6a3e00000001 begoff 0 offset 5000 totcount 10 count 10
";
        let t = parse_nfsdump(text, "hand.txt", 4096).unwrap();
        let op = |file, block, blocks, write| Op {
            file,
            block,
            blocks,
            write,
        };
        assert_eq!(
            t.ops,
            vec![op(0, 2, 2, false), op(1, 0, 2, true), op(0, 5, 1, true)]
        );
        assert_eq!(t.files, 2);
        for (line, says) in [
            ("1 2 3 U C3 x 6 read off 0 count 10", "no file handle"),
            ("1 2 3 U C3 x 6 read fh aa count 10", "no offset"),
            ("1 2 3 U C3 x 6 write fh aa off zz count 10", "not hex"),
            ("1 2 3 U C3 x 6 write fh aa off 0", "no count"),
            ("1 2 3 U C3", "8 fields"),
        ] {
            let e = parse_nfsdump(line, "bad.txt", 4096)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says) && e.contains("bad.txt:1"), "{line}: {e}");
        }
    }
}
