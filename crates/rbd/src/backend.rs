//! [`BlockBackend`] for an open [`Image`], so cairn-nbd can export it.
//! FLUSH writes back the image's write cache ([`crate::cache`]); a FUA
//! write, trim or write-zeroes is durable before its reply. Every
//! connection to one export shares one `Image`, hence one cache, so a
//! flush on any connection covers writes completed on all of them
//! (CAN_MULTI_CONN is safe).

use crate::error::RbdError;
use crate::image::Image;
use bytes::Bytes;
use cairn_client::ClientError;
use cairn_nbd::{BlockBackend, BlockError, BlockResult, BoxFuture};
use cairn_ops::OpError;

fn to_block(e: RbdError) -> BlockError {
    match e {
        RbdError::Invalid(m) => BlockError::Invalid(m),
        RbdError::Client(ClientError::Op {
            error: OpError::NoSpace(m),
            ..
        }) => BlockError::NoSpace(m),
        RbdError::Client(ClientError::Op {
            error: OpError::Access(m),
            ..
        }) => BlockError::NotPermitted(m),
        RbdError::Unsupported(m) => BlockError::NotSupported(m),
        RbdError::ReadOnly(m) => BlockError::NotPermitted(m),
        other => BlockError::Io(other.to_string()),
    }
}

impl BlockBackend for Image {
    fn size_bytes(&self) -> u64 {
        Image::size_bytes(self)
    }
    fn preferred_block_bytes(&self) -> u32 {
        4096
    }
    fn multi_conn_safe(&self) -> bool {
        true
    }
    fn read_only(&self) -> bool {
        self.is_read_only()
    }
    fn read(&self, offset: u64, len: u32) -> BoxFuture<'_, BlockResult<Bytes>> {
        Box::pin(async move {
            Image::read(self, offset, len as u64)
                .await
                .map_err(to_block)
        })
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'_, BlockResult<()>> {
        Box::pin(async move {
            Image::write_fua(self, offset, data, fua)
                .await
                .map_err(to_block)
        })
    }
    fn flush(&self) -> BoxFuture<'_, BlockResult<()>> {
        Box::pin(async move { Image::flush(self).await.map_err(to_block) })
    }
    fn flush_on_disconnect(&self) -> BoxFuture<'_, BlockResult<()>> {
        Box::pin(async move { Image::write_back(self).await.map_err(to_block) })
    }
    fn trim(&self, offset: u64, len: u32, _fua: bool) -> BoxFuture<'_, BlockResult<()>> {
        Box::pin(async move { self.discard(offset, len as u64).await.map_err(to_block) })
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_punch: bool,
        _fua: bool,
    ) -> BoxFuture<'_, BlockResult<()>> {
        Box::pin(async move {
            if may_punch {
                self.discard(offset, len as u64).await
            } else {
                self.write_zeroes_allocated(offset, len as u64).await
            }
            .map_err(to_block)
        })
    }
}
