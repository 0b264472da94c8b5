//! Striping large data over many objects, like Ceph's file layout: data is
//! cut into `stripe_unit` blocks dealt round-robin over `stripe_count`
//! objects; once each of them holds `object_size` bytes the next object set
//! starts. Objects are named `<prefix>.<object number as 16 hex digits>`;
//! the logical size is kept in xattr `striper.size` of object 0.

use crate::{ClientError, IoCtx};
use bytes::Bytes;

/// Xattr on object 0 holding the striped size (decimal text).
pub const SIZE_XATTR: &str = "striper.size";
/// Extents written or read in parallel, at most.
const STRIPER_PARALLEL: usize = 16;

/// A layout. `object_size` must be a multiple of `stripe_unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Striper {
    pub object_size: u64,
    pub stripe_unit: u64,
    pub stripe_count: u64,
}

/// A piece of a logical range inside one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub object_no: u64,
    pub object_offset: u64,
    pub len: u64,
    /// Offset of this piece within the caller's buffer.
    pub buffer_offset: u64,
}

impl Striper {
    pub fn new(
        object_size: u64,
        stripe_unit: u64,
        stripe_count: u64,
    ) -> Result<Striper, ClientError> {
        if stripe_unit == 0
            || stripe_count == 0
            || object_size == 0
            || !object_size.is_multiple_of(stripe_unit)
        {
            return Err(ClientError::Invalid(format!(
                "striping needs stripe_unit > 0, stripe_count > 0 and object_size a multiple of stripe_unit (got object_size {object_size}, stripe_unit {stripe_unit}, stripe_count {stripe_count})"
            )));
        }
        Ok(Striper {
            object_size,
            stripe_unit,
            stripe_count,
        })
    }

    /// Splits `[offset, offset+len)` into per-object extents, in buffer order.
    pub fn map_extent(&self, offset: u64, len: u64) -> Vec<Extent> {
        let (su, sc) = (self.stripe_unit, self.stripe_count);
        let units_per_object = self.object_size / su;
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let block = pos / su;
            let in_block = pos % su;
            let stripe = block / sc;
            let stripe_pos = block % sc;
            let object_set = stripe / units_per_object;
            let object_no = object_set * sc + stripe_pos;
            let object_offset = (stripe % units_per_object) * su + in_block;
            let n = (su - in_block).min(end - pos);
            out.push(Extent {
                object_no,
                object_offset,
                len: n,
                buffer_offset: pos - offset,
            });
            pos += n;
        }
        out
    }

    pub fn object_name(prefix: &str, object_no: u64) -> String {
        format!("{prefix}.{object_no:016x}")
    }

    /// Logical size of the striped data `prefix` (0 if never written).
    pub async fn size(&self, io: &IoCtx, prefix: &str) -> Result<u64, ClientError> {
        match io
            .get_xattr(&Self::object_name(prefix, 0), SIZE_XATTR)
            .await
        {
            Ok(v) => String::from_utf8_lossy(&v)
                .parse()
                .map_err(|_| ClientError::Protocol(format!("bad {SIZE_XATTR} on {prefix}"))),
            Err(e)
                if e.is_not_found() || matches!(e.op_error(), Some(cairn_ops::OpError::NoData)) =>
            {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes `data` at logical `offset` of `prefix` (extents in parallel).
    pub async fn write(
        &self,
        io: &IoCtx,
        prefix: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ClientError> {
        let data = Bytes::copy_from_slice(data);
        let mut set = tokio::task::JoinSet::new();
        for e in self.map_extent(offset, data.len() as u64) {
            while set.len() >= STRIPER_PARALLEL {
                if let Some(r) = set.join_next().await {
                    r.map_err(|e| ClientError::Protocol(format!("striper task: {e}")))??;
                }
            }
            let io = io.clone();
            let name = Self::object_name(prefix, e.object_no);
            let piece = data.slice(e.buffer_offset as usize..(e.buffer_offset + e.len) as usize);
            set.spawn(async move { io.write(&name, e.object_offset, piece).await.map(|_| ()) });
        }
        while let Some(r) = set.join_next().await {
            r.map_err(|e| ClientError::Protocol(format!("striper task: {e}")))??;
        }
        let end = offset + data.len() as u64;
        if end > self.size(io, prefix).await? {
            io.set_xattr(
                &Self::object_name(prefix, 0),
                SIZE_XATTR,
                end.to_string().into_bytes(),
            )
            .await?;
        }
        Ok(())
    }

    /// Reads up to `len` bytes at `offset` (short at the logical end; holes read as zeros).
    pub async fn read(
        &self,
        io: &IoCtx,
        prefix: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ClientError> {
        let size = self.size(io, prefix).await?;
        let len = len.min(size.saturating_sub(offset));
        let mut buf = vec![0u8; len as usize];
        let mut set = tokio::task::JoinSet::new();
        let mut extents = self.map_extent(offset, len).into_iter();
        loop {
            while set.len() < STRIPER_PARALLEL {
                let Some(e) = extents.next() else { break };
                let io = io.clone();
                let name = Self::object_name(prefix, e.object_no);
                set.spawn(async move {
                    match io.read(&name, e.object_offset, e.len).await {
                        Ok(d) => Ok((e, d)),
                        Err(err) if err.is_not_found() => Ok((e, Vec::new())),
                        Err(err) => Err(err),
                    }
                });
            }
            let Some(r) = set.join_next().await else {
                break;
            };
            let (e, d) = r.map_err(|e| ClientError::Protocol(format!("striper task: {e}")))??;
            let at = e.buffer_offset as usize;
            buf[at..at + d.len().min(e.len as usize)]
                .copy_from_slice(&d[..d.len().min(e.len as usize)]);
        }
        Ok(buf)
    }

    /// Removes every object of `prefix`.
    pub async fn remove(&self, io: &IoCtx, prefix: &str) -> Result<(), ClientError> {
        let size = self.size(io, prefix).await?;
        let mut objects: Vec<u64> = self
            .map_extent(0, size)
            .iter()
            .map(|e| e.object_no)
            .collect();
        objects.sort_unstable();
        objects.dedup();
        objects.retain(|&o| o != 0);
        for o in objects {
            match io.remove(&Self::object_name(prefix, o)).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        match io.remove(&Self::object_name(prefix, 0)).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn simple_layout() {
        let s = Striper::new(8, 2, 2).unwrap();
        let e = s.map_extent(0, 20);
        let objs: Vec<(u64, u64)> = e.iter().map(|e| (e.object_no, e.object_offset)).collect();
        assert_eq!(
            objs,
            vec![
                (0, 0),
                (1, 0),
                (0, 2),
                (1, 2),
                (0, 4),
                (1, 4),
                (0, 6),
                (1, 6),
                (2, 0),
                (3, 0)
            ]
        );
    }

    proptest! {
        #[test]
        fn extents_tile_the_range_without_overlap(su_k in 1u64..4, units in 1u64..4, sc in 1u64..4, off in 0u64..200, len in 0u64..300) {
            let su = su_k * 4;
            let s = Striper::new(su * units, su, sc).unwrap();
            let ex = s.map_extent(off, len);
            prop_assert_eq!(ex.iter().map(|e| e.len).sum::<u64>(), len);
            let mut seen = std::collections::HashSet::new();
            for e in &ex {
                prop_assert!(e.object_offset + e.len <= s.object_size);
                for i in 0..e.len { prop_assert!(seen.insert((e.object_no, e.object_offset + i))); }
            }
        }
    }
}
