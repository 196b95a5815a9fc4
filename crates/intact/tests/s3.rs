//! Volumes in an S3-compatible bucket (issue 9), against a real S3 server started by each
//! test: Garage (a distributed object store; scripts/test.sh installs it with `cargo
//! install garage`), one node on the loopback interface. The CLI and the mount work on
//! `s3://BUCKET/PREFIX` as on a directory; tampering with or rolling back an object in
//! the bucket is caught; a store that goes away is a clear error that loses nothing
//! sealed; a store that never answers or refuses the key is reported at once.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::garage::{rt, Garage, BUCKET};
use common::vol::{INTEGRITY, IO, PW};
use intact_core::attacks::{self, Bed, Content, Verdict};
use intact_core::format::SchemeId;
use intact_core::store::{LocalStateDir, S3Store, S3Url, TrustedStore, UntrustedStore};
use intact_core::{CreateOptions, Options, Volume};
use object_store::aws::AmazonS3;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::sync::Arc;

/// The keys under `prefix` in the bucket, with their sizes.
fn keys(s: &AmazonS3, prefix: &str) -> Vec<(String, u64)> {
    use futures_util::TryStreamExt;
    let mut v: Vec<(String, u64)> = rt()
        .block_on(s.list(Some(&Key::from(prefix))).try_collect::<Vec<_>>())
        .unwrap()
        .into_iter()
        .map(|m| (m.location.to_string(), m.size))
        .collect();
    v.sort();
    v
}

fn get(s: &AmazonS3, key: &str) -> Vec<u8> {
    rt().block_on(async {
        s.get(&Key::from(key))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec()
    })
}

fn put(s: &AmazonS3, key: &str, data: Vec<u8>) {
    rt().block_on(s.put(&Key::from(key), PutPayload::from(data)))
        .unwrap();
}

/// A temporary file holding `data`.
fn src(dir: &Path, name: &str, data: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p.to_str().unwrap().to_string()
}

/// Whether `intact fsck` passes and says so.
fn fsck_clean(g: &Garage, state: &Path, url: &str) -> bool {
    let r = g.intact(state, url, &["fsck"]).ok();
    format!("{}{}", r.stdout, r.stderr).contains("no integrity failures")
}

fn init(g: &Garage, state: &Path, url: &str) {
    g.intact(
        state,
        url,
        &["init", url, "--kdf-memory", "1024", "--kdf-passes", "1"],
    )
    .ok();
}

/// Every CLI command on a volume in the bucket, the objects it keeps there (chunks of at
/// most 1 MiB), and a second prefix of the same bucket as another volume.
#[test]
fn the_cli_works_on_a_volume_in_a_bucket() {
    let Some(g) = Garage::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let url = g.url("home/vol");
    init(&g, &state, &url);
    let big = common::pattern(1, 3 << 20 | 123);
    let f = src(tmp.path(), "big", &big);
    g.intact(&state, &url, &["put", &f, "/big.bin"]).ok();
    g.intact(&state, &url, &["mkdir", "/d"]).ok();
    let s = src(tmp.path(), "small", b"hello, bucket");
    g.intact(&state, &url, &["put", &s, "/d/small.txt"]).ok();
    let out = tmp.path().join("out");
    g.intact(&state, &url, &["get", "/big.bin", out.to_str().unwrap()])
        .ok();
    assert_eq!(std::fs::read(&out).unwrap(), big);
    assert_eq!(
        g.intact(&state, &url, &["cat", "/d/small.txt"]).ok().stdout,
        "hello, bucket"
    );
    let ls = g.intact(&state, &url, &["ls", "-l", "/"]).ok().stdout;
    assert!(
        ls.contains("big.bin") && ls.contains(&(3usize << 20 | 123).to_string()),
        "{ls}"
    );
    assert!(fsck_clean(&g, &state, &url));
    // Everything lies under the prefix, as chunk objects of at most 1 MiB.
    let client = g.client();
    let all = keys(&client, "");
    assert!(!all.is_empty());
    for (k, size) in &all {
        assert!(k.starts_with("home/vol/"), "{k} outside the prefix");
        assert!(*size <= 1 << 20, "{k}: {size} bytes");
        assert!(
            k.rsplit_once('@').is_some_and(|(_, i)| i.len() == 16),
            "{k}"
        );
    }
    // The file's data is in the bucket encrypted: no 64-byte run of it appears.
    let stored: Vec<u8> = all.iter().flat_map(|(k, _)| get(&client, k)).collect();
    assert!(!stored.windows(64).any(|w| w == &big[4096..4160]));
    // Another prefix is another volume.
    let other = g.url("home/other");
    let state2 = tmp.path().join("state2");
    init(&g, &state2, &other);
    let ls = g.intact(&state2, &other, &["ls", "/"]).ok().stdout;
    assert!(!ls.contains("big.bin"), "{ls}");
    // init refuses a prefix that holds a volume, or lies inside one.
    let again = g.intact(&state, &url, &["init", &url, "--kdf-memory", "1024"]);
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("not empty"), "{}", again.stderr);
    let inner = g.url("home/vol/inner");
    let r = g.intact(&state, &inner, &["init", &inner, "--kdf-memory", "1024"]);
    assert!(
        r.stderr.contains("cannot lie inside another"),
        "{}",
        r.stderr
    );
}

/// A byte flipped in an object of the bucket is caught; so is the whole prefix put back
/// as it was before a change (a rollback of the volume): reads fail with the integrity
/// exit code, and work again once the bucket holds what was sealed.
#[test]
fn tampering_and_rollback_in_the_bucket_are_caught() {
    let Some(g) = Garage::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let url = g.url("v");
    init(&g, &state, &url);
    let client = g.client();
    let snapshot = |c: &AmazonS3| -> Vec<(String, Vec<u8>)> {
        keys(c, "v")
            .into_iter()
            .map(|(k, _)| {
                let b = get(c, &k);
                (k, b)
            })
            .collect()
    };
    let f = src(tmp.path(), "a", &common::pattern(2, 20_000));
    g.intact(&state, &url, &["put", &f, "/a"]).ok();
    let old = snapshot(&client);
    let new = common::pattern(3, 20_000);
    let f = src(tmp.path(), "b", &new);
    g.intact(&state, &url, &["put", &f, "/a"]).ok();
    let o = tmp.path().join("o");
    g.intact(&state, &url, &["get", "/a", o.to_str().unwrap()])
        .ok();
    assert_eq!(std::fs::read(&o).unwrap(), new);
    let current = snapshot(&client);
    let restore = |to: &[(String, Vec<u8>)]| {
        for (k, _) in keys(&client, "v") {
            if !to.iter().any(|(t, _)| *t == k) {
                rt().block_on(client.delete(&Key::from(k.as_str())))
                    .unwrap();
            }
        }
        for (k, b) in to {
            put(&client, k, b.clone());
        }
    };
    // Rollback: every object of the volume as it was one seal ago.
    restore(&old);
    let r = g.intact(&state, &url, &["cat", "/a"]);
    assert_eq!(r.code, INTEGRITY, "rollback not caught: {}", r.stderr);
    restore(&current);
    // A flipped byte in the file's data.
    let data = current
        .iter()
        .find(|(k, _)| k.contains(".d@") && !old.iter().any(|(o, _)| o == k))
        .expect("the new file's data chunk");
    let mut bad = data.1.clone();
    bad[100] ^= 1;
    put(&client, &data.0, bad);
    let r = g.intact(&state, &url, &["cat", "/a"]);
    assert_eq!(r.code, INTEGRITY, "tampering not caught: {}", r.stderr);
    assert_eq!(g.intact(&state, &url, &["fsck"]).code, INTEGRITY);
    // Put right, it reads again.
    restore(&current);
    std::fs::remove_file(&o).unwrap();
    g.intact(&state, &url, &["get", "/a", o.to_str().unwrap()])
        .ok();
    assert_eq!(std::fs::read(&o).unwrap(), new);
    assert!(fsck_clean(&g, &state, &url));
}

/// The store goes away: a change fails with a clear I/O error, and once the store is back
/// the volume reads as last sealed, with fsck clean. A store that never answers and a key
/// the store refuses are reported at once, naming the URL.
#[test]
fn a_store_that_goes_away_loses_nothing_sealed() {
    let Some(mut g) = Garage::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let url = g.url("v");
    init(&g, &state, &url);
    let f = src(tmp.path(), "a", b"sealed before the outage");
    g.intact(&state, &url, &["put", &f, "/a"]).ok();
    g.stop();
    let f = src(tmp.path(), "b", &common::pattern(4, 100_000));
    let t = Instant::now();
    let r = g.intact(&state, &url, &["put", &f, "/b"]);
    assert_eq!(r.code, IO, "{}", r.stderr);
    assert!(
        r.stderr.contains("s3://intact-test/v") && r.stderr.contains("does not answer"),
        "{}",
        r.stderr
    );
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    g.run();
    assert_eq!(
        g.intact(&state, &url, &["cat", "/a"]).ok().stdout,
        "sealed before the outage"
    );
    assert!(!g
        .intact(&state, &url, &["ls", "/"])
        .ok()
        .stdout
        .contains('b'));
    assert!(fsck_clean(&g, &state, &url));
    // The volume goes on.
    g.intact(&state, &url, &["put", &f, "/b"]).ok();
    let o = tmp.path().join("o");
    g.intact(&state, &url, &["get", "/b", o.to_str().unwrap()])
        .ok();
    assert_eq!(std::fs::read(&o).unwrap(), common::pattern(4, 100_000));
    // A refused key: reported at once, not retried.
    let r = g.intact_env(
        &state,
        &url,
        &["ls", "/"],
        &[("AWS_SECRET_ACCESS_KEY", "wrong")],
    );
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("s3://intact-test/v"), "{}", r.stderr);
    // A bucket that does not exist.
    let nob = url.replace(BUCKET, "no-such-bucket");
    let r = g.intact(&state, &nob, &["ls", "/"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("s3://no-such-bucket/v"), "{}", r.stderr);
}

/// The mount works on a volume in the bucket: files written through it, synced and
/// unmounted, read back with the CLI.
#[test]
fn a_mount_of_a_volume_in_a_bucket() {
    let Some(g) = Garage::start() else { return };
    if !common::need(&["fusermount3"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let url = g.url("m");
    init(&g, &state, &url);
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut child = g.mount(&state, &url, &mnt);
    let data = common::pattern(5, (2 << 20) + 7);
    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::write(mnt.join("dir/f"), &data).unwrap();
    let f = std::fs::File::open(mnt.join("dir/f")).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(std::fs::read(mnt.join("dir/f")).unwrap(), data);
    let (clean, status) = common::unmount_or_kill(&mnt, &mut child, 200);
    assert!(clean && status.success(), "{status}");
    let out = tmp.path().join("out");
    g.intact(&state, &url, &["get", "/dir/f", out.to_str().unwrap()])
        .ok();
    assert_eq!(std::fs::read(&out).unwrap(), data);
    assert!(fsck_clean(&g, &state, &url));
}

/// A scratch volume under a prefix of its own in the Garage bucket, anchored in a state
/// directory: what the attack suite manipulates is the bucket's objects.
struct S3Bed {
    store: Arc<dyn UntrustedStore>,
    state: PathBuf,
}

impl Bed for S3Bed {
    fn store(&self) -> Arc<dyn UntrustedStore> {
        self.store.clone()
    }
    fn create(&self, copts: &CreateOptions) -> intact_core::Result<Volume> {
        let state = self.state.clone();
        Volume::create(
            self.store.clone(),
            |id| Ok(Box::new(LocalStateDir::new(state, id)?) as Box<dyn TrustedStore>),
            PW.as_bytes(),
            copts,
            &Options::default(),
        )
    }
    fn open(&self) -> intact_core::Result<Volume> {
        let state = Volume::state_for(self.store.as_ref(), &self.state)?;
        Volume::open(
            self.store.clone(),
            Box::new(state),
            PW.as_bytes(),
            &Options::default(),
        )
    }
}

/// The twelve tampering and rollback attacks of docs/threat-model.md (`intact_core::attacks`,
/// as `tests/attacks.rs` runs them in memory), on volumes in the bucket of a real S3 server,
/// under every scheme with freshness and with the contents that take each of its paths:
/// every attack detected; under aead exactly the documented misses.
#[test]
fn the_attack_suite_on_objects_in_a_bucket() {
    let Some(g) = Garage::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let client: Arc<dyn ObjectStore> = Arc::new(g.client());
    let cases: &[(SchemeId, &[Content])] = &[
        (SchemeId::MtEintGcm, &[Content::Pattern]),
        (SchemeId::MtEintCbc, &[Content::Pattern]),
        (SchemeId::MacTree, &[Content::Pattern]),
        (
            SchemeId::RandEint,
            &[Content::Pattern, Content::Text, Content::Mixed],
        ),
        (SchemeId::CompEint, &[Content::Text, Content::Noise]),
        (SchemeId::CompEintZstd, &[Content::Pattern, Content::Mixed]),
        (SchemeId::Aead, &[Content::Pattern]),
    ];
    let mut n = 0;
    let mut report = Vec::new();
    for &(scheme, contents) in cases {
        for &content in contents {
            let copts = CreateOptions {
                block_size: 4096,
                scheme,
                auto: false,
                kdf: intact_core::crypto::KdfParams::TEST,
                inline_leaf: true,
                dir_tree: true,
                inline_mac: true,
                inline_tree: true,
                inline_data: true,
                ctr_segments: true,
                twin_blocks: true,
                leaf_log: true,
                log_delta: true,
            };
            let runs = attacks::run_all(
                &mut || {
                    n += 1;
                    let url = S3Url::parse(&format!("s3://{BUCKET}/attacks/{n}")).unwrap();
                    let store = S3Store::with_store(url, client.clone())?;
                    Ok(Box::new(S3Bed {
                        store: Arc::new(store),
                        state: tmp.path().join(format!("state{n}")),
                    }) as Box<dyn Bed>)
                },
                &copts,
                content,
            )
            .unwrap();
            assert_eq!(runs.len(), 12);
            let mut missed = Vec::new();
            for r in &runs {
                assert!(
                    matches!(r.verdict, Verdict::Detected | Verdict::MissedAsDocumented),
                    "{scheme:?} on {content:?}, attack {} ({}): {:?}",
                    r.attack.number,
                    r.attack.name,
                    r.verdict
                );
                if r.verdict == Verdict::MissedAsDocumented {
                    missed.push(r.attack.number);
                }
            }
            assert_eq!(
                missed,
                attacks::documented_misses(scheme),
                "{scheme:?} on {content:?}"
            );
            report.push(format!(
                "{} on {content:?}: 12 attacks, missed {missed:?}",
                scheme.name()
            ));
        }
    }
    // Every bed's objects went to the bucket.
    assert!(keys(&g.client(), "attacks").len() > 100);
    println!("{}", report.join("\n"));
}

/// A mount of a bucket killed with SIGKILL while files are being written, for each scheme
/// with freshness: the CLI then reads every fsynced file as it was fsynced, fsck is clean
/// (a crash is no tampering), and the volume takes writes again.
#[test]
fn a_mount_of_a_bucket_killed_mid_write_keeps_what_was_fsynced() {
    let Some(g) = Garage::start() else { return };
    if !common::need(&["fusermount3"]) {
        return;
    }
    for scheme in [
        "mt-eint",
        "mt-eint-cbc",
        "mac-tree",
        "rand-eint",
        "comp-eint",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let url = g.url(&format!("crash-{scheme}"));
        g.intact(
            &state,
            &url,
            &[
                "init",
                &url,
                "--kdf-memory",
                "1024",
                "--kdf-passes",
                "1",
                "--scheme",
                scheme,
            ],
        )
        .ok();
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let mut child = g.mount(&state, &url, &mnt);
        // Fsynced: three files, one overwritten in part after its first fsync.
        let mut kept = Vec::new();
        for i in 0..3u64 {
            let data = common::pattern(10 + i, 300_000 + i as usize * 4099);
            let p = mnt.join(format!("kept{i}"));
            std::fs::write(&p, &data).unwrap();
            std::fs::File::open(&p).unwrap().sync_all().unwrap();
            kept.push(data);
        }
        {
            use std::io::{Seek, Write};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(mnt.join("kept1"))
                .unwrap();
            f.seek(std::io::SeekFrom::Start(5000)).unwrap();
            f.write_all(&[0xAB; 9000]).unwrap();
            f.sync_all().unwrap();
            kept[1][5000..14000].fill(0xAB);
        }
        // Not fsynced: writes in flight when the daemon dies.
        let writer = {
            let mnt = mnt.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    if std::fs::write(mnt.join(format!("loose{i}")), common::pattern(i, 70_000))
                        .is_err()
                    {
                        break;
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&mnt)
            .status();
        writer.join().unwrap();
        for (i, data) in kept.iter().enumerate() {
            let out = tmp.path().join(format!("out{i}"));
            g.intact(
                &state,
                &url,
                &["get", &format!("/kept{i}"), out.to_str().unwrap()],
            )
            .ok();
            assert_eq!(&std::fs::read(&out).unwrap(), data, "{scheme}: kept{i}");
        }
        assert!(fsck_clean(&g, &state, &url), "{scheme}");
        let f = src(tmp.path(), "after", b"after the crash");
        g.intact(&state, &url, &["put", &f, "/after"]).ok();
        assert!(fsck_clean(&g, &state, &url), "{scheme}");
    }
}

/// The crash tests' workload and checks (`intact-core/tests/crash.rs`), shared.
#[path = "../../intact-core/tests/common/mod.rs"]
mod core_common;

/// A client of the bucket that stops taking changes (PUTs, deletions, copies) after its
/// first `left`: a process that crashed there. What it stored before stays in the bucket;
/// nothing after reaches it. Reads go through.
#[derive(Debug)]
struct CrashAfter {
    inner: Arc<dyn ObjectStore>,
    gate: Arc<Gate>,
}

#[derive(Debug)]
struct Gate {
    left: std::sync::atomic::AtomicI64,
    changes: std::sync::atomic::AtomicU64,
}

impl Gate {
    fn pass(&self) -> object_store::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.left.fetch_sub(1, SeqCst) <= 0 {
            return Err(object_store::Error::Generic {
                store: "crash",
                source: "the client crashed before this change".into(),
            });
        }
        self.changes.fetch_add(1, SeqCst);
        Ok(())
    }
}

impl std::fmt::Display for CrashAfter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CrashAfter({})", self.inner)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for CrashAfter {
    async fn put_opts(
        &self,
        location: &Key,
        payload: PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.gate.pass()?;
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Key,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.gate.pass()?;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Key,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }
    async fn get_ranges(
        &self,
        location: &Key,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }
    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, object_store::Result<Key>>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<Key>> {
        use futures_util::StreamExt;
        let gate = self.gate.clone();
        self.inner.delete_stream(
            locations
                .map(move |l| {
                    let l = l?;
                    gate.pass()?;
                    Ok(l)
                })
                .boxed(),
        )
    }
    fn list(
        &self,
        prefix: Option<&Key>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
    {
        self.inner.list(prefix)
    }
    fn list_with_offset(
        &self,
        prefix: Option<&Key>,
        offset: &Key,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
    {
        self.inner.list_with_offset(prefix, offset)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&Key>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Key,
        to: &Key,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.gate.pass()?;
        self.inner.copy_opts(from, to, options).await
    }
    async fn rename_opts(
        &self,
        from: &Key,
        to: &Key,
        options: object_store::RenameOptions,
    ) -> object_store::Result<()> {
        self.gate.pass()?;
        self.inner.rename_opts(from, to, options).await
    }
}

/// The crash tests' workload (`intact-core/tests/crash.rs`) on a volume in the bucket of
/// a real S3 server, its client crashing after each number of changes (PUTs and deletions)
/// in turn, under every scheme with freshness: a fresh client then opens the volume with
/// the anchor as the crash left it, with no integrity failure, and every file is at its
/// content of the last completed sync or a later point (or, for a file whose chunks were
/// only partly stored, an earlier content of its own: a crash that keeps any subset of the
/// unsynced writes, as crash.rs's random images); fsck is clean. `INTACT_S3_CRASH_STRIDE`
/// (default 1) takes every k-th crash point.
#[test]
fn a_crash_at_every_change_in_the_bucket_recovers_with_no_alarm() {
    use core_common::workload::{explained, flip, read_state, workload_with};
    use intact_core::store::MemTrusted;
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::SeqCst};
    let Some(g) = Garage::start() else { return };
    let stride: usize = std::env::var("INTACT_S3_CRASH_STRIDE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let client: Arc<dyn ObjectStore> = Arc::new(g.client());
    let bs = 128;
    let mut report = Vec::new();
    for scheme in [
        SchemeId::MtEintGcm,
        SchemeId::MtEintCbc,
        SchemeId::MacTree,
        SchemeId::RandEint,
        SchemeId::CompEint,
        SchemeId::CompEintZstd,
    ] {
        let t = Instant::now();
        let mut run = 0;
        // One run: the volume made, the gate armed, the workload until the crash.
        let mut crash_after = |left: i64| {
            run += 1;
            let url =
                S3Url::parse(&format!("s3://{BUCKET}/crash/{}/{run}", scheme.name())).unwrap();
            let gate = Arc::new(Gate {
                left: AtomicI64::new(i64::MAX),
                changes: AtomicU64::new(0),
            });
            let crashing = CrashAfter {
                inner: client.clone(),
                gate: gate.clone(),
            };
            let store = Arc::new(S3Store::with_store(url.clone(), Arc::new(crashing)).unwrap());
            let trusted = MemTrusted::new();
            let vol = core_common::create(store, &trusted, scheme, bs as u32);
            gate.changes.store(0, SeqCst);
            gate.left.store(left, SeqCst);
            // Point 0: the freshly created, empty volume.
            let (mut points, mut done) = (vec![std::collections::BTreeMap::new()], 1);
            let r = workload_with(&vol, bs, &mut points, &mut done, flip, &mut || {});
            drop(vol);
            (url, trusted, points, done, r, gate.changes.load(SeqCst))
        };
        let (.., r, total) = crash_after(i64::MAX);
        r.unwrap();
        assert!(
            total > 20,
            "{scheme:?}: workload too small: {total} changes"
        );
        let (mut checked, mut failed) = (0, 0);
        for n in (0..total).step_by(stride) {
            let (url, trusted, points, done, r, _) = crash_after(n as i64);
            let what = format!("{scheme:?}: crash after change {n} of {total}");
            // The last changes (an old log segment's deletion as the volume closes) fail
            // no request.
            match r {
                Err(e) => {
                    assert!(
                        !e.is_tampered(),
                        "{what}: the crash surfaced as tampering: {e}"
                    );
                    failed += 1;
                }
                Ok(()) => assert!(n + 3 >= total, "{what}: the crash failed no request"),
            }
            let store = Arc::new(S3Store::with_store(url, client.clone()).unwrap());
            let vol = core_common::open(store, &trusted)
                .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            let state = read_state(&vol).unwrap_or_else(|e| panic!("{what}: read: {e}"));
            assert!(
                explained(&state, &points[done - 1..], true),
                "{what}: the tree after recovery is no state at or after the last sync: {:?}",
                state.keys().collect::<Vec<_>>()
            );
            let f = vol
                .fsck(&mut |_| {})
                .unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
            assert!(f.is_empty(), "{what}: fsck: {f:?}");
            checked += 1;
        }
        assert!(
            failed + 3 >= checked,
            "{scheme:?}: {failed} of {checked} crashes failed"
        );
        report.push(format!(
            "{}: {checked} crash points of {total} changes ({failed} failed a request), {:.1} s",
            scheme.name(),
            t.elapsed().as_secs_f64()
        ));
    }
    println!("{}", report.join("\n"));
}

/// `intact bench contiu --part macro --s3 URL`: their schemes and intact's also run against
/// the real S3 server, each read checked against what was written, and the run's objects
/// are deleted afterwards.
#[test]
fn the_contiu_macro_benchmark_runs_against_the_real_server() {
    let Some(g) = Garage::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let url = g.url("bench/");
    let out = g.intact(
        tmp.path(),
        &url,
        &[
            "--json",
            "bench",
            "contiu",
            "--part",
            "macro",
            "--quick",
            "--runs",
            "1",
            "--sets",
            "mostly-small",
            "--intact",
            "mt-eint",
            "--s3",
            &url,
            "--keys",
            tmp.path().join("keys").to_str().unwrap(),
            "--workdir",
            tmp.path().to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let both: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let rows = both["macro"]["rows"].as_array().unwrap();
    let on_s3: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["cloud"].as_str().unwrap().starts_with("S3 server"))
        .collect();
    assert_eq!(on_s3.len(), 4 * 7, "{rows:?}");
    for r in &on_s3 {
        let req: u64 = r["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .sum();
        assert!(req >= 20, "{r}");
        assert!(r["total_s"]["min"].as_f64().unwrap() > 0.0);
    }
    assert!(
        keys(&g.client(), "bench").is_empty(),
        "objects left in the bucket"
    );
}
