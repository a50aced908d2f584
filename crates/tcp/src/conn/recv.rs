//! The receive side: the receive sequence space (RFC 9293 §3.3.1), the receive buffer with
//! its out-of-order assembler, the window we advertise and the ACK we owe; placing arriving
//! text (the seventh step of RFC 9293 §3.10.7.4), the delayed-ACK policy and the peer's FIN.

use super::{Connection, State, Timer};
use crate::assembler::Assembler;
use crate::buffer::RingBuffer;
use crate::config::TcpConfig;
use crate::counters::{Counter, Counters};
use flowstack_wire::tcp::{SackBlock, TcpOptions, TcpRepr, MAX_SACK_BLOCKS};
use flowstack_wire::{Instant, SeqNum};

/// The receiver's state (RFC 9293 §3.3.1 "Receive Sequence Variables", plus what receiving
/// needs).
pub(crate) struct Receiver {
    /// IRS: the peer's initial sequence number.
    pub(crate) irs: SeqNum,
    /// RCV.NXT: the next sequence number expected.
    pub(crate) nxt: SeqNum,
    /// Right edge of the window last advertised (never moves left, RFC 9293 §3.8.6.2.2).
    pub(crate) adv: SeqNum,
    /// Bytes received in order and not yet read, with out-of-order text placed beyond them.
    pub(crate) buf: RingBuffer,
    /// The out-of-order ranges held in `buf`.
    pub(crate) ofo: super::lazy::Lazy<Assembler>,
    /// Where a FIN that arrived out of order sits.
    pub(crate) ofo_fin: Option<SeqNum>,
    /// The peer's FIN is in sequence: end of stream once `buf` is read.
    pub(crate) fin_received: bool,
    /// The application closed the connection: nobody reads any more.
    pub(crate) app_closed: bool,
    /// An ACK is owed now.
    pub(crate) ack_now: bool,
    /// Bytes received in order since our last ACK.
    pub(crate) unacked_bytes: usize,
    /// Segments still to be acknowledged at once (quick-ACK mode at the start).
    pub(crate) quickack: u32,
    /// Bytes the reader beyond the buffer can take, the buffered ones included
    /// ([`Connection::set_read_limit`]; `u32::MAX`: no limit but the buffer's; 32 bits,
    /// as windows are, keeps the TCB from growing).
    pub(crate) limit: u32,
}

impl Receiver {
    pub(crate) fn new(cfg: &TcpConfig) -> Self {
        Self {
            irs: SeqNum(0),
            nxt: SeqNum(0),
            adv: SeqNum(0),
            buf: RingBuffer::new(if cfg.window_scaling {
                cfg.recv_buffer
            } else {
                cfg.recv_buffer.min(65535)
            }),
            ofo: super::lazy::Lazy::new(cfg.max_ofo_ranges),
            ofo_fin: None,
            fin_received: false,
            app_closed: false,
            ack_now: false,
            unacked_bytes: 0,
            quickack: cfg.quickack_segments,
            limit: u32::MAX,
        }
    }

    /// The peer's SYN (sequence number `irs`) synchronizes the receive sequence space.
    pub(crate) fn init(&mut self, irs: SeqNum) {
        self.irs = irs;
        self.nxt = irs + 1;
        self.adv = self.nxt;
    }

    /// RFC 9293 §3.10.7.4 "There are four cases for the acceptability test".
    pub(crate) fn acceptable(&self, seg: &TcpRepr) -> bool {
        let len = seg.segment_len();
        let wnd = self.adv - self.nxt;
        let wnd = wnd.max(self.buf.window().min(1 << 30));
        let in_wnd = |s: SeqNum| s.in_range(self.nxt, self.nxt + wnd);
        match (len, wnd) {
            // "If the RCV.WND is zero, no segments will be acceptable, but special allowance
            // should be made to accept valid ACKs, URGs, and RSTs": a segment that starts at
            // RCV.NXT has its control fields processed; the seventh step drops its text and
            // answers with an ACK. Without this, two peers with full buffers ignore each
            // other's ACKs for ever (Linux's tcp_sequence admits it too).
            (_, 0) => seg.seq == self.nxt,
            (0, _) => in_wnd(seg.seq),
            _ => in_wnd(seg.seq) || in_wnd(seg.seq + len - 1),
        }
    }

    /// The receive window we could offer: the buffer's free space, no more than the reader's
    /// limit leaves once the buffered bytes are counted.
    pub(crate) fn room(&self) -> usize {
        self.buf
            .window()
            .min((self.limit as usize).saturating_sub(self.buf.len()))
    }

    /// The window to advertise, with receiver-side SWS avoidance (RFC 9293 §3.8.6.2.2): the
    /// right edge moves only by at least min(buffer/2, MSS), and never moves left.
    pub(crate) fn advertise(&mut self, mss: usize, wscale: u8) -> u16 {
        let free = self.room();
        let right = self.nxt + free;
        let grow = right - self.adv;
        let thresh = (self.buf.capacity() / 2).min(mss);
        if self.adv < self.nxt || grow >= thresh || free == self.buf.capacity() {
            // Round down to what the scaled field can express exactly.
            let wnd = ((free >> wscale).min(65535)) << wscale;
            self.adv = self.adv.max(self.nxt + wnd);
        }
        (((self.adv - self.nxt) >> wscale).min(65535)) as u16
    }

    /// After the application read: whether the window we could advertise has grown by
    /// min(buffer/2, MSS) past the advertised edge, or at all if the advertised window was
    /// closed (RFC 9293 §3.8.6.2.2).
    pub(crate) fn read_opens_window(&self, mss: usize) -> bool {
        let right = self.nxt + self.room();
        let grow = right - self.adv;
        let adv_wnd = self.adv - self.nxt;
        let thresh = (self.buf.capacity() / 2).min(mss);
        grow >= thresh || (adv_wnd == 0 && grow > 0)
    }

    /// A segment carrying our ACK went out: nothing is owed any more, and a D-SACK block it
    /// carried is not repeated (RFC 2883 §4).
    pub(crate) fn ack_sent(&mut self, c: &mut Counters) {
        self.ack_now = false;
        self.unacked_bytes = 0;
        if let Some((_, end)) = self.ofo.dsack() {
            c.inc(if end <= self.nxt {
                Counter::TcpExtTCPDSACKOldSent
            } else {
                Counter::TcpExtTCPDSACKOfoSent
            });
            self.ofo.dsack_sent();
        }
    }

    /// The SACK option of our next segment: a pending D-SACK block first (RFC 2883 §4: the
    /// first block reports the duplicate), then the out-of-order ranges, most recently
    /// changed first (RFC 2018 §4). For a duplicate above RCV.NXT that puts second the block
    /// holding it, as RFC 2883 §4 asks: "the second SACK block in that SACK option should
    /// specify that (possibly larger) block of data".
    pub(crate) fn sack_option(&self, o: &mut TcpOptions) {
        let mut blocks = [(SeqNum(0), SeqNum(0)); MAX_SACK_BLOCKS];
        let mut k = 0;
        if let Some(d) = self.ofo.dsack() {
            blocks[0] = d;
            k = 1;
        }
        if !self.ofo.is_empty() {
            k += self.ofo.sack_blocks(&mut blocks[k..]);
        }
        for (i, b) in blocks[..k].iter().enumerate() {
            o.sack[i] = SackBlock {
                left: b.0,
                right: b.1,
            };
        }
        o.sack_len = k as u8;
    }

    /// Whether our segments carry a SACK option now.
    pub(crate) fn has_sack_info(&self) -> bool {
        !self.ofo.is_empty() || self.ofo.dsack().is_some()
    }

    /// RFC 2883 §4: `[start, end)` arrived a second time; report it in the next ACK, sent at
    /// once (the sender waits on it to undo a needless retransmission). §4: "the D-SACK block
    /// is only used to report a duplicate contiguous sequence of data received by the
    /// receiver in the most recent packet": when several segments are processed before one
    /// ACK goes out, the latest duplicate replaces an earlier one it does not touch.
    pub(super) fn note_duplicate(&mut self, start: SeqNum, end: SeqNum) {
        self.ofo.set_dsack(start, end);
        self.ack_now = true;
    }
}

impl Connection {
    /// Seventh step: place data in the receive buffer (in order) or the reassembly area.
    pub(super) fn accept_data(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        let skip = self.rcv.nxt - seg.seq; // already received part
        let dsack = self.opt.sack;
        if skip >= seg.payload.len() {
            // Entirely old: a retransmission the peer sent because our ACK was lost.
            if dsack {
                self.rcv
                    .note_duplicate(seg.seq, seg.seq + seg.payload.len());
            }
            self.rcv.ack_now = true;
            return;
        }
        if dsack && skip > 0 {
            // RFC 2883 §4, a partly old segment: the part below RCV.NXT is the duplicate.
            self.rcv.note_duplicate(seg.seq, self.rcv.nxt);
        }
        let start = seg.seq + skip;
        let data = &seg.payload[skip..];
        let rel = start - self.rcv.nxt;
        if dsack && skip == 0 {
            // Text already held out of order is received twice (RFC 2883 §4).
            if let Some((s, e)) = self.rcv.ofo.overlap(start, start + data.len()) {
                self.rcv.note_duplicate(s, e);
            }
        }
        if rel == 0 {
            let _p = flowstack_prof::enter(flowstack_prof::Layer::SockAppend);
            let n = self.rcv.buf.write_at(0, data);
            if n < data.len() {
                // Text beyond the window is dropped; the ACK tells the sender the window.
                c.inc(Counter::TcpExtTCPRcvQDrop);
                self.rcv.ack_now = true;
            }
            self.rcv.buf.commit(n);
            self.rcv.nxt += n;
            self.stats.bytes_received += n as u64;
            let mut filled = false;
            while let Some(end) = self.rcv.ofo.pop_front(self.rcv.nxt) {
                let more = end - self.rcv.nxt;
                self.rcv.buf.commit(more);
                self.stats.bytes_received += more as u64;
                self.rcv.nxt = end;
                filled = true;
            }
            if filled {
                // RFC 5681 §4.2: ACK at once when a segment fills a gap.
                self.rcv.ack_now = true;
            }
            if self.rcv.ofo_fin == Some(self.rcv.nxt) {
                self.rcv.ofo_fin = None;
                self.on_fin(now, c);
                return;
            }
            self.schedule_ack(now, seg);
        } else {
            let n = self.rcv.buf.write_at(rel, data);
            if n == 0 || self.rcv.ofo.add(start, start + n).is_err() {
                c.inc(Counter::TcpExtTCPOFODrop);
            } else {
                c.inc(Counter::TcpExtTCPOFOQueue);
            }
            // RFC 5681 §4.2: an out-of-order segment gets an immediate (duplicate) ACK.
            self.rcv.ack_now = true;
        }
    }

    /// Delayed-ACK policy (RFC 1122 §4.2.3.2, RFC 5681 §4.2).
    pub(super) fn schedule_ack(&mut self, now: Instant, seg: &TcpRepr) {
        let had_unacked = self.rcv.unacked_bytes > 0;
        self.rcv.unacked_bytes += seg.payload.len();
        if !self.cfg.delayed_ack
            || self.rcv.quickack > 0
            || self.rcv.unacked_bytes >= 2 * self.full_seg()
            // The tail of a multi-segment message: ACK it now so a Nagle-limited sender
            // is not held for the delayed-ACK timer.
            || (had_unacked && seg.flags.psh() && seg.payload.len() < self.full_seg())
        {
            self.rcv.quickack = self.rcv.quickack.saturating_sub(1);
            self.rcv.ack_now = true;
        } else {
            let at = now + self.cfg.delayed_ack_timeout;
            self.timers.set_if_idle(Timer::DelayedAck, at);
        }
    }

    /// Our peer's FIN is in sequence (RFC 9293 §3.10.7.4 eighth).
    pub(super) fn on_fin(&mut self, now: Instant, c: &mut Counters) {
        self.rcv.nxt += 1;
        self.rcv.fin_received = true;
        self.rcv.ack_now = true;
        match self.state {
            State::SynReceived | State::Established => {
                self.state = State::CloseWait;
                let at = now + self.cfg.close_wait_timeout;
                self.timers.set(Timer::Lifetime, at);
            }
            State::FinWait1 => {
                self.state = State::Closing;
            }
            State::FinWait2 => self.enter_time_wait(now, c),
            State::TimeWait => self.timers.set(Timer::Lifetime, now + self.cfg.time_wait),
            _ => {}
        }
    }
}
