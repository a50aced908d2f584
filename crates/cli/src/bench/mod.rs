//! `flowstack bench stream|rr|crr`: flowstack and the kernel side by side, same workload, same
//! machine, same invocation.
//!
//! The flowstack peer runs client and server in two processes, one engine each, joined by the
//! shm wire (or, with `--link pipe`, both engines in one process over the in-process pipe).
//! The kernel peer runs the same client/server logic over loopback TCP, also in two processes.
//! Client and server are pinned to different cores where the machine has two.

mod kernel;
mod smol;
pub mod workload;

use clap::{Args, ValueEnum};
use flowstack_link::pipe::pipe;
use flowstack_link::shm::{ShmOptions, ShmWire};
use flowstack_link::sys::{cpu_count, pin_to_cpu};
use flowstack_link::{Device, DeviceCaps};
use flowstack_runtime::Host;
use flowstack_stack::{Engine, EngineConfig, IfaceConfig};
use flowstack_wire::{EthernetAddress, Ipv4Address, Ipv4Cidr};
use std::fmt::Write as _;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;
use workload::{Client, ClientResult, Server, Workload, PORT};

const CLIENT_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
const SERVER_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

/// Which stacks to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeerSel {
    /// flowstack only.
    Flowstack,
    /// The Linux kernel over loopback only.
    Kernel,
    /// smoltcp (from crates.io) over an in-process link, next to flowstack over the
    /// in-process pipe with the same settings (software checksums, MTU 1500): stream only.
    Smoltcp,
    /// flowstack and the kernel, compared.
    Both,
}

/// The link between flowstack's two engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LinkSel {
    /// Two processes over the shared-memory wire.
    Shm,
    /// One process, both engines over the in-process pipe.
    Pipe,
}

/// Options shared by the client and the server of a run.
#[derive(Args, Debug, Clone)]
pub struct RunOpts {
    /// Bytes per write (stream) or per request and response (rr, crr) [default: 65536 for
    /// stream, 64 otherwise].
    #[arg(long, value_name = "B")]
    pub msg_size: Option<usize>,
    /// Ablation: copy data into and out of the socket buffers instead of lending the
    /// application's buffers to the stack (send) and borrowing the receive buffer (receive).
    #[arg(long)]
    pub no_zero_copy: bool,
    /// Ablation: segment in software to the MTU instead of handing 64 KiB segments down.
    #[arg(long)]
    pub no_tso: bool,
    /// Ablation: acknowledge every segment at once.
    #[arg(long)]
    pub no_delayed_ack: bool,
    /// Ablation: compute and verify checksums in software on the shm wire.
    #[arg(long)]
    pub no_checksum_offload: bool,
    /// Socket send and receive buffer size (the largest window).
    #[arg(long, value_name = "BYTES")]
    pub window: Option<usize>,
    /// Where the kernel peer's client and server run: `free` (the scheduler decides),
    /// `split` (pinned to different cores, like flowstack's engines) or `same` (one core,
    /// which avoids cross-core wake-ups and is the kernel's best case for rr in a VM).
    #[arg(long, value_enum, default_value = "free")]
    pub kernel_placement: Placement,
}

/// Kernel peer placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Placement {
    /// Scheduler's choice.
    Free,
    /// Client on core 0, server on core 1.
    Split,
    /// Both on core 0.
    Same,
}

/// Options of `flowstack bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// stream: one-way bulk throughput; rr: request/response latency; crr: connect/request/response/close rate.
    #[arg(value_enum)]
    workload: Workload,
    /// Which stacks to run.
    #[arg(long, value_enum, default_value = "both")]
    peer: PeerSel,
    /// How flowstack's two engines are joined.
    #[arg(long, value_enum, default_value = "shm")]
    link: LinkSel,
    /// Seconds per run.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    duration: f64,
    /// Parallel connections.
    #[arg(long, value_name = "N", default_value_t = 1)]
    conns: usize,
    /// Runs per peer; the report gives the median (and min/max).
    #[arg(long, value_name = "N", default_value_t = 1)]
    runs: usize,
    /// Write results as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    #[command(flatten)]
    opts: RunOpts,
}

/// Options of the hidden server process.
#[derive(Args, Debug)]
pub struct ServerArgs {
    #[arg(value_enum)]
    workload: Workload,
    /// Descriptor of the shm wire (flowstack server).
    #[arg(long)]
    shm_fd: Option<i32>,
    /// Run the kernel server instead; print its port on stdout.
    #[arg(long)]
    kernel: bool,
    #[command(flatten)]
    opts: RunOpts,
}

fn msg_size(w: Workload, o: &RunOpts) -> usize {
    o.msg_size
        .unwrap_or(if w == Workload::Stream { 65536 } else { 64 })
}

fn engine(ip: Ipv4Address, caps: DeviceCaps, o: &RunOpts) -> Engine {
    let a = ip.0;
    let mac = EthernetAddress([2, 0x66, 0x73, a[1], a[2], a[3]]);
    let mut cfg = EngineConfig::new(IfaceConfig::new(mac, Ipv4Cidr::new(ip, 24)));
    cfg.tcp.defaults.delayed_ack = !o.no_delayed_ack;
    if let Some(w) = o.window {
        cfg.tcp.defaults.send_buffer = w;
        cfg.tcp.defaults.recv_buffer = w;
    }
    cfg.tcp.max_connections = 65536;
    Engine::new(cfg, caps)
}

fn shm_options(o: &RunOpts) -> ShmOptions {
    ShmOptions {
        checksum_offload: !o.no_checksum_offload,
        large_segments: !o.no_tso,
        ..Default::default()
    }
}

/// Where a kernel-peer thread runs: pinned like flowstack's engines, or wherever the
/// scheduler likes (the affinity a pinned parent passed down is undone).
fn kernel_placement(o: &RunOpts, cpu: usize) {
    match o.kernel_placement {
        Placement::Split => pin(cpu),
        Placement::Same => pin(0),
        Placement::Free => {
            let _ = flowstack_link::sys::unpin();
        }
    }
}

fn pin(cpu: usize) {
    if cpu_count() > 1 {
        let _ = pin_to_cpu(cpu % cpu_count());
    }
}

/// Entry of the hidden server process.
pub fn serve(a: ServerArgs) -> ExitCode {
    let msg = msg_size(a.workload, &a.opts);
    if a.kernel {
        kernel_placement(&a.opts, 1);
        return kernel::serve(a.workload, msg);
    }
    pin(1);
    let Some(fd) = a.shm_fd else {
        eprintln!("flowstack: server needs --shm-fd or --kernel");
        return ExitCode::from(2);
    };
    let wire = match ShmWire::attach(fd, shm_options(&a.opts)) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("flowstack: shm attach: {e}");
            return ExitCode::from(1);
        }
    };
    let e = engine(SERVER_IP, wire.caps(), &a.opts);
    let mut host = Host::new(e, wire);
    let mut server = match Server::new(&mut host.engine, a.workload, msg, !a.opts.no_zero_copy) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(1);
        }
    };
    let stop = crate::net::stop_flag();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && !host.dev.link_down() {
        let moved = host.turn();
        let now = host.now();
        if !(server.step(&mut host.engine, now) || moved) {
            host.idle(flowstack_wire::Duration::from_millis(20));
        }
    }
    ExitCode::SUCCESS
}

/// One measured run of one peer.
#[derive(Debug, Clone)]
struct Run {
    result: ClientResult,
    /// Throughput (stream), transactions/s (rr, crr).
    metric: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    p999_us: f64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

fn finish(w: Workload, mut r: ClientResult) -> Run {
    r.latencies.sort_unstable();
    let metric = match w {
        Workload::Stream => r.bytes as f64 * 8.0 / r.secs / 1e6,
        _ => r.transactions as f64 / r.secs,
    };
    Run {
        p50_us: percentile(&r.latencies, 50.0),
        p90_us: percentile(&r.latencies, 90.0),
        p99_us: percentile(&r.latencies, 99.0),
        p999_us: percentile(&r.latencies, 99.9),
        result: r,
        metric,
    }
}

fn flowstack_shm(a: &BenchArgs) -> Result<ClientResult, String> {
    let msg = msg_size(a.workload, &a.opts);
    let wire = ShmWire::create(shm_options(&a.opts)).map_err(|e| format!("shm: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("__bench-server")
        .arg(workload_name(a.workload))
        .arg("--shm-fd")
        .arg(wire.raw_fd().to_string());
    pass_opts(&mut cmd, &a.opts);
    let mut child = cmd.spawn().map_err(|e| format!("spawn server: {e}"))?;
    pin(0);
    let e = engine(CLIENT_IP, wire.caps(), &a.opts);
    let mut host = Host::new(e, wire);
    let mut client = Client::new(
        a.workload,
        msg,
        SocketAddrV4::new(SERVER_IP.into(), PORT),
        a.conns,
        Duration::from_secs_f64(a.duration),
        !a.opts.no_zero_copy,
    );
    // Give the server a moment to listen: connect attempts retry anyway (RST → error), so wait
    // for its engine to answer ARP first.
    let _ = host.block(flowstack_wire::Duration::from_secs(5), |e, _| {
        let _ = e.ping_send(SERVER_IP, 1, 1, b"up?");
        e.ping_recv().map(|_| Ok(()))
    });
    std::thread::sleep(Duration::from_millis(50));
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(a.duration + 30.0);
    while !client.finished() && std::time::Instant::now() < deadline {
        let moved = host.turn();
        let now = host.now();
        if !(client.step(&mut host.engine, now) || moved) {
            host.idle(flowstack_wire::Duration::from_millis(1));
        }
        if host.dev.link_down() {
            client.result.error = Some("server process died".into());
            break;
        }
    }
    // Let the last segments (FINs) go out, then stop the server.
    for _ in 0..100 {
        host.turn();
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
    if !client.finished() {
        return Err("run did not finish in time".into());
    }
    Ok(client.result)
}

fn flowstack_pipe(a: &BenchArgs) -> Result<ClientResult, String> {
    let msg = msg_size(a.workload, &a.opts);
    let caps = DeviceCaps {
        checksum: if a.opts.no_checksum_offload {
            flowstack_wire::ChecksumCaps::SOFTWARE
        } else {
            flowstack_wire::ChecksumCaps::OFFLOADED
        },
        max_tx_datagram: if a.opts.no_tso { 1500 } else { 65535 },
        ..DeviceCaps::ETHERNET
    };
    let (mut da, mut db) = pipe(caps, 1 << 16);
    let mut ea = engine(CLIENT_IP, caps, &a.opts);
    let mut eb = engine(SERVER_IP, caps, &a.opts);
    let mut server =
        Server::new(&mut eb, a.workload, msg, !a.opts.no_zero_copy).map_err(|e| e.to_string())?;
    let mut client = Client::new(
        a.workload,
        msg,
        SocketAddrV4::new(SERVER_IP.into(), PORT),
        a.conns,
        Duration::from_secs_f64(a.duration),
        !a.opts.no_zero_copy,
    );
    let origin = std::time::Instant::now();
    let deadline = origin + Duration::from_secs_f64(a.duration + 30.0);
    while !client.finished() && std::time::Instant::now() < deadline {
        let now =
            flowstack_wire::Instant::from_nanos(origin.elapsed().as_nanos() as u64 + 1_000_000);
        ea.poll(now, &mut da);
        client.step(&mut ea, now);
        eb.poll(now, &mut db);
        server.step(&mut eb, now);
    }
    if !client.finished() {
        return Err("run did not finish in time".into());
    }
    Ok(client.result)
}

fn workload_name(w: Workload) -> &'static str {
    match w {
        Workload::Stream => "stream",
        Workload::Rr => "rr",
        Workload::Crr => "crr",
    }
}

fn pass_opts(cmd: &mut Command, o: &RunOpts) {
    if let Some(m) = o.msg_size {
        cmd.arg("--msg-size").arg(m.to_string());
    }
    for (on, flag) in [
        (o.no_zero_copy, "--no-zero-copy"),
        (o.no_tso, "--no-tso"),
        (o.no_delayed_ack, "--no-delayed-ack"),
        (o.no_checksum_offload, "--no-checksum-offload"),
    ] {
        if on {
            cmd.arg(flag);
        }
    }
    if let Some(w) = o.window {
        cmd.arg("--window").arg(w.to_string());
    }
    cmd.arg("--kernel-placement").arg(match o.kernel_placement {
        Placement::Free => "free",
        Placement::Split => "split",
        Placement::Same => "same",
    });
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn print_run(w: Workload, name: &str, r: &Run) {
    match w {
        Workload::Stream => {
            for (i, b) in r.result.intervals.iter().enumerate() {
                println!(
                    "[{name:>9}] {:>5.2}-{:<5.2} sec  {:>8.1} MBytes  {:>8.2} Gbits/sec  (sender)",
                    i as f64,
                    i as f64 + 1.0,
                    *b as f64 / 1e6,
                    *b as f64 * 8.0 / 1e9
                );
            }
            println!(
                "[{name:>9}]  0.00-{:<5.2} sec  {:>8.1} MBytes  {:>8.2} Gbits/sec  (receiver)",
                r.result.secs,
                r.result.bytes as f64 / 1e6,
                r.metric / 1e3
            );
        }
        Workload::Rr => println!(
            "[{name:>9}] {} transactions in {:.2} s = {:.0} tps; latency usec p50 {:.2} p90 {:.2} p99 {:.2} p99.9 {:.2}",
            r.result.transactions, r.result.secs, r.metric, r.p50_us, r.p90_us, r.p99_us, r.p999_us
        ),
        Workload::Crr => println!(
            "[{name:>9}] {} connect/request/response/close in {:.2} s = {:.0} per second",
            r.result.transactions, r.result.secs, r.metric
        ),
    }
}

/// Entry of `flowstack bench`.
pub fn run(a: BenchArgs) -> ExitCode {
    if !(0.1..=3600.0).contains(&a.duration)
        || a.conns == 0
        || a.conns > 10_000
        || a.runs == 0
        || a.runs > 100
    {
        eprintln!("flowstack: bench needs 0.1 <= --duration <= 3600, 1 <= --conns <= 10000, 1 <= --runs <= 100");
        return ExitCode::from(2);
    }
    if msg_size(a.workload, &a.opts) == 0 || msg_size(a.workload, &a.opts) > 1 << 20 {
        eprintln!("flowstack: --msg-size must be 1..1048576");
        return ExitCode::from(2);
    }
    if a.peer == PeerSel::Smoltcp && a.workload != Workload::Stream {
        eprintln!("flowstack: the smoltcp reference peer runs the stream workload only");
        return ExitCode::from(2);
    }
    let mut a = a;
    if a.peer == PeerSel::Smoltcp {
        // Same ground for both: one process, in-process link, MTU-sized segments, software
        // checksums (smoltcp has neither segmentation nor checksum offload here).
        a.link = LinkSel::Pipe;
        a.opts.no_tso = true;
        a.opts.no_checksum_offload = true;
    }
    let a = a;
    let peers: Vec<&str> = match a.peer {
        PeerSel::Flowstack => vec!["flowstack"],
        PeerSel::Kernel => vec!["kernel"],
        PeerSel::Smoltcp => vec!["flowstack", "smoltcp"],
        PeerSel::Both => vec!["flowstack", "kernel"],
    };
    println!(
        "flowstack bench {}: msg {} B, {} conn(s), {:.1} s x {} run(s); flowstack over {} (checksum offload {}, TSO {}, zero-copy send/receive {}, delayed ACK {}), kernel over loopback",
        workload_name(a.workload),
        msg_size(a.workload, &a.opts),
        a.conns,
        a.duration,
        a.runs,
        match a.link {
            LinkSel::Shm => "shm wire, 2 processes",
            LinkSel::Pipe => "in-process pipe, 1 process",
        },
        on(!a.opts.no_checksum_offload),
        on(!a.opts.no_tso),
        on(!a.opts.no_zero_copy),
        on(!a.opts.no_delayed_ack),
    );
    let mut all: Vec<(&str, Vec<Run>)> = vec![];
    for p in &peers {
        let mut runs = vec![];
        for _ in 0..a.runs {
            let r = match *p {
                "flowstack" => match a.link {
                    LinkSel::Shm => flowstack_shm(&a),
                    LinkSel::Pipe => flowstack_pipe(&a),
                },
                "smoltcp" => smol::stream(
                    Duration::from_secs_f64(a.duration),
                    msg_size(a.workload, &a.opts),
                    a.opts.window.unwrap_or(1 << 20),
                ),
                _ => kernel::client(&a, msg_size(a.workload, &a.opts)),
            };
            match r {
                Ok(r) if r.error.is_none() => {
                    let run = finish(a.workload, r);
                    print_run(a.workload, p, &run);
                    runs.push(run);
                }
                Ok(r) => {
                    eprintln!("flowstack: {p} run failed: {}", r.error.unwrap_or_default());
                    return ExitCode::from(1);
                }
                Err(e) => {
                    eprintln!("flowstack: {p} run failed: {e}");
                    return ExitCode::from(1);
                }
            }
        }
        all.push((p, runs));
    }
    let unit = match a.workload {
        Workload::Stream => "Mbit/s",
        _ => "per s",
    };
    println!();
    let med: Vec<(&str, f64, f64, f64, f64)> = all
        .iter()
        .map(|(p, runs)| {
            let m: Vec<f64> = runs.iter().map(|r| r.metric).collect();
            let p50 = median(runs.iter().map(|r| r.p50_us).collect());
            (
                *p,
                median(m.clone()),
                m.iter().cloned().fold(f64::MAX, f64::min),
                m.iter().cloned().fold(0.0, f64::max),
                p50,
            )
        })
        .collect();
    for (p, m, lo, hi, p50) in &med {
        if a.workload == Workload::Rr {
            println!("{p:>9}: median {m:.0} {unit} (min {lo:.0}, max {hi:.0}); median p50 latency {p50:.2} us");
        } else {
            println!("{p:>9}: median {m:.0} {unit} (min {lo:.0}, max {hi:.0})");
        }
    }
    let speedup = if med.len() == 2 {
        let (f, k) = (&med[0], &med[1]);
        let s = match a.workload {
            Workload::Rr => k.4 / f.4.max(1e-9),
            _ => f.1 / k.1.max(1e-9),
        };
        println!(
            "speedup (flowstack vs {}, > 1 = flowstack better): {s:.2}x ({})",
            k.0,
            if a.workload == Workload::Rr {
                "kernel p50 / flowstack p50"
            } else {
                "throughput ratio"
            }
        );
        Some(s)
    } else {
        None
    };
    if let Some(p) = &a.json {
        let j = to_json(&a, &all, speedup);
        if let Err(e) = std::fs::write(p, j) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

fn to_json(a: &BenchArgs, all: &[(&str, Vec<Run>)], speedup: Option<f64>) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\n  \"workload\": \"{}\",\n  \"msg_size\": {},\n  \"conns\": {},\n  \"duration_s\": {},\n  \"runs\": {},\n  \"link\": \"{}\",\n  \"options\": {{\"zero_copy\": {}, \"tso\": {}, \"delayed_ack\": {}, \"checksum_offload\": {}, \"window\": {}}},\n  \"peers\": {{\n",
        workload_name(a.workload),
        msg_size(a.workload, &a.opts),
        a.conns,
        a.duration,
        a.runs,
        match a.link {
            LinkSel::Shm => "shm",
            LinkSel::Pipe => "pipe",
        },
        !a.opts.no_zero_copy,
        !a.opts.no_tso,
        !a.opts.no_delayed_ack,
        !a.opts.no_checksum_offload,
        a.opts.window.map(|w| w.to_string()).unwrap_or("null".into())
    );
    for (i, (p, runs)) in all.iter().enumerate() {
        let metric = median(runs.iter().map(|r| r.metric).collect());
        let fields = match a.workload {
            Workload::Stream => format!("\"throughput_mbps\": {metric:.1}"),
            Workload::Rr => format!(
                "\"transactions_per_s\": {metric:.1}, \"p50_us\": {:.3}, \"p90_us\": {:.3}, \"p99_us\": {:.3}, \"p99_9_us\": {:.3}",
                median(runs.iter().map(|r| r.p50_us).collect()),
                median(runs.iter().map(|r| r.p90_us).collect()),
                median(runs.iter().map(|r| r.p99_us).collect()),
                median(runs.iter().map(|r| r.p999_us).collect())
            ),
            Workload::Crr => format!("\"connections_per_s\": {metric:.1}"),
        };
        let each: Vec<String> = runs.iter().map(|r| format!("{:.1}", r.metric)).collect();
        let _ = writeln!(
            s,
            "    \"{p}\": {{{fields}, \"each_run\": [{}]}}{}",
            each.join(", "),
            if i + 1 < all.len() { "," } else { "" }
        );
    }
    let _ = write!(
        s,
        "  }},\n  \"speedup\": {}\n}}\n",
        speedup.map(|x| format!("{x:.3}")).unwrap_or("null".into())
    );
    s
}
