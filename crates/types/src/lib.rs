//! Vocabulary shared by every Cairn crate: identifiers (OSD, pool, PG, entity
//! names), epochs, the versioned binary encoding used on the wire and on disk,
//! and the `cairn.conf` INI parser. Nothing here does I/O beyond reading a
//! config file the caller names.

pub mod conf;
pub mod crc;
pub mod encode;
pub mod idlepool;
pub mod ids;

pub use conf::{Conf, ConfError};
pub use encode::{decode_versioned, encode_versioned, DecodeError};
pub use ids::{EntityKind, EntityName, Epoch, OsdId, PgId, PoolId};
