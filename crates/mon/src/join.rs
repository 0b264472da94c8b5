//! Join tokens: what a new monitor node needs to join a cluster, printed by
//! `cairn bootstrap` (and saved in its data dir as `join-token`, mode 0600):
//! the fsid, the mon addresses and the mon secret every monitor shares.
//! Whoever holds the token can run a monitor of the cluster, so treat it
//! like a key. Format: `cairn-join-1.` + base64url(JSON).

use base64::Engine as _;
use cairn_msg::Secret;
use serde::{Deserialize, Serialize};

const PREFIX: &str = "cairn-join-1.";
/// Longest token text accepted.
const TOKEN_MAX_LEN: usize = 16 << 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct TokenBody {
    fsid: String,
    mon_host: Vec<String>,
    mon_key: String,
}

/// Decoded join token.
#[derive(Debug, Clone)]
pub struct JoinToken {
    pub fsid: String,
    pub mon_host: Vec<String>,
    pub mon_secret: Secret,
}

impl JoinToken {
    pub fn encode(&self) -> String {
        let body = TokenBody {
            fsid: self.fsid.clone(),
            mon_host: self.mon_host.clone(),
            mon_key: self.mon_secret.to_base64(),
        };
        let json = serde_json::to_vec(&body).unwrap_or_default();
        format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
        )
    }

    pub fn decode(text: &str) -> Result<JoinToken, String> {
        let text = text.trim();
        if text.len() > TOKEN_MAX_LEN {
            return Err("join token is too long".into());
        }
        let b64 = text.strip_prefix(PREFIX).ok_or_else(|| {
            format!("not a Cairn join token (expected it to start with '{PREFIX}'); copy it from 'cairn bootstrap' output or the data dir's join-token file")
        })?;
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(b64)
            .map_err(|e| format!("join token is damaged (base64: {e}); copy it again"))?;
        let body: TokenBody = serde_json::from_slice(&json)
            .map_err(|e| format!("join token is damaged ({e}); copy it again"))?;
        let mon_secret = Secret::from_base64(&body.mon_key).map_err(|e| e.to_string())?;
        if body.mon_host.is_empty() {
            return Err("join token lists no monitors".into());
        }
        Ok(JoinToken {
            fsid: body.fsid,
            mon_host: body.mon_host,
            mon_secret,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let t = JoinToken {
            fsid: "f".into(),
            mon_host: vec!["127.0.0.1:6789".into()],
            mon_secret: Secret::generate(),
        };
        let text = t.encode();
        let back = JoinToken::decode(&text).unwrap();
        assert_eq!(back.mon_host, t.mon_host);
        assert_eq!(back.mon_secret, t.mon_secret);
        assert!(JoinToken::decode("hello")
            .unwrap_err()
            .contains("not a Cairn join token"));
        assert!(JoinToken::decode(&format!("{}x!", &text[..text.len() - 3])).is_err());
    }
}
