//! One TCP connection (a TCB), split by concern. This file holds the connection — its
//! parts, construction and the application API. Each part lives beside the code of its concern:
//!
//! - `send`: [`Sender`] — the send sequence space, send queue and RTT timing; what an ACK
//!   does to them, and cutting queued data into segments.
//! - `recv`: [`Receiver`] — the receive sequence space, receive buffer and reassembly, and
//!   the ACK we owe; placing arriving text, the advertised window, the delayed-ACK policy.
//! - `recovery`: [`Recovery`] — congestion control, duplicate ACKs, the SACK scoreboard and
//!   loss recovery.
//! - `timers`: [`Timers`] — retransmission, delayed-ACK, persist, keepalive and the bounded
//!   lifetime of closing states, in a table indexed by [`Timer`].
//! - `options`: [`Options`] — what the handshake negotiated (timestamps, SACK, window scale).
//!
//! `handshake` opens connections, `input` processes arriving segments in RFC 9293 §3.10's
//! step order and `output` builds the segments to send.
//!
//! # Driving contract
//! 1. Feed each segment for this 4-tuple to [`Connection::on_segment`].
//! 2. Call [`Connection::on_timeout`] when [`Connection::poll_at`] is due
//!    ([`PollAt::is_due`](flowstack_wire::PollAt::is_due)).
//! 3. Call [`Connection::poll_transmit`] after 1, 2, or any application call, and send every
//!    segment it emits.
//! 4. When [`Connection::state`] is `Closed`, the owner may drop the connection.

mod dsack;
mod handshake;
mod info;
mod input;
mod lazy;
mod options;
mod output;
mod plpmtud;
mod pmtu;
mod rack;
mod recovery;
mod recv;
mod send;
mod timers;

use crate::config::TcpConfig;
use crate::isn::FourTuple;
use flowstack_wire::{Duration, Instant, SeqNum};
use input::ChallengeAcks;
use options::Options;
use recovery::Recovery;
use recv::Receiver;
use send::Sender;
use std::fmt;
use std::sync::Arc;
use timers::{Timer, Timers};

pub use handshake::syn_option_clamps;
pub use info::{TcpInfo, REST_AFTER};
pub use output::Emit;
pub use pmtu::{IcmpError, MIN_PMTU};

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
    /// The network reported the peer unreachable (an ICMP soft error, reported when the
    /// connection then timed out).
    Unreachable,
}

/// Per-connection statistics (for `ss`-like reports). Segment and event counts wrap after
/// 2³² (as Linux's `tcpi_segs_out`); byte counts do not.
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

/// The counters behind [`ConnStats`], kept in 40 bytes (issue 19): segment and event counts
/// in `u32` — as Linux's `tcpi_segs_out`, they wrap after 2³² — and byte counts in `u64`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stats {
    pub(crate) bytes_acked: u64,
    pub(crate) bytes_received: u64,
    pub(crate) segs_out: u32,
    pub(crate) segs_in: u32,
    pub(crate) retransmits: u32,
    pub(crate) timeouts: u32,
    pub(crate) fast_retransmits: u32,
    pub(crate) fast_path: u32,
}

impl From<Stats> for ConnStats {
    fn from(s: Stats) -> Self {
        ConnStats {
            segs_out: s.segs_out.into(),
            segs_in: s.segs_in.into(),
            retransmits: s.retransmits.into(),
            timeouts: s.timeouts.into(),
            fast_retransmits: s.fast_retransmits.into(),
            bytes_acked: s.bytes_acked,
            bytes_received: s.bytes_received,
            fast_path: s.fast_path.into(),
        }
    }
}

/// One TCP connection.
pub struct Connection {
    /// The socket's configuration, shared by every connection created with the same one
    /// (an engine's defaults, a listener's): cloned only if this connection changes it.
    pub(crate) cfg: Arc<TcpConfig>,
    /// Nagle off (TCP_NODELAY): kept here, not in `cfg`, because applications set it per
    /// connection and a per-connection copy of the configuration would cost its size.
    pub(crate) nodelay: bool,
    pub(crate) tuple: FourTuple,
    pub(crate) state: State,
    /// Opened by a listener (passive open).
    pub(crate) passive: bool,
    /// Set for one `poll_transmit_gather` whose emitter gathers: a segment is then cut where
    /// a zero-copy send's shared range ends, so that it leaves as a reference, not a copy.
    pub(crate) gathering: bool,
    /// The send side: SND.* and the send queue.
    pub(crate) snd: Sender,
    /// The receive side: RCV.*, the receive buffer and reassembly.
    pub(crate) rcv: Receiver,
    /// Negotiated options.
    pub(crate) opt: Options,
    /// Deadlines and the timer-driven counters.
    pub(crate) timers: Timers,
    /// Congestion control and loss recovery.
    pub(crate) rec: Recovery,
    /// RFC 5961 challenge-ACK rate limit.
    pub(crate) challenge: lazy::Lazy0<ChallengeAcks>,
    /// A reset to send: (sequence number, ACK number if any).
    pub(crate) pending_rst: Option<(SeqNum, Option<SeqNum>)>,
    pub(crate) error: Option<TcpError>,
    /// The last ICMP soft error (RFC 1122 §4.2.3.9): reported instead of "timed out" if
    /// the connection gives up.
    pub(crate) soft_error: Option<TcpError>,
    pub(crate) stats: Stats,
}

impl Connection {
    fn blank(
        cfg: Arc<TcpConfig>,
        tuple: FourTuple,
        iss: SeqNum,
        now: Instant,
        state: State,
    ) -> Self {
        Self {
            nodelay: cfg.nodelay,
            snd: Sender::new(&cfg, iss),
            rcv: Receiver::new(&cfg),
            opt: Options::new(&cfg, iss),
            timers: Timers::new(now),
            rec: Recovery::new(&cfg, iss),
            challenge: lazy::Lazy0::new(),
            cfg,
            tuple,
            state,
            passive: false,
            gathering: false,
            pending_rst: None,
            error: None,
            soft_error: None,
            stats: Stats::default(),
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
    /// The last ICMP soft error reported for the connection, if any.
    pub fn soft_error(&self) -> Option<TcpError> {
        self.soft_error
    }
    /// Statistics.
    pub fn stats(&self) -> ConnStats {
        self.stats.into()
    }
    /// Smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.snd.rtt.srtt()
    }
    /// Current retransmission timeout.
    pub fn rto(&self) -> Duration {
        self.snd.rtt.rto()
    }
    /// Congestion window in bytes.
    pub fn cwnd(&self) -> usize {
        self.rec.cc.cwnd()
    }
    /// Effective send MSS: the peer's MSS option, lowered by path MTU discovery.
    pub fn mss(&self) -> usize {
        self.snd.mss
    }
    /// The send sequence space: SND.UNA and the highest sequence number sent (SND.NXT).
    pub fn send_seq(&self) -> (SeqNum, SeqNum) {
        (self.snd.una, self.snd.max)
    }
    /// RCV.NXT: the next sequence number expected from the peer.
    pub fn recv_next(&self) -> SeqNum {
        self.rcv.nxt
    }
    /// Peer's window in bytes.
    pub fn send_window(&self) -> usize {
        self.snd.wnd
    }
    /// Bytes queued to send (unsent plus unacknowledged).
    pub fn send_queue(&self) -> usize {
        self.snd.queue.len()
    }
    /// Free room in the send buffer: what `send` would take now.
    pub fn send_room(&self) -> usize {
        self.snd.queue.window()
    }
    /// Bytes received and not yet read.
    pub fn recv_queue(&self) -> usize {
        self.rcv.buf.len()
    }
    /// Whether timestamps / SACK / window scaling were negotiated.
    pub fn options(&self) -> (bool, bool, u8, u8) {
        (
            self.opt.ts,
            self.opt.sack,
            self.opt.snd_wscale,
            self.opt.rcv_wscale,
        )
    }
    /// Changes Nagle (TCP_NODELAY).
    pub fn set_nodelay(&mut self, on: bool) {
        self.nodelay = on;
    }
    /// Changes keepalive.
    pub fn set_keepalive(&mut self, k: Option<crate::Keepalive>, now: Instant) {
        if self.cfg.keepalive != k {
            Arc::make_mut(&mut self.cfg).keepalive = k;
        }
        self.timers.keepalive_sent = 0;
        self.timers
            .update(Timer::Keepalive, k.map(|k| now + k.idle));
    }

    /// True if `recv` would return data, end of stream or an error.
    pub fn is_readable(&self) -> bool {
        !self.rcv.buf.is_empty() || self.rcv.fin_received || self.error.is_some()
    }
    /// True if `send` would accept bytes (or fail at once).
    pub fn is_writable(&self) -> bool {
        self.error.is_some()
            || (self.snd.fin_seq.is_none()
                && matches!(self.state, State::Established | State::CloseWait)
                && self.snd.queue.window() > 0)
    }
    /// True once the handshake has completed (or the connection failed).
    pub fn is_open(&self) -> bool {
        self.state.is_synchronized()
    }

    /// Queues bytes to send; returns how many were taken (at most the free send buffer).
    pub fn send(&mut self, data: &[u8]) -> Result<usize, TcpError> {
        self.may_send()?;
        Ok(self.snd.queue.enqueue(data))
    }

    /// As [`Connection::send`], for up to `n` bytes that `fill(dst, at)` writes straight
    /// into the send buffer (bytes `at..at + dst.len()` of the `n`, in order).
    pub fn send_with(
        &mut self,
        n: usize,
        fill: impl FnMut(&mut [u8], usize),
    ) -> Result<usize, TcpError> {
        self.may_send()?;
        Ok(self.snd.queue.enqueue_with(n, fill))
    }

    /// Whether the application may queue data: not after a failure (that error) nor once its
    /// sending side is closed.
    fn may_send(&self) -> Result<(), TcpError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.snd.fin_seq.is_some()
            || !matches!(
                self.state,
                State::SynSent | State::SynReceived | State::Established | State::CloseWait
            )
        {
            return Err(TcpError::Aborted);
        }
        Ok(())
    }

    /// Copies received bytes into `out`. `Ok(0)` with a nonempty `out` means end of stream;
    /// `Err(None)` means nothing to read yet; `Err(Some(e))` means the connection failed.
    pub fn recv(&mut self, out: &mut [u8]) -> Result<usize, Option<TcpError>> {
        if !self.rcv.buf.is_empty() {
            let n = self.rcv.buf.dequeue(out);
            self.after_read();
            return Ok(n);
        }
        if self.rcv.fin_received {
            return Ok(0);
        }
        Err(self.error)
    }

    /// Zero-copy send: queues an application-owned buffer without copying it. Returns its
    /// token, later reported by [`Connection::take_zc_completion`] once every byte is
    /// acknowledged, or `Ok(None)` if the buffer does not fit in the send window now.
    /// Tokens count up from 0 and complete in that order (an empty buffer with the one
    /// before it). Taking completions is optional: the queue lets go of each buffer when it
    /// is acknowledged, and a completion not taken is a count, not memory (at most
    /// `u32::MAX` are remembered; beyond that the oldest untaken is forgotten).
    pub fn send_zc(
        &mut self,
        buf: impl Into<crate::sendq::ExtBuf>,
    ) -> Result<Option<u64>, TcpError> {
        self.may_send()?;
        let token = self.snd.zc_token;
        if !self.snd.queue.enqueue_ext(buf) {
            return Ok(None);
        }
        self.snd.zc_token += 1;
        self.snd.zc_unreported = self.snd.zc_unreported.saturating_add(1);
        Ok(Some(token))
    }

    /// The token of a zero-copy buffer that has been fully acknowledged (its memory is
    /// free), oldest first; each is reported once.
    pub fn take_zc_completion(&mut self) -> Option<u64> {
        if self.zc_completions_pending() == 0 {
            return None;
        }
        let token = self.snd.zc_token - u64::from(self.snd.zc_unreported);
        self.snd.zc_unreported -= 1;
        Some(token)
    }

    /// Zero-copy buffers completed and not yet reported by
    /// [`Connection::take_zc_completion`] (nothing is held for them).
    pub fn zc_completions_pending(&self) -> usize {
        (self.snd.zc_unreported as usize).saturating_sub(self.snd.queue.zc_pending())
    }

    /// Replaces the borrowed memory of the queued zero-copy buffers lent by `owner` by heap
    /// copies of their unacknowledged bytes, releasing the owner; returns the bytes copied.
    /// See [`crate::sendq::SendQueue::rehome`].
    pub fn rehome_zc(&mut self, owner: &crate::sendq::SharedOwner) -> usize {
        self.snd.queue.rehome(owner)
    }

    /// Zero-copy receive: up to two slices of readable bytes; call [`Connection::consume`]
    /// with how many were used.
    pub fn peek_recv(&self, max: usize) -> (&[u8], &[u8]) {
        self.rcv.buf.slices(0, max)
    }

    /// Marks `n` peeked bytes as read.
    pub fn consume(&mut self, n: usize) {
        self.rcv.buf.consume(n);
        self.after_read();
    }

    /// Limits the window offered to what a reader beyond the receive buffer can take:
    /// `limit` bytes, the buffered ones included (`usize::MAX`, or anything from `u32::MAX`
    /// up: the buffer alone). Bytes handed over during input (`Connection::on_segment_to`)
    /// count against it until the next call. A daemon that delivers received bytes straight into an application's
    /// memory sets the application's remaining credit, so the peer sends what the
    /// application can take at once and the buffer stays a fallback (one copy instead of
    /// two). The right edge still never moves left (RFC 9293 §3.8.6.2.2): a shrunken limit
    /// closes the window only as the peer fills what was offered. A limit that grows is
    /// announced as a read is ([`Connection::consume`]). Returns whether the limit changed.
    pub fn set_read_limit(&mut self, limit: usize) -> bool {
        // Above 4 GiB no window can tell the difference (RFC 7323 §2.3: at most 2^30).
        let limit = limit.min(u32::MAX as usize) as u32;
        if self.rcv.limit == limit {
            return false;
        }
        self.rcv.limit = limit;
        self.after_read();
        true
    }

    /// RFC 9293 §3.8.6.2.2: after the application reads, announce the larger window once it
    /// has grown by min(buffer/2, MSS) — and at once if it had been closed.
    pub(crate) fn after_read(&mut self) {
        if !self.state.is_synchronized() {
            return;
        }
        if self.rcv.read_opens_window(self.snd.mss) {
            self.rcv.ack_now = true;
        }
    }

    /// Closes the sending side (FIN after queued data); reading continues (half-close).
    pub fn shutdown_write(&mut self) {
        match self.state {
            // Before the handshake completes the FIN waits; the state moves to FIN-WAIT-1
            // once established (RFC 9293 §3.10.4 queues the close behind the open).
            State::SynSent | State::SynReceived if self.snd.fin_seq.is_none() => {
                self.snd.fin_seq = Some(self.snd.iss + 1 + self.snd.queue.len());
            }
            State::Established => {
                self.snd.fin_seq = Some(self.snd.data_end());
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.snd.fin_seq = Some(self.snd.data_end());
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// Closes the connection: FIN after queued data, and the application reads no more. If
    /// received data was never read, the connection is reset instead (RFC 2525 §2.17), so
    /// the peer learns that data was lost.
    pub fn close(&mut self, now: Instant) {
        self.rcv.app_closed = true;
        if !self.rcv.buf.is_empty() {
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
            self.pending_rst = Some((self.snd.nxt, None));
        }
        self.error.get_or_insert(TcpError::Aborted);
        self.enter_closed();
    }

    /// The handshake completed: enter ESTABLISHED, or FIN-WAIT-1 if the application already
    /// closed its sending side.
    pub(crate) fn enter_established(&mut self) {
        self.state = if self.snd.fin_seq.is_some() {
            State::FinWait1
        } else {
            State::Established
        };
    }

    pub(crate) fn enter_closed(&mut self) {
        self.state = State::Closed;
        self.timers.cancel_all();
    }

    /// Data bytes in a full-sized segment: the MSS less the options every segment carries
    /// (timestamps), so "full-sized" means what the peer actually sends (RFC 6691).
    pub(crate) fn full_seg(&self) -> usize {
        self.snd.mss - if self.opt.ts { 12 } else { 0 }
    }
}
