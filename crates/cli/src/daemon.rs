//! `flowstack daemon`: run flowstackd (the offload daemon) in the foreground.

use crate::net::{AddrArgs, LinkArgs};
use clap::Args;
use flowstack_offload::{Daemon, DaemonConfig};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

/// Arguments of `flowstack daemon`. The link and its address are optional here (the
/// daemon always has its loopback): both groups are present or both absent (checked in
/// [`run`]).
#[derive(Args, Debug)]
#[command(mut_arg("ip", |a| a.required(false)), mut_group("device", |g| g.required(false)))]
pub struct DaemonArgs {
    /// Unix socket applications register on [default: $XDG_RUNTIME_DIR/flowstack.sock, or
    /// /run/flowstack/flowstack.sock as root].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Most sockets one application may have at once (more: ENOBUFS, counted in stats).
    #[arg(long, value_name = "N", default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sockets_per_app: u32,
    /// Microseconds the daemon keeps polling after a turn found nothing, before it sleeps
    /// (0: sleep at once) [default: 50 if its engines have CPUs of their own — pinned, or
    /// more CPUs than engines plus one — else 0].
    #[arg(long, value_name = "N")]
    pub spin_us: Option<u64>,
    /// Pin the daemon to this CPU (its "network processor" core); the same as `--cores CPU`.
    #[arg(long, value_name = "CPU", conflicts_with_all = ["cores", "engines"])]
    pub cpu: Option<usize>,
    /// One engine thread per CPU listed, pinned to it (`0,2`, `2-5`): applications are
    /// assigned round robin, a process's children and exec'd images to its engine.
    #[arg(long, value_name = "LIST", conflicts_with = "engines")]
    pub cores: Option<String>,
    /// N engine threads, not pinned [default: $FLOWSTACK_DAEMON_ENGINES, else 1 — so a daemon
    /// that `flowstack run` starts can have several].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub engines: Option<u32>,
    /// Assign applications round robin even within one process (threads that register one
    /// application each and share no sockets).
    #[arg(long)]
    pub spread: bool,
    /// Most bytes one application's sockets may hold in the daemon's send and receive
    /// queues (suffixes K, M, G are powers of 1024); above it its new sockets fail with
    /// ENOBUFS and its sends stall (counted as FlowstackdAppMemLimited).
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = crate::demo::parse_size)]
    pub max_app_memory: u64,
    /// Bytes a loopback connection between two applications carries one way before it is
    /// fused: its bytes then go program to program through a shared pipe, the daemon only
    /// signalling (FlowstackdPipesFused).
    #[arg(long, value_name = "BYTES", default_value = "64K", value_parser = crate::demo::parse_size)]
    pub fuse_after: u64,
    /// A fused connection's pipe, bytes per direction (4K to 64M); 0: never fuse.
    #[arg(long, value_name = "BYTES", default_value = "512K", value_parser = crate::demo::parse_size)]
    pub fuse_pipe: u64,
    /// Memory all fused connections' pipes may take together (each pipe: 2 × --fuse-pipe
    /// + 4K); past it connections stay on the daemon's path (FlowstackdPipesRefused).
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = crate::demo::parse_size)]
    pub fuse_memory: u64,
    /// Permission bits of the registration socket, in octal: who may connect (0666: every
    /// local user, as for the kernel's loopback — a server's workers often run as another
    /// user; 0660 with the socket's group, 0600 its owner only).
    #[arg(long, value_name = "OCTAL", default_value = "666", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// A real link the daemon owns beside its loopback (the link flags of `serve`).
    #[command(flatten)]
    pub link: Option<LinkArgs>,
    /// The daemon's address on the link (required with a link).
    #[command(flatten)]
    pub addr: Option<AddrArgs>,
}

/// `--socket-mode`: permission bits in octal (at most 0777).
fn parse_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("not an octal mode: {s}"))?;
    if m > 0o777 {
        return Err(format!("mode {s} has bits beyond 0777"));
    }
    Ok(m)
}

/// Runs the daemon until it is killed (`flowstack daemon`).
pub fn run(a: DaemonArgs) -> ExitCode {
    run_as(a, "flowstack: daemon")
}

/// Runs the daemon until it is killed; error lines start with `who` (`flowstackd` for the
/// daemon's own binary).
pub fn run_as(a: DaemonArgs, who: &str) -> ExitCode {
    let mut cfg = DaemonConfig::default();
    if let Some(p) = a.socket {
        cfg.socket = p;
    }
    cfg.max_sockets_per_app = a.max_sockets_per_app as usize;
    cfg.socket_mode = a.socket_mode;
    cfg.cpu = a.cpu;
    if let Some(list) = &a.cores {
        match flowstack_runtime::parse_cores(list) {
            Ok(c) if c.len() <= flowstack_offload::ports::MAX_ENGINES => cfg.cores = c,
            Ok(_) => {
                eprintln!(
                    "{who}: --cores: at most {} engines",
                    flowstack_offload::ports::MAX_ENGINES
                );
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("{who}: --cores: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let from_env = || {
        std::env::var("FLOWSTACK_DAEMON_ENGINES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| (1..=flowstack_offload::ports::MAX_ENGINES).contains(n))
    };
    cfg.engines = match (a.engines, &a.cores, a.cpu) {
        (Some(n), _, _) => n as usize,
        (None, None, None) => from_env().unwrap_or(1),
        _ => 1,
    };
    cfg.spread = a.spread;
    cfg.spin = match a.spin_us {
        Some(us) => std::time::Duration::from_micros(us),
        None => cfg.auto_spin(
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        ),
    };
    cfg.max_app_memory = a.max_app_memory.max(1);
    if a.fuse_pipe != 0
        && !(flowstack_sys::pipe::MIN_CAP..=flowstack_sys::pipe::MAX_CAP).contains(&a.fuse_pipe)
    {
        eprintln!("{who}: --fuse-pipe: 0, or 4K to 64M");
        return ExitCode::from(2);
    }
    cfg.fuse_after = a.fuse_after;
    cfg.fuse_pipe = a.fuse_pipe;
    cfg.fuse_memory = a.fuse_memory;
    match (&a.link, &a.addr) {
        (Some(l), Some(ad)) => match l.spec(ad) {
            Ok(s) => cfg.link = Some(s),
            Err(e) => {
                eprintln!("{who}: {e}");
                return ExitCode::from(2);
            }
        },
        (None, None) => {}
        (Some(_), None) => {
            eprintln!("{who}: a link needs --ip CIDR (the daemon's address on it)");
            return ExitCode::from(2);
        }
        (None, Some(_)) => {
            eprintln!("{who}: --ip needs a link (--tap, --packet, --xdp or --shm-fd)");
            return ExitCode::from(2);
        }
    }
    // The link first, as `serve` opens it: misuse exits 2, a device that cannot be opened 1.
    let devs = match cfg.open_link() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{who}: {e}");
            return if e.is_usage() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            };
        }
    };
    let d = match Daemon::bind_on(&cfg, devs) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{who}: {}: {e}", cfg.socket.display());
            return ExitCode::FAILURE;
        }
    };
    let engines: Vec<String> = cfg
        .placement()
        .iter()
        .map(|c| c.map_or("-".to_string(), |c| c.to_string()))
        .collect();
    let link = cfg.link.as_ref().map_or(String::new(), |l| {
        let gw = l
            .addr
            .gateway
            .map_or(String::new(), |g| format!(" via {g}"));
        format!(" and {}{gw} on {}", l.addr.ip, l.link)
    });
    println!(
        "flowstackd: serving 127.0.0.0/8 (its own loopback interface){link} for applications on {}; {} engine(s), cpus {}, spin {} us",
        d.path().display(),
        engines.len(),
        engines.join(","),
        cfg.spin.as_micros()
    );
    let stop = AtomicBool::new(false);
    match d.run(&stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{who}: {e}");
            ExitCode::FAILURE
        }
    }
}
