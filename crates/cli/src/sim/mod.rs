//! `flowstack sim`: arguments → [`flowstack_sim`] (the architecture simulator) → tables,
//! `--json`, `--plot`; `--validate` also runs the bench ([`flowstack_bench::run()`]) for the
//! measurements it compares with; `--calibrate` writes this machine's calibration from
//! profile and bench JSON files.

use clap::Args;
use flowstack_prof::report::{from_json, ProfileReport};
use flowstack_sim::calib::{fit_profile, preset};
use flowstack_sim::plot::{svg, Chart, Series};

use flowstack_sim::{seed001, simulate, Arch, Calibration, Clients, Outcome, Scenario, Workload};
use std::path::PathBuf;
use std::process::ExitCode;

mod cpu;
mod validate;
use validate::{run_calibrate, run_validate};

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
    /// flowstack and kernel peers, and with --peer offload); within ±25 % of the median of
    /// the runs is validated, and each row shows the runs' range and spread.
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
        if plot_format(p).is_none() {
            return usage("--plot needs a FILE.svg or FILE.png");
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
        let bytes = match plot_format(p) {
            Some(Format::Png) => png(&charts),
            _ => Ok(svg(&charts).into_bytes()),
        };
        if let Err(e) = bytes.and_then(|b| std::fs::write(p, b).map_err(|e| e.to_string())) {
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

/// What `--plot` writes, by its file name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Svg,
    Png,
}

fn plot_format(p: &std::path::Path) -> Option<Format> {
    match p.extension().and_then(|e| e.to_str()) {
        Some("svg") => Some(Format::Svg),
        Some("png") => Some(Format::Png),
        _ => None,
    }
}

/// The charts as a PNG: the same layout as the SVG, drawn in the CLI's raster.
fn png(charts: &[Chart]) -> Result<Vec<u8>, String> {
    let (w, h) = flowstack_sim::plot::size(charts.len());
    let mut cv = crate::raster::Canvas::new(w.ceil() as usize, h.ceil() as usize);
    flowstack_sim::plot::draw(charts, &mut cv);
    cv.png()
}
