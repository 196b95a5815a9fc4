//! Signed roots (issue 9): a writer with `--sign-key` signs every anchor it stores; a
//! reader with `--verify-key` (the public key only) accepts only roots signed by it, under
//! every algorithm `intact keygen` makes, through the CLI and a read-only mount.

#[allow(dead_code)]
mod common;

use common::vol::{Vol, INTEGRITY};
use std::path::PathBuf;

/// `intact keygen --alg ALG --out DIR/NAME`: the private and public key paths.
fn keygen(v: &Vol, alg: &str, name: &str) -> (String, String) {
    let k = v.dir.path().join(name);
    let r = v
        .run(&["keygen", "--alg", alg, "--out", k.to_str().unwrap()])
        .ok();
    let pubk = PathBuf::from(format!("{}.pub", k.display()));
    assert!(
        r.stdout.contains(&pubk.display().to_string()),
        "{}",
        r.stdout
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&k).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the private key is the owner's alone");
    (
        k.to_str().unwrap().to_string(),
        pubk.to_str().unwrap().to_string(),
    )
}

#[test]
fn each_algorithm_signs_roots_that_only_its_public_key_opens() {
    for alg in [
        "ed25519",
        "ecdsa-p256",
        "ecdsa-p384",
        "ecdsa-p521",
        "rsa-pss-3072",
    ] {
        let v = Vol::new();
        let (key, pubk) = keygen(&v, alg, "writer");
        let (_, other) = keygen(&v, alg, "other");
        v.init(None);
        v.put_with(&["--sign-key", &key], "/f", alg.as_bytes()).ok();
        let r = v.run(&["--verify-key", &pubk, "cat", "/f"]).ok();
        assert_eq!(r.stdout, alg);
        let info = v.run(&["--verify-key", &pubk, "info"]).ok();
        assert!(
            info.stdout.contains("roots checked against"),
            "{}",
            info.stdout
        );
        let r = v.run(&["--verify-key", &other, "cat", "/f"]);
        assert_eq!(r.code, INTEGRITY, "{alg}: {}", r.stderr);
        assert!(r.stderr.contains("does not verify"), "{alg}: {}", r.stderr);
    }
}

#[test]
fn a_root_stored_without_the_key_is_refused_by_readers() {
    let v = Vol::new();
    let (key, pubk) = keygen(&v, "ed25519", "writer");
    v.init(None);
    // The volume's first roots were not signed.
    let r = v.run(&["--verify-key", &pubk, "ls", "/"]);
    assert_eq!(r.code, INTEGRITY, "{}", r.stderr);
    assert!(r.stderr.contains("not signed"), "{}", r.stderr);
    v.put_with(&["--sign-key", &key], "/a", b"signed").ok();
    v.run(&["--verify-key", &pubk, "ls", "/"]).ok();
    // Someone with the password but not the key writes: a root readers refuse.
    v.put("/b", b"by a password holder").ok();
    let r = v.run(&["--verify-key", &pubk, "cat", "/a"]);
    assert_eq!(r.code, INTEGRITY, "{}", r.stderr);
    assert!(r.stderr.contains("not signed"), "{}", r.stderr);
    // Until the writer signs again.
    v.put_with(&["--sign-key", &key], "/c", b"signed again")
        .ok();
    assert_eq!(
        v.run(&["--verify-key", &pubk, "cat", "/b"]).ok().stdout,
        "by a password holder"
    );
}

#[test]
fn a_verify_key_only_reads_and_bad_keys_are_clear_errors() {
    let v = Vol::new();
    let (key, pubk) = keygen(&v, "ed25519", "writer");
    v.init(None);
    let r = v.put_with(&["--verify-key", &pubk], "/f", b"x");
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("--verify-key is for readers"),
        "{}",
        r.stderr
    );
    // With the signing key too, a writer checks the roots it opens: not yet signed here.
    let r = v.put_with(&["--sign-key", &key, "--verify-key", &pubk], "/f", b"x");
    assert_eq!(r.code, INTEGRITY, "{}", r.stderr);
    assert!(r.stderr.contains("not signed"), "{}", r.stderr);
    assert!(
        !r.stderr.contains("There is no trusted anchor"),
        "{}",
        r.stderr
    );
    v.put_with(&["--sign-key", &key], "/f", b"x").ok();
    v.put_with(&["--sign-key", &key, "--verify-key", &pubk], "/g", b"y")
        .ok();
    // keygen never overwrites; unknown algorithms and files that are not keys are named.
    let k = v.dir.path().join("writer");
    let r = v.run(&["keygen", "--out", k.to_str().unwrap()]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("must not exist"), "{}", r.stderr);
    let r = v.run(&["keygen", "--alg", "rsa-15360", "--out", "/tmp/never"]);
    assert!(r.stderr.contains("unknown key algorithm"), "{}", r.stderr);
    let r = v.run(&["--verify-key", &key, "ls", "/"]);
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("not an intact verification key"),
        "{}",
        r.stderr
    );
    let r = v.put_with(&["--sign-key", &pubk], "/h", b"x");
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("PKCS#8"), "{}", r.stderr);
}

#[test]
fn a_read_only_mount_checks_the_roots() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let v = Vol::new();
    let (key, pubk) = keygen(&v, "ecdsa-p256", "writer");
    let (_, other) = keygen(&v, "ecdsa-p256", "other");
    v.init(None);
    v.put_with(&["--sign-key", &key], "/f", b"through the mount")
        .ok();
    let mnt = v.dir.path().join("mnt");
    let Some((mut daemon, _log)) =
        common::vol::mount(&v, &mnt, &["--verify-key", &pubk], &["--ro"])
    else {
        return;
    };
    let got = std::fs::read(mnt.join("f"));
    let (ok, _) = common::unmount_or_kill(&mnt, &mut daemon, 100);
    assert_eq!(got.unwrap(), b"through the mount");
    assert!(ok, "unmounted");
    // Under another key the mount is refused before it mounts: exit 10.
    let mut m = Command::new(common::vol::BIN)
        .env("INTACT_PASSWORD", common::vol::PW)
        .env("INTACT_STATE", v.state())
        .args(["--verify-key", &other, "mount"])
        .arg(v.cipher())
        .arg(&mnt)
        .args(["-f", "--ro"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = m.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > until {
            let _ = common::unmount_or_kill(&mnt, &mut m, 10);
            panic!("a mount under another key went on");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(INTEGRITY));
}

/// `args` run as a reader on another machine: the same cipher directory, the state
/// directory `state` of that machine (it holds no anchor), and the public key.
fn elsewhere(v: &Vol, state: &std::path::Path, pubk: &str, args: &[&str]) -> common::vol::Run {
    let mut a = vec!["--state", state.to_str().unwrap(), "--verify-key", pubk];
    a.extend_from_slice(args);
    v.run(&a)
}

/// Replaces the cipher directory with a copy of `from` (an adversary's rollback).
fn put_back(v: &Vol, from: &std::path::Path) {
    std::fs::remove_dir_all(v.cipher()).unwrap();
    copy_dir(from, &v.cipher());
}

#[test]
fn a_reader_on_another_machine_reads_the_published_root_never_an_older_one() {
    let v = Vol::new();
    let (key, pubk) = keygen(&v, "ed25519", "writer");
    v.init(None);
    v.put_with(&["--sign-key", &key], "/f", b"first").ok();
    assert!(
        v.cipher().join("anchor.signed").exists(),
        "the writer publishes its signed root in the store"
    );
    let b = v.dir.path().join("machine-b");
    assert_eq!(
        elsewhere(&v, &b, &pubk, &["cat", "/f"]).ok().stdout,
        "first"
    );
    let info = elsewhere(&v, &b, &pubk, &["info"]).ok();
    assert!(
        info.stdout.contains("anchor.signed in the store")
            && info
                .stdout
                .contains("no older than the newest this machine has seen"),
        "{}",
        info.stdout
    );
    // Without the key, machine B has no anchor to trust.
    let r = v.run(&["--state", b.to_str().unwrap(), "cat", "/f"]);
    assert_ne!(r.code, 0, "{}", r.stdout);
    // On the writer's machine the reader reads the trusted anchor itself.
    let info = v.run(&["--verify-key", &pubk, "info"]).ok();
    assert!(
        info.stdout.contains("fresh: the newest root"),
        "{}",
        info.stdout
    );

    // An adversary keeps the store as it is, the writer goes on, B reads the newer root.
    let old = v.dir.path().join("old");
    copy_dir(&v.cipher(), &old);
    v.put_with(&["--sign-key", &key], "/f", b"second").ok();
    assert_eq!(
        elsewhere(&v, &b, &pubk, &["cat", "/f"]).ok().stdout,
        "second"
    );
    // The whole store put back (its published root with it): B has read a newer epoch.
    put_back(&v, &old);
    let r = elsewhere(&v, &b, &pubk, &["cat", "/f"]);
    assert_eq!(r.code, INTEGRITY, "{}", r.stderr);
    assert!(r.stderr.contains("older than epoch"), "{}", r.stderr);
    // A machine that never read the volume has nothing to compare with: it reads the older
    // root, authentic and signed (the limit of freshness without the trusted anchor).
    let c = v.dir.path().join("machine-c");
    assert_eq!(
        elsewhere(&v, &c, &pubk, &["cat", "/f"]).ok().stdout,
        "first"
    );
    // The writer's machine holds the anchor: the rollback is caught there as always.
    assert_eq!(v.cat("/f").code, INTEGRITY);
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let s = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(s.success());
}

#[test]
fn an_rsa_key_of_15360_bits_made_by_openssl_is_imported_and_signs() {
    let v = Vol::new();
    let made = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../intact-core/testdata/rsa-15360-test-only.der"
    );
    let k = v.dir.path().join("big");
    let r = v
        .run(&["keygen", "--import", made, "--out", k.to_str().unwrap()])
        .ok();
    assert!(r.stdout.contains("rsa-pss-sha512 key"), "{}", r.stdout);
    let pubk = format!("{}.pub", k.display());
    v.init(None);
    v.put_with(&["--sign-key", k.to_str().unwrap()], "/f", b"15360 bits")
        .ok();
    let r = v.run(&["--verify-key", &pubk, "cat", "/f"]).ok();
    assert_eq!(r.stdout, "15360 bits");
    let (_, other) = keygen(&v, "rsa-pss-3072", "other");
    let r = v.run(&["--verify-key", &other, "cat", "/f"]);
    assert_eq!(r.code, INTEGRITY, "{}", r.stderr);
    // What is not a key is named.
    let junk = v.dir.path().join("junk");
    std::fs::write(&junk, b"not a key").unwrap();
    let out = v.dir.path().join("never");
    let r = v.run(&[
        "keygen",
        "--import",
        junk.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("PKCS#1 too"), "{}", r.stderr);
    assert!(!out.exists(), "nothing written for a bad key");
}

/// A mount without `-f` runs its daemon as a process of its own, which reads its own
/// command line: the keys given as flags must reach it. A reader's `--verify-key` of
/// another key is refused before anything is mounted (exit 10), and a writer's
/// `--sign-key` signs the roots its daemon stores, which a reader holding only the public
/// key then opens. (The daemon took neither: the reader mounted unsigned roots, the
/// writer stored them unsigned.)
#[test]
fn a_mount_daemon_gets_the_keys_given_as_flags() {
    if !common::need(&["fusermount3"]) {
        return;
    }
    let v = Vol::new();
    let (key, pubk) = keygen(&v, "ed25519", "writer");
    let (_, other) = keygen(&v, "ed25519", "other");
    v.init(None);
    v.put_with(&["--sign-key", &key], "/f", b"signed").ok();
    let mnt = v.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let (c, m) = (v.cipher(), mnt.to_str().unwrap());
    let c = c.to_str().unwrap();
    let r = v.run(&["--verify-key", &other, "mount", c, m, "--ro"]);
    let mounted = common::is_mounted(&mnt);
    if mounted {
        v.run(&["umount", m]).ok();
    }
    assert_eq!(r.code, INTEGRITY, "{}", r.stderr);
    assert!(!mounted, "a reader under another key mounted");
    v.run(&["--sign-key", &key, "mount", c, m]).ok();
    let wrote = std::fs::write(mnt.join("g"), b"through the daemon");
    v.run(&["umount", m]).ok();
    wrote.unwrap();
    let r = v.run(&["--verify-key", &pubk, "cat", "/g"]);
    assert_eq!(r.code, 0, "the daemon's roots are signed: {}", r.stderr);
    assert_eq!(r.stdout, "through the daemon");
}
