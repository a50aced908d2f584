//! Issue 16: fused loopback connections under the shim (the daemon's `app::fuse`, the
//! client's `fused`). Once a connection between two programs has carried `--fuse-after`
//! bytes (64 KiB by default) its bytes go through a pipe both map; what programs see must not
//! change:
//!
//! - `sendfile`: a server that interleaves `send` (a header) and `sendfile` (a 300 kB body)
//!   on one keep-alive connection, as nginx does: after the switch the file's bytes go
//!   through the pipe too, in order (the daemon's own file send would overtake the header).
//! - `fork`: a fused connection that a forked child goes on writing (the child adopts it and
//!   gets the pipe), while the parent keeps reading the other direction; then the parent
//!   writes again after the child exits.
//! - `peek`: `MSG_PEEK`, `FIONREAD`, `select` and a receive timeout on a fused socket, and
//!   end of stream only after the last byte in the pipe.
//! - `epoll`: two processes ping-pong small messages over a fused connection, each waiting
//!   in `epoll` (the child edge-triggered, the parent level-triggered). Their readers sleep
//!   on their own wake-up channels, so the writers wake them directly: the daemon's kicks
//!   must stay far below the number of messages.
//! - `epoll-kill`: the same, and the daemon is killed (SIGKILL) halfway; both processes go
//!   on until a call fails, which must happen within 10 s (their wake-up channels no longer
//!   hang up at the daemon's death, since each peer holds a write end of the other's, and
//!   fused bytes do not pass the daemon: its death is seen at the next liveness check).
//! - `epoll-busy`: the same ping-pong, but the child's epoll set also holds a second
//!   flowstack connection, level-triggered for `EPOLLOUT`: every wait returns at once with
//!   it, so the child never sleeps, and its peer's wake-ups (records on its wake-up channel,
//!   drained by sleepers) must still make the pongs' socket reported (redis-benchmark's last
//!   replies stalled so).
//!
//! Every mode checks SHA-256 of what arrived, and that the connection was fused
//! (`FlowstackdPipesFused`). One python3 process under `flowstack run`; bounded by socket
//! timeouts and the test's time limit. Skipped with a printed reason only when python3 is
//! not installed.

mod apps_common;

use apps_common::*;
use std::net::Ipv4Addr;
use std::time::Duration;

const SCRIPT: &str = r#"
import fcntl, hashlib, os, select, socket, sys, termios, array, threading, time
port, how, tmp = int(sys.argv[1]), sys.argv[2], sys.argv[3]

def pair():
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(1)
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    s, _ = l.accept()
    s.settimeout(30)
    return c, s

def drain(sock):
    h, n = hashlib.sha256(), 0
    while True:
        d = sock.recv(1 << 16)
        if not d:
            return h.hexdigest(), n
        h.update(d)
        n += len(d)

def blob(n, seed):
    return (hashlib.sha256(seed).digest() * (n // 32 + 1))[:n]

ROUNDS = 4000
# epoll-kill: rounds go on after the kill until a call fails (fused bytes and direct
# wake-ups do not pass through the daemon: its death is seen at the next liveness check,
# within 100 ms), for at most this many seconds.
KILL_BOUND = 10

def rounds_for(kill, busy):
    return 1 << 62 if kill else ROUNDS // 4 if busy else ROUNDS

def still_alive(kill, since, bound=KILL_BOUND):
    assert not kill or since is None or time.monotonic() - since < bound, \
        "no call failed within %d s of the daemon's death" % bound

def wait_in(ep, fd):
    # Until `fd` is reported readable; other reports (the busy socket) do not count.
    for _ in range(200000):
        evs = ep.poll(10)
        assert evs, "epoll timed out"
        if any(f == fd and e & select.EPOLLIN for f, e in evs):
            return
    raise AssertionError("the connection was never reported readable")

def pingpong(kill, busy):
    # Each side sleeps in epoll once first (its wake-up channel, which the daemon hands the
    # peer a write end of at fusion, is made at registration already; the sleep is kept).
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(1)
    pid = os.fork()
    if pid == 0:
        l.close()
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=30)
            c.setblocking(False)
            ep = select.epoll()
            ep.register(c.fileno(), select.EPOLLIN | select.EPOLLOUT | select.EPOLLET)
            ep.poll(0.05)
            # Past --fuse-after one way, waiting in epoll only (a blocking wait would turn
            # the placeholder's tokens back on: its pipe then asks the daemon, README).
            warm, off = blob(1200000, b"warm"), 0
            while off < len(warm):
                try:
                    off += c.send(warm[off:off + 65536])
                except BlockingIOError:
                    assert ep.poll(10), "epoll timed out (warm-up)"
            ep.modify(c.fileno(), select.EPOLLIN | select.EPOLLET)
            rounds = rounds_for(kill, busy)
            killed = None
            if busy:
                # A connection to itself, always writable, reported on every wait.
                l2 = socket.socket()
                l2.bind(("127.0.0.1", 0))
                l2.listen(1)
                c2 = socket.create_connection(l2.getsockname(), timeout=30)
                a2, _ = l2.accept()
                ep.register(c2.fileno(), select.EPOLLOUT)
            for i in range(rounds):
                if kill and i == ROUNDS // 2:
                    os.kill(int(sys.argv[4]), 9)
                    killed = time.monotonic()
                still_alive(kill, killed)
                msg = b"ping%06d" % i
                assert c.send(msg) == len(msg)
                got = b""
                while len(got) < len(msg):
                    if busy:
                        wait_in(ep, c.fileno())
                    else:
                        assert ep.poll(10), "epoll timed out"
                    while True:  # edge-triggered: until EAGAIN
                        try:
                            d = c.recv(64)
                        except BlockingIOError:
                            break
                        assert d, "end of stream"
                        got += d
                assert got == b"pong%06d" % i, got
            c.close()
            os._exit(0 if not kill else 3)
        except AssertionError as e:
            print("child:", e, flush=True)
            os._exit(1)
        except OSError as e:
            os._exit(2 if kill else 1)
    s, _ = l.accept()
    s.setblocking(False)
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLIN)
    ep.poll(0.05)
    n = 0
    try:
        while n < 1200000:
            assert ep.poll(10), "epoll timed out"
            d = s.recv(min(1 << 16, 1200000 - n))  # not into the first ping
            assert d, "end of stream"
            n += len(d)
        started = time.monotonic()
        for i in range(rounds_for(kill, busy)):
            # (The daemon dies after ROUNDS // 2 rounds; bounded from the start here.)
            still_alive(kill, started, 3 * KILL_BOUND)
            buf = b""
            while len(buf) < 10:
                assert ep.poll(10), "epoll timed out"
                d = s.recv(64)  # level-triggered: one receive per wake-up
                assert d, "end of stream"
                buf += d
            assert buf == b"ping%06d" % i, buf
            assert s.send(b"pong%06d" % i) == 10
        failed = False
    except OSError:
        failed = True
    _, st = os.waitpid(pid, 0)
    if kill:
        assert failed and os.WEXITSTATUS(st) == 2, (failed, st)
    else:
        assert not failed and st == 0, st

if how.startswith("epoll"):
    pingpong(how == "epoll-kill", how == "epoll-busy")
    print("done", how, flush=True)
    sys.exit(0)
c, s = pair()
if how == "sendfile":
    path = os.path.join(tmp, "body.bin")
    body = blob(300000, b"body")
    with open(path, "wb") as f:
        f.write(body)
    want = hashlib.sha256()
    def serve():
        s.settimeout(None)  # os.sendfile on a non-blocking socket may say EAGAIN
        fd = os.open(path, os.O_RDONLY)
        for i in range(40):
            head = b"HEAD%04d\r\n" % i
            s.sendall(head)
            want.update(head)
            off = 0
            while off < len(body):
                off += os.sendfile(s.fileno(), fd, off, len(body) - off)
            want.update(body)
        s.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=serve)
    t.start()
    got, n = drain(c)
    t.join()
    assert n == 40 * (len(body) + 10), n
    assert got == want.hexdigest(), "misordered"
elif how == "fork":
    first, second, third = blob(3000000, b"1"), blob(3000000, b"2"), blob(500000, b"3")
    out = []
    t = threading.Thread(target=lambda: out.append(drain(c)))
    t.start()
    s.sendall(first)
    pid = os.fork()
    if pid == 0:
        try:
            s.sendall(second)
            os._exit(0)
        except BaseException as e:
            print("child:", e, flush=True)
            os._exit(1)
    _, st = os.waitpid(pid, 0)
    assert st == 0, st
    s.sendall(third)
    s.shutdown(socket.SHUT_WR)
    t.join()
    assert out[0] == (hashlib.sha256(first + second + third).hexdigest(), 6500000), out
elif how == "peek":
    data = blob(4000000, b"peek")
    t = threading.Thread(target=lambda: (s.sendall(data), s.shutdown(socket.SHUT_WR)))
    t.start()
    h, n = hashlib.sha256(), 0
    while True:
        r, _, _ = select.select([c], [], [], 30)
        assert r, "select timed out"
        a = array.array("i", [0])
        fcntl.ioctl(c, termios.FIONREAD, a)
        p = c.recv(100, socket.MSG_PEEK)
        d = c.recv(1 << 16)
        if not d:
            assert a[0] == 0 and p == b"", (a[0], p)
            break
        # FIONREAD is a snapshot: the writer may add bytes before the recv, never take any.
        assert len(d) >= min(a[0], 1 << 16) and d.startswith(p), (a[0], len(d), len(p))
        h.update(d)
        n += len(d)
    t.join()
    assert (h.hexdigest(), n) == (hashlib.sha256(data).hexdigest(), len(data))
print("done", how, flush=True)
"#;

fn mode(how: &str) -> Option<World> {
    let w = python_world(&format!("fused-{how}"), "fused.py", SCRIPT)?;
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let tmp = w.dir.to_str().unwrap().to_string();
    let daemon = w
        .daemon
        .as_ref()
        .expect("the daemon runs")
        .0
        .id()
        .to_string();
    let args = ["fused.py", &port, how, &tmp, &daemon];
    let (said, err) = w.python(&args, &[], Duration::from_secs(120))?;
    assert!(said.contains(&format!("done {how}\n")), "{said}{err}");
    if how != "epoll-kill" {
        assert!(
            w.counter("FlowstackdPipesFused") >= 1,
            "the connection was never fused"
        );
    }
    Some(w)
}

#[test]
fn headers_and_sendfile_bodies_stay_in_order_on_a_fused_connection() {
    mode("sendfile");
}

#[test]
fn a_forked_child_goes_on_writing_a_fused_connection() {
    mode("fork");
}

#[test]
fn peek_fionread_select_and_end_of_stream_on_a_fused_connection() {
    mode("peek");
}

#[test]
fn epoll_readers_of_a_fused_connection_are_woken_by_their_writers() {
    let Some(w) = mode("epoll") else {
        return;
    };
    // 8000 messages; through the daemon each would be at least one kick.
    let kicks = w.counter("FlowstackdPipeKicks");
    assert!(
        kicks < 800,
        "{kicks} kicks: the writers did not wake their readers directly"
    );
}

#[test]
fn killing_the_daemon_fails_fused_epoll_peers_that_wake_each_other() {
    mode("epoll-kill");
}

#[test]
fn a_fused_reader_that_never_sleeps_still_hears_its_peer() {
    mode("epoll-busy");
}
