//! `intact bench contiu --part macro`: the macro-benchmark of Contiu et al. (2017), rerun
//! here: their six object-level schemes (§3.1: AES in CBC, CTR or GCM mode, each object's
//! SHA-512 digest signed with RSA-PSS or ECDSA) at the three strengths of their Table 1,
//! on their three data sets (§3.2, Table 2), under their four workloads (§3.3, Table 3),
//! against a cloud that adds 50 ms to every request (§3.4) and against a real S3 server
//! (Figs. 5–7). intact's own schemes run the same operations as extra rows, so the table
//! shows what freshness of the whole volume costs beside signatures of single objects.
//!
//! * **The client** (their Python testbed): one operation per file of the data set, in
//!   order, each a read with the workload's probability (a seeded draw, the same for every
//!   scheme) and a write otherwise. A write encrypts the file under a fresh IV, hashes
//!   IV and ciphertext with SHA-512, signs the digest and stores the object with one PUT;
//!   a read GETs it, checks the signature over the digest it computes, and decrypts. The
//!   data set is stored once beforehand (not timed). The metric is their total time.
//! * **The simulated cloud** (their in-memory key-value store with 50 ms added to each
//!   request) is `object_store`'s in-memory store under [`Latency`], which adds the delay on
//!   a virtual clock instead of sleeping: a request that begins when the clock is `D`
//!   ahead of real time moves it to at least `D + delay` when it ends. Requests made one
//!   after another (their client) each add the whole delay, as a sleep would; requests in
//!   flight together (intact's uploads) add it once, as they would on a network. The clock
//!   is exact for their client, which waits for each request before the next. It is not
//!   for a client whose requests overlap its own work (it would charge a request read
//!   ahead in the background as if it were waited for), so **intact's rows sleep** the
//!   delay in each request instead, on the same objects: their time is wall-clock time.
//! * **intact's rows**: a volume in the same cloud (the S3 store over the same wrapper), its
//!   anchor in a local state directory and every sealed root signed with the level's ECDSA
//!   key and published in the bucket. A write replaces the file's contents (truncate,
//!   write, fsync: durable and sealed when it returns); a read reads it whole (every block
//!   checked against the volume's root). The volume is reopened with cold caches before
//!   the workloads.
//! * **Scale**: `--scale` multiplies the number of files of each set (2,000, 100, 20) and
//!   keeps their size distributions (sizes 1 KiB to 64 MiB); `--min-files` keeps at least
//!   that many in each set, so that a workload's share of reads means something in the
//!   sets of few large files (their cost is crypto, not signatures or round trips).

use crate::bench_yun::Range;
use anyhow::{anyhow, bail, Context, Result};
use async_trait::async_trait;
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_192_GCM, AES_256_GCM};
use aws_lc_rs::cipher::{
    DecryptingKey, EncryptingKey, EncryptionContext, PaddedBlockDecryptingKey,
    PaddedBlockEncryptingKey, UnboundCipherKey,
};
use aws_lc_rs::digest;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use intact_core::format::SchemeId;
use intact_core::sign::{KeyKind, PublicKey, SignedAnchor, Signer};
use intact_core::store::{LocalStateDir, S3Store, S3Url, TrustedStore, UntrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bench_contiu::Mode;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// The smallest and largest file of every set (§3.2: "from 1 KB to 64 MB").
const MIN_SIZE: usize = KIB;
const MAX_SIZE: usize = 64 * MIB;
/// The password of the bench's volumes.
const PW: &[u8] = b"contiu-bench";

/// The three data sets of their Table 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum DataSet {
    /// Log-normal sizes, mean 256 KB, 2,000 files (0.5 GB).
    MostlySmall,
    /// Uniform sizes, mean 32 MB, 100 files (3.1 GB).
    Mixed,
    /// "Reversed" log-normal sizes (64 MB less a log-normal amount), 20 files (1.2 GB).
    MostlyLarge,
}

impl DataSet {
    pub const ALL: [DataSet; 3] = [DataSet::MostlySmall, DataSet::Mixed, DataSet::MostlyLarge];

    pub fn name(self) -> &'static str {
        match self {
            DataSet::MostlySmall => "mostly-small",
            DataSet::Mixed => "mixed",
            DataSet::MostlyLarge => "mostly-large",
        }
    }

    /// Their figure for the set.
    pub fn figure(self) -> &'static str {
        match self {
            DataSet::MostlySmall => "Fig. 5",
            DataSet::MostlyLarge => "Fig. 6",
            DataSet::Mixed => "Fig. 7",
        }
    }

    /// Files in their set.
    pub fn files(self) -> usize {
        match self {
            DataSet::MostlySmall => 2000,
            DataSet::Mixed => 100,
            DataSet::MostlyLarge => 20,
        }
    }

    /// The sizes of the set at `scale` (of its number of files, and at least `min` of
    /// them, up to all), drawn from `seed`.
    pub fn sizes(self, scale: f64, min: usize, seed: u64) -> Vec<usize> {
        let n = ((self.files() as f64 * scale).round() as usize)
            .max(min.min(self.files()))
            .max(1);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ ((self as u64 + 1) * 0x9e37));
        (0..n)
            .map(|_| {
                let x = match self {
                    DataSet::MostlySmall => lognormal(&mut rng, (256 * KIB) as f64, 1.0),
                    DataSet::Mixed => rng.gen_range(MIN_SIZE..=MAX_SIZE) as f64,
                    DataSet::MostlyLarge => {
                        (MAX_SIZE + MIN_SIZE) as f64 - lognormal(&mut rng, (4 * MIB) as f64, 1.0)
                    }
                };
                (x.max(0.0) as usize).clamp(MIN_SIZE, MAX_SIZE)
            })
            .collect()
    }
}

/// A log-normal draw of mean `mean` whose logarithm has deviation `sigma` (Box–Muller).
fn lognormal(rng: &mut impl Rng, mean: f64, sigma: f64) -> f64 {
    let mu = mean.ln() - sigma * sigma / 2.0;
    let u1 = rng.gen::<f64>().max(1e-12);
    let u2 = rng.gen::<f64>();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (mu + sigma * z).exp()
}

/// The four workloads of their Table 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum Workload {
    /// 5 % reads.
    MostlyWrite,
    /// 50 % reads.
    WriteHeavy,
    /// 95 % reads.
    ReadHeavy,
    /// Reads only.
    ReadOnly,
}

impl Workload {
    pub const ALL: [Workload; 4] = [
        Workload::MostlyWrite,
        Workload::WriteHeavy,
        Workload::ReadHeavy,
        Workload::ReadOnly,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::MostlyWrite => "mostly-write",
            Workload::WriteHeavy => "write-heavy",
            Workload::ReadHeavy => "read-heavy",
            Workload::ReadOnly => "read-only",
        }
    }

    fn reads(self) -> f64 {
        match self {
            Workload::MostlyWrite => 0.05,
            Workload::WriteHeavy => 0.5,
            Workload::ReadHeavy => 0.95,
            Workload::ReadOnly => 1.0,
        }
    }

    /// Which of `n` operations are reads, drawn from `seed` (the same for every scheme).
    pub fn ops(self, n: usize, seed: u64) -> Vec<bool> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ ((self as u64 + 7) * 0x51ed));
        (0..n).map(|_| rng.gen::<f64>() < self.reads()).collect()
    }
}

/// A strength level of their Table 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum Level {
    /// 128 bits: AES-128, RSA-3072, ECDSA P-256.
    Low,
    /// 192 bits: AES-192, RSA-7680, ECDSA P-384.
    Medium,
    /// 256 bits: AES-256, RSA-15360, ECDSA P-521.
    High,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::Low, Level::Medium, Level::High];

    pub fn name(self) -> &'static str {
        match self {
            Level::Low => "low",
            Level::Medium => "medium",
            Level::High => "high",
        }
    }

    fn aes_bits(self) -> usize {
        match self {
            Level::Low => 128,
            Level::Medium => 192,
            Level::High => 256,
        }
    }

    fn key(self, sig: Sig) -> (KeyKind, &'static str) {
        match (sig, self) {
            (Sig::Rsa, Level::Low) => (KeyKind::RsaPss3072, "rsa-3072"),
            (Sig::Rsa, Level::Medium) => (KeyKind::RsaPss7680, "rsa-7680"),
            (Sig::Rsa, Level::High) => (KeyKind::RsaPss15360, "rsa-15360"),
            (Sig::Ecc, Level::Low) => (KeyKind::EcdsaP256, "ecdsa-p256"),
            (Sig::Ecc, Level::Medium) => (KeyKind::EcdsaP384, "ecdsa-p384"),
            (Sig::Ecc, Level::High) => (KeyKind::EcdsaP521, "ecdsa-p521"),
        }
    }
}

/// The signature half of a scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Sig {
    Rsa,
    Ecc,
}

impl Sig {
    fn name(self) -> &'static str {
        match self {
            Sig::Rsa => "RSA",
            Sig::Ecc => "ECC",
        }
    }
}

/// The six schemes of §3.1, in their order.
pub const SCHEMES: [(Mode, Sig); 6] = [
    (Mode::Cbc, Sig::Rsa),
    (Mode::Ctr, Sig::Rsa),
    (Mode::Gcm, Sig::Rsa),
    (Mode::Cbc, Sig::Ecc),
    (Mode::Ctr, Sig::Ecc),
    (Mode::Gcm, Sig::Ecc),
];

fn scheme_name(mode: Mode, sig: Sig) -> String {
    format!("{}-{}", mode_name(mode), sig.name())
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Cbc => "CBC",
        Mode::Ctr => "CTR",
        Mode::Gcm => "GCM",
    }
}

/// The signing keys of the run, made once and kept in a directory (RSA-15360 takes
/// minutes to make), as their keys were "pre-generated before the experiments" (§3.1).
pub struct Keys {
    dir: PathBuf,
}

impl Keys {
    pub fn new(dir: PathBuf) -> Result<Keys> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Keys { dir })
    }

    /// The key of `sig` at `level`: read from the directory, or made and written there.
    pub fn signer(&self, sig: Sig, level: Level) -> Result<Arc<Signer>> {
        let (kind, name) = level.key(sig);
        let path = self.dir.join(format!("{name}.der"));
        if path.exists() {
            return Signer::load(&path)
                .map(Arc::new)
                .map_err(|e| anyhow!("{e}"));
        }
        let der = Signer::generate(kind).map_err(|e| anyhow!("{e}"))?;
        let tmp = self.dir.join(format!("{name}.der.tmp"));
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .with_context(|| format!("writing {}", tmp.display()))?;
            f.write_all(&der)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        Signer::from_pkcs8(&der)
            .map(Arc::new)
            .map_err(|e| anyhow!("{e}"))
    }
}

/// One of their schemes with its keys: how a client turns a file into an object and back.
pub struct Client {
    mode: Mode,
    cipher: Cipher,
    signer: Arc<Signer>,
    public: PublicKey,
}

enum Cipher {
    Cbc(PaddedBlockEncryptingKey, PaddedBlockDecryptingKey),
    Ctr(EncryptingKey, DecryptingKey),
    Gcm(LessSafeKey),
}

impl Client {
    /// `mode` with a random AES key of `level`'s size, signing with `signer`.
    pub fn new(mode: Mode, level: Level, signer: Arc<Signer>) -> Result<Client> {
        let mut key = vec![0u8; level.aes_bits() / 8];
        intact_core::crypto::fill_random(&mut key);
        let fail = |_| anyhow!("AES-{} key", level.aes_bits());
        let alg = match level {
            Level::Low => &aws_lc_rs::cipher::AES_128,
            Level::Medium => &aws_lc_rs::cipher::AES_192,
            Level::High => &aws_lc_rs::cipher::AES_256,
        };
        let unbound = || UnboundCipherKey::new(alg, &key).map_err(fail);
        let cipher = match mode {
            Mode::Cbc => Cipher::Cbc(
                PaddedBlockEncryptingKey::cbc_pkcs7(unbound()?).map_err(fail)?,
                PaddedBlockDecryptingKey::cbc_pkcs7(unbound()?).map_err(fail)?,
            ),
            Mode::Ctr => Cipher::Ctr(
                EncryptingKey::ctr(unbound()?).map_err(fail)?,
                DecryptingKey::ctr(unbound()?).map_err(fail)?,
            ),
            Mode::Gcm => {
                let alg = match level {
                    Level::Low => &AES_128_GCM,
                    Level::Medium => &AES_192_GCM,
                    Level::High => &AES_256_GCM,
                };
                Cipher::Gcm(LessSafeKey::new(UnboundKey::new(alg, &key).map_err(fail)?))
            }
        };
        let public = signer.public().clone();
        Ok(Client {
            mode,
            cipher,
            signer,
            public,
        })
    }

    fn iv_len(&self) -> usize {
        if self.mode == Mode::Gcm {
            12
        } else {
            16
        }
    }

    /// The object of `data`: `[u16 LE: signature envelope length][envelope][IV][ciphertext]`,
    /// the envelope signing SHA-512(IV ‖ ciphertext).
    pub fn seal(&self, data: &[u8]) -> Result<Vec<u8>> {
        let ivl = self.iv_len();
        let mut body = Vec::with_capacity(ivl + data.len() + 32);
        body.resize(ivl, 0);
        intact_core::crypto::fill_random(&mut body[..ivl]);
        body.extend_from_slice(data);
        let fail = |_| anyhow!("{} encryption failed", mode_name(self.mode));
        let iv16 = |b: &[u8]| -> [u8; 16] { b[..16].try_into().expect("16-byte IV") };
        match &self.cipher {
            Cipher::Cbc(e, _) => {
                let iv = iv16(&body);
                let mut ct = body.split_off(ivl);
                e.less_safe_encrypt(&mut ct, EncryptionContext::Iv128(iv.into()))
                    .map_err(fail)?;
                body.extend_from_slice(&ct);
            }
            Cipher::Ctr(e, _) => {
                let iv = iv16(&body);
                e.less_safe_encrypt(&mut body[ivl..], EncryptionContext::Iv128(iv.into()))
                    .map_err(fail)?;
            }
            Cipher::Gcm(k) => {
                let n: [u8; 12] = body[..12].try_into().expect("12-byte nonce");
                let mut ct = body.split_off(ivl);
                k.seal_in_place_append_tag(Nonce::assume_unique_for_key(n), Aad::empty(), &mut ct)
                    .map_err(fail)?;
                body.extend_from_slice(&ct);
            }
        }
        let d = digest::digest(&digest::SHA512, &body);
        let env = self.signer.seal(d.as_ref()).map_err(|e| anyhow!("{e}"))?;
        let mut obj = Vec::with_capacity(2 + env.len() + body.len());
        obj.extend_from_slice(&u16::try_from(env.len())?.to_le_bytes());
        obj.extend_from_slice(&env);
        obj.extend_from_slice(&body);
        Ok(obj)
    }

    /// The file in `obj`, once its signature verifies over the digest of its IV and
    /// ciphertext (and, under GCM, its tag).
    pub fn open(&self, obj: &[u8]) -> Result<Vec<u8>> {
        let short = || anyhow!("the object is too short");
        let n = usize::from(u16::from_le_bytes(
            obj.get(..2).ok_or_else(short)?.try_into()?,
        ));
        let env = obj.get(2..2 + n).ok_or_else(short)?;
        let body = &obj[2 + n..];
        let signed = self
            .public
            .open(env)
            .map_err(|e| anyhow!("the signature: {e}"))?;
        let d = digest::digest(&digest::SHA512, body);
        if signed != d.as_ref() {
            bail!("the object's digest is not the one signed");
        }
        let ivl = self.iv_len();
        if body.len() < ivl {
            return Err(short());
        }
        let (iv, ct) = body.split_at(ivl);
        let mut buf = ct.to_vec();
        let fail = |_| anyhow!("{} decryption failed", mode_name(self.mode));
        let len = match &self.cipher {
            Cipher::Cbc(_, d) => {
                let iv: [u8; 16] = iv.try_into()?;
                d.decrypt(&mut buf, EncryptionContext::Iv128(iv.into()).into())
                    .map_err(fail)?
                    .len()
            }
            Cipher::Ctr(_, d) => {
                let iv: [u8; 16] = iv.try_into()?;
                d.decrypt(&mut buf, EncryptionContext::Iv128(iv.into()).into())
                    .map_err(fail)?
                    .len()
            }
            Cipher::Gcm(k) => {
                let n: [u8; 12] = iv.try_into()?;
                k.open_in_place(Nonce::assume_unique_for_key(n), Aad::empty(), &mut buf)
                    .map_err(fail)?
                    .len()
            }
        };
        buf.truncate(len);
        Ok(buf)
    }
}

/// The virtual clock of [`Latency`]: how far the simulated cloud's time is ahead of real
/// time, and the requests it served.
#[derive(Debug)]
pub struct Clock {
    delay_ns: u64,
    ahead_ns: AtomicU64,
    /// GET, PUT, LIST, DELETE (a batch), other.
    kinds: [AtomicU64; 5],
}

/// The kinds of request [`Clock`] counts.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Get,
    Put,
    List,
    Delete,
    Other,
}

impl Clock {
    pub fn new(delay: Duration) -> Arc<Clock> {
        Arc::new(Clock {
            delay_ns: delay.as_nanos() as u64,
            ahead_ns: AtomicU64::new(0),
            kinds: Default::default(),
        })
    }

    /// A request begins: the clock's lead now.
    fn begin(&self) -> u64 {
        self.ahead_ns.load(Ordering::SeqCst)
    }

    /// The request that began at lead `at` ends: it took the delay after it began, so the
    /// lead is at least `at + delay` (requests in flight together add it once).
    fn end(&self, at: u64, kind: Kind) {
        self.count(kind);
        self.ahead_ns
            .fetch_max(at + self.delay_ns, Ordering::SeqCst);
    }

    /// A request of `kind` served.
    fn count(&self, kind: Kind) {
        self.kinds[kind as usize].fetch_add(1, Ordering::SeqCst);
    }

    /// The delay added so far.
    pub fn added(&self) -> Duration {
        Duration::from_nanos(self.ahead_ns.load(Ordering::SeqCst))
    }

    /// Requests served so far.
    #[cfg(test)]
    fn requests(&self) -> u64 {
        self.kinds().iter().sum()
    }

    /// Requests served so far by kind: GET, PUT, LIST, DELETE, other.
    pub fn kinds(&self) -> [u64; 5] {
        std::array::from_fn(|k| self.kinds[k].load(Ordering::SeqCst))
    }
}

/// A store that adds [`Clock`]'s delay to every request of `inner` (a listing and a batch of
/// deletions are one request each, as on S3).
#[derive(Debug)]
pub struct Latency {
    inner: Arc<dyn ObjectStore>,
    clock: Arc<Clock>,
    /// Sleep the delay in each request instead of adding it on the clock (intact's rows:
    /// their requests overlap their own work, which the clock cannot credit).
    sleep: bool,
    /// Print every request on stderr (`INTACT_BENCH_TRACE=1`).
    trace: bool,
}

impl Latency {
    pub fn new(inner: Arc<dyn ObjectStore>, clock: Arc<Clock>) -> Latency {
        Latency {
            inner,
            clock,
            sleep: false,
            trace: std::env::var_os("INTACT_BENCH_TRACE").is_some_and(|v| v == "1"),
        }
    }

    /// The same store, each request sleeping the clock's delay (the clock only counts).
    pub fn sleeping(inner: Arc<dyn ObjectStore>, clock: Arc<Clock>) -> Latency {
        Latency {
            sleep: true,
            ..Latency::new(inner, clock)
        }
    }

    /// A request begins: the clock's lead (or, sleeping, the delay slept).
    async fn begin(&self) -> u64 {
        if self.sleep {
            tokio::time::sleep(Duration::from_nanos(self.clock.delay_ns)).await;
        }
        let at = self.clock.begin();
        tokio::task::yield_now().await;
        at
    }

    /// A request ends (sleeping: counted, nothing added).
    fn end(&self, at: u64, kind: Kind) {
        if self.sleep {
            self.clock.count(kind);
        } else {
            self.clock.end(at, kind);
        }
    }

    /// `f` as one request: it begins at the clock's lead, lets the requests issued with it
    /// begin too (one yield: the in-memory store answers at once, so without it requests
    /// joined together would run one after another), and ends after the delay.
    async fn timed<T>(
        &self,
        kind: Kind,
        what: &ObjPath,
        f: impl std::future::Future<Output = T>,
    ) -> T {
        let at = self.begin().await;
        let r = f.await;
        self.end(at, kind);
        self.trace(kind, what);
        r
    }

    fn trace(&self, kind: Kind, what: &ObjPath) {
        if self.trace {
            eprintln!("{kind:?} {what}");
        }
    }

    /// A listing: one request per page of 1,000 names, one after another (each page
    /// needs the previous one's continuation token, as on S3).
    fn listing(
        &self,
        what: ObjPath,
        inner: BoxStream<'static, object_store::Result<ObjectMeta>>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (clock, trace, sleep) = (self.clock.clone(), self.trace, self.sleep);
        futures_util::stream::once(async move {
            let pause = Duration::from_nanos(clock.delay_ns);
            if sleep {
                tokio::time::sleep(pause).await;
            }
            let at = clock.begin();
            tokio::task::yield_now().await;
            let items: Vec<_> = inner.collect().await;
            let pages = items.len().div_ceil(1000).max(1);
            for page in 0..pages {
                if sleep {
                    if page > 0 {
                        tokio::time::sleep(pause).await;
                    }
                    clock.count(Kind::List);
                } else {
                    let at = if page == 0 { at } else { clock.begin() };
                    clock.end(at, Kind::List);
                }
            }
            if trace {
                eprintln!("List {what}");
            }
            futures_util::stream::iter(items)
        })
        .flatten()
        .boxed()
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Latency({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Latency {
    async fn put_opts(
        &self,
        location: &ObjPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.timed(
            Kind::Put,
            location,
            self.inner.put_opts(location, payload, opts),
        )
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.timed(
            Kind::Put,
            location,
            self.inner.put_multipart_opts(location, opts),
        )
        .await
    }

    async fn get_opts(
        &self,
        location: &ObjPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.timed(Kind::Get, location, self.inner.get_opts(location, options))
            .await
    }

    async fn get_ranges(
        &self,
        location: &ObjPath,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.timed(Kind::Get, location, self.inner.get_ranges(location, ranges))
            .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjPath>> {
        // One request, charged (or slept) as the batch goes.
        let (clock, sleep) = (self.clock.clone(), self.sleep);
        let first = futures_util::stream::once(async move {
            if sleep {
                tokio::time::sleep(Duration::from_nanos(clock.delay_ns)).await;
                clock.count(Kind::Delete);
            } else {
                let at = clock.begin();
                clock.end(at, Kind::Delete);
            }
            futures_util::stream::empty::<object_store::Result<ObjPath>>()
        })
        .flatten();
        self.trace(Kind::Delete, &ObjPath::from("(batch)"));
        first.chain(self.inner.delete_stream(locations)).boxed()
    }

    fn list(
        &self,
        prefix: Option<&ObjPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.listing(prefix.cloned().unwrap_or_default(), self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&ObjPath>,
        offset: &ObjPath,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.listing(
            prefix.cloned().unwrap_or_default(),
            self.inner.list_with_offset(prefix, offset),
        )
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjPath>,
    ) -> object_store::Result<ListResult> {
        self.timed(
            Kind::List,
            &prefix.cloned().unwrap_or_default(),
            self.inner.list_with_delimiter(prefix),
        )
        .await
    }

    async fn copy_opts(
        &self,
        from: &ObjPath,
        to: &ObjPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.timed(Kind::Other, from, self.inner.copy_opts(from, to, options))
            .await
    }

    async fn rename_opts(
        &self,
        from: &ObjPath,
        to: &ObjPath,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.timed(Kind::Other, from, self.inner.rename_opts(from, to, options))
            .await
    }
}

/// Where the objects go: the simulated cloud or a real S3 server, both behind [`Latency`]
/// (which, with no delay, only counts a real server's requests).
pub struct Cloud {
    pub name: String,
    store: Arc<dyn ObjectStore>,
    clock: Arc<Clock>,
    /// The bucket and the prefix under which the runs store their objects.
    url: S3Url,
    /// A real server's URL (its settings, for more clients).
    real: Option<S3Url>,
    /// The simulated cloud's objects, each request sleeping the delay (intact's rows).
    sleeping: Option<Arc<dyn ObjectStore>>,
    rt: tokio::runtime::Runtime,
}

impl Cloud {
    /// The in-memory store with `delay` per request.
    pub fn simulated(delay: Duration) -> Result<Cloud> {
        let clock = Clock::new(delay);
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        Ok(Cloud {
            name: format!("simulated, +{} ms a request", delay.as_millis()),
            store: Arc::new(Latency::new(objects.clone(), clock.clone())),
            sleeping: Some(Arc::new(Latency::sleeping(objects, clock.clone()))),
            clock,
            url: S3Url::parse("s3://contiu/sim/")?,
            real: None,
            rt: runtime()?,
        })
    }

    /// The bucket of `url` (an `s3://` URL with its settings, as every command takes).
    pub fn s3(url: &str) -> Result<Cloud> {
        let mut url = S3Url::parse(url).map_err(|e| anyhow!("{e}"))?;
        let clock = Clock::new(Duration::ZERO);
        let client = S3Store::client(&url).map_err(|e| anyhow!("{e}"))?;
        url.prefix
            .push_str(&format!("contiu-{:016x}/", rand::random::<u64>()));
        Ok(Cloud {
            name: format!("S3 server ({url})"),
            store: Arc::new(Latency::new(client, clock.clone())),
            clock,
            real: Some(url.clone()),
            sleeping: None,
            url,
            rt: runtime()?,
        })
    }

    fn key(&self, run: &str, i: usize) -> ObjPath {
        ObjPath::from(format!("{}{run}/{i}", self.url.prefix))
    }

    fn put(&self, key: &ObjPath, obj: Vec<u8>) -> Result<()> {
        self.rt
            .block_on(self.store.put(key, PutPayload::from(obj)))
            .with_context(|| format!("PUT {key}"))?;
        Ok(())
    }

    fn get(&self, key: &ObjPath) -> Result<Bytes> {
        self.rt
            .block_on(async { self.store.get(key).await?.bytes().await })
            .with_context(|| format!("GET {key}"))
    }

    /// Deletes every object under `run` (after it, so that a real bucket is left empty).
    fn clear(&self, run: &str) -> Result<()> {
        let prefix = ObjPath::from(format!("{}{run}", self.url.prefix));
        self.rt.block_on(async {
            let names = self
                .store
                .list(Some(&prefix))
                .map_ok(|m| m.location)
                .boxed();
            self.store
                .delete_stream(names)
                .try_collect::<Vec<_>>()
                .await
        })?;
        Ok(())
    }

    /// `f`'s time with the delay the cloud added meanwhile, and the requests it made.
    fn timed<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<(T, f64, [u64; 5])> {
        let (d0, k0) = (self.clock.added(), self.clock.kinds());
        let t = Instant::now();
        let v = f()?;
        let real = t.elapsed();
        let secs = (real + (self.clock.added() - d0)).as_secs_f64();
        let k1 = self.clock.kinds();
        Ok((v, secs, std::array::from_fn(|i| k1[i] - k0[i])))
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// One workload's run: its total time (the paper's metric), the part of it spent in the
/// client's crypto, and its requests.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Measure {
    pub total_s: f64,
    pub crypto_s: Option<f64>,
    /// GET, PUT, LIST, DELETE (batches), other.
    pub requests: [u64; 5],
    pub reads: usize,
    pub writes: usize,
}

impl Measure {
    /// The run of `ops` (true: a read) that took `total_s`.
    fn of(ops: &[bool], total_s: f64, crypto_s: Option<f64>, requests: [u64; 5]) -> Measure {
        let reads = ops.iter().filter(|r| **r).count();
        Measure {
            total_s,
            crypto_s,
            requests,
            reads,
            writes: ops.len() - reads,
        }
    }
}

/// Stores `data` with `client` (not timed), then runs each workload in turn, checking
/// every read against `data`.
fn run_client(
    cloud: &Cloud,
    run: &str,
    client: &Client,
    data: &[Vec<u8>],
    workloads: &[Workload],
    seed: u64,
) -> Result<Vec<Measure>> {
    for (i, d) in data.iter().enumerate() {
        cloud.put(&cloud.key(run, i), client.seal(d)?)?;
    }
    let mut out = Vec::new();
    for &w in workloads {
        let ops = w.ops(data.len(), seed);
        let mut crypto = Duration::ZERO;
        let mut wrong = None;
        let ((), secs, requests) = cloud.timed(|| {
            for (i, &read) in ops.iter().enumerate() {
                let key = cloud.key(run, i);
                if read {
                    let obj = cloud.get(&key)?;
                    let t = Instant::now();
                    let plain = client
                        .open(&obj)
                        .with_context(|| format!("reading {key}"))?;
                    crypto += t.elapsed();
                    if plain != data[i] && wrong.is_none() {
                        wrong = Some(i);
                    }
                } else {
                    let t = Instant::now();
                    let obj = client.seal(&data[i])?;
                    crypto += t.elapsed();
                    cloud.put(&key, obj)?;
                }
            }
            Ok(())
        })?;
        if let Some(i) = wrong {
            bail!("{run}: file {i} read back other bytes");
        }
        out.push(Measure::of(
            &ops,
            secs,
            Some(crypto.as_secs_f64()),
            requests,
        ));
    }
    cloud.clear(run)?;
    Ok(out)
}

/// The trusted store of an intact row: a local state directory, its roots signed with
/// `signer` and published in the bucket.
fn signed_state(
    state: &Path,
    id: &str,
    signer: &Arc<Signer>,
    store: Arc<dyn UntrustedStore>,
) -> Result<Box<dyn TrustedStore>> {
    let local = LocalStateDir::new(state.to_path_buf(), id).map_err(|e| anyhow!("{e}"))?;
    Ok(Box::new(
        SignedAnchor::new(Box::new(local), Some(signer.clone()), None).published_in(store),
    ))
}

/// The same workloads (the data set, the workloads, the seed of their draws) through an
/// intact volume under `scheme` in the cloud.
fn run_intact(
    cloud: &Cloud,
    run: &str,
    scheme: SchemeId,
    signer: &Arc<Signer>,
    (data, workloads, seed): (&[Vec<u8>], &[Workload], u64),
    workdir: &Path,
) -> Result<Vec<Measure>> {
    let tmp = crate::bench::TempDir::new(workdir, "contiu")?;
    let state = tmp.0.join("state");
    let mut url = cloud.url.clone();
    url.prefix.push_str(&format!("{run}/"));
    let open_store = || -> Result<Arc<dyn UntrustedStore>> {
        // A real server's client is made again for each store: its connections belong to
        // the runtime that opened them, and each store runs its own.
        let objects: Arc<dyn ObjectStore> = match &cloud.real {
            Some(u) => Arc::new(Latency::new(
                S3Store::client(u).map_err(|e| anyhow!("{e}"))?,
                cloud.clock.clone(),
            )),
            None => cloud
                .sleeping
                .clone()
                .unwrap_or_else(|| cloud.store.clone()),
        };
        Ok(Arc::new(
            S3Store::with_store(url.clone(), objects).map_err(|e| anyhow!("{e}"))?,
        ))
    };
    let store = open_store()?;
    let vol = Volume::create(
        store.clone(),
        |id| {
            signed_state(&state, id, signer, store.clone())
                .map_err(|e| intact_core::Error::Config(e.to_string()))
        },
        PW,
        &CreateOptions {
            scheme,
            kdf: intact_core::crypto::KdfParams::TEST,
            ..CreateOptions::default()
        },
        &Options::default(),
    )
    .map_err(|e| anyhow!("{e}"))?;
    let e = |e: intact_core::Error| anyhow!("{e}");
    for (i, d) in data.iter().enumerate() {
        let ino = vol.create_file(&format!("/{i}"), None).map_err(e)?;
        for (k, c) in d.chunks(MIB).enumerate() {
            vol.write_ino(ino, (k * MIB) as u64, c).map_err(e)?;
        }
    }
    vol.sync().map_err(e)?;
    drop(vol);
    let id = intact_core::volume::read_config(store.as_ref())
        .map_err(e)?
        .volume_id;
    let mut out = Vec::new();
    let mut buf = vec![0u8; MIB];
    for &w in workloads {
        // Cold, as their client's every GET: a new store (no cached chunks or lengths)
        // and a new engine (no cached nodes or records).
        let store = open_store()?;
        let vol = Volume::open(
            store.clone(),
            signed_state(&state, &id, signer, store.clone())?,
            PW,
            &Options::default(),
        )
        .map_err(e)?;
        let ops = w.ops(data.len(), seed);
        let mut wrong = None;
        let ((), secs, requests) = cloud.timed(|| {
            for (i, &read) in ops.iter().enumerate() {
                let path = format!("/{i}");
                let ino = vol.stat(&path).map_err(e)?.ino;
                if read {
                    let mut off = 0;
                    while off < data[i].len() {
                        let n = vol.read_ino(ino, off as u64, &mut buf).map_err(e)?;
                        if n == 0 {
                            break;
                        }
                        if buf[..n] != data[i][off..off + n] && wrong.is_none() {
                            wrong = Some(i);
                        }
                        off += n;
                    }
                    if off != data[i].len() && wrong.is_none() {
                        wrong = Some(i);
                    }
                } else {
                    vol.truncate(&path, 0).map_err(e)?;
                    for (k, c) in data[i].chunks(MIB).enumerate() {
                        vol.write_ino(ino, (k * MIB) as u64, c).map_err(e)?;
                    }
                    vol.fsync(ino).map_err(e)?;
                }
            }
            Ok(())
        })?;
        if let Some(i) = wrong {
            bail!("{run}: /{i} read back other bytes");
        }
        out.push(Measure::of(&ops, secs, None, requests));
        drop(vol);
    }
    cloud.clear(run)?;
    Ok(out)
}

/// What the macro-benchmark is told to run.
pub struct Plan {
    pub scale: f64,
    pub min_files: usize,
    pub runs: u32,
    pub sets: Vec<DataSet>,
    pub workloads: Vec<Workload>,
    pub levels: Vec<Level>,
    pub intact: Vec<SchemeId>,
    /// Their six schemes too (or intact's rows only).
    pub theirs: bool,
    pub delay: Duration,
    pub s3: Option<String>,
    pub keys: PathBuf,
    pub workdir: PathBuf,
    pub seed: u64,
}

/// One cell of their figures: a scheme at a level, on a set under a workload, in a cloud.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub cloud: String,
    pub set: &'static str,
    pub workload: &'static str,
    pub level: &'static str,
    pub scheme: String,
    /// Total time of every run, s.
    pub totals: Vec<f64>,
    pub total_s: Range,
    /// The client's own crypto (encrypt, hash, sign; verify, hash, decrypt) in it, s
    /// (their schemes only).
    pub crypto_s: Option<Range>,
    /// Requests made in one run: GET, PUT, LIST, DELETE (batches), other.
    pub requests: [u64; 5],
    pub reads: usize,
    pub writes: usize,
}

/// One data set as run.
#[derive(Debug, Clone, Serialize)]
pub struct SetInfo {
    pub set: &'static str,
    pub files: usize,
    pub bytes: u64,
    pub mean_bytes: u64,
    pub paper_files: usize,
}

/// A claim of §4.2–4.3, what we measured, and a verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Claim {
    pub claim: &'static str,
    pub ours: String,
    pub verdict: &'static str,
}

/// Everything the macro-benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct MacroReport {
    pub machine: String,
    pub scale: f64,
    pub min_files: usize,
    pub runs: u32,
    pub delay_ms: u64,
    pub sets: Vec<SetInfo>,
    pub rows: Vec<Row>,
    pub claims: Vec<Claim>,
}

/// The steps [`measure`] reports to its progress bar.
pub fn steps(p: &Plan) -> u64 {
    let clouds = 1 + u64::from(p.s3.is_some());
    clouds
        * u64::from(p.runs.max(1))
        * p.sets.len() as u64
        * p.levels.len() as u64
        * (if p.theirs { SCHEMES.len() } else { 0 } + p.intact.len()) as u64
}

/// Runs the macro-benchmark.
pub fn measure(p: &Plan, pb: &indicatif::ProgressBar) -> Result<MacroReport> {
    let keys = Keys::new(p.keys.clone())?;
    let mut clouds = vec![Cloud::simulated(p.delay)?];
    if let Some(u) = &p.s3 {
        clouds.push(Cloud::s3(u)?);
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut sets = Vec::new();
    for &set in &p.sets {
        let sizes = set.sizes(p.scale, p.min_files, p.seed);
        let data: Vec<Vec<u8>> = {
            let mut rng = rand::rngs::StdRng::seed_from_u64(p.seed);
            sizes
                .iter()
                .map(|&n| {
                    let mut v = vec![0u8; n];
                    rng.fill_bytes(&mut v);
                    v
                })
                .collect()
        };
        let bytes: u64 = sizes.iter().map(|&s| s as u64).sum();
        sets.push(SetInfo {
            set: set.name(),
            files: sizes.len(),
            bytes,
            mean_bytes: bytes / sizes.len() as u64,
            paper_files: set.files(),
        });
        for cloud in &clouds {
            for &level in &p.levels {
                // Every run of every scheme, so a row's runs are spread over the time.
                let mut cells: Vec<(String, Vec<Measure>)> = Vec::new();
                for r in 0..p.runs.max(1) {
                    let theirs = if p.theirs { &SCHEMES[..] } else { &[] };
                    for (k, &(mode, sig)) in theirs.iter().enumerate() {
                        let client = Client::new(mode, level, keys.signer(sig, level)?)?;
                        let run = format!("{}-{}-{}-{r}", set.name(), level.name(), k);
                        let m = run_client(cloud, &run, &client, &data, &p.workloads, p.seed)
                            .with_context(|| scheme_name(mode, sig))?;
                        push_run(&mut cells, scheme_name(mode, sig), m);
                        pb.inc(1);
                    }
                    let ecc = keys.signer(Sig::Ecc, level)?;
                    for &s in &p.intact {
                        let run =
                            format!("{}-{}-intact-{}-{r}", set.name(), level.name(), s.name());
                        let m = run_intact(
                            cloud,
                            &run,
                            s,
                            &ecc,
                            (&data, &p.workloads, p.seed),
                            &p.workdir,
                        )
                        .with_context(|| format!("intact {}", s.name()))?;
                        push_run(&mut cells, format!("intact {}", s.name()), m);
                        pb.inc(1);
                    }
                }
                for (scheme, runs) in cells {
                    for (wi, &w) in p.workloads.iter().enumerate() {
                        let ms: Vec<Measure> = runs
                            .iter()
                            .skip(wi)
                            .step_by(p.workloads.len())
                            .copied()
                            .collect();
                        let totals: Vec<f64> = ms.iter().map(|m| m.total_s).collect();
                        let crypto: Vec<f64> = ms.iter().filter_map(|m| m.crypto_s).collect();
                        rows.push(Row {
                            cloud: cloud.name.clone(),
                            set: set.name(),
                            workload: w.name(),
                            level: level.name(),
                            scheme: scheme.clone(),
                            total_s: Range::of(&totals),
                            totals,
                            crypto_s: (!crypto.is_empty()).then(|| Range::of(&crypto)),
                            requests: ms[0].requests,
                            reads: ms[0].reads,
                            writes: ms[0].writes,
                        });
                    }
                }
            }
        }
    }
    let simulated = clouds[0].name.clone();
    let claims = judge(&rows, &simulated);
    Ok(MacroReport {
        machine: crate::bench::machine(),
        scale: p.scale,
        min_files: p.min_files,
        runs: p.runs.max(1),
        delay_ms: p.delay.as_millis() as u64,
        sets,
        rows,
        claims,
    })
}

/// Appends one run's measures (one per workload, in order) to the scheme's cell.
fn push_run(cells: &mut Vec<(String, Vec<Measure>)>, scheme: String, m: Vec<Measure>) {
    match cells.iter_mut().find(|(s, _)| *s == scheme) {
        Some((_, v)) => v.extend(m),
        None => cells.push((scheme, m)),
    }
}

/// The mean total of `scheme` at (`set`, `workload`, `level`) in `cloud`.
fn mean_of(
    rows: &[Row],
    cloud: &str,
    set: &str,
    w: &str,
    level: &str,
    scheme: &str,
) -> Option<f64> {
    rows.iter()
        .find(|r| {
            r.cloud == cloud
                && r.set == set
                && r.workload == w
                && r.level == level
                && r.scheme == scheme
        })
        .map(|r| r.totals.iter().sum::<f64>() / r.totals.len().max(1) as f64)
}

/// Their claims of §4.2 and §4.3, judged on the simulated cloud's rows (theirs was
/// simulated too).
pub fn judge(rows: &[Row], cloud: &str) -> Vec<Claim> {
    let m = |set: DataSet, w: Workload, l: Level, s: &str| {
        mean_of(rows, cloud, set.name(), w.name(), l.name(), s)
    };
    let six = |set: DataSet, w: Workload, l: Level| -> Option<Vec<(String, f64)>> {
        SCHEMES
            .iter()
            .map(|&(mode, sig)| {
                let n = scheme_name(mode, sig);
                m(set, w, l, &n).map(|v| (n, v))
            })
            .collect()
    };
    let none = |claim| Claim {
        claim,
        ours: "not measured in this run".into(),
        verdict: "not measured",
    };
    let mut out = Vec::new();
    // 1. Fig. 5: RSA grows with the strength on the write workloads.
    let c1 = "Fig. 5 (mostly-small): RSA schemes take longer as the strength grows on mostly-write and write-heavy";
    let grows: Option<Vec<(String, f64, f64)>> = [Workload::MostlyWrite, Workload::WriteHeavy]
        .iter()
        .flat_map(|&w| [Mode::Cbc, Mode::Ctr, Mode::Gcm].map(move |mode| (w, mode)))
        .map(|(w, mode)| {
            let n = scheme_name(mode, Sig::Rsa);
            let lo = m(DataSet::MostlySmall, w, Level::Low, &n)?;
            let me = m(DataSet::MostlySmall, w, Level::Medium, &n)?;
            let hi = m(DataSet::MostlySmall, w, Level::High, &n)?;
            Some((
                format!("{n} {}", w.name()),
                lo,
                if lo < me && me < hi { hi / lo } else { 0.0 },
            ))
        })
        .collect();
    out.push(match grows {
        None => none(c1),
        Some(v) => {
            let ok = v.iter().all(|(_, _, r)| *r > 1.0);
            let worst = v.iter().map(|x| x.2).fold(f64::INFINITY, f64::min);
            Claim {
                claim: c1,
                ours: format!(
                    "high ÷ low, smallest over the 3 modes and 2 workloads: {worst:.2}× (0 where medium ≥ high)"
                ),
                verdict: if ok { "confirmed" } else { "refuted" },
            }
        }
    });
    // 2. Fig. 5: no such trend when reads dominate.
    let c2 = "Fig. 5 (mostly-small): on read-heavy and read-only, RSA shows no such growth (verification is cheap)";
    let flat: Option<Vec<f64>> = [Workload::ReadHeavy, Workload::ReadOnly]
        .iter()
        .flat_map(|&w| [Mode::Cbc, Mode::Ctr, Mode::Gcm].map(move |mode| (w, mode)))
        .map(|(w, mode)| {
            let n = scheme_name(mode, Sig::Rsa);
            Some(
                m(DataSet::MostlySmall, w, Level::High, &n)?
                    / m(DataSet::MostlySmall, w, Level::Low, &n)?,
            )
        })
        .collect();
    out.push(match flat {
        None => none(c2),
        Some(v) => {
            let worst = v.iter().copied().fold(0.0, f64::max);
            Claim {
                claim: c2,
                ours: format!("high ÷ low, largest over the 3 modes and 2 workloads: {worst:.2}×"),
                verdict: if worst < 1.25 { "confirmed" } else { "refuted" },
            }
        }
    });
    // 3. and 8.: CTR-ECC performs well everywhere; best in almost all scenarios.
    let mut cells = 0;
    let mut near = 0;
    let mut best = 0;
    let mut worst_small = 0.0f64;
    for set in DataSet::ALL {
        for w in Workload::ALL {
            for l in Level::ALL {
                if let Some(v) = six(set, w, l) {
                    let min = v.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
                    let ce = v
                        .iter()
                        .find(|x| x.0 == "CTR-ECC")
                        .map_or(f64::NAN, |x| x.1);
                    cells += 1;
                    if ce <= min * 1.02 {
                        near += 1;
                    }
                    if ce <= min {
                        best += 1;
                    }
                    if set == DataSet::MostlySmall {
                        worst_small = worst_small.max(ce / min);
                    }
                }
            }
        }
    }
    let c3 = "Fig. 5: CTR-ECC always performs well, whatever the workload or strength";
    out.push(if worst_small == 0.0 {
        none(c3)
    } else {
        Claim {
            claim: c3,
            ours: format!(
                "CTR-ECC ÷ the fastest of the six, worst cell of mostly-small: {worst_small:.3}×"
            ),
            verdict: if worst_small <= 1.05 {
                "confirmed"
            } else {
                "refuted"
            },
        }
    });
    // 4. Fig. 6: the spread shrinks as reads dominate (mostly-large).
    let c4 = "Fig. 6 (mostly-large): the differences between the schemes shrink as reads dominate";
    let spread: Option<Vec<(Level, Vec<f64>)>> = Level::ALL
        .iter()
        .filter(|&&l| six(DataSet::MostlyLarge, Workload::MostlyWrite, l).is_some())
        .map(|&l| {
            let v: Option<Vec<f64>> = Workload::ALL
                .iter()
                .map(|&w| {
                    let v = six(DataSet::MostlyLarge, w, l)?;
                    let max = v.iter().map(|x| x.1).fold(0.0, f64::max);
                    let min = v.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
                    Some(max / min)
                })
                .collect();
            v.map(|v| (l, v))
        })
        .collect();
    out.push(match spread {
        Some(v) if !v.is_empty() => {
            let ok = v.iter().all(|(_, s)| s.first() > s.last());
            Claim {
                claim: c4,
                ours: v
                    .iter()
                    .map(|(l, s)| {
                        format!(
                            "{}: slowest ÷ fastest {}",
                            l.name(),
                            s.iter()
                                .map(|x| format!("{x:.2}"))
                                .collect::<Vec<_>>()
                                .join(" → ")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                verdict: if ok { "confirmed" } else { "refuted" },
            }
        }
        _ => none(c4),
    });
    // 5. Fig. 6: RSA beats ECC by an insignificant 2 % read-only.
    let c5 = "Fig. 6 (mostly-large): RSA outperforms ECC by an insignificant 2 % on read-only";
    let ratios: Vec<f64> = Level::ALL
        .iter()
        .flat_map(|&l| [Mode::Cbc, Mode::Ctr, Mode::Gcm].map(move |mode| (l, mode)))
        .filter_map(|(l, mode)| {
            Some(
                m(
                    DataSet::MostlyLarge,
                    Workload::ReadOnly,
                    l,
                    &scheme_name(mode, Sig::Ecc),
                )? / m(
                    DataSet::MostlyLarge,
                    Workload::ReadOnly,
                    l,
                    &scheme_name(mode, Sig::Rsa),
                )?,
            )
        })
        .collect();
    out.push(if ratios.is_empty() {
        none(c5)
    } else {
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        Claim {
            claim: c5,
            ours: format!("ECC ÷ RSA, mean over modes and levels: {mean:.3}"),
            verdict: if mean > 1.0 && mean < 1.05 {
                "confirmed"
            } else if (mean - 1.0).abs() < 0.05 {
                "confirmed: insignificant, other sign"
            } else {
                "refuted"
            },
        }
    });
    // 6. Fig. 7: RSA worse on the write workloads (mixed).
    let c6 = "Fig. 7 (mixed): RSA performs worse than ECC on mostly-write and write-heavy";
    let rsa_ecc: Vec<(Level, f64)> = Level::ALL
        .iter()
        .flat_map(|&l| [Workload::MostlyWrite, Workload::WriteHeavy].map(move |w| (l, w)))
        .flat_map(|(l, w)| [Mode::Cbc, Mode::Ctr, Mode::Gcm].map(move |mode| (l, w, mode)))
        .filter_map(|(l, w, mode)| {
            Some((
                l,
                m(DataSet::Mixed, w, l, &scheme_name(mode, Sig::Rsa))?
                    / m(DataSet::Mixed, w, l, &scheme_name(mode, Sig::Ecc))?,
            ))
        })
        .collect();
    out.push(if rsa_ecc.is_empty() {
        none(c6)
    } else {
        let per: Vec<String> = Level::ALL
            .iter()
            .filter_map(|&l| {
                let v: Vec<f64> = rsa_ecc.iter().filter(|x| x.0 == l).map(|x| x.1).collect();
                (!v.is_empty()).then(|| {
                    format!(
                        "{}: {:.3}",
                        l.name(),
                        v.iter().copied().fold(f64::INFINITY, f64::min)
                    )
                })
            })
            .collect();
        let all = rsa_ecc.iter().all(|x| x.1 > 1.0);
        let some = rsa_ecc.iter().any(|x| x.1 > 1.0);
        Claim {
            claim: c6,
            ours: format!(
                "RSA ÷ ECC, smallest over modes and the two workloads, {}",
                per.join(", ")
            ),
            verdict: if all {
                "confirmed"
            } else if some {
                "confirmed at some levels only"
            } else {
                "refuted"
            },
        }
    });
    // 7. §4.3: CTR-ECC best in almost all scenarios.
    let c7 = "§4.3: CTR-ECC performs better in almost all usage scenarios";
    out.push(if cells == 0 {
        none(c7)
    } else {
        Claim {
            claim: c7,
            ours: format!(
                "fastest of the six in {best} of {cells} cells, within 2 % of the fastest in {near}"
            ),
            verdict: if near * 10 >= cells * 8 {
                "confirmed"
            } else {
                "refuted"
            },
        }
    });
    out
}

/// The report as Markdown: a table per cloud and set (rows: scheme at a level; columns:
/// the workloads; total seconds, the range over runs), the sets, and the claims.
pub fn markdown(r: &MacroReport) -> String {
    let mut s = format!(
        "Contiu et al. (2017) §4.2, macro-benchmark, rerun on {} ({} runs, ranges over them; data sets at {} of their files, at least {} each; simulated cloud: +{} ms a request on a virtual clock).\n\n| set | files | bytes | mean bytes | their files |\n|---|---:|---:|---:|---:|\n",
        r.machine, r.runs, r.scale, r.min_files, r.delay_ms
    );
    for x in &r.sets {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            x.set, x.files, x.bytes, x.mean_bytes, x.paper_files
        ));
    }
    let mut clouds: Vec<&str> = Vec::new();
    let mut workloads: Vec<&str> = Vec::new();
    for row in &r.rows {
        if !clouds.contains(&row.cloud.as_str()) {
            clouds.push(&row.cloud);
        }
        if !workloads.contains(&row.workload) {
            workloads.push(row.workload);
        }
    }
    for cloud in &clouds {
        for set in &r.sets {
            let fig = DataSet::ALL
                .iter()
                .find(|d| d.name() == set.set)
                .map_or("", |d| d.figure());
            s.push_str(&format!(
                "\n{fig}, {} — {cloud}: total seconds (requests in each: GET/PUT/LIST/DELETE)\n\n| level | scheme | {} | requests |\n|---|---|{}---:|\n",
                set.set,
                workloads.join(" | "),
                "---:|".repeat(workloads.len())
            ));
            let mut keys: Vec<(&str, &str)> = Vec::new();
            for row in r
                .rows
                .iter()
                .filter(|x| x.cloud == *cloud && x.set == set.set)
            {
                if !keys.contains(&(row.level, row.scheme.as_str())) {
                    keys.push((row.level, &row.scheme));
                }
            }
            for (level, scheme) in keys {
                let cells: Vec<&Row> = r
                    .rows
                    .iter()
                    .filter(|x| {
                        x.cloud == *cloud
                            && x.set == set.set
                            && x.level == level
                            && x.scheme == scheme
                    })
                    .collect();
                s.push_str(&format!(
                    "| {level} | {scheme} | {} | {} |\n",
                    cells
                        .iter()
                        .map(|c| c.total_s.show(2))
                        .collect::<Vec<_>>()
                        .join(" | "),
                    cells
                        .iter()
                        .map(|c| show_requests(&c.requests))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    s.push_str("\nTheir claims (judged on the simulated cloud, as theirs was):\n\n| claim | ours | verdict |\n|---|---|---|\n");
    for c in &r.claims {
        s.push_str(&format!("| {} | {} | {} |\n", c.claim, c.ours, c.verdict));
    }
    s
}

/// Requests as `G/P/L/D` (GET, PUT, LIST, DELETE), with other kinds added if any.
fn show_requests(k: &[u64; 5]) -> String {
    let mut s = format!("{}/{}/{}/{}", k[0], k[1], k[2], k[3]);
    if k[4] > 0 {
        s.push_str(&format!("+{}", k[4]));
    }
    s
}

/// Figures like theirs: one per cloud, set and level, the workloads as groups and the
/// schemes as bars (total seconds, whiskers over the runs).
pub fn plots(r: &MacroReport, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    let mut seen: Vec<(String, &str, &str)> = Vec::new();
    for row in &r.rows {
        let k = (row.cloud.clone(), row.set, row.level);
        if seen.contains(&k) {
            continue;
        }
        seen.push(k);
        let bars: Vec<(&str, &str, Vec<f64>)> = r
            .rows
            .iter()
            .filter(|x| x.cloud == row.cloud && x.set == row.set && x.level == row.level)
            .map(|x| (x.workload, x.scheme.as_str(), x.totals.clone()))
            .collect();
        let tag = if row.cloud.starts_with("simulated") {
            "sim"
        } else {
            "s3"
        };
        let path = dir.join(format!("contiu-{tag}-{}-{}.svg", row.set, row.level));
        crate::plot::grouped_bars(
            &path,
            &format!(
                "{} ({}), {} strength, {}",
                row.set,
                DataSet::ALL
                    .iter()
                    .find(|d| d.name() == row.set)
                    .map_or("", |d| d.figure()),
                row.level,
                if tag == "sim" {
                    "simulated cloud"
                } else {
                    "S3 server"
                }
            ),
            "total time (s)",
            &crate::plot::bars(&bars),
        )?;
        out.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_sets_have_their_tables_sizes() {
        for set in DataSet::ALL {
            let v = set.sizes(1.0, 0, 7);
            assert_eq!(v.len(), set.files());
            assert!(v.iter().all(|&s| (MIN_SIZE..=MAX_SIZE).contains(&s)));
            let total: usize = v.iter().sum();
            let gb = total as f64 / (1u64 << 30) as f64;
            // Table 2: 0.5, 3.1 and 1.2 GB.
            let want = match set {
                DataSet::MostlySmall => 0.5,
                DataSet::Mixed => 3.1,
                DataSet::MostlyLarge => 1.2,
            };
            assert!((gb / want - 1.0).abs() < 0.15, "{set:?}: {gb:.2} GiB");
            assert_eq!(set.sizes(1.0, 0, 7), v, "seeded");
        }
        // Mostly small: the median well below the mean; mostly large: above it.
        let mut small = DataSet::MostlySmall.sizes(1.0, 0, 1);
        small.sort();
        assert!(small[small.len() / 2] < 256 * KIB);
        let mut large = DataSet::MostlyLarge.sizes(1.0, 0, 1);
        large.sort();
        assert!(large[large.len() / 2] > 60 * MIB);
        assert_eq!(DataSet::MostlySmall.sizes(0.1, 10, 1).len(), 200);
        assert_eq!(DataSet::MostlyLarge.sizes(0.01, 0, 1).len(), 1);
        assert_eq!(DataSet::MostlyLarge.sizes(0.01, 10, 1).len(), 10);
        assert_eq!(
            DataSet::MostlyLarge.sizes(0.01, 50, 1).len(),
            20,
            "all of them"
        );
    }

    #[test]
    fn the_workloads_read_their_share() {
        for w in Workload::ALL {
            let ops = w.ops(20_000, 3);
            let share = ops.iter().filter(|r| **r).count() as f64 / ops.len() as f64;
            assert!((share - w.reads()).abs() < 0.02, "{w:?}: {share}");
            assert_eq!(w.ops(20_000, 3), ops);
        }
        assert!(Workload::ReadOnly.ops(100, 1).iter().all(|r| *r));
    }

    fn ecdsa() -> Arc<Signer> {
        Arc::new(Signer::from_pkcs8(&Signer::generate(KeyKind::EcdsaP256).unwrap()).unwrap())
    }

    #[test]
    fn every_scheme_opens_what_it_sealed_and_nothing_else() {
        let signer = ecdsa();
        for mode in [Mode::Cbc, Mode::Ctr, Mode::Gcm] {
            for level in Level::ALL {
                let c = Client::new(mode, level, signer.clone()).unwrap();
                for n in [0usize, 1, 15, 16, 17, 4096, 100_000] {
                    let data: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
                    let obj = c.seal(&data).unwrap();
                    assert_eq!(c.open(&obj).unwrap(), data, "{mode:?} {level:?} {n}");
                    assert_ne!(c.seal(&data).unwrap(), obj, "a fresh IV each time");
                    if n >= 16 {
                        assert!(
                            !obj.windows(16).any(|w| w == &data[..16]),
                            "no plaintext in the object"
                        );
                    }
                    // Any flipped byte of the body, or of the signature, is refused.
                    for at in [obj.len() - 1, obj.len() / 2, 3] {
                        let mut bad = obj.clone();
                        bad[at] ^= 1;
                        assert!(c.open(&bad).is_err(), "{mode:?} {n} byte {at}");
                    }
                    assert!(c.open(&obj[..obj.len() - 1]).is_err());
                }
            }
        }
        // Another key's signature is refused.
        let a = Client::new(Mode::Ctr, Level::Low, signer).unwrap();
        let b = Client::new(Mode::Ctr, Level::Low, ecdsa()).unwrap();
        assert!(a.open(&b.seal(b"x").unwrap()).is_err());
    }

    #[test]
    fn requests_one_after_another_each_add_the_delay_and_together_once() {
        let clock = Clock::new(Duration::from_millis(50));
        let store = Latency::new(Arc::new(InMemory::new()), clock.clone());
        let rt = runtime().unwrap();
        let p = |i: usize| ObjPath::from(format!("x/{i}"));
        rt.block_on(async {
            for i in 0..3 {
                store
                    .put(&p(i), PutPayload::from(vec![1u8; 10]))
                    .await
                    .unwrap();
            }
        });
        assert_eq!(clock.requests(), 3);
        assert_eq!(clock.added(), Duration::from_millis(150));
        rt.block_on(async {
            let gets = (0..3).map(|i| {
                let (s, k) = (&store, p(i));
                async move { s.get(&k).await.unwrap().bytes().await.unwrap() }
            });
            futures_util::future::join_all(gets).await
        });
        assert_eq!(clock.requests(), 6);
        assert_eq!(
            clock.added(),
            Duration::from_millis(200),
            "three at once: one delay"
        );
        let listed = rt
            .block_on(store.list(None).try_collect::<Vec<_>>())
            .unwrap();
        assert_eq!(listed.len(), 3);
        assert_eq!(clock.added(), Duration::from_millis(250));
    }

    #[test]
    fn a_client_run_makes_one_request_an_operation_and_reads_what_it_wrote() {
        let cloud = Cloud::simulated(Duration::from_millis(50)).unwrap();
        let c = Client::new(Mode::Gcm, Level::Low, ecdsa()).unwrap();
        let data: Vec<Vec<u8>> = (0..40).map(|i| vec![i as u8; 1000 + i * 37]).collect();
        let m = run_client(&cloud, "t", &c, &data, &Workload::ALL, 5).unwrap();
        assert_eq!(m.len(), 4);
        for (w, x) in Workload::ALL.iter().zip(&m) {
            assert_eq!(
                x.requests,
                [x.reads as u64, x.writes as u64, 0, 0, 0],
                "{w:?}"
            );
            assert_eq!(x.reads + x.writes, 40);
            // Forty requests one after another: at least 2 s of delay.
            assert!(x.total_s >= 2.0 && x.total_s < 10.0, "{w:?}: {}", x.total_s);
            assert!(x.crypto_s.unwrap() > 0.0);
        }
        assert_eq!(m[3].writes, 0);
        // The run's objects are gone afterwards.
        let left = cloud
            .rt
            .block_on(cloud.store.list(None).try_collect::<Vec<_>>())
            .unwrap();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn an_intact_run_reads_what_it_wrote_and_pays_for_its_round_trips() {
        let cloud = Cloud::simulated(Duration::from_millis(50)).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let data: Vec<Vec<u8>> = (0..6)
            .map(|i| vec![i as u8 + 1; 5000 + i * 100_000])
            .collect();
        let m = run_intact(
            &cloud,
            "i",
            SchemeId::MtEintGcm,
            &ecdsa(),
            (&data, &[Workload::WriteHeavy, Workload::ReadOnly], 5),
            tmp.path(),
        )
        .unwrap();
        for x in &m {
            assert!(
                x.requests.iter().sum::<u64>() > 0 && x.total_s >= 0.05,
                "{x:?}"
            );
        }
        // A write is durable and sealed at its fsync: at least one request of its own.
        assert!(m[0].requests[1] >= m[0].writes as u64, "{:?}", m[0]);
        // Cold reads: every file read fetched at least one object.
        assert!(m[1].requests[0] >= m[1].reads as u64, "{:?}", m[1]);
        assert!(m[0].total_s >= 0.05 * m[0].writes as f64);
        let left = cloud
            .rt
            .block_on(cloud.store.list(None).try_collect::<Vec<_>>())
            .unwrap();
        assert!(left.is_empty(), "{left:?}");
    }

    fn row(set: DataSet, w: Workload, l: Level, scheme: &str, t: f64) -> Row {
        Row {
            cloud: "sim".into(),
            set: set.name(),
            workload: w.name(),
            level: l.name(),
            scheme: scheme.into(),
            totals: vec![t],
            total_s: Range { min: t, max: t },
            crypto_s: None,
            requests: [0; 5],
            reads: 0,
            writes: 0,
        }
    }

    /// Rows as their figures describe them (`paper`), or with RSA flat and ECC slower.
    fn rows(paper: bool) -> Vec<Row> {
        let mut v = Vec::new();
        for set in DataSet::ALL {
            for w in Workload::ALL {
                for l in Level::ALL {
                    for (mode, sig) in SCHEMES {
                        let writes = 1.0 - w.reads();
                        let li = l as usize as f64;
                        let sign = match (sig, paper) {
                            (Sig::Rsa, true) => 10.0 * (1.0 + 5.0 * li) * writes,
                            (Sig::Rsa, false) => 1.0 * writes,
                            (Sig::Ecc, true) => 1.0 * writes,
                            (Sig::Ecc, false) => 10.0 * writes,
                        };
                        let verify = if sig == Sig::Ecc && paper { 0.2 } else { 0.0 };
                        let cbc = if mode == Mode::Cbc { 3.0 * writes } else { 0.0 };
                        let ctr = if mode == Mode::Ctr || !paper {
                            0.0
                        } else {
                            0.1
                        };
                        v.push(row(
                            set,
                            w,
                            l,
                            &scheme_name(mode, sig),
                            100.0 + sign + verify + cbc + ctr,
                        ));
                    }
                }
            }
        }
        v
    }

    #[test]
    fn the_claims_are_judged_both_ways() {
        let yes = judge(&rows(true), "sim");
        assert_eq!(yes.len(), 7);
        for c in &yes {
            assert!(c.verdict.starts_with("confirmed"), "{c:?}");
        }
        let no = judge(&rows(false), "sim");
        let v: Vec<&str> = no.iter().map(|c| c.verdict).collect();
        assert_eq!(v[0], "refuted", "{no:?}");
        assert_eq!(v[2], "refuted", "{no:?}");
        assert_eq!(v[5], "refuted", "{no:?}");
        assert_eq!(v[6], "refuted", "{no:?}");
        let nothing = judge(&[], "sim");
        assert!(nothing.iter().all(|c| c.verdict == "not measured"));
    }
}
