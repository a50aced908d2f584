//! Short connections through the daemon (issue 15's crr): the request posted behind the
//! connect (`Client::connect_send`) reaches the server with its accept, a connection's
//! close does not wait yet is taken before anything posted after it (`close_sync` waits),
//! and accept-ahead neither loses nor strands connections.

mod common;

use common::{daemon, listen, lo, pattern, T};
use flowstack_api::{SocketError, Sockets};
use flowstack_client::Client;
use flowstack_offload::{Daemon, DaemonConfig};
use std::time::{Duration, Instant};

/// Connections per counting test.
const N: usize = 200;

/// Every request sent behind its connect comes back byte-exact through `recv` after the
/// accept, and the server wakes about once per connection (accept with its request, then
/// the end of stream; its close and the next accept no longer sleep). Before, it slept
/// 3.5-4 times per connection: accept, first recv, end of stream, close, accept.
#[test]
fn request_behind_connect_arrives_with_the_accept() {
    let d = daemon("short-req", 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    srv.set_spin(Duration::ZERO);
    cli.set_spin(Duration::ZERO);
    let l = listen(&mut srv, 7510).unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        let mut sleeps = 0;
        for i in 0..N {
            let before = srv.sleeps();
            let c = srv.accept(l, T).unwrap();
            let len = 1 + i % 200;
            let mut got = 0;
            while got < len {
                got += srv.recv(c, &mut buf[got..len], T).unwrap();
            }
            for (k, &b) in buf[..len].iter().enumerate() {
                assert_eq!(b, pattern(i + k), "connection {i}, byte {k}");
            }
            srv.send_all(c, &buf[..len], T).unwrap();
            assert_eq!(srv.recv(c, &mut buf, T).unwrap(), 0);
            srv.close(c, T).unwrap();
            if i > 0 {
                sleeps += srv.sleeps() - before;
            }
        }
        sleeps
    });
    let mut req = [0u8; 256];
    let mut back = [0u8; 256];
    for i in 0..N {
        let len = 1 + i % 200;
        for (k, b) in req[..len].iter_mut().enumerate() {
            *b = pattern(i + k);
        }
        let (c, sent) = cli.connect_send(lo(7510), &req[..len], T).unwrap();
        assert_eq!(sent, len, "a small request fits the send buffer whole");
        let mut got = 0;
        while got < len {
            got += cli.recv(c, &mut back[got..len], T).unwrap();
        }
        assert_eq!(&back[..len], &req[..len]);
        cli.close(c, T).unwrap();
    }
    let sleeps = server.join().unwrap() as f64 / (N - 1) as f64;
    assert!(
        sleeps <= 2.5,
        "server slept {sleeps:.2} times per connection (expected about 1-2)"
    );
    drop(cli);
    d.stop().unwrap();
}

/// A connection's close returns without waiting for the daemon (a zero timeout is enough),
/// and the daemon takes it before the application's next call: at a limit of three
/// sockets, one application holding a listener connects to itself, accepts, closes both
/// ends and connects again, and never finds the limit reached. (The accept asked ahead
/// meets the limit meanwhile; that answer is not the application's error.) A listener's
/// close still waits, and its port can be listened on again at once.
#[test]
fn close_does_not_wait_yet_frees_before_the_next_call() {
    let d = Daemon::spawn(&DaemonConfig {
        socket: common::sock_path("short-close"),
        max_sockets_per_app: 3,
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut app = Client::connect(&d.path).unwrap();
    let l = listen(&mut app, 7511).unwrap();
    for i in 0..N {
        let c = match app.connect_to(lo(7511), T) {
            Ok(c) => c,
            Err(e) => panic!("connection {i}: {e:?} (the previous closes not taken first?)"),
        };
        let s = app.accept(l, T).unwrap();
        app.close(c, Duration::ZERO).unwrap();
        app.close(s, Duration::ZERO).unwrap();
    }
    app.close(l, T).unwrap();
    let l = listen(&mut app, 7511).unwrap();
    app.close(l, T).unwrap();
    drop(app);
    d.stop().unwrap();
}

/// The daemon half of `close_sync_waits_for_the_daemon_and_close_does_not` (runs only when
/// asked): a daemon in a process of its own, which the parent can stop with SIGSTOP.
#[test]
#[ignore]
fn child_daemon() {
    let Ok(path) = std::env::var("FLOWSTACK_TEST_DAEMON_SOCKET") else {
        return;
    };
    let d = Daemon::spawn(&DaemonConfig {
        socket: path.into(),
        ..DaemonConfig::default()
    })
    .unwrap();
    // Until the parent kills it (bounded, should the parent fail).
    std::thread::sleep(Duration::from_secs(60));
    d.stop().unwrap();
}

/// The two close modes, told apart by a daemon that does not run: with the daemon stopped
/// (SIGSTOP), a connection's `close` (async) returns at once, `close_sync` waits for the
/// daemon's completion and gives up with `TimedOut` at its timeout. Once the daemon runs
/// again both closes are taken, in order: a sync close of the listener completes, and the
/// application holds no socket.
#[test]
fn close_sync_waits_for_the_daemon_and_close_does_not() {
    use std::process::{Command, Stdio};
    let path = common::sock_path("short-csync");
    /// Kills (SIGKILL ends a stopped process too) and reaps the daemon, also on a panic.
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Reaped(
        Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "child_daemon", "--nocapture"])
            .env("FLOWSTACK_TEST_DAEMON_SOCKET", &path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < T, "daemon did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut app = Client::connect(&path).unwrap();
    let l = listen(&mut app, 7513).unwrap();
    let c = app.connect_to(lo(7513), T).unwrap();
    let s = app.accept(l, T).unwrap();
    let pid = child.0.id();
    flowstack_sys::process::pause(pid, true).unwrap();
    // kill(2) returns before a running thread has stopped: wait until every thread is.
    let stopped = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                // The state follows the command name in parentheses.
                stat.rsplit_once(") ")
                    .is_some_and(|(_, r)| r.starts_with('T'))
            })
    };
    while !stopped() {
        assert!(start.elapsed() < T, "the daemon did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = Instant::now();
    assert_eq!(app.close(c, T), Ok(()), "async: posted, not waited for");
    assert!(t.elapsed() < T);
    assert_eq!(
        app.close_sync(s, Duration::from_millis(300)),
        Err(SocketError::TimedOut),
        "sync: waits for a completion a stopped daemon cannot post"
    );
    flowstack_sys::process::pause(pid, false).unwrap();
    assert_eq!(app.close_sync(l, T), Ok(()));
    let st = flowstack_offload::stats::query(&path).unwrap();
    let me = st.apps.iter().find(|a| a.id == app.app_id()).unwrap();
    assert_eq!(me.sockets, 0, "both connection closes were taken too");
    drop(app);
    drop(child);
}

/// An accept asked ahead and never taken is closed with its listener: the client sees its
/// connection end instead of waiting forever. An accept that timed out stays in flight, and
/// the next accept returns the connection it found.
#[test]
fn accept_ahead_is_closed_with_its_listener_and_survives_timeouts() {
    let d = daemon("short-ahead", 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7512).unwrap();
    assert_eq!(
        srv.accept(l, Duration::from_millis(20)),
        Err(SocketError::TimedOut)
    );
    let a = cli.connect_to(lo(7512), T).unwrap();
    let sa = srv.accept(l, T).unwrap();
    // The next accept is in flight: this connection is accepted by the daemon for us.
    let b = cli.connect_send(lo(7512), b"left behind", T).unwrap().0;
    // Its data shows the daemon gave it to us (accepted ahead) before we close the listener.
    let deadline = std::time::Instant::now() + T;
    while srv.tcp_poll(l).map(|r| !r.readable).unwrap_or(true) {
        assert!(std::time::Instant::now() < deadline, "no accept ahead");
        srv.wait(Duration::from_millis(50)).unwrap();
    }
    srv.close(l, T).unwrap();
    let mut buf = [0u8; 16];
    match cli.recv(b, &mut buf, T) {
        Ok(0) | Err(SocketError::ConnectionReset) => {}
        r => panic!("the unclaimed connection should end, got {r:?}"),
    }
    // The connection taken before is untouched.
    cli.send_all(a, b"still here", T).unwrap();
    let n = srv.recv(sa, &mut buf, T).unwrap();
    assert_eq!(&buf[..n], b"still here");
    let _ = cli.close(a, T);
    let _ = cli.close(b, T);
    let _ = srv.close(sa, T);
    drop(cli);
    drop(srv);
    d.stop().unwrap();
}

/// An accept asked ahead that still waits in the daemon when its listener closes is
/// dropped there unanswered; the listener's close (once it completes) leaves no entry for it
/// in the client either, and the application keeps working.
#[test]
fn a_listener_closed_under_a_waiting_accept_ahead_leaves_nothing() {
    let d = daemon("short-stale", 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    assert_eq!(srv.accepts_in_flight(), (0, 0));
    let l = listen(&mut srv, 7513).unwrap();
    let a = cli.connect_to(lo(7513), T).unwrap();
    let sa = srv.accept(l, T).unwrap();
    // The next accept is asked ahead and waits in the daemon: nothing connects.
    assert_eq!(srv.accepts_in_flight(), (1, 1));
    srv.close(l, T).unwrap();
    assert_eq!(
        srv.accepts_in_flight(),
        (0, 0),
        "stale accept-ahead entries"
    );
    // The port is free and the accepted connection untouched.
    let l = listen(&mut srv, 7513).unwrap();
    cli.send_all(a, b"ok", T).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(srv.recv(sa, &mut buf, T).unwrap(), 2);
    let b = cli.connect_to(lo(7513), T).unwrap();
    let sb = srv.accept(l, T).unwrap();
    for (c, s) in [(a, sa), (b, sb)] {
        cli.close(c, T).unwrap();
        srv.close(s, T).unwrap();
    }
    srv.close(l, T).unwrap();
    assert_eq!(srv.accepts_in_flight(), (0, 0));
    drop(cli);
    drop(srv);
    d.stop().unwrap();
}
