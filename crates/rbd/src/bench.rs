//! `rbd bench`: a fixed amount of I/O against an open image with a fixed
//! number of requests in flight, as Ceph's `rbd bench` drives librbd, so a
//! Ceph user gets figures of the same kind from Cairn. Owns only the load
//! generator and its counters; printing is the caller's (the CLI prints a
//! line per second and a summary in rbd bench's shape).

use crate::error::RbdError;
use crate::image::Image;
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most requests in flight a bench accepts.
pub const MAX_IO_THREADS: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoType {
    Write,
    Read,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPattern {
    /// Offsets step by the I/O size from 0, wrapping at the image's end.
    Seq,
    /// Uniformly random I/O-size-aligned offsets.
    Rand,
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub io_type: IoType,
    pub io_size: u64,
    pub io_threads: usize,
    pub io_total: u64,
    pub pattern: IoPattern,
}

/// Counters sampled while the bench runs (and its final result).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchSample {
    pub elapsed: Duration,
    pub ops: u64,
    pub bytes: u64,
}

impl BenchSample {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl BenchOptions {
    /// Checks the options against an image of `image_bytes`.
    pub fn validate(&self, image_bytes: u64) -> Result<(), RbdError> {
        if self.io_size == 0 || self.io_size > image_bytes {
            return Err(RbdError::Invalid(format!(
                "io-size {} must be between 1 byte and the image size ({image_bytes} bytes)",
                self.io_size
            )));
        }
        if self.io_size > 64 << 20 {
            return Err(RbdError::Invalid(format!(
                "io-size {} is over the 64 MiB a bench request may be",
                self.io_size
            )));
        }
        if self.io_threads == 0 || self.io_threads > MAX_IO_THREADS {
            return Err(RbdError::Invalid(format!(
                "io-threads {} must be between 1 and {MAX_IO_THREADS}",
                self.io_threads
            )));
        }
        if self.io_total < self.io_size {
            return Err(RbdError::Invalid(format!(
                "io-total {} must be at least io-size {}",
                self.io_total, self.io_size
            )));
        }
        Ok(())
    }
}

/// Runs the bench: `io_total / io_size` requests, `io_threads` at a time.
/// `tick` is called about once a second with the counters so far. The
/// first failed request stops the bench and is returned. A write bench
/// ends with a flush, counted in the elapsed time.
pub async fn run_bench(
    image: Arc<Image>,
    opts: &BenchOptions,
    mut tick: impl FnMut(BenchSample),
) -> Result<BenchSample, RbdError> {
    let size = image.size_bytes();
    opts.validate(size)?;
    if opts.io_type == IoType::Write && image.is_read_only() {
        return Err(RbdError::ReadOnly(image.name().to_string()));
    }
    let total_ops = opts.io_total / opts.io_size;
    let slots = size / opts.io_size;
    // One payload shared by every write (cheap clones of `Bytes`), not
    // zeros, so that nothing along the way can take a shortcut.
    let payload = {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x7262_6462);
        let mut v = vec![0u8; opts.io_size as usize];
        rng.fill(&mut v[..]);
        Bytes::from(v)
    };
    let next = Arc::new(AtomicU64::new(0));
    let done_ops = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..opts.io_threads.min(total_ops as usize) {
        let image = image.clone();
        let next = next.clone();
        let done_ops = done_ops.clone();
        let failed = failed.clone();
        let payload = payload.clone();
        let opts = opts.clone();
        workers.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64 + 1);
            loop {
                if failed.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total_ops {
                    return Ok(());
                }
                let slot = match opts.pattern {
                    IoPattern::Seq => i % slots,
                    IoPattern::Rand => rng.gen_range(0..slots),
                };
                let off = slot * opts.io_size;
                let r = match opts.io_type {
                    IoType::Write => image.write(off, payload.clone()).await,
                    IoType::Read => image.read(off, opts.io_size).await.map(|_| ()),
                };
                if let Err(e) = r {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                done_ops.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let sample = |done: u64| BenchSample {
        elapsed: start.elapsed(),
        ops: done,
        bytes: done * opts.io_size,
    };
    let mut every = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let mut first_err = None;
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => { first_err.get_or_insert(e); }
                Some(Err(e)) => {
                    first_err.get_or_insert(RbdError::Invalid(format!("bench task failed: {e}")));
                }
            },
            _ = every.tick() => tick(sample(done_ops.load(Ordering::Relaxed))),
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if opts.io_type == IoType::Write {
        image.flush().await?;
    }
    Ok(sample(done_ops.load(Ordering::Relaxed)))
}
