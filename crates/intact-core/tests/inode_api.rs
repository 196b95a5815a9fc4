//! The inode-level API that file-system front ends use, without FUSE: rename flags, hard
//! links, files unlinked while open, extended attributes and re-encryption under another
//! scheme, each checked again after a reopen.

mod common;

use common::*;
use intact_core::format::{SchemeId, ROOT_INO};
use intact_core::store::{MemStore, MemTrusted};
use intact_core::volume::{
    Kind, RenameMode, SetAttr, XattrMode, SCHEME_XATTR, XATTR_BYTES_MAX, XATTR_NAMES_MAX,
    XATTR_VALUE_MAX,
};
use intact_core::{Error, FsErrorKind};
use std::sync::Arc;

fn fs_kind<T: std::fmt::Debug>(r: intact_core::Result<T>) -> FsErrorKind {
    match r {
        Err(Error::Fs { kind, .. }) => kind,
        other => panic!("expected a file-system error, got {other:?}"),
    }
}

fn file(vol: &intact_core::Volume, parent: u64, name: &str, data: &[u8]) -> u64 {
    let a = vol
        .create_at(parent, name, Kind::File, 0o640, 1000, 100, None)
        .unwrap();
    vol.write_ino(a.ino, 0, data).unwrap();
    a.ino
}

#[test]
fn rename_modes() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let d = vol
        .create_at(ROOT_INO, "d", Kind::Dir, 0o755, 0, 0, None)
        .unwrap()
        .ino;
    let sub = vol
        .create_at(d, "sub", Kind::Dir, 0o755, 0, 0, None)
        .unwrap()
        .ino;
    file(&vol, ROOT_INO, "x", b"x");
    file(&vol, ROOT_INO, "y", b"y");
    assert_eq!(
        fs_kind(vol.rename_at(ROOT_INO, "x", ROOT_INO, "y", RenameMode::NoReplace)),
        FsErrorKind::Exists
    );
    assert_eq!(
        fs_kind(vol.rename_at(ROOT_INO, "x", ROOT_INO, "z", RenameMode::Exchange)),
        FsErrorKind::NotFound
    );
    vol.rename_at(ROOT_INO, "x", ROOT_INO, "y", RenameMode::Exchange)
        .unwrap();
    // A directory cannot move below itself, also through an exchange.
    assert_eq!(
        fs_kind(vol.rename_at(ROOT_INO, "d", sub, "d2", RenameMode::Replace)),
        FsErrorKind::RenameIntoSelf
    );
    assert_eq!(
        fs_kind(vol.rename_at(d, "sub", ROOT_INO, "d", RenameMode::Exchange)),
        FsErrorKind::RenameIntoSelf
    );
    // Exchanging a directory and a file fixes the directory's parent link.
    vol.rename_at(d, "sub", ROOT_INO, "y", RenameMode::Exchange)
        .unwrap();
    assert_eq!(vol.readdir_page(sub, 0, 10).unwrap().0, ROOT_INO);
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(read_all(&vol, "/x").unwrap(), b"y");
    assert_eq!(read_all(&vol, "/d/sub").unwrap(), b"x");
    assert_eq!(vol.stat("/y").unwrap().kind, Kind::Dir);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

#[test]
fn hard_links_and_unlinked_open_files() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let a = file(&vol, ROOT_INO, "a", b"shared");
    let d = vol
        .create_at(ROOT_INO, "d", Kind::Dir, 0o755, 0, 0, None)
        .unwrap()
        .ino;
    assert_eq!(vol.link_at(a, d, "b").unwrap().nlink, 2);
    assert_eq!(
        fs_kind(vol.link_at(d, ROOT_INO, "dlink")),
        FsErrorKind::NotPermitted
    );
    // Replacing one name by a rename keeps the inode alive through the other.
    file(&vol, ROOT_INO, "c", b"c");
    vol.rename_at(ROOT_INO, "c", ROOT_INO, "a", RenameMode::Replace)
        .unwrap();
    assert_eq!(vol.attr(a).unwrap().nlink, 1);
    assert_eq!(read_all(&vol, "/d/b").unwrap(), b"shared");
    // The last name goes while a handle is open: the file lives until release.
    vol.open_handle(a).unwrap();
    vol.unlink_at(d, "b").unwrap();
    assert_eq!(vol.attr(a).unwrap().nlink, 0);
    vol.write_ino(a, 6, b" still").unwrap();
    let mut buf = [0u8; 12];
    assert_eq!(vol.read_ino(a, 0, &mut buf).unwrap(), 12);
    assert_eq!(&buf, b"shared still");
    vol.sync().unwrap();
    assert!(
        vol.fsck(&mut |_| {}).unwrap().is_empty(),
        "unlinked-open is not lost"
    );
    vol.release_handle(a).unwrap();
    assert!(vol.attr(a).is_err(), "freed at the last release");
    vol.sync().unwrap();
    assert!(vol.orphans().unwrap().is_empty());
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    assert_eq!(vol.readdir("/d").unwrap().len(), 0);
}

#[test]
fn xattr_modes_limits_and_persistence() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let f = file(&vol, ROOT_INO, "f", b"");
    assert_eq!(
        fs_kind(vol.setxattr(f, "user.a", b"1", XattrMode::Replace)),
        FsErrorKind::NoAttribute
    );
    vol.setxattr(f, "user.a", b"1", XattrMode::Create).unwrap();
    assert_eq!(
        fs_kind(vol.setxattr(f, "user.a", b"2", XattrMode::Create)),
        FsErrorKind::Exists
    );
    vol.setxattr(f, "user.a", b"2", XattrMode::Replace).unwrap();
    let big = vec![7u8; XATTR_VALUE_MAX];
    vol.setxattr(f, "user.big", &big, XattrMode::Set).unwrap();
    assert_eq!(
        fs_kind(vol.setxattr(f, "user.bigger", &[0; XATTR_VALUE_MAX + 1], XattrMode::Set)),
        FsErrorKind::ValueTooLarge
    );
    assert_eq!(
        fs_kind(vol.setxattr(f, "security.x", b"1", XattrMode::Set)),
        FsErrorKind::NotSupported
    );
    assert_eq!(
        fs_kind(vol.getxattr(f, "user.none")),
        FsErrorKind::NoAttribute
    );
    assert_eq!(vol.getxattr(f, SCHEME_XATTR).unwrap(), b"mt-eint");
    vol.setattr(
        f,
        &SetAttr {
            mode: Some(0o4755),
            mtime_ns: Some(42),
            ..Default::default()
        },
    )
    .unwrap();
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    let f = vol.lookup(ROOT_INO, "f").unwrap();
    assert_eq!(f.mode, 0o4755);
    assert_eq!(f.mtime_ns, 42);
    assert_eq!(vol.getxattr(f.ino, "user.a").unwrap(), b"2");
    assert_eq!(vol.getxattr(f.ino, "user.big").unwrap(), big);
    vol.removexattr(f.ino, "user.a").unwrap();
    vol.removexattr(f.ino, "user.big").unwrap();
    // The scheme attribute is readable but was never set here: not listed.
    assert!(vol.listxattr(f.ino).unwrap().is_empty());
    // Removing the last attribute frees its hidden file: no orphan, nothing lost.
    vol.remove_orphans().unwrap();
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    vol.unlink("/f").unwrap();
    vol.sync().unwrap();
    assert!(vol.orphans().unwrap().is_empty());
}

/// The per-inode limits: the total of names and values ([`XATTR_BYTES_MAX`] by default)
/// and the names that listxattr can return ([`XATTR_NAMES_MAX`]); a refused set changes
/// nothing, and a replace within the limit is allowed when a new name would not be.
#[test]
fn xattr_totals_are_bounded_with_enospc() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let f = file(&vol, ROOT_INO, "f", b"data");
    // Values: 4 equal ones with their names fill the default total exactly.
    let names: Vec<String> = (0..4).map(|k| format!("user.v{k}")).collect();
    vol.setxattr(f, "user.pa", b"", XattrMode::Set).unwrap();
    let per = (XATTR_BYTES_MAX - "user.pa".len()) / 4 - names[0].len();
    assert_eq!(
        (per + names[0].len()) * 4 + "user.pa".len(),
        XATTR_BYTES_MAX
    );
    for n in &names {
        vol.setxattr(f, n, &vec![1u8; per], XattrMode::Set).unwrap();
    }
    assert_eq!(
        fs_kind(vol.setxattr(f, "user.more", b"x", XattrMode::Set)),
        FsErrorKind::NoSpace
    );
    assert_eq!(
        fs_kind(vol.setxattr(f, &names[0], &vec![1u8; per + 1], XattrMode::Set)),
        FsErrorKind::NoSpace
    );
    // Same size replaces fine; a smaller value frees room for a new name.
    vol.setxattr(f, &names[0], &vec![2u8; per], XattrMode::Replace)
        .unwrap();
    vol.setxattr(f, &names[1], &vec![3u8; per - 20], XattrMode::Set)
        .unwrap();
    vol.setxattr(f, "user.x", b"12345", XattrMode::Create)
        .unwrap();
    assert_eq!(
        fs_kind(vol.getxattr(f, "user.more")),
        FsErrorKind::NoAttribute
    );
    // Names: many empty attributes stop at the listxattr limit, not at the byte total.
    let g = file(&vol, ROOT_INO, "g", b"");
    let mut k = 0;
    let err = loop {
        let name = format!("user.{k:0>200}");
        match vol.setxattr(g, &name, b"", XattrMode::Set) {
            Ok(()) => k += 1,
            Err(e) => break e,
        }
        assert!(k < 1000, "no limit on names");
    };
    assert!(
        matches!(
            err,
            Error::Fs {
                kind: FsErrorKind::NoSpace,
                ..
            }
        ),
        "{err}"
    );
    let listed: usize = vol.listxattr(g).unwrap().iter().map(|n| n.len() + 1).sum();
    assert!(listed <= XATTR_NAMES_MAX && listed > XATTR_NAMES_MAX - 300);
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(vol.getxattr(f, &names[0]).unwrap(), vec![2u8; per]);
    assert_eq!(vol.getxattr(f, &names[1]).unwrap(), vec![3u8; per - 20]);
    assert_eq!(vol.getxattr(f, "user.x").unwrap(), b"12345");
    assert_eq!(vol.listxattr(g).unwrap().len(), k);
    // Still bounded after the reopen (the totals are rebuilt from the stored set).
    assert_eq!(
        fs_kind(vol.setxattr(f, "user.more", b"xxxxxxxxxxx", XattrMode::Set)),
        FsErrorKind::NoSpace
    );
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// `user.intact.scheme`: readable on every file, listed only once set on that file, and
/// removable, which returns the file to the volume's default scheme (re-encrypting it).
#[test]
fn scheme_attribute_listed_only_when_set_and_removable() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let data = pattern(9, 3 * 4096 + 5);
    let f = file(&vol, ROOT_INO, "f", &data);
    vol.setxattr(f, "user.a", b"1", XattrMode::Set).unwrap();
    assert_eq!(vol.listxattr(f).unwrap(), ["user.a"]);
    assert_eq!(vol.getxattr(f, SCHEME_XATTR).unwrap(), b"mt-eint");
    assert_eq!(
        fs_kind(vol.removexattr(f, SCHEME_XATTR)),
        FsErrorKind::NoAttribute
    );
    vol.setxattr(f, SCHEME_XATTR, b"mac-tree", XattrMode::Set)
        .unwrap();
    assert_eq!(vol.listxattr(f).unwrap(), ["user.a", SCHEME_XATTR]);
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!(vol.listxattr(f).unwrap(), ["user.a", SCHEME_XATTR]);
    assert_eq!(vol.stat("/f").unwrap().scheme, "mac-tree");
    vol.removexattr(f, SCHEME_XATTR).unwrap();
    assert_eq!(vol.stat("/f").unwrap().scheme, "mt-eint");
    assert_eq!(vol.listxattr(f).unwrap(), ["user.a"]);
    assert_eq!(read_all(&vol, "/f").unwrap(), data);
    // `auto` set through the attribute is listed too, and removing it ends the policy.
    vol.setxattr(f, SCHEME_XATTR, b"auto", XattrMode::Set)
        .unwrap();
    assert!(vol.stat("/f").unwrap().auto);
    assert_eq!(vol.listxattr(f).unwrap(), ["user.a", SCHEME_XATTR]);
    vol.removexattr(f, SCHEME_XATTR).unwrap();
    assert!(!vol.stat("/f").unwrap().auto);
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    assert_eq!(vol.listxattr(f).unwrap(), ["user.a"]);
    assert_eq!(read_all(&vol, "/f").unwrap(), data);
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    assert!(vol.orphans().unwrap().is_empty());
}

#[test]
fn reencryption_under_every_scheme_keeps_content() {
    for from in SchemeId::ALL {
        let store = Arc::new(MemStore::new());
        let trusted = MemTrusted::new();
        let vol = create(store.clone(), &trusted, from, 4096);
        let data = pattern(3, 5 * 4096 + 17);
        let f = file(&vol, ROOT_INO, "f", &data);
        // A sparse region, and a synced state to re-encrypt from.
        vol.write_ino(f, 40 * 4096, b"tail").unwrap();
        vol.sync().unwrap();
        let mut want = data.clone();
        want.resize(40 * 4096, 0);
        want.extend_from_slice(b"tail");
        let old_id = vol.stat("/f").unwrap().file_id;
        for to in SchemeId::ALL {
            vol.setxattr(f, SCHEME_XATTR, to.name().as_bytes(), XattrMode::Set)
                .unwrap();
            assert_eq!(vol.stat("/f").unwrap().scheme, to.name());
            assert_eq!(read_all(&vol, "/f").unwrap(), want, "{from:?} -> {to:?}");
        }
        vol.sync().unwrap();
        assert_ne!(vol.stat("/f").unwrap().file_id, old_id);
        assert!(vol.orphans().unwrap().is_empty(), "old objects deleted");
        drop(vol);
        let vol = open(store, &trusted).unwrap();
        assert_eq!(read_all(&vol, "/f").unwrap(), want);
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
    }
}

/// fsync of one inode: free when nothing of it is unsealed (the anchor does not move, and
/// another file's pending change is not sealed by it); a seal when it has changes.
#[test]
fn fsync_seals_only_when_the_inode_has_unsealed_changes() {
    use intact_core::store::TrustedStore;
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let a = file(&vol, ROOT_INO, "a", b"a0");
    let b = file(&vol, ROOT_INO, "b", b"b0");
    vol.sync().unwrap();
    let anchor = || trusted.load().unwrap().unwrap();
    let sealed = anchor();
    vol.fsync(a).unwrap();
    assert_eq!(anchor(), sealed, "a clean file's fsync seals nothing");
    vol.write_ino(b, 0, b"b1").unwrap();
    vol.fsync(a).unwrap();
    assert_eq!(
        anchor(),
        sealed,
        "fsync(a) does not wait to seal b's change"
    );
    vol.fsync(b).unwrap();
    let sealed_b = anchor();
    assert_ne!(sealed_b, sealed, "fsync(b) seals b's change");
    vol.setattr(
        a,
        &SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    vol.fsync(a).unwrap();
    assert_ne!(anchor(), sealed_b, "an attribute change is sealed by fsync");
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    let mut buf = [0u8; 2];
    vol.read_ino(b, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"b1");
    assert_eq!(vol.attr(a).unwrap().mode, 0o600);
}

/// FIFOs, sockets and device nodes: inodes with no content, carried through links,
/// renames, attribute changes and reopens like any other (mknod(2) through FUSE).
#[test]
fn special_files() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let d = vol
        .create_at(ROOT_INO, "d", Kind::Dir, 0o755, 0, 0, None)
        .unwrap()
        .ino;
    let rdev = (8 << 8) | 1; // old-style major 8, minor 1
    let mut made = Vec::new();
    for (name, kind) in [
        ("fifo", Kind::Fifo),
        ("sock", Kind::Socket),
        ("chr", Kind::CharDev),
        ("blk", Kind::BlockDev),
    ] {
        let a = vol
            .mknod_at(ROOT_INO, name, kind, 0o640, rdev, 1000, 100)
            .unwrap();
        assert_eq!(
            (a.kind, a.mode, a.uid, a.gid, a.nlink),
            (kind, 0o640, 1000, 100, 1)
        );
        assert_eq!(a.rdev, if kind.is_device() { rdev } else { 0 }, "{name}");
        assert_eq!(a.size, 0);
        made.push((name, kind, a.ino));
    }
    // A regular file truncates through setattr; a directory is EISDIR; a FIFO has no
    // content and no truncation (EINVAL, as ext4); no other kind through mknod.
    let f = file(&vol, ROOT_INO, "plain", b"0123456789");
    let a = vol
        .setattr(
            f,
            &SetAttr {
                size: Some(4),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.size, 4);
    assert_eq!(
        fs_kind(vol.setattr(
            d,
            &SetAttr {
                size: Some(0),
                ..Default::default()
            }
        )),
        FsErrorKind::IsADirectory
    );
    let fifo = made[0].2;
    assert!(vol.read_ino(fifo, 0, &mut [0u8; 4]).is_err());
    assert!(matches!(
        vol.setattr(
            fifo,
            &SetAttr {
                size: Some(0),
                ..Default::default()
            }
        ),
        Err(Error::Invalid(_))
    ));
    assert_eq!(
        fs_kind(vol.mknod_at(ROOT_INO, "x", Kind::Dir, 0o755, 0, 0, 0)),
        FsErrorKind::NotSupported
    );
    assert_eq!(
        fs_kind(vol.mknod_at(ROOT_INO, "fifo", Kind::Fifo, 0o644, 0, 0, 0)),
        FsErrorKind::Exists
    );
    // A regular file through mknod is a regular file.
    let f = vol
        .mknod_at(ROOT_INO, "reg", Kind::File, 0o600, 0, 0, 0)
        .unwrap();
    assert_eq!(f.kind, Kind::File);
    // Links, renames across directories, attribute changes.
    vol.link_at(fifo, d, "fifo2").unwrap();
    assert_eq!(vol.attr(fifo).unwrap().nlink, 2);
    vol.rename_at(ROOT_INO, "chr", d, "chr", RenameMode::Replace)
        .unwrap();
    vol.setattr(
        made[1].2,
        &SetAttr {
            mode: Some(0o600),
            uid: Some(7),
            ..Default::default()
        },
    )
    .unwrap();
    vol.unlink_at(ROOT_INO, "fifo").unwrap();
    assert_eq!(vol.attr(fifo).unwrap().nlink, 1, "the other name keeps it");
    // A hard link to a symlink too (link(2) does not follow): removing one name keeps
    // the other, and the inode (this freed it and raised an alarm before).
    let l = vol.symlink_at(ROOT_INO, "ln", "target", 0, 0).unwrap().ino;
    vol.link_at(l, d, "ln2").unwrap();
    vol.unlink_at(ROOT_INO, "ln").unwrap();
    assert_eq!(vol.readlink_ino(l).unwrap(), "target");
    vol.sync().unwrap();
    let check = |vol: &intact_core::Volume| {
        let names = |dir: u64| {
            vol.readdir_page(dir, 0, 1000)
                .unwrap()
                .1
                .into_iter()
                .map(|(_, e)| (e.name, e.kind))
                .collect::<Vec<_>>()
        };
        let root = names(ROOT_INO);
        assert!(root.contains(&("sock".into(), Kind::Socket)), "{root:?}");
        assert!(root.contains(&("blk".into(), Kind::BlockDev)), "{root:?}");
        assert!(!root.iter().any(|(n, _)| n == "fifo" || n == "chr"));
        let sub = names(d);
        assert!(sub.contains(&("fifo2".into(), Kind::Fifo)), "{sub:?}");
        assert!(sub.contains(&("chr".into(), Kind::CharDev)), "{sub:?}");
        let chr = vol.lookup(d, "chr").unwrap();
        assert_eq!((chr.rdev, chr.mode), (rdev, 0o640));
        let sock = vol.lookup(ROOT_INO, "sock").unwrap();
        assert_eq!((sock.mode, sock.uid, sock.rdev), (0o600, 7, 0));
        assert_eq!(vol.lookup(d, "fifo2").unwrap().nlink, 1);
        assert_eq!(
            vol.readlink_ino(vol.lookup(d, "ln2").unwrap().ino).unwrap(),
            "target"
        );
        assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
        let info = vol.info().unwrap();
        assert_eq!((info.special_files, info.symlinks), (4, 1));
    };
    check(&vol);
    drop(vol);
    check(&open(store.clone(), &trusted).unwrap());
}

/// A directory's link count is 2 plus its subdirectories (its entry, its `.`, and each
/// subdirectory's `..`), through mkdir, rmdir, renames across directories and reopens.
#[test]
fn directory_link_counts() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let mkdir = |p: u64, n: &str| {
        vol.create_at(p, n, Kind::Dir, 0o755, 0, 0, None)
            .unwrap()
            .ino
    };
    let nlink = |vol: &intact_core::Volume, ino: u64| vol.attr(ino).unwrap().nlink;
    assert_eq!(nlink(&vol, ROOT_INO), 2);
    let a = mkdir(ROOT_INO, "a");
    let b = mkdir(ROOT_INO, "b");
    mkdir(a, "x");
    mkdir(a, "y");
    file(&vol, a, "f", b"not a directory");
    vol.mknod_at(a, "p", Kind::Fifo, 0o644, 0, 0, 0).unwrap();
    assert_eq!(
        (nlink(&vol, ROOT_INO), nlink(&vol, a), nlink(&vol, b)),
        (4, 4, 2)
    );
    vol.rmdir_at(a, "y").unwrap();
    assert_eq!(nlink(&vol, a), 3);
    vol.rename_at(a, "x", b, "x", RenameMode::Replace).unwrap();
    assert_eq!((nlink(&vol, a), nlink(&vol, b)), (2, 3));
    // Replacing an empty directory keeps the target's count.
    mkdir(a, "z");
    vol.rename_at(b, "x", a, "z", RenameMode::Replace).unwrap();
    assert_eq!((nlink(&vol, a), nlink(&vol, b)), (3, 2));
    vol.rename_at(ROOT_INO, "b", a, "b", RenameMode::Replace)
        .unwrap();
    assert_eq!((nlink(&vol, ROOT_INO), nlink(&vol, a)), (3, 4));
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store.clone(), &trusted).unwrap();
    assert_eq!((nlink(&vol, ROOT_INO), nlink(&vol, a)), (3, 4));
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}

/// A read of an inode that is not a regular file is refused and names it by its path (the
/// read runs outside the request helper that names paths: it names them itself).
#[test]
fn a_read_of_a_directory_is_refused_and_names_it() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let d = vol
        .create_at(ROOT_INO, "d", Kind::Dir, 0o755, 0, 0, None)
        .unwrap()
        .ino;
    let sub = vol
        .create_at(d, "sub", Kind::Dir, 0o755, 0, 0, None)
        .unwrap()
        .ino;
    let mut buf = [0u8; 16];
    match vol.read_ino(sub, 0, &mut buf) {
        Err(Error::Fs { path, kind }) => {
            assert_eq!(kind, FsErrorKind::IsADirectory);
            assert_eq!(path, "/d/sub");
        }
        other => panic!("read of a directory: {other:?}"),
    }
}

/// The set-ID bits a write, truncate or chown clears (`killed_suidgid`, as Linux's
/// `setattr_should_drop_suidgid`): set-user-ID always, set-group-ID only when the group
/// may execute. `kill_suidgid` clears them and says so, and changes nothing (not even the
/// ctime) on a file without them or on a directory; a setattr that asks for it clears
/// them after its other changes. All of it survives a reopen.
#[test]
fn set_id_bits_are_cleared_where_linux_clears_them() {
    use intact_core::volume::killed_suidgid;
    assert_eq!(killed_suidgid(0o6755), 0o755);
    assert_eq!(killed_suidgid(0o4644), 0o644);
    assert_eq!(killed_suidgid(0o2745), 0o2745, "no group execute: kept");
    assert_eq!(killed_suidgid(0o2710), 0o710);
    assert_eq!(killed_suidgid(0o1777), 0o1777, "the sticky bit stays");
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096);
    let set_mode = |ino: u64, mode: u32| {
        vol.setattr(
            ino,
            &SetAttr {
                mode: Some(mode),
                ..Default::default()
            },
        )
        .unwrap();
    };
    let plain = file(&vol, ROOT_INO, "plain", b"p");
    let before = vol.attr(plain).unwrap();
    assert!(!vol.kill_suidgid(plain).unwrap());
    assert_eq!(
        vol.attr(plain).unwrap().ctime_ns,
        before.ctime_ns,
        "nothing changed"
    );
    let f = file(&vol, ROOT_INO, "f", b"f");
    set_mode(f, 0o6755);
    assert!(vol.kill_suidgid(f).unwrap());
    assert_eq!(vol.attr(f).unwrap().mode, 0o755);
    let g = file(&vol, ROOT_INO, "g", b"g");
    set_mode(g, 0o2745);
    assert!(!vol.kill_suidgid(g).unwrap());
    assert_eq!(vol.attr(g).unwrap().mode, 0o2745);
    let d = vol
        .create_at(ROOT_INO, "d", Kind::Dir, 0o2755, 0, 0, None)
        .unwrap()
        .ino;
    assert!(!vol.kill_suidgid(d).unwrap());
    let chown = |ino: u64| {
        vol.setattr(
            ino,
            &SetAttr {
                gid: Some(7),
                kill_suidgid: true,
                ..Default::default()
            },
        )
        .unwrap()
    };
    assert_eq!(chown(d).mode, 0o2755, "a directory keeps its bits");
    let h = file(&vol, ROOT_INO, "h", b"h");
    set_mode(h, 0o4711);
    let a = chown(h);
    assert_eq!((a.mode, a.gid), (0o711, 7));
    vol.sync().unwrap();
    drop(vol);
    let vol = open(store, &trusted).unwrap();
    let mode = |name: &str| vol.lookup(ROOT_INO, name).unwrap().mode;
    assert_eq!(
        [mode("f"), mode("g"), mode("d"), mode("h")],
        [0o755, 0o2745, 0o2755, 0o711]
    );
}
