//! The Internet checksum (RFC 1071) written for speed, plus incremental update (RFC 1624).
//!
//! The one's-complement sum is independent of byte order (RFC 1071 §2(B)), so the fast path sums
//! little-endian 64-bit words into a wide accumulator (two 32-bit halves per word, so no carry is
//! lost for inputs below 16 GiB), folds, and swaps once at the end. Unaligned input is fine: words
//! are read with `from_le_bytes`, which has no alignment requirement. A region that starts at an
//! odd byte position *within the checksummed message* is handled by [`Accumulator`], which swaps
//! that region's partial sum.

use crate::Ipv4Address;

/// Sums `data` as little-endian 16-bit words into a wide accumulator (not folded).
#[inline]
fn wide_sum_le(data: &[u8]) -> u64 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(32);
    for c in &mut chunks {
        // Four independent loads per iteration let the CPU overlap them.
        let w0 = u64::from_le_bytes(c[0..8].try_into().unwrap());
        let w1 = u64::from_le_bytes(c[8..16].try_into().unwrap());
        let w2 = u64::from_le_bytes(c[16..24].try_into().unwrap());
        let w3 = u64::from_le_bytes(c[24..32].try_into().unwrap());
        acc += (w0 & 0xffff_ffff) + (w0 >> 32);
        acc += (w1 & 0xffff_ffff) + (w1 >> 32);
        acc += (w2 & 0xffff_ffff) + (w2 >> 32);
        acc += (w3 & 0xffff_ffff) + (w3 >> 32);
    }
    let mut rest = chunks.remainder();
    while rest.len() >= 8 {
        let w = u64::from_le_bytes(rest[0..8].try_into().unwrap());
        acc += (w & 0xffff_ffff) + (w >> 32);
        rest = &rest[8..];
    }
    if rest.len() >= 4 {
        acc += u32::from_le_bytes(rest[0..4].try_into().unwrap()) as u64;
        rest = &rest[4..];
    }
    if rest.len() >= 2 {
        acc += u16::from_le_bytes([rest[0], rest[1]]) as u64;
        rest = &rest[2..];
    }
    if let [b] = rest {
        // Odd trailing byte: it is the high byte of a big-endian word padded with zero, which
        // is the low byte of a little-endian word.
        acc += *b as u64;
    }
    acc
}

/// Folds a wide sum to 16 bits with end-around carry.
#[inline]
fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// One's-complement sum of `data` as big-endian 16-bit words (not complemented).
#[inline]
pub fn sum(data: &[u8]) -> u16 {
    fold(wide_sum_le(data)).swap_bytes()
}

/// Adds 16-bit one's-complement sums together.
#[inline]
pub fn combine(sums: &[u16]) -> u16 {
    fold(sums.iter().map(|&s| s as u64).sum())
}

/// The checksum to write into a header: the complement of the sum of `data`.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !sum(data)
}

/// Sum of the IPv4 pseudo-header used by UDP and TCP (RFC 9293 §3.1, RFC 768).
#[inline]
pub fn pseudo_header(src: Ipv4Address, dst: Ipv4Address, protocol: u8, length: u32) -> u16 {
    let s = src.0;
    let d = dst.0;
    let acc = u16::from_be_bytes([s[0], s[1]]) as u64
        + u16::from_be_bytes([s[2], s[3]]) as u64
        + u16::from_be_bytes([d[0], d[1]]) as u64
        + u16::from_be_bytes([d[2], d[3]]) as u64
        + protocol as u64
        + (length >> 16) as u64
        + (length & 0xffff) as u64;
    fold(acc)
}

/// Incremental checksum update when one 16-bit word of the message changes from `old` to `new`
/// (RFC 1624 eqn. 3: `HC' = ~(~HC + ~m + m')`, which never yields the -0 pitfall of eqn. 2).
#[inline]
pub fn update(checksum: u16, old: u16, new: u16) -> u16 {
    !fold(!checksum as u64 + !old as u64 + new as u64)
}

/// Incremental update for a 32-bit field (e.g. an address or sequence number).
#[inline]
pub fn update32(checksum: u16, old: u32, new: u32) -> u16 {
    let c = update(checksum, (old >> 16) as u16, (new >> 16) as u16);
    update(c, old as u16, new as u16)
}

/// Accumulates a checksum over a message given in several pieces (e.g. header and payload in
/// different buffers, for zero-copy transmit). Handles pieces that start at odd positions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Accumulator {
    acc: u64,
    odd: bool,
}

impl Accumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a precomputed 16-bit sum (e.g. the pseudo-header) at an even position.
    pub fn add_sum(&mut self, s: u16) {
        debug_assert!(!self.odd, "add_sum at an odd position");
        self.acc += s as u64;
    }
    /// Adds the next piece of the message.
    pub fn add(&mut self, data: &[u8]) {
        let s = sum(data) as u64;
        // A piece starting at an odd position contributes its sum byte-swapped.
        self.acc += if self.odd {
            (s as u16).swap_bytes() as u64
        } else {
            s
        };
        self.odd ^= !data.len().is_multiple_of(2);
    }
    /// The complemented checksum of everything added.
    pub fn finish(&self) -> u16 {
        !fold(self.acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain RFC 1071 reference: big-endian 16-bit words, 32-bit accumulator.
    fn reference(data: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        let mut i = 0;
        while i + 1 < data.len() {
            acc += u16::from_be_bytes([data[i], data[i + 1]]) as u32;
            acc = (acc & 0xffff) + (acc >> 16);
            i += 2;
        }
        if i < data.len() {
            acc += (data[i] as u32) << 8;
        }
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        !(acc as u16)
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn matches_reference_every_length_and_alignment() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut buf = vec![0u8; 2008];
        for len in 0..2000 {
            for b in buf.iter_mut() {
                *b = rng.next() as u8;
            }
            for start in 0..4 {
                let data = &buf[start..start + len];
                assert_eq!(checksum(data), reference(data), "len {len} start {start}");
            }
        }
    }

    #[test]
    fn all_ones_input_does_not_lose_carries() {
        let data = vec![0xffu8; 65536 + 7];
        assert_eq!(checksum(&data), reference(&data));
    }

    #[test]
    fn accumulator_handles_odd_split_points() {
        let mut rng = Rng(99);
        let data: Vec<u8> = (0..1500).map(|_| rng.next() as u8).collect();
        for split in [0, 1, 2, 3, 7, 20, 21, 1499, 1500] {
            for split2 in [split, split + 1, 1500] {
                let split2 = split2.min(1500);
                let mut acc = Accumulator::new();
                acc.add(&data[..split]);
                acc.add(&data[split..split2]);
                acc.add(&data[split2..]);
                assert_eq!(acc.finish(), reference(&data), "split {split} {split2}");
            }
        }
    }

    #[test]
    fn incremental_update_matches_recomputation() {
        let mut rng = Rng(7);
        for _ in 0..20_000 {
            let len = 2 + (rng.next() as usize % 200) * 2;
            let mut data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let csum = checksum(&data);
            let at = (rng.next() as usize % (len / 2)) * 2;
            let old = u16::from_be_bytes([data[at], data[at + 1]]);
            let new = rng.next() as u16;
            data[at..at + 2].copy_from_slice(&new.to_be_bytes());
            let upd = update(csum, old, new);
            let full = checksum(&data);
            // 0x0000 and 0xffff are the same value in one's complement.
            assert!(upd == full || (upd == 0xffff && full == 0) || (upd == 0 && full == 0xffff));
        }
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: bytes 00 01 f2 03 f4 f5 f6 f7 sum to ddf2.
        assert_eq!(
            sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0xddf2
        );
    }
}
