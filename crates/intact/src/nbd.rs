//! An NBD server (the protocol of `nbd/doc/proto.md`, fixed newstyle handshake, simple
//! replies): the thin adapter that serves a [`Export`] (the disk engine) to real clients —
//! qemu-img, qemu-io, nbdcopy, fio's nbd engine, nbdfuse. Our own framing: the NBD server
//! crates on crates.io are unmaintained or client-only, and the part we need is small. Every
//! length a client sends is checked before it is used; a malformed request closes that
//! connection, never the server.
//!
//! Requests of one connection run on a few worker threads at once (clients keep several
//! in flight); replies carry the request's handle, so their order does not matter.

use std::io::{self, Read, Write};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const REP_ERR_INVALID: u32 = (1 << 31) + 3;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

const TF_HAS_FLAGS: u16 = 1;
const TF_READ_ONLY: u16 = 2;
const TF_SEND_FLUSH: u16 = 4;
const TF_SEND_FUA: u16 = 8;
const TF_SEND_TRIM: u16 = 32;
const TF_SEND_WRITE_ZEROES: u16 = 64;
const TF_CAN_MULTI_CONN: u16 = 256;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_CACHE: u16 = 5;
const CMD_WRITE_ZEROES: u16 = 6;

const CMD_FLAG_FUA: u16 = 1;

/// Errors sent to clients (NBD uses these errno values whatever the platform).
pub const EPERM: u32 = 1;
/// I/O error, and every integrity failure.
pub const EIO: u32 = 5;
/// Invalid request.
pub const EINVAL: u32 = 22;
/// No space (a write past the end).
pub const ENOSPC: u32 = 28;

/// The largest request payload accepted (the block-size constraint we advertise).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// The largest option payload accepted during the handshake.
const MAX_OPTION: u32 = 64 << 10;

/// What the server serves: the disk engine behind a few calls. Errors are NBD errno values.
pub trait Export: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Whether writes are refused.
    fn read_only(&self) -> bool;
    /// Reads `buf.len()` bytes at `off`.
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), u32>;
    /// Writes `data` at `off`; with `fua`, durable before the reply.
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), u32>;
    /// Makes every completed write durable.
    fn flush(&self) -> Result<(), u32>;
    /// Discards `[off, off + len)` (it reads as zeros afterwards here).
    fn trim(&self, off: u64, len: u64, fua: bool) -> Result<(), u32>;
    /// Writes zeros over `[off, off + len)`.
    fn write_zeroes(&self, off: u64, len: u64, fua: bool) -> Result<(), u32>;
}

/// A connection: its reading half and a writing half usable from other threads.
pub trait Conn: Read + Write + Send + 'static {
    /// A second handle to the same connection.
    fn try_clone_conn(&self) -> io::Result<Self>
    where
        Self: Sized;
}

impl Conn for std::os::unix::net::UnixStream {
    fn try_clone_conn(&self) -> io::Result<Self> {
        self.try_clone()
    }
}

impl Conn for std::net::TcpStream {
    fn try_clone_conn(&self) -> io::Result<Self> {
        self.try_clone()
    }
}

fn rd_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn rd_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn option_reply(w: &mut impl Write, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

fn transmission_flags(export: &dyn Export) -> u16 {
    let mut f = TF_HAS_FLAGS
        | TF_SEND_FLUSH
        | TF_SEND_FUA
        | TF_SEND_TRIM
        | TF_SEND_WRITE_ZEROES
        | TF_CAN_MULTI_CONN;
    if export.read_only() {
        f |= TF_READ_ONLY;
    }
    f
}

/// The handshake (fixed newstyle): returns true when the client moved to transmission,
/// false when it ended the session during option haggling.
pub fn handshake<S: Read + Write>(s: &mut S, export: &dyn Export) -> io::Result<bool> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello)?;
    let client = rd_u32(s)?;
    if client & !u32::from(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES) != 0 {
        return Err(bad(format!("unknown client flags {client:#x}")));
    }
    let no_zeroes = client & u32::from(FLAG_NO_ZEROES) != 0;
    loop {
        if rd_u64(s)? != IHAVEOPT {
            return Err(bad("an option without its magic"));
        }
        let opt = rd_u32(s)?;
        let len = rd_u32(s)?;
        if len > MAX_OPTION {
            return Err(bad(format!("an option of {len} bytes")));
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        match opt {
            OPT_EXPORT_NAME => {
                let mut b = Vec::with_capacity(134);
                b.extend_from_slice(&export.size().to_be_bytes());
                b.extend_from_slice(&transmission_flags(export).to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&b)?;
                return Ok(true);
            }
            OPT_ABORT => {
                option_reply(s, opt, REP_ACK, &[])?;
                return Ok(false);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    option_reply(s, opt, REP_ERR_INVALID, &[])?;
                    continue;
                }
                option_reply(s, opt, REP_SERVER, &0u32.to_be_bytes())?;
                option_reply(s, opt, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                if parse_info_request(&data).is_none() {
                    option_reply(s, opt, REP_ERR_INVALID, &[])?;
                    continue;
                }
                let mut info = Vec::with_capacity(12);
                info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                info.extend_from_slice(&export.size().to_be_bytes());
                info.extend_from_slice(&transmission_flags(export).to_be_bytes());
                option_reply(s, opt, REP_INFO, &info)?;
                let mut bs = Vec::with_capacity(14);
                bs.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                bs.extend_from_slice(&1u32.to_be_bytes());
                bs.extend_from_slice(&4096u32.to_be_bytes());
                bs.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
                option_reply(s, opt, REP_INFO, &bs)?;
                option_reply(s, opt, REP_ACK, &[])?;
                if opt == OPT_GO {
                    return Ok(true);
                }
            }
            _ => option_reply(s, opt, REP_ERR_UNSUP, &[])?,
        }
    }
}

/// Checks an INFO/GO payload: name length, name, count of info requests, the requests.
fn parse_info_request(d: &[u8]) -> Option<()> {
    let name_len = u32::from_be_bytes(d.get(..4)?.try_into().ok()?) as usize;
    let rest = d.get(4..)?;
    let after = rest.get(name_len..)?;
    let n = u16::from_be_bytes(after.get(..2)?.try_into().ok()?) as usize;
    (after.len() == 2 + 2 * n).then_some(())
}

/// One request of the transmission phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Command flags (FUA, NO_HOLE, ...).
    pub flags: u16,
    /// Command.
    pub kind: u16,
    /// The client's handle, echoed in the reply.
    pub handle: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u32,
}

/// Reads a request header (and nothing of its payload). `Ok(None)` at a clean end of the
/// connection.
pub fn read_request(r: &mut impl Read) -> io::Result<Option<Request>> {
    let mut h = [0u8; 28];
    match r.read_exact(&mut h[..1]) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut h[1..])?;
    let u32_at = |o: usize| u32::from_be_bytes(h[o..o + 4].try_into().expect("4"));
    let u64_at = |o: usize| u64::from_be_bytes(h[o..o + 8].try_into().expect("8"));
    if u32_at(0) != REQUEST_MAGIC {
        return Err(bad("a request without its magic"));
    }
    Ok(Some(Request {
        flags: u16::from_be_bytes([h[4], h[5]]),
        kind: u16::from_be_bytes([h[6], h[7]]),
        handle: u64_at(8),
        offset: u64_at(16),
        length: u32_at(24),
    }))
}

fn simple_reply(handle: u64, error: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&handle.to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// Runs one request against the export: the reply's bytes.
fn execute(export: &dyn Export, req: &Request, payload: Vec<u8>) -> Vec<u8> {
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let (off, len) = (req.offset, u64::from(req.length));
    let in_range = off.checked_add(len).is_some_and(|e| e <= export.size());
    let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && export.read_only() {
        return simple_reply(req.handle, EPERM, &[]);
    }
    if matches!(
        req.kind,
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE
    ) && !in_range
    {
        let e = if writes { ENOSPC } else { EINVAL };
        return simple_reply(req.handle, e, &[]);
    }
    let r = match req.kind {
        CMD_READ => {
            let mut reply = simple_reply(req.handle, 0, &[]);
            let head = reply.len();
            reply.resize(head + req.length as usize, 0);
            match export.read(off, &mut reply[head..]) {
                Ok(()) => return reply,
                Err(e) => Err(e),
            }
        }
        CMD_WRITE => export.write(off, &payload, fua),
        CMD_FLUSH => export.flush(),
        CMD_TRIM => export.trim(off, len, fua),
        CMD_WRITE_ZEROES => export.write_zeroes(off, len, fua),
        CMD_CACHE => Ok(()),
        _ => Err(EINVAL),
    };
    simple_reply(req.handle, r.err().unwrap_or(0), &[])
}

/// Serves one connection until the client disconnects or breaks the protocol: the
/// handshake, then requests on `workers` threads.
pub fn serve<C: Conn>(conn: C, export: Arc<dyn Export>, workers: usize) -> io::Result<()> {
    let mut reader = conn;
    if !handshake(&mut reader, &*export)? {
        return Ok(());
    }
    let writer = Arc::new(Mutex::new(reader.try_clone_conn()?));
    type Job = (Request, Vec<u8>);
    let (tx, rx) = mpsc::sync_channel::<Job>(workers * 2);
    let rx = Arc::new(Mutex::new(rx));
    let failed = Arc::new(Mutex::new(None::<io::Error>));
    let pool: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let (rx, writer, export, failed) =
                (rx.clone(), writer.clone(), export.clone(), failed.clone());
            std::thread::spawn(move || loop {
                let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok((req, payload)) = job else { return };
                let reply = execute(&*export, &req, payload);
                let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = w.write_all(&reply).and_then(|_| w.flush()) {
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                    return;
                }
            })
        })
        .collect();
    let result = (|| -> io::Result<()> {
        while let Some(req) = read_request(&mut reader)? {
            let mut payload = Vec::new();
            match req.kind {
                CMD_DISC => return Ok(()),
                CMD_WRITE => {
                    if req.length > MAX_PAYLOAD {
                        return Err(bad(format!("a write of {} bytes", req.length)));
                    }
                    payload = vec![0u8; req.length as usize];
                    reader.read_exact(&mut payload)?;
                }
                CMD_READ if req.length > MAX_PAYLOAD => {
                    let r = simple_reply(req.handle, EINVAL, &[]);
                    writer
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .write_all(&r)?;
                    continue;
                }
                _ => {}
            }
            if tx.send((req, payload)).is_err() {
                break;
            }
        }
        Ok(())
    })();
    drop(tx);
    for t in pool {
        let _ = t.join();
    }
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        if result.is_ok() {
            return Err(e);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An export in memory.
    struct Mem(Mutex<Vec<u8>>);

    impl Export for Mem {
        fn size(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn read_only(&self) -> bool {
            false
        }
        fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), u32> {
            let d = self.0.lock().unwrap();
            buf.copy_from_slice(&d[off as usize..off as usize + buf.len()]);
            Ok(())
        }
        fn write(&self, off: u64, data: &[u8], _: bool) -> Result<(), u32> {
            self.0.lock().unwrap()[off as usize..off as usize + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn flush(&self) -> Result<(), u32> {
            Ok(())
        }
        fn trim(&self, off: u64, len: u64, f: bool) -> Result<(), u32> {
            self.write_zeroes(off, len, f)
        }
        fn write_zeroes(&self, off: u64, len: u64, _: bool) -> Result<(), u32> {
            self.0.lock().unwrap()[off as usize..(off + len) as usize].fill(0);
            Ok(())
        }
    }

    /// A connection over two in-memory pipes (a socketpair).
    fn pair() -> (
        std::os::unix::net::UnixStream,
        std::os::unix::net::UnixStream,
    ) {
        std::os::unix::net::UnixStream::pair().unwrap()
    }

    fn request(kind: u16, flags: u16, handle: u64, off: u64, len: u32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&handle.to_be_bytes());
        b.extend_from_slice(&off.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    }

    fn go(c: &mut std::os::unix::net::UnixStream) -> u64 {
        let mut hello = [0u8; 18];
        c.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"NBDMAGIC");
        assert_eq!(&hello[8..16], b"IHAVEOPT");
        c.write_all(&3u32.to_be_bytes()).unwrap();
        // GO with an empty name and no info requests.
        let mut o = IHAVEOPT.to_be_bytes().to_vec();
        o.extend_from_slice(&OPT_GO.to_be_bytes());
        o.extend_from_slice(&6u32.to_be_bytes());
        o.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        c.write_all(&o).unwrap();
        let mut size = 0;
        loop {
            let mut h = [0u8; 20];
            c.read_exact(&mut h).unwrap();
            let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
            let mut d = vec![0u8; len as usize];
            c.read_exact(&mut d).unwrap();
            if kind == REP_ACK {
                return size;
            }
            assert_eq!(kind, REP_INFO);
            if d[..2] == [0, 0] {
                size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                let flags = u16::from_be_bytes(d[10..12].try_into().unwrap());
                assert_ne!(flags & TF_SEND_FLUSH, 0);
            }
        }
    }

    fn reply(c: &mut std::os::unix::net::UnixStream, data: usize) -> (u32, u64, Vec<u8>) {
        let mut h = [0u8; 16];
        c.read_exact(&mut h).unwrap();
        assert_eq!(
            u32::from_be_bytes(h[..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC
        );
        let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let handle = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut d = vec![0u8; if err == 0 { data } else { 0 }];
        c.read_exact(&mut d).unwrap();
        (err, handle, d)
    }

    #[test]
    fn a_session_writes_reads_trims_flushes_and_refuses_what_is_out_of_range() {
        let (mut c, s) = pair();
        let export: Arc<dyn Export> = Arc::new(Mem(Mutex::new(vec![0; 1 << 16])));
        let server = std::thread::spawn(move || serve(s, export, 1));
        assert_eq!(go(&mut c), 1 << 16);
        let mut w = request(CMD_WRITE, CMD_FLAG_FUA, 7, 100, 5);
        w.extend_from_slice(b"hello");
        c.write_all(&w).unwrap();
        assert_eq!(reply(&mut c, 0), (0, 7, vec![]));
        c.write_all(&request(CMD_READ, 0, 8, 98, 9)).unwrap();
        assert_eq!(reply(&mut c, 9), (0, 8, b"\0\0hello\0\0".to_vec()));
        c.write_all(&request(CMD_TRIM, 0, 9, 101, 2)).unwrap();
        assert_eq!(reply(&mut c, 0).0, 0);
        c.write_all(&request(CMD_READ, 0, 10, 100, 5)).unwrap();
        assert_eq!(reply(&mut c, 5).2, b"h\0\0lo");
        c.write_all(&request(CMD_FLUSH, 0, 11, 0, 0)).unwrap();
        assert_eq!(reply(&mut c, 0), (0, 11, vec![]));
        // Out of range: EINVAL for a read, ENOSPC for a write (its payload still read).
        c.write_all(&request(CMD_READ, 0, 12, (1 << 16) - 1, 2))
            .unwrap();
        assert_eq!(reply(&mut c, 2).0, EINVAL);
        let mut w = request(CMD_WRITE, 0, 13, u64::MAX - 1, 4);
        w.extend_from_slice(b"abcd");
        c.write_all(&w).unwrap();
        assert_eq!(reply(&mut c, 0).0, ENOSPC);
        // An unknown command: EINVAL, and the connection goes on.
        c.write_all(&request(99, 0, 14, 0, 0)).unwrap();
        assert_eq!(reply(&mut c, 0).0, EINVAL);
        c.write_all(&request(CMD_READ, 0, 15, 100, 1)).unwrap();
        assert_eq!(reply(&mut c, 1).2, b"h");
        c.write_all(&request(CMD_DISC, 0, 16, 0, 0)).unwrap();
        server.join().unwrap().unwrap();
    }

    #[test]
    fn a_malformed_request_closes_only_its_connection() {
        let export: Arc<dyn Export> = Arc::new(Mem(Mutex::new(vec![0; 4096])));
        // A bad magic; a write too large to buffer; an option too large.
        for case in 0..3 {
            let (mut c, s) = pair();
            let e = export.clone();
            let server = std::thread::spawn(move || serve(s, e, 2));
            if case == 2 {
                let mut hello = [0u8; 18];
                c.read_exact(&mut hello).unwrap();
                c.write_all(&3u32.to_be_bytes()).unwrap();
                let mut o = IHAVEOPT.to_be_bytes().to_vec();
                o.extend_from_slice(&OPT_GO.to_be_bytes());
                o.extend_from_slice(&u32::MAX.to_be_bytes());
                c.write_all(&o).unwrap();
            } else {
                go(&mut c);
                let mut r = request(CMD_WRITE, 0, 1, 0, MAX_PAYLOAD + 1);
                if case == 0 {
                    r[0] ^= 0xff;
                }
                c.write_all(&r).unwrap();
            }
            assert!(server.join().unwrap().is_err(), "case {case}");
        }
        // The export still serves a new connection.
        let (mut c, s) = pair();
        let server = std::thread::spawn(move || serve(s, export, 1));
        go(&mut c);
        c.write_all(&request(CMD_READ, 0, 3, 0, 4)).unwrap();
        assert_eq!(reply(&mut c, 4).0, 0);
        drop(c);
        server.join().unwrap().unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Any bytes a client sends, in the handshake or after it: the server answers or
        /// closes the connection, never panics, and never reads past what it was sent.
        #[test]
        fn arbitrary_client_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            after_go in any::<bool>(),
        ) {
            let (mut c, s) = pair();
            let export: Arc<dyn Export> = Arc::new(Mem(Mutex::new(vec![0; 8192])));
            let server = std::thread::spawn(move || serve(s, export, 2));
            if after_go {
                go(&mut c);
            }
            let _ = c.write_all(&bytes);
            c.shutdown(std::net::Shutdown::Write).unwrap();
            // Drain whatever the server says until it closes.
            let mut sink = Vec::new();
            let _ = c.read_to_end(&mut sink);
            let r = server.join();
            prop_assert!(r.is_ok(), "the server thread panicked");
        }
    }

    #[test]
    fn info_requests_are_checked_before_use() {
        assert!(parse_info_request(&[0, 0, 0, 0, 0, 0]).is_some());
        assert!(parse_info_request(&[0, 0, 0, 1, b'a', 0, 1, 0, 3]).is_some());
        assert!(parse_info_request(&[0, 0, 0, 9, b'a', 0, 0]).is_none());
        assert!(parse_info_request(&[0, 0, 0, 0, 0, 2, 0, 3]).is_none());
        assert!(parse_info_request(&[0, 0]).is_none());
    }
}
