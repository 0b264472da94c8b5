//! Replayed, reordered and tampered frames are rejected (through a proxy that
//! mangles the stream), and keepalives detect a silent peer.

mod common;
use bytes::Bytes;
use cairn_msg::{
    connect, AcceptModes, Credentials, FrameMode, Listener, MsgConfig, MsgError, Secret,
};
use common::*;
use std::time::{Duration, Instant};

/// Sends 6 one-way messages through a mangling proxy; returns what the server
/// received before the error, and the error.
async fn run(mangle: Mangle) -> (Vec<u16>, MsgError) {
    run_in(mangle, FrameMode::Secure).await
}

/// Both ends configured for `mode`.
fn cfg_in(mode: FrameMode) -> MsgConfig {
    MsgConfig {
        modes: mode.into(),
        accept: AcceptModes::all(mode.into()),
        ..fast_cfg()
    }
}

/// [`run`] on a connection negotiated in `mode`.
async fn run_in(mangle: Mangle, mode: FrameMode) -> (Vec<u16>, MsgError) {
    let key = Secret::generate();
    let l = Listener::bind(
        any_port(),
        mon_a(),
        Keys::with(&admin(), &key),
        cfg_in(mode),
    )
    .await
    .unwrap();
    let (paddr, _proxy) = proxy(l.local_addr(), mangle).await;
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
    let client = connect(paddr, &creds, Some(&mon_a()), &cfg_in(mode))
        .await
        .unwrap();
    let server = l.accept().await.unwrap();
    assert_eq!((client.mode(), server.mode()), (mode, mode));
    for i in 0..6u16 {
        // The connection may already be closed by the server at the end.
        let _ = client.send(i, payload(100 + i as usize, i as u8)).await;
    }
    let mut got = Vec::new();
    loop {
        match server.recv_timeout(Duration::from_secs(5)).await {
            Ok(m) => {
                assert_eq!(
                    m.payload,
                    payload(100 + m.msg_type as usize, m.msg_type as u8)
                );
                got.push(m.msg_type);
            }
            Err(e) => return (got, e),
        }
    }
}

fn assert_integrity(err: &MsgError, needle: &str) {
    let text = err.to_string();
    assert!(matches!(err, MsgError::Integrity { .. }), "{text}");
    assert!(
        text.contains("client.admin"),
        "error must name the peer: {text}"
    );
    assert!(text.contains(needle), "{text}");
}

#[tokio::test]
async fn clean_proxy_passes_everything() {
    let (l, creds) = admin_listener(fast_cfg()).await;
    let (paddr, _proxy) = proxy(l.local_addr(), Mangle::None).await;
    let client = connect(paddr, &creds, None, &fast_cfg()).await.unwrap();
    let server = l.accept().await.unwrap();
    for i in 0..6u16 {
        client.send(i, payload(10, 1)).await.unwrap();
    }
    for i in 0..6u16 {
        assert_eq!(
            server
                .recv_timeout(Duration::from_secs(5))
                .await
                .unwrap()
                .msg_type,
            i
        );
    }
}

#[tokio::test]
async fn replayed_frame_is_rejected() {
    let (got, err) = run(Mangle::Duplicate(2)).await;
    assert_eq!(got, vec![0, 1, 2]);
    assert_integrity(&err, "replayed");
}

#[tokio::test]
async fn reordered_frames_are_rejected() {
    let (got, err) = run(Mangle::Swap(2)).await;
    assert_eq!(got, vec![0, 1]);
    assert_integrity(&err, "expected");
}

#[tokio::test]
async fn tampered_frame_is_rejected() {
    let (got, err) = run(Mangle::Flip(3)).await;
    assert_eq!(got, vec![0, 1, 2]);
    assert_integrity(&err, "MAC");
}

#[tokio::test]
async fn crc_mode_detects_a_corrupted_payload() {
    let (got, err) = run_in(Mangle::Flip(3), FrameMode::Crc).await;
    assert_eq!(got, vec![0, 1, 2]);
    assert_integrity(&err, "crc32c");
}

#[tokio::test]
async fn crc_mode_still_authenticates_headers() {
    // The header MAC stays in crc mode: replays, reorders and forged
    // lengths are refused as in secure mode.
    let (got, err) = run_in(Mangle::Duplicate(2), FrameMode::Crc).await;
    assert_eq!(got, vec![0, 1, 2]);
    assert_integrity(&err, "replayed");
    let (got, err) = run_in(Mangle::Swap(1), FrameMode::Crc).await;
    assert_eq!(got, vec![0]);
    assert_integrity(&err, "expected");
    let (got, err) = run_in(Mangle::ForgeLength(2), FrameMode::Crc).await;
    assert_eq!(got, vec![0, 1]);
    assert_integrity(&err, "header");
}

/// Bulk messages (a small head, a 256 KiB data segment, a short tail)
/// through a proxy that flips one payload byte at `flip` in the second
/// one, on crc-mode connections whose receiver computes block crcs.
/// Returns the messages received and the error, if any.
async fn run_bulk(flip: Option<usize>) -> (Vec<cairn_msg::Message>, Option<MsgError>) {
    let key = Secret::generate();
    let cfg = MsgConfig {
        recv_block_crcs: true,
        ..cfg_in(FrameMode::Crc)
    };
    let l = Listener::bind(any_port(), mon_a(), Keys::with(&admin(), &key), cfg.clone())
        .await
        .unwrap();
    let mangle = flip.map_or(Mangle::None, |at| Mangle::FlipAt(1, at));
    let (paddr, _proxy) = proxy(l.local_addr(), mangle).await;
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
    let client = connect(paddr, &creds, Some(&mon_a()), &cfg).await.unwrap();
    let server = l.accept().await.unwrap();
    for i in 0..3u16 {
        let parts = vec![payload(10, 7), payload(256 << 10, i as u8), payload(3, 9)];
        let _ = client.send_parts(i, parts).await;
    }
    let mut got = Vec::new();
    while got.len() < 3 {
        match server.recv_timeout(Duration::from_secs(5)).await {
            Ok(m) => got.push(m),
            Err(e) => return (got, Some(e)),
        }
    }
    (got, None)
}

#[tokio::test]
async fn block_crcs_of_a_bulk_segment_are_verified_and_delivered() {
    let (got, err) = run_bulk(None).await;
    assert!(err.is_none(), "{err:?}");
    for (i, m) in got.iter().enumerate() {
        let data = m.payload.slice(10..10 + (256 << 10));
        assert_eq!(data, payload(256 << 10, i as u8));
        let blocks = m.blocks.as_ref().expect("block crcs delivered");
        let want: Vec<u32> = data.chunks(4096).map(crc32c::crc32c).collect();
        assert_eq!(blocks.of(&data), Some(&want[..]));
        assert_eq!(blocks.crc_of(&data), Some(crc32c::crc32c(&data)));
        // The data segment sits on a 4 KiB boundary of the receive buffer.
        assert_eq!(data.as_ptr() as usize % 4096, 0);
    }
}

#[tokio::test]
async fn block_checked_frames_still_refuse_any_flipped_byte() {
    // In the head, in the first, a middle and the last whole block, and
    // in the short tail.
    for at in [
        3,
        10,
        10 + 4096 * 17 + 123,
        10 + (256 << 10) - 1,
        10 + (256 << 10) + 1,
    ] {
        let (got, err) = run_bulk(Some(at)).await;
        assert_eq!(got.len(), 1, "flip at {at}");
        let err = err.expect("the corrupted frame is refused");
        assert_integrity(&err, "crc32c");
    }
}

#[tokio::test]
async fn keepalive_timeout_detects_a_silent_peer() {
    let key = Secret::generate();
    let l = Listener::bind(
        any_port(),
        mon_a(),
        Keys::with(&admin(), &key),
        keepalive_cfg(),
    )
    .await
    .unwrap();
    let (paddr, _proxy) = proxy(l.local_addr(), Mangle::SilenceServer).await;
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
    let client = connect(paddr, &creds, None, &keepalive_cfg())
        .await
        .unwrap();
    let _server = l.accept().await.unwrap();
    let t = Instant::now();
    let err = client
        .recv_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MsgError::Timeout { .. }), "{text}");
    assert!(
        text.contains("mon.a") && text.contains("keepalive"),
        "{text}"
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // Calls fail with the same cause.
    let err = client
        .call(1, Bytes::new(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("keepalive"), "{err}");
}

#[tokio::test]
async fn idle_connection_stays_up_thanks_to_keepalives() {
    let key = Secret::generate();
    let l = Listener::bind(
        any_port(),
        mon_a(),
        Keys::with(&admin(), &key),
        keepalive_cfg(),
    )
    .await
    .unwrap();
    let addr = l.local_addr();
    let _server = echo_server(l);
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
    let client = connect(addr, &creds, None, &keepalive_cfg()).await.unwrap();
    // Idle for twice the keepalive timeout.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(!client.is_closed(), "{:?}", client.closed_reason());
    client
        .call(1, Bytes::new(), Duration::from_secs(2))
        .await
        .unwrap();
}

/// Records the client's handshake (Hello + ClientProof) through a proxy and
/// replays it on a fresh connection: the server's new nonce makes the old
/// proof worthless, so nothing is accepted.
#[tokio::test]
async fn replayed_handshake_is_refused() {
    use cairn_msg::frame::{FrameHeader, FrameKind, HEADER_LEN};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    let (l, creds) = admin_listener(fast_cfg()).await;
    let target = l.local_addr();
    // Recording proxy: forwards both ways, keeps the client's unsigned frames.
    let rec = TcpListener::bind(any_port()).await.unwrap();
    let rec_addr = rec.local_addr().unwrap();
    let recorder = tokio::spawn(async move {
        let (client, _) = rec.accept().await.unwrap();
        let server = TcpStream::connect(target).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
        });
        let mut recorded = Vec::new();
        loop {
            let mut h = [0u8; HEADER_LEN];
            if cr.read_exact(&mut h).await.is_err() {
                break;
            }
            let hdr = FrameHeader::decode(&h, usize::MAX).unwrap();
            let mut p = vec![0u8; hdr.payload_len as usize];
            cr.read_exact(&mut p).await.unwrap();
            sw.write_all(&h).await.unwrap();
            sw.write_all(&p).await.unwrap();
            if !hdr.kind.is_signed() {
                recorded.extend_from_slice(&h);
                recorded.extend_from_slice(&p);
            }
            if hdr.kind == FrameKind::ClientProof {
                break;
            }
        }
        // Keep forwarding so the recorded session completes normally.
        let _ = tokio::io::copy(&mut cr, &mut sw).await;
        recorded
    });
    let client = connect(rec_addr, &creds, None, &fast_cfg()).await.unwrap();
    let _first = l.accept().await.unwrap();
    client.close();
    let recorded = recorder.await.unwrap();
    assert!(recorded.len() > 2 * HEADER_LEN);

    // Replay it verbatim.
    let mut raw = TcpStream::connect(target).await.unwrap();
    raw.write_all(&recorded).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), raw.read_to_end(&mut answer)).await;
    // The server answered with a fresh ServerHello, then refused.
    let first = FrameHeader::decode(&answer[..HEADER_LEN].try_into().unwrap(), 0).unwrap();
    assert_eq!(first.kind, FrameKind::ServerHello);
    let second_at = HEADER_LEN + first.payload_len as usize;
    let second = FrameHeader::decode(
        &answer[second_at..second_at + HEADER_LEN]
            .try_into()
            .unwrap(),
        0,
    )
    .unwrap();
    assert_eq!(second.kind, FrameKind::AuthReject);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), l.accept())
            .await
            .is_err(),
        "a replayed handshake must not produce a connection"
    );
}
