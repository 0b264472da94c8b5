//! `Peer` reconnects after the server restarts and gives up within its
//! timeout, naming the addresses, when nothing answers.

mod common;
use bytes::Bytes;
use cairn_msg::{Credentials, Listener, MsgError, Peer, Secret};
use common::*;
use std::time::{Duration, Instant};

#[tokio::test]
async fn peer_reconnects_after_server_restart() {
    let key = Secret::generate();
    let keys = Keys::with(&admin(), &key);
    let l = Listener::bind(any_port(), mon_a(), keys.clone(), fast_cfg())
        .await
        .unwrap();
    let addr = l.local_addr();
    let server = echo_server(l);
    let peer = Peer::new(
        vec![addr],
        Credentials::Key {
            name: admin(),
            secret: key,
        },
        Some(mon_a()),
        fast_cfg(),
    );
    let r = peer
        .call(1, Bytes::from_static(b"a"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(&r.payload[..], b"a");
    let first = peer.current().await.unwrap();

    // Kill the server (listener and connections), bring it back a bit later.
    server.abort();
    let _ = server.await;
    let restart = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let l = Listener::bind(addr, mon_a(), keys, fast_cfg())
            .await
            .unwrap();
        // Keep serving until the test ends.
        echo_server(l).await.ok();
    });
    let t = Instant::now();
    let r = peer
        .call(2, Bytes::from_static(b"b"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(&r.payload[..], b"b");
    eprintln!("reconnected after {:?}", t.elapsed());
    assert!(first.is_closed());
    restart.abort();
}

#[tokio::test]
async fn peer_fails_over_to_the_next_address() {
    let key = Secret::generate();
    let dead: std::net::SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let l = Listener::bind(any_port(), mon_a(), Keys::with(&admin(), &key), fast_cfg())
        .await
        .unwrap();
    let good = l.local_addr();
    let _server = echo_server(l);
    let peer = Peer::new(
        vec![dead, good],
        Credentials::Key {
            name: admin(),
            secret: key,
        },
        None,
        fast_cfg(),
    );
    peer.call(1, Bytes::new(), Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test]
async fn peer_gives_up_within_its_timeout() {
    let dead: std::net::SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let peer = Peer::new(
        vec![dead],
        Credentials::Key {
            name: admin(),
            secret: Secret::generate(),
        },
        None,
        fast_cfg(),
    );
    let t = Instant::now();
    let err = peer
        .call(1, Bytes::new(), Duration::from_millis(600))
        .await
        .unwrap_err();
    let took = t.elapsed();
    let text = err.to_string();
    assert!(matches!(err, MsgError::Timeout { .. }), "{text}");
    assert!(
        text.contains(&dead.to_string()) && text.contains("last error"),
        "{text}"
    );
    assert!(took < Duration::from_millis(2000), "{took:?}");
}

#[tokio::test]
async fn peer_does_not_retry_auth_failures() {
    let l = Listener::bind(
        any_port(),
        mon_a(),
        Keys::with(&admin(), &Secret::generate()),
        fast_cfg(),
    )
    .await
    .unwrap();
    let peer = Peer::new(
        vec![l.local_addr()],
        Credentials::Key {
            name: admin(),
            secret: Secret::generate(),
        },
        None,
        fast_cfg(),
    );
    let t = Instant::now();
    let err = peer
        .call(1, Bytes::new(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, MsgError::AuthFailed { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2));
}
