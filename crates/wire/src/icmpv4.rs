//! ICMPv4 (RFC 792): echo, destination unreachable (incl. fragmentation needed) and time
//! exceeded.

use crate::{be16, checksum, put16, ChecksumCaps, Error, Result};

/// Length of the fixed ICMP header.
pub const HEADER_LEN: usize = 8;

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
        self.buf.as_ref()[0]
    }
    /// Message code.
    pub fn code(&self) -> u8 {
        self.buf.as_ref()[1]
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
            (8, 0) => Icmpv4Repr::EchoRequest {
                ident: be16(b, 4),
                seq_no: be16(b, 6),
                data: rest,
            },
            (0, 0) => Icmpv4Repr::EchoReply {
                ident: be16(b, 4),
                seq_no: be16(b, 6),
                data: rest,
            },
            (3, code) => Icmpv4Repr::DstUnreachable {
                reason: code.into(),
                next_hop_mtu: be16(b, 6),
                original: rest,
            },
            (11, code @ 0..=1) => Icmpv4Repr::TimeExceeded {
                code,
                original: rest,
            },
            _ => return Err(Error::IcmpUnsupported),
        })
    }

    /// Bytes needed to emit.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Icmpv4Repr::EchoRequest { data, .. } | Icmpv4Repr::EchoReply { data, .. } => {
                    data.len()
                }
                Icmpv4Repr::DstUnreachable { original, .. }
                | Icmpv4Repr::TimeExceeded { original, .. } => original.len(),
            }
    }

    /// Writes the message into `buf[..buffer_len()]`.
    pub fn emit(&self, buf: &mut [u8], caps: ChecksumCaps) {
        let (ty, code, w1, w2, data) = match *self {
            Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } => (8, 0, ident, seq_no, data),
            Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => (0, 0, ident, seq_no, data),
            Icmpv4Repr::DstUnreachable {
                reason,
                next_hop_mtu,
                original,
            } => (3, reason.into(), 0, next_hop_mtu, original),
            Icmpv4Repr::TimeExceeded { code, original } => (11, code, 0, 0, original),
        };
        let len = HEADER_LEN + data.len();
        buf[0] = ty;
        buf[1] = code;
        put16(buf, 2, 0);
        put16(buf, 4, w1);
        put16(buf, 6, w2);
        buf[HEADER_LEN..len].copy_from_slice(data);
        if caps.fill_tx {
            let c = checksum::checksum(&buf[..len]);
            put16(buf, 2, c);
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
