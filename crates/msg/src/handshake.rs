//! The mutual challenge–response handshake on a fresh stream. Owns the
//! message shapes and the order of the exchange; the cryptography is in
//! `auth`, the frame I/O in `io`.
//!
//! ```text
//! C -> S  Hello        {client name, nonce_c, ticket?, frame mode}
//! S -> C  ServerHello  {server name, nonce_s, HMAC_K(server-label, nonces, names)}   or AuthReject
//! C -> S  ClientProof  {HMAC_K(client-label, nonces, names)}
//! S -> C  AuthOk (first signed frame, seq 0)                                      or AuthReject
//! ```

use crate::auth::{
    random_nonce, unseal_ticket, Credentials, FrameKey, KeyServer, Ticket, Transcript, NONCE_LEN,
};
use crate::config::{AcceptModes, FrameMode};
use crate::frame::{FrameKind, FrameSigner, FrameVerifier, HANDSHAKE_MAX_BYTES};
use crate::io::{read_frame, write_frame, write_unsigned};
use crate::keyring::Secret;
use crate::MsgError;
use bytes::Bytes;
use cairn_types::{decode_versioned, encode_versioned, EntityName};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// Version 2 (wire version 5): `Hello` carries the frame mode the client
/// asks for, and both proofs cover it.
const HANDSHAKE_VERSION: u8 = 2;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub name: EntityName,
    pub nonce: [u8; NONCE_LEN],
    pub ticket: Option<(u64, Vec<u8>)>,
    /// [`FrameMode`] as its wire byte.
    pub mode: u8,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ServerHello {
    pub name: EntityName,
    pub nonce: [u8; NONCE_LEN],
    pub proof: [u8; 32],
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ClientProof {
    pub proof: [u8; 32],
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct AuthReject {
    pub reason: String,
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
    fn dec<T: serde::de::DeserializeOwned>(
        peer: &str,
        what: &'static str,
        p: &[u8],
    ) -> Result<T, MsgError> {
        decode_versioned(
            what,
            p,
            HANDSHAKE_VERSION,
            HANDSHAKE_VERSION,
            HANDSHAKE_MAX_BYTES,
        )
        .map(|(_, v)| v)
        .map_err(|e| MsgError::protocol(peer, e.to_string()))
    }
    Ok(match kind {
        FrameKind::Hello => {
            let mut h: Hello = dec(peer, "handshake hello", payload)?;
            h.name = checked_name(peer, h.name)?;
            HandshakeMsg::Hello(h)
        }
        FrameKind::ServerHello => {
            let mut h: ServerHello = dec(peer, "handshake server hello", payload)?;
            h.name = checked_name(peer, h.name)?;
            HandshakeMsg::ServerHello(h)
        }
        FrameKind::ClientProof => HandshakeMsg::ClientProof(dec(peer, "handshake proof", payload)?),
        FrameKind::AuthReject => HandshakeMsg::AuthReject(dec(peer, "auth reject", payload)?),
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

/// Client side. `peer` labels errors (the address until the name is known).
pub(crate) async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    addr_label: &str,
    creds: &Credentials,
    expect_peer: Option<&EntityName>,
    mode: FrameMode,
    idle: Duration,
) -> Result<Established, MsgError> {
    let me = creds.name();
    let nonce_c = random_nonce();
    let ticket = match creds {
        Credentials::Ticket { ticket, .. } => Some((ticket.generation, ticket.sealed.to_vec())),
        Credentials::Key { .. } => None,
    };
    let hello = Hello {
        name: me.clone(),
        nonce: nonce_c,
        ticket,
        mode: mode.wire(),
    };
    write_unsigned(
        s,
        addr_label,
        FrameKind::Hello,
        &encode_versioned(HANDSHAKE_VERSION, &hello),
    )
    .await?;

    let sh = match read_handshake(s, addr_label, idle).await? {
        (_, HandshakeMsg::ServerHello(sh)) => sh,
        (_, HandshakeMsg::AuthReject(r)) => {
            return Err(MsgError::auth(
                addr_label,
                format!("the server refused {me}: {}", r.reason),
            ))
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
    let k = creds.secret();
    let t = Transcript {
        client: me,
        server: &sh.name,
        nonce_c: &nonce_c,
        nonce_s: &sh.nonce,
        mode,
    };
    if !crate::auth::mac_eq(&t.server_proof(k), &sh.proof) {
        let what = match creds {
            Credentials::Key { .. } => format!("the key of {me}"),
            Credentials::Ticket { .. } => format!("the session key of {me}'s ticket"),
        };
        // Tell the server why we hang up (best effort), so its log says so.
        let body = encode_versioned(
            HANDSHAKE_VERSION,
            &AuthReject {
                reason: format!("the server's proof does not verify under {what}"),
            },
        );
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
    Ok(Established {
        peer: sh.name,
        mode,
        peer_caps: None,
        signer: FrameSigner::new(FrameKey::with_mode(&c2s, mode)),
        verifier,
    })
}

async fn reject<S: AsyncWrite + Unpin>(s: &mut S, peer: &str, reason: String) -> MsgError {
    let body = encode_versioned(
        HANDSHAKE_VERSION,
        &AuthReject {
            reason: reason.clone(),
        },
    );
    // Best effort: the peer learns why; our error says the same.
    let _ = write_unsigned(s, peer, FrameKind::AuthReject, &body).await;
    MsgError::auth(peer, reason)
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
    // Both ends must run the same frame mode; a mismatch is a
    // configuration error and is said so at once (before any key work).
    let want = accept.for_peer(&hello.name);
    let mode = match FrameMode::from_wire(hello.mode) {
        Some(m) if m == want => m,
        Some(m) => {
            return Err(reject(s, &label, format!(
                "{} asked for '{m}' frames but {me} requires '{want}' frames from it: the two sides' messenger modes differ (ms_cluster_mode between OSDs, ms_client_mode for clients); set the same value on both",
                hello.name
            ))
            .await)
        }
        None => {
            return Err(reject(s, &label, format!(
                "{} asked for an unknown frame mode (byte {}); this side knows 'crc' and 'secure'",
                hello.name, hello.mode
            ))
            .await)
        }
    };
    let (k, caps): (Secret, Option<String>) = match &hello.ticket {
        None => match keys.secret_for(&hello.name) {
            Some(k) => (k, None),
            None => {
                return Err(reject(s, &label, format!("{me} does not know the entity {}: create it with 'cairn auth get-or-create' or use the right keyring", hello.name)).await)
            }
        },
        Some((generation, sealed)) => {
            let Some(service) = keys.service_secret(*generation) else {
                return Err(reject(s, &label, format!("ticket generation {generation} is not known to {me} (expired or rotated); obtain a fresh ticket from the monitors")).await);
            };
            let ticket = Ticket {
                generation: *generation,
                sealed: Bytes::copy_from_slice(sealed),
            };
            let contents = match unseal_ticket(&service, &ticket) {
                Ok(c) => c,
                Err(e) => return Err(reject(s, &label, e).await),
            };
            if contents.name != hello.name {
                return Err(reject(s, &label, format!("the ticket was issued to {}, not to {}", contents.name, hello.name)).await);
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
    };
    let sh = ServerHello {
        name: me.clone(),
        nonce: nonce_s,
        proof: t.server_proof(&k),
    };
    write_unsigned(
        s,
        &label,
        FrameKind::ServerHello,
        &encode_versioned(HANDSHAKE_VERSION, &sh),
    )
    .await?;
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
        frame(
            FrameKind::Hello,
            encode_versioned(
                HANDSHAKE_VERSION,
                &Hello {
                    name: EntityName::client("admin"),
                    nonce: [3; NONCE_LEN],
                    ticket: None,
                    mode: FrameMode::Secure.wire(),
                },
            ),
        ),
        frame(
            FrameKind::Hello,
            encode_versioned(
                HANDSHAKE_VERSION,
                &Hello {
                    name: EntityName::osd(1),
                    nonce: [4; NONCE_LEN],
                    ticket: Some((ticket.generation, ticket.sealed.to_vec())),
                    mode: FrameMode::Crc.wire(),
                },
            ),
        ),
        frame(
            FrameKind::ServerHello,
            encode_versioned(
                HANDSHAKE_VERSION,
                &ServerHello {
                    name: EntityName::mon("a"),
                    nonce: [5; NONCE_LEN],
                    proof: [6; 32],
                },
            ),
        ),
        frame(
            FrameKind::ClientProof,
            encode_versioned(HANDSHAKE_VERSION, &ClientProof { proof: [7; 32] }),
        ),
        frame(
            FrameKind::AuthReject,
            encode_versioned(
                HANDSHAKE_VERSION,
                &AuthReject {
                    reason: "wrong key".into(),
                },
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_decode() {
        for f in sample_frames() {
            let sf = crate::frame::split_frame(&f, 0).unwrap();
            decode_handshake_payload("test", sf.header.kind, sf.payload).unwrap();
        }
    }
}
