//! What `flowstack bench` prints: the header, a line (or iperf3-like interval lines) per run,
//! the summary with medians and the speedup, and a progress bar on stderr while runs go.

use flowstack_bench::BenchSpec;
use flowstack_prof::report::{BenchLink, BenchReport, Peer, RunResult, Workload};
use indicatif::{ProgressBar, ProgressStyle};

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// The first line: what runs, over what, with which optimisations.
pub fn header(s: &BenchSpec) {
    let o = &s.opts;
    println!(
        "flowstack bench {}: msg {} B, {} conn(s), {:.1} s x {} run(s); flowstack over {} (checksum offload {}, TSO {}, zero-copy send/receive {}, delayed ACK {}), kernel over loopback",
        s.workload.name(),
        s.msg_size(),
        s.conns,
        s.duration,
        s.runs,
        match s.link {
            BenchLink::Shm => "shm wire, 2 processes",
            BenchLink::Pipe => "in-process pipe, 1 process",
        },
        on(!o.no_checksum_offload),
        on(!o.no_tso),
        on(!o.no_zero_copy),
        on(!o.no_delayed_ack),
    );
    if let Some(n) = s.cores {
        println!("--cores {n}: {}", flowstack_bench::cores::placement(n));
        println!(
            "  the load generator and the server share the same {n} CPU(s) in both peers, so rate(N) / (N * rate(1)) is a fair scaling efficiency"
        );
    }
}

/// One run's lines.
pub fn run(w: Workload, peer: Peer, r: &RunResult) {
    let name = peer.name();
    match w {
        Workload::Stream => {
            for (i, b) in r.intervals.iter().enumerate() {
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
                r.secs,
                r.bytes as f64 / 1e6,
                r.metric / 1e3
            );
        }
        Workload::Rr => {
            let l = r.latency.unwrap_or(flowstack_prof::report::Percentiles {
                p50_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p99_9_us: 0.0,
            });
            println!(
                "[{name:>9}] {} transactions in {:.2} s = {:.0} tps; latency usec p50 {:.2} p90 {:.2} p99 {:.2} p99.9 {:.2}",
                r.transactions, r.secs, r.metric, l.p50_us, l.p90_us, l.p99_us, l.p99_9_us
            );
        }
        Workload::Crr => println!(
            "[{name:>9}] {} connect/request/response/close in {:.2} s = {:.0} per second",
            r.transactions, r.secs, r.metric
        ),
    }
    for c in &r.per_core {
        let cpu = c.cpu.map_or("unpinned".into(), |c| format!("CPU {c}"));
        let mut line = format!(
            "[{name:>9}]   core {} ({cpu}, {} conn(s)): {:.0} {}",
            c.core,
            c.conns,
            c.metric,
            w.unit()
        );
        if let Some(a) = c.accepted {
            line += &format!("; its SO_REUSEPORT listener accepted {a}");
        }
        if let Some(e) = &c.engines {
            line += &format!(
                "; client opened {} closed {} left {}, server opened {} closed {} left {}, timers left {}, misdirected SYNs {}",
                e.client.opened,
                e.client.closed,
                e.client.connections_left,
                e.server.opened,
                e.server.closed,
                e.server.connections_left,
                e.client.timers_left + e.server.timers_left,
                e.misdirected_syns
            );
        }
        println!("{line}");
    }
}

/// The last run's per-core engine counters, per core and summed (flowstack with --cores).
fn per_core_counters(r: &BenchReport) {
    let Some(run) = r
        .peers
        .get(&Peer::Flowstack)
        .and_then(|s| s.run_results.last())
    else {
        return;
    };
    if run.per_core.is_empty() {
        return;
    }
    let n = run.per_core.len();
    for (side, server) in [("client", false), ("server", true)] {
        let rows = flowstack_bench::cores::counter_rows(&run.per_core, server);
        let heads: Vec<String> = (0..n).map(|k| format!("core {k}")).collect();
        println!("flowstack {side} engines per core and summed (last run, after the drain):");
        println!(
            "  {:<30} {} {:>12}",
            "",
            heads
                .iter()
                .map(|h| format!("{h:>12}"))
                .collect::<Vec<_>>()
                .join(" "),
            "sum"
        );
        for (name, vals) in rows {
            println!(
                "  {name:<30} {}",
                vals.iter()
                    .map(|v| format!("{v:>12}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }
    if let Some(s) = &run.summed {
        println!(
            "flowstack summed: client opened {} closed {} left {}; server opened {} closed {} left {}; engines with timers left {}; misdirected SYNs {}",
            s.client.opened,
            s.client.closed,
            s.client.connections_left,
            s.server.opened,
            s.server.closed,
            s.server.connections_left,
            s.client.timers_left + s.server.timers_left,
            s.misdirected_syns
        );
    }
}

/// Medians per peer and the speedup.
pub fn summary(r: &BenchReport) {
    let unit = r.workload.unit();
    println!();
    per_core_counters(r);
    for (p, s) in &r.peers {
        let (m, lo, hi) = (s.metric(), s.min, s.max);
        let p = p.name();
        match (r.workload, s.latency) {
            (Workload::Rr, Some(l)) => println!(
                "{p:>9}: median {m:.0} {unit} (min {lo:.0}, max {hi:.0}); median p50 latency {:.2} us",
                l.p50_us
            ),
            _ => println!("{p:>9}: median {m:.0} {unit} (min {lo:.0}, max {hi:.0})"),
        }
    }
    if let (Some(s), Some(vs), Some(basis)) = (r.speedup, r.speedup_vs, r.speedup_basis) {
        println!(
            "speedup (flowstack vs {}, > 1 = flowstack better): {s:.2}x ({})",
            vs.name(),
            basis.describe()
        );
    }
}

/// Runs done out of all, on stderr (hidden when stderr is not a terminal). No ticker thread:
/// it redraws only when a run starts or ends, so it takes no CPU from the runs it counts.
pub struct Progress(ProgressBar);

impl Progress {
    /// A bar over every run of every peer.
    pub fn new(s: &BenchSpec) -> Self {
        let bar = ProgressBar::new((s.peer.peers().len() * s.runs) as u64);
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} runs {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("bench {}", s.workload.name()));
        Self(bar)
    }

    /// A run starts.
    pub fn started(&self, peer: Peer, run: usize) {
        self.0
            .set_message(format!("({} run {} running)", peer.name(), run + 1));
    }

    /// A run ended.
    pub fn finished(&self) {
        self.0.inc(1);
    }

    /// Prints with the bar out of the way.
    pub fn suspend(&self, f: impl FnOnce()) {
        self.0.suspend(f)
    }

    /// Removes the bar.
    pub fn clear(&self) {
        self.0.finish_and_clear();
    }
}
