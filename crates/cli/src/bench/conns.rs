//! `flowstack bench conns`: arguments → [`flowstack_bench::conns::run`] → printing.

use super::{BenchArgs, PeerSel};
use flowstack_bench::conns::ConnsSpec;
use std::process::ExitCode;

/// Entry of `flowstack bench conns`.
pub fn run(a: &BenchArgs) -> ExitCode {
    if a.peer != PeerSel::Both && a.peer != PeerSel::Flowstack {
        eprintln!("flowstack: bench conns measures flowstack only; --peer is for stream/rr/crr");
        return ExitCode::from(2);
    }
    if a.cores.is_some() || a.size.is_some() || a.file.is_some() {
        eprintln!("flowstack: bench conns takes --count, --max-connections and --json only");
        return ExitCode::from(2);
    }
    let spec = ConnsSpec {
        count: a.count.unwrap_or(ConnsSpec::default().count),
        max_connections: a.max_connections,
    };
    if spec.count == 0 {
        eprintln!("flowstack: --count must be at least 1");
        return ExitCode::from(2);
    }
    if let Some(m) = spec.max_connections.filter(|&m| m < spec.count) {
        eprintln!(
            "flowstack: --max-connections {m} is below --count {}; raise it",
            spec.count
        );
        return ExitCode::from(2);
    }
    println!(
        "flowstack bench conns: {} connections between two engines over the in-process pipe; load {}",
        spec.count,
        flowstack_bench::conns::load_average()
    );
    let r = match flowstack_bench::conns::run(&spec) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flowstack: bench conns: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "open  {:>9} connections in {:.3} s ({:.0} conns/s)",
        r.count, r.open_s, r.conns_per_s_open
    );
    println!(
        "close {:>9} connections in {:.3} s (both tables empty)",
        r.count, r.close_s
    );
    println!(
        "per connection endpoint: {:.0} B resident, {:.0} B accounted (TCB size_of {} B)",
        r.rss_bytes_per_conn, r.accounted_bytes_per_conn, r.tcb_size
    );
    if let Some(p) = &a.json {
        if let Err(e) = std::fs::write(p, r.to_json()) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
