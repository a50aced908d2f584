//! From raw samples to per-layer costs, seed 000's way: subtract the probes' own cost,
//! discard disturbed and deviating samples, average the rest and give their spread.
//!
//! Each layer is measured twice. In the *full* pass every probe records, which shows how
//! the layers nest and their exclusive cost directly — but each layer's figure then carries
//! the calibration error of its own probes and of its children's, and on a path of a dozen
//! probes whose cost (a TSC read, ~55 cycles a pair on this VM) rivals the work, those
//! errors add up. In the *inclusive* passes only one layer's probes record, so its figure
//! (itself plus everything it calls) carries one probe pair's error; a layer's exclusive cost
//! is then its inclusive cost minus its children's, and the layers of a path sum to the
//! inclusive cost of its top-level layers. That is used whenever the nesting is a tree
//! (each layer always entered from the same parent layer); otherwise the full pass is.

use crate::counters::N;
pub use crate::report::{Counting, Step};
use crate::report::{CyclesNs, HwEvents, LayerReport, PathReport};
use crate::stats::{clean, net_of_overhead, summarize, ProbeCost};
use crate::{Layer, Snapshot, LAYERS};

/// Inclusive samples a layer needs before its inclusive figure is trusted.
const MIN_INCLUSIVE: usize = 10;

/// The probes' calibrated own cost: in cycles, and in each hardware event when counted per
/// layer.
#[derive(Clone, Copy, Debug)]
pub struct Calibration {
    /// Cycles.
    pub cycles: ProbeCost,
    /// Instructions, cache misses, dTLB misses (zero when not counted per layer).
    pub events: [ProbeCost; N],
    /// Cycles of an empty measuring window: (outside every probe with the recorder on,
    /// with the recorder off).
    pub windows: (f64, f64),
    /// The clock's resolution in cycles (the smallest step it was seen to make).
    pub tick: f64,
}

/// One recorded step: what the recorder saw, the counters read around it, whether it may
/// be used.
pub struct Sample {
    /// What the recorder accumulated.
    pub snap: Snapshot,
    /// Hardware events counted around the step (per-step counting), or the layers' sum.
    pub hw: [u64; N],
    /// Not to be used (the step failed, or was disturbed).
    pub bad: bool,
}

/// Everything recorded for one step.
#[derive(Default)]
pub struct Raw {
    /// Every probe recording.
    pub full: Vec<Sample>,
    /// Only the given layer's probes recording.
    pub inclusive: Vec<(Layer, Sample)>,
    /// Cycles with the recorder off, and whether the sample is bad.
    pub e2e: Vec<(f64, bool)>,
}

/// One layer's cost on a path.
pub struct LayerResult {
    /// The step the layer ran in.
    pub phase: Step,
    /// The layer.
    pub layer: Layer,
    /// Mean cycles per segment.
    pub cycles: f64,
    /// Spread (standard deviation) of the cycles.
    pub stddev: f64,
    /// Hardware events per segment, when counted.
    pub counters: Option<[f64; N]>,
}

/// One path (send with its ACK processing, or receive) at one size.
pub struct PathResult {
    /// The layers, step by step, in the order a segment meets them.
    pub layers: Vec<LayerResult>,
    /// Sum of the layers.
    pub total: f64,
    /// End-to-end cycles with the probes off.
    pub e2e: f64,
    /// Spread of the end-to-end cycles.
    pub e2e_stddev: f64,
    /// Samples kept (the fewest of the path's steps).
    pub kept: usize,
    /// Samples discarded over all the path's steps.
    pub discarded: usize,
    /// Samples taken, over all the path's steps (`discarded` counts against this).
    pub taken: usize,
    /// Mean cycles inside the measured window but outside every probe (full pass).
    pub unattributed: f64,
    /// "inclusive" or "full" (see the module documentation), per step, joined by '+'.
    pub method: String,
    /// Segments the receiver took through header prediction's fast path.
    pub fast_path_hits: u64,
}

impl PathResult {
    /// The path in the report schema, nanoseconds from `tsc_ghz` (TSC ticks per ns).
    pub fn report(&self, tsc_ghz: f64) -> PathReport {
        let cn = |cycles: f64| CyclesNs {
            cycles,
            ns: cycles / tsc_ghz,
        };
        PathReport {
            layers: self
                .layers
                .iter()
                .map(|l| LayerReport {
                    name: crate::report::layer_name(l.phase, l.layer).into(),
                    layer: l.layer,
                    phase: l.phase,
                    cycles: l.cycles,
                    ns: l.cycles / tsc_ghz,
                    stddev_ns: l.stddev / tsc_ghz,
                    share_percent: 100.0 * l.cycles / self.total.max(1e-9),
                    counters: l.counters.map(HwEvents::from_array),
                })
                .collect(),
            total: cn(self.total),
            end_to_end: cn(self.e2e),
            coverage_percent: 100.0 * self.total / self.e2e.max(1e-9),
            method: self.method.clone(),
            samples_kept: self.kept,
            samples_discarded: self.discarded,
            samples_taken: self.taken,
            unattributed: cn(self.unattributed),
        }
    }
}

/// The order layers are listed in: the order a segment meets them.
fn display_order(step: Step) -> [Layer; 13] {
    use Layer::*;
    match step {
        Step::Send | Step::Ack => [
            AppCopyIn, TcpOutput, TcpEmit, IpOutput, EthOutput, DevTx, DevRx, EthIpInput, TcpInput,
            BufRelease, SockAppend, AppCopyOut, Engine,
        ],
        Step::Receive => [
            DevRx, EthIpInput, TcpInput, SockAppend, AppCopyOut, TcpOutput, TcpEmit, IpOutput,
            EthOutput, DevTx, AppCopyIn, BufRelease, Engine,
        ],
    }
}

fn mean_var(v: &[f64]) -> (f64, f64) {
    let s = summarize(v);
    (s.mean, s.stddev * s.stddev)
}

/// Cleans the samples of each step and builds the per-layer table of a path.
pub fn combine(
    steps: &[(Step, &Raw)],
    k: f64,
    cal: &Calibration,
    counting: Counting,
) -> PathResult {
    let mut out = PathResult {
        layers: vec![],
        total: 0.0,
        e2e: 0.0,
        e2e_stddev: 0.0,
        kept: usize::MAX,
        discarded: 0,
        taken: 0,
        unattributed: 0.0,
        method: String::new(),
        fast_path_hits: 0,
    };
    let mut e2e_var = 0.0;
    let mut methods = vec![];
    for &(step, raw) in steps {
        let net = |s: &Snapshot, l: usize| {
            net_of_overhead(s.cycles[l], s.entries[l], s.children[l], cal.cycles)
        };
        let net_ev = |s: &Snapshot, l: usize, j: usize| {
            net_of_overhead(s.events[l][j], s.entries[l], s.children[l], cal.events[j])
        };
        // Full pass: nesting, exclusive fallback, unattributed time.
        let totals: Vec<f64> = raw
            .full
            .iter()
            .map(|s| (1..LAYERS).map(|l| net(&s.snap, l)).sum())
            .collect();
        let bad: Vec<bool> = raw.full.iter().map(|s| s.bad).collect();
        let keep = clean(&totals, &bad, k, cal.tick);
        out.discarded += raw.full.len() - keep.len();
        out.taken += raw.full.len();
        out.kept = out.kept.min(keep.len());
        out.unattributed += (keep
            .iter()
            .map(|&i| net(&raw.full[i].snap, Layer::Outside as usize))
            .sum::<f64>()
            / keep.len().max(1) as f64
            - cal.windows.0)
            .max(0.0);
        let present: Vec<Layer> = display_order(step)
            .iter()
            .copied()
            .filter(|&l| {
                keep.iter()
                    .any(|&i| raw.full[i].snap.entries[l as usize] > 0)
            })
            .collect();
        let mut parent = [None::<usize>; LAYERS];
        let mut tree = true;
        for &c in &present {
            let ci = c as usize;
            let ps: Vec<usize> = (0..LAYERS)
                .filter(|&p| p != ci && keep.iter().any(|&i| raw.full[i].snap.nest[p][ci] > 0))
                .collect();
            match ps.as_slice() {
                [p] => parent[ci] = Some(*p),
                _ => tree = false,
            }
        }
        // Inclusive passes.
        let mut incl = [(0.0, 0.0, 0usize); LAYERS];
        let mut incl_ev = [[0.0; N]; LAYERS];
        for &l in &present {
            let li = l as usize;
            let samples: Vec<&Sample> = raw
                .inclusive
                .iter()
                .filter(|(m, _)| *m == l)
                .map(|(_, s)| s)
                .collect();
            let v: Vec<f64> = samples.iter().map(|s| net(&s.snap, li)).collect();
            let b: Vec<bool> = samples.iter().map(|s| s.bad).collect();
            let kept = clean(&v, &b, k, cal.tick);
            let (m, var) = mean_var(&kept.iter().map(|&i| v[i]).collect::<Vec<_>>());
            incl[li] = (m, var, kept.len());
            for (j, e) in incl_ev[li].iter_mut().enumerate() {
                *e = kept
                    .iter()
                    .map(|&i| net_ev(&samples[i].snap, li, j))
                    .sum::<f64>()
                    / kept.len().max(1) as f64;
            }
        }
        let use_inclusive = tree && present.iter().all(|&l| incl[l as usize].2 >= MIN_INCLUSIVE);
        methods.push(if use_inclusive { "inclusive" } else { "full" });
        let first = out.layers.len();
        let mut step_total = 0.0;
        for &l in &present {
            let li = l as usize;
            let (cycles, var, events) = if use_inclusive {
                let children: Vec<usize> = (0..LAYERS).filter(|&c| parent[c] == Some(li)).collect();
                let mut ev = incl_ev[li];
                for &c in &children {
                    for j in 0..N {
                        ev[j] -= incl_ev[c][j];
                    }
                }
                (
                    incl[li].0 - children.iter().map(|&c| incl[c].0).sum::<f64>(),
                    incl[li].1 + children.iter().map(|&c| incl[c].1).sum::<f64>(),
                    ev,
                )
            } else {
                let v: Vec<f64> = keep.iter().map(|&i| net(&raw.full[i].snap, li)).collect();
                let (m, var) = mean_var(&v);
                let mut ev = [0.0; N];
                for (j, e) in ev.iter_mut().enumerate() {
                    *e = keep
                        .iter()
                        .map(|&i| net_ev(&raw.full[i].snap, li, j))
                        .sum::<f64>()
                        / keep.len().max(1) as f64;
                }
                (m, var, ev)
            };
            step_total += cycles;
            out.layers.push(LayerResult {
                phase: step,
                layer: l,
                cycles,
                stddev: var.sqrt(),
                counters: (counting == Counting::PerLayer).then_some(events.map(|e| e.max(0.0))),
            });
        }
        if counting == Counting::PerStep {
            // Read per step, not per layer: shared out to the step's layers by their cycles.
            let n = keep.len().max(1) as f64;
            let mut sums = [0.0; N];
            for &i in &keep {
                for (j, s) in sums.iter_mut().enumerate() {
                    *s += raw.full[i].hw[j] as f64;
                }
            }
            for lr in &mut out.layers[first..] {
                let share = if step_total > 0.0 {
                    lr.cycles.max(0.0) / step_total
                } else {
                    0.0
                };
                lr.counters = Some(sums.map(|s| s / n * share));
            }
        }
        out.total += step_total;
        let ev: Vec<f64> = raw.e2e.iter().map(|e| e.0).collect();
        let eb: Vec<bool> = raw.e2e.iter().map(|e| e.1).collect();
        let ek = clean(&ev, &eb, k, cal.tick);
        let (m, var) = mean_var(
            &ek.iter()
                .map(|&i| (ev[i] - cal.windows.1).max(0.0))
                .collect::<Vec<_>>(),
        );
        out.e2e += m;
        e2e_var += var;
    }
    out.e2e_stddev = e2e_var.sqrt();
    if out.kept == usize::MAX {
        out.kept = 0;
    }
    out.method = methods.join("+");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(parts: &[(Layer, u64, u32, u32)], nest: &[(Layer, Layer)]) -> Snapshot {
        let mut s = Snapshot::default();
        for &(l, c, e, ch) in parts {
            s.cycles[l as usize] = c;
            s.entries[l as usize] = e;
            s.children[l as usize] = ch;
        }
        for &(p, c) in nest {
            s.nest[p as usize][c as usize] += 1;
        }
        s
    }

    fn cal(own: f64, parent: f64) -> Calibration {
        let c = ProbeCost { own, parent };
        Calibration {
            cycles: c,
            events: [ProbeCost {
                own: 0.0,
                parent: 0.0,
            }; N],
            windows: (0.0, 0.0),
            tick: 1.0,
        }
    }

    /// TCP output (true exclusive cost 100) calls IPv4 output (true cost 40); each probe
    /// costs 10 cycles in itself and 5 in its parent.
    fn raw(extra_in_full: u64) -> Raw {
        let mut r = Raw::default();
        let (t, i) = (Layer::TcpOutput, Layer::IpOutput);
        for n in 0..200u64 {
            let jitter = n % 3;
            // Full pass: both probes record; the full pass may carry a calibration error.
            r.full.push(Sample {
                snap: snap(
                    &[
                        (Layer::Outside, 5, 0, 1),
                        (t, 100 + 10 + 5 + jitter + extra_in_full, 1, 1),
                        (i, 40 + 10 + extra_in_full, 1, 0),
                    ],
                    &[(Layer::Outside, t), (t, i)],
                ),
                hw: [0; N],
                bad: false,
            });
            // Inclusive passes: only one layer's probe records.
            r.inclusive.push((
                t,
                Sample {
                    snap: snap(&[(t, 140 + 10 + jitter, 1, 0)], &[(Layer::Outside, t)]),
                    hw: [0; N],
                    bad: false,
                },
            ));
            r.inclusive.push((
                i,
                Sample {
                    snap: snap(&[(i, 40 + 10, 1, 0)], &[(Layer::Outside, i)]),
                    hw: [0; N],
                    bad: n == 7,
                },
            ));
            r.e2e.push((141.0, false));
        }
        r
    }

    #[test]
    fn exclusive_costs_come_from_inclusive_passes_when_the_nesting_is_a_tree() {
        // The full pass overstates each layer by 20 cycles; the inclusive figures do not.
        let r = raw(20);
        let p = combine(&[(Step::Send, &r)], 5.0, &cal(10.0, 5.0), Counting::None);
        assert_eq!(p.method, "inclusive");
        assert_eq!(p.layers.len(), 2);
        let tcp = &p.layers[0];
        let ip = &p.layers[1];
        assert_eq!(tcp.layer, Layer::TcpOutput);
        assert!((tcp.cycles - 101.0).abs() < 0.01, "{}", tcp.cycles);
        assert!((ip.cycles - 40.0).abs() < 0.01, "{}", ip.cycles);
        assert!((p.total - p.e2e).abs() < 0.01);
        assert_eq!(p.kept, 200);
        assert!(tcp.counters.is_none());
    }

    #[test]
    fn without_a_tree_the_full_pass_is_used() {
        let mut r = raw(0);
        // IPv4 output now also entered straight from outside: two parents.
        r.full[0].snap.nest[Layer::Outside as usize][Layer::IpOutput as usize] = 1;
        let p = combine(&[(Step::Send, &r)], 5.0, &cal(10.0, 5.0), Counting::None);
        assert_eq!(p.method, "full");
        assert!(
            (p.layers[0].cycles - 101.0).abs() < 0.01,
            "{}",
            p.layers[0].cycles
        );
        assert!((p.layers[1].cycles - 40.0).abs() < 0.01);
    }

    #[test]
    fn disturbed_and_outlying_samples_are_left_out() {
        let mut r = raw(0);
        r.full[3].bad = true;
        r.full[4].snap.cycles[Layer::TcpOutput as usize] += 100_000;
        r.e2e[5] = (1e9, false);
        let p = combine(&[(Step::Send, &r)], 5.0, &cal(10.0, 5.0), Counting::None);
        assert_eq!(p.discarded, 2);
        assert_eq!(p.taken, 200);
        assert!((p.e2e - 141.0).abs() < 0.01);
    }

    #[test]
    fn per_step_counters_are_shared_by_cycles() {
        let mut r = raw(0);
        for s in &mut r.full {
            s.hw = [1410, 14, 0];
        }
        let p = combine(&[(Step::Send, &r)], 5.0, &cal(10.0, 5.0), Counting::PerStep);
        let c0 = p.layers[0].counters.unwrap();
        let c1 = p.layers[1].counters.unwrap();
        assert!((c0[0] + c1[0] - 1410.0).abs() < 0.01);
        assert!((c1[0] - 1410.0 * 40.0 / 141.0).abs() < 0.1);
    }
}
