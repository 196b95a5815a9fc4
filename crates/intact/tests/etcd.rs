//! The trusted anchor in etcd (issue 9), against a real etcd server started by each test
//! (Debian's `etcd-server`; scripts/test.sh installs it): the anchor lives only in etcd, a
//! seal is a compare-and-swap so two clients cannot fork the volume, one writer at a time
//! holds a lease, a rollback of the cipher directory is caught as with a local anchor, an
//! etcd that is down is a clear error that loses nothing sealed, and the anchor moves from
//! the state directory into etcd and back.

#[allow(dead_code)]
mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::vol::{Vol, BIN, INTEGRITY, IO, LOCKED, PW};
use intact_core::store::{EtcdAnchor, EtcdUrl, TrustedStore, LEASE_TTL_SECS};
use intact_core::Error;

/// A free TCP port on the loopback interface.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A one-member etcd cluster in a temporary directory, killed when dropped.
struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client: u16,
    peer: u16,
}

impl Etcd {
    /// Starts etcd, or `None` (skipped) when it is not installed.
    fn start() -> Option<Etcd> {
        if !common::need(&["etcd"]) {
            return None;
        }
        let mut e = Etcd {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            client: free_port(),
            peer: free_port(),
        };
        e.run();
        Some(e)
    }

    /// Starts (or restarts, on the same data) the server and waits until it answers.
    fn run(&mut self) {
        let (c, p) = (
            format!("http://127.0.0.1:{}", self.client),
            format!("http://127.0.0.1:{}", self.peer),
        );
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--initial-cluster", &format!("t={p}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if EtcdAnchor::connect(&self.url("probe")).is_ok() {
                return;
            }
            assert!(
                Instant::now() < until,
                "etcd did not start: {}",
                std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self, key: &str) -> EtcdUrl {
        EtcdUrl::parse(&self.url_str(key)).unwrap()
    }

    fn url_str(&self, key: &str) -> String {
        format!("etcd://127.0.0.1:{}/{key}", self.client)
    }

    fn anchor(&self, key: &str) -> EtcdAnchor {
        EtcdAnchor::connect(&self.url(key)).unwrap()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `args` run again while the volume is locked by a writer that died (its lease expires
/// within its time to live), for at most three times that: the first other answer.
fn once_its_lease_expired(v: &Vol, args: &[&str]) -> common::vol::Run {
    let until = Instant::now() + Duration::from_secs(3 * LEASE_TTL_SECS as u64);
    loop {
        let r = v.run(args);
        if r.code != LOCKED || Instant::now() > until {
            return r;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let s = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(s.success());
}

#[test]
fn a_volume_anchored_in_etcd_keeps_its_anchor_only_there() {
    let Some(etcd) = Etcd::start() else { return };
    let v = Vol::new();
    let url = etcd.url_str("intact/a");
    v.init(Some(&url));
    v.put("/f", b"hello etcd").ok();
    // Later commands find the anchor without the flag: the state directory records it.
    assert_eq!(v.cat("/f").ok().stdout, "hello etcd");
    let st = v.volume_state();
    assert!(!st.join("anchor").exists(), "no local anchor");
    assert_eq!(
        std::fs::read_to_string(st.join("anchor.remote"))
            .unwrap()
            .trim(),
        url
    );
    let info: serde_json::Value =
        serde_json::from_str(&v.run(&["--json", "info"]).ok().stdout).unwrap();
    assert_eq!(info["anchor"], url.as_str());
    // etcd holds it, and no lock is left behind by the commands that ended.
    let a = etcd.anchor("intact/a");
    assert!(a.load().unwrap().is_some());
    let _l = a.lock(true).expect("no writer left");
    // `--anchor local` is refused: the anchor is not there.
    drop(_l);
    let r = v.run(&["--anchor", "local", "ls", "/"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains(&url), "{}", r.stderr);
}

#[test]
fn one_writer_at_a_time_and_readers_only_without_one() {
    let Some(etcd) = Etcd::start() else { return };
    let (a, b, c) = (
        etcd.anchor("intact/l"),
        etcd.anchor("intact/l"),
        etcd.anchor("intact/l"),
    );
    let w = a.lock(true).unwrap();
    for (excl, what) in [(true, "writer"), (false, "reader")] {
        let e = b.lock(excl).unwrap_err();
        assert!(
            matches!(&e, Error::Locked(m) if m.contains("open for writing")),
            "a {what} beside a writer: {e}"
        );
    }
    drop(w);
    let r1 = b.lock(false).unwrap();
    let r2 = c.lock(false).unwrap();
    let e = a.lock(true).unwrap_err();
    assert!(
        matches!(&e, Error::Locked(m) if m.contains("2 client(s) have the volume open read-only")),
        "{e}"
    );
    drop((r1, r2));
    let _w = a.lock(true).expect("free once the readers went");
}

#[test]
fn a_seal_is_a_compare_and_swap_so_two_clients_cannot_fork_the_volume() {
    let Some(etcd) = Etcd::start() else { return };
    let (a, b) = (etcd.anchor("intact/c"), etcd.anchor("intact/c"));
    a.store(b"epoch 1").unwrap();
    assert_eq!(b.load().unwrap().as_deref(), Some(&b"epoch 1"[..]));
    assert_eq!(a.load().unwrap().as_deref(), Some(&b"epoch 1"[..]));
    // Both read epoch 1; the first to seal wins, the second is refused.
    a.store(b"epoch 2 by a").unwrap();
    let e = b.store(b"epoch 2 by b").unwrap_err();
    assert!(
        matches!(&e, Error::Locked(m) if m.contains("another client sealed")),
        "{e}"
    );
    assert_eq!(a.load().unwrap().as_deref(), Some(&b"epoch 2 by a"[..]));
    // Having read the new anchor, b may seal after it.
    b.load().unwrap();
    b.store(b"epoch 3 by b").unwrap();
    // A writer holding the lock is refused too when the anchor changed under it (a
    // client that sealed without the lock), and told so.
    let w = etcd.anchor("intact/c");
    let _held = w.lock(true).unwrap();
    w.load().unwrap();
    let intruder = etcd.anchor("intact/c");
    intruder.load().unwrap();
    intruder.store(b"sealed without the lock").unwrap();
    let e = w.store(b"the writer's").unwrap_err();
    assert!(
        matches!(&e, Error::Locked(m) if m.contains("another client sealed")),
        "{e}"
    );
    drop(_held);
    a.load().unwrap();
    // etcd's own refusals are passed on as they are, not as an outage.
    let e = a.store(&vec![0u8; 3 << 20]).unwrap_err();
    assert!(
        matches!(&e, Error::Io { .. }) && !e.to_string().contains("unreachable"),
        "{e}"
    );
    // A client that never read it cannot create it over an existing one.
    let c = etcd.anchor("intact/c");
    assert!(c.store(b"a fresh volume").is_err());
    assert_eq!(
        a.load().unwrap().as_deref(),
        Some(&b"sealed without the lock"[..])
    );
}

#[test]
fn a_writer_that_lost_its_lease_seals_nothing() {
    let Some(etcd) = Etcd::start() else { return };
    let (a, other) = (etcd.anchor("intact/w"), etcd.anchor("intact/w"));
    let _lock = a.lock(true).unwrap();
    a.load().unwrap();
    a.store(b"sealed while holding the lease").unwrap();
    // An operator (or the lease's expiry) takes the lock away; another client takes it.
    other.revoke_lease(a.lease_id().unwrap()).unwrap();
    let e = a.store(b"after the lease").unwrap_err();
    assert!(
        matches!(&e, Error::Locked(m) if m.contains("lock is gone")
            && m.contains("another client may hold the volume")
            && m.contains("nothing was sealed")),
        "{e}"
    );
    // The keep-alive finds the lease gone at its next tick (every 3 s), well before a
    // whole time to live without an answer would make it give up.
    let until = Instant::now() + Duration::from_secs(6);
    while !a.lease_lost() {
        assert!(Instant::now() < until, "the lost lease went unnoticed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let e = a.store(b"after the keep-alive noticed").unwrap_err();
    assert!(
        matches!(&e, Error::Locked(m) if m.contains("could not be kept alive")),
        "{e}"
    );
    let _theirs = other.lock(true).unwrap();
    let e = a.store(b"after another took it").unwrap_err();
    assert!(
        matches!(&e, Error::Locked(m) if m.contains("belongs to another client")),
        "{e}"
    );
    assert_eq!(
        other.load().unwrap().as_deref(),
        Some(&b"sealed while holding the lease"[..])
    );
}

#[test]
fn the_cli_refuses_a_second_writer_and_a_crashed_one_lets_go_with_its_lease() {
    let Some(etcd) = Etcd::start() else { return };
    let v = Vol::new();
    v.init(Some(&etcd.url_str("intact/x")));
    // A writer that keeps the volume open: a put from a pipe that stays open.
    let mut writer = Command::new(BIN)
        .env_remove("INTACT_ANCHOR")
        .env("INTACT_PASSWORD", PW)
        .env("INTACT_VOLUME", v.cipher())
        .env("INTACT_STATE", v.state())
        .args(["put", "-", "/held"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for it to hold the lock by reading the writer's key (taking a lock here could
    // make the writer's own attempt fail).
    let probe = etcd.anchor("intact/x");
    let until = Instant::now() + Duration::from_secs(20);
    while probe.writer().unwrap().is_none() {
        assert!(Instant::now() < until, "the writer never took the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = v.run(&["ls", "/"]);
    assert_eq!(r.code, LOCKED, "{}", r.stderr);
    assert!(r.stderr.contains("open for writing"), "{}", r.stderr);
    // SIGKILL: the writer cannot give its lease back; it expires.
    writer.kill().unwrap();
    writer.wait().unwrap();
    let killed = Instant::now();
    let r = once_its_lease_expired(&v, &["ls", "/"]);
    assert_eq!(
        r.code,
        0,
        "still locked {:?} after the kill: {}",
        killed.elapsed(),
        r.stderr
    );
}

#[test]
fn a_rollback_of_the_cipher_directory_is_caught_with_the_anchor_in_etcd() {
    let Some(etcd) = Etcd::start() else { return };
    let v = Vol::new();
    v.init(Some(&etcd.url_str("intact/r")));
    v.put("/f", b"version 1").ok();
    let old = v.dir.path().join("old");
    copy_dir(&v.cipher(), &old);
    v.put("/f", b"version 2").ok();
    std::fs::remove_dir_all(v.cipher()).unwrap();
    copy_dir(&old, &v.cipher());
    let r = v.cat("/f");
    assert_eq!(r.code, INTEGRITY, "{}", r.stderr);
    assert!(r.stderr.contains("OLDER state"), "{}", r.stderr);
}

#[test]
fn etcd_down_is_a_clear_error_and_loses_nothing_sealed() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let v = Vol::new();
    v.init(Some(&etcd.url_str("intact/d")));
    v.put("/f", b"sealed before the outage").ok();
    etcd.stop();
    let t = Instant::now();
    for r in [v.cat("/f"), v.put("/g", b"during the outage")] {
        assert_eq!(r.code, IO, "{}", r.stderr);
        assert!(r.stderr.contains("etcd is unreachable"), "{}", r.stderr);
    }
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    etcd.run();
    assert_eq!(v.cat("/f").ok().stdout, "sealed before the outage");
    assert_ne!(
        v.cat("/g").code,
        0,
        "nothing was written while etcd was down"
    );
    v.run(&["fsck"]).ok();
}

#[test]
fn the_anchor_moves_into_etcd_and_back() {
    let Some(etcd) = Etcd::start() else { return };
    let v = Vol::new();
    v.init(None);
    v.put("/a", b"written with a local anchor").ok();
    let st = v.volume_state();
    assert!(st.join("anchor").exists());
    let url = etcd.url_str("intact/m");
    let r = v.run(&["anchor", "move", "--to", &url]).ok();
    assert!(r.stdout.contains(&url), "{}", r.stdout);
    assert!(!st.join("anchor").exists(), "the local copy is removed");
    assert!(etcd.anchor("intact/m").load().unwrap().is_some());
    assert_eq!(v.cat("/a").ok().stdout, "written with a local anchor");
    v.put("/b", b"written with the anchor in etcd").ok();
    // Moving again to the same place is refused; a rollback is still caught.
    assert_ne!(v.run(&["anchor", "move", "--to", &url]).code, 0);
    v.run(&["anchor", "move", "--to", "local"]).ok();
    assert!(st.join("anchor").exists());
    assert!(!st.join("anchor.remote").exists());
    assert!(etcd.anchor("intact/m").load().unwrap().is_none());
    assert_eq!(v.cat("/b").ok().stdout, "written with the anchor in etcd");
    v.run(&["fsck"]).ok();
    // An --anchor naming etcd while the anchor is local is refused, not silently split.
    let r = v.run(&["--anchor", &url, "ls", "/"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("anchor move"), "{}", r.stderr);
}

/// Writes `data` to `path` and fsyncs it: the fsync's result.
fn write_fsync(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Through the mount: an fsync seals through etcd, so a SIGKILL of the daemon loses
/// nothing fsynced; while etcd is down an fsync fails instead of promising what it cannot
/// keep, and once etcd is back the volume opens with everything fsynced before.
#[test]
fn fsync_through_the_mount_seals_in_etcd_and_fails_while_etcd_is_down() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let v = Vol::new();
    v.init(Some(&etcd.url_str("intact/mnt")));
    let mnt = v.dir.path().join("mnt");
    let Some((mut daemon, log)) = common::vol::mount(&v, &mnt, &[], &[]) else {
        return;
    };
    let a = common::pattern(1, 100_000);
    write_fsync(&mnt.join("a"), &a).unwrap();
    // The daemon holds the writer's lease.
    let e = etcd.anchor("intact/mnt").lock(true).unwrap_err();
    assert!(
        matches!(&e, Error::Locked(m) if m.contains("open for writing")),
        "{e}"
    );
    etcd.stop();
    let b = common::pattern(2, 50_000);
    let r = write_fsync(&mnt.join("b"), &b);
    assert!(r.is_err(), "an fsync succeeded while etcd was down");
    // A crash of the daemon: its lease goes with it once etcd is back.
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    common::detach(&mnt);
    let log = log.join().unwrap();
    assert!(log.contains("etcd"), "the daemon's log names etcd: {log}");
    etcd.run();
    let out = v.dir.path().join("a.out");
    let r = once_its_lease_expired(&v, &["get", "/a", out.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        std::fs::read(&out).unwrap() == a,
        "the fsynced file differs"
    );
    v.run(&["fsck"]).ok();
}

/// Signed roots in etcd: the writer's signature travels with the anchor into etcd, and a
/// reader holding only the public key opens the volume from there.
#[test]
fn signed_roots_move_into_etcd_with_their_signature() {
    let Some(etcd) = Etcd::start() else { return };
    let v = Vol::new();
    let key = v.dir.path().join("k");
    v.run(&["keygen", "--out", key.to_str().unwrap()]).ok();
    let (key, pubk) = (
        key.to_str().unwrap().to_string(),
        format!("{}.pub", key.display()),
    );
    v.init(None);
    v.put_with(&["--sign-key", &key], "/f", b"signed, then moved")
        .ok();
    v.run(&["anchor", "move", "--to", &etcd.url_str("intact/s")])
        .ok();
    let r = v.run(&["--verify-key", &pubk, "cat", "/f"]).ok();
    assert_eq!(r.stdout, "signed, then moved");
    // The bytes in etcd are the signed envelope.
    let raw = etcd.anchor("intact/s").load().unwrap().unwrap();
    assert_eq!(&raw[..4], b"ISIG");
    v.put_with(&["--sign-key", &key], "/g", b"sealed in etcd, signed")
        .ok();
    assert_eq!(
        v.run(&["--verify-key", &pubk, "cat", "/g"]).ok().stdout,
        "sealed in etcd, signed"
    );
}

/// The lease is kept alive: a writer that holds the volume longer than the lease's time to
/// live still seals, and nobody else gets the lock meanwhile.
#[test]
fn a_writer_keeps_its_lease_past_its_time_to_live() {
    let Some(etcd) = Etcd::start() else { return };
    let (a, b) = (etcd.anchor("intact/k"), etcd.anchor("intact/k"));
    let _lock = a.lock(true).unwrap();
    a.load().unwrap();
    std::thread::sleep(Duration::from_secs(LEASE_TTL_SECS as u64 + 3));
    assert!(!a.lease_lost());
    a.store(b"sealed after the time to live").unwrap();
    assert!(b.lock(true).is_err(), "the lock is still held");
}

/// A short outage of etcd (under the lease's time to live) costs the writer nothing: the
/// keep-alive reconnects, the lease and the lock are still its own, and it seals.
#[test]
fn a_writer_rides_out_an_etcd_restart_shorter_than_its_lease() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let a = etcd.anchor("intact/o");
    let _lock = a.lock(true).unwrap();
    a.load().unwrap();
    a.store(b"before the outage").unwrap();
    etcd.stop();
    std::thread::sleep(Duration::from_secs(4));
    etcd.run();
    // Two keep-alive ticks after the restart.
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        !a.lease_lost(),
        "the lease was given up over a short outage"
    );
    a.store(b"after the outage").unwrap();
    let b = etcd.anchor("intact/o");
    assert!(b.lock(true).is_err(), "the lock is still held");
    assert_eq!(b.load().unwrap().as_deref(), Some(&b"after the outage"[..]));
}

/// A reader of another machine with the public key reads the newest root from etcd; with
/// etcd down it reads the root the writer published in the store, no older than the newest
/// it has read; a compromised etcd that hands back an older signed root is refused.
#[test]
fn a_reader_with_the_public_key_follows_etcd_and_reads_the_published_root_when_it_is_down() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let v = Vol::new();
    let key = v.dir.path().join("k");
    v.run(&["keygen", "--out", key.to_str().unwrap()]).ok();
    let (key, pubk) = (
        key.to_str().unwrap().to_string(),
        format!("{}.pub", key.display()),
    );
    let url = etcd.url_str("intact/p");
    v.init(Some(&url));
    v.put_with(&["--sign-key", &key], "/f", b"epoch one").ok();
    let b = v.dir.path().join("machine-b");
    let reader = |args: &[&str]| {
        let mut a = vec![
            "--state",
            b.to_str().unwrap(),
            "--anchor",
            &url,
            "--verify-key",
            &pubk,
        ];
        a.extend_from_slice(args);
        v.run(&a)
    };
    assert_eq!(reader(&["cat", "/f"]).ok().stdout, "epoch one");
    let old = etcd.anchor("intact/p").load().unwrap().unwrap();
    v.put_with(&["--sign-key", &key], "/f", b"epoch two").ok();
    let info = reader(&["info"]).ok().stdout;
    assert!(info.contains("fresh: the newest root"), "{info}");
    assert_eq!(reader(&["cat", "/f"]).ok().stdout, "epoch two");
    etcd.stop();
    assert_eq!(reader(&["cat", "/f"]).ok().stdout, "epoch two");
    let info = reader(&["info"]).ok().stdout;
    assert!(
        info.contains("anchor.signed in the store") && info.contains("unreachable"),
        "{info}"
    );
    // A writer needs etcd: it cannot seal while etcd is down.
    assert_eq!(v.put_with(&["--sign-key", &key], "/g", b"x").code, IO);
    etcd.run();
    // etcd handing back an older signed root: refused by the reader that read a newer one.
    let a = etcd.anchor("intact/p");
    a.load().unwrap();
    a.store(&old).unwrap();
    let r = reader(&["cat", "/f"]);
    assert_eq!(r.code, INTEGRITY, "{}", r.stderr);
    assert!(r.stderr.contains("older than epoch"), "{}", r.stderr);
}

/// Readers on other machines follow the newest epoch: a `--ro --follow` mount with its own
/// state directory and its own connection to etcd opens beside the writer's mount (a plain
/// reader is refused, and the follower keeps no writer out), and shows each file the writer
/// fsyncs within seconds, with no alarm.
#[test]
fn a_follower_on_another_machine_shows_what_the_writer_seals_in_etcd() {
    let Some(etcd) = Etcd::start() else { return };
    let v = Vol::new();
    let url = etcd.url_str("intact/follow");
    v.init(Some(&url));
    v.put("/before", b"sealed before").ok();
    let b = v.dir.path().join("machine-b");
    let b = b.to_str().unwrap();
    let fm = v.dir.path().join("follower");
    let global = ["--state", b, "--anchor", url.as_str()];
    let Some((mut fd, flog)) = common::vol::mount(&v, &fm, &global, &["--ro", "--follow=20"])
    else {
        return;
    };
    assert_eq!(std::fs::read(fm.join("before")).unwrap(), b"sealed before");
    // The follower holds nothing the writer sees: the writer mounts beside it.
    let wm = v.dir.path().join("writer");
    let (mut wd, wlog) = common::vol::mount(&v, &wm, &[], &[]).unwrap();
    let r = v.run(&["--state", b, "--anchor", &url, "ls", "/"]);
    assert_eq!(
        r.code, LOCKED,
        "a plain reader beside the writer: {}",
        r.stderr
    );
    for i in 0..5u64 {
        let data = common::pattern(i, 10_000 + i as usize);
        let name = format!("f{i}");
        write_fsync(&wm.join(&name), &data).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while std::fs::read(fm.join(&name)).ok().as_ref() != Some(&data) {
            assert!(Instant::now() < until, "the follower never showed /{name}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let (ok, st) = common::unmount_or_kill(&fm, &mut fd, 100);
    let flog = flog.join().unwrap();
    assert!(ok && st.success(), "{flog}");
    assert!(!flog.contains("integrity failure"), "{flog}");
    let (ok, st) = common::unmount_or_kill(&wm, &mut wd, 100);
    assert!(ok && st.success(), "{}", wlog.join().unwrap());
    v.run(&["fsck"]).ok();
}
