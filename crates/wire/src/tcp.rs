//! The TCP header and its options (RFC 9293 §3.1, RFC 7323, RFC 2018).

use crate::{be16, be32, checksum, put16, put32, ChecksumCaps, Error, Ipv4Address, Result, SeqNum};
use core::fmt;

/// Length of the TCP header without options.
pub const HEADER_LEN: usize = 20;
/// Longest TCP header (data offset 15).
pub const MAX_HEADER_LEN: usize = 60;
/// Most SACK blocks an option can carry.
pub const MAX_SACK_BLOCKS: usize = 4;

/// TCP control bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u8);

impl Flags {
    /// No more data from sender.
    pub const FIN: Flags = Flags(0x01);
    /// Synchronize sequence numbers.
    pub const SYN: Flags = Flags(0x02);
    /// Reset the connection.
    pub const RST: Flags = Flags(0x04);
    /// Push function.
    pub const PSH: Flags = Flags(0x08);
    /// Acknowledgment field is significant.
    pub const ACK: Flags = Flags(0x10);
    /// Urgent pointer field is significant.
    pub const URG: Flags = Flags(0x20);
    /// ECN echo.
    pub const ECE: Flags = Flags(0x40);
    /// Congestion window reduced.
    pub const CWR: Flags = Flags(0x80);
    /// No flags.
    pub const NONE: Flags = Flags(0);

    /// True if every bit of `other` is set.
    #[inline]
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if any bit of `other` is set.
    #[inline]
    pub fn intersects(self, other: Flags) -> bool {
        self.0 & other.0 != 0
    }
    /// SYN set.
    #[inline]
    pub fn syn(self) -> bool {
        self.contains(Flags::SYN)
    }
    /// FIN set.
    #[inline]
    pub fn fin(self) -> bool {
        self.contains(Flags::FIN)
    }
    /// RST set.
    #[inline]
    pub fn rst(self) -> bool {
        self.contains(Flags::RST)
    }
    /// ACK set.
    #[inline]
    pub fn ack(self) -> bool {
        self.contains(Flags::ACK)
    }
    /// PSH set.
    #[inline]
    pub fn psh(self) -> bool {
        self.contains(Flags::PSH)
    }
}

impl core::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }
}

impl core::ops::BitOrAssign for Flags {
    fn bitor_assign(&mut self, o: Flags) {
        self.0 |= o.0;
    }
}

impl fmt::Debug for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // tcpdump-style letters.
        let names = [
            (Flags::SYN, 'S'),
            (Flags::FIN, 'F'),
            (Flags::RST, 'R'),
            (Flags::PSH, 'P'),
            (Flags::ACK, '.'),
            (Flags::URG, 'U'),
            (Flags::ECE, 'E'),
            (Flags::CWR, 'W'),
        ];
        f.write_str("[")?;
        for (fl, c) in names {
            if self.contains(fl) {
                write!(f, "{c}")?;
            }
        }
        f.write_str("]")
    }
}

/// A SACK block: `[left, right)` in sequence space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SackBlock {
    /// First sequence number of the block.
    pub left: SeqNum,
    /// Sequence number just past the block.
    pub right: SeqNum,
}

/// TCP options this stack understands. Unknown options are skipped by their length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpOptions {
    /// Maximum segment size (kind 2), SYN only.
    pub mss: Option<u16>,
    /// Window scale shift (kind 3), SYN only. Not clamped here; TCP clamps to 14.
    pub window_scale: Option<u8>,
    /// SACK permitted (kind 4), SYN only.
    pub sack_permitted: bool,
    /// Timestamps (kind 8): (TSval, TSecr).
    pub timestamp: Option<(u32, u32)>,
    /// SACK blocks (kind 5); the first `sack_len` entries are valid.
    pub sack: [SackBlock; MAX_SACK_BLOCKS],
    /// Number of valid SACK blocks.
    pub sack_len: u8,
}

mod kind {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WS: u8 = 3;
    pub const SACK_PERM: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TS: u8 = 8;
}

impl TcpOptions {
    /// Parses the options area of a header.
    ///
    /// RFC 9293 §3.1: an option's length counts its kind and length bytes, so a length of 0 or 1
    /// is malformed; an option must not run past the header. Unknown kinds are skipped.
    pub fn parse(mut b: &[u8]) -> Result<Self> {
        let mut o = TcpOptions::default();
        while let Some(&k) = b.first() {
            match k {
                kind::EOL => break,
                kind::NOP => {
                    b = &b[1..];
                    continue;
                }
                _ => {}
            }
            let len = *b.get(1).ok_or(Error::TcpOptionPastHeader)? as usize;
            if len < 2 {
                return Err(Error::TcpOptionBadLength);
            }
            if len > b.len() {
                return Err(Error::TcpOptionPastHeader);
            }
            let body = &b[2..len];
            match k {
                kind::MSS => {
                    if len != 4 {
                        return Err(Error::TcpOptionBadLength);
                    }
                    o.mss = Some(be16(body, 0));
                }
                kind::WS => {
                    if len != 3 {
                        return Err(Error::TcpOptionBadLength);
                    }
                    o.window_scale = Some(body[0]);
                }
                kind::SACK_PERM => {
                    if len != 2 {
                        return Err(Error::TcpOptionBadLength);
                    }
                    o.sack_permitted = true;
                }
                kind::SACK => {
                    let n = body.len() / 8;
                    if !body.len().is_multiple_of(8) || n == 0 || n > MAX_SACK_BLOCKS {
                        return Err(Error::TcpOptionBadLength);
                    }
                    for i in 0..n {
                        o.sack[i] = SackBlock {
                            left: SeqNum(be32(body, i * 8)),
                            right: SeqNum(be32(body, i * 8 + 4)),
                        };
                    }
                    o.sack_len = n as u8;
                }
                kind::TS => {
                    if len != 10 {
                        return Err(Error::TcpOptionBadLength);
                    }
                    o.timestamp = Some((be32(body, 0), be32(body, 4)));
                }
                _ => {}
            }
            b = &b[len..];
        }
        Ok(o)
    }

    /// The SACK blocks carried.
    pub fn sack_blocks(&self) -> &[SackBlock] {
        &self.sack[..self.sack_len as usize]
    }

    /// How many SACK blocks fit beside the other options in 40 bytes.
    fn sack_fit(&self) -> usize {
        let used = self.fixed_len();
        let room = 40usize.saturating_sub(used);
        if room < 12 {
            0
        } else {
            ((room - 4) / 8).min(self.sack_len as usize)
        }
    }

    fn fixed_len(&self) -> usize {
        let mut n = 0;
        if self.mss.is_some() {
            n += 4;
        }
        if self.window_scale.is_some() {
            n += 4;
        }
        if self.sack_permitted {
            n += 4;
        }
        if self.timestamp.is_some() {
            n += 12;
        }
        n
    }

    /// Bytes the options occupy when emitted (a multiple of 4, at most 40). SACK blocks that do
    /// not fit beside the other options are left out, as RFC 2018 §3 allows.
    pub fn buffer_len(&self) -> usize {
        let s = self.sack_fit();
        self.fixed_len() + if s > 0 { 4 + 8 * s } else { 0 }
    }

    /// Writes the options into `buf[..buffer_len()]`, each NOP-padded to a 4-byte boundary.
    pub fn emit(&self, buf: &mut [u8]) {
        let mut i = 0;
        if let Some(mss) = self.mss {
            buf[i] = kind::MSS;
            buf[i + 1] = 4;
            put16(buf, i + 2, mss);
            i += 4;
        }
        if let Some(ws) = self.window_scale {
            buf[i..i + 4].copy_from_slice(&[kind::NOP, kind::WS, 3, ws]);
            i += 4;
        }
        if self.sack_permitted {
            buf[i..i + 4].copy_from_slice(&[kind::NOP, kind::NOP, kind::SACK_PERM, 2]);
            i += 4;
        }
        if let Some((val, ecr)) = self.timestamp {
            buf[i..i + 4].copy_from_slice(&[kind::NOP, kind::NOP, kind::TS, 10]);
            put32(buf, i + 4, val);
            put32(buf, i + 8, ecr);
            i += 12;
        }
        let s = self.sack_fit();
        if s > 0 {
            buf[i..i + 4].copy_from_slice(&[kind::NOP, kind::NOP, kind::SACK, (2 + 8 * s) as u8]);
            i += 4;
            for blk in &self.sack[..s] {
                put32(buf, i, blk.left.0);
                put32(buf, i + 4, blk.right.0);
                i += 8;
            }
        }
    }
}

/// A view of a TCP segment.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps an IP payload, checking the header length and data offset.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::TcpTruncated);
        }
        let doff = (b[12] >> 4) as usize;
        if doff < 5 {
            return Err(Error::TcpBadDataOffset);
        }
        if doff * 4 > b.len() {
            return Err(Error::TcpDataOffsetPastSegment);
        }
        Ok(Self { buf })
    }
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.b(), 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.b(), 2)
    }
    /// Sequence number.
    pub fn seq(&self) -> SeqNum {
        SeqNum(be32(self.b(), 4))
    }
    /// Acknowledgment number.
    pub fn ack(&self) -> SeqNum {
        SeqNum(be32(self.b(), 8))
    }
    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        ((self.b()[12] >> 4) as usize) * 4
    }
    /// Control bits.
    pub fn flags(&self) -> Flags {
        Flags(self.b()[13])
    }
    /// Window field (unscaled).
    pub fn window(&self) -> u16 {
        be16(self.b(), 14)
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.b(), 16)
    }
    /// Urgent pointer.
    pub fn urgent(&self) -> u16 {
        be16(self.b(), 18)
    }
    /// The options area.
    pub fn options(&self) -> &[u8] {
        &self.b()[HEADER_LEN..self.header_len()]
    }
    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
    /// True if the checksum over pseudo-header and segment verifies.
    pub fn verify_checksum(&self, src: Ipv4Address, dst: Ipv4Address) -> bool {
        let mut acc = checksum::Accumulator::new();
        acc.add_sum(checksum::pseudo_header(src, dst, 6, self.b().len() as u32));
        acc.add(self.b());
        acc.finish() == 0
    }
}

/// A validated TCP segment header plus borrowed payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpRepr<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: SeqNum,
    /// Acknowledgment number (meaningful when ACK is set).
    pub ack: SeqNum,
    /// Control bits.
    pub flags: Flags,
    /// Window field as on the wire (unscaled).
    pub window: u16,
    /// Urgent pointer.
    pub urgent: u16,
    /// Options.
    pub options: TcpOptions,
    /// Payload.
    pub payload: &'a [u8],
}

impl<'a> TcpRepr<'a> {
    /// Parses a checked segment: checksum per `caps`, nonzero ports, options, flags.
    pub fn parse(
        p: &Packet<&'a [u8]>,
        src: Ipv4Address,
        dst: Ipv4Address,
        caps: ChecksumCaps,
    ) -> Result<Self> {
        if p.src_port() == 0 || p.dst_port() == 0 {
            return Err(Error::BadPort);
        }
        if caps.verify_rx && !p.verify_checksum(src, dst) {
            return Err(Error::TcpBadChecksum);
        }
        let flags = p.flags();
        // SYN together with RST or FIN is never legitimate (scanners use it); drop it.
        if flags.syn() && (flags.rst() || flags.fin()) {
            return Err(Error::TcpBadFlags);
        }
        let options = TcpOptions::parse(p.options())?;
        let b: &'a [u8] = p.buf;
        Ok(Self {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq: p.seq(),
            ack: p.ack(),
            flags,
            window: p.window(),
            urgent: p.urgent(),
            options,
            payload: &b[p.header_len()..],
        })
    }

    /// Header length including options.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.options.buffer_len()
    }

    /// Header plus payload length.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len()
    }

    /// Sequence space the segment occupies (payload plus one each for SYN and FIN).
    pub fn segment_len(&self) -> usize {
        self.payload.len() + self.flags.syn() as usize + self.flags.fin() as usize
    }

    /// Writes header, options and payload into `buf[..buffer_len()]`, filling the checksum if
    /// `caps.fill_tx`.
    pub fn emit(&self, buf: &mut [u8], src: Ipv4Address, dst: Ipv4Address, caps: ChecksumCaps) {
        let hl = self.header_len();
        let total = hl + self.payload.len();
        put16(buf, 0, self.src_port);
        put16(buf, 2, self.dst_port);
        put32(buf, 4, self.seq.0);
        put32(buf, 8, self.ack.0);
        buf[12] = ((hl / 4) as u8) << 4;
        buf[13] = self.flags.0;
        put16(buf, 14, self.window);
        put16(buf, 16, 0);
        put16(buf, 18, self.urgent);
        self.options.emit(&mut buf[HEADER_LEN..hl]);
        buf[hl..total].copy_from_slice(self.payload);
        if caps.fill_tx {
            let mut acc = checksum::Accumulator::new();
            acc.add_sum(checksum::pseudo_header(src, dst, 6, total as u32));
            acc.add(&buf[..total]);
            put16(buf, 16, acc.finish());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
    const B: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

    fn syn() -> TcpRepr<'static> {
        TcpRepr {
            src_port: 40000,
            dst_port: 80,
            seq: SeqNum(1000),
            ack: SeqNum(0),
            flags: Flags::SYN,
            window: 65535,
            urgent: 0,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                timestamp: Some((1, 0)),
                ..Default::default()
            },
            payload: &[],
        }
    }

    fn bytes(r: &TcpRepr) -> Vec<u8> {
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b, A, B, ChecksumCaps::SOFTWARE);
        b
    }

    fn parse(b: &[u8]) -> Result<TcpRepr<'_>> {
        TcpRepr::parse(&Packet::new_checked(b)?, A, B, ChecksumCaps::OFFLOADED)
    }

    #[test]
    fn syn_round_trip() {
        let r = syn();
        let b = bytes(&r);
        assert_eq!(b.len(), 44);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(TcpRepr::parse(&p, A, B, ChecksumCaps::SOFTWARE).unwrap(), r);
    }

    #[test]
    fn sack_blocks_round_trip_and_fit() {
        let mut r = syn();
        r.flags = Flags::ACK;
        r.options = TcpOptions {
            timestamp: Some((5, 6)),
            sack_len: 4,
            ..Default::default()
        };
        for i in 0..4 {
            r.options.sack[i] = SackBlock {
                left: SeqNum(100 * i as u32),
                right: SeqNum(100 * i as u32 + 50),
            };
        }
        let b = bytes(&r);
        let p = parse(&b).unwrap();
        // With timestamps only three blocks fit in 40 bytes.
        assert_eq!(p.options.sack_blocks(), &r.options.sack[..3]);
        assert_eq!(b.len(), 60);
    }

    #[test]
    fn data_offset_below_five_rejected() {
        let mut b = bytes(&syn());
        b[12] = 4 << 4;
        assert_eq!(parse(&b).unwrap_err(), Error::TcpBadDataOffset);
    }

    #[test]
    fn data_offset_past_segment_rejected() {
        let mut b = bytes(&syn());
        b[12] = 15 << 4;
        assert_eq!(parse(&b).unwrap_err(), Error::TcpDataOffsetPastSegment);
        assert_eq!(parse(&b[..19]).unwrap_err(), Error::TcpTruncated);
    }

    #[test]
    fn option_length_zero_or_one_rejected() {
        for bad in [0u8, 1] {
            let mut b = bytes(&syn());
            b[21] = bad; // MSS option length
            assert_eq!(parse(&b).unwrap_err(), Error::TcpOptionBadLength);
        }
    }

    /// A bare header whose options area is `opts` (padded to a multiple of 4 with EOL).
    fn with_options(opts: &[u8]) -> Vec<u8> {
        let olen = opts.len().div_ceil(4) * 4;
        let mut b = vec![0u8; HEADER_LEN + olen];
        b[0..2].copy_from_slice(&1u16.to_be_bytes());
        b[2..4].copy_from_slice(&2u16.to_be_bytes());
        b[12] = (((HEADER_LEN + olen) / 4) as u8) << 4;
        b[13] = Flags::ACK.0;
        b[HEADER_LEN..HEADER_LEN + opts.len()].copy_from_slice(opts);
        b
    }

    #[test]
    fn option_past_header_rejected() {
        // Unknown kind claiming 10 bytes in a 4-byte options area.
        assert_eq!(
            parse(&with_options(&[30, 10, 0, 0])).unwrap_err(),
            Error::TcpOptionPastHeader
        );
        // A kind byte as the very last header byte, with no room for its length.
        assert_eq!(
            parse(&with_options(&[1, 1, 1, 30])).unwrap_err(),
            Error::TcpOptionPastHeader
        );
        // Timestamp option cut short by the end of the header.
        assert_eq!(
            parse(&with_options(&[1, 1, 8, 10, 0, 0, 0, 0])).unwrap_err(),
            Error::TcpOptionPastHeader
        );
    }

    #[test]
    fn known_option_with_wrong_length_rejected() {
        assert_eq!(
            parse(&with_options(&[2, 3, 0, 1])).unwrap_err(),
            Error::TcpOptionBadLength
        );
        assert_eq!(
            parse(&with_options(&[5, 6, 0, 0, 0, 0, 0, 0])).unwrap_err(),
            Error::TcpOptionBadLength
        );
    }

    #[test]
    fn unknown_option_skipped_by_length() {
        let mut b = bytes(&syn());
        let hl = b.len();
        // Overwrite the window-scale slot (NOP WS 3 7) with an unknown 4-byte option.
        b[24..28].copy_from_slice(&[99, 4, 0xaa, 0xbb]);
        let p = parse(&b[..hl]).unwrap();
        assert_eq!(p.options.window_scale, None);
        assert_eq!(p.options.mss, Some(1460));
    }

    #[test]
    fn syn_with_rst_rejected_and_checksum_checked() {
        let mut r = syn();
        r.flags = Flags::SYN | Flags::RST;
        let b = bytes(&r);
        assert_eq!(parse(&b).unwrap_err(), Error::TcpBadFlags);
        let mut b = bytes(&syn());
        b[30] ^= 0x10;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            TcpRepr::parse(&p, A, B, ChecksumCaps::SOFTWARE).unwrap_err(),
            Error::TcpBadChecksum
        );
    }
}
