//! Issue 16: the shim's own descriptors stay out of the program's way
//! (`flowstack_sys::ownfd`). A program under `flowstack run` numbers its files as on the
//! kernel, may `dup2` onto any number (the shim's file moves elsewhere), sees `EBADF` when
//! it closes a number it never opened, and `close_range`/`closefrom` over everything above
//! its own sockets leave the shim working.
//!
//! One python3 process (its own daemon socket in its own temporary directory; every wait
//! bounded by socket timeouts and the test's time limit). Skipped with a printed reason
//! only when python3 is not installed. Before the shim moved its descriptors, its
//! registration socket took fd 3 and `os.dup2(x, 3)` made every later socket call fail.

mod apps_common;

use apps_common::*;
use std::net::Ipv4Addr;
use std::time::Duration;

/// The floor given to the shim (`FLOWSTACK_FD_FLOOR`).
const FLOOR: u32 = 200;

const SCRIPT: &str = r#"
import errno, os, socket, sys
port, floor = int(sys.argv[1]), int(sys.argv[2])

def open_fds():
    names = os.listdir("/proc/self/fd")
    out = set()
    for n in names:
        try:
            os.readlink("/proc/self/fd/" + n)  # the listing's own descriptor is gone by now
            out.add(int(n))
        except OSError:
            pass
    return out

def pair(l):
    c = socket.create_connection(("127.0.0.1", port), timeout=20)
    s, _ = l.accept()
    s.settimeout(20)
    return c, s

def talk(c, s, what):
    c.sendall(what)
    got = b""
    while len(got) < len(what):
        d = s.recv(64)
        assert d, "end of stream"
        got += d
    assert got == what, got

before = open_fds()
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(8)
c, s = pair(l)
talk(c, s, b"first")
mine = {l.fileno(), c.fileno(), s.fileno()}
theirs = open_fds() - before - mine
print("low numbers", sorted(mine), flush=True)
print("shim fds", len(theirs), "all above floor", all(f >= floor for f in theirs), flush=True)

# Closing a number the program never opened: EBADF, and the shim keeps its file.
k = min(theirs)
try:
    os.close(k)
    print("close of a shim fd succeeded", flush=True)
except OSError as e:
    print("close of a shim fd", errno.errorcode[e.errno], flush=True)

# dup2 onto every shim descriptor: the program gets the number, the shim keeps working.
null = os.open("/dev/null", os.O_RDONLY)
for f in sorted(theirs):
    assert os.dup2(null, f) == f
    assert os.path.samestat(os.fstat(f), os.fstat(null))
talk(c, s, b"after dup2")
c2, s2 = pair(l)
talk(s2, c2, b"new connection after dup2")
for f in sorted(theirs):
    os.close(f)

# close_range over everything above the program's sockets.
top = max(mine | {c2.fileno(), s2.fileno(), null})
os.closerange(top + 1, 1 << 20)
talk(c, s, b"after closerange")
c3, s3 = pair(l)
talk(c3, s3, b"new connection after closerange")
for x in (c, s, c2, s2, c3, s3, l):
    x.close()
print("done", flush=True)
"#;

#[test]
fn the_shims_descriptors_sit_above_the_floor_and_survive_dup2_close_and_close_range() {
    let Some(w) = python_world("ownfd", "own.py", SCRIPT) else {
        return;
    };
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let floor = FLOOR.to_string();
    let env = [("FLOWSTACK_FD_FLOOR", floor.as_str())];
    let Some((said, err)) = w.python(&["own.py", &port, &floor], &env, Duration::from_secs(60))
    else {
        return;
    };
    // The program's three sockets took the lowest numbers, as on the kernel.
    assert!(said.contains("low numbers [3, 4, 5]\n"), "{said}{err}");
    let shim = said
        .lines()
        .find_map(|l| l.strip_prefix("shim fds "))
        .unwrap_or_else(|| panic!("{said}{err}"));
    let n: usize = shim.split(' ').next().unwrap().parse().unwrap();
    // At least the registration socket, the doorbell and a copy per placeholder.
    assert!(n >= 5, "{said}");
    assert!(shim.ends_with("all above floor True"), "{said}");
    assert!(said.contains("close of a shim fd EBADF\n"), "{said}{err}");
    assert!(said.contains("done\n"), "{said}{err}");
    w.assert_flowstack("python3", 3);
}
