//! The one error type of the EC crate. Messages name what failed and, where
//! the user can act, what to do next.

/// Everything the erasure-coding maths can refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EcError {
    #[error("invalid erasure-code profile k={k} m={m}: {reason}")]
    InvalidProfile { k: usize, m: usize, reason: String },

    #[error("invalid stripe_unit of {stripe_unit_bytes} bytes: {reason}")]
    InvalidStripeUnit {
        stripe_unit_bytes: u64,
        reason: String,
    },

    #[error(
        "cannot decode: {available} of {total} chunks available, {needed} needed (k={needed}); \
         missing or failing checksum: chunks {missing:?}. The data comes back when enough of the \
         OSDs holding these chunks are up again — run 'cairn health detail'"
    )]
    InsufficientChunks {
        available: usize,
        needed: usize,
        total: usize,
        missing: Vec<usize>,
    },

    #[error("{count} chunk slots given, the profile has k+m = {expected}")]
    ChunkCount { count: usize, expected: usize },

    #[error("chunk {index} is {len} bytes, expected {expected} (every chunk of a stripe range has the same length)")]
    ChunkLength {
        index: usize,
        len: u64,
        expected: u64,
    },

    #[error("chunk length {len} bytes is not a multiple of {align} bytes")]
    ChunkAlignment { len: u64, align: u64 },

    #[error("chunk index {index} out of range: the profile has {total} chunks (0..{total})")]
    ChunkIndex { index: usize, total: usize },

    #[error("extent at offset {offset} with length {len} ends beyond the largest object offset (2^60 bytes)")]
    ExtentOverflow { offset: u64, len: u64 },

    #[error("extent {offset}..{end} lies beyond the {size}-byte buffer it refers to")]
    ExtentOutOfRange { offset: u64, end: u64, size: u64 },

    #[error(
        "partial overwrite of bytes {offset}..{end} of a {old_size}-byte object on an erasure-coded \
         pool without allow_ec_overwrites; only full-object writes and appends are allowed — run \
         'cairn osd pool set <pool> allow_ec_overwrites true' to enable overwrites"
    )]
    OverwritesDisabled {
        offset: u64,
        end: u64,
        old_size: u64,
    },

    #[error("read-modify-write input does not match its plan: {reason}")]
    PlanMismatch { reason: String },

    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },

    #[error("{what} written with EC format version {found}, this build understands {min}..={max}; upgrade Cairn to read it")]
    UnsupportedFormat {
        what: &'static str,
        found: u8,
        min: u8,
        max: u8,
    },

    #[error("Reed-Solomon library refused the operation: {0}")]
    Library(String),
}

pub type Result<T, E = EcError> = std::result::Result<T, E>;
