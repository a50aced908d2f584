//! The shim's readiness fast path (crates/preload/src/epoll.rs, poll.rs): a C program
//! (tests/progs/epoll.c, built here with the system's C compiler) under `flowstack run`
//! checks, on flowstack sockets, level- and edge-triggered epoll, EPOLLONESHOT and its
//! re-arm, a pipe and a flowstack socket in one epoll set and one poll set, a timeout with
//! nothing ready (0, after the timeout), another thread asleep in epoll_wait woken by data,
//! EPOLLOUT and EPOLLRDHUP, close of a registered socket (a dup keeps the registration, the
//! last close removes it), EPOLL_CTL_DEL, nested sets (either order), a set used by the child
//! after `fork`; and, with the daemon SIGKILLed while it sleeps in
//! epoll_wait(-1), that it wakes with the socket reporting EPOLLERR|EPOLLHUP. Also
//! (tests/progs/fdflags.c) the descriptor flags and numbers of new flowstack sockets.
//!
//! Each test has its own daemon socket in its own temporary directory; every wait is bounded
//! and every child is killed when its guard drops. Skipped only when `cc` is missing.

mod apps_common;

use apps_common::*;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn build(w: &World) -> Option<PathBuf> {
    build_prog(w, "epoll")
}

/// Builds `tests/progs/NAME.c` into the world's directory (None: no C compiler).
fn build_prog(w: &World, name: &str) -> Option<PathBuf> {
    if !have("cc") {
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/progs/{name}.c"));
    let exe = w.dir.join(name);
    let st = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "cc {}", src.display());
    Some(exe)
}

#[test]
fn epoll_and_poll_semantics_on_flowstack_sockets() {
    let w = World::new("epoll");
    let Some(exe) = build(&w) else { return };
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let out = w.output(&[exe.to_str().unwrap(), &port], Duration::from_secs(60));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && s.trim_end().ends_with("ok"),
        "epoll: {s} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if !w.shim_without_daemon_api(&out.stderr) {
        // The listener, the connecting sockets and the accepted ones went through flowstack.
        w.assert_flowstack("epoll", 3);
    }
}

/// `socket`'s and `accept4`'s `SOCK_CLOEXEC`/`SOCK_NONBLOCK` on flowstack sockets: the
/// shim makes the placeholder pair with them (no `fcntl` after), and each socket takes the
/// lowest free number, as the kernel's would (tests/progs/fdflags.c).
#[test]
fn socket_and_accept4_flags_and_numbers_are_the_kernels() {
    let w = World::new("fdflags");
    let Some(exe) = build_prog(&w, "fdflags") else {
        return;
    };
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let out = w.output(&[exe.to_str().unwrap(), &port], Duration::from_secs(60));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && s.trim_end().ends_with("ok"),
        "fdflags: {s} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if !w.shim_without_daemon_api(&out.stderr) {
        // The listener, three connecting sockets, three accepted ones (and one closed).
        w.assert_flowstack("fdflags", 7);
    }
}

#[test]
fn a_thread_in_epoll_wait_wakes_with_error_and_hangup_when_the_daemon_is_killed() {
    use std::os::unix::process::CommandExt;
    let mut w = World::new("epoll-kill");
    let Some(exe) = build(&w) else { return };
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let mut child = Proc(
        w.run(&["timeout", "60", exe.to_str().unwrap(), &port, "killwait"])
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(w.dir.join("epoll.err")).unwrap(),
            ))
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut line = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
    assert_eq!(line(), "waiting");
    let err = std::fs::read_to_string(w.dir.join("epoll.err")).unwrap_or_default();
    if err.contains("has no daemon API") {
        eprintln!("skipped: the shim has no daemon API (sockets are on the kernel)");
        return;
    }
    w.kill_daemon();
    let killed = Instant::now();
    let woke = line();
    assert_eq!(woke, "woke ERR HUP", "stderr: {err}");
    // Bounded by the line read above; the program must also be gone (no hang on exit).
    let st = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(killed.elapsed() < Duration::from_secs(10), "still running");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "exit status {st}");
}

/// EPOLLEXCLUSIVE (tests/progs/epoll_excl.c): epoll_ctl's EINVAL rules on a flowstack
/// connection and listener, and six processes with the same listener in epoll sets of their
/// own with EPOLLIN|EPOLLEXCLUSIVE: every connection is accepted, and the processes do not
/// all wake for each one (an all-waking herd is 6 wake-ups per connection; the shim's
/// accept-ahead hands each connection to one process, which alone is woken for it — plus,
/// at most, one other for the placeholder's token).
#[test]
fn epollexclusive_rules_and_no_herd_among_processes_sharing_a_listener() {
    let w = World::new("epoll-excl");
    let Some(exe) = build_prog(&w, "epoll_excl") else {
        return;
    };
    let port = free_port(Ipv4Addr::LOCALHOST).to_string();
    let conns = 30;
    let out = w.output(
        &[exe.to_str().unwrap(), &port, "6", &conns.to_string()],
        Duration::from_secs(90),
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && s.trim_end().ends_with("ok"),
        "epoll_excl: {s} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wakes: usize = s
        .split_whitespace()
        .skip_while(|&x| x != "wakes")
        .nth(1)
        .and_then(|x| x.parse().ok())
        .expect("a wakes count");
    assert!(
        wakes < 3 * conns,
        "{wakes} wake-ups for {conns} connections: {s}"
    );
    if !w.shim_without_daemon_api(&out.stderr) {
        w.assert_flowstack("epoll_excl", 3);
    }
}
