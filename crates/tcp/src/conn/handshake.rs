//! Opening a connection: active open (SYN-SENT), passive open from a listener (incl. SYN
//! cookies), option negotiation (RFC 9293 §3.7.1, RFC 7323, RFC 2018), and the SYN-SENT
//! segment-arrival rules (RFC 9293 §3.10.7.3).

use super::{Connection, State, TcpError};
use crate::buffer::RingBuffer;
use crate::config::TcpConfig;
use crate::counters::{Counter, Counters};
use crate::isn::FourTuple;
use crate::{DEFAULT_MSS, MAX_WSCALE, MIN_MSS};
use flowstack_wire::tcp::TcpRepr;
use flowstack_wire::{Instant, SeqNum};

/// RFC 9293 §3.7.1 / RFC 6691: the send MSS from the peer's option.
pub(crate) fn peer_mss(opt: Option<u16>, ours: u16) -> usize {
    let m = match opt {
        None | Some(0) => DEFAULT_MSS,
        Some(m) => (m as usize).max(MIN_MSS),
    };
    m.min(ours as usize)
}

impl Connection {
    /// Active open: a connection in SYN-SENT whose first [`Connection::poll_transmit`] sends
    /// the SYN.
    pub fn connect(cfg: TcpConfig, tuple: FourTuple, iss: SeqNum, now: Instant) -> Self {
        Self::blank(cfg, tuple, iss, now, State::SynSent)
    }

    /// Passive open from a listener: the connection for an accepted SYN, in SYN-RECEIVED
    /// (the SYN-ACK goes out on the next poll). With `cookie_mss`, the SYN was answered
    /// statelessly by a SYN cookie and `syn` is the completing ACK: the connection starts
    /// ESTABLISHED without options (they were not kept).
    pub fn accept(
        cfg: TcpConfig,
        tuple: FourTuple,
        syn: &TcpRepr,
        iss: SeqNum,
        now: Instant,
        cookie_mss: Option<u16>,
    ) -> Self {
        let mut c = Self::blank(cfg, tuple, iss, now, State::SynReceived);
        c.passive = true;
        if let Some(mss) = cookie_mss {
            c.irs = syn.seq - 1;
            c.rcv_nxt = syn.seq;
            c.snd_una = iss + 1;
            c.snd_nxt = iss + 1;
            c.snd_max = iss + 1;
            c.mss = peer_mss(Some(mss), cfg.mss);
            c.cc.set_mss(c.mss);
            c.rcv_wscale = 0;
            c.recv_buf = RingBuffer::new(cfg.recv_buffer.min(65535));
            c.rcv_adv = c.rcv_nxt;
            c.state = State::Established;
            c.snd_wnd = syn.window as usize;
            c.max_snd_wnd = c.snd_wnd;
            c.snd_wl1 = syn.seq;
            c.snd_wl2 = syn.ack;
            return c;
        }
        c.irs = syn.seq;
        c.rcv_nxt = syn.seq + 1;
        c.rcv_adv = c.rcv_nxt;
        c.negotiate(syn);
        // RFC 7323 §2.2: the window field of a SYN is never scaled.
        c.snd_wnd = syn.window as usize;
        c.max_snd_wnd = c.snd_wnd;
        c.snd_wl1 = syn.seq;
        c.snd_wl2 = iss;
        c
    }

    /// Applies the options of the peer's SYN (or SYN-ACK) to what we offered.
    pub(crate) fn negotiate(&mut self, syn: &TcpRepr) {
        let o = &syn.options;
        self.mss = peer_mss(o.mss, self.cfg.mss);
        self.cc.set_mss(self.mss);
        // RFC 7323 §2.3: scaling only if both sides sent the option; shifts above 14 are 14.
        match (self.cfg.window_scaling, o.window_scale) {
            (true, Some(ws)) => {
                self.snd_wscale = ws.min(MAX_WSCALE);
                self.peer_syn_ws = Some(ws);
            }
            _ => {
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
                if self.recv_buf.capacity() > 65535 {
                    self.recv_buf = RingBuffer::new(65535);
                }
            }
        }
        self.ts_enabled = self.cfg.timestamps && o.timestamp.is_some();
        if let Some((val, _)) = o.timestamp {
            self.ts_recent = val;
        }
        self.sack_enabled = self.cfg.sack && o.sack_permitted;
    }

    /// RFC 9293 §3.10.7.3: SEGMENT ARRIVES in SYN-SENT.
    pub(super) fn on_syn_sent(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        let f = seg.flags;
        if f.ack() && (seg.ack <= self.iss || seg.ack > self.snd_max) {
            // "If SEG.ACK =< ISS or SEG.ACK > SND.NXT, send a reset (unless the RST bit is
            // set, if so drop the segment and return)".
            if !f.rst() {
                self.pending_rst = Some((seg.ack, None));
            }
            return;
        }
        if f.rst() {
            // RFC 5961 §3.2 / RFC 9293: an RST is acceptable only with an acceptable ACK.
            if f.ack() {
                self.error = Some(TcpError::Refused);
                c.inc(Counter::TcpAttemptFails);
                self.enter_closed();
            }
            return;
        }
        if !f.syn() {
            return;
        }
        self.irs = seg.seq;
        self.rcv_nxt = seg.seq + 1;
        self.rcv_adv = self.rcv_nxt;
        self.negotiate(seg);
        if f.ack() {
            self.snd_una = seg.ack;
        }
        if self.snd_una > self.iss {
            // Our SYN is acknowledged: ESTABLISHED.
            self.enter_established();
            // RFC 7323 §2.2: the SYN-ACK's window is not scaled.
            self.snd_wnd = seg.window as usize;
            self.max_snd_wnd = self.snd_wnd;
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
            self.retries = 0;
            self.rto_at = None;
            if let Some((_, t)) = self.rtt_probe.take() {
                self.rtt.sample(now.saturating_since(t));
            }
            self.ack_now = true;
            self.arm_keepalive(now);
        } else {
            // Simultaneous open (RFC 9293 §3.5 figure 7): SYN-RECEIVED, send SYN-ACK.
            self.state = State::SynReceived;
            self.snd_wnd = seg.window as usize;
            self.snd_nxt = self.iss;
        }
    }
}
