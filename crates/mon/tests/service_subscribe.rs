//! One mon service in-process on loopback: MonClient commands, caps, and
//! map subscriptions that receive pushed incrementals.

use cairn_map::{AuthEntity, ClusterMap, MonCommand, MonInfo};
use cairn_mon::service::MsgTransport;
use cairn_mon::{
    mon_id_for, ClientError, MonClient, MonConfig, MonPeer, MonService, RaftMon, RaftTiming,
};
use cairn_msg::{Credentials, Secret};
use cairn_types::EntityName;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_receive_incrementals_and_commands_check_caps() {
    let tmp = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let admin = Secret::generate();
    let mon_secret = Secret::generate();
    let map = ClusterMap::new_cluster(
        "fsid-1",
        MonInfo {
            name: "a".into(),
            addr: addr.to_string(),
            rank: 0,
        },
        AuthEntity::new(admin.as_bytes(), &[("mon", "allow *")]),
    );
    let dir = tmp.path().join("mon");
    {
        let t = Arc::new(MsgTransport::new("a", mon_secret.clone()));
        let m = RaftMon::<ClusterMap>::open(&dir, mon_id_for("a"), t, RaftTiming::default())
            .await
            .unwrap();
        let peer = MonPeer {
            name: "a".into(),
            addr: addr.to_string(),
        };
        let r = m
            .bootstrap(peer, map.encode(), Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(r.epoch, 1);
        m.shutdown().await;
    }
    // The store must be released before the service opens it.
    let cfg = MonConfig {
        name: "a".into(),
        addr,
        data_dir: dir.clone(),
        mon_secret,
        join_via: vec![],
        conf_path: None,
        key_files: vec![],
        timing: RaftTiming::default(),
    };
    let (svc, listener) = loop {
        match MonService::start(cfg.clone()).await {
            Ok(x) => break x,
            Err(e) if e.to_string().contains("already open") => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(svc.clone().run(listener, async {
        let _ = stop_rx.await;
    }));

    let client = MonClient::new(
        vec![addr],
        Credentials::Key {
            name: EntityName::client("admin"),
            secret: admin.clone(),
        },
        Duration::from_secs(10),
    );
    let mut sub = client.subscribe().await.unwrap();
    assert_eq!(sub.map.epoch.0, 1);
    assert_eq!(sub.map.fsid, "fsid-1");

    let words: Vec<String> = ["osd", "pool", "create", "rbd", "8"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let cmd = cairn_map::parse_command(&words).unwrap();
    let r = client.command(&cmd).await.unwrap();
    assert!(r.plain.contains("created"), "{}", r.plain);
    let m = sub.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(m.epoch.0, 2);
    assert!(m.pools.values().any(|p| p.name == "rbd"));

    // A read-only client: reads work, writes are refused with the reason.
    let ro = client
        .command(
            &cairn_map::parse_command(
                &["auth", "get-or-create", "client.ro", "mon", "allow r"].map(String::from),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let m = sub.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(m.epoch.0, 3);
    let key = ro
        .plain
        .lines()
        .find_map(|l| l.trim().strip_prefix("key = "))
        .unwrap()
        .to_string();
    let ro_client = MonClient::new(
        vec![addr],
        Credentials::Key {
            name: EntityName::client("ro"),
            secret: Secret::from_base64(&key).unwrap(),
        },
        Duration::from_secs(5),
    );
    let s = ro_client.command(&MonCommand::Status).await.unwrap();
    assert!(s.plain.contains("fsid-1"));
    let err = ro_client.command(&cmd).await.unwrap_err();
    assert!(
        matches!(err, ClientError::Refused(ref e) if e.contains("access denied")),
        "{err}"
    );

    // A wrong key never gets map data.
    let bad = MonClient::new(
        vec![addr],
        Credentials::Key {
            name: EntityName::client("admin"),
            secret: Secret::generate(),
        },
        Duration::from_secs(3),
    );
    let err = bad.command(&MonCommand::Status).await.unwrap_err();
    assert!(matches!(err, ClientError::Auth { .. }), "{err}");

    let _ = stop_tx.send(());
    run.await.unwrap().unwrap();
}
