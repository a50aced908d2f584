//! Building segments: SYN/SYN-ACK, data (Nagle, sender SWS avoidance, congestion and flow
//! control, SACK-based and NewReno retransmission), FIN, ACKs, window updates and probes.

use super::{Connection, State};
use crate::counters::{Counter, Counters};
use flowstack_wire::tcp::{Flags, SackBlock, TcpOptions, TcpRepr, MAX_SACK_BLOCKS};
use flowstack_wire::{Instant, SeqNum};

impl Connection {
    /// Emits every segment the connection wants to send now, through `emit`. Returns the
    /// number of segments emitted.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        c: &mut Counters,
        emit: &mut dyn FnMut(&TcpRepr),
    ) -> usize {
        let _p = flowstack_prof::enter(flowstack_prof::Layer::TcpOutput);
        let mut n = 0;
        if let Some((seq, ack)) = self.pending_rst.take() {
            let mut r = self.base(seq, Flags::RST);
            if let Some(a) = ack {
                r.flags |= Flags::ACK;
                r.ack = a;
            }
            r.window = 0;
            r.options = TcpOptions::default();
            emit(&r);
            c.inc(Counter::TcpOutRsts);
            c.inc(Counter::TcpOutSegs);
            return 1;
        }
        match self.state {
            State::Closed => return 0,
            State::SynSent | State::SynReceived => {
                if self.snd_nxt == self.iss {
                    self.send_syn(now, c, emit);
                    n += 1;
                }
                if self.state == State::SynSent {
                    return n;
                }
            }
            _ => {}
        }
        if self.state.is_synchronized() {
            if self.in_recovery {
                n += self.send_recovery(now, c, emit);
            }
            n += self.send_data(now, c, emit);
            if self.probe_now {
                self.probe_now = false;
                let room = (self.snd_una + self.snd_wnd) - self.snd_nxt;
                let avail = (self.snd_una_data() + self.send_buf.len()) - self.snd_nxt;
                if room > 0 && avail > 0 {
                    // SWS override: the window is too small for a full segment, send what fits.
                    let seq = self.snd_nxt;
                    let used = self.emit_range(now, seq, room.min(avail).min(self.mss), c, emit);
                    self.snd_nxt = seq + used;
                } else {
                    // Zero-window probe / keepalive: an ACK with an old sequence number makes
                    // the peer answer with its current window (as Linux's tcp_xmit_probe_skb).
                    let r = self.ack_segment(now, self.snd_una - 1);
                    self.emit_counted(&r, c, emit);
                }
                n += 1;
            }
        }
        if self.ack_now && n == 0 && self.state != State::SynSent {
            let r = self.ack_segment(now, self.ack_seq());
            self.emit_counted(&r, c, emit);
            n += 1;
        }
        n
    }

    fn emit_counted(&mut self, r: &TcpRepr, c: &mut Counters, emit: &mut dyn FnMut(&TcpRepr)) {
        emit(r);
        c.inc(Counter::TcpOutSegs);
        self.stats.segs_out += 1;
        if r.flags.ack() {
            self.ack_sent();
        }
    }

    fn ack_sent(&mut self) {
        self.ack_now = false;
        self.delack_at = None;
        self.unacked_bytes = 0;
    }

    /// Header fields common to every segment: ports, ACK, window, timestamps.
    fn base(&mut self, seq: SeqNum, flags: Flags) -> TcpRepr<'static> {
        let win = self.advertise();
        TcpRepr {
            src_port: self.tuple.local_port,
            dst_port: self.tuple.remote_port,
            seq,
            ack: self.rcv_nxt,
            flags: flags | Flags::ACK,
            window: win,
            urgent: 0,
            options: TcpOptions::default(),
            payload: &[],
        }
    }

    /// The window to advertise, with receiver-side SWS avoidance (RFC 9293 §3.8.6.2.2): the
    /// right edge moves only by at least min(buffer/2, MSS), and never moves left.
    fn advertise(&mut self) -> u16 {
        let free = self.recv_buf.window();
        let right = self.rcv_nxt + free;
        let grow = right - self.rcv_adv;
        let thresh = (self.recv_buf.capacity() / 2).min(self.mss);
        if self.rcv_adv < self.rcv_nxt || grow >= thresh || free == self.recv_buf.capacity() {
            // Round down to what the scaled field can express exactly.
            let wnd = ((free >> self.rcv_wscale).min(65535)) << self.rcv_wscale;
            self.rcv_adv = self.rcv_adv.max(self.rcv_nxt + wnd);
        }
        (((self.rcv_adv - self.rcv_nxt) >> self.rcv_wscale).min(65535)) as u16
    }

    fn with_options(&self, now: Instant, r: &mut TcpRepr) {
        if self.ts_enabled {
            r.options.timestamp = Some((self.ts_now(now), self.ts_recent));
        }
        if self.sack_enabled && !self.ofo.is_empty() {
            let mut blocks = [(SeqNum(0), SeqNum(0)); MAX_SACK_BLOCKS];
            let k = self.ofo.sack_blocks(&mut blocks);
            for (i, b) in blocks[..k].iter().enumerate() {
                r.options.sack[i] = SackBlock {
                    left: b.0,
                    right: b.1,
                };
            }
            r.options.sack_len = k as u8;
        }
    }

    /// The sequence number of a segment without text: RFC 9293's SND.NXT, which is our
    /// `snd_max` (`snd_nxt` moves back for go-back-N), kept inside the peer's window.
    ///
    /// After a timeout `snd_nxt` can lie below the peer's RCV.NXT; an ACK carrying it would be
    /// unacceptable there (its ACK field and window ignored), and an ACK below the peer's
    /// SND.WL1 cannot update the window it tells. Capping at the window's right edge keeps
    /// the ACK acceptable to a peer whose window shrank (as Linux's tcp_acceptable_seq).
    fn ack_seq(&self) -> SeqNum {
        let wnd_end = self.snd_una + self.snd_wnd;
        if self.snd_max <= wnd_end {
            self.snd_max
        } else {
            wnd_end.max(self.snd_nxt)
        }
    }

    fn ack_segment(&mut self, now: Instant, seq: SeqNum) -> TcpRepr<'static> {
        let mut r = self.base(seq, Flags::ACK);
        self.with_options(now, &mut r);
        r
    }

    fn send_syn(&mut self, now: Instant, c: &mut Counters, emit: &mut dyn FnMut(&TcpRepr)) {
        let active = self.state == State::SynSent;
        let mut r = self.base(self.iss, Flags::SYN);
        if active {
            r.flags = Flags::SYN;
            r.ack = SeqNum(0);
        }
        // RFC 7323 §2.2: the window in a SYN is never scaled.
        r.window = self.recv_buf.window().min(65535) as u16;
        r.options.mss = Some(self.cfg.mss);
        let offer_ws = if active {
            self.cfg.window_scaling
        } else {
            self.peer_syn_ws.is_some()
        };
        if offer_ws {
            r.options.window_scale = Some(self.rcv_wscale);
        }
        if (active && self.cfg.sack) || (!active && self.sack_enabled) {
            r.options.sack_permitted = true;
        }
        if (active && self.cfg.timestamps) || (!active && self.ts_enabled) {
            r.options.timestamp = Some((self.ts_now(now), if active { 0 } else { self.ts_recent }));
        }
        if self.snd_max > self.iss {
            c.inc(Counter::TcpRetransSegs);
            self.stats.retransmits += 1;
        } else if active {
            c.inc(Counter::TcpActiveOpens);
        }
        self.rcv_adv = self.rcv_nxt + r.window as usize;
        self.emit_counted(&r, c, emit);
        if self.rtt_probe.is_none() && self.snd_max == self.iss {
            self.rtt_probe = Some((self.iss, now));
        }
        self.snd_nxt = self.iss + 1;
        self.snd_max = self.snd_max.max(self.snd_nxt);
        self.rto_at.get_or_insert(now + self.rtt.rto());
    }

    /// Emits data (and FIN) in `[seq, seq+len)` taken from the send buffer.
    fn emit_range(
        &mut self,
        now: Instant,
        seq: SeqNum,
        len: usize,
        c: &mut Counters,
        emit: &mut dyn FnMut(&TcpRepr),
    ) -> usize {
        let off = seq - self.snd_una_data();
        let retrans = seq < self.snd_max;
        let mut r = self.base(seq, Flags::NONE);
        self.with_options(now, &mut r);
        // RFC 6691: the MSS counts data only; options in this segment take from it.
        let room = self.mss.max(self.cfg.max_tso_segment) - r.options.buffer_len();
        let data_len = self.send_buf.len().saturating_sub(off).min(len).min(room);
        // A segment is never cut short at the ring's wrap point (that would make needless
        // small segments): a straddling payload is gathered into a scratch buffer.
        let payload = self.send_buf.gather(off, data_len, &mut self.tx_scratch);
        let sent = payload.len();
        // The FIN rides on the segment whose data ends where the FIN sits.
        let fin = self.fin_seq == Some(seq + sent);
        if fin {
            r.flags |= Flags::FIN;
        }
        if sent > 0 && off + sent == self.send_buf.len() {
            r.flags |= Flags::PSH;
        }
        let r = TcpRepr { payload, ..r };
        emit(&r);
        c.inc(Counter::TcpOutSegs);
        self.stats.segs_out += 1;
        self.ack_sent();
        let occupied = sent + fin as usize;
        if retrans {
            c.inc(Counter::TcpRetransSegs);
            self.stats.retransmits += 1;
            self.rexmit_mark = Some(self.snd_max);
        } else if self.rtt_probe.is_none() {
            self.rtt_probe = Some((seq, now));
        }
        let end = seq + occupied;
        if end > self.snd_max {
            self.snd_max = end;
        }
        self.rto_at.get_or_insert(now + self.rtt.rto());
        occupied
    }

    /// New data (or a go-back-N resend after a timeout) from SND.NXT.
    fn send_data(
        &mut self,
        now: Instant,
        c: &mut Counters,
        emit: &mut dyn FnMut(&TcpRepr),
    ) -> usize {
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
        // With segmentation offload, a segment carries at most a quarter of the congestion
        // window (in whole segments): several segments stay in flight, so ACK clocking, dup
        // ACKs and SACK recovery keep working (as Linux sizes its TSO bursts).
        let full = self.full_seg();
        let max_seg = if self.cfg.max_tso_segment > self.mss {
            (self.cc.cwnd() / 4 / full * full).clamp(full, self.cfg.max_tso_segment)
        } else {
            self.mss
        };
        loop {
            // After a timeout, do not resend what the receiver has SACKed.
            if self.snd_nxt < self.snd_max {
                if let Some(end) = self.sack.sacked_until(self.snd_nxt) {
                    self.snd_nxt = end.min(self.snd_max);
                    continue;
                }
            }
            let data_end = self.snd_una_data() + self.send_buf.len();
            let fin_pending = self.fin_seq.is_some_and(|f| self.snd_nxt <= f);
            let avail = data_end - self.snd_nxt;
            if avail == 0 && !fin_pending {
                break;
            }
            let flight = self.pipe();
            let usable_cc = (self.cc.cwnd() + self.limited_transmit()).saturating_sub(flight);
            let usable_rw = (self.snd_una + self.snd_wnd) - self.snd_nxt;
            let usable = usable_cc.min(usable_rw);
            let mut len = avail.min(usable).min(max_seg);
            if self.snd_nxt < self.snd_max {
                if let Some(next) = self.sack.next_sacked_after(self.snd_nxt) {
                    len = len.min(next - self.snd_nxt);
                }
            }
            // RFC 9293 §3.8.6.2.1 sender SWS avoidance: a short segment of new data only if
            // it is at least half the largest window the peer offered. A resend after a
            // timeout fills a hole of whatever size the SACKed data left: holding it back
            // would leave the hole to the next timeout.
            let full = self.full_seg();
            let sws_blocked = self.snd_nxt == self.snd_max
                && len < avail
                && len < full
                && len < self.max_snd_wnd / 2;
            if avail > 0 && (len == 0 || sws_blocked) {
                // Nothing in flight and nothing sendable: the persist timer probes a zero
                // window (RFC 9293 §3.8.6.1) and is the SWS override timeout for a small one.
                if self.snd_max == self.snd_una && self.persist_at.is_none() {
                    self.persist_at = Some(now + self.rtt.rto());
                }
                break;
            }
            if len == avail && len < full && len > 0 && !fin_pending {
                // Nagle (RFC 9293 §3.7.4) with Minshall's refinement (as Linux): hold a small
                // segment only while another *small* segment is unacknowledged, so the tail
                // of a multi-segment message is not held behind the peer's delayed ACK.
                if !self.cfg.nodelay && self.snd_sml > self.snd_una && self.snd_nxt == self.snd_max
                {
                    break;
                }
            }
            let seq = self.snd_nxt;
            let used = self.emit_range(now, seq, len, c, emit);
            if used == 0 {
                break;
            }
            if used < full {
                self.snd_sml = seq + used;
            }
            self.snd_nxt = seq + used;
            n += 1;
            if self.fin_seq.is_some_and(|f| self.snd_nxt > f) {
                break;
            }
        }
        n
    }

    /// Bytes considered in the network (RFC 6675 "pipe" when SACK recovery is running).
    fn pipe(&self) -> usize {
        let flight = self.snd_nxt - self.snd_una;
        if self.in_recovery && self.sack_enabled {
            let lost = self.sack.hole_bytes_from(self.high_rxt.max(self.snd_una));
            flight.saturating_sub(self.sack.sacked_bytes() + lost)
        } else {
            flight
        }
    }

    /// Loss recovery retransmissions: the head after entry or a partial ACK, then (with
    /// SACK) the holes the scoreboard marks lost (RFC 6675 §5 NextSeg rule 1).
    fn send_recovery(
        &mut self,
        now: Instant,
        c: &mut Counters,
        emit: &mut dyn FnMut(&TcpRepr),
    ) -> usize {
        let mut n = 0;
        if self.rexmit_head {
            self.rexmit_head = false;
            let una = self.snd_una;
            // Segments as the original ones were cut (the MSS less the options), so holes
            // stay whole segments.
            let full = self.full_seg();
            let len = match self.sack.next_hole(una) {
                Some((s, e)) if s == una => (e - s).min(full),
                _ => full,
            };
            let used = self.emit_range(now, una, len, c, emit);
            self.high_rxt = self.high_rxt.max(una + used);
            n += 1;
        }
        if !self.sack_enabled {
            return n;
        }
        while self.pipe() < self.cc.cwnd() {
            let from = self.high_rxt.max(self.snd_una);
            let Some((s, e)) = self.sack.next_hole(from) else {
                break;
            };
            if !self.sack.is_lost(s, self.full_seg(), self.dup_thresh()) {
                break;
            }
            let len = (e - s).min(self.full_seg());
            let used = self.emit_range(now, s, len, c, emit);
            if used == 0 {
                break;
            }
            c.inc(Counter::TcpExtTCPSackRecovery);
            self.high_rxt = s + used;
            n += 1;
        }
        n
    }
}
