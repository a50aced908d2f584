//! The `virtio_net_hdr` that TAP (`IFF_VNET_HDR`) and AF_PACKET (`PACKET_VNET_HDR`) put
//! before each frame, and the transmit layout that goes with it, shared by both drivers.
//!
//! A TCP segment larger than the MTU leaves as one GSO frame: the header asks the kernel to
//! segment it (`GSO_TCPV4`, `gso_size` = MTU minus headers) and to compute each segment's
//! checksum (`NEEDS_CSUM`, from `csum_start`, stored at `csum_offset`). The kernel expects the
//! checksum field to hold the folded pseudo-header sum, not the full checksum the engine
//! wrote; rather than copying the frame to rewrite two bytes, the frame is sent as four
//! pieces (header, bytes before the checksum, the two partial-checksum bytes, the rest), so
//! a 64 KiB segment costs no copy in user space.

/// Size of the legacy `struct virtio_net_hdr` (native endian).
pub const VNET_HDR: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the sender (or the device) checked the checksum.
pub const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
pub const GSO_TCPV4: u8 = 1;

/// How one frame is transmitted behind a vnet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxLayout {
    /// The header bytes.
    pub hdr: [u8; VNET_HDR],
    /// For a GSO frame: the offset of the TCP checksum field and the partial sum (big
    /// endian) to send in its place. `None`: the frame goes unchanged.
    pub csum: Option<(usize, [u8; 2])>,
}

impl TxLayout {
    /// A frame the kernel takes as it is (all-zero header).
    pub const PLAIN: TxLayout = TxLayout {
        hdr: [0; VNET_HDR],
        csum: None,
    };

    /// The layout of `f` on a link of `mtu`: a GSO frame if `f` is an IPv4 TCP segment larger
    /// than the MTU, otherwise [`TxLayout::PLAIN`].
    pub fn for_frame(f: &[u8], mtu: usize) -> TxLayout {
        if f.len() <= 14 + mtu || f.len() < 54 || f[12..14] != [0x08, 0x00] || f[23] != 6 {
            return Self::PLAIN;
        }
        let ihl = ((f[14] & 0xf) as usize) * 4;
        let l4 = 14 + ihl;
        if ihl < 20 || f.len() < l4 + 20 {
            return Self::PLAIN;
        }
        let thl = ((f[l4 + 12] >> 4) as usize) * 4;
        if thl < 20 || f.len() < l4 + thl || mtu <= ihl + thl {
            return Self::PLAIN;
        }
        let gso = mtu - ihl - thl;
        let tcp_len = f.len() - l4;
        let src = flowstack_wire::Ipv4Address([f[26], f[27], f[28], f[29]]);
        let dst = flowstack_wire::Ipv4Address([f[30], f[31], f[32], f[33]]);
        let partial = flowstack_wire::checksum::pseudo_header(src, dst, 6, tcp_len as u32);
        let mut hdr = [0u8; VNET_HDR];
        hdr[0] = F_NEEDS_CSUM;
        hdr[1] = GSO_TCPV4;
        hdr[2..4].copy_from_slice(&((l4 + thl) as u16).to_ne_bytes());
        hdr[4..6].copy_from_slice(&(gso as u16).to_ne_bytes());
        hdr[6..8].copy_from_slice(&(l4 as u16).to_ne_bytes());
        hdr[8..10].copy_from_slice(&16u16.to_ne_bytes());
        TxLayout {
            hdr,
            csum: Some((l4 + 16, partial.to_be_bytes())),
        }
    }

    /// True for a GSO frame.
    pub fn is_gso(&self) -> bool {
        self.csum.is_some()
    }

    /// Number of pieces [`TxLayout::pieces`] yields for this layout (2 or 4).
    pub fn piece_count(&self) -> usize {
        if self.csum.is_some() {
            4
        } else {
            2
        }
    }

    /// Calls `put` with each piece of the transmitted bytes in order: header, frame (or, for
    /// a GSO frame, the frame up to the checksum, the partial checksum, the rest). The
    /// pieces borrow `self` and `f`, which must outlive their use.
    pub fn pieces<'a>(&'a self, f: &'a [u8], mut put: impl FnMut(&'a [u8])) {
        put(&self.hdr);
        match &self.csum {
            Some((at, sum)) => {
                put(&f[..*at]);
                put(sum);
                put(&f[at + 2..]);
            }
            None => put(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp_frame(payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 32 + payload];
        f[12] = 8;
        f[14] = 0x45;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[14 + 20 + 12] = 8 << 4;
        f[50..52].copy_from_slice(&[0xab, 0xcd]);
        f
    }

    #[test]
    fn small_frames_go_unchanged_behind_a_zero_header() {
        let f = tcp_frame(100);
        let l = TxLayout::for_frame(&f, 1500);
        assert_eq!(l, TxLayout::PLAIN);
        let mut out = Vec::new();
        l.pieces(&f, |p| out.extend_from_slice(p));
        assert_eq!(&out[..VNET_HDR], &[0; VNET_HDR]);
        assert_eq!(&out[VNET_HDR..], &f[..]);
    }

    #[test]
    fn a_large_segment_is_gso_with_the_partial_checksum_in_place() {
        let f = tcp_frame(10_000);
        let l = TxLayout::for_frame(&f, 1500);
        assert!(l.is_gso());
        assert_eq!(l.piece_count(), 4);
        assert_eq!(l.hdr[0], F_NEEDS_CSUM);
        assert_eq!(l.hdr[1], GSO_TCPV4);
        assert_eq!(u16::from_ne_bytes([l.hdr[2], l.hdr[3]]), 14 + 20 + 32);
        assert_eq!(u16::from_ne_bytes([l.hdr[4], l.hdr[5]]), 1500 - 20 - 32);
        assert_eq!(u16::from_ne_bytes([l.hdr[6], l.hdr[7]]), 34);
        let mut out = Vec::new();
        let mut n = 0;
        l.pieces(&f, |p| {
            out.extend_from_slice(p);
            n += 1;
        });
        assert_eq!(n, 4);
        let body = &out[VNET_HDR..];
        assert_eq!(body.len(), f.len());
        let partial = flowstack_wire::checksum::pseudo_header(
            flowstack_wire::Ipv4Address([10, 0, 0, 1]),
            flowstack_wire::Ipv4Address([10, 0, 0, 2]),
            6,
            (f.len() - 34) as u32,
        );
        assert_eq!(&body[50..52], &partial.to_be_bytes());
        assert_eq!(&body[..50], &f[..50]);
        assert_eq!(&body[52..], &f[52..]);
    }

    #[test]
    fn non_tcp_or_truncated_frames_are_plain() {
        let mut f = tcp_frame(5000);
        f[23] = 17;
        assert_eq!(TxLayout::for_frame(&f, 1500), TxLayout::PLAIN);
        let mut f = tcp_frame(5000);
        f[14] = 0x41; // IHL 4: invalid
        assert_eq!(TxLayout::for_frame(&f, 1500), TxLayout::PLAIN);
    }
}
