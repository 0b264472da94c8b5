//! The wire frame: a fixed 72-byte header (magic, version, kind, lengths,
//! sequence, ids, a header MAC and a frame MAC — or, on a connection
//! negotiated in crc mode, a crc32c) followed by the payload.
//! Owns encoding, pure decoding and the per-direction signing/verification
//! state; not socket I/O.
//!
//! Every decoder here is total: garbage yields a [`FrameError`], never a
//! panic, and a length is checked against its limit before anything is
//! allocated for it; on signed frames the header MAC (which covers the
//! length) is checked before the payload is read.

use crate::auth::{FrameKey, FRAME_MAC_LEN};

/// First bytes of every frame.
pub const MAGIC: [u8; 4] = *b"CAIR";
/// Wire format version carried in every frame header.
pub const WIRE_VERSION: u8 = 5;
/// Size of the fixed frame header.
pub const HEADER_LEN: usize = 72;
/// Bytes of the header covered by both MACs (everything before them).
pub const SIGNED_HEADER_LEN: usize = 40;
/// Offset of the header MAC: over the signed header bytes only.
pub const HEADER_MAC_AT: usize = SIGNED_HEADER_LEN;
/// Offset of the frame MAC: over the signed header bytes and the payload.
pub const FRAME_MAC_AT: usize = HEADER_MAC_AT + FRAME_MAC_LEN;
/// Largest handshake payload (names, nonces, a ticket).
pub const HANDSHAKE_MAX_BYTES: usize = 16 << 10;
/// Largest close-frame payload (a reason text).
pub const CLOSE_MAX_BYTES: usize = 1 << 10;

const FLAG_HAS_REPLY_TO: u8 = 1;
/// Header flag: `bulk_at` (bytes 14..16) is set.
const FLAG_BULK_AT: u8 = 2;
/// Alignment a receiver gives the bulk segment of a frame carrying
/// `bulk_at` (what O_DIRECT needs of a buffer's address).
pub const BULK_ALIGN: usize = 4096;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// client -> server: name, nonce, optional ticket (unsigned).
    Hello = 1,
    /// server -> client: name, nonce, server proof (unsigned).
    ServerHello = 2,
    /// client -> server: client proof (unsigned).
    ClientProof = 3,
    /// server -> client: authentication refused, with a reason (unsigned).
    AuthReject = 4,
    /// server -> client: authentication accepted (signed, first s2c frame).
    AuthOk = 5,
    /// An application message (signed).
    Message = 8,
    /// Liveness only, empty payload (signed).
    Keepalive = 9,
    /// Orderly close with a reason text (signed).
    Close = 10,
}

impl FrameKind {
    pub fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Hello,
            2 => FrameKind::ServerHello,
            3 => FrameKind::ClientProof,
            4 => FrameKind::AuthReject,
            5 => FrameKind::AuthOk,
            8 => FrameKind::Message,
            9 => FrameKind::Keepalive,
            10 => FrameKind::Close,
            _ => return None,
        })
    }

    /// Handshake frames before the session key exists carry no MAC.
    pub fn is_signed(self) -> bool {
        matches!(
            self,
            FrameKind::AuthOk | FrameKind::Message | FrameKind::Keepalive | FrameKind::Close
        )
    }

    fn payload_limit(self, max_message_bytes: usize) -> usize {
        match self {
            FrameKind::Hello
            | FrameKind::ServerHello
            | FrameKind::ClientProof
            | FrameKind::AuthReject => HANDSHAKE_MAX_BYTES,
            FrameKind::AuthOk | FrameKind::Keepalive => 0,
            FrameKind::Close => CLOSE_MAX_BYTES,
            FrameKind::Message => max_message_bytes,
        }
    }
}

/// Why a frame could not be decoded or verified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:02x?}: not a Cairn peer (expected \"CAIR\")")]
    BadMagic([u8; 4]),
    #[error("peer speaks wire version {0}, this build speaks version {WIRE_VERSION}; upgrade the older side")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("reserved header bits set (flags {flags:#x}, reserved {reserved:#x})")]
    Reserved { flags: u8, reserved: u32 },
    #[error("{kind:?} frame with a {len}-byte payload, over its {limit}-byte limit")]
    TooLarge {
        kind: FrameKind,
        len: u64,
        limit: usize,
    },
    #[error("truncated frame: {have} of {need} bytes")]
    Truncated { have: usize, need: usize },
    #[error("frame {seq} failed its MAC check (tampered or corrupted in transit)")]
    BadMac { seq: u64 },
    #[error("frame {seq} failed its crc32c check (corrupted in transit; this connection runs in crc mode)")]
    BadCrc { seq: u64 },
    #[error("frame header (sequence number {seq} as sent) failed its MAC check: not from the authenticated peer, or tampered or corrupted in transit; its payload was not read")]
    BadHeaderMac { seq: u64 },
    #[error("frame has sequence number {got}, expected {expected} (replayed, reordered or dropped frame)")]
    BadSequence { got: u64, expected: u64 },
}

/// A decoded frame header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub msg_type: u16,
    pub payload_len: u32,
    pub seq: u64,
    pub id: u64,
    pub reply_to: Option<u64>,
    /// Where a bulk data segment starts in the payload, modulo
    /// [`BULK_ALIGN`]: the receiver places the payload so that this offset
    /// lands on an aligned address (a big write's data then reaches the
    /// disk with O_DIRECT without a bounce copy). Covered by both MACs.
    pub bulk_at: Option<u16>,
    /// MAC of the signed header bytes (zero in unsigned frames).
    pub header_mac: [u8; FRAME_MAC_LEN],
    /// MAC of the signed header bytes and the payload (zero in unsigned
    /// frames).
    pub mac: [u8; FRAME_MAC_LEN],
}

impl FrameHeader {
    /// A header for `kind` with everything else zero.
    pub fn new(kind: FrameKind, msg_type: u16, payload_len: u32) -> FrameHeader {
        FrameHeader {
            kind,
            msg_type,
            payload_len,
            seq: 0,
            id: 0,
            reply_to: None,
            bulk_at: None,
            header_mac: [0; FRAME_MAC_LEN],
            mac: [0; FRAME_MAC_LEN],
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = WIRE_VERSION;
        b[5] = self.kind as u8;
        let mut flags = 0;
        if self.reply_to.is_some() {
            flags |= FLAG_HAS_REPLY_TO;
        }
        if let Some(at) = self.bulk_at {
            flags |= FLAG_BULK_AT;
            b[14..16].copy_from_slice(&at.to_le_bytes());
        }
        b[6] = flags;
        b[8..10].copy_from_slice(&self.msg_type.to_le_bytes());
        b[10..14].copy_from_slice(&self.payload_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.id.to_le_bytes());
        b[32..40].copy_from_slice(&self.reply_to.unwrap_or(0).to_le_bytes());
        b[HEADER_MAC_AT..FRAME_MAC_AT].copy_from_slice(&self.header_mac);
        b[FRAME_MAC_AT..HEADER_LEN].copy_from_slice(&self.mac);
        b
    }

    /// Decodes and checks a header; the payload length is checked against
    /// the kind's limit (`max_message_bytes` for messages) so the caller may
    /// allocate `payload_len` bytes afterwards.
    pub fn decode(
        b: &[u8; HEADER_LEN],
        max_message_bytes: usize,
    ) -> Result<FrameHeader, FrameError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[4] != WIRE_VERSION {
            return Err(FrameError::BadVersion(b[4]));
        }
        let kind = FrameKind::from_u8(b[5]).ok_or(FrameError::UnknownKind(b[5]))?;
        let flags = b[6];
        let at = u16::from_le_bytes([b[14], b[15]]);
        let bulk_at = (flags & FLAG_BULK_AT != 0).then_some(at);
        // Bytes 14..16 are zero unless `bulk_at` is flagged, and then below
        // BULK_ALIGN.
        let stray_at = match bulk_at {
            Some(a) => usize::from(a) >= BULK_ALIGN,
            None => at != 0,
        };
        if flags & !(FLAG_HAS_REPLY_TO | FLAG_BULK_AT) != 0 || b[7] != 0 || stray_at {
            return Err(FrameError::Reserved {
                flags,
                reserved: u32::from(b[7]) | (u32::from(at) << 8),
            });
        }
        let payload_len = u32::from_le_bytes([b[10], b[11], b[12], b[13]]);
        let limit = kind.payload_limit(max_message_bytes);
        if payload_len as usize > limit {
            return Err(FrameError::TooLarge {
                kind,
                len: u64::from(payload_len),
                limit,
            });
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let reply = u64_at(32);
        let reply_to = if flags & FLAG_HAS_REPLY_TO != 0 {
            Some(reply)
        } else if reply != 0 {
            return Err(FrameError::Reserved { flags, reserved: 0 });
        } else {
            None
        };
        let mut header_mac = [0u8; FRAME_MAC_LEN];
        header_mac.copy_from_slice(&b[HEADER_MAC_AT..FRAME_MAC_AT]);
        let mut mac = [0u8; FRAME_MAC_LEN];
        mac.copy_from_slice(&b[FRAME_MAC_AT..HEADER_LEN]);
        Ok(FrameHeader {
            kind,
            msg_type: u16::from_le_bytes([b[8], b[9]]),
            payload_len,
            seq: u64_at(16),
            id: u64_at(24),
            reply_to,
            bulk_at,
            header_mac,
            mac,
        })
    }
}

/// Signs outgoing frames of one direction: assigns sequence numbers and MACs.
pub struct FrameSigner {
    key: FrameKey,
    next_seq: u64,
}

impl FrameSigner {
    pub fn new(key: FrameKey) -> FrameSigner {
        FrameSigner { key, next_seq: 0 }
    }

    /// Fills in `seq` and both MACs and returns the encoded header.
    pub fn seal(&mut self, hdr: &mut FrameHeader, payload: &[u8]) -> [u8; HEADER_LEN] {
        debug_assert_eq!(hdr.payload_len as usize, payload.len());
        let mut bytes = self.prepare(hdr);
        hdr.mac = self.key.sign(&bytes[..SIGNED_HEADER_LEN], payload);
        bytes[FRAME_MAC_AT..].copy_from_slice(&hdr.mac);
        bytes
    }

    /// Assigns the next sequence number, signs the header and returns the
    /// header bytes with a zero frame MAC; the caller fills bytes
    /// `FRAME_MAC_AT..` with `key().sign(&bytes[..SIGNED_HEADER_LEN],
    /// payload)` (possibly on another thread for big payloads).
    pub fn prepare(&mut self, hdr: &mut FrameHeader) -> [u8; HEADER_LEN] {
        hdr.seq = self.next_seq;
        self.next_seq += 1;
        hdr.header_mac = [0; FRAME_MAC_LEN];
        hdr.mac = [0; FRAME_MAC_LEN];
        let mut bytes = hdr.encode();
        hdr.header_mac = self.key.sign_header(&bytes[..SIGNED_HEADER_LEN]);
        bytes[HEADER_MAC_AT..FRAME_MAC_AT].copy_from_slice(&hdr.header_mac);
        bytes
    }

    pub fn key(&self) -> &FrameKey {
        &self.key
    }
}

/// Verifies incoming signed frames of one direction in two steps: the
/// header (its MAC, then the exact next sequence number: replay, reorder,
/// drop) before the payload is read, then the frame MAC over header and
/// payload (tamper).
pub struct FrameVerifier {
    key: FrameKey,
    next_seq: u64,
}

impl FrameVerifier {
    pub fn new(key: FrameKey) -> FrameVerifier {
        FrameVerifier { key, next_seq: 0 }
    }

    /// Both steps on a whole frame.
    pub fn verify(
        &mut self,
        raw_header: &[u8; HEADER_LEN],
        hdr: &FrameHeader,
        payload: &[u8],
    ) -> Result<(), FrameError> {
        self.check_header(raw_header, hdr)?;
        let mac_ok = self
            .key
            .verify(&raw_header[..SIGNED_HEADER_LEN], payload, &hdr.mac);
        self.accept_payload(hdr, mac_ok)
    }

    pub fn key(&self) -> &FrameKey {
        &self.key
    }

    /// First step, before the payload is read or allocated: the header MAC
    /// (so `payload_len` comes from the peer), then the sequence number.
    pub fn check_header(
        &mut self,
        raw_header: &[u8; HEADER_LEN],
        hdr: &FrameHeader,
    ) -> Result<(), FrameError> {
        if !self
            .key
            .verify_header(&raw_header[..SIGNED_HEADER_LEN], &hdr.header_mac)
        {
            return Err(FrameError::BadHeaderMac { seq: hdr.seq });
        }
        if hdr.seq != self.next_seq {
            return Err(FrameError::BadSequence {
                got: hdr.seq,
                expected: self.next_seq,
            });
        }
        self.next_seq += 1;
        Ok(())
    }

    /// Second step when the frame tag (MAC, or crc32c in crc mode) was
    /// checked elsewhere (`mac_ok`).
    pub fn accept_payload(&self, hdr: &FrameHeader, mac_ok: bool) -> Result<(), FrameError> {
        match (mac_ok, self.key.mode()) {
            (true, _) => Ok(()),
            (false, crate::config::FrameMode::Secure) => Err(FrameError::BadMac { seq: hdr.seq }),
            (false, crate::config::FrameMode::Crc) => Err(FrameError::BadCrc { seq: hdr.seq }),
        }
    }
}

/// One frame split off the front of a buffer.
#[derive(Debug)]
pub struct SplitFrame<'a> {
    pub header: FrameHeader,
    pub raw_header: [u8; HEADER_LEN],
    pub payload: &'a [u8],
    /// Bytes of the buffer this frame used.
    pub consumed: usize,
}

/// Splits one frame off the front of `buf`. Pure; used by the fuzzer and
/// by tests.
pub fn split_frame(buf: &[u8], max_message_bytes: usize) -> Result<SplitFrame<'_>, FrameError> {
    let raw: [u8; HEADER_LEN] = buf
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(FrameError::Truncated {
            have: buf.len(),
            need: HEADER_LEN,
        })?;
    let hdr = FrameHeader::decode(&raw, max_message_bytes)?;
    let end = HEADER_LEN + hdr.payload_len as usize;
    let payload = buf.get(HEADER_LEN..end).ok_or(FrameError::Truncated {
        have: buf.len(),
        need: end,
    })?;
    Ok(SplitFrame {
        header: hdr,
        raw_header: raw,
        payload,
        consumed: end,
    })
}

/// Decodes a byte stream of frames, verifying signed ones with `verifier`
/// and handshake payloads with the handshake decoders. Returns how many
/// frames were accepted before the first error (if any). Pure; this is the
/// fuzz target's entry point.
pub fn decode_stream(
    mut buf: &[u8],
    max_message_bytes: usize,
    verifier: &mut FrameVerifier,
) -> (usize, Option<FrameError>) {
    let mut frames = 0;
    while !buf.is_empty() {
        let SplitFrame {
            header: hdr,
            raw_header: raw,
            payload,
            consumed: used,
        } = match split_frame(buf, max_message_bytes) {
            Ok(x) => x,
            Err(e) => return (frames, Some(e)),
        };
        if hdr.kind.is_signed() {
            if let Err(e) = verifier.verify(&raw, &hdr, payload) {
                return (frames, Some(e));
            }
        } else {
            let _ = crate::handshake::decode_handshake_payload("fuzz", hdr.kind, payload);
        }
        frames += 1;
        buf = &buf[used..];
    }
    (frames, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyring::Secret;
    use proptest::prelude::*;

    fn key() -> FrameKey {
        FrameKey::new(&Secret::from_bytes([7; 32]))
    }

    fn frame(signer: &mut FrameSigner, payload: &[u8], reply_to: Option<u64>) -> Vec<u8> {
        let mut h = FrameHeader::new(FrameKind::Message, 3, payload.len() as u32);
        h.id = 9;
        h.reply_to = reply_to;
        let mut out = signer.seal(&mut h, payload).to_vec();
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn header_round_trip() {
        let mut h = FrameHeader::new(FrameKind::Message, 77, 5);
        h.seq = 3;
        h.id = 4;
        h.reply_to = Some(0);
        h.header_mac = [2; 16];
        h.mac = [1; 16];
        let b = h.encode();
        assert_eq!(FrameHeader::decode(&b, 10).unwrap(), h);
        h.bulk_at = Some(4095);
        assert_eq!(FrameHeader::decode(&h.encode(), 10).unwrap(), h);
    }

    #[test]
    fn bulk_at_is_bounded_and_needs_its_flag() {
        let h = FrameHeader::new(FrameKind::Message, 77, 5);
        let mut b = h.encode();
        b[14..16].copy_from_slice(&7u16.to_le_bytes());
        assert!(matches!(
            FrameHeader::decode(&b, 10),
            Err(FrameError::Reserved { .. })
        ));
        b[6] |= FLAG_BULK_AT;
        assert_eq!(FrameHeader::decode(&b, 10).unwrap().bulk_at, Some(7));
        b[14..16].copy_from_slice(&(BULK_ALIGN as u16).to_le_bytes());
        assert!(matches!(
            FrameHeader::decode(&b, 10),
            Err(FrameError::Reserved { .. })
        ));
    }

    #[test]
    fn oversize_refused_from_header() {
        let h = FrameHeader::new(FrameKind::Message, 1, u32::MAX);
        let err = FrameHeader::decode(&h.encode(), 1 << 20).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { len, .. } if len == u64::from(u32::MAX)));
        let h = FrameHeader::new(FrameKind::Hello, 1, (HANDSHAKE_MAX_BYTES + 1) as u32);
        assert!(FrameHeader::decode(&h.encode(), usize::MAX).is_err());
    }

    #[test]
    fn replay_reorder_tamper_detected() {
        let mut s = FrameSigner::new(key());
        let f0 = frame(&mut s, b"zero", None);
        let f1 = frame(&mut s, b"one", Some(5));
        let check = |stream: Vec<u8>| {
            let mut v = FrameVerifier::new(key());
            decode_stream(&stream, 1 << 20, &mut v)
        };
        assert_eq!(check([f0.clone(), f1.clone()].concat()), (2, None));
        let (n, e) = check([f0.clone(), f0.clone()].concat());
        assert_eq!(
            (n, e),
            (
                1,
                Some(FrameError::BadSequence {
                    got: 0,
                    expected: 1
                })
            )
        );
        let (n, e) = check([f1.clone(), f0.clone()].concat());
        assert_eq!(
            (n, e),
            (
                0,
                Some(FrameError::BadSequence {
                    got: 1,
                    expected: 0
                })
            )
        );
        let mut t = f1.clone();
        let last = t.len() - 1;
        t[last] ^= 0x40;
        let (n, e) = check([f0.clone(), t].concat());
        assert_eq!((n, e), (1, Some(FrameError::BadMac { seq: 1 })));
        let mut t = f0.clone();
        t[8] ^= 1; // msg_type
        assert!(matches!(check(t).1, Some(FrameError::BadHeaderMac { .. })));
        let mut t = f0.clone();
        t[FRAME_MAC_AT] ^= 1; // the frame MAC itself
        assert!(matches!(check(t).1, Some(FrameError::BadMac { .. })));
    }

    fn any_kind() -> impl Strategy<Value = FrameKind> {
        prop_oneof![
            Just(FrameKind::Hello),
            Just(FrameKind::ServerHello),
            Just(FrameKind::ClientProof),
            Just(FrameKind::AuthReject),
            Just(FrameKind::AuthOk),
            Just(FrameKind::Message),
            Just(FrameKind::Keepalive),
            Just(FrameKind::Close),
        ]
    }

    proptest! {
        #[test]
        fn header_encode_decode_round_trips(
            kind in any_kind(),
            msg_type in any::<u16>(),
            len in 0u32..=2048,
            seq in any::<u64>(),
            id in any::<u64>(),
            reply_to in proptest::option::of(any::<u64>()),
            bulk_at in proptest::option::of(0u16..BULK_ALIGN as u16),
            header_mac in any::<[u8; 16]>(),
            mac in any::<[u8; 16]>(),
        ) {
            let h = FrameHeader { kind, msg_type, payload_len: len, seq, id, reply_to, bulk_at, header_mac, mac };
            match FrameHeader::decode(&h.encode(), 4096) {
                Ok(back) => prop_assert_eq!(back, h),
                Err(FrameError::TooLarge { .. }) => {
                    prop_assert!(len as usize > kind.payload_limit(4096))
                }
                Err(e) => prop_assert!(false, "unexpected {}", e),
            }
        }

        #[test]
        fn signed_streams_verify_and_any_bit_flip_is_caught(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6),
            flip in any::<proptest::sample::Index>(),
            bit in 0u8..8,
        ) {
            let mut s = FrameSigner::new(key());
            let stream: Vec<u8> = bodies.iter().flat_map(|b| frame(&mut s, b, None)).collect();
            let mut v = FrameVerifier::new(key());
            prop_assert_eq!(decode_stream(&stream, 1 << 20, &mut v), (bodies.len(), None));
            let mut bad = stream.clone();
            let i = flip.index(bad.len());
            bad[i] ^= 1 << bit;
            let mut v = FrameVerifier::new(key());
            let (n, err) = decode_stream(&bad, 1 << 20, &mut v);
            prop_assert!(err.is_some() && n < bodies.len(), "flip at {} accepted", i);
        }

        #[test]
        fn crc_mode_streams_verify_and_any_bit_flip_is_caught(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6),
            flip in any::<proptest::sample::Index>(),
            bit in 0u8..8,
        ) {
            let crc = || FrameKey::with_mode(&Secret::from_bytes([7; 32]), crate::config::FrameMode::Crc);
            let mut s = FrameSigner::new(crc());
            let stream: Vec<u8> = bodies.iter().flat_map(|b| frame(&mut s, b, None)).collect();
            prop_assert_eq!(decode_stream(&stream, 1 << 20, &mut FrameVerifier::new(crc())), (bodies.len(), None));
            // A secure-mode receiver refuses crc frames.
            prop_assert!(decode_stream(&stream, 1 << 20, &mut FrameVerifier::new(key())).1.is_some());
            let mut bad = stream.clone();
            let i = flip.index(bad.len());
            bad[i] ^= 1 << bit;
            let (n, err) = decode_stream(&bad, 1 << 20, &mut FrameVerifier::new(crc()));
            prop_assert!(err.is_some() && n < bodies.len(), "flip at {} accepted", i);
        }

        #[test]
        fn garbage_headers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut v = FrameVerifier::new(key());
            let _ = decode_stream(&bytes, 1 << 16, &mut v);
        }
    }
}
