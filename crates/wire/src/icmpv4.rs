//! ICMPv4 (RFC 792): echo, destination unreachable (incl. fragmentation needed) and time
//! exceeded.

use crate::{be16, checksum, put16, put32, ChecksumCaps, Error, Result};

/// Length of the fixed ICMP header.
pub const HEADER_LEN: usize = 8;

/// Where each header field starts (RFC 792). The four bytes after the checksum mean different
/// things per message type, so each type's fields are named separately. The body (echo data or
/// the quoted datagram) starts at [`HEADER_LEN`].
mod field {
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: usize = 2;
    /// Echo request and reply: 16-bit identifier, then 16-bit sequence number.
    pub const ECHO_IDENT: usize = 4;
    pub const ECHO_SEQ_NO: usize = 6;
    /// Destination unreachable: 16 unused bits, then the 16-bit next-hop MTU (RFC 1191 §4).
    pub const UNREACH_UNUSED: usize = 4;
    pub const NEXT_HOP_MTU: usize = 6;
    /// Time exceeded: 32 unused bits.
    pub const TIME_EXCEEDED_UNUSED: usize = 4;
}

/// The message types this stack handles (RFC 792).
mod msg_type {
    pub const ECHO_REPLY: u8 = 0;
    pub const DST_UNREACHABLE: u8 = 3;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
}

/// Destination-unreachable codes (RFC 792, RFC 1191).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DstUnreachable {
    /// Code 0.
    NetUnreachable,
    /// Code 1.
    HostUnreachable,
    /// Code 2.
    ProtoUnreachable,
    /// Code 3.
    PortUnreachable,
    /// Code 4: fragmentation needed and DF set (carries the next-hop MTU).
    FragRequired,
    /// Any other code.
    Other(u8),
}

impl From<u8> for DstUnreachable {
    fn from(c: u8) -> Self {
        match c {
            0 => Self::NetUnreachable,
            1 => Self::HostUnreachable,
            2 => Self::ProtoUnreachable,
            3 => Self::PortUnreachable,
            4 => Self::FragRequired,
            o => Self::Other(o),
        }
    }
}

impl From<DstUnreachable> for u8 {
    fn from(c: DstUnreachable) -> u8 {
        match c {
            DstUnreachable::NetUnreachable => 0,
            DstUnreachable::HostUnreachable => 1,
            DstUnreachable::ProtoUnreachable => 2,
            DstUnreachable::PortUnreachable => 3,
            DstUnreachable::FragRequired => 4,
            DstUnreachable::Other(o) => o,
        }
    }
}

/// A view of an ICMPv4 message.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer holding at least the 8-byte header.
    pub fn new_checked(buf: T) -> Result<Self> {
        if buf.as_ref().len() < HEADER_LEN {
            return Err(Error::IcmpTruncated);
        }
        Ok(Self { buf })
    }
    /// Message type.
    pub fn msg_type(&self) -> u8 {
        self.buf.as_ref()[field::TYPE]
    }
    /// Message code.
    pub fn code(&self) -> u8 {
        self.buf.as_ref()[field::CODE]
    }
    /// True if the checksum over the whole message verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(self.buf.as_ref()) == 0xffff
    }
}

/// A validated ICMPv4 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv4Repr<'a> {
    /// Type 8.
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Payload echoed back.
        data: &'a [u8],
    },
    /// Type 0.
    EchoReply {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Echoed payload.
        data: &'a [u8],
    },
    /// Type 3.
    DstUnreachable {
        /// Code.
        reason: DstUnreachable,
        /// Next-hop MTU (meaningful for `FragRequired`, RFC 1191).
        next_hop_mtu: u16,
        /// The offending datagram's IP header and first bytes of its payload.
        original: &'a [u8],
    },
    /// Type 11.
    TimeExceeded {
        /// 0 = TTL exceeded in transit, 1 = reassembly time exceeded.
        code: u8,
        /// The offending datagram's IP header and first bytes of its payload.
        original: &'a [u8],
    },
}

impl<'a> Icmpv4Repr<'a> {
    /// Parses a checked message, verifying the checksum if `caps.verify_rx`.
    pub fn parse(p: &Packet<&'a [u8]>, caps: ChecksumCaps) -> Result<Self> {
        if caps.verify_rx && !p.verify_checksum() {
            return Err(Error::IcmpBadChecksum);
        }
        let b: &'a [u8] = p.buf;
        let rest = &b[HEADER_LEN..];
        Ok(match (p.msg_type(), p.code()) {
            (msg_type::ECHO_REQUEST, 0) => Icmpv4Repr::EchoRequest {
                ident: be16(b, field::ECHO_IDENT),
                seq_no: be16(b, field::ECHO_SEQ_NO),
                data: rest,
            },
            (msg_type::ECHO_REPLY, 0) => Icmpv4Repr::EchoReply {
                ident: be16(b, field::ECHO_IDENT),
                seq_no: be16(b, field::ECHO_SEQ_NO),
                data: rest,
            },
            (msg_type::DST_UNREACHABLE, code) => Icmpv4Repr::DstUnreachable {
                reason: code.into(),
                next_hop_mtu: be16(b, field::NEXT_HOP_MTU),
                original: rest,
            },
            (msg_type::TIME_EXCEEDED, code @ 0..=1) => Icmpv4Repr::TimeExceeded {
                code,
                original: rest,
            },
            _ => return Err(Error::IcmpUnsupported),
        })
    }

    /// Bytes needed to emit.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.body().len()
    }

    /// The bytes after the header: echo data, or the quoted original datagram.
    fn body(&self) -> &'a [u8] {
        match *self {
            Icmpv4Repr::EchoRequest { data, .. } | Icmpv4Repr::EchoReply { data, .. } => data,
            Icmpv4Repr::DstUnreachable { original, .. }
            | Icmpv4Repr::TimeExceeded { original, .. } => original,
        }
    }

    /// Writes the message into `buf[..buffer_len()]`.
    pub fn emit(&self, buf: &mut [u8], caps: ChecksumCaps) {
        match *self {
            Icmpv4Repr::EchoRequest { ident, seq_no, .. } => {
                buf[field::TYPE] = msg_type::ECHO_REQUEST;
                buf[field::CODE] = 0;
                put16(buf, field::ECHO_IDENT, ident);
                put16(buf, field::ECHO_SEQ_NO, seq_no);
            }
            Icmpv4Repr::EchoReply { ident, seq_no, .. } => {
                buf[field::TYPE] = msg_type::ECHO_REPLY;
                buf[field::CODE] = 0;
                put16(buf, field::ECHO_IDENT, ident);
                put16(buf, field::ECHO_SEQ_NO, seq_no);
            }
            Icmpv4Repr::DstUnreachable {
                reason,
                next_hop_mtu,
                ..
            } => {
                buf[field::TYPE] = msg_type::DST_UNREACHABLE;
                buf[field::CODE] = reason.into();
                put16(buf, field::UNREACH_UNUSED, 0);
                put16(buf, field::NEXT_HOP_MTU, next_hop_mtu);
            }
            Icmpv4Repr::TimeExceeded { code, .. } => {
                buf[field::TYPE] = msg_type::TIME_EXCEEDED;
                buf[field::CODE] = code;
                put32(buf, field::TIME_EXCEEDED_UNUSED, 0);
            }
        }
        put16(buf, field::CHECKSUM, 0);
        let data = self.body();
        let len = HEADER_LEN + data.len();
        buf[HEADER_LEN..len].copy_from_slice(data);
        if caps.fill_tx {
            let c = checksum::checksum(&buf[..len]);
            put16(buf, field::CHECKSUM, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_round_trip_and_checksum() {
        let r = Icmpv4Repr::EchoRequest {
            ident: 7,
            seq_no: 3,
            data: b"hello",
        };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b, ChecksumCaps::SOFTWARE);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Icmpv4Repr::parse(&p, ChecksumCaps::SOFTWARE).unwrap(), r);
        b[9] ^= 0x40;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Icmpv4Repr::parse(&p, ChecksumCaps::SOFTWARE).unwrap_err(),
            Error::IcmpBadChecksum
        );
        assert_eq!(
            Packet::new_checked(&b[..7]).unwrap_err(),
            Error::IcmpTruncated
        );
    }

    #[test]
    fn frag_needed_carries_mtu() {
        let r = Icmpv4Repr::DstUnreachable {
            reason: DstUnreachable::FragRequired,
            next_hop_mtu: 1400,
            original: &[0x45; 28],
        };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b, ChecksumCaps::SOFTWARE);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Icmpv4Repr::parse(&p, ChecksumCaps::SOFTWARE).unwrap(), r);
    }
}
