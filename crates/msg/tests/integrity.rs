//! Replayed, reordered and tampered frames are rejected (through a proxy that
//! mangles the stream), and keepalives detect a silent peer.

mod common;
use bytes::Bytes;
use cairn_msg::{connect, Credentials, Listener, MsgError, Secret};
use common::*;
use std::time::{Duration, Instant};

/// Sends 6 one-way messages through a mangling proxy; returns what the server
/// received before the error, and the error.
async fn run(mangle: Mangle) -> (Vec<u16>, MsgError) {
    let key = Secret::generate();
    let l = Listener::bind(any_port(), mon_a(), Keys::with(&admin(), &key), fast_cfg())
        .await
        .unwrap();
    let (paddr, _proxy) = proxy(l.local_addr(), mangle).await;
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
    let client = connect(paddr, &creds, Some(&mon_a()), &fast_cfg())
        .await
        .unwrap();
    let server = l.accept().await.unwrap();
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
    let key = Secret::generate();
    let l = Listener::bind(any_port(), mon_a(), Keys::with(&admin(), &key), fast_cfg())
        .await
        .unwrap();
    let (paddr, _proxy) = proxy(l.local_addr(), Mangle::None).await;
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
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
