//! Large writes' data I/O off the submitting thread: a fixed pool of data
//! writer threads per store writes each submitted transaction's large
//! block-aligned writes into their freshly allocated blocks (`O_DIRECT`, or
//! through the page cache for `keep_data_cached`) and syncs them, then
//! marks the transaction ready for the committer. `submit` thus returns at
//! once and one submitter (an OSD's PG) has many big writes' data in
//! flight; the order in which they commit is kept by the intake
//! (`intake.rs`), not here. Owns the pool and each write's readiness; the
//! allocation stays in `store.rs` (`Inner::prewrite`).

use crate::error::{Result, StoreError};
use crate::store::{poison, Inner};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Whether a transaction's large data is on disk yet. Shared by the
/// transaction queued in the intake and the job writing its data.
#[derive(Default)]
pub(crate) struct Prep {
    done: AtomicBool,
    /// Why the data write failed (taken by the committer).
    failed: Mutex<Option<StoreError>>,
}

impl Prep {
    /// The data is written and synced, or its write failed.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
    /// The failure of a finished preparation, once (None when it succeeded).
    pub fn take_error(&self) -> Option<StoreError> {
        self.failed.lock().ok().and_then(|mut f| f.take())
    }
    fn finish(&self, r: Result<()>) {
        if let Err(e) = r {
            if let Ok(mut f) = self.failed.lock() {
                *f = Some(e);
            }
        }
        self.done.store(true, Ordering::Release);
    }
}

/// One transaction's large writes: each op's data and the runs of blocks
/// allocated for it (in order; the runs' blocks add up to the data).
pub(crate) struct DataJob {
    pub writes: Vec<(Bytes, Vec<(u64, u64)>)>,
    /// Through the page cache (`Transaction::keep_data_cached`) instead of O_DIRECT.
    pub cached: bool,
    pub prep: Arc<Prep>,
}

struct Queue {
    jobs: VecDeque<DataJob>,
    closed: bool,
}

struct Shared {
    q: Mutex<Queue>,
    cv: Condvar,
    /// Called after each job is done (wakes the committer).
    on_done: Box<dyn Fn() + Send + Sync>,
}

/// The data writer threads of one store. The queue needs no bound of its
/// own: every job's bytes are under the store's `max_inflight_bytes` and
/// its transaction holds a place in the intake (`max_batch_txns`).
pub(crate) struct DataWriters {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl DataWriters {
    /// Starts `n` (at least one) writer threads; `on_done` runs after each
    /// job is done.
    pub fn spawn(
        inner: Arc<Inner>,
        n: usize,
        on_done: impl Fn() + Send + Sync + 'static,
    ) -> Result<DataWriters> {
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue {
                jobs: VecDeque::new(),
                closed: false,
            }),
            cv: Condvar::new(),
            on_done: Box::new(on_done),
        });
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let (inner2, shared2) = (inner.clone(), shared.clone());
            match std::thread::Builder::new()
                .name(format!("store-data{i}"))
                .spawn(move || writer_loop(&inner2, &shared2))
            {
                Ok(h) => threads.push(h),
                Err(e) if threads.is_empty() => {
                    return Err(StoreError::io("spawn data writer thread", e));
                }
                // Fewer threads only means fewer data writes at once.
                Err(e) => tracing::warn!(error = %e, "could not spawn every data writer thread"),
            }
        }
        Ok(DataWriters { shared, threads })
    }

    /// Queues a job; a writer thread takes it in turn.
    pub fn send(&self, job: DataJob) {
        match self.shared.q.lock() {
            Ok(mut q) if !q.closed => {
                q.jobs.push_back(job);
                drop(q);
                self.shared.cv.notify_one();
            }
            // Closing, or a writer panicked holding the lock: the write fails
            // (its transaction then completes with the error, in its turn).
            _ => {
                let why = "the store's data writers have stopped";
                job.prep.finish(Err(StoreError::Poisoned(why.into())));
                (self.shared.on_done)();
            }
        }
    }
}

impl Drop for DataWriters {
    /// Finishes every queued job, then stops the threads.
    fn drop(&mut self) {
        if let Ok(mut q) = self.shared.q.lock() {
            q.closed = true;
        }
        self.shared.cv.notify_all();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn writer_loop(inner: &Inner, shared: &Shared) {
    loop {
        let job = {
            let Ok(mut q) = shared.q.lock() else {
                return;
            };
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.closed {
                    return;
                }
                q = match shared.cv.wait(q) {
                    Ok(g) => g,
                    Err(_) => return,
                };
            }
        };
        let r = write_and_sync(inner, &job);
        job.prep.finish(r);
        (shared.on_done)();
    }
}

/// Writes a job's data into its blocks and makes it durable. A failed write
/// fails only this transaction (the committer gives its blocks back); a
/// failed sync is not retryable (the kernel may have dropped other dirty
/// pages of the file): it also poisons the store.
fn write_and_sync(inner: &Inner, job: &DataJob) -> Result<()> {
    if let Some(p) = crate::store::poisoned_msg(inner) {
        return Err(StoreError::Poisoned(p));
    }
    let bs = inner.block_size;
    for (data, runs) in &job.writes {
        let mut done = 0usize;
        for (pstart, plen) in crate::alloc::join_adjacent(runs) {
            let part = &data[done..done + (plen * bs) as usize];
            let r = if job.cached {
                inner.data.write_at(part, pstart * bs)
            } else {
                inner.data.write_at_direct(part, pstart * bs)
            };
            r.map_err(|e| StoreError::io("data file write", e))?;
            done += part.len();
        }
    }
    // Durable before its group's record names the blocks: each write
    // syncs its own data, as each fio job does, and concurrent syncs merge
    // in the block layer.
    inner.data.sync_data().map_err(|e| {
        let err = StoreError::io("data file fdatasync", e);
        poison(inner, &err.to_string());
        err
    })
}

#[cfg(test)]
mod tests {
    use crate::device::StoreFile;
    use crate::sim::{FaultPlan, SimFile};
    use crate::{
        CollectionId, CommitHandle, ObjectId, Store, StoreConfig, StoreFiles, Transaction,
    };
    use std::io;
    use std::sync::{Arc, Condvar, Mutex};
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    /// Large writes whose data starts with `HELD` wait until released;
    /// those starting with `FAILS` fail with EIO.
    const HELD: u8 = 0xA1;
    const FAILS: u8 = 0xEE;

    /// A simulated data file whose large writes the test holds or fails.
    struct GatedFile {
        file: Arc<SimFile>,
        open: Mutex<bool>,
        cv: Condvar,
    }

    impl GatedFile {
        fn release(&self) {
            *self.open.lock().unwrap() = true;
            self.cv.notify_all();
        }
    }

    impl StoreFile for GatedFile {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.file.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.file.write_at(buf, offset)
        }
        fn write_at_direct(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            match buf.first() {
                Some(&FAILS) => return Err(io::Error::from_raw_os_error(libc::EIO)),
                Some(&HELD) => {
                    let mut open = self.open.lock().unwrap();
                    while !*open {
                        open = self.cv.wait(open).unwrap();
                    }
                }
                _ => {}
            }
            self.file.write_at(buf, offset)
        }
        fn sync_data(&self) -> io::Result<()> {
            self.file.sync_data()
        }
        fn len(&self) -> io::Result<u64> {
            self.file.len()
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.file.set_len(len)
        }
        fn preallocate(&self, len: u64) -> io::Result<()> {
            self.file.preallocate(len)
        }
    }

    /// A store on a gated data file, with collections pg 1.0 and 1.1.
    fn store() -> (Store, Arc<GatedFile>) {
        let plan = FaultPlan::new();
        let data = Arc::new(GatedFile {
            file: SimFile::new(plan.clone()),
            open: Mutex::new(false),
            cv: Condvar::new(),
        });
        let mut cfg = StoreConfig::new("/nonexistent-prepare-test");
        cfg.data_bytes = 32 << 20;
        cfg.cache_bytes = 4 << 20;
        cfg.wal_bytes = 1 << 20;
        let files = StoreFiles {
            data: data.clone(),
            meta: SimFile::new(plan.clone()),
            wal: SimFile::new(plan),
        };
        let s = Store::create_on(cfg, files).unwrap();
        let mut t = Transaction::new();
        t.create_collection(CollectionId::pg(1, 0));
        t.create_collection(CollectionId::pg(1, 1));
        s.commit(t).unwrap();
        (s, data)
    }

    /// A big write (128 KiB of `fill`) of object `name` in `coll`, which
    /// also sets the collection's meta key "last" to `name`.
    fn big_write(coll: CollectionId, name: &str, fill: u8) -> Transaction {
        let mut t = Transaction::new();
        t.write(coll, ObjectId::new(1, name), 0, vec![fill; 128 << 10]);
        t.meta_set(coll, "last", name.as_bytes().to_vec());
        t
    }

    fn is_done(h: &mut CommitHandle) -> Option<crate::Result<()>> {
        let mut cx = Context::from_waker(Waker::noop());
        match std::future::Future::poll(std::pin::Pin::new(h), &mut cx) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }

    fn wait_done(h: &mut CommitHandle) -> crate::Result<()> {
        for _ in 0..1000 {
            if let Some(r) = is_done(h) {
                return r;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("commit not done after 5 s");
    }

    #[test]
    fn big_writes_of_a_collection_commit_in_submission_order_whatever_order_their_data_lands() {
        let (s, gate) = store();
        let (a, b) = (CollectionId::pg(1, 0), CollectionId::pg(1, 1));
        // The first write's data is held: the second, of the same
        // collection, is written first but must not commit before it; a
        // write of another collection goes on.
        let mut first = s.submit(big_write(a, "one", HELD)).unwrap();
        let mut second = s.submit(big_write(a, "two", 0x02)).unwrap();
        let mut other = s.submit(big_write(b, "three", 0x03)).unwrap();
        wait_done(&mut other).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            is_done(&mut second).is_none(),
            "committed before the write ahead of it"
        );
        assert!(is_done(&mut first).is_none());
        assert_eq!(s.meta_get(&a, "last").unwrap(), None);
        gate.release();
        wait_done(&mut first).unwrap();
        wait_done(&mut second).unwrap();
        assert_eq!(
            s.meta_get(&a, "last").unwrap().as_deref(),
            Some(&b"two"[..])
        );
        let one = s.read(&a, &ObjectId::new(1, "one"), 0, 1 << 20).unwrap();
        assert!(one.len() == 128 << 10 && one.iter().all(|&x| x == HELD));
        let two = s.read(&a, &ObjectId::new(1, "two"), 0, 1 << 20).unwrap();
        assert!(two.len() == 128 << 10 && two.iter().all(|&x| x == 0x02));
    }

    #[test]
    fn a_failed_data_write_fails_only_its_transaction_and_before_the_next() {
        let (s, _gate) = store();
        let a = CollectionId::pg(1, 0);
        let used_before = s.statfs().unwrap().used_bytes;
        let mut bad = s.submit(big_write(a, "bad", FAILS)).unwrap();
        let mut good = s.submit(big_write(a, "good", 0x07)).unwrap();
        wait_done(&mut good).unwrap();
        // The failure is set no later than the success after it.
        let err = is_done(&mut bad).expect("failure reported before the later commit");
        assert!(matches!(err, Err(crate::StoreError::Io { .. })), "{err:?}");
        // Not poisoned; the failed write's blocks went back.
        assert!(!s.exists(&a, &ObjectId::new(1, "bad")).unwrap());
        assert_eq!(
            s.meta_get(&a, "last").unwrap().as_deref(),
            Some(&b"good"[..])
        );
        let used = s.statfs().unwrap().used_bytes;
        assert_eq!(used - used_before, 128 << 10);
        s.commit(big_write(a, "after", 0x08)).unwrap();
    }
}
