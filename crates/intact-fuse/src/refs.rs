//! The kernel's lookup count per inode, kept in about one bit per inode number.
//!
//! Every entry reply hands the kernel one more reference to an inode, and a FORGET takes
//! back some number of them (the FUSE protocol's `nlookup`); the engine may free an
//! unlinked file, and reuse its number, only once the count is back at zero. The kernel
//! keeps an inode for every name it has cached, so after `ls -lR` of a volume of 10^6 files
//! it holds 10^6 of them, nearly all with a count of one. A `HashMap<u64, u64>` spent about
//! 36 bytes an inode on that (53 MB at its last resize, measured with heaptrack on a mount
//! of 10^6 files: issue 18's daemon memory). Inode numbers are the engine's inode-table
//! indices, dense from 1, so a count of one is a bit in a bitset, and only counts of two or
//! more (a file looked up again before the kernel forgot it, hard links) take a map entry.
use std::collections::HashMap;

/// Inode numbers at or past this go to the map (a number so large is not an index of a
/// table this adapter could hold a bitset for; the engine never makes one).
const BITS_MAX: u64 = 1 << 32;

/// Lookup counts: one bit per inode number for a count of one, a map entry for more.
#[derive(Default)]
pub(crate) struct RefCounts {
    /// Bit `ino` set: the count of `ino` is exactly one (and `ino` is not in `more`).
    ones: Vec<u64>,
    /// Counts of two or more, and counts of inodes at or past [`BITS_MAX`].
    more: HashMap<u64, u64>,
}

impl RefCounts {
    fn bit(&self, ino: u64) -> bool {
        ino < BITS_MAX
            && self
                .ones
                .get((ino / 64) as usize)
                .is_some_and(|w| w & (1 << (ino % 64)) != 0)
    }

    fn set_bit(&mut self, ino: u64, on: bool) {
        let (w, b) = ((ino / 64) as usize, ino % 64);
        if w >= self.ones.len() {
            if !on {
                return;
            }
            // Grow by doubling: numbers are handed out in order.
            self.ones.resize((w + 1).max(2 * self.ones.len()), 0);
        }
        if on {
            self.ones[w] |= 1 << b;
        } else {
            self.ones[w] &= !(1 << b);
        }
    }

    /// One more reference to `ino`.
    pub(crate) fn add(&mut self, ino: u64) {
        if let Some(n) = self.more.get_mut(&ino) {
            *n += 1;
        } else if self.bit(ino) {
            self.set_bit(ino, false);
            self.more.insert(ino, 2);
        } else if ino < BITS_MAX {
            self.set_bit(ino, true);
        } else {
            self.more.insert(ino, 1);
        }
    }

    /// `n` references to `ino` dropped; returns how many are left (0 for an inode with
    /// none, and when more are dropped than were counted).
    pub(crate) fn release(&mut self, ino: u64, n: u64) -> u64 {
        if n == 0 {
            return self.get(ino);
        }
        if let Some(c) = self.more.get_mut(&ino) {
            *c = c.saturating_sub(n);
            let left = *c;
            if left <= 1 && ino < BITS_MAX {
                self.more.remove(&ino);
                if left == 1 {
                    self.set_bit(ino, true);
                }
            } else if left == 0 {
                self.more.remove(&ino);
            }
            left
        } else {
            // A count of one (its bit), or none.
            self.set_bit(ino, false);
            0
        }
    }

    /// The count of `ino`.
    pub(crate) fn get(&self, ino: u64) -> u64 {
        match self.more.get(&ino) {
            Some(&n) => n,
            None => self.bit(ino) as u64,
        }
    }

    /// Inodes with a count above zero.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.ones
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum::<usize>()
            + self.more.len()
    }

    /// Bytes held (the bitset and the map's entries; for the tests' bound).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.ones.capacity() * 8 + self.more.capacity() * 17
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counts against a plain map, over a fixed pseudo-random mix of lookups and
    /// forgets of every size (numbers small and past the bitset's range).
    #[test]
    fn counts_agree_with_a_map() {
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut r = RefCounts::default();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ino = match x % 7 {
                0 => BITS_MAX + (x >> 40) % 50,
                1 => (x >> 20) % 5,
                _ => 1 + (x >> 24) % 3000,
            };
            if !(x >> 8).is_multiple_of(3) {
                r.add(ino);
                *model.entry(ino).or_insert(0) += 1;
            } else {
                let n = (x >> 12) % 4;
                let m = model.get(&ino).copied().unwrap_or(0);
                let want = m.saturating_sub(n);
                assert_eq!(r.release(ino, n), want, "step {step}: release {n} of {ino}");
                if want == 0 {
                    model.remove(&ino);
                } else {
                    model.insert(ino, want);
                }
            }
            if step % 997 == 0 {
                for (&i, &n) in &model {
                    assert_eq!(r.get(i), n, "step {step}: count of {i}");
                }
                assert_eq!(r.live(), model.len(), "step {step}");
            }
        }
        for (&i, &n) in &model {
            assert_eq!(r.get(i), n);
        }
        assert_eq!(r.live(), model.len());
    }

    #[test]
    fn an_inode_unknown_or_forgotten_has_no_count() {
        let mut r = RefCounts::default();
        assert_eq!(r.release(7, 1), 0);
        r.add(7);
        assert_eq!(r.get(7), 1);
        assert_eq!(r.release(7, 5), 0, "more dropped than counted");
        assert_eq!(r.get(7), 0);
        assert_eq!(r.release(7, 1), 0);
        r.add(BITS_MAX + 1);
        r.add(BITS_MAX + 1);
        assert_eq!(r.release(BITS_MAX + 1, 1), 1);
        assert_eq!(r.get(BITS_MAX + 1), 1);
        assert_eq!(r.release(BITS_MAX + 1, 1), 0);
        assert_eq!(r.live(), 0);
    }

    /// A count back at one is a bit again (no map entry left behind), for every number
    /// below the bitset's range; at and past it the map keeps the count.
    #[test]
    fn a_count_back_at_one_leaves_the_map() {
        let mut r = RefCounts::default();
        for ino in [1, 64, 1000] {
            r.add(ino);
            r.add(ino);
            assert_eq!(r.release(ino, 1), 1);
            assert_eq!(r.get(ino), 1);
            assert!(r.more.is_empty(), "{ino} kept in the map");
            assert_eq!(r.release(ino, 1), 0);
        }
        for ino in [BITS_MAX, BITS_MAX + 7] {
            r.add(ino);
            r.add(ino);
            assert_eq!(r.release(ino, 1), 1);
            assert_eq!(r.get(ino), 1, "{ino}");
            assert_eq!(r.release(ino, 1), 0);
            assert_eq!(r.get(ino), 0, "{ino}");
        }
        assert!(r.more.is_empty());
        assert_eq!(r.live(), 0);
    }

    /// What `ls -lR` of a volume of 10^6 files leaves: one reference to each inode, and a
    /// few looked up twice. About a bit an inode, where a map took about 36 bytes.
    #[test]
    fn a_million_inodes_looked_up_once_take_about_a_bit_each() {
        let mut r = RefCounts::default();
        for ino in 1..=1_000_000u64 {
            r.add(ino);
        }
        for ino in (1..=1_000_000u64).step_by(1000) {
            r.add(ino);
        }
        assert_eq!(r.live(), 1_000_000);
        assert_eq!(r.get(500), 1);
        assert_eq!(r.get(1001), 2);
        assert!(r.bytes() < 300_000, "{} bytes", r.bytes());
        for ino in 1..=1_000_000u64 {
            let want = if (ino - 1) % 1000 == 0 { 1 } else { 0 };
            assert_eq!(r.release(ino, 1), want);
        }
        assert_eq!(r.live(), 1000);
    }
}
