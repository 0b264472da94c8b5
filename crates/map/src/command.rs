//! The commands the monitors accept: one variant per admin verb, plus the
//! internal ones daemons send (mon add/remove, OSD new/boot/alive/failure).
//! Parsing from words lives in `parse`, effects in `apply` and `query`.

use crate::caps::{CapsNeed, Perms};
use crate::model::{OsdFlag, OsdReported, PoolKind};
use cairn_types::{EntityName, Epoch, PgId};
use serde::{Deserialize, Serialize};

/// A set of OSDs named on the command line: explicit ids, or `all`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OsdSelector {
    All,
    Ids(Vec<i32>),
}

/// Every command of the cluster map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MonCommand {
    // ---- read-only ----
    Status,
    Health {
        detail: bool,
    },
    QuorumStatus,
    MonStat,
    MonDump,
    OsdTree,
    OsdDump,
    OsdLs,
    OsdStat,
    CrushRuleLs,
    CrushRuleDump {
        name: Option<String>,
    },
    GetCrushMap,
    EcProfileLs,
    EcProfileGet {
        name: String,
    },
    PoolLs {
        detail: bool,
    },
    PoolGet {
        pool: String,
        key: String,
    },
    AuthLs,
    AuthGet {
        entity: EntityName,
    },
    /// The key alone (`auth print-key`), for scripts.
    AuthPrintKey {
        entity: EntityName,
    },
    /// Where a PG is placed now (`pg map 1.1f`).
    PgMap {
        pgid: PgId,
    },
    ConfigGet {
        who: String,
        key: Option<String>,
    },
    ConfigDump,

    // ---- admin mutations ----
    OsdSetFlag {
        flag: OsdFlag,
    },
    OsdUnsetFlag {
        flag: OsdFlag,
    },
    CrushRuleCreateReplicated {
        name: String,
        root: String,
        failure_domain: String,
        class: Option<String>,
    },
    CrushRuleCreateErasure {
        name: String,
        profile: String,
    },
    CrushRuleRm {
        name: String,
    },
    CrushSetDeviceClass {
        class: String,
        osds: OsdSelector,
    },
    /// `class`: when given, each OSD must currently have this class.
    CrushRmDeviceClass {
        class: Option<String>,
        osds: OsdSelector,
    },
    CrushReweight {
        osd: i32,
        weight: f64,
    },
    OsdReweight {
        osd: i32,
        weight: f64,
    },
    /// The compiled CRUSH map (`CrushMap::encode`), or its text form.
    SetCrushMap {
        encoded: Vec<u8>,
    },
    EcProfileSet {
        name: String,
        params: Vec<(String, String)>,
        force: bool,
    },
    EcProfileRm {
        name: String,
    },
    PoolCreate {
        name: String,
        pg_num: Option<u32>,
        pgp_num: Option<u32>,
        kind: PoolKind,
        /// EC pools only; `default` when not given.
        profile: Option<String>,
        rule: Option<String>,
    },
    PoolSet {
        pool: String,
        key: String,
        value: String,
        /// `--yes-i-really-mean-it` (needed for size 1).
        sure: bool,
    },
    PoolApplicationEnable {
        pool: String,
        app: String,
    },
    /// Allocates a self-managed snapshot id in a pool (RBD snapshots).
    PoolSnapAllocate {
        pool: String,
    },
    PoolDelete {
        pool: String,
        confirm: String,
        sure: bool,
    },
    AuthGetOrCreate {
        entity: EntityName,
        caps: Vec<(String, String)>,
    },
    AuthDel {
        entity: EntityName,
    },
    AuthCaps {
        entity: EntityName,
        caps: Vec<(String, String)>,
    },
    ConfigSet {
        who: String,
        key: String,
        value: String,
        /// Store an option the monitors do not know.
        force: bool,
    },
    ConfigRm {
        who: String,
        key: String,
    },
    /// `osd down N…` (admin): marks OSDs down; they come back up when they boot.
    OsdDown {
        ids: Vec<i32>,
    },
    OsdOut {
        ids: Vec<i32>,
    },
    OsdIn {
        ids: Vec<i32>,
    },
    /// `osd purge N --yes-i-really-mean-it`: removes a down OSD from the OSD
    /// map, CRUSH and auth.
    OsdPurge {
        id: i32,
        sure: bool,
    },
    /// `osd lost N --yes-i-really-mean-it`: a down OSD will not come back;
    /// peering stops waiting for it (its unreplicated writes are given up).
    OsdLost {
        id: i32,
        sure: bool,
    },

    // ---- internal (daemons and the monitor runtime) ----
    MonAdd {
        name: String,
        addr: String,
    },
    MonRemove {
        name: String,
    },
    /// Registers a new OSD (or returns the id of the one with this uuid).
    /// Places it in CRUSH at host=<host> under root default; creates its
    /// `osd.N` key when the context carries a secret.
    OsdNew {
        uuid: String,
        /// Wanted id (e.g. re-creating a purged OSD); lowest free id otherwise.
        id: Option<i32>,
        host: String,
        /// CRUSH weight in TiB (usually the device size).
        weight: f64,
        class: Option<String>,
    },
    /// An OSD process started and asks to be marked up.
    OsdBoot {
        id: i32,
        uuid: String,
        addrs: Vec<String>,
        reported: OsdReported,
    },
    /// An OSD asks for `up_thru` to reach `want` before going active, and
    /// to record the acting sets of the PGs it is about to activate as
    /// primary (`ClusterMap::pg_history`).
    OsdAlive {
        id: i32,
        want: Epoch,
        #[serde(default)]
        activating: Vec<(PgId, crate::model::PgActivation)>,
    },
    /// A PG's primary `from` asks for `pg_temp` = `osds` (the complete
    /// members that serve while the up set backfills); empty = clear it.
    PgTemp {
        from: i32,
        pgid: PgId,
        osds: Vec<i32>,
    },
    /// The monitors judged an OSD failed from peer reports (respects `nodown`).
    OsdFailed {
        id: i32,
    },
    /// `mon_osd_down_out_interval` elapsed for a down OSD (respects `noout`).
    OsdAutoOut {
        id: i32,
    },

    // ---- read-only, answered from the leader's PG statistics ----
    /// `pg stat`: PG counts by state, objects, usage.
    PgStat,
    /// `pg dump [pgs_brief]` / `pg ls`: every PG with its state.
    PgDump {
        brief: bool,
    },
    /// `osd df [tree]`: per-OSD usage and PG counts.
    OsdDf {
        tree: bool,
    },
    /// `pg PGID query`: a PG's placement and its primary's report.
    PgQuery {
        pgid: PgId,
    },

    // ---- reports from OSDs to the monitor leader (never in the map) ----
    /// OSD `id` is alive; its store usage and the PGs it is primary for.
    OsdBeacon {
        id: i32,
        beacon: crate::pgmap::OsdBeacon,
    },
    /// OSD `id` reports that `target` missed its heartbeats for
    /// `osd_heartbeat_grace` (`failed`), or withdraws that report.
    OsdFailureReport {
        id: i32,
        target: i32,
        failed: bool,
    },

    // ---- scrub (crate::scrub; last, so earlier variants keep their encoding) ----
    /// `rados list-inconsistent-obj PGID`: the primary's last scrub findings.
    PgListInconsistent {
        pgid: PgId,
    },
    /// `pg scrub|deep-scrub|repair PGID`: an order the PG's primary carries out.
    PgScrub {
        pgid: PgId,
        kind: crate::scrub::ScrubKind,
    },
    /// `osd scrub|deep-scrub|repair N|all`: orders for every PG whose primary is one of them.
    OsdScrub {
        osds: OsdSelector,
        kind: crate::scrub::ScrubKind,
    },
    /// Internal (monitor leader): these orders were carried out (PG, order id done).
    ScrubOrdersDone {
        done: Vec<(PgId, u64)>,
    },

    // ---- full disks (crate::fullness; last, so earlier variants keep their encoding) ----
    /// `osd set-nearfull-ratio|set-backfillfull-ratio|set-full-ratio R`.
    OsdSetFullRatio {
        which: crate::fullness::FullRatioKind,
        ratio: f64,
    },
    /// Internal (monitor leader): osd.`id` reported `used_bytes` of
    /// `total_bytes` and its nearfull/backfillfull/full mark changes.
    OsdFullness {
        id: i32,
        used_bytes: u64,
        total_bytes: u64,
    },

    // ---- client blocklist (crate::blocklist; last, so earlier variants keep their encoding) ----
    /// `osd blocklist add CLIENT [--expire SECONDS]`.
    OsdBlocklistAdd {
        client: crate::blocklist::ClientInstance,
        expire_secs: Option<u64>,
    },
    /// `osd blocklist rm CLIENT`.
    OsdBlocklistRm {
        client: crate::blocklist::ClientInstance,
    },
    /// `osd blocklist ls`.
    OsdBlocklistLs,
    /// Internal (monitor leader): the entry added in epoch `added` lasted
    /// its duration on the leader's clock.
    OsdBlocklistExpire {
        client: crate::blocklist::ClientInstance,
        added: Epoch,
    },
}

impl MonCommand {
    /// True when the command may change the map (and so goes through Raft).
    pub fn is_mutation(&self) -> bool {
        use MonCommand::*;
        !matches!(
            self,
            Status
                | Health { .. }
                | QuorumStatus
                | MonStat
                | MonDump
                | OsdTree
                | OsdDump
                | OsdLs
                | OsdStat
                | CrushRuleLs
                | CrushRuleDump { .. }
                | GetCrushMap
                | EcProfileLs
                | EcProfileGet { .. }
                | PoolLs { .. }
                | PoolGet { .. }
                | AuthLs
                | AuthGet { .. }
                | AuthPrintKey { .. }
                | PgMap { .. }
                | ConfigGet { .. }
                | ConfigDump
                | PgStat
                | PgDump { .. }
                | OsdDf { .. }
                | PgQuery { .. }
                | PgListInconsistent { .. }
                | OsdBeacon { .. }
                | OsdFailureReport { .. }
                | OsdBlocklistLs
        )
    }

    /// True for reports OSDs send the monitor leader (beacons, failure
    /// reports): neither queries of the map nor changes to it.
    pub fn is_report(&self) -> bool {
        matches!(
            self,
            MonCommand::OsdBeacon { .. } | MonCommand::OsdFailureReport { .. }
        )
    }

    /// True for queries answered from the leader's PG statistics (a
    /// follower sends the caller to the leader).
    pub fn needs_pg_stats(&self) -> bool {
        use MonCommand::*;
        matches!(
            self,
            Status
                | Health { .. }
                | PgStat
                | PgDump { .. }
                | OsdDf { .. }
                | PgQuery { .. }
                | PgListInconsistent { .. }
        )
    }

    /// What the caller's caps must grant. Reads need `mon r`; changes need
    /// `mon rw`; anything that reveals or changes keys, and monitor
    /// membership, needs `mon rwx` (`auth ls`/`get`: `mon rx`). OSDs may boot
    /// and report for themselves.
    pub fn required_caps(&self) -> CapsNeed {
        use MonCommand::*;
        match self {
            AuthLs | AuthGet { .. } | AuthPrintKey { .. } => CapsNeed::mon(Perms::RX),
            AuthGetOrCreate { .. } | AuthDel { .. } | AuthCaps { .. } => CapsNeed::mon(Perms::RWX),
            MonAdd { .. } | MonRemove { .. } | OsdFailed { .. } | OsdAutoOut { .. } => {
                CapsNeed::mon(Perms::RWX)
            }
            OsdNew { .. }
            | OsdPurge { .. }
            | OsdLost { .. }
            | ScrubOrdersDone { .. }
            | OsdFullness { .. }
            | OsdBlocklistExpire { .. } => CapsNeed::mon(Perms::RWX),
            OsdBoot { id, .. }
            | OsdAlive { id, .. }
            | PgTemp { from: id, .. }
            | OsdBeacon { id, .. }
            | OsdFailureReport { id, .. } => CapsNeed {
                or_entity: Some(EntityName::osd(*id)),
                ..CapsNeed::mon(Perms::RWX)
            },
            c if c.is_mutation() => CapsNeed::mon(Perms::RW),
            _ => CapsNeed::mon(Perms::R),
        }
    }

    /// Short name of the command for logs (`osd pool create`).
    pub fn verb(&self) -> &'static str {
        use MonCommand::*;
        match self {
            Status => "status",
            Health { .. } => "health",
            QuorumStatus => "quorum_status",
            MonStat => "mon stat",
            MonDump => "mon dump",
            OsdTree => "osd tree",
            OsdDump => "osd dump",
            OsdLs => "osd ls",
            OsdStat => "osd stat",
            CrushRuleLs => "osd crush rule ls",
            CrushRuleDump { .. } => "osd crush rule dump",
            GetCrushMap => "osd getcrushmap",
            EcProfileLs => "osd erasure-code-profile ls",
            EcProfileGet { .. } => "osd erasure-code-profile get",
            PoolLs { .. } => "osd pool ls",
            PoolGet { .. } => "osd pool get",
            AuthLs => "auth ls",
            AuthGet { .. } => "auth get",
            AuthPrintKey { .. } => "auth print-key",
            PgMap { .. } => "pg map",
            ConfigGet { .. } => "config get",
            ConfigDump => "config dump",
            OsdSetFlag { .. } => "osd set",
            OsdUnsetFlag { .. } => "osd unset",
            CrushRuleCreateReplicated { .. } => "osd crush rule create-replicated",
            CrushRuleCreateErasure { .. } => "osd crush rule create-erasure",
            CrushRuleRm { .. } => "osd crush rule rm",
            CrushSetDeviceClass { .. } => "osd crush set-device-class",
            CrushRmDeviceClass { .. } => "osd crush rm-device-class",
            CrushReweight { .. } => "osd crush reweight",
            OsdReweight { .. } => "osd reweight",
            SetCrushMap { .. } => "osd setcrushmap",
            EcProfileSet { .. } => "osd erasure-code-profile set",
            EcProfileRm { .. } => "osd erasure-code-profile rm",
            PoolCreate { .. } => "osd pool create",
            PoolSet { .. } => "osd pool set",
            PoolApplicationEnable { .. } => "osd pool application enable",
            PoolSnapAllocate { .. } => "osd pool selfmanaged-snap allocate",
            PoolDelete { .. } => "osd pool delete",
            AuthGetOrCreate { .. } => "auth get-or-create",
            AuthDel { .. } => "auth del",
            AuthCaps { .. } => "auth caps",
            ConfigSet { .. } => "config set",
            ConfigRm { .. } => "config rm",
            OsdDown { .. } => "osd down",
            OsdOut { .. } => "osd out",
            OsdIn { .. } => "osd in",
            OsdPurge { .. } => "osd purge",
            OsdLost { .. } => "osd lost",
            PgTemp { .. } => "osd pg-temp",
            MonAdd { .. } => "mon add",
            MonRemove { .. } => "mon remove",
            OsdNew { .. } => "osd new",
            OsdBoot { .. } => "osd boot",
            OsdAlive { .. } => "osd alive",
            OsdFailed { .. } => "osd failed",
            OsdAutoOut { .. } => "osd auto-out",
            PgStat => "pg stat",
            PgDump { .. } => "pg dump",
            OsdDf { .. } => "osd df",
            PgQuery { .. } => "pg query",
            PgListInconsistent { .. } => "rados list-inconsistent-obj",
            PgScrub { kind, .. } => match kind {
                crate::scrub::ScrubKind::Scrub => "pg scrub",
                crate::scrub::ScrubKind::Deep => "pg deep-scrub",
                crate::scrub::ScrubKind::Repair => "pg repair",
            },
            OsdScrub { kind, .. } => match kind {
                crate::scrub::ScrubKind::Scrub => "osd scrub",
                crate::scrub::ScrubKind::Deep => "osd deep-scrub",
                crate::scrub::ScrubKind::Repair => "osd repair",
            },
            ScrubOrdersDone { .. } => "scrub orders done",
            OsdSetFullRatio { which, .. } => match which {
                crate::fullness::FullRatioKind::Nearfull => "osd set-nearfull-ratio",
                crate::fullness::FullRatioKind::Backfillfull => "osd set-backfillfull-ratio",
                crate::fullness::FullRatioKind::Full => "osd set-full-ratio",
            },
            OsdFullness { .. } => "osd fullness",
            OsdBlocklistAdd { .. } => "osd blocklist add",
            OsdBlocklistRm { .. } => "osd blocklist rm",
            OsdBlocklistLs => "osd blocklist ls",
            OsdBlocklistExpire { .. } => "osd blocklist expire",
            OsdBeacon { .. } => "osd beacon",
            OsdFailureReport { .. } => "osd failure report",
        }
    }
}
