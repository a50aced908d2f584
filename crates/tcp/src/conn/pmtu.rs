//! The path a connection's segments take: RFC 1191 path MTU discovery from ICMP
//! "fragmentation needed", RFC 5927's checks on every ICMP error that names a connection,
//! ICMP unreachables as soft errors (RFC 1122 §4.2.3.9), and black-hole detection when ICMP
//! is filtered (RFC 4821 §7.7, as Linux's `tcp_mtu_probing=1`); and raising a lowered
//! estimate again once it expires (RFC 1191 §6.3), so a connection does not stay small after
//! the path has grown back.
//!
//! # Raising the estimate: optimistic, as Linux by default
//! RFC 1191 §4: "An attempt to detect an increase (by sending a datagram larger than the
//! current estimate) MUST NOT be done less than 5 minutes after a Datagram Too Big message
//! has been received ... We recommend setting these timers at twice their minimum values (10
//! minutes ...)"; §6.3 purges a stale estimate by resetting it to the first-hop MTU, and the
//! next "fragmentation needed" lowers it again if the path is still narrow. Linux does
//! exactly this by default: a learned path MTU is a route exception that expires after
//! `ip_rt_mtu_expires` = 600 s, after which segments go out at the route's MTU again
//! (RFC 4821 probing, `tcp_mtu_probing`, is off by default there). So here: `pmtu_expires`
//! (600 s) after the last decrease from ICMP, the next transmission raises the MSS back to
//! what it was before the first decrease — the peer's MSS clamped to our interface's. A
//! segment of the larger size that the path cannot carry draws a new ICMP: the estimate is
//! lowered again (counted as a failed raise) and the data resent smaller, with no change to
//! the congestion window (§6.5). If the path drops it silently instead, the first
//! retransmission timeout of an unconfirmed raise takes it back (no waiting for black-hole
//! detection's three). Not raised here: an MSS lowered by black-hole detection (with no ICMP
//! to correct an optimistic raise) — RFC 4821 probes find that one again (`plpmtud`).

use super::{Connection, State, TcpError};
use crate::counters::{Counter, Counters};
use flowstack_wire::{Duration, Instant, SeqNum};

/// IP and TCP headers without options: what separates a path MTU from its MSS.
const HEADERS: usize = 40;
/// The smallest path MTU believed from an ICMP message, as Linux's `min_pmtu` (552): a
/// smaller or absurd value (RFC 1191 §4 plateaus start at 68) is raised to it, so a forged
/// "fragmentation needed" cannot shrink segments to a few bytes.
pub const MIN_PMTU: usize = 552;
/// The MSS black-hole detection starts from (Linux `tcp_base_mss`).
const BLACKHOLE_BASE_MSS: usize = 1024;
/// Consecutive timeouts of a full-sized segment before the path is suspected of dropping
/// large packets silently (Linux checks at `tcp_retries1` = 3).
const BLACKHOLE_AFTER: u32 = 3;

/// RFC 1191 §7 plateau table: a guess at the next MTU down when a router sends no MTU.
const PLATEAUS: [usize; 10] = [32000, 17914, 8166, 4352, 2002, 1492, 1006, 508, 296, 68];

/// What an ICMP error said about the path of a connection (RFC 792, RFC 1191).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcmpError {
    /// Destination unreachable, fragmentation needed and DF set: the next hop's MTU (0 from
    /// routers older than RFC 1191) and the quoted datagram's total length.
    FragNeeded {
        /// Next-hop MTU field.
        mtu: u16,
        /// Total length of the datagram that was too big.
        quoted_len: u16,
    },
    /// Port unreachable.
    PortUnreachable,
    /// Net, host or protocol unreachable, or administratively prohibited.
    Unreachable,
    /// Time exceeded in transit.
    TimeExceeded,
}

/// A path MTU estimate lowered by ICMP and its expiry (RFC 1191 §6.3), kept in the lazily
/// allocated RACK state: a connection whose path never shrank holds none of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PmtuRaise {
    /// When the lowered estimate expires; `None` when nothing is to be raised.
    expires: Option<Instant>,
    /// The MSS before the first decrease from ICMP (the peer's MSS clamped to our
    /// interface's): what a raise restores. 0 until a decrease.
    ceiling: u16,
    /// The MSS a raise left, while no segment of the larger size has been acknowledged
    /// (0 when no raise is unconfirmed).
    floor: u16,
    /// The end of the first segment sent larger than `floor` after a raise: an ACK past it
    /// confirms the raise.
    confirm: Option<SeqNum>,
}

impl PmtuRaise {
    pub(crate) const fn new() -> Self {
        Self {
            expires: None,
            ceiling: 0,
            floor: 0,
            confirm: None,
        }
    }
}

impl Connection {
    /// Handles an ICMP error whose quoted TCP header names this connection; `seq` is the
    /// sequence number in that quoted header.
    ///
    /// RFC 5927 §4.1: "TCP SHOULD check that the TCP sequence number contained in the payload
    /// of the ICMP error message is within the range SND.UNA =< SEG.SEQ < SND.NXT" — an error
    /// about anything else is forged or stale and ignored (counted `TcpExtOutOfWindowIcmps`).
    pub fn on_icmp_error(&mut self, now: Instant, err: IcmpError, seq: SeqNum, c: &mut Counters) {
        if self.state == State::Closed || !(self.snd.una <= seq && seq < self.snd.max) {
            c.inc(Counter::TcpExtOutOfWindowIcmps);
            return;
        }
        match err {
            IcmpError::FragNeeded { mtu, quoted_len } => {
                self.on_frag_needed(now, mtu as usize, quoted_len as usize, c)
            }
            // RFC 1122 §4.2.3.9: unreachables are soft errors ("TCP MUST NOT abort the
            // connection"); the error is reported if the connection later times out (as
            // Linux's sk_err_soft). RFC 5927 §4.2 agrees: hard errors on established
            // connections are an attack vector.
            IcmpError::PortUnreachable => self.record_soft_error(TcpError::Refused, c),
            IcmpError::Unreachable | IcmpError::TimeExceeded => {
                self.record_soft_error(TcpError::Unreachable, c)
            }
        }
    }

    fn record_soft_error(&mut self, e: TcpError, c: &mut Counters) {
        c.inc(Counter::TcpExtTCPIcmpSoftErrors);
        self.soft_error = Some(e);
    }

    /// RFC 1191 §6: lower the path MTU to what the router reported and resend what no longer
    /// fits. RFC 1191 §6.5 (and RFC 5927 §7.1): this is not a congestion signal, so the
    /// congestion window is left alone.
    fn on_frag_needed(&mut self, now: Instant, mtu: usize, quoted_len: usize, c: &mut Counters) {
        let mtu = if mtu == 0 {
            // RFC 1191 §5: an old router — guess the next plateau below the datagram's size.
            PLATEAUS
                .iter()
                .copied()
                .find(|&p| p < quoted_len)
                .unwrap_or(MIN_PMTU)
        } else {
            mtu
        };
        let mss = mtu.max(MIN_PMTU) - HEADERS;
        if mss >= self.snd.mss {
            // RFC 1191 §6.3: an MTU at or above the current estimate is ignored (a host
            // never raises its estimate on an ICMP message).
            c.inc(Counter::TcpExtTCPPMTUIgnored);
            self.plp_icmp_above(mss);
            return;
        }
        c.inc(Counter::TcpExtTCPPMTUReduced);
        self.pmtu_lowered(now, mss, c);
        self.lower_mss(now, mss);
        self.plp_icmp(mss);
    }

    /// ICMP lowered the estimate to `mss`: remember what to raise it back to, and when.
    fn pmtu_lowered(&mut self, now: Instant, mss: usize, c: &mut Counters) {
        let cur = self.snd.mss as u16;
        let expiry = self.cfg.pmtu_expires;
        let p = &mut self.rec.rack.pmtu;
        if p.floor != 0 {
            // A raise is refuted before any segment of its size got through.
            c.inc(Counter::TcpExtTCPPMTURaiseFailed);
            p.floor = 0;
            p.confirm = None;
        }
        if p.ceiling == 0 {
            p.ceiling = cur;
        }
        p.expires = expiry
            .filter(|_| (p.ceiling as usize) > mss)
            .map(|d| now + d);
    }

    /// Before transmitting at `now`: if the lowered estimate has expired, raise the MSS back
    /// to its ceiling (RFC 1191 §6.3; see the module's notes). Reads only, on a connection
    /// whose path never shrank.
    pub(crate) fn pmtu_expiry(&mut self, now: Instant, c: &mut Counters) {
        let p = &self.rec.rack.pmtu;
        let Some(at) = p.expires else {
            return;
        };
        if now < at || !self.state.is_synchronized() {
            return;
        }
        let ceiling = p.ceiling as usize;
        let from = self.snd.mss;
        let p = &mut self.rec.rack.pmtu;
        p.expires = None;
        if ceiling <= from {
            return;
        }
        c.inc(Counter::TcpExtTCPPMTURaised);
        p.floor = from as u16;
        p.confirm = None;
        self.snd.mss = ceiling;
        self.rec.cc.set_smss(ceiling);
    }

    /// A segment of `len` data bytes ending at `end` goes out: the first one larger than
    /// what the path was known to carry is the one whose acknowledgment confirms a raise.
    pub(crate) fn pmtu_on_send(&mut self, len: usize, end: SeqNum) {
        let p = &self.rec.rack.pmtu;
        if p.floor == 0 || p.confirm.is_some() {
            return;
        }
        let floor = p.floor as usize;
        let options = self.snd.mss - self.full_seg();
        if len + options > floor {
            self.rec.rack.pmtu.confirm = Some(end);
        }
    }

    /// SND.UNA moved to `ack`: a raise whose first large segment is acknowledged holds.
    pub(crate) fn pmtu_on_ack(&mut self, ack: SeqNum) {
        if self.rec.rack.pmtu.confirm.is_some_and(|e| ack >= e) {
            let p = &mut self.rec.rack.pmtu;
            p.floor = 0;
            p.confirm = None;
        }
    }

    /// A retransmission timeout while a raise is unconfirmed: the larger segments vanish
    /// without an ICMP (a black hole for that size). Go back to the size that worked at once
    /// and try again at the next expiry. Returns true if it did.
    pub(crate) fn pmtu_raise_timed_out(&mut self, now: Instant, c: &mut Counters) -> bool {
        let floor = self.rec.rack.pmtu.floor as usize;
        if floor == 0 {
            return false;
        }
        c.inc(Counter::TcpExtTCPPMTURaiseFailed);
        let expiry: Option<Duration> = self.cfg.pmtu_expires;
        let p = &mut self.rec.rack.pmtu;
        p.floor = 0;
        p.confirm = None;
        p.expires = expiry.map(|d| now + d);
        self.snd.mss = floor;
        self.rec.cc.set_smss(floor);
        true
    }

    /// Sets a smaller effective send MSS and resends the unacknowledged data in segments of
    /// the new size (the large ones were dropped on the way, as Linux's
    /// tcp_simple_retransmit), without touching the congestion window.
    fn lower_mss(&mut self, now: Instant, mss: usize) {
        self.snd.mss = mss;
        self.rec.cc.set_smss(mss);
        if self.state.is_synchronized() && !self.snd.all_acked() {
            self.snd.nxt = self.snd.una;
            // Karn: a resent segment cannot be timed.
            self.snd.rtt_probe = None;
            let rto = now + self.snd.rtt.rto();
            self.timers.set(super::Timer::Rto, rto);
        }
    }

    /// RFC 4821 §7.7 black-hole detection, called on each retransmission timeout: when the
    /// oldest unacknowledged segment has timed out `BLACKHOLE_AFTER` times in a row, large
    /// packets may be vanishing on a path whose routers' ICMP is filtered. Lower the MSS to
    /// 1024, then halve it at each further timeout, never below what [`MIN_PMTU`] carries
    /// (as Linux with `tcp_mtu_probing=1`) — unless the lost segment is no larger than the
    /// floor itself (then its size cannot be the problem). Returns true if it did.
    pub(crate) fn blackhole_check(&mut self, now: Instant, c: &mut Counters) -> bool {
        let floor = MIN_PMTU - HEADERS;
        if !self.cfg.mtu_probing
            || !self.state.is_synchronized()
            || self.timers.retries < BLACKHOLE_AFTER
            || self.snd.mss <= floor
        {
            return false;
        }
        let mss = if self.snd.mss > BLACKHOLE_BASE_MSS {
            BLACKHOLE_BASE_MSS
        } else {
            self.snd.mss / 2
        }
        .max(floor);
        let lost = (self.snd.data_end() - self.snd.una).min(self.full_seg());
        let options = self.snd.mss - self.full_seg();
        if lost <= floor - options {
            return false; // already as small as the floor: not a size problem
        }
        c.inc(Counter::TcpExtTCPMTUPBlackhole);
        let from = self.snd.mss;
        self.snd.mss = mss;
        self.rec.cc.set_smss(mss);
        // RFC 4821: search upwards from here again (`plpmtud`).
        self.plp_blackhole(from);
        let _ = now;
        true
    }
}
