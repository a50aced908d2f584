//! `flowstack profile`: seed 000's per-layer cost experiment run on flowstack.
//!
//! Two engines share one in-process link. For each segment size the harness repeats, many
//! times: A sends one segment (send path, probes on A), B acknowledges it and A processes the
//! ACK (ACK processing, probes on A); then A sends one more and B receives it, copies it to
//! the application and acknowledges (receive path, probes on B). The same steps are timed
//! again with the probes off to give the end-to-end cost the layer sums are checked against.

use clap::Args;
use flowstack_prof::counters::{HwCounters, NAMES};
use flowstack_prof::stats::{clean, net_of_overhead, summarize, ProbeCost, Summary};
use flowstack_prof::{
    activate, deactivate, disturbance, enter, rdtsc, take, Layer, Snapshot, LAYERS,
};
use flowstack_stack::sim::{bulk_transfer, Net, NetConfig, B_IP};
use flowstack_stack::{EngineConfig, TcpHandle};
use flowstack_wire::Duration;
use std::fmt::Write as _;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `flowstack profile`.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// Segment payload sizes in bytes (1..1448).
    #[arg(long, value_delimiter = ',', default_value = "100,300,500,1440")]
    sizes: Vec<usize>,
    /// Clean samples wanted per size and path.
    #[arg(long, value_name = "N", default_value_t = 5000)]
    samples: usize,
    /// Discard samples more than this many (scaled) median absolute deviations from the median.
    #[arg(long, value_name = "K", default_value_t = 5.0)]
    threshold: f64,
    /// Write the results as JSON (format in README).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw a stacked bar chart per path and size (SVG).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Also measure bulk throughput with recording on and off.
    #[arg(long)]
    overhead: bool,
}

/// Which side and phase a layer was measured in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Send,
    Ack,
    Receive,
}

fn layer_name(phase: Phase, l: Layer) -> &'static str {
    use Layer::*;
    match (phase, l) {
        (Phase::Send, AppCopyIn) => "app -> socket copy",
        (Phase::Send, TcpOutput) => "TCP output (incl. checksum)",
        (Phase::Send, IpOutput) => "IPv4 output",
        (Phase::Send, EthOutput) => "ARP/Ethernet output",
        (Phase::Send, DevTx) => "device transmit",
        (Phase::Ack, DevRx) | (Phase::Receive, DevRx) => "device receive",
        (Phase::Ack, EthIpInput) | (Phase::Receive, EthIpInput) => "Ethernet/IPv4 input",
        (Phase::Ack, TcpInput) => "TCP ACK input",
        (Phase::Ack, BufRelease) => "send buffer release",
        (Phase::Ack, TcpOutput) => "TCP output check (nothing to send)",
        (Phase::Receive, TcpInput) => "TCP input",
        (Phase::Receive, SockAppend) => "socket append (readiness is polled)",
        (Phase::Receive, AppCopyOut) => "socket -> app copy",
        (Phase::Receive, TcpOutput) => "ACK output: TCP",
        (Phase::Receive, IpOutput) => "ACK output: IPv4",
        (Phase::Receive, EthOutput) => "ACK output: Ethernet",
        (Phase::Receive, DevTx) => "ACK output: device transmit",
        (_, Engine) => "engine loop (timers, dispatch)",
        (Phase::Send, DevRx) => "device receive (poll, nothing waiting)",
        (Phase::Send, EthIpInput) | (Phase::Send, TcpInput) => "input (stray frame)",
        _ => "other",
    }
}

/// One layer's result.
struct LayerResult {
    phase: Phase,
    layer: Layer,
    cycles: Summary,
    counters: Option<[f64; 3]>,
}

/// One path (send or receive) at one size.
struct PathResult {
    layers: Vec<LayerResult>,
    /// Probed sample totals (sum of layers).
    total: Summary,
    /// End-to-end with probes off.
    e2e: Summary,
    discarded: usize,
    fast_path_hits: u64,
    /// Mean cycles inside the measured window but outside every probe.
    unattributed: f64,
}

struct SizeResult {
    size: usize,
    send: PathResult,
    receive: PathResult,
}

/// A connected pair tuned for the experiment: no delayed ACK (one ACK per segment), no Nagle.
fn setup() -> (Net, TcpHandle, TcpHandle) {
    fn tune(c: &mut EngineConfig) {
        c.tcp.defaults.delayed_ack = false;
        c.tcp.defaults.nodelay = true;
    }
    let mut net = Net::new(
        NetConfig {
            tune,
            ..Default::default()
        },
        None,
    )
    .expect("in-process net");
    let l = net.b.tcp_listen(9, 4).expect("listen");
    let now = net.now;
    let c = net
        .a
        .tcp_connect(now, SocketAddrV4::new(B_IP.into(), 9))
        .expect("connect");
    let mut s = None;
    net.run_until(Duration::from_secs(5), |n| {
        s = s.or_else(|| n.b.tcp_accept(l).ok());
        s.is_some() && n.a.tcp_conn(c).map(|k| k.is_open()).unwrap_or(false)
    });
    (net, c, s.expect("accepted"))
}

/// The probe's own cost, measured with empty probes: `own` is what an empty probe charges to
/// itself, `parent` what nesting one empty probe adds to the enclosing layer.
fn probe_overhead() -> ProbeCost {
    let mut own = Vec::with_capacity(4000);
    let mut with = Vec::with_capacity(4000);
    let mut without = Vec::with_capacity(4000);
    for i in 0..8000 {
        take();
        activate();
        {
            let _outer = enter(Layer::Engine);
            if i % 2 == 0 {
                drop(enter(Layer::Calibrate));
            }
        }
        deactivate();
        let s = take();
        let parent = s.cycles[Layer::Engine as usize] as f64;
        if i % 2 == 0 {
            own.push(s.cycles[Layer::Calibrate as usize] as f64);
            with.push(parent);
        } else {
            without.push(parent);
        }
    }
    let m = flowstack_prof::stats::median;
    ProbeCost {
        own: m(&own),
        parent: (m(&with) - m(&without)).max(0.0),
    }
}

/// Fixed cost of the measuring windows themselves, removed from both sides: (cycles outside
/// every probe in an empty probed window, cycles of an empty unprobed window).
fn window_costs() -> (f64, f64) {
    let hw = None;
    let probed: Vec<f64> = (0..2000)
        .map(|_| measure(&hw, || ()).0.cycles[Layer::Outside as usize] as f64)
        .collect();
    let off: Vec<f64> = (0..2000).map(|_| timed(|| ())).collect();
    let m = flowstack_prof::stats::median;
    (m(&probed), m(&off))
}

/// TSC ticks per nanosecond, measured against the monotonic clock.
fn tsc_per_ns() -> f64 {
    let t0 = std::time::Instant::now();
    let c0 = rdtsc();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let c1 = rdtsc();
    (c1 - c0) as f64 / t0.elapsed().as_nanos() as f64
}

struct Raw {
    snaps: Vec<Snapshot>,
    hw: Vec<[u64; 3]>,
    disturbed: Vec<bool>,
    e2e: Vec<f64>,
    e2e_disturbed: Vec<bool>,
}

impl Raw {
    fn new() -> Self {
        Raw {
            snaps: vec![],
            hw: vec![],
            disturbed: vec![],
            e2e: vec![],
            e2e_disturbed: vec![],
        }
    }
}

/// Runs `f` with the recorder on. Returns what it recorded and the hardware counter deltas.
/// (Disturbance is checked per iteration, away from the window: a system call right before a
/// window would leave its cache/TLB aftermath inside it.)
fn measure<T>(hw: &Option<HwCounters>, f: impl FnOnce() -> T) -> (Snapshot, [u64; 3], T) {
    let h0 = hw.as_ref().map(|h| h.read()).unwrap_or_default();
    take();
    activate();
    let r = f();
    deactivate();
    let h1 = hw.as_ref().map(|h| h.read()).unwrap_or_default();
    let snap = take();
    let delta = [h1[0] - h0[0], h1[1] - h0[1], h1[2] - h0[2]];
    (snap, delta, r)
}

/// Cycles `f` takes with the recorder off.
fn timed(f: impl FnOnce()) -> f64 {
    let t0 = rdtsc();
    f();
    (rdtsc() - t0) as f64
}

fn run_size(
    size: usize,
    samples: usize,
    k: f64,
    per_probe: ProbeCost,
    windows: (f64, f64),
    hw: &Option<HwCounters>,
) -> SizeResult {
    let (mut net, c, s) = setup();
    let data = vec![0x5au8; size];
    let mut buf = vec![0u8; 4096];
    let mut send = Raw::new();
    let mut ack = Raw::new();
    let mut recv = Raw::new();
    let hp0 = net
        .b
        .counters()
        .get(flowstack_stack::Counter::TcpExtTCPHPHits);
    let warmup = 200;
    for i in 0..samples + samples / 4 + warmup {
        let keep = i >= warmup;
        let d0 = disturbance();
        net.now += Duration::from_micros(20);
        // Send path on A.
        let (sn, sh, _) = measure(hw, || {
            let _ = net.a.tcp_send(c, &data);
            net.poll_a();
        });
        net.poll_b();
        // ACK processing on A.
        let (an, ah, _) = measure(hw, || {
            net.poll_a();
        });
        while net.b.tcp_recv(s, &mut buf).map(|n| n > 0).unwrap_or(false) {}
        // Receive path on B.
        let _ = net.a.tcp_send(c, &data);
        net.poll_a();
        let (rn, rh, _) = measure(hw, || {
            net.poll_b();
            while net.b.tcp_recv(s, &mut buf).map(|n| n > 0).unwrap_or(false) {}
        });
        net.poll_a();
        // The same three steps with the probes off, for the end-to-end reference.
        let es = timed(|| {
            let _ = net.a.tcp_send(c, &data);
            net.poll_a();
        });
        net.poll_b();
        let ea = timed(|| {
            net.poll_a();
        });
        while net.b.tcp_recv(s, &mut buf).map(|n| n > 0).unwrap_or(false) {}
        let _ = net.a.tcp_send(c, &data);
        net.poll_a();
        let er = timed(|| {
            net.poll_b();
            while net.b.tcp_recv(s, &mut buf).map(|n| n > 0).unwrap_or(false) {}
        });
        net.poll_a();
        let d = d0 != disturbance();
        if keep {
            for (raw, snap, h, e) in [
                (&mut send, sn, sh, es),
                (&mut ack, an, ah, ea),
                (&mut recv, rn, rh, er),
            ] {
                raw.snaps.push(snap);
                raw.hw.push(h);
                raw.disturbed.push(d);
                raw.e2e.push(e);
                raw.e2e_disturbed.push(d);
            }
        }
    }
    let fast = net
        .b
        .counters()
        .get(flowstack_stack::Counter::TcpExtTCPHPHits)
        - hp0;
    let send_path = combine(
        &[(Phase::Send, &send), (Phase::Ack, &ack)],
        k,
        per_probe,
        windows,
        hw.is_some(),
    );
    let mut recv_path = combine(
        &[(Phase::Receive, &recv)],
        k,
        per_probe,
        windows,
        hw.is_some(),
    );
    recv_path.fast_path_hits = fast;
    SizeResult {
        size,
        send: send_path,
        receive: recv_path,
    }
}

/// Cleans the samples of each phase and builds the per-layer table of a path.
fn combine(
    phases: &[(Phase, &Raw)],
    k: f64,
    per_probe: ProbeCost,
    windows: (f64, f64),
    have_hw: bool,
) -> PathResult {
    let mut layers = Vec::new();
    let mut total = 0.0;
    let mut total_var = 0.0;
    let mut e2e = 0.0;
    let mut e2e_var = 0.0;
    let mut discarded = 0;
    let mut kept_min = usize::MAX;
    let mut unattributed = 0.0;
    for &(phase, raw) in phases {
        let net = |s: &Snapshot, l: usize| {
            net_of_overhead(s.cycles[l], s.entries[l], s.children[l], per_probe)
        };
        let totals: Vec<f64> = raw
            .snaps
            .iter()
            .map(|s| (1..LAYERS).map(|l| net(s, l)).sum())
            .collect();
        let keep = clean(&totals, &raw.disturbed, k);
        discarded += raw.snaps.len() - keep.len();
        unattributed += (keep
            .iter()
            .map(|&i| net(&raw.snaps[i], Layer::Outside as usize))
            .sum::<f64>()
            / keep.len().max(1) as f64
            - windows.0)
            .max(0.0);
        kept_min = kept_min.min(keep.len());
        for &layer in &Layer::ALL[1..] {
            let l = layer as usize;
            if layer == Layer::Calibrate || raw.snaps.iter().all(|s| s.entries[l] == 0) {
                continue;
            }
            let v: Vec<f64> = keep.iter().map(|&i| net(&raw.snaps[i], l)).collect();
            layers.push(LayerResult {
                phase,
                layer,
                cycles: summarize(&v),
                counters: None,
            });
        }
        let t = summarize(&keep.iter().map(|&i| totals[i]).collect::<Vec<_>>());
        total += t.mean;
        total_var += t.stddev.powi(2);
        let ek = clean(&raw.e2e, &raw.e2e_disturbed, k);
        let e = summarize(
            &ek.iter()
                .map(|&i| (raw.e2e[i] - windows.1).max(0.0))
                .collect::<Vec<_>>(),
        );
        e2e += e.mean;
        e2e_var += e.stddev.powi(2);
        if have_hw {
            // Hardware counters are read per phase (not per layer): charge them to the phase's
            // layers in proportion to their cycles.
            let n = keep.len().max(1) as f64;
            let mut sums = [0.0; 3];
            for &i in &keep {
                for (j, s) in sums.iter_mut().enumerate() {
                    *s += raw.hw[i][j] as f64;
                }
            }
            for lr in layers.iter_mut().filter(|lr| lr.phase == phase) {
                let share = if t.mean > 0.0 {
                    lr.cycles.mean / t.mean
                } else {
                    0.0
                };
                lr.counters = Some([
                    sums[0] / n * share,
                    sums[1] / n * share,
                    sums[2] / n * share,
                ]);
            }
        }
    }
    let s = |mean: f64, var: f64| Summary {
        mean,
        stddev: var.sqrt(),
        min: 0.0,
        max: 0.0,
        kept: kept_min,
    };
    PathResult {
        layers,
        total: s(total, total_var),
        e2e: s(e2e, e2e_var),
        discarded,
        fast_path_hits: 0,
        unattributed,
    }
}

fn sum_phase(p: &PathResult, ph: Phase) -> f64 {
    p.layers
        .iter()
        .filter(|l| l.phase == ph)
        .map(|l| l.cycles.mean)
        .sum()
}

fn sum_where(p: &PathResult, f: impl Fn(&LayerResult) -> bool) -> f64 {
    p.layers
        .iter()
        .filter(|l| f(l))
        .map(|l| l.cycles.mean)
        .sum()
}

/// Seed 000 §5 upper bounds, Mbit/s: one segment per path cost.
fn ceilings(r: &SizeResult, tpn: f64) -> [(&'static str, f64); 4] {
    let bits = r.size as f64 * 8.0;
    let mbps = |cycles: f64| {
        if cycles > 0.0 {
            bits / (cycles / tpn) * 1e3
        } else {
            0.0
        }
    };
    let send = sum_phase(&r.send, Phase::Send);
    let ack = sum_phase(&r.send, Phase::Ack);
    let recv = sum_phase(&r.receive, Phase::Receive);
    let ack_out = sum_where(&r.receive, |l| {
        matches!(
            l.layer,
            Layer::TcpOutput | Layer::IpOutput | Layer::EthOutput | Layer::DevTx
        )
    });
    [
        ("send_with_ack_mbps", mbps(send + ack)),
        ("send_without_ack_mbps", mbps(send)),
        ("receive_with_ack_output_mbps", mbps(recv)),
        ("receive_without_ack_output_mbps", mbps(recv - ack_out)),
    ]
}

pub fn run(a: ProfileArgs) -> ExitCode {
    if a.sizes.is_empty() || a.sizes.iter().any(|&s| s == 0 || s > 1448) {
        eprintln!("flowstack: --sizes must be between 1 and 1448 bytes (one segment)");
        return ExitCode::from(2);
    }
    if a.samples < 20 || a.samples > 1_000_000 {
        eprintln!("flowstack: --samples must be between 20 and 1000000");
        return ExitCode::from(2);
    }
    if let Some(p) = &a.plot {
        if p.extension().and_then(|e| e.to_str()) != Some("svg") {
            eprintln!("flowstack: --plot writes SVG; give a FILE.svg (PNG output is not built in)");
            return ExitCode::from(2);
        }
    }
    if !flowstack_prof::ENABLED {
        eprintln!(
            "flowstack: this binary was built without probes (feature flowstack-prof/probes)"
        );
        return ExitCode::from(1);
    }
    let tpn = tsc_per_ns();
    let per_probe = probe_overhead();
    let windows = window_costs();
    let hw = HwCounters::open();
    let hw_note = match &hw {
        Ok(_) => "instructions, cache misses and dTLB misses from perf_event_open (per phase, shared by cycles)".to_string(),
        Err(e) => format!("n/a: {e}"),
    };
    let hw = hw.ok();
    println!("flowstack profile: per-layer cost of one TCP segment (seed 000's method)");
    println!(
        "  TSC {:.3} GHz; probe overhead {:.1} cycles in the probed layer + {:.1} in its parent, subtracted; outliers beyond {} MADs and samples with a context switch or CPU migration discarded",
        tpn, per_probe.own, per_probe.parent, a.threshold
    );
    println!("  hardware counters: {hw_note}");
    let mut results = Vec::new();
    for &size in &a.sizes {
        let r = run_size(size, a.samples, a.threshold, per_probe, windows, &hw);
        print_size(&r, tpn, hw.is_some());
        results.push(r);
    }
    if a.overhead {
        overhead_report();
    }
    if let Some(p) = &a.json {
        if let Err(e) = std::fs::write(p, to_json(&results, tpn, per_probe, &hw_note, hw.is_some()))
        {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
        println!("json  {}", p.display());
    }
    if let Some(p) = &a.plot {
        if let Err(e) = std::fs::write(p, to_svg(&results, tpn)) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
        println!("plot  {}", p.display());
    }
    ExitCode::SUCCESS
}

fn print_path(title: &str, p: &PathResult, tpn: f64, hw: bool) {
    println!("  {title}");
    println!(
        "    {:<40} {:>9} {:>9} {:>7} {:>9}{}",
        "layer",
        "cycles",
        "ns",
        "share",
        "+-ns",
        if hw {
            "      instr   c-miss  tlb-miss"
        } else {
            "  counters"
        }
    );
    for l in &p.layers {
        let name = if l.layer == Layer::TcpInput && l.phase == Phase::Receive {
            if p.fast_path_hits > 0 {
                "TCP input (header prediction: fast path)"
            } else {
                "TCP input (header prediction: slow path)"
            }
        } else {
            layer_name(l.phase, l.layer)
        };
        let counters = match l.counters {
            Some(c) => format!(" {:>10.0} {:>8.1} {:>9.1}", c[0], c[1], c[2]),
            None => "  n/a".to_string(),
        };
        println!(
            "    {:<40} {:>9.0} {:>9.1} {:>6.1}% {:>9.1}{}",
            name,
            l.cycles.mean,
            l.cycles.mean / tpn,
            100.0 * l.cycles.mean / p.total.mean.max(1e-9),
            l.cycles.stddev / tpn,
            counters
        );
    }
    println!(
        "    {:<40} {:>9.0} {:>9.1}   (between probes, measuring window removed; not in the sum)",
        "unattributed",
        p.unattributed,
        p.unattributed / tpn
    );
    let cover = 100.0 * p.total.mean / p.e2e.mean.max(1e-9);
    println!(
        "    {:<40} {:>9.0} {:>9.1}   (end-to-end with probes off: {:.1} ns; layer sum = {:.1}% of it; {} samples kept, {} discarded)",
        "total",
        p.total.mean,
        p.total.mean / tpn,
        p.e2e.mean / tpn,
        cover,
        p.total.kept,
        p.discarded
    );
}

fn print_size(r: &SizeResult, tpn: f64, hw: bool) {
    println!();
    println!("segment size {} bytes", r.size);
    print_path("send path (A) and ACK processing (A)", &r.send, tpn, hw);
    print_path("receive path (B), ACK output included", &r.receive, tpn, hw);
    let c = ceilings(r, tpn);
    println!(
        "  ceilings: send {:.0} Mbit/s with ACK processing ({:.0} without); receive {:.0} Mbit/s with ACK output ({:.0} without)",
        c[0].1, c[1].1, c[2].1, c[3].1
    );
}

/// Bulk throughput with the recorder active and inactive (a measurement, not a test).
fn overhead_report() {
    let mut off = vec![];
    let mut on = vec![];
    for i in 0..6 {
        let mut net = Net::new(NetConfig::default(), None).expect("net");
        let active = i % 2 == 1;
        if active {
            activate();
        }
        let t = std::time::Instant::now();
        let r = bulk_transfer(&mut net, 64 << 20, Duration::from_secs(600), |_| {}, |_| {});
        let secs = t.elapsed().as_secs_f64();
        deactivate();
        take();
        if let Ok(r) = r {
            let mbps = r.received as f64 * 8.0 / secs / 1e6;
            if active {
                on.push(mbps)
            } else {
                off.push(mbps)
            }
        }
    }
    let m = |v: &Vec<f64>| flowstack_prof::stats::median(v);
    println!();
    println!(
        "profiling overhead: 64 MiB in-process transfer, median of 3: recording off {:.0} Mbit/s, on {:.0} Mbit/s (on/off = {:.2})",
        m(&off),
        m(&on),
        m(&on) / m(&off).max(1e-9)
    );
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Send => "send",
        Phase::Ack => "ack_processing",
        Phase::Receive => "receive",
    }
}

fn to_json(
    results: &[SizeResult],
    tpn: f64,
    per_probe: ProbeCost,
    hw_note: &str,
    hw: bool,
) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\n  \"tool\": \"flowstack profile\",\n  \"tsc_ghz\": {:.4},\n  \"probe_overhead_cycles\": {{\"own\": {:.2}, \"parent\": {:.2}}},\n  \"hardware_counters\": {},\n  \"counter_names\": [{}],\n  \"sizes\": [\n",
        tpn,
        per_probe.own,
        per_probe.parent,
        if hw { "true".to_string() } else { format!("{:?}", hw_note) },
        NAMES.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ")
    );
    for (i, r) in results.iter().enumerate() {
        let _ = writeln!(
            s,
            "    {{\n      \"size\": {},\n      \"paths\": {{",
            r.size
        );
        for (j, (name, p)) in [("send", &r.send), ("receive", &r.receive)]
            .iter()
            .enumerate()
        {
            let _ = writeln!(s, "        \"{name}\": {{\n          \"layers\": [");
            for (k, l) in p.layers.iter().enumerate() {
                let counters = match l.counters {
                    Some(c) => format!(
                        ", \"counters\": {{\"instructions\": {:.1}, \"cache_misses\": {:.2}, \"dtlb_misses\": {:.2}}}",
                        c[0], c[1], c[2]
                    ),
                    None => String::new(),
                };
                let _ = writeln!(
                    s,
                    "            {{\"name\": \"{}\", \"layer\": \"{:?}\", \"phase\": \"{}\", \"cycles\": {:.1}, \"ns\": {:.2}, \"stddev_ns\": {:.2}{}}}{}",
                    layer_name(l.phase, l.layer),
                    l.layer,
                    phase_name(l.phase),
                    l.cycles.mean,
                    l.cycles.mean / tpn,
                    l.cycles.stddev / tpn,
                    counters,
                    if k + 1 < p.layers.len() { "," } else { "" }
                );
            }
            let _ = writeln!(
                s,
                "          ],\n          \"total\": {{\"cycles\": {:.1}, \"ns\": {:.2}}},\n          \"end_to_end\": {{\"cycles\": {:.1}, \"ns\": {:.2}}},\n          \"samples_kept\": {},\n          \"samples_discarded\": {}\n        }}{}",
                p.total.mean,
                p.total.mean / tpn,
                p.e2e.mean,
                p.e2e.mean / tpn,
                p.total.kept,
                p.discarded,
                if j == 0 { "," } else { "" }
            );
        }
        let c = ceilings(r, tpn);
        let _ = writeln!(
            s,
            "      }},\n      \"ceilings\": {{{}}},\n      \"fast_path_hits\": {}\n    }}{}",
            c.iter()
                .map(|(k, v)| format!("\"{k}\": {v:.1}"))
                .collect::<Vec<_>>()
                .join(", "),
            r.receive.fast_path_hits,
            if i + 1 < results.len() { "," } else { "" }
        );
    }
    s.push_str("  ]\n}\n");
    s
}

fn to_svg(results: &[SizeResult], tpn: f64) -> String {
    let colors = [
        "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
        "#9c755f", "#bab0ac", "#86bcb6", "#d37295",
    ];
    let bar_h = 22.0;
    let gap = 10.0;
    let left = 190.0;
    let width = 640.0;
    let rows: Vec<(String, &PathResult)> = results
        .iter()
        .flat_map(|r| {
            [
                (format!("send+ACK {} B", r.size), &r.send),
                (format!("receive {} B", r.size), &r.receive),
            ]
        })
        .collect();
    let max = rows
        .iter()
        .map(|(_, p)| p.total.mean / tpn)
        .fold(1.0, f64::max);
    let mut names: Vec<String> = vec![];
    for (_, p) in &rows {
        for l in &p.layers {
            let n = format!("{}: {}", phase_name(l.phase), layer_name(l.phase, l.layer));
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    let legend_h = 16.0 * names.len() as f64;
    let h = 40.0 + rows.len() as f64 * (bar_h + gap) + 30.0 + legend_h;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\" font-size=\"14\">flowstack per-layer cost of one segment (ns, probes' overhead subtracted)</text>\n",
        left + width + 40.0
    );
    for (i, (label, p)) in rows.iter().enumerate() {
        let y = 40.0 + i as f64 * (bar_h + gap);
        let _ = writeln!(s, "<text x=\"10\" y=\"{}\">{label}</text>", y + 15.0);
        let mut x = left;
        for l in &p.layers {
            let n = format!("{}: {}", phase_name(l.phase), layer_name(l.phase, l.layer));
            let c = colors[names.iter().position(|m| *m == n).unwrap_or(0) % colors.len()];
            let w = l.cycles.mean / tpn / max * width;
            let _ = writeln!(
                s,
                "<rect x=\"{x:.1}\" y=\"{y}\" width=\"{w:.1}\" height=\"{bar_h}\" fill=\"{c}\"><title>{n}: {:.1} ns</title></rect>",
                l.cycles.mean / tpn
            );
            x += w;
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\">{:.0} ns</text>",
            x + 4.0,
            y + 15.0,
            p.total.mean / tpn
        );
    }
    let ly = 40.0 + rows.len() as f64 * (bar_h + gap) + 20.0;
    for (i, n) in names.iter().enumerate() {
        let y = ly + i as f64 * 16.0;
        let _ = writeln!(
            s,
            "<rect x=\"10\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"28\" y=\"{}\">{n}</text>",
            y,
            colors[i % colors.len()],
            y + 11.0
        );
    }
    s.push_str("</svg>\n");
    s
}
