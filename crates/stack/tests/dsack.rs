//! D-SACK (RFC 2883, RFC 3708) between two engines: reordering on the path makes the sender
//! resend segments whose originals were only late; the receiver reports the duplicates as
//! D-SACK blocks, and the sender finds the retransmissions needless and undoes the window
//! reductions they caused. Byte-exact either way.

use flowstack_link::impair::ImpairSpec;
use flowstack_stack::netsim::{bulk_transfer, Net, NetConfig};
use flowstack_stack::Counter;
use flowstack_wire::Duration;

fn run(impair: &str, seed: u64) -> Net {
    let cfg = NetConfig {
        impair: impair.parse::<ImpairSpec>().unwrap(),
        seed,
        ..Default::default()
    };
    let mut net = Net::new(cfg, None).unwrap();
    let r = bulk_transfer(&mut net, 4 << 20, Duration::from_secs(120), |_| {}, |_| {}).unwrap();
    assert_eq!(r.mismatch_at, None);
    assert!(r.complete, "{r:?}");
    net
}

/// 1 % of frames held 3 ms on a path of 2 ms each way: RACK resends some before the
/// original arrives (its reordering window starts at min_RTT/4 = 1 ms).
#[test]
fn reordering_retransmissions_are_found_needless_and_undone() {
    let net = run("delay=2ms,reorder=0.01,gap=3ms", 3);
    let (a, b) = (net.a.counters(), net.b.counters());
    assert!(a.get(Counter::TcpRetransSegs) > 0, "no retransmission");
    assert!(
        b.get(Counter::TcpExtTCPDSACKOldSent) > 0,
        "B sent no D-SACK"
    );
    assert!(a.get(Counter::TcpExtTCPDSACKRecv) > 0);
    assert!(a.get(Counter::TcpExtTCPSpuriousRetrans) > 0);
    assert!(a.get(Counter::TcpExtTCPDSACKUndo) > 0, "no recovery undone");
    assert_eq!(a.get(Counter::TcpExtTCPDSACKIgnored), 0);
}

/// Loss alone (no reordering): every retransmission was needed, nothing is undone.
#[test]
fn real_losses_are_not_undone() {
    let net = run("delay=2ms,loss=0.01", 3);
    let a = net.a.counters();
    assert!(a.get(Counter::TcpRetransSegs) > 0, "no retransmission");
    assert_eq!(a.get(Counter::TcpExtTCPDSACKUndo), 0);
    assert_eq!(a.get(Counter::TcpExtTCPSpuriousRetrans), 0);
}
