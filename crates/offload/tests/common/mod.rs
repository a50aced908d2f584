//! What the daemon's end-to-end tests share: a daemon on a private socket path, a patterned
//! echo (a server application and a client that checks every byte), bounded waits.
#![allow(dead_code)] // each test binary uses its own subset

use flowstack_api::{SocketError, Sockets, TcpHandle};
use flowstack_client::Client;
use flowstack_offload::{Daemon, DaemonConfig, DaemonHandle};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The bound on every wait.
pub const T: Duration = Duration::from_secs(20);

/// A fresh socket path private to this test process and `name`.
pub fn sock_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowstack-offload-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("d.sock")
}

/// A daemon of `engines` engine threads, fusing off; with `spread`, the applications of
/// this process are assigned round robin over them (`DaemonConfig::spread`).
pub fn daemon(name: &str, engines: usize, spread: bool) -> DaemonHandle {
    Daemon::spawn(&DaemonConfig {
        socket: sock_path(name),
        engines,
        spread,
        // These tests look at the daemon's own path (credit, spans, counters): no fusing
        // (`tests/fuse.rs` turns it on).
        fuse_pipe: 0,
        ..DaemonConfig::default()
    })
    .unwrap()
}

/// [`daemon`] with fused loopback connections at their defaults.
pub fn fusing_daemon(name: &str) -> DaemonHandle {
    Daemon::spawn(&DaemonConfig {
        socket: sock_path(name),
        ..DaemonConfig::default()
    })
    .unwrap()
}

pub fn lo(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

/// Byte `i` of every patterned stream.
pub fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 11)) as u8
}

/// Listens on `port`; the outcome of the (asynchronous) listen comes with the next call, an
/// accept the daemon answers at once (no accept is left waiting) — so a client on another
/// engine cannot connect before the listen took effect.
pub fn listen(app: &mut Client, port: u16) -> Result<TcpHandle, SocketError> {
    let l = app.tcp_listen(port, 16)?;
    match app.tcp_accept(l) {
        Err(SocketError::WouldBlock) => Ok(l),
        Err(e) => {
            let _ = app.close(l, T);
            Err(e)
        }
        Ok(c) => panic!("nothing should connect yet: {c:?}"),
    }
}

/// Echoes one connection accepted on `l` until its end of stream, then shuts down and
/// closes; returns the bytes echoed.
pub fn echo_server(mut app: Client, l: TcpHandle) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let c = app.accept(l, T).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        loop {
            let n = app.recv(c, &mut buf, T).unwrap();
            if n == 0 {
                break;
            }
            total += n as u64;
            app.send_all(c, &buf[..n], T).unwrap();
        }
        app.tcp_shutdown(c).unwrap();
        app.close(c, T).unwrap();
        total
    })
}

/// Sends `len` patterned bytes through an echo with non-blocking calls and checks every
/// byte that comes back. With `half_close`, the sending side is shut down as soon as the
/// last byte is taken (while the echo is still in flight) and the end of stream that
/// follows the echo is checked; without it the connection stays open.
pub fn echo_through(app: &mut Client, c: TcpHandle, len: usize, half_close: bool) {
    let (mut sent, mut got) = (0usize, 0usize);
    let mut out = vec![0u8; 32 * 1024];
    let mut inb = vec![0u8; 64 * 1024];
    let start = Instant::now();
    while got < len {
        assert!(start.elapsed() < T, "stuck at sent {sent} got {got}");
        let mut moved = false;
        if sent < len {
            let n = out.len().min(len - sent);
            for (k, b) in out[..n].iter_mut().enumerate() {
                *b = pattern(sent + k);
            }
            match app.tcp_send(c, &out[..n]) {
                Ok(k) => {
                    sent += k;
                    moved = true;
                }
                Err(SocketError::WouldBlock) => {}
                Err(e) => panic!("send: {e:?}"),
            }
            if sent == len && half_close {
                app.tcp_shutdown(c).unwrap();
            }
        }
        match app.tcp_recv(c, &mut inb) {
            Ok(0) => panic!("early end of stream at {got}"),
            Ok(n) => {
                for (k, &b) in inb[..n].iter().enumerate() {
                    assert_eq!(b, pattern(got + k), "byte {}", got + k);
                }
                got += n;
                moved = true;
            }
            Err(SocketError::WouldBlock) => {}
            Err(e) => panic!("recv: {e:?}"),
        }
        if !moved {
            // Nothing to do: a sync wait sleeps until the daemon posts something.
            app.wait(Duration::from_millis(5)).unwrap();
        }
    }
    if half_close {
        let mut b = [0u8; 16];
        assert_eq!(
            app.recv(c, &mut b, T),
            Ok(0),
            "end of stream after the echo"
        );
    }
}

/// Exactly `n` bytes (blocking, bounded); panics on an early end of stream.
pub fn recv_exact(app: &mut Client, c: TcpHandle, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    let mut got = 0;
    while got < n {
        let k = app.recv(c, &mut b[got..], T).unwrap();
        assert!(k > 0, "end of stream after {got} of {n}");
        got += k;
    }
    b
}

/// The daemon's counter `name` (0 if it has none), from `flowstack stats`.
pub fn counter(path: &Path, name: &str) -> u64 {
    flowstack_offload::stats::query(path)
        .unwrap()
        .counters
        .into_iter()
        .find(|(k, _)| k == name)
        .map_or(0, |(_, v)| v)
}
