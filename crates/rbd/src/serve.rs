//! Serving images over NBD: opens each image (taking its lock), exports it
//! under its image name, serves until shutdown, then closes the images
//! (releasing the locks). `NAME@SNAP` serves a snapshot read-only. If this
//! client instance is blocklisted (another client broke a lock it held),
//! serving stops at once with [`RbdError::Fenced`]. This is what
//! `cairn rbd serve` calls.

use crate::error::RbdError;
use crate::image::{Image, Rbd};
use cairn_nbd::{Export, NbdServer, ServerConfig};
use std::future::Future;
use std::sync::Arc;

/// A bound listening socket (the caller binds, so it can print the address).
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// How to open and serve the images.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Lock owner recorded on each image (e.g. `client.admin@host:pid`).
    pub owner: String,
    /// Break a lock held by someone else (only when that holder is dead).
    pub break_lock: bool,
    pub server: ServerConfig,
}

async fn close_all(images: Vec<Arc<Image>>) -> Result<(), RbdError> {
    let mut first = None;
    for img in images {
        // Written back even if something still holds the image.
        if let Err(e) = img.write_back().await {
            first.get_or_insert(e);
        }
        match Arc::try_unwrap(img) {
            Ok(img) => {
                if let Err(e) = img.close().await {
                    first.get_or_insert(e);
                }
            }
            Err(img) => {
                first.get_or_insert(RbdError::Invalid(format!(
                    "image '{}' is still in use at shutdown; its lock stays held",
                    img.name()
                )));
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// Serves `names` (images of `rbd`) on `listener` until `shutdown`.
pub async fn serve_images(
    rbd: &Rbd,
    names: &[String],
    listener: Listener,
    opts: &ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RbdError> {
    let mut images = Vec::new();
    for name in names {
        // NAME@SNAP serves a snapshot, read-only and without the lock.
        let opened = if name.contains('@') {
            rbd.open_read_only(name).await
        } else {
            rbd.open(name, &opts.owner, opts.break_lock).await
        };
        match opened {
            Ok(img) => images.push(Arc::new(img)),
            Err(e) => {
                // Give back the locks already taken; report the open error.
                let _ = close_all(images).await;
                return Err(e);
            }
        }
    }
    let exports = images
        .iter()
        .map(|img| Export {
            name: img.name().to_string(),
            description: format!("cairn image {}/{}", rbd.pool_name(), img.name()),
            backend: img.clone(),
        })
        .collect();
    let server = match NbdServer::new(opts.server.clone(), exports) {
        Ok(s) => s,
        Err(e) => {
            let _ = close_all(images).await;
            return Err(RbdError::Invalid(e.to_string()));
        }
    };
    let rados = rbd.rados().clone();
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            e = rados.fenced() => tracing::error!("stopping the NBD server: {e}"),
        }
    };
    let served = match listener {
        Listener::Tcp(l) => server.serve_tcp(l, stop).await,
        Listener::Unix(l) => server.serve_unix(l, stop).await,
    };
    drop(server);
    let closed = close_all(images).await;
    if let Some(e) = rbd.rados().fenced_error() {
        return Err(RbdError::Fenced(e.to_string()));
    }
    served.map_err(|e| RbdError::Invalid(format!("NBD listener failed: {e}")))?;
    closed
}
