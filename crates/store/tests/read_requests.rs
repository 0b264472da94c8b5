//! How many device reads a big object read costs: extents that follow each
//! other in the object and on the data file are read with one request, and
//! every block is still verified (a checksum error names the bad block).

use cairn_store::device::StoreFile;
use cairn_store::sim::{FaultPlan, SimFile};
use cairn_store::{
    CollectionId, ObjectId, Store, StoreConfig, StoreError, StoreFiles, Transaction,
};
use std::io;
use std::sync::{Arc, Mutex};

/// A data file that records the length of every read of 64 KiB or more.
struct CountingFile {
    inner: Arc<SimFile>,
    big_reads: Mutex<Vec<usize>>,
}

impl CountingFile {
    fn note(&self, len: usize) {
        if len >= 64 << 10 {
            self.big_reads.lock().unwrap().push(len);
        }
    }
    fn take(&self) -> Vec<usize> {
        std::mem::take(&mut *self.big_reads.lock().unwrap())
    }
}

impl StoreFile for CountingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.note(buf.len());
        self.inner.read_at(buf, offset)
    }
    fn read_at_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.note(buf.len());
        self.inner.read_at_direct(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        self.inner.preallocate(len)
    }
}

fn store() -> (Store, Arc<CountingFile>, Arc<SimFile>) {
    let plan = Arc::new(FaultPlan::default());
    let raw = SimFile::new(plan.clone());
    let data = Arc::new(CountingFile {
        inner: raw.clone(),
        big_reads: Mutex::new(Vec::new()),
    });
    let mut cfg = StoreConfig::new("/nonexistent-read-requests-store");
    cfg.data_bytes = 32 << 20;
    cfg.cache_bytes = 4 << 20;
    cfg.wal_bytes = 1 << 20;
    let files = StoreFiles {
        data: data.clone(),
        meta: SimFile::new(plan.clone()),
        wal: SimFile::new(plan),
    };
    (Store::create_on(cfg, files).unwrap(), data, raw)
}

#[test]
fn adjacent_extents_are_read_with_one_request_and_each_block_verified() {
    let (s, data, raw) = store();
    let c = CollectionId::pg(1, 0);
    let o = ObjectId::new(7, "obj");
    let body: Vec<u8> = (0..4u32 << 20).map(|i| (i * 13 + i / 4099) as u8).collect();
    let mut t = Transaction::new();
    t.create_collection(c).write(c, o.clone(), 0, body.clone());
    s.commit(t).unwrap();
    data.take();

    // A fresh 4 MiB write lies in adjacent extents: one request.
    let got = s.read_bytes(&c, &o, 0, 4 << 20).unwrap();
    assert!(got[..] == body[..]);
    assert_eq!(data.take(), vec![4 << 20]);
    // A range inside it too, from its first whole block to the last.
    let got = s.read_bytes(&c, &o, 300 << 10, 2 << 20).unwrap();
    assert!(got[..] == body[300 << 10..(300 << 10) + (2 << 20)]);
    assert_eq!(data.take(), vec![2 << 20]);

    // Rewriting 256 KiB at 1 MiB moves those blocks elsewhere: three runs.
    let patch = vec![0x5Au8; 256 << 10];
    let mut t = Transaction::new();
    t.write(c, o.clone(), 1 << 20, patch.clone());
    s.commit(t).unwrap();
    let mut want = body.clone();
    want[1 << 20..(1 << 20) + (256 << 10)].copy_from_slice(&patch);
    data.take();
    let r = s.read_with_attrs(&c, &o, 0, 0).unwrap();
    assert!(r.data[..] == want[..]);
    assert_eq!(r.data_crc, crc32c::crc32c(&want));
    assert_eq!(
        data.take(),
        vec![1 << 20, 256 << 10, (3 << 20) - (256 << 10)]
    );

    // A bad block inside a coalesced run is named by its own offset.
    let bad_block = 3u64 << 20;
    let pblock = physical_offset(&raw, &want[bad_block as usize..][..4096]);
    raw.corrupt(pblock + 17, 1).unwrap();
    match s.read_bytes(&c, &o, 0, 4 << 20) {
        Err(StoreError::Checksum { obj, offset, .. }) => assert_eq!((obj, offset), (o, bad_block)),
        other => panic!("expected a checksum error, got {other:?}"),
    }
}

/// Where `block` (a unique 4 KiB of the object) lies in the data file.
fn physical_offset(raw: &SimFile, block: &[u8]) -> u64 {
    let len = raw.len().unwrap();
    let mut buf = vec![0u8; 4096];
    (0..len / 4096)
        .map(|b| b * 4096)
        .find(|&at| {
            raw.read_at(&mut buf, at).unwrap();
            buf == block
        })
        .expect("the block is in the data file")
}
