//! The typed parse error shared by all wire formats.

use core::fmt;

/// What was wrong with a packet. The engine counts every variant under a named drop counter
/// (`docs/wire/README.md` §4 has the mapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// Ethernet frame shorter than the 14-byte header.
    EthRunt,
    /// ARP packet shorter than its fixed size.
    ArpTruncated,
    /// ARP for a hardware/protocol pair other than Ethernet/IPv4.
    ArpUnsupported,
    /// ARP operation other than request (1) or reply (2).
    ArpBadOperation,
    /// Buffer shorter than the 20-byte IPv4 header.
    Ipv4Truncated,
    /// IP version field is not 4.
    Ipv4BadVersion,
    /// IHL below 5 (header shorter than 20 bytes).
    Ipv4BadIhl,
    /// Header length (IHL) exceeds the total length field.
    Ipv4HeaderPastTotal,
    /// Total length field exceeds the bytes actually received.
    Ipv4TotalPastFrame,
    /// IPv4 header checksum does not verify.
    Ipv4BadChecksum,
    /// TTL of zero on a received datagram. No longer produced: RFC 1122 §3.2.1.7 makes the
    /// TTL rule one about sending, so a received TTL 0 is accepted.
    Ipv4ZeroTtl,
    /// Malformed IP options (bad length, option past the header, bad pointer).
    Ipv4BadOptions,
    /// Loose or strict source-route option (refused, as Linux does by default).
    Ipv4SourceRoute,
    /// Source address is broadcast or multicast (RFC 1122 §3.2.1.3).
    Ipv4BadSource,
    /// ICMP message shorter than its header.
    IcmpTruncated,
    /// ICMP checksum does not verify.
    IcmpBadChecksum,
    /// ICMP type/code this stack does not handle.
    IcmpUnsupported,
    /// IP payload shorter than the 8-byte UDP header.
    UdpTruncated,
    /// UDP length field below 8.
    UdpBadLength,
    /// UDP length field exceeds the IP payload.
    UdpLengthPastPayload,
    /// UDP checksum does not verify.
    UdpBadChecksum,
    /// IP payload shorter than the 20-byte TCP header.
    TcpTruncated,
    /// TCP data offset below 5.
    TcpBadDataOffset,
    /// TCP data offset points past the end of the segment.
    TcpDataOffsetPastSegment,
    /// TCP option with length 0 or 1, or a known option with the wrong length.
    TcpOptionBadLength,
    /// TCP option running past the end of the header.
    TcpOptionPastHeader,
    /// TCP checksum does not verify.
    TcpBadChecksum,
    /// TCP flag combination that is never valid. No longer produced by the parser: SYN+FIN
    /// and SYN+RST reach TCP, which answers them by state (RFC 9293 §3.10.7, RFC 5961 §4).
    TcpBadFlags,
    /// Zero source/destination port.
    BadPort,
}

/// Result alias for wire operations.
pub type Result<T> = core::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Error::EthRunt => "ethernet frame shorter than 14-byte header",
            Error::ArpTruncated => "ARP packet truncated",
            Error::ArpUnsupported => "ARP hardware/protocol type is not Ethernet/IPv4",
            Error::ArpBadOperation => "ARP operation is neither request nor reply",
            Error::Ipv4Truncated => "IPv4 packet shorter than 20-byte header",
            Error::Ipv4BadVersion => "IP version is not 4",
            Error::Ipv4BadIhl => "IPv4 IHL below 5",
            Error::Ipv4HeaderPastTotal => "IPv4 header length exceeds total length",
            Error::Ipv4TotalPastFrame => "IPv4 total length exceeds received frame",
            Error::Ipv4BadChecksum => "IPv4 header checksum mismatch",
            Error::Ipv4ZeroTtl => "IPv4 TTL is zero",
            Error::Ipv4BadOptions => "IPv4 options malformed",
            Error::Ipv4SourceRoute => "IPv4 source-route option",
            Error::Ipv4BadSource => "IPv4 source is broadcast or multicast",
            Error::IcmpTruncated => "ICMP message truncated",
            Error::IcmpBadChecksum => "ICMP checksum mismatch",
            Error::IcmpUnsupported => "ICMP type/code not supported",
            Error::UdpTruncated => "IP payload too short for UDP header",
            Error::UdpBadLength => "UDP length below 8",
            Error::UdpLengthPastPayload => "UDP length exceeds IP payload",
            Error::UdpBadChecksum => "UDP checksum mismatch",
            Error::TcpTruncated => "IP payload too short for TCP header",
            Error::TcpBadDataOffset => "TCP data offset below 5",
            Error::TcpDataOffsetPastSegment => "TCP data offset past end of segment",
            Error::TcpOptionBadLength => "TCP option has invalid length",
            Error::TcpOptionPastHeader => "TCP option runs past end of header",
            Error::TcpBadChecksum => "TCP checksum mismatch",
            Error::TcpBadFlags => "TCP flag combination invalid",
            Error::BadPort => "port number zero",
        };
        f.write_str(s)
    }
}

impl std::error::Error for Error {}
