//! The TCP header and its options (RFC 9293 §3.1, RFC 7323, RFC 2018).

use crate::ipv4::IpProtocol;
use crate::{be16, be32, checksum, put16, put32, ChecksumCaps, Error, Ipv4Address, Result, SeqNum};
use core::fmt;

/// Length of the TCP header without options.
pub const HEADER_LEN: usize = 20;
/// Longest TCP header (data offset 15).
pub const MAX_HEADER_LEN: usize = 60;
/// Most SACK blocks an option can carry.
pub const MAX_SACK_BLOCKS: usize = 4;
/// Room for options: everything between the fixed header and the longest header.
const MAX_OPTIONS_LEN: usize = MAX_HEADER_LEN - HEADER_LEN;

/// Where each fixed-header field starts (RFC 9293 §3.1, Figure 1). The width is implied by the
/// read or write at that offset: `be16`/`put16` for 16-bit fields, `be32`/`put32` for 32-bit ones,
/// a plain index for single bytes. The options area starts at [`HEADER_LEN`].
mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const SEQ_NUM: usize = 4;
    pub const ACK_NUM: usize = 8;
    /// Data offset in the high nibble; the low nibble is reserved.
    pub const DATA_OFF: usize = 12;
    /// The eight control bits (CWR ECE URG ACK PSH RST SYN FIN).
    pub const FLAGS: usize = 13;
    pub const WINDOW: usize = 14;
    pub const CHECKSUM: usize = 16;
    pub const URGENT: usize = 18;
}

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
///
/// Two values are equal when their options are: SACK slots past `sack_len` are not compared
/// (found by fuzzing — emitting fewer blocks than held left the rest behind).
#[derive(Debug, Clone, Copy, Eq, Default)]
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

impl PartialEq for TcpOptions {
    fn eq(&self, o: &Self) -> bool {
        self.mss == o.mss
            && self.window_scale == o.window_scale
            && self.sack_permitted == o.sack_permitted
            && self.timestamp == o.timestamp
            && self.sack_blocks() == o.sack_blocks()
    }
}

/// Option kinds (RFC 9293 §3.2, RFC 7323, RFC 2018).
mod kind {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WS: u8 = 3;
    pub const SACK_PERM: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TS: u8 = 8;
}

/// Layout of one option: a kind byte, a length byte counting kind and length themselves, then the
/// body. Offsets into the body are relative to [`option::BODY`].
mod option {
    pub const KIND: usize = 0;
    pub const LENGTH: usize = 1;
    pub const BODY: usize = 2;

    /// MSS (kind 2): the 16-bit segment size.
    pub const MSS_VALUE: usize = 0;
    /// Window scale (kind 3): the shift count.
    pub const WS_SHIFT: usize = 0;
    /// Timestamps (kind 8): TSval then TSecr.
    pub const TS_VAL: usize = 0;
    pub const TS_ECR: usize = 4;
    /// SACK (kind 5): blocks of left edge then right edge.
    pub const SACK_LEFT: usize = 0;
    pub const SACK_RIGHT: usize = 4;
    pub const SACK_BLOCK_LEN: usize = 8;

    /// Total length (kind and length bytes included) of the fixed-size options.
    pub const MSS_LEN: usize = 4;
    pub const WS_LEN: usize = 3;
    pub const SACK_PERM_LEN: usize = 2;
    pub const TS_LEN: usize = 10;

    /// NOPs written before each option on output so that every option ends on a 4-byte
    /// boundary (the layout RFC 7323 Appendix A suggests for timestamps).
    pub const MSS_PAD: usize = 0;
    pub const WS_PAD: usize = 1;
    pub const SACK_PERM_PAD: usize = 2;
    pub const TS_PAD: usize = 2;
    pub const SACK_PAD: usize = 2;
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
            let len = *b.get(option::LENGTH).ok_or(Error::TcpOptionPastHeader)? as usize;
            if len < option::BODY {
                return Err(Error::TcpOptionBadLength);
            }
            if len > b.len() {
                return Err(Error::TcpOptionPastHeader);
            }
            let body = &b[option::BODY..len];
            match k {
                kind::MSS => {
                    if len != option::MSS_LEN {
                        return Err(Error::TcpOptionBadLength);
                    }
                    o.mss = Some(be16(body, option::MSS_VALUE));
                }
                kind::WS => {
                    if len != option::WS_LEN {
                        return Err(Error::TcpOptionBadLength);
                    }
                    o.window_scale = Some(body[option::WS_SHIFT]);
                }
                kind::SACK_PERM => {
                    if len != option::SACK_PERM_LEN {
                        return Err(Error::TcpOptionBadLength);
                    }
                    o.sack_permitted = true;
                }
                kind::SACK => {
                    let n = body.len() / option::SACK_BLOCK_LEN;
                    if !body.len().is_multiple_of(option::SACK_BLOCK_LEN)
                        || n == 0
                        || n > MAX_SACK_BLOCKS
                    {
                        return Err(Error::TcpOptionBadLength);
                    }
                    // A repeated SACK option replaces the earlier one entirely, so no block
                    // of the earlier one lingers past `sack_len` (found by fuzzing: the
                    // representation must not depend on what it replaced).
                    o.sack = [SackBlock::default(); MAX_SACK_BLOCKS];
                    for (i, blk) in body.chunks_exact(option::SACK_BLOCK_LEN).enumerate() {
                        o.sack[i] = SackBlock {
                            left: SeqNum(be32(blk, option::SACK_LEFT)),
                            right: SeqNum(be32(blk, option::SACK_RIGHT)),
                        };
                    }
                    o.sack_len = n as u8;
                }
                kind::TS => {
                    if len != option::TS_LEN {
                        return Err(Error::TcpOptionBadLength);
                    }
                    o.timestamp = Some((be32(body, option::TS_VAL), be32(body, option::TS_ECR)));
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

    /// How many SACK blocks fit beside the other options in the 40-byte options area.
    fn sack_fit(&self) -> usize {
        let room = MAX_OPTIONS_LEN.saturating_sub(self.fixed_len());
        let head = option::SACK_PAD + option::BODY;
        if room < head + option::SACK_BLOCK_LEN {
            0
        } else {
            ((room - head) / option::SACK_BLOCK_LEN).min(self.sack_len as usize)
        }
    }

    /// Bytes the options other than SACK occupy when emitted, padding included.
    fn fixed_len(&self) -> usize {
        let slot = |present: bool, pad: usize, len: usize| if present { pad + len } else { 0 };
        slot(self.mss.is_some(), option::MSS_PAD, option::MSS_LEN)
            + slot(self.window_scale.is_some(), option::WS_PAD, option::WS_LEN)
            + slot(
                self.sack_permitted,
                option::SACK_PERM_PAD,
                option::SACK_PERM_LEN,
            )
            + slot(self.timestamp.is_some(), option::TS_PAD, option::TS_LEN)
    }

    /// Bytes the options occupy when emitted (a multiple of 4, at most 40). SACK blocks that do
    /// not fit beside the other options are left out, as RFC 2018 §3 allows.
    pub fn buffer_len(&self) -> usize {
        let s = self.sack_fit();
        self.fixed_len()
            + if s > 0 {
                option::SACK_PAD + option::BODY + option::SACK_BLOCK_LEN * s
            } else {
                0
            }
    }

    /// Writes the options into `buf[..buffer_len()]`, each NOP-padded to a 4-byte boundary.
    pub fn emit(&self, buf: &mut [u8]) {
        let mut i = 0;
        if let Some(mss) = self.mss {
            let body = emit_option_head(buf, i, option::MSS_PAD, kind::MSS, option::MSS_LEN);
            put16(buf, body + option::MSS_VALUE, mss);
            i += option::MSS_PAD + option::MSS_LEN;
        }
        if let Some(ws) = self.window_scale {
            let body = emit_option_head(buf, i, option::WS_PAD, kind::WS, option::WS_LEN);
            buf[body + option::WS_SHIFT] = ws;
            i += option::WS_PAD + option::WS_LEN;
        }
        if self.sack_permitted {
            emit_option_head(
                buf,
                i,
                option::SACK_PERM_PAD,
                kind::SACK_PERM,
                option::SACK_PERM_LEN,
            );
            i += option::SACK_PERM_PAD + option::SACK_PERM_LEN;
        }
        if let Some((val, ecr)) = self.timestamp {
            let body = emit_option_head(buf, i, option::TS_PAD, kind::TS, option::TS_LEN);
            put32(buf, body + option::TS_VAL, val);
            put32(buf, body + option::TS_ECR, ecr);
            i += option::TS_PAD + option::TS_LEN;
        }
        let s = self.sack_fit();
        if s > 0 {
            let blocks = option::SACK_BLOCK_LEN * s;
            let body =
                emit_option_head(buf, i, option::SACK_PAD, kind::SACK, option::BODY + blocks);
            let out = buf[body..body + blocks].chunks_exact_mut(option::SACK_BLOCK_LEN);
            for (blk, out) in self.sack[..s].iter().zip(out) {
                put32(out, option::SACK_LEFT, blk.left.0);
                put32(out, option::SACK_RIGHT, blk.right.0);
            }
        }
    }
}

/// Writes `pad` NOPs and then an option's kind and length at `buf[at..]`; returns the offset of
/// the option's body.
fn emit_option_head(buf: &mut [u8], at: usize, pad: usize, k: u8, len: usize) -> usize {
    buf[at..at + pad].fill(kind::NOP);
    let opt = at + pad;
    buf[opt + option::KIND] = k;
    buf[opt + option::LENGTH] = len as u8;
    opt + option::BODY
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
        let doff = (b[field::DATA_OFF] >> 4) as usize;
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
        be16(self.b(), field::SRC_PORT)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.b(), field::DST_PORT)
    }
    /// Sequence number.
    pub fn seq(&self) -> SeqNum {
        SeqNum(be32(self.b(), field::SEQ_NUM))
    }
    /// Acknowledgment number.
    pub fn ack(&self) -> SeqNum {
        SeqNum(be32(self.b(), field::ACK_NUM))
    }
    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        ((self.b()[field::DATA_OFF] >> 4) as usize) * 4
    }
    /// Control bits.
    pub fn flags(&self) -> Flags {
        Flags(self.b()[field::FLAGS])
    }
    /// Window field (unscaled).
    pub fn window(&self) -> u16 {
        be16(self.b(), field::WINDOW)
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.b(), field::CHECKSUM)
    }
    /// Urgent pointer.
    pub fn urgent(&self) -> u16 {
        be16(self.b(), field::URGENT)
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
        acc.add_sum(checksum::pseudo_header(
            src,
            dst,
            IpProtocol::Tcp.into(),
            self.b().len() as u32,
        ));
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
    /// Parses a checked segment: checksum per `caps`, nonzero ports, options. Every flag
    /// combination parses: odd ones (SYN+FIN, SYN+RST) are TCP's to answer by state — on a
    /// synchronized connection with a challenge ACK (RFC 9293 §3.10.7.4, RFC 5961 §4).
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
        put16(buf, field::SRC_PORT, self.src_port);
        put16(buf, field::DST_PORT, self.dst_port);
        put32(buf, field::SEQ_NUM, self.seq.0);
        put32(buf, field::ACK_NUM, self.ack.0);
        buf[field::DATA_OFF] = ((hl / 4) as u8) << 4;
        buf[field::FLAGS] = self.flags.0;
        put16(buf, field::WINDOW, self.window);
        put16(buf, field::CHECKSUM, 0);
        put16(buf, field::URGENT, self.urgent);
        self.options.emit(&mut buf[HEADER_LEN..hl]);
        buf[hl..total].copy_from_slice(self.payload);
        if caps.fill_tx {
            let mut acc = checksum::Accumulator::new();
            acc.add_sum(checksum::pseudo_header(
                src,
                dst,
                IpProtocol::Tcp.into(),
                total as u32,
            ));
            acc.add(&buf[..total]);
            put16(buf, field::CHECKSUM, acc.finish());
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

    /// Regression (fuzz `wire_roundtrip`): a second, shorter SACK option left the first
    /// one's extra blocks behind `sack_len`, so the same segment parsed to two different
    /// representations.
    #[test]
    fn repeated_sack_option_replaces_the_first() {
        let two = [5u8, 18, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4];
        let one = [5u8, 10, 0, 0, 0, 9, 0, 0, 0, 10];
        let mut opts = two.to_vec();
        opts.extend_from_slice(&one);
        let (bp, bq) = (with_options(&opts), with_options(&one));
        let p = parse(&bp).unwrap();
        let q = parse(&bq).unwrap();
        assert_eq!(p.options, q.options);
        assert_eq!(p.options.sack_len, 1);
    }

    /// Regression (fuzz `wire_roundtrip`): options holding more SACK blocks than fit beside
    /// the others emit fewer; the result equals the original cut to what fits.
    #[test]
    fn options_compare_only_the_sack_blocks_in_use() {
        let mut a = TcpOptions {
            window_scale: Some(7),
            sack_permitted: true,
            sack_len: 4,
            ..Default::default()
        };
        for (i, b) in a.sack.iter_mut().enumerate() {
            b.left = SeqNum(i as u32 * 10);
            b.right = SeqNum(i as u32 * 10 + 5);
        }
        let mut buf = [0u8; 40];
        a.emit(&mut buf[..a.buffer_len()]);
        let back = TcpOptions::parse(&buf[..a.buffer_len()]).unwrap();
        assert_eq!(back.sack_len, 3);
        let mut cut = a;
        cut.sack_len = 3;
        assert_eq!(back, cut);
        assert_ne!(back, a);
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
    fn odd_flags_parse_and_checksum_checked() {
        for flags in [
            Flags::SYN | Flags::RST,
            Flags::SYN | Flags::FIN,
            Flags(0xff),
        ] {
            let mut r = syn();
            r.flags = flags;
            let b = bytes(&r);
            assert_eq!(parse(&b).unwrap().flags, flags);
        }
        let mut b = bytes(&syn());
        b[30] ^= 0x10;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            TcpRepr::parse(&p, A, B, ChecksumCaps::SOFTWARE).unwrap_err(),
            Error::TcpBadChecksum
        );
    }
}
