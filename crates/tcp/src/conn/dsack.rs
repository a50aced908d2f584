//! Using the peer's D-SACK blocks (RFC 2883 §5): a D-SACK says a segment arrived twice. When
//! it covers one of our retransmissions, the original had arrived and the retransmission was
//! needless (RFC 3708 §3); when every retransmission of a recovery episode is reported so,
//! the loss that started the episode was reordering, and the congestion response is undone
//! (cwnd and ssthresh restored, as Linux's DSACK undo). RACK widens its reordering window on
//! such evidence (RFC 8985 §6.2 step 4).
//!
//! The episode's record lives in the lazily allocated RACK state (allocated by the first data
//! segment sent, or by the first recovery in duplicate-ACK mode): an idle connection holds
//! none of it.

use super::Connection;
use crate::counters::{Counter, Counters};
use flowstack_wire::tcp::TcpRepr;
use flowstack_wire::SeqNum;

/// Most distinct retransmitted ranges one episode records; beyond that an undo can no longer
/// be vouched for and the episode is not undone (the ranges of a recovery are few: holes are
/// resent in order and touching ranges merge).
const MAX_REXMIT_RANGES: usize = 16;

/// One recovery episode's retransmissions, for undo (RFC 3708 §3).
#[derive(Debug)]
pub(crate) struct Undo {
    /// An episode is being recorded: from entering fast recovery until the next one.
    open: bool,
    /// (cwnd, ssthresh) before the episode's reduction, while it may still be undone.
    prior: Option<(usize, usize)>,
    /// The sequence ranges retransmitted in the episode (their union, sorted, merged).
    rexmits: Vec<(SeqNum, SeqNum)>,
    /// Bytes retransmitted in the episode not yet reported needless.
    pending: usize,
}

impl Undo {
    pub(crate) const fn new() -> Self {
        Self {
            open: false,
            prior: None,
            rexmits: Vec::new(),
            pending: 0,
        }
    }

    /// A recovery episode starts; `prior` is the congestion state before its reduction.
    fn begin(&mut self, prior: (usize, usize)) {
        self.open = true;
        self.prior = Some(prior);
        self.rexmits.clear();
        self.pending = 0;
    }

    /// `[seq, end)` was retransmitted in the episode.
    fn record(&mut self, seq: SeqNum, end: SeqNum) {
        self.pending += end - seq;
        let i = self.rexmits.partition_point(|r| r.1 < seq);
        let mut j = i;
        let (mut s, mut e) = (seq, end);
        while j < self.rexmits.len() && self.rexmits[j].0 <= e {
            s = s.min(self.rexmits[j].0);
            e = e.max(self.rexmits[j].1);
            j += 1;
        }
        if i == j && self.rexmits.len() >= MAX_REXMIT_RANGES {
            // Cannot remember it: a D-SACK could no longer prove every resend needless.
            self.prior = None;
            return;
        }
        self.rexmits.splice(i..j, [(s, e)]);
    }

    /// Bytes of `[l, r)` that the episode retransmitted.
    fn matched(&self, l: SeqNum, r: SeqNum) -> usize {
        self.rexmits
            .iter()
            .map(|&(s, e)| {
                let (a, b) = (s.max(l), e.min(r));
                if a < b {
                    b - a
                } else {
                    0
                }
            })
            .sum()
    }

    /// A retransmission timeout in the episode: its resends are evidence D-SACK cannot clear
    /// (RFC 3522 Eifel judges a spurious timeout), so the episode is no longer undone.
    pub(crate) fn abandon(&mut self) {
        self.prior = None;
    }

    /// Heap bytes held (the range list).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.rexmits.capacity() * std::mem::size_of::<(SeqNum, SeqNum)>()
    }
}

impl Connection {
    /// Fast recovery starts: record its retransmissions from now on, remembering the
    /// congestion state to restore if they all prove needless.
    pub(crate) fn undo_begin(&mut self) {
        let prior = self.rec.cc.save();
        self.rec.rack.undo.begin(prior);
    }

    /// `[seq, end)` was retransmitted: part of the open episode, if any.
    pub(crate) fn undo_record(&mut self, seq: SeqNum, end: SeqNum) {
        if self.rec.rack.undo.open && end > seq {
            self.rec.rack.undo.record(seq, end);
        }
    }

    /// The first SACK block of an arriving ACK, if it is a D-SACK. RFC 2883 §5: it is one
    /// when it lies below the cumulative acknowledgment, or inside the second SACK block.
    fn dsack_block(seg: &TcpRepr) -> Option<(SeqNum, SeqNum)> {
        let blocks = seg.options.sack_blocks();
        let d = blocks.first()?;
        if d.left >= d.right {
            return None;
        }
        let below = d.right <= seg.ack;
        let inside = blocks
            .get(1)
            .is_some_and(|b| b.left <= d.left && d.right <= b.right);
        (below || inside).then_some((d.left, d.right))
    }

    /// An ACK arrived (with SACK negotiated): act on a D-SACK block it carries. A D-SACK that
    /// covers our retransmissions reports them needless (RFC 3708 §3: both the original and
    /// the retransmission reached the receiver); one that matches none of the episode's
    /// retransmissions — a duplicate made by the network, forged, or late for an earlier
    /// episode — is counted and ignored. Called before the ACK's other processing, so a tail
    /// loss probe found needless ends its episode without a window reduction (RFC 8985
    /// §7.4.2).
    pub(super) fn on_dsack(&mut self, seg: &TcpRepr, c: &mut Counters) {
        let Some((l, r)) = Self::dsack_block(seg) else {
            return;
        };
        c.inc(Counter::TcpExtTCPDSACKRecv);
        let mut spurious = false;
        // Reads first: a D-SACK that matches nothing allocates nothing.
        let n = self.rec.rack.undo.matched(l, r);
        if n > 0 {
            let u = &mut self.rec.rack.undo;
            u.pending = u.pending.saturating_sub(n);
            spurious = true;
        }
        if self.rec.rack.tlp_retrans && self.rec.rack.tlp_end.is_some_and(|e| e == r) {
            // The probe retransmitted the last segment, and the original had arrived.
            self.rec.rack.tlp_end = None;
            spurious = true;
        }
        if !spurious {
            c.inc(Counter::TcpExtTCPDSACKIgnored);
            return;
        }
        c.inc(Counter::TcpExtTCPSpuriousRetrans);
        if self.rack_on() {
            let (una, max) = (self.snd.una, self.snd.max);
            self.rec.rack.dsack_seen(una, max);
        }
        self.try_dsack_undo(c);
    }

    /// RFC 3708 §3 detection complete — every retransmission of the episode reported
    /// needless — and the episode over (recovery left, so nothing marked lost waits): undo
    /// its congestion response, restoring cwnd and ssthresh as before it (RFC 3708 leaves
    /// the response open; this is Linux's, and RFC 4015's for timeouts). Called on each
    /// matching D-SACK and when recovery ends.
    pub(crate) fn try_dsack_undo(&mut self, c: &mut Counters) {
        let u = &self.rec.rack.undo;
        // Something was resent, and D-SACKs covered every byte of it.
        if self.rec.in_recovery || !u.open || u.rexmits.is_empty() || u.pending != 0 {
            return;
        }
        let Some(prior) = self.rec.rack.undo.prior.take() else {
            return;
        };
        c.inc(Counter::TcpExtTCPDSACKUndo);
        self.rec.cc.restore(prior);
    }
}
