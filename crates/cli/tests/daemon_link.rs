//! `flowstack daemon` with a real link (AF_PACKET on one end of a veth pair), in a network
//! namespace this test creates and deletes (also on failure), with private addresses that
//! exist only there: applications using the client library reach a kernel server through
//! the daemon, and a kernel client reaches a listener an application opened through it.
//!
//! Needs root and `ip`; skipped with a message otherwise (failing under `CI`, as the interop
//! tests do). Every wait is bounded.

mod common;
use common::{have_root, run, Netns};
use flowstack_api::{SocketError, Sockets};
use flowstack_client::Client;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const FLOWSTACK: &str = env!("CARGO_BIN_EXE_flowstack");
const T: Duration = Duration::from_secs(20);
/// The kernel's address in the namespace, and the daemon's on the link.
const KERNEL: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
const DAEMON: &str = "10.79.0.2/24";
const DAEMON_IP: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);

/// The namespace, the daemon and the kernel programs in it; all removed on drop.
struct Ns {
    net: Netns,
    dir: PathBuf,
}

impl Ns {
    fn new() -> Self {
        let ns = Self::bare();
        // A veth pair: the kernel end has the address, the daemon's end none.
        ns.net.ip(&[
            "link", "add", "fsdk0", "type", "veth", "peer", "name", "fsdd0",
        ]);
        ns.net.ip(&["addr", "add", "10.79.0.1/24", "dev", "fsdk0"]);
        ns.net.ip(&["link", "set", "fsdk0", "up"]);
        ns.net.ip(&["link", "set", "fsdd0", "up"]);
        let _ = run(ns
            .cmd("sysctl")
            .args(["-q", "-w", "net.ipv6.conf.fsdd0.disable_ipv6=1"]));
        ns
    }

    /// A namespace with no link yet (the daemon makes its TAP).
    fn bare() -> Self {
        let net = Netns::new("fsd-");
        let dir = std::env::temp_dir().join(format!("fsd-dlinks-{}", net.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Ns { net, dir }
    }

    fn cmd(&self, prog: &str) -> Command {
        self.net.cmd(prog)
    }

    fn spawn(&mut self, c: Command, log: &str) -> usize {
        let log = self.dir.join(log);
        self.net.spawn(c, &log)
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Waits (bounded) for child `i` to exit; its exit code.
    fn wait(&mut self, i: usize) -> Option<i32> {
        let end = Instant::now() + T;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.net.children[i].try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Starts a daemon of `engines` engines on the veth end (with several, applications of
    /// this process are spread over them) and waits (bounded) for its socket.
    fn daemon(&mut self, engines: usize) -> PathBuf {
        self.daemon_on(engines, &["--packet", "fsdd0"])
    }

    /// [`Ns::daemon`] on the link flags `link`.
    fn daemon_on(&mut self, engines: usize, link: &[&str]) -> PathBuf {
        let sock = self.dir.join("d.sock");
        let mut c = self.cmd(FLOWSTACK);
        c.arg("daemon")
            .args(link)
            .args(["--ip", DAEMON, "--socket"])
            .arg(&sock)
            .args(["--engines", &engines.to_string(), "--spread"]);
        self.spawn(c, "daemon.log");
        let end = Instant::now() + T;
        while !sock.exists() {
            assert!(
                Instant::now() < end,
                "daemon did not start: {}",
                self.log("daemon.log")
            );
            if let Ok(Some(s)) = self.net.children[0].try_wait() {
                panic!("daemon exited ({s}): {}", self.log("daemon.log"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        sock
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        // The namespace and its processes go with `net`, right after.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn available() -> bool {
    if !have_root() {
        return false;
    }
    let ip = Command::new("ip").arg("-V").output().is_ok();
    let py = Command::new("python3").arg("-V").output().is_ok();
    if !(ip && py) {
        eprintln!("skipped: needs ip and python3");
    }
    ip && py
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(131) ^ (i >> 9)) as u8 ^ seed)
        .collect()
}

/// A kernel echo server in the namespace: one connection, echoed until its end.
const ECHO_PY: &str = r#"
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(20)
print("listening", flush=True)
c, _ = s.accept(); c.settimeout(20)
while True:
    b = c.recv(65536)
    if not b: break
    c.sendall(b)
c.close()
"#;

/// A kernel client in the namespace: sends argv[3] bytes of the pattern, half-closes, reads
/// back the echo to its end and exits 0 if it is byte-exact.
const CLIENT_PY: &str = r#"
import socket, sys
n = int(sys.argv[3])
data = bytes(((i * 131) ^ (i >> 9)) & 0xff ^ 7 for i in range(n))
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
c.sendall(data); c.shutdown(socket.SHUT_WR)
got = bytearray()
while True:
    b = c.recv(65536)
    if not b: break
    got += b
print("echoed", len(got), flush=True)
sys.exit(0 if bytes(got) == data else 1)
"#;

fn wait_for(path: &Path, what: &str, ns: &Ns, log: &str) {
    let end = Instant::now() + T;
    while !std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains(what)
    {
        assert!(Instant::now() < end, "no {what:?}: {}", ns.log(log));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// (a) Application `app` connects through the daemon to a kernel echo server on `port`
/// across the link; 1 MiB goes there and back byte-exact.
fn app_to_kernel(ns: &mut Ns, app: &mut Client, port: u16) {
    let log = format!("echo-{port}.log");
    let mut c = ns.cmd("python3");
    c.args(["-c", ECHO_PY, &KERNEL.to_string(), &port.to_string()]);
    let echo = ns.spawn(c, &log);
    wait_for(&ns.dir.join(&log), "listening", ns, &log);
    let h = app
        .connect_to(SocketAddrV4::new(KERNEL, port), T)
        .unwrap_or_else(|e| panic!("connect: {e:?}: {}", ns.log("daemon.log")));
    let data = pattern(1 << 20, port as u8);
    let mut back = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; 64 * 1024];
    for chunk in data.chunks(64 * 1024) {
        app.send_all(h, chunk, T).unwrap();
        let want = back.len() + chunk.len();
        while back.len() < want {
            let n = app.recv(h, &mut buf, T).unwrap();
            assert!(n > 0, "early end after {} bytes", back.len());
            back.extend_from_slice(&buf[..n]);
        }
    }
    assert!(back == data, "echo differs from what was sent");
    app.close(h, T).unwrap();
    assert_eq!(ns.wait(echo), Some(0), "{}", ns.log(&log));
}

/// (b) Kernel clients connect (twice) to a listener `app` opened on 0.0.0.0:`port` through
/// the daemon; 256 KiB echoed byte-exact each time.
fn kernel_to_app(ns: &mut Ns, app: &mut Client, port: u16) {
    let l = app.tcp_listen(port, 8).unwrap();
    assert_eq!(app.tcp_accept(l), Err(SocketError::WouldBlock));
    let mut buf = vec![0u8; 64 * 1024];
    for round in 0..2 {
        let mut c = ns.cmd("python3");
        let n = 256 * 1024;
        c.args([
            "-c",
            CLIENT_PY,
            &DAEMON_IP.to_string(),
            &port.to_string(),
            &n.to_string(),
        ]);
        let log = format!("client-{port}-{round}.log");
        let k = ns.spawn(c, &log);
        let s = app
            .accept(l, T)
            .unwrap_or_else(|e| panic!("accept: {e:?}: {}", ns.log("daemon.log")));
        let mut total = 0;
        loop {
            let n = app.recv(s, &mut buf, T).unwrap();
            if n == 0 {
                break;
            }
            total += n;
            let part = buf[..n].to_vec();
            app.send_all(s, &part, T).unwrap();
        }
        assert_eq!(total, n);
        app.close(s, T).unwrap();
        assert_eq!(ns.wait(k), Some(0), "{}", ns.log(&log));
        assert!(ns.log(&log).contains(&format!("echoed {n}")));
    }
    app.close(l, T).unwrap();
}

/// Every application of a daemon of `engines` engines on one end of a veth (AF_PACKET) does
/// (a) and (b).
fn both_directions(engines: usize) {
    if !available() {
        return;
    }
    let mut ns = Ns::new();
    let path = ns.daemon(engines);
    apps_both_ways(ns, path, engines);
}

/// The same on a TAP the daemon makes (multi-queue with several engines), the kernel's
/// address on the TAP.
fn both_directions_tap(engines: usize) {
    if !available() {
        return;
    }
    let mut ns = Ns::bare();
    let path = ns.daemon_on(engines, &["--tap", "fsdt0"]);
    ns.net.ip(&["addr", "add", "10.79.0.1/24", "dev", "fsdt0"]);
    ns.net.ip(&["link", "set", "fsdt0", "up"]);
    apps_both_ways(ns, path, engines);
}

/// (a) and (b) for each of `engines` applications (one per engine), then the steering
/// counters, then (c) between every pair of them.
fn apps_both_ways(mut ns: Ns, path: PathBuf, engines: usize) {
    let mut apps: Vec<Client> = (0..engines)
        .map(|_| Client::connect(&path).unwrap())
        .collect();
    // One application per engine (`--spread`).
    let st = flowstack_offload::stats::query(&path).unwrap();
    let mut on: Vec<usize> = st.apps.iter().map(|a| a.engine).collect();
    on.sort_unstable();
    assert_eq!(on, (0..engines).collect::<Vec<_>>());
    for (i, app) in apps.iter_mut().enumerate() {
        let port = 7000 + 10 * i as u16;
        app_to_kernel(&mut ns, app, port);
        kernel_to_app(&mut ns, app, port + 1);
    }
    let mesh_before =
        flowstack_offload::stats::query(&path).unwrap().counters["FlowstackdMeshFrames"];
    own_address(&mut apps, 7100);
    let st = flowstack_offload::stats::query(&path).unwrap();
    assert_eq!(st.counters["FlowstackdMeshDrops"], 0);
    // With two engines, the connections between applications on different engines crossed
    // the mesh of the own-address engines (nothing else here uses a mesh between engines).
    let crossed = st.counters["FlowstackdMeshFrames"] - mesh_before;
    assert_eq!(crossed > 0, engines > 1, "{:?}", st.counters);
    // With two engines at least the kernel's ARP reply crossed (each engine asked, a reply
    // arrives on one queue and is copied to the other); with one, nothing is steered.
    let st = flowstack_offload::stats::query(&path).unwrap();
    let steered = st.counters["FlowstackdLinkSteered"];
    if engines > 1 {
        assert!(steered > 0, "{:?}", st.counters);
    } else {
        assert_eq!(steered, 0);
    }
    assert_eq!(st.counters["FlowstackdLinkSteerDrops"], 0);
}

/// (c) Every application connects to every application's listener (its own included) on
/// the link's own address: carried locally, as the kernel carries a local address over `lo`,
/// also between applications on different engines; 64 KiB echoed byte-exact each time.
fn own_address(apps: &mut [Client], base: u16) {
    let n = apps.len();
    let data = pattern(64 * 1024, 0x5a);
    let mut buf = vec![0u8; 64 * 1024];
    let mut port = base;
    for server in 0..n {
        for client in 0..n {
            port += 1;
            let l = apps[server].tcp_listen(port, 8).unwrap();
            // A sync call after the async listen: the listener is in place when it returns.
            assert_eq!(apps[server].tcp_accept(l), Err(SocketError::WouldBlock));
            let h = apps[client]
                .connect_to(SocketAddrV4::new(DAEMON_IP, port), T)
                .unwrap_or_else(|e| panic!("{client} -> {server}: connect: {e:?}"));
            apps[client].send_all(h, &data, T).unwrap();
            apps[client].tcp_shutdown(h).unwrap();
            let a = apps[server].accept(l, T).unwrap();
            let mut got = Vec::new();
            loop {
                let k = apps[server].recv(a, &mut buf, T).unwrap();
                if k == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..k]);
            }
            assert!(got == data, "{client} -> {server}: {} bytes", got.len());
            apps[server].send_all(a, &got, T).unwrap();
            apps[server].close(a, T).unwrap();
            let mut back = Vec::new();
            loop {
                let k = apps[client].recv(h, &mut buf, T).unwrap();
                if k == 0 {
                    break;
                }
                back.extend_from_slice(&buf[..k]);
            }
            assert!(back == data, "{server} -> {client}: {} bytes", back.len());
            apps[client].close(h, T).unwrap();
            apps[server].close(l, T).unwrap();
        }
    }
}

#[test]
fn daemon_link_carries_both_directions_with_the_kernel() {
    both_directions(1);
}

/// A TAP: one engine, then a two-queue TAP (`IFF_MULTI_QUEUE`) with one engine per queue;
/// the kernel picks a queue per flow and frames on the wrong one are steered by port.
#[test]
fn daemon_on_a_tap_carries_both_directions_one_and_two_queues() {
    both_directions_tap(1);
    both_directions_tap(2);
}

/// Two engines, one application each, each owning one queue of an AF_PACKET fanout group:
/// frames the kernel's hash puts on the other engine's queue are steered by port.
#[test]
fn daemon_link_with_two_engines_steers_by_port() {
    both_directions(2);
}

/// Misuse of the daemon's link flags is one line and exit 2 (no device is opened); a device
/// that cannot be opened is a runtime failure, exit 1. No interface is touched.
#[test]
fn daemon_link_misuse_is_one_line_and_exit_2() {
    let sock = std::env::temp_dir().join(format!("fsd-misuse-{}.sock", std::process::id()));
    let sock = sock.to_str().unwrap();
    let cases: [(&[&str], i32, &str); 5] = [
        (&["--tap", "fsdx0"], 2, "a link needs --ip"),
        (&["--ip", "10.79.9.2/24"], 2, "--ip needs a link"),
        (
            &["--shm-fd", "3", "--ip", "10.79.9.2/24", "--engines", "2"],
            2,
            "one queue",
        ),
        (
            &["--tap", "a", "--packet", "b", "--ip", "10.79.9.2/24"],
            2,
            "cannot be used with",
        ),
        (
            &["--packet", "fsd-no-such0", "--ip", "10.79.9.2/24"],
            1,
            "fsd-no-such0",
        ),
    ];
    for (args, code, says) in cases {
        let out = run(Command::new(FLOWSTACK)
            .args(["daemon", "--socket", sock])
            .args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(!Path::new(sock).exists(), "{args:?} bound the socket");
    }
}

/// CPU ticks (user + system) and voluntary context switches of every thread of `pid`.
fn usage(pid: u32) -> (u64, u64) {
    let (mut ticks, mut switches) = (0, 0);
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let stat = std::fs::read_to_string(t.join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
        let rest: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, r)| r)
            .split_whitespace()
            .collect();
        ticks += rest
            .get(11)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            + rest
                .get(12)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
        switches += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    (ticks, switches)
}

/// An idle daemon with a link sleeps until a frame, an application or another engine wakes
/// it (issue 15: 0 % CPU when idle): over one second with an application registered on each
/// engine and nothing to do, its threads use at most a few ticks and wake a few times (the
/// 200 ms housekeeping check), where looking at the link every millisecond wakes each engine
/// about a thousand times and a TAP said "maybe frames" on every turn and never slept.
/// AF_PACKET with two engines (the steering doorbell) and a TAP with one.
#[test]
fn an_idle_daemon_with_a_link_sleeps() {
    if !available() {
        return;
    }
    for (engines, link) in [
        (2, &["--packet", "fsdd0"][..]),
        (1, &["--tap", "fsdt0"][..]),
    ] {
        let mut ns = Ns::new();
        let path = ns.daemon_on(engines, link);
        if link[0] == "--tap" {
            ns.net.ip(&["link", "set", "fsdt0", "up"]);
        }
        let apps: Vec<Client> = (0..engines)
            .map(|_| Client::connect(&path).unwrap())
            .collect();
        let pid = ns.net.children[0].id();
        // Let registration and the link's first frames (ARP, IPv6 on the kernel's end)
        // settle, then measure a quiet second.
        std::thread::sleep(Duration::from_millis(500));
        let (t0, s0) = usage(pid);
        std::thread::sleep(Duration::from_secs(1));
        let (t1, s1) = usage(pid);
        let (ticks, switches) = (t1 - t0, s1 - s0);
        assert!(
            ticks <= 10 && switches <= 100,
            "{link:?}, {engines} engine(s): {ticks} ticks and {switches} wake-ups in an idle second: {}",
            ns.log("daemon.log")
        );
        drop(apps);
    }
}

/// One port namespace for every address (issue 15): through the POSIX layer the shim uses,
/// 127.0.0.1:P and the link's address:P are bound and listened on by two applications at
/// once, 0.0.0.0:P conflicts with both (`EADDRINUSE`); a kernel client on the link reaches
/// the link address's listener, a client of the daemon on 127.0.0.1 the loopback's.
#[test]
fn daemon_link_ports_are_per_address() {
    use flowstack_client::posix::{Errno, Posix, RecvFlags, SockId, Type};
    if !available() {
        return;
    }
    let mut ns = Ns::new();
    let path = ns.daemon(1);
    let port = 7300;
    let (lo_app, link_app) = (Posix::attach(&path).unwrap(), Posix::attach(&path).unwrap());
    let listen = |app: &Posix, ip: Ipv4Addr| -> Result<(std::os::fd::OwnedFd, SockId), Errno> {
        let (a, id) = app.socket(Type::Stream).unwrap();
        app.bind(id, SocketAddrV4::new(ip, port))?;
        app.listen(id, 8, None)?;
        Ok((a, id))
    };
    let (_la, l_lo) = listen(&lo_app, Ipv4Addr::LOCALHOST).unwrap();
    let (_lb, l_link) = listen(&link_app, DAEMON_IP).unwrap();
    let other = Posix::attach(&path).unwrap();
    assert_eq!(
        listen(&other, Ipv4Addr::UNSPECIFIED).err(),
        Some(Errno::EADDRINUSE)
    );
    assert_eq!(
        listen(&other, Ipv4Addr::new(127, 0, 0, 9)).err(),
        Some(Errno::EADDRINUSE),
        "127/8 is one address of the loopback"
    );
    let block = RecvFlags {
        peek: false,
        waitall: false,
        nonblock: false,
    };
    // Echoes one connection accepted on `l` to its end; returns the bytes and the peer.
    let echo = move |app: &Posix, l: SockId| -> (usize, SocketAddrV4) {
        let (a, s, peer, _) = app.accept(l, false, Some(T)).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0;
        loop {
            let n = app.recv(s, &mut buf, block, Some(T)).unwrap();
            if n == 0 {
                break;
            }
            total += n;
            let mut at = 0;
            while at < n {
                at += app.send(s, &buf[at..n], false, Some(T)).unwrap();
            }
        }
        app.forget(s).unwrap();
        drop(a);
        (total, peer)
    };
    // A kernel client on the link: to the link address's listener.
    let n = 64 * 1024;
    let mut c = ns.cmd("python3");
    c.args([
        "-c",
        CLIENT_PY,
        &DAEMON_IP.to_string(),
        &port.to_string(),
        &n.to_string(),
    ]);
    let k = ns.spawn(c, "client-addr.log");
    let (total, peer) = echo(&link_app, l_link);
    assert_eq!((total, *peer.ip()), (n, KERNEL));
    assert_eq!(ns.wait(k), Some(0), "{}", ns.log("client-addr.log"));
    let mut cli = Client::connect(&path).unwrap();
    // To 127.0.0.1: the loopback's listener. To the link's own address: carried locally, as
    // the kernel carries a local address over `lo` (the listener sees that address as the
    // peer too).
    for (ip, app, l, msg) in [
        (Ipv4Addr::LOCALHOST, lo_app, l_lo, &b"loopback"[..]),
        (DAEMON_IP, link_app, l_link, &b"own address"[..]),
    ] {
        let h = cli.connect_to(SocketAddrV4::new(ip, port), T).unwrap();
        let server = std::thread::spawn(move || echo(&app, l));
        cli.send_all(h, msg, T).unwrap();
        cli.tcp_shutdown(h).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            let n = cli.recv(h, &mut buf, T).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, msg);
        let (total, peer) = server.join().unwrap();
        assert_eq!((total, *peer.ip()), (msg.len(), ip));
        cli.close(h, T).unwrap();
    }
}
