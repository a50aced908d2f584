//! TCP scenarios between two engines in the deterministic simulation: SYN flood, simultaneous
//! open and close, TIME_WAIT, keepalive, and a receiver that stops reading for a long time.

use flowstack_stack::netsim::{Net, NetConfig, A_IP, B_IP};
use flowstack_stack::{Counter, EngineConfig, Keepalive, SocketError, State, TcpHandle};
use flowstack_wire::ethernet::EthernetRepr;
use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr};
use flowstack_wire::tcp::{Flags, TcpOptions, TcpRepr};
use flowstack_wire::{ChecksumCaps, Duration, EtherType, EthernetAddress, Ipv4Address, SeqNum};
use std::net::SocketAddrV4;

fn addr(ip: Ipv4Address, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip.into(), port)
}

/// Connects A to a listener on B and returns (A's handle, B's accepted handle).
fn pair(net: &mut Net, port: u16) -> (TcpHandle, TcpHandle) {
    let l = net.b.tcp_listen(port, 16).unwrap();
    net.stamp();
    let c = net.a.tcp_connect(addr(B_IP, port)).unwrap();
    let mut s = None;
    assert!(net.run_until(Duration::from_secs(5), |n| {
        s = s.or_else(|| n.b.tcp_accept(l).ok());
        s.is_some() && n.a.tcp_conn(c).map(|k| k.is_open()).unwrap_or(false)
    }));
    (c, s.unwrap())
}

/// A spoofed SYN to B's port from `src`.
fn spoofed_syn(src: Ipv4Address, sport: u16, port: u16) -> Vec<u8> {
    let t = TcpRepr {
        src_port: sport,
        dst_port: port,
        seq: SeqNum(sport as u32 * 7919),
        ack: SeqNum(0),
        flags: Flags::SYN,
        window: 65535,
        urgent: 0,
        options: TcpOptions {
            mss: Some(1460),
            ..Default::default()
        },
        payload: &[],
    };
    let ip = Ipv4Repr::new(src, B_IP, IpProtocol::Tcp, t.buffer_len());
    let mut f = vec![0u8; 14 + 20 + t.buffer_len()];
    EthernetRepr {
        src: EthernetAddress([2, 9, 9, 9, 9, 9]),
        dst: EthernetAddress([2, 0, 0, 0, 0, 2]),
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut f);
    ip.emit(&mut f[14..34], ChecksumCaps::SOFTWARE);
    t.emit(&mut f[34..], src, B_IP, ChecksumCaps::SOFTWARE);
    f
}

#[test]
fn syn_flood_does_not_lock_out_a_real_client() {
    fn tune(c: &mut EngineConfig) {
        c.tcp.syn_backlog = 32;
    }
    let mut net = Net::new(
        NetConfig {
            tune,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let l = net.b.tcp_listen(80, 64).unwrap();
    // 5000 SYNs from addresses that will never answer.
    for i in 0..5000u32 {
        let src = Ipv4Address::new(10, 0, 0, 100 + (i % 100) as u8);
        net.stamp();
        net.b
            .receive(net.now, &spoofed_syn(src, 1024 + i as u16, 80));
    }
    assert!(net.b.tcp_connections() <= 32, "half-open state is bounded");
    assert!(net.b.counters().get(Counter::TcpExtSyncookiesSent) >= 4900);
    net.stamp();
    let c = net.a.tcp_connect(addr(B_IP, 80)).unwrap();
    let mut s = None;
    assert!(net.run_until(Duration::from_secs(5), |n| {
        s = s.or_else(|| n.b.tcp_accept(l).ok());
        s.is_some()
    }));
    assert_eq!(net.b.counters().get(Counter::TcpExtSyncookiesRecv), 1);
    // The cookie connection carries data both ways.
    net.a.tcp_send(c, b"ping").unwrap();
    let mut buf = [0u8; 16];
    let mut got = 0;
    assert!(net.run_until(Duration::from_secs(5), |n| {
        got = n.b.tcp_recv(s.unwrap(), &mut buf).unwrap_or(0);
        got > 0
    }));
    assert_eq!(&buf[..got], b"ping");
}

#[test]
fn simultaneous_open_establishes_both_sides() {
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    net.stamp();
    let cfg = flowstack_stack::TcpConfig::default();
    let a = net.a.tcp_connect_from(7000, addr(B_IP, 7001), cfg).unwrap();
    let b = net.b.tcp_connect_from(7001, addr(A_IP, 7000), cfg).unwrap();
    assert!(net.run_until(Duration::from_secs(10), |n| {
        n.a.tcp_conn(a).unwrap().state() == State::Established
            && n.b.tcp_conn(b).unwrap().state() == State::Established
    }));
    assert_eq!(net.a.counters().get(Counter::TcpPassiveOpens), 0);
    net.a.tcp_send(a, b"both opened").unwrap();
    let mut buf = [0u8; 32];
    let mut got = 0;
    assert!(net.run_until(Duration::from_secs(5), |n| {
        got = n.b.tcp_recv(b, &mut buf).unwrap_or(0);
        got > 0
    }));
    assert_eq!(&buf[..got], b"both opened");
}

#[test]
fn simultaneous_close_passes_through_closing_to_time_wait() {
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let (a, b) = pair(&mut net, 9);
    net.a.tcp_shutdown(a).unwrap();
    net.b.tcp_shutdown(b).unwrap();
    assert_eq!(net.a.tcp_conn(a).unwrap().state(), State::FinWait1);
    let mut saw_closing = false;
    assert!(net.run_until(Duration::from_secs(5), |n| {
        let (sa, sb) = (
            n.a.tcp_conn(a).unwrap().state(),
            n.b.tcp_conn(b).unwrap().state(),
        );
        saw_closing |= sa == State::Closing || sb == State::Closing;
        sa == State::TimeWait && sb == State::TimeWait
    }));
    assert!(saw_closing);
    // Both read end of stream.
    let mut buf = [0u8; 4];
    assert_eq!(net.a.tcp_recv(a, &mut buf), Ok(0));
    assert_eq!(net.b.tcp_recv(b, &mut buf), Ok(0));
    // After 2·MSL (60 s by default) both connections are gone once the handles are closed.
    net.stamp();
    net.a.tcp_close(a).unwrap();
    net.b.tcp_close(b).unwrap();
    net.run_until(Duration::from_secs(59), |_| false);
    assert_eq!(net.a.tcp_connections(), 1, "still in TIME_WAIT");
    net.run_until(Duration::from_secs(2), |_| false);
    assert_eq!((net.a.tcp_connections(), net.b.tcp_connections()), (0, 0));
}

#[test]
fn keepalive_detects_a_vanished_peer_and_spares_a_live_one() {
    let ka = Keepalive {
        idle: Duration::from_secs(10),
        interval: Duration::from_secs(1),
        probes: 3,
    };
    // Live peer: probes answered, the connection stays.
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let (a, _b) = pair(&mut net, 10);
    net.stamp();
    net.a.tcp_set_keepalive(a, Some(ka)).unwrap();
    net.run_until(Duration::from_secs(60), |_| false);
    assert!(net.a.counters().get(Counter::TcpExtTCPKeepAlive) >= 5);
    assert_eq!(net.a.tcp_error(a), None);
    // Vanished peer: timed out after idle + probes·interval.
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let (a, _b) = pair(&mut net, 10);
    net.stamp();
    net.a.tcp_set_keepalive(a, Some(ka)).unwrap();
    net.b_down = true;
    let start = net.now;
    assert!(net.run_until(Duration::from_secs(60), |n| n.a.tcp_error(a).is_some()));
    assert_eq!(net.a.tcp_error(a), Some(SocketError::TimedOut));
    let took = net.now.saturating_since(start);
    assert!(
        took >= Duration::from_secs(13) && took <= Duration::from_secs(15),
        "{took:?}"
    );
}

#[test]
fn sustained_zero_window_then_reopened_completes() {
    fn tune(c: &mut EngineConfig) {
        c.tcp.defaults.recv_buffer = 64 * 1024;
    }
    let mut net = Net::new(
        NetConfig {
            tune,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let (a, b) = pair(&mut net, 11);
    let total = 1_000_000usize;
    let data: Vec<u8> = (0..total).map(|i| (i * 13 % 251) as u8).collect();
    let mut sent = 0;
    // B does not read for 30 s: A fills B's window and must probe.
    net.run_until(Duration::from_secs(30), |n| {
        if sent < total {
            sent += n.a.tcp_send(a, &data[sent..]).unwrap_or(0);
        }
        false
    });
    assert!(net.a.counters().get(Counter::TcpExtTCPWinProbe) > 0);
    assert_eq!(net.a.tcp_error(a), None);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 8192];
    assert!(net.run_until(Duration::from_secs(60), |n| {
        if sent < total {
            sent += n.a.tcp_send(a, &data[sent..]).unwrap_or(0);
        }
        while let Ok(k) = n.b.tcp_recv(b, &mut buf) {
            if k == 0 {
                break;
            }
            got.extend_from_slice(&buf[..k]);
        }
        got.len() == total
    }));
    assert!(got == data, "byte-exact after the window reopened");
}

#[test]
fn request_response_is_not_held_by_delayed_ack_or_nagle() {
    // Default configuration (Nagle on, delayed ACK 40 ms): 50 exchanges of a two-segment
    // request and a three-segment response must take about a round trip each, not 40 ms.
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let (c, s) = pair(&mut net, 12);
    let start = net.now;
    let req = vec![1u8; 2000];
    let resp = vec![2u8; 3000];
    let mut buf = vec![0u8; 8192];
    for _ in 0..50 {
        net.a.tcp_send(c, &req).unwrap();
        let mut got = 0;
        let mut answered = false;
        let mut back = 0;
        assert!(net.run_until(Duration::from_secs(5), |n| {
            while let Ok(k) = n.b.tcp_recv(s, &mut buf) {
                got += k;
            }
            if got == req.len() && !answered {
                answered = n.b.tcp_send(s, &resp).is_ok();
            }
            while let Ok(k) = n.a.tcp_recv(c, &mut buf) {
                back += k;
            }
            back == resp.len()
        }));
    }
    let took = net.now.saturating_since(start);
    assert!(
        took < Duration::from_millis(40),
        "50 exchanges took {took:?} of virtual time"
    );
    assert_eq!(net.b.counters().get(Counter::TcpExtDelayedACKs), 0);
}

#[test]
fn newreno_transfers_byte_exact_under_loss() {
    fn tune(c: &mut EngineConfig) {
        c.tcp.defaults.cc = flowstack_stack::CcAlgorithm::NewReno;
        c.tcp.defaults.sack = false;
    }
    for seed in 0..40 {
        let cfg = NetConfig {
            impair: "loss=0.03,reorder=0.01,dup=0.01".parse().unwrap(),
            seed,
            tune,
            ..Default::default()
        };
        let mut net = Net::new(cfg, None).unwrap();
        let r = flowstack_stack::netsim::bulk_transfer(
            &mut net,
            256 * 1024,
            Duration::from_secs(600),
            |_| {},
            |_| {},
        )
        .unwrap();
        assert!(r.complete && r.mismatch_at.is_none(), "seed {seed}: {r:?}");
        assert!(r.client.fast_retransmits > 0 || r.client.timeouts > 0);
    }
}

#[test]
fn malformed_option_drops_the_segment_without_harming_the_connection() {
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let (c, s) = pair(&mut net, 13);
    let local = net.a.tcp_conn(c).unwrap().tuple();
    // A data segment for A's connection whose MSS option claims length 1.
    let t = TcpRepr {
        src_port: local.remote_port,
        dst_port: local.local_port,
        seq: SeqNum(1),
        ack: SeqNum(1),
        flags: Flags::ACK,
        window: 1000,
        urgent: 0,
        options: TcpOptions {
            mss: Some(1460),
            ..Default::default()
        },
        payload: b"evil",
    };
    let ip = Ipv4Repr::new(B_IP, A_IP, IpProtocol::Tcp, t.buffer_len());
    let mut f = vec![0u8; 14 + 20 + t.buffer_len()];
    EthernetRepr {
        src: EthernetAddress([2, 0, 0, 0, 0, 2]),
        dst: EthernetAddress([2, 0, 0, 0, 0, 1]),
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut f);
    ip.emit(&mut f[14..34], ChecksumCaps::SOFTWARE);
    t.emit(&mut f[34..], B_IP, A_IP, ChecksumCaps::SOFTWARE);
    f[34 + 21] = 1; // option length 1 (checksum recomputed below)
    f[34 + 16..34 + 18].copy_from_slice(&[0, 0]);
    let mut acc = flowstack_wire::checksum::Accumulator::new();
    acc.add_sum(flowstack_wire::checksum::pseudo_header(
        B_IP,
        A_IP,
        6,
        t.buffer_len() as u32,
    ));
    acc.add(&f[34..]);
    let sum = acc.finish();
    f[34 + 16..34 + 18].copy_from_slice(&sum.to_be_bytes());
    net.stamp();
    net.a.receive(net.now, &f);
    assert_eq!(net.a.counters().get(Counter::TcpExtTCPBadOptions), 1);
    assert_eq!(net.a.tcp_conn(c).unwrap().state(), State::Established);
    // The connection carries on.
    net.b.tcp_send(s, b"still fine").unwrap();
    let mut buf = [0u8; 32];
    let mut got = 0;
    assert!(net.run_until(Duration::from_secs(5), |n| {
        got = n.a.tcp_recv(c, &mut buf).unwrap_or(0);
        got > 0
    }));
    assert_eq!(&buf[..got], b"still fine");
}
