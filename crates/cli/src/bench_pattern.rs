//! What `cairn rados bench` writes and how `seq`/`rand` check what they
//! read back: every op's data starts with a header naming the run, the
//! object and the offset, followed by a fixed byte pattern. A read must
//! return exactly that, so data from another object, another offset or
//! another run, short reads and flipped bytes are all caught, at the cost
//! of one comparison per byte (no hashing). Owns the format; the bench
//! loop lives in `cmd_rados`.

use bytes::{Bytes, BytesMut};

/// Format version recorded in the bench metadata (0: written by a cairn
/// that did not stamp its data, which cannot be verified).
pub const PATTERN_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"CAIRNBEN";
/// magic, run id, object number, offset, op size: 8 bytes each.
pub const HEADER_BYTES: usize = 40;

/// The data of one run: the shared pattern and the run's identity.
#[derive(Clone)]
pub struct BenchPattern {
    run_id: u64,
    /// Pattern bytes after the header, for the whole op size.
    body: Bytes,
}

/// FNV-1a of the object prefix: the run's identity in every header.
fn run_id(prefix: &str) -> u64 {
    prefix.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl BenchPattern {
    pub fn new(prefix: &str, op_bytes: u64) -> BenchPattern {
        BenchPattern {
            run_id: run_id(prefix),
            body: Bytes::from((0..op_bytes).map(|i| (i % 251) as u8).collect::<Vec<u8>>()),
        }
    }

    fn header(&self, object: u64, offset: u64) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&self.run_id.to_le_bytes());
        h[16..24].copy_from_slice(&object.to_le_bytes());
        h[24..32].copy_from_slice(&offset.to_le_bytes());
        h[32..40].copy_from_slice(&(self.body.len() as u64).to_le_bytes());
        h
    }

    /// The data of the op at `offset` of object number `object`, built in
    /// `buf` (reused between ops of one writer: only the header changes).
    pub fn fill(&self, buf: &mut BytesMut, object: u64, offset: u64) {
        let n = self.body.len();
        if buf.len() != n {
            buf.clear();
            buf.extend_from_slice(&self.body);
        }
        let h = self.header(object, offset);
        let k = n.min(HEADER_BYTES);
        buf[..k].copy_from_slice(&h[..k]);
    }

    /// The op's data as a new buffer (when a writer's buffer is still held
    /// by the client library).
    pub fn make(&self, object: u64, offset: u64) -> BytesMut {
        let mut b = BytesMut::with_capacity(self.body.len());
        self.fill(&mut b, object, offset);
        b
    }

    /// Checks what a read of the op at `offset` of object `object` got.
    pub fn verify(&self, got: &[u8], object: u64, offset: u64) -> Result<(), String> {
        let n = self.body.len();
        if got.len() != n {
            return Err(format!(
                "read {} bytes at offset {offset}, the bench wrote {n}",
                got.len()
            ));
        }
        let h = self.header(object, offset);
        let k = n.min(HEADER_BYTES);
        if got[..k] != h[..k] {
            let what = if got[..k.min(8)] != h[..k.min(8)] {
                "no bench header"
            } else if got[8..16.min(k)] != h[8..16.min(k)] {
                "the header of another bench run"
            } else {
                "the header of another object or offset"
            };
            return Err(format!("data at offset {offset} has {what}"));
        }
        if got[k..] != self.body[k..] {
            let at = got[k..]
                .iter()
                .zip(&self.body[k..])
                .position(|(a, b)| a != b)
                .unwrap_or(0)
                + k;
            return Err(format!(
                "data at offset {offset} differs from what the bench wrote at byte {at}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_verifies_and_anything_else_does_not() {
        let p = BenchPattern::new("benchmark_data_h_1", 4096);
        let mut buf = BytesMut::new();
        p.fill(&mut buf, 7, 8192);
        let data = buf.clone().freeze();
        p.verify(&data, 7, 8192).unwrap();
        // Another object, offset or run.
        assert!(p
            .verify(&data, 8, 8192)
            .unwrap_err()
            .contains("another object"));
        assert!(p
            .verify(&data, 7, 0)
            .unwrap_err()
            .contains("another object"));
        let other = BenchPattern::new("benchmark_data_h_2", 4096);
        assert!(other
            .verify(&data, 7, 8192)
            .unwrap_err()
            .contains("another bench run"));
        // A flipped byte, a short read, zeros.
        let mut bad = data.to_vec();
        bad[1000] ^= 0x40;
        assert!(p.verify(&bad, 7, 8192).unwrap_err().contains("byte 1000"));
        assert!(p
            .verify(&data[..100], 7, 8192)
            .unwrap_err()
            .contains("read 100 bytes"));
        assert!(p
            .verify(&[0u8; 4096], 7, 8192)
            .unwrap_err()
            .contains("no bench header"));
        // Reusing the buffer changes only the header.
        p.fill(&mut buf, 9, 0);
        p.verify(&buf, 9, 0).unwrap();
        assert_eq!(p.make(9, 0), buf);
    }

    #[test]
    fn ops_smaller_than_the_header_carry_part_of_it() {
        // 16 bytes hold the magic and the run id, not the object or offset.
        let p = BenchPattern::new("x", 16);
        let b = p.make(1, 32);
        p.verify(&b, 1, 32).unwrap();
        p.verify(&b, 2, 48).unwrap();
        assert!(BenchPattern::new("y", 16).verify(&b, 1, 32).is_err());
        let tiny = BenchPattern::new("x", 4);
        assert!(tiny
            .verify(&[0, 0, 0, 0], 1, 0)
            .unwrap_err()
            .contains("no bench header"));
    }
}
