//! Interop with the Linux kernel's TCP/IP stack over TAP, AF_PACKET and AF_XDP (veth), each test in a
//! network namespace it creates and removes, with private addresses that exist only there.
//!
//! These tests need root (CI runs as root). Without root they are skipped with a message,
//! unless `CI` is set, in which case they fail.

mod common;
use common::{have_root, ok, run, Netns};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const FLOWSTACK: &str = env!("CARGO_BIN_EXE_flowstack");
const BIG: usize = 50 * 1024 * 1024;

/// The interop tests' namespace helpers (the type is shared: `common::Netns`).
impl Netns {
    /// A TAP `fst0` with the kernel at 10.77.0.1/24.
    fn with_tap(self) -> Self {
        self.ip(&["tuntap", "add", "dev", "fst0", "mode", "tap"]);
        self.ip(&["addr", "add", "10.77.0.1/24", "dev", "fst0"]);
        self.ip(&["link", "set", "fst0", "up"]);
        self
    }

    /// Stops child `i` with SIGINT and returns its exit code.
    fn interrupt(&mut self, i: usize) -> Option<i32> {
        let pid = self.children[i].id().to_string();
        // `ip netns exec` execs the program, so the pid is flowstack's own.
        let _ = run(Command::new("kill").args(["-INT", &pid]));
        let start = Instant::now();
        loop {
            if let Ok(Some(s)) = self.children[i].try_wait() {
                return s.code();
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = self.children[i].kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fs-interop-{}-{tag}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// A deterministic pseudo-random file of `len` bytes.
fn make_file(path: &Path, len: usize) {
    let mut f = std::io::BufWriter::new(fs::File::create(path).unwrap());
    let mut x: u64 = 0x243f_6a88_85a3_08d3;
    let mut chunk = vec![0u8; 1 << 16];
    let mut left = len;
    while left > 0 {
        for w in chunk.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
        }
        let n = left.min(chunk.len());
        f.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    fs::read(a).unwrap() == fs::read(b).unwrap_or_default()
}

/// Waits (bounded) until `log` contains `needle`.
fn wait_for(log: &Path, needle: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if fs::read_to_string(log).unwrap_or_default().contains(needle) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "'{needle}' never appeared in {}: {}",
        log.display(),
        fs::read_to_string(log).unwrap_or_default()
    );
}

/// Waits until a kernel TCP server answers at `url`.
fn wait_http(ns: &Netns, url: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if run(ns.cmd("curl").args(["-s", "-o", "/dev/null", url]))
            .status
            .success()
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no HTTP server at {url}");
}

fn serve(
    ns: &mut Netns,
    link: &[&str],
    ip: &str,
    root: &Path,
    extra: &[&str],
    log: &Path,
) -> usize {
    let mut c = ns.cmd(FLOWSTACK);
    c.arg("serve").args(link).args(["--ip", ip]).args(extra);
    c.args(["http", "--root"]).arg(root).args(["--port", "80"]);
    let i = ns.spawn(c, log);
    wait_for(log, "serving http");
    i
}

/// curl downloads `url` to `out`; it must succeed.
fn curl_get(ns: &Netns, url: &str, out: &Path) {
    ok(ns
        .cmd("curl")
        .args(["-s", "-S", "--max-time", "120", "-o"])
        .arg(out)
        .arg(url));
}

/// `flowstack ping` from 10.77.0.2 on `fst0` to the kernel's 10.77.0.1, `count` echoes; it
/// must succeed. Its output.
fn flowstack_pings_kernel(ns: &Netns, count: u32) -> String {
    let c = count.to_string();
    let out = ok(ns.cmd(FLOWSTACK).args([
        "ping",
        "--tap",
        "fst0",
        "--ip",
        "10.77.0.2/24",
        "10.77.0.1",
        "-c",
        &c,
        "-i",
        "0.1",
    ]));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn tap_ping_both_ways() {
    if !have_root() {
        return;
    }
    let mut ns = Netns::new("fst").with_tap();
    let d = tmpdir("ping");
    // flowstack pings the kernel.
    let s = flowstack_pings_kernel(&ns, 3);
    assert!(s.contains("3 packets transmitted, 3 received"), "{s}");
    // The kernel pings flowstack (running as a server).
    let srv = serve(
        &mut ns,
        &["--tap", "fst0"],
        "10.77.0.2/24",
        &d,
        &[],
        &d.join("serve.log"),
    );
    let out = run(ns
        .cmd("ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2", "10.77.0.2"]));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    assert!(s.contains("3 received"), "{s}");
    assert_eq!(
        ns.interrupt(srv),
        Some(0),
        "SIGINT ends serve with status 0"
    );
    let log = fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("IcmpOutEchoReps=3"), "{log}");
}

fn kernel_curl_from_flowstack(
    link_setup: fn() -> (Netns, Vec<&'static str>, &'static str, &'static str),
    impair: Option<&str>,
    tag: &str,
) {
    let (mut ns, link, ip, server) = link_setup();
    let d = tmpdir(tag);
    let www = d.join("www");
    fs::create_dir_all(&www).unwrap();
    make_file(&www.join("big.bin"), BIG);
    let mut extra = vec![];
    if let Some(i) = impair {
        extra = vec!["--impair", i, "--seed", "3"];
    }
    let pcap = d.join("s.pcap");
    let pcap_s = pcap.to_str().unwrap().to_string();
    extra.push("--pcap");
    extra.push(&pcap_s);
    let srv = serve(&mut ns, &link, ip, &www, &extra, &d.join("serve.log"));
    let got = d.join("got.bin");
    curl_get(&ns, &format!("http://{server}/big.bin"), &got);
    assert!(
        same_file(&www.join("big.bin"), &got),
        "downloaded file differs"
    );
    assert_eq!(ns.interrupt(srv), Some(0));
    let log = fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("requests 1"), "{log}");
    if impair.is_some() {
        assert!(
            !log.contains("retransmissions 0 "),
            "loss must cause retransmissions: {log}"
        );
    }
    // The capture opens with tcpdump and shows the handshake.
    let td = run(Command::new("tcpdump").arg("-nr").arg(&pcap));
    let s = String::from_utf8_lossy(&td.stdout);
    assert!(
        td.status.success(),
        "{}",
        String::from_utf8_lossy(&td.stderr)
    );
    assert!(
        s.contains("Flags [S]") && s.contains("Flags [S.]"),
        "handshake missing"
    );
    let _ = fs::remove_dir_all(&d);
}

fn tap_setup() -> (Netns, Vec<&'static str>, &'static str, &'static str) {
    (
        Netns::new("fst").with_tap(),
        vec!["--tap", "fst0"],
        "10.77.0.2/24",
        "10.77.0.2",
    )
}

/// Two namespaces would be needed to keep the kernel of the flowstack side out of the way;
/// one namespace with a veth pair works as well: the flowstack end has no kernel address.
fn veth_setup() -> (Netns, Vec<&'static str>, &'static str, &'static str) {
    let ns = Netns::new("fst");
    ns.ip(&[
        "link", "add", "fsk0", "type", "veth", "peer", "name", "fsf0",
    ]);
    ns.ip(&["addr", "add", "10.78.0.1/24", "dev", "fsk0"]);
    ns.ip(&["link", "set", "fsk0", "up"]);
    ns.ip(&["link", "set", "fsf0", "up"]);
    // Keep the kernel from answering on the flowstack end (it has no IPv4 address; no IPv6).
    let _ = run(ns
        .cmd("sysctl")
        .args(["-q", "-w", "net.ipv6.conf.fsf0.disable_ipv6=1"]));
    (ns, vec!["--packet", "fsf0"], "10.78.0.2/24", "10.78.0.2")
}

#[test]
fn tap_kernel_curl_downloads_50mb_from_flowstack() {
    if have_root() {
        kernel_curl_from_flowstack(tap_setup, None, "tap-curl");
    }
}

#[test]
fn tap_kernel_curl_downloads_50mb_under_impairment() {
    if have_root() {
        kernel_curl_from_flowstack(tap_setup, Some("loss=0.02,reorder=0.02"), "tap-curl-imp");
    }
}

#[test]
fn packet_kernel_curl_downloads_50mb_from_flowstack() {
    if have_root() {
        kernel_curl_from_flowstack(veth_setup, None, "pkt-curl");
    }
}

fn flowstack_get_from_kernel(
    link_setup: fn() -> (Netns, Vec<&'static str>, &'static str, &'static str),
    kernel_ip: &str,
    impair: Option<&str>,
    tag: &str,
) {
    let (mut ns, link, ip, _) = link_setup();
    let d = tmpdir(tag);
    let www = d.join("www");
    fs::create_dir_all(&www).unwrap();
    make_file(&www.join("big.bin"), BIG);
    let mut py = ns.cmd("python3");
    py.args(["-m", "http.server", "8000", "--bind", kernel_ip])
        .current_dir(&www);
    ns.spawn(py, &d.join("py.log"));
    let url = format!("http://{kernel_ip}:8000/big.bin");
    wait_http(&ns, &url);
    let got = d.join("got.bin");
    let mut c = ns.cmd(FLOWSTACK);
    c.arg("get").args(&link).args(["--ip", ip]);
    if let Some(i) = impair {
        c.args(["--impair", i]);
    }
    c.arg(&url).arg("-o").arg(&got);
    ok(&mut c);
    assert!(
        same_file(&www.join("big.bin"), &got),
        "downloaded file differs"
    );
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn tap_flowstack_get_downloads_50mb_from_kernel() {
    if have_root() {
        flowstack_get_from_kernel(tap_setup, "10.77.0.1", None, "tap-get");
    }
}

#[test]
fn tap_flowstack_get_downloads_50mb_under_impairment() {
    if have_root() {
        flowstack_get_from_kernel(
            tap_setup,
            "10.77.0.1",
            Some("loss=0.02,reorder=0.02"),
            "tap-get-imp",
        );
    }
}

#[test]
fn packet_flowstack_get_downloads_50mb_from_kernel() {
    if have_root() {
        flowstack_get_from_kernel(veth_setup, "10.78.0.1", None, "pkt-get");
    }
}

#[test]
fn packet_kernel_curl_downloads_50mb_under_impairment() {
    if have_root() {
        kernel_curl_from_flowstack(veth_setup, Some("loss=0.02,reorder=0.02"), "pkt-curl-imp");
    }
}

#[test]
fn packet_flowstack_get_downloads_50mb_under_impairment() {
    if have_root() {
        flowstack_get_from_kernel(
            veth_setup,
            "10.78.0.1",
            Some("loss=0.02,reorder=0.02"),
            "pkt-get-imp",
        );
    }
}

/// The veth pair of [`veth_setup`], flowstack on its end through AF_XDP.
fn xdp_setup() -> (Netns, Vec<&'static str>, &'static str, &'static str) {
    let (ns, _, ip, server) = veth_setup();
    (ns, vec!["--xdp", "fsf0"], ip, server)
}

#[test]
fn xdp_kernel_curl_downloads_50mb_from_flowstack() {
    if have_root() {
        kernel_curl_from_flowstack(xdp_setup, None, "xdp-curl");
    }
}

#[test]
fn xdp_kernel_curl_downloads_50mb_under_impairment() {
    if have_root() {
        kernel_curl_from_flowstack(xdp_setup, Some("loss=0.02,reorder=0.02"), "xdp-curl-imp");
    }
}

#[test]
fn xdp_flowstack_get_downloads_50mb_from_kernel() {
    if have_root() {
        flowstack_get_from_kernel(xdp_setup, "10.78.0.1", None, "xdp-get");
    }
}

#[test]
fn xdp_flowstack_get_downloads_50mb_under_impairment() {
    if have_root() {
        flowstack_get_from_kernel(
            xdp_setup,
            "10.78.0.1",
            Some("loss=0.02,reorder=0.02"),
            "xdp-get-imp",
        );
    }
}

/// Runs `flowstack serve echo` on the link, deletes interface `gone` under it, and checks
/// that serve notices, says so and exits with status 1 (bounded wait).
fn link_disappears(
    link_setup: fn() -> (Netns, Vec<&'static str>, &'static str, &'static str),
    gone: &str,
    tag: &str,
) {
    let (mut ns, link, ip, _) = link_setup();
    let d = tmpdir(tag);
    let log = d.join("serve.log");
    let mut c = ns.cmd(FLOWSTACK);
    c.arg("serve").args(&link).args(["--ip", ip, "echo"]);
    let i = ns.spawn(c, &log);
    wait_for(&log, "serving echo");
    ns.ip(&["link", "del", gone]);
    let start = Instant::now();
    let code = loop {
        if let Ok(Some(s)) = ns.children[i].try_wait() {
            break s.code();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "serve kept running after {gone} was deleted"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("the link went away"), "{text}");
    assert!(
        text.contains("serve summary"),
        "a clean exit prints its summary: {text}"
    );
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn tap_deleted_under_a_running_engine_stops_it_cleanly() {
    if have_root() {
        link_disappears(tap_setup, "fst0", "tap-gone");
    }
}

#[test]
fn packet_link_deleted_under_a_running_engine_stops_it_cleanly() {
    if have_root() {
        link_disappears(veth_setup, "fsk0", "pkt-gone");
    }
}

#[test]
fn xdp_link_deleted_under_a_running_engine_stops_it_cleanly() {
    if have_root() {
        link_disappears(xdp_setup, "fsk0", "xdp-gone");
    }
}

/// Starts `n` kernel curl clients at once, each fetching http://10.77.0.2/f.bin into `dir`,
/// and returns how many got a byte-exact copy of `expected`.
fn concurrent_downloads(ns: &Netns, dir: &Path, expected: &Path, n: usize) -> usize {
    let clients: Vec<(Child, PathBuf)> = (0..n)
        .map(|i| {
            let out = dir.join(format!("got{i}.bin"));
            let child = ns
                .cmd("curl")
                .args(["-s", "-S", "--max-time", "60", "-o"])
                .arg(&out)
                .arg("http://10.77.0.2/f.bin")
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (child, out)
        })
        .collect();
    let mut ok = 0;
    for (c, out) in clients {
        let o = c.wait_with_output().unwrap();
        if o.status.success() && same_file(expected, &out) {
            ok += 1;
        } else {
            eprintln!("client failed: {}", String::from_utf8_lossy(&o.stderr));
        }
    }
    ok
}

#[test]
fn tap_hundred_concurrent_kernel_clients_all_get_their_file() {
    if !have_root() {
        return;
    }
    let mut ns = Netns::new("fst").with_tap();
    let d = tmpdir("many");
    let www = d.join("www");
    fs::create_dir_all(&www).unwrap();
    make_file(&www.join("f.bin"), 256 * 1024);
    let srv = serve(
        &mut ns,
        &["--tap", "fst0"],
        "10.77.0.2/24",
        &www,
        &[],
        &d.join("serve.log"),
    );
    assert_eq!(concurrent_downloads(&ns, &d, &www.join("f.bin"), 100), 100);
    assert_eq!(ns.interrupt(srv), Some(0));
    let log = fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("connections 100"), "{log}");
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn tap_two_engines_on_a_multi_queue_tap_serve_every_kernel_client() {
    if !have_root() {
        return;
    }
    let mut ns = Netns::new("fst");
    ns.ip(&["tuntap", "add", "dev", "fst0", "mode", "tap", "multi_queue"]);
    ns.ip(&["addr", "add", "10.77.0.1/24", "dev", "fst0"]);
    ns.ip(&["link", "set", "fst0", "up"]);
    let d = tmpdir("cores");
    let www = d.join("www");
    fs::create_dir_all(&www).unwrap();
    make_file(&www.join("f.bin"), 128 * 1024);
    let srv = serve(
        &mut ns,
        &["--tap", "fst0"],
        "10.77.0.2/24",
        &www,
        &["--cores", "2"],
        &d.join("serve.log"),
    );
    assert_eq!(concurrent_downloads(&ns, &d, &www.join("f.bin"), 60), 60);
    assert_eq!(ns.interrupt(srv), Some(0));
    let log = fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains("2 engines"), "{log}");
    assert!(log.contains("all engines: connections 60 "), "{log}");
    // Each engine accepted its own share: the 4-tuple hash spreads 60 client ports over both.
    for e in ["engine 0 ", "engine 1 "] {
        let line = log.lines().find(|l| l.contains(e)).expect(e);
        let conns: u64 = line
            .split("connections ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(conns > 0, "{e} served nothing: {log}");
    }
    // The kernel's TAP steering follows its flow table: once the owning engine has sent on a
    // flow, the flow's packets come to that engine's queue. So only a connection's first
    // packets (the SYN, steered by the kernel's hash before any reply, and what crosses the
    // update) and ARP are forwarded between engines — about one frame per connection here, not
    // the half of its ~18 segments that a hash unrelated to ours would misplace.
    let per_engine: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("forwarded in"))
        .filter_map(|l| l.split("out ").last()?.trim().parse::<u64>().ok())
        .collect();
    assert_eq!(per_engine.len(), 2, "{log}");
    let forwarded: u64 = per_engine.iter().sum();
    assert!(
        forwarded <= 2 * 60 + 4,
        "{forwarded} frames forwarded: {log}"
    );
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn tap_closed_ports_are_refused_both_ways() {
    if !have_root() {
        return;
    }
    let mut ns = Netns::new("fst").with_tap();
    let d = tmpdir("closed");
    // flowstack get to a closed kernel port.
    let out = run(ns.cmd(FLOWSTACK).args([
        "get",
        "--tap",
        "fst0",
        "--ip",
        "10.77.0.2/24",
        "http://10.77.0.1:8999/",
    ]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("connection refused"));
    // Kernel client to a closed flowstack port: refused at once (curl exit 7), not a timeout.
    let srv = serve(
        &mut ns,
        &["--tap", "fst0"],
        "10.77.0.2/24",
        &d,
        &[],
        &d.join("serve.log"),
    );
    let start = Instant::now();
    let out = run(ns
        .cmd("curl")
        .args(["-s", "--max-time", "10", "http://10.77.0.2:81/"]));
    assert_eq!(out.status.code(), Some(7), "curl: connection refused");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(ns.interrupt(srv), Some(0));
}

#[test]
fn tap_made_with_multi_queue_is_attached() {
    if !have_root() {
        return;
    }
    let ns = Netns::new("fst");
    ns.ip(&["tuntap", "add", "dev", "fst0", "mode", "tap", "multi_queue"]);
    ns.ip(&["addr", "add", "10.77.0.1/24", "dev", "fst0"]);
    ns.ip(&["link", "set", "fst0", "up"]);
    let s = flowstack_pings_kernel(&ns, 2);
    assert!(s.contains("2 received"), "{s}");
}

#[test]
fn tap_flowstack_get_decodes_chunked_bodies() {
    if !have_root() {
        return;
    }
    let mut ns = Netns::new("fst").with_tap();
    let d = tmpdir("chunked");
    let script = d.join("chunked.py");
    fs::write(
        &script,
        r#"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(300):
            part = (("%05d," % i) * (i + 1)).encode()
            self.wfile.write(b"%x;ext=1\r\n" % len(part) + part + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("10.77.0.1", 8000), H).serve_forever()
"#,
    )
    .unwrap();
    let mut py = ns.cmd("python3");
    py.arg(&script);
    ns.spawn(py, &d.join("py.log"));
    wait_http(&ns, "http://10.77.0.1:8000/");
    let got = d.join("got.txt");
    ok(ns
        .cmd(FLOWSTACK)
        .args([
            "get",
            "--tap",
            "fst0",
            "--ip",
            "10.77.0.2/24",
            "http://10.77.0.1:8000/x",
            "-o",
        ])
        .arg(&got));
    let want: String = (0..300)
        .map(|i: usize| format!("{i:05},").repeat(i + 1))
        .collect();
    assert_eq!(fs::read_to_string(&got).unwrap(), want);
}

fn tap_novnet_setup() -> (Netns, Vec<&'static str>, &'static str, &'static str) {
    (
        Netns::new("fst").with_tap(),
        vec!["--tap", "fst0", "--no-vnet"],
        "10.77.0.2/24",
        "10.77.0.2",
    )
}

#[test]
fn tap_without_vnet_header_downloads_both_ways() {
    if have_root() {
        kernel_curl_from_flowstack(tap_novnet_setup, None, "tap-novnet-curl");
        flowstack_get_from_kernel(tap_novnet_setup, "10.77.0.1", None, "tap-novnet-get");
    }
}

#[test]
fn packet_fanout_spreads_flows_over_queues() {
    if !have_root() {
        return;
    }
    let (ns, _, _, _) = veth_setup();
    // The kernel sends to 10.78.0.2 without ARP (nobody answers on the raw side).
    ns.ip(&[
        "neigh",
        "add",
        "10.78.0.2",
        "lladdr",
        "02:66:73:00:00:02",
        "dev",
        "fsk0",
    ]);
    let mut checker = ns
        .cmd(FLOWSTACK)
        .args(["__fanout-check", "fsf0", "2", "1500"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(checker.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    // 64 flows (source ports), 10 datagrams each.
    let script = "import socket\nfor p in range(64):\n  s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n  s.bind(('10.78.0.1',20000+p))\n  [s.sendto(b'x'*100,('10.78.0.2',9)) for _ in range(10)]\n";
    let sent = run(ns.cmd("python3").args(["-c", script]));
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    checker.wait().unwrap();
    let counts: Vec<u64> = rest.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(counts.len(), 2, "{rest}");
    assert!(
        counts.iter().all(|&c| c > 0),
        "both queues get flows: {counts:?}"
    );
    assert!(
        counts.iter().sum::<u64>() >= 640,
        "every datagram seen once: {counts:?}"
    );
}

#[test]
fn tap_reattached_without_vnet_after_a_vnet_user() {
    if !have_root() {
        return;
    }
    let mut ns = Netns::new("fst").with_tap();
    let d = tmpdir("reattach");
    let www = d.join("www");
    fs::create_dir_all(&www).unwrap();
    make_file(&www.join("f.bin"), 4 << 20);
    // A vnet user turns the TAP's offloads on; a later plain user must still get whole,
    // checksummed frames.
    for (i, extra) in [&[][..], &["--no-vnet"][..]].iter().enumerate() {
        let mut link = vec!["--tap", "fst0"];
        link.extend_from_slice(extra);
        let srv = serve(
            &mut ns,
            &link,
            "10.77.0.2/24",
            &www,
            &[],
            &d.join(format!("s{i}.log")),
        );
        let got = d.join(format!("got{i}.bin"));
        curl_get(&ns, "http://10.77.0.2/f.bin", &got);
        assert!(same_file(&www.join("f.bin"), &got));
        assert_eq!(ns.interrupt(srv), Some(0));
    }
}

/// `flowstack profile` over a real link against the kernel: every layer of both paths is
/// measured, the JSON says which link, and the layer sums account for the end-to-end cost.
fn profile_over(
    setup: fn() -> (Netns, Vec<&'static str>, &'static str, &'static str),
    peer: &str,
    tag: &str,
) {
    let (ns, link, cidr, _) = setup();
    let d = tmpdir(tag);
    let json = d.join("p.json");
    let out = run(ns
        .cmd(FLOWSTACK)
        .args(["profile", "--sizes", "100,1440", "--samples", "300"])
        .args(&link)
        .args(["--ip", cidr, "--peer", peer, "--json"])
        .arg(&json));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("against the kernel at"), "{text}");
    let j = fs::read_to_string(&json).unwrap();
    assert!(j.contains(&format!("against the kernel at {peer}")), "{j}");
    for layer in common::PROFILE_LAYERS {
        let n = j.matches(&format!("\"layer\": \"{layer}\"")).count();
        assert!(n >= 2, "{layer} appears {n} times\n{text}");
    }
    // Most samples are usable: the kernel acknowledged and sent in time.
    for kept in j
        .match_indices("\"samples_kept\": ")
        .map(|(i, m)| &j[i + m.len()..])
    {
        let n: usize = kept
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(n >= 150, "only {n} of 300 samples kept\n{text}");
    }
    // The coverage is a measurement on a noisy VM; a broken bookkeeping (a layer counted twice
    // or lost) shows up far outside this band.
    for cov in j
        .match_indices("\"coverage_percent\": ")
        .map(|(i, m)| &j[i + m.len()..])
    {
        let v: f64 = cov
            .split([',', '\n'])
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!((60.0..140.0).contains(&v), "coverage {v}%\n{text}");
    }
}

#[test]
fn tap_profile_against_the_kernel_covers_every_layer() {
    if have_root() {
        profile_over(tap_setup, "10.77.0.1", "tap-profile");
    }
}

#[test]
fn packet_profile_against_the_kernel_covers_every_layer() {
    if have_root() {
        profile_over(veth_setup, "10.78.0.1", "packet-profile");
    }
}
