//! Declaring losses that duplicate-ACK counting misses: on a small flight (RFC 3042 Limited
//! Transmit, RFC 5827 Early Retransmit) and of retransmissions themselves. Without these a
//! flight of fewer than four segments cannot produce the three duplicate ACKs fast retransmit
//! waits for, and a lost retransmission stays lost; each costs a retransmission timeout
//! (200 ms at least) instead of about one round trip.

use super::Connection;
use crate::counters::{Counter, Counters};
use crate::sack::DUP_THRESH;

impl Connection {
    /// Segments sent and not yet acknowledged, rounded up.
    fn outstanding_segments(&self) -> usize {
        (self.snd_max - self.snd_una).div_ceil(self.full_seg())
    }

    /// True if a new full segment could be sent now: unsent data and room in the peer's
    /// window (the congestion window aside).
    fn can_send_new(&self) -> bool {
        let unsent = (self.snd_una_data() + self.send_buf.len()) - self.snd_max;
        let room = (self.snd_una + self.snd_wnd) - self.snd_max;
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
        let d = self.dupacks as usize;
        if self.in_recovery || d == 0 || d >= DUP_THRESH || self.snd_nxt != self.snd_max {
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
        self.recover == self.iss
            || self.snd_una > self.recover
            || (self.sack_enabled && self.snd_una == self.recover)
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
        let (Some(mark), Some(high)) = (self.rexmit_mark, self.sack.high()) else {
            return;
        };
        if high <= mark
            || !self
                .sack
                .next_hole(self.snd_una)
                .is_some_and(|(s, _)| s < mark)
        {
            return;
        }
        c.inc(Counter::TcpExtTCPLostRetransmit);
        self.rexmit_mark = None;
        if self.in_recovery {
            self.high_rxt = self.snd_una;
            self.rexmit_head = true;
        } else {
            self.enter_recovery(c);
        }
    }
}
