//! Errors of the CRUSH crate: map edits and decoding ([`CrushError`]) and the
//! text parser ([`ParseError`], with line, column and what was expected).

/// An error from editing, validating or decoding a CRUSH map.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CrushError {
    #[error("no item named '{0}' in the CRUSH map; list items with 'cairn crush decompile' or 'cairn osd tree'")]
    NoSuchItem(String),
    #[error("osd.{0} is not in the CRUSH map; add it first (e.g. 'cairn osd crush add osd.{0} <weight> host=<host>')")]
    NoSuchDevice(i32),
    #[error(
        "osd.{0} is already in the CRUSH map; remove it first or use reweight/set-device-class"
    )]
    DeviceExists(i32),
    #[error("an item named '{0}' already exists in the CRUSH map; pick another name")]
    NameExists(String),
    #[error("unknown bucket type '{0}'; known types: {1}")]
    NoSuchType(String, String),
    #[error("bucket '{0}' is not empty; move or remove its items first")]
    BucketNotEmpty(String),
    #[error("no rule named '{0}' in the CRUSH map")]
    NoSuchRule(String),
    #[error("a rule named '{0}' already exists; remove it first or pick another name")]
    RuleExists(String),
    #[error("device class '{0}' does not exist; assign it to an OSD first (set_device_class)")]
    NoSuchClass(String),
    #[error("invalid weight {0} for {1}: weights must be finite and between 0 and 65535 TiB")]
    BadWeight(f64, String),
    #[error("invalid name '{0}': names must be non-empty and contain only letters, digits, '-', '_' and '.'")]
    BadName(String),
    #[error("bucket '{bucket}' uses algorithm '{alg}'; Cairn implements only straw2 (set 'alg straw2'; note this changes placement)")]
    UnsupportedAlg { bucket: String, alg: String },
    #[error("too many items: {0}")]
    TooMany(String),
    #[error("cannot decode CRUSH map: {0}")]
    Decode(String),
    #[error("invalid CRUSH map: {0}")]
    Invalid(String),
}

/// A syntax or meaning error in crushtool text, with its position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: expected {expected}, found {found}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub column: usize,
    /// What the parser was looking for.
    pub expected: String,
    /// What it found instead (or a description of the problem).
    pub found: String,
}
