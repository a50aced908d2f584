//! Initial sequence numbers (RFC 6528) and SYN cookies, both from a keyed hash.
//!
//! ISN = M + F(localip, localport, remoteip, remoteport, secretkey), where M is a 4 µs clock
//! and F is SipHash-2-4 keyed with a secret the engine draws from the OS RNG at start-up.

use flowstack_wire::{Instant, Ipv4Address, SeqNum};
use siphasher::sip::SipHasher24;
use std::hash::Hasher;

/// The connection 4-tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FourTuple {
    /// Our address.
    pub local_ip: Ipv4Address,
    /// Our port.
    pub local_port: u16,
    /// Peer address.
    pub remote_ip: Ipv4Address,
    /// Peer port.
    pub remote_port: u16,
}

/// Secret-keyed generator of ISNs and SYN cookies.
#[derive(Debug, Clone)]
pub struct IsnGenerator {
    key: [u8; 16],
}

/// MSS values a cookie can encode (3 bits), as Linux's table does.
const COOKIE_MSS: [u16; 8] = [536, 1200, 1300, 1360, 1400, 1440, 1460, 8960];
/// Cookie time counter period: 64 s.
const COOKIE_PERIOD_SHIFT: u32 = 36; // 2^36 ns ≈ 68.7 s

impl IsnGenerator {
    /// A generator with the given 128-bit secret.
    pub fn new(key: [u8; 16]) -> Self {
        Self { key }
    }

    fn hash(&self, t: &FourTuple, extra: u32, extra2: u32) -> u32 {
        let mut h = SipHasher24::new_with_key(&self.key);
        h.write(&t.local_ip.0);
        h.write_u16(t.local_port);
        h.write(&t.remote_ip.0);
        h.write_u16(t.remote_port);
        h.write_u32(extra);
        h.write_u32(extra2);
        h.finish() as u32
    }

    /// RFC 6528 §3: the ISN for a new connection.
    pub fn isn(&self, t: &FourTuple, now: Instant) -> SeqNum {
        let m = (now.as_nanos() / 4000) as u32;
        SeqNum(m.wrapping_add(self.hash(t, 0, 0)))
    }

    /// A SYN cookie: our ISN when answering `client_isn` statelessly.
    /// Layout: 5-bit time counter | 3-bit MSS index | 24-bit keyed hash.
    pub fn cookie(&self, t: &FourTuple, client_isn: SeqNum, mss: u16, now: Instant) -> SeqNum {
        let count = (now.as_nanos() >> COOKIE_PERIOD_SHIFT) as u32;
        let idx = COOKIE_MSS.iter().rposition(|&m| m <= mss).unwrap_or(0) as u32;
        let h = self.hash(t, client_isn.0, count) & 0x00ff_ffff;
        SeqNum(((count & 0x1f) << 27) | (idx << 24) | h)
    }

    /// Checks the cookie echoed in an ACK (`ack - 1`) and returns the MSS it encodes.
    /// Cookies from the current and previous period are accepted.
    pub fn check_cookie(
        &self,
        t: &FourTuple,
        client_isn: SeqNum,
        cookie: SeqNum,
        now: Instant,
    ) -> Option<u16> {
        let count = (now.as_nanos() >> COOKIE_PERIOD_SHIFT) as u32;
        let c = cookie.0;
        let idx = ((c >> 24) & 7) as usize;
        for age in 0..2u32 {
            let k = count.wrapping_sub(age);
            if (k & 0x1f) == c >> 27
                && self.hash(t, client_isn.0, k) & 0x00ff_ffff == c & 0x00ff_ffff
            {
                return Some(COOKIE_MSS[idx]);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(port: u16) -> FourTuple {
        FourTuple {
            local_ip: Ipv4Address::new(10, 0, 0, 1),
            local_port: 80,
            remote_ip: Ipv4Address::new(10, 0, 0, 2),
            remote_port: port,
        }
    }

    #[test]
    fn isn_depends_on_tuple_key_and_clock() {
        let g = IsnGenerator::new([7; 16]);
        let t0 = Instant::ZERO;
        assert_ne!(g.isn(&tuple(1), t0), g.isn(&tuple(2), t0));
        assert_ne!(
            g.isn(&tuple(1), t0),
            IsnGenerator::new([8; 16]).isn(&tuple(1), t0)
        );
        let later = Instant::from_nanos(4000 * 100);
        assert_eq!(g.isn(&tuple(1), later).diff(g.isn(&tuple(1), t0)), 100);
    }

    #[test]
    fn cookies_validate_and_expire() {
        let g = IsnGenerator::new([1; 16]);
        let now = Instant::from_millis(5_000);
        let c = g.cookie(&tuple(5), SeqNum(1234), 1460, now);
        assert_eq!(g.check_cookie(&tuple(5), SeqNum(1234), c, now), Some(1460));
        assert_eq!(g.check_cookie(&tuple(6), SeqNum(1234), c, now), None);
        assert_eq!(g.check_cookie(&tuple(5), SeqNum(1235), c, now), None);
        assert_eq!(
            g.check_cookie(&tuple(5), SeqNum(1234), SeqNum(c.0 ^ 1), now),
            None
        );
        let much_later = Instant::from_nanos(now.as_nanos() + (3u64 << COOKIE_PERIOD_SHIFT));
        assert_eq!(g.check_cookie(&tuple(5), SeqNum(1234), c, much_later), None);
    }
}
