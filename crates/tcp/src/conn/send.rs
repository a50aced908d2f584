//! The send side: the send sequence space (RFC 9293 §3.3.1), the send queue and RTT timing of
//! sent data; what an acceptable ACK does to them; and cutting queued data into segments
//! (Nagle, sender SWS avoidance, congestion and flow control).

use super::output::Emit;
use super::{Connection, State, Timer};
use crate::config::TcpConfig;
use crate::counters::Counters;
use crate::rtt::RttEstimator;
use crate::sendq::SendQueue;
use flowstack_wire::tcp::TcpRepr;
use flowstack_wire::{Duration, Instant, SeqNum};

/// The sender's state (RFC 9293 §3.3.1 "Send Sequence Variables", plus what sending needs).
pub(crate) struct Sender {
    /// ISS: our initial sequence number; our SYN occupies it.
    pub(crate) iss: SeqNum,
    /// SND.UNA: the oldest unacknowledged sequence number.
    pub(crate) una: SeqNum,
    /// SND.NXT: the next sequence number to send (moves back for a go-back-N resend).
    pub(crate) nxt: SeqNum,
    /// Highest sequence number sent (SND.NXT before a go-back-N rewind).
    pub(crate) max: SeqNum,
    /// End of the last sub-MSS segment sent (Minshall's Nagle variant).
    pub(crate) sml: SeqNum,
    /// SND.WND: the peer's window in bytes (scaled).
    pub(crate) wnd: usize,
    /// SND.WL1: sequence number of the segment that last updated the window.
    pub(crate) wl1: SeqNum,
    /// SND.WL2: acknowledgment number of the segment that last updated the window.
    pub(crate) wl2: SeqNum,
    /// The largest window the peer has offered (sender SWS avoidance, RFC 5961 §5.2).
    pub(crate) max_wnd: usize,
    /// Effective send MSS.
    pub(crate) mss: usize,
    /// Queued bytes, unsent and unacknowledged.
    pub(crate) queue: super::lazy::Lazy<SendQueue>,
    /// Next zero-copy buffer token.
    pub(crate) zc_token: u64,
    /// Zero-copy tokens issued and not yet reported by `take_zc_completion`: the queued
    /// ones and the completed ones nobody took. The next token reported is `zc_token` less
    /// this; buffers complete in order, so those below `zc_token - queue.zc_pending()` are
    /// done. Two counters instead of a list: a completion nobody takes costs nothing.
    pub(crate) zc_unreported: u32,
    /// Holds a segment's payload when it straddles the send ring's wrap point.
    pub(crate) scratch: super::lazy::Lazy0<Vec<u8>>,
    /// Sequence number of our FIN once the application closed the sending side.
    pub(crate) fin_seq: Option<SeqNum>,
    /// Smoothed RTT and RTO (RFC 6298).
    pub(crate) rtt: RttEstimator,
    /// The segment being timed: its sequence number and when it was sent.
    pub(crate) rtt_probe: Option<(SeqNum, Instant)>,
}

impl Sender {
    pub(crate) fn new(cfg: &TcpConfig, iss: SeqNum) -> Self {
        Self {
            iss,
            una: iss,
            nxt: iss,
            max: iss,
            sml: iss,
            wnd: 0,
            wl1: SeqNum(0),
            wl2: iss,
            max_wnd: 0,
            mss: cfg.mss as usize,
            queue: super::lazy::Lazy::new(cfg.send_buffer),
            zc_token: 0,
            zc_unreported: 0,
            scratch: super::lazy::Lazy0::new(),
            fin_seq: None,
            rtt: RttEstimator::new(cfg.rto_initial, cfg.rto_min, cfg.rto_max),
            rtt_probe: None,
        }
    }

    /// The sequence number of the first data byte in the send queue.
    pub(crate) fn data_start(&self) -> SeqNum {
        // While our SYN is unacknowledged it occupies ISS; data starts after it.
        if self.una == self.iss {
            self.iss + 1
        } else {
            self.una
        }
    }

    /// The sequence number just past the last queued byte.
    pub(crate) fn data_end(&self) -> SeqNum {
        self.data_start() + self.queue.len()
    }

    /// Bytes sent and not yet acknowledged.
    pub(crate) fn flight(&self) -> usize {
        self.nxt - self.una
    }

    /// True if everything sent has been acknowledged.
    pub(crate) fn all_acked(&self) -> bool {
        self.max == self.una
    }

    /// Room left in the peer's window at SND.NXT.
    pub(crate) fn window_room(&self) -> usize {
        (self.una + self.wnd) - self.nxt
    }

    /// Takes the peer's window from the segment that synchronized the connection.
    pub(crate) fn init_window(&mut self, seq: SeqNum, ack: SeqNum, wnd: usize) {
        self.wnd = wnd;
        self.max_wnd = wnd;
        self.wl1 = seq;
        self.wl2 = ack;
    }

    /// Window update (RFC 9293 §3.10.7.4: SND.WL1/SND.WL2 rule). Returns true if the
    /// window opened from zero.
    pub(crate) fn update_window(&mut self, seq: SeqNum, ack: SeqNum, window: usize) -> bool {
        if self.wl1 < seq || (self.wl1 == seq && self.wl2 <= ack) {
            let opened = self.wnd == 0 && window > 0;
            self.wnd = window;
            self.wl1 = seq;
            self.wl2 = ack;
            self.max_wnd = self.max_wnd.max(window);
            return opened;
        }
        false
    }
}

impl Connection {
    /// SND.UNA moves forward to `ack`.
    pub(crate) fn ack_advanced(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        let ack = seg.ack;
        let mut acked = ack - self.snd.una;
        if self.snd.una == self.snd.iss {
            acked -= 1; // our SYN
        }
        let fin_acked = self.snd.fin_seq.is_some_and(|f| ack > f);
        if fin_acked && self.snd.una <= self.snd.fin_seq.unwrap() {
            acked -= 1;
        }
        let acked = acked.min(self.snd.queue.len());
        {
            let _p = flowstack_prof::enter(flowstack_prof::Layer::BufRelease);
            self.snd.queue.consume(acked);
        }
        self.stats.bytes_acked += acked as u64;
        self.spurious_rto_check(seg, c);
        self.sample_rtt(now, seg);
        self.snd.una = ack;
        self.pmtu_on_ack(ack);
        self.plp_on_ack(now, ack, c);
        if self.snd.nxt < ack {
            self.snd.nxt = ack;
        }
        self.timers.retries = 0;
        // Progress: the user timeout's clock restarts (or stops with nothing in flight).
        self.timers
            .set_unacked_since((self.snd.max > ack).then_some(now));
        self.recovery_on_ack(now, ack, acked, c);
        // RFC 6298 §5.2/5.3: restart the timer if data remains, stop it otherwise.
        let rto = (self.snd.max > self.snd.una).then(|| now + self.snd.rtt.rto());
        self.timers.update(Timer::Rto, rto);
        if self.rack_on() {
            self.rack_on_ack(now, seg, c);
        }
        if fin_acked {
            match self.state {
                State::FinWait1 => {
                    self.state = State::FinWait2;
                    self.timers
                        .set(Timer::Lifetime, now + self.cfg.fin_wait2_timeout);
                }
                State::Closing => self.enter_time_wait(now, c),
                State::LastAck => self.enter_closed(),
                _ => {}
            }
        }
    }

    /// RFC 3522 Eifel detection on the first ACK of new data after a timeout: if it echoes a
    /// timestamp older than the retransmission's, the original segment arrived and the
    /// timeout was spurious (a delay spike). RFC 4015 response: restore the congestion window
    /// and threshold, and go on with new data instead of resending what is in flight.
    fn spurious_rto_check(&mut self, seg: &TcpRepr, c: &mut Counters) {
        let Some(u) = self.rec.rto_undo.take() else {
            return;
        };
        let Some((_, ecr)) = seg.options.timestamp.filter(|t| t.1 != 0) else {
            return;
        };
        if (ecr.wrapping_sub(u.ts) as i32) < 0 {
            c.inc(crate::counters::Counter::TcpExtTCPSpuriousRTOs);
            self.rec.cc.restore(u.cc);
            self.snd.nxt = self.snd.max;
            self.timers.retries = 0;
        }
    }

    /// RTT: one timed segment per round trip on our nanosecond clock (finer than the 1 ms
    /// timestamp clock); when none is timed (Karn: retransmissions void it), RFC 7323 RTTM
    /// takes the sample from TSecr, which is safe for retransmitted data.
    fn sample_rtt(&mut self, now: Instant, seg: &TcpRepr) {
        match self.snd.rtt_probe {
            Some((seq, t)) if seg.ack > seq => {
                self.snd.rtt.sample(now.saturating_since(t));
                self.snd.rtt_probe = None;
            }
            None if self.opt.ts => {
                if let Some((_, ecr)) = seg.options.timestamp.filter(|t| t.1 != 0) {
                    let ms = self.opt.ts_now(now).wrapping_sub(ecr);
                    if ms < 60_000 {
                        self.snd.rtt.sample(Duration::from_millis(ms as u64));
                    }
                }
            }
            _ => {}
        }
    }

    /// The largest segment to cut. With segmentation offload, a segment carries at most a
    /// quarter of the congestion window (in whole segments): several segments stay in
    /// flight, so ACK clocking, dup ACKs and SACK recovery keep working (as Linux sizes its
    /// TSO bursts).
    fn max_segment(&self) -> usize {
        let full = self.full_seg();
        if self.tso_allowed() {
            (self.rec.cc.cwnd() / 4 / full * full).clamp(full, self.cfg.max_tso_segment)
        } else {
            // The data a full-sized segment carries beside its options: cutting at the MSS
            // itself left a runt of the options' size behind each retransmitted segment
            // (seen in a `simnet` capture: 1448 + 12 bytes).
            full
        }
    }

    /// Whether segments larger than the MSS may be handed to the device. A device that
    /// segments cuts at its MTU less the headers (the link's MSS, which the engine put in
    /// `cfg.mss`), so only while the connection's effective send MSS is that same size: RFC
    /// 9293 §3.7.1 "the effective send MSS must not exceed" what the peer announced, and a
    /// path MTU lowered by ICMP or black-hole detection lowers it too. Below it, segments are
    /// cut here at the effective MSS.
    pub(crate) fn tso_allowed(&self) -> bool {
        self.cfg.max_tso_segment > self.snd.mss && self.snd.mss >= self.cfg.mss as usize
    }

    /// How many of `avail` bytes at SND.NXT may go in one segment now: what the congestion
    /// window (plus RFC 3042 Limited Transmit) and the peer's window allow, at most
    /// `max_seg`, and on a resend not into data the receiver has SACKed.
    fn sendable(&self, avail: usize, max_seg: usize) -> usize {
        let flight = self.pipe();
        let usable_cc = (self.rec.cc.cwnd() + self.limited_transmit()).saturating_sub(flight);
        let usable = usable_cc.min(self.snd.window_room());
        let mut len = avail.min(usable).min(max_seg);
        if self.snd.nxt < self.snd.max {
            if let Some(next) = self.rec.sack.next_sacked_after(self.snd.nxt) {
                len = len.min(next - self.snd.nxt);
            }
        }
        len
    }

    /// New data (or a go-back-N resend after a timeout) from SND.NXT.
    pub(super) fn send_data(&mut self, now: Instant, c: &mut Counters, emit: &mut Emit) -> usize {
        if !matches!(
            self.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::Closing
                | State::LastAck
        ) {
            return 0;
        }
        let mut n = 0;
        let max_seg = self.max_segment();
        loop {
            // After a timeout, do not resend what the receiver has SACKed.
            if self.snd.nxt < self.snd.max {
                if let Some(end) = self.rec.sack.sacked_until(self.snd.nxt) {
                    self.snd.nxt = end.min(self.snd.max);
                    continue;
                }
            }
            let fin_pending = self.snd.fin_seq.is_some_and(|f| self.snd.nxt <= f);
            let avail = self.snd.data_end() - self.snd.nxt;
            if avail == 0 && !fin_pending {
                break;
            }
            let len = self.sendable(avail, max_seg);
            // RFC 9293 §3.8.6.2.1 sender SWS avoidance: a short segment of new data only if
            // it is at least half the largest window the peer offered. A resend after a
            // timeout fills a hole of whatever size the SACKed data left: holding it back
            // would leave the hole to the next timeout.
            let full = self.full_seg();
            let sws_blocked = self.snd.nxt == self.snd.max
                && len < avail
                && len < full
                && len < self.snd.max_wnd / 2;
            if avail > 0 && (len == 0 || sws_blocked) {
                // Nothing in flight and nothing sendable: the persist timer probes a zero
                // window (RFC 9293 §3.8.6.1) and is the SWS override timeout for a small one.
                if self.snd.all_acked() {
                    let at = now + self.snd.rtt.rto();
                    self.timers.set_if_idle(Timer::Persist, at);
                }
                break;
            }
            if len == avail && len < full && len > 0 && !fin_pending {
                // Nagle (RFC 9293 §3.7.4) with Minshall's refinement (as Linux): hold a small
                // segment only while another *small* segment is unacknowledged, so the tail
                // of a multi-segment message is not held behind the peer's delayed ACK.
                if !self.nodelay && self.snd.sml > self.snd.una && self.snd.nxt == self.snd.max {
                    break;
                }
            }
            let seq = self.snd.nxt;
            // RFC 4821 §7.5: one segment of the probe's size, cut from queued data.
            let probe = if self.snd.nxt == self.snd.max {
                self.plp_probe_size(avail)
            } else {
                None
            };
            let used = match probe {
                Some(size) => {
                    // A probe is one segment of its size: never cut at a zero-copy range.
                    let gathering = std::mem::replace(&mut self.gathering, false);
                    let used = self.emit_range_max(now, seq, avail, size, c, emit);
                    self.gathering = gathering;
                    self.plp_probe_sent(size, seq, seq + used);
                    used
                }
                None => self.emit_range(now, seq, len, c, emit),
            };
            if used == 0 {
                break;
            }
            // A segment cut short where a zero-copy range ends (`used < len`) is not a small
            // send of the application's: Nagle must not hold the next one behind it.
            if used < full && used == len {
                self.snd.sml = seq + used;
            }
            self.snd.nxt = seq + used;
            n += 1;
            if self.snd.fin_seq.is_some_and(|f| self.snd.nxt > f) {
                break;
            }
        }
        n
    }
}
