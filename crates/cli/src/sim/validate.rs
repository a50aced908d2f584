//! `flowstack sim --validate` and `--calibrate`: the bench runs (through the bench library)
//! with the CPU share each got, the calibration fitted to them, and the predictions next to
//! the measurements.

use super::cpu::{CpuSnapshot, OwnPerCpu};
use super::{fail, load_calibration, read, usage, SimArgs};
use flowstack_bench::{BenchSpec, PeerSel, RunOpts};
use flowstack_prof::report::{from_json, BenchLink, BenchReport, Peer, ProfileReport};
use flowstack_sim::fit::{
    calibrate, merge_cal_runs, merge_offload_runs, CalRun, OffloadCalRun, OffloadReport,
    CAL_CONFIGS, OFFLOAD_CALS,
};
use flowstack_sim::validate::{self, Measured, Row};
use flowstack_sim::{Calibration, Clients, Workload};
use std::process::ExitCode;
pub(super) fn run_calibrate(a: &SimArgs, out: &std::path::Path) -> ExitCode {
    let (Some(pp), Some(dir)) = (&a.profile, &a.inputs) else {
        return usage("--calibrate needs --profile FILE and --inputs DIR");
    };
    let profile: ProfileReport =
        match read(pp).and_then(|t| from_json(&t).map_err(|e| format!("{}: {e}", pp.display()))) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
    let cal = match fit_from_runs(a, &profile, dir) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    for (k, v) in &cal.fitted {
        println!("fitted {k} = {v}");
    }
    if let Err(e) = std::fs::write(out, cal.to_json()) {
        return fail(format!("cannot write {}: {e}", out.display()));
    }
    println!("calibration  {}", out.display());
    ExitCode::SUCCESS
}

/// The calibration from `profile` and the calibration runs in `dir` (each made now, with
/// the CPU share it got, where `dir` lacks it).
fn fit_from_runs(
    a: &SimArgs,
    profile: &ProfileReport,
    dir: &std::path::Path,
) -> Result<Calibration, String> {
    let (runs, offload) = cal_runs(a, dir)?;
    calibrate(profile, &runs, &offload)
}

/// The calibration runs in `dir`, each made now (with the CPU share it got) where `dir`
/// lacks it.
type CalRuns = (Vec<CalRun>, Vec<OffloadCalRun>);

fn cal_runs(a: &SimArgs, dir: &std::path::Path) -> Result<CalRuns, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let shares_path = dir.join("shares.json");
    let mut shares: std::collections::BTreeMap<String, f64> = read(&shares_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let mut runs = vec![];
    for c in CAL_CONFIGS {
        let path = dir.join(c.file);
        if !path.exists() {
            eprintln!(
                "sim: calibration run {} ({} x {} s)",
                c.file, a.runs, a.duration
            );
            let opts = RunOpts {
                msg_size: Some(c.msg_size),
                kernel_placement: flowstack_bench::Placement::Split,
                ..RunOpts::default()
            };
            let cores = (c.clients != Clients::Split).then_some(1);
            let spec = pipe_spec(a, c.workload, c.peer, opts, cores);
            let cpus = if c.clients == Clients::Split { 2 } else { 1 };
            let (r, share) = if c.port_budget {
                port_budget_runs(&spec, cpus)?
            } else {
                let (r, share, _) = bench_with_share(&spec, cpus, false);
                (r?, share.unwrap_or(1.0))
            };
            shares.insert(c.file.to_string(), share);
            std::fs::write(&path, flowstack_prof::report::to_json(&r))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        let report = read(&path).and_then(|t| {
            from_json::<BenchReport>(&t).map_err(|e| format!("{}: {e}", path.display()))
        })?;
        let share = shares.get(c.file).copied().unwrap_or(1.0);
        runs.push(CalRun {
            report,
            clients: c.clients,
            share,
        });
    }
    let mut offload = vec![];
    for (ofile, ow, osize) in OFFLOAD_CALS {
        let opath = dir.join(ofile);
        if !opath.exists() {
            eprintln!(
                "sim: calibration run {ofile} ({} x {} s)",
                a.runs, a.duration
            );
            let before = CpuSnapshot::take();
            let own = OwnPerCpu::start(2);
            let r = run_offload(ow, osize, a.duration, a.runs)?;
            // `FILE@cpu0` in shares.json: cpu 0's own share, the daemon's, which the run is
            // simulated at (`OffloadCalRun::daemon_share`; README "The offload stream's
            // daemon at its own CPU's share").
            if let Some(Some(d)) = own.shares().first() {
                shares.insert(format!("{ofile}@cpu0"), *d);
            }
            let share = CpuSnapshot::take().share_since(&before, 2).unwrap_or(1.0);
            shares.insert(ofile.to_string(), share);
            std::fs::write(&opath, r.to_json())
                .map_err(|e| format!("cannot write {}: {e}", opath.display()))?;
        }
        let report = read(&opath).and_then(|t| {
            serde_json::from_str::<OffloadReport>(&t)
                .map_err(|e| format!("{}: {e}", opath.display()))
        })?;
        offload.push(OffloadCalRun {
            report,
            share: shares.get(ofile).copied().unwrap_or(1.0),
            daemon_share: shares.get(&format!("{ofile}@cpu0")).copied(),
        });
    }
    let j = serde_json::to_string_pretty(&shares).expect("plain data") + "\n";
    std::fs::write(&shares_path, j)
        .map_err(|e| format!("cannot write {}: {e}", shares_path.display()))?;
    Ok((runs, offload))
}

/// A port-budgeted calibration run (`CalConfig::port_budget`: the kernel's crr): each of
/// `spec.runs` runs by itself, at most `PORT_BUDGET_SECS` long and `PORT_PAUSE_SECS` after
/// anything before it, so that it takes fewer local ports than TIME-WAIT leaves free; the
/// report of all of them (the median run) and the median of their CPU shares.
fn port_budget_runs(spec: &BenchSpec, cpus: usize) -> Result<(BenchReport, f64), String> {
    use flowstack_sim::fit::{PORT_BUDGET_SECS, PORT_PAUSE_SECS};
    let mut one = spec.clone();
    (one.duration, one.runs) = (spec.duration.min(PORT_BUDGET_SECS), 1);
    let (mut report, mut shares): (Option<BenchReport>, Vec<f64>) = (None, vec![]);
    for _ in 0..spec.runs.max(1) {
        std::thread::sleep(std::time::Duration::from_secs_f64(PORT_PAUSE_SECS));
        let (r, share, _) = bench_with_share(&one, cpus, false);
        let r = r?;
        shares.extend(share);
        report = Some(match report {
            None => r,
            Some(mut all) => {
                for (peer, s) in all.peers.iter_mut() {
                    if let Some(t) = r.peers.get(peer) {
                        let runs = s.run_results.iter().chain(&t.run_results).cloned();
                        *s = flowstack_prof::report::PeerSummary::new(all.workload, runs.collect());
                    }
                }
                all.runs += 1;
                all
            }
        });
    }
    let report = report.ok_or("no run")?;
    Ok((report, validate::median(&shares).unwrap_or(1.0)))
}

/// `--fresh`: the calibration runs in two passes, one before and one after the validation
/// runs (`dir`-1, `dir`-2), fitted to both together ([`merge_cal_runs`]).
fn fresh_pass(a: &SimArgs, pass: u32) -> Result<CalRuns, String> {
    let dir =
        std::env::temp_dir().join(format!("flowstack-sim-fresh-{}-{pass}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "sim: fresh calibration runs, pass {pass} of 2, in {}",
        dir.display()
    );
    let r = cal_runs(a, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// `bench <w> --peer offload` (the daemon against the kernel, same run) through the bench
/// library, `runs` runs of `duration` s.
fn run_offload(
    w: flowstack_prof::report::Workload,
    msg: usize,
    duration: f64,
    runs: usize,
) -> Result<flowstack_bench::offload::OffloadReport, String> {
    flowstack_bench::offload::run(&flowstack_bench::offload::OffloadSpec {
        workload: w,
        msg,
        duration,
        runs,
        daemon_cores: None,
    })
}

/// `bench <w> --peer offload` at the default size, `a.runs` times one run (each report
/// is one run's, so the median response time and the applications' CPU get a range as the
/// rate does), with the CPU share of both CPUs each run got: the runs' offload lines and
/// the median share.
fn offload_each_run(w: Workload, a: &SimArgs) -> Result<OffloadRuns, String> {
    let (mut peers, mut shares, mut probes) = (vec![], vec![], vec![]);
    let mut cpu_shares: Vec<(f64, f64)> = vec![];
    let offload = |w: Workload, size: usize, secs: f64| {
        let r = run_offload(report_workload(w), size, secs, 1)?;
        let r: OffloadReport = serde_json::from_str(&r.to_json()).map_err(|e| e.to_string())?;
        Ok::<_, String>(r.offload().cloned())
    };
    for _ in 0..a.runs.max(1) {
        // rr and crr: a probe just before and just after ([`flowstack_sim::fit::offload_probe`]).
        let probe = || {
            (w != Workload::Stream)
                .then(|| offload(Workload::Rr, flowstack_sim::fit::OFFLOAD_CAL.1, PROBE_SECS))
        };
        probes.extend(probe().transpose()?.flatten());
        let before = CpuSnapshot::take();
        let own = OwnPerCpu::start(2);
        let r = offload(w, validate::default_size(w), a.duration)?;
        let per_cpu = own.shares();
        if let Some(x) = CpuSnapshot::take().share_since(&before, 2) {
            shares.push(x);
        }
        if let [Some(d), Some(a)] = per_cpu[..] {
            cpu_shares.push((d, a));
        }
        peers.extend(r);
        probes.extend(probe().transpose()?.flatten());
    }
    let probe = validate::median(&probes.iter().map(|p| p.p50_us).collect::<Vec<_>>()).zip(
        validate::median(&probes.iter().map(|p| p.per_sec).collect::<Vec<_>>()),
    );
    let per_cpu = validate::median(&cpu_shares.iter().map(|c| c.0).collect::<Vec<_>>()).zip(
        validate::median(&cpu_shares.iter().map(|c| c.1).collect::<Vec<_>>()),
    );
    Ok((peers, validate::median(&shares), probe, per_cpu))
}

/// An offload case's runs: each run's offload line, the median CPU share of both CPUs, the
/// probes' median response time and rate (rr and crr), and the median share of each CPU
/// (the daemon's cpu 0, the applications' cpu 1).
type OffloadRuns = (
    Vec<flowstack_sim::fit::OffloadPeer>,
    Option<f64>,
    Option<(f64, f64)>,
    Option<(f64, f64)>,
);

/// Short runs of flowstack's, the kernel's and the daemon's rr whose results are discarded.
fn warm_up(a: &SimArgs) {
    eprintln!("sim: warm-up (0.3 s runs, discarded)");
    let opts = RunOpts::default;
    for peer in [Peer::Flowstack, Peer::Kernel] {
        let mut spec = pipe_spec(a, report_workload(Workload::Rr), peer, opts(), Some(2));
        (spec.duration, spec.runs) = (0.3, 1);
        let _ = bench_with_share(&spec, 2, false);
    }
    let _ = run_offload(report_workload(Workload::Rr), 64, 0.3, 1);
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "n/a".into())
}

/// One connection over the in-process pipe at `a`'s duration and runs: the kernel peer or
/// flowstack's, with `opts` and `cores`.
fn pipe_spec(
    a: &SimArgs,
    workload: flowstack_prof::report::Workload,
    peer: Peer,
    opts: RunOpts,
    cores: Option<usize>,
) -> BenchSpec {
    BenchSpec {
        workload,
        peer: if peer == Peer::Kernel {
            PeerSel::Kernel
        } else {
            PeerSel::Flowstack
        },
        link: BenchLink::Pipe,
        duration: a.duration,
        conns: 1,
        runs: a.runs,
        opts,
        cores,
    }
}

/// The bench's name for the model's workload (file transfer has no bench row here: rr).
fn report_workload(w: Workload) -> flowstack_prof::report::Workload {
    match w {
        Workload::Stream => flowstack_prof::report::Workload::Stream,
        Workload::Crr => flowstack_prof::report::Workload::Crr,
        _ => flowstack_prof::report::Workload::Rr,
    }
}

/// A bench configuration's report, the median CPU share of its runs, and its probes'
/// median response time and rate.
type BenchRuns = (Result<BenchReport, String>, Option<f64>, Option<(f64, f64)>);

/// Runs `spec` through the bench library and measures the CPU share of CPUs `0..cpus` each
/// of its runs got (from `/proc/stat` at the run's start and end); returns the report and
/// the **median of the runs' shares**. The bench reports the median run, and the prediction
/// rises with the share, so the share that stands for the median run is the median share —
/// not the share over all runs, which one starved run (a tenth of the others' rate) pulls
/// far below what the median run got.
/// With `probe`, a speed probe just before and just after each run ([`speed_probe`]): the
/// median over the runs of each run's two probes' mean median response time and rate.
fn bench_with_share(spec: &BenchSpec, cpus: usize, probe: bool) -> BenchRuns {
    let mut before: Option<CpuSnapshot> = None;
    let mut shares: Vec<f64> = vec![];
    let mut probe_before: Option<(f64, f64)> = None;
    let mut probes: Vec<(f64, f64)> = vec![];
    let cores = spec.cores.unwrap_or(1);
    let r = spec.clone().validated().and_then(|s| {
        flowstack_bench::run(&s, &mut |e| match e {
            flowstack_bench::Event::Started { .. } => {
                if probe {
                    probe_before = speed_probe(cores);
                }
                before = Some(CpuSnapshot::take());
            }
            flowstack_bench::Event::Finished { .. } => {
                if let Some(x) = before
                    .take()
                    .and_then(|b| CpuSnapshot::take().share_since(&b, cpus))
                {
                    shares.push(x);
                }
                if let (true, Some(b)) = (probe, probe_before.take()) {
                    if let Some(a) = speed_probe(cores) {
                        probes.push((0.5 * (a.0 + b.0), 0.5 * (a.1 + b.1)));
                    }
                }
            }
        })
    });
    let probe = validate::median(&probes.iter().map(|p| p.0).collect::<Vec<_>>()).zip(
        validate::median(&probes.iter().map(|p| p.1).collect::<Vec<_>>()),
    );
    (r, validate::median(&shares), probe)
}

/// Seconds of a speed probe run.
const PROBE_SECS: f64 = 0.2;

/// A speed probe just before or after a flowstack bench run: `bench rr --peer flowstack
/// --cores N --msg-size 1024` (the loop-turn calibration run's configuration) for 0.2 s;
/// its median response time, µs ([`flowstack_sim::fit::loop_speed`]), and its rate, per s
/// ([`flowstack_sim::fit::loop_share`]).
fn speed_probe(cores: usize) -> Option<(f64, f64)> {
    let spec = BenchSpec {
        workload: flowstack_prof::report::Workload::Rr,
        peer: PeerSel::Flowstack,
        link: BenchLink::Pipe,
        duration: PROBE_SECS,
        conns: 1,
        runs: 1,
        opts: RunOpts {
            msg_size: Some(flowstack_sim::fit::SPEED_PROBE_SIZE),
            ..RunOpts::default()
        },
        cores: Some(cores),
    }
    .validated()
    .ok()?;
    let r = flowstack_bench::run(&spec, &mut |_| {}).ok()?;
    let f = r.peers.get(&Peer::Flowstack)?;
    Some((f.latency?.p50_us, f.metric()))
}

pub(super) fn run_validate(a: &SimArgs) -> ExitCode {
    // Twelve configurations: at most 6 s of runs each keeps the command within two minutes.
    if !(0.2..=6.0).contains(&a.duration)
        || !(1..=9).contains(&a.runs)
        || a.duration * a.runs as f64 > 6.0
    {
        return usage("--validate needs 0.2 <= --duration, 1 <= --runs and --duration x --runs <= 6 (it stays within three minutes)");
    }
    let mut cal = match load_calibration(&a.calibration) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let profile: Option<ProfileReport> = if a.fresh {
        match from_json(flowstack_sim::calib::preset_profile()) {
            Ok(p) => Some(p),
            Err(e) => return fail(format!("shipped profile: {e}")),
        }
    } else {
        None
    };
    let started = std::time::Instant::now();
    let before = loadavg();
    // --fresh: a first calibration pass before the validation runs, a second after.
    let first = match profile.as_ref().map(|_| fresh_pass(a, 1)).transpose() {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    if first.is_none() {
        // Without --fresh's first pass before them, the first runs would be the process's
        // first (cold caches, page faults, the daemon's first start): a warm-up, discarded.
        warm_up(a);
    }
    // Measure every configuration first (with the CPU share each run got); predict after.
    let mut kernel_runs = vec![];
    for c in validate::cases() {
        eprintln!(
            "sim: measuring: {} --duration {} --runs {}",
            c.command(),
            a.duration,
            a.runs
        );
        let opts = RunOpts {
            kernel_placement: if c.peer == Peer::Kernel {
                flowstack_bench::Placement::Same
            } else {
                flowstack_bench::Placement::Free
            },
            ..RunOpts::default()
        };
        let spec = pipe_spec(a, report_workload(c.workload), c.peer, opts, Some(c.cores));
        // flowstack's rr and crr runs: a speed probe beside each ([`speed_probe`]).
        let (measured, share, probe) = bench_with_share(&spec, c.cores, c.probed());
        kernel_runs.push((c, measured, share, probe));
    }
    let mut offload_runs = vec![];
    for w in validate::offload_cases() {
        eprintln!(
            "sim: measuring: flowstack bench {} --peer offload --duration {} --runs {}",
            w.name(),
            a.duration,
            a.runs
        );
        offload_runs.push((w, offload_each_run(w, a)));
    }
    if let (Some(profile), Some((runs1, off1))) = (&profile, first) {
        let (runs2, off2) = match fresh_pass(a, 2) {
            Ok(r) => r,
            Err(e) => return fail(e),
        };
        let runs: Vec<CalRun> = runs1
            .iter()
            .zip(&runs2)
            .map(|(x, y)| merge_cal_runs(x, y))
            .collect();
        let off: Vec<OffloadCalRun> = off1
            .iter()
            .zip(&off2)
            .map(|(x, y)| merge_offload_runs(x, y))
            .collect();
        cal = match calibrate(profile, &runs, &off) {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        cal.name =
            "vm, refitted to fresh calibration runs (two passes around the validation runs)".into();
        for (k, v) in &cal.fitted {
            println!("fitted {k} = {v}");
        }
    }
    let after = loadavg();
    println!(
        "flowstack sim --validate: predictions from calibration '{}' vs fresh bench runs ({} x {} s, median)",
        cal.name, a.runs, a.duration
    );
    println!("calibration source: {}", cal.source);
    let mut rows: Vec<Row> = vec![];
    let mut placements: Vec<String> = vec![];
    let mut loop_lines = vec![];
    for (c, measured, stat_share, probe) in kernel_runs {
        // flowstack's rr and crr: the loop's speed and share from the probes beside its runs.
        let (speed, share) = match probe {
            Some((p50, rate)) => {
                let r = flowstack_sim::fit::loop_speed(&cal, c.cores, p50)
                    .and_then(|v| Ok((v, flowstack_sim::fit::loop_share(&cal, c.cores, v, rate)?)));
                match r {
                    Ok((v, sh)) => {
                        loop_lines.push(format!(
                            "  {} {} B, --cores {}: probe p50 {p50:.2} us, {rate:.0}/s: speed {v:.2}, share {:.0}% (/proc/stat: {})",
                            c.workload.name(),
                            c.size(),
                            c.cores,
                            sh * 100.0,
                            stat_share.map_or("n/a".into(), |x| format!("{:.0}%", x * 100.0))
                        ));
                        (Some(v), Some(sh))
                    }
                    Err(e) => return fail(e),
                }
            }
            None => (None, stat_share),
        };
        let idle = match validate::predict(&cal, &c, 1.0, 1.0, a.runs) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let pred =
            match validate::predict(&cal, &c, share.unwrap_or(1.0), speed.unwrap_or(1.0), a.runs) {
                Ok(p) => p,
                Err(e) => return fail(e),
            };
        for (pl, m, l) in &pred.by_placement {
            placements.push(format!(
                "  {} {} B, --cores {}, {}: {} (clients on 0..{}): {:.0}, p50 {:.1} us",
                c.workload.name(),
                c.size(),
                c.cores,
                c.peer.name(),
                if pl.is_empty() {
                    format!(
                        "--kernel-placement free, most likely median of {} runs",
                        a.runs
                    )
                } else {
                    format!("servers on cores {pl:?}")
                },
                c.cores,
                m,
                l
            ));
        }
        match measured {
            Ok(r) => {
                let s = &r.peers[&c.peer];
                let m = Measured {
                    median: s.metric(),
                    min: s.min,
                    max: s.max,
                };
                let p50s: Vec<f64> = s
                    .run_results
                    .iter()
                    .filter_map(|r| r.latency.map(|l| l.p50_us))
                    .collect();
                rows.extend(validate::rows_of(
                    &c,
                    &pred,
                    &idle,
                    share,
                    speed,
                    Some(m),
                    Measured::of(&p50s),
                ));
            }
            Err(e) => {
                let mut rs = validate::rows_of(&c, &pred, &idle, share, speed, None, None);
                for r in &mut rs {
                    r.status = validate::Status::NotMeasured(format!("bench failed: {e}"));
                }
                rows.extend(rs);
            }
        }
    }
    let (mut probe_lines, mut cpu_lines) = (vec![], vec![]);
    for (w, measured) in offload_runs {
        let share = measured.as_ref().ok().and_then(|m| m.1);
        // Each CPU's own share where measured (the daemon's cpu 0, the applications' cpu 1).
        let daemon_share = match measured.as_ref().ok().and_then(|m| m.3) {
            Some((d, a)) => {
                cpu_lines.push(format!(
                    "  {}: cpu 0 (daemon) {:.0}%, cpu 1 (applications) {:.0}% (both: {})",
                    w.name(),
                    d * 100.0,
                    a * 100.0,
                    share.map_or("n/a".into(), |x| format!("{:.0}%", x * 100.0))
                ));
                Some(d)
            }
            None => share,
        };
        // The daemon's wake-up and tail at this run's minute, from its probes.
        let cal = match measured.as_ref().ok().and_then(|m| m.2) {
            Some((p50, rate)) => match flowstack_sim::fit::offload_probe(&cal, p50, rate) {
                Ok(c) => {
                    probe_lines.push(format!(
                        "  {}: probe p50 {p50:.1} us, {rate:.0}/s: host.app_wake_ns {:.0}, host.app_tail {:.2}",
                        w.name(),
                        c.host.app_wake_ns,
                        c.host.tail()
                    ));
                    c
                }
                Err(e) => return fail(e),
            },
            None => cal.clone(),
        };
        let idle = match validate::predict_offload(&cal, w, 1.0) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        // The daemon's engine spins: its CPU's own share is what others left it. The
        // applications sleep, and their CPU's busy time holds what they never asked for:
        // on whole cores where the daemon's share is measured by itself.
        let apps = if daemon_share == share {
            share
        } else {
            Some(1.0)
        };
        let pred = match validate::predict_offload_cpus(
            &cal,
            w,
            apps.unwrap_or(1.0),
            daemon_share.unwrap_or(1.0),
        ) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        match &measured {
            Ok((runs, ..)) => {
                rows.extend(validate::offload_rows(w, &pred, &idle, daemon_share, runs))
            }
            Err(e) => {
                let mut rs = validate::offload_rows(w, &pred, &idle, share, &[]);
                for r in &mut rs {
                    r.status = validate::Status::NotMeasured(format!("bench failed: {e}"));
                }
                rows.extend(rs);
            }
        }
    }
    validate::explain(&mut rows);
    print!("{}", validate::table(&rows));
    if !placements.is_empty() {
        println!("not measured: the kernel's other placements (--kernel-placement free draws each with equal probability per run):");
        for p in &placements {
            println!("{p}");
        }
    }
    if !loop_lines.is_empty() {
        println!("flowstack rr and crr predicted at the speed and share of their loop from probes beside their runs (bench rr --peer flowstack --cores N --msg-size {} for {PROBE_SECS} s just before and after each; medians):", flowstack_sim::fit::SPEED_PROBE_SIZE);
        for l in &loop_lines {
            println!("{l}");
        }
    }
    if !cpu_lines.is_empty() {
        println!("offload rows: each CPU's share (medians over the runs; the stream is predicted with the daemon's engine at cpu 0's share, the share column, and the sleeping applications on whole cores; rr and crr on whole cores):");
        for l in &cpu_lines {
            println!("{l}");
        }
    }
    if !probe_lines.is_empty() {
        println!("offload rr and crr predicted with the daemon's wake-up and tail from probes beside their runs (bench rr --peer offload --msg-size {} for {PROBE_SECS} s just before and after each; medians):", flowstack_sim::fit::OFFLOAD_CAL.1);
        for l in &probe_lines {
            println!("{l}");
        }
    }
    println!("machine load average (1, 5, 15 min): before {before}; after {after}");
    println!(
        "runs took {:.0} s (wall clock)",
        started.elapsed().as_secs_f64()
    );
    if let Some(p) = &a.json {
        let j = serde_json::to_string_pretty(&rows).expect("plain data") + "\n";
        if let Err(e) = std::fs::write(p, j) {
            return fail(format!("cannot write {}: {e}", p.display()));
        }
    }
    ExitCode::SUCCESS
}
