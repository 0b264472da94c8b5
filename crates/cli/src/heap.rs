//! The process heap: the `cairn` binary's global allocator (mimalloc) and
//! what the node daemon does so that its resident memory follows what is
//! in use rather than its high-water mark. Owns the choice of allocator
//! and the periodic hand-back of free memory; not the budgets that bound
//! what is in use (cairn-osd's `budget`), nor the buffer pools it empties
//! (cairn-msg's `bufpool`, cairn-ec's `chunkpool`).

use std::time::Duration;

/// The daemon allocates and frees many small and mid-sized buffers per op on
/// many threads (messages, transactions, PG log entries); mimalloc's
/// per-thread free lists cost less CPU there than glibc's arenas.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often the node daemon hands free heap memory back to the kernel
/// (see [`release_free_memory`]).
pub const RELEASE_INTERVAL: Duration = Duration::from_secs(2);

// Transparent huge pages stay as the host sets them. Turning them off for
// the process (`prctl(PR_SET_THP_DISABLE)` and mimalloc's `allow_thp` 0,
// tried in session 13) cut a fresh daemon's RSS from 130 to 46 MiB but
// cost 4 MiB sequential reads 15-25 % (1,480-1,814 -> 1,121-1,354 MB/s,
// two A/B pairs on one disk, the disk 100 % busy for fewer bytes; most
// likely because an O_DIRECT read into 4 KiB pages is many more device
// segments than one into huge pages). The RSS stays far inside the OSDs'
// budgets either way.

/// Frees the buffers the process keeps idle for reuse (receive buffers,
/// EC chunk buffers) once they were not reused for their idle timeout,
/// then has mimalloc return every free span of its arenas to the kernel
/// now (`mi_collect(true)`: a forced purge of all arenas, whether or not
/// their purge delay expired).
///
/// mimalloc purges freed spans by itself only when some thread allocates
/// or frees again; a daemon that goes idle after a burst would keep them
/// resident until the next burst. Pages a busy thread still caches for its
/// own reuse are that thread's to give back (its later allocations retire
/// them), so this bounds what stays resident while idle, not the peak.
pub fn release_free_memory() {
    cairn_msg::bufpool::trim_idle();
    cairn_ec::chunkpool::trim_idle();
    // SAFETY: mi_collect takes no pointers; it walks the calling thread's
    // heap and the process's arenas under mimalloc's own locks.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// Calls [`release_free_memory`] every [`RELEASE_INTERVAL`] (on the blocking
/// pool), until the task is aborted.
pub async fn release_free_memory_periodically() {
    loop {
        tokio::time::sleep(RELEASE_INTERVAL).await;
        let _ = tokio::task::spawn_blocking(release_free_memory).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_is_handed_back_without_a_fault() {
        let block = vec![1u8; 16 << 20];
        drop(std::hint::black_box(block));
        release_free_memory();
    }
}
