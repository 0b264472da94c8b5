//! Versioned binary encoding for everything Cairn puts on the wire or on disk:
//! one version byte, then the postcard encoding of the value. Decoders name
//! the versions they understand and refuse anything else with a clear error;
//! inputs are size-checked before decoding so garbage can never cause a huge
//! allocation.

use serde::{de::DeserializeOwned, Serialize};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("empty buffer: expected a version byte followed by a {what}")]
    Empty { what: &'static str },
    #[error("{what} encoded with format version {found}, this build understands versions {min}..={max}; upgrade Cairn to read it")]
    UnsupportedVersion {
        what: &'static str,
        found: u8,
        min: u8,
        max: u8,
    },
    #[error("{what} is {len} bytes, larger than the limit of {limit} bytes")]
    TooLarge {
        what: &'static str,
        len: usize,
        limit: usize,
    },
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
}

/// Encodes `value` as `[version][postcard bytes]`.
pub fn encode_versioned<T: Serialize>(version: u8, value: &T) -> Vec<u8> {
    let out = vec![version];
    // postcard only fails on serializer errors that our plain data types never raise.
    postcard::to_extend(value, out).expect("postcard encoding of plain data cannot fail")
}

/// Decodes a buffer produced by [`encode_versioned`]. Returns the version
/// found so callers can migrate older formats.
pub fn decode_versioned<T: DeserializeOwned>(
    what: &'static str,
    buf: &[u8],
    min_version: u8,
    max_version: u8,
    limit_bytes: usize,
) -> Result<(u8, T), DecodeError> {
    if buf.len() > limit_bytes {
        return Err(DecodeError::TooLarge {
            what,
            len: buf.len(),
            limit: limit_bytes,
        });
    }
    let (&version, body) = buf.split_first().ok_or(DecodeError::Empty { what })?;
    if version < min_version || version > max_version {
        return Err(DecodeError::UnsupportedVersion {
            what,
            found: version,
            min: min_version,
            max: max_version,
        });
    }
    let value = postcard::from_bytes(body).map_err(|e| DecodeError::Malformed {
        what,
        reason: e.to_string(),
    })?;
    Ok((version, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        a: u64,
        b: String,
        c: Vec<u32>,
    }

    #[test]
    fn round_trip() {
        let s = Sample {
            a: 7,
            b: "x".into(),
            c: vec![1, 2],
        };
        let buf = encode_versioned(2, &s);
        let (v, back): (u8, Sample) = decode_versioned("sample", &buf, 1, 2, 1024).unwrap();
        assert_eq!(v, 2);
        assert_eq!(back, s);
    }

    #[test]
    fn rejects_unknown_version_and_oversize() {
        let buf = encode_versioned(9, &1u32);
        let err = decode_versioned::<u32>("thing", &buf, 1, 2, 1024).unwrap_err();
        assert!(err.to_string().contains("version 9"));
        let err = decode_versioned::<u32>("thing", &buf, 1, 9, 1).unwrap_err();
        assert!(matches!(err, DecodeError::TooLarge { .. }));
        assert!(decode_versioned::<u32>("thing", &[], 1, 9, 1).is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_versioned::<Sample>("sample", &bytes, 0, 255, 4096);
        }
    }
}
