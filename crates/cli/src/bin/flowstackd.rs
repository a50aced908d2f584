//! `flowstackd`: the offload daemon's own binary — the same daemon, flags and errors as
//! `flowstack daemon` (one parser, [`flowstack_cli::daemon::DaemonArgs`]).

use clap::Parser;
use flowstack_cli::daemon::{self, DaemonArgs};
use std::process::ExitCode;

/// flowstackd — the flowstack offload daemon: the stack as a service for applications on
/// this host, on its own loopback interface (127.0.0.0/8, no privileges needed) and
/// optionally a real link. The same as `flowstack daemon`.
///
/// EXIT STATUS: 1 when the daemon cannot start or fails, 2 on misuse.
#[derive(Parser, Debug)]
#[command(name = "flowstackd", version, about, long_about, max_term_width = 100)]
struct Cli {
    #[command(flatten)]
    daemon: DaemonArgs,
}

fn main() -> ExitCode {
    let cli: Cli = match flowstack_cli::parse_args("flowstackd") {
        Ok(c) => c,
        Err(code) => return code,
    };
    flowstack_cli::init_logging();
    daemon::run_as(cli.daemon, "flowstackd")
}
