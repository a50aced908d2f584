//! `flowstack daemon`: run flowstackd (the offload daemon) in the foreground.

use clap::Args;
use flowstack_offload::{Daemon, DaemonConfig};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

/// Arguments of `flowstack daemon`.
#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// Unix socket applications register on [default: $XDG_RUNTIME_DIR/flowstack.sock, or
    /// /run/flowstack/flowstack.sock as root].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

/// Runs the daemon until it is killed.
pub fn run(a: DaemonArgs) -> ExitCode {
    let mut cfg = DaemonConfig::default();
    if let Some(p) = a.socket {
        cfg.socket = p;
    }
    let d = match Daemon::bind(&cfg) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("flowstack: daemon: {}: {e}", cfg.socket.display());
            return ExitCode::FAILURE;
        }
    };
    println!(
        "flowstackd: serving 127.0.0.0/8 (its own loopback interface) for applications on {}",
        d.path().display()
    );
    let stop = AtomicBool::new(false);
    match d.run(&stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flowstack: daemon: {e}");
            ExitCode::FAILURE
        }
    }
}
