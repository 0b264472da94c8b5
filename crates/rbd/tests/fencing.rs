//! Breaking an image lock fences the old holder (in-process cluster of 3
//! OSDs on loopback): client A holds an image and keeps writing; client B
//! breaks the lock, which blocklists A's client instance first; A's next
//! write fails with the blocklist error while B's succeed, the image holds
//! B's bytes, and an NBD server of A stops serving.

// The OSD tests' in-process cluster harness, shared rather than copied.
#[path = "../../osd/tests/common/mod.rs"]
mod common;

use cairn_map::{ApplyContext, ClientInstance, ClusterMap, MonCommand};
use cairn_rbd::fence::BoxFuture;
use cairn_rbd::{
    serve_images, CreateOptions, Fenced, Fencer, Listener, Rbd, RbdError, ServeOptions,
};
use cairn_types::{EntityName, Epoch};
use common::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// Blocklists by applying the command to the stand-in monitor's map (as
/// the CLI's fencer does through the real monitors).
struct MapFencer {
    map: Arc<Mutex<ClusterMap>>,
    tx: Arc<watch::Sender<Arc<ClusterMap>>>,
}

impl Fencer for MapFencer {
    fn blocklist<'a>(&'a self, client: &'a ClientInstance) -> BoxFuture<'a, Result<Epoch, String>> {
        Box::pin(async move {
            let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
            let ctx = ApplyContext {
                caller: EntityName::client("admin"),
                generated_secret: None,
            };
            let cmd = MonCommand::OsdBlocklistAdd {
                client: client.clone(),
                expire_secs: Some(600),
            };
            let reply = m.apply(&cmd, &ctx).map_err(|e| e.to_string())?;
            self.tx.send_replace(Arc::new(m.clone()));
            reply.json["epoch"]
                .as_u64()
                .map(Epoch)
                .ok_or_else(|| "no epoch in the reply".to_string())
        })
    }
}

fn is_blocklisted(e: &RbdError) -> bool {
    match e {
        RbdError::Client(c) => c.is_blocklisted(),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_a_lock_fences_the_old_holder() {
    let mut cluster = Cluster::start(3, 1, 8, 256 * MIB).await;
    let rados_a = cluster.client();
    let rados_b = cluster.client();
    assert_ne!(rados_a.instance(), rados_b.instance());
    let rbd_a = Rbd::new(&rados_a, "rbd").unwrap();
    let fencer = Arc::new(MapFencer {
        map: cluster.map.clone(),
        tx: cluster.tx.clone(),
    });
    let rbd_b = Rbd::new(&rados_b, "rbd").unwrap().with_fencer(fencer);
    let opts = CreateOptions {
        size_bytes: 4 * MIB,
        object_size_bytes: Some(256 * KIB),
        data_pool: None,
    };
    rbd_a.create("vm", &opts).await.unwrap();
    let img_a = Arc::new(rbd_a.open("vm", "client.a", false).await.unwrap());
    let lock = rbd_b.lock_status("vm").await.unwrap().unwrap();
    assert_eq!(lock.client, rados_a.instance().to_string());

    // A writes the same two ranges (in two objects) over and over until
    // it is refused; it counts the writes acknowledged to it.
    let writer = {
        let img = img_a.clone();
        tokio::spawn(async move {
            let mut acked = 0u64;
            loop {
                let w1 = img.write(0, vec![0xaa; 64 * KIB as usize].into()).await;
                let w2 = img.write(MIB, vec![0xaa; 4 * KIB as usize].into()).await;
                match w1.and(w2) {
                    Ok(()) => acked += 1,
                    Err(e) => return (acked, e),
                }
            }
        })
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        while rbd_b.du("vm").await.unwrap().objects < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("A's writes land");

    // B cannot just open it; breaking blocklists A first.
    assert!(matches!(
        rbd_b.open("vm", "client.b", false).await,
        Err(RbdError::Locked { .. })
    ));
    let img_b = rbd_b.open("vm", "client.b", true).await.unwrap();
    let map = cluster.current();
    let entry = map
        .blocklisted(&rados_a.instance().name, rados_a.instance().nonce)
        .expect("A is blocklisted");
    assert!(rados_b.map().epoch >= entry.added);
    img_b
        .write(0, vec![0xbb; 64 * KIB as usize].into())
        .await
        .unwrap();
    img_b
        .write(MIB, vec![0xbb; 4 * KIB as usize].into())
        .await
        .unwrap();

    // A's loop ends with the blocklist error; so does any later op of A.
    let (acked, err) = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("A's writer stops")
        .unwrap();
    assert!(acked > 0);
    assert!(is_blocklisted(&err), "A's write failed with {err}");
    let text = err.to_string();
    assert!(
        text.contains("blocklisted") && text.contains(&rados_a.instance().to_string()),
        "{text}"
    );
    let e = img_a.write(0, vec![0xaa; 512].into()).await.unwrap_err();
    assert!(is_blocklisted(&e), "{e}");
    assert!(is_blocklisted(&img_a.read(0, 512).await.unwrap_err()));

    // The image holds B's bytes, and B keeps writing.
    let got = img_b.read(0, 64 * KIB).await.unwrap();
    assert!(
        got.iter().all(|b| *b == 0xbb),
        "an old-holder write landed after B's"
    );
    let got = img_b.read(MIB, 4 * KIB).await.unwrap();
    assert!(
        got.iter().all(|b| *b == 0xbb),
        "an old-holder write landed after B's"
    );
    img_b.write(2 * MIB, vec![0xcc; 4096].into()).await.unwrap();
    assert!(rados_b.fenced_error().is_none());

    // Lifting the blocklist does not bring the fenced handle back (it
    // latched); only a new client instance may write.
    cluster.apply(MonCommand::OsdBlocklistRm {
        client: rados_a.instance(),
    });
    let e = img_a.write(0, vec![0xaa; 512].into()).await.unwrap_err();
    assert!(is_blocklisted(&e), "{e}");
    img_b.close().await.unwrap();
    drop(img_a);

    // An NBD server of a fenced client stops serving, saying why.
    rbd_b.create("srv", &opts).await.unwrap();
    let rados_c = cluster.client();
    let rbd_c = Rbd::new(&rados_c, "rbd").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::UnixListener::bind(dir.path().join("nbd.sock")).unwrap();
    let serve_opts = ServeOptions {
        owner: "client.c@test/serve".into(),
        break_lock: false,
        server: Default::default(),
    };
    let names = vec!["srv".to_string()];
    let server = tokio::spawn(async move {
        serve_images(
            &rbd_c,
            &names,
            Listener::Unix(listener),
            &serve_opts,
            std::future::pending::<()>(),
        )
        .await
    });
    tokio::time::timeout(Duration::from_secs(30), async {
        while rbd_b.lock_status("srv").await.unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the server takes the lock");
    let broken = rbd_b.break_lock("srv").await.unwrap().unwrap();
    assert_eq!(broken.holder.owner, "client.c@test/serve");
    assert!(
        matches!(&broken.fenced, Fenced::Blocklisted { client, .. } if *client == rados_c.instance())
    );
    let served = tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the fenced server stops")
        .unwrap();
    match served {
        Err(RbdError::Fenced(m)) => assert!(m.contains("blocklisted"), "{m}"),
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(rbd_b.lock_status("srv").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_needs_a_fencer_and_leaves_the_lock_otherwise() {
    let cluster = Cluster::start(3, 1, 4, 128 * MIB).await;
    let rados_a = cluster.client();
    let rados_b = cluster.client();
    let rbd_a = Rbd::new(&rados_a, "rbd").unwrap();
    let rbd_b = Rbd::new(&rados_b, "rbd").unwrap();
    let opts = CreateOptions {
        size_bytes: MIB,
        object_size_bytes: Some(64 * KIB),
        data_pool: None,
    };
    rbd_a.create("vm", &opts).await.unwrap();
    let img_a = rbd_a.open("vm", "client.a", false).await.unwrap();
    let e = rbd_b.break_lock("vm").await.unwrap_err();
    assert!(e.to_string().contains("blocklist"), "{e}");
    let e = rbd_b.open("vm", "client.b", true).await.err().unwrap();
    assert!(e.to_string().contains("blocklist"), "{e}");
    // Nothing changed: A still holds the lock and writes.
    assert_eq!(
        rbd_b.lock_status("vm").await.unwrap().unwrap().client,
        rados_a.instance().to_string()
    );
    img_a.write(0, vec![1u8; 4096].into()).await.unwrap();
    assert!(cluster.current().blocklist.is_empty());
    // The same instance breaking its own leaked lock fences nobody.
    drop(img_a);
    let img = rbd_a.open("vm", "client.a2", true).await.unwrap();
    img.write(0, vec![2u8; 4096].into()).await.unwrap();
    img.close().await.unwrap();
}
