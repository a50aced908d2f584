//! The daemon's turns look only at marked sockets (app/marks.rs): a receiver whose receive
//! area fills up, with connections left waiting for room, gets every byte once it reads,
//! and no sweep finds a socket with work that no mark named (`FlowstackdServiceUnmarked`).
//! Private socket path, bounded waits.

use flowstack_api::region::SOCK_RCVBUF;
use flowstack_api::{SocketError, Sockets};
use flowstack_client::Client;
use flowstack_offload::{stats, Daemon, DaemonConfig};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

fn sock_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowstack-marks-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("d.sock")
}

fn counter(path: &Path, name: &str) -> u64 {
    stats::query(path).unwrap().counters[name]
}

fn byte(conn: usize, i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 9) ^ conn.wrapping_mul(37)) as u8
}

/// Six connections each deliver one receive credit (512 KiB, the window each offers) to
/// one application that reads nothing at first: its 2 MiB receive area fills with four
/// connections' credit and the others' bytes wait in the engine for room. Then it reads each connection to the
/// end, in order: the waiting connections move on only because freeing area room marks
/// them (`App::area_wait`). Every byte arrives, in order, and no sweep found news unmarked.
#[test]
fn connections_waiting_for_receive_area_room_resume_when_it_is_freed() {
    const CONNS: usize = 6;
    let each = SOCK_RCVBUF as usize;
    let path = sock_path("area");
    let _d = Daemon::spawn(&DaemonConfig {
        socket: path.clone(),
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut b = Client::connect(&path).unwrap();
    let l = b.tcp_listen(7201, 16).unwrap();
    let mut a = Client::connect(&path).unwrap();
    let remote = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7201);
    let mut pairs = Vec::new();
    for _ in 0..CONNS {
        let h = a.connect_to(remote, T).unwrap();
        let s = b.accept(l, T).unwrap();
        pairs.push((h, s));
    }
    for (c, &(h, _)) in pairs.iter().enumerate() {
        let data: Vec<u8> = (0..each).map(|i| byte(c, i)).collect();
        a.send_all(h, &data, T).unwrap();
    }
    // Everything in flight has arrived: nothing stays unacknowledged, so no segment (no
    // engine news) will mark the waiting connections later. (A window closed in
    // window-scale units, 32 bytes with a 1 MiB buffer, may keep up to 31 bytes unsent;
    // they go when the window opens, after the reads below.)
    let settle = std::time::Instant::now() + T;
    while stats::query(&path)
        .unwrap()
        .sockets
        .iter()
        .any(|r| r.send_q >= 32)
    {
        assert!(
            std::time::Instant::now() < settle,
            "bytes never all arrived"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = std::time::Instant::now() + T;
    for (c, &(_, s)) in pairs.iter().enumerate() {
        let mut got = 0;
        while got < each {
            // The last connections are read without naming them to the daemon while waiting
            // (a blocking recv's wait would mark them itself): only the freed area room can.
            let n = if c < 4 {
                b.recv(s, &mut buf, T).unwrap()
            } else {
                match b.tcp_recv(s, &mut buf) {
                    Err(SocketError::WouldBlock) => {
                        assert!(std::time::Instant::now() < deadline, "connection {c} stuck");
                        let _ = b.wait(Duration::from_millis(20));
                        continue;
                    }
                    r => r.unwrap(),
                }
            };
            assert!(n > 0, "connection {c}: end of stream after {got} bytes");
            for (k, &x) in buf[..n].iter().enumerate() {
                assert_eq!(x, byte(c, got + k), "connection {c}, byte {}", got + k);
            }
            got += n;
        }
    }
    for &(h, s) in &pairs {
        a.tcp_close(h).unwrap();
        let _ = b.tcp_close(s);
    }
    assert!(counter(&path, "FlowstackdServiceSweeps") > 0);
    assert_eq!(counter(&path, "FlowstackdServiceUnmarked"), 0);
}

/// Sweeps are rate-limited by time and by the number of sockets (`SWEEP_GAP`,
/// `GAP_PER_SOCKET`: 2 µs per socket). With 1 000 idle connections open (2 003 sockets: a gap
/// of at least 4 ms), 300 ping-pongs on one more connection — each one ending in a daemon
/// sleep, before which it used to sweep every socket — take at most one sweep per 4 ms of the
/// run, plus two for its edges; every byte arrives. A slow machine only raises the bound.
#[test]
fn idle_connections_do_not_make_every_sleep_sweep() {
    let path = sock_path("idle");
    let _d = Daemon::spawn(&DaemonConfig {
        socket: path.clone(),
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut b = Client::connect(&path).unwrap();
    let l = b.tcp_listen(7202, 64).unwrap();
    let mut a = Client::connect(&path).unwrap();
    let remote = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7202);
    let mut idle = Vec::new();
    for _ in 0..1000 {
        let h = a.connect_to(remote, T).unwrap();
        let s = b.accept(l, T).unwrap();
        idle.push((h, s));
    }
    let h = a.connect_to(remote, T).unwrap();
    let s = b.accept(l, T).unwrap();
    let start = std::time::Instant::now();
    let before = counter(&path, "FlowstackdServiceSweeps");
    let mut buf = [0u8; 8];
    for i in 0..300u32 {
        let x = i as u8;
        a.send_all(h, &[x], T).unwrap();
        assert_eq!(b.recv(s, &mut buf, T).unwrap(), 1);
        assert_eq!(buf[0], x);
        b.send_all(s, &[!x], T).unwrap();
        assert_eq!(a.recv(h, &mut buf, T).unwrap(), 1);
        assert_eq!(buf[0], !x);
    }
    let sweeps = counter(&path, "FlowstackdServiceSweeps") - before;
    let took = start.elapsed();
    let bound = (took.as_micros() / 4_000) as u64 + 2;
    assert!(
        sweeps <= bound,
        "{sweeps} sweeps in {took:?} with 2 003 sockets (at most {bound})"
    );
    assert_eq!(idle.len(), 1000);
}
