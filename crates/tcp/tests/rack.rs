//! RACK-TLP (RFC 8985) at the packet level: tail loss probes, the reordering window, the
//! reorder timer and lost retransmissions, on the fixture `rules.rs` uses.

// Each test file uses part of the shared fixture.
#![allow(dead_code, unused_imports)]

include!("fixture/mod.rs");

/// RFC 8985 §7: the last segments of a flight are lost and no ACK comes back; a tail loss
/// probe (the last segment again) fires before the RTO and the ACK it draws repairs the loss.
#[test]
fn rack_tail_loss_is_repaired_by_a_probe_without_a_timeout() {
    let mut f = rack_warm(Duration::from_millis(40));
    f.c.send(&[1u8; 4 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 4);
    // Segments 1..3 arrive (ACKed 40 ms later); segment 4, the tail, is lost.
    f.now += Duration::from_millis(40);
    assert!(ack_sack(&mut f, 4 * SEG, &[]).is_empty());
    let mut probe = Vec::new();
    for _ in 0..100 {
        probe = f.advance(Duration::from_millis(5));
        if !probe.is_empty() {
            break;
        }
    }
    assert_eq!(f.ctr.get(Counter::TcpExtTCPLossProbes), 1);
    assert_eq!(
        f.ctr.get(Counter::TcpExtTCPTimeouts),
        0,
        "the probe came first"
    );
    assert_eq!(
        probe.iter().map(|o| (o.seq, o.len)).collect::<Vec<_>>(),
        vec![(SeqNum(OUR_ISN + 1) + 4 * SEG, SEG)],
        "the probe resends the last segment"
    );
    f.now += Duration::from_millis(40);
    ack_sack(&mut f, 5 * SEG, &[]);
    assert_eq!(f.c.send_queue(), 0);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPLossProbeRecovery), 1);
    // Nothing left in flight: no timer fires a timeout later.
    f.advance(Duration::from_secs(5));
    assert_eq!(f.ctr.get(Counter::TcpExtTCPTimeouts), 0);
}

/// RFC 8985 §6.2: a segment overtaken by a later one is lost only once the reordering
/// window (min_RTT/4) has passed; if it arrives within it, nothing is resent.
#[test]
fn rack_reordering_within_the_window_is_not_a_loss() {
    let mut f = rack_warm(Duration::from_millis(40));
    f.c.send(&[1u8; 3 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 3);
    f.now += Duration::from_millis(40);
    // Segment 1 (of 3) delayed: the peer SACKs segment 2.
    let out = ack_sack(&mut f, SEG, &[(2 * SEG, 3 * SEG)]);
    assert!(out.is_empty(), "within the reordering window: {out:?}");
    f.now += Duration::from_millis(2);
    let out = ack_sack(&mut f, 4 * SEG, &[]);
    assert!(out.is_empty());
    f.advance(Duration::from_secs(2));
    assert_eq!(f.ctr.get(Counter::TcpExtTCPRackLoss), 0);
    assert_eq!(f.ctr.get(Counter::TcpRetransSegs), 0);
}

/// Past the reordering window the overtaken segment is marked lost by the reorder timer and
/// resent, with no duplicate ACK beyond the first.
#[test]
fn rack_reorder_timer_marks_an_overtaken_segment_lost() {
    let mut f = rack_warm(Duration::from_millis(40));
    f.c.send(&[1u8; 3 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 3);
    f.now += Duration::from_millis(40);
    assert!(ack_sack(&mut f, SEG, &[(2 * SEG, 3 * SEG)]).is_empty());
    let out = f.advance(Duration::from_millis(20));
    assert_eq!(f.ctr.get(Counter::TcpExtTCPRackLoss), 1);
    assert_eq!(
        out.iter().map(|o| (o.seq, o.len)).collect::<Vec<_>>(),
        vec![(SeqNum(OUR_ISN + 1) + SEG, SEG)]
    );
    assert_eq!(f.ctr.get(Counter::TcpExtTCPTimeouts), 0);
}

/// RFC 8985 §2.2: a lost retransmission is detected by RACK — data sent after the
/// retransmission is delivered while the retransmission is not. Duplicate-ACK counting has
/// no such evidence (the duplicate ACKs that started recovery were already used).
#[test]
fn rack_detects_a_lost_retransmission() {
    let mut f = rack_warm(Duration::from_millis(40));
    f.c.send(&[1u8; 4 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 4);
    f.now += Duration::from_millis(40);
    // Three segments above the first are SACKed: RFC 8985 §6.2 step 4 sets reo_wnd to 0.
    let out = ack_sack(&mut f, SEG, &[(2 * SEG, 5 * SEG)]);
    assert_eq!(
        out.iter().map(|o| (o.seq, o.len)).collect::<Vec<_>>(),
        vec![(SeqNum(OUR_ISN + 1) + SEG, SEG)],
        "RACK marks segment 1 lost and resends it"
    );
    // New data after the retransmission; it arrives, the retransmission does not.
    f.c.send(&[2u8; 2 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 2);
    f.now += Duration::from_millis(40);
    let out = ack_sack(&mut f, SEG, &[(2 * SEG, 7 * SEG)]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPRackLoss), 2);
    assert_eq!(
        out.iter().map(|o| (o.seq, o.len)).collect::<Vec<_>>(),
        vec![(SeqNum(OUR_ISN + 1) + SEG, SEG)],
        "the lost retransmission is sent again"
    );
    f.now += Duration::from_millis(40);
    ack_sack(&mut f, 7 * SEG, &[]);
    assert_eq!(f.c.send_queue(), 0);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPTimeouts), 0);
}

/// RACK is the default; DupAck mode stays selectable.
#[test]
fn rack_is_the_default_loss_detection() {
    assert_eq!(TcpConfig::default().loss_detection, LossDetection::Rack);
}
