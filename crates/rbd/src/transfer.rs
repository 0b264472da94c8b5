//! Whole-image copies: export to a byte stream, import from one, and copy
//! image to image. Streams move one object-size chunk at a time (memory
//! bounded by the object size); all-zero chunks are not written on import,
//! so imported and copied images stay thin. `cp`/`export`/`import` in the
//! CLI call these.

use crate::error::RbdError;
use crate::header::data_object;
use crate::image::{CreateOptions, Rbd};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt};

/// Granularity at which export to a file skips zeros (leaving holes).
pub const SPARSE_BLOCK_BYTES: usize = 4096;

/// Called with (bytes done, bytes total) after each chunk.
pub type Progress<'a> = &'a mut (dyn FnMut(u64, u64) + Send);

fn stream_err(what: &str, e: std::io::Error) -> RbdError {
    RbdError::Stream(format!("{what}: {e}"))
}

impl Rbd {
    /// Writes the whole image (`size_bytes` bytes) to `out`. Reads through a
    /// read-only handle: stop writers first for a consistent copy.
    pub async fn export<W: AsyncWrite + Unpin>(
        &self,
        name: &str,
        out: &mut W,
        progress: Progress<'_>,
    ) -> Result<u64, RbdError> {
        let img = self.open_read_only(name).await?;
        let size = img.size_bytes();
        let chunk = img.object_size_bytes();
        let mut pos = 0u64;
        while pos < size {
            let n = chunk.min(size - pos);
            let data = img.read(pos, n).await?;
            out.write_all(&data)
                .await
                .map_err(|e| stream_err("writing the export stream", e))?;
            pos += n;
            progress(pos, size);
        }
        out.flush()
            .await
            .map_err(|e| stream_err("flushing the export stream", e))?;
        Ok(size)
    }

    /// Writes the whole image into `file` (from offset 0), leaving holes
    /// where the image reads as zeros (4 KiB granularity); the file ends up
    /// exactly `size_bytes` long and is fsynced. Reads without the lock, as
    /// [`Rbd::export`].
    pub async fn export_to_file(
        &self,
        name: &str,
        file: &mut tokio::fs::File,
        progress: Progress<'_>,
    ) -> Result<u64, RbdError> {
        let img = self.open_read_only(name).await?;
        let size = img.size_bytes();
        let chunk = img.object_size_bytes();
        let werr = |e| stream_err("writing the export file", e);
        file.set_len(0).await.map_err(werr)?;
        let mut pos = 0u64;
        while pos < size {
            let n = chunk.min(size - pos);
            let data = img.read(pos, n).await?;
            let mut at = 0usize;
            while at < data.len() {
                let end = (at + SPARSE_BLOCK_BYTES).min(data.len());
                let block = &data[at..end];
                if block.iter().any(|b| *b != 0) {
                    file.seek(std::io::SeekFrom::Start(pos + at as u64))
                        .await
                        .map_err(werr)?;
                    file.write_all(block).await.map_err(werr)?;
                }
                at = end;
            }
            pos += n;
            progress(pos, size);
        }
        file.set_len(size).await.map_err(werr)?;
        file.sync_all().await.map_err(werr)?;
        Ok(size)
    }

    /// Creates image `name` (`opts.size_bytes` long) and fills it from
    /// `input` until EOF. Input longer than the size is an error (the image
    /// is left as written so far); shorter input leaves the rest zero.
    pub async fn import<R: AsyncRead + Unpin>(
        &self,
        name: &str,
        opts: &CreateOptions,
        input: &mut R,
        progress: Progress<'_>,
    ) -> Result<u64, RbdError> {
        self.create(name, opts).await?;
        let img = self.open(name, "client.import", false).await?;
        // Closing flushes: write-back from the first write.
        img.assume_flushing_user();
        let size = img.size_bytes();
        let chunk = img.object_size_bytes() as usize;
        let mut pos = 0u64;
        let mut buf = vec![0u8; chunk];
        let result = async {
            loop {
                let mut filled = 0;
                while filled < chunk {
                    let n = input
                        .read(&mut buf[filled..])
                        .await
                        .map_err(|e| stream_err("reading the import stream", e))?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                if filled == 0 {
                    return Ok(pos);
                }
                if pos + filled as u64 > size {
                    return Err(RbdError::Invalid(format!(
                        "import stream is longer than the image size {size}; give a larger --size"
                    )));
                }
                if buf[..filled].iter().any(|b| *b != 0) {
                    img.write(pos, Bytes::copy_from_slice(&buf[..filled]))
                        .await?;
                }
                pos += filled as u64;
                progress(pos, size);
                if filled < chunk {
                    return Ok(pos);
                }
            }
        }
        .await;
        let closed = img.close().await;
        let n = result?;
        closed?;
        Ok(n)
    }

    /// Copies image `src` to a new image `dst` in the same pool (same size
    /// and object size; data pool `dst_data_pool` or the source's). Only
    /// existing objects are copied, so the copy is as thin as the source.
    pub async fn copy(
        &self,
        src: &str,
        dst: &str,
        dst_data_pool: Option<&str>,
        progress: Progress<'_>,
    ) -> Result<(), RbdError> {
        self.copy_to(src, self, dst, dst_data_pool, progress).await
    }

    /// Like [`Rbd::copy`], into image `dst` of `dst_rbd` (another pool).
    pub async fn copy_to(
        &self,
        src: &str,
        dst_rbd: &Rbd,
        dst: &str,
        dst_data_pool: Option<&str>,
        progress: Progress<'_>,
    ) -> Result<(), RbdError> {
        let from = self.info(src).await?;
        let src_data = self.rados().ioctx(&from.data_pool)?;
        // A new image in another pool keeps its data in its own pool unless
        // told otherwise; in the same pool it follows the source.
        let default_pool = if dst_rbd.pool_name() == self.pool_name() {
            from.data_pool.clone()
        } else {
            dst_rbd.pool_name().to_string()
        };
        let to = dst_rbd
            .create(
                dst,
                &CreateOptions {
                    size_bytes: from.size_bytes,
                    object_size_bytes: Some(from.object_size_bytes),
                    data_pool: Some(dst_data_pool.unwrap_or(&default_pool).to_string()),
                },
            )
            .await?;
        let img = dst_rbd.open(dst, "client.copy", false).await?;
        // Closing flushes: write-back from the first write.
        img.assume_flushing_user();
        let dst_data = dst_rbd.rados().ioctx(&to.data_pool)?;
        let total = from.object_count();
        let result = async {
            for objno in 0..total {
                let oid = data_object(&from.id, objno);
                match src_data.read(&oid, 0, 0).await {
                    Ok(d) if d.iter().any(|b| *b != 0) => {
                        dst_data.write_full(&data_object(&to.id, objno), d).await?;
                    }
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(RbdError::from(e)),
                }
                progress(
                    (objno + 1) * from.object_size_bytes,
                    total * from.object_size_bytes,
                );
            }
            Ok::<(), RbdError>(())
        }
        .await;
        let closed = img.close().await;
        result?;
        closed
    }
}
