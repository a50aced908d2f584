//! Ephemeral ports: a configurable range, never two live connections on one 4-tuple, and —
//! behind a steered multi-queue link — ports whose replies hash back to the engine's queue.

use flowstack_link::DeviceCaps;
use flowstack_stack::{Engine, EngineConfig, IfaceConfig, SocketError, Steering};
use flowstack_wire::rss::{queue_of, Toeplitz};
use flowstack_wire::{EthernetAddress, Ipv4Address};
use std::collections::HashSet;
use std::net::SocketAddrV4;

fn engine(tune: impl FnOnce(&mut EngineConfig)) -> Engine {
    let mut cfg = EngineConfig::new(IfaceConfig::new(
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        "10.0.0.1/24".parse().unwrap(),
    ));
    cfg.secret = Some([7; 16]);
    tune(&mut cfg);
    Engine::new(cfg, DeviceCaps::ETHERNET)
}

const PEER: Ipv4Address = Ipv4Address([10, 0, 0, 2]);

fn peer(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(PEER.into(), port)
}

#[test]
fn a_steered_engine_picks_ports_whose_replies_hash_back_to_its_queue() {
    let rss = Toeplitz::symmetric();
    for queue in 0..4 {
        let mut e = engine(|c| c.steering = Some(Steering { queue, queues: 4 }));
        let mut ports = HashSet::new();
        for i in 0..300 {
            let h = e.tcp_connect(peer(80 + (i % 3))).expect("connect");
            let t = e.tcp_conn(h).unwrap().tuple();
            let hash = rss.hash_v4(t.remote_ip, t.local_ip, t.remote_port, t.local_port);
            assert_eq!(
                queue_of(hash, 4),
                queue,
                "port {} on queue {queue}",
                t.local_port
            );
            assert!(
                ports.insert((t.remote_port, t.local_port)),
                "4-tuple handed out twice"
            );
        }
    }
}

#[test]
fn a_lone_engine_uses_every_port_of_its_range_then_fails_cleanly() {
    let mut e = engine(|c| c.ephemeral = (50_000, 50_003));
    let hs: Vec<_> = (0..4).map(|_| e.tcp_connect(peer(80)).unwrap()).collect();
    let ports: HashSet<u16> = hs
        .iter()
        .map(|&h| e.tcp_conn(h).unwrap().tuple().local_port)
        .collect();
    assert_eq!(ports, (50_000..=50_003).collect());
    assert_eq!(e.tcp_connect(peer(80)), Err(SocketError::AddrNotAvailable));
    // The same local port may serve another remote port: the 4-tuple differs.
    assert!(e.tcp_connect(peer(81)).is_ok());
    // A released port comes back once the engine has run.
    let freed = e.tcp_conn(hs[1]).unwrap().tuple().local_port;
    e.tcp_abort(hs[1]).unwrap();
    e.tcp_close(hs[1]).unwrap();
    e.dispatch(flowstack_wire::Instant::from_millis(1));
    let again = e.tcp_connect(peer(80)).expect("a freed port is reused");
    assert_eq!(e.tcp_conn(again).unwrap().tuple().local_port, freed);
    // UDP draws from the same range.
    let u: Vec<_> = (0..4).map(|_| e.udp_bind(0).unwrap()).collect();
    assert!(u
        .iter()
        .all(|&h| (50_000..=50_003).contains(&e.udp_local_port(h).unwrap())));
    assert_eq!(e.udp_bind(0), Err(SocketError::AddrNotAvailable));
}
