//! D-SACK (RFC 2883) at the packet level: the receiver reports duplicates as the first SACK
//! block of its next ACK; the sender uses them to find needless retransmissions (RFC 3708),
//! undo the congestion response of a recovery that was only reordering, and widen RACK's
//! reordering window (RFC 8985 §6.2 step 4).

// Each test file uses part of the shared fixture.
#![allow(dead_code, unused_imports)]

include!("fixture/mod.rs");

/// The peer's sequence number `rel` bytes into its stream.
fn p(rel: usize) -> SeqNum {
    SeqNum(PEER_ISN + 1) + rel
}

/// A SACK connection that has received `[0, 100)` of the peer's stream (and ACKed it).
fn received_100() -> Fx {
    let mut f = sack_established();
    let out = f.send(0, Flags::ACK | Flags::PSH, &[7u8; 100]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ack, p(100));
    assert!(out[0].blocks.is_empty());
    f
}

/// RFC 2883 §4: a segment entirely below RCV.NXT (the sender resent it, our ACK was late)
/// is reported as the first SACK block of the next ACK — once.
#[test]
fn dsack_reports_a_duplicate_below_rcv_nxt_once() {
    let mut f = received_100();
    let out = f.send(0, Flags::ACK, &[7u8; 100]);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].ack, p(100));
    assert_eq!(out[0].blocks, vec![(p(0), p(100))]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKOldSent), 1);
    // The next ACK carries no D-SACK: each duplicate is reported in one block.
    let out = f.send(100, Flags::ACK | Flags::PSH, &[8u8; 100]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ack, p(200));
    assert!(out[0].blocks.is_empty(), "{out:?}");
}

/// RFC 2883 §4: a segment partly below RCV.NXT — the old part is the duplicate.
#[test]
fn dsack_reports_the_old_part_of_a_partly_new_segment() {
    let mut f = received_100();
    let out = f.send(50, Flags::ACK | Flags::PSH, &[7u8; 100]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ack, p(150));
    assert_eq!(out[0].blocks, vec![(p(50), p(100))]);
}

/// RFC 2883 §4: a duplicate of data held out of order: the D-SACK block first, then the
/// block that contains it, then the other blocks.
#[test]
fn dsack_reports_a_duplicate_of_out_of_order_data() {
    let mut f = received_100();
    // Out of order: [300, 400) and [150, 250) (a hole at 100 and at 250).
    let out = f.send(300, Flags::ACK, &[1u8; 100]);
    assert_eq!(out[0].blocks, vec![(p(300), p(400))]);
    let out = f.send(150, Flags::ACK, &[1u8; 100]);
    assert_eq!(out[0].blocks, vec![(p(150), p(250)), (p(300), p(400))]);
    // [180, 230) again.
    let out = f.send(180, Flags::ACK, &[1u8; 50]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ack, p(100));
    assert_eq!(
        out[0].blocks,
        vec![(p(180), p(230)), (p(150), p(250)), (p(300), p(400))]
    );
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKOfoSent), 1);
    // A segment filling the hole and overlapping held data: the overlap is the duplicate.
    let out = f.send(100, Flags::ACK, &[1u8; 100]);
    assert_eq!(out[0].ack, p(250));
    assert_eq!(out[0].blocks, vec![(p(150), p(200)), (p(300), p(400))]);
}

/// Without SACK negotiated there are no D-SACK blocks either.
#[test]
fn no_dsack_without_sack() {
    let mut f = Fx::established();
    f.send(0, Flags::ACK | Flags::PSH, &[7u8; 100]);
    let out = f.send(0, Flags::ACK, &[7u8; 100]);
    assert_eq!(out.len(), 1);
    assert!(out[0].blocks.is_empty());
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKOldSent), 0);
}

const BASE: u32 = OUR_ISN + 1;

/// RFC 3708 / RFC 8985 §6.2: a fast retransmit caused by reordering — the original arrives
/// after the retransmission was sent, and the receiver D-SACKs the retransmission. The
/// congestion response is undone (cwnd and ssthresh as before the episode) and RACK widens
/// its reordering window, so the same reordering no longer causes a retransmission. A
/// D-SACK for data that was never retransmitted changes nothing.
#[test]
fn spurious_fast_retransmit_is_undone_and_widens_the_reordering_window() {
    // SRTT near 40 ms, so the reordering window is not capped by it.
    let w = 20;
    let mut f = rack_warm_rounds(Duration::from_millis(40), w);
    // Offsets in our stream, in segments after the warm-up.
    let at = |k: usize| (w + k) * SEG;
    f.c.send(&[1u8; 4 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 4);
    let before = f.c.info();
    assert_eq!(before.ssthresh, usize::MAX);
    f.now += Duration::from_millis(40);
    // Segment 0 (of 4) is delayed; 1..3 are SACKed: RACK (reo_wnd 0 with three SACKed)
    // marks it lost and resends it.
    let out = ack_sack(&mut f, at(0), &[(at(1), at(4))]);
    assert_eq!(seqs(&out), vec![(SeqNum(BASE) + at(0), SEG)]);
    assert_eq!(f.c.stats().fast_retransmits, 1);
    let reduced = f.c.info();
    assert!(reduced.ssthresh < usize::MAX && reduced.cwnd < before.cwnd + SEG);
    // The delayed original arrives: everything is acknowledged, recovery ends.
    f.now += Duration::from_millis(1);
    assert!(ack_sack(&mut f, at(4), &[]).is_empty());
    assert_eq!(f.c.info().ssthresh, reduced.ssthresh, "not undone yet");
    // A D-SACK for a segment never retransmitted (a network duplicate) proves nothing.
    ack_sack(&mut f, at(4), &[(at(2), at(3))]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKIgnored), 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKUndo), 0);
    assert_eq!(f.c.info().ssthresh, reduced.ssthresh);
    // The retransmission arrives as a duplicate: the receiver D-SACKs it.
    f.now += Duration::from_millis(1);
    ack_sack(&mut f, at(4), &[(at(0), at(1))]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKRecv), 2);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPSpuriousRetrans), 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKUndo), 1);
    let undone = f.c.info();
    assert_eq!(undone.ssthresh, usize::MAX, "ssthresh restored");
    assert!(
        undone.cwnd >= before.cwnd,
        "cwnd restored: {} < {}",
        undone.cwnd,
        before.cwnd
    );
    // The same reordering again: the middle one of 3 segments is overtaken, and arrives 15
    // ms later than RACK.rtt. With the original window (min_RTT/4 = 10 ms) it would be
    // marked lost and resent; widened (2·min_RTT/4 = 20 ms) it is waited for.
    let rexmits = f.ctr.get(Counter::TcpRetransSegs);
    f.c.send(&[2u8; 3 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 3);
    f.now += Duration::from_millis(40);
    assert!(ack_sack(&mut f, at(5), &[(at(6), at(7))]).is_empty());
    let out = f.advance(Duration::from_millis(15));
    assert!(out.is_empty(), "resent within the widened window: {out:?}");
    f.now += Duration::from_millis(1);
    ack_sack(&mut f, at(7), &[]);
    assert_eq!(f.ctr.get(Counter::TcpRetransSegs), rexmits);
    assert_eq!(f.c.send_queue(), 0);
}

/// A D-SACK for something we never retransmitted (no recovery ever ran) is counted and
/// ignored: no undo, no change to the window.
#[test]
fn dsack_for_data_never_retransmitted_is_ignored() {
    let mut f = rack_warm(Duration::from_millis(40));
    f.c.send(&[1u8; 2 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 2);
    f.now += Duration::from_millis(40);
    ack_sack(&mut f, 3 * SEG, &[]);
    let before = f.c.info();
    let out = ack_sack(&mut f, 3 * SEG, &[(SEG, 2 * SEG)]);
    assert!(out.is_empty());
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKRecv), 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKIgnored), 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPSpuriousRetrans), 0);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKUndo), 0);
    assert_eq!(f.c.cwnd(), before.cwnd);
    assert_eq!(
        f.ctr.get(Counter::TcpExtTCPSACKDiscard),
        0,
        "a D-SACK, not bogus"
    );
}

/// Undo needs every retransmission of the episode reported needless: with one of two
/// resent segments really lost, the reduction stays.
#[test]
fn no_undo_while_a_retransmission_was_needed() {
    let mut f = rack_warm(Duration::from_millis(40));
    f.c.send(&[1u8; 5 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 5);
    f.now += Duration::from_millis(40);
    // Segments 1 and 2 missing, 3..5 SACKed: both resent.
    let out = ack_sack(&mut f, SEG, &[(3 * SEG, 6 * SEG)]);
    assert_eq!(out.len(), 2, "{out:?}");
    let reduced = f.c.info().ssthresh;
    // Segment 1's original arrives late (its resend is D-SACKed later); segment 2 was lost
    // and its resend repairs it.
    f.now += Duration::from_millis(40);
    ack_sack(&mut f, 6 * SEG, &[]);
    ack_sack(&mut f, 6 * SEG, &[(SEG, 2 * SEG)]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPSpuriousRetrans), 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKUndo), 0);
    assert_eq!(f.c.info().ssthresh, reduced);
}

/// RFC 8985 §7.4.2: a tail loss probe that retransmitted the last segment, D-SACKed because
/// the original had arrived (only its ACK was late), ends its episode without a window
/// reduction.
#[test]
fn needless_tail_loss_probe_reduces_nothing() {
    let mut f = rack_warm(Duration::from_millis(40));
    f.c.send(&[1u8; 4 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 4);
    f.now += Duration::from_millis(40);
    // The ACK for the last segment is late: the probe resends it.
    assert!(ack_sack(&mut f, 4 * SEG, &[]).is_empty());
    let mut probe = Vec::new();
    for _ in 0..100 {
        probe = f.advance(Duration::from_millis(5));
        if !probe.is_empty() {
            break;
        }
    }
    assert_eq!(seqs(&probe), vec![(SeqNum(BASE) + 4 * SEG, SEG)]);
    let cwnd = f.c.cwnd();
    // Everything acknowledged, with the probe reported as a duplicate.
    f.now += Duration::from_millis(40);
    ack_sack(&mut f, 5 * SEG, &[(4 * SEG, 5 * SEG)]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPSpuriousRetrans), 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPLossProbeRecovery), 0);
    assert!(f.c.cwnd() >= cwnd, "{} < {cwnd}", f.c.cwnd());
    assert_eq!(f.c.info().ssthresh, usize::MAX);
}

/// A late original overtaken by its retransmission carries the older timestamp and fails
/// PAWS (RFC 7323 §5.3): dropped, and still reported as a duplicate (as Linux).
#[test]
fn dsack_reports_a_duplicate_that_fails_paws() {
    let mut f = Fx::established_with(
        TcpConfig::default(),
        TcpOptions {
            mss: Some(1460),
            sack_permitted: true,
            timestamp: Some((100, 0)),
            ..Default::default()
        },
    );
    let mut s = seg(
        p(0),
        SeqNum(OUR_ISN + 1),
        Flags::ACK | Flags::PSH,
        &[7u8; 100],
    );
    s.options.timestamp = Some((110, 0));
    f.input(s);
    let out = f.poll();
    assert_eq!(out[0].ack, p(100));
    // The original, sent before the retransmission that just arrived.
    s.options.timestamp = Some((105, 0));
    f.input(s);
    let out = f.poll();
    assert_eq!(f.ctr.get(Counter::TcpExtPAWSEstab), 1);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].blocks, vec![(p(0), p(100))]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKOldSent), 1);
}

/// The undo works in duplicate-ACK mode (RFC 6675 recovery) too.
#[test]
fn spurious_fast_retransmit_is_undone_in_dupack_mode() {
    let mut f = sack_established();
    f.c.send(&[1u8; 4 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 4);
    let before = f.c.info();
    // Segment 0 late, 1..3 SACKed: RFC 6675 IsLost, fast retransmit.
    let out = ack_sack(&mut f, 0, &[(SEG, 4 * SEG)]);
    assert_eq!(seqs(&out), vec![(SeqNum(BASE), SEG)]);
    assert!(f.c.info().ssthresh < usize::MAX);
    ack_sack(&mut f, 4 * SEG, &[]);
    ack_sack(&mut f, 4 * SEG, &[(0, SEG)]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPDSACKUndo), 1);
    assert_eq!(f.c.info().ssthresh, usize::MAX);
    assert!(f.c.cwnd() >= before.cwnd);
}
