//! Timers: retransmission (RFC 6298), delayed ACK, persist (zero-window probing), keepalive
//! (RFC 1122 §4.2.3.6) and the bounded lifetime of every closing state.

use super::{Connection, State, TcpError};
use crate::counters::{Counter, Counters};
use flowstack_wire::{Duration, Instant, PollAt};

/// The connection's timers, each an index into [`Timers`]' tables. The first three live in
/// the connection: those an otherwise idle connection has armed (keepalive; the bounded
/// lifetime of a closing state, TIME-WAIT's included) and the retransmission timer, which
/// the handshake arms (so opening a connection allocates nothing that is freed later). The
/// rest live in [`Active`], allocated while the connection is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// Keepalive (RFC 1122 §4.2.3.6).
    Keepalive,
    /// The bounded lifetime of a closing state: TIME-WAIT's 2·MSL, FIN-WAIT-2 and
    /// CLOSE-WAIT idle limits.
    Lifetime,
    /// Retransmission timeout (RFC 6298).
    Rto,
    /// Delayed ACK (RFC 1122 §4.2.3.2).
    DelayedAck,
    /// Persist: zero-window probe and sender SWS override (RFC 9293 §3.8.6.1).
    Persist,
    /// SO_LINGER: the deadline of a graceful close.
    Linger,
    /// RACK reordering timer (RFC 8985 §6.3).
    Reorder,
    /// Tail loss probe timeout, PTO (RFC 8985 §7.2).
    Tlp,
}

/// Timers kept in the connection itself (`Keepalive`, `Lifetime`, `Rto`).
const RESTING: usize = 3;
/// Timers kept in [`Active`] (`DelayedAck` … `Tlp`).
const ACTIVE: usize = Timer::Tlp as usize + 1 - RESTING;

/// The connection's deadlines and the counters the timers keep (issue 19: 48 bytes at
/// rest). The busy part — the delayed-ACK, persist, linger and RACK timers, the persist
/// backoff, the user timeout's and zero window's clocks — is [`Active`], allocated on first
/// write and freed by [`Timers::release_at_rest`] once everything in it is back at its
/// initial value; reads of an unallocated one see [`IDLE`]. Its fields are reached through
/// `Deref` (`timers.unacked_since`); writing one allocates.
pub(crate) struct Timers {
    /// Deadlines of the resting timers; [`UNARMED`] for a stopped timer (half the size of
    /// `Option<Instant>`, and the earliest deadline is a plain minimum).
    resting: [Instant; RESTING],
    /// When the last segment arrived (the idle limit of FIN-WAIT-2 and CLOSE-WAIT).
    pub(crate) last_activity: Instant,
    /// Retransmission timeouts (or closing-state probes) in a row without progress.
    pub(crate) retries: u32,
    /// Keepalive probes sent without an answer (counts to 255; the limit is compared
    /// saturated).
    pub(crate) keepalive_sent: u8,
    /// A persist or keepalive probe is to be sent by the next `poll_transmit`.
    pub(crate) probe_now: bool,
    active: Option<Box<Active>>,
}

/// The busy part of [`Timers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Active {
    /// Deadlines of `DelayedAck` … `Tlp`, as `Timers::resting`.
    at: [Instant; ACTIVE],
    /// Exponent of the persist timer's backoff (at most 10).
    pub(crate) persist_backoff: u8,
    /// Since when the peer's window has been zero while we had data to send.
    pub(crate) zero_window_since: Option<Instant>,
    /// Since when sent data has been waiting for an acknowledgment without progress (the
    /// user timeout's clock, RFC 5482).
    pub(crate) unacked_since: Option<Instant>,
}

/// [`Active`] at rest: what reads of an unallocated one see, and what a fresh one is.
static IDLE: Active = Active {
    at: [UNARMED; ACTIVE],
    persist_backoff: 0,
    zero_window_since: None,
    unacked_since: None,
};

/// The deadline of a stopped timer: later than any instant (`Instant::FAR_FUTURE` included).
const UNARMED: Instant = Instant::from_nanos(u64::MAX);

/// `Some(at)` unless `at` is [`UNARMED`].
fn armed(at: Instant) -> Option<Instant> {
    (at != UNARMED).then_some(at)
}

impl std::ops::Deref for Timers {
    type Target = Active;
    #[inline]
    fn deref(&self) -> &Active {
        self.active.as_deref().unwrap_or(&IDLE)
    }
}

impl std::ops::DerefMut for Timers {
    #[inline]
    fn deref_mut(&mut self) -> &mut Active {
        self.active.get_or_insert_with(|| Box::new(IDLE.clone()))
    }
}

impl Timers {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            resting: [UNARMED; RESTING],
            last_activity: now,
            retries: 0,
            keepalive_sent: 0,
            probe_now: false,
            active: None,
        }
    }

    /// The deadline slot of `t`, if it exists (an unallocated [`Active`] has none).
    #[inline]
    fn slot(&self, t: Timer) -> Instant {
        let i = t as usize;
        if i < RESTING {
            self.resting[i]
        } else {
            self.active.as_ref().map_or(UNARMED, |a| a.at[i - RESTING])
        }
    }

    #[inline]
    fn slot_mut(&mut self, t: Timer) -> &mut Instant {
        let i = t as usize;
        if i < RESTING {
            &mut self.resting[i]
        } else {
            &mut self.at[i - RESTING]
        }
    }

    /// True if `t` is armed.
    #[inline]
    pub(crate) fn is_armed(&self, t: Timer) -> bool {
        self.slot(t) != UNARMED
    }

    /// When `t` fires, if armed.
    #[inline]
    pub(crate) fn deadline(&self, t: Timer) -> Option<Instant> {
        armed(self.slot(t))
    }

    /// Arms `t` for `at` (re-arms it if it was set).
    #[inline]
    pub(crate) fn set(&mut self, t: Timer, at: Instant) {
        debug_assert!(at != UNARMED);
        *self.slot_mut(t) = at;
    }

    /// Arms `t` for `at` unless it is already armed.
    #[inline]
    pub(crate) fn set_if_idle(&mut self, t: Timer, at: Instant) {
        if !self.is_armed(t) {
            self.set(t, at);
        }
    }

    /// Arms `t` for `at`, or stops it when `at` is `None`.
    #[inline]
    pub(crate) fn update(&mut self, t: Timer, at: Option<Instant>) {
        match at {
            Some(at) => self.set(t, at),
            None => self.cancel(t),
        }
    }

    /// Stops `t` (never allocates).
    #[inline]
    pub(crate) fn cancel(&mut self, t: Timer) {
        let i = t as usize;
        if i < RESTING {
            self.resting[i] = UNARMED;
        } else if let Some(a) = &mut self.active {
            a.at[i - RESTING] = UNARMED;
        }
    }

    /// Stops every timer.
    pub(crate) fn cancel_all(&mut self) {
        self.resting = [UNARMED; RESTING];
        if let Some(a) = &mut self.active {
            a.at = [UNARMED; ACTIVE];
        }
    }

    /// The earliest armed deadline.
    #[inline]
    pub(crate) fn next(&self) -> Option<Instant> {
        let rest = self.resting.iter().copied().min().unwrap_or(UNARMED);
        let act = self
            .active
            .as_ref()
            .map_or(UNARMED, |a| a.at.iter().copied().min().unwrap_or(UNARMED));
        armed(rest.min(act))
    }

    /// If `t` is due at `now`, stops it and returns true (the caller fires it).
    #[inline]
    pub(crate) fn take_due(&mut self, t: Timer, now: Instant) -> bool {
        let d = self.slot(t);
        let due = d != UNARMED && d <= now;
        if due {
            self.cancel(t);
        }
        due
    }

    /// Frees the busy part once every timer in it is stopped and every counter and clock
    /// in it is back at its initial value; true if nothing is allocated afterwards.
    pub(crate) fn release_at_rest(&mut self) {
        if self.is_at_rest() {
            self.active = None;
        }
    }

    /// The window opened: the persist backoff and the zero window's clock restart (without
    /// allocating the busy part if it is at rest).
    #[inline]
    pub(crate) fn reset_persist(&mut self) {
        if let Some(a) = &mut self.active {
            a.persist_backoff = 0;
            a.zero_window_since = None;
        }
    }

    /// Sets the user timeout's clock (without allocating the busy part to store `None`).
    #[inline]
    pub(crate) fn set_unacked_since(&mut self, since: Option<Instant>) {
        if since.is_some() || self.active.is_some() {
            self.unacked_since = since;
        }
    }

    /// True if the busy part is allocated.
    #[inline]
    pub(crate) fn is_allocated(&self) -> bool {
        self.active.is_some()
    }

    /// True if the busy part is unallocated or back at its initial value.
    #[inline]
    pub(crate) fn is_at_rest(&self) -> bool {
        self.active.as_deref().is_none_or(|a| *a == IDLE)
    }

    /// Heap held: the busy part, if allocated.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.active
            .as_ref()
            .map_or(0, |_| std::mem::size_of::<Active>())
    }
}

impl Connection {
    /// When the connection next needs [`Connection::on_timeout`] and
    /// [`Connection::poll_transmit`]: `Now` if a segment is owed (an ACK, a reset or a
    /// probe), else the earliest timer — or the moment a connection at rest gives back its
    /// buffers ([`Connection::release_at_rest`]) — else `Idle` (only input can give it work).
    pub fn poll_at(&self) -> PollAt {
        if self.rcv.ack_now
            || self.pending_rst.is_some()
            || self.timers.probe_now
            || self.rec.rack.tlp_now
        {
            return PollAt::Now;
        }
        match (self.timers.next(), self.rest_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .into()
    }

    /// Fires every timer due at `now`. A timer that closes the connection stops the others,
    /// so those checked after it do not fire.
    pub fn on_timeout(&mut self, now: Instant, c: &mut Counters) {
        if self.timers.take_due(Timer::Lifetime, now) {
            self.on_lifetime(now);
        }
        if self.timers.take_due(Timer::Linger, now) {
            self.on_linger(now);
        }
        if self.timers.take_due(Timer::DelayedAck, now) {
            self.rcv.ack_now = true;
            c.inc(Counter::TcpExtDelayedACKs);
        }
        if self.timers.take_due(Timer::Rto, now) {
            self.on_rto(now, c);
        }
        if self.timers.take_due(Timer::Reorder, now) {
            self.on_reorder_timeout(now, c);
        }
        if self.timers.take_due(Timer::Tlp, now) {
            self.on_tlp_timeout(c);
        }
        if self.timers.take_due(Timer::Persist, now) {
            self.on_persist(now, c);
        }
        if self.timers.take_due(Timer::Keepalive, now) {
            self.on_keepalive(now, c);
        }
        if self.rest_deadline().is_some_and(|t| t <= now) {
            self.release_at_rest(now);
        }
    }

    /// The bounded lifetime of a closing state ran out: TIME-WAIT ends; FIN-WAIT-2 and
    /// CLOSE-WAIT end with a reset once idle for their limit, else wait again.
    fn on_lifetime(&mut self, now: Instant) {
        match self.state {
            State::TimeWait => self.enter_closed(),
            // As Linux's tcp_fin_timeout: the FIN-WAIT-2 limit is for orphans. A socket the
            // application only half-closed may still be receiving (found by `simnet`: a
            // peer stuck behind a PMTU black hole for a minute had its reader reset).
            State::FinWait2 if !self.rcv.app_closed => {
                self.timers
                    .set(Timer::Lifetime, now + self.cfg.fin_wait2_timeout);
            }
            State::FinWait2 | State::CloseWait => {
                if now.saturating_since(self.timers.last_activity)
                    >= self.idle_limit().unwrap_or_default()
                {
                    self.error.get_or_insert(TcpError::TimedOut);
                    self.pending_rst = Some((self.snd.nxt, None));
                    return self.enter_closed();
                }
                let at = self.idle_limit().map(|l| self.timers.last_activity + l);
                self.timers.update(Timer::Lifetime, at);
            }
            _ => {}
        }
    }

    fn idle_limit(&self) -> Option<Duration> {
        match self.state {
            State::FinWait2 => Some(self.cfg.fin_wait2_timeout),
            State::CloseWait => Some(self.cfg.close_wait_timeout),
            _ => None,
        }
    }

    /// The persist timer: probe the peer's zero (or too small) window, backing off.
    fn on_persist(&mut self, now: Instant, c: &mut Counters) {
        let unsent = self.snd.data_end() - self.snd.nxt;
        if !(self.snd.all_acked() && unsent > 0 && self.state.is_synchronized()) {
            return;
        }
        // A closing connection must not probe a closed window forever: there the probes
        // count against the retransmission limit (as Linux's orphan retries).
        if matches!(
            self.state,
            State::FinWait1 | State::Closing | State::LastAck
        ) {
            self.timers.retries += 1;
            if self.timers.retries > self.cfg.max_retries {
                c.inc(Counter::TcpExtTCPAbortOnTimeout);
                self.error = Some(TcpError::TimedOut);
                return self.enter_closed();
            }
        }
        if self.snd.wnd == 0 {
            // A peer that answers every probe with a zero window could hold the connection
            // (and its send buffer) forever: bound it.
            let since = *self.timers.zero_window_since.get_or_insert(now);
            if self
                .cfg
                .zero_window_timeout
                .is_some_and(|limit| now.saturating_since(since) >= limit)
            {
                c.inc(Counter::TcpExtTCPAbortOnZeroWindow);
                self.error = Some(TcpError::TimedOut);
                self.pending_rst = Some((self.snd.nxt, None));
                return self.enter_closed();
            }
            c.inc(Counter::TcpExtTCPWinProbe);
        } else {
            self.timers.zero_window_since = None;
        }
        self.timers.probe_now = true;
        self.timers.persist_backoff = (self.timers.persist_backoff + 1).min(10);
        let wait = (self.snd.rtt.rto() * (1 << self.timers.persist_backoff)).min(self.cfg.rto_max);
        self.timers.set(Timer::Persist, now + wait);
    }

    /// The keepalive timer (RFC 1122 §4.2.3.6): probe an idle connection, give up after the
    /// configured number of unanswered probes.
    fn on_keepalive(&mut self, now: Instant, c: &mut Counters) {
        let Some(k) = self.cfg.keepalive else {
            return;
        };
        if u32::from(self.timers.keepalive_sent) >= k.probes.min(255) {
            self.error = Some(TcpError::TimedOut);
            return self.enter_closed();
        }
        // As Linux: probes go out in every synchronized state that waits on the peer
        // (a half-closed socket in FIN-WAIT-2 or CLOSE-WAIT too — found by `simnet`: after a
        // peer restart such a socket could otherwise wait forever).
        let waiting = matches!(
            self.state,
            State::Established | State::CloseWait | State::FinWait2
        );
        if waiting && self.snd.all_acked() {
            self.timers.keepalive_sent = self.timers.keepalive_sent.saturating_add(1);
            self.timers.probe_now = true;
            c.inc(Counter::TcpExtTCPKeepAlive);
            self.timers.set(Timer::Keepalive, now + k.interval);
        } else {
            self.timers.set(Timer::Keepalive, now + k.idle);
        }
    }

    pub(crate) fn arm_keepalive(&mut self, now: Instant) {
        let at = self.cfg.keepalive.map(|k| now + k.idle);
        self.timers.update(Timer::Keepalive, at);
    }

    /// RFC 6298 §5.4–5.7: retransmit the earliest unacknowledged segment, back off, collapse
    /// the window (RFC 5681 §3.1), and give up after the configured number of tries.
    fn on_rto(&mut self, now: Instant, c: &mut Counters) {
        if self.snd.all_acked() {
            return;
        }
        self.timers.retries += 1;
        let limit = match self.state {
            State::SynSent | State::SynReceived => self.cfg.syn_retries,
            _ => self.cfg.max_retries,
        };
        if self.timers.retries > limit || self.user_timeout_expired(now) {
            c.inc(Counter::TcpExtTCPAbortOnTimeout);
            if self.state == State::SynSent {
                c.inc(Counter::TcpAttemptFails);
            }
            self.error = Some(self.soft_error.unwrap_or(TcpError::TimedOut));
            return self.enter_closed();
        }
        // A raised path MTU not yet confirmed, whose segments vanished without an ICMP
        // error: the size was the problem, not congestion — like a lost RFC 4821 probe
        // (§7.6.3), it does not collapse the congestion window. The data is resent at the
        // size the path carried, with the timer backed off as for any timeout.
        let raise_lost = self.pmtu_raise_timed_out(now, c);
        // The same for an RFC 4821 probe that timed out at the head (`plpmtud`).
        let probe_lost = !raise_lost && self.plp_timed_out(now, c);
        let size_lost = raise_lost || probe_lost;
        if !size_lost {
            self.blackhole_check(now, c);
        }
        c.inc(Counter::TcpExtTCPTimeouts);
        self.stats.timeouts += 1;
        if self.timers.retries == 1 && self.opt.ts && self.state.is_synchronized() {
            // RFC 3522 §3.2: remember the retransmission's timestamp; an ACK echoing an older
            // one proves the original arrived and the timeout was spurious.
            self.rec.rto_undo = Some(Box::new(super::recovery::RtoUndo {
                cc: self.rec.cc.save(),
                ts: self.opt.ts_now(now),
            }));
        }
        if !size_lost {
            self.rec.cc.on_rto(self.snd.flight());
        }
        self.snd.rtt.back_off();
        self.snd.rtt_probe = None;
        self.rec.in_recovery = false;
        self.rec.dupacks = 0;
        self.rec.recover = self.snd.max;
        // RFC 6675 §5.1: keep using SACK information after a timeout, so the go-back-N
        // resend skips what the receiver holds. A second timeout without progress may mean
        // the receiver reneged: then forget it (as Linux's reneging check does).
        if self.timers.retries >= 2 {
            self.rec.sack.clear();
        }
        self.rack_on_rto(self.timers.retries >= 2);
        // Go back N: resend from the oldest unacknowledged byte (or the SYN).
        self.snd.nxt = self.snd.una;
        self.timers.set(Timer::Rto, now + self.snd.rtt.rto());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_part_comes_and_goes_with_the_data_path_timers() {
        let t0 = Instant::from_millis(5);
        let mut t = Timers::new(t0);
        // The resting timers (and cancelling anything) allocate nothing.
        t.set(Timer::Keepalive, t0 + Duration::from_secs(7200));
        t.set(Timer::Rto, t0 + Duration::from_secs(1));
        t.cancel(Timer::DelayedAck);
        t.reset_persist();
        t.set_unacked_since(None);
        assert!(!t.is_allocated());
        assert_eq!(t.next(), Some(t0 + Duration::from_secs(1)));
        // A data-path timer allocates; the earliest deadline sees both parts.
        t.set(Timer::DelayedAck, t0 + Duration::from_millis(40));
        assert!(t.is_allocated());
        assert_eq!(t.next(), Some(t0 + Duration::from_millis(40)));
        assert!(!t.take_due(Timer::DelayedAck, t0));
        t.release_at_rest();
        assert!(t.is_allocated(), "freed while a timer in it was armed");
        assert!(t.take_due(Timer::DelayedAck, t0 + Duration::from_millis(40)));
        t.unacked_since = Some(t0);
        t.release_at_rest();
        assert!(t.is_allocated(), "freed while the user timeout's clock ran");
        t.set_unacked_since(None);
        t.release_at_rest();
        assert!(!t.is_allocated());
        // The resting timers are untouched by the release.
        assert_eq!(
            t.deadline(Timer::Keepalive),
            Some(t0 + Duration::from_secs(7200))
        );
        assert_eq!(t.next(), Some(t0 + Duration::from_secs(1)));
    }
}
