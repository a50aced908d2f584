//! Wake-ups per message: an application blocked in `recv` is woken by the data it waits for,
//! not by the daemon returning send credit for what it sent just before. (With every event
//! waking it, a request/response client slept and woke twice per request.)

use flowstack_api::Sockets;
use flowstack_client::Client;
use flowstack_offload::{Daemon, DaemonConfig};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

#[test]
fn request_response_sleeps_about_once_per_request() {
    let dir = std::env::temp_dir().join(format!("flowstack-offload-{}-wake", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = Daemon::spawn(&DaemonConfig {
        socket: dir.join("d.sock"),
        ..DaemonConfig::default()
    })
    .unwrap();
    const N: u64 = 400;
    const MSG: usize = 64;
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    // Sleep at once: every wait is a futex sleep, so the count is the number of wake-ups.
    srv.set_spin(Duration::ZERO);
    cli.set_spin(Duration::ZERO);
    let l = srv.tcp_listen(7400, 4).unwrap();
    let server = std::thread::spawn(move || {
        let c = srv.accept(l, T).unwrap();
        srv.tcp_set_nodelay(c, true).unwrap();
        let mut buf = [0u8; MSG];
        let before = srv.sleeps();
        for _ in 0..N {
            let mut got = 0;
            while got < MSG {
                got += srv.recv(c, &mut buf[got..], T).unwrap();
            }
            srv.send_all(c, &buf, T).unwrap();
        }
        let sleeps = srv.sleeps() - before;
        assert_eq!(srv.recv(c, &mut buf, T).unwrap(), 0);
        srv.close(c, T).unwrap();
        sleeps
    });
    let c = cli
        .connect_to(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7400), T)
        .unwrap();
    cli.tcp_set_nodelay(c, true).unwrap();
    let mut buf = [0u8; MSG];
    let before = cli.sleeps();
    for i in 0..N {
        let req = [i as u8; MSG];
        cli.send_all(c, &req, T).unwrap();
        let mut got = 0;
        while got < MSG {
            got += cli.recv(c, &mut buf[got..], T).unwrap();
        }
        assert_eq!(buf, req, "request {i} echoed");
    }
    let cli_sleeps = cli.sleeps() - before;
    cli.tcp_shutdown(c).unwrap();
    let srv_sleeps = server.join().unwrap();
    cli.close(c, T).unwrap();
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
    // At least one sleep per request is needed on each side (each waits for the other), and
    // a wake-up by a credit-only event costs a second one. Allow a quarter for sleeps that
    // end otherwise (a signal, the liveness slice) or data arriving in two events.
    for (who, s) in [("client", cli_sleeps), ("server", srv_sleeps)] {
        assert!(
            s <= N + N / 4,
            "{who}: {s} sleeps for {N} requests (a credit event woke it?)"
        );
    }
}
