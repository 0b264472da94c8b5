//! cairn-sim: a deterministic simulator of a whole Cairn cluster in one
//! thread. It runs the real state machines — `cairn_osd::pg::Pg` (client-op
//! admission, versions, commit accounting, the PG log, intervals),
//! `cairn_osd::peering_sm::Peering` (activation), `cairn_osd::heartbeat::
//! HeartbeatTracker`, and the monitors' `cairn_map::ClusterMap::apply` and
//! `FailureJudge` — under a seeded scheduler with simulated networks,
//! disks and clocks, injects faults, and checks an oracle. See README.md.
//!
//! - `rng`: the seeded PRNG (the only randomness).
//! - `disk`: a simulated disk (live vs durable state; crashes drop unsynced;
//!   capacity, failing commits, damaged objects).
//! - `world`: scheduler, network, clocks, monitor, clients + oracle, faults.
//! - `osd`: one OSD process driving the real machines.
//! - `backfill`: background backfill with `pg_temp` and stray removal
//!   (replicated PGs, and EC PGs behind a positional `pg_temp`) on top of
//!   `osd`.
//! - `ec`: erasure-coded PGs (write path, reads, activation) on top of `osd`.

mod backfill;
pub mod disk;
mod ec;
mod osd;
pub mod rng;
pub mod world;

pub use world::{FaultProfile, Outcome, World};

/// Events one seed may take at most (a livelock is reported as a failure).
pub const MAX_EVENTS_PER_SEED: u64 = 3_000_000;

/// Runs one seed with the faults of `profile`; `verbose` prints a trace
/// of what happened.
pub fn run_seed(seed: u64, profile: FaultProfile, verbose: bool) -> Outcome {
    World::new(seed, profile, verbose).run(MAX_EVENTS_PER_SEED)
}
