//! ARP for IPv4 over Ethernet (RFC 826).

use crate::{be16, put16, Error, EthernetAddress, Ipv4Address, Result};

/// Size of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;

/// Where each field of an Ethernet/IPv4 ARP packet starts (RFC 826): hardware and protocol types
/// and lengths, the operation, then sender and target addresses (6-byte MAC, 4-byte IPv4).
mod field {
    pub const HTYPE: usize = 0;
    pub const PTYPE: usize = 2;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: usize = 6;
    pub const SHA: usize = 8;
    pub const SPA: usize = 14;
    pub const THA: usize = 18;
    pub const TPA: usize = 24;
}

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOperation {
    /// Who has TPA? (1)
    Request,
    /// SPA is at SHA. (2)
    Reply,
}

/// A view of an ARP packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer, checking that it holds a full Ethernet/IPv4 ARP packet.
    pub fn new_checked(buf: T) -> Result<Self> {
        if buf.as_ref().len() < PACKET_LEN {
            return Err(Error::ArpTruncated);
        }
        Ok(Self { buf })
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// Hardware type.
    pub fn htype(&self) -> u16 {
        be16(self.b(), field::HTYPE)
    }
    /// Protocol type.
    pub fn ptype(&self) -> u16 {
        be16(self.b(), field::PTYPE)
    }
    /// Operation code.
    pub fn oper(&self) -> u16 {
        be16(self.b(), field::OPER)
    }
}

/// A validated Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    /// Request or reply.
    pub operation: ArpOperation,
    /// Sender hardware address.
    pub source_hardware_addr: EthernetAddress,
    /// Sender protocol address.
    pub source_protocol_addr: Ipv4Address,
    /// Target hardware address.
    pub target_hardware_addr: EthernetAddress,
    /// Target protocol address.
    pub target_protocol_addr: Ipv4Address,
}

impl ArpRepr {
    /// Parses and validates a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self> {
        let b = p.b();
        if p.htype() != 1 || p.ptype() != 0x0800 || b[field::HLEN] != 6 || b[field::PLEN] != 4 {
            return Err(Error::ArpUnsupported);
        }
        let operation = match p.oper() {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            _ => return Err(Error::ArpBadOperation),
        };
        let mac = |at: usize| EthernetAddress(b[at..at + 6].try_into().unwrap());
        let ip = |at: usize| Ipv4Address(b[at..at + 4].try_into().unwrap());
        Ok(Self {
            operation,
            source_hardware_addr: mac(field::SHA),
            source_protocol_addr: ip(field::SPA),
            target_hardware_addr: mac(field::THA),
            target_protocol_addr: ip(field::TPA),
        })
    }
    /// Bytes needed to emit.
    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }
    /// Writes the packet into `buf[..28]`.
    pub fn emit(&self, buf: &mut [u8]) {
        put16(buf, field::HTYPE, 1);
        put16(buf, field::PTYPE, 0x0800);
        buf[field::HLEN] = 6;
        buf[field::PLEN] = 4;
        let op = match self.operation {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
        };
        put16(buf, field::OPER, op);
        buf[field::SHA..field::SHA + 6].copy_from_slice(&self.source_hardware_addr.0);
        buf[field::SPA..field::SPA + 4].copy_from_slice(&self.source_protocol_addr.0);
        buf[field::THA..field::THA + 6].copy_from_slice(&self.target_hardware_addr.0);
        buf[field::TPA..field::TPA + 4].copy_from_slice(&self.target_protocol_addr.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let r = ArpRepr {
            operation: ArpOperation::Request,
            source_hardware_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            source_protocol_addr: Ipv4Address::new(10, 0, 0, 1),
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: Ipv4Address::new(10, 0, 0, 2),
        };
        let mut b = [0u8; 28];
        r.emit(&mut b);
        assert_eq!(
            ArpRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        assert_eq!(
            Packet::new_checked(&b[..27]).unwrap_err(),
            Error::ArpTruncated
        );
        let mut bad = b;
        bad[7] = 9;
        assert_eq!(
            ArpRepr::parse(&Packet::new_checked(&bad[..]).unwrap()).unwrap_err(),
            Error::ArpBadOperation
        );
        let mut bad = b;
        bad[1] = 6;
        assert_eq!(
            ArpRepr::parse(&Packet::new_checked(&bad[..]).unwrap()).unwrap_err(),
            Error::ArpUnsupported
        );
    }
}
