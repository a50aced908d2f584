//! The kernel peer: the same workloads over loopback TCP with std sockets, server in its own
//! process (this executable as `__bench-server`), one client thread per connection.

use crate::spec::{BenchSpec, Placement, RunOpts, ServerSpec};
use crate::{pin, SERVER_SUBCOMMAND};
use flowstack_apps::workload::{ClientResult, Workload};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a kernel-peer thread runs: pinned like flowstack's engines, or wherever the
/// scheduler likes (the affinity a pinned parent passed down is undone).
fn placement(o: &RunOpts, cpu: usize) {
    match o.kernel_placement {
        Placement::Split => pin(cpu),
        Placement::Same => pin(0),
        Placement::Free => {
            let _ = flowstack_link::sys::unpin();
        }
    }
}

/// The server process's kernel side: prints its port on stdout (the client reads it), then
/// serves until killed.
pub fn serve(spec: &ServerSpec) -> Result<(), String> {
    placement(&spec.opts, 1);
    let w = spec.workload;
    let msg = spec.opts.msg_size(w);
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("kernel server: {e}"))?;
    println!("{}", l.local_addr().map(|a| a.port()).unwrap_or(0));
    let _ = std::io::stdout().flush();
    for s in l.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = handle(s, w, msg);
        });
    }
    Ok(())
}

fn handle(mut s: TcpStream, w: Workload, msg: usize) -> std::io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    if w == Workload::Stream {
        let mut n = 0u64;
        loop {
            let k = s.read(&mut buf)?;
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        s.write_all(&n.to_be_bytes())?;
        return Ok(());
    }
    s.set_nodelay(true)?;
    let resp = vec![0x42u8; msg];
    loop {
        match s.read_exact(&mut buf[..msg]) {
            Ok(()) => s.write_all(&resp)?,
            Err(_) => return Ok(()),
        }
    }
}

/// One run against a kernel server process.
pub fn run(spec: &BenchSpec) -> Result<ClientResult, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let server = ServerSpec {
        workload: spec.workload,
        opts: spec.opts.clone(),
        shm_fd: None,
    };
    let mut child = Command::new(exe)
        .arg(SERVER_SUBCOMMAND)
        .arg("--spec")
        .arg(server.to_arg())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn kernel server: {e}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let port: u16 = line
        .trim()
        .parse()
        .map_err(|_| "kernel server gave no port".to_string())?;
    let r = run_client(spec, port);
    let _ = child.kill();
    let _ = child.wait();
    r
}

/// One client connection of `w` to `addr` until `duration` after `start` (stream counts
/// the bytes it wrote into `sent`); used by the one-core and the per-core kernel peers.
pub(crate) fn one_conn(
    w: Workload,
    msg: usize,
    addr: (&str, u16),
    start: Instant,
    duration: Duration,
    sent: &AtomicU64,
) -> Result<ClientResult, String> {
    let mut r = ClientResult::default();
    let data = vec![0x17u8; msg.max(8)];
    let mut buf = vec![0u8; msg.max(8)];
    let e = |e: std::io::Error| e.to_string();
    match w {
        Workload::Stream => {
            let mut s = TcpStream::connect(addr).map_err(e)?;
            while start.elapsed() < duration {
                s.write_all(&data[..msg]).map_err(e)?;
                sent.fetch_add(msg as u64, Ordering::Relaxed);
            }
            s.shutdown(Shutdown::Write).map_err(e)?;
            let mut n = [0u8; 8];
            s.read_exact(&mut n).map_err(e)?;
            r.bytes = u64::from_be_bytes(n);
        }
        Workload::Rr => {
            let mut s = TcpStream::connect(addr).map_err(e)?;
            s.set_nodelay(true).map_err(e)?;
            while start.elapsed() < duration {
                let t = Instant::now();
                s.write_all(&data[..msg]).map_err(e)?;
                s.read_exact(&mut buf[..msg]).map_err(e)?;
                r.latency
                    .saturating_record((t.elapsed().as_nanos() as u64).max(1));
                r.transactions += 1;
            }
        }
        Workload::Crr => {
            while start.elapsed() < duration {
                let mut s = TcpStream::connect(addr).map_err(e)?;
                s.set_nodelay(true).map_err(e)?;
                s.write_all(&data[..msg]).map_err(e)?;
                s.read_exact(&mut buf[..msg]).map_err(e)?;
                r.transactions += 1;
            }
        }
    }
    Ok(r)
}

fn run_client(spec: &BenchSpec, port: u16) -> Result<ClientResult, String> {
    let duration = Duration::from_secs_f64(spec.duration);
    let msg = spec.msg_size();
    placement(&spec.opts, 0);
    let sent = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..spec.conns)
        .map(|_| {
            let w = spec.workload;
            let sent = sent.clone();
            let opts = spec.opts.clone();
            std::thread::spawn(move || {
                placement(&opts, 0);
                one_conn(w, msg, ("127.0.0.1", port), start, duration, &sent)
            })
        })
        .collect();
    // Sender-side interval lines for stream, like iperf3's.
    let mut intervals = vec![];
    if spec.workload == Workload::Stream {
        let mut last = 0;
        for i in 1..=(spec.duration as u64) {
            let t = start + Duration::from_secs(i);
            if let Some(d) = t.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            let now = sent.load(Ordering::Relaxed);
            intervals.push(now - last);
            last = now;
        }
    }
    let mut total = ClientResult::default();
    for t in threads {
        let r = t
            .join()
            .map_err(|_| "client thread panicked".to_string())??;
        total.bytes += r.bytes;
        total.transactions += r.transactions;
        total
            .latency
            .add(&r.latency)
            .map_err(|e| format!("latency histogram: {e}"))?;
    }
    total.secs = if spec.workload == Workload::Stream {
        start.elapsed().as_secs_f64()
    } else {
        spec.duration
    };
    total.intervals = intervals;
    Ok(total)
}
