//! An S3-compatible object store as the untrusted store (issue 9): `s3://BUCKET/PREFIX`.
//!
//! The engine addresses its objects by offset, as files; an S3 object can only be written
//! whole. Each of the engine's objects is therefore kept as **chunk objects** of
//! [`CHUNK`] bytes, `PREFIX/NAME@IIIIIIIIIIIIIIII` (the chunk's index in 16 hex digits,
//! so that a listing returns a name's chunks in order and next to each other):
//!
//! - **Length.** The last chunk is stored with exactly the bytes the object has in it; an
//!   empty object is chunk 0 with no bytes. An object's length is therefore its last
//!   chunk's index times [`CHUNK`] plus that chunk's size, read with one listing. A chunk
//!   missing before the last (a hole) and the part past the end of a short chunk read as
//!   zeros.
//! - **Writes stay in memory until a sync** (the trait's contract: nothing is durable
//!   before `sync`, and any subset of the unsynced writes may reach the store), as the
//!   written ranges of each chunk. A sync uploads each changed chunk whole, many at once
//!   ([`CONCURRENCY`]); a chunk only partly written is first read back from the store (or
//!   the read cache) and merged. One request per chunk, never one per block: a checkpoint that changes 256
//!   blocks of a file sends one PUT. Reads see unsynced writes.
//! - **Reads fetch whole chunks** and keep the last [`CACHED_CHUNKS`] of them: a run of
//!   block reads costs one GET per chunk. A read that goes on from the chunk before starts
//!   fetching the next ones in the background, [`READ_AHEAD`] at first and twice as many
//!   at each chunk read in order, up to [`READ_AHEAD_MAX`]: a sequential reader finds its
//!   next chunks arrived or on their way, where a fixed window made it wait one round trip
//!   every few chunks. A deletion or a truncation forgets what it
//!   changes, an upload replaces it, and a GET that overlapped either is not kept.
//! - **Round trips.** What the store knows of an object (its length) comes from one
//!   listing at its first use, kept until [`UntrustedStore::forget_cached`]. A file's
//!   three objects (`.d`, `.m`, `.c`) are listed together, the ones the listing lacks
//!   known absent; a new file's objects are said absent by the engine
//!   ([`UntrustedStore::absent`]: their ids are fresh and random), so its first write
//!   lists nothing; and the first length asked of an object, or its first read in its first
//!   chunk, lists it and fetches that chunk at the same time, without the state lock, and
//!   for a file's `.d` or `.m` the other's first chunk too (on speculation: a GET that
//!   finds nothing where the file has no tree). A small file is thus read cold in one round
//!   trip, and created in none before the sync's PUTs.
//! - **What an upload stored is kept** in the read cache: a chunk appended to after a sync
//!   (the log's, at every seal of an fsync) is merged with those bytes, not read back
//!   first; a replace of a small object whose length is known (the published signed root,
//!   at every seal) lists nothing. A volume's objects have one writer, so what this store
//!   stored is what the bucket holds; a follower, which writes nothing, forgets it all at
//!   each refresh ([`UntrustedStore::forget_cached`]).
//! - **Truncation** marks the chunks past the new end stale: they read as zeros, and the
//!   next sync deletes them after it has stored the new last chunk.
//! - **Memory** held by unsynced writes is bounded ([`MAX_DIRTY`]): past it a write first
//!   uploads what is dirty, as a local file system writes back its page cache.
//!
//! Requests go through `object_store`'s S3 client: request signing, and retries with
//! exponential backoff on throttling (503 SlowDown, 429) and server errors. No object is
//! larger than a chunk, so each upload is one PUT: a large file is many chunks sent at
//! once, which is what a multipart upload would do for one large object. A store that
//! cannot be reached is an I/O error naming the URL; nothing the engine sealed is lost by
//! it, because the anchor is stored only after the sync that makes the sealed objects
//! durable has returned.

use crate::error::{Error, Result};
use crate::store::{check_name, UntrustedStore};
use bytes::Bytes;
use futures_util::stream::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as OsPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Bytes per chunk object (1 MiB): one request moves up to this much, and a small write
/// costs the read and write of one chunk at the next sync.
pub const CHUNK: u64 = 1 << 20;
/// Requests in flight at once during a sync or a listing's deletions.
pub const CONCURRENCY: usize = 32;
/// Unsynced bytes held in memory before a write uploads them.
pub const MAX_DIRTY: usize = 256 << 20;
/// Chunks fetched ahead of a read that goes on from the chunk before: the first window,
/// doubled at each chunk read in order up to [`READ_AHEAD_MAX`].
pub const READ_AHEAD: u64 = 4;
/// The largest read-ahead window of one object (16 MiB in flight: at 50 ms a round trip,
/// 320 MB/s for one sequential reader).
pub const READ_AHEAD_MAX: u64 = 16;
/// Chunks read ahead in flight at once, over every object.
const FETCHING_MAX: usize = 64;
/// Whole chunks kept for reads (48 MiB).
pub const CACHED_CHUNKS: usize = 48;
/// How long opening the store waits for its first answer.
const PROBE_WAIT: Duration = Duration::from_secs(15);
/// Lengths of objects with nothing unsynced kept in memory (a bound on what the store
/// remembers of a volume of 10^6 files).
const CLEAN_KEPT: usize = 16_384;
/// Separates an object's name from its chunk index (a character the engine's names never
/// hold and S3 keys take unencoded).
const SEP: char = '@';

/// Where an S3 volume lives: `s3://BUCKET[/PREFIX][?KEY=VALUE&...]`.
///
/// The query takes any of `object_store`'s S3 settings (`endpoint`, `region`,
/// `virtual_hosted_style_request`, `allow_http`, ...). What the URL leaves out comes from
/// the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
/// `AWS_REGION`, `AWS_ENDPOINT_URL`, ...), then from the profile `AWS_PROFILE` (else
/// `default`) in `~/.aws/credentials` and `~/.aws/config`. Requests are path-style
/// (`ENDPOINT/BUCKET/KEY`), which every S3-compatible server takes, unless
/// `virtual_hosted_style_request=true`; an `http://` endpoint is allowed without TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    /// The bucket.
    pub bucket: String,
    /// The key prefix, empty or ending in `/`.
    pub prefix: String,
    /// Settings from the query, in order.
    pub options: Vec<(String, String)>,
}

impl S3Url {
    /// Parses `s3://BUCKET[/PREFIX][?K=V&...]`.
    pub fn parse(url: &str) -> Result<S3Url> {
        let bad = |why: &str| {
            Error::Config(format!(
                "{url}: {why} (s3://BUCKET[/PREFIX][?endpoint=URL&region=R])"
            ))
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("not an s3:// URL"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(bad(
                "the bucket must be 3 to 63 lowercase letters, digits, '-' or '.'",
            ));
        }
        let prefix = prefix.trim_end_matches('/');
        if !prefix.is_empty() {
            check_name(prefix).map_err(|_| bad("the prefix must be a relative path"))?;
            if !prefix.bytes().all(key_byte) {
                return Err(bad(
                    "the prefix may hold letters, digits, '.', '_', '-' and '/'",
                ));
            }
        }
        let mut options = Vec::new();
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(&format!("{kv:?} is not KEY=VALUE")))?;
            k.parse::<AmazonS3ConfigKey>()
                .map_err(|_| bad(&format!("unknown setting {k:?}")))?;
            options.push((k.to_string(), v.to_string()));
        }
        Ok(S3Url {
            bucket: bucket.to_string(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            options,
        })
    }

    /// `s3://BUCKET/PREFIX`, without the settings (which may hold an endpoint's address
    /// but never a secret: credentials come from the environment or a profile).
    pub fn display(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix.trim_end_matches('/'))
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display())
    }
}

/// A section of an AWS INI file (`~/.aws/credentials`, `~/.aws/config`): its keys.
fn ini_section(text: &str, section: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim();
            inside =
                name == section || name.strip_prefix("profile ").map(str::trim) == Some(section);
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
    }
    out
}

/// Credentials and region from the AWS profile, for what the environment left unset.
fn from_profile(mut b: AmazonS3Builder) -> AmazonS3Builder {
    let Some(home) = std::env::var_os("HOME").map(std::path::PathBuf::from) else {
        return b;
    };
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let read = |var: &str, default: &str| {
        let path = std::env::var_os(var)
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| home.join(default));
        std::fs::read_to_string(path).unwrap_or_default()
    };
    let creds = ini_section(
        &read("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"),
        &profile,
    );
    let config = ini_section(&read("AWS_CONFIG_FILE", ".aws/config"), &profile);
    let set = |b: AmazonS3Builder, key: AmazonS3ConfigKey, value: Option<&String>| match value {
        Some(v) if b.get_config_value(&key).is_none() => b.with_config(key, v.clone()),
        _ => b,
    };
    b = set(
        b,
        AmazonS3ConfigKey::AccessKeyId,
        creds.get("aws_access_key_id"),
    );
    b = set(
        b,
        AmazonS3ConfigKey::SecretAccessKey,
        creds.get("aws_secret_access_key"),
    );
    b = set(b, AmazonS3ConfigKey::Token, creds.get("aws_session_token"));
    b = set(b, AmazonS3ConfigKey::Region, config.get("region"));
    b = set(b, AmazonS3ConfigKey::Endpoint, config.get("endpoint_url"));
    b
}

/// Bytes the engine's names and a prefix may hold: S3 takes them in a key as they are.
fn key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/')
}

/// A chunk to upload: the object's name, the chunk's index, the chunk as it was taken,
/// and the object's length then.
type Job = (String, u64, Chunk, u64);
/// A truncation's stale chunks to delete: the object, the first stale index, and its
/// count of truncations then.
type Cut = (String, u64, u64);

/// One chunk's unsynced state.
#[derive(Debug, Clone, Default)]
struct Chunk {
    /// Written bytes at their offsets in the chunk (bytes outside `mask` are zeros).
    data: Vec<u8>,
    /// The written ranges, sorted and merged.
    mask: Vec<(usize, usize)>,
    /// Bytes at the chunk's start whose stored copy is still valid (a truncation or a
    /// chunk past the stored end lowers it; 0: nothing stored counts).
    base: usize,
    /// Bumped at each change, so that a sync knows whether what it uploaded is current.
    version: u64,
}

impl Chunk {
    fn fresh(base: usize) -> Chunk {
        Chunk {
            base,
            ..Chunk::default()
        }
    }

    fn write(&mut self, at: usize, bytes: &[u8]) {
        let end = at + bytes.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[at..end].copy_from_slice(bytes);
        self.mask.push((at, end));
        self.mask.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(self.mask.len());
        for &(a, b) in &self.mask {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.mask = merged;
        self.version += 1;
    }

    /// Forgets everything at and past `at` (written or stored).
    fn cut(&mut self, at: usize) {
        self.data.truncate(at);
        self.mask.retain(|r| r.0 < at);
        if let Some(last) = self.mask.last_mut() {
            last.1 = last.1.min(at);
        }
        self.base = self.base.min(at);
        self.version += 1;
    }

    /// Whether the written ranges cover `0..len` (no stored byte is needed).
    fn covers(&self, len: usize) -> bool {
        len == 0 || self.mask.first().is_some_and(|r| r.0 == 0 && r.1 >= len)
    }

    /// Lays the written ranges over `buf`, which holds the chunk's bytes from `from`.
    fn overlay(&self, from: usize, buf: &mut [u8]) {
        let to = from + buf.len();
        for &(a, b) in &self.mask {
            let (a, b) = (a.max(from), b.min(to));
            if a < b {
                buf[a - from..b - from].copy_from_slice(&self.data[a..b]);
            }
        }
    }
}

/// What the store knows of one object.
#[derive(Debug, Clone, Default)]
struct Obj {
    len: u64,
    /// Chunks changed since the last sync, by index.
    dirty: BTreeMap<u64, Chunk>,
    /// Stored chunks from this index on are stale (a truncation): they read as zeros and
    /// the next sync deletes those not written again.
    stale_from: Option<u64>,
    /// Bumped when `stale_from` is set.
    cuts: u64,
}

impl Obj {
    fn last_chunk(len: u64) -> u64 {
        if len == 0 {
            0
        } else {
            (len - 1) / CHUNK
        }
    }

    /// Bytes its dirty chunks hold.
    fn held(&self) -> usize {
        self.dirty.values().map(|c| c.data.len()).sum()
    }

    fn is_clean(&self) -> bool {
        self.dirty.is_empty() && self.stale_from.is_none()
    }

    fn stale(&self, idx: u64) -> bool {
        self.stale_from.is_some_and(|s| idx >= s)
    }

    /// The dirty chunk `idx`, made if missing: `base` is the stored bytes that still count
    /// (all of them below the old end, none past it or in a stale chunk).
    fn chunk(&mut self, idx: u64, old_len: u64) -> &mut Chunk {
        let base = if self.stale(idx) || idx > Obj::last_chunk(old_len) || old_len == 0 {
            0
        } else {
            (old_len - idx * CHUNK).min(CHUNK) as usize
        };
        self.dirty.entry(idx).or_insert_with(|| Chunk::fresh(base))
    }

    /// The object's length becomes `new`: the new last chunk is dirty (it is stored with
    /// exactly the object's bytes in it), and chunks past it are stale.
    fn set_len(&mut self, new: u64) {
        let old = self.len;
        let last = Obj::last_chunk(new);
        if new < old {
            let from = last + 1;
            self.dirty.retain(|&i, _| i < from);
            if Obj::last_chunk(old) >= from {
                self.stale_from = Some(self.stale_from.map_or(from, |s| s.min(from)));
                self.cuts += 1;
            }
            let c = self.chunk(last, old);
            c.cut((new - last * CHUNK) as usize);
        } else if new > old {
            // A longer object: its new last chunk is stored at its new size.
            let c = self.chunk(last, old);
            c.version += 1;
        }
        self.len = new;
    }
}

#[derive(Default)]
struct State {
    objs: HashMap<String, Obj>,
    /// Bytes held by dirty chunks.
    dirty_bytes: usize,
    /// Bumped by every change of what is stored or known of an object: a listing made
    /// without the lock is taken only if nothing changed meanwhile ([`S3Store::learn`]).
    gen: u64,
    /// Names the engine said exist nowhere yet ([`UntrustedStore::absent`]): their first
    /// write lists nothing. At most [`CLEAN_KEPT`] (a hint, dropped when full).
    absent: std::collections::HashSet<String>,
}

/// An S3-compatible bucket (or a prefix of one) as the untrusted store (see the module's
/// documentation).
pub struct S3Store {
    url: S3Url,
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Runtime,
    state: Mutex<State>,
    /// One sync (or deletion) talks to the store at a time; each sends many requests.
    io: Mutex<()>,
    /// Shared with the read-ahead's requests, which run in the background.
    cache: Arc<Mutex<ReadCache>>,
    /// Signalled when a chunk read ahead has arrived (or failed).
    fetched: Arc<std::sync::Condvar>,
}

/// Whole chunks read lately, [`CACHED_CHUNKS`] at most, oldest out first: a run of block
/// reads costs one request per chunk, not one per block. What is cached is the store's
/// untrusted bytes (the engine authenticates what it reads), kept only while they are what
/// the store holds: an upload, a deletion or a truncation forgets the chunks it changes.
#[derive(Default)]
struct ReadCache {
    chunks: HashMap<(String, u64), Bytes>,
    order: std::collections::VecDeque<(String, u64)>,
    /// Bumped by every forgetting: a read that began before one does not keep what it got.
    epoch: u64,
    /// Chunks being read ahead: a read of one waits for it (then takes it from the cache,
    /// or reads it itself if a forgetting refused it meanwhile).
    fetching: std::collections::HashSet<(String, u64)>,
    /// Per object: the chunk read last, and the read-ahead window.
    seq: HashMap<String, (u64, u64)>,
}

impl ReadCache {
    fn insert(&mut self, name: &str, idx: u64, b: Bytes, epoch_then: u64) {
        if self.epoch != epoch_then {
            return;
        }
        let k = (name.to_string(), idx);
        if self.chunks.insert(k.clone(), b).is_none() {
            self.order.push_back(k);
        }
        while self.order.len() > CACHED_CHUNKS {
            if let Some(old) = self.order.pop_front() {
                self.chunks.remove(&old);
            }
        }
    }

    /// Forgets the chunks of `name` from index `from` on.
    fn forget(&mut self, name: &str, from: u64) {
        self.epoch += 1;
        let gone = |k: &(String, u64)| k.0 == name && k.1 >= from;
        self.chunks.retain(|k, _| !gone(k));
        self.order.retain(|k| !gone(k));
    }

    /// Forgets chunk `idx` of `name`.
    fn forget_one(&mut self, name: &str, idx: u64) {
        self.epoch += 1;
        let k = (name.to_string(), idx);
        if self.chunks.remove(&k).is_some() {
            self.order.retain(|o| *o != k);
        }
    }
}

/// The common beginning, up to and with the dot, of the three objects of one file
/// (`f/<2 hex>/<32 hex>.{d,m,c}`, [`crate::format::ObjectNames`]), if `name` is one.
fn file_stem(name: &str) -> Option<&str> {
    let (stem, ext) = name.rsplit_once('.')?;
    let id = stem.rsplit('/').next()?;
    let ok = matches!(ext, "d" | "m" | "c" | "t")
        && stem.starts_with("f/")
        && id.len() == 32
        && id.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| &name[..stem.len() + 1])
}

/// The stored bytes of the chunk at `key` in `store`: empty when it is missing (a hole).
async fn fetch_chunk(store: &dyn ObjectStore, key: &OsPath) -> object_store::Result<Bytes> {
    match store.get(key).await {
        Ok(r) => r.bytes().await,
        Err(object_store::Error::NotFound { .. }) => Ok(Bytes::new()),
        Err(e) => Err(e),
    }
}

/// The length of each object whose chunks are listed in `chunks` (name, index, size): the
/// last chunk gives it (keys come in order; the largest, to be sure).
fn lengths(chunks: Vec<(String, u64, u64)>) -> HashMap<String, u64> {
    let mut out: HashMap<String, u64> = HashMap::new();
    for (n, idx, size) in chunks {
        let e = out.entry(n).or_default();
        *e = (*e).max(idx * CHUNK + size);
    }
    out
}

/// A failed request as the engine's I/O error, naming the URL and the object.
fn s3_err(url: &S3Url, what: &str, e: object_store::Error) -> Error {
    let kind = match &e {
        object_store::Error::NotFound { .. } => std::io::ErrorKind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => std::io::ErrorKind::PermissionDenied,
        _ => std::io::ErrorKind::Other,
    };
    Error::io(
        format!("{url}: {what}"),
        std::io::Error::new(kind, e.to_string()),
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl S3Store {
    /// Connects to the bucket of `url` with the S3 settings described at [`S3Url`], and
    /// checks with one listing that it answers (an unreachable endpoint, a missing bucket
    /// or refused credentials are reported here, not at the first write).
    pub fn open(url: &S3Url) -> Result<S3Store> {
        Self::with_store(url.clone(), Self::client(url)?)
    }

    /// The `object_store` client for the bucket of `url` (its settings as for
    /// [`S3Store::open`]), without the probe: for a program that stores its own objects
    /// in the same bucket (`intact bench contiu`'s object-level schemes).
    pub fn client(url: &S3Url) -> Result<Arc<dyn ObjectStore>> {
        let mut b = from_profile(AmazonS3Builder::from_env()).with_bucket_name(&url.bucket);
        for (k, v) in &url.options {
            let key: AmazonS3ConfigKey = k
                .parse()
                .map_err(|_| Error::Config(format!("{url}: unknown setting {k:?}")))?;
            b = b.with_config(key, v);
        }
        let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint);
        let http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        if b.get_config_value(&AmazonS3ConfigKey::Region).is_none() && endpoint.is_some() {
            // S3-compatible servers mostly take any region; AWS's default.
            b = b.with_region("us-east-1");
        }
        if b.get_config_value(&AmazonS3ConfigKey::AccessKeyId)
            .is_none()
            && std::env::var_os("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_none()
            && std::env::var_os("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_none()
            && std::env::var_os("AWS_WEB_IDENTITY_TOKEN_FILE").is_none()
        {
            // Only a cloud instance's metadata service could give a key then: say so if
            // it does not.
            tracing::debug!(
                "no S3 key in the environment or ~/.aws: asking the instance metadata service"
            );
        }
        let retry = RetryConfig {
            max_retries: 8,
            retry_timeout: Duration::from_secs(120),
            ..RetryConfig::default()
        };
        let client = ClientOptions::new()
            .with_allow_http(http)
            .with_connect_timeout(Duration::from_secs(10))
            .with_timeout(Duration::from_secs(120));
        let s3 = b
            .with_retry(retry)
            .with_client_options(client)
            .build()
            .map_err(|e| Error::Config(format!("{url}: {e}")))?;
        Ok(Arc::new(s3))
    }

    /// The store over any `object_store` backend (the tests use its in-memory one beside
    /// a real S3 server).
    pub fn with_store(url: S3Url, store: Arc<dyn ObjectStore>) -> Result<S3Store> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("intact-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::io(url.display(), e))?;
        let s = S3Store {
            url,
            store,
            rt,
            state: Mutex::new(State::default()),
            io: Mutex::new(()),
            cache: Arc::new(Mutex::new(ReadCache::default())),
            fetched: Arc::new(std::sync::Condvar::new()),
        };
        // One request, so that a wrong endpoint, bucket or key fails here, and within
        // PROBE_WAIT (retries go on for longer once the store has answered).
        let probe = s.path_of(&format!("{SEP}probe"));
        let answer = s.rt.block_on(async {
            tokio::time::timeout(PROBE_WAIT, async {
                let mut l = s.store.list(Some(&probe));
                l.next().await.transpose()
            })
            .await
        });
        match answer {
            Ok(r) => {
                r.map_err(|e| s.unreachable(e))?;
            }
            Err(_) => {
                return Err(Error::io(
                    format!("{}: the S3 store does not answer", s.url),
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {} s (endpoint?)", PROBE_WAIT.as_secs()),
                    ),
                ))
            }
        }
        Ok(s)
    }

    /// For a new volume: nothing may lie under the prefix (another volume nested in it, or
    /// anything else), and no prefix above it may hold a volume (whose listings would take
    /// this one's objects for its own).
    pub fn check_new_prefix(&self) -> Result<()> {
        let root = self.path_of("");
        let first = self
            .rt
            .block_on(async {
                let mut l = self.store.list(if self.url.prefix.is_empty() {
                    None
                } else {
                    Some(&root)
                });
                l.next().await.transpose()
            })
            .map_err(|e| s3_err(&self.url, "listing", e))?;
        if let Some(m) = first {
            return Err(Error::Config(format!(
                "{}: the prefix is not empty (it holds {}): a new volume needs a prefix of its own",
                self.url, m.location
            )));
        }
        let parts: Vec<&str> = self
            .url
            .prefix
            .split('/')
            .filter(|p| !p.is_empty())
            .collect();
        for n in 0..parts.len() {
            let above: String = parts[..n].iter().map(|p| format!("{p}/")).collect();
            let conf = OsPath::from_iter(
                format!("{above}intact.conf{SEP}{:016x}", 0)
                    .split('/')
                    .filter(|s| !s.is_empty()),
            );
            match self.rt.block_on(self.store.head(&conf)) {
                Ok(_) => {
                    return Err(Error::Config(format!(
                        "{}: s3://{}/{} holds a volume: a volume cannot lie inside another",
                        self.url,
                        self.url.bucket,
                        above.trim_end_matches('/')
                    )))
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(s3_err(&self.url, "looking for a volume above", e)),
            }
        }
        Ok(())
    }

    fn unreachable(&self, e: object_store::Error) -> Error {
        let what = match &e {
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                "the S3 store refuses the key (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or the AWS_PROFILE in ~/.aws/credentials)"
            }
            object_store::Error::NotFound { .. } => "no such bucket",
            _ if e.to_string().contains("169.254.169.254") => {
                "no S3 key: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials (AWS_PROFILE)"
            }
            _ => "the S3 store does not answer (endpoint, bucket?)",
        };
        s3_err(&self.url, what, e)
    }

    /// The S3 key of `rel` under the prefix (never percent-encoded: the engine's names
    /// and the prefix are checked to hold only characters S3 keys take as they are).
    fn path_of(&self, rel: &str) -> OsPath {
        OsPath::from_iter(
            format!("{}{rel}", self.url.prefix)
                .split('/')
                .filter(|s| !s.is_empty()),
        )
    }

    fn key(&self, name: &str, idx: u64) -> OsPath {
        self.path_of(&format!("{name}{SEP}{idx:016x}"))
    }

    fn check(name: &str) -> Result<()> {
        check_name(name)?;
        if !name.bytes().all(key_byte) {
            return Err(Error::Invalid(format!(
                "bad object name {name:?} for an S3 store"
            )));
        }
        Ok(())
    }

    /// The name and chunk index of a key under the prefix, if it is a chunk.
    fn parse_key<'a>(&self, key: &'a str) -> Option<(&'a str, u64)> {
        let rel = key.strip_prefix(self.url.prefix.as_str())?;
        let (name, idx) = rel.rsplit_once(SEP)?;
        if idx.len() != 16 {
            return None;
        }
        Some((name, u64::from_str_radix(idx, 16).ok()?))
    }

    /// The stored chunks of `name`: (index, size), in order.
    fn stored_chunks(&self, name: &str) -> Result<Vec<(u64, u64)>> {
        self.rt
            .block_on(self.list_chunks(name))
            .map_err(|e| s3_err(&self.url, &format!("listing {name}"), e))
    }

    /// The length of every object whose name begins with `stem`, by one listing.
    fn stored_under(&self, stem: &str) -> Result<HashMap<String, u64>> {
        self.rt
            .block_on(self.list_under(stem))
            .map(lengths)
            .map_err(|e| s3_err(&self.url, &format!("listing {stem}*"), e))
    }

    /// [`S3Store::stored_chunks`], as a request to run beside others.
    async fn list_chunks(&self, name: &str) -> object_store::Result<Vec<(u64, u64)>> {
        let mut out: Vec<(u64, u64)> = self
            .list_under(&format!("{name}{SEP}"))
            .await?
            .into_iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, idx, size)| (idx, size))
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// The chunks whose keys begin with `rel` (under the prefix): (name, index, size).
    async fn list_under(&self, rel: &str) -> object_store::Result<Vec<(String, u64, u64)>> {
        let prefix = self.path_of(rel);
        // `list` takes a prefix of whole path segments; the chunks are in the parent.
        let parent = match rel.rsplit_once('/') {
            Some((dir, _)) => self.path_of(dir),
            None => self.path_of(""),
        };
        let want = prefix.as_ref().to_string();
        // Keys come in order: from just before the first one under `rel` to past the last
        // (one page of the listing, not the whole parent).
        let metas: Vec<object_store::ObjectMeta> = self
            .store
            .list_with_offset(Some(&parent), &prefix)
            .try_take_while(|m| std::future::ready(Ok(m.location.as_ref().starts_with(&want))))
            .try_collect()
            .await?;
        Ok(metas
            .iter()
            .filter_map(|m| {
                let (n, idx) = self.parse_key(m.location.as_ref())?;
                Some((n.to_string(), idx, m.size))
            })
            .collect())
    }

    /// Keeps what is known of the stored object `name` of `len` bytes (its listing).
    fn keep(&self, st: &mut State, name: &str, len: u64) {
        if st.objs.len() >= CLEAN_KEPT {
            st.objs.retain(|_, o| !o.is_clean());
        }
        st.objs.insert(
            name.to_string(),
            Obj {
                len,
                ..Obj::default()
            },
        );
    }

    /// Keeps what one listing of a file's objects (`stem` ‖ `d`, `m`, `c`: `found`, their
    /// lengths) says: those listed are known, the siblings of `name` it lacks are absent.
    fn note_stem(&self, st: &mut State, stem: &str, name: &str, found: &HashMap<String, u64>) {
        for ext in ["d", "m", "c", "t"] {
            let n = format!("{stem}{ext}");
            if n != name && (st.objs.contains_key(&n) || st.absent.contains(&n)) {
                continue;
            }
            match found.get(&n) {
                Some(&len) => self.keep(st, &n, len),
                None if n != name => {
                    if st.absent.len() >= CLEAN_KEPT {
                        st.absent.clear();
                    }
                    st.absent.insert(n);
                }
                None => {}
            }
        }
    }

    /// The object `name` as the store knows it (listed once, then kept), or `None`.
    fn obj<'s>(&self, st: &'s mut State, name: &str) -> Result<Option<&'s mut Obj>> {
        if !st.objs.contains_key(name) {
            if st.absent.contains(name) {
                return Ok(None);
            }
            match file_stem(name) {
                // One listing for the file's three objects: its siblings are known too,
                // and those it lacks are absent (a small file's open asks for all three).
                Some(stem) => {
                    let found = self.stored_under(stem)?;
                    self.note_stem(st, stem, name, &found);
                    if !found.contains_key(name) {
                        return Ok(None);
                    }
                }
                None => {
                    let chunks = self.stored_chunks(name)?;
                    let Some(&(idx, size)) = chunks.last() else {
                        return Ok(None);
                    };
                    self.keep(st, name, idx * CHUNK + size);
                }
            }
        }
        Ok(st.objs.get_mut(name))
    }

    /// Before the first read of an object not known yet, in its first chunk (a small
    /// file's read): lists its chunks (for its length) and fetches chunk 0 at the same
    /// time, without the lock: one round trip instead of two in a row, and other requests
    /// go on meanwhile. The listing is taken only if nothing changed in the store's state
    /// meanwhile ([`State::gen`]), the chunk only if nothing was forgotten meanwhile
    /// ([`ReadCache::insert`]); otherwise the read lists under the lock as before.
    fn learn(&self, name: &str, off: u64) -> Result<()> {
        if off >= CHUNK {
            return Ok(());
        }
        let (gen, epoch) = {
            let st = lock(&self.state);
            if st.objs.contains_key(name) || st.absent.contains(name) {
                return Ok(());
            }
            (st.gen, lock(&self.cache).epoch)
        };
        let key = self.key(name, 0);
        // A file's object is listed with its siblings (one listing for the three), and the
        // first chunk of its tree (`.m`) and of its data (`.d`) are fetched together, the
        // one not asked for on speculation (a GET that finds nothing where the file has no
        // `.m`, a one-block file or `aead`): a small file's cold read is one round trip,
        // not three in a row.
        let stem = file_stem(name);
        let data = stem.and_then(|st| {
            if name.ends_with(".m") {
                Some(format!("{st}d"))
            } else if name.ends_with(".d") {
                Some(format!("{st}m"))
            } else {
                None
            }
        });
        let listing = async {
            match stem {
                Some(st) => self.list_under(st).await.map(lengths),
                None => self.list_chunks(name).await.map(|c| {
                    c.last()
                        .map(|&(idx, size)| (name.to_string(), idx * CHUNK + size))
                        .into_iter()
                        .collect()
                }),
            }
        };
        let sibling = async {
            match &data {
                Some(d) => Some(self.get_chunk(&self.key(d, 0)).await),
                None => None,
            }
        };
        let (listed, first, second) = self.rt.block_on(futures_util::future::join3(
            listing,
            self.get_chunk(&key),
            sibling,
        ));
        let found = listed.map_err(|e| s3_err(&self.url, &format!("listing {name}"), e))?;
        if !found.contains_key(name) {
            return Ok(()); // no such object: the read says so
        }
        {
            let mut st = lock(&self.state);
            if st.gen != gen || st.objs.contains_key(name) {
                return Ok(());
            }
            match stem {
                Some(stem) => self.note_stem(&mut st, stem, name, &found),
                None => self.keep(&mut st, name, found[name]),
            }
        }
        let mut cache = lock(&self.cache);
        if let Ok(b) = first {
            cache.insert(name, 0, b, epoch);
        }
        if let (Some(d), Some(Ok(b))) = (&data, second) {
            if found.contains_key(d) {
                cache.insert(d, 0, b, epoch);
            }
        }
        Ok(())
    }

    /// The object `name`, made empty if missing.
    fn obj_or_new<'s>(&self, st: &'s mut State, name: &str) -> Result<&'s mut Obj> {
        if self.obj(st, name)?.is_none() {
            // An empty object is stored as an empty chunk 0.
            let mut o = Obj::default();
            o.dirty.insert(0, Chunk::fresh(0));
            st.absent.remove(name);
            st.objs.insert(name.to_string(), o);
        }
        Ok(st.objs.get_mut(name).expect("inserted"))
    }

    /// Stored bytes `from..from + buf.len()` of chunk `idx` into `buf` (zeros where the
    /// chunk is missing or short): the whole chunk is read, and kept ([`ReadCache`]).
    fn read_stored(&self, name: &str, idx: u64, from: usize, buf: &mut [u8]) -> Result<()> {
        buf.fill(0);
        if buf.is_empty() {
            return Ok(());
        }
        self.read_ahead_from(name, idx);
        let k = (name.to_string(), idx);
        let (hit, epoch) = {
            let mut c = lock(&self.cache);
            while c.fetching.contains(&k) {
                c = self.fetched.wait(c).unwrap_or_else(|p| p.into_inner());
            }
            (c.chunks.get(&k).cloned(), c.epoch)
        };
        let bytes = match hit {
            Some(b) => b,
            None => {
                let b = self
                    .rt
                    .block_on(self.get_chunk(&self.key(name, idx)))
                    .map_err(|e| s3_err(&self.url, &format!("reading {name}"), e))?;
                lock(&self.cache).insert(name, idx, b.clone(), epoch);
                b
            }
        };
        if from < bytes.len() {
            let n = (bytes.len() - from).min(buf.len());
            buf[..n].copy_from_slice(&bytes[from..from + n]);
        }
        Ok(())
    }

    /// A read of chunk `idx` of `name` begins: if it goes on in order from the chunk read
    /// before (or the one before is cached), the chunks after it are fetched in the
    /// background, [`READ_AHEAD`] at first and twice as many at each chunk read in order,
    /// up to [`READ_AHEAD_MAX`]; a read out of order fetches none. A sequential reader
    /// thus finds its next chunks arrived or on their way, instead of waiting one round
    /// trip every few chunks.
    fn read_ahead_from(&self, name: &str, idx: u64) {
        let window = {
            let mut c = lock(&self.cache);
            let (prev, win) = c.seq.get(name).copied().unwrap_or((u64::MAX, 0));
            if idx == prev {
                return;
            }
            let in_order =
                idx > 0 && (prev == idx - 1 || c.chunks.contains_key(&(name.to_string(), idx - 1)));
            let win = if in_order {
                (win * 2).clamp(READ_AHEAD, READ_AHEAD_MAX)
            } else {
                0
            };
            if c.seq.len() >= CLEAN_KEPT {
                c.seq.clear();
            }
            c.seq.insert(name.to_string(), (idx, win));
            win
        };
        if window == 0 {
            return;
        }
        let mut want = self.read_ahead(name, idx, window);
        let epoch = {
            let mut c = lock(&self.cache);
            want.retain(|&j| {
                c.fetching.len() < FETCHING_MAX && c.fetching.insert((name.to_string(), j))
            });
            c.epoch
        };
        for j in want {
            let (store, key) = (self.store.clone(), self.key(name, j));
            let (cache, fetched, name) =
                (self.cache.clone(), self.fetched.clone(), name.to_string());
            self.rt.spawn(async move {
                let got = fetch_chunk(store.as_ref(), &key).await;
                let mut c = lock(&cache);
                if let Ok(b) = got {
                    c.insert(&name, j, b, epoch); // refused if forgotten meanwhile
                }
                c.fetching.remove(&(name, j));
                drop(c);
                fetched.notify_all();
            });
        }
    }

    /// The stored bytes of the chunk at `key`: empty when it is missing (a hole).
    async fn get_chunk(&self, key: &OsPath) -> object_store::Result<Bytes> {
        fetch_chunk(self.store.as_ref(), key).await
    }

    /// The chunks after `idx` of `name` worth reading ahead: up to `window` of them,
    /// within the object, stored as they are (not dirty, not stale), not cached or being
    /// fetched.
    fn read_ahead(&self, name: &str, idx: u64, window: u64) -> Vec<u64> {
        let st = lock(&self.state);
        let Some(o) = st.objs.get(name) else {
            return Vec::new();
        };
        let cache = lock(&self.cache);
        (idx + 1..=idx + window)
            .filter(|&j| j <= Obj::last_chunk(o.len) && !o.dirty.contains_key(&j) && !o.stale(j))
            .filter(|&j| {
                let k = (name.to_string(), j);
                !cache.chunks.contains_key(&k) && !cache.fetching.contains(&k)
            })
            .collect()
    }

    /// Uploads what is dirty in `names` (every object when `None`), then deletes stale
    /// chunks; what changed meanwhile stays dirty.
    fn flush(&self, names: Option<&[String]>) -> Result<()> {
        let _io = lock(&self.io);
        let (jobs, cuts) = self.take_jobs(names);
        if jobs.is_empty() && cuts.is_empty() {
            return Ok(());
        }
        let epoch = lock(&self.cache).epoch;
        let stored = self.upload(&jobs)?;
        self.uploaded(&jobs, stored, epoch);
        self.drop_stale(&jobs, cuts)
    }

    /// What a sync of `names` (every object when `None`) uploads, as it is now, and the
    /// truncations whose stale chunks it deletes.
    fn take_jobs(&self, names: Option<&[String]>) -> (Vec<Job>, Vec<Cut>) {
        let mut jobs: Vec<Job> = Vec::new();
        let mut cuts: Vec<Cut> = Vec::new();
        {
            let st = lock(&self.state);
            let mut take = |name: &String, o: &Obj| {
                for (&idx, c) in &o.dirty {
                    jobs.push((name.clone(), idx, c.clone(), o.len));
                }
                if let Some(from) = o.stale_from {
                    cuts.push((name.clone(), from, o.cuts));
                }
            };
            match names {
                Some(ns) => {
                    for n in ns {
                        if let Some(o) = st.objs.get(n) {
                            take(n, o);
                        }
                    }
                }
                None => {
                    for (n, o) in &st.objs {
                        take(n, o);
                    }
                }
            }
        }
        (jobs, cuts)
    }

    /// Stores each job's chunk (many at once); the bytes each chunk now holds (none for a
    /// hole deleted). A chunk only partly written is merged with its stored bytes, from the
    /// read cache when they are there (a log's chunk, appended to at each seal, is not
    /// read back each time).
    fn upload(&self, jobs: &[Job]) -> Result<Vec<Option<Bytes>>> {
        let uploads =
            futures_util::stream::iter(jobs.iter().map(|(name, idx, c, len)| async move {
                // The last chunk holds exactly the object's bytes in it; one before it may be
                // short (it reads as zeros past its end), and one with nothing in it is a hole.
                let size = if *idx == Obj::last_chunk(*len) {
                    (len - idx * CHUNK).min(CHUNK) as usize
                } else {
                    c.mask
                        .last()
                        .map_or(0, |r| r.1)
                        .max(c.base)
                        .min(CHUNK as usize)
                };
                if size == 0 && *idx != Obj::last_chunk(*len) {
                    return match self.store.delete(&self.key(name, *idx)).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(None),
                        Err(e) => Err(e),
                    };
                }
                let mut buf = vec![0u8; size];
                if !c.covers(size) && c.base > 0 {
                    let cached = lock(&self.cache).chunks.get(&(name.clone(), *idx)).cloned();
                    let stored = match cached {
                        Some(b) => b,
                        None => self.get_chunk(&self.key(name, *idx)).await?,
                    };
                    let n = stored.len().min(c.base).min(size);
                    buf[..n].copy_from_slice(&stored[..n]);
                }
                c.overlay(0, &mut buf);
                let b = Bytes::from(buf);
                self.store
                    .put(&self.key(name, *idx), PutPayload::from(b.clone()))
                    .await?;
                Ok(Some(b))
            }))
            .buffered(CONCURRENCY)
            .collect::<Vec<_>>();
        let results = self.rt.block_on(uploads);
        results
            .into_iter()
            .collect::<object_store::Result<Vec<_>>>()
            .map_err(|e| s3_err(&self.url, "storing", e))
    }

    /// The jobs' chunks are stored: clean unless written again since they were taken;
    /// what was read of them before is not what the store holds now, `stored` is (kept
    /// unless something was forgotten since the flush began at `epoch`: a truncation may
    /// have made them stale).
    fn uploaded(&self, jobs: &[Job], stored: Vec<Option<Bytes>>, epoch: u64) {
        {
            let mut cache = lock(&self.cache);
            let keep = cache.epoch == epoch;
            for ((name, idx, _, _), b) in jobs.iter().zip(stored) {
                // Forgetting bumps the epoch: a read that began before the upload does not
                // put the older bytes back.
                cache.forget_one(name, *idx);
                if let (true, Some(b)) = (keep, b) {
                    let now = cache.epoch;
                    cache.insert(name, *idx, b, now);
                }
            }
        }
        {
            let mut st = lock(&self.state);
            st.gen += 1;
            let State {
                objs, dirty_bytes, ..
            } = &mut *st;
            for (name, idx, c, _) in jobs {
                if let Some(o) = objs.get_mut(name) {
                    if o.dirty.get(idx).is_some_and(|now| now.version == c.version) {
                        let gone = o.dirty.remove(idx).expect("looked at");
                        *dirty_bytes = dirty_bytes.saturating_sub(gone.data.len());
                    }
                }
            }
        }
    }

    /// Deletes the chunks truncations left stale, once the new last chunks are stored.
    fn drop_stale(&self, jobs: &[Job], cuts: Vec<Cut>) -> Result<()> {
        for (name, from, cuts_then) in cuts {
            let keep: Vec<u64> = {
                let st = lock(&self.state);
                st.objs
                    .get(&name)
                    .map(|o| o.dirty.keys().copied().collect())
                    .unwrap_or_default()
            };
            let uploaded: Vec<u64> = jobs.iter().filter(|j| j.0 == name).map(|j| j.1).collect();
            let doomed: Vec<u64> = self
                .stored_chunks(&name)?
                .into_iter()
                .map(|(i, _)| i)
                .filter(|i| *i >= from && !uploaded.contains(i) && !keep.contains(i))
                .collect();
            self.delete_chunks(&name, &doomed)?;
            lock(&self.cache).forget(&name, from);
            let mut st = lock(&self.state);
            st.gen += 1;
            if let Some(o) = st.objs.get_mut(&name) {
                if o.cuts == cuts_then {
                    o.stale_from = None;
                }
            }
        }
        Ok(())
    }

    /// One PUT: a chunk is at most [`CHUNK`] bytes, far below the size past which S3
    /// wants a multipart upload (5 GiB at most in one PUT; multipart pays from tens of MiB).
    async fn put(&self, key: &OsPath, buf: Vec<u8>) -> object_store::Result<()> {
        self.store
            .put(key, PutPayload::from(Bytes::from(buf)))
            .await
            .map(|_| ())
    }

    fn delete_chunks(&self, name: &str, idxs: &[u64]) -> Result<()> {
        if idxs.is_empty() {
            return Ok(());
        }
        let keys: Vec<OsPath> = idxs.iter().map(|&i| self.key(name, i)).collect();
        let r: Vec<object_store::Result<()>> = self.rt.block_on(
            futures_util::stream::iter(keys.iter().map(|k| self.store.delete(k)))
                .buffer_unordered(CONCURRENCY)
                .collect(),
        );
        match r.into_iter().find_map(|r| match r {
            Err(object_store::Error::NotFound { .. }) | Ok(()) => None,
            Err(e) => Some(e),
        }) {
            Some(e) => Err(s3_err(&self.url, &format!("deleting {name}"), e)),
            None => Ok(()),
        }
    }

    /// Writes back what is dirty once it holds more than [`MAX_DIRTY`].
    fn write_back_if_full(&self) -> Result<()> {
        if lock(&self.state).dirty_bytes > MAX_DIRTY {
            self.flush(None)?;
        }
        Ok(())
    }
}

impl State {
    /// Forgets what is known of `name`, and the unsynced bytes it held.
    fn drop_obj(&mut self, name: &str) {
        self.gen += 1;
        self.absent.remove(name);
        if let Some(o) = self.objs.remove(name) {
            self.dirty_bytes = self.dirty_bytes.saturating_sub(o.held());
        }
    }
}

impl UntrustedStore for S3Store {
    /// Unsynced writes wait in this process's memory (the trait's contract lets them).
    fn unsynced_writes_die_with_the_process(&self) -> bool {
        true
    }

    /// Forgets the lengths of clean objects, the names said absent and the chunks read.
    fn forget_cached(&self) {
        {
            let mut st = lock(&self.state);
            st.gen += 1;
            st.objs.retain(|_, o| !o.is_clean());
            st.absent.clear();
        }
        let mut c = lock(&self.cache);
        c.epoch += 1;
        c.chunks.clear();
        c.order.clear();
    }

    /// The first write of `name` creates it without listing what it holds.
    fn absent(&self, name: &str) {
        let mut st = lock(&self.state);
        if st.objs.contains_key(name) {
            return;
        }
        if st.absent.len() >= CLEAN_KEPT {
            st.absent.clear();
        }
        st.absent.insert(name.to_string());
    }

    fn read_at(&self, name: &str, off: u64, buf: &mut [u8]) -> Result<usize> {
        Self::check(name)?;
        self.learn(name, off)?;
        // What to read where, decided under the lock; the requests go after it.
        enum Piece {
            Zero,
            Stored(u64),
            /// A dirty chunk: the stored bytes to read first (up to this offset in the
            /// chunk, where its written ranges leave a gap), and the written bytes within
            /// the range read (copied under the lock, not the whole chunk).
            Dirty(u64, usize, Vec<u8>, Vec<(usize, usize)>),
        }
        let (n, pieces) = {
            let mut st = lock(&self.state);
            let Some(o) = self.obj(&mut st, name)? else {
                return Err(Error::io(
                    format!("{}: {name}", self.url),
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no such object"),
                ));
            };
            if off >= o.len {
                return Ok(0);
            }
            let n = (o.len - off).min(buf.len() as u64) as usize;
            let mut pieces = Vec::new();
            let mut at = off;
            while at < off + n as u64 {
                let idx = at / CHUNK;
                let p = match o.dirty.get(&idx) {
                    Some(c) => {
                        let from = (at - idx * CHUNK) as usize;
                        let upto = from + (((idx + 1) * CHUNK).min(off + n as u64) - at) as usize;
                        let covered = c.mask.iter().any(|r| r.0 <= from && r.1 >= upto);
                        let stored_end = if covered { from } else { c.base.min(upto) };
                        let mut written = vec![0u8; upto - from];
                        c.overlay(from, &mut written);
                        let ranges = c
                            .mask
                            .iter()
                            .map(|&(a, b)| (a.max(from), b.min(upto)))
                            .filter(|(a, b)| a < b)
                            .collect();
                        Piece::Dirty(idx, stored_end, written, ranges)
                    }
                    None if o.stale(idx) => Piece::Zero,
                    None => Piece::Stored(idx),
                };
                pieces.push(p);
                at = (idx + 1) * CHUNK;
            }
            (n, pieces)
        };
        let mut at = off;
        let end = off + n as u64;
        for p in pieces {
            let idx = at / CHUNK;
            let from = (at - idx * CHUNK) as usize;
            let to = ((idx + 1) * CHUNK).min(end);
            let out = &mut buf[(at - off) as usize..(to - off) as usize];
            match p {
                Piece::Zero => out.fill(0),
                Piece::Stored(i) => self.read_stored(name, i, from, out)?,
                Piece::Dirty(i, stored_end, written, ranges) => {
                    if stored_end > from {
                        self.read_stored(name, i, from, &mut out[..stored_end - from])?;
                        out[stored_end - from..].fill(0);
                    } else {
                        out.fill(0);
                    }
                    for (a, b) in ranges {
                        out[a - from..b - from].copy_from_slice(&written[a - from..b - from]);
                    }
                }
            }
            at = to;
        }
        Ok(n)
    }

    fn write_at(&self, name: &str, off: u64, data: &[u8]) -> Result<()> {
        Self::check(name)?;
        let end = off
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::Invalid(format!("{name}: write past 2^64")))?;
        {
            let mut st = lock(&self.state);
            st.gen += 1;
            let o = self.obj_or_new(&mut st, name)?;
            let before = o.held();
            let old = o.len;
            if end > o.len {
                o.set_len(end);
            }
            let mut at = off;
            while at < end {
                let idx = at / CHUNK;
                let from = (at - idx * CHUNK) as usize;
                let to = ((idx + 1) * CHUNK).min(end);
                o.chunk(idx, old)
                    .write(from, &data[(at - off) as usize..(to - off) as usize]);
                at = to;
            }
            let after = o.held();
            st.dirty_bytes = (st.dirty_bytes + after).saturating_sub(before);
        }
        self.write_back_if_full()
    }

    fn len(&self, name: &str) -> Result<Option<u64>> {
        Self::check(name)?;
        // A file's length is asked for before it is read: its listing and its first
        // chunk (and its data's, for a tree) in one round trip.
        self.learn(name, 0)?;
        let mut st = lock(&self.state);
        Ok(self.obj(&mut st, name)?.map(|o| o.len))
    }

    fn set_len(&self, name: &str, len: u64) -> Result<()> {
        Self::check(name)?;
        let mut st = lock(&self.state);
        st.gen += 1;
        let o = self.obj_or_new(&mut st, name)?;
        let before = o.held();
        o.set_len(len);
        let after = o.held();
        st.dirty_bytes = (st.dirty_bytes + after).saturating_sub(before);
        Ok(())
    }

    fn delete(&self, name: &str) -> Result<()> {
        Self::check(name)?;
        let _io = lock(&self.io);
        lock(&self.state).drop_obj(name);
        let idxs: Vec<u64> = self.stored_chunks(name)?.into_iter().map(|c| c.0).collect();
        let r = self.delete_chunks(name, &idxs);
        // What a read listed while the chunks went is forgotten (and a listing still in
        // flight is not taken: S3Store::learn).
        lock(&self.state).drop_obj(name);
        lock(&self.cache).forget(name, 0);
        r
    }

    fn sync(&self, names: &[String]) -> Result<()> {
        for n in names {
            Self::check(n)?;
        }
        self.flush(Some(names))
    }

    fn sync_all(&self) -> Result<()> {
        self.flush(None)
    }

    fn list(&self) -> Result<Vec<String>> {
        crate::store::names_of(self)
    }

    fn list_each(&self, f: &mut dyn FnMut(&str) -> Result<()>) -> Result<()> {
        // Objects known here that may not be stored yet.
        let mut unstored: std::collections::BTreeSet<String> =
            lock(&self.state).objs.keys().cloned().collect();
        let root = self.path_of("");
        let mut stream = self.store.list(if self.url.prefix.is_empty() {
            None
        } else {
            Some(&root)
        });
        let mut last: Option<String> = None;
        loop {
            let next = self.rt.block_on(stream.next());
            let Some(meta) = next else { break };
            let meta = meta.map_err(|e| s3_err(&self.url, "listing", e))?;
            let Some((name, _)) = self.parse_key(meta.location.as_ref()) else {
                continue;
            };
            if last.as_deref() == Some(name) {
                continue;
            }
            unstored.remove(name);
            f(name)?;
            last = Some(name.to_string());
        }
        for n in unstored {
            // Deleted since the listing began: gone from the state too.
            if lock(&self.state).objs.contains_key(&n) {
                f(&n)?;
            }
        }
        Ok(())
    }

    fn replace(&self, name: &str, data: &[u8]) -> Result<()> {
        Self::check(name)?;
        if data.len() as u64 > CHUNK {
            // Not one request: written and synced (readers may see a mix until then).
            self.set_len(name, 0)?;
            self.write_at(name, 0, data)?;
            return self.sync(&[name.to_string()]);
        }
        // One PUT of chunk 0 replaces the object's bytes at once; chunks past it go after.
        let _io = lock(&self.io);
        // Chunks past 0: from what is known of the object (its last stored length, when
        // nothing of it waits for a sync), else from a listing.
        let known = {
            let st = lock(&self.state);
            st.objs
                .get(name)
                .filter(|o| o.dirty.is_empty() && o.stale_from.is_none())
                .map(|o| o.len)
        };
        let stale: Vec<u64> = match known {
            Some(len) => (1..=Obj::last_chunk(len)).collect(),
            None => self
                .stored_chunks(name)?
                .into_iter()
                .map(|c| c.0)
                .filter(|&i| i > 0)
                .collect(),
        };
        self.rt
            .block_on(self.put(&self.key(name, 0), data.to_vec()))
            .map_err(|e| s3_err(&self.url, &format!("storing {name}"), e))?;
        lock(&self.cache).forget(name, 0);
        {
            let mut st = lock(&self.state);
            st.drop_obj(name);
            st.objs.insert(
                name.to_string(),
                Obj {
                    len: data.len() as u64,
                    ..Obj::default()
                },
            );
        }
        self.delete_chunks(name, &stale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn mem() -> (S3Store, Arc<InMemory>) {
        let backing = Arc::new(InMemory::new());
        let url = S3Url::parse("s3://bucket/vol").unwrap();
        (S3Store::with_store(url, backing.clone()).unwrap(), backing)
    }

    /// A store over a copy of `backing` whose every GET is held `get` and every LIST
    /// `list` (`object_store`'s throttled store: round trips made visible).
    fn throttled(backing: &InMemory, get: Duration, list: Duration) -> S3Store {
        use object_store::throttle::{ThrottleConfig, ThrottledStore};
        let slow = ThrottledStore::new(
            backing.fork(),
            ThrottleConfig {
                wait_get_per_call: get,
                wait_list_per_call: list,
                ..ThrottleConfig::default()
            },
        );
        S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), Arc::new(slow)).unwrap()
    }

    fn keys(b: &InMemory) -> Vec<(String, u64)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut v: Vec<(String, u64)> = rt
            .block_on(b.list(None).try_collect::<Vec<_>>())
            .unwrap()
            .into_iter()
            .map(|m| (m.location.to_string(), m.size))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn urls_parse_with_their_settings_and_bad_ones_are_refused() {
        assert_eq!(
            S3Url::parse("s3://my.bucket-2/x").unwrap().bucket,
            "my.bucket-2"
        );
        let u = S3Url::parse("s3://my-bucket/a/b/?endpoint=http://127.0.0.1:3900&region=garage")
            .unwrap();
        assert_eq!(u.bucket, "my-bucket");
        assert_eq!(u.prefix, "a/b/");
        assert_eq!(
            u.options,
            [
                ("endpoint".to_string(), "http://127.0.0.1:3900".to_string()),
                ("region".to_string(), "garage".to_string())
            ]
        );
        assert_eq!(u.to_string(), "s3://my-bucket/a/b");
        assert_eq!(S3Url::parse("s3://bkt").unwrap().prefix, "");
        for bad in [
            "http://b/x",
            "s3://",
            "s3://B/x",
            "s3://ab",
            "s3://bkt/../x",
            "s3://bkt/a@b",
            "s3://bkt/x?nonsense=1",
            "s3://bkt/x?endpoint",
        ] {
            assert!(S3Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn profiles_are_read_from_aws_ini_files() {
        let text =
            "[default]\naws_access_key_id = A\n\n[profile work]\nregion=eu-1\n# c\n[other]\nx=y\n";
        assert_eq!(ini_section(text, "default")["aws_access_key_id"], "A");
        assert_eq!(ini_section(text, "work")["region"], "eu-1");
        assert!(ini_section(text, "missing").is_empty());
        assert_eq!(ini_section(text, "other").len(), 1);
    }

    /// A chunk past a cut is stale until the sync deletes it: an extension over it before
    /// that reads zeros there, not the stored bytes, and so does the bucket after the sync.
    #[test]
    fn a_cut_then_an_extension_reads_zeros_over_the_stale_chunks() {
        let (s, _) = mem();
        let c = CHUNK as usize;
        s.write_at("o", 0, &vec![0xaa; 3 * c]).unwrap();
        s.sync(&["o".into()]).unwrap();
        s.set_len("o", CHUNK / 2).unwrap();
        s.set_len("o", 3 * CHUNK).unwrap();
        let mut buf = vec![1u8; 3 * c];
        assert_eq!(s.read_at("o", 0, &mut buf).unwrap(), 3 * c);
        assert!(buf[..c / 2].iter().all(|&b| b == 0xaa));
        assert!(
            buf[c / 2..].iter().all(|&b| b == 0),
            "chunks past the cut read as zeros before the sync"
        );
        s.sync(&["o".into()]).unwrap();
        let mut again = vec![1u8; 3 * c];
        s.read_at("o", 0, &mut again).unwrap();
        assert_eq!(again, buf, "and after it");
    }

    /// A process on S3 keeps its unsynced writes in memory: the periodic seal sends the
    /// data written since the last seal with the log, so that what was closed (a new
    /// file's blocks go to its data object, not the log) is in the bucket after the tick,
    /// and a crash of the process after it loses none of it.
    #[test]
    fn after_a_periodic_seal_a_crash_of_the_process_keeps_every_closed_file() {
        use crate::store::{MemTrusted, TrustedStore};
        use crate::{CreateOptions, Options, Volume};
        let backing = Arc::new(InMemory::new());
        let url = S3Url::parse("s3://bucket/vol").unwrap();
        let open_store = || Arc::new(S3Store::with_store(url.clone(), backing.clone()).unwrap());
        let trusted = MemTrusted::new();
        let opts = Options::default();
        let t = trusted.clone();
        let vol = Volume::create(
            open_store(),
            move |_| Ok(Box::new(t) as Box<dyn TrustedStore>),
            b"pw",
            &CreateOptions {
                kdf: crate::crypto::KdfParams::TEST,
                ..CreateOptions::default()
            },
            &opts,
        )
        .unwrap();
        assert!(open_store().unsynced_writes_die_with_the_process());
        vol.create_file("/a", None).unwrap();
        vol.write_path("/a", 0, &[7u8; 100_000]).unwrap();
        vol.create_file("/b", None).unwrap();
        vol.write_path("/b", 0, b"small").unwrap();
        vol.seal_periodic().unwrap();
        // The process dies: what its store held unsynced is gone with it.
        vol.set_seal_on_drop(false);
        drop(vol);
        let vol = Volume::open(open_store(), Box::new(trusted.clone()), b"pw", &opts).unwrap();
        let read = |p: &str| {
            let ino = vol.stat(p).unwrap().ino;
            let mut buf = vec![0u8; 200_000];
            let n = vol.read_ino(ino, 0, &mut buf).unwrap();
            buf.truncate(n);
            buf
        };
        assert_eq!(read("/a"), vec![7u8; 100_000]);
        assert_eq!(read("/b"), b"small");
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }

    /// The first read of a small object lists it and fetches its chunk at once: one round
    /// trip, not two in a row. With every GET and LIST of the bucket held 400 ms, it takes
    /// less than the 800 ms that two in a row take at least, and the chunk is kept (a
    /// second read sends nothing). Reads that begin past the first chunk list first, as
    /// before; either way the object's length is its listing's.
    #[test]
    fn the_first_read_of_a_small_object_lists_and_fetches_at_once() {
        let (s, backing) = mem();
        s.write_at("d/small.d", 0, b"a small file").unwrap();
        s.write_at("d/big.d", 0, &vec![3u8; (CHUNK + 5) as usize])
            .unwrap();
        s.write_at("d/empty.d", 0, b"").unwrap();
        s.sync_all().unwrap();
        let held = Duration::from_millis(400);
        let s = throttled(&backing, held, held);
        let mut buf = [0u8; 64];
        let t = std::time::Instant::now();
        assert_eq!(s.read_at("d/small.d", 0, &mut buf).unwrap(), 12);
        assert!(
            t.elapsed() < 2 * held,
            "{:?}: one round trip after another",
            t.elapsed()
        );
        assert_eq!(&buf[..12], b"a small file");
        let t = std::time::Instant::now();
        assert_eq!(s.read_at("d/small.d", 2, &mut buf).unwrap(), 10);
        assert!(
            t.elapsed() < held,
            "{:?}: the chunk was not kept",
            t.elapsed()
        );
        assert_eq!(&buf[..10], b"small file");
        assert_eq!(s.read_at("d/big.d", CHUNK, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], &[3u8; 5]);
        assert_eq!(s.read_at("d/big.d", CHUNK - 2, &mut buf).unwrap(), 7);
        assert_eq!(s.len("d/big.d").unwrap(), Some(CHUNK + 5));
        assert_eq!(s.read_at("d/empty.d", 0, &mut buf).unwrap(), 0);
        assert_eq!(s.len("d/empty.d").unwrap(), Some(0));
        let e = s.read_at("d/none.d", 0, &mut buf).unwrap_err();
        assert!(e.to_string().contains("no such object"), "{e}");
        assert_eq!(s.len("d/none.d").unwrap(), None);
    }

    /// A listing made without the lock is not taken when the object changed meanwhile,
    /// nor one made while the object was being deleted: a deletion that begins while a
    /// first read's listing is in flight leaves the object gone, not known by a listing
    /// from before it.
    #[test]
    fn a_first_read_does_not_keep_a_listing_older_than_a_deletion() {
        let (s, backing) = mem();
        s.write_at("d/small.d", 0, b"a small file").unwrap();
        s.sync_all().unwrap();
        let s = Arc::new(throttled(
            &backing,
            Duration::from_millis(400),
            Duration::from_millis(400),
        ));
        let reader = {
            let s = s.clone();
            std::thread::spawn(move || {
                // A read racing the deletion of its object may see it whole, as zeros
                // (listed, then gone) or missing; the engine never reads what it deletes.
                let mut buf = [0u8; 64];
                match s.read_at("d/small.d", 0, &mut buf) {
                    Ok(n) => assert!(n == 0 || n == 12, "{n}"),
                    Err(e) => assert!(e.to_string().contains("no such object"), "{e}"),
                }
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        s.delete("d/small.d").unwrap();
        reader.join().unwrap();
        assert_eq!(s.len("d/small.d").unwrap(), None);
    }

    /// A chunk appended to after a sync (a log's, at each seal) is merged with the bytes the
    /// sync stored, kept from the upload: no GET before each PUT. A replace of a known small
    /// object (the published signed root, at each seal) lists nothing.
    #[test]
    fn appends_and_replaces_after_a_sync_make_no_read_or_listing() {
        let held = Duration::from_millis(400);
        let s = throttled(&InMemory::new(), held, held);
        s.absent("log.1");
        s.write_at("log.1", 0, b"first record;").unwrap();
        s.sync(&["log.1".to_string()]).unwrap();
        let t = std::time::Instant::now();
        for i in 0..3u8 {
            s.write_at("log.1", 13 + u64::from(i), &[b'0' + i]).unwrap();
            s.sync(&["log.1".to_string()]).unwrap();
        }
        s.replace("root", b"one").unwrap();
        assert!(t.elapsed() >= held, "the first replace lists");
        let t = std::time::Instant::now();
        s.replace("root", b"two").unwrap();
        assert!(
            t.elapsed() < held,
            "{:?}: a read or a listing per append or replace",
            t.elapsed()
        );
        let again =
            S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), s.store.clone()).unwrap();
        assert_eq!(
            again.read_all("log.1").unwrap().unwrap(),
            b"first record;012"
        );
        assert_eq!(again.read_all("root").unwrap().unwrap(), b"two");
        assert_eq!(s.read_all("log.1").unwrap().unwrap(), b"first record;012");
    }

    /// The length of a file's object, asked for before its first read, lists the file's
    /// objects and fetches the first chunk of its tree and of its data at once: its cold
    /// read is one round trip. A file with no tree (one block) costs one GET of the missing
    /// `.m`, and nothing is kept of it.
    #[test]
    fn a_files_length_fetches_its_tree_and_data_at_once() {
        let (s, backing) = mem();
        let stem = "f/ab/abababababababababababababababab.";
        let one = "f/cd/cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd.";
        s.write_at(&format!("{stem}d"), 0, b"data").unwrap();
        s.write_at(&format!("{stem}m"), 0, b"tree").unwrap();
        s.write_at(&format!("{one}d"), 0, b"only data").unwrap();
        s.sync_all().unwrap();
        let held = Duration::from_millis(400);
        for (first, second) in [("d", "m"), ("m", "d")] {
            let s = throttled(&backing, held, held);
            let t = std::time::Instant::now();
            assert_eq!(s.len(&format!("{stem}{first}")).unwrap(), Some(4));
            assert_eq!(s.len(&format!("{stem}{second}")).unwrap(), Some(4));
            let mut buf = [0u8; 4];
            s.read_at(&format!("{stem}d"), 0, &mut buf).unwrap();
            assert_eq!(&buf, b"data");
            s.read_at(&format!("{stem}m"), 0, &mut buf).unwrap();
            assert_eq!(&buf, b"tree");
            assert!(
                t.elapsed() < 2 * held,
                "{first} first: {:?}, one round trip after another",
                t.elapsed()
            );
            assert_eq!(s.len(&format!("{stem}c")).unwrap(), None);
        }
        let s = throttled(&backing, held, held);
        assert_eq!(s.len(&format!("{one}d")).unwrap(), Some(9));
        assert_eq!(s.len(&format!("{one}m")).unwrap(), None);
        assert!(!lock(&s.cache).chunks.contains_key(&(format!("{one}m"), 0)));
        let mut buf = [0u8; 9];
        let t = std::time::Instant::now();
        s.read_at(&format!("{one}d"), 0, &mut buf).unwrap();
        assert!(t.elapsed() < held, "{:?}", t.elapsed());
        assert_eq!(&buf, b"only data");
    }

    /// A name the engine says is absent is created by its first write with no listing
    /// (a write of a new file returns before one held listing could), reads as missing
    /// until then, and is stored as any other at the sync.
    #[test]
    fn a_name_said_absent_is_written_without_a_listing() {
        let held = Duration::from_millis(400);
        let s = throttled(&InMemory::new(), Duration::ZERO, held);
        for i in 0..3 {
            s.absent(&format!("f/{i}.d"));
        }
        let t = std::time::Instant::now();
        assert_eq!(s.len("f/0.d").unwrap(), None);
        for i in 0..3 {
            s.write_at(&format!("f/{i}.d"), 0, &[i as u8; 100]).unwrap();
        }
        assert!(
            t.elapsed() < held,
            "{:?}: a listing per new name",
            t.elapsed()
        );
        s.absent("f/1.d"); // known now: the hint is ignored
        s.sync_all().unwrap();
        let again =
            S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), s.store.clone()).unwrap();
        for i in 0..3u8 {
            assert_eq!(
                again.read_all(&format!("f/{i}.d")).unwrap(),
                Some(vec![i; 100])
            );
        }
        // A deletion forgets the hint with the object; a replace creates it.
        s.absent("f/r.d");
        s.replace("f/r.d", b"replaced").unwrap();
        assert_eq!(
            s.read_all("f/r.d").unwrap().as_deref(),
            Some(&b"replaced"[..])
        );
        s.delete("f/0.d").unwrap();
        assert_eq!(s.len("f/0.d").unwrap(), None);
    }

    /// A first read's listing, made without the lock, is not taken once the object changed
    /// after it was made: a replace (and the object then forgotten, as a full state
    /// forgets clean objects) while the read's GET is still in flight leaves the read, and
    /// the length, those of the new object.
    #[test]
    fn a_first_read_does_not_keep_a_listing_older_than_a_change() {
        let (s, backing) = mem();
        s.write_at("d/a.d", 0, b"twelve bytes").unwrap();
        s.sync_all().unwrap();
        let s = Arc::new(throttled(
            &backing,
            Duration::from_millis(600),
            Duration::ZERO,
        ));
        let reader = {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                let n = s.read_at("d/a.d", 0, &mut buf).unwrap();
                buf[..n].to_vec()
            })
        };
        std::thread::sleep(Duration::from_millis(150));
        s.replace("d/a.d", b"a longer object now").unwrap();
        lock(&s.state).objs.clear();
        assert_eq!(reader.join().unwrap(), b"a longer object now");
        assert_eq!(s.len("d/a.d").unwrap(), Some(19));
    }

    /// One listing answers for a file's three objects (the siblings it lacks are absent),
    /// and a store that forgot what it kept sees another process's changes.
    #[test]
    fn a_files_objects_are_listed_together_and_forgotten_on_demand() {
        assert_eq!(
            file_stem("f/ab/0123456789abcdef0123456789abcdef.m"),
            Some("f/ab/0123456789abcdef0123456789abcdef.")
        );
        for other in [
            "f/ab/0123.d",
            "g/ab/0123456789abcdef0123456789abcdef.d",
            "f/ab/0123456789abcdef0123456789abcdef.x",
            "anchor.signed",
        ] {
            assert_eq!(file_stem(other), None, "{other}");
        }
        let (w, backing) = mem();
        let f = "f/ab/0123456789abcdef0123456789abcdef.";
        w.write_at(&format!("{f}d"), 0, &vec![1u8; (CHUNK + 3) as usize])
            .unwrap();
        w.write_at(&format!("{f}m"), 0, b"nodes").unwrap();
        w.sync_all().unwrap();
        let r =
            S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), backing.clone()).unwrap();
        assert_eq!(r.len(&format!("{f}m")).unwrap(), Some(5));
        {
            let st = lock(&r.state);
            assert_eq!(
                st.objs[&format!("{f}d")].len,
                CHUNK + 3,
                "listed with its sibling"
            );
            assert!(st.absent.contains(&format!("{f}c")));
        }
        assert_eq!(r.len(&format!("{f}c")).unwrap(), None);
        let mut buf = [0u8; 5];
        r.read_at(&format!("{f}m"), 0, &mut buf).unwrap();
        // Another process changes the objects: the reader sees them once it forgets.
        w.write_at(&format!("{f}c"), 0, b"ctrs").unwrap();
        w.replace(&format!("{f}m"), b"other").unwrap();
        w.sync_all().unwrap();
        assert_eq!(r.len(&format!("{f}c")).unwrap(), None, "kept");
        r.forget_cached();
        assert_eq!(r.len(&format!("{f}c")).unwrap(), Some(4));
        r.read_at(&format!("{f}m"), 0, &mut buf).unwrap();
        assert_eq!(&buf, b"other");
        assert_eq!(r.len(&format!("{f}d")).unwrap(), Some(CHUNK + 3));
        // Unsynced writes are kept.
        r.write_at("x", 0, b"unsynced").unwrap();
        r.forget_cached();
        assert_eq!(r.read_all("x").unwrap().as_deref(), Some(&b"unsynced"[..]));
    }

    #[test]
    fn the_store_keeps_the_contract() {
        let (s, _) = mem();
        crate::store::tests::keeps_the_contract(&s);
    }

    /// Objects are chunks of CHUNK bytes, the last one exact; writes reach the bucket only
    /// at a sync, one request per chunk.
    #[test]
    fn chunks_are_stored_at_sync_with_the_last_one_exact() {
        let (s, b) = mem();
        let big = vec![7u8; (2 * CHUNK + 10) as usize];
        s.write_at("d/f.d", 0, &big).unwrap();
        assert!(keys(&b).is_empty(), "stored before a sync");
        assert_eq!(s.len("d/f.d").unwrap(), Some(2 * CHUNK + 10));
        s.sync(&["d/f.d".into()]).unwrap();
        assert_eq!(
            keys(&b),
            [
                ("vol/d/f.d@0000000000000000".to_string(), CHUNK),
                ("vol/d/f.d@0000000000000001".to_string(), CHUNK),
                ("vol/d/f.d@0000000000000002".to_string(), 10),
            ]
        );
        // A fresh store over the same bucket sees the same object.
        let again =
            S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), b.clone()).unwrap();
        assert_eq!(again.len("d/f.d").unwrap(), Some(2 * CHUNK + 10));
        assert_eq!(again.read_all("d/f.d").unwrap().unwrap(), big);
        assert_eq!(again.list().unwrap(), ["d/f.d"]);
        // A small write in the middle of a stored chunk is merged with its stored bytes.
        again.write_at("d/f.d", CHUNK + 5, b"xyz").unwrap();
        again.sync_all().unwrap();
        let third =
            S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), b.clone()).unwrap();
        let mut want = big.clone();
        want[(CHUNK + 5) as usize..(CHUNK + 8) as usize].copy_from_slice(b"xyz");
        assert_eq!(third.read_all("d/f.d").unwrap().unwrap(), want);
        // A truncation deletes the chunks past the end at the sync, and stores the new
        // last chunk exactly.
        third.set_len("d/f.d", 100).unwrap();
        assert_eq!(third.read_all("d/f.d").unwrap().unwrap(), want[..100]);
        third.set_len("d/f.d", CHUNK + 50).unwrap();
        let mut grown = want[..100].to_vec();
        grown.resize((CHUNK + 50) as usize, 0);
        assert_eq!(
            third.read_all("d/f.d").unwrap().unwrap(),
            grown,
            "stale bytes came back"
        );
        third.sync_all().unwrap();
        // Chunk 0 keeps its 100 bytes (the rest of it reads as zeros).
        assert_eq!(
            keys(&b),
            [
                ("vol/d/f.d@0000000000000000".to_string(), 100),
                ("vol/d/f.d@0000000000000001".to_string(), 50),
            ]
        );
        let fourth =
            S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), b.clone()).unwrap();
        assert_eq!(fourth.read_all("d/f.d").unwrap().unwrap(), grown);
        // An empty object is one empty chunk; deleting removes every chunk.
        fourth.set_len("d/f.d", 0).unwrap();
        fourth.sync_all().unwrap();
        assert_eq!(keys(&b), [("vol/d/f.d@0000000000000000".to_string(), 0)]);
        assert_eq!(fourth.len("d/f.d").unwrap(), Some(0));
        fourth.delete("d/f.d").unwrap();
        assert!(keys(&b).is_empty());
        assert_eq!(fourth.len("d/f.d").unwrap(), None);
    }

    /// Names that S3 would encode, or that hold the chunk separator, are refused.
    #[test]
    fn names_the_keys_cannot_carry_are_refused() {
        let (s, _) = mem();
        for bad in ["a@b", "x#y", "sp ace%"] {
            assert!(s.write_at(bad, 0, b"x").is_err(), "{bad}");
        }
        s.write_at("log.0000000000000001", 0, b"x").unwrap();
    }

    /// A sparse write far past the end stores only the chunk written and the holes read as
    /// zeros; another prefix in the same bucket is another volume.
    #[test]
    fn holes_cost_nothing_and_prefixes_are_apart() {
        let (s, b) = mem();
        s.write_at("h", 5 * CHUNK + 1, b"end").unwrap();
        s.sync_all().unwrap();
        assert_eq!(keys(&b), [("vol/h@0000000000000005".to_string(), 4)]);
        let mut buf = vec![1u8; 8];
        assert_eq!(s.read_at("h", 3 * CHUNK, &mut buf).unwrap(), 8);
        assert_eq!(buf, [0; 8]);
        let other =
            S3Store::with_store(S3Url::parse("s3://bucket/other").unwrap(), b.clone()).unwrap();
        assert_eq!(other.list().unwrap(), Vec::<String>::new());
        assert_eq!(other.len("h").unwrap(), None);
    }

    /// What the store does, against the in-memory store as the model: writes, truncations,
    /// syncs, deletions and reopenings (after a sync, over the same bucket) in any order,
    /// at offsets around the chunk boundaries.
    mod model {
        use super::*;
        use crate::store::MemStore;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Write(usize, u64, usize, u8),
            SetLen(usize, u64),
            Sync(usize),
            SyncAll,
            Delete(usize),
            Reopen,
            Read(usize, u64, usize),
        }

        const NAMES: [&str; 3] = ["a/x.d", "b", "log.0000000000000001"];

        fn at() -> impl Strategy<Value = u64> {
            prop_oneof![
                0..64u64,
                (CHUNK - 64)..(CHUNK + 64),
                (2 * CHUNK - 8)..(2 * CHUNK + 8),
                Just(3 * CHUNK + 1),
            ]
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0..3usize, at(), 0..200usize, any::<u8>()).prop_map(|(n, o, l, b)| Op::Write(n, o, l, b)),
                2 => (0..3usize, at()).prop_map(|(n, l)| Op::SetLen(n, l)),
                1 => (0..3usize).prop_map(Op::Sync),
                1 => Just(Op::SyncAll),
                1 => (0..3usize).prop_map(Op::Delete),
                1 => Just(Op::Reopen),
                3 => (0..3usize, at(), 0..300usize).prop_map(|(n, o, l)| Op::Read(n, o, l)),
            ]
        }

        fn reads_as(s: &S3Store, m: &MemStore, name: &str) {
            assert_eq!(s.len(name).unwrap(), m.len(name).unwrap(), "{name}");
            if let Some(len) = m.len(name).unwrap() {
                // Around the boundaries only (the objects may be megabytes long).
                for from in [0, CHUNK - 70, CHUNK, 2 * CHUNK - 10, len.saturating_sub(40)] {
                    let (mut x, mut y) = (vec![9u8; 140], vec![9u8; 140]);
                    let n = s.read_at(name, from, &mut x).unwrap();
                    assert_eq!(n, m.read_at(name, from, &mut y).unwrap(), "{name} @{from}");
                    assert_eq!(x[..n], y[..n], "{name} @{from}");
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn behaves_as_the_memory_store(ops in proptest::collection::vec(op(), 1..40)) {
                let backing = Arc::new(InMemory::new());
                let url = S3Url::parse("s3://bucket/p").unwrap();
                let mut s = S3Store::with_store(url.clone(), backing.clone()).unwrap();
                let m = MemStore::new();
                for op in ops {
                    match op {
                        Op::Write(n, off, len, b) => {
                            let data: Vec<u8> = (0..len).map(|i| b.wrapping_add(i as u8)).collect();
                            s.write_at(NAMES[n], off, &data).unwrap();
                            m.write_at(NAMES[n], off, &data).unwrap();
                        }
                        Op::SetLen(n, l) => {
                            s.set_len(NAMES[n], l).unwrap();
                            m.set_len(NAMES[n], l).unwrap();
                        }
                        Op::Sync(n) => s.sync(&[NAMES[n].to_string()]).unwrap(),
                        Op::SyncAll => s.sync_all().unwrap(),
                        Op::Delete(n) => {
                            s.delete(NAMES[n]).unwrap();
                            m.delete(NAMES[n]).unwrap();
                        }
                        Op::Reopen => {
                            s.sync_all().unwrap();
                            prop_assert_eq!(lock(&s.state).dirty_bytes, 0);
                            s = S3Store::with_store(url.clone(), backing.clone()).unwrap();
                            for n in NAMES {
                                reads_as(&s, &m, n);
                            }
                        }
                        Op::Read(n, off, len) => {
                            let (mut x, mut y) = (vec![7u8; len], vec![7u8; len]);
                            let r = s.read_at(NAMES[n], off, &mut x).map_err(|e| e.to_string());
                            let w = m.read_at(NAMES[n], off, &mut y).map_err(|e| e.to_string());
                            prop_assert_eq!(r.is_ok(), w.is_ok());
                            if let (Ok(a), Ok(b)) = (r, w) {
                                prop_assert_eq!(a, b);
                                prop_assert_eq!(&x[..a], &y[..b]);
                            }
                        }
                    }
                    let mut names = s.list().unwrap();
                    names.sort();
                    let mut want = m.list().unwrap();
                    want.sort();
                    prop_assert_eq!(names, want);
                }
                s.sync_all().unwrap();
                let s = S3Store::with_store(url, backing).unwrap();
                for n in NAMES {
                    reads_as(&s, &m, n);
                }
            }
        }
    }

    /// Threads writing, reading and syncing objects of their own at once: each reads its
    /// own writes, and a reopened store holds everything synced.
    #[test]
    fn concurrent_writers_keep_their_objects() {
        let (s, b) = mem();
        let s = Arc::new(s);
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let name = format!("t/{t}.d");
                    for r in 0..20u64 {
                        let off = r * (CHUNK / 3);
                        let data = vec![t.wrapping_mul(31).wrapping_add(r as u8); 5000];
                        s.write_at(&name, off, &data).unwrap();
                        let mut back = vec![0u8; 5000];
                        assert_eq!(s.read_at(&name, off, &mut back).unwrap(), 5000);
                        assert_eq!(back, data);
                        if r % 3 == 0 {
                            s.sync(std::slice::from_ref(&name)).unwrap();
                        }
                    }
                    s.sync(&[name]).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let again = S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), b).unwrap();
        for t in 0..4u8 {
            let name = format!("t/{t}.d");
            assert_eq!(again.len(&name).unwrap(), Some(19 * (CHUNK / 3) + 5000));
            for r in 0..20u64 {
                let mut back = vec![0u8; 5000];
                again.read_at(&name, r * (CHUNK / 3), &mut back).unwrap();
                assert_eq!(back, vec![t.wrapping_mul(31).wrapping_add(r as u8); 5000]);
            }
        }
    }

    /// A run of reads over a chunk is one GET of the chunk (the bucket changed behind the
    /// store's back shows only once the chunk left the cache); an upload forgets the chunk,
    /// so the next read sees the new bytes; at most CACHED_CHUNKS are kept.
    #[test]
    fn reads_fetch_whole_chunks_and_forget_what_changes() {
        let (s, b) = mem();
        s.write_at("f", 0, &vec![1u8; (CHUNK + 10) as usize])
            .unwrap();
        s.sync_all().unwrap();
        // The upload kept what it stored; start cold.
        assert_eq!(lock(&s.cache).chunks.len(), 2);
        s.forget_cached();
        let mut buf = [0u8; 4096];
        s.read_at("f", 0, &mut buf).unwrap();
        assert_eq!(lock(&s.cache).chunks.len(), 1);
        // Behind the store's back: the cached chunk still answers.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let key = s.key("f", 0);
        rt.block_on(b.put(&key, PutPayload::from(vec![2u8; CHUNK as usize])))
            .unwrap();
        for i in 1..256u64 {
            s.read_at("f", i * 4096, &mut buf).unwrap();
            assert_eq!(buf, [1u8; 4096], "block {i} not from the cache");
        }
        // A write and its sync keep what was stored (merged with the chunk as this store
        // knows it: a volume's objects have one writer), in the cache and in the bucket.
        s.write_at("f", 0, b"new").unwrap();
        s.sync_all().unwrap();
        assert_eq!(lock(&s.cache).chunks.len(), 1);
        s.read_at("f", 0, &mut buf).unwrap();
        assert_eq!(&buf[..5], b"new\x01\x01");
        let stored = rt
            .block_on(async { b.get(&key).await.unwrap().bytes().await })
            .unwrap();
        assert_eq!(&stored[..5], b"new\x01\x01");
        // Forgotten on demand: the bucket's bytes are read again.
        rt.block_on(b.put(&key, PutPayload::from(vec![2u8; CHUNK as usize])))
            .unwrap();
        s.forget_cached();
        s.read_at("f", 0, &mut buf).unwrap();
        assert_eq!(&buf[..5], b"\x02\x02\x02\x02\x02");
        // A truncation's deletions and a deletion forget too.
        s.read_at("f", CHUNK, &mut buf[..10]).unwrap();
        assert_eq!(lock(&s.cache).chunks.len(), 2);
        s.set_len("f", 5).unwrap();
        s.sync_all().unwrap();
        assert!(lock(&s.cache).chunks.keys().all(|k| k.1 == 0));
        s.delete("f").unwrap();
        assert!(lock(&s.cache).chunks.is_empty());
        // Bounded.
        for i in 0..(CACHED_CHUNKS as u64 + 5) {
            s.write_at("g", i * CHUNK, b"x").unwrap();
        }
        s.sync_all().unwrap();
        for i in 0..(CACHED_CHUNKS as u64 + 5) {
            s.read_at("g", i * CHUNK, &mut buf[..1]).unwrap();
            assert_eq!(buf[0], b'x');
        }
        let c = lock(&s.cache);
        assert_eq!(
            (c.chunks.len(), c.order.len()),
            (CACHED_CHUNKS, CACHED_CHUNKS)
        );
        assert!(
            !c.chunks.contains_key(&("g".to_string(), 0)),
            "the oldest stays"
        );
    }

    /// Waits until no chunk is being read ahead.
    fn settle(s: &S3Store) {
        let mut c = lock(&s.cache);
        while !c.fetching.is_empty() {
            c = s.fetched.wait(c).unwrap();
        }
    }

    fn cached(s: &S3Store, name: &str) -> Vec<u64> {
        let mut v: Vec<u64> = lock(&s.cache)
            .chunks
            .keys()
            .filter(|k| k.0 == name)
            .map(|k| k.1)
            .collect();
        v.sort();
        v
    }

    /// A read that goes on from the chunk before fetches the next chunks too, in the
    /// background, a window that doubles while the reads stay in order, but never a dirty
    /// or stale chunk or one past the end; a read out of order fetches none.
    #[test]
    fn sequential_reads_fetch_ahead() {
        let (s, _) = mem();
        s.write_at("f", 0, &vec![3u8; (8 * CHUNK) as usize])
            .unwrap();
        s.sync_all().unwrap();
        s.forget_cached();
        s.write_at("f", 3 * CHUNK, b"dirty").unwrap();
        let mut buf = [0u8; 16];
        s.read_at("f", 0, &mut buf).unwrap();
        settle(&s);
        assert_eq!(cached(&s, "f"), [0], "no read ahead on a first read");
        s.read_at("f", CHUNK, &mut buf).unwrap();
        settle(&s);
        assert_eq!(cached(&s, "f"), [0, 1, 2, 4, 5], "chunk 3 is dirty");
        assert_eq!(lock(&s.cache).seq["f"], (1, READ_AHEAD));
        s.read_at("f", 2 * CHUNK, &mut buf).unwrap();
        settle(&s);
        assert_eq!(
            lock(&s.cache).seq["f"],
            (2, 2 * READ_AHEAD),
            "the window doubles"
        );
        assert_eq!(cached(&s, "f"), [0, 1, 2, 4, 5, 6, 7]);
        // Out of order: the window closes.
        s.read_at("f", 0, &mut buf).unwrap();
        assert_eq!(lock(&s.cache).seq["f"], (0, 0));
        // Chunk 6 becomes the (dirty) last one, 7 is past the end.
        s.set_len("f", 6 * CHUNK + 1).unwrap();
        assert_eq!(s.read_ahead("f", 5, READ_AHEAD), Vec::<u64>::new());
        s.sync_all().unwrap();
        assert_eq!(
            s.read_ahead("f", 5, READ_AHEAD),
            Vec::<u64>::new(),
            "stored and clean now, and kept from its upload"
        );
        assert!(cached(&s, "f").contains(&6));
        lock(&s.cache).forget_one("f", 6);
        assert_eq!(s.read_ahead("f", 5, READ_AHEAD), [6]);
        assert_eq!(s.read_ahead("f", 6, READ_AHEAD), Vec::<u64>::new());
        assert_eq!(s.read_ahead("missing", 0, READ_AHEAD), Vec::<u64>::new());
        // A long sequential read: every byte right, the window at its largest.
        let (s, _) = mem();
        let big: Vec<u8> = (0..40 * CHUNK).map(|i| (i / 4096) as u8).collect();
        s.write_at("g", 0, &big).unwrap();
        s.sync_all().unwrap();
        s.forget_cached();
        let mut back = vec![0u8; big.len()];
        for (k, piece) in back.chunks_mut(65536).enumerate() {
            s.read_at("g", (k * 65536) as u64, piece).unwrap();
        }
        assert!(back == big);
        assert_eq!(lock(&s.cache).seq["g"].1, READ_AHEAD_MAX);
        settle(&s);
    }

    /// A chunk being read ahead when a write and its sync change it is not taken: the read
    /// after the sync sees the new bytes.
    #[test]
    fn a_chunk_read_ahead_across_an_upload_is_not_kept() {
        let backing = InMemory::new();
        let held = Duration::from_millis(300);
        let s = throttled(&backing, held, Duration::ZERO);
        s.write_at("f", 0, &vec![1u8; (4 * CHUNK) as usize])
            .unwrap();
        s.sync_all().unwrap();
        s.forget_cached();
        let mut buf = [0u8; 4];
        s.read_at("f", 0, &mut buf).unwrap();
        s.read_at("f", CHUNK, &mut buf).unwrap(); // chunks 2 and 3 read ahead
        s.write_at("f", 2 * CHUNK, b"new!").unwrap();
        s.sync_all().unwrap();
        settle(&s);
        s.read_at("f", 2 * CHUNK, &mut buf).unwrap();
        assert_eq!(&buf, b"new!");
        s.read_at("f", 3 * CHUNK, &mut buf).unwrap();
        assert_eq!(buf, [1u8; 4]);
    }

    /// A read that began before a forgetting does not keep what it got.
    #[test]
    fn a_read_overlapping_a_forgetting_is_not_kept() {
        let mut c = ReadCache::default();
        let e = c.epoch;
        c.forget_one("f", 3);
        c.insert("f", 3, Bytes::from_static(b"old"), e);
        assert!(c.chunks.is_empty() && c.order.is_empty());
        c.insert("f", 3, Bytes::from_static(b"new"), c.epoch);
        c.insert("f", 3, Bytes::from_static(b"newer"), c.epoch);
        assert_eq!(c.order.len(), 1);
        assert_eq!(
            c.chunks[&("f".to_string(), 3)],
            Bytes::from_static(b"newer")
        );
    }

    /// A new volume needs an empty prefix that no volume lies above.
    #[test]
    fn a_new_volume_needs_a_prefix_of_its_own() {
        let backing = Arc::new(InMemory::new());
        let open =
            |u: &str| S3Store::with_store(S3Url::parse(u).unwrap(), backing.clone()).unwrap();
        let outer = open("s3://bucket/a");
        outer.check_new_prefix().unwrap();
        outer.write_at("intact.conf", 0, b"{}").unwrap();
        outer.sync_all().unwrap();
        let e = outer.check_new_prefix().unwrap_err().to_string();
        assert!(e.contains("not empty"), "{e}");
        let e = open("s3://bucket/a/b/c")
            .check_new_prefix()
            .unwrap_err()
            .to_string();
        assert!(e.contains("s3://bucket/a holds a volume"), "{e}");
        open("s3://bucket/ab").check_new_prefix().unwrap();
        // A volume at the bucket's root lies above every prefix.
        let root = open("s3://bucket");
        root.write_at("intact.conf", 0, b"{}").unwrap();
        root.sync_all().unwrap();
        let e = open("s3://bucket/z")
            .check_new_prefix()
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds a volume"), "{e}");
    }

    /// A chunk's written ranges are merged, cover what they cover, and a cut forgets what
    /// lies past it; every change counts a new version.
    #[test]
    fn a_chunk_keeps_its_written_ranges_merged() {
        let mut c = Chunk::fresh(100);
        c.write(10, &[1; 10]);
        c.write(30, &[2; 10]);
        assert_eq!(c.mask, [(10, 20), (30, 40)]);
        c.write(20, &[3; 10]); // touching both: one range
        assert_eq!(c.mask, [(10, 40)]);
        c.write(5, &[4; 3]); // apart, before
        assert_eq!(c.mask, [(5, 8), (10, 40)]);
        assert!(!c.covers(40));
        c.write(0, &[5; 12]); // overlapping the first two
        assert_eq!(c.mask, [(0, 40)]);
        assert!(c.covers(40) && c.covers(39) && !c.covers(41));
        assert!(Chunk::fresh(0).covers(0) && !Chunk::fresh(0).covers(1));
        assert_eq!(c.data.len(), 40);
        assert_eq!(c.version, 5);
        let mut buf = [9u8; 8];
        c.overlay(36, &mut buf);
        assert_eq!(buf, [2, 2, 2, 2, 9, 9, 9, 9]);
        c.cut(30);
        assert_eq!(
            (c.mask.as_slice(), c.data.len(), c.base),
            (&[(0, 30)][..], 30, 30)
        );
        c.cut(0);
        assert!(c.mask.is_empty() && c.data.is_empty() && c.base == 0);
        assert_eq!(c.version, 7);
        // A cut at the start of a range leaves no empty range behind.
        let mut d = Chunk::fresh(0);
        d.write(4, &[1; 4]);
        d.cut(4);
        assert!(d.mask.is_empty(), "{:?}", d.mask);
    }

    /// A write or a truncation that lands while a sync uploads (after the sync took the
    /// chunks, before it marks them clean) stays dirty, and the next sync stores it.
    #[test]
    fn a_change_during_an_upload_is_not_marked_clean() {
        let (s, b) = mem();
        s.write_at("a", 0, b"one").unwrap();
        s.sync_all().unwrap();
        s.write_at("a", 0, b"two").unwrap();
        let (jobs, _) = s.take_jobs(None);
        let epoch = lock(&s.cache).epoch;
        s.write_at("a", 1, b"X").unwrap(); // during the upload
        let stored = s.upload(&jobs).unwrap();
        s.uploaded(&jobs, stored, epoch);
        assert_eq!(lock(&s.state).objs["a"].dirty.len(), 1, "marked clean");
        s.sync_all().unwrap();
        let again =
            S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), b.clone()).unwrap();
        assert_eq!(again.read_all("a").unwrap().unwrap(), b"tXo");
        // The same with a truncation in between.
        s.write_at("a", 0, b"four").unwrap();
        let (jobs, _) = s.take_jobs(None);
        let epoch = lock(&s.cache).epoch;
        s.set_len("a", 2).unwrap();
        let stored = s.upload(&jobs).unwrap();
        s.uploaded(&jobs, stored, epoch);
        assert_eq!(s.len("a").unwrap(), Some(2));
        // The upload stored "four": none of what the cut took off shows, also once the
        // object grows again.
        assert_eq!(s.read_all("a").unwrap().unwrap(), b"fo");
        s.set_len("a", 4).unwrap();
        assert_eq!(s.read_all("a").unwrap().unwrap(), b"fo\0\0");
        s.set_len("a", 2).unwrap();
        s.sync_all().unwrap();
        let again = S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), b).unwrap();
        assert_eq!(again.read_all("a").unwrap().unwrap(), b"fo");
    }

    /// Writes made while a sync uploads stay dirty and go up at the next sync.
    #[test]
    fn what_changes_during_a_sync_stays_dirty() {
        let (s, b) = mem();
        s.write_at("a", 0, b"one").unwrap();
        // Simulate a write between the snapshot and the upload's end: bump the version.
        s.sync_all().unwrap();
        s.write_at("a", 0, b"two").unwrap();
        {
            let st = lock(&s.state);
            assert_eq!(st.objs["a"].dirty.len(), 1);
        }
        s.sync(&["other".into()]).unwrap();
        assert_eq!(
            lock(&s.state).objs["a"].dirty.len(),
            1,
            "synced by another name's sync"
        );
        s.sync(&["a".into()]).unwrap();
        assert!(lock(&s.state).objs["a"].dirty.is_empty());
        let again = S3Store::with_store(S3Url::parse("s3://bucket/vol").unwrap(), b).unwrap();
        assert_eq!(again.read_all("a").unwrap().unwrap(), b"two");
        assert_eq!(lock(&s.state).dirty_bytes, 0);
    }
}
