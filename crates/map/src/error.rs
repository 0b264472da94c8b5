//! Errors of the cluster map: a command the user typed that does not parse
//! (`ParseError`) and a command that parses but cannot be carried out
//! (`CommandError`). Both display as the message the user sees, saying what
//! to do next.

use serde::{Deserialize, Serialize};

/// Why a command failed. The kind lets a caller map it to an exit code
/// (Ceph uses errno values: EINVAL, ENOENT, EEXIST, EPERM, EACCES, EBUSY).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad argument or value (EINVAL).
    Invalid,
    /// The named thing does not exist (ENOENT).
    NotFound,
    /// The named thing exists already, differently (EEXIST).
    Exists,
    /// The operation is refused by a safety setting or flag (EPERM).
    NotPermitted,
    /// The caller's capabilities do not allow the command (EACCES).
    AccessDenied,
    /// The thing is in use by something else (EBUSY).
    Busy,
}

impl ErrorKind {
    /// The errno Ceph would return, for CLI exit codes.
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::Invalid => 22,
            ErrorKind::NotFound => 2,
            ErrorKind::Exists => 17,
            ErrorKind::NotPermitted => 1,
            ErrorKind::AccessDenied => 13,
            ErrorKind::Busy => 16,
        }
    }
}

/// A command that could not be carried out. `Display` is the whole message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct CommandError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CommandError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CommandError {
            kind,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn exists(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Exists, message)
    }
    pub fn not_permitted(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotPermitted, message)
    }
    pub fn access_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::AccessDenied, message)
    }
    pub fn busy(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Busy, message)
    }
}

/// A command line that does not match the grammar. `Display` names the
/// problem and shows the usage of the closest command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    pub message: String,
}

impl ParseError {
    pub fn new(message: impl Into<String>) -> Self {
        ParseError {
            message: message.into(),
        }
    }
}

impl From<ParseError> for CommandError {
    fn from(e: ParseError) -> Self {
        CommandError::invalid(e.message)
    }
}
