//! `cairn.conf`: Ceph's INI shape. Sections `[global]`, `[mon]`, `[osd]`,
//! `[osd.3]`, `[client]`…; `key = value`; `#` and `;` start comments; spaces,
//! underscores and dashes in keys are equivalent (`osd pool default size`
//! == `osd_pool_default_size`). Lookups for an entity search its own section,
//! then its type's section, then `[global]`.
//!
//! The file holds only what a daemon needs to boot; everything else is
//! central config kept by the monitors.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Largest config file we read (it is a boot file, not a database).
pub const CONF_MAX_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: file is {len} bytes, larger than the {CONF_MAX_BYTES}-byte limit for a config file")]
    TooLarge { path: String, len: u64 },
    #[error("{path}:{line}: {reason}")]
    Syntax {
        path: String,
        line: usize,
        reason: String,
    },
}

/// A parsed config file: section name -> normalised key -> value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conf {
    sections: BTreeMap<String, BTreeMap<String, String>>,
}

/// Normalises a key the way Ceph does: spaces and dashes become underscores,
/// runs of separators collapse, surrounding whitespace goes.
pub fn normalize_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.trim().chars() {
        let c = if c == ' ' || c == '-' || c == '\t' {
            '_'
        } else {
            c
        };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    out
}

fn strip_comment(line: &str) -> &str {
    // A comment starts at '#' or ';' outside quotes.
    let mut in_quote = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_quote = !in_quote,
            '#' | ';' if !in_quote => return &line[..i],
            _ => {}
        }
    }
    line
}

impl Conf {
    pub fn new() -> Self {
        Conf::default()
    }

    /// Reads and parses a file, refusing files over [`CONF_MAX_BYTES`].
    pub fn load(path: &Path) -> Result<Conf, ConfError> {
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|source| ConfError::Io {
            path: shown.clone(),
            source,
        })?;
        if meta.len() > CONF_MAX_BYTES as u64 {
            return Err(ConfError::TooLarge {
                path: shown,
                len: meta.len(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfError::Io {
            path: shown.clone(),
            source,
        })?;
        Conf::parse(&shown, &text)
    }

    /// Parses config text; `origin` names the source in error messages.
    pub fn parse(origin: &str, text: &str) -> Result<Conf, ConfError> {
        let mut conf = Conf::new();
        let mut section = String::from("global");
        for (idx, raw) in text.lines().enumerate() {
            let line_no = idx + 1;
            let line = strip_comment(raw).trim();
            if line.is_empty() {
                continue;
            }
            let syntax = |reason: String| ConfError::Syntax {
                path: origin.to_string(),
                line: line_no,
                reason,
            };
            if let Some(rest) = line.strip_prefix('[') {
                let name = rest
                    .strip_suffix(']')
                    .ok_or_else(|| syntax(format!("section header '{line}' lacks a closing ']'")))?
                    .trim();
                if name.is_empty() {
                    return Err(syntax("empty section name '[]'".into()));
                }
                section = name.to_string();
                conf.sections.entry(section.clone()).or_default();
                continue;
            }
            let (key, value) = line.split_once('=').ok_or_else(|| {
                syntax(format!(
                    "expected 'key = value' or '[section]', found '{line}'"
                ))
            })?;
            let key = normalize_key(key);
            if key.is_empty() {
                return Err(syntax("missing key before '='".into()));
            }
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            conf.sections
                .entry(section.clone())
                .or_default()
                .insert(key, value.to_string());
        }
        Ok(conf)
    }

    /// Sets `key` in `section` (creating it), normalising the key.
    pub fn set(&mut self, section: &str, key: &str, value: impl Into<String>) {
        self.sections
            .entry(section.to_string())
            .or_default()
            .insert(normalize_key(key), value.into());
    }

    /// Value of `key` in exactly `section`.
    pub fn get_in(&self, section: &str, key: &str) -> Option<&str> {
        self.sections
            .get(section)
            .and_then(|s| s.get(&normalize_key(key)))
            .map(String::as_str)
    }

    /// Value of `key` for `entity` (e.g. `osd.3`): `[osd.3]`, then `[osd]`,
    /// then `[global]`.
    pub fn get(&self, entity: &str, key: &str) -> Option<&str> {
        let kind = entity.split('.').next().unwrap_or(entity);
        [entity, kind, "global"]
            .iter()
            .find_map(|s| self.get_in(s, key))
    }

    /// Section names in file order-independent sorted order.
    pub fn sections(&self) -> impl Iterator<Item = &str> {
        self.sections.keys().map(String::as_str)
    }

    /// Renders the config back to INI text, `[global]` first.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let order = std::iter::once("global").chain(
            self.sections
                .keys()
                .map(String::as_str)
                .filter(|s| *s != "global"),
        );
        for name in order {
            let Some(keys) = self.sections.get(name) else {
                continue;
            };
            let _ = writeln!(out, "[{name}]");
            for (k, v) in keys {
                let _ = writeln!(out, "{k} = {v}");
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "
# a comment
[global]
fsid = 5afc28eb-61b3-45f1-b441-6f913fd70505
osd pool default size = 2  # Write an object 2 times.
osd pool default min size = 1 ; Allow writing one copy
mon_host = 127.0.0.1:6789

[osd]
osd-memory-target = 1073741824

[osd.3]
osd memory target = 536870912
";

    #[test]
    fn parses_ceph_style_keys() {
        let c = Conf::parse("test", SAMPLE).unwrap();
        assert_eq!(c.get("client.admin", "osd_pool_default_size"), Some("2"));
        assert_eq!(c.get("mon.a", "osd pool default min size"), Some("1"));
        assert_eq!(c.get("osd.1", "osd_memory_target"), Some("1073741824"));
        assert_eq!(c.get("osd.3", "osd_memory_target"), Some("536870912"));
        assert_eq!(c.get("osd.3", "missing"), None);
    }

    #[test]
    fn reports_line_of_syntax_error() {
        let err = Conf::parse("cairn.conf", "[global]\nfsid 1234\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "cairn.conf:2: expected 'key = value' or '[section]', found 'fsid 1234'"
        );
        assert!(Conf::parse("c", "[global\n").is_err());
    }

    #[test]
    fn text_round_trips() {
        let c = Conf::parse("test", SAMPLE).unwrap();
        let again = Conf::parse("again", &c.to_text()).unwrap();
        assert_eq!(c, again);
    }
}
