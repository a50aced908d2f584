//! Unmodified programs under `flowstack run` (issue 16's acceptance): curl, python's
//! http.server, nginx, redis, iperf3, ab, wrk — each test is skipped with a printed reason only
//! when its program is not installed (CI installs them).
//!
//! Every test has its own daemon socket in its own temporary directory, so tests run in
//! parallel; servers listen on free ports of 127.0.0.x; every wait is bounded and every child
//! is killed when its guard drops. Data is compared byte for byte.
//!
//! Proof of path: the shim writes one line per socket decision to `FLOWSTACK_REPORT`; the
//! tests assert that the sockets of interest went through flowstack, and `ss -tn` shows no
//! kernel TCP socket on the flowstack port. While the shim is built without the daemon API
//! (it then says so on stderr: "has no daemon API") the path checks are reported as skipped
//! and the programs must still work on the kernel.

mod apps_common;

use apps_common::*;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// ---- flowstack run itself ------------------------------------------------------------------

#[test]
fn run_returns_the_commands_exit_status() {
    let w = World::new("status");
    let out = w.output(&["sh", "-c", "exit 7"], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(7));
    let out = w.output(&["sh", "-c", "kill -TERM $$"], Duration::from_secs(20));
    assert_eq!(out.status.code(), None, "killed by a signal, as sh was");
    let out = w.output(&["/no/such/program"], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(127));
}

#[test]
fn run_without_a_command_is_misuse() {
    let out = Command::new(flowstack_bin()).arg("run").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr)
            .trim_end()
            .lines()
            .count(),
        1
    );
}

#[test]
fn run_says_clearly_when_the_shim_is_missing() {
    let dir = std::env::temp_dir().join(format!("flowstack-apps-noso-{}", std::process::id()));
    let out = Command::new(flowstack_bin())
        .args(["run", "--socket"])
        .arg(dir.join("s"))
        .args(["--", "true"])
        .env("FLOWSTACK_PRELOAD", dir.join("nothing.so"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("FLOWSTACK_PRELOAD") && err.contains("not a file"),
        "{err}"
    );
}

#[test]
fn run_starts_a_daemon_when_none_answers_and_summarises_with_v() {
    let dir = std::env::temp_dir().join(format!("flowstack-apps-start-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The socket's directory does not exist yet, as /run/flowstack on a fresh machine.
    let sock = dir.join("new").join("fs.sock");
    let mut c = Command::new(flowstack_bin());
    c.args(["run", "-v", "--socket"])
        .arg(&sock)
        .args(["--", "sh", "-c", "exit 3"])
        .env("FLOWSTACK_PRELOAD", preload());
    let out = output_within(&mut c, Duration::from_secs(30), "flowstack run");
    let pid: Option<i32> = std::fs::read_to_string(dir.join("new").join("fs.sock.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let answered = std::os::unix::net::UnixStream::connect(&sock).is_ok();
    if let Some(pid) = pid {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(3));
    assert!(pid.is_some(), "the started daemon's pid file");
    assert!(answered, "a daemon answers on the socket after run");
}

// ---- curl and python -------------------------------------------------------------------------

#[test]
fn curl_downloads_byte_exact_from_python_http_server() {
    if !have("curl") || !have("python3") {
        return;
    }
    let w = World::new("python");
    let size = 100 << 20;
    let data = write_random(&w.dir.join("big.bin"), size);
    let ip = Ipv4Addr::new(127, 0, 0, 1);
    let port = free_port(ip);
    let ps = port.to_string();
    let _server = w.spawn(
        &["python3", "-m", "http.server", &ps, "--bind", "127.0.0.1"],
        "python",
    );
    wait_listening(ip, port);
    let url = format!("http://127.0.0.1:{port}/big.bin");
    let out = w.output(
        &["curl", "-sS", "--max-time", "60", "-o", "got.bin", &url],
        Duration::from_secs(90),
    );
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read(w.dir.join("got.bin")).unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "bytes differ");
    if !w.shim_without_daemon_api(&out.stderr) {
        w.assert_flowstack("curl", 1);
        w.assert_flowstack("python3", 2);
    }
}

#[test]
fn curl_reaches_a_kernel_server_the_daemon_does_not_carry() {
    if !have("curl") {
        return;
    }
    // A destination the daemon does not carry (a kernel listener, no flowstack listener on
    // the port): curl's socket moves to the kernel in place and the download works.
    let w = World::new("notcarried");
    let ip = Ipv4Addr::new(127, 0, 0, 1);
    let listener = TcpListener::bind(SocketAddrV4::new(ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = b"hello from a kernel server\n".repeat(1000);
    let served = body.clone();
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut req = [0u8; 4096];
        let _ = s.read(&mut req);
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            served.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&served).unwrap();
    });
    let url = format!("http://127.0.0.1:{port}/");
    let out = w.output(
        &["curl", "-sS", "--max-time", "20", &url],
        Duration::from_secs(40),
    );
    t.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == body, "body differs");
}

// ---- nginx -----------------------------------------------------------------------------------

fn nginx_conf(dir: &Path, ip: Ipv4Addr, port: u16) -> PathBuf {
    let conf = format!(
        "daemon off;\n{user}master_process on;\nworker_processes 2;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log;\nevents {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n\
           proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
           uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  sendfile on;\n\
           keepalive_requests 1000000;\n\
           server {{ listen {ip}:{port}; root {d}/www; }}\n}}\n",
        d = dir.display(),
        // As root, nginx's workers would run as nobody, who cannot reach a daemon socket in
        // root's temporary directory.
        user = if is_root() { "user root;\n" } else { "" }
    );
    std::fs::create_dir_all(dir.join("www")).unwrap();
    std::fs::write(dir.join("www/index.html"), "<h1>flowstack</h1>\n").unwrap();
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    path
}

#[test]
fn nginx_two_workers_serve_curl_ab_wrk_and_a_kernel_client() {
    if !have("nginx") || !have("curl") {
        return;
    }
    let w = World::new("nginx");
    let ip = Ipv4Addr::new(127, 0, 0, 1);
    let port = free_port(ip);
    let conf = nginx_conf(&w.dir, ip, port);
    let data = write_random(&w.dir.join("www/big.bin"), 100 << 20);
    let conf_s = conf.to_string_lossy().into_owned();
    let _nginx = w.spawn(&["nginx", "-c", &conf_s, "-e", "stderr"], "nginx");
    wait_listening(ip, port);
    let base = format!("http://127.0.0.1:{port}");
    // curl under flowstack: the big file, byte-exact.
    let out = w.output(
        &[
            "curl",
            "-sS",
            "--max-time",
            "60",
            "-o",
            "got.bin",
            &format!("{base}/big.bin"),
        ],
        Duration::from_secs(90),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(w.dir.join("got.bin")).unwrap() == data,
        "bytes differ"
    );
    let fallback = w.shim_without_daemon_api(&out.stderr);
    // A plain kernel client reaches the same server (the kernel listen path).
    let out = output_within(
        Command::new("curl").args(["-sS", "--max-time", "20", &format!("{base}/index.html")]),
        Duration::from_secs(30),
        "kernel curl",
    );
    assert!(out.status.success());
    assert_eq!(out.stdout, b"<h1>flowstack</h1>\n");
    if have("ab") {
        let out = w.output(
            &[
                "ab",
                "-q",
                "-n",
                "2000",
                "-c",
                "20",
                &format!("{base}/index.html"),
            ],
            Duration::from_secs(120),
        );
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "ab: {s}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(s.contains("Complete requests:      2000"), "{s}");
        assert!(s.contains("Failed requests:        0"), "{s}");
        assert!(!s.contains("Non-2xx"), "{s}");
    }
    if have("wrk") {
        let out = w.output(
            &[
                "wrk",
                "-t",
                "1",
                "-c",
                "10",
                "-d",
                "2s",
                &format!("{base}/index.html"),
            ],
            Duration::from_secs(60),
        );
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "wrk: {s}");
        assert!(
            !s.contains("Socket errors") && !s.contains("Non-2xx"),
            "{s}"
        );
        assert!(s.contains("requests in"), "{s}");
    }
    if !fallback {
        w.assert_flowstack("curl", 1);
        w.assert_flowstack("nginx", 1);
        w.assert_every_change_marked();
        assert!(
            kernel_sockets_on(port)
                .iter()
                .all(|l| l.contains("LISTEN") || l.starts_with("TIME-WAIT")),
            "kernel sockets carry flowstack traffic: {:?}",
            kernel_sockets_on(port)
        );
    }
}

// ---- redis -----------------------------------------------------------------------------------

#[test]
fn redis_benchmark_and_a_10_mb_value_byte_exact() {
    if !have("redis-server") || !have("redis-cli") || !have("redis-benchmark") {
        return;
    }
    let w = World::new("redis");
    let ip = Ipv4Addr::new(127, 0, 0, 1);
    let port = free_port(ip);
    let ps = port.to_string();
    let _redis = w.spawn(
        &[
            "redis-server",
            "--port",
            &ps,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            ".",
        ],
        "redis",
    );
    wait_listening(ip, port);
    let limit = Duration::from_secs(180);
    for extra in [&[][..], &["-P", "16"][..]] {
        let mut argv = vec![
            "redis-benchmark",
            "-q",
            "-p",
            &ps,
            "-n",
            "100000",
            "-c",
            "50",
            "-t",
            "set,get",
        ];
        argv.extend_from_slice(extra);
        let out = w.output(&argv, limit);
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "redis-benchmark {extra:?}: {s}");
        assert!(s.contains("SET:") && s.contains("GET:"), "{s}");
    }
    // A 10 MB value, set from a file and read back.
    let value = write_random(&w.dir.join("v.bin"), 10 << 20);
    let out = w.output(
        &["sh", "-c", &format!("redis-cli -p {ps} -x set big < v.bin")],
        limit,
    );
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    let out = w.output(
        &[
            "sh",
            "-c",
            &format!("redis-cli -p {ps} --no-raw strlen big; redis-cli -p {ps} get big > got.bin"),
        ],
        limit,
    );
    assert!(out.status.success());
    let got = std::fs::read(w.dir.join("got.bin")).unwrap();
    // redis-cli prints the value and a newline.
    assert_eq!(got.len(), value.len() + 1);
    assert!(got[..value.len()] == value[..], "value differs");
    if !w.shim_without_daemon_api(&out.stderr) {
        w.assert_flowstack("redis-cli", 1);
        w.assert_flowstack("redis-benchmark", 50);
        w.assert_flowstack("redis-server", 1);
        w.assert_every_change_marked();
    }
}

// ---- iperf3 ----------------------------------------------------------------------------------

#[test]
fn iperf3_forward_reverse_and_parallel() {
    if !have("iperf3") {
        return;
    }
    let w = World::new("iperf3");
    let ip = Ipv4Addr::new(127, 0, 0, 1);
    // The kernel listener the shim opens next to the flowstack one says the server is up
    // (a probe connection would take the only accept of `-s -1`).
    let listening = |port: u16| {
        Command::new("ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()
            .is_ok_and(|o| !o.stdout.is_empty())
    };
    let mut fallback = false;
    // One `-s -1` server per run: between tests `iperf3 -s` closes its listener and opens a
    // new one, and a client arriving then is refused now and then (see the branch report).
    for extra in [&[][..], &["-R"][..], &["-P", "4"][..]] {
        let port = free_port(ip);
        let ps = port.to_string();
        let _server = w.spawn(&["iperf3", "-s", "-1", "-p", &ps], "iperf3-s");
        wait_until(Duration::from_secs(20), "iperf3 -s to listen", || {
            listening(port)
        });
        let mut argv = vec!["iperf3", "-c", "127.0.0.1", "-p", &ps, "-t", "2", "-J"];
        argv.extend_from_slice(extra);
        let out = w.output(&argv, Duration::from_secs(60));
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "iperf3 {extra:?}: {s}");
        assert!(s.contains("\"sum_received\""), "{s}");
        // The data streams ran: the receiver counted bytes (it was 0 while they never started).
        let rx = &s[s.rfind("\"sum_received\"").unwrap()..];
        let bytes: f64 = rx
            .split("\"bytes\":")
            .nth(1)
            .and_then(|t| {
                t.split(|c: char| c == ',' || c.is_whitespace())
                    .find(|t| !t.is_empty())
            })
            .and_then(|t| t.parse().ok())
            .unwrap_or(0.0);
        assert!(bytes > 0.0, "iperf3 {extra:?}: no bytes received: {s}");
        assert!(!s.contains("\"error\""), "{s}");
        fallback |= w.shim_without_daemon_api(&out.stderr);
    }
    if !fallback {
        w.assert_flowstack("iperf3", 2);
        w.assert_every_change_marked();
    }
}

// ---- signals ---------------------------------------------------------------------------------

/// A C program (tests/progs/signals.c, built here with the system's C compiler): a blocking
/// recv restarts after a handler installed with SA_RESTART and fails with EINTR after one
/// without (per signal, as the kernel decides); sigaction and signal show the application's
/// own handlers; handlers that send on a flowstack socket, fired 2000 times while the main
/// thread sends and receives, lose no byte and deadlock nothing (they never run in the middle
/// of the shim's work). The shim before handler wrapping failed step 1 and hung in step 4.
#[test]
fn signal_handlers_restart_per_signal_and_never_run_inside_the_shim() {
    if !have("cc") {
        return;
    }
    let w = World::new("signals");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/signals.c");
    let exe = w.dir.join("signals");
    let st = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "cc {}", src.display());
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let out = w.output(&[exe.to_str().unwrap(), &port], Duration::from_secs(90));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && s.starts_with("ok "), "signals: {s}");
    if !w.shim_without_daemon_api(&out.stderr) {
        w.assert_flowstack("signals", 3);
    }
}

// ---- the daemon dies -------------------------------------------------------------------------

#[test]
fn killing_the_daemon_mid_transfer_errors_every_client_within_10_s() {
    if !have("curl") || !have("python3") {
        return;
    }
    let mut w = World::new("kill");
    write_random(&w.dir.join("big.bin"), 200 << 20);
    let ip = Ipv4Addr::new(127, 0, 0, 1);
    let port = free_port(ip);
    let ps = port.to_string();
    let _server = w.spawn(
        &["python3", "-m", "http.server", &ps, "--bind", "127.0.0.1"],
        "python",
    );
    wait_listening(ip, port);
    let url = format!("http://127.0.0.1:{port}/big.bin");
    // Slow clients (rate-limited) so the transfer is surely running when the daemon dies.
    let clients: Vec<Proc> = (0..3)
        .map(|_| {
            w.spawn(
                &["curl", "-sS", "--limit-rate", "1M", "-o", "/dev/null", &url],
                "curl",
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let err = std::fs::read_to_string(w.dir.join("curl.err")).unwrap_or_default();
    if err.contains("has no daemon API") {
        eprintln!("skipped: the shim has no daemon API yet (clients are on the kernel)");
        return;
    }
    w.kill_daemon();
    let start = Instant::now();
    for mut c in clients {
        let st = loop {
            if let Some(s) = c.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a client still runs 10 s after the daemon died"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            !st.success(),
            "a client finished a 200 MB transfer at 1 MB/s?"
        );
    }
}

/// An event loop (as nginx's workers) on a flowstack listener when the daemon is SIGKILLed:
/// its placeholder must not stay readable forever with every accept failing (the loop then
/// spins). The listener falls back to its kernel listener under the same number: the loop is
/// not woken for nothing, is woken when a kernel client connects, and the accept takes the
/// kernel path.
#[test]
fn an_epoll_loop_on_a_listener_does_not_spin_after_the_daemon_died() {
    loop_after_daemon_death(false, "epoll");
}

/// The same with the listener shared with another process (nginx's master holds it while
/// its workers wait): replacing the number in the waiting process does not end the epoll
/// registration of the placeholder, whose description the other process keeps alive.
#[test]
fn an_epoll_loop_on_a_shared_listener_does_not_spin_after_the_daemon_died() {
    loop_after_daemon_death(true, "epoll");
}

/// The same with `poll(2)` on a listener shared with another process: `poll` asks about
/// the number, not a registration, so once the first accept has put the kernel listener
/// under it the loop idles (the placeholder the other process keeps plays no part).
#[test]
fn a_poll_loop_on_a_shared_listener_does_not_spin_after_the_daemon_died() {
    loop_after_daemon_death(true, "poll");
}

/// A Python loop waiting on a listener with `how` (`epoll` or `poll`), the listener `shared`
/// with a forked process or not.
fn loop_after_daemon_death(shared: bool, how: &str) {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    if !have("python3") {
        return;
    }
    let mut w = World::new(&format!(
        "{how}-death{}",
        if shared { "-shared" } else { "" }
    ));
    let ip = Ipv4Addr::new(127, 0, 0, 1);
    let port = free_port(ip);
    let ps = port.to_string();
    // 50 waits of at most 20 ms: a spinning loop is woken 50 times, a quiet one not at all
    // (or once, for the wake-up that finds the daemon gone).
    let script = r#"
import os, select, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
s.setblocking(False)
if sys.argv[3] == "poll":
    p = select.poll()
    p.register(s.fileno(), select.POLLIN)
    wait = lambda t: p.poll(t * 1000)
else:
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLIN)
    wait = ep.poll
if sys.argv[2] == "shared" and os.fork() == 0:
    time.sleep(60)  # holds the listener, as nginx's master does
    os._exit(0)
print("ready", flush=True)
sys.stdin.readline()
wakeups, errors = 0, set()
for _ in range(50):
    if not wait(0.02):
        continue
    wakeups += 1
    try:
        s.accept()[0].close()
    except BlockingIOError:
        pass
    except OSError as e:
        errors.add(e.errno)
r = select.select([s], [], [], 0)[0]
print("wakeups", wakeups, "readable", bool(r), "errors", sorted(errors), flush=True)
sys.stdin.readline()
s.setblocking(True)
woken = bool(wait(10))
if select.select([s], [], [], 10)[0]:
    c = s.accept()[0]
    print("woken", woken, "accepted", c.recv(16).decode(), flush=True)
else:
    print("nothing to accept", flush=True)
"#;
    let mut child = Proc(
        w.run(&[
            "timeout",
            "60",
            "python3",
            "-c",
            script,
            &ps,
            if shared { "shared" } else { "alone" },
            how,
        ])
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(w.dir.join("python.err")).unwrap(),
        ))
        .spawn()
        .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut line = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
    assert_eq!(line(), "ready");
    let err = std::fs::read_to_string(w.dir.join("python.err")).unwrap_or_default();
    if err.contains("has no daemon API") {
        eprintln!("skipped: the shim has no daemon API yet (the listener is on the kernel)");
        return;
    }
    w.kill_daemon();
    stdin.write_all(b"go\n").unwrap();
    let quiet = line();
    let fields: Vec<&str> = quiet.split_whitespace().collect();
    assert!(fields.len() >= 4 && fields[0] == "wakeups", "{quiet:?}");
    let wakeups: u32 = fields[1].parse().unwrap();
    assert!(
        wakeups <= 2,
        "the loop was woken {wakeups} times in 50 waits: {quiet}"
    );
    assert_eq!(
        fields[3], "False",
        "the listener is still readable: {quiet}"
    );
    // The kernel path under the same number.
    let mut s = TcpStream::connect((ip, port)).unwrap();
    s.write_all(b"hello").unwrap();
    stdin.write_all(b"go\n").unwrap();
    assert_eq!(line(), "woken True accepted hello");
    drop(stdin);
    let _ = child.0.wait();
}
