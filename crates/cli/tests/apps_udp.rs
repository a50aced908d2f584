//! UDP of unmodified programs under `flowstack run` (python3 on both ends): datagrams between
//! two processes through the daemon, byte for byte; a client of a kernel UDP server (the
//! socket moves to the kernel); the UDP port namespace across processes; MSG_TRUNC,
//! MSG_PEEK and FIONREAD; a full receive queue dropping and counting; a connected socket
//! filtering other sources. Each test has its own daemon; every wait is bounded. Skipped
//! with a printed reason when python3 is not installed.

mod apps_common;

use apps_common::*;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A UDP port free on the kernel now (the daemon's UDP ports are its own).
fn free_udp_port() -> u16 {
    UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn script(w: &World, name: &str, text: &str) -> String {
    let p = w.dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

/// Runs python3 `code` (a script file) under flowstack; asserts it succeeded; its stdout.
fn python(w: &World, file: &str, args: &[&str]) -> String {
    let mut argv = vec!["python3", file];
    argv.extend_from_slice(args);
    let out = w.output(&argv, LIMIT);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "python3 {file} failed:\n{so}\n{se}");
    so
}

fn skip() -> bool {
    if !have("python3") {
        eprintln!("skipped: python3 is not installed");
        return true;
    }
    false
}

const ECHO_SERVER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
print("bound", flush=True)
for i in range(int(sys.argv[2])):
    d, a = s.recvfrom(70000)
    s.sendto(d, a)
print("served", flush=True)
"#;

const ECHO_CLIENT: &str = r#"
import socket, sys, random
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(20)
rng = random.Random(16)
dst = ("127.0.0.1", int(sys.argv[1]))
for n in [0, 1, 100, 1472, 1473, 9000, 65507]:
    d = bytes(rng.getrandbits(8) for _ in range(n))
    assert s.sendto(d, dst) == n
    r, a = s.recvfrom(70000)
    assert r == d, (n, len(r))
    assert a == dst, a
try:
    s.sendto(b"x" * 65508, dst)
    raise SystemExit("65508 bytes sent")
except OSError as e:
    assert e.errno == 90, e  # EMSGSIZE
print("echoed", s.getsockname()[1], flush=True)
"#;

#[test]
fn udp_echo_between_two_processes_through_the_daemon() {
    if skip() {
        return;
    }
    let w = World::new("udp-echo");
    let port = free_udp_port();
    let ps = port.to_string();
    let srv = script(&w, "srv.py", ECHO_SERVER);
    let cli = script(&w, "cli.py", ECHO_CLIENT);
    let _server = w.spawn(&["python3", &srv, &ps, "7"], "server");
    let out = w.dir.join("server.out");
    wait_until(LIMIT, "the UDP server's bind", || {
        std::fs::read_to_string(&out).is_ok_and(|s| s.contains("bound"))
    });
    // The bound socket is the daemon's: `flowstack stats` lists it.
    let mut c = std::process::Command::new(flowstack_bin());
    c.args(["stats", "--json", "--socket"]).arg(&w.sock);
    let st = output_within(&mut c, LIMIT, "flowstack stats");
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    let local = format!("127.0.0.1:{port}");
    assert!(
        v["sockets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["proto"] == "udp" && r["local"] == local.as_str()),
        "no udp socket on {local} in {v}"
    );
    let said = python(&w, &cli, &[&ps]);
    assert!(said.contains("echoed"), "{said}");
    wait_until(LIMIT, "the server's end", || {
        std::fs::read_to_string(&out).is_ok_and(|s| s.contains("served"))
    });
    w.assert_flowstack("python3", 2);
    assert!(
        w.counter("UdpInDatagrams") >= 14,
        "both ways through the engine"
    );
    assert!(UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok());
}

#[test]
fn a_flowstack_client_reaches_a_kernel_udp_server() {
    if skip() {
        return;
    }
    let w = World::new("udp-kernel");
    // A kernel UDP echo server, not under flowstack (as a resolver on 127.0.0.53).
    let k = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    k.set_read_timeout(Some(LIMIT)).unwrap();
    let port = k.local_addr().unwrap().port();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for _ in 0..2 {
            let (n, a) = k.recv_from(&mut buf).unwrap();
            k.send_to(&buf[..n], a).unwrap();
        }
    });
    let cli = script(
        &w,
        "kcli.py",
        r#"
import socket, sys
dst = ("127.0.0.1", int(sys.argv[1]))
a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
a.settimeout(20)
a.sendto(b"to the kernel", dst)
assert a.recvfrom(100) == (b"to the kernel", dst)
b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
b.settimeout(20)
b.connect(dst)
b.send(b"connected")
assert b.recv(100) == b"connected"
print("ok", flush=True)
"#,
    );
    let said = python(&w, &cli, &[&port.to_string()]);
    assert!(said.contains("ok"), "{said}");
    echo.join().unwrap();
    let r = w.report();
    assert!(
        r.lines().filter(|l| l.ends_with("not-carried")).count() >= 2,
        "both sockets moved to the kernel, reported:\n{r}"
    );
    assert!(w.counter("FlowstackdFallbackNotCarried") >= 2);
}

#[test]
fn udp_ports_are_one_namespace_across_processes_apart_from_tcp() {
    if skip() {
        return;
    }
    let w = World::new("udp-inuse");
    let port = free_udp_port().to_string();
    let holder = script(
        &w,
        "hold.py",
        r#"
import socket, sys, time, os
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
print("bound", flush=True)
for _ in range(6000):
    if os.path.exists(sys.argv[2]):
        break
    time.sleep(0.01)
"#,
    );
    let second = script(
        &w,
        "second.py",
        r#"
import socket, sys
p = int(sys.argv[1])
for host in ["127.0.0.1", "0.0.0.0", "127.0.0.2"]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((host, p))
        raise SystemExit("bound twice on " + host)
    except OSError as e:
        assert e.errno == 98, e  # EADDRINUSE
    s.close()
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
t.bind(("127.0.0.1", p))  # TCP's port of the same number is another port
print("ok", flush=True)
"#,
    );
    let stop = w.dir.join("stop");
    let stop_s = stop.to_string_lossy().into_owned();
    let _h = w.spawn(&["python3", &holder, &port, &stop_s], "holder");
    let out = w.dir.join("holder.out");
    wait_until(LIMIT, "the first bind", || {
        std::fs::read_to_string(&out).is_ok_and(|s| s.contains("bound"))
    });
    let said = python(&w, &second, &[&port]);
    assert!(said.contains("ok"), "{said}");
    std::fs::write(&stop, b"").unwrap();
}

#[test]
fn msg_trunc_msg_peek_fionread_and_connected_filtering() {
    if skip() {
        return;
    }
    let w = World::new("udp-flags");
    let s = script(
        &w,
        "flags.py",
        r#"
import socket, fcntl, termios, struct, errno
def sock():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(20)
    return s
r, a, b = sock(), sock(), sock()
dst = r.getsockname()
d1 = bytes(range(100))
a.sendto(d1, dst)
# MSG_PEEK leaves it; FIONREAD is the next datagram's size.
assert r.recv(10, socket.MSG_PEEK) == d1[:10]
n = struct.unpack("i", fcntl.ioctl(r.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
assert n == 100, n
# A short buffer: MSG_TRUNC in msg_flags, the rest discarded.
data, anc, flags, src = r.recvmsg(10)
assert data == d1[:10] and flags & socket.MSG_TRUNC, (data, flags)
assert src == a.getsockname(), src
# MSG_TRUNC in flags: the real length.
a.sendto(d1, dst)
buf = bytearray(5)
assert r.recv_into(buf, 5, socket.MSG_TRUNC) == 100
assert bytes(buf) == d1[:5]
r.setblocking(False)
try:
    r.recv(100)
    raise SystemExit("the truncated datagram's rest was kept")
except BlockingIOError:
    pass
r.setblocking(True)
r.settimeout(20)
# Connected: only the peer's datagrams; sendto still reaches others.
r.connect(a.getsockname())
assert r.getpeername() == a.getsockname()
b.sendto(b"from b", dst)
a.sendto(b"from a", dst)
assert r.recv(100) == b"from a"
r.send(b"reply")
assert a.recvfrom(100) == (b"reply", dst)
r.sendto(b"to b", b.getsockname())
assert b.recv(100) == b"to b"
r.setblocking(False)
try:
    r.recv(100)
    raise SystemExit("a datagram from another source was delivered")
except BlockingIOError:
    pass
# AF_UNSPEC dissolves the association: others reach it again.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
unspec = struct.pack("HH12x", socket.AF_UNSPEC, 0)
assert libc.connect(r.fileno(), unspec, len(unspec)) == 0
r.setblocking(True)
r.settimeout(20)
b.sendto(b"again", dst)
assert r.recvfrom(100) == (b"again", b.getsockname())
# Unconnected without a destination.
try:
    b.send(b"x")
    raise SystemExit("send without a destination")
except OSError as e:
    assert e.errno == errno.EDESTADDRREQ, e
print("ok", flush=True)
"#,
    );
    let said = python(&w, &s, &[]);
    assert!(said.contains("ok"), "{said}");
    w.assert_flowstack("python3", 3);
    assert!(w.counter("FlowstackdUdpPeerFiltered") >= 1);
}

#[test]
fn a_full_receive_queue_drops_and_counts() {
    if skip() {
        return;
    }
    let w = World::new("udp-full");
    let go = w.dir.join("go");
    let s = script(
        &w,
        "full.py",
        r#"
import socket, sys, os, time
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
r.bind(("127.0.0.1", 0))
a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(1000):
    a.sendto(i.to_bytes(4, "big") * 250, r.getsockname())
print("sent", flush=True)
for _ in range(6000):
    if os.path.exists(sys.argv[1]) and open(sys.argv[1]).read():
        break
    time.sleep(0.01)
# As many as the engine queued (the rest was dropped): the ones beyond what was delivered
# to this process come as it reads.
want = int(open(sys.argv[1]).read())
r.settimeout(20)
got, last = 0, -1
while got < want:
    d = r.recv(2000)
    assert len(d) == 1000
    i = int.from_bytes(d[:4], "big")
    assert i > last, (i, last)  # in order, none twice
    last, got = i, got + 1
r.setblocking(False)
try:
    r.recv(2000)
    raise SystemExit("more than queued")
except BlockingIOError:
    pass
print("got", got, flush=True)
"#,
    );
    let go_s = go.to_string_lossy().into_owned();
    let _p = w.spawn(&["python3", &s, &go_s], "full");
    let out = w.dir.join("full.out");
    wait_until(LIMIT, "the sends", || {
        std::fs::read_to_string(&out).is_ok_and(|s| s.contains("sent"))
    });
    // Every datagram reached the socket's queue or was dropped there, counted.
    wait_until(LIMIT, "all 1000 datagrams accounted", || {
        w.counter("UdpInDatagrams") + w.counter("UdpRcvbufErrors") >= 1000
    });
    let dropped = w.counter("UdpRcvbufErrors");
    let queued = w.counter("UdpInDatagrams");
    std::fs::write(&go, queued.to_string()).unwrap();
    wait_until(LIMIT, "the reads", || {
        std::fs::read_to_string(&out).is_ok_and(|s| s.contains("got"))
    });
    let said = std::fs::read_to_string(&out).unwrap();
    let got: u64 = said
        .lines()
        .find_map(|l| l.strip_prefix("got "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(dropped > 0, "1 MB into a ~460 KiB queue dropped nothing");
    assert!(got > 0);
    assert_eq!(
        got + dropped,
        1000,
        "every datagram read or counted as dropped"
    );
    assert_eq!(w.counter("UdpInDatagrams"), got);
}
