//! The mutual challenge–response handshake on a fresh stream, and the
//! negotiation of the frame mode inside it. Owns the message shapes and the
//! order of the exchange; the cryptography is in `auth`, the frame I/O in
//! `io`, the mode lists in `config`.
//!
//! ```text
//! C -> S  Hello        {client name, nonce_c, ticket?, first mode} + [its mode list]
//! S -> C  ServerHello  {server name, nonce_s, proof_s} + [the mode picked]   or AuthReject
//! C -> S  ClientProof  {proof_c}
//! S -> C  AuthOk (first signed frame, seq 0)                                or AuthReject
//! ```
//!
//! The bracketed parts are trailing extensions after the version-2 payload
//! (handshake version 2 decoders of earlier builds ignore trailing bytes),
//! so a peer of the exact-match handshake (one mode each side, equal or
//! refused) still talks to this one: see [`client`] and [`server`].

use crate::auth::{
    random_nonce, unseal_ticket, Credentials, FrameKey, KeyServer, Ticket, Transcript, NONCE_LEN,
};
use crate::config::{AcceptModes, FrameMode, FrameModes};
use crate::frame::{FrameKind, FrameSigner, FrameVerifier, HANDSHAKE_MAX_BYTES};
use crate::io::{read_frame, write_frame, write_unsigned};
use crate::keyring::Secret;
use crate::MsgError;
use bytes::Bytes;
use cairn_types::{encode_versioned, EntityName};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

/// Version 2 (wire version 5): `Hello` carries the frame mode the client
/// asks for, and both proofs cover it.
const HANDSHAKE_VERSION: u8 = 2;
/// Version of the trailing mode extensions (`Hello::offered`,
/// `ServerHello::picked`, `AuthReject::allowed`). A later version may add
/// fields after these; this build reads its own prefix.
const MODES_EXT_VERSION: u8 = 1;
/// Most modes a peer may offer (known or not); more is a protocol error.
const MAX_OFFERED_MODES: usize = 8;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub name: EntityName,
    pub nonce: [u8; NONCE_LEN],
    pub ticket: Option<(u64, Vec<u8>)>,
    /// [`FrameMode`] as its wire byte: the only mode a peer of the
    /// exact-match handshake reads (it must equal its own).
    pub mode: u8,
    /// Trailing extension: the client's whole mode list (wire bytes, most
    /// preferred first; contains `mode`). `None` from an exact-match peer.
    #[serde(skip)]
    pub offered: Option<Vec<u8>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ServerHello {
    pub name: EntityName,
    pub nonce: [u8; NONCE_LEN],
    pub proof: [u8; 32],
    /// Trailing extension: the mode the server picked from `offered`
    /// (answers a Hello that had the list, never one without it).
    #[serde(skip)]
    pub picked: Option<u8>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ClientProof {
    pub proof: [u8; 32],
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct AuthReject {
    pub reason: String,
    /// Trailing extension: the modes the refusing server allows from this
    /// peer. Its presence also says that the server negotiates, so the
    /// client must not retry in another mode (see [`client`]).
    #[serde(skip)]
    pub allowed: Option<Vec<u8>>,
}

#[derive(Serialize, Deserialize)]
struct HelloModes {
    offered: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct ServerModes {
    picked: u8,
}

#[derive(Serialize, Deserialize)]
struct RejectModes {
    allowed: Vec<u8>,
}

/// `[2][postcard body]`, then `[1][postcard extension]` when there is one.
fn encode_with_ext<T: Serialize, E: Serialize>(body: &T, ext: Option<E>) -> Vec<u8> {
    let mut out = encode_versioned(HANDSHAKE_VERSION, body);
    if let Some(e) = ext {
        out.extend_from_slice(&encode_versioned(MODES_EXT_VERSION, &e));
    }
    out
}

fn encode_hello(h: &Hello) -> Vec<u8> {
    let ext = h.offered.clone().map(|offered| HelloModes { offered });
    encode_with_ext(h, ext)
}

fn encode_server_hello(h: &ServerHello) -> Vec<u8> {
    encode_with_ext(h, h.picked.map(|picked| ServerModes { picked }))
}

fn encode_reject(r: &AuthReject) -> Vec<u8> {
    let ext = r.allowed.clone().map(|allowed| RejectModes { allowed });
    encode_with_ext(r, ext)
}

/// The inverse of [`encode_with_ext`]. Bytes after the extension (from a
/// later extension version) are ignored, as earlier builds ignore the
/// extension itself.
fn decode_with_ext<T: serde::de::DeserializeOwned, E: serde::de::DeserializeOwned>(
    peer: &str,
    what: &'static str,
    p: &[u8],
) -> Result<(T, Option<E>), MsgError> {
    let bad = |reason: String| MsgError::protocol(peer, format!("malformed {what}: {reason}"));
    if p.len() > HANDSHAKE_MAX_BYTES {
        return Err(bad(format!(
            "{} bytes, over the limit of {HANDSHAKE_MAX_BYTES}",
            p.len()
        )));
    }
    let Some((&version, body)) = p.split_first() else {
        return Err(bad("empty".into()));
    };
    if version != HANDSHAKE_VERSION {
        return Err(MsgError::protocol(
            peer,
            format!(
                "{what} encoded with format version {version}, this build understands version {HANDSHAKE_VERSION}; upgrade the older side"
            ),
        ));
    }
    let (value, rest) = postcard::take_from_bytes::<T>(body).map_err(|e| bad(e.to_string()))?;
    let Some((&ext_version, ext)) = rest.split_first() else {
        return Ok((value, None));
    };
    if ext_version < MODES_EXT_VERSION {
        return Err(bad(format!("extension version {ext_version}")));
    }
    let (e, _later) =
        postcard::take_from_bytes::<E>(ext).map_err(|e| bad(format!("extension: {e}")))?;
    Ok((value, Some(e)))
}

/// A decoded handshake payload.
#[derive(Debug)]
pub(crate) enum HandshakeMsg {
    Hello(Hello),
    ServerHello(ServerHello),
    ClientProof(ClientProof),
    AuthReject(AuthReject),
}

fn checked_name(peer: &str, name: EntityName) -> Result<EntityName, MsgError> {
    // Re-parse the text form so a peer cannot smuggle a name our parser
    // would refuse (bad characters, over-long ids).
    name.to_string()
        .parse::<EntityName>()
        .map_err(|e| MsgError::protocol(peer, e))
}

/// Decodes the payload of an unsigned handshake frame. Total: never panics.
pub(crate) fn decode_handshake_payload(
    peer: &str,
    kind: FrameKind,
    payload: &[u8],
) -> Result<HandshakeMsg, MsgError> {
    Ok(match kind {
        FrameKind::Hello => {
            let (mut h, ext): (Hello, Option<HelloModes>) =
                decode_with_ext(peer, "handshake hello", payload)?;
            h.name = checked_name(peer, h.name)?;
            h.offered = ext.map(|e| e.offered);
            HandshakeMsg::Hello(h)
        }
        FrameKind::ServerHello => {
            let (mut h, ext): (ServerHello, Option<ServerModes>) =
                decode_with_ext(peer, "handshake server hello", payload)?;
            h.name = checked_name(peer, h.name)?;
            h.picked = ext.map(|e| e.picked);
            HandshakeMsg::ServerHello(h)
        }
        FrameKind::ClientProof => {
            let (p, _): (ClientProof, Option<()>) =
                decode_with_ext(peer, "handshake proof", payload)?;
            HandshakeMsg::ClientProof(p)
        }
        FrameKind::AuthReject => {
            let (mut r, ext): (AuthReject, Option<RejectModes>) =
                decode_with_ext(peer, "auth reject", payload)?;
            r.allowed = ext.map(|e| e.allowed);
            HandshakeMsg::AuthReject(r)
        }
        other => {
            return Err(MsgError::protocol(
                peer,
                format!("expected a handshake frame, got {other:?}"),
            ))
        }
    })
}

/// The result of a successful handshake.
pub(crate) struct Established {
    pub peer: EntityName,
    pub mode: FrameMode,
    pub peer_caps: Option<String>,
    pub signer: FrameSigner,
    pub verifier: FrameVerifier,
}

async fn read_handshake<R: AsyncRead + Unpin>(
    r: &mut R,
    peer: &str,
    idle: Duration,
) -> Result<(FrameKind, HandshakeMsg), MsgError> {
    let f = read_frame(r, peer, 0, idle, |_, _| Ok(())).await?;
    if f.header.kind.is_signed() {
        return Err(MsgError::protocol(
            peer,
            format!("expected a handshake frame, got {:?}", f.header.kind),
        ));
    }
    let msg = decode_handshake_payload(peer, f.header.kind, &f.payload)?;
    Ok((f.header.kind, msg))
}

fn unexpected(peer: &str, want: &str, got: FrameKind) -> MsgError {
    MsgError::protocol(peer, format!("handshake: expected {want}, got {got:?}"))
}

/// What one client attempt ended with.
pub(crate) enum ClientOutcome {
    Established(Box<Established>),
    /// A server of the exact-match handshake refused the mode asked for
    /// and named the one it requires, which is on our list: ask for that
    /// one on a new connection.
    RetryWith(FrameMode),
}

/// The modes as text for messages (`'crc secure'`); unknown wire bytes as
/// `mode#N`.
fn list_text(wire: &[u8]) -> String {
    let words: Vec<String> = wire
        .iter()
        .map(|&b| match FrameMode::from_wire(b) {
            Some(m) => m.as_str().to_string(),
            None => format!("mode#{b}"),
        })
        .collect();
    format!("'{}'", words.join(" "))
}

/// Where each side's list is set, for the "no common mode" errors.
fn settings_hint(client: &EntityName) -> &'static str {
    if client.kind == cairn_types::EntityKind::Osd {
        "ms_cluster_mode on both OSDs"
    } else {
        "ms_client_mode on the client, ms_service_mode on the OSD"
    }
}

/// The mode a server of the exact-match handshake requires, read from its
/// refusal ("osd.1 asked for 'crc' frames but osd.2 requires 'secure'
/// frames from it: …"; that text is fixed in those builds).
fn exact_match_required_mode(reason: &str) -> Option<FrameMode> {
    let (_, rest) = reason.split_once(" requires '")?;
    let (mode, tail) = rest.split_once('\'')?;
    if !tail.starts_with(" frames") {
        return None;
    }
    mode.parse().ok()
}

/// Connects and runs the client handshake, negotiating the frame mode:
/// the first attempt asks for `offer.first()` and sends the whole list; a
/// server of this version picks from the list (and says which it picked),
/// a server of the exact-match handshake reads only the first mode. If
/// such a server refuses it naming another mode of `offer`, a second
/// connection asks for that one. `open` makes a connected stream (bounded
/// by the caller); each handshake is bounded by `handshake_timeout`.
pub(crate) async fn negotiate<S, F, Fut>(
    mut open: F,
    addr_label: &str,
    creds: &Credentials,
    expect_peer: Option<&EntityName>,
    offer: FrameModes,
    handshake_timeout: Duration,
) -> Result<(S, Established), MsgError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<S, MsgError>>,
{
    let mut ask = offer.first();
    loop {
        let mut stream = open().await?;
        let attempt = client(
            &mut stream,
            addr_label,
            creds,
            expect_peer,
            Some(offer),
            ask,
            handshake_timeout,
        );
        match timeout(handshake_timeout, attempt).await {
            Err(_) => {
                return Err(MsgError::timeout(
                    addr_label,
                    "the authentication handshake to finish",
                    handshake_timeout,
                ))
            }
            Ok(Err(e)) => return Err(e),
            Ok(Ok(ClientOutcome::Established(est))) => return Ok((stream, *est)),
            // At most one retry: a second refusal cannot name yet another
            // mode that the first did not (`client` refuses to loop).
            Ok(Ok(ClientOutcome::RetryWith(mode))) => {
                tracing::debug!(
                    "{addr_label}: an older server requires '{mode}' frames; reconnecting in that mode"
                );
                ask = mode;
            }
        }
    }
}

/// One client attempt on a fresh stream. `peer` labels errors (the address
/// until the name is known). `offer`: our whole list (always, from
/// [`negotiate`]; `None` only in tests that play a client of the
/// exact-match handshake); `ask`: the mode put in the Hello's own field.
pub(crate) async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    addr_label: &str,
    creds: &Credentials,
    expect_peer: Option<&EntityName>,
    offer: Option<FrameModes>,
    ask: FrameMode,
    idle: Duration,
) -> Result<ClientOutcome, MsgError> {
    let me = creds.name();
    let nonce_c = random_nonce();
    let ticket = match creds {
        Credentials::Ticket { ticket, .. } => Some((ticket.generation, ticket.sealed.to_vec())),
        Credentials::Key { .. } => None,
    };
    // The list always goes out in our order of preference, also on a
    // retry that asks for a later mode: a server of this version picks from
    // the list, so a forged refusal cannot reorder it.
    let offered_wire = offer.map(|o| o.wire());
    let hello = Hello {
        name: me.clone(),
        nonce: nonce_c,
        ticket,
        mode: ask.wire(),
        offered: offered_wire.clone(),
    };
    write_unsigned(s, addr_label, FrameKind::Hello, &encode_hello(&hello)).await?;

    let sh = match read_handshake(s, addr_label, idle).await? {
        (_, HandshakeMsg::ServerHello(sh)) => sh,
        (_, HandshakeMsg::AuthReject(r)) => {
            return refused_before_proof(addr_label, me, offer, ask, r);
        }
        (kind, _) => return Err(unexpected(addr_label, "ServerHello", kind)),
    };
    let label = format!("{} ({addr_label})", sh.name);
    if let Some(want) = expect_peer {
        if &sh.name != want {
            return Err(MsgError::auth(
                &label,
                format!(
                    "expected to reach {want} but the server calls itself {}",
                    sh.name
                ),
            ));
        }
    }
    // A server that read our list says what it picked and binds the list
    // into its proof; one that did not (exact-match handshake) runs the
    // mode we asked for.
    let (mode, bound_list) = match (offer, sh.picked) {
        (Some(offer), Some(b)) => match FrameMode::from_wire(b) {
            Some(m) if offer.contains(m) => (m, offered_wire.as_deref()),
            _ => {
                return Err(MsgError::protocol(
                    &label,
                    format!(
                        "the server picked frame mode {} which {me} did not offer ({})",
                        list_text(&[b]),
                        list_text(&offer.wire())
                    ),
                ))
            }
        },
        _ => (ask, None),
    };
    let k = creds.secret();
    let t = Transcript {
        client: me,
        server: &sh.name,
        nonce_c: &nonce_c,
        nonce_s: &sh.nonce,
        mode,
        offered: bound_list,
    };
    if !crate::auth::mac_eq(&t.server_proof(k), &sh.proof) {
        let what = match creds {
            Credentials::Key { .. } => format!("the key of {me}"),
            Credentials::Ticket { .. } => format!("the session key of {me}'s ticket"),
        };
        // Tell the server why we hang up (best effort), so its log says so.
        let body = encode_reject(&AuthReject {
            reason: format!("the server's proof does not verify under {what}"),
            allowed: None,
        });
        let _ = write_unsigned(s, &label, FrameKind::AuthReject, &body).await;
        return Err(MsgError::auth(
            &label,
            format!(
                "the server's proof does not verify under {what}: either that key is wrong or the server does not know it (wrong cluster or an impostor); nothing else was sent"
            ),
        ));
    }
    let proof = ClientProof {
        proof: t.client_proof(k),
    };
    write_unsigned(
        s,
        &label,
        FrameKind::ClientProof,
        &encode_versioned(HANDSHAKE_VERSION, &proof),
    )
    .await?;
    let (c2s, s2c) = t.session_keys(k);
    let mut verifier = FrameVerifier::new(FrameKey::with_mode(&s2c, mode));

    let f = read_frame(s, &label, 0, idle, |_, _| Ok(())).await?;
    match f.header.kind {
        FrameKind::AuthOk => {
            verifier
                .verify(&f.raw_header, &f.header, &f.payload)
                .map_err(|e| {
                    MsgError::auth(
                        &label,
                        format!("the server's AuthOk is not signed with our session key ({e})"),
                    )
                })?;
        }
        FrameKind::AuthReject => {
            let reason = match decode_handshake_payload(&label, f.header.kind, &f.payload)? {
                HandshakeMsg::AuthReject(r) => r.reason,
                _ => String::new(),
            };
            return Err(MsgError::auth(
                &label,
                format!("the server refused {me}: {reason}"),
            ));
        }
        other => return Err(unexpected(&label, "AuthOk", other)),
    }
    Ok(ClientOutcome::Established(Box::new(Established {
        peer: sh.name,
        mode,
        peer_caps: None,
        signer: FrameSigner::new(FrameKey::with_mode(&c2s, mode)),
        verifier,
    })))
}

/// The server refused our Hello. A server that negotiates says so (its
/// refusal carries its list): final. One of the exact-match handshake that
/// names another mode of our list: retry in that mode. Anything else:
/// final, naming both sides' modes when the refusal was about modes.
///
/// The refusal is not authenticated (nothing is, before the proofs), so
/// an on-path attacker can forge one and make us retry: with a server of
/// this version the retry still sends (and binds) the whole list, with an
/// exact-match server it can at worst move the connection to another mode
/// of our own list, never to one outside it.
fn refused_before_proof(
    addr_label: &str,
    me: &EntityName,
    offer: Option<FrameModes>,
    ask: FrameMode,
    r: AuthReject,
) -> Result<ClientOutcome, MsgError> {
    let refused = |reason: String| {
        Err(MsgError::auth(
            addr_label,
            format!("the server refused {me}: {reason}"),
        ))
    };
    let no_common = |reason: String| {
        Err(MsgError::NoCommonMode {
            peer: addr_label.to_string(),
            reason: format!("the server refused {me}: {reason}"),
        })
    };
    // A negotiating server's refusal carries what it allows from us: when
    // none of our modes is in it, the refusal was about modes, and no retry
    // can cure it until someone changes a setting.
    if let Some(allowed) = &r.allowed {
        let ours = offer.map(|o| o.wire()).unwrap_or_else(|| vec![ask.wire()]);
        if !allowed.is_empty() && !ours.iter().any(|m| allowed.contains(m)) {
            return no_common(r.reason);
        }
    }
    let (Some(offer), None) = (offer, &r.allowed) else {
        return refused(r.reason);
    };
    let Some(required) = exact_match_required_mode(&r.reason) else {
        return refused(r.reason);
    };
    if required != ask && offer.contains(required) {
        return Ok(ClientOutcome::RetryWith(required));
    }
    no_common(format!(
        "{} — no common frame mode: the server (an older version that takes exactly one mode) requires '{required}', {me} offers '{offer}' ({})",
        r.reason,
        settings_hint(me)
    ))
}

async fn reject<S: AsyncWrite + Unpin>(
    s: &mut S,
    peer: &str,
    allowed: FrameModes,
    reason: String,
) -> MsgError {
    let body = encode_reject(&AuthReject {
        reason: reason.clone(),
        allowed: Some(allowed.wire()),
    });
    // Best effort: the peer learns why; our error says the same.
    let _ = write_unsigned(s, peer, FrameKind::AuthReject, &body).await;
    MsgError::auth(peer, reason)
}

/// The mode this server runs a connection in, from the client's Hello and
/// `allowed` (this server's list for that kind of peer): the first mode of
/// the client's list that `allowed` contains; from a client of the
/// exact-match handshake (no list), its one mode if `allowed` has it.
/// `Err` is the refusal's reason, naming both sides' modes.
fn pick_mode(me: &EntityName, hello: &Hello, allowed: FrameModes) -> Result<FrameMode, String> {
    let Some(offered) = &hello.offered else {
        return match FrameMode::from_wire(hello.mode) {
            Some(m) if allowed.contains(m) => Ok(m),
            Some(m) => Err(format!(
                "{} asked for '{m}' frames (an older version: exactly one mode) but {me} allows only '{allowed}' from it: no common frame mode ({})",
                hello.name,
                settings_hint(&hello.name)
            )),
            None => Err(format!(
                "{} asked for an unknown frame mode (byte {}); {me} allows '{allowed}'",
                hello.name, hello.mode
            )),
        };
    };
    if offered.len() > MAX_OFFERED_MODES || !offered.contains(&hello.mode) {
        return Err(format!(
            "{} sent a malformed frame mode list {} (first mode byte {})",
            hello.name,
            list_text(offered),
            hello.mode
        ));
    }
    let known: Vec<FrameMode> = offered
        .iter()
        .filter_map(|&b| FrameMode::from_wire(b))
        .collect();
    allowed.pick(&known).ok_or_else(|| {
        format!(
            "{} offers frame modes {} (in its order of preference) but {me} allows only '{allowed}' from it: no common frame mode ({})",
            hello.name,
            list_text(offered),
            settings_hint(&hello.name)
        )
    })
}

/// Server side.
pub(crate) async fn server<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    addr_label: &str,
    me: &EntityName,
    keys: &dyn KeyServer,
    accept: AcceptModes,
    idle: Duration,
) -> Result<Established, MsgError> {
    let hello = match read_handshake(s, addr_label, idle).await? {
        (_, HandshakeMsg::Hello(h)) => h,
        (kind, _) => return Err(unexpected(addr_label, "Hello", kind)),
    };
    let label = format!("{} ({addr_label})", hello.name);
    let allowed = accept.for_peer(&hello.name);
    // No common mode is a configuration error and is said so at once
    // (before any key work).
    let mode = match pick_mode(me, &hello, allowed) {
        Ok(m) => m,
        Err(reason) => return Err(reject(s, &label, allowed, reason).await),
    };
    let (k, caps): (Secret, Option<String>) = match &hello.ticket {
        None => match keys.secret_for(&hello.name) {
            Some(k) => (k, None),
            None => {
                return Err(reject(s, &label, allowed, format!("{me} does not know the entity {}: create it with 'cairn auth get-or-create' or use the right keyring", hello.name)).await)
            }
        },
        Some((generation, sealed)) => {
            let Some(service) = keys.service_secret(*generation) else {
                return Err(reject(s, &label, allowed, format!("ticket generation {generation} is not known to {me} (expired or rotated); obtain a fresh ticket from the monitors")).await);
            };
            let ticket = Ticket {
                generation: *generation,
                sealed: Bytes::copy_from_slice(sealed),
            };
            let contents = match unseal_ticket(&service, &ticket) {
                Ok(c) => c,
                Err(e) => return Err(reject(s, &label, allowed, e).await),
            };
            if contents.name != hello.name {
                return Err(reject(s, &label, allowed, format!("the ticket was issued to {}, not to {}", contents.name, hello.name)).await);
            }
            (contents.session, Some(contents.caps))
        }
    };
    let nonce_s = random_nonce();
    let t = Transcript {
        client: &hello.name,
        server: me,
        nonce_c: &hello.nonce,
        nonce_s: &nonce_s,
        mode,
        offered: hello.offered.as_deref(),
    };
    let sh = ServerHello {
        name: me.clone(),
        nonce: nonce_s,
        proof: t.server_proof(&k),
        picked: hello.offered.as_ref().map(|_| mode.wire()),
    };
    write_unsigned(s, &label, FrameKind::ServerHello, &encode_server_hello(&sh)).await?;
    let proof = match read_handshake(s, &label, idle).await {
        Ok((_, HandshakeMsg::ClientProof(p))) => p,
        Ok((_, HandshakeMsg::AuthReject(r))) => {
            return Err(MsgError::auth(
                &label,
                format!(
                    "{} refused our proof ({}): the key we hold for it differs from the one it uses",
                    hello.name, r.reason
                ),
            ))
        }
        Ok((kind, _)) => return Err(unexpected(&label, "ClientProof", kind)),
        Err(MsgError::Closed { .. }) => {
            return Err(MsgError::auth(
                &label,
                format!(
                    "{} hung up after our challenge (its key differs from ours, or it expected another server)",
                    hello.name
                ),
            ))
        }
        Err(e) => return Err(e),
    };
    if !crate::auth::mac_eq(&t.client_proof(&k), &proof.proof) {
        return Err(reject(
            s,
            &label,
            allowed,
            format!("the proof of {} does not verify: wrong key", hello.name),
        )
        .await);
    }
    let (c2s, s2c) = t.session_keys(&k);
    let mut signer = FrameSigner::new(FrameKey::with_mode(&s2c, mode));
    let mut hdr = crate::frame::FrameHeader::new(FrameKind::AuthOk, 0, 0);
    let raw = signer.seal(&mut hdr, &[]);
    write_frame(s, &raw, &[])
        .await
        .map_err(|e| MsgError::io(&label, "sending AuthOk", &e))?;
    s.flush()
        .await
        .map_err(|e| MsgError::io(&label, "sending AuthOk", &e))?;
    Ok(Established {
        peer: hello.name,
        mode,
        peer_caps: caps,
        signer,
        verifier: FrameVerifier::new(FrameKey::with_mode(&c2s, mode)),
    })
}

/// One valid frame of each handshake kind (unsigned), for fuzz seeds and
/// decoder tests.
pub(crate) fn sample_frames() -> Vec<Vec<u8>> {
    fn frame(kind: FrameKind, payload: Vec<u8>) -> Vec<u8> {
        let h = crate::frame::FrameHeader::new(kind, 0, payload.len() as u32);
        let mut v = h.encode().to_vec();
        v.extend_from_slice(&payload);
        v
    }
    let ticket = crate::auth::issue_ticket(
        &Secret::from_bytes([1; 32]),
        2,
        &EntityName::osd(1),
        "osd 'allow *'",
        &Secret::from_bytes([2; 32]),
    );
    vec![
        // A Hello of the exact-match handshake (no mode list).
        frame(
            FrameKind::Hello,
            encode_hello(&Hello {
                name: EntityName::client("admin"),
                nonce: [3; NONCE_LEN],
                ticket: None,
                mode: FrameMode::Secure.wire(),
                offered: None,
            }),
        ),
        frame(
            FrameKind::Hello,
            encode_hello(&Hello {
                name: EntityName::osd(1),
                nonce: [4; NONCE_LEN],
                ticket: Some((ticket.generation, ticket.sealed.to_vec())),
                mode: FrameMode::Crc.wire(),
                offered: Some(vec![FrameMode::Crc.wire(), FrameMode::Secure.wire()]),
            }),
        ),
        frame(
            FrameKind::ServerHello,
            encode_server_hello(&ServerHello {
                name: EntityName::mon("a"),
                nonce: [5; NONCE_LEN],
                proof: [6; 32],
                picked: Some(FrameMode::Crc.wire()),
            }),
        ),
        frame(
            FrameKind::ClientProof,
            encode_versioned(HANDSHAKE_VERSION, &ClientProof { proof: [7; 32] }),
        ),
        frame(
            FrameKind::AuthReject,
            encode_reject(&AuthReject {
                reason: "wrong key".into(),
                allowed: Some(vec![FrameMode::Secure.wire()]),
            }),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameHeader;
    use tokio::io::DuplexStream;

    #[test]
    fn samples_decode() {
        for f in sample_frames() {
            let sf = crate::frame::split_frame(&f, 0).unwrap();
            decode_handshake_payload("test", sf.header.kind, sf.payload).unwrap();
        }
    }

    #[test]
    fn an_exact_match_decoder_reads_a_hello_with_a_list_and_we_read_its_hello() {
        let with_list = Hello {
            name: EntityName::client("admin"),
            nonce: [9; NONCE_LEN],
            ticket: None,
            mode: FrameMode::Crc.wire(),
            offered: Some(vec![1, 2]),
        };
        // What builds before mode lists do: decode_versioned, which stops
        // after the version-2 fields.
        let (_, old): (u8, Hello) = cairn_types::decode_versioned(
            "hello",
            &encode_hello(&with_list),
            HANDSHAKE_VERSION,
            HANDSHAKE_VERSION,
            HANDSHAKE_MAX_BYTES,
        )
        .unwrap();
        assert_eq!(
            (old.name, old.mode, old.offered),
            (with_list.name.clone(), 1, None)
        );
        // Their Hello (no extension) decodes here with no list.
        let theirs = encode_versioned(
            HANDSHAKE_VERSION,
            &Hello {
                offered: None,
                ..with_list
            },
        );
        match decode_handshake_payload("t", FrameKind::Hello, &theirs).unwrap() {
            HandshakeMsg::Hello(h) => assert_eq!((h.mode, h.offered), (1, None)),
            _ => panic!("not a hello"),
        }
        // A later extension version's extra bytes are ignored; version 0 is refused.
        let mut later = encode_hello(&Hello {
            name: EntityName::client("admin"),
            nonce: [9; NONCE_LEN],
            ticket: None,
            mode: 2,
            offered: Some(vec![2]),
        });
        later.extend_from_slice(&[7, 7, 7]);
        assert!(decode_handshake_payload("t", FrameKind::Hello, &later).is_ok());
        let mut zero = encode_versioned(HANDSHAKE_VERSION, &ClientProof { proof: [1; 32] });
        zero.push(0);
        assert!(decode_handshake_payload("t", FrameKind::ClientProof, &zero).is_err());
    }

    #[test]
    fn the_exact_match_refusal_text_names_the_required_mode() {
        let r = "client.admin asked for 'crc' frames but osd.2 requires 'secure' frames from it: the two sides' messenger modes differ (ms_cluster_mode between OSDs, ms_client_mode for clients); set the same value on both";
        assert_eq!(exact_match_required_mode(r), Some(FrameMode::Secure));
        assert_eq!(
            exact_match_required_mode("osd.2 does not know the entity client.x"),
            None
        );
        assert_eq!(exact_match_required_mode("x requires 'tls' frames"), None);
    }

    struct OneKey(Secret);
    impl KeyServer for OneKey {
        fn secret_for(&self, _: &EntityName) -> Option<Secret> {
            Some(self.0.clone())
        }
        fn service_secret(&self, _: u64) -> Option<Secret> {
            None
        }
    }

    fn creds(name: EntityName, key: &Secret) -> Credentials {
        Credentials::Key {
            name,
            secret: key.clone(),
        }
    }

    const IDLE: Duration = Duration::from_secs(5);

    /// A server of the exact-match handshake (the one before mode lists),
    /// as those builds run it: reads only the Hello's mode, requires it to
    /// be `require`, refuses with their text, binds only that mode.
    async fn exact_match_server(
        s: &mut DuplexStream,
        key: &Secret,
        require: FrameMode,
    ) -> Result<Established, MsgError> {
        let me = EntityName::osd(2);
        let hello = match read_handshake(s, "c", IDLE).await? {
            (_, HandshakeMsg::Hello(h)) => h,
            (kind, _) => return Err(unexpected("c", "Hello", kind)),
        };
        let m = FrameMode::from_wire(hello.mode).unwrap();
        if m != require {
            let reason = format!(
                "{} asked for '{m}' frames but {me} requires '{require}' frames from it: the two sides' messenger modes differ (ms_cluster_mode between OSDs, ms_client_mode for clients); set the same value on both",
                hello.name
            );
            let body = encode_versioned(
                HANDSHAKE_VERSION,
                &AuthReject {
                    reason: reason.clone(),
                    allowed: None,
                },
            );
            write_unsigned(s, "c", FrameKind::AuthReject, &body).await?;
            return Err(MsgError::auth("c", reason));
        }
        let nonce_s = random_nonce();
        let t = Transcript {
            client: &hello.name,
            server: &me,
            nonce_c: &hello.nonce,
            nonce_s: &nonce_s,
            mode: m,
            offered: None,
        };
        let sh = ServerHello {
            name: me.clone(),
            nonce: nonce_s,
            proof: t.server_proof(key),
            picked: None,
        };
        let body = encode_versioned(HANDSHAKE_VERSION, &sh);
        write_unsigned(s, "c", FrameKind::ServerHello, &body).await?;
        let proof = match read_handshake(s, "c", IDLE).await? {
            (_, HandshakeMsg::ClientProof(p)) => p,
            (kind, _) => return Err(unexpected("c", "ClientProof", kind)),
        };
        assert!(crate::auth::mac_eq(&t.client_proof(key), &proof.proof));
        let (c2s, s2c) = t.session_keys(key);
        let mut signer = FrameSigner::new(FrameKey::with_mode(&s2c, m));
        let raw = signer.seal(&mut FrameHeader::new(FrameKind::AuthOk, 0, 0), &[]);
        write_frame(s, &raw, &[]).await.unwrap();
        s.flush().await.unwrap();
        Ok(Established {
            peer: hello.name,
            mode: m,
            peer_caps: None,
            signer,
            verifier: FrameVerifier::new(FrameKey::with_mode(&c2s, m)),
        })
    }

    /// Frames sealed by one side verify on the other, in the agreed mode.
    fn assert_talks(a: &mut Established, b: &mut Established, mode: FrameMode) {
        assert_eq!((a.mode, b.mode), (mode, mode));
        fn one_way(from: &mut Established, to: &mut Established) {
            let mut h = FrameHeader::new(FrameKind::Message, 3, 5);
            let raw = from.signer.seal(&mut h, b"hello");
            to.verifier.verify(&raw, &h, b"hello").unwrap();
        }
        one_way(a, b);
        one_way(b, a);
    }

    /// This version's client (`negotiate`, list `offer`) against a server
    /// run by `serve` on each new connection; returns both ends' results
    /// and how many connections the client opened.
    async fn against<F, Fut>(
        offer: FrameModes,
        serve: F,
    ) -> (
        Result<Established, MsgError>,
        Vec<Result<Established, MsgError>>,
        usize,
    )
    where
        F: Fn(DuplexStream) -> Fut,
        Fut: Future<Output = Result<Established, MsgError>> + Send + 'static,
    {
        let key = Secret::from_bytes([4; 32]);
        let servers = std::sync::Mutex::new(Vec::new());
        let opened = std::sync::atomic::AtomicUsize::new(0);
        let open = || {
            let (c, srv) = tokio::io::duplex(64 << 10);
            servers.lock().unwrap().push(tokio::spawn(serve(srv)));
            opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { Ok::<_, MsgError>(c) }
        };
        let me = creds(EntityName::client("admin"), &key);
        let client = negotiate(open, "osd.2 (test)", &me, None, offer, IDLE)
            .await
            .map(|(_, est)| est);
        let handles = std::mem::take(&mut *servers.lock().unwrap());
        let mut served = Vec::new();
        for h in handles {
            served.push(h.await.unwrap());
        }
        (client, served, opened.into_inner())
    }

    fn new_server(
        allowed: FrameModes,
    ) -> impl Fn(
        DuplexStream,
    )
        -> std::pin::Pin<Box<dyn Future<Output = Result<Established, MsgError>> + Send>> {
        move |mut s| {
            Box::pin(async move {
                let keys = OneKey(Secret::from_bytes([4; 32]));
                server(
                    &mut s,
                    "c",
                    &EntityName::osd(2),
                    &keys,
                    AcceptModes::all(allowed),
                    IDLE,
                )
                .await
            })
        }
    }

    fn old_server(
        require: FrameMode,
    ) -> impl Fn(
        DuplexStream,
    )
        -> std::pin::Pin<Box<dyn Future<Output = Result<Established, MsgError>> + Send>> {
        move |mut s| {
            Box::pin(async move {
                exact_match_server(&mut s, &Secret::from_bytes([4; 32]), require).await
            })
        }
    }

    const CRC_SECURE: FrameModes = FrameModes::prefer(FrameMode::Crc, FrameMode::Secure);
    const SECURE_CRC: FrameModes = FrameModes::prefer(FrameMode::Secure, FrameMode::Crc);
    const CRC: FrameModes = FrameModes::only(FrameMode::Crc);
    const SECURE: FrameModes = FrameModes::only(FrameMode::Secure);

    #[tokio::test]
    async fn both_sides_negotiating_take_the_first_client_mode_the_server_allows() {
        for (offer, allowed, want) in [
            (CRC_SECURE, CRC_SECURE, FrameMode::Crc),
            (CRC_SECURE, SECURE_CRC, FrameMode::Crc),
            (SECURE_CRC, CRC_SECURE, FrameMode::Secure),
            (CRC_SECURE, SECURE, FrameMode::Secure),
            (SECURE_CRC, CRC, FrameMode::Crc),
        ] {
            let (c, mut s, opened) = against(offer, new_server(allowed)).await;
            assert_eq!(opened, 1, "{offer} -> {allowed}");
            assert_talks(&mut c.unwrap(), s[0].as_mut().unwrap(), want);
        }
    }

    #[tokio::test]
    async fn no_common_mode_is_refused_naming_both_lists() {
        let (c, s, opened) = against(CRC, new_server(SECURE)).await;
        assert_eq!(opened, 1);
        let e = c.err().unwrap().to_string();
        assert!(
            e.contains("offers frame modes 'crc'") && e.contains("allows only 'secure'"),
            "{e}"
        );
        assert!(
            e.contains("ms_client_mode") && e.contains("ms_service_mode"),
            "{e}"
        );
        assert!(s[0].is_err());
    }

    #[tokio::test]
    async fn a_client_with_a_list_reaches_an_exact_match_server_in_any_mode_of_its_list() {
        // The server requires the first mode: one connection.
        let (c, mut s, opened) = against(CRC_SECURE, old_server(FrameMode::Crc)).await;
        assert_eq!(opened, 1);
        assert_talks(&mut c.unwrap(), s[0].as_mut().unwrap(), FrameMode::Crc);
        // It requires the second: refused once, then a second connection.
        let (c, mut s, opened) = against(CRC_SECURE, old_server(FrameMode::Secure)).await;
        assert_eq!(opened, 2);
        assert!(s[0].is_err());
        assert_talks(&mut c.unwrap(), s[1].as_mut().unwrap(), FrameMode::Secure);
        // It requires a mode not on the list: a clear error, no retry.
        let (c, _, opened) = against(CRC, old_server(FrameMode::Secure)).await;
        assert_eq!(opened, 1);
        let e = c.err().unwrap().to_string();
        assert!(
            e.contains("no common frame mode")
                && e.contains("requires 'secure'")
                && e.contains("offers 'crc'"),
            "{e}"
        );
    }

    /// A client of the exact-match handshake: the Hello has one mode, no
    /// list, and it requires the server to run exactly that one.
    async fn exact_match_client(
        allowed: FrameModes,
        mode: FrameMode,
    ) -> (Result<Established, MsgError>, Result<Established, MsgError>) {
        let key = Secret::from_bytes([4; 32]);
        let (mut c, srv) = tokio::io::duplex(64 << 10);
        let serving = tokio::spawn(new_server(allowed)(srv));
        let me = creds(EntityName::client("admin"), &key);
        let client = match client(&mut c, "osd.2", &me, None, None, mode, IDLE).await {
            Ok(ClientOutcome::Established(e)) => Ok(*e),
            Ok(ClientOutcome::RetryWith(_)) => panic!("an exact-match client never retries"),
            Err(e) => Err(e),
        };
        (client, serving.await.unwrap())
    }

    #[tokio::test]
    async fn an_exact_match_client_reaches_a_server_whose_list_has_its_mode() {
        for (allowed, mode) in [
            (CRC_SECURE, FrameMode::Secure),
            (CRC_SECURE, FrameMode::Crc),
            (SECURE, FrameMode::Secure),
        ] {
            let (c, mut s) = exact_match_client(allowed, mode).await;
            assert_talks(&mut c.unwrap(), s.as_mut().unwrap(), mode);
        }
        let (c, s) = exact_match_client(SECURE, FrameMode::Crc).await;
        let e = c.err().unwrap().to_string();
        assert!(
            e.contains("asked for 'crc' frames") && e.contains("allows only 'secure'"),
            "{e}"
        );
        assert!(s.is_err());
    }

    #[tokio::test]
    async fn a_shortened_list_breaks_the_proofs() {
        // An attacker who drops 'secure' from a negotiating client's list
        // (to steer the server to crc) changes the transcript: the server's
        // proof no longer verifies at the client.
        let key = Secret::from_bytes([4; 32]);
        let (mut c, mut mid) = tokio::io::duplex(64 << 10);
        let (mut to_srv, srv) = tokio::io::duplex(64 << 10);
        let serving = tokio::spawn(new_server(CRC_SECURE)(srv));
        let me = creds(EntityName::client("admin"), &key);
        let relay = tokio::spawn(async move {
            let f = read_frame(&mut mid, "c", 0, IDLE, |_, _| Ok(()))
                .await
                .unwrap();
            let HandshakeMsg::Hello(mut h) =
                decode_handshake_payload("c", FrameKind::Hello, &f.payload).unwrap()
            else {
                panic!("not a hello")
            };
            h.mode = FrameMode::Crc.wire();
            h.offered = Some(vec![FrameMode::Crc.wire()]);
            write_unsigned(&mut to_srv, "s", FrameKind::Hello, &encode_hello(&h))
                .await
                .unwrap();
            let f = read_frame(&mut to_srv, "s", 0, IDLE, |_, _| Ok(()))
                .await
                .unwrap();
            write_unsigned(&mut mid, "c", f.header.kind, &f.payload)
                .await
                .unwrap();
            // Keep both streams open until the client has judged the proof.
            let _ = read_frame(&mut mid, "c", 0, IDLE, |_, _| Ok(())).await;
        });
        let r = client(
            &mut c,
            "osd.2",
            &me,
            None,
            Some(SECURE_CRC),
            FrameMode::Secure,
            IDLE,
        )
        .await;
        let e = r.err().unwrap().to_string();
        assert!(e.contains("proof does not verify"), "{e}");
        drop(c);
        let _ = relay.await;
        serving.abort();
    }
}
