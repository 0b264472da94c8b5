//! Reading and writing whole frames on a byte stream with bounded waits.
//! Owns the "check the length before allocating" rule (and the hook that
//! authenticates a signed header before its payload is read) and vectored
//! writes; not signing (see `frame`) nor dispatch (see `conn`).

use crate::frame::{FrameError, FrameHeader, BULK_ALIGN, HEADER_LEN};
use crate::MsgError;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::io::IoSlice;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

/// A frame as read from the wire (not yet verified).
pub(crate) struct RawFrame {
    pub header: FrameHeader,
    pub raw_header: [u8; HEADER_LEN],
    pub payload: Bytes,
}

pub(crate) fn frame_error(peer: &str, e: FrameError) -> MsgError {
    match e {
        FrameError::TooLarge { kind, len, limit } => {
            if kind == crate::frame::FrameKind::Message {
                MsgError::TooLarge {
                    peer: peer.to_string(),
                    direction: "from",
                    len,
                    limit,
                }
            } else {
                MsgError::protocol(peer, FrameError::TooLarge { kind, len, limit }.to_string())
            }
        }
        e @ (FrameError::BadMac { .. }
        | FrameError::BadCrc { .. }
        | FrameError::BadHeaderMac { .. }
        | FrameError::BadSequence { .. }) => MsgError::Integrity {
            peer: peer.to_string(),
            reason: e.to_string(),
        },
        e => MsgError::protocol(peer, e.to_string()),
    }
}

/// Reads one frame. `idle` bounds every single read: a peer that sends
/// nothing for that long is reported as a timeout naming it. `check_header`
/// runs on the decoded header before any payload byte is read or allocated
/// (signed frames: the header MAC and sequence number); its error ends the
/// read.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    peer: &str,
    max_message_bytes: usize,
    idle: Duration,
    check_header: impl FnOnce(&[u8; HEADER_LEN], &FrameHeader) -> Result<(), MsgError>,
) -> Result<RawFrame, MsgError> {
    let mut raw_header = [0u8; HEADER_LEN];
    let mut have = 0;
    while have < HEADER_LEN {
        let n = match timeout(idle, r.read(&mut raw_header[have..])).await {
            Err(_) => {
                return Err(MsgError::timeout(
                    peer,
                    "any traffic (keepalive timeout: the peer went silent)",
                    idle,
                ))
            }
            Ok(Err(e)) => return Err(MsgError::io(peer, "reading a frame header", &e)),
            Ok(Ok(n)) => n,
        };
        if n == 0 {
            let reason = if have == 0 {
                "the peer closed the connection".to_string()
            } else {
                format!("the peer closed the connection after {have} bytes of a frame header")
            };
            return Err(MsgError::Closed {
                peer: peer.to_string(),
                reason,
            });
        }
        have += n;
    }
    let header =
        FrameHeader::decode(&raw_header, max_message_bytes).map_err(|e| frame_error(peer, e))?;
    check_header(&raw_header, &header)?;
    // The length is within its limit (and, on signed frames, authentic):
    // allocating it is allowed.
    let len = header.payload_len as usize;
    if len >= crate::bufpool::POOL_MIN_BYTES {
        let payload = read_pooled(r, peer, len, header.bulk_at, idle).await?;
        return Ok(RawFrame {
            header,
            raw_header,
            payload,
        });
    }
    let mut payload = payload_buffer(len, header.bulk_at);
    while payload.len() < len {
        let have = payload.len();
        let mut limited = (&mut payload).limit(len - have);
        payload_read_step(peer, len, have, idle, r.read_buf(&mut limited)).await?;
    }
    Ok(RawFrame {
        header,
        raw_header,
        payload: payload.freeze(),
    })
}

/// Awaits one read of a `len`-byte payload of which `have` bytes are in,
/// bounded by `idle`: the number of bytes it read (> 0), or the error
/// naming the peer for a timeout, an I/O error or a connection closed
/// mid-payload. Shared by both payload read loops.
async fn payload_read_step(
    peer: &str,
    len: usize,
    have: usize,
    idle: Duration,
    read: impl std::future::Future<Output = std::io::Result<usize>>,
) -> Result<usize, MsgError> {
    match timeout(idle, read).await {
        Err(_) => Err(MsgError::timeout(
            peer,
            format!("the rest of a {len}-byte payload ({have} bytes received; keepalive timeout)"),
            idle,
        )),
        Ok(Err(e)) => Err(MsgError::io(peer, "reading a frame payload", &e)),
        Ok(Ok(0)) => Err(MsgError::Closed {
            peer: peer.to_string(),
            reason: format!("the peer closed the connection in the middle of a {len}-byte payload"),
        }),
        Ok(Ok(n)) => Ok(n),
    }
}

/// Reads a big payload into a recycled buffer (see `bufpool`), its bulk
/// segment (at `bulk_at`) on a [`BULK_ALIGN`] boundary.
async fn read_pooled<R: AsyncRead + Unpin>(
    r: &mut R,
    peer: &str,
    len: usize,
    bulk_at: Option<u16>,
    idle: Duration,
) -> Result<Bytes, MsgError> {
    let (mut buf, start) = crate::bufpool::take(len, bulk_at);
    let mut have = 0;
    while have < len {
        let read = r.read(&mut buf[start + have..start + len]);
        have += payload_read_step(peer, len, have, idle, read).await?;
    }
    Ok(crate::bufpool::freeze(buf, start, len))
}

/// An empty buffer with room for a `len`-byte payload. With `bulk_at`, the
/// buffer starts so that payload byte `bulk_at` (and every
/// [`BULK_ALIGN`]-th byte after it) sits at an aligned address: a bulk
/// segment decoded as a slice of the payload can then be written with
/// O_DIRECT as it is. Costs at most `BULK_ALIGN` bytes of slack.
pub(crate) fn payload_buffer(len: usize, bulk_at: Option<u16>) -> BytesMut {
    let Some(at) = bulk_at else {
        return BytesMut::with_capacity(len);
    };
    let mut buf = BytesMut::with_capacity(len + BULK_ALIGN);
    let start = buf.as_ptr() as usize;
    let pad = (BULK_ALIGN - (start + usize::from(at)) % BULK_ALIGN) % BULK_ALIGN;
    buf.resize(pad, 0);
    buf.advance(pad);
    buf
}

/// Writes header and payload with vectored writes (no copy of the payload).
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &[u8],
    payload: &[u8],
) -> std::io::Result<()> {
    let (mut a, mut b) = (header, payload);
    while !a.is_empty() || !b.is_empty() {
        let n = if a.is_empty() {
            w.write(b).await?
        } else if b.is_empty() {
            w.write(a).await?
        } else {
            w.write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
                .await?
        };
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "socket accepted no bytes",
            ));
        }
        if n < a.len() {
            a = &a[n..];
        } else {
            let rest = n - a.len();
            a = &[];
            b = &b[rest..];
        }
    }
    Ok(())
}

/// Writes all of `bufs` with vectored writes, resuming after partial ones.
pub(crate) async fn write_all_slices<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut bufs: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = w.write_vectored(bufs).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "socket accepted no bytes",
            ));
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// Writes an unsigned handshake frame.
pub(crate) async fn write_unsigned<W: AsyncWrite + Unpin>(
    w: &mut W,
    peer: &str,
    kind: crate::frame::FrameKind,
    payload: &[u8],
) -> Result<(), MsgError> {
    let hdr = FrameHeader::new(kind, 0, payload.len() as u32);
    write_frame(w, &hdr.encode(), payload)
        .await
        .map_err(|e| MsgError::io(peer, format!("sending {kind:?}"), &e))?;
    w.flush()
        .await
        .map_err(|e| MsgError::io(peer, format!("sending {kind:?}"), &e))
}
