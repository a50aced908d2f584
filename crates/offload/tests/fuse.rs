//! Fused loopback connections (`app::fuse`): once a connection between two applications has
//! carried `--fuse-after` bytes, its bytes go through a pipe both map, in order with those
//! that went through the daemon before, with the end of stream behind the last of them; a
//! reader that closes makes the writer's sends fail instead of hang. Private socket paths,
//! bounded waits.

mod common;
use common::*;
use flowstack_client::Client;
use flowstack_offload::{Daemon, DaemonConfig};
use flowstack_stack::TcpHandle;

/// Reads `c` to its end, checking each byte against `pattern` from `start`; how many.
fn drain_checked(app: &mut Client, c: TcpHandle, start: usize) -> usize {
    let mut buf = vec![0u8; 96 << 10];
    let mut got = 0usize;
    loop {
        let n = app.recv(c, &mut buf, T).unwrap();
        if n == 0 {
            return got;
        }
        for (k, &x) in buf[..n].iter().enumerate() {
            assert_eq!(x, pattern(start + got + k), "byte {}", start + got + k);
        }
        got += n;
    }
}

/// 32 MiB one way, sent in pieces and ended right behind the last one, then 6 MiB back: every
/// byte arrives once and in order, the end of stream after the last, and most of the bytes
/// never went through the daemon's copy into a receive area.
#[test]
fn a_bulk_stream_moves_to_the_pipe_in_order_both_ways() {
    const TOTAL: usize = 32 << 20;
    const BACK: usize = 6 << 20;
    let d = fusing_daemon("fuse-bulk");
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7581).unwrap();
    let c = cli.connect_to(lo(7581), T).unwrap();
    let s = srv.accept(l, T).unwrap();
    let server = std::thread::spawn(move || {
        let got = drain_checked(&mut srv, s, 0);
        let back: Vec<u8> = (0..BACK).map(pattern).collect();
        srv.send_all(s, &back, T).unwrap();
        srv.tcp_shutdown_and_close(s);
        got
    });
    let data: Vec<u8> = (0..TOTAL).map(pattern).collect();
    for (i, k) in data.chunks(100_003).enumerate() {
        cli.send_all(c, k, T).unwrap();
        if i == 3 {
            // Readiness of a socket not fused yet, then of one that is (below).
            assert!(flowstack_api::Sockets::tcp_poll(&cli, c).unwrap().writable);
        }
    }
    flowstack_api::Sockets::tcp_shutdown(&mut cli, c).unwrap();
    let back = drain_checked(&mut cli, c, 0);
    assert_eq!(server.join().unwrap(), TOTAL, "bytes the server read");
    assert_eq!(back, BACK, "bytes the client read back");
    assert_eq!(counter(&d.path, "FlowstackdPipesFused"), 1);
    assert_eq!(
        counter(&d.path, "FlowstackdPipesOpened"),
        2,
        "both directions"
    );
    let direct = counter(&d.path, "FlowstackdRxDirectBytes");
    assert!(
        direct < (TOTAL as u64) / 4,
        "{direct} of {TOTAL} bytes still went through the daemon's copy"
    );
    cli.close(c, T).unwrap();
}

trait ShutClose {
    fn tcp_shutdown_and_close(&mut self, h: TcpHandle);
}

impl ShutClose for Client {
    fn tcp_shutdown_and_close(&mut self, h: TcpHandle) {
        flowstack_api::Sockets::tcp_shutdown(self, h).unwrap();
        self.close(h, T).unwrap();
    }
}

/// A reader that closes with bytes unread in the pipe: the writer's next sends fail (the
/// connection is reset, as the kernel resets a connection closed with unread data), never
/// hang until the wait's bound.
#[test]
fn a_reader_that_closes_fails_the_writer() {
    let d = fusing_daemon("fuse-close");
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7582).unwrap();
    let c = cli.connect_to(lo(7582), T).unwrap();
    let s = srv.accept(l, T).unwrap();
    let reader = std::thread::spawn(move || {
        // Enough to fuse and open the pipe, then leave bytes unread and close.
        let got = recv_exact(&mut srv, s, 3 << 20);
        assert!(got.iter().enumerate().all(|(i, &x)| x == pattern(i)));
        srv.close(s, T).unwrap();
        srv
    });
    let chunk: Vec<u8> = (0..(1 << 20)).map(pattern).collect();
    let mut failed = None;
    for _ in 0..512 {
        if let Err(e) = cli.send_all(c, &chunk, T) {
            failed = Some(e);
            break;
        }
    }
    let _srv = reader.join().unwrap();
    let e = failed.expect("sending on after the reader closed never failed");
    // A send that waited out its bound (the writer never told) fails with `TimedOut`.
    assert_ne!(e, flowstack_api::SocketError::TimedOut, "the writer hung");
    assert_eq!(counter(&d.path, "FlowstackdPipesFused"), 1);
}

/// `--fuse-pipe 0`: nothing is fused, the bytes go through the daemon as before.
#[test]
fn fusing_can_be_turned_off() {
    const TOTAL: usize = 8 << 20;
    let d = Daemon::spawn(&DaemonConfig {
        socket: sock_path("fuse-off"),
        fuse_pipe: 0,
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7583).unwrap();
    let c = cli.connect_to(lo(7583), T).unwrap();
    let s = srv.accept(l, T).unwrap();
    let server = std::thread::spawn(move || drain_checked(&mut srv, s, 0));
    let data: Vec<u8> = (0..TOTAL).map(pattern).collect();
    cli.send_all(c, &data, T).unwrap();
    cli.close(c, T).unwrap();
    assert_eq!(server.join().unwrap(), TOTAL);
    assert_eq!(counter(&d.path, "FlowstackdPipesFused"), 0);
}

/// `--fuse-memory`: with room for one pipe, a second connection stays on the daemon's path
/// (refused, counted) while the first is fused, and both carry every byte.
#[test]
fn pipes_past_the_memory_limit_are_refused() {
    const TOTAL: usize = 4 << 20;
    let cap = 64 << 10;
    let d = Daemon::spawn(&DaemonConfig {
        socket: sock_path("fuse-mem"),
        fuse_after: 256 << 10,
        fuse_pipe: cap,
        fuse_memory: 4096 + 2 * cap + 1000,
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7584).unwrap();
    let c1 = cli.connect_to(lo(7584), T).unwrap();
    let s1 = srv.accept(l, T).unwrap();
    let c2 = cli.connect_to(lo(7584), T).unwrap();
    let s2 = srv.accept(l, T).unwrap();
    let server = std::thread::spawn(move || {
        let a = drain_checked(&mut srv, s1, 0);
        let b = drain_checked(&mut srv, s2, 0);
        (a, b)
    });
    let data: Vec<u8> = (0..TOTAL).map(pattern).collect();
    cli.send_all(c1, &data, T).unwrap();
    cli.close(c1, T).unwrap();
    // The first pipe may still be mapped by the server: the second connection is refused.
    cli.send_all(c2, &data, T).unwrap();
    cli.close(c2, T).unwrap();
    assert_eq!(server.join().unwrap(), (TOTAL, TOTAL));
    assert_eq!(counter(&d.path, "FlowstackdPipesFused"), 1);
    assert!(counter(&d.path, "FlowstackdPipesRefused") >= 1);
}
