//! An authenticated connection: a reader task and a writer task own the two
//! halves of the socket; `Connection` handles talk to them through bounded
//! queues. Owns dispatch (replies vs. requests), keepalives, backpressure
//! and shutdown; not the handshake (see `handshake`).
//!
//! The two tasks run on the tokio runtime that opened (or accepted) the
//! connection. If that runtime shuts down, the tasks are dropped and the
//! connection closes at once ("the tokio runtime that ran its I/O shut
//! down"); a current-thread runtime that is alive but not being driven
//! runs nothing, so handles used from another runtime must check
//! [`Connection::is_driven_here`].

use crate::auth::{Credentials, FrameKey, KeyServer};
use crate::blocks::BlockCrcs;
use crate::config::MsgConfig;
use crate::frame::{
    FrameHeader, FrameKind, FrameSigner, FrameVerifier, BULK_ALIGN, CLOSE_MAX_BYTES, FRAME_MAC_AT,
    HEADER_LEN, SIGNED_HEADER_LEN,
};
use crate::handshake::{self, Established};
use crate::io::{frame_error, read_frame, write_all_slices, write_frame};
use crate::MsgError;
use bytes::Bytes;
use cairn_types::EntityName;
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, Instant};

/// Most frames queued to the writer at once (the byte bound is the real limit).
pub const OUT_QUEUE_FRAMES: usize = 4096;
/// Each received message is charged at least this many bytes against the
/// receive bound, so a flood of empty messages is bounded too.
pub const RECV_MIN_CHARGE_BYTES: usize = 256;
/// Most calls on one connection waiting for their replies at once.
pub const MAX_PENDING_CALLS: usize = 65_536;
/// Most handshakes a listener runs at once.
pub const MAX_CONCURRENT_HANDSHAKES: usize = 128;
/// Most authenticated connections waiting for `Listener::accept`.
pub const ACCEPT_QUEUE_LEN: usize = 128;
/// Most frames written with one vectored write.
const WRITE_BATCH_FRAMES: usize = 32;
/// Queued frames are batched until their payloads reach this many bytes.
const WRITE_BATCH_BYTES: usize = 256 << 10;
/// Socket read buffer size.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// How long a local close waits to tell the peer why.
const CLOSE_NOTICE_TIMEOUT: Duration = Duration::from_secs(1);

/// One application message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub msg_type: u16,
    /// Sender-assigned id, unique per connection and direction.
    pub id: u64,
    /// Set on replies: the id of the request answered.
    pub reply_to: Option<u64>,
    pub payload: Bytes,
    /// The verified crc32c of the 4 KiB blocks of the payload's bulk data
    /// segment, when the connection computed them while checking the frame
    /// (crc mode, `MsgConfig::recv_block_crcs`, a frame with `bulk_at`).
    pub blocks: Option<Arc<BlockCrcs>>,
}

struct OutFrame {
    header: FrameHeader,
    /// The payload as consecutive segments (one frame on the wire).
    payload: Vec<Bytes>,
    /// crc32c of some of those segments, known to the sender.
    known: Vec<KnownCrc>,
    _permit: Option<OwnedSemaphorePermit>,
}

/// The crc32c of one segment of a payload, known to its sender (e.g. data
/// whose block checksums the store has just verified, combined with
/// `cairn_types::crc`). On a connection in crc mode the frame's crc is then
/// combined from it instead of computed over that segment's bytes again
/// (secure mode ignores it: its MAC reads every byte). A wrong value makes
/// the receiver refuse the frame as corrupted, so it must be the crc of
/// exactly those bytes (checked in debug builds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownCrc {
    /// Index of the segment in the payload's list.
    pub segment: usize,
    /// Its crc32c.
    pub crc: u32,
}

struct Inbound {
    msg: Message,
    _permit: OwnedSemaphorePermit,
}

struct Shared {
    peer: EntityName,
    addr: SocketAddr,
    label: String,
    peer_caps: Option<String>,
    mode: crate::config::FrameMode,
    cfg: MsgConfig,
    out_tx: mpsc::Sender<OutFrame>,
    send_window: Arc<Semaphore>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Message>>>,
    next_id: AtomicU64,
    inbox: tokio::sync::Mutex<mpsc::UnboundedReceiver<Inbound>>,
    dead: Mutex<Option<(MsgError, bool)>>,
    dead_tx: watch::Sender<bool>,
    /// The runtime the connection's tasks run on, and its flavour.
    runtime: (tokio::runtime::Id, tokio::runtime::RuntimeFlavor),
}

impl Shared {
    /// Records the first cause of death and wakes every waiter.
    fn fail(&self, err: MsgError, local: bool) {
        {
            let mut d = self.dead.lock().unwrap_or_else(|p| p.into_inner());
            if d.is_none() {
                match &err {
                    MsgError::Closed { .. } => tracing::debug!("{err}"),
                    _ => tracing::warn!("{err}"),
                }
                *d = Some((err, local));
            }
        }
        self.dead_tx.send_replace(true);
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn dead_error(&self) -> Option<MsgError> {
        self.dead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(e, _)| e.clone())
    }

    fn closed_error(&self) -> MsgError {
        self.dead_error().unwrap_or_else(|| MsgError::Closed {
            peer: self.label.clone(),
            reason: "the connection's tasks stopped".into(),
        })
    }

    async fn wait_dead(&self) {
        let mut rx = self.dead_tx.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn enqueue(
        &self,
        header: FrameHeader,
        payload: Vec<Bytes>,
        known: Vec<KnownCrc>,
        deadline: Instant,
        after: Duration,
    ) -> Result<(), MsgError> {
        if let Some(e) = self.dead_error() {
            return Err(e);
        }
        let len = parts_len(&payload);
        if len > self.cfg.max_message_bytes {
            return Err(MsgError::TooLarge {
                peer: self.label.clone(),
                direction: "to",
                len: len as u64,
                limit: self.cfg.max_message_bytes,
            });
        }
        let cost = (HEADER_LEN + len).min(self.cfg.max_inflight_bytes) as u32;
        let what = || {
            format!(
                "room to send a {}-byte message (max_inflight_bytes {} in use: the peer reads too slowly)",
                len,
                self.cfg.max_inflight_bytes
            )
        };
        let permit = tokio::select! {
            p = timeout_at(deadline, self.send_window.clone().acquire_many_owned(cost)) => match p {
                Err(_) => return Err(MsgError::timeout(&self.label, what(), after)),
                Ok(Err(_)) => return Err(self.closed_error()),
                Ok(Ok(p)) => p,
            },
            _ = self.wait_dead() => return Err(self.closed_error()),
        };
        let frame = OutFrame {
            header,
            payload,
            known,
            _permit: Some(permit),
        };
        match timeout_at(deadline, self.out_tx.send(frame)).await {
            Err(_) => Err(MsgError::timeout(
                &self.label,
                "a slot in the send queue",
                after,
            )),
            Ok(Err(_)) => Err(self.closed_error()),
            Ok(Ok(())) => Ok(()),
        }
    }
}

/// Dropping the last `Connection` clone closes the connection.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.fail(
            MsgError::Closed {
                peer: self.shared.label.clone(),
                reason: "its last handle was dropped".into(),
            },
            true,
        );
    }
}

/// An authenticated, signed connection. Cheap to clone; background tasks
/// own the socket.
///
/// The application must keep calling [`Connection::recv`]: requests not
/// taken fill the receive bound (`max_inflight_bytes`), after which the
/// socket is no longer read — including replies to this side's calls.
#[derive(Clone)]
pub struct Connection {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.handle.shared.label)
            .finish()
    }
}

impl Connection {
    /// The authenticated name of the peer.
    pub fn peer(&self) -> &EntityName {
        &self.handle.shared.peer
    }

    /// The peer's socket address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.handle.shared.addr
    }

    /// `"osd.3 (127.0.0.1:6800)"`: what errors use to name the peer.
    pub fn peer_label(&self) -> &str {
        &self.handle.shared.label
    }

    /// Caps carried by a ticket, if the peer used one (server side only).
    pub fn peer_caps(&self) -> Option<&str> {
        self.handle.shared.peer_caps.as_deref()
    }

    /// The frame mode negotiated at connect time.
    pub fn mode(&self) -> crate::config::FrameMode {
        self.handle.shared.mode
    }

    /// Why the connection died, if it did.
    pub fn closed_reason(&self) -> Option<MsgError> {
        self.handle.shared.dead_error()
    }

    pub fn is_closed(&self) -> bool {
        self.closed_reason().is_some()
    }

    /// True when the connection's I/O makes progress while the caller
    /// waits: the caller runs on the runtime that runs the connection's
    /// tasks, or that runtime is a multi-thread one (its workers drive it
    /// on their own). A current-thread runtime runs its tasks only while
    /// someone drives it, so a connection it opened can stall a caller on
    /// another runtime.
    pub fn is_driven_here(&self) -> bool {
        let (id, flavor) = &self.handle.shared.runtime;
        *flavor == tokio::runtime::RuntimeFlavor::MultiThread
            || tokio::runtime::Handle::try_current().is_ok_and(|h| h.id() == *id)
    }

    fn next_id(&self) -> u64 {
        self.handle.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn header(
        &self,
        msg_type: u16,
        id: u64,
        reply_to: Option<u64>,
        parts: &[Bytes],
    ) -> FrameHeader {
        let len = parts_len(parts);
        let mut h = FrameHeader::new(
            FrameKind::Message,
            msg_type,
            len.min(u32::MAX as usize) as u32,
        );
        h.id = id;
        h.reply_to = reply_to;
        h.bulk_at = bulk_at(parts);
        h
    }

    /// One-way message. Waits (up to `send_timeout`) while the in-flight
    /// bound is used up.
    pub async fn send(&self, msg_type: u16, payload: Bytes) -> Result<(), MsgError> {
        self.send_parts(msg_type, vec![payload]).await
    }

    /// [`Connection::send`] of a payload given as consecutive segments: they
    /// go out back to back with one vectored write and one MAC, and the
    /// receiver sees one contiguous payload (no copy to join them here).
    pub async fn send_parts(&self, msg_type: u16, payload: Vec<Bytes>) -> Result<(), MsgError> {
        self.send_parts_known(msg_type, payload, Vec::new()).await
    }

    /// [`Connection::send_parts`] with the crc32c of some segments known
    /// (see [`KnownCrc`]).
    pub async fn send_parts_known(
        &self,
        msg_type: u16,
        payload: Vec<Bytes>,
        known: Vec<KnownCrc>,
    ) -> Result<(), MsgError> {
        let after = self.handle.shared.cfg.send_timeout;
        let h = self.header(msg_type, self.next_id(), None, &payload);
        self.handle
            .shared
            .enqueue(h, payload, known, Instant::now() + after, after)
            .await
    }

    /// Request/response: sends and waits for the reply, all within `timeout`.
    pub async fn call(
        &self,
        msg_type: u16,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Message, MsgError> {
        self.call_parts(msg_type, vec![payload], timeout).await
    }

    /// [`Connection::call`] with the request given as consecutive segments
    /// (see [`Connection::send_parts`]).
    pub async fn call_parts(
        &self,
        msg_type: u16,
        payload: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<Message, MsgError> {
        self.call_parts_known(msg_type, payload, Vec::new(), timeout)
            .await
    }

    /// [`Connection::call_parts`] with the crc32c of some segments known
    /// (see [`KnownCrc`]).
    pub async fn call_parts_known(
        &self,
        msg_type: u16,
        payload: Vec<Bytes>,
        known: Vec<KnownCrc>,
        timeout: Duration,
    ) -> Result<Message, MsgError> {
        let sh = &self.handle.shared;
        let deadline = Instant::now() + timeout;
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = sh.pending.lock().unwrap_or_else(|p| p.into_inner());
            if pending.len() >= MAX_PENDING_CALLS {
                return Err(MsgError::Invalid {
                    reason: format!(
                        "{MAX_PENDING_CALLS} calls to {} are already waiting for replies; limit the caller's concurrency",
                        sh.label
                    ),
                });
            }
            pending.insert(id, tx);
        }
        let h = self.header(msg_type, id, None, &payload);
        let result = async {
            sh.enqueue(h, payload, known, deadline, timeout).await?;
            match timeout_at(deadline, rx).await {
                Err(_) => Err(MsgError::timeout(
                    &sh.label,
                    format!("the reply to message type {msg_type} (id {id})"),
                    timeout,
                )),
                Ok(Err(_)) => Err(sh.closed_error()),
                Ok(Ok(m)) => Ok(m),
            }
        }
        .await;
        if result.is_err() {
            sh.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        }
        result
    }

    /// Answers `to` (a message received with `recv`).
    pub async fn reply(&self, to: &Message, msg_type: u16, payload: Bytes) -> Result<(), MsgError> {
        self.reply_parts(to, msg_type, vec![payload]).await
    }

    /// [`Connection::reply`] with the answer given as consecutive segments
    /// (see [`Connection::send_parts`]).
    pub async fn reply_parts(
        &self,
        to: &Message,
        msg_type: u16,
        payload: Vec<Bytes>,
    ) -> Result<(), MsgError> {
        self.reply_parts_known(to, msg_type, payload, Vec::new())
            .await
    }

    /// [`Connection::reply_parts`] with the crc32c of some segments known
    /// (see [`KnownCrc`]).
    pub async fn reply_parts_known(
        &self,
        to: &Message,
        msg_type: u16,
        payload: Vec<Bytes>,
        known: Vec<KnownCrc>,
    ) -> Result<(), MsgError> {
        let after = self.handle.shared.cfg.send_timeout;
        let h = self.header(msg_type, self.next_id(), Some(to.id), &payload);
        self.handle
            .shared
            .enqueue(h, payload, known, Instant::now() + after, after)
            .await
    }

    /// [`Connection::reply_parts`] without waiting: queues the answer if
    /// the in-flight bound and the send queue have room right now. When
    /// they do not, the payload is handed back (`Err(Some(payload))`) for
    /// the caller to send with `reply_parts` from a task of its own; when
    /// the connection is dead or the payload too large, `Err(None)` (the
    /// answer cannot be sent at all). Saves a task per answer on the hot
    /// path of a server that would otherwise spawn one to reply.
    pub fn try_reply_parts(
        &self,
        to: &Message,
        msg_type: u16,
        payload: Vec<Bytes>,
    ) -> Result<(), Option<Vec<Bytes>>> {
        self.try_reply_parts_known(to, msg_type, payload, Vec::new())
    }

    /// [`Connection::try_reply_parts`] with the crc32c of some segments
    /// known (see [`KnownCrc`]). A payload handed back is to be sent with
    /// [`Connection::reply_parts_known`] and the same `known`.
    pub fn try_reply_parts_known(
        &self,
        to: &Message,
        msg_type: u16,
        payload: Vec<Bytes>,
        known: Vec<KnownCrc>,
    ) -> Result<(), Option<Vec<Bytes>>> {
        let sh = &self.handle.shared;
        if sh.dead_error().is_some() {
            return Err(None);
        }
        let len = parts_len(&payload);
        if len > sh.cfg.max_message_bytes {
            return Err(None);
        }
        let cost = (HEADER_LEN + len).min(sh.cfg.max_inflight_bytes) as u32;
        let Ok(permit) = sh.send_window.clone().try_acquire_many_owned(cost) else {
            return Err(Some(payload));
        };
        let header = self.header(msg_type, self.next_id(), Some(to.id), &payload);
        let frame = OutFrame {
            header,
            payload,
            known,
            _permit: Some(permit),
        };
        match sh.out_tx.try_send(frame) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(f)) => Err(Some(f.payload)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(None),
        }
    }

    /// The next incoming request or one-way message. Messages that arrived
    /// before the connection died are still delivered, then the cause of
    /// death is returned. Ends when the connection dies (keepalive timeout
    /// bounds the wait on a silent peer).
    pub async fn recv(&self) -> Result<Message, MsgError> {
        let sh = &self.handle.shared;
        let mut inbox = sh.inbox.lock().await;
        tokio::select! {
            biased;
            m = inbox.recv() => match m {
                Some(inb) => Ok(inb.msg),
                None => Err(sh.closed_error()),
            },
            _ = sh.wait_dead() => match inbox.try_recv() {
                Ok(inb) => Ok(inb.msg),
                Err(_) => Err(sh.closed_error()),
            },
        }
    }

    /// [`Connection::recv`] with a bound on the wait.
    pub async fn recv_timeout(&self, after: Duration) -> Result<Message, MsgError> {
        match timeout(after, self.recv()).await {
            Ok(r) => r,
            Err(_) => Err(MsgError::timeout(
                &self.handle.shared.label,
                "an incoming message",
                after,
            )),
        }
    }

    /// Closes the connection (tells the peer, best effort). Pending calls
    /// fail with `Closed`.
    pub fn close(&self) {
        self.handle.shared.fail(
            MsgError::Closed {
                peer: self.handle.shared.label.clone(),
                reason: "the application closed it".into(),
            },
            true,
        );
    }
}

/// Starts the tasks of an established connection.
pub(crate) fn start(
    stream: TcpStream,
    est: Established,
    addr: SocketAddr,
    cfg: MsgConfig,
) -> Connection {
    let label = format!("{} ({addr})", est.peer);
    let (out_tx, out_rx) = mpsc::channel(OUT_QUEUE_FRAMES);
    let (in_tx, in_rx) = mpsc::unbounded_channel();
    let (dead_tx, _) = watch::channel(false);
    let rt = tokio::runtime::Handle::current();
    let shared = Arc::new(Shared {
        peer: est.peer,
        addr,
        label,
        peer_caps: est.peer_caps,
        mode: est.mode,
        send_window: Arc::new(Semaphore::new(cfg.max_inflight_bytes)),
        cfg,
        out_tx,
        pending: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        inbox: tokio::sync::Mutex::new(in_rx),
        dead: Mutex::new(None),
        dead_tx,
        runtime: (rt.id(), rt.runtime_flavor()),
    });
    let (rd, wr) = stream.into_split();
    tokio::spawn(reader_task(shared.clone(), rd, est.verifier, in_tx));
    tokio::spawn(writer_task(shared.clone(), wr, est.signer, out_rx));
    Connection {
        handle: Arc::new(Handle { shared }),
    }
}

/// Held by each of a connection's tasks: when the task ends, or is dropped
/// unfinished because its runtime shut down, the connection is dead (a
/// no-op when a cause of death is already recorded).
struct TaskGuard {
    sh: Arc<Shared>,
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.sh.fail(
            MsgError::Closed {
                peer: self.sh.label.clone(),
                reason: "the tokio runtime that ran its I/O shut down".into(),
            },
            false,
        );
    }
}

async fn reader_task(
    sh: Arc<Shared>,
    rd: OwnedReadHalf,
    verifier: FrameVerifier,
    in_tx: mpsc::UnboundedSender<Inbound>,
) {
    let _guard = TaskGuard { sh: sh.clone() };
    let recv_window = Arc::new(Semaphore::new(sh.cfg.max_inflight_bytes));
    let r = tokio::select! {
        r = reader_loop(&sh, rd, verifier, &in_tx, &recv_window) => r,
        _ = sh.wait_dead() => Ok(()),
    };
    if let Err(e) = r {
        sh.fail(e, false);
    }
}

async fn reader_loop(
    sh: &Shared,
    rd: OwnedReadHalf,
    mut verifier: FrameVerifier,
    in_tx: &mpsc::UnboundedSender<Inbound>,
    recv_window: &Arc<Semaphore>,
) -> Result<(), MsgError> {
    let mut rd = BufReader::with_capacity(READ_BUFFER_BYTES, rd);
    loop {
        // The header is authenticated (kind, MAC, sequence) before its
        // payload is read: an unauthenticated length allocates nothing.
        let f = read_frame(
            &mut rd,
            &sh.label,
            sh.cfg.max_message_bytes,
            sh.cfg.keepalive_timeout,
            |raw, hdr| {
                if !hdr.kind.is_signed() || hdr.kind == FrameKind::AuthOk {
                    return Err(MsgError::protocol(
                        &sh.label,
                        format!("unexpected {:?} frame after the handshake", hdr.kind),
                    ));
                }
                verifier
                    .check_header(raw, hdr)
                    .map_err(|e| frame_error(&sh.label, e))
            },
        )
        .await?;
        // A bulk segment's blocks start at `bulk_at` (the receive buffer
        // put that offset on a block boundary).
        let blocks_at = match f.header.bulk_at {
            Some(at)
                if sh.cfg.recv_block_crcs
                    && verifier.key().mode() == crate::config::FrameMode::Crc
                    && f.payload.len() >= BULK_SEGMENT_BYTES =>
            {
                Some(usize::from(at))
            }
            _ => None,
        };
        // Big payloads are checked off the async workers.
        let checked = if f.payload.len() >= verifier.key().offload_bytes() {
            let (key, raw, mac, payload) = (
                verifier.key().clone(),
                f.raw_header,
                f.header.mac,
                f.payload.clone(),
            );
            tokio::task::spawn_blocking(move || {
                check_payload(&key, &raw[..SIGNED_HEADER_LEN], &payload, &mac, blocks_at)
            })
            .await
            .map_err(|e| MsgError::protocol(&sh.label, format!("frame check task failed: {e}")))?
        } else {
            check_payload(
                verifier.key(),
                &f.raw_header[..SIGNED_HEADER_LEN],
                &f.payload,
                &f.header.mac,
                blocks_at,
            )
        };
        let mac_ok = checked.is_some();
        let blocks = blocks_at
            .zip(checked.flatten())
            .map(|(first, crcs)| Arc::new(BlockCrcs::new(f.payload.clone(), first, crcs)));
        verifier
            .accept_payload(&f.header, mac_ok)
            .map_err(|e| frame_error(&sh.label, e))?;
        match f.header.kind {
            FrameKind::Keepalive => {}
            FrameKind::Close => {
                let why =
                    String::from_utf8_lossy(&f.payload[..f.payload.len().min(CLOSE_MAX_BYTES)])
                        .into_owned();
                return Err(MsgError::Closed {
                    peer: sh.label.clone(),
                    reason: format!("the peer closed the connection: {why}"),
                });
            }
            _ => {
                let msg = Message {
                    msg_type: f.header.msg_type,
                    id: f.header.id,
                    reply_to: f.header.reply_to,
                    payload: f.payload,
                    blocks,
                };
                deliver(sh, msg, in_tx, recv_window).await?;
            }
        }
    }
}

/// Checks a received frame's payload against its MAC: `None` when it
/// does not match; otherwise, with `blocks_at` (a block-checked bulk
/// segment's start), the crcs of its 4 KiB blocks computed on the way.
fn check_payload(
    key: &FrameKey,
    header: &[u8],
    payload: &[u8],
    mac: &[u8],
    blocks_at: Option<usize>,
) -> Option<Option<Vec<u32>>> {
    match blocks_at {
        Some(first) => key.verify_blocks(header, payload, first, mac).map(Some),
        None => key.verify(header, payload, mac).then_some(None),
    }
}

async fn deliver(
    sh: &Shared,
    msg: Message,
    in_tx: &mpsc::UnboundedSender<Inbound>,
    recv_window: &Arc<Semaphore>,
) -> Result<(), MsgError> {
    if let Some(to) = msg.reply_to {
        let waiter = sh
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&to);
        match waiter {
            Some(tx) => {
                let _ = tx.send(msg);
            }
            None => tracing::debug!(
                "{}: dropping a reply to id {to} nobody waits for (timed out?)",
                sh.label
            ),
        }
        return Ok(());
    }
    let cost = (msg.payload.len().max(RECV_MIN_CHARGE_BYTES)).min(sh.cfg.max_inflight_bytes) as u32;
    // Waits while the application has not taken enough messages: this is
    // what stops us reading the socket and pushes back on the sender.
    let permit = recv_window
        .clone()
        .acquire_many_owned(cost)
        .await
        .map_err(|_| sh.closed_error())?;
    in_tx
        .send(Inbound {
            msg,
            _permit: permit,
        })
        .map_err(|_| sh.closed_error())
}

async fn writer_task(
    sh: Arc<Shared>,
    mut wr: OwnedWriteHalf,
    mut signer: FrameSigner,
    mut out_rx: mpsc::Receiver<OutFrame>,
) {
    let _guard = TaskGuard { sh: sh.clone() };
    // Set while a frame is partly written: a Close frame must not follow
    // half a frame.
    let mut mid_frame = false;
    let result = tokio::select! {
        r = writer_loop(&sh, &mut wr, &mut signer, &mut out_rx, &mut mid_frame) => r,
        _ = sh.wait_dead() => Ok(()),
    };
    if let Err(e) = result {
        sh.fail(e, false);
        return;
    }
    let local = sh
        .dead
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|(e, local)| match e {
            MsgError::Closed { reason, .. } => (reason.clone(), *local),
            other => (other.to_string(), *local),
        });
    if mid_frame {
        return;
    }
    if let Some((reason, true)) = local {
        let mut why = reason.into_bytes();
        why.truncate(CLOSE_MAX_BYTES);
        let mut h = FrameHeader::new(FrameKind::Close, 0, why.len() as u32);
        let raw = signer.seal(&mut h, &why);
        let _ = timeout(CLOSE_NOTICE_TIMEOUT, async {
            write_frame(&mut wr, &raw, &why).await?;
            wr.shutdown().await
        })
        .await;
    }
}

/// Assigns the next sequence number to `frame` and signs it; returns the
/// header bytes. Big payloads are signed on the blocking pool.
async fn seal_frame(
    sh: &Shared,
    signer: &mut FrameSigner,
    frame: &mut OutFrame,
) -> Result<[u8; HEADER_LEN], MsgError> {
    let mut raw = signer.prepare(&mut frame.header);
    let mac = if parts_len(&frame.payload) >= signer.key().offload_bytes() {
        let key = signer.key().clone();
        let (payload, known) = (frame.payload.clone(), frame.known.clone());
        tokio::task::spawn_blocking(move || {
            key.sign_parts_known(&raw[..SIGNED_HEADER_LEN], &payload, &known)
        })
        .await
        .map_err(|e| MsgError::protocol(&sh.label, format!("MAC task failed: {e}")))?
    } else {
        signer
            .key()
            .sign_parts_known(&raw[..SIGNED_HEADER_LEN], &frame.payload, &frame.known)
    };
    raw[FRAME_MAC_AT..].copy_from_slice(&mac);
    Ok(raw)
}

async fn writer_loop(
    sh: &Shared,
    wr: &mut OwnedWriteHalf,
    signer: &mut FrameSigner,
    out_rx: &mut mpsc::Receiver<OutFrame>,
    mid_frame: &mut bool,
) -> Result<(), MsgError> {
    let mut batch: Vec<OutFrame> = Vec::with_capacity(WRITE_BATCH_FRAMES);
    let mut headers: Vec<[u8; HEADER_LEN]> = Vec::with_capacity(WRITE_BATCH_FRAMES);
    loop {
        let first = match timeout(sh.cfg.keepalive_interval, out_rx.recv()).await {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(_) => OutFrame {
                header: FrameHeader::new(FrameKind::Keepalive, 0, 0),
                payload: Vec::new(),
                known: Vec::new(),
                _permit: None,
            },
        };
        // Small frames that are already queued go out in one vectored write.
        let mut batch_bytes = parts_len(&first.payload);
        batch.push(first);
        while batch.len() < WRITE_BATCH_FRAMES && batch_bytes < WRITE_BATCH_BYTES {
            match out_rx.try_recv() {
                Ok(f) => {
                    batch_bytes += parts_len(&f.payload);
                    batch.push(f);
                }
                Err(_) => break,
            }
        }
        for f in batch.iter_mut() {
            headers.push(seal_frame(sh, signer, f).await?);
        }
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(batch.len() * 3);
        for (h, f) in headers.iter().zip(batch.iter()) {
            slices.push(IoSlice::new(h));
            slices.extend(f.payload.iter().map(|p| IoSlice::new(p)));
        }
        *mid_frame = true;
        write_all_slices(wr, &mut slices)
            .await
            .map_err(|e| MsgError::io(&sh.label, "sending frames", &e))?;
        *mid_frame = false;
        drop(slices);
        headers.clear();
        // The frames' in-flight permits are released here.
        batch.clear();
    }
}

/// Total length of a payload held as segments.
/// Segments at least this long are bulk data worth aligning on receipt.
pub const BULK_SEGMENT_BYTES: usize = 64 << 10;

/// The frame's `bulk_at`: where its largest segment of at least
/// [`BULK_SEGMENT_BYTES`] starts, modulo [`BULK_ALIGN`] (none without one).
fn bulk_at(parts: &[Bytes]) -> Option<u16> {
    let mut at = 0usize;
    let mut best: Option<(usize, usize)> = None;
    for p in parts {
        if p.len() >= BULK_SEGMENT_BYTES && best.is_none_or(|(n, _)| p.len() > n) {
            best = Some((p.len(), at));
        }
        at += p.len();
    }
    best.map(|(_, at)| (at % BULK_ALIGN) as u16)
}

fn parts_len(parts: &[Bytes]) -> usize {
    parts.iter().map(Bytes::len).sum()
}

/// Connects to `addr`, authenticates both ways and returns the connection.
/// `expect_peer`, if given, must be the name the server proves.
pub async fn connect(
    addr: SocketAddr,
    creds: &Credentials,
    expect_peer: Option<&EntityName>,
    cfg: &MsgConfig,
) -> Result<Connection, MsgError> {
    cfg.validate()?;
    let label = addr.to_string();
    let open = || async {
        let stream = match timeout(cfg.connect_timeout, TcpStream::connect(addr)).await {
            Err(_) => {
                return Err(MsgError::timeout(
                    &label,
                    "the TCP connection to be established",
                    cfg.connect_timeout,
                ))
            }
            Ok(Err(e)) => return Err(MsgError::io(&label, "connecting", &e)),
            Ok(Ok(s)) => s,
        };
        let _ = stream.set_nodelay(true);
        Ok(stream)
    };
    // Usually one connection; two when a server of the exact-match
    // handshake requires the second mode of `cfg.modes` (see `handshake`).
    let (stream, est) = handshake::negotiate(
        open,
        &label,
        creds,
        expect_peer,
        cfg.modes,
        cfg.handshake_timeout,
    )
    .await?;
    Ok(start(stream, est, addr, cfg.clone()))
}

/// Accepts connections and authenticates them in the background.
pub struct Listener {
    local: SocketAddr,
    ready: tokio::sync::Mutex<mpsc::Receiver<Connection>>,
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Binds `addr` and starts accepting. `me` is the name this side proves.
    pub async fn bind(
        addr: SocketAddr,
        me: EntityName,
        keys: Arc<dyn KeyServer>,
        cfg: MsgConfig,
    ) -> Result<Listener, MsgError> {
        cfg.validate()?;
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| MsgError::io(&addr.to_string(), "binding the listening socket", &e))?;
        let local = l
            .local_addr()
            .map_err(|e| MsgError::io(&addr.to_string(), "reading the bound address", &e))?;
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE_LEN);
        let task = tokio::spawn(accept_loop(l, me, keys, cfg, tx));
        Ok(Listener {
            local,
            ready: tokio::sync::Mutex::new(rx),
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next authenticated connection. Failed handshakes are logged and
    /// dropped; the listener keeps going. Waits for a client indefinitely
    /// (wrap in a timeout if needed).
    pub async fn accept(&self) -> Result<Connection, MsgError> {
        self.ready
            .lock()
            .await
            .recv()
            .await
            .ok_or_else(|| MsgError::Closed {
                peer: self.local.to_string(),
                reason: "the listener stopped accepting".into(),
            })
    }
}

async fn accept_loop(
    l: TcpListener,
    me: EntityName,
    keys: Arc<dyn KeyServer>,
    cfg: MsgConfig,
    tx: mpsc::Sender<Connection>,
) {
    let limit = Arc::new(Semaphore::new(MAX_CONCURRENT_HANDSHAKES));
    loop {
        let (stream, addr) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("{me}: accept failed: {e}; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = limit.clone().acquire_owned().await else {
            return;
        };
        let (me, keys, cfg, tx) = (me.clone(), keys.clone(), cfg.clone(), tx.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let _ = stream.set_nodelay(true);
            let mut stream = stream;
            let label = addr.to_string();
            let hs = timeout(
                cfg.handshake_timeout,
                handshake::server(
                    &mut stream,
                    &label,
                    &me,
                    keys.as_ref(),
                    cfg.accept,
                    cfg.handshake_timeout,
                ),
            )
            .await;
            match hs {
                Err(_) => tracing::warn!(
                    "{me}: handshake with {label} timed out after {:?}; dropped",
                    cfg.handshake_timeout
                ),
                Ok(Err(e)) => tracing::warn!("{me}: refused a connection: {e}"),
                Ok(Ok(est)) => {
                    let conn = start(stream, est, addr, cfg);
                    let _ = tx.send(conn).await;
                }
            }
        });
    }
}
