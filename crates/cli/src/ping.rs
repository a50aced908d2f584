//! `flowstack ping`: ICMP echo from a flowstack instance, with ping(8)-like output.

use crate::net::{open_or_exit, stop_flag, AddrArgs, LinkArgs};
use clap::Args;
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
    let stop = stop_flag();
    println!("PING {} ({}) {} data bytes", a.host, a.host, a.size);
    let ident = (std::process::id() & 0xffff) as u16;
    let mut rtts = Vec::new();
    let mut sent = 0u16;
    let wall = std::time::Instant::now();
    let mut payload = vec![0u8; a.size];
    for (i, b) in payload.iter_mut().enumerate().skip(8) {
        *b = i as u8;
    }
    for seq in 1..=a.count {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t0 = host.now();
        payload[..8].copy_from_slice(&t0.as_nanos().to_be_bytes());
        if let Err(e) = host.engine.ping_send(a.host, ident, seq, &payload) {
            eprintln!("flowstack: ping: {e}");
            return ExitCode::from(1);
        }
        sent += 1;
        let timeout = Duration::from_secs_f64(a.timeout);
        let reply = host.block(timeout, |e, _| {
            while let Some(r) = e.ping_recv() {
                if r.ident == ident && r.seq_no == seq && r.from == a.host {
                    return Some(Ok(r));
                }
            }
            None
        });
        match reply {
            Ok(r) => {
                let rtt = r.at.saturating_since(t0);
                println!(
                    "{} bytes from {}: icmp_seq={} ttl={} time={:.3} ms",
                    r.len + 8,
                    r.from,
                    seq,
                    r.ttl,
                    rtt.as_secs_f64() * 1e3
                );
                rtts.push(rtt.as_secs_f64() * 1e3);
            }
            Err(_) => println!("Request timeout for icmp_seq {seq}"),
        }
        if seq < a.count {
            let until = t0 + Duration::from_secs_f64(a.interval);
            let _ = host.block(until.saturating_since(host.now()), |_, now| {
                (now >= until || stop.load(Ordering::Relaxed)).then_some(Ok(()))
            });
        }
    }
    let received = rtts.len();
    println!("\n--- {} ping statistics ---", a.host);
    println!(
        "{} packets transmitted, {} received, {:.0}% packet loss, time {}ms",
        sent,
        received,
        if sent == 0 {
            0.0
        } else {
            100.0 * (sent as f64 - received as f64) / sent as f64
        },
        wall.elapsed().as_millis()
    );
    if received > 0 {
        let min = rtts.iter().cloned().fold(f64::MAX, f64::min);
        let max = rtts.iter().cloned().fold(0.0, f64::max);
        let avg = rtts.iter().sum::<f64>() / received as f64;
        let mdev = (rtts.iter().map(|r| (r - avg).powi(2)).sum::<f64>() / received as f64).sqrt();
        println!("rtt min/avg/max/mdev = {min:.3}/{avg:.3}/{max:.3}/{mdev:.3} ms");
    }
    if received == 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
