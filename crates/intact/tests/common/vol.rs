//! A volume in a temporary directory driven through the CLI (the etcd and signed-root
//! tests).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_intact");
/// The volumes' password.
pub const PW: &str = "cli-test-password";
/// Exit codes (README).
pub const INTEGRITY: i32 = 10;
/// The volume is in use.
pub const LOCKED: i32 = 14;
/// An I/O error.
pub const IO: i32 = 15;

/// What a command printed and how it exited.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(self) -> Run {
        assert_eq!(self.code, 0, "failed: {}", self.stderr);
        self
    }
}

/// A volume in a temporary directory, driven through the CLI.
pub struct Vol {
    pub dir: tempfile::TempDir,
}

impl Vol {
    pub fn new() -> Vol {
        Vol {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn cipher(&self) -> PathBuf {
        self.dir.path().join("cipher")
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn run(&self, args: &[&str]) -> Run {
        let out = Command::new(BIN)
            .env_remove("INTACT_ANCHOR")
            .env_remove("INTACT_SIGN_KEY")
            .env_remove("INTACT_VERIFY_KEY")
            .env("INTACT_PASSWORD", PW)
            .env("INTACT_VOLUME", self.cipher())
            .env("INTACT_STATE", self.state())
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

    pub fn init(&self, anchor: Option<&str>) {
        let c = self.cipher();
        let mut a = vec![
            "init",
            c.to_str().unwrap(),
            "--kdf-memory",
            "1024",
            "--kdf-passes",
            "1",
        ];
        if let Some(u) = anchor {
            a.extend(["--anchor", u]);
        }
        self.run(&a).ok();
    }

    pub fn put(&self, path: &str, data: &[u8]) -> Run {
        self.put_with(&[], path, data)
    }

    /// `put` with global options `opts` before the command.
    pub fn put_with(&self, opts: &[&str], path: &str, data: &[u8]) -> Run {
        let src = self.dir.path().join("src.bin");
        std::fs::write(&src, data).unwrap();
        let mut a = opts.to_vec();
        a.extend(["put", src.to_str().unwrap(), path]);
        self.run(&a)
    }

    pub fn cat(&self, path: &str) -> Run {
        self.run(&["cat", path])
    }

    /// The state directory of the volume (named by its id).
    pub fn volume_state(&self) -> PathBuf {
        let c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.cipher().join("intact.conf")).unwrap())
                .unwrap();
        self.state().join(c["volume_id"].as_str().unwrap())
    }
}

/// A foreground mount of `v` at `mnt`, with global options `global` and mount options
/// `opts` (its log drained as it comes), or `None` when FUSE is missing.
pub fn mount(
    v: &Vol,
    mnt: &Path,
    global: &[&str],
    opts: &[&str],
) -> Option<(std::process::Child, std::thread::JoinHandle<String>)> {
    use std::io::Read;
    use std::time::{Duration, Instant};
    if !super::need(&["fusermount3"]) {
        return None;
    }
    std::fs::create_dir_all(mnt).unwrap();
    let mut child = Command::new(BIN)
        .env_remove("INTACT_ANCHOR")
        .env("INTACT_PASSWORD", PW)
        .env("INTACT_STATE", v.state())
        .env("INTACT_LOG", "info")
        .args(global)
        .arg("mount")
        .arg(v.cipher())
        .arg(mnt)
        .args(["-f", "--commit-interval", "0"])
        .args(opts)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let until = Instant::now() + Duration::from_secs(30);
    while !super::is_mounted(mnt) {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("mount exited with {st}: {}", log.join().unwrap());
        }
        assert!(Instant::now() < until, "not mounted after 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some((child, log))
}
