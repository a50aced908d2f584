//! The kernel peer: the same workloads over loopback TCP with std sockets, server in its own
//! process, one client thread per connection.

use super::workload::{ClientResult, Workload};
use super::{kernel_placement, pass_opts, workload_name, BenchArgs};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Server process: prints its port, then serves until killed.
pub fn serve(w: Workload, msg: usize) -> ExitCode {
    let l = match TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => {
            eprintln!("flowstack: kernel server: {e}");
            return ExitCode::from(1);
        }
    };
    println!("{}", l.local_addr().map(|a| a.port()).unwrap_or(0));
    let _ = std::io::stdout().flush();
    for s in l.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = handle(s, w, msg);
        });
    }
    ExitCode::SUCCESS
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

/// Runs the client against a kernel server process.
pub fn client(a: &BenchArgs, msg: usize) -> Result<ClientResult, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("__bench-server")
        .arg(workload_name(a.workload))
        .arg("--kernel")
        .stdout(Stdio::piped());
    pass_opts(&mut cmd, &a.opts);
    let mut child = cmd
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
    let r = run_client(a, msg, port);
    let _ = child.kill();
    let _ = child.wait();
    r
}

fn run_client(a: &BenchArgs, msg: usize, port: u16) -> Result<ClientResult, String> {
    let duration = Duration::from_secs_f64(a.duration);
    let addr = ("127.0.0.1", port);
    kernel_placement(&a.opts, 0);
    let sent = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..a.conns)
        .map(|_| {
            let w = a.workload;
            let sent = sent.clone();
            let opts = a.opts.clone();
            std::thread::spawn(move || -> Result<ClientResult, String> {
                kernel_placement(&opts, 0);
                let mut r = ClientResult::default();
                let data = vec![0x17u8; msg.max(8)];
                let mut buf = vec![0u8; msg.max(8)];
                match w {
                    Workload::Stream => {
                        let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
                        while start.elapsed() < duration {
                            s.write_all(&data[..msg]).map_err(|e| e.to_string())?;
                            sent.fetch_add(msg as u64, Ordering::Relaxed);
                        }
                        s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
                        let mut n = [0u8; 8];
                        s.read_exact(&mut n).map_err(|e| e.to_string())?;
                        r.bytes = u64::from_be_bytes(n);
                    }
                    Workload::Rr => {
                        let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
                        s.set_nodelay(true).map_err(|e| e.to_string())?;
                        while start.elapsed() < duration {
                            let t = Instant::now();
                            s.write_all(&data[..msg]).map_err(|e| e.to_string())?;
                            s.read_exact(&mut buf[..msg]).map_err(|e| e.to_string())?;
                            r.latencies
                                .push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                            r.transactions += 1;
                        }
                    }
                    Workload::Crr => {
                        while start.elapsed() < duration {
                            let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
                            s.set_nodelay(true).map_err(|e| e.to_string())?;
                            s.write_all(&data[..msg]).map_err(|e| e.to_string())?;
                            s.read_exact(&mut buf[..msg]).map_err(|e| e.to_string())?;
                            r.transactions += 1;
                        }
                    }
                }
                Ok(r)
            })
        })
        .collect();
    // Sender-side interval lines for stream, like iperf3's.
    let mut intervals = vec![];
    if a.workload == Workload::Stream {
        let mut last = 0;
        for i in 1..=(a.duration as u64) {
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
        total.latencies.extend(r.latencies);
    }
    total.secs = if a.workload == Workload::Stream {
        start.elapsed().as_secs_f64()
    } else {
        a.duration
    };
    total.intervals = intervals;
    Ok(total)
}
