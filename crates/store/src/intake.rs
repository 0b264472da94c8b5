//! The hand-off between submitters and the committer, and the waits for
//! acknowledgements. Submitted transactions collect in one [`Intake`] that
//! the committer takes as its next group; every transaction taken
//! together shares one [`GroupAck`] word, so the thread that makes a group
//! durable sets every result first and then wakes all of its waiters with
//! one futex call (waking them one by one, the waker was preempted by the
//! first waiter it woke and the rest trickled out, so callers came back one
//! by one and half the groups held a single transaction). A transaction
//! whose large data is still being written ([`Ordered::ready`] false, see
//! `prepare.rs`) stays queued, and so does every later one touching one of
//! its collections: the committer takes them in submission order per
//! collection. Owns the queueing, that ordering and the waking only; group
//! commit itself is in `store.rs`.

use crate::error::{Result, StoreError};
use crate::ids::CollectionId;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// A wake-up word shared by the transactions of one group: bumped (and its
/// waiters woken, all at once) whenever results of the group were set.
#[derive(Default)]
pub(crate) struct GroupAck {
    seq: AtomicU32,
}

impl GroupAck {
    /// Wakes every thread waiting on this group (one system call).
    pub fn wake_all(&self) {
        self.seq.fetch_add(1, Ordering::Release);
        futex_wake_all(&self.seq);
    }
}

/// Blocks while `word` still holds `expected` (or until a spurious wake-up;
/// callers re-check their condition).
fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call;
    // FUTEX_WAIT only reads it and sleeps while it equals `expected`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE does not access
    // memory beyond looking up the waiters of that address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

#[derive(Default)]
struct CompState {
    result: Option<Result<()>>,
    waker: Option<Waker>,
}

/// The outcome of one submitted transaction (or checkpoint request).
pub(crate) struct Completion {
    state: Mutex<CompState>,
    group: Arc<GroupAck>,
    /// A result was set (stays true after the waiter took it).
    finished: AtomicBool,
}

impl Completion {
    /// A completion woken through `group` (shared with its group's others).
    pub fn in_group(group: Arc<GroupAck>) -> Completion {
        Completion {
            state: Mutex::default(),
            group,
            finished: AtomicBool::new(false),
        }
    }
    /// A completion with a wake-up word of its own.
    pub fn alone() -> Completion {
        Completion::in_group(Arc::default())
    }
    /// Sets the result and wakes an async waiter; a blocked thread is woken
    /// by the group's [`GroupAck::wake_all`], which the caller runs once
    /// every result of the group is set.
    pub fn set(&self, r: Result<()>) {
        self.finished.store(true, Ordering::Release);
        let waker = match self.state.lock() {
            Ok(mut st) => {
                st.result = Some(r);
                st.waker.take()
            }
            Err(_) => None,
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
    /// [`Completion::set`] and the wake-up, for a completion that is alone.
    pub fn complete(&self, r: Result<()>) {
        self.set(r);
        self.group.wake_all();
    }
    /// Whether a result was ever set.
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }
    /// Fails the waiter with `err` and wakes it, unless a result was set
    /// already (for a transaction a stopping thread drops unacknowledged).
    pub fn fail_unfinished(&self, err: StoreError) {
        if !self.finished.swap(true, Ordering::AcqRel) {
            self.complete(Err(err));
        }
    }
    pub fn group(&self) -> &Arc<GroupAck> {
        &self.group
    }
    fn take(&self) -> Result<Option<Result<()>>> {
        let mut st = lock(&self.state)?;
        Ok(st.result.take())
    }
    /// Blocks until the result is set.
    pub fn wait(&self) -> Result<()> {
        loop {
            let seq = self.group.seq.load(Ordering::Acquire);
            if let Some(r) = self.take()? {
                return r;
            }
            futex_wait(&self.group.seq, seq);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| StoreError::Poisoned("commit completion lock poisoned by a panic".into()))
}

/// A submitted transaction. `wait()` blocks until it is durable (or failed);
/// `.await` does the same without blocking a tokio worker.
pub struct CommitHandle(pub(crate) Arc<Completion>);

impl CommitHandle {
    pub fn wait(self) -> Result<()> {
        self.0.wait()
    }
}

impl Future for CommitHandle {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut st = match self.0.state.lock() {
            Ok(s) => s,
            Err(_) => {
                return Poll::Ready(Err(StoreError::Poisoned(
                    "commit completion lock poisoned".into(),
                )))
            }
        };
        match st.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// What the intake needs to know of a queued transaction to keep its order.
pub(crate) trait Ordered {
    /// The committer may take it: its large data is written and synced, or
    /// failed (it then completes with that error, in its turn).
    fn ready(&self) -> bool;
    /// The collections it touches: it is committed after every transaction
    /// submitted before it that touches one of them. Empty: after every
    /// transaction submitted before it (an empty transaction is a barrier,
    /// as callers that wait for "everything submitted so far" use it).
    fn collections(&self) -> &[CollectionId];
}

/// What the committer takes in one go.
pub(crate) struct Taken<T> {
    pub txns: Vec<T>,
    pub checkpoints: Vec<Arc<Completion>>,
}

struct IntakeState<T> {
    txns: Vec<T>,
    /// The wake-up word of the transactions in `txns`.
    ack: Arc<GroupAck>,
    checkpoints: Vec<Arc<Completion>>,
    /// The committer sleeps until something is pushed.
    committer_waiting: bool,
    /// Submitters sleeping until the intake has room.
    submitters_waiting: usize,
    closed: bool,
}

/// Transactions submitted and not yet taken by the committer (at most
/// `max_txns`: submitters wait beyond that).
pub(crate) struct Intake<T> {
    state: Mutex<IntakeState<T>>,
    /// The committer waits here for work.
    work: Condvar,
    /// Submitters wait here for room.
    room: Condvar,
    max_txns: usize,
}

/// Why the committer got nothing.
pub(crate) enum Empty {
    TimedOut,
    Closed,
}

impl<T: Ordered> Intake<T> {
    pub fn new(max_txns: usize) -> Intake<T> {
        Intake {
            state: Mutex::new(IntakeState {
                txns: Vec::new(),
                ack: Arc::default(),
                checkpoints: Vec::new(),
                committer_waiting: false,
                submitters_waiting: 0,
                closed: false,
            }),
            work: Condvar::new(),
            room: Condvar::new(),
            max_txns: max_txns.max(1),
        }
    }

    /// Queues a transaction built by `make` from the completion it will be
    /// acknowledged through; waits while the intake is full. Fails (without
    /// calling `make`) once the committer has stopped.
    pub fn push(&self, make: impl FnOnce(Arc<Completion>) -> T) -> Result<Arc<Completion>> {
        let mut st = lock(&self.state)?;
        while st.txns.len() >= self.max_txns && !st.closed {
            st.submitters_waiting += 1;
            st = self
                .room
                .wait(st)
                .map_err(|_| StoreError::Poisoned("intake lock poisoned".into()))?;
            st.submitters_waiting -= 1;
        }
        if st.closed {
            return Err(StoreError::ShuttingDown);
        }
        let done = Arc::new(Completion::in_group(st.ack.clone()));
        st.txns.push(make(done.clone()));
        if st.committer_waiting {
            st.committer_waiting = false;
            self.work.notify_one();
        }
        Ok(done)
    }

    /// Asks the committer for a checkpoint; returns what it will complete.
    pub fn push_checkpoint(&self) -> Result<Arc<Completion>> {
        let mut st = lock(&self.state)?;
        if st.closed {
            return Err(StoreError::ShuttingDown);
        }
        let done = Arc::new(Completion::alone());
        st.checkpoints.push(done.clone());
        if st.committer_waiting {
            st.committer_waiting = false;
            self.work.notify_one();
        }
        Ok(done)
    }

    /// Takes everything queued (waiting up to `wait` for something). The
    /// transactions taken share one wake-up word; later ones get a new one.
    pub fn take(&self, wait: Duration) -> std::result::Result<Taken<T>, Empty> {
        let Ok(mut st) = self.state.lock() else {
            return Err(Empty::Closed);
        };
        if !takeable(&st.txns) && st.checkpoints.is_empty() {
            if st.closed && st.txns.is_empty() {
                return Err(Empty::Closed);
            }
            // Closed with transactions still being prepared: they become
            // ready (or fail) on their own and are committed in turn.
            st.committer_waiting = true;
            st = match self.work.wait_timeout(st, wait) {
                Ok((g, _)) => g,
                Err(_) => return Err(Empty::Closed),
            };
            st.committer_waiting = false;
            if !takeable(&st.txns) && st.checkpoints.is_empty() {
                return Err(if st.closed && st.txns.is_empty() {
                    Empty::Closed
                } else {
                    Empty::TimedOut
                });
            }
        }
        Ok(self.take_locked(&mut st))
    }

    /// A queued transaction became ready: wakes the committer if it sleeps.
    pub fn notify_ready(&self) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        if st.committer_waiting {
            st.committer_waiting = false;
            self.work.notify_one();
        }
    }

    /// Takes whatever is queued now, without waiting (possibly nothing).
    #[cfg(test)]
    pub fn take_now(&self) -> Taken<T> {
        match self.state.lock() {
            Ok(mut st) => self.take_locked(&mut st),
            Err(_) => Taken {
                txns: Vec::new(),
                checkpoints: Vec::new(),
            },
        }
    }

    fn take_locked(&self, st: &mut IntakeState<T>) -> Taken<T> {
        let txns = if st.txns.iter().all(Ordered::ready) {
            std::mem::take(&mut st.txns)
        } else {
            let (taken, kept) = split_in_order(std::mem::take(&mut st.txns));
            st.txns = kept;
            taken
        };
        // Transactions left queued keep their wake-up word (the group that
        // takes them later wakes it again); new ones get a fresh word.
        if !txns.is_empty() {
            st.ack = Arc::default();
        }
        if st.submitters_waiting > 0 {
            self.room.notify_all();
        }
        Taken {
            txns,
            checkpoints: std::mem::take(&mut st.checkpoints),
        }
    }

    /// No more submissions; the committer drains what is queued and stops.
    pub fn close(&self) {
        if let Ok(mut st) = self.state.lock() {
            st.closed = true;
        }
        self.work.notify_all();
        self.room.notify_all();
    }
}

/// Which of `queued` (in submission order) the committer may take now: a
/// transaction stays when it is not ready, or when an earlier one that
/// stays touches one of its collections (or either of the two is a
/// barrier).
fn take_mask<T: Ordered>(queued: &[T]) -> Vec<bool> {
    // The collections of the transactions kept so far; `barrier`: a kept
    // one holds back everything after it.
    let mut held: Vec<CollectionId> = Vec::new();
    let mut barrier = false;
    let mut kept_any = false;
    let mut mask = Vec::with_capacity(queued.len());
    for t in queued {
        let colls = t.collections();
        let behind =
            barrier || (colls.is_empty() && kept_any) || colls.iter().any(|c| held.contains(c));
        let take = !behind && t.ready();
        if !take {
            kept_any = true;
            barrier |= colls.is_empty();
            for c in colls {
                if !held.contains(c) {
                    held.push(*c);
                }
            }
        }
        mask.push(take);
    }
    mask
}

/// Whether the committer may take anything of `queued` now.
fn takeable<T: Ordered>(queued: &[T]) -> bool {
    !queued.is_empty() && (queued.iter().all(Ordered::ready) || take_mask(queued).contains(&true))
}

/// Splits `queued` into what the committer may take now and what stays
/// ([`take_mask`]); both parts keep their order.
fn split_in_order<T: Ordered>(queued: Vec<T>) -> (Vec<T>, Vec<T>) {
    let mask = take_mask(&queued);
    let mut taken = Vec::with_capacity(queued.len());
    let mut kept = Vec::new();
    for (t, take) in queued.into_iter().zip(mask) {
        if take {
            taken.push(t);
        } else {
            kept.push(t);
        }
    }
    (taken, kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Ready at once, in no collection (the waking and room tests).
    impl Ordered for Arc<Completion> {
        fn ready(&self) -> bool {
            true
        }
        fn collections(&self) -> &[CollectionId] {
            &[]
        }
    }
    impl Ordered for u32 {
        fn ready(&self) -> bool {
            true
        }
        fn collections(&self) -> &[CollectionId] {
            &[]
        }
    }

    /// A queued transaction of the ordering tests: an id, its collections,
    /// and whether its data is written.
    struct Txn(u32, Vec<CollectionId>, Arc<AtomicBool>);
    impl Ordered for Txn {
        fn ready(&self) -> bool {
            self.2.load(Ordering::Acquire)
        }
        fn collections(&self) -> &[CollectionId] {
            &self.1
        }
    }

    fn ids(t: &Taken<Txn>) -> Vec<u32> {
        t.txns.iter().map(|t| t.0).collect()
    }

    #[test]
    fn a_collection_commits_in_submission_order_around_unready_writes() {
        let (a, b) = (CollectionId::pg(1, 0), CollectionId::pg(1, 1));
        let intake: Intake<Txn> = Intake::new(16);
        let flags: Vec<Arc<AtomicBool>> = (0..6).map(|_| Arc::default()).collect();
        // 1 (a, big, being written), 2 (b, ready), 3 (a, ready: behind 1),
        // 4 (b, big, being written), 5 (a and b: behind 1 and 4).
        let set = |i: usize| flags[i].store(true, Ordering::Release);
        for (i, c) in [
            (1, vec![a]),
            (2, vec![b]),
            (3, vec![a]),
            (4, vec![b]),
            (5, vec![a, b]),
        ] {
            intake
                .push(|_| Txn(i, c, flags[i as usize].clone()))
                .unwrap();
        }
        set(2);
        set(3);
        set(5);
        assert_eq!(ids(&intake.take_now()), vec![2]);
        // Nothing ready at the head of either collection: nothing to take.
        assert!(matches!(
            intake.take(Duration::from_millis(1)),
            Err(Empty::TimedOut)
        ));
        // The later big write of b finishes first: still behind nothing in
        // b, so it goes; 5 still waits for 1 (collection a).
        set(4);
        assert_eq!(ids(&intake.take_now()), vec![4]);
        set(1);
        assert_eq!(ids(&intake.take_now()), vec![1, 3, 5]);
    }

    #[test]
    fn an_empty_transaction_waits_for_everything_before_it() {
        let a = CollectionId::pg(1, 0);
        let intake: Intake<Txn> = Intake::new(16);
        let big = Arc::new(AtomicBool::new(false));
        let ready = || Arc::new(AtomicBool::new(true));
        intake.push(|_| Txn(1, vec![a], big.clone())).unwrap();
        intake.push(|_| Txn(2, vec![], ready())).unwrap();
        intake
            .push(|_| Txn(3, vec![CollectionId::pg(2, 0)], ready()))
            .unwrap();
        assert!(intake.take_now().txns.is_empty());
        big.store(true, Ordering::Release);
        assert_eq!(ids(&intake.take_now()), vec![1, 2, 3]);
    }

    #[test]
    fn the_committer_wakes_when_a_write_becomes_ready_and_drains_after_close() {
        let a = CollectionId::pg(1, 0);
        let intake: Arc<Intake<Txn>> = Arc::new(Intake::new(16));
        let big = Arc::new(AtomicBool::new(false));
        intake.push(|_| Txn(1, vec![a], big.clone())).unwrap();
        intake.close();
        let (i2, b2) = (intake.clone(), big.clone());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            b2.store(true, Ordering::Release);
            i2.notify_ready();
        });
        // Closed, but a transaction is still being prepared: not Closed yet.
        let t = intake.take(Duration::from_secs(10)).ok().unwrap();
        assert_eq!(ids(&t), vec![1]);
        writer.join().unwrap();
        assert!(matches!(
            intake.take(Duration::from_millis(1)),
            Err(Empty::Closed)
        ));
    }

    #[test]
    fn one_wake_reaches_every_waiter_of_a_group() {
        let intake: Arc<Intake<Arc<Completion>>> = Arc::new(Intake::new(16));
        let mut waiters = Vec::new();
        for _ in 0..8 {
            let done = intake.push(|c| c).unwrap();
            waiters.push(std::thread::spawn(move || done.wait()));
        }
        let t = intake.take(Duration::from_secs(1)).ok().unwrap();
        assert_eq!(t.txns.len(), 8);
        // A later submission gets a new group word.
        let later = intake.push(|c| c).unwrap();
        assert!(!Arc::ptr_eq(later.group(), t.txns[0].group()));
        for (i, c) in t.txns.iter().enumerate() {
            c.set(if i == 3 {
                Err(StoreError::ShuttingDown)
            } else {
                Ok(())
            });
        }
        t.txns[0].group().wake_all();
        let res: Vec<bool> = waiters
            .into_iter()
            .map(|h| h.join().unwrap().is_ok())
            .collect();
        assert_eq!(res.iter().filter(|ok| !**ok).count(), 1);
        assert!(!res[3]);
    }

    #[test]
    fn full_intake_waits_and_close_releases() {
        let intake: Arc<Intake<u32>> = Arc::new(Intake::new(2));
        intake.push(|_| 1).unwrap();
        intake.push(|_| 2).unwrap();
        let i2 = intake.clone();
        let h = std::thread::spawn(move || i2.push(|_| 3).is_ok());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(intake.take_now().txns, vec![1, 2]);
        assert!(h.join().unwrap());
        intake.close();
        assert!(intake.push(|_| 4).is_err());
        assert_eq!(
            intake.take(Duration::from_millis(1)).ok().unwrap().txns,
            vec![3]
        );
        assert!(matches!(
            intake.take(Duration::from_millis(1)),
            Err(Empty::Closed)
        ));
    }
}
