//! The anchor's one writer: every anchor is composed from the last one stored, under one
//! lock, so that a seal of the log (an fsync's) and a checkpoint running at the same time
//! never store an older composition over a newer one (docs/design.md, "The log").

#[allow(unused_imports)]
use super::*;

/// The trusted store's writer.
pub(super) struct Sealer {
    state: Mutex<SealerState>,
    trusted: Arc<dyn TrustedStore>,
    key: SubKey,
}

struct SealerState {
    /// The anchor last stored (what the trusted store holds), and the seal that stored it.
    last: Anchor,
    last_n: u64,
    /// An anchor whose store call failed, with the number of the seal that tried: it may
    /// have landed all the same (a going back checks).
    attempted: Option<(Vec<u8>, Anchor, u64)>,
}

impl Sealer {
    /// The writer of `trusted`, which holds `last`.
    pub(super) fn new(last: Anchor, trusted: Arc<dyn TrustedStore>, key: SubKey) -> Sealer {
        Sealer {
            state: Mutex::new(SealerState {
                last,
                last_n: 0,
                attempted: None,
            }),
            trusted,
            key,
        }
    }

    fn lock(&self) -> MutexGuard<'_, SealerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The anchor last stored.
    pub(super) fn last(&self) -> Anchor {
        self.lock().last.clone()
    }

    /// Stores `f` applied to the last anchor, at the next epoch, for seal number `n`;
    /// returns it and its bytes.
    pub(super) fn store(&self, n: u64, f: impl FnOnce(&mut Anchor)) -> Result<(Anchor, Vec<u8>)> {
        let mut s = self.lock();
        let mut a = s.last.clone();
        f(&mut a);
        a.epoch = s.last.epoch + 1;
        let bytes = a.encode(&self.key);
        match self.trusted.store(&bytes) {
            Ok(()) => {
                s.last = a.clone();
                s.last_n = n;
                s.attempted = None;
                Ok((a, bytes))
            }
            Err(e) => {
                s.attempted = Some((bytes, a, n));
                Err(e)
            }
        }
    }

    /// The trusted store holds `a` now (stored by an open or a going back).
    pub(super) fn reset(&self, a: Anchor) {
        let mut s = self.lock();
        s.last = a;
        s.last_n = 0;
        s.attempted = None;
    }

    /// Whether seal number `n` stored an anchor (its I/O may have failed after it did).
    pub(super) fn stored_by(&self, n: u64) -> bool {
        n != 0 && self.lock().last_n == n
    }

    /// The anchor a failed store call tried to store, and its seal's number, if the
    /// trusted store holds exactly those bytes (the call failed after they landed).
    pub(super) fn landed(&self, bytes: &[u8]) -> Option<(Anchor, u64)> {
        let s = self.lock();
        s.attempted
            .as_ref()
            .filter(|(b, _, _)| b == bytes)
            .map(|(_, a, n)| (a.clone(), *n))
    }
}
