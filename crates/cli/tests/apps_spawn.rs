//! Issue 16: children started by glibc's `system` and `popen` (its internal spawn, which no
//! `fork`/`posix_spawn` wrapper sees) may hold copies of the placeholders alive at that
//! moment, so the shim settles first and those sockets are never recycled (a recycled pair
//! carries the next connection while the child still holds its copy).
//!
//! python3 under `flowstack run` opens connections to its own listener and, while each is
//! alive, calls `os.system` (libc `system`) or libc `popen` through ctypes; the daemon's
//! `FlowstackdPlaceholdersRecycled` must not move. The same script without the call must
//! recycle (else the check would prove nothing). Its own daemon socket in its own
//! temporary directory; waits bounded by socket timeouts and the test's time limit. Skipped
//! with a printed reason only when python3 is not installed.

mod apps_common;

use apps_common::*;
use std::net::Ipv4Addr;
use std::time::Duration;

const SCRIPT: &str = r#"
import ctypes, os, socket, sys
port, how = int(sys.argv[1]), sys.argv[2]
libc = ctypes.CDLL(None)
libc.popen.restype = ctypes.c_void_p
libc.popen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.pclose.argtypes = [ctypes.c_void_p]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(8)
for i in range(4):
    c = socket.create_connection(("127.0.0.1", port), timeout=20)
    s, _ = l.accept()
    s.settimeout(20)
    c.sendall(b"x")
    assert s.recv(1) == b"x"
    if how == "system":
        assert os.system("true") == 0
    elif how == "popen":
        f = libc.popen(b"true", b"r")
        assert f
        assert libc.pclose(f) == 0
    c.close()
    s.close()
l.close()
print("done", how, flush=True)
"#;

#[test]
fn sockets_alive_at_system_or_popen_are_not_recycled() {
    let Some(w) = python_world("spawn", "spawn.py", SCRIPT) else {
        return;
    };
    let mut recycled = Vec::new();
    for how in ["none", "system", "popen"] {
        let port = free_port(Ipv4Addr::LOCALHOST).to_string();
        let args = ["spawn.py", &port, how];
        let Some((said, err)) = w.python(&args, &[], Duration::from_secs(60)) else {
            return;
        };
        assert!(said.contains(&format!("done {how}\n")), "{said}{err}");
        recycled.push(w.counter("FlowstackdPlaceholdersRecycled"));
    }
    assert!(
        recycled[0] > 0,
        "the plain run recycled nothing: {recycled:?}"
    );
    assert_eq!(
        recycled[1], recycled[0],
        "recycled after system(): {recycled:?}"
    );
    assert_eq!(
        recycled[2], recycled[1],
        "recycled after popen(): {recycled:?}"
    );
    w.assert_flowstack("python3", 8);
}

/// python3 copies itself with a raw system call (`syscall(SYS_fork)`, `SYS_vfork`, or
/// `SYS_clone` with fork's flags and no stack) while a connection to a server (another
/// python3 under the shim) is open: the child sends on the inherited socket and opens a new
/// connection, then exits; the parent sends on the socket afterwards. The server gets every
/// message on the right connection, in order. The shim treats the copy as a fork (the child
/// adopts the sockets through its own registration); without that the child drives the
/// parent's rings with its own copy of their cursors. `clone3` answers `ENOSYS`. (Reading
/// after the child used a shared socket: `apps_fork.rs`.)
const RAW_FORK: &str = r#"
import ctypes, os, socket, subprocess, sys
port, how = int(sys.argv[1]), sys.argv[2]
SERVER = """
import socket, sys
def exactly(s, n):
    got = b""
    while len(got) < n:
        k = s.recv(n - len(got))
        assert k, got
        got += k
    return got
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(8)
print("listening", flush=True)
s, _ = l.accept()
s.settimeout(20)
assert exactly(s, 1) == b"a"
assert exactly(s, 5) == b"child"
e, _ = l.accept()
e.settimeout(20)
assert exactly(e, 3) == b"new"
assert exactly(s, 6) == b"parent"
print("server ok", flush=True)
"""
srv = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE)
assert srv.stdout.readline() == b"listening\n"
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
assert libc.syscall(435, 0, 0) == -1 and ctypes.get_errno() == 38, "clone3"
c = socket.create_connection(("127.0.0.1", port), timeout=20)
c.sendall(b"a")
if how == "fork":
    pid = libc.syscall(57)
elif how == "vfork":
    pid = libc.syscall(58)
else:
    pid = libc.syscall(56, 17, 0, 0, 0, 0)  # clone(SIGCHLD, no stack)
if pid == 0:
    try:
        c.sendall(b"child")
        d = socket.create_connection(("127.0.0.1", port), timeout=20)
        d.sendall(b"new")
        d.close()
        os._exit(0)
    except BaseException as e:
        os.write(2, repr(e).encode() + b"\n")
        os._exit(3)
assert pid > 0, pid
_, st = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(st) == 0, st
c.sendall(b"parent")
assert srv.stdout.readline() == b"server ok\n"
assert srv.wait(timeout=20) == 0
print("done", how, flush=True)
"#;

#[test]
#[cfg(target_arch = "x86_64")]
fn a_raw_fork_is_a_fork() {
    let Some(w) = python_world("rawfork", "rawfork.py", RAW_FORK) else {
        return;
    };
    for how in ["fork", "vfork", "clone"] {
        let port = free_port(Ipv4Addr::LOCALHOST).to_string();
        let args = ["rawfork.py", &port, how];
        let Some((said, err)) = w.python(&args, &[], Duration::from_secs(60)) else {
            return;
        };
        assert!(said.contains(&format!("done {how}\n")), "{said}{err}");
    }
    w.assert_flowstack("python3", 4);
}
