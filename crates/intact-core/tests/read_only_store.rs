//! A volume whose store directory is read-only (a backup disk mounted read-only, a
//! directory the user may not write): the local store still reads every object, a write
//! fails with the system's reason (EROFS or EACCES), and the volume opens read-only and
//! reads back what was written.
//!
//! As root (CI) the store is a tmpfs remounted read-only, since root writes through
//! permissions; otherwise its files and directories lose their write bits. Both run the
//! same checks, so the test never skips.

mod common;

use common::{pattern, read_all, PW};
use intact_core::format::SchemeId;
use intact_core::store::{LocalDirStore, MemTrusted, TrustedStore, UntrustedStore};
use intact_core::{Error, Options, Volume};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

/// The store's directory: a tmpfs as root (unmounted when dropped), a plain directory
/// otherwise; [`Store::make_read_only`] takes its write access away.
struct Store<'a> {
    dir: &'a Path,
    mounted: bool,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

fn run(cmd: &mut Command) {
    let st = cmd.status().expect("run");
    assert!(st.success(), "{cmd:?}: {st}");
}

impl<'a> Store<'a> {
    fn new(dir: &'a Path) -> Store<'a> {
        let mounted = is_root();
        if mounted {
            run(Command::new("mount")
                .args(["-t", "tmpfs", "tmpfs"])
                .arg(dir));
        }
        Store { dir, mounted }
    }

    fn make_read_only(&self) {
        if self.mounted {
            run(Command::new("mount")
                .args(["-o", "remount,ro"])
                .arg(self.dir));
        } else {
            run(Command::new("chmod").args(["-R", "a-w"]).arg(self.dir));
        }
    }
}

impl Drop for Store<'_> {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(self.dir).status();
        } else {
            let _ = Command::new("chmod")
                .args(["-R", "u+w"])
                .arg(self.dir)
                .status();
        }
    }
}

fn read_only_error(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. }
        if matches!(source.raw_os_error(), Some(libc::EROFS) | Some(libc::EACCES)))
}

#[test]
fn a_read_only_store_reads_and_refuses_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    let guard = Store::new(&dir);
    let data = pattern(3, 10_000);
    let trusted = MemTrusted::new();
    {
        let store: Arc<dyn UntrustedStore> = Arc::new(LocalDirStore::open(&dir).unwrap());
        let vol = common::create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
        vol.create_file("/f", None).unwrap();
        vol.write_path("/f", 0, &data).unwrap();
        vol.mkdir("/d").unwrap();
        vol.create_file("/d/g", None).unwrap();
        vol.write_path("/d/g", 0, b"small").unwrap();
        drop(vol);
        store.write_at("raw/x.d", 0, b"hello").unwrap();
        store.sync_all().unwrap();
    }
    guard.make_read_only();

    // The store: reads, twice (the second through the handle the first left), lengths and
    // the listing work; a write of an existing or a new object fails with the system's
    // reason, and reads go on after it.
    let s = LocalDirStore::open(&dir).unwrap();
    for _ in 0..2 {
        assert_eq!(s.read_all("raw/x.d").unwrap().unwrap(), b"hello");
    }
    assert_eq!(s.len("raw/x.d").unwrap(), Some(5));
    let e = s.write_at("raw/x.d", 0, b"j").unwrap_err();
    assert!(read_only_error(&e), "{e}");
    let e = s.write_at("raw/new.d", 0, b"j").unwrap_err();
    assert!(read_only_error(&e), "{e}");
    assert!(s.set_len("raw/x.d", 1).is_err());
    assert_eq!(s.read_all("raw/x.d").unwrap().unwrap(), b"hello");
    assert!(s.list().unwrap().contains(&"raw/x.d".to_string()));

    // The volume, read-only.
    let store: Arc<dyn UntrustedStore> = Arc::new(s);
    let vol = Volume::open(
        store,
        Box::new(trusted.clone()) as Box<dyn TrustedStore>,
        PW,
        &Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(read_all(&vol, "/f").unwrap(), data);
    assert_eq!(read_all(&vol, "/d/g").unwrap(), b"small");
    assert!(vol.write_path("/f", 0, b"x").is_err());
    assert_eq!(read_all(&vol, "/f").unwrap(), data);
    let failures = vol.fsck(&mut |_| ()).unwrap();
    assert!(failures.is_empty(), "{failures:?}");
}
