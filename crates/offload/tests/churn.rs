//! Many short connections through an in-process daemon (issue 15's heap growth under
//! `bench crr --peer offload`): the daemon's per-socket tables — sockets, handles,
//! placeholder identities, port entries — return to their idle size, through the native
//! client and through the POSIX layer the shim uses. What stays is TIME-WAIT, in the
//! engine, bounded by its connection limit (`churn_report` measures it; README).

mod common;

use common::{daemon, listen, lo, T};
use flowstack_client::posix::{Posix, RecvFlags, Type};
use flowstack_client::Client;
use flowstack_offload::stats;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// The daemon's table gauges (`FlowstackdTable…`).
fn tables(path: &Path) -> BTreeMap<String, u64> {
    let st = stats::query(path).unwrap();
    st.counters
        .into_iter()
        .filter(|(k, _)| k.starts_with("FlowstackdTable"))
        .collect()
}

/// Waits (bounded) until the tables are `want` (the closes are posted, not waited for),
/// then checks them.
fn settle(path: &Path, want: &[(&str, u64)]) {
    let want: BTreeMap<String, u64> = want.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let end = Instant::now() + T;
    let mut now = tables(path);
    while now != want && Instant::now() < end {
        std::thread::yield_now();
        now = tables(path);
    }
    assert_eq!(
        now, want,
        "the daemon's tables after the connections closed"
    );
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `n` connect-request-response-close rounds through the native client (as `bench crr`);
/// `report`: print RSS and the gauges every 50,000. Returns both applications, still
/// registered (an application leaving would release its sockets anyway).
fn crr(path: &Path, port: u16, n: usize, report: bool) -> (Client, Client) {
    let mut srv = Client::connect(path).unwrap();
    let mut cli = Client::connect(path).unwrap();
    let l = listen(&mut srv, port).unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..n {
            let c = srv.accept(l, T).unwrap();
            let mut got = 0;
            while got < 8 {
                got += srv.recv(c, &mut buf[got..8], T).unwrap();
            }
            srv.send_all(c, &buf[..8], T).unwrap();
            assert_eq!(srv.recv(c, &mut buf, T).unwrap(), 0);
            srv.close(c, T).unwrap();
        }
        srv.close(l, T).unwrap();
        srv
    });
    let mut back = [0u8; 8];
    for i in 0..n {
        let (c, _) = cli.connect_send(lo(port), b"12345678", T).unwrap();
        let mut got = 0;
        while got < 8 {
            got += cli.recv(c, &mut back[got..], T).unwrap();
        }
        assert_eq!(&back, b"12345678");
        cli.close(c, T).unwrap();
        if report && i % 50_000 == 0 {
            let st = stats::query(path).unwrap();
            let g = |k: &str| st.counters.get(k).copied().unwrap_or(0);
            eprintln!(
                "{i:>8} connections: VmRSS {} KiB, engine connections {}, accounted {} KiB, \
                 daemon sockets {}",
                rss_kib(),
                g("FlowstackdTcpConnections"),
                g("FlowstackdTcpAccountedBytes") / 1024,
                g("FlowstackdTableSockets"),
            );
        }
    }
    (server.join().unwrap(), cli)
}

const IDLE_APPS: [(&str, u64); 4] = [
    ("FlowstackdTableHandles", 0),
    ("FlowstackdTableIdents", 0),
    ("FlowstackdTablePorts", 0),
    ("FlowstackdTableSockets", 0),
];

#[test]
fn native_short_connections_leave_the_tables_idle() {
    let d = daemon("churn-native", 1, false);
    let apps = crr(&d.path, 7610, 2000, false);
    settle(&d.path, &IDLE_APPS);
    drop(apps);
    d.stop().unwrap();
}

/// The same through `Posix` (placeholders, identities, `bind`), with the server's socket
/// bound to a fixed port and listening, the client's sockets connecting from ephemeral ports.
#[test]
fn posix_short_connections_leave_the_tables_idle() {
    let d = daemon("churn-posix", 1, false);
    let srv = Posix::attach(&d.path).unwrap();
    let cli = Posix::attach(&d.path).unwrap();
    let (la, l) = srv.socket(Type::Stream).unwrap();
    srv.bind(l, lo(7611)).unwrap();
    srv.listen(l, 64, None).unwrap();
    let block = RecvFlags::BLOCK;
    for i in 0..300u32 {
        let (ca, c) = cli.socket(Type::Stream).unwrap();
        cli.connect(c, lo(7611), false, Some(T)).unwrap();
        let (sa, s, _, _) = srv.accept(l, false, Some(T)).unwrap();
        let m = i.to_be_bytes();
        assert_eq!(cli.send(c, &m, false, Some(T)).unwrap(), 4);
        let mut b = [0u8; 4];
        assert_eq!(srv.recv(s, &mut b, block, Some(T)).unwrap(), 4);
        assert_eq!(b, m);
        // The program's close: the shim forgets the socket, the kernel drops A.
        for (p, id, a) in [(&cli, c, ca), (&srv, s, sa)] {
            p.forget(id).unwrap();
            drop(a);
        }
    }
    // The listener stays: one socket, handle, identity and port.
    settle(
        &d.path,
        &[
            ("FlowstackdTableHandles", 1),
            ("FlowstackdTableIdents", 1),
            ("FlowstackdTablePorts", 1),
            ("FlowstackdTableSockets", 1),
        ],
    );
    srv.forget(l).unwrap();
    drop(la);
    settle(&d.path, &IDLE_APPS);
    d.stop().unwrap();
}

/// `CHURN_N=100000 cargo test --release -p flowstack-offload --test churn -- --ignored
/// --nocapture`: RSS and the engine's connections every 50,000 connections (README,
/// "Short connections and memory").
#[test]
#[ignore]
fn churn_report() {
    let n = std::env::var("CHURN_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let d = daemon("churn-report", 1, false);
    let apps = crr(&d.path, 7612, n, true);
    settle(&d.path, &IDLE_APPS);
    drop(apps);
    let st = stats::query(&d.path).unwrap();
    eprintln!(
        "end: VmRSS {} KiB, engine connections {}",
        rss_kib(),
        st.counters["FlowstackdTcpConnections"]
    );
    d.stop().unwrap();
}
