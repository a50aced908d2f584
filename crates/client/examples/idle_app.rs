//! An idle application for the 0%-CPU check: registers with the daemon at `argv[1]`, opens a
//! connection to itself over the daemon's loopback, then blocks in `recv` for `argv[2]`
//! seconds (default 10) with nothing arriving. Measure it and the daemon from `/proc`.
use flowstack_api::Sockets;
use flowstack_client::Client;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: idle_app SOCKET [SECS]");
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let mut app = Client::connect(&path).expect("register");
    let t = Duration::from_secs(5);
    let l = app.tcp_listen(7400, 4).expect("listen");
    let c = app
        .connect_to(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7400), t)
        .expect("connect");
    let _s = app.accept(l, t).expect("accept");
    println!("idle");
    let end = Instant::now() + Duration::from_secs(secs);
    let mut b = [0u8; 16];
    while Instant::now() < end {
        let _ = app.recv(c, &mut b, end - Instant::now());
    }
}
