//! The client blocklist of the OSD map (Ceph's `osd blocklist`): client
//! *instances* — an entity name plus the random nonce a client handle picks
//! when it starts (`client.admin/5f0c…`) — whose ops the OSDs refuse. It is
//! how a broken image lock fences the old holder: the breaker blocklists the
//! holder's instance first, and ops of the new holder carry a map epoch at
//! least the one that lists it, so no OSD orders an old-holder write after a
//! new-holder one (`docs/block.md`).
//!
//! Expiry is a *duration*, never a wall-clock time: an entry records the
//! epoch it was added in and how many seconds it lasts; the monitor leader
//! starts that timer on its own monotonic clock when it first sees the entry
//! ([`BlocklistExpiry`]) and proposes [`MonCommand::OsdBlocklistExpire`] when
//! it ran out. A new leader starts the timer again, so an entry lasts at
//! least its duration, never less, and no machine's clock is compared with
//! another's. Owns the entry shapes, the commands' effects and the expiry
//! timer; the OSDs' refusal lives in `cairn-osd`, the client's in
//! `cairn-client`.

use crate::error::CommandError;
use crate::model::{ClusterMap, Reply};
use crate::MonCommand;
use cairn_types::{EntityKind, EntityName, Epoch};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// Most entries the blocklist holds (each is a few dozen bytes in every map).
pub const BLOCKLIST_MAX: usize = 16_384;
/// Longest expiry `osd blocklist add --expire` accepts: ten years.
pub const BLOCKLIST_EXPIRE_MAX_SECS: u64 = 10 * 365 * 86_400;
/// Default expiry when none is given and `mon_osd_blocklist_default_expire`
/// is not set (Ceph's default: one hour).
pub const BLOCKLIST_DEFAULT_EXPIRE_SECS: u64 = 3600;

/// One running client handle: who it authenticates as, and the random
/// nonce it chose at start (every request id it sends carries it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClientInstance {
    pub name: EntityName,
    pub nonce: u64,
}

impl fmt::Display for ClientInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:016x}", self.name, self.nonce)
    }
}

impl FromStr for ClientInstance {
    type Err = String;
    /// `client.NAME/NONCE` with NONCE in hex (as `cairn rbd lock ls` and
    /// `cairn osd blocklist ls` print it).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, nonce) = s.split_once('/').ok_or_else(|| {
            format!(
                "'{s}' is not a client instance: expected client.NAME/NONCE (NONCE in hex, as 'cairn rbd lock ls' shows it)"
            )
        })?;
        let name: EntityName = name.parse()?;
        if name.kind != EntityKind::Client {
            return Err(format!(
                "'{s}': only clients can be blocklisted, {name} is not a client (stop a daemon with 'cairn osd down' or 'cairn daemon stop')"
            ));
        }
        if nonce.is_empty() || nonce.len() > 16 {
            return Err(format!(
                "'{s}': the nonce after '/' must be 1 to 16 hex digits"
            ));
        }
        let nonce = u64::from_str_radix(nonce, 16)
            .map_err(|_| format!("'{s}': the nonce after '/' must be hex digits"))?;
        Ok(ClientInstance { name, nonce })
    }
}

/// A blocklisted instance: the epoch it was (last) added in and how long
/// the leader keeps it after first seeing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlocklistEntry {
    pub added: Epoch,
    pub expire_secs: u64,
}

/// Serialises the blocklist as a list so JSON can hold it.
pub(crate) mod as_seq {
    use super::{BlocklistEntry, ClientInstance};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<ClientInstance, BlocklistEntry>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let v: Vec<(&ClientInstance, &BlocklistEntry)> = map.iter().collect();
        v.serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<ClientInstance, BlocklistEntry>, D::Error> {
        let v: Vec<(ClientInstance, BlocklistEntry)> = Vec::deserialize(d)?;
        Ok(v.into_iter().collect())
    }
}

impl ClusterMap {
    /// The entry blocklisting client `name` with nonce `nonce`, if any.
    pub fn blocklisted(&self, name: &EntityName, nonce: u64) -> Option<&BlocklistEntry> {
        if self.blocklist.is_empty() {
            return None;
        }
        self.blocklist.get(&ClientInstance {
            name: name.clone(),
            nonce,
        })
    }

    /// `osd blocklist add CLIENT [--expire SECONDS]`. Adding a listed
    /// instance again restarts its expiry. The reply's JSON carries the
    /// epoch that lists it (`epoch`): ops of a new lock holder must carry
    /// at least that epoch.
    pub(crate) fn blocklist_add(
        &mut self,
        client: &ClientInstance,
        expire_secs: Option<u64>,
    ) -> Result<Reply, CommandError> {
        if client.name.kind != EntityKind::Client {
            return Err(CommandError::invalid(format!(
                "osd blocklist add: only clients can be blocklisted, {} is not a client",
                client.name
            )));
        }
        let expire_secs = match expire_secs {
            Some(s) => s,
            None => self.config_u64(
                "mon_osd_blocklist_default_expire",
                BLOCKLIST_DEFAULT_EXPIRE_SECS,
            ),
        };
        if expire_secs == 0 || expire_secs > BLOCKLIST_EXPIRE_MAX_SECS {
            return Err(CommandError::invalid(format!(
                "osd blocklist add: --expire {expire_secs} is out of range: give 1 to {BLOCKLIST_EXPIRE_MAX_SECS} seconds"
            )));
        }
        if !self.blocklist.contains_key(client) && self.blocklist.len() >= BLOCKLIST_MAX {
            return Err(CommandError::invalid(format!(
                "osd blocklist add: the blocklist already holds {BLOCKLIST_MAX} entries, the most Cairn allows; remove old ones with 'cairn osd blocklist rm'"
            )));
        }
        let epoch = self.next_epoch();
        self.blocklist.insert(
            client.clone(),
            BlocklistEntry {
                added: epoch,
                expire_secs,
            },
        );
        let plain = format!(
            "blocklisting {client} for {expire_secs} s (from osdmap epoch {})",
            epoch.0
        );
        Ok(Reply::new(
            plain.clone(),
            json!({ "result": "ok", "message": plain, "client": client.to_string(),
                    "epoch": epoch.0, "expire_secs": expire_secs }),
        ))
    }

    /// `osd blocklist rm CLIENT`.
    pub(crate) fn blocklist_rm(&mut self, client: &ClientInstance) -> Result<Reply, CommandError> {
        if self.blocklist.remove(client).is_none() {
            return Err(CommandError::not_found(format!(
                "{client} is not blocklisted; 'cairn osd blocklist ls' lists the entries"
            )));
        }
        Ok(crate::apply::done(format!("un-blocklisting {client}")))
    }

    /// Internal (monitor leader): the entry added in epoch `added` ran out.
    /// An entry added again since (another `added`) stays.
    pub(crate) fn blocklist_expire(&mut self, client: &ClientInstance, added: Epoch) -> Reply {
        if self.blocklist.get(client).is_some_and(|e| e.added == added) {
            self.blocklist.remove(client);
            crate::apply::done(format!("blocklist entry {client} expired"))
        } else {
            crate::apply::done(format!(
                "blocklist entry {client} was already gone or renewed"
            ))
        }
    }

    /// `osd blocklist ls`.
    pub(crate) fn q_blocklist_ls(&self) -> Reply {
        let mut plain = String::new();
        for (c, e) in &self.blocklist {
            plain.push_str(&format!(
                "{c} expires {} s after the leader saw it (added in osdmap epoch {})\n",
                e.expire_secs, e.added.0
            ));
        }
        plain.push_str(&format!("listed {} entries\n", self.blocklist.len()));
        let json: Vec<_> = self
            .blocklist
            .iter()
            .map(|(c, e)| {
                json!({ "addr": c.to_string(), "name": c.name.to_string(),
                        "nonce": format!("{:016x}", c.nonce),
                        "added_epoch": e.added.0, "expire_secs": e.expire_secs })
            })
            .collect();
        Reply::new(plain, json!(json))
    }
}

/// The leader's expiry timers, one per entry, on its monotonic clock. Kept
/// per leadership term (a new leader starts them again).
#[derive(Debug, Clone, Default)]
pub struct BlocklistExpiry {
    /// instance -> (the entry's `added` epoch, when this leader first saw it).
    seen: BTreeMap<ClientInstance, (Epoch, Instant)>,
}

impl BlocklistExpiry {
    pub fn new() -> BlocklistExpiry {
        BlocklistExpiry::default()
    }

    /// Entries whose duration ran out on this leader's clock: the
    /// `OsdBlocklistExpire` commands to propose.
    pub fn tick(&mut self, now: Instant, map: &ClusterMap) -> Vec<MonCommand> {
        self.seen
            .retain(|c, (added, _)| map.blocklist.get(c).is_some_and(|e| e.added == *added));
        let mut out = Vec::new();
        for (c, e) in &map.blocklist {
            let (_, since) = *self.seen.entry(c.clone()).or_insert((e.added, now));
            if now.saturating_duration_since(since) >= Duration::from_secs(e.expire_secs) {
                out.push(MonCommand::OsdBlocklistExpire {
                    client: c.clone(),
                    added: e.added,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ApplyContext, AuthEntity, MonInfo, QueryContext};

    fn map() -> ClusterMap {
        ClusterMap::new_cluster(
            "fsid",
            MonInfo {
                name: "a".into(),
                addr: "127.0.0.1:6789".into(),
                rank: 0,
            },
            AuthEntity::new(&[7; 32], &[("mon", "allow *"), ("osd", "allow *")]),
        )
    }

    fn admin() -> ApplyContext {
        ApplyContext {
            caller: EntityName::client("admin"),
            generated_secret: None,
        }
    }

    fn inst(s: &str) -> ClientInstance {
        s.parse().unwrap()
    }

    fn parse(line: &str) -> Result<MonCommand, crate::ParseError> {
        let words: Vec<String> = line.split_whitespace().map(String::from).collect();
        crate::parse_command(&words)
    }

    #[test]
    fn instance_text_round_trips_and_bad_text_is_refused() {
        let c = inst("client.admin/00000000deadbeef");
        assert_eq!(c.nonce, 0xdead_beef);
        assert_eq!(c.to_string(), "client.admin/00000000deadbeef");
        assert_eq!(c.to_string().parse::<ClientInstance>().unwrap(), c);
        for bad in [
            "client.admin",
            "client.admin/",
            "client.admin/xyz",
            "client.admin/12345678901234567",
            "osd.3/1",
            "nobody/1",
        ] {
            assert!(bad.parse::<ClientInstance>().is_err(), "{bad} parsed");
        }
        let e = "osd.3/1".parse::<ClientInstance>().unwrap_err();
        assert!(e.contains("only clients"), "{e}");
    }

    #[test]
    fn parse_blocklist_commands() {
        assert_eq!(
            parse("osd blocklist add client.a/1f --expire 60").unwrap(),
            MonCommand::OsdBlocklistAdd {
                client: inst("client.a/1f"),
                expire_secs: Some(60)
            }
        );
        assert_eq!(
            parse("osd blocklist add client.a/1f").unwrap(),
            MonCommand::OsdBlocklistAdd {
                client: inst("client.a/1f"),
                expire_secs: None
            }
        );
        assert_eq!(
            parse("osd blocklist ls").unwrap(),
            MonCommand::OsdBlocklistLs
        );
        assert_eq!(
            parse("osd blocklist rm client.a/1f").unwrap(),
            MonCommand::OsdBlocklistRm {
                client: inst("client.a/1f")
            }
        );
        for bad in [
            "osd blocklist",
            "osd blocklist add",
            "osd blocklist add client.a",
            "osd blocklist add client.a/1 --expire",
            "osd blocklist add client.a/1 --expire soon",
            "osd blocklist add client.a/1 --expire -5",
            "osd blocklist add client.a/1 extra",
            "osd blocklist rm",
            "osd blocklist frob client.a/1",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("blocklist"), "{bad}: {e}");
        }
        assert!(MonCommand::OsdBlocklistAdd {
            client: inst("client.a/1"),
            expire_secs: None
        }
        .is_mutation());
        assert!(!MonCommand::OsdBlocklistLs.is_mutation());
    }

    #[test]
    fn add_ls_rm_change_the_map_and_bad_input_changes_nothing() {
        let mut m = map();
        let c = inst("client.vm/0123456789abcdef");
        let r = m
            .apply(
                &MonCommand::OsdBlocklistAdd {
                    client: c.clone(),
                    expire_secs: Some(120),
                },
                &admin(),
            )
            .unwrap();
        assert_eq!(r.json["epoch"], m.epoch.0);
        let e = *m.blocklisted(&c.name, c.nonce).unwrap();
        assert_eq!(
            e,
            BlocklistEntry {
                added: m.epoch,
                expire_secs: 120
            }
        );
        assert!(m.blocklisted(&c.name, c.nonce + 1).is_none());
        // Default expiry from the config (and its default).
        let d = inst("client.vm/2");
        m.apply(
            &MonCommand::OsdBlocklistAdd {
                client: d.clone(),
                expire_secs: None,
            },
            &admin(),
        )
        .unwrap();
        assert_eq!(m.blocklist[&d].expire_secs, BLOCKLIST_DEFAULT_EXPIRE_SECS);
        let ctx = QueryContext {
            caller: EntityName::client("admin"),
            runtime: Default::default(),
        };
        let ls = m.query(&MonCommand::OsdBlocklistLs, &ctx).unwrap();
        assert!(
            ls.plain
                .contains("client.vm/0123456789abcdef expires 120 s"),
            "{}",
            ls.plain
        );
        assert!(ls.plain.contains("listed 2 entries"), "{}", ls.plain);
        assert_eq!(ls.json.as_array().unwrap().len(), 2);
        let dump = m.query(&MonCommand::OsdDump, &ctx).unwrap();
        assert!(
            dump.plain.contains("blocklist client.vm/0123456789abcdef"),
            "{}",
            dump.plain
        );
        let status = m.query(&MonCommand::Status, &ctx).unwrap();
        assert!(
            status.plain.contains("2 blocklisted clients"),
            "{}",
            status.plain
        );

        // Bad input: nothing changes, the epoch included.
        let before = m.clone();
        for (cmd, want) in [
            (
                MonCommand::OsdBlocklistAdd {
                    client: c.clone(),
                    expire_secs: Some(0),
                },
                "out of range",
            ),
            (
                MonCommand::OsdBlocklistAdd {
                    client: ClientInstance {
                        name: EntityName::osd(1),
                        nonce: 1,
                    },
                    expire_secs: None,
                },
                "only clients",
            ),
            (
                MonCommand::OsdBlocklistRm {
                    client: inst("client.other/1"),
                },
                "is not blocklisted",
            ),
        ] {
            let e = m.apply(&cmd, &admin()).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
            assert_eq!(m, before);
        }

        // Adding again renews: a newer `added`, so an expiry proposed
        // for the old entry leaves it.
        let old_added = m.blocklist[&c].added;
        m.apply(
            &MonCommand::OsdBlocklistAdd {
                client: c.clone(),
                expire_secs: Some(30),
            },
            &admin(),
        )
        .unwrap();
        let epoch = m.epoch;
        m.apply(
            &MonCommand::OsdBlocklistExpire {
                client: c.clone(),
                added: old_added,
            },
            &admin(),
        )
        .unwrap();
        assert_eq!(m.epoch, epoch, "a stale expiry changes nothing");
        assert!(m.blocklist.contains_key(&c));

        m.apply(&MonCommand::OsdBlocklistRm { client: c.clone() }, &admin())
            .unwrap();
        assert!(m.blocklisted(&c.name, c.nonce).is_none());
    }

    #[test]
    fn only_admins_may_blocklist() {
        let mut m = map();
        m.auth.insert(
            EntityName::client("ro"),
            AuthEntity::new(&[1; 32], &[("mon", "allow r")]),
        );
        let ro = ApplyContext {
            caller: EntityName::client("ro"),
            generated_secret: None,
        };
        let e = m
            .apply(
                &MonCommand::OsdBlocklistAdd {
                    client: inst("client.x/1"),
                    expire_secs: None,
                },
                &ro,
            )
            .unwrap_err();
        assert!(e.to_string().contains("access denied"), "{e}");
        let e = m
            .apply(
                &MonCommand::OsdBlocklistExpire {
                    client: inst("client.x/1"),
                    added: Epoch(1),
                },
                &ro,
            )
            .unwrap_err();
        assert!(e.to_string().contains("access denied"), "{e}");
    }

    #[test]
    fn leader_expires_entries_by_its_own_monotonic_time() {
        let mut m = map();
        let c = inst("client.vm/1");
        m.apply(
            &MonCommand::OsdBlocklistAdd {
                client: c.clone(),
                expire_secs: Some(10),
            },
            &admin(),
        )
        .unwrap();
        let t0 = Instant::now();
        let mut judge = BlocklistExpiry::new();
        assert!(judge.tick(t0, &m).is_empty());
        assert!(judge.tick(t0 + Duration::from_secs(9), &m).is_empty());
        let out = judge.tick(t0 + Duration::from_secs(10), &m);
        assert_eq!(
            out,
            vec![MonCommand::OsdBlocklistExpire {
                client: c.clone(),
                added: m.blocklist[&c].added
            }]
        );
        // A new leader starts the timer again: the entry lasts longer, never shorter.
        let mut next_leader = BlocklistExpiry::new();
        let late = t0 + Duration::from_secs(10);
        assert!(next_leader.tick(late, &m).is_empty());
        assert!(next_leader
            .tick(late + Duration::from_secs(9), &m)
            .is_empty());
        assert_eq!(
            next_leader.tick(late + Duration::from_secs(10), &m).len(),
            1
        );
        // Applying the expiry removes the entry; a renewed entry restarts.
        m.apply(&out[0], &admin()).unwrap();
        assert!(m.blocklist.is_empty());
        assert!(judge.tick(late + Duration::from_secs(11), &m).is_empty());
    }

    #[test]
    fn old_map_formats_are_read_with_an_empty_blocklist() {
        let mut m = map();
        m.apply(
            &MonCommand::OsdBlocklistAdd {
                client: inst("client.vm/1"),
                expire_secs: Some(5),
            },
            &admin(),
        )
        .unwrap();
        let back = ClusterMap::decode(&m.encode()).unwrap();
        assert_eq!(back, m);
        // A version-4 map is a version-5 body without the trailing blocklist.
        let mut v4 = m.clone();
        v4.blocklist.clear();
        let mut bytes = v4.encode();
        assert_eq!(bytes[0], crate::MAP_FORMAT_VERSION);
        bytes.pop(); // the empty blocklist: one length byte
        bytes[0] = 4;
        assert_eq!(ClusterMap::decode(&bytes).unwrap(), v4);
    }
}
