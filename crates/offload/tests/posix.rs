//! `flowstack_client::posix` over a daemon: the process-shared socket model the LD_PRELOAD
//! shim uses. "Processes" are separate `Posix` instances (each its own registration), plus
//! real `fork`s. Readiness is checked with `poll(2)` on the placeholder A. Every wait is
//! bounded.

use flowstack_api::region::SOCK_RCVBUF;
use flowstack_client::posix::{Errno, Posix, RecvFlags, Shutdown, SockId, Type};
use flowstack_offload::{Daemon, DaemonConfig, DaemonHandle};
use flowstack_sys::placeholder::wait_a;
use flowstack_sys::process::{exit_now, fork, wait_exit, Forked};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(20));
const POLL: Duration = Duration::from_secs(10);

/// `FLOWSTACK_TEST_ENGINES=N` runs these tests on a daemon of N engine threads (the
/// applications of this process, and its forked children, all on one of them).
fn engines() -> usize {
    std::env::var("FLOWSTACK_TEST_ENGINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn daemon(name: &str) -> DaemonHandle {
    let dir = std::env::temp_dir().join(format!("flowstack-posix-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Daemon::spawn(&DaemonConfig {
        socket: dir.join("d.sock"),
        engines: engines(),
        ..DaemonConfig::default()
    })
    .unwrap()
}

fn lo(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

const BLOCK: RecvFlags = RecvFlags::BLOCK;
const NONBLOCK: RecvFlags = RecvFlags::NONBLOCK;

struct Pair {
    server: Posix,
    client: Posix,
    /// Server's accepted socket.
    sa: OwnedFd,
    sid: SockId,
    /// Client's socket.
    ca: OwnedFd,
    cid: SockId,
}

/// A listener in one "process", a connection to it from another, accepted.
fn connected(path: &PathBuf) -> Pair {
    let server = Posix::attach(path).unwrap();
    let client = Posix::attach(path).unwrap();
    let (_la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    assert!(port >= 32768, "ephemeral port {port}");
    assert_eq!(server.listen(lid, 16, None).unwrap(), port);
    // getsockname of a listener bound to 127.0.0.1 says so (it said 0.0.0.0).
    assert_eq!(server.local_addr(lid).unwrap(), lo(port));
    assert!(client.carries(lo(port)).unwrap());
    assert!(!client.carries(lo(port + 1)).unwrap());
    let (ca, cid) = client.socket(Type::Stream).unwrap();
    client.connect(cid, lo(port), false, T).unwrap();
    let (sa, sid, peer, _) = server.accept(lid, false, T).unwrap();
    assert_eq!(peer, client.local_addr(cid).unwrap());
    assert_eq!(client.peer_addr(cid).unwrap(), lo(port));
    Pair {
        server,
        client,
        sa,
        sid,
        ca,
        cid,
    }
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 11)) as u8
}

#[test]
fn echo_between_two_processes_byte_exact() {
    let d = daemon("echo");
    let p = connected(&d.path);
    let len = 3 << 20;
    let server = std::thread::spawn(move || {
        let mut buf = vec![0u8; 50_000];
        let mut total = 0;
        loop {
            let n = p.server.recv(p.sid, &mut buf, BLOCK, T).unwrap();
            if n == 0 {
                break;
            }
            let mut off = 0;
            while off < n {
                off += p.server.send(p.sid, &buf[off..n], false, T).unwrap();
            }
            total += n;
        }
        p.server
            .shutdown(p.sid, flowstack_client::posix::Shutdown::Write)
            .unwrap();
        drop(p.sa);
        p.server.forget(p.sid).unwrap();
        total
    });
    let data: Vec<u8> = (0..len).map(pattern).collect();
    let writer = {
        // The same Posix is used by two threads: one sends, one receives.
        let client = std::sync::Arc::new(p.client);
        let c2 = client.clone();
        let cid = p.cid;
        let out = data.clone();
        let w = std::thread::spawn(move || {
            let mut off = 0;
            while off < out.len() {
                off += c2
                    .send(cid, &out[off..(off + 70_000).min(out.len())], false, T)
                    .unwrap();
            }
            c2.shutdown(cid, flowstack_client::posix::Shutdown::Write)
                .unwrap();
        });
        let mut got = Vec::with_capacity(len);
        let mut buf = vec![0u8; 65536];
        loop {
            let n = client.recv(cid, &mut buf, BLOCK, T).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == data, "echo differs ({} of {} bytes)", got.len(), len);
        w
    };
    writer.join().unwrap();
    assert_eq!(server.join().unwrap(), len);
    drop(p.ca);
}

#[test]
fn nonblocking_connect_in_progress_then_connected_or_refused() {
    let d = daemon("nbconnect");
    let server = Posix::attach(&d.path).unwrap();
    let client = Posix::attach(&d.path).unwrap();
    let (_la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    server.listen(lid, 4, None).unwrap();
    let (ca, cid) = client.socket(Type::Stream).unwrap();
    assert_eq!(
        client.connect(cid, lo(port), true, None),
        Err(Errno::EINPROGRESS)
    );
    let again = client.connect(cid, lo(port), true, None);
    assert!(
        again == Err(Errno::EALREADY) || again == Err(Errno::EISCONN),
        "{again:?}"
    );
    // Before a wait on A in the kernel the filler is asked for (a non-blocking connect left
    // it out: readiness from the view needs none); then A becomes writable exactly when the
    // connect is done.
    client.tokens_on(cid).unwrap();
    assert!(wait_a(ca.as_fd(), false, true, POLL).unwrap().1);
    assert_eq!(
        client.connect(cid, lo(port), true, None),
        Err(Errno::EISCONN)
    );
    assert_eq!(client.take_error(cid).unwrap(), None);
    // Nobody listens on port+1: refused, through poll and SO_ERROR-style reporting.
    let (rb, rid) = client.socket(Type::Stream).unwrap();
    assert_eq!(
        client.connect(rid, lo(port + 1), true, None),
        Err(Errno::EINPROGRESS)
    );
    client.tokens_on(rid).unwrap();
    assert!(wait_a(rb.as_fd(), false, true, POLL).unwrap().1);
    assert_eq!(
        client.connect(rid, lo(port + 1), true, None),
        Err(Errno::ECONNREFUSED)
    );
    // Bind conflict across applications.
    let (_x, xid) = client.socket(Type::Stream).unwrap();
    assert_eq!(client.bind(xid, lo(port)), Err(Errno::EADDRINUSE));
}

#[test]
fn readiness_through_poll_on_the_placeholder() {
    let d = daemon("poll");
    let p = connected(&d.path);
    // Nothing to read yet: A not readable, and recv says EAGAIN.
    assert!(!wait_a(p.sa.as_fd(), true, false, Duration::ZERO).unwrap().0);
    let mut buf = [0u8; 16];
    assert_eq!(
        p.server.recv(p.sid, &mut buf, NONBLOCK, None),
        Err(Errno::EAGAIN)
    );
    // Data: A readable; after reading everything, unreadable again.
    assert_eq!(p.client.send(p.cid, b"ping", true, None).unwrap(), 4);
    assert!(wait_a(p.sa.as_fd(), true, false, POLL).unwrap().0);
    assert_eq!(p.server.recv(p.sid, &mut buf, BLOCK, T).unwrap(), 4);
    assert_eq!(&buf[..4], b"ping");
    assert_eq!(
        p.server.recv(p.sid, &mut buf, NONBLOCK, None),
        Err(Errno::EAGAIN)
    );
    assert!(!wait_a(p.sa.as_fd(), true, false, Duration::ZERO).unwrap().0);
    // Send space: fill it while the server does not read; A unwritable; the server reads,
    // A becomes writable again.
    let chunk = vec![7u8; 65536];
    let mut sent = 0;
    loop {
        match p.client.send(p.cid, &chunk, true, None) {
            Ok(n) => sent += n,
            Err(e) => {
                assert_eq!(e, Errno::EAGAIN);
                break;
            }
        }
        assert!(sent < 64 << 20, "the send buffer never filled");
    }
    assert!(!wait_a(p.ca.as_fd(), false, true, Duration::ZERO).unwrap().1);
    let mut got = 0;
    let mut big = vec![0u8; 65536];
    while got < sent {
        got += p.server.recv(p.sid, &mut big, BLOCK, T).unwrap();
    }
    assert!(wait_a(p.ca.as_fd(), false, true, POLL).unwrap().1);
    assert!(p.client.send(p.cid, b"more", true, None).unwrap() > 0);
    // End of stream makes A readable.
    p.client
        .shutdown(p.cid, flowstack_client::posix::Shutdown::Write)
        .unwrap();
    loop {
        assert!(wait_a(p.sa.as_fd(), true, false, POLL).unwrap().0);
        if p.server.recv(p.sid, &mut big, NONBLOCK, None) == Ok(0) {
            break;
        }
    }
}

#[test]
fn last_close_across_a_dup() {
    let d = daemon("dup");
    let p = connected(&d.path);
    let copy = p.ca.try_clone().unwrap();
    drop(p.ca);
    // One copy left: the connection is open, nothing arrives.
    let mut buf = [0u8; 8];
    assert_eq!(
        p.server
            .recv(p.sid, &mut buf, BLOCK, Some(Duration::from_millis(300))),
        Err(Errno::EAGAIN)
    );
    // The program closes its last number: the shim forgets it, the kernel drops the last A.
    p.client.forget(p.cid).unwrap();
    drop(copy);
    assert_eq!(
        p.server.recv(p.sid, &mut buf, BLOCK, T),
        Ok(0),
        "FIN after last close"
    );
}

#[test]
fn a_forked_child_adopts_the_socket_and_last_close_waits_for_it() {
    let d = daemon("fork");
    let p = connected(&d.path);
    // What the shim's fork does first: the child may hold every A now, so none is recycled
    // at the parent's last close (without it, the parent's close would end the connection).
    p.client.settle();
    match fork().unwrap() {
        Forked::Child => {
            // The child's Posix sees the pid change and registers anew; it attaches the
            // inherited placeholder by inode.
            let ok = (|| {
                let id = p.client.adopt(p.ca.as_fd()).ok()??;
                let msg = b"hello from the child";
                let mut off = 0;
                while off < msg.len() {
                    off += p.client.send(id, &msg[off..], false, T).ok()?;
                }
                let mut buf = [0u8; 5];
                let mut got = 0;
                while got < 5 {
                    let n = p.client.recv(id, &mut buf[got..], BLOCK, T).ok()?;
                    if n == 0 {
                        return None;
                    }
                    got += n;
                }
                (&buf == b"reply").then_some(())
            })();
            exit_now(if ok.is_some() { 0 } else { 1 });
        }
        Forked::Parent(pid) => {
            // The parent drops its own copy at once: the child's keeps the socket open.
            p.client.forget(p.cid).unwrap();
            drop(p.ca);
            let want = b"hello from the child";
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            while got.len() < want.len() {
                let n = p.server.recv(p.sid, &mut buf, BLOCK, T).unwrap();
                assert!(n > 0, "EOF before the child wrote");
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(&got, want);
            assert_eq!(p.server.send(p.sid, b"reply", false, T).unwrap(), 5);
            assert_eq!(wait_exit(pid).unwrap(), 0, "child failed");
            // The child exited: its copy is gone too, the last close sends FIN.
            assert_eq!(p.server.recv(p.sid, &mut buf, BLOCK, T), Ok(0));
        }
    }
}

#[test]
fn an_unrelated_descriptor_is_not_adopted() {
    let d = daemon("notours");
    let app = Posix::attach(&d.path).unwrap();
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    assert_eq!(app.adopt(a.as_fd()).unwrap(), None);
    assert_eq!(app.adopt(a.as_fd()).unwrap(), None, "cached");
    let f = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(app.adopt(f.as_fd()).unwrap(), None);
}

#[test]
fn daemon_death_fails_a_blocked_recv() {
    let d = daemon("death");
    let p = connected(&d.path);
    let waiter = std::thread::spawn(move || {
        let mut buf = [0u8; 8];
        // Far longer than the test waits: only the daemon's death can end it early.
        let r = p
            .server
            .recv(p.sid, &mut buf, BLOCK, Some(Duration::from_secs(60)));
        (r, p)
    });
    std::thread::sleep(Duration::from_millis(100));
    d.stop().unwrap();
    let (r, p) = waiter.join().unwrap();
    assert_eq!(r, Err(Errno::ECONNRESET));
    // A sender finds out at the latest when its send buffer is full and it would wait.
    let chunk = vec![1u8; 65536];
    let mut r = Ok(0);
    for _ in 0..100 {
        r = p
            .client
            .send(p.cid, &chunk, false, Some(Duration::from_secs(60)));
        if r.is_err() {
            break;
        }
    }
    assert_eq!(r, Err(Errno::EPIPE));
}

#[test]
fn stats_show_sockets_owners_and_reported_fallbacks() {
    use flowstack_api::record::ReportKind;
    let d = daemon("stats");
    let p = connected(&d.path);
    p.client
        .report(
            ReportKind::NotCarried,
            Some(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 53), 53)),
        )
        .unwrap();
    // A sync call after the async report: the daemon has taken it.
    assert!(!p.client.carries(lo(9)).unwrap());
    let s = flowstack_offload::stats::query(&d.path).unwrap();
    let me = std::process::id();
    let estab: Vec<_> = s.sockets.iter().filter(|r| r.state == "ESTAB").collect();
    assert_eq!(estab.len(), 2, "{:#?}", s.sockets);
    assert!(estab
        .iter()
        .all(|r| r.pids == vec![me] && r.placeholder && r.path == "flowstack"));
    let local = p.client.local_addr(p.cid).unwrap().to_string();
    assert!(estab.iter().any(|r| r.local == local));
    assert_eq!(s.sockets.iter().filter(|r| r.state == "LISTEN").count(), 1);
    assert_eq!(s.counters["FlowstackdFallbackNotCarried"], 1);
    assert_eq!(s.counters["FlowstackdApps"], 2);
    assert!(s.counters["TcpActiveOpens"] >= 1);
    assert_eq!(s.apps.len(), 2);
    assert!(s.table().contains("ESTAB"));
}

#[test]
fn the_per_application_socket_limit_refuses_with_enobufs_and_counts() {
    let dir = std::env::temp_dir().join(format!("flowstack-posix-{}-limit", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = Daemon::spawn(&DaemonConfig {
        socket: dir.join("d.sock"),
        max_sockets_per_app: 3,
        ..DaemonConfig::default()
    })
    .unwrap();
    let app = Posix::attach(&d.path).unwrap();
    let other = Posix::attach(&d.path).unwrap();
    let mut socks: Vec<_> = (0..3).map(|_| app.socket(Type::Stream).unwrap()).collect();
    // socket() posts its attach without waiting (one round trip less per connection): the
    // refusal is the socket's next call's error, and the socket is gone after it.
    let (_over, over) = app.socket(Type::Stream).unwrap();
    assert_eq!(app.bind(over, lo(0)).err(), Some(Errno(105)));
    assert_eq!(app.bind(over, lo(0)).err(), Some(Errno::EBADF));
    // Another application has its own allowance.
    assert!(other.socket(Type::Stream).is_ok());
    // Forgetting one makes room again.
    let (a, id) = socks.pop().unwrap();
    app.forget(id).unwrap();
    drop(a);
    assert!(app.socket(Type::Stream).is_ok());
    let s = flowstack_offload::stats::query(&d.path).unwrap();
    assert_eq!(s.counters["FlowstackdLimitsHit"], 1);
}

/// An application whose registration socket leaked into a child that lives on is still
/// seen to exit (pidfd): its connection is closed. The exited application is not reaped
/// before the check (a zombie still answers `kill(pid, 0)`), so only the pidfd can tell.
#[test]
fn an_exited_app_is_noticed_although_its_registration_socket_leaked_into_a_child() {
    use flowstack_api::Sockets;
    let d = daemon("pidfd");
    let server = Posix::attach(&d.path).unwrap();
    let (_la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    server.listen(lid, 4, None).unwrap();
    let pidfile = std::env::temp_dir().join(format!("flowstack-posix-{}-gc", std::process::id()));
    let path = d.path.clone();
    let app_pid = match fork().unwrap() {
        Forked::Child => {
            let ok = (|| {
                let mut app = flowstack_client::Client::connect(&path).ok()?;
                let c = app.connect_to(lo(port), Duration::from_secs(20)).ok()?;
                app.send_all(c, b"hi", Duration::from_secs(20)).ok()?;
                // The grandchild inherits the registration socket and outlives us.
                match fork().ok()? {
                    Forked::Child => {
                        std::thread::sleep(Duration::from_secs(60));
                        exit_now(0)
                    }
                    Forked::Parent(gc) => std::fs::write(&pidfile, gc.to_string()).ok()?,
                }
                let _ = app.tcp_send(c, b"");
                Some(())
            })();
            exit_now(if ok.is_some() { 0 } else { 1 });
        }
        Forked::Parent(pid) => pid,
    };
    let (_sa, sid, _, _) = server.accept(lid, false, T).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(server.recv(sid, &mut buf, BLOCK, T), Ok(2));
    // The application exits (not reaped yet); its grandchild keeps its socket open.
    let r = server.recv(sid, &mut buf, BLOCK, T);
    let gc: Option<u32> = std::fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.parse().ok());
    if let Some(gc) = gc {
        let _ = std::process::Command::new("kill")
            .arg(gc.to_string())
            .status();
    }
    let _ = std::fs::remove_file(&pidfile);
    assert_eq!(wait_exit(app_pid).unwrap(), 0);
    assert!(gc.is_some(), "the grandchild never started");
    assert!(
        matches!(r, Ok(0) | Err(Errno::ECONNRESET)),
        "the exited application's connection stayed open: {r:?}"
    );
}

/// One listener shared by a parent and its forked child (nginx: the master listens, workers
/// accept): each accepts its own connection from the same listening socket.
#[test]
fn a_listener_shared_after_fork_accepts_in_both_processes() {
    let d = daemon("sharedlisten");
    let owner = Posix::attach(&d.path).unwrap();
    let (la, lid) = owner.socket(Type::Stream).unwrap();
    let port = owner.bind(lid, lo(0)).unwrap();
    owner.listen(lid, 16, None).unwrap();
    let path = d.path.clone();
    match fork().unwrap() {
        Forked::Child => {
            let ok = (|| {
                let l = owner.adopt(la.as_fd()).ok()??;
                let (_a, c, _, _) = owner.accept(l, false, T).ok()?;
                let mut b = [0u8; 5];
                let mut got = 0;
                while got < 5 {
                    got += owner.recv(c, &mut b[got..], BLOCK, T).ok()?;
                }
                owner.send(c, &b, false, T).ok()?;
                let mut end = [0u8; 1];
                (owner.recv(c, &mut end, BLOCK, T).ok()? == 0).then_some(())
            })();
            exit_now(if ok.is_some() { 0 } else { 1 });
        }
        Forked::Parent(pid) => {
            let client = Posix::attach(&path).unwrap();
            let mut conns = vec![];
            for _ in 0..2 {
                let (a, id) = client.socket(Type::Stream).unwrap();
                client.connect(id, lo(port), false, T).unwrap();
                client.send(id, b"hello", false, T).unwrap();
                conns.push((a, id));
            }
            // The parent accepts one; the child takes the other.
            let (_a, c, _, _) = owner.accept(lid, false, T).unwrap();
            let mut b = [0u8; 5];
            let mut got = 0;
            while got < 5 {
                got += owner.recv(c, &mut b[got..], BLOCK, T).unwrap();
            }
            owner.send(c, &b, false, T).unwrap();
            for (_, id) in &conns {
                let mut e = [0u8; 5];
                let mut got = 0;
                while got < 5 {
                    got += client.recv(*id, &mut e[got..], BLOCK, T).unwrap();
                }
                assert_eq!(&e, b"hello");
            }
            for (a, id) in conns {
                client.forget(id).unwrap();
                drop(a);
            }
            assert_eq!(wait_exit(pid).unwrap(), 0, "the child's accept failed");
        }
    }
}

/// A listener that also listens in the kernel (the shim's default): a kernel client makes
/// the placeholder readable; the program accepts from the kernel listener itself; after that
/// (and a flowstack accept finding nothing) the placeholder is quiet again.
#[test]
fn a_kernel_listener_next_to_a_flowstack_listener_makes_the_placeholder_readable() {
    let d = daemon("kernlisten");
    let app = Posix::attach(&d.path).unwrap();
    let (la, lid) = app.socket(Type::Stream).unwrap();
    // The kernel chooses a port free in the kernel; flowstack binds the same one.
    let k = std::net::TcpListener::bind(lo(0)).unwrap();
    let port = k.local_addr().unwrap().port();
    assert_eq!(app.bind(lid, lo(port)).unwrap(), port);
    k.set_nonblocking(true).unwrap();
    let kfd: OwnedFd = k.try_clone().unwrap().into();
    app.listen(lid, 8, Some(kfd)).unwrap();
    assert!(!wait_a(la.as_fd(), true, false, Duration::ZERO).unwrap().0);
    let _kc = std::net::TcpStream::connect(lo(port)).unwrap();
    assert!(
        wait_a(la.as_fd(), true, false, POLL).unwrap().0,
        "no token for the kernel path"
    );
    let (_s, _) = k
        .accept()
        .expect("the kernel connection waits in the kernel listener");
    assert_eq!(app.accept(lid, true, None).err(), Some(Errno::EAGAIN));
    assert!(
        !wait_a(la.as_fd(), true, false, Duration::ZERO).unwrap().0,
        "token left over"
    );
    // The flowstack path on the same placeholder.
    let client = Posix::attach(&d.path).unwrap();
    let (_ca, cid) = client.socket(Type::Stream).unwrap();
    client.connect(cid, lo(port), false, T).unwrap();
    assert!(wait_a(la.as_fd(), true, false, POLL).unwrap().0);
    assert!(app.accept(lid, true, None).is_ok());
}

/// iperf3's pattern on blocking sockets: `select` says readable, then one blocking `read` or
/// `accept`. Once a recv drained the socket (or an accept took the last connection), its
/// placeholder must not stay readable — a stale token made iperf3 block in `read` on its
/// control socket (or `accept`) while the event it waited for was elsewhere.
#[test]
fn a_drained_socket_or_listener_is_unreadable_right_after_recv_or_accept() {
    let d = daemon("stale");
    let server = Posix::attach(&d.path).unwrap();
    let client = Posix::attach(&d.path).unwrap();
    let (la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    server.listen(lid, 16, None).unwrap();
    let mut conns = Vec::new();
    for round in 0..3u8 {
        let (ca, cid) = client.socket(Type::Stream).unwrap();
        client.connect(cid, lo(port), false, T).unwrap();
        // Written right after the blocking connect, before the server accepted (the cookie).
        assert_eq!(client.send(cid, &[round; 37], false, T).unwrap(), 37);
        assert!(wait_a(la.as_fd(), true, false, POLL).unwrap().0);
        let (sa, sid, _, _) = server.accept(lid, false, T).unwrap();
        assert!(
            !wait_a(la.as_fd(), true, false, Duration::ZERO).unwrap().0,
            "listener still readable after its only connection was accepted"
        );
        // The bytes that arrived before the accept make the new socket readable in the view
        // (no token for them: the accept does not wait for its placeholder's answer, and a
        // token written after they were read would be stale; a wait on A looks at the view
        // first, as the shim's poll does; the blocking recv below waits for them)...
        let mut buf = [0u8; 64];
        let mut got = 0;
        while got < 37 {
            got += server.recv(sid, &mut buf[got..], BLOCK, T).unwrap();
        }
        assert_eq!(&buf[..37], &[round; 37]);
        // ...and drained, it is not, without an EAGAIN recv first.
        assert!(
            !wait_a(sa.as_fd(), true, false, Duration::ZERO).unwrap().0,
            "socket still readable after recv drained it"
        );
        // One message at a time, as a control channel: each wakes the poll exactly once.
        for m in 0..3u8 {
            assert_eq!(client.send(cid, &[m], false, T).unwrap(), 1);
            assert!(wait_a(sa.as_fd(), true, false, POLL).unwrap().0);
            assert_eq!(server.recv(sid, &mut buf, BLOCK, T).unwrap(), 1);
            assert_eq!(buf[0], m);
            assert!(!wait_a(sa.as_fd(), true, false, Duration::ZERO).unwrap().0);
        }
        conns.push((ca, cid, sa, sid));
    }
}

/// `carries` is asked once per destination and remembered; a refused flowstack connect (the
/// listener went away) forgets it, so the next `carries` asks the daemon again.
#[test]
fn a_carried_destination_is_remembered_until_a_connect_is_refused() {
    let d = daemon("carried");
    let server = Posix::attach(&d.path).unwrap();
    let (la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    server.listen(lid, 4, None).unwrap();
    let client = Posix::attach(&d.path).unwrap();
    assert_eq!(client.carries(lo(port)), Ok(true));
    // The listener goes away; a process that never asked sees it at once.
    server.forget(lid).unwrap();
    drop(la);
    let fresh = Posix::attach(&d.path).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fresh.carries(lo(port)) == Ok(true) {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener never went away"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The client still goes by what it learnt: its connect goes to flowstack, is refused ...
    assert_eq!(client.carries(lo(port)), Ok(true));
    let (_a, id) = client.socket(Type::Stream).unwrap();
    assert_eq!(
        client.connect(id, lo(port), false, Some(Duration::from_secs(10))),
        Err(Errno::ECONNREFUSED)
    );
    // ... and then it asks again.
    assert_eq!(client.carries(lo(port)), Ok(false));
}

/// Accept-ahead (`Posix::accept_ahead`, what the shim asks for a listener in an epoll set):
/// after an accept, the next connection is handed to this process as it comes — readable
/// in the view (`ready_many`) and through a token on the listener's placeholder — and
/// `accept` takes it; with the accept asked ahead and nothing handed, a non-blocking accept
/// answers `EAGAIN`, a blocking one waits for the token. Two connections before an accept
/// are both seen through the placeholder (the second's token is written again when the
/// first's is taken: `TokenCleared` after a connection was handed with a token out).
#[test]
fn accepts_asked_ahead_are_seen_in_the_view_and_through_the_placeholder() {
    let d = daemon("ahead");
    let server = Posix::attach(&d.path).unwrap();
    let client = Posix::attach(&d.path).unwrap();
    let (la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    server.listen(lid, 16, None).unwrap();
    server.accept_ahead(lid).unwrap();
    let readable = |fd: &OwnedFd, t| wait_a(fd.as_fd(), true, false, t).unwrap().0;
    let mut keep = Vec::new();
    for round in 0..4u8 {
        let (ca, cid) = client.socket(Type::Stream).unwrap();
        client.connect(cid, lo(port), false, T).unwrap();
        assert!(readable(&la, POLL), "round {round}: no token");
        if round > 0 {
            // Handed ahead: the token follows the events, so the view has it now.
            let mut out = Vec::new();
            server
                .ready_many([lid].into_iter(), &[true], true, &mut out)
                .unwrap();
            assert!(out[0].is_some_and(|f| f.r.readable), "round {round}: view");
        }
        let (sa, sid, peer, _) = server.accept(lid, true, None).unwrap();
        assert_eq!(peer, client.local_addr(cid).unwrap());
        assert!(!readable(&la, Duration::ZERO), "round {round}: stale token");
        assert_eq!(server.accept(lid, true, None).err(), Some(Errno::EAGAIN));
        assert_eq!(client.send(cid, &[round], false, T).unwrap(), 1);
        let mut b = [0u8; 1];
        assert_eq!(server.recv(sid, &mut b, BLOCK, T).unwrap(), 1);
        assert_eq!(b[0], round);
        keep.push((ca, sa));
    }
    // Two at once.
    let two: Vec<_> = (0..2)
        .map(|_| {
            let (ca, cid) = client.socket(Type::Stream).unwrap();
            client.connect(cid, lo(port), false, T).unwrap();
            (ca, cid)
        })
        .collect();
    for (i, (_, cid)) in two.iter().enumerate() {
        assert!(readable(&la, POLL), "connection {i} of two: no token");
        let (sa, _, peer, _) = server.accept(lid, true, None).unwrap();
        assert_eq!(peer, client.local_addr(*cid).unwrap());
        keep.push((sa.try_clone().unwrap(), sa));
    }
    // A blocking accept with the accept asked ahead waits for the handed connection.
    std::thread::scope(|s| {
        let c = s.spawn(|| {
            let (ca, cid) = client.socket(Type::Stream).unwrap();
            client.connect(cid, lo(port), false, T).unwrap();
            (ca, client.local_addr(cid).unwrap())
        });
        let (_sa, _, peer, _) = server.accept(lid, false, T).unwrap();
        let (_ca, local) = c.join().unwrap();
        assert_eq!(peer, local);
    });
}

/// A POSIX socket's `recv` copies its bytes once, straight from the receive area (`held`),
/// as the native client's `tcp_recv` does: 8 MiB byte-exact with reads of odd sizes, with
/// `MSG_PEEK` and `FIONREAD` in between (a peek moves the held bytes into the socket's queue
/// and leaves them unread). Without it every byte was copied into the queue first.
#[test]
fn posix_recv_reads_straight_from_the_receive_area() {
    const LEN: usize = 8 << 20;
    const PEEK: RecvFlags = RecvFlags::PEEK;
    let d = daemon("held");
    let Pair {
        server,
        client,
        sa: _sa,
        sid,
        ca: _ca,
        cid,
    } = connected(&d.path);
    let sender = std::thread::spawn(move || {
        let data: Vec<u8> = (0..LEN).map(pattern).collect();
        let mut at = 0;
        let mut i = 0;
        while at < LEN {
            let k = [131_072, 13, 700_001, 4_096][i % 4].min(LEN - at);
            i += 1;
            at += client.send(cid, &data[at..at + k], false, T).unwrap();
        }
        client.shutdown(cid, Shutdown::Write).unwrap();
        client
    });
    let mut buf = vec![0u8; 200_003];
    // Two peeks on the way, at these stream offsets.
    const PEEK_AT: [usize; 2] = [2 << 20, 5 << 20];
    let (mut got, mut i, mut peeks) = (0usize, 0usize, 0);
    while got < LEN {
        let want = [200_003, 7, 131_072, 4_097][i % 4];
        i += 1;
        if peeks < PEEK_AT.len() && got >= PEEK_AT[peeks] {
            // Peeked bytes are the next ones, still there for the next recv.
            let n = server.recv(sid, &mut buf[..want], PEEK, T).unwrap();
            assert!(n > 0);
            for (k, &x) in buf[..n].iter().enumerate() {
                assert_eq!(x, pattern(got + k), "peeked byte {}", got + k);
            }
            assert!(server.readable_bytes(sid).unwrap() >= n);
            peeks += 1;
        }
        let n = server.recv(sid, &mut buf[..want], BLOCK, T).unwrap();
        assert!(n > 0, "early end of stream at {got}");
        for (k, &x) in buf[..n].iter().enumerate() {
            assert_eq!(x, pattern(got + k), "byte {}", got + k);
        }
        got += n;
    }
    assert_eq!(
        server.recv(sid, &mut buf, BLOCK, T).unwrap(),
        0,
        "end of stream"
    );
    let _client = sender.join().unwrap();
    // Copied into the queue: what came before the first recv and what each peek moved
    // there, each at most the receive credit (the daemon delivers no more ahead of reads).
    let copied = server.rx_copied().unwrap();
    assert_eq!(peeks, PEEK_AT.len());
    assert!(
        copied <= (peeks + 1) as u64 * SOCK_RCVBUF,
        "{copied} of {LEN} bytes copied into the queue ({peeks} peeks)"
    );
}
