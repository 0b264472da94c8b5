//! NBD wire constants and the fixed-size request header, as the NBD
//! protocol document defines them. Pure: no I/O here; `server` does I/O.

/// "NBDMAGIC": first word the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation magic, also prefixes each client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
const REP_FLAG_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;

// NBD_REP_INFO types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_ROTATIONAL: u16 = 1 << 4;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Flags this server understands; anything else gets NBD_EINVAL.
pub const CMD_FLAGS_KNOWN: u16 = CMD_FLAG_FUA | CMD_FLAG_NO_HOLE;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;

// Error values carried in replies (fixed by the protocol, not the host).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Size of a request header on the wire.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Size of a simple reply header on the wire.
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;

/// One transmission-phase request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Why a request header was refused outright (the connection then closes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    BadMagic(u32),
}

impl RequestHeader {
    pub fn parse(b: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, HeaderError> {
        let magic = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if magic != REQUEST_MAGIC {
            return Err(HeaderError::BadMagic(magic));
        }
        Ok(RequestHeader {
            flags: u16::from_be_bytes([b[4], b[5]]),
            kind: u16::from_be_bytes([b[6], b[7]]),
            cookie: u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
            offset: u64::from_be_bytes([b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23]]),
            length: u32::from_be_bytes([b[24], b[25], b[26], b[27]]),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut b = [0u8; REQUEST_HEADER_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// A simple reply header: magic, error, cookie.
pub fn simple_reply_header(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_HEADER_BYTES] {
    let mut b = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// The option-reply header (magic, option, reply type, payload length).
pub fn option_reply_header(option: u32, reply: u32, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..8].copy_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b[8..12].copy_from_slice(&option.to_be_bytes());
    b[12..16].copy_from_slice(&reply.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// Payload of NBD_OPT_INFO / NBD_OPT_GO: export name and requested info types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: Vec<u8>,
    pub requested: Vec<u16>,
}

/// Parses an NBD_OPT_INFO/GO payload; `None` when the lengths disagree.
pub fn parse_info_request(data: &[u8]) -> Option<InfoRequest> {
    let name_len = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?) as usize;
    let name_end = 4usize.checked_add(name_len)?;
    let name = data.get(4..name_end)?.to_vec();
    let count_bytes = data.get(name_end..name_end.checked_add(2)?)?;
    let count = u16::from_be_bytes([count_bytes[0], count_bytes[1]]) as usize;
    let rest = data.get(name_end + 2..)?;
    if rest.len() != count * 2 {
        return None;
    }
    let requested = rest
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Some(InfoRequest { name, requested })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn request_header_round_trips(flags: u16, kind: u16, cookie: u64, offset: u64, length: u32) {
            let h = RequestHeader { flags, kind, cookie, offset, length };
            prop_assert_eq!(RequestHeader::parse(&h.encode()), Ok(h));
        }

        #[test]
        fn info_request_parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse_info_request(&data);
        }

        #[test]
        fn info_request_round_trips(name in proptest::collection::vec(any::<u8>(), 0..40),
                                    req in proptest::collection::vec(any::<u16>(), 0..8)) {
            let mut d = (name.len() as u32).to_be_bytes().to_vec();
            d.extend_from_slice(&name);
            d.extend_from_slice(&(req.len() as u16).to_be_bytes());
            for r in &req { d.extend_from_slice(&r.to_be_bytes()); }
            prop_assert_eq!(parse_info_request(&d), Some(InfoRequest { name: name.clone(), requested: req.clone() }));
            // one byte too many or too few is refused
            let mut longer = d.clone();
            longer.push(0);
            prop_assert_eq!(parse_info_request(&longer), None);
            d.pop();
            prop_assert_eq!(parse_info_request(&d), None);
        }
    }

    #[test]
    fn bad_magic_is_refused() {
        let mut b = RequestHeader {
            flags: 0,
            kind: 0,
            cookie: 1,
            offset: 0,
            length: 0,
        }
        .encode();
        b[0] = 0;
        assert!(matches!(
            RequestHeader::parse(&b),
            Err(HeaderError::BadMagic(_))
        ));
    }
}
