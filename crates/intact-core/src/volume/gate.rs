//! Bulk writes give way at the engine lock (issue 14, "no request waits behind a bulk
//! writer").
//!
//! The engine runs one request at a time. A bulk writer (a copy, a backup, a VM image)
//! sends large writes back to back; each holds the lock while it pushes up to a few MiB
//! through its file's scheme. With several of them queued at the lock, a small request
//! (a lookup, a create, a read of another file) waited behind all of them: tens of
//! milliseconds at the 99th percentile, hundreds at the worst, on a machine whose cores
//! the bulk writer's crypto already fills.
//!
//! The gate orders the lock's users without a second lock on the hot path:
//! - every request that is not a bulk write counts itself in [`Gate::waiting`] while it
//!   waits for the lock ([`Gate::light`]);
//! - bulk writes take turns ([`Gate::bulk`]): one at a time goes to the lock, and only once
//!   no other request waits there, or after [`MAX_YIELD`] at most, so that a steady stream
//!   of small requests slows a bulk writer but never stops it.
//!
//! A small request then waits for at most one bulk write's hold of the lock, instead of
//! a queue of them.
//!
//! [`Drain`] paces a writer that fills memory faster than checkpoints write it out: each
//! of its writes waits for the time a checkpoint takes to write that many bytes, instead
//! of the writer running until the hard limit and then waiting for whole checkpoints.
//! What it waits is short and even, so the kernel's writeback of the mount, which every
//! writer of the mount shares, never stalls for a checkpoint's length.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Writes of at least this many bytes are bulk writes.
pub(super) const BULK_WRITE: usize = 128 << 10;
/// Bulk writes longer than this are applied in slices of this length, each its own turn
/// at the engine lock ([`super::Volume::write_ino`]): a small request then waits for one
/// slice at most. 256 KiB keeps a slice's encryption without the lock
/// ([`super::file_io::SEAL_UNLOCKED`]) and its fixed costs (two visits, a log record) small
/// beside its data.
pub(super) const BULK_SLICE: usize = 256 << 10;
/// Longest time a bulk write gives way to other requests before it goes to the lock.
pub(super) const MAX_YIELD: Duration = Duration::from_millis(20);
/// How often a bulk write that gives way looks again.
const POLL: Duration = Duration::from_micros(100);

/// Longest wait of one paced write ([`Drain::delay`]).
pub(super) const MAX_PACE: Duration = Duration::from_millis(50);
/// Checkpoints smaller than this say little about the rate (their fixed costs dominate)
/// and are not measured.
const MIN_MEASURED: usize = 4 << 20;
/// Seconds per byte assumed until a checkpoint was measured: 100 MiB/s, a slow disk's.
/// The first measured checkpoint replaces it.
const PRIOR_PER_BYTE: f64 = 1.0 / (100u64 << 20) as f64;

/// How fast checkpoints write out what writers leave in memory (see the module's
/// documentation).
#[derive(Debug, Default)]
pub(super) struct Drain {
    /// Seconds per byte of the recent checkpoints (a moving average of the time per byte,
    /// so that one slow checkpoint counts as much as it slowed the store), once one was
    /// measured ([`PRIOR_PER_BYTE`] until then).
    per_byte: Option<f64>,
    /// The checkpoint in flight: when it began and the bytes it writes out.
    began: Option<(Instant, usize)>,
}

impl Drain {
    /// A checkpoint that writes out `bytes` begins.
    pub(super) fn begin(&mut self, bytes: usize) {
        self.began = Some((Instant::now(), bytes));
    }

    /// The checkpoint in flight ended (`ok`: it wrote everything out).
    pub(super) fn end(&mut self, ok: bool) {
        let Some((at, bytes)) = self.began.take() else {
            return;
        };
        if !ok || bytes < MIN_MEASURED {
            return;
        }
        let now = at.elapsed().as_secs_f64() / bytes as f64;
        self.per_byte = Some(match self.per_byte {
            Some(p) => 0.5 * p + 0.5 * now,
            None => now,
        });
    }

    /// Seconds per byte checkpoints take now: the recent average, or more when the
    /// checkpoint in flight has taken longer than that average allows (the store slowed
    /// down).
    fn per_byte(&self) -> f64 {
        let avg = self.per_byte.unwrap_or(PRIOR_PER_BYTE);
        match self.began {
            Some((at, bytes)) if bytes >= MIN_MEASURED => {
                avg.max(at.elapsed().as_secs_f64() / bytes as f64)
            }
            _ => avg,
        }
    }

    /// How long a write of `len` bytes waits, at most [`MAX_PACE`]: the time checkpoints
    /// take to write `len` bytes out, times `pressure` (at least 1: how far past the limit
    /// memory is, so that a writer gaining on the store slows further).
    pub(super) fn delay(&self, len: usize, pressure: f64) -> Duration {
        let secs = len as f64 * self.per_byte() * pressure.max(1.0);
        Duration::from_secs_f64(secs.min(MAX_PACE.as_secs_f64()))
    }
}

/// The engine lock's order of service (see the module's documentation).
#[derive(Debug, Default)]
pub(super) struct Gate {
    /// Requests other than bulk writes waiting for the engine lock.
    waiting: AtomicUsize,
    /// Held by the one bulk write that may go to the lock.
    turn: Mutex<()>,
}

/// A request other than a bulk write, counted while it waits for the lock.
pub(super) struct Light<'a>(&'a Gate);

impl Drop for Light<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Release);
    }
}

impl Gate {
    /// Counts a request that is about to wait for the engine lock; drop the guard once the
    /// lock is held.
    pub(super) fn light(&self) -> Light<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Light(self)
    }

    /// Requests counted by [`Gate::light`] right now.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// A bulk write's turn: it holds the returned guard until it has left the engine lock.
    /// Returns once no other request waits for the lock, or after `max_yield`.
    pub(super) fn bulk(&self, max_yield: Duration) -> MutexGuard<'_, ()> {
        let turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        let start = Instant::now();
        while self.waiting() > 0 && start.elapsed() < max_yield {
            std::thread::sleep(POLL);
        }
        turn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn light_guards_count_while_alive() {
        let g = Gate::default();
        assert_eq!(g.waiting(), 0);
        let a = g.light();
        let b = g.light();
        assert_eq!(g.waiting(), 2);
        drop(a);
        assert_eq!(g.waiting(), 1);
        drop(b);
        assert_eq!(g.waiting(), 0);
    }

    #[test]
    fn a_bulk_turn_waits_for_light_requests_to_pass() {
        let g = Arc::new(Gate::default());
        let light = g.light();
        let passed = Arc::new(AtomicBool::new(false));
        let (g2, p2) = (g.clone(), passed.clone());
        let t = std::thread::spawn(move || {
            let _turn = g2.bulk(Duration::from_secs(60));
            p2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !passed.load(Ordering::SeqCst),
            "went ahead of a waiting request"
        );
        drop(light);
        t.join().unwrap();
        assert!(passed.load(Ordering::SeqCst));
    }

    #[test]
    fn a_bulk_turn_gives_way_for_a_bounded_time_only() {
        let g = Gate::default();
        let _light = g.light();
        let start = Instant::now();
        drop(g.bulk(Duration::from_millis(30)));
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(30),
            "gave way for {took:?} only"
        );
        assert!(took < Duration::from_secs(10), "gave way for {took:?}");
    }

    #[test]
    fn drain_paces_at_the_measured_rate() {
        let mut d = Drain::default();
        // Before a checkpoint was measured: the prior, 100 MiB/s (10 ms per MiB).
        let prior = Duration::from_secs_f64(0.01);
        assert_eq!(d.delay(1 << 20, 1.0), prior);
        // A small checkpoint is not measured.
        d.begin(MIN_MEASURED - 1);
        d.end(true);
        assert_eq!(d.delay(1 << 20, 1.0), prior);
        // A failed one is not either.
        d.begin(64 << 20);
        d.end(false);
        assert_eq!(d.delay(1 << 20, 1.0), prior);
        d.begin(64 << 20);
        std::thread::sleep(Duration::from_millis(200));
        d.end(true);
        // At most 64 MiB / 0.2 s = 320 MiB/s: 1 MiB waits at least about 3 ms, and less
        // than the cap (the sleep may last longer than asked, never shorter).
        let w = d.delay(1 << 20, 1.0);
        assert!(w >= Duration::from_micros(3000), "{w:?}");
        assert!(w < MAX_PACE, "{w:?}");
        // Twice the bytes, twice the wait (below the cap).
        let w2 = d.delay(2 << 20, 1.0);
        assert!(w2 > w + w / 2 && w2 < w * 3, "{w:?} {w2:?}");
        // The cap.
        assert_eq!(d.delay(1 << 40, 1.0), MAX_PACE);
        // An end with no begin changes nothing.
        d.end(true);
        assert_eq!(d.delay(1 << 20, 1.0), w);
    }

    #[test]
    fn drain_slows_with_pressure_and_a_slow_checkpoint_in_flight() {
        let mut d = Drain::default();
        d.begin(64 << 20);
        std::thread::sleep(Duration::from_millis(100));
        d.end(true);
        let base = d.delay(1 << 20, 1.0);
        // Pressure below 1 counts as 1; above, it multiplies.
        assert_eq!(d.delay(1 << 20, 0.5), base);
        let pressed = d.delay(1 << 20, 3.0);
        assert!(
            pressed > base * 2 && pressed < base * 4,
            "{base:?} {pressed:?}"
        );
        // A checkpoint in flight for longer than the rate allows lowers the rate.
        // 64 MiB in flight is late only after about 100 ms.
        d.begin(64 << 20);
        assert_eq!(d.delay(1 << 20, 1.0), base, "in time: the average");
        d.begin(8 << 20);
        std::thread::sleep(Duration::from_millis(200));
        let late = d.delay(1 << 20, 1.0);
        assert!(late > base * 10, "{base:?} {late:?}");
    }

    #[test]
    fn a_checkpoint_of_exactly_the_measured_size_counts() {
        let mut d = Drain::default();
        let prior = d.delay(1 << 20, 1.0);
        d.begin(MIN_MEASURED);
        std::thread::sleep(Duration::from_millis(100));
        d.end(true);
        assert!(d.delay(1 << 20, 1.0) > prior, "not measured");
    }

    #[test]
    fn a_small_checkpoint_in_flight_does_not_count_as_late() {
        let mut d = Drain::default();
        d.begin(64 << 20);
        std::thread::sleep(Duration::from_millis(20));
        d.end(true);
        let base = d.delay(1 << 20, 1.0);
        d.begin(MIN_MEASURED - 1);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(d.delay(1 << 20, 1.0), base);
    }

    /// The moving average of two checkpoints lies between their own rates.
    #[test]
    fn drain_averages_the_time_per_byte() {
        let one = |ms| {
            let mut d = Drain::default();
            d.begin(64 << 20);
            std::thread::sleep(Duration::from_millis(ms));
            d.end(true);
            d
        };
        let (fast, slow) = (one(20).delay(1 << 20, 1.0), one(200).delay(1 << 20, 1.0));
        let mut d = one(20);
        d.begin(64 << 20);
        std::thread::sleep(Duration::from_millis(200));
        d.end(true);
        let avg = d.delay(1 << 20, 1.0);
        assert!(fast < avg && avg < slow, "{fast:?} < {avg:?} < {slow:?}");
    }

    #[test]
    fn drain_follows_a_slower_store() {
        let mut d = Drain::default();
        d.begin(64 << 20);
        std::thread::sleep(Duration::from_millis(20));
        d.end(true);
        let fast = d.delay(1 << 20, 1.0);
        d.begin(64 << 20);
        std::thread::sleep(Duration::from_millis(1000));
        d.end(true);
        let slow = d.delay(1 << 20, 1.0);
        assert!(slow > fast * 2, "{fast:?} then {slow:?}");
    }

    #[test]
    fn bulk_writes_take_turns() {
        let g = Arc::new(Gate::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (g, inside, most) = (g.clone(), inside.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let _turn = g.bulk(MAX_YIELD);
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
    }
}
