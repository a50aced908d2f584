//! Where an offload crr (or rr) connection's time goes: `bench crr --peer offload`'s loop
//! (the daemon's engine on cpu 0, both applications on cpu 1, sleeping at once) with a
//! timestamp after each call and the client library's futex sleeps per connection — what
//! `flowstack sim` charges as the daemon's waits (`host.offload_crr_waits`, README "The
//! offload crr's waits"). Re-measure after a change to the daemon's calls:
//!
//! ```sh
//! cargo run --release -p flowstack-bench --example offload_trace -- 1      # crr, 1 s
//! cargo run --release -p flowstack-bench --example offload_trace -- 1 rr   # rr
//! cargo run --release -p flowstack-bench --example offload_trace -- 1 stream [BYTES]
//! ```
//!
//! `stream`: 64 KiB writes (or BYTES) one way; prints the sender's futex sleeps per write
//! and the receiver's per 64 KiB read (`host.offload_stream` in `flowstack sim`).
//!
//! Prints medians in µs. Listens on 127.0.0.1:7123 of the daemon's own loopback (no kernel
//! socket).
use flowstack_api::{SocketError, Sockets};
use flowstack_client::Client;
use flowstack_offload::{Daemon, DaemonConfig};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn pin(c: usize) {
    let _ = flowstack_sys::affinity::pin_to_cpu(c);
}

fn med(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let rr = std::env::args().nth(2).as_deref() == Some("rr");
    if std::env::args().nth(2).as_deref() == Some("stream") {
        let msg = std::env::args()
            .nth(3)
            .and_then(|s| s.parse().ok())
            .unwrap_or(65536);
        return stream(secs, msg);
    }
    let dir = std::env::temp_dir().join(format!("simfit-trace-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let d = Daemon::spawn(&DaemonConfig {
        socket: dir.join("d.sock"),
        cpu: Some(0),
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    srv.set_spin(Duration::ZERO);
    cli.set_spin(Duration::ZERO);
    let l = srv.tcp_listen(7123, 64).unwrap();
    let _ = srv.tcp_accept(l);
    let base = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let slog: Arc<Mutex<Vec<[f64; 6]>>> = Arc::default();
    let sl = slog.clone();
    pin(1);
    let server = std::thread::spawn(move || {
        pin(1);
        let ns = |t: Instant| (t - base).as_nanos() as f64 / 1000.0;
        let mut buf = [0u8; 64];
        let mut v = Vec::with_capacity(100_000);
        loop {
            let s0 = srv.sleeps();
            let c = match srv.accept(l, Duration::from_millis(50)) {
                Ok(c) => c,
                Err(SocketError::TimedOut) if !st.load(Ordering::SeqCst) => continue,
                Err(_) => break,
            };
            let a0 = ns(Instant::now());
            let _ = srv.tcp_set_nodelay(c, true);
            loop {
                let mut got = 0;
                let mut eof = false;
                while got < 64 {
                    match srv.recv(c, &mut buf[got..], T) {
                        Ok(0) | Err(_) => {
                            eof = true;
                            break;
                        }
                        Ok(n) => got += n,
                    }
                }
                if eof {
                    break;
                }
                let a1 = ns(Instant::now());
                srv.send_all(c, &buf, T).unwrap();
                let a2 = ns(Instant::now());
                v.push([a0, a1, a2, 0.0, 0.0, 0.0]);
                if rr {
                    continue;
                }
            }
            let a3 = ns(Instant::now());
            let _ = srv.close(c, T);
            let a4 = ns(Instant::now());
            if let Some(x) = v.last_mut() {
                x[3] = a3;
                x[4] = a4;
                x[5] = (srv.sleeps() - s0) as f64;
            }
            if rr {
                break;
            }
        }
        *sl.lock().unwrap() = v;
    });
    let ns = |t: Instant| (t - base).as_nanos() as f64 / 1000.0;
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7123);
    let data = [0x17u8; 64];
    let mut buf = [0u8; 64];
    let mut clog: Vec<[f64; 6]> = Vec::with_capacity(100_000);
    let start = Instant::now();
    let mut rc = None;
    while start.elapsed().as_secs_f64() < secs {
        let s0 = cli.sleeps();
        let t0 = ns(Instant::now());
        // crr as the bench runs it: the request posted behind the connect.
        let (c, sent) = if rr {
            (
                *rc.get_or_insert_with(|| cli.connect_to(dst, T).unwrap()),
                0,
            )
        } else {
            cli.connect_send(dst, &data, T).unwrap()
        };
        let _ = cli.tcp_set_nodelay(c, true);
        let t1 = ns(Instant::now());
        cli.send_all(c, &data[sent..], T).unwrap();
        let mut got = 0;
        while got < 64 {
            got += cli.recv(c, &mut buf[got..], T).unwrap();
        }
        let t2 = ns(Instant::now());
        if !rr {
            cli.close(c, T).unwrap();
        }
        let t3 = ns(Instant::now());
        clog.push([t0, t1, t2, t3, (cli.sleeps() - s0) as f64, 0.0]);
    }
    if let Some(c) = rc {
        let _ = cli.close(c, T);
    }
    drop(cli);
    stop.store(true, Ordering::SeqCst);
    server.join().unwrap();
    let _ = d.stop();
    let sv = slog.lock().unwrap().clone();
    let n = clog.len().min(sv.len());
    println!(
        "{} connections/transactions in {secs} s: {:.0}/s",
        clog.len(),
        clog.len() as f64 / secs
    );
    let col = |f: &dyn Fn(usize) -> f64| med((1..n).map(f).collect());
    println!(
        "client: total {:.1}  connect {:.1}  send..answer {:.1}  close {:.1}  sleeps {:.1}",
        col(&|i| clog[i][3] - clog[i][0]),
        col(&|i| clog[i][1] - clog[i][0]),
        col(&|i| clog[i][2] - clog[i][1]),
        col(&|i| clog[i][3] - clog[i][2]),
        col(&|i| clog[i][4])
    );
    if !rr {
        println!("server: connect start->accept returns {:.1}; connect returns->accept returns {:.1}; accept->request in {:.1}; send {:.1}; answer sent->client has it {:.1}; client close start->server sees FIN {:.1}; server close {:.1}; server close done - client close done {:.1}; sleeps {:.1}",
            col(&|i| sv[i][0] - clog[i][0]), col(&|i| sv[i][0] - clog[i][1]),
            col(&|i| sv[i][1] - sv[i][0]), col(&|i| sv[i][2] - sv[i][1]),
            col(&|i| clog[i][2] - sv[i][2]), col(&|i| sv[i][3] - clog[i][2]),
            col(&|i| sv[i][4] - sv[i][3]), col(&|i| sv[i][4] - clog[i][3]), col(&|i| sv[i][5]));
        println!(
            "gap: client close done -> next connect: next start - server close done {:.1}",
            col(&|i| if i + 1 < n {
                clog[i + 1][0] - sv[i][4]
            } else {
                0.0
            })
        );
    } else {
        println!("server: request in -> answer sent {:.1}; client start -> server has request {:.1}; answer sent -> client has it {:.1}",
            col(&|i| sv[i][2] - sv[i][1]), col(&|i| sv[i][1] - clog[i][0]), col(&|i| clog[i][2] - sv[i][2]));
    }
}

/// One-way stream: the sender's sleeps per write, the receiver's per 64 KiB.
fn stream(secs: f64, msg: usize) {
    let dir = std::env::temp_dir().join(format!("simfit-trace-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let d = Daemon::spawn(&DaemonConfig {
        socket: dir.join("d.sock"),
        cpu: Some(0),
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    srv.set_spin(Duration::ZERO);
    cli.set_spin(Duration::ZERO);
    let l = srv.tcp_listen(7124, 64).unwrap();
    pin(1);
    let server = std::thread::spawn(move || {
        pin(1);
        let c = srv.accept(l, T).unwrap();
        let s0 = srv.sleeps();
        let (mut bytes, mut reads) = (0u64, 0u64);
        let mut buf = vec![0u8; 65536];
        while let Ok(n @ 1..) = srv.recv(c, &mut buf, T) {
            bytes += n as u64;
            reads += 1;
        }
        let _ = srv.close(c, T);
        (bytes, reads, srv.sleeps() - s0)
    });
    let c = cli
        .connect_to(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7124), T)
        .unwrap();
    let data = vec![0x17u8; msg];
    let s0 = cli.sleeps();
    let start = Instant::now();
    let mut writes = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        cli.send_all(c, &data, T).unwrap();
        writes += 1;
    }
    let el = start.elapsed().as_secs_f64();
    let sleeps = cli.sleeps() - s0;
    cli.tcp_shutdown(c).unwrap();
    let (bytes, reads, rs) = server.join().unwrap();
    let _ = cli.close(c, T);
    let _ = d.stop();
    println!(
        "stream {msg} B writes: {writes} in {el:.2} s, {:.0} Mbit/s; sender sleeps per write {:.2}; receiver: {bytes} B in {reads} reads, sleeps per 64 KiB {:.2}, bytes per read {:.0}",
        writes as f64 * msg as f64 * 8.0 / el / 1e6,
        sleeps as f64 / writes.max(1) as f64,
        rs as f64 / (bytes as f64 / 65536.0).max(1.0),
        bytes as f64 / reads.max(1) as f64
    );
}
