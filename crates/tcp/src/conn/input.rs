//! Segment arrival (RFC 9293 §3.10.7), with RFC 5961 hardening, RFC 7323 PAWS and the
//! header-prediction fast path.

use super::{Connection, State, TcpError, Timer};
use crate::counters::{Counter, Counters};
use flowstack_wire::tcp::TcpRepr;
use flowstack_wire::{Duration, Instant};

/// RFC 5961 §7 rate limit of challenge ACKs: at most a configured number per second.
pub(crate) struct ChallengeAcks {
    /// Start of the current one-second window.
    window: Instant,
    /// Challenge ACKs sent in it.
    count: u32,
}

impl ChallengeAcks {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            window: now,
            count: 0,
        }
    }

    /// Whether another challenge ACK may be sent at `now` (and counts it if so).
    fn allow(&mut self, now: Instant, limit: u32) -> bool {
        if now.saturating_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.count = 0;
        }
        if self.count >= limit {
            return false;
        }
        self.count += 1;
        true
    }
}

impl Connection {
    /// Processes one arriving segment addressed to this connection.
    pub fn on_segment(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        self.on_segment_to(now, seg, c, &mut |_| 0)
    }

    /// [`Connection::on_segment`], handing in-order data to a reader first: when a segment
    /// takes the header-prediction path, `deliver(bytes)` is offered what the receive buffer
    /// holds, then the segment's payload, in order, and answers how many leading bytes it
    /// took. Those are read (as by [`Connection::consume`]); the payload it took never
    /// enters the buffer — a reader with room elsewhere, such as the offload daemon's
    /// application areas, saves a copy through it. What it leaves is queued as usual, so
    /// the receive window still closes when the reader stops taking.
    pub fn on_segment_to(
        &mut self,
        now: Instant,
        seg: &TcpRepr,
        c: &mut Counters,
        deliver: &mut dyn FnMut(&[u8]) -> usize,
    ) {
        self.stats.segs_in += 1;
        self.timers.last_activity = now;
        if self.timers.is_armed(Timer::Keepalive) {
            self.timers.keepalive_sent = 0;
            self.arm_keepalive(now);
        }
        match self.state {
            State::Closed => {}
            State::SynSent => self.on_syn_sent(now, seg, c),
            _ => {
                if self.fast_path(now, seg, c, deliver) {
                    return;
                }
                self.on_synchronized(now, seg, c)
            }
        }
    }

    /// Header prediction (Van Jacobson, as in BSD and Linux): an in-order segment with only
    /// ACK (and maybe PSH) on an ESTABLISHED connection with nothing unusual pending takes a
    /// short path. Returns false to fall back to the full processing.
    fn fast_path(
        &mut self,
        now: Instant,
        seg: &TcpRepr,
        c: &mut Counters,
        deliver: &mut dyn FnMut(&[u8]) -> usize,
    ) -> bool {
        let f = seg.flags.0 & !0x08; // ignore PSH
        if self.state != State::Established
            || f != 0x10
            || seg.seq != self.rcv.nxt
            || self.rec.in_recovery
            || self.rec.dupacks != 0
            || !self.rcv.ofo.is_empty()
            || seg.options.sack_len != 0
            || (seg.window as usize) << self.opt.snd_wscale != self.snd.wnd
            || seg.ack > self.snd.max
            || seg.ack < self.snd.una
        {
            return false;
        }
        if self.opt.ts {
            match seg.options.timestamp {
                Some((val, _)) if !self.opt.ts_is_old(val) => self.opt.ts_recent = val,
                _ => return false,
            }
        }
        if seg.payload.is_empty() {
            if seg.ack <= self.snd.una {
                return false; // a duplicate ACK: the slow path counts it
            }
            // Pure ACK for new data.
            c.inc(Counter::TcpExtTCPHPAcks);
            self.stats.fast_path += 1;
            self.ack_advanced(now, seg, c);
            return true;
        }
        if seg.ack != self.snd.una || seg.payload.len() > self.rcv.buf.window() {
            return false;
        }
        // In-order data that fits.
        c.inc(Counter::TcpExtTCPHPHits);
        self.stats.fast_path += 1;
        let n = {
            let _p = flowstack_prof::enter(flowstack_prof::Layer::SockAppend);
            let taken = self.hand_over(seg.payload, deliver);
            taken + self.rcv.buf.enqueue(&seg.payload[taken..])
        };
        self.rcv.nxt += n;
        self.stats.bytes_received += n as u64;
        self.schedule_ack(now, seg);
        true
    }

    /// Offers `deliver` the buffered bytes, then `data` (in order); returns how much of
    /// `data` it took (nothing unless it took every buffered byte first).
    fn hand_over(&mut self, data: &[u8], deliver: &mut dyn FnMut(&[u8]) -> usize) -> usize {
        let mut read = false;
        let mut delivered = 0;
        while !self.rcv.buf.is_empty() {
            let (a, _) = self.rcv.buf.slices(0, self.rcv.buf.len());
            let k = deliver(a).min(a.len());
            if k == 0 {
                break;
            }
            self.rcv.buf.consume(k);
            delivered += k;
            read = true;
        }
        let mut taken = 0;
        while self.rcv.buf.is_empty() && taken < data.len() {
            let k = deliver(&data[taken..]).min(data.len() - taken);
            if k == 0 {
                break;
            }
            taken += k;
        }
        if self.rcv.limit != u32::MAX {
            let used = (delivered + taken).min(u32::MAX as usize) as u32;
            self.rcv.limit = self.rcv.limit.saturating_sub(used);
        }
        if read {
            self.after_read();
        }
        taken
    }

    /// RFC 9293 §3.10.7.4: SEGMENT ARRIVES in a synchronized state or SYN-RECEIVED.
    fn on_synchronized(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        let f = seg.flags;
        // SYN with RST or FIN never comes from a correct peer (scanners and attacks send
        // them). They are not dropped at parse: on a synchronized connection RFC 5961 §4
        // answers any SYN with a challenge ACK, and RFC 9293 §3.10.7.4 processes the SYN
        // before the FIN — so both combinations get the challenge ACK below; an RST+SYN
        // never resets (an exact RST must come alone).
        let bad_syn = f.syn() && (f.rst() || f.fin());
        if bad_syn {
            c.inc(Counter::TcpExtTCPBadSynFlags);
        }
        // A retransmitted SYN in SYN-RECEIVED means our SYN-ACK was lost: send it again.
        if self.state == State::SynReceived
            && f.syn()
            && !f.ack()
            && !bad_syn
            && seg.seq == self.rcv.irs
        {
            self.snd.nxt = self.snd.iss;
            return;
        }
        // RFC 7323 §5.3 PAWS: a timestamp older than TS.Recent marks an old duplicate.
        if self.opt.ts && !f.rst() {
            if let Some((val, _)) = seg.options.timestamp {
                if self.opt.ts_is_old(val) {
                    c.inc(Counter::TcpExtPAWSEstab);
                    self.rcv.ack_now = true;
                    // A late original overtaken by its retransmission (which carried a newer
                    // timestamp) fails PAWS: it is still a duplicate to report (as Linux).
                    self.old_duplicate(seg);
                    return;
                }
            }
        }
        // First: sequence number acceptability.
        if !self.rcv.acceptable(seg) {
            c.inc(Counter::TcpExtTCPOutOfWindow);
            if !f.rst() {
                self.rcv.ack_now = true;
                self.old_duplicate(seg);
            }
            return;
        }
        if self.opt.ts {
            if let Some((val, _)) = seg.options.timestamp {
                if seg.seq <= self.rcv.nxt {
                    self.opt.ts_recent = val;
                }
            }
        }
        // Second: RST (RFC 5961 §3.2): exact match resets, otherwise a challenge ACK.
        if f.rst() {
            if seg.seq == self.rcv.nxt && !f.syn() {
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
            if self.snd.una < seg.ack && seg.ack <= self.snd.max {
                self.enter_established();
                let wnd = (seg.window as usize) << self.opt.snd_wscale;
                self.snd.init_window(seg.seq, seg.ack, wnd);
                self.arm_keepalive(now);
            } else {
                self.pending_rst = Some((seg.ack, None));
                return;
            }
        }
        // RFC 5961 §5.2: acceptable ACKs lie in [SND.UNA − MAX.SND.WND, SND.NXT].
        if seg.ack > self.snd.max {
            c.inc(Counter::TcpExtTCPACKSkippedInvalid);
            self.rcv.ack_now = true;
            return;
        }
        if seg.ack < self.snd.una - self.snd.max_wnd.max(1) {
            c.inc(Counter::TcpExtTCPACKSkippedInvalid);
            self.challenge_ack(now, c);
            return;
        }
        self.process_ack(now, seg, c);
        if self.state == State::Closed {
            return;
        }
        self.on_text_and_fin(now, seg, c);
    }

    /// RFC 9293 §3.10.7.4 seventh and eighth steps: the segment text, then the FIN bit.
    ///
    /// The sixth step, URG, is not implemented: urgent data stays inline in the stream (RFC
    /// 6093 §6 recommends that applications not use it, and the byte it marks is delivered
    /// like any other). An urgent pointer beyond the segment's data is counted and ignored.
    fn on_text_and_fin(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        if seg.flags.contains(flowstack_wire::tcp::Flags::URG)
            && seg.urgent as usize > seg.payload.len()
        {
            c.inc(Counter::TcpExtTCPUrgBeyondData);
        }
        // Seventh: segment text.
        if !seg.payload.is_empty() {
            match self.state {
                State::Established | State::FinWait1 | State::FinWait2 => {
                    if self.rcv.app_closed {
                        // Data for a socket nobody will read: reset, as Linux does.
                        self.pending_rst = Some((self.snd.nxt, None));
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
        if seg.flags.fin() {
            let fin_at = seg.seq + seg.payload.len();
            if fin_at == self.rcv.nxt {
                self.on_fin(now, c);
            } else if fin_at > self.rcv.nxt {
                self.rcv.ofo_fin = Some(fin_at);
            }
        }
    }

    /// RFC 2883 §4: text entirely below RCV.NXT — a retransmission of data we hold, sent
    /// because the peer thought it lost — is reported in the ACK this segment draws, as the
    /// first SACK block. Text older than a receive buffer is no retransmission of ours to
    /// explain (a forged or ancient segment) and is not reported.
    fn old_duplicate(&mut self, seg: &TcpRepr) {
        let end = seg.seq + seg.payload.len();
        if self.opt.sack
            && !seg.payload.is_empty()
            && end <= self.rcv.nxt
            && self.rcv.nxt - seg.seq <= self.rcv.buf.capacity()
        {
            self.rcv.note_duplicate(seg.seq, end);
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
        if !self.challenge.allow(now, self.cfg.challenge_ack_limit) {
            c.inc(Counter::TcpExtTCPChallengeACKLimited);
            return;
        }
        c.inc(Counter::TcpExtTCPChallengeACK);
        self.rcv.ack_now = true;
    }

    /// The ACK field of an acceptable segment (RFC 9293 §3.10.7.4 fifth; RFC 5681; RFC 6582;
    /// RFC 6675).
    fn process_ack(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        if self.opt.sack {
            self.count_bogus_sacks(seg, c);
            self.on_dsack(seg, c);
        }
        let sack_news = self.opt.sack
            && seg.options.sack_len > 0
            && self
                .rec
                .sack
                .update(self.snd.una, self.snd.max, seg.options.sack_blocks());
        let window = (seg.window as usize) << self.opt.snd_wscale;
        let ack_advanced = seg.ack > self.snd.una;
        if ack_advanced {
            self.ack_advanced(now, seg, c);
        } else if seg.ack == self.snd.una
            && self.snd.max > self.snd.una
            && seg.payload.is_empty()
            && !seg.flags.fin()
            && (window == self.snd.wnd || sack_news)
        {
            // RFC 5681 §2 duplicate ACK.
            self.rec.on_dupack(self.snd.mss, self.opt.sack);
        } else if seg.payload.is_empty() && seg.ack == self.snd.una {
            c.inc(Counter::TcpExtTCPPureAcks);
        }
        if sack_news && !ack_advanced {
            // An RFC 4821 probe SACKed is delivered.
            self.plp_on_ack(now, self.snd.una, c);
        }
        self.detect_loss(now, c);
        if sack_news {
            self.lost_retransmission(c);
        }
        if self.rack_on() && sack_news && !ack_advanced {
            self.rack_on_ack(now, seg, c);
        }
        // Window update (RFC 9293 §3.10.7.4: SND.WL1/SND.WL2 rule).
        if self.snd.update_window(seg.seq, seg.ack, window) {
            self.timers.cancel(Timer::Persist);
            self.timers.reset_persist();
        }
    }

    /// SACK blocks the scoreboard ignores, counted as Linux's TCPSACKDiscard: inverted or
    /// empty blocks, blocks reaching past SND.NXT (data never sent), and blocks below
    /// SND.UNA other than a first-block D-SACK (RFC 2883 §4).
    fn count_bogus_sacks(&self, seg: &TcpRepr, c: &mut Counters) {
        for (i, b) in seg.options.sack_blocks().iter().enumerate() {
            let dsack = i == 0 && b.right <= self.snd.una && b.left < b.right;
            let valid = b.left < b.right && b.right <= self.snd.max && self.snd.una < b.right;
            if !valid && !dsack {
                c.inc(Counter::TcpExtTCPSACKDiscard);
            }
        }
    }

    pub(crate) fn enter_time_wait(&mut self, now: Instant, c: &mut Counters) {
        c.inc(Counter::TcpExtTW);
        // Nothing more will be sent; unread received data (if any) stays for the application.

        self.state = State::TimeWait;
        self.timers.cancel(Timer::Rto);
        self.timers.cancel(Timer::Persist);
        self.timers.cancel(Timer::Keepalive);
        self.timers.set(Timer::Lifetime, now + self.cfg.time_wait);
    }
}
