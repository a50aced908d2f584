//! flowstackd end to end: applications (threads with their own `Client`, or child processes)
//! over one daemon's loopback. Every test uses a private socket path and bounded waits.

use flowstack_api::{SocketError, Sockets, TcpHandle};
use flowstack_client::Client;
use flowstack_offload::DaemonHandle;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{echo_through, listen, lo, pattern, T};

/// A daemon of `engines` engine threads; with several, the applications of this process
/// are spread over them, so every connection between two of them crosses engines.
fn daemon(name: &str, engines: usize) -> DaemonHandle {
    common::daemon(&format!("{name}-{engines}"), engines, engines > 1)
}

/// Each test, on one engine and on two (`one_engine::NAME`, `two_engines::NAME`).
macro_rules! on_one_and_two_engines {
    ($($name:ident),* $(,)?) => {
        mod one_engine {
            $(#[test]
            fn $name() {
                super::$name(1)
            })*
        }
        mod two_engines {
            $(#[test]
            fn $name() {
                super::$name(2)
            })*
        }
    };
}

on_one_and_two_engines!(
    two_apps_echo_4_mib_byte_exact,
    async_connect_then_send_before_the_handshake,
    eaddrinuse_across_two_apps,
    garbage_in_one_apps_rings_hurts_nobody_else,
    killed_app_has_its_connections_closed,
);

/// An echo server on `port` serving one connection, in its own application.
fn echo_server(path: PathBuf, port: u16) -> std::thread::JoinHandle<u64> {
    let mut app = Client::connect(&path).unwrap();
    let l = listen(&mut app, port).unwrap();
    common::echo_server(app, l)
}

fn two_apps_echo_4_mib_byte_exact(engines: usize) {
    let d = daemon("echo", engines);
    let server = echo_server(d.path.clone(), 7000);
    let mut app = Client::connect(&d.path).unwrap();
    let c = app.connect_to(lo(7000), T).unwrap();
    echo_through(&mut app, c, 4 << 20, true);
    app.close(c, T).unwrap();
    assert_eq!(server.join().unwrap(), 4 << 20);
    // Both addresses of the loopback reach the listener.
    let server = echo_server(d.path.clone(), 7001);
    let c = app
        .connect_to(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 7001), T)
        .unwrap();
    echo_through(&mut app, c, 100_000, true);
    assert_eq!(server.join().unwrap(), 100_000);
    d.stop().unwrap();
}

fn async_connect_then_send_before_the_handshake(engines: usize) {
    let d = daemon("async", engines);
    let server = echo_server(d.path.clone(), 7100);
    let mut app = Client::connect(&d.path).unwrap();
    // Posted and returned: the handle is usable at once, the bytes wait for the handshake.
    let c = app.tcp_connect(lo(7100)).unwrap();
    app.tcp_set_nodelay(c, true).unwrap();
    assert_eq!(app.tcp_send(c, b"hello"), Ok(5));
    let mut b = [0u8; 5];
    let mut got = 0;
    while got < 5 {
        got += app.recv(c, &mut b[got..], T).unwrap();
    }
    assert_eq!(&b, b"hello");
    app.tcp_shutdown(c).unwrap();
    assert_eq!(app.recv(c, &mut b, T), Ok(0));
    assert_eq!(server.join().unwrap(), 5);
    // A refused connection is reported on a later call.
    let c = app.tcp_connect(lo(7199)).unwrap();
    let r = app.recv(c, &mut b, T);
    assert_eq!(r, Err(SocketError::ConnectionRefused));
    assert!(app.connect_to(lo(7199), T).is_err());
}

fn eaddrinuse_across_two_apps(engines: usize) {
    let d = daemon("inuse", engines);
    let mut a = Client::connect(&d.path).unwrap();
    let mut b = Client::connect(&d.path).unwrap();
    let la = a.tcp_listen(8000, 8).unwrap();
    assert_eq!(
        a.accept(la, Duration::from_millis(50)),
        Err(SocketError::TimedOut)
    );
    // Async listen: the failure comes back on the next call.
    let lb = b.tcp_listen(8000, 8).unwrap();
    assert_eq!(b.accept(lb, T), Err(SocketError::AddrInUse));
    // The owner closing frees the port for the other application.
    a.close(la, T).unwrap();
    let lb = b.tcp_listen(8000, 8).unwrap();
    assert_eq!(
        b.accept(lb, Duration::from_millis(50)),
        Err(SocketError::TimedOut)
    );
    // The connection the timed-out accept was waiting for still reaches the listener.
    let c = a.connect_to(lo(8000), T).unwrap();
    let deadline = Instant::now() + T;
    let s = loop {
        match b.tcp_accept(lb) {
            Ok(s) => break s,
            Err(SocketError::WouldBlock) => assert!(Instant::now() < deadline),
            Err(e) => panic!("{e:?}"),
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    a.send_all(c, b"x", T).unwrap();
    let mut one = [0u8; 1];
    assert_eq!(b.recv(s, &mut one, T), Ok(1));
    // Handles are per application: b cannot name a's connection.
    let fake = TcpHandle::from_raw(c.index());
    assert!(b.tcp_send(fake, b"nope").is_err() || c.index() == s.index());
}

fn garbage_in_one_apps_rings_hurts_nobody_else(engines: usize) {
    use flowstack_sys::SharedRegion;
    let d = daemon("garbage", engines);
    let server = echo_server(d.path.clone(), 7200);
    let mut good = Client::connect(&d.path).unwrap();
    let c = good.connect_to(lo(7200), T).unwrap();
    echo_through_partial(&mut good, c, 10_000);
    // A hostile application registers by hand and scribbles over its whole region.
    for round in 0..3u64 {
        let mut s = std::os::unix::net::UnixStream::connect(&d.path).unwrap();
        std::io::Write::write_all(&mut s, flowstack_api::region::REGISTER).unwrap();
        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        flowstack_sys::fdpass::recv_fds(&s, &mut buf, &mut fds).unwrap();
        assert_eq!(fds.len(), 2);
        let bell = flowstack_sys::eventfd::EventFd::from_fd(fds.pop().unwrap());
        let r = SharedRegion::from_fd(fds.pop().unwrap()).unwrap();
        assert!(r.write_at(0, &[1]).is_some());
        let mut x = 0x1234_5678_9abc_def0u64 ^ round;
        let mut noise = vec![0u8; r.len()];
        for chunk in noise.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = chunk.len();
            chunk.copy_from_slice(&x.to_le_bytes()[..n]);
        }
        if round == 1 {
            // Keep the ring indices sane but fill the records with garbage commands that
            // name handles and spans: each must be rejected or confined to this app.
            let ctl = 4096;
            let data = ctl + 192;
            noise[..data].fill(0);
            noise[ctl..ctl + 8].copy_from_slice(&(64 * 1000u64).to_le_bytes());
            for k in 0..1000 {
                let at = data + k * 64;
                noise[at..at + 4].copy_from_slice(&60u32.to_le_bytes());
            }
        }
        r.write_at(0, &noise).unwrap();
        bell.signal().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    echo_through(&mut good, c, 1 << 20, true);
    assert!(server.join().is_ok());
}

/// The first `len` bytes of an echo, without closing.
fn echo_through_partial(app: &mut Client, c: TcpHandle, len: usize) {
    let data: Vec<u8> = (0..len).map(pattern).collect();
    app.send_all(c, &data, T).unwrap();
    let mut got = vec![0u8; len];
    let mut n = 0;
    while n < len {
        n += app.recv(c, &mut got[n..], T).unwrap();
    }
    assert_eq!(got, data);
}

/// The child half of `killed_app_has_its_connections_closed` (runs only when asked).
#[test]
#[ignore]
fn child_app() {
    let Ok(path) = std::env::var("FLOWSTACK_TEST_CHILD_SOCKET") else {
        return;
    };
    let mut app = Client::connect(path).unwrap();
    let c = app.connect_to(lo(7300), T).unwrap();
    app.send_all(c, b"hi", T).unwrap();
    // Wait to be killed (bounded, should the parent fail).
    let mut b = [0u8; 1];
    let _ = app.recv(c, &mut b, Duration::from_secs(60));
}

fn killed_app_has_its_connections_closed(engines: usize) {
    let d = daemon("kill", engines);
    let mut srv = Client::connect(&d.path).unwrap();
    let l = srv.tcp_listen(7300, 8).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_app", "--nocapture"])
        .env("FLOWSTACK_TEST_CHILD_SOCKET", &d.path)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let c = srv.accept(l, T).unwrap();
    let mut b = [0u8; 2];
    let mut n = 0;
    while n < 2 {
        n += srv.recv(c, &mut b[n..], T).unwrap();
    }
    assert_eq!(&b, b"hi");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let start = Instant::now();
    let r = srv.recv(c, &mut b, T);
    assert!(
        matches!(r, Ok(0) | Err(SocketError::ConnectionReset)),
        "peer of a killed app: {r:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}
