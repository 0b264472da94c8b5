//! Erasure-code profiles: parsing `k=4 m=2 crush-failure-domain=host …`,
//! validation with reasons, and rendering back to key=value form. The
//! coding itself lives in the EC crate; this is only the map's record.

use crate::model::EcProfile;
use std::collections::BTreeMap;

/// Largest k+m we accept.
pub const EC_MAX_CHUNKS: u32 = 32;
/// Plugins and techniques the EC crate implements (Reed–Solomon).
pub const EC_PLUGINS: &[&str] = &["jerasure", "isa"];
pub const EC_TECHNIQUES: &[&str] = &["reed_sol_van", "cauchy"];
/// Stripe unit bounds in bytes.
pub const EC_STRIPE_UNIT_MIN_BYTES: u64 = 4096;
pub const EC_STRIPE_UNIT_MAX_BYTES: u64 = 16 * 1024 * 1024;

const KNOWN_KEYS: &[&str] = &[
    "k",
    "m",
    "crush-failure-domain",
    "crush-device-class",
    "crush-root",
    "stripe_unit",
    "plugin",
    "technique",
];

fn parse_count(key: &str, v: &str) -> Result<u32, String> {
    v.parse::<u32>()
        .map_err(|_| format!("{key}={v} is not a whole number"))
}

fn check_name(key: &str, v: &str) -> Result<String, String> {
    if v.is_empty()
        || v.len() > 64
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "{key}={v}: expected a CRUSH name of 1..=64 letters, digits, '-', '_' or '.'"
        ));
    }
    Ok(v.to_string())
}

impl EcProfile {
    /// Builds a profile from `key=value` pairs. `default_stripe_unit` comes
    /// from `osd_pool_erasure_code_stripe_unit`. Rejects k<1, m<1, k+m>32,
    /// unknown keys and bad values, each with its reason.
    pub fn from_params(
        params: &[(String, String)],
        default_stripe_unit: u64,
    ) -> Result<EcProfile, String> {
        let mut seen = BTreeMap::new();
        for (k, v) in params {
            if !KNOWN_KEYS.contains(&k.as_str()) {
                return Err(format!(
                    "unknown erasure-code profile key '{k}' (known: {})",
                    KNOWN_KEYS.join(", ")
                ));
            }
            if seen.insert(k.as_str(), v.as_str()).is_some() {
                return Err(format!("key '{k}' given twice"));
            }
        }
        let k = match seen.get("k") {
            Some(v) => parse_count("k", v)?,
            None => 2,
        };
        let m = match seen.get("m") {
            Some(v) => parse_count("m", v)?,
            None => 2,
        };
        if k < 1 {
            return Err(format!("k={k}: need at least one data chunk (k >= 1)"));
        }
        if m < 1 {
            return Err(format!(
                "m={m}: need at least one coding chunk (m >= 1); for no redundancy use a replicated pool with size 1"
            ));
        }
        if k + m > EC_MAX_CHUNKS {
            return Err(format!(
                "k+m = {} is more than {EC_MAX_CHUNKS} chunks; lower k or m",
                k + m
            ));
        }
        let stripe_unit = match seen.get("stripe_unit") {
            Some(v) => crate::config::parse_size(v).map_err(|e| format!("stripe_unit: {e}"))?,
            None => default_stripe_unit,
        };
        if !(EC_STRIPE_UNIT_MIN_BYTES..=EC_STRIPE_UNIT_MAX_BYTES).contains(&stripe_unit)
            || stripe_unit % EC_STRIPE_UNIT_MIN_BYTES != 0
        {
            return Err(format!(
                "stripe_unit={stripe_unit}: must be a multiple of {EC_STRIPE_UNIT_MIN_BYTES} bytes between {EC_STRIPE_UNIT_MIN_BYTES} and {EC_STRIPE_UNIT_MAX_BYTES}"
            ));
        }
        let plugin = seen.get("plugin").copied().unwrap_or("jerasure");
        if !EC_PLUGINS.contains(&plugin) {
            return Err(format!(
                "plugin={plugin}: unknown plugin (known: {})",
                EC_PLUGINS.join(", ")
            ));
        }
        let technique = seen.get("technique").copied().unwrap_or("reed_sol_van");
        if !EC_TECHNIQUES.contains(&technique) {
            return Err(format!(
                "technique={technique}: unknown technique (known: {})",
                EC_TECHNIQUES.join(", ")
            ));
        }
        let crush_failure_domain = check_name(
            "crush-failure-domain",
            seen.get("crush-failure-domain").copied().unwrap_or("host"),
        )?;
        let crush_root = check_name(
            "crush-root",
            seen.get("crush-root").copied().unwrap_or("default"),
        )?;
        let crush_device_class = match seen.get("crush-device-class") {
            Some(v) if !v.is_empty() => Some(check_name("crush-device-class", v)?),
            _ => None,
        };
        Ok(EcProfile {
            k,
            m,
            crush_failure_domain,
            crush_device_class,
            crush_root,
            stripe_unit,
            plugin: plugin.to_string(),
            technique: technique.to_string(),
        })
    }

    /// The profile as sorted key=value pairs (what `erasure-code-profile get` prints).
    pub fn to_params(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        out.insert("k".into(), self.k.to_string());
        out.insert("m".into(), self.m.to_string());
        out.insert(
            "crush-failure-domain".into(),
            self.crush_failure_domain.clone(),
        );
        out.insert(
            "crush-device-class".into(),
            self.crush_device_class.clone().unwrap_or_default(),
        );
        out.insert("crush-root".into(), self.crush_root.clone());
        out.insert("stripe_unit".into(), self.stripe_unit.to_string());
        out.insert("plugin".into(), self.plugin.clone());
        out.insert("technique".into(), self.technique.clone());
        out
    }

    /// Ceph's default profile: k=2 m=2, host failure domain.
    pub fn default_profile() -> EcProfile {
        EcProfile {
            k: 2,
            m: 2,
            crush_failure_domain: "host".into(),
            crush_device_class: None,
            crush_root: "default".into(),
            stripe_unit: 4096,
            plugin: "jerasure".into(),
            technique: "reed_sol_van".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &[(&str, &str)]) -> Vec<(String, String)> {
        s.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn accepts_good_profiles() {
        let e = EcProfile::from_params(
            &p(&[
                ("k", "4"),
                ("m", "2"),
                ("crush-failure-domain", "osd"),
                ("stripe_unit", "64K"),
            ]),
            4096,
        )
        .unwrap();
        assert_eq!((e.k, e.m, e.stripe_unit), (4, 2, 65536));
        assert_eq!(e.crush_failure_domain, "osd");
        let back =
            EcProfile::from_params(&e.to_params().into_iter().collect::<Vec<_>>(), 4096).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn rejects_bad_profiles_with_reasons() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("k", "0"), ("m", "2")], "k >= 1"),
            (&[("k", "2"), ("m", "0")], "m >= 1"),
            (&[("k", "30"), ("m", "3")], "more than 32"),
            (
                &[("k", "2"), ("m", "1"), ("size", "3")],
                "unknown erasure-code profile key 'size'",
            ),
            (&[("k", "x")], "not a whole number"),
            (&[("plugin", "lrc")], "unknown plugin"),
            (&[("stripe_unit", "1000")], "multiple of 4096"),
            (&[("k", "2"), ("k", "3")], "given twice"),
            (&[("crush-root", "a b")], "CRUSH name"),
        ];
        for (params, want) in cases {
            let err = EcProfile::from_params(&p(params), 4096).unwrap_err();
            assert!(err.contains(want), "{params:?}: {err}");
        }
    }
}
