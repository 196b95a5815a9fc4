//! A one-node Garage (a distributed S3-compatible object store; scripts/test.sh installs it
//! with `cargo install garage`) started by a test on the loopback interface, with a bucket
//! and a key allowed on it: the real S3 server of `s3.rs`, and of `fuse.rs` when
//! `INTACT_FUSE_STORE=s3` runs the mount tests on volumes in a bucket.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::vol::{Run, BIN, PW};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A one-node Garage cluster in a temporary directory with a bucket and a key allowed on
/// it; killed when dropped.
pub struct Garage {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    s3: u16,
    pub key_id: String,
    pub secret: String,
}

pub const BUCKET: &str = "intact-test";

impl Garage {
    /// Starts Garage, or `None` (skipped) when it is not installed.
    pub fn start() -> Option<Garage> {
        if !super::need(&["garage"]) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (rpc, s3) = (free_port(), free_port());
        let secret: String = (0..32)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        let conf = format!(
            "metadata_dir = \"{d}/meta\"\ndata_dir = \"{d}/data\"\ndb_engine = \"lmdb\"\n\
             replication_factor = 1\nrpc_bind_addr = \"127.0.0.1:{rpc}\"\n\
             rpc_public_addr = \"127.0.0.1:{rpc}\"\nrpc_secret = \"{secret}\"\n\
             [s3_api]\ns3_region = \"garage\"\napi_bind_addr = \"127.0.0.1:{s3}\"\n\
             root_domain = \".s3.garage.localhost\"\n",
            d = dir.path().display()
        );
        std::fs::write(dir.path().join("garage.toml"), conf).unwrap();
        let mut g = Garage {
            child: None,
            dir,
            s3,
            key_id: String::new(),
            secret: String::new(),
        };
        g.run();
        let id = g.cli(&["node", "id", "-q"]);
        let id = id.trim().split('@').next().unwrap().to_string();
        g.cli(&["layout", "assign", "-z", "dc1", "-c", "1G", &id]);
        g.cli(&["layout", "apply", "--version", "1"]);
        g.cli(&["bucket", "create", BUCKET]);
        let key = g.cli(&["key", "create", "intact-test-key"]);
        let field = |name: &str| {
            key.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_else(|| panic!("no {name} in {key}"))
        };
        g.key_id = field("Key ID:");
        g.secret = field("Secret key:");
        g.cli(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            BUCKET,
            "--key",
            "intact-test-key",
        ]);
        // The layout takes a moment to reach the S3 front end: wait for a first PUT.
        let until = Instant::now() + Duration::from_secs(30);
        let store = g.client();
        let rt = rt();
        while rt
            .block_on(store.put(&Key::from("probe"), PutPayload::from_static(b"x")))
            .is_err()
        {
            assert!(Instant::now() < until, "garage takes no PUT after 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        rt.block_on(store.delete(&Key::from("probe"))).unwrap();
        Some(g)
    }

    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("garage.toml")
    }

    /// Starts (or restarts, on the same data) the server and waits until it answers.
    pub fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("garage.log"))
            .unwrap();
        let child = Command::new("garage")
            .arg("-c")
            .arg(self.conf())
            .arg("server")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start garage");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.s3)).is_err() {
            assert!(Instant::now() < until, "garage does not listen after 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("garage")
                .arg("-c")
                .arg(self.conf())
                .arg("status")
                .output()
                .unwrap();
            if out.status.success() {
                return;
            }
            assert!(Instant::now() < until, "garage status fails after 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `garage ARGS` against this server; its standard output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("garage")
            .arg("-c")
            .arg(self.conf())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "garage {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3)
    }

    /// The volume URL of `prefix` in the test bucket.
    pub fn url(&self, prefix: &str) -> String {
        format!(
            "s3://{BUCKET}/{prefix}?endpoint={}&region=garage",
            self.endpoint()
        )
    }

    /// A foreground mount of the volume at `url` on `mnt`, once it is mounted.
    pub fn mount(&self, state: &Path, url: &str, mnt: &Path) -> Child {
        let mut child = Command::new(BIN)
            .env_remove("INTACT_ANCHOR")
            .env("HOME", self.dir.path())
            .env("INTACT_PASSWORD", PW)
            .env("INTACT_STATE", state)
            .env("AWS_ACCESS_KEY_ID", &self.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret)
            .args(["mount", url])
            .arg(mnt)
            .args(["-f", "--commit-interval", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        while !super::is_mounted(mnt) {
            assert!(child.try_wait().unwrap().is_none(), "the mount exited");
            assert!(Instant::now() < until, "not mounted after 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    }

    /// A plain S3 client on the bucket: the adversary's hands.
    pub fn client(&self) -> AmazonS3 {
        AmazonS3Builder::new()
            .with_bucket_name(BUCKET)
            .with_endpoint(self.endpoint())
            .with_region("garage")
            .with_allow_http(true)
            .with_access_key_id(&self.key_id)
            .with_secret_access_key(&self.secret)
            .build()
            .unwrap()
    }

    /// `intact ARGS` on the volume at `url`, with this server's key in the environment.
    pub fn intact(&self, state: &Path, url: &str, args: &[&str]) -> Run {
        self.intact_env(state, url, args, &[])
    }

    pub fn intact_env(&self, state: &Path, url: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut c = Command::new(BIN);
        c.env_remove("INTACT_ANCHOR")
            .env_remove("AWS_PROFILE")
            .env("HOME", self.dir.path())
            .env("INTACT_PASSWORD", PW)
            .env("INTACT_VOLUME", url)
            .env("INTACT_STATE", state)
            .env("AWS_ACCESS_KEY_ID", &self.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run intact");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
