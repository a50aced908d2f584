//! `flowstackd [--socket PATH]`: the flowstack daemon (also `flowstack daemon`).
#![forbid(unsafe_code)]

use flowstack_offload::{Daemon, DaemonConfig};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

const USAGE: &str = "usage: flowstackd [--socket PATH] [--spin-us N] [--cpu CPU | --cores LIST | --engines N] [--spread]\n\
serves TCP on 127.0.0.0/8 to applications that register on the unix socket;\n\
--cores: one pinned engine thread per CPU listed (0,2 or 2-5), --engines: N unpinned ones\n\
(default: $XDG_RUNTIME_DIR/flowstack.sock, or /run/flowstack/flowstack.sock as root)";

fn main() -> ExitCode {
    let mut cfg = DaemonConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => match args.next() {
                Some(p) => cfg.socket = p.into(),
                None => {
                    eprintln!("flowstackd: --socket needs a path");
                    return ExitCode::from(2);
                }
            },
            "--spin-us" => match args.next().and_then(|v| v.parse::<u64>().ok()) {
                Some(us) => cfg.spin = std::time::Duration::from_micros(us),
                None => {
                    eprintln!("flowstackd: --spin-us needs a number of microseconds");
                    return ExitCode::from(2);
                }
            },
            "--cpu" => match args.next().and_then(|v| v.parse::<usize>().ok()) {
                Some(c) => cfg.cpu = Some(c),
                None => {
                    eprintln!("flowstackd: --cpu needs a CPU number");
                    return ExitCode::from(2);
                }
            },
            "--cores" => match args.next().map(|v| flowstack_runtime::parse_cores(&v)) {
                Some(Ok(c)) if c.len() <= flowstack_offload::ports::MAX_ENGINES => cfg.cores = c,
                Some(Ok(_)) => {
                    eprintln!(
                        "flowstackd: --cores: at most {} engines",
                        flowstack_offload::ports::MAX_ENGINES
                    );
                    return ExitCode::from(2);
                }
                Some(Err(e)) => {
                    eprintln!("flowstackd: --cores: {e}");
                    return ExitCode::from(2);
                }
                None => {
                    eprintln!("flowstackd: --cores needs a CPU list");
                    return ExitCode::from(2);
                }
            },
            "--engines" => match args.next().and_then(|v| v.parse::<usize>().ok()) {
                Some(n) if (1..=flowstack_offload::ports::MAX_ENGINES).contains(&n) => {
                    cfg.engines = n
                }
                _ => {
                    eprintln!(
                        "flowstackd: --engines needs a number from 1 to {}",
                        flowstack_offload::ports::MAX_ENGINES
                    );
                    return ExitCode::from(2);
                }
            },
            "--spread" => cfg.spread = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("flowstackd: unexpected argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if !cfg.cores.is_empty() && (cfg.cpu.is_some() || cfg.engines > 1) {
        eprintln!("flowstackd: --cores excludes --cpu and --engines");
        return ExitCode::from(2);
    }
    let d = match Daemon::bind(&cfg) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("flowstackd: {}: {e}", cfg.socket.display());
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "flowstackd: serving 127.0.0.1 and 127.0.0.2 (127.0.0.0/8) on {}, {} engine(s)",
        d.path().display(),
        cfg.placement().len()
    );
    let stop = AtomicBool::new(false);
    match d.run(&stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flowstackd: {e}");
            ExitCode::FAILURE
        }
    }
}
