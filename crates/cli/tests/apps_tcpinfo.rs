//! Issue 16: `getsockopt(TCP_INFO)` under `flowstack run` reports the common fields of a
//! flowstack connection (state, RTT, MSS, congestion window, bytes acknowledged and
//! received), a truncated struct for a short optlen, and the state alone for a listener.
//!
//! One python3 process, two flowstack sockets connected over the daemon's 127.0.0.1, its
//! own daemon socket in its own temporary directory; every wait is bounded. Skipped with a
//! printed reason only when python3 is not installed.

mod apps_common;

use apps_common::*;
use std::net::Ipv4Addr;
use std::time::Duration;

/// Connects to itself on 127.0.0.1, sends 10000 bytes each way and one more byte from the
/// client (each side's data arrives with the acknowledgment of all the other side sent
/// before: deterministic counts, and an RTT measured on both), then prints TCP_INFO of the client, the accepted
/// socket and the listener as `name state rtt rttvar rto snd_mss snd_cwnd snd_ssthresh
/// unacked bytes_acked bytes_received`, and the length a short optlen got.
const INFO: &str = r#"
import socket, struct, sys
port = int(sys.argv[1])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(1)
c = socket.create_connection(("127.0.0.1", port), timeout=30)
s, _ = l.accept()
s.settimeout(30)
def recv_all(k, n):
    got = b""
    while len(got) < n:
        d = k.recv(n - len(got))
        assert d, "end of stream"
        got += d
    return got
c.sendall(b"a" * 10000)
assert recv_all(s, 10000) == b"a" * 10000
s.sendall(b"b" * 10000)
assert recv_all(c, 10000) == b"b" * 10000
c.sendall(b"c")
assert recv_all(s, 1) == b"c"
def show(name, k):
    b = k.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 136)
    assert len(b) == 136, len(b)
    state = b[0]
    rto, ato, snd_mss, rcv_mss, unacked = struct.unpack_from("IIIII", b, 8)
    rtt, rttvar, ssthresh, cwnd = struct.unpack_from("IIII", b, 68)
    acked, received = struct.unpack_from("QQ", b, 120)
    # The 104 bytes of glibc's struct tcp_info agree.
    assert k.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104) == b[:104]
    print(name, state, rtt, rttvar, rto, snd_mss, cwnd, ssthresh, unacked, acked, received)
show("client", c)
show("server", s)
show("listener", l)
print("short", len(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)), flush=True)
"#;

#[test]
fn tcp_info_reports_a_flowstack_connections_common_fields() {
    if !have("python3") {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    let w = World::new("tcpinfo");
    std::fs::write(w.dir.join("info.py"), INFO).unwrap();
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let out = w.output(&["python3", "info.py", &port], Duration::from_secs(60));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.assert_flowstack("python3", 2);
    let row = |name: &str| -> Vec<u64> {
        let line = said
            .lines()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in {said}"));
        line.split(' ')
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect()
    };
    for name in ["client", "server"] {
        let [state, rtt, _rttvar, rto, mss, cwnd, ssthresh, unacked, acked, received] =
            row(name)[..]
        else {
            panic!("{said}");
        };
        assert_eq!(state, 1, "{name}: ESTABLISHED");
        assert!(rtt > 0, "{name}: rtt measured");
        assert!(rto > 0, "{name}: rto");
        assert!(mss > 0 && cwnd > 0, "{name}: snd_mss, snd_cwnd: {said}");
        assert!(
            ssthresh > 0,
            "{name}: snd_ssthresh (infinite before a loss)"
        );
        assert!(unacked <= cwnd, "{name}: unacked in segments");
        // Each side's last data came with the acknowledgment of the other's 10000 bytes.
        let (want_received, at_least_acked) = match name {
            "client" => (10000, 10000),
            _ => (10001, 10000),
        };
        assert_eq!(received, want_received, "{name}: bytes_received");
        assert!(acked >= at_least_acked, "{name}: bytes_acked {acked}");
    }
    let listener = row("listener");
    assert_eq!(listener[0], 10, "LISTEN");
    assert!(listener[1..].iter().all(|&v| v == 0), "{listener:?}");
    assert!(said.contains("short 8\n"), "{said}");
}
