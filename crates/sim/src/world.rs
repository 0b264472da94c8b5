//! The simulated world of one seed: the event scheduler (simulated time,
//! ties broken by insertion order), the network (per-link FIFO like a TCP
//! connection, random delays so links reorder against each other,
//! duplicates, connection resets, partitions), per-node clocks (offset,
//! drift, forward jumps), the monitor (the real `ClusterMap::apply` and
//! `FailureJudge`, without Raft: one monitor that never fails), the
//! clients with their oracle, and the fault schedule. The OSDs are in
//! `osd.rs`. Nothing here reads the wall clock, spawns a thread or iterates
//! a HashMap.

use crate::disk::SimDisk;
use crate::osd::{OsdProc, RepOpMsg};
use crate::rng::Rng;
use cairn_map::{
    ApplyContext, AuthEntity, ClusterMap, FailureJudge, FullState, MonCommand, MonInfo, OsdFlag,
    OsdReported, PoolKind,
};
use cairn_ops::{
    LogEntry, ObjectName, OpError, OpReply, OpRequest, OpStatus, PgInfo, PgPush, PullReply,
    PullWhat, ReqId, SubOp, SubOpOutput,
};
use cairn_types::{EntityName, Epoch, PgId, PoolId};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Simulated (true) time in microseconds.
pub type Time = u64;

pub const MS: Time = 1_000;
pub const SEC: Time = 1_000_000;

/// The pool every workload object lives in.
pub const POOL: u64 = 1;

/// A node of the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ep {
    Mon,
    Osd(i32),
    Client(u32),
}

/// Every message of the simulated protocol (the real ones' content, not
/// their encoding: cairn-msg's framing and auth are tested on their own).
#[derive(Debug, Clone)]
pub enum Msg {
    MonCmd(MonCommand),
    /// Send me the current map if it is newer than `have`.
    MapSub {
        have: Epoch,
    },
    Map(Arc<ClusterMap>),
    Op(OpRequest),
    OpReply(OpReply),
    RepOp(RepOpMsg),
    RepAck {
        pgid: PgId,
        from: i32,
        seq: u64,
        interval_since: Epoch,
    },
    /// A sub-op refused because the member's interval (from `theirs`)
    /// began after the sender's `interval_since` (`RepOpAck::newer_interval`).
    RepStale {
        pgid: PgId,
        from: i32,
        interval_since: Epoch,
        theirs: Epoch,
    },
    /// Primary -> member: send me your copy of `oid` (mine is damaged).
    FetchObj {
        pgid: PgId,
        oid: ObjectName,
        from: i32,
        interval_since: Epoch,
    },
    /// Member -> primary: its copy of `oid` (None: it has none).
    FetchedObj {
        pgid: PgId,
        oid: ObjectName,
        from: i32,
        interval_since: Epoch,
        last_update: cairn_ops::Version,
        state: Option<cairn_ops::ObjectState>,
    },
    /// A sub-op the member could not make durable (its disk is full):
    /// the runtime's `RepOpAck` with an error.
    RepFailed {
        pgid: PgId,
        from: i32,
        seq: u64,
        interval_since: Epoch,
        error: OpError,
    },
    Query {
        call: u64,
        pgid: PgId,
        from: i32,
        epoch: Epoch,
    },
    Notify {
        call: u64,
        from: i32,
        info: Option<PgInfo>,
        log: Vec<LogEntry>,
        /// EC: the shard position the answering copy holds.
        shard: Option<u8>,
        /// EC: the copies the answering OSD keeps of other positions
        /// (parked by a shard move), as the runtime's `PgNotify::kept`.
        kept: Vec<(u8, PgInfo, Vec<LogEntry>)>,
    },
    /// EC primary -> shard: undo these entries (oldest first) from their
    /// rollback stashes.
    EcRollback {
        call: u64,
        pgid: PgId,
        from: i32,
        epoch: Epoch,
        entries: Vec<LogEntry>,
        /// In the copy of this position (one parked by a shard move, a
        /// rebuild source), as the runtime's `EcRollback::shard`.
        shard: Option<u8>,
    },
    EcRollbackReply {
        call: u64,
        from: i32,
        result: Result<(), String>,
    },
    Pull {
        call: u64,
        pgid: PgId,
        what: PullWhat,
        /// EC: from the copy of this shard position (the one served, or
        /// one parked by a shard move), as the runtime's `PgPull::shard`.
        shard: Option<u8>,
    },
    PullReply {
        call: u64,
        from: i32,
        reply: PullReply,
        /// The pull's `shard`, echoed.
        shard: Option<u8>,
    },
    Push {
        call: u64,
        push: PgPush,
    },
    PushReply {
        call: u64,
        from: i32,
        result: Result<(), String>,
    },
    Ping {
        from: i32,
    },
    Pong {
        from: i32,
    },
    /// Primary -> backfill target (on the sub-ops' link, so ordered with them).
    Backfill(cairn_ops::PgBackfill),
    BackfillAck(cairn_ops::PgBackfillAck),
    /// Primary of a clean PG -> stray copy: delete it.
    PgRemove(cairn_ops::PgRemove),
    /// Stray copy -> acting primary: I still hold a copy.
    PgStray(cairn_ops::PgStray),
}

/// A node's clock: `local = true * (1 + drift) + offset + jumps`. Only
/// forward jumps (a monotonic clock never goes back; a paused VM's does
/// leap forward).
#[derive(Debug, Clone, Default)]
pub struct Clock {
    pub offset_us: u64,
    pub drift_ppm: i64,
    pub jumped_us: u64,
}

impl Clock {
    pub fn local(&self, now: Time) -> Time {
        let drifted = (now as i128 * (1_000_000 + self.drift_ppm as i128) / 1_000_000) as u64;
        drifted + self.offset_us + self.jumped_us
    }
}

/// What happens at a point of simulated time.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one queue of events; boxing gains nothing here
pub enum Ev {
    Deliver {
        from: Ep,
        to: Ep,
        gen: u64,
        to_inc: u64,
        msg: Msg,
    },
    OsdTick(i32, u64),
    HbTick(i32, u64),
    DiskSync(i32, u64, u64),
    MonTick,
    ClientTick(u32),
    Fault,
    Restart(i32),
    HealPartition(u64),
    MarkIn(i32),
    /// The full disk of an OSD has room again (data deleted elsewhere,
    /// capacity added).
    DiskRoom(i32),
    /// The operator unsets a flag it set.
    UnsetFlag(OsdFlag),
    /// Other data on an OSD's disk is deleted (its reported use drops).
    UsageDrop(i32),
    EndFaults,
    Check,
}

#[derive(Debug, Clone, Copy, Default)]
struct Link {
    gen: u64,
    last_at: Time,
}

/// Which faults a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultProfile {
    /// Crashes and restarts, partitions, connection resets, duplicates,
    /// clock jumps and drift, slow networks; no placement changes (no
    /// out/in, reweight or new OSDs, no automatic out). What CI runs.
    Basic,
    /// Basic plus placement changes: admin out/in, reweight, new OSDs,
    /// and automatic out after 10 s down, and the disk faults of `Disk`.
    Full,
    /// Basic plus disk faults: a disk that fills up (and gets room again a
    /// few seconds later), a commit that fails with EIO (the OSD stops),
    /// damaged objects (reads of them fail).
    Disk,
    /// Basic's faults on an erasure-coded pool (2+1 over hosts or 4+2
    /// over OSDs, min_size k+1 or k): shard positions stay put, so no
    /// placement changes (the simulator does not drive backfill).
    Ec,
    /// `full`'s faults on an erasure-coded pool (placement changes that
    /// are undone when faults stop: out/in, reweight, automatic out; flags,
    /// usage marks, throttles; failing commits; no new OSDs): shards move,
    /// and activation rebuilds them from k up-to-date shards or waits,
    /// down, saying for what.
    EcMove,
    /// A growing cluster, on a replicated or (half the seeds) an
    /// erasure-coded pool: `full`'s faults (`ecmove`'s on EC) with new
    /// OSDs joining more often — on EC too, whose new members are rebuilt
    /// inside activation — and the `noin` flag: the operator sets it while
    /// a new OSD joins or an OSD is down long enough to be marked out;
    /// their boots leave them out; when the operator unsets it, it marks
    /// them in (`osd in`), as after Ceph's `noin`.
    Grow,
}

impl std::str::FromStr for FaultProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "basic" => Ok(FaultProfile::Basic),
            "full" => Ok(FaultProfile::Full),
            "disk" => Ok(FaultProfile::Disk),
            "ec" => Ok(FaultProfile::Ec),
            "ecmove" => Ok(FaultProfile::EcMove),
            "grow" => Ok(FaultProfile::Grow),
            other => Err(format!(
                "unknown fault profile '{other}' (basic, disk, full, ec, ecmove or grow)"
            )),
        }
    }
}

/// Tunables of one run (all derived from the seed).
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub profile: FaultProfile,
    pub hosts: u32,
    pub osds_per_host: u32,
    pub pg_num: u32,
    pub clients: u32,
    pub objects: u32,
    pub fault_phase: Time,
    /// After faults stop, every PG must be active+clean within this.
    pub heal_bound: Time,
    pub min_log_entries: usize,
    pub max_log_entries: usize,
    pub peer_timeout: Time,
    pub op_timeout: Time,
    /// Parts per million of messages duplicated during the fault phase.
    pub dup_ppm: u64,
    /// Mean gap between two faults.
    pub fault_gap: Time,
    /// EC profile only: (k, m, min_size, CRUSH failure domain).
    pub ec: Option<(u32, u32, u32, &'static str)>,
    /// Objects per background backfill batch (small, so that a PG's few
    /// objects take several batches and the cursor and resume matter).
    pub backfill_batch_objects: usize,
    /// `full` profile: the operator's cluster flags, disks whose reported
    /// use crosses the monitor's full ratios, and these throttles.
    pub ops: Option<Throttles>,
    /// EC: activation may ask the monitor for a positional `pg_temp` and
    /// leave shards that need a backfill to background backfill (the
    /// runtime with a monitor link); false: it rebuilds every shard itself
    /// (the runtime without one). Drawn from the seed apart from the
    /// stream (3 seeds in 4), so the other draws stay as they were.
    pub ec_remap: bool,
}

/// Recovery throttles of one run (central config, drawn from the seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttles {
    /// `osd_max_backfills`: PGs one OSD backfills at once as a primary.
    pub max_backfills: u64,
    /// `osd_recovery_max_active`: backfill batches in flight per OSD.
    pub recovery_max_active: u64,
    /// `osd_recovery_sleep` in milliseconds (0: none).
    pub recovery_sleep_ms: u64,
    /// `osd_recovery_max_bytes_per_sec` (0: unlimited).
    pub bytes_per_sec: u64,
}

/// OSDs in a run, at most (new ones join up to this).
const MAX_OSDS: usize = 10;

/// Mixed into the seed to draw [`SimConfig::ec_remap`] without touching
/// the run's random stream.
const EC_REMAP_SALT: u64 = 0x0ec0_bac4_f111_7e47;

/// The flags the simulated operator sets and unsets.
pub const SIM_FLAGS: [OsdFlag; 7] = [
    OsdFlag::NoOut,
    OsdFlag::NoBackfill,
    OsdFlag::NoRecover,
    OsdFlag::NoRebalance,
    OsdFlag::Pause,
    OsdFlag::NoUp,
    OsdFlag::NoDown,
];

impl SimConfig {
    pub fn from_rng(r: &mut Rng, profile: FaultProfile) -> SimConfig {
        SimConfig {
            profile,
            hosts: r.range(3, 5) as u32,
            osds_per_host: r.range(1, 3) as u32,
            pg_num: *[4u32, 8, 16].get(r.range(0, 3) as usize).unwrap_or(&8),
            clients: r.range(2, 5) as u32,
            objects: r.range(6, 20) as u32,
            fault_phase: r.range(10, 30) * SEC,
            heal_bound: 120 * SEC,
            min_log_entries: r.range(3, 30) as usize,
            max_log_entries: r.range(30, 100) as usize,
            peer_timeout: 2 * SEC,
            op_timeout: 3 * SEC,
            dup_ppm: r.range(0, 20_000),
            fault_gap: r.range(500, 3000) * MS,
            ec: None,
            backfill_batch_objects: 2,
            ops: None,
            ec_remap: false,
        }
        .with_ec(r)
        .with_backfill(r)
        .with_ops(r)
    }

    /// The `full` profile's throttles, drawn after everything else.
    fn with_ops(mut self, r: &mut Rng) -> SimConfig {
        if !matches!(
            self.profile,
            FaultProfile::Full | FaultProfile::EcMove | FaultProfile::Grow
        ) {
            return self;
        }
        self.ops = Some(Throttles {
            max_backfills: r.range(1, 4),
            recovery_max_active: r.range(1, 5),
            recovery_sleep_ms: if r.chance(300_000) {
                r.range(20, 300)
            } else {
                0
            },
            // The workload's objects are tens of bytes: 100-2000 B/s
            // spaces batches out by up to a second. An EC chunk is a whole
            // stripe unit (4 KiB): 64 times the rate spaces them alike.
            bytes_per_sec: if r.chance(300_000) {
                r.range(100, 2000) * if self.ec.is_some() { 64 } else { 1 }
            } else {
                0
            },
        });
        self
    }

    /// Drawn last (the other draws of a seed stay as they were).
    fn with_backfill(mut self, r: &mut Rng) -> SimConfig {
        self.backfill_batch_objects = r.range(1, 4) as usize;
        self
    }

    /// The EC profile draws its code after everything else (the other
    /// profiles' seeds stay as they were).
    fn with_ec(mut self, r: &mut Rng) -> SimConfig {
        let ec = match self.profile {
            FaultProfile::Ec | FaultProfile::EcMove => true,
            FaultProfile::Grow => r.chance(500_000),
            _ => false,
        };
        if !ec {
            return self;
        }
        let (k, m, domain) = if r.chance(500_000) {
            (2, 1, "host")
        } else {
            // 4+2 needs six failure domains: two OSDs per host, by OSD.
            self.osds_per_host = 2;
            (4, 2, "osd")
        };
        let min_size = if r.chance(500_000) { k + 1 } else { k };
        self.ec = Some((k, m, min_size, domain));
        self
    }
}

/// One simulated OSD: its disk survives crashes, its process does not.
pub struct SimOsd {
    pub id: i32,
    pub uuid: String,
    pub disk: SimDisk,
    pub proc_: Option<OsdProc>,
    /// Incarnation: bumped at every start (messages and timers of an older
    /// incarnation are dropped).
    pub inc: u64,
    pub clock: Clock,
    /// Next disk sync time already scheduled (syncs stay in order).
    pub sync_at: Time,
}

/// Per-object oracle state: one client writes each object, one write at
/// a time, with values `name=k` for k = 1, 2, ...
#[derive(Debug, Clone, Default)]
struct ObjTrack {
    acked: u64,
    inflight: Option<u64>,
    /// The newest value ever written (acknowledged, refused or in flight).
    last_k: u64,
    /// Values whose write was refused (a full disk): none may ever be read
    /// or be found on a disk.
    refused: BTreeSet<u64>,
}

#[derive(Debug, Clone)]
enum OpKind {
    Write { obj: u32, k: u64 },
    Read { obj: u32, min_k: u64 },
}

#[derive(Debug, Clone)]
struct ClientOp {
    kind: OpKind,
    reqid: ReqId,
    ops: Vec<SubOp>,
    deadline: Time,
    sent: bool,
    /// The client's map epoch when the op was first sent to an OSD.
    first_epoch: Option<Epoch>,
}

struct Client {
    map: Option<Arc<ClusterMap>>,
    next_tid: u64,
    op: Option<ClientOp>,
    owned: Vec<u32>,
}

/// Result of one seed.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub seed: u64,
    /// Oracle violations (empty: the run passed).
    pub violations: Vec<String>,
    pub sim_time: Time,
    pub events: u64,
    pub acked_writes: u64,
    pub reads: u64,
    pub faults: u64,
    /// Writes refused because a disk was full.
    pub refused_writes: u64,
    /// Objects damaged on a disk, and commits failed with EIO.
    pub damaged_objects: u64,
    pub failed_commits: u64,
    /// Simulated time from the end of faults to all PGs active+clean.
    pub heal_time: Option<Time>,
    /// Client ops answered while their PG had a `pg_temp` in the
    /// monitor's map (served by the old acting set while remapped).
    pub remapped_ops: u64,
    /// `pg_temp` requests sent, background backfill batches sent, stray
    /// copies removed.
    pub pg_temp_requests: u64,
    pub backfill_batches: u64,
    pub strays_removed: u64,
    /// Flags the operator set; full marks the monitor changed from
    /// beacons; writes refused because the map marked a member full;
    /// backfill steps held as `backfill_toofull`; client ops an OSD held
    /// while `pause` was set; backfill steps held by a flag.
    pub flags_set: u64,
    pub full_marks: u64,
    pub mark_refusals: u64,
    pub toofull_waits: u64,
    pub paused_ops: u64,
    pub flag_waits: u64,
    /// EC activations that stopped, incomplete, with fewer than k
    /// up-to-date acting shards (and waited for the map to change).
    pub ec_incomplete: u64,
    /// New OSDs that joined the running cluster; boots `noin` left out.
    pub new_osds: u64,
    pub noin_held: u64,
}

pub struct World {
    pub now: Time,
    pub rng: Rng,
    pub cfg: SimConfig,
    pub verbose: bool,
    queue: BinaryHeap<Reverse<(Time, u64)>>,
    events: BTreeMap<u64, Ev>,
    next_ev: u64,
    pub base: Instant,
    pub map: ClusterMap,
    judge: FailureJudge,
    mon_clock: Clock,
    pub osds: BTreeMap<i32, SimOsd>,
    clients: BTreeMap<u32, Client>,
    objects: Vec<ObjTrack>,
    links: BTreeMap<(Ep, Ep), Link>,
    cut: BTreeSet<(Ep, Ep)>,
    partitions: BTreeMap<u64, Vec<(Ep, Ep)>>,
    next_partition: u64,
    pub faults_on: bool,
    slow_until: Time,
    faults_end: Option<Time>,
    marked_out: BTreeSet<i32>,
    reweighted: BTreeSet<i32>,
    /// Flags the operator set (unset a few seconds later, or when faults
    /// stop).
    flags_set: BTreeSet<OsdFlag>,
    /// OSDs whose boot `noin` left out (the operator marks them in when it
    /// unsets the flag).
    noin_held: BTreeSet<i32>,
    /// The epoch of the monitor's map in which the current `pause` began
    /// (None: not paused).
    paused_at: Option<Epoch>,
    pub violations: Vec<String>,
    done: bool,
    /// Whether an object was damaged on a disk during the run.
    damaged_any: bool,
    /// Once healed after damage: objects still to be read back once each
    /// (the reads that find and repair damaged primary copies); None
    /// before that phase.
    verify: Option<BTreeSet<u32>>,
    stats: Outcome,
}

fn ctx() -> ApplyContext {
    ApplyContext {
        caller: EntityName::client("admin"),
        generated_secret: Some([7; 32]),
    }
}

impl World {
    pub fn new(seed: u64, profile: FaultProfile, verbose: bool) -> World {
        let mut rng = Rng::new(seed);
        let mut cfg = SimConfig::from_rng(&mut rng, profile);
        cfg.ec_remap = cfg.ec.is_some() && Rng::new(seed ^ EC_REMAP_SALT).range(0, 4) != 0;
        let map = ClusterMap::new_cluster(
            "5afc28eb-61b3-45f1-b441-6f913fd70505",
            MonInfo {
                name: "a".into(),
                addr: "sim:mon.a".into(),
                rank: 0,
            },
            AuthEntity::new(&[1; 32], &[("mon", "allow *"), ("osd", "allow *")]),
        );
        let mon_clock = Clock {
            offset_us: rng.range(0, 1000 * SEC),
            drift_ppm: rng.range(0, 40_000) as i64 - 20_000,
            jumped_us: 0,
        };
        let mut w = World {
            now: 0,
            rng,
            verbose,
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            next_ev: 0,
            base: Instant::now(),
            map,
            judge: FailureJudge::new(),
            mon_clock,
            osds: BTreeMap::new(),
            clients: BTreeMap::new(),
            objects: vec![ObjTrack::default(); cfg.objects as usize],
            links: BTreeMap::new(),
            cut: BTreeSet::new(),
            partitions: BTreeMap::new(),
            next_partition: 0,
            faults_on: true,
            slow_until: 0,
            faults_end: None,
            marked_out: BTreeSet::new(),
            reweighted: BTreeSet::new(),
            flags_set: BTreeSet::new(),
            noin_held: BTreeSet::new(),
            paused_at: None,
            violations: Vec::new(),
            done: false,
            damaged_any: false,
            verify: None,
            stats: Outcome {
                seed,
                violations: Vec::new(),
                sim_time: 0,
                events: 0,
                acked_writes: 0,
                reads: 0,
                faults: 0,
                refused_writes: 0,
                damaged_objects: 0,
                failed_commits: 0,
                heal_time: None,
                remapped_ops: 0,
                pg_temp_requests: 0,
                backfill_batches: 0,
                strays_removed: 0,
                flags_set: 0,
                full_marks: 0,
                mark_refusals: 0,
                toofull_waits: 0,
                paused_ops: 0,
                flag_waits: 0,
                ec_incomplete: 0,
                new_osds: 0,
                noin_held: 0,
            },
            cfg,
        };
        w.setup();
        w
    }

    pub fn trace(&self, f: impl FnOnce() -> String) {
        if self.verbose {
            println!("[{:>4}.{:06}] {}", self.now / SEC, self.now % SEC, f());
        }
    }

    pub fn violation(&mut self, v: String) {
        self.trace(|| format!("VIOLATION: {v}"));
        if self.violations.len() < 20 {
            self.violations.push(v);
        }
    }

    pub fn at(&mut self, t: Time, ev: Ev) {
        self.next_ev += 1;
        self.events.insert(self.next_ev, ev);
        self.queue.push(Reverse((t.max(self.now), self.next_ev)));
    }

    pub fn after(&mut self, d: Time, ev: Ev) {
        self.at(self.now + d, ev);
    }

    /// `now` on a node's clock as an `Instant` (for the real state
    /// machines, which only ever subtract two of them).
    pub fn instant(&self, c: &Clock) -> Instant {
        self.base + Duration::from_micros(c.local(self.now))
    }

    fn setup(&mut self) {
        let down_out = match self.cfg.profile {
            FaultProfile::Basic | FaultProfile::Disk | FaultProfile::Ec => "100000",
            FaultProfile::Full | FaultProfile::EcMove | FaultProfile::Grow => "10",
        };
        for (k, v) in [
            ("osd_heartbeat_interval", "1"),
            ("osd_heartbeat_grace", "3"),
            ("mon_osd_down_out_interval", down_out),
        ] {
            let cmd = MonCommand::ConfigSet {
                who: "global".into(),
                key: k.into(),
                value: v.into(),
                force: false,
            };
            if let Err(e) = self.map.apply(&cmd, &ctx()) {
                self.violation(format!("setup: config {k}: {e}"));
            }
        }
        if let Some(t) = self.cfg.ops {
            let sleep = format!("{}", t.recovery_sleep_ms as f64 / 1000.0);
            for (k, v) in [
                ("osd_max_backfills", t.max_backfills.to_string()),
                ("osd_recovery_max_active", t.recovery_max_active.to_string()),
                ("osd_recovery_sleep", sleep),
                (
                    "osd_recovery_max_bytes_per_sec",
                    t.bytes_per_sec.to_string(),
                ),
            ] {
                let cmd = MonCommand::ConfigSet {
                    who: "global".into(),
                    key: k.into(),
                    value: v,
                    force: false,
                };
                if let Err(e) = self.map.apply(&cmd, &ctx()) {
                    self.violation(format!("setup: config {k}: {e}"));
                }
            }
        }
        for h in 0..self.cfg.hosts {
            for _ in 0..self.cfg.osds_per_host {
                self.new_osd(h);
            }
        }
        let mut cmds = Vec::new();
        let sizes = match self.cfg.ec {
            None => {
                cmds.push(MonCommand::PoolCreate {
                    name: "rbd".into(),
                    pg_num: Some(self.cfg.pg_num),
                    pgp_num: None,
                    kind: PoolKind::Replicated,
                    profile: None,
                    rule: None,
                });
                vec![("size", "3".to_string()), ("min_size", "2".to_string())]
            }
            Some((k, m, min_size, domain)) => {
                let params = [
                    ("k", k.to_string()),
                    ("m", m.to_string()),
                    ("crush-failure-domain", domain.to_string()),
                    ("stripe_unit", "4096".to_string()),
                ];
                cmds.push(MonCommand::EcProfileSet {
                    name: "sim".into(),
                    params: params
                        .iter()
                        .map(|(a, b)| (a.to_string(), b.clone()))
                        .collect(),
                    force: false,
                });
                cmds.push(MonCommand::PoolCreate {
                    name: "rbd".into(),
                    pg_num: Some(self.cfg.pg_num),
                    pgp_num: None,
                    kind: PoolKind::Erasure,
                    profile: Some("sim".into()),
                    rule: None,
                });
                vec![("min_size", min_size.to_string())]
            }
        };
        for (k, v) in sizes {
            cmds.push(MonCommand::PoolSet {
                pool: "rbd".into(),
                key: k.into(),
                value: v,
                sure: false,
            });
        }
        for c in cmds {
            if let Err(e) = self.map.apply(&c, &ctx()) {
                self.violation(format!("setup: {c:?}: {e}"));
            }
        }
        let ids: Vec<i32> = self.osds.keys().copied().collect();
        for id in ids {
            self.start_osd(id);
        }
        for c in 0..self.cfg.clients {
            let owned = (0..self.cfg.objects)
                .filter(|o| o % self.cfg.clients == c)
                .collect();
            self.clients.insert(
                c,
                Client {
                    map: None,
                    next_tid: 0,
                    op: None,
                    owned,
                },
            );
            self.send(Ep::Client(c), Ep::Mon, Msg::MapSub { have: Epoch(0) });
            let d = self.rng.range(100, 500) * MS;
            self.after(d, Ev::ClientTick(c));
        }
        self.after(250 * MS, Ev::MonTick);
        let gap = self.cfg.fault_gap;
        let d = self.rng.range(gap / 2, gap * 3 / 2);
        self.after(SEC + d, Ev::Fault);
        self.at(SEC + self.cfg.fault_phase, Ev::EndFaults);
    }

    /// Creates an OSD on host `h` in the map (not started).
    fn new_osd(&mut self, h: u32) -> Option<i32> {
        let n = self.osds.len() + self.map.osds.len() + 1;
        let uuid = format!("00000000-0000-0000-0000-{n:012x}");
        let cmd = MonCommand::OsdNew {
            uuid: uuid.clone(),
            id: None,
            host: format!("host{h}"),
            weight: 1.0,
            class: Some("hdd".into()),
        };
        let r = match self.map.apply(&cmd, &ctx()) {
            Ok(r) => r,
            Err(e) => {
                self.violation(format!("osd new: {e}"));
                return None;
            }
        };
        let id = r.json["osdid"].as_i64()? as i32;
        let clock = Clock {
            offset_us: self.rng.range(0, 1000 * SEC),
            drift_ppm: self.rng.range(0, 40_000) as i64 - 20_000,
            jumped_us: 0,
        };
        self.osds.insert(
            id,
            SimOsd {
                id,
                uuid,
                disk: SimDisk::default(),
                proc_: None,
                inc: 0,
                clock,
                sync_at: 0,
            },
        );
        Some(id)
    }

    // ---- the scheduler ----

    /// Runs until the run ends (success or a liveness failure) or `limit`
    /// events; returns the outcome.
    pub fn run(mut self, max_events: u64) -> Outcome {
        while !self.done {
            let Some(Reverse((t, id))) = self.queue.pop() else {
                self.violation("the event queue ran dry".into());
                break;
            };
            let Some(ev) = self.events.remove(&id) else {
                continue;
            };
            self.now = t;
            self.stats.events += 1;
            if self.stats.events > max_events {
                self.violation(format!("more than {max_events} events: livelock?"));
                break;
            }
            self.dispatch(ev);
        }
        let mut out = self.stats.clone();
        out.violations = std::mem::take(&mut self.violations);
        out.sim_time = self.now;
        out
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver {
                from,
                to,
                gen,
                to_inc,
                msg,
            } => self.deliver(from, to, gen, to_inc, msg),
            Ev::OsdTick(id, inc) => {
                if self.running(id, inc) {
                    self.osd_tick(id);
                    self.after(100 * MS, Ev::OsdTick(id, inc));
                }
            }
            Ev::HbTick(id, inc) => {
                if self.running(id, inc) {
                    self.hb_tick(id);
                    self.after(250 * MS, Ev::HbTick(id, inc));
                }
            }
            Ev::DiskSync(id, inc, txn) => {
                if self.running(id, inc) {
                    self.disk_synced(id, txn);
                }
            }
            Ev::MonTick => {
                let now = self.instant(&self.mon_clock.clone());
                let cmds = self.judge.tick(now, &self.map);
                for c in cmds {
                    self.mon_apply(c);
                }
                self.after(250 * MS, Ev::MonTick);
            }
            Ev::ClientTick(c) => self.client_tick(c),
            Ev::Fault => {
                if self.faults_on {
                    self.inject_fault();
                    let gap = self.cfg.fault_gap;
                    let d = self.rng.range(gap / 2, gap * 3 / 2);
                    self.after(d, Ev::Fault);
                }
            }
            Ev::Restart(id) => {
                if self.osds.get(&id).is_some_and(|o| o.proc_.is_none()) {
                    self.trace(|| format!("restart osd.{id}"));
                    self.start_osd(id);
                }
            }
            Ev::HealPartition(p) => self.heal_partition(p),
            Ev::MarkIn(id) => {
                if self.marked_out.remove(&id) {
                    self.trace(|| format!("admin: osd in {id}"));
                    self.mon_apply(MonCommand::OsdIn { ids: vec![id] });
                }
            }
            Ev::DiskRoom(id) => {
                if let Some(o) = self.osds.get_mut(&id) {
                    o.disk.capacity_bytes = None;
                    self.trace(|| format!("osd.{id}: disk has room again"));
                }
            }
            Ev::UnsetFlag(flag) => {
                if self.flags_set.remove(&flag) {
                    self.unset_flag(flag);
                }
            }
            Ev::UsageDrop(id) => {
                if let Some(o) = self.osds.get_mut(&id) {
                    o.disk.filler_bytes = 0;
                    self.trace(|| format!("osd.{id}: other data deleted; its use drops"));
                }
            }
            Ev::EndFaults => self.end_faults(),
            Ev::Check => self.check_healed(),
        }
    }

    pub fn stats_failed_commit(&mut self) {
        self.stats.failed_commits += 1;
    }

    pub(crate) fn stats_pg_temp_request(&mut self) {
        self.stats.pg_temp_requests += 1;
    }

    pub(crate) fn stats_backfill_batch(&mut self) {
        self.stats.backfill_batches += 1;
    }

    pub(crate) fn stats_stray_removed(&mut self) {
        self.stats.strays_removed += 1;
    }

    pub(crate) fn stats_mark_refusal(&mut self) {
        self.stats.mark_refusals += 1;
    }

    pub(crate) fn stats_toofull_wait(&mut self) {
        self.stats.toofull_waits += 1;
    }

    pub(crate) fn stats_paused_op(&mut self) {
        self.stats.paused_ops += 1;
    }

    pub(crate) fn stats_flag_wait(&mut self) {
        self.stats.flag_waits += 1;
    }

    pub(crate) fn stats_ec_incomplete(&mut self) {
        self.stats.ec_incomplete += 1;
    }

    pub fn running(&self, id: i32, inc: u64) -> bool {
        self.osds
            .get(&id)
            .is_some_and(|o| o.inc == inc && o.proc_.is_some())
    }

    // ---- the network ----

    /// The size each simulated disk reports (its beacon's total bytes).
    pub(crate) fn reported_total_bytes(&self) -> u64 {
        if self.cfg.ec.is_some() {
            crate::disk::EC_REPORTED_TOTAL_BYTES
        } else {
            crate::disk::REPORTED_TOTAL_BYTES
        }
    }

    pub(crate) fn blocked(&self, a: Ep, b: Ep) -> bool {
        self.cut.contains(&(a, b))
    }

    /// Generation of the connection `a -> b` (bumped by resets and
    /// partitions: what was in flight is lost, the sender sees a new one).
    pub fn link_gen(&self, a: Ep, b: Ep) -> u64 {
        self.links.get(&(a, b)).map(|l| l.gen).unwrap_or(0)
    }

    pub fn reset_link(&mut self, a: Ep, b: Ep) {
        for k in [(a, b), (b, a)] {
            self.links.entry(k).or_default().gen += 1;
        }
    }

    pub fn send(&mut self, from: Ep, to: Ep, msg: Msg) {
        if let (Ep::Osd(a), Ep::Osd(b), Msg::Backfill(bf)) = (from, to, &msg) {
            self.check_backfill_allowed(a, b, bf);
        }
        if self.blocked(from, to) {
            return;
        }
        let to_inc = match to {
            Ep::Osd(id) => match self.osds.get(&id) {
                Some(o) if o.proc_.is_some() => o.inc,
                _ => return,
            },
            _ => 0,
        };
        let slow = self.now < self.slow_until;
        let mut delay = self.rng.range(100, 1500);
        if slow && self.rng.chance(300_000) {
            delay += self.rng.range(5 * MS, 60 * MS);
        }
        let dup = self.faults_on && self.rng.chance(self.cfg.dup_ppm);
        let link = self.links.entry((from, to)).or_default();
        let at = (self.now + delay).max(link.last_at + 1);
        link.last_at = at;
        let gen = link.gen;
        if dup {
            let at2 = at + self.rng.range(1, 3 * MS);
            if let Some(l) = self.links.get_mut(&(from, to)) {
                l.last_at = l.last_at.max(at2);
            }
            self.at(
                at2,
                Ev::Deliver {
                    from,
                    to,
                    gen,
                    to_inc,
                    msg: msg.clone(),
                },
            );
        }
        self.at(
            at,
            Ev::Deliver {
                from,
                to,
                gen,
                to_inc,
                msg,
            },
        );
    }

    /// The oracle of the flags and full marks for backfill: no batch
    /// copies objects to a target while the sender's map has `nobackfill`
    /// or `norecover`, `norebalance` for a PG that is not degraded, or
    /// marks the target backfillfull or full. (An activation's start
    /// message, which may carry objects a resumed target missed, is part
    /// of peering, not background backfill.)
    fn check_backfill_allowed(&mut self, from: i32, to: i32, bf: &cairn_ops::PgBackfill) {
        if bf.start.is_some() || (bf.objects.is_empty() && !bf.complete) {
            return;
        }
        let Some(p) = self.osds.get(&from).and_then(|o| o.proc_.as_ref()) else {
            return;
        };
        let Some(m) = p.map.clone() else {
            return;
        };
        let degraded = p
            .pgs
            .get(&bf.pgid)
            .and_then(|s| s.pg.placement())
            .is_some_and(|pl| (pl.acting.len() as u32) < pl.size);
        let mut why = Vec::new();
        for f in [OsdFlag::NoBackfill, OsdFlag::NoRecover] {
            if m.flags.contains(&f) {
                why.push(format!("{f} is set"));
            }
        }
        if !degraded && m.flags.contains(&OsdFlag::NoRebalance) {
            why.push("norebalance is set and the PG is not degraded".into());
        }
        if m.full_state(to) >= FullState::Backfillfull {
            why.push(format!("osd.{to} is marked {}", m.full_state(to).as_str()));
        }
        if !why.is_empty() {
            self.violation(format!(
                "backfill: osd.{from} sent pg {} batch {} ({} objects) to osd.{to} in e{} although {}",
                bf.pgid,
                bf.seq,
                bf.objects.len(),
                m.epoch.0,
                why.join(", ")
            ));
        }
    }

    fn deliver(&mut self, from: Ep, to: Ep, gen: u64, to_inc: u64, msg: Msg) {
        if gen != self.link_gen(from, to) || self.blocked(from, to) {
            return;
        }
        match to {
            Ep::Mon => self.mon_recv(from, msg),
            Ep::Osd(id) => {
                if self.running(id, to_inc) {
                    self.osd_recv(id, from, msg);
                }
            }
            Ep::Client(c) => self.client_recv(c, msg),
        }
    }

    // ---- the monitor ----

    fn mon_recv(&mut self, from: Ep, msg: Msg) {
        match msg {
            Msg::MapSub { have } if self.map.epoch > have => {
                let m = Arc::new(self.map.clone());
                self.send(Ep::Mon, from, Msg::Map(m));
            }
            Msg::MonCmd(MonCommand::OsdBeacon { id, beacon }) => {
                // The leader's part of a beacon that the simulator models:
                // the OSD's usage against the map's full ratios.
                if let Err(e) = beacon.validate(id) {
                    self.violation(format!("beacon refused: {e}"));
                } else if let Some(c) = self.map.fullness_change(id, &beacon) {
                    self.stats.full_marks += 1;
                    self.mon_apply(c);
                }
            }
            Msg::MonCmd(MonCommand::OsdFailureReport { id, target, failed }) => {
                let now = self.instant(&self.mon_clock.clone());
                if let Some(c) = self.judge.report(now, &self.map, id, target, failed) {
                    self.mon_apply(c);
                }
            }
            Msg::MonCmd(c) => self.mon_apply(c),
            _ => {}
        }
    }

    /// Applies a command like the monitor leader; a new epoch goes to every
    /// OSD and client.
    pub fn mon_apply(&mut self, cmd: MonCommand) {
        let before = self.map.epoch;
        let flags = self.map.flags.clone();
        let states: BTreeMap<i32, (bool, bool)> = self
            .map
            .osds
            .iter()
            .map(|(id, o)| (*id, (o.up, o.is_in)))
            .collect();
        if let Err(e) = self.map.apply(&cmd, &ctx()) {
            self.trace(|| format!("mon: {} refused: {e}", cmd.verb()));
            return;
        }
        if self.map.epoch == before {
            return;
        }
        self.check_flag_promises(&cmd, &flags, &states);
        self.note_noin_held(&cmd, &flags, &states);
        match (
            flags.contains(&OsdFlag::Pause),
            self.map.flags.contains(&OsdFlag::Pause),
        ) {
            (false, true) => self.paused_at = Some(self.map.epoch),
            (true, false) => self.paused_at = None,
            _ => {}
        }
        self.trace(|| format!("mon: e{} after {cmd:?}", self.map.epoch.0));
        let m = Arc::new(self.map.clone());
        let targets: Vec<Ep> = self
            .osds
            .iter()
            .filter(|(_, o)| o.proc_.is_some())
            .map(|(id, _)| Ep::Osd(*id))
            .chain(self.clients.keys().map(|c| Ep::Client(*c)))
            .collect();
        for t in targets {
            self.send(Ep::Mon, t, Msg::Map(m.clone()));
        }
    }

    /// The oracle of the map flags, on every map change: while `noout` is
    /// set no OSD is marked out but by the operator's own `osd out`; while
    /// `nodown` is set none is marked down; while `noup` is set none comes
    /// up.
    fn check_flag_promises(
        &mut self,
        cmd: &MonCommand,
        flags: &BTreeSet<OsdFlag>,
        before: &BTreeMap<i32, (bool, bool)>,
    ) {
        let mut broken = Vec::new();
        for (id, o) in &self.map.osds {
            let Some(&(was_up, was_in)) = before.get(id) else {
                continue;
            };
            let admin_out = matches!(cmd, MonCommand::OsdOut { .. });
            if flags.contains(&OsdFlag::NoOut) && was_in && !o.is_in && !admin_out {
                broken.push(format!("noout is set, yet osd.{id} was marked out"));
            }
            if flags.contains(&OsdFlag::NoDown) && was_up && !o.up {
                broken.push(format!("nodown is set, yet osd.{id} was marked down"));
            }
            if flags.contains(&OsdFlag::NoUp) && !was_up && o.up {
                broken.push(format!("noup is set, yet osd.{id} came up"));
            }
            let admin_in = matches!(cmd, MonCommand::OsdIn { .. });
            if flags.contains(&OsdFlag::NoIn) && !was_in && o.is_in && !admin_in {
                broken.push(format!("noin is set, yet osd.{id} was marked in"));
            }
        }
        for b in broken {
            self.violation(format!("flags: {b} (by '{}')", cmd.verb()));
        }
    }

    /// A boot that `noin` left out (one that would have marked the OSD
    /// in: a new OSD, or one marked out automatically) is remembered, so
    /// that the operator marks it in when it unsets the flag.
    fn note_noin_held(
        &mut self,
        cmd: &MonCommand,
        flags: &BTreeSet<OsdFlag>,
        before: &BTreeMap<i32, (bool, bool)>,
    ) {
        let MonCommand::OsdBoot { id, .. } = cmd else {
            return;
        };
        if !flags.contains(&OsdFlag::NoIn) || self.marked_out.contains(id) {
            return;
        }
        // Out but not by the operator: new, or marked out automatically.
        let was_out = before.get(id).is_some_and(|s| !s.1);
        let held = was_out && self.map.osds.get(id).is_some_and(|o| o.up && !o.is_in);
        if held && self.noin_held.insert(*id) {
            self.stats.noin_held += 1;
            self.trace(|| format!("osd.{id} booted and stays out: noin is set"));
        }
    }

    pub fn boot_cmd(&self, id: i32) -> Option<MonCommand> {
        let o = self.osds.get(&id)?;
        Some(MonCommand::OsdBoot {
            id,
            uuid: o.uuid.clone(),
            addrs: vec![osd_addr(id, o.inc)],
            reported: OsdReported {
                total_bytes: 1 << 30,
                used_bytes: 0,
                state: "active".into(),
                boot_id: o.inc,
            },
        })
    }

    // ---- faults ----

    fn osd_eps(&self) -> Vec<i32> {
        self.osds.keys().copied().collect()
    }

    fn inject_fault(&mut self) {
        self.stats.faults += 1;
        let ids = self.osd_eps();
        let running: Vec<i32> = ids
            .iter()
            .copied()
            .filter(|i| self.osds[i].proc_.is_some())
            .collect();
        let mut roll = match self.cfg.profile {
            FaultProfile::Basic | FaultProfile::Ec => self.rng.range(0, 65),
            FaultProfile::Full => self.rng.range(0, 127),
            // Full's kinds; of the disk faults only failing commits (the EC
            // write path has no full-disk refusal of its own).
            FaultProfile::EcMove => match self.rng.range(0, 127) {
                100..=105 | 110..=114 => 99,
                r => r,
            },
            // Full's kinds (EcMove's on EC), then the noin episodes.
            FaultProfile::Grow => match self.rng.range(0, 133) {
                100..=105 | 110..=114 if self.cfg.ec.is_some() => 99,
                r => r,
            },
            // Basic's kinds, then the disk faults (100..115).
            FaultProfile::Disk => match self.rng.range(0, 85) {
                r if r >= 65 => r + 35,
                r => r,
            },
        };
        let basic = matches!(self.cfg.profile, FaultProfile::Basic | FaultProfile::Ec);
        if roll >= 65 && basic {
            roll = 99;
        }
        if basic && self.rng.chance(80_000) {
            roll = 99;
        }
        match roll {
            0..=24 => {
                if let Some(id) = self.rng.pick(&running) {
                    self.crash_osd(id);
                    let d = self.rng.range(500 * MS, 14 * SEC);
                    self.after(d, Ev::Restart(id));
                }
            }
            25..=39 => {
                // Partition: one host (or one OSD) from everything else;
                // sometimes including the monitor.
                let victim = self.rng.pick(&ids).unwrap_or(0);
                let host = self.map.osds.get(&victim).map(|o| o.host.clone());
                let side: Vec<Ep> = if self.rng.chance(500_000) {
                    ids.iter()
                        .copied()
                        .filter(|i| self.map.osds.get(i).map(|o| o.host.clone()) == host)
                        .map(Ep::Osd)
                        .collect()
                } else {
                    vec![Ep::Osd(victim)]
                };
                let with_mon = self.rng.chance(500_000);
                let mut others: Vec<Ep> = ids
                    .iter()
                    .map(|&i| Ep::Osd(i))
                    .filter(|e| !side.contains(e))
                    .collect();
                if with_mon {
                    others.push(Ep::Mon);
                }
                if self.rng.chance(300_000) {
                    others.extend(self.clients.keys().map(|&c| Ep::Client(c)));
                }
                let mut pairs = Vec::new();
                for &a in &side {
                    for &b in &others {
                        pairs.push((a, b));
                        pairs.push((b, a));
                        self.reset_link(a, b);
                    }
                }
                self.next_partition += 1;
                let p = self.next_partition;
                self.trace(|| format!("partition #{p}: {side:?} cut from {others:?}"));
                self.cut.extend(pairs.iter().copied());
                self.partitions.insert(p, pairs);
                let d = self.rng.range(SEC, 10 * SEC);
                self.after(d, Ev::HealPartition(p));
            }
            40..=54 => {
                if let (Some(a), Some(b)) = (self.rng.pick(&ids), self.rng.pick(&ids)) {
                    if a != b {
                        self.trace(|| format!("connection reset osd.{a} <-> osd.{b}"));
                        self.reset_link(Ep::Osd(a), Ep::Osd(b));
                    }
                }
            }
            55..=64 => {
                let jump = self.rng.range(200 * MS, 6 * SEC);
                if self.rng.chance(200_000) {
                    self.trace(|| format!("mon clock jumps {jump}us forward"));
                    self.mon_clock.jumped_us += jump;
                } else if let Some(id) = self.rng.pick(&ids) {
                    self.trace(|| format!("osd.{id} clock jumps {jump}us forward"));
                    if let Some(o) = self.osds.get_mut(&id) {
                        o.clock.jumped_us += jump;
                    }
                }
            }
            65..=74 => {
                let up: Vec<i32> = ids
                    .iter()
                    .copied()
                    .filter(|i| !self.marked_out.contains(i))
                    .collect();
                if let Some(id) = self.rng.pick(&up) {
                    self.trace(|| format!("admin: osd out {id}"));
                    self.marked_out.insert(id);
                    self.mon_apply(MonCommand::OsdOut { ids: vec![id] });
                    let d = self.rng.range(2 * SEC, 10 * SEC);
                    self.after(d, Ev::MarkIn(id));
                }
            }
            75..=82 => {
                if let Some(id) = self.rng.pick(&ids) {
                    let weight = self.rng.range(3, 11) as f64 / 10.0;
                    self.trace(|| format!("admin: osd reweight {id} {weight}"));
                    self.reweighted.insert(id);
                    self.mon_apply(MonCommand::OsdReweight { osd: id, weight });
                }
            }
            // New OSDs stay: without a positional pg_temp (`ec_remap`
            // false) an EC PG's activation must rebuild every moved shard
            // itself, and waits, incomplete, without k up-to-date shards;
            // those seeds keep the network slowdown they always had.
            83..=86 if self.cfg.profile == FaultProfile::EcMove && !self.cfg.ec_remap => {
                self.trace(|| "network slows down for 3 s".into());
                self.slow_until = self.now + 3 * SEC;
            }
            83..=86 => self.add_osd(),
            // `grow`: new OSDs twice as often as in `full`.
            87..=92 if self.cfg.profile == FaultProfile::Grow => self.add_osd(),
            127..=132 if self.cfg.profile == FaultProfile::Grow => self.noin_fault(&running),
            100..=114 => self.inject_disk_fault(roll, &ids, &running),
            // The operator's faults: `full` and `ecmove` only (the `disk`
            // profile's draws reach 115..=119 too, as slow networks).
            115..=120 if self.cfg.ops.is_some() => self.flag_fault(),
            121..=126 if self.cfg.ops.is_some() => self.usage_fault(&ids),
            _ => {
                self.trace(|| "network slows down for 3 s".into());
                self.slow_until = self.now + 3 * SEC;
            }
        }
    }

    /// A disk fault: 100..=105 a disk fills (capacity set a little above
    /// what it holds) and gets room again 2-10 s later; 106..=109 the next
    /// commit of a running OSD fails with EIO; 110..=114 (`disk` profile)
    /// the primary's copy of an object is damaged (its reads fail until it
    /// is rewritten or repaired from a member). Damage is dealt only to
    /// primaries of a map with every OSD up, whose reads find it; a damaged replica copy is found by
    /// scrub, which the simulator does not run (placement changes of the
    /// `full` profile could make a damaged primary a replica, so there a
    /// disk fills instead).
    fn inject_disk_fault(&mut self, roll: u64, ids: &[i32], running: &[i32]) {
        let damage = self.cfg.profile == FaultProfile::Disk;
        match roll {
            100..=105 => self.fill_disk(ids),
            110..=114 if !damage => self.fill_disk(ids),
            106..=109 => {
                if let Some(id) = self.rng.pick(running) {
                    self.trace(|| format!("osd.{id}: its next commit will fail (EIO)"));
                    if let Some(o) = self.osds.get_mut(&id) {
                        o.disk.fail_next_sync = true;
                    }
                }
            }
            _ => {
                let obj = self.rng.range(0, u64::from(self.cfg.objects)) as u32;
                // Only while every OSD is up: then the primary is the one
                // the PG returns to once faults stop.
                if !self.map.osds.values().all(|o| o.up) {
                    return;
                }
                let pg = self.pg_of(obj);
                let Some(id) = self
                    .map
                    .pg_to_up(POOL, pg.seed)
                    .ok()
                    .and_then(|m| m.acting_primary)
                else {
                    return;
                };
                let name = Self::object_name(obj);
                if self
                    .osds
                    .get_mut(&id)
                    .is_some_and(|o| o.disk.damage(pg, &name))
                {
                    self.damaged_any = true;
                    self.stats.damaged_objects += 1;
                    self.trace(|| format!("osd.{id}: obj{obj} (pg {pg}) damaged on disk"));
                }
            }
        }
    }

    /// A disk that fills: its capacity becomes a little more than it
    /// holds (a few more writes fit), until room comes back in 2-10 s.
    fn fill_disk(&mut self, ids: &[i32]) {
        let Some(id) = self.rng.pick(ids) else {
            return;
        };
        let slack = self.rng.range(0, 120);
        let d = self.rng.range(2 * SEC, 10 * SEC);
        if let Some(o) = self.osds.get_mut(&id) {
            let cap = o.disk.live.used_bytes() + slack;
            o.disk.capacity_bytes = Some(cap);
            self.trace(|| format!("osd.{id}: disk fills up ({cap} bytes)"));
        }
        self.after(d, Ev::DiskRoom(id));
    }

    /// The operator sets one of [`SIM_FLAGS`] and unsets it 1-6 s later.
    fn flag_fault(&mut self) {
        // `full` and `ecmove` hold `noin` episodes too, one draw in eight
        // (`grow` has its own, more often).
        let noin_too = matches!(self.cfg.profile, FaultProfile::Full | FaultProfile::EcMove);
        if noin_too && self.rng.chance(125_000) {
            let running: Vec<i32> = self
                .osd_eps()
                .into_iter()
                .filter(|i| self.osds[i].proc_.is_some())
                .collect();
            return self.noin_fault(&running);
        }
        let Some(flag) = self.rng.pick(&SIM_FLAGS) else {
            return;
        };
        if !self.flags_set.insert(flag) {
            return;
        }
        self.stats.flags_set += 1;
        self.trace(|| format!("admin: osd set {}", flag.as_str()));
        self.mon_apply(MonCommand::OsdSetFlag { flag });
        let d = self.rng.range(SEC, 6 * SEC);
        self.after(d, Ev::UnsetFlag(flag));
    }

    /// A new OSD on a random host joins the running cluster (at most 10).
    fn add_osd(&mut self) {
        if self.osds.len() >= MAX_OSDS {
            return;
        }
        let h = self.rng.range(0, u64::from(self.cfg.hosts)) as u32;
        if let Some(id) = self.new_osd(h) {
            self.trace(|| format!("admin: new osd.{id} on host{h}"));
            self.stats.new_osds += 1;
            self.start_osd(id);
        }
    }

    /// `grow` (and one flag fault in eight of `full` and `ecmove`): the
    /// operator sets `noin` while a new OSD joins, or while a
    /// running OSD is down for 11-14 s (long enough to be marked out
    /// automatically), and unsets it 3-16 s later; a boot meanwhile leaves
    /// the OSD out (checked on every map change), and the unset marks it
    /// in.
    fn noin_fault(&mut self, running: &[i32]) {
        let flag = OsdFlag::NoIn;
        if !self.flags_set.insert(flag) {
            return;
        }
        self.stats.flags_set += 1;
        self.trace(|| "admin: osd set noin".into());
        self.mon_apply(MonCommand::OsdSetFlag { flag });
        if self.rng.chance(500_000) && self.osds.len() < MAX_OSDS {
            self.add_osd();
        } else if let Some(id) = self.rng.pick(running) {
            self.crash_osd(id);
            let d = self.rng.range(11 * SEC, 14 * SEC);
            self.after(d, Ev::Restart(id));
        }
        let d = self.rng.range(3 * SEC, 16 * SEC);
        self.after(d, Ev::UnsetFlag(flag));
    }

    /// The operator unsets `flag`; after `noin`, it marks in the OSDs
    /// whose boot the flag left out (Ceph's `noin` leaves them out until
    /// then).
    fn unset_flag(&mut self, flag: OsdFlag) {
        self.trace(|| format!("admin: osd unset {}", flag.as_str()));
        self.mon_apply(MonCommand::OsdUnsetFlag { flag });
        if flag != OsdFlag::NoIn {
            return;
        }
        let held: Vec<i32> = std::mem::take(&mut self.noin_held)
            .into_iter()
            .filter(|id| self.map.osds.get(id).is_some_and(|o| !o.is_in))
            .collect();
        if !held.is_empty() {
            self.trace(|| format!("admin: osd in {held:?} (kept out by noin)"));
            self.mon_apply(MonCommand::OsdIn { ids: held });
        }
    }

    /// Other data fills an OSD's disk to a use between the map's nearfull
    /// ratio and just past its full ratio (its next beacons make the
    /// monitor mark it); 2-10 s later the data goes and the mark with it.
    fn usage_fault(&mut self, ids: &[i32]) {
        let Some(id) = self.rng.pick(ids) else {
            return;
        };
        let r = self.map.full_ratios;
        let (lo, hi) = match self.rng.range(0, 3) {
            0 => (r.nearfull, r.backfillfull),
            1 => (r.backfillfull, r.full),
            _ => (r.full, r.full + 0.01),
        };
        let total = self.reported_total_bytes();
        let span = ((hi - lo) * total as f64) as u64;
        let target = (lo * total as f64) as u64 + self.rng.range(1, span.max(2));
        let d = self.rng.range(2 * SEC, 10 * SEC);
        if let Some(o) = self.osds.get_mut(&id) {
            o.disk.filler_bytes = target.saturating_sub(o.disk.live.used_bytes());
            let pct = o.disk.reported_used_bytes(total) * 100 / total;
            self.trace(|| format!("osd.{id}: other data fills its disk to {pct}%"));
        }
        self.after(d, Ev::UsageDrop(id));
    }

    fn heal_partition(&mut self, p: u64) {
        let Some(pairs) = self.partitions.remove(&p) else {
            return;
        };
        self.trace(|| format!("partition #{p} heals"));
        for (a, b) in pairs {
            self.cut.remove(&(a, b));
            self.links.entry((a, b)).or_default().gen += 1;
        }
        // A pair cut by two overlapping partitions stays cut by the other.
        let rest: Vec<(Ep, Ep)> = self.partitions.values().flatten().copied().collect();
        self.cut.extend(rest);
    }

    pub fn crash_osd(&mut self, id: i32) {
        self.trace(|| format!("crash osd.{id} (unsynced writes lost)"));
        let Some(o) = self.osds.get_mut(&id) else {
            return;
        };
        o.proc_ = None;
        o.disk.crash();
        self.reset_links_of(id);
    }

    /// Every connection of osd.`id` is gone (it crashed, or it starts anew:
    /// peers reconnect and see a new connection generation).
    pub fn reset_links_of(&mut self, id: i32) {
        let peers: Vec<Ep> = self
            .osds
            .keys()
            .map(|&i| Ep::Osd(i))
            .chain([Ep::Mon])
            .chain(self.clients.keys().map(|&c| Ep::Client(c)))
            .collect();
        for p in peers {
            self.reset_link(Ep::Osd(id), p);
        }
    }

    fn end_faults(&mut self) {
        self.trace(|| "faults stop; healing".into());
        self.faults_on = false;
        self.slow_until = 0;
        for o in self.osds.values_mut() {
            o.disk.capacity_bytes = None;
            o.disk.fail_next_sync = false;
            o.disk.filler_bytes = 0;
        }
        for flag in std::mem::take(&mut self.flags_set) {
            self.unset_flag(flag);
        }
        let ps: Vec<u64> = self.partitions.keys().copied().collect();
        for p in ps {
            self.heal_partition(p);
        }
        let down: Vec<i32> = self
            .osds
            .iter()
            .filter(|(_, o)| o.proc_.is_none())
            .map(|(i, _)| *i)
            .collect();
        for id in down {
            self.start_osd(id);
        }
        let outs: Vec<i32> = std::mem::take(&mut self.marked_out).into_iter().collect();
        if !outs.is_empty() {
            self.mon_apply(MonCommand::OsdIn { ids: outs });
        }
        for id in std::mem::take(&mut self.reweighted) {
            self.mon_apply(MonCommand::OsdReweight {
                osd: id,
                weight: 1.0,
            });
        }
        self.faults_end = Some(self.now);
        self.after(SEC, Ev::Check);
    }

    // ---- clients and the oracle ----

    /// The value of write `k` of `obj`: `objN=k|` and 0-28 bytes of
    /// padding (from obj and k, not the PRNG), so that a rewrite may grow or
    /// shrink what a disk holds.
    fn value(obj: u32, k: u64) -> bytes::Bytes {
        let pad = (u64::from(obj) * 31 + k * 17) % 29;
        bytes::Bytes::from(format!("obj{obj}={k}|{}", "x".repeat(pad as usize)))
    }

    fn parse_value(obj: u32, data: &[u8]) -> Option<u64> {
        let s = std::str::from_utf8(data).ok()?;
        let (s, _pad) = s.split_once('|')?;
        let (name, k) = s.split_once('=')?;
        (name == format!("obj{obj}")).then_some(())?;
        k.parse().ok()
    }

    /// The PG of workload object `obj` in the monitor's map.
    pub fn pg_of(&self, obj: u32) -> PgId {
        let pg_num = self.map.pools.get(&POOL).map(|p| p.pg_num).unwrap_or(1);
        let seed = cairn_map::stable_mod(
            Self::object_name(obj).hash(),
            pg_num,
            pg_num.max(1).next_power_of_two() - 1,
        );
        PgId {
            pool: PoolId(POOL),
            seed,
        }
    }

    pub fn object_name(obj: u32) -> ObjectName {
        ObjectName::new("", format!("obj{obj}"))
    }

    fn client_tick(&mut self, c: u32) {
        let now = self.now;
        let Some(cl) = self.clients.get_mut(&c) else {
            return;
        };
        let mut resend = false;
        match &cl.op {
            Some(op) if op.deadline <= now => resend = true,
            Some(_) => {}
            None if self.faults_on => {
                let write = self.rng.chance(600_000);
                let cl = self.clients.get_mut(&c).expect("client");
                let obj = if write {
                    let i = self.rng.range(0, cl.owned.len() as u64) as usize;
                    cl.owned.get(i).copied()
                } else {
                    Some(self.rng.range(0, u64::from(self.cfg.objects)) as u32)
                };
                if let Some(obj) = obj {
                    let track = &mut self.objects[obj as usize];
                    let (kind, ops) = if write && track.inflight.is_none() {
                        let k = track.last_k + 1;
                        track.last_k = k;
                        track.inflight = Some(k);
                        (
                            OpKind::Write { obj, k },
                            vec![SubOp::WriteFull {
                                data: Self::value(obj, k),
                            }],
                        )
                    } else {
                        (
                            OpKind::Read {
                                obj,
                                min_k: track.acked,
                            },
                            vec![SubOp::Read { offset: 0, len: 0 }],
                        )
                    };
                    let cl = self.clients.get_mut(&c).expect("client");
                    cl.next_tid += 1;
                    cl.op = Some(ClientOp {
                        kind,
                        reqid: ReqId {
                            client: EntityName::client(&format!("sim{c}")),
                            incarnation: 1,
                            tid: cl.next_tid,
                        },
                        ops,
                        deadline: now,
                        sent: false,
                        first_epoch: None,
                    });
                    resend = true;
                }
            }
            None => {
                // The read-back phase: one read of each object still to verify.
                let owned = cl.owned.clone();
                let obj = self
                    .verify
                    .as_ref()
                    .and_then(|v| owned.iter().copied().find(|o| v.contains(o)));
                if let Some(obj) = obj {
                    let min_k = self.objects[obj as usize].acked;
                    let cl = self.clients.get_mut(&c).expect("client");
                    cl.next_tid += 1;
                    cl.op = Some(ClientOp {
                        kind: OpKind::Read { obj, min_k },
                        reqid: ReqId {
                            client: EntityName::client(&format!("sim{c}")),
                            incarnation: 1,
                            tid: cl.next_tid,
                        },
                        ops: vec![SubOp::Read { offset: 0, len: 0 }],
                        deadline: now,
                        sent: false,
                        first_epoch: None,
                    });
                    resend = true;
                }
            }
        }
        if resend {
            self.client_send(c);
        }
        let d = self.rng.range(20 * MS, 150 * MS);
        self.after(d, Ev::ClientTick(c));
    }

    /// (Re)sends the client's op to the primary of its current map.
    fn client_send(&mut self, c: u32) {
        let timeout = self.cfg.op_timeout;
        let now = self.now;
        let Some(cl) = self.clients.get_mut(&c) else {
            return;
        };
        let Some(op) = cl.op.as_mut() else {
            return;
        };
        op.deadline = now + timeout;
        let op_reqid = op.reqid.clone();
        let have = cl.map.as_ref().map(|m| m.epoch).unwrap_or_default();
        let obj = match op.kind {
            OpKind::Write { obj, .. } | OpKind::Read { obj, .. } => obj,
        };
        let target = cl.map.as_ref().and_then(|m| {
            let p = m.pools.get(&POOL)?;
            let oid = Self::object_name(obj);
            let seed = cairn_map::stable_mod(
                oid.hash(),
                p.pg_num,
                p.pg_num.max(1).next_power_of_two() - 1,
            );
            let pgid = PgId {
                pool: PoolId(POOL),
                seed,
            };
            let primary = m.pg_to_up(POOL, seed).ok()?.acting_primary?;
            Some((
                primary,
                OpRequest {
                    reqid: op.reqid.clone(),
                    epoch: m.epoch,
                    pgid,
                    oid,
                    ops: op.ops.clone(),
                    snapc: None,
                    snap: cairn_ops::SNAP_HEAD,
                },
            ))
        });
        op.sent = target.is_some();
        if op.sent && op.first_epoch.is_none() {
            op.first_epoch = Some(have);
        }
        let dest = target.as_ref().map(|(p, r)| (*p, r.pgid, r.epoch));
        self.trace(|| format!("client {c}: sends {:?} to {dest:?}", op_reqid));
        self.send(Ep::Client(c), Ep::Mon, Msg::MapSub { have });
        if let Some((primary, req)) = target {
            self.send(Ep::Client(c), Ep::Osd(primary), Msg::Op(req));
        } else if let Some(op) = self.clients.get_mut(&c).and_then(|c| c.op.as_mut()) {
            op.deadline = now + 200 * MS;
        }
    }

    fn client_recv(&mut self, c: u32, msg: Msg) {
        match msg {
            Msg::Map(m) => {
                if let Some(cl) = self.clients.get_mut(&c) {
                    if cl.map.as_ref().is_none_or(|o| o.epoch < m.epoch) {
                        cl.map = Some(m);
                    }
                }
            }
            Msg::OpReply(r) => self.client_reply(c, r),
            _ => {}
        }
    }

    fn client_reply(&mut self, c: u32, r: OpReply) {
        let Some(cl) = self.clients.get_mut(&c) else {
            return;
        };
        let Some(op) = cl.op.clone() else {
            return;
        };
        if op.reqid != r.reqid {
            return;
        }
        let result = match r.status {
            OpStatus::Done(res) => res,
            other => {
                // Retry soon (a newer map is asked for on every send).
                let d = self.rng.range(50 * MS, 250 * MS);
                if let Some(o) = self.clients.get_mut(&c).and_then(|c| c.op.as_mut()) {
                    o.deadline = self.now + d;
                }
                self.trace(|| format!("client {c}: {} -> {other:?}", op.reqid));
                return;
            }
        };
        if let Some(cl) = self.clients.get_mut(&c) {
            cl.op = None;
        }
        // `pause`: an op first sent with a map that carries the flag
        // completes only after the flag goes.
        if let (Some(p), Some(e)) = (self.paused_at, op.first_epoch) {
            if e >= p {
                self.violation(format!(
                    "pause: client {c}'s op {} (first sent in e{}) completed while the cluster is paused (since e{})",
                    op.reqid, e.0, p.0
                ));
            }
        }
        let obj = match op.kind {
            OpKind::Write { obj, .. } | OpKind::Read { obj, .. } => obj,
        };
        if self.map.pg_temp.contains_key(&self.pg_of(obj)) {
            self.stats.remapped_ops += 1;
        }
        match (op.kind, result) {
            (OpKind::Write { obj, k }, Ok(_)) => {
                let t = &mut self.objects[obj as usize];
                t.acked = k;
                t.inflight = None;
                self.stats.acked_writes += 1;
                self.trace(|| format!("client {c}: ack obj{obj}={k} ({})", r.version));
            }
            (OpKind::Read { obj, min_k }, res) => {
                self.stats.reads += 1;
                let got = match res {
                    Ok(outs) => match outs.first() {
                        Some(SubOpOutput::Data(d)) => Self::parse_value(obj, d),
                        _ => None,
                    },
                    Err(OpError::NoEnt) => Some(0),
                    Err(e) => {
                        self.violation(format!("client {c}: read of obj{obj} failed: {e}"));
                        return;
                    }
                };
                if let Some(v) = self.verify.as_mut() {
                    v.remove(&obj);
                }
                let t = &self.objects[obj as usize];
                let newest = t.inflight.unwrap_or(t.acked);
                match got {
                    Some(k) if t.refused.contains(&k) => {
                        let pg = self.pg_of(obj);
                        self.violation(format!(
                            "client {c}: read obj{obj} (pg {pg}) returned {k}, whose write was refused as not fitting"
                        ))
                    }
                    Some(k) if k >= min_k && k <= newest => {}
                    other => {
                        let pg = self.pg_of(obj);
                        self.violation(format!(
                            "client {c}: read obj{obj} (pg {pg}) returned {other:?}; acknowledged when the read began: {min_k}, newest written since: {newest}"
                        ))
                    }
                }
            }
            (OpKind::Write { obj, k }, Err(OpError::NoSpace(why))) => {
                if !why.contains("full") {
                    self.violation(format!(
                        "client {c}: write obj{obj}={k} refused without saying what is full: {why}"
                    ));
                }
                // Refused, nothing changed: the value must never show up.
                let t = &mut self.objects[obj as usize];
                t.refused.insert(k);
                t.inflight = None;
                self.stats.refused_writes += 1;
                self.trace(|| format!("client {c}: write obj{obj}={k} refused: {why}"));
            }
            (OpKind::Write { obj, k }, Err(e)) => {
                self.violation(format!("client {c}: write obj{obj}={k} failed: {e}"));
            }
        }
    }

    // ---- the end: liveness and the final state ----

    fn check_healed(&mut self) {
        let Some(end) = self.faults_end else {
            return;
        };
        let busy = self.clients.values().filter(|c| c.op.is_some()).count();
        let unclean = self.unclean_pgs();
        let verified = self.verify.as_ref().is_none_or(|v| v.is_empty());
        if busy == 0 && unclean.is_empty() && self.no_disk_work() && !verified {
            // Reading back: not healed yet.
        } else if busy == 0
            && unclean.is_empty()
            && self.no_disk_work()
            && self.damaged_any
            && self.verify.is_none()
        {
            self.trace(|| "healed; reading every object back once".into());
            self.verify = Some((0..self.cfg.objects).collect());
        } else if busy == 0 && unclean.is_empty() && self.no_disk_work() {
            self.stats.heal_time = Some(self.now - end);
            self.trace(|| "every PG active+clean; checking the data".into());
            self.final_check();
            self.done = true;
            return;
        }
        if self.now - end > self.cfg.heal_bound {
            self.violation(format!(
                "liveness: {}s after faults stopped, {busy} client ops pending and PGs not active+clean: {}",
                self.cfg.heal_bound / SEC,
                unclean.join("; ")
            ));
            self.done = true;
            return;
        }
        self.after(SEC, Ev::Check);
    }

    fn no_disk_work(&self) -> bool {
        self.osds.values().all(|o| !o.disk.has_pending())
    }

    /// PGs whose primary (in the monitor's map) is not active+clean on it,
    /// that still have a `pg_temp`, or whose copies are held outside their
    /// up set (strays must be removed; EC: also the copies OSDs keep of
    /// positions they moved away from).
    fn unclean_pgs(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (pgid, osds) in &self.map.pg_temp {
            out.push(format!("{pgid}: pg_temp {osds:?} still set"));
        }
        for (id, o) in &self.osds {
            for pgid in o.disk.live.colls.keys() {
                let up = self
                    .map
                    .pg_to_up(pgid.pool.0, pgid.seed)
                    .map(|m| m.up)
                    .unwrap_or_default();
                if !up.contains(id) {
                    out.push(format!(
                        "{pgid}: osd.{id} still holds a copy outside up {up:?}"
                    ));
                }
            }
            // EC: a copy of a position the OSD no longer serves (parked by
            // a shard move) goes once the PG is clean.
            for (pgid, shard) in o.disk.parked.keys() {
                out.push(format!(
                    "{pgid}: osd.{id} still keeps its old copy of shard {shard}"
                ));
            }
        }
        let Some(pool) = self.map.pools.get(&POOL) else {
            return vec!["no pool".into()];
        };
        for seed in 0..pool.pg_num {
            let pgid = PgId {
                pool: PoolId(POOL),
                seed,
            };
            let Ok(m) = self.map.pg_to_up(POOL, seed) else {
                out.push(format!("{pgid}: no mapping"));
                continue;
            };
            let Some(p) = m.acting_primary else {
                out.push(format!("{pgid}: no primary"));
                continue;
            };
            match self.osds.get(&p).and_then(|o| o.proc_.as_ref()) {
                None => out.push(format!("{pgid}: primary osd.{p} not running")),
                Some(proc_) => {
                    if let Some(why) = proc_.unclean(pgid, self.map.epoch) {
                        out.push(format!("{pgid} on osd.{p}: {why}"));
                    }
                }
            }
        }
        out
    }

    /// Once healed: every acknowledged write is on every acting member's
    /// disk (durable), nothing newer than the last write, and the members
    /// agree.
    fn final_check(&mut self) {
        let Some(pool) = self.map.pools.get(&POOL).cloned() else {
            return;
        };
        let mut problems = Vec::new();
        for obj in 0..self.cfg.objects {
            let oid = Self::object_name(obj);
            let seed =
                cairn_map::stable_mod(oid.hash(), pool.pg_num, pool.pg_num.next_power_of_two() - 1);
            let pgid = PgId {
                pool: PoolId(POOL),
                seed,
            };
            let Ok(m) = self.map.pg_to_up(POOL, seed) else {
                continue;
            };
            let t = &self.objects[obj as usize];
            if self.cfg.ec.is_some() {
                let acked = (t.acked > 0).then(|| Self::value(obj, t.acked));
                problems.extend(self.ec_final_problems(obj, acked));
                continue;
            }
            for o in &m.acting {
                let coll = self
                    .osds
                    .get(o)
                    .and_then(|s| s.disk.durable.colls.get(&pgid));
                if coll.is_some_and(|c| c.damaged.contains(&oid)) {
                    problems.push(format!(
                        "obj{obj} on osd.{o} (pg {pgid}): the copy is still damaged"
                    ));
                }
                let got = coll
                    .and_then(|c| c.objects.get(&oid))
                    .map(|st| Self::parse_value(obj, &st.data));
                let k = match got {
                    None => Some(0),
                    Some(k) => k,
                };
                if k != Some(t.acked) {
                    problems.push(format!(
                        "obj{obj} on osd.{o} (pg {pgid}): {k:?}, acknowledged {}",
                        t.acked
                    ));
                }
            }
        }
        for p in problems {
            self.violation(format!("final state: {p}"));
        }
    }
}

/// osd.`id`'s address in its incarnation `inc` (a new port per start,
/// as a restarted daemon binds anew).
pub fn osd_addr(id: i32, inc: u64) -> String {
    format!("10.0.{}.{}:{}", id / 250, id % 250 + 1, 6800 + inc % 50_000)
}
