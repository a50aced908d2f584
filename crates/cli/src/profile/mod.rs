//! `flowstack profile`: arguments → [`flowstack_bench::profile`] (seed 000's per-layer cost
//! experiment) → the text report, `--json` (the [`flowstack_prof::report::ProfileReport`]
//! schema, written with serde) and `--plot`.

mod plot;
mod report;

use clap::Args;
use flowstack_bench::profile::{recording_overhead, Place, Profiler};
use flowstack_prof::report::{to_json, Counting};
use flowstack_wire::{Ipv4Address, Ipv4Cidr};
use indicatif::{ProgressBar, ProgressStyle};
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

/// Where the profile runs, from the LINK and ADDR arguments.
fn place(a: &ProfileArgs) -> Result<Place, String> {
    if a.tap.is_none() && a.packet.is_none() {
        if a.ip.is_some() || a.peer.is_some() {
            return Err("--ip and --peer need a link: --tap NAME or --packet IFACE".into());
        }
        return Ok(Place::InProcess);
    }
    let (Some(ip), Some(peer)) = (a.ip, a.peer) else {
        return Err("a link needs --ip CIDR and --peer IP".into());
    };
    if !ip.contains(peer) || ip.addr == peer {
        return Err(format!(
            "--peer {peer} must be another address inside --ip {ip}"
        ));
    }
    let link = crate::net::LinkArgs {
        tap: a.tap.clone(),
        packet: a.packet.clone(),
        xdp: None,
        queues: None,
        no_vnet: a.no_vnet,
        shm_fd: None,
        pcap: None,
        impair: None,
        seed: 1,
    };
    let addr = crate::net::AddrArgs {
        ip,
        gw: None,
        mac: None,
    };
    let name = match (&link.tap, &link.packet) {
        (Some(t), _) => format!("TAP {t} as {ip}"),
        (None, Some(p)) => format!("AF_PACKET {p} as {ip}"),
        (None, None) => unreachable!("a link was given"),
    };
    Ok(Place::Link {
        // Device set-up stays in the CLI (net.rs) until it moves to the runtime.
        open: Box::new(move |tune| crate::net::open_tuned(&link, &addr, tune)),
        name,
        peer,
    })
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
    let place = match place(&a) {
        Ok(w) => w,
        Err(e) => return usage(e),
    };
    let prof = match Profiler::new() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("flowstack: {e}");
            return ExitCode::from(1);
        }
    };
    report::header(&prof, &place, a.threshold);
    let bar = progress(&a);
    let mut sizes = Vec::new();
    for &size in &a.sizes {
        let mut rig = match place.rig(size) {
            Ok(r) => r,
            Err(e) => {
                bar.finish_and_clear();
                eprintln!("flowstack: {e}");
                return ExitCode::from(1);
            }
        };
        bar.set_message(format!("{size} B"));
        let r = prof.measure(rig.as_mut(), size, a.samples, a.threshold, &mut || {
            bar.inc(1)
        });
        bar.suspend(|| report::print_size(&r, prof.counting != Counting::None));
        sizes.push(r);
    }
    bar.finish_and_clear();
    if a.overhead {
        report::overhead(recording_overhead());
    }
    let doc = prof.report(&place, sizes);
    if let Some(p) = &a.json {
        if let Err(e) = std::fs::write(p, to_json(&doc)) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
        println!("json  {}", p.display());
    }
    if let (Some(p), Some(f)) = (&a.plot, plot_format) {
        if let Err(e) = plot::write(p, f, &doc.sizes) {
            eprintln!("flowstack: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
        println!("plot  {}", p.display());
    }
    ExitCode::SUCCESS
}

/// Iterations done out of all, on stderr (hidden when stderr is not a terminal). Advanced
/// between iterations, outside the measured windows; no ticker thread.
fn progress(a: &ProfileArgs) -> ProgressBar {
    let per_size = (a.samples + flowstack_bench::profile::WARMUP) as u64;
    let bar = ProgressBar::new(per_size * a.sizes.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("profile [{bar:30}] {percent:>3}% size {msg} ({eta} left)")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}
