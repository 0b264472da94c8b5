//! Write combining for an open image's small writes (under
//! [`COMBINE_BELOW_BYTES`](crate::image::COMBINE_BELOW_BYTES)): one
//! [`Image`](crate::Image) handle keeps at most [`OPS_IN_FLIGHT_PER_OBJECT`]
//! such write ops per data object in flight; writes that arrive for an object beyond that wait here and go
//! out together as one op when a slot frees (contiguous pieces joined into
//! one sub-op). Owns only these per-object queues and the hand-over of a
//! slot; what an object op looks like (copy-up for clones, snapshot
//! context) is the image's.
//!
//! Why: the primary OSD runs one write per object at a time (the next waits
//! in the PG until the previous one is durable on every replica), so writes
//! to one object that are in flight together — sequential I/O, whose
//! neighbouring requests share a 4 MiB object — were served one full
//! replicated commit after another. Sending what queued up as one op costs
//! one commit for all of it. Every write still returns only once the op
//! carrying it is durable on every acting replica, and queued writes are
//! applied in the order they arrived here (a later overlapping write wins);
//! writes in flight together were never ordered against each other.

use bytes::{Bytes, BytesMut};
use cairn_client::{ClientError, IoCtx};
use cairn_ops::SubOp;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Write ops one image handle keeps in flight per data object. Two, not
/// one: the OSD starts a write it already holds the moment the one before
/// it commits, so the second op hides the round trip back to this client;
/// everything beyond waits here and is combined.
pub const OPS_IN_FLIGHT_PER_OBJECT: usize = 2;
/// Most queued writes one combined op carries.
pub const MAX_COMBINED_WRITES: usize = 64;
/// Most payload bytes one combined op carries (one write larger than this
/// still goes alone).
pub const MAX_COMBINED_BYTES: u64 = 8 << 20;

/// Sends one object op: (object number, sub-ops) -> its outcome. The image
/// supplies it (data context with the snapshot context, copy-up for
/// clones).
pub(crate) type SendOp = Arc<
    dyn Fn(u64, Vec<SubOp>) -> Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send>>
        + Send
        + Sync,
>;

struct Queued {
    offset: u64,
    data: Bytes,
    done: oneshot::Sender<Result<(), ClientError>>,
}

/// One object's writes: ops in flight and the writes waiting for a slot.
#[derive(Default)]
struct ObjectWrites {
    in_flight: usize,
    queue: VecDeque<Queued>,
}

/// The per-object write queues of one image handle.
pub(crate) struct Combiner {
    /// Objects with a write op in flight (only those have an entry).
    objects: Mutex<HashMap<u64, ObjectWrites>>,
    /// The data pool takes one data-changing sub-op per op (erasure-coded):
    /// only a contiguous run of queued writes is combined.
    one_data_op: bool,
    send: SendOp,
}

impl Combiner {
    pub(crate) fn new(one_data_op: bool, send: SendOp) -> Arc<Combiner> {
        Arc::new(Combiner {
            objects: Mutex::new(HashMap::new()),
            one_data_op,
            send,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, ObjectWrites>> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `data` at `offset` of object `objno`: sent now if fewer than
    /// [`OPS_IN_FLIGHT_PER_OBJECT`] ops on that object are in flight and
    /// none waits, else queued and sent, combined with the others that
    /// queued meanwhile, when an op in flight returns. Returns when the op
    /// carrying it is durable (or failed).
    pub(crate) async fn write(
        self: &Arc<Self>,
        objno: u64,
        offset: u64,
        data: Bytes,
    ) -> Result<(), ClientError> {
        let waiting = {
            let mut objects = self.lock();
            let o = objects.entry(objno).or_default();
            if o.in_flight < OPS_IN_FLIGHT_PER_OBJECT && o.queue.is_empty() {
                o.in_flight += 1;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                o.queue.push_back(Queued {
                    offset,
                    data: data.clone(),
                    done: tx,
                });
                Some(rx)
            }
        };
        if let Some(rx) = waiting {
            return rx.await.unwrap_or_else(|_| {
                Err(ClientError::Protocol(format!(
                    "the combined write to data object {objno:x} was abandoned (the image handle is shutting down)"
                )))
            });
        }
        // This write goes alone now. When it returns, its slot passes to
        // what queued meanwhile, even if this future is dropped.
        let _handover = HandOver {
            combiner: self.clone(),
            objno,
        };
        (self.send)(objno, vec![SubOp::Write { offset, data }]).await
    }

    /// The next combined batch for `objno` for a slot that just freed, or
    /// None (and the slot is given up) when nothing waits.
    fn take_batch(&self, objno: u64) -> Option<Vec<Queued>> {
        let mut objects = self.lock();
        let o = objects.get_mut(&objno)?;
        if o.queue.is_empty() {
            o.in_flight = o.in_flight.saturating_sub(1);
            if o.in_flight == 0 {
                objects.remove(&objno);
            }
            return None;
        }
        let mut batch: Vec<Queued> = Vec::new();
        let mut bytes = 0u64;
        while let Some(next) = o.queue.front() {
            let len = next.data.len() as u64;
            if !batch.is_empty() {
                let last = &batch[batch.len() - 1];
                let contiguous = last.offset + last.data.len() as u64 == next.offset;
                if batch.len() >= MAX_COMBINED_WRITES
                    || bytes + len > MAX_COMBINED_BYTES
                    || (self.one_data_op && !contiguous)
                {
                    break;
                }
            }
            bytes += len;
            batch.extend(o.queue.pop_front());
        }
        Some(batch)
    }

    /// Keeps a freed slot busy: sends the queued batches of `objno` one
    /// after another until none waits, then gives the slot up.
    async fn drain(self: Arc<Self>, objno: u64) {
        while let Some(batch) = self.take_batch(objno) {
            let ops = combined_ops(&batch);
            let r = (self.send)(objno, ops).await;
            for q in batch {
                let _ = q.done.send(r.clone());
            }
        }
    }
}

/// Passes an op's slot on when the op ends: a task sends what waits (the
/// finishing caller returns at once), or the slot is given up.
struct HandOver {
    combiner: Arc<Combiner>,
    objno: u64,
}

impl Drop for HandOver {
    fn drop(&mut self) {
        {
            let mut objects = self.combiner.lock();
            let Some(o) = objects.get_mut(&self.objno) else {
                return;
            };
            if o.queue.is_empty() {
                o.in_flight = o.in_flight.saturating_sub(1);
                if o.in_flight == 0 {
                    objects.remove(&self.objno);
                }
                return;
            }
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(self.combiner.clone().drain(self.objno));
            }
            Err(_) => {
                // No runtime left to send them: the waiters get an error
                // (their senders drop with the queue).
                self.combiner.lock().remove(&self.objno);
            }
        }
    }
}

/// The sub-ops of a batch, in arrival order: runs of contiguous writes
/// joined into one write (one store write and one data sync instead of
/// several), every other write its own sub-op.
fn combined_ops(batch: &[Queued]) -> Vec<SubOp> {
    let mut ops = Vec::new();
    let mut i = 0;
    while i < batch.len() {
        let start = batch[i].offset;
        let mut end = start + batch[i].data.len() as u64;
        let mut j = i + 1;
        while j < batch.len() && batch[j].offset == end {
            end += batch[j].data.len() as u64;
            j += 1;
        }
        let data = if j == i + 1 {
            batch[i].data.clone()
        } else {
            let mut buf = BytesMut::with_capacity((end - start) as usize);
            for q in &batch[i..j] {
                buf.extend_from_slice(&q.data);
            }
            buf.freeze()
        };
        ops.push(SubOp::Write {
            offset: start,
            data,
        });
        i = j;
    }
    ops
}

/// Whether `pool` keeps data erasure-coded (one data sub-op per op).
pub(crate) fn one_data_op(io: &IoCtx, rados: &cairn_client::Rados) -> bool {
    rados
        .map()
        .pool_named(io.pool_name())
        .is_some_and(|p| p.kind == cairn_map::PoolKind::Erasure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn queued(offset: u64, data: &[u8]) -> Queued {
        Queued {
            offset,
            data: Bytes::copy_from_slice(data),
            done: oneshot::channel().0,
        }
    }

    fn write(offset: u64, data: &[u8]) -> SubOp {
        SubOp::Write {
            offset,
            data: Bytes::copy_from_slice(data),
        }
    }

    #[test]
    fn contiguous_writes_join_and_others_keep_their_order() {
        let batch = [
            queued(0, b"ab"),
            queued(2, b"cd"),
            queued(10, b"x"),
            queued(1, b"Z"),
            queued(2, b"q"),
        ];
        assert_eq!(
            combined_ops(&batch),
            vec![write(0, b"abcd"), write(10, b"x"), write(1, b"Zq")]
        );
    }

    /// A fake object store: records each op, answers after a short delay.
    /// Also checks the ops in flight at once.
    /// Ops sent: (object number, sub-ops).
    type OpLog = Arc<Mutex<Vec<(u64, Vec<SubOp>)>>>;

    /// Lets the tasks spawned so far run to their next wait (the test
    /// runtime has one thread, so this is deterministic: no timing).
    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    /// A fake object store: each op waits for a permit of `gate` (the test
    /// opens it once every write is queued), then is recorded. Also checks
    /// the ops in flight at once.
    fn gated(log: OpLog, gate: Arc<tokio::sync::Semaphore>) -> SendOp {
        let in_flight = Arc::new(AtomicUsize::new(0));
        Arc::new(move |objno, ops| {
            let log = log.clone();
            let in_flight = in_flight.clone();
            let gate = gate.clone();
            Box::pin(async move {
                let n = in_flight.fetch_add(1, Ordering::SeqCst);
                assert!(
                    n < OPS_IN_FLIGHT_PER_OBJECT,
                    "too many ops in flight on one object"
                );
                // Counted out also when the op is dropped midway.
                let _out = Decrement(in_flight);
                gate.acquire().await.unwrap().forget();
                log.lock().unwrap().push((objno, ops));
                Ok(())
            })
        })
    }

    struct Decrement(Arc<AtomicUsize>);

    impl Drop for Decrement {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn queue_len(c: &Combiner, objno: u64) -> (usize, usize) {
        c.lock()
            .get(&objno)
            .map_or((0, 0), |o| (o.in_flight, o.queue.len()))
    }

    #[tokio::test]
    async fn writes_queued_behind_the_ops_in_flight_go_out_as_one_op() {
        let log = OpLog::default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let c = Combiner::new(false, gated(log.clone(), gate.clone()));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..5u64 {
            let c = c.clone();
            set.spawn(async move { c.write(7, i * 4, Bytes::from(vec![i as u8; 4])).await });
            settle().await;
        }
        // The first two went alone; three wait.
        assert_eq!(queue_len(&c, 7), (2, 3));
        gate.add_permits(100);
        while let Some(r) = set.join_next().await {
            r.unwrap().unwrap();
        }
        // The three that queued go as one write when the first returns.
        let log = log.lock().unwrap().clone();
        assert_eq!(log.len(), 3, "{log:?}");
        assert_eq!(log[0], (7, vec![write(0, &[0; 4])]));
        assert_eq!(log[1], (7, vec![write(4, &[1; 4])]));
        let mut rest = Vec::new();
        for i in 2..5u8 {
            rest.extend([i; 4]);
        }
        assert_eq!(log[2], (7, vec![write(8, &rest)]));
        assert!(c.lock().is_empty(), "the object stays marked in flight");
    }

    #[tokio::test]
    async fn an_erasure_coded_pool_gets_one_contiguous_run_per_op() {
        let log = OpLog::default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let c = Combiner::new(true, gated(log.clone(), gate.clone()));
        let mut set = tokio::task::JoinSet::new();
        for off in [0u64, 100, 104, 108, 0] {
            let c = c.clone();
            set.spawn(async move { c.write(1, off, Bytes::from_static(b"abcd")).await });
            settle().await;
        }
        gate.add_permits(100);
        while let Some(r) = set.join_next().await {
            r.unwrap().unwrap();
        }
        let log = log.lock().unwrap().clone();
        let ops: Vec<Vec<SubOp>> = log.into_iter().map(|(_, o)| o).collect();
        assert_eq!(
            ops,
            vec![
                vec![write(0, b"abcd")],
                vec![write(100, b"abcd")],
                vec![write(104, b"abcdabcd")],
                vec![write(0, b"abcd")],
            ]
        );
        assert!(c.lock().is_empty());
    }

    #[tokio::test]
    async fn a_failed_op_fails_every_write_it_carried() {
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (calls2, gate2) = (calls.clone(), gate.clone());
        let send: SendOp = Arc::new(move |_, _| {
            let n = calls2.fetch_add(1, Ordering::SeqCst);
            let gate = gate2.clone();
            Box::pin(async move {
                gate.acquire().await.unwrap().forget();
                if n == 0 {
                    Ok(())
                } else {
                    Err(ClientError::Protocol("boom".into()))
                }
            })
        });
        let c = Combiner::new(false, send);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..4u64 {
            let c = c.clone();
            set.spawn(async move { (i, c.write(0, i, Bytes::from_static(b"x")).await) });
            settle().await;
        }
        gate.add_permits(100);
        let mut got = Vec::new();
        while let Some(r) = set.join_next().await {
            let (i, r) = r.unwrap();
            got.push((i, r.is_ok()));
        }
        got.sort();
        // Ops: write 0 (ok), write 1 (fails), writes 2+3 combined (fails).
        assert_eq!(got, vec![(0, true), (1, false), (2, false), (3, false)]);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_dropped_write_still_hands_its_slot_on() {
        let log = OpLog::default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let c = Combiner::new(false, gated(log.clone(), gate.clone()));
        let spawn = |off: u64| {
            let c = c.clone();
            tokio::spawn(async move { c.write(3, off, Bytes::from_static(b"a")).await })
        };
        let first = spawn(0);
        settle().await;
        let second = spawn(2);
        settle().await;
        let waiter = spawn(1);
        settle().await;
        assert_eq!(queue_len(&c, 3), (2, 1));
        first.abort();
        settle().await;
        gate.add_permits(100);
        let r = tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("the queued write was never sent");
        r.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert!(c.lock().is_empty());
    }
}
