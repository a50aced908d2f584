//! `sendfile(2)` of unmodified programs under `flowstack run` goes through the daemon's file
//! path (issue 17): python's `socket.sendfile()` (which calls `os.sendfile` with offsets) and
//! `os.sendfile(…, None, …)` (the file position), and nginx with `sendfile on;`, each
//! received by a `flowstack run` client, byte-exact, with `flowstack stats --json` showing
//! the bytes in `FlowstackdSendFileBytes` (the daemon read them from the file).
//!
//! Each test has its own daemon socket in its own temporary directory; servers listen on
//! free ports of 127.0.0.1; every wait is bounded and every child is killed when its guard
//! drops. Skipped with a printed reason only when a program is not installed.

mod apps_common;

use apps_common::*;
use std::net::Ipv4Addr;
use std::process::Stdio;
use std::time::Duration;

/// The sender: `socket.sendfile(f)` of the whole file, then `os.sendfile` with no offset
/// (the file position) for the first MiB again; prints both counts and the final position.
const SENDER: &str = r#"
import os, socket, sys
path, port, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(1)
open(ready, "w").close()
c, _ = l.accept()
with open(path, "rb") as f:
    n = c.sendfile(f)
    f.seek(0)
    m = 0
    while m < 1 << 20:
        k = os.sendfile(c.fileno(), f.fileno(), None, (1 << 20) - m)
        if k == 0:
            break
        m += k
    print(n, m, f.tell(), flush=True)
c.close()
"#;

#[test]
fn python_socket_sendfile_of_100_mb_goes_through_the_daemons_file_path() {
    if !have("python3") || !have("sha256sum") {
        return;
    }
    let w = World::new("python");
    let size = 100 << 20;
    let file = w.dir.join("big.bin");
    let data = write_random(&file, size);
    std::fs::write(w.dir.join("send.py"), SENDER).unwrap();
    std::fs::write(w.dir.join("recv.py"), RECEIVER).unwrap();
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let ready = w.dir.join("ready");
    let file_s = file.to_string_lossy().into_owned();
    let ready_s = ready.to_string_lossy().into_owned();
    let sender = w.spawn(&["python3", "send.py", &file_s, &port, &ready_s], "sender");
    wait_until(Duration::from_secs(20), "the sender to listen", || {
        ready.exists()
    });
    let before = w.counter("FlowstackdSendFileBytes");
    let out = w.output(
        &["python3", "recv.py", &port, "got.bin"],
        Duration::from_secs(120),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "receiver: {err}");
    // The receiver's count and digest; then byte for byte.
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let total = size + (1 << 20);
    let mut expect = data.clone();
    expect.extend_from_slice(&data[..1 << 20]);
    std::fs::write(w.dir.join("expect.bin"), &expect).unwrap();
    assert_eq!(
        line,
        format!("{total} {}", sha256_file(&w.dir.join("expect.bin"))),
        "receiver's count and sha256"
    );
    let got = std::fs::read(w.dir.join("got.bin")).unwrap();
    assert!(got == expect, "bytes differ");
    // The sender's counts, and the file position moved by os.sendfile(…, None, …).
    wait_until(Duration::from_secs(20), "the sender to finish", || {
        std::fs::read_to_string(w.dir.join("sender.out")).is_ok_and(|s| s.ends_with('\n'))
    });
    let said = std::fs::read_to_string(w.dir.join("sender.out")).unwrap();
    assert_eq!(said.trim(), format!("{size} {} {}", 1 << 20, 1 << 20));
    drop(sender);
    // Every byte was read from the file by the daemon, none through the program.
    let after = w.counter("FlowstackdSendFileBytes");
    assert_eq!(after - before, total as u64, "FlowstackdSendFileBytes");
    // Not kernel-carried: the receiver's connection was the daemon's.
    assert!(
        w.counter("TcpPassiveOpens") >= 1,
        "the connection went through flowstack"
    );
}

#[test]
fn the_copy_path_still_works_with_flowstack_sendfile_copy_and_is_not_counted() {
    if !have("python3") {
        return;
    }
    let w = World::new("copy");
    let size = (8 << 20) + 3;
    let file = w.dir.join("f.bin");
    let data = write_random(&file, size);
    std::fs::write(w.dir.join("send.py"), SENDER).unwrap();
    std::fs::write(w.dir.join("recv.py"), RECEIVER).unwrap();
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let ready = w.dir.join("ready");
    let (file_s, ready_s) = (
        file.to_string_lossy().into_owned(),
        ready.to_string_lossy().into_owned(),
    );
    let mut c = w.run(&["python3", "send.py", &file_s, &port, &ready_s]);
    c.env("FLOWSTACK_SENDFILE", "copy");
    let _sender = {
        use std::os::unix::process::CommandExt;
        Proc(
            c.process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    wait_until(Duration::from_secs(20), "the sender to listen", || {
        ready.exists()
    });
    let out = w.output(
        &["python3", "recv.py", &port, "got.bin"],
        Duration::from_secs(120),
    );
    assert!(out.status.success());
    let got = std::fs::read(w.dir.join("got.bin")).unwrap();
    assert_eq!(got.len(), size + (1 << 20));
    assert!(got[..size] == data[..] && got[size..] == data[..1 << 20]);
    assert_eq!(w.counter("FlowstackdSendFileBytes"), 0);
}

#[test]
fn nginx_with_sendfile_on_serves_files_from_the_daemons_file_path() {
    if !have("nginx") || !have("curl") {
        return;
    }
    let w = World::new("nginx");
    let port = free_port(Ipv4Addr::LOCALHOST);
    let conf = nginx_sendfile_conf(&w.dir, port);
    let big = write_random(&w.dir.join("www/big.bin"), (30 << 20) + 11);
    let small = write_random(&w.dir.join("www/small.bin"), 4097);
    let conf_s = conf.to_string_lossy().into_owned();
    let _nginx = w.spawn(&["nginx", "-c", &conf_s, "-e", "stderr"], "nginx");
    let url = |f: &str| format!("http://127.0.0.1:{port}/{f}");
    wait_until(Duration::from_secs(20), "nginx to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let before = w.counter("FlowstackdSendFileBytes");
    for (name, data) in [("big.bin", &big), ("small.bin", &small)] {
        let out = w.output(
            &["curl", "-sS", "--max-time", "60", "-o", name, &url(name)],
            Duration::from_secs(90),
        );
        assert!(
            out.status.success(),
            "curl {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = std::fs::read(w.dir.join(name)).unwrap();
        assert!(got == *data, "{name}: bytes differ");
    }
    // The big file was read by the daemon; the small one (4097 bytes, under the shim's
    // small-file limit) was read by nginx's shim and written, never counted there. So is
    // the big file's tail once at most that limit (64 KiB, `flowstack_preload::sendfile::
    // SMALL_FILE`) is left: how much that is depends on where nginx's partial sends ended.
    let sent = w.counter("FlowstackdSendFileBytes") - before;
    let big_len = big.len() as u64;
    assert!(
        (big_len - (64 << 10)..=big_len).contains(&sent),
        "nginx's sendfile bytes through the daemon: {sent} of {big_len}"
    );
}

/// The shim's checks before the daemon sees anything, and the copy path for a pipe.
const ERRNOS: &str = r#"
import errno, os, socket, sys
port, ready, d = int(sys.argv[1]), sys.argv[2], sys.argv[3]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(1)
open(ready, "w").close()
c, _ = l.accept()
def err(f):
    try:
        return str(f())
    except OSError as e:
        return errno.errorcode[e.errno]
out = [err(lambda: os.sendfile(c.fileno(), 987, 0, 10))]
dfd = os.open(d, os.O_RDONLY)
out.append(err(lambda: os.sendfile(c.fileno(), dfd, 0, 10)))
wfd = os.open(os.path.join(d, "w.bin"), os.O_WRONLY | os.O_CREAT)
out.append(err(lambda: os.sendfile(c.fileno(), wfd, 0, 10)))
r, w = os.pipe()
os.write(w, b"pipe-bytes")
os.close(w)
out.append(err(lambda: os.sendfile(c.fileno(), r, None, 100)))
print(" ".join(out), flush=True)
c.close()
"#;

#[test]
fn shim_sendfile_answers_ebadf_and_einval_and_sends_a_pipe_by_copy() {
    if !have("python3") {
        return;
    }
    let w = World::new("errnos");
    std::fs::write(w.dir.join("errnos.py"), ERRNOS).unwrap();
    std::fs::write(w.dir.join("recv.py"), RECEIVER).unwrap();
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let ready = w.dir.join("ready");
    let (ready_s, dir_s) = (
        ready.to_string_lossy().into_owned(),
        w.dir.to_string_lossy().into_owned(),
    );
    let _sender = w.spawn(&["python3", "errnos.py", &port, &ready_s, &dir_s], "sender");
    wait_until(Duration::from_secs(20), "the sender to listen", || {
        ready.exists()
    });
    let out = w.output(
        &["python3", "recv.py", &port, "got.bin"],
        Duration::from_secs(60),
    );
    assert!(out.status.success());
    assert_eq!(std::fs::read(w.dir.join("got.bin")).unwrap(), b"pipe-bytes");
    wait_until(Duration::from_secs(20), "the sender to finish", || {
        std::fs::read_to_string(w.dir.join("sender.out")).is_ok_and(|s| s.ends_with('\n'))
    });
    let said = std::fs::read_to_string(w.dir.join("sender.out")).unwrap();
    // Bad descriptor, directory, write-only file, then 10 bytes from the pipe (copy path).
    assert_eq!(said.trim(), "EBADF EINVAL EBADF 10");
    assert_eq!(w.counter("FlowstackdSendFileBytes"), 0);
}
