//! Building segments: SYN/SYN-ACK, data (cut by `send` and `recovery`) and FIN, ACKs, window
//! updates, probes and resets.

use super::{Connection, State, Timer};
use crate::counters::{Counter, Counters};
use crate::sendq::PayloadSrc;
use flowstack_wire::tcp::{Flags, TcpOptions, TcpRepr};
use flowstack_wire::{Instant, SeqNum};

/// Where [`Connection::poll_transmit_gather`] puts each segment: the segment (its payload
/// always a slice, for emitters that copy) and, when that payload is one contiguous range of
/// a zero-copy send's shared memory, where it lies there — an emitter for a device that
/// gathers hands the device a reference to it instead of copying it.
pub type Emit<'e> = dyn FnMut(&TcpRepr, Option<PayloadSrc>) + 'e;

impl Connection {
    /// Emits every segment the connection wants to send now, through `emit`. Returns the
    /// number of segments emitted.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        c: &mut Counters,
        emit: &mut dyn FnMut(&TcpRepr),
    ) -> usize {
        self.transmit(now, c, &mut |r, _| emit(r))
    }

    /// [`Connection::poll_transmit`], telling the emitter where each payload lies when it is
    /// one range of shared memory ([`Emit`]). With `gathers` (the emitter hands such a
    /// payload to a device by reference) segments are also cut to suit it: a segment that
    /// starts in a zero-copy send's range ends where the range does instead of running into
    /// the next buffer (which would gather both into a scratch copy and then copy that into
    /// the frame: two copies of every straddling segment, about half of a bulk sender's
    /// 128 KiB sends at a 64 KiB MSS); a range between one and two segments long is cut in
    /// two halves rather than a full segment and a runt.
    pub fn poll_transmit_gather(
        &mut self,
        now: Instant,
        c: &mut Counters,
        gathers: bool,
        emit: &mut Emit,
    ) -> usize {
        self.gathering = gathers;
        let n = self.transmit(now, c, emit);
        self.gathering = false;
        n
    }

    fn transmit(&mut self, now: Instant, c: &mut Counters, emit: &mut Emit) -> usize {
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
            emit(&r, None);
            c.inc(Counter::TcpOutRsts);
            c.inc(Counter::TcpOutSegs);
            return 1;
        }
        match self.state {
            State::Closed => return 0,
            State::SynSent | State::SynReceived => {
                if self.snd.nxt == self.snd.iss {
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
            // RFC 1191 §6.3: a lowered path MTU estimate may have expired.
            self.pmtu_expiry(now, c);
            // RFC 4821: start or restart a search for a larger MSS (`plpmtud`).
            self.plp_tick(now);
            if self.rec.in_recovery || self.rack_on() {
                n += self.send_recovery(now, c, emit);
            }
            if self.rec.rack.tlp_now {
                n += self.send_tlp(now, c, emit);
            }
            let sent = self.send_data(now, c, emit);
            if sent > 0 {
                // RFC 8985 §7.2: (re)arm the PTO when new data is sent.
                self.arm_tlp(now);
            }
            n += sent;
            if self.timers.probe_now {
                self.timers.probe_now = false;
                self.send_probe(now, c, emit);
                n += 1;
            }
        }
        if self.rcv.ack_now && n == 0 && self.state != State::SynSent {
            let r = self.ack_segment(now, self.ack_seq());
            self.emit_counted(&r, c, emit);
            n += 1;
        }
        n
    }

    /// The probe a persist or keepalive timer asked for.
    fn send_probe(&mut self, now: Instant, c: &mut Counters, emit: &mut Emit) {
        let room = self.snd.window_room();
        let avail = self.snd.data_end() - self.snd.nxt;
        if room > 0 && avail > 0 {
            // SWS override: the window is too small for a full segment, send what fits.
            let seq = self.snd.nxt;
            let used = self.emit_range(now, seq, room.min(avail).min(self.snd.mss), c, emit);
            self.snd.nxt = seq + used;
        } else {
            // Zero-window probe / keepalive: an ACK with an old sequence number makes
            // the peer answer with its current window (as Linux's tcp_xmit_probe_skb).
            let r = self.ack_segment(now, self.snd.una - 1);
            self.emit_counted(&r, c, emit);
        }
    }

    fn emit_counted(&mut self, r: &TcpRepr, c: &mut Counters, emit: &mut Emit) {
        emit(r, None);
        c.inc(Counter::TcpOutSegs);
        self.stats.segs_out += 1;
        if r.flags.ack() {
            self.ack_sent(c);
        }
    }

    fn ack_sent(&mut self, c: &mut Counters) {
        self.rcv.ack_sent(c);
        self.timers.cancel(Timer::DelayedAck);
    }

    /// Header fields common to every segment: ports, ACK, window, timestamps.
    fn base(&mut self, seq: SeqNum, flags: Flags) -> TcpRepr<'static> {
        let win = self.rcv.advertise(self.snd.mss, self.opt.rcv_wscale);
        TcpRepr {
            src_port: self.tuple.local_port,
            dst_port: self.tuple.remote_port,
            seq,
            ack: self.rcv.nxt,
            flags: flags | Flags::ACK,
            window: win,
            urgent: 0,
            options: TcpOptions::default(),
            payload: &[],
        }
    }

    /// The sequence number of a segment without text: RFC 9293's SND.NXT, which is our
    /// `snd.max` (`snd.nxt` moves back for go-back-N), kept inside the peer's window.
    ///
    /// After a timeout `snd.nxt` can lie below the peer's RCV.NXT; an ACK carrying it would be
    /// unacceptable there (its ACK field and window ignored), and an ACK below the peer's
    /// SND.WL1 cannot update the window it tells. Capping at the window's right edge keeps
    /// the ACK acceptable to a peer whose window shrank (as Linux's tcp_acceptable_seq).
    fn ack_seq(&self) -> SeqNum {
        let wnd_end = self.snd.una + self.snd.wnd;
        if self.snd.max <= wnd_end {
            self.snd.max
        } else {
            wnd_end.max(self.snd.nxt)
        }
    }

    fn ack_segment(&mut self, now: Instant, seq: SeqNum) -> TcpRepr<'static> {
        let mut r = self.base(seq, Flags::ACK);
        self.with_options(now, &mut r);
        r
    }

    fn send_syn(&mut self, now: Instant, c: &mut Counters, emit: &mut Emit) {
        let active = self.state == State::SynSent;
        let iss = self.snd.iss;
        let mut r = self.base(iss, Flags::SYN);
        if active {
            r.flags = Flags::SYN;
            r.ack = SeqNum(0);
        }
        // RFC 7323 §2.2: the window in a SYN is never scaled.
        r.window = self.rcv.buf.window().min(65535) as u16;
        r.options.mss = Some(self.cfg.mss);
        let offer_ws = if active {
            self.cfg.window_scaling
        } else {
            self.opt.peer_syn_ws.is_some()
        };
        if offer_ws {
            r.options.window_scale = Some(self.opt.rcv_wscale);
        }
        if (active && self.cfg.sack) || (!active && self.opt.sack) {
            r.options.sack_permitted = true;
        }
        if (active && self.cfg.timestamps) || (!active && self.opt.ts) {
            let echo = if active { 0 } else { self.opt.ts_recent };
            r.options.timestamp = Some((self.opt.ts_now(now), echo));
        }
        if self.snd.max > iss {
            c.inc(Counter::TcpRetransSegs);
            self.stats.retransmits += 1;
        } else if active {
            c.inc(Counter::TcpActiveOpens);
        }
        self.rcv.adv = self.rcv.nxt + r.window as usize;
        self.emit_counted(&r, c, emit);
        if self.snd.rtt_probe.is_none() && self.snd.max == iss {
            self.snd.rtt_probe = Some((iss, now));
        }
        self.snd.nxt = iss + 1;
        self.snd.max = self.snd.max.max(self.snd.nxt);
        self.timers
            .set_if_idle(Timer::Rto, now + self.snd.rtt.rto());
    }

    /// Emits data (and FIN) in `[seq, seq+len)` taken from the send buffer.
    pub(super) fn emit_range(
        &mut self,
        now: Instant,
        seq: SeqNum,
        len: usize,
        c: &mut Counters,
        emit: &mut Emit,
    ) -> usize {
        let max = if self.tso_allowed() {
            self.cfg.max_tso_segment
        } else {
            self.snd.mss
        };
        self.emit_range_max(now, seq, len, max, c, emit)
    }

    /// [`Connection::emit_range`] with a segment of at most `max` bytes of data and options
    /// (an RFC 4821 probe is larger than the MSS).
    pub(super) fn emit_range_max(
        &mut self,
        now: Instant,
        seq: SeqNum,
        len: usize,
        max: usize,
        c: &mut Counters,
        emit: &mut Emit,
    ) -> usize {
        let off = seq - self.snd.data_start();
        let retrans = seq < self.snd.max;
        let mut r = self.base(seq, Flags::NONE);
        self.with_options(now, &mut r);
        // RFC 6691: the MSS counts data only; options in this segment take from it.
        let room = max - r.options.buffer_len();
        let queued = self.snd.queue.len().saturating_sub(off);
        let mut data_len = queued.min(len).min(room);
        if self.gathering && data_len > 0 {
            data_len = cut_at_shared_end(&self.snd.queue, off, data_len, queued, room);
        }
        // A segment is never cut short at the ring's wrap point (that would make needless
        // small segments): a straddling payload is gathered into a scratch buffer.
        let (payload, src) = self
            .snd
            .queue
            .gather_src(off, data_len, &mut self.snd.scratch);
        let sent = payload.len();
        // The FIN rides on the segment whose data ends where the FIN sits.
        let fin = self.snd.fin_seq == Some(seq + sent);
        if fin {
            r.flags |= Flags::FIN;
        }
        if sent > 0 && off + sent == self.snd.queue.len() {
            r.flags |= Flags::PSH;
        }
        let r = TcpRepr { payload, ..r };
        self.timers.unacked_since.get_or_insert(now);
        emit(&r, src);
        c.inc(Counter::TcpOutSegs);
        self.stats.segs_out += 1;
        self.ack_sent(c);
        let occupied = sent + fin as usize;
        self.pmtu_on_send(sent, seq + sent);
        if retrans {
            c.inc(Counter::TcpRetransSegs);
            self.stats.retransmits += 1;
            self.rec.rexmit_mark = Some(self.snd.max);
            self.undo_record(seq, (seq + occupied).min(self.snd.max));
        } else if self.snd.rtt_probe.is_none() {
            self.snd.rtt_probe = Some((seq, now));
        }
        let end = seq + occupied;
        self.rack_on_send(now, seq, end, self.snd.max);
        if end > self.snd.max {
            self.snd.max = end;
        }
        self.timers
            .set_if_idle(Timer::Rto, now + self.snd.rtt.rto());
        occupied
    }
}

/// The payload length for a segment of at most `data_len` bytes at `off` (`queued` bytes
/// from there, segments of at most `room`) when the emitter gathers: up to the end of a
/// zero-copy range the segment starts in, and half of a range that a full segment would
/// leave a runt of (a range of 1–2 segments' worth makes two halves).
fn cut_at_shared_end(
    q: &crate::sendq::SendQueue,
    off: usize,
    data_len: usize,
    queued: usize,
    room: usize,
) -> usize {
    let ahead = queued.min(2 * room);
    let run = q.shared_run(off, ahead);
    if run == 0 {
        data_len
    } else if run < data_len {
        run
    } else if data_len == room && run > room && run < ahead {
        run.div_ceil(2)
    } else {
        data_len
    }
}
