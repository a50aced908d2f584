//! Loss recovery: its state ([`Recovery`]: congestion control, duplicate ACKs, the SACK
//! scoreboard), entering and leaving recovery (RFC 5681, RFC 6582 NewReno, RFC 6675
//! SACK-based), the "pipe" estimate and the retransmissions it allows.
//!
//! And declaring losses that duplicate-ACK counting misses: on a small flight (RFC 3042
//! Limited Transmit, RFC 5827 Early Retransmit) and of retransmissions themselves. Without
//! these a flight of fewer than four segments cannot produce the three duplicate ACKs fast
//! retransmit waits for, and a lost retransmission stays lost; each costs a retransmission
//! timeout (200 ms at least) instead of about one round trip.

use super::output::Emit;
use super::Connection;
use crate::cc::Congestion;
use crate::config::TcpConfig;
use crate::counters::{Counter, Counters};
use crate::sack::{Scoreboard, DUP_THRESH};
use flowstack_wire::{Instant, SeqNum};

/// Congestion control and loss-recovery state.
pub(crate) struct Recovery {
    /// Congestion control (RFC 5681 with RFC 6582, or RFC 9438 CUBIC).
    pub(crate) cc: Congestion,
    /// Duplicate ACKs in a row (RFC 5681 §2).
    pub(crate) dupacks: u32,
    /// A fast recovery is running.
    pub(crate) in_recovery: bool,
    /// RecoveryPoint ("recover", RFC 6582 and RFC 6675): SND.MAX when the latest recovery
    /// (or timeout) began; ISS until then.
    pub(crate) recover: SeqNum,
    /// HighRxt (RFC 6675): the highest sequence number retransmitted in this recovery.
    pub(crate) high_rxt: SeqNum,
    /// The segment at SND.UNA is to be retransmitted now (recovery entry, partial ACK).
    pub(crate) rexmit_head: bool,
    /// SND.MAX when the latest retransmission was sent (see `lost_retransmission`).
    pub(crate) rexmit_mark: Option<SeqNum>,
    /// What the peer holds above SND.UNA, from its SACK blocks.
    pub(crate) sack: super::lazy::Lazy<Scoreboard>,
    /// Armed by the first timeout of an episode (with timestamps): the congestion state
    /// before it and the TSval of the retransmission, for Eifel detection (RFC 3522).
    pub(crate) rto_undo: super::lazy::Rare<RtoUndo>,
    /// RACK-TLP state (RFC 8985).
    pub(crate) rack: super::rack::LazyRack,
}

/// What a spurious timeout restores (RFC 3522 detection, RFC 4015 response).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RtoUndo {
    /// (cwnd, ssthresh) before the timeout.
    pub(crate) cc: (usize, usize),
    /// Our timestamp clock when the retransmission left.
    pub(crate) ts: u32,
}

impl Recovery {
    pub(crate) fn new(cfg: &TcpConfig, iss: SeqNum) -> Self {
        Self {
            cc: Congestion::new(cfg.cc, cfg.mss as usize),
            dupacks: 0,
            in_recovery: false,
            recover: iss,
            high_rxt: iss,
            rexmit_head: false,
            rexmit_mark: None,
            sack: super::lazy::Lazy::new(cfg.max_ofo_ranges),
            rto_undo: None,
            rack: super::rack::LazyRack::new(),
        }
    }

    /// An RFC 5681 §2 duplicate ACK arrived.
    pub(crate) fn on_dupack(&mut self, mss: usize, sack: bool) {
        self.dupacks += 1;
        if self.in_recovery && !sack {
            // RFC 6582 §3.2 step 4: inflate by one segment per further duplicate.
            self.cc.inflate(mss);
        }
    }
}

impl Connection {
    /// Segments sent and not yet acknowledged, rounded up.
    fn outstanding_segments(&self) -> usize {
        (self.snd.max - self.snd.una).div_ceil(self.full_seg())
    }

    /// True if a new full segment could be sent now: unsent data and room in the peer's
    /// window (the congestion window aside).
    fn can_send_new(&self) -> bool {
        let unsent = self.snd.data_end() - self.snd.max;
        let room = (self.snd.una + self.snd.wnd) - self.snd.max;
        unsent > 0 && room >= unsent.min(self.full_seg())
    }

    /// The duplicate-ACK count (and, with SACK, the number of segments SACKed above a hole)
    /// that declares a loss.
    ///
    /// RFC 5827 §3.1/§3.2: "if the amount of outstanding data (ownd) is less than 4*SMSS
    /// bytes" and no new segment can be sent, the threshold is one less than the number of
    /// outstanding segments.
    pub(crate) fn dup_thresh(&self) -> usize {
        let oseg = self.outstanding_segments();
        if oseg < 4 && !self.can_send_new() {
            oseg.saturating_sub(1).max(1)
        } else {
            DUP_THRESH
        }
    }

    /// Bytes beyond the congestion window that RFC 3042 Limited Transmit lets new data use:
    /// "a TCP sender SHOULD send a new data segment in response to each of the first two
    /// duplicate acknowledgments", as long as "the amount of outstanding data would remain
    /// less than or equal to the congestion window plus 2*SMSS bytes". Those segments make
    /// the receiver send the duplicate ACKs that fast retransmit needs.
    pub(crate) fn limited_transmit(&self) -> usize {
        let d = self.rec.dupacks as usize;
        if self.rec.in_recovery || d == 0 || d >= DUP_THRESH || self.snd.nxt != self.snd.max {
            0
        } else {
            d * self.full_seg()
        }
    }

    /// Whether a new recovery may start, given where the previous one (or a timeout) left
    /// RecoveryPoint (`recover`). NewReno, RFC 6582 §3.2 step 2: only once the cumulative ACK
    /// "covers more than recover". With SACK, RFC 6675 §5.1: "a new recovery phase ... MUST
    /// NOT be initiated until HighACK is greater than or equal to the new value of
    /// RecoveryPoint" — so a loss of the very first segment sent after the previous recovery
    /// is repaired by fast retransmit, not by a timeout.
    pub(crate) fn may_enter_recovery(&self) -> bool {
        self.rec.recover == self.snd.iss
            || self.snd.una > self.rec.recover
            || (self.opt.sack && self.snd.una == self.rec.recover)
    }

    /// Called when an ACK brought new SACK information: if the receiver now holds data we
    /// first sent *after* our latest retransmission while a hole below that point remains,
    /// the retransmissions sent before it are lost (the later data overtook them; only
    /// reordering could excuse it, and then one segment is sent twice). Recovery then walks
    /// the holes again from SND.UNA; after a timeout, when no recovery is running, it starts
    /// one — the RFC 6582 guard against duplicate ACKs from go-back-N resends does not apply,
    /// as the evidence is SACK, not duplicate ACKs. This is the part of RFC 8985 (RACK) that
    /// needs no per-segment send times: transmission order stands in for time.
    pub(crate) fn lost_retransmission(&mut self, c: &mut Counters) {
        if self.rack_on() {
            return; // RACK detects lost retransmissions by their send times.
        }
        let (Some(mark), Some(high)) = (self.rec.rexmit_mark, self.rec.sack.high()) else {
            return;
        };
        if high <= mark
            || !self
                .rec
                .sack
                .next_hole(self.snd.una)
                .is_some_and(|(s, _)| s < mark)
        {
            return;
        }
        c.inc(Counter::TcpExtTCPLostRetransmit);
        self.rec.rexmit_mark = None;
        if self.rec.in_recovery {
            self.rec.high_rxt = self.snd.una;
            self.rec.rexmit_head = true;
        } else {
            self.enter_recovery(c);
        }
    }

    /// After an ACK was processed: enter recovery on DupThresh duplicate ACKs (RFC 5681
    /// §3.2) or, with SACK, once the scoreboard declares the segment at SND.UNA lost
    /// (RFC 6675 IsLost), unless the previous recovery forbids it.
    pub(crate) fn detect_loss(&mut self, now: Instant, c: &mut Counters) {
        if self.rack_on() {
            return; // RFC 8985 decides (`rack_detect_loss`).
        }
        if !self.rec.in_recovery
            && self.snd.max > self.snd.una
            && (self.rec.dupacks as usize >= self.dup_thresh()
                || (self.opt.sack
                    && self
                        .rec
                        .sack
                        .is_lost(self.snd.una, self.full_seg(), self.dup_thresh())))
            && self.may_enter_recovery()
        {
            if self.plp_dupack_lost(now, c) {
                return; // RFC 4821 §7.6.2: a lost probe is not congestion
            }
            self.enter_recovery(c);
        }
    }

    pub(crate) fn enter_recovery(&mut self, c: &mut Counters) {
        c.inc(Counter::TcpExtTCPFastRetrans);
        self.stats.fast_retransmits += 1;
        self.rec.in_recovery = true;
        self.rec.recover = self.snd.max;
        self.rec.high_rxt = self.snd.una;
        self.rec.rexmit_head = true;
        // RFC 3708: remember what to restore should every retransmission prove needless.
        self.undo_begin();
        self.rec.cc.on_loss(self.snd.flight());
        if !self.opt.sack {
            // RFC 6582 §3.2 step 2: cwnd = ssthresh + 3·SMSS.
            self.rec.cc.inflate(DUP_THRESH * self.snd.mss);
        }
        // Karn: the timed segment may be retransmitted.
        self.snd.rtt_probe = None;
    }

    /// SND.UNA moved forward to `ack`, acknowledging `acked` data bytes: leave recovery on a
    /// full acknowledgment, go on repairing after a partial one, or grow the window.
    pub(crate) fn recovery_on_ack(
        &mut self,
        now: Instant,
        ack: SeqNum,
        acked: usize,
        c: &mut Counters,
    ) {
        self.rec.sack.advance(ack);
        self.rec.dupacks = 0;
        if self.rec.in_recovery {
            if ack >= self.rec.recover {
                // RFC 6582 §3.2 step 3 full acknowledgment.
                self.rec.in_recovery = false;
                self.rec.cc.exit_recovery();
                if self.rack_on() {
                    self.rec.rack.recovery_exited();
                }
                // D-SACKs may already have reported every retransmission needless.
                self.try_dsack_undo(c);
            } else {
                // Partial acknowledgment: retransmit the next hole at once.
                if !self.opt.sack {
                    self.rec.cc.deflate(acked);
                    self.rec.cc.inflate(self.snd.mss);
                }
                self.rec.rexmit_head = true;
                self.rec.high_rxt = self.rec.high_rxt.max(ack);
            }
        } else {
            self.rec.cc.on_ack(now, acked, self.snd.rtt.srtt());
        }
    }

    /// Bytes considered in the network (RFC 6675 "pipe" when SACK recovery is running).
    pub(super) fn pipe(&self) -> usize {
        let flight = self.snd.flight();
        if self.rack_on() {
            // RFC 8985 with RFC 6675's pipe: what is neither SACKed nor marked lost.
            flight.saturating_sub(self.rec.sack.sacked_bytes() + self.rec.rack.lost_bytes())
        } else if self.rec.in_recovery && self.opt.sack {
            let lost = self
                .rec
                .sack
                .hole_bytes_from(self.rec.high_rxt.max(self.snd.una));
            flight.saturating_sub(self.rec.sack.sacked_bytes() + lost)
        } else {
            flight
        }
    }

    /// Loss recovery retransmissions: the head after entry or a partial ACK, then (with
    /// SACK) the holes the scoreboard marks lost (RFC 6675 §5 NextSeg rule 1).
    pub(super) fn send_recovery(
        &mut self,
        now: Instant,
        c: &mut Counters,
        emit: &mut Emit,
    ) -> usize {
        if self.rack_on() {
            // RACK marked what to resend; the head is among it if it is lost.
            self.rec.rexmit_head = false;
            return self.send_rack_lost(now, c, emit);
        }
        let mut n = 0;
        if self.rec.rexmit_head {
            self.rec.rexmit_head = false;
            let una = self.snd.una;
            // Segments as the original ones were cut (the MSS less the options), so holes
            // stay whole segments.
            let full = self.full_seg();
            let len = match self.rec.sack.next_hole(una) {
                Some((s, e)) if s == una => (e - s).min(full),
                _ => full,
            };
            let used = self.emit_range(now, una, len, c, emit);
            self.rec.high_rxt = self.rec.high_rxt.max(una + used);
            n += 1;
        }
        if !self.opt.sack {
            return n;
        }
        while self.pipe() < self.rec.cc.cwnd() {
            let from = self.rec.high_rxt.max(self.snd.una);
            let Some((s, e)) = self.rec.sack.next_hole(from) else {
                break;
            };
            if !self.rec.sack.is_lost(s, self.full_seg(), self.dup_thresh()) {
                break;
            }
            let len = (e - s).min(self.full_seg());
            let used = self.emit_range(now, s, len, c, emit);
            if used == 0 {
                break;
            }
            c.inc(Counter::TcpExtTCPSackRecovery);
            self.rec.high_rxt = s + used;
            n += 1;
        }
        n
    }
}
