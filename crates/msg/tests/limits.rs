//! Size and in-flight bounds: backpressure from a slow reader, oversize
//! frames refused from their header.

mod common;
use bytes::Bytes;
use cairn_msg::{connect, Credentials, Listener, MsgConfig, MsgError, Secret};
use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn slow_reader_makes_the_sender_wait_with_bounded_memory() {
    let window = 2 << 20;
    let cfg = MsgConfig {
        max_inflight_bytes: window,
        send_timeout: Duration::from_millis(500),
        ..fast_cfg()
    };
    let key = Secret::generate();
    let l = Listener::bind(any_port(), mon_a(), Keys::with(&admin(), &key), cfg.clone())
        .await
        .unwrap();
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
    let client = connect(l.local_addr(), &creds, None, &cfg).await.unwrap();
    let server = l.accept().await.unwrap();
    let msg = payload(1 << 20, 9);
    let mut accepted = 0usize;
    let err = loop {
        match client.send(1, msg.clone()).await {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted < 64, "sender never blocked: unbounded buffering");
    };
    let text = err.to_string();
    assert!(matches!(err, MsgError::Timeout { .. }), "{text}");
    assert!(
        text.contains("max_inflight_bytes") && text.contains("mon.a"),
        "{text}"
    );
    // Bounded: sender window + receiver queue + kernel socket buffers.
    eprintln!("sender accepted {accepted} x 1 MiB before waiting");
    assert!(accepted >= 2, "{accepted}");
    assert!(
        accepted <= 2 + 2 + 16,
        "{accepted} MiB in flight is more than the bounds allow"
    );
    // The connection is intact: draining delivers everything, then sending resumes.
    for _ in 0..accepted {
        let m = server.recv_timeout(Duration::from_secs(5)).await.unwrap();
        assert_eq!(m.payload.len(), 1 << 20);
    }
    client.send(2, Bytes::from_static(b"after")).await.unwrap();
    let m = server.recv_timeout(Duration::from_secs(5)).await.unwrap();
    assert_eq!(&m.payload[..], b"after");
}

#[tokio::test]
async fn oversize_message_refused_locally_and_by_the_receiver() {
    let small = MsgConfig {
        max_message_bytes: 1 << 20,
        ..fast_cfg()
    };
    let key = Secret::generate();
    let l = Listener::bind(
        any_port(),
        mon_a(),
        Keys::with(&admin(), &key),
        small.clone(),
    )
    .await
    .unwrap();
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
    // Local refusal: nothing is sent.
    let c_small = connect(l.local_addr(), &creds, None, &small).await.unwrap();
    let err = c_small
        .send(1, payload((1 << 20) + 1, 0))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            MsgError::TooLarge {
                direction: "to",
                ..
            }
        ),
        "{err}"
    );
    assert!(!c_small.is_closed());
    let _s1 = l.accept().await.unwrap();

    // Remote refusal: a client with a bigger limit sends 2 MiB.
    let c_big = connect(l.local_addr(), &creds, None, &fast_cfg())
        .await
        .unwrap();
    let s2 = l.accept().await.unwrap();
    c_big.send(1, payload(2 << 20, 0)).await.unwrap();
    let err = s2.recv_timeout(Duration::from_secs(5)).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            MsgError::TooLarge {
                direction: "from",
                ..
            }
        ),
        "{text}"
    );
    assert!(
        text.contains("client.admin") && text.contains("max_message_bytes"),
        "{text}"
    );
}

#[tokio::test]
async fn oversize_handshake_header_is_refused_at_once() {
    let l = Listener::bind(
        any_port(),
        mon_a(),
        Keys::with(&admin(), &Secret::generate()),
        MsgConfig {
            handshake_timeout: Duration::from_secs(10),
            ..fast_cfg()
        },
    )
    .await
    .unwrap();
    let mut raw = tokio::net::TcpStream::connect(l.local_addr())
        .await
        .unwrap();
    let h = cairn_msg::frame::FrameHeader::new(cairn_msg::frame::FrameKind::Hello, 0, 0xffff_fff0);
    raw.write_all(&h.encode()).await.unwrap();
    // The server hangs up from the header alone, long before its 10 s
    // handshake timeout, without waiting for (or allocating) 4 GiB.
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(2), raw.read(&mut buf))
        .await
        .expect("server should refuse the oversize header at once")
        .unwrap_or(0);
    assert_eq!(n, 0);
}
