//! Issue 16: a flowstack socket passed to another process with `SCM_RIGHTS` under
//! `flowstack run` keeps working there, and closing is last-reference across the passing:
//! the sender's close leaves the connection open for the receiver, and the receiver's close
//! (the last copy anywhere) ends it, which the peer sees as end of stream.
//!
//! One python3 process starts a second python3 (its own shim, its own registration with
//! the daemon) holding only one end of an AF_UNIX pair, connects to its own listener,
//! passes the connected socket over the pair and closes its copy; the second process talks
//! on it and closes it. Its own daemon socket in its own temporary directory; every wait is
//! bounded (socket timeouts, the test's time limit). Skipped with a printed reason only
//! when python3 is not installed.

mod apps_common;

use apps_common::*;
use std::net::Ipv4Addr;
use std::time::Duration;

/// The receiving process: takes one descriptor from the AF_UNIX socket whose number is its
/// argument, waits for "go", sends on the socket it got, reads the reply, closes it.
const CHILD: &str = r#"
import os, socket, sys
u = socket.socket(fileno=int(sys.argv[1]))
u.settimeout(20)
msg, fds, _, _ = socket.recv_fds(u, 16, 1)
assert msg == b"fd" and len(fds) == 1, (msg, fds)
k = socket.socket(fileno=fds[0])
k.settimeout(20)
assert u.recv(2) == b"go"
k.sendall(b"from the other process")
got = k.recv(64)
k.close()
os.write(1, b"child got " + got + b"\n")  # one write: the parent prints to the same pipe
"#;

/// The sending process.
const PARENT: &str = r#"
import os, socket, subprocess, sys
port = int(sys.argv[1])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(4)
u1, u2 = socket.socketpair()
# (Its own number: a dup2 onto a low number could take one of the shim's descriptors.)
child = subprocess.Popen([sys.executable, "child.py", str(u2.fileno())], pass_fds=[u2.fileno()])
u2.close()
# Made after the child started: it can only have the connection through the pair.
c = socket.create_connection(("127.0.0.1", port), timeout=20)
s, _ = l.accept()
s.settimeout(20)
socket.send_fds(u1, [b"fd"], [c.fileno()])
c.close()
# Our copy is closed: the connection must still be open (the child holds it).
u1.sendall(b"go")
want = b"from the other process"
got = b""
while len(got) < len(want):
    d = s.recv(64)
    assert d, "end of stream before the child's bytes"
    got += d
os.write(1, b"parent got " + got + b"\n")
s.sendall(b"reply")
# The child's close is the last one anywhere: end of stream here.
os.write(1, b"parent eof %r\n" % (s.recv(64) == b""))
assert child.wait(timeout=20) == 0
"#;

#[test]
fn a_socket_passed_with_scm_rights_works_in_the_receiver_and_closes_at_its_last_close() {
    let Some(w) = python_world("fdpass", "parent.py", PARENT) else {
        return;
    };
    std::fs::write(w.dir.join("child.py"), CHILD).unwrap();
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let Some((said, err)) = w.python(&["parent.py", &port], &[], Duration::from_secs(60)) else {
        return;
    };
    assert!(
        said.contains("parent got from the other process\n"),
        "{said}{err}"
    );
    assert!(said.contains("child got reply\n"), "{said}{err}");
    assert!(said.contains("parent eof True\n"), "{said}{err}");
    // Both processes' sockets went through flowstack (listener, client, accepted).
    w.assert_flowstack("python3", 3);
}
