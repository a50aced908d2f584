//! TCP_INFO-style per-connection state, the user timeout (RFC 5482 / RFC 9293 §3.8.3) and
//! SO_LINGER for the native API.

use super::{Connection, State, TcpError, Timer};
use flowstack_wire::{Duration, Instant};

/// What `getsockopt(TCP_INFO)` reports on Linux, for one connection.
#[derive(Debug, Clone, Copy)]
pub struct TcpInfo {
    /// Current state.
    pub state: State,
    /// Smoothed RTT, once measured.
    pub srtt: Option<Duration>,
    /// RTT variation (RFC 6298 RTTVAR).
    pub rttvar: Duration,
    /// Current retransmission timeout.
    pub rto: Duration,
    /// Effective send MSS (after the peer's option and path MTU discovery).
    pub snd_mss: usize,
    /// The path MTU the connection sends at: the effective MSS plus 40 bytes of IP and TCP
    /// headers (Linux `tcpi_pmtu`).
    pub pmtu: usize,
    /// The RFC 4821 search range (search_low, search_high) as MSS values, once probing
    /// has started (`TcpConfig::plpmtud`).
    pub mtu_search: Option<(usize, usize)>,
    /// Congestion window in bytes.
    pub cwnd: usize,
    /// Slow-start threshold in bytes (`usize::MAX` until the first loss).
    pub ssthresh: usize,
    /// The peer's receive window in bytes.
    pub snd_wnd: usize,
    /// Bytes sent and not yet acknowledged.
    pub unacked: usize,
    /// Bytes queued to send (unsent plus unacknowledged).
    pub send_queue: usize,
    /// Bytes received and not yet read.
    pub recv_queue: usize,
    /// Timeouts in a row without progress (Linux `tcpi_retransmits`).
    pub backoff: u32,
    /// Timestamps, SACK, send and receive window-scale shifts negotiated.
    pub options: (bool, bool, u8, u8),
    /// The last ICMP soft error, if any.
    pub soft_error: Option<TcpError>,
    /// Counters of the connection's life.
    pub stats: super::ConnStats,
}

/// How long a connection must have received nothing before
/// [`Connection::release_at_rest`] frees its empty buffers — except in TIME-WAIT, which
/// rests at once: both FINs are in and acknowledged, so nothing will be sent or arrive
/// again, and the buffers would only sit there for 2·MSL. (Under a stream of short
/// connections the TIME-WAIT population is the table's size — 16 k connections holding
/// ~9 KiB each, 150 MB of cold memory the allocator recycled for every new connection.)
pub const REST_AFTER: Duration = Duration::from_secs(1);

impl Connection {
    /// The connection's TCP_INFO.
    pub fn info(&self) -> TcpInfo {
        TcpInfo {
            state: self.state,
            srtt: self.snd.rtt.srtt(),
            rttvar: self.snd.rtt.rttvar(),
            rto: self.snd.rtt.rto(),
            snd_mss: self.snd.mss,
            pmtu: self.snd.mss + 40,
            mtu_search: self.mtu_search(),
            cwnd: self.rec.cc.cwnd(),
            ssthresh: self.rec.cc.ssthresh(),
            snd_wnd: self.snd.wnd,
            unacked: self.snd.max - self.snd.una,
            send_queue: self.snd.queue.len(),
            recv_queue: self.rcv.buf.len(),
            backoff: self.timers.retries,
            options: self.options(),
            soft_error: self.soft_error,
            stats: self.stats.into(),
        }
    }

    /// Heap bytes this connection holds now, beyond its own `size_of`: buffer allocations,
    /// the reassembly and SACK lists, RACK's segment records, the send scratch space and
    /// any lazily allocated state, and its share of a configuration shared with others (its
    /// size divided by the number of holders). Honest accounting for `bench conns`:
    /// capacities, not lengths.
    pub fn heap_bytes(&self) -> usize {
        let arc = std::mem::size_of::<crate::TcpConfig>() + 2 * std::mem::size_of::<usize>();
        arc / std::sync::Arc::strong_count(&self.cfg)
            + self.snd.queue.heap_bytes()
            + self.snd.scratch.heap_bytes()
            + self.rcv.buf.allocated()
            + self.rcv.ofo.heap_bytes()
            + self.rec.sack.heap_bytes()
            + self.rec.cc.heap_bytes()
            + self.timers.heap_bytes()
            + if self.challenge.is_allocated() {
                std::mem::size_of::<super::input::ChallengeAcks>()
            } else {
                0
            }
            + self
                .rec
                .rto_undo
                .as_ref()
                .map_or(0, |_| std::mem::size_of::<super::recovery::RtoUndo>())
            + if self.rec.rack.is_allocated() {
                std::mem::size_of::<super::rack::Rack>() + self.rec.rack.heap_bytes()
            } else {
                0
            }
    }

    /// Returns the data path's memory once the connection is at rest (issue 19): the send
    /// queue (empty; zero-copy completions not yet taken are counters and stay), the send
    /// path's gather space, the receive ring (empty, no out-of-order bytes parked past its
    /// end), the busy part of the timers (every data-path timer stopped, retry and probe
    /// counters zero), the challenge-ACK limiter and RACK's empty record list. They come
    /// back on the next send, arriving data or armed timer; behaviour is unchanged.
    /// Freeing is the owner's call, not done per packet: an engine does it for connections
    /// quiet for [`REST_AFTER`], so a busy connection keeps its buffers between bursts.
    /// Returns the heap bytes freed.
    pub fn release_at_rest(&mut self, now: Instant) -> usize {
        if now.saturating_since(self.timers.last_activity) < self.rest_after() {
            return 0;
        }
        let before = self.heap_bytes();
        if !self.timers.probe_now {
            self.timers.release_at_rest();
        }
        self.snd.queue.release_at_rest();
        self.snd.scratch.release_at_rest();
        self.challenge.release_at_rest();
        if self.rack_records_idle() {
            // Nothing in flight: the record list's memory goes (RACK's own state stays).
            self.rec.rack.segs = std::collections::VecDeque::new();
        }
        if self.rcv.ofo.is_empty() {
            self.rcv.buf.release_if_empty();
        }
        before - self.heap_bytes()
    }

    /// Heap held by loss recovery and reassembly — the SACK scoreboard and the out-of-order
    /// ranges. Allocated when a loss or a hole appears, returned once recovery is over and
    /// every hole is filled, so an idle connection holds none.
    pub fn recovery_heap_bytes(&self) -> usize {
        self.rcv.ofo.heap_bytes() + self.rec.sack.heap_bytes()
    }

    /// Bytes of memory this connection costs: its `size_of` plus [`Connection::heap_bytes`].
    pub fn footprint(&self) -> usize {
        std::mem::size_of::<Connection>() + self.heap_bytes()
    }

    /// When [`Connection::release_at_rest`] will free something, if the connection stays
    /// quiet: `None` unless it holds releasable memory and all of it is at rest (queues
    /// empty, data-path timers stopped). A deadline for [`Connection::poll_at`], so an
    /// owner that only wakes for deadlines still gives the memory back.
    #[inline]
    pub(crate) fn rest_deadline(&self) -> Option<Instant> {
        // Busy first (the cheap checks that end it on the data path), then holding.
        if !self.snd.queue.is_empty() || !self.rcv.buf.is_empty() || !self.rcv.ofo.is_empty() {
            return None;
        }
        let holds = self.timers.is_allocated()
            || self.snd.queue.is_allocated()
            || self.snd.scratch.is_allocated()
            || self.challenge.is_allocated()
            || self.rack_records_idle()
            || self.rcv.buf.allocated() > 0;
        if !holds || !self.timers.is_at_rest() {
            return None;
        }
        Some(self.timers.last_activity + self.rest_after())
    }

    /// The quiet time before the buffers go ([`REST_AFTER`]; none in TIME-WAIT).
    #[inline]
    fn rest_after(&self) -> Duration {
        if self.state == State::TimeWait {
            Duration::ZERO
        } else {
            REST_AFTER
        }
    }

    /// RACK's record list holds memory but no record (nothing in flight).
    fn rack_records_idle(&self) -> bool {
        self.rec.rack.is_allocated()
            && self.rec.rack.segs.is_empty()
            && self.rec.rack.segs.capacity() > 0
    }

    /// Sets the user timeout (RFC 5482, Linux TCP_USER_TIMEOUT): how long sent data may stay
    /// unacknowledged before the connection is aborted with "timed out"; `None` leaves it to
    /// the retransmission limit.
    pub fn set_user_timeout(&mut self, t: Option<Duration>) {
        if self.cfg.user_timeout != t {
            std::sync::Arc::make_mut(&mut self.cfg).user_timeout = t;
        }
    }

    /// RFC 5482 §2: whether data has been unacknowledged for longer than the user timeout.
    pub(crate) fn user_timeout_expired(&self, now: Instant) -> bool {
        match (self.cfg.user_timeout, self.timers.unacked_since) {
            (Some(limit), Some(since)) => now.saturating_since(since) >= limit,
            _ => false,
        }
    }

    /// Closes with SO_LINGER semantics: `Duration::ZERO` aborts at once (an RST, unsent data
    /// discarded, as Linux); otherwise the connection closes gracefully but is aborted if the
    /// close has not completed (our FIN acknowledged) within `linger`. Sans-IO, so the call
    /// never blocks: the deadline runs in the background (a blocking `close` would wait).
    pub fn close_linger(&mut self, now: Instant, linger: Duration) {
        if linger == Duration::ZERO {
            return self.abort(now);
        }
        self.close(now);
        if self.state != State::Closed {
            self.timers.set(Timer::Linger, now + linger);
        }
    }

    /// The linger deadline passed: abort unless the close completed.
    pub(crate) fn on_linger(&mut self, now: Instant) {
        if matches!(
            self.state,
            State::FinWait1 | State::Closing | State::LastAck | State::SynSent | State::SynReceived
        ) {
            self.abort(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    /// Issue 19: what a connection costs in place, part by part (printed with
    /// `--nocapture`); the total is bounded so that growth is a decision, not an accident.
    #[test]
    fn the_tcb_stays_small() {
        let parts = [
            ("Connection", size_of::<super::Connection>()),
            ("Sender", size_of::<super::super::send::Sender>()),
            ("Receiver", size_of::<super::super::recv::Receiver>()),
            ("Recovery", size_of::<super::super::recovery::Recovery>()),
            ("Congestion", size_of::<crate::cc::Congestion>()),
            ("RttEstimator", size_of::<crate::rtt::RttEstimator>()),
            ("RingBuffer", size_of::<crate::buffer::RingBuffer>()),
            ("Timers", size_of::<super::super::timers::Timers>()),
            ("Options", size_of::<super::super::options::Options>()),
            ("Stats", size_of::<super::super::Stats>()),
        ];
        for (name, size) in parts {
            eprintln!("{name:>12} {size:4} B");
        }
        assert!(size_of::<super::Connection>() <= 456);
        assert_eq!(size_of::<crate::buffer::RingBuffer>(), 16);
        assert_eq!(size_of::<super::super::timers::Timers>(), 48);
        assert_eq!(size_of::<crate::cc::Congestion>(), 24);
        assert_eq!(size_of::<crate::rtt::RttEstimator>(), 32);
    }
}
