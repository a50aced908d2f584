//! `flowstack serve --cores N`: one engine per core (seed 003), each on its own queue of the
//! link, each listening on the same port, each accepting and serving its own connections;
//! the summary gives each engine's share and the sums.

use crate::net::{stop_flag, AddrArgs, LinkArgs};
use flowstack_apps::serve::{ServeSpec, Service, Totals};
use flowstack_runtime::serve::serve_on_cores;
use flowstack_runtime::shard::{parse_cores, Placement};
use flowstack_runtime::steer::SteerCounters;
use flowstack_stack::{Counter, Counters};
use std::process::ExitCode;
use std::sync::atomic::Ordering;

pub fn run(
    cores: usize,
    cpus: Option<&str>,
    link: &LinkArgs,
    addr: &AddrArgs,
    spec: ServeSpec,
    sink: bool,
) -> ExitCode {
    if let Service::Http { root } = &spec.service {
        if !root.is_dir() {
            eprintln!("flowstack: --root {} is not a directory", root.display());
            return ExitCode::from(2);
        }
    }
    let placement = match placement(cores, cpus) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(2);
        }
    };
    let n = match &placement {
        Placement::Pinned(c) => c.len(),
        Placement::Floating => cores,
    };
    let lspec = match link.spec(addr) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(2);
        }
    };
    let port = spec.port;
    let service = spec.service.name();
    let rt = serve_on_cores(&lspec, n, placement, spec);
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(1);
        }
    };
    tracing::info!(
        "serving {service} on {}:{port} with {n} engines ({}); Ctrl-C stops",
        addr.ip.addr,
        lspec.link
    );
    let stop = stop_flag();
    let start = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) && !rt.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let secs = start.elapsed().as_secs_f64();
    let reports = rt.shutdown();
    let mut total = Totals::default();
    let mut counters = Counters::default();
    let mut steer = SteerCounters::default();
    println!("flowstack serve summary ({secs:.1} s, {n} engines):");
    let mut failed = false;
    for r in reports {
        let r = match r {
            Ok(r) => r,
            Err(p) => {
                eprintln!("flowstack: {p}");
                failed = true;
                continue;
            }
        };
        let t = r.app.totals();
        println!(
            "  engine {} (cpu {}): connections {}  requests {}  bytes in {}  bytes out {}  forwarded in {} out {}",
            r.shard.index,
            r.shard.cpu.map_or("-".to_string(), |c| c.to_string()),
            t.conns,
            t.requests,
            t.bytes_in,
            t.bytes_out,
            r.steer.received,
            r.steer.forwarded
        );
        total.conns += t.conns;
        total.requests += t.requests;
        total.bytes_in += t.bytes_in;
        total.bytes_out += t.bytes_out;
        counters.merge(&r.counters);
        steer.merge(&r.steer);
    }
    println!(
        "  all engines: connections {}  requests {}  bytes in {}  bytes out {}  retransmissions {}",
        total.conns,
        total.requests,
        total.bytes_in,
        total.bytes_out,
        counters.get(Counter::TcpRetransSegs)
    );
    if sink && secs > 0.0 {
        println!(
            "  sink throughput {:.1} Mbit/s",
            total.bytes_in as f64 * 8.0 / secs / 1e6
        );
    }
    println!("  counters, summed (drops by reason and events):");
    let mut list: Vec<String> = counters
        .nonzero()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    list.extend(
        steer
            .named()
            .iter()
            .filter(|(_, v)| *v != 0)
            .map(|(k, v)| format!("{k}={v}")),
    );
    for chunk in list.chunks(4) {
        println!("    {}", chunk.join("  "));
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `--cpus LIST` as given, else the first `cores` CPUs when the machine has them, else
/// unpinned threads.
fn placement(cores: usize, cpus: Option<&str>) -> Result<Placement, String> {
    match cpus {
        Some(list) => {
            let l = parse_cores(list).map_err(|e| format!("--cpus: {e}"))?;
            if cores > 1 && l.len() != cores {
                return Err(format!(
                    "--cpus lists {} CPUs but --cores is {cores}",
                    l.len()
                ));
            }
            Ok(Placement::Pinned(l))
        }
        None if cores <= flowstack_sys::affinity::cpu_count() => {
            Ok(Placement::Pinned((0..cores).collect()))
        }
        None => Ok(Placement::Floating),
    }
}
