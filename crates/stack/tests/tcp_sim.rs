//! Deterministic simulation of TCP between two engines: byte-exact transfers under loss,
//! reordering, duplication and corruption, across many seeds. A failing seed reproduces
//! exactly (`FLOWSTACK_SEEDS=N` runs more seeds).

use flowstack_link::impair::ImpairSpec;
use flowstack_stack::netsim::{bulk_transfer, Net, NetConfig};
use flowstack_wire::Duration;

fn run(spec: &str, seed: u64, bytes: u64) -> flowstack_stack::netsim::TransferReport {
    let cfg = NetConfig {
        impair: spec.parse::<ImpairSpec>().unwrap(),
        seed,
        ..Default::default()
    };
    let mut net = Net::new(cfg, None).unwrap();
    bulk_transfer(&mut net, bytes, Duration::from_secs(600), |_| {}, |_| {})
        .unwrap_or_else(|e| panic!("seed {seed} spec {spec}: {e}"))
}

#[test]
fn clean_transfer_is_byte_exact() {
    let r = run("", 1, 4 << 20);
    assert_eq!(r.mismatch_at, None);
    assert!(r.complete, "{r:?}");
    assert_eq!(r.client.retransmits, 0);
}

fn seeds() -> u64 {
    std::env::var("FLOWSTACK_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

fn sweep(spec: &str, bytes: u64) {
    let mut retrans = 0;
    for seed in 0..seeds() {
        let r = run(spec, seed, bytes);
        assert_eq!(r.mismatch_at, None, "seed {seed} spec {spec}");
        assert!(r.complete, "seed {seed} spec {spec}: {r:?}");
        retrans += r.client.retransmits;
    }
    if spec.contains("loss") {
        assert!(retrans > 0, "loss must cause retransmissions");
    }
}

#[test]
fn one_percent_loss_with_reorder_dup_corrupt() {
    sweep("loss=0.01,reorder=0.01,dup=0.01,corrupt=0.005", 256 * 1024);
}

#[test]
fn five_percent_loss_with_reorder_dup_corrupt() {
    sweep("loss=0.05,reorder=0.02,dup=0.02,corrupt=0.01", 256 * 1024);
}

#[test]
fn zero_loss_with_reorder_and_delay() {
    sweep("reorder=0.05,dup=0.02,delay=200us", 64 * 1024);
}

#[test]
fn connect_to_closed_port_is_refused() {
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    net.stamp();
    let c = net
        .a
        .tcp_connect(std::net::SocketAddrV4::new(
            flowstack_stack::netsim::B_IP.into(),
            4444,
        ))
        .unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n.a.tcp_error(c).is_some()));
    assert_eq!(
        net.a.tcp_error(c),
        Some(flowstack_stack::SocketError::ConnectionRefused)
    );
    assert_eq!(
        net.b.counters().get(flowstack_stack::Counter::TcpOutRsts),
        1
    );
}

#[test]
fn peer_vanishing_mid_transfer_times_out_within_bound() {
    fn tune(c: &mut flowstack_stack::EngineConfig) {
        c.tcp.defaults.max_retries = 4;
    }
    let cfg = NetConfig {
        tune,
        ..Default::default()
    };
    let mut net = Net::new(cfg, None).unwrap();
    let l = net.b.tcp_listen(9, 4).unwrap();
    net.stamp();
    let c = net
        .a
        .tcp_connect(std::net::SocketAddrV4::new(
            flowstack_stack::netsim::B_IP.into(),
            9,
        ))
        .unwrap();
    assert!(net.run_until(Duration::from_secs(1), |n| n.b.tcp_accept(l).is_ok()));
    net.b_down = true;
    let start = net.now;
    net.a.tcp_send(c, &[1u8; 10_000]).unwrap();
    let timed_out = net.run_until(Duration::from_secs(3600), |n| n.a.tcp_error(c).is_some());
    assert!(timed_out);
    assert_eq!(
        net.a.tcp_error(c),
        Some(flowstack_stack::SocketError::TimedOut)
    );
    // Bound: RTO 1 s initial doubling 4 times (1+2+4+8+16 s) plus the last wait.
    let took = net.now.saturating_since(start);
    assert!(took <= Duration::from_secs(64), "took {took:?}");
    assert_eq!(
        net.a
            .counters()
            .get(flowstack_stack::Counter::TcpExtTCPAbortOnTimeout),
        1
    );
}
