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

/// The engine's receive buffer: a receiver that reads nothing holds this much once its
/// window is closed.
const RCVBUF: u64 = 1 << 20;

/// Sends from `a` until `b` (which reads nothing) has closed its window and the daemon
/// counts `a` over its limit: nothing moves any more, both stay over. Returns the bytes `a`
/// got taken.
fn send_until_stuck(a: &mut Client, b: &Client, h: TcpHandle, data: &[u8], path: &Path) -> usize {
    let end = Instant::now() + T;
    let mut at = 0;
    // (A window closed by window-scale units may leave a few bytes of the buffer unused:
    // 24 with 1 MiB of send credit.)
    while memory(path, b.app_id()) + 1024 < RCVBUF || memory(path, a.app_id()) <= LIMIT {
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
    at
}

#[test]
fn app_over_its_memory_limit_stalls_and_gets_enobufs_then_recovers() {
    let path = sock_path("mem");
    let _d = Daemon::spawn(&DaemonConfig {
        socket: path.clone(),
        max_app_memory: LIMIT,
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

    // B reads nothing: its receive queue and A's send queue fill past the limit. A's sends
    // stalled: it got less taken than the queues hold without the limit (B's area and
    // receive buffer, A's send buffer and credit, see the next test).
    let mut at = send_until_stuck(&mut a, &b, h, &data, &path);
    // Stuck for good: more tries take nothing (without the stall they would take another
    // 768 KiB as the engine's send buffer fills).
    for _ in 0..100 {
        match a.tcp_send(h, &data[at..]) {
            Ok(n) => at += n,
            Err(SocketError::WouldBlock) => {
                let _ = a.wait(Duration::from_millis(2));
            }
            Err(e) => panic!("send: {e:?}"),
        }
    }
    // Without the limit the queues hold B's receive credit and buffer, A's send buffer and
    // its send credit.
    let unlimited = SOCK_RCVBUF + 2 * RCVBUF + SOCK_SNDBUF;
    assert!(
        (at as u64) < unlimited,
        "{at} bytes taken despite the limit"
    );
    // Both are over the limit now (B's receive queue, A's send queue; neither drains while
    // B does not read): new sockets are refused with ENOBUFS, as the counters say.
    assert!(counter(&path, "FlowstackdAppMemLimited") >= 2);
    let hit = counter(&path, "FlowstackdLimitsHit");
    assert_eq!(a.connect_to(lo(7100), T), Err(SocketError::LimitReached));
    assert_eq!(b.connect_to(lo(7100), T), Err(SocketError::LimitReached));
    assert_eq!(counter(&path, "FlowstackdLimitsHit"), hit + 2);

    // B reads: the queues drain, A's stalled sends go on, every byte arrives in order.
    let sender = std::thread::spawn(move || {
        a.send_all(h, &data[at..], T).unwrap();
        (a, h)
    });
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
    let (mut a, h) = sender.join().unwrap();
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
