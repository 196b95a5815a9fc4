//! The PAC queue of pending tree updates (Burke et al., "PAC: Efficient Storage Integrity",
//! §5): a write's new leaf waits here until a background updater applies it to the tree;
//! a read takes a pending leaf from here first (§5.3, no tree walk); a newer write to a
//! block overrides its pending update (§5.2, "Overriding Updates"); a full queue blocks
//! writers until the updater, draining as fast as it can, brings it down to the low
//! watermark (§5.2, "Rate Limiting Updates"); a flush waits until every update queued
//! before it was applied (§5.4, "Coordinated State Updates"), so that the root then sealed
//! covers every write acknowledged before the flush (Theorem 2).
//!
//! Generic over the leaf `L` and over how a leaf is applied, so the disk's trees (balanced,
//! n-ary, DMT) and its tests share it. Each pending update carries a sequence number: an
//! override gets a new one (so it goes to the back of the queue), the updater applies the
//! oldest first, and an update stays visible to readers until its leaf is in the tree, so
//! a read never finds a block in neither place.

use crate::error::{Error, Result};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How the queue behaves; every field can change while it serves ([`PacQueue::configure`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacConfig {
    /// Pending updates at most: a writer that finds the queue full waits.
    pub capacity: usize,
    /// Once full, writers wait until the queue is down to this share of the capacity.
    pub low_watermark: f64,
    /// Updates the background thread applies per second when not draining (`None`: as
    /// fast as it can). The paper's "target background processing rate" (Fig. 10).
    pub rate: Option<f64>,
}

impl Default for PacConfig {
    /// The paper's defaults: a queue of 1024, a low watermark of 0.75, 1000 updates/s.
    fn default() -> Self {
        PacConfig {
            capacity: 1024,
            low_watermark: 0.75,
            rate: Some(1000.0),
        }
    }
}

/// What the queue did, for benchmarks and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacStats {
    /// Updates queued (overrides included).
    pub queued: u64,
    /// Updates that replaced a pending one of the same block (never applied).
    pub overridden: u64,
    /// Leaves applied to the tree.
    pub applied: u64,
    /// Times a writer found the queue full and waited.
    pub writer_waits: u64,
    /// The most updates pending at once.
    pub max_pending: usize,
}

struct Pending<L> {
    seq: u64,
    leaf: L,
}

struct State<L> {
    config: PacConfig,
    pending: HashMap<u64, Pending<L>>,
    /// (sequence, block) of every pending update: the oldest is applied first.
    order: BTreeSet<(u64, u64)>,
    next_seq: u64,
    /// Writers wait for room, the updater drains without pause.
    draining: bool,
    /// Flushes waiting: the updater drains without pause.
    flushes: usize,
    /// The first failure to apply a leaf: every later flush reports it.
    failed: Option<String>,
    stop: bool,
    stats: PacStats,
}

impl<L> State<L> {
    /// The low watermark in updates: below the capacity, so a waiting writer always has
    /// something to wait for.
    fn low(&self) -> usize {
        let cap = self.config.capacity.max(1);
        ((cap as f64 * self.config.low_watermark.clamp(0.0, 1.0)) as usize).min(cap - 1)
    }
    /// The oldest sequence still pending, if any.
    fn oldest(&self) -> Option<u64> {
        self.order.first().map(|&(s, _)| s)
    }
}

struct Shared<L> {
    state: Mutex<State<L>>,
    /// Writers wait here for room.
    room: Condvar,
    /// The updater waits here for work (or a config change, a flush, a stop).
    work: Condvar,
    /// Flushes wait here for the updates before them.
    applied: Condvar,
}

/// The queue of pending updates, shared by the request threads and the updater.
pub struct PacQueue<L> {
    shared: Arc<Shared<L>>,
    updater: Option<std::thread::JoinHandle<()>>,
}

use super::guard;

impl<L: Clone + Send + 'static> PacQueue<L> {
    /// A queue whose updater thread applies each leaf with `apply(block, leaf)`. A failure
    /// is kept and reported by every later [`PacQueue::flush`] (the paper's alert).
    pub fn start(
        config: PacConfig,
        mut apply: impl FnMut(u64, &L) -> Result<()> + Send + 'static,
    ) -> std::io::Result<PacQueue<L>> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                config,
                pending: HashMap::new(),
                order: BTreeSet::new(),
                next_seq: 1,
                draining: false,
                flushes: 0,
                failed: None,
                stop: false,
                stats: PacStats::default(),
            }),
            room: Condvar::new(),
            work: Condvar::new(),
            applied: Condvar::new(),
        });
        let s = shared.clone();
        let updater = std::thread::Builder::new()
            .name("intact-pac".into())
            .spawn(move || updater(&s, &mut apply))?;
        Ok(PacQueue {
            shared,
            updater: Some(updater),
        })
    }

    /// Queues `leaf` as block `block`'s new leaf (the block's data was written): it
    /// overrides a pending update of the block; a full queue makes this wait until the
    /// updater has drained it to the low watermark.
    pub fn push(&self, block: u64, leaf: L) {
        let sh = &self.shared;
        let mut st = guard(&sh.state);
        st.stats.queued += 1;
        let seq = st.next_seq;
        st.next_seq += 1;
        if let Some(p) = st.pending.get_mut(&block) {
            let old = std::mem::replace(p, Pending { seq, leaf });
            st.order.remove(&(old.seq, block));
            st.order.insert((seq, block));
            st.stats.overridden += 1;
            return;
        }
        let mut waited = false;
        // Checked again after each wait: others may have filled it meanwhile.
        while st.pending.len() >= st.config.capacity.max(1) && !st.stop {
            if !waited {
                st.stats.writer_waits += 1;
                waited = true;
            }
            st.draining = true;
            sh.work.notify_all();
            while st.draining && st.pending.len() > st.low() && !st.stop {
                st = sh.room.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
        st.pending.insert(block, Pending { seq, leaf });
        st.order.insert((seq, block));
        st.stats.max_pending = st.stats.max_pending.max(st.pending.len());
        // Only an updater waiting on an empty queue needs waking: one that waits for its
        // next turn at the rate wakes by itself (a wake-up per write cost a third of the
        // throughput in `intact disk bench`).
        if st.pending.len() == 1 {
            sh.work.notify_all();
        }
    }

    /// The pending leaf of `block`, if an update of it is queued (the read path's first
    /// look, §5.3).
    pub fn get(&self, block: u64) -> Option<L> {
        guard(&self.shared.state)
            .pending
            .get(&block)
            .map(|p| p.leaf.clone())
    }

    /// Returns once every update queued before the call is in the tree (the updater
    /// drains without pause meanwhile); then the caller seals the root. An update that
    /// failed to apply is reported here, by every flush after it.
    pub fn flush(&self) -> Result<()> {
        let sh = &self.shared;
        let mut st = guard(&sh.state);
        let upto = st.next_seq;
        st.flushes += 1;
        sh.work.notify_all();
        while st.oldest().is_some_and(|s| s < upto) && st.failed.is_none() && !st.stop {
            st = sh.applied.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.flushes -= 1;
        match &st.failed {
            Some(why) => Err(Error::Invalid(format!(
                "a tree update failed in the background: {why}"
            ))),
            None if st.oldest().is_some_and(|s| s < upto) => {
                Err(Error::Invalid("the update queue stopped".into()))
            }
            None => Ok(()),
        }
    }

    /// Changes the configuration while serving (the rate, the capacity, the watermark).
    pub fn configure(&self, config: PacConfig) {
        let mut st = guard(&self.shared.state);
        st.config = config;
        self.shared.work.notify_all();
        self.shared.room.notify_all();
    }

    /// The configuration now.
    pub fn config(&self) -> PacConfig {
        guard(&self.shared.state).config
    }

    /// What the queue did so far.
    pub fn stats(&self) -> PacStats {
        guard(&self.shared.state).stats
    }

    /// Updates pending now.
    pub fn len(&self) -> usize {
        guard(&self.shared.state).pending.len()
    }

    /// Whether no update is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<L> Drop for PacQueue<L> {
    /// Stops the updater after it applied what is pending (a drop is no seal: the caller
    /// flushes first when it wants one).
    fn drop(&mut self) {
        {
            let mut st = guard(&self.shared.state);
            st.stop = true;
            self.shared.work.notify_all();
            self.shared.room.notify_all();
            self.shared.applied.notify_all();
        }
        if let Some(h) = self.updater.take() {
            let _ = h.join();
        }
    }
}

/// The background thread: applies the oldest pending update, then sleeps for the rate's
/// interval unless the queue is draining (full, or a flush waits).
fn updater<L: Clone>(sh: &Shared<L>, apply: &mut dyn FnMut(u64, &L) -> Result<()>) {
    let mut last = Instant::now();
    loop {
        let (block, seq, leaf) = {
            let mut st = guard(&sh.state);
            loop {
                let urgent = st.draining || st.flushes > 0 || st.stop;
                if let Some(&(seq, block)) = st.order.first() {
                    let wait = match st.config.rate {
                        Some(r) if !urgent && r > 0.0 => {
                            Duration::from_secs_f64(1.0 / r).saturating_sub(last.elapsed())
                        }
                        _ => Duration::ZERO,
                    };
                    if wait.is_zero() {
                        let leaf = st.pending[&block].leaf.clone();
                        break (block, seq, leaf);
                    }
                    st = sh
                        .work
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                } else if st.stop {
                    return;
                } else {
                    st = sh.work.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            }
        };
        let r = apply(block, &leaf);
        last = Instant::now();
        let mut st = guard(&sh.state);
        match r {
            Ok(()) => {
                st.stats.applied += 1;
                // Applied: it leaves the queue, unless a newer write overrode it meanwhile
                // (that one stays, and is applied in its turn).
                if st.pending.get(&block).is_some_and(|p| p.seq == seq) {
                    st.pending.remove(&block);
                    st.order.remove(&(seq, block));
                }
            }
            Err(e) => {
                tracing::error!(block, error = %e, "a tree update failed");
                st.failed
                    .get_or_insert_with(|| format!("block {block}: {e}"));
                // It stays pending (readers still verify against it); nothing more is
                // applied: the tree is no longer known to be right.
                sh.applied.notify_all();
                sh.room.notify_all();
                while !st.stop {
                    st = sh.work.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                return;
            }
        }
        if st.draining && st.pending.len() <= st.low() {
            st.draining = false;
        }
        sh.room.notify_all();
        sh.applied.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// A tree stand-in: block → (version, checksum of the version).
    type Tree = Arc<Mutex<HashMap<u64, (u64, u64)>>>;

    fn leaf(block: u64, version: u64) -> (u64, u64) {
        (version, block.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version)
    }

    fn queue(config: PacConfig, tree: &Tree) -> PacQueue<(u64, u64)> {
        let t = tree.clone();
        PacQueue::start(config, move |b, l| {
            t.lock().unwrap().insert(b, *l);
            Ok(())
        })
        .unwrap()
    }

    #[test]
    fn a_newer_write_overrides_and_a_flush_applies_everything_before_it() {
        let tree: Tree = Default::default();
        // A rate so slow that nothing is applied unless a flush drains.
        let q = queue(
            PacConfig {
                capacity: 16,
                low_watermark: 0.5,
                rate: Some(0.001),
            },
            &tree,
        );
        q.push(1, leaf(1, 1));
        std::thread::sleep(Duration::from_millis(50));
        q.push(2, leaf(2, 1));
        q.push(1, leaf(1, 2));
        assert_eq!(
            q.get(1),
            Some(leaf(1, 2)),
            "a read sees the newest pending leaf"
        );
        assert_eq!(q.get(3), None);
        assert_eq!(q.len(), 2);
        q.flush().unwrap();
        assert!(q.is_empty());
        let t = tree.lock().unwrap().clone();
        assert_eq!(t[&1], leaf(1, 2));
        assert_eq!(t[&2], leaf(2, 1));
        let s = q.stats();
        assert_eq!((s.queued, s.overridden), (3, 1));
        // The first leaf of block 1 may have been applied before the override; the second
        // always is.
        assert!((2..=3).contains(&s.applied), "{s:?}");
    }

    #[test]
    fn a_full_queue_blocks_writers_until_drained_to_the_low_watermark() {
        let tree: Tree = Default::default();
        let gate = Arc::new(AtomicBool::new(false));
        let g = gate.clone();
        let t = tree.clone();
        // The updater applies nothing until the gate opens.
        let q = Arc::new(
            PacQueue::start(
                PacConfig {
                    capacity: 8,
                    low_watermark: 0.5,
                    rate: None,
                },
                move |b, l: &(u64, u64)| {
                    while !g.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    t.lock().unwrap().insert(b, *l);
                    Ok(())
                },
            )
            .unwrap(),
        );
        for b in 0..8 {
            q.push(b, leaf(b, 1));
        }
        let done = Arc::new(AtomicBool::new(false));
        let (q2, d2) = (q.clone(), done.clone());
        let writer = std::thread::spawn(move || {
            q2.push(100, leaf(100, 1));
            d2.store(true, Ordering::Relaxed);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !done.load(Ordering::Relaxed),
            "a writer went past a full queue"
        );
        assert_eq!(q.stats().writer_waits, 1);
        gate.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        // It went on once the queue was down to 4 (then added its own).
        assert!(q.len() <= 5, "{}", q.len());
        assert!(q.stats().max_pending <= 8);
        q.flush().unwrap();
        assert_eq!(tree.lock().unwrap().len(), 9);
    }

    /// A waiting writer goes on as soon as the queue is down to the low watermark, not
    /// later (the updater here applies one update per permit).
    #[test]
    fn a_writer_goes_on_at_the_low_watermark_exactly() {
        let permits = Arc::new(AtomicU64::new(0));
        let p = permits.clone();
        let q = Arc::new(
            PacQueue::start(
                PacConfig {
                    capacity: 8,
                    low_watermark: 0.5,
                    rate: None,
                },
                move |_, _: &u64| {
                    // (Gives up after 20 s, so that a failed assertion cannot hang the
                    // queue's drop on this closure.)
                    let t = Instant::now();
                    while p
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                        .is_err()
                        && t.elapsed() < Duration::from_secs(20)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Ok(())
                },
            )
            .unwrap(),
        );
        for b in 0..8 {
            q.push(b, b);
        }
        let done = Arc::new(AtomicBool::new(false));
        let (q2, d2) = (q.clone(), done.clone());
        let writer = std::thread::spawn(move || {
            q2.push(100, 100);
            d2.store(true, Ordering::Release);
        });
        let t = Instant::now();
        while q.stats().writer_waits == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the writer never waited"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Three applied: 5 left, above the watermark of 4: still waiting.
        permits.store(3, Ordering::Release);
        while permits.load(Ordering::Acquire) > 0 || q.len() > 5 {
            assert!(t.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !done.load(Ordering::Acquire),
            "went on above the low watermark"
        );
        // One more: 4 left, the watermark: it goes on, with 4 still pending.
        permits.store(1, Ordering::Release);
        writer.join().unwrap();
        assert_eq!(q.len(), 5, "4 left and the waiting writer's own");
        permits.store(u64::MAX / 2, Ordering::Release);
        q.flush().unwrap();
    }

    #[test]
    fn watermarks_at_the_edges_still_make_writers_wait_and_go_on() {
        for (capacity, low_watermark) in [(1, 1.0), (1, 0.0), (4, 1.0), (4, 2.0), (0, 0.5)] {
            let tree: Tree = Default::default();
            let q = queue(
                PacConfig {
                    capacity,
                    low_watermark,
                    rate: None,
                },
                &tree,
            );
            for b in 0..50 {
                q.push(b, leaf(b, 1));
                assert!(q.len() <= capacity.max(1));
            }
            q.flush().unwrap();
            assert_eq!(tree.lock().unwrap().len(), 50);
        }
    }

    #[test]
    fn a_failed_update_is_reported_by_every_flush_and_stays_readable() {
        let q = PacQueue::start(PacConfig::default(), |b, _: &u64| {
            if b == 7 {
                Err(Error::Invalid("the node's write failed".into()))
            } else {
                Ok(())
            }
        })
        .unwrap();
        q.push(7, 70);
        let e = q.flush().unwrap_err();
        assert!(e.to_string().contains("block 7"), "{e}");
        assert!(q.flush().is_err());
        assert_eq!(q.get(7), Some(70));
    }

    #[test]
    fn the_rate_paces_the_updater_and_can_change_while_serving() {
        let tree: Tree = Default::default();
        let q = queue(
            PacConfig {
                capacity: 1000,
                low_watermark: 0.75,
                rate: Some(20.0),
            },
            &tree,
        );
        // A flush that found nothing to wait for leaves the pace as it was.
        q.flush().unwrap();
        for b in 0..100 {
            q.push(b, leaf(b, 1));
        }
        std::thread::sleep(Duration::from_millis(200));
        // At 20 per second, a few in 0.2 s, far from 100 (an upper bound: never flaky).
        assert!(q.stats().applied < 50, "{:?}", q.stats());
        q.configure(PacConfig {
            capacity: 1000,
            low_watermark: 0.75,
            rate: None,
        });
        // Unpaced, the rest goes in far less than the 4 s it takes at 20 per second.
        let t = Instant::now();
        while !q.is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "the new rate did not take"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(tree.lock().unwrap().len(), 100);
    }

    /// Writers, readers and flushes at once: a reader never sees a block older than a
    /// version it saw acknowledged, never finds a block in neither place, and after the
    /// last flush the tree holds every block's last version.
    #[test]
    fn many_threads_never_lose_or_reorder_a_block() {
        let tree: Tree = Default::default();
        let q = Arc::new(queue(
            PacConfig {
                capacity: 32,
                low_watermark: 0.75,
                rate: Some(5000.0),
            },
            &tree,
        ));
        const BLOCKS: u64 = 64;
        // The last acknowledged version of each block (writers own disjoint blocks).
        let acked: Arc<Vec<AtomicU64>> = Arc::new((0..BLOCKS).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let mut hs = Vec::new();
        for w in 0..4u64 {
            let (q, acked, tree) = (q.clone(), acked.clone(), tree.clone());
            hs.push(std::thread::spawn(move || {
                let mut x = w + 1;
                for i in 0..3000u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let b = (x % (BLOCKS / 4)) * 4 + w;
                    let v = acked[b as usize].load(Ordering::Relaxed) + 1;
                    q.push(b, leaf(b, v));
                    acked[b as usize].store(v, Ordering::Release);
                    if i % 500 == 0 {
                        q.flush().unwrap();
                        // Everything this writer wrote before is in the tree now.
                        let t = tree.lock().unwrap();
                        for k in (w..BLOCKS).step_by(4) {
                            let want = acked[k as usize].load(Ordering::Acquire);
                            if want > 0 && q.get(k).is_none() {
                                assert_eq!(t.get(&k).map(|l| l.0), Some(want), "block {k}");
                            }
                        }
                    }
                }
            }));
        }
        for _ in 0..2 {
            let (q, acked, tree, stop) = (q.clone(), acked.clone(), tree.clone(), stop.clone());
            hs.push(std::thread::spawn(move || {
                let mut b = 0;
                while !stop.load(Ordering::Relaxed) {
                    b = (b + 7) % BLOCKS;
                    let seen = acked[b as usize].load(Ordering::Acquire);
                    // The pending leaf, else the tree's: the read path's order.
                    let got = q.get(b).or_else(|| tree.lock().unwrap().get(&b).copied());
                    if seen > 0 {
                        let l = got.unwrap_or_else(|| panic!("block {b} in neither place"));
                        assert!(l.0 >= seen, "block {b}: version {} after {seen}", l.0);
                        assert_eq!(l, leaf(b, l.0), "block {b}: a torn leaf");
                    }
                }
            }));
        }
        for h in hs.drain(..4) {
            h.join().unwrap();
        }
        q.flush().unwrap();
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        let t = tree.lock().unwrap();
        for b in 0..BLOCKS {
            let want = acked[b as usize].load(Ordering::Relaxed);
            if want > 0 {
                assert_eq!(t[&b], leaf(b, want), "block {b}");
            }
        }
        let s = q.stats();
        assert!(s.overridden > 0 && s.max_pending <= 32, "{s:?}");
        assert_eq!(s.queued, 4 * 3000);
    }
}
