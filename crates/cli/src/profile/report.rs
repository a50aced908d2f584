//! The profile's text report: per size, a table per path (cycles, ns, share, spread,
//! counters per layer) and seed 000 §5's throughput ceilings.

use flowstack_bench::profile::{Place, Profiler};
use flowstack_prof::report::{PathReport, SizeReport};

/// What runs where, the calibration, and the counters.
pub fn header(p: &Profiler, place: &Place, threshold: f64) {
    println!("flowstack profile: per-layer cost of one TCP segment (seed 000's method)");
    println!("  on the {}", place.describe());
    println!(
        "  TSC {:.3} GHz; probe overhead {:.1} cycles in the probed layer + {:.1} in its parent, subtracted; outliers beyond {} MADs and samples with a context switch or CPU migration discarded",
        p.tsc_ghz, p.cal.cycles.own, p.cal.cycles.parent, threshold
    );
    println!("  hardware counters: {}", p.hw_note);
}

fn print_path(title: &str, size: &SizeReport, p: &PathReport, hw: bool) {
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
            Some(c) => format!(
                " {:>10.0} {:>8.1} {:>9.1}",
                c.instructions, c.cache_misses, c.dtlb_misses
            ),
            None => "  n/a".to_string(),
        };
        println!(
            "    {:<40} {:>9.0} {:>9.1} {:>6.1}% {:>9.1}{}",
            size.display_name(l),
            l.cycles,
            l.ns,
            l.share_percent,
            l.stddev_ns,
            counters
        );
    }
    println!(
        "    {:<40} {:>9.0} {:>9.1}   (between probes, measuring window removed; not in the sum)",
        "unattributed", p.unattributed.cycles, p.unattributed.ns
    );
    println!(
        "    {:<40} {:>9.0} {:>9.1}   (end-to-end with probes off: {:.1} ns; layer sum = {:.1}% of it; {} samples kept, {} discarded; layers from {} passes)",
        "total",
        p.total.cycles,
        p.total.ns,
        p.end_to_end.ns,
        p.coverage_percent,
        p.samples_kept,
        p.samples_discarded,
        p.method
    );
    if let Some(w) = p.busy_warning() {
        println!("    warning: {w}");
    }
}

/// Prints one size's tables and ceilings.
pub fn print_size(r: &SizeReport, hw: bool) {
    println!();
    println!("segment size {} bytes", r.size);
    print_path(
        "send path and its ACK processing (sender)",
        r,
        &r.paths.send,
        hw,
    );
    print_path(
        "receive path, ACK output included (receiver)",
        r,
        &r.paths.receive,
        hw,
    );
    let c = &r.ceilings;
    println!(
        "  ceilings: send {:.0} Mbit/s with ACK processing ({:.0} without); receive {:.0} Mbit/s with ACK output ({:.0} without)",
        c.send_with_ack_mbps,
        c.send_without_ack_mbps,
        c.receive_with_ack_output_mbps,
        c.receive_without_ack_output_mbps
    );
}

/// `--overhead`'s line: median Mbit/s with recording (off, on).
pub fn overhead((off, on): (f64, f64)) {
    println!();
    println!(
        "profiling overhead: 64 MiB in-process transfer, median of 3: recording off {off:.0} Mbit/s, on {on:.0} Mbit/s (on/off = {:.2})",
        on / off.max(1e-9)
    );
}
