//! cairn-mon: the monitors. A Raft group (openraft) whose replicated state
//! is the cluster map, persisted in redb in each mon's data dir; map
//! subscriptions with incrementals; the network glue over a small transport
//! trait (in-process for tests, cairn-msg in production); and the
//! `MonClient` that the CLI, OSDs and clients use.
//!
//! Consistency: every mutation is committed through the Raft leader
//! (linearizable). Queries (`status`, `health`, `osd tree`, ...) are answered
//! from the answering mon's applied map and may be stale by the replication
//! lag on a follower, or arbitrarily stale on a mon cut off from the quorum.

pub mod client;
pub mod clustermap;
pub mod join;
pub mod node;
pub mod osdreports;
pub mod proto;
pub mod service;
pub mod state;
pub mod store;
pub mod transport;
pub mod types;

pub use client::{
    find_conf, parse_mon_host, ClientError, MapSubscription, MonClient, DEFAULT_CLIENT_TIMEOUT,
};
pub use join::JoinToken;
pub use node::{mon_id_for, ProposeError, RaftMon, RaftTiming, RaftView};
pub use service::{MonConfig, MonService};
pub use state::MapState;
pub use store::{Catchup, MAX_INCREMENTALS_KEPT};
pub use transport::{
    handle_rpc, LocalRouter, LocalTransport, RaftRpc, RaftRpcReply, RaftTransport,
};
pub use types::{ApplyResult, CmdOutput, MonId, MonPeer, MonRaft, MonRaftConfig, Proposal};
