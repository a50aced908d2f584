//! RFC 4821 probing at the packet level: one segment larger than the MSS goes out; acknowledged,
//! it raises the MSS; lost alone (found by RACK, by duplicate ACKs or by a timeout), it lowers
//! the top of the search and costs no congestion response — its bytes are resent at the
//! current MSS. Connections here probe from the start (`Plpmtud::Always`, MSS 1024 under a
//! peer MSS of 1460, no timestamps: payload = MSS).

// Each test file uses part of the shared fixture.
#![allow(dead_code, unused_imports)]

include!("fixture/mod.rs");

use flowstack_tcp::Plpmtud;

const BASE: u32 = OUR_ISN + 1;
/// The first probe: the middle of [1024, 1460].
const PROBE: usize = 1024 + (1460 - 1024) / 2;
/// Bytes the warm-up round sent and had acknowledged.
const WARM: usize = 1000;

fn probing(loss_detection: LossDetection, sack: bool) -> Fx {
    let mut f = Fx::established_with(
        TcpConfig {
            plpmtud: Plpmtud::Always,
            loss_detection,
            ..TcpConfig::default()
        },
        TcpOptions {
            mss: Some(1460),
            sack_permitted: sack,
            ..Default::default()
        },
    );
    // One small round trip of 40 ms: the search starts at 1024 and RACK has an RTT.
    f.c.send(&[7u8; WARM]).unwrap();
    assert_eq!(
        lens(&f.poll()),
        vec![WARM],
        "too little data queued to probe"
    );
    assert_eq!(f.c.mss(), 1024);
    assert_eq!(f.c.mtu_search(), Some((1024, 1460)));
    f.now += Duration::from_millis(40);
    assert!(ack_sack(&mut f, WARM, &[]).is_empty());
    f
}

fn lens(out: &[Out]) -> Vec<usize> {
    out.iter().map(|o| o.len).collect()
}

/// Queues `n` bytes and returns the flight: the probe first, then 1024-byte segments.
fn send_with_probe(f: &mut Fx, n: usize) -> Vec<Out> {
    f.c.send(&vec![8u8; n]).unwrap();
    let out = f.poll();
    assert_eq!(out[0].seq, SeqNum(BASE) + WARM);
    assert_eq!(
        out[0].len, PROBE,
        "the probe: one segment of the probe's size"
    );
    assert!(out.len() > 4, "{:?}", lens(&out));
    assert!(out[1..].iter().all(|o| o.len == 1024), "{:?}", lens(&out));
    out
}

/// Sends 20 KiB led by a probe, then 40 ms later acknowledges everything but the probe
/// (SACK above it): what was transmitted in answer, and cwnd and ssthresh before the loss.
fn lose_the_probe_alone(f: &mut Fx) -> (Vec<Out>, usize, usize) {
    let out = send_with_probe(f, 20 * 1024);
    let sent = flight(&out);
    let (cwnd, ssthresh) = (f.c.cwnd(), f.c.info().ssthresh);
    f.now += Duration::from_millis(40);
    let resent = ack_sack(f, WARM, &[(WARM + PROBE, WARM + sent)]);
    (resent, cwnd, ssthresh)
}

/// The peer acknowledges everything sent, round after round, until nothing is queued;
/// returns the segments sent meanwhile.
fn drain(f: &mut Fx) -> Vec<Out> {
    let mut all = Vec::new();
    for _ in 0..100 {
        if f.c.send_queue() == 0 {
            return all;
        }
        f.now += Duration::from_millis(40);
        let max = f.c.send_seq().1;
        all.extend(ack_sack(f, max - SeqNum(BASE), &[]));
    }
    panic!("never drained");
}

fn flight(out: &[Out]) -> usize {
    out.iter().map(|o| o.len).sum()
}

/// RFC 4821 §7.6.1: the probe acknowledged — search_low and the MSS become its size, and
/// the next probe is the middle of what is left.
#[test]
fn an_acknowledged_probe_raises_the_mss() {
    let mut f = probing(LossDetection::Rack, true);
    let out = send_with_probe(&mut f, 20 * 1024);
    f.now += Duration::from_millis(40);
    let mut rest = ack_sack(&mut f, WARM + flight(&out), &[]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPMTUPSuccess), 1);
    assert_eq!(f.c.mss(), PROBE);
    assert_eq!(f.c.mtu_search(), Some((PROBE, 1460)));
    assert_eq!(f.c.info().pmtu, PROBE + 40);
    // Segments of the new size; the next round probes (PROBE + 1460) / 2.
    rest.extend(drain(&mut f));
    assert_eq!(rest[0].len, PROBE, "{:?}", lens(&rest));
    assert!(rest.iter().all(|o| o.len <= PROBE), "{:?}", lens(&rest));
    f.c.send(&vec![9u8; 20 * 1024]).unwrap();
    let out = f.poll();
    assert_eq!(out[0].len, PROBE + (1460 - PROBE) / 2);
    let n = out.len();
    assert!(
        out[1..n - 1].iter().all(|o| o.len == PROBE),
        "{:?}",
        lens(&out)
    );
    assert!(out[n - 1].len <= PROBE);
}

/// RFC 4821 §7.6.2 with RACK: the probe alone is lost (everything after it SACKed). Not a
/// congestion signal: cwnd and ssthresh stay, no recovery starts; search_high drops below
/// the probe; its bytes are resent in segments of the current MSS and delivered.
#[test]
fn a_probe_lost_alone_keeps_cwnd_and_is_resent_at_the_mss() {
    let mut f = probing(LossDetection::Rack, true);
    let (resent, cwnd, ssthresh) = lose_the_probe_alone(&mut f);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPMTUPFail), 1);
    assert_eq!(f.c.mtu_search(), Some((1024, PROBE - 1)));
    assert_eq!(f.c.mss(), 1024);
    assert_eq!(
        seqs(&resent[..2]),
        vec![
            (SeqNum(BASE) + WARM, 1024),
            (SeqNum(BASE) + WARM + 1024, PROBE - 1024)
        ],
        "the probe's bytes, cut at the MSS"
    );
    assert_eq!(f.c.cwnd(), cwnd, "a lost probe is no congestion signal");
    assert_eq!(f.c.info().ssthresh, ssthresh);
    assert_eq!(f.c.stats().fast_retransmits, 0);
    // The resent bytes arrive: everything is acknowledged, nothing is left to send.
    drain(&mut f);
    let total = WARM + 20 * 1024;
    assert_eq!(f.c.send_seq(), (SeqNum(BASE) + total, SeqNum(BASE) + total));
    assert_eq!(f.c.send_queue(), 0);
    assert_eq!(f.c.info().ssthresh, ssthresh);
    // The next probe is the middle of the narrower range.
    f.c.send(&vec![9u8; 20 * 1024]).unwrap();
    assert_eq!(f.poll()[0].len, 1024 + (PROBE - 1 - 1024) / 2);
}

/// The same with duplicate-ACK loss detection (RFC 6675, no RACK): the probe at SND.UNA
/// declared lost by the SACKed data above it is resent at the MSS without entering
/// recovery.
#[test]
fn a_probe_lost_alone_without_rack_keeps_cwnd() {
    let mut f = probing(LossDetection::DupAck, true);
    let (resent, cwnd, ssthresh) = lose_the_probe_alone(&mut f);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPMTUPFail), 1);
    assert_eq!(f.c.mtu_search(), Some((1024, PROBE - 1)));
    assert_eq!(
        seqs(&resent[..2]),
        vec![
            (SeqNum(BASE) + WARM, 1024),
            (SeqNum(BASE) + WARM + 1024, PROBE - 1024)
        ]
    );
    assert_eq!(f.c.cwnd(), cwnd);
    assert_eq!(f.c.info().ssthresh, ssthresh);
    assert_eq!(f.c.stats().fast_retransmits, 0);
    drain(&mut f);
    let total = WARM + 20 * 1024;
    assert_eq!(f.c.send_seq(), (SeqNum(BASE) + total, SeqNum(BASE) + total));
}

/// RFC 4821 §7.6.3: no ACK at all after the probe, and the retransmission timer fires with
/// the probe at SND.UNA: a failed probe — resent at the MSS, the window not collapsed.
#[test]
fn a_probe_timed_out_at_the_head_keeps_cwnd() {
    let mut f = probing(LossDetection::DupAck, false);
    send_with_probe(&mut f, 20 * 1024);
    let (cwnd, ssthresh) = (f.c.cwnd(), f.c.info().ssthresh);
    let mut out = Vec::new();
    for _ in 0..100 {
        out = f.advance(Duration::from_millis(50));
        if !out.is_empty() {
            break;
        }
    }
    assert_eq!(f.c.stats().timeouts, 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPMTUPFail), 1);
    assert_eq!(seqs(&out[..1]), vec![(SeqNum(BASE) + WARM, 1024)]);
    assert_eq!(f.c.cwnd(), cwnd);
    assert_eq!(f.c.info().ssthresh, ssthresh);
    assert_eq!(f.c.mtu_search(), Some((1024, PROBE - 1)));
}

/// RFC 4821 §7.6.4: the probe lost together with other segments may be congestion. The
/// usual response (recovery, a smaller window) and the range unchanged.
#[test]
fn a_probe_lost_with_other_segments_is_inconclusive() {
    let mut f = probing(LossDetection::Rack, true);
    let out = send_with_probe(&mut f, 20 * 1024);
    let sent = flight(&out);
    let cwnd = f.c.cwnd();
    f.now += Duration::from_millis(40);
    // The probe and the segment after it lost.
    ack_sack(&mut f, WARM, &[(WARM + PROBE + 1024, WARM + sent)]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPMTUPFail), 0);
    assert_eq!(f.c.mtu_search(), Some((1024, 1460)));
    assert_eq!(f.c.stats().fast_retransmits, 1);
    assert!(f.c.cwnd() < cwnd);
}

/// `Plpmtud::Off` (and the default, before any black hole): no search, no probe.
#[test]
fn no_probe_without_a_search() {
    for plpmtud in [Plpmtud::Off, Plpmtud::AfterBlackHole] {
        let mut f = Fx::established_cfg(TcpConfig {
            plpmtud,
            ..TcpConfig::default()
        });
        f.c.send(&vec![1u8; 20 * SEG]).unwrap();
        let out = f.poll();
        assert!(out.iter().all(|o| o.len == SEG), "{:?}", lens(&out));
        assert_eq!(f.c.mtu_search(), None);
    }
}
