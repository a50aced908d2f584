//! Bulk transfer through the daemon with the client library: byte-exact streams, the
//! sender's sleeps (woken when half its send buffer is free, not at every credit), and
//! received bytes kept in the receive area (`flowstack_client` `held`) never stalling a
//! socket that is read behind sockets that are not. Private socket paths, bounded waits.

mod common;
use common::*;
use flowstack_api::region::SOCK_SNDBUF;
use flowstack_api::{SocketError, Sockets, TcpHandle};
use flowstack_client::Client;
use std::time::{Duration, Instant};

/// Receives exactly `len` patterned bytes (starting at stream offset 0) on `c` with reads of
/// varying sizes, checking every byte.
fn recv_pattern(app: &mut Client, c: TcpHandle, len: usize) {
    let mut buf = vec![0u8; 100_003];
    let mut got = 0usize;
    let mut i = 0usize;
    while got < len {
        // Odd read sizes: spans are read in pieces and across their ends.
        let want = [100_003, 7, 65_536, 4_097, 31][i % 5].min(len - got);
        i += 1;
        let n = app
            .recv(c, &mut buf[..want], T)
            .unwrap_or_else(|e| panic!("{e:?} at {got} of {len}"));
        assert!(n > 0, "early end of stream at {got}");
        for (k, &x) in buf[..n].iter().enumerate() {
            assert_eq!(x, pattern(got + k), "byte {}", got + k);
        }
        got += n;
    }
}

/// Sends `len` patterned bytes on `c` in sends of varying sizes.
fn send_pattern(app: &mut Client, c: TcpHandle, len: usize) {
    let data: Vec<u8> = (0..len).map(pattern).collect();
    let mut at = 0;
    let mut i = 0;
    while at < len {
        let k = [65_536, 1_000_001, 13, 300_000][i % 4].min(len - at);
        i += 1;
        app.send_all(c, &data[at..at + k], T).unwrap();
        at += k;
    }
}

/// 16 MiB one way, byte-exact; the sender, sleeping at once when it waits (no spin), sleeps
/// about once per half send buffer: it is woken when half of its buffer is free again, not
/// by every turn that returns a little credit.
#[test]
fn bulk_stream_is_byte_exact_and_the_sender_sleeps_once_per_half_buffer() {
    const LEN: usize = 16 << 20;
    let d = daemon("bulk", 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    srv.set_spin(Duration::ZERO);
    cli.set_spin(Duration::ZERO);
    let l = listen(&mut srv, 7500).unwrap();
    let server = std::thread::spawn(move || {
        let c = srv.accept(l, T).unwrap();
        recv_pattern(&mut srv, c, LEN);
        let mut one = [0u8; 1];
        assert_eq!(srv.recv(c, &mut one, T).unwrap(), 0, "end of stream");
        srv.close(c, T).unwrap();
    });
    let c = cli.connect_to(lo(7500), T).unwrap();
    let before = cli.sleeps();
    send_pattern(&mut cli, c, LEN);
    let sleeps = cli.sleeps() - before;
    cli.tcp_shutdown(c).unwrap();
    server.join().unwrap();
    cli.close(c, T).unwrap();
    // A full buffer is refilled only after half of it was taken: at most one sleep per half
    // buffer, plus a few that end otherwise (the liveness slice, the last bytes).
    let most = (LEN as u64 / (SOCK_SNDBUF / 2)) + 8;
    assert!(
        sleeps <= most,
        "{sleeps} sleeps for {LEN} bytes (woken by small credit returns?)"
    );
}

/// One application reads one connection while four others (each holding up to its
/// receive credit in the application's receive area) are not read: the held bytes are
/// copied out of the area as it fills, so the read connection still gets every byte; then
/// the others are read, byte-exact, from what was copied out and what stayed in the area.
#[test]
fn unread_sockets_do_not_stall_a_read_one() {
    const BIG: usize = 4 << 20;
    const SMALL: usize = 700_000;
    const IDLE: usize = 4;
    let d = daemon("held", 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7501).unwrap();
    let conns: Vec<TcpHandle> = (0..=IDLE)
        .map(|_| cli.connect_to(lo(7501), T).unwrap())
        .collect();
    let accepted: Vec<TcpHandle> = (0..=IDLE).map(|_| srv.accept(l, T).unwrap()).collect();
    // Every receiving socket reads by copy (tcp_recv) from the start: its bytes are held.
    let mut none = [0u8; 16];
    for &a in &accepted {
        assert_eq!(srv.tcp_recv(a, &mut none), Err(SocketError::WouldBlock));
    }
    let sender = std::thread::spawn(move || {
        // The idle ones first, so they fill the area before the read one starts.
        for &c in &conns[1..] {
            send_pattern(&mut cli, c, SMALL);
        }
        send_pattern(&mut cli, conns[0], BIG);
        for &c in &conns {
            cli.tcp_shutdown(c).unwrap();
        }
        (cli, conns)
    });
    // Which connection got which stream: the accept order follows the connect order.
    let end = Instant::now() + T;
    recv_pattern(&mut srv, accepted[0], BIG);
    assert!(Instant::now() < end);
    for &a in &accepted[1..] {
        recv_pattern(&mut srv, a, SMALL);
        let mut one = [0u8; 1];
        assert_eq!(srv.recv(a, &mut one, T).unwrap(), 0, "end of stream");
    }
    let (mut cli, conns) = sender.join().unwrap();
    for (c, a) in conns.into_iter().zip(accepted) {
        cli.close(c, T).unwrap();
        srv.close(a, T).unwrap();
    }
}
