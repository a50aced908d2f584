//! RACK-TLP (RFC 8985): time-based loss detection and tail loss probes.
//!
//! RACK keeps, for every segment in flight, when it was (last) sent. A segment is lost once a
//! segment sent sufficiently later — later by more than the reordering window — has been
//! delivered (cumulatively ACKed or SACKed). Unlike duplicate-ACK counting this works for a
//! lost retransmission and for a flight of any size. TLP sends one probe when the ACK clock
//! stops (the tail of a flight was lost), so the loss is repaired by RACK from the probe's
//! SACK instead of by a retransmission timeout.
//!
//! The per-segment records live in a ring allocated by the first data segment sent and grown
//! only when the flight outgrows it (amortized: never per packet once the window has been reached).
//! RACK runs only when SACK was negotiated; without it duplicate-ACK counting decides.

use super::output::Emit;
use super::{Connection, Timer};
use crate::config::LossDetection;
use crate::counters::{Counter, Counters};
use flowstack_wire::tcp::TcpRepr;
use flowstack_wire::{Duration, Instant, SeqNum};
use std::collections::VecDeque;

/// RFC 8985 §7.2: WCDelAckT, the worst-case delayed-ACK time added to the PTO when only one
/// segment is in flight (the receiver may hold its ACK that long).
const WC_DEL_ACK: Duration = Duration::from_millis(200);

/// The shortest PTO (Linux: `TCP_TIMEOUT_MIN`-based 10 ms floor).
const TLP_MIN: Duration = Duration::from_millis(10);

/// RFC 8985 §6.2: RACK.reo_wnd_persist's start, the recoveries a widened window lasts.
const REO_WND_PERSIST: u32 = 16;
/// A bound on RACK.reo_wnd_mult (the window is capped at SRTT long before).
const REO_WND_MULT_MAX: u32 = 64;

/// One sent segment (RFC 8985 §5.2 "per-segment variables").
#[derive(Debug, Clone, Copy)]
pub(crate) struct SegMeta {
    pub(crate) start: SeqNum,
    pub(crate) end: SeqNum,
    /// Segment.xmit_ts: when it was last (re)transmitted.
    pub(crate) xmit: Instant,
    /// It has been retransmitted (its delivery may be of the original).
    pub(crate) retrans: bool,
    /// It was SACKed.
    pub(crate) sacked: bool,
    /// Marked lost and not yet retransmitted.
    pub(crate) lost: bool,
}

/// RACK and TLP state (RFC 8985 §5.2, §5.3).
pub(crate) struct Rack {
    /// Sent segments above SND.UNA, in sequence order.
    pub(crate) segs: VecDeque<SegMeta>,
    /// RACK.xmit_ts / RACK.end_seq: the most recently sent segment delivered.
    xmit_ts: Option<Instant>,
    end_seq: SeqNum,
    /// RACK.rtt: the RTT of that segment.
    rtt: Duration,
    /// RACK.min_RTT.
    min_rtt: Option<Duration>,
    /// RACK.fack: the highest sequence number delivered (`None` until the first delivery:
    /// ISS in RFC 8985 §5.2, below every data sequence number, so it compares alike).
    fack: Option<SeqNum>,
    /// RACK.reordering_seen.
    reordering_seen: bool,
    /// TLP.end_seq: SND.NXT when the outstanding probe was sent.
    pub(crate) tlp_end: Option<SeqNum>,
    /// The probe was a retransmission.
    pub(crate) tlp_retrans: bool,
    /// A probe is to be sent by the next `poll_transmit`.
    pub(crate) tlp_now: bool,
    /// RACK.reo_wnd_mult (RFC 8985 §6.2 step 4): the reordering window in quarters of
    /// min_RTT, grown by D-SACKs.
    reo_wnd_mult: u32,
    /// RACK.reo_wnd_persist: recoveries left before `reo_wnd_mult` falls back to 1.
    reo_wnd_persist: u32,
    /// RACK.dsack_round: SND.NXT when the window last grew (once per round trip).
    dsack_round: Option<SeqNum>,
    /// The recovery episode's retransmissions, for a D-SACK undo (`dsack`): cold state kept
    /// in this lazily allocated box rather than in every connection.
    pub(crate) undo: super::dsack::Undo,
    /// A lowered path MTU's expiry (`pmtu`), cold state kept here for the same reason.
    pub(crate) pmtu: super::pmtu::PmtuRaise,
    /// The RFC 4821 search (`plpmtud`), cold state kept here as well.
    pub(crate) plp: super::plpmtud::Search,
}

/// The state of a connection that has sent no data yet: what an unallocated [`LazyRack`]
/// reads as.
static IDLE_RACK: Rack = Rack::new();

/// RACK state allocated on first use: a connection that never sends data (or runs without
/// SACK) holds one pointer, not the whole state. Reads of an unallocated one see
/// [`Rack::new`]; the first write allocates it (the first data segment sent, a state change,
/// not per packet), and it is kept for the connection's life (min_RTT and the reordering
/// seen are long-lived).
pub(crate) struct LazyRack(Option<Box<Rack>>);

impl LazyRack {
    pub(crate) const fn new() -> Self {
        Self(None)
    }
    /// True once written to.
    pub(crate) fn is_allocated(&self) -> bool {
        self.0.is_some()
    }
}

impl std::ops::Deref for LazyRack {
    type Target = Rack;
    fn deref(&self) -> &Rack {
        self.0.as_deref().unwrap_or(&IDLE_RACK)
    }
}

impl std::ops::DerefMut for LazyRack {
    fn deref_mut(&mut self) -> &mut Rack {
        self.0.get_or_insert_with(|| Box::new(Rack::new()))
    }
}

impl Rack {
    pub(crate) const fn new() -> Self {
        Self {
            // Allocated by the first data segment sent, then kept: it grows to the
            // flight's size once.
            segs: VecDeque::new(),
            xmit_ts: None,
            end_seq: SeqNum(0),
            rtt: Duration::ZERO,
            min_rtt: None,
            fack: None,
            reordering_seen: false,
            tlp_end: None,
            tlp_retrans: false,
            tlp_now: false,
            reo_wnd_mult: 1,
            reo_wnd_persist: REO_WND_PERSIST,
            dsack_round: None,
            undo: super::dsack::Undo::new(),
            pmtu: super::pmtu::PmtuRaise::new(),
            plp: super::plpmtud::Search::new(),
        }
    }

    /// Heap bytes held now (the segment records' and the undo record's allocations).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.segs.capacity() * std::mem::size_of::<SegMeta>() + self.undo.heap_bytes()
    }

    /// RFC 8985 §6.2 step 4, on a D-SACK that reported a retransmission needless (the
    /// reordering it proves): "If RACK.dsack_round is not None and SND.UNA >=
    /// RACK.dsack_round: RACK.dsack_round = None. If RACK.dsack_round is None and any DSACK
    /// option is present on latest received ACK: RACK.dsack_round = SND.NXT, RACK.reo_wnd_mult
    /// += 1, RACK.reo_wnd_persist = 16". Deliberately narrower than "any DSACK": one that
    /// matches none of our retransmissions is a network duplicate, no sign of reordering
    /// (Linux likewise ignores D-SACKs that outnumber its retransmissions).
    pub(crate) fn dsack_seen(&mut self, una: SeqNum, nxt: SeqNum) {
        if self.dsack_round.is_some_and(|r| una >= r) {
            self.dsack_round = None;
        }
        if self.dsack_round.is_none() {
            self.dsack_round = Some(nxt);
            // Beyond SRTT the window is capped anyway (step 4's min(…, SRTT)).
            self.reo_wnd_mult = (self.reo_wnd_mult + 1).min(REO_WND_MULT_MAX);
            self.reo_wnd_persist = REO_WND_PERSIST;
        }
    }

    /// RFC 8985 §6.2 step 4: "Else if exiting Fast or RTO recovery: RACK.reo_wnd_persist -=
    /// 1; If RACK.reo_wnd_persist <= 0: RACK.reo_wnd_mult = 1" — a grown window lasts 16
    /// recoveries.
    pub(crate) fn recovery_exited(&mut self) {
        self.reo_wnd_persist = self.reo_wnd_persist.saturating_sub(1);
        if self.reo_wnd_persist == 0 {
            self.reo_wnd_mult = 1;
        }
    }

    /// RFC 8985 §6.2 step 2 helper: was (t1, s1) sent after (t2, s2)?
    fn sent_after(t1: Instant, s1: SeqNum, t2: Instant, s2: SeqNum) -> bool {
        t1 > t2 || (t1 == t2 && s1 > s2)
    }

    /// RFC 8985 §6.2 steps 1–3 for one delivered segment.
    fn on_delivered(&mut self, now: Instant, s: &SegMeta) {
        let rtt = now.saturating_since(s.xmit);
        // Step 2: "If Segment.retransmitted is TRUE and ... the RTT is less than
        // RACK.min_RTT, then the ACK was likely for the original transmission ... skip".
        if s.retrans && self.min_rtt.is_some_and(|m| rtt < m) {
            return;
        }
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        // Step 3 (reordering detection): a never-retransmitted segment below RACK.fack was
        // delivered out of order.
        if !s.retrans && self.fack.is_some_and(|f| s.end < f) {
            self.reordering_seen = true;
        }
        self.fack = Some(self.fack.map_or(s.end, |f| f.max(s.end)));
        let newer = match self.xmit_ts {
            None => true,
            Some(t) => Self::sent_after(s.xmit, s.end, t, self.end_seq),
        };
        if newer {
            self.rtt = rtt;
            self.xmit_ts = Some(s.xmit);
            self.end_seq = s.end;
        }
    }

    /// RFC 8985 §6.2 step 4: the reordering window. "If ... no reordering has been seen and
    /// (the sender is in recovery or ≥ DupThresh segments are SACKed) RACK.reo_wnd = 0";
    /// else "min(RACK.reo_wnd_mult * RACK.min_RTT / 4, SRTT)".
    fn reo_wnd(&self, in_recovery: bool, srtt: Duration) -> Duration {
        if !self.reordering_seen {
            let sacked = self.segs.iter().filter(|s| s.sacked).count();
            if in_recovery || sacked >= crate::sack::DUP_THRESH {
                return Duration::ZERO;
            }
        }
        (self.min_rtt.unwrap_or(Duration::ZERO) / 4 * self.reo_wnd_mult).min(srtt)
    }

    /// Bytes marked lost and not yet retransmitted.
    pub(crate) fn lost_bytes(&self) -> usize {
        self.segs
            .iter()
            .filter(|s| s.lost && !s.sacked)
            .map(|s| s.end - s.start)
            .sum()
    }
}

impl Connection {
    /// RACK runs: configured, and SACK negotiated (without SACK only the cumulative ACK
    /// tells what was delivered and duplicate-ACK counting decides).
    pub(crate) fn rack_on(&self) -> bool {
        self.cfg.loss_detection == LossDetection::Rack && self.opt.sack
    }

    /// Records a transmission of `[seq, end)` (RFC 8985 §6.1: Segment.xmit_ts).
    pub(crate) fn rack_on_send(&mut self, now: Instant, seq: SeqNum, end: SeqNum, max: SeqNum) {
        if !self.rack_on() || end <= seq {
            return;
        }
        let segs = &mut self.rec.rack.segs;
        // Retransmitted part: every record overlapping [seq, min(end, max)).
        let i = segs.partition_point(|s| s.end <= seq);
        for s in segs.range_mut(i..) {
            if s.start >= end.min(max) {
                break;
            }
            s.xmit = now;
            s.retrans = true;
            s.lost = false;
        }
        if end > max {
            let start = seq.max(max);
            segs.push_back(SegMeta {
                start,
                end,
                xmit: now,
                retrans: false,
                sacked: false,
                lost: false,
            });
        }
    }

    /// On an ACK: RACK.* from newly delivered segments (cumulatively ACKed below `ack`, or
    /// newly SACKed), the TLP episode (§7.4), then loss detection (§6.2 step 5).
    pub(crate) fn rack_on_ack(&mut self, now: Instant, seg: &TcpRepr, c: &mut Counters) {
        if !self.rack_on() {
            return;
        }
        let ack = seg.ack;
        if self.rec.rack.is_allocated() {
            self.rack_on_delivery(now, ack);
        }
        self.tlp_on_ack(ack, c);
        self.rack_detect_loss(now, c);
        // RFC 8985 §7.2: re-arm the PTO on an ACK.
        self.arm_tlp(now);
    }

    /// RFC 8985 §6.2 steps 1–3 for every segment newly delivered by an ACK of `ack`: those
    /// cumulatively acknowledged, then those newly SACKed.
    fn rack_on_delivery(&mut self, now: Instant, ack: SeqNum) {
        let rack = &mut *self.rec.rack;
        while let Some(s) = rack.segs.front().copied() {
            if s.end > ack {
                if s.start < ack {
                    rack.segs[0].start = ack;
                }
                break;
            }
            rack.segs.pop_front();
            if !s.sacked {
                rack.on_delivered(now, &s);
            }
        }
        if let Some(high) = self.rec.sack.high() {
            for i in 0..self.rec.rack.segs.len() {
                let s = self.rec.rack.segs[i];
                if s.start >= high {
                    break;
                }
                if !s.sacked
                    && self
                        .rec
                        .sack
                        .sacked_until(s.start)
                        .is_some_and(|e| e >= s.end)
                {
                    self.rec.rack.segs[i].sacked = true;
                    self.rec.rack.segs[i].lost = false;
                    self.rec.rack.on_delivered(now, &s);
                }
            }
        }
    }

    /// RFC 8985 §6.2 step 5: "For each segment ... not SACKed and not yet marked lost: if
    /// RACK.xmit_ts is after Segment.xmit_ts ... remaining = Segment.xmit_ts + RACK.rtt +
    /// RACK.reo_wnd − now; if remaining ≤ 0 mark it lost, else arm the reordering timer for
    /// the largest remaining". Lost segments go to recovery's retransmission loop.
    pub(crate) fn rack_detect_loss(&mut self, now: Instant, c: &mut Counters) {
        let Some(rx) = self.rec.rack.xmit_ts else {
            return;
        };
        let srtt = self.snd.rtt.srtt().unwrap_or(self.rec.rack.rtt);
        let reo = self.rec.rack.reo_wnd(self.rec.in_recovery, srtt);
        let (rtt, end_seq) = (self.rec.rack.rtt, self.rec.rack.end_seq);
        let mut timeout: Option<Instant> = None;
        let mut marked = 0u64;
        for s in self.rec.rack.segs.iter_mut() {
            if s.sacked || s.lost {
                continue;
            }
            if !Rack::sent_after(rx, end_seq, s.xmit, s.end) {
                // Segments are not in send order after retransmissions: go on scanning.
                continue;
            }
            let deadline = s.xmit + rtt + reo;
            if deadline <= now {
                s.lost = true;
                marked += 1;
            } else {
                timeout = Some(timeout.map_or(deadline, |t: Instant| t.max(deadline)));
            }
        }
        self.timers.update(Timer::Reorder, timeout);
        if marked > 0 {
            c.add(Counter::TcpExtTCPRackLoss, marked);
            // RFC 4821 §7.6.2: an RFC 4821 probe lost alone is no congestion signal: its
            // bytes are resent (below) without entering recovery.
            let probe_only = self.plp_rack_lost(now, c);
            if !self.rec.in_recovery && !probe_only {
                if self.rec.rack.tlp_end.is_some() {
                    // The probe's SACK revealed the tail loss: repaired without a timeout.
                    c.inc(Counter::TcpExtTCPLossProbeRecovery);
                }
                // Within the episode of the previous recovery or timeout (RFC 6582's
                // RecoveryPoint) the marked segments are resent without a second window
                // reduction (`poll_transmit` sends them in either case).
                if self.may_enter_recovery() {
                    self.enter_recovery(c);
                }
            }
            if self.rec.in_recovery {
                self.timers.cancel(Timer::Tlp);
            }
        }
    }

    /// The reordering timer fired (RFC 8985 §6.3): detect losses again.
    pub(crate) fn on_reorder_timeout(&mut self, now: Instant, c: &mut Counters) {
        if self.rack_on() && !self.snd.all_acked() {
            self.rack_detect_loss(now, c);
        }
    }

    /// RACK's retransmissions in recovery: segments marked lost, in sequence order, while
    /// the pipe allows (RFC 8985 §6.2: "lost segments are retransmitted by the congestion
    /// control's recovery").
    pub(crate) fn send_rack_lost(
        &mut self,
        now: Instant,
        c: &mut Counters,
        emit: &mut Emit,
    ) -> usize {
        let mut n = 0;
        let mut i = 0;
        while self.pipe() < self.rec.cc.cwnd() {
            let Some(k) = (i..self.rec.rack.segs.len()).find(|&k| {
                let s = &self.rec.rack.segs[k];
                s.lost && !s.sacked
            }) else {
                break;
            };
            let s = self.rec.rack.segs[k];
            // `emit_range` clears `lost` on every record it covers.
            self.rec.rack.segs[k].lost = false;
            // The record's parts the receiver has not SACKed (a TSO record spans several
            // segments, of which only some may be lost), as many segments as they take.
            let mut pos = s.start;
            while pos < s.end {
                if let Some(e) = self.rec.sack.sacked_until(pos) {
                    pos = e;
                    continue;
                }
                let hole_end = self
                    .rec
                    .sack
                    .next_sacked_after(pos)
                    .map_or(s.end, |b| b.min(s.end));
                let used = self.emit_range(now, pos, hole_end - pos, c, emit);
                if used == 0 {
                    return n;
                }
                pos += used;
                self.rec.high_rxt = self.rec.high_rxt.max(pos);
                n += 1;
            }
            i = k + 1;
        }
        n
    }

    /// RFC 8985 §7.2: arm the probe timeout when new data went out or an ACK arrived, no
    /// recovery runs and no probe is outstanding. PTO = 2·SRTT, plus WCDelAckT with a single
    /// segment in flight, and "the PTO value MUST NOT be larger than the RTO" — so it is armed
    /// only when it would fire before the retransmission timer.
    pub(crate) fn arm_tlp(&mut self, now: Instant) {
        if !self.rack_on()
            || self.rec.in_recovery
            || self.rec.rack.tlp_end.is_some()
            || self.snd.all_acked()
            || self.snd.nxt < self.snd.max
        {
            self.timers.cancel(Timer::Tlp);
            return;
        }
        let Some(srtt) = self.snd.rtt.srtt() else {
            return;
        };
        let mut pto = srtt * 2;
        if self.snd.max - self.snd.una <= self.full_seg() {
            pto += WC_DEL_ACK;
        }
        // As Linux (tcp_schedule_loss_probe): at least 10 ms, so scheduling jitter on a
        // microsecond RTT does not fire needless probes.
        let mut at = now + pto.max(TLP_MIN);
        // §7.2: "if the time at which an RTO would fire ... is sooner than the computed time
        // for the PTO, then the sender schedules a TLP to be sent at that RTO time". The
        // probe takes the RTO's place; the RTO stays armed one RTO later as a backstop
        // (sending the probe re-arms it).
        if let Some(rto) = self.timers.deadline(Timer::Rto) {
            at = at.min(rto);
        }
        self.timers.set(Timer::Tlp, at);
        self.timers.set(Timer::Rto, at + self.snd.rtt.rto());
    }

    /// The probe timeout fired (RFC 8985 §7.3): send one probe in the next `poll_transmit`.
    pub(crate) fn on_tlp_timeout(&mut self, c: &mut Counters) {
        if !self.rack_on() || self.snd.all_acked() || self.rec.in_recovery {
            return;
        }
        c.inc(Counter::TcpExtTCPLossProbes);
        self.rec.rack.tlp_now = true;
    }

    /// RFC 8985 §7.3: "If a previously unsent segment exists AND the receive window allows,
    /// send that segment"; else "retransmit the highest-sequence segment sent so far". The
    /// probe ignores the congestion window. Then the RTO is re-armed.
    pub(crate) fn send_tlp(&mut self, now: Instant, c: &mut Counters, emit: &mut Emit) -> usize {
        self.rec.rack.tlp_now = false;
        if self.snd.all_acked() || self.rec.in_recovery {
            return 0;
        }
        let full = self.full_seg();
        let unsent = self.snd.data_end() - self.snd.max;
        let room = (self.snd.una + self.snd.wnd) - self.snd.max;
        let used = if unsent > 0 && room > 0 && self.snd.nxt == self.snd.max {
            let seq = self.snd.max;
            let used = self.emit_range(now, seq, unsent.min(room).min(full), c, emit);
            self.snd.nxt = seq + used;
            self.rec.rack.tlp_retrans = false;
            used
        } else {
            let last = self.rec.rack.segs.back().copied();
            // One segment: the last MSS of the highest record (a TSO record is larger).
            let (seq, len) = match last {
                Some(s) => {
                    let start = s.start.max(s.end - (s.end - s.start).min(full));
                    (start, s.end - start)
                }
                None => {
                    let len = (self.snd.max - self.snd.una).min(full);
                    (self.snd.max - len, len)
                }
            };
            self.rec.rack.tlp_retrans = true;
            self.emit_range(now, seq, len, c, emit)
        };
        if used == 0 {
            return 0;
        }
        self.rec.rack.tlp_end = Some(self.snd.max);
        self.timers.set(Timer::Rto, now + self.snd.rtt.rto());
        1
    }

    /// RFC 8985 §7.4: the probe's episode ends when an ACK covers TLP.end_seq. If the probe
    /// was a retransmission that repaired a loss (no D-SACK says the original arrived), the
    /// congestion window is reduced as for a loss; a new-data probe's loss, if any, is
    /// repaired by RACK's normal recovery, counted when it starts.
    fn tlp_on_ack(&mut self, ack: SeqNum, c: &mut Counters) {
        let Some(end) = self.rec.rack.tlp_end else {
            return;
        };
        if ack < end {
            return;
        }
        self.rec.rack.tlp_end = None;
        if self.rec.rack.tlp_retrans && !self.rec.in_recovery {
            c.inc(Counter::TcpExtTCPLossProbeRecovery);
            self.rec.cc.on_loss(self.snd.flight());
            self.rec.cc.exit_recovery();
        }
    }

    /// A retransmission timeout: the go-back-N resend re-stamps every record it sends; when
    /// the SACK information was discarded (suspected reneging) the records forget it too.
    pub(crate) fn rack_on_rto(&mut self, sack_cleared: bool) {
        self.timers.cancel(Timer::Tlp);
        self.timers.cancel(Timer::Reorder);
        if !self.rec.rack.is_allocated() {
            return; // no data sent yet: nothing recorded, no probe outstanding
        }
        self.rec.rack.undo.abandon();
        if sack_cleared {
            for s in self.rec.rack.segs.iter_mut() {
                s.sacked = false;
            }
        }
        for s in self.rec.rack.segs.iter_mut() {
            s.lost = false;
        }
        self.rec.rack.tlp_end = None;
        self.rec.rack.tlp_now = false;
    }
}
