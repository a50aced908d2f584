//! Issue 16's short paths under `flowstack run`: `sendfile(2)` of small files (read by the
//! shim and written, no round trip to the daemon) and of larger ones (the daemon reads them),
//! files that change between requests, descriptor numbers reused for another file, a full
//! send buffer on a non-blocking socket, and many short connections in a row (ab) leaving
//! no socket behind in the daemon.
//!
//! Each test has its own daemon socket in its own temporary directory; servers listen on
//! free ports of 127.0.0.1; every wait is bounded and every child is killed when its guard
//! drops. Skipped with a printed reason only when a program is not installed.

mod apps_common;

use apps_common::*;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Sends each file named on the command line whole with `os.sendfile` (explicit offsets),
/// opening it just before and closing it just after, so the descriptor number is reused;
/// prints the descriptor numbers.
const REUSE: &str = r#"
import os, socket, sys
port, ready, files = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(1)
open(ready, "w").close()
c, _ = l.accept()
fds = []
for path in files:
    fd = os.open(path, os.O_RDONLY)
    size, off = os.fstat(fd).st_size, 0
    while off < size:
        n = os.sendfile(c.fileno(), fd, off, size - off)
        assert n > 0, "sendfile returned 0 before the end"
        off += n
    fds.append(fd)
    os.close(fd)
print(" ".join(map(str, fds)), flush=True)
c.close()
"#;

/// A non-blocking socket whose peer does not read: file sends until EAGAIN, then plain
/// sends until EAGAIN, then a small-file send (must be EAGAIN too); prints what happened,
/// creates `full`, and sends the rest of the big file blocking.
const NONBLOCK: &str = r#"
import os, socket, sys, time
port, ready, full, big, small = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(1)
open(ready, "w").close()
c, _ = l.accept()
c.setblocking(False)
fd = os.open(big, os.O_RDONLY)
size, sent, eagain = os.fstat(fd).st_size, 0, "no-eagain"
end = time.time() + 30
while sent < size and time.time() < end:
    try:
        n = os.sendfile(c.fileno(), fd, sent, size - sent)
    except BlockingIOError:
        eagain = "EAGAIN"
        break
    sent += n
plain, blocked = 0, "no-eagain"
while time.time() < end:
    try:
        plain += c.send(b"x" * 65536)
    except BlockingIOError:
        blocked = "EAGAIN"
        break
sfd = os.open(small, os.O_RDONLY)
try:
    r = str(os.sendfile(c.fileno(), sfd, 0, 100))
except BlockingIOError:
    r = "EAGAIN"
print(sent, eagain, plain, blocked, r, flush=True)
open(full, "w").close()
c.setblocking(True)
while sent < size:
    sent += os.sendfile(c.fileno(), fd, sent, size - sent)
c.close()
"#;

/// A forking server: accepts, forks, the child answers on the accepted socket at once (it
/// adopts the placeholder the parent's accept posted), the parent closes its copy.
const FORKER: &str = r#"
import os, socket, sys
port, ready = int(sys.argv[1]), sys.argv[2]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(8)
open(ready, "w").close()
for i in range(3):
    c, _ = l.accept()
    pid = os.fork()
    if pid == 0:
        c.sendall(b"child %d\n" % i)
        c.close()
        os._exit(0)
    c.close()
    os.waitpid(pid, 0)
print("served", flush=True)
"#;

fn sha256_hex(data: &[u8], dir: &Path) -> String {
    let p = dir.join("expect.bin");
    std::fs::write(&p, data).unwrap();
    sha256_file(&p)
}

/// Starts `script` (python) under flowstack as the sender and waits until it listens.
fn start_sender(w: &World, script: &str, args: &[&str]) -> (Proc, String) {
    std::fs::write(w.dir.join("send.py"), script).unwrap();
    std::fs::write(w.dir.join("recv.py"), RECEIVER).unwrap();
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let ready = w.dir.join("ready").to_string_lossy().into_owned();
    let mut argv = vec!["python3", "send.py", &port, &ready];
    argv.extend_from_slice(args);
    let p = w.spawn(&argv, "sender");
    wait_until(Duration::from_secs(20), "the sender to listen", || {
        w.dir.join("ready").exists()
    });
    (p, port)
}

fn sender_said(w: &World) -> String {
    wait_until(Duration::from_secs(30), "the sender to finish", || {
        std::fs::read_to_string(w.dir.join("sender.out")).is_ok_and(|s| s.ends_with('\n'))
    });
    std::fs::read_to_string(w.dir.join("sender.out"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn a_reused_descriptor_number_sends_the_new_files_bytes_small_and_large() {
    if !have("python3") || !have("sha256sum") {
        return;
    }
    // Fusing off: after the connection's first send a fused connection's `sendfile` reads
    // the file in the shim (README), and this test counts which path read each file.
    let w = World::with_daemon_args("reuse", &["--fuse-pipe", "0"]);
    // Two files on each path (64 KiB is the shim's small-file limit), different lengths so
    // their contents differ too.
    let names = ["big1.bin", "big2.bin", "small1.bin", "small2.bin"];
    let sizes = [300_001, 200_003, 615, 40_000];
    let data: Vec<Vec<u8>> = names
        .iter()
        .zip(sizes)
        .map(|(n, s)| write_random(&w.dir.join(n), s))
        .collect();
    // The order sends each file after another one used the same descriptor number.
    let order = [0, 1, 2, 3, 0, 2, 1];
    let paths: Vec<String> = order
        .iter()
        .map(|&i| w.dir.join(names[i]).to_string_lossy().into_owned())
        .collect();
    let args: Vec<&str> = paths.iter().map(String::as_str).collect();
    let before = w.counter("FlowstackdSendFileBytes");
    let (_sender, port) = start_sender(&w, REUSE, &args);
    let out = w.output(
        &["python3", "recv.py", &port, "got.bin"],
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expect: Vec<u8> = order.iter().flat_map(|&i| data[i].clone()).collect();
    let got = std::fs::read(w.dir.join("got.bin")).unwrap();
    assert_eq!(got.len(), expect.len(), "bytes received");
    assert!(got == expect, "bytes differ");
    // The same descriptor number every time: the reuse really happened.
    let fds = sender_said(&w);
    let first = fds.split(' ').next().unwrap().to_string();
    assert!(fds.split(' ').all(|f| f == first), "fds: {fds}");
    // The large files were read by the daemon, the small ones by the shim.
    let daemon = (2 * sizes[0] + 2 * sizes[1]) as u64;
    assert_eq!(w.counter("FlowstackdSendFileBytes") - before, daemon);
}

#[test]
fn sendfile_on_a_full_non_blocking_socket_says_eagain_and_loses_nothing() {
    if !have("python3") || !have("sha256sum") {
        return;
    }
    let w = World::new("nonblock");
    let big = write_random(&w.dir.join("big.bin"), (32 << 20) + 5);
    write_random(&w.dir.join("small.bin"), 615);
    let full = w.dir.join("full").to_string_lossy().into_owned();
    let (bp, sp) = (
        w.dir.join("big.bin").to_string_lossy().into_owned(),
        w.dir.join("small.bin").to_string_lossy().into_owned(),
    );
    let (_sender, port) = start_sender(&w, NONBLOCK, &[&full, &bp, &sp]);
    let out = w.output(
        &["python3", "recv.py", &port, "got.bin", &full],
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = sender_said(&w);
    let f: Vec<&str> = said.split(' ').collect();
    assert_eq!(f.len(), 5, "{said}");
    let sent: usize = f[0].parse().unwrap();
    let plain: usize = f[2].parse().unwrap();
    // As Linux: a non-blocking sendfile queues what fits (a partial count) and then answers
    // EAGAIN; so do sends, and a small file's sendfile with no room.
    assert!(sent > 0 && sent < big.len(), "{said}");
    assert_eq!((f[1], f[3], f[4]), ("EAGAIN", "EAGAIN", "EAGAIN"), "{said}");
    // Nothing lost, nothing reordered: the file's first part, the plain sends, the rest.
    let mut expect = big[..sent].to_vec();
    expect.extend(std::iter::repeat_n(b'x', plain));
    expect.extend_from_slice(&big[sent..]);
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        line,
        format!("{} {}", expect.len(), sha256_hex(&expect, &w.dir))
    );
}

/// Fetches `url` with curl under flowstack into `name` and returns the bytes.
fn fetch(w: &World, url: &str, name: &str) -> Vec<u8> {
    let out = w.output(
        &["curl", "-sS", "--max-time", "30", "-o", name, url],
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(w.dir.join(name)).unwrap()
}

#[test]
fn nginx_serves_a_page_replaced_truncated_and_grown_between_requests() {
    if !have("nginx") || !have("curl") {
        return;
    }
    let w = World::new("pages");
    let port = free_port(Ipv4Addr::LOCALHOST);
    let conf = nginx_sendfile_conf(&w.dir, port)
        .to_string_lossy()
        .into_owned();
    let page = w.dir.join("www/page.html");
    write_random(&page, 615);
    let _nginx = w.spawn(&["nginx", "-c", &conf, "-e", "stderr"], "nginx");
    wait_listening(Ipv4Addr::LOCALHOST, port);
    let url = format!("http://127.0.0.1:{port}/page.html");
    let before = w.counter("FlowstackdSendFileBytes");
    let mut daemon_bytes = 0u64;
    // Replaced (a new inode under the name), truncated in place, grown in place past the
    // small-file limit (the daemon reads it), and small again.
    let steps: [(&str, usize); 5] = [
        ("first", 615),
        ("replaced", 3_001),
        ("truncated", 101),
        ("grown", 100_003),
        ("small again", 17),
    ];
    for (i, (what, len)) in steps.into_iter().enumerate() {
        let data = match what {
            "replaced" => {
                let tmp = w.dir.join("www/page.tmp");
                let d = write_random(&tmp, len);
                std::fs::rename(&tmp, &page).unwrap();
                d
            }
            "first" => std::fs::read(&page).unwrap(),
            _ => {
                // In place: the same inode, written shorter or longer.
                let d = write_random(&w.dir.join("scratch.bin"), len);
                std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&page)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, &d))
                    .unwrap();
                d
            }
        };
        if len > 64 * 1024 {
            daemon_bytes += len as u64;
        }
        let got = fetch(&w, &url, &format!("got{i}.html"));
        assert_eq!(got.len(), data.len(), "{what}: length");
        assert!(got == data, "{what}: bytes differ");
    }
    assert_eq!(
        w.counter("FlowstackdSendFileBytes") - before,
        daemon_bytes,
        "only the grown page was read by the daemon"
    );
}

/// The daemon's socket rows (`flowstack stats --json`) that are not listeners.
fn open_connections(w: &World) -> Vec<String> {
    let out = Command::new(flowstack_bin())
        .args(["stats", "--json", "--socket"])
        .arg(&w.sock)
        .output()
        .unwrap();
    assert!(out.status.success(), "flowstack stats");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    v["sockets"]
        .as_array()
        .expect("sockets")
        .iter()
        .filter(|r| r["state"].as_str() != Some("LISTEN"))
        .map(|r| r.to_string())
        .collect()
}

#[test]
fn many_short_connections_from_ab_leave_no_socket_in_the_daemon() {
    if !have("nginx") || !have("ab") {
        return;
    }
    let w = World::new("short");
    let port = free_port(Ipv4Addr::LOCALHOST);
    let conf = nginx_sendfile_conf(&w.dir, port)
        .to_string_lossy()
        .into_owned();
    std::fs::write(w.dir.join("www/index.html"), "<h1>flowstack</h1>\n").unwrap();
    let _nginx = w.spawn(&["nginx", "-c", &conf, "-e", "stderr"], "nginx");
    wait_listening(Ipv4Addr::LOCALHOST, port);
    let opens = w.counter("TcpActiveOpens");
    let n = 3000;
    let url = format!("http://127.0.0.1:{port}/index.html");
    let out = w.output(
        &["ab", "-q", "-n", &n.to_string(), "-c", "10", &url],
        Duration::from_secs(240),
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ab: {s}");
    assert!(s.contains(&format!("Complete requests:      {n}")), "{s}");
    assert!(s.contains("Failed requests:        0"), "{s}");
    // Every connection went through flowstack (ab's connects are the daemon's active opens).
    assert!(
        w.counter("TcpActiveOpens") - opens >= n,
        "through flowstack"
    );
    // And every one of them is gone from the daemon once both ends closed.
    let mut left = Vec::new();
    wait_until(
        Duration::from_secs(20),
        "the daemon to drop every connection",
        || {
            left = open_connections(&w);
            left.is_empty()
        },
    );
}

#[test]
fn a_child_forked_right_after_accept_answers_on_the_accepted_socket() {
    if !have("python3") || !have("sha256sum") {
        return;
    }
    let w = World::new("forker");
    let (_server, port) = start_sender(&w, FORKER, &[]);
    for i in 0..3 {
        let out = w.output(
            &["python3", "recv.py", &port, &format!("got{i}.bin")],
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = std::fs::read(w.dir.join(format!("got{i}.bin"))).unwrap();
        assert_eq!(got, format!("child {i}\n").into_bytes());
    }
    assert_eq!(sender_said(&w), "served");
    assert!(w.counter("TcpPassiveOpens") >= 3, "through flowstack");
}
