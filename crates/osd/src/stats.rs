//! What a PG actor publishes about its PG ([`PgStat`]: `cairn pg dump`,
//! the beacon, tests) and how cheaply: after every actor event the actor
//! compares the inputs of the shown fields with what it last published and
//! rebuilds the strings only when a field other than the log position
//! changed; the log position (`last_update`, `log_tail`, log length), which
//! moves with every write, is published as numbers and printed when read.
//! Owns no PG state.

use crate::backfill::BackfillRun;
use crate::exec::Footprint;
use crate::pg::{PgState, Placement, Role};
use crate::scrub::{ScrubRequest, ScrubStamps};
use cairn_ops::{PgInfo, Version};
use cairn_types::PgId;
use serde::{Deserialize, Serialize};

/// One PG as `cairn pg dump` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PgStat {
    pub pgid: String,
    pub state: String,
    pub role: Role,
    pub up: Vec<i32>,
    pub acting: Vec<i32>,
    pub primary: Option<i32>,
    pub epoch: u64,
    pub last_update: String,
    pub log_tail: String,
    pub log_entries: usize,
    pub same_interval_since: u64,
    pub last_epoch_started: u64,
    pub down_reason: Option<String>,
    /// Scrub stamps, state and findings (primary only).
    pub scrub: cairn_map::PgScrubReport,
    /// Backfill in progress (acting primary only).
    pub backfill: Option<crate::backfill::BackfillStat>,
    /// Object copies still to move to backfill targets.
    pub misplaced_objects: u64,
    /// Objects and bytes this OSD copied for the PG by backfill since it
    /// started (counters: the monitors derive rates).
    pub recovered_objects: u64,
    pub recovered_bytes: u64,
}

/// The part of a PG's stats that moves with every write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct LogPosition {
    pub last_update: Version,
    pub log_tail: Version,
    pub log_entries: usize,
    /// Store objects and bytes the client writes ordered by this actor
    /// (primary of a replicated PG) added, up to `last_update` (None: not
    /// kept, e.g. EC). The beacon keeps object counts from it.
    pub written: Option<Footprint>,
}

/// One PG's entry in the OSD's stats table: `stat` holds every field but
/// the log position, which `pos` holds.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub stat: PgStat,
    pub pos: LogPosition,
    /// Changes (unique in the OSD) whenever `stat` is rebuilt: anything
    /// but the log position changed, or another actor took over the PG.
    pub gen: u64,
}

impl Published {
    /// The whole [`PgStat`], log position printed.
    pub fn to_stat(&self) -> PgStat {
        let mut s = self.stat.clone();
        s.last_update = self.pos.last_update.to_string();
        s.log_tail = self.pos.log_tail.to_string();
        s.log_entries = self.pos.log_entries;
        s
    }
}

/// What a PG's shown fields other than the log position were built from,
/// as last published (compared with the actor's state after each event).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatKey {
    state: PgState,
    role: Role,
    up: Vec<i32>,
    acting: Vec<i32>,
    primary: Option<i32>,
    epoch: u64,
    same_interval_since: u64,
    last_epoch_started: u64,
    stamps: ScrubStamps,
    running: Option<ScrubRequest>,
    recovered: (u64, u64),
}

/// The actor's state a [`PgStat`] is built from (borrowed).
pub(crate) struct StatInputs<'a> {
    pub pgid: PgId,
    pub state: &'a PgState,
    pub role: Role,
    pub placement: Option<&'a Placement>,
    pub epoch: u64,
    pub info: &'a PgInfo,
    pub log_entries: usize,
    pub stamps: &'a ScrubStamps,
    pub running: Option<ScrubRequest>,
    pub backfill: Option<&'a BackfillRun>,
    /// (objects, bytes) copied by finished backfill runs.
    pub recovered: (u64, u64),
    /// See [`LogPosition::written`].
    pub written: Option<Footprint>,
}

impl StatInputs<'_> {
    pub fn position(&self) -> LogPosition {
        LogPosition {
            last_update: self.info.last_update,
            log_tail: self.info.log_tail,
            log_entries: self.log_entries,
            written: self.written,
        }
    }

    fn up(&self) -> &[i32] {
        self.placement.map(|p| p.up.as_slice()).unwrap_or_default()
    }

    fn acting(&self) -> &[i32] {
        self.placement
            .map(|p| p.acting.as_slice())
            .unwrap_or_default()
    }

    /// Whether the fields other than the log position are still what `k`
    /// was built from. Never while a backfill runs (its progress moves
    /// with every batch; the stats are rebuilt then).
    pub fn matches(&self, k: &StatKey) -> bool {
        self.backfill.is_none()
            && k.role == self.role
            && k.epoch == self.epoch
            && k.same_interval_since == self.info.same_interval_since.0
            && k.last_epoch_started == self.info.last_epoch_started.0
            && k.primary == self.placement.and_then(|p| p.primary)
            && k.running == self.running
            && k.recovered == self.recovered
            && k.up == self.up()
            && k.acting == self.acting()
            && k.state == *self.state
            && k.stamps == *self.stamps
    }

    pub fn key(&self) -> StatKey {
        StatKey {
            state: self.state.clone(),
            role: self.role,
            up: self.up().to_vec(),
            acting: self.acting().to_vec(),
            primary: self.placement.and_then(|p| p.primary),
            epoch: self.epoch,
            same_interval_since: self.info.same_interval_since.0,
            last_epoch_started: self.info.last_epoch_started.0,
            stamps: self.stamps.clone(),
            running: self.running,
            recovered: self.recovered,
        }
    }

    /// The stats without the log position (see [`Published`]).
    pub fn stat(&self) -> PgStat {
        let backfill = self.backfill.map(|b| b.stat());
        PgStat {
            pgid: self.pgid.to_string(),
            state: format!(
                "{}{}",
                self.state,
                crate::scrub::state_suffix(self.stamps, self.running)
            ),
            role: self.role,
            up: self.up().to_vec(),
            acting: self.acting().to_vec(),
            primary: self.placement.and_then(|p| p.primary),
            epoch: self.epoch,
            last_update: String::new(),
            log_tail: String::new(),
            log_entries: 0,
            same_interval_since: self.info.same_interval_since.0,
            last_epoch_started: self.info.last_epoch_started.0,
            down_reason: self.state.down_reason.clone(),
            scrub: crate::scrub::report_of(self.stamps, self.running),
            // Object copies still to make (misplaced while pg_temp serves).
            misplaced_objects: backfill
                .as_ref()
                .map(|b| b.total_objects.saturating_sub(b.copied_objects))
                .unwrap_or(0),
            recovered_objects: self.recovered.0
                + self.backfill.map(|b| b.copied_objects).unwrap_or(0),
            recovered_bytes: self.recovered.1 + self.backfill.map(|b| b.copied_bytes).unwrap_or(0),
            backfill,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_types::{Epoch, PoolId};

    fn placement(up: &[i32]) -> Placement {
        Placement {
            epoch: Epoch(7),
            up: up.to_vec(),
            acting: up.to_vec(),
            shards: Vec::new(),
            primary: up.first().copied(),
            size: 3,
            min_size: 2,
            prev_primary_up_thru: None,
            acting_up_from: vec![Epoch(1); up.len()],
            last_recorded: None,
        }
    }

    struct World {
        state: PgState,
        placement: Placement,
        info: PgInfo,
        stamps: ScrubStamps,
    }

    impl World {
        fn new() -> World {
            World {
                state: PgState {
                    active: true,
                    clean: true,
                    ..PgState::default()
                },
                placement: placement(&[0, 1, 2]),
                info: PgInfo {
                    last_update: Version { epoch: 7, seq: 12 },
                    log_tail: Version { epoch: 7, seq: 2 },
                    same_interval_since: Epoch(5),
                    last_epoch_started: Epoch(6),
                    ..PgInfo::default()
                },
                stamps: ScrubStamps::default(),
            }
        }

        fn inputs(&self) -> StatInputs<'_> {
            StatInputs {
                pgid: PgId {
                    pool: PoolId(1),
                    seed: 3,
                },
                state: &self.state,
                role: Role::Primary,
                placement: Some(&self.placement),
                epoch: 7,
                info: &self.info,
                log_entries: 10,
                stamps: &self.stamps,
                running: None,
                backfill: None,
                recovered: (0, 0),
                written: Some(Footprint::default()),
            }
        }
    }

    #[test]
    fn published_stats_print_the_log_position_when_read() {
        let w = World::new();
        let i = w.inputs();
        let p = Published {
            stat: i.stat(),
            pos: i.position(),
            gen: 1,
        };
        let s = p.to_stat();
        assert_eq!(s.pgid, "1.3");
        assert_eq!(s.state, "active+clean");
        assert_eq!(s.up, vec![0, 1, 2]);
        assert_eq!(s.primary, Some(0));
        assert_eq!(s.last_update, w.info.last_update.to_string());
        assert_eq!(s.log_tail, w.info.log_tail.to_string());
        assert_eq!(s.log_entries, 10);
        assert_eq!((s.same_interval_since, s.last_epoch_started), (5, 6));
    }

    #[test]
    fn a_write_moves_only_the_log_position() {
        let mut w = World::new();
        let key = w.inputs().key();
        let pos = w.inputs().position();
        w.info.last_update.seq += 1;
        assert!(w.inputs().matches(&key), "a write rebuilds no strings");
        assert_ne!(w.inputs().position(), pos);
    }

    #[test]
    fn every_other_shown_field_rebuilds_the_stats() {
        type Change = fn(&mut World);
        let changes: [(&str, Change); 6] = [
            ("state", |w| w.state.clean = false),
            ("down reason", |w| {
                w.state.down_reason = Some("osd.4".into())
            }),
            ("up set", |w| w.placement.up = vec![0, 1, 3]),
            ("acting set", |w| w.placement.acting = vec![0, 1]),
            ("interval", |w| w.info.same_interval_since = Epoch(7)),
            ("scrub stamps", |w| w.stamps.errors = 1),
        ];
        for (what, change) in changes {
            let mut w = World::new();
            let key = w.inputs().key();
            assert!(w.inputs().matches(&key));
            change(&mut w);
            assert!(!w.inputs().matches(&key), "{what} changed");
        }
        let w = World::new();
        let key = w.inputs().key();
        let mut i = w.inputs();
        i.running = Some(ScrubRequest {
            deep: true,
            repair: false,
            order: None,
        });
        assert!(!i.matches(&key), "a scrub started");
        assert_eq!(i.stat().state, "active+clean+scrubbing+deep");
        let mut i = w.inputs();
        i.role = Role::Replica;
        assert!(!i.matches(&key), "role changed");
        let mut i = w.inputs();
        i.recovered = (1, 4096);
        assert!(!i.matches(&key), "a backfill run finished");
    }
}
