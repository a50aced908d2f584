//! RFC 4821 packetization-layer path MTU discovery (PLPMTUD): finding a larger MSS without
//! ICMP, by sending one segment larger than the current MSS — a *probe* — and watching
//! whether it alone gets through.
//!
//! # The search
//! RFC 4821 §7.2 keeps a range: `search_low`, a size known to get through, and
//! `search_high`, the largest size not known to fail (what the peer's MSS option and our
//! interface allow). Here both are MSS values (the path MTU less 40 bytes of IP and TCP
//! headers, options counted inside, as `snd.mss`). §7.3: the probe size is chosen by binary
//! search, the middle of the range; the search ends when the range is narrower than
//! [`PROBE_THRESHOLD`] (8 bytes, Linux `tcp_probe_threshold`). After
//! `TcpConfig::plpmtud_interval` (600 s, Linux `tcp_probe_interval`) a finished search
//! starts again with `search_high` back at the ceiling, so a path that grew is found.
//!
//! When the search starts is `TcpConfig::plpmtud`: after black-hole detection has lowered
//! the MSS (RFC 4821 §7.7; the default, as Linux's `tcp_mtu_probing=1`), or from the first
//! transmission at 1024 bytes (Linux's `tcp_mtu_probing=2`).
//!
//! # Outcomes (RFC 4821 §7.5, §7.6)
//! - *Success*: the probe is acknowledged (cumulatively or SACKed). `search_low` and the MSS
//!   become the probe's size (§7.6.1).
//! - *Failure*: the probe is lost alone — RACK marks it lost with no other segment lost
//!   (with SACK), three duplicate ACKs find it at the head (without RACK), or the
//!   retransmission timer fires with the probe at SND.UNA. §7.6.2: "In this case alone, the
//!   loss SHOULD NOT be interpreted as congestion signal": `search_high` becomes the probe's
//!   size less one, the congestion window is left alone, and the probe's bytes are resent in
//!   segments of the current MSS.
//! - *Inconclusive* (§7.6.4): the probe is lost with other segments, or a timeout finds
//!   older data unacknowledged — congestion may have caused it. The range is kept, the
//!   losses get the usual congestion response, and the same size is tried again later.
//!
//! The state lives in RACK's lazily allocated box (cold, 32 bytes): a connection that never
//! met a black hole reads one flag per transmission.

use super::{Connection, State};
use crate::config::Plpmtud;
use crate::counters::{Counter, Counters};
use crate::sack::DUP_THRESH;
use flowstack_wire::{Instant, SeqNum};

/// A search ends once `search_high - search_low` is below this (Linux `tcp_probe_threshold`).
pub(crate) const PROBE_THRESHOLD: u16 = 8;
/// Where a search from the start begins (Linux `tcp_base_mss`; RFC 4821 §7.2 recommends
/// starting `search_low` at 1024 bytes).
const BASE_MSS: usize = 1024;

/// The RFC 4821 search (in [`super::rack::Rack`]); every size is an MSS.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Search {
    /// search_low: a size known to get through; 0 while no search has started.
    low: u16,
    /// search_high: the largest size not known to fail.
    high: u16,
    /// What the peer and our interface allow: `search_high` at each (re)start.
    ceiling: u16,
    /// The outstanding probe's size (0: none).
    probe_mss: u16,
    /// The outstanding probe's sequence range.
    probe: (SeqNum, SeqNum),
    /// When a finished search starts again (`None` while it runs).
    reprobe_at: Option<Instant>,
}

impl Search {
    pub(crate) const fn new() -> Self {
        Self {
            low: 0,
            high: 0,
            ceiling: 0,
            probe_mss: 0,
            probe: (SeqNum(0), SeqNum(0)),
            reprobe_at: None,
        }
    }

    /// The size to probe next, if the range is still wider than the threshold (§7.3: the
    /// middle of it). Once it is narrower while its top is still the ceiling (never seen to
    /// fail), the ceiling itself is tried once: a path that carries the full size gets it
    /// back exactly — and with it segmentation offload, which needs the link's full MSS —
    /// rather than stopping a few bytes short.
    fn next_probe(&self) -> Option<u16> {
        if self.low == 0 || self.probe_mss != 0 || self.low >= self.high {
            return None;
        }
        if self.high >= self.low + PROBE_THRESHOLD {
            Some(self.low + (self.high - self.low) / 2)
        } else {
            (self.high == self.ceiling).then_some(self.ceiling)
        }
    }
}

impl Connection {
    /// The RFC 4821 search range `(search_low, search_high)` as MSS values, once a search
    /// has started (TCP_INFO-style visibility; also for tests).
    pub fn mtu_search(&self) -> Option<(usize, usize)> {
        let s = &self.rec.rack.plp;
        (s.low != 0).then_some((s.low as usize, s.high as usize))
    }

    /// Starts (or narrows) the search after black-hole detection lowered the MSS from
    /// `from` to the current one: `search_low` is the new size; `search_high` what the
    /// path was tried at (the ceiling, on the first black hole).
    pub(crate) fn plp_blackhole(&mut self, from: usize) {
        if self.cfg.plpmtud == Plpmtud::Off {
            return;
        }
        let mss = self.snd.mss as u16;
        let s = &mut self.rec.rack.plp;
        if s.low == 0 {
            s.ceiling = from as u16;
            s.high = from as u16;
        }
        s.low = mss;
        s.high = s.high.max(mss);
        s.probe_mss = 0;
    }

    /// `TcpConfig::plpmtud` = `Always`: the first transmission of a synchronized connection
    /// starts the search at [`BASE_MSS`]; and a finished search starts again once
    /// `plpmtud_interval` has passed. Cheap when probing is off or idle.
    pub(crate) fn plp_tick(&mut self, now: Instant) {
        let s = &self.rec.rack.plp;
        if s.low == 0 {
            if self.cfg.plpmtud != Plpmtud::Always || !self.state.is_synchronized() {
                return;
            }
            let ceiling = self.snd.mss;
            let mss = ceiling.min(BASE_MSS);
            let s = &mut self.rec.rack.plp;
            s.ceiling = ceiling as u16;
            s.high = ceiling as u16;
            s.low = mss as u16;
            self.snd.mss = mss;
            self.rec.cc.set_smss(mss);
            return;
        }
        if s.reprobe_at.is_some_and(|t| now >= t) {
            // Linux `tcp_probe_interval`: look again for a path that grew.
            let s = &mut self.rec.rack.plp;
            s.reprobe_at = None;
            s.high = s.ceiling;
        }
    }

    /// ICMP "fragmentation needed" lowered the MSS to `mss` (RFC 1191): the path cannot
    /// carry more, whatever the search believed, and a probe in flight is moot.
    pub(crate) fn plp_icmp(&mut self, mss: usize) {
        let s = &mut self.rec.rack.plp;
        if s.low == 0 {
            return;
        }
        let mss = mss as u16;
        s.high = s.high.min(mss);
        s.low = s.low.min(mss);
        s.probe_mss = 0;
    }

    /// ICMP reported an MTU at or above the current MSS (ignored by RFC 1191 §6.3, which
    /// never raises on ICMP) — typically about a probe: the search's top comes down to it.
    /// The probe itself is judged by its loss.
    pub(crate) fn plp_icmp_above(&mut self, mss: usize) {
        let s = &mut self.rec.rack.plp;
        if s.low != 0 && (mss as u16) < s.high {
            s.high = (mss as u16).max(s.low);
        }
    }

    /// If a probe may go out now with `avail` bytes of new data at SND.NXT, its size (an
    /// MSS). RFC 4821 §7.4, probing preconditions, each checked here: no probe outstanding
    /// and no loss being repaired (no recovery, no timeout episode, no go-back-N resend, no
    /// segment marked lost); "the available window is greater than the probe size" — the
    /// peer's window, and the congestion window beside what is in flight (the probe is
    /// data: it counts as any segment does); and, for TCP probing with its own data, enough
    /// data is queued (§10.1) — the probe plus DupThresh + 1 full segments behind it, so
    /// that its loss shows by SACK or duplicate ACKs rather than by a timeout (as Linux
    /// sizes `size_needed`). Deliberately, unlike Linux, sending never stops to wait for a
    /// window that fits the trailing segments too: a window-limited flow would stall.
    pub(super) fn plp_probe_size(&self, avail: usize) -> Option<usize> {
        let probe = self.rec.rack.plp.next_probe()? as usize;
        if probe <= self.snd.mss
            || !matches!(self.state, State::Established | State::CloseWait)
            || self.rec.in_recovery
            || self.timers.retries != 0
            || self.snd.nxt != self.snd.max
        {
            return None;
        }
        let options = self.snd.mss - self.full_seg();
        let payload = probe - options;
        let needed = payload + (DUP_THRESH + 1) * self.full_seg();
        let cwnd_room = self.rec.cc.cwnd().saturating_sub(self.pipe());
        // The scan of RACK's records last: it is the one check that is not O(1).
        (avail >= needed
            && self.snd.window_room() >= payload
            && cwnd_room >= payload
            && self.rec.rack.lost_bytes() == 0)
            .then_some(probe)
    }

    /// The probe `[start, end)` of size `mss` went out (§7.5).
    pub(super) fn plp_probe_sent(&mut self, mss: usize, start: SeqNum, end: SeqNum) {
        let s = &mut self.rec.rack.plp;
        s.probe_mss = mss as u16;
        s.probe = (start, end);
    }

    /// True while a probe is outstanding.
    #[inline]
    fn plp_outstanding(&self) -> bool {
        self.rec.rack.plp.probe_mss != 0
    }

    /// An ACK moved SND.UNA to `ack` or brought SACK news: a probe acknowledged whole is a
    /// success (§7.6.1): `search_low` and the MSS become its size.
    pub(crate) fn plp_on_ack(&mut self, now: Instant, ack: SeqNum, c: &mut Counters) {
        if !self.plp_outstanding() {
            return;
        }
        let (start, end) = self.rec.rack.plp.probe;
        let delivered = ack >= end || self.rec.sack.sacked_until(start).is_some_and(|e| e >= end);
        if !delivered {
            return;
        }
        c.inc(Counter::TcpExtTCPMTUPSuccess);
        let interval = self.cfg.plpmtud_interval;
        let s = &mut self.rec.rack.plp;
        let mss = s.probe_mss;
        s.probe_mss = 0;
        s.low = s.low.max(mss);
        s.high = s.high.max(s.low);
        if s.next_probe().is_none() {
            s.reprobe_at = Some(now + interval);
        }
        if mss as usize > self.snd.mss {
            self.snd.mss = mss as usize;
            self.rec.cc.set_smss(mss as usize);
        }
    }

    /// §7.6.2: the probe was lost alone. `search_high` drops below its size; the caller
    /// resends its bytes at the current MSS without a congestion response.
    fn plp_failed(&mut self, now: Instant, c: &mut Counters) {
        c.inc(Counter::TcpExtTCPMTUPFail);
        let interval = self.cfg.plpmtud_interval;
        let s = &mut self.rec.rack.plp;
        s.high = s.high.min(s.probe_mss - 1).max(s.low);
        s.probe_mss = 0;
        if s.next_probe().is_none() {
            s.reprobe_at = Some(now + interval);
        }
    }

    /// §7.6.4: the probe's loss is inconclusive; forget it, keep the range.
    fn plp_inconclusive(&mut self) {
        self.rec.rack.plp.probe_mss = 0;
    }

    /// RACK marked segments lost (RFC 8985 §6.2 step 5). Returns true if the only loss is
    /// the outstanding probe: a failure, with no recovery entered — RACK's retransmission
    /// loop resends its bytes at the current MSS, and the congestion window stays.
    pub(crate) fn plp_rack_lost(&mut self, now: Instant, c: &mut Counters) -> bool {
        if !self.plp_outstanding() {
            return false;
        }
        let (start, end) = self.rec.rack.plp.probe;
        let rack = &self.rec.rack;
        let probe_lost = rack
            .segs
            .iter()
            .any(|s| s.lost && !s.sacked && s.start < end && s.end > start);
        if !probe_lost {
            return false;
        }
        let others = rack
            .segs
            .iter()
            .any(|s| s.lost && !s.sacked && (s.end <= start || s.start >= end));
        if others || self.rec.in_recovery {
            self.plp_inconclusive();
            return false;
        }
        self.plp_failed(now, c);
        true
    }

    /// Duplicate-ACK loss detection (no RACK) is about to enter recovery for the segment at
    /// SND.UNA. If that is the probe, it is a failure: resent from SND.UNA at the current
    /// MSS as after an ICMP decrease (RFC 1191 §6.5 style, as Linux's
    /// tcp_simple_retransmit), no recovery entered, no window reduction. Returns true then.
    pub(crate) fn plp_dupack_lost(&mut self, now: Instant, c: &mut Counters) -> bool {
        if !self.plp_lost_at_una(now, c) {
            return false;
        }
        self.rec.dupacks = 0;
        // The duplicate ACKs the resend draws must not start a recovery for it.
        self.rec.recover = self.snd.max;
        self.snd.nxt = self.snd.una;
        self.snd.rtt_probe = None;
        true
    }

    /// A retransmission timeout with a probe outstanding. With the probe at SND.UNA
    /// (everything before it acknowledged) the probe is what vanished: a failure (§7.6.3
    /// discusses the timeout case; its loss is still the size's, not congestion's, as for
    /// a raise lost silently) — returns true and the caller skips the window collapse.
    /// Older data unacknowledged too: inconclusive.
    pub(crate) fn plp_timed_out(&mut self, now: Instant, c: &mut Counters) -> bool {
        self.plp_lost_at_una(now, c)
    }

    /// The segment at SND.UNA was found lost with a probe outstanding: if the probe starts
    /// there, a failure (true); otherwise older data is missing too, inconclusive (false).
    fn plp_lost_at_una(&mut self, now: Instant, c: &mut Counters) -> bool {
        if !self.plp_outstanding() {
            return false;
        }
        if self.snd.una != self.rec.rack.plp.probe.0 {
            self.plp_inconclusive();
            return false;
        }
        self.plp_failed(now, c);
        true
    }
}

#[cfg(test)]
mod tests {
    /// The search rides in RACK's box of every connection that sent data: kept small.
    #[test]
    fn the_search_state_stays_small() {
        assert!(std::mem::size_of::<super::Search>() <= 32);
    }
}
