//! End-to-end tests of the `intact` binary: exit codes, messages, and that no failure mode
//! ends in a panic.
//!
//! Every test gets its own temporary cipher directory and state directory, and a cheap
//! Argon2 setting so that each process start costs milliseconds.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::SystemTime;

const PW: &str = "correct horse battery staple";
const BIN: &str = env!("CARGO_BIN_EXE_intact");

/// Exit codes of `intact` (see `mod code` in main.rs).
mod code {
    pub const OTHER: i32 = 1;
    pub const INTEGRITY: i32 = 10;
    pub const PASSWORD: i32 = 11;
    pub const CONFIG: i32 = 12;
    pub const ANCHOR_MISSING: i32 = 13;
    pub const LOCKED: i32 = 14;
}

/// One finished run of the binary.
struct Run {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
    what: String,
}

impl Run {
    fn from(out: Output, what: String) -> Run {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let code = out
            .status
            .code()
            .unwrap_or_else(|| panic!("{what}: killed by a signal; stderr:\n{stderr}"));
        assert!(
            !stderr.contains("panicked"),
            "{what}: the binary panicked:\n{stderr}"
        );
        Run {
            code,
            stdout: out.stdout,
            stderr,
            what,
        }
    }

    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdout)
            .unwrap_or_else(|e| panic!("{}: stdout is not JSON ({e}):\n{}", self.what, self.out()))
    }

    fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "{}: expected success; stderr:\n{}",
            self.what, self.stderr
        );
        self
    }

    /// Asserts exit `code` and a non-trivial `intact: ...` message on stderr.
    fn fails(self, code: i32) -> Run {
        assert_eq!(
            self.code,
            code,
            "{}: expected exit {code}; stdout:\n{}\nstderr:\n{}",
            self.what,
            self.out(),
            self.stderr
        );
        assert!(
            self.stderr.trim().len() > 10,
            "{}: no clear message on stderr: {:?}",
            self.what,
            self.stderr
        );
        self
    }

    fn says(self, needle: &str) -> Run {
        assert!(
            self.stderr.to_lowercase().contains(&needle.to_lowercase()),
            "{}: stderr does not mention {needle:?}:\n{}",
            self.what,
            self.stderr
        );
        self
    }
}

/// A volume in a temporary directory: `<tmp>/cipher` and `<tmp>/state`.
struct Vol {
    tmp: tempfile::TempDir,
    cipher: PathBuf,
    state: PathBuf,
}

impl Vol {
    /// A fresh, empty, not yet initialised volume location.
    fn blank() -> Vol {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cipher = tmp.path().join("cipher");
        let state = tmp.path().join("state");
        Vol { tmp, cipher, state }
    }

    /// An initialised volume with extra `init` arguments.
    fn with(args: &[&str]) -> Vol {
        let v = Vol::blank();
        let dir = v.cipher.to_str().unwrap().to_string();
        let mut a = vec![
            "init",
            dir.as_str(),
            "--kdf-memory",
            "64",
            "--kdf-passes",
            "1",
        ];
        a.extend_from_slice(args);
        let r = v.run(&a).ok();
        assert!(
            r.out().contains("created volume"),
            "init output: {}",
            r.out()
        );
        v
    }

    fn new() -> Vol {
        Vol::with(&[])
    }

    fn tmp(&self) -> &Path {
        self.tmp.path()
    }

    /// A command with a clean environment: this volume, its state dir, and the password.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = bare();
        c.env("XDG_STATE_HOME", self.tmp().join("xdg"))
            .arg("--volume")
            .arg(&self.cipher)
            .arg("--state")
            .arg(&self.state)
            .args(args);
        c
    }

    fn run(&self, args: &[&str]) -> Run {
        exec(self.cmd(args), args.join(" "))
    }

    /// [`Vol::run`] right after this process let go of the volume's lock (a library handle
    /// dropped): retried while it finds the lock held, for up to 10 s. The lock file's
    /// descriptor is close-on-exec, but a child that another test thread forks holds a
    /// copy of it (and so the lock) until its exec; on a loaded machine that takes a
    /// moment. A lock that stays held fails the command as before.
    fn run_after_release(&self, args: &[&str]) -> Run {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let r = self.run(args);
            let in_use = r.code == code::LOCKED || r.stderr.contains("while the volume is open");
            if !in_use || std::time::Instant::now() > until {
                return r;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    fn run_pw(&self, pw: &str, args: &[&str]) -> Run {
        let mut c = self.cmd(args);
        c.env("INTACT_PASSWORD", pw);
        exec(c, format!("{} (password {pw:?})", args.join(" ")))
    }

    fn run_stdin(&self, args: &[&str], input: &[u8]) -> Run {
        let mut c = self.cmd(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn intact");
        // The binary may exit (e.g. on a lock error) before reading its input.
        match child.stdin.take().unwrap().write_all(input) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.expect("write stdin"),
        }
        Run::from(child.wait_with_output().expect("wait"), args.join(" "))
    }

    /// Writes `data` to a local file and `put`s it at `path`.
    fn put(&self, path: &str, data: &[u8], extra: &[&str]) {
        let src = self.tmp().join("src.bin");
        std::fs::write(&src, data).unwrap();
        let mut a = vec!["put", src.to_str().unwrap(), path];
        a.extend_from_slice(extra);
        self.run(&a).ok();
    }

    /// `get`s `path` into a local file and returns its bytes.
    fn get(&self, path: &str) -> Vec<u8> {
        let dst = self.tmp().join("dst.bin");
        let _ = std::fs::remove_file(&dst);
        self.run(&["get", path, dst.to_str().unwrap()]).ok();
        std::fs::read(&dst).unwrap()
    }

    fn config_path(&self) -> PathBuf {
        self.cipher.join("intact.conf")
    }

    fn volume_id(&self) -> String {
        let c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.config_path()).unwrap()).unwrap();
        c["volume_id"].as_str().unwrap().to_string()
    }

    fn anchor_path(&self) -> PathBuf {
        self.state.join(self.volume_id()).join("anchor")
    }

    fn info(&self) -> serde_json::Value {
        self.run(&["--json", "info"]).ok().json()
    }
}

/// The binary with no volume, state or password settings inherited from the environment.
fn bare() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("INTACT_VOLUME")
        .env_remove("INTACT_STATE")
        .env_remove("INTACT_LOG")
        .env("INTACT_PASSWORD", PW)
        .stdin(Stdio::null());
    c
}

fn exec(mut c: Command, what: String) -> Run {
    let out = c.output().expect("run intact");
    Run::from(out, what)
}

/// Deterministic pseudo-random bytes (xorshift64*).
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Every file under `dir` with its bytes and modification time.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, SystemTime)> {
    let mut m = BTreeMap::new();
    if !dir.exists() {
        return m;
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let md = e.metadata().unwrap();
            if md.is_dir() {
                m.insert(e.path(), (Vec::new(), md.modified().unwrap()));
                stack.push(e.path());
            } else {
                m.insert(
                    e.path(),
                    (std::fs::read(e.path()).unwrap(), md.modified().unwrap()),
                );
            }
        }
    }
    m
}

fn files_with_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    snapshot(dir)
        .into_keys()
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == ext))
        .collect()
}

fn flip_byte(path: &Path, off: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[off] ^= 0x40;
    std::fs::write(path, b).unwrap();
}

// ---------------------------------------------------------------------------------------
// 1. Happy path
// ---------------------------------------------------------------------------------------

#[test]
fn put_get_round_trips_at_block_boundaries() {
    let v = Vol::new();
    for (i, n) in [0usize, 1, 4095, 4096, 4097, 3 * 4096 + 5]
        .into_iter()
        .enumerate()
    {
        let data = random_bytes(n, i as u64 + 7);
        let p = format!("/f{n}");
        v.put(&p, &data, &[]);
        assert!(v.get(&p) == data, "round trip of {n} bytes differs");
        let st = v.run(&["--json", "stat", &p]).ok().json();
        assert_eq!(st["size"], n as u64);
        assert_eq!(st["kind"], "file");
    }
    // A larger random file spanning several 1 MiB write chunks.
    let big = random_bytes(3 * 1024 * 1024 + 123, 99);
    v.put("/big", &big, &[]);
    assert!(v.get("/big") == big, "3 MB round trip differs");
    // Overwriting with a shorter file truncates.
    v.put("/big", b"short", &[]);
    assert_eq!(v.get("/big"), b"short");
    // cat prints the bytes.
    let r = v.run(&["cat", "/f4097"]).ok();
    assert!(r.stdout == random_bytes(4097, 4 + 7), "cat output differs");
    v.run(&["fsck"]).ok();
}

#[test]
fn stdin_and_stdout() {
    let v = Vol::new();
    let data = random_bytes(10_000, 3);
    v.run_stdin(&["put", "-", "/from-stdin"], &data).ok();
    let r = v.run(&["get", "/from-stdin", "-"]).ok();
    assert!(r.stdout == data, "get to stdout differs");
    // An empty stdin makes an empty file.
    v.run_stdin(&["put", "-", "/empty"], b"").ok();
    assert!(v.run(&["get", "/empty", "-"]).ok().stdout.is_empty());
}

#[test]
fn namespace_commands() {
    let v = Vol::new();
    v.put("/a.txt", b"hello a\n", &[]);
    v.put("/b.txt", b"hello b\n", &[]);

    // mkdir -p creates parents and is idempotent; plain mkdir of an existing dir fails.
    v.run(&["mkdir", "-p", "/d1/d2/d3"]).ok();
    v.run(&["mkdir", "-p", "/d1/d2/d3"]).ok();
    v.run(&["mkdir", "/d1"])
        .fails(code::OTHER)
        .says("already exists");
    v.run(&["mkdir", "-p", "/a.txt/x"])
        .fails(code::OTHER)
        .says("not a directory");
    v.run(&["mkdir", "/plain"]).ok();

    // ls, ls -l, --json ls
    let ls = v.run(&["ls"]).ok().out();
    assert_eq!(
        ls.lines().collect::<Vec<_>>(),
        ["a.txt", "b.txt", "d1", "plain"]
    );
    let ll = v.run(&["ls", "-l", "/"]).ok().out();
    let line = ll
        .lines()
        .find(|l| l.ends_with(" a.txt"))
        .expect("a.txt in ls -l");
    assert!(
        line.starts_with('-') && line.contains(" 8 "),
        "ls -l line: {line}"
    );
    assert!(
        ll.lines().any(|l| l.starts_with('d') && l.ends_with(" d1")),
        "ls -l: {ll}"
    );
    let j = v.run(&["--json", "ls", "/"]).ok().json();
    let rows = j.as_array().expect("array");
    assert_eq!(rows.len(), 4);
    let a = rows.iter().find(|r| r["name"] == "a.txt").unwrap();
    assert_eq!(a["kind"], "file");
    assert_eq!(a["stat"]["size"], 8);
    assert_eq!(
        rows.iter().find(|r| r["name"] == "d1").unwrap()["kind"],
        "dir"
    );
    assert_eq!(v.run(&["ls", "/d1"]).ok().out(), "d2\n");
    v.run(&["ls", "/nope"])
        .fails(code::OTHER)
        .says("no such file");

    // mv: rename, then into a directory.
    v.run(&["mv", "/a.txt", "/renamed.txt"]).ok();
    v.run(&["cat", "/a.txt"])
        .fails(code::OTHER)
        .says("no such file");
    assert_eq!(v.run(&["cat", "/renamed.txt"]).ok().stdout, b"hello a\n");
    v.run(&["mv", "/renamed.txt", "/d1/d2"]).ok();
    assert_eq!(
        v.run(&["cat", "/d1/d2/renamed.txt"]).ok().stdout,
        b"hello a\n"
    );
    assert_eq!(v.run(&["ls", "/d1/d2"]).ok().out(), "d3\nrenamed.txt\n");
    // Moving a directory into itself is refused.
    v.run(&["mv", "/d1", "/d1/d2/d3"])
        .fails(code::OTHER)
        .says("into itself");

    // ln -s and stat showing the target.
    v.run(&["ln", "-s", "/d1/d2/renamed.txt", "/link"]).ok();
    let st = v.run(&["stat", "/link"]).ok().out();
    assert!(
        st.contains("target: /d1/d2/renamed.txt"),
        "stat of a symlink: {st}"
    );
    assert!(st.contains("Symlink"), "stat of a symlink: {st}");
    let sj = v.run(&["--json", "stat", "/d1/d2/renamed.txt"]).ok().json();
    assert_eq!(sj["size"], 8);
    assert_eq!(sj["kind"], "file");
    assert!(sj["ino"].as_u64().unwrap() > 0);
    assert_eq!(sj["file_id"].as_str().unwrap().len(), 32, "file_id: {sj}");
    v.run(&["ln", "/x", "/y"]).fails(2);

    // rm: a file; a directory needs -r; rm -r removes a tree.
    v.run(&["rm", "/b.txt"]).ok();
    v.run(&["rm", "/b.txt"])
        .fails(code::OTHER)
        .says("no such file");
    v.run(&["rm", "/d1"])
        .fails(code::OTHER)
        .says("is a directory");
    v.run(&["rm", "-r", "/d1"]).ok();
    v.run(&["rm", "/link"]).ok();
    assert_eq!(v.run(&["ls"]).ok().out(), "plain\n");
    v.run(&["fsck"]).ok();
}

#[test]
fn mv_with_trailing_slash_moves_into_directory() {
    let v = Vol::new();
    v.run(&["mkdir", "-p", "/src/inner"]).ok();
    v.put("/src/inner/f", b"payload", &[]);
    v.run(&["mkdir", "/dst"]).ok();
    // `mv /src/ /dst` must move src into dst, not replace the (empty) dst.
    v.run(&["mv", "/src/", "/dst"]).ok();
    assert_eq!(v.run(&["ls", "/dst"]).ok().out(), "src\n");
    assert_eq!(v.run(&["cat", "/dst/src/inner/f"]).ok().stdout, b"payload");
}

#[test]
fn rm_r_root_is_refused_and_keeps_files() {
    let v = Vol::new();
    v.put("/keep", b"keep me", &[]);
    v.run(&["rm", "-r", "/"]).fails(code::OTHER).says("root");
    assert_eq!(v.run(&["cat", "/keep"]).ok().stdout, b"keep me");
}

#[test]
fn put_errors_are_clear() {
    let v = Vol::new();
    v.run(&["mkdir", "/dir"]).ok();
    let missing = v.tmp().join("missing-src");
    v.run(&["put", missing.to_str().unwrap(), "/x"])
        .fails(code::OTHER)
        .says("missing-src");
    v.run(&["put", v.tmp().to_str().unwrap(), "/x"])
        .fails(code::OTHER)
        .says("is a directory");
    v.put("/file", b"x", &[]);
    let src = v.tmp().join("src.bin");
    v.run(&["put", src.to_str().unwrap(), "/dir"])
        .fails(code::OTHER)
        .says("is a directory");
    v.run(&["put", src.to_str().unwrap(), "/nope/x"])
        .fails(code::OTHER)
        .says("no such file");
    v.run(&["put", src.to_str().unwrap(), "/x", "--scheme", "rot13"])
        .fails(code::OTHER)
        .says("rot13");
    v.run(&["get", "/dir", "-"])
        .fails(code::OTHER)
        .says("is a directory");
    v.run(&["cat", "/nope"]).fails(code::OTHER).says("/nope");
    let r = v.run(&["ls"]).ok().out();
    assert_eq!(r, "dir\nfile\n", "failed puts left entries behind");
    v.run(&["fsck"]).ok();
}

#[test]
fn info_fsck_and_constant_trusted_state() {
    let v = Vol::new();
    let i0 = v.info();
    let trusted = i0["trusted_bytes"].as_u64().expect("trusted_bytes");
    assert!(trusted > 0);
    assert_eq!(i0["block_size"], 4096);
    assert_eq!(i0["scheme"], "mt-eint");
    assert_eq!(i0["volume_id"], v.volume_id());
    let anchor_len = std::fs::metadata(v.anchor_path()).unwrap().len();
    for k in 0..5u64 {
        v.put(
            &format!("/f{k}"),
            &random_bytes(20_000 + k as usize * 4096, k),
            &[],
        );
    }
    let i1 = v.info();
    assert_eq!(
        i1["trusted_bytes"].as_u64(),
        Some(trusted),
        "trusted bytes grew with files"
    );
    assert_eq!(
        std::fs::metadata(v.anchor_path()).unwrap().len(),
        anchor_len,
        "anchor file grew"
    );
    assert!(i1["integrity_bytes"].as_u64().unwrap() > 0, "info: {i1}");
    assert_eq!(i1["files"], 5);
    assert!(i1["content_bytes"].as_u64().unwrap() >= 5 * 20_000);
    assert!(i1["epoch"].as_u64().unwrap() > i0["epoch"].as_u64().unwrap());
    let text = v.run(&["info"]).ok().out();
    assert!(
        text.contains("trusted bytes:") && text.contains("(the anchor, constant)"),
        "{text}"
    );
    let r = v.run(&["fsck"]).ok();
    assert!(r.stderr.contains("no integrity failures"), "{}", r.stderr);
    assert!(r.stdout.is_empty());
    let j = v.run(&["--json", "fsck"]).ok().json();
    assert_eq!(j["ok"], true);
    assert_eq!(j["failures"].as_array().unwrap().len(), 0);
}

#[test]
fn per_file_schemes_round_trip() {
    let v = Vol::new();
    let data = random_bytes(3 * 4096 + 17, 11);
    for scheme in ["aead", "mt-eint-cbc", "mt-eint", "none", "mac-tree"] {
        let p = format!("/{scheme}");
        v.put(&p, &data, &["--scheme", scheme]);
        assert_eq!(v.get(&p), data, "{scheme}");
        let st = v.run(&["stat", &p]).ok().out();
        assert!(
            st.contains(&format!("scheme: {scheme}")),
            "stat of {scheme} file:\n{st}"
        );
        assert_eq!(v.run(&["--json", "stat", &p]).ok().json()["scheme"], scheme);
    }
    v.run(&["fsck"]).ok();
    // Measured integrity numbers: every block read once; mac-tree moves US_F bytes,
    // none moves none and says so.
    let m = v
        .run(&["--json", "stat", "--integrity", "/mac-tree"])
        .ok()
        .json();
    assert_eq!(m["measured"]["blocks_read"], 4);
    assert!(m["read_bandwidth"].as_f64().unwrap() >= 16.0, "{m}");
    assert_eq!(m["trusted_bytes"], 27);
    let n = v
        .run(&["--json", "stat", "--integrity", "/none"])
        .ok()
        .json();
    assert_eq!(n["authenticated"], false);
    assert_eq!(n["integrity_bytes"], 0);
    assert!(v
        .run(&["stat", "/none"])
        .ok()
        .out()
        .contains("NO integrity"));
    let i = v.run(&["--json", "info", "--measure"]).ok().json();
    assert!(
        i["integrity"]["session"]["blocks_read"].as_u64().unwrap() >= 20,
        "{i}"
    );
    // A volume whose default is aead.
    let w = Vol::with(&["--scheme", "aead"]);
    w.put("/x", &data, &[]);
    assert_eq!(w.get("/x"), data);
    assert_eq!(
        w.run(&["--json", "stat", "/x"]).ok().json()["scheme"],
        "aead"
    );
    assert_eq!(w.info()["scheme"], "aead");
}

#[test]
fn small_and_large_block_sizes() {
    let data = random_bytes(200 * 1024 + 3, 42);
    for bs in ["128", "65536"] {
        let v = Vol::with(&["--block-size", bs]);
        assert_eq!(v.info()["block_size"].to_string(), bs);
        v.put("/f", &data, &[]);
        assert!(v.get("/f") == data, "block size {bs}: round trip differs");
        v.run(&["fsck"]).ok();
    }
    let v = Vol::blank();
    let dir = v.cipher.to_str().unwrap();
    v.run(&[
        "init",
        dir,
        "--kdf-memory",
        "64",
        "--kdf-passes",
        "1",
        "--block-size",
        "1000",
    ])
    .fails(code::CONFIG)
    .says("block size");
    v.run(&[
        "init",
        dir,
        "--kdf-memory",
        "64",
        "--kdf-passes",
        "1",
        "--scheme",
        "nope",
    ])
    .fails(code::OTHER)
    .says("nope");
}

// ---------------------------------------------------------------------------------------
// 2. Wrong password
// ---------------------------------------------------------------------------------------

#[test]
fn wrong_password_changes_nothing() {
    let v = Vol::new();
    v.put("/f", b"secret", &[]);
    let cipher = snapshot(&v.cipher);
    let state = snapshot(&v.state);
    for args in [
        &["ls"][..],
        &["put", "-", "/g"],
        &["rm", "/f"],
        &["fsck"],
        &["recover-anchor", "--i-accept-rollback-risk"],
    ] {
        v.run_pw("wrong", args)
            .fails(code::PASSWORD)
            .says("wrong password");
    }
    assert!(
        snapshot(&v.cipher) == cipher,
        "the cipher directory changed"
    );
    assert!(snapshot(&v.state) == state, "the state directory changed");
    assert_eq!(v.run(&["cat", "/f"]).ok().stdout, b"secret");
}

// ---------------------------------------------------------------------------------------
// 3. Corrupted config
// ---------------------------------------------------------------------------------------

#[test]
fn corrupted_config() {
    let v = Vol::new();
    v.put("/f", b"data", &[]);
    let conf = v.config_path();
    let orig = std::fs::read(&conf).unwrap();
    let text = String::from_utf8(orig.clone()).unwrap();
    let set = |bytes: &[u8]| std::fs::write(&conf, bytes).unwrap();

    set(&random_bytes(300, 1));
    v.run(&["ls"])
        .fails(code::CONFIG)
        .says("intact.conf is corrupted");
    set(&orig[..orig.len() / 2]);
    v.run(&["ls"])
        .fails(code::CONFIG)
        .says("intact.conf is corrupted");
    set(b"");
    v.run(&["ls"]).fails(code::CONFIG).says("intact.conf");
    set(b"{}");
    v.run(&["ls"]).fails(code::CONFIG).says("intact.conf");

    // A field changed to another valid value breaks the key envelope's AAD.
    assert!(text.contains("\"block_size\": 4096"), "{text}");
    set(text
        .replace("\"block_size\": 4096", "\"block_size\": 8192")
        .as_bytes());
    v.run(&["ls"])
        .fails(code::PASSWORD)
        .says("key envelope was modified");
    set(text
        .replace("\"scheme\": \"mt-eint\"", "\"scheme\": \"aead\"")
        .as_bytes());
    v.run(&["ls"]).fails(code::PASSWORD).says("wrong password");
    // Invalid values are configuration errors.
    set(text
        .replace("\"block_size\": 4096", "\"block_size\": 4095")
        .as_bytes());
    v.run(&["ls"]).fails(code::CONFIG).says("block size");
    set(text.replace("\"format\": 1", "\"format\": 99").as_bytes());
    v.run(&["ls"]).fails(code::CONFIG).says("newer");
    let mut c: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        c["features"],
        serde_json::json!([
            "inline-leaf",
            "dir-tree",
            "inline-mac-leaf",
            "inline-tree",
            "inline-data",
            "ctr-segments",
            "twin-blocks",
            "leaf-log",
            "log-delta"
        ])
    );
    c["features"] = serde_json::json!([
        "inline-leaf",
        "dir-tree",
        "inline-mac-leaf",
        "inline-tree",
        "warp"
    ]);
    set(c.to_string().as_bytes());
    v.run(&["ls"]).fails(code::CONFIG).says("warp");
    // Argon2 parameters that would take the machine down are refused before use.
    let mut c: serde_json::Value = serde_json::from_str(&text).unwrap();
    c["kdf"]["m_kib"] = serde_json::json!(u32::MAX);
    set(c.to_string().as_bytes());
    v.run(&["ls"]).fails(code::CONFIG).says("argon2");
    // A damaged key envelope.
    let mut c: serde_json::Value = serde_json::from_str(&text).unwrap();
    c["wrapped_key"] = serde_json::json!("zz");
    set(c.to_string().as_bytes());
    v.run(&["ls"]).fails(code::CONFIG).says("wrapped key");
    // The config deleted.
    std::fs::remove_file(&conf).unwrap();
    v.run(&["ls"]).fails(code::CONFIG).says("intact init");
    v.run(&["put", "-", "/g"])
        .fails(code::CONFIG)
        .says("intact init");

    set(&orig);
    assert_eq!(v.run(&["cat", "/f"]).ok().stdout, b"data");
    v.run(&["fsck"]).ok();
}

// ---------------------------------------------------------------------------------------
// 4. Trusted anchor
// ---------------------------------------------------------------------------------------

#[test]
fn anchor_corrupt_missing_and_recovered() {
    let v = Vol::new();
    let data = random_bytes(50_000, 8);
    v.put("/f", &data, &[]);
    v.run(&["mkdir", "/d"]).ok();
    v.put("/d/g", b"gee", &[]);
    let anchor = v.anchor_path();
    assert!(anchor.is_file(), "no anchor at {}", anchor.display());
    let orig = std::fs::read(&anchor).unwrap();

    // The anchor file holds two slots (docs/file-format.md §1.2): a byte damaged in one
    // (as a write torn by a crash leaves it) falls back to the other, the anchor stored
    // just before, which the store still agrees with; damage in both is an error.
    assert_eq!(orig.len(), 1024);
    for off in [0, 300, 511, 512, 800, 1023] {
        flip_byte(&anchor, off);
        assert_eq!(v.run(&["cat", "/d/g"]).ok().stdout, b"gee", "byte {off}");
        std::fs::write(&anchor, &orig).unwrap();
    }
    for (a, b) in [(0, 512), (300, 1023)] {
        flip_byte(&anchor, a);
        flip_byte(&anchor, b);
        v.run(&["ls"]).fails(code::CONFIG).says("trusted anchor");
        v.run(&["put", "-", "/x"])
            .fails(code::CONFIG)
            .says("trusted anchor");
        std::fs::write(&anchor, &orig).unwrap();
    }
    std::fs::write(&anchor, &orig[..orig.len() / 2]).unwrap();
    v.run(&["ls"]).fails(code::CONFIG).says("trusted anchor");
    std::fs::write(&anchor, b"").unwrap();
    v.run(&["ls"]).fails(code::CONFIG).says("trusted anchor");
    std::fs::write(&anchor, &orig).unwrap();
    assert_eq!(v.run(&["cat", "/d/g"]).ok().stdout, b"gee");

    std::fs::remove_file(&anchor).unwrap();
    v.run(&["ls"])
        .fails(code::ANCHOR_MISSING)
        .says("recover-anchor");
    v.run(&["put", "-", "/x"])
        .fails(code::ANCHOR_MISSING)
        .says("recover-anchor");
    assert!(!anchor.exists(), "a failed open recreated the anchor");

    let r = v
        .run(&["recover-anchor"])
        .fails(code::OTHER)
        .says("--i-accept-rollback-risk");
    assert!(r.stderr.contains("rollback"), "{}", r.stderr);
    assert!(!anchor.exists());
    v.run_pw("wrong", &["recover-anchor", "--i-accept-rollback-risk"])
        .fails(code::PASSWORD);
    assert!(!anchor.exists());

    let r = v.run(&["recover-anchor", "--i-accept-rollback-risk"]).ok();
    assert!(r.out().contains("anchor restored"), "{}", r.out());
    assert!(anchor.is_file());
    assert!(v.get("/f") == data, "contents after recovery");
    assert_eq!(v.run(&["cat", "/d/g"]).ok().stdout, b"gee");
    v.run(&["fsck"]).ok();
    // Writable after recovery, and a second recovery has nothing to do.
    v.put("/after", b"after", &[]);
    assert_eq!(v.run(&["cat", "/after"]).ok().stdout, b"after");
    v.run(&["recover-anchor", "--i-accept-rollback-risk"])
        .fails(code::OTHER)
        .says("already exists");
}

#[test]
fn anchor_recovery_after_read_only_and_writable_sessions() {
    // Each writable open advances the trusted epoch; recovery must still give a volume that
    // opens, reads and writes.
    let v = Vol::new();
    v.put("/f", b"one", &[]);
    v.run(&["ls"]).ok();
    v.run(&["mkdir", "-p", "/"]).ok();
    std::fs::remove_file(v.anchor_path()).unwrap();
    v.run(&["recover-anchor", "--i-accept-rollback-risk"]).ok();
    assert_eq!(v.run(&["cat", "/f"]).ok().stdout, b"one");
    v.put("/f", b"two", &[]);
    assert_eq!(v.run(&["cat", "/f"]).ok().stdout, b"two");
    v.run(&["fsck"]).ok();
}

#[test]
fn rollback_of_the_cipher_directory_is_detected() {
    let v = Vol::new();
    v.put("/f", b"version one", &[]);
    let old = snapshot(&v.cipher);
    v.put("/f", b"version two!", &[]);
    // Restore every object of the old state (a rollback of the whole directory).
    for p in snapshot(&v.cipher).into_keys() {
        if p.is_file() && !old.contains_key(&p) {
            std::fs::remove_file(&p).unwrap();
        }
    }
    for (p, (bytes, _)) in &old {
        if !bytes.is_empty() || p.is_file() {
            std::fs::write(p, bytes).unwrap();
        }
    }
    let r = v.run(&["cat", "/f"]);
    assert_ne!(r.code, 0, "a rolled-back volume was read: {:?}", r.out());
    assert!(
        r.stdout != b"version one",
        "rolled-back contents were served"
    );
    assert!(
        [code::INTEGRITY, code::CONFIG].contains(&r.code),
        "exit {}: {}",
        r.code,
        r.stderr
    );
    assert!(
        r.stderr.contains("integrity failure") || r.stderr.contains("anchor"),
        "{}",
        r.stderr
    );
}

// ---------------------------------------------------------------------------------------
// 5. Tampering through the CLI
// ---------------------------------------------------------------------------------------

#[test]
fn tampered_data_object() {
    let v = Vol::new();
    // Big enough that `get` writes whole 1 MiB chunks before it reaches the damage.
    let data = random_bytes(640 * 4096 + 100, 5);
    v.run(&["mkdir", "/docs"]).ok();
    v.put("/docs/report.bin", &data, &[]);
    v.put("/ok.txt", b"fine", &[]);
    let largest = files_with_ext(&v.cipher, "d")
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("a .d object");
    let len = std::fs::metadata(&largest).unwrap().len() as usize;
    assert!(
        len >= data.len(),
        "largest .d object {} is {len} bytes",
        largest.display()
    );
    flip_byte(&largest, len / 10 * 9);

    let dst = v.tmp().join("out.bin");
    let r = v
        .run(&["get", "/docs/report.bin", dst.to_str().unwrap()])
        .fails(code::INTEGRITY);
    let r = r
        .says("/docs/report.bin")
        .says("block")
        .says("integrity failure");
    assert!(
        !r.stderr.contains("\n  "),
        "one-line message expected: {}",
        r.stderr
    );
    assert!(
        !dst.exists(),
        "a failed get left a truncated copy at {}",
        dst.display()
    );
    // An existing destination is not left half-written either.
    std::fs::write(&dst, b"old").unwrap();
    v.run(&["get", "/docs/report.bin", dst.to_str().unwrap()])
        .fails(code::INTEGRITY);
    assert!(!dst.exists());
    v.run(&["cat", "/docs/report.bin"])
        .fails(code::INTEGRITY)
        .says("/docs/report.bin");
    v.run(&["get", "/docs/report.bin", "-"])
        .fails(code::INTEGRITY);
    // Other files still read.
    assert_eq!(v.run(&["cat", "/ok.txt"]).ok().stdout, b"fine");

    let r = v
        .run(&["fsck"])
        .fails(code::INTEGRITY)
        .says("integrity failure");
    let out = r.out();
    let lines: Vec<&str> = out.lines().collect();
    assert!(!lines.is_empty(), "fsck printed no failures");
    for l in &lines {
        let rest = l
            .strip_prefix("/docs/report.bin: block ")
            .unwrap_or_else(|| panic!("fsck line {l:?}"));
        let (n, what) = rest
            .split_once(": ")
            .unwrap_or_else(|| panic!("fsck line {l:?}"));
        assert!(n.parse::<u64>().unwrap() <= 640, "block index {n}");
        assert!(!what.is_empty());
    }
    // In JSON mode the report is on stdout only.
    let r = v.run(&["--json", "fsck"]);
    assert_eq!(r.code, code::INTEGRITY, "{}", r.stderr);
    let j = r.json();
    assert_eq!(j["ok"], false);
    let f = j["failures"].as_array().unwrap();
    assert!(!f.is_empty());
    assert_eq!(f[0]["path"], "/docs/report.bin");
    assert!(f[0]["block"].is_u64(), "{j}");
}

#[test]
fn tampered_metadata_objects_never_panic() {
    // Damage every object in turn (one at a time) and run a reading command: it must fail
    // cleanly with a non-zero code or succeed with the right bytes; never panic.
    let v = Vol::new();
    v.run(&["mkdir", "/d"]).ok();
    v.put("/d/f", &random_bytes(9000, 1), &[]);
    let snap = snapshot(&v.cipher);
    for (p, (bytes, _)) in &snap {
        if !p.is_file() || bytes.is_empty() || p.ends_with("intact.conf") {
            continue;
        }
        flip_byte(p, bytes.len() / 3);
        let r = v.run(&["cat", "/d/f"]);
        if r.code == 0 {
            assert_eq!(
                r.stdout,
                random_bytes(9000, 1),
                "wrong bytes served after damaging {}",
                p.display()
            );
        } else {
            assert!(r.stderr.trim().len() > 10, "{}: {}", p.display(), r.stderr);
        }
        let f = v.run(&["fsck"]);
        assert!(
            f.code == 0 || f.code == code::INTEGRITY || f.code == code::CONFIG,
            "fsck after damaging {}: {} {}",
            p.display(),
            f.code,
            f.stderr
        );
        std::fs::write(p, bytes).unwrap();
    }
    v.run(&["fsck"]).ok();
}

// ---------------------------------------------------------------------------------------
// 6. Usage errors
// ---------------------------------------------------------------------------------------

#[test]
fn usage_errors() {
    let v = Vol::new();
    // A missing cipher directory.
    let gone = v.tmp().join("not-there");
    let mut c = bare();
    c.arg("--volume")
        .arg(&gone)
        .arg("--state")
        .arg(&v.state)
        .arg("ls");
    exec(c, "ls on a missing dir".into())
        .fails(code::CONFIG)
        .says("no such directory")
        .says("not-there");
    assert!(!gone.exists());

    // No volume at all.
    let mut c = bare();
    c.arg("ls");
    exec(c, "ls without --volume".into())
        .fails(code::OTHER)
        .says("--volume")
        .says("INTACT_VOLUME");

    // INTACT_VOLUME works in place of --volume.
    let mut c = bare();
    c.env("INTACT_VOLUME", &v.cipher)
        .env("INTACT_STATE", &v.state)
        .args(["mkdir", "/via-env"]);
    exec(c, "mkdir via env".into()).ok();
    assert_eq!(v.run(&["ls"]).ok().out(), "via-env\n");

    // A directory that is not a volume.
    let empty = v.tmp().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let mut c = bare();
    c.env("INTACT_VOLUME", &empty)
        .env("INTACT_STATE", &v.state)
        .arg("ls");
    exec(c, "ls on a non-volume".into())
        .fails(code::CONFIG)
        .says("intact init");

    // init on a non-empty directory, and on an existing volume.
    let full = v.tmp().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), b"x").unwrap();
    v.run(&[
        "init",
        full.to_str().unwrap(),
        "--kdf-memory",
        "64",
        "--kdf-passes",
        "1",
    ])
    .fails(code::CONFIG)
    .says("not empty");
    assert_eq!(
        std::fs::read_dir(&full).unwrap().count(),
        1,
        "init wrote into a non-empty dir"
    );
    let conf = std::fs::read(v.config_path()).unwrap();
    v.run(&[
        "init",
        v.cipher.to_str().unwrap(),
        "--kdf-memory",
        "64",
        "--kdf-passes",
        "1",
    ])
    .fails(code::CONFIG)
    .says("already exists");
    assert_eq!(std::fs::read(v.config_path()).unwrap(), conf);
    // init where a file is in the way.
    v.run(&["init", full.join("x").to_str().unwrap()])
        .fails(code::OTHER)
        .says("creating");

    // Clap usage errors.
    v.run(&["frobnicate"]).fails(2);
    v.run(&["put"]).fails(2);
    assert!(v.run(&["--help"]).ok().out().contains("recover-anchor"));
}

#[test]
fn passfile() {
    let v = Vol::blank();
    let pf = v.tmp().join("pass");
    std::fs::write(&pf, format!("{PW}\nignored second line\n")).unwrap();
    let run = |args: &[&str]| {
        let mut c = v.cmd(args);
        c.env_remove("INTACT_PASSWORD").arg("--passfile").arg(&pf);
        exec(c, format!("{} with passfile", args.join(" ")))
    };
    run(&[
        "init",
        v.cipher.to_str().unwrap(),
        "--kdf-memory",
        "64",
        "--kdf-passes",
        "1",
    ])
    .ok();
    run(&["mkdir", "/p"]).ok();
    // The passfile's first line is the same password as INTACT_PASSWORD.
    assert_eq!(v.run(&["ls"]).ok().out(), "p\n");
    // The passfile takes precedence over the environment.
    let mut c = v.cmd(&["ls"]);
    c.env("INTACT_PASSWORD", "wrong").arg("--passfile").arg(&pf);
    exec(c, "ls passfile over env".into()).ok();

    std::fs::write(&pf, b"").unwrap();
    run(&["ls"])
        .fails(code::OTHER)
        .says("passfile")
        .says("empty");
    std::fs::write(&pf, b"\nsecond").unwrap();
    run(&["ls"]).fails(code::OTHER).says("empty");
    std::fs::write(&pf, b"not it\n").unwrap();
    run(&["ls"]).fails(code::PASSWORD).says("wrong password");
    std::fs::remove_file(&pf).unwrap();
    run(&["ls"]).fails(code::OTHER).says("passfile");
    v.run_pw("", &["ls"])
        .fails(code::OTHER)
        .says("INTACT_PASSWORD is empty");
}

// ---------------------------------------------------------------------------------------
// 7. One writer at a time
// ---------------------------------------------------------------------------------------

fn open_lib(v: &Vol, read_only: bool) -> intact_core::Volume {
    use intact_core::store::{LocalDirStore, UntrustedStore};
    use std::sync::Arc;
    let store: Arc<dyn UntrustedStore> = Arc::new(LocalDirStore::open(&v.cipher).unwrap());
    intact_core::volume::read_config(store.as_ref()).unwrap();
    let trusted = intact_core::Volume::state_for(store.as_ref(), &v.state).unwrap();
    let opts = intact_core::Options {
        cache_bytes: 1 << 16,
        read_only,
        ..intact_core::Options::default()
    };
    intact_core::Volume::open(store, Box::new(trusted), PW.as_bytes(), &opts).unwrap()
}

#[test]
fn one_writer_at_a_time() {
    let v = Vol::new();
    v.put("/f", b"before", &[]);

    let lib = open_lib(&v, false);
    let cipher = snapshot(&v.cipher);
    v.run_stdin(&["put", "-", "/g"], b"x")
        .fails(code::LOCKED)
        .says("in use");
    v.run(&["mkdir", "/d"]).fails(code::LOCKED).says("in use");
    // Readers take a shared lock, which an open writer excludes.
    v.run(&["cat", "/f"])
        .fails(code::LOCKED)
        .says("in use")
        .says("for writing");
    v.run(&["fsck"]).fails(code::LOCKED).says("in use");
    assert!(
        snapshot(&v.cipher) == cipher,
        "a refused command changed the cipher directory"
    );
    // The library handle still works and its writes land.
    lib.write_path("/f", 0, b"BEFORE").unwrap();
    lib.sync().unwrap();
    drop(lib);

    assert_eq!(v.run_after_release(&["cat", "/f"]).ok().stdout, b"BEFORE");
    v.run_stdin(&["put", "-", "/g"], b"x").ok();

    // A read-only holder admits readers but not writers.
    let ro = open_lib(&v, true);
    assert_eq!(v.run(&["cat", "/g"]).ok().stdout, b"x");
    v.run(&["rm", "/g"]).fails(code::LOCKED).says("in use");
    drop(ro);
    v.run_after_release(&["rm", "/g"]).ok();
    v.run(&["fsck"]).ok();
}

// ---------------------------------------------------------------------------------------
// 8. After an alarm: explain, look without trusting, accept on purpose, salvage, scrub
// ---------------------------------------------------------------------------------------

/// Copies a directory tree, keeping times (`cp -a`).
fn copy_tree(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

/// The data object (`.d`) of the file at `path`, found by its file id.
fn data_object(v: &Vol, path: &str) -> PathBuf {
    let id = v.run(&["--json", "stat", path]).ok().json()["file_id"]
        .as_str()
        .unwrap()
        .to_string();
    files_with_ext(&v.cipher, "d")
        .into_iter()
        .find(|p| p.to_string_lossy().contains(&id))
        .unwrap()
}

/// The cipher directory and the anchor, byte for byte and with their times.
type Files = BTreeMap<PathBuf, (Vec<u8>, SystemTime)>;

fn everything(v: &Vol) -> (Files, Vec<u8>) {
    (snapshot(&v.cipher), std::fs::read(v.anchor_path()).unwrap())
}

/// The library's `--accept-stale` open: the cipher directory's own state, read-only.
fn open_lib_stale(v: &Vol) -> intact_core::Volume {
    use intact_core::store::{LocalDirStore, UntrustedStore};
    use std::sync::Arc;
    let store: Arc<dyn UntrustedStore> = Arc::new(LocalDirStore::open(&v.cipher).unwrap());
    let trusted = intact_core::Volume::state_for(store.as_ref(), &v.state).unwrap();
    let opts = intact_core::Options {
        read_only: true,
        ..intact_core::Options::default()
    };
    intact_core::Volume::open_stale(store, Box::new(trusted), PW.as_bytes(), &opts).unwrap()
}

#[test]
fn a_whole_volume_rollback_is_explained_looked_at_and_accepted_on_purpose() {
    let v = Vol::new();
    v.put("/a", b"one", &[]);
    let oldest = v.tmp().join("oldest");
    copy_tree(&v.cipher, &oldest);
    v.put("/b", b"two", &[]);
    let older = v.tmp().join("older");
    copy_tree(&v.cipher, &older);
    v.put("/c", b"three", &[]);
    let epoch_now = v.info()["epoch"].as_u64().unwrap();
    // A backup restored by hand: the whole cipher directory goes back.
    copy_tree(&older, &v.cipher);

    let r = v.run(&["ls", "/"]).fails(code::INTEGRITY);
    let r = r.says("integrity failure").says("an older state");
    for next in [
        "intact --accept-stale ls /",
        "intact accept-store",
        "restored or synced back",
    ] {
        assert!(r.stderr.contains(next), "no {next:?} in:\n{}", r.stderr);
    }
    // info says the same in fields, and fails the same way.
    let r = v.run(&["--json", "info"]).fails(code::INTEGRITY);
    let j = r.json();
    assert_eq!(j["state"]["verdict"], "store_older", "{j}");
    assert_eq!(j["state"]["anchor"]["epoch"].as_u64(), Some(epoch_now));
    let store_epoch = j["state"]["store"]["seal"]["epoch"].as_u64().unwrap();
    assert!(store_epoch < epoch_now, "{j}");
    assert!(j["state"]["anchor"]["stored_unix"].as_u64().is_some());
    let r = v.run(&["info"]).fails(code::INTEGRITY);
    assert!(r.out().contains("OLDER than the anchor's"), "{}", r.out());

    // A look without trusting: the older state, with a warning, and nothing written.
    let before = everything(&v);
    let r = v.run(&["--accept-stale", "ls", "/"]).ok().says("WARNING");
    assert_eq!(r.out().split_whitespace().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(v.run(&["--accept-stale", "cat", "/b"]).ok().stdout, b"two");
    v.run(&["--accept-stale", "fsck"]).ok();
    let r = v.run(&["--accept-stale", "info"]).ok().says("WARNING");
    assert!(r.out().contains("OLDER than the anchor's"), "{}", r.out());
    let src = v.tmp().join("x");
    std::fs::write(&src, b"x").unwrap();
    v.run(&["--accept-stale", "put", src.to_str().unwrap(), "/x"])
        .fails(code::OTHER)
        .says("only reads");
    assert!(everything(&v) == before, "--accept-stale changed something");

    // Accepting needs a confirmation; without one nothing changes. Nor while the volume
    // is open (here by a reader of its own state).
    v.run(&["accept-store"])
        .fails(code::OTHER)
        .says("not confirmed");
    let holder = open_lib_stale(&v);
    v.run(&["accept-store", "--yes"])
        .fails(code::OTHER)
        .says("refused while the volume is open");
    drop(holder);
    assert!(everything(&v) == before);
    let r = v
        .run_after_release(&["--json", "accept-store", "--yes"])
        .ok();
    let j = r.json();
    let new_epoch = j["new_epoch"].as_u64().unwrap();
    assert!(new_epoch > epoch_now, "{j}");
    let kept = PathBuf::from(j["kept_anchor"].as_str().unwrap());
    assert_eq!(
        std::fs::read(&kept).unwrap(),
        newest_slot(&before.1),
        "the replaced anchor is kept"
    );
    let audit = std::fs::read_to_string(j["audit_log"].as_str().unwrap()).unwrap();
    let line: serde_json::Value = serde_json::from_str(audit.trim()).unwrap();
    assert_eq!(line["event"], "accept-store");
    assert_eq!(line["verdict"], "store_older");
    assert_eq!(line["old_epoch"].as_u64(), Some(epoch_now));
    assert_eq!(line["store_epoch"].as_u64(), Some(store_epoch));
    assert_eq!(line["new_epoch"].as_u64(), Some(new_epoch));

    // Then the volume works as usual...
    let r = v.run(&["ls", "/"]).ok();
    assert_eq!(r.out().split_whitespace().collect::<Vec<_>>(), ["a", "b"]);
    v.put("/d", b"four", &[]);
    v.run(&["fsck"]).ok();
    assert_eq!(v.info()["state"]["verdict"], "same");
    // ...and a rollback to an even older copy is detected again.
    copy_tree(&oldest, &v.cipher);
    v.run(&["cat", "/a"])
        .fails(code::INTEGRITY)
        .says("an older state");
    // Nothing to accept when the store is the anchor's state.
    copy_tree(&older, &v.cipher);
}

#[test]
fn a_store_newer_than_the_anchor_and_a_damaged_object_are_explained() {
    let v = Vol::new();
    v.put("/a", b"one", &[]);
    // The state directory comes back from an older backup (or another machine wrote on).
    let anchor = std::fs::read(v.anchor_path()).unwrap();
    v.put("/b", b"two", &[]);
    std::fs::write(v.anchor_path(), &anchor).unwrap();
    let r = v
        .run(&["ls", "/"])
        .fails(code::INTEGRITY)
        .says("a newer state");
    assert!(r.stderr.contains("another machine"), "{}", r.stderr);
    assert_eq!(
        v.run(&["--json", "info"]).fails(code::INTEGRITY).json()["state"]["verdict"],
        "store_newer"
    );
    // accept-store takes the newer state.
    v.run(&["accept-store", "--yes"]).ok();
    assert_eq!(v.run(&["cat", "/b"]).ok().stdout, b"two");
    v.run(&["accept-store", "--yes"])
        .fails(code::OTHER)
        .says("nothing to accept");

    // The inode table damaged in place: the state is the anchor's, an object is not. (A
    // file past the bytes kept in the table's slots, so that it has a data object.)
    let v = Vol::new();
    v.put("/a", &[1u8; 5000], &[]);
    // Every data object but the file's (the inode table's among them).
    let own = data_object(&v, "/a");
    for p in files_with_ext(&v.cipher, "d") {
        if p != own {
            flip_byte(&p, 20);
        }
    }
    let r = v
        .run(&["ls", "/"])
        .fails(code::INTEGRITY)
        .says("damaged or changed");
    assert!(r.stderr.contains("intact fsck --salvage"), "{}", r.stderr);
}

#[test]
fn conflict_copies_a_foreign_volume_and_a_missing_store_are_explained() {
    let v = Vol::new();
    v.put("/a", b"one", &[]);
    // A sync tool's conflict copies of our own files.
    std::fs::write(
        v.cipher.join("journal.1 (conflicted copy 2026-11-25)"),
        b"x",
    )
    .unwrap();
    std::fs::write(
        v.cipher
            .join("log.0000000100000002.sync-conflict-20261125-101010-ABCDEFG"),
        b"y",
    )
    .unwrap();
    let r = v.run(&["info"]).ok();
    assert!(r.out().contains("conflict copies:    2"), "{}", r.out());
    let j = v.info();
    assert_eq!(j["state"]["conflicts"].as_array().unwrap().len(), 2, "{j}");
    // With a failure, the explanation names them.
    let anchor = std::fs::read(v.anchor_path()).unwrap();
    v.put("/b", b"two", &[]);
    std::fs::write(v.anchor_path(), &anchor).unwrap();
    v.run(&["ls", "/"])
        .fails(code::INTEGRITY)
        .says("2 conflict copies")
        .says("one writer per volume");

    // Another volume's cipher directory, with this volume's state directory.
    let other = Vol::new();
    let r = exec(
        {
            let mut c = bare();
            c.arg("--volume")
                .arg(&other.cipher)
                .arg("--state")
                .arg(&v.state)
                .args(["ls", "/"]);
            c
        },
        "ls of another volume".into(),
    )
    .fails(code::ANCHOR_MISSING);
    let r = r.says("another volume");
    assert!(r.stderr.contains(&v.volume_id()), "{}", r.stderr);

    // No cipher directory where one was.
    let gone = Vol::blank();
    std::fs::create_dir_all(&gone.cipher).unwrap();
    gone.run(&["ls", "/"])
        .fails(code::CONFIG)
        .says("no intact volume here")
        .says("moved, deleted, or not synced");
}

#[test]
fn fsck_salvage_keeps_every_block_that_authenticates_and_quarantines() {
    let v = Vol::new();
    v.run(&["mkdir", "/d"]).ok();
    let f = random_bytes(10 * 4096 + 123, 7);
    let g = random_bytes(5000, 8);
    v.put("/d/f", &f, &[]);
    v.put("/g", &g, &[]);
    v.run(&["ln", "-s", "d/f", "/link"]).ok();
    let data = data_object(&v, "/d/f");
    // Block 5 of the data object (its nonces and tags are in the metadata object).
    flip_byte(&data, 5 * 4096 + 100);
    let out = v.tmp().join("salvaged");
    let r = v
        .run(&["fsck", "--salvage", out.to_str().unwrap()])
        .fails(code::INTEGRITY);
    assert!(
        r.out().contains("/d/f: damaged") && r.out().contains("bytes 20480..24576"),
        "{}",
        r.out()
    );
    let got = std::fs::read(out.join("d/f")).unwrap();
    assert_eq!(got.len(), f.len());
    let mut want = f.clone();
    want[20480..24576].fill(0);
    assert!(
        got == want,
        "every other block byte for byte, the damaged one a hole"
    );
    assert_eq!(std::fs::read(out.join("g")).unwrap(), g);
    assert_eq!(
        std::fs::read_link(out.join("link")).unwrap(),
        Path::new("d/f")
    );
    // Into a directory that is not empty: refused.
    v.run(&["fsck", "--salvage", out.to_str().unwrap()])
        .fails(code::OTHER)
        .says("not empty");
    // Quarantine: the damaged file moves to /lost+found.
    let out2 = v.tmp().join("salvaged2");
    let r = v.run(&[
        "--json",
        "fsck",
        "--salvage",
        out2.to_str().unwrap(),
        "--quarantine",
    ]);
    assert_eq!(r.code, code::INTEGRITY, "{}", r.stderr);
    assert_eq!(r.json()["damaged"][0]["quarantined"], "/lost+found/d%f");
    assert_eq!(v.run(&["ls", "/lost+found"]).ok().out().trim(), "d%f");
    assert_eq!(v.run(&["ls", "/d"]).ok().out().trim(), "");
    assert_eq!(v.get("/g"), g);
}

#[test]
fn scrub_resumes_where_it_stopped_and_verifies_every_byte_once() {
    let v = Vol::new();
    v.run(&["mkdir", "/d"]).ok();
    let mut total = 0;
    for i in 0..6u64 {
        let data = random_bytes(300_000 + i as usize * 70_000, i);
        total += data.len() as u64;
        v.put(&format!("/d/f{i}"), &data, &[]);
    }
    v.put("/empty", b"", &[]);
    let cursor = v.state.join(v.volume_id()).join("scrub.cursor");
    let last = v.state.join(v.volume_id()).join("scrub.last");
    // A run that stops after about a third (at a chunk's end), then one that goes on.
    let r = v
        .run(&[
            "--json",
            "scrub",
            "--threads",
            "2",
            "--limit-bytes",
            "800000",
        ])
        .ok();
    let a = r.json();
    assert_eq!(a["complete"], false, "{a}");
    assert!(cursor.exists() && !last.exists());
    let first = a["bytes_verified"].as_u64().unwrap();
    assert!((800_000..total).contains(&first), "{a}");
    let b = v
        .run(&["--json", "scrub", "--threads", "2", "--rate", "1000"])
        .ok()
        .json();
    assert_eq!(b["complete"], true, "{b}");
    assert_eq!(b["resumed"], true, "{b}");
    assert_eq!(
        first + b["bytes_verified"].as_u64().unwrap(),
        total,
        "every byte verified once over the two runs: {a} {b}"
    );
    assert_eq!(b["pass_bytes"].as_u64(), Some(total));
    assert_eq!(b["files"].as_u64(), Some(7));
    assert!(!cursor.exists() && last.exists());
    // At 2 MB/s, a pass takes at least its bytes' time (a lower bound: never flaky).
    let c = v.run(&["--json", "scrub", "--rate", "2"]).ok().json();
    assert_eq!(c["bytes_verified"].as_u64(), Some(total));
    let floor = total as f64 / 2e6;
    assert!(
        c["seconds"].as_f64().unwrap() >= floor * 0.95,
        "{c} (floor {floor} s)"
    );
    // A new pass verifies everything again, and names a damaged block.
    let data = data_object(&v, "/d/f3");
    flip_byte(&data, 3 * 4096 + 9);
    let r = v.run(&["scrub"]).fails(code::INTEGRITY);
    assert!(r.out().contains("/d/f3: integrity failure"), "{}", r.out());
    assert!(r.out().contains("block 3"), "{}", r.out());
}

#[test]
fn scrub_stops_on_ctrl_c_keeps_its_place_and_goes_on() {
    let v = Vol::new();
    let mut total = 0;
    for i in 0..4u64 {
        let data = random_bytes(700_000, 40 + i);
        total += data.len() as u64;
        v.put(&format!("/f{i}"), &data, &[]);
    }
    let cursor = v.state.join(v.volume_id()).join("scrub.cursor");
    // At 1 MB/s the pass takes about 3 s: interrupted once its cursor is on disk.
    let child = v
        .cmd(&["--json", "scrub", "--rate", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !cursor.exists() {
        assert!(t.elapsed().as_secs() < 20, "no cursor");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: kill(2) with the pid of our own child, which has not been waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let r = Run::from(
        child.wait_with_output().unwrap(),
        "scrub, interrupted".into(),
    )
    .ok();
    let a = r.json();
    assert_eq!(a["complete"], false, "{a}");
    assert!(cursor.exists());
    let first = a["bytes_verified"].as_u64().unwrap();
    assert!(first > 0 && first < total, "{a}");
    let b = v.run(&["--json", "scrub"]).ok().json();
    assert_eq!(b["complete"], true, "{b}");
    assert_eq!(
        first + b["bytes_verified"].as_u64().unwrap(),
        total,
        "every byte once: {a} {b}"
    );
    assert!(!cursor.exists());
}

/// The anchor in the newest slot of an anchor file (docs/file-format.md §1.2: `ISLT`, the
/// sequence number u64, the length u16, the anchor).
fn newest_slot(file: &[u8]) -> Vec<u8> {
    assert_eq!(file.len(), 1024);
    let slot = |i: usize| &file[i * 512..(i + 1) * 512];
    let seq = |s: &[u8]| u64::from_le_bytes(s[4..12].try_into().unwrap());
    let s = if seq(slot(0)) > seq(slot(1)) {
        slot(0)
    } else {
        slot(1)
    };
    assert_eq!(&s[..4], b"ISLT");
    let len = u16::from_le_bytes(s[12..14].try_into().unwrap()) as usize;
    s[14..14 + len].to_vec()
}

/// The environment a running `intact` process started with (`/proc/PID/environ`), while it
/// waits for its password on a pipe; `GLIBC_TUNABLES` as it was, or `None`.
fn tunables_of_a_running_intact(env: &[(&str, &str)]) -> Option<String> {
    let v = Vol::new();
    let mut c = v.cmd(&["ls"]);
    c.env_remove("INTACT_PASSWORD")
        .env_remove("GLIBC_TUNABLES")
        .env_remove("INTACT_HUGE_PAGES")
        .envs(env.iter().copied())
        .arg("--passfile")
        .arg("/dev/stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = c.spawn().expect("start intact");
    let environ = format!("/proc/{}/environ", child.id());
    // The process is ready once it waits for its password on the pipe: past its restart,
    // which comes first in `main`.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = None;
    while std::time::Instant::now() < until {
        let wchan = std::fs::read_to_string(format!("/proc/{}/wchan", child.id()));
        if wchan.is_ok_and(|w| w.contains("pipe")) {
            seen = Some(std::fs::read(&environ).expect("read its environment"));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut stdin = child.stdin.take().expect("piped");
    writeln!(stdin, "{PW}").unwrap();
    drop(stdin);
    let out = child.wait_with_output().expect("wait for intact");
    assert!(
        out.status.success(),
        "ls with the password on a pipe failed"
    );
    let seen = seen.expect("intact never waited for its password on the pipe");
    seen.split(|&b| b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("GLIBC_TUNABLES=").map(str::to_string))
}

/// Huge pages for the heap (crates/intact/src/hugepages.rs; docs/performance.md, "Huge
/// pages for the heap"): where the kernel gives transparent huge pages only when asked,
/// `intact` runs with glibc's tunable that asks, keeps the caller's other tunables, leaves
/// a caller's own choice alone, and does nothing with `INTACT_HUGE_PAGES=0`.
#[test]
fn intact_asks_for_huge_pages_where_the_kernel_waits_to_be_asked() {
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let asks = mode.contains("[madvise]");
    let gnu = cfg!(target_env = "gnu");
    let want = |s: &str| (asks && gnu).then(|| s.to_string());
    assert_eq!(
        tunables_of_a_running_intact(&[]),
        want("glibc.malloc.hugetlb=1"),
        "THP mode {mode:?}"
    );
    // The caller's tunables are kept, after this one (glibc cuts the variable at each `:`
    // as it reads it: the process's environment shows the first).
    let with_other =
        tunables_of_a_running_intact(&[("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")]);
    if asks && gnu {
        assert!(
            with_other
                .as_deref()
                .is_some_and(|t| t.starts_with("glibc.malloc.hugetlb=1")),
            "{with_other:?}"
        );
    } else {
        assert_eq!(with_other.as_deref(), Some("glibc.malloc.arena_max=4"));
    }
    assert_eq!(
        tunables_of_a_running_intact(&[("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")]),
        Some("glibc.malloc.hugetlb=0".into())
    );
    assert_eq!(
        tunables_of_a_running_intact(&[("INTACT_HUGE_PAGES", "0")]),
        None
    );
}
