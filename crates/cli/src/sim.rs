//! `flowstack sim`: arguments → [`flowstack_sim`] (the architecture simulator) → tables,
//! `--json`, `--plot`; `--validate` also runs the bench ([`flowstack_bench::run()`]) for the
//! measurements it compares with; `--calibrate` writes this machine's calibration from
//! profile and bench JSON files.

use clap::Args;
use flowstack_bench::{BenchSpec, PeerSel, RunOpts};
use flowstack_prof::report::{from_json, BenchLink, BenchReport, Peer, ProfileReport};
use flowstack_sim::calib::{fit_profile, preset};
use flowstack_sim::fit::{
    calibrate, merge_cal_runs, merge_offload_runs, CalRun, OffloadCalRun, OffloadReport,
    CAL_CONFIGS, OFFLOAD_CAL,
};
use flowstack_sim::plot::{svg, Chart, Series};
use flowstack_sim::validate::{self, Measured, Row};
use flowstack_sim::{seed001, simulate, Arch, Calibration, Clients, Outcome, Scenario, Workload};
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `flowstack sim`.
#[derive(Args, Debug)]
pub struct SimArgs {
    /// Architectures, comma-separated: kernel, library, percore, offload (a NIC processor:
    /// interrupt per message), daemon (stack cores whose rings the application polls),
    /// daemon-wake (stack cores that wake sleeping applications: `bench --peer offload`);
    /// with :E (E stack cores), :E@R (at R times the host clock) or :c/K (cores/K stack
    /// cores).
    #[arg(long, value_delimiter = ',', default_value = "kernel,percore,offload")]
    arch: Vec<String>,
    /// Workloads, comma-separated: stream, rr, crr, file.
    #[arg(long, value_delimiter = ',', default_value = "rr")]
    workload: Vec<String>,
    /// Message (write, file) sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64")]
    sizes: Vec<usize>,
    /// Host core counts, comma-separated (1..=1024).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    cores: Vec<usize>,
    /// Open loop: offered transactions per second in all, comma-separated (without it:
    /// closed loop).
    #[arg(long, value_delimiter = ',')]
    load: Vec<f64>,
    /// Offload stack cores' clock relative to the host's, comma-separated (overrides @R).
    #[arg(long, value_delimiter = ',')]
    nic_ratio: Vec<f64>,
    /// Connections (closed loop) or clients (open loop) [default: four per core, one per
    /// core for stream].
    #[arg(long, value_name = "N")]
    conns: Option<usize>,
    /// Server application work per request, microseconds.
    #[arg(long, value_name = "US", default_value_t = 0.0)]
    app_us: f64,
    /// Where the clients run: remote (across the link, not simulated) or colocated (on the
    /// same cores, as `flowstack bench --cores N` runs them).
    #[arg(long, value_name = "WHERE", default_value = "remote")]
    clients: String,
    /// Costs: a preset (vm, seed001), a calibration file, or a `flowstack profile --json`
    /// file (flowstack's costs from it, the rest from the vm preset).
    #[arg(long, value_name = "FILE", default_value = "vm")]
    calibration: String,
    /// Seed of every random choice; the same seed gives the same output.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Transactions to simulate per point.
    #[arg(long, value_name = "N", default_value_t = 20000)]
    txns: u64,
    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the figures: FILE.svg.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Compare predictions with fresh bench runs (stream, rr, crr at --cores 1 and 2,
    /// flowstack and kernel peers, and with --peer offload); ±25 % is validated.
    #[arg(long, conflicts_with_all = ["seed001", "calibrate"])]
    validate: bool,
    /// --validate: seconds per bench run.
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    duration: f64,
    /// --validate: runs per configuration (the median is compared).
    #[arg(long, value_name = "N", default_value_t = 3)]
    runs: usize,
    /// --validate: refit the calibration to fresh calibration runs (the sizes `--calibrate`
    /// uses, none of the validated ones) made in two passes, one before and one after the
    /// validation runs, and fitted to both together, with the shipped profile: a shared
    /// machine's load drifts between hours and within minutes.
    #[arg(long, requires = "validate")]
    fresh: bool,
    /// Reproduce seed 001's host-CPU reduction from its Table 1 (the seed001 preset unless
    /// --calibration names another).
    #[arg(long, conflicts_with = "calibrate")]
    seed001: bool,
    /// Write this machine's calibration to FILE from --profile and the calibration bench
    /// runs in --inputs DIR (run now, with --duration and --runs, where DIR lacks them).
    #[arg(long, value_name = "FILE", requires_all = ["profile", "inputs"])]
    calibrate: Option<PathBuf>,
    /// --calibrate: a `flowstack profile --json` file.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// --calibrate: the directory of the calibration runs' bench reports (and shares.json,
    /// the CPU share each run got).
    #[arg(long, value_name = "DIR")]
    inputs: Option<PathBuf>,
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("flowstack: {msg}");
    ExitCode::from(2)
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("flowstack: {msg}");
    ExitCode::from(1)
}

fn read(p: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

/// The costs named by `--calibration`.
fn load_calibration(name: &str) -> Result<Calibration, String> {
    if let Some(s) = preset(name) {
        return Calibration::from_json(s).map_err(|e| format!("preset {name}: {e}"));
    }
    let text = read(std::path::Path::new(name))?;
    if let Ok(c) = Calibration::from_json(&text) {
        return Ok(c);
    }
    if let Ok(p) = from_json::<ProfileReport>(&text) {
        let mut c =
            Calibration::from_json(preset("vm").expect("shipped")).map_err(|e| e.to_string())?;
        let mut f = fit_profile(&p)?.costs;
        let old = c.flowstack();
        f.conn_ns = old.conn_ns;
        c.flowstack = Some(f);
        c.name = format!("vm with flowstack's costs from {name}");
        c.notes.push(format!(
            "flowstack's per-segment costs replaced by the profile {name}"
        ));
        return Ok(c);
    }
    Err(format!(
        "{name} is neither a preset (vm, seed001), a calibration file nor a profile report"
    ))
}

/// Entry of `flowstack sim`.
pub fn run(a: SimArgs) -> ExitCode {
    if let Some(out) = &a.calibrate {
        return run_calibrate(&a, out);
    }
    if a.seed001 {
        return run_seed001(&a);
    }
    if a.validate {
        return run_validate(&a);
    }
    run_sweep(&a)
}

fn run_calibrate(a: &SimArgs, out: &std::path::Path) -> ExitCode {
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
    calibrate(profile, &runs, Some(&offload))
}

/// The calibration runs in `dir`, each made now (with the CPU share it got) where `dir`
/// lacks it.
fn cal_runs(a: &SimArgs, dir: &std::path::Path) -> Result<(Vec<CalRun>, OffloadCalRun), String> {
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
            let spec = BenchSpec {
                workload: c.workload,
                peer: if c.peer == Peer::Kernel {
                    PeerSel::Kernel
                } else {
                    PeerSel::Flowstack
                },
                link: BenchLink::Pipe,
                duration: a.duration,
                conns: 1,
                runs: a.runs,
                opts: RunOpts {
                    msg_size: Some(c.msg_size),
                    kernel_placement: flowstack_bench::Placement::Split,
                    ..RunOpts::default()
                },
                cores: (c.clients != Clients::Split).then_some(1),
            };
            let cpus = if c.clients == Clients::Split { 2 } else { 1 };
            let (r, share) = bench_with_share(&spec, cpus);
            let (r, share) = (r?, share.unwrap_or(1.0));
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
    let (ofile, osize) = OFFLOAD_CAL;
    let opath = dir.join(ofile);
    if !opath.exists() {
        eprintln!(
            "sim: calibration run {ofile} ({} x {} s)",
            a.runs, a.duration
        );
        let before = CpuSnapshot::take();
        let r = run_offload(flowstack_prof::report::Workload::Rr, osize, a)?;
        let share = CpuSnapshot::take().share_since(&before, 2).unwrap_or(1.0);
        shares.insert(ofile.to_string(), share);
        std::fs::write(&opath, r.to_json())
            .map_err(|e| format!("cannot write {}: {e}", opath.display()))?;
    }
    let report = read(&opath).and_then(|t| {
        serde_json::from_str::<OffloadReport>(&t).map_err(|e| format!("{}: {e}", opath.display()))
    })?;
    let offload = OffloadCalRun {
        report,
        share: shares.get(ofile).copied().unwrap_or(1.0),
    };
    let j = serde_json::to_string_pretty(&shares).expect("plain data") + "\n";
    std::fs::write(&shares_path, j)
        .map_err(|e| format!("cannot write {}: {e}", shares_path.display()))?;
    Ok((runs, offload))
}

/// `--fresh`: the calibration runs in two passes, one before and one after the validation
/// runs (`dir`-1, `dir`-2), fitted to both together ([`merge_cal_runs`]).
fn fresh_pass(a: &SimArgs, pass: u32) -> Result<(Vec<CalRun>, OffloadCalRun), String> {
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
/// library.
fn run_offload(
    w: flowstack_prof::report::Workload,
    msg: usize,
    a: &SimArgs,
) -> Result<flowstack_bench::offload::OffloadReport, String> {
    flowstack_bench::offload::run(&flowstack_bench::offload::OffloadSpec {
        workload: w,
        msg,
        duration: a.duration,
        runs: a.runs,
        daemon_cores: None,
    })
}

fn run_seed001(a: &SimArgs) -> ExitCode {
    let name = if a.calibration == "vm" {
        "seed001"
    } else {
        &a.calibration
    };
    let cal = match load_calibration(name) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let r = match seed001::reproduce(&cal) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    println!(
        "seed 001, host CPU for protocol processing: a server answers 60 requests of 1 KB over TCP"
    );
    println!("costs: {}", cal.source);
    println!(
        "{:>10} {:>14} {:>14} {:>14} {:>11} {:>8}",
        "error e", "kernel us/req", "user us/req", "NIC us/req", "reduction", "paper"
    );
    for p in &r.points {
        println!(
            "{:>10} {:>14.1} {:>14.1} {:>14.1} {:>10.1}% {:>7.0}%",
            p.error_rate,
            p.host_us[0],
            p.host_us[1],
            p.host_us[2],
            p.reduction * 100.0,
            p.paper * 100.0
        );
    }
    println!(
        "r = 1 - 2 t_NIC / (t_kernel + t_user) (seed 001 eq. 4); ideal link: {:.1}% vs the paper's 68%: {}",
        r.points[0].reduction * 100.0,
        if r.within_band {
            "reproduced within ±10 points"
        } else {
            "NOT reproduced within ±10 points"
        }
    );
    println!("assumptions:");
    for n in &cal.notes {
        println!("  - {n}");
    }
    if let Some(p) = &a.json {
        let j = serde_json::to_string_pretty(&r).expect("plain data") + "\n";
        if let Err(e) = std::fs::write(p, j) {
            return fail(format!("cannot write {}: {e}", p.display()));
        }
    }
    ExitCode::SUCCESS
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "n/a".into())
}

/// CPU time from `/proc/stat` (per CPU: busy incl. steal, and all) and this process's
/// (`/proc/self/stat`), in clock ticks: how much of the cores other processes (and the
/// hypervisor) took while a bench run ran.
struct CpuSnapshot {
    /// Per CPU: (busy ticks incl. steal, all ticks).
    cpus: Vec<(u64, u64)>,
    /// This process's user + system ticks.
    own: u64,
}

impl CpuSnapshot {
    fn take() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpus = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .map(|l| {
                let v: Vec<u64> = l
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                // user nice system idle iowait irq softirq steal
                let all: u64 = v.iter().take(8).sum();
                let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
                (all - idle, all)
            })
            .collect();
        let own = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(')')?.1.to_string();
                let f: Vec<&str> = rest.split_whitespace().collect();
                // After the name come fields 3 (state), 4, ...: utime and stime are fields
                // 14 and 15 of the line.
                let t = |i: usize| f.get(i - 3).and_then(|x| x.parse::<u64>().ok());
                Some(t(14)? + t(15)?)
            })
            .unwrap_or(0);
        CpuSnapshot { cpus, own }
    }

    /// The share of CPUs `0..cores` (where the bench pins its threads) not taken by others
    /// since `before`: 1 − (their busy ticks − this process's) / their ticks.
    fn share_since(&self, before: &CpuSnapshot, cores: usize) -> Option<f64> {
        let n = cores.min(self.cpus.len()).min(before.cpus.len());
        if n == 0 {
            return None;
        }
        let (mut busy, mut all) = (0u64, 0u64);
        for i in 0..n {
            busy += self.cpus[i].0.saturating_sub(before.cpus[i].0);
            all += self.cpus[i].1.saturating_sub(before.cpus[i].1);
        }
        if all == 0 {
            return None;
        }
        let others = busy.saturating_sub(self.own.saturating_sub(before.own));
        Some((1.0 - others as f64 / all as f64).clamp(0.05, 1.0))
    }
}

/// Runs `spec` through the bench library and measures the CPU share of CPUs `0..cpus` each
/// of its runs got (from `/proc/stat` at the run's start and end); returns the report and
/// the **median of the runs' shares**. The bench reports the median run, and the prediction
/// rises with the share, so the share that stands for the median run is the median share —
/// not the share over all runs, which one starved run (a tenth of the others' rate) pulls
/// far below what the median run got.
fn bench_with_share(spec: &BenchSpec, cpus: usize) -> (Result<BenchReport, String>, Option<f64>) {
    let mut before: Option<CpuSnapshot> = None;
    let mut shares: Vec<f64> = vec![];
    let r = spec.clone().validated().and_then(|s| {
        flowstack_bench::run(&s, &mut |e| match e {
            flowstack_bench::Event::Started { .. } => before = Some(CpuSnapshot::take()),
            flowstack_bench::Event::Finished { .. } => {
                if let Some(x) = before
                    .take()
                    .and_then(|b| CpuSnapshot::take().share_since(&b, cpus))
                {
                    shares.push(x);
                }
            }
        })
    });
    (r, flowstack_sim::validate::median(&shares))
}

fn run_validate(a: &SimArgs) -> ExitCode {
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
    // Measure every configuration first (with the CPU share each run got); predict after.
    let mut kernel_runs = vec![];
    for c in validate::cases() {
        eprintln!(
            "sim: measuring: {} --duration {} --runs {}",
            c.command(),
            a.duration,
            a.runs
        );
        let spec = BenchSpec {
            workload: match c.workload {
                Workload::Stream => flowstack_prof::report::Workload::Stream,
                Workload::Crr => flowstack_prof::report::Workload::Crr,
                _ => flowstack_prof::report::Workload::Rr,
            },
            peer: if c.peer == Peer::Kernel {
                PeerSel::Kernel
            } else {
                PeerSel::Flowstack
            },
            link: BenchLink::Pipe,
            duration: a.duration,
            conns: 1,
            runs: a.runs,
            opts: RunOpts {
                kernel_placement: if c.peer == Peer::Kernel {
                    flowstack_bench::Placement::Same
                } else {
                    flowstack_bench::Placement::Free
                },
                ..RunOpts::default()
            },
            cores: Some(c.cores),
        };
        let (measured, share) = bench_with_share(&spec, c.cores);
        kernel_runs.push((c, measured, share));
    }
    let mut offload_runs = vec![];
    for w in validate::offload_cases() {
        eprintln!(
            "sim: measuring: flowstack bench {} --peer offload --duration {} --runs {}",
            w.name(),
            a.duration,
            a.runs
        );
        let pw = match w {
            Workload::Stream => flowstack_prof::report::Workload::Stream,
            Workload::Crr => flowstack_prof::report::Workload::Crr,
            _ => flowstack_prof::report::Workload::Rr,
        };
        let before = CpuSnapshot::take();
        let measured = run_offload(pw, validate::default_size(w), a).and_then(|r| {
            serde_json::from_str::<OffloadReport>(&r.to_json()).map_err(|e| e.to_string())
        });
        let share = CpuSnapshot::take().share_since(&before, 2);
        offload_runs.push((w, measured, share));
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
        cal = match calibrate(profile, &runs, Some(&merge_offload_runs(&off1, &off2))) {
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
    for (c, measured, share) in kernel_runs {
        let idle = match validate::predict(&cal, &c, 1.0, a.runs) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let pred = match validate::predict(&cal, &c, share.unwrap_or(1.0), a.runs) {
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
                rows.extend(validate::rows_of(
                    &c,
                    &pred,
                    &idle,
                    share,
                    Some(m),
                    s.latency.map(|l| l.p50_us),
                ));
            }
            Err(e) => {
                let mut rs = validate::rows_of(&c, &pred, &idle, share, None, None);
                for r in &mut rs {
                    r.status = validate::Status::NotMeasured(format!("bench failed: {e}"));
                }
                rows.extend(rs);
            }
        }
    }
    for (w, measured, share) in offload_runs {
        let idle = match validate::predict_offload(&cal, w, 1.0) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let pred = match validate::predict_offload(&cal, w, share.unwrap_or(1.0)) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        match &measured {
            Ok(r) => rows.extend(validate::offload_rows(w, &pred, &idle, share, r.offload())),
            Err(e) => {
                let mut rs = validate::offload_rows(w, &pred, &idle, share, None);
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

fn run_sweep(a: &SimArgs) -> ExitCode {
    let cal = match load_calibration(&a.calibration) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let clients = match a.clients.as_str() {
        "remote" => Clients::Remote,
        "colocated" => Clients::Colocated,
        _ => return usage("--clients must be remote or colocated"),
    };
    let mut workloads = vec![];
    for w in &a.workload {
        match Workload::parse(w) {
            Ok(w) => workloads.push(w),
            Err(e) => return usage(e),
        }
    }
    if a.sizes.is_empty() || a.sizes.iter().any(|&s| s == 0 || s > 1 << 30) {
        return usage("--sizes must be 1..=1073741824 bytes");
    }
    if a.cores.is_empty() || a.cores.iter().any(|&c| c == 0 || c > 1024) {
        return usage("--cores must be 1..=1024");
    }
    if a.load.iter().any(|&l| !(l > 0.0 && l.is_finite())) {
        return usage("--load must be positive transactions per second");
    }
    if a.nic_ratio.iter().any(|&r| !(r > 0.0 && r <= 100.0)) {
        return usage("--nic-ratio must be in (0, 100]");
    }
    if a.txns == 0 || a.txns > 10_000_000 || a.app_us < 0.0 || a.conns == Some(0) {
        return usage("--txns must be 1..=10000000, --app-us >= 0, --conns >= 1");
    }
    if let Some(p) = &a.plot {
        if p.extension().and_then(|e| e.to_str()) != Some("svg") {
            return usage("--plot needs a FILE.svg (the simulator draws SVG only)");
        }
    }
    for s in &a.arch {
        if let Err(e) = Arch::parse_for(s, 1) {
            return usage(e);
        }
    }
    let loads: Vec<Option<f64>> = if a.load.is_empty() {
        vec![None]
    } else {
        a.load.iter().map(|&l| Some(l)).collect()
    };
    let ratios: Vec<Option<f64>> = if a.nic_ratio.is_empty() {
        vec![None]
    } else {
        a.nic_ratio.iter().map(|&r| Some(r)).collect()
    };
    println!("flowstack sim: calibration '{}' ({})", cal.name, cal.source);
    println!(
        "{:<14} {:<6} {:>8} {:>5} {:>6} {:>9} {:>12} {:>10} {:>9} {:>9} {:>9} {:>7} {:>11} {:>7}",
        "arch",
        "load",
        "size",
        "cores",
        "ratio",
        "offered",
        "per s",
        "Mbit/s",
        "mean us",
        "p50 us",
        "p99 us",
        "host%",
        "host us/tx",
        "stack%"
    );
    // (workload, arch, size, cores, load, ratio, outcome)
    let mut results: Vec<Point> = vec![];
    for &w in &workloads {
        for arch_s in &a.arch {
            for &size in &a.sizes {
                for &cores in &a.cores {
                    for &load in &loads {
                        for &ratio in &ratios {
                            let mut arch = match Arch::parse_for(arch_s, cores) {
                                Ok(x) => x,
                                Err(e) => return usage(e),
                            };
                            if ratio.is_some() && arch.engines == 0 {
                                // A NIC clock sweep only means something for offload.
                                if a.nic_ratio.len() > 1 {
                                    continue;
                                }
                            }
                            if let (Some(r), true) = (ratio, arch.engines > 0) {
                                arch.engine_ratio = r;
                            }
                            let mut sc = Scenario::new(arch, w, size, cores);
                            if let Some(n) = a.conns {
                                sc.conns = n;
                            }
                            sc.load = load;
                            sc.app_ns = a.app_us * 1000.0;
                            sc.clients = clients;
                            sc.seed = a.seed;
                            sc.txns = a.txns;
                            let o = match simulate(&sc, &cal) {
                                Ok(o) => o,
                                Err(e) => return usage(e),
                            };
                            println!(
                                "{:<14} {:<6} {:>8} {:>5} {:>6} {:>9} {:>12.0} {:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>6.1}% {:>11.3} {:>6.1}%",
                                o.arch,
                                w.name(),
                                size,
                                cores,
                                ratio.map(|r| format!("{r}")).unwrap_or_else(|| "-".into()),
                                load.map(|l| format!("{l:.0}")).unwrap_or_else(|| "closed".into()),
                                o.per_s,
                                o.mbps,
                                o.mean_us,
                                o.p50_us,
                                o.p99_us,
                                o.host_util * 100.0,
                                o.host_protocol_us_per_txn,
                                o.engine_util * 100.0
                            );
                            results.push((w, arch_s.clone(), ratio, o));
                        }
                    }
                }
            }
        }
    }
    if let Some(p) = &a.json {
        let v: Vec<&Outcome> = results.iter().map(|r| &r.3).collect();
        let j = serde_json::to_string_pretty(&v).expect("plain data") + "\n";
        if let Err(e) = std::fs::write(p, j) {
            return fail(format!("cannot write {}: {e}", p.display()));
        }
        println!("json  {}", p.display());
    }
    if let Some(p) = &a.plot {
        let charts = charts(a, &workloads, &results);
        if charts.is_empty() {
            return usage(
                "--plot needs a swept axis: several --sizes, --cores, --load or --nic-ratio values",
            );
        }
        if let Err(e) = std::fs::write(p, svg(&charts)) {
            return fail(format!("cannot write {}: {e}", p.display()));
        }
        println!("plot  {}", p.display());
    }
    ExitCode::SUCCESS
}

/// One simulated point: workload, architecture as named, NIC ratio, outcome.
type Point = (Workload, String, Option<f64>, Outcome);

/// Picks a chart point (x, y) from a simulated point, or skips it.
type Pick<'a> = dyn Fn(&Point) -> Option<(f64, f64)> + 'a;

fn metric_name(w: Workload) -> &'static str {
    match w {
        Workload::Stream | Workload::File => "throughput (Mbit/s)",
        Workload::Crr => "connections/s",
        Workload::Rr => "transactions/s",
    }
}

fn metric(w: Workload, o: &Outcome) -> f64 {
    match w {
        Workload::Stream | Workload::File => o.mbps,
        _ => o.per_s,
    }
}

/// One chart per swept axis and workload, one line per architecture (the other axes at
/// their first value).
fn charts(a: &SimArgs, workloads: &[Workload], results: &[Point]) -> Vec<Chart> {
    let first_load = a.load.first().copied();
    let first_ratio = a.nic_ratio.first().copied();
    let mut out = vec![];
    for &w in workloads {
        let line = |arch: &str, f: &Pick<'_>| Series {
            name: arch.to_string(),
            points: results
                .iter()
                .filter(|r| r.0 == w && r.1 == arch)
                .filter_map(f)
                .collect(),
        };
        let lines = |f: &Pick<'_>| {
            a.arch
                .iter()
                .map(|s| line(s, f))
                .filter(|s| !s.points.is_empty())
                .collect::<Vec<_>>()
        };
        if a.sizes.len() > 1 {
            let by_load = first_load.is_some();
            out.push(Chart {
                title: format!(
                    "{}: host CPU {} vs message size",
                    w.name(),
                    if by_load {
                        "utilisation"
                    } else {
                        "per transaction"
                    }
                ),
                x_label: "message size (bytes)".into(),
                y_label: if by_load {
                    "host CPU busy (%)".into()
                } else {
                    "host protocol CPU per transaction (us)".into()
                },
                log_x: true,
                log_y: false,
                series: lines(&|r| {
                    let keep = (a.cores.len() <= 1 || r.3.cores == a.cores[0])
                        && (a.load.len() <= 1 || r.3.load == first_load)
                        && (r.2.is_none() || r.2 == first_ratio);
                    keep.then_some((
                        r.3.size as f64,
                        if by_load {
                            r.3.host_util * 100.0
                        } else {
                            r.3.host_protocol_us_per_txn
                        },
                    ))
                }),
            });
        }
        if a.load.len() > 1 {
            out.push(Chart {
                title: format!("{}: response time vs offered load", w.name()),
                x_label: "offered load (transactions/s)".into(),
                y_label: "mean response time (us)".into(),
                log_x: false,
                log_y: false,
                series: lines(&|r| {
                    let keep = (a.sizes.len() <= 1 || r.3.size == a.sizes[0])
                        && (a.cores.len() <= 1 || r.3.cores == a.cores[0])
                        && (r.2.is_none() || r.2 == first_ratio);
                    keep.then(|| (r.3.load.unwrap_or(0.0), r.3.mean_us))
                }),
            });
        }
        if a.cores.len() > 1 {
            out.push(Chart {
                title: format!("{}: {} vs cores", w.name(), metric_name(w)),
                x_label: "host cores".into(),
                y_label: format!("{} (log scale)", metric_name(w)),
                log_x: true,
                log_y: true,
                series: lines(&|r| {
                    let keep = (a.sizes.len() <= 1 || r.3.size == a.sizes[0])
                        && (a.load.len() <= 1 || r.3.load == first_load)
                        && (r.2.is_none() || r.2 == first_ratio);
                    keep.then(|| (r.3.cores as f64, metric(w, &r.3)))
                }),
            });
        }
        if a.nic_ratio.len() > 1 {
            out.push(Chart {
                title: format!("{}: {} vs NIC-core speed", w.name(), metric_name(w)),
                x_label: "stack core clock / host clock".into(),
                y_label: metric_name(w).into(),
                log_x: false,
                log_y: false,
                series: lines(&|r| {
                    let keep = (a.sizes.len() <= 1 || r.3.size == a.sizes[0])
                        && (a.cores.len() <= 1 || r.3.cores == a.cores[0])
                        && (a.load.len() <= 1 || r.3.load == first_load);
                    match (keep, r.2) {
                        (true, Some(x)) => Some((x, metric(w, &r.3))),
                        _ => None,
                    }
                }),
            });
        }
    }
    out
}
