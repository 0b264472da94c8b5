//! One monitor's Raft member: opens the durable store, runs openraft over a
//! [`RaftTransport`], proposes commands, serves local reads and catch-up
//! data for subscribers, and changes the membership.
//!
//! Consistency: [`RaftMon::propose`] is linearizable (it commits through the
//! leader). [`RaftMon::read_local`] reads this mon's applied state and may be
//! stale on a follower or on a leader that lost its quorum (it is what
//! `status`, `health` and other queries use); [`RaftMon::read_linearizable`]
//! first confirms leadership with a quorum.

use crate::state::MapState;
use crate::store::{open_db, Catchup, LogStore, StateMachineStore};
use crate::transport::{Network, RaftTransport};
use crate::types::{ApplyResult, MonId, MonPeer, MonRaft, Proposal};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, Config, ServerState, SnapshotPolicy};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Raft timing of the monitor group (monotonic clock only).
#[derive(Debug, Clone, Copy)]
pub struct RaftTiming {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat_interval_ms: 200,
            election_timeout_min_ms: 800,
            election_timeout_max_ms: 1600,
        }
    }
}

/// Log entries between snapshots (then the log before them is purged).
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 1000;

/// Why a proposal or membership change did not happen.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProposeError {
    #[error("this mon is not the leader{}", match .leader { Some((_, p)) => format!("; the leader is {p}"), None => "; no leader is known right now".into() })]
    NotLeader { leader: Option<(MonId, MonPeer)> },
    #[error("no monitor quorum: the leader could not commit within {waited_ms} ms (is a majority of mons running and reachable?)")]
    NoQuorum { waited_ms: u64 },
    #[error("monitor storage or Raft failure: {0}")]
    Fatal(String),
    #[error("membership change refused: {0}")]
    Membership(String),
}

/// Derives a mon's Raft id from its name, so every node agrees on it
/// without a coordination step. A mon whose data dir was lost must be
/// removed (`cairn mon remove NAME`) before it is added again.
pub fn mon_id_for(name: &str) -> MonId {
    // FNV-1a, top bit cleared.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h & 0x7fff_ffff_ffff_ffff
}

/// Summary of this mon's Raft view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftView {
    pub id: MonId,
    pub state: String,
    pub term: u64,
    pub leader: Option<(MonId, MonPeer)>,
    pub voters: BTreeMap<MonId, MonPeer>,
    pub learners: BTreeMap<MonId, MonPeer>,
    pub last_applied_index: Option<u64>,
    /// On the leader: ms since a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
}

/// A monitor's Raft member.
pub struct RaftMon<S: MapState> {
    pub id: MonId,
    raft: MonRaft,
    sm: StateMachineStore<S>,
    /// One membership change at a time on this node: Raft refuses a change
    /// while another is half done, which would leave the group in a joint
    /// configuration (a `mon add` and the new mon's own join request for
    /// the same mon arrive together).
    membership: tokio::sync::Mutex<()>,
}

impl<S: MapState> RaftMon<S> {
    /// Opens the store in `dir` and starts Raft; a restarted mon resumes
    /// from its log, vote and applied state.
    pub async fn open<T: RaftTransport>(
        dir: &Path,
        id: MonId,
        transport: Arc<T>,
        timing: RaftTiming,
    ) -> Result<RaftMon<S>, ProposeError> {
        let fatal = |e: String| ProposeError::Fatal(e);
        let db = open_db(dir).map_err(|e| fatal(e.to_string()))?;
        let log = LogStore::new(db.clone());
        let sm = StateMachineStore::<S>::open(db).map_err(|e| fatal(e.to_string()))?;
        let config = Config {
            cluster_name: "cairn-mon".into(),
            heartbeat_interval: timing.heartbeat_interval_ms,
            election_timeout_min: timing.election_timeout_min_ms,
            election_timeout_max: timing.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_ENTRIES),
            max_in_snapshot_log_to_keep: 100,
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(|e| fatal(e.to_string()))?);
        let raft = MonRaft::new(id, config, Network::new(transport), log, sm.clone())
            .await
            .map_err(|e| fatal(e.to_string()))?;
        Ok(RaftMon {
            id,
            raft,
            sm,
            membership: tokio::sync::Mutex::new(()),
        })
    }

    /// The openraft handle (for serving RPCs).
    pub fn raft(&self) -> &MonRaft {
        &self.raft
    }

    /// True once this node has a membership (it was bootstrapped or joined).
    pub async fn is_initialized(&self) -> bool {
        self.raft.is_initialized().await.unwrap_or(false)
    }

    /// Creates a one-member group and commits the genesis state.
    pub async fn bootstrap(
        &self,
        me: MonPeer,
        genesis: Vec<u8>,
        timeout: Duration,
    ) -> Result<ApplyResult, ProposeError> {
        let mut members = BTreeMap::new();
        members.insert(self.id, me);
        if !self.is_initialized().await {
            self.raft
                .initialize(members)
                .await
                .map_err(|e| ProposeError::Fatal(e.to_string()))?;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let res = self
                .propose_raw(Proposal::Genesis(genesis.clone()), timeout)
                .await;
            match res {
                Err(ProposeError::NotLeader { .. }) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    /// Proposes one encoded command; returns once it is committed and
    /// applied on this (leader) mon.
    pub async fn propose(
        &self,
        cmd: Vec<u8>,
        timeout: Duration,
    ) -> Result<ApplyResult, ProposeError> {
        self.propose_raw(Proposal::Command(cmd), timeout).await
    }

    async fn propose_raw(
        &self,
        p: Proposal,
        timeout: Duration,
    ) -> Result<ApplyResult, ProposeError> {
        match tokio::time::timeout(timeout, self.raft.client_write(p)).await {
            Err(_) => Err(ProposeError::NoQuorum {
                waited_ms: timeout.as_millis() as u64,
            }),
            Ok(Ok(resp)) => Ok(resp.data),
            Ok(Err(e)) => Err(self.map_write_error(e)),
        }
    }

    fn map_write_error(
        &self,
        e: RaftError<MonId, ClientWriteError<MonId, MonPeer>>,
    ) -> ProposeError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ProposeError::NotLeader {
                leader: match (f.leader_id, f.leader_node) {
                    (Some(id), Some(n)) => Some((id, n)),
                    _ => None,
                },
            },
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
                ProposeError::Membership(c.to_string())
            }
            RaftError::Fatal(f) => ProposeError::Fatal(f.to_string()),
        }
    }

    /// Reads this mon's applied state (may be stale on a follower).
    pub fn read_local<R>(&self, f: impl FnOnce(Option<&S>) -> R) -> R {
        let shared = self.sm.shared();
        let guard = shared.read();
        match guard {
            Ok(g) => f(g.state.as_ref()),
            Err(_) => f(None),
        }
    }

    /// Reads after confirming with a quorum that this mon is the leader and
    /// has applied everything committed before the call.
    pub async fn read_linearizable<R>(
        &self,
        timeout: Duration,
        f: impl FnOnce(Option<&S>) -> R,
    ) -> Result<R, ProposeError> {
        match tokio::time::timeout(timeout, self.raft.ensure_linearizable()).await {
            Err(_) => Err(ProposeError::NoQuorum {
                waited_ms: timeout.as_millis() as u64,
            }),
            Ok(Err(e)) => match e.into_api_error() {
                Some(openraft::error::CheckIsLeaderError::ForwardToLeader(f)) => {
                    Err(ProposeError::NotLeader {
                        leader: match (f.leader_id, f.leader_node) {
                            (Some(id), Some(n)) => Some((id, n)),
                            _ => None,
                        },
                    })
                }
                Some(other) => Err(ProposeError::NoQuorum {
                    waited_ms: {
                        let _ = other;
                        timeout.as_millis() as u64
                    },
                }),
                None => Err(ProposeError::Fatal("raft stopped".into())),
            },
            Ok(Ok(_)) => Ok(self.read_local(f)),
        }
    }

    /// Current epoch of this mon's applied map (0 before genesis).
    pub fn epoch(&self) -> u64 {
        *self.sm.subscribe_epochs().borrow()
    }

    /// A receiver that changes whenever a new epoch is applied here.
    pub fn subscribe_epochs(&self) -> watch::Receiver<u64> {
        self.sm.subscribe_epochs()
    }

    /// What a subscriber at `have_epoch` needs to catch up.
    pub fn catchup(&self, have_epoch: u64) -> Result<Catchup, ProposeError> {
        self.sm
            .catchup(have_epoch)
            .map_err(|e| ProposeError::Fatal(e.to_string()))
    }

    /// Number of incremental commands kept on disk.
    pub fn incrementals_kept(&self) -> u64 {
        self.sm.incrementals_kept().unwrap_or(0)
    }

    /// This mon's view of the group.
    pub fn view(&self) -> RaftView {
        let m = self.raft.metrics().borrow().clone();
        let mem = m.membership_config.membership();
        let voter_ids: BTreeSet<MonId> = mem.voter_ids().collect();
        let mut voters = BTreeMap::new();
        let mut learners = BTreeMap::new();
        for (id, n) in mem.nodes() {
            if voter_ids.contains(id) {
                voters.insert(*id, n.clone());
            } else {
                learners.insert(*id, n.clone());
            }
        }
        let leader = m
            .current_leader
            .and_then(|l| mem.get_node(&l).map(|n| (l, n.clone())));
        RaftView {
            id: self.id,
            state: match m.state {
                ServerState::Leader => "leader",
                ServerState::Follower => "follower",
                ServerState::Candidate => "candidate",
                ServerState::Learner => "learner",
                ServerState::Shutdown => "shutdown",
            }
            .to_string(),
            term: m.current_term,
            leader,
            voters,
            learners,
            last_applied_index: m.last_applied.map(|l| l.index),
            millis_since_quorum_ack: m.millis_since_quorum_ack,
        }
    }

    /// The voters of the newest configuration when the membership is
    /// joint (a change was interrupted half way), else None.
    fn unfinished_change(&self) -> Option<BTreeSet<MonId>> {
        let m = self.raft.metrics().borrow().clone();
        let joint = m.membership_config.membership().get_joint_config().clone();
        if joint.len() > 1 {
            joint.last().cloned()
        } else {
            None
        }
    }

    /// Completes a membership change left joint (its second step was
    /// refused or the leader changed in between): the group moves to the
    /// newest configuration it had agreed on.
    async fn finish_unfinished_change(&self) -> Result<(), ProposeError> {
        if let Some(voters) = self.unfinished_change() {
            tracing::info!("completing an unfinished monitor membership change to {voters:?}");
            self.raft
                .change_membership(ChangeMembers::ReplaceAllVoters(voters), false)
                .await
                .map_err(|e| self.map_write_error(e))?;
        }
        Ok(())
    }

    /// Leader only: adds a mon as a learner, waits until it caught up, then
    /// makes it a voter. Idempotent for a mon that is already a voter.
    /// Membership changes on this node run one at a time; one left joint
    /// by an earlier failure is completed first.
    pub async fn add_member(
        &self,
        id: MonId,
        peer: MonPeer,
        timeout: Duration,
    ) -> Result<(), ProposeError> {
        let fut = async {
            let _one = self.membership.lock().await;
            self.finish_unfinished_change().await?;
            let view = self.view();
            if view.voters.get(&id) == Some(&peer) {
                return Ok(());
            }
            if let Some((other, p)) = view
                .voters
                .iter()
                .find(|(i, p)| **i != id && p.name == peer.name)
            {
                return Err(ProposeError::Membership(format!(
                    "a mon named {} already exists (raft id {other}, {p}); remove it first",
                    peer.name
                )));
            }
            self.raft
                .add_learner(id, peer.clone(), true)
                .await
                .map_err(|e| self.map_write_error(e))?;
            let mut add = BTreeSet::new();
            add.insert(id);
            self.raft
                .change_membership(ChangeMembers::AddVoterIds(add), false)
                .await
                .map_err(|e| self.map_write_error(e))?;
            Ok(())
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(ProposeError::NoQuorum {
                waited_ms: timeout.as_millis() as u64,
            }),
        }
    }

    /// Leader only: removes a mon from the group (voter or learner).
    pub async fn remove_member(&self, id: MonId, timeout: Duration) -> Result<(), ProposeError> {
        let mut ids = BTreeSet::new();
        ids.insert(id);
        let fut = async {
            let _one = self.membership.lock().await;
            self.finish_unfinished_change().await?;
            let view = self.view();
            if view.voters.contains_key(&id) {
                if view.voters.len() == 1 {
                    return Err(ProposeError::Membership(
                        "cannot remove the last monitor".into(),
                    ));
                }
                self.raft
                    .change_membership(ChangeMembers::RemoveVoters(ids.clone()), false)
                    .await
                    .map_err(|e| self.map_write_error(e))?;
            }
            if self.view().learners.contains_key(&id) {
                self.raft
                    .change_membership(ChangeMembers::RemoveNodes(ids), false)
                    .await
                    .map_err(|e| self.map_write_error(e))?;
            }
            Ok(())
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(ProposeError::NoQuorum {
                waited_ms: timeout.as_millis() as u64,
            }),
        }
    }

    /// Stops Raft (the store stays on disk).
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}
