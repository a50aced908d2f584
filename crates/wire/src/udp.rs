//! UDP (RFC 768).

use crate::ipv4::IpProtocol;
use crate::{be16, checksum, put16, ChecksumCaps, Error, Ipv4Address, Result};

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

/// Where each header field starts (RFC 768); every field is 16 bits wide. The payload starts at
/// [`HEADER_LEN`].
mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    /// Header plus payload, in bytes.
    pub const LENGTH: usize = 4;
    pub const CHECKSUM: usize = 6;
}

/// A view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps an IP payload, checking the header and that the length field fits it.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::UdpTruncated);
        }
        let len = be16(b, field::LENGTH) as usize;
        if len < HEADER_LEN {
            return Err(Error::UdpBadLength);
        }
        if len > b.len() {
            return Err(Error::UdpLengthPastPayload);
        }
        Ok(Self { buf })
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.b(), field::SRC_PORT)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.b(), field::DST_PORT)
    }
    /// Length field (header + payload).
    pub fn len(&self) -> usize {
        be16(self.b(), field::LENGTH) as usize
    }
    /// True if the datagram carries no payload.
    pub fn is_empty(&self) -> bool {
        self.len() == HEADER_LEN
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.b(), field::CHECKSUM)
    }
    /// The payload, up to the length field.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..self.len()]
    }
    /// True if the checksum is absent (zero, allowed over IPv4) or verifies.
    pub fn verify_checksum(&self, src: Ipv4Address, dst: Ipv4Address) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let mut acc = checksum::Accumulator::new();
        acc.add_sum(checksum::pseudo_header(
            src,
            dst,
            IpProtocol::Udp.into(),
            self.len() as u32,
        ));
        acc.add(&self.b()[..self.len()]);
        acc.finish() == 0
    }
}

/// A validated UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl UdpRepr {
    /// Validates a checked datagram (checksum per `caps`; destination port must be nonzero).
    pub fn parse<T: AsRef<[u8]>>(
        p: &Packet<T>,
        src: Ipv4Address,
        dst: Ipv4Address,
        caps: ChecksumCaps,
    ) -> Result<Self> {
        if p.dst_port() == 0 {
            return Err(Error::BadPort);
        }
        if caps.verify_rx && !p.verify_checksum(src, dst) {
            return Err(Error::UdpBadChecksum);
        }
        Ok(Self {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
        })
    }

    /// Header length.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into `buf[..8]` for a payload already placed at `buf[8..8+payload_len]`
    /// (zero-copy: the payload is never moved), filling the checksum if `caps.fill_tx`.
    pub fn emit_header(
        &self,
        buf: &mut [u8],
        src: Ipv4Address,
        dst: Ipv4Address,
        payload_len: usize,
        caps: ChecksumCaps,
    ) {
        let len = HEADER_LEN + payload_len;
        put16(buf, field::SRC_PORT, self.src_port);
        put16(buf, field::DST_PORT, self.dst_port);
        put16(buf, field::LENGTH, len as u16);
        put16(buf, field::CHECKSUM, 0);
        if caps.fill_tx {
            let mut acc = checksum::Accumulator::new();
            acc.add_sum(checksum::pseudo_header(
                src,
                dst,
                IpProtocol::Udp.into(),
                len as u32,
            ));
            acc.add(&buf[..len]);
            // RFC 768: a computed zero is transmitted as all ones.
            let c = match acc.finish() {
                0 => 0xffff,
                c => c,
            };
            put16(buf, field::CHECKSUM, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
    const B: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

    fn sample() -> Vec<u8> {
        let mut b = vec![0u8; 13];
        b[8..].copy_from_slice(b"hello");
        UdpRepr {
            src_port: 1000,
            dst_port: 2000,
        }
        .emit_header(&mut b, A, B, 5, ChecksumCaps::SOFTWARE);
        b
    }

    #[test]
    fn round_trip() {
        let b = sample();
        let p = Packet::new_checked(&b[..]).unwrap();
        let r = UdpRepr::parse(&p, A, B, ChecksumCaps::SOFTWARE).unwrap();
        assert_eq!((r.src_port, r.dst_port), (1000, 2000));
        assert_eq!(p.payload(), b"hello");
        // Wrong pseudo-header → checksum failure.
        assert_eq!(UdpRepr::parse(&p, B, A, ChecksumCaps::SOFTWARE), Ok(r)); // symmetric sum
        assert_eq!(
            UdpRepr::parse(&p, A, Ipv4Address::new(10, 0, 0, 3), ChecksumCaps::SOFTWARE)
                .unwrap_err(),
            Error::UdpBadChecksum
        );
    }

    #[test]
    fn length_below_eight_rejected() {
        let mut b = sample();
        b[4..6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err(),
            Error::UdpBadLength
        );
    }

    #[test]
    fn length_past_payload_rejected() {
        let mut b = sample();
        b[4..6].copy_from_slice(&14u16.to_be_bytes());
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err(),
            Error::UdpLengthPastPayload
        );
        assert_eq!(
            Packet::new_checked(&b[..7]).unwrap_err(),
            Error::UdpTruncated
        );
    }
}
