//! Many short connections through an in-process daemon: its per-socket tables return to
//! their idle size (issue 15's heap growth under `bench crr --peer offload`).

mod common;

use common::{daemon, listen, lo, T};
use flowstack_api::Sockets;
use flowstack_client::Client;
use std::time::Duration;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn crr(n: usize, port: u16, report: bool) {
    let d = daemon(&format!("churn-{port}"), 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, port).unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..n {
            let c = srv.accept(l, T).unwrap();
            let mut got = 0;
            while got < 8 {
                got += srv.recv(c, &mut buf[got..8], T).unwrap();
            }
            srv.send_all(c, &buf[..8], T).unwrap();
            assert_eq!(srv.recv(c, &mut buf, T).unwrap(), 0);
            srv.close(c, T).unwrap();
        }
        srv
    });
    let mut back = [0u8; 8];
    let path = d.path.clone();
    for i in 0..n {
        let (c, _) = cli.connect_send(lo(port), b"12345678", T).unwrap();
        let mut got = 0;
        while got < 8 {
            got += cli.recv(c, &mut back[got..], T).unwrap();
        }
        cli.close(c, T).unwrap();
        if report && i % 50000 == 0 {
            let st = flowstack_offload::stats::query(&path).unwrap();
            eprintln!(
                "{i}: rss {} KiB, sockets {} {:?}",
                rss_kib(),
                st.sockets.len(),
                st.counters
                    .iter()
                    .filter(|(k, _)| k.starts_with("FlowstackdT"))
                    .collect::<Vec<_>>()
            );
        }
    }
    let _srv = server.join().unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let st = flowstack_offload::stats::query(&path).unwrap();
    eprintln!("end: rss {} KiB, sockets {}", rss_kib(), st.sockets.len());
    let _ = cli.tcp_close(flowstack_api::TcpHandle::from_raw(0));
}

#[test]
#[ignore]
fn churn_report() {
    let n: usize = std::env::var("CHURN_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    crr(n, 7600, true);
}
