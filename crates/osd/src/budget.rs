//! The per-OSD memory budget: turns `osd_memory_target` into the byte and
//! count limits of everything that grows with load (store cache, store
//! write queue, client bytes in flight, per-connection message windows, PG
//! log lengths, the data cache). Owns the arithmetic only; the runtime and the node daemon
//! apply the numbers.
//!
//! Shares of the target (a 320 MiB default, see [`DEFAULT_MEMORY_TARGET_BYTES`]):
//!
//! | what | share | at 320 MiB |
//! |---|---|---|
//! | fixed process overhead (code, runtime, maps, PG structures) | [`FIXED_OVERHEAD_BYTES`] | 48 MiB |
//! | store metadata cache (`store_cache_bytes`) | 1/5 | 64 MiB |
//! | store submitted-but-uncommitted payload (the same bytes as below, once) | 1/5 | 64 MiB |
//! | client op payload in flight (`osd_client_message_size_cap`) | 1/8 | 40 MiB |
//! | each connection's send and receive windows | 1/32 each | 10 MiB |
//! | PG logs of degraded PGs (~[`LOG_ENTRY_BYTES`] per entry, [`PLANNED_PGS_PER_OSD`] PGs) | 1/4 | 3000 entries per PG |
//! | data cache: whole objects read in full (`osd_data_cache_bytes`) | 1/8 | 40 MiB |
//!
//! A client op's payload lives at most about three times while in flight
//! (the decoded request, the encoded replication message kept for resends,
//! the store transaction), which is why its share is small: 40 MiB of
//! client bytes cost up to ~120 MiB. Clean PGs keep only
//! `min_log_entries` (250), so the log share is used only while PGs are
//! degraded (when client traffic is usually lower); it is the one share
//! that may overlap the others.

use crate::pg::PgLimits;

/// `osd_memory_target` when neither cairn.conf nor the central config set
/// one: a 1 GiB Raspberry Pi runs one mon and two OSDs within it.
pub const DEFAULT_MEMORY_TARGET_BYTES: u64 = 320 << 20;
/// Smallest target accepted (the central config refuses less too).
pub const MIN_MEMORY_TARGET_BYTES: u64 = 128 << 20;
/// Memory an OSD needs whatever its load: code, the tokio runtime, maps,
/// PG structures, allocator slack.
pub const FIXED_OVERHEAD_BYTES: u64 = 48 << 20;
/// Estimated in-memory size of one PG log entry (versions, request id,
/// object name).
pub const LOG_ENTRY_BYTES: u64 = 256;
/// PGs per OSD the log share is planned for (Ceph's `mon_target_pg_per_osd`).
pub const PLANNED_PGS_PER_OSD: u64 = 100;
/// A connection window never drops below this (one 4 MiB op plus headers).
const MIN_WINDOW_BYTES: u64 = 8 << 20;
/// Client bytes in flight never drop below this.
const MIN_CLIENT_INFLIGHT_BYTES: u64 = 16 << 20;
/// The data cache takes at most 1/N of the target, whatever is asked.
pub const MAX_DATA_CACHE_SHARE: u64 = 4;

/// Limits derived from one `osd_memory_target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    pub target_bytes: u64,
    /// `StoreConfig::cache_bytes`.
    pub store_cache_bytes: u64,
    /// `StoreConfig::max_inflight_bytes`.
    pub store_inflight_bytes: u64,
    /// `OsdConfig::client_message_size_cap_bytes`: client ops beyond this
    /// many payload bytes wait for earlier ones to finish.
    pub client_inflight_bytes: u64,
    /// `MsgConfig::max_inflight_bytes` of this OSD's connections.
    pub connection_window_bytes: u64,
    /// Most PG log entries kept per PG (`osd_max_pg_log_entries`).
    pub max_log_entries: usize,
    /// `OsdConfig::data_cache_bytes` (`osd_data_cache_bytes`).
    pub data_cache_bytes: u64,
}

impl MemoryBudget {
    /// The limits for `target_bytes` (raised to [`MIN_MEMORY_TARGET_BYTES`]).
    pub fn from_target(target_bytes: u64) -> MemoryBudget {
        let t = target_bytes.max(MIN_MEMORY_TARGET_BYTES);
        let defaults = PgLimits::default();
        let log_entries = (t / 4 / LOG_ENTRY_BYTES / PLANNED_PGS_PER_OSD) as usize;
        MemoryBudget {
            target_bytes: t,
            store_cache_bytes: t / 5,
            store_inflight_bytes: (t / 5).max(MIN_WINDOW_BYTES),
            client_inflight_bytes: (t / 8).max(MIN_CLIENT_INFLIGHT_BYTES),
            connection_window_bytes: (t / 32).max(MIN_WINDOW_BYTES),
            max_log_entries: log_entries.clamp(
                // A clean PG keeps min_log_entries; degraded ones need room
                // above that to recover from the log.
                2 * defaults.min_log_entries,
                defaults.max_log_entries,
            ),
            data_cache_bytes: t / 8,
        }
    }

    /// Sets the data cache to `bytes` (`osd_data_cache_bytes`; 0 turns it
    /// off). More than [`MAX_DATA_CACHE_SHARE`] of the target is lowered to
    /// that, and the returned note says so.
    pub fn with_data_cache(mut self, bytes: u64) -> (MemoryBudget, Option<String>) {
        let most = self.target_bytes / MAX_DATA_CACHE_SHARE;
        self.data_cache_bytes = bytes.min(most);
        let note = (bytes > most).then(|| {
            format!(
                "osd_data_cache_bytes {} MiB is more than 1/{MAX_DATA_CACHE_SHARE} of osd_memory_target {} MiB; using {} MiB (raise osd_memory_target for a bigger cache)",
                bytes >> 20,
                self.target_bytes >> 20,
                most >> 20
            )
        });
        (self, note)
    }

    /// PG limits with this budget's log length.
    pub fn pg_limits(&self) -> PgLimits {
        PgLimits {
            max_log_entries: self.max_log_entries,
            ..PgLimits::default()
        }
    }

    /// Parses a target as the config stores it (plain bytes) or as a user
    /// writes it (`512M`, `1G`); refuses anything below the minimum.
    pub fn parse_target(text: &str) -> Result<u64, String> {
        let v = cairn_map::config::parse_size(text.trim())
            .map_err(|e| format!("osd_memory_target '{text}': {e}"))?;
        if v < MIN_MEMORY_TARGET_BYTES {
            return Err(format!(
                "osd_memory_target '{text}' is below the {} MiB minimum",
                MIN_MEMORY_TARGET_BYTES >> 20
            ));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_target_splits_as_documented() {
        let b = MemoryBudget::from_target(DEFAULT_MEMORY_TARGET_BYTES);
        assert_eq!(b.store_cache_bytes, 64 << 20);
        assert_eq!(b.store_inflight_bytes, 64 << 20);
        assert_eq!(b.client_inflight_bytes, 40 << 20);
        assert_eq!(b.connection_window_bytes, 10 << 20);
        assert_eq!(b.max_log_entries, 3000);
        assert_eq!(b.data_cache_bytes, 40 << 20);
        // The shares plus the fixed overhead stay under the target even
        // when every in-flight client byte lives three times and the data
        // cache is full.
        let worst = FIXED_OVERHEAD_BYTES
            + b.data_cache_bytes
            + b.store_cache_bytes
            + 3 * b.client_inflight_bytes
            + 2 * b.connection_window_bytes
            + 250 * LOG_ENTRY_BYTES * PLANNED_PGS_PER_OSD;
        assert!(worst <= b.target_bytes, "{worst}");
        let small = MemoryBudget::from_target(MIN_MEMORY_TARGET_BYTES);
        assert_eq!(small.max_log_entries, 1310);
    }

    #[test]
    fn limits_grow_with_the_target_and_have_floors() {
        let small = MemoryBudget::from_target(1);
        assert_eq!(small.target_bytes, MIN_MEMORY_TARGET_BYTES);
        assert!(small.connection_window_bytes >= MIN_WINDOW_BYTES);
        assert!(small.client_inflight_bytes >= MIN_CLIENT_INFLIGHT_BYTES);
        let big = MemoryBudget::from_target(4 << 30);
        assert_eq!(big.max_log_entries, PgLimits::default().max_log_entries);
        assert!(big.store_cache_bytes > small.store_cache_bytes);
        assert!(big.client_inflight_bytes > small.client_inflight_bytes);
    }

    #[test]
    fn the_data_cache_knob_is_bounded_by_the_target() {
        let b = MemoryBudget::from_target(DEFAULT_MEMORY_TARGET_BYTES);
        let (off, note) = b.with_data_cache(0);
        assert_eq!((off.data_cache_bytes, note), (0, None));
        let (more, note) = b.with_data_cache(64 << 20);
        assert_eq!((more.data_cache_bytes, note), (64 << 20, None));
        let (capped, note) = b.with_data_cache(1 << 30);
        assert_eq!(capped.data_cache_bytes, 80 << 20);
        assert!(note.unwrap().contains("raise osd_memory_target"));
    }

    #[test]
    fn parse_target_accepts_units_and_refuses_small() {
        assert_eq!(MemoryBudget::parse_target("512M").unwrap(), 512 << 20);
        assert_eq!(MemoryBudget::parse_target("1073741824").unwrap(), 1 << 30);
        assert!(MemoryBudget::parse_target("64M")
            .unwrap_err()
            .contains("minimum"));
        assert!(MemoryBudget::parse_target("lots").is_err());
    }
}
