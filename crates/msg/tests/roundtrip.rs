//! Round trips on loopback: small and 64 MiB payloads, one-way messages, many
//! concurrent calls on one connection, close semantics.

mod common;
use bytes::Bytes;
use cairn_msg::{connect, Credentials, Listener, MsgError, Secret};
use common::*;
use std::time::{Duration, Instant};

async fn setup() -> (cairn_msg::Connection, tokio::task::JoinHandle<()>) {
    let (l, creds) = admin_listener(fast_cfg()).await;
    let addr = l.local_addr();
    let server = echo_server(l);
    let conn = connect(addr, &creds, Some(&mon_a()), &fast_cfg())
        .await
        .unwrap();
    (conn, server)
}

#[tokio::test]
async fn small_and_64mib_round_trips() {
    let big = payload(64 << 20, 3);
    let (conn, _server) = setup().await;
    assert_eq!(conn.peer(), &mon_a());
    assert_eq!(conn.peer_caps(), None);
    let r = conn
        .call(7, Bytes::from_static(b"hello"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(r.msg_type, 8);
    assert_eq!(&r.payload[..], b"hello");
    assert!(r.reply_to.is_some());
    let r = conn
        .call(1, Bytes::new(), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(r.payload.is_empty());

    let t = Instant::now();
    let r = conn
        .call(9, big.clone(), Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(r.payload.len(), big.len());
    assert!(r.payload == big, "64 MiB payload corrupted");
    eprintln!("64 MiB round trip took {:?}", t.elapsed());
}

#[tokio::test]
async fn one_way_messages_arrive_in_order() {
    let (l, creds) = admin_listener(fast_cfg()).await;
    let client = connect(l.local_addr(), &creds, None, &fast_cfg())
        .await
        .unwrap();
    let server = l.accept().await.unwrap();
    assert_eq!(server.peer(), &admin());
    for i in 0..100u16 {
        client
            .send(i, payload(i as usize * 10, i as u8))
            .await
            .unwrap();
    }
    for i in 0..100u16 {
        let m = server.recv_timeout(Duration::from_secs(5)).await.unwrap();
        assert_eq!(m.msg_type, i);
        assert_eq!(m.payload, payload(i as usize * 10, i as u8));
        assert_eq!(m.reply_to, None);
    }
    // The server may also call the client.
    let c2 = client.clone();
    tokio::spawn(async move { serve_echo(c2).await });
    let r = server
        .call(40, Bytes::from_static(b"ping"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((r.msg_type, &r.payload[..]), (41, &b"ping"[..]));
}

#[tokio::test]
async fn many_concurrent_calls_on_one_connection() {
    let (conn, _server) = setup().await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..2000u32 {
        let c = conn.clone();
        set.spawn(async move {
            let p = Bytes::from(i.to_le_bytes().repeat((i % 64) as usize + 1));
            let r = c
                .call(100, p.clone(), Duration::from_secs(20))
                .await
                .unwrap();
            assert_eq!(r.payload, p, "reply routed to the wrong caller");
        });
    }
    let mut n = 0;
    while let Some(r) = set.join_next().await {
        r.unwrap();
        n += 1;
    }
    assert_eq!(n, 2000);
}

#[tokio::test]
async fn close_fails_pending_and_future_calls_and_tells_the_peer() {
    let (l, creds) = admin_listener(fast_cfg()).await;
    let client = connect(l.local_addr(), &creds, None, &fast_cfg())
        .await
        .unwrap();
    let server = l.accept().await.unwrap();
    // A call nobody answers, then close.
    let c = client.clone();
    let pending =
        tokio::spawn(async move { c.call(1, Bytes::new(), Duration::from_secs(10)).await });
    let _ = server.recv_timeout(Duration::from_secs(5)).await.unwrap();
    client.close();
    let err = pending.await.unwrap().unwrap_err();
    assert!(matches!(err, MsgError::Closed { .. }), "{err}");
    let err = client.send(1, Bytes::new()).await.unwrap_err();
    assert!(err.to_string().contains("mon.a"), "{err}");
    let err = server
        .recv_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MsgError::Closed { reason, .. } if reason.contains("peer closed")),
        "{err}"
    );
    assert!(err.to_string().contains("client.admin"), "{err}");
}

#[tokio::test]
async fn call_timeout_names_peer_and_what() {
    let (l, creds) = admin_listener(fast_cfg()).await;
    let client = connect(l.local_addr(), &creds, None, &fast_cfg())
        .await
        .unwrap();
    let _server = l.accept().await.unwrap(); // never answers
    let err = client
        .call(5, Bytes::new(), Duration::from_millis(200))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MsgError::Timeout { .. }), "{text}");
    assert!(text.contains("mon.a") && text.contains("reply"), "{text}");
}

#[tokio::test]
async fn many_clients_on_one_listener() {
    let keys = Keys::default();
    let mut creds = Vec::new();
    for i in 0..20 {
        let name = cairn_types::EntityName::client(&format!("c{i}"));
        let s = Secret::generate();
        keys.secrets.lock().unwrap().insert(name.clone(), s.clone());
        creds.push(Credentials::Key { name, secret: s });
    }
    let l = Listener::bind(any_port(), mon_a(), std::sync::Arc::new(keys), fast_cfg())
        .await
        .unwrap();
    let addr = l.local_addr();
    let _server = echo_server(l);
    let mut set = tokio::task::JoinSet::new();
    for c in creds {
        set.spawn(async move {
            let conn = connect(addr, &c, Some(&mon_a()), &fast_cfg())
                .await
                .unwrap();
            let me = c.name().to_string();
            for _ in 0..10 {
                let r = conn
                    .call(3, Bytes::from(me.clone()), Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(r.payload, Bytes::from(me.clone()));
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
}

#[tokio::test]
async fn dropping_the_last_handle_closes_and_tells_the_peer() {
    let (l, creds) = admin_listener(fast_cfg()).await;
    let client = connect(l.local_addr(), &creds, None, &fast_cfg())
        .await
        .unwrap();
    let server = l.accept().await.unwrap();
    let extra = client.clone();
    drop(client);
    assert!(!extra.is_closed(), "a clone keeps the connection open");
    drop(extra);
    let err = server
        .recv_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MsgError::Closed { reason, .. } if reason.contains("last handle was dropped")),
        "{err}"
    );
}

#[tokio::test]
async fn segmented_payloads_arrive_as_one_and_verify() {
    let (conn, _server) = setup().await;
    let big = payload(5 << 20, 9);
    let parts = vec![
        Bytes::from_static(b"head"),
        Bytes::new(),
        big.clone(),
        Bytes::from_static(b"tail"),
    ];
    let want: Vec<u8> = parts.concat();
    // A big call (MAC on the blocking pool) and a small one, each sent as
    // segments; the echo server answers with the joined payload.
    let r = conn
        .call_parts(3, parts, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(r.payload[..] == want[..], "segmented payload corrupted");
    let r = conn
        .call_parts(
            3,
            vec![Bytes::from_static(b"a"), Bytes::from_static(b"bc")],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(&r.payload[..], b"abc");
    conn.send_parts(5, vec![Bytes::from_static(b"x"), big])
        .await
        .unwrap();
    // The connection is still healthy after a one-way segmented message.
    let r = conn
        .call(1, Bytes::from_static(b"ok"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(&r.payload[..], b"ok");
}

/// A connection opened from a short-lived current-thread runtime: while
/// that runtime is alive but not driven, callers on another runtime are
/// told it is not driven there (`is_driven_here`); when it shuts down the
/// connection closes at once, naming the cause, and a call on it fails at
/// once instead of waiting for its timeout. A connection opened from a
/// multi-thread runtime serves callers of any runtime.
#[test]
fn connections_follow_the_runtime_that_runs_their_io() {
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
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
    let temp = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = temp
        .block_on(connect(addr, &creds, None, &fast_cfg()))
        .unwrap();
    temp.block_on(async {
        assert!(conn.is_driven_here());
        let r = conn.call(4, payload(10, 4), Duration::from_secs(5)).await;
        assert_eq!(r.unwrap().payload, payload(10, 4));
    });
    main.block_on(async { assert!(!conn.is_driven_here()) });
    drop(temp);
    assert!(conn.is_closed());
    let why = conn.closed_reason().unwrap().to_string();
    assert!(
        why.contains("runtime") && why.contains("shut down"),
        "{why}"
    );
    let t0 = Instant::now();
    let err = main
        .block_on(conn.call(4, payload(10, 4), Duration::from_secs(30)))
        .unwrap_err();
    assert!(matches!(err, MsgError::Closed { .. }), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());

    // Opened on the multi-thread runtime: usable from a current-thread one.
    let shared = main
        .block_on(connect(addr, &creds, None, &fast_cfg()))
        .unwrap();
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    other.block_on(async {
        assert!(shared.is_driven_here());
        let r = shared.call(6, payload(10, 6), Duration::from_secs(5)).await;
        assert_eq!(r.unwrap().payload, payload(10, 6));
    });
}

/// A bulk segment sent with `send_parts` behind a small, odd-sized header
/// segment arrives at a 4096-aligned address inside the received payload
/// (so a store can write it with O_DIRECT as it is); small messages are
/// unaffected.
#[tokio::test]
async fn bulk_segments_arrive_aligned() {
    let (l, creds) = admin_listener(fast_cfg()).await;
    let client = connect(l.local_addr(), &creds, None, &fast_cfg())
        .await
        .unwrap();
    let server = l.accept().await.unwrap();
    for (head, bulk) in [
        (37usize, 4 << 20),
        (1, 64 << 10),
        (4096, 1 << 20),
        (5000, 300_000),
    ] {
        let parts = vec![payload(head, 1), payload(bulk, 2), payload(11, 3)];
        let whole: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        client.send_parts(5, parts).await.unwrap();
        let m = server.recv_timeout(Duration::from_secs(10)).await.unwrap();
        assert_eq!(&m.payload[..], &whole[..]);
        let at = m.payload[head..].as_ptr() as usize;
        assert_eq!(
            at % 4096,
            0,
            "bulk segment after {head} bytes is not aligned"
        );
    }
    client.send(6, payload(100, 4)).await.unwrap();
    let m = server.recv_timeout(Duration::from_secs(5)).await.unwrap();
    assert_eq!(m.payload, payload(100, 4));
}
