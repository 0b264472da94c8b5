//! Helpers shared by the integration tests: an in-memory key server, an echo
//! server, and a TCP proxy that can duplicate, reorder, flip or swallow frames.
#![allow(dead_code)]

use bytes::Bytes;
use cairn_msg::frame::{FrameHeader, FrameKind, HEADER_LEN};
use cairn_msg::{Connection, Credentials, KeyServer, Listener, MsgConfig, Secret};
use cairn_types::EntityName;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

#[derive(Default)]
pub struct Keys {
    pub secrets: Mutex<HashMap<EntityName, Secret>>,
    pub services: Mutex<HashMap<u64, Secret>>,
}

impl Keys {
    pub fn with(name: &EntityName, s: &Secret) -> Arc<Keys> {
        let k = Keys::default();
        k.secrets.lock().unwrap().insert(name.clone(), s.clone());
        Arc::new(k)
    }
}

impl KeyServer for Keys {
    fn secret_for(&self, name: &EntityName) -> Option<Secret> {
        self.secrets.lock().unwrap().get(name).cloned()
    }
    fn service_secret(&self, generation: u64) -> Option<Secret> {
        self.services.lock().unwrap().get(&generation).cloned()
    }
}

pub fn admin() -> EntityName {
    EntityName::client("admin")
}

pub fn mon_a() -> EntityName {
    EntityName::mon("a")
}

/// Short timeouts, with enough keepalive slack for a loaded 2-core CI box.
pub fn fast_cfg() -> MsgConfig {
    MsgConfig {
        keepalive_interval: Duration::from_millis(200),
        keepalive_timeout: Duration::from_secs(4),
        connect_timeout: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(2),
        send_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

/// For the keepalive tests: a silent peer is detected after 800 ms.
pub fn keepalive_cfg() -> MsgConfig {
    MsgConfig {
        keepalive_interval: Duration::from_millis(100),
        keepalive_timeout: Duration::from_millis(800),
        ..fast_cfg()
    }
}

pub fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A listener on loopback speaking as `mon.a` that knows one key, client
/// `admin`'s (fresh each call), and the credentials to connect with it.
pub async fn admin_listener(cfg: MsgConfig) -> (Listener, Credentials) {
    let key = Secret::generate();
    let l = Listener::bind(any_port(), mon_a(), Keys::with(&admin(), &key), cfg)
        .await
        .unwrap();
    let creds = Credentials::Key {
        name: admin(),
        secret: key,
    };
    (l, creds)
}

/// Serves every accepted connection: replies to each request with the same
/// payload and `msg_type + 1`. Aborting the handle drops the listener and
/// every connection.
pub fn echo_server(listener: Listener) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let Ok(conn) = listener.accept().await else {
                return;
            };
            conns.spawn(serve_echo(conn));
        }
    })
}

pub async fn serve_echo(conn: Connection) {
    while let Ok(m) = conn.recv().await {
        if conn
            .reply(&m, m.msg_type.wrapping_add(1), m.payload.clone())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// What the proxy does to the client->server stream of Message frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mangle {
    None,
    /// Send the n-th message frame twice.
    Duplicate(usize),
    /// Send the n-th message frame after the (n+1)-th.
    Swap(usize),
    /// Flip one payload bit of the n-th message frame.
    Flip(usize),
    /// Flip one bit of payload byte `.1` of the n-th message frame.
    FlipAt(usize, usize),
    /// Forward the handshake, then swallow everything server->client.
    SilenceServer,
    /// Rewrite the payload length in the n-th message frame's header to
    /// `FORGED_LEN` (an on-path attacker without the key), then forward
    /// the frame as it was.
    ForgeLength(usize),
}

/// The payload length `Mangle::ForgeLength` claims: under the default
/// `max_message_bytes`, so only the header MAC can refuse it.
pub const FORGED_LEN: u32 = 100 << 20;

async fn read_frame(s: &mut TcpStream) -> Option<(FrameHeader, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).await.ok()?;
    let hdr = FrameHeader::decode(&h, usize::MAX).ok()?;
    let mut buf = h.to_vec();
    let start = buf.len();
    buf.resize(start + hdr.payload_len as usize, 0);
    s.read_exact(&mut buf[start..]).await.ok()?;
    Some((hdr, buf))
}

async fn pump(mut from: TcpStream, mut to: TcpStream, mangle: Mangle, c2s: bool) {
    let mut nth = 0usize;
    let mut held: Option<Vec<u8>> = None;
    let mut silent = false;
    while let Some((hdr, mut bytes)) = read_frame(&mut from).await {
        if silent {
            continue;
        }
        if !c2s && mangle == Mangle::SilenceServer && hdr.kind == FrameKind::AuthOk {
            silent = true;
        }
        if c2s && hdr.kind == FrameKind::Message {
            let i = nth;
            nth += 1;
            match mangle {
                Mangle::Duplicate(n) if n == i && to.write_all(&bytes).await.is_err() => {
                    return;
                }
                Mangle::Swap(n) if n == i => {
                    held = Some(bytes);
                    continue;
                }
                Mangle::Flip(n) if n == i => {
                    let last = bytes.len() - 1;
                    bytes[last] ^= 0x10;
                }
                Mangle::FlipAt(n, at) if n == i => {
                    bytes[HEADER_LEN + at] ^= 0x04;
                }
                Mangle::ForgeLength(n) if n == i => {
                    bytes[10..14].copy_from_slice(&FORGED_LEN.to_le_bytes());
                }
                _ => {}
            }
        }
        if to.write_all(&bytes).await.is_err() {
            return;
        }
        if let Some(h) = held.take() {
            if to.write_all(&h).await.is_err() {
                return;
            }
        }
    }
}

/// Starts a proxy in front of `target`; returns its address.
pub async fn proxy(target: SocketAddr, mangle: Mangle) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind(any_port()).await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut set = JoinSet::new();
        while let Ok((client, _)) = l.accept().await {
            let Ok(server) = TcpStream::connect(target).await else {
                continue;
            };
            let (cr, cw) = (client.into_std().unwrap(), server.into_std().unwrap());
            let (cr2, cw2) = (cr.try_clone().unwrap(), cw.try_clone().unwrap());
            let c_in = TcpStream::from_std(cr).unwrap();
            let c_out = TcpStream::from_std(cr2).unwrap();
            let s_in = TcpStream::from_std(cw).unwrap();
            let s_out = TcpStream::from_std(cw2).unwrap();
            set.spawn(pump(c_in, s_out, mangle, true));
            set.spawn(pump(s_in, c_out, mangle, false));
        }
    });
    (addr, task)
}

pub fn payload(len: usize, seed: u8) -> Bytes {
    // A 251-byte pattern copied in chunks: fast even in a debug build.
    let pat: Vec<u8> = (0..251u32)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(pat.len()) {
        c.copy_from_slice(&pat[..c.len()]);
    }
    Bytes::from(v)
}
