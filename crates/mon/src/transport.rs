//! Raft network glue, generic over a small [`RaftTransport`] trait: the
//! production transport sends [`RaftRpc`]s over cairn-msg
//! (`crate::service`), the [`LocalRouter`] delivers them in-process (unit
//! tests, simulations) and can cut nodes off to model partitions and
//! crashes. This module owns no sockets.

use crate::types::{MonId, MonPeer, MonRaft, MonRaftConfig};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One Raft RPC between monitors.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRpc {
    Append(AppendEntriesRequest<MonRaftConfig>),
    Vote(VoteRequest<MonId>),
    Snapshot(InstallSnapshotRequest<MonRaftConfig>),
}

/// The answer to a [`RaftRpc`]; `Error` when the receiving Raft refused it
/// (shutting down, or a snapshot mismatch).
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRpcReply {
    Append(AppendEntriesResponse<MonId>),
    Vote(VoteResponse<MonId>),
    Snapshot(InstallSnapshotResponse<MonId>),
    Error(String),
}

/// Delivers a Raft RPC to another mon and returns its reply; `Err` is a
/// transport failure (unreachable, timed out) described for the log.
pub trait RaftTransport: Send + Sync + 'static {
    fn call(
        &self,
        target: MonId,
        peer: &MonPeer,
        rpc: RaftRpc,
        timeout: Duration,
    ) -> impl Future<Output = Result<RaftRpcReply, String>> + Send;
}

/// Serves one incoming Raft RPC on the local Raft node.
pub async fn handle_rpc(raft: &MonRaft, rpc: RaftRpc) -> RaftRpcReply {
    match rpc {
        RaftRpc::Append(r) => match raft.append_entries(r).await {
            Ok(v) => RaftRpcReply::Append(v),
            Err(e) => RaftRpcReply::Error(e.to_string()),
        },
        RaftRpc::Vote(r) => match raft.vote(r).await {
            Ok(v) => RaftRpcReply::Vote(v),
            Err(e) => RaftRpcReply::Error(e.to_string()),
        },
        RaftRpc::Snapshot(r) => match raft.install_snapshot(r).await {
            Ok(v) => RaftRpcReply::Snapshot(v),
            Err(e) => RaftRpcReply::Error(e.to_string()),
        },
    }
}

/// openraft's network factory over a [`RaftTransport`].
pub struct Network<T: RaftTransport> {
    transport: Arc<T>,
}

impl<T: RaftTransport> Network<T> {
    pub fn new(transport: Arc<T>) -> Self {
        Network { transport }
    }
}

/// openraft's per-peer client over a [`RaftTransport`].
pub struct PeerClient<T: RaftTransport> {
    transport: Arc<T>,
    target: MonId,
    peer: MonPeer,
}

impl<T: RaftTransport> RaftNetworkFactory<MonRaftConfig> for Network<T> {
    type Network = PeerClient<T>;

    async fn new_client(&mut self, target: MonId, node: &MonPeer) -> Self::Network {
        PeerClient {
            transport: self.transport.clone(),
            target,
            peer: node.clone(),
        }
    }
}

fn unreachable<E: std::error::Error>(why: String) -> RPCError<MonId, MonPeer, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why)))
}

impl<T: RaftTransport> PeerClient<T> {
    async fn send(&self, rpc: RaftRpc, option: &RPCOption) -> Result<RaftRpcReply, String> {
        self.transport
            .call(self.target, &self.peer, rpc, option.hard_ttl())
            .await
    }
}

impl<T: RaftTransport> RaftNetwork<MonRaftConfig> for PeerClient<T> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<MonRaftConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<MonId>, RPCError<MonId, MonPeer, RaftError<MonId>>> {
        match self.send(RaftRpc::Append(rpc), &option).await {
            Ok(RaftRpcReply::Append(r)) => Ok(r),
            Ok(other) => Err(unreachable(format!("{} answered {other:?}", self.peer))),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<MonRaftConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<MonId>,
        RPCError<MonId, MonPeer, RaftError<MonId, InstallSnapshotError>>,
    > {
        match self.send(RaftRpc::Snapshot(rpc), &option).await {
            Ok(RaftRpcReply::Snapshot(r)) => Ok(r),
            Ok(other) => Err(unreachable(format!("{} answered {other:?}", self.peer))),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<MonId>,
        option: RPCOption,
    ) -> Result<VoteResponse<MonId>, RPCError<MonId, MonPeer, RaftError<MonId>>> {
        match self.send(RaftRpc::Vote(rpc), &option).await {
            Ok(RaftRpcReply::Vote(r)) => Ok(r),
            Ok(other) => Err(unreachable(format!("{} answered {other:?}", self.peer))),
            Err(e) => Err(unreachable(e)),
        }
    }
}

/// In-process delivery between Raft nodes of one process, with switchable
/// isolation of nodes (a cut-off node neither sends nor receives).
#[derive(Default)]
pub struct LocalRouter {
    nodes: Mutex<BTreeMap<MonId, MonRaft>>,
    isolated: Mutex<BTreeSet<MonId>>,
}

impl LocalRouter {
    pub fn new() -> Arc<LocalRouter> {
        Arc::new(LocalRouter::default())
    }

    pub fn register(&self, id: MonId, raft: MonRaft) {
        if let Ok(mut n) = self.nodes.lock() {
            n.insert(id, raft);
        }
    }

    pub fn unregister(&self, id: MonId) {
        if let Ok(mut n) = self.nodes.lock() {
            n.remove(&id);
        }
    }

    /// Cuts `id` off (true) or reconnects it (false).
    pub fn set_isolated(&self, id: MonId, isolated: bool) {
        if let Ok(mut s) = self.isolated.lock() {
            if isolated {
                s.insert(id);
            } else {
                s.remove(&id);
            }
        }
    }

    /// The transport a node with id `me` uses.
    pub fn transport(self: &Arc<Self>, me: MonId) -> LocalTransport {
        LocalTransport {
            me,
            router: self.clone(),
        }
    }

    fn target(&self, me: MonId, target: MonId) -> Result<MonRaft, String> {
        let cut = self
            .isolated
            .lock()
            .map(|s| s.contains(&me) || s.contains(&target))
            .unwrap_or(true);
        if cut {
            return Err(format!(
                "mon {target} unreachable from mon {me} (partitioned)"
            ));
        }
        self.nodes
            .lock()
            .ok()
            .and_then(|n| n.get(&target).cloned())
            .ok_or_else(|| format!("mon {target} is not running"))
    }
}

/// [`RaftTransport`] of one node over a [`LocalRouter`].
pub struct LocalTransport {
    me: MonId,
    router: Arc<LocalRouter>,
}

impl RaftTransport for LocalTransport {
    async fn call(
        &self,
        target: MonId,
        _peer: &MonPeer,
        rpc: RaftRpc,
        timeout: Duration,
    ) -> Result<RaftRpcReply, String> {
        let raft = self.router.target(self.me, target)?;
        match tokio::time::timeout(timeout, handle_rpc(&raft, rpc)).await {
            Ok(r) => Ok(r),
            Err(_) => Err(format!("mon {target} did not answer within {timeout:?}")),
        }
    }
}
