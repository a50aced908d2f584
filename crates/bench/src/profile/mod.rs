//! `flowstack profile`'s experiment: seed 000's per-layer cost measurement run on flowstack.
//!
//! For each segment size the harness repeats three steps many times — one segment sent,
//! its ACK processed, one segment received (and acknowledged) — on the in-process link
//! between two engines ([`rig::SimRig`]) or on a real link against the kernel
//! ([`rig::LinkRig`]). Each iteration runs the steps three ways, in rotating order: with
//! every probe recording, with one layer's probes recording (see
//! [`flowstack_prof::analysis`]), and with the recorder off, which gives the end-to-end cost
//! the layer sums are checked against. Each way runs twice in a row and only the second run
//! is kept (warm caches and predictors).
//!
//! [`Profiler::new`] calibrates (TSC rate and resolution, the probes' own cost, hardware
//! counters); [`Profiler::measure`] runs one size on a rig and returns its
//! [`SizeReport`]; [`Profiler::report`] assembles the [`ProfileReport`].

mod overhead;
pub mod rig;

use flowstack_prof::analysis::{self, Calibration, Counting, PathResult, Raw, Sample};
use flowstack_prof::counters::{HwCounters, N, NAMES};
use flowstack_prof::report::{
    Ceilings, HwAvailability, Paths, ProbeOverhead, ProfileReport, SizeReport,
};
use flowstack_prof::stats::{trimmed_mean, ProbeCost};
use flowstack_prof::{activate, activate_only, deactivate, disturbance, enter, rdtsc, take, Layer};
use flowstack_wire::Ipv4Address;
pub use overhead::{recording_overhead, TRANSFER};
use rig::{LinkRig, OpenLink, Rig, SimRig, Step};

/// Where the profile runs.
pub enum Place {
    /// Two flowstack engines on the in-process link.
    InProcess,
    /// One flowstack engine on a real link, against a kernel socket at `peer` (an address of
    /// this host on the link's other side).
    Link {
        /// Opens the link (a fresh host per segment size).
        open: Box<OpenLink>,
        /// What the link is, e.g. "TAP fst0 as 10.77.0.2/24".
        name: String,
        /// The kernel's address.
        peer: Ipv4Address,
    },
}

impl Place {
    /// Where the profile runs, in words (also the report's `link`).
    pub fn describe(&self) -> String {
        match self {
            Place::InProcess => "in-process link between two flowstack engines".into(),
            Place::Link { name, peer, .. } => format!("{name} against the kernel at {peer}"),
        }
    }

    /// A connected rig exchanging `size`-byte segments.
    pub fn rig(&self, size: usize) -> Result<Box<dyn Rig>, String> {
        Ok(match self {
            Place::InProcess => Box::new(SimRig::new(size)?),
            Place::Link { open, peer, .. } => Box::new(LinkRig::new(open.as_ref(), *peer, size)?),
        })
    }
}

/// A calibrated profiler: what the machine's clock and probes cost, and which hardware
/// counters it has.
pub struct Profiler {
    /// TSC ticks per nanosecond.
    pub tsc_ghz: f64,
    /// The probes' calibrated cost, the measuring windows' and the clock's step.
    pub cal: Calibration,
    /// How hardware counters are read.
    pub counting: Counting,
    /// Which counters are read and how, or why none are ("n/a: ...").
    pub hw_note: String,
    hw: Option<HwCounters>,
}

impl Profiler {
    /// Calibrates on this thread. `Err` if this CPU or build cannot record.
    pub fn new() -> Result<Self, String> {
        flowstack_prof::supported().map_err(|why| format!("cannot profile: {why}"))?;
        let tsc_ghz = tsc_per_ns();
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
        Ok(Self {
            tsc_ghz,
            cal,
            counting,
            hw_note,
            hw,
        })
    }

    /// Runs `samples` iterations (after a warm-up) on `rig` and analyses them: samples
    /// disturbed or beyond `threshold` scaled MADs of the median are discarded. `progress`
    /// is called once per iteration, outside the measured windows.
    pub fn measure(
        &self,
        rig: &mut dyn Rig,
        size: usize,
        samples: usize,
        threshold: f64,
        progress: &mut dyn FnMut(),
    ) -> SizeReport {
        let (send, receive) = run_size(
            rig,
            samples,
            threshold,
            &self.cal,
            self.hw.as_ref(),
            self.counting,
            progress,
        );
        let paths = Paths {
            send: send.report(self.tsc_ghz),
            receive: receive.report(self.tsc_ghz),
        };
        SizeReport {
            size,
            ceilings: Ceilings::of(size, &paths, self.tsc_ghz),
            paths,
            fast_path_hits: receive.fast_path_hits,
        }
    }

    /// The report of a profile on `place` with these sizes' results.
    pub fn report(&self, place: &Place, sizes: Vec<SizeReport>) -> ProfileReport {
        ProfileReport {
            tool: "flowstack profile".into(),
            link: place.describe(),
            tsc_ghz: self.tsc_ghz,
            probe_overhead_cycles: ProbeOverhead {
                own: self.cal.cycles.own,
                parent: self.cal.cycles.parent,
            },
            hardware_counters: if self.counting == Counting::None {
                HwAvailability::Unavailable(self.hw_note.clone())
            } else {
                HwAvailability::Available(true)
            },
            counters_per: self.counting,
            counter_names: NAMES.map(String::from).to_vec(),
            sizes,
        }
    }
}

/// Iterations run before samples are kept.
pub const WARMUP: usize = 200;

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
    samples: usize,
    k: f64,
    cal: &Calibration,
    hw: Option<&HwCounters>,
    counting: Counting,
    progress: &mut dyn FnMut(),
) -> (PathResult, PathResult) {
    let mut raws: [Raw; 3] = Default::default();
    let hp0 = rig.fast_path_hits();
    let per_step = rig.blocks();
    let warmup = WARMUP;
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
        // Outside every measured window (and after the iteration's disturbance check).
        progress();
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
    (send_path, recv_path)
}
