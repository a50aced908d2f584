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
