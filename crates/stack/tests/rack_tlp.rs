//! RACK-TLP (RFC 8985) between two engines: a transfer whose last segment is lost is repaired
//! by a tail loss probe, not by a retransmission timeout; DupAck mode (RFC 6675) is still
//! selectable and still byte-exact.

use flowstack_stack::netsim::{bulk_transfer, Net, NetConfig};
use flowstack_stack::{Counter, EngineConfig};
use flowstack_tcp::LossDetection;
use flowstack_wire::Duration;

/// Drops the first transmission of the segment carrying A's FIN (the tail of the transfer).
fn drop_first_fin(_len: usize, fin: bool, state: &mut u32) -> bool {
    if fin && *state == 0 {
        *state = 1;
        return true;
    }
    false
}

fn run(tune: fn(&mut EngineConfig)) -> Net {
    let cfg = NetConfig {
        drop_a: Some(drop_first_fin),
        tune,
        ..Default::default()
    };
    let mut net = Net::new(cfg, None).unwrap();
    let r = bulk_transfer(&mut net, 200_000, Duration::from_secs(60), |_| {}, |_| {}).unwrap();
    assert_eq!(r.mismatch_at, None);
    assert!(r.complete, "{r:?}");
    net
}

#[test]
fn rack_tail_loss_is_recovered_by_a_probe_without_a_timeout() {
    let net = run(|_| {});
    let c = net.a.counters();
    assert_eq!(c.get(Counter::TcpExtTCPLossProbes), 1);
    assert_eq!(c.get(Counter::TcpExtTCPLossProbeRecovery), 1);
    assert_eq!(c.get(Counter::TcpExtTCPTimeouts), 0, "no RTO");
}

#[test]
fn dupack_mode_repairs_a_tail_loss_with_a_timeout() {
    let net = run(|c| c.tcp.defaults.loss_detection = LossDetection::DupAck);
    let c = net.a.counters();
    assert_eq!(c.get(Counter::TcpExtTCPLossProbes), 0);
    assert_eq!(
        c.get(Counter::TcpExtTCPTimeouts),
        1,
        "the tail costs an RTO"
    );
}
