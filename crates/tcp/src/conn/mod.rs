//! One TCP connection (a TCB), split by concern: this file holds the state, construction
//! (active and passive open) and the application API; `input` processes arriving segments,
//! `output` builds segments to send, `timers` runs retransmission, delayed-ACK, persist,
//! keepalive and the bounded-lifetime timers.
//!
//! # Driving contract
//! 1. Feed each segment for this 4-tuple to [`Connection::on_segment`].
//! 2. Call [`Connection::on_timeout`] when [`Connection::poll_at`] is due.
//! 3. Call [`Connection::poll_transmit`] after 1, 2, or any application call, and send every
//!    segment it emits.
//! 4. When [`Connection::state`] is `Closed`, the owner may drop the connection.

mod handshake;
mod input;
mod output;
mod recovery;
mod timers;

use crate::assembler::Assembler;
use crate::buffer::RingBuffer;
use crate::cc::Congestion;
use crate::config::TcpConfig;
use crate::isn::FourTuple;
use crate::rtt::RttEstimator;
use crate::sack::Scoreboard;
use crate::sendq::SendQueue;
use crate::MAX_WSCALE;
use flowstack_wire::{Duration, Instant, SeqNum};
use std::fmt;

/// RFC 9293 §3.3.2 connection states (LISTEN is the engine's listener table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// SYN sent, waiting for SYN-ACK.
    SynSent,
    /// SYN received and answered.
    SynReceived,
    /// Open.
    Established,
    /// We sent FIN.
    FinWait1,
    /// Our FIN is acknowledged; waiting for the peer's.
    FinWait2,
    /// The peer sent FIN; we may still send.
    CloseWait,
    /// Both sent FIN simultaneously; waiting for the ACK of ours.
    Closing,
    /// Peer closed first, then we did; waiting for the ACK of our FIN.
    LastAck,
    /// Waiting 2·MSL before forgetting the connection.
    TimeWait,
    /// Gone.
    Closed,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            State::SynSent => "SYN-SENT",
            State::SynReceived => "SYN-RECV",
            State::Established => "ESTAB",
            State::FinWait1 => "FIN-WAIT-1",
            State::FinWait2 => "FIN-WAIT-2",
            State::CloseWait => "CLOSE-WAIT",
            State::Closing => "CLOSING",
            State::LastAck => "LAST-ACK",
            State::TimeWait => "TIME-WAIT",
            State::Closed => "CLOSED",
        };
        f.write_str(s)
    }
}

impl State {
    /// RFC 9293 "synchronized" states: the handshake has completed.
    pub fn is_synchronized(self) -> bool {
        !matches!(self, State::SynSent | State::SynReceived | State::Closed)
    }
}

/// Why a connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpError {
    /// RST in answer to our SYN.
    Refused,
    /// RST on an open connection.
    Reset,
    /// Retransmissions (or keepalives, or a bounded state) ran out.
    TimedOut,
    /// We aborted (RST sent).
    Aborted,
}

/// Per-connection statistics (for `ss`-like reports).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnStats {
    /// Segments sent.
    pub segs_out: u64,
    /// Segments received.
    pub segs_in: u64,
    /// Segments retransmitted.
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Fast retransmits (entries into loss recovery).
    pub fast_retransmits: u64,
    /// Payload bytes acknowledged by the peer.
    pub bytes_acked: u64,
    /// Payload bytes delivered in order.
    pub bytes_received: u64,
    /// Segments that took the header-prediction fast path.
    pub fast_path: u64,
}

/// One TCP connection.
pub struct Connection {
    pub(crate) cfg: TcpConfig,
    pub(crate) tuple: FourTuple,
    pub(crate) state: State,
    pub(crate) passive: bool,
    // Send sequence space (RFC 9293 §3.3.1).
    pub(crate) iss: SeqNum,
    pub(crate) snd_una: SeqNum,
    pub(crate) snd_nxt: SeqNum,
    /// Highest sequence number sent (SND.NXT before a go-back-N rewind).
    pub(crate) snd_max: SeqNum,
    /// End of the last sub-MSS segment sent (Minshall's Nagle variant).
    pub(crate) snd_sml: SeqNum,
    pub(crate) snd_wnd: usize,
    pub(crate) snd_wl1: SeqNum,
    pub(crate) snd_wl2: SeqNum,
    pub(crate) max_snd_wnd: usize,
    pub(crate) snd_wscale: u8,
    pub(crate) send_buf: SendQueue,
    /// Next zero-copy buffer token.
    pub(crate) zc_token: u64,
    /// Holds a segment's payload when it straddles the send ring's wrap point.
    pub(crate) tx_scratch: Vec<u8>,
    /// Sequence number of our FIN once the application closed the sending side.
    pub(crate) fin_seq: Option<SeqNum>,
    /// Effective send MSS.
    pub(crate) mss: usize,
    // Receive sequence space.
    pub(crate) irs: SeqNum,
    pub(crate) rcv_nxt: SeqNum,
    pub(crate) rcv_wscale: u8,
    /// Right edge of the window last advertised (never moves left, RFC 9293 §3.8.6.2.2).
    pub(crate) rcv_adv: SeqNum,
    pub(crate) recv_buf: RingBuffer,
    pub(crate) ofo: Assembler,
    pub(crate) ofo_fin: Option<SeqNum>,
    pub(crate) fin_received: bool,
    pub(crate) app_closed: bool,
    // Options.
    pub(crate) ts_enabled: bool,
    pub(crate) ts_recent: u32,
    pub(crate) ts_offset: u32,
    pub(crate) sack_enabled: bool,
    /// Options of the SYN we answer (what the SYN-ACK may offer back).
    pub(crate) peer_syn_ws: Option<u8>,
    // Timers.
    pub(crate) rtt: RttEstimator,
    pub(crate) rtt_probe: Option<(SeqNum, Instant)>,
    pub(crate) rto_at: Option<Instant>,
    pub(crate) retries: u32,
    pub(crate) delack_at: Option<Instant>,
    pub(crate) ack_now: bool,
    pub(crate) unacked_bytes: usize,
    pub(crate) quickack: u32,
    pub(crate) persist_at: Option<Instant>,
    pub(crate) persist_backoff: u32,
    pub(crate) probe_now: bool,
    pub(crate) keepalive_at: Option<Instant>,
    pub(crate) keepalive_sent: u32,
    pub(crate) deadline: Option<Instant>,
    pub(crate) last_activity: Instant,
    // Congestion control and recovery.
    pub(crate) cc: Congestion,
    pub(crate) dupacks: u32,
    pub(crate) in_recovery: bool,
    pub(crate) recover: SeqNum,
    pub(crate) high_rxt: SeqNum,
    pub(crate) rexmit_head: bool,
    /// SND.MAX when the latest retransmission was sent (see `recovery::lost_retransmission`).
    pub(crate) rexmit_mark: Option<SeqNum>,
    pub(crate) sack: Scoreboard,
    // RFC 5961 challenge-ACK rate limit.
    pub(crate) challenge_window: Instant,
    pub(crate) challenge_count: u32,
    pub(crate) pending_rst: Option<(SeqNum, Option<SeqNum>)>,
    pub(crate) error: Option<TcpError>,
    pub(crate) stats: ConnStats,
}

/// The smallest window-scale shift that lets `buf` bytes be advertised.
pub(crate) fn wscale_for(buf: usize) -> u8 {
    let mut s = 0;
    while s < MAX_WSCALE && (buf >> s) > 65535 {
        s += 1;
    }
    s
}

impl Connection {
    fn blank(cfg: TcpConfig, tuple: FourTuple, iss: SeqNum, now: Instant, state: State) -> Self {
        let mss = cfg.mss as usize;
        Self {
            cfg,
            tuple,
            state,
            passive: false,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_max: iss,
            snd_sml: iss,
            snd_wnd: 0,
            snd_wl1: SeqNum(0),
            snd_wl2: iss,
            max_snd_wnd: 0,
            snd_wscale: 0,
            send_buf: SendQueue::new(cfg.send_buffer),
            zc_token: 0,
            tx_scratch: Vec::new(),
            fin_seq: None,
            mss,
            irs: SeqNum(0),
            rcv_nxt: SeqNum(0),
            rcv_wscale: if cfg.window_scaling {
                wscale_for(cfg.recv_buffer)
            } else {
                0
            },
            rcv_adv: SeqNum(0),
            recv_buf: RingBuffer::new(if cfg.window_scaling {
                cfg.recv_buffer
            } else {
                cfg.recv_buffer.min(65535)
            }),
            ofo: Assembler::new(cfg.max_ofo_ranges),
            ofo_fin: None,
            fin_received: false,
            app_closed: false,
            ts_enabled: false,
            ts_recent: 0,
            ts_offset: iss.0.rotate_left(13),
            sack_enabled: false,
            peer_syn_ws: None,
            rtt: RttEstimator::new(cfg.rto_initial, cfg.rto_min, cfg.rto_max),
            rtt_probe: None,
            rto_at: None,
            retries: 0,
            delack_at: None,
            ack_now: false,
            unacked_bytes: 0,
            quickack: cfg.quickack_segments,
            persist_at: None,
            persist_backoff: 0,
            probe_now: false,
            keepalive_at: None,
            keepalive_sent: 0,
            deadline: None,
            last_activity: now,
            cc: Congestion::new(cfg.cc, mss),
            dupacks: 0,
            in_recovery: false,
            recover: iss,
            high_rxt: iss,
            rexmit_head: false,
            rexmit_mark: None,
            sack: Scoreboard::new(cfg.max_ofo_ranges),
            challenge_window: now,
            challenge_count: 0,
            pending_rst: None,
            error: None,
            stats: ConnStats::default(),
        }
    }

    /// The connection's 4-tuple.
    pub fn tuple(&self) -> FourTuple {
        self.tuple
    }
    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }
    /// The error that ended the connection, if any.
    pub fn error(&self) -> Option<TcpError> {
        self.error
    }
    /// Statistics.
    pub fn stats(&self) -> ConnStats {
        self.stats
    }
    /// Smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }
    /// Current retransmission timeout.
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }
    /// Congestion window in bytes.
    pub fn cwnd(&self) -> usize {
        self.cc.cwnd()
    }
    /// Effective send MSS.
    pub fn mss(&self) -> usize {
        self.mss
    }
    /// Peer's window in bytes.
    pub fn send_window(&self) -> usize {
        self.snd_wnd
    }
    /// Bytes queued to send (unsent plus unacknowledged).
    pub fn send_queue(&self) -> usize {
        self.send_buf.len()
    }
    /// Bytes received and not yet read.
    pub fn recv_queue(&self) -> usize {
        self.recv_buf.len()
    }
    /// Whether timestamps / SACK / window scaling were negotiated.
    pub fn options(&self) -> (bool, bool, u8, u8) {
        (
            self.ts_enabled,
            self.sack_enabled,
            self.snd_wscale,
            self.rcv_wscale,
        )
    }
    /// Changes Nagle (TCP_NODELAY).
    pub fn set_nodelay(&mut self, on: bool) {
        self.cfg.nodelay = on;
    }
    /// Changes keepalive.
    pub fn set_keepalive(&mut self, k: Option<crate::Keepalive>, now: Instant) {
        self.cfg.keepalive = k;
        self.keepalive_sent = 0;
        self.keepalive_at = k.map(|k| now + k.idle);
    }

    /// True if `recv` would return data, end of stream or an error.
    pub fn is_readable(&self) -> bool {
        !self.recv_buf.is_empty() || self.fin_received || self.error.is_some()
    }
    /// True if `send` would accept bytes (or fail at once).
    pub fn is_writable(&self) -> bool {
        self.error.is_some()
            || (self.fin_seq.is_none()
                && matches!(self.state, State::Established | State::CloseWait)
                && self.send_buf.window() > 0)
    }
    /// True once the handshake has completed (or the connection failed).
    pub fn is_open(&self) -> bool {
        self.state.is_synchronized()
    }

    /// Queues bytes to send; returns how many were taken (at most the free send buffer).
    pub fn send(&mut self, data: &[u8]) -> Result<usize, TcpError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.fin_seq.is_some()
            || !matches!(
                self.state,
                State::SynSent | State::SynReceived | State::Established | State::CloseWait
            )
        {
            return Err(TcpError::Aborted);
        }
        Ok(self.send_buf.enqueue(data))
    }

    /// Copies received bytes into `out`. `Ok(0)` with a nonempty `out` means end of stream;
    /// `Err(None)` means nothing to read yet; `Err(Some(e))` means the connection failed.
    pub fn recv(&mut self, out: &mut [u8]) -> Result<usize, Option<TcpError>> {
        if !self.recv_buf.is_empty() {
            let n = self.recv_buf.dequeue(out);
            self.after_read();
            return Ok(n);
        }
        if self.fin_received {
            return Ok(0);
        }
        Err(self.error)
    }

    /// Zero-copy send: queues an application-owned buffer without copying it. Returns its
    /// token, later reported by [`Connection::take_zc_completion`] once every byte is
    /// acknowledged, or `Ok(None)` if the buffer does not fit in the send window now.
    pub fn send_zc(&mut self, buf: std::sync::Arc<[u8]>) -> Result<Option<u64>, TcpError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.fin_seq.is_some()
            || !matches!(
                self.state,
                State::SynSent | State::SynReceived | State::Established | State::CloseWait
            )
        {
            return Err(TcpError::Aborted);
        }
        let token = self.zc_token;
        if !self.send_buf.enqueue_ext(buf, token) {
            return Ok(None);
        }
        self.zc_token += 1;
        Ok(Some(token))
    }

    /// The token of a zero-copy buffer that has been fully acknowledged (its memory is free).
    pub fn take_zc_completion(&mut self) -> Option<u64> {
        self.send_buf.take_completed()
    }

    /// Zero-copy receive: up to two slices of readable bytes; call [`Connection::consume`]
    /// with how many were used.
    pub fn peek_recv(&self, max: usize) -> (&[u8], &[u8]) {
        self.recv_buf.slices(0, max)
    }

    /// Marks `n` peeked bytes as read.
    pub fn consume(&mut self, n: usize) {
        self.recv_buf.consume(n);
        self.after_read();
    }

    /// RFC 9293 §3.8.6.2.2: after the application reads, announce the larger window once it
    /// has grown by min(buffer/2, MSS) — and at once if it had been closed.
    fn after_read(&mut self) {
        if !self.state.is_synchronized() {
            return;
        }
        let right = self.rcv_nxt + self.recv_buf.window();
        let grow = right - self.rcv_adv;
        let adv_wnd = self.rcv_adv - self.rcv_nxt;
        let thresh = (self.recv_buf.capacity() / 2).min(self.mss);
        if grow >= thresh || (adv_wnd == 0 && grow > 0) {
            self.ack_now = true;
        }
    }

    /// Closes the sending side (FIN after queued data); reading continues (half-close).
    pub fn shutdown_write(&mut self) {
        match self.state {
            // Before the handshake completes the FIN waits; the state moves to FIN-WAIT-1
            // once established (RFC 9293 §3.10.4 queues the close behind the open).
            State::SynSent | State::SynReceived if self.fin_seq.is_none() => {
                self.fin_seq = Some(self.iss + 1 + self.send_buf.len());
            }
            State::Established => {
                self.fin_seq = Some(self.snd_una_data() + self.send_buf.len());
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_seq = Some(self.snd_una_data() + self.send_buf.len());
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// Closes the connection: FIN after queued data, and the application reads no more. If
    /// received data was never read, the connection is reset instead (RFC 2525 §2.17), so
    /// the peer learns that data was lost.
    pub fn close(&mut self, now: Instant) {
        self.app_closed = true;
        if !self.recv_buf.is_empty() {
            return self.abort(now);
        }
        self.shutdown_write();
    }

    /// Aborts: RST to the peer (if synchronized) and CLOSED.
    pub fn abort(&mut self, _now: Instant) {
        if self.state != State::Closed
            && self.state != State::SynSent
            && self.state != State::TimeWait
        {
            self.pending_rst = Some((self.snd_nxt, None));
        }
        self.error.get_or_insert(TcpError::Aborted);
        self.enter_closed();
    }

    /// The handshake completed: enter ESTABLISHED, or FIN-WAIT-1 if the application already
    /// closed its sending side.
    pub(crate) fn enter_established(&mut self) {
        self.state = if self.fin_seq.is_some() {
            State::FinWait1
        } else {
            State::Established
        };
    }

    pub(crate) fn enter_closed(&mut self) {
        self.state = State::Closed;
        self.rto_at = None;
        self.delack_at = None;
        self.persist_at = None;
        self.keepalive_at = None;
        self.deadline = None;
    }

    /// The sequence number of the first data byte in the send buffer.
    pub(crate) fn snd_una_data(&self) -> SeqNum {
        // While our SYN is unacknowledged it occupies ISS; data starts after it.
        if self.snd_una == self.iss {
            self.iss + 1
        } else {
            self.snd_una
        }
    }

    /// Our timestamp clock: milliseconds plus a per-connection offset (RFC 7323 §5.4).
    pub(crate) fn ts_now(&self, now: Instant) -> u32 {
        (now.as_millis() as u32).wrapping_add(self.ts_offset)
    }

    /// Data bytes in a full-sized segment: the MSS less the options every segment carries
    /// (timestamps), so "full-sized" means what the peer actually sends (RFC 6691).
    pub(crate) fn full_seg(&self) -> usize {
        self.mss - if self.ts_enabled { 12 } else { 0 }
    }

    /// Bytes sent and not yet acknowledged.
    pub(crate) fn flight(&self) -> usize {
        self.snd_nxt - self.snd_una
    }
}
