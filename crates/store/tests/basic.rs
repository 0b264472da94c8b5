//! API behaviour of the store against a model and by hand.

mod common;

use bytes::Bytes;
use cairn_store::*;
use common::*;

fn cfg(dir: &std::path::Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.data_bytes = 256 << 20;
    c.cache_bytes = 16 << 20;
    c.meta_reserve_bytes = 0;
    c
}

#[test]
fn model_workload_matches_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let seed = 42;
    let mut models = [Model::default(), Model::default()];
    {
        let s = Store::create(cfg(dir.path())).unwrap();
        let mut t = Transaction::new();
        t.create_collection(coll(0)).create_collection(coll(1));
        s.commit(t).unwrap();
        for i in 1..=150u64 {
            for (w, m) in models.iter_mut().enumerate() {
                let ops = gen(seed, w, i, m);
                s.commit(to_txn(coll(w), &ops)).unwrap();
                apply(m, &ops);
                m.idx = i;
            }
            if i % 50 == 0 {
                for (w, m) in models.iter().enumerate() {
                    check(&s, w, m);
                }
            }
        }
        assert!(s.deep_fsck().unwrap().is_clean());
    }
    let s = Store::open(cfg(dir.path())).unwrap();
    for (w, m) in models.iter().enumerate() {
        assert_eq!(last_applied(&s, w), 150);
        check(&s, w, m);
    }
    let rep = s.deep_fsck().unwrap();
    assert!(rep.is_clean(), "{:?}", rep.issues);
}

#[test]
fn errors_leave_other_transactions_alone() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(cfg(dir.path())).unwrap();
    let c = CollectionId::pg(1, 0);
    let o = ObjectId::new(1, "a");
    let mut t = Transaction::new();
    t.create_collection(c);
    s.commit(t).unwrap();
    // Submit a good, a bad and a good transaction together: only the bad one fails.
    let mut good1 = Transaction::new();
    good1.write(c, o.clone(), 0, Bytes::from_static(b"hello"));
    let mut bad = Transaction::new();
    bad.write(c, o.clone(), 0, Bytes::from_static(b"XXXXX"))
        .remove(c, ObjectId::new(2, "missing"));
    let mut good2 = Transaction::new();
    good2.setattr(c, o.clone(), "x", Bytes::from_static(b"1"));
    let h1 = s.submit(good1).unwrap();
    let h2 = s.submit(bad).unwrap();
    let h3 = s.submit(good2).unwrap();
    h1.wait().unwrap();
    assert!(matches!(h2.wait(), Err(StoreError::NoSuchObject { .. })));
    h3.wait().unwrap();
    assert_eq!(s.read(&c, &o, 0, 100).unwrap(), b"hello");
    assert_eq!(s.getattr(&c, &o, "x").unwrap().unwrap(), b"1");
    // Errors name what failed.
    let mut t = Transaction::new();
    t.write(c, o.clone(), 200 << 20, Bytes::from_static(b"x"));
    let e = s.commit(t).unwrap_err();
    assert!(matches!(e, StoreError::ObjectTooLarge { .. }), "{e}");
    let mut t = Transaction::new();
    t.create_collection(c);
    assert!(matches!(s.commit(t), Err(StoreError::CollectionExists(_))));
    let mut t = Transaction::new();
    t.remove_collection(c);
    assert!(matches!(
        s.commit(t),
        Err(StoreError::CollectionNotEmpty { .. })
    ));
    let mut t = Transaction::new();
    t.create(c, o.clone());
    assert!(matches!(s.commit(t), Err(StoreError::ObjectExists { .. })));
    assert!(matches!(
        s.read(&CollectionId::pg(9, 9), &o, 0, 1),
        Err(StoreError::NoSuchCollection(_))
    ));
}

#[test]
fn sparse_reads_holes_and_eof() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(cfg(dir.path())).unwrap();
    let c = CollectionId::pg(1, 0);
    let o = ObjectId::new(7, "sparse");
    let mut t = Transaction::new();
    t.create_collection(c)
        .write(c, o.clone(), 1 << 20, vec![7u8; 10]);
    s.commit(t).unwrap();
    let st = s.stat(&c, &o).unwrap();
    assert_eq!(st.size, (1 << 20) + 10);
    assert_eq!(st.allocated_bytes, 4096);
    assert_eq!(s.read(&c, &o, 0, 8).unwrap(), vec![0u8; 8]);
    assert_eq!(s.read(&c, &o, (1 << 20) + 5, 100).unwrap(), vec![7u8; 5]);
    assert!(s.read(&c, &o, 5 << 20, 100).unwrap().is_empty());
}

#[test]
fn full_store_fails_cleanly_and_frees_space() {
    let dir = tempfile::tempdir().unwrap();
    let mut c0 = cfg(dir.path());
    c0.data_bytes = 16 << 20;
    c0.full_ratio = 0.9;
    c0.nearfull_ratio = 0.5;
    let s = Store::create(c0).unwrap();
    let c = CollectionId::pg(1, 0);
    let mut t = Transaction::new();
    t.create_collection(c);
    s.commit(t).unwrap();
    let chunk = Bytes::from(vec![1u8; 1 << 20]);
    let mut n = 0;
    let err = loop {
        let mut t = Transaction::new();
        t.write(c, ObjectId::new(n, format!("o{n}")), 0, chunk.clone())
            .omap_set(
                c,
                ObjectId::new(n, format!("o{n}")),
                vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
            );
        match s.commit(t) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 64, "store never filled");
    };
    assert!(err.is_full(), "{err}");
    let st = s.statfs().unwrap();
    assert_ne!(st.state, FullState::Ok);
    assert!(st.available_bytes < 1 << 20, "{st:?}");
    // Metadata-only and deleting transactions still commit when data is full.
    let mut t = Transaction::new();
    t.meta_set(c, "still", Bytes::from_static(b"works"))
        .remove(c, ObjectId::new(0, "o0"))
        .remove(c, ObjectId::new(1, "o1"));
    s.commit(t).unwrap();
    // The freed space becomes visible (after the freeing commit; a further commit drains it).
    let mut t = Transaction::new();
    t.meta_set(c, "tick", Bytes::from_static(b"1"));
    s.commit(t).unwrap();
    let st2 = s.statfs().unwrap();
    assert_eq!(st.used_bytes - st2.used_bytes, 2 << 20);
    let mut t = Transaction::new();
    t.write(c, ObjectId::new(0, "o0"), 0, chunk.clone());
    s.commit(t).unwrap();
}

#[test]
fn async_commit_from_tokio_style_poll() {
    // CommitHandle is a Future; drive it with a minimal executor.
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(cfg(dir.path())).unwrap();
    let mut t = Transaction::new();
    t.create_collection(CollectionId::pg(1, 1));
    let h = s.submit(t).unwrap();
    let r = futures_lite_block_on(h);
    r.unwrap();
    assert!(s.collection_exists(&CollectionId::pg(1, 1)).unwrap());
}

fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[test]
fn checksum_corruption_is_detected_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let c = CollectionId::pg(3, 1);
    let o = ObjectId::new(0xabc, "victim");
    {
        let s = Store::create(cfg(dir.path())).unwrap();
        let mut t = Transaction::new();
        t.create_collection(c)
            .write(c, o.clone(), 0, vec![9u8; 3 * 4096]);
        s.commit(t).unwrap();
        assert!(s.deep_fsck().unwrap().is_clean());
    }
    // The first data block follows the 4 KiB label; damage the second block of the object.
    let path = dir.path().join(DATA_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096 + 4096 + 17] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();
    let s = Store::open(cfg(dir.path())).unwrap();
    assert_eq!(s.read(&c, &o, 0, 4096).unwrap(), vec![9u8; 4096]);
    match s.read(&c, &o, 0, 3 * 4096) {
        Err(StoreError::Checksum {
            coll, obj, offset, ..
        }) => {
            assert_eq!((coll, obj, offset), (c, o.clone(), 4096));
        }
        other => panic!("expected checksum error, got {other:?}"),
    }
    let e = s.read(&c, &o, 4096, 1).unwrap_err().to_string();
    assert!(e.contains("victim") && e.contains("offset 4096"), "{e}");
    assert!(s.fsck().unwrap().is_clean());
    let rep = s.deep_fsck().unwrap();
    assert_eq!(rep.issues.len(), 1, "{:?}", rep.issues);
    assert_eq!(rep.issues[0].kind, "checksum");
    assert_eq!(rep.issues[0].object.as_ref(), Some(&o));
    assert_eq!(rep.issues[0].offset, Some(4096));
    // A partial overwrite of the damaged block must not launder it: RMW reads fail.
    let mut t = Transaction::new();
    t.write(c, o.clone(), 4096 + 1, vec![1u8; 10]);
    assert!(matches!(s.commit(t), Err(StoreError::Checksum { .. })));
    // A full-block overwrite replaces it.
    let mut t = Transaction::new();
    t.write(c, o.clone(), 4096, vec![2u8; 4096]);
    s.commit(t).unwrap();
    assert!(s.deep_fsck().unwrap().is_clean());
}

#[test]
fn second_open_is_refused_while_locked() {
    let dir = tempfile::tempdir().unwrap();
    let _s = Store::create(cfg(dir.path())).unwrap();
    assert!(matches!(
        Store::open(cfg(dir.path())),
        Err(StoreError::Format { .. })
    ));
}

#[test]
fn zero_frees_whole_blocks_visible_in_statfs() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(cfg(dir.path())).unwrap();
    let c = CollectionId::pg(1, 3);
    let o = ObjectId::new(3, "z");
    let mut t = Transaction::new();
    t.create_collection(c)
        .write(c, o.clone(), 0, vec![7u8; 1 << 20]);
    s.commit(t).unwrap();
    let before = s.statfs().unwrap().used_bytes;
    assert_eq!(s.stat(&c, &o).unwrap().allocated_bytes, 1 << 20);
    // Blocks 2..129 are wholly inside the range and are freed; the partial
    // edge blocks 1 and 129 are rewritten (one new block each, old one freed).
    let (off, len) = (4096 + 100, 512 << 10);
    let mut t = Transaction::new();
    t.zero(c, o.clone(), off, len);
    s.commit(t).unwrap();
    let mut t = Transaction::new();
    t.meta_set(c, "tick", Bytes::from_static(b"1"));
    s.commit(t).unwrap();
    let freed = 127 * 4096;
    assert_eq!(before - s.statfs().unwrap().used_bytes, freed);
    assert_eq!(s.stat(&c, &o).unwrap().allocated_bytes, (1 << 20) - freed);
    let d = s.read(&c, &o, 0, 1 << 20).unwrap();
    assert!(d[..off as usize].iter().all(|&b| b == 7));
    assert!(d[off as usize..(off + len) as usize]
        .iter()
        .all(|&b| b == 0));
    assert!(d[(off + len) as usize..].iter().all(|&b| b == 7));
    assert!(s.deep_fsck().unwrap().is_clean());
}

#[test]
fn store_without_its_wal_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::create(cfg(dir.path())).unwrap());
    std::fs::remove_file(dir.path().join(WAL_FILE)).unwrap();
    let e = Store::open(cfg(dir.path())).err().expect("open must fail");
    assert!(e.to_string().contains("write-ahead log"), "{e}");
}

#[test]
fn read_bytes_matches_read_for_big_unaligned_and_sparse_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(cfg(dir.path())).unwrap();
    let c = CollectionId::pg(1, 0);
    let o = ObjectId::new(1, "big");
    let data: Vec<u8> = (0..(3u32 << 20))
        .map(|i| (i * 7 + i / 4093) as u8)
        .collect();
    let mut t = Transaction::new();
    t.create_collection(c);
    // 3 MiB of data, a 1 MiB hole, then 300 KiB at an unaligned offset.
    t.write(c, o.clone(), 0, Bytes::from(data.clone()));
    t.write(
        c,
        o.clone(),
        (4 << 20) + 123,
        Bytes::from(data[..300 << 10].to_vec()),
    );
    s.commit(t).unwrap();
    let size = (4u64 << 20) + 123 + (300 << 10);
    for (off, len) in [
        (0u64, 3u64 << 20),
        (0, 4 << 20),
        (4096, 1 << 20),
        (1, (1 << 20) + 5),
        (4095, 200 << 10),
        ((3 << 20) - 100, 2 << 20),
        ((4 << 20) + 100, 1 << 20),
        (0, size),
        (0, size + 4096),
        (size - 10, 64 << 10),
        (size + 1, 128 << 10),
        (10, 100),
    ] {
        let plain = s.read(&c, &o, off, len).unwrap();
        let shared = s.read_bytes(&c, &o, off, len).unwrap();
        assert_eq!(plain.len(), shared.len(), "length at {off}+{len}");
        assert!(plain == shared[..], "content at {off}+{len}");
    }
    assert_eq!(&s.read_bytes(&c, &o, 0, 3 << 20).unwrap()[..], &data[..]);
}

#[test]
fn read_with_attrs_answers_as_read_bytes_stat_and_getattrs() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(cfg(dir.path())).unwrap();
    let c = CollectionId::pg(1, 0);
    let o = ObjectId::new(1, "small");
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 13) as u8).collect();
    let mut t = Transaction::new();
    t.create_collection(c);
    t.write(c, o.clone(), 0, Bytes::from(data.clone()));
    t.setattr(c, o.clone(), "_v", Bytes::from_static(b"v1"));
    t.setattr(c, o.clone(), "user.x", Bytes::from_static(b"y"));
    s.commit(t).unwrap();
    for (off, len) in [
        (0u64, 0u64),
        (0, 4096),
        (100, 0),
        (9_000, 4096),
        (20_000, 10),
    ] {
        let r = s.read_with_attrs(&c, &o, off, len).unwrap();
        let want_len = if len == 0 {
            10_000u64.saturating_sub(off)
        } else {
            len
        };
        let want = s.read_bytes(&c, &o, off, want_len).unwrap();
        assert!(r.data == want, "data at {off}+{len}");
        assert_eq!(r.size, s.stat(&c, &o).unwrap().size);
        assert_eq!(r.attrs, s.getattrs(&c, &o).unwrap());
    }
    assert_eq!(s.read_with_attrs(&c, &o, 0, 0).unwrap().data, &data[..]);
    let r = s.read_with_attrs(&c, &o, 0, 0).unwrap();
    assert_eq!(r.data_crc, crc32c::crc32c(&r.data));
    let missing = s.read_with_attrs(&c, &ObjectId::new(2, "nope"), 0, 0);
    assert!(
        matches!(missing, Err(StoreError::NoSuchObject { .. })),
        "{missing:?}"
    );
}

#[test]
fn data_kept_cached_is_read_from_the_page_cache_and_still_verified() {
    let dir = tempfile::tempdir().unwrap();
    let c = CollectionId::pg(3, 2);
    let o = ObjectId::new(0x1, "hot");
    let data: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 % 251) as u8).collect();
    let s = Store::create(cfg(dir.path())).unwrap();
    let mut t = Transaction::new();
    t.create_collection(c)
        .write(c, o.clone(), 0, data.clone())
        .keep_data_cached();
    s.commit(t).unwrap();
    assert_eq!(s.read_bytes(&c, &o, 0, 1 << 20).unwrap(), data);
    // The whole object came from the page cache (ext4 and most local file
    // systems answer RWF_NOWAIT reads).
    assert_eq!(s.page_cache_read_bytes(), 1 << 20);
    // Bytes changed under the store in the page cache (the object's first
    // block follows the 4 KiB label) fail their checksum as from the disk.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(DATA_FILE))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[data[5000] ^ 0xFF], 4096 + 5000).unwrap();
    match s.read_bytes(&c, &o, 0, 1 << 20) {
        Err(StoreError::Checksum { obj, offset, .. }) => assert_eq!((obj, offset), (o, 4096)),
        other => panic!("expected a checksum error, got {other:?}"),
    }
}

#[test]
fn default_wal_is_sized_from_the_data_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = StoreConfig::new(dir.path());
    c.data_bytes = 1 << 30;
    c.meta_reserve_bytes = 0;
    let want = c.wal_bytes_for(c.data_bytes);
    assert_eq!(want, 64 << 20);
    let s = Store::create(c.clone()).expect("create");
    drop(s);
    let len = std::fs::metadata(dir.path().join(cairn_store::WAL_FILE))
        .expect("wal")
        .len();
    assert_eq!(len, want);
    // Reopened with another setting, the log keeps the size it was made with.
    c.wal_bytes = 1 << 20;
    drop(Store::open(c).expect("reopen"));
    let len2 = std::fs::metadata(dir.path().join(cairn_store::WAL_FILE))
        .expect("wal")
        .len();
    assert_eq!(len2, want);
}

/// A read's `data_crc` is combined from the block crcs it verified (plus
/// partial blocks and holes crc'd as they are): it must equal the crc of
/// the bytes returned for every shape of range, small (page cache) and big
/// (O_DIRECT), and a block damaged on disk still fails the read.
#[test]
fn read_data_crc_is_the_crc_of_the_data_and_damage_is_still_caught() {
    let dir = tempfile::tempdir().unwrap();
    let c = CollectionId::pg(2, 0);
    let o = ObjectId::new(7, "sparse");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 4099) as u8).collect();
    {
        let s = Store::create(cfg(dir.path())).unwrap();
        let mut t = Transaction::new();
        t.create_collection(c);
        // Data, a hole of 200 KiB, more data ending mid-block.
        t.write(c, o.clone(), 0, Bytes::from(data[..150_000].to_vec()));
        t.write(c, o.clone(), 350_000, Bytes::from(data[150_000..].to_vec()));
        s.commit(t).unwrap();
        let size = 500_000u64;
        for (off, len) in [
            (0u64, 0u64),
            (0, 4096),
            (1, 10),
            (4095, 2),
            (100, 140_000),
            (140_000, 300_000),
            (200_000, 100_000),
            (300_000, 0),
            (0, 65_536),
            (4096, 4096 * 40),
        ] {
            let r = s.read_with_attrs(&c, &o, off, len).unwrap();
            let want = if len == 0 { size - off } else { len };
            assert_eq!(r.data.len() as u64, want, "length at {off}+{len}");
            assert_eq!(
                r.data_crc,
                crc32c::crc32c(&r.data),
                "crc of the data at {off}+{len}"
            );
        }
    }
    // Damage one block of the first extent (the label is block 0).
    let path = dir.path().join(DATA_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096 + 5 * 4096 + 99] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let s = Store::open(cfg(dir.path())).unwrap();
    for (off, len) in [(0u64, 0u64), (0, 100_000), (5 * 4096 + 50, 100)] {
        let r = s.read_with_attrs(&c, &o, off, len);
        assert!(
            matches!(r, Err(StoreError::Checksum { .. })),
            "a damaged block read at {off}+{len}: {:?}",
            r.map(|r| r.data.len())
        );
    }
    let r = s.read_with_attrs(&c, &o, 300_000, 0).unwrap();
    assert_eq!(r.data_crc, crc32c::crc32c(&r.data));
}

/// Writes whose block crcs the caller already verified (received data)
/// keep them: big and small, aligned and not (unaligned ones compute
/// their own), and a deep fsck finds every block matching its crc.
#[test]
fn verified_block_crcs_are_kept_and_match() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(cfg(dir.path())).unwrap();
    let c = CollectionId::pg(1, 0);
    let mut t = Transaction::new();
    t.create_collection(c);
    s.commit(t).unwrap();
    let data: Bytes = (0..(1 << 20) + 4096 * 3 + 100)
        .map(|i: u32| (i * 13 + i / 4093) as u8)
        .collect::<Vec<u8>>()
        .into();
    let crcs: std::sync::Arc<[u32]> = data.chunks_exact(4096).map(crc32c::crc32c).collect();
    let cases: [(&str, u64, Bytes); 4] = [
        ("big", 0, data.slice(..1 << 20)),
        ("small", 8192, data.slice(..4096 * 2)),
        ("tail", 0, data.clone()),
        ("unaligned", 100, data.slice(..4096 * 3)),
    ];
    for (name, off, d) in &cases {
        let n = d.len() / 4096;
        let mut t = Transaction::new();
        t.write_verified(
            c,
            ObjectId::new(1, *name),
            *off,
            d.clone(),
            crcs[..n].into(),
        );
        s.commit(t).unwrap();
    }
    for (name, off, d) in &cases {
        let got = s
            .read(&c, &ObjectId::new(1, *name), *off, d.len() as u64)
            .unwrap();
        assert_eq!(got, d.to_vec(), "{name}");
    }
    let rep = s.deep_fsck().unwrap();
    assert!(rep.is_clean(), "{:?}", rep.issues);
}

/// An unaligned verified write longer than one allocation run (256 KiB):
/// the runs after the first start inside one of the data's 4 KiB blocks,
/// so the given crcs do not apply there and the store computes its own
/// (it took the wrong ones once: `rbd map` under xfs, 512-byte-aligned
/// writes).
#[test]
fn unaligned_verified_write_spanning_runs() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(cfg(dir.path())).unwrap();
    let c = CollectionId::pg(1, 0);
    let mut t = Transaction::new();
    t.create_collection(c);
    s.commit(t).unwrap();
    let data: Bytes = (0..600 * 1024u32)
        .map(|i| (i * 7 + i / 511) as u8)
        .collect::<Vec<u8>>()
        .into();
    let crcs: std::sync::Arc<[u32]> = data.chunks_exact(4096).map(crc32c::crc32c).collect();
    let obj = ObjectId::new(1, "xfs");
    let mut t = Transaction::new();
    t.write_verified(c, obj.clone(), 512, data.clone(), crcs);
    s.commit(t).unwrap();
    let got = s.read(&c, &obj, 512, data.len() as u64).unwrap();
    assert_eq!(got, data.to_vec());
    let rep = s.deep_fsck().unwrap();
    assert!(rep.is_clean(), "{:?}", rep.issues);
}
