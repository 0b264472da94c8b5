//! Three mons in one process over the in-process router: replication,
//! leader loss, minority partitions, restart from disk and subscriber
//! catch-up. The replicated state is a small register map so these tests
//! exercise Raft and storage, not the cluster map.

use cairn_mon::{
    mon_id_for, Catchup, CmdOutput, LocalRouter, MapState, MonId, MonPeer, ProposeError, RaftMon,
    RaftTiming,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Registers {
    epoch: u64,
    values: BTreeMap<String, String>,
}

impl MapState for Registers {
    fn genesis(bytes: &[u8]) -> Result<Self, String> {
        let name = String::from_utf8_lossy(bytes).to_string();
        let mut values = BTreeMap::new();
        values.insert("name".to_string(), name);
        Ok(Registers { epoch: 1, values })
    }
    fn apply_command(&mut self, bytes: &[u8]) -> Result<CmdOutput, String> {
        let text = String::from_utf8_lossy(bytes).to_string();
        let (k, v) = text.split_once('=').ok_or("expected k=v")?;
        if self.values.get(k).map(String::as_str) != Some(v) {
            self.values.insert(k.to_string(), v.to_string());
            self.epoch += 1;
        }
        Ok(CmdOutput {
            plain: format!("set {k}"),
            json: "{}".into(),
        })
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn encode_state(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap()
    }
    fn decode_state(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

const TIMING: RaftTiming = RaftTiming {
    heartbeat_interval_ms: 50,
    election_timeout_min_ms: 250,
    election_timeout_max_ms: 500,
};
const T: Duration = Duration::from_secs(5);

struct Cluster {
    router: Arc<LocalRouter>,
    dirs: Vec<PathBuf>,
    nodes: BTreeMap<MonId, RaftMon<Registers>>,
    _tmp: tempfile::TempDir,
}

fn peer(i: usize) -> (MonId, MonPeer) {
    let name = ["a", "b", "c"][i].to_string();
    (
        mon_id_for(&name),
        MonPeer {
            name,
            addr: format!("127.0.0.{}:6789", i + 1),
        },
    )
}

impl Cluster {
    async fn start(&mut self, i: usize) {
        let (id, _) = peer(i);
        // A stopped node's background tasks may hold the database briefly.
        let end = Instant::now() + Duration::from_secs(5);
        let node = loop {
            match RaftMon::<Registers>::open(
                &self.dirs[i],
                id,
                Arc::new(self.router.transport(id)),
                TIMING,
            )
            .await
            {
                Ok(n) => break n,
                Err(e) if Instant::now() < end && e.to_string().contains("already open") => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("{e}"),
            }
        };
        self.router.register(id, node.raft().clone());
        self.nodes.insert(id, node);
    }

    async fn stop(&mut self, id: MonId) {
        self.router.unregister(id);
        if let Some(n) = self.nodes.remove(&id) {
            n.shutdown().await;
        }
    }

    async fn new3() -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = (0..3).map(|i| tmp.path().join(format!("mon{i}"))).collect();
        let mut c = Cluster {
            router: LocalRouter::new(),
            dirs,
            nodes: BTreeMap::new(),
            _tmp: tmp,
        };
        for i in 0..3 {
            c.start(i).await;
        }
        let (a, pa) = peer(0);
        let r = c.nodes[&a]
            .bootstrap(pa, b"test".to_vec(), T)
            .await
            .unwrap();
        assert_eq!(r.epoch, 1);
        for i in 1..3 {
            let (id, p) = peer(i);
            c.nodes[&a].add_member(id, p, T).await.unwrap();
        }
        c
    }

    fn leader(&self) -> Option<MonId> {
        self.nodes
            .values()
            .find(|n| n.view().state == "leader")
            .map(|n| n.id)
    }

    /// Proposes through whoever is leader, retrying until `deadline`.
    async fn propose(&self, cmd: &str, within: Duration) -> Result<u64, ProposeError> {
        let end = Instant::now() + within;
        loop {
            let res = match self.leader() {
                Some(l) => self.nodes[&l]
                    .propose(cmd.as_bytes().to_vec(), Duration::from_millis(500))
                    .await
                    .map(|r| r.epoch),
                None => Err(ProposeError::NotLeader { leader: None }),
            };
            match res {
                Ok(e) => return Ok(e),
                Err(e) if Instant::now() >= end => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicates_and_survives_leader_loss() {
    let mut c = Cluster::new3().await;
    assert_eq!(c.propose("x=1", T).await.unwrap(), 2);
    let old = c.leader().unwrap();
    c.stop(old).await;
    let t0 = Instant::now();
    let e = c.propose("x=2", T).await.unwrap();
    assert_eq!(e, 3, "epochs continue after leader loss");
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_ne!(c.leader(), Some(old));
    // The survivors agree.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in c.nodes.values() {
        let v = n.read_local(|s| s.unwrap().values.get("x").cloned());
        assert_eq!(v.as_deref(), Some("2"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_cannot_commit_and_heals() {
    let c = Cluster::new3().await;
    c.propose("k=1", T).await.unwrap();
    let leader = c.leader().unwrap();
    // Cut off both followers: the leader alone must not commit.
    let followers: Vec<MonId> = c.nodes.keys().copied().filter(|i| *i != leader).collect();
    for f in &followers {
        c.router.set_isolated(*f, true);
    }
    let t0 = Instant::now();
    let err = c.nodes[&leader]
        .propose(b"k=2".to_vec(), Duration::from_millis(800))
        .await
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2), "bounded wait");
    assert!(
        matches!(
            err,
            ProposeError::NoQuorum { .. } | ProposeError::NotLeader { .. }
        ),
        "{err}"
    );
    let err = c.nodes[&leader]
        .read_linearizable(Duration::from_millis(500), |_| ())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        ProposeError::NoQuorum { .. } | ProposeError::NotLeader { .. }
    ));
    for f in &followers {
        c.router.set_isolated(*f, false);
    }
    let e = c.propose("k=3", T).await.unwrap();
    assert!(e >= 3);
    let v = c
        .nodes
        .values()
        .next()
        .unwrap()
        .read_linearizable(T, |s| s.map(|s| s.epoch))
        .await;
    // Either this mon is the leader (value) or it names one.
    assert!(matches!(
        v,
        Ok(Some(_)) | Err(ProposeError::NotLeader { leader: Some(_) })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_from_disk_keeps_state_and_epochs() {
    let mut c = Cluster::new3().await;
    for i in 0..5 {
        c.propose(&format!("r{i}={i}"), T).await.unwrap();
    }
    let before = c.propose("last=yes", T).await.unwrap();
    let ids: Vec<MonId> = c.nodes.keys().copied().collect();
    for id in &ids {
        c.stop(*id).await;
    }
    for i in 0..3 {
        c.start(i).await;
    }
    let after = c.propose("again=1", Duration::from_secs(10)).await.unwrap();
    assert_eq!(after, before + 1);
    let l = c.leader().unwrap();
    let vals = c.nodes[&l].read_local(|s| s.unwrap().values.clone());
    assert_eq!(vals.get("last").map(String::as_str), Some("yes"));
    assert_eq!(vals.get("r4").map(String::as_str), Some("4"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_get_incrementals_or_full_map() {
    let c = Cluster::new3().await;
    for i in 0..4 {
        c.propose(&format!("s{i}=v"), T).await.unwrap();
    }
    // A no-op command does not make an epoch.
    assert_eq!(c.propose("s0=v", T).await.unwrap(), 5);
    let l = c.leader().unwrap();
    let n = &c.nodes[&l];
    match n.catchup(3).unwrap() {
        Catchup::Incrementals { from, to, commands } => {
            assert_eq!((from, to), (3, 5));
            assert_eq!(commands, vec![b"s2=v".to_vec(), b"s3=v".to_vec()]);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        n.catchup(0).unwrap(),
        Catchup::Full { epoch: 5, .. }
    ));
    assert!(matches!(
        n.catchup(5).unwrap(),
        Catchup::UpToDate { epoch: 5 }
    ));
    // Replaying the incrementals on the old state yields the current one.
    let mut rx = n.subscribe_epochs();
    assert_eq!(*rx.borrow_and_update(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_mon_leaves_and_can_be_readded() {
    let mut c = Cluster::new3().await;
    c.propose("a=1", T).await.unwrap();
    let l = c.leader().unwrap();
    let (cid, cpeer) = peer(2);
    let victim = if cid == l { peer(1) } else { (cid, cpeer) };
    c.nodes[&l].remove_member(victim.0, T).await.unwrap();
    assert!(!c.nodes[&l].view().voters.contains_key(&victim.0));
    // Its data dir is lost: wipe and re-add.
    c.stop(victim.0).await;
    let idx = ["a", "b", "c"]
        .iter()
        .position(|n| *n == victim.1.name)
        .unwrap();
    std::fs::remove_dir_all(&c.dirs[idx]).unwrap();
    c.start(idx).await;
    let l = c.leader().unwrap();
    c.nodes[&l]
        .add_member(victim.0, victim.1.clone(), T)
        .await
        .unwrap();
    c.propose("b=2", T).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let v = c.nodes[&victim.0].read_local(|s| s.map(|s| s.values.get("b").cloned()));
    assert_eq!(v, Some(Some("2".to_string())));
}

/// Two requests to add the same mon at once (the new mon's own join and
/// the operator's `mon add`) both succeed, and the group ends in a plain
/// (not joint) configuration with every mon a voter, so the next `mon
/// add` keeps them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_of_one_mon_leave_no_joint_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = (0..3).map(|i| tmp.path().join(format!("mon{i}"))).collect();
    let mut c = Cluster {
        router: LocalRouter::new(),
        dirs,
        nodes: BTreeMap::new(),
        _tmp: tmp,
    };
    for i in 0..3 {
        c.start(i).await;
    }
    let (a, pa) = peer(0);
    c.nodes[&a]
        .bootstrap(pa, b"test".to_vec(), T)
        .await
        .unwrap();
    let (b, pb) = peer(1);
    let leader = &c.nodes[&a];
    let (r1, r2) = tokio::join!(
        leader.add_member(b, pb.clone(), T),
        leader.add_member(b, pb.clone(), T)
    );
    r1.unwrap();
    r2.unwrap();
    let (cid, pc) = peer(2);
    leader.add_member(cid, pc, T).await.unwrap();
    let view = leader.view();
    let voters: Vec<&str> = view.voters.values().map(|p| p.name.as_str()).collect();
    assert_eq!(voters.len(), 3, "voters {voters:?}");
    for name in ["a", "b", "c"] {
        assert!(voters.contains(&name), "voters {voters:?}");
    }
}
