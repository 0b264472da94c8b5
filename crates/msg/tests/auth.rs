//! Mutual authentication: wrong keys, unknown entities, servers that do not
//! know the key, expected-peer checks, tickets and their generations.

mod common;
use bytes::Bytes;
use cairn_msg::{
    connect, issue_ticket, AcceptModes, Credentials, FrameMode, FrameModes, Listener, MsgConfig,
    MsgError, Secret,
};
use cairn_types::EntityName;
use common::*;
use std::time::Duration;

fn key_creds(name: EntityName, secret: Secret) -> Credentials {
    Credentials::Key { name, secret }
}

#[tokio::test]
async fn wrong_key_is_refused_and_nothing_is_delivered() {
    let good = Secret::generate();
    let l = Listener::bind(any_port(), mon_a(), Keys::with(&admin(), &good), fast_cfg())
        .await
        .unwrap();
    let addr = l.local_addr();
    let err = connect(
        addr,
        &key_creds(admin(), Secret::generate()),
        None,
        &fast_cfg(),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MsgError::AuthFailed { .. }), "{text}");
    assert!(
        text.contains("client.admin") && text.contains("mon.a"),
        "{text}"
    );
    // The listener delivered nothing and keeps working for good clients.
    assert!(tokio::time::timeout(Duration::from_millis(300), l.accept())
        .await
        .is_err());
    let c = connect(addr, &key_creds(admin(), good), None, &fast_cfg())
        .await
        .unwrap();
    let s = l.accept().await.unwrap();
    c.send(1, Bytes::from_static(b"ok")).await.unwrap();
    assert_eq!(
        &s.recv_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .payload[..],
        b"ok"
    );
}

#[tokio::test]
async fn unknown_entity_is_refused_with_reason() {
    let l = Listener::bind(
        any_port(),
        mon_a(),
        Keys::with(&admin(), &Secret::generate()),
        fast_cfg(),
    )
    .await
    .unwrap();
    let err = connect(
        l.local_addr(),
        &key_creds(EntityName::client("stranger"), Secret::generate()),
        None,
        &fast_cfg(),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MsgError::AuthFailed { .. }), "{text}");
    assert!(
        text.contains("does not know the entity client.stranger"),
        "{text}"
    );
}

#[tokio::test]
async fn server_without_the_key_is_detected_by_the_client() {
    // An impostor "mon.a" that holds some other secret for client.admin.
    let real = Secret::generate();
    let l = Listener::bind(
        any_port(),
        mon_a(),
        Keys::with(&admin(), &Secret::generate()),
        fast_cfg(),
    )
    .await
    .unwrap();
    let err = connect(
        l.local_addr(),
        &key_creds(admin(), real),
        Some(&mon_a()),
        &fast_cfg(),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MsgError::AuthFailed { .. }), "{text}");
    assert!(text.contains("server's proof does not verify"), "{text}");
    assert!(tokio::time::timeout(Duration::from_millis(200), l.accept())
        .await
        .is_err());
}

#[tokio::test]
async fn unexpected_server_name_is_refused() {
    let key = Secret::generate();
    let l = Listener::bind(
        any_port(),
        EntityName::osd(4),
        Keys::with(&admin(), &key),
        fast_cfg(),
    )
    .await
    .unwrap();
    let err = connect(
        l.local_addr(),
        &key_creds(admin(), key),
        Some(&mon_a()),
        &fast_cfg(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, MsgError::AuthFailed { reason, .. } if reason.contains("calls itself osd.4")),
        "{err}"
    );
}

#[tokio::test]
async fn tickets_work_with_known_generation_only() {
    let keys = Keys::with(&admin(), &Secret::generate());
    let service_g3 = Secret::generate();
    keys.services.lock().unwrap().insert(3, service_g3.clone());
    let l = Listener::bind(any_port(), EntityName::osd(2), keys.clone(), fast_cfg())
        .await
        .unwrap();
    let addr = l.local_addr();
    let me = EntityName::osd(1);
    let session = Secret::generate();
    let ticket = issue_ticket(&service_g3, 3, &me, "osd 'allow *'", &session);
    let creds = Credentials::Ticket {
        name: me.clone(),
        ticket: ticket.clone(),
        session_secret: session.clone(),
    };
    let c = connect(addr, &creds, Some(&EntityName::osd(2)), &fast_cfg())
        .await
        .unwrap();
    let s = l.accept().await.unwrap();
    assert_eq!(s.peer(), &me);
    assert_eq!(s.peer_caps(), Some("osd 'allow *'"));
    c.send(2, Bytes::from_static(b"x")).await.unwrap();
    assert_eq!(
        s.recv_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .msg_type,
        2
    );

    // Generation 4 is unknown to the server (not yet rotated in).
    let t4 = issue_ticket(&Secret::generate(), 4, &me, "", &session);
    let err = connect(
        addr,
        &Credentials::Ticket {
            name: me.clone(),
            ticket: t4,
            session_secret: session.clone(),
        },
        None,
        &fast_cfg(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, MsgError::AuthFailed { reason, .. } if reason.contains("generation 4")),
        "{err}"
    );

    // Rotated out: generation 3 removed -> the old ticket is refused.
    keys.services.lock().unwrap().remove(&3);
    let err = connect(addr, &creds, None, &fast_cfg()).await.unwrap_err();
    assert!(matches!(err, MsgError::AuthFailed { .. }), "{err}");
    keys.services.lock().unwrap().insert(3, service_g3.clone());

    // A stolen ticket without its session secret does not help.
    let err = connect(
        addr,
        &Credentials::Ticket {
            name: me.clone(),
            ticket: ticket.clone(),
            session_secret: Secret::generate(),
        },
        None,
        &fast_cfg(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, MsgError::AuthFailed { .. }), "{err}");

    // A ticket presented under another name is refused.
    let err = connect(
        addr,
        &Credentials::Ticket {
            name: EntityName::osd(9),
            ticket,
            session_secret: session,
        },
        None,
        &fast_cfg(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, MsgError::AuthFailed { reason, .. } if reason.contains("issued to osd.1")),
        "{err}"
    );
}

#[tokio::test]
async fn garbage_client_is_dropped_and_listener_keeps_going() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let key = Secret::generate();
    let l = Listener::bind(any_port(), mon_a(), Keys::with(&admin(), &key), fast_cfg())
        .await
        .unwrap();
    let mut raw = tokio::net::TcpStream::connect(l.local_addr())
        .await
        .unwrap();
    // More than a frame header's worth, so the server judges it at once.
    raw.write_all(&b"GET / HTTP/1.1\r\n".repeat(8))
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), raw.read(&mut buf))
        .await
        .expect("server should hang up on garbage")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let c = connect(l.local_addr(), &key_creds(admin(), key), None, &fast_cfg()).await;
    assert!(c.is_ok());
}

/// A listener allows only crc frames from OSD peers and only secure frames
/// from everyone else: a connecting side's list is searched in its order
/// for a mode the listener allows, and a side with no such mode is refused
/// with a reason naming both lists (nothing is delivered).
#[tokio::test]
async fn frame_modes_are_negotiated_per_peer_kind_and_no_common_mode_is_refused() {
    let osd_key = Secret::generate();
    let admin_key = Secret::generate();
    let keys = Keys::with(&admin(), &admin_key);
    keys.secrets
        .lock()
        .unwrap()
        .insert(EntityName::osd(1), osd_key.clone());
    let server_cfg = MsgConfig {
        accept: AcceptModes {
            osd: FrameModes::only(FrameMode::Crc),
            others: FrameModes::only(FrameMode::Secure),
        },
        ..fast_cfg()
    };
    let l = Listener::bind(any_port(), EntityName::osd(0), keys, server_cfg)
        .await
        .unwrap();
    let addr = l.local_addr();
    let _echo = echo_server(l);
    let offering = |list: &str| MsgConfig {
        modes: list.parse().unwrap(),
        ..fast_cfg()
    };
    let osd = key_creds(EntityName::osd(1), osd_key);
    let client = key_creds(admin(), admin_key);

    // A common mode: calls work both ways, with and without bulk data.
    for (creds, list, mode) in [
        (&osd, "crc", FrameMode::Crc),
        (&osd, "secure crc", FrameMode::Crc),
        (&client, "crc secure", FrameMode::Secure),
        (&client, "secure", FrameMode::Secure),
    ] {
        let c = connect(addr, creds, None, &offering(list)).await.unwrap();
        assert_eq!(c.mode(), mode, "{list}");
        for len in [3usize, 1 << 20] {
            let body = payload(len, 7);
            let r = c
                .call(4, body.clone(), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!((r.msg_type, &r.payload), (5, &body));
        }
    }

    // No common mode: refused before anything else, naming both lists.
    for (creds, list, allowed) in [(&osd, "secure", "'crc'"), (&client, "crc", "'secure'")] {
        let err = connect(addr, creds, None, &offering(list))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, MsgError::NoCommonMode { .. }), "{text}");
        assert!(
            text.contains(&format!("offers frame modes '{list}'"))
                && text.contains(&format!("allows only {allowed}"))
                && text.contains("no common frame mode"),
            "{text}"
        );
    }
}
