//! The cluster map as the monitors' replicated state: a log command is an
//! encoded `(MonCommand, ApplyContext)`, the genesis is an encoded
//! `ClusterMap` (from `ClusterMap::new_cluster`).

use crate::state::MapState;
use crate::types::CmdOutput;
use cairn_map::{ApplyContext, ClusterMap, Incremental, MonCommand};
use cairn_types::Epoch;

const CMD_VERSION: u8 = 1;
const CMD_MAX_BYTES: usize = 64 << 20;

/// Encodes a log command.
pub fn encode_command(cmd: &MonCommand, ctx: &ApplyContext) -> Vec<u8> {
    cairn_types::encode_versioned(CMD_VERSION, &(cmd, ctx))
}

/// Decodes a log command.
pub fn decode_command(b: &[u8]) -> Result<(MonCommand, ApplyContext), String> {
    cairn_types::decode_versioned(
        "mon log command",
        b,
        CMD_VERSION,
        CMD_VERSION,
        CMD_MAX_BYTES,
    )
    .map(|(_, v)| v)
    .map_err(|e| e.to_string())
}

/// Turns logged command bytes into the `Incremental` that produced `epoch`.
pub fn incremental_from_log(epoch: u64, b: &[u8]) -> Result<Incremental, String> {
    let (cmd, ctx) = decode_command(b)?;
    Ok(Incremental {
        epoch: Epoch(epoch),
        cmd,
        ctx,
    })
}

impl MapState for ClusterMap {
    fn genesis(bytes: &[u8]) -> Result<Self, String> {
        ClusterMap::decode(bytes).map_err(|e| e.to_string())
    }

    fn apply_command(&mut self, bytes: &[u8]) -> Result<CmdOutput, String> {
        let (cmd, ctx) = decode_command(bytes)?;
        let reply = self.apply(&cmd, &ctx).map_err(|e| e.to_string())?;
        Ok(CmdOutput {
            plain: reply.plain,
            json: reply.json.to_string(),
        })
    }

    fn epoch(&self) -> u64 {
        self.epoch.0
    }

    fn encode_state(&self) -> Vec<u8> {
        self.encode()
    }

    fn decode_state(bytes: &[u8]) -> Result<Self, String> {
        ClusterMap::decode(bytes).map_err(|e| e.to_string())
    }
}
