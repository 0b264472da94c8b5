//! The process heap: the `cairn` binary's global allocator (mimalloc) and
//! what the node daemon does so that its resident memory follows what is
//! in use rather than its high-water mark. Owns the allocator's settings
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

/// `mi_option_allow_thp` in mimalloc v3's `mi_option_t` (libmimalloc-sys
/// names only the options v2 also has; v3 is the one it builds by default).
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

/// Keeps the process's heap in 4 KiB pages: no transparent huge pages for
/// this process (`prctl(PR_SET_THP_DISABLE)`, which also stops mimalloc's
/// `madvise(MADV_HUGEPAGE)` on its arenas). It holds for every thread and
/// for memory mapped before; `main` calls it first, for every command (the
/// node daemon, `rbd serve`/`map`, `store bench` and the clients alike),
/// before the heap grows.
///
/// mimalloc reserves its arenas 1 GiB at a time and asks for huge pages on
/// them, so where THP is on (`always`, or `madvise` as most distributions
/// ship it) every 2 MiB span the heap touches becomes resident as a whole:
/// a fresh node daemon (1 mon, 3 OSDs) measured 130 MiB RSS with them, 80
/// MiB of it huge pages, against 46 MiB without; the heap's purges of free
/// 64 KiB slices do not shrink a huge page either.
pub fn keep_in_small_pages() {
    // SAFETY: mi_option_set stores one integer in mimalloc's option table.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0) };
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process's memory
    // map; it takes no pointers.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

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
    fn huge_pages_are_off_for_the_process_and_the_allocator() {
        // SAFETY: reading one option of mimalloc's table.
        let default = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_ALLOW_THP) };
        // mimalloc allows THP by default on Linux: the index names the
        // option (an index past v2's table would read 0).
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
            assert_eq!(default, 1, "option {MI_OPTION_ALLOW_THP} is not allow_thp");
        }
        keep_in_small_pages();
        // SAFETY: as above.
        assert_eq!(
            unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_ALLOW_THP) },
            0
        );
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
            assert!(line.ends_with('0'), "{line}");
        }
        // Memory freed while idle is handed back without a fault.
        let block = vec![1u8; 16 << 20];
        drop(std::hint::black_box(block));
        release_free_memory();
    }
}
