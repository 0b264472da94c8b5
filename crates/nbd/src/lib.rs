//! cairn-nbd: an NBD (Network Block Device) protocol server. It speaks the
//! fixed-newstyle handshake (NBD_OPT_GO/INFO/LIST/ABORT/EXPORT_NAME, block
//! size constraints; structured replies and TLS are refused properly) and
//! the transmission phase with simple replies: READ, WRITE, FLUSH, TRIM,
//! WRITE_ZEROES (with NO_HOLE), DISC, FUA on writes. Requests run
//! concurrently and complete out of order under a per-connection in-flight
//! byte budget. Storage lives behind [`BlockBackend`]; `cairn-rbd` provides
//! the Cairn image backend.
//!
//! It does not own storage, authentication or TLS: bind it to loopback or a
//! trusted network.

pub mod backend;
pub mod proto;
pub mod server;

pub use backend::{BlockBackend, BlockError, BlockResult, BoxFuture};
pub use server::{errno_of, ConnError, Export, NbdServer, ServerConfig, ServerError};
