//! `flowstack profile`: seed 000's per-layer cost experiment run on flowstack.
//!
//! For each segment size the harness repeats three steps many times — one segment sent,
//! its ACK processed, one segment received (and acknowledged) — on the in-process link
//! between two engines ([`rig::SimRig`]) or on a real link against the kernel
//! ([`rig::LinkRig`]). Each iteration runs the steps three ways, in rotating order: with
//! every probe recording, with one layer's probes recording (see [`analysis`]), and with the
//! recorder off, which gives the end-to-end cost the layer sums are checked against. Each
//! way runs twice in a row and only the second run is kept (warm caches and predictors).

mod analysis;
mod plot;
mod report;
mod rig;

use analysis::{Calibration, Counting, PathResult, Raw, Sample};
use clap::Args;
use flowstack_prof::counters::{HwCounters, N};
use flowstack_prof::stats::{trimmed_mean, ProbeCost};
use flowstack_prof::{activate, activate_only, deactivate, disturbance, enter, rdtsc, take, Layer};
use flowstack_wire::{Ipv4Address, Ipv4Cidr};
use rig::{LinkRig, Rig, SimRig, Step};
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `flowstack profile`.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// Segment payload sizes in bytes (1..1448).
    #[arg(long, value_delimiter = ',', default_value = "100,300,500,1440")]
    sizes: Vec<usize>,
    /// Iterations per size (each samples every step; disturbed and outlying samples are
    /// then discarded).
    #[arg(long, value_name = "N", default_value_t = 5000)]
    samples: usize,
    /// Discard samples more than this many (scaled) median absolute deviations from the median.
    #[arg(long, value_name = "K", default_value_t = 5.0)]
    threshold: f64,
    /// Write the results as JSON (format in README).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw a stacked bar chart per path and size: FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Also measure bulk throughput with recording on and off.
    #[arg(long)]
    overhead: bool,
    /// LINK: profile over this TAP interface against the kernel instead of in-process.
    #[arg(long, value_name = "NAME", conflicts_with = "packet", requires_all = ["ip", "peer"])]
    tap: Option<String>,
    /// LINK: profile over this interface through AF_PACKET against the kernel.
    #[arg(long, value_name = "IFACE", requires_all = ["ip", "peer"])]
    packet: Option<String>,
    /// With --tap: no vnet header (no segmentation or checksum offload).
    #[arg(long, requires = "tap")]
    no_vnet: bool,
    /// ADDR: flowstack's address and prefix on the link, e.g. 10.0.0.2/24.
    #[arg(long, value_name = "CIDR", value_parser = |s: &str| s.parse::<Ipv4Cidr>())]
    ip: Option<Ipv4Cidr>,
    /// The kernel's address on the link's other side (an address of this host): the
    /// profiler opens a kernel socket there to send to and receive from.
    #[arg(long, value_name = "IP", value_parser = |s: &str| s.parse::<Ipv4Address>())]
    peer: Option<Ipv4Address>,
}

/// Where the profile runs.
enum Where {
    InProcess,
    Link {
        link: crate::net::LinkArgs,
        addr: crate::net::AddrArgs,
        peer: Ipv4Address,
    },
}

impl Where {
    fn from_args(a: &ProfileArgs) -> Result<Self, String> {
        if a.tap.is_none() && a.packet.is_none() {
            if a.ip.is_some() || a.peer.is_some() {
                return Err("--ip and --peer need a link: --tap NAME or --packet IFACE".into());
            }
            return Ok(Where::InProcess);
        }
        let (Some(ip), Some(peer)) = (a.ip, a.peer) else {
            return Err("a link needs --ip CIDR and --peer IP".into());
        };
        if !ip.contains(peer) || ip.addr == peer {
            return Err(format!(
                "--peer {peer} must be another address inside --ip {ip}"
            ));
        }
        Ok(Where::Link {
            link: crate::net::LinkArgs {
                tap: a.tap.clone(),
                packet: a.packet.clone(),
                no_vnet: a.no_vnet,
                shm_fd: None,
                pcap: None,
                impair: None,
                seed: 1,
            },
            addr: crate::net::AddrArgs {
                ip,
                gw: None,
                mac: None,
            },
            peer,
        })
    }

    fn describe(&self) -> String {
        match self {
            Where::InProcess => "in-process link between two flowstack engines".into(),
            Where::Link { link, addr, peer } => format!(
                "{} {} as {} against the kernel at {}",
                if link.tap.is_some() {
                    "TAP"
                } else {
                    "AF_PACKET"
                },
                link.tap
                    .as_deref()
                    .or(link.packet.as_deref())
                    .unwrap_or("?"),
                addr.ip,
                peer
            ),
        }
    }

    fn rig(&self, size: usize) -> Result<Box<dyn Rig>, String> {
        Ok(match self {
            Where::InProcess => Box::new(SimRig::new(size)?),
            Where::Link { link, addr, peer } => Box::new(LinkRig::new(link, addr, *peer, size)?),
        })
    }
}

/// One size's results.
pub struct SizeResult {
    size: usize,
    send: PathResult,
    receive: PathResult,
}

/// Layers the inclusive passes rotate over: every real layer (all but `Outside` and
/// `Calibrate`, the first and last of `Layer::ALL`).
const ROTATE: &[Layer] = {
    let (_, rest) = Layer::ALL.split_first().unwrap();
    rest.split_last().unwrap().1
};

const STEPS: [Step; 3] = [Step::Send, Step::Ack, Step::Receive];

/// The probe's own cost, measured with empty probes: `own` is what an empty probe charges to
/// itself, `parent` what nesting one empty probe adds to the enclosing layer — in cycles and
/// in each hardware event when those are counted per layer.
fn probe_overhead(hw: Option<&HwCounters>) -> [ProbeCost; 1 + N] {
    let mut own = vec![[0.0; 1 + N]; 0];
    let mut with = vec![];
    let mut without = vec![];
    for i in 0..8000 {
        flowstack_prof::use_counters(hw.and_then(|h| h.pmc()));
        take();
        settle();
        activate();
        {
            let _outer = enter(Layer::Engine);
            if i % 2 == 0 {
                drop(enter(Layer::Calibrate));
            }
        }
        deactivate();
        let s = take();
        let e = Layer::Engine as usize;
        let c = Layer::Calibrate as usize;
        let parent = [
            s.cycles[e] as f64,
            s.events[e][0] as f64,
            s.events[e][1] as f64,
            s.events[e][2] as f64,
        ];
        if i % 2 == 0 {
            own.push([
                s.cycles[c] as f64,
                s.events[c][0] as f64,
                s.events[c][1] as f64,
                s.events[c][2] as f64,
            ]);
            with.push(parent);
        } else {
            without.push(parent);
        }
    }
    flowstack_prof::use_counters(None);
    let col = |v: &[[f64; 1 + N]], j: usize| {
        trimmed_mean(&v.iter().map(|x| x[j]).collect::<Vec<_>>(), 0.02)
    };
    std::array::from_fn(|j| ProbeCost {
        own: col(&own, j),
        parent: (col(&with, j) - col(&without, j)).max(0.0),
    })
}

/// Fixed cost of the measuring windows themselves, removed from both sides: (cycles outside
/// every probe in an empty probed window, cycles of an empty unprobed window).
fn window_costs() -> (f64, f64) {
    let probed: Vec<f64> = (0..2000)
        .map(|_| {
            take();
            settle();
            activate();
            deactivate();
            take().cycles[Layer::Outside as usize] as f64
        })
        .collect();
    let off: Vec<f64> = (0..2000)
        .map(|_| {
            settle();
            timed(|| ())
        })
        .collect();
    (trimmed_mean(&probed, 0.02), trimmed_mean(&off, 0.02))
}

/// The TSC's resolution in cycles: the greatest common divisor of many differences between
/// reads (1 on bare metal; 26 in this VM, whose TSC advances 100 million times a second).
fn clock_tick() -> f64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let mut g = 0;
    let mut a = rdtsc();
    for _ in 0..10_000 {
        let b = rdtsc();
        g = gcd(g, b - a);
        a = b;
    }
    g.max(1) as f64
}

/// TSC ticks per nanosecond, measured against the monotonic clock.
fn tsc_per_ns() -> f64 {
    let t0 = std::time::Instant::now();
    let c0 = rdtsc();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let c1 = rdtsc();
    (c1 - c0) as f64 / t0.elapsed().as_nanos() as f64
}

/// Cycles `f` takes with the recorder off.
fn timed<T>(f: impl FnOnce() -> T) -> f64 {
    let t0 = rdtsc();
    std::hint::black_box(f());
    (rdtsc() - t0) as f64
}

/// The three steps with the recorder on for the layers in `mask`.
fn probed_pass(
    rig: &mut dyn Rig,
    mask: u32,
    hw: Option<&HwCounters>,
    per_step: bool,
) -> [Sample; 3] {
    let counting_syscall = hw.is_some() && hw.and_then(|h| h.pmc()).is_none();
    let mut out = STEPS.map(|step| {
        let ok = rig.prepare(step);
        let d0 = per_step.then(disturbance);
        let h0 = if counting_syscall {
            hw.map(|h| h.read()).unwrap_or_default()
        } else {
            [0; N]
        };
        flowstack_prof::use_counters(hw.and_then(|h| h.pmc()));
        take();
        settle();
        activate_only(mask);
        let ran = rig.run(step);
        deactivate();
        let snap = take();
        let h1 = if counting_syscall {
            hw.map(|h| h.read()).unwrap_or_default()
        } else {
            [0; N]
        };
        let disturbed = d0.is_some_and(|d| d != disturbance());
        Sample {
            snap,
            hw: std::array::from_fn(|j| h1[j].wrapping_sub(h0[j])),
            bad: !ok || !ran || disturbed,
        }
    });
    rig.finish();
    // Per-layer counting: the step's counter totals are the layers' sum.
    if !counting_syscall {
        for s in &mut out {
            s.hw = std::array::from_fn(|j| s.snap.events.iter().map(|e| e[j]).sum());
        }
    }
    out
}

/// The three steps with the recorder off.
fn timed_pass(rig: &mut dyn Rig, per_step: bool) -> [(f64, bool); 3] {
    let out = STEPS.map(|step| {
        let ok = rig.prepare(step);
        let d0 = per_step.then(disturbance);
        let mut ran = false;
        settle();
        let c = timed(|| ran = rig.run(step));
        let disturbed = d0.is_some_and(|d| d != disturbance());
        (c, !ok || !ran || disturbed)
    });
    rig.finish();
    out
}

/// Puts every measured window — probed or not, calibration or experiment — on the same
/// footing just before it opens: a random delay (see [`dither`]), then a full fence (MFENCE),
/// so that no window starts with stores of the unmeasured work before it still draining. The
/// probed passes clear the recorder (~1.5 KB of stores in [`take`]) right before their window;
/// without the fence, a pass with the recorder active and *no* probe recording (measured with
/// a temporary layer outside the stack) ran the receive step 75–105 cycles slower than the
/// probes-off window, with it 15–30.
fn settle() {
    dither();
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Waits a pseudo-random 0–127 loop turns (tens to a few hundred cycles).
///
/// This VM's TSC advances in steps of 26 cycles (see [`clock_tick`]), and the core clock and
/// the TSC come from one reference: in a loop that repeats the same instructions, every
/// boundary meets the clock at the same phase of a step and each interval rounds the same way,
/// sample after sample — a bias of up to a step per boundary that averaging cannot remove and
/// that moved with code layout. A random delay before each window makes the phase uniform, so
/// the rounding averages out (dithering). Measured in one build (10 runs × 4 sizes): layer sum
/// / end-to-end, send path 106.0 % → 101.6 %, receive 106.3 % → 102.0 %; a fixed delay of the
/// same mean length left them at 104.4 % and 106.0 %.
fn dither() {
    use std::cell::Cell;
    thread_local!(static STATE: Cell<u64> = const { Cell::new(0x9e37_79b9_7f4a_7c15) });
    // xorshift64: cheap, and only the phase has to look random.
    let n = STATE.with(|x| {
        let mut v = x.get();
        v ^= v << 13;
        v ^= v >> 7;
        v ^= v << 17;
        x.set(v);
        v % 128
    });
    for i in 0..n {
        std::hint::black_box(i);
    }
}

/// Runs `pass` twice and returns what the second run measured.
fn twice<T>(mut pass: impl FnMut() -> T) -> T {
    pass();
    pass()
}

fn run_size(
    rig: &mut dyn Rig,
    size: usize,
    samples: usize,
    k: f64,
    cal: &Calibration,
    hw: Option<&HwCounters>,
    counting: Counting,
) -> SizeResult {
    let mut raws: [Raw; 3] = Default::default();
    let hp0 = rig.fast_path_hits();
    let per_step = rig.blocks();
    let warmup = 200;
    for i in 0..samples + warmup {
        let keep = i >= warmup;
        let d0 = (!per_step).then(disturbance);
        let layer = ROTATE[i % ROTATE.len()];
        // Whichever pass runs first in an iteration pays for the cache state the previous
        // iteration left: the order rotates (independently of the layer rotation).
        let order = (i / ROTATE.len()) % 3;
        let mut full = None;
        let mut incl = None;
        let mut off = None;
        // Each pass runs twice and only the second is kept: the first leaves caches and
        // branch predictors as that kind of pass does. Without it a pass paid for the
        // predictions the previous kind trained at every probe site (the probes-off pass
        // most: the send path's end-to-end figure came out ~3 % higher).
        for j in 0..3 {
            match (order + j) % 3 {
                0 => full = Some(twice(|| probed_pass(rig, u32::MAX, hw, per_step))),
                1 => incl = Some(twice(|| probed_pass(rig, 1 << layer as u32, hw, per_step))),
                _ => off = Some(twice(|| timed_pass(rig, per_step))),
            }
        }
        let iteration_disturbed = d0.is_some_and(|d| d != disturbance());
        if !keep {
            continue;
        }
        let (Some(full), Some(incl), Some(off)) = (full, incl, off) else {
            unreachable!("every pass ran")
        };
        for (((raw, mut f), mut n), (e, eb)) in raws.iter_mut().zip(full).zip(incl).zip(off) {
            f.bad |= iteration_disturbed;
            n.bad |= iteration_disturbed;
            raw.full.push(f);
            raw.inclusive.push((layer, n));
            raw.e2e.push((e, eb || iteration_disturbed));
        }
    }
    let fast = rig.fast_path_hits() - hp0;
    let [send, ack, recv] = &raws;
    let send_path = analysis::combine(&[(Step::Send, send), (Step::Ack, ack)], k, cal, counting);
    let mut recv_path = analysis::combine(&[(Step::Receive, recv)], k, cal, counting);
    recv_path.fast_path_hits = fast;
    SizeResult {
        size,
        send: send_path,
        receive: recv_path,
    }
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("flowstack: {msg}");
    ExitCode::from(2)
}

/// Runs `flowstack profile`.
pub fn run(a: ProfileArgs) -> ExitCode {
    if a.sizes.is_empty() || a.sizes.iter().any(|&s| s == 0 || s > 1448) {
        return usage("--sizes must be between 1 and 1448 bytes (one segment)");
    }
    if a.samples < 100 || a.samples > 1_000_000 {
        return usage("--samples must be between 100 and 1000000");
    }
    let plot_format = match &a.plot {
        None => None,
        Some(p) => match p.extension().and_then(|e| e.to_str()) {
            Some("svg") => Some(plot::Format::Svg),
            Some("png") => Some(plot::Format::Png),
            _ => return usage("--plot needs a FILE.svg or FILE.png"),
        },
    };
    let place = match Where::from_args(&a) {
        Ok(w) => w,
        Err(e) => return usage(e),
    };
    if let Err(why) = flowstack_prof::supported() {
        eprintln!("flowstack: cannot profile: {why}");
        return ExitCode::from(1);
    }
    let tpn = tsc_per_ns();
    let hw = HwCounters::open();
    let (counting, hw_note) = match &hw {
        Ok(h) if h.pmc().is_some() => (
            Counting::PerLayer,
            "instructions, cache misses and dTLB misses per layer (perf_event_open + RDPMC at every probe)".to_string(),
        ),
        Ok(_) => (
            Counting::PerStep,
            "instructions, cache misses and dTLB misses per step (perf_event_open; RDPMC not allowed, so shared out to a step's layers by cycles)".to_string(),
        ),
        Err(e) => (Counting::None, format!("n/a: {e}")),
    };
    let hw = hw.ok();
    let costs = probe_overhead(hw.as_ref());
    let cal = Calibration {
        cycles: costs[0],
        events: [costs[1], costs[2], costs[3]],
        windows: window_costs(),
        tick: clock_tick(),
    };
    println!("flowstack profile: per-layer cost of one TCP segment (seed 000's method)");
    println!("  on the {}", place.describe());
    println!(
        "  TSC {:.3} GHz; probe overhead {:.1} cycles in the probed layer + {:.1} in its parent, subtracted; outliers beyond {} MADs and samples with a context switch or CPU migration discarded",
        tpn, cal.cycles.own, cal.cycles.parent, a.threshold
    );
    println!("  hardware counters: {hw_note}");
    let mut results = Vec::new();
    for &size in &a.sizes {
        let mut rig = match place.rig(size) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("flowstack: {e}");
                return ExitCode::from(1);
            }
        };
        let r = run_size(
            rig.as_mut(),
            size,
            a.samples,
            a.threshold,
            &cal,
            hw.as_ref(),
            counting,
        );
        report::print_size(&r, tpn, counting != Counting::None);
        results.push(r);
    }
    if a.overhead {
        report::overhead_report();
    }
    if let Some(p) = &a.json {
        let j = report::to_json(&results, tpn, &cal, &hw_note, counting, &place.describe());
        if let Err(e) = std::fs::write(p, j) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
        println!("json  {}", p.display());
    }
    if let (Some(p), Some(f)) = (&a.plot, plot_format) {
        if let Err(e) = plot::write(p, f, &results, tpn) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
        println!("plot  {}", p.display());
    }
    ExitCode::SUCCESS
}
