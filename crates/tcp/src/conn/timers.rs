//! Timers: retransmission (RFC 6298), delayed ACK, persist (zero-window probing), keepalive
//! (RFC 1122 §4.2.3.6) and the bounded lifetime of every closing state.

use super::{Connection, State, TcpError};
use crate::counters::{Counter, Counters};
use flowstack_wire::Instant;

impl Connection {
    /// The earliest instant at which [`Connection::on_timeout`] has work.
    pub fn poll_at(&self) -> Option<Instant> {
        if self.ack_now || self.pending_rst.is_some() || self.probe_now {
            return Some(Instant::ZERO);
        }
        [
            self.rto_at,
            self.delack_at,
            self.persist_at,
            self.keepalive_at,
            self.deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Fires every timer due at `now`.
    pub fn on_timeout(&mut self, now: Instant, c: &mut Counters) {
        if self.deadline.is_some_and(|d| d <= now) {
            self.deadline = None;
            match self.state {
                State::TimeWait => return self.enter_closed(),
                State::FinWait2 | State::CloseWait => {
                    if now.saturating_since(self.last_activity)
                        >= self.idle_limit().unwrap_or_default()
                    {
                        self.error.get_or_insert(TcpError::TimedOut);
                        self.pending_rst = Some((self.snd_nxt, None));
                        return self.enter_closed();
                    }
                    self.deadline = self.idle_limit().map(|l| self.last_activity + l);
                }
                _ => {}
            }
        }
        if self.delack_at.is_some_and(|d| d <= now) {
            self.delack_at = None;
            self.ack_now = true;
            c.inc(Counter::TcpExtDelayedACKs);
        }
        if self.rto_at.is_some_and(|d| d <= now) {
            self.rto_at = None;
            self.on_rto(now, c);
        }
        if self.persist_at.is_some_and(|d| d <= now) {
            self.persist_at = None;
            let unsent = (self.snd_una_data() + self.send_buf.len()) - self.snd_nxt;
            if self.snd_max == self.snd_una && unsent > 0 && self.state.is_synchronized() {
                // A closing connection must not probe a closed window forever: there the
                // probes count against the retransmission limit (as Linux's orphan retries).
                if matches!(
                    self.state,
                    State::FinWait1 | State::Closing | State::LastAck
                ) {
                    self.retries += 1;
                    if self.retries > self.cfg.max_retries {
                        c.inc(Counter::TcpExtTCPAbortOnTimeout);
                        self.error = Some(TcpError::TimedOut);
                        return self.enter_closed();
                    }
                }
                if self.snd_wnd == 0 {
                    c.inc(Counter::TcpExtTCPWinProbe);
                }
                self.probe_now = true;
                self.persist_backoff = (self.persist_backoff + 1).min(10);
                let wait = (self.rtt.rto() * (1 << self.persist_backoff)).min(self.cfg.rto_max);
                self.persist_at = Some(now + wait);
            }
        }
        if self.keepalive_at.is_some_and(|d| d <= now) {
            self.keepalive_at = None;
            if let Some(k) = self.cfg.keepalive {
                if self.keepalive_sent >= k.probes {
                    self.error = Some(TcpError::TimedOut);
                    return self.enter_closed();
                }
                if self.state == State::Established && self.snd_max == self.snd_una {
                    self.keepalive_sent += 1;
                    self.probe_now = true;
                    c.inc(Counter::TcpExtTCPKeepAlive);
                    self.keepalive_at = Some(now + k.interval);
                } else {
                    self.keepalive_at = Some(now + k.idle);
                }
            }
        }
    }

    fn idle_limit(&self) -> Option<flowstack_wire::Duration> {
        match self.state {
            State::FinWait2 => Some(self.cfg.fin_wait2_timeout),
            State::CloseWait => Some(self.cfg.close_wait_timeout),
            _ => None,
        }
    }

    /// RFC 6298 §5.4–5.7: retransmit the earliest unacknowledged segment, back off, collapse
    /// the window (RFC 5681 §3.1), and give up after the configured number of tries.
    fn on_rto(&mut self, now: Instant, c: &mut Counters) {
        if self.snd_max == self.snd_una {
            return;
        }
        self.retries += 1;
        let limit = match self.state {
            State::SynSent | State::SynReceived => self.cfg.syn_retries,
            _ => self.cfg.max_retries,
        };
        if self.retries > limit {
            c.inc(Counter::TcpExtTCPAbortOnTimeout);
            if self.state == State::SynSent {
                c.inc(Counter::TcpAttemptFails);
            }
            self.error = Some(TcpError::TimedOut);
            return self.enter_closed();
        }
        c.inc(Counter::TcpExtTCPTimeouts);
        self.stats.timeouts += 1;
        self.cc.on_rto(self.flight());
        self.rtt.back_off();
        self.rtt_probe = None;
        self.in_recovery = false;
        self.dupacks = 0;
        self.recover = self.snd_max;
        // RFC 6675 §5.1: keep using SACK information after a timeout, so the go-back-N
        // resend skips what the receiver holds. A second timeout without progress may mean
        // the receiver reneged: then forget it (as Linux's reneging check does).
        if self.retries >= 2 {
            self.sack.clear();
        }
        // Go back N: resend from the oldest unacknowledged byte (or the SYN).
        self.snd_nxt = self.snd_una;
        self.rto_at = Some(now + self.rtt.rto());
    }
}
