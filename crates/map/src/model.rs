//! The cluster map's data: monitors, OSDs, CRUSH, pools, EC profiles, flags,
//! auth entities and central config, plus the contexts and replies that go
//! with commands. Decisions about the map live in `apply`, `query` and
//! `health`; this module only holds the shapes.

use cairn_crush::CrushMap;
use cairn_types::{EntityName, Epoch, PgId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use crate::health::HealthInputs;

/// A monitor: name (`a` for `mon.a`), address `ip:port`, rank (0 = first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonInfo {
    pub name: String,
    pub addr: String,
    pub rank: u32,
}

/// What an OSD last told the monitors about itself at boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OsdReported {
    /// Capacity of the OSD's device in bytes.
    pub total_bytes: u64,
    /// Bytes in use when it booted.
    pub used_bytes: u64,
    /// Free-form state string (e.g. "booting", "active") for the OSD side.
    pub state: String,
    /// Random id chosen by the OSD process at start: a repeated boot with
    /// the same id is a retry, a new id is a restart (a new interval).
    pub boot_id: u64,
}

/// One OSD in the OSD map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OsdInfo {
    pub id: i32,
    pub uuid: String,
    pub host: String,
    /// Addresses the OSD listens on (public first, then cluster).
    pub addrs: Vec<String>,
    /// Mirror of the CRUSH device class.
    pub device_class: Option<String>,
    /// Mirror of the CRUSH weight, in TiB.
    pub crush_weight: f64,
    /// Override weight 0.0..=1.0 (`osd reweight`); 1.0 = full share.
    pub reweight: f64,
    pub up: bool,
    #[serde(rename = "in")]
    pub is_in: bool,
    /// Epoch the OSD last came up in (0 = never).
    pub up_from: Epoch,
    /// Last epoch the OSD declared itself alive for peering (`up_thru`).
    pub up_thru: Epoch,
    /// Epoch the OSD last went down (0 = never).
    pub down_at: Epoch,
    /// Set once the OSD has booted at least once (new OSDs are marked in on first boot).
    pub ever_booted: bool,
    /// Marked out automatically (down too long); marked in again when it boots.
    pub auto_out: bool,
    /// Epoch an admin declared the OSD lost (`osd lost N`), 0 = never. While
    /// `lost_at > up_from` peering no longer waits for it: the writes only
    /// it may hold are given up.
    pub lost_at: Epoch,
    pub last_reported: Option<OsdReported>,
}

/// Replicated or erasure-coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PoolKind {
    Replicated,
    Erasure,
}

impl PoolKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::Replicated => "replicated",
            PoolKind::Erasure => "erasure",
        }
    }
}

/// A pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    pub id: u64,
    pub name: String,
    pub kind: PoolKind,
    pub size: u32,
    pub min_size: u32,
    pub pg_num: u32,
    pub pgp_num: u32,
    pub crush_rule: i32,
    pub ec_profile: Option<String>,
    /// Application name -> its key/value settings (e.g. `rbd`, `cephfs`).
    pub applications: BTreeMap<String, BTreeMap<String, String>>,
    pub allow_ec_overwrites: bool,
    pub bulk: bool,
    pub target_size_ratio: f64,
    /// 0 = no quota.
    pub quota_max_bytes: u64,
    /// 0 = no quota.
    pub quota_max_objects: u64,
    /// Bytes per full EC stripe (k * stripe_unit); 0 for replicated pools.
    pub stripe_width: u64,
    pub created: Epoch,
    pub last_change: Epoch,
    /// Newest self-managed snapshot id handed out for this pool (ids are
    /// unique per pool, cluster-wide; 0 = none yet).
    pub snap_seq: u64,
}

/// An erasure-code profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcProfile {
    pub k: u32,
    pub m: u32,
    pub crush_failure_domain: String,
    pub crush_device_class: Option<String>,
    pub crush_root: String,
    pub stripe_unit: u64,
    pub plugin: String,
    pub technique: String,
}

/// Cluster-wide OSD map flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum OsdFlag {
    NoOut,
    NoIn,
    NoUp,
    NoDown,
    NoBackfill,
    NoRecover,
    NoRebalance,
    NoScrub,
    NoDeepScrub,
    Pause,
}

impl OsdFlag {
    pub const ALL: [OsdFlag; 10] = [
        OsdFlag::NoOut,
        OsdFlag::NoIn,
        OsdFlag::NoUp,
        OsdFlag::NoDown,
        OsdFlag::NoBackfill,
        OsdFlag::NoRecover,
        OsdFlag::NoRebalance,
        OsdFlag::NoScrub,
        OsdFlag::NoDeepScrub,
        OsdFlag::Pause,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OsdFlag::NoOut => "noout",
            OsdFlag::NoIn => "noin",
            OsdFlag::NoUp => "noup",
            OsdFlag::NoDown => "nodown",
            OsdFlag::NoBackfill => "nobackfill",
            OsdFlag::NoRecover => "norecover",
            OsdFlag::NoRebalance => "norebalance",
            OsdFlag::NoScrub => "noscrub",
            OsdFlag::NoDeepScrub => "nodeep-scrub",
            OsdFlag::Pause => "pause",
        }
    }
}

impl fmt::Display for OsdFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OsdFlag {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OsdFlag::ALL
            .iter()
            .copied()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = OsdFlag::ALL.iter().map(|f| f.as_str()).collect();
                format!("unknown flag '{s}' (known: {})", names.join(", "))
            })
    }
}

/// An authenticated entity: its secret and its caps per service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthEntity {
    /// The secret key as base64 text (32 random bytes).
    pub key: String,
    /// Service (`mon`, `osd`, `mds`, `mgr`) -> cap text (`allow rw pool=rbd`).
    pub caps: BTreeMap<String, String>,
}

impl AuthEntity {
    /// An entity with the given 32-byte secret and caps (not validated here;
    /// `ClusterMap::new_cluster` and the auth commands validate).
    pub fn new(secret: &[u8; 32], caps: &[(&str, &str)]) -> AuthEntity {
        AuthEntity {
            key: encode_secret(secret),
            caps: caps
                .iter()
                .map(|(s, c)| (s.to_string(), c.to_string()))
                .collect(),
        }
    }
}

/// Base64 text of a secret, as stored in keyrings.
pub fn encode_secret(secret: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(secret)
}

/// Decodes a keyring secret; errors say what was wrong.
pub fn decode_secret(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("key is not valid base64: {e}"))
}

/// The cluster map. Everything here is replicated by the monitors; `epoch`
/// grows by one per change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterMap {
    pub fsid: String,
    pub epoch: Epoch,
    pub mons: Vec<MonInfo>,
    pub osds: BTreeMap<i32, OsdInfo>,
    pub crush: CrushMap,
    pub pools: BTreeMap<u64, Pool>,
    pub ec_profiles: BTreeMap<String, EcProfile>,
    pub flags: BTreeSet<OsdFlag>,
    #[serde(with = "auth_as_seq")]
    pub auth: BTreeMap<EntityName, AuthEntity>,
    /// (section, key) -> value; sections are `global`, `mon`, `osd`, `mds`,
    /// `mgr`, `client` or an entity such as `osd.3`; keys are normalised
    /// (underscores).
    #[serde(with = "config_as_seq")]
    pub config: BTreeMap<(String, String), String>,
    /// `pg_temp`: the acting set a PG's primary asked for while members of
    /// the up set are backfilled (replicated pools only). Cleared by the
    /// primary when backfill completes, and by the map itself when it equals
    /// the up set or names an OSD that no longer exists.
    #[serde(with = "pg_temp_as_seq")]
    pub pg_temp: BTreeMap<PgId, Vec<i32>>,
    /// Highest pool id ever handed out (ids are never reused).
    pub pool_max: u64,
    /// Epoch the cluster was created in.
    pub created: Epoch,
    /// Operator scrub orders not yet reported done, by PG (`crate::scrub`).
    #[serde(default)]
    pub scrub_orders: Vec<crate::scrub::ScrubOrder>,
    /// Per replicated PG, the acting sets it may have gone active with,
    /// oldest first (`crate::pghistory`): a primary records its acting set
    /// here before the PG accepts a write, so a later primary that never
    /// saw those intervals still knows whose copies it must reach.
    #[serde(default, with = "pg_history_as_seq")]
    pub pg_history: BTreeMap<PgId, Vec<PgActivation>>,
    /// `full_ratio`, `backfillfull_ratio`, `nearfull_ratio` (`crate::fullness`).
    #[serde(default)]
    pub full_ratios: crate::fullness::FullRatios,
    /// OSDs the monitors marked nearfull, backfillfull or full from their
    /// reported usage (absent = below every ratio).
    #[serde(default)]
    pub osd_fullness: BTreeMap<i32, crate::fullness::OsdFullness>,
    /// Client instances whose ops the OSDs refuse (`crate::blocklist`).
    #[serde(default, with = "crate::blocklist::as_seq")]
    pub blocklist: BTreeMap<crate::blocklist::ClientInstance, crate::blocklist::BlocklistEntry>,
}

/// An interval in which a PG may have gone active (and accepted writes):
/// its first epoch as its primary saw it, and its acting set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgActivation {
    pub since: Epoch,
    pub acting: Vec<i32>,
}

/// Serialises the auth table as a list so JSON (string-keyed maps) can hold it.
mod auth_as_seq {
    use super::AuthEntity;
    use cairn_types::EntityName;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<EntityName, AuthEntity>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let v: Vec<(&EntityName, &AuthEntity)> = map.iter().collect();
        v.serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<EntityName, AuthEntity>, D::Error> {
        let v: Vec<(EntityName, AuthEntity)> = Vec::deserialize(d)?;
        Ok(v.into_iter().collect())
    }
}

/// Serialises the pg_temp table as a list so JSON can hold it.
mod pg_temp_as_seq {
    use cairn_types::PgId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<PgId, Vec<i32>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let v: Vec<(&PgId, &Vec<i32>)> = map.iter().collect();
        v.serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<PgId, Vec<i32>>, D::Error> {
        let v: Vec<(PgId, Vec<i32>)> = Vec::deserialize(d)?;
        Ok(v.into_iter().collect())
    }
}

/// Serialises the PG history table as a list so JSON can hold it.
mod pg_history_as_seq {
    use super::PgActivation;
    use cairn_types::PgId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<PgId, Vec<PgActivation>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let v: Vec<(&PgId, &Vec<PgActivation>)> = map.iter().collect();
        v.serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<PgId, Vec<PgActivation>>, D::Error> {
        let v: Vec<(PgId, Vec<PgActivation>)> = Vec::deserialize(d)?;
        Ok(v.into_iter().collect())
    }
}

/// Serialises the config table as (section, key, value) triples.
mod config_as_seq {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<(String, String), String>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let v: Vec<(&str, &str, &str)> = map
            .iter()
            .map(|((sec, k), v)| (sec.as_str(), k.as_str(), v.as_str()))
            .collect();
        v.serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<(String, String), String>, D::Error> {
        let v: Vec<(String, String, String)> = Vec::deserialize(d)?;
        Ok(v.into_iter().map(|(s, k, v)| ((s, k), v)).collect())
    }
}

/// Facts a mutation needs that must not be computed inside `apply` (so every
/// monitor computes the same map): who asked, and any random secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyContext {
    pub caller: EntityName,
    /// Supplied by the proposing monitor for commands that create a key
    /// (`auth get-or-create`, `OsdNew`), so that apply stays deterministic.
    pub generated_secret: Option<[u8; 32]>,
}

/// What the monitor runtime knows that is not in the map.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RuntimeStatus {
    /// Quorum members, clock offsets and insecure key files (health inputs).
    pub health: HealthInputs,
    /// Name of the current Raft leader, if known.
    pub leader: Option<String>,
    /// Seconds since the current quorum formed.
    pub quorum_age_secs: u64,
}

/// Context of a read-only command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryContext {
    pub caller: EntityName,
    pub runtime: RuntimeStatus,
}

/// The answer to a command: plain text shaped like Ceph's, the same in JSON,
/// and binary data for commands that return a blob (`osd getcrushmap`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub plain: String,
    /// Carried as JSON text on the wire (postcard cannot hold a free-form value).
    #[serde(with = "json_as_text")]
    pub json: serde_json::Value,
    pub data: Vec<u8>,
}

impl Reply {
    pub fn new(plain: impl Into<String>, json: serde_json::Value) -> Reply {
        Reply {
            plain: plain.into(),
            json,
            data: Vec::new(),
        }
    }
}

/// Serialises a JSON value as its text, so binary encodings can carry it.
mod json_as_text {
    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &serde_json::Value, s: S) -> Result<S::Ok, S::Error> {
        v.to_string().serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<serde_json::Value, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map_err(D::Error::custom)
    }
}

/// One committed change: replaying `apply(cmd, ctx)` on the map at
/// `epoch - 1` yields the map at `epoch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Incremental {
    /// The epoch this change produces.
    pub epoch: Epoch,
    pub cmd: crate::MonCommand,
    pub ctx: ApplyContext,
}
