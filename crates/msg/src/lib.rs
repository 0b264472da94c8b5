//! cairn-msg: the wire between every Cairn daemon and client. Framed,
//! versioned messages over TCP with mutual challenge–response
//! authentication, per-frame MAC signing (keyed BLAKE3; or, in crc mode,
//! a header MAC and a payload crc32c) with sequence numbers,
//! keepalives, bounded message sizes and in-flight bytes (backpressure), and
//! a reconnecting `Peer`. It does not interpret message payloads or caps.
//!
//! See `README.md` in this crate for the wire format and the handshake.

pub mod auth;
mod blocks;
pub mod bufpool;
pub mod config;
mod conn;
mod error;
pub mod frame;
mod handshake;
mod io;
pub mod keyring;
mod peer;

pub use auth::{issue_ticket, unseal_ticket, Credentials, KeyServer, Ticket, TicketContents};
pub use blocks::{crc_from_blocks, BlockCrcs};
pub use config::{
    AcceptModes, FrameMode, FrameModes, MsgConfig, DEFAULT_CLIENT_MODES, DEFAULT_CLUSTER_MODES,
    DEFAULT_SERVICE_MODES,
};
pub use conn::{connect, Connection, KnownCrc, Listener, Message};
pub use error::MsgError;
pub use keyring::{Keyring, KeyringEntry, Secret};
pub use peer::Peer;

/// Decodes `data` as a stream of frames as a receiver would (header checks,
/// size limits, MAC and sequence verification with a fixed test key,
/// handshake payload decoding) and returns how many frames were accepted.
/// Never panics and never allocates more than `data.len()`; this is the
/// entry point of the fuzz target and of the random-bytes test.
pub fn fuzz_decode(data: &[u8]) -> usize {
    let key = auth::FrameKey::new(&Secret::from_bytes([0x5a; keyring::SECRET_LEN]));
    let mut v = frame::FrameVerifier::new(key);
    frame::decode_stream(data, 1 << 20, &mut v).0
}

/// A frame signer under the same fixed key as [`fuzz_decode`], so tests and
/// the fuzzer can build valid frames to mutate.
pub fn fuzz_signer() -> frame::FrameSigner {
    frame::FrameSigner::new(auth::FrameKey::new(&Secret::from_bytes(
        [0x5a; keyring::SECRET_LEN],
    )))
}

/// Valid example frames (one per handshake kind, plus a signed stream under
/// the [`fuzz_signer`] key) to seed the fuzzer and mutation tests.
pub fn fuzz_samples() -> Vec<Vec<u8>> {
    let mut out = handshake::sample_frames();
    let mut signer = fuzz_signer();
    let mut stream = Vec::new();
    for (i, body) in [&b""[..], b"hello", &[0u8; 300]].iter().enumerate() {
        let mut h = frame::FrameHeader::new(frame::FrameKind::Message, 7, body.len() as u32);
        h.id = i as u64 + 1;
        h.reply_to = if i == 1 { Some(1) } else { None };
        stream.extend_from_slice(&signer.seal(&mut h, body));
        stream.extend_from_slice(body);
    }
    let mut h = frame::FrameHeader::new(frame::FrameKind::Keepalive, 0, 0);
    stream.extend_from_slice(&signer.seal(&mut h, &[]));
    out.push(stream);
    out
}
