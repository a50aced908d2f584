//! Which application receives a socket several share (`Command::Hold`, record version 8):
//! adopting takes nothing, reading takes the socket, the one that lost it is told and takes
//! it back at its next read, and a sender that does not hold the socket gets its own send
//! credit (without it, its sends would stop once a send buffer's worth was in flight).
//! "Processes" are separate `Posix` instances; every wait is bounded.

mod common;

use common::{counter, daemon, lo};
use flowstack_client::posix::{Errno, Posix, RecvFlags, Type};
use std::os::fd::AsFd;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(20));

fn recv_exactly(p: &Posix, id: flowstack_client::posix::SockId, n: usize) -> Vec<u8> {
    let mut got = vec![0u8; n];
    let mut at = 0;
    while at < n {
        let k = p.recv(id, &mut got[at..], RecvFlags::BLOCK, T).unwrap();
        assert!(k > 0, "end of stream after {at} of {n}");
        at += k;
    }
    got
}

/// Waits (bounded) until the daemon has moved socket holders `n` times in all: a `Hold`
/// is posted, and bytes sent before the daemon took it would go to the previous holder.
fn moved(path: &std::path::Path, n: u64) {
    let t0 = std::time::Instant::now();
    while counter(path, "FlowstackdHoldsMoved") < n {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "never moved {n} times"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(counter(path, "FlowstackdHoldsMoved"), n);
}

fn send_all(p: &Posix, id: flowstack_client::posix::SockId, data: &[u8]) {
    let mut at = 0;
    while at < data.len() {
        at += p.send(id, &data[at..], false, T).unwrap();
    }
}

#[test]
fn the_reader_holds_and_a_sender_that_does_not_gets_its_credit() {
    let d = daemon("hold", 1, false);
    let server = Posix::attach(&d.path).unwrap();
    let client = Posix::attach(&d.path).unwrap();
    let other = Posix::attach(&d.path).unwrap();
    let (_la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    server.listen(lid, 16, None).unwrap();
    let (_ca, cid) = client.socket(Type::Stream).unwrap();
    client.connect(cid, lo(port), false, T).unwrap();
    let (sa, sid, _, _) = server.accept(lid, false, T).unwrap();

    // Another application adopts the accepted socket: the server still receives.
    let oid = other
        .adopt(sa.as_fd())
        .unwrap()
        .expect("a placeholder of ours");
    send_all(&client, cid, b"one");
    assert_eq!(recv_exactly(&server, sid, 3), b"one");
    assert_eq!(
        counter(&d.path, "FlowstackdHoldsMoved"),
        0,
        "adopting took it"
    );

    // The other one reads: it takes the socket, and receives what comes next.
    let mut none = [0u8; 8];
    assert_eq!(
        other.recv(oid, &mut none, RecvFlags::NONBLOCK, None),
        Err(Errno::EAGAIN)
    );
    moved(&d.path, 1);
    send_all(&client, cid, b"two");
    assert_eq!(recv_exactly(&other, oid, 3), b"two");

    // The server was told; its next read takes the socket back.
    assert_eq!(
        server.recv(sid, &mut none, RecvFlags::NONBLOCK, None),
        Err(Errno::EAGAIN)
    );
    moved(&d.path, 2);
    send_all(&client, cid, b"three");
    assert_eq!(recv_exactly(&server, sid, 5), b"three");

    // The other one sends 8 MiB (many send buffers) while the server holds the socket: its
    // credit comes to it, so its sends go on. The client checks every byte.
    let len = 8 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
    let want = data.clone();
    let reader = std::thread::spawn(move || {
        let got = recv_exactly(&client, cid, len);
        assert!(got == want, "the client's bytes differ");
    });
    send_all(&other, oid, &data);
    reader.join().unwrap();
    assert_eq!(
        counter(&d.path, "FlowstackdHoldsMoved"),
        2,
        "sending took the socket from its reader"
    );
    drop(sa);
}
