//! The engine is shared between threads (the FUSE mount will call it from many): concurrent
//! writers on different files and on the same file, readers, and syncs, then a reopen.

mod common;

use common::*;
use intact_core::format::SchemeId;
use intact_core::store::{MemStore, MemTrusted};
use intact_core::Volume;
use std::sync::Arc;

#[test]
fn volume_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Volume>();
}

#[test]
fn concurrent_writers_readers_and_syncs() {
    let store = Arc::new(MemStore::new());
    let trusted = MemTrusted::new();
    let vol = Arc::new(create(store.clone(), &trusted, SchemeId::MtEintGcm, 4096));
    vol.create_file("/shared", None).unwrap();
    const T: usize = 4;
    const CHUNK: usize = 10_000;
    std::thread::scope(|s| {
        for t in 0..T {
            let vol = vol.clone();
            s.spawn(move || {
                let own = format!("/own{t}");
                vol.create_file(&own, None).unwrap();
                for round in 0..20u8 {
                    let data = pattern(t as u8 ^ round, CHUNK);
                    vol.write_path(&own, (round as usize * CHUNK) as u64, &data)
                        .unwrap();
                    // Disjoint ranges of one shared file.
                    vol.write_path(
                        "/shared",
                        ((round as usize * T + t) * 1000) as u64,
                        &[t as u8; 1000],
                    )
                    .unwrap();
                    let mut back = vec![0u8; CHUNK];
                    vol.read_path(&own, (round as usize * CHUNK) as u64, &mut back)
                        .unwrap();
                    assert_eq!(back, data);
                    if round % 7 == t as u8 {
                        vol.sync().unwrap();
                    }
                }
            });
        }
    });
    drop(Arc::try_unwrap(vol).ok().expect("threads done"));
    let vol = open(store, &trusted).unwrap();
    for t in 0..T {
        let data = read_all(&vol, &format!("/own{t}")).unwrap();
        for round in 0..20u8 {
            assert_eq!(
                &data[round as usize * CHUNK..(round as usize + 1) * CHUNK],
                &pattern(t as u8 ^ round, CHUNK)[..]
            );
        }
    }
    let shared = read_all(&vol, "/shared").unwrap();
    for (k, chunk) in shared.chunks(1000).enumerate() {
        assert!(
            chunk.iter().all(|&b| b as usize == k % T),
            "shared chunk {k}"
        );
    }
    assert!(vol.fsck(&mut |_| {}).unwrap().is_empty());
}
