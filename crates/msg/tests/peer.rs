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

/// A `Peer` first used from a current-thread runtime that is then kept
/// alive but no longer driven: a call from another runtime does not wait
/// on the stalled connection; it opens one of its own and answers at once.
#[test]
fn peer_used_from_another_runtime_does_not_stall() {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let key = Secret::generate();
    let addr = main.block_on(async {
        let l = Listener::bind(any_port(), mon_a(), Keys::with(&admin(), &key), fast_cfg())
            .await
            .unwrap();
        let addr = l.local_addr();
        echo_server(l);
        addr
    });
    let peer = Peer::new(
        vec![addr],
        Credentials::Key {
            name: admin(),
            secret: key,
        },
        Some(mon_a()),
        fast_cfg(),
    );
    let temp = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let r = temp.block_on(peer.call(2, Bytes::from_static(b"a"), Duration::from_secs(5)));
    assert_eq!(&r.unwrap().payload[..], b"a");
    // `temp` stays alive, idle.
    let t0 = std::time::Instant::now();
    let r = main.block_on(peer.call(2, Bytes::from_static(b"b"), Duration::from_secs(20)));
    assert_eq!(&r.unwrap().payload[..], b"b");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "the call waited {:?}",
        t0.elapsed()
    );
    drop(temp);
}
