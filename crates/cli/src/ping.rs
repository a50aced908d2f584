//! `flowstack ping`: ICMP echo from a flowstack instance, with ping(8)-like output (the
//! pinging is [`flowstack_runtime::ping`]).

use crate::net::{open_or_exit, stop_flag, AddrArgs, LinkArgs};
use clap::Args;
use flowstack_runtime::ping::{ping, PingEvent, PingSpec};
use flowstack_wire::{Duration, Ipv4Address};
use std::process::ExitCode;
use std::sync::atomic::Ordering;

/// Options of `flowstack ping`.
#[derive(Args, Debug)]
pub struct PingArgs {
    #[command(flatten)]
    link: LinkArgs,
    #[command(flatten)]
    addr: AddrArgs,
    /// Host to ping (IPv4 address).
    #[arg(value_name = "HOST", value_parser = |s: &str| s.parse::<Ipv4Address>())]
    host: Ipv4Address,
    /// Stop after N replies or requests.
    #[arg(short = 'c', long = "count", value_name = "N", default_value_t = 4)]
    count: u16,
    /// Seconds between requests.
    #[arg(
        short = 'i',
        long = "interval",
        value_name = "SECS",
        default_value_t = 1.0
    )]
    interval: f64,
    /// Seconds to wait for each reply.
    #[arg(
        short = 'W',
        long = "timeout",
        value_name = "SECS",
        default_value_t = 2.0
    )]
    timeout: f64,
    /// Payload bytes.
    #[arg(short = 's', long = "size", value_name = "BYTES", default_value_t = 56)]
    size: usize,
}

pub fn run(a: PingArgs) -> ExitCode {
    if !(0.001..=3600.0).contains(&a.interval) || !(0.001..=3600.0).contains(&a.timeout) {
        eprintln!("flowstack: ping interval and timeout must be between 0.001 and 3600 s");
        return ExitCode::from(2);
    }
    if a.size < 16 || a.size > 65507 - 8 {
        eprintln!("flowstack: ping size must be 16..65499 bytes");
        return ExitCode::from(2);
    }
    let mut host = match open_or_exit(&a.link, &a.addr) {
        Ok(h) => h,
        Err(code) => return code,
    };
    let spec = PingSpec {
        dst: a.host,
        count: a.count,
        interval: Duration::from_secs_f64(a.interval),
        timeout: Duration::from_secs_f64(a.timeout),
        size: a.size,
        ident: (std::process::id() & 0xffff) as u16,
    };
    let stop = stop_flag();
    println!("PING {} ({}) {} data bytes", a.host, a.host, a.size);
    let wall = std::time::Instant::now();
    let summary = ping(
        &mut host,
        &spec,
        || stop.load(Ordering::Relaxed),
        |ev| match *ev {
            PingEvent::Reply {
                seq,
                from,
                bytes,
                ttl,
                rtt,
            } => println!(
                "{bytes} bytes from {from}: icmp_seq={seq} ttl={ttl} time={:.3} ms",
                rtt.as_secs_f64() * 1e3
            ),
            PingEvent::Timeout { seq } => println!("Request timeout for icmp_seq {seq}"),
        },
    );
    let summary = match summary {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flowstack: ping: {e}");
            return ExitCode::from(1);
        }
    };
    println!("\n--- {} ping statistics ---", a.host);
    println!(
        "{} packets transmitted, {} received, {:.0}% packet loss, time {}ms",
        summary.sent,
        summary.received(),
        summary.loss_percent(),
        wall.elapsed().as_millis()
    );
    match summary.rtt_stats_ms() {
        Some([min, avg, max, mdev]) => {
            println!("rtt min/avg/max/mdev = {min:.3}/{avg:.3}/{max:.3}/{mdev:.3} ms");
            ExitCode::SUCCESS
        }
        None => ExitCode::from(1),
    }
}
