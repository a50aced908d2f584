//! Path MTU going back up (RFC 1191 §6.3): a path MTU lowered by ICMP "fragmentation needed"
//! expires after `pmtu_expires` (10 minutes, Linux's `ip_rt_mtu_expires`) and the connection
//! sends full-sized segments again; a path that still cannot carry them lowers it again
//! without any congestion response. Explicit time: the clock is the fixture's `now`.

// Each test file uses part of the shared fixture.
#![allow(dead_code, unused_imports)]

include!("fixture/mod.rs");

use flowstack_tcp::IcmpError;

const BASE: u32 = OUR_ISN + 1;

/// ICMP: the datagram carrying `seq` needed fragmentation; the next hop carries `mtu`.
fn frag_needed(f: &mut Fx, mtu: u16, seq: SeqNum) {
    let err = IcmpError::FragNeeded {
        mtu,
        quoted_len: 1500,
    };
    f.c.on_icmp_error(f.now, err, seq, &mut f.ctr);
}

/// The peer acknowledges `acked` bytes of our stream.
fn ack(f: &mut Fx, acked: usize) -> Vec<Out> {
    let s = seg(f.peer, SeqNum(BASE) + acked, Flags::ACK, &[]);
    f.input(s);
    f.poll()
}

fn lens(out: &[Out]) -> Vec<usize> {
    out.iter().map(|o| o.len).collect()
}

/// Sends `n` bytes, returns the segments' sizes; the peer then acknowledges all of it.
fn round(f: &mut Fx, sent: &mut usize, n: usize) -> Vec<usize> {
    f.c.send(&vec![3u8; n]).unwrap();
    let out = f.poll();
    *sent += n;
    f.now += Duration::from_millis(10);
    ack(f, *sent);
    lens(&out)
}

/// A connection whose path MTU ICMP lowered to 1000 (MSS 960) at the current `now`, with
/// everything acknowledged since.
fn lowered() -> (Fx, usize) {
    let mut f = Fx::established();
    let mut sent = 0;
    assert_eq!(round(&mut f, &mut sent, 2 * SEG), vec![SEG, SEG]);
    f.c.send(&[4u8; 2 * SEG]).unwrap();
    assert_eq!(lens(&f.poll()), vec![SEG, SEG]);
    let cwnd = f.c.cwnd();
    frag_needed(&mut f, 1000, SeqNum(BASE) + sent);
    assert_eq!(f.c.mss(), 960);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPPMTUReduced), 1);
    // RFC 1191 §6.5: resent smaller, and no congestion response.
    assert_eq!(lens(&f.poll()), vec![960, 960, 960, 40]);
    assert_eq!(f.c.cwnd(), cwnd);
    sent += 2 * SEG;
    f.now += Duration::from_millis(10);
    ack(&mut f, sent);
    (f, sent)
}

#[test]
fn lowered_path_mtu_is_raised_after_it_expires_and_lowered_again_if_still_too_big() {
    let (mut f, mut sent) = lowered();
    // Before the expiry: still small.
    f.now += Duration::from_secs(590);
    assert_eq!(round(&mut f, &mut sent, 2 * SEG), vec![960, 960, 960, 40]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPPMTURaised), 0);
    // Ten minutes after the ICMP: full-sized segments again.
    f.now += Duration::from_secs(11);
    f.c.send(&[5u8; 2 * SEG]).unwrap();
    let cwnd = f.c.cwnd();
    assert_eq!(lens(&f.poll()), vec![SEG, SEG]);
    assert_eq!(f.c.mss(), SEG);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPPMTURaised), 1);
    // The path still cannot carry them: the router says so again. Lowered again, resent
    // smaller — not a congestion event: cwnd kept, no fast retransmit, no timeout.
    frag_needed(&mut f, 1000, SeqNum(BASE) + sent);
    assert_eq!(f.c.mss(), 960);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPPMTURaiseFailed), 1);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPPMTUReduced), 2);
    assert_eq!(lens(&f.poll()), vec![960, 960, 960, 40]);
    assert_eq!(f.c.cwnd(), cwnd);
    assert_eq!(f.c.stats().fast_retransmits, 0);
    assert_eq!(f.c.stats().timeouts, 0);
    sent += 2 * SEG;
    f.now += Duration::from_millis(10);
    ack(&mut f, sent);
    // And tried again ten minutes later, where the path has grown: the raise holds.
    f.now += Duration::from_secs(601);
    assert_eq!(round(&mut f, &mut sent, 2 * SEG), vec![SEG, SEG]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPPMTURaised), 2);
    // A later ICMP is a new decrease, not a failed raise.
    f.c.send(&[6u8; SEG]).unwrap();
    assert_eq!(lens(&f.poll()), vec![SEG]);
    frag_needed(&mut f, 1200, SeqNum(BASE) + sent);
    assert_eq!(f.c.mss(), 1160);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPPMTURaiseFailed), 1);
}

/// A raise whose large segments vanish without an ICMP (a black hole for that size): the
/// first retransmission timeout goes back to the size that worked, not three, and keeps cwnd.
#[test]
fn a_raise_lost_silently_is_taken_back_at_the_first_timeout() {
    let (mut f, sent) = lowered();
    f.now += Duration::from_secs(601);
    f.c.send(&[5u8; 2 * SEG]).unwrap();
    assert_eq!(lens(&f.poll()), vec![SEG, SEG]);
    let cwnd = f.c.cwnd();
    let mut out = Vec::new();
    for _ in 0..100 {
        out = f.advance(Duration::from_millis(50));
        if !out.is_empty() {
            break;
        }
    }
    assert_eq!(f.c.stats().timeouts, 1);
    assert_eq!(f.c.mss(), 960);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPPMTURaiseFailed), 1);
    assert_eq!(out[0].seq, SeqNum(BASE) + sent);
    assert_eq!(out[0].len, 960, "resent at the size the path carries");
    assert_eq!(
        f.c.cwnd(),
        cwnd,
        "a size the path cannot carry is not congestion"
    );
}

/// `pmtu_expires: None` keeps a lowered estimate for good.
#[test]
fn no_raise_when_expiry_is_off() {
    let mut f = Fx::established_cfg(TcpConfig {
        pmtu_expires: None,
        ..TcpConfig::default()
    });
    let mut sent = 0;
    f.c.send(&[4u8; SEG]).unwrap();
    assert_eq!(lens(&f.poll()), vec![SEG]);
    frag_needed(&mut f, 1000, SeqNum(BASE));
    f.poll();
    sent += SEG;
    ack(&mut f, sent);
    f.now += Duration::from_secs(3600);
    assert_eq!(round(&mut f, &mut sent, SEG), vec![960, 500]);
    assert_eq!(f.ctr.get(Counter::TcpExtTCPPMTURaised), 0);
}

/// The default is Linux's ten minutes.
#[test]
fn pmtu_expiry_defaults_to_ten_minutes() {
    assert_eq!(
        TcpConfig::default().pmtu_expires,
        Some(Duration::from_secs(600))
    );
}
