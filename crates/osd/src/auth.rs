//! Authentication and authorisation at the OSD. Connections authenticate
//! with cairn-msg's handshake either with the entity's own key, which the
//! OSD looks up in the cluster map's auth table (`client.admin`, `osd.N`),
//! or with a ticket sealed under an OSD service secret this OSD was given
//! (`OsdConfig::service_secrets`, by generation). Client ops are then
//! checked against the entity's `osd` caps (`allow r`, `allow rw pool=rbd`):
//! from the ticket for ticket holders, from the map for key holders. Peer
//! messages (replication, peering) are accepted only from `osd.N` entities
//! that exist in the map.

use cairn_map::{decode_secret, Caps, CapsNeed, ClusterMap, Perms};
use cairn_msg::{KeyServer, Secret};
use cairn_types::{EntityKind, EntityName};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

/// Key lookup backed by the current cluster map plus the OSD service secrets.
pub struct MapKeys {
    pub map: watch::Receiver<Arc<ClusterMap>>,
    pub service: BTreeMap<u64, Secret>,
}

/// The secret of `name` as recorded in `map`'s auth table.
pub fn entity_secret(map: &ClusterMap, name: &EntityName) -> Option<Secret> {
    let ent = map.auth.get(name)?;
    let raw = decode_secret(&ent.key).ok()?;
    let arr: [u8; 32] = raw.try_into().ok()?;
    Some(Secret::from_bytes(arr))
}

impl KeyServer for MapKeys {
    fn secret_for(&self, name: &EntityName) -> Option<Secret> {
        entity_secret(&self.map.borrow(), name)
    }
    fn service_secret(&self, generation: u64) -> Option<Secret> {
        self.service.get(&generation).cloned()
    }
}

/// Checks that `who` may run an op needing `perms` on pool `pool`.
/// `ticket_caps` are the caps sealed in the peer's ticket, if it used one.
pub fn check_op_caps(
    map: &ClusterMap,
    who: &EntityName,
    ticket_caps: Option<&str>,
    pool: &str,
    write: bool,
) -> Result<(), String> {
    let text = match ticket_caps {
        Some(t) => t.to_string(),
        None => map
            .auth
            .get(who)
            .and_then(|e| e.caps.get("osd").cloned())
            .unwrap_or_default(),
    };
    let perms = if write { Perms::RW } else { Perms::R };
    let need = CapsNeed {
        service: "osd".into(),
        perms,
        pool: Some(pool.to_string()),
        or_entity: None,
    };
    let ok = Caps::parse("osd", &text)
        .map(|c| c.allows(&need))
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{who} needs osd '{}' on pool '{pool}' but has osd caps '{text}'; an admin can run 'cairn auth caps {who} osd \"allow rw pool={pool}\"'",
            if write { "rw" } else { "r" }
        ))
    }
}

/// True if `who` is an OSD known to the map (peer messages).
pub fn is_peer_osd(map: &ClusterMap, who: &EntityName) -> Option<i32> {
    if who.kind != EntityKind::Osd {
        return None;
    }
    let id: i32 = who.id.parse().ok()?;
    map.osds.contains_key(&id).then_some(id)
}
