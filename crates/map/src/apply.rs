//! Mutations of the cluster map. `apply` runs on every monitor for every
//! committed command, so it is deterministic: no clocks, no randomness, no
//! hash-order iteration. It works on a copy and swaps it in only on success,
//! so a failed command changes nothing (epoch included).

use crate::caps::Caps;
use crate::command::{MonCommand, OsdSelector};
use crate::config::{
    known_option, normalize_key, suggest_option, validate_section, validate_value,
};
use crate::error::CommandError;
use crate::model::{
    ApplyContext, AuthEntity, ClusterMap, EcProfile, Incremental, MonInfo, OsdFlag, OsdInfo,
    OsdReported, Pool, PoolKind, Reply,
};
use cairn_crush::{CrushMap, RuleType};
use cairn_types::{EntityKind, EntityName, Epoch};
use serde_json::json;

/// Largest pg_num / pgp_num of a pool.
pub const POOL_PG_NUM_MAX: u32 = 65_536;
/// Largest replicated pool size.
pub const POOL_SIZE_MAX: u32 = 10;
/// Most monitors in one map.
pub const MONS_MAX: usize = 9;
/// Longest pool, rule, profile or host name.
pub const NAME_MAX_LEN: usize = 128;
/// Largest CRUSH weight of one OSD, in TiB.
pub const CRUSH_WEIGHT_MAX_TIB: f64 = 1_000_000.0;
/// Most pools in one map.
pub const POOLS_MAX: usize = 4096;
/// Most central config entries.
pub const CONFIG_ENTRIES_MAX: usize = 8192;
/// Most auth entities.
pub const AUTH_ENTITIES_MAX: usize = 65_536;
/// Most erasure-code profiles.
pub const EC_PROFILES_MAX: usize = 1024;
/// Most CRUSH rules (Ceph keeps rule ids in a byte).
pub const CRUSH_RULES_MAX: usize = 256;
/// Most addresses one OSD may register.
pub const OSD_ADDRS_MAX: usize = 8;
/// Longest state string an OSD may report.
pub const OSD_STATE_MAX_LEN: usize = 256;
/// Version byte of the encoded cluster map. 5: the client blocklist
/// (`crate::blocklist`), the last field; maps of versions 3 and 4 are read
/// with an empty one. 4: the full ratios and the
/// OSDs' fullness marks (`crate::fullness`), the last two fields; a map of
/// version 3 is read with their defaults. 3: each PG's activation history
/// (`pg_history`); maps of version 2 are refused with a clear error (a dev
/// cluster made before it must be recreated).
pub const MAP_FORMAT_VERSION: u8 = 5;
/// Oldest map version still read.
const MAP_FORMAT_MIN_VERSION: u8 = 3;
/// Largest encoded cluster map we decode.
pub const MAP_MAX_BYTES: usize = 256 * 1024 * 1024;

fn check_name(what: &str, name: &str) -> Result<(), CommandError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(CommandError::invalid(format!(
            "invalid {what} name '{name}': use 1..={NAME_MAX_LEN} letters, digits, '-', '_' or '.'"
        )))
    }
}

fn limit_err(what: &str, max: usize) -> CommandError {
    CommandError::invalid(format!(
        "the cluster already has {max} {what}, the most Cairn allows; remove unused ones first"
    ))
}

fn crush_err(e: impl std::fmt::Display) -> CommandError {
    CommandError::invalid(e.to_string())
}

pub(crate) fn done(plain: impl Into<String>) -> Reply {
    let plain = plain.into();
    Reply::new(plain.clone(), json!({ "result": "ok", "message": plain }))
}

impl ClusterMap {
    /// A new cluster at epoch 1: one monitor, the admin entity, a `default`
    /// root with a `replicated_rule` (failure domain host) and the `default`
    /// EC profile.
    pub fn new_cluster(fsid: &str, first_mon: MonInfo, admin: AuthEntity) -> ClusterMap {
        let mut crush = CrushMap::new();
        // A fresh CrushMap has the default types, so these cannot fail; if a
        // future CRUSH change made them fail, the cluster simply starts
        // without a default rule and pool creation says how to add one.
        let _ = crush.add_bucket("default", "root", None);
        let _ = crush.add_replicated_rule("replicated_rule", "default", "host", None);
        let mut map = ClusterMap {
            fsid: fsid.to_string(),
            epoch: Epoch(1),
            mons: vec![MonInfo {
                rank: 0,
                ..first_mon
            }],
            osds: Default::default(),
            crush,
            pools: Default::default(),
            ec_profiles: Default::default(),
            flags: Default::default(),
            auth: Default::default(),
            config: Default::default(),
            pg_temp: Default::default(),
            pool_max: 0,
            created: Epoch(1),
            scrub_orders: Vec::new(),
            pg_history: Default::default(),
            full_ratios: Default::default(),
            osd_fullness: Default::default(),
            blocklist: Default::default(),
        };
        map.ec_profiles
            .insert("default".into(), EcProfile::default_profile());
        map.auth.insert(EntityName::client("admin"), admin);
        map
    }

    /// Like [`ClusterMap::new_cluster`] with the default rule's failure
    /// domain chosen (`osd` for a one-machine dev cluster).
    pub fn new_cluster_with_failure_domain(
        fsid: &str,
        first_mon: MonInfo,
        admin: AuthEntity,
        failure_domain: &str,
    ) -> Result<ClusterMap, CommandError> {
        let mut map = ClusterMap::new_cluster(fsid, first_mon, admin);
        if failure_domain != "host" {
            map.crush
                .remove_rule("replicated_rule")
                .map_err(crush_err)?;
            map.crush
                .add_replicated_rule("replicated_rule", "default", failure_domain, None)
                .map_err(crush_err)?;
        }
        Ok(map)
    }

    /// The versioned binary form of the whole map (for snapshots).
    pub fn encode(&self) -> Vec<u8> {
        cairn_types::encode_versioned(MAP_FORMAT_VERSION, self)
    }

    pub fn decode(buf: &[u8]) -> Result<ClusterMap, cairn_types::DecodeError> {
        use std::collections::BTreeMap;
        // Versions 3 and 4 lack only trailing fields of the current version:
        // their body followed by the default encoding of what they lack is a
        // current body.
        let tail = match buf.first() {
            Some(3) => cairn_types::encode_versioned(
                MAP_FORMAT_VERSION,
                &(
                    crate::fullness::FullRatios::default(),
                    BTreeMap::<i32, crate::fullness::OsdFullness>::new(),
                    Vec::<(
                        crate::blocklist::ClientInstance,
                        crate::blocklist::BlocklistEntry,
                    )>::new(),
                ),
            ),
            Some(4) => cairn_types::encode_versioned(
                MAP_FORMAT_VERSION,
                &Vec::<(
                    crate::blocklist::ClientInstance,
                    crate::blocklist::BlocklistEntry,
                )>::new(),
            ),
            _ => Vec::new(),
        };
        if !tail.is_empty() && buf.len() <= MAP_MAX_BYTES {
            let mut current = Vec::with_capacity(buf.len() + tail.len());
            current.push(MAP_FORMAT_VERSION);
            current.extend_from_slice(&buf[1..]);
            current.extend_from_slice(&tail[1..]);
            return ClusterMap::decode(&current);
        }
        cairn_types::decode_versioned(
            "cluster map",
            buf,
            MAP_FORMAT_MIN_VERSION,
            MAP_FORMAT_VERSION,
            MAP_MAX_BYTES,
        )
        .map(|(_, m)| m)
    }

    /// Checks that `caller` may run `cmd`. Monitors in the map may run
    /// anything (the runtime authenticated them); an OSD may boot itself.
    pub fn authorize(&self, caller: &EntityName, cmd: &MonCommand) -> Result<(), CommandError> {
        if caller.kind == EntityKind::Mon && self.mons.iter().any(|m| m.name == caller.id) {
            return Ok(());
        }
        let need = cmd.required_caps();
        if need.or_entity.as_ref() == Some(caller) {
            return Ok(());
        }
        let entity = self.auth.get(caller).ok_or_else(|| {
            CommandError::access_denied(format!(
                "access denied: {caller} has no key in this cluster; ask an admin to run 'cairn auth get-or-create {caller} mon \"allow r\"'"
            ))
        })?;
        let text = entity
            .caps
            .get(&need.service)
            .map(String::as_str)
            .unwrap_or("");
        let allowed = Caps::parse(&need.service, text)
            .map(|c| c.allows(&need))
            .unwrap_or(false);
        if allowed {
            Ok(())
        } else {
            let has = if text.is_empty() {
                format!("no {} caps", need.service)
            } else {
                format!("{} '{text}'", need.service)
            };
            // `auth caps` replaces every cap, so the hint repeats the others.
            let mut caps = entity.caps.clone();
            caps.insert(need.service.clone(), format!("allow {}", need.perms));
            let grant: Vec<String> = caps.iter().map(|(svc, c)| format!("{svc} '{c}'")).collect();
            Err(CommandError::access_denied(format!(
                "access denied: '{}' needs {need}, {caller} has {has}; an admin can grant it with: cairn auth caps {caller} {}",
                cmd.verb(),
                grant.join(" ")
            )))
        }
    }

    /// Applies a mutation. On success the epoch grows by one iff the map
    /// changed; on error nothing changes.
    pub fn apply(&mut self, cmd: &MonCommand, ctx: &ApplyContext) -> Result<Reply, CommandError> {
        self.authorize(&ctx.caller, cmd)?;
        if !cmd.is_mutation() {
            return Err(CommandError::invalid(format!(
                "'{}' is read-only: run it with query, not apply",
                cmd.verb()
            )));
        }
        let mut next = self.clone();
        let reply = next.apply_inner(cmd, ctx)?;
        next.clean_pg_temp();
        next.clean_pg_history();
        if next != *self {
            next.epoch = self.epoch.next();
            *self = next;
        }
        Ok(reply)
    }

    /// Applies a mutation and returns the incremental to log when it changed
    /// the map.
    pub fn apply_logged(
        &mut self,
        cmd: &MonCommand,
        ctx: &ApplyContext,
    ) -> Result<(Reply, Option<Incremental>), CommandError> {
        let before = self.epoch;
        let reply = self.apply(cmd, ctx)?;
        let inc = (self.epoch != before).then(|| Incremental {
            epoch: self.epoch,
            cmd: cmd.clone(),
            ctx: ctx.clone(),
        });
        Ok((reply, inc))
    }

    /// Replays a logged change; refuses one that does not follow this epoch.
    pub fn apply_incremental(&mut self, inc: &Incremental) -> Result<Reply, CommandError> {
        if inc.epoch != self.epoch.next() {
            return Err(CommandError::invalid(format!(
                "incremental for epoch {} does not follow map epoch {}; fetch the full map",
                inc.epoch.0, self.epoch.0
            )));
        }
        let mut next = self.clone();
        let reply = next.apply(&inc.cmd, &inc.ctx)?;
        if next.epoch != inc.epoch {
            return Err(CommandError::invalid(format!(
                "incremental for epoch {} changed nothing on this map; it was logged against a different map",
                inc.epoch.0
            )));
        }
        *self = next;
        Ok(reply)
    }

    /// Value of a config key for `who` (`osd.3` looks in osd.3, osd,
    /// global), falling back to the option's default.
    pub fn config_value(&self, who: &str, key: &str) -> Option<String> {
        let key = normalize_key(key);
        self.config_set_value(who, &key)
            .cloned()
            .or_else(|| known_option(&key).map(|o| o.default.to_string()))
    }

    /// Value of a config key set for `who` or a section above it, without
    /// the option's default (None: nobody set it).
    pub fn config_set_value(&self, who: &str, key: &str) -> Option<&String> {
        let key = normalize_key(key);
        crate::config::section_chain(who)
            .into_iter()
            .find_map(|section| self.config.get(&(section, key.clone())))
    }

    pub(crate) fn config_u64(&self, key: &str, fallback: u64) -> u64 {
        self.config_value("mon", key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(fallback)
    }

    pub(crate) fn config_bool(&self, key: &str) -> bool {
        self.config_value("mon", key).as_deref() == Some("true")
    }

    fn apply_inner(&mut self, cmd: &MonCommand, ctx: &ApplyContext) -> Result<Reply, CommandError> {
        use MonCommand::*;
        match cmd {
            OsdSetFlag { flag } => Ok(self.set_flag(*flag, true)),
            OsdUnsetFlag { flag } => Ok(self.set_flag(*flag, false)),
            CrushRuleCreateReplicated {
                name,
                root,
                failure_domain,
                class,
            } => self.rule_create_replicated(name, root, failure_domain, class.as_deref()),
            CrushRuleCreateErasure { name, profile } => self.rule_create_erasure(name, profile),
            CrushRuleRm { name } => self.rule_rm(name),
            CrushSetDeviceClass { class, osds } => self.set_device_class(class, osds),
            CrushRmDeviceClass { class, osds } => self.rm_device_class(class.as_deref(), osds),
            CrushReweight { osd, weight } => self.crush_reweight(*osd, *weight),
            OsdReweight { osd, weight } => self.osd_reweight(*osd, *weight),
            SetCrushMap { encoded } => self.set_crush_map(encoded),
            EcProfileSet {
                name,
                params,
                force,
            } => self.ec_profile_set(name, params, *force),
            EcProfileRm { name } => self.ec_profile_rm(name),
            PoolCreate {
                name,
                pg_num,
                pgp_num,
                kind,
                profile,
                rule,
            } => self.pool_create(
                name,
                *pg_num,
                *pgp_num,
                *kind,
                profile.as_deref(),
                rule.as_deref(),
            ),
            PoolSet {
                pool,
                key,
                value,
                sure,
            } => self.pool_set(pool, key, value, *sure),
            PoolApplicationEnable { pool, app } => self.pool_app_enable(pool, app),
            PoolSnapAllocate { pool } => self.pool_snap_allocate(pool),
            PoolDelete {
                pool,
                confirm,
                sure,
            } => self.pool_delete(pool, confirm, *sure),
            AuthGetOrCreate { entity, caps } => self.auth_get_or_create(entity, caps, ctx),
            AuthDel { entity } => self.auth_del(entity, ctx),
            AuthCaps { entity, caps } => self.auth_caps(entity, caps),
            ConfigSet {
                who,
                key,
                value,
                force,
            } => self.config_set(who, key, value, *force),
            ConfigRm { who, key } => self.config_rm(who, key),
            OsdDown { ids } => self.osd_down(ids, false),
            OsdFailed { id } => self.osd_down(&[*id], true),
            OsdOut { ids } => self.osd_set_in(ids, false),
            OsdIn { ids } => self.osd_set_in(ids, true),
            OsdAutoOut { id } => self.osd_auto_out(*id),
            OsdPurge { id, sure } => self.osd_purge(*id, *sure),
            OsdLost { id, sure } => self.osd_lost(*id, *sure),
            OsdSetFullRatio { which, ratio } => self.set_full_ratio(*which, *ratio),
            OsdFullness {
                id,
                used_bytes,
                total_bytes,
            } => self.record_fullness(*id, *used_bytes, *total_bytes),
            PgTemp { from, pgid, osds } => self.set_pg_temp(*from, *pgid, osds),
            MonAdd { name, addr } => self.mon_add(name, addr),
            MonRemove { name } => self.mon_remove(name),
            OsdNew {
                uuid,
                id,
                host,
                weight,
                class,
            } => self.osd_new(uuid, *id, host, *weight, class.as_deref(), ctx),
            OsdBoot {
                id,
                uuid,
                addrs,
                reported,
            } => self.osd_boot(*id, uuid, addrs, reported),
            OsdAlive {
                id,
                want,
                activating,
            } => {
                let r = self.osd_alive(*id, *want)?;
                self.record_activations(*id, activating);
                Ok(r)
            }
            PgScrub { pgid, kind } => self.pg_scrub(*pgid, *kind),
            OsdScrub { osds, kind } => self.osd_scrub(osds, *kind),
            ScrubOrdersDone { done } => self.scrub_orders_done(done),
            OsdBlocklistAdd {
                client,
                expire_secs,
            } => self.blocklist_add(client, *expire_secs),
            OsdBlocklistRm { client } => self.blocklist_rm(client),
            OsdBlocklistExpire { client, added } => Ok(self.blocklist_expire(client, *added)),
            _ => Err(CommandError::invalid(format!(
                "'{}' is read-only",
                cmd.verb()
            ))),
        }
    }

    /// The epoch a change made now will carry.
    pub(crate) fn next_epoch(&self) -> Epoch {
        self.epoch.next()
    }

    // ---------------------------------------------------------------- flags

    fn set_flag(&mut self, flag: OsdFlag, on: bool) -> Reply {
        if on {
            self.flags.insert(flag);
            done(format!("{flag} is set"))
        } else {
            self.flags.remove(&flag);
            done(format!("{flag} is unset"))
        }
    }

    // ---------------------------------------------------------------- crush

    fn rule_create_replicated(
        &mut self,
        name: &str,
        root: &str,
        fd: &str,
        class: Option<&str>,
    ) -> Result<Reply, CommandError> {
        check_name("rule", name)?;
        if self.crush.rule_id(name).is_some() {
            return Ok(done(format!("rule '{name}' already exists")));
        }
        self.check_rule_room()?;
        let id = self
            .crush
            .add_replicated_rule(name, root, fd, class)
            .map_err(crush_err)?;
        Ok(done(format!("created replicated rule '{name}' (id {id})")))
    }

    fn rule_create_erasure(&mut self, name: &str, profile: &str) -> Result<Reply, CommandError> {
        check_name("rule", name)?;
        if self.crush.rule_id(name).is_some() {
            return Ok(done(format!("rule '{name}' already exists")));
        }
        self.check_rule_room()?;
        let p = self.ec_profiles.get(profile).cloned().ok_or_else(|| {
            CommandError::not_found(format!(
                "erasure-code profile '{profile}' does not exist; create it with 'cairn osd erasure-code-profile set {profile} k=2 m=2'"
            ))
        })?;
        let id = self
            .crush
            .add_erasure_rule(
                name,
                &p.crush_root,
                &p.crush_failure_domain,
                p.crush_device_class.as_deref(),
                p.k + p.m,
            )
            .map_err(crush_err)?;
        Ok(done(format!("created erasure rule '{name}' (id {id})")))
    }

    fn check_rule_room(&self) -> Result<(), CommandError> {
        if self.crush.rules().len() >= CRUSH_RULES_MAX {
            return Err(limit_err("CRUSH rules", CRUSH_RULES_MAX));
        }
        Ok(())
    }

    fn rule_rm(&mut self, name: &str) -> Result<Reply, CommandError> {
        let Some(id) = self.crush.rule_id(name) else {
            return Ok(done(format!("rule '{name}' does not exist")));
        };
        if let Some(p) = self.pools.values().find(|p| p.crush_rule == id) {
            return Err(CommandError::busy(format!(
                "rule '{name}' is in use by pool '{}'; switch the pool to another rule first ('cairn osd pool set {} crush_rule OTHER')",
                p.name, p.name
            )));
        }
        self.crush.remove_rule(name).map_err(crush_err)?;
        Ok(done(format!("removed rule '{name}'")))
    }

    fn selected_osds(&self, sel: &OsdSelector) -> Result<Vec<i32>, CommandError> {
        match sel {
            OsdSelector::All => Ok(self.osds.keys().copied().collect()),
            OsdSelector::Ids(ids) => {
                for id in ids {
                    self.osd(*id)?;
                }
                Ok(ids.clone())
            }
        }
    }

    pub(crate) fn osd(&self, id: i32) -> Result<&OsdInfo, CommandError> {
        self.osds.get(&id).ok_or_else(|| {
            CommandError::not_found(format!(
                "osd.{id} does not exist; 'cairn osd ls' lists the OSDs"
            ))
        })
    }

    pub(crate) fn osd_mut(&mut self, id: i32) -> Result<&mut OsdInfo, CommandError> {
        self.osd(id)?;
        self.osds
            .get_mut(&id)
            .ok_or_else(|| CommandError::not_found(format!("osd.{id} does not exist")))
    }

    /// Copies CRUSH's weight, class and host of every OSD into the OSD map.
    fn sync_osds_from_crush(&mut self) {
        let crush = &self.crush;
        for o in self.osds.values_mut() {
            o.crush_weight = crush.device_weight(o.id).unwrap_or(0.0);
            o.device_class = crush.device_class(o.id).map(str::to_string);
            if let Some(h) = crush.parent_of_type(o.id, "host") {
                o.host = h;
            }
        }
    }

    fn set_device_class(&mut self, class: &str, sel: &OsdSelector) -> Result<Reply, CommandError> {
        check_name("device class", class)?;
        let ids = self.selected_osds(sel)?;
        let mut changed = Vec::new();
        for id in &ids {
            match self.crush.device_class(*id) {
                Some(c) if c == class => continue,
                Some(c) => {
                    return Err(CommandError::busy(format!(
                        "osd.{id} already has class '{c}'; remove it first with 'cairn osd crush rm-device-class osd.{id}'"
                    )))
                }
                None => {}
            }
            self.crush.set_device_class(*id, class).map_err(crush_err)?;
            changed.push(format!("osd.{id}"));
        }
        self.sync_osds_from_crush();
        Ok(done(if changed.is_empty() {
            format!("no change: the OSDs already have class '{class}'")
        } else {
            format!("set osd(s) {} to class '{class}'", changed.join(","))
        }))
    }

    fn rm_device_class(
        &mut self,
        class: Option<&str>,
        sel: &OsdSelector,
    ) -> Result<Reply, CommandError> {
        let ids = self.selected_osds(sel)?;
        let mut changed = Vec::new();
        for id in &ids {
            let current = self.crush.device_class(*id).map(str::to_string);
            match (current, class) {
                (None, _) => continue,
                (Some(c), Some(want)) if c != want => {
                    return Err(CommandError::invalid(format!(
                        "osd.{id} has class '{c}', not '{want}'"
                    )))
                }
                _ => {}
            }
            self.crush.rm_device_class(*id).map_err(crush_err)?;
            changed.push(format!("osd.{id}"));
        }
        self.sync_osds_from_crush();
        Ok(done(if changed.is_empty() {
            "no change: the OSDs have no device class".to_string()
        } else {
            format!("done removing class of osd(s): {}", changed.join(","))
        }))
    }

    fn crush_reweight(&mut self, osd: i32, weight: f64) -> Result<Reply, CommandError> {
        if !(0.0..=CRUSH_WEIGHT_MAX_TIB).contains(&weight) {
            return Err(CommandError::invalid(format!(
                "crush weight {weight} is out of range: it is in TiB, between 0 and {CRUSH_WEIGHT_MAX_TIB}"
            )));
        }
        self.osd(osd)?;
        if self.crush.device_weight(osd).is_none() {
            return Err(CommandError::not_found(format!(
                "osd.{osd} is not in the CRUSH map"
            )));
        }
        self.crush.reweight_device(osd, weight).map_err(crush_err)?;
        self.sync_osds_from_crush();
        Ok(done(format!(
            "reweighted item id {osd} name 'osd.{osd}' to {weight} in crush map"
        )))
    }

    fn osd_reweight(&mut self, osd: i32, weight: f64) -> Result<Reply, CommandError> {
        if !(0.0..=1.0).contains(&weight) {
            return Err(CommandError::invalid(format!(
                "reweight {weight} is out of range: use a value between 0.0 and 1.0 (to change capacity use 'cairn osd crush reweight osd.{osd} WEIGHT_TIB')"
            )));
        }
        self.osd_mut(osd)?.reweight = weight;
        Ok(done(format!("reweighted osd.{osd} to {weight}")))
    }

    fn set_crush_map(&mut self, encoded: &[u8]) -> Result<Reply, CommandError> {
        let crush = match CrushMap::decode(encoded) {
            Ok(c) => c,
            Err(decode_err) => match std::str::from_utf8(encoded) {
                Ok(text) => CrushMap::parse_text(text).map_err(|e| {
                    CommandError::invalid(format!(
                        "the new CRUSH map is neither a compiled map ({decode_err}) nor valid text: {e}"
                    ))
                })?,
                Err(_) => {
                    return Err(CommandError::invalid(format!(
                        "the new CRUSH map cannot be decoded: {decode_err}"
                    )))
                }
            },
        };
        for dev in crush.device_ids() {
            if !self.osds.contains_key(&dev) {
                return Err(CommandError::invalid(format!(
                    "the new CRUSH map places osd.{dev}, which does not exist in the OSD map; remove it from the map or create the OSD first"
                )));
            }
        }
        let rules = crush.rules();
        for p in self.pools.values() {
            let want = match p.kind {
                PoolKind::Replicated => RuleType::Replicated,
                PoolKind::Erasure => RuleType::Erasure,
            };
            match rules.iter().find(|r| r.id == p.crush_rule) {
                Some(r) if r.rule_type == want => {}
                Some(r) => {
                    return Err(CommandError::invalid(format!(
                        "pool '{}' uses rule id {} which in the new map is '{}', not a {} rule",
                        p.name,
                        p.crush_rule,
                        r.name,
                        p.kind.as_str()
                    )))
                }
                None => {
                    return Err(CommandError::invalid(format!(
                        "pool '{}' uses rule id {}, which the new CRUSH map lacks; keep that rule or move the pool first",
                        p.name, p.crush_rule
                    )))
                }
            }
        }
        self.crush = crush;
        self.sync_osds_from_crush();
        Ok(done(format!(
            "set crush map (epoch {})",
            self.next_epoch().0
        )))
    }

    // ---------------------------------------------------------------- ec profiles

    fn ec_profile_set(
        &mut self,
        name: &str,
        params: &[(String, String)],
        force: bool,
    ) -> Result<Reply, CommandError> {
        check_name("erasure-code profile", name)?;
        let default_su = self.config_u64("osd_pool_erasure_code_stripe_unit", 4096);
        let profile = EcProfile::from_params(params, default_su)
            .map_err(|e| CommandError::invalid(format!("erasure-code profile '{name}': {e}")))?;
        if let Some(old) = self.ec_profiles.get(name) {
            if *old == profile {
                return Ok(done(format!(
                    "erasure-code profile '{name}' already exists"
                )));
            }
            if let Some(p) = self
                .pools
                .values()
                .find(|p| p.ec_profile.as_deref() == Some(name))
            {
                return Err(CommandError::busy(format!(
                    "erasure-code profile '{name}' is used by pool '{}' and cannot change; create a profile with another name",
                    p.name
                )));
            }
            if !force {
                return Err(CommandError::exists(format!(
                    "erasure-code profile '{name}' already exists with different settings; add --force to replace it"
                )));
            }
        }
        if !self.ec_profiles.contains_key(name) && self.ec_profiles.len() >= EC_PROFILES_MAX {
            return Err(limit_err("erasure-code profiles", EC_PROFILES_MAX));
        }
        self.ec_profiles.insert(name.to_string(), profile);
        Ok(done(format!("set erasure-code profile '{name}'")))
    }

    fn ec_profile_rm(&mut self, name: &str) -> Result<Reply, CommandError> {
        if !self.ec_profiles.contains_key(name) {
            return Ok(done(format!(
                "erasure-code profile '{name}' does not exist"
            )));
        }
        if let Some(p) = self
            .pools
            .values()
            .find(|p| p.ec_profile.as_deref() == Some(name))
        {
            return Err(CommandError::busy(format!(
                "erasure-code profile '{name}' is in use by pool '{}'; delete the pool first",
                p.name
            )));
        }
        self.ec_profiles.remove(name);
        Ok(done(format!("removed erasure-code profile '{name}'")))
    }

    // ---------------------------------------------------------------- pools

    /// The pool called `name`, if any.
    pub fn pool_named(&self, name: &str) -> Option<&Pool> {
        self.pools.values().find(|p| p.name == name)
    }

    pub(crate) fn pool_by_name(&self, name: &str) -> Result<&Pool, CommandError> {
        self.pools.values().find(|p| p.name == name).ok_or_else(|| {
            CommandError::not_found(format!(
                "pool '{name}' does not exist; 'cairn osd pool ls' lists the pools"
            ))
        })
    }

    /// Finds a rule by name or numeric id.
    pub(crate) fn resolve_rule(&self, rule: &str) -> Result<cairn_crush::RuleInfo, CommandError> {
        let rules = self.crush.rules();
        let by_name = rules.iter().find(|r| r.name == rule);
        let found = by_name.or_else(|| {
            rule.parse::<i32>()
                .ok()
                .and_then(|id| rules.iter().find(|r| r.id == id))
        });
        found.cloned().ok_or_else(|| {
            CommandError::not_found(format!(
                "CRUSH rule '{rule}' does not exist; 'cairn osd crush rule ls' lists the rules"
            ))
        })
    }

    fn default_replicated_rule(&self) -> Result<cairn_crush::RuleInfo, CommandError> {
        let wanted = self
            .config_value("mon", "osd_pool_default_crush_rule")
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or(-1);
        let rules = self.crush.rules();
        let found = if wanted >= 0 {
            rules.into_iter().find(|r| r.id == wanted)
        } else {
            rules
                .into_iter()
                .filter(|r| r.rule_type == RuleType::Replicated)
                .min_by_key(|r| r.id)
        };
        found.ok_or_else(|| {
            CommandError::not_found(
                "no replicated CRUSH rule to use; create one with 'cairn osd crush rule create-replicated replicated_rule default host'",
            )
        })
    }

    fn check_rule_kind(rule: &cairn_crush::RuleInfo, kind: PoolKind) -> Result<(), CommandError> {
        let ok = matches!(
            (kind, rule.rule_type),
            (PoolKind::Replicated, RuleType::Replicated) | (PoolKind::Erasure, RuleType::Erasure)
        );
        if ok {
            Ok(())
        } else {
            Err(CommandError::invalid(format!(
                "CRUSH rule '{}' is not a {} rule; a {} pool needs one ('cairn osd crush rule ls')",
                rule.name,
                kind.as_str(),
                kind.as_str()
            )))
        }
    }

    fn check_size_one(&self, size: u32, sure: bool) -> Result<(), CommandError> {
        if size == 1 && !(self.config_bool("mon_allow_pool_size_one") && sure) {
            return Err(CommandError::not_permitted(
                "a pool of size 1 keeps a single copy and loses data with any disk; if you really want that, run 'cairn config set global mon_allow_pool_size_one true' and pass --yes-i-really-mean-it",
            ));
        }
        Ok(())
    }

    /// Refuses a change that would put more than `mon_max_pg_per_osd` PG
    /// replicas on the average in OSD (skipped while no OSD is in).
    fn check_pg_per_osd(&self, pool_id: u64, pg_num: u32, size: u32) -> Result<(), CommandError> {
        let in_osds = self.osds.values().filter(|o| o.is_in).count() as u64;
        if in_osds == 0 {
            return Ok(());
        }
        let max = self.config_u64("mon_max_pg_per_osd", 250);
        let others: u64 = self
            .pools
            .values()
            .filter(|p| p.id != pool_id)
            .map(|p| u64::from(p.pg_num) * u64::from(p.size))
            .sum();
        let total = others + u64::from(pg_num) * u64::from(size);
        let per_osd = total / in_osds;
        if per_osd > max {
            return Err(CommandError::invalid(format!(
                "this would put {per_osd} PG replicas on each of the {in_osds} in OSDs, more than mon_max_pg_per_osd {max}; use a smaller pg_num, add OSDs, or raise mon_max_pg_per_osd"
            )));
        }
        Ok(())
    }

    fn check_pg_num(what: &str, n: u32) -> Result<(), CommandError> {
        if n == 0 || n > POOL_PG_NUM_MAX {
            return Err(CommandError::invalid(format!(
                "{what} {n} is out of range: it must be between 1 and {POOL_PG_NUM_MAX}"
            )));
        }
        Ok(())
    }

    /// pg_num and pgp_num of a new pool: given, or from central config.
    fn new_pool_pg_counts(
        &self,
        pg_num: Option<u32>,
        pgp_num: Option<u32>,
    ) -> Result<(u32, u32), CommandError> {
        let pg_num =
            pg_num.unwrap_or_else(|| self.config_u64("osd_pool_default_pg_num", 32) as u32);
        Self::check_pg_num("pg_num", pg_num)?;
        let pgp_default = match self.config_u64("osd_pool_default_pgp_num", 0) as u32 {
            0 => pg_num,
            n => n.min(pg_num),
        };
        let pgp_num = pgp_num.unwrap_or(pgp_default);
        Self::check_pg_num("pgp_num", pgp_num)?;
        if pgp_num > pg_num {
            return Err(CommandError::invalid(format!(
                "pgp_num {pgp_num} is larger than pg_num {pg_num}; pgp_num must not exceed pg_num"
            )));
        }
        Ok((pg_num, pgp_num))
    }

    /// Size, min_size and rule of a new replicated pool.
    fn replicated_layout(
        &self,
        profile: Option<&str>,
        rule: Option<&str>,
    ) -> Result<PoolLayout, CommandError> {
        if profile.is_some() {
            return Err(CommandError::invalid(
                "an erasure-code profile only applies to erasure pools",
            ));
        }
        let size = self.config_u64("osd_pool_default_size", 3) as u32;
        self.check_size_one(size, true)?;
        let min_size = match self.config_u64("osd_pool_default_min_size", 0) as u32 {
            0 => size - size / 2,
            n => n.min(size),
        };
        let rule = match rule {
            Some(r) => self.resolve_rule(r)?,
            None => self.default_replicated_rule()?,
        };
        Self::check_rule_kind(&rule, PoolKind::Replicated)?;
        Ok(PoolLayout {
            size,
            min_size,
            crush_rule: rule.id,
            ec_profile: None,
            stripe_width: 0,
        })
    }

    /// Layout of a new EC pool: size k+m, min_size k+1 (k when m = 1), and the given rule
    /// or an indep rule named after the pool (created when missing).
    fn erasure_layout(
        &mut self,
        pool: &str,
        profile: Option<&str>,
        rule: Option<&str>,
    ) -> Result<PoolLayout, CommandError> {
        let pname = profile.unwrap_or("default");
        let prof = self.ec_profiles.get(pname).cloned().ok_or_else(|| {
            CommandError::not_found(format!(
                "erasure-code profile '{pname}' does not exist; create it with 'cairn osd erasure-code-profile set {pname} k=2 m=2'"
            ))
        })?;
        let crush_rule = match rule.or(self.crush.rule_id(pool).map(|_| pool)) {
            Some(r) => {
                let r = self.resolve_rule(r)?;
                Self::check_rule_kind(&r, PoolKind::Erasure)?;
                r.id
            }
            None => {
                self.check_rule_room()?;
                self.crush
                    .add_erasure_rule(
                        pool,
                        &prof.crush_root,
                        &prof.crush_failure_domain,
                        prof.crush_device_class.as_deref(),
                        prof.k + prof.m,
                    )
                    .map_err(crush_err)?
            }
        };
        Ok(PoolLayout {
            size: prof.k + prof.m,
            // Ceph's rule: k+1, or k when m = 1 (else one failure would stop I/O).
            min_size: prof.k + 1.min(prof.m - 1),
            crush_rule,
            ec_profile: Some(pname.to_string()),
            stripe_width: u64::from(prof.k) * prof.stripe_unit,
        })
    }

    fn pool_create(
        &mut self,
        name: &str,
        pg_num: Option<u32>,
        pgp_num: Option<u32>,
        kind: PoolKind,
        profile: Option<&str>,
        rule: Option<&str>,
    ) -> Result<Reply, CommandError> {
        check_name("pool", name)?;
        if let Ok(p) = self.pool_by_name(name) {
            if p.kind == kind {
                return Ok(done(format!("pool '{name}' already exists")));
            }
            return Err(CommandError::exists(format!(
                "pool '{name}' already exists as a {} pool",
                p.kind.as_str()
            )));
        }
        if self.pools.len() >= POOLS_MAX {
            return Err(limit_err("pools", POOLS_MAX));
        }
        let (pg_num, pgp_num) = self.new_pool_pg_counts(pg_num, pgp_num)?;
        let layout = match kind {
            PoolKind::Replicated => self.replicated_layout(profile, rule)?,
            PoolKind::Erasure => self.erasure_layout(name, profile, rule)?,
        };
        let id = self.pool_max + 1;
        let e = self.next_epoch();
        let pool = Pool {
            id,
            name: name.to_string(),
            kind,
            size: layout.size,
            min_size: layout.min_size,
            pg_num,
            pgp_num,
            crush_rule: layout.crush_rule,
            ec_profile: layout.ec_profile,
            applications: Default::default(),
            allow_ec_overwrites: false,
            bulk: false,
            target_size_ratio: 0.0,
            quota_max_bytes: 0,
            quota_max_objects: 0,
            stripe_width: layout.stripe_width,
            created: e,
            last_change: e,
            snap_seq: 0,
        };
        self.check_pg_per_osd(id, pool.pg_num, pool.size)?;
        let warning = self.placement_shortfall(&pool).map(|s| s.describe(&pool));
        self.pool_max = id;
        self.pools.insert(id, pool);
        let mut plain = format!("pool '{name}' created");
        if let Some(w) = &warning {
            plain.push_str(&format!("\nwarning: {w}"));
        }
        Ok(Reply::new(
            plain,
            json!({ "result": "ok", "pool": name, "pool_id": id, "placement_warning": warning }),
        ))
    }

    fn pool_set(
        &mut self,
        name: &str,
        key: &str,
        value: &str,
        sure: bool,
    ) -> Result<Reply, CommandError> {
        let old = self.pool_by_name(name)?.clone();
        let mut p = old.clone();
        match key {
            "size" | "min_size" | "pg_num" | "pgp_num" => {
                self.set_pool_count(&mut p, key, value, sure)?
            }
            _ => self.set_pool_option(&mut p, key, value)?,
        }
        if p == old {
            return Ok(done(format!("pool '{name}' {key} is already {value}")));
        }
        self.check_pg_per_osd(p.id, p.pg_num, p.size)?;
        p.last_change = self.next_epoch();
        self.pools.insert(p.id, p);
        Ok(done(format!("set pool {} {key} to {value}", old.id)))
    }

    /// size, min_size, pg_num, pgp_num.
    fn set_pool_count(
        &self,
        p: &mut Pool,
        key: &str,
        value: &str,
        sure: bool,
    ) -> Result<(), CommandError> {
        let n: u64 = value.parse().map_err(|_| {
            CommandError::invalid(format!("{key} = '{value}': expected a whole number"))
        })?;
        let name = p.name.clone();
        match key {
            "size" => {
                if p.kind == PoolKind::Erasure {
                    return Err(CommandError::invalid(format!(
                        "pool '{name}' is erasure-coded: its size is k+m = {} and cannot change",
                        p.size
                    )));
                }
                if n == 0 || n > u64::from(POOL_SIZE_MAX) {
                    return Err(CommandError::invalid(format!(
                        "size {n} is out of range: it must be between 1 and {POOL_SIZE_MAX}"
                    )));
                }
                self.check_size_one(n as u32, sure)?;
                p.size = n as u32;
                p.min_size = p.min_size.min(p.size);
            }
            "min_size" => {
                let low = if p.kind == PoolKind::Erasure {
                    p.size - self.ec_m(p)
                } else {
                    1
                };
                if n < u64::from(low) || n > u64::from(p.size) {
                    return Err(CommandError::invalid(format!(
                        "min_size {n} is out of range for pool '{name}': it must be between {low} and its size {}",
                        p.size
                    )));
                }
                p.min_size = n as u32;
            }
            _ => {
                if n == 0 || n > u64::from(POOL_PG_NUM_MAX) {
                    return Err(CommandError::invalid(format!(
                        "{key} {n} is out of range: it must be between 1 and {POOL_PG_NUM_MAX}"
                    )));
                }
                let n = n as u32;
                if key == "pg_num" {
                    if n != p.pg_num {
                        // An object's PG is its hash modulo pg_num: a new
                        // pg_num moves objects to PGs that do not hold them.
                        return Err(CommandError::invalid(format!(
                            "pool '{name}': changing pg_num ({} -> {n}) is not supported yet: the OSDs cannot split or merge PGs, so objects would become unreachable; create a new pool with the pg_num you want and copy the data into it",
                            p.pg_num
                        )));
                    }
                } else if n > p.pg_num {
                    return Err(CommandError::invalid(format!(
                        "pgp_num {n} is larger than pg_num {}; pgp_num cannot exceed pg_num",
                        p.pg_num
                    )));
                } else {
                    p.pgp_num = n;
                }
            }
        }
        Ok(())
    }

    /// crush_rule, allow_ec_overwrites, bulk, target_size_ratio, quotas.
    fn set_pool_option(&self, p: &mut Pool, key: &str, value: &str) -> Result<(), CommandError> {
        let boolean = |v: &str| {
            crate::config::parse_bool_value(v)
                .map_err(|e| CommandError::invalid(format!("{key}: {e}")))
        };
        match key {
            "crush_rule" => {
                let r = self.resolve_rule(value)?;
                Self::check_rule_kind(&r, p.kind)?;
                p.crush_rule = r.id;
            }
            "allow_ec_overwrites" => {
                if p.kind != PoolKind::Erasure {
                    return Err(CommandError::invalid(format!(
                        "allow_ec_overwrites applies to erasure pools; pool '{}' is replicated",
                        p.name
                    )));
                }
                let on = boolean(value)?;
                if !on && p.allow_ec_overwrites {
                    return Err(CommandError::invalid(
                        "ec overwrites cannot be disabled once enabled",
                    ));
                }
                p.allow_ec_overwrites = on;
            }
            "bulk" => p.bulk = boolean(value)?,
            "target_size_ratio" => {
                p.target_size_ratio = value
                    .parse()
                    .ok()
                    .filter(|r: &f64| r.is_finite() && *r >= 0.0)
                    .ok_or_else(|| {
                        CommandError::invalid(format!(
                            "target_size_ratio = '{value}': expected a number >= 0 (e.g. 0.2)"
                        ))
                    })?;
            }
            "quota_max_bytes" => {
                p.quota_max_bytes = crate::config::parse_size(value)
                    .map_err(|e| CommandError::invalid(format!("quota_max_bytes: {e}")))?
            }
            "quota_max_objects" => {
                p.quota_max_objects = value.parse().map_err(|_| {
                    CommandError::invalid(format!(
                        "quota_max_objects = '{value}': expected a whole number"
                    ))
                })?
            }
            _ => {
                return Err(CommandError::invalid(format!(
                    "unknown pool setting '{key}'; settable: {}",
                    POOL_SET_KEYS.join(", ")
                )))
            }
        }
        Ok(())
    }

    fn ec_m(&self, p: &Pool) -> u32 {
        p.ec_profile
            .as_ref()
            .and_then(|n| self.ec_profiles.get(n))
            .map(|e| e.m)
            .unwrap_or(p.size.saturating_sub(1))
    }

    fn pool_app_enable(&mut self, name: &str, app: &str) -> Result<Reply, CommandError> {
        let p = self.pool_by_name(name)?.clone();
        check_name("application", app)?;
        if p.applications.contains_key(app) {
            return Ok(done(format!(
                "application '{app}' is already enabled on pool '{name}'"
            )));
        }
        let e = self.next_epoch();
        if let Some(pool) = self.pools.get_mut(&p.id) {
            pool.applications
                .insert(app.to_string(), Default::default());
            pool.last_change = e;
        }
        Ok(done(format!(
            "enabled application '{app}' on pool '{name}'"
        )))
    }

    /// Hands out the next self-managed snapshot id of a pool (RBD
    /// snapshots): bumps `snap_seq` in a new epoch, so ids are unique
    /// cluster-wide and never reused. JSON: `{"snap_id": N}`.
    fn pool_snap_allocate(&mut self, name: &str) -> Result<Reply, CommandError> {
        let id = self.pool_by_name(name)?.id;
        let e = self.next_epoch();
        let pool = self
            .pools
            .get_mut(&id)
            .ok_or_else(|| CommandError::not_found(format!("pool '{name}' does not exist")))?;
        pool.snap_seq += 1;
        pool.last_change = e;
        let snap = pool.snap_seq;
        Ok(Reply::new(
            format!("allocated snapshot id {snap} in pool '{name}'"),
            json!({ "snap_id": snap }),
        ))
    }

    fn pool_delete(
        &mut self,
        name: &str,
        confirm: &str,
        sure: bool,
    ) -> Result<Reply, CommandError> {
        let Ok(p) = self.pool_by_name(name) else {
            return Ok(done(format!("pool '{name}' does not exist")));
        };
        let id = p.id;
        if confirm != name || !sure {
            return Err(CommandError::not_permitted(format!(
                "this will PERMANENTLY DESTROY all data stored in pool '{name}'; if you are sure, pass the pool name twice followed by --yes-i-really-really-mean-it: 'cairn osd pool delete {name} {name} --yes-i-really-really-mean-it'"
            )));
        }
        if !self.config_bool("mon_allow_pool_delete") {
            return Err(CommandError::not_permitted(
                "pool deletion is disabled; to allow it run 'cairn config set mon mon_allow_pool_delete true' (and set it back to false afterwards)",
            ));
        }
        self.pools.remove(&id);
        Ok(done(format!("pool '{name}' removed")))
    }

    // ---------------------------------------------------------------- auth

    fn validated_caps(
        caps: &[(String, String)],
    ) -> Result<std::collections::BTreeMap<String, String>, CommandError> {
        let mut out = std::collections::BTreeMap::new();
        for (service, text) in caps {
            Caps::parse(service, text).map_err(|e| CommandError::invalid(e.to_string()))?;
            if out.insert(service.clone(), text.clone()).is_some() {
                return Err(CommandError::invalid(format!(
                    "caps for '{service}' given twice; join them with a comma: '{service} \"allow r, allow w\"'"
                )));
            }
        }
        Ok(out)
    }

    fn auth_get_or_create(
        &mut self,
        entity: &EntityName,
        caps: &[(String, String)],
        ctx: &ApplyContext,
    ) -> Result<Reply, CommandError> {
        let caps = Self::validated_caps(caps)?;
        if let Some(existing) = self.auth.get(entity) {
            if !caps.is_empty() && caps != existing.caps {
                return Err(CommandError::exists(format!(
                    "key for {entity} exists but its caps differ from the requested ones; change them with 'cairn auth caps {entity} …'"
                )));
            }
            return Ok(crate::query::keyring_reply(entity, existing));
        }
        if self.auth.len() >= AUTH_ENTITIES_MAX {
            return Err(limit_err("auth entities", AUTH_ENTITIES_MAX));
        }
        let secret = ctx.generated_secret.ok_or_else(|| {
            CommandError::invalid(format!(
                "cannot create {entity}: the monitor supplied no secret for the new key (internal error; retry the command)"
            ))
        })?;
        let ent = AuthEntity {
            key: crate::model::encode_secret(&secret),
            caps,
        };
        let reply = crate::query::keyring_reply(entity, &ent);
        self.auth.insert(entity.clone(), ent);
        Ok(reply)
    }

    fn auth_del(&mut self, entity: &EntityName, ctx: &ApplyContext) -> Result<Reply, CommandError> {
        if !self.auth.contains_key(entity) {
            return Err(CommandError::not_found(format!(
                "entity {entity} does not exist; 'cairn auth ls' lists them"
            )));
        }
        if *entity == ctx.caller {
            return Err(CommandError::not_permitted(format!(
                "refusing to delete {entity}: it is the key this command was sent with; use another admin key"
            )));
        }
        self.auth.remove(entity);
        Ok(done(format!("deleted {entity}")))
    }

    fn auth_caps(
        &mut self,
        entity: &EntityName,
        caps: &[(String, String)],
    ) -> Result<Reply, CommandError> {
        let caps = Self::validated_caps(caps)?;
        let ent = self.auth.get_mut(entity).ok_or_else(|| {
            CommandError::not_found(format!(
                "entity {entity} does not exist; create it with 'cairn auth get-or-create {entity} …'"
            ))
        })?;
        ent.caps = caps;
        Ok(done(format!("updated caps for {entity}")))
    }

    // ---------------------------------------------------------------- config

    fn config_set(
        &mut self,
        who: &str,
        key: &str,
        value: &str,
        force: bool,
    ) -> Result<Reply, CommandError> {
        let section = validate_section(who).map_err(CommandError::invalid)?;
        let key = normalize_key(key);
        if let Some(verb) = crate::fullness::ratio_in_map(&key) {
            return Err(CommandError::invalid(format!(
                "{key} is kept in the OSD map, where the three ratios are checked against each other: run 'cairn osd {verb} {value}'"
            )));
        }
        let value = match known_option(&key) {
            Some(opt) => validate_value(opt, value).map_err(CommandError::invalid)?,
            None if force => {
                let key_ok = !key.is_empty()
                    && key.len() <= NAME_MAX_LEN
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'));
                if !key_ok {
                    return Err(CommandError::invalid(format!(
                        "invalid config key '{key}': use 1..={NAME_MAX_LEN} letters, digits, '_' or '.'"
                    )));
                }
                crate::config::validate_free_text(&key, value).map_err(CommandError::invalid)?
            }
            None => {
                let hint = suggest_option(&key)
                    .map(|s| format!("did you mean '{s}'? "))
                    .unwrap_or_default();
                return Err(CommandError::invalid(format!(
                    "unknown config option '{key}'; {hint}to store it anyway add --force ('cairn config set {section} {key} {value} --force')"
                )));
            }
        };
        let entry = (section.clone(), key.clone());
        if !self.config.contains_key(&entry) && self.config.len() >= CONFIG_ENTRIES_MAX {
            return Err(limit_err("config entries", CONFIG_ENTRIES_MAX));
        }
        self.config.insert(entry, value.clone());
        Ok(done(format!("set {section} {key} = {value}")))
    }

    fn config_rm(&mut self, who: &str, key: &str) -> Result<Reply, CommandError> {
        let section = validate_section(who).map_err(CommandError::invalid)?;
        let key = normalize_key(key);
        if self
            .config
            .remove(&(section.clone(), key.clone()))
            .is_none()
        {
            return Ok(done(format!("{section} {key} was not set")));
        }
        Ok(done(format!("removed {section} {key}")))
    }

    // ---------------------------------------------------------------- mons

    fn mon_add(&mut self, name: &str, addr: &str) -> Result<Reply, CommandError> {
        let ok = !name.is_empty()
            && name.len() <= 32
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
        if !ok {
            return Err(CommandError::invalid(format!(
                "invalid monitor name '{name}': use 1..=32 letters, digits, '-' or '_'"
            )));
        }
        let sock: std::net::SocketAddr = addr.parse().map_err(|_| {
            CommandError::invalid(format!(
                "invalid monitor address '{addr}': expected IP:PORT such as 127.0.0.1:6789"
            ))
        })?;
        let addr = sock.to_string();
        if let Some(m) = self.mons.iter().find(|m| m.name == name) {
            if m.addr == addr {
                return Ok(done(format!("mon.{name} at {addr} already exists")));
            }
            return Err(CommandError::exists(format!(
                "mon.{name} already exists at {}; remove it first with 'cairn mon remove {name}'",
                m.addr
            )));
        }
        if let Some(m) = self.mons.iter().find(|m| m.addr == addr) {
            return Err(CommandError::exists(format!(
                "address {addr} is already used by mon.{}",
                m.name
            )));
        }
        if self.mons.len() >= MONS_MAX {
            return Err(CommandError::invalid(format!(
                "the map already has {MONS_MAX} monitors, the most Cairn supports"
            )));
        }
        self.mons.push(MonInfo {
            name: name.to_string(),
            addr: addr.clone(),
            rank: self.mons.len() as u32,
        });
        Ok(done(format!("added mon.{name} at {addr}")))
    }

    fn mon_remove(&mut self, name: &str) -> Result<Reply, CommandError> {
        let Some(pos) = self.mons.iter().position(|m| m.name == name) else {
            return Err(CommandError::not_found(format!(
                "mon.{name} does not exist; 'cairn mon dump' lists the monitors"
            )));
        };
        if self.mons.len() == 1 {
            return Err(CommandError::not_permitted(format!(
                "refusing to remove mon.{name}: it is the last monitor"
            )));
        }
        self.mons.remove(pos);
        for (rank, m) in self.mons.iter_mut().enumerate() {
            m.rank = rank as u32;
        }
        Ok(done(format!("removed mon.{name}")))
    }

    // ---------------------------------------------------------------- osds

    fn osd_new(
        &mut self,
        uuid: &str,
        want_id: Option<i32>,
        host: &str,
        weight: f64,
        class: Option<&str>,
        ctx: &ApplyContext,
    ) -> Result<Reply, CommandError> {
        let uuid_ok = !uuid.is_empty()
            && uuid.len() <= 64
            && uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        if !uuid_ok {
            return Err(CommandError::invalid(format!(
                "invalid OSD uuid '{uuid}': expected a UUID such as 5afc28eb-61b3-45f1-b441-6f913fd70505"
            )));
        }
        check_name("host", host)?;
        if let Some(c) = class {
            check_name("device class", c)?;
        }
        if !(0.0..=CRUSH_WEIGHT_MAX_TIB).contains(&weight) {
            return Err(CommandError::invalid(format!(
                "OSD weight {weight} is out of range: it is in TiB, between 0 and {CRUSH_WEIGHT_MAX_TIB}"
            )));
        }
        if let Some(o) = self.osds.values().find(|o| o.uuid == uuid) {
            if want_id.is_some_and(|w| w != o.id) {
                return Err(CommandError::exists(format!(
                    "uuid {uuid} already belongs to osd.{}",
                    o.id
                )));
            }
            return Ok(Reply::new(o.id.to_string(), json!({ "osdid": o.id })));
        }
        let in_crush = self.crush.device_ids();
        let id = match want_id {
            Some(id) if id < 0 => {
                return Err(CommandError::invalid(format!("osd id {id} is negative")))
            }
            Some(id) if self.osds.contains_key(&id) || in_crush.contains(&id) => {
                return Err(CommandError::exists(format!(
                    "osd.{id} already exists; purge it first or let the monitors pick an id"
                )))
            }
            Some(id) => id,
            None => (0..)
                .find(|i| !self.osds.contains_key(i) && !in_crush.contains(i))
                .unwrap_or(0),
        };
        self.crush
            .add_device(id, class, weight, &[("host", host), ("root", "default")])
            .map_err(crush_err)?;
        self.osds.insert(
            id,
            OsdInfo {
                id,
                uuid: uuid.to_string(),
                host: host.to_string(),
                addrs: Vec::new(),
                device_class: None,
                crush_weight: 0.0,
                reweight: 1.0,
                up: false,
                is_in: false,
                up_from: Epoch(0),
                up_thru: Epoch(0),
                down_at: Epoch(0),
                ever_booted: false,
                auto_out: false,
                lost_at: Epoch(0),
                last_reported: None,
            },
        );
        self.sync_osds_from_crush();
        let entity = EntityName::osd(id);
        if let (Some(secret), false) = (ctx.generated_secret, self.auth.contains_key(&entity)) {
            self.auth.insert(
                entity,
                AuthEntity::new(&secret, &[("mon", "allow r"), ("osd", "allow *")]),
            );
        }
        Ok(Reply::new(id.to_string(), json!({ "osdid": id })))
    }

    fn osd_boot(
        &mut self,
        id: i32,
        uuid: &str,
        addrs: &[String],
        reported: &OsdReported,
    ) -> Result<Reply, CommandError> {
        let o = self.osd(id)?.clone();
        if o.uuid != uuid {
            return Err(CommandError::invalid(format!(
                "osd.{id} is registered with uuid {}, but the booting daemon has {uuid}; is the right disk attached?",
                o.uuid
            )));
        }
        if addrs.len() > OSD_ADDRS_MAX || reported.state.len() > OSD_STATE_MAX_LEN {
            return Err(CommandError::invalid(format!(
                "osd.{id}: at most {OSD_ADDRS_MAX} addresses and a state of at most {OSD_STATE_MAX_LEN} characters"
            )));
        }
        for a in addrs {
            a.parse::<std::net::SocketAddr>().map_err(|_| {
                CommandError::invalid(format!("osd.{id}: invalid address '{a}', expected IP:PORT"))
            })?;
        }
        if self.flags.contains(&OsdFlag::NoUp) {
            return Err(CommandError::not_permitted(format!(
                "the noup flag is set: osd.{id} stays down until 'cairn osd unset noup'"
            )));
        }
        let retry = o.up
            && o.addrs == addrs
            && o.last_reported.as_ref().map(|r| r.boot_id) == Some(reported.boot_id);
        if retry {
            return Ok(done(format!("osd.{id} is already up")));
        }
        let e = self.next_epoch();
        let noin = self.flags.contains(&OsdFlag::NoIn);
        let mark_in = !noin
            && ((!o.ever_booted && self.config_bool("mon_osd_auto_mark_new_in"))
                || o.auto_out
                || self.config_bool("mon_osd_auto_mark_in"));
        let osd = self.osd_mut(id)?;
        if osd.up {
            // A restart the monitors had not noticed: a new interval starts.
            osd.down_at = e;
        }
        osd.up = true;
        osd.up_from = e;
        osd.addrs = addrs.to_vec();
        osd.last_reported = Some(reported.clone());
        osd.ever_booted = true;
        if mark_in {
            osd.is_in = true;
            osd.auto_out = false;
        }
        Ok(done(format!("osd.{id} is up (epoch {})", e.0)))
    }

    fn osd_alive(&mut self, id: i32, want: Epoch) -> Result<Reply, CommandError> {
        let o = self.osd(id)?.clone();
        if !o.up {
            return Err(CommandError::invalid(format!(
                "osd.{id} is down; it must boot before asking for up_thru"
            )));
        }
        if want > self.epoch {
            return Err(CommandError::invalid(format!(
                "osd.{id} asked for up_thru {} beyond the current epoch {}",
                want.0, self.epoch.0
            )));
        }
        if o.up_thru >= want {
            return Ok(done(format!("osd.{id} up_thru is already {}", o.up_thru.0)));
        }
        self.osd_mut(id)?.up_thru = want;
        Ok(done(format!("osd.{id} up_thru {}", want.0)))
    }

    fn osd_down(&mut self, ids: &[i32], failure: bool) -> Result<Reply, CommandError> {
        for id in ids {
            self.osd(*id)?;
        }
        if failure && self.flags.contains(&OsdFlag::NoDown) {
            return Err(CommandError::not_permitted(format!(
                "the nodown flag is set: {} not marked down ('cairn osd unset nodown' to allow it)",
                ids.iter()
                    .map(|i| format!("osd.{i}"))
                    .collect::<Vec<_>>()
                    .join(",")
            )));
        }
        let e = self.next_epoch();
        let mut msgs = Vec::new();
        for id in ids {
            let o = self.osd_mut(*id)?;
            if o.up {
                o.up = false;
                o.down_at = e;
                msgs.push(format!("marked down osd.{id}"));
            } else {
                msgs.push(format!("osd.{id} is already down"));
            }
        }
        Ok(done(msgs.join("; ")))
    }

    /// `osd out` (`is_in` false) and `osd in` (true): an operator's
    /// choice, so it also clears the automatic-out mark.
    fn osd_set_in(&mut self, ids: &[i32], is_in: bool) -> Result<Reply, CommandError> {
        for id in ids {
            self.osd(*id)?;
        }
        let word = if is_in { "in" } else { "out" };
        let mut msgs = Vec::new();
        for id in ids {
            let o = self.osd_mut(*id)?;
            if o.is_in == is_in {
                msgs.push(format!("osd.{id} is already {word}"));
            } else {
                o.is_in = is_in;
                o.auto_out = false;
                msgs.push(format!("marked {word} osd.{id}"));
            }
        }
        Ok(done(msgs.join("; ")))
    }

    fn osd_auto_out(&mut self, id: i32) -> Result<Reply, CommandError> {
        let o = self.osd(id)?.clone();
        if o.up {
            return Err(CommandError::busy(format!(
                "osd.{id} is up; only down OSDs are marked out automatically"
            )));
        }
        if self.flags.contains(&OsdFlag::NoOut) {
            return Err(CommandError::not_permitted(format!(
                "the noout flag is set: osd.{id} stays in ('cairn osd unset noout' to allow it)"
            )));
        }
        if !o.is_in {
            return Ok(done(format!("osd.{id} is already out")));
        }
        let osd = self.osd_mut(id)?;
        osd.is_in = false;
        osd.auto_out = true;
        Ok(done(format!(
            "marked out osd.{id} (down longer than mon_osd_down_out_interval)"
        )))
    }

    fn osd_purge(&mut self, id: i32, sure: bool) -> Result<Reply, CommandError> {
        let o = self.osd(id)?.clone();
        if o.up {
            return Err(CommandError::busy(format!(
                "osd.{id} is up; stop its daemon and mark it down ('cairn osd down {id}') before purging"
            )));
        }
        if !sure {
            return Err(CommandError::not_permitted(format!(
                "purging osd.{id} removes it from CRUSH and deletes its key; data still only on it is lost. Pass --yes-i-really-mean-it: 'cairn osd purge {id} --yes-i-really-mean-it'"
            )));
        }
        if self.crush.device_ids().contains(&id) {
            self.crush.remove_device(id).map_err(crush_err)?;
        }
        self.osds.remove(&id);
        self.osd_fullness.remove(&id);
        self.auth.remove(&EntityName::osd(id));
        Ok(done(format!("purged osd.{id}")))
    }
}

/// How a new pool places its data.
struct PoolLayout {
    size: u32,
    min_size: u32,
    crush_rule: i32,
    ec_profile: Option<String>,
    stripe_width: u64,
}

/// Keys `osd pool set` accepts.
pub const POOL_SET_KEYS: &[&str] = &[
    "size",
    "min_size",
    "pg_num",
    "pgp_num",
    "crush_rule",
    "allow_ec_overwrites",
    "bulk",
    "target_size_ratio",
    "quota_max_bytes",
    "quota_max_objects",
];
