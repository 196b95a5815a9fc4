//! The scripted workload of the crash tests (`crash.rs` over the fault store in memory,
//! `crash_states.rs` over the real local-directory store).

use super::*;
use intact_core::format::ROOT_INO;
use intact_core::volume::{Kind, RenameMode, XattrMode, SCHEME_XATTR};
use intact_core::{Result, Volume};
use std::collections::BTreeMap;

/// The expected tree: `p` a file's bytes, `p/` a directory, `p@name` an extended attribute.
pub type Model = BTreeMap<String, Vec<u8>>;

/// Content that alternates by seed between random-looking, incompressible bytes (odd seeds)
/// and text (even seeds), so that RAND-EINT / COMP-EINT blocks move in and out of RTree as
/// the workload overwrites them.
pub fn flip(seed: u8, len: usize) -> Vec<u8> {
    if !seed.is_multiple_of(2) {
        noise(seed, len)
    } else {
        text(seed, len)
    }
}

/// The workload: operations interleaved with sync points. `points` gets a copy of the
/// model after each operation and at each sync (the log makes every operation durable
/// against a crash of the process once it returns, so a recovery may come back at any of
/// them after the last sync), `syncs` the index in `points` of each sync's tree, `done` the
/// number of trees up to the last sync that returned; `synced` is called as each returns.
pub fn workload_with(
    vol: &Volume,
    bs: usize,
    points: &mut Vec<Model>,
    done: &mut usize,
    pattern: fn(u8, usize) -> Vec<u8>,
    synced: &mut dyn FnMut(),
) -> Result<()> {
    let mut syncs = Vec::new();
    workload_at(vol, bs, points, &mut syncs, done, pattern, synced)
}

/// [`workload_with`], also giving the index in `points` of each sync's tree.
pub fn workload_at(
    vol: &Volume,
    bs: usize,
    points: &mut Vec<Model>,
    syncs: &mut Vec<usize>,
    done: &mut usize,
    pattern: fn(u8, usize) -> Vec<u8>,
    synced: &mut dyn FnMut(),
) -> Result<()> {
    let mut m: Model = BTreeMap::new();
    let mut sync = |m: &Model, points: &mut Vec<Model>, done: &mut usize| -> Result<()> {
        points.push(m.clone());
        syncs.push(points.len() - 1);
        vol.sync()?;
        *done = points.len();
        synced();
        Ok(())
    };
    let step = |m: &Model, points: &mut Vec<Model>| points.push(m.clone());
    let put = |m: &mut Model, path: &str, off: usize, data: &[u8]| -> Result<()> {
        vol.write_path(path, off as u64, data)?;
        let f = m.get_mut(path).expect("created");
        if f.len() < off + data.len() {
            f.resize(off + data.len(), 0);
        }
        f[off..off + data.len()].copy_from_slice(data);
        Ok(())
    };
    vol.create_file("/f1", None)?;
    m.insert("/f1".into(), vec![]);
    step(&m, points);
    put(&mut m, "/f1", 0, &pattern(1, 3 * bs + 100))?;
    step(&m, points);
    sync(&m, points, done)?;

    put(&mut m, "/f1", bs + 7, &pattern(2, bs))?;
    step(&m, points);
    vol.create_file("/f2", None)?;
    m.insert("/f2".into(), vec![]);
    step(&m, points);
    put(&mut m, "/f2", 0, &pattern(3, 10 * bs + 1))?;
    step(&m, points);
    // A small file: one block, its tree inline in its record where the scheme can.
    vol.create_file("/s", None)?;
    m.insert("/s".into(), vec![]);
    step(&m, points);
    put(&mut m, "/s", 0, &pattern(11, bs / 3))?;
    step(&m, points);
    sync(&m, points, done)?;

    vol.truncate("/f1", (bs + bs / 2) as u64)?;
    m.get_mut("/f1").unwrap().truncate(bs + bs / 2);
    step(&m, points);
    put(&mut m, "/f2", 10 * bs + 1, &pattern(4, 2 * bs))?;
    step(&m, points);
    vol.mkdir("/d")?;
    m.insert("/d/".into(), vec![]);
    step(&m, points);
    vol.rename("/f2", "/d/f2")?;
    let f2 = m.remove("/f2").unwrap();
    m.insert("/d/f2".into(), f2);
    step(&m, points);
    sync(&m, points, done)?;

    vol.unlink("/f1")?;
    m.remove("/f1");
    step(&m, points);
    vol.create_file("/f3", None)?;
    m.insert("/f3".into(), vec![]);
    step(&m, points);
    put(&mut m, "/f3", 5 * bs, &pattern(5, 3))?; // sparse
    step(&m, points);
    put(&mut m, "/f3", 0, &pattern(6, bs / 2))?;
    step(&m, points);
    put(&mut m, "/s", 5, &pattern(12, 10))?; // overwritten, still one block
    step(&m, points);
    sync(&m, points, done)?;

    // Past the 3,720 bytes a file keeps in the inode table's slots (at the tests' small
    // block sizes): under `mt-eint` with GCM, d/f2 moves from slots to blocks here
    // (docs/design.md, "Small files in the inode table"); f1, f3, s and f4 stay in slots.
    put(&mut m, "/d/f2", 0, &pattern(7, 40 * bs + 1))?;
    step(&m, points);
    // Single blocks overwritten apart: the counter intervals of d/f2 spill into its `.c`
    // object, which later requests change by edits (docs/design.md, "Counters in the
    // log"); the last write merges some of them again.
    for (i, b) in [1usize, 3, 5, 7, 9].into_iter().enumerate() {
        put(&mut m, "/d/f2", b * bs + 3, &pattern(20 + i as u8, 5))?;
        step(&m, points);
    }
    put(&mut m, "/d/f2", 2 * bs, &pattern(26, 5 * bs))?;
    step(&m, points);
    vol.truncate("/f3", 0)?;
    m.get_mut("/f3").unwrap().clear();
    step(&m, points);
    put(&mut m, "/f3", 0, &pattern(8, 2 * bs))?;
    step(&m, points);
    vol.create_file("/d/f4", None)?;
    m.insert("/d/f4".into(), vec![]);
    step(&m, points);
    put(&mut m, "/s", bs - 1, &pattern(13, 2))?; // grows past one block
    step(&m, points);
    // Cut back to four blocks of three counter intervals: under `mt-eint` with GCM its
    // tree leaves `.m` for the record (docs/file-format.md §4, inline leaves).
    vol.truncate("/d/f2", (3 * bs + 10) as u64)?;
    m.get_mut("/d/f2").unwrap().truncate(3 * bs + 10);
    step(&m, points);
    sync(&m, points, done)?;

    // The inode-level operations of the FUSE adapter: a hard link, an extended attribute
    // (model key `path@name`), a file unlinked while open (still open at most crashes),
    // re-encryption under another scheme, and an atomic exchange.
    let f3 = vol.lookup(ROOT_INO, "f3")?.ino;
    let d = vol.lookup(ROOT_INO, "d")?.ino;
    vol.link_at(f3, d, "h")?;
    m.insert("/d/h".into(), m["/f3"].clone());
    step(&m, points);
    vol.setxattr(f3, "user.k", b"v1", XattrMode::Set)?;
    m.insert("/f3@user.k".into(), b"v1".to_vec());
    m.insert("/d/h@user.k".into(), b"v1".to_vec());
    step(&m, points);
    let tmp = vol
        .create_at(ROOT_INO, "tmp", Kind::File, 0o644, 0, 0, None)?
        .ino;
    m.insert("/tmp".into(), vec![]);
    step(&m, points);
    vol.open_handle(tmp)?;
    vol.write_ino(tmp, 0, &pattern(9, 3 * bs))?;
    m.insert("/tmp".into(), pattern(9, 3 * bs));
    step(&m, points);
    vol.unlink_at(ROOT_INO, "tmp")?;
    m.remove("/tmp");
    step(&m, points);
    vol.write_ino(tmp, 3 * bs as u64, b"more")?;
    sync(&m, points, done)?;

    put(&mut m, "/d/f4", 0, &pattern(10, 2 * bs + 3))?;
    step(&m, points);
    let f4 = vol.lookup(d, "f4")?.ino;
    let other = if vol.stat("/d/f4")?.scheme == "mt-eint-cbc" {
        "mt-eint"
    } else {
        "mt-eint-cbc"
    };
    vol.setxattr(f4, SCHEME_XATTR, other.as_bytes(), XattrMode::Set)?;
    vol.rename_at(ROOT_INO, "f3", d, "f2", RenameMode::Exchange)?;
    let (a, b) = (m.remove("/f3").unwrap(), m.remove("/d/f2").unwrap());
    m.insert("/f3".into(), b);
    m.insert("/d/f2".into(), a);
    let x = m.remove("/f3@user.k").unwrap();
    m.insert("/d/f2@user.k".into(), x);
    step(&m, points);
    vol.setxattr(f3, "user.k", b"v2", XattrMode::Replace)?;
    m.insert("/d/f2@user.k".into(), b"v2".to_vec());
    m.insert("/d/h@user.k".into(), b"v2".to_vec());
    step(&m, points);
    vol.release_handle(tmp)?;
    sync(&m, points, done)?;
    Ok(())
}

/// Whether `state` is what a recovery may come back to, given the trees `points` from the
/// last sync that returned on: exactly one of them (a process crash keeps everything
/// logged; a power cut keeps a prefix of the log), or, where the store lost writes that
/// were never fsynced, one of them with some files back at an earlier content of theirs
/// (docs/design.md, "The log": a file's logged writes whose data did not reach the store
/// are left out, from the first such write on).
pub fn explained(state: &Model, points: &[Model], partial: bool) -> bool {
    if points.contains(state) {
        return true;
    }
    partial
        && points.iter().enumerate().any(|(k, pk)| {
            pk.keys().eq(state.keys())
                && state
                    .iter()
                    .all(|(_, v)| points[..=k].iter().any(|pj| pj.values().any(|w| w == v)))
        })
}

/// The whole tree of a volume, as a [`Model`] (a symlink reads `-> target`).
pub fn read_state(vol: &Volume) -> Result<Model> {
    let mut out = Model::new();
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        for e in vol.readdir(if dir.is_empty() { "/" } else { &dir })? {
            let p = format!("{dir}/{}", e.name);
            match e.kind {
                Kind::Dir => {
                    out.insert(format!("{p}/"), vec![]);
                    stack.push(p);
                }
                Kind::Symlink => {
                    out.insert(p.clone(), format!("-> {}", vol.readlink(&p)?).into_bytes());
                }
                _ => {
                    out.insert(p.clone(), read_all(vol, &p)?);
                    for name in vol.listxattr(e.ino)? {
                        if name != SCHEME_XATTR {
                            out.insert(format!("{p}@{name}"), vol.getxattr(e.ino, &name)?);
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}
