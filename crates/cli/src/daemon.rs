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
    /// Most sockets one application may have at once (more: ENOBUFS, counted in stats).
    #[arg(long, value_name = "N", default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sockets_per_app: u32,
    /// Microseconds the daemon keeps polling after a turn found nothing, before it sleeps
    /// (0: sleep at once; it owns its core in offload mode).
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub spin_us: u64,
    /// Pin the daemon to this CPU (its "network processor" core).
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<usize>,
}

/// Runs the daemon until it is killed.
pub fn run(a: DaemonArgs) -> ExitCode {
    let mut cfg = DaemonConfig::default();
    if let Some(p) = a.socket {
        cfg.socket = p;
    }
    cfg.max_sockets_per_app = a.max_sockets_per_app as usize;
    cfg.spin = std::time::Duration::from_micros(a.spin_us);
    cfg.cpu = a.cpu;
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
