//! `flowstack bench file`: arguments → [`flowstack_bench::file::run`] → printing.

use super::{BenchArgs, PeerSel};
use flowstack_bench::file::{FileBenchReport, FileBenchSpec, FilePeers, Method, Sample};
use std::process::ExitCode;

/// Entry of `flowstack bench file`.
pub fn run(a: &BenchArgs) -> ExitCode {
    let peers = match a.peer {
        PeerSel::Flowstack => FilePeers::Flowstack,
        PeerSel::Kernel => FilePeers::Kernel,
        PeerSel::Both => FilePeers::Both,
        PeerSel::Smoltcp | PeerSel::Offload => {
            eprintln!("flowstack: bench file compares flowstack and the kernel; --peer smoltcp and --peer offload are for stream/rr/crr");
            return ExitCode::from(2);
        }
    };
    if a.cores.is_some() {
        eprintln!("flowstack: bench file runs on one core pair; --cores is for stream/rr/crr");
        return ExitCode::from(2);
    }
    let spec = FileBenchSpec {
        size: a.size.unwrap_or(1 << 30),
        peers,
        runs: a.runs,
        path: a.file.clone(),
    };
    if spec.size == 0 || spec.runs == 0 {
        eprintln!("flowstack: --size and --runs must be at least 1");
        return ExitCode::from(2);
    }
    println!(
        "flowstack bench file: {:.2} GiB, {} round(s), page cache warm; flowstack: sender and receiver engines on one thread over the in-process pipe (TSO, checksum offload); kernel: two threads over loopback; load {}",
        spec.size as f64 / (1u64 << 30) as f64,
        spec.runs,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let gib = spec.size as f64 / (1u64 << 30) as f64;
    let r = flowstack_bench::file::run(&spec, &mut |m: Method, round, s: &Sample| {
        println!(
            "[{:<26}] round {}: {:>7.3} s  {:>6.2} GiB/s  sender CPU {:.3} s/GiB  receiver {:.3} s/GiB",
            m.name(),
            round + 1,
            s.secs,
            gib / s.secs,
            s.sender_cpu_s / gib,
            s.receiver_cpu_s / gib
        );
    });
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flowstack: bench file: {e}");
            return ExitCode::from(1);
        }
    };
    summary(&r);
    if let Some(p) = &a.json {
        if let Err(e) = std::fs::write(p, r.to_json()) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

fn summary(r: &FileBenchReport) {
    println!();
    println!(
        "{:<27} {:>14} {:>17} {:>18} {:>16} {:>14}",
        "method",
        "GiB/s (median)",
        "[min - max]",
        "sender CPU s/GiB",
        "receiver s/GiB",
        "GiB per CPU s"
    );
    for m in &r.methods {
        println!(
            "{:<27} {:>14.2} {:>17} {:>18.3} {:>16} {:>14.2}",
            m.method.name(),
            m.gib_per_s,
            format!("[{:.2} - {:.2}]", m.gib_per_s_range.0, m.gib_per_s_range.1),
            m.sender_cpu_s_per_gib,
            if m.receiver_cpu_s_per_gib > 0.0 {
                format!("{:.3}", m.receiver_cpu_s_per_gib)
            } else {
                "-".to_string()
            },
            m.gib_per_cpu_s
        );
    }
    if let Some(x) = r.speedup {
        println!("speedup: flowstack send_file (read, the default) / kernel sendfile = {x:.2}x");
    }
    if let Some(x) = r.speedup_over_read_write {
        println!("flowstack send_file (read) / flowstack read/write = {x:.2}x");
    }
    if let (Some(x), Some(y)) = (r.cpu_speedup_over_read_write, r.cpu_speedup) {
        println!(
            "in CPU time (both ends; load-independent): send_file (read) / read/write = {x:.2}x, / kernel sendfile = {y:.2}x"
        );
    }
    if let Some(x) = r.map_mode_speedup {
        println!("flowstack send_file (map) / kernel sendfile = {x:.2}x");
    }
    if let Some(x) = r.map_mode_speedup_over_read_write {
        println!("flowstack send_file (map) / flowstack read/write = {x:.2}x");
    }
    if let (Some(x), Some(c)) = (r.map_over_read, r.map_over_read_cpu) {
        println!("flowstack send_file map / read: throughput {x:.2}x, sender CPU per GiB {c:.2}x");
    }
    if let Some(x) = r.cpu_ratio_vs_kernel_sendfile {
        println!("sender CPU per GiB: kernel sendfile / flowstack send_file (read) = {x:.2}x");
    }
    println!(
        "pread alone from the page cache: {:.3} s/GiB (the copy the map mode saves)",
        r.pread_s_per_gib
    );
}
