//! In-memory free-space map of the data file, in blocks. Rebuilt from the
//! extent table at open; never persisted (the extent table is the truth).
//!
//! Two policies share the map: large allocations take the first free run
//! from the start of the file that fits (low, already-written blocks are
//! reused first); small ones fill one free run of at least a "fill run"
//! sequentially from a cursor, so that thousands of small copy-on-write
//! writes land next to each other and their page-cache write-back at a
//! checkpoint is a few large I/Os instead of one random I/O per block.

use std::collections::BTreeMap;

/// `runs` (start block, blocks), in order, with each run that starts
/// where the previous one ends joined to it: an allocation is handed out in
/// runs of at most `MAX_RUN_BYTES`, usually adjacent, and writing those as
/// one request keeps one large I/O in the disk's queue instead of several
/// sequential small ones.
pub(crate) fn join_adjacent(runs: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for &(start, len) in runs {
        match out.last_mut() {
            Some((s, l)) if *s + *l == start => *l += len,
            _ => out.push((start, len)),
        }
    }
    out
}

#[derive(Debug, Default)]
pub(crate) struct Allocator {
    /// start block -> length in blocks, non-overlapping, coalesced.
    free: BTreeMap<u64, u64>,
    free_blocks: u64,
    /// Next block for small allocations (inside the run being filled).
    cursor: Option<u64>,
    /// The shortest free run small allocations start filling.
    fill_run: u64,
    /// No free run of `fill_run` blocks exists (set when a search failed,
    /// cleared when a release makes one), so small allocations do not scan
    /// the whole map each time on a fragmented file.
    no_fill_run: bool,
}

impl Allocator {
    /// All of `[first, end)` free.
    pub fn new_free(first: u64, end: u64) -> Allocator {
        let mut a = Allocator::default();
        if end > first {
            a.release(first, end - first);
        }
        a
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    /// Marks `[start, start+len)` used; false if any of it was not free.
    pub fn mark_used(&mut self, start: u64, len: u64) -> bool {
        let Some((&fs, &fl)) = self.free.range(..=start).next_back() else {
            return false;
        };
        if start + len > fs + fl {
            return false;
        }
        self.free.remove(&fs);
        if start > fs {
            self.free.insert(fs, start - fs);
        }
        if fs + fl > start + len {
            self.free.insert(start + len, fs + fl - start - len);
        }
        self.free_blocks -= len;
        true
    }

    /// Sets the shortest free run small allocations fill sequentially
    /// (0: small allocations are first fit too).
    pub fn set_fill_run(&mut self, blocks: u64) {
        self.fill_run = blocks;
        self.cursor = None;
        self.no_fill_run = false;
    }

    /// Allocates `n` blocks (a small write) right after the previous small
    /// allocation when the free run there still has room; otherwise starts
    /// filling the first free run of at least `fill_run` blocks; where none
    /// is left (a fragmented file), first fit as [`Allocator::allocate`].
    pub fn allocate_small(&mut self, n: u64, max_run: u64) -> Option<Vec<(u64, u64)>> {
        if n > self.free_blocks {
            return None;
        }
        if self.fill_run == 0 || n > self.fill_run {
            return self.allocate(n, max_run);
        }
        if let Some(c) = self.cursor {
            let room = self
                .free
                .range(..=c)
                .next_back()
                .is_some_and(|(&fs, &fl)| c + n <= fs + fl);
            if room && self.mark_used(c, n) {
                self.cursor = Some(c + n);
                return Some(vec![(c, n)]);
            }
        }
        self.cursor = None;
        if !self.no_fill_run {
            let fill = self.fill_run;
            match self.free.iter().find(|(_, &l)| l >= fill).map(|(&s, _)| s) {
                Some(s) => {
                    self.mark_used(s, n);
                    self.cursor = Some(s + n);
                    return Some(vec![(s, n)]);
                }
                None => self.no_fill_run = true,
            }
        }
        self.allocate(n, max_run)
    }

    /// Allocates `n` blocks as one or more runs of at most `max_run` blocks.
    /// Returns None (allocating nothing) if fewer than `n` are free.
    pub fn allocate(&mut self, n: u64, max_run: u64) -> Option<Vec<(u64, u64)>> {
        if n > self.free_blocks {
            return None;
        }
        let mut out = Vec::new();
        let mut left = n;
        // First fit from the start of the file: reusing low, already-written
        // blocks keeps the file's written region small (no unwritten-extent
        // conversion on the filesystem) and the layout compact.
        let fit = self
            .free
            .iter()
            .find(|(_, &l)| l >= n.min(max_run))
            .map(|(&s, _)| s);
        let mut next = fit;
        while left > 0 {
            let start = match next.take() {
                Some(s) => s,
                None => *self.free.iter().next()?.0,
            };
            let len = *self.free.get(&start)?;
            let take = len.min(left).min(max_run);
            self.mark_used(start, take);
            out.push((start, take));
            left -= take;
        }
        Some(out)
    }

    /// The free sub-runs of `[start, start+len)`.
    pub fn free_parts(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let end = start + len;
        let mut out = Vec::new();
        let first = self
            .free
            .range(..=start)
            .next_back()
            .map(|(&s, _)| s)
            .unwrap_or(start);
        for (&fs, &fl) in self.free.range(first..end) {
            let s = fs.max(start);
            let e = (fs + fl).min(end);
            if s < e {
                out.push((s, e - s));
            }
        }
        out
    }

    /// Returns `[start, start+len)` to the free map, coalescing neighbours.
    pub fn release(&mut self, start: u64, len: u64) {
        debug_assert!(len > 0);
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "double free of block {start}");
            if ps + pl == start {
                self.free.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            l += nl;
        }
        self.free.insert(s, l);
        self.free_blocks += len;
        if self.fill_run > 0 && l >= self.fill_run {
            self.no_fill_run = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn alloc_release_conserves_blocks(ops in proptest::collection::vec((1u64..40, any::<bool>()), 1..80)) {
            let mut a = Allocator::new_free(1, 1000);
            a.set_fill_run(32);
            let mut held: Vec<(u64, u64)> = Vec::new();
            for (n, rel) in ops {
                if rel && !held.is_empty() {
                    let (s, l) = held.remove(n as usize % held.len());
                    a.release(s, l);
                } else if let Some(runs) = if n % 2 == 0 { a.allocate(n, 16) } else { a.allocate_small(n, 16) } {
                    prop_assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), n);
                    held.extend(runs);
                }
                let used: u64 = held.iter().map(|r| r.1).sum();
                prop_assert_eq!(a.free_blocks() + used, 999);
                // No two held runs overlap.
                let mut v = held.clone();
                v.sort();
                for w in v.windows(2) {
                    prop_assert!(w[0].0 + w[0].1 <= w[1].0);
                }
            }
        }
    }

    #[test]
    fn free_parts_clips_to_the_range() {
        let mut a = Allocator::new_free(0, 100);
        assert!(a.mark_used(10, 20)); // used [10, 30)
        assert!(a.mark_used(40, 10)); // used [40, 50)
        assert_eq!(a.free_parts(5, 50), vec![(5, 5), (30, 10), (50, 5)]);
        assert_eq!(a.free_parts(12, 5), vec![]);
        assert_eq!(a.free_parts(0, 3), vec![(0, 3)]);
    }

    #[test]
    fn small_allocations_fill_one_run_in_order() {
        let mut a = Allocator::new_free(0, 1000);
        a.set_fill_run(64);
        // Single free blocks at the start (as overwrites leave them)...
        assert!(a.mark_used(0, 100));
        for b in (0..100).step_by(2) {
            a.release(b, 1);
        }
        // ...are skipped: small writes fill the first run of >= 64 blocks.
        let got: Vec<_> = (0..10).map(|_| a.allocate_small(1, 16).unwrap()).collect();
        let want: Vec<_> = (100..110).map(|b| vec![(b, 1)]).collect();
        assert_eq!(got, want);
        // A large allocation takes its first fit elsewhere; the cursor goes on.
        assert_eq!(a.allocate(4, 16), Some(vec![(110, 4)]));
        assert_eq!(a.allocate_small(2, 16), Some(vec![(114, 2)]));
        // No run of 64 left: first fit (the single holes).
        let mut b = Allocator::new_free(0, 10);
        b.set_fill_run(64);
        assert_eq!(b.allocate_small(1, 16), Some(vec![(0, 1)]));
        assert_eq!(b.allocate_small(1, 16), Some(vec![(1, 1)]));
        // A release that coalesces into a long run makes it usable again.
        let mut c = Allocator::new_free(0, 200);
        c.set_fill_run(64);
        assert!(c.mark_used(0, 200));
        c.release(10, 1);
        assert_eq!(c.allocate_small(1, 16), Some(vec![(10, 1)]));
        c.release(100, 80);
        assert_eq!(c.allocate_small(1, 16), Some(vec![(100, 1)]));
        assert_eq!(c.allocate_small(1, 16), Some(vec![(101, 1)]));
    }

    #[test]
    fn full_returns_none() {
        let mut a = Allocator::new_free(0, 10);
        assert!(a.allocate(11, 4).is_none());
        assert_eq!(a.allocate(10, 4).map(|v| v.len()), Some(3));
        assert!(a.allocate(1, 4).is_none());
    }
}

#[cfg(test)]
mod join_tests {
    use super::join_adjacent;

    #[test]
    fn adjacent_runs_join_and_gaps_stay() {
        assert_eq!(join_adjacent(&[]), vec![]);
        assert_eq!(
            join_adjacent(&[(0, 64), (64, 64), (128, 8), (200, 4), (204, 4), (100, 1)]),
            vec![(0, 136), (200, 8), (100, 1)]
        );
    }
}
