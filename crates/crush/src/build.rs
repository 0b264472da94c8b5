//! Builds a map from a short host description (`cairn crush build`):
//! `alecto:hdd=6x5.458,ssd=1x0.91` means host alecto with six 5.458 TiB hdd
//! OSDs and one 0.91 TiB ssd OSD. OSD ids are sequential across hosts.

use crate::error::CrushError;
use crate::map::CrushMap;

/// One host of a `cairn crush build` description.
#[derive(Debug, Clone, PartialEq)]
pub struct HostSpec {
    pub name: String,
    /// (class, count, weight in TiB) groups, in order.
    pub groups: Vec<(String, u32, f64)>,
}

/// Largest number of OSDs one host description may ask for.
const MAX_OSDS_PER_HOST: u32 = 4096;

impl HostSpec {
    /// Parses `NAME:CLASS=COUNTxWEIGHT[,CLASS=COUNTxWEIGHT…]`.
    pub fn parse(spec: &str) -> Result<HostSpec, CrushError> {
        let bad = |why: &str| {
            CrushError::Invalid(format!(
                "host spec '{spec}': {why} (expected NAME:CLASS=COUNTxWEIGHT[,…], e.g. alecto:hdd=6x5.458,ssd=1x0.91)"
            ))
        };
        let (name, rest) = spec.split_once(':').ok_or_else(|| bad("missing ':'"))?;
        crate::map::check_name(name)?;
        let mut groups = Vec::new();
        for g in rest.split(',') {
            let (class, cw) = g.split_once('=').ok_or_else(|| bad("a group lacks '='"))?;
            crate::map::check_name(class)?;
            let (count, weight) = cw.split_once('x').ok_or_else(|| bad("a group lacks 'x'"))?;
            let count: u32 = count.trim().parse().map_err(|_| bad("bad OSD count"))?;
            let weight: f64 = weight.trim().parse().map_err(|_| bad("bad weight"))?;
            if count == 0 || count > MAX_OSDS_PER_HOST {
                return Err(bad("OSD count must be 1..=4096"));
            }
            groups.push((class.to_string(), count, weight));
        }
        Ok(HostSpec {
            name: name.to_string(),
            groups,
        })
    }
}

/// A map with root `default`, the hosts (under one bucket each of type
/// `failure_domain` when that is above host, e.g. one rack per host is not
/// implied — the hosts sit directly under the root), sequential OSD ids and a
/// `replicated_rule` with the given failure domain.
pub fn build_from_hosts(hosts: &[HostSpec], failure_domain: &str) -> Result<CrushMap, CrushError> {
    let mut map = CrushMap::new();
    map.type_id_or_err(failure_domain)?;
    map.add_bucket("default", "root", None)?;
    let mut osd = 0;
    for h in hosts {
        for (class, count, weight) in &h.groups {
            for _ in 0..*count {
                map.add_device(
                    osd,
                    Some(class),
                    *weight,
                    &[("host", &h.name), ("root", "default")],
                )?;
                osd += 1;
            }
        }
    }
    map.add_replicated_rule("replicated_rule", "default", failure_domain, None)?;
    Ok(map)
}
