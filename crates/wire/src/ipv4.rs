//! IPv4 (RFC 791). Options are validated on input (malformed ones and source routes are
//! rejected, as Linux does by default) and otherwise skipped; none are emitted.

use crate::{be16, checksum, put16, ChecksumCaps, Error, Result};
use core::fmt;
use core::str::FromStr;

/// An IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Ipv4Address(pub [u8; 4]);

impl Ipv4Address {
    /// 0.0.0.0.
    pub const UNSPECIFIED: Self = Self([0; 4]);
    /// 255.255.255.255.
    pub const BROADCAST: Self = Self([255; 4]);
    /// Builds an address from its four octets.
    pub const fn new(a: u8, b: u8, c: u8, d: u8) -> Self {
        Self([a, b, c, d])
    }
    /// The address as a host-order integer.
    pub const fn to_u32(self) -> u32 {
        u32::from_be_bytes(self.0)
    }
    /// Builds from a host-order integer.
    pub const fn from_u32(v: u32) -> Self {
        Self(v.to_be_bytes())
    }
    /// True for 0.0.0.0.
    pub fn is_unspecified(&self) -> bool {
        self.0 == [0; 4]
    }
    /// True for 255.255.255.255.
    pub fn is_broadcast(&self) -> bool {
        self.0 == [255; 4]
    }
    /// True for 224.0.0.0/4.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0xf0 == 0xe0
    }
    /// True for 127.0.0.0/8.
    pub fn is_loopback(&self) -> bool {
        self.0[0] == 127
    }
}

impl From<std::net::Ipv4Addr> for Ipv4Address {
    fn from(a: std::net::Ipv4Addr) -> Self {
        Self(a.octets())
    }
}

impl From<Ipv4Address> for std::net::Ipv4Addr {
    fn from(a: Ipv4Address) -> Self {
        std::net::Ipv4Addr::from(a.0)
    }
}

impl fmt::Display for Ipv4Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{}.{}.{}.{}", b[0], b[1], b[2], b[3])
    }
}

impl FromStr for Ipv4Address {
    type Err = &'static str;
    fn from_str(s: &str) -> core::result::Result<Self, Self::Err> {
        s.parse::<std::net::Ipv4Addr>()
            .map(Into::into)
            .map_err(|_| "not a dotted-quad IPv4 address")
    }
}

/// An interface address with its prefix length, e.g. `10.0.0.2/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    /// The address.
    pub addr: Ipv4Address,
    /// Prefix length, 0..=32.
    pub prefix_len: u8,
}

impl Ipv4Cidr {
    /// Builds a CIDR; `prefix_len` must be at most 32.
    pub fn new(addr: Ipv4Address, prefix_len: u8) -> Self {
        assert!(prefix_len <= 32, "prefix length above 32");
        Self { addr, prefix_len }
    }
    /// The netmask as a host-order integer.
    pub fn mask(&self) -> u32 {
        if self.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix_len)
        }
    }
    /// True if `a` lies in this prefix.
    pub fn contains(&self, a: Ipv4Address) -> bool {
        (a.to_u32() ^ self.addr.to_u32()) & self.mask() == 0
    }
    /// The subnet's directed broadcast address.
    pub fn broadcast(&self) -> Ipv4Address {
        Ipv4Address::from_u32(self.addr.to_u32() | !self.mask())
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = &'static str;
    fn from_str(s: &str) -> core::result::Result<Self, Self::Err> {
        let (a, p) = s
            .split_once('/')
            .ok_or("expected ADDRESS/PREFIX, e.g. 10.0.0.2/24")?;
        let addr: Ipv4Address = a.parse()?;
        let prefix_len: u8 = p.parse().map_err(|_| "prefix length must be 0..32")?;
        if prefix_len > 32 {
            return Err("prefix length must be 0..32");
        }
        Ok(Self { addr, prefix_len })
    }
}

/// The IP protocol number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpProtocol {
    /// 1.
    Icmp,
    /// 6.
    Tcp,
    /// 17.
    Udp,
    /// Anything else.
    Unknown(u8),
}

impl From<u8> for IpProtocol {
    fn from(v: u8) -> Self {
        match v {
            1 => IpProtocol::Icmp,
            6 => IpProtocol::Tcp,
            17 => IpProtocol::Udp,
            o => IpProtocol::Unknown(o),
        }
    }
}

impl From<IpProtocol> for u8 {
    fn from(v: IpProtocol) -> u8 {
        match v {
            IpProtocol::Icmp => 1,
            IpProtocol::Tcp => 6,
            IpProtocol::Udp => 17,
            IpProtocol::Unknown(o) => o,
        }
    }
}

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = 20;
/// Largest IPv4 datagram.
pub const MAX_PACKET: usize = 65535;

/// Where each header field starts (RFC 791 §3.1). Options, when present, follow at
/// [`HEADER_LEN`]; the payload starts at the header length the IHL gives.
mod field {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLG_OFF: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

/// A view of an IPv4 datagram.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking.
    pub fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }

    /// Wraps a buffer after checking version, IHL ≥ 5 and header ≤ total length ≤ buffer.
    /// Bytes beyond the total length (Ethernet padding) are ignored by `payload`.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Ipv4Truncated);
        }
        if b[field::VER_IHL] >> 4 != 4 {
            return Err(Error::Ipv4BadVersion);
        }
        let ihl = (b[field::VER_IHL] & 0xf) as usize;
        if ihl < 5 {
            return Err(Error::Ipv4BadIhl);
        }
        let total = be16(b, field::LENGTH) as usize;
        if ihl * 4 > total {
            return Err(Error::Ipv4HeaderPastTotal);
        }
        if total > b.len() {
            return Err(Error::Ipv4TotalPastFrame);
        }
        Ok(Self { buf })
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        ((self.b()[field::VER_IHL] & 0xf) as usize) * 4
    }
    /// Total length field.
    pub fn total_len(&self) -> usize {
        be16(self.b(), field::LENGTH) as usize
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        be16(self.b(), field::IDENT)
    }
    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        be16(self.b(), field::FLG_OFF) & 0x4000 != 0
    }
    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        be16(self.b(), field::FLG_OFF) & 0x2000 != 0
    }
    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (be16(self.b(), field::FLG_OFF) & 0x1fff) << 3
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b()[field::TTL]
    }
    /// Protocol.
    pub fn protocol(&self) -> IpProtocol {
        self.b()[field::PROTOCOL].into()
    }
    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.b(), field::CHECKSUM)
    }
    /// Source address.
    pub fn src(&self) -> Ipv4Address {
        Ipv4Address(self.b()[field::SRC..field::SRC + 4].try_into().unwrap())
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv4Address {
        Ipv4Address(self.b()[field::DST..field::DST + 4].try_into().unwrap())
    }
    /// True if the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(&self.b()[..self.header_len()]) == 0xffff
    }
    /// The header bytes, options included.
    pub fn header(&self) -> &[u8] {
        &self.b()[..self.header_len()]
    }
    /// The payload (between the header and the total length).
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..self.total_len()]
    }
}

/// IP option types (RFC 791 §3.1).
mod opt {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const RR: u8 = 7;
    pub const TS: u8 = 68;
    pub const LSRR: u8 = 131;
    pub const SSRR: u8 = 137;
    /// Offset of the pointer byte in RR, LSRR, SSRR and timestamp options.
    pub const POINTER: usize = 2;
}

/// Walks the options area (RFC 791 §3.1): every option but EOL and NOP has a length byte of
/// at least 2 that stays inside the header; route and timestamp options carry a pointer of
/// at least 4 (5 for timestamps). Source-route options (LSRR, SSRR) are refused: a host
/// that accepted them would answer along a route an attacker chose, and Linux drops them
/// unless `accept_source_route` is set (RFC 1122 §3.2.1.8 leaves it to the host).
pub fn check_options(mut b: &[u8]) -> Result<()> {
    while let Some(&kind) = b.first() {
        match kind {
            opt::EOL => return Ok(()),
            opt::NOP => {
                b = &b[1..];
                continue;
            }
            _ => {}
        }
        let len = *b.get(1).ok_or(Error::Ipv4BadOptions)? as usize;
        if len < 2 || len > b.len() {
            return Err(Error::Ipv4BadOptions);
        }
        match kind {
            opt::LSRR | opt::SSRR => return Err(Error::Ipv4SourceRoute),
            opt::RR | opt::TS => {
                let min_ptr = if kind == opt::TS { 5 } else { 4 };
                if len <= opt::POINTER || (b[opt::POINTER] as usize) < min_ptr {
                    return Err(Error::Ipv4BadOptions);
                }
            }
            _ => {}
        }
        b = &b[len..];
    }
    Ok(())
}

/// A validated IPv4 header (options are not represented; they are skipped on input and never
/// emitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Address,
    /// Destination address.
    pub dst: Ipv4Address,
    /// Upper-layer protocol.
    pub protocol: IpProtocol,
    /// Payload length in bytes.
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// Type of service / DSCP+ECN byte.
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't fragment.
    pub dont_frag: bool,
    /// More fragments follow.
    pub more_frags: bool,
    /// Fragment offset in bytes (multiple of 8).
    pub frag_offset: u16,
}

impl Ipv4Repr {
    /// A plain unfragmented header.
    pub fn new(
        src: Ipv4Address,
        dst: Ipv4Address,
        protocol: IpProtocol,
        payload_len: usize,
    ) -> Self {
        Self {
            src,
            dst,
            protocol,
            payload_len,
            ttl: 64,
            tos: 0,
            ident: 0,
            dont_frag: true,
            more_frags: false,
            frag_offset: 0,
        }
    }

    /// Validates a checked packet: checksum (per `caps`), options and source address.
    ///
    /// The TTL is not checked: RFC 1122 §3.2.1.7 "A host MUST NOT send a datagram with a
    /// Time-to-Live (TTL) value of zero" is a rule about sending; a datagram that reached
    /// us with TTL 0 or 1 is delivered (a host does not forward, so it never decrements).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>, caps: ChecksumCaps) -> Result<Self> {
        if caps.verify_rx && !p.verify_checksum() {
            return Err(Error::Ipv4BadChecksum);
        }
        check_options(&p.header()[HEADER_LEN..])?;
        // RFC 1122 §3.2.1.3: a source address must not be broadcast or multicast.
        if p.src().is_broadcast() || p.src().is_multicast() {
            return Err(Error::Ipv4BadSource);
        }
        Ok(Self {
            src: p.src(),
            dst: p.dst(),
            protocol: p.protocol(),
            payload_len: p.total_len() - p.header_len(),
            ttl: p.ttl(),
            tos: p.b()[field::TOS],
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            more_frags: p.more_frags(),
            frag_offset: p.frag_offset(),
        })
    }

    /// True if this header describes a fragment (not a whole datagram).
    pub fn is_fragment(&self) -> bool {
        self.more_frags || self.frag_offset != 0
    }

    /// Header length when emitted.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 20-byte header into `buf`, filling the checksum if `caps.fill_tx`.
    pub fn emit(&self, buf: &mut [u8], caps: ChecksumCaps) {
        buf[field::VER_IHL] = 0x45;
        buf[field::TOS] = self.tos;
        put16(buf, field::LENGTH, (HEADER_LEN + self.payload_len) as u16);
        put16(buf, field::IDENT, self.ident);
        let mut fo = (self.frag_offset >> 3) & 0x1fff;
        if self.dont_frag {
            fo |= 0x4000;
        }
        if self.more_frags {
            fo |= 0x2000;
        }
        put16(buf, field::FLG_OFF, fo);
        buf[field::TTL] = self.ttl;
        buf[field::PROTOCOL] = self.protocol.into();
        put16(buf, field::CHECKSUM, 0);
        buf[field::SRC..field::SRC + 4].copy_from_slice(&self.src.0);
        buf[field::DST..field::DST + 4].copy_from_slice(&self.dst.0);
        if caps.fill_tx {
            let c = checksum::checksum(&buf[..HEADER_LEN]);
            put16(buf, field::CHECKSUM, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> [u8; 28] {
        let r = Ipv4Repr::new(
            Ipv4Address::new(10, 0, 0, 1),
            Ipv4Address::new(10, 0, 0, 2),
            IpProtocol::Udp,
            8,
        );
        let mut b = [0u8; 28];
        r.emit(&mut b, ChecksumCaps::SOFTWARE);
        b
    }

    #[test]
    fn round_trip() {
        let b = sample();
        let p = Packet::new_checked(&b[..]).unwrap();
        let r = Ipv4Repr::parse(&p, ChecksumCaps::SOFTWARE).unwrap();
        assert_eq!(r.payload_len, 8);
        assert_eq!(p.payload().len(), 8);
        assert!(!r.is_fragment());
    }

    #[test]
    fn ihl_below_five_rejected() {
        let mut b = sample();
        b[0] = 0x44;
        assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), Error::Ipv4BadIhl);
    }

    #[test]
    fn header_longer_than_total_rejected() {
        let mut b = sample();
        b[0] = 0x46; // 24-byte header
        b[2..4].copy_from_slice(&22u16.to_be_bytes());
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err(),
            Error::Ipv4HeaderPastTotal
        );
    }

    #[test]
    fn total_longer_than_frame_rejected() {
        let b = sample();
        assert_eq!(
            Packet::new_checked(&b[..27]).unwrap_err(),
            Error::Ipv4TotalPastFrame
        );
    }

    #[test]
    fn bad_version_and_checksum_rejected() {
        let mut b = sample();
        b[0] = 0x65;
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err(),
            Error::Ipv4BadVersion
        );
        let mut b = sample();
        b[8] ^= 1;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Ipv4Repr::parse(&p, ChecksumCaps::SOFTWARE).unwrap_err(),
            Error::Ipv4BadChecksum
        );
        assert!(Ipv4Repr::parse(&p, ChecksumCaps::OFFLOADED).is_ok());
    }

    #[test]
    fn options_are_skipped() {
        let mut b = [0u8; 32];
        let r = Ipv4Repr::new(
            Ipv4Address::new(1, 2, 3, 4),
            Ipv4Address::new(5, 6, 7, 8),
            IpProtocol::Udp,
            8,
        );
        r.emit(&mut b[..], ChecksumCaps::OFFLOADED);
        // Rewrite as a 24-byte header with a NOP option and 8 bytes of payload.
        b[0] = 0x46;
        b[2..4].copy_from_slice(&32u16.to_be_bytes());
        b[20..24].copy_from_slice(&[1, 1, 1, 0]);
        b[10..12].copy_from_slice(&[0, 0]);
        let c = checksum::checksum(&b[..24]);
        b[10..12].copy_from_slice(&c.to_be_bytes());
        let p = Packet::new_checked(&b[..]).unwrap();
        let r = Ipv4Repr::parse(&p, ChecksumCaps::SOFTWARE).unwrap();
        assert_eq!(r.payload_len, 8);
        assert_eq!(p.payload().len(), 8);
    }

    /// A datagram whose header carries `opts` (a multiple of 4 bytes), checksum filled.
    fn with_ip_options(opts: &[u8]) -> Vec<u8> {
        let hl = HEADER_LEN + opts.len();
        let mut b = vec![0u8; hl + 8];
        let r = Ipv4Repr::new(
            Ipv4Address::new(1, 2, 3, 4),
            Ipv4Address::new(5, 6, 7, 8),
            IpProtocol::Udp,
            8,
        );
        r.emit(&mut b[..], ChecksumCaps::OFFLOADED);
        b[0] = 0x40 | (hl / 4) as u8;
        b[2..4].copy_from_slice(&((hl + 8) as u16).to_be_bytes());
        b[HEADER_LEN..hl].copy_from_slice(opts);
        let c = checksum::checksum(&b[..hl]);
        b[10..12].copy_from_slice(&c.to_be_bytes());
        b
    }

    fn parse_opts(opts: &[u8]) -> Result<Ipv4Repr> {
        let b = with_ip_options(opts);
        let p = Packet::new_checked(&b[..]).unwrap();
        Ipv4Repr::parse(&p, ChecksumCaps::SOFTWARE)
    }

    #[test]
    fn source_route_options_rejected() {
        // LSRR and SSRR with one hop each, behind a NOP.
        for kind in [131u8, 137] {
            assert_eq!(
                parse_opts(&[1, kind, 7, 4, 9, 9, 9, 9]).unwrap_err(),
                Error::Ipv4SourceRoute
            );
        }
    }

    #[test]
    fn malformed_options_rejected() {
        // Length 0, length 1, length past the header, RR pointer below 4, TS pointer below 5.
        for opts in [
            &[30u8, 0, 0, 0][..],
            &[30, 1, 0, 0],
            &[30, 9, 0, 0],
            &[7, 3, 3, 0],
            &[68, 4, 4, 0],
            &[1, 1, 1, 30],
        ] {
            assert_eq!(
                parse_opts(opts).unwrap_err(),
                Error::Ipv4BadOptions,
                "{opts:?}"
            );
        }
        // Well-formed record route and an unknown option are skipped.
        assert!(parse_opts(&[7, 7, 4, 0, 0, 0, 0, 0]).is_ok());
        assert!(parse_opts(&[30, 4, 0, 0]).is_ok());
        assert!(parse_opts(&[0, 30, 0, 0]).is_ok()); // after EOL nothing is read
    }

    #[test]
    fn ttl_zero_and_one_accepted() {
        // RFC 1122 §3.2.1.7: the TTL rule is about sending.
        for ttl in [0u8, 1] {
            let mut b = sample();
            b[8] = ttl;
            b[10..12].copy_from_slice(&[0, 0]);
            let c = checksum::checksum(&b[..20]);
            b[10..12].copy_from_slice(&c.to_be_bytes());
            let p = Packet::new_checked(&b[..]).unwrap();
            assert_eq!(
                Ipv4Repr::parse(&p, ChecksumCaps::SOFTWARE).unwrap().ttl,
                ttl
            );
        }
    }

    #[test]
    fn cidr() {
        let c: Ipv4Cidr = "10.0.0.2/24".parse().unwrap();
        assert!(c.contains(Ipv4Address::new(10, 0, 0, 99)));
        assert!(!c.contains(Ipv4Address::new(10, 0, 1, 1)));
        assert_eq!(c.broadcast(), Ipv4Address::new(10, 0, 0, 255));
        assert!("10.0.0.2/33".parse::<Ipv4Cidr>().is_err());
        assert!("10.0.0.2".parse::<Ipv4Cidr>().is_err());
    }
}
