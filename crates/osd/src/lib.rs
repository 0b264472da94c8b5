//! cairn-osd: one OSD = one store, one listener and the PGs CRUSH gives it.
//!
//! - `pg`: the per-PG state machine (ordering, versions, ack accounting,
//!   bounded log, intervals, states, activation rules) — pure, no I/O.
//! - `exec`: object operations against the local store.
//! - `runtime`: tokio tasks that own the socket, the store and one actor per
//!   PG, follow the cluster map, replicate, and run activation (query, pull,
//!   push) before a PG serves I/O.
//! - `backfill`: background backfill of new up members while `pg_temp`
//!   keeps complete copies serving (EC: positional `pg_temp`, chunks
//!   rebuilt from k shards; a pipeline of batches per target; slow targets
//!   dropped and resumed from their durable cursor), its throttles and
//!   flags, the copy meter shared with recovery pushes, and stray removal
//!   once a PG is clean.
//! - `backfill_target`: one backfill target's progress as a pure machine
//!   (durable cursor, stalls, back-off, resume); `backfill` and the
//!   simulator drive it.
//! - `auth`: who may connect (keys from the map's auth table, or tickets
//!   sealed with the OSD service secret) and what they may do (osd caps).
//! - `peering_sm`: replicated activation as a pure state machine (the
//!   runtime and the simulator drive it).
//! - `heartbeat`: pings to PG peers and neighbours, failure reports to the
//!   monitors (`HeartbeatTracker` is the pure part).
//! - `beacon`: periodic usage and PG statistics to the monitors.
//! - `stats`: what each PG actor publishes about its PG (`PgStat`), rebuilt
//!   only when a shown field other than the log position changed.
//! - `budget`: `osd_memory_target` split into cache sizes, in-flight byte
//!   limits and PG log lengths.
//! - `cache`: the data cache of whole objects read from replicated PGs
//!   (bounded bytes, version-checked, crc32c-checked on every hit).
//! - `ec_pool`, `ec_exec`, `ec_io`, `ec_peering`: erasure-coded PGs (one
//!   store collection per shard; the primary encodes, gathers chunks for
//!   reads, rebuilds shards a log behind at activation and leaves the rest
//!   to background backfill; `ec_peering::plan_activation` is the pure
//!   decision).
//! - `scrub`: scrub, deep-scrub and repair run by a PG's primary (scrub
//!   maps, comparison, EC parity check, repair, periodic scheduling).

pub mod auth;
mod backfill;
pub mod backfill_target;
mod beacon;
pub mod budget;
pub mod cache;
pub mod ec_exec;
mod ec_io;
pub mod ec_peering;
pub mod ec_pool;
pub mod exec;
pub mod heartbeat;
mod peering;
pub mod peering_sm;
pub mod pg;
mod runtime;
mod scrub;
mod stats;

pub use backfill::CopyWindow;
pub use budget::MemoryBudget;
pub use cache::CacheStats;
pub use ec_io::{ec_encode_totals, EcEncodeTotals};
pub use pg::{PgLimits, PgState, Role};
pub use runtime::{MapSource, MonRequests, Osd, OsdConfig, OsdError};
pub use stats::PgStat;

/// A store of 64 MiB in a fresh temporary directory, for unit tests (the
/// directory goes when the returned guard is dropped).
#[cfg(test)]
pub(crate) fn small_test_store() -> (tempfile::TempDir, cairn_store::Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = cairn_store::StoreConfig::new(dir.path());
    cfg.data_bytes = 64 << 20;
    cfg.meta_reserve_bytes = 1 << 20;
    let store = cairn_store::Store::create(cfg).unwrap();
    (dir, store)
}
