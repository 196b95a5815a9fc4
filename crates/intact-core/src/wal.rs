//! The volume's log: what every request changed, written to the store as the request
//! ends, so that nothing acknowledged waits in memory for a seal (docs/design.md, "The
//! log").
//!
//! The log is a chain of **segments**, objects named `log.<id>` (16 hex digits). A segment
//! is a sequence of **records**; a record is
//!
//! ```text
//! len: u32 LE | AES-256-GCM(payload) | tag (16)      len = payload length + 16
//! nonce = segment id (8, LE) || offset of the record in the segment (4, LE)
//! AAD   = "intact log v1" || volume id (16) || segment id (8, LE) || offset (8, LE) || len (4, LE)
//! ```
//!
//! so a record can be neither read without the key nor moved, truncated, replayed into
//! another segment or volume, nor altered. A segment id is a write counter drawn from the
//! session's reservation (docs/design.md, "Counters"), so no (key, nonce) pair is ever used
//! twice, across crashes too: a segment is never appended to by a later session.
//!
//! Every segment begins with a [`Payload::Begin`] record naming where the previous
//! segment ends (its id and the offset past its last record that counts); a segment that
//! fills up ends with a [`Payload::Next`] record naming its successor. The trusted anchor
//! names where replay begins (`first`, `start`) and the last position a seal covered
//! (`last`, `end`): the chain from `first` to `last` is found backwards through the
//! `Begin` links, and every record in `[start, end)` must be present and authentic, or it
//! is an integrity failure. Records past `end` (the **tail**, written since the last seal)
//! are authentic but not fresh: they are read while they decrypt, and followed into the
//! next segment through `Next`.

use crate::crypto::{Gcm, SubKey, NONCE_LEN, TAG_LEN};
use crate::error::{Error, Failure, Result, Subject};
use crate::store::UntrustedStore;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

/// Prefix of segment names.
pub const SEGMENT_PREFIX: &str = "log.";
/// A segment is closed (a [`Payload::Next`] appended) once it is this long.
pub const SEGMENT_LIMIT: u64 = 64 << 20;
/// Longest record payload accepted (a longer length field is damage, or an attack).
pub const RECORD_MAX: usize = 256 << 20;
/// Room set aside ahead of the appends ([`UntrustedStore::reserve`]), so that the records
/// of requests that free space (an unlink, a truncation) still fit on a full disk.
const RESERVE_AHEAD: u64 = 1 << 20;
/// The reservation is topped up when less than this is left.
const RESERVE_LOW: u64 = 256 << 10;
const AAD_LABEL: &[u8] = b"intact log v1";
const KIND_BEGIN: u8 = 1;
const KIND_NEXT: u8 = 2;
const KIND_GROUP: u8 = 3;

/// The name of segment `id`.
pub fn segment_name(id: u64) -> String {
    format!("{SEGMENT_PREFIX}{id:016x}")
}

/// The id of a segment object's name, if it is one.
pub fn segment_id(name: &str) -> Option<u64> {
    let hex = name.strip_prefix(SEGMENT_PREFIX)?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// A position in the log: a segment and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LogPos {
    /// Segment id.
    pub seg: u64,
    /// Byte offset in the segment.
    pub off: u64,
}

/// What a record holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// The first record of a segment: where the previous segment's records end (`None`
    /// for the first segment of a chain whose predecessor was folded into a checkpoint).
    Begin {
        /// End of the previous segment's counted records.
        prev: Option<LogPos>,
    },
    /// The last record of a full segment: the id of the next.
    Next {
        /// The next segment.
        seg: u64,
    },
    /// A group of changes, applied all or nothing (the engine's encoding).
    Group(Vec<u8>),
}

impl Payload {
    fn encode(&self) -> Vec<u8> {
        match self {
            Payload::Begin { prev } => {
                let mut b = vec![KIND_BEGIN];
                match prev {
                    Some(p) => {
                        b.push(1);
                        b.extend_from_slice(&p.seg.to_le_bytes());
                        b.extend_from_slice(&p.off.to_le_bytes());
                    }
                    None => b.push(0),
                }
                b
            }
            Payload::Next { seg } => {
                let mut b = vec![KIND_NEXT];
                b.extend_from_slice(&seg.to_le_bytes());
                b
            }
            Payload::Group(g) => {
                let mut b = Vec::with_capacity(1 + g.len());
                b.push(KIND_GROUP);
                b.extend_from_slice(g);
                b
            }
        }
    }

    fn decode(mut b: Vec<u8>) -> Option<Payload> {
        let kind = *b.first()?;
        let u64_at = |b: &[u8], at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        match kind {
            KIND_BEGIN => match (b.get(1), b.len()) {
                (Some(0), 2) => Some(Payload::Begin { prev: None }),
                (Some(1), 18) => Some(Payload::Begin {
                    prev: Some(LogPos {
                        seg: u64_at(&b, 2)?,
                        off: u64_at(&b, 10)?,
                    }),
                }),
                _ => None,
            },
            KIND_NEXT if b.len() == 9 => Some(Payload::Next {
                seg: u64_at(&b, 1)?,
            }),
            KIND_GROUP => {
                b.remove(0);
                Some(Payload::Group(b))
            }
            _ => None,
        }
    }
}

/// The record keys and the volume they belong to.
pub struct LogKeys {
    gcm: Gcm,
    volume_id: [u8; 16],
}

impl LogKeys {
    /// Keys of the log of volume `volume_id` (`key`: the volume's log key).
    pub fn new(key: &SubKey, volume_id: [u8; 16]) -> LogKeys {
        LogKeys {
            gcm: Gcm::new(key),
            volume_id,
        }
    }

    fn nonce_aad(&self, at: LogPos, len: u32) -> ([u8; NONCE_LEN], Vec<u8>) {
        let mut nonce = [0u8; NONCE_LEN];
        nonce[..8].copy_from_slice(&at.seg.to_le_bytes());
        nonce[8..].copy_from_slice(&(at.off as u32).to_le_bytes());
        let mut aad = Vec::with_capacity(AAD_LABEL.len() + 36);
        aad.extend_from_slice(AAD_LABEL);
        aad.extend_from_slice(&self.volume_id);
        aad.extend_from_slice(&at.seg.to_le_bytes());
        aad.extend_from_slice(&at.off.to_le_bytes());
        aad.extend_from_slice(&len.to_le_bytes());
        (nonce, aad)
    }

    /// The bytes of a record at `at`.
    fn seal(&self, at: LogPos, payload: &Payload) -> Vec<u8> {
        let mut body = payload.encode();
        let len = (body.len() + TAG_LEN) as u32;
        let (nonce, aad) = self.nonce_aad(at, len);
        let tag = self.gcm.seal(nonce, &aad, &mut body);
        let mut out = Vec::with_capacity(4 + len as usize);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&tag);
        out
    }

    /// The payload of the record at `at` whose length field is `len`, from its sealed body
    /// (`None`: not authentic).
    fn open(&self, at: LogPos, len: u32, mut body: Vec<u8>) -> Option<Payload> {
        if (len as usize) < TAG_LEN + 1 || body.len() != len as usize {
            return None;
        }
        let (nonce, aad) = self.nonce_aad(at, len);
        let split = body.len() - TAG_LEN;
        let tag = body.split_off(split);
        self.gcm.open(nonce, &aad, &tag, &mut body).ok()?;
        Payload::decode(body)
    }
}

/// Places records in one segment: seals each at its position and hands it to the
/// [`LogIo`] that writes it. Writes are not synced: [`Writer::sync`] (or a `sync` of the
/// segment's name) makes them durable.
pub struct Writer {
    at: LogPos,
}

impl Writer {
    /// Starts segment `seg` with its [`Payload::Begin`] record (`prev`: where the previous
    /// segment's counted records end). The segment must not exist yet. Returns the writer
    /// and the `Begin` record's ticket ([`LogIo::flush_through`]).
    pub fn begin(
        io: &LogIo,
        keys: &LogKeys,
        seg: u64,
        prev: Option<LogPos>,
    ) -> Result<(Writer, u64)> {
        let mut w = Writer {
            at: LogPos { seg, off: 0 },
        };
        let (_, ticket) = w.append(io, keys, &Payload::Begin { prev })?;
        Ok((w, ticket))
    }

    /// Where the next record goes (the end of what was appended).
    pub fn pos(&self) -> LogPos {
        self.at
    }

    /// The segment's object name.
    pub fn name(&self) -> String {
        segment_name(self.at.seg)
    }

    /// Whether the segment reached [`SEGMENT_LIMIT`] and should be closed.
    pub fn full(&self) -> bool {
        self.at.off >= SEGMENT_LIMIT
    }

    /// Appends a record: seals it and queues it for writing ([`LogIo`]). Returns the
    /// position past it and its ticket: the record is in the store once
    /// [`LogIo::flush_through`] of that ticket returns `Ok`. If the write fails, the
    /// segment must not be appended to again (its tail is unknown): the caller starts
    /// another ([`LogIo::take_failure`]).
    pub fn append(
        &mut self,
        io: &LogIo,
        keys: &LogKeys,
        payload: &Payload,
    ) -> Result<(LogPos, u64)> {
        let bytes = keys.seal(self.at, payload);
        if bytes.len() - 4 - TAG_LEN > RECORD_MAX + 1 || self.at.off > u32::MAX as u64 {
            return Err(Error::Invalid("log record too large".into()));
        }
        let end = self.at.off + bytes.len() as u64;
        let ticket = io.push(self.at, bytes);
        self.at.off = end;
        Ok((self.at, ticket))
    }

    /// Makes the segment's records durable (once they are written).
    pub fn sync(&self, store: &dyn UntrustedStore) -> Result<()> {
        store.sync(&[self.name()])
    }
}

/// Writes the log's records to the store, in log order, without the engine lock
/// (issue 14, docs/design.md "Log records written outside the engine lock").
///
/// The engine places and seals each record under its lock and queues it here with a
/// *ticket* (tickets follow log order). A request waits for its ticket after it let go of
/// the lock ([`LogIo::flush_through`]): the first waiter to find no write under way writes
/// everything queued, contiguous records of a segment in one store call, while the others
/// wait; so a store call that stalls (a pwrite behind the file system's journal commit)
/// stalls the requests whose records it carries, not every request behind the engine
/// lock. A request returns only once every record up to its own is written, and replay
/// stops at the first record missing, so no record counts before all earlier ones do.
///
/// A failed write fails its record and every later one (the segment's tail is unknown):
/// their waiters get the error, nothing later is written, and the engine, which learns of
/// it under its lock ([`LogIo::take_failure`]), goes back to the last seal and starts a
/// new segment.
pub struct LogIo {
    store: Arc<dyn UntrustedStore>,
    state: Mutex<IoState>,
    settled: Condvar,
}

/// A sealed record waiting to be written.
struct Queued {
    ticket: u64,
    at: LogPos,
    bytes: Vec<u8>,
}

/// Failed ranges of tickets kept for waiters that have not looked yet (a waiter looks at
/// once when woken; failures are rare).
const FAILED_KEPT: usize = 64;

#[derive(Default)]
struct IoState {
    /// Records not written yet, in ticket order.
    queue: VecDeque<Queued>,
    /// The next ticket to give.
    next: u64,
    /// Every ticket below this is written, but those in a failed range.
    written: u64,
    /// A waiter is writing (records taken from the queue).
    writing: bool,
    /// A failure the engine has not taken yet: tickets from this one on fail.
    failure: Option<(u64, Failure)>,
    /// Failures the engine took: tickets in `[from, to)` failed.
    failed: VecDeque<(u64, u64, Failure)>,
    /// The segment whose room was last reserved, and how much of it (from its start).
    reserved: (u64, u64),
}

impl IoState {
    fn failure_of(&self, ticket: u64) -> Option<&Failure> {
        if let Some((from, f)) = &self.failure {
            if ticket >= *from {
                return Some(f);
            }
        }
        self.failed
            .iter()
            .find(|(from, to, _)| (*from..*to).contains(&ticket))
            .map(|(_, _, f)| f)
    }
}

impl LogIo {
    /// Writes the records of a log in `store`.
    pub fn new(store: Arc<dyn UntrustedStore>) -> LogIo {
        LogIo {
            store,
            state: Mutex::new(IoState::default()),
            settled: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IoState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues the record `bytes` placed at `at`; returns its ticket. Records must be
    /// queued in log order. Nothing is queued after a failure the engine has not taken:
    /// such a record fails with it.
    fn push(&self, at: LogPos, bytes: Vec<u8>) -> u64 {
        let mut st = self.lock();
        let ticket = st.next;
        st.next += 1;
        if st.failure.is_none() {
            st.queue.push_back(Queued { ticket, at, bytes });
        }
        ticket
    }

    /// The ticket of the last record queued (`None`: none yet, or none since the engine
    /// took the last failure: the failed records no longer count).
    pub fn last_ticket(&self) -> Option<u64> {
        let st = self.lock();
        let last = st.next.checked_sub(1)?;
        match st.failed.back() {
            Some(&(_, to, _)) if last < to => None,
            _ => Some(last),
        }
    }

    /// Records queued and not written yet.
    pub fn pending(&self) -> usize {
        let st = self.lock();
        st.queue.len() + usize::from(st.writing)
    }

    /// Returns once the record of `ticket` and every one before it are in the store
    /// (written, not synced), writing what is queued if no one else is; or the failure
    /// that lost it.
    pub fn flush_through(&self, ticket: u64) -> Result<()> {
        let mut st = self.lock();
        loop {
            if let Some(f) = st.failure_of(ticket) {
                return Err(f.io_error("the log"));
            }
            if ticket < st.written || ticket >= st.next {
                return Ok(());
            }
            if st.writing {
                st = self.settled.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let batch: Vec<Queued> = st.queue.drain(..).collect();
            let Some(last) = batch.last().map(|q| q.ticket) else {
                // An unwritten ticket with no failure is queued.
                debug_assert!(false, "ticket {ticket}: neither written, failed nor queued");
                return Ok(());
            };
            st.writing = true;
            let mut reserved = st.reserved;
            drop(st);
            let r = self.write(&batch, &mut reserved);
            st = self.lock();
            st.writing = false;
            st.reserved = reserved;
            match r {
                Ok(()) => st.written = last + 1,
                Err((from, e)) => {
                    st.written = from;
                    st.failure = Some((from, Failure::of(&e)));
                    st.queue.clear();
                }
            }
            self.settled.notify_all();
        }
    }

    /// Writes `batch`: each run of records contiguous in one segment in one store call.
    /// Fails with the first ticket of the run that failed.
    fn write(
        &self,
        batch: &[Queued],
        reserved: &mut (u64, u64),
    ) -> std::result::Result<(), (u64, Error)> {
        let mut i = 0;
        let mut buf = Vec::new();
        while i < batch.len() {
            let first = &batch[i];
            let mut end = first.at.off + first.bytes.len() as u64;
            let mut j = i + 1;
            while j < batch.len() && batch[j].at.seg == first.at.seg && batch[j].at.off == end {
                end += batch[j].bytes.len() as u64;
                j += 1;
            }
            let name = segment_name(first.at.seg);
            if reserved.0 != first.at.seg {
                *reserved = (first.at.seg, 0);
            }
            if end + RESERVE_LOW > reserved.1 {
                // Best effort: on a full disk what is left of the reservation still serves.
                let want = end + RESERVE_AHEAD;
                match self.store.reserve(&name, want) {
                    Ok(()) => reserved.1 = want,
                    Err(e) => tracing::debug!(error = %e, "cannot reserve room for the log"),
                }
            }
            let r = if j == i + 1 {
                self.store.write_at(&name, first.at.off, &first.bytes)
            } else {
                buf.clear();
                for q in &batch[i..j] {
                    buf.extend_from_slice(&q.bytes);
                }
                self.store.write_at(&name, first.at.off, &buf)
            };
            r.map_err(|e| (first.ticket, e))?;
            i = j;
        }
        Ok(())
    }

    /// Takes a failure of a write (once): the engine then goes back to the last seal and
    /// starts a new segment. Every record queued until now failed with it. Returns the
    /// first failed ticket and the failure.
    pub fn take_failure(&self) -> Option<(u64, Error)> {
        let mut st = self.lock();
        let (from, f) = st.failure.take()?;
        let to = st.next;
        st.written = to;
        st.queue.clear();
        if st.failed.len() == FAILED_KEPT {
            st.failed.pop_front();
        }
        st.failed.push_back((from, to, f.clone()));
        Some((from, f.io_error("the log")))
    }
}

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Where it starts.
    pub at: LogPos,
    /// Where it ends (the start of the next).
    pub end: LogPos,
    /// What it holds.
    pub payload: Payload,
}

/// A segment's records, read from its start while they are authentic.
#[derive(Debug)]
pub struct Segment {
    /// Its id.
    pub id: u64,
    /// Its `Begin` link (`None` if the segment has no authentic first record, or names no
    /// predecessor).
    pub prev: Option<LogPos>,
    /// Whether the first record is an authentic `Begin`.
    pub begun: bool,
    /// The offset past `Begin` (0 if not begun).
    pub start: u64,
    /// The authentic records after `Begin`, in order.
    pub records: Vec<Record>,
    /// The offset past the last authentic record.
    pub end: u64,
}

/// Reads segment `id` from its start, stopping at the first record that is missing, torn
/// or not authentic.
pub fn read_segment(store: &dyn UntrustedStore, keys: &LogKeys, id: u64) -> Result<Segment> {
    let name = segment_name(id);
    let bytes = store.read_all(&name)?.unwrap_or_default();
    let mut seg = Segment {
        id,
        prev: None,
        begun: false,
        start: 0,
        records: Vec::new(),
        end: 0,
    };
    let mut off = 0usize;
    while off + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[off..off + 4].try_into().expect("4"));
        let start = off + 4;
        let Some(body) = bytes.get(start..start + len as usize) else {
            break;
        };
        if len as usize > RECORD_MAX + TAG_LEN + 1 {
            break;
        }
        let at = LogPos {
            seg: id,
            off: off as u64,
        };
        let Some(payload) = keys.open(at, len, body.to_vec()) else {
            break;
        };
        let end = LogPos {
            seg: id,
            off: (start + len as usize) as u64,
        };
        match (&payload, seg.begun) {
            (Payload::Begin { prev }, false) if off == 0 => {
                seg.prev = *prev;
                seg.begun = true;
                seg.start = end.off;
            }
            (_, false) | (Payload::Begin { .. }, true) => break,
            _ => seg.records.push(Record { at, end, payload }),
        }
        off = end.off as usize;
        seg.end = end.off;
        if matches!(
            seg.records.last(),
            Some(Record {
                payload: Payload::Next { .. },
                ..
            })
        ) {
            break;
        }
    }
    Ok(seg)
}

/// What the trusted anchor says of the log: replay begins at `start`, and every record
/// before `end` is covered by a seal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRef {
    /// Where replay begins.
    pub start: LogPos,
    /// The end of the sealed records.
    pub end: LogPos,
}

/// The log read back: the groups to replay, in order, and where it ends.
#[derive(Debug)]
pub struct Chain {
    /// `(where the record starts, its group bytes, whether a seal covers it)`.
    pub groups: Vec<(LogPos, Vec<u8>, bool)>,
    /// Past the last authentic record (where a new segment's `Begin` points).
    pub end: LogPos,
    /// Every segment the chain went through, in order.
    pub segments: Vec<u64>,
}

fn broken(what: impl Into<String>) -> Error {
    Error::tampered(Subject::Journal, None, what)
}

/// Reads the log the anchor names: the sealed part (every record of it present and
/// authentic, else an integrity failure) and the tail after it.
pub fn read_chain(store: &dyn UntrustedStore, keys: &LogKeys, r: &LogRef) -> Result<Chain> {
    // Backwards from the sealed end's segment to the start's, through the Begin links.
    let mut segs = vec![read_segment(store, keys, r.end.seg)?];
    let mut limits = vec![None];
    while segs.last().expect("one").id != r.start.seg {
        let s = segs.last().expect("one");
        let prev = match (s.begun, s.prev) {
            (true, Some(p)) if p.seg < s.id => p,
            _ => {
                return Err(broken(format!(
                    "log segment {:016x} does not continue the sealed log",
                    s.id
                )))
            }
        };
        if segs.len() > 1 << 20 {
            return Err(broken("the log's segments form no chain"));
        }
        limits.push(Some(prev.off));
        segs.push(read_segment(store, keys, prev.seg)?);
    }
    segs.reverse();
    limits.reverse();
    // `limits[k]`: where segment k's counted records end (named by its successor); the
    // last segment's is the sealed end, and its tail goes on past it.
    let n = segs.len();
    limits[n - 1] = Some(r.end.off);
    let mut chain = Chain {
        groups: Vec::new(),
        end: r.start,
        segments: Vec::new(),
    };
    for (k, (s, limit)) in segs.into_iter().zip(limits).enumerate() {
        let limit = limit.expect("set above");
        let last = k + 1 == n;
        if !s.begun || s.end < limit {
            return Err(broken(format!(
                "log segment {:016x} is shorter than the sealed log",
                s.id
            )));
        }
        chain.segments.push(s.id);
        let from = if k == 0 { r.start.off } else { 0 };
        let mut reached = s.records.first().map_or(s.end, |rec| rec.at.off);
        if k == 0 && from > 0 && !s.records.iter().any(|rec| rec.at.off == from) && from != s.end {
            return Err(broken("the sealed log's start is not at a record"));
        }
        let mut next = None;
        let ends: Vec<u64> = s.records.iter().map(|rec| rec.end.off).collect();
        for rec in s.records {
            if rec.at.off < from {
                continue;
            }
            if !last && rec.at.off >= limit {
                break;
            }
            let sealed = rec.end.off <= limit;
            if !last && !sealed {
                return Err(broken("a record straddles the end of a log segment"));
            }
            reached = rec.end.off;
            match rec.payload {
                Payload::Group(g) => chain.groups.push((rec.at, g, sealed)),
                Payload::Next { seg } => next = Some(seg),
                Payload::Begin { .. } => unreachable!("read_segment stops at a second Begin"),
            }
        }
        if !last && reached != limit {
            return Err(broken(format!(
                "log segment {:016x} does not end where its successor says",
                s.id
            )));
        }
        if last && limit != from && limit != s.start && !ends.contains(&limit) {
            return Err(broken("the sealed log does not end at a record"));
        }
        chain.end = LogPos {
            seg: s.id,
            off: reached.max(from),
        };
        if last {
            // The tail: further segments through `Next`, while they continue this one.
            let mut next = next;
            while let Some(id) = next.take() {
                if id <= chain.end.seg {
                    break;
                }
                let t = read_segment(store, keys, id)?;
                if !t.begun || t.prev != Some(chain.end) {
                    break;
                }
                chain.segments.push(t.id);
                chain.end = LogPos {
                    seg: t.id,
                    off: t.end,
                };
                for rec in t.records {
                    match rec.payload {
                        Payload::Group(g) => chain.groups.push((rec.at, g, false)),
                        Payload::Next { seg } => next = Some(seg),
                        Payload::Begin { .. } => unreachable!("read_segment stops at Begin"),
                    }
                }
            }
        }
    }
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn key(b: u8) -> SubKey {
        crate::crypto::MasterKey::from_bytes([b; 32]).derive(crate::crypto::label::LOG, &[])
    }

    fn keys() -> LogKeys {
        LogKeys::new(&key(7), [1; 16])
    }

    fn group(n: u8) -> Payload {
        Payload::Group(vec![n; 1 + n as usize])
    }

    /// A writer of segment `seg` whose `Begin` is written.
    fn begin(io: &LogIo, k: &LogKeys, seg: u64, prev: Option<LogPos>) -> Writer {
        let (w, t) = Writer::begin(io, k, seg, prev).unwrap();
        io.flush_through(t).unwrap();
        w
    }

    /// Appends `p` and writes it.
    fn app(w: &mut Writer, io: &LogIo, k: &LogKeys, p: &Payload) -> LogPos {
        let (end, t) = w.append(io, k, p).unwrap();
        io.flush_through(t).unwrap();
        end
    }

    fn mem() -> (Arc<MemStore>, LogIo) {
        let s = Arc::new(MemStore::new());
        let io = LogIo::new(s.clone());
        (s, io)
    }

    fn groups(c: &Chain) -> Vec<(Vec<u8>, bool)> {
        c.groups.iter().map(|(_, g, s)| (g.clone(), *s)).collect()
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(segment_name(0x1f), "log.000000000000001f");
        assert_eq!(segment_id("log.000000000000001f"), Some(0x1f));
        assert_eq!(segment_id("log.1f"), None);
        assert_eq!(segment_id("journal.0"), None);
    }

    #[test]
    fn records_read_back_in_order_and_stop_at_damage() {
        let (s, io) = mem();
        let k = keys();
        let mut w = begin(&io, &k, 5, None);
        let start = w.pos();
        let ends: Vec<LogPos> = (1..=3).map(|n| app(&mut w, &io, &k, &group(n))).collect();
        let seg = read_segment(&s, &k, 5).unwrap();
        assert!(seg.begun);
        assert_eq!(seg.prev, None);
        assert_eq!(seg.records.len(), 3);
        assert_eq!(seg.records[0].at, start);
        assert_eq!(seg.records[2].end, ends[2]);
        assert_eq!(seg.end, ends[2].off);
        // A flipped byte in the second record ends the segment before it.
        let mut b = s.read_all("log.0000000000000005").unwrap().unwrap();
        b[ends[0].off as usize + 6] ^= 1;
        s.replace("log.0000000000000005", &b).unwrap();
        let seg = read_segment(&s, &k, 5).unwrap();
        assert_eq!(seg.records.len(), 1);
        assert_eq!(seg.end, ends[0].off);
        // A torn record (cut short) too.
        s.set_len("log.0000000000000005", ends[0].off + 10).unwrap();
        assert_eq!(read_segment(&s, &k, 5).unwrap().records.len(), 1);
    }

    /// The local store reserves room by writing zeros past the records: the segment reads
    /// the same, a writer appends over the zeros, and what it appended reads back.
    #[test]
    fn zeros_past_the_records_end_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(crate::store::LocalDirStore::open(dir.path()).unwrap());
        let io = LogIo::new(s.clone());
        let k = keys();
        let mut w = begin(&io, &k, 5, None);
        let ends: Vec<LogPos> = (1..=3).map(|n| app(&mut w, &io, &k, &group(n))).collect();
        let name = segment_name(5);
        let len = s.len(&name).unwrap().unwrap();
        assert!(len >= ends[2].off + RESERVE_LOW, "zeros reserved: {len}");
        assert!(
            len <= ends[2].off + RESERVE_AHEAD,
            "reserved too much: {len}"
        );
        let bytes = s.read_all(&name).unwrap().unwrap();
        assert!(bytes[ends[2].off as usize..].iter().all(|&b| b == 0));
        let seg = read_segment(&s, &k, 5).unwrap();
        assert_eq!(seg.records.len(), 3);
        assert_eq!(seg.end, ends[2].off);
        // Appending past the reservation reserves more, still zeros past the records.
        let big = Payload::Group(vec![7u8; RESERVE_AHEAD as usize]);
        let end = app(&mut w, &io, &k, &big);
        assert!(s.len(&name).unwrap().unwrap() >= end.off + RESERVE_LOW);
        let seg = read_segment(&s, &k, 5).unwrap();
        assert_eq!(seg.records.len(), 4);
        assert_eq!(seg.records[3].payload, big);
        assert_eq!(seg.end, end.off);
        // The next segment gets room of its own.
        let mut w6 = begin(&io, &k, 6, Some(end));
        let end6 = app(&mut w6, &io, &k, &group(1));
        let len6 = s.len(&segment_name(6)).unwrap().unwrap();
        assert!(len6 >= end6.off + RESERVE_LOW, "segment 6: {len6}");
    }

    #[test]
    fn a_record_does_not_verify_elsewhere() {
        let (s, io) = mem();
        let k = keys();
        let mut w = begin(&io, &k, 5, None);
        app(&mut w, &io, &k, &group(1));
        let b = s.read_all("log.0000000000000005").unwrap().unwrap();
        // Another segment id, another volume, another key: nothing reads.
        s.replace("log.0000000000000006", &b).unwrap();
        assert!(!read_segment(&s, &k, 6).unwrap().begun);
        let other_volume = LogKeys::new(&key(7), [2; 16]);
        assert!(!read_segment(&s, &other_volume, 5).unwrap().begun);
        let other_key = LogKeys::new(&key(8), [1; 16]);
        assert!(!read_segment(&s, &other_key, 5).unwrap().begun);
    }

    /// Two segments: 5 (rolled with Next) and 9, sealed up to the first record of 9.
    fn two_segments(io: &LogIo, k: &LogKeys) -> (LogPos, LogPos, LogPos) {
        let mut w = begin(io, k, 5, None);
        let start = w.pos();
        app(&mut w, io, k, &group(1));
        let end5 = app(&mut w, io, k, &Payload::Next { seg: 9 });
        let mut w = begin(io, k, 9, Some(end5));
        let sealed = app(&mut w, io, k, &group(2));
        let tail = app(&mut w, io, k, &group(3));
        (start, sealed, tail)
    }

    #[test]
    fn a_chain_reads_sealed_records_then_the_tail() {
        let (s, io) = mem();
        let k = keys();
        let (start, sealed, tail) = two_segments(&io, &k);
        let c = read_chain(&s, &k, &LogRef { start, end: sealed }).unwrap();
        assert_eq!(
            groups(&c),
            vec![(vec![1; 2], true), (vec![2; 3], true), (vec![3; 4], false)]
        );
        assert_eq!(c.end, tail);
        assert_eq!(c.segments, vec![5, 9]);
        // Sealed up to the end of segment 5 only: segment 9 is followed as the tail.
        let end5 = LogPos {
            seg: 5,
            off: read_segment(&s, &k, 5).unwrap().end,
        };
        let c = read_chain(&s, &k, &LogRef { start, end: end5 }).unwrap();
        assert_eq!(
            groups(&c),
            vec![(vec![1; 2], true), (vec![2; 3], false), (vec![3; 4], false)]
        );
        assert_eq!(c.end, tail);
        // Sealed up to segment 9's Begin only (a seal right after it was started).
        let begin9 = LogPos {
            seg: 9,
            off: read_segment(&s, &k, 9).unwrap().start,
        };
        let c = read_chain(&s, &k, &LogRef { start, end: begin9 }).unwrap();
        assert_eq!(
            groups(&c),
            vec![(vec![1; 2], true), (vec![2; 3], false), (vec![3; 4], false)]
        );
        // Replay from the second record on.
        let from = read_segment(&s, &k, 9).unwrap().records[0].at;
        let c = read_chain(
            &s,
            &k,
            &LogRef {
                start: from,
                end: sealed,
            },
        )
        .unwrap();
        assert_eq!(groups(&c), vec![(vec![2; 3], true), (vec![3; 4], false)]);
    }

    #[test]
    fn a_damaged_sealed_part_is_an_integrity_failure() {
        let k = keys();
        // The first segment deleted, truncated, or a record of it damaged.
        for damage in 0..3 {
            let (s, io) = mem();
            let (start, sealed, _) = two_segments(&io, &k);
            let name = segment_name(5);
            match damage {
                0 => s.delete(&name).unwrap(),
                1 => s.set_len(&name, 40).unwrap(),
                _ => {
                    let mut b = s.read_all(&name).unwrap().unwrap();
                    b[30] ^= 1;
                    s.replace(&name, &b).unwrap();
                }
            }
            let e = read_chain(&s, &k, &LogRef { start, end: sealed }).unwrap_err();
            assert!(e.is_tampered(), "damage {damage}: {e}");
        }
        // The sealed record of the last segment missing: a failure; only its tail: not.
        let (s, io) = mem();
        let (start, sealed, _) = two_segments(&io, &k);
        s.set_len(&segment_name(9), sealed.off + 3).unwrap();
        let c = read_chain(&s, &k, &LogRef { start, end: sealed }).unwrap();
        assert_eq!(c.end, sealed);
        s.set_len(&segment_name(9), sealed.off - 1).unwrap();
        assert!(read_chain(&s, &k, &LogRef { start, end: sealed })
            .unwrap_err()
            .is_tampered());
    }

    #[test]
    fn a_segment_that_does_not_continue_the_chain_is_not_followed() {
        let (s, io) = mem();
        let k = keys();
        let mut w = begin(&io, &k, 5, None);
        let start = w.pos();
        let sealed = app(&mut w, &io, &k, &group(1));
        app(&mut w, &io, &k, &Payload::Next { seg: 9 });
        // Segment 9 names another predecessor: the tail stops at Next.
        let mut w9 = begin(&io, &k, 9, Some(LogPos { seg: 5, off: 1 }));
        app(&mut w9, &io, &k, &group(2));
        let c = read_chain(&s, &k, &LogRef { start, end: sealed }).unwrap();
        assert_eq!(groups(&c), vec![(vec![1; 2], true)]);
        assert_eq!(c.segments, vec![5]);
        // A sealed end in a segment that does not link back to the start: a failure.
        let mut w7 = begin(&io, &k, 7, None);
        let end7 = app(&mut w7, &io, &k, &group(3));
        assert!(read_chain(&s, &k, &LogRef { start, end: end7 })
            .unwrap_err()
            .is_tampered());
    }

    #[test]
    fn an_empty_log_reads_empty() {
        let (s, io) = mem();
        let k = keys();
        let w = begin(&io, &k, 3, Some(LogPos { seg: 1, off: 99 }));
        let c = read_chain(
            &s,
            &k,
            &LogRef {
                start: w.pos(),
                end: w.pos(),
            },
        )
        .unwrap();
        assert!(c.groups.is_empty());
        assert_eq!(c.end, w.pos());
    }

    /// Queued records reach the store only when a waiter writes them; one waiter writes
    /// everything queued, a contiguous run in one call, and its ticket's waiters return.
    #[test]
    fn queued_records_are_written_together_by_a_waiter() {
        let s = Arc::new(crate::store::FaultStore::new_mem());
        let io = LogIo::new(s.clone());
        let k = keys();
        let (mut w, _) = Writer::begin(&io, &k, 5, None).unwrap();
        let tickets: Vec<u64> = (1..=3)
            .map(|n| w.append(&io, &k, &group(n)).unwrap().1)
            .collect();
        assert_eq!(tickets, vec![1, 2, 3]);
        assert_eq!(io.last_ticket(), Some(3));
        assert_eq!(io.pending(), 4);
        assert_eq!(s.write_calls(), 0, "nothing written before a waiter");
        // A wait for the second record writes all four (one run, one call).
        io.flush_through(tickets[1]).unwrap();
        assert_eq!(io.pending(), 0);
        assert_eq!(s.write_calls(), 1);
        let seg = read_segment(&s, &k, 5).unwrap();
        assert_eq!(seg.records.len(), 3);
        assert_eq!(seg.end, w.pos().off);
        // Already written: no store call.
        io.flush_through(tickets[2]).unwrap();
        assert_eq!(s.write_calls(), 1);
        // Records of two segments: one call each.
        let (_, t) = w.append(&io, &k, &Payload::Next { seg: 6 }).unwrap();
        let (mut w6, _) = Writer::begin(&io, &k, 6, Some(w.pos())).unwrap();
        let (_, t6) = w6.append(&io, &k, &group(4)).unwrap();
        assert!(t < t6);
        io.flush_through(t6).unwrap();
        assert_eq!(s.write_calls(), 3);
        assert_eq!(read_segment(&s, &k, 6).unwrap().records.len(), 1);
    }

    /// A failed write fails its record and every later one, never the earlier ones; nothing
    /// is written after it until the engine takes the failure, and then the failed tickets
    /// still fail.
    #[test]
    fn a_failed_write_fails_its_record_and_the_later_ones() {
        let s = Arc::new(crate::store::FaultStore::new_mem());
        let io = LogIo::new(s.clone());
        let k = keys();
        let mut w = begin(&io, &k, 5, None);
        let ok = app(&mut w, &io, &k, &group(1));
        // The next mutating call (the write of the two records below) fails.
        s.set_plan(crate::store::FaultPlan {
            fail_eio_on: Some(s.attempts() + 1),
            ..Default::default()
        });
        let (_, t2) = w.append(&io, &k, &group(2)).unwrap();
        let (_, t3) = w.append(&io, &k, &group(3)).unwrap();
        let e = io.flush_through(t3).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(io.flush_through(t2).is_err());
        assert!(io.flush_through(t2 - 1).is_ok(), "an earlier record failed");
        // Queued after the failure: failed too, and never written.
        let calls = s.write_calls();
        let (_, t4) = w.append(&io, &k, &group(4)).unwrap();
        assert!(io.flush_through(t4).is_err());
        assert_eq!(s.write_calls(), calls);
        assert_eq!(read_segment(&s, &k, 5).unwrap().end, ok.off);
        // The engine takes it once; a new segment's records are written again.
        assert_eq!(io.last_ticket(), Some(t4), "not taken: a seal waits for it");
        assert!(io.take_failure().is_some());
        assert!(io.take_failure().is_none());
        assert_eq!(io.last_ticket(), None, "taken: nothing left to wait for");
        let mut w6 = begin(&io, &k, 6, None);
        let (_, t5) = w6.append(&io, &k, &group(5)).unwrap();
        assert_eq!(io.last_ticket(), Some(t5), "queued after the failure");
        io.flush_through(t5).unwrap();
        assert_eq!(read_segment(&s, &k, 6).unwrap().records.len(), 1);
        for t in [t2, t3, t4] {
            assert!(io.flush_through(t).is_err(), "ticket {t}");
        }
        // A second failure: the tickets of both stay failed.
        s.set_plan(crate::store::FaultPlan {
            fail_eio_on: Some(s.attempts() + 1),
            ..Default::default()
        });
        let (_, t6) = w6.append(&io, &k, &group(6)).unwrap();
        assert!(io.flush_through(t6).is_err());
        assert!(io.take_failure().is_some());
        for t in [t2, t3, t4, t6] {
            assert!(io.flush_through(t).is_err(), "ticket {t}");
        }
        io.flush_through(t5).unwrap();
    }

    /// Many threads queue (in log order, as under the engine lock) and wait at once: every
    /// wait returns with its record in the store, and the segment reads back in order.
    #[test]
    fn concurrent_waiters_each_see_their_record_written() {
        let (s, io) = mem();
        let io = Arc::new(io);
        let k = Arc::new(keys());
        let w = Arc::new(Mutex::new(begin(&io, &k, 5, None)));
        let threads: Vec<_> = (0..4u8)
            .map(|i| {
                let (s, io, k, w) = (s.clone(), io.clone(), k.clone(), w.clone());
                std::thread::spawn(move || {
                    for n in 0..50u8 {
                        let (end, t) = w
                            .lock()
                            .unwrap()
                            .append(&io, &k, &group(i * 50 + n))
                            .unwrap();
                        io.flush_through(t).unwrap();
                        let len = s.len(&segment_name(5)).unwrap().unwrap();
                        assert!(len >= end.off, "returned before its record was written");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let seg = read_segment(&s, &k, 5).unwrap();
        assert_eq!(seg.records.len(), 200);
        assert_eq!(seg.end, w.lock().unwrap().pos().off);
        assert_eq!(io.pending(), 0);
    }
}
