//! `flowstack bench rr|crr|stream --peer offload`: the client library over a daemon's
//! loopback against kernel sockets over 127.0.0.1, in the same run (issue 15's evidence,
//! seed 001's measurement).
//!
//! Both peers run their client and server as two threads of this process (two registered
//! applications for the offload peer; two kernel sockets for the kernel peer). The offload
//! peer's daemon runs on a third thread of this process (`Daemon::spawn`), so its CPU is
//! that thread's (`/proc/self/task/TID/stat`) and the *applications'* CPU is the process's
//! minus the daemon's. For the kernel peer the stack's CPU is inside the applications'
//! (system time), so `stack_cpu_us_per_req` is 0 there and `app_cpu_us_per_req` holds both.
//! Per request: per transaction (rr, crr) or per message (stream).
//!
//! Placement (printed with the table): with two or more allowed CPUs, the daemon is the
//! "network processor" and owns the first one (`DaemonConfig::cpu`; it spins there before it
//! sleeps), and both offload applications (client and server threads) are pinned to the
//! second; the kernel peer gets the same two cores, its client pinned to the second and its
//! server to the first. With one CPU nothing is pinned.

use flowstack_api::{Sockets, TcpHandle};
use flowstack_client::Client;
use flowstack_offload::{Daemon, DaemonConfig};
use flowstack_prof::report::Workload;
use flowstack_sys::process::cpu_time;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Debug, Clone)]
pub struct OffloadSpec {
    /// rr, crr or stream.
    pub workload: Workload,
    /// Bytes per request and response (rr, crr) or per write (stream).
    pub msg: usize,
    /// Seconds per run.
    pub duration: f64,
    /// Runs per peer (medians reported).
    pub runs: usize,
    /// The daemon's engine CPUs (`--daemon-cores`): one pinned engine thread each, the
    /// client and the server applications spread over them (with two or more, their
    /// connection crosses engines). `None`: one engine on the placement's daemon CPU.
    pub daemon_cores: Option<Vec<usize>>,
}

/// Which CPUs the threads run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Placement {
    /// The daemon's core (offload) and the kernel peer's server core.
    np: usize,
    /// The applications' core (offload client and server; kernel client).
    app: usize,
}

impl Placement {
    fn detect() -> Option<Self> {
        let cpus = flowstack_sys::affinity::allowed_cpus().ok()?;
        match cpus.as_slice() {
            [np, app, ..] => Some(Self { np: *np, app: *app }),
            _ => None,
        }
    }

    fn describe(p: Option<Self>, daemon_cores: Option<&[usize]>) -> String {
        if let Some(c) = daemon_cores {
            let s = Self::describe(p, None);
            let list: Vec<String> = c.iter().map(|c| c.to_string()).collect();
            return format!(
                "{s}; offload daemon: {} engine(s) on cpus {} instead, apps spread over them",
                c.len(),
                list.join(",")
            );
        }
        match p {
            Some(p) => format!(
                "placement: offload daemon on cpu {np} (spins {spin} µs before sleeping), \
                 offload client+server apps on cpu {app} (spin {aspin}); \
                 kernel server on cpu {np}, kernel client on cpu {app}",
                spin = flowstack_offload::DEFAULT_SPIN.as_micros(),
                aspin = match app_spin(Some(p)) {
                    Some(d) => format!("{} µs", d.as_micros()),
                    None => "FLOWSTACK_SPIN_US µs".into(),
                },
                np = p.np,
                app = p.app
            ),
            None => "placement: one CPU allowed, nothing pinned".into(),
        }
    }
}

/// The applications' spin: both share one core when pinned, so a spinning one only delays
/// the other; they sleep at once unless `FLOWSTACK_SPIN_US` says otherwise (`None`: the
/// client library's own default).
fn app_spin(place: Option<Placement>) -> Option<Duration> {
    if std::env::var_os("FLOWSTACK_SPIN_US").is_some() || place.is_none() {
        return None;
    }
    Some(Duration::ZERO)
}

fn pin(cpu: Option<usize>) {
    if let Some(c) = cpu {
        let _ = flowstack_sys::affinity::pin_to_cpu(c);
    }
}

/// One peer's medians.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OffloadPeer {
    /// `offload` or `kernel`.
    pub peer: String,
    /// Transactions (rr, crr) or messages (stream) per second.
    pub per_sec: f64,
    /// Payload throughput, Gbit/s (one direction).
    pub gbit_s: f64,
    /// Median latency of a transaction, µs (rr, crr; 0 for stream).
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// The applications' CPU per request, µs.
    pub app_cpu_us_per_req: f64,
    /// The stack's (daemon's) CPU per request, µs (0: inside the applications').
    pub stack_cpu_us_per_req: f64,
    /// Every run's `per_sec`.
    pub runs_per_sec: Vec<f64>,
}

/// The comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OffloadReport {
    /// Workload name.
    pub workload: String,
    /// Message size.
    pub msg: usize,
    /// Seconds per run.
    pub duration: f64,
    /// Offload first, then kernel.
    pub peers: Vec<OffloadPeer>,
    /// Offload's `per_sec` over the kernel's.
    pub speedup: f64,
    /// Offload's application CPU per request over the kernel's (goal ≤ 0.30).
    pub app_cpu_ratio: f64,
    /// Which threads ran on which CPUs.
    #[serde(default)]
    pub placement: String,
}

impl OffloadReport {
    /// One line per peer, then the ratios.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{} msg {} B, {} s per run, medians of {} runs",
            self.workload,
            self.msg,
            self.duration,
            self.peers
                .first()
                .map(|p| p.runs_per_sec.len())
                .unwrap_or(0)
        );
        let _ = writeln!(o, "{}", self.placement);
        let _ = writeln!(
            o,
            "{:<8} {:>12} {:>9} {:>9} {:>9} {:>12} {:>14}",
            "peer", "req/s", "Gbit/s", "p50_us", "p99_us", "app_cpu_us", "stack_cpu_us"
        );
        for p in &self.peers {
            let _ = writeln!(
                o,
                "{:<8} {:>12.0} {:>9.3} {:>9.1} {:>9.1} {:>12.2} {:>14.2}",
                p.peer,
                p.per_sec,
                p.gbit_s,
                p.p50_us,
                p.p99_us,
                p.app_cpu_us_per_req,
                p.stack_cpu_us_per_req
            );
        }
        let _ = writeln!(
            o,
            "speedup (offload/kernel req/s) {:.2}; app CPU per request offload/kernel {:.2} (goal <= 0.30)",
            self.speedup, self.app_cpu_ratio
        );
        o
    }

    /// The `--json` document.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

struct Run {
    reqs: u64,
    secs: f64,
    lat_ns: Vec<u64>,
    app_cpu: Duration,
    stack_cpu: Duration,
}

fn pct(v: &mut [u64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i] as f64 / 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs both peers `spec.runs` times, alternating, and reports medians.
pub fn run(spec: &OffloadSpec) -> Result<OffloadReport, String> {
    if spec.msg == 0 {
        return Err("message size must be positive".into());
    }
    let place = Placement::detect();
    let mut runs: [Vec<Run>; 2] = [vec![], vec![]];
    let r = (|| {
        for _ in 0..spec.runs.max(1) {
            runs[0].push(offload_run(spec, place)?);
            runs[1].push(kernel_run(spec, place)?);
        }
        Ok::<(), String>(())
    })();
    if place.is_some() {
        let _ = flowstack_sys::affinity::unpin();
    }
    r?;
    let peers: Vec<OffloadPeer> = ["offload", "kernel"]
        .iter()
        .zip(runs)
        .map(|(name, rs)| summarize(name, spec, rs))
        .collect();
    let speedup = peers[0].per_sec / peers[1].per_sec.max(1e-9);
    let app_cpu_ratio = peers[0].app_cpu_us_per_req / peers[1].app_cpu_us_per_req.max(1e-9);
    Ok(OffloadReport {
        workload: format!("{:?}", spec.workload).to_lowercase(),
        msg: spec.msg,
        duration: spec.duration,
        peers,
        speedup,
        app_cpu_ratio,
        placement: Placement::describe(place, spec.daemon_cores.as_deref()),
    })
}

fn summarize(name: &str, spec: &OffloadSpec, rs: Vec<Run>) -> OffloadPeer {
    let per = |r: &Run, d: Duration| d.as_secs_f64() * 1e6 / r.reqs.max(1) as f64;
    let per_sec: Vec<f64> = rs.iter().map(|r| r.reqs as f64 / r.secs).collect();
    let mut p50 = vec![];
    let mut p99 = vec![];
    for r in &rs {
        let mut l = r.lat_ns.clone();
        p50.push(pct(&mut l, 0.5));
        p99.push(pct(&mut l, 0.99));
    }
    let ps = median(per_sec.clone());
    OffloadPeer {
        peer: name.into(),
        per_sec: ps,
        gbit_s: ps * spec.msg as f64 * 8.0 / 1e9,
        p50_us: median(p50),
        p99_us: median(p99),
        app_cpu_us_per_req: median(rs.iter().map(|r| per(r, r.app_cpu)).collect()),
        stack_cpu_us_per_req: median(rs.iter().map(|r| per(r, r.stack_cpu)).collect()),
        runs_per_sec: per_sec,
    }
}

fn me() -> u32 {
    std::process::id()
}

fn proc_cpu() -> Duration {
    cpu_time(me(), None).unwrap_or_default()
}

const T: Duration = Duration::from_secs(10);
const PORT: u16 = 7000;

fn offload_run(spec: &OffloadSpec, place: Option<Placement>) -> Result<Run, String> {
    let dir = std::env::temp_dir().join(format!("flowstack-bench-offload-{}", me()));
    let _ = std::fs::create_dir_all(&dir);
    let d = Daemon::spawn(&DaemonConfig {
        socket: dir.join("d.sock"),
        cpu: place.map(|p| p.np),
        cores: spec.daemon_cores.clone().unwrap_or_default(),
        spread: spec.daemon_cores.is_some(),
        // This bench measures the daemon's own path (seed 001's host interface): a stream
        // between its two applications is not fused (`--fuse-pipe`).
        fuse_pipe: 0,
        ..DaemonConfig::default()
    })
    .map_err(|e| format!("daemon: {e}"))?;
    let path = d.path.clone();
    let e = |e: flowstack_api::SocketError| format!("offload: {e:?}");
    let mut srv = Client::connect(&path).map_err(|e| e.to_string())?;
    let mut cli = Client::connect(&path).map_err(|e| e.to_string())?;
    if let Some(spin) = app_spin(place) {
        srv.set_spin(spin);
        cli.set_spin(spin);
    }
    let l = srv.tcp_listen(PORT, 64).map_err(e)?;
    // The listen is posted: an accept the daemon answers at once confirms it before the
    // client (on another engine with --daemon-cores) can connect.
    match srv.tcp_accept(l) {
        Err(flowstack_api::SocketError::WouldBlock) => {}
        Err(x) => return Err(e(x)),
        Ok(_) => return Err("offload: a connection before the client connected".into()),
    }
    let (w, msg) = (spec.workload, spec.msg);
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let app_cpu = place.map(|p| p.app);
    pin(app_cpu);
    let server = std::thread::Builder::new()
        .name("offload-server".into())
        .spawn(move || {
            pin(app_cpu);
            offload_server(&mut srv, l, w, msg, &st)
        })
        .map_err(|e| e.to_string())?;
    let duration = Duration::from_secs_f64(spec.duration);
    let tids = loop {
        let t = d.thread_ids();
        if t.iter().all(|&t| t != 0) {
            break t;
        }
        std::thread::yield_now();
    };
    // The stack's CPU: every engine thread's.
    let daemon_cpu = || -> Duration {
        tids.iter()
            .map(|&t| cpu_time(me(), Some(t)).unwrap_or_default())
            .sum()
    };
    let (c0, s0) = (proc_cpu(), daemon_cpu());
    let start = Instant::now();
    let r = offload_client(&mut cli, w, msg, duration);
    let secs = start.elapsed().as_secs_f64();
    let (c1, s1) = (proc_cpu(), daemon_cpu());
    drop(cli);
    stop.store(true, Ordering::SeqCst);
    let _ = server.join();
    let _ = d.stop();
    let (reqs, lat_ns) = r?;
    let stack = s1.saturating_sub(s0);
    Ok(Run {
        reqs,
        secs,
        lat_ns,
        app_cpu: (c1.saturating_sub(c0)).saturating_sub(stack),
        stack_cpu: stack,
    })
}

fn offload_server(app: &mut Client, l: TcpHandle, w: Workload, msg: usize, stop: &AtomicBool) {
    let mut buf = vec![0u8; msg.max(65536)];
    loop {
        let c = match app.accept(l, Duration::from_millis(50)) {
            Ok(c) => c,
            Err(flowstack_api::SocketError::TimedOut) if !stop.load(Ordering::SeqCst) => continue,
            Err(_) => return,
        };
        let _ = app.tcp_set_nodelay(c, true);
        'conn: loop {
            if w == Workload::Stream {
                match app.recv(c, &mut buf, T) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
            let mut got = 0;
            while got < msg {
                match app.recv(c, &mut buf[got..msg], T) {
                    Ok(0) | Err(_) => break 'conn,
                    Ok(n) => got += n,
                }
            }
            if app.send_all(c, &buf[..msg], T).is_err() {
                break;
            }
        }
        let _ = app.close(c, T);
        if w != Workload::Crr {
            return;
        }
    }
}

fn offload_client(
    app: &mut Client,
    w: Workload,
    msg: usize,
    duration: Duration,
) -> Result<(u64, Vec<u64>), String> {
    let e = |e: flowstack_api::SocketError| format!("offload client: {e:?}");
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, PORT);
    let data = vec![0x17u8; msg];
    let mut buf = vec![0u8; msg];
    let mut lat = Vec::new();
    let mut n = 0u64;
    let start = Instant::now();
    // `sent`: bytes of the request already posted (behind the connect, crr).
    let rr = |app: &mut Client, c: TcpHandle, sent: usize, buf: &mut [u8]| -> Result<(), String> {
        app.send_all(c, &data[sent..], T).map_err(e)?;
        let mut got = 0;
        while got < msg {
            match app.recv(c, &mut buf[got..], T).map_err(e)? {
                0 => return Err("offload: early end of stream".into()),
                k => got += k,
            }
        }
        Ok(())
    };
    match w {
        Workload::Rr => {
            let c = app.connect_to(dst, T).map_err(e)?;
            app.tcp_set_nodelay(c, true).map_err(e)?;
            while start.elapsed() < duration {
                let t = Instant::now();
                rr(app, c, 0, &mut buf)?;
                lat.push(t.elapsed().as_nanos() as u64);
                n += 1;
            }
            let _ = app.close(c, T);
        }
        Workload::Crr => {
            while start.elapsed() < duration {
                let t = Instant::now();
                // The request follows the connect in the same ring batch.
                let (c, sent) = app.connect_send(dst, &data, T).map_err(e)?;
                app.tcp_set_nodelay(c, true).map_err(e)?;
                rr(app, c, sent, &mut buf)?;
                app.close(c, T).map_err(e)?;
                lat.push(t.elapsed().as_nanos() as u64);
                n += 1;
            }
        }
        Workload::Stream => {
            let c = app.connect_to(dst, T).map_err(e)?;
            while start.elapsed() < duration {
                app.send_all(c, &data, T).map_err(e)?;
                n += 1;
            }
            app.tcp_shutdown(c).map_err(e)?;
            let _ = app.close(c, T);
        }
    }
    Ok((n, lat))
}

fn kernel_run(spec: &OffloadSpec, place: Option<Placement>) -> Result<Run, String> {
    let e = |e: std::io::Error| format!("kernel: {e}");
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(e)?;
    let port = l.local_addr().map_err(e)?.port();
    let (w, msg) = (spec.workload, spec.msg);
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    pin(place.map(|p| p.app));
    let np = place.map(|p| p.np);
    let server = std::thread::Builder::new()
        .name("kernel-server".into())
        .spawn(move || {
            pin(np);
            kernel_server(l, w, msg, &st)
        })
        .map_err(|e| e.to_string())?;
    let duration = Duration::from_secs_f64(spec.duration);
    let c0 = proc_cpu();
    let start = Instant::now();
    let r = kernel_client(port, w, msg, duration);
    let secs = start.elapsed().as_secs_f64();
    let c1 = proc_cpu();
    stop.store(true, Ordering::SeqCst);
    if w == Workload::Crr {
        // Wakes the accept so the server sees the stop.
        drop(TcpStream::connect((Ipv4Addr::LOCALHOST, port)));
    }
    let _ = server.join();
    let (reqs, lat_ns) = r?;
    Ok(Run {
        reqs,
        secs,
        lat_ns,
        app_cpu: c1.saturating_sub(c0),
        stack_cpu: Duration::ZERO,
    })
}

fn kernel_server(l: TcpListener, w: Workload, msg: usize, stop: &AtomicBool) {
    let mut buf = vec![0u8; msg.max(65536)];
    loop {
        let Ok((mut s, _)) = l.accept() else { return };
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let _ = s.set_nodelay(true);
        loop {
            let ok = match w {
                Workload::Stream => matches!(s.read(&mut buf), Ok(1..)),
                _ => s.read_exact(&mut buf[..msg]).is_ok() && s.write_all(&buf[..msg]).is_ok(),
            };
            if !ok {
                break;
            }
        }
        if w != Workload::Crr {
            return;
        }
    }
}

fn kernel_client(
    port: u16,
    w: Workload,
    msg: usize,
    duration: Duration,
) -> Result<(u64, Vec<u64>), String> {
    let e = |e: std::io::Error| format!("kernel client: {e}");
    let data = vec![0x17u8; msg];
    let mut buf = vec![0u8; msg];
    let mut lat = Vec::new();
    let mut n = 0u64;
    let start = Instant::now();
    match w {
        Workload::Rr => {
            let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(e)?;
            s.set_nodelay(true).map_err(e)?;
            while start.elapsed() < duration {
                let t = Instant::now();
                s.write_all(&data).map_err(e)?;
                s.read_exact(&mut buf).map_err(e)?;
                lat.push(t.elapsed().as_nanos() as u64);
                n += 1;
            }
        }
        Workload::Crr => {
            while start.elapsed() < duration {
                let t = Instant::now();
                let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(e)?;
                s.set_nodelay(true).map_err(e)?;
                s.write_all(&data).map_err(e)?;
                s.read_exact(&mut buf).map_err(e)?;
                drop(s);
                lat.push(t.elapsed().as_nanos() as u64);
                n += 1;
            }
        }
        Workload::Stream => {
            let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(e)?;
            while start.elapsed() < duration {
                s.write_all(&data).map_err(e)?;
                n += 1;
            }
        }
    }
    Ok((n, lat))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short rr comparison completes and reports both peers (numbers are not judged here:
    /// speed goals live in the bench itself).
    #[test]
    fn a_short_rr_comparison_reports_both_peers() {
        let r = run(&OffloadSpec {
            workload: Workload::Rr,
            msg: 64,
            duration: 0.2,
            runs: 1,
            daemon_cores: None,
        })
        .unwrap();
        assert_eq!(r.peers.len(), 2);
        assert!(
            r.peers.iter().all(|p| p.per_sec > 0.0 && p.p50_us > 0.0),
            "{r:?}"
        );
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<OffloadReport>(&j).unwrap(), r);
    }
}
