//! Issue 16: sockets shared by a parent and a forked child, as programs share them in the
//! kernel. Which process receives a shared connection is decided by who reads it
//! (`flowstack_client::posix` `hold` module docs):
//!
//! - `forking`: python's `socketserver.ForkingTCPServer` (accept, fork a child per
//!   connection, close it in the parent) serves requests whose bytes arrive before the
//!   fork (with the accept) and after it (2 MB), and answers 1 MB from the child; three
//!   clients at once, then three one after another, all byte-exact.
//! - `carry`: bytes the parent had received and not read when it forked are read by the
//!   child, before the bytes that came after; the parent closes its copy unread.
//! - `readfirst`: the parent reads a request's head (waiting in `poll(2)`, as python's
//!   sockets with a timeout do), forks, and closes its copy; the child reads the body that
//!   comes after the fork.
//! - `split`: one connection used by two processes, as `netcat`-style programs do — the
//!   child only writes on it (2 MB), the parent only reads from it (1 MB) and reads the
//!   child's bytes at the other end; the child also makes a socket (which adopts every
//!   inherited one) without taking any of them from the parent.
//! - `parent`: a parent with unread bytes on three connections forks a child that makes a
//!   socket and exits; the parent reads everything, on every connection (redis' `BGSAVE`).
//!
//! Each mode is one python3 process under `flowstack run` (its server, when it has one, a
//! subprocess under the shim too); bounded by socket timeouts and the test's time limit.
//! Skipped with a printed reason only when python3 is not installed.

mod apps_common;

use apps_common::*;
use std::net::Ipv4Addr;
use std::time::Duration;

const SCRIPT: &str = r#"
import hashlib, os, socket, subprocess, sys, threading
port, how = int(sys.argv[1]), sys.argv[2]

def exactly(s, n):
    got = bytearray()
    while len(got) < n:
        k = s.recv(min(65536, n - len(got)))
        assert k, (len(got), n)
        got += k
    return bytes(got)

def pattern(n, seed):
    b = hashlib.sha256(seed).digest() * (n // 32 + 1)
    return b[:n]

def pair(l):
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    s, _ = l.accept()
    s.settimeout(30)
    return c, s

def listener():
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(16)
    return l

def reap(pid):
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0, st

def child(f):
    pid = os.fork()
    if pid == 0:
        try:
            f()
            os._exit(0)
        except BaseException as e:
            os.write(2, ("child: " + repr(e) + "\n").encode())
            os._exit(3)
    return pid

SERVER = """
import hashlib, socketserver, sys
class H(socketserver.BaseRequestHandler):
    def handle(self):
        s = self.request
        s.settimeout(30)
        f = s.makefile("rb")
        n = int(f.readline())
        data = f.read(n)
        assert len(data) == n, (len(data), n)
        body = hashlib.sha256(data).digest() * (1048576 // 32)
        s.sendall(b"%d %s\\n" % (n, hashlib.sha256(data).hexdigest().encode()) + body)
class S(socketserver.ForkingTCPServer):
    allow_reuse_address = True
srv = S(("127.0.0.1", int(sys.argv[1])), H)
print("listening", flush=True)
srv.serve_forever()
"""

def request(size, i):
    data = pattern(size, b"%d" % i)
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    c.sendall(b"%d\n" % size + data)
    f = c.makefile("rb")
    head = f.readline()
    want = b"%d %s\n" % (size, hashlib.sha256(data).hexdigest().encode())
    assert head == want, (head, want)
    body = f.read(1048576)
    assert body == hashlib.sha256(data).digest() * (1048576 // 32), len(body)
    c.close()

if how == "forking":
    srv = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE)
    try:
        assert srv.stdout.readline() == b"listening\n"
        errs = []
        def run(size, i):
            try:
                request(size, i)
            except BaseException as e:
                errs.append(repr(e))
        ts = [threading.Thread(target=run, args=(z, i)) for i, z in enumerate([5, 2000000, 100])]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert not errs, errs
        for i, z in enumerate([7, 300000, 2000000]):
            request(z, 10 + i)
    finally:
        srv.kill()
        srv.wait()
elif how == "carry":
    l = listener()
    c, s = pair(l)
    c.sendall(b"hello ")
    # The parent's view has the bytes before it forks (FIONREAD waits for them).
    import fcntl, termios, array, time
    for _ in range(3000):
        a = array.array("i", [0])
        fcntl.ioctl(s, termios.FIONREAD, a)
        if a[0] == 6:
            break
        time.sleep(0.01)
    assert a[0] == 6, a[0]
    def kid():
        assert exactly(s, 12) == b"hello world!"
        s.sendall(b"ok")
    pid = child(kid)
    s.close()
    c.sendall(b"world!")
    assert exactly(c, 2) == b"ok"
    reap(pid)
elif how == "readfirst":
    l = listener()
    c, s = pair(l)
    c.sendall(b"HEAD")
    # A read with a timeout waits in poll(2) on the placeholder first.
    assert exactly(s, 4) == b"HEAD"
    def kid():
        assert exactly(s, 4) == b"BODY"
        s.sendall(b"ok")
    pid = child(kid)
    s.close()
    c.sendall(b"BODY")
    assert exactly(c, 2) == b"ok"
    reap(pid)
elif how == "split":
    l = listener()
    c, s = pair(l)
    down, up = pattern(2000000, b"child"), pattern(1000000, b"parent")
    def kid():
        x = socket.socket()
        x.close()
        c.sendall(down)
    pid = child(kid)
    got = []
    t = threading.Thread(target=lambda: got.append(exactly(s, len(down))))
    t.start()
    s.sendall(up)
    assert exactly(c, len(up)) == up
    t.join()
    assert got and got[0] == down, "the child's bytes"
    reap(pid)
elif how == "parent":
    l = listener()
    pairs = [pair(l) for _ in range(3)]
    for i, (c, s) in enumerate(pairs):
        c.sendall(b"before%d " % i)
    for i, (c, s) in enumerate(pairs):
        assert exactly(s, 1) == b"b"
    def kid():
        x = socket.socket()
        x.close()
    pid = child(kid)
    reap(pid)
    for i, (c, s) in enumerate(pairs):
        c.sendall(b"after%d" % i)
    for i, (c, s) in enumerate(pairs):
        want = b"efore%d after%d" % (i, i)
        assert exactly(s, len(want)) == want
        s.sendall(b"back%d" % i)
        assert exactly(c, 5) == b"back%d" % i
print("done", how, flush=True)
"#;

fn mode(how: &str) {
    let Some(w) = python_world(&format!("fork-{how}"), "fork.py", SCRIPT) else {
        return;
    };
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let args = ["fork.py", &port, how];
    let Some((said, err)) = w.python(&args, &[], Duration::from_secs(120)) else {
        return;
    };
    assert!(said.contains(&format!("done {how}\n")), "{said}{err}");
    w.assert_flowstack("python3", 2);
}

#[test]
fn a_forking_server_serves_every_request() {
    mode("forking");
}

#[test]
fn a_child_reads_what_its_parent_left_unread_first() {
    mode("carry");
}

#[test]
fn a_child_reads_the_rest_of_a_request_its_parent_began() {
    mode("readfirst");
}

#[test]
fn a_child_that_writes_on_a_socket_its_parent_reads_takes_nothing() {
    mode("split");
}

#[test]
fn a_parent_keeps_reading_after_its_child_used_the_shim() {
    mode("parent");
}
