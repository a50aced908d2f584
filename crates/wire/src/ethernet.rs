//! Ethernet II framing.

use crate::{be16, put16, Error, Result};
use core::fmt;
use core::str::FromStr;

/// A 48-bit Ethernet MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Self = Self([0xff; 6]);
    /// True for the broadcast address.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }
    /// True for group (multicast or broadcast) addresses.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
    /// True for a unicast address that is not all zero.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast() && self.0 != [0; 6]
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl FromStr for EthernetAddress {
    type Err = &'static str;
    fn from_str(s: &str) -> core::result::Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut n = 0;
        for part in s.split([':', '-']) {
            if n == 6 || part.len() != 2 {
                return Err("MAC address must be six two-digit hex groups");
            }
            out[n] = u8::from_str_radix(part, 16).map_err(|_| "MAC address has a non-hex digit")?;
            n += 1;
        }
        if n != 6 {
            return Err("MAC address must be six two-digit hex groups");
        }
        Ok(Self(out))
    }
}

/// The EtherType field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    /// 0x0800.
    Ipv4,
    /// 0x0806.
    Arp,
    /// Anything else.
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        match v {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            o => EtherType::Unknown(o),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> u16 {
        match v {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Unknown(o) => o,
        }
    }
}

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = 14;

/// Where each header field starts (IEEE 802.3 / Ethernet II). Each address runs up to the start
/// of the next field; the EtherType is 16 bits. The payload starts at [`HEADER_LEN`].
mod field {
    pub const DST: usize = 0;
    pub const SRC: usize = 6;
    pub const ETHERTYPE: usize = 12;
}

/// A view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking it.
    pub fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }
    /// Wraps a buffer, rejecting runts.
    pub fn new_checked(buf: T) -> Result<Self> {
        if buf.as_ref().len() < HEADER_LEN {
            return Err(Error::EthRunt);
        }
        Ok(Self { buf })
    }
    /// Destination MAC.
    pub fn dst(&self) -> EthernetAddress {
        EthernetAddress(
            self.buf.as_ref()[field::DST..field::SRC]
                .try_into()
                .unwrap(),
        )
    }
    /// Source MAC.
    pub fn src(&self) -> EthernetAddress {
        EthernetAddress(
            self.buf.as_ref()[field::SRC..field::ETHERTYPE]
                .try_into()
                .unwrap(),
        )
    }
    /// EtherType.
    pub fn ethertype(&self) -> EtherType {
        be16(self.buf.as_ref(), field::ETHERTYPE).into()
    }
    /// The payload after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..]
    }
    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut()[HEADER_LEN..]
    }
}

/// The parsed Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Source MAC.
    pub src: EthernetAddress,
    /// Destination MAC.
    pub dst: EthernetAddress,
    /// EtherType.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Parses a checked frame.
    pub fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> Result<Self> {
        Ok(Self {
            src: f.src(),
            dst: f.dst(),
            ethertype: f.ethertype(),
        })
    }
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header into the first 14 bytes of `buf` (which must be at least that long).
    pub fn emit(&self, buf: &mut [u8]) {
        buf[field::DST..field::SRC].copy_from_slice(&self.dst.0);
        buf[field::SRC..field::ETHERTYPE].copy_from_slice(&self.src.0);
        put16(buf, field::ETHERTYPE, self.ethertype.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runt_rejected() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                Frame::new_checked(&[0u8; 20][..n]).unwrap_err(),
                Error::EthRunt
            );
        }
    }

    #[test]
    fn round_trip() {
        let r = EthernetRepr {
            src: "02:00:00:00:00:01".parse().unwrap(),
            dst: EthernetAddress::BROADCAST,
            ethertype: EtherType::Arp,
        };
        let mut b = [0u8; 14];
        r.emit(&mut b);
        assert_eq!(
            EthernetRepr::parse(&Frame::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        assert!("02:00:00:00:00".parse::<EthernetAddress>().is_err());
        assert!("02:00:00:00:00:zz".parse::<EthernetAddress>().is_err());
    }
}
