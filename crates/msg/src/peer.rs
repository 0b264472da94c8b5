//! `Peer`: a client handle that keeps one connection to one of several
//! addresses and reconnects with capped exponential backoff. Owns retry
//! policy only; each attempt is a plain `connect`. A connection that the
//! caller's runtime cannot count on (opened from a current-thread runtime
//! the caller is not on: see `Connection::is_driven_here`) is replaced
//! by one of the caller's own.

use crate::auth::Credentials;
use crate::config::MsgConfig;
use crate::conn::{connect, Connection, Message};
use crate::MsgError;
use bytes::Bytes;
use cairn_types::EntityName;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep_until, timeout_at, Instant};

/// First wait after a failed connection attempt.
pub const PEER_BACKOFF_INITIAL: Duration = Duration::from_millis(50);
/// The backoff doubles per failure up to this cap.
pub const PEER_BACKOFF_MAX: Duration = Duration::from_secs(2);

struct State {
    conn: Option<Connection>,
    next_addr: usize,
    backoff: Duration,
    not_before: Option<Instant>,
}

/// Keeps one connection to one of `addrs`, reconnecting as needed.
///
/// `call` may send a request again on a new connection if the old one broke
/// before the reply arrived: requests sent through a `Peer` must be
/// idempotent (or carry their own de-duplication id). Authentication
/// failures are returned at once, never retried.
#[derive(Clone)]
pub struct Peer {
    inner: Arc<Inner>,
}

struct Inner {
    addrs: Vec<SocketAddr>,
    creds: Credentials,
    expect_peer: Option<EntityName>,
    cfg: MsgConfig,
    state: tokio::sync::Mutex<State>,
    /// Kept apart from `state` so that giving up never waits for a connect.
    last_error: std::sync::Mutex<Option<MsgError>>,
}

impl Peer {
    pub fn new(
        addrs: Vec<SocketAddr>,
        creds: Credentials,
        expect_peer: Option<EntityName>,
        cfg: MsgConfig,
    ) -> Peer {
        Peer {
            inner: Arc::new(Inner {
                addrs,
                creds,
                expect_peer,
                cfg,
                state: tokio::sync::Mutex::new(State {
                    conn: None,
                    next_addr: 0,
                    backoff: PEER_BACKOFF_INITIAL,
                    not_before: None,
                }),
                last_error: std::sync::Mutex::new(None),
            }),
        }
    }

    fn label(&self) -> String {
        let list: Vec<String> = self.inner.addrs.iter().map(|a| a.to_string()).collect();
        format!("[{}]", list.join(", "))
    }

    /// The live connection, if there is one (does not connect).
    pub async fn current(&self) -> Option<Connection> {
        let st = self.inner.state.lock().await;
        st.conn
            .as_ref()
            .filter(|c| !c.is_closed() && c.is_driven_here())
            .cloned()
    }

    /// Closes the current connection, if any; the next `call` reconnects.
    pub async fn close(&self) {
        if let Some(c) = self.inner.state.lock().await.conn.take() {
            c.close();
        }
    }

    /// Request/response; (re)connects as needed, all within `timeout`.
    pub async fn call(
        &self,
        msg_type: u16,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Message, MsgError> {
        let deadline = Instant::now() + timeout;
        loop {
            let conn = self.connection(deadline, timeout).await?;
            let left = deadline.saturating_duration_since(Instant::now());
            match conn.call(msg_type, payload.clone(), left).await {
                Ok(m) => return Ok(m),
                Err(e) if e.is_connection_error() => {
                    tracing::debug!("{}: call failed ({e}); reconnecting", conn.peer_label());
                    self.set_last_error(e);
                }
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(self.gave_up(timeout));
            }
        }
    }

    fn set_last_error(&self, e: MsgError) {
        *self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    fn gave_up(&self, after: Duration) -> MsgError {
        let last = self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|e| format!("; last error: {e}"))
            .unwrap_or_default();
        MsgError::timeout(&self.label(), format!("a working connection{last}"), after)
    }

    async fn connection(&self, deadline: Instant, after: Duration) -> Result<Connection, MsgError> {
        if self.inner.addrs.is_empty() {
            return Err(MsgError::Invalid {
                reason: "Peer has no addresses to connect to".into(),
            });
        }
        let mut st = match timeout_at(deadline, self.inner.state.lock()).await {
            Ok(st) => st,
            // Another caller is (re)connecting and did not finish in our time.
            Err(_) => return Err(self.gave_up(after)),
        };
        loop {
            if let Some(c) = st
                .conn
                .as_ref()
                .filter(|c| !c.is_closed() && c.is_driven_here())
            {
                return Ok(c.clone());
            }
            st.conn = None;
            if let Some(nb) = st.not_before {
                if nb >= deadline {
                    return Err(self.gave_up(after));
                }
                sleep_until(nb).await;
            }
            let addr = self.inner.addrs[st.next_addr % self.inner.addrs.len()];
            let mut cfg = self.inner.cfg.clone();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.gave_up(after));
            }
            cfg.connect_timeout = cfg.connect_timeout.min(left);
            cfg.handshake_timeout = cfg.handshake_timeout.min(left);
            match connect(
                addr,
                &self.inner.creds,
                self.inner.expect_peer.as_ref(),
                &cfg,
            )
            .await
            {
                Ok(c) => {
                    st.conn = Some(c.clone());
                    st.backoff = PEER_BACKOFF_INITIAL;
                    st.not_before = None;
                    return Ok(c);
                }
                Err(e @ MsgError::AuthFailed { .. }) => return Err(e),
                Err(e) => {
                    tracing::debug!(
                        "connect to {addr} failed: {e}; next try in {:?}",
                        st.backoff
                    );
                    self.set_last_error(e);
                    st.next_addr = st.next_addr.wrapping_add(1);
                    st.not_before = Some(Instant::now() + st.backoff);
                    st.backoff = (st.backoff * 2).min(PEER_BACKOFF_MAX);
                }
            }
        }
    }
}
