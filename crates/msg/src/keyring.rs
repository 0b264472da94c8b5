//! Secrets and keyring files (Ceph's keyring shape). Owns parsing, atomic
//! 0600 saving and the world-readable check; not the meaning of caps.

use crate::MsgError;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use cairn_types::EntityName;
use rand::RngCore;
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::Path;
use subtle::ConstantTimeEq;

/// Length of every secret in bytes.
pub const SECRET_LEN: usize = 32;
/// Largest keyring file we read (bounds memory on a wrong path).
pub const KEYRING_MAX_BYTES: u64 = 4 << 20;

/// A 32-byte shared secret. `Debug` never prints the key.
#[derive(Clone)]
pub struct Secret([u8; SECRET_LEN]);

impl Secret {
    /// A fresh random secret from the OS-seeded CSPRNG.
    pub fn generate() -> Secret {
        let mut b = [0u8; SECRET_LEN];
        rand::rngs::OsRng.fill_bytes(&mut b);
        Secret(b)
    }

    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> Secret {
        Secret(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// Standard base64 (44 characters).
    pub fn to_base64(&self) -> String {
        B64.encode(self.0)
    }

    pub fn from_base64(text: &str) -> Result<Secret, MsgError> {
        let text = text.trim();
        let raw = B64.decode(text).map_err(|e| MsgError::BadKey {
            reason: format!("not valid base64 ({e})"),
        })?;
        let bytes: [u8; SECRET_LEN] = raw.as_slice().try_into().map_err(|_| MsgError::BadKey {
            reason: format!(
                "a Cairn key is {SECRET_LEN} bytes ({} base64 characters), this one decodes to {} bytes",
                B64.encode([0u8; SECRET_LEN]).len(),
                raw.len()
            ),
        })?;
        Ok(Secret(bytes))
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        // Do not leave key material in freed memory.
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}
impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// One entity's key and capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyringEntry {
    pub name: EntityName,
    pub secret: Secret,
    /// Service -> capability text, e.g. `"mon" -> "allow *"`.
    pub caps: BTreeMap<String, String>,
}

/// The contents of a keyring file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keyring {
    pub entries: Vec<KeyringEntry>,
}

impl Keyring {
    /// Reads a keyring:
    /// ```text
    /// [client.admin]
    ///     key = <base64>
    ///     caps mon = "allow *"
    /// ```
    pub fn load(path: &Path) -> Result<Keyring, MsgError> {
        let kerr = |reason: String| MsgError::Keyring {
            path: path.to_path_buf(),
            reason,
        };
        let meta = fs::metadata(path).map_err(|e| kerr(format!("cannot read: {e}")))?;
        if meta.len() > KEYRING_MAX_BYTES {
            return Err(kerr(format!(
                "file is {} bytes, larger than the {KEYRING_MAX_BYTES}-byte limit for a keyring; is this the right file?",
                meta.len()
            )));
        }
        let text = fs::read_to_string(path).map_err(|e| kerr(format!("cannot read: {e}")))?;
        Keyring::parse(&text).map_err(kerr)
    }

    /// Parses keyring text; errors name the line.
    pub fn parse(text: &str) -> Result<Keyring, String> {
        let mut entries: Vec<KeyringEntry> = Vec::new();
        let mut current: Option<(EntityName, Option<Secret>, BTreeMap<String, String>)> = None;
        for (idx, raw) in text.lines().enumerate() {
            let lineno = idx + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let name = rest
                    .strip_suffix(']')
                    .ok_or_else(|| format!("line {lineno}: section header without ']'"))?;
                let name: EntityName = name
                    .trim()
                    .parse()
                    .map_err(|e| format!("line {lineno}: {e}"))?;
                if let Some(done) = current.take() {
                    entries.push(finish_entry(done)?);
                }
                if entries.iter().any(|e| e.name == name) {
                    return Err(format!("line {lineno}: entity {name} appears twice"));
                }
                current = Some((name, None, BTreeMap::new()));
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| format!("line {lineno}: expected 'key = value'"))?;
            let (_, secret, caps) = current.as_mut().ok_or_else(|| {
                format!(
                    "line {lineno}: '{}' before any [entity] section",
                    key.trim()
                )
            })?;
            let key = key.trim();
            let value = value.trim();
            if key == "key" {
                *secret =
                    Some(Secret::from_base64(value).map_err(|e| format!("line {lineno}: {e}"))?);
            } else if let Some(service) = key.strip_prefix("caps ") {
                let service = service.trim();
                if service.is_empty() || service.contains(char::is_whitespace) {
                    return Err(format!(
                        "line {lineno}: 'caps' needs one service name, e.g. caps mon = \"allow r\""
                    ));
                }
                caps.insert(service.to_string(), unquote(value).to_string());
            } else {
                return Err(format!(
                    "line {lineno}: unknown field '{key}' (a keyring entry has 'key' and 'caps SERVICE')"
                ));
            }
        }
        if let Some(done) = current.take() {
            entries.push(finish_entry(done)?);
        }
        Ok(Keyring { entries })
    }

    /// Renders the keyring text (the inverse of [`Keyring::parse`]).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for e in &self.entries {
            out.push_str(&format!("[{}]\n\tkey = {}\n", e.name, e.secret.to_base64()));
            for (svc, cap) in &e.caps {
                out.push_str(&format!("\tcaps {svc} = \"{cap}\"\n"));
            }
        }
        out
    }

    /// Writes the keyring with mode 0600 via a temporary file, fsync and
    /// rename, then syncs the directory, so a crash leaves the old or the new
    /// file, never a torn or world-readable one.
    pub fn save(&self, path: &Path) -> Result<(), MsgError> {
        let kerr = |what: &str, e: std::io::Error| MsgError::Keyring {
            path: path.to_path_buf(),
            reason: format!("{what}: {e}"),
        };
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let file_name = path.file_name().ok_or_else(|| MsgError::Keyring {
            path: path.to_path_buf(),
            reason: "path has no file name".into(),
        })?;
        let mut tmp_name = file_name.to_os_string();
        tmp_name.push(format!(
            ".tmp.{}.{:016x}",
            std::process::id(),
            rand::rngs::OsRng.next_u64()
        ));
        let tmp = dir.join(tmp_name);
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let result = (|| {
            let mut f = opts
                .open(&tmp)
                .map_err(|e| kerr("cannot create temporary file", e))?;
            #[cfg(unix)]
            {
                // The mode above is filtered by the umask only downwards, but
                // an existing temp file keeps its old mode: force 0600.
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(fs::Permissions::from_mode(0o600))
                    .map_err(|e| kerr("cannot set mode 0600", e))?;
            }
            f.write_all(self.to_text().as_bytes())
                .map_err(|e| kerr("cannot write", e))?;
            f.sync_all().map_err(|e| kerr("cannot fsync", e))?;
            fs::rename(&tmp, path).map_err(|e| kerr("cannot rename into place", e))?;
            if let Ok(d) = fs::File::open(&dir) {
                d.sync_all()
                    .map_err(|e| kerr("cannot fsync directory", e))?;
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    pub fn get(&self, name: &EntityName) -> Option<&KeyringEntry> {
        self.entries.iter().find(|e| &e.name == name)
    }

    /// True if "others" may read the file (mode & 0o004); false if it cannot
    /// be examined. Feeds the AUTH_INSECURE health check.
    pub fn is_world_readable(path: &Path) -> bool {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::metadata(path)
                .map(|m| m.permissions().mode() & 0o004 != 0)
                .unwrap_or(false)
        }
        #[cfg(not(unix))]
        {
            let _ = path;
            false
        }
    }
}

fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v)
}

fn finish_entry(
    (name, secret, caps): (EntityName, Option<Secret>, BTreeMap<String, String>),
) -> Result<KeyringEntry, String> {
    let secret = secret.ok_or_else(|| format!("[{name}] has no 'key = ...' line"))?;
    Ok(KeyringEntry { name, secret, caps })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Keyring {
        let mut caps = BTreeMap::new();
        caps.insert("mon".to_string(), "allow *".to_string());
        caps.insert("osd".to_string(), "allow rw pool=rbd".to_string());
        Keyring {
            entries: vec![
                KeyringEntry {
                    name: EntityName::client("admin"),
                    secret: Secret::generate(),
                    caps,
                },
                KeyringEntry {
                    name: EntityName::osd(3),
                    secret: Secret::generate(),
                    caps: BTreeMap::new(),
                },
            ],
        }
    }

    #[test]
    fn secret_base64_round_trip_and_debug_redacts() {
        let s = Secret::generate();
        assert_eq!(Secret::from_base64(&s.to_base64()).unwrap(), s);
        assert!(!format!("{s:?}").contains(&s.to_base64()));
        assert!(Secret::from_base64("abc").is_err());
        assert!(Secret::from_base64("aGVsbG8=").is_err());
    }

    #[test]
    fn load_save_round_trip_with_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyring");
        let k = sample();
        k.save(&path).unwrap();
        let back = Keyring::load(&path).unwrap();
        assert_eq!(back, k);
        assert_eq!(
            back.get(&EntityName::client("admin")).unwrap().caps["mon"],
            "allow *"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            assert!(!Keyring::is_world_readable(&path));
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
            assert!(Keyring::is_world_readable(&path));
            // Saving again restores 0600.
            k.save(&path).unwrap();
            assert!(!Keyring::is_world_readable(&path));
        }
    }

    #[test]
    fn parses_ceph_shape_and_rejects_garbage() {
        let key = Secret::generate().to_base64();
        let text = format!(
            "# admin\n[client.admin]\n\tkey = {key}\n\tcaps mon = \"allow *\"\n\tcaps osd = allow rw\n"
        );
        let k = Keyring::parse(&text).unwrap();
        assert_eq!(k.entries.len(), 1);
        assert_eq!(k.entries[0].caps["osd"], "allow rw");
        assert!(Keyring::parse("key = x").unwrap_err().contains("line 1"));
        assert!(Keyring::parse("[client.a]\n")
            .unwrap_err()
            .contains("no 'key"));
        assert!(
            Keyring::parse(&format!("[client.a]\nkey = {key}\nauid = 3\n"))
                .unwrap_err()
                .contains("unknown field")
        );
        assert!(Keyring::parse("[bogus.a]\n").is_err());
    }
}
