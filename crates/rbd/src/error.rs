//! The image layer's error type: each variant names the image and says
//! what to do next.

use cairn_client::ClientError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RbdError {
    #[error("image '{0}' does not exist; list images with 'cairn rbd ls'")]
    NotFound(String),
    #[error("image '{0}' already exists; pick another name or remove it with 'cairn rbd rm'")]
    Exists(String),
    #[error("image '{image}' is locked by {owner} (cookie {cookie}); another client has it open. If that client is dead, open with break_lock (cairn rbd lock break)")]
    Locked {
        image: String,
        owner: String,
        cookie: String,
    },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("image '{image}': header is damaged or from a newer version: {reason}")]
    BadHeader { image: String, reason: String },
    #[error("not supported yet: {0}")]
    Unsupported(String),
    #[error("lost the exclusive lock on image '{0}' (it was broken by another client); reopen the image")]
    LockLost(String),
    #[error("image '{0}' is open read-only; open it with the lock to write")]
    ReadOnly(String),
    #[error("{0}")]
    Stream(String),
    #[error("image '{0}' has snapshots - these must be deleted with 'cairn rbd snap purge' before the image can be removed")]
    HasSnapshots(String),
    #[error("image '{image}' has no snapshot '{snap}'; list them with 'cairn rbd snap ls'")]
    SnapNotFound { image: String, snap: String },
    #[error("image '{image}' already has a snapshot named '{snap}'")]
    SnapExists { image: String, snap: String },
    #[error("snapshot '{snap}' of image '{image}' is protected from removal; unprotect it first with 'cairn rbd snap unprotect'")]
    SnapProtected { image: String, snap: String },
    #[error("cannot unprotect snapshot '{snap}' of image '{image}': at least {} child(ren) [{}] use it; flatten or remove them first", children.len(), children.join(", "))]
    SnapHasChildren {
        image: String,
        snap: String,
        children: Vec<String>,
    },
    #[error("snapshot '{snap}' of image '{image}' is not protected; protect it first with 'cairn rbd snap protect' (a clone needs a protected snapshot)")]
    SnapNotProtected { image: String, snap: String },
    #[error("{0}. Serving stopped: another client broke the image lock and now owns the image; check 'cairn rbd status' before serving it again")]
    Fenced(String),
    #[error("image '{image}': {detail}. Writes acknowledged from the write cache may be lost; every flush and write on this open image fails from now on: fix the cause, then reopen the image (restart 'cairn rbd serve' / 'cairn rbd map')")]
    WriteBack { image: String, detail: String },
    #[error(transparent)]
    Client(#[from] ClientError),
}
