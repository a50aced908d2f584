//! `flowstack stats`: the `ss`/`nstat` view of a running daemon (parsing and printing only;
//! the query and the schema are `flowstack_offload::stats`).

use clap::Args;
use flowstack_offload::stats;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `flowstack stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The daemon's unix socket [default: as `flowstack daemon`].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print the answer as JSON (schema `flowstack_offload::stats::Stats`).
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECS seconds (default 2) until interrupted, like `watch`.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
    pub watch: Option<f64>,
}

/// Queries the daemon once, or every `--watch` seconds.
pub fn run(a: StatsArgs) -> ExitCode {
    let path = a
        .socket
        .unwrap_or_else(flowstack_offload::default_socket_path);
    let every = match a.watch {
        Some(s) if !(s.is_finite() && s > 0.0) => {
            eprintln!("flowstack: stats: --watch needs a positive number of seconds");
            return ExitCode::from(2);
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    loop {
        let s = match stats::query(&path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("flowstack: stats: {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        if every.is_some() && !a.json {
            print!("\x1b[H\x1b[2J");
        }
        if a.json {
            println!("{}", s.to_json_pretty());
        } else {
            print!("{}", s.table());
        }
        match every {
            Some(d) => std::thread::sleep(d),
            None => return ExitCode::SUCCESS,
        }
    }
}
