//! Wire messages between mons, and between clients and mons, carried as
//! cairn-msg payloads: a version byte plus postcard (`encode_versioned`).
//! Message type numbers are in the 0x01xx range reserved for monitors.

use crate::transport::{RaftRpc, RaftRpcReply};
use bytes::Bytes;
use cairn_map::{MonCommand, Reply};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Admin command: [`CommandRequest`] -> [`CommandResponse`].
pub const MSG_COMMAND: u16 = 0x0100;
/// Map subscription: [`SubscribeRequest`] -> [`MapUpdate`], then pushed
/// [`MapUpdate`]s (one-way, type [`MSG_MAP_UPDATE`]) on every new epoch.
pub const MSG_SUBSCRIBE: u16 = 0x0101;
pub const MSG_MAP_UPDATE: u16 = 0x0102;
/// Mon-to-mon Raft RPC: [`RaftRpc`] -> [`RaftRpcReply`].
pub const MSG_RAFT: u16 = 0x0103;
/// Mon-to-mon ping with wall-clock readings: [`Ping`] -> [`Pong`].
pub const MSG_PING: u16 = 0x0104;
/// A new mon asks to join: [`JoinRequest`] -> [`CommandResponse`].
pub const MSG_JOIN: u16 = 0x0105;

const PROTO_VERSION: u8 = 1;
/// Largest mon message we decode (a full map is far below this).
pub const PROTO_MAX_BYTES: usize = 64 << 20;

pub fn encode<T: Serialize>(v: &T) -> Bytes {
    Bytes::from(cairn_types::encode_versioned(PROTO_VERSION, v))
}

pub fn decode<T: DeserializeOwned>(what: &'static str, b: &[u8]) -> Result<T, String> {
    cairn_types::decode_versioned(what, b, PROTO_VERSION, PROTO_VERSION, PROTO_MAX_BYTES)
        .map(|(_, v)| v)
        .map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommandRequest {
    pub cmd: MonCommand,
}

/// Why a mon did not run a command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CommandFailure {
    /// The command ran and was refused (usage, validation, caps): final.
    Refused(String),
    /// Ask the leader instead (`leader_addr` when known).
    NotLeader {
        leader_name: Option<String>,
        leader_addr: Option<String>,
    },
    /// This mon is not part of a working quorum right now.
    NoQuorum(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommandResponse {
    pub result: Result<Reply, CommandFailure>,
    /// Epoch of the answering mon's map after the command.
    pub epoch: u64,
    /// Addresses of every mon in the answering mon's map.
    pub mon_addrs: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscribeRequest {
    /// Epoch the subscriber has (0 = none).
    pub have_epoch: u64,
}

/// A map update for a subscriber.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MapUpdate {
    /// Encoded `ClusterMap` (`ClusterMap::encode`).
    Full {
        epoch: u64,
        map: Vec<u8>,
    },
    /// Changes after `from`, in order.
    Incrementals {
        from: u64,
        incrementals: Vec<cairn_map::Incremental>,
    },
    UpToDate {
        epoch: u64,
    },
    /// The answering mon cannot serve the subscription now.
    Unavailable(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ping {
    pub from: String,
    /// Sender's wall clock, ms since the Unix epoch (reported only).
    pub wall_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pong {
    pub from: String,
    pub wall_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinRequest {
    pub name: String,
    pub addr: String,
}

/// Raft RPCs travel as themselves.
pub type RaftRequest = RaftRpc;
pub type RaftResponse = RaftRpcReply;
