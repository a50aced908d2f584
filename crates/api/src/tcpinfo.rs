//! `TCP_INFO`'s common fields as the daemon reports them to an application (issue 16).
//!
//! Transport: the sync call `Command::TcpInfo { handle, part }`. A sync completion carries
//! one non-negative `i64`, so the record is sent in [`PARTS`] parts, each one u64 packing
//! up to two fields of 31 bits (or one of 63). This is the simplest honest choice: it
//! reuses the sync-call path unchanged and writes nothing into shared memory, so there is
//! no new area to lay out and validate. The price is [`PARTS`] round trips per
//! `getsockopt(TCP_INFO)` — a diagnostic call — and the parts are read one after another,
//! not as one atomic snapshot (as Linux, the fields may move between reads).

/// `TCP_INFO` fields flowstack knows, with Linux's units: times in µs, windows and
/// in-flight data in segments of `snd_mss` bytes. Unknown fields are not carried (the
/// shim leaves them 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpInfo {
    /// Linux `TCP_*` state number (1 established, 2 syn-sent, 7 close, 10 listen).
    pub state: u8,
    /// Timeouts in a row without progress (`tcpi_retransmits`).
    pub retransmits: u8,
    /// Effective send MSS.
    pub snd_mss: u16,
    /// Path MTU (`snd_mss` plus 40 bytes of headers).
    pub pmtu: u16,
    /// Smoothed RTT in µs (0 until measured).
    pub rtt: u32,
    /// RTT variation in µs.
    pub rttvar: u32,
    /// Retransmission timeout in µs.
    pub rto: u32,
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    /// Congestion window in segments.
    pub snd_cwnd: u32,
    /// Slow-start threshold in segments; [`INFINITE_SSTHRESH`] before the first loss.
    pub snd_ssthresh: u32,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// Payload bytes acknowledged by the peer.
    pub bytes_acked: u64,
    /// Payload bytes received in order.
    pub bytes_received: u64,
}

/// Linux's `tcpi_snd_ssthresh` before the first loss (`TCP_INFINITE_SSTHRESH`).
pub const INFINITE_SSTHRESH: u32 = 0x7fff_ffff;
/// How many parts (sync calls) carry a [`TcpInfo`].
pub const PARTS: u32 = 7;

const LOW31: u64 = 0x7fff_ffff;
const LOW63: u64 = i64::MAX as u64;

fn pair(lo: u32, hi: u32) -> u64 {
    (lo as u64).min(LOW31) | (hi as u64).min(LOW31) << 32
}
fn unpair(v: u64) -> (u32, u32) {
    ((v & LOW31) as u32, (v >> 32 & LOW31) as u32)
}

impl TcpInfo {
    /// Part `n` (below [`PARTS`]) as a completion's value: never above `i64::MAX`. 31-bit
    /// fields saturate at `0x7fffffff`, 63-bit ones at `i64::MAX`.
    pub fn part(&self, n: u32) -> Option<u64> {
        Some(match n {
            0 => {
                self.state as u64
                    | (self.retransmits as u64) << 8
                    | (self.snd_mss as u64) << 16
                    | (self.pmtu as u64) << 32
            }
            1 => pair(self.rtt, self.rttvar),
            2 => pair(self.rto, self.unacked),
            3 => pair(self.snd_cwnd, self.snd_ssthresh),
            4 => pair(self.total_retrans, 0),
            5 => self.bytes_acked.min(LOW63),
            6 => self.bytes_received.min(LOW63),
            _ => return None,
        })
    }

    /// Takes part `n` as [`TcpInfo::part`] made it (unknown parts are ignored).
    pub fn set_part(&mut self, n: u32, v: u64) {
        match n {
            0 => {
                self.state = v as u8;
                self.retransmits = (v >> 8) as u8;
                self.snd_mss = (v >> 16) as u16;
                self.pmtu = (v >> 32) as u16;
            }
            1 => (self.rtt, self.rttvar) = unpair(v),
            2 => (self.rto, self.unacked) = unpair(v),
            3 => (self.snd_cwnd, self.snd_ssthresh) = unpair(v),
            4 => self.total_retrans = unpair(v).0,
            5 => self.bytes_acked = v & LOW63,
            6 => self.bytes_received = v & LOW63,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_and_stay_non_negative() {
        let i = TcpInfo {
            state: 1,
            retransmits: 3,
            snd_mss: 65495,
            pmtu: 65535,
            rtt: 12,
            rttvar: 6,
            rto: 200_000,
            unacked: 4,
            snd_cwnd: 10,
            snd_ssthresh: INFINITE_SSTHRESH,
            total_retrans: 7,
            bytes_acked: 1 << 40,
            bytes_received: 5,
        };
        let mut back = TcpInfo::default();
        for n in 0..PARTS {
            let v = i.part(n).unwrap();
            assert!(v <= i64::MAX as u64);
            back.set_part(n, v);
        }
        assert_eq!(back, i);
        assert_eq!(i.part(PARTS), None);
        // Saturation, not wrap-around.
        let big = TcpInfo {
            rtt: u32::MAX,
            bytes_acked: u64::MAX,
            ..i
        };
        let mut b = TcpInfo::default();
        b.set_part(1, big.part(1).unwrap());
        b.set_part(5, big.part(5).unwrap());
        assert_eq!((b.rtt, b.rttvar), (0x7fff_ffff, 6));
        assert_eq!(b.bytes_acked, i64::MAX as u64);
    }
}
