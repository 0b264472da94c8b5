//! Fencing the holder of a lock that is broken: before the lock record is
//! removed, the holder's client instance goes on the OSD map's blocklist
//! (through a [`Fencer`] the caller supplies — the CLI asks the monitors,
//! tests apply the command to their map), and the breaker waits until its
//! own map has the blocklisting epoch. Every op it (or the new holder it
//! becomes) sends afterwards carries that epoch, so an OSD that has not seen
//! it yet fetches it first, and from then on refuses the old holder's ops:
//! no write of the old holder can land after one of the new holder's.
//! Owns the breaking protocol's types; the lock record itself is `header`'s.

use crate::header::LockRecord;
use cairn_map::ClientInstance;
use cairn_types::Epoch;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A boxed future, as the [`Fencer`] trait returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long a breaker waits for its map to reach the blocklisting epoch.
pub const FENCE_MAP_WAIT: Duration = Duration::from_secs(30);

/// Puts client instances on the blocklist.
pub trait Fencer: Send + Sync {
    /// Blocklists `client` (`osd blocklist add`) and returns the map epoch
    /// that lists it. An error means nothing may be assumed fenced.
    fn blocklist<'a>(&'a self, client: &'a ClientInstance) -> BoxFuture<'a, Result<Epoch, String>>;
}

/// How the holder of a broken lock was dealt with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fenced {
    /// Blocklisted; the map of epoch `epoch` lists it.
    Blocklisted {
        client: ClientInstance,
        epoch: Epoch,
    },
    /// The holder was this very client instance (a handle it leaked):
    /// nothing to fence.
    OwnInstance,
    /// A lock record of version 1 (taken by an older Cairn) does not name
    /// the holder's instance: it could not be fenced.
    Unknown,
}

/// What breaking a lock did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenLock {
    pub holder: LockRecord,
    pub fenced: Fenced,
}
