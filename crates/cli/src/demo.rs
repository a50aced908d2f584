//! `flowstack demo`: two engines over an in-process link, exercised end to end (the jobs are
//! [`flowstack_runtime::demo`]; this prints their report).

use clap::Args;
use flowstack_link::impair::ImpairSpec;
use flowstack_runtime::demo::{self, PingOutcome};
use flowstack_stack::netsim::{Net, NetConfig, A_IP, B_IP};
use flowstack_stack::Engine;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant as WallClock;

/// Options of `flowstack demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Impair the link, e.g. loss=0.02,reorder=0.02,dup=0.01,corrupt=0.001,delay=1ms
    #[arg(long, value_name = "SPEC", value_parser = parse_impair)]
    impair: Option<ImpairSpec>,
    /// Seed of the impairment generator (same seed, same run).
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Write host A's view of the link to this pcap file.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Bytes to send over TCP (suffixes K, M, G are powers of 1024).
    #[arg(long, value_name = "N", default_value = "16M", value_parser = parse_size)]
    bytes: u64,
}

/// Parses `100`, `64K`, `100M`, `1G` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mul) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 1500, 64K, 100M, 1G)"))?;
    n.checked_mul(mul)
        .ok_or_else(|| format!("'{s}' is too large"))
}

fn parse_impair(s: &str) -> Result<ImpairSpec, String> {
    s.parse()
}

pub fn run(args: DemoArgs) -> ExitCode {
    let writer: Option<Box<dyn Write>> = match &args.pcap {
        Some(p) => match File::create(p) {
            Ok(f) => Some(Box::new(BufWriter::new(f))),
            Err(e) => {
                eprintln!("flowstack: cannot create {}: {e}", p.display());
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let impair = args.impair.unwrap_or_default();
    let cfg = NetConfig {
        impair,
        seed: args.seed,
        ..Default::default()
    };
    let mut net = match Net::new(cfg, writer) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("flowstack: cannot start capture: {e}");
            return ExitCode::from(1);
        }
    };
    let wall = WallClock::now();
    let start = net.now;
    println!("flowstack demo: host A {A_IP} <-> host B {B_IP} over an in-process link");
    if !impair.is_noop() {
        println!("  link impaired: {impair} (seed {})", args.seed);
    }

    let PingOutcome { sent, rtts } = demo::ping(&mut net, 5);
    println!();
    println!(
        "ping  {} -> {}: {} sent, {} answered",
        A_IP,
        B_IP,
        sent,
        rtts.len()
    );
    if let (Some(min), Some(max)) = (rtts.iter().min(), rtts.iter().max()) {
        println!("      rtt min/max {:?}/{:?} (virtual time)", min, max);
    }

    let u = match demo::udp_echo(&mut net) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("flowstack: UDP echo failed: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "udp   {} datagrams ({} bytes, up to 9000 bytes: fragmented and reassembled), {} echoed back intact, {} lost",
        u.sent,
        u.bytes,
        u.echoed,
        u.lost()
    );

    let bulk = match demo::bulk(&mut net, args.bytes) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("flowstack: TCP transfer failed: {e}");
            return ExitCode::from(1);
        }
    };
    let r = &bulk.report;
    let mbps = r.received as f64 * 8.0 / bulk.wall.as_secs_f64().max(1e-9) / 1e6;
    println!(
        "tcp   {} -> {} bytes A -> B in {:?} wall ({:.0} Mbit/s in-process, both stacks on one core), {:?} virtual",
        r.sent, r.received, bulk.wall, mbps, r.elapsed
    );
    println!("      sha256 sent     {}", bulk.sent_sha);
    println!("      sha256 received {}", bulk.recv_sha);
    println!(
        "      retransmissions {} ({} timeouts, {} fast retransmits), rtt estimate {}, fast-path segments {}",
        r.client.retransmits,
        r.client.timeouts,
        r.client.fast_retransmits,
        r.srtt.map(|d| format!("{d:?}")).unwrap_or("n/a".into()),
        r.server.fast_path + r.client.fast_path
    );
    println!("      final states: A {}  B {}", r.states.0, r.states.1);
    let http = demo::http(&mut net);
    match &http {
        Ok((status, body)) => println!("http  GET /hello -> {status}: {}", body.trim_end()),
        Err(e) => println!("http  failed: {e}"),
    }

    println!();
    report_host("A", &net.a);
    report_host("B", &net.b);
    println!();
    println!(
        "time  {:?} virtual, {:?} wall",
        net.now.saturating_since(start),
        wall.elapsed()
    );
    if let Err(e) = net.finish_pcap() {
        eprintln!("flowstack: writing capture failed: {e}");
        return ExitCode::from(1);
    }
    if let Some(p) = &args.pcap {
        println!(
            "pcap  {} (read with: tcpdump -nr {})",
            p.display(),
            p.display()
        );
    }
    if !bulk.verified() {
        eprintln!(
            "flowstack: TCP data did not verify (received {} of {} bytes, first difference at {:?})",
            r.received, r.sent, r.mismatch_at
        );
        return ExitCode::from(1);
    }
    if http.is_err() {
        eprintln!("flowstack: HTTP exchange failed");
        return ExitCode::from(1);
    }
    if u.corrupt > 0 {
        eprintln!("flowstack: {} datagrams came back altered", u.corrupt);
        return ExitCode::from(1);
    }
    if rtts.is_empty() && impair.loss < 1.0 {
        eprintln!("flowstack: no ping was answered");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

fn report_host(name: &str, e: &Engine) {
    let list: Vec<String> = e
        .counters()
        .nonzero()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("host {name} {} counters:", e.ip());
    for chunk in list.chunks(4) {
        println!("      {}", chunk.join("  "));
    }
}
