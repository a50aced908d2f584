//! The profile's text report, its JSON file and seed 000 §5's throughput ceilings.

use super::analysis::{Calibration, Counting, LayerResult, PathResult};
use super::rig::Step;
use super::SizeResult;
use flowstack_prof::counters::NAMES;
use flowstack_prof::{activate, deactivate, take, Layer};
use flowstack_stack::netsim::{bulk_transfer, Net, NetConfig};
use flowstack_wire::Duration;
use std::fmt::Write as _;

/// What a layer is called in a given step.
pub fn layer_name(step: Step, l: Layer) -> &'static str {
    use Layer::*;
    match (step, l) {
        (Step::Send, AppCopyIn) => "app -> socket copy",
        (Step::Send, TcpOutput) => "TCP output: what to send",
        (Step::Send, TcpEmit) => "TCP output: header, payload copy, checksum",
        (Step::Send, IpOutput) => "IPv4 output",
        (Step::Send, EthOutput) => "ARP/Ethernet output",
        (Step::Send, DevTx) => "device transmit",
        (Step::Ack, DevRx) | (Step::Receive, DevRx) => "device receive",
        (Step::Ack, EthIpInput) | (Step::Receive, EthIpInput) => "Ethernet/IPv4 input",
        (Step::Ack, TcpInput) => "TCP ACK input",
        (Step::Ack, BufRelease) => "send buffer release",
        (Step::Ack, TcpOutput) => "TCP output check (nothing to send)",
        (Step::Receive, TcpInput) => "TCP input",
        (Step::Receive, SockAppend) => "socket append (readiness is polled)",
        (Step::Receive, AppCopyOut) => "socket -> app copy",
        (Step::Receive, TcpOutput) => "ACK output: TCP",
        (Step::Receive, TcpEmit) => "ACK output: TCP header, checksum",
        (Step::Receive, IpOutput) => "ACK output: IPv4",
        (Step::Receive, EthOutput) => "ACK output: Ethernet",
        (Step::Receive, DevTx) => "ACK output: device transmit",
        (_, Engine) => "engine loop (timers, dispatch)",
        (Step::Send, DevRx) => "device receive (poll, nothing waiting)",
        (Step::Send, EthIpInput) | (Step::Send, TcpInput) => "input (stray frame)",
        _ => "other",
    }
}

/// The step's name in JSON.
pub fn step_name(s: Step) -> &'static str {
    match s {
        Step::Send => "send",
        Step::Ack => "ack_processing",
        Step::Receive => "receive",
    }
}

/// A layer's name in the report, with header prediction's outcome for TCP input.
fn display_name(p: &PathResult, l: &LayerResult) -> &'static str {
    if l.layer == Layer::TcpInput && l.phase == Step::Receive {
        if p.fast_path_hits > 0 {
            "TCP input (header prediction: fast path)"
        } else {
            "TCP input (header prediction: slow path)"
        }
    } else {
        layer_name(l.phase, l.layer)
    }
}

/// The layer sum as a share of the probes-off end-to-end cost, in percent.
pub fn coverage(p: &PathResult) -> f64 {
    100.0 * p.total / p.e2e.max(1e-9)
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
        let counters = match l.counters {
            Some(c) => format!(" {:>10.0} {:>8.1} {:>9.1}", c[0], c[1], c[2]),
            None => "  n/a".to_string(),
        };
        println!(
            "    {:<40} {:>9.0} {:>9.1} {:>6.1}% {:>9.1}{}",
            display_name(p, l),
            l.cycles,
            l.cycles / tpn,
            100.0 * l.cycles / p.total.max(1e-9),
            l.stddev / tpn,
            counters
        );
    }
    println!(
        "    {:<40} {:>9.0} {:>9.1}   (between probes, measuring window removed; not in the sum)",
        "unattributed",
        p.unattributed,
        p.unattributed / tpn
    );
    println!(
        "    {:<40} {:>9.0} {:>9.1}   (end-to-end with probes off: {:.1} ns; layer sum = {:.1}% of it; {} samples kept, {} discarded; layers from {} passes)",
        "total",
        p.total,
        p.total / tpn,
        p.e2e / tpn,
        coverage(p),
        p.kept,
        p.discarded,
        p.method
    );
    if let Some(w) = busy_warning(p) {
        println!("    warning: {w}");
    }
}

/// A warning when more than a fifth of a path's samples were discarded: the machine was busy
/// (in a VM, the host), and what was kept may not stand for the whole run.
pub fn busy_warning(p: &PathResult) -> Option<String> {
    (p.discarded * 5 > p.taken).then(|| {
        format!(
            "{:.0}% of the samples were discarded (the machine was busy); these figures are less reliable, run again",
            100.0 * p.discarded as f64 / p.taken.max(1) as f64
        )
    })
}

/// Prints one size's tables and ceilings.
pub fn print_size(r: &SizeResult, tpn: f64, hw: bool) {
    println!();
    println!("segment size {} bytes", r.size);
    print_path(
        "send path and its ACK processing (sender)",
        &r.send,
        tpn,
        hw,
    );
    print_path(
        "receive path, ACK output included (receiver)",
        &r.receive,
        tpn,
        hw,
    );
    let c = ceilings(r, tpn);
    println!(
        "  ceilings: send {:.0} Mbit/s with ACK processing ({:.0} without); receive {:.0} Mbit/s with ACK output ({:.0} without)",
        c[0].1, c[1].1, c[2].1, c[3].1
    );
}

fn sum_where(p: &PathResult, f: impl Fn(&LayerResult) -> bool) -> f64 {
    p.layers.iter().filter(|l| f(l)).map(|l| l.cycles).sum()
}

/// Seed 000 §5 upper bounds, Mbit/s: one segment per path cost.
pub fn ceilings(r: &SizeResult, tpn: f64) -> [(&'static str, f64); 4] {
    let bits = r.size as f64 * 8.0;
    let mbps = |cycles: f64| {
        if cycles > 0.0 {
            bits / (cycles / tpn) * 1e3
        } else {
            0.0
        }
    };
    let send = sum_where(&r.send, |l| l.phase == Step::Send);
    let ack = sum_where(&r.send, |l| l.phase == Step::Ack);
    let recv = r.receive.total;
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

/// Bulk throughput with the recorder active and inactive (a measurement, not a test).
pub fn overhead_report() {
    let mut off = vec![];
    let mut on = vec![];
    for i in 0..6 {
        let Ok(mut net) = Net::new(NetConfig::default(), None) else {
            continue;
        };
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

/// The JSON document (format in README).
pub fn to_json(
    results: &[SizeResult],
    tpn: f64,
    cal: &Calibration,
    hw_note: &str,
    counting: Counting,
    link: &str,
) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\n  \"tool\": \"flowstack profile\",\n  \"link\": {:?},\n  \"tsc_ghz\": {:.4},\n  \"probe_overhead_cycles\": {{\"own\": {:.2}, \"parent\": {:.2}}},\n  \"hardware_counters\": {},\n  \"counters_per\": \"{}\",\n  \"counter_names\": [{}],\n  \"sizes\": [\n",
        link,
        tpn,
        cal.cycles.own,
        cal.cycles.parent,
        if counting == Counting::None {
            format!("{hw_note:?}")
        } else {
            "true".to_string()
        },
        match counting {
            Counting::None => "none",
            Counting::PerStep => "step",
            Counting::PerLayer => "layer",
        },
        NAMES
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
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
                        ", \"counters\": {{\"{}\": {:.1}, \"{}\": {:.2}, \"{}\": {:.2}}}",
                        NAMES[0], c[0], NAMES[1], c[1], NAMES[2], c[2]
                    ),
                    None => String::new(),
                };
                let _ = writeln!(
                    s,
                    "            {{\"name\": \"{}\", \"layer\": \"{:?}\", \"phase\": \"{}\", \"cycles\": {:.1}, \"ns\": {:.2}, \"stddev_ns\": {:.2}{}}}{}",
                    layer_name(l.phase, l.layer),
                    l.layer,
                    step_name(l.phase),
                    l.cycles,
                    l.cycles / tpn,
                    l.stddev / tpn,
                    counters,
                    if k + 1 < p.layers.len() { "," } else { "" }
                );
            }
            let _ = writeln!(
                s,
                "          ],\n          \"total\": {{\"cycles\": {:.1}, \"ns\": {:.2}}},\n          \"end_to_end\": {{\"cycles\": {:.1}, \"ns\": {:.2}}},\n          \"coverage_percent\": {:.1},\n          \"method\": \"{}\",\n          \"samples_kept\": {},\n          \"samples_discarded\": {}\n        }}{}",
                p.total,
                p.total / tpn,
                p.e2e,
                p.e2e / tpn,
                coverage(p),
                p.method,
                p.kept,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn path(taken: usize, discarded: usize) -> PathResult {
        PathResult {
            layers: vec![],
            total: 0.0,
            e2e: 0.0,
            e2e_stddev: 0.0,
            kept: taken - discarded,
            discarded,
            taken,
            unattributed: 0.0,
            method: String::new(),
            fast_path_hits: 0,
        }
    }

    #[test]
    fn a_busy_run_is_flagged_from_a_fifth_of_the_samples_discarded() {
        assert_eq!(busy_warning(&path(10_000, 2_000)), None);
        let w = busy_warning(&path(10_000, 2_001)).expect("flagged");
        assert!(w.starts_with("20% of the samples were discarded"), "{w}");
    }
}
