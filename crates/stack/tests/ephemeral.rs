//! Ephemeral ports start where the engine's secret says (RFC 6056 §3.1): two processes
//! configured alike do not walk the same port sequence, while a fixed secret (simulations)
//! keeps a run reproducible.

use flowstack_link::DeviceCaps;
use flowstack_stack::{Engine, EngineConfig, IfaceConfig};
use flowstack_wire::{EthernetAddress, Ipv4Address, Ipv4Cidr};
use std::net::{Ipv4Addr, SocketAddrV4};

fn first_port(secret: Option<[u8; 16]>) -> u16 {
    let mut cfg = EngineConfig::new(IfaceConfig::new(
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        Ipv4Cidr::new(Ipv4Address::new(10, 0, 0, 1), 24),
    ));
    cfg.secret = secret;
    let mut e = Engine::new(cfg, DeviceCaps::ETHERNET);
    let h = e
        .tcp_connect(SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80))
        .unwrap();
    e.tcp_conn(h).unwrap().tuple().local_port
}

#[test]
fn the_first_ephemeral_port_follows_the_secret() {
    let a = first_port(Some([1; 16]));
    assert_eq!(
        a,
        first_port(Some([1; 16])),
        "a fixed secret is reproducible"
    );
    let mut other = [1; 16];
    other[15] = 2;
    assert_ne!(a, first_port(Some(other)), "same MAC, different secret");
    for p in [a, first_port(Some(other))] {
        assert!(p >= 49152, "{p} outside the IANA dynamic range");
    }
}
