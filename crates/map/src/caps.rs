//! Capabilities: parsing cap strings such as `allow r`, `allow rw pool=rbd`,
//! `allow *`, and checking them against what a command needs. This module
//! knows nothing about who the caller is; `ClusterMap::authorize` does.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Services a capability can be granted on.
pub const CAP_SERVICES: &[&str] = &["mon", "osd", "mds", "mgr"];

/// Longest cap text we store (bounds what a command can make us keep).
pub const CAPS_TEXT_MAX_LEN: usize = 1024;

/// A set of permissions: read, write, execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Perms(pub u8);

impl Perms {
    pub const NONE: Perms = Perms(0);
    pub const R: Perms = Perms(1);
    pub const W: Perms = Perms(2);
    pub const X: Perms = Perms(4);
    pub const RW: Perms = Perms(3);
    pub const RX: Perms = Perms(5);
    pub const RWX: Perms = Perms(7);

    pub fn contains(self, other: Perms) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn union(self, other: Perms) -> Perms {
        Perms(self.0 | other.0)
    }
}

impl fmt::Display for Perms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return write!(f, "-");
        }
        for (bit, c) in [(1u8, 'r'), (2, 'w'), (4, 'x')] {
            if self.0 & bit != 0 {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// One `allow …` clause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapGrant {
    pub perms: Perms,
    /// `pool=NAME` (osd caps): the grant covers only this pool.
    pub pool: Option<String>,
    /// `namespace=NS` (osd caps): kept for the OSD side; the mon does not check it.
    pub namespace: Option<String>,
    /// `path=/dir` (mds caps): kept for the MDS side; the mon does not check it.
    pub path: Option<String>,
}

/// The parsed capabilities of one entity on one service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caps {
    pub service: String,
    pub grants: Vec<CapGrant>,
}

/// What a command needs from the caller's capabilities.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapsNeed {
    pub service: String,
    pub perms: Perms,
    /// Set when the need is about one pool (osd caps restricted by `pool=`).
    pub pool: Option<String>,
    /// When set, this entity may run the command whatever its caps say
    /// (an OSD booting itself, reporting its own state).
    pub or_entity: Option<cairn_types::EntityName>,
}

impl CapsNeed {
    pub fn mon(perms: Perms) -> CapsNeed {
        CapsNeed {
            service: "mon".into(),
            perms,
            pool: None,
            or_entity: None,
        }
    }
}

impl fmt::Display for CapsNeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} '{}'", self.service, self.perms)?;
        if let Some(p) = &self.pool {
            write!(f, " on pool '{p}'")?;
        }
        Ok(())
    }
}

/// Why a cap string was refused. Display says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {service} caps '{text}': {reason}")]
pub struct CapsError {
    pub service: String,
    pub text: String,
    pub reason: String,
}

fn parse_perms(tok: &str) -> Option<Perms> {
    if tok == "*" {
        return Some(Perms::RWX);
    }
    if tok.is_empty() {
        return None;
    }
    let mut p = Perms::NONE;
    for c in tok.chars() {
        p = p.union(match c {
            'r' => Perms::R,
            'w' => Perms::W,
            'x' => Perms::X,
            _ => return None,
        });
    }
    Some(p)
}

fn unquote(s: &str) -> &str {
    let s = s.trim();
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner;
        }
    }
    s
}

impl Caps {
    /// Parses the cap text for one service: clauses `allow PERMS [key=value]…`
    /// separated by `,` or `;`. `profile …` and `allow command …` are not
    /// supported yet and are refused with a message saying what to use.
    pub fn parse(service: &str, text: &str) -> Result<Caps, CapsError> {
        let err = |reason: String| CapsError {
            service: service.to_string(),
            text: text.to_string(),
            reason,
        };
        if !CAP_SERVICES.contains(&service) {
            return Err(err(format!(
                "unknown service '{service}' (known: {})",
                CAP_SERVICES.join(", ")
            )));
        }
        if text.len() > CAPS_TEXT_MAX_LEN {
            return Err(err(format!("longer than {CAPS_TEXT_MAX_LEN} characters")));
        }
        let mut grants = Vec::new();
        for clause in text.split([',', ';']) {
            let clause = clause.trim();
            if clause.is_empty() {
                continue;
            }
            grants.push(Self::parse_clause(service, clause).map_err(&err)?);
        }
        if grants.is_empty() {
            return Err(err(
                "no 'allow' clause; write e.g. 'allow r', 'allow rw' or 'allow *'".into(),
            ));
        }
        Ok(Caps {
            service: service.to_string(),
            grants,
        })
    }

    fn parse_clause(service: &str, clause: &str) -> Result<CapGrant, String> {
        let mut words = clause.split_whitespace();
        match words.next() {
            Some("allow") => {}
            Some("profile") => {
                return Err(format!(
                    "'{clause}': capability profiles are not supported yet; grant explicit permissions such as 'allow r', 'allow rw' or 'allow *'"
                ))
            }
            _ => return Err(format!("'{clause}': a clause starts with 'allow'")),
        }
        let mut grant = CapGrant {
            perms: Perms::NONE,
            pool: None,
            namespace: None,
            path: None,
        };
        let mut saw_perms = false;
        for w in words {
            if let Some((k, v)) = w.split_once('=') {
                let v = unquote(v);
                if v.is_empty() {
                    return Err(format!("'{clause}': '{k}=' needs a value"));
                }
                match (service, k) {
                    ("osd", "pool") => grant.pool = Some(v.to_string()),
                    ("osd", "namespace") => grant.namespace = Some(v.to_string()),
                    ("mds", "path") => grant.path = Some(v.to_string()),
                    _ => {
                        return Err(format!(
                            "'{clause}': '{k}=' is not valid in {service} caps (osd caps take pool= and namespace=, mds caps take path=)"
                        ))
                    }
                }
                continue;
            }
            if w == "command" {
                return Err(format!(
                    "'{clause}': 'allow command' is not supported yet; grant 'allow r' for read-only commands or 'allow rw' for changes"
                ));
            }
            match parse_perms(w) {
                Some(p) if !saw_perms => {
                    grant.perms = p;
                    saw_perms = true;
                }
                Some(_) => return Err(format!("'{clause}': permissions given twice")),
                None => {
                    return Err(format!(
                        "'{clause}': '{w}' is not a permission (use r, w, x, rw, rwx or *)"
                    ))
                }
            }
        }
        if !saw_perms {
            if service == "mds" {
                // Ceph's `mds 'allow'` means full access to the file system.
                grant.perms = Perms::RW;
            } else {
                return Err(format!(
                    "'{clause}': no permissions after 'allow' (use r, w, x, rw, rwx or *)"
                ));
            }
        }
        Ok(grant)
    }

    /// True when some clause grants every permission in `need` (and the pool,
    /// when the need names one).
    pub fn allows(&self, need: &CapsNeed) -> bool {
        if self.service != need.service {
            return false;
        }
        self.grants.iter().any(|g| {
            g.perms.contains(need.perms)
                && match (&g.pool, &need.pool) {
                    (None, _) => true,
                    (Some(gp), Some(np)) => gp == np,
                    (Some(_), None) => false,
                }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(service: &str, perms: Perms, pool: Option<&str>) -> CapsNeed {
        CapsNeed {
            service: service.into(),
            perms,
            pool: pool.map(str::to_string),
            or_entity: None,
        }
    }

    #[test]
    fn parses_common_caps() {
        let c = Caps::parse("mon", "allow r").unwrap();
        assert!(c.allows(&need("mon", Perms::R, None)));
        assert!(!c.allows(&need("mon", Perms::W, None)));
        assert!(!c.allows(&need("osd", Perms::R, None)));
        let c = Caps::parse("mon", "allow *").unwrap();
        assert!(c.allows(&need("mon", Perms::RWX, None)));
        let c = Caps::parse("osd", "allow rw pool=rbd").unwrap();
        assert!(c.allows(&need("osd", Perms::RW, Some("rbd"))));
        assert!(!c.allows(&need("osd", Perms::R, Some("other"))));
        assert!(!c.allows(&need("osd", Perms::R, None)));
        let c = Caps::parse("osd", "allow r pool=a, allow rw pool=\"b\"").unwrap();
        assert!(c.allows(&need("osd", Perms::W, Some("b"))));
        assert!(!c.allows(&need("osd", Perms::W, Some("a"))));
        let c = Caps::parse("mds", "allow").unwrap();
        assert!(c.allows(&need("mds", Perms::RW, None)));
    }

    #[test]
    fn refuses_bad_caps_with_reasons() {
        let e = Caps::parse("mon", "allow profile osd").unwrap_err();
        assert!(e.to_string().contains("not a permission"), "{e}");
        let e = Caps::parse("mon", "profile osd").unwrap_err();
        assert!(
            e.to_string().contains("profiles are not supported yet"),
            "{e}"
        );
        assert!(Caps::parse("mon", "").is_err());
        assert!(Caps::parse("mon", "allow").is_err());
        assert!(Caps::parse("mon", "allow q").is_err());
        assert!(Caps::parse("mon", "allow r pool=x").is_err());
        assert!(Caps::parse("mon", "grant r").is_err());
        assert!(Caps::parse("disk", "allow r").is_err());
        assert!(Caps::parse("osd", "allow rw pool=").is_err());
        assert!(Caps::parse("mon", "allow command \"osd ls\"").is_err());
    }
}
