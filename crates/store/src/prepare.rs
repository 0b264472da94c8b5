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
use crate::store::{panic_text, poison, Inner};
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
        // A panic fails the job (and poisons the store) instead of leaving
        // its transaction, and every later one of its collections, queued
        // forever; the thread goes on with the next job, which then fails
        // on the poison.
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write_and_sync(inner, &job)))
                .unwrap_or_else(|p| {
                    let msg = format!(
                "store data writer thread panicked: {}; the store is poisoned until reopened",
                panic_text(&*p)
            );
                    poison(inner, &msg);
                    Err(StoreError::Poisoned(msg))
                });
        job.prep.finish(r);
        (shared.on_done)();
    }
}

/// Writes a job's data into its blocks and makes it durable. Any failure
/// poisons the store before the job is marked done: the transactions
/// submitted after this one (in its collections) are already queued behind
/// it and were built on it succeeding (a PG's next log entries), so none of
/// them may commit; they fail with the poison. A failed sync is not
/// retryable in any case (the kernel may have dropped other dirty pages of
/// the file). The OSD stops on such an error anyway (fail-stop).
fn write_and_sync(inner: &Inner, job: &DataJob) -> Result<()> {
    if let Some(p) = crate::store::poisoned_msg(inner) {
        return Err(StoreError::Poisoned(p));
    }
    #[cfg(test)]
    crate::store::test_panic_point(inner, "data writer");
    let failed = |what: &str, e: std::io::Error| {
        let err = StoreError::io(what, e);
        poison(inner, &err.to_string());
        err
    };
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
            r.map_err(|e| failed("data file write", e))?;
            done += part.len();
        }
    }
    // Durable before its group's record names the blocks: each write
    // syncs its own data, as each fio job does, and concurrent syncs merge
    // in the block layer.
    inner
        .data
        .sync_data()
        .map_err(|e| failed("data file fdatasync", e))
}

#[cfg(test)]
mod tests {
    use crate::device::StoreFile;
    use crate::sim::{FaultPlan, SimFile};
    use crate::{
        CollectionId, CommitHandle, ObjectId, Store, StoreConfig, StoreError, StoreFiles,
        Transaction,
    };
    use std::io;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    /// Large writes whose data starts with `HELD` wait until released;
    /// those starting with `FAILS_LATER` wait likewise, then fail with EIO.
    const HELD: u8 = 0xA1;
    const FAILS_LATER: u8 = 0xEF;

    /// A simulated data file whose large writes the test holds or fails,
    /// and which tells whether a large write is still unsynced.
    struct GatedFile {
        file: Arc<SimFile>,
        open: Mutex<bool>,
        cv: Condvar,
        /// The next `sync_data` fails with EIO.
        fail_sync: AtomicBool,
        /// A large (O_DIRECT) write landed and no sync followed yet.
        unsynced: AtomicBool,
        /// Successful syncs so far.
        syncs: AtomicU64,
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
            if let Some(&(HELD | FAILS_LATER)) = buf.first() {
                let mut open = self.open.lock().unwrap();
                while !*open {
                    open = self.cv.wait(open).unwrap();
                }
            }
            if buf.first() == Some(&FAILS_LATER) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            self.file.write_at(buf, offset)?;
            self.unsynced.store(true, Ordering::SeqCst);
            Ok(())
        }
        fn sync_data(&self) -> io::Result<()> {
            if self.fail_sync.swap(false, Ordering::SeqCst) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            // Cleared before the sync: a write that lands meanwhile sets it
            // again (it is not covered by this sync).
            self.unsynced.store(false, Ordering::SeqCst);
            self.file.sync_data()?;
            self.syncs.fetch_add(1, Ordering::SeqCst);
            Ok(())
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

    fn cfg() -> StoreConfig {
        let mut cfg = StoreConfig::new("/nonexistent-prepare-test");
        cfg.data_bytes = 32 << 20;
        cfg.cache_bytes = 4 << 20;
        cfg.wal_bytes = 1 << 20;
        // No timed checkpoint: its data-file sync would take the failure
        // a test arms for a data writer's.
        cfg.checkpoint_interval_ms = 3_600_000;
        cfg
    }

    /// A store on a gated data file, with collections pg 1.0 and 1.1; the
    /// metadata and WAL files are returned for power cuts.
    fn store_on() -> (Store, Arc<GatedFile>, Arc<SimFile>, Arc<SimFile>) {
        let plan = FaultPlan::new();
        let data = Arc::new(GatedFile {
            file: SimFile::new(plan.clone()),
            open: Mutex::new(false),
            cv: Condvar::new(),
            fail_sync: AtomicBool::new(false),
            unsynced: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
        });
        let (meta, wal) = (SimFile::new(plan.clone()), SimFile::new(plan));
        let files = StoreFiles {
            data: data.clone(),
            meta: meta.clone(),
            wal: wal.clone(),
        };
        let s = Store::create_on(cfg(), files).unwrap();
        let mut t = Transaction::new();
        t.create_collection(CollectionId::pg(1, 0));
        t.create_collection(CollectionId::pg(1, 1));
        s.commit(t).unwrap();
        (s, data, meta, wal)
    }

    fn store() -> (Store, Arc<GatedFile>) {
        let (s, data, _, _) = store_on();
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

    fn poisoned(r: &crate::Result<()>) -> bool {
        matches!(r, Err(StoreError::Poisoned(_)))
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
    fn an_empty_transaction_commits_after_a_big_write_submitted_before_it() {
        let (s, gate) = store();
        let a = CollectionId::pg(1, 0);
        let mut big = s.submit(big_write(a, "one", HELD)).unwrap();
        // A barrier (the OSD's "everything so far is durable"), and a
        // small write of another collection behind it.
        let mut barrier = s.submit(Transaction::new()).unwrap();
        let mut t = Transaction::new();
        t.meta_set(CollectionId::pg(1, 1), "k", b"v".to_vec());
        let mut behind = s.submit(t).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            is_done(&mut barrier).is_none(),
            "barrier before the big write"
        );
        assert!(is_done(&mut behind).is_none(), "passed the barrier");
        gate.release();
        wait_done(&mut big).unwrap();
        wait_done(&mut barrier).unwrap();
        wait_done(&mut behind).unwrap();
    }

    #[test]
    fn a_big_write_is_acknowledged_only_once_its_data_is_durable() {
        let (s, gate, meta, wal) = store_on();
        let a = CollectionId::pg(1, 0);
        let mut h = s.submit(big_write(a, "one", HELD)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            is_done(&mut h).is_none(),
            "acknowledged before its data landed"
        );
        gate.release();
        wait_done(&mut h).unwrap();
        assert!(
            !gate.unsynced.load(Ordering::SeqCst),
            "acknowledged before its data was synced"
        );
        // A power cut right after the acknowledgement keeps it whole.
        for seed in 0..4 {
            let plan = FaultPlan::new();
            let files = StoreFiles {
                data: gate.file.power_cut(seed, plan.clone()).unwrap(),
                meta: meta.power_cut(seed, plan.clone()).unwrap(),
                wal: wal.power_cut(seed, plan).unwrap(),
            };
            let r = Store::open_on(cfg(), files).unwrap();
            let one = r.read(&a, &ObjectId::new(1, "one"), 0, 1 << 20).unwrap();
            assert!(one.len() == 128 << 10 && one.iter().all(|&x| x == HELD));
            assert_eq!(
                r.meta_get(&a, "last").unwrap().as_deref(),
                Some(&b"one"[..])
            );
        }
    }

    #[test]
    fn a_failed_data_write_fails_its_transaction_and_poisons_the_store() {
        let (s, gate) = store();
        let (a, b) = (CollectionId::pg(1, 0), CollectionId::pg(1, 1));
        s.commit(big_write(b, "before", 0x05)).unwrap();
        let mut bad = s.submit(big_write(a, "bad", FAILS_LATER)).unwrap();
        let mut next = s.submit(big_write(a, "next", 0x07)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            is_done(&mut next).is_none(),
            "committed before the write ahead of it"
        );
        gate.release();
        let err = wait_done(&mut bad);
        assert!(matches!(err, Err(StoreError::Io { .. })), "{err:?}");
        // The one behind it in the collection was built on it: its data
        // is on disk, but it must not commit.
        let r = wait_done(&mut next);
        assert!(poisoned(&r), "{r:?}");
        assert!(!s.exists(&a, &ObjectId::new(1, "bad")).unwrap());
        assert!(!s.exists(&a, &ObjectId::new(1, "next")).unwrap());
        assert_eq!(s.meta_get(&a, "last").unwrap(), None);
        // What committed before stays; nothing commits after.
        assert_eq!(
            s.meta_get(&b, "last").unwrap().as_deref(),
            Some(&b"before"[..])
        );
        assert!(s.is_poisoned());
        assert!(matches!(
            s.commit(big_write(b, "after", 0x08)),
            Err(StoreError::Poisoned(_))
        ));
    }

    #[test]
    fn a_failed_data_sync_fails_its_transaction_and_poisons_the_store() {
        let (s, gate) = store();
        let a = CollectionId::pg(1, 0);
        let mut bad = s.submit(big_write(a, "bad", HELD)).unwrap();
        // The write behind it is written and synced first (its sync
        // succeeds); then the held one's sync fails.
        let synced = gate.syncs.load(Ordering::SeqCst);
        let mut next = s.submit(big_write(a, "next", 0x07)).unwrap();
        for _ in 0..1000 {
            if gate.syncs.load(Ordering::SeqCst) > synced {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(gate.syncs.load(Ordering::SeqCst) > synced, "never synced");
        gate.fail_sync.store(true, Ordering::SeqCst);
        gate.release();
        let err = wait_done(&mut bad);
        assert!(matches!(err, Err(StoreError::Io { .. })), "{err:?}");
        let r = wait_done(&mut next);
        assert!(poisoned(&r), "committed after a failed sync: {r:?}");
        assert!(!s.exists(&a, &ObjectId::new(1, "next")).unwrap());
        assert!(s.is_poisoned());
    }

    #[test]
    fn a_panicking_data_writer_fails_the_write_instead_of_hanging_it() {
        let (s, _gate) = store();
        let a = CollectionId::pg(1, 0);
        s.panic_next_in("data writer");
        let mut h = s.submit(big_write(a, "one", 0x01)).unwrap();
        // Submitted before or after the panic poisoned the store: it fails.
        let next = s.submit(big_write(a, "two", 0x02));
        let e = wait_done(&mut h).expect_err("the panicked write");
        assert!(
            e.to_string().contains("store data writer thread panicked")
                && e.to_string()
                    .contains("test panic in the data writer thread"),
            "{e}"
        );
        match next {
            Ok(mut next) => assert!(poisoned(&wait_done(&mut next))),
            Err(e) => assert!(matches!(e, StoreError::Poisoned(_)), "{e}"),
        }
        // Dropping the store does not hang on its data writers.
        drop(s);
    }
}
