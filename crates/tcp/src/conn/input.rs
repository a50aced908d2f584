//! Segment arrival (RFC 9293 §3.10.7), with RFC 5961 hardening, RFC 7323 PAWS and the
//! header-prediction fast path.

use super::{Connection, State, TcpError};
use crate::counters::{Counter, Counters};
use crate::sack::DUP_THRESH;
use flowstack_wire::tcp::TcpRepr;
use flowstack_wire::{Duration, Instant, SeqNum};

impl Connection {
    /// Processes one arriving segment addressed to this connection.
    pub fn on_segment(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        self.stats.segs_in += 1;
        self.last_activity = now;
        if self.keepalive_at.is_some() {
            self.keepalive_sent = 0;
            self.keepalive_at = self.cfg.keepalive.map(|k| now + k.idle);
        }
        match self.state {
            State::Closed => {}
            State::SynSent => self.on_syn_sent(now, seg, c),
            _ => {
                if self.fast_path(now, seg, c) {
                    return;
                }
                self.on_synchronized(now, seg, c)
            }
        }
    }

    /// Header prediction (Van Jacobson, as in BSD and Linux): an in-order segment with only
    /// ACK (and maybe PSH) on an ESTABLISHED connection with nothing unusual pending takes a
    /// short path. Returns false to fall back to the full processing.
    fn fast_path(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) -> bool {
        let f = seg.flags.0 & !0x08; // ignore PSH
        if self.state != State::Established
            || f != 0x10
            || seg.seq != self.rcv_nxt
            || self.in_recovery
            || self.dupacks != 0
            || !self.ofo.is_empty()
            || seg.options.sack_len != 0
            || (seg.window as usize) << self.snd_wscale != self.snd_wnd
            || seg.ack > self.snd_max
            || seg.ack < self.snd_una
        {
            return false;
        }
        if self.ts_enabled {
            match seg.options.timestamp {
                Some((val, _)) if val.wrapping_sub(self.ts_recent) as i32 >= 0 => {
                    self.ts_recent = val
                }
                _ => return false,
            }
        }
        if seg.payload.is_empty() {
            if seg.ack <= self.snd_una {
                return false; // a duplicate ACK: the slow path counts it
            }
            // Pure ACK for new data.
            c.inc(Counter::TcpExtTCPHPAcks);
            self.stats.fast_path += 1;
            self.ack_advanced(now, seg, c);
            return true;
        }
        if seg.ack != self.snd_una || seg.payload.len() > self.recv_buf.window() {
            return false;
        }
        // In-order data that fits.
        c.inc(Counter::TcpExtTCPHPHits);
        self.stats.fast_path += 1;
        let n = {
            let _p = flowstack_prof::enter(flowstack_prof::Layer::SockAppend);
            self.recv_buf.enqueue(seg.payload)
        };
        self.rcv_nxt += n;
        self.stats.bytes_received += n as u64;
        self.schedule_ack(now, seg);
        true
    }

    /// RFC 9293 §3.10.7.4: SEGMENT ARRIVES in a synchronized state or SYN-RECEIVED.
    fn on_synchronized(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        let f = seg.flags;
        // A retransmitted SYN in SYN-RECEIVED means our SYN-ACK was lost: send it again.
        if self.state == State::SynReceived && f.syn() && !f.ack() && seg.seq == self.irs {
            self.snd_nxt = self.iss;
            return;
        }
        // RFC 7323 §5.3 PAWS: a timestamp older than TS.Recent marks an old duplicate.
        if self.ts_enabled && !f.rst() {
            if let Some((val, _)) = seg.options.timestamp {
                if (val.wrapping_sub(self.ts_recent) as i32) < 0 {
                    c.inc(Counter::TcpExtPAWSEstab);
                    self.ack_now = true;
                    return;
                }
            }
        }
        // First: sequence number acceptability.
        if !self.acceptable(seg) {
            c.inc(Counter::TcpExtTCPOutOfWindow);
            if !f.rst() {
                self.ack_now = true;
            }
            return;
        }
        if self.ts_enabled {
            if let Some((val, _)) = seg.options.timestamp {
                if seg.seq <= self.rcv_nxt {
                    self.ts_recent = val;
                }
            }
        }
        // Second: RST (RFC 5961 §3.2): exact match resets, otherwise a challenge ACK.
        if f.rst() {
            if seg.seq == self.rcv_nxt {
                self.on_reset(c);
            } else {
                self.challenge_ack(now, c);
            }
            return;
        }
        // Fourth: SYN in a synchronized state (RFC 5961 §4): challenge ACK, drop.
        if f.syn() {
            self.challenge_ack(now, c);
            return;
        }
        // Fifth: the ACK field.
        if !f.ack() {
            return;
        }
        if self.state == State::SynReceived {
            if self.snd_una < seg.ack && seg.ack <= self.snd_max {
                self.enter_established();
                self.snd_wnd = (seg.window as usize) << self.snd_wscale;
                self.max_snd_wnd = self.snd_wnd;
                self.snd_wl1 = seg.seq;
                self.snd_wl2 = seg.ack;
                self.arm_keepalive(now);
            } else {
                self.pending_rst = Some((seg.ack, None));
                return;
            }
        }
        // RFC 5961 §5.2: acceptable ACKs lie in [SND.UNA − MAX.SND.WND, SND.NXT].
        if seg.ack > self.snd_max {
            c.inc(Counter::TcpExtTCPACKSkippedInvalid);
            self.ack_now = true;
            return;
        }
        if seg.ack < self.snd_una - self.max_snd_wnd.max(1) {
            c.inc(Counter::TcpExtTCPACKSkippedInvalid);
            self.challenge_ack(now, c);
            return;
        }
        self.process_ack(now, seg, c);
        if self.state == State::Closed {
            return;
        }
        // Seventh: segment text.
        if !seg.payload.is_empty() {
            match self.state {
                State::Established | State::FinWait1 | State::FinWait2 => {
                    if self.app_closed {
                        // Data for a socket nobody will read: reset, as Linux does.
                        self.pending_rst = Some((self.snd_nxt, None));
                        self.error = Some(TcpError::Aborted);
                        self.enter_closed();
                        return;
                    }
                    self.accept_data(now, seg, c);
                }
                _ => {}
            }
        }
        // Eighth: FIN.
        if f.fin() {
            let fin_at = seg.seq + seg.payload.len();
            if fin_at == self.rcv_nxt {
                self.on_fin(now, c);
            } else if fin_at > self.rcv_nxt {
                self.ofo_fin = Some(fin_at);
            }
        }
    }

    /// RFC 9293 §3.10.7.4 "There are four cases for the acceptability test".
    fn acceptable(&self, seg: &TcpRepr) -> bool {
        let len = seg.segment_len();
        let wnd = self.rcv_adv - self.rcv_nxt;
        let wnd = wnd.max(self.recv_buf.window().min(1 << 30));
        let in_wnd = |s: SeqNum| s.in_range(self.rcv_nxt, self.rcv_nxt + wnd);
        match (len, wnd) {
            // "If the RCV.WND is zero, no segments will be acceptable, but special allowance
            // should be made to accept valid ACKs, URGs, and RSTs": a segment that starts at
            // RCV.NXT has its control fields processed; the seventh step drops its text and
            // answers with an ACK. Without this, two peers with full buffers ignore each
            // other's ACKs for ever (Linux's tcp_sequence admits it too).
            (_, 0) => seg.seq == self.rcv_nxt,
            (0, _) => in_wnd(seg.seq),
            _ => in_wnd(seg.seq) || in_wnd(seg.seq + len - 1),
        }
    }

    fn on_reset(&mut self, c: &mut Counters) {
        match self.state {
            State::SynReceived if self.passive => {}
            State::SynReceived => self.error = Some(TcpError::Refused),
            State::Established | State::CloseWait => {
                c.inc(Counter::TcpEstabResets);
                self.error = Some(TcpError::Reset);
            }
            State::FinWait1 | State::FinWait2 => self.error = Some(TcpError::Reset),
            _ => {}
        }
        self.enter_closed();
    }

    /// RFC 5961 §7: challenge ACKs, at most `challenge_ack_limit` per second per connection.
    fn challenge_ack(&mut self, now: Instant, c: &mut Counters) {
        if now.saturating_since(self.challenge_window) >= Duration::from_secs(1) {
            self.challenge_window = now;
            self.challenge_count = 0;
        }
        if self.challenge_count >= self.cfg.challenge_ack_limit {
            c.inc(Counter::TcpExtTCPChallengeACKLimited);
            return;
        }
        self.challenge_count += 1;
        c.inc(Counter::TcpExtTCPChallengeACK);
        self.ack_now = true;
    }

    /// The ACK field of an acceptable segment (RFC 9293 §3.10.7.4 fifth; RFC 5681; RFC 6582;
    /// RFC 6675).
    fn process_ack(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        let sack_news = self.sack_enabled
            && seg.options.sack_len > 0
            && self
                .sack
                .update(self.snd_una, self.snd_max, seg.options.sack_blocks());
        let window = (seg.window as usize) << self.snd_wscale;
        if seg.ack > self.snd_una {
            self.ack_advanced(now, seg, c);
        } else if seg.ack == self.snd_una
            && self.snd_max > self.snd_una
            && seg.payload.is_empty()
            && !seg.flags.fin()
            && (window == self.snd_wnd || sack_news)
        {
            // RFC 5681 §2 duplicate ACK.
            self.dupacks += 1;
            if self.in_recovery && !self.sack_enabled {
                // RFC 6582 §3.2 step 4: inflate by one segment per further duplicate.
                self.cc.inflate(self.mss);
            }
        } else if seg.payload.is_empty() && seg.ack == self.snd_una {
            c.inc(Counter::TcpExtTCPPureAcks);
        }
        if !self.in_recovery
            && self.snd_max > self.snd_una
            && (self.dupacks as usize >= self.dup_thresh()
                || (self.sack_enabled
                    && self
                        .sack
                        .is_lost(self.snd_una, self.full_seg(), self.dup_thresh())))
            && self.may_enter_recovery()
        {
            self.enter_recovery(c);
        }
        if sack_news {
            self.lost_retransmission(c);
        }
        // Window update (RFC 9293 §3.10.7.4: SND.WL1/SND.WL2 rule).
        if self.snd_wl1 < seg.seq || (self.snd_wl1 == seg.seq && self.snd_wl2 <= seg.ack) {
            let opened = self.snd_wnd == 0 && window > 0;
            self.snd_wnd = window;
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
            self.max_snd_wnd = self.max_snd_wnd.max(window);
            if opened {
                self.persist_at = None;
                self.persist_backoff = 0;
            }
        }
    }

    pub(crate) fn enter_recovery(&mut self, c: &mut Counters) {
        c.inc(Counter::TcpExtTCPFastRetrans);
        self.stats.fast_retransmits += 1;
        self.in_recovery = true;
        self.recover = self.snd_max;
        self.high_rxt = self.snd_una;
        self.rexmit_head = true;
        self.cc.on_loss(self.flight());
        if !self.sack_enabled {
            // RFC 6582 §3.2 step 2: cwnd = ssthresh + 3·SMSS.
            self.cc.inflate(DUP_THRESH * self.mss);
        }
        // Karn: the timed segment may be retransmitted.
        self.rtt_probe = None;
    }

    /// SND.UNA moves forward to `ack`.
    pub(crate) fn ack_advanced(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        let ack = seg.ack;
        let mut acked = ack - self.snd_una;
        if self.snd_una == self.iss {
            acked -= 1; // our SYN
        }
        let fin_acked = self.fin_seq.is_some_and(|f| ack > f);
        if fin_acked && self.snd_una <= self.fin_seq.unwrap() {
            acked -= 1;
        }
        let acked = acked.min(self.send_buf.len());
        {
            let _p = flowstack_prof::enter(flowstack_prof::Layer::BufRelease);
            self.send_buf.consume(acked);
        }
        self.stats.bytes_acked += acked as u64;
        // RTT: one timed segment per round trip on our nanosecond clock (finer than the
        // 1 ms timestamp clock); when none is timed (Karn: retransmissions void it), RFC 7323
        // RTTM takes the sample from TSecr, which is safe for retransmitted data.
        match self.rtt_probe {
            Some((seq, t)) if ack > seq => {
                self.rtt.sample(now.saturating_since(t));
                self.rtt_probe = None;
            }
            None if self.ts_enabled => {
                if let Some((_, ecr)) = seg.options.timestamp.filter(|t| t.1 != 0) {
                    let ms = self.ts_now(now).wrapping_sub(ecr);
                    if ms < 60_000 {
                        self.rtt.sample(Duration::from_millis(ms as u64));
                    }
                }
            }
            _ => {}
        }
        self.snd_una = ack;
        if self.snd_nxt < ack {
            self.snd_nxt = ack;
        }
        self.sack.advance(ack);
        self.retries = 0;
        self.dupacks = 0;
        if self.in_recovery {
            if ack >= self.recover {
                // RFC 6582 §3.2 step 3 full acknowledgment.
                self.in_recovery = false;
                self.cc.exit_recovery();
            } else {
                // Partial acknowledgment: retransmit the next hole at once.
                if !self.sack_enabled {
                    self.cc.deflate(acked);
                    self.cc.inflate(self.mss);
                }
                self.rexmit_head = true;
                self.high_rxt = self.high_rxt.max(ack);
            }
        } else {
            self.cc.on_ack(now, acked, self.rtt.srtt());
        }
        // RFC 6298 §5.2/5.3: restart the timer if data remains, stop it otherwise.
        self.rto_at = (self.snd_max > self.snd_una).then(|| now + self.rtt.rto());
        if fin_acked {
            match self.state {
                State::FinWait1 => {
                    self.state = State::FinWait2;
                    self.deadline = Some(now + self.cfg.fin_wait2_timeout);
                }
                State::Closing => self.enter_time_wait(now, c),
                State::LastAck => self.enter_closed(),
                _ => {}
            }
        }
    }

    /// Seventh step: place data in the receive buffer (in order) or the reassembly area.
    fn accept_data(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        let skip = self.rcv_nxt - seg.seq; // already received part
        if skip >= seg.payload.len() {
            // Entirely old: a retransmission the peer sent because our ACK was lost.
            self.ack_now = true;
            return;
        }
        let start = seg.seq + skip;
        let data = &seg.payload[skip..];
        let rel = start - self.rcv_nxt;
        if rel == 0 {
            let _p = flowstack_prof::enter(flowstack_prof::Layer::SockAppend);
            let n = self.recv_buf.write_at(0, data);
            if n < data.len() {
                // Text beyond the window is dropped; the ACK tells the sender the window.
                c.inc(Counter::TcpExtTCPRcvQDrop);
                self.ack_now = true;
            }
            self.recv_buf.commit(n);
            self.rcv_nxt += n;
            self.stats.bytes_received += n as u64;
            let mut filled = false;
            while let Some(end) = self.ofo.pop_front(self.rcv_nxt) {
                let more = end - self.rcv_nxt;
                self.recv_buf.commit(more);
                self.stats.bytes_received += more as u64;
                self.rcv_nxt = end;
                filled = true;
            }
            if filled {
                // RFC 5681 §4.2: ACK at once when a segment fills a gap.
                self.ack_now = true;
            }
            if self.ofo_fin == Some(self.rcv_nxt) {
                self.ofo_fin = None;
                self.on_fin(now, c);
                return;
            }
            self.schedule_ack(now, seg);
        } else {
            let n = self.recv_buf.write_at(rel, data);
            if n == 0 || self.ofo.add(start, start + n).is_err() {
                c.inc(Counter::TcpExtTCPOFODrop);
            } else {
                c.inc(Counter::TcpExtTCPOFOQueue);
            }
            // RFC 5681 §4.2: an out-of-order segment gets an immediate (duplicate) ACK.
            self.ack_now = true;
        }
    }

    /// Delayed-ACK policy (RFC 1122 §4.2.3.2, RFC 5681 §4.2).
    fn schedule_ack(&mut self, now: Instant, seg: &TcpRepr) {
        let had_unacked = self.unacked_bytes > 0;
        self.unacked_bytes += seg.payload.len();
        if !self.cfg.delayed_ack
            || self.quickack > 0
            || self.unacked_bytes >= 2 * self.full_seg()
            // The tail of a multi-segment message: ACK it now so a Nagle-limited sender
            // is not held for the delayed-ACK timer.
            || (had_unacked && seg.flags.psh() && seg.payload.len() < self.full_seg())
        {
            self.quickack = self.quickack.saturating_sub(1);
            self.ack_now = true;
        } else if self.delack_at.is_none() {
            self.delack_at = Some(now + self.cfg.delayed_ack_timeout);
        }
    }

    /// Our peer's FIN is in sequence (RFC 9293 §3.10.7.4 eighth).
    fn on_fin(&mut self, now: Instant, c: &mut Counters) {
        self.rcv_nxt += 1;
        self.fin_received = true;
        self.ack_now = true;
        match self.state {
            State::SynReceived | State::Established => {
                self.state = State::CloseWait;
                self.deadline = Some(now + self.cfg.close_wait_timeout);
            }
            State::FinWait1 => {
                self.state = State::Closing;
            }
            State::FinWait2 => self.enter_time_wait(now, c),
            State::TimeWait => self.deadline = Some(now + self.cfg.time_wait),
            _ => {}
        }
    }

    pub(crate) fn enter_time_wait(&mut self, now: Instant, c: &mut Counters) {
        c.inc(Counter::TcpExtTW);
        // Nothing more will be sent; unread received data (if any) stays for the application.

        self.state = State::TimeWait;
        self.rto_at = None;
        self.persist_at = None;
        self.keepalive_at = None;
        self.deadline = Some(now + self.cfg.time_wait);
    }

    pub(crate) fn arm_keepalive(&mut self, now: Instant) {
        self.keepalive_at = self.cfg.keepalive.map(|k| now + k.idle);
    }
}
