//! Connection footprint (issue 19): what an idle established connection costs in the
//! engine's own accounting (`Engine::tcp_accounted_bytes`: table slot, TCB, the heap it
//! holds, its share of the demux maps and timer structures), and that loss-recovery state is
//! returned when recovery ends. Size assertions only; `flowstack bench conns` measures RSS.

use flowstack_link::impair::ImpairSpec;
use flowstack_stack::netsim::{Net, NetConfig, B_IP};
use flowstack_stack::{Counter, Keepalive, SocketError, TcpHandle};
use flowstack_wire::Duration;
use std::net::SocketAddrV4;

/// The accounted bytes per idle established connection endpoint (issue 19's goal), measured
/// with 256 connections, where the table's shares (demux map, slot vector, the server's
/// accept queue) are at their largest.
const IDLE_BUDGET: usize = 512;

/// Connections opened at once: fewer SYNs than the simulated link queues, so none is lost
/// (as `bench conns` opens in batches). A connection whose SYN timed out also holds its
/// congestion-avoidance state (32 bytes) from then on.
const BATCH: usize = 32;

/// Opens `n` connections A → B and returns both sides' handles once all are established.
fn open(net: &mut Net, n: usize) -> (Vec<TcpHandle>, Vec<TcpHandle>) {
    let l = net.b.tcp_listen(80, n).unwrap();
    let mut client = Vec::new();
    let mut server = Vec::new();
    while client.len() < n {
        for _ in 0..BATCH.min(n - client.len()) {
            client.push(
                net.a
                    .tcp_connect(SocketAddrV4::new(B_IP.into(), 80))
                    .unwrap(),
            );
        }
        let want = client.len();
        assert!(
            net.run_until(Duration::from_secs(10), |k| {
                while let Ok(s) = k.b.tcp_accept(l) {
                    server.push(s);
                }
                server.len() == want
                    && client
                        .iter()
                        .all(|&c| k.a.tcp_conn(c).is_ok_and(|c| c.is_open()))
            }),
            "connections never opened"
        );
    }
    (client, server)
}

#[test]
fn an_idle_established_connection_fits_the_budget() {
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let (a0, b0) = (net.a.tcp_accounted_bytes(), net.b.tcp_accounted_bytes());
    let n = 256;
    let (client, server) = open(&mut net, n);
    // Opening allocates nothing that is given back later (what `bench conns` measures
    // right after opening): already now, no connection holds more than its share.
    let share = (std::mem::size_of::<flowstack_stack::TcpConfig>() + 16) / n + 1;
    for (side, e, hs) in [("client", &net.a, &client), ("server", &net.b, &server)] {
        for &h in hs.iter() {
            let heap = e.tcp_conn(h).unwrap().heap_bytes();
            assert!(heap <= share, "{side} heap {heap} right after opening");
        }
    }
    // Let every ACK land and the handshake timers lapse: idle.
    net.run_until(Duration::from_secs(3), |_| false);
    assert_eq!(net.a.tcp_connections(), n);
    assert_eq!(net.b.tcp_connections(), n);
    let per_a = (net.a.tcp_accounted_bytes() - a0) / n;
    let per_b = (net.b.tcp_accounted_bytes() - b0) / n;
    eprintln!("accounted bytes per idle connection: client {per_a}, server {per_b}");
    for (side, per) in [("client", per_a), ("server", per_b)] {
        assert!(
            per <= IDLE_BUDGET,
            "{side}: {per} accounted bytes per idle connection, budget {IDLE_BUDGET}"
        );
    }
    // An idle connection holds no buffers, lists or lazily allocated state: its heap is
    // only its share of the configuration all of them share (a few bytes among n + 1).
    for (side, e, hs) in [("client", &net.a, &client), ("server", &net.b, &server)] {
        for &h in hs.iter() {
            let k = e.tcp_conn(h).unwrap();
            assert!(k.heap_bytes() <= share, "{side} heap {}", k.heap_bytes());
        }
    }
}

#[test]
fn recovery_state_is_returned_when_recovery_ends() {
    let cfg = NetConfig {
        impair: "loss=0.03".parse::<ImpairSpec>().unwrap(),
        seed: 7,
        ..Default::default()
    };
    let mut net = Net::new(cfg, None).unwrap();
    let (client, server) = open(&mut net, 1);
    let (c, s) = (client[0], server[0]);
    let data = vec![0x5a_u8; 64 * 1024];
    let total = 2u64 << 20;
    let (mut sent, mut got) = (0u64, 0u64);
    let mut buf = vec![0u8; 64 * 1024];
    let (mut max_cold_a, mut max_cold_b) = (0, 0);
    assert!(
        net.run_until(Duration::from_secs(120), |k| {
            while sent < total {
                let len = (total - sent).min(data.len() as u64) as usize;
                match k.a.tcp_send(c, &data[..len]) {
                    Ok(n) => sent += n as u64,
                    Err(SocketError::WouldBlock) => break,
                    Err(e) => panic!("send: {e}"),
                }
            }
            while let Ok(n) = k.b.tcp_recv(s, &mut buf) {
                if n == 0 {
                    break;
                }
                got += n as u64;
            }
            max_cold_a = max_cold_a.max(k.a.tcp_conn(c).unwrap().recovery_heap_bytes());
            max_cold_b = max_cold_b.max(k.b.tcp_conn(s).unwrap().recovery_heap_bytes());
            got == total && k.a.tcp_conn(c).unwrap().send_queue() == 0
        }),
        "transfer did not finish: {got} of {total}"
    );
    let stats = net.a.tcp_conn(c).unwrap().stats();
    assert!(
        stats.retransmits > 0,
        "the loss must cause recovery: {stats:?}"
    );
    assert!(max_cold_a > 0, "the sender never used its SACK scoreboard");
    assert!(
        max_cold_b > 0,
        "the receiver never held out-of-order ranges"
    );
    // Idle again, connection still established: the recovery state is gone.
    net.run_until(Duration::from_secs(2), |_| false);
    assert!(net.a.tcp_conn(c).unwrap().is_open());
    assert_eq!(net.a.tcp_conn(c).unwrap().recovery_heap_bytes(), 0);
    assert_eq!(net.b.tcp_conn(s).unwrap().recovery_heap_bytes(), 0);
}

/// Sends `data` from `from` and reads it all at `to` (bounded by a simulated minute).
fn exchange(net: &mut Net, from_a: bool, h_from: TcpHandle, h_to: TcpHandle, data: &[u8]) {
    let (mut sent, mut got) = (0, Vec::new());
    let mut buf = vec![0u8; 16 * 1024];
    assert!(
        net.run_until(Duration::from_secs(60), |k| {
            let (tx, rx) = if from_a {
                (&mut k.a, &mut k.b)
            } else {
                (&mut k.b, &mut k.a)
            };
            if sent < data.len() {
                if let Ok(n) = tx.tcp_send(h_from, &data[sent..]) {
                    sent += n;
                }
            }
            while let Ok(n) = rx.tcp_recv(h_to, &mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            got.len() == data.len() && tx.tcp_conn(h_from).unwrap().send_queue() == 0
        }),
        "exchange did not finish: {} of {}",
        got.len(),
        data.len()
    );
    assert_eq!(got, data);
}

/// Buffers and the timers' busy part are allocated on use and returned once the
/// connection has been quiet for `REST_AFTER`; TCP_INFO and the data path are unchanged
/// by it (counters kept, data flows again after the release).
#[test]
fn a_quiet_connection_gives_its_buffers_back_and_works_after() {
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let (client, server) = open(&mut net, 1);
    let (c, s) = (client[0], server[0]);
    let up: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let down: Vec<u8> = (0..50_000u32).map(|i| (i * 13) as u8).collect();
    exchange(&mut net, true, c, s, &up);
    exchange(&mut net, false, s, c, &down);
    // Busy: the sender holds buffer memory shortly after the exchange (delayed ACKs
    // settled, well inside REST_AFTER).
    net.run_until(Duration::from_millis(300), |_| false);
    let busy = net.a.tcp_conn(c).unwrap().heap_bytes();
    assert!(
        busy >= 4096,
        "the sender's buffers were never allocated: {busy}"
    );
    let before = net.a.tcp_info(c).unwrap();
    // Quiet for longer than REST_AFTER: given back, with no call from the application.
    net.run_until(flowstack_tcp::REST_AFTER * 2, |_| false);
    for (side, e, h) in [("client", &net.a, c), ("server", &net.b, s)] {
        let k = e.tcp_conn(h).unwrap();
        assert!(k.is_open());
        // What may stay: RACK's records and the congestion-avoidance state (kept for the
        // connection's life); no buffer (each is at least 4 KiB), no recovery list.
        assert!(
            k.heap_bytes() < 1024,
            "{side} still holds {}",
            k.heap_bytes()
        );
        assert_eq!(k.recovery_heap_bytes(), 0);
    }
    let after = net.a.tcp_info(c).unwrap();
    assert_eq!(after.stats.bytes_acked, up.len() as u64);
    assert_eq!(after.stats.bytes_received, down.len() as u64);
    assert_eq!(after.stats.segs_out, before.stats.segs_out);
    assert_eq!(
        (after.send_queue, after.recv_queue, after.unacked),
        (0, 0, 0)
    );
    assert_eq!(after.srtt, before.srtt);
    assert_eq!(after.cwnd, before.cwnd);
    assert_eq!(after.snd_wnd, before.snd_wnd);
    // And the connection carries data again, both ways.
    exchange(&mut net, true, c, s, &down);
    exchange(&mut net, false, s, c, &up);
    let info = net.a.tcp_info(c).unwrap();
    assert_eq!(info.stats.bytes_acked, (up.len() + down.len()) as u64);
    assert_eq!(info.stats.bytes_received, (up.len() + down.len()) as u64);
}

/// Keepalive lives in the connection, not in the state given back at rest: it still fires
/// (and is answered) after that state was freed, and the connection is back at rest after.
#[test]
fn keepalive_fires_after_the_busy_state_was_freed() {
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let (client, server) = open(&mut net, 1);
    let (c, s) = (client[0], server[0]);
    exchange(&mut net, true, c, s, b"hello");
    let ka = Keepalive {
        idle: Duration::from_secs(10),
        interval: Duration::from_secs(1),
        probes: 3,
    };
    net.a.tcp_set_keepalive(c, Some(ka)).unwrap();
    net.run_until(Duration::from_secs(5), |_| false);
    let rested = net.a.tcp_conn(c).unwrap().heap_bytes();
    assert!(
        rested < 1024,
        "not at rest before the first probe: {rested}"
    );
    assert_eq!(net.a.counters().get(Counter::TcpExtTCPKeepAlive), 0);
    // Idle 10 s: a probe, answered; again 10 s later.
    net.run_until(Duration::from_secs(20), |_| false);
    let probes = net.a.counters().get(Counter::TcpExtTCPKeepAlive);
    assert!(probes >= 2, "keepalive probes sent: {probes}");
    assert!(net.a.tcp_conn(c).unwrap().is_open());
    assert_eq!(net.a.tcp_error(c), None);
    assert!(net.a.tcp_conn(c).unwrap().heap_bytes() <= rested);
    assert!(net.b.tcp_conn(s).unwrap().is_open());
}

/// Zero-copy sends whose completion tokens nobody takes (the daemon's `send_file` chunks,
/// an application that only cares that its buffers come back): the connection still gives
/// its buffers back at rest, and the tokens are still reported, in order, to a late taker.
#[test]
fn untaken_zero_copy_completions_hold_no_memory_at_rest() {
    let src = std::env::temp_dir().join(format!("fs-footprint-zc-{}", std::process::id()));
    let len = 2 * flowstack_stack::FILE_CHUNK + 1000;
    let bytes: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    let file = std::fs::File::open(&src).unwrap();
    std::fs::remove_file(&src).unwrap();
    let mut net = Net::new(NetConfig::default(), None).unwrap();
    let (client, server) = open(&mut net, 2);
    let zc: std::sync::Arc<[u8]> = bytes[..64 * 1024].into();
    let (mut filed, mut spans, mut got) = (0usize, 0usize, [0usize; 2]);
    let mut buf = vec![0u8; 64 * 1024];
    assert!(
        net.run_until(Duration::from_secs(60), |k| {
            // Connection 0 sends the file, connection 1 four zero-copy buffers; neither side
            // ever calls `tcp_zc_completion`.
            while filed < len {
                match k
                    .a
                    .send_file(client[0], &file, filed as u64, (len - filed) as u64)
                {
                    Ok(n) => filed += n,
                    Err(_) => break,
                }
            }
            while spans < 4 && k.a.tcp_send_zc(client[1], zc.clone()).is_ok() {
                spans += 1;
            }
            for (i, &s) in server.iter().enumerate() {
                while let Ok(n) = k.b.tcp_recv(s, &mut buf) {
                    got[i] += n;
                }
            }
            got == [len, 4 * zc.len()]
                && client
                    .iter()
                    .all(|&c| k.a.tcp_conn(c).unwrap().send_queue() == 0)
        }),
        "transfers did not finish: {got:?}"
    );
    let busy: Vec<usize> = client
        .iter()
        .map(|&c| net.a.tcp_conn(c).unwrap().heap_bytes())
        .collect();
    // Quiet for longer than REST_AFTER: given back, with no call from the application.
    net.run_until(flowstack_tcp::REST_AFTER * 2, |_| false);
    // Connection 0: two whole chunks went zero-copy (tokens 0 and 1), the tail was copied;
    // connection 1: four buffers.
    for (i, &c) in client.iter().enumerate() {
        let rest = net.a.tcp_conn(c).unwrap().heap_bytes();
        eprintln!(
            "connection {i}: heap {} B after the transfer, {rest} B at rest",
            busy[i]
        );
    }
    for (i, (&c, tokens)) in client.iter().zip([2u64, 4]).enumerate() {
        let k = net.a.tcp_conn(c).unwrap();
        assert!(k.is_open());
        assert!(
            k.heap_bytes() < 1024,
            "connection {i} still holds {} (held {} after the transfer)",
            k.heap_bytes(),
            busy[i]
        );
        // The completions were not lost (they cost nothing): a late taker gets each token,
        // in order, and then none is pending.
        assert_eq!(
            k.zc_completions_pending(),
            tokens as usize,
            "connection {i}"
        );
        let taken: Vec<u64> = std::iter::from_fn(|| net.a.tcp_zc_completion(c)).collect();
        assert_eq!(taken, (0..tokens).collect::<Vec<_>>(), "connection {i}");
        assert_eq!(net.a.tcp_conn(c).unwrap().zc_completions_pending(), 0);
    }
}
