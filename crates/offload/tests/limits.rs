//! Per-application limits of flowstackd (`--max-app-memory`), through the client library:
//! an application whose sockets hold more than its share of buffer memory has its sends
//! stalled and its new sockets refused with `ENOBUFS`, and recovers when its queues drain.
//! Private socket path, bounded waits.

use flowstack_api::region::{SOCK_RCVBUF, SOCK_SNDBUF};
use flowstack_api::{SocketError, Sockets, TcpHandle};
use flowstack_client::Client;
use flowstack_offload::{stats, Daemon, DaemonConfig};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);
const LIMIT: u64 = 64 * 1024;
const TOTAL: usize = 4 << 20;

fn sock_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowstack-limits-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("d.sock")
}

fn lo(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 11)) as u8
}

fn counter(path: &Path, name: &str) -> u64 {
    stats::query(path).unwrap().counters[name]
}

/// The memory the daemon counted for application `id`.
fn memory(path: &Path, id: u64) -> u64 {
    let st = stats::query(path).unwrap();
    st.apps
        .iter()
        .find(|r| r.id == id)
        .expect("registered")
        .memory
}

/// The engine's send buffer: a sender whose peer reads nothing holds this much once the
/// peer's window is closed.
const SNDBUF: u64 = 1 << 20;

/// Sends from `a` to a peer that reads nothing until the daemon counts `a` over its limit
/// (its engine send queue filled once the peer's window closed) and nothing moves any more.
/// Returns the bytes `a` got taken.
fn send_until_stuck(a: &mut Client, h: TcpHandle, data: &[u8], path: &Path) -> usize {
    let end = Instant::now() + T;
    let mut at = 0;
    while memory(path, a.app_id()) <= LIMIT {
        assert!(Instant::now() < end, "never limited after {at} bytes");
        assert!(at < data.len(), "all {at} bytes taken without a limit");
        match a.tcp_send(h, &data[at..]) {
            Ok(n) => at += n,
            Err(SocketError::WouldBlock) => {
                let _ = a.wait(Duration::from_millis(5));
            }
            Err(e) => panic!("send: {e:?}"),
        }
    }
    // Stuck for good: more tries take nothing (without the stall they would take the rest
    // of the engine's send buffer).
    for _ in 0..100 {
        match a.tcp_send(h, &data[at..]) {
            Ok(n) => at += n,
            Err(SocketError::WouldBlock) => {
                let _ = a.wait(Duration::from_millis(2));
            }
            Err(e) => panic!("send: {e:?}"),
        }
    }
    // Without the limit the queues hold the peer's receive credit (its window is that
    // credit: the engine's receive buffer stays empty), the engine's send buffer and the
    // sender's send credit.
    let unlimited = SOCK_RCVBUF + SNDBUF + SOCK_SNDBUF;
    assert!(
        (at as u64) < unlimited,
        "{at} bytes taken despite the limit"
    );
    at
}

/// Receives `TOTAL` bytes of the pattern on `s`, checking each.
fn recv_pattern(b: &mut Client, s: TcpHandle) {
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    while got < TOTAL {
        let n = b.recv(s, &mut buf, T).unwrap();
        assert!(n > 0, "early end at {got}");
        for (i, &x) in buf[..n].iter().enumerate() {
            assert_eq!(x, pattern(got + i), "byte {}", got + i);
        }
        got += n;
    }
}

#[test]
fn app_over_its_memory_limit_stalls_and_gets_enobufs_then_recovers() {
    let path = sock_path("mem");
    let _d = Daemon::spawn(&DaemonConfig {
        socket: path.clone(),
        max_app_memory: LIMIT,
        fuse_pipe: 0, // the daemon's queues are what is limited; a pipe would bypass them
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut b = Client::connect(&path).unwrap();
    let l = b.tcp_listen(7100, 8).unwrap();
    assert_eq!(b.tcp_accept(l), Err(SocketError::WouldBlock));
    let mut a = Client::connect(&path).unwrap();
    let h = a.connect_to(lo(7100), T).unwrap();
    let s = b.accept(l, T).unwrap();
    let data: Vec<u8> = (0..TOTAL).map(pattern).collect();

    // A and B both send and neither reads: each one's send queue fills past the limit once
    // the other's window is closed, and its sends stall: it got less taken than the queues
    // hold without the limit.
    let at_a = send_until_stuck(&mut a, h, &data, &path);
    let at_b = send_until_stuck(&mut b, s, &data, &path);
    // Both are over the limit now: new sockets are refused with ENOBUFS, as the counters say.
    assert!(counter(&path, "FlowstackdAppMemLimited") >= 2);
    let hit = counter(&path, "FlowstackdLimitsHit");
    assert_eq!(a.connect_to(lo(7100), T), Err(SocketError::LimitReached));
    assert_eq!(b.connect_to(lo(7100), T), Err(SocketError::LimitReached));
    assert_eq!(counter(&path, "FlowstackdLimitsHit"), hit + 2);

    // B reads: A's queue drains, its stalled sends go on, every byte arrives in order (B
    // stays limited by its own queue: reading is never stalled). Then A reads B's.
    let data = std::sync::Arc::new(data);
    let d = data.clone();
    let sender = std::thread::spawn(move || {
        a.send_all(h, &d[at_a..], T).unwrap();
        a
    });
    recv_pattern(&mut b, s);
    let mut a = sender.join().unwrap();
    let d = data.clone();
    let sender = std::thread::spawn(move || {
        b.send_all(s, &d[at_b..], T).unwrap();
        b
    });
    recv_pattern(&mut a, h);
    let _b = sender.join().unwrap();
    // Drained, A may open sockets again (once the daemon has counted the empty queues).
    let end = Instant::now() + T;
    let again = loop {
        match a.connect_to(lo(7100), T) {
            Err(SocketError::LimitReached) if Instant::now() < end => {
                let _ = a.wait(Duration::from_millis(5));
            }
            r => break r,
        }
    };
    assert!(again.is_ok(), "{again:?}");
    a.close(h, T).unwrap();
}

/// With the default limit, the same sender to a receiver that reads nothing gets more than
/// 2 MiB taken (the queues, not the limit, stop it) and is never limited.
#[test]
fn default_limit_does_not_stall_a_few_connections() {
    let path = sock_path("default");
    let _d = Daemon::spawn(&DaemonConfig {
        socket: path.clone(),
        fuse_pipe: 0, // the daemon's queues are what is measured
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut b = Client::connect(&path).unwrap();
    let l = b.tcp_listen(7101, 8).unwrap();
    assert_eq!(b.tcp_accept(l), Err(SocketError::WouldBlock));
    let mut a = Client::connect(&path).unwrap();
    let h = a.connect_to(lo(7101), T).unwrap();
    let _s = b.accept(l, T).unwrap();
    let data = vec![7u8; 2 << 20];
    a.send_all(h, &data, T).unwrap();
    a.send_all(h, &data[..4096], T).unwrap();
    assert_eq!(counter(&path, "FlowstackdAppMemLimited"), 0);
    let c = a.connect_to(lo(7101), T);
    assert!(c.is_ok(), "{c:?}");
}
