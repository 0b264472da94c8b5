//! Identifiers that cross crate boundaries. Each is a small newtype so that a
//! pool id can never be passed where an OSD id is expected.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A cluster map epoch. Grows by exactly one per committed map change.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Epoch(pub u64);

impl Epoch {
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// An OSD id as CRUSH sees it: devices are non-negative, buckets negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OsdId(pub i32);

impl fmt::Display for OsdId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "osd.{}", self.0)
    }
}

/// A pool id (Ceph uses a signed 64-bit id; valid pools are >= 0... we start at 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PoolId(pub u64);

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A placement group: pool plus placement seed, printed like Ceph (`3.1f`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PgId {
    pub pool: PoolId,
    pub seed: u32,
}

impl fmt::Display for PgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:x}", self.pool.0, self.seed)
    }
}

impl FromStr for PgId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (pool, seed) = s
            .split_once('.')
            .ok_or_else(|| format!("invalid pg id '{s}': expected POOL.SEED, e.g. 1.1f"))?;
        let pool = pool
            .parse::<u64>()
            .map_err(|_| format!("invalid pg id '{s}': pool '{pool}' is not a number"))?;
        let seed = u32::from_str_radix(seed, 16)
            .map_err(|_| format!("invalid pg id '{s}': seed '{seed}' is not hexadecimal"))?;
        Ok(PgId {
            pool: PoolId(pool),
            seed,
        })
    }
}

/// The kind of an authenticated entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EntityKind {
    Mon,
    Mgr,
    Osd,
    Mds,
    Client,
}

impl EntityKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Mon => "mon",
            EntityKind::Mgr => "mgr",
            EntityKind::Osd => "osd",
            EntityKind::Mds => "mds",
            EntityKind::Client => "client",
        }
    }
}

/// An authenticated entity such as `mon.a`, `osd.3` or `client.admin`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EntityName {
    pub kind: EntityKind,
    pub id: String,
}

/// Longest entity id we accept (bounds what a peer can make us store).
pub const ENTITY_ID_MAX_LEN: usize = 64;

impl EntityName {
    pub fn new(kind: EntityKind, id: impl Into<String>) -> Self {
        EntityName {
            kind,
            id: id.into(),
        }
    }
    pub fn osd(id: i32) -> Self {
        EntityName::new(EntityKind::Osd, id.to_string())
    }
    pub fn client(id: &str) -> Self {
        EntityName::new(EntityKind::Client, id)
    }
    pub fn mon(id: &str) -> Self {
        EntityName::new(EntityKind::Mon, id)
    }
}

impl fmt::Display for EntityName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.kind.as_str(), self.id)
    }
}

impl FromStr for EntityName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, id) = s.split_once('.').ok_or_else(|| {
            format!("invalid entity name '{s}': expected TYPE.ID such as client.admin or osd.3")
        })?;
        let kind = match kind {
            "mon" => EntityKind::Mon,
            "mgr" => EntityKind::Mgr,
            "osd" => EntityKind::Osd,
            "mds" => EntityKind::Mds,
            "client" => EntityKind::Client,
            other => {
                return Err(format!(
                    "invalid entity name '{s}': unknown type '{other}' (mon, mgr, osd, mds, client)"
                ))
            }
        };
        if id.is_empty() || id.len() > ENTITY_ID_MAX_LEN {
            return Err(format!(
                "invalid entity name '{s}': id must be 1..={ENTITY_ID_MAX_LEN} characters"
            ));
        }
        if !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(format!(
                "invalid entity name '{s}': id may hold letters, digits, '-', '_' and '.'"
            ));
        }
        if kind == EntityKind::Osd && id.parse::<u32>().is_err() {
            return Err(format!("invalid entity name '{s}': an osd id is a number"));
        }
        Ok(EntityName::new(kind, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgid_round_trips() {
        let pg = PgId {
            pool: PoolId(3),
            seed: 0x1f,
        };
        assert_eq!(pg.to_string(), "3.1f");
        assert_eq!("3.1f".parse::<PgId>().unwrap(), pg);
        assert!("3".parse::<PgId>().is_err());
        assert!("x.1".parse::<PgId>().is_err());
    }

    #[test]
    fn entity_names_parse() {
        assert_eq!("osd.3".parse::<EntityName>().unwrap(), EntityName::osd(3));
        assert_eq!(
            "client.admin".parse::<EntityName>().unwrap().to_string(),
            "client.admin"
        );
        assert!("osd.x".parse::<EntityName>().is_err());
        assert!("foo.bar".parse::<EntityName>().is_err());
        assert!("client.".parse::<EntityName>().is_err());
        assert!("client.a b".parse::<EntityName>().is_err());
    }
}
