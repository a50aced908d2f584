//! Opening a connection: active open (SYN-SENT), passive open from a listener (incl. SYN
//! cookies), option negotiation (RFC 9293 §3.7.1, RFC 7323, RFC 2018), and the SYN-SENT
//! segment-arrival rules (RFC 9293 §3.10.7.3).

use super::{Connection, State, TcpError, Timer};
use crate::buffer::RingBuffer;
use crate::config::TcpConfig;
use crate::counters::{Counter, Counters};
use crate::isn::FourTuple;
use crate::{DEFAULT_MSS, MAX_WSCALE, MIN_MSS};
use flowstack_wire::tcp::TcpRepr;
use flowstack_wire::{Instant, SeqNum};
use std::sync::Arc;

/// RFC 9293 §3.7.1 / RFC 6691: the send MSS from the peer's option.
pub(crate) fn peer_mss(opt: Option<u16>, ours: u16) -> usize {
    let m = match opt {
        None | Some(0) => DEFAULT_MSS,
        Some(m) => (m as usize).max(MIN_MSS),
    };
    m.min(ours as usize)
}

/// Counts the options of a SYN that are out of range and get clamped when negotiated: an
/// MSS below [`MIN_MSS`] (raised to it, Linux's TCP_MIN_SND_MSS) and a window-scale shift
/// above 14 (RFC 7323 §2.3: "use 14").
pub fn syn_option_clamps(o: &flowstack_wire::tcp::TcpOptions, c: &mut Counters) {
    if o.mss.is_some_and(|m| m != 0 && (m as usize) < MIN_MSS) {
        c.inc(Counter::TcpExtTCPMSSClamped);
    }
    if o.window_scale.is_some_and(|w| w > MAX_WSCALE) {
        c.inc(Counter::TcpExtTCPWscaleClamped);
    }
}

impl Connection {
    /// Active open: a connection in SYN-SENT whose first [`Connection::poll_transmit`] sends
    /// the SYN.
    ///
    /// `cfg` may be shared (`Arc<TcpConfig>`) by many connections: an engine passes the
    /// same one to every connection of a socket configuration.
    pub fn connect(
        cfg: impl Into<Arc<TcpConfig>>,
        tuple: FourTuple,
        iss: SeqNum,
        now: Instant,
    ) -> Self {
        Self::blank(cfg.into(), tuple, iss, now, State::SynSent)
    }

    /// Passive open from a listener: the connection for an accepted SYN, in SYN-RECEIVED
    /// (the SYN-ACK goes out on the next poll). With `cookie_mss`, the SYN was answered
    /// statelessly by a SYN cookie and `syn` is the completing ACK: the connection starts
    /// ESTABLISHED without options (they were not kept).
    pub fn accept(
        cfg: impl Into<Arc<TcpConfig>>,
        tuple: FourTuple,
        syn: &TcpRepr,
        iss: SeqNum,
        now: Instant,
        cookie_mss: Option<u16>,
    ) -> Self {
        let cfg: Arc<TcpConfig> = cfg.into();
        let (cfg_mss, cfg_recv_buffer) = (cfg.mss, cfg.recv_buffer);
        let mut c = Self::blank(cfg, tuple, iss, now, State::SynReceived);
        c.passive = true;
        if let Some(mss) = cookie_mss {
            c.rcv.init(syn.seq - 1);
            c.snd.una = iss + 1;
            c.snd.nxt = iss + 1;
            c.snd.max = iss + 1;
            c.snd.mss = peer_mss(Some(mss), cfg_mss);
            c.rec.cc.set_mss(c.snd.mss);
            c.opt.rcv_wscale = 0;
            c.rcv.buf = RingBuffer::new(cfg_recv_buffer.min(65535));
            c.state = State::Established;
            c.snd.init_window(syn.seq, syn.ack, syn.window as usize);
            return c;
        }
        c.rcv.init(syn.seq);
        c.negotiate(syn);
        // RFC 7323 §2.2: the window field of a SYN is never scaled.
        c.snd.init_window(syn.seq, iss, syn.window as usize);
        c
    }

    /// Applies the options of the peer's SYN (or SYN-ACK) to what we offered.
    pub(crate) fn negotiate(&mut self, syn: &TcpRepr) {
        let o = &syn.options;
        self.snd.mss = peer_mss(o.mss, self.cfg.mss);
        self.rec.cc.set_mss(self.snd.mss);
        // RFC 7323 §2.3: scaling only if both sides sent the option; shifts above 14 are 14.
        match (self.cfg.window_scaling, o.window_scale) {
            (true, Some(ws)) => {
                self.opt.snd_wscale = ws.min(MAX_WSCALE);
                self.opt.peer_syn_ws = Some(ws);
            }
            _ => {
                self.opt.snd_wscale = 0;
                self.opt.rcv_wscale = 0;
                if self.rcv.buf.capacity() > 65535 {
                    self.rcv.buf = RingBuffer::new(65535);
                }
            }
        }
        self.opt.ts = self.cfg.timestamps && o.timestamp.is_some();
        if let Some((val, _)) = o.timestamp {
            self.opt.ts_recent = val;
        }
        self.opt.sack = self.cfg.sack && o.sack_permitted;
    }

    /// RFC 9293 §3.10.7.3: SEGMENT ARRIVES in SYN-SENT.
    pub(super) fn on_syn_sent(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        let f = seg.flags;
        if f.ack() && (seg.ack <= self.snd.iss || seg.ack > self.snd.max) {
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
        if f.fin() {
            // A SYN-ACK with FIN: never from a correct peer; drop it, the peer retransmits
            // (as Linux drops SYN+FIN).
            c.inc(Counter::TcpExtTCPSynFinDrop);
            return;
        }
        syn_option_clamps(&seg.options, c);
        self.rcv.init(seg.seq);
        self.negotiate(seg);
        if f.ack() {
            self.snd.una = seg.ack;
        }
        if self.snd.una > self.snd.iss {
            // Our SYN is acknowledged: ESTABLISHED.
            self.enter_established();
            // RFC 7323 §2.2: the SYN-ACK's window is not scaled.
            self.snd.init_window(seg.seq, seg.ack, seg.window as usize);
            self.timers.retries = 0;
            self.timers.cancel(Timer::Rto);
            if let Some((_, t)) = self.snd.rtt_probe.take() {
                self.snd.rtt.sample(now.saturating_since(t));
            }
            self.rcv.ack_now = true;
            self.arm_keepalive(now);
        } else {
            // Simultaneous open (RFC 9293 §3.5 figure 7): SYN-RECEIVED, send SYN-ACK.
            self.state = State::SynReceived;
            self.snd.wnd = seg.window as usize;
            self.snd.nxt = self.snd.iss;
        }
    }
}

/// Added to SND.MAX of a TIME-WAIT incarnation to pick the next incarnation's ISS, as Linux
/// does (`tw_snd_nxt + 65535 + 2`): beyond anything the old one sent or could have had
/// acknowledged within a maximal unscaled window.
const REINCARNATION_GAP: usize = 65535 + 2;

impl Connection {
    /// Whether a SYN arriving for this connection while it is in TIME-WAIT may open a new
    /// incarnation of the 4-tuple; if so, the ISS the new connection must use.
    ///
    /// RFC 1122 §4.2.2.13: a host "MAY accept a new SYN from the remote TCP to reopen the
    /// connection directly from TIME-WAIT state, if it: (1) assigns its initial sequence
    /// number for the new connection to be larger than the largest sequence number it used on
    /// the previous connection incarnation, and (2) returns to TIME-WAIT state if the SYN
    /// turns out to be an old duplicate". RFC 6191 §2 adds timestamps: with them, a SYN is
    /// acceptable when its timestamp is newer than the last one seen. As Linux does: accept a
    /// plain SYN (no ACK, RST or FIN) that PAWS does not reject and whose sequence number is
    /// above RCV.NXT or whose timestamp is newer than TS.Recent. Case (2) needs nothing here:
    /// an old duplicate SYN fails both tests and is answered as TIME-WAIT answers any segment.
    pub fn time_wait_reopen(&self, seg: &TcpRepr) -> Option<SeqNum> {
        let f = seg.flags;
        if self.state != State::TimeWait || !f.syn() || f.ack() || f.rst() || f.fin() {
            return None;
        }
        let seg_ts = seg.options.timestamp.map(|(val, _)| val);
        let (paws_reject, ts_newer) = match (self.opt.ts, seg_ts) {
            (true, Some(val)) => (
                self.opt.ts_is_old(val),
                val != self.opt.ts_recent && !self.opt.ts_is_old(val),
            ),
            _ => (false, false),
        };
        if paws_reject || !(seg.seq > self.rcv.nxt || ts_newer) {
            return None;
        }
        Some(self.snd.max + REINCARNATION_GAP)
    }
}
