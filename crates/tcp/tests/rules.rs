//! Packet-level tests: a connection placed in a state, segments sent relative to its sequence
//! space, and what comes out checked. Each test is named after the rule it checks.

include!("fixture/mod.rs");

#[test]
fn rst_at_exact_rcv_nxt_resets() {
    let mut f = Fx::established();
    let out = f.send(0, Flags::RST, &[]);
    assert!(out.is_empty());
    assert_eq!(f.c.state(), State::Closed);
    assert_eq!(f.c.error(), Some(TcpError::Reset));
}

#[test]
fn rst_in_window_not_exact_gets_challenge_ack() {
    let mut f = Fx::established();
    let out = f.send(100, Flags::RST, &[]);
    assert_eq!(f.c.state(), State::Established);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].flags, Flags::ACK);
    assert_eq!(out[0].ack, f.peer);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPChallengeACK), 1);
}

#[test]
fn rst_outside_window_is_ignored() {
    let mut f = Fx::established();
    let out = f.send(-10_000, Flags::RST, &[]);
    assert!(out.is_empty());
    assert_eq!(f.c.state(), State::Established);
}

#[test]
fn syn_on_synchronized_connection_gets_challenge_ack() {
    let mut f = Fx::established();
    let out = f.send(0, Flags::SYN, &[]);
    assert_eq!(f.c.state(), State::Established);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].flags, Flags::ACK);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPChallengeACK), 1);
}

#[test]
fn challenge_acks_are_rate_limited_per_connection() {
    let mut f = Fx::established();
    for _ in 0..50 {
        f.send(7, Flags::RST, &[]);
    }
    let limit = TcpConfig::default().challenge_ack_limit as u64;
    assert_eq!(f.ctr.get(Counter::TcpExtTCPChallengeACK), limit);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPChallengeACKLimited), 50 - limit);
    f.advance(Duration::from_secs(1));
    f.send(7, Flags::RST, &[]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPChallengeACK), limit + 1);
}

#[test]
fn ack_of_unsent_data_is_dropped_and_answered() {
    let mut f = Fx::established();
    f.input(seg(f.peer, SeqNum(OUR_ISN + 1000), Flags::ACK, b"injected"));
    let out = f.poll();
    assert_eq!(
        f.c.recv_queue(),
        0,
        "data with an invalid ACK is not accepted"
    );
    assert_eq!(out.len(), 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPACKSkippedInvalid), 1);
}

#[test]
fn out_of_order_segment_gets_immediate_ack_with_sack() {
    let opts = TcpOptions {
        mss: Some(1460),
        sack_permitted: true,
        ..Default::default()
    };
    let mut f = Fx::established_with(TcpConfig::default(), opts);
    let out = f.send(1000, Flags::ACK, &[1u8; 100]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ack, f.peer, "duplicate ACK for the gap");
    assert_eq!(out[0].sack, 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPOFOQueue), 1);
    // Filling the gap delivers both pieces in order.
    let out = f.send(0, Flags::ACK, &[2u8; 1000]);
    assert_eq!(out[0].ack, f.peer + 1100);
    let mut buf = vec![0u8; 2000];
    assert_eq!(f.c.recv(&mut buf).unwrap(), 1100);
    assert_eq!(&buf[..1000], &[2u8; 1000][..]);
    assert_eq!(&buf[1000..1100], &[1u8; 100][..]);
}

#[test]
fn mss_absent_means_536_and_tiny_mss_is_floored_to_48() {
    let f = Fx::established_with(TcpConfig::default(), TcpOptions::default());
    assert_eq!(f.c.mss(), 536);
    let f = Fx::established_with(
        TcpConfig::default(),
        TcpOptions {
            mss: Some(0),
            ..Default::default()
        },
    );
    assert_eq!(f.c.mss(), 536);
    let f = Fx::established_with(
        TcpConfig::default(),
        TcpOptions {
            mss: Some(1),
            ..Default::default()
        },
    );
    assert_eq!(f.c.mss(), 48);
}

#[test]
fn window_scale_above_14_is_clamped() {
    let f = Fx::established_with(
        TcpConfig::default(),
        TcpOptions {
            mss: Some(1460),
            window_scale: Some(20),
            ..Default::default()
        },
    );
    assert_eq!(f.c.options().2, 14);
}

#[test]
fn in_order_data_takes_the_header_prediction_fast_path() {
    let mut f = Fx::established();
    f.send(0, Flags::ACK | Flags::PSH, &[9u8; 500]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPHPHits), 1);
    assert_eq!(f.c.recv_queue(), 500);
}

#[test]
fn delayed_ack_waits_for_timer_or_second_full_segment() {
    let cfg = TcpConfig {
        quickack_segments: 0,
        ..Default::default()
    };
    let mut f = Fx::established_cfg(cfg);
    let out = f.send(0, Flags::ACK, &[0u8; 1460]);
    assert!(out.is_empty(), "first full segment: ACK delayed");
    let out = f.send(1460, Flags::ACK, &[0u8; 1460]);
    assert_eq!(out.len(), 1, "second full segment: ACK at once");
    assert_eq!(out[0].ack, f.peer + 2920);
    let out = f.send(2920, Flags::ACK, &[0u8; 100]);
    assert!(out.is_empty());
    let out = f.advance(cfg.delayed_ack_timeout);
    assert_eq!(out.len(), 1, "timer sends the delayed ACK");
    assert_eq!(f.ctr.get(Counter::TcpExtDelayedACKs), 1);
}

#[test]
fn retransmission_limit_ends_in_timed_out() {
    let cfg = TcpConfig {
        max_retries: 3,
        ..Default::default()
    };
    let mut f = Fx::established_cfg(cfg);
    f.c.send(b"hello").unwrap();
    assert_eq!(f.poll().len(), 1);
    let mut rexmits = 0;
    for _ in 0..10 {
        rexmits += f.advance(Duration::from_secs(130)).len();
        if f.c.state() == State::Closed {
            break;
        }
    }
    assert_eq!(rexmits, 3);
    assert_eq!(f.c.error(), Some(TcpError::TimedOut));
}

#[test]
fn zero_window_is_probed_and_reopened() {
    let mut f = Fx::established();
    let mut zero = seg(f.peer, SeqNum(OUR_ISN + 1), Flags::ACK, &[]);
    zero.window = 0;
    f.input(zero);
    f.c.send(&[5u8; 3000]).unwrap();
    assert!(f.poll().is_empty(), "nothing sent into a zero window");
    let probe = f.advance(Duration::from_secs(2));
    assert_eq!(probe.len(), 1, "persist timer probes");
    assert_eq!(probe[0].seq, SeqNum(OUR_ISN));
    assert_eq!(f.ctr.get(Counter::TcpExtTCPWinProbe), 1);
    // The window reopens: data flows.
    f.input(seg(f.peer, SeqNum(OUR_ISN + 1), Flags::ACK, &[]));
    let out = f.poll();
    // Everything goes: two full segments and the tail (no other small segment is in flight).
    assert_eq!(
        out.iter().map(|o| o.len).collect::<Vec<_>>(),
        vec![1460, 1460, 80]
    );
}

#[test]
fn half_close_keeps_receiving() {
    let mut f = Fx::established();
    f.c.shutdown_write();
    let out = f.poll();
    assert_eq!(out[0].flags, Flags::FIN | Flags::ACK);
    assert_eq!(f.c.state(), State::FinWait1);
    f.input(seg(f.peer, SeqNum(OUR_ISN + 2), Flags::ACK, &[]));
    assert_eq!(f.c.state(), State::FinWait2);
    f.input(seg(
        f.peer,
        SeqNum(OUR_ISN + 2),
        Flags::ACK,
        b"still talking",
    ));
    assert_eq!(f.c.recv_queue(), 13);
}

/// Takes `f` to TIME-WAIT: we close first, the peer acknowledges and sends its FIN (with
/// timestamp `ts` when given).
fn to_time_wait(f: &mut Fx, ts: Option<u32>) {
    f.c.shutdown_write();
    f.poll();
    let mut fin = seg(f.peer, SeqNum(OUR_ISN + 2), Flags::ACK | Flags::FIN, &[]);
    fin.options.timestamp = ts.map(|v| (v, 0));
    f.input(fin);
    assert_eq!(f.c.state(), State::TimeWait);
    f.poll();
}

#[test]
fn time_wait_reopens_for_a_syn_above_rcv_nxt_with_an_iss_beyond_anything_sent() {
    let mut f = Fx::established();
    to_time_wait(&mut f, None);
    let rcv_nxt = PEER_ISN + 2; // SYN and FIN
    let syn = |s: u32, flags: Flags| seg(SeqNum(s), SeqNum(0), flags, &[]);
    // RFC 1122 §4.2.2.13: a new SYN above the old RCV.NXT may reopen the connection, and the
    // new ISS must be above every sequence number the old incarnation used (SND.MAX).
    let iss = f.c.time_wait_reopen(&syn(rcv_nxt + 1000, Flags::SYN));
    assert_eq!(iss, Some(SeqNum(OUR_ISN + 2) + (65535 + 2)));
    assert!(iss.unwrap() > SeqNum(OUR_ISN + 2));
    // An old duplicate SYN (at or below RCV.NXT) does not.
    assert_eq!(f.c.time_wait_reopen(&syn(rcv_nxt, Flags::SYN)), None);
    assert_eq!(f.c.time_wait_reopen(&syn(PEER_ISN, Flags::SYN)), None);
    // Only a plain SYN: not SYN+ACK, SYN+RST or SYN+FIN.
    for extra in [Flags::ACK, Flags::RST, Flags::FIN] {
        assert_eq!(
            f.c.time_wait_reopen(&syn(rcv_nxt + 9, Flags::SYN | extra)),
            None
        );
    }
    // Not outside TIME-WAIT.
    let open = Fx::established();
    assert_eq!(
        open.c.time_wait_reopen(&syn(rcv_nxt + 1000, Flags::SYN)),
        None
    );
}

#[test]
fn time_wait_reopens_for_a_newer_timestamp_and_paws_rejects_an_older_one() {
    let opts = TcpOptions {
        mss: Some(1460),
        timestamp: Some((100, 0)),
        ..Default::default()
    };
    let mut f = Fx::established_with(TcpConfig::default(), opts);
    to_time_wait(&mut f, Some(200));
    let rcv_nxt = PEER_ISN + 2;
    let syn = |s: u32, ts: u32| {
        let mut r = seg(SeqNum(s), SeqNum(0), Flags::SYN, &[]);
        r.options.timestamp = Some((ts, 0));
        r
    };
    // RFC 6191: a newer timestamp is enough, even with a sequence number below RCV.NXT.
    assert!(f
        .c
        .time_wait_reopen(&syn(PEER_ISN.wrapping_sub(5000), 201))
        .is_some());
    // The same timestamp is not newer; an older one is rejected by PAWS even above RCV.NXT.
    assert_eq!(
        f.c.time_wait_reopen(&syn(PEER_ISN.wrapping_sub(5000), 200)),
        None
    );
    assert_eq!(f.c.time_wait_reopen(&syn(rcv_nxt + 1000, 150)), None);
}

#[test]
fn paws_drops_segment_with_old_timestamp() {
    let opts = TcpOptions {
        mss: Some(1460),
        timestamp: Some((100, 0)),
        ..Default::default()
    };
    let mut f = Fx::established_with(TcpConfig::default(), opts);
    let mut s = seg(f.peer, SeqNum(OUR_ISN + 1), Flags::ACK, b"new");
    s.options.timestamp = Some((200, 0));
    f.input(s);
    assert_eq!(f.c.recv_queue(), 3);
    f.poll();
    let mut old = seg(f.peer + 3, SeqNum(OUR_ISN + 1), Flags::ACK, b"old");
    old.options.timestamp = Some((150, 0));
    f.input(old);
    assert_eq!(f.c.recv_queue(), 3, "old duplicate not accepted");
    assert_eq!(f.ctr.get(Counter::TcpExtPAWSEstab), 1);
    assert_eq!(f.poll().len(), 1, "answered with an ACK");
}

#[test]
fn fin_wait_1_against_a_closed_window_is_bounded() {
    let cfg = TcpConfig {
        max_retries: 3,
        ..Default::default()
    };
    let mut f = Fx::established_cfg(cfg);
    let mut zero = seg(f.peer, SeqNum(OUR_ISN + 1), Flags::ACK, &[]);
    zero.window = 0;
    f.input(zero);
    f.c.send(&[1u8; 100]).unwrap();
    f.c.shutdown_write();
    f.poll();
    for _ in 0..20 {
        f.advance(Duration::from_secs(200));
        if f.c.state() == State::Closed {
            break;
        }
    }
    assert_eq!(f.c.state(), State::Closed);
    assert_eq!(f.c.error(), Some(TcpError::TimedOut));
}

#[test]
fn time_wait_lasts_two_msl_then_closes() {
    let cfg = TcpConfig {
        time_wait: Duration::from_secs(10),
        ..Default::default()
    };
    let mut f = Fx::established_cfg(cfg);
    f.c.shutdown_write();
    f.poll();
    // Peer ACKs our FIN and sends its own.
    f.input(seg(
        f.peer,
        SeqNum(OUR_ISN + 2),
        Flags::ACK | Flags::FIN,
        &[],
    ));
    assert_eq!(f.c.state(), State::TimeWait);
    assert_eq!(f.poll().len(), 1, "FIN acknowledged");
    // A retransmitted FIN in TIME-WAIT is acknowledged again.
    f.input(seg(
        f.peer,
        SeqNum(OUR_ISN + 2),
        Flags::ACK | Flags::FIN,
        &[],
    ));
    assert_eq!(f.poll().len(), 1);
    f.advance(Duration::from_secs(9));
    assert_eq!(f.c.state(), State::TimeWait);
    f.advance(Duration::from_secs(1));
    assert_eq!(f.c.state(), State::Closed);
}

#[test]
fn tiny_out_of_order_flood_is_bounded_and_harmless() {
    let opts = TcpOptions {
        mss: Some(1460),
        sack_permitted: true,
        ..Default::default()
    };
    let mut f = Fx::established_with(TcpConfig::default(), opts);
    // 5000 one-byte segments, none adjacent: each would need its own range.
    for i in 0..5000i64 {
        let b = [(i % 251) as u8];
        f.input(seg(
            SeqNum((f.peer.0 as i64 + 2 + 2 * i) as u32),
            SeqNum(OUR_ISN + 1),
            Flags::ACK,
            &b,
        ));
    }
    f.poll();
    let max = TcpConfig::default().max_ofo_ranges as u64;
    assert_eq!(f.ctr.get(Counter::TcpExtTCPOFOQueue), max);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPOFODrop), 5000 - max);
    // The connection still works: in-order data fills the first gap and is delivered.
    f.send(0, Flags::ACK, &[7u8; 2]);
    let mut buf = [0u8; 8];
    let n = f.c.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &[7, 7, 0][..n.min(3)]);
    assert!(n >= 3, "the queued byte at offset 2 joined the stream");
}

#[test]
fn minshall_nagle_sends_the_tail_of_a_message_at_once() {
    let mut f = Fx::established();
    f.c.send(&[1u8; 2000]).unwrap();
    let out = f.poll();
    assert_eq!(
        out.iter().map(|o| o.len).collect::<Vec<_>>(),
        vec![1460, 540]
    );
    // A second small write waits while the first small segment is unacknowledged.
    f.c.send(&[2u8; 10]).unwrap();
    assert!(f.poll().is_empty());
    f.input(seg(f.peer, SeqNum(OUR_ISN + 1 + 2000), Flags::ACK, &[]));
    assert_eq!(f.poll().iter().map(|o| o.len).sum::<usize>(), 10);
}

#[test]
fn zero_receive_window_still_takes_the_ack_of_a_segment_at_rcv_nxt() {
    let cfg = TcpConfig {
        recv_buffer: 4096,
        ..Default::default()
    };
    let mut f = Fx::established_cfg(cfg);
    f.c.send(&[7u8; 1000]).unwrap();
    assert_eq!(f.poll().iter().map(|o| o.len).sum::<usize>(), 1000);
    // The peer fills our receive buffer; nobody reads it.
    f.send(0, Flags::ACK, &[1u8; 1460]);
    f.send(1460, Flags::ACK, &[1u8; 1460]);
    f.send(2920, Flags::ACK, &[1u8; 1176]);
    assert_eq!(f.c.recv_queue(), 4096);
    // RFC 9293 §3.10.7.4: with RCV.WND zero the text is not acceptable, but the ACK is.
    let s = seg(
        f.peer + 4096,
        SeqNum(OUR_ISN + 1 + 1000),
        Flags::ACK,
        &[2u8; 100],
    );
    f.input(s);
    assert_eq!(f.c.send_queue(), 0, "the ACK field was processed");
    assert_eq!(f.c.recv_queue(), 4096, "the text was not taken");
    assert_eq!(f.ctr.get(Counter::TcpExtTCPRcvQDrop), 1);
    let out = f.poll();
    assert_eq!(out.len(), 1, "the dropped text is answered at once");
    assert_eq!(out[0].ack, f.peer + 4096);
    // Text beyond RCV.NXT in a zero window stays unacceptable, ACK field and all.
    f.c.send(&[7u8; 10]).unwrap();
    f.poll();
    let s = seg(
        f.peer + 4097,
        SeqNum(OUR_ISN + 1 + 1010),
        Flags::ACK,
        &[2u8; 100],
    );
    f.input(s);
    assert_eq!(f.c.send_queue(), 10);
}

#[test]
fn ack_after_a_timeout_carries_the_highest_sequence_sent() {
    let mut f = Fx::established();
    f.c.send(&[3u8; 3 * 1460]).unwrap();
    assert_eq!(f.poll().len(), 3);
    // The timeout resends the first segment only (go back N, window collapsed to one).
    let out = f.advance(Duration::from_secs(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].seq, SeqNum(OUR_ISN + 1));
    // Text from the peer now is answered by a bare ACK. Its sequence number is the highest
    // sent, not the rewound send pointer: the peer may already hold everything up to it, and
    // an ACK below its RCV.NXT would be dropped there unread.
    let out = f.send(0, Flags::ACK | Flags::PSH, &[1u8; 100]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].len, 0);
    assert_eq!(out[0].seq, SeqNum(OUR_ISN + 1 + 3 * 1460));
    assert_eq!(out[0].ack, f.peer + 100);
}

#[test]
fn early_retransmit_repairs_a_small_flight_with_two_duplicate_acks() {
    let mut f = sack_established();
    f.c.send(&[1u8; 3 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 3);
    // Nothing more to send: RFC 5827 lowers the threshold to outstanding segments − 1 = 2.
    assert!(ack_sack(&mut f, 0, &[(SEG, 2 * SEG)]).is_empty());
    let out = ack_sack(&mut f, 0, &[(SEG, 3 * SEG)]);
    assert_eq!(out.len(), 1, "second duplicate ACK: fast retransmit");
    assert_eq!((out[0].seq, out[0].len), (SeqNum(OUR_ISN + 1), SEG));
    assert_eq!(f.ctr.get(Counter::TcpExtTCPFastRetrans), 1);
}

#[test]
fn limited_transmit_sends_new_data_on_the_first_two_duplicate_acks() {
    let mut f = Fx::established();
    f.c.send(&[1u8; 20 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 10, "the initial window");
    let dup = |f: &mut Fx| {
        f.input(seg(f.peer, SeqNum(OUR_ISN + 1), Flags::ACK, &[]));
        f.poll()
    };
    for k in 0..2 {
        let out = dup(&mut f);
        assert_eq!(out.len(), 1, "duplicate ACK {}: one new segment", k + 1);
        assert_eq!(out[0].seq, SeqNum(OUR_ISN + 1) + (10 + k) * SEG);
    }
    let out = dup(&mut f);
    assert_eq!(out[0].seq, SeqNum(OUR_ISN + 1), "third: fast retransmit");
}

#[test]
fn a_small_hole_is_resent_after_a_timeout_despite_sender_sws_avoidance() {
    let mut f = sack_established();
    f.c.send(&[1u8; 3 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 3);
    // The peer holds all but the first 12 bytes; recovery resends them, and that is lost too.
    let out = ack_sack(&mut f, 0, &[(12, 3 * SEG)]);
    assert_eq!(out.iter().map(|o| o.len).collect::<Vec<_>>(), vec![12]);
    let out = f.advance(Duration::from_secs(2));
    assert_eq!(f.ctr.get(Counter::TcpExtTCPTimeouts), 1);
    assert_eq!(
        out.iter().map(|o| (o.seq, o.len)).collect::<Vec<_>>(),
        vec![(SeqNum(OUR_ISN + 1), 12)],
        "the timeout resends the 12-byte hole"
    );
}

#[test]
fn with_sack_a_loss_right_at_the_recovery_point_is_fast_retransmitted() {
    let mut f = sack_established();
    f.c.send(&[1u8; 8 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 8);
    // First loss: segment 0; recovery point = 8 segments.
    let out = ack_sack(&mut f, 0, &[(SEG, 8 * SEG)]);
    assert_eq!(out[0].seq, SeqNum(OUR_ISN + 1));
    assert!(ack_sack(&mut f, 8 * SEG, &[]).is_empty());
    // Second loss: the first segment sent after the recovery point (RFC 6675 §5.1: HighACK
    // >= RecoveryPoint allows a new recovery).
    f.c.send(&[2u8; 4 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 4);
    let out = ack_sack(&mut f, 8 * SEG, &[(9 * SEG, 12 * SEG)]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].seq, SeqNum(OUR_ISN + 1) + 8 * SEG);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPFastRetrans), 2);
}

#[test]
fn a_lost_retransmission_is_sent_again_once_later_data_is_sacked() {
    let mut f = sack_established();
    f.c.send(&[1u8; 4 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 4);
    let out = ack_sack(&mut f, 0, &[(SEG, 4 * SEG)]);
    assert_eq!(
        out[0].seq,
        SeqNum(OUR_ISN + 1),
        "fast retransmit of segment 0"
    );
    // New data goes out after that retransmission...
    f.c.send(&[2u8; 2 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 2);
    // ...and arrives while segment 0 still does not: the retransmission was lost.
    let out = ack_sack(&mut f, 0, &[(SEG, 6 * SEG)]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPLostRetransmit), 1);
    assert_eq!(
        out.iter().map(|o| (o.seq, o.len)).collect::<Vec<_>>(),
        vec![(SeqNum(OUR_ISN + 1), SEG)]
    );
    assert_eq!(f.ctr.get(Counter::TcpExtTCPTimeouts), 0);
}

// ---- hardening (issue 19) -------------------------------------------------------------------

/// SACK blocks for data never sent, inverted blocks and old blocks past the first (not a
/// D-SACK) are ignored and counted (Linux TCPSACKDiscard); the scoreboard learns nothing.
#[test]
fn sack_blocks_outside_the_window_are_discarded_and_counted() {
    let mut f = sack_established();
    f.c.send(&[1u8; 3 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 3);
    // Beyond SND.NXT, inverted, and (second block) below SND.UNA.
    let out = ack_sack(&mut f, 0, &[(4 * SEG, 5 * SEG), (2 * SEG, SEG)]);
    assert!(out.is_empty());
    assert_eq!(f.ctr.get(Counter::TcpExtTCPSACKDiscard), 2);
    let base = SeqNum(OUR_ISN + 1);
    let mut s = seg(f.peer, base + SEG, Flags::ACK, &[]);
    s.options.sack[0] = flowstack_wire::tcp::SackBlock {
        left: base - 100,
        right: base,
    }; // a D-SACK: fine
    s.options.sack[1] = flowstack_wire::tcp::SackBlock {
        left: base - 3000,
        right: base - 2000,
    };
    s.options.sack_len = 2;
    f.input(s);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPSACKDiscard), 3);
    // The connection is unharmed: the rest is acknowledged normally.
    f.input(seg(f.peer, base + 3 * SEG, Flags::ACK, &[]));
    assert_eq!(f.c.send_queue(), 0);
}

/// A peer that answers every zero-window probe with a zero window cannot hold the
/// connection forever: after `zero_window_timeout` it is aborted (with an RST) and counted;
/// the probes back off in between.
#[test]
fn zero_window_is_bounded_in_time_and_probes_back_off() {
    let cfg = TcpConfig {
        zero_window_timeout: Some(Duration::from_secs(60)),
        ..TcpConfig::default()
    };
    let mut f = Fx::established_cfg(cfg);
    let mut zero = seg(f.peer, SeqNum(OUR_ISN + 1), Flags::ACK, &[]);
    zero.window = 0;
    f.input(zero);
    f.c.send(&[5u8; 3000]).unwrap();
    assert!(f.poll().is_empty());
    let mut probes_at = Vec::new();
    let start = f.now;
    for _ in 0..2000 {
        let out = f.advance(Duration::from_millis(100));
        if out.iter().any(|o| o.flags.contains(Flags::RST)) {
            break;
        }
        if !out.is_empty() {
            probes_at.push(f.now.saturating_since(start));
            f.input(zero); // the peer answers: still zero
        }
    }
    assert_eq!(f.c.state(), State::Closed);
    assert_eq!(f.c.error(), Some(TcpError::TimedOut));
    assert_eq!(f.ctr.get(Counter::TcpExtTCPAbortOnZeroWindow), 1);
    let end = f.now.saturating_since(start);
    assert!(
        end >= Duration::from_secs(60) && end < Duration::from_secs(200),
        "{end:?}"
    );
    // Exponential backoff: gaps grow.
    let gaps: Vec<_> = probes_at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() >= 3 && gaps[2] > gaps[0], "{gaps:?}");
}

/// An urgent pointer beyond the segment's data is counted and ignored; the data is
/// delivered inline.
#[test]
fn urgent_pointer_beyond_data_is_ignored_and_counted() {
    let mut f = Fx::established();
    let mut s = seg(
        f.peer,
        SeqNum(OUR_ISN + 1),
        Flags::ACK | Flags::URG,
        b"hello",
    );
    s.urgent = 5000;
    f.input(s);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPUrgBeyondData), 1);
    let mut buf = [0u8; 16];
    assert_eq!(f.c.recv(&mut buf), Ok(5));
    assert_eq!(&buf[..5], b"hello");
}

/// Every one of the 256 flag combinations, in every state the fixture reaches, at the
/// expected sequence number and outside the window: nothing panics, a synchronized
/// connection is only ever reset by a plain RST at exactly RCV.NXT, and SYN never resets.
#[test]
fn odd_flags_in_every_state() {
    type Setup = fn(&mut Fx);
    let states: [(&str, Setup); 5] = [
        ("established", |_| {}),
        ("fin-wait-1", |f| {
            f.c.send(&[1u8; 100]).unwrap();
            f.c.shutdown_write();
            f.poll();
        }),
        ("close-wait", |f| {
            f.send(0, Flags::FIN | Flags::ACK, &[]);
            f.peer += 1;
        }),
        ("last-ack", |f| {
            f.send(0, Flags::FIN | Flags::ACK, &[]);
            f.peer += 1;
            f.c.shutdown_write();
            f.poll();
        }),
        ("time-wait", |f| to_time_wait(f, None)),
    ];
    for (name, setup) in states {
        for bits in 0..=255u8 {
            for rel in [0i64, 1_000_000] {
                let mut f = Fx::established();
                setup(&mut f);
                let before = f.c.state();
                let flags = Flags(bits);
                let s = SeqNum((f.peer.0 as i64 + rel) as u32);
                let ack = f.c.send_seq().1;
                f.input(seg(s, ack, flags, if bits & 1 == 0 { b"x" } else { &[] }));
                let out = f.poll();
                let reset_ok = flags.rst() && !flags.syn() && rel == 0;
                if f.c.state() == State::Closed && before != State::Closed {
                    let fin_acked = matches!(before, State::LastAck | State::TimeWait);
                    assert!(
                        reset_ok || fin_acked || f.c.error().is_some(),
                        "{name}: {flags} closed the connection"
                    );
                    if !fin_acked && f.c.error() == Some(TcpError::Reset) {
                        assert!(reset_ok, "{name}: {flags} reset it");
                    }
                }
                if flags.syn() && before.is_synchronized() && before != State::TimeWait {
                    assert_ne!(f.c.error(), Some(TcpError::Reset), "{name}: {flags}");
                    assert!(
                        out.iter().all(|o| !o.flags.contains(Flags::RST)) || f.c.error().is_some()
                    );
                }
            }
        }
    }
}

/// Regression (simnet seed 7228): the FIN-WAIT-2 idle limit is for orphans, as Linux's
/// tcp_fin_timeout; a half-closed socket the application still reads from waits on.
#[test]
fn fin_wait_2_limit_applies_only_to_orphans() {
    let mut f = Fx::established();
    f.c.shutdown_write();
    f.poll();
    f.input(seg(f.peer, SeqNum(OUR_ISN + 2), Flags::ACK, &[]));
    assert_eq!(f.c.state(), State::FinWait2);
    for _ in 0..10 {
        f.advance(Duration::from_secs(60));
    }
    assert_eq!(f.c.state(), State::FinWait2, "half-closed, still reading");
    assert!(f.c.error().is_none());
    f.c.close(f.now);
    for _ in 0..3 {
        f.advance(Duration::from_secs(60));
    }
    assert_eq!(f.c.state(), State::Closed, "orphaned: bounded");
}

/// RFC 5482: with a user timeout, unacknowledged data aborts the connection after that long,
/// well before the retransmission limit would.
#[test]
fn user_timeout_aborts_unacknowledged_data() {
    let mut f = Fx::established();
    f.c.set_user_timeout(Some(Duration::from_secs(3)));
    f.c.send(&[1u8; 1000]).unwrap();
    assert_eq!(f.poll().len(), 1);
    let start = f.now;
    for _ in 0..600 {
        f.advance(Duration::from_millis(100));
        if f.c.state() == State::Closed {
            break;
        }
    }
    assert_eq!(f.c.error(), Some(TcpError::TimedOut));
    let took = f.now.saturating_since(start);
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(8),
        "{took:?}"
    );
    assert!(f.c.info().stats.timeouts < 15);
}

/// SO_LINGER 0: close resets at once; SO_LINGER t: a close the peer never completes is reset
/// after t.
#[test]
fn linger_zero_resets_and_linger_bounds_the_close() {
    let mut f = Fx::established();
    f.c.send(&[1u8; 100]).unwrap();
    f.c.close_linger(f.now, Duration::ZERO);
    let out = f.poll();
    assert!(out[0].flags.contains(Flags::RST));
    assert_eq!(f.c.state(), State::Closed);

    let mut f = Fx::established();
    f.c.close_linger(f.now, Duration::from_secs(5));
    let out = f.poll();
    assert!(out[0].flags.contains(Flags::FIN));
    let mut rst = false;
    for _ in 0..100 {
        rst |= f
            .advance(Duration::from_millis(100))
            .iter()
            .any(|o| o.flags.contains(Flags::RST));
    }
    assert!(rst, "reset after the linger time");
    assert_eq!(f.c.state(), State::Closed);
}

/// TCP_INFO reports what the connection negotiated and did.
#[test]
fn tcp_info_reports_the_connection() {
    let mut f = sack_established();
    f.c.send(&[1u8; 3 * SEG]).unwrap();
    assert_eq!(f.poll().len(), 3);
    let i = f.c.info();
    assert_eq!(i.state, State::Established);
    assert_eq!(i.snd_mss, 1460);
    assert_eq!(i.unacked, 3 * SEG);
    assert_eq!(i.send_queue, 3 * SEG);
    assert!(i.options.1, "SACK negotiated");
    assert_eq!(i.stats.segs_out, 4); // SYN-ACK + 3
    ack_sack(&mut f, 3 * SEG, &[]);
    assert_eq!(f.c.info().unacked, 0);
}

/// RFC 3522 / RFC 4015: an ACK after a timeout that echoes the original transmission's
/// timestamp proves the timeout spurious (a delay spike): the congestion window is restored.
/// One that echoes the retransmission's keeps the reduction.
#[test]
fn spurious_timeout_is_detected_by_timestamps_and_undone() {
    for spurious in [true, false] {
        let mut f = Fx::established_with(
            TcpConfig::default(),
            TcpOptions {
                mss: Some(1460),
                timestamp: Some((100, 0)),
                ..Default::default()
            },
        );
        let cwnd = f.c.cwnd();
        f.c.send(&[1u8; 1000]).unwrap();
        let first = f.poll();
        assert_eq!(first.len(), 1);
        let mut rexmit = Vec::new();
        while rexmit.is_empty() {
            rexmit = f.advance(Duration::from_millis(100));
        }
        assert!(f.c.cwnd() < cwnd, "the timeout collapsed cwnd");
        let echo = if spurious { first[0].ts } else { rexmit[0].ts }.unwrap().0;
        let mut ack = seg(f.peer, SeqNum(OUR_ISN + 1 + 1000), Flags::ACK, &[]);
        ack.options.timestamp = Some((200, echo));
        f.input(ack);
        if spurious {
            assert_eq!(f.ctr.get(Counter::TcpExtTCPSpuriousRTOs), 1);
            assert!(f.c.cwnd() >= cwnd, "restored: {} < {cwnd}", f.c.cwnd());
        } else {
            assert_eq!(f.ctr.get(Counter::TcpExtTCPSpuriousRTOs), 0);
            assert!(f.c.cwnd() < cwnd);
        }
    }
}

/// Regression (simnet seed 21726): keepalive probes also go out from a half-closed
/// connection (FIN-WAIT-2), as Linux sends them, so a vanished peer is noticed there too.
#[test]
fn keepalive_probes_in_fin_wait_2() {
    let mut f = Fx::established();
    let ka = flowstack_tcp::Keepalive {
        idle: Duration::from_secs(10),
        interval: Duration::from_secs(5),
        probes: 2,
    };
    f.c.set_keepalive(Some(ka), f.now);
    f.c.shutdown_write();
    f.poll();
    f.input(seg(f.peer, SeqNum(OUR_ISN + 2), Flags::ACK, &[]));
    assert_eq!(f.c.state(), State::FinWait2);
    let mut probes = 0;
    for _ in 0..40 {
        probes += f.advance(Duration::from_secs(1)).len();
    }
    assert!(probes >= 2, "{probes} probes");
    assert_eq!(f.c.error(), Some(TcpError::TimedOut));
}
