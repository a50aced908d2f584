//! A client that reuses its port while the server still holds the old connection in TIME-WAIT
//! (what `ab -n 20000`, run twice in a row, does against a server that closes first).
//!
//! RFC 1122 §4.2.2.13: a host "MAY accept a new SYN from the remote TCP to reopen the
//! connection directly from TIME-WAIT state, if it: (1) assigns its initial sequence number
//! for the new connection to be larger than the largest sequence number it used on the
//! previous connection incarnation, and (2) returns to TIME-WAIT state if the SYN turns out to
//! be an old duplicate". RFC 6191 extends the test to timestamps. Linux accepts such a SYN
//! when its sequence number is above the old RCV.NXT or its timestamp is newer.

use flowstack_stack::netsim::{Net, NetConfig, B_IP};
use flowstack_stack::{Counter, State, TcpHandle};
use flowstack_wire::{Duration, Ipv4Address};
use std::net::SocketAddrV4;

fn addr(ip: Ipv4Address, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip.into(), port)
}

const CLIENT_PORT: u16 = 40000;

/// One request/response on a fresh connection from CLIENT_PORT, the server closing first,
/// so the server's side ends in TIME-WAIT. Returns how long the connect took (virtual time).
fn exchange(net: &mut Net, listener: TcpHandle, cfg: flowstack_stack::TcpConfig) -> Duration {
    net.stamp();
    let start = net.now;
    let c = net
        .a
        .tcp_connect_from(CLIENT_PORT, addr(B_IP, 80), cfg)
        .expect("connect");
    let mut s = None;
    assert!(
        net.run_until(Duration::from_secs(10), |n| {
            s = s.or_else(|| n.b.tcp_accept(listener).ok());
            s.is_some() && n.a.tcp_conn(c).is_ok_and(|k| k.is_open())
        }),
        "the connection never opened"
    );
    let took = net.now.saturating_since(start);
    let s = s.unwrap();
    net.a.tcp_send(c, b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    assert!(net.run_until(Duration::from_secs(5), |n| n
        .b
        .tcp_recv(s, &mut buf)
        .is_ok_and(|k| k > 0)));
    net.b.tcp_send(s, b"HTTP/1.0 200 OK\r\n\r\nhi").unwrap();
    net.b.tcp_close(s).unwrap(); // the server closes first
    assert!(net.run_until(Duration::from_secs(5), |n| {
        while n.a.tcp_recv(c, &mut buf).is_ok_and(|k| k > 0) {}
        n.a.tcp_at_eof(c)
    }));
    net.a.tcp_close(c).unwrap();
    assert!(net.run_until(Duration::from_secs(5), |n| n.a.tcp_connections() == 0));
    // The server side is in TIME-WAIT now.
    assert_eq!(net.b.tcp_connections(), 1, "the server holds TIME-WAIT");
    assert!(net.b.tcp_iter().any(|k| k.state() == State::TimeWait));
    took
}

fn reuse(timestamps: bool) {
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let l = net.b.tcp_listen(80, 16).unwrap();
    let cfg = flowstack_stack::TcpConfig {
        timestamps,
        ..Default::default()
    };
    let first = exchange(&mut net, l, cfg);
    // Let a little time pass (so the client's clock-driven ISN moves on), far less than 2·MSL.
    net.run_until(Duration::from_millis(50), |_| false);
    let syn_retrans = net.a.counters().get(Counter::TcpRetransSegs);
    let second = exchange(&mut net, l, cfg);
    assert_eq!(
        net.a.counters().get(Counter::TcpRetransSegs),
        syn_retrans,
        "the reusing SYN was retransmitted: the server dropped it"
    );
    assert!(
        second < Duration::from_millis(100),
        "connect took {second:?} (first took {first:?})"
    );
    // And a third time, for good measure (TIME-WAIT created by the reincarnated connection).
    net.run_until(Duration::from_millis(50), |_| false);
    assert!(exchange(&mut net, l, cfg) < Duration::from_millis(100));
    assert_eq!(net.b.counters().get(Counter::TcpExtTWReused), 2);
}

#[test]
fn an_old_duplicate_syn_does_not_reopen_time_wait() {
    // A SYN not above the old RCV.NXT, without a newer timestamp, is treated as an old
    // duplicate: TIME-WAIT answers it with an ACK (RFC 9293 §3.10.7.4), the client's SYN-SENT
    // resets on that ACK, and only its SYN retransmission a second later opens the connection.
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let l = net.b.tcp_listen(80, 16).unwrap();
    let cfg = flowstack_stack::TcpConfig {
        timestamps: false,
        ..Default::default()
    };
    exchange(&mut net, l, cfg);
    // Reconnect at once, before the client's clock-driven ISN has moved past the old
    // incarnation's sequence space (the request and FIN advanced RCV.NXT by 20).
    let c = net
        .a
        .tcp_connect_from(CLIENT_PORT, addr(B_IP, 80), cfg)
        .unwrap();
    let opened_at_once = net.run_until(Duration::from_millis(200), |n| {
        n.a.tcp_conn(c).is_ok_and(|k| k.is_open())
    });
    assert!(!opened_at_once, "an old-duplicate SYN reopened TIME-WAIT");
    assert_eq!(net.b.counters().get(Counter::TcpExtTWReused), 0);
}

#[test]
fn a_new_syn_reopens_a_time_wait_connection_with_timestamps() {
    reuse(true);
}

#[test]
fn a_new_syn_reopens_a_time_wait_connection_by_sequence_number_alone() {
    reuse(false);
}
