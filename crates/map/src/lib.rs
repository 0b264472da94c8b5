//! The Cairn cluster map and every decision about it, as a pure,
//! deterministic library: monitors, OSDs, the CRUSH map, pools, EC profiles,
//! cluster flags, auth entities and central config; the admin command
//! grammar (`parse_command`), mutations (`ClusterMap::apply`), reads
//! (`ClusterMap::query`) and health checks (`ClusterMap::health`).
//!
//! No I/O, no clocks, no randomness: whatever varies (the caller, a fresh
//! secret, quorum and clock offsets) comes in as arguments, so every monitor
//! that applies the same commands holds the same map, and clients replaying
//! [`Incremental`]s follow it exactly. Raft, persistence and the network are
//! the monitor runtime's (`cairn-mon`).

mod apply;
pub mod blocklist;
pub mod caps;
mod command;
pub mod config;
mod decisions;
mod ecprofile;
mod error;
pub mod failure;
pub mod fullness;
pub mod health;
mod model;
mod parse;
mod pghistory;
pub mod pgmap;
mod pgquery;
mod pgtemp;
mod query;
pub mod scrub;

pub use apply::{
    AUTH_ENTITIES_MAX, CONFIG_ENTRIES_MAX, CRUSH_RULES_MAX, CRUSH_WEIGHT_MAX_TIB, EC_PROFILES_MAX,
    MAP_FORMAT_VERSION, MAP_MAX_BYTES, MONS_MAX, NAME_MAX_LEN, OSD_ADDRS_MAX, OSD_STATE_MAX_LEN,
    POOLS_MAX, POOL_PG_NUM_MAX, POOL_SET_KEYS, POOL_SIZE_MAX,
};
pub use blocklist::{BlocklistEntry, BlocklistExpiry, ClientInstance};
pub use caps::{Caps, CapsError, CapsNeed, Perms};
pub use command::{MonCommand, OsdSelector};
pub use decisions::{stable_mod, PgMapping};
pub use ecprofile::EC_MAX_CHUNKS;
pub use error::{CommandError, ErrorKind, ParseError};
pub use failure::FailureJudge;
pub use fullness::{FullRatioKind, FullRatios, FullState, OsdFullness, OSD_FAILSAFE_FULL_RATIO};
pub use health::{HealthCheck, HealthInputs, HealthReport, HealthStatus, PlacementShortfall};
pub use model::{
    decode_secret, encode_secret, ApplyContext, AuthEntity, ClusterMap, EcProfile, Incremental,
    MonInfo, OsdFlag, OsdInfo, OsdReported, PgActivation, Pool, PoolKind, QueryContext, Reply,
    RuntimeStatus,
};
pub use parse::{
    command_help, input_file_arg, output_file_arg, parse_command, parse_command_with_input,
    parse_osd_id,
};
pub use pghistory::{activation_spans, PG_HISTORY_MAX};
pub use pgmap::{
    BackfillProgress, OsdBeacon, OsdStatsEntry, PgEntry, PgMapView, PgRecoveryCounts, PgReport,
    PgTotals, RecoveryRate,
};
pub use query::{format_age, format_bytes};
pub use scrub::{
    InconsistentObjectReport, PgScrubReport, ScrubKind, ScrubOrder, ShardErrorReport,
    SCRUB_REPORT_OBJECTS_MAX,
};
