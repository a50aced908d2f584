//! Receive-side scaling: the Toeplitz hash that NICs use to spread flows over queues, and the
//! indirection that turns a hash into a queue.
//!
//! The hash input for IPv4 is the source address, destination address, source port and
//! destination port in packet order (12 bytes; 8 without ports). For every set bit of the
//! input, from the most significant bit of the first byte on, the 32 key bits starting at that
//! bit position are XORed into the result.
//!
//! Two keys are provided: [`MICROSOFT_KEY`], the key of the published RSS verification suite
//! (checked by the tests below against its vectors), and [`SYMMETRIC_KEY`], the 16-bit pattern
//! `0x6d5a` repeated, for which swapping source and destination (both addresses and ports) does
//! not change the hash — so both directions of a flow land on the same queue and the same
//! engine (the property the per-core runtime relies on).
//!
//! [`Toeplitz`] precomputes, for each of the 12 input byte positions, the XOR contribution of
//! all 256 byte values, so hashing a 4-tuple costs 12 table loads.

use crate::ipv4::{self, IpProtocol};
use crate::{ethernet, EtherType, Ipv4Address};

/// Length of an RSS key (bytes), as NICs take it.
pub const KEY_LEN: usize = 40;

/// The key of the published RSS hash verification suite.
pub const MICROSOFT_KEY: [u8; KEY_LEN] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// A key whose 16-bit period makes the hash symmetric in (source, destination).
pub const SYMMETRIC_KEY: [u8; KEY_LEN] = {
    let mut k = [0u8; KEY_LEN];
    let mut i = 0;
    while i < KEY_LEN {
        k[i] = if i % 2 == 0 { 0x6d } else { 0x5a };
        i += 1;
    }
    k
};

/// Entries of the indirection table (as most NICs: 128).
pub const RETA_SIZE: usize = 128;

/// Bytes of hash input for an IPv4 4-tuple.
const INPUT_LEN: usize = 12;

/// The Toeplitz hash of `input` under `key`, bit by bit (the definition; [`Toeplitz`] is the
/// fast form). `input` may be at most `KEY_LEN - 4` bytes long.
pub fn toeplitz(key: &[u8; KEY_LEN], input: &[u8]) -> u32 {
    debug_assert!(input.len() <= KEY_LEN - 4);
    let mut result = 0u32;
    for (i, &byte) in input.iter().enumerate() {
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                result ^= window(key, i * 8 + bit);
            }
        }
    }
    result
}

/// The 32 key bits starting at bit `pos` (most significant first).
fn window(key: &[u8; KEY_LEN], pos: usize) -> u32 {
    let byte = pos / 8;
    let shift = pos % 8;
    let mut w = 0u64;
    for j in 0..5 {
        w = (w << 8) | u64::from(*key.get(byte + j).unwrap_or(&0));
    }
    ((w << shift) >> 8) as u32
}

/// A Toeplitz hasher for IPv4 flows with precomputed per-byte tables.
#[derive(Clone)]
pub struct Toeplitz {
    table: [[u32; 256]; INPUT_LEN],
}

impl core::fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Toeplitz").finish_non_exhaustive()
    }
}

impl Toeplitz {
    /// Precomputes the tables for `key`.
    pub fn new(key: &[u8; KEY_LEN]) -> Self {
        let mut table = [[0u32; 256]; INPUT_LEN];
        for (pos, t) in table.iter_mut().enumerate() {
            for (v, slot) in t.iter_mut().enumerate() {
                let mut h = 0;
                for bit in 0..8 {
                    if v & (0x80 >> bit) != 0 {
                        h ^= window(key, pos * 8 + bit);
                    }
                }
                *slot = h;
            }
        }
        Self { table }
    }

    /// A hasher with the [`SYMMETRIC_KEY`].
    pub fn symmetric() -> Self {
        Self::new(&SYMMETRIC_KEY)
    }

    /// Hash of an IPv4 TCP/UDP 4-tuple (input order: src addr, dst addr, src port, dst port).
    #[inline]
    pub fn hash_v4(&self, src: Ipv4Address, dst: Ipv4Address, sport: u16, dport: u16) -> u32 {
        let mut input = [0u8; INPUT_LEN];
        input[..4].copy_from_slice(&src.0);
        input[4..8].copy_from_slice(&dst.0);
        input[8..10].copy_from_slice(&sport.to_be_bytes());
        input[10..].copy_from_slice(&dport.to_be_bytes());
        self.hash_bytes(&input)
    }

    /// Hash of an IPv4 address pair alone (fragments, protocols without ports).
    #[inline]
    pub fn hash_v4_addrs(&self, src: Ipv4Address, dst: Ipv4Address) -> u32 {
        let mut input = [0u8; 8];
        input[..4].copy_from_slice(&src.0);
        input[4..].copy_from_slice(&dst.0);
        self.hash_bytes(&input)
    }

    #[inline]
    fn hash_bytes(&self, input: &[u8]) -> u32 {
        input
            .iter()
            .zip(&self.table)
            .fold(0, |h, (&b, t)| h ^ t[b as usize])
    }

    /// The flow hash of an Ethernet frame as a NIC computes it: TCP and UDP over IPv4 hash
    /// the 4-tuple (unless the datagram is a fragment, which hashes the address pair, as
    /// every fragment must land with the first); other IPv4 hashes the address pair; frames
    /// that are not IPv4 (ARP) or are too short to parse have no hash (`None`).
    pub fn hash_frame(&self, frame: &[u8]) -> Option<u32> {
        let f = ethernet::Frame::new_checked(frame).ok()?;
        if f.ethertype() != EtherType::Ipv4 {
            return None;
        }
        let ip = ipv4::Packet::new_checked(f.payload()).ok()?;
        let (src, dst) = (ip.src(), ip.dst());
        let fragment = ip.more_frags() || ip.frag_offset() != 0;
        let ported = matches!(ip.protocol(), IpProtocol::Tcp | IpProtocol::Udp);
        let l4 = ip.payload();
        if ported && !fragment && l4.len() >= 4 {
            let sport = u16::from_be_bytes([l4[0], l4[1]]);
            let dport = u16::from_be_bytes([l4[2], l4[3]]);
            Some(self.hash_v4(src, dst, sport, dport))
        } else {
            Some(self.hash_v4_addrs(src, dst))
        }
    }
}

/// The queue a hash selects among `queues`, through a round-robin indirection table of
/// [`RETA_SIZE`] entries (as NICs program it by default): `reta[hash % 128] = entry % queues`.
#[inline]
pub fn queue_of(hash: u32, queues: usize) -> usize {
    if queues <= 1 {
        return 0;
    }
    (hash as usize % RETA_SIZE) % queues
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv4Address {
        s.parse().unwrap()
    }

    /// The published verification suite: (source, source port, destination, destination
    /// port, hash of the address pair, hash of the 4-tuple) under [`MICROSOFT_KEY`].
    const VECTORS: &[(&str, u16, &str, u16, u32, u32)] = &[
        (
            "66.9.149.187",
            2794,
            "161.142.100.80",
            1766,
            0x323e8fc2,
            0x51ccc178,
        ),
        (
            "199.92.111.2",
            14230,
            "65.69.140.83",
            4739,
            0xd718262a,
            0xc626b0ea,
        ),
        (
            "24.19.198.95",
            12898,
            "12.22.207.184",
            38024,
            0xd2d0a5de,
            0x5c2b394a,
        ),
        (
            "38.27.205.30",
            48228,
            "209.142.163.6",
            2217,
            0x82989176,
            0xafc7327f,
        ),
        (
            "153.39.163.191",
            44251,
            "202.188.127.2",
            1303,
            0x5d1809c5,
            0x10e828a2,
        ),
    ];

    #[test]
    fn matches_the_published_verification_vectors() {
        let t = Toeplitz::new(&MICROSOFT_KEY);
        for &(s, sp, d, dp, h2, h4) in VECTORS {
            assert_eq!(t.hash_v4_addrs(a(s), a(d)), h2, "{s} -> {d}");
            assert_eq!(t.hash_v4(a(s), a(d), sp, dp), h4, "{s}:{sp} -> {d}:{dp}");
            // The table form and the bit-by-bit definition agree.
            let mut input = Vec::new();
            input.extend_from_slice(&a(s).0);
            input.extend_from_slice(&a(d).0);
            input.extend_from_slice(&sp.to_be_bytes());
            input.extend_from_slice(&dp.to_be_bytes());
            assert_eq!(toeplitz(&MICROSOFT_KEY, &input), h4);
        }
    }

    #[test]
    fn the_symmetric_key_gives_both_directions_one_hash() {
        let t = Toeplitz::symmetric();
        let mut x = 0x1234_5678_u32;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let (s, d) = (
                Ipv4Address(x.to_be_bytes()),
                Ipv4Address(x.rotate_left(7).to_be_bytes()),
            );
            let (sp, dp) = (x as u16, (x >> 16) as u16);
            assert_eq!(t.hash_v4(s, d, sp, dp), t.hash_v4(d, s, dp, sp));
            assert_eq!(t.hash_v4_addrs(s, d), t.hash_v4_addrs(d, s));
        }
        // The published key is not symmetric: the property is the key's, not the function's.
        let m = Toeplitz::new(&MICROSOFT_KEY);
        let (s, d) = (a("66.9.149.187"), a("161.142.100.80"));
        assert_ne!(m.hash_v4(s, d, 2794, 1766), m.hash_v4(d, s, 1766, 2794));
    }

    #[test]
    fn queues_are_spread_and_in_range() {
        let t = Toeplitz::symmetric();
        let mut counts = [0usize; 4];
        for port in 0..4096u16 {
            let h = t.hash_v4(a("10.0.0.1"), a("10.0.0.2"), 40000 + port, 80);
            counts[queue_of(h, 4)] += 1;
        }
        for c in counts {
            assert!(c > 4096 / 4 / 2, "{counts:?}");
        }
        assert_eq!(queue_of(0xffff_ffff, 1), 0);
        assert_eq!(queue_of(0xffff_ffff, 0), 0);
    }

    #[test]
    fn frames_hash_by_4_tuple_or_address_pair() {
        let t = Toeplitz::symmetric();
        let (s, d) = (a("10.1.0.1"), a("10.1.0.2"));
        let mut frame = vec![0u8; 14 + 20 + 20];
        frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut frame[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&40u16.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = 6; // TCP
        ip[12..16].copy_from_slice(&s.0);
        ip[16..20].copy_from_slice(&d.0);
        frame[34..36].copy_from_slice(&5000u16.to_be_bytes());
        frame[36..38].copy_from_slice(&80u16.to_be_bytes());
        assert_eq!(t.hash_frame(&frame), Some(t.hash_v4(s, d, 5000, 80)));
        // Not IPv4: no hash. Truncated: no hash.
        let mut arp = frame.clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(t.hash_frame(&arp), None);
        assert_eq!(t.hash_frame(&frame[..20]), None);
        // A fragment hashes the address pair.
        let mut frag = frame.clone();
        frag[14 + 6] = 0x20; // MF
        assert_eq!(t.hash_frame(&frag), Some(t.hash_v4_addrs(s, d)));
    }
}
