//! `struct tcp_info` as Linux lays it out, filled from flowstack's common fields
//! ([`flowstack_api::tcpinfo::TcpInfo`]). Fields flowstack does not know stay 0.

use flowstack_api::tcpinfo::TcpInfo;

/// Bytes of `struct tcp_info` the shim fills: through `tcpi_bytes_received` (Linux 4.1's
/// size). A longer buffer gets this many bytes and this length back, as from an older
/// kernel; a shorter one a truncated struct, as Linux (`min(optlen, sizeof)`).
pub const TCP_INFO_LEN: usize = 136;

mod at {
    pub const STATE: usize = 0;
    pub const RETRANSMITS: usize = 2;
    pub const RTO: usize = 8;
    pub const SND_MSS: usize = 16;
    pub const UNACKED: usize = 24;
    pub const PMTU: usize = 60;
    pub const RTT: usize = 68;
    pub const RTTVAR: usize = 72;
    pub const SND_SSTHRESH: usize = 76;
    pub const SND_CWND: usize = 80;
    pub const TOTAL_RETRANS: usize = 100;
    pub const BYTES_ACKED: usize = 120;
    pub const BYTES_RECEIVED: usize = 128;
}

/// `i` as the bytes of Linux's `struct tcp_info` (native endian).
pub fn tcp_info_bytes(i: &TcpInfo) -> [u8; TCP_INFO_LEN] {
    let mut b = [0; TCP_INFO_LEN];
    let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    put(at::STATE, &[i.state]);
    put(at::RETRANSMITS, &[i.retransmits]);
    put(at::RTO, &i.rto.to_ne_bytes());
    put(at::SND_MSS, &u32::from(i.snd_mss).to_ne_bytes());
    put(at::UNACKED, &i.unacked.to_ne_bytes());
    put(at::PMTU, &u32::from(i.pmtu).to_ne_bytes());
    put(at::RTT, &i.rtt.to_ne_bytes());
    put(at::RTTVAR, &i.rttvar.to_ne_bytes());
    put(at::SND_SSTHRESH, &i.snd_ssthresh.to_ne_bytes());
    put(at::SND_CWND, &i.snd_cwnd.to_ne_bytes());
    put(at::TOTAL_RETRANS, &i.total_retrans.to_ne_bytes());
    put(at::BYTES_ACKED, &i.bytes_acked.to_ne_bytes());
    put(at::BYTES_RECEIVED, &i.bytes_received.to_ne_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn offsets_are_linuxs() {
        type T = libc::tcp_info;
        assert_eq!(offset_of!(T, tcpi_state), at::STATE);
        assert_eq!(offset_of!(T, tcpi_retransmits), at::RETRANSMITS);
        assert_eq!(offset_of!(T, tcpi_rto), at::RTO);
        assert_eq!(offset_of!(T, tcpi_snd_mss), at::SND_MSS);
        assert_eq!(offset_of!(T, tcpi_unacked), at::UNACKED);
        assert_eq!(offset_of!(T, tcpi_pmtu), at::PMTU);
        assert_eq!(offset_of!(T, tcpi_rtt), at::RTT);
        assert_eq!(offset_of!(T, tcpi_rttvar), at::RTTVAR);
        assert_eq!(offset_of!(T, tcpi_snd_ssthresh), at::SND_SSTHRESH);
        assert_eq!(offset_of!(T, tcpi_snd_cwnd), at::SND_CWND);
        assert_eq!(offset_of!(T, tcpi_total_retrans), at::TOTAL_RETRANS);
        assert_eq!(offset_of!(T, tcpi_bytes_acked), at::BYTES_ACKED);
        assert_eq!(offset_of!(T, tcpi_bytes_received), at::BYTES_RECEIVED);
        assert_eq!(at::BYTES_RECEIVED + 8, TCP_INFO_LEN);
    }

    #[test]
    fn fields_land_where_linux_reads_them() {
        let i = TcpInfo {
            state: 1,
            snd_mss: 1460,
            rtt: 250,
            snd_cwnd: 10,
            bytes_acked: 0x0102_0304_0506,
            ..TcpInfo::default()
        };
        let b = tcp_info_bytes(&i);
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!(b[0], 1);
        assert_eq!(u32_at(at::SND_MSS), 1460);
        assert_eq!(u32_at(at::RTT), 250);
        assert_eq!(u32_at(at::SND_CWND), 10);
        assert_eq!(u32_at(20), 0, "tcpi_rcv_mss is not known");
        assert_eq!(
            u64::from_ne_bytes(b[at::BYTES_ACKED..at::BYTES_ACKED + 8].try_into().unwrap()),
            0x0102_0304_0506
        );
    }
}
