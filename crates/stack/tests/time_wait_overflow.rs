//! A full connection table gives up its oldest orphaned TIME-WAIT entry for a new connection,
//! as Linux does when its TIME-WAIT buckets overflow, instead of refusing new connections for
//! a whole 2·MSL (what stalled `ab` after about 16k short connections through one daemon).

use flowstack_stack::netsim::{Net, NetConfig, B_IP};
use flowstack_stack::{Counter, EngineConfig, SocketError, State};
use flowstack_wire::Duration;
use std::net::SocketAddrV4;

const LIMIT: usize = 8;

fn small_table(cfg: &mut EngineConfig) {
    cfg.tcp.max_connections = LIMIT;
}

/// Opens, uses and closes one connection, the client closing first (so the client's side
/// ends in TIME-WAIT). Errors with what `connect` said when the table refused it.
fn short_connection(
    net: &mut Net,
    listener: flowstack_stack::TcpHandle,
) -> Result<(), SocketError> {
    net.stamp();
    let c = net.a.tcp_connect(SocketAddrV4::new(B_IP.into(), 80))?;
    let mut s = None;
    assert!(
        net.run_until(Duration::from_secs(10), |n| {
            s = s.or_else(|| n.b.tcp_accept(listener).ok());
            s.is_some() && n.a.tcp_conn(c).is_ok_and(|k| k.is_open())
        }),
        "the connection never opened"
    );
    let s = s.unwrap();
    net.a.tcp_send(c, b"ping").unwrap();
    let mut buf = [0u8; 16];
    assert!(net.run_until(Duration::from_secs(5), |n| n
        .b
        .tcp_recv(s, &mut buf)
        .is_ok_and(|k| k == 4)));
    net.a.tcp_close(c).unwrap(); // the client closes first
    assert!(net.run_until(Duration::from_secs(5), |n| n.b.tcp_at_eof(s)));
    net.b.tcp_close(s).unwrap();
    assert!(net.run_until(Duration::from_secs(5), |n| n.b.tcp_connections() == 0));
    Ok(())
}

#[test]
fn a_full_table_ends_the_oldest_time_wait_instead_of_refusing() {
    let cfg = NetConfig {
        tune: small_table,
        ..NetConfig::default()
    };
    let mut net = Net::new(cfg, None).unwrap();
    let l = net.b.tcp_listen(80, 16).unwrap();
    // Five times the table, well within one 2·MSL: without eviction the ninth connect fails.
    for i in 0..5 * LIMIT {
        short_connection(&mut net, l).unwrap_or_else(|e| panic!("connection {i}: {e:?}"));
        assert!(net.a.tcp_connections() <= LIMIT);
    }
    let evicted = net.a.counters().get(Counter::TcpExtTCPTimeWaitOverflow);
    assert_eq!(
        evicted as usize,
        5 * LIMIT - LIMIT,
        "one eviction per connection past the limit"
    );
    assert_eq!(net.a.counters().get(Counter::TcpExtTCPConnLimit), 0);
    assert!(net.a.tcp_iter().all(|k| k.state() == State::TimeWait));
    // TIME-WAIT holds no buffers: nothing will be sent or arrive again (a full table of
    // them held ~9 KiB each for 2·MSL before). What is left is its share of the shared
    // configuration and the like. (A few milliseconds for the last one's next dispatch.)
    net.run_until(Duration::from_millis(10), |_| false);
    for k in net.a.tcp_iter() {
        assert!(
            k.heap_bytes() < 1024,
            "a TIME-WAIT connection holds {}",
            k.heap_bytes()
        );
    }
}

#[test]
fn live_connections_are_never_evicted() {
    let cfg = NetConfig {
        tune: small_table,
        ..NetConfig::default()
    };
    let mut net = Net::new(cfg, None).unwrap();
    net.b.tcp_listen(80, 16).unwrap();
    let mut held = Vec::new();
    for _ in 0..LIMIT {
        held.push(
            net.a
                .tcp_connect(SocketAddrV4::new(B_IP.into(), 80))
                .unwrap(),
        );
    }
    net.run_until(Duration::from_secs(1), |_| false);
    assert_eq!(
        net.a.tcp_connect(SocketAddrV4::new(B_IP.into(), 80)),
        Err(SocketError::LimitReached)
    );
    assert_eq!(net.a.counters().get(Counter::TcpExtTCPConnLimit), 1);
    assert_eq!(net.a.counters().get(Counter::TcpExtTCPTimeWaitOverflow), 0);
    for h in held {
        assert!(net.a.tcp_conn(h).is_ok_and(|k| k.is_open()));
    }
}

#[test]
fn connections_ended_early_leave_no_timer_entries_behind() {
    // Each connection evicted from TIME-WAIT had a 2·MSL deadline in the timer heap; a
    // heap that kept such entries until their minute passed grew by one per short
    // connection (millions under ab) and every push and pop walked all of it.
    let cfg = NetConfig {
        tune: small_table,
        ..NetConfig::default()
    };
    let mut net = Net::new(cfg, None).unwrap();
    let l = net.b.tcp_listen(80, 16).unwrap();
    let n = 60 * LIMIT;
    for i in 0..n {
        short_connection(&mut net, l).unwrap_or_else(|e| panic!("connection {i}: {e:?}"));
    }
    let evicted = net.a.counters().get(Counter::TcpExtTCPTimeWaitOverflow) as usize;
    assert_eq!(evicted, n - LIMIT);
    let (entries, conns) = (net.a.tcp_timer_entries(), net.a.tcp_connections());
    assert!(
        entries <= 2 * conns + 64,
        "{entries} timer entries for {conns} connections after {evicted} evictions"
    );
    // And the TIME-WAIT connections still there still end on time.
    net.run_until(Duration::from_secs(121), |n| n.a.tcp_connections() == 0);
    assert_eq!(net.a.tcp_connections(), 0);
}
